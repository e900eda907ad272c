/* kernels/cuda/rmsnorm.cu - op_rmsnorm: out = x / sqrt(mean(x^2) + eps) * weight, per row;
 * out may alias x. One thread block per row.
 * Not here: layernorm (layernorm.cu).
 * Tests: tests/test_ops.c --backend cuda (aliased output, rows not a multiple of 32). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define RMSNORM_THREADS 256

/* Aliasing is safe: each element is read and written by the same thread, and every read of
 * the sum pass is done before the block reduction returns. */
template <typename T>
static __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_kernel(T *out, const T *x, const T *weight, int64_t n, int64_t d, float eps)
{
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * d;
        T *o = out + row * d;
        float ss = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float v = cuda_load(xr + j);
            ss += v * v;
        }
        ss = cuda_block_sum(ss);
        /* Same order as the CPU: inv = 1 / sqrt(ss / d + eps), then (x * inv) * w. */
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            cuda_store(o + j, cuda_load(xr + j) * inv * cuda_load(weight + j));
    }
}

/* out, x (n, d); weight (d). */
void cuda_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, float eps)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        rmsnorm_kernel<T><<<cuda_blocks_for(n, 1), RMSNORM_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, (const T *)weight->data, n, d, eps);
        LAUNCH_CHECK());
}
