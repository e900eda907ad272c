/* kernels/cpu/attention.c - op_attention on the CPU: causal grouped-query attention over the
 * paged KV cache for a batch mixing prefill chunks and decode rows.
 * One work item is (query row, KV head): the query heads that share a KV head are processed
 * together so that each K/V row is read once per group. Keys are visited in tiles of
 * ATTN_TILE positions with an online softmax (running max and sum, rescaled once per tile), so
 * the result is stable for any context length and no (context)-sized buffer is needed.
 * Tests: tests/test_ops.c (attention cases); benchmark: tests/bench_ops.c. */
#include <math.h>

#include "cpu_ops.h"

#define ATTN_TILE 32

/* The sequence whose query rows contain row t: the last s with q_start[s] <= t. */
static int seq_of_row(const int32_t *q_start, int n_seqs, int64_t t)
{
    int lo = 0, hi = n_seqs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (q_start[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

void cpu_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                   const struct tensor *k_cache, const struct tensor *v_cache,
                   const struct attention_batch *batch)
{
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2];
    const int64_t n_kv = k_cache->shape[2], group = n_heads / n_kv;
    const int64_t bt = batch->block_tokens, n_blocks = k_cache->shape[0];
    const int32_t *q_start = batch->q_start.data, *seq_len = batch->seq_len.data;
    const int32_t *table = batch->block_table.data;
    if (n == 0 || batch->n_seqs == 0) return;
    CHECK(q_start[0] == 0 && q_start[batch->n_seqs] == n, "attention: q_start must span 0..%lld",
          (long long)n);
    for (int s = 0; s < batch->n_seqs; s++) {
        int32_t n_new = q_start[s + 1] - q_start[s];
        CHECK(n_new >= 0 && seq_len[s] >= n_new && seq_len[s] <= (int64_t)batch->max_blocks * bt,
              "attention: sequence %d has %d new rows, seq_len %d, room for %lld", s, n_new,
              seq_len[s], (long long)batch->max_blocks * bt);
        for (int64_t j = 0; j < (seq_len[s] + bt - 1) / bt; j++) {
            int32_t blk = table[(int64_t)s * batch->max_blocks + j];
            CHECK(blk >= 0 && blk < n_blocks, "attention: sequence %d block %lld is %d (pool %lld)",
                  s, (long long)j, blk, (long long)n_blocks);
        }
    }

    /* Per thread: q (group, hd) | acc (group, hd) | scores (group, TILE) | m, l (group) | k, v rows */
    const size_t per = (size_t)(2 * group * hd + group * ATTN_TILE + 2 * group + 2 * hd);
    float *scratch = cpu_scratch(b, per);
    const size_t row = (size_t)(n_kv * hd); /* elements per cache slot */

    #pragma omp parallel for schedule(dynamic, 1) num_threads(b->n_threads)
    for (int64_t item = 0; item < n * n_kv; item++) {
        const int64_t t = item / n_kv, kvh = item % n_kv;
        float *qb = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        float *acc = qb + group * hd, *sc = acc + group * hd, *mx = sc + group * ATTN_TILE;
        float *sum = mx + group, *kb = sum + group, *vb = kb + hd;

        const int s = seq_of_row(q_start, batch->n_seqs, t);
        const int64_t n_new = q_start[s + 1] - q_start[s];
        const int64_t pos = seq_len[s] - n_new + (t - q_start[s]);
        const int64_t first = batch->window > 0 && pos - batch->window + 1 > 0 ? pos - batch->window + 1 : 0;
        const int32_t *blocks = table + (int64_t)s * batch->max_blocks;

        for (int64_t g = 0; g < group; g++) {
            size_t off = (size_t)((t * n_heads + kvh * group + g) * hd);
            const float *qr = cpu_load_row(q, off, (size_t)hd, qb + g * hd);
            for (int64_t d = 0; d < hd; d++) qb[g * hd + d] = qr[d] * batch->scale;
            for (int64_t d = 0; d < hd; d++) acc[g * hd + d] = 0.0f;
            mx[g] = -INFINITY;
            sum[g] = 0.0f;
        }

        for (int64_t p0 = first; p0 <= pos; p0 += ATTN_TILE) {
            const int64_t np = pos + 1 - p0 < ATTN_TILE ? pos + 1 - p0 : ATTN_TILE;
            for (int64_t i = 0; i < np; i++) {
                int64_t p = p0 + i;
                size_t off = ((size_t)blocks[p / bt] * (size_t)bt + (size_t)(p % bt)) * row + (size_t)(kvh * hd);
                const float *kr = cpu_load_row(k_cache, off, (size_t)hd, kb);
                for (int64_t g = 0; g < group; g++) {
                    const float *qg = qb + g * hd;
                    float dot = 0.0f;
                    /* Vectorised: the reduction may be reordered (still f32, still per item). */
                    #pragma omp simd reduction(+ : dot)
                    for (int64_t d = 0; d < hd; d++) dot += qg[d] * kr[d];
                    sc[g * ATTN_TILE + i] = dot;
                }
            }
            for (int64_t g = 0; g < group; g++) {
                float *sg = sc + g * ATTN_TILE, tile_max = mx[g];
                for (int64_t i = 0; i < np; i++) tile_max = sg[i] > tile_max ? sg[i] : tile_max;
                if (tile_max > mx[g]) { /* rescale what was accumulated under the old max */
                    float corr = expf(mx[g] - tile_max);
                    sum[g] *= corr;
                    for (int64_t d = 0; d < hd; d++) acc[g * hd + d] *= corr;
                    mx[g] = tile_max;
                }
                for (int64_t i = 0; i < np; i++) {
                    sg[i] = expf(sg[i] - mx[g]);
                    sum[g] += sg[i];
                }
            }
            for (int64_t i = 0; i < np; i++) {
                int64_t p = p0 + i;
                size_t off = ((size_t)blocks[p / bt] * (size_t)bt + (size_t)(p % bt)) * row + (size_t)(kvh * hd);
                const float *vr = cpu_load_row(v_cache, off, (size_t)hd, vb);
                for (int64_t g = 0; g < group; g++) {
                    float w = sc[g * ATTN_TILE + i];
                    float *ag = acc + g * hd;
                    for (int64_t d = 0; d < hd; d++) ag[d] += w * vr[d];
                }
            }
        }

        for (int64_t g = 0; g < group; g++) {
            size_t off = (size_t)((t * n_heads + kvh * group + g) * hd);
            float *o = cpu_out_row(out, off, acc + g * hd);
            float inv = 1.0f / sum[g]; /* sum >= 1: the max term contributes exp(0) */
            for (int64_t d = 0; d < hd; d++) o[d] = acc[g * hd + d] * inv;
            cpu_store_row(out, off, (size_t)hd, o);
        }
    }
}
