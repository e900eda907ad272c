/* server/methods.c - the methods that need no engine events: Tokenize, Detokenize, Cancel,
 * GetModelInfo, GetServerStats, LoadAdapter, UnloadAdapter (unary: one answer, then the
 * status), and each message of a reflection stream; Embed is handed to embed.c. All but Cancel
 * and reflection are about one served model, which their `model` field names (the first when
 * unset): pinned in c->m for the call's life.
 * Not here: Generate / Chat (generation.c), health (health.c), protobuf (convert.c), the
 * descriptor index (reflection.c), LoadAdapter's load (loader.c: off this thread).
 * Tests: tests/server/test_server.py (basic, cancel, invalid, reflection),
 * tests/server/test_lora_serving.py (LoadAdapter, UnloadAdapter). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "http_internal.h"
#include "reflection.h"
#include "server_internal.h"
#include "tokenizer.h"

/* One function per unary method: parse data[0..len) (borrowed), answer into *out (malloc'd,
 * *out_len bytes), or return the error the call ends with. */

static enum status tokenize(const struct served_model *m, const uint8_t *data, size_t len, uint8_t **out,
                            size_t *out_len)
{
    char *text;
    size_t text_len;
    int add_bos;
    int32_t *ids = NULL;
    int n = 0;
    enum status st = convert_tokenize_request(data, len, &text, &text_len, &add_bos);
    if (st == STATUS_OK) st = tokenizer_encode(m->tok, text, text_len, add_bos, &ids, &n);
    if (st == STATUS_OK) st = convert_tokenize_response(ids, n, m->tok, out, out_len);
    free(text);
    free(ids);
    return st;
}

static enum status detokenize(const struct served_model *m, const uint8_t *data, size_t len, uint8_t **out,
                              size_t *out_len)
{
    int32_t *ids;
    int n;
    char *text = NULL;
    size_t text_len;
    enum status st = convert_detokenize_request(data, len, m->vocab_size, &ids, &n);
    if (st == STATUS_OK) st = tokenizer_decode(m->tok, ids, n, &text, &text_len);
    if (st == STATUS_OK) st = convert_detokenize_response(text, text_len, out, out_len);
    free(ids);
    free(text);
    return st;
}

/* The two on the loader's work thread (loader_submit_work). */
static enum status tokenize_job(struct load_job *j)
{
    return tokenize(j->call->m, j->request, j->request_len, &j->out, &j->out_len);
}

static enum status detokenize_job(struct load_job *j)
{
    return detokenize(j->call->m, j->request, j->request_len, &j->out, &j->out_len);
}

/* Cancel: only the caller's own requests (the same API key's, any call without keys); another
 * key's request id is answered as one that does not exist. */
static enum status cancel(struct call *c, const uint8_t *data, size_t len, uint8_t **out, size_t *out_len)
{
    struct server *s = c->s;
    char *id;
    enum status st = convert_cancel_request(data, len, &id);
    if (st == STATUS_OK) {
        struct call *target = gen_find_call(s, id);
        int cancelled = 0;
        if (target && strcmp(target->owner, c->owner)) target = NULL;
        if (target && !target->submitted) { /* accepted, its ACCEPT being synced: gen_run ends it instead of submitting it */
            target->cancelled_by_rpc = 1;
            LOG_INFO("server", "req=%s cancelled by Cancel (before it reached the engine)", id);
            st = convert_cancel_response(1, out, out_len);
        } else if (!target) { /* a resumed request with no client attached (grpc_resume.c) */
            st = grpc_resume_cancel_key(s, id, c->owner, &cancelled);
            if (st == STATUS_OK) st = convert_cancel_response(cancelled, out, out_len);
        } else {
            target->cancelled_by_rpc = 1;
            if (target->job) grpc_resume_cancel(target);
            else engine_cancel(target->m->engine, target->handle);
            LOG_INFO("server", "req=%s cancelled by Cancel", id);
            st = convert_cancel_response(1, out, out_len);
        }
    }
    free(id);
    return st;
}

/* The loaded adapters' names, copied out of the engine's lock. */
/* m's information for the call's key (the adapters it may use: http_finetune_hidden). */
static enum status model_info(struct call *c, struct served_model *m, uint8_t **out, size_t *out_len)
{
    struct http_adapter_snapshot an;
    http_adapter_snapshot(c->s, m, c->owner, &an);
    struct model_info_out mi = {.chat_template = m->tmpl_name,
                                .max_logprobs = m->eopts.max_logprobs ? m->eopts.max_logprobs : 20,
                                .adapters = an.ptrs, .n_adapters = an.n, .model_id = m->model_id,
                                .default_adapter = m->default_adapter ? m->default_adapter : ""};
    if (mi.max_logprobs > CONVERT_MAX_LOGPROBS) mi.max_logprobs = CONVERT_MAX_LOGPROBS;
    engine_get_model_info(m->engine, &mi.info);
    return convert_model_info_response(&mi, out, out_len);
}

/* Admin operations: any valid API key may call them (call.c checks the key as for every method).
 * LoadAdapter is parsed here and loaded on the loader thread (loader.c), which answers the call:
 * reading the adapter's files never holds up the loop. Returns STATUS_OK when the load is
 * queued (no answer here). */
static enum status load_adapter(struct call *c, const uint8_t *data, size_t len)
{
    char *name, *path;
    enum status st = convert_load_adapter_request(data, len, &name, &path);
    if (st == STATUS_OK) {
        loader_submit(c, name, path); /* takes name and path */
        return STATUS_OK;
    }
    free(name);
    free(path);
    return st;
}

static enum status unload_adapter(const struct call *c, const struct served_model *m, const uint8_t *data, size_t len,
                                  uint8_t **out, size_t *out_len)
{
    char *name;
    enum status st = convert_unload_adapter_request(data, len, &name);
    /* Another key's fine-tune is, to this key, an adapter that is not loaded (engine_unload_adapter's
     * answer, word for word): it may neither see nor unload it. */
    if (st == STATUS_OK && http_finetune_hidden(c->s, name, c->owner))
        st = status_errorf(STATUS_NOT_FOUND, "no adapter named '%.100s' is loaded", name);
    /* Requests that name no adapter run with the default: it stays as long as the server. */
    if (st == STATUS_OK && m->default_adapter && !strcmp(name, m->default_adapter))
        st = status_errorf(STATUS_FAILED_PRECONDITION,
                           "adapter '%s' is the server's default adapter (--default-adapter): requests that name "
                           "no adapter use it, so it is not unloaded",
                           name);
    if (st == STATUS_OK) st = engine_unload_adapter(m->engine, name);
    if (st == STATUS_OK) {
        LOG_INFO("server", "UnloadAdapter '%s' of model %s", name, m->model_id);
        st = convert_unload_adapter_response(out, out_len);
    }
    free(name);
    return st;
}

static enum status server_stats(const struct server *s, const struct served_model *m, uint8_t **out,
                                size_t *out_len)
{
    enum status st;
    struct server_stats_out o = {.active_calls = s->n_calls, .uptime_seconds = base_now_s() - s->t_start};
    engine_get_stats(m->engine, &o.engine);
    int n = engine_replicas(m->engine);
    struct engine_replica_stats *rs = calloc((size_t)n, sizeof *rs);
    if (!rs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory for replica statistics");
    for (int i = 0; i < n; i++) engine_get_replica_stats(m->engine, i, &rs[i]);
    o.replicas = rs;
    o.n_replicas = n;
    st = engine_get_expert_load(m->engine, &o.expert_load);
    if (st == STATUS_OK) st = convert_server_stats_response(&o, out, out_len);
    free(o.expert_load.load);
    free(rs);
    return st;
}

/* One message of a reflection stream: answer it, then call.c receives the next. */
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

/* The request `which` of the methods that name a model: its model pinned into c->m. STATUS_OK
 * with c->m NULL: the model is being loaded, and the call comes back (call_pin_model). */
static enum status pin_model(struct call *c, enum model_request which, const uint8_t *data, size_t len)
{
    char *name = NULL;
    enum status st = convert_request_model(which, data, len, &name);
    if (st == STATUS_OK) st = call_pin_model(c, name, data, len);
    free(name);
    return st;
}

/* 1 when method m's request names a model (*which: its kind), else 0. */
static int names_model(enum method m, enum model_request *which)
{
    switch (m) {
    case METHOD_TOKENIZE: *which = MODEL_REQUEST_TOKENIZE; return 1;
    case METHOD_DETOKENIZE: *which = MODEL_REQUEST_DETOKENIZE; return 1;
    case METHOD_MODEL_INFO: *which = MODEL_REQUEST_MODEL_INFO; return 1;
    case METHOD_SERVER_STATS: *which = MODEL_REQUEST_SERVER_STATS; return 1;
    case METHOD_LOAD_ADAPTER: *which = MODEL_REQUEST_LOAD_ADAPTER; return 1;
    case METHOD_UNLOAD_ADAPTER: *which = MODEL_REQUEST_UNLOAD_ADAPTER; return 1;
    default: return 0;
    }
}

void methods_handle(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    uint8_t *out = NULL;
    size_t out_len = 0;
    enum status st = STATUS_OK;
    enum model_request which;
    if (names_model(c->method, &which) && (st = pin_model(c, which, data, len)) == STATUS_OK && !c->m)
        return; /* loading its model: call_dispatch brings it back */
    if (st == STATUS_OK) switch (c->method) {
    case METHOD_TOKENIZE: /* on the loader's work thread: up to 1 MiB of text (loader.c) */
        if ((st = loader_submit_work(c, LANE_WORK, 0, tokenize_job, NULL, NULL, data, len)) == STATUS_OK) return;
        break;
    case METHOD_DETOKENIZE:
        if ((st = loader_submit_work(c, LANE_WORK, 0, detokenize_job, NULL, NULL, data, len)) == STATUS_OK) return;
        break;
    case METHOD_CANCEL: st = cancel(c, data, len, &out, &out_len); break;
    case METHOD_MODEL_INFO: st = model_info(c, c->m, &out, &out_len); break;
    case METHOD_SERVER_STATS: st = server_stats(s, c->m, &out, &out_len); break;
    case METHOD_LOAD_ADAPTER:
        if ((st = load_adapter(c, data, len)) == STATUS_OK) return; /* answered by loader.c */
        break;
    case METHOD_UNLOAD_ADAPTER: st = unload_adapter(c, c->m, data, len, &out, &out_len); break;
    case METHOD_REFLECTION: handle_reflection(c, data, len); return;
    case METHOD_EMBED: embed_rpc_start(c, data, len); return; /* embed.c */
    default: st = status_errorf(STATUS_INTERNAL, "no handler for %s", call_method_name(c->method));
    }
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
    else call_reply(c, out, out_len);
}
