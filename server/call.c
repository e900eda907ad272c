/* server/call.c - the life of one gRPC call (struct call), an explicit state machine driven by
 * the completion-queue loop in server.c:
 *
 *   accepted (call_on_new) -> RECV_CLOSE_ON_SERVER started at once (it completes when the call
 *   ends for any reason: status sent, client cancel, disconnect, deadline) -> checks (API key,
 *   phase) -> RECV_MESSAGE (call_on_recv) -> the method's handler:
 *     unary methods:        one batch {initial metadata, message, status} (methods.c);
 *     Generate / Chat:      submitted to the engine; the response is sent when every sample
 *                           has finished (generation.c);
 *     GenerateStream / ChatStream: one SEND_MESSAGE in flight at a time; tokens that arrive
 *                           meanwhile are coalesced into the next message; status last;
 *     Health.Watch:         a message whenever the serving status changes (health.c);
 *     reflection:           receive, answer, receive ... until the client half-closes.
 *   -> freed (call_maybe_free) when the close has completed, no batch is in flight, the
 *   engine holds no sample of it (the engine calls back until the FINISHED event of every
 *   sample), no adapter load of it is out (LoadAdapter runs on the loader thread: loader.c) and
 *   no Embed request of it is in the engine (embed.c).
 *
 * Not here: what the methods answer (generation.c, methods.c, health.c), the loop (server.c).
 * Tests: tests/server/test_server.py. */
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "server_internal.h"

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
    {"/shardlm.v1.TextGeneration/LoadAdapter", METHOD_LOAD_ADAPTER},
    {"/shardlm.v1.TextGeneration/UnloadAdapter", METHOD_UNLOAD_ADAPTER},
    {"/shardlm.v1.TextGeneration/Embed", METHOD_EMBED},
    {"/grpc.health.v1.Health/Check", METHOD_HEALTH_CHECK},
    {"/grpc.health.v1.Health/Watch", METHOD_HEALTH_WATCH},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", METHOD_REFLECTION},
};

const char *call_method_name(enum method m)
{
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].method == m) return strrchr(METHODS[i].path, '/') + 1;
    return "unknown";
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
void call_send(struct call *c, uint8_t *msg, size_t len, int with_status, grpc_status_code code,
                      const char *details)
{
    CHECK(!c->send_inflight && !c->status_sent, "overlapping sends on one call");
    grpc_op ops[3];
    int n = 0;
    memset(ops, 0, sizeof ops);
    if (!c->initial_md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        if ((c->journaled || c->job) && c->request_id) { /* the resume token (grpc_resume.c) */
            c->resume_md.key = grpc_slice_from_static_string("shardlm-resume-token");
            c->resume_md.value = grpc_slice_from_copied_string(c->request_id);
            c->has_resume_md = 1;
            ops[n].data.send_initial_metadata.count = 1;
            ops[n].data.send_initial_metadata.metadata = &c->resume_md;
        }
        n++;
        c->initial_md_sent = 1;
    }
    if (msg) {
        c->send_buf = bytes_to_buffer(msg, len);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->send_buf;
    }
    if (with_status) {
        /* The answer is formed: the model's pin goes before it is sent, so that the client's
         * next call never finds the model still pinned by this one (--models-max). Not while
         * the engine, a load or an embedding still runs for the call, nor for a resumed job. */
        if (c->m && !c->m_released && c->engine_active == 0 && !c->load_job && !c->embed_rpc && !c->job) {
            c->m_released = 1;
            server_release(c->s, c->m);
        }
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
    c->t_send = base_now_s();
}

/* Ends the call with a status and no message. */
void call_fail(struct call *c, grpc_status_code code, const char *details)
{
    if (c->close_done || c->status_sent || c->send_has_status) return;
    LOG_DEBUG("server", "req=%s method=%s -> %s: %s", c->request_id ? c->request_id : "-", call_method_name(c->method),
              server_grpc_code_name(code), details);
    call_send(c, NULL, 0, 1, code, details);
}

void call_fail_status(struct call *c, enum status st, const char *message)
{
    call_fail(c, server_grpc_code(st), message);
}

/* Ends a unary call with its one response message. */
void call_reply(struct call *c, uint8_t *msg, size_t len)
{
    if (c->close_done) {
        free(msg);
        return;
    }
    call_send(c, msg, len, 1, GRPC_STATUS_OK, NULL);
}

void call_recv(struct call *c)
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

static void call_log(struct call *c)
{
    if (!is_generation(c->method)) {
        LOG_DEBUG("server", "method=%s status=%s", call_method_name(c->method), server_grpc_code_name(c->final_code));
        return;
    }
    int completion = 0;
    for (int i = 0; i < c->n_samples; i++) completion += c->samples[i].completion_tokens;
    double now = base_now_s();
    const char *status = c->status_sent ? server_grpc_code_name(c->final_code) : c->client_cancelled ? "CLIENT_CANCELLED" : "-";
    metrics_observe_request(c->s->metrics, METRICS_API_GRPC,
                            c->status_sent ? server_grpc_code_name(c->final_code) : "CANCELLED",
                            c->t_first_token > 0 ? c->t_first_token - c->t_start : -1.0, now - c->t_start, c->queue_s);
    if (c->t_first_token > 0)
        LOG_INFO("server", "req=%s method=%s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f total_ms=%.1f",
                 c->request_id ? c->request_id : "-", call_method_name(c->method), status, c->n_prompt_tokens, completion,
                 (c->t_first_token - c->t_start) * 1e3, (now - c->t_start) * 1e3);
    else
        LOG_INFO("server", "req=%s method=%s status=%s prompt_tokens=%d completion_tokens=%d ttft_ms=- total_ms=%.1f",
                 c->request_id ? c->request_id : "-", call_method_name(c->method), status, c->n_prompt_tokens, completion,
                 (now - c->t_start) * 1e3);
}

/* Frees the call once nothing can refer to it any more. */
void call_maybe_free(struct call *c)
{
    if (!c->close_done || c->send_inflight || c->recv_inflight || c->engine_active > 0 || c->load_job || c->embed_rpc)
        return;
    struct server *s = c->s;
    call_log(c);
    if (c->prev) c->prev->next = c->next;
    else s->calls = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n_calls--;
    if (uses_engine(c->method)) s->n_gen_calls--;
    grpc_call_unref(c->call);
    if (c->recv_buf) grpc_byte_buffer_destroy(c->recv_buf);
    if (c->has_resume_md) grpc_slice_unref(c->resume_md.value);
    gen_call_release(c);
    if (!c->m_released) server_release(s, c->m);
    free(c);
}

/* ---- call events --------------------------------------------------------------------------- */

void call_on_recv(struct call *c, int ok)
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
    call_dispatch(c, data, len);
    grpc_slice_unref(sl);
    call_maybe_free(c);
}

void call_dispatch(struct call *c, const uint8_t *data, size_t len)
{
    switch (c->method) {
    case METHOD_GENERATE:
    case METHOD_GENERATE_STREAM:
    case METHOD_CHAT:
    case METHOD_CHAT_STREAM: gen_start(c, data, len); break;
    case METHOD_HEALTH_CHECK:
    case METHOD_HEALTH_WATCH: health_handle(c, data, len); break;
    default: methods_handle(c, data, len); break;
    }
}

enum status call_pin_model(struct call *c, const char *name, const uint8_t *data, size_t len)
{
    CHECK(!c->m, "call_pin_model: the call pins a model already");
    enum status st = server_acquire(c->s, name, 0, &c->m);
    if (st != STATUS_OK || c->m) return st;
    return loader_submit_model(c, name, data, len); /* the loop does not wait for a load */
}

void call_on_send(struct call *c, int ok)
{
    c->send_inflight = 0;
    if (c->send_buf) grpc_byte_buffer_destroy(c->send_buf);
    c->send_buf = NULL;
    if (c->has_status_slice) grpc_slice_unref(c->status_slice);
    c->has_status_slice = 0;
    if (c->send_has_status) c->status_sent = 1;
    if (ok && !c->status_sent && !c->close_done) {
        if (is_generation(c->method)) gen_pump(c);
        else if (c->method == METHOD_HEALTH_WATCH) health_watch_pump(c);
        else if (c->method == METHOD_REFLECTION) call_recv(c);
    }
    call_maybe_free(c);
}

void call_on_close(struct call *c)
{
    c->close_done = 1;
    if (c->load_job) atomic_store(&c->load_job->abandoned, 1); /* not started yet: skipped */
    if (c->embed_rpc) embed_rpc_cancel(c); /* its answer still comes back (embed.c) */
    if (c->job) c->engine_active = 0; /* the journaled request runs on; gen_call_release detaches */
    if (c->client_cancelled && !c->status_sent && c->engine_active > 0) {
        LOG_INFO("server", "req=%s: the client cancelled or went away; cancelling the request", c->request_id);
        engine_cancel(c->m->engine, c->handle);
    }
    if (is_generation(c->method)) gen_pump(c); /* drops buffered output */
    call_maybe_free(c);
}


void call_on_new(struct request_slot *slot, int ok)
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
    c->queue_s = -1.0;
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
    if (uses_engine(c->method)) s->n_gen_calls++;
    int key = -1;
    int authed = c->method == METHOD_HEALTH_CHECK || c->method == METHOD_HEALTH_WATCH || auth_authorized(s, &slot->md, &key);
    auth_owner(s, key, c->owner, sizeof c->owner);
    if (is_generation(c->method)) { /* the client the fair policy shares turns between */
        char name[32];
        char *peer = key >= 0 ? NULL : grpc_call_get_peer(c->call);
        if (key >= 0) auth_client_name(key, name, sizeof name);
        c->client = strdup(peer ? peer : name);
        gpr_free(peer);
        CHECK(c->client, "out of memory");
    }
    if (is_generation(c->method)) /* reattaching to a journaled request (grpc_resume.c) */
        for (size_t i = 0; i < slot->md.count; i++) {
            const grpc_metadata *md = &slot->md.metadata[i];
            char **to = grpc_slice_str_cmp(md->key, "shardlm-resume-token") == 0  ? &c->resume_token
                        : grpc_slice_str_cmp(md->key, "shardlm-resume-from") == 0 ? &c->resume_from
                                                                                  : NULL;
            if (!to || *to) continue;
            char *v = grpc_slice_to_c_string(md->value);
            CHECK(v && (*to = strdup(v)), "out of memory");
            gpr_free(v);
        }
    char unknown[300];
    snprintf(unknown, sizeof unknown, "unknown method %.*s", (int)(path_len < 200 ? path_len : 200), path);
    grpc_call_details_destroy(&slot->details);
    grpc_metadata_array_destroy(&slot->md);
    if (!s->shutdown_started) call_slot_arm(slot);

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

void call_slot_arm(struct request_slot *slot)
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
