/* kernels/cuda/add.cu - op_add: out = a + c elementwise (the residual add); out may alias a
 * or c, which an elementwise kernel allows. op_scatter_add_rows: out[ids[i]] += w[i] y[i] (a
 * mixture of experts' combine; ids distinct, so no two threads write one element).
 * Not here: broadcasting adds (bias is folded into matmul.cu; norms carry their own).
 * Tests: tests/test_ops.c --backend cuda (aliased and separate outputs). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void add_kernel(T *out, const T *a, const T *c, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_load(a + i) + cuda_load(c + i));
}

/* out, a, c: same shape and dtype. */
void cuda_add(struct backend *b, const struct tensor *out, const struct tensor *a,
              const struct tensor *c)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        add_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)a->data, (const T *)c->data, n);
        LAUNCH_CHECK());
}

template <typename T>
static __global__ void scatter_add_rows_kernel(T *out, const T *y, const int32_t *ids, const float *w, int64_t n,
                                               int64_t d, int64_t rows)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n * d; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = e / d, j = e % d;
        const int32_t r = ids[i];
        if (r < 0 || r >= rows) __trap(); /* a caller bug (ops.h) */
        T *o = out + (int64_t)r * d + j;
        cuda_store(o, cuda_load(o) + w[i] * cuda_load(y + e));
    }
}

void cuda_scatter_add_weighted(struct backend *b, const struct tensor *out, const struct tensor *y,
                               const struct tensor *ids, const struct tensor *weights)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(y), d = tensor_cols(y);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        scatter_add_rows_kernel<T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)y->data, (const int32_t *)ids->data, (const float *)weights->data, n, d,
            tensor_rows(out));
        LAUNCH_CHECK());
}

/* One block per row i: dy[i] = w[i] dout[ids[i]], and the dot product dout[ids[i]] . y[i]
 * reduced in the block (column order within each thread, then a tree: not the CPU's order, so
 * the two agree to f32 rounding). */
template <typename T>
static __global__ void scatter_add_rows_backward_kernel(T *dy, float *dw, const T *dout, const T *y,
                                                        const int32_t *ids, const float *w, int64_t d, int64_t rows)
{
    __shared__ float part[CUDA_THREADS];
    const int64_t i = blockIdx.x;
    const int32_t r = ids[i];
    if (r < 0 || r >= rows) __trap(); /* a caller bug (ops.h) */
    float dot = 0.0f;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
        const float g = cuda_load(dout + (int64_t)r * d + j);
        dot += g * cuda_load(y + i * d + j);
        cuda_store(dy + i * d + j, w[i] * g);
    }
    part[threadIdx.x] = dot;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (dw && threadIdx.x == 0) dw[i] = part[0];
}

void cuda_scatter_add_weighted_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                        const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                        const struct tensor *weights)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(y), d = tensor_cols(y);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(y->dtype, T,
        scatter_add_rows_backward_kernel<T><<<(unsigned)n, CUDA_THREADS, 0, s->stream>>>(
            (T *)dy->data, dweights ? (float *)dweights->data : NULL, (const T *)dout->data, (const T *)y->data,
            (const int32_t *)ids->data, (const float *)weights->data, d, tensor_rows(dout));
        LAUNCH_CHECK());
}
