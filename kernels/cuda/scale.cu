/* kernels/cuda/scale.cu - op_scale: out = alpha * x elementwise, and op_softcap: out = cap *
 * tanh(x / cap); out may alias x.
 * Not here: attention's score scaling (attention.cu applies batch->scale itself).
 * Tests: tests/test_ops.c --backend cuda. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

/* out = p * x, or p * tanh(x / p) (cuda_softcap) when softcap. */
template <typename T>
static __global__ void map_kernel(T *out, const T *x, float p, int softcap, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float v = cuda_load(x + i);
        cuda_store(out + i, softcap ? cuda_softcap(v, p) : p * v);
    }
}

static void map(struct backend *b, const struct tensor *out, const struct tensor *x, float p, int softcap)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        map_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, p, softcap, n);
        LAUNCH_CHECK());
}

/* out, x: same shape and dtype. */
void cuda_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha)
{
    map(b, out, x, alpha, 0);
}

void cuda_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap)
{
    map(b, out, x, cap, 1);
}
