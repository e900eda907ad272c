/* kernels/cuda/attention.cu - op_attention: causal grouped-query attention over the paged KV
 * cache for a batch that mixes prefill chunks and decode rows (struct attention_batch).
 * The simple, correct form: one thread block per (query row, query head). Its warps share the
 * key positions round-robin; each warp runs an online softmax in f32 over its positions (lane
 * l holds features l, l + 32, ... of q and of the output accumulator), and the warps' partial
 * results are merged at the end. Like the CPU reference, q is scaled before the dot products
 * and the output is acc * (1 / sum).
 * Not here: writing the cache (kv_write.cu); a split-K decode kernel or tensor-core prefill
 * kernel (none yet: this one is the reference-shaped version).
 * Tests: tests/test_ops.c --backend cuda (prefill, decode, mixed batches, GQA, windows, block
 * sizes that do not divide the length, head_dim up to 256); benchmark: tests/bench_ops.c. */
#include <limits.h>

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

/* q, out (n, n_heads, head_dim); k_cache, v_cache (n_blocks, block_tokens, n_kv_heads,
 * head_dim); q_start i32 (n_seqs + 1); seq_len i32 (n_seqs); block_table i32 (n_seqs,
 * max_blocks). The DEVICE_CHECKs are the CPU reference's CHECKs on the batch description,
 * which lives in device memory here. */
template <typename T>
static __global__ void __launch_bounds__(ATTENTION_THREADS)
attention_kernel(T *out, const T *q, const T *k_cache, const T *v_cache, const int32_t *q_start,
                 const int32_t *seq_len, const int32_t *block_table, int64_t n, int n_heads,
                 int n_kv_heads, int head_dim, int64_t n_blocks, int n_seqs, int block_tokens,
                 int max_blocks, float scale, int window)
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
            const float score = cuda_warp_sum(dot);
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
         * (m = -inf, l = 0, acc = 0) contributes nothing. */
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
        float m_all = -INFINITY;
        for (int w = 0; w < ATTENTION_WARPS; w++) m_all = fmaxf(m_all, warp_max[w]);
        float weight[ATTENTION_WARPS];
        float l_all = 0.0f;
        for (int w = 0; w < ATTENTION_WARPS; w++) {
            weight[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - m_all);
            l_all += warp_sum[w] * weight[w];
        }
        const float inv = 1.0f / l_all; /* l_all >= 1: the max score contributes exp(0) */
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < ATTENTION_WARPS; w++) o += warp_acc[w][d] * weight[w];
            cuda_store(out + q_off + d, o * inv);
        }
        __syncthreads(); /* the next item rewrites the shared merge buffers */
    }
}

/* out, q (n, n_heads, head_dim); k_cache, v_cache (n_blocks, block_tokens, n_kv_heads,
 * head_dim); head_dim <= ATTENTION_MAX_HEAD_DIM. */
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
    CUDA_DISPATCH_FLOAT(q->dtype, T,
        attention_kernel<T><<<cuda_blocks_for(n * n_heads, 1), ATTENTION_THREADS, 0,
                              s->stream>>>(
            (T *)out->data, (const T *)q->data, (const T *)k_cache->data,
            (const T *)v_cache->data, (const int32_t *)batch->q_start.data,
            (const int32_t *)batch->seq_len.data, (const int32_t *)batch->block_table.data, n,
            (int)n_heads, (int)n_kv_heads, (int)head_dim, k_cache->shape[0], batch->n_seqs,
            batch->block_tokens, batch->max_blocks, batch->scale, batch->window);
        LAUNCH_CHECK());
}
