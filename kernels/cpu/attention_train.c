/* kernels/cpu/attention_train.c - op_attention_train and op_attention_train_backward on the
 * CPU: causal grouped-query self-attention over the packed documents of a training
 * micro-batch, flash-style (the attention matrix is never stored; the forward keeps the f32
 * log-sum-exp of each (row, head) and the backward recomputes the probabilities from it).
 *
 * Work is split into items of (block of TRAIN_BQ consecutive rows, KV head); the query heads
 * that share a KV head are processed together, so that each K/V row is converted and read once
 * per item. A block that straddles a document boundary is processed as one segment per
 * document. Keys are visited in tiles of TRAIN_BK rows; each query row only visits the part of
 * a tile it attends to (its document, causal, its window; or, bidirectional, its whole document).
 * - Forward: per item, an online softmax over the key tiles (running max and sum, rescaled when
 *   the max grows), as in attention.c.
 * - Backward, in two passes that each own their outputs, so that no two threads ever add into
 *   the same element (deterministic, no atomics, no per-thread partial sums to reduce):
 *   pass 1, per (query block, KV head): dq_i = scale sum_j dS_ij k_j;
 *   pass 2, per (key block, KV head): dv_j = sum_i P_ij dout_i and dk_j = scale sum_i dS_ij q_i,
 *   summed over the query heads of the group;
 *   with P_ij = exp(s_ij - lse_i), dS_ij = P_ij (dout_i . v_j - D_i), D_i = dout_i . out_i.
 *   The scores are recomputed in both passes (one QK^T and one dout V^T more than a fused
 *   backward with atomics would need).
 * All arithmetic is f32; storage may be f32, bf16 or f16 (converted on load, rounded once on
 * store). Scores are (scale * q) . k, the same f32 expression as the forward's, so the backward
 * recomputes exactly the probabilities that the forward normalised.
 * Not here: the paged attention of serving (attention.c).
 * Tests: tests/test_attention_train.c. */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

#define TRAIN_BQ 32 /* query rows per work item */
#define TRAIN_BK 32 /* key rows per tile */

/* The document that holds row i: the last d < n_docs with doc_start[d] <= i (empty documents
 * before it share its start and are skipped by taking the last). */
static int doc_of_row(const int32_t *doc_start, int n_docs, int64_t i)
{
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (doc_start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The contract on the batch's index data (ops.h), checked where it lives. */
static void check_docs(const struct attention_train_batch *batch, int64_t n)
{
    const int32_t *ds = batch->doc_start.data;
    CHECK(ds[0] == 0 && ds[batch->n_docs] == n, "attention_train: doc_start must span 0..%lld, is %d..%d",
          (long long)n, ds[0], ds[batch->n_docs]);
    for (int d = 0; d < batch->n_docs; d++)
        CHECK(ds[d] <= ds[d + 1], "attention_train: doc_start decreases at document %d (%d > %d)", d,
              ds[d], ds[d + 1]);
}

/* The first row that row i attends to: the start of its document, or of its window. */
static int64_t first_key(int64_t doc_begin, int64_t i, int window)
{
    return window > 0 && i - window + 1 > doc_begin ? i - window + 1 : doc_begin;
}

/* dst[0..n) = row `offset` of t as f32, times alpha. */
/* A score soft-capped (ops.h: cap * tanh(s / cap); cap 0 = none), and the derivative of the cap
 * at its output z: 1 - (z / cap)^2. */
static inline float capped(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }
static inline float capped_grad(float z, float cap) { return cap > 0.0f ? 1.0f - (z / cap) * (z / cap) : 1.0f; }

static void load_scaled(const struct tensor *t, size_t offset, size_t n, float alpha, float *dst)
{
    if (t->dtype == DTYPE_F32) {
        const float *src = (const float *)t->data + offset;
        for (size_t i = 0; i < n; i++) dst[i] = src[i] * alpha;
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = dtype_load_f32(t->data, t->dtype, offset + i) * alpha;
    }
}

static void load(const struct tensor *t, size_t offset, size_t n, float *dst)
{
    if (t->dtype == DTYPE_F32) memcpy(dst, (const float *)t->data + offset, n * sizeof(float));
    else for (size_t i = 0; i < n; i++) dst[i] = dtype_load_f32(t->data, t->dtype, offset + i);
}

/* Row `offset` of t = src[0..n) * alpha, rounded once to t's dtype. */
static void store_scaled(const struct tensor *t, size_t offset, size_t n, float alpha, const float *src)
{
    if (t->dtype == DTYPE_F32) {
        float *dst = (float *)t->data + offset;
        for (size_t i = 0; i < n; i++) dst[i] = src[i] * alpha;
    } else {
        for (size_t i = 0; i < n; i++) dtype_store_f32(t->data, t->dtype, offset + i, src[i] * alpha);
    }
}

static float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    /* Vectorised: the reduction may be reordered (still f32). */
    #pragma omp simd reduction(+ : s)
    for (int64_t d = 0; d < n; d++) s += a[d] * b[d];
    return s;
}

static void axpy(float *y, float a, const float *x, int64_t n)
{
    #pragma omp simd
    for (int64_t d = 0; d < n; d++) y[d] += a * x[d];
}

/* Shapes of one call, shared by the forward and both backward passes. */
struct dims {
    int64_t n, n_heads, n_kv, group, hd;
};

static struct dims dims_of(const struct tensor *q, const struct tensor *k)
{
    struct dims d = {.n = q->shape[0], .n_heads = q->shape[1], .n_kv = k->shape[1], .hd = q->shape[2]};
    d.group = d.n_heads / d.n_kv;
    return d;
}

/* Element offset of (row i, head h) in a (n, heads, hd) tensor. */
static size_t at(int64_t i, int64_t h, int64_t heads, int64_t hd) { return (size_t)((i * heads + h) * hd); }

/* Loads keys [k0, k0 + nk) of KV head kvh of t (n, n_kv, hd) into dst (nk, hd). */
static void load_tile(const struct tensor *t, const struct dims *dm, int64_t k0, int64_t nk,
                      int64_t kvh, float *dst)
{
    for (int64_t j = 0; j < nk; j++) load(t, at(k0 + j, kvh, dm->n_kv, dm->hd), (size_t)dm->hd, dst + j * dm->hd);
}

void cpu_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                         const struct tensor *q, const struct tensor *k, const struct tensor *v,
                         const struct attention_train_batch *batch)
{
    const struct dims dm = dims_of(q, k);
    const int64_t hd = dm.hd, G = dm.group;
    if (dm.n == 0 || dm.n_heads == 0) return;
    check_docs(batch, dm.n);
    const int32_t *doc_start = batch->doc_start.data;
    const float scale = batch->scale, cap = batch->softcap;
    const int window = batch->window;
    const float *sinks = batch->sinks.data;

    /* Per thread: q (BQ*G, hd) | acc (BQ*G, hd) | scores (BQ*G, BK) | m, l (BQ*G) | K, V tiles (BK, hd) */
    const int64_t rows = TRAIN_BQ * G;
    const size_t per = (size_t)(2 * rows * hd + rows * TRAIN_BK + 2 * rows + 2 * TRAIN_BK * hd);
    float *scratch = cpu_scratch(b, per);
    const int64_t n_blocks = (dm.n + TRAIN_BQ - 1) / TRAIN_BQ;

    #pragma omp parallel for schedule(dynamic, 1) num_threads(b->n_threads)
    for (int64_t item = 0; item < n_blocks * dm.n_kv; item++) {
        const int64_t kvh = item % dm.n_kv, blk_end0 = (item / dm.n_kv + 1) * TRAIN_BQ;
        const int64_t blk_end = blk_end0 < dm.n ? blk_end0 : dm.n;
        float *qs = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        float *acc = qs + rows * hd, *sc = acc + rows * hd, *mx = sc + rows * TRAIN_BK;
        float *sum = mx + rows, *ks = sum + rows, *vs = ks + TRAIN_BK * hd;

        for (int64_t r0 = (item / dm.n_kv) * TRAIN_BQ, r1; r0 < blk_end; r0 = r1) {
            /* One segment: the rows of this block in one document. */
            const int d = doc_of_row(doc_start, batch->n_docs, r0);
            r1 = doc_start[d + 1] < blk_end ? doc_start[d + 1] : blk_end;
            const int64_t nr = r1 - r0, begin = doc_start[d];
            for (int64_t r = 0; r < nr; r++)
                for (int64_t g = 0; g < G; g++) {
                    const int64_t x = r * G + g;
                    load_scaled(q, at(r0 + r, kvh * G + g, dm.n_heads, hd), (size_t)hd, scale, qs + x * hd);
                    memset(acc + x * hd, 0, (size_t)hd * sizeof(float));
                    /* A sink starts the softmax as one more score, e^(S_h - S_h) = 1, with no value. */
                    mx[x] = sinks ? sinks[kvh * G + g] : -INFINITY;
                    sum[x] = sinks ? 1.0f : 0.0f;
                }

            /* Causal rows attend up to themselves; bidirectional ones to their document's end. */
            const int64_t key_end = batch->bidirectional ? doc_start[d + 1] : r1;
            for (int64_t k0 = first_key(begin, r0, window); k0 < key_end; k0 += TRAIN_BK) {
                const int64_t nk = key_end - k0 < TRAIN_BK ? key_end - k0 : TRAIN_BK;
                load_tile(k, &dm, k0, nk, kvh, ks);
                load_tile(v, &dm, k0, nk, kvh, vs);
                for (int64_t r = 0; r < nr; r++) {
                    /* The keys of this tile that row r0 + r attends to: jlo .. jhi. */
                    const int64_t lo = first_key(begin, r0 + r, window) - k0;
                    const int64_t hi = (batch->bidirectional ? key_end - 1 : r0 + r) - k0;
                    const int64_t jlo = lo > 0 ? lo : 0, jhi = hi < nk - 1 ? hi : nk - 1;
                    if (jlo > jhi) continue;
                    for (int64_t g = 0; g < G; g++) {
                        const int64_t x = r * G + g;
                        float *s = sc + x * TRAIN_BK, *a = acc + x * hd, tile_max = -INFINITY;
                        for (int64_t j = jlo; j <= jhi; j++) {
                            s[j] = capped(dot(qs + x * hd, ks + j * hd, hd), cap);
                            /* A NaN score sticks in tile_max, and from there poisons the row's
                             * max, sum and output rather than being skipped. */
                            tile_max = s[j] > tile_max || s[j] != s[j] ? s[j] : tile_max;
                        }
                        if (tile_max == -INFINITY) continue; /* only -inf scores: no weight */
                        if (tile_max > mx[x] || tile_max != tile_max) {
                            const float corr = expf(mx[x] - tile_max); /* 0 while mx = -inf */
                            sum[x] *= corr;
                            for (int64_t e = 0; e < hd; e++) a[e] *= corr;
                            mx[x] = tile_max;
                        }
                        for (int64_t j = jlo; j <= jhi; j++) {
                            const float p = expf(s[j] - mx[x]);
                            sum[x] += p;
                            axpy(a, p, vs + j * hd, hd);
                        }
                    }
                }
            }

            for (int64_t r = 0; r < nr; r++)
                for (int64_t g = 0; g < G; g++) {
                    const int64_t x = r * G + g, h = kvh * G + g;
                    /* sum >= 1: the max score (or the sink) contributes exp(0). */
                    store_scaled(out, at(r0 + r, h, dm.n_heads, hd), (size_t)hd, 1.0f / sum[x], acc + x * hd);
                    ((float *)lse->data)[(r0 + r) * dm.n_heads + h] = mx[x] + logf(sum[x]);
                }
        }
    }
}

/* Loads, for query rows r0 .. r0+nr-1 and the G heads of KV head kvh, scale * q into qs, dout
 * into dos, D = dout . out into dd and lse into ls (row x = r * G + g of each). */
static void load_queries(const struct tensor *q, const struct tensor *dout, const struct tensor *out,
                         const struct tensor *lse, const struct dims *dm, int64_t r0, int64_t nr,
                         int64_t kvh, float scale, float *qs, float *dos, float *dd, float *ls,
                         float *tmp)
{
    const int64_t hd = dm->hd, G = dm->group;
    for (int64_t r = 0; r < nr; r++)
        for (int64_t g = 0; g < G; g++) {
            const int64_t x = r * G + g, h = kvh * G + g;
            const size_t off = at(r0 + r, h, dm->n_heads, hd);
            load_scaled(q, off, (size_t)hd, scale, qs + x * hd);
            load(dout, off, (size_t)hd, dos + x * hd);
            load(out, off, (size_t)hd, tmp);
            dd[x] = dot(dos + x * hd, tmp, hd);
            ls[x] = ((const float *)lse->data)[(r0 + r) * dm->n_heads + h];
        }
}

void cpu_attention_train_backward(struct backend *b, const struct tensor *dq,
                                  const struct tensor *dk, const struct tensor *dv,
                                  const struct tensor *dout, const struct tensor *out,
                                  const struct tensor *lse, const struct tensor *q,
                                  const struct tensor *k, const struct tensor *v,
                                  const struct attention_train_batch *batch)
{
    const struct dims dm = dims_of(q, k);
    const int64_t hd = dm.hd, G = dm.group;
    if (dm.n == 0 || dm.n_heads == 0) return;
    check_docs(batch, dm.n);
    const int32_t *doc_start = batch->doc_start.data;
    const float scale = batch->scale, cap = batch->softcap;
    const int window = batch->window;

    /* Per thread: q, dout, dq (BQ*G, hd) | D, lse (BQ*G) | K, V, dK, dV tiles (BK, hd) | one
     * row of out (hd). Pass 1 leaves dK, dV unused, pass 2 dq. */
    const int64_t rows = TRAIN_BQ * G;
    const size_t per = (size_t)(3 * rows * hd + 2 * rows + 4 * TRAIN_BK * hd + hd);
    float *scratch = cpu_scratch(b, per);
    const int64_t n_blocks = (dm.n + TRAIN_BQ - 1) / TRAIN_BQ;
    const int64_t n_kblocks = (dm.n + TRAIN_BK - 1) / TRAIN_BK;

    /* Pass 1: dq, per (query block, KV head). */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(b->n_threads)
    for (int64_t item = 0; item < n_blocks * dm.n_kv; item++) {
        const int64_t kvh = item % dm.n_kv, blk_end0 = (item / dm.n_kv + 1) * TRAIN_BQ;
        const int64_t blk_end = blk_end0 < dm.n ? blk_end0 : dm.n;
        float *qs = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        float *dos = qs + rows * hd, *acc = dos + rows * hd, *dd = acc + rows * hd, *ls = dd + rows;
        float *ks = ls + rows, *vs = ks + TRAIN_BK * hd, *tmp = ks + 4 * TRAIN_BK * hd;

        for (int64_t r0 = (item / dm.n_kv) * TRAIN_BQ, r1; r0 < blk_end; r0 = r1) {
            const int d = doc_of_row(doc_start, batch->n_docs, r0);
            r1 = doc_start[d + 1] < blk_end ? doc_start[d + 1] : blk_end;
            const int64_t nr = r1 - r0, begin = doc_start[d];
            load_queries(q, dout, out, lse, &dm, r0, nr, kvh, scale, qs, dos, dd, ls, tmp);
            memset(acc, 0, (size_t)(nr * G * hd) * sizeof(float));

            for (int64_t k0 = first_key(begin, r0, window); k0 < r1; k0 += TRAIN_BK) {
                const int64_t nk = r1 - k0 < TRAIN_BK ? r1 - k0 : TRAIN_BK;
                load_tile(k, &dm, k0, nk, kvh, ks);
                load_tile(v, &dm, k0, nk, kvh, vs);
                for (int64_t r = 0; r < nr; r++) {
                    const int64_t lo = first_key(begin, r0 + r, window) - k0, hi = r0 + r - k0;
                    const int64_t jlo = lo > 0 ? lo : 0, jhi = hi < nk - 1 ? hi : nk - 1;
                    for (int64_t g = 0; g < G; g++) {
                        const int64_t x = r * G + g;
                        for (int64_t j = jlo; j <= jhi; j++) {
                            const float z = capped(dot(qs + x * hd, ks + j * hd, hd), cap);
                            const float p = expf(z - ls[x]);
                            const float ds = p * (dot(dos + x * hd, vs + j * hd, hd) - dd[x]) * capped_grad(z, cap);
                            axpy(acc + x * hd, ds, ks + j * hd, hd);
                        }
                    }
                }
            }

            for (int64_t r = 0; r < nr; r++)
                for (int64_t g = 0; g < G; g++)
                    store_scaled(dq, at(r0 + r, kvh * G + g, dm.n_heads, hd), (size_t)hd, scale,
                                 acc + (r * G + g) * hd);
        }
    }

    /* Pass 2: dk and dv, per (key block, KV head): the query rows that attend to keys c0 ..
     * c1-1 of one document run from c0 to the document's end, or to the window's reach. */
    #pragma omp parallel for schedule(dynamic, 1) num_threads(b->n_threads)
    for (int64_t item = 0; item < n_kblocks * dm.n_kv; item++) {
        const int64_t kvh = item % dm.n_kv, blk_end0 = (item / dm.n_kv + 1) * TRAIN_BK;
        const int64_t blk_end = blk_end0 < dm.n ? blk_end0 : dm.n;
        float *qs = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        float *dos = qs + rows * hd, *dd = dos + 2 * rows * hd, *ls = dd + rows;
        float *ks = ls + rows, *vs = ks + TRAIN_BK * hd, *dks = vs + TRAIN_BK * hd;
        float *dvs = dks + TRAIN_BK * hd, *tmp = ks + 4 * TRAIN_BK * hd;

        for (int64_t c0 = (item / dm.n_kv) * TRAIN_BK, c1; c0 < blk_end; c0 = c1) {
            const int d = doc_of_row(doc_start, batch->n_docs, c0);
            c1 = doc_start[d + 1] < blk_end ? doc_start[d + 1] : blk_end;
            const int64_t nk = c1 - c0, end = doc_start[d + 1];
            const int64_t reach = window > 0 && c1 - 1 + window < end ? c1 - 1 + window : end;
            load_tile(k, &dm, c0, nk, kvh, ks);
            load_tile(v, &dm, c0, nk, kvh, vs);
            memset(dks, 0, (size_t)(2 * TRAIN_BK * hd) * sizeof(float)); /* dks and dvs */

            for (int64_t i0 = c0; i0 < reach; i0 += TRAIN_BQ) {
                const int64_t ni = reach - i0 < TRAIN_BQ ? reach - i0 : TRAIN_BQ;
                load_queries(q, dout, out, lse, &dm, i0, ni, kvh, scale, qs, dos, dd, ls, tmp);
                for (int64_t r = 0; r < ni; r++) {
                    /* Keys c0 + j that query row i0 + r attends to: j <= i, i - j < window. */
                    const int64_t i = i0 + r, hi = i - c0;
                    const int64_t lo = window > 0 ? i - window + 1 - c0 : 0;
                    const int64_t jlo = lo > 0 ? lo : 0, jhi = hi < nk - 1 ? hi : nk - 1;
                    for (int64_t g = 0; g < G; g++) {
                        const int64_t x = r * G + g;
                        for (int64_t j = jlo; j <= jhi; j++) {
                            const float z = capped(dot(qs + x * hd, ks + j * hd, hd), cap);
                            const float p = expf(z - ls[x]);
                            const float ds = p * (dot(dos + x * hd, vs + j * hd, hd) - dd[x]) * capped_grad(z, cap);
                            axpy(dvs + j * hd, p, dos + x * hd, hd);
                            axpy(dks + j * hd, ds, qs + x * hd, hd); /* qs holds scale * q */
                        }
                    }
                }
            }

            for (int64_t j = 0; j < nk; j++) {
                store_scaled(dk, at(c0 + j, kvh, dm.n_kv, hd), (size_t)hd, 1.0f, dks + j * hd);
                store_scaled(dv, at(c0 + j, kvh, dm.n_kv, hd), (size_t)hd, 1.0f, dvs + j * hd);
            }
        }
    }
}

void cpu_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                  const struct tensor *out, const struct tensor *lse, const struct tensor *sinks)
{
    const int64_t n = dout->shape[0], heads = dout->shape[1], hd = dout->shape[2];
    const float *ls = lse->data, *sk = sinks->data;
    float *ds = dsinks->data;
    const size_t per = (size_t)(2 * hd);
    float *scratch = cpu_scratch(b, per);
    /* One head per iteration, its rows summed in order: the same sum whatever the thread count. */
    #pragma omp parallel num_threads(b->n_threads)
    {
        float *a = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per), *o = a + hd;
        #pragma omp for schedule(static)
        for (int64_t h = 0; h < heads; h++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < n; i++) {
                load(dout, at(i, h, heads, hd), (size_t)hd, a);
                load(out, at(i, h, heads, hd), (size_t)hd, o);
                acc += expf(sk[h] - ls[i * heads + h]) * dot(a, o, hd);
            }
            ds[h] -= acc;
        }
    }
}
