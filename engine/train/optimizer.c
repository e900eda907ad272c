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

enum status optimizer_init(struct optimizer *opt, struct backend *b, struct model_weights *params,
                           const struct optimizer_options *o)
{
    memset(opt, 0, sizeof *opt);
    opt->o = *o;
    enum status st = weights_alloc_like(b, params, DTYPE_F32, &opt->m, &opt->mem_m);
    if (st == STATUS_OK) st = weights_alloc_like(b, params, DTYPE_F32, &opt->v, &opt->mem_v);
    if (st == STATUS_OK) st = backend_alloc_tensor(b, &opt->norm_acc, DTYPE_F32, 1, (int64_t[]){1});
    if (st != STATUS_OK) optimizer_free(opt, b);
    return st;
}

void optimizer_free(struct optimizer *opt, struct backend *b)
{
    weights_free_layers(&opt->m);
    weights_free_layers(&opt->v);
    backend_free(b, opt->mem_m);
    backend_free(b, opt->mem_v);
    backend_free(b, opt->norm_acc.data);
    memset(opt, 0, sizeof *opt);
}

/* The present tensors of w, in table order. */
static struct weight_ref *table(struct model_weights *w, int *n)
{
    struct weight_ref *t = malloc((size_t)weights_table_max(w->n_layers) * sizeof *t);
    CHECK(t, "optimizer: out of host memory for the layout table");
    *n = weights_table(w, 0, 1, t);
    return t;
}

double optimizer_grad_norm(struct optimizer *opt, struct backend *b, struct model_weights *grads)
{
    int n = 0;
    struct weight_ref *g = table(grads, &n);
    backend_memset_zero(b, opt->norm_acc.data, sizeof(float));
    for (int i = 0; i < n; i++) op_sum_squares(b, &opt->norm_acc, g[i].t);
    float sum = 0.0f;
    backend_download(b, &sum, opt->norm_acc.data, sizeof sum);
    free(g);
    return sqrt((double)sum);
}

void optimizer_step(struct optimizer *opt, struct backend *b, struct model_weights *params,
                    struct model_weights *grads, double lr, double grad_norm, double unscale)
{
    int n = 0, ng = 0, nm = 0, nv = 0;
    struct weight_ref *p = table(params, &n), *g = table(grads, &ng);
    struct weight_ref *m = table(&opt->m, &nm), *v = table(&opt->v, &nv);
    CHECK(n == ng && n == nm && n == nv, "optimizer: tables differ (%d, %d, %d, %d)", n, ng, nm, nv);
    opt->step++;
    double clip = 1.0;
    if (opt->o.clip_grad > 0.0 && grad_norm > opt->o.clip_grad) clip = opt->o.clip_grad / (grad_norm + 1e-6);
    for (int i = 0; i < n; i++) {
        struct adamw_params hp = {
            .lr = (float)lr,
            .beta1 = (float)opt->o.beta1,
            .beta2 = (float)opt->o.beta2,
            .eps = (float)opt->o.eps,
            .weight_decay = p[i].t->ndim == 2 ? (float)opt->o.weight_decay : 0.0f,
            .step = opt->step,
            .grad_scale = (float)(clip * unscale),
        };
        op_adamw(b, p[i].t, g[i].t, m[i].t, v[i].t, &hp);
    }
    free(p);
    free(g);
    free(m);
    free(v);
}
