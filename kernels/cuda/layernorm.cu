/* kernels/cuda/layernorm.cu - op_layernorm: out = (x - mean) / sqrt(var + eps) * weight
 * (+ bias), per row, biased variance (PyTorch's LayerNorm); out may alias x. One thread block
 * per row; the variance is a second pass over (x - mean)^2, not E[x^2] - mean^2, which cancels
 * catastrophically for rows with a large mean.
 * Not here: rmsnorm (rmsnorm.cu).
 * Tests: tests/test_ops.c --backend cuda (with and without bias, aliased output). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define LAYERNORM_THREADS 256

/* Aliasing is safe: each element is read and written by the same thread, and both reduction
 * passes read x before any write. bias may be NULL. */
template <typename T>
static __global__ void __launch_bounds__(LAYERNORM_THREADS)
layernorm_kernel(T *out, const T *x, const T *weight, const T *bias, int64_t n, int64_t d,
                 float eps)
{
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * d;
        T *o = out + row * d;
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += cuda_load(xr + j);
        float mean = cuda_block_sum(sum) / (float)d;
        float sq = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float c = cuda_load(xr + j) - mean;
            sq += c * c;
        }
        float var = cuda_block_sum(sq) / (float)d;
        float inv = 1.0f / sqrtf(var + eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float v = (cuda_load(xr + j) - mean) * inv * cuda_load(weight + j);
            if (bias) v += cuda_load(bias + j);
            cuda_store(o + j, v);
        }
    }
}

/* out, x (n, d); weight (d); bias (d) or NULL. */
void cuda_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                    const struct tensor *weight, const struct tensor *bias, float eps)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        layernorm_kernel<T><<<cuda_blocks_for(n, 1), LAYERNORM_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, (const T *)weight->data,
            bias ? (const T *)bias->data : (const T *)NULL, n, d, eps);
        LAUNCH_CHECK());
}
