/* kernels/cuda/scale.cu - op_scale: out = alpha * x elementwise, and op_softcap: out = cap *
 * tanh(x / cap); out may alias x.
 * Not here: attention's score scaling (attention.cu applies batch->scale itself).
 * Tests: tests/test_ops.c --backend cuda. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void scale_kernel(T *out, const T *x, float alpha, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, alpha * cuda_load(x + i));
}

/* out, x: same shape and dtype. */
void cuda_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        scale_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, alpha, n);
        LAUNCH_CHECK());
}

template <typename T>
static __global__ void softcap_kernel(T *out, const T *x, float cap, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_softcap(cuda_load(x + i), cap));
}

void cuda_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        softcap_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, cap, n);
        LAUNCH_CHECK());
}
