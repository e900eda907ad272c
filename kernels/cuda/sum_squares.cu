/* kernels/cuda/sum_squares.cu - op_sum_squares: out += sum(x^2), for the global gradient norm
 * and the loss scaler's overflow check (Inf or NaN in x makes out Inf or NaN). A fixed number
 * of blocks for a given size each sum a grid-stride slice into scratch; one warp then adds
 * the block sums in a fixed order (deterministic).
 * Tests: tests/test_ops_backward.c --backend cuda (sum_squares cases). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define SQ_THREADS 256
#define SQ_MAX_BLOCKS 1024

template <typename T>
static __global__ void __launch_bounds__(SQ_THREADS)
sum_squares_kernel(float *partial, const T *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = cuda_load(x + i);
        acc += v * v;
    }
    acc = cuda_block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/* One warp: lane l adds the block sums l, l + 32, ... in order, then a fixed shuffle tree
 * (deterministic). One thread adding ~500 block sums in turn took 14 us on an H200. */
static __global__ void sum_squares_finish_kernel(float *out, const float *partial, int blocks)
{
    if (blockIdx.x != 0 || threadIdx.x >= 32) return;
    float s = 0.0f;
    for (int k = (int)threadIdx.x; k < blocks; k += 32) s += partial[k];
    s = cuda_warp_sum(s);
    if (threadIdx.x == 0) out[0] += s;
}

/* out f32 (1); x any float dtype. */
void cuda_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(x);
    if (n == 0) return;
    unsigned blocks = cuda_blocks_for(n, SQ_THREADS);
    if (blocks > SQ_MAX_BLOCKS) blocks = SQ_MAX_BLOCKS;
    float *partial = (float *)cuda_scratch(b, blocks * sizeof(float));
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        sum_squares_kernel<T><<<blocks, SQ_THREADS, 0, s->stream>>>(partial, (const T *)x->data, n);
        LAUNCH_CHECK());
    sum_squares_finish_kernel<<<1, 32, 0, s->stream>>>((float *)out->data, partial, (int)blocks);
    LAUNCH_CHECK();
}
