/* clients/client.c - the C client library (client.h) over gRPC C core: one channel per struct
 * client, and per call a completion queue of its own, driven by the calling thread, batch by
 * batch. protobuf-c messages are built and read only here; the header speaks native structs.
 * Not here: the command line (cli.c).
 * Tests: tests/test_client.sh (every subcommand of cli.c against a real `shardlm serve`).
 *
 * A call runs as: [send metadata + request + half-close + receive metadata] then, unary,
 * [receive message + status] or, streaming, [receive message] until the stream ends, then
 * [receive status]. While a batch is pending, the thread waits on the call's queue in slices
 * of CALL_POLL_MS and checks the request's cancel flag between them, so that a flag set by a
 * signal handler cancels the call within one slice. */
#include "client.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "shardlm/v1/text_generation.pb-c.h"

#define CALL_POLL_MS         50
#define MAX_RECEIVE_BYTES    (256 << 20) /* responses with many logprobs can be large */
#define MAX_SAMPLES          1024        /* more than the API's n range; guards a bad index */
#define SERVICE              "/shardlm.v1.TextGeneration/"

struct call;

struct client {
    grpc_channel   *channel;
    grpc_metadata   auth;        /* authorization: Bearer <key>, when has_auth */
    int             has_auth;
    double          timeout_s;
    pthread_mutex_t mu;          /* guards active */
    struct call    *active;      /* calls now running, for client_cancel_calls */
};

struct call {
    struct client         *c;
    grpc_completion_queue *cq;
    grpc_call             *call;
    const volatile sig_atomic_t *cancel_flag;
    int                    cancel_sent;
    struct call           *prev, *next;
};

/* ---- names and status codes ----------------------------------------------------------- */

const char *client_grpc_code_name(int code)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code >= 0 && (size_t)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN";
}

const char *client_finish_reason_name(enum client_finish_reason r)
{
    switch (r) {
    case CLIENT_FINISH_REASON_NONE: return "";
    case CLIENT_FINISH_REASON_LENGTH: return "length";
    case CLIENT_FINISH_REASON_STOP: return "stop";
    case CLIENT_FINISH_REASON_EOS: return "eos";
    case CLIENT_FINISH_REASON_CANCELLED: return "cancelled";
    case CLIENT_FINISH_REASON_DEADLINE: return "deadline";
    case CLIENT_FINISH_REASON_ERROR: return "error";
    }
    return "unknown";
}

static enum client_finish_reason finish_reason_from_pb(Shardlm__V1__FinishReason r)
{
    /* The enum mirrors the proto's values; a value appended to the proto later reads as
     * ERROR rather than as something it is not. */
    if ((int)r >= 0 && (int)r <= CLIENT_FINISH_REASON_ERROR) return (enum client_finish_reason)r;
    return CLIENT_FINISH_REASON_ERROR;
}

/* The one mapping from a call's final gRPC status to enum status (see client.h). */
static enum status status_from_grpc(grpc_status_code code, const char *message)
{
    enum status st;
    int exact = 1;
    switch (code) {
    case GRPC_STATUS_OK: return STATUS_OK;
    case GRPC_STATUS_CANCELLED: st = STATUS_CANCELLED; break;
    case GRPC_STATUS_INVALID_ARGUMENT: st = STATUS_INVALID_ARGUMENT; break;
    case GRPC_STATUS_DEADLINE_EXCEEDED: st = STATUS_DEADLINE_EXCEEDED; break;
    case GRPC_STATUS_NOT_FOUND: st = STATUS_NOT_FOUND; break;
    case GRPC_STATUS_RESOURCE_EXHAUSTED: st = STATUS_RESOURCE_EXHAUSTED; break;
    case GRPC_STATUS_UNAVAILABLE: st = STATUS_UNAVAILABLE; break;
    case GRPC_STATUS_INTERNAL: st = STATUS_INTERNAL; break;
    case GRPC_STATUS_UNAUTHENTICATED:
    case GRPC_STATUS_PERMISSION_DENIED:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_ALREADY_EXISTS: st = STATUS_INVALID_ARGUMENT; exact = 0; break;
    case GRPC_STATUS_UNIMPLEMENTED: st = STATUS_UNSUPPORTED; exact = 0; break;
    case GRPC_STATUS_ABORTED: st = STATUS_UNAVAILABLE; exact = 0; break;
    default: st = STATUS_INTERNAL; exact = 0; break;
    }
    if (!message || !*message) message = "(no message)";
    if (exact) return status_errorf(st, "%s", message);
    return status_errorf(st, "%s: %s", client_grpc_code_name(code), message);
}

/* ---- open / close --------------------------------------------------------------------- */

static enum status read_file(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            }
            buf = nb;
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return status_errorf(STATUS_IO, "%s: read error", path);
    }
    buf[len] = '\0';
    *out = buf;
    return STATUS_OK;
}

enum status client_open(const char *addr, const struct client_options *o, struct client **out)
{
    static const struct client_options defaults = {0};
    if (!o) o = &defaults;
    *out = NULL;
    if (!addr || !*addr) return status_errorf(STATUS_INVALID_ARGUMENT, "the server address is empty");
    if (o->timeout_s < 0 || isnan(o->timeout_s))
        return status_errorf(STATUS_INVALID_ARGUMENT, "the timeout must be >= 0 seconds");
    if (o->api_key) {
        for (const char *p = o->api_key; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
                return status_errorf(STATUS_INVALID_ARGUMENT,
                                     "the API key must be printable ASCII (metadata value)");
    }
    char *pem = NULL;
    if (o->tls_root_cert_file) {
        enum status st = read_file(o->tls_root_cert_file, &pem);
        if (st != STATUS_OK) return st;
    }
    struct client *c = calloc(1, sizeof *c);
    if (!c) {
        free(pem);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->timeout_s = o->timeout_s;
    grpc_init();

    grpc_arg args[4];
    int n_args = 0;
    args[n_args].type = GRPC_ARG_INTEGER;
    args[n_args].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[n_args++].value.integer = MAX_RECEIVE_BYTES;
    args[n_args].type = GRPC_ARG_STRING;
    args[n_args].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[n_args++].value.string = (char *)"shardlm-client";
    if (o->own_connection) {
        args[n_args].type = GRPC_ARG_INTEGER;
        args[n_args].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[n_args++].value.integer = 1;
    }
    if (o->tls_server_name) {
        args[n_args].type = GRPC_ARG_STRING;
        args[n_args].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n_args++].value.string = (char *)o->tls_server_name;
    }
    grpc_channel_args cargs = {.num_args = (size_t)n_args, .args = args};
    grpc_channel_credentials *creds;
    if (o->tls || pem) creds = grpc_ssl_credentials_create(pem, NULL, NULL, NULL);
    else creds = grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(addr, creds, &cargs);
    grpc_channel_credentials_release(creds);
    free(pem);
    if (!c->channel) {
        client_close(c);
        return status_errorf(STATUS_INVALID_ARGUMENT, "cannot create a channel to '%s'", addr);
    }
    if (o->api_key) {
        size_t n = strlen(o->api_key);
        char *v = malloc(n + 8);
        if (!v) {
            client_close(c);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        memcpy(v, "Bearer ", 7);
        memcpy(v + 7, o->api_key, n + 1);
        c->auth.key = grpc_slice_from_static_string("authorization");
        c->auth.value = grpc_slice_from_copied_string(v);
        c->has_auth = 1;
        free(v);
    }
    *out = c;
    return STATUS_OK;
}

void client_close(struct client *c)
{
    if (!c) return;
    CHECK(!c->active, "client_close with calls still running");
    if (c->has_auth) grpc_slice_unref(c->auth.value);
    if (c->channel) grpc_channel_destroy(c->channel);
    pthread_mutex_destroy(&c->mu);
    free(c);
    grpc_shutdown();
}

/* ---- one call ------------------------------------------------------------------------- */

static gpr_timespec deadline_after(double seconds)
{
    if (seconds <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

static enum status call_start(struct client *c, const char *method, double timeout_s,
                              const volatile sig_atomic_t *cancel_flag, struct call *k)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    k->cancel_flag = cancel_flag;
    k->cq = grpc_completion_queue_create_for_next(NULL);
    if (!k->cq) return status_errorf(STATUS_INTERNAL, "grpc_completion_queue_create_for_next failed");
    grpc_slice m = grpc_slice_from_static_string(method);
    k->call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq, m, NULL,
                                       deadline_after(timeout_s > 0 ? timeout_s : c->timeout_s), NULL);
    if (!k->call) {
        grpc_completion_queue_shutdown(k->cq);
        while (grpc_completion_queue_next(k->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {}
        grpc_completion_queue_destroy(k->cq);
        return status_errorf(STATUS_INTERNAL, "grpc_channel_create_call failed for %s", method);
    }
    pthread_mutex_lock(&c->mu);
    k->next = c->active;
    if (c->active) c->active->prev = k;
    c->active = k;
    pthread_mutex_unlock(&c->mu);
    return STATUS_OK;
}

static void call_end(struct call *k)
{
    struct client *c = k->c;
    pthread_mutex_lock(&c->mu);
    if (k->prev) k->prev->next = k->next;
    else c->active = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&c->mu);
    grpc_call_unref(k->call);
    grpc_completion_queue_shutdown(k->cq);
    while (grpc_completion_queue_next(k->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(k->cq);
}

static void call_cancel(struct call *k)
{
    if (!k->cancel_sent) {
        k->cancel_sent = 1;
        grpc_call_cancel(k->call, NULL);
    }
}

/* Starts a batch and waits for it, cancelling the call when the cancel flag rises meanwhile.
 * Returns the batch's success bit (0 for a failed batch, which the final status explains). */
static int call_batch(struct call *k, const grpc_op *ops, size_t n)
{
    void *tag = k;
    grpc_call_error e = grpc_call_start_batch(k->call, ops, n, tag, NULL);
    CHECK(e == GRPC_CALL_OK, "grpc_call_start_batch: error %d", (int)e);
    for (;;) {
        if (k->cancel_flag && *k->cancel_flag) call_cancel(k);
        gpr_timespec slice = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                          gpr_time_from_millis(CALL_POLL_MS, GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(k->cq, slice, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) continue;
        CHECK(ev.type == GRPC_OP_COMPLETE && ev.tag == tag, "unexpected completion-queue event %d",
              (int)ev.type);
        return ev.success;
    }
}

/* The call's final status as an enum status; *code receives the gRPC code. */
static enum status call_finish(struct call *k, int *code)
{
    grpc_metadata_array trailing;
    grpc_metadata_array_init(&trailing);
    grpc_status_code sc = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *error_string = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &trailing;
    op.data.recv_status_on_client.status = &sc;
    op.data.recv_status_on_client.status_details = &details;
    op.data.recv_status_on_client.error_string = &error_string;
    call_batch(k, &op, 1);
    if (code) *code = (int)sc;
    enum status st = STATUS_OK;
    if (sc != GRPC_STATUS_OK) {
        char *msg = grpc_slice_to_c_string(details);
        /* A call that never reached a server has only gRPC's own account of why. */
        st = status_from_grpc(sc, *msg ? msg : error_string);
        gpr_free(msg);
    }
    if (error_string) gpr_free((void *)error_string);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&trailing);
    return st;
}

static grpc_byte_buffer *pack(const ProtobufCMessage *m)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static ProtobufCMessage *unpack(const ProtobufCMessageDescriptor *d, grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader r;
    if (!grpc_byte_buffer_reader_init(&r, bb)) return NULL;
    grpc_slice s = grpc_byte_buffer_reader_readall(&r);
    grpc_byte_buffer_reader_destroy(&r);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

/* Sends the request and half-closes; returns the batch's success bit. */
static int call_send(struct call *k, const ProtobufCMessage *req, grpc_metadata_array *initial)
{
    grpc_byte_buffer *bb = pack(req);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = k->c->has_auth ? 1 : 0;
    ops[0].data.send_initial_metadata.metadata = k->c->has_auth ? &k->c->auth : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = initial;
    int ok = call_batch(k, ops, 4);
    grpc_byte_buffer_destroy(bb);
    return ok;
}

/* Receives the next message: 1 with *out set, 0 at the end of the stream (or on failure,
 * which the final status explains). */
static int call_recv(struct call *k, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
                     int *bad_message)
{
    grpc_byte_buffer *bb = NULL;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    int ok = call_batch(k, &op, 1);
    if (!ok || !bb) {
        if (bb) grpc_byte_buffer_destroy(bb);
        return 0;
    }
    *out = unpack(d, bb);
    grpc_byte_buffer_destroy(bb);
    if (!*out) {
        *bad_message = 1;
        call_cancel(k);
        return 0;
    }
    return 1;
}

/* A call of one request and a stream of responses (a unary call is a stream of one):
 * on_msg sees each response and returns non-zero to cancel the call. The response is freed
 * after the callback unless the callback takes it by setting *m to NULL. */
typedef int (*msg_fn)(void *ctx, ProtobufCMessage **m);

static enum status call_run(struct client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                            const volatile sig_atomic_t *cancel_flag, int streaming,
                            msg_fn on_msg, void *ctx, int *grpc_code)
{
    struct call k;
    int n_msgs = 0, bad_message = 0, cb_cancelled = 0, code = GRPC_STATUS_UNKNOWN;
    enum status st = call_start(c, method, timeout_s, cancel_flag, &k);
    if (st != STATUS_OK) {
        if (grpc_code) *grpc_code = GRPC_STATUS_INTERNAL;
        return st;
    }
    grpc_metadata_array initial;
    grpc_metadata_array_init(&initial);
    if (call_send(&k, req, &initial)) {
        ProtobufCMessage *m;
        while (call_recv(&k, resp_desc, &m, &bad_message)) {
            n_msgs++;
            int stop = (!streaming && n_msgs > 1) ? 1 : on_msg(ctx, &m);
            if (m) protobuf_c_message_free_unpacked(m, NULL);
            if (stop) {
                cb_cancelled = 1;
                call_cancel(&k);
            }
        }
    }
    st = call_finish(&k, &code);
    grpc_metadata_array_destroy(&initial);
    call_end(&k);
    if (st == STATUS_OK && bad_message) {
        code = GRPC_STATUS_INTERNAL;
        st = status_errorf(STATUS_INTERNAL, "%s: the server sent a message that does not parse", method);
    } else if (st == STATUS_OK && !streaming && n_msgs != 1) {
        code = GRPC_STATUS_INTERNAL;
        st = status_errorf(STATUS_INTERNAL, "%s: the server sent %d messages to a unary call", method, n_msgs);
    } else if (st == STATUS_OK && cb_cancelled) {
        /* The server finished before our cancel reached it; the caller still asked to stop. */
        code = GRPC_STATUS_CANCELLED;
        st = status_errorf(STATUS_CANCELLED, "cancelled by the client");
    }
    if (grpc_code) *grpc_code = code;
    return st;
}

void client_cancel_calls(struct client *c)
{
    pthread_mutex_lock(&c->mu);
    for (struct call *k = c->active; k; k = k->next) {
        /* grpc_call_cancel is thread-safe; cancel_sent is left to the owning thread. */
        grpc_call_cancel(k->call, NULL);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ---- conversions ---------------------------------------------------------------------- */

static char *str_dup(const char *s)
{
    if (!s) s = "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* Grows *p, holding n elements, so that it holds at least need; capacities are powers of two
 * so that appending one chunk at a time stays linear. */
static int grow(void **p, size_t n, size_t need, size_t elem)
{
    size_t cap = 1;
    while (cap < n) cap <<= 1;
    if (n > 0 && need <= cap) return 0;
    size_t ncap = 1;
    while (ncap < need) ncap <<= 1;
    void *q = realloc(*p, ncap * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static void logprobs_free(struct client_logprob *lp, int n)
{
    if (!lp) return;
    for (int i = 0; i < n; i++) {
        free(lp[i].piece);
        for (int j = 0; j < lp[i].n_top; j++) free(lp[i].top[j].piece);
        free(lp[i].top);
    }
    free(lp);
}

/* Appends n protobuf logprobs to (*dst, *n_dst), deep-copied. */
static enum status logprobs_append(struct client_logprob **dst, int *n_dst,
                                   Shardlm__V1__TokenLogprob *const *src, size_t n)
{
    if (n == 0) return STATUS_OK;
    if (grow((void **)dst, (size_t)*n_dst, (size_t)*n_dst + n, sizeof **dst))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct client_logprob *d = &(*dst)[*n_dst];
        memset(d, 0, sizeof *d);
        d->token_id = src[i]->token_id;
        d->logprob = src[i]->logprob;
        (*n_dst)++;
        if (!(d->piece = str_dup(src[i]->piece))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        if (src[i]->n_top) {
            d->top = calloc(src[i]->n_top, sizeof *d->top);
            if (!d->top) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            for (size_t j = 0; j < src[i]->n_top; j++) {
                d->top[j].token_id = src[i]->top[j]->token_id;
                d->top[j].logprob = src[i]->top[j]->logprob;
                d->n_top++;
                if (!(d->top[j].piece = str_dup(src[i]->top[j]->piece)))
                    return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
    }
    return STATUS_OK;
}

static struct client_usage usage_from_pb(const Shardlm__V1__Usage *u)
{
    struct client_usage r = {0};
    if (u) {
        r.prompt_tokens = u->prompt_tokens;
        r.completion_tokens = u->completion_tokens;
        r.cached_prompt_tokens = u->cached_prompt_tokens;
    }
    return r;
}

void client_result_free(struct client_result *r)
{
    if (!r) return;
    free(r->request_id);
    for (int i = 0; i < r->n_completions; i++) {
        free(r->completions[i].text);
        free(r->completions[i].token_ids);
        logprobs_free(r->completions[i].logprobs, r->completions[i].n_logprobs);
    }
    free(r->completions);
    logprobs_free(r->prompt_logprobs, r->n_prompt_logprobs);
    memset(r, 0, sizeof *r);
}

/* Sample `index` of r, created (empty) when new. */
static enum status result_sample(struct client_result *r, int index, struct client_completion **out)
{
    if (index < 0 || index >= MAX_SAMPLES)
        return status_errorf(STATUS_INTERNAL, "the server sent sample index %d", index);
    if (index >= r->n_completions) {
        struct client_completion *nc = realloc(r->completions, (size_t)(index + 1) * sizeof *nc);
        if (!nc) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        r->completions = nc;
        for (int i = r->n_completions; i <= index; i++) {
            memset(&nc[i], 0, sizeof nc[i]);
            nc[i].index = i;
            if (!(nc[i].text = str_dup(""))) {
                r->n_completions = i;
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        r->n_completions = index + 1;
    }
    *out = &r->completions[index];
    return STATUS_OK;
}

/* Appends text, token ids and logprobs to a sample. */
static enum status sample_append(struct client_completion *s, const char *text, size_t len,
                                 const int32_t *ids, size_t n_ids,
                                 Shardlm__V1__TokenLogprob *const *lp, size_t n_lp)
{
    if (len) {
        /* text holds text_len + 1 bytes (the NUL). */
        if (grow((void **)&s->text, s->text_len + 1, s->text_len + len + 1, 1))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(s->text + s->text_len, text, len);
        s->text_len += len;
        s->text[s->text_len] = '\0';
    }
    if (n_ids) {
        if (grow((void **)&s->token_ids, (size_t)s->n_token_ids, (size_t)s->n_token_ids + n_ids,
                 sizeof *s->token_ids))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(s->token_ids + s->n_token_ids, ids, n_ids * sizeof *ids);
        s->n_token_ids += (int)n_ids;
    }
    return logprobs_append(&s->logprobs, &s->n_logprobs, lp, n_lp);
}

/* The request's SamplingParams, pointing into req and into the two arrays given (which must
 * outlive the message). */
static enum status sampling_to_pb(const struct client_sampling *s, Shardlm__V1__SamplingParams *p,
                                  Shardlm__V1__SamplingParams__LogitBiasEntry **entries,
                                  Shardlm__V1__SamplingParams__LogitBiasEntry ***entry_ptrs)
{
    shardlm__v1__sampling_params__init(p);
    *entries = NULL;
    *entry_ptrs = NULL;
    if (s->has_max_tokens) {
        p->_max_tokens_case = SHARDLM__V1__SAMPLING_PARAMS___MAX_TOKENS_MAX_TOKENS;
        p->max_tokens = s->max_tokens;
    }
    if (s->has_temperature) {
        p->_temperature_case = SHARDLM__V1__SAMPLING_PARAMS___TEMPERATURE_TEMPERATURE;
        p->temperature = s->temperature;
    }
    p->top_k = s->top_k;
    if (s->has_top_p) {
        p->_top_p_case = SHARDLM__V1__SAMPLING_PARAMS___TOP_P_TOP_P;
        p->top_p = s->top_p;
    }
    p->min_p = s->min_p;
    if (s->has_repetition_penalty) {
        p->_repetition_penalty_case = SHARDLM__V1__SAMPLING_PARAMS___REPETITION_PENALTY_REPETITION_PENALTY;
        p->repetition_penalty = s->repetition_penalty;
    }
    p->presence_penalty = s->presence_penalty;
    p->frequency_penalty = s->frequency_penalty;
    if (s->has_seed) {
        p->_seed_case = SHARDLM__V1__SAMPLING_PARAMS___SEED_SEED;
        p->seed = s->seed;
    }
    if (s->n_stop < 0 || s->n_stop_token_ids < 0 || s->n_logit_bias < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "negative array length in client_sampling");
    p->n_stop = (size_t)s->n_stop;
    p->stop = (char **)s->stop;  /* packing only reads */
    p->n_stop_token_ids = (size_t)s->n_stop_token_ids;
    p->stop_token_ids = (int32_t *)s->stop_token_ids;
    p->ignore_eos = s->ignore_eos != 0;
    p->min_tokens = s->min_tokens;
    if (s->has_logprobs) {
        p->_logprobs_case = SHARDLM__V1__SAMPLING_PARAMS___LOGPROBS_LOGPROBS;
        p->logprobs = s->logprobs;
    }
    if (s->has_prompt_logprobs) {
        p->_prompt_logprobs_case = SHARDLM__V1__SAMPLING_PARAMS___PROMPT_LOGPROBS_PROMPT_LOGPROBS;
        p->prompt_logprobs = s->prompt_logprobs;
    }
    if (s->has_n) {
        p->_n_case = SHARDLM__V1__SAMPLING_PARAMS___N_N;
        p->n = s->n;
    }
    if (s->n_logit_bias > 0) {
        *entries = calloc((size_t)s->n_logit_bias, sizeof **entries);
        *entry_ptrs = calloc((size_t)s->n_logit_bias, sizeof **entry_ptrs);
        if (!*entries || !*entry_ptrs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        for (int i = 0; i < s->n_logit_bias; i++) {
            shardlm__v1__sampling_params__logit_bias_entry__init(&(*entries)[i]);
            (*entries)[i].key = s->logit_bias_ids[i];
            (*entries)[i].value = s->logit_bias_values[i];
            (*entry_ptrs)[i] = &(*entries)[i];
        }
        p->n_logit_bias = (size_t)s->n_logit_bias;
        p->logit_bias = *entry_ptrs;
    }
    return STATUS_OK;
}

/* Everything a GenerateRequest or ChatRequest borrows, released by request_pb_free. */
struct request_pb {
    int                            chat;
    Shardlm__V1__GenerateRequest   gen;
    Shardlm__V1__ChatRequest       chat_req;
    Shardlm__V1__SamplingParams    sampling;
    Shardlm__V1__SamplingParams__LogitBiasEntry *bias, **bias_ptrs;
    Shardlm__V1__ChatMessage      *msgs, **msg_ptrs;
};

static void request_pb_free(struct request_pb *r)
{
    free(r->bias);
    free(r->bias_ptrs);
    free(r->msgs);
    free(r->msg_ptrs);
}

static enum status request_to_pb(const struct client_request *req, struct request_pb *r)
{
    memset(r, 0, sizeof *r);
    enum status st = sampling_to_pb(&req->sampling, &r->sampling, &r->bias, &r->bias_ptrs);
    if (st != STATUS_OK) return st;
    if (req->n_messages < 0 || req->n_prompt_token_ids < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "negative array length in client_request");
    char *id = (char *)(req->request_id ? req->request_id : "");
    if (req->n_messages > 0) {
        if ((req->prompt && *req->prompt) || req->n_prompt_token_ids || req->has_add_bos)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "a chat request (messages) takes no prompt, prompt_token_ids or add_bos");
        r->chat = 1;
        shardlm__v1__chat_request__init(&r->chat_req);
        r->msgs = calloc((size_t)req->n_messages, sizeof *r->msgs);
        r->msg_ptrs = calloc((size_t)req->n_messages, sizeof *r->msg_ptrs);
        if (!r->msgs || !r->msg_ptrs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        for (int i = 0; i < req->n_messages; i++) {
            shardlm__v1__chat_message__init(&r->msgs[i]);
            r->msgs[i].role = (char *)(req->messages[i].role ? req->messages[i].role : "");
            r->msgs[i].content = (char *)(req->messages[i].content ? req->messages[i].content : "");
            r->msg_ptrs[i] = &r->msgs[i];
        }
        r->chat_req.request_id = id;
        r->chat_req.n_messages = (size_t)req->n_messages;
        r->chat_req.messages = r->msg_ptrs;
        r->chat_req.sampling = &r->sampling;
    } else {
        shardlm__v1__generate_request__init(&r->gen);
        r->gen.request_id = id;
        r->gen.prompt = (char *)(req->prompt ? req->prompt : "");
        r->gen.n_prompt_token_ids = (size_t)req->n_prompt_token_ids;
        r->gen.prompt_token_ids = (int32_t *)req->prompt_token_ids;
        r->gen.sampling = &r->sampling;
        if (req->has_add_bos) {
            r->gen._add_bos_case = SHARDLM__V1__GENERATE_REQUEST___ADD_BOS_ADD_BOS;
            r->gen.add_bos = req->add_bos != 0;
        }
    }
    return STATUS_OK;
}

static const ProtobufCMessage *request_pb_message(const struct request_pb *r)
{
    return r->chat ? &r->chat_req.base : &r->gen.base;
}

/* ---- Generate / Chat ------------------------------------------------------------------ */

/* What a response callback could not convert; the call then ends as cancelled by us, and
 * this is reported instead. */
struct convert_error {
    enum status st;
    char msg[512];
};

static int convert_failed(struct convert_error *e, enum status st)
{
    e->st = st;
    snprintf(e->msg, sizeof e->msg, "%s", status_message());
    return 1;
}

struct unary_ctx {
    struct client_result *res;
    struct convert_error err;
};

static int unary_generate_msg(void *ctx, ProtobufCMessage **m)
{
    struct unary_ctx *u = ctx;
    const Shardlm__V1__GenerateResponse *g = (const Shardlm__V1__GenerateResponse *)*m;
    struct client_result *r = u->res;
    struct client_completion *s;
    enum status st;
    if (!(r->request_id = str_dup(g->request_id)))
        return convert_failed(&u->err, status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"));
    r->seed = g->seed;
    r->usage = usage_from_pb(g->usage);
    st = logprobs_append(&r->prompt_logprobs, &r->n_prompt_logprobs, g->prompt_logprobs,
                         g->n_prompt_logprobs);
    if (st != STATUS_OK) return convert_failed(&u->err, st);
    if (g->n_completions == 0) {
        /* A server that fills only the top level (sample 0). */
        if ((st = result_sample(r, 0, &s)) != STATUS_OK) return convert_failed(&u->err, st);
        s->finish_reason = finish_reason_from_pb(g->finish_reason);
        s->usage = r->usage;
        st = sample_append(s, g->text, strlen(g->text), g->token_ids, g->n_token_ids,
                           g->logprobs, g->n_logprobs);
        return st != STATUS_OK ? convert_failed(&u->err, st) : 0;
    }
    for (size_t i = 0; i < g->n_completions; i++) {
        const Shardlm__V1__Completion *pc = g->completions[i];
        if ((st = result_sample(r, pc->index, &s)) != STATUS_OK) return convert_failed(&u->err, st);
        s->finish_reason = finish_reason_from_pb(pc->finish_reason);
        s->usage = usage_from_pb(pc->usage);
        st = sample_append(s, pc->text, strlen(pc->text), pc->token_ids, pc->n_token_ids,
                           pc->logprobs, pc->n_logprobs);
        if (st != STATUS_OK) return convert_failed(&u->err, st);
    }
    return 0;
}

enum status client_generate(struct client *c, const struct client_request *req,
                            struct client_result *res)
{
    struct client_result local = {0};
    if (!res) res = &local;
    client_result_free(res);
    struct request_pb rp;
    enum status st = request_to_pb(req, &rp);
    if (st == STATUS_OK) {
        struct unary_ctx u = {.res = res};
        st = call_run(c, rp.chat ? SERVICE "Chat" : SERVICE "Generate", request_pb_message(&rp),
                      &shardlm__v1__generate_response__descriptor, req->timeout_s, req->cancel_flag,
                      0, unary_generate_msg, &u, &res->grpc_code);
        if (u.err.st != STATUS_OK) st = status_errorf(u.err.st, "%s", u.err.msg);
    } else {
        res->grpc_code = GRPC_STATUS_INVALID_ARGUMENT;
    }
    request_pb_free(&rp);
    client_result_free(&local);
    return st;
}

struct stream_ctx {
    struct client_result *res;
    client_chunk_fn on_chunk;
    void *user;
    struct convert_error err;
};

static int stream_generate_msg(void *ctx, ProtobufCMessage **m)
{
    struct stream_ctx *sc = ctx;
    const Shardlm__V1__GenerateResponse *g = (const Shardlm__V1__GenerateResponse *)*m;
    struct client_result *r = sc->res;
    struct client_completion *s;
    struct client_logprob *lp = NULL;
    int n_lp = 0, stop = 0;
    enum status st;
    if (!r->request_id && !(r->request_id = str_dup(g->request_id))) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    r->seed = g->seed;
    if ((st = logprobs_append(&r->prompt_logprobs, &r->n_prompt_logprobs, g->prompt_logprobs,
                              g->n_prompt_logprobs)) != STATUS_OK)
        goto fail;
    if ((st = result_sample(r, g->index, &s)) != STATUS_OK) goto fail;
    if ((st = sample_append(s, g->text, strlen(g->text), g->token_ids, g->n_token_ids, g->logprobs,
                            g->n_logprobs)) != STATUS_OK)
        goto fail;
    struct client_chunk ch = {
        .request_id = g->request_id,
        .index = g->index,
        .text = g->text,
        .text_len = strlen(g->text),
        .token_ids = g->token_ids,
        .n_token_ids = (int)g->n_token_ids,
        .finish_reason = finish_reason_from_pb(g->finish_reason),
        .seed = g->seed,
    };
    if (ch.finish_reason != CLIENT_FINISH_REASON_NONE) {
        s->finish_reason = ch.finish_reason;
        s->usage = ch.usage = usage_from_pb(g->usage);
        r->usage.prompt_tokens = ch.usage.prompt_tokens;
        r->usage.cached_prompt_tokens = ch.usage.cached_prompt_tokens;
        r->usage.completion_tokens += ch.usage.completion_tokens;
    }
    if (sc->on_chunk) {
        if (g->n_logprobs) {
            /* The chunk's own view of its logprobs (the sample's copy is separate). */
            if ((st = logprobs_append(&lp, &n_lp, g->logprobs, g->n_logprobs)) != STATUS_OK) {
                logprobs_free(lp, n_lp);
                goto fail;
            }
            ch.logprobs = lp;
            ch.n_logprobs = n_lp;
        }
        stop = sc->on_chunk(sc->user, &ch);
        logprobs_free(lp, n_lp);
    }
    return stop;
fail:
    return convert_failed(&sc->err, st);
}

enum status client_generate_stream(struct client *c, const struct client_request *req,
                                   client_chunk_fn on_chunk, void *ctx, struct client_result *res)
{
    struct client_result local = {0};
    if (!res) res = &local;
    client_result_free(res);
    struct request_pb rp;
    enum status st = request_to_pb(req, &rp);
    if (st == STATUS_OK) {
        struct stream_ctx sc = {.res = res, .on_chunk = on_chunk, .user = ctx};
        st = call_run(c, rp.chat ? SERVICE "ChatStream" : SERVICE "GenerateStream",
                      request_pb_message(&rp), &shardlm__v1__generate_response__descriptor,
                      req->timeout_s, req->cancel_flag, 1, stream_generate_msg, &sc, &res->grpc_code);
        if (sc.err.st != STATUS_OK) st = status_errorf(sc.err.st, "%s", sc.err.msg);
    } else {
        res->grpc_code = GRPC_STATUS_INVALID_ARGUMENT;
    }
    request_pb_free(&rp);
    client_result_free(&local);
    return st;
}

/* ---- the small unary methods ---------------------------------------------------------- */

static int keep_msg(void *ctx, ProtobufCMessage **m)
{
    *(ProtobufCMessage **)ctx = *m;
    *m = NULL;
    return 0;
}

/* Runs a unary call and hands back its response (caller frees with
 * protobuf_c_message_free_unpacked). */
static enum status unary_call(struct client *c, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *d, ProtobufCMessage **out)
{
    ProtobufCMessage *resp = NULL;
    enum status st = call_run(c, method, req, d, 0, NULL, 0, keep_msg, &resp, NULL);
    if (st != STATUS_OK) {
        if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        return st;
    }
    *out = resp;
    return STATUS_OK;
}

enum status client_cancel(struct client *c, const char *request_id, int *cancelled)
{
    Shardlm__V1__CancelRequest req = SHARDLM__V1__CANCEL_REQUEST__INIT;
    req.request_id = (char *)(request_id ? request_id : "");
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Cancel", &req.base, &shardlm__v1__cancel_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    if (cancelled) *cancelled = ((Shardlm__V1__CancelResponse *)m)->cancelled;
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

enum status client_tokenize(struct client *c, const char *text, int add_bos, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    Shardlm__V1__TokenizeRequest req = SHARDLM__V1__TOKENIZE_REQUEST__INIT;
    req.text = (char *)(text ? text : "");
    if (add_bos >= 0) {
        req._add_bos_case = SHARDLM__V1__TOKENIZE_REQUEST___ADD_BOS_ADD_BOS;
        req.add_bos = add_bos != 0;
    }
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Tokenize", &req.base, &shardlm__v1__tokenize_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__TokenizeResponse *r = (const Shardlm__V1__TokenizeResponse *)m;
    *ids = malloc((r->n_token_ids ? r->n_token_ids : 1) * sizeof **ids);
    if (!*ids) {
        protobuf_c_message_free_unpacked(m, NULL);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (r->n_token_ids) memcpy(*ids, r->token_ids, r->n_token_ids * sizeof **ids);
    *n = (int)r->n_token_ids;
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

enum status client_detokenize(struct client *c, const int32_t *ids, int n, char **text)
{
    *text = NULL;
    if (n < 0) return status_errorf(STATUS_INVALID_ARGUMENT, "negative token count");
    Shardlm__V1__DetokenizeRequest req = SHARDLM__V1__DETOKENIZE_REQUEST__INIT;
    req.n_token_ids = (size_t)n;
    req.token_ids = (int32_t *)ids;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Detokenize", &req.base, &shardlm__v1__detokenize_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    *text = str_dup(((const Shardlm__V1__DetokenizeResponse *)m)->text);
    protobuf_c_message_free_unpacked(m, NULL);
    return *text ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

void client_model_info_free(struct client_model_info *m)
{
    if (!m) return;
    free(m->architecture);
    free(m->dtype);
    free(m->device);
    free(m->chat_template);
    memset(m, 0, sizeof *m);
}

enum status client_model_info(struct client *c, struct client_model_info *out)
{
    memset(out, 0, sizeof *out);
    Shardlm__V1__GetModelInfoRequest req = SHARDLM__V1__GET_MODEL_INFO_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "GetModelInfo", &req.base,
                                &shardlm__v1__get_model_info_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__GetModelInfoResponse *r = (const Shardlm__V1__GetModelInfoResponse *)m;
    out->n_layers = r->n_layers;
    out->d_model = r->d_model;
    out->n_heads = r->n_heads;
    out->n_kv_heads = r->n_kv_heads;
    out->head_dim = r->head_dim;
    out->ffn_hidden = r->ffn_hidden;
    out->vocab_size = r->vocab_size;
    out->context_length = r->context_length;
    out->tp_size = r->tp_size;
    out->pp_size = r->pp_size;
    out->dp_size = r->dp_size;
    out->kv_block_tokens = r->kv_block_tokens;
    out->kv_blocks = r->kv_blocks;
    out->bos_id = r->bos_id;
    out->eos_id = r->eos_id;
    out->max_logprobs = r->max_logprobs;
    out->architecture = str_dup(r->architecture);
    out->dtype = str_dup(r->dtype);
    out->device = str_dup(r->device);
    out->chat_template = str_dup(r->chat_template);
    protobuf_c_message_free_unpacked(m, NULL);
    if (!out->architecture || !out->dtype || !out->device || !out->chat_template) {
        client_model_info_free(out);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    return STATUS_OK;
}

enum status client_server_stats(struct client *c, struct client_server_stats *out)
{
    memset(out, 0, sizeof *out);
    Shardlm__V1__GetServerStatsRequest req = SHARDLM__V1__GET_SERVER_STATS_REQUEST__INIT;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "GetServerStats", &req.base,
                                &shardlm__v1__get_server_stats_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__GetServerStatsResponse *r = (const Shardlm__V1__GetServerStatsResponse *)m;
    out->waiting = r->waiting;
    out->running = r->running;
    out->kv_blocks_total = r->kv_blocks_total;
    out->kv_blocks_free = r->kv_blocks_free;
    out->kv_blocks_cached = r->kv_blocks_cached;
    out->kv_usage = r->kv_usage;
    out->requests_submitted = r->requests_submitted;
    out->requests_finished = r->requests_finished;
    out->prompt_tokens = r->prompt_tokens;
    out->generated_tokens = r->generated_tokens;
    out->prefix_cache_hit_tokens = r->prefix_cache_hit_tokens;
    out->prefix_cache_hit_rate = r->prefix_cache_hit_rate;
    out->engine_steps = r->engine_steps;
    out->preemptions = r->preemptions;
    out->active_calls = r->active_calls;
    out->uptime_seconds = r->uptime_seconds;
    for (size_t i = 0; i < r->n_replicas && i < CLIENT_MAX_REPLICAS; i++) {
        const Shardlm__V1__ReplicaStats *p = r->replicas[i];
        out->replicas[i] = (struct client_replica_stats){
            .leader_rank = p->leader_rank, .outstanding = p->outstanding, .routed = p->routed,
            .routed_by_prefix = p->routed_by_prefix, .waiting = p->waiting, .running = p->running,
            .kv_blocks_total = p->kv_blocks_total, .kv_blocks_free = p->kv_blocks_free,
            .requests_finished = p->requests_finished, .generated_tokens = p->generated_tokens,
            .prefix_cache_hit_tokens = p->prefix_cache_hit_tokens, .report_age_seconds = p->report_age_seconds};
        out->n_replicas = (int)i + 1;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}
