/* kernels/cuda/dropout.cu - op_dropout: out = x masked by the counter-based mask of ops.h
 * (op_dropout_hash, op_dropout_threshold: the same formula as the CPU), scaled by 1 / (1 - p);
 * out may alias x.
 * Tests: tests/test_ops_dropout.c --backend cuda (against the CPU, bit for bit on the mask). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

static __device__ __forceinline__ uint64_t dropout_hash(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

template <typename T>
static __global__ void dropout_kernel(T *out, const T *x, uint64_t key, int64_t col0, uint32_t threshold,
                                      float scale, int64_t n, int64_t d)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * d;
         i += (int64_t)gridDim.x * blockDim.x) {
        const uint64_t r = (uint64_t)(i / d), c = (uint64_t)(col0 + i % d);
        const bool keep = (dropout_hash(key ^ (r << 32 | c)) >> 40) >= threshold;
        cuda_store(out + i, keep ? cuda_load(x + i) * scale : 0.0f);
    }
}

/* out, x: (n, d), same dtype. */
void cuda_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key, int64_t col0,
                  float p)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = out->shape[0], d = out->shape[1];
    if (n * d == 0) return;
    const uint32_t threshold = op_dropout_threshold(p);
    const float scale = 1.0f / (1.0f - p);
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        dropout_kernel<T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, key, col0, threshold, scale, n, d);
        LAUNCH_CHECK());
}
