/* server/server.c - the gRPC server on gRPC C core: one completion queue, one thread, and one
 * explicit state machine per call (struct call). Every call follows the same steps:
 *
 *   accepted -> RECV_CLOSE_ON_SERVER started at once (it completes when the call ends for any
 *   reason: status sent, client cancel, disconnect, deadline) -> checks (API key, phase)
 *   -> RECV_MESSAGE -> handled:
 *     unary methods:        one batch {initial metadata, message, status};
 *     Generate / Chat:      submitted to the engine; the response is sent when every sample
 *                           has finished;
 *     GenerateStream / ChatStream: one SEND_MESSAGE in flight at a time; tokens that arrive
 *                           meanwhile are coalesced into the next message; status last;
 *     Health.Watch:         a message whenever the serving status changes;
 *     reflection:           receive, answer, receive ... until the client half-closes.
 *   -> freed when the close has completed, no batch is in flight and the engine holds no
 *   sample of it (the engine calls back until the FINISHED event of every sample).
 *
 * Waking the loop from the engine thread: the engine's callback copies the event into a queue
 * and starts an empty batch on a private call of a lame channel; gRPC documents that an empty
 * batch puts its tag on the completion queue immediately. So the loop blocks in
 * grpc_completion_queue_next with no polling, and a token reaches its stream within
 * microseconds of being sampled. Wakes are coalesced (one in flight at a time).
 *
 * enum status -> grpc_status_code happens in exactly one place: grpc_code().
 * Not here: flags (serve.c), protobuf (convert.c), templates (chat_template.c).
 * Tests: tests/server/test_server.py. */
#include "server.h"

#include <errno.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "convert.h"
#include "reflection.h"
#include "tokenizer.h"

#define N_REQUEST_SLOTS 8

enum method {
    METHOD_UNKNOWN,
    METHOD_GENERATE,
    METHOD_GENERATE_STREAM,
    METHOD_CHAT,
    METHOD_CHAT_STREAM,
    METHOD_TOKENIZE,
    METHOD_DETOKENIZE,
    METHOD_CANCEL,
    METHOD_MODEL_INFO,
    METHOD_SERVER_STATS,
    METHOD_HEALTH_CHECK,
    METHOD_HEALTH_WATCH,
    METHOD_REFLECTION,
};

static const struct {
    const char *path;
    enum method method;
} METHODS[] = {
    {"/shardlm.v1.TextGeneration/Generate", METHOD_GENERATE},
    {"/shardlm.v1.TextGeneration/GenerateStream", METHOD_GENERATE_STREAM},
    {"/shardlm.v1.TextGeneration/Chat", METHOD_CHAT},
    {"/shardlm.v1.TextGeneration/ChatStream", METHOD_CHAT_STREAM},
    {"/shardlm.v1.TextGeneration/Tokenize", METHOD_TOKENIZE},
    {"/shardlm.v1.TextGeneration/Detokenize", METHOD_DETOKENIZE},
    {"/shardlm.v1.TextGeneration/Cancel", METHOD_CANCEL},
    {"/shardlm.v1.TextGeneration/GetModelInfo", METHOD_MODEL_INFO},
    {"/shardlm.v1.TextGeneration/GetServerStats", METHOD_SERVER_STATS},
    {"/grpc.health.v1.Health/Check", METHOD_HEALTH_CHECK},
    {"/grpc.health.v1.Health/Watch", METHOD_HEALTH_WATCH},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", METHOD_REFLECTION},
};

static const char *method_name(enum method m)
{
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].method == m) return strrchr(METHODS[i].path, '/') + 1;
    return "unknown";
}

static int is_generation(enum method m)
{
    return m == METHOD_GENERATE || m == METHOD_GENERATE_STREAM || m == METHOD_CHAT || m == METHOD_CHAT_STREAM;
}
static int is_streaming(enum method m) { return m == METHOD_GENERATE_STREAM || m == METHOD_CHAT_STREAM; }

/* What the server is doing; written by the control thread, read by the loop. */
enum phase {
    PHASE_LOADING,
    PHASE_READY,
    PHASE_DRAINING, /* SIGTERM seen: new calls UNAVAILABLE, the engine finishes what runs */
    PHASE_DRAINED,  /* engine_drain returned: every request has finished */
    PHASE_FAILED,   /* the model did not load */
};

enum tag_kind { TAG_REQUEST, TAG_RECV, TAG_SEND, TAG_CLOSE, TAG_WAKE, TAG_SHUTDOWN };

struct tag {
    enum tag_kind kind;
    void         *owner; /* struct call, struct request_slot, or NULL */
};

struct server;

/* One sample's output not yet sent (streaming) or all of it (unary). */
struct sample_buf {
    char    *text;
    size_t   text_len, text_cap;
    int32_t *ids;              /* (cap) */
    float   *lp;               /* (cap) when logprobs were asked */
    struct top_logprob *top;   /* (cap, n_top) */
    int      n, cap, n_top, has_lp;
    enum finish_reason finish;
    int      finished, final_sent;
    int      prompt_tokens, completion_tokens, cached_prompt_tokens;
};

struct call {
    struct call   *prev, *next;
    struct server *s;
    grpc_call     *call;
    enum method    method;
    gpr_timespec   deadline;
    double         t_start, t_first_token;
    struct tag     recv_tag, send_tag, close_tag;
    grpc_byte_buffer *recv_buf;
    grpc_byte_buffer *send_buf;   /* owned while a send is in flight */
    grpc_slice     status_slice;  /* details of the status in flight */
    int            has_status_slice;
    int            recv_inflight, send_inflight, send_has_status;
    int            close_done, client_cancelled; /* client_cancelled: set by RECV_CLOSE_ON_SERVER */
    int            initial_md_sent, status_sent;
    grpc_status_code final_code;  /* what the call ended with, for the log */
    /* generation */
    int            submitted;
    uint64_t       handle;
    int            engine_active; /* samples without their FINISHED event yet */
    char          *request_id;
    struct sample_buf *samples;   /* (n_samples) */
    int            n_samples, rr;
    int32_t       *prompt_ids;    /* prompt logprobs, when asked: (n_prompt) */
    float         *prompt_lp;
    struct top_logprob *prompt_top;
    int            n_prompt, n_prompt_top, prompt_lp_pending;
    int            n_prompt_tokens;
    uint64_t       seed;
    enum status    end_status;    /* STATUS_OK, or why the request ended early */
    char          *end_message;
    int            cancelled_by_rpc;
    /* health watch */
    int            watch_last;    /* last status sent, 0 = none */
    int            watch_unknown; /* watching a service we do not know */
};

struct request_slot {
    struct server     *s;
    grpc_call         *call;
    grpc_call_details  details;
    grpc_metadata_array md;
    struct tag         tag;
    int                active;
};

/* An engine event copied off the engine thread; one allocation holding its arrays. */
struct queued_event {
    struct queued_event *next;
    struct call         *call;
    enum engine_event_kind kind;
    int                  sample, n_tokens, n_top;
    int32_t             *tokens;
    float               *logprobs;
    struct top_logprob  *top;
    char                *text;
    size_t               text_len;
    char                *message;
    enum finish_reason   finish;
    enum status          status;
    int                  prompt_tokens, completion_tokens, cached_prompt_tokens;
    uint64_t             seed;
};

struct server {
    struct server_options opts;
    grpc_server          *grpc;
    grpc_completion_queue *cq;
    /* waking the loop from other threads */
    grpc_channel         *wake_channel;
    grpc_call            *wake_call;
    pthread_mutex_t       wake_mu;
    atomic_int            wake_pending;
    struct tag            wake_tag;
    /* engine events */
    pthread_mutex_t       ev_mu;
    struct queued_event  *ev_head, *ev_tail;
    /* control thread */
    pthread_t             control;
    sem_t                 stop_sem;   /* posted by the signal handler (or the loop) to start the drain */
    int                   control_started;
    atomic_int            phase;
    enum phase            phase_seen;
    enum status           load_status;
    char                  load_message[1024];
    volatile sig_atomic_t fatal;   /* the engine failed (a rank gone): shut down, exit non-zero */
    char                  fatal_message[512];
    struct engine        *engine;
    const struct tokenizer *tok;
    int                   vocab_size;
    enum chat_template_kind tmpl;
    /* calls */
    struct call          *calls;
    int                   n_calls, n_gen_calls;
    struct request_slot   slots[N_REQUEST_SLOTS];
    int                   n_slots_active;
    /* misc */
    char                **keys;
    int                   n_keys;
    struct reflection    *refl;
    uint64_t              next_id;
    double                t_start, t_drained;
    int                   shutdown_started, shutdown_done;
    struct tag            shutdown_tag;
    int                   health_serving;
};

/* The one mapping from shardlm errors to gRPC status codes. */
static grpc_status_code grpc_code(enum status s)
{
    switch (s) {
    case STATUS_OK: return GRPC_STATUS_OK;
    case STATUS_INVALID_ARGUMENT: return GRPC_STATUS_INVALID_ARGUMENT;
    case STATUS_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case STATUS_BAD_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case STATUS_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case STATUS_RESOURCE_EXHAUSTED: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case STATUS_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case STATUS_IO: return GRPC_STATUS_INTERNAL;
    case STATUS_INTERNAL: return GRPC_STATUS_INTERNAL;
    case STATUS_CANCELLED: return GRPC_STATUS_CANCELLED;
    case STATUS_DEADLINE_EXCEEDED: return GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    return GRPC_STATUS_UNKNOWN;
}

static const char *grpc_code_name(grpc_status_code c)
{
    static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                  "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "?";
}

/* ---- waking the loop --------------------------------------------------------------------- */

/* Any thread. Puts wake_tag on the completion queue unless a wake is already on its way. */
static void wake(struct server *s)
{
    if (atomic_exchange(&s->wake_pending, 1)) return;
    pthread_mutex_lock(&s->wake_mu); /* empty batches on one call are thread-compatible only */
    grpc_call_error e = grpc_call_start_batch(s->wake_call, NULL, 0, &s->wake_tag, NULL);
    pthread_mutex_unlock(&s->wake_mu);
    CHECK(e == GRPC_CALL_OK, "waking the server loop failed: grpc_call_error %d", (int)e);
}

/* ---- engine events ----------------------------------------------------------------------- */

/* On the engine thread: copy, queue, wake. Never blocks beyond a short mutex. */
static void on_engine_event(void *ctx, const struct engine_event *ev)
{
    struct call *c = ctx;
    struct server *s = c->s;
    size_t n = ev->n_tokens > 0 ? (size_t)ev->n_tokens : 0, n_top = ev->top ? (size_t)ev->n_top : 0;
    size_t msg_len = ev->message ? strlen(ev->message) : 0;
    size_t size = sizeof(struct queued_event) + n * sizeof(int32_t) + (ev->logprobs ? n * sizeof(float) : 0) +
                  n * n_top * sizeof(struct top_logprob) + ev->text_len + 1 + msg_len + 1;
    struct queued_event *q = malloc(size);
    CHECK(q, "out of memory copying an engine event (%zu bytes)", size);
    char *p = (char *)(q + 1);
    memset(q, 0, sizeof *q);
    q->call = c;
    q->kind = ev->kind;
    q->sample = ev->sample;
    q->n_tokens = (int)n;
    q->tokens = (int32_t *)p;
    if (n) memcpy(q->tokens, ev->tokens, n * sizeof(int32_t));
    p += n * sizeof(int32_t);
    if (ev->logprobs) {
        q->logprobs = (float *)p;
        memcpy(q->logprobs, ev->logprobs, n * sizeof(float));
        p += n * sizeof(float);
    }
    if (n_top) {
        q->top = (struct top_logprob *)p;
        q->n_top = (int)n_top;
        memcpy(q->top, ev->top, n * n_top * sizeof(struct top_logprob));
        p += n * n_top * sizeof(struct top_logprob);
    }
    q->text = p;
    q->text_len = ev->text_len;
    if (ev->text_len) memcpy(q->text, ev->text, ev->text_len);
    q->text[ev->text_len] = 0;
    p += ev->text_len + 1;
    q->message = p;
    if (msg_len) memcpy(q->message, ev->message, msg_len);
    q->message[msg_len] = 0;
    q->finish = ev->finish;
    q->status = ev->status;
    q->prompt_tokens = ev->prompt_tokens;
    q->completion_tokens = ev->completion_tokens;
    q->cached_prompt_tokens = ev->cached_prompt_tokens;
    q->seed = ev->seed;
    pthread_mutex_lock(&s->ev_mu);
    if (s->ev_tail) s->ev_tail->next = q;
    else s->ev_head = q;
    s->ev_tail = q;
    pthread_mutex_unlock(&s->ev_mu);
    wake(s);
}

/* ---- sending ----------------------------------------------------------------------------- */

static grpc_byte_buffer *bytes_to_buffer(uint8_t *data, size_t len)
{
    grpc_slice sl = grpc_slice_new(data, len, free); /* takes ownership of data */
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

/* Starts one send batch: initial metadata when not sent yet, then the message (taking ownership
 * of msg[0..len) when non-NULL), then the status when with_status. One send batch at a time. */
static void call_send(struct call *c, uint8_t *msg, size_t len, int with_status, grpc_status_code code,
                      const char *details)
{
    CHECK(!c->send_inflight && !c->status_sent, "overlapping sends on one call");
    grpc_op ops[3];
    int n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->initial_md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n++].data.send_initial_metadata.count = 0;
        c->initial_md_sent = 1;
    }
    if (msg) {
        c->send_buf = bytes_to_buffer(msg, len);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send_buf;
    }
    if (with_status) {
        c->status_slice = grpc_slice_from_copied_string(details ? details : "");
        c->has_status_slice = 1;
        ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
        ops[n].data.send_status_from_server.status = code;
        ops[n].data.send_status_from_server.status_details = details && details[0] ? &c->status_slice : NULL;
        ops[n++].data.send_status_from_server.trailing_metadata_count = 0;
        c->send_has_status = 1;
        c->final_code = code;
    }
    grpc_call_error e = grpc_call_start_batch(c->call, ops, (size_t)n, &c->send_tag, NULL);
    CHECK(e == GRPC_CALL_OK, "grpc_call_start_batch (send) failed: %d", (int)e);
    c->send_inflight = 1;
}

/* Ends the call with a status and no message. */
static void call_fail(struct call *c, grpc_status_code code, const char *details)
{
    if (c->close_done || c->status_sent || c->send_has_status) return;
    LOG_DEBUG("server", "req=%s method=%s -> %s: %s", c->request_id ? c->request_id : "-", method_name(c->method),
              grpc_code_name(code), details);
    call_send(c, NULL, 0, 1, code, details);
}

static void call_fail_status(struct call *c, enum status st, const char *message)
{
    call_fail(c, grpc_code(st), message);
}

/* Ends a unary call with its one response message. */
static void call_reply(struct call *c, uint8_t *msg, size_t len)
{
    if (c->close_done) {
        free(msg);
        return;
    }
    call_send(c, msg, len, 1, GRPC_STATUS_OK, NULL);
}

static void call_recv(struct call *c)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->recv_tag, NULL);
    CHECK(e == GRPC_CALL_OK, "grpc_call_start_batch (recv) failed: %d", (int)e);
    c->recv_inflight = 1;
}

/* ---- call lifetime ----------------------------------------------------------------------- */

static void sample_buf_free(struct sample_buf *b)
{
    free(b->text);
    free(b->ids);
    free(b->lp);
    free(b->top);
}

static void call_log(struct call *c)
{
    if (!is_generation(c->method)) {
        LOG_DEBUG("server", "method=%s status=%s", method_name(c->method), grpc_code_name(c->final_code));
        return;
    }
    int completion = 0;
    for (int i = 0; i < c->n_samples; i++) completion += c->samples[i].completion_tokens;
    double now = base_now_s();
    const char *status = c->status_sent ? grpc_code_name(c->final_code) : c->client_cancelled ? "CLIENT_CANCELLED" : "-";
    if (c->t_first_token > 0)
        LOG_INFO("server", "req=%s method=%s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f total_ms=%.1f",
                 c->request_id ? c->request_id : "-", method_name(c->method), status, c->n_prompt_tokens, completion,
                 (c->t_first_token - c->t_start) * 1e3, (now - c->t_start) * 1e3);
    else
        LOG_INFO("server", "req=%s method=%s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=- total_ms=%.1f",
                 c->request_id ? c->request_id : "-", method_name(c->method), status, c->n_prompt_tokens, completion,
                 (now - c->t_start) * 1e3);
}

/* Frees the call once nothing can refer to it any more. */
static void call_maybe_free(struct call *c)
{
    if (!c->close_done || c->send_inflight || c->recv_inflight || c->engine_active > 0) return;
    struct server *s = c->s;
    call_log(c);
    if (c->prev) c->prev->next = c->next;
    else s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_calls--;
    if (is_generation(c->method)) s->n_gen_calls--;
    grpc_call_unref(c->call);
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    for (int i = 0; i < c->n_samples; i++) sample_buf_free(&c->samples[i]);
    free(c->samples);
    free(c->prompt_ids);
    free(c->prompt_lp);
    free(c->prompt_top);
    free(c->request_id);
    free(c->end_message);
    free(c);
}

/* ---- generation calls -------------------------------------------------------------------- */

static int grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 0;
    int cap2 = *cap ? *cap : 16;
    while (cap2 < need) cap2 *= 2;
    void *q = realloc(*p, (size_t)cap2 * elem);
    if (!q) return -1;
    *p = q;
    *cap = cap2;
    return 0;
}

static void sample_append(struct sample_buf *b, const struct queued_event *q)
{
    if (q->n_tokens > 0) {
        int need = b->n + q->n_tokens, old_cap = b->cap;
        CHECK(grow((void **)&b->ids, &b->cap, need, sizeof *b->ids) == 0, "out of memory");
        if (q->logprobs && (!b->has_lp || b->cap != old_cap)) {
            float *lp = realloc(b->lp, (size_t)b->cap * sizeof *lp);
            CHECK(lp, "out of memory");
            if (!b->has_lp) memset(lp, 0, (size_t)b->cap * sizeof *lp);
            b->lp = lp;
            b->has_lp = 1;
        }
        if (q->logprobs && q->top && q->n_top > 0 && (!b->top || b->cap != old_cap)) {
            if (!b->top) b->n_top = q->n_top;
            struct top_logprob *t = realloc(b->top, (size_t)b->cap * (size_t)b->n_top * sizeof *t);
            CHECK(t, "out of memory");
            if (!b->top) memset(t, 0, (size_t)b->cap * (size_t)b->n_top * sizeof *t);
            b->top = t;
        }
        memcpy(b->ids + b->n, q->tokens, (size_t)q->n_tokens * sizeof *b->ids);
        if (q->logprobs && b->lp) memcpy(b->lp + b->n, q->logprobs, (size_t)q->n_tokens * sizeof *b->lp);
        if (q->top && b->top && q->n_top == b->n_top)
            memcpy(b->top + (size_t)b->n * b->n_top, q->top, (size_t)q->n_tokens * (size_t)q->n_top * sizeof *b->top);
        b->n = need;
    }
    if (q->text_len) {
        if (b->text_len + q->text_len + 1 > b->text_cap) {
            size_t cap = b->text_cap ? b->text_cap : 256;
            while (cap < b->text_len + q->text_len + 1) cap *= 2;
            char *t = realloc(b->text, cap);
            CHECK(t, "out of memory");
            b->text = t;
            b->text_cap = cap;
        }
        memcpy(b->text + b->text_len, q->text, q->text_len);
        b->text_len += q->text_len;
        b->text[b->text_len] = 0;
    }
}

static struct gen_sample_out sample_view(const struct sample_buf *b, int index, int with_usage)
{
    struct gen_sample_out o = {
        .index = index, .text = b->text ? b->text : "", .text_len = b->text_len, .ids = b->ids, .n_ids = b->n,
        .logprobs = b->has_lp ? b->lp : NULL, .top = b->has_lp && b->n_top ? b->top : NULL, .n_top = b->n_top,
        .finish = with_usage ? b->finish : FINISH_REASON_NONE, .has_usage = with_usage,
        .prompt_tokens = b->prompt_tokens, .completion_tokens = b->completion_tokens,
        .cached_prompt_tokens = b->cached_prompt_tokens,
    };
    return o;
}

/* The status a finished generation call ends with. */
static void gen_final_status(struct call *c, grpc_status_code *code, const char **details)
{
    *code = grpc_code(c->end_status);
    *details = c->end_message ? c->end_message : "";
}

/* Decides what a generation call sends next; called after every change to it. */
/* The prompt log-probabilities go with the first response message of a call, once. */
static void attach_prompt_logprobs(const struct call *c, struct gen_response_out *o)
{
    if (!c->prompt_lp_pending) return;
    o->prompt_ids = c->prompt_ids;
    o->prompt_logprobs = c->prompt_lp;
    o->prompt_top = c->prompt_top;
    o->n_prompt = c->n_prompt;
    o->n_prompt_top = c->n_prompt_top;
}

static void gen_pump(struct call *c)
{
    struct server *s = c->s;
    if (c->close_done) {
        /* Nobody listens: drop what was accumulated. */
        for (int i = 0; i < c->n_samples; i++) c->samples[i].n = 0, c->samples[i].text_len = 0;
        return;
    }
    if (c->send_inflight || c->status_sent || !c->submitted) return;
    if (is_streaming(c->method)) {
        for (int k = 0; k < c->n_samples; k++) {
            int i = (c->rr + k) % c->n_samples;
            struct sample_buf *b = &c->samples[i];
            int final = b->finished && !b->final_sent;
            if (b->n == 0 && b->text_len == 0 && !final && !c->prompt_lp_pending) continue;
            struct gen_sample_out one = sample_view(b, i, final);
            struct gen_response_out o = {.request_id = c->request_id, .seed = c->seed, .unary = 0, .samples = &one,
                                         .n_samples = 1, .tok = s->tok};
            attach_prompt_logprobs(c, &o);
            uint8_t *msg;
            size_t len;
            enum status st = convert_gen_response(&o, &msg, &len);
            if (st != STATUS_OK) {
                if (c->engine_active > 0) engine_cancel(s->engine, c->handle);
                call_fail_status(c, st, status_message());
                return;
            }
            c->prompt_lp_pending = 0;
            b->n = 0;
            b->text_len = 0;
            if (final) b->final_sent = 1;
            c->rr = (i + 1) % c->n_samples;
            call_send(c, msg, len, 0, GRPC_STATUS_OK, NULL);
            return;
        }
        if (c->engine_active == 0) {
            grpc_status_code code;
            const char *details;
            gen_final_status(c, &code, &details);
            call_send(c, NULL, 0, 1, code, details);
        }
        return;
    }
    /* Unary: one response once every sample has finished. */
    if (c->engine_active > 0) return;
    grpc_status_code code;
    const char *details;
    gen_final_status(c, &code, &details);
    if (code != GRPC_STATUS_OK) {
        call_send(c, NULL, 0, 1, code, details);
        return;
    }
    struct gen_sample_out *outs = calloc((size_t)c->n_samples, sizeof *outs);
    CHECK(outs, "out of memory");
    for (int i = 0; i < c->n_samples; i++) outs[i] = sample_view(&c->samples[i], i, 1);
    struct gen_response_out o = {.request_id = c->request_id, .seed = c->seed, .unary = 1, .samples = outs,
                                 .n_samples = c->n_samples, .tok = s->tok};
    attach_prompt_logprobs(c, &o);
    uint8_t *msg;
    size_t len;
    enum status st = convert_gen_response(&o, &msg, &len);
    free(outs);
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
    else call_send(c, msg, len, 1, GRPC_STATUS_OK, NULL);
}

/* Records why a request ended early (the first reason wins). */
static void gen_set_end(struct call *c, enum status st, const char *message)
{
    if (c->end_status != STATUS_OK) return;
    c->end_status = st;
    free(c->end_message);
    c->end_message = strdup(message ? message : "");
}

static void gen_on_event(struct call *c, const struct queued_event *q)
{
    if (q->kind == ENGINE_EVENT_PROMPT_LOGPROBS) {
        if (q->n_tokens > 0 && q->logprobs) {
            free(c->prompt_ids);
            free(c->prompt_lp);
            free(c->prompt_top);
            c->prompt_ids = malloc((size_t)q->n_tokens * sizeof *c->prompt_ids);
            c->prompt_lp = malloc((size_t)q->n_tokens * sizeof *c->prompt_lp);
            c->prompt_top = q->top ? malloc((size_t)q->n_tokens * (size_t)q->n_top * sizeof *c->prompt_top) : NULL;
            CHECK(c->prompt_ids && c->prompt_lp && (!q->top || c->prompt_top), "out of memory");
            memcpy(c->prompt_ids, q->tokens, (size_t)q->n_tokens * sizeof *c->prompt_ids);
            memcpy(c->prompt_lp, q->logprobs, (size_t)q->n_tokens * sizeof *c->prompt_lp);
            if (q->top) memcpy(c->prompt_top, q->top, (size_t)q->n_tokens * (size_t)q->n_top * sizeof *c->prompt_top);
            c->n_prompt = q->n_tokens;
            c->n_prompt_top = q->top ? q->n_top : 0;
            c->prompt_lp_pending = 1;
        }
        gen_pump(c);
        return;
    }
    if (q->sample < 0 || q->sample >= c->n_samples) {
        LOG_ERROR("server", "req=%s: engine event for sample %d of %d", c->request_id, q->sample, c->n_samples);
        return;
    }
    struct sample_buf *b = &c->samples[q->sample];
    c->seed = q->seed;
    if (q->n_tokens > 0 && c->t_first_token == 0) c->t_first_token = base_now_s();
    if (!c->close_done) sample_append(b, q);
    b->prompt_tokens = q->prompt_tokens;
    b->completion_tokens = q->completion_tokens;
    b->cached_prompt_tokens = q->cached_prompt_tokens;
    if (q->kind == ENGINE_EVENT_FINISHED && !b->finished) {
        b->finished = 1;
        b->finish = q->finish;
        c->engine_active--;
        switch (q->finish) {
        case FINISH_REASON_CANCELLED:
            if (c->cancelled_by_rpc) gen_set_end(c, STATUS_CANCELLED, "cancelled by Cancel");
            else if (atomic_load(&c->s->phase) >= PHASE_DRAINING)
                gen_set_end(c, STATUS_UNAVAILABLE, "the server shut down before the request finished (drain timeout)");
            else gen_set_end(c, STATUS_CANCELLED, "cancelled");
            break;
        case FINISH_REASON_DEADLINE:
            gen_set_end(c, STATUS_DEADLINE_EXCEEDED, "the request's deadline passed");
            break;
        case FINISH_REASON_ERROR:
            gen_set_end(c, q->status != STATUS_OK ? q->status : STATUS_INTERNAL, q->message);
            break;
        default: break;
        }
    }
    gen_pump(c);
    call_maybe_free(c);
}

static void drain_engine_events(struct server *s)
{
    pthread_mutex_lock(&s->ev_mu);
    struct queued_event *q = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->ev_mu);
    while (q) {
        struct queued_event *next = q->next;
        gen_on_event(q->call, q);
        free(q);
        q = next;
    }
}

static struct call *find_gen_call(struct server *s, const char *request_id)
{
    for (struct call *c = s->calls; c; c = c->next)
        if (is_generation(c->method) && c->submitted && c->engine_active > 0 && c->request_id &&
            !strcmp(c->request_id, request_id))
            return c;
    return NULL;
}

/* Tokenizes the request into the prompt ids the engine gets; applies the chat template. */
static enum status gen_prompt(struct server *s, struct gen_request *r, int is_chat, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    if (is_chat) {
        struct chat_template_extras extras;
        enum status st = chat_template_apply(s->tmpl, s->tok, r->messages, r->n_messages, ids, n, &extras);
        if (st != STATUS_OK) return st;
        if (extras.stop_token_id >= 0) r->stop_token_ids[r->n_stop_token_ids++] = extras.stop_token_id;
        if (extras.stop_string) {
            if (!(r->stop[r->n_stop] = strdup(extras.stop_string)))
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            r->n_stop++;
        }
        r->params.stop = (const char *const *)r->stop;
        r->params.n_stop = r->n_stop;
        r->params.stop_token_ids = r->stop_token_ids;
        r->params.n_stop_token_ids = r->n_stop_token_ids;
        return STATUS_OK;
    }
    if (r->prompt_ids) {
        *ids = r->prompt_ids;
        *n = r->n_prompt_ids;
        r->prompt_ids = NULL;
        r->n_prompt_ids = 0;
        for (int i = 0; i < *n; i++)
            if ((*ids)[i] < 0 || (*ids)[i] >= s->vocab_size)
                return status_errorf(STATUS_INVALID_ARGUMENT, "prompt_token_ids[%d] must be in [0, %d), got %d", i,
                                     s->vocab_size, (*ids)[i]);
        return STATUS_OK;
    }
    return tokenizer_encode(s->tok, r->prompt, r->prompt_len, r->add_bos, ids, n);
}

static void gen_start(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    int is_chat = c->method == METHOD_CHAT || c->method == METHOD_CHAT_STREAM;
    struct gen_request r;
    int32_t *ids = NULL;
    int n_ids = 0;
    enum status st = convert_gen_request(data, len, is_chat, &r);
    if (st == STATUS_OK && atomic_load(&s->phase) != PHASE_READY)
        st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    if (st == STATUS_OK) {
        if (r.request_id[0]) {
            if (find_gen_call(s, r.request_id))
                st = status_errorf(STATUS_INVALID_ARGUMENT, "request_id '%s' is already in use by a running request",
                                   r.request_id);
            else
                c->request_id = strdup(r.request_id);
        } else {
            char id[64];
            do snprintf(id, sizeof id, "req-%llu", (unsigned long long)++s->next_id);
            while (find_gen_call(s, id));
            c->request_id = strdup(id);
        }
        if (st == STATUS_OK && !c->request_id) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (st == STATUS_OK) st = gen_prompt(s, &r, is_chat, &ids, &n_ids);
    for (int i = 0; st == STATUS_OK && i < r.n_stop_token_ids; i++)
        if (r.stop_token_ids[i] >= s->vocab_size)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop_token_ids[%d] must be in [0, %d), got %d", i,
                               s->vocab_size, r.stop_token_ids[i]);
    for (int i = 0; st == STATUS_OK && i < r.n_bias; i++)
        if (r.bias_ids[i] >= s->vocab_size)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "sampling.logit_bias key must be in [0, %d), got %d", s->vocab_size,
                               r.bias_ids[i]);
    if (st == STATUS_OK && r.params.sampling.top_k > s->vocab_size)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "sampling.top_k must be in [0, %d] (0 = off), got %d", s->vocab_size,
                           r.params.sampling.top_k);
    if (st == STATUS_OK && gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) < 0) {
        double left = gpr_timespec_to_micros(gpr_time_sub(c->deadline, gpr_now(c->deadline.clock_type))) * 1e-6;
        if (left <= 0) st = status_errorf(STATUS_DEADLINE_EXCEEDED, "the deadline passed before the request started");
        else r.params.deadline = base_now_s() + left;
    }
    if (st == STATUS_OK) st = engine_validate(s->engine, ids, n_ids, &r.params);
    if (st == STATUS_OK) {
        c->n_samples = r.params.n;
        c->samples = calloc((size_t)c->n_samples, sizeof *c->samples);
        if (!c->samples) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (st == STATUS_OK) {
        c->n_prompt_tokens = n_ids;
        c->engine_active = c->n_samples; /* before submit: events may arrive at once */
        st = engine_submit(s->engine, c->request_id, ids, n_ids, &r.params, on_engine_event, c, &c->handle);
        if (st != STATUS_OK) c->engine_active = 0;
    }
    if (st != STATUS_OK) {
        call_fail_status(c, st, status_message());
    } else {
        c->submitted = 1;
        LOG_DEBUG("server", "req=%s method=%s submitted: prompt_tokens=%d max_tokens=%d n=%d", c->request_id,
                  method_name(c->method), n_ids, r.params.max_tokens, r.params.n);
        /* Streams get their headers at once, so that clients see the call is accepted. */
        if (is_streaming(c->method) && !c->close_done) call_send(c, NULL, 0, 0, GRPC_STATUS_OK, NULL);
    }
    free(ids);
    gen_request_free(&r);
}

/* ---- health ------------------------------------------------------------------------------ */

enum { HEALTH_SERVING = 1, HEALTH_NOT_SERVING = 2, HEALTH_SERVICE_UNKNOWN = 3 };

static int health_known(const char *service)
{
    return !service[0] || !strcmp(service, "shardlm.v1.TextGeneration");
}

static int health_now(struct server *s)
{
    return atomic_load(&s->phase) == PHASE_READY ? HEALTH_SERVING : HEALTH_NOT_SERVING;
}

static void watch_pump(struct call *c)
{
    if (c->close_done || c->send_inflight || c->status_sent) return;
    int now = c->watch_unknown ? HEALTH_SERVICE_UNKNOWN : health_now(c->s);
    if (now == c->watch_last) return;
    uint8_t *msg;
    size_t len;
    if (convert_health_response(now, &msg, &len) != STATUS_OK) {
        call_fail(c, GRPC_STATUS_INTERNAL, "out of memory");
        return;
    }
    c->watch_last = now;
    call_send(c, msg, len, 0, GRPC_STATUS_OK, NULL);
}

static void health_changed(struct server *s)
{
    int now = health_now(s);
    if (now == s->health_serving) return;
    s->health_serving = now;
    LOG_INFO("server", "health: %s", now == HEALTH_SERVING ? "SERVING" : "NOT_SERVING");
    for (struct call *c = s->calls; c; c = c->next)
        if (c->method == METHOD_HEALTH_WATCH && !c->recv_inflight && c->watch_last) watch_pump(c);
}

/* ---- the other methods ------------------------------------------------------------------- */

static void handle_simple(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    uint8_t *out = NULL;
    size_t out_len = 0;
    enum status st = STATUS_OK;
    switch (c->method) {
    case METHOD_TOKENIZE: {
        char *text;
        size_t text_len;
        int add_bos;
        int32_t *ids = NULL;
        int n = 0;
        st = convert_tokenize_request(data, len, &text, &text_len, &add_bos);
        if (st == STATUS_OK) st = tokenizer_encode(s->tok, text, text_len, add_bos, &ids, &n);
        if (st == STATUS_OK) st = convert_tokenize_response(ids, n, s->tok, &out, &out_len);
        free(text);
        free(ids);
        break;
    }
    case METHOD_DETOKENIZE: {
        int32_t *ids;
        int n;
        char *text = NULL;
        size_t text_len;
        st = convert_detokenize_request(data, len, s->vocab_size, &ids, &n);
        if (st == STATUS_OK) st = tokenizer_decode(s->tok, ids, n, &text, &text_len);
        if (st == STATUS_OK) st = convert_detokenize_response(text, &out, &out_len);
        free(ids);
        free(text);
        break;
    }
    case METHOD_CANCEL: {
        char *id;
        st = convert_cancel_request(data, len, &id);
        if (st == STATUS_OK) {
            struct call *target = find_gen_call(s, id);
            if (!target) st = status_errorf(STATUS_NOT_FOUND, "no running request has id '%s'", id);
            else {
                target->cancelled_by_rpc = 1;
                engine_cancel(s->engine, target->handle);
                LOG_INFO("server", "req=%s cancelled by Cancel", id);
                st = convert_cancel_response(1, &out, &out_len);
            }
        }
        free(id);
        break;
    }
    case METHOD_MODEL_INFO: {
        st = convert_empty_request(data, len, "shardlm.v1.GetModelInfoRequest");
        if (st == STATUS_OK) {
            struct model_info_out m = {.chat_template = chat_template_name(s->tmpl),
                                       .max_logprobs = s->opts.engine.max_logprobs ? s->opts.engine.max_logprobs : 20};
            if (m.max_logprobs > CONVERT_MAX_LOGPROBS) m.max_logprobs = CONVERT_MAX_LOGPROBS;
            engine_get_model_info(s->engine, &m.info);
            st = convert_model_info_response(&m, &out, &out_len);
        }
        break;
    }
    case METHOD_SERVER_STATS: {
        st = convert_empty_request(data, len, "shardlm.v1.GetServerStatsRequest");
        if (st == STATUS_OK) {
            struct server_stats_out o = {.active_calls = s->n_calls, .uptime_seconds = base_now_s() - s->t_start};
            engine_get_stats(s->engine, &o.engine);
            int n = engine_replicas(s->engine);
            struct engine_replica_stats *rs = calloc((size_t)n, sizeof *rs);
            if (!rs) {
                st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory for replica statistics");
                break;
            }
            for (int i = 0; i < n; i++) engine_get_replica_stats(s->engine, i, &rs[i]);
            o.replicas = rs;
            o.n_replicas = n;
            st = convert_server_stats_response(&o, &out, &out_len);
            free(rs);
        }
        break;
    }
    default: st = status_errorf(STATUS_INTERNAL, "no handler for %s", method_name(c->method));
    }
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
    else call_reply(c, out, out_len);
}

static void handle_health(struct call *c, const uint8_t *data, size_t len)
{
    char *service;
    enum status st = convert_health_request(data, len, &service);
    if (st != STATUS_OK) {
        call_fail_status(c, st, status_message());
        return;
    }
    if (c->method == METHOD_HEALTH_CHECK) {
        if (!health_known(service)) {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown service '%.200s'", service);
            call_fail(c, GRPC_STATUS_NOT_FOUND, msg);
        } else {
            uint8_t *out;
            size_t out_len;
            if (convert_health_response(health_now(c->s), &out, &out_len) == STATUS_OK) call_reply(c, out, out_len);
            else call_fail(c, GRPC_STATUS_INTERNAL, "out of memory");
        }
    } else {
        c->watch_unknown = !health_known(service);
        watch_pump(c);
    }
    free(service);
}

static void handle_reflection(struct call *c, const uint8_t *data, size_t len)
{
    struct reflection_query q;
    enum status st = convert_reflection_request(data, len, &q);
    if (st != STATUS_OK) {
        reflection_query_free(&q);
        call_fail_status(c, st, status_message());
        return;
    }
    struct reflection_answer a;
    struct reflection_answer_buf buf;
    reflection_answer(c->s->refl, &q, &a, &buf);
    uint8_t *out;
    size_t out_len;
    st = convert_reflection_response(data, len, &a, &out, &out_len);
    reflection_query_free(&q);
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
    else call_send(c, out, out_len, 0, GRPC_STATUS_OK, NULL);
}

/* ---- call events --------------------------------------------------------------------------- */

static void on_recv(struct call *c, int ok)
{
    c->recv_inflight = 0;
    grpc_byte_buffer *bb = c->recv_buf;
    c->recv_buf = NULL;
    if (!ok || !bb) {
        /* The client half-closed (or the call died) without a message. */
        if (c->method == METHOD_REFLECTION) call_fail(c, GRPC_STATUS_OK, "");
        else call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "the call carried no request message");
        if (bb) grpc_byte_buffer_destroy(bb);
        call_maybe_free(c);
        return;
    }
    if (c->close_done || c->send_has_status) {
        grpc_byte_buffer_destroy(bb);
        call_maybe_free(c);
        return;
    }
    grpc_byte_buffer_reader r;
    grpc_slice sl;
    if (!grpc_byte_buffer_reader_init(&r, bb)) {
        grpc_byte_buffer_destroy(bb);
        call_fail(c, GRPC_STATUS_INTERNAL, "cannot read the request message");
        call_maybe_free(c);
        return;
    }
    sl = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    grpc_byte_buffer_destroy(bb);
    const uint8_t *data = GRPC_SLICE_START_PTR(sl);
    size_t len = GRPC_SLICE_LENGTH(sl);
    switch (c->method) {
    case METHOD_GENERATE:
    case METHOD_GENERATE_STREAM:
    case METHOD_CHAT:
    case METHOD_CHAT_STREAM: gen_start(c, data, len); break;
    case METHOD_HEALTH_CHECK:
    case METHOD_HEALTH_WATCH: handle_health(c, data, len); break;
    case METHOD_REFLECTION: handle_reflection(c, data, len); break;
    default: handle_simple(c, data, len); break;
    }
    grpc_slice_unref(sl);
    call_maybe_free(c);
}

static void on_send(struct call *c, int ok)
{
    c->send_inflight = 0;
    if (c->send_buf) grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = NULL;
    if (c->has_status_slice) grpc_slice_unref(c->status_slice);
    c->has_status_slice = 0;
    if (c->send_has_status) c->status_sent = 1;
    if (ok && !c->status_sent && !c->close_done) {
        if (is_generation(c->method)) gen_pump(c);
        else if (c->method == METHOD_HEALTH_WATCH) watch_pump(c);
        else if (c->method == METHOD_REFLECTION) call_recv(c);
    }
    call_maybe_free(c);
}

static void on_close(struct call *c)
{
    c->close_done = 1;
    if (c->client_cancelled && !c->status_sent && c->engine_active > 0) {
        LOG_INFO("server", "req=%s: the client cancelled or went away; cancelling the request", c->request_id);
        engine_cancel(c->s->engine, c->handle);
    }
    if (is_generation(c->method)) gen_pump(c); /* drops buffered output */
    call_maybe_free(c);
}

/* API keys: metadata "authorization: Bearer <key>", compared in constant time per key. */
static int authorized(struct server *s, const grpc_metadata_array *md)
{
    if (s->n_keys == 0) return 1;
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != 13 || memcmp(GRPC_SLICE_START_PTR(m->key), "authorization", 13)) continue;
        const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
        size_t n = GRPC_SLICE_LENGTH(m->value);
        if (n < 7 || memcmp(v, "Bearer ", 7)) continue;
        v += 7;
        n -= 7;
        int ok = 0;
        for (int k = 0; k < s->n_keys; k++) {
            size_t kn = strlen(s->keys[k]);
            unsigned diff = kn != n;
            for (size_t j = 0; j < n; j++) diff |= (unsigned char)v[j] ^ (unsigned char)s->keys[k][j < kn ? j : 0];
            ok |= diff == 0;
        }
        return ok;
    }
    return 0;
}

static void request_slot_arm(struct request_slot *slot);

static void on_new_call(struct request_slot *slot, int ok)
{
    struct server *s = slot->s;
    slot->active = 0;
    s->n_slots_active--;
    if (!ok) {
        grpc_call_details_destroy(&slot->details);
        grpc_metadata_array_destroy(&slot->md);
        return;
    }
    struct call *c = calloc(1, sizeof *c);
    CHECK(c, "out of memory");
    c->s = s;
    c->call = slot->call;
    c->t_start = base_now_s();
    c->deadline = slot->details.deadline;
    c->recv_tag = (struct tag){TAG_RECV, c};
    c->send_tag = (struct tag){TAG_SEND, c};
    c->close_tag = (struct tag){TAG_CLOSE, c};
    const char *path = (const char *)GRPC_SLICE_START_PTR(slot->details.method);
    size_t path_len = GRPC_SLICE_LENGTH(slot->details.method);
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (strlen(METHODS[i].path) == path_len && !memcmp(METHODS[i].path, path, path_len)) c->method = METHODS[i].method;
    c->next = s->calls;
    if (s->calls) s->calls->prev = c;
    s->calls = c;
    s->n_calls++;
    if (is_generation(c->method)) s->n_gen_calls++;
    int authed = c->method == METHOD_HEALTH_CHECK || c->method == METHOD_HEALTH_WATCH || authorized(s, &slot->md);
    char unknown[300];
    snprintf(unknown, sizeof unknown, "unknown method %.*s", (int)(path_len < 200 ? path_len : 200), path);
    grpc_call_details_destroy(&slot->details);
    grpc_metadata_array_destroy(&slot->md);
    if (!s->shutdown_started) request_slot_arm(slot);

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->client_cancelled;
    grpc_call_error e = grpc_call_start_batch(c->call, &op, 1, &c->close_tag, NULL);
    CHECK(e == GRPC_CALL_OK, "grpc_call_start_batch (close) failed: %d", (int)e);

    enum phase ph = atomic_load(&s->phase);
    if (c->method == METHOD_UNKNOWN) call_fail(c, GRPC_STATUS_UNIMPLEMENTED, unknown);
    else if (!authed)
        call_fail(c, GRPC_STATUS_UNAUTHENTICATED, "a valid API key is required: metadata 'authorization: Bearer <key>'");
    else if (c->method != METHOD_HEALTH_CHECK && c->method != METHOD_HEALTH_WATCH && c->method != METHOD_REFLECTION &&
             ph != PHASE_READY)
        call_fail(c, GRPC_STATUS_UNAVAILABLE,
                  ph == PHASE_LOADING ? "the model is still loading" : "the server is shutting down");
    else call_recv(c);
}

static void request_slot_arm(struct request_slot *slot)
{
    struct server *s = slot->s;
    grpc_call_details_init(&slot->details);
    grpc_metadata_array_init(&slot->md);
    slot->call = NULL;
    grpc_call_error e = grpc_server_request_call(s->grpc, &slot->call, &slot->details, &slot->md, s->cq, s->cq, &slot->tag);
    CHECK(e == GRPC_CALL_OK, "grpc_server_request_call failed: %d", (int)e);
    slot->active = 1;
    s->n_slots_active++;
}

/* ---- the control thread -------------------------------------------------------------------- */

/* Signal handlers take no context argument: this is the one file-scope pointer, set while
 * server_run runs. Libraries (OpenBLAS, OpenMP) start threads before main, so the signal may
 * land on any thread; the handler only does what is async-signal-safe: sem_post. */
static sem_t *volatile g_stop_sem;
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig)
{
    g_stop_signal = sig;
    sem_t *sem = g_stop_sem;
    if (sem) sem_post(sem);
}

/* Installs on_stop_signal for SIGTERM and SIGINT. */
static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* Engine thread: the engine cannot go on (a rank is gone or hung). The control thread turns
 * health to NOT_SERVING and shuts the server down; server_run then returns UNAVAILABLE. */
static void on_engine_fatal(void *ctx, enum status st, const char *message)
{
    struct server *s = ctx;
    (void)st;
    snprintf(s->fatal_message, sizeof s->fatal_message, "%s", message);
    s->fatal = 1;
    sem_post(&s->stop_sem);
}

static void *control_main(void *arg)
{
    struct server *s = arg;
    struct engine *e = NULL;
    s->opts.engine.on_fatal = on_engine_fatal;
    s->opts.engine.fatal_ctx = s;
    enum status st = engine_create(&s->opts.engine, &e);
    if (st == STATUS_OK) {
        s->tok = engine_tokenizer(e);
        s->vocab_size = tokenizer_vocab_size(s->tok);
        if (s->opts.chat_template) st = chat_template_parse(s->opts.chat_template, &s->tmpl);
        else s->tmpl = chat_template_detect(s->opts.engine.model_dir, s->tok);
    }
    if (st == STATUS_OK) st = engine_start(e);
    /* MPI_Init (in engine_create, for the parallel runtime) may install its own SIGTERM / SIGINT
     * handlers: ours go back on top. */
    install_stop_handlers();
    if (st != STATUS_OK) {
        s->load_status = st;
        snprintf(s->load_message, sizeof s->load_message, "%s", status_message());
        engine_free(e);
        atomic_store(&s->phase, PHASE_FAILED);
        wake(s);
        return NULL;
    }
    s->engine = e;
    LOG_INFO("server", "model %s loaded; chat template %s", s->opts.engine.model_dir, chat_template_name(s->tmpl));
    atomic_store(&s->phase, PHASE_READY);
    wake(s);

    while (sem_wait(&s->stop_sem) != 0) {} /* EINTR */
    int sig = g_stop_signal;
    if (s->fatal)
        LOG_ERROR("server", "the engine failed (%s): NOT_SERVING, shutting down", s->fatal_message);
    else
        LOG_INFO("server", "%s: draining (up to %.1f s)", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "stop",
                 s->opts.drain_timeout_s);
    atomic_store(&s->phase, PHASE_DRAINING);
    wake(s);
    engine_drain(e, s->fatal ? 0.0 : s->opts.drain_timeout_s);
    atomic_store(&s->phase, PHASE_DRAINED);
    wake(s);
    return NULL;
}

/* ---- setup and the loop -------------------------------------------------------------------- */

static enum status read_file(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return status_errorf(errno == ENOENT ? STATUS_NOT_FOUND : STATUS_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 8192;
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf);
                fclose(f);
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            }
            buf = b;
        }
        size_t got = fread(buf + n, 1, 4096, f);
        n += got;
        if (got < 4096) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return status_errorf(STATUS_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    return STATUS_OK;
}

static enum status load_keys(struct server *s, const char *path)
{
    char *text;
    enum status st = read_file(path, &text);
    if (st != STATUS_OK) return st;
    for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        while (*line == ' ' || *line == '\t') line++;
        size_t n = strlen(line);
        while (n && (line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
        if (!n || line[0] == '#') continue;
        char **k = realloc(s->keys, (size_t)(s->n_keys + 1) * sizeof *k);
        if (!k || !(k[s->n_keys] = strdup(line))) {
            if (k) s->keys = k;
            free(text);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        s->keys = k;
        s->n_keys++;
    }
    free(text);
    if (s->n_keys == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "--api-key-file %s holds no key", path);
    return STATUS_OK;
}

static enum status make_credentials(const struct server_options *o, grpc_server_credentials **out)
{
    *out = NULL;
    if (!o->tls_cert && !o->tls_key) {
        *out = grpc_insecure_server_credentials_create();
        return STATUS_OK;
    }
    if (!o->tls_cert || !o->tls_key)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--tls-cert and --tls-key must be given together");
    char *cert = NULL, *key = NULL;
    enum status st = read_file(o->tls_cert, &cert);
    if (st == STATUS_OK) st = read_file(o->tls_key, &key);
    if (st == STATUS_OK) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        *out = grpc_ssl_server_credentials_create(NULL, &pair, 1, 0, NULL);
        if (!*out) st = status_errorf(STATUS_INVALID_ARGUMENT, "cannot use the TLS certificate %s and key %s", o->tls_cert, o->tls_key);
    }
    free(cert);
    free(key);
    return st;
}

/* What the loop does after every completion: engine events, phase changes, shutdown steps. */
static void loop_tick(struct server *s)
{
    drain_engine_events(s);
    enum phase ph = atomic_load(&s->phase);
    if (ph != s->phase_seen) {
        s->phase_seen = ph;
        if (ph == PHASE_READY) {
            printf("shardlm: ready\n");
            fflush(stdout);
        }
        if (ph == PHASE_DRAINED) s->t_drained = base_now_s();
        if (ph == PHASE_FAILED) LOG_ERROR("server", "the model did not load: %s", s->load_message);
        health_changed(s);
    }
    /* After the drain, let generation calls send their last messages (briefly), then stop. */
    int stop = ph == PHASE_FAILED || (ph == PHASE_DRAINED && (s->n_gen_calls == 0 || base_now_s() - s->t_drained > 2.0));
    if (stop && !s->shutdown_started) {
        s->shutdown_started = 1;
        grpc_server_shutdown_and_notify(s->grpc, s->cq, &s->shutdown_tag);
        grpc_server_cancel_all_calls(s->grpc);
    }
}

enum status server_run(const struct server_options *o)
{
    struct server *s = calloc(1, sizeof *s);
    if (!s) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    s->opts = *o;
    s->t_start = base_now_s();
    s->wake_tag = (struct tag){TAG_WAKE, NULL};
    s->shutdown_tag = (struct tag){TAG_SHUTDOWN, NULL};
    atomic_init(&s->phase, PHASE_LOADING);
    atomic_init(&s->wake_pending, 0);
    s->phase_seen = PHASE_LOADING;
    s->health_serving = HEALTH_NOT_SERVING;
    pthread_mutex_init(&s->wake_mu, NULL);
    pthread_mutex_init(&s->ev_mu, NULL);
    enum status st = STATUS_OK;
    grpc_server_credentials *creds = NULL;

    /* SIGTERM / SIGINT post stop_sem, which the control thread waits on to start the drain. */
    sem_init(&s->stop_sem, 0, 0);
    g_stop_signal = 0;
    g_stop_sem = &s->stop_sem;
    install_stop_handlers();
    signal(SIGPIPE, SIG_IGN);

    if (o->api_key_file && (st = load_keys(s, o->api_key_file)) != STATUS_OK) goto out_early;
    if ((st = make_credentials(o, &creds)) != STATUS_OK) goto out_early;
    if ((st = reflection_init(&s->refl)) != STATUS_OK) goto out_early;

    grpc_init();
    grpc_arg args[2];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = o->max_receive_bytes > 0 ? o->max_receive_bytes : 4 << 20;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = 64 << 20;
    grpc_channel_args chargs = {2, args};
    s->grpc = grpc_server_create(&chargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->grpc, s->cq, NULL);
    int port = grpc_server_add_http2_port(s->grpc, o->listen, creds);
    grpc_server_credentials_release(creds);
    creds = NULL;
    if (port <= 0) {
        st = status_errorf(STATUS_UNAVAILABLE, "cannot listen on %s (address in use or invalid)", o->listen);
        grpc_server_destroy(s->grpc);
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {}
        grpc_completion_queue_destroy(s->cq);
        grpc_shutdown();
        goto out_early;
    }
    grpc_server_start(s->grpc);
    {
        char host[256];
        const char *colon = strrchr(o->listen, ':');
        size_t hn = colon ? (size_t)(colon - o->listen) : strlen(o->listen);
        if (hn >= sizeof host) hn = sizeof host - 1;
        memcpy(host, o->listen, hn);
        host[hn] = 0;
        printf("shardlm: listening on %s:%d%s\n", host, port, o->tls_cert ? " (TLS)" : "");
        fflush(stdout);
        LOG_INFO("server", "listening on %s:%d%s%s", host, port, o->tls_cert ? ", TLS" : "", s->n_keys ? ", API keys" : "");
    }

    s->wake_channel = grpc_lame_client_channel_create("shardlm-wake", GRPC_STATUS_UNAVAILABLE, "wake-up channel");
    s->wake_call = grpc_channel_create_call(s->wake_channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
                                            grpc_slice_from_static_string("/shardlm.internal/Wake"), NULL,
                                            gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    CHECK(s->wake_call, "cannot create the wake-up call");
    for (int i = 0; i < N_REQUEST_SLOTS; i++) {
        s->slots[i].s = s;
        s->slots[i].tag = (struct tag){TAG_REQUEST, &s->slots[i]};
        request_slot_arm(&s->slots[i]);
    }
    if (pthread_create(&s->control, NULL, control_main, s) != 0) CHECK(0, "cannot start the control thread");
    s->control_started = 1;

    while (!(s->shutdown_done && s->n_calls == 0 && s->n_slots_active == 0)) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                                       gpr_time_from_millis(500, GPR_TIMESPAN)),
                                                   NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            struct tag *t = ev.tag;
            switch (t->kind) {
            case TAG_REQUEST: on_new_call(t->owner, ev.success); break;
            case TAG_RECV: on_recv(t->owner, ev.success); break;
            case TAG_SEND: on_send(t->owner, ev.success); break;
            case TAG_CLOSE: on_close(t->owner); break;
            case TAG_WAKE: atomic_store(&s->wake_pending, 0); break;
            case TAG_SHUTDOWN: s->shutdown_done = 1; break;
            }
        } else if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        loop_tick(s);
    }

    /* The control thread is done unless the loop stopped for another reason. */
    if (atomic_load(&s->phase) == PHASE_READY) sem_post(&s->stop_sem);
    pthread_join(s->control, NULL);
    drain_engine_events(s); /* nothing should be left; the calls are gone */
    if (atomic_load(&s->phase) == PHASE_FAILED) st = status_errorf(s->load_status, "%s", s->load_message);
    if (s->fatal) st = status_errorf(STATUS_UNAVAILABLE, "%s", s->fatal_message);

    grpc_call_unref(s->wake_call);
    grpc_channel_destroy(s->wake_channel);
    grpc_server_destroy(s->grpc);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(s->cq);
    engine_free(s->engine);
    grpc_shutdown();
    if (st == STATUS_OK) LOG_INFO("server", "drained; exiting");

out_early:
    if (creds) grpc_server_credentials_release(creds);
    reflection_free(s->refl);
    for (int i = 0; i < s->n_keys; i++) free(s->keys[i]);
    free(s->keys);
    /* The handlers stay (doing nothing now): a second SIGTERM while the process exits must not
     * turn a clean drain into death by signal. */
    g_stop_sem = NULL;
    sem_destroy(&s->stop_sem);
    pthread_mutex_destroy(&s->wake_mu);
    pthread_mutex_destroy(&s->ev_mu);
    free(s);
    return st;
}
