/* kernels/cuda/adamw.cu - op_adamw: one AdamW step over f32 master weights and moments,
 * elementwise in f32, the CPU reference's formula (kernels/cpu/adamw.c) term for term, with
 * the bias corrections computed on the host in double.
 * Not here: the schedule, clipping and loss scaling (engine/train: lr and grad_scale).
 * Tests: tests/test_ops_backward.c --backend cuda (adamw cases). */
#include <math.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

static __global__ void adamw_kernel(float *p, const float *g, float *m, float *v, int64_t n,
                                    float lr, float b1, float b2, float eps, float wd, float gs,
                                    float c1, float c2)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float gi = gs * g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float update = (mi * c1) / (sqrtf(vi * c2) + eps) + wd * p[i];
        p[i] -= lr * update;
    }
}

/* p, g, m, v f32 (n). */
void cuda_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
                const struct tensor *m, const struct tensor *v, const struct adamw_params *hp)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(p);
    if (n == 0) return;
    float c1 = (float)(1.0 / (1.0 - pow((double)hp->beta1, (double)hp->step)));
    float c2 = (float)(1.0 / (1.0 - pow((double)hp->beta2, (double)hp->step)));
    adamw_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
        (float *)p->data, (const float *)g->data, (float *)m->data, (float *)v->data, n, hp->lr,
        hp->beta1, hp->beta2, hp->eps, hp->weight_decay, hp->grad_scale, c1, c2);
    LAUNCH_CHECK();
}
