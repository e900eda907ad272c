/* kernels/cuda/topk.cu - op_topk: per row, the k largest values in descending order, ties by
 * lower index, NaN ranked below every number (and NaNs among themselves by index), values
 * written as f32 whatever x's dtype: the order of the CPU reference (kernels/cpu/topk.c).
 * One thread block per row: a radix select finds the k-th largest key in four histogram
 * passes over the row, one more pass gathers the k winners into shared memory, and a
 * rank-by-counting pass writes them out in order. O(5 v + k^2 / threads) per row, no global
 * scratch.
 * Not here: the single largest (argmax.cu), sampling (engine/serving/sampler.c).
 * Tests: tests/test_ops.c --backend cuda (ties, NaN, -0/+0, k = 1 and k = v, vocab-sized
 * rows). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

#define TOPK_THREADS 1024
/* Candidates live in dynamic shared memory, 8 bytes each: 4096 of them take 32 KiB, inside the
 * 48 KiB every device grants without opting in. */
#define TOPK_MAX_K 4096

/* The candidate arrays' length: k rounded up to whole 16-byte chunks. The dynamic shared array
 * is 16-byte aligned, and ptxas reads it by whole aligned chunks (the ranking loop's tail is an
 * LDS.128): with k = 1 that read ran past an 8-byte allocation (compute-sanitizer memcheck on an
 * H100, 2026-11-24). Keys and indices each take whole chunks, so every chunk read lies inside
 * the allocation. */
__host__ __device__ __forceinline__ int topk_cand_len(int k) { return (k + 3) & ~3; }

/* An order-preserving unsigned key: key(a) > key(c) exactly when a ranks above c as a value.
 * -0 maps to +0's key (they compare equal, so the index decides, as on the CPU); every NaN
 * maps to 0, below -inf's key (0x007fffff). */
__device__ __forceinline__ uint32_t topk_key(float v)
{
    if (isnan(v)) return 0u;
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) == 0u) u = 0u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <typename T>
static __global__ void __launch_bounds__(TOPK_THREADS)
topk_kernel(float *values, int32_t *ids, const T *x, int64_t n, int v, int k)
{
    extern __shared__ uint32_t topk_shared[];
    uint32_t *cand_key = topk_shared;                                /* (k), padded */
    int32_t *cand_idx = (int32_t *)(topk_shared + topk_cand_len(k)); /* (k), padded */
    __shared__ uint32_t hist[256];
    __shared__ uint32_t chosen_prefix, chosen_remaining;
    __shared__ int n_above;
    __shared__ int warp_count[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;

    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * v;

        /* Radix select, 8 bits at a time from the top. Invariant: at least `remaining` keys
         * match `prefix` on the bits under `mask`, and the k-th largest key is the
         * remaining-th largest of them. */
        uint32_t prefix = 0u, mask = 0u, remaining = (uint32_t)k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0u;
            __syncthreads();
            for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
                uint32_t key = topk_key(cuda_load(xr + j));
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                uint32_t above = 0u;
                int digit = 255;
                for (; digit > 0; digit--) {
                    if (above + hist[digit] >= remaining) break;
                    above += hist[digit];
                }
                chosen_prefix = prefix | ((uint32_t)digit << shift);
                chosen_remaining = remaining - above;
            }
            /* Thread 0 writes chosen_* again only after two more barriers, which every thread
             * reaches after reading them here. */
            __syncthreads();
            prefix = chosen_prefix;
            remaining = chosen_remaining;
            mask |= 0xffu << shift;
        }

        /* Exactly k - remaining keys are above the threshold key; of the keys equal to it, the
         * `remaining` lowest indices win. The first go anywhere in [0, n_greater) (the ranking
         * pass orders them); the second are counted in index order with a block-wide scan. */
        const uint32_t threshold = prefix;
        const int n_greater = k - (int)remaining;
        if (threadIdx.x == 0) n_above = 0;
        __syncthreads();
        int equal_before_tile = 0; /* the same in every thread */
        for (int64_t base = 0; base < v; base += blockDim.x) {
            int64_t j = base + threadIdx.x;
            uint32_t key = j < v ? topk_key(cuda_load(xr + j)) : 0u;
            bool greater = j < v && key > threshold;
            bool equal = j < v && key == threshold;
            if (greater) {
                int slot = atomicAdd(&n_above, 1);
                cand_key[slot] = key;
                cand_idx[slot] = (int32_t)j;
            }
            unsigned ballot = __ballot_sync(0xffffffffu, equal);
            if (lane == 0) warp_count[warp] = __popc(ballot);
            __syncthreads();
            int before = equal_before_tile, in_tile = 0;
            for (int w = 0; w < n_warps; w++) {
                if (w < warp) before += warp_count[w];
                in_tile += warp_count[w];
            }
            if (equal) {
                int r = before + __popc(ballot & ((1u << lane) - 1u));
                if (r < (int)remaining) {
                    cand_key[n_greater + r] = key;
                    cand_idx[n_greater + r] = (int32_t)j;
                }
            }
            equal_before_tile += in_tile;
            __syncthreads(); /* warp_count is rewritten by the next tile */
        }

        /* (key, index) pairs are distinct, so each candidate's rank (how many beat it) is its
         * output position. */
        float *vo = values + row * k;
        int32_t *io = ids + row * k;
        for (int c = threadIdx.x; c < k; c += blockDim.x) {
            uint32_t kc = cand_key[c];
            int32_t ic = cand_idx[c];
            int rank = 0;
            for (int o = 0; o < k; o++) {
                uint32_t ko = cand_key[o];
                rank += ko > kc || (ko == kc && cand_idx[o] < ic);
            }
            vo[rank] = cuda_load(xr + ic);
            io[rank] = ic;
        }
        __syncthreads(); /* the next row rewrites the candidates */
    }
}

/* values f32 (n, k), ids i32 (n, k) = the top k of each row of x (n, v), 1 <= k <= v. */
void cuda_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
               const struct tensor *x)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), v = tensor_cols(x), k = tensor_cols(values);
    if (n == 0) return;
    CHECK(v <= INT_MAX, "topk: rows of %lld values do not fit i32 ids", (long long)v);
    CHECK(k <= TOPK_MAX_K, "topk: k = %lld; the CUDA backend supports k <= %d", (long long)k,
          TOPK_MAX_K);
    size_t shared_bytes = 2 * (size_t)topk_cand_len((int)k) * sizeof(uint32_t);
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        topk_kernel<T><<<cuda_blocks_for(n, 1), TOPK_THREADS, shared_bytes, s->stream>>>(
            (float *)values->data, (int32_t *)ids->data, (const T *)x->data, n, (int)v, (int)k);
        LAUNCH_CHECK());
}
