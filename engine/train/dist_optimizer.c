/* engine/train/dist_optimizer.c - the distributed optimizer (dist_optimizer.h): one part over
 * dp, and under expert parallelism a second over the experts' own data-parallel group.
 * Tests: tests/test_train_parallel.sh. */
#include "dist_optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static struct tensor f32_view(const struct tensor *base, int64_t at, int64_t n)
{
    return tensor_make((float *)base->data + at, DTYPE_F32, base->device, 1, n);
}

/* One part of the optimizer over the rows of the tables that take marks (all when NULL; the
 * others' starts are -1), sharded over comm: its flat buffer, the gradients re-pointed into it. */
static enum status init_part(struct dist_optimizer *d, struct backend *b, struct comm *comm,
                             const struct param_table *params, struct param_table *grads, const unsigned char *take,
                             const struct optimizer_options *o)
{
    memset(d, 0, sizeof *d);
    d->o = *o;
    d->dp = comm;
    d->b = b;
    CHECK(params->n == grads->n, "parameter and gradient tables differ");
    /* The flat layout: the rows one after another, each at a 64-element boundary. */
    int64_t total = 0;
    int64_t *start = malloc((params->n + 1) * sizeof *start);
    if (!start) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    for (size_t i = 0; i < grads->n; i++) {
        CHECK(grads->p[i].t->dtype == DTYPE_F32, "f32 gradients expected");
        start[i] = take && !take[i] ? -1 : total;
        if (start[i] >= 0) total += (tensor_numel(grads->p[i].t) + 63) / 64 * 64;
    }
    if (total == 0) total = 1;
    d->shard = (total + comm->size - 1) / comm->size;
    d->padded = d->shard * comm->size;
    d->starts = start;
    d->n_rows = params->n;
    enum status st = backend_alloc(b, (size_t)d->padded * sizeof(float), &d->flat_mem);
    if (st == STATUS_OK) st = backend_alloc(b, (size_t)d->shard * 3 * sizeof(float), &d->mem);
    if (st == STATUS_OK) st = backend_alloc_tensor(b, &d->acc, DTYPE_F32, 1, (int64_t[]){1});
    if (st == STATUS_OK && !(d->pieces = calloc(params->n + 1, sizeof *d->pieces)))
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    if (st != STATUS_OK) return st;
    backend_memset_zero(b, d->flat_mem, (size_t)d->padded * sizeof(float));
    backend_memset_zero(b, d->mem, (size_t)d->shard * 3 * sizeof(float));
    d->flat = tensor_make(d->flat_mem, DTYPE_F32, b->device, 1, d->padded);
    struct tensor whole = tensor_make(d->mem, DTYPE_F32, b->device, 1, d->shard * 3);
    d->buf = f32_view(&whole, 0, d->shard);
    d->m = f32_view(&whole, d->shard, d->shard);
    d->v = f32_view(&whole, 2 * d->shard, d->shard);
    /* Re-point the gradients into the flat buffer (their values are zero: a step starts). */
    for (size_t i = 0; i < grads->n; i++)
        if (start[i] >= 0) grads->p[i].t->data = (float *)d->flat_mem + start[i];
    /* This rank's pieces. */
    const int64_t lo = (int64_t)comm->rank * d->shard, hi = lo + d->shard;
    for (size_t i = 0; i < params->n; i++) {
        if (start[i] < 0) continue;
        const int64_t a = start[i] > lo ? start[i] : lo, e = start[i] + tensor_numel(params->p[i].t);
        const int64_t z = e < hi ? e : hi;
        if (a < z) d->pieces[d->n_pieces++] = (struct dist_piece){.row = i, .lo = a, .hi = z, .start = start[i]};
    }
    return STATUS_OK;
}

enum status dist_optimizer_init(struct dist_optimizer *d, struct backend *b, struct comm *dp,
                                const struct param_table *params, struct param_table *grads, void **grads_mem,
                                const struct optimizer_options *o, struct comm *edp, const unsigned char *expert_rows)
{
    unsigned char *dense = NULL;
    enum status st = STATUS_OK;
    if (expert_rows) {
        dense = malloc(params->n + 1);
        if (!dense) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
        for (size_t i = 0; i < params->n; i++) dense[i] = !expert_rows[i];
    }
    st = init_part(d, b, dp, params, grads, dense, o);
    if (st == STATUS_OK && expert_rows) {
        if (!(d->experts = malloc(sizeof *d->experts))) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
        else st = init_part(d->experts, b, edp, params, grads, expert_rows, o);
    }
    free(dense);
    if (st != STATUS_OK) {
        dist_optimizer_free(d);
        return st;
    }
    backend_free(b, *grads_mem); /* every row now lives in a flat buffer */
    *grads_mem = NULL;
    return STATUS_OK;
}

void dist_optimizer_free(struct dist_optimizer *d)
{
    if (d->experts) {
        dist_optimizer_free(d->experts);
        free(d->experts);
    }
    if (!d->b) return;
    backend_free(d->b, d->flat_mem);
    backend_free(d->b, d->mem);
    backend_free(d->b, d->acc.data);
    backend_free(d->b, d->master_mem);
    free(d->pieces);
    free(d->starts);
    memset(d, 0, sizeof *d);
}

enum status dist_optimizer_reduce(struct dist_optimizer *d)
{
    enum status st = comm_reduce_scatter(d->dp, &d->buf, &d->flat);
    return st == STATUS_OK && d->experts ? dist_optimizer_reduce(d->experts) : st;
}

double dist_optimizer_sumsq(struct dist_optimizer *d, const struct param_table *grads)
{
    const int64_t base = (int64_t)d->dp->rank * d->shard;
    backend_memset_zero(d->b, d->acc.data, sizeof(float));
    for (size_t k = 0; k < d->n_pieces; k++) {
        const struct dist_piece *p = &d->pieces[k];
        if (!grads->p[p->row].counted) continue;
        struct tensor g = f32_view(&d->buf, p->lo - base, p->hi - p->lo);
        op_sum_squares(d->b, &d->acc, &g);
    }
    float s = 0.0f;
    backend_download(d->b, &s, d->acc.data, sizeof s);
    return (double)s + (d->experts ? dist_optimizer_sumsq(d->experts, grads) : 0.0);
}

enum status dist_optimizer_step(struct dist_optimizer *d, const struct param_table *params, double lr,
                                double grad_norm, double unscale)
{
    const int64_t base = (int64_t)d->dp->rank * d->shard;
    d->step++;
    double clip = 1.0;
    if (d->o.clip_grad > 0.0 && grad_norm > d->o.clip_grad) clip = d->o.clip_grad / (grad_norm + 1e-6);
    for (size_t k = 0; k < d->n_pieces; k++) {
        const struct dist_piece *p = &d->pieces[k];
        const struct param *pr = &params->p[p->row];
        const int64_t n = p->hi - p->lo;
        struct tensor w = d->compute ? f32_view(&d->master, p->lo - base, n)
                                     : tensor_make((float *)pr->t->data + (p->lo - p->start), DTYPE_F32, pr->t->device, 1, n);
        struct tensor g = f32_view(&d->buf, p->lo - base, n), m = f32_view(&d->m, p->lo - base, n);
        struct tensor v = f32_view(&d->v, p->lo - base, n);
        struct adamw_params hp = {
            .lr = (float)lr,
            .beta1 = (float)d->o.beta1,
            .beta2 = (float)d->o.beta2,
            .eps = (float)d->o.eps,
            .weight_decay = pr->decay ? (float)d->o.weight_decay : 0.0f,
            .step = d->step,
            .grad_scale = (float)(clip * unscale),
        };
        op_adamw(d->b, &w, &g, &m, &v, &hp);
        /* The updated piece into the shard buffer, which the all-gather sends. */
        backend_copy(d->b, g.data, w.data, (size_t)n * sizeof(float));
    }
    enum status st = comm_all_gather(d->dp, &d->flat, &d->buf);
    if (st != STATUS_OK) return st;
    /* Every row from the gathered buffer (this rank's own pieces come back unchanged): into the
     * f32 weights, or rounded into the compute copy when the masters are sharded. */
    for (size_t i = 0; i < params->n; i++) {
        if (d->starts[i] < 0) continue; /* the other part's */
        if (!d->compute) {
            backend_copy(d->b, params->p[i].t->data, (float *)d->flat_mem + d->starts[i],
                         tensor_nbytes(params->p[i].t));
            continue;
        }
        const struct tensor *c = d->compute->p[i].t;
        struct tensor src = *c;
        src.data = (float *)d->flat_mem + d->starts[i];
        src.dtype = DTYPE_F32;
        op_cast(d->b, c, &src);
    }
    return d->experts ? dist_optimizer_step(d->experts, params, lr, grad_norm, unscale) : STATUS_OK;
}

enum status dist_optimizer_shard_masters(struct dist_optimizer *d, const struct param_table *params,
                                         const struct param_table *compute)
{
    CHECK(compute->n == d->n_rows && params->n == d->n_rows, "tables differ from the optimizer's");
    enum status st = backend_alloc(d->b, (size_t)d->shard * sizeof(float), &d->master_mem);
    if (st != STATUS_OK) return st;
    backend_memset_zero(d->b, d->master_mem, (size_t)d->shard * sizeof(float));
    d->master = tensor_make(d->master_mem, DTYPE_F32, d->b->device, 1, d->shard);
    const int64_t base = (int64_t)d->dp->rank * d->shard;
    for (size_t k = 0; k < d->n_pieces; k++) {
        const struct dist_piece *p = &d->pieces[k];
        backend_copy(d->b, (float *)d->master_mem + (p->lo - base),
                     (const float *)params->p[p->row].t->data + (p->lo - p->start),
                     (size_t)(p->hi - p->lo) * sizeof(float));
    }
    d->compute = compute;
    return d->experts ? dist_optimizer_shard_masters(d->experts, params, compute) : STATUS_OK;
}

/* Moves every row of rows (tensors shaped like the parameters) to or from the flat buffer. */
static void rows_flat(struct dist_optimizer *d, const struct tensor *rows, int to_flat)
{
    for (size_t i = 0; i < d->n_rows; i++) {
        if (d->starts[i] < 0) continue; /* the other part's */
        float *f = (float *)d->flat_mem + d->starts[i];
        if (to_flat) backend_copy(d->b, f, rows[i].data, tensor_nbytes(&rows[i]));
        else backend_copy(d->b, rows[i].data, f, tensor_nbytes(&rows[i]));
    }
}

enum status dist_optimizer_gather_masters(struct dist_optimizer *d, const struct param_table *rows)
{
    CHECK(d->compute && rows->n == d->n_rows, "no sharded masters, or another table");
    enum status st = comm_all_gather(d->dp, &d->flat, &d->master);
    if (st != STATUS_OK) return st;
    for (size_t i = 0; i < rows->n; i++)
        if (d->starts[i] >= 0)
            backend_copy(d->b, rows->p[i].t->data, (float *)d->flat_mem + d->starts[i], tensor_nbytes(rows->p[i].t));
    return d->experts ? dist_optimizer_gather_masters(d->experts, rows) : STATUS_OK;
}

enum status dist_optimizer_gather_state(struct dist_optimizer *d, struct optimizer *full)
{
    CHECK(full->n == d->n_rows, "the whole moments were made for another table");
    const struct tensor *mine[2] = {&d->m, &d->v};
    struct tensor *rows[2] = {full->m, full->v};
    for (int k = 0; k < 2; k++) {
        enum status st = comm_all_gather(d->dp, &d->flat, mine[k]);
        if (st != STATUS_OK) return st;
        rows_flat(d, rows[k], 0);
    }
    full->step = d->step;
    return d->experts ? dist_optimizer_gather_state(d->experts, full) : STATUS_OK;
}

void dist_optimizer_scatter_state(struct dist_optimizer *d, const struct optimizer *full)
{
    CHECK(full->n == d->n_rows, "the whole moments were made for another table");
    const int64_t base = (int64_t)d->dp->rank * d->shard;
    const struct tensor *mine[2] = {&d->m, &d->v};
    const struct tensor *rows[2] = {full->m, full->v};
    for (int k = 0; k < 2; k++) {
        rows_flat(d, rows[k], 1);
        backend_copy(d->b, mine[k]->data, (float *)d->flat_mem + base, (size_t)d->shard * sizeof(float));
    }
    backend_memset_zero(d->b, d->flat_mem, (size_t)d->padded * sizeof(float));
    d->step = full->step;
    if (d->experts) dist_optimizer_scatter_state(d->experts, full);
}
