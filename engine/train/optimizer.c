/* engine/train/optimizer.c - AdamW over the layout table, clipping, the schedule
 * (optimizer.h). Tests: tests/test_train_step.py, tests/test_train_data.c. */
#include "optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double optimizer_lr(const struct optimizer_options *o, int64_t it)
{
    if (o->warmup_iters > 0 && it < o->warmup_iters) return o->lr * (double)(it + 1) / (double)o->warmup_iters;
    if (o->decay_style == LR_DECAY_CONSTANT) return o->lr;
    const int64_t span = o->decay_iters - o->warmup_iters;
    if (span <= 0 || it >= o->decay_iters) return o->min_lr;
    const double r = (double)(it - o->warmup_iters) / (double)span;
    const double coeff = o->decay_style == LR_DECAY_COSINE ? 0.5 * (cos(M_PI * r) + 1.0) : 1.0 - r;
    return o->min_lr + coeff * (o->lr - o->min_lr);
}

enum status optimizer_init(struct optimizer *opt, struct backend *b, const struct param_table *params,
                           const struct optimizer_options *o)
{
    memset(opt, 0, sizeof *opt);
    opt->o = *o;
    opt->n = params->n;
    opt->m = calloc(params->n + 1, sizeof *opt->m);
    opt->v = calloc(params->n + 1, sizeof *opt->v);
    if (!opt->m || !opt->v) {
        optimizer_free(opt, b);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "optimizer: out of host memory");
    }
    size_t total = 0;
    for (size_t i = 0; i < params->n; i++) total += 2 * ((size_t)tensor_numel(params->p[i].t) * 4 + 255) / 256 * 256;
    enum status st = total ? backend_alloc(b, total, &opt->mem) : STATUS_OK;
    if (st == STATUS_OK && total) backend_memset_zero(b, opt->mem, total);
    size_t off = 0;
    for (size_t i = 0; st == STATUS_OK && i < params->n; i++) {
        struct tensor t = *params->p[i].t;
        t.dtype = DTYPE_F32;
        t.device = b->device;
        const size_t nb = (tensor_nbytes(&t) + 255) / 256 * 256;
        opt->m[i] = t;
        opt->m[i].data = (char *)opt->mem + off;
        opt->v[i] = t;
        opt->v[i].data = (char *)opt->mem + off + nb;
        off += 2 * nb;
    }
    if (st == STATUS_OK) st = backend_alloc_tensor(b, &opt->norm_acc, DTYPE_F32, 1, (int64_t[]){1});
    if (st != STATUS_OK) optimizer_free(opt, b);
    return st;
}

void optimizer_free(struct optimizer *opt, struct backend *b)
{
    free(opt->m);
    free(opt->v);
    backend_free(b, opt->mem);
    backend_free(b, opt->norm_acc.data);
    memset(opt, 0, sizeof *opt);
}

double optimizer_grad_norm(struct optimizer *opt, struct backend *b, const struct param_table *grads)
{
    backend_memset_zero(b, opt->norm_acc.data, sizeof(float));
    for (size_t i = 0; i < grads->n; i++)
        if (grads->p[i].counted) op_sum_squares(b, &opt->norm_acc, grads->p[i].t);
    float sum = 0.0f;
    backend_download(b, &sum, opt->norm_acc.data, sizeof sum);
    if (opt->reduce_sumsq) sum = (float)opt->reduce_sumsq(opt->reduce_ctx, (double)sum);
    return sqrt((double)sum);
}

void optimizer_step(struct optimizer *opt, struct backend *b, const struct param_table *params,
                    const struct param_table *grads, double lr, double grad_norm, double unscale)
{
    CHECK(params->n == opt->n && grads->n == opt->n, "optimizer: tables differ (%zu, %zu, %zu)", params->n,
          grads->n, opt->n);
    opt->step++;
    double clip = 1.0;
    if (opt->o.clip_grad > 0.0 && grad_norm > opt->o.clip_grad) clip = opt->o.clip_grad / (grad_norm + 1e-6);
    for (size_t i = 0; i < opt->n; i++) {
        struct adamw_params hp = {
            .lr = (float)lr,
            .beta1 = (float)opt->o.beta1,
            .beta2 = (float)opt->o.beta2,
            .eps = (float)opt->o.eps,
            .weight_decay = params->p[i].decay ? (float)opt->o.weight_decay : 0.0f,
            .step = opt->step,
            .grad_scale = (float)(clip * unscale),
        };
        op_adamw(b, params->p[i].t, grads->p[i].t, &opt->m[i], &opt->v[i], &hp);
    }
}
