/* server/embed.c - embeddings as both fronts serve them: the checks they share (the model, the
 * count of inputs, empty texts), tokenization (the tokenizer's special tokens: an encoder's
 * [CLS] ... [SEP], a decoder's BOS), the metrics, and gRPC Embed's call, whose request the engine
 * runs without holding up the completion-queue loop (engine_embed_submit: its passes are shared
 * with the other fronts' concurrent requests).
 *
 * Embed's ownership: the loop thread parses the request and pins the model; the inputs are
 * tokenized on the loader's work thread (up to 2,048 inputs in a 4 MiB message: seconds of work
 * that must not stall every stream; loader.c, the job keeps the call), and back on the loop
 * (rpc_submit) the struct embed_rpc goes to the engine, the call keeping it (call.embed_rpc;
 * call_maybe_free waits for it); the engine thread's done callback only puts it on s->embed_done
 * and wakes the loop, which answers the call there (embed_rpc_drain). A client cancel or a
 * deadline while it is tokenized skips or drops it; later it cancels the engine request (call.c,
 * engine_embed_cancel), whose done still comes.
 * Not here: the HTTP front's JSON (http_embeddings.c), protobuf (convert_embed.c), the passes
 * (engine/serving/conductor_embed.c).
 * Tests: tests/server/test_embeddings.py (Embed against /v1/embeddings and the float64
 * reference, concurrent requests, metrics, bad input). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"
#include "tokenizer.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

/* Appends one input of n ids. */
static enum status push_input(struct embed_inputs *in, const int32_t *ids, int n)
{
    const size_t have = (size_t)in->offsets[in->n];
    if (have + (size_t)n > in->cap) {
        size_t cap = in->cap ? in->cap : 1024;
        while (cap < have + (size_t)n) cap *= 2;
        int32_t *p = realloc(in->ids, cap * sizeof *p);
        if (!p) return oom();
        in->ids = p;
        in->cap = cap;
    }
    if (n > 0) memcpy(in->ids + have, ids, (size_t)n * sizeof *ids);
    in->offsets[in->n + 1] = (int32_t)(have + (size_t)n);
    in->n++;
    return STATUS_OK;
}

enum status embed_prepare(const struct served_model *m, const struct embed_request *r, struct embed_inputs *in)
{
    memset(in, 0, sizeof *in);
    if (r->model && r->model[0] && strcmp(r->model, m->model_id))
        return status_errorf(STATUS_NOT_FOUND, "The model '%.128s' does not exist (this server embeds with '%s'; "
                             "adapters do not embed)", r->model, m->model_id);
    if (r->n_items == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "the input is an empty list");
    if (r->n_items > EMBED_MAX_INPUTS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "the input has %d items, more than %d", r->n_items,
                             EMBED_MAX_INPUTS);
    if (!(in->offsets = calloc((size_t)r->n_items + 1, sizeof *in->offsets))) return oom();
    enum status st = STATUS_OK;
    for (int i = 0; i < r->n_items && st == STATUS_OK; i++) {
        const struct embed_item *it = &r->items[i];
        if (!it->text) {
            st = push_input(in, it->ids, it->n_ids); /* an empty one: the engine names it */
            continue;
        }
        if (it->text_len == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d] is an empty string", i);
        int32_t *ids = NULL;
        int n = 0;
        st = tokenizer_encode(m->tok, it->text, it->text_len, 1, &ids, &n);
        if (st == STATUS_OK) st = push_input(in, ids, n);
        free(ids);
    }
    return st;
}

void embed_inputs_free(struct embed_inputs *in)
{
    free(in->ids);
    free(in->offsets);
    memset(in, 0, sizeof *in);
}

/* The (in->n, d) vectors' memory. */
static enum status alloc_vecs(const struct served_model *m, const struct embed_inputs *in, float **vecs)
{
    struct engine_model_info info;
    engine_get_model_info(m->engine, &info);
    *vecs = malloc((size_t)in->n * (size_t)info.d_model * sizeof **vecs);
    return *vecs ? STATUS_OK : oom();
}

enum status embed_run(const struct served_model *m, const struct embed_request *r, struct embed_inputs *in,
                      float **vecs)
{
    *vecs = NULL;
    enum status st = embed_prepare(m, r, in);
    if (st == STATUS_OK) st = alloc_vecs(m, in, vecs);
    if (st == STATUS_OK) st = engine_embed(m->engine, in->ids, in->offsets, in->n, r->pooling, r->normalize, *vecs);
    return st;
}

void embed_observe(struct server *s, enum metrics_api api, enum status st, const struct embed_inputs *in)
{
    metrics_observe_embed(s->metrics, api, server_grpc_code_name(server_grpc_code(st)), in->n,
                          in->offsets ? in->offsets[in->n] : 0);
}

/* ---- gRPC Embed ---------------------------------------------------------------------------- */

/* One Embed call's request, from embed_rpc_start until embed_rpc_drain answers it. */
struct embed_rpc {
    struct embed_rpc *next;       /* on s->embed_done */
    struct server    *s;
    struct call      *call;       /* borrowed; kept alive by call.embed_rpc */
    struct embed_request r;       /* the parsed request, until rpc_submit */
    struct embed_inputs in;
    float            *vecs;       /* (in.n, d_model) */
    struct engine_embed_req req;  /* what the engine borrows until done */
    enum status       st;         /* set by done */
    char              message[512];
};

static void rpc_free(struct embed_rpc *rpc)
{
    if (!rpc) return;
    embed_request_free(&rpc->r);
    embed_inputs_free(&rpc->in);
    free(rpc->vecs);
    free(rpc);
}

/* The engine thread (engine_embed_req.done): hands the ended request to the loop. */
static void rpc_done(void *ctx, enum status st, const char *message)
{
    struct embed_rpc *rpc = ctx;
    struct server *s = rpc->s; /* rpc may be answered and freed once it is on the list */
    rpc->st = st;
    snprintf(rpc->message, sizeof rpc->message, "%s", message);
    pthread_mutex_lock(&s->ev_mu);
    rpc->next = s->embed_done;
    s->embed_done = rpc;
    pthread_mutex_unlock(&s->ev_mu);
    server_wake(s);
}

/* The loader's work thread: the inputs tokenized and the vectors' room. */
static enum status rpc_prepare(struct load_job *j)
{
    struct embed_rpc *rpc = j->ctx;
    enum status st = embed_prepare(j->call->m, &rpc->r, &rpc->in);
    if (st == STATUS_OK) st = alloc_vecs(j->call->m, &rpc->in, &rpc->vecs);
    return st;
}

/* The loop, after rpc_prepare (j->st CANCELLED when the call ended meanwhile: loader_drain): to
 * the engine, or the error. */
static void rpc_submit(struct load_job *j)
{
    struct embed_rpc *rpc = j->ctx;
    struct call *c = j->call;
    struct server *s = c->s;
    enum status st = j->st;
    const char *message = j->message;
    if (st == STATUS_OK) {
        rpc->s = s;
        rpc->call = c;
        rpc->req = (struct engine_embed_req){.tokens = rpc->in.ids, .offsets = rpc->in.offsets, .n_inputs = rpc->in.n,
                                             .pooling = rpc->r.pooling, .normalize = rpc->r.normalize,
                                             .out = rpc->vecs, .done = rpc_done, .ctx = rpc};
        c->embed_rpc = rpc;
        if ((st = engine_embed_submit(c->m->engine, &rpc->req)) == STATUS_OK) return; /* answered by embed_rpc_drain */
        c->embed_rpc = NULL;
        message = status_message();
    }
    embed_observe(s, METRICS_API_GRPC, st, &rpc->in);
    call_fail_status(c, st, message);
    rpc_free(rpc);
}

void embed_rpc_start(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    struct embed_rpc *rpc = calloc(1, sizeof *rpc);
    enum status st = rpc ? convert_embed_request(data, len, &rpc->r) : oom();
    if (st == STATUS_OK && (st = call_pin_model(c, rpc->r.model, data, len)) == STATUS_OK && !c->m) {
        rpc_free(rpc); /* its model is loading: call_dispatch brings the request back */
        return;
    }
    if (st == STATUS_OK && (st = loader_submit_work(c, LANE_WORK, 0, rpc_prepare, rpc_submit, rpc, NULL, 0)) == STATUS_OK)
        return; /* goes on in rpc_submit */
    const char *message = status_message();
    embed_observe(s, METRICS_API_GRPC, st, rpc ? &rpc->in : &(struct embed_inputs){0});
    call_fail_status(c, st, message);
    rpc_free(rpc);
}

void embed_rpc_drain(struct server *s)
{
    pthread_mutex_lock(&s->ev_mu);
    struct embed_rpc *done = s->embed_done;
    s->embed_done = NULL;
    pthread_mutex_unlock(&s->ev_mu);
    while (done) {
        struct embed_rpc *rpc = done;
        done = rpc->next;
        struct call *c = rpc->call;
        c->embed_rpc = NULL;
        enum status st = rpc->st;
        uint8_t *out = NULL;
        size_t out_len = 0;
        if (st == STATUS_OK) {
            struct engine_model_info info;
            engine_get_model_info(c->m->engine, &info);
            st = convert_embed_response(rpc->vecs, rpc->in.n, info.d_model, c->m->model_id,
                                        rpc->in.offsets[rpc->in.n], &out, &out_len);
            if (st != STATUS_OK) snprintf(rpc->message, sizeof rpc->message, "%s", status_message());
        }
        embed_observe(s, METRICS_API_GRPC, st, &rpc->in);
        if (st == STATUS_OK) call_reply(c, out, out_len); /* takes out */
        else call_fail_status(c, st, rpc->message);
        rpc_free(rpc);
        call_maybe_free(c);
    }
}

void embed_rpc_cancel(struct call *c)
{
    engine_embed_cancel(c->m->engine, &c->embed_rpc->req);
}
