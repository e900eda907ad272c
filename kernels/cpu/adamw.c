/* kernels/cpu/adamw.c - op_adamw on the CPU: one AdamW step over f32 master weights and moments,
 * optax.adamw's formula (ops.h), elementwise in f32.
 * Not here: the learning-rate schedule, clipping and loss scaling (engine/train: they arrive as
 * lr and grad_scale).
 * Tests: tests/test_ops_backward.c (adamw cases, against a double reference of optax's). */
#include <math.h>

#include "cpu_ops.h"

void cpu_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
               const struct tensor *m, const struct tensor *v, const struct adamw_params *hp)
{
    const int64_t n = tensor_numel(p);
    float *pp = p->data, *pm = m->data, *pv = v->data;
    const float *pg = g->data;
    const float b1 = hp->beta1, b2 = hp->beta2, lr = hp->lr, eps = hp->eps, wd = hp->weight_decay;
    const float gs = hp->grad_scale;
    /* 1 / (1 - beta^step), in double: beta^step underflows gracefully, and 1 - beta^step for
     * beta near 1 would cancel in f32. */
    const float c1 = (float)(1.0 / (1.0 - pow((double)b1, (double)hp->step)));
    const float c2 = (float)(1.0 / (1.0 - pow((double)b2, (double)hp->step)));
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float gi = gs * pg[i];
        float mi = b1 * pm[i] + (1.0f - b1) * gi;
        float vi = b2 * pv[i] + (1.0f - b2) * gi * gi;
        pm[i] = mi;
        pv[i] = vi;
        float update = (mi * c1) / (sqrtf(vi * c2) + eps) + wd * pp[i];
        pp[i] -= lr * update;
    }
}
