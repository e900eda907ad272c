/* kernels/cuda/layernorm.cu - op_layernorm: out = (x - mean) / sqrt(var + eps) * weight
 * (+ bias), per row, biased variance (PyTorch's LayerNorm); out may alias x. One thread block
 * per row; the variance is a second pass over (x - mean)^2, not E[x^2] - mean^2, which cancels
 * catastrophically for rows with a large mean.
 * Its backward sums the weight and bias gradients per block of rows, then adds the blocks in
 * order, as rmsnorm.cu's does.
 * Not here: rmsnorm (rmsnorm.cu).
 * Tests: tests/test_ops.c --backend cuda (with and without bias, aliased output);
 * tests/test_ops_backward.c --backend cuda (layernorm_backward). */
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

#define NORM_BACKWARD_BLOCKS 256

/* Per row, xhat = (x - mean) r, gw = g w: dx = r (gw - mean(gw) - xhat mean(gw xhat));
 * partial (2, gridDim.x, d) or NULL: this block's sums of g xhat (weight) and g (bias). dx may
 * alias dout (see rmsnorm_backward_kernel). */
template <typename T>
static __global__ void __launch_bounds__(LAYERNORM_THREADS)
layernorm_backward_kernel(T *dx, float *partial, const T *dout, const T *x, const T *weight,
                          int64_t n, int64_t d, float eps)
{
    float *acc_w = partial ? partial + (int64_t)blockIdx.x * d : NULL;
    float *acc_b = partial ? partial + ((int64_t)gridDim.x + blockIdx.x) * d : NULL;
    if (partial)
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) acc_w[j] = acc_b[j] = 0.0f;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * d, *gr = dout + row * d;
        T *o = dx + row * d;
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += cuda_load(xr + j);
        float mean = cuda_block_sum(sum) / (float)d;
        float sq = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float c = cuda_load(xr + j) - mean;
            sq += c * c;
        }
        float r = 1.0f / sqrtf(cuda_block_sum(sq) / (float)d + eps);
        float sg = 0.0f, sgx = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float gw = cuda_load(gr + j) * cuda_load(weight + j);
            sg += gw;
            sgx += gw * ((cuda_load(xr + j) - mean) * r);
        }
        float a = cuda_block_sum(sg) / (float)d, c = cuda_block_sum(sgx) / (float)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float g = cuda_load(gr + j), xhat = (cuda_load(xr + j) - mean) * r;
            if (partial) {
                acc_w[j] += g * xhat;
                acc_b[j] += g;
            }
            cuda_store(o + j, r * (g * cuda_load(weight + j) - a - xhat * c));
        }
    }
}

/* dx, dout, x (n, d); weight (d); dweight, dbias (d) f32 or x's dtype, or NULL. */
void cuda_layernorm_backward(struct backend *b, const struct tensor *dx,
                             const struct tensor *dweight, const struct tensor *dbias,
                             const struct tensor *dout, const struct tensor *x,
                             const struct tensor *weight, float eps)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    int blocks = (int)(n < NORM_BACKWARD_BLOCKS ? n : NORM_BACKWARD_BLOCKS);
    float *partial = dweight || dbias
                         ? (float *)cuda_scratch(b, 2 * (size_t)blocks * (size_t)d * sizeof(float))
                         : NULL;
    unsigned grid = cuda_blocks_for(d, CUDA_THREADS);
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        layernorm_backward_kernel<T><<<blocks, LAYERNORM_THREADS, 0, s->stream>>>(
            (T *)dx->data, partial, (const T *)dout->data, (const T *)x->data,
            (const T *)weight->data, n, d, eps);
        LAUNCH_CHECK();
        if (dweight) CUDA_DISPATCH_GRAD(dweight->dtype, T, G,
            cuda_partials_add_kernel<G><<<grid, CUDA_THREADS, 0, s->stream>>>(
                (G *)dweight->data, partial, blocks, d);
            LAUNCH_CHECK());
        if (dbias) CUDA_DISPATCH_GRAD(dbias->dtype, T, G,
            cuda_partials_add_kernel<G><<<grid, CUDA_THREADS, 0, s->stream>>>(
                (G *)dbias->data, partial + (size_t)blocks * (size_t)d, blocks, d);
            LAUNCH_CHECK()));
}
