/* tests/test_ops_attention.c - test_ops's cases of op_kv_write and op_attention (paged, causal,
 * windowed, soft-capped, with GPT-OSS's sinks) against a double-precision reference written here
 * from the definition; the harness, the tolerances and the other ops are test_ops.c's (one
 * executable: `test_ops --filter attention` runs these). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"
#include "test_ops_impl.h"

/* The attention batch of a case, described on the host. */
struct attn_spec {
    const char *label;
    int         n_heads, n_kv_heads, head_dim, block_tokens, window;
    double      scale;      /* 0: 1 / sqrt(head_dim) */
    int         n_seqs;
    int         seq_len[6]; /* tokens in the cache after this step's rows were written */
    int         n_new[6];   /* query rows this step; 0 allowed */
};

/* Paged causal attention, straight from the definition: for each query row, gather the
 * attended K/V rows through the block table, full softmax of the scaled scores in double,
 * weighted sum of V. q, out (rows, H, D); caches (n_blocks, bt, Hk, D); table (n_seqs, max_blocks).
 * sinks (H) or NULL: head h's sink S joins the softmax's denominator only, unscaled and
 * uncapped: max m = max(S, scores), sum e^(S - m) + sum_j e^(s_j - m) (ops.h).
 * mag as documented in the tolerance table, plus u_tc / 2 sum_j p_j |v_j| (prefill_tc_roundoff). */
static void ref_attention(const struct attn_spec *sp, double scale, double softcap, const int32_t *q_start,
                          const int32_t *seq_len, const int32_t *table, int max_blocks,
                          const double *q, const double *kc, const double *vc, const double *sinks,
                          double u_tc, double *out, double *mag)
{
    int H = sp->n_heads, Hk = sp->n_kv_heads, D = sp->head_dim, bt = sp->block_tokens;
    int group = H / Hk, max_len = 1;
    for (int s = 0; s < sp->n_seqs; s++)
        if (seq_len[s] > max_len) max_len = seq_len[s];
    double *p = xcalloc((size_t)max_len, sizeof(double));
    const double **krow = xcalloc((size_t)max_len, sizeof(double *));
    const double **vrow = xcalloc((size_t)max_len, sizeof(double *));
    for (int s = 0; s < sp->n_seqs; s++) {
        int n_new = q_start[s + 1] - q_start[s], len = seq_len[s];
        for (int j = 0; j < n_new; j++) {
            int row = q_start[s] + j, pos = len - n_new + j;
            int lo = sp->window > 0 && pos - sp->window + 1 > 0 ? pos - sp->window + 1 : 0;
            for (int h = 0; h < H; h++) {
                const double *qv = q + ((size_t)row * H + h) * D;
                int kvh = h / group;
                double smax = -INFINITY, qk_abs_max = 0.0;
                for (int t = lo; t <= pos; t++) {
                    int blk = table[(size_t)s * max_blocks + t / bt];
                    size_t off = (((size_t)blk * bt + t % bt) * Hk + kvh) * D;
                    krow[t - lo] = kc + off;
                    vrow[t - lo] = vc + off;
                    double dot = 0.0, dot_abs = 0.0;
                    for (int d = 0; d < D; d++) {
                        dot += qv[d] * krow[t - lo][d];
                        dot_abs += fabs(qv[d] * krow[t - lo][d]);
                    }
                    p[t - lo] = scale * dot;
                    if (softcap > 0) p[t - lo] = softcap * tanh(p[t - lo] / softcap);
                    if (p[t - lo] > smax) smax = p[t - lo];
                    if (dot_abs > qk_abs_max) qk_abs_max = dot_abs;
                }
                int n_ctx = pos - lo + 1;
                if (sinks && sinks[h] > smax) smax = sinks[h];
                double sum = sinks ? exp(sinks[h] - smax) : 0.0;
                for (int t = 0; t < n_ctx; t++) sum += p[t] = exp(p[t] - smax);
                double factor = 4.0 + 2.0 * sqrt((double)n_ctx) +
                                2.0 * sqrt((double)D) * scale * qk_abs_max;
                for (int d = 0; d < D; d++) {
                    double o = 0.0, o_abs = 0.0;
                    for (int t = 0; t < n_ctx; t++) {
                        o += p[t] / sum * vrow[t][d];
                        o_abs += p[t] / sum * fabs(vrow[t][d]);
                    }
                    out[((size_t)row * H + h) * D + d] = o;
                    mag[((size_t)row * H + h) * D + d] = o_abs * factor + 0.5 * u_tc * o_abs;
                }
            }
        }
    }
    free(p);
    free(krow);
    free(vrow);
}

/* CUDA's tensor-core prefill (SHARDLM_CUDA_ATTENTION unset or auto on a batch that is not
 * decode-only, or tc on any; bf16 or f16 at head_dim 32, 64 or 128: kernels/cuda/attention.cu)
 * rounds the probabilities to the 16-bit dtype u before their product with V: outputs move by up
 * to about u sum_j p_j |v_j| (twice that allowed, as test_attention_train.c's bound does; in
 * units of U32, since mag is scaled by the tolerance's 4 U32). It joins the bound of every backend
 * of the run. */
static double prefill_tc_roundoff(const struct suite *s, enum dtype dt, int head_dim, int decode_only)
{
    const char *e = getenv("SHARDLM_CUDA_ATTENTION");
    const int forced = e && !strcmp(e, "tc"), automatic = !e || !*e || !strcmp(e, "auto");
    const int fits = dt != DTYPE_F32 && (head_dim == 32 || head_dim == 64 || head_dim == 128);
    return s->n_backends > 1 && fits && (forced || (automatic && !decode_only)) ? storage_rounding[dt].u / U32 : 0.0;
}

/* ==== cases ================================================================================= */

/* ---- kv_write ------------------------------------------------------------------------------ */

/* n new tokens go to distinct random slots of a cache pre-filled with other values; with pad,
 * every fourth token has a negative slot and must be skipped. The whole cache is compared bit
 * for bit: written slots hold the new rows, every other slot keeps its old contents. */
static void case_kv_write(struct suite *s, enum dtype dt, int n, int n_blocks, int bt, int hk,
                          int hd, int pad)
{
    char name[128];
    snprintf(name, sizeof name, "kv_write %s n=%d n_blocks=%d block_tokens=%d kv_heads=%d "
             "head_dim=%d%s", dtype_name(dt), n, n_blocks, bt, hk, hd, pad ? " padded" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t row = (size_t)hk * hd, n_slots = (size_t)n_blocks * bt;
    size_t ncache = n_slots * row, nk = (size_t)n * row, es = dtype_size(dt);
    CHECK((size_t)n <= n_slots, "kv_write case: %d tokens for %zu slots", n, n_slots);
    struct hbuf k0 = hbuf_uniform(s, dt, ncache, &r, -9, 9);
    struct hbuf v0 = hbuf_uniform(s, dt, ncache, &r, -9, 9);
    struct hbuf k = hbuf_uniform(s, dt, nk, &r, -1, 1);
    struct hbuf vv = hbuf_uniform(s, dt, nk, &r, -1, 1);
    int *perm = case_alloc(s, n_slots, sizeof(int));
    for (size_t i = 0; i < n_slots; i++) perm[i] = (int)i;
    rng_shuffle(&r, perm, (int)n_slots);
    int32_t *slots = case_alloc(s, (size_t)n, sizeof(int32_t));
    for (int t = 0; t < n; t++) slots[t] = pad && t % 4 == 1 ? -1 - t : perm[t];
    uint8_t *want_k = case_alloc(s, ncache, es), *want_v = case_alloc(s, ncache, es);
    memcpy(want_k, k0.bits, ncache * es);
    memcpy(want_v, v0.bits, ncache * es);
    for (int t = 0; t < n; t++) {
        if (slots[t] < 0) continue;
        memcpy(want_k + (size_t)slots[t] * row * es, (uint8_t *)k.bits + t * row * es, row * es);
        memcpy(want_v + (size_t)slots[t] * row * es, (uint8_t *)vv.bits + t * row * es, row * es);
    }
    double *want[2] = {decode(s, want_k, dt, ncache), decode(s, want_v, dt, ncache)};
    struct verdict v = {.worst_ratio = -1.0};
    double *got_k[2] = {0}, *got_v[2] = {0};
    void *bits_k = case_alloc(s, ncache, es), *bits_v = case_alloc(s, ncache, es);
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tkc = arena_out(&a, "k_cache", dt, S4(n_blocks, bt, hk, hd), k0.bits, bits_k);
        struct tensor tvc = arena_out(&a, "v_cache", dt, S4(n_blocks, bt, hk, hd), v0.bits, bits_v);
        struct tensor tk = arena_in(&a, "k", dt, S3(n, hk, hd), k.bits);
        struct tensor tv = arena_in(&a, "v", dt, S3(n, hk, hd), vv.bits);
        struct tensor ts = arena_in(&a, "slots", DTYPE_I32, S1(n), slots);
        if (SUPPORTED(&v, b, kv_write)) op_kv_write(b, &tkc, &tvc, &tk, &tv, &ts);
        arena_finish(&a, &v);
        got_k[bi] = decode(s, bits_k, dt, ncache);
        got_v[bi] = decode(s, bits_v, dt, ncache);
    }
    /* Rows of the comparison are cache slots. */
    check_exact(s, &v, "k_cache", got_k, want[0], ncache, row, 1);
    check_exact(s, &v, "v_cache", got_v, want[1], ncache, row, 1);
    case_end(s, name, &v);
}

/* ---- attention ----------------------------------------------------------------------------- */

/* The attention sinks of a case (attention_batch.sinks, f32 whatever the dtype): none; one per
 * query head drawn from N(0, 1), beside scores of about that size; +30, which takes nearly all
 * the weight (outputs about e^-28 times the values, still against the reference); 1e30, which
 * takes all of it (outputs within 1e-30 of 0, finite); -1e30, which takes none (the output must
 * be, bit for bit, that of the same call without sinks). */
enum sink_kind { SINK_NONE, SINK_NORMAL, SINK_LARGE, SINK_HUGE, SINK_NEG_HUGE };
static const char *const sink_names[] = {"", " sinks N(0,1)", " sinks +30", " sinks 1e30",
                                         " sinks -1e30"};

/* Builds the paged cache of a batch: physical blocks are a random permutation of the pool (so a
 * sequence's blocks are neither contiguous nor in order); every slot that holds no token of a
 * sequence (the tail of each last block, and three spare blocks) is NaN; block-table entries
 * past a sequence's last block point at the NaN spare blocks. A kernel that reads any of those
 * produces NaN. */
static void case_attention(struct suite *s, enum dtype dt, const struct attn_spec *sp, double softcap,
                           enum sink_kind sink)
{
    char name[192];
    char cap[32] = "";
    if (softcap > 0) snprintf(cap, sizeof cap, " softcap %g", softcap);
    snprintf(name, sizeof name, "attention %s %s (heads %d/%d head_dim %d block_tokens %d window "
             "%d seqs %d%s%s)", dtype_name(dt), sp->label, sp->n_heads, sp->n_kv_heads, sp->head_dim,
             sp->block_tokens, sp->window, sp->n_seqs, cap, sink_names[sink]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    int H = sp->n_heads, Hk = sp->n_kv_heads, D = sp->head_dim, bt = sp->block_tokens;
    float scale = sp->scale > 0 ? (float)sp->scale : 1.0f / sqrtf((float)D);
    int n_seqs = sp->n_seqs, max_blocks = 1, used = 0;
    int32_t *q_start = case_alloc(s, (size_t)n_seqs + 1, sizeof(int32_t));
    int32_t *seq_len = case_alloc(s, (size_t)n_seqs + 1, sizeof(int32_t));
    for (int i = 0; i < n_seqs; i++) {
        CHECK(sp->n_new[i] <= sp->seq_len[i], "%s: more new rows than tokens", sp->label);
        q_start[i + 1] = q_start[i] + sp->n_new[i];
        seq_len[i] = sp->seq_len[i];
        int nb = (sp->seq_len[i] + bt - 1) / bt;
        used += nb;
        if (nb + 1 > max_blocks) max_blocks = nb + 1; /* +1: every row has an unused entry */
    }
    int n_rows = q_start[n_seqs], n_blocks = used + 3;
    /* The hint as the engine sets it (every sequence brings one row): on CUDA it selects the
     * split-K decode kernel, unless SHARDLM_CUDA_ATTENTION says otherwise. */
    int decode_only = n_seqs > 0;
    for (int i = 0; i < n_seqs; i++) decode_only = decode_only && sp->n_new[i] == 1;
    int *perm = case_alloc(s, (size_t)n_blocks, sizeof(int));
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    rng_shuffle(&r, perm, n_blocks);
    int32_t *table = case_alloc(s, (size_t)n_seqs * max_blocks + 1, sizeof(int32_t));
    size_t ncache = (size_t)n_blocks * bt * Hk * D;
    struct hbuf kc = hbuf_make(s, dt, ncache), vc = hbuf_make(s, dt, ncache);
    for (size_t i = 0; i < ncache; i++) {
        hbuf_set(&kc, i, NAN);
        hbuf_set(&vc, i, NAN);
    }
    for (int i = 0, next = 0; i < n_seqs; i++) {
        int nb = (sp->seq_len[i] + bt - 1) / bt;
        for (int j = 0; j < max_blocks; j++)
            table[(size_t)i * max_blocks + j] = j < nb ? perm[next++] : perm[used + j % 3];
        for (int t = 0; t < sp->seq_len[i]; t++) {
            size_t off = ((size_t)table[(size_t)i * max_blocks + t / bt] * bt + t % bt) * Hk * D;
            for (int e = 0; e < Hk * D; e++) {
                hbuf_set(&kc, off + e, rng_range(&r, -1, 1));
                hbuf_set(&vc, off + e, rng_range(&r, -1, 1));
            }
        }
    }
    /* Queries in [-2, 2] give scores of standard deviation about 1 at scale 1/sqrt(D): softmax
     * weights that are neither uniform nor one-hot. */
    size_t no = (size_t)n_rows * H * D;
    struct hbuf q = hbuf_uniform(s, dt, no, &r, -2, 2);
    float *sinks = case_alloc(s, (size_t)H, sizeof(float));
    double *sinks_val = case_alloc(s, (size_t)H, sizeof(double));
    for (int h = 0; h < H; h++) {
        sinks[h] = sink == SINK_NORMAL ? (float)rng_normal(&r) : sink == SINK_LARGE ? 30.0f
                   : sink == SINK_HUGE ? 1e30f : -1e30f;
        sinks_val[h] = sinks[h];
    }
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    ref_attention(sp, (double)scale, softcap, q_start, seq_len, table, max_blocks, q.val, kc.val, vc.val,
                  sink != SINK_NONE ? sinks_val : NULL, prefill_tc_roundoff(s, dt, D, decode_only), want, mag);
    make_tol(tol, OP_ATTENTION, dt, want, mag, no);
    /* The reference is 0; a backend's exp may keep a tiny weight per key (the CPU's clamps its
     * argument at -87: about 1e-38). */
    if (sink == SINK_HUGE)
        for (size_t i = 0; i < no; i++) tol[i] = 1e-30;
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0}, *plain[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt)), *bits_plain = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tq = arena_in(&a, "q", dt, S3(n_rows, H, D), q.bits);
        struct tensor tkc = arena_in(&a, "k_cache", dt, S4(n_blocks, bt, Hk, D), kc.bits);
        struct tensor tvc = arena_in(&a, "v_cache", dt, S4(n_blocks, bt, Hk, D), vc.bits);
        struct tensor to = arena_out(&a, "out", dt, S3(n_rows, H, D), NULL, bits);
        struct attention_batch batch = {
            .n_seqs = n_seqs,
            .block_tokens = bt,
            .max_blocks = max_blocks,
            .q_start = arena_in(&a, "q_start", DTYPE_I32, S1(n_seqs + 1), q_start),
            .seq_len = arena_in(&a, "seq_len", DTYPE_I32, S1(n_seqs), seq_len),
            .block_table = arena_in(&a, "block_table", DTYPE_I32, S2(n_seqs, max_blocks), table),
            .scale = scale,
            .window = sp->window,
            .softcap = (float)softcap,
            .decode_only = decode_only,
        };
        if (sink != SINK_NONE) batch.sinks = arena_in(&a, "sinks", DTYPE_F32, S1(H), sinks);
        if (SUPPORTED(&v, b, attention)) op_attention(b, &to, &tq, &tkc, &tvc, &batch);
        if (sink == SINK_NEG_HUGE) { /* the same call without sinks */
            struct tensor tp = arena_out(&a, "out without sinks", dt, S3(n_rows, H, D), NULL, bits_plain);
            batch.sinks = (struct tensor){0};
            if (SUPPORTED(&v, b, attention)) op_attention(b, &tp, &tq, &tkc, &tvc, &batch);
        }
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
        plain[bi] = decode(s, bits_plain, dt, no);
    }
    /* Rows of the comparison are (query row, head). */
    check_close(s, &v, "out", got, want, tol, no, (size_t)D);
    /* Row invariance on the CPU: each query row computed alone, as a decode row of a sequence that
     * ends at its position (the row path, its query heads split across the threads), is bit for
     * bit the row computed in the batch: a decode row beside others (the heads kept together), or
     * a row of a prefill chunk that took the tiles (the passes of both paths lie at the same
     * positions, kernels/cpu/attention.c): so a prompt's rows do not change with the prefill's
     * split or a prefix-cache hit. */
    for (int bi = 0; n_rows > 1 && bi < s->n_backends; bi++) {
        if (strcmp(s->backend_name[bi], "cpu") != 0) continue;
        struct backend *b = s->backend[bi];
        const size_t per_row = (size_t)H * D, es = dtype_size(dt);
        void *bits_alone = case_alloc(s, no, es);
        for (int i = 0; i < n_seqs; i++)
            for (int t = q_start[i]; t < q_start[i + 1]; t++) {
                int32_t one_start[2] = {0, 1}, one_len[1] = {seq_len[i] - (q_start[i + 1] - t) + 1};
                struct arena a = {.b = b};
                struct tensor tq = arena_in(&a, "q", dt, S3(1, H, D), (const char *)q.bits + (size_t)t * per_row * es);
                struct tensor tkc = arena_in(&a, "k_cache", dt, S4(n_blocks, bt, Hk, D), kc.bits);
                struct tensor tvc = arena_in(&a, "v_cache", dt, S4(n_blocks, bt, Hk, D), vc.bits);
                struct tensor to = arena_out(&a, "out alone", dt, S3(1, H, D), NULL, (char *)bits_alone + (size_t)t * per_row * es);
                struct attention_batch batch = {
                    .n_seqs = 1, .block_tokens = bt, .max_blocks = max_blocks,
                    .q_start = arena_in(&a, "q_start", DTYPE_I32, S1(2), one_start),
                    .seq_len = arena_in(&a, "seq_len", DTYPE_I32, S1(1), one_len),
                    .block_table = arena_in(&a, "block_table", DTYPE_I32, S2(1, max_blocks), table + (size_t)i * max_blocks),
                    .scale = scale, .window = sp->window, .softcap = (float)softcap, .decode_only = 1,
                };
                if (sink != SINK_NONE) batch.sinks = arena_in(&a, "sinks", DTYPE_F32, S1(H), sinks);
                op_attention(b, &to, &tq, &tkc, &tvc, &batch);
                arena_finish(&a, &v);
            }
        compare_exact(&v, "cpu: every row alone (a decode row at its position) vs in the batch", decode(s, bits_alone, dt, no),
                      got[bi], no, (size_t)D, 0);
    }
    for (int bi = 0; sink == SINK_NEG_HUGE && bi < s->n_backends; bi++) {
        char what[64];
        snprintf(what, sizeof what, "%s: out with sinks -1e30 vs without", s->backend_name[bi]);
        compare_exact(&v, what, got[bi], plain[bi], no, (size_t)D, 1);
    }
    case_end(s, name, &v);
}

/* Soft-capped scores (Gemma 2: cap * tanh(s / cap)), large enough (scale 0.5) that tanh bends
 * them: the tile path, the row path, decode; with the cap of each. */
static const struct attn_spec attn_softcap_specs[] = {
    {"prefill tiles window=9", 8, 2, 64, 16, 9, 0.5, 1, {150}, {150}},
    {"rows mixed", 4, 2, 32, 16, 0, 0.4, 2, {20, 9}, {5, 1}},
    {"decode", 8, 2, 64, 16, 0, 0.5, 3, {40, 300, 7}, {1, 1, 1}},
};
static const double attn_softcaps[] = {5.0, 2.0, 3.0};

static const struct attn_spec attn_specs[] = {
    /* A fresh prefill, a prefill chunk continuing after 35 cached tokens, a decode row, and a
     * first-token decode, in one batch. */
    {"gqa4 mixed", 8, 2, 64, 16, 0, 0, 4, {17, 40, 33, 1}, {17, 5, 1, 1}},
    {"mha block_tokens=1", 8, 8, 16, 1, 0, 0, 3, {5, 9, 1}, {1, 3, 1}},
    {"mqa block_tokens=3", 8, 1, 128, 3, 0, 0, 3, {10, 7, 20}, {10, 1, 4}},
    {"gqa2 head_dim=80 window=7", 8, 4, 80, 16, 7, 0, 3, {30, 50, 3}, {12, 1, 3}},
    {"window=1", 4, 2, 8, 3, 1, 0, 2, {6, 4}, {6, 1}},
    {"window>context", 4, 4, 16, 16, 100, 0, 2, {20, 35}, {20, 1}},
    /* A sequence that contributes no rows this step sits between two that do. */
    {"seq without rows", 8, 2, 64, 16, 0, 0, 3, {20, 16, 33}, {1, 0, 2}},
    {"empty batch", 8, 2, 64, 16, 0, 0, 0, {0}, {0}},
    /* Long contexts, where a GPU kernel may split the context across blocks. */
    {"long decode", 8, 1, 64, 16, 0, 0, 2, {2000, 1100}, {1, 1}},
    {"long decode window=256", 8, 2, 128, 16, 256, 0, 2, {1500, 300}, {1, 1}},
    {"block-aligned scale=0.3", 8, 2, 128, 16, 0, 0.3, 2, {64, 16}, {64, 1}},
    {"prefill chunk window=32", 4, 1, 64, 16, 32, 0, 1, {200}, {50}},
    {"head_dim=8 decode batch", 4, 2, 8, 16, 0, 0, 6, {1, 2, 15, 16, 17, 100}, {1, 1, 1, 1, 1, 1}},
    /* The CPU backend's two paths (kernels/cpu/attention.c): a sequence bringing 16 query vectors
     * or more (rows x group) goes through tiles of 128 / group rows and 64 keys, the others row
     * by row, 32 keys a pass. These cases put every tile boundary somewhere: several tiles and a
     * last partial one for each group size, head_dim off the 16-lane vectors, windows shorter
     * than a tile (rows that see none of a key tile), chunks continuing a cached prefix, the
     * threshold on either side, a row's KV heads split across threads or kept together, and a
     * decode batch large enough (16 MiB of K+V) for the row path's prefetching. */
    {"prefill tiles gqa4 300 rows", 8, 2, 64, 16, 0, 0, 1, {300}, {300}},
    {"prefill tiles mha 200 rows", 4, 4, 32, 16, 0, 0, 1, {200}, {200}},
    {"prefill tiles gqa2 head_dim=72", 8, 4, 72, 16, 0, 0, 1, {150}, {150}},
    {"prefill head_dim=36 window=5", 4, 1, 36, 8, 5, 0, 1, {130}, {130}},
    {"prefill chunk after 160 cached window=40", 4, 2, 48, 16, 40, 0, 1, {260}, {100}},
    {"mixed chunks, decode, threshold", 8, 2, 64, 16, 0, 0, 6, {250, 77, 70, 40, 5, 100},
     {120, 1, 70, 3, 4, 1}},
    {"group 8 two-row tile", 8, 1, 16, 4, 0, 0, 3, {9, 30, 2}, {2, 1, 2}},
    {"decode kv heads split", 16, 8, 64, 16, 0, 0, 1, {700}, {1}},
    {"decode batch kv heads together", 16, 8, 32, 16, 0, 0, 6, {50, 300, 17, 64, 129, 1},
     {1, 1, 1, 1, 1, 1}},
    {"decode 16 MiB prefetched", 8, 1, 128, 16, 0, 0, 4, {8192, 8192, 8192, 8192}, {1, 1, 1, 1}},
    /* Decode batches (decode_only set): on CUDA the split-K decode kernel (kernels/cuda/
     * attention.cu), whose split count comes from max_blocks * block_tokens, so the short
     * sequences beside a long one leave most of their splits empty. Head tiles of 1, 2, 4 and 8
     * query heads (a group of 3 fills 3 of 4, a group of 16 takes two tiles), 1 to 32 lanes per
     * key (head_dim 8 to 256), block_tokens 16 and 32 and one that divides nothing, windows
     * shorter and longer than a split, a window of 1. */
    {"split decode gqa4 head_dim=128", 32, 8, 128, 16, 0, 0, 4, {1, 17, 4100, 300}, {1, 1, 1, 1}},
    {"split decode gqa8 head_dim=256", 8, 1, 256, 32, 0, 0, 3, {4097, 1, 17}, {1, 1, 1}},
    {"split decode gqa4 head_dim=256 window=1000", 4, 1, 256, 16, 1000, 0, 3, {4500, 17, 1},
     {1, 1, 1}},
    {"split decode gqa4 head_dim=64 window=100", 32, 8, 64, 32, 100, 0, 4, {1, 17, 4096, 129},
     {1, 1, 1, 1}},
    {"split decode gqa3 head_dim=80", 12, 4, 80, 16, 0, 0, 3, {1, 17, 600}, {1, 1, 1}},
    {"split decode gqa16 head_dim=128", 16, 1, 128, 16, 0, 0, 3, {1, 2000, 17}, {1, 1, 1}},
    {"split decode gqa2 head_dim=96 block_tokens=7", 4, 2, 96, 7, 0, 0, 3, {300, 1, 1030},
     {1, 1, 1}},
    {"split decode mha head_dim=16 window=1", 4, 4, 16, 16, 1, 0.5, 2, {50, 1}, {1, 1}},
    {"split decode one long sequence", 8, 2, 128, 16, 0, 0, 1, {8300}, {1}},
};

/* Attention sinks (GPT-OSS) on both CPU paths and both CUDA kernels: prefill chunks that take
 * the tiles (one continuing a cached prefix), short chunks and decode rows that take the row
 * path, windows of 0 and 4, GQA groups of 2 and 4; decode batches (CUDA's split-K kernel, one
 * split and several); a soft-capped case, whose sinks must not be capped; and the extreme sinks
 * of enum sink_kind on a mixed batch and on decode. */
static const struct {
    struct attn_spec sp;
    double           softcap;
    enum sink_kind   sink;
} attn_sink_cases[] = {
    {{"sinks prefill tiles gqa4", 8, 2, 64, 16, 0, 0, 2, {40, 70}, {40, 30}}, 0, SINK_NORMAL},
    {{"sinks mixed window=4", 8, 2, 32, 4, 4, 0, 4, {30, 9, 50, 1}, {20, 1, 1, 1}}, 0, SINK_NORMAL},
    {{"sinks short chunks gqa2 window=4", 4, 2, 16, 3, 4, 0, 3, {7, 12, 5}, {3, 2, 5}}, 0,
     SINK_NORMAL},
    {{"sinks decode gqa4", 8, 2, 64, 16, 0, 0, 3, {1, 300, 17}, {1, 1, 1}}, 0, SINK_NORMAL},
    {{"sinks decode gqa2 window=4", 8, 4, 64, 16, 4, 0, 3, {100, 3, 1}, {1, 1, 1}}, 0, SINK_NORMAL},
    {{"sinks long decode gqa4", 8, 2, 128, 16, 0, 0, 2, {2000, 17}, {1, 1}}, 0, SINK_NORMAL},
    {{"sinks prefill tiles", 8, 2, 64, 16, 0, 0.5, 1, {60}, {60}}, 2.0, SINK_NORMAL},
    {{"sinks mixed window=4", 8, 2, 32, 4, 4, 0, 4, {30, 9, 50, 1}, {20, 1, 1, 1}}, 0, SINK_LARGE},
    {{"sinks long decode gqa4", 8, 2, 128, 16, 0, 0, 2, {2000, 17}, {1, 1}}, 0, SINK_LARGE},
    {{"sinks mixed window=4", 8, 2, 32, 4, 4, 0, 4, {30, 9, 50, 1}, {20, 1, 1, 1}}, 0, SINK_HUGE},
    {{"sinks decode gqa4", 8, 2, 64, 16, 0, 0, 3, {1, 300, 17}, {1, 1, 1}}, 0, SINK_HUGE},
    {{"sinks mixed window=4", 8, 2, 32, 4, 4, 0, 4, {30, 9, 50, 1}, {20, 1, 1, 1}}, 0,
     SINK_NEG_HUGE},
    {{"sinks long decode gqa4", 8, 2, 128, 16, 0, 0, 2, {2000, 17}, {1, 1}}, 0, SINK_NEG_HUGE},
};

void run_attention_cases(struct suite *s)
{
    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_kv_write(s, dt, 1, 4, 16, 2, 64, 0);
        case_kv_write(s, dt, 17, 8, 3, 1, 80, 0);
        case_kv_write(s, dt, 5, 6, 1, 8, 8, 0);
        case_kv_write(s, dt, 33, 4, 16, 4, 128, 1);
        case_kv_write(s, dt, 0, 2, 16, 2, 16, 0);
    }

    for (int di = 0; di < 3; di++) {
        for (size_t i = 0; i < sizeof attn_specs / sizeof attn_specs[0]; i++)
            case_attention(s, float_dtypes[di], &attn_specs[i], 0.0, SINK_NONE);
        for (size_t i = 0; i < sizeof attn_softcap_specs / sizeof attn_softcap_specs[0]; i++)
            case_attention(s, float_dtypes[di], &attn_softcap_specs[i], attn_softcaps[i], SINK_NONE);
        for (size_t i = 0; i < sizeof attn_sink_cases / sizeof attn_sink_cases[0]; i++)
            case_attention(s, float_dtypes[di], &attn_sink_cases[i].sp, attn_sink_cases[i].softcap,
                           attn_sink_cases[i].sink);
    }
}
