/* kernels/cuda/softmax.cu - op_softmax and op_log_softmax, per row (one thread block per
 * row): max-subtracted, max and sum reduced in f32; out may alias x.
 * Not here: attention's softmax (attention.cu, online), sampling (engine/).
 * Tests: tests/test_ops.c --backend cuda (softmax and log_softmax, vocab-sized rows, aliased
 * output). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define SOFTMAX_THREADS 1024

/* Aliasing is safe: each element is read and written by the same thread, and the reduction
 * passes read x before any write. As on the CPU, a NaN is skipped by the max (fmaxf) and
 * poisons the sum. */
template <typename T>
static __global__ void __launch_bounds__(SOFTMAX_THREADS)
softmax_kernel(T *out, const T *x, int64_t n, int64_t v, int log_form)
{
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * v;
        T *o = out + row * v;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) mx = fmaxf(mx, cuda_load(xr + j));
        mx = cuda_block_max(mx);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(cuda_load(xr + j) - mx);
        sum = cuda_block_sum(sum);
        if (log_form) {
            float lse = mx + logf(sum);
            for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
                cuda_store(o + j, cuda_load(xr + j) - lse);
        } else {
            float inv = 1.0f / sum;
            for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
                cuda_store(o + j, expf(cuda_load(xr + j) - mx) * inv);
        }
    }
}

static void softmax_launch(struct backend *b, const struct tensor *out, const struct tensor *x,
                           int log_form)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), v = tensor_cols(x);
    if (n == 0 || v == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        softmax_kernel<T><<<cuda_blocks_for(n, 1), SOFTMAX_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, n, v, log_form);
        LAUNCH_CHECK());
}

/* out, x (n, v). */
void cuda_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    softmax_launch(b, out, x, 0);
}

/* out, x (n, v). */
void cuda_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    softmax_launch(b, out, x, 1);
}
