/* server/http_internal.h - what the two files of the HTTP front share:
 *
 *   http.c         the libmicrohttpd daemon (a thread per connection, a bounded number of
 *                  connections), routing, API keys, the one status-to-HTTP mapping with its
 *                  OpenAI error objects, submitting to the engine, waiting for events, SSE,
 *                  client disconnects (engine_cancel)
 *   http_openai.c  OpenAI request JSON -> struct gen_request (types only: every numeric range
 *                  is engine_validate's), and the response / chunk JSON
 *
 * Threads: each connection's handler runs on its own libmicrohttpd thread; engine events
 * arrive on the engine thread and only append to the request under its mutex and signal.
 * Not here: gRPC (server.c, call.c), protobuf (convert.c).
 * Tests: tests/server/test_http.py. */
#ifndef SHARDLM_HTTP_INTERNAL_H
#define SHARDLM_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "convert.h"
#include "server_internal.h"

/* A parsed OpenAI request: the engine's request plus what shapes the answer. */
struct http_request {
    struct gen_request r;  /* params.max_tokens is -1 when the client gave none */
    int is_chat;
    int stream, include_usage;
    int logprobs;          /* completions: -1 none, else top-n; chat: -1 or top_logprobs */
    int echo;              /* completions: the prompt text before the output */
};

/* Parses body[0..len) (borrowed) into *q (free with gen_request_free(&q->r)). served_model:
 * the id that `model` must name (STATUS_NOT_FOUND otherwise). Errors: STATUS_INVALID_ARGUMENT
 * naming the field and the type it must have. */
enum status http_parse_request(const char *body, size_t len, int is_chat, const char *served_model,
                               const char *const *adapters, int n_adapters,
                               struct http_request *q);


/* One generation request of the HTTP front. Reference-counted: the connection holds one
 * reference, the engine one until the last sample's FINISHED event, a streaming response one. */
struct http_gen {
    atomic_int      refs;
    pthread_mutex_t mu;          /* guards everything below that events change */
    pthread_cond_t  cv;          /* signalled on every event */
    struct server  *s;
    struct http_request q;
    char            id[48];      /* "cmpl-N" / "chatcmpl-N" */
    long long       created;     /* Unix seconds */
    uint64_t        handle;
    int             active;      /* samples without FINISHED */
    struct sample_buf *samples; /* (n_samples) */
    int             n_samples;
    int             prompt_tokens, cached_prompt_tokens;
    enum status     end_status;  /* STATUS_OK, or why the request ended early */
    char            end_message[256];
    char           *echo_text;   /* the prompt's text for echo */
    double          t_submit, t_first, queue_s; /* queue_s < 0 until known */
    int             hangup;      /* the client went away */
    int             done;        /* a stream sent [DONE] */
    int             fd;          /* the connection's socket, polled for hang-ups */
    char           *out;         /* a stream's bytes not yet handed to libmicrohttpd */
    size_t          out_len, out_pos, out_cap;
};

/* Appends to a growable buffer; CHECKs on out of memory (responses are small). */
void http_buf_append(char **p, size_t *len, size_t *cap, const char *data, size_t n);

/* The unary response of a finished request (every sample), malloc'd JSON. */
char *http_response_json(struct http_gen *g);
/* SSE bytes for what samples hold now (one chunk per sample with news), appended to
 * g->out; marks finals sent. Called with g->mu held. */
void  http_stream_chunks(struct http_gen *g);
/* The usage chunk (stream_options.include_usage) and an error event, then [DONE]. */
void  http_stream_finish(struct http_gen *g);
/* {"error": {...}} with the given message, type and code; malloc'd. */
char *http_error_json(const char *message, const char *type, const char *param, const char *code);

#endif
