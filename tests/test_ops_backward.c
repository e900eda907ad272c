/* tests/test_ops_backward.c - the backward ops of kernels/ops.h (op_*_backward), the fused
 * LM-head cross-entropy, AdamW and the sum of squares, in every float dtype, on odd shapes,
 * one-row shapes and small Llama-like ones.
 *
 * Every case checks three things:
 * (a) the double-precision analytic gradient written in this file (from the mathematics, not
 *     from any backend's code) against central finite differences, Richardson-extrapolated, of
 *     a double-precision forward of the same op, at a sample of elements of every input that
 *     has a gradient: the reference is right;
 * (b) the backend's output against that analytic reference, within a tolerance derived from
 *     doing the arithmetic in f32 and rounding once into the storage dtype;
 * (c) with --backend cuda, the CUDA output against the CPU output on the same inputs (within
 *     twice the tolerance; each may sit on either side of the reference).
 * Weight gradients start from random values and the op is called `reps` times (1 or 2): the
 * result must be init + reps * gradient (they accumulate: gradient accumulation over
 * micro-batches); activation gradients start as NaN and must be overwritten (or start random
 * with the accumulate flag). As in tests/test_ops.c, every device buffer sits between guard
 * bytes that must come back untouched, inputs must come back unchanged, and a non-finite output
 * where the reference is finite fails. An empty backend slot is a failure, never a pass. That
 * harness is tests/op_check.c (shared with test_ops.c and test_attention_train.c); this file
 * keeps the tolerances, the finite differences, the references and the cases.
 *
 * --backend cuda prints "SKIP: ops_backward_cuda: ..." and exits 77 when the build has no CUDA
 * backend or the machine has no GPU.
 *
 * Not here: the forward ops (tests/test_ops.c), attention's backward, a whole training step.
 *
 * Run:  test_ops_backward --backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N]
 * One line per case ("ok" with its worst err/tol, or "FAIL" with every failed check); the last
 * line is "N passed, M failed". Exit status: 0 all passed, 1 a failure, 2 bad usage, 77 skipped. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"

/* ---- tolerances and finite differences ------------------------------------------------------
 *
 * An output element passes when
 *
 *     |got - want| <= n_round u |want| + (1 + u) (rel |want| + abs mag) + floor
 *
 * where want is the double reference on the rounded inputs, u the storage rounding of the
 * output's dtype (storage_rounding), n_round the number of times the op rounds that element
 * into storage (a half-precision weight gradient accumulated over `reps` calls: reps; each
 * rounding is of a partial sum, so |want| is then replaced by |init| + reps |gradient|), and
 * (rel, abs, mag) come from each case: mag is a magnitude the reference computes alongside,
 * defined beside each reference (the size of the terms whose f32 errors reach the element). */
static void make_tol(double *tol, enum dtype t, int n_round, double rel, double abs,
                     const double *want, const double *mag, size_t n)
{
    const struct storage_rounding *sr = &storage_rounding[t];
    for (size_t i = 0; i < n; i++) {
        double w = isfinite(want[i]) ? fabs(want[i]) : 0.0;
        tol[i] = n_round * sr->u * w + (1.0 + sr->u) * (rel * w + abs * mag[i]) + sr->floor;
    }
}

/* The same for an accumulated output: sum = |init| + reps |gradient| (accumulated()) bounds
 * every partial sum that was rounded. */
static void make_tol_acc(double *tol, enum dtype t, int n_round, double rel, double abs,
                         const double *want, const double *mag, const double *sum, size_t n)
{
    const struct storage_rounding *sr = &storage_rounding[t];
    for (size_t i = 0; i < n; i++) {
        double w = isfinite(want[i]) ? fabs(want[i]) : 0.0;
        tol[i] = n_round * sr->u * fmax(w, sum[i]) + (1.0 + sr->u) * (rel * w + abs * mag[i]) +
                 n_round * sr->floor;
    }
}

/* A double forward's loss, L = sum(dout * f(inputs)) for most ops; *abs_sum receives the sum of
 * the absolute values of its terms (the scale of its rounding error). */
typedef double (*loss_fn)(const void *ctx, double *abs_sum);

#define FD_SAMPLES 12

static double central_diff(double *val, size_t i, double h, loss_fn f, const void *ctx)
{
    double x0 = val[i], a;
    val[i] = x0 + h;
    double lp = f(ctx, &a);
    val[i] = x0 - h;
    double lm = f(ctx, &a);
    val[i] = x0;
    return (lp - lm) / ((x0 + h) - (x0 - h));
}

/* Checks the analytic gradient grad (n) of f with respect to val (n) at up to FD_SAMPLES
 * elements (all of them when n is that small, else drawn at random): central differences at
 * steps h and h/2, Richardson-extrapolated (error O(h^4)). val is perturbed in place and
 * restored. The bound allows 1e-6 relative to the element and the gradient's RMS, plus the
 * rounding error of the loss amplified by 1/h. */
static void check_fd(struct verdict *v, const char *what, double *val, size_t n,
                     const double *grad, loss_fn f, const void *ctx, struct rng *r)
{
    if (n == 0) return;
    double rms = 0.0, l_abs;
    for (size_t i = 0; i < n; i++) rms += grad[i] * grad[i];
    rms = sqrt(rms / (double)n);
    f(ctx, &l_abs);
    size_t samples = n < FD_SAMPLES ? n : FD_SAMPLES;
    for (size_t s = 0; s < samples; s++) {
        size_t i = n <= FD_SAMPLES ? s : (size_t)(rng_next(r) % n);
        double h = 1e-5 * fmax(1.0, fabs(val[i]));
        double d1 = central_diff(val, i, h, f, ctx), d2 = central_diff(val, i, h / 2, f, ctx);
        double fd = (4.0 * d2 - d1) / 3.0;
        double bound = 1e-6 * (fabs(grad[i]) + rms) + 1e-13 * (1.0 + l_abs) / h;
        if (!(fabs(fd - grad[i]) <= bound)) {
            verdict_fail(v, "reference %s: finite differences %.12g, analytic %.12g at element %zu "
                            "(bound %.3g): the test's reference is wrong",
                         what, fd, grad[i], i, bound);
            return;
        }
    }
}

/* Whether a case runs its finite-difference check (a): always with f32 data, and with half
 * precision data when the double forward is cheap (cost: its multiply-adds). The reference does
 * not depend on the dtype; checking it on every shape in f32 keeps the suite fast. */
static int fd_wanted(enum dtype dt, double cost) { return dt == DTYPE_F32 || cost <= 1e5; }

/* Host copies of a weight gradient's initial value, in its own dtype: a random start, so that
 * an op that overwrites instead of accumulating fails. */
static struct hbuf grad_init(struct suite *s, enum dtype t, size_t n, struct rng *r)
{
    return hbuf_uniform(s, t, n, r, -0.5, 0.5);
}

/* want[i] = init[i] + reps * g[i]; mag[i] = |init[i]| + reps * gmag[i]; sum[i] = |init[i]| +
 * reps |g[i]|. */
static void accumulated(size_t n, const double *init, int reps, const double *g,
                        const double *gmag, double *want, double *mag, double *sum)
{
    for (size_t i = 0; i < n; i++) {
        want[i] = (init ? init[i] : 0.0) + reps * g[i];
        mag[i] = (init ? fabs(init[i]) : 0.0) + reps * gmag[i];
        sum[i] = (init ? fabs(init[i]) : 0.0) + reps * fabs(g[i]);
    }
}

static double *dalloc(struct suite *s, size_t n) { return case_alloc(s, n, sizeof(double)); }

/* A view of part of a device buffer, for ops that write into slices (cross-entropy shards). */
static struct tensor view_rows(const struct tensor *t, int64_t row0, int64_t rows)
{
    struct tensor v = *t;
    v.data = (char *)t->data + (size_t)(row0 * tensor_cols(t)) * dtype_size(t->dtype);
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = tensor_cols(t);
    v.shape[2] = v.shape[3] = 1;
    return v;
}


/* ==== cases ================================================================================= */

/* ---- embedding and position embedding --------------------------------------------------------
 * Forward: out[i] = table[ids[i] - vocab_start] (0 outside the shard); position: x[i] +=
 * table[pos[i]]. Backward: dtable[row] += the dout rows whose id maps there. mag: the sum of
 * |terms| added into the element; each addition rounds (f32, or each added row's rounding into
 * a half-precision dtable): rel/abs scale with the number of rows added. */

struct embed_ctx {
    int           n, d, vocab, vocab_start;
    const int32_t *ids;
    const double *dout;
    double       *table; /* perturbed by check_fd */
};

static double embed_loss(const void *p, double *abs_sum)
{
    const struct embed_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (int i = 0; i < c->n; i++) {
        int row = c->ids[i] - c->vocab_start;
        if (row < 0 || row >= c->vocab) continue;
        for (int j = 0; j < c->d; j++) {
            double t = c->dout[(size_t)i * c->d + j] * c->table[(size_t)row * c->d + j];
            l += t;
            a += fabs(t);
        }
    }
    *abs_sum = a;
    return l;
}

/* positional: op_position_embedding_add_backward (ids are positions in [0, vocab), vocab_start
 * 0); else op_embedding_backward. Ids repeat (a small vocabulary), and some lie outside the
 * shard. */
static void case_embedding_backward(struct suite *s, int positional, enum dtype dt,
                                    enum dtype gdt, int n, int d, int vocab, int vocab_start,
                                    int reps)
{
    char name[160];
    snprintf(name, sizeof name, "%s_backward %s dtable=%s n=%d d=%d vocab_local=%d vocab_start=%d reps=%d",
             positional ? "position_embedding_add" : "embedding", dtype_name(dt), dtype_name(gdt),
             n, d, vocab, vocab_start, reps);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    int32_t *ids = case_alloc(s, (size_t)n, sizeof(int32_t));
    int edges[] = {vocab_start, vocab_start + vocab - 1, vocab_start - 1, vocab_start + vocab, -1,
                   vocab_start};
    for (int i = 0; i < n; i++) {
        if (positional) ids[i] = i < 2 ? (i == 0 ? 0 : vocab - 1) : rng_int(&r, vocab);
        else ids[i] = i < 6 ? edges[i] : vocab_start - 3 + rng_int(&r, vocab + 6);
    }
    size_t nt = (size_t)vocab * d, no = (size_t)n * d;
    struct hbuf dout = hbuf_uniform(s, dt, no, &r, -1, 1);
    struct hbuf init = grad_init(s, gdt, nt, &r);
    double *g = dalloc(s, nt), *gmag = dalloc(s, nt), *count = dalloc(s, nt);
    for (int i = 0; i < n; i++) {
        int row = ids[i] - vocab_start;
        if (row < 0 || row >= vocab) continue;
        for (int j = 0; j < d; j++) {
            size_t e = (size_t)row * d + j;
            g[e] += dout.val[(size_t)i * d + j];
            gmag[e] += fabs(dout.val[(size_t)i * d + j]);
            count[e] += 1.0;
        }
    }
    struct verdict v = {.worst_ratio = -1.0};
    /* (a) */
    double *table = dalloc(s, nt);
    for (size_t e = 0; e < nt; e++) table[e] = 0.25 * (double)(e % 7);
    struct embed_ctx ctx = {n, d, vocab, vocab_start, ids, dout.val, table};
    check_fd(&v, "dtable", table, nt, g, embed_loss, &ctx, &r);
    /* (b), (c) */
    double *want = dalloc(s, nt), *mag = dalloc(s, nt), *tol = dalloc(s, nt), *sum = dalloc(s, nt);
    accumulated(nt, init.val, reps, g, gmag, want, mag, sum);
    const struct storage_rounding *sr = &storage_rounding[gdt];
    double u = gdt == DTYPE_F32 ? U32 : sr->u;
    for (size_t e = 0; e < nt; e++) tol[e] = (reps * count[e] + 1.0) * u * mag[e] + sr->floor;
    double *got[2] = {0};
    void *bits = case_alloc(s, nt, dtype_size(gdt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tg = arena_out(&a, "dtable", gdt, S2(vocab, d), init.bits, bits);
        struct tensor td = arena_in(&a, positional ? "dx" : "dout", dt, S2(n, d), dout.bits);
        struct tensor ti = arena_in(&a, "ids", DTYPE_I32, S1(n), ids);
        for (int rep = 0; rep < reps; rep++) {
            if (positional && SUPPORTED(&v, b, position_embedding_add_backward))
                op_position_embedding_add_backward(b, &tg, &td, &ti);
            if (!positional && SUPPORTED(&v, b, embedding_backward))
                op_embedding_backward(b, &tg, &td, &ti, vocab_start);
        }
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, gdt, nt);
    }
    check_close(s, &v, "dtable", got, want, tol, nt, (size_t)d);
    case_end(s, name, &v);
}

/* ---- matmul ----------------------------------------------------------------------------------
 * Forward y = x @ w^T + bias; L = sum(dy * y). dx = dy @ w, dw = dy^T @ x, dbias = sum_i dy.
 * mag: sqrt(K) * sum over the K products of |term| (the probabilistic bound of an f32 dot
 * product of length K in any order, as tests/test_ops.c argues), abs 8 U32. */

struct mm_ctx {
    int           m, k, n;
    const double *dy;
    double       *x, *w, *bias;
};

static double mm_loss(const void *p, double *abs_sum)
{
    const struct mm_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (int i = 0; i < c->m; i++)
        for (int j = 0; j < c->n; j++) {
            double y = c->bias[j];
            for (int t = 0; t < c->k; t++) y += c->x[(size_t)i * c->k + t] * c->w[(size_t)j * c->k + t];
            l += c->dy[(size_t)i * c->n + j] * y;
            a += fabs(c->dy[(size_t)i * c->n + j] * y);
        }
    *abs_sum = a;
    return l;
}

/* parts: 7 = dx, dw, dbias; 1 dx only (w only, x NULL); 2 dw only (x only, w NULL); 6 dw and
 * dbias; 4 dbias only (x and w NULL). */
static void case_matmul_backward(struct suite *s, enum dtype dt, enum dtype gdt, int m, int k,
                                 int n, int parts, int accumulate_dx, int reps)
{
    char name[160];
    snprintf(name, sizeof name, "matmul_backward %s dw=%s m=%d k=%d n=%d%s%s%s%s reps=%d",
             dtype_name(dt), dtype_name(gdt), m, k, n, parts & 1 ? " dx" : "", parts & 2 ? " dw" : "",
             parts & 4 ? " dbias" : "", accumulate_dx ? " dx+=" : "", reps);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const int want_dx = parts & 1, want_dw = parts & 2, want_db = parts & 4;
    size_t nx = (size_t)m * k, nw = (size_t)n * k, ny = (size_t)m * n;
    struct hbuf x = hbuf_uniform(s, dt, nx, &r, -1, 1), w = hbuf_uniform(s, dt, nw, &r, -1, 1);
    struct hbuf dy = hbuf_uniform(s, dt, ny, &r, -1, 1);
    struct hbuf dx0 = hbuf_uniform(s, dt, nx, &r, -1, 1);
    struct hbuf dw0 = grad_init(s, gdt, nw, &r), db0 = grad_init(s, gdt, (size_t)n, &r);
    /* The analytic gradients and their magnitudes. */
    double *gx = dalloc(s, nx), *mx = dalloc(s, nx), *gw = dalloc(s, nw), *mw = dalloc(s, nw);
    double *gb = dalloc(s, (size_t)n), *mb = dalloc(s, (size_t)n);
    for (int i = 0; i < m; i++)
        for (int t = 0; t < k; t++) {
            double acc = 0.0, aa = 0.0;
            for (int j = 0; j < n; j++) {
                double p = dy.val[(size_t)i * n + j] * w.val[(size_t)j * k + t];
                acc += p;
                aa += fabs(p);
            }
            gx[(size_t)i * k + t] = acc;
            mx[(size_t)i * k + t] = sqrt((double)n) * aa;
        }
    for (int j = 0; j < n; j++) {
        for (int t = 0; t < k; t++) {
            double acc = 0.0, aa = 0.0;
            for (int i = 0; i < m; i++) {
                double p = dy.val[(size_t)i * n + j] * x.val[(size_t)i * k + t];
                acc += p;
                aa += fabs(p);
            }
            gw[(size_t)j * k + t] = acc;
            mw[(size_t)j * k + t] = sqrt((double)m) * aa;
        }
        double acc = 0.0, aa = 0.0;
        for (int i = 0; i < m; i++) acc += dy.val[(size_t)i * n + j], aa += fabs(dy.val[(size_t)i * n + j]);
        gb[j] = acc;
        mb[j] = sqrt((double)m) * aa;
    }
    struct verdict v = {.worst_ratio = -1.0};
    /* (a) at inputs that are not the rounded ones, so that the check is independent of them. */
    double *fx = dalloc(s, nx), *fw = dalloc(s, nw), *fb = dalloc(s, (size_t)n);
    memcpy(fx, x.val, nx * sizeof(double));
    memcpy(fw, w.val, nw * sizeof(double));
    for (int j = 0; j < n; j++) fb[j] = 0.1 * j;
    struct mm_ctx ctx = {m, k, n, dy.val, fx, fw, fb};
    if (fd_wanted(gdt == DTYPE_F32 ? dt : gdt, (double)m * n * k)) {
        check_fd(&v, "dx", fx, nx, gx, mm_loss, &ctx, &r);
        check_fd(&v, "dw", fw, nw, gw, mm_loss, &ctx, &r);
        check_fd(&v, "dbias", fb, (size_t)n, gb, mm_loss, &ctx, &r);
    }
    /* (b), (c): dx written (or accumulated, rounding once per call), dw and dbias accumulated. */
    double *want_x = dalloc(s, nx), *mag_x = dalloc(s, nx), *tol_x = dalloc(s, nx);
    double *want_w = dalloc(s, nw), *mag_w = dalloc(s, nw), *tol_w = dalloc(s, nw);
    double *want_b = dalloc(s, (size_t)n), *mag_b = dalloc(s, (size_t)n), *tol_b = dalloc(s, (size_t)n);
    double *sum_x = dalloc(s, nx), *sum_w = dalloc(s, nw), *sum_b = dalloc(s, (size_t)n);
    accumulated(nx, accumulate_dx ? dx0.val : NULL, accumulate_dx ? reps : 1, gx, mx, want_x, mag_x, sum_x);
    accumulated(nw, dw0.val, reps, gw, mw, want_w, mag_w, sum_w);
    accumulated((size_t)n, db0.val, reps, gb, mb, want_b, mag_b, sum_b);
    make_tol_acc(tol_x, dt, accumulate_dx ? reps : 1, 4 * U32, 8 * U32, want_x, mag_x, sum_x, nx);
    make_tol_acc(tol_w, gdt, reps, 4 * U32, 8 * U32, want_w, mag_w, sum_w, nw);
    make_tol_acc(tol_b, gdt, reps, 4 * U32, 8 * U32, want_b, mag_b, sum_b, (size_t)n);
    double *got_x[2] = {0}, *got_w[2] = {0}, *got_b[2] = {0};
    void *bx = case_alloc(s, nx, dtype_size(dt)), *bw = case_alloc(s, nw, dtype_size(gdt));
    void *bb = case_alloc(s, (size_t)n, dtype_size(gdt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tdy = arena_in(&a, "dy", dt, S2(m, n), dy.bits);
        struct tensor tx = arena_in(&a, "x", dt, S2(m, k), x.bits);
        struct tensor tw = arena_in(&a, "w", dt, S2(n, k), w.bits);
        struct tensor tdx = arena_out(&a, "dx", dt, S2(m, k), accumulate_dx ? dx0.bits : NULL, bx);
        struct tensor tdw = arena_out(&a, "dw", gdt, S2(n, k), dw0.bits, bw);
        struct tensor tdb = arena_out(&a, "dbias", gdt, S1(n), db0.bits, bb);
        for (int rep = 0; rep < reps; rep++)
            if (SUPPORTED(&v, b, matmul_backward))
                op_matmul_backward(b, want_dx ? &tdx : NULL, want_dw ? &tdw : NULL,
                                   want_db ? &tdb : NULL, &tdy, want_dw ? &tx : NULL,
                                   want_dx ? &tw : NULL, accumulate_dx);
        arena_finish(&a, &v);
        got_x[bi] = decode(s, bx, dt, nx);
        got_w[bi] = decode(s, bw, gdt, nw);
        got_b[bi] = decode(s, bb, gdt, (size_t)n);
    }
    if (want_dx) check_close(s, &v, "dx", got_x, want_x, tol_x, nx, (size_t)k);
    if (want_dw) check_close(s, &v, "dw", got_w, want_w, tol_w, nw, (size_t)k);
    else check_exact(s, &v, "dw (not asked for)", got_w, dw0.val, nw, (size_t)k, 1);
    if (want_db) check_close(s, &v, "dbias", got_b, want_b, tol_b, (size_t)n, (size_t)n);
    else check_exact(s, &v, "dbias (not asked for)", got_b, db0.val, (size_t)n, (size_t)n, 1);
    case_end(s, name, &v);
}

/* ---- rmsnorm ---------------------------------------------------------------------------------
 * y = x r w, r = 1 / sqrt(mean(x^2) + eps); L = sum(dout * y).
 * dx_j = r g_j w_j - r^3 / d (sum_l g_l w_l x_l) x_j,   dw_j = sum_rows g_j x_j r.
 * mag(dx_j) = sqrt(d) (r |g_j w_j| + r^3 / d sum_l |g_l w_l x_l| |x_j|): r and the row sum carry
 * relative errors of about sqrt(d) U32 (tests/test_ops.c's rmsnorm row); mag(dw_j) =
 * (sqrt(d) + sqrt(n)) sum_rows |g_j x_j r|: r's error, then a sum over the n rows. */

struct norm_ctx {
    int           n, d, layer; /* layer: layernorm, else rmsnorm */
    double        eps;
    const double *dout;
    double       *x, *w, *bias;
};

static double norm_loss(const void *p, double *abs_sum)
{
    const struct norm_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (int i = 0; i < c->n; i++) {
        const double *xr = c->x + (size_t)i * c->d;
        double mean = 0.0, var = 0.0;
        if (c->layer) {
            for (int j = 0; j < c->d; j++) mean += xr[j];
            mean /= c->d;
        }
        for (int j = 0; j < c->d; j++) var += (xr[j] - mean) * (xr[j] - mean);
        double r = 1.0 / sqrt(var / c->d + c->eps);
        for (int j = 0; j < c->d; j++) {
            double y = (xr[j] - mean) * r * c->w[j] + (c->layer ? c->bias[j] : 0.0);
            double t = c->dout[(size_t)i * c->d + j] * y;
            l += t;
            a += fabs(t);
        }
    }
    *abs_sum = a;
    return l;
}

/* With n >= 3, row 1 is all zeros (rmsnorm) or constant (layernorm): r = 1/sqrt(eps). Layernorm
 * rows carry offsets -4, 0, +4, so that the mean matters. alias: dx = dout. */
static void case_norm_backward(struct suite *s, int layer, enum dtype dt, enum dtype gdt, int n,
                               int d, double eps, int alias, int with_dbias, int reps)
{
    char name[160];
    snprintf(name, sizeof name, "%s_backward %s dweight=%s n=%d d=%d eps=%g%s%s reps=%d",
             layer ? "layernorm" : "rmsnorm", dtype_name(dt), dtype_name(gdt), n, d, eps,
             alias ? " dx=dout" : "", layer && with_dbias ? " dbias" : "", reps);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t nx = (size_t)n * d;
    struct hbuf x = hbuf_make(s, dt, nx);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) {
            double off = layer ? 4.0 * ((i % 3) - 1) : 0.0;
            double val = n >= 3 && i == 1 ? (layer ? 0.75 : 0.0) : off + rng_range(&r, -2, 2);
            hbuf_set(&x, (size_t)i * d + j, val);
        }
    struct hbuf w = hbuf_uniform(s, dt, (size_t)d, &r, -1.5, 1.5);
    struct hbuf dout = hbuf_uniform(s, dt, nx, &r, -1, 1);
    struct hbuf dw0 = grad_init(s, gdt, (size_t)d, &r), db0 = grad_init(s, gdt, (size_t)d, &r);
    float epsf = (float)eps;
    double *gx = dalloc(s, nx), *mx = dalloc(s, nx), *gw = dalloc(s, (size_t)d);
    double *mw = dalloc(s, (size_t)d), *gb = dalloc(s, (size_t)d), *mb = dalloc(s, (size_t)d);
    for (int i = 0; i < n; i++) {
        const double *xr = x.val + (size_t)i * d, *g = dout.val + (size_t)i * d;
        double mean = 0.0, var = 0.0, maxabs = 0.0;
        if (layer) {
            for (int j = 0; j < d; j++) mean += xr[j];
            mean /= d;
        }
        for (int j = 0; j < d; j++) {
            var += (xr[j] - mean) * (xr[j] - mean);
            maxabs = fmax(maxabs, fabs(xr[j]));
        }
        double rr = 1.0 / sqrt(var / d + (double)epsf), sd = sqrt((double)d), sn = sqrt((double)n);
        /* a = mean(g w), c = mean(g w xhat) (layernorm) or sum(g w x) (rmsnorm), and their
         * absolute counterparts */
        double a = 0.0, c = 0.0, a_abs = 0.0, c_abs = 0.0;
        for (int j = 0; j < d; j++) {
            double gwj = g[j] * w.val[j], xh = (xr[j] - mean) * rr;
            a += gwj;
            a_abs += fabs(gwj);
            c += gwj * (layer ? xh : xr[j]);
            c_abs += fabs(gwj * (layer ? xh : xr[j]));
        }
        a /= d;
        a_abs /= d;
        if (layer) c /= d, c_abs /= d;
        for (int j = 0; j < d; j++) {
            size_t e = (size_t)i * d + j;
            double gwj = g[j] * w.val[j], xh = (xr[j] - mean) * rr;
            if (layer) {
                gx[e] = rr * (gwj - a - xh * c);
                mx[e] = sd * rr * (fabs(gwj) + a_abs + (fabs(xh) + rr * maxabs) * c_abs +
                                   fabs(xh) * rr * maxabs * a_abs);
                gw[j] += g[j] * xh;
                mw[j] += fabs(g[j]) * (fabs(xh) * (sn + 2.0) + sd * rr * maxabs);
                gb[j] += g[j];
                mb[j] += sn * fabs(g[j]);
            } else {
                gx[e] = rr * gwj - rr * rr * rr / d * c * xr[j];
                mx[e] = sd * (rr * fabs(gwj) + rr * rr * rr / d * c_abs * fabs(xr[j]));
                gw[j] += g[j] * xr[j] * rr;
                mw[j] += (sd + sn) * fabs(g[j] * xr[j] * rr);
            }
        }
    }
    struct verdict v = {.worst_ratio = -1.0};
    /* (a) */
    double *fx = dalloc(s, nx), *fw = dalloc(s, (size_t)d), *fb = dalloc(s, (size_t)d);
    memcpy(fx, x.val, nx * sizeof(double));
    memcpy(fw, w.val, (size_t)d * sizeof(double));
    for (int j = 0; j < d; j++) fb[j] = 0.3 - 0.01 * j;
    struct norm_ctx ctx = {n, d, layer, (double)epsf, dout.val, fx, fw, fb};
    check_fd(&v, "dx", fx, nx, gx, norm_loss, &ctx, &r);
    check_fd(&v, "dweight", fw, (size_t)d, gw, norm_loss, &ctx, &r);
    if (layer) check_fd(&v, "dbias", fb, (size_t)d, gb, norm_loss, &ctx, &r);
    /* (b), (c) */
    double *tol_x = dalloc(s, nx), *want_w = dalloc(s, (size_t)d), *mag_w = dalloc(s, (size_t)d);
    double *tol_w = dalloc(s, (size_t)d), *want_b = dalloc(s, (size_t)d);
    double *mag_b = dalloc(s, (size_t)d), *tol_b = dalloc(s, (size_t)d);
    make_tol(tol_x, dt, 1, 8 * U32, 4 * U32, gx, mx, nx);
    double *sum_w = dalloc(s, (size_t)d), *sum_b = dalloc(s, (size_t)d);
    accumulated((size_t)d, dw0.val, reps, gw, mw, want_w, mag_w, sum_w);
    accumulated((size_t)d, db0.val, reps, gb, mb, want_b, mag_b, sum_b);
    make_tol_acc(tol_w, gdt, reps, 8 * U32, 4 * U32, want_w, mag_w, sum_w, (size_t)d);
    make_tol_acc(tol_b, gdt, reps, 8 * U32, 4 * U32, want_b, mag_b, sum_b, (size_t)d);
    double *got_x[2] = {0}, *got_w[2] = {0}, *got_b[2] = {0};
    void *bx = case_alloc(s, nx, dtype_size(dt)), *bw = case_alloc(s, (size_t)d, dtype_size(gdt));
    void *bb = case_alloc(s, (size_t)d, dtype_size(gdt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(n, d), x.bits);
        struct tensor tw = arena_in(&a, "weight", dt, S1(d), w.bits);
        struct tensor tdw = arena_out(&a, "dweight", gdt, S1(d), dw0.bits, bw);
        struct tensor tdb = arena_out(&a, "dbias", gdt, S1(d), db0.bits, bb);
        /* With reps = 2 and dx = dout, the second call would read the first's dx: each call
         * gets dout afresh. */
        for (int rep = 0; rep < reps; rep++) {
            struct arena a2 = {.b = b};
            struct tensor tg = alias ? arena_out(&a2, "dout=dx", dt, S2(n, d), dout.bits, bx)
                                     : arena_in(&a2, "dout", dt, S2(n, d), dout.bits);
            struct tensor tdx = alias ? tg : arena_out(&a2, "dx", dt, S2(n, d), NULL, bx);
            if (layer && SUPPORTED(&v, b, layernorm_backward))
                op_layernorm_backward(b, &tdx, &tdw, with_dbias ? &tdb : NULL, &tg, &tx, &tw, epsf);
            if (!layer && SUPPORTED(&v, b, rmsnorm_backward))
                op_rmsnorm_backward(b, &tdx, &tdw, &tg, &tx, &tw, epsf);
            arena_finish(&a2, &v);
        }
        arena_finish(&a, &v);
        got_x[bi] = decode(s, bx, dt, nx);
        got_w[bi] = decode(s, bw, gdt, (size_t)d);
        got_b[bi] = decode(s, bb, gdt, (size_t)d);
    }
    check_close(s, &v, "dx", got_x, gx, tol_x, nx, (size_t)d);
    check_close(s, &v, "dweight", got_w, want_w, tol_w, (size_t)d, (size_t)d);
    if (layer && with_dbias) check_close(s, &v, "dbias", got_b, want_b, tol_b, (size_t)d, (size_t)d);
    else check_exact(s, &v, "dbias (not asked for)", got_b, db0.val, (size_t)d, (size_t)d, 1);
    case_end(s, name, &v);
}

/* ---- rope ------------------------------------------------------------------------------------
 * y = R(pos * f_i) x per pair, L = sum(dout * y): dx = R(-pos * f_i) dout. mag as in
 * tests/test_ops.c's rope row: (|g_a| + |g_b|) (2 + pos f (2 i ln(theta) / rot + 3)), the
 * error of an f32 angle. */

struct rope_ctx {
    int            n, h, hd, rot;
    double         theta;
    enum rope_style style;
    const int32_t *pos;
    const double  *dout;
    double        *x;
};

static void rope_pair(enum rope_style style, int rot, int i, int *ia, int *ib)
{
    *ia = style == ROPE_STYLE_PAIRS ? 2 * i : i;
    *ib = style == ROPE_STYLE_PAIRS ? 2 * i + 1 : i + rot / 2;
}

static double rope_loss(const void *p, double *abs_sum)
{
    const struct rope_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (int t = 0; t < c->n; t++)
        for (int hh = 0; hh < c->h; hh++) {
            size_t base = ((size_t)t * c->h + hh) * c->hd;
            for (int j = c->rot; j < c->hd; j++) {
                l += c->dout[base + j] * c->x[base + j];
                a += fabs(c->dout[base + j] * c->x[base + j]);
            }
            for (int i = 0; i < c->rot / 2; i++) {
                int ia, ib;
                rope_pair(c->style, c->rot, i, &ia, &ib);
                double ang = c->pos[t] * pow(c->theta, -2.0 * i / c->rot);
                double xa = c->x[base + ia], xb = c->x[base + ib];
                double ya = xa * cos(ang) - xb * sin(ang), yb = xa * sin(ang) + xb * cos(ang);
                l += c->dout[base + ia] * ya + c->dout[base + ib] * yb;
                a += fabs(c->dout[base + ia] * ya) + fabs(c->dout[base + ib] * yb);
            }
        }
    *abs_sum = a;
    return l;
}

static void case_rope_backward(struct suite *s, enum dtype dt, int n, int h, int hd, int rot,
                               float theta, enum rope_style style, int max_pos)
{
    char name[160];
    snprintf(name, sizeof name, "rope_backward %s n=%d heads=%d head_dim=%d rot=%d theta=%g %s max_pos=%d",
             dtype_name(dt), n, h, hd, rot, (double)theta,
             style == ROPE_STYLE_PAIRS ? "pairs" : "halves", max_pos);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t nx = (size_t)n * h * hd;
    int32_t *pos = case_alloc(s, (size_t)n, sizeof(int32_t));
    for (int t = 0; t < n; t++) pos[t] = t == 0 ? max_pos : t == 1 ? 0 : rng_int(&r, max_pos + 1);
    struct hbuf dout = hbuf_uniform(s, dt, nx, &r, -1, 1);
    double *gx = dalloc(s, nx), *mx = dalloc(s, nx), *tol = dalloc(s, nx);
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < h; hh++) {
            size_t base = ((size_t)t * h + hh) * hd;
            for (int j = rot; j < hd; j++) gx[base + j] = dout.val[base + j];
            for (int i = 0; i < rot / 2; i++) {
                int ia, ib;
                rope_pair(style, rot, i, &ia, &ib);
                double f = pow((double)theta, -2.0 * i / rot), ang = pos[t] * f;
                double ga = dout.val[base + ia], gb = dout.val[base + ib];
                gx[base + ia] = ga * cos(ang) + gb * sin(ang);
                gx[base + ib] = -ga * sin(ang) + gb * cos(ang);
                mx[base + ia] = mx[base + ib] =
                    (fabs(ga) + fabs(gb)) * (2.0 + pos[t] * f * (2.0 * i * log(theta) / rot + 3.0));
            }
        }
    struct verdict v = {.worst_ratio = -1.0};
    double *fx = dalloc(s, nx);
    for (size_t e = 0; e < nx; e++) fx[e] = rng_range(&r, -1, 1);
    float *freqs = case_alloc(s, (size_t)rot / 2, sizeof(float));
    rope_frequencies(theta, rot, NULL, freqs);
    struct rope_ctx ctx = {n, h, hd, rot, (double)theta, style, pos, dout.val, fx};
    check_fd(&v, "dx", fx, nx, gx, rope_loss, &ctx, &r);
    make_tol(tol, dt, 1, 4 * U32, 4 * U32, gx, mx, nx);
    double *got[2] = {0};
    void *bits = case_alloc(s, nx, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_out(&a, "dx", dt, S3(n, h, hd), dout.bits, bits);
        struct tensor tp = arena_in(&a, "positions", DTYPE_I32, S1(n), pos);
        const struct rope_params rp = {.freqs = freqs, .attn_factor = 1.0f};
        if (SUPPORTED(&v, b, rope_backward)) op_rope_backward(b, &tx, &tp, rot, &rp, style);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, nx);
    }
    check_close(s, &v, "dx", got, gx, tol, nx, (size_t)hd);
    case_end(s, name, &v);
}

/* ---- activations -----------------------------------------------------------------------------
 * dx = dout act'(x); gated: dgate = dout up act'(gate), dup = dout act(gate).
 * mag(act') = 1 + |x| + 0.15 |x|^3: the derivative's terms 0.5 (1 + tanh) and 1 + x (1 - s)
 * cancel for negative x, leaving an absolute error of a few U32 times |x|, and GELU tanh's
 * (1 - tanh^2) k (1 + 3 c x^2) x / 2 multiplies the error of tanh by up to 0.15 |x|^3.
 * ref_act itself (the forward's definition) is shared with test_ops.c, in op_check.c. */

/* The derivatives, differentiated by hand from ref_act. */
static double ref_act_grad(enum activation act, double x)
{
    switch (act) {
    case ACTIVATION_SILU: {
        double sg = 1.0 / (1.0 + exp(-x));
        return sg * (1.0 + x * (1.0 - sg));
    }
    case ACTIVATION_GELU_TANH: {
        double k = sqrt(2.0 / M_PI), c = 0.044715, t = tanh(k * (x + c * x * x * x));
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
    }
    case ACTIVATION_GELU_ERF:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
    case ACTIVATION_SWIGLU_OAI: { /* the gate's part, 0 above the clamp */
        if (x > 7.0) return 0.0;
        const double sg = 1.0 / (1.0 + exp(-1.702 * x));
        return sg * (1.0 + 1.702 * x * (1.0 - sg));
    }
    }
    return 1.0;
}

struct act_ctx {
    size_t          n;
    enum activation act;
    const double   *dout;
    double         *x, *up; /* up NULL: plain activation */
};

static double act_loss(const void *p, double *abs_sum)
{
    const struct act_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (size_t i = 0; i < c->n; i++) {
        double t = c->dout[i] * ref_act(c->act, c->x[i]) * (c->up ? ref_gated_up(c->act, c->up[i]) : 1.0);
        l += t;
        a += fabs(t);
    }
    *abs_sum = a;
    return l;
}

static const double act_specials[] = {0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0, 5.0, -5.0, 1.0, -1.0, -1.28, 2.5};
#define N_ACT_SPECIALS (sizeof act_specials / sizeof act_specials[0])
/* ACTIVATION_SWIGLU_OAI's first (gate, up) pairs: past its clamps (gate > 7, |up| > 7: gradient
 * 0) and just inside them; never at 7 itself, where the finite differences straddle the kink. */
static const double oai_specials[][2] = {
    {9.0, 2.5}, {20.0, -1.0}, {7.5, 9.0},  {-2.0, -9.0}, {6.5, 20.0}, {1.0, -20.0},
    {-9.0, 6.5}, {3.0, -6.5}, {8.0, 8.0},  {-20.0, 0.5}, {0.0, -7.5}, {-1.28, 7.25},
};
#define N_OAI_SPECIALS (sizeof oai_specials / sizeof oai_specials[0])

/* gated 0: op_activation_backward, alias 0 none, 1 dx = dout, 2 dx = x.
 * gated 1: op_gated_activation_backward, alias 0 none, 1 dgate = gate and dup = up, 2 dgate =
 * dout, 3 dup = dout. ACTIVATION_SWIGLU_OAI (gated only) draws gate and up from [-20, 20], so
 * that both clamps are hit, after oai_specials; its gradient through a clamped input must be
 * exactly 0. */
static void case_activation_backward(struct suite *s, int gated, enum dtype dt,
                                     enum activation act, int rows, int cols, int alias)
{
    static const char *const alias_names[2][4] = {{"", " dx=dout", " dx=x", ""},
                                                  {"", " dgate=gate dup=up", " dgate=dout", " dup=dout"}};
    char name[160];
    snprintf(name, sizeof name, "%s_backward %s %s %dx%d%s", gated ? "gated_activation" : "activation",
             dtype_name(dt), act_name(act), rows, cols, alias_names[gated][alias]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t n = (size_t)rows * cols;
    const int oai = act == ACTIVATION_SWIGLU_OAI;
    struct hbuf x = hbuf_make(s, dt, n), up;
    if (oai) {
        up = hbuf_make(s, dt, n);
        for (size_t i = 0; i < n; i++) {
            hbuf_set(&x, i, i < N_OAI_SPECIALS ? oai_specials[i][0] : rng_range(&r, -20, 20));
            hbuf_set(&up, i, i < N_OAI_SPECIALS ? oai_specials[i][1] : rng_range(&r, -20, 20));
        }
    } else {
        for (size_t i = 0; i < n; i++)
            hbuf_set(&x, i, i < N_ACT_SPECIALS ? act_specials[i] : rng_range(&r, -10, 10));
        up = hbuf_uniform(s, dt, n, &r, -3, 3);
    }
    struct hbuf dout = hbuf_uniform(s, dt, n, &r, -2, 2);
    double *gx = dalloc(s, n), *mx = dalloc(s, n), *gu = dalloc(s, n), *mu = dalloc(s, n);
    for (size_t i = 0; i < n; i++) {
        double xi = x.val[i], u = gated ? ref_gated_up(act, up.val[i]) : 1.0, g = dout.val[i];
        double ax = fabs(xi);
        gx[i] = g * u * ref_act_grad(act, xi);
        /* SWIGLU_OAI's derivative s (1 + 1.702 x (1 - s)) cancels like SiLU's, 1.702 times */
        mx[i] = fabs(g * u) * (oai ? 1.0 + 2.0 * ax : 1.0 + ax + 0.15 * ax * ax * ax);
        const int up_clamped = oai && fabs(up.val[i]) > 7.0;
        gu[i] = up_clamped ? 0.0 : g * ref_act(act, xi);
        mu[i] = up_clamped ? 0.0 : fabs(g) * (1.0 + ax);
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *fx = dalloc(s, n), *fu = dalloc(s, n);
    memcpy(fx, x.val, n * sizeof(double));
    memcpy(fu, up.val, n * sizeof(double));
    /* The loss is a sum of independent terms: the first 256 elements (the special values among
     * them) are enough for the finite differences. */
    struct act_ctx ctx = {n < 256 ? n : 256, act, dout.val, fx, gated ? fu : NULL};
    check_fd(&v, gated ? "dgate" : "dx", fx, ctx.n, gx, act_loss, &ctx, &r);
    if (gated) check_fd(&v, "dup", fu, ctx.n, gu, act_loss, &ctx, &r);
    double *tol_x = dalloc(s, n), *tol_u = dalloc(s, n);
    make_tol(tol_x, dt, 1, 8 * U32, 8 * U32, gx, mx, n);
    make_tol(tol_u, dt, 1, 10 * U32, 8 * U32, gu, mu, n);
    double *got_x[2] = {0}, *got_u[2] = {0};
    void *bx = case_alloc(s, n, dtype_size(dt)), *bu = case_alloc(s, n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct shape sh = S2(rows, cols);
        if (!gated) {
            struct tensor tx = alias == 2 ? arena_out(&a, "x=dx", dt, sh, x.bits, bx)
                                          : arena_in(&a, "x", dt, sh, x.bits);
            struct tensor tg = alias == 1 ? arena_out(&a, "dout=dx", dt, sh, dout.bits, bx)
                                          : arena_in(&a, "dout", dt, sh, dout.bits);
            struct tensor tdx = alias == 1 ? tg : alias == 2 ? tx : arena_out(&a, "dx", dt, sh, NULL, bx);
            if (SUPPORTED(&v, b, activation_backward)) op_activation_backward(b, &tdx, &tg, &tx, act);
        } else {
            struct tensor tx = alias == 1 ? arena_out(&a, "gate=dgate", dt, sh, x.bits, bx)
                                          : arena_in(&a, "gate", dt, sh, x.bits);
            struct tensor tu = alias == 1 ? arena_out(&a, "up=dup", dt, sh, up.bits, bu)
                                          : arena_in(&a, "up", dt, sh, up.bits);
            struct tensor tg = alias == 2   ? arena_out(&a, "dout=dgate", dt, sh, dout.bits, bx)
                               : alias == 3 ? arena_out(&a, "dout=dup", dt, sh, dout.bits, bu)
                                            : arena_in(&a, "dout", dt, sh, dout.bits);
            struct tensor tdg = alias == 1 ? tx : alias == 2 ? tg : arena_out(&a, "dgate", dt, sh, NULL, bx);
            struct tensor tdu = alias == 1 ? tu : alias == 3 ? tg : arena_out(&a, "dup", dt, sh, NULL, bu);
            if (SUPPORTED(&v, b, gated_activation_backward))
                op_gated_activation_backward(b, &tdg, &tdu, &tg, &tx, &tu, act);
        }
        arena_finish(&a, &v);
        got_x[bi] = decode(s, bx, dt, n);
        got_u[bi] = decode(s, bu, dt, n);
    }
    check_close(s, &v, gated ? "dgate" : "dx", got_x, gx, tol_x, n, (size_t)cols);
    if (gated) check_close(s, &v, "dup", got_u, gu, tol_u, n, (size_t)cols);
    for (int bi = 0; oai && bi < s->n_backends; bi++) { /* the first of each, and the counts */
        size_t bad_g = 0, bad_u = 0, first_g = 0, first_u = 0;
        for (size_t i = 0; i < n; i++) {
            if (x.val[i] > 7.0 && got_x[bi][i] != 0.0 && bad_g++ == 0) first_g = i;
            if (fabs(up.val[i]) > 7.0 && got_u[bi][i] != 0.0 && bad_u++ == 0) first_u = i;
        }
        if (bad_g)
            verdict_fail(&v, "%s: dgate not 0 through %zu clamped gates (> 7); element %zu: gate %g, dgate %g",
                         s->backend_name[bi], bad_g, first_g, x.val[first_g], got_x[bi][first_g]);
        if (bad_u)
            verdict_fail(&v, "%s: dup not 0 through %zu clamped ups (|up| > 7); element %zu: up %g, dup %g",
                         s->backend_name[bi], bad_u, first_u, up.val[first_u], got_u[bi][first_u]);
    }
    case_end(s, name, &v);
}

/* ---- cross-entropy over the LM head ------------------------------------------------------------
 * z = h @ W^T over the whole vocabulary V; lse_i = log sum_j exp(z_ij); loss_i = lse_i - z_it
 * (0 for a masked row, target < 0); L = sum_i c_i loss_i, c_i = scale * row_scale_i (0 when
 * masked). dz = c_i (softmax(z_i) - onehot(t_i)), dh = dz @ W, dW = dz^T @ h.
 * The vocabulary is split into `shards` equal vocab-parallel shards, run as tensor-parallel
 * ranks would: stats per shard into one (shards, n, 3) buffer (the all-gather), combine, then
 * each shard's backward adding into one dh (the all-reduce) and its own slice of dW.
 * Tolerances: a logit carries E_z = 8 U32 sqrt(d) sum_l |h_l W_l| (an f32 dot product); lse
 * carries max_j E_z + 4 U32 (|lse| + sqrt(V)); an element of dz then carries
 * e = |c| p (E_z + E_lse + 4 U32) plus its rounding to the storage dtype (u |dz|), and dh, dW
 * are sums of such elements times |W| or |h|, plus the f32 sum's own 8 U32 sqrt(K) sum|terms|. */

struct ce_ctx {
    int            n, d, vocab;
    const int32_t *targets;
    const double  *c; /* (n) weights c_i */
    double        *h, *w;
};

/* L and, when z is not NULL, the logits (n, V). */
static double ce_loss_full(const struct ce_ctx *c, double *abs_sum, double *z_out, double *lse_out)
{
    double l = 0.0, a = 0.0;
    double *z = z_out ? z_out : xcalloc((size_t)c->vocab, sizeof(double));
    for (int i = 0; i < c->n; i++) {
        double *zr = z_out ? z + (size_t)i * c->vocab : z, mx = -INFINITY, sum = 0.0;
        for (int j = 0; j < c->vocab; j++) {
            double acc = 0.0;
            for (int t = 0; t < c->d; t++) acc += c->h[(size_t)i * c->d + t] * c->w[(size_t)j * c->d + t];
            zr[j] = acc;
            mx = fmax(mx, acc);
        }
        for (int j = 0; j < c->vocab; j++) sum += exp(zr[j] - mx);
        double lse = mx + log(sum);
        if (lse_out) lse_out[i] = lse;
        if (c->targets[i] < 0) continue;
        double li = lse - zr[c->targets[i]];
        l += c->c[i] * li;
        a += fabs(c->c[i]) * (fabs(lse) + fabs(zr[c->targets[i]]));
    }
    if (!z_out) free(z);
    *abs_sum = a;
    return l;
}

static double ce_loss(const void *p, double *abs_sum)
{
    return ce_loss_full(p, abs_sum, NULL, NULL);
}

static void case_cross_entropy(struct suite *s, enum dtype dt, enum dtype gdt, int n, int d,
                               int vocab, int shards, int with_row_scale, int accumulate_dh,
                               int reps)
{
    char name[192];
    snprintf(name, sizeof name, "cross_entropy %s dw=%s n=%d d=%d vocab=%d shards=%d%s%s reps=%d",
             dtype_name(dt), dtype_name(gdt), n, d, vocab, shards, with_row_scale ? " row_scale" : "",
             accumulate_dh ? " dh+=" : "", reps);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    CHECK(vocab % shards == 0, "vocab %d, shards %d", vocab, shards);
    const int vl = vocab / shards;
    const size_t nh = (size_t)n * d, nw = (size_t)vocab * d, nz = (size_t)n * vocab;
    struct hbuf h = hbuf_uniform(s, dt, nh, &r, -1.5, 1.5), w = hbuf_uniform(s, dt, nw, &r, -1, 1);
    struct hbuf dh0 = hbuf_uniform(s, dt, nh, &r, -0.1, 0.1), dw0 = grad_init(s, gdt, nw, &r);
    int32_t *tg = case_alloc(s, (size_t)n, sizeof(int32_t));
    float *rs = case_alloc(s, (size_t)n, sizeof(float));
    double *c = dalloc(s, (size_t)n);
    const float scale = 0.75f;
    for (int i = 0; i < n; i++) {
        /* The vocabulary's ends, a masked row, a shard's first id; then random ids, one row in
         * eight masked (-100, Hugging Face's ignore_index). */
        int edge[4] = {0, vocab - 1, -1, vl % vocab};
        tg[i] = i < 4 ? edge[i] : rng_int(&r, 8) == 0 ? -100 : rng_int(&r, vocab);
        rs[i] = with_row_scale ? (float)rng_range(&r, 0.25, 1.5) : 1.0f;
        c[i] = tg[i] < 0 ? 0.0 : (double)scale * rs[i];
    }
    /* The reference: logits, lse, loss, dz and the gradients with their tolerances. */
    struct ce_ctx ctx = {n, d, vocab, tg, c, h.val, w.val};
    double *z = dalloc(s, nz), *lse = dalloc(s, (size_t)n), *loss = dalloc(s, (size_t)n), l_abs;
    ce_loss_full(&ctx, &l_abs, z, lse);
    double *ez = dalloc(s, nz), *dz = dalloc(s, nz), *edz = dalloc(s, nz);
    double *tol_loss = dalloc(s, (size_t)n), *tol_lse = dalloc(s, (size_t)n);
    const double u_dz = storage_rounding[dt].u;
    for (int i = 0; i < n; i++) {
        double ez_max = 0.0;
        for (int j = 0; j < vocab; j++) {
            double aa = 0.0;
            for (int t = 0; t < d; t++) aa += fabs(h.val[(size_t)i * d + t] * w.val[(size_t)j * d + t]);
            ez[(size_t)i * vocab + j] = 8 * U32 * sqrt((double)d) * aa;
            ez_max = fmax(ez_max, ez[(size_t)i * vocab + j]);
        }
        double e_lse = ez_max + 4 * U32 * (fabs(lse[i]) + sqrt((double)vocab));
        tol_lse[i] = e_lse + 0x1p-150;
        loss[i] = tg[i] < 0 ? 0.0 : lse[i] - z[(size_t)i * vocab + tg[i]];
        tol_loss[i] = tg[i] < 0 ? 0.0 : e_lse + ez[(size_t)i * vocab + tg[i]] + 4 * U32 * fabs(loss[i]);
        for (int j = 0; j < vocab; j++) {
            size_t e = (size_t)i * vocab + j;
            double p = exp(z[e] - lse[i]);
            dz[e] = c[i] * (p - (j == tg[i] ? 1.0 : 0.0));
            edz[e] = fabs(c[i]) * p * (ez[e] + e_lse + 4 * U32) + u_dz * fabs(dz[e]) + 8 * U32 * fabs(dz[e]);
        }
    }
    double *gh = dalloc(s, nh), *mh = dalloc(s, nh), *gw = dalloc(s, nw), *mw = dalloc(s, nw);
    double *ah = dalloc(s, nh); /* sum_j |dz_ij W_jt|: bounds every shard's partial sum */
    for (int i = 0; i < n; i++)
        for (int t = 0; t < d; t++) {
            double acc = 0.0, err = 0.0, aa = 0.0;
            for (int j = 0; j < vocab; j++) {
                double wj = w.val[(size_t)j * d + t], dzv = dz[(size_t)i * vocab + j];
                acc += dzv * wj;
                err += edz[(size_t)i * vocab + j] * fabs(wj);
                aa += fabs(dzv * wj);
            }
            gh[(size_t)i * d + t] = acc;
            mh[(size_t)i * d + t] = err + 8 * U32 * sqrt((double)vocab) * aa;
            ah[(size_t)i * d + t] = aa;
        }
    for (int j = 0; j < vocab; j++)
        for (int t = 0; t < d; t++) {
            double acc = 0.0, err = 0.0, aa = 0.0;
            for (int i = 0; i < n; i++) {
                double hi = h.val[(size_t)i * d + t], dzv = dz[(size_t)i * vocab + j];
                acc += dzv * hi;
                err += edz[(size_t)i * vocab + j] * fabs(hi);
                aa += fabs(dzv * hi);
            }
            gw[(size_t)j * d + t] = acc;
            mw[(size_t)j * d + t] = err + 8 * U32 * sqrt((double)n) * aa;
        }
    struct verdict v = {.worst_ratio = -1.0};
    /* (a), on small cases (the double forward costs n V d per evaluation). */
    if ((double)n * vocab * d <= 2e6 && fd_wanted(gdt == DTYPE_F32 ? dt : gdt, (double)n * vocab * d)) {
        double *fh = dalloc(s, nh), *fw = dalloc(s, nw);
        memcpy(fh, h.val, nh * sizeof(double));
        memcpy(fw, w.val, nw * sizeof(double));
        struct ce_ctx fctx = {n, d, vocab, tg, c, fh, fw};
        check_fd(&v, "dh", fh, nh, gh, ce_loss, &fctx, &r);
        check_fd(&v, "dw", fw, nw, gw, ce_loss, &fctx, &r);
    }
    /* (b), (c): dh rounds once per call (reps * shards calls), dW once per call. */
    double *want_h = dalloc(s, nh), *mag_h = dalloc(s, nh), *tol_h = dalloc(s, nh);
    double *want_w = dalloc(s, nw), *mag_w = dalloc(s, nw), *tol_w = dalloc(s, nw);
    double *sum_h = dalloc(s, nh), *sum_w = dalloc(s, nw);
    accumulated(nh, accumulate_dh ? dh0.val : NULL, reps, gh, mh, want_h, mag_h, sum_h);
    for (size_t e = 0; e < nh; e++) sum_h[e] = fmax(sum_h[e], (accumulate_dh ? fabs(dh0.val[e]) : 0.0) + reps * ah[e]);
    accumulated(nw, dw0.val, reps, gw, mw, want_w, mag_w, sum_w);
    make_tol_acc(tol_h, dt, reps * shards, 4 * U32, 1.0, want_h, mag_h, sum_h, nh);
    make_tol_acc(tol_w, gdt, reps, 4 * U32, 1.0, want_w, mag_w, sum_w, nw);
    double *got_l[2] = {0}, *got_s[2] = {0}, *got_h[2] = {0}, *got_w[2] = {0};
    float *bl = case_alloc(s, (size_t)n, sizeof(float)), *bs = case_alloc(s, (size_t)n, sizeof(float));
    void *bh = case_alloc(s, nh, dtype_size(dt)), *bw = case_alloc(s, nw, dtype_size(gdt));
    const size_t wrow = (size_t)vl * d;
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor th = arena_in(&a, "h", dt, S2(n, d), h.bits);
        struct tensor tt = arena_in(&a, "targets", DTYPE_I32, S1(n), tg);
        struct tensor trs = arena_in(&a, "row_scale", DTYPE_F32, S1(n), rs);
        struct tensor tst = arena_out(&a, "stats", DTYPE_F32, S3(shards, n, 3), NULL, NULL);
        struct tensor tl = arena_out(&a, "loss", DTYPE_F32, S1(n), NULL, bl);
        struct tensor tls = arena_out(&a, "lse", DTYPE_F32, S1(n), NULL, bs);
        struct tensor tdh = arena_out(&a, "dh", dt, S2(n, d), accumulate_dh ? dh0.bits : NULL, bh);
        struct tensor tw[3], tdw[3];
        for (int k = 0; k < shards; k++) {
            tw[k] = arena_in(&a, "w shard", dt, S2(vl, d), (const char *)w.bits + k * wrow * dtype_size(dt));
            tdw[k] = arena_out(&a, "dw shard", gdt, S2(vl, d),
                               (const char *)dw0.bits + k * wrow * dtype_size(gdt),
                               (char *)bw + k * wrow * dtype_size(gdt));
        }
        if (SUPPORTED(&v, b, cross_entropy_stats) && SUPPORTED(&v, b, cross_entropy_combine) &&
            SUPPORTED(&v, b, cross_entropy_backward)) {
            for (int k = 0; k < shards; k++) {
                struct tensor st = view_rows(&tst, (int64_t)k * n, n);
                op_cross_entropy_stats(b, &st, &th, &tw[k], &tt, (int64_t)k * vl, 0.0f);
            }
            op_cross_entropy_combine(b, &tl, &tls, &tst, &tt);
            for (int rep = 0; rep < reps; rep++)
                for (int k = 0; k < shards; k++)
                    op_cross_entropy_backward(b, &tdh, &tdw[k], &th, &tw[k], &tt, &tls,
                                              with_row_scale ? &trs : NULL, scale, (int64_t)k * vl,
                                              accumulate_dh || rep > 0 || k > 0, 0.0f);
        }
        arena_finish(&a, &v);
        got_l[bi] = decode(s, bl, DTYPE_F32, (size_t)n);
        got_s[bi] = decode(s, bs, DTYPE_F32, (size_t)n);
        got_h[bi] = decode(s, bh, dt, nh);
        got_w[bi] = decode(s, bw, gdt, nw);
    }
    check_close(s, &v, "loss", got_l, loss, tol_loss, (size_t)n, (size_t)n);
    check_close(s, &v, "lse", got_s, lse, tol_lse, (size_t)n, (size_t)n);
    check_close(s, &v, "dh", got_h, want_h, tol_h, nh, (size_t)d);
    check_close(s, &v, "dw", got_w, want_w, tol_w, nw, (size_t)d);
    case_end(s, name, &v);
}

/* ---- AdamW -----------------------------------------------------------------------------------
 * The reference is optax.adamw (optax/_src/alias.py: adamw = chain(scale_by_adam(b1, b2, eps,
 * eps_root=0), add_decayed_weights(weight_decay), scale_by_learning_rate(lr)); transform.py
 * scale_by_adam: mu = b1 mu + (1 - b1) g, nu = b2 nu + (1 - b2) g^2, count += 1,
 * mu_hat = mu / (1 - b1^count), nu_hat = nu / (1 - b2^count),
 * update = mu_hat / (sqrt(nu_hat + eps_root) + eps); add_decayed_weights: update += wd p;
 * scale_by_learning_rate: update *= -lr; apply_updates: p += update), in double, on
 * g = grad_scale * g. Several consecutive steps run on the same buffers.
 * Tolerance per step, summed over the steps: p: 4 U32 |p| + 16 U32 lr (|update| + wd |p|);
 * m, v: 4 U32 (|m| + |(1 - b1) g|) and alike. */
static void case_adamw(struct suite *s, int n, int64_t step, int n_steps, float lr, float wd,
                       float grad_scale)
{
    char name[160];
    snprintf(name, sizeof name, "adamw n=%d step=%lld..+%d lr=%g wd=%g grad_scale=%g", n,
             (long long)step, n_steps - 1, (double)lr, (double)wd, (double)grad_scale);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    float *p = case_alloc(s, (size_t)n, sizeof(float)), *g = case_alloc(s, (size_t)n, sizeof(float));
    float *m = case_alloc(s, (size_t)n, sizeof(float)), *v0 = case_alloc(s, (size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) {
        p[i] = (float)rng_range(&r, -1, 1);
        g[i] = (float)(0.05 * rng_normal(&r));
        m[i] = step > 1 ? (float)rng_range(&r, -0.01, 0.01) : 0.0f;
        v0[i] = step > 1 ? (float)rng_range(&r, 0, 1e-4) : 0.0f;
    }
    if (n > 2) {
        g[0] = 0.0f;      /* no gradient at all: the update is weight decay alone (with m, v 0) */
        m[0] = v0[0] = 0.0f;
        g[1] = 1e3f;      /* a large gradient: Adam's update stays about lr */
        g[2] = -3e-7f;    /* a tiny one, comparable to eps */
    }
    double *wp = dalloc(s, (size_t)n), *wm = dalloc(s, (size_t)n), *wv = dalloc(s, (size_t)n);
    double *mp = dalloc(s, (size_t)n), *mm = dalloc(s, (size_t)n), *mv = dalloc(s, (size_t)n);
    for (int i = 0; i < n; i++) {
        double pi = p[i], mi = m[i], vi = v0[i], gi = (double)grad_scale * g[i];
        for (int k = 0; k < n_steps; k++) {
            double count = (double)(step + k);
            mi = b1 * mi + (1.0 - b1) * gi;
            vi = b2 * vi + (1.0 - b2) * gi * gi;
            double mu_hat = mi / (1.0 - pow(b1, count)), nu_hat = vi / (1.0 - pow(b2, count));
            double update = mu_hat / (sqrt(nu_hat) + eps) + wd * pi;
            mp[i] += 4 * U32 * fabs(pi) + 16 * U32 * lr * (fabs(update) + wd * fabs(pi));
            mm[i] += 4 * U32 * (fabs(mi) + fabs((1.0 - b1) * gi));
            mv[i] += 4 * U32 * (fabs(vi) + fabs((1.0 - b2) * gi * gi));
            pi += -lr * update;
        }
        wp[i] = pi, wm[i] = mi, wv[i] = vi;
    }
    double *tp = dalloc(s, (size_t)n), *tm = dalloc(s, (size_t)n), *tv = dalloc(s, (size_t)n);
    make_tol(tp, DTYPE_F32, 1, 0, 1.0, wp, mp, (size_t)n);
    make_tol(tm, DTYPE_F32, 1, 0, 1.0, wm, mm, (size_t)n);
    make_tol(tv, DTYPE_F32, 1, 0, 1.0, wv, mv, (size_t)n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got_p[2] = {0}, *got_m[2] = {0}, *got_v[2] = {0};
    float *bp = case_alloc(s, (size_t)n, 4), *bm = case_alloc(s, (size_t)n, 4), *bv = case_alloc(s, (size_t)n, 4);
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tpp = arena_out(&a, "p", DTYPE_F32, S1(n), p, bp);
        struct tensor tg = arena_in(&a, "g", DTYPE_F32, S1(n), g);
        struct tensor tmm = arena_out(&a, "m", DTYPE_F32, S1(n), m, bm);
        struct tensor tvv = arena_out(&a, "v", DTYPE_F32, S1(n), v0, bv);
        for (int k = 0; k < n_steps; k++) {
            struct adamw_params hp = {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps,
                                      .weight_decay = wd, .step = step + k, .grad_scale = grad_scale};
            if (SUPPORTED(&v, b, adamw)) op_adamw(b, &tpp, &tg, &tmm, &tvv, &hp);
        }
        arena_finish(&a, &v);
        got_p[bi] = decode(s, bp, DTYPE_F32, (size_t)n);
        got_m[bi] = decode(s, bm, DTYPE_F32, (size_t)n);
        got_v[bi] = decode(s, bv, DTYPE_F32, (size_t)n);
    }
    check_close(s, &v, "p", got_p, wp, tp, (size_t)n, (size_t)n);
    check_close(s, &v, "m", got_m, wm, tm, (size_t)n, (size_t)n);
    check_close(s, &v, "v", got_v, wv, tv, (size_t)n, (size_t)n);
    case_end(s, name, &v);
}

/* ---- sum of squares --------------------------------------------------------------------------
 * out = out0 + sum x^2; tolerance 8 U32 sqrt(n) sum x^2 (an f32 sum of positive terms in any
 * blocking). special 1: one element +Inf (out must be +Inf); 2: one NaN (out NaN). */
static void case_sum_squares(struct suite *s, enum dtype dt, int n, int special)
{
    static const char *const sp_names[] = {"", " with Inf", " with NaN"};
    char name[128];
    snprintf(name, sizeof name, "sum_squares %s n=%d%s", dtype_name(dt), n, sp_names[special]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)n, &r, -2, 2);
    if (special) hbuf_set(&x, (size_t)rng_int(&r, n), special == 1 ? INFINITY : NAN);
    float out0 = 1.25f;
    double want = out0, sq = 0.0;
    for (int i = 0; i < n; i++) sq += x.val[i] * x.val[i];
    want += sq;
    double tol = 8 * U32 * sqrt((double)n) * sq + 2 * U32 * fabs(want);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    float *bits = case_alloc(s, 1, sizeof(float));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S1(n), x.bits);
        struct tensor to = arena_out(&a, "out", DTYPE_F32, S1(1), &out0, bits);
        if (SUPPORTED(&v, b, sum_squares)) op_sum_squares(b, &to, &tx);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, DTYPE_F32, 1);
    }
    check_close(s, &v, "out", got, &want, &tol, 1, 1);
    case_end(s, name, &v);
}

/* ---- scatter_add_rows (a mixture of experts' combine) ----------------------------------------
 * Forward out[ids[i]] += w_i y[i]; L = sum(dout * out). dy[i] = w_i dout[ids[i]], dw_i =
 * dout[ids[i]] . y[i]. mag(dw_i): sqrt(d) sum_j |dout y| (an f32 dot product). ids repeat (the
 * op does not need them distinct) and skip rows. */

struct scatter_ctx {
    int           n, d;
    const int32_t *ids;
    const double *dout;
    double       *y, *w; /* perturbed by check_fd */
};

static double scatter_loss(const void *p, double *abs_sum)
{
    const struct scatter_ctx *c = p;
    double l = 0.0, a = 0.0;
    for (int i = 0; i < c->n; i++)
        for (int j = 0; j < c->d; j++) {
            double t = c->dout[(size_t)c->ids[i] * c->d + j] * c->w[i] * c->y[(size_t)i * c->d + j];
            l += t;
            a += fabs(t);
        }
    *abs_sum = a;
    return l;
}

static void case_scatter_add_rows_backward(struct suite *s, enum dtype dt, int n, int d, int rows, int with_dw)
{
    char name[160];
    snprintf(name, sizeof name, "scatter_add_rows_backward %s n=%d d=%d rows=%d%s", dtype_name(dt), n, d, rows,
             with_dw ? "" : " dweights=NULL");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    int32_t *ids = case_alloc(s, (size_t)(n ? n : 1), sizeof(int32_t));
    for (int i = 0; i < n; i++) ids[i] = i == 0 ? rows - 1 : rng_int(&r, rows);
    const size_t ny = (size_t)n * d, no = (size_t)rows * d;
    struct hbuf y = hbuf_uniform(s, dt, ny, &r, -2, 2), dout = hbuf_uniform(s, dt, no, &r, -1, 1);
    struct hbuf w = hbuf_uniform(s, DTYPE_F32, (size_t)n, &r, 0, 1);
    double *gy = dalloc(s, ny), *my = dalloc(s, ny), *gw = dalloc(s, (size_t)n), *mw = dalloc(s, (size_t)n);
    for (int i = 0; i < n; i++) {
        double dot = 0.0, mag = 0.0;
        for (int j = 0; j < d; j++) {
            const double g = dout.val[(size_t)ids[i] * d + j], yv = y.val[(size_t)i * d + j];
            gy[(size_t)i * d + j] = w.val[i] * g;
            my[(size_t)i * d + j] = fabs(w.val[i] * g);
            dot += g * yv;
            mag += fabs(g * yv);
        }
        gw[i] = dot;
        mw[i] = sqrt((double)d) * mag;
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *fy = dalloc(s, ny), *fw = dalloc(s, (size_t)n);
    memcpy(fy, y.val, ny * sizeof(double));
    memcpy(fw, w.val, (size_t)n * sizeof(double));
    struct scatter_ctx ctx = {n, d, ids, dout.val, fy, fw};
    check_fd(&v, "dy", fy, ny, gy, scatter_loss, &ctx, &r);
    check_fd(&v, "dweights", fw, (size_t)n, gw, scatter_loss, &ctx, &r);
    double *tol_y = dalloc(s, ny), *tol_w = dalloc(s, (size_t)n);
    make_tol(tol_y, dt, 1, 2 * U32, 0.0, gy, my, ny);
    make_tol(tol_w, DTYPE_F32, 1, 2 * U32, 2 * U32, gw, mw, (size_t)n);
    double *got_y[2] = {0}, *got_w[2] = {0};
    void *by = case_alloc(s, ny ? ny : 1, dtype_size(dt));
    float *bw = case_alloc(s, (size_t)(n ? n : 1), sizeof(float));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tdy = arena_out(&a, "dy", dt, S2(n, d), NULL, by);
        struct tensor tdw = arena_out(&a, "dweights", DTYPE_F32, S1(n), NULL, bw);
        struct tensor tdo = arena_in(&a, "dout", dt, S2(rows, d), dout.bits);
        struct tensor ty = arena_in(&a, "y", dt, S2(n, d), y.bits);
        struct tensor ti = arena_in(&a, "ids", DTYPE_I32, S1(n), ids);
        struct tensor tw = arena_in(&a, "weights", DTYPE_F32, S1(n), w.bits);
        if (SUPPORTED(&v, b, scatter_add_rows_backward))
            op_scatter_add_rows_backward(b, &tdy, with_dw ? &tdw : NULL, &tdo, &ty, &ti, &tw);
        arena_finish(&a, &v);
        got_y[bi] = decode(s, by, dt, ny);
        got_w[bi] = decode(s, bw, DTYPE_F32, (size_t)n);
    }
    check_close(s, &v, "dy", got_y, gy, tol_y, ny, (size_t)d);
    if (with_dw) check_close(s, &v, "dweights", got_w, gw, tol_w, (size_t)n, 1);
    case_end(s, name, &v);
}

/* ==== the case list ========================================================================= */

static void run_all(struct suite *s)
{
    static const enum activation acts[3] = {ACTIVATION_SILU, ACTIVATION_GELU_TANH,
                                            ACTIVATION_GELU_ERF};
    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        /* weight gradients in f32 (mixed precision) and in the activations' dtype */
        enum dtype gdts[2] = {DTYPE_F32, dt};
        for (int gi = 0; gi < (dt == DTYPE_F32 ? 1 : 2); gi++) {
            enum dtype gdt = gdts[gi];
            case_embedding_backward(s, 0, dt, gdt, 1, 64, 100, 0, 1);
            case_embedding_backward(s, 0, dt, gdt, 37, 67, 13, 0, 2);
            case_embedding_backward(s, 0, dt, gdt, 33, 129, 50, 1000, 1);
            case_embedding_backward(s, 0, dt, gdt, 600, 97, 40, 20, 2);
            case_embedding_backward(s, 1, dt, gdt, 17, 67, 33, 0, 2);
            case_embedding_backward(s, 1, dt, gdt, 1, 16, 4, 0, 1);

            static const int mm[][3] = {{1, 1, 1}, {1, 67, 33}, {3, 17, 129}, {17, 33, 67},
                                        {33, 129, 1}, {64, 128, 96}, {7, 256, 600}, {0, 16, 8}};
            for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
                case_matmul_backward(s, dt, gdt, mm[i][0], mm[i][1], mm[i][2], 7, (int)i % 2, 1 + (int)i % 2);
            case_matmul_backward(s, dt, gdt, 17, 33, 67, 1, 0, 1);
            case_matmul_backward(s, dt, gdt, 17, 33, 67, 2, 0, 2);
            case_matmul_backward(s, dt, gdt, 9, 20, 333, 4, 0, 2);
            case_matmul_backward(s, dt, gdt, 5, 70, 1100, 6, 1, 2);
            case_matmul_backward(s, dt, gdt, 300, 40, 24, 7, 0, 2);

            static const int norm_shapes[][2] = {{1, 1}, {3, 17}, {17, 33}, {1, 4096}, {5, 67}, {64, 769}};
            for (size_t i = 0; i < sizeof norm_shapes / sizeof norm_shapes[0]; i++) {
                int n = norm_shapes[i][0], d = norm_shapes[i][1];
                case_norm_backward(s, 0, dt, gdt, n, d, 1e-5, (int)i % 2, 0, 1 + (int)i % 2);
                case_norm_backward(s, 1, dt, gdt, n, d, 1e-5, (int)(i + 1) % 2, (int)i % 3 != 2,
                                   1 + (int)(i + 1) % 2);
            }
            case_norm_backward(s, 0, dt, gdt, 4, 129, 1e-6, 0, 0, 2);
            case_norm_backward(s, 1, dt, gdt, 4, 129, 1e-6, 1, 1, 2);

            case_cross_entropy(s, dt, gdt, 1, 16, 100, 1, 0, 0, 1);
            case_cross_entropy(s, dt, gdt, 17, 33, 301, 1, 1, 0, 2);
            case_cross_entropy(s, dt, gdt, 9, 64, 600, 2, 1, 1, 1);
            case_cross_entropy(s, dt, gdt, 6, 20, 99, 3, 0, 0, 2);
            case_cross_entropy(s, dt, gdt, 5, 24, 20000, 1, 1, 0, 1);
            case_cross_entropy(s, dt, gdt, 64, 16, 9000, 2, 0, 1, 1);
            case_cross_entropy(s, dt, gdt, 0, 16, 300, 1, 0, 0, 1);
        }
    }

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_rope_backward(s, dt, 1, 8, 128, 128, 10000.0f, ROPE_STYLE_PAIRS, 2047);
        case_rope_backward(s, dt, 3, 8, 128, 128, 10000.0f, ROPE_STYLE_HALVES, 2047);
        case_rope_backward(s, dt, 17, 4, 64, 32, 500000.0f, ROPE_STYLE_HALVES, 4095);
        case_rope_backward(s, dt, 5, 2, 80, 24, 1000000.0f, ROPE_STYLE_HALVES, 300);
        case_rope_backward(s, dt, 4, 3, 16, 2, 10000.0f, ROPE_STYLE_PAIRS, 100);
        case_rope_backward(s, dt, 3, 2, 64, 48, 10000.0f, ROPE_STYLE_PAIRS, 32767);
    }

    for (int di = 0; di < 3; di++)
        for (int ai = 0; ai < 3; ai++) {
            enum dtype dt = float_dtypes[di];
            case_activation_backward(s, 0, dt, acts[ai], 1, 1, 0);
            case_activation_backward(s, 0, dt, acts[ai], 3, 67, 1);
            case_activation_backward(s, 0, dt, acts[ai], 7, 1029, 2);
            case_activation_backward(s, 0, dt, acts[ai], 8, 5003, 0);
            case_activation_backward(s, 1, dt, acts[ai], 1, 1, 0);
            case_activation_backward(s, 1, dt, acts[ai], 3, 67, 1);
            case_activation_backward(s, 1, dt, acts[ai], 2, 688, 2);
            case_activation_backward(s, 1, dt, acts[ai], 8, 5003, 3);
        }
    /* GPT-OSS's clamped SwiGLU, gated only. */
    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_activation_backward(s, 1, dt, ACTIVATION_SWIGLU_OAI, 1, 1, 0);
        case_activation_backward(s, 1, dt, ACTIVATION_SWIGLU_OAI, 3, 67, 1);
        case_activation_backward(s, 1, dt, ACTIVATION_SWIGLU_OAI, 2, 688, 2);
        case_activation_backward(s, 1, dt, ACTIVATION_SWIGLU_OAI, 8, 5003, 3);
    }

    case_adamw(s, 1, 1, 1, 1e-3f, 0.1f, 1.0f);
    case_adamw(s, 1000, 1, 3, 3e-4f, 0.1f, 1.0f);
    case_adamw(s, 1031, 100, 2, 1e-2f, 0.0f, 0.5f);
    case_adamw(s, 100003, 5000, 2, 6e-4f, 0.01f, 1.0f / 1024.0f);

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_sum_squares(s, dt, 1, 0);
        case_sum_squares(s, dt, 1031, 0);
        case_sum_squares(s, dt, 100003, 0);
        case_sum_squares(s, dt, 5000, 1);
        case_sum_squares(s, dt, 70001, 2);
    }

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_scatter_add_rows_backward(s, dt, 1, 1, 1, 1);
        case_scatter_add_rows_backward(s, dt, 7, 67, 5, 1);
        case_scatter_add_rows_backward(s, dt, 33, 129, 40, 0);
        case_scatter_add_rows_backward(s, dt, 300, 96, 128, 1);
    }
}

int main(int argc, char **argv)
{
    return suite_main(argc, argv, "test_ops_backward", "ops_backward_cuda", run_all);
}
