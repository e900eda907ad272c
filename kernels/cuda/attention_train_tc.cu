/* kernels/cuda/attention_train_tc.cu - op_attention_train and its backward on tensor cores
 * (WMMA, 16 x 16 x 16 tiles of bf16 or f16 with f32 sums) for head_dim 32, 64 and 128 (96 when forced): the
 * same packed documents, causal masks, windows, soft-capping and sinks as attention_train.cu's
 * CUDA-core kernels, which take every other shape and f32. Which one runs:
 * SHARDLM_CUDA_TRAIN_ATTENTION (cuda_common.cuh).
 *
 * Tiles of 64 query rows by 64 keys; a block has 4 warps, each owning 16 rows (the forward and
 * dq) or 16 keys (dk and dv). A warp's 16 x 64 scores come from the tensor cores into shared
 * memory (f32), where lane pair (2r, 2r + 1) handles row r's 64 columns (32 each): the masks,
 * the scale, the soft cap, the softmax. The probabilities (and dS) go back to shared memory in
 * the inputs' 16-bit dtype for the second product, as FlashAttention does: that rounding is the
 * one this form adds to the CUDA-core kernels' f32 arithmetic (tests/test_attention_train.c
 * bounds it).
 * - forward, two passes over the row block's keys: the first finds each row's max and
 *   log-sum-exp (online, in f32), the second recomputes the scores, P = exp(s - lse), and adds
 *   P V into the output's fragments, which then need no rescaling.
 * - delta: D_i = dout_i . out_i per (row, head), in f32, into scratch.
 * - dq: per key tile, S = q k^T and dP = dout v^T; dS = P (dP - D) (times the soft cap's
 *   derivative) times scale; dq += dS k.
 * - dk, dv: one block per 64 keys of a KV head, over every query head of its group and every
 *   query tile that attends to them: S^T = k q^T, dP^T = v dout^T; dv += P^T dout, dk += dS^T q,
 *   summed in f32 fragments over the group and rounded once.
 * - serving's prefill (cuda_attention_prefill_tc, op_attention of a batch that is not decode-only):
 *   the same forward (tc_forward_rows) with its keys read through the block table of the paged
 *   cache (tc_paged_keys), each sequence's new rows tiled on their own, no lse stored. Written
 *   2026-12-07, not yet run on a GPU (the training forward it shares has).
 * No atomics: the results are the same on every run. Keys outside a row's reach enter the
 * products with weight 0 (not skipped, unlike the CUDA-core kernels): training activations are
 * finite, and a non-finite loss is caught by the trainer's check.
 * Tests: tests/test_attention_train.c --backend cuda with SHARDLM_CUDA_TRAIN_ATTENTION=tc; the prefill:
 * tests/test_ops.c --backend cuda --filter attention (ctest ops_cuda, ops_cuda_attention_tc). */
#include <limits.h>
#include <mma.h>

#include "attention_prefill.cuh"
#include "attention_train.cuh"
#include "cuda_common.cuh"
#include "cuda_ops.h"

using namespace nvcuda;

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_TILE 64          /* query rows and keys per tile */
#define TC_SLD (TC_TILE + 4) /* f32 score tiles' row stride */
#define TC_PLD (TC_TILE + 8) /* 16-bit probability tiles' row stride */
#define TC_FULL 0xffffffffu

template <typename T> using frag_a = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using frag_b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
template <typename T> using frag_b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
using frag_acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

/* Rows first .. first + count - 1 of head h of x (rows, heads, HD) into dst (TC_TILE rows of
 * stride ld), in 16-byte vectors; rows past count are zero. All threads of the block. */
template <typename T, int HD>
__device__ __forceinline__ void tc_load_tile(T *dst, int ld, const T *x, int64_t first, int64_t count, int heads, int h)
{
    constexpr int VPR = HD / 8; /* vectors per row */
    for (int e = threadIdx.x; e < TC_TILE * VPR; e += blockDim.x) {
        const int r = e / VPR, c = e % VPR;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r < count) val = __ldg(reinterpret_cast<const uint4 *>(x + ((first + r) * heads + h) * HD) + c);
        *reinterpret_cast<uint4 *>(dst + r * ld + c * 8) = val;
    }
}

/* S (16 x TC_TILE f32, stride TC_SLD) = a (16 x HD, stride ld) . b^T, b (TC_TILE x HD, stride
 * ld): both 16-bit, in shared memory. One warp. */
template <typename T, int HD>
__device__ __forceinline__ void tc_scores(float *S, const T *a, const T *b, int ld)
{
    frag_acc c[TC_TILE / 16];
#pragma unroll
    for (int t = 0; t < TC_TILE / 16; t++) wmma::fill_fragment(c[t], 0.0f);
#pragma unroll
    for (int kk = 0; kk < HD; kk += 16) {
        frag_a<T> fa;
        wmma::load_matrix_sync(fa, a + kk, ld);
#pragma unroll
        for (int t = 0; t < TC_TILE / 16; t++) {
            frag_b_col<T> fb; /* b^T as a column-major matrix: element (d, j) at b[j * ld + d] */
            wmma::load_matrix_sync(fb, b + t * 16 * ld + kk, ld);
            wmma::mma_sync(c[t], fa, fb, c[t]);
        }
    }
#pragma unroll
    for (int t = 0; t < TC_TILE / 16; t++) wmma::store_matrix_sync(S + t * 16, c[t], TC_SLD, wmma::mem_row_major);
}

/* acc (16 x HD) += p (16 x TC_TILE, stride TC_PLD) . b (TC_TILE x HD, stride ld). One warp. */
template <typename T, int HD>
__device__ __forceinline__ void tc_accumulate(frag_acc (&acc)[HD / 16], const T *p, const T *b, int ld)
{
#pragma unroll
    for (int kk = 0; kk < TC_TILE; kk += 16) {
        frag_a<T> fa;
        wmma::load_matrix_sync(fa, p + kk, TC_PLD);
#pragma unroll
        for (int t = 0; t < HD / 16; t++) {
            frag_b_row<T> fb;
            wmma::load_matrix_sync(fb, b + kk * ld + t * 16, ld);
            wmma::mma_sync(acc[t], fa, fb, acc[t]);
        }
    }
}

/* The warp's 16 x HD fragments, through f32 shared memory O (16 x (HD + 4)), into rows r0 ..
 * of head h of x (n, heads, HD), rows before `end` only, rounded once. One warp. */
template <typename T, int HD>
__device__ __forceinline__ void tc_store_rows(T *x, float *O, frag_acc (&acc)[HD / 16], int64_t r0, int64_t end,
                                              int heads, int h)
{
#pragma unroll
    for (int t = 0; t < HD / 16; t++) wmma::store_matrix_sync(O + t * 16, acc[t], HD + 4, wmma::mem_row_major);
    __syncwarp();
    for (int e = threadIdx.x & 31; e < 16 * HD; e += 32) {
        const int r = e / HD, d = e % HD;
        if (r0 + r < end) cuda_store(x + ((r0 + r) * heads + h) * HD + d, O[r * (HD + 4) + d]);
    }
    __syncwarp();
}

/* The capped, scaled score of a raw product: z = softcap(scale * s). */
__device__ __forceinline__ float tc_score(float s, float scale, float softcap) { return cuda_softcap(s * scale, softcap); }

/* Shared memory of the forward: Qs, Ks, Vs (TC_TILE x ld, 16-bit) | S (warps x 16 x TC_SLD f32)
 * | P (warps x 16 x TC_PLD, 16-bit). Every region starts at a multiple of 32 bytes (WMMA). */
template <typename T>
static size_t tc_forward_smem(int hd)
{
    const size_t ld = (size_t)hd + 8;
    return 3 * TC_TILE * ld * sizeof(T) + TC_WARPS * 16 * (TC_SLD * sizeof(float) + TC_PLD * sizeof(T));
}

/* Where a forward block's keys come from. The training form: k and v hold the packed rows of q
 * themselves, doc_start's documents, causal or bidirectional. */
struct tc_packed_keys {
    const int32_t *doc_start;
    int            n_docs, window, bidirectional, n_kv_heads;
    int64_t        n;
    /* [lo, hi): the keys row attends to */
    __device__ void reach(int64_t row, int64_t &lo, int64_t &hi) const
    {
        lo = train_first_key(doc_start, n_docs, n, row, window);
        hi = bidirectional ? train_key_end(doc_start, n_docs, n, row, 0) : row + 1;
    }
    /* [kbeg, kend): the keys rows r0 .. r1 - 1 attend to, together */
    __device__ void span(int64_t r0, int64_t r1, int64_t &kbeg, int64_t &kend) const
    {
        kbeg = train_first_key(doc_start, n_docs, n, r0, window);
        kend = bidirectional ? train_key_end(doc_start, n_docs, n, r1 - 1, 0) : r1;
    }
    /* keys k0 .. of KV head kvh of x into dst, as tc_load_tile */
    template <typename T, int HD>
    __device__ void load(T *dst, int ld, const T *x, int64_t k0, int64_t count, int kvh) const
    {
        tc_load_tile<T, HD>(dst, ld, x, k0, count, n_kv_heads, kvh);
    }
};

/* Serving's prefill: tc_paged_keys (attention_prefill.cuh) and the load of a tile through it. */
struct tc_paged_source : tc_paged_keys {
    /* keys k0 .. k0 + min(count, TC_TILE) - 1 of KV head kvh of the cache (n_blocks, bt,
     * n_kv_heads, HD) into dst (TC_TILE rows of stride ld), 16-byte vectors; rows past count zero */
    template <typename T, int HD>
    __device__ void load(T *dst, int ld, const T *cache, int64_t k0, int64_t count, int kvh) const
    {
        constexpr int VPR = HD / 8;
        for (int e = threadIdx.x; e < TC_TILE * VPR; e += blockDim.x) {
            const int r = e / VPR, c = e % VPR;
            uint4 val = make_uint4(0, 0, 0, 0);
            if (r < count) {
                const int64_t at = cache_row(k0 + r);
                DEVICE_CHECK(at >= 0);
                val = __ldg(reinterpret_cast<const uint4 *>(cache + (at * n_kv_heads + kvh) * HD) + c);
            }
            *reinterpret_cast<uint4 *>(dst + r * ld + c * 8) = val;
        }
    }
};

/* The forward of query rows r0 .. r1 - 1 (at most TC_TILE) of head blockIdx.y, their keys from
 * `keys` (k and v as it reads them); lse nullptr: not stored. */
template <typename T, int HD, class Keys>
__device__ __forceinline__ void tc_forward_rows(T *out, float *lse, const T *q, const T *k, const T *v, int64_t r0,
                                                int64_t r1, int n_heads, int n_kv_heads, float scale, float softcap,
                                                const float *sinks, const Keys &keys)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int LD = HD + 8;
    T *Qs = reinterpret_cast<T *>(smem), *Ks = Qs + TC_TILE * LD, *Vs = Ks + TC_TILE * LD;
    float *Sall = reinterpret_cast<float *>(Vs + TC_TILE * LD);
    T *Pall = reinterpret_cast<T *>(Sall + TC_WARPS * 16 * TC_SLD);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rr = lane >> 1, c0 = (lane & 1) * 32;
    float *S = Sall + warp * 16 * TC_SLD;
    T *P = Pall + warp * 16 * TC_PLD;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int64_t row = r0 + warp * 16 + rr;
    const bool live = row < r1;
    int64_t lo = 0, hi = 0; /* the keys row attends to: [lo, hi) */
    if (live) keys.reach(row, lo, hi);
    int64_t kbeg, kend;
    keys.span(r0, r1, kbeg, kend);
    tc_load_tile<T, HD>(Qs, LD, q, r0, r1 - r0, n_heads, h);
    /* Pass 1: each row's max m and sum l of e^(z - m) (a sink starts it as one more score). A
     * NaN score poisons the row, as in the CUDA-core kernels. */
    float m = sinks ? sinks[h] : -INFINITY, l = sinks ? 1.0f : 0.0f;
    for (int64_t k0 = kbeg; k0 < kend; k0 += TC_TILE) {
        __syncthreads(); /* the previous tile is consumed */
        keys.template load<T, HD>(Ks, LD, k, k0, kend - k0, kvh);
        __syncthreads();
        tc_scores<T, HD>(S, Qs + warp * 16 * LD, Ks, LD);
        __syncwarp();
        float mx = -INFINITY;
        for (int c = c0; c < c0 + 32; c++) {
            const int64_t key = k0 + c;
            if (!live || key < lo || key >= hi) continue;
            const float z = tc_score(S[rr * TC_SLD + c], scale, softcap);
            if (z > mx || z != z) mx = z;
        }
        const float other = __shfl_xor_sync(TC_FULL, mx, 1);
        if (other > mx || other != other) mx = other;
        const bool any = mx != -INFINITY; /* pair-uniform: some key of the tile carries weight */
        const float mn = any && (mx > m || mx != mx) ? mx : m;
        float sum = 0.0f;
        for (int c = c0; any && c < c0 + 32; c++) {
            const int64_t key = k0 + c;
            if (key >= lo && key < hi) sum += expf(tc_score(S[rr * TC_SLD + c], scale, softcap) - mn);
        }
        sum += __shfl_xor_sync(TC_FULL, sum, 1); /* every lane of the warp, whichever rows carry weight */
        if (any) {
            l = l * expf(m - mn) + sum; /* e^(-inf) = 0 while m = -inf */
            m = mn;
        }
    }
    const float L = m + logf(l);
    if (lse && live && c0 == 0) lse[row * n_heads + h] = L;

    /* Pass 2: out = sum_j e^(z_j - lse) v_j, accumulated by the tensor cores. */
    frag_acc acc[HD / 16];
#pragma unroll
    for (int t = 0; t < HD / 16; t++) wmma::fill_fragment(acc[t], 0.0f);
    for (int64_t k0 = kbeg; k0 < kend; k0 += TC_TILE) {
        __syncthreads();
        keys.template load<T, HD>(Ks, LD, k, k0, kend - k0, kvh);
        keys.template load<T, HD>(Vs, LD, v, k0, kend - k0, kvh);
        __syncthreads();
        tc_scores<T, HD>(S, Qs + warp * 16 * LD, Ks, LD);
        __syncwarp();
        for (int c = c0; c < c0 + 32; c++) {
            const int64_t key = k0 + c;
            const bool valid = live && key >= lo && key < hi;
            cuda_store(P + rr * TC_PLD + c, valid ? expf(tc_score(S[rr * TC_SLD + c], scale, softcap) - L) : 0.0f);
        }
        __syncwarp();
        tc_accumulate<T, HD>(acc, P, Vs, LD);
    }
    __syncthreads(); /* Ks and Vs are free: their space holds the warps' f32 results */
    tc_store_rows<T, HD>(out, reinterpret_cast<float *>(Ks) + warp * 16 * (HD + 4), acc, r0 + warp * 16, r1,
                         n_heads, h);
}


template <typename T, int HD>
static __global__ void __launch_bounds__(TC_THREADS)
tc_forward_kernel(T *out, float *lse, const T *q, const T *k, const T *v, const int32_t *doc_start, int n_docs,
                  int64_t n, int n_heads, int n_kv_heads, float scale, int window, float softcap, int bidirectional,
                  const float *sinks)
{
    const int64_t r0 = (int64_t)blockIdx.x * TC_TILE, r1 = r0 + TC_TILE < n ? r0 + TC_TILE : n;
    const tc_packed_keys keys = {doc_start, n_docs, window, bidirectional, n_kv_heads, n};
    tc_forward_rows<T, HD>(out, lse, q, k, v, r0, r1, n_heads, n_kv_heads, scale, softcap, sinks, keys);
}

/* Serving's prefill (op_attention of a batch that is not decode-only): block (x, h) takes query
 * tile x of the sequences' new rows, each sequence's rows tiled on their own (a sequence of one
 * new row fills one row of its tile), head h; the grid's x bounds the tiles (rows / TC_TILE +
 * n_seqs), and blocks past the last tile return. */
template <typename T, int HD>
static __global__ void __launch_bounds__(TC_THREADS)
tc_prefill_kernel(T *out, const T *q, const T *k_cache, const T *v_cache, const int32_t *q_start,
                  const int32_t *seq_len, const int32_t *block_table, int n_seqs, int max_blocks, int bt,
                  int64_t n_blocks, int64_t n, int n_heads, int n_kv_heads, float scale, int window, float softcap,
                  const float *sinks)
{
    DEVICE_CHECK(q_start[0] == 0 && q_start[n_seqs] == n);
    int s;
    int64_t r0, r1;
    if (!prefill_tile(q_start, n_seqs, blockIdx.x, TC_TILE, &s, &r0, &r1)) return; /* block-uniform */
    const int64_t n_new = q_start[s + 1] - q_start[s];
    DEVICE_CHECK(n_new >= 0 && seq_len[s] >= n_new && seq_len[s] <= (int64_t)max_blocks * bt);
    tc_paged_source keys;
    keys.table = block_table + (int64_t)s * max_blocks, keys.q0 = q_start[s], keys.pos0 = seq_len[s] - n_new;
    keys.n_blocks = n_blocks, keys.bt = bt, keys.window = window, keys.n_kv_heads = n_kv_heads;
    tc_forward_rows<T, HD>(out, (float *)nullptr, q, k_cache, v_cache, r0, r1, n_heads, n_kv_heads, scale, softcap,
                           sinks, keys);
}

/* delta[i * n_heads + h] = dout[i, h, :] . out[i, h, :] in f32: one warp per (row, head). */
template <typename T>
static __global__ void tc_delta_kernel(float *delta, const T *dout, const T *out, int64_t rows, int hd)
{
    const int lane = threadIdx.x & 31;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; r < rows;
         r += (int64_t)gridDim.x * blockDim.x / 32) {
        float part = 0.0f;
        for (int d = lane; d < hd; d += 32) part += cuda_load(dout + r * hd + d) * cuda_load(out + r * hd + d);
        part = cuda_warp_sum(part);
        if (lane == 0) delta[r] = part;
    }
}

/* dS of one element: P (dP - D) times the soft cap's derivative, times scale (the product with
 * k or q then needs no scaling). 0 outside the row's reach. */
__device__ __forceinline__ float tc_ds(bool valid, float s, float dp, float L, float D, float scale, float softcap,
                                       float *p_out)
{
    if (!valid) {
        *p_out = 0.0f;
        return 0.0f;
    }
    const float z = tc_score(s, scale, softcap), p = expf(z - L);
    *p_out = p;
    return p * (dp - D) * cuda_softcap_grad(z, softcap) * scale;
}

/* Shared memory of dq: Qs, dOs, Ks, Vs (TC_TILE x ld) | S, dP (warps x 16 x TC_SLD f32) | dS
 * (warps x 16 x TC_PLD). */
template <typename T>
static size_t tc_dq_smem(int hd)
{
    const size_t ld = (size_t)hd + 8;
    return 4 * TC_TILE * ld * sizeof(T) + TC_WARPS * 16 * (2 * TC_SLD * sizeof(float) + TC_PLD * sizeof(T));
}

template <typename T, int HD>
static __global__ void __launch_bounds__(TC_THREADS)
tc_dq_kernel(T *dq, const T *dout, const float *lse, const float *delta, const T *q, const T *k, const T *v,
             const int32_t *doc_start, int n_docs, int64_t n, int n_heads, int n_kv_heads, float scale, int window,
             float softcap)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int LD = HD + 8;
    T *Qs = reinterpret_cast<T *>(smem), *dOs = Qs + TC_TILE * LD, *Ks = dOs + TC_TILE * LD, *Vs = Ks + TC_TILE * LD;
    float *Sall = reinterpret_cast<float *>(Vs + TC_TILE * LD), *dPall = Sall + TC_WARPS * 16 * TC_SLD;
    T *dSall = reinterpret_cast<T *>(dPall + TC_WARPS * 16 * TC_SLD);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rr = lane >> 1, c0 = (lane & 1) * 32;
    float *S = Sall + warp * 16 * TC_SLD, *dP = dPall + warp * 16 * TC_SLD;
    T *dS = dSall + warp * 16 * TC_PLD;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int64_t r0 = (int64_t)blockIdx.x * TC_TILE, r1 = r0 + TC_TILE < n ? r0 + TC_TILE : n;
    const int64_t row = r0 + warp * 16 + rr;
    const bool live = row < r1;
    int64_t lo = 0;
    float L = 0.0f, D = 0.0f;
    if (live) {
        lo = train_first_key(doc_start, n_docs, n, row, window);
        L = lse[row * n_heads + h];
        D = delta[row * n_heads + h];
    }
    tc_load_tile<T, HD>(Qs, LD, q, r0, r1 - r0, n_heads, h);
    tc_load_tile<T, HD>(dOs, LD, dout, r0, r1 - r0, n_heads, h);
    frag_acc acc[HD / 16];
#pragma unroll
    for (int t = 0; t < HD / 16; t++) wmma::fill_fragment(acc[t], 0.0f);
    for (int64_t k0 = train_first_key(doc_start, n_docs, n, r0, window); k0 < r1; k0 += TC_TILE) {
        __syncthreads();
        tc_load_tile<T, HD>(Ks, LD, k, k0, r1 - k0, n_kv_heads, kvh);
        tc_load_tile<T, HD>(Vs, LD, v, k0, r1 - k0, n_kv_heads, kvh);
        __syncthreads();
        tc_scores<T, HD>(S, Qs + warp * 16 * LD, Ks, LD);
        tc_scores<T, HD>(dP, dOs + warp * 16 * LD, Vs, LD);
        __syncwarp();
        for (int c = c0; c < c0 + 32; c++) {
            const int64_t key = k0 + c;
            float p;
            const float ds = tc_ds(live && key >= lo && key <= row, S[rr * TC_SLD + c], dP[rr * TC_SLD + c], L, D,
                                   scale, softcap, &p);
            cuda_store(dS + rr * TC_PLD + c, ds);
        }
        __syncwarp();
        tc_accumulate<T, HD>(acc, dS, Ks, LD);
    }
    __syncthreads();
    tc_store_rows<T, HD>(dq, reinterpret_cast<float *>(Ks) + warp * 16 * (HD + 4), acc, r0 + warp * 16, r1,
                         n_heads, h);
}

/* Shared memory of dk, dv: Ks, Vs, Qs, dOs (TC_TILE x ld) | S^T, dP^T (warps x 16 x TC_SLD f32)
 * | P^T, dS^T (warps x 16 x TC_PLD) | per query of the tile: its first key (int64), lse, D. */
template <typename T>
static size_t tc_dkdv_smem(int hd)
{
    const size_t ld = (size_t)hd + 8;
    return 4 * TC_TILE * ld * sizeof(T) + TC_WARPS * 16 * 2 * (TC_SLD * sizeof(float) + TC_PLD * sizeof(T)) +
           TC_TILE * (sizeof(int64_t) + 2 * sizeof(float));
}

template <typename T, int HD>
static __global__ void __launch_bounds__(TC_THREADS)
tc_dkdv_kernel(T *dk, T *dv, const T *dout, const float *lse, const float *delta, const T *q, const T *k,
               const T *v, const int32_t *doc_start, int n_docs, int64_t n, int n_heads, int n_kv_heads, float scale,
               int window, float softcap)
{
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int LD = HD + 8;
    T *Ks = reinterpret_cast<T *>(smem), *Vs = Ks + TC_TILE * LD, *Qs = Vs + TC_TILE * LD, *dOs = Qs + TC_TILE * LD;
    float *Sall = reinterpret_cast<float *>(dOs + TC_TILE * LD), *dPall = Sall + TC_WARPS * 16 * TC_SLD;
    T *Pall = reinterpret_cast<T *>(dPall + TC_WARPS * 16 * TC_SLD), *dSall = Pall + TC_WARPS * 16 * TC_PLD;
    int64_t *qlo = reinterpret_cast<int64_t *>(dSall + TC_WARPS * 16 * TC_PLD);
    float *qL = reinterpret_cast<float *>(qlo + TC_TILE), *qD = qL + TC_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rr = lane >> 1, c0 = (lane & 1) * 32;
    float *St = Sall + warp * 16 * TC_SLD, *dPt = dPall + warp * 16 * TC_SLD;
    T *Pt = Pall + warp * 16 * TC_PLD, *dSt = dSall + warp * 16 * TC_PLD;
    const int kvh = blockIdx.y, group = n_heads / n_kv_heads;
    const int64_t j0 = (int64_t)blockIdx.x * TC_TILE, j1 = j0 + TC_TILE < n ? j0 + TC_TILE : n;
    const int64_t key = j0 + warp * 16 + rr;
    tc_load_tile<T, HD>(Ks, LD, k, j0, j1 - j0, n_kv_heads, kvh);
    tc_load_tile<T, HD>(Vs, LD, v, j0, j1 - j0, n_kv_heads, kvh);
    /* The rows that attend to the block's keys: from its first key (causal) to the reach of its
     * last (non-decreasing in the key). */
    const int64_t qend = train_key_end(doc_start, n_docs, n, j1 - 1, window);
    frag_acc dK[HD / 16], dV[HD / 16];
#pragma unroll
    for (int t = 0; t < HD / 16; t++) {
        wmma::fill_fragment(dK[t], 0.0f);
        wmma::fill_fragment(dV[t], 0.0f);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++)
        for (int64_t q0 = j0; q0 < qend; q0 += TC_TILE) {
            __syncthreads(); /* the previous tile is consumed */
            tc_load_tile<T, HD>(Qs, LD, q, q0, qend - q0, n_heads, h);
            tc_load_tile<T, HD>(dOs, LD, dout, q0, qend - q0, n_heads, h);
            for (int t = threadIdx.x; t < TC_TILE; t += blockDim.x) {
                const int64_t i = q0 + t;
                const bool in = i < qend;
                qlo[t] = in ? train_first_key(doc_start, n_docs, n, i, window) : LLONG_MAX;
                qL[t] = in ? lse[i * n_heads + h] : 0.0f;
                qD[t] = in ? delta[i * n_heads + h] : 0.0f;
            }
            __syncthreads();
            tc_scores<T, HD>(St, Ks + warp * 16 * LD, Qs, LD);
            tc_scores<T, HD>(dPt, Vs + warp * 16 * LD, dOs, LD);
            __syncwarp();
            for (int c = c0; c < c0 + 32; c++) {
                const int64_t i = q0 + c;
                float p;
                const float ds = tc_ds(key < j1 && qlo[c] <= key && key <= i, St[rr * TC_SLD + c],
                                       dPt[rr * TC_SLD + c], qL[c], qD[c], scale, softcap, &p);
                cuda_store(Pt + rr * TC_PLD + c, p);
                cuda_store(dSt + rr * TC_PLD + c, ds);
            }
            __syncwarp();
            tc_accumulate<T, HD>(dV, Pt, dOs, LD);
            tc_accumulate<T, HD>(dK, dSt, Qs, LD);
        }
    __syncthreads(); /* Qs and dOs are free: their space holds the warps' f32 results */
    float *O = reinterpret_cast<float *>(Qs) + warp * 16 * (HD + 4);
    tc_store_rows<T, HD>(dk, O, dK, j0 + warp * 16, j1, n_kv_heads, kvh);
    tc_store_rows<T, HD>(dv, O, dV, j0 + warp * 16, j1, n_kv_heads, kvh);
}

/* ---- host side ----------------------------------------------------------------------------- */

static int tc_aligned(const struct tensor *t) { return t->data && (uintptr_t)t->data % 16 == 0; }

int cuda_attention_train_tc_fits(const struct cuda_state *s, const struct tensor *q, const struct tensor *k,
                                 const struct tensor *v)
{
    const int64_t hd = q->shape[2];
    /* head_dim 96 (Phi-3) only when forced (SHARDLM_CUDA_TRAIN_ATTENTION=tc): no case of it had run
     * on a GPU when this form became the default (2026-12-04); 32, 64 and 128 had. */
    return s->train_attention_tc && (q->dtype == DTYPE_BF16 || q->dtype == DTYPE_F16) &&
           (hd == 32 || hd == 64 || hd == 128 || (hd == 96 && s->train_attention_tc == 2)) && tc_aligned(q) &&
           tc_aligned(k) && tc_aligned(v);
}

/* Calls F<T, HD> for the dtype and head_dim (cuda_attention_train_tc_fits holds). */
#define TC_DISPATCH(dtype, hd, F)                                                                 \
    do {                                                                                          \
        if ((dtype) == DTYPE_BF16) TC_DISPATCH_HD(__nv_bfloat16, hd, F);                          \
        else TC_DISPATCH_HD(__half, hd, F);                                                       \
    } while (0)
#define TC_DISPATCH_HD(T, hd, F)                                                                  \
    do {                                                                                          \
        switch (hd) {                                                                             \
        case 32: F(T, 32); break;                                                                 \
        case 64: F(T, 64); break;                                                                 \
        case 96: F(T, 96); break;                                                                 \
        default: F(T, 128); break;                                                                \
        }                                                                                         \
    } while (0)

void cuda_attention_train_tc(struct backend *b, const struct tensor *out, const struct tensor *lse,
                             const struct tensor *q, const struct tensor *k, const struct tensor *v,
                             const struct attention_train_batch *batch)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2];
    CHECK(tc_aligned(out), "attention_train: out is not 16-byte aligned");
    const dim3 grid((unsigned)((n + TC_TILE - 1) / TC_TILE), (unsigned)n_heads);
#define TC_FORWARD(T, HD)                                                                         \
    do {                                                                                          \
        const size_t smem = tc_forward_smem<T>(HD);                                               \
        CUDA_CHECK(cudaFuncSetAttribute(tc_forward_kernel<T, HD>,                                 \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)); \
        tc_forward_kernel<T, HD><<<grid, TC_THREADS, smem, s->stream>>>(                          \
            (T *)out->data, (float *)lse->data, (const T *)q->data, (const T *)k->data,           \
            (const T *)v->data, (const int32_t *)batch->doc_start.data, batch->n_docs, n,         \
            (int)n_heads, (int)k->shape[1], batch->scale, batch->window, batch->softcap,          \
            batch->bidirectional, (const float *)batch->sinks.data);                              \
        LAUNCH_CHECK();                                                                           \
    } while (0)
    TC_DISPATCH(q->dtype, hd, TC_FORWARD);
#undef TC_FORWARD
}

int cuda_attention_prefill_tc(struct backend *b, const struct tensor *out, const struct tensor *q,
                              const struct tensor *k_cache, const struct tensor *v_cache,
                              const struct attention_batch *batch)
{
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2];
    if (q->dtype == DTYPE_F32 || k_cache->dtype != q->dtype || v_cache->dtype != q->dtype ||
        !(hd == 32 || hd == 64 || hd == 128) || !tc_aligned(out) || !tc_aligned(q) ||
        !tc_aligned(k_cache) || !tc_aligned(v_cache))
        return 0;
    struct cuda_state *s = cuda_state_enter(b);
    const dim3 grid((unsigned)((n + TC_TILE - 1) / TC_TILE + batch->n_seqs), (unsigned)n_heads);
#define TC_PREFILL(T, HD)                                                                          \
    do {                                                                                           \
        const size_t smem = tc_forward_smem<T>(HD);                                                \
        CUDA_CHECK(cudaFuncSetAttribute(tc_prefill_kernel<T, HD>,                                  \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));  \
        tc_prefill_kernel<T, HD><<<grid, TC_THREADS, smem, s->stream>>>(                           \
            (T *)out->data, (const T *)q->data, (const T *)k_cache->data, (const T *)v_cache->data, \
            (const int32_t *)batch->q_start.data, (const int32_t *)batch->seq_len.data,            \
            (const int32_t *)batch->block_table.data, batch->n_seqs, batch->max_blocks,            \
            batch->block_tokens, k_cache->shape[0], n, (int)n_heads, (int)k_cache->shape[2],       \
            batch->scale, batch->window, batch->softcap, (const float *)batch->sinks.data);        \
        LAUNCH_CHECK();                                                                            \
    } while (0)
    TC_DISPATCH(q->dtype, hd, TC_PREFILL);
#undef TC_PREFILL
    return 1;
}

void cuda_attention_train_tc_backward(struct backend *b, const struct tensor *dq, const struct tensor *dk,
                                      const struct tensor *dv, const struct tensor *dout, const struct tensor *out,
                                      const struct tensor *lse, const struct tensor *q, const struct tensor *k,
                                      const struct tensor *v, const struct attention_train_batch *batch)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2], n_kv = k->shape[1];
    CHECK(tc_aligned(dq) && tc_aligned(dk) && tc_aligned(dv) && tc_aligned(dout),
          "attention_train_backward: a gradient is not 16-byte aligned");
    float *delta = (float *)cuda_scratch(b, (size_t)n * (size_t)n_heads * sizeof(float));
    const dim3 grid_q((unsigned)((n + TC_TILE - 1) / TC_TILE), (unsigned)n_heads);
    const dim3 grid_kv((unsigned)((n + TC_TILE - 1) / TC_TILE), (unsigned)n_kv);
#define TC_BACKWARD(T, HD)                                                                        \
    do {                                                                                          \
        tc_delta_kernel<T><<<cuda_blocks_for(n * n_heads, CUDA_THREADS / 32), CUDA_THREADS, 0,    \
                             s->stream>>>(delta, (const T *)dout->data, (const T *)out->data,     \
                                          n * n_heads, (int)hd);                                  \
        LAUNCH_CHECK();                                                                           \
        const size_t smem_q = tc_dq_smem<T>(HD), smem_kv = tc_dkdv_smem<T>(HD);                   \
        CUDA_CHECK(cudaFuncSetAttribute(tc_dq_kernel<T, HD>,                                      \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q)); \
        tc_dq_kernel<T, HD><<<grid_q, TC_THREADS, smem_q, s->stream>>>(                           \
            (T *)dq->data, (const T *)dout->data, (const float *)lse->data, delta,                \
            (const T *)q->data, (const T *)k->data, (const T *)v->data,                           \
            (const int32_t *)batch->doc_start.data, batch->n_docs, n, (int)n_heads, (int)n_kv,    \
            batch->scale, batch->window, batch->softcap);                                         \
        LAUNCH_CHECK();                                                                           \
        CUDA_CHECK(cudaFuncSetAttribute(tc_dkdv_kernel<T, HD>,                                    \
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv)); \
        tc_dkdv_kernel<T, HD><<<grid_kv, TC_THREADS, smem_kv, s->stream>>>(                       \
            (T *)dk->data, (T *)dv->data, (const T *)dout->data, (const float *)lse->data, delta,  \
            (const T *)q->data, (const T *)k->data, (const T *)v->data,                           \
            (const int32_t *)batch->doc_start.data, batch->n_docs, n, (int)n_heads, (int)n_kv,    \
            batch->scale, batch->window, batch->softcap);                                         \
        LAUNCH_CHECK();                                                                           \
    } while (0)
    TC_DISPATCH(q->dtype, hd, TC_BACKWARD);
#undef TC_BACKWARD
}
