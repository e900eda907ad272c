/* server/metrics.h - the Prometheus metrics of the server: request counters by API and final
 * status (generation; embeddings, with their inputs and tokens), latency histograms (time to
 * first token, inter-token latency, end-to-end latency), and, read from the engine at scrape
 * time, token counters, queue length, running sequences, KV blocks, prefix-cache hits and
 * preemptions (per replica with data parallelism), and a mixture of experts' tokens routed to
 * each expert of each layer (rank 0's stage). Names follow vLLM's `vllm:` metrics with the
 * prefix `shardlm_`.
 * Not here: serving /metrics over HTTP (http.c); where requests end (call.c for gRPC, http.c
 * for HTTP), which call metrics_observe_request; embed.c calls metrics_observe_embed.
 * Tests: tests/server/test_http.py (metrics) parses the text with prometheus_client.
 *
 * Thread-safe: every function may be called from any thread (one mutex, held briefly). */
#ifndef SHARDLM_METRICS_H
#define SHARDLM_METRICS_H

#include <stddef.h>

#include "engine.h"

enum metrics_api { METRICS_API_GRPC, METRICS_API_HTTP, METRICS_API_COUNT };

struct metrics;

/* NULL when out of memory (metrics are then off: every call accepts NULL). */
struct metrics *metrics_create(void);
void            metrics_free(struct metrics *m); /* accepts NULL */

/* One generation request has ended. status: the gRPC code name it ended with ("OK",
 * "INVALID_ARGUMENT", "CANCELLED", ..., the label vocabulary of both APIs); ttft_s < 0 when no
 * token came; queue_s < 0 when it never left the queue (the engine's queue_seconds). */
void metrics_observe_request(struct metrics *m, enum metrics_api api, const char *status, double ttft_s,
                             double e2e_s, double queue_s);
/* One embedding request has ended with status (as above); when "OK", its n_inputs inputs and
 * n_tokens tokens are counted. */
void metrics_observe_embed(struct metrics *m, enum metrics_api api, const char *status, int n_inputs, int n_tokens);
/* n tokens of one sample arrived gap_s seconds after its previous ones: n inter-token latencies
 * of gap_s / n each (tokens that arrive together share the gap). */
void metrics_observe_itl(struct metrics *m, double gap_s, int n);

/* A served model whose engine's numbers /metrics shows: its id (the `model` label) and its
 * engine (borrowed; NULL while it is not loaded: zeros, and shardlm_model_loaded 0). */
struct metrics_model {
    const char    *id;
    struct engine *engine;
};
#define SERVER_METRICS_MAX_MODELS 16

/* The Prometheus text exposition (version 0.0.4) of everything above, and each model's engine
 * gauges and counters (models[0 .. n_models), 1 .. SERVER_METRICS_MAX_MODELS): with one model
 * unlabelled, with several one series per model, labelled model="<id>"; shardlm_model_loaded
 * {model} for each. *out is malloc'd (caller frees) and NUL-terminated, *len bytes.
 * STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status metrics_render(struct metrics *m, const struct metrics_model *models, int n_models, char **out,
                           size_t *len);

#endif
