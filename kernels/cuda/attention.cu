/* kernels/cuda/attention.cu - op_attention: causal grouped-query attention over the paged KV
 * cache for a batch that mixes prefill chunks and decode rows (struct attention_batch).
 * Two kernels:
 * - attention_kernel, the simple one and the reference-shaped version: one thread block per
 *   (query row, query head). Its warps share the key positions round-robin; each warp runs an
 *   online softmax in f32 over its positions (lane l holds features l, l + 32, ... of q and of
 *   the output accumulator), and the warps' partial results are merged at the end.
 * - attention_decode_split_k, for decode (FlashDecoding / paged attention v2): one thread block
 *   per (query row, KV head, tile of up to 8 of its query heads, split of the row's range),
 *   so that a K/V row is read once for all the query heads of a GQA group; 16-byte loads of
 *   K/V rows, the chunk's block ids staged in shared memory; each split writes an f32 partial
 *   (max, sum, acc) and a combine kernel merges them by log-sum-exp. It handles any batch (one
 *   query row at a time), but is chosen for decode batches (attention_batch.decode_only) with
 *   head_dim a multiple of 8; SHARDLM_CUDA_ATTENTION=simple|split (enum cuda_attention_mode)
 *   forces one or the other. It ran on an H100 (2026-11-28) and an H200 (2026-12-04;
 *   docs/cuda.md).
 * Like the CPU reference, both scale q before the dot products and output acc * (1 / sum).
 * Attention sinks (attention_batch.sinks, GPT-OSS) join the denominator once per query vector:
 * in attention_kernel's merge of its warps, in the split-K kernel's merge when it has one split
 * (it writes the output itself), otherwise in the combine kernel; never in a partial, which
 * would count the sink once per split.
 * A third, for prefill chunks and mixed batches where it fits (16-bit, head_dim 32, 64 or 128):
 * the tensor-core forward of the training attention reading K and V through the block table
 * (cuda_attention_prefill_tc, attention_train_tc.cu; SHARDLM_CUDA_ATTENTION=tc forces it on decode
 * batches too). Written 2026-12-07, NOT yet run on a GPU: by default its first batch of each dtype
 * and head_dim also runs the simple kernel and keeps it there and from then on if the two
 * disagree (tc_prefill_first).
 * Not here: writing the cache (kv_write.cu).
 * Tests: tests/test_ops.c --backend cuda (prefill, decode, mixed batches, GQA, windows, block
 * sizes that do not divide the length, head_dim up to 256; "split decode" cases for the
 * split-K kernel; "sinks" cases for attention sinks, decode ones with one split and several;
 * ctest runs the attention cases again with each kernel forced); benchmark:
 * tests/bench_cuda.c (both kernels against the device's copy bandwidth). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>

#include "attention_train.cuh"
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define ATTENTION_WARPS 4
#define ATTENTION_THREADS (ATTENTION_WARPS * 32)
#define ATTENTION_MAX_HEAD_DIM 256
#define ATTENTION_DIMS_PER_LANE (ATTENTION_MAX_HEAD_DIM / 32)

/* The sequence whose query rows contain row t: the last s with q_start[s] <= t (empty
 * sequences before it share its q_start and are skipped by taking the last). */
__device__ __forceinline__ int attention_seq_of_row(const int32_t *q_start, int n_seqs, int64_t t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* e^(sink - m), the weight of an attention sink under the running max m >= sink; 0 for no sink
 * (sink = -inf: none, or a caller's -inf), where e^(-inf - -inf) would be NaN. */
__device__ __forceinline__ float attention_sink_weight(float sink, float m)
{
    return sink == -INFINITY ? 0.0f : expf(sink - m);
}

/* q, out (n, n_heads, head_dim); k_cache, v_cache (n_blocks, block_tokens, n_kv_heads,
 * head_dim); q_start i32 (n_seqs + 1); seq_len i32 (n_seqs); block_table i32 (n_seqs,
 * max_blocks); sinks f32 (n_heads) or nullptr (none). The DEVICE_CHECKs are the CPU
 * reference's CHECKs on the batch description, which lives in device memory here. */
template <typename T>
static __global__ void __launch_bounds__(ATTENTION_THREADS)
attention_kernel(T *out, const T *q, const T *k_cache, const T *v_cache, const int32_t *q_start,
                 const int32_t *seq_len, const int32_t *block_table, int64_t n, int n_heads,
                 int n_kv_heads, int head_dim, int64_t n_blocks, int n_seqs, int block_tokens,
                 int max_blocks, float scale, int window, float softcap, const float *sinks)
{
    __shared__ float warp_max[ATTENTION_WARPS];
    __shared__ float warp_sum[ATTENTION_WARPS];
    __shared__ float warp_acc[ATTENTION_WARPS][ATTENTION_MAX_HEAD_DIM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = n_heads / n_kv_heads;
    const int64_t slot_stride = (int64_t)n_kv_heads * head_dim; /* elements per cache slot */

    for (int64_t item = blockIdx.x; item < n * n_heads; item += gridDim.x) {
        const int64_t t = item / n_heads;
        const int h = (int)(item % n_heads), kvh = h / group;

        DEVICE_CHECK(q_start[0] == 0 && q_start[n_seqs] == n);
        const int s = attention_seq_of_row(q_start, n_seqs, t);
        const int64_t n_new = q_start[s + 1] - q_start[s];
        DEVICE_CHECK(n_new >= 0 && seq_len[s] >= n_new &&
                     seq_len[s] <= (int64_t)max_blocks * block_tokens);
        const int64_t pos = seq_len[s] - n_new + (t - q_start[s]);
        DEVICE_CHECK(pos < seq_len[s]); /* fails only when q_start decreases somewhere */
        const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
        const int32_t *blocks = block_table + (int64_t)s * max_blocks;

        const int64_t q_off = (t * n_heads + h) * head_dim;
        float qv[ATTENTION_DIMS_PER_LANE], acc[ATTENTION_DIMS_PER_LANE];
#pragma unroll
        for (int i = 0; i < ATTENTION_DIMS_PER_LANE; i++) {
            int d = lane + 32 * i;
            qv[i] = d < head_dim ? cuda_load(q + q_off + d) * scale : 0.0f;
            acc[i] = 0.0f;
        }

        /* Online softmax over this warp's positions: m is the running max score, l the sum of
         * exp(score - m), acc the exp-weighted sum of V rows. */
        float m = -INFINITY, l = 0.0f;
        for (int64_t p = first + warp; p <= pos; p += ATTENTION_WARPS) {
            const int32_t blk = blocks[p / block_tokens];
            DEVICE_CHECK(blk >= 0 && blk < n_blocks);
            const int64_t kv_off =
                ((int64_t)blk * block_tokens + p % block_tokens) * slot_stride +
                (int64_t)kvh * head_dim;
            float dot = 0.0f;
#pragma unroll
            for (int i = 0; i < ATTENTION_DIMS_PER_LANE; i++) {
                int d = lane + 32 * i;
                if (d < head_dim) dot += qv[i] * cuda_load(k_cache + kv_off + d);
            }
            const float score = cuda_softcap(cuda_warp_sum(dot), softcap);
            const float m_new = fmaxf(m, score);
            /* Only -inf scores so far (an infinite input): nothing carries weight yet, and
             * exp(-inf - -inf) would be NaN. A NaN score is not skipped: it poisons l and acc,
             * as it does on the CPU. */
            if (m_new == -INFINITY && !isnan(score)) continue;
            const float corr = expf(m - m_new); /* 0 on the first position: m = -inf */
            const float w = expf(score - m_new);
            l = l * corr + w;
#pragma unroll
            for (int i = 0; i < ATTENTION_DIMS_PER_LANE; i++) {
                int d = lane + 32 * i;
                if (d < head_dim) acc[i] = acc[i] * corr + w * cuda_load(v_cache + kv_off + d);
            }
            m = m_new;
        }

        /* Merge the warps: rescale each to the overall max. A warp that saw no position
         * (m = -inf, l = 0, acc = 0) contributes nothing. The sink, if any, joins the max and
         * the sum here, once (it has no value row). */
        if (lane == 0) {
            warp_max[warp] = m;
            warp_sum[warp] = l;
        }
#pragma unroll
        for (int i = 0; i < ATTENTION_DIMS_PER_LANE; i++) {
            int d = lane + 32 * i;
            if (d < head_dim) warp_acc[warp][d] = acc[i];
        }
        __syncthreads();
        const float sink = sinks ? sinks[h] : -INFINITY;
        float m_all = sink;
        for (int w = 0; w < ATTENTION_WARPS; w++) m_all = fmaxf(m_all, warp_max[w]);
        float weight[ATTENTION_WARPS];
        float l_all = attention_sink_weight(sink, m_all);
        for (int w = 0; w < ATTENTION_WARPS; w++) {
            weight[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - m_all);
            l_all += warp_sum[w] * weight[w];
        }
        const float inv = 1.0f / l_all; /* l_all >= 1: the max (score or sink) contributes exp(0) */
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < ATTENTION_WARPS; w++) o += warp_acc[w][d] * weight[w];
            cuda_store(out + q_off + d, o * inv);
        }
        __syncthreads(); /* the next item rewrites the shared merge buffers */
    }
}

/* ---- the split-K decode kernel ------------------------------------------------------------ */

#define SPLIT_WARPS 4
#define SPLIT_THREADS (SPLIT_WARPS * 32)
#define SPLIT_TILE 256       /* positions whose block ids are staged in shared memory at a time */
#define SPLIT_MAX_SPLITS 128 /* splits per query row, at most (grid.y and the combine's loop) */

/* 16-byte loads of cache rows: N elements of T per uint4, widened to f32 (cuda_common.cuh). */
template <typename T> using attention_vec = cuda_vec<T>;

/* exp(x - m) with m = -inf read as 0: a state that has seen only -inf scores (or none) has
 * m = -inf, and exp(-inf - -inf) would be NaN; this way it gets weight 0 and a NaN score still
 * poisons the sums, as on the CPU. */
__device__ __forceinline__ float attention_max_or_zero(float m) { return m == -INFINITY ? 0.0f : m; }

/* One thread block per (query row t, KV head kvh, tile of up to GMAX of its query heads) and
 * split c = blockIdx.y: the row's attended range [first, pos] is cut into gridDim.y chunks of
 * `chunk` positions from `first`; this block runs an online softmax over chunk c for all its
 * query heads at once, so that each K/V row is loaded once for the heads of a KV group.
 *
 * Inside the block, a warp takes SPLIT_WARPS-strided iterations of kpw * U positions: a position
 * is served by lpk lanes (a power of two >= the row's head_dim / VEC 16-byte vectors, at most
 * 32), each holding VEC (or, for f32 rows of more than 128 features, 2 VEC) features of q for
 * every head, of the key and value rows, and of the accumulators. The dot products are summed
 * across the lpk lanes with shuffles. Each group of lpk lanes keeps its own (m, l, acc) per
 * head; the groups of a warp, then the warps, are merged at the end with the usual rescaling.
 *
 * With gridDim.y == 1 the block writes the output row itself (acc / l, the sink, if any, joined
 * to the max and the sum there); otherwise it writes
 * its partial, unnormalised, to part_acc (n, n_heads, n_splits, head_dim) and (m, l) to
 * part_ml (n, n_heads, n_splits), and an empty chunk writes (m, l) = (-inf, 0), which the
 * combine kernel skips (the combine adds the sink). Shapes as in attention_kernel; head_dim a
 * multiple of 8 and <=
 * ATTENTION_MAX_HEAD_DIM; k_cache, v_cache 16-byte aligned. */
template <typename T, int GMAX>
static __global__ void __launch_bounds__(SPLIT_THREADS)
attention_decode_split_k_kernel(T *out, float *part_acc, float2 *part_ml, const T *q,
                                const T *k_cache, const T *v_cache, const int32_t *q_start,
                                const int32_t *seq_len, const int32_t *block_table, int n_heads,
                                int n_kv_heads, int head_dim, int64_t n_blocks, int n_seqs,
                                int block_tokens, int max_blocks, float scale, int window,
                                float softcap, const float *sinks, int head_tiles, int chunk,
                                int64_t n)
{
    constexpr int VEC = attention_vec<T>::N;
    constexpr int NVL = ATTENTION_MAX_HEAD_DIM / (32 * VEC); /* vectors per lane: 1, or 2 (f32) */
    constexpr int E = NVL * VEC;                             /* features per lane: 8 */
    constexpr int U = 4 / NVL; /* positions per lane per iteration: 4, or 2 (f32) */

    __shared__ int32_t s_blocks[SPLIT_TILE + 2];
    __shared__ float s_m[SPLIT_WARPS][GMAX], s_l[SPLIT_WARPS][GMAX];
    __shared__ float s_acc[SPLIT_WARPS][GMAX][ATTENTION_MAX_HEAD_DIM];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = n_heads / n_kv_heads;
    const int n_vec = head_dim / VEC; /* 16-byte vectors per row of one head */
    int lpk = 1;                      /* lanes per position */
    while (lpk < n_vec && lpk < 32) lpk <<= 1;
    const int kpw = 32 / lpk; /* positions per warp and pass */
    const int sub = lane & (lpk - 1), kg = lane / lpk;
    const int per_iter = kpw * U; /* positions per warp and iteration */
    const int64_t slot_stride = (int64_t)n_kv_heads * head_dim; /* elements per cache slot */

    const int ht = (int)(blockIdx.x % head_tiles);
    const int kvh = (int)(blockIdx.x / head_tiles % n_kv_heads);
    const int64_t t = (int64_t)(blockIdx.x / head_tiles / n_kv_heads);
    const int split = blockIdx.y, n_splits = gridDim.y;
    const int h0 = kvh * group + ht * GMAX;              /* first query head of this block */
    const int n_g = min(GMAX, group - ht * GMAX);         /* query heads of this block */

    DEVICE_CHECK(q_start[0] == 0 && q_start[n_seqs] == n);
    const int s = attention_seq_of_row(q_start, n_seqs, t);
    const int n_new = q_start[s + 1] - q_start[s];
    DEVICE_CHECK(n_new >= 0 && seq_len[s] >= n_new &&
                 seq_len[s] <= (int64_t)max_blocks * block_tokens);
    const int pos = (int)(seq_len[s] - n_new + (t - q_start[s]));
    DEVICE_CHECK(pos < seq_len[s]); /* fails only when q_start decreases somewhere */
    const int first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
    const int32_t *blocks = block_table + (int64_t)s * max_blocks;
    /* This split's positions c0 .. c1 (inclusive); the host made n_splits * chunk cover any
     * range [first, pos] the batch allows. */
    const int64_t c0 = first + (int64_t)split * chunk;
    const int c1 = (int)min((int64_t)pos, c0 + chunk - 1);
    const int64_t vec0 = (t * n_heads + h0); /* query vector of head h0 of row t */

    if (c0 > c1) { /* an empty chunk (only when n_splits > 1): nothing to attend */
        if ((int)threadIdx.x < n_g)
            part_ml[(vec0 + threadIdx.x) * n_splits + split] = make_float2(-INFINITY, 0.0f);
        return;
    }

    /* q of this lane's features for each head, scaled; zero where the lane has no feature (the
     * dot products then ignore it). */
    float qf[GMAX][E], acc[GMAX][E], m[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < NVL; i++) {
            const int vi = sub + lpk * i;
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const int d = vi * VEC + e;
                qf[g][i * VEC + e] = g < n_g && vi < n_vec
                                         ? cuda_load(q + (vec0 + g) * head_dim + d) * scale
                                         : 0.0f;
                acc[g][i * VEC + e] = 0.0f;
            }
        }
    }

    for (int ts = (int)c0; ts <= c1; ts += SPLIT_TILE) {
        const int te = min(c1, ts + SPLIT_TILE - 1), tile_n = te - ts + 1;
        const int b0 = ts / block_tokens, nb = te / block_tokens - b0 + 1; /* nb <= TILE + 1 */
        __syncthreads(); /* every warp is done with the previous tile's block ids */
        for (int i = threadIdx.x; i < nb; i += SPLIT_THREADS) {
            const int32_t blk = blocks[b0 + i];
            DEVICE_CHECK(blk >= 0 && blk < n_blocks);
            s_blocks[i] = blk;
        }
        __syncthreads();

        for (int base = warp * per_iter; base < tile_n; base += SPLIT_WARPS * per_iter) {
            /* Load first (2 U NVL 16-byte loads in flight per lane), then compute. */
            uint4 kr[U][NVL], vr[U][NVL];
            bool valid[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int kk = base + u * kpw + kg; /* position ts + kk */
                valid[u] = kk < tile_n;
                int64_t off = 0;
                if (valid[u]) {
                    const int p = ts + kk;
                    off = ((int64_t)s_blocks[p / block_tokens - b0] * block_tokens +
                           p % block_tokens) * slot_stride + (int64_t)kvh * head_dim;
                }
#pragma unroll
                for (int i = 0; i < NVL; i++) {
                    const int vi = sub + lpk * i;
                    if (valid[u] && vi < n_vec) {
                        kr[u][i] = __ldg(reinterpret_cast<const uint4 *>(k_cache + off + vi * VEC));
                        vr[u][i] = __ldg(reinterpret_cast<const uint4 *>(v_cache + off + vi * VEC));
                    } else { /* zeros: never read a slot outside the range (it may hold NaN) */
                        kr[u][i] = make_uint4(0, 0, 0, 0);
                        vr[u][i] = make_uint4(0, 0, 0, 0);
                    }
                }
            }

            /* Scores: sc[u][g] = q_g . k_u, summed over the lpk lanes of the position. */
            float sc[U][GMAX];
#pragma unroll
            for (int u = 0; u < U; u++) {
                float kf[E];
#pragma unroll
                for (int i = 0; i < NVL; i++) attention_vec<T>::widen(kr[u][i], kf + i * VEC);
#pragma unroll
                for (int g = 0; g < GMAX; g++) {
                    float dot = 0.0f;
#pragma unroll
                    for (int e = 0; e < E; e++) dot += qf[g][e] * kf[e];
                    for (int o = 1; o < lpk; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                    sc[u][g] = valid[u] ? cuda_softcap(dot, softcap) : -INFINITY;
                }
            }

            /* Online softmax over the U positions at once: one rescale per iteration; sc
             * becomes the weights exp(score - max). */
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                float mx = m[g];
#pragma unroll
                for (int u = 0; u < U; u++) mx = fmaxf(mx, sc[u][g]);
                const float mu = attention_max_or_zero(mx);
                const float corr = expf(m[g] - mu); /* 0 while m = -inf */
                float sum = 0.0f;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    sc[u][g] = expf(sc[u][g] - mu); /* 0 for positions out of range */
                    sum += sc[u][g];
                }
                l[g] = l[g] * corr + sum;
#pragma unroll
                for (int e = 0; e < E; e++) acc[g][e] *= corr;
                m[g] = mx;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                float vf[E];
#pragma unroll
                for (int i = 0; i < NVL; i++) attention_vec<T>::widen(vr[u][i], vf + i * VEC);
#pragma unroll
                for (int g = 0; g < GMAX; g++)
#pragma unroll
                    for (int e = 0; e < E; e++) acc[g][e] += sc[u][g] * vf[e];
            }
        }
    }

    /* Merge the kpw position groups of the warp (lanes lane ^ o, o >= lpk, hold the same
     * features), then the warps through shared memory. A group or warp that saw no position
     * (m = -inf, l = 0, acc = 0) contributes nothing. */
    for (int o = lpk; o < 32; o <<= 1) {
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            const float m_o = __shfl_xor_sync(0xffffffffu, m[g], o);
            const float l_o = __shfl_xor_sync(0xffffffffu, l[g], o);
            const float mx = fmaxf(m[g], m_o), mu = attention_max_or_zero(mx);
            const float a = expf(m[g] - mu), b = expf(m_o - mu);
            l[g] = l[g] * a + l_o * b;
#pragma unroll
            for (int e = 0; e < E; e++)
                acc[g][e] = acc[g][e] * a + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * b;
            m[g] = mx;
        }
    }
    if (kg == 0) {
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (lane == 0) {
                s_m[warp][g] = m[g];
                s_l[warp][g] = l[g];
            }
#pragma unroll
            for (int i = 0; i < NVL; i++) {
                const int vi = sub + lpk * i;
                if (vi < n_vec)
#pragma unroll
                    for (int e = 0; e < VEC; e++) s_acc[warp][g][vi * VEC + e] = acc[g][i * VEC + e];
            }
        }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < n_g * head_dim; idx += SPLIT_THREADS) {
        const int g = idx / head_dim, d = idx % head_dim;
        /* The sink joins here only when this block writes the output (one split). */
        const float sink = sinks && n_splits == 1 ? sinks[h0 + g] : -INFINITY;
        float mx = sink;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) mx = fmaxf(mx, s_m[w][g]);
        const float mu = attention_max_or_zero(mx);
        float l_all = attention_sink_weight(sink, mu), o = 0.0f;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) {
            const float c = expf(s_m[w][g] - mu);
            l_all += s_l[w][g] * c;
            o += s_acc[w][g][d] * c;
        }
        if (n_splits == 1) {
            cuda_store(out + (vec0 + g) * head_dim + d, o * (1.0f / l_all)); /* l_all >= 1 */
        } else {
            part_acc[((vec0 + g) * n_splits + split) * head_dim + d] = o;
            if (d == 0) part_ml[(vec0 + g) * n_splits + split] = make_float2(mx, l_all);
        }
    }
}

/* out (n_vectors, head_dim) = the log-sum-exp merge of the n_splits partials of each query
 * vector (row, head): with M the largest partial max, out = sum_c acc_c exp(m_c - M) /
 * sum_c l_c exp(m_c - M), skipping empty partials (l_c = 0, whose acc_c was never written).
 * With sinks (f32 (n_heads), or nullptr), vector item's head item % n_heads adds its sink S to
 * the denominator once: M includes S, and the sum e^(S - M). One thread block per query
 * vector. */
template <typename T>
static __global__ void __launch_bounds__(SPLIT_THREADS)
attention_decode_split_k_combine_kernel(T *out, const float *part_acc, const float2 *part_ml,
                                        int64_t n_vectors, int head_dim, int n_splits,
                                        const float *sinks, int n_heads)
{
    __shared__ float s_w[SPLIT_MAX_SPLITS];
    for (int64_t item = blockIdx.x; item < n_vectors; item += gridDim.x) {
        const float2 *ml = part_ml + item * n_splits;
        const float sink = sinks ? sinks[item % n_heads] : -INFINITY;
        float mx = sink;
        for (int c = 0; c < n_splits; c++)
            if (ml[c].y != 0.0f) mx = fmaxf(mx, ml[c].x);
        const float mu = attention_max_or_zero(mx);
        float l_all = attention_sink_weight(sink, mu);
        for (int c = 0; c < n_splits; c++)
            if (ml[c].y != 0.0f) l_all += ml[c].y * expf(ml[c].x - mu);
        for (int c = threadIdx.x; c < n_splits; c += blockDim.x)
            s_w[c] = ml[c].y != 0.0f ? expf(ml[c].x - mu) : 0.0f;
        __syncthreads();
        const float inv = 1.0f / l_all;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int c = 0; c < n_splits; c++)
                if (ml[c].y != 0.0f) o += part_acc[(item * n_splits + c) * head_dim + d] * s_w[c];
            cuda_store(out + item * head_dim + d, o * inv);
        }
        __syncthreads(); /* the next item rewrites s_w */
    }
}

/* Whether the split-K kernel can run this call: head_dim a multiple of 8 (whole 16-byte
 * vectors in every dtype), cache rows 16-byte aligned, and a grid within the launch limits. */
static int attention_split_k_fits(const struct tensor *k_cache, const struct tensor *v_cache,
                                  int64_t head_dim, int64_t items)
{
    return head_dim % 8 == 0 && head_dim <= ATTENTION_MAX_HEAD_DIM &&
           (uintptr_t)k_cache->data % 16 == 0 && (uintptr_t)v_cache->data % 16 == 0 &&
           items <= INT_MAX;
}

template <typename T, int GMAX>
static void attention_decode_split_k_launch(struct backend *b, struct cuda_state *st,
                                            const struct tensor *out, const struct tensor *q,
                                            const struct tensor *k_cache,
                                            const struct tensor *v_cache,
                                            const struct attention_batch *batch)
{
    const int64_t n = q->shape[0], n_heads = q->shape[1], head_dim = q->shape[2];
    const int64_t n_kv_heads = k_cache->shape[2], group = n_heads / n_kv_heads;
    const int64_t head_tiles = (group + GMAX - 1) / GMAX;
    const int64_t items = n * n_kv_heads * head_tiles;

    /* The longest range a row of this batch can attend to, from what the host knows: seq_len
     * lives on the device, bounded by max_blocks * block_tokens, by the host's max_seq_len hint
     * and by the window. Splits fill
     * the device with about st->split_waves blocks per SM; a split whose chunk lies past
     * its row's range writes an empty partial. */
    int64_t max_ctx = (int64_t)batch->max_blocks * batch->block_tokens;
    if (batch->max_seq_len > 0 && batch->max_seq_len < max_ctx) max_ctx = batch->max_seq_len;
    if (batch->window > 0 && batch->window < max_ctx) max_ctx = batch->window;
    if (max_ctx < 1) max_ctx = 1;
    const int64_t target = (int64_t)st->split_waves * st->n_sms;
    const int64_t want = items >= target ? 1 : (target + items - 1) / items;
    int64_t chunk = (max_ctx + want - 1) / want;
    if (chunk < st->split_min_chunk) chunk = st->split_min_chunk;
    if (chunk < (max_ctx + SPLIT_MAX_SPLITS - 1) / SPLIT_MAX_SPLITS)
        chunk = (max_ctx + SPLIT_MAX_SPLITS - 1) / SPLIT_MAX_SPLITS;
    chunk = (chunk + 63) / 64 * 64;
    const int64_t n_splits = (max_ctx + chunk - 1) / chunk;

    float *part_acc = NULL;
    float2 *part_ml = NULL;
    if (n_splits > 1) {
        const size_t n_part = (size_t)(n * n_heads * n_splits);
        const size_t acc_bytes = cuda_align(n_part * (size_t)head_dim * sizeof(float));
        char *scratch = (char *)cuda_scratch(b, acc_bytes + n_part * sizeof(float2));
        part_acc = (float *)scratch;
        part_ml = (float2 *)(scratch + acc_bytes);
    }
    const dim3 grid((unsigned)items, (unsigned)n_splits);
    attention_decode_split_k_kernel<T, GMAX><<<grid, SPLIT_THREADS, 0, st->stream>>>(
        (T *)out->data, part_acc, part_ml, (const T *)q->data, (const T *)k_cache->data,
        (const T *)v_cache->data, (const int32_t *)batch->q_start.data,
        (const int32_t *)batch->seq_len.data, (const int32_t *)batch->block_table.data,
        (int)n_heads, (int)n_kv_heads, (int)head_dim, k_cache->shape[0], batch->n_seqs,
        batch->block_tokens, batch->max_blocks, batch->scale, batch->window, batch->softcap,
        (const float *)batch->sinks.data, (int)head_tiles, (int)chunk, n);
    LAUNCH_CHECK();
    if (n_splits > 1) {
        attention_decode_split_k_combine_kernel<T>
            <<<cuda_blocks_for(n * n_heads, 1), SPLIT_THREADS, 0, st->stream>>>(
                (T *)out->data, part_acc, part_ml, n * n_heads, (int)head_dim, (int)n_splits,
                (const float *)batch->sinks.data, (int)n_heads);
        LAUNCH_CHECK();
    }
}

/* The split-K decode kernel, its head tile GMAX the smallest of 1, 2, 4, 8 that holds the
 * group (larger groups take several tiles). */
template <typename T>
static void attention_decode_split_k(struct backend *b, struct cuda_state *st,
                                     const struct tensor *out, const struct tensor *q,
                                     const struct tensor *k_cache, const struct tensor *v_cache,
                                     const struct attention_batch *batch)
{
    const int64_t group = q->shape[1] / k_cache->shape[2];
    if (group <= 1) attention_decode_split_k_launch<T, 1>(b, st, out, q, k_cache, v_cache, batch);
    else if (group <= 2) attention_decode_split_k_launch<T, 2>(b, st, out, q, k_cache, v_cache, batch);
    else if (group <= 4) attention_decode_split_k_launch<T, 4>(b, st, out, q, k_cache, v_cache, batch);
    else attention_decode_split_k_launch<T, 8>(b, st, out, q, k_cache, v_cache, batch);
}

/* The simple kernel: one thread block per (row, head) item (attention_kernel). */
static void attention_simple(struct cuda_state *s, const struct tensor *out, const struct tensor *q,
                             const struct tensor *k_cache, const struct tensor *v_cache,
                             const struct attention_batch *batch)
{
    const int64_t n = q->shape[0], n_heads = q->shape[1], head_dim = q->shape[2], n_kv_heads = k_cache->shape[2];
    CUDA_DISPATCH_FLOAT(q->dtype, T,
        attention_kernel<T><<<cuda_blocks_for(n * n_heads, 1), ATTENTION_THREADS, 0,
                              s->stream>>>(
            (T *)out->data, (const T *)q->data, (const T *)k_cache->data,
            (const T *)v_cache->data, (const int32_t *)batch->q_start.data,
            (const int32_t *)batch->seq_len.data, (const int32_t *)batch->block_table.data, n,
            (int)n_heads, (int)n_kv_heads, (int)head_dim, k_cache->shape[0], batch->n_seqs,
            batch->block_tokens, batch->max_blocks, batch->scale, batch->window, batch->softcap,
            (const float *)batch->sinks.data);
        LAUNCH_CHECK());
}

#define TC_CHECK_MAX_ROWS 4096

/* The tensor-core prefill (attention_train_tc.cu) had not run on a GPU when it became the
 * default (docs/cuda.md): the first batch it takes for each dtype and head_dim also runs the
 * simple kernel and compares. Within 3e-2 of the simple output's largest magnitude (the tensor
 * cores round the probabilities to 16 bits before P V; a wrong tile or key address is off by the
 * output's own size) it is kept; else logged and the simple kernel's output kept, and the simple
 * kernel serves that dtype and head_dim from then on. Returns 0 when the tensor-core kernel does
 * not take the batch (or the check found no memory): the caller runs the simple one. */
static int tc_prefill_first(struct backend *b, struct cuda_state *s, int *state, const struct tensor *out,
                            const struct tensor *q, const struct tensor *k_cache, const struct tensor *v_cache,
                            const struct attention_batch *batch)
{
    const size_t bytes = tensor_nbytes(out), n = (size_t)tensor_numel(out);
    void *ref = NULL;
    char *host = (char *)malloc(2 * bytes);
    if (!host || cudaMalloc(&ref, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        free(host);
        return 0;
    }
    struct tensor ref_t = *out;
    ref_t.data = ref;
    attention_simple(s, &ref_t, q, k_cache, v_cache, batch);
    if (!cuda_attention_prefill_tc(b, out, q, k_cache, v_cache, batch)) {
        CUDA_CHECK(cudaFree(ref));
        free(host);
        return 0;
    }
    CUDA_CHECK(cudaMemcpyAsync(host, out->data, bytes, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaMemcpyAsync(host + bytes, ref, bytes, cudaMemcpyDeviceToHost, s->stream));
    CUDA_CHECK(cudaStreamSynchronize(s->stream));
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double x = dtype_load_f32(host, out->dtype, i), y = dtype_load_f32(host + bytes, out->dtype, i);
        if (isnan(x) != isnan(y)) diff = INFINITY;
        else if (!isnan(x)) diff = fmax(diff, fabs(x - y)), scale = fmax(scale, fabs(y));
    }
    const int agree = diff <= 3e-2 * scale + 1e-6;
    *state = agree ? 1 : -1;
    if (agree)
        LOG_INFO("cuda", "prefill attention on the tensor cores (%s, head_dim %lld) agreed with the simple kernel on "
                 "its first batch: max |diff| %.3g of %.3g", dtype_name(q->dtype), (long long)q->shape[2], diff, scale);
    else {
        LOG_WARN("cuda", "prefill attention on the tensor cores (%s, head_dim %lld) gave max |diff| %.3g against the "
                 "simple kernel (outputs up to %.3g) on its first batch: the simple kernel serves it from now on",
                 dtype_name(q->dtype), (long long)q->shape[2], diff, scale);
        CUDA_CHECK(cudaMemcpyAsync(out->data, ref, bytes, cudaMemcpyDeviceToDevice, s->stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(s->stream)); /* the copy read ref, which goes now */
    CUDA_CHECK(cudaFree(ref));
    free(host);
    return 1;
}

/* The tensor-core prefill's check state for q's dtype and head_dim, or NULL where it does not
 * take them. */
static int *tc_prefill_state(struct cuda_state *s, const struct tensor *q)
{
    const int64_t hd = q->shape[2];
    const int d = q->dtype == DTYPE_BF16 ? 0 : q->dtype == DTYPE_F16 ? 1 : -1;
    const int h = hd == 32 ? 0 : hd == 64 ? 1 : hd == 128 ? 2 : -1;
    return d >= 0 && h >= 0 ? &s->tc_prefill_state[d][h] : NULL;
}

/* out, q (n, n_heads, head_dim); k_cache, v_cache (n_blocks, block_tokens, n_kv_heads,
 * head_dim); head_dim <= ATTENTION_MAX_HEAD_DIM. Picks the kernel by enum cuda_attention_mode
 * and the batch's decode_only hint. */
void cuda_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                    const struct tensor *k_cache, const struct tensor *v_cache,
                    const struct attention_batch *batch)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = q->shape[0], n_heads = q->shape[1], head_dim = q->shape[2];
    int64_t n_kv_heads = k_cache->shape[2];
    if (n == 0 || n_heads == 0 || batch->n_seqs == 0) return;
    CHECK(head_dim <= ATTENTION_MAX_HEAD_DIM,
          "attention: head_dim %lld; the CUDA backend supports head_dim <= %d",
          (long long)head_dim, ATTENTION_MAX_HEAD_DIM);
    CHECK(n_heads <= INT_MAX && n_kv_heads <= INT_MAX && k_cache->shape[1] <= INT_MAX,
          "attention: cache %lld x %lld heads too large", (long long)n_heads,
          (long long)n_kv_heads);

    const int want_split = s->attention_mode == CUDA_ATTENTION_SPLIT ||
                           (s->attention_mode == CUDA_ATTENTION_AUTO && batch->decode_only);
    /* items: the split kernel's grid.x at the largest head tile count (GMAX = 1). */
    if (want_split &&
        attention_split_k_fits(k_cache, v_cache, head_dim, n * n_heads)) {
        CUDA_DISPATCH_FLOAT(q->dtype, T,
                            attention_decode_split_k<T>(b, s, out, q, k_cache, v_cache, batch));
        return;
    }
    /* Prefill chunks and mixed batches on the tensor cores where they fit (16-bit, head_dim 32,
     * 64 or 128): the training forward's tiles, keys read through the block table. */
    /* SHARDLM_CUDA_ATTENTION=tc forces it unchecked (the tests of the kernel itself); auto checks
     * its first batch of each dtype and head_dim (never inside a graph's capture). */
    if (s->attention_mode == CUDA_ATTENTION_TC && cuda_attention_prefill_tc(b, out, q, k_cache, v_cache, batch))
        return;
    int *tc = s->attention_mode == CUDA_ATTENTION_AUTO && !batch->decode_only ? tc_prefill_state(s, q) : NULL;
    if (tc && *tc == 1 && cuda_attention_prefill_tc(b, out, q, k_cache, v_cache, batch)) return;
    /* (a batch of more rows than TC_CHECK_MAX_ROWS waits, on the simple kernel, for a smaller one:
     * the simple kernel beside a long prefill would hold the first request for seconds) */
    if (tc && *tc == 0 && !s->capturing && n <= TC_CHECK_MAX_ROWS &&
        tc_prefill_first(b, s, tc, out, q, k_cache, v_cache, batch))
        return;
    attention_simple(s, out, q, k_cache, v_cache, batch);
}
