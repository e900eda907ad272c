/* clients/client_call.c - one call of the C client: a completion queue of its own, driven by
 * the calling thread, batch by batch, and the one mapping from a call's final gRPC status to
 * enum status (client.h lists it).
 *
 * A call runs as: [send metadata + request + half-close + receive metadata] then, unary,
 * [receive message + status] or, streaming, [receive message] until the stream ends, then
 * [receive status]. While a batch is pending, the thread waits on the call's queue in slices
 * of CALL_POLL_MS and checks the request's cancel flag between them, so that a flag set by a
 * signal handler cancels the call within one slice.
 * A Generate / Chat call of a server with a stream journal that fails with UNAVAILABLE is made
 * again with its resume token (client_options.resume_for_s; docs/reliability.md).
 * Not here: what the messages hold (client_convert.c), the channel (client.c).
 * Tests: tests/test_client_lib.c (cancel flags, deadlines, error codes), tests/test_client.sh. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <string.h>

#include "client_internal.h"

struct client_call {
    struct client         *c;
    grpc_completion_queue *cq;
    grpc_call             *call;
    const volatile sig_atomic_t *cancel_flag;
    int                    cancel_sent;
    struct client_call    *prev, *next;
};

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
    case GRPC_STATUS_PERMISSION_DENIED: st = STATUS_INVALID_ARGUMENT; exact = 0; break; /* named in the message */
    case GRPC_STATUS_ALREADY_EXISTS: st = STATUS_ALREADY_EXISTS; break;
    case GRPC_STATUS_FAILED_PRECONDITION: st = STATUS_FAILED_PRECONDITION; break;
    case GRPC_STATUS_OUT_OF_RANGE: st = STATUS_INVALID_ARGUMENT; exact = 0; break;
    case GRPC_STATUS_UNIMPLEMENTED: st = STATUS_UNSUPPORTED; exact = 0; break;
    case GRPC_STATUS_ABORTED: st = STATUS_UNAVAILABLE; exact = 0; break;
    default: st = STATUS_INTERNAL; exact = 0; break;
    }
    if (!message || !*message) message = "(no message)";
    if (exact) return status_errorf(st, "%s", message);
    return status_errorf(st, "%s: %s", client_grpc_code_name(code), message);
}


/* ---- one call ------------------------------------------------------------------------- */

static gpr_timespec deadline_after(double seconds)
{
    if (seconds <= 0) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_micros((int64_t)(seconds * 1e6), GPR_TIMESPAN));
}

static enum status call_start(struct client *c, grpc_channel *ch, const char *method, double timeout_s,
                              const volatile sig_atomic_t *cancel_flag, struct client_call *k)
{
    memset(k, 0, sizeof *k);
    k->c = c;
    k->cancel_flag = cancel_flag;
    k->cq = grpc_completion_queue_create_for_next(NULL);
    if (!k->cq) return status_errorf(STATUS_INTERNAL, "grpc_completion_queue_create_for_next failed");
    grpc_slice m = grpc_slice_from_static_string(method);
    k->call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, k->cq, m, NULL,
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

static void call_end(struct client_call *k)
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

static void call_cancel(struct client_call *k)
{
    if (!k->cancel_sent) {
        k->cancel_sent = 1;
        grpc_call_cancel(k->call, NULL);
    }
}

/* Starts a batch and waits for it, cancelling the call when the cancel flag rises meanwhile.
 * Returns the batch's success bit (0 for a failed batch, which the final status explains). */
static int call_batch(struct client_call *k, const grpc_op *ops, size_t n)
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
static enum status call_finish(struct client_call *k, int *code)
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

/* Sends the request (with the metadata md[0..n_md) besides the API key) and half-closes
 * (*written: 1 once the transport took them, so a server may have the request), then receives
 * the initial metadata; 1 when both went well. */
static int call_send(struct client_call *k, const ProtobufCMessage *req, const grpc_metadata *md, size_t n_md,
                     grpc_metadata_array *initial, int *written)
{
    grpc_byte_buffer *bb = pack(req);
    grpc_metadata all[3];
    size_t n = 0;
    if (k->c->has_auth) all[n++] = k->c->auth;
    for (size_t i = 0; i < n_md && n < 3; i++) all[n++] = md[i];
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n;
    ops[0].data.send_initial_metadata.metadata = n ? all : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = bb;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = initial;
    *written = call_batch(k, ops, 3);
    grpc_byte_buffer_destroy(bb);
    return *written && call_batch(k, ops + 3, 1);
}

/* Receives the next message: 1 with *out set, 0 at the end of the stream (or on failure,
 * which the final status explains). */
static int call_recv(struct client_call *k, const ProtobufCMessageDescriptor *d,
                     ProtobufCMessage **out, int *bad_message)
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

/* ---- reattaching to a journaling server (client_options.resume_for_s) -------------------- */

#define RESUME_TOKEN_MAX 128 /* the server's ids are at most 100 bytes */

/* A Generate / Chat call's way back after its server died: the resume token its first call's
 * initial metadata named ("" before, or from a server without a journal) and, per sample, the
 * token ids the caller got and whether it got the sample's last message. */
struct resume {
    char          token[RESUME_TOKEN_MAX];
    char          own_id[RESUME_TOKEN_MAX]; /* the request's own request_id ("" none): its token */
    int           guessed;   /* token is own_id, taken when the first call failed before naming one */
    int           n_samples; /* the request's n; 0: the call is never made again */
    long          counts[MAX_SAMPLES];
    unsigned char finals[MAX_SAMPLES];
};

static void resume_token_from(struct resume *r, const grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count && !r->token[0]; i++) {
        const size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        if (!grpc_slice_str_cmp(md->metadata[i].key, "shardlm-resume-token") && n && n < sizeof r->token) {
            memcpy(r->token, GRPC_SLICE_START_PTR(md->metadata[i].value), n);
            r->token[n] = 0;
        }
    }
}

static void resume_count(struct resume *r, const ProtobufCMessage *m)
{
    const Shardlm__V1__GenerateResponse *g = (const Shardlm__V1__GenerateResponse *)m;
    if (g->index < 0 || g->index >= r->n_samples) return;
    r->counts[g->index] += (long)g->n_token_ids;
    if (g->finish_reason != SHARDLM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED) r->finals[g->index] = 1;
}

/* shardlm-resume-from's value "S0,S1,..." into buf, or "" when nothing came yet. */
static void resume_from(const struct resume *r, char *buf, size_t cap)
{
    size_t used = 0;
    int any = 0;
    buf[0] = 0;
    for (int i = 0; i < r->n_samples; i++) any |= r->counts[i] > 0 || r->finals[i];
    for (int i = 0; any && i < r->n_samples && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%ld%s", i ? "," : "", r->counts[i], r->finals[i] ? "!" : "");
}

/* The request's own request_id into r->own_id (a server journals the call under it, so a call
 * cut before the server's headers named its token can still reattach by it). */
static void resume_own_id(struct resume *r, const ProtobufCMessage *req)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "request_id");
    if (!f || f->type != PROTOBUF_C_TYPE_STRING || f->label == PROTOBUF_C_LABEL_REPEATED) return;
    const char *id = *(char *const *)(const void *)((const char *)req + f->offset);
    if (id && id[0] && strlen(id) < sizeof r->own_id) snprintf(r->own_id, sizeof r->own_id, "%s", id);
}

/* Sleeps about ms milliseconds, returning early (1) when the cancel flag rises. */
static int nap(const volatile sig_atomic_t *cancel_flag, int ms)
{
    for (int t = 0; t < ms; t += 10) {
        if (cancel_flag && *cancel_flag) return 1;
        gpr_sleep_until(gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(10, GPR_TIMESPAN)));
    }
    return 0;
}

static int drop_msg(void *ctx, ProtobufCMessage **m)
{
    (void)ctx, (void)m;
    return 0;
}

/* A journaling server cannot tell a cancelled call from a lost connection, whose request it
 * keeps running for --journal-detach-grace: the request is cancelled by its token too (Cancel,
 * 5 s at most; its answer does not matter: the request may have ended). */
static void cancel_by_token(struct client *c, const char *token)
{
    Shardlm__V1__CancelRequest req = SHARDLM__V1__CANCEL_REQUEST__INIT;
    req.request_id = (char *)token;
    (void)client_call_run(c, SERVICE "Cancel", &req.base, &shardlm__v1__cancel_response__descriptor,
                          5.0, NULL, 0, 0, drop_msg, NULL, NULL);
}

enum status client_call_run(struct client *c, const char *method, const ProtobufCMessage *req,
                            const ProtobufCMessageDescriptor *resp_desc, double timeout_s,
                            const volatile sig_atomic_t *cancel_flag, int streaming, int n_samples,
                            client_msg_fn on_msg, void *ctx, int *grpc_code)
{
    struct resume *r = NULL;
    if (n_samples > 0 && n_samples <= MAX_SAMPLES && c->resume_for_s > 0 &&
        resp_desc == &shardlm__v1__generate_response__descriptor && (r = calloc(1, sizeof *r))) {
        r->n_samples = n_samples;
        resume_own_id(r, req);
    }
    int n_msgs = 0, bad_message = 0, cb_cancelled = 0, code = GRPC_STATUS_UNKNOWN;
    enum status st = STATUS_OK;
    gpr_timespec give_up = gpr_inf_future(GPR_CLOCK_MONOTONIC);
    int reattach = 0; /* this attempt carries the token (else: the request as new) */
    int attempt = 0;  /* the calls made again so far: over several replicas, each on the next */
    int misses = 0;   /* NOT_FOUND in a row to reattaches: every replica's means nowhere */
    for (;;) {
        struct client_call k;
        n_msgs = 0;
        grpc_channel *ch = attempt == 0 || c->n_replicas == 0 ? c->channel : c->replicas[(attempt - 1) % c->n_replicas];
        st = call_start(c, ch, method, timeout_s, cancel_flag, &k);
        if (st != STATUS_OK) {
            code = GRPC_STATUS_INTERNAL;
            break;
        }
        /* A call made again carries the token and, streaming, what the caller has. */
        char from[MAX_SAMPLES * 12];
        grpc_metadata md[2];
        memset(md, 0, sizeof md); /* (gcc 12 -O3 takes the unused ones for uninitialised) */
        size_t n_md = 0;
        if (reattach) {
            md[n_md].key = grpc_slice_from_static_string("shardlm-resume-token");
            md[n_md++].value = grpc_slice_from_copied_string(r->token);
            resume_from(r, from, sizeof from);
            if (streaming && from[0]) {
                md[n_md].key = grpc_slice_from_static_string("shardlm-resume-from");
                md[n_md++].value = grpc_slice_from_copied_string(from);
            }
        }
        grpc_metadata_array initial;
        grpc_metadata_array_init(&initial);
        int written = 0;
        const int sent = call_send(&k, req, md, n_md, &initial, &written);
        for (size_t i = 0; i < n_md; i++) grpc_slice_unref(md[i].value);
        if (sent) {
            if (r && !reattach && (!r->token[0] || r->guessed)) {
                r->token[0] = 0;
                r->guessed = 0;
                resume_token_from(r, &initial);
            }
            ProtobufCMessage *m;
            while (call_recv(&k, resp_desc, &m, &bad_message)) {
                n_msgs++;
                if (r && streaming) resume_count(r, m);
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
        /* Made again only for UNAVAILABLE from a journaling server (a token), or ABORTED for a
         * call made again (the server still sees our earlier call reading the request: its
         * dropped connection not noticed yet), while the caller wants it and within
         * resume_for_s of the first failure. */
        int again = code == GRPC_STATUS_UNAVAILABLE || (reattach && code == GRPC_STATUS_ABORTED);
        /* Cut after the request went out but before the server named a token: if it journaled
         * the call, it did so under the request's own id (tried next); a reattach by that guess
         * that finds nothing means the server never journaled it, and the request goes again
         * as new. (Never sent, as to a server that is not up: no guess, the error at once.) */
        if (r && !reattach && written && !r->token[0] && r->own_id[0] && code == GRPC_STATUS_UNAVAILABLE &&
            n_msgs == 0) {
            snprintf(r->token, sizeof r->token, "%s", r->own_id);
            r->guessed = 1;
        }
        /* NOT_FOUND to a reattach over several replicas: not on that one; from each in a row:
         * not anywhere. */
        const int not_found = r && reattach && code == GRPC_STATUS_NOT_FOUND && n_msgs == 0;
        misses = not_found ? misses + 1 : 0;
        const int elsewhere = not_found && misses < c->n_replicas;
        const int as_new = not_found && r->guessed && !elsewhere;
        if (r && reattach && r->guessed && code == GRPC_STATUS_INVALID_ARGUMENT && n_msgs == 0) {
            /* A server without a journal refused the token: what failed is the first call. */
            code = GRPC_STATUS_UNAVAILABLE;
            st = status_errorf(STATUS_UNAVAILABLE, "%s: the connection to the server was lost", method);
            break;
        }
        again |= as_new | elsewhere;
        const int cancelled = cb_cancelled || (cancel_flag && *cancel_flag) || code == GRPC_STATUS_CANCELLED;
        if (cancelled && r && r->token[0]) cancel_by_token(c, r->token);
        if (!r || !r->token[0] || !again || cancelled || bad_message) break;
        reattach = !as_new;
        attempt++;
        if (n_msgs > 0 || gpr_time_cmp(give_up, gpr_inf_future(GPR_CLOCK_MONOTONIC)) == 0) /* from the last news */
            give_up = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_micros((int64_t)(c->resume_for_s * 1e6), GPR_TIMESPAN));
        if (gpr_time_cmp(gpr_now(GPR_CLOCK_MONOTONIC), give_up) > 0 || nap(cancel_flag, 100)) break;
    }
    free(r);
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
    for (struct client_call *k = c->active; k; k = k->next) {
        /* grpc_call_cancel is thread-safe; cancel_sent is left to the owning thread. */
        grpc_call_cancel(k->call, NULL);
    }
    pthread_mutex_unlock(&c->mu);
}

