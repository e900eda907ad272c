/* kernels/cpu/attention.c - op_attention on the CPU: causal grouped-query attention over the
 * paged KV cache for a batch mixing prefill chunks and decode rows, with an online softmax
 * (running max and sum per query vector, rescaled when the max grows), so that no
 * (context)-sized buffer is needed and the result is stable at any context length. An
 * attention sink (GPT-OSS) is the online softmax's first term (softmax_init).
 *
 * Two paths, chosen per sequence by how many query vectors (new rows x the group's query
 * heads) it brings this step:
 * - Tiles (prefill chunks, ATTN_TILE_MIN_QV query vectors or more): a work item is (tile of up
 *   to ATTN_TILE_QV query vectors: consecutive rows x the query heads of one KV head, KV head).
 *   The tile's queries, scaled, are copied into scratch; keys are visited ATTN_KEY_TILE at a
 *   time over the union of the rows' ranges, S = Q K^T and O += P V as register-tiled products
 *   (the kernel table of attention_impl.h) that read K and V rows where they lie in the cache
 *   (f32) or where they were widened (bf16, f16). Each row's causal and sliding-window range
 *   masks its scores. A K/V row is read once per tile instead of once per query vector.
 * - Rows (decode, and chunks too short for a tile): a work item is (query row, its KV heads, or
 *   a part of them when there are too few rows to keep the threads busy); the query heads of a
 *   group go together through the same kernels, ATTN_ROW_KEYS keys per pass, so each K/V row
 *   is read once per group while it is in L1 and registers, and a pass reads whole cache slots.
 *   When the rows read ATTN_PREFETCH_MIN_BYTES or more, each pass prefetches the next one.
 * Work items go to the backend's OpenMP threads dynamically; a sequence's tiles are issued
 * last-first (the causal tiles near the end of a chunk have the most keys), tiles before rows.
 * One work item is never split across threads: a single decode row of a model with one KV head
 * runs on one thread. A row gives the same bits on either path (ATTN_PASS_KEYS), so neither the
 * backend's batch_invariant nor batch->row_path (speculative verification) changes the choice.
 * All arithmetic is f32 whatever the storage dtype; the result is rounded once on store.
 * Not here: the inner kernels (attention_portable.c, attention_avx2.c, attention_avx512.c), training attention
 * (attention_train.c).
 * Tests: tests/test_ops.c (attention cases), tests/test_attention_kernels.c (the kernels);
 * benchmarks: tests/bench_attention.c, tests/bench_ops.c. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "attention_impl.h"
#include "cpu_isa.h"
#include "cpu_ops.h"

/* Keys per pass of both paths. The passes of both lie at the same absolute positions (multiples
 * of ATTN_PASS_KEYS), so that a query vector's online softmax meets the same passes, rescales at
 * the same keys and sums each pass's terms in the same order whichever path takes its row: a row
 * gives the same bits in a tile as alone (a prompt's rows do not change with the prefill's split,
 * a prefix-cache hit, or a speculative verification beside them). Keys a vector does not attend
 * within a pass add exact zeros (a score of 0 times a finite value). 32: the row path's pass,
 * tuned for decode (64 cost the Llama-7B-like decode of tests/bench_attention.c 1.4x on the Xeon
 * of 2026-12-05); the tiles' 64-key passes of before gave prefill 2-8 % more (gemma3 203 against
 * 198 GFLOP/s, llama7b 156 against 144, three alternating runs), the price of the rows' bits. */
#define ATTN_PASS_KEYS 32
#define ATTN_ROW_KEYS ATTN_PASS_KEYS
#define ATTN_KEY_TILE ATTN_PASS_KEYS
#define ATTN_TILE_QV 128    /* query vectors (rows x group heads) per tile, at most */
#define ATTN_TILE_MIN_QV 16 /* a sequence's rows go through tiles from this many query vectors */
/* The row path prefetches when its rows read at least this many K+V bytes in one call (see
 * prefetch_rows). */
#define ATTN_PREFETCH_MIN_BYTES ((size_t)16 << 20)
/* Below this many K+V bytes (and no tile), a call runs on one thread. */
#define ATTN_PARALLEL_MIN_BYTES ((size_t)128 << 10)

/* ---- the kernel table ---- */

/* Asked once (cpu_isa.h: the CPU's level capped by SHARDLM_CPU_ISA). Racing first calls pick
 * the same table. */
static _Atomic(const struct attn_kernels *) best_kernels;

const struct attn_kernels *attn_kernels_best(void)
{
    const struct attn_kernels *kt = atomic_load_explicit(&best_kernels, memory_order_relaxed);
    if (!kt) {
        kt = attn_kernels_avx512() && cpu_isa_at_least(CPU_ISA_AVX512) ? attn_kernels_avx512()
             : attn_kernels_avx2() && cpu_isa_at_least(CPU_ISA_AVX2)   ? attn_kernels_avx2()
                                                                       : attn_kernels_portable();
        atomic_store_explicit(&best_kernels, kt, memory_order_relaxed);
    }
    return kt;
}

/* ---- geometry ---- */

struct attn_ctx {
    const struct tensor          *out, *q, *k_cache, *v_cache;
    const struct attention_batch *batch;
    const struct attn_kernels    *kt;
    const int32_t                *q_start, *seq_len, *table;
    const float                  *sinks;     /* (n_heads) or NULL: batch->sinks (ops.h) */
    int64_t                       n_heads, hd, n_kv, group, bt;
    int64_t                       tile_rows; /* rows per tile: ATTN_TILE_QV / group, at least 1 */
    size_t                        row;       /* elements per cache slot: n_kv * hd */
    int64_t                       row_kv;    /* KV heads per work item of the row path */
    int                           prefetch;  /* the row path prefetches its next pass */
};

/* The first cache position that position pos attends to (its window's start, or 0). */
static int64_t first_key(const struct attn_ctx *c, int64_t pos)
{
    const int64_t w = c->batch->window;
    return w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
}

/* The first key of the pass that holds position pos's first key: passes lie at multiples of
 * ATTN_PASS_KEYS in both paths. */
static int64_t first_pass(const struct attn_ctx *c, int64_t pos)
{
    return first_key(c, pos) / ATTN_PASS_KEYS * ATTN_PASS_KEYS;
}

/* Whether sequence s's rows go through tiles. */
static int uses_tiles(const struct attn_ctx *c, int s)
{
    const int64_t n_new = c->q_start[s + 1] - c->q_start[s];
    return n_new >= 2 && n_new * c->group >= ATTN_TILE_MIN_QV;
}

/* The element offsets of the cache slots of the np positions from p0 (blocks: the sequence's
 * block table), once per pass: K and V and every KV head share them. */
static void slot_offsets(const struct attn_ctx *c, const int32_t *blocks, int64_t p0, int np, size_t *slots)
{
    const int64_t bt = c->bt;
    int64_t blk = p0 / bt, in = p0 % bt;
    for (int i = 0; i < np; i++) {
        slots[i] = ((size_t)blocks[blk] * (size_t)bt + (size_t)in) * c->row;
        if (++in == bt) in = 0, blk++;
    }
}

/* Pointers to the f32 rows of KV head kvh at the np slots: into the cache when it is f32,
 * otherwise into buf (np, hd), where the rows are widened. */
static void cache_rows(const struct attn_ctx *c, const struct tensor *cache, const size_t *slots, int64_t kvh,
                       int np, float *buf, const float **rows)
{
    const int64_t hd = c->hd;
    for (int i = 0; i < np; i++) {
        const size_t off = slots[i] + (size_t)(kvh * hd);
        if (cache->dtype == DTYPE_F32) {
            rows[i] = (const float *)cache->data + off;
        } else {
            c->kt->widen(buf + (size_t)i * (size_t)hd, (const uint16_t *)cache->data + off,
                         cache->dtype, (size_t)hd);
            rows[i] = buf + (size_t)i * (size_t)hd;
        }
    }
}

/* Asks for the rows of KV heads kv0 .. kv0 + nkv - 1 at the np cache positions from p0 to be
 * brought into L2, a pass ahead of their use (the row path, when c->prefetch). The blocks of a
 * paged cache lie anywhere, and the hardware prefetchers restart at every block; measured with
 * tests/bench_attention.c, this lifts decode from DRAM by 3-10 %, but costs 20-25 % when the
 * rows are in L2 or L3 already (the prefetches occupy the fill buffers that the kernels' own
 * loads need), hence the threshold ATTN_PREFETCH_MIN_BYTES: a call that reads that much, times
 * a model's layers, is past the last-level cache of most machines. */
static void prefetch_rows(const struct attn_ctx *c, const struct tensor *cache,
                          const int32_t *blocks, int64_t kv0, int64_t nkv, int64_t p0, int np)
{
    const int64_t bt = c->bt;
    const size_t es = dtype_size(cache->dtype), bytes = (size_t)(nkv * c->hd) * es;
    for (int i = 0; i < np; i++) {
        const int64_t p = p0 + i;
        const size_t off = ((size_t)blocks[p / bt] * (size_t)bt + (size_t)(p % bt)) * c->row +
                           (size_t)(kv0 * c->hd);
        const char *r = (const char *)cache->data + off * es;
        for (size_t j = 0; j < bytes; j += 64) __builtin_prefetch(r + j, 0, 2);
    }
}

/* Query vector (row t, head h) times the scale into dst (hd). */
static void load_query(const struct attn_ctx *c, int64_t t, int64_t h, float *dst)
{
    const size_t off = (size_t)((t * c->n_heads + h) * c->hd);
    const float *src = cpu_load_row(c->q, off, (size_t)c->hd, dst); /* dst when not f32 */
    const float scale = c->batch->scale;
    for (int64_t d = 0; d < c->hd; d++) dst[d] = src[d] * scale;
}

/* The online softmax's state before any key, for query head h: with an attention sink S_h
 * (ops.h), the sink is the first term, max S_h and sum e^0 = 1 (acc 0: it has no value row),
 * and softmax_step rescales it like any score when a larger one comes; without one (or with
 * S_h = -inf), max -inf and sum 0. */
static void softmax_init(const struct attn_ctx *c, int64_t h, float *mx, float *l)
{
    const float sink = c->sinks ? c->sinks[h] : -INFINITY;
    *mx = sink;
    *l = sink == -INFINITY ? 0.0f : 1.0f;
}

/* Output (row t, head h) = acc / l; tmp (hd) for a half-precision output. */
static void store_output(const struct attn_ctx *c, int64_t t, int64_t h, const float *acc, float l,
                         float *tmp)
{
    const size_t off = (size_t)((t * c->n_heads + h) * c->hd);
    float *o = cpu_out_row(c->out, off, tmp);
    const float inv = 1.0f / l; /* l >= 1: the max term (a score or the sink) contributes exp(0) */
    for (int64_t d = 0; d < c->hd; d++) o[d] = acc[d] * inv;
    cpu_store_row(c->out, off, (size_t)c->hd, o);
}

/* One query vector's online-softmax step over the scores s[a..b] (inclusive) of a pass of n
 * keys: the running max *mx grows to their max (acc (hd) and the running sum *l rescaled under
 * the new max), s[a..b] becomes exp(s - max) and is added to *l, the rest of s[0..n) becomes 0
 * (keys this query does not attend to). a > b: none attended. */
static void softmax_step(const struct attn_kernels *kt, float *s, int n, int a, int b, float *mx,
                         float *l, float *acc, int64_t hd, float cap)
{
    if (a > b) {
        memset(s, 0, (size_t)n * sizeof(float));
        return;
    }
    if (cap > 0.0f) /* soft-capped scores (ops.h) */
        for (int i = a; i <= b; i++) s[i] = cap * tanhf(s[i] / cap);
    const float m = kt->max(s + a, b - a + 1, *mx);
    if (m > *mx) { /* rescale what was accumulated under the old max (nothing yet at -inf) */
        if (*mx != -INFINITY) {
            const float corr = cpu_exp(*mx - m);
            *l *= corr;
            for (int64_t d = 0; d < hd; d++) acc[d] *= corr;
        }
        *mx = m;
    }
    for (int i = 0; i < a; i++) s[i] = 0.0f;
    *l += kt->exp_sum(s + a, b - a + 1, m);
    for (int i = b + 1; i < n; i++) s[i] = 0.0f;
}

/* ---- the row path ---- */

/* Floats of scratch the row path needs per thread; its layout in attend_row. */
static size_t row_scratch(const struct attn_ctx *c)
{
    const size_t h = (size_t)(c->row_kv * c->group), hd = (size_t)c->hd;
    return 2 * h * hd + h * ATTN_ROW_KEYS + 2 * h + 2 * ATTN_ROW_KEYS * hd + hd;
}

/* Query row t (of sequence s), KV heads kv0 .. kv0 + nkv - 1: each group's query vectors
 * against every key of the row's range, ATTN_ROW_KEYS at a time, the KV heads of a pass one
 * after the other, so that the pass reads whole cache slots (n_kv * hd contiguous elements)
 * rather than one head's slice of each. */
static void attend_row(const struct attn_ctx *c, float *ws, int s, int64_t t, int64_t kv0,
                       int64_t nkv)
{
    const int64_t group = c->group, hd = c->hd, nh = nkv * group; /* nh query vectors */
    /* q (nh, hd) | acc (nh, hd) | sc (nh, ATTN_ROW_KEYS) | mx, l (nh) | kb, vb (ATTN_ROW_KEYS, hd)
     * | tmp (hd); vector j * group + g is head (kv0 + j) * group + g. */
    float *qb = ws, *acc = qb + nh * hd, *sc = acc + nh * hd, *mx = sc + nh * ATTN_ROW_KEYS;
    float *l = mx + nh, *kb = l + nh, *vb = kb + ATTN_ROW_KEYS * hd, *tmp = vb + ATTN_ROW_KEYS * hd;
    const float *kp[ATTN_ROW_KEYS], *vp[ATTN_ROW_KEYS];

    const int64_t n_new = c->q_start[s + 1] - c->q_start[s];
    const int64_t pos = c->seq_len[s] - n_new + (t - c->q_start[s]);
    const int32_t *blocks = c->table + (int64_t)s * c->batch->max_blocks;

    for (int64_t i = 0; i < nh; i++) {
        load_query(c, t, kv0 * group + i, qb + i * hd);
        softmax_init(c, kv0 * group + i, &mx[i], &l[i]);
    }
    memset(acc, 0, (size_t)(nh * hd) * sizeof(float));

    const int64_t lo = first_key(c, pos);
    for (int64_t p0 = first_pass(c, pos); p0 <= pos; p0 += ATTN_ROW_KEYS) {
        const int np = (int)(pos + 1 - p0 < ATTN_ROW_KEYS ? pos + 1 - p0 : ATTN_ROW_KEYS);
        const int a = (int)(lo > p0 ? lo - p0 : 0); /* keys before the window's start: a score of 0 */
        const int64_t p1 = p0 + ATTN_ROW_KEYS; /* the next pass */
        if (c->prefetch && p1 <= pos) {
            const int np1 = (int)(pos + 1 - p1 < ATTN_ROW_KEYS ? pos + 1 - p1 : ATTN_ROW_KEYS);
            prefetch_rows(c, c->k_cache, blocks, kv0, nkv, p1, np1);
            prefetch_rows(c, c->v_cache, blocks, kv0, nkv, p1, np1);
        }
        size_t slots[ATTN_ROW_KEYS];
        slot_offsets(c, blocks, p0, np, slots);
        for (int64_t j = 0; j < nkv; j++) {
            float *qj = qb + j * group * hd, *aj = acc + j * group * hd;
            float *sj = sc + j * group * ATTN_ROW_KEYS;
            /* Only keys a .. np - 1 are read: the zeros before them would add nothing (a tile
             * adds them, to the same bits). */
            cache_rows(c, c->k_cache, slots + a, kv0 + j, np - a, kb, kp);
            c->kt->scores(qj, (int)group, (int)hd, kp, np - a, sj + a, ATTN_ROW_KEYS);
            for (int64_t g = 0; g < group; g++) {
                const int64_t i = j * group + g;
                softmax_step(c->kt, sj + g * ATTN_ROW_KEYS, np, a, np - 1, &mx[i], &l[i], aj + g * hd, hd, c->batch->softcap);
            }
            cache_rows(c, c->v_cache, slots + a, kv0 + j, np - a, vb, vp);
            c->kt->accumulate(aj, (int)group, (int)hd, sj + a, ATTN_ROW_KEYS, vp, np - a);
        }
    }
    for (int64_t i = 0; i < nh; i++) store_output(c, t, kv0 * group + i, acc + i * hd, l[i], tmp);
}

/* ---- the tile path ---- */

static size_t tile_scratch(const struct attn_ctx *c)
{
    const size_t m = (size_t)(c->tile_rows * c->group), hd = (size_t)c->hd;
    return 2 * m * hd + m * ATTN_KEY_TILE + 2 * m + 2 * ATTN_KEY_TILE * hd + hd;
}

/* Rows t0 .. t0 + nr - 1 of sequence s, KV head kvh: their nr x group query vectors (vector
 * r * group + g is row t0 + r, head kvh * group + g) against the union of the rows' key ranges,
 * ATTN_KEY_TILE keys at a time, each vector masked to its own row's range. */
static void attend_tile(const struct attn_ctx *c, float *ws, int s, int64_t t0, int64_t nr,
                        int64_t kvh)
{
    const int64_t group = c->group, hd = c->hd, m = nr * group;
    const int64_t mcap = c->tile_rows * group;
    /* q (mcap, hd) | acc (mcap, hd) | sc (mcap, ATTN_KEY_TILE) | mx, l (mcap) |
     * kb, vb (ATTN_KEY_TILE, hd) | tmp (hd) */
    float *qb = ws, *acc = qb + mcap * hd, *sc = acc + mcap * hd, *mx = sc + mcap * ATTN_KEY_TILE;
    float *l = mx + mcap, *kb = l + mcap, *vb = kb + ATTN_KEY_TILE * hd, *tmp = vb + ATTN_KEY_TILE * hd;
    const float *kp[ATTN_KEY_TILE], *vp[ATTN_KEY_TILE];

    const int64_t n_new = c->q_start[s + 1] - c->q_start[s];
    const int64_t pos0 = c->seq_len[s] - n_new + (t0 - c->q_start[s]); /* position of row t0 */
    const int64_t pos_last = pos0 + nr - 1;
    const int32_t *blocks = c->table + (int64_t)s * c->batch->max_blocks;

    for (int64_t r = 0; r < nr; r++)
        for (int64_t g = 0; g < group; g++) load_query(c, t0 + r, kvh * group + g, qb + (r * group + g) * hd);
    for (int64_t i = 0; i < m; i++) softmax_init(c, kvh * group + i % group, &mx[i], &l[i]);
    memset(acc, 0, (size_t)(m * hd) * sizeof(float));

    for (int64_t p0 = first_pass(c, pos0); p0 <= pos_last; p0 += ATTN_KEY_TILE) {
        const int np = (int)(pos_last + 1 - p0 < ATTN_KEY_TILE ? pos_last + 1 - p0 : ATTN_KEY_TILE);
        size_t slots[ATTN_KEY_TILE];
        slot_offsets(c, blocks, p0, np, slots);
        cache_rows(c, c->k_cache, slots, kvh, np, kb, kp);
        c->kt->scores(qb, (int)m, (int)hd, kp, np, sc, ATTN_KEY_TILE);
        for (int64_t r = 0; r < nr; r++) {
            /* Row r attends to positions first_key(pos) .. pos, pos = pos0 + r. */
            const int64_t pos = pos0 + r, lo = first_key(c, pos);
            const int a = (int)(lo > p0 ? lo - p0 : 0);
            const int b = (int)(pos < p0 + np - 1 ? pos - p0 : np - 1);
            for (int64_t g = 0; g < group; g++) {
                const int64_t i = r * group + g;
                softmax_step(c->kt, sc + i * ATTN_KEY_TILE, np, a, b, &mx[i], &l[i], acc + i * hd, hd, c->batch->softcap);
            }
        }
        cache_rows(c, c->v_cache, slots, kvh, np, vb, vp);
        c->kt->accumulate(acc, (int)m, (int)hd, sc, ATTN_KEY_TILE, vp, np);
    }
    for (int64_t r = 0; r < nr; r++)
        for (int64_t g = 0; g < group; g++)
            store_output(c, t0 + r, kvh * group + g, acc + (r * group + g) * hd, l[r * group + g], tmp);
}

/* ---- the op ---- */

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

/* The contract on the batch's index data (ops.h), checked where it lives. */
static void check_batch(const struct attn_ctx *c, int64_t n, int64_t n_blocks)
{
    const struct attention_batch *batch = c->batch;
    const int64_t bt = c->bt;
    CHECK(c->q_start[0] == 0 && c->q_start[batch->n_seqs] == n,
          "attention: q_start must span 0..%lld", (long long)n);
    for (int s = 0; s < batch->n_seqs; s++) {
        int32_t n_new = c->q_start[s + 1] - c->q_start[s];
        CHECK(n_new >= 0 && c->seq_len[s] >= n_new && c->seq_len[s] <= (int64_t)batch->max_blocks * bt,
              "attention: sequence %d has %d new rows, seq_len %d, room for %lld", s, n_new,
              c->seq_len[s], (long long)batch->max_blocks * bt);
        /* The bound CUDA's split-K kernel sizes its splits by (a graph replays the one it was
         * captured with): positions past it would go unattended there. */
        CHECK(batch->max_seq_len <= 0 || c->seq_len[s] <= batch->max_seq_len,
              "attention: sequence %d holds %d tokens, past the batch's max_seq_len %d", s, c->seq_len[s],
              batch->max_seq_len);
        for (int64_t j = 0; j < (c->seq_len[s] + bt - 1) / bt; j++) {
            int32_t blk = c->table[(int64_t)s * batch->max_blocks + j];
            CHECK(blk >= 0 && blk < n_blocks, "attention: sequence %d block %lld is %d (pool %lld)",
                  s, (long long)j, blk, (long long)n_blocks);
        }
    }
}

void cpu_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                   const struct tensor *k_cache, const struct tensor *v_cache,
                   const struct attention_batch *batch)
{
    const int64_t n = q->shape[0];
    if (n == 0 || batch->n_seqs == 0) return;
    struct attn_ctx c = {
        .out = out, .q = q, .k_cache = k_cache, .v_cache = v_cache, .batch = batch,
        .kt = attn_kernels_best(),
        .q_start = batch->q_start.data, .seq_len = batch->seq_len.data,
        .table = batch->block_table.data, .sinks = batch->sinks.data,
        .n_heads = q->shape[1], .hd = q->shape[2], .n_kv = k_cache->shape[2],
        .bt = batch->block_tokens,
    };
    c.group = c.n_heads / c.n_kv;
    c.tile_rows = ATTN_TILE_QV / c.group > 1 ? ATTN_TILE_QV / c.group : 1;
    c.row = (size_t)(c.n_kv * c.hd);
    check_batch(&c, n, k_cache->shape[0]);

    int any_tiles = 0;
    int64_t row_items = 0;  /* query rows that take the row path */
    double row_bytes = 0.0; /* K+V bytes they read */
    for (int s = 0; s < batch->n_seqs; s++) {
        const int64_t n_new = c.q_start[s + 1] - c.q_start[s];
        if (uses_tiles(&c, s)) {
            any_tiles = 1;
            continue;
        }
        row_items += n_new;
        for (int64_t j = 0; j < n_new; j++) {
            const int64_t pos = c.seq_len[s] - n_new + j;
            row_bytes += (double)(pos + 1 - first_key(&c, pos)) * 2.0 * (double)c.row *
                         (double)dtype_size(k_cache->dtype);
        }
    }
    c.prefetch = row_bytes >= (double)ATTN_PREFETCH_MIN_BYTES;
    /* A row's KV heads go together (whole cache slots per pass) unless that leaves several
     * threads with fewer than two work items each: then they are split into as few parts as
     * give that. */
    const int64_t want = b->n_threads > 1 ? 2 * (int64_t)b->n_threads : 1;
    int64_t split = row_items == 0 || row_items >= want ? 1 : (want + row_items - 1) / row_items;
    if (split > c.n_kv) split = c.n_kv;
    c.row_kv = (c.n_kv + split - 1) / split;
    const int64_t row_parts = (c.n_kv + c.row_kv - 1) / c.row_kv;
    size_t per = row_scratch(&c);
    if (any_tiles && tile_scratch(&c) > per) per = tile_scratch(&c);
    float *scratch = cpu_scratch(b, per);
    const size_t stride = cpu_scratch_stride(per);
    const int64_t n_kv = c.n_kv;

    /* A call that reads little (a small model's decode: stories260K's 64 KB at position 256)
     * runs on the calling thread: the team's fork and join cost more than the split saves
     * (2-thread decode was slower than 1-thread there). The same items either way. */
    const int par = b->n_threads > 1 && (any_tiles || row_bytes >= (double)ATTN_PARALLEL_MIN_BYTES);
    #pragma omp parallel num_threads(b->n_threads) if (par)
    {
        float *ws = scratch + (size_t)omp_get_thread_num() * stride;
        /* Every thread meets the same loops in the same order; nowait lets a thread that runs
         * out of one sequence's tiles start on the next one's. */
        for (int s = 0; any_tiles && s < batch->n_seqs; s++) {
            if (!uses_tiles(&c, s)) continue;
            const int64_t n_new = c.q_start[s + 1] - c.q_start[s];
            const int64_t n_tiles = (n_new + c.tile_rows - 1) / c.tile_rows;
            #pragma omp for schedule(dynamic, 1) nowait
            for (int64_t j = 0; j < n_tiles * n_kv; j++) {
                const int64_t tile = n_tiles - 1 - j / n_kv, r0 = tile * c.tile_rows;
                const int64_t nr = n_new - r0 < c.tile_rows ? n_new - r0 : c.tile_rows;
                attend_tile(&c, ws, s, c.q_start[s] + r0, nr, j % n_kv);
            }
        }
        if (row_items > 0) {
            #pragma omp for schedule(dynamic, 1) nowait
            for (int64_t item = 0; item < n * row_parts; item++) {
                const int64_t t = item / row_parts, kv0 = item % row_parts * c.row_kv;
                const int s = seq_of_row(c.q_start, batch->n_seqs, t);
                if (!uses_tiles(&c, s))
                    attend_row(&c, ws, s, t, kv0, n_kv - kv0 < c.row_kv ? n_kv - kv0 : c.row_kv);
            }
        }
    }
}
