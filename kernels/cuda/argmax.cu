/* kernels/cuda/argmax.cu - op_argmax: per row, the index of the largest value (greedy
 * decoding): lowest index on ties, NaN never chosen over a number, 0 for an all-NaN row, as
 * the CPU reference. One thread block per row.
 * Not here: the k largest (topk.cu).
 * Tests: tests/test_ops.c --backend cuda (ties, NaN, -inf, vocab-sized rows). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define ARGMAX_THREADS 1024

/* Whether (a, ia) beats (c, ic): a number beats NaN, a larger number beats a smaller one, and
 * otherwise (equal numbers, -0 == +0 included, or two NaNs) the lower index wins. A total
 * order, so the reduction tree's shape cannot change the answer. */
__device__ __forceinline__ bool argmax_beats(float a, int ia, float c, int ic)
{
    bool a_nan = isnan(a), c_nan = isnan(c);
    if (a_nan != c_nan) return c_nan;
    if (!a_nan && a != c) return a > c;
    return ia < ic;
}

template <typename T, bool VEC>
static __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_kernel(int32_t *ids, const T *x, int64_t n, int v)
{
    __shared__ float warp_val[32];
    __shared__ int warp_idx[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * v;
        /* (NaN, INT_MAX) loses to every element. */
        float best = NAN;
        int best_i = INT_MAX;
        if (VEC) { /* 16-byte loads, several in flight: a row's order of visits does not
                      * matter, argmax_beats being a total order on (value, index) */
            constexpr int N = cuda_vec<T>::N;
            const uint4 *x4 = reinterpret_cast<const uint4 *>(xr);
#pragma unroll 4
            for (int j = threadIdx.x; j < v / N; j += blockDim.x) {
                float f[N];
                cuda_vec<T>::widen(x4[j], f);
#pragma unroll
                for (int q = 0; q < N; q++)
                    if (argmax_beats(f[q], j * N + q, best, best_i)) {
                        best = f[q];
                        best_i = j * N + q;
                    }
            }
        } else {
            for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
                float val = cuda_load(xr + j);
                if (argmax_beats(val, (int)j, best, best_i)) {
                    best = val;
                    best_i = (int)j;
                }
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (argmax_beats(ov, oi, best, best_i)) {
                best = ov;
                best_i = oi;
            }
        }
        if (lane == 0) {
            warp_val[warp] = best;
            warp_idx[warp] = best_i;
        }
        __syncthreads();
        if (warp == 0) {
            best = lane < n_warps ? warp_val[lane] : NAN;
            best_i = lane < n_warps ? warp_idx[lane] : INT_MAX;
            for (int o = 16; o > 0; o >>= 1) {
                float ov = __shfl_xor_sync(0xffffffffu, best, o);
                int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
                if (argmax_beats(ov, oi, best, best_i)) {
                    best = ov;
                    best_i = oi;
                }
            }
            if (lane == 0) ids[row] = best_i;
        }
        __syncthreads(); /* the next row overwrites warp_val and warp_idx */
    }
}

/* ids i32 (n) = argmax over each row of x (n, v), v >= 1. */
void cuda_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), v = tensor_cols(x);
    if (n == 0) return;
    CHECK(v <= INT_MAX, "argmax: rows of %lld values do not fit i32 ids", (long long)v);
    /* Rows of whole 16-byte vectors read in vectors (a one-row scan of 128256 bf16 logits in
     * 2-byte loads took 59 us on an H200, 2026-12-04). */
    const int vec = v % (16 / (int64_t)dtype_size(x->dtype)) == 0 && (uintptr_t)x->data % 16 == 0;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        if (vec)
            argmax_kernel<T, true><<<cuda_blocks_for(n, 1), ARGMAX_THREADS, 0, s->stream>>>(
                (int32_t *)ids->data, (const T *)x->data, n, (int)v);
        else
            argmax_kernel<T, false><<<cuda_blocks_for(n, 1), ARGMAX_THREADS, 0, s->stream>>>(
                (int32_t *)ids->data, (const T *)x->data, n, (int)v);
        LAUNCH_CHECK());
}
