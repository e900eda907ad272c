/* kernels/cuda/cast.cu - op_cast: a tensor converted between float dtypes (f32, bf16, f16),
 * through f32, rounded to nearest even on store.
 * Not here: host-side conversions (kernels/tensor.c).
 * Tests: tests/test_ops.c --backend cuda (every pair of dtypes, NaN and Inf preserved). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename TO, typename TI>
static __global__ void cast_kernel(TO *out, const TI *in, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_load(in + i));
}

/* out, in: any shapes of equal numel. */
void cuda_cast(struct backend *b, const struct tensor *out, const struct tensor *in)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(in);
    if (n == 0) return;
    /* Same dtype: a bit-exact copy (a round trip through f32 could change NaN payloads). */
    if (out->dtype == in->dtype) {
        CUDA_CHECK(cudaMemcpyAsync(out->data, in->data, tensor_nbytes(in),
                                   cudaMemcpyDeviceToDevice, s->stream));
        return;
    }
    CUDA_DISPATCH_FLOAT(out->dtype, TO,
        CUDA_DISPATCH_FLOAT(in->dtype, TI,
            cast_kernel<TO, TI><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
                (TO *)out->data, (const TI *)in->data, n);
            LAUNCH_CHECK()));
}
