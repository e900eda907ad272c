/* clients/client_internal.h - what the files of the C client library share, and nothing
 * outside clients/ sees:
 *   client.c          options, the channel, one public function per method of the API
 *   client_call.c     one call on its own completion queue, batch by batch (client_call_run),
 *                     and the gRPC status -> enum status mapping
 *   client_convert.c  native structs <-> protobuf-c messages (requests, results, log-probs)
 * Tests: tests/test_client_lib.c, tests/test_client.sh. */
#ifndef SHARDLM_CLIENT_INTERNAL_H
#define SHARDLM_CLIENT_INTERNAL_H

#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>

#include "client.h"
#include "shardlm/v1/text_generation.pb-c.h"

#define CALL_POLL_MS         50
#define MAX_RECEIVE_BYTES    (256 << 20) /* responses with many logprobs can be large */
#define MAX_SAMPLES          1024        /* more than the API's n range; guards a bad index */
/* The service config of a target of several replicas ("A:P,B:P"): round_robin over them, each
 * one's health watched (grpc.health.v1), a call that fails UNAVAILABLE before any answer sent
 * again to another replica (docs/deployment.md). */
#define REPLICAS_SERVICE_CONFIG                                                                             \
    "{\"loadBalancingConfig\": [{\"round_robin\": {}}], \"healthCheckConfig\": {\"serviceName\": "          \
    "\"shardlm.v1.TextGeneration\"}, \"methodConfig\": [{\"name\": [{\"service\": "                        \
    "\"shardlm.v1.TextGeneration\"}], \"retryPolicy\": {\"maxAttempts\": 4, \"initialBackoff\": \"0.1s\", "  \
    "\"maxBackoff\": \"1s\", \"backoffMultiplier\": 2, \"retryableStatusCodes\": [\"UNAVAILABLE\"]}}]}"
#define RECONNECT_BACKOFF_MIN_MS 100     /* the channel's reconnect backoff, first and largest */
#define RECONNECT_BACKOFF_MAX_MS 1000
#define SERVICE              "/shardlm.v1.TextGeneration/"

struct client_call;

#define CLIENT_MAX_REPLICAS 64

struct client {
    grpc_channel   *channel;
    /* A target of several replicas ("A:P,B:P"): a channel to each too, for reattaching a
     * journaled call (on each in turn: it lives in one replica's journal). */
    grpc_channel   *replicas[CLIENT_MAX_REPLICAS];
    int             n_replicas;
    grpc_metadata   auth;        /* authorization: Bearer <key>, when has_auth */
    int             has_auth;
    double          timeout_s;
    double          resume_for_s; /* client_options.resume_for_s, 0 read as 60 */
    char            model[256];  /* client_options.model, "" for none */
    pthread_mutex_t mu;          /* guards active */
    struct client_call *active;  /* calls now running, for client_cancel_calls */
};

/* ---- client_call.c ------------------------------------------------------------------------ */

/* Sees each response of a call; returns non-zero to cancel the call. The response is freed
 * after the callback unless the callback takes it by setting *m to NULL. */
typedef int (*client_msg_fn)(void *ctx, ProtobufCMessage **m);

/* A call of one request and a stream of responses (a unary call is a stream of one), on the
 * calling thread. timeout_s 0: the client's; cancel_flag may be NULL. *grpc_code (may be
 * NULL) receives the call's gRPC code. */
enum status client_call_run(struct client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                            const volatile sig_atomic_t *cancel_flag, int streaming, int n_samples,
                            client_msg_fn on_msg, void *ctx, int *grpc_code);

/* ---- client_convert.c --------------------------------------------------------------------- */

char *client_str_dup(const char *s); /* strdup of s, or of "" when s is NULL */
enum client_finish_reason client_finish_reason_from_pb(Shardlm__V1__FinishReason r);
struct client_usage client_usage_from_pb(const Shardlm__V1__Usage *u); /* zeros when u is NULL */
void client_logprobs_free(struct client_logprob *lp, int n);
/* Appends n protobuf logprobs to (*dst, *n_dst), deep-copied. */
enum status client_logprobs_append(struct client_logprob **dst, int *n_dst,
                                   Shardlm__V1__TokenLogprob *const *src, size_t n);
/* Sample `index` of r, created (empty) when new. */
enum status client_result_sample(struct client_result *r, int index, struct client_completion **out);
/* Appends text, token ids and logprobs to a sample. */
enum status client_sample_append(struct client_completion *s, const char *text, size_t len,
                                 const int32_t *ids, size_t n_ids,
                                 Shardlm__V1__TokenLogprob *const *lp, size_t n_lp);

/* Everything a GenerateRequest or ChatRequest borrows, released by client_request_pb_free. */
struct request_pb {
    int                            chat;
    Shardlm__V1__GenerateRequest   gen;
    Shardlm__V1__ChatRequest       chat_req;
    Shardlm__V1__SamplingParams    sampling;
    Shardlm__V1__SamplingParams__LogitBiasEntry *bias, **bias_ptrs;
    Shardlm__V1__ChatMessage      *msgs, **msg_ptrs;
};

/* The GenerateRequest (or ChatRequest, when req has messages) of req, borrowing req's
 * strings and arrays: req must outlive it. */
enum status client_request_to_pb(const struct client_request *req, struct request_pb *r);
void client_request_pb_free(struct request_pb *r);
const ProtobufCMessage *client_request_pb_message(const struct request_pb *r);

#endif
