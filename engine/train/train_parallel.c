/* engine/train/train_parallel.c - the ranks of a training job (train_parallel.h).
 * Tests: tests/test_train_parallel.sh. */
#include "train_parallel.h"

#include "weight_names.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#define TRY(call)                                                                                  \
    do {                                                                                           \
        enum status try_st_ = (call);                                                              \
        if (try_st_ != STATUS_OK) return try_st_;                                                  \
    } while (0)


struct dp_bucket {
    struct tensor t;            /* f32: the layer's gradient range */
    struct comm_request req;
    int started;
};


enum status train_ranks_init(struct train_ranks *r, const struct train_options *o, int num_microbatches)
{
    memset(r, 0, sizeof *r);
    TRY(parallel_init(NULL, NULL, &r->world));
    r->world->timeout_s = o->rank_timeout_s;
    const int tp = o->tp > 0 ? o->tp : 1, pp = o->pp > 0 ? o->pp : 1;
    struct parallel_layout *l = &r->par.layout;
    TRY(parallel_layout(r->world, tp, pp, l));
    r->tp = l->tp_size;
    r->pp = l->pp_size;
    r->dp = l->dp_size;
    r->dp_rank = l->dp_rank;
    if (num_microbatches % r->dp)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "--global-batch-size / --micro-batch-size = %d micro-batches do not split over %d "
                             "data-parallel replicas (world %d = tp %d x pp %d x dp %d)",
                             num_microbatches, r->dp, r->world->size, tp, pp, r->dp);
    r->micro_per_replica = num_microbatches / r->dp;
    r->ep = o->ep > 0 ? o->ep : 1;
    if (r->ep > 1 && r->dp % r->ep)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--ep %d does not divide the %d data-parallel ranks (world %d = "
                             "tp %d x pp %d x dp %d; the ep groups are carved out of dp)", r->ep, r->dp,
                             r->world->size, tp, pp, r->dp);
    if (r->ep > 1 && o->lora_rank > 0)
        return status_errorf(STATUS_UNSUPPORTED, "--ep %d with LoRA is not built (the experts are frozen under "
                             "LoRA: train the adapters at dp)", r->ep);
    if (o->memory.sequence_parallel && tp == 1)
        LOG_WARN("train", "--sequence-parallel has no effect at tp 1");
    if (o->device != DEVICE_CPU && o->device != DEVICE_CUDA)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training runs on cpu or cuda");
    r->par.world = r->world;
    r->par.pp_layers = o->pp_layers;
    return STATUS_OK;
}

enum status train_ranks_connect(struct train_ranks *r, enum device dev, int threads, struct backend **b)
{
    TRY(model_ranks_open(r->world, &r->par.layout, r->par.pp_layers, dev, 0, threads, b, &r->groups, &r->par));
    if (r->ep > 1)
        TRY(parallel_groups_add_ep(r->world, &r->par.layout, r->ep, dev, dev == DEVICE_CUDA ? r->world->gpu : 0,
                                   (*b)->stream, &r->groups));
    if (r->world->size > 1 && r->world->timeout_s > 0) TRY(parallel_watch_start(r->world));
    return STATUS_OK;
}

int train_ranks_leader(const struct train_ranks *r) { return r->world->rank == 0; }

/* Norm of the gradients over the ranks of one replica: tp then pp (the replicas hold the same
 * reduced gradients), and over the ep group, whose ranks hold different experts (the dense
 * gradients counted on its rank 0 only); with the distributed optimizer over dp instead (every
 * rank its own shards). */
static double reduce_sumsq(void *ctx, double local)
{
    struct train_ranks *r = ctx;
    float v = (float)local;
    const struct tensor *t = &r->sumsq; /* on the device the groups carry */
    backend_upload(r->b, t->data, &v, sizeof v);
    enum status st = STATUS_OK;
    struct comm *groups[4] = {r->tp > 1 ? r->groups.tp : NULL, r->pp > 1 ? r->groups.pp : NULL,
                              r->dist_opt && r->dp > 1 ? r->groups.dp : NULL,
                              r->ep > 1 && !r->dist_opt ? r->groups.ep : NULL};
    for (int i = 0; i < 4 && st == STATUS_OK; i++)
        if (groups[i] && (st = comm_all_reduce(groups[i], t)) == STATUS_OK) st = comm_synchronize(groups[i]);
    if (st != STATUS_OK) {
        r->failed = st;
        return (double)NAN;
    }
    backend_download(r->b, &v, t->data, sizeof v);
    return (double)v;
}

/* One bucket per local layer: the range its gradient rows span in the gradient allocation
 * (weights_alloc_like carves the rows in table order, so a layer's rows are one run). */
static enum status make_buckets(struct train_ranks *r, struct model *m, const struct param_table *g)
{
    const int L = m->n_layers_local;
    r->buckets = calloc((size_t)(L > 0 ? L : 1), sizeof *r->buckets);
    r->rest = calloc(g->n + 1, sizeof *r->rest);
    if (!r->buckets || !r->rest) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    char **lo = calloc((size_t)(L > 0 ? L : 1), sizeof *lo), **hi = calloc((size_t)(L > 0 ? L : 1), sizeof *hi);
    if (!lo || !hi) {
        free(lo);
        free(hi);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    }
    for (size_t i = 0; i < g->n; i++) {
        const struct tensor *t = g->p[i].t;
        const int layer = g->p[i].layer - m->layer_first;
        CHECK(t->dtype == DTYPE_F32, "f32 gradients expected");
        if (g->p[i].kind < 0 || g->p[i].layer < 0 || layer >= L) {
            r->rest[r->n_rest++] = *t;
            continue;
        }
        char *a = t->data, *e = a + tensor_nbytes(t);
        if (!lo[layer] || a < lo[layer]) lo[layer] = a;
        if (!hi[layer] || e > hi[layer]) hi[layer] = e;
    }
    for (int l = 0; l < L; l++) {
        const int64_t n = lo[l] ? (int64_t)((hi[l] - lo[l]) / (ptrdiff_t)sizeof(float)) : 0;
        r->buckets[l].t = tensor_make(lo[l], DTYPE_F32, m->b->device, 1, n);
    }
    /* The ranges must not overlap (they would if the rows were not carved layer by layer). */
    for (int l = 0; l + 1 < L; l++)
        CHECK(!lo[l] || !lo[l + 1] || hi[l] <= lo[l + 1] || hi[l + 1] <= lo[l], "gradient buckets overlap");
    r->n_buckets = L;
    free(lo);
    free(hi);
    return STATUS_OK;
}

enum status train_ranks_attach(struct train_ranks *r, struct model_train *mt, struct param_table *gparams,
                               struct optimizer *opt)
{
    struct model *m = model_train_model(mt);
    r->b = m->b;
    TRY(backend_alloc_tensor(m->b, &r->sumsq, DTYPE_F32, 1, (int64_t[]){1}));
    int embedding_trained = 0; /* (a LoRA run trains its adapters only) */
    for (size_t i = 0; i < gparams->n; i++) {
        struct param *p = &gparams->p[i];
        if (p->kind < 0) continue;
        const enum weight_kind k = (enum weight_kind)p->kind;
        embedding_trained |= k == WEIGHT_KIND_TOK_EMBEDDING || k == WEIGHT_KIND_LM_HEAD;
        /* Whole on every tp rank: the Megatron files' replicated kinds, less those the ranks split
         * at load all the same (a mixture's experts, whole experts per rank; GPT-OSS's sinks, by
         * heads), whose norms each rank counts for its own part. */
        const int replicated = weight_names_of(k)->megatron_layout == WEIGHT_MEGATRON_REPLICATED &&
                               !weight_kind_per_expert(k) && k != WEIGHT_KIND_SINKS;
        if (r->tp > 1 && replicated && m->tp_rank != 0) p->counted = 0;
        /* Under expert parallelism the ep ranks hold the same dense gradients (counted on ep rank 0)
         * and different experts; with the distributed optimizer every rank counts its own shards of
         * both instead (dp covers every ep rank and every shard of the experts' dp group). */
        if (r->ep > 1 && !r->dist_opt && !weight_kind_per_expert(k) && m->ep_rank != 0) p->counted = 0;
        if (r->pp > 1 && m->cfg.tied_embeddings && k == WEIGHT_KIND_LM_HEAD) p->counted = 0; /* the first stage's */
        if (model_train_grad_partial(mt, k)) p->tp_partial = 1;
    }
    if (r->dp > 1 && !r->dist_opt && r->ep == 1) TRY(make_buckets(r, m, gparams));
    if (r->tp > 1 || r->pp > 1 || (r->dist_opt && r->dp > 1) || r->ep > 1) {
        opt->reduce_sumsq = reduce_sumsq;
        opt->reduce_ctx = r;
    }
    /* Tied embeddings split over stages: the first holds the lookup table, the last a copy as its
     * LM head (model_load.c); their gradients are summed on both, so the copies stay equal. */
    if (r->pp > 1 && m->cfg.tied_embeddings && embedding_trained && (m->pp_rank == 0 || model_is_last_stage(m))) {
        const struct tensor *e = m->pp_rank == 0 ? &m->w.tok_embedding : &m->w.lm_head;
        TRY(backend_alloc(m->b, (size_t)tensor_numel(e) * sizeof(float), &r->tied_mem));
        r->tied_tmp = tensor_make(r->tied_mem, DTYPE_F32, m->b->device, 2, e->shape[0], e->shape[1]);
    }
    return STATUS_OK;
}


void train_ranks_free(struct train_ranks *r)
{
    if (r->world) parallel_watch_stop(r->world);
    free(r->buckets);
    free(r->rest);
    if (r->b) {
        backend_free(r->b, r->tied_mem);
        backend_free(r->b, r->sumsq.data);
    }
    parallel_groups_free(&r->groups);
    parallel_finalize(r->world);
    memset(r, 0, sizeof *r);
}

/* ---- the pipeline schedule ---------------------------------------------------------------- */

static int first_stage(const struct model *m) { return m->pp_rank == 0; }

/* The point-to-point steps of 1F1B between neighbouring stages (Megatron's p2p_communication):
 * every send is matched by the neighbour's receive of the same micro-batch, whose size both
 * know (every rank builds every micro-batch). Combined steps post both directions at once. */
static enum status recv_forward(struct model_train *mt, const struct train_batch *tb)
{
    struct model *m = model_train_model(mt);
    if (first_stage(m)) return STATUS_OK;
    struct tensor x = model_train_boundary(mt, tb->n_tokens);
    return comm_recv(m->par.groups->pp, &x, m->pp_rank - 1);
}

static enum status send_backward(struct model_train *mt, const struct train_batch *tb)
{
    struct model *m = model_train_model(mt);
    if (first_stage(m)) return STATUS_OK;
    struct tensor g = model_train_boundary_grad(mt, tb->n_tokens);
    return comm_send(m->par.groups->pp, &g, m->pp_rank - 1);
}

static enum status send_forward(struct model_train *mt, const struct train_batch *tb)
{
    struct model *m = model_train_model(mt);
    if (model_is_last_stage(m)) return STATUS_OK;
    struct tensor x = model_train_boundary(mt, tb->n_tokens);
    return comm_send(m->par.groups->pp, &x, m->pp_rank + 1);
}

static enum status recv_backward(struct model_train *mt, const struct train_batch *tb)
{
    struct model *m = model_train_model(mt);
    if (model_is_last_stage(m)) return STATUS_OK;
    struct tensor g = model_train_boundary_grad(mt, tb->n_tokens);
    return comm_recv(m->par.groups->pp, &g, m->pp_rank + 1);
}

/* Sends the output of the forward of fwd (set sf) and receives the gradient for the backward of
 * bwd (into the common gradient boundary) from the next stage, both at once. */
static enum status send_forward_recv_backward(struct model_train *mt, int sf, const struct train_batch *fwd,
                                              const struct train_batch *bwd)
{
    struct model *m = model_train_model(mt);
    if (model_is_last_stage(m)) return STATUS_OK;
    model_train_use_set(mt, sf);
    struct tensor x = model_train_boundary(mt, fwd->n_tokens), g = model_train_boundary_grad(mt, bwd->n_tokens);
    return comm_sendrecv(m->par.groups->pp, &x, m->pp_rank + 1, &g, m->pp_rank + 1);
}

/* Sends the input gradient of a backward to the previous stage and receives the input of the
 * forward of fwd (into set sf) from it, both at once. */
static enum status send_backward_recv_forward(struct model_train *mt, const struct train_batch *bwd, int sf,
                                              const struct train_batch *fwd)
{
    struct model *m = model_train_model(mt);
    if (first_stage(m)) return STATUS_OK;
    struct tensor g = model_train_boundary_grad(mt, bwd->n_tokens);
    model_train_use_set(mt, sf);
    struct tensor x = model_train_boundary(mt, fwd->n_tokens);
    return comm_sendrecv(m->par.groups->pp, &g, m->pp_rank - 1, &x, m->pp_rank - 1);
}

static enum status forward_step(struct model_train *mt, int set, const struct train_batch *tb, double *loss_sum)
{
    model_train_use_set(mt, set);
    double ls = 0.0;
    int nr = 0;
    TRY(model_forward_train(mt, tb, &ls, &nr));
    *loss_sum += ls;
    return STATUS_OK;
}

/* model_backward's hook on the step's last backward: the layer's gradients are final. */
static void layer_done(void *ctx, int layer)
{
    struct train_ranks *r = ctx;
    struct dp_bucket *bk = &r->buckets[layer];
    if (r->bucket_status != STATUS_OK || bk->started) return;
    bk->started = 1;
    r->bucket_status = comm_all_reduce_start(r->groups.dp, &bk->t, &bk->req);
}

/* The backward of one micro-batch; the step's last one starts each layer's dp reduction as soon
 * as that layer is done. */
static enum status backward_step(struct train_ranks *r, struct model_train *mt, int set, const struct train_batch *tb,
                                 struct model_weights *grads, int last)
{
    model_train_use_set(mt, set);
    if (last && r->buckets) model_train_set_layer_hook(mt, layer_done, r);
    enum status st = model_backward(mt, tb, grads);
    model_train_set_layer_hook(mt, NULL, NULL);
    return st != STATUS_OK ? st : r->bucket_status;
}

/* After the schedule: the buckets not started (a replica without micro-batches), the waits, and
 * the gradients outside the layers. */
static enum status finish_dp(struct train_ranks *r)
{
    for (int i = 0; i < r->n_buckets; i++) {
        struct dp_bucket *bk = &r->buckets[i];
        if (!bk->started) TRY(comm_all_reduce_start(r->groups.dp, &bk->t, &bk->req));
        bk->started = 1;
    }
    for (int i = 0; i < r->n_buckets; i++) TRY(comm_wait(r->groups.dp, &r->buckets[i].req));
    for (int i = 0; i < r->n_rest; i++) TRY(comm_all_reduce(r->groups.dp, &r->rest[i]));
    return STATUS_OK;
}

static enum status schedule(struct train_ranks *r, struct model_train *mt, const struct train_batch *tbs, int n,
                            struct model_weights *grads, double *loss_sum)
{
    struct model *m = model_train_model(mt);
    *loss_sum = 0.0;
    if (r->pp == 1) {
        for (int i = 0; i < n; i++) {
            TRY(forward_step(mt, 0, &tbs[i], loss_sum));
            TRY(backward_step(r, mt, 0, &tbs[i], grads, i == n - 1));
        }
        return STATUS_OK;
    }
    /* 1F1B: stage p runs pp - p - 1 warm-up forwards, then alternates one forward and one
     * backward, then the cool-down backwards; micro-batch i uses activation set i mod sets. */
    const int sets = model_train_n_sets(mt);
    int warmup = r->pp - m->pp_rank - 1;
    if (warmup > n) warmup = n;
    const int steady = n - warmup;
    CHECK(sets >= warmup + 1 || steady == 0, "1F1B needs %d activation sets, has %d", warmup + 1, sets);
    for (int i = 0; i < warmup; i++) {
        model_train_use_set(mt, i % sets);
        TRY(recv_forward(mt, &tbs[i]));
        TRY(forward_step(mt, i % sets, &tbs[i], loss_sum));
        TRY(send_forward(mt, &tbs[i]));
    }
    if (steady > 0) {
        model_train_use_set(mt, warmup % sets);
        TRY(recv_forward(mt, &tbs[warmup]));
    }
    for (int k = 0; k < steady; k++) {
        const int f = warmup + k;
        TRY(forward_step(mt, f % sets, &tbs[f], loss_sum));
        TRY(send_forward_recv_backward(mt, f % sets, &tbs[f], &tbs[k]));
        TRY(backward_step(r, mt, k % sets, &tbs[k], grads, k == n - 1));
        if (k == steady - 1) TRY(send_backward(mt, &tbs[k]));
        else TRY(send_backward_recv_forward(mt, &tbs[k], (f + 1) % sets, &tbs[f + 1]));
    }
    for (int k = steady; k < n; k++) {
        model_train_use_set(mt, k % sets);
        TRY(recv_backward(mt, &tbs[k]));
        TRY(backward_step(r, mt, k % sets, &tbs[k], grads, k == n - 1));
        TRY(send_backward(mt, &tbs[k]));
    }
    return STATUS_OK;
}

enum status train_ranks_step(struct train_ranks *r, struct model_train *mt, const struct train_batch *tbs, int n,
                             struct model_weights *grads, double *loss_sum)
{
    r->bucket_status = STATUS_OK;
    for (int i = 0; i < r->n_buckets; i++) r->buckets[i].started = 0;
    TRY(schedule(r, mt, tbs, n, grads, loss_sum));
    return r->buckets ? finish_dp(r) : STATUS_OK;
}

enum status train_ranks_forward(struct train_ranks *r, struct model_train *mt, const struct train_batch *tb,
                                double *loss_sum, int *n_real)
{
    (void)r;
    model_train_use_set(mt, 0);
    TRY(recv_forward(mt, tb));
    TRY(model_forward_train(mt, tb, loss_sum, n_real));
    return send_forward(mt, tb);
}

/* ---- gradients ------------------------------------------------------------------------------ */

enum status train_ranks_reduce_grads(struct train_ranks *r, struct model_train *mt, struct model_weights *grads,
                                     const struct param_table *gparams)
{
    struct model *m = model_train_model(mt);
    /* The tied embedding: the first stage's (lookup) and the last's (head) gradients summed on
     * both, exchanged over pp (a + b on one, b + a on the other: the same bits). */
    if (r->tied_mem && (first_stage(m) || model_is_last_stage(m))) {
        struct tensor *g = first_stage(m) ? &grads->tok_embedding : &grads->lm_head;
        const int peer = first_stage(m) ? r->pp - 1 : 0;
        TRY(comm_sendrecv(m->par.groups->pp, g, peer, &r->tied_tmp, peer));
        op_add(m->b, g, g, &r->tied_tmp);
    }
    for (size_t i = 0; i < gparams->n; i++) {
        const struct param *p = &gparams->p[i];
        if (r->tp > 1 && p->tp_partial)
            TRY(comm_all_reduce(m->par.groups->tp, p->t));
        /* dp: done in train_ranks_step, or reduce-scattered by the distributed optimizer; under
         * expert parallelism here, tensor by tensor (no overlap with the backward), an expert's
         * over the ranks that hold the same experts */
        if (r->ep > 1 && !r->dist_opt) {
            struct comm *c = param_is_expert(p) ? r->groups.edp : r->groups.dp;
            if (c->size > 1) TRY(comm_all_reduce(c, p->t));
        }
    }
    return STATUS_OK;
}

enum status train_ranks_sum(struct train_ranks *r, double *v, int n)
{
    if (r->world->size == 1) return STATUS_OK;
    const int W = r->world->size;
    int32_t *all = malloc((size_t)W * (size_t)n * sizeof(double));
    if (!all) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    struct tensor in = tensor_make(v, DTYPE_I32, DEVICE_CPU, 1, (int64_t)n * 2);
    struct tensor out = tensor_make(all, DTYPE_I32, DEVICE_CPU, 1, (int64_t)W * n * 2);
    enum status st = comm_all_gather(r->world->control, &out, &in);
    if (st == STATUS_OK) {
        const double *d = (const double *)all;
        for (int j = 0; j < n; j++) {
            double s = 0.0;
            for (int w = 0; w < W; w++) s += d[(size_t)w * n + j];
            v[j] = s;
        }
    }
    free(all);
    return st;
}

/* ---- faults: naming a hung rank -------------------------------------------------------------
 * The heartbeats are the parallel runtime's (parallel_watch.c, started by train_ranks_connect
 * with --rank-timeout): every timeout message names the silent ranks itself. */
void train_ranks_explain(struct train_ranks *r, char *buf, size_t n)
{
    if (parallel_watch_silent(r->world, buf, n) > 0) {
        size_t len = strlen(buf);
        if (len + 1 < n) snprintf(buf + len, n - len, " stopped responding: hung or dead");
    }
}
