/* tests/test_ops.c - every op of kernels/ops.h, in every float dtype, on odd, decode and small
 * Llama-like shapes.
 *
 * --backend cpu:  each op on the CPU backend against a plain double-precision reference written
 *                 in this file from the mathematical definitions (not from any backend's code).
 *                 Inputs are drawn in double, rounded to the storage dtype, and the reference
 *                 runs on the rounded values, so that only the op's own error is measured.
 * --backend cuda: the same cases on the CUDA backend, compared with the double reference and
 *                 with the CPU backend on identical inputs. Prints "SKIP: ops_cuda: ..." and
 *                 exits 77 when the build has no CUDA backend or the machine has no GPU.
 *
 * Every buffer handed to an op sits between guard regions that must come back untouched; every
 * input must come back unchanged; every pure output starts filled with NaN, so that an element
 * the op never writes is caught; every output is checked for NaN/Inf where the reference is
 * finite. An op whose slot a backend leaves empty is reported as a failure ("not implemented"),
 * never as a pass. That harness (guards, comparisons, verdicts, main) is tests/op_check.c,
 * shared with test_ops_backward.c and test_attention_train.c; this file keeps the tolerances,
 * the references and the cases, but for kv_write's and attention's (test_ops_attention.c).
 *
 * Not here: backward ops (tests/test_ops_backward.c), models (the golden tests).
 *
 * Run:  test_ops --backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N]
 * Each case prints one line: "ok" with its name and its worst err/tol ratio (how close it came
 * to the tolerance), or "FAIL" with its name and, indented below, every failed check (worst
 * element with got/want/tol, max abs and rel errors with their [row, col]); the last line is
 * "N passed, M failed". Exit status: 0 all passed, 1 a failure, 2 bad usage, 77 skipped. The default seed is
 * fixed, and each case draws its inputs from the seed and its own name, so --filter reproduces a
 * case's inputs exactly. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"
#include "test_ops_impl.h"

/* ---- tolerances ---------------------------------------------------------------------------
 *
 * An output element passes when
 *
 *     |got - want| <= u * |want| + (1 + u) * (rel * |want| + abs * mag) + floor
 *
 * where want is the double reference on the rounded inputs, (rel, abs) is the op's row below
 * (the error of doing the arithmetic in f32, as ops.h requires whatever the storage dtype),
 * mag is an op-specific magnitude computed by the reference (defined in each row's comment),
 * u is the storage rounding of the output dtype (storage_rounding in op_check.h: the result is
 * rounded once, on store; for f32 the rows below count it already) and floor is the larger of
 * the dtype's and the op's floor.
 *
 * A CUDA output must also be within twice that bound of the CPU output on the same inputs (each
 * may sit on either side of the reference).
 *
 * Copies and selections (cast, embedding, kv_write, argmax, topk) have no row: they are exact,
 * and are compared bit for bit (cast: the correctly rounded value, sign of zero included). */

static const struct tolerance tolerances[OP_COUNT] = {
    /* x + table[pos], a + c, alpha * x: one f32 operation on exactly representable values is
     * correctly rounded (error <= U32 |y|); the second U32 is slack for an implementation that
     * reaches the same value through a fused multiply-add. */
    [OP_POSITION_EMBEDDING_ADD] = {2 * U32, 0, 0},
    [OP_ADD] = {2 * U32, 0, 0},
    [OP_SCALE] = {2 * U32, 0, 0},
    /* cap * tanh(x / cap): tanhf within a few ulps, a division and a product. */
    [OP_SOFTCAP] = {8 * U32, 0, 0},
    /* o + w y: a product and a sum (or one fused multiply-add); mag = |o| + |w y|. */
    [OP_SCATTER_ADD] = {2 * U32, 2 * U32, 0},
    /* mag = sqrt(k) * sum_l |x_l w_l| + |bias|. An f32 dot product of length k in any
     * summation order is within lambda sqrt(k) U32 sum_l |x_l w_l| of the exact value with
     * overwhelming probability (Higham & Mary's probabilistic bound; the worst case is
     * k U32 sum); lambda = 8. With inputs uniform in [-1, 1] this is about 1.2e-7 k^1.5, i.e.
     * tighter than 1e-4 sqrt(k) max|x| max|w| up to k ~ 800 and 5x looser at k = 4096; f32
     * accumulation (OpenBLAS, cuBLAS) stays 10x or more below it, while TF32 or half-precision
     * accumulation exceeds it. rel: the bias add and the final rounding. */
    [OP_MATMUL] = {4 * U32, 8 * U32, 0},
    /* mag = sqrt(d) * |out|. The sum of d squares carries a relative error of about
     * sqrt(d) U32 (typically; d U32 at worst, but its terms are all positive), which reaches
     * every element of the row through the common factor 1/rms, halved by the square root;
     * rel: the reciprocal square root (correctly rounded or one Newton step) and two products. */
    [OP_RMSNORM] = {8 * U32, 4 * U32, 0},
    /* mag = sqrt(d) * (|w| r max|x| + |x - mean| |w| r^3 mean(x^2)) + |bias|, r = 1/sqrt(var+eps).
     * The mean carries an absolute error of about sqrt(d) U32 max|x|, which every (x - mean)
     * inherits and r |w| scales. The variance, if computed in one pass as mean(x^2) - mean^2,
     * carries an absolute error of about sqrt(d) U32 mean(x^2), which changes r by half of it
     * relative to var + eps; the second term allows that (a two-pass variance is more exact and
     * passes too). Inputs have row offsets, so this is not vacuous. */
    [OP_LAYERNORM] = {8 * U32, 4 * U32, 0},
    /* mag = (|x_a| + |x_b|) * (2 + pos f (2 i ln(theta) / rot + 3)), f = theta^(-2i/rot), for both
     * members of pair i. The angle pos f computed in f32 is off by about U32 times
     * pos f (2 i ln(theta) / rot + 3): the power's exponent -2i/rot is rounded, and its error is
     * amplified by ln(theta); the power, the product and the argument of sin/cos add a rounding
     * each. An angle error e moves the rotated pair by at most e (|x_a| + |x_b|). The 2 covers
     * sin/cos themselves. Rows at position 32767 exercise this. */
    [OP_ROPE] = {4 * U32, 4 * U32, 0},
    /* mag = sum_j p_j |v_j| * (4 + 2 sqrt(n) + 2 sqrt(D) scale max_j sum_d |q_d k_jd|), over the
     * n attended positions. A score error e_j (f32 dot product of length D, probabilistic bound
     * as for matmul) changes p_j by at most about 2 max e p_j; exp, the online rescaling and the
     * final division add a few U32 relative to each p_j (the 4); the weighted sum of n values
     * adds about sqrt(n) U32 sum_j p_j |v_j|. */
    [OP_ATTENTION] = {4 * U32, 4 * U32, 0},
    /* mag = 1 + |x|. expf, tanhf, erff are accurate to a few ulps (rel); GELU's 1 + tanh() or
     * 1 + erf() cancels for negative x, where the f32 error of tanh/erf (about U32 absolute)
     * is multiplied by |x| / 2 (abs). */
    [OP_ACTIVATION] = {8 * U32, 8 * U32, 0},
    /* mag = (1 + |gate|) |up|: the activation's error, as above, times up; one product more. */
    [OP_GATED_ACTIVATION] = {10 * U32, 8 * U32, 0},
    /* mag = |p| (sqrt(v) + |x - max|). exp(x - max) is accurate to a few U32 relative to p, the
     * subtraction x - max rounds by U32 |x - max| (an error that exp turns into a relative error
     * of p), and the sum of v terms carries about sqrt(v) U32. floor: probabilities below the
     * f32 normal range (2^-126) are subnormal in f32 and have no relative accuracy left (a GPU
     * may flush them to zero). */
    [OP_SOFTMAX] = {4 * U32, 4 * U32, 0x1p-126},
    /* mag = |x| + |max| + |lse| + sqrt(v), lse = log(sum exp(x - max)). The result is a
     * difference of terms of these sizes, each carrying a few U32 (x - max is exact for
     * neighbouring values, but x - (max + lse) is not, and both orders are fine in f32); the
     * sum inside the log carries about sqrt(v) U32 relative, which the log turns into an
     * absolute error. Inputs at +-1e4 make the |x| term matter. */
    [OP_LOG_SOFTMAX] = {2 * U32, 4 * U32, 0},
};

/* Fills tol[i], the bound on |got - want| described at the top of the file. */
void make_tol(double *tol, enum op_id op, enum dtype t, const double *want, const double *mag, size_t n)
{
    const struct tolerance *o = &tolerances[op];
    const struct storage_rounding *sr = &storage_rounding[t];
    double floor = o->floor > sr->floor ? o->floor : sr->floor;
    for (size_t i = 0; i < n; i++) {
        double w = isfinite(want[i]) ? fabs(want[i]) : 0.0;
        tol[i] = sr->u * w + (1.0 + sr->u) * (o->rel * w + o->abs * mag[i]) + floor;
    }
}

/* ==== reference implementations (double precision) ========================================= */

/* y[i,j] = sum_l x[i,l] w[j,l] + bias[j]; x (m, k), w (n, k), y (m, n).
 * mag[i,j] = sqrt(k) sum_l |x[i,l] w[j,l]| + |bias[j]|. */
static void ref_matmul(int m, int k, int n, const double *x, const double *w, const double *bias,
                       double *y, double *mag)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0.0, acc_abs = 0.0;
            for (int l = 0; l < k; l++) {
                double p = x[(size_t)i * k + l] * w[(size_t)j * k + l];
                acc += p;
                acc_abs += fabs(p);
            }
            double b = bias ? bias[j] : 0.0;
            y[(size_t)i * n + j] = acc + b;
            mag[(size_t)i * n + j] = sqrt((double)k) * acc_abs + fabs(b);
        }
}

/* out = x / sqrt(mean(x^2) + eps) * w per row; mag = sqrt(d) |out|. */
static void ref_rmsnorm(int n, int d, const double *x, const double *w, double eps, double *out,
                        double *mag)
{
    for (int i = 0; i < n; i++) {
        const double *xr = x + (size_t)i * d;
        double ss = 0.0;
        for (int j = 0; j < d; j++) ss += xr[j] * xr[j];
        double r = 1.0 / sqrt(ss / d + eps);
        for (int j = 0; j < d; j++) {
            double o = xr[j] * r * w[j];
            out[(size_t)i * d + j] = o;
            mag[(size_t)i * d + j] = sqrt((double)d) * fabs(o);
        }
    }
}

/* out = (x - mean) / sqrt(var + eps) * w + b per row, biased variance (two-pass in double).
 * mag as documented in the tolerance table. */
static void ref_layernorm(int n, int d, const double *x, const double *w, const double *b,
                          double eps, double *out, double *mag)
{
    for (int i = 0; i < n; i++) {
        const double *xr = x + (size_t)i * d;
        double mean = 0.0, var = 0.0, ms = 0.0, max_abs = 0.0;
        for (int j = 0; j < d; j++) mean += xr[j];
        mean /= d;
        for (int j = 0; j < d; j++) {
            var += (xr[j] - mean) * (xr[j] - mean);
            ms += xr[j] * xr[j];
            if (fabs(xr[j]) > max_abs) max_abs = fabs(xr[j]);
        }
        var /= d;
        ms /= d;
        double r = 1.0 / sqrt(var + eps), sd = sqrt((double)d);
        for (int j = 0; j < d; j++) {
            double bj = b ? b[j] : 0.0;
            out[(size_t)i * d + j] = (xr[j] - mean) * r * w[j] + bj;
            mag[(size_t)i * d + j] = sd * (fabs(w[j]) * r * max_abs +
                                           fabs(xr[j] - mean) * fabs(w[j]) * r * r * r * ms) +
                                     fabs(bj);
        }
    }
}

/* Rotary embedding of x (n, h, hd), out of place into out. Pair i of a head is
 * (2i, 2i+1) for ROPE_STYLE_PAIRS and (i, i + rot/2) for ROPE_STYLE_HALVES; it turns by
 * pos * theta^(-2i/rot): (a, b) -> (a cos - b sin, a sin + b cos). Features from rot on pass
 * through. mag as documented in the tolerance table (0 for pass-through features). */
static void ref_rope(int n, int h, int hd, const double *x, const int32_t *pos, int rot,
                     double theta, const float *factors, double attn, enum rope_style style, double *out,
                     double *mag)
{
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < h; hh++) {
            size_t base = ((size_t)t * h + hh) * hd;
            for (int j = rot; j < hd; j++) {
                out[base + j] = x[base + j];
                mag[base + j] = 0.0;
            }
            for (int i = 0; i < rot / 2; i++) {
                int ia = style == ROPE_STYLE_PAIRS ? 2 * i : i;
                int ib = style == ROPE_STYLE_PAIRS ? 2 * i + 1 : i + rot / 2;
                double f = pow(theta, -2.0 * i / rot) / (factors ? factors[i] : 1.0), ang = pos[t] * f;
                double a = x[base + ia], b = x[base + ib];
                out[base + ia] = attn * (a * cos(ang) - b * sin(ang));
                out[base + ib] = attn * (a * sin(ang) + b * cos(ang));
                double m = attn * (fabs(a) + fabs(b)) *
                           (2.0 + pos[t] * f * (2.0 * i * log(theta) / rot + 3.0));
                mag[base + ia] = mag[base + ib] = m;
            }
        }
}

/* Softmax (or log-softmax) of one row of v values, which may hold -inf but not only -inf.
 * mag as documented in the tolerance table. */
static void ref_softmax_row(int v, const double *x, int log_out, double *out, double *mag)
{
    double m = -INFINITY;
    for (int j = 0; j < v; j++)
        if (x[j] > m) m = x[j];
    double sum = 0.0;
    for (int j = 0; j < v; j++) sum += exp(x[j] - m);
    double lse = log(sum);
    for (int j = 0; j < v; j++) {
        if (log_out) {
            out[j] = x[j] - m - lse; /* -inf for -inf inputs */
            mag[j] = isinf(x[j]) ? 0.0 : fabs(x[j]) + fabs(m) + fabs(lse) + sqrt((double)v);
        } else {
            out[j] = exp(x[j] - m) / sum; /* 0 for -inf inputs */
            mag[j] = isinf(x[j]) ? 0.0 : out[j] * (sqrt((double)v) + fabs(x[j] - m));
        }
    }
}

/* Index of the largest non-NaN value, lowest index on ties; -1 when the row is all NaN. */
static int ref_argmax_row(int v, const double *x)
{
    int best = -1;
    for (int j = 0; j < v; j++) {
        if (isnan(x[j])) continue;
        if (best < 0 || x[j] > x[best]) best = j;
    }
    return best;
}

struct ranked {
    double val;
    int    idx;
};

/* Descending by value, ascending by index on ties. */
static int ranked_cmp(const void *pa, const void *pb)
{
    const struct ranked *a = pa, *b = pb;
    if (a->val != b->val) return a->val > b->val ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

/* ---- cast ---------------------------------------------------------------------------------- */

/* Values whose conversions are easy to get wrong: signed zeros, infinities, NaN; the f16 edge of
 * overflow (65504 is the largest f16, 65520 the first value that rounds to inf); f16 subnormals
 * and the ties between them (2^-25 rounds to 0, 1.5 x 2^-24 to 2 x 2^-24); f32 subnormals; ties
 * of bf16 and f16 rounding next to 1 (to even); the bf16 edge of overflow (0x1.ffp127 is the
 * tie between bf16's largest value and 2^128, and rounds to inf). */
static const double cast_specials[] = {
    0.0,           -0.0,        1.0,         -1.0,         INFINITY,       -INFINITY,
    NAN,           65504.0,     65519.0,     65520.0,      -65520.0,       1e5,
    3.4e38,        0x1.fffffep127, 0x1p-14,  0x1p-24,      0x1p-25,        0x1.8p-24,
    0x1.8p-25,     0x1p-26,     1e-8,        1e-40,        0x1p-149,       1.0 + 0x1p-8,
    1.0 + 0x1.8p-7, 1.0 + 0x1p-11, 1.0 + 0x1.8p-10, 0.1,   -1.0 / 3.0,     -2.5e-6,
    0x1.fep127,    0x1.ffp127,  -0x1.ffp127, 6.1e-5,       -7.0e-6,        4096.5,
};
#define N_CAST_SPECIALS (int)(sizeof cast_specials / sizeof cast_specials[0])

static void case_cast(struct suite *s, enum dtype from, enum dtype to, int n)
{
    char name[96];
    snprintf(name, sizeof name, "cast %s->%s n=%d", dtype_name(from), dtype_name(to), n);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf in = hbuf_make(s, from, (size_t)n);
    for (int i = 0; i < n; i++) {
        /* After the specials, magnitudes spread over 2^-30 .. 2^20 in both signs: f16
         * subnormals, underflow to zero and overflow to inf all happen. */
        double v = i < N_CAST_SPECIALS
                       ? cast_specials[i]
                       : (rng_int(&r, 2) ? -1 : 1) * ldexp(1.0 + rng_uniform(&r),
                                                            rng_int(&r, 51) - 30);
        hbuf_set(&in, (size_t)i, v);
    }
    double *want = case_alloc(s, (size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) want[i] = fmt_round(in.val[i], to);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, (size_t)n, dtype_size(to));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tin = arena_in(&a, "in", from, S1(n), in.bits);
        struct tensor tout = arena_out(&a, "out", to, S1(n), NULL, bits);
        if (SUPPORTED(&v, b, cast)) op_cast(b, &tout, &tin);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, to, (size_t)n);
    }
    check_exact(s, &v, "out", got, want, (size_t)n, (size_t)n, 1);
    case_end(s, name, &v);
}

/* The host conversions of tensor.h (every backend and loader relies on them) against the
 * reference rounding, on the specials and on random f32 bit patterns. */
static void case_host_convert(struct suite *s)
{
    const char *name = "host dtype conversions (tensor.h)";
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct verdict v = {.worst_ratio = -1.0};
    int n = N_CAST_SPECIALS + 20000;
    int bad_bf16 = 0, bad_f16 = 0, bad_back = 0;
    for (int i = 0; i < n; i++) {
        float f;
        if (i < N_CAST_SPECIALS) {
            f = (float)cast_specials[i];
        } else {
            uint32_t u = (uint32_t)rng_next(&r);
            memcpy(&f, &u, 4);
        }
        double want_b = fmt_round(f, DTYPE_BF16), want_h = fmt_round(f, DTYPE_F16);
        uint16_t hb = f32_to_bf16(f), hh = f32_to_f16(f);
        double got_b = fmt_load(&hb, DTYPE_BF16, 0), got_h = fmt_load(&hh, DTYPE_F16, 0);
        int ok_b = isnan(want_b) ? isnan(got_b)
                                 : got_b == want_b && !signbit(got_b) == !signbit(want_b);
        int ok_h = isnan(want_h) ? isnan(got_h)
                                 : got_h == want_h && !signbit(got_h) == !signbit(want_h);
        if (!ok_b && bad_bf16++ == 0)
            verdict_fail(&v, "f32_to_bf16(%.9g) = %.9g, want %.9g", (double)f, got_b, want_b);
        if (!ok_h && bad_f16++ == 0)
            verdict_fail(&v, "f32_to_f16(%.9g) = %.9g, want %.9g", (double)f, got_h, want_h);
        /* And back: widening is exact. */
        double back_b = bf16_to_f32(hb), back_h = f16_to_f32(hh);
        if (!((isnan(got_b) && isnan(back_b)) || back_b == got_b) ||
            !((isnan(got_h) && isnan(back_h)) || back_h == got_h)) {
            if (bad_back++ == 0)
                verdict_fail(&v, "widening %.9g: bf16_to_f32 %.9g (want %.9g), f16_to_f32 %.9g "
                             "(want %.9g)", (double)f, back_b, got_b, back_h, got_h);
        }
    }
    if (bad_bf16 + bad_f16 + bad_back)
        verdict_fail(&v, "%d bf16, %d f16, %d widening mismatches of %d values", bad_bf16,
                     bad_f16, bad_back, n);
    case_end(s, name, &v);
}

/* ---- embedding and positions ------------------------------------------------------------- */

static void case_embedding(struct suite *s, enum dtype dt, int n, int d, int vocab,
                           int vocab_start)
{
    char name[128];
    snprintf(name, sizeof name, "embedding %s n=%d d=%d vocab_local=%d vocab_start=%d",
             dtype_name(dt), n, d, vocab, vocab_start);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf table = hbuf_uniform(s, dt, (size_t)vocab * d, &r, -1, 1);
    int32_t *ids = case_alloc(s, (size_t)n, sizeof(int32_t));
    /* The shard's edges and their outside neighbours first, -1 (never a token) among them;
     * then ids around the shard's range, some of them outside it. */
    int edges[] = {vocab_start, vocab_start + vocab - 1, vocab_start - 1, vocab_start + vocab, -1,
                   vocab_start + vocab / 2};
    for (int i = 0; i < n; i++)
        ids[i] = i < 6 ? edges[i] : vocab_start - 3 + rng_int(&r, vocab + 6);
    size_t no = (size_t)n * d;
    double *want = case_alloc(s, no, sizeof(double));
    for (int i = 0; i < n; i++) {
        int row = ids[i] - vocab_start;
        for (int j = 0; j < d; j++)
            want[(size_t)i * d + j] =
                row >= 0 && row < vocab ? table.val[(size_t)row * d + j] : 0.0;
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tt = arena_in(&a, "table", dt, S2(vocab, d), table.bits);
        struct tensor ti = arena_in(&a, "ids", DTYPE_I32, S1(n), ids);
        struct tensor to = arena_out(&a, "out", dt, S2(n, d), NULL, bits);
        if (SUPPORTED(&v, b, embedding)) op_embedding(b, &to, &tt, &ti, vocab_start);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_exact(s, &v, "out", got, want, no, (size_t)d, 0);
    case_end(s, name, &v);
}

/* out[ids[i]] += w[i] y[i] (a mixture of experts' combine) into a table of `rows` rows, ids distinct. */
static void case_scatter_add_rows(struct suite *s, enum dtype dt, int n, int d, int rows)
{
    char name[128];
    snprintf(name, sizeof name, "scatter_add_rows %s n=%d d=%d rows=%d", dtype_name(dt), n, d, rows);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf out0 = hbuf_uniform(s, dt, (size_t)rows * d, &r, -2, 2);
    struct hbuf y = hbuf_uniform(s, dt, (size_t)n * d, &r, -2, 2);
    int32_t *ids = case_alloc(s, (size_t)n, sizeof(int32_t));
    float *w = case_alloc(s, (size_t)n, sizeof(float));
    for (int i = 0; i < n; i++) { /* distinct rows: every (rows / n)-th, shuffled by a stride */
        ids[i] = (int32_t)(((int64_t)i * 7 + 3) % rows);
        w[i] = (float)(rng_int(&r, 2001) - 1000) / 1000.0f;
    }
    size_t no = (size_t)rows * d;
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    for (size_t e = 0; e < no; e++) want[e] = out0.val[e], mag[e] = fabs(out0.val[e]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) {
            const size_t e = (size_t)ids[i] * d + j;
            const double add = (double)w[i] * y.val[(size_t)i * d + j];
            want[e] += add;
            mag[e] += fabs(add);
        }
    make_tol(tol, OP_SCATTER_ADD, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor to = arena_out(&a, "out", dt, S2(rows, d), out0.bits, bits);
        struct tensor ty = arena_in(&a, "y", dt, S2(n, d), y.bits);
        struct tensor ti = arena_in(&a, "ids", DTYPE_I32, S1(n), ids);
        struct tensor tw = arena_in(&a, "w", DTYPE_F32, S1(n), w);
        if (SUPPORTED(&v, b, scatter_add_rows)) op_scatter_add_rows(b, &to, &ty, &ti, &tw);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "out", got, want, tol, no, (size_t)d);
    case_end(s, name, &v);
}

static void case_position_embedding_add(struct suite *s, enum dtype dt, int n, int d, int max_pos)
{
    char name[128];
    snprintf(name, sizeof name, "position_embedding_add %s n=%d d=%d max_positions=%d",
             dtype_name(dt), n, d, max_pos);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)n * d, &r, -1, 1);
    struct hbuf table = hbuf_uniform(s, dt, (size_t)max_pos * d, &r, -1, 1);
    int32_t *pos = case_alloc(s, (size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? max_pos - 1 : i == 1 ? 0 : rng_int(&r, max_pos);
    size_t no = (size_t)n * d;
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            want[(size_t)i * d + j] = x.val[(size_t)i * d + j] + table.val[(size_t)pos[i] * d + j];
    make_tol(tol, OP_POSITION_EMBEDDING_ADD, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_out(&a, "x", dt, S2(n, d), x.bits, bits);
        struct tensor tt = arena_in(&a, "table", dt, S2(max_pos, d), table.bits);
        struct tensor tp = arena_in(&a, "positions", DTYPE_I32, S1(n), pos);
        if (SUPPORTED(&v, b, position_embedding_add)) op_position_embedding_add(b, &tx, &tt, &tp);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "x", got, want, tol, no, (size_t)d);
    case_end(s, name, &v);
}

/* ---- matmul ------------------------------------------------------------------------------ */

static void case_matmul(struct suite *s, enum dtype dt, int m, int k, int n, int with_bias)
{
    char name[128];
    snprintf(name, sizeof name, "matmul %s m=%d k=%d n=%d%s", dtype_name(dt), m, k, n,
             with_bias ? " bias" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)m * k, &r, -1, 1);
    struct hbuf w = hbuf_uniform(s, dt, (size_t)n * k, &r, -1, 1);
    struct hbuf bias = hbuf_uniform(s, dt, (size_t)n, &r, -1, 1);
    size_t no = (size_t)m * n;
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    ref_matmul(m, k, n, x.val, w.val, with_bias ? bias.val : NULL, want, mag);
    make_tol(tol, OP_MATMUL, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(m, k), x.bits);
        struct tensor tw = arena_in(&a, "w", dt, S2(n, k), w.bits);
        struct tensor tb = arena_in(&a, "bias", dt, S1(n), bias.bits);
        struct tensor ty = arena_out(&a, "y", dt, S2(m, n), NULL, bits);
        if (SUPPORTED(&v, b, matmul)) op_matmul(b, &ty, &tx, &tw, with_bias ? &tb : NULL);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "y", got, want, tol, no, (size_t)n);
    case_end(s, name, &v);
}

/* op_matmul_many: three products of one x (n = ns[0..2], the second without a bias) must give
 * the reference's results and the very bits three op_matmul calls give on the same backend (on
 * CUDA one gemv launch for all three, where each fits it, against three). */
static void case_matmul_many(struct suite *s, enum dtype dt, int m, int k, const int ns[3])
{
    char name[128];
    snprintf(name, sizeof name, "matmul_many %s m=%d k=%d n=%d,%d,%d", dtype_name(dt), m, k, ns[0], ns[1], ns[2]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)m * k, &r, -1, 1);
    struct hbuf w[3], bias[3];
    double *want[3], *tol[3];
    void *bits[3], *sep_bits[3];
    for (int i = 0; i < 3; i++) {
        const size_t no = (size_t)m * ns[i];
        w[i] = hbuf_uniform(s, dt, (size_t)ns[i] * k, &r, -1, 1);
        bias[i] = hbuf_uniform(s, dt, (size_t)ns[i], &r, -1, 1);
        want[i] = case_alloc(s, no, sizeof(double));
        tol[i] = case_alloc(s, no, sizeof(double));
        double *mag = case_alloc(s, no, sizeof(double));
        ref_matmul(m, k, ns[i], x.val, w[i].val, i == 1 ? NULL : bias[i].val, want[i], mag);
        make_tol(tol[i], OP_MATMUL, dt, want[i], mag, no);
        bits[i] = case_alloc(s, no, dtype_size(dt));
        sep_bits[i] = case_alloc(s, no, dtype_size(dt));
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[3][2] = {{0}};
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(m, k), x.bits);
        struct tensor tw[3], tb[3], ty[3], tz[3];
        const struct tensor *ys[3], *ws[3], *bs[3];
        for (int i = 0; i < 3; i++) {
            tw[i] = arena_in(&a, "w", dt, S2(ns[i], k), w[i].bits);
            tb[i] = arena_in(&a, "bias", dt, S1(ns[i]), bias[i].bits);
            ty[i] = arena_out(&a, "y", dt, S2(m, ns[i]), NULL, bits[i]);
            tz[i] = arena_out(&a, "y (one op_matmul)", dt, S2(m, ns[i]), NULL, sep_bits[i]);
            ys[i] = &ty[i];
            ws[i] = &tw[i];
            bs[i] = i == 1 ? NULL : &tb[i];
        }
        if (SUPPORTED(&v, b, matmul)) {
            op_matmul_many(b, 3, ys, &tx, ws, bs);
            for (int i = 0; i < 3; i++) op_matmul(b, &tz[i], &tx, &tw[i], bs[i]);
        }
        arena_finish(&a, &v);
        for (int i = 0; i < 3; i++) {
            got[i][bi] = decode(s, bits[i], dt, (size_t)m * ns[i]);
            if (memcmp(bits[i], sep_bits[i], (size_t)m * ns[i] * dtype_size(dt)))
                verdict_fail(&v, "%s: product %d differs from op_matmul's", b->ops->name, i);
        }
    }
    for (int i = 0; i < 3; i++) check_close(s, &v, "y", got[i], want[i], tol[i], (size_t)m * ns[i], (size_t)ns[i]);
    case_end(s, name, &v);
}

/* ---- norms ------------------------------------------------------------------------------- */

/* amp scales the inputs: at amp 100, f16 inputs have squares far beyond f16's range, which only
 * f32 accumulation survives. With n >= 3, row 1 is all zeros (the output must be zeros). */
static void case_rmsnorm(struct suite *s, enum dtype dt, int n, int d, double eps, int alias,
                         double amp)
{
    char name[128];
    snprintf(name, sizeof name, "rmsnorm %s n=%d d=%d eps=%g amp=%g%s", dtype_name(dt), n, d, eps,
             amp, alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)n * d, &r, -2 * amp, 2 * amp);
    if (n >= 3)
        for (int j = 0; j < d; j++) hbuf_set(&x, (size_t)d + j, 0.0);
    struct hbuf w = hbuf_uniform(s, dt, (size_t)d, &r, -1.5, 1.5);
    size_t no = (size_t)n * d;
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    ref_rmsnorm(n, d, x.val, w.val, (float)eps, want, mag);
    make_tol(tol, OP_RMSNORM, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S2(n, d), x.bits, bits)
                                 : arena_in(&a, "x", dt, S2(n, d), x.bits);
        struct tensor tw = arena_in(&a, "weight", dt, S1(d), w.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S2(n, d), NULL, bits);
        if (SUPPORTED(&v, b, rmsnorm)) op_rmsnorm(b, &to, &tx, &tw, (float)eps);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "out", got, want, tol, no, (size_t)d);
    case_end(s, name, &v);
}

/* op_add_rmsnorm against op_add then op_rmsnorm on the same backend: sum and out bit for bit (the
 * norm must read the sum as stored), with sum separate or over a (alias 1) or over c (alias 2);
 * out also against the double reference of rmsnorm(a + c) within rmsnorm's tolerance. */
static void case_add_rmsnorm(struct suite *s, enum dtype dt, int n, int d, int alias)
{
    char name[128];
    snprintf(name, sizeof name, "add_rmsnorm %s n=%d d=%d%s", dtype_name(dt), n, d,
             alias == 1 ? " sum=a" : alias == 2 ? " sum=c" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const size_t no = (size_t)n * d;
    struct hbuf a = hbuf_uniform(s, dt, no, &r, -3.0, 3.0), c = hbuf_uniform(s, dt, no, &r, -1.0, 1.0);
    struct hbuf w = hbuf_uniform(s, dt, (size_t)d, &r, -1.5, 1.5), ac = hbuf_make(s, dt, no);
    for (size_t i = 0; i < no; i++) hbuf_set(&ac, i, (double)((float)a.val[i] + (float)c.val[i]));
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    ref_rmsnorm(n, d, ac.val, w.val, 1e-5f, want, mag);
    make_tol(tol, OP_RMSNORM, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *sum_bits = case_alloc(s, no, dtype_size(dt)), *out_bits = case_alloc(s, no, dtype_size(dt));
    void *sum_seq = case_alloc(s, no, dtype_size(dt)), *out_seq = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        for (int fused = 0; fused < 2; fused++) {
            struct arena ar = {.b = b};
            void *sb = fused ? sum_bits : sum_seq, *ob = fused ? out_bits : out_seq;
            struct tensor ta = alias == 1 ? arena_out(&ar, "a=sum", dt, S2(n, d), a.bits, sb)
                                          : arena_in(&ar, "a", dt, S2(n, d), a.bits);
            struct tensor tc = alias == 2 ? arena_out(&ar, "c=sum", dt, S2(n, d), c.bits, sb)
                                          : arena_in(&ar, "c", dt, S2(n, d), c.bits);
            struct tensor tw = arena_in(&ar, "weight", dt, S1(d), w.bits);
            struct tensor ts = alias == 1 ? ta : alias == 2 ? tc : arena_out(&ar, "sum", dt, S2(n, d), NULL, sb);
            struct tensor to = arena_out(&ar, "out", dt, S2(n, d), NULL, ob);
            if (!fused) {
                op_add(b, &ts, &ta, &tc);
                op_rmsnorm(b, &to, &ts, &tw, 1e-5f);
            } else if (SUPPORTED(&v, b, add_rmsnorm))
                op_add_rmsnorm(b, &ts, &to, &ta, &tc, &tw, 1e-5f);
            arena_finish(&ar, &v);
        }
        double *gs = decode(s, sum_bits, dt, no), *ws = decode(s, sum_seq, dt, no);
        double *go = decode(s, out_bits, dt, no), *wo = decode(s, out_seq, dt, no);
        compare_exact(&v, "sum against op_add", gs, ws, no, (size_t)d, 1);
        compare_exact(&v, "out against op_add then op_rmsnorm", go, wo, no, (size_t)d, 1);
        got[bi] = go;
    }
    check_close(s, &v, "out", got, want, tol, no, (size_t)d);
    case_end(s, name, &v);
}

/* Rows carry offsets -4, 0, +4 (so that the mean matters); with n >= 3, row 1 is constant (the
 * output must be the bias). */
static void case_layernorm(struct suite *s, enum dtype dt, int n, int d, double eps,
                           int with_bias, int alias)
{
    char name[128];
    snprintf(name, sizeof name, "layernorm %s n=%d d=%d eps=%g%s%s", dtype_name(dt), n, d, eps,
             with_bias ? " bias" : "", alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)n * d);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++)
            hbuf_set(&x, (size_t)i * d + j,
                     n >= 3 && i == 1 ? 0.75 : 4.0 * (i % 3 - 1) + rng_range(&r, -2, 2));
    struct hbuf w = hbuf_uniform(s, dt, (size_t)d, &r, -1.5, 1.5);
    struct hbuf bias = hbuf_uniform(s, dt, (size_t)d, &r, -1, 1);
    size_t no = (size_t)n * d;
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    ref_layernorm(n, d, x.val, w.val, with_bias ? bias.val : NULL, (float)eps, want, mag);
    make_tol(tol, OP_LAYERNORM, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S2(n, d), x.bits, bits)
                                 : arena_in(&a, "x", dt, S2(n, d), x.bits);
        struct tensor tw = arena_in(&a, "weight", dt, S1(d), w.bits);
        struct tensor tb = arena_in(&a, "bias", dt, S1(d), bias.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S2(n, d), NULL, bits);
        if (SUPPORTED(&v, b, layernorm))
            op_layernorm(b, &to, &tx, &tw, with_bias ? &tb : NULL, (float)eps);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "out", got, want, tol, no, (size_t)d);
    case_end(s, name, &v);
}

/* ---- elementwise --------------------------------------------------------------------------- */

/* alias: 0 out is its own buffer, 1 out = a, 2 out = c. */
static void case_add(struct suite *s, enum dtype dt, int n, int alias)
{
    static const char *const alias_names[] = {"", " out=a", " out=c"};
    char name[96];
    snprintf(name, sizeof name, "add %s n=%d%s", dtype_name(dt), n, alias_names[alias]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)n, &r, -4, 4);
    struct hbuf y = hbuf_uniform(s, dt, (size_t)n, &r, -4, 4);
    double *want = case_alloc(s, (size_t)n, sizeof(double));
    double *mag = case_alloc(s, (size_t)n, sizeof(double));
    double *tol = case_alloc(s, (size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) want[i] = x.val[i] + y.val[i];
    make_tol(tol, OP_ADD, dt, want, mag, (size_t)n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, (size_t)n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor ta = alias == 1 ? arena_out(&a, "a=out", dt, S1(n), x.bits, bits)
                                      : arena_in(&a, "a", dt, S1(n), x.bits);
        struct tensor tc = alias == 2 ? arena_out(&a, "c=out", dt, S1(n), y.bits, bits)
                                      : arena_in(&a, "c", dt, S1(n), y.bits);
        struct tensor to = alias == 1 ? ta : alias == 2 ? tc
                                           : arena_out(&a, "out", dt, S1(n), NULL, bits);
        if (SUPPORTED(&v, b, add)) op_add(b, &to, &ta, &tc);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, (size_t)n);
    }
    check_close(s, &v, "out", got, want, tol, (size_t)n, (size_t)n);
    case_end(s, name, &v);
}

/* The elementwise maps out = f(x) with one parameter: op_scale (alpha * x) and op_softcap (cap *
 * tanh(x / cap), inputs over 4 caps either side so that tanh bends). */
static void case_map(struct suite *s, enum op_id op, enum dtype dt, int n, float param, int alias)
{
    char name[96];
    snprintf(name, sizeof name, "%s %s n=%d %s=%g%s", op == OP_SCALE ? "scale" : "softcap", dtype_name(dt), n,
             op == OP_SCALE ? "alpha" : "cap", (double)param, alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const double range = op == OP_SCALE ? 4.0 : 4.0 * param;
    struct hbuf x = hbuf_uniform(s, dt, (size_t)n, &r, -range, range);
    double *want = case_alloc(s, (size_t)n, sizeof(double));
    double *mag = case_alloc(s, (size_t)n, sizeof(double));
    double *tol = case_alloc(s, (size_t)n, sizeof(double));
    for (int i = 0; i < n; i++)
        want[i] = op == OP_SCALE ? (double)param * x.val[i] : (double)param * tanh(x.val[i] / (double)param);
    make_tol(tol, op, dt, want, mag, (size_t)n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, (size_t)n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S1(n), x.bits, bits)
                                 : arena_in(&a, "x", dt, S1(n), x.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S1(n), NULL, bits);
        if (op == OP_SCALE && SUPPORTED(&v, b, scale)) op_scale(b, &to, &tx, param);
        if (op == OP_SOFTCAP && SUPPORTED(&v, b, softcap)) op_softcap(b, &to, &tx, param);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, (size_t)n);
    }
    check_close(s, &v, "out", got, want, tol, (size_t)n, (size_t)n);
    case_end(s, name, &v);
}

/* ---- rope ---------------------------------------------------------------------------------- */

/* scaled: per-pair frequency divisors (a rope scaling's) and an attention factor 1.25. */
static void case_rope(struct suite *s, enum dtype dt, int n, int h, int hd, int rot, float theta,
                      enum rope_style style, int max_pos, int scaled)
{
    char name[160];
    snprintf(name, sizeof name, "rope %s n=%d heads=%d head_dim=%d rot_dim=%d theta=%g %s "
             "max_pos=%d%s", dtype_name(dt), n, h, hd, rot, (double)theta,
             style == ROPE_STYLE_PAIRS ? "pairs" : "halves", max_pos, scaled ? " scaled" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t no = (size_t)n * h * hd;
    struct hbuf x = hbuf_uniform(s, dt, no, &r, -1, 1);
    int32_t *pos = case_alloc(s, (size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? max_pos : i == 1 ? 0 : rng_int(&r, max_pos + 1);
    double *want = case_alloc(s, no, sizeof(double)), *mag = case_alloc(s, no, sizeof(double));
    double *tol = case_alloc(s, no, sizeof(double));
    float *factors = scaled ? case_alloc(s, (size_t)rot / 2, sizeof(float)) : NULL;
    for (int i = 0; scaled && i < rot / 2; i++) factors[i] = 1.0f + 7.0f * (float)i / (float)rot; /* 1 .. 4.5 */
    const float attn = scaled ? 1.25f : 1.0f;
    float *freqs = case_alloc(s, (size_t)rot / 2, sizeof(float));
    rope_frequencies(theta, rot, factors, freqs);
    ref_rope(n, h, hd, x.val, pos, rot, (double)theta, factors, attn, style, want, mag);
    make_tol(tol, OP_ROPE, dt, want, mag, no);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_out(&a, "x", dt, S3(n, h, hd), x.bits, bits);
        struct tensor tp = arena_in(&a, "positions", DTYPE_I32, S1(n), pos);
        const struct rope_params rp = {.freqs = freqs, .attn_factor = attn};
        if (SUPPORTED(&v, b, rope)) op_rope(b, &tx, &tp, rot, &rp, style);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "x", got, want, tol, no, (size_t)hd);
    case_end(s, name, &v);
}

/* op_rope_qk: q (n, h) and k (n, kv) heads rotated together must be the very bits op_rope gives
 * each (on CUDA one launch against two), and q the reference's rotation. */
static void case_rope_qk(struct suite *s, enum dtype dt, int n, int h, int kv, int hd, int rot, enum rope_style style)
{
    char name[160];
    snprintf(name, sizeof name, "rope_qk %s n=%d heads=%d/%d head_dim=%d rot_dim=%d %s", dtype_name(dt), n, h, kv, hd,
             rot, style == ROPE_STYLE_PAIRS ? "pairs" : "halves");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const size_t nq = (size_t)n * h * hd, nk = (size_t)n * kv * hd;
    struct hbuf q = hbuf_uniform(s, dt, nq, &r, -1, 1), k = hbuf_uniform(s, dt, nk, &r, -1, 1);
    int32_t *pos = case_alloc(s, (size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) pos[i] = rng_int(&r, 5000);
    double *want = case_alloc(s, nq, sizeof(double)), *mag = case_alloc(s, nq, sizeof(double));
    double *tol = case_alloc(s, nq, sizeof(double));
    ref_rope(n, h, hd, q.val, pos, rot, 10000.0, NULL, 1.0f, style, want, mag);
    float *freqs = case_alloc(s, (size_t)rot / 2, sizeof(float));
    rope_frequencies(10000.0f, rot, NULL, freqs);
    make_tol(tol, OP_ROPE, dt, want, mag, nq);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *qb = case_alloc(s, nq, dtype_size(dt)), *kb = case_alloc(s, nk, dtype_size(dt));
    void *q1 = case_alloc(s, nq, dtype_size(dt)), *k1 = case_alloc(s, nk, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tq = arena_out(&a, "q", dt, S3(n, h, hd), q.bits, qb);
        struct tensor tk = arena_out(&a, "k", dt, S3(n, kv, hd), k.bits, kb);
        struct tensor tq1 = arena_out(&a, "q (op_rope)", dt, S3(n, h, hd), q.bits, q1);
        struct tensor tk1 = arena_out(&a, "k (op_rope)", dt, S3(n, kv, hd), k.bits, k1);
        struct tensor tp = arena_in(&a, "positions", DTYPE_I32, S1(n), pos);
        const struct rope_params rp = {.freqs = freqs, .attn_factor = 1.0f};
        if (SUPPORTED(&v, b, rope)) {
            op_rope_qk(b, &tq, &tk, &tp, rot, &rp, style);
            op_rope(b, &tq1, &tp, rot, &rp, style);
            op_rope(b, &tk1, &tp, rot, &rp, style);
        }
        arena_finish(&a, &v);
        if (memcmp(qb, q1, nq * dtype_size(dt)) || memcmp(kb, k1, nk * dtype_size(dt)))
            verdict_fail(&v, "%s: q or k differs from op_rope's", b->ops->name);
        got[bi] = decode(s, qb, dt, nq);
    }
    check_close(s, &v, "q", got, want, tol, nq, (size_t)hd);
    case_end(s, name, &v);
}

/* ---- activations --------------------------------------------------------------------------- */

/* Inputs in [-10, 10], preceded by zeros, tiny values and the far tails. */
static const double act_specials[] = {0.0, -0.0, 1e-3, -1e-3, 30.0, -30.0, 5.0, -5.0, 1.0, -1.0};
#define N_ACT_SPECIALS (int)(sizeof act_specials / sizeof act_specials[0])

static void case_activation(struct suite *s, enum dtype dt, enum activation act, int n, int alias)
{
    char name[96];
    snprintf(name, sizeof name, "activation %s %s n=%d%s", dtype_name(dt), act_name(act), n,
             alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)n);
    for (int i = 0; i < n; i++)
        hbuf_set(&x, (size_t)i, i < N_ACT_SPECIALS ? act_specials[i] : rng_range(&r, -10, 10));
    double *want = case_alloc(s, (size_t)n, sizeof(double));
    double *mag = case_alloc(s, (size_t)n, sizeof(double));
    double *tol = case_alloc(s, (size_t)n, sizeof(double));
    for (int i = 0; i < n; i++) {
        want[i] = ref_act(act, x.val[i]);
        mag[i] = 1.0 + fabs(x.val[i]);
    }
    make_tol(tol, OP_ACTIVATION, dt, want, mag, (size_t)n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, (size_t)n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S1(n), x.bits, bits)
                                 : arena_in(&a, "x", dt, S1(n), x.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S1(n), NULL, bits);
        if (SUPPORTED(&v, b, activation)) op_activation(b, &to, &tx, act);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, (size_t)n);
    }
    check_close(s, &v, "out", got, want, tol, (size_t)n, (size_t)n);
    case_end(s, name, &v);
}

/* ACTIVATION_SWIGLU_OAI's first (gate, up) pairs: at and past its clamps (gate <= 7, up in
 * [-7, 7]), in threes whose last two must give exactly the output of the first, a clamped input
 * acting as the clamp: gate 9 and 20 as 7, up 9 and 20 as 7, up -9 and -20 as -7, both at once. */
static const double oai_specials[][2] = {
    {7.0, 2.5},  {9.0, 2.5},   {20.0, 2.5},   {-1.5, 7.0},  {-1.5, 9.0},  {-1.5, 20.0},
    {3.0, -7.0}, {3.0, -9.0},  {3.0, -20.0},  {7.0, -7.0},  {8.0, -8.0},  {19.5, -19.5},
};
#define N_OAI_SPECIALS (int)(sizeof oai_specials / sizeof oai_specials[0])

/* alias: 0 out is its own buffer, 1 out = gate, 2 out = up. Shaped (rows, cols) to look like an
 * MLP's hidden activations. ACTIVATION_SWIGLU_OAI draws gate and up from [-20, 20], so that
 * both clamps are hit, after oai_specials. */
static void case_gated_activation(struct suite *s, enum dtype dt, enum activation act, int rows,
                                  int cols, int alias)
{
    static const char *const alias_names[] = {"", " out=gate", " out=up"};
    char name[112];
    snprintf(name, sizeof name, "gated_activation %s %s %dx%d%s", dtype_name(dt), act_name(act),
             rows, cols, alias_names[alias]);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t n = (size_t)rows * cols;
    const int oai = act == ACTIVATION_SWIGLU_OAI;
    struct hbuf g = hbuf_make(s, dt, n), u;
    if (oai) {
        u = hbuf_make(s, dt, n);
        for (size_t i = 0; i < n; i++) {
            const int sp = (int)i < N_OAI_SPECIALS;
            hbuf_set(&g, i, sp ? oai_specials[i][0] : rng_range(&r, -20, 20));
            hbuf_set(&u, i, sp ? oai_specials[i][1] : rng_range(&r, -20, 20));
        }
    } else {
        for (size_t i = 0; i < n; i++)
            hbuf_set(&g, i, (int)i < N_ACT_SPECIALS ? act_specials[i] : rng_range(&r, -10, 10));
        u = hbuf_uniform(s, dt, n, &r, -3, 3);
    }
    double *want = case_alloc(s, n, sizeof(double)), *mag = case_alloc(s, n, sizeof(double));
    double *tol = case_alloc(s, n, sizeof(double));
    for (size_t i = 0; i < n; i++) {
        const double up = ref_gated_up(act, u.val[i]);
        /* |gate| past the clamp adds no error: the activation sees 7 */
        const double ga = oai && g.val[i] > 7.0 ? 7.0 : fabs(g.val[i]);
        want[i] = ref_act(act, g.val[i]) * up;
        mag[i] = (1.0 + ga) * fabs(up);
    }
    make_tol(tol, OP_GATED_ACTIVATION, dt, want, mag, n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tg = alias == 1 ? arena_out(&a, "gate=out", dt, S2(rows, cols), g.bits, bits)
                                      : arena_in(&a, "gate", dt, S2(rows, cols), g.bits);
        struct tensor tu = alias == 2 ? arena_out(&a, "up=out", dt, S2(rows, cols), u.bits, bits)
                                      : arena_in(&a, "up", dt, S2(rows, cols), u.bits);
        struct tensor to = alias == 1 ? tg : alias == 2 ? tu
                                           : arena_out(&a, "out", dt, S2(rows, cols), NULL, bits);
        if (SUPPORTED(&v, b, gated_activation)) op_gated_activation(b, &to, &tg, &tu, act);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, n);
    }
    check_close(s, &v, "out", got, want, tol, n, (size_t)cols);
    for (int bi = 0; oai && bi < s->n_backends; bi++)
        for (size_t i = 0; i < n && (int)i < N_OAI_SPECIALS; i++)
            if (i % 3 != 0 && memcmp(&got[bi][i], &got[bi][i - i % 3], sizeof(double)) != 0)
                verdict_fail(&v, "%s: clamped (gate %g, up %g) gave %.9g, (gate %g, up %g) %.9g",
                             s->backend_name[bi], g.val[i], u.val[i], got[bi][i],
                             g.val[i - i % 3], u.val[i - i % 3], got[bi][i - i % 3]);
    case_end(s, name, &v);
}

/* ACTIVATION_SWIGLU_OAI keeps a NaN gate or up NaN (transformers' clamp does; a min(x, 7) written
 * as x < 7 ? x : 7 made a NaN gate 7). */
static void case_oai_nan(struct suite *s, enum dtype dt)
{
    char name[64];
    snprintf(name, sizeof name, "gated_activation %s swiglu_oai NaN in, NaN out", dtype_name(dt));
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf g = hbuf_make(s, dt, 2), u = hbuf_make(s, dt, 2);
    hbuf_set(&g, 0, NAN), hbuf_set(&u, 0, 1.0), hbuf_set(&g, 1, 1.0), hbuf_set(&u, 1, NAN);
    struct verdict v = {.worst_ratio = -1.0};
    void *bits = case_alloc(s, 2, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tg = arena_in(&a, "gate", dt, S2(1, 2), g.bits), tu = arena_in(&a, "up", dt, S2(1, 2), u.bits);
        struct tensor to = arena_out(&a, "out", dt, S2(1, 2), NULL, bits);
        if (SUPPORTED(&v, b, gated_activation)) op_gated_activation(b, &to, &tg, &tu, ACTIVATION_SWIGLU_OAI);
        arena_finish(&a, &v);
        const double *got = decode(s, bits, dt, 2);
        if (!isnan(got[0]) || !isnan(got[1]))
            verdict_fail(&v, "%s: NaN gate -> %g, NaN up -> %g (want NaN, NaN)", s->backend_name[bi], got[0], got[1]);
    }
    case_end(s, name, &v);
}

/* ---- softmax, log_softmax ------------------------------------------------------------------ */

/* Row i is of kind i % 5: 0 N(0, 3); 1 1e4 + N(0, 5); 2 -1e4 + N(0, 5); 3 uniform in
 * [-1e4, 1e4] (nearly one-hot); 4 N(0, 3) with about a third of the entries -inf (masked;
 * entry 0 always finite). Large offsets overflow exp() in any implementation that does not
 * subtract the row maximum first. */
static void case_softmax(struct suite *s, enum dtype dt, int log_out, int rows, int v_len,
                         int alias)
{
    char name[112];
    snprintf(name, sizeof name, "%s %s rows=%d v=%d%s", log_out ? "log_softmax" : "softmax",
             dtype_name(dt), rows, v_len, alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t n = (size_t)rows * v_len;
    struct hbuf x = hbuf_make(s, dt, n);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < v_len; j++) {
            double val = 0.0;
            switch (i % 5) {
            case 0: val = 3.0 * rng_normal(&r); break;
            case 1: val = 1e4 + 5.0 * rng_normal(&r); break;
            case 2: val = -1e4 + 5.0 * rng_normal(&r); break;
            case 3: val = rng_range(&r, -1e4, 1e4); break;
            case 4: val = j > 0 && rng_int(&r, 3) == 0 ? -INFINITY : 3.0 * rng_normal(&r); break;
            }
            hbuf_set(&x, (size_t)i * v_len + j, val);
        }
    double *want = case_alloc(s, n, sizeof(double)), *mag = case_alloc(s, n, sizeof(double));
    double *tol = case_alloc(s, n, sizeof(double));
    for (int i = 0; i < rows; i++)
        ref_softmax_row(v_len, x.val + (size_t)i * v_len, log_out, want + (size_t)i * v_len,
                        mag + (size_t)i * v_len);
    make_tol(tol, log_out ? OP_LOG_SOFTMAX : OP_SOFTMAX, dt, want, mag, n);
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S2(rows, v_len), x.bits, bits)
                                 : arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S2(rows, v_len), NULL, bits);
        if (log_out) {
            if (SUPPORTED(&v, b, log_softmax)) op_log_softmax(b, &to, &tx);
        } else {
            if (SUPPORTED(&v, b, softmax)) op_softmax(b, &to, &tx);
        }
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, n);
    }
    check_close(s, &v, "out", got, want, tol, n, (size_t)v_len);
    case_end(s, name, &v);
}

/* ---- argmax, topk -------------------------------------------------------------------------- */

/* Row i is of kind i % 8: 0 random with its maximum repeated at up to three later places (ties:
 * the lowest index wins); 1 random with NaN at index 0 and elsewhere (a kernel that seeds its
 * running maximum with x[0] never moves past NaN); 2 all equal (0 wins); 3 NaN everywhere but
 * one number, -inf or finite; 4 +inf twice, -inf, NaN last; 5 all NaN (any index in range is
 * accepted: there is no number to choose); 6 all -inf (0: -inf is a number); 7 the maximum at
 * the last index only. */
static void case_argmax(struct suite *s, enum dtype dt, int rows, int v_len)
{
    char name[96];
    snprintf(name, sizeof name, "argmax %s rows=%d v=%d", dtype_name(dt), rows, v_len);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t n = (size_t)rows * v_len;
    struct hbuf x = hbuf_make(s, dt, n);
    for (int i = 0; i < rows; i++) {
        struct hbuf *h = &x;
        size_t o = (size_t)i * v_len;
        for (int j = 0; j < v_len; j++) hbuf_set(h, o + j, rng_range(&r, -8, 8));
        int p = rng_int(&r, v_len);
        switch (i % 8) {
        case 0:
            for (int j = 0; j < 3; j++) {
                int q = p + rng_int(&r, v_len - p);
                hbuf_set(h, o + q, 9.5);
            }
            hbuf_set(h, o + p, 9.5);
            break;
        case 1:
            hbuf_set(h, o, NAN);
            for (int j = 0; j < 3; j++) hbuf_set(h, o + rng_int(&r, v_len), NAN);
            break;
        case 2:
            for (int j = 0; j < v_len; j++) hbuf_set(h, o + j, 1.25);
            break;
        case 3:
            for (int j = 0; j < v_len; j++) hbuf_set(h, o + j, NAN);
            hbuf_set(h, o + p, p % 2 ? -INFINITY : -3.0);
            break;
        case 4:
            hbuf_set(h, o + rng_int(&r, v_len), -INFINITY);
            hbuf_set(h, o + p, INFINITY);
            hbuf_set(h, o + rng_int(&r, v_len), INFINITY);
            hbuf_set(h, o + (size_t)v_len - 1, NAN);
            break;
        case 5:
            for (int j = 0; j < v_len; j++) hbuf_set(h, o + j, NAN);
            break;
        case 6:
            for (int j = 0; j < v_len; j++) hbuf_set(h, o + j, -INFINITY);
            break;
        case 7:
            hbuf_set(h, o + (size_t)v_len - 1, 12.0);
            break;
        }
    }
    int32_t *want = case_alloc(s, (size_t)rows, sizeof(int32_t));
    for (int i = 0; i < rows; i++) want[i] = ref_argmax_row(v_len, x.val + (size_t)i * v_len);
    struct verdict v = {.worst_ratio = -1.0};
    int32_t *got[2] = {0};
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        got[bi] = case_alloc(s, (size_t)rows, sizeof(int32_t));
        struct tensor tx = arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor ti = arena_out(&a, "ids", DTYPE_I32, S1(rows), NULL, got[bi]);
        if (SUPPORTED(&v, b, argmax)) op_argmax(b, &ti, &tx);
        arena_finish(&a, &v);
        /* An all-NaN row accepts any index in range: substitute it so the comparison passes,
         * but never an out-of-range one. */
        int32_t *cmp = case_alloc(s, (size_t)rows, sizeof(int32_t));
        for (int i = 0; i < rows; i++)
            cmp[i] = want[i] < 0 && got[bi][i] >= 0 && got[bi][i] < v_len ? got[bi][i] : want[i];
        char label[64];
        snprintf(label, sizeof label, "%s: ids vs reference", s->backend_name[bi]);
        compare_i32(&v, label, got[bi], cmp, (size_t)rows, 1);
    }
    case_end(s, name, &v);
}

/* Row i is of kind i % 4: 0 small integers (many ties: the lower index comes first); 1 N(0, 1)
 * (no ties); 2 all equal (ids must be 0..k-1); 3 N(0, 1) with +inf and -inf entries. */
static void case_topk(struct suite *s, enum dtype dt, int rows, int v_len, int k)
{
    char name[96];
    snprintf(name, sizeof name, "topk %s rows=%d v=%d k=%d", dtype_name(dt), rows, v_len, k);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    size_t n = (size_t)rows * v_len, nk = (size_t)rows * k;
    struct hbuf x = hbuf_make(s, dt, n);
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < v_len; j++) {
            double val = 0.0;
            switch (i % 4) {
            case 0: val = rng_int(&r, 6); break;
            case 1: val = rng_normal(&r); break;
            case 2: val = -0.5; break;
            case 3: val = rng_int(&r, 8) == 0 ? (j % 2 ? INFINITY : -INFINITY) : rng_normal(&r); break;
            }
            hbuf_set(&x, (size_t)i * v_len + j, val);
        }
    double *want_v = case_alloc(s, nk, sizeof(double));
    int32_t *want_i = case_alloc(s, nk, sizeof(int32_t));
    struct ranked *rk = case_alloc(s, (size_t)v_len, sizeof(struct ranked));
    for (int i = 0; i < rows; i++) {
        for (int j = 0; j < v_len; j++) rk[j] = (struct ranked){x.val[(size_t)i * v_len + j], j};
        qsort(rk, (size_t)v_len, sizeof rk[0], ranked_cmp);
        for (int j = 0; j < k; j++) {
            want_v[(size_t)i * k + j] = rk[j].val;
            want_i[(size_t)i * k + j] = rk[j].idx;
        }
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got_v[2] = {0};
    int32_t *got_i[2] = {0};
    float *vbits = case_alloc(s, nk, sizeof(float));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        got_i[bi] = case_alloc(s, nk, sizeof(int32_t));
        struct tensor tx = arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor tv = arena_out(&a, "values", DTYPE_F32, S2(rows, k), NULL, vbits);
        struct tensor ti = arena_out(&a, "ids", DTYPE_I32, S2(rows, k), NULL, got_i[bi]);
        if (SUPPORTED(&v, b, topk)) op_topk(b, &tv, &ti, &tx);
        arena_finish(&a, &v);
        got_v[bi] = decode(s, vbits, DTYPE_F32, nk);
        char label[64];
        snprintf(label, sizeof label, "%s: ids vs reference", s->backend_name[bi]);
        compare_i32(&v, label, got_i[bi], want_i, nk, (size_t)k);
    }
    check_exact(s, &v, "values", got_v, want_v, nk, (size_t)k, 1);
    if (s->n_backends == 2) compare_i32(&v, "cuda vs cpu: ids", got_i[0], got_i[1], nk, (size_t)k);
    case_end(s, name, &v);
}

/* op_logit_mass (sampled rows' top candidates: the weights' sum within the sampler's floor). Row
 * i of kind i % 4 with inverse temperature w[i]: 0 N(0, 3); 1 around 1e4 (the maximum subtracted
 * first); 2 one token far above the rest (the floor leaves it alone); 3 w = 0 (no sum: 0). The
 * reference sums in double over the same floor; within 1e-5 relative (f32 exp per element, the
 * f32 result). */
static void case_logit_mass(struct suite *s, enum dtype dt, int rows, int v_len)
{
    char name[96];
    snprintf(name, sizeof name, "logit_mass %s rows=%d v=%d", dtype_name(dt), rows, v_len);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)rows * v_len);
    float *w = case_alloc(s, (size_t)rows, sizeof(float));
    double *want = case_alloc(s, (size_t)rows, sizeof(double)), *tol = case_alloc(s, (size_t)rows, sizeof(double));
    for (int i = 0; i < rows; i++) {
        w[i] = i % 4 == 3 ? 0.0f : (float)(1.0 / rng_range(&r, 0.1, 2.0));
        for (int j = 0; j < v_len; j++) {
            double val = i % 4 == 1 ? 1e4 + 3.0 * rng_normal(&r) : 3.0 * rng_normal(&r);
            if (i % 4 == 2 && j == v_len / 3) val = 60.0;
            hbuf_set(&x, (size_t)i * v_len + j, val);
        }
        const double *xr = x.val + (size_t)i * v_len;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < v_len; j++) m = xr[j] > m ? xr[j] : m;
        for (int j = 0; j < v_len; j++) {
            const double d = (xr[j] - m) * w[i];
            if (w[i] > 0.0f && d >= log(1e-12)) sum += exp(d);
        }
        want[i] = sum;
        tol[i] = 1e-5 * sum + 1e-30;
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    float *bits = case_alloc(s, (size_t)rows, sizeof(float));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor tw = arena_in(&a, "inv_temp", DTYPE_F32, S1(rows), w);
        struct tensor tm = arena_out(&a, "mass", DTYPE_F32, S1(rows), NULL, bits);
        if (SUPPORTED(&v, b, logit_mass)) op_logit_mass(b, &tm, &tx, &tw);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, DTYPE_F32, (size_t)rows);
    }
    check_close(s, &v, "mass", got, want, tol, (size_t)rows, 1);
    case_end(s, name, &v);
}

/* The nucleus's draw in double (op_logit_draw's top_p rows): the candidates within the floor sorted
 * by logit (ties by id), the cut where the running sum over the total reaches top_p, the first kept
 * token whose running sum exceeds u times theirs; *margin the smaller of the two decisions' margins. */
static const double *nucleus_key;
static int nucleus_order(const void *a, const void *b)
{
    const int i = *(const int *)a, j = *(const int *)b;
    if (nucleus_key[i] != nucleus_key[j]) return nucleus_key[i] > nucleus_key[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* *ties: the most candidates sharing one logit (the CUDA kernel gathers at most 2,048 of one bin). */
static int32_t ref_nucleus(const double *xr, int v, double t, double top_p, double u, int *order, double *margin,
                           int *ties)
{
    double m = -INFINITY, total = 0.0;
    for (int j = 0; j < v; j++) m = xr[j] > m ? xr[j] : m;
    int n = 0;
    for (int j = 0; j < v; j++)
        if (xr[j] >= m + t * -27.631021) order[n++] = j;
    nucleus_key = xr;
    qsort(order, (size_t)n, sizeof *order, nucleus_order);
    *ties = 0;
    for (int k = 0, run = 0; k < n; k++) {
        run = k > 0 && xr[order[k]] == xr[order[k - 1]] ? run + 1 : 1;
        *ties = run > *ties ? run : *ties;
    }
#define NUC_W(j) ((xr[j] - m) / t > -87.0 ? exp((xr[j] - m) / t) : 0.0)
    for (int k = 0; k < n; k++) total += NUC_W(order[k]);
    double acc = 0.0, cut_margin = 0.0;
    int keep = -1;
    for (int k = 0; k < n && keep < 0; k++) {
        const double before = acc;
        acc += NUC_W(order[k]);
        if (acc / total >= top_p) keep = k + 1, cut_margin = fmin(acc / total - top_p, top_p - before / total);
    }
    *margin = 0.0;
    if (keep < 0) return -1;
    const double goal = u * acc;
    double run = 0.0;
    for (int k = 0; k < keep; k++) {
        const double lo = run;
        run += NUC_W(order[k]);
        if (run > goal) {
            *margin = fmin(cut_margin, fmin(goal - lo, run - goal) / acc);
            return order[k];
        }
    }
#undef NUC_W
    return -1;
}

/* op_logit_draw (plain temperature sampling's draw on the device). Row i of kind i % 4 with
 * temperature t[i] and uniform u[i]: 0 N(0, 3); 1 around 1e4; 2 one token far above the rest (most
 * draws land in it: wide margins); 3 t = 0 (no draw: id -1, margin 0). The reference walks the
 * row in double (weights e^((x - m) / t), 0 at or below -87); where its target lies more than 2e-5
 * of the total inside its token, the op's token must be the reference's and its margin within 1e-5
 * (f32 weights against double ones); at least half the drawing rows must be such. nucleus: the
 * drawing rows are top_p rows (0.5, 0.9, 0.97 in turn; ref_nucleus), kind 1 wider (N(0, 1) around
 * 1e4, many tokens in its nucleus), checked where the reference's margin exceeds 2e-6, margins
 * within 1e-6. On CUDA a nucleus row may give -1 (margin 0: the host samples it) where more than
 * NUC_CAP_CUDA candidates share one logit (kind 1 in bf16 and f16, whose spacing at 1e4 is 64 and
 * 8: the whole row ties), as logit_mass.cu's kernel documents; such rows count as checked. */
#define NUC_CAP_CUDA 2048
static void case_logit_draw(struct suite *s, enum dtype dt, int rows, int v_len, int nucleus)
{
    char name[96];
    snprintf(name, sizeof name, "logit_draw %s rows=%d v=%d%s", dtype_name(dt), rows, v_len, nucleus ? " top_p" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)rows * v_len);
    float *t = case_alloc(s, (size_t)rows, sizeof(float)), *u = case_alloc(s, (size_t)rows, sizeof(float));
    int32_t *want_id = case_alloc(s, (size_t)rows, sizeof(int32_t));
    double *want_margin = case_alloc(s, (size_t)rows, sizeof(double));
    float *top_p = case_alloc(s, (size_t)rows, sizeof(float));
    int *order = case_alloc(s, (size_t)v_len, sizeof(int)), *ties = case_alloc(s, (size_t)rows, sizeof(int));
    for (int i = 0; i < rows; i++) {
        t[i] = i % 4 == 3 ? 0.0f : (float)rng_range(&r, 0.3, 2.0);
        u[i] = (float)rng_range(&r, 0.0, 1.0);
        top_p[i] = nucleus ? (i % 3 == 0 ? 0.5f : i % 3 == 1 ? 0.9f : 0.97f) : 1.0f;
        for (int j = 0; j < v_len; j++) {
            double val = i % 4 == 1 ? 1e4 + (nucleus ? 1.0 : 3.0) * rng_normal(&r) : 3.0 * rng_normal(&r);
            if (i % 4 == 2 && j == v_len / 3) val = 14.0;
            hbuf_set(&x, (size_t)i * v_len + j, val);
        }
        const double *xr = x.val + (size_t)i * v_len;
        if (nucleus && t[i] > 0.0f) {
            want_id[i] = ref_nucleus(xr, v_len, t[i], top_p[i], u[i], order, &want_margin[i], &ties[i]);
            continue;
        }
        double m = -INFINITY, total = 0.0, acc = 0.0;
        for (int j = 0; j < v_len; j++) m = xr[j] > m ? xr[j] : m;
        for (int j = 0; j < v_len; j++) total += (xr[j] - m) / t[i] > -87.0 ? exp((xr[j] - m) / t[i]) : 0.0;
        want_id[i] = -1, want_margin[i] = 0.0;
        const double target = (double)u[i] * total;
        for (int j = 0; t[i] > 0.0f && j < v_len; j++) {
            const double d = (xr[j] - m) / t[i], w = d > -87.0 ? exp(d) : 0.0, before = acc;
            if (w == 0.0) continue;
            acc += w;
            if (target < acc) {
                want_id[i] = j, want_margin[i] = fmin(target - before, acc - target) / total;
                break;
            }
        }
    }
    struct verdict v = {.worst_ratio = -1.0};
    int32_t *ids = case_alloc(s, (size_t)rows, sizeof(int32_t)), *got_d = case_alloc(s, (size_t)rows, sizeof(int32_t));
    int32_t *want_d = case_alloc(s, (size_t)rows, sizeof(int32_t));
    float *margin = case_alloc(s, (size_t)rows, sizeof(float));
    double *gm = case_alloc(s, (size_t)rows, sizeof(double)), *wm = case_alloc(s, (size_t)rows, sizeof(double));
    double *tol = case_alloc(s, (size_t)rows, sizeof(double));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor tt = arena_in(&a, "temp", DTYPE_F32, S1(rows), t);
        struct tensor tu = arena_in(&a, "u", DTYPE_F32, S1(rows), u);
        struct tensor tq = arena_in(&a, "top_p", DTYPE_F32, S1(rows), top_p);
        struct tensor ti = arena_out(&a, "ids", DTYPE_I32, S1(rows), NULL, ids);
        struct tensor tm = arena_out(&a, "margin", DTYPE_F32, S1(rows), NULL, margin);
        if (SUPPORTED(&v, b, logit_draw)) op_logit_draw(b, &ti, &tm, &tx, &tt, nucleus ? &tq : NULL, &tu);
        arena_finish(&a, &v);
        int n = 0, drawing = 0, undecided = 0;
        for (int i = 0; i < rows; i++) {
            if (t[i] > 0.0f) drawing++;
            if (nucleus && b->device == DEVICE_CUDA && t[i] > 0.0f && ties[i] > NUC_CAP_CUDA && ids[i] == -1 &&
                margin[i] == 0.0f) {
                undecided++; /* the kernel's documented way out: the host samples the row */
                continue;
            }
            /* too near an edge to ask for its token (a nucleus's cut lies within its cut token's
             * probability, 2e-5 among 49,152 tokens of about equal weight: closer bounds there) */
            if (t[i] > 0.0f && want_margin[i] <= (nucleus ? 2e-6 : 2e-5)) continue;
            got_d[n] = ids[i], want_d[n] = want_id[i];
            gm[n] = margin[i], wm[n] = want_margin[i], tol[n] = nucleus ? 1e-6 : 1e-5;
            n++;
        }
        if (2 * (n + undecided - (rows - drawing)) < drawing)
            verdict_fail(&v, "backend %d: only %d of %d draws far enough from an edge to check", bi,
                         n + undecided - (rows - drawing), drawing);
        compare_i32(&v, "ids", got_d, want_d, (size_t)n, 1);
        compare_close(&v, "margin", gm, wm, tol, 1.0, (size_t)n, 1);
    }
    case_end(s, name, &v);
}

/* op_logit_edit (a sampler's bias, bans and penalties on the device). Each row gets up to v / 3
 * entries at distinct ids, each a bias (some -inf: a ban), a repetition penalty, a subtraction or
 * several; the reference applies them in f32 in the sampler's order and rounds to x's dtype, as
 * the op must: exact (CUDA against the CPU too); the untouched elements stay as they were. */
static void case_logit_edit(struct suite *s, enum dtype dt, int rows, int v_len)
{
    char name[96];
    snprintf(name, sizeof name, "logit_edit %s rows=%d v=%d", dtype_name(dt), rows, v_len);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)rows * v_len);
    for (size_t i = 0; i < x.n; i++) hbuf_set(&x, i, 4.0 * rng_normal(&r));
    const int per = v_len / 3 > 0 ? v_len / 3 : 1, cap = rows * per;
    int32_t *er = case_alloc(s, (size_t)cap, sizeof(int32_t)), *ei = case_alloc(s, (size_t)cap, sizeof(int32_t));
    float *ev = case_alloc(s, 3 * (size_t)cap, sizeof(float));
    struct hbuf want = hbuf_make(s, dt, x.n);
    for (size_t i = 0; i < x.n; i++) hbuf_set(&want, i, x.val[i]);
    int n = 0;
    for (int i = 0; i < rows; i++) {
        const int k = (int)rng_range(&r, 0.0, (double)per + 0.99);
        const int step = v_len / (k + 1) > 0 ? v_len / (k + 1) : 1;
        for (int j = 0; j < k; j++, n++) {
            const int id = (j * step + i) % v_len; /* distinct in the row */
            const int kind = (int)rng_range(&r, 0.0, 5.99);
            float add = kind == 0 || kind == 3 ? (float)rng_range(&r, -5.0, 5.0) : 0.0f;
            if (kind == 4) add = -INFINITY;
            const float rep = kind == 1 || kind == 3 ? (float)rng_range(&r, 0.5, 2.0) : 1.0f;
            const float sub = kind == 2 || kind == 3 || kind == 5 ? (float)rng_range(&r, -2.0, 3.0) : 0.0f;
            er[n] = i, ei[n] = id, ev[3 * n] = add, ev[3 * n + 1] = rep, ev[3 * n + 2] = sub;
            float l = (float)x.val[(size_t)i * v_len + id];
            if (add != 0.0f) l += add;
            if (rep != 1.0f) l = l > 0 ? l / rep : l * rep;
            l -= sub;
            hbuf_set(&want, (size_t)i * v_len + id, l);
        }
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, x.n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_out(&a, "x", dt, S2(rows, v_len), x.bits, bits);
        struct tensor trow = arena_in(&a, "rows", DTYPE_I32, S1(n), er);
        struct tensor tid = arena_in(&a, "ids", DTYPE_I32, S1(n), ei);
        struct tensor tv = arena_in(&a, "vals", DTYPE_F32, S2(n, 3), ev);
        if (SUPPORTED(&v, b, logit_edit)) op_logit_edit(b, &tx, &trow, &tid, &tv);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, x.n);
    }
    check_exact(s, &v, "x", got, want.val, x.n, (size_t)v_len, 1);
    case_end(s, name, &v);
}

/* op_logit_lse (log-probabilities' normaliser on the device). Row i of kind i % 3: 0 N(0, 3); 1
 * around 1e4; 2 not wanted (0). The reference: log of the double sum of e^(x - m); within 1e-6 of
 * the larger of 1 and |lse| (the weights' f32 rounding, the f32 result). */
static void case_logit_lse(struct suite *s, enum dtype dt, int rows, int v_len)
{
    char name[96];
    snprintf(name, sizeof name, "logit_lse %s rows=%d v=%d", dtype_name(dt), rows, v_len);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct hbuf x = hbuf_make(s, dt, (size_t)rows * v_len);
    float *want = case_alloc(s, (size_t)rows, sizeof(float));
    double *ref = case_alloc(s, (size_t)rows, sizeof(double)), *tol = case_alloc(s, (size_t)rows, sizeof(double));
    for (int i = 0; i < rows; i++) {
        want[i] = i % 3 == 2 ? 0.0f : 1.0f;
        for (int j = 0; j < v_len; j++)
            hbuf_set(&x, (size_t)i * v_len + j, i % 3 == 1 ? 1e4 + 3.0 * rng_normal(&r) : 3.0 * rng_normal(&r));
        const double *xr = x.val + (size_t)i * v_len;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < v_len; j++) m = xr[j] > m ? xr[j] : m;
        for (int j = 0; j < v_len; j++) sum += exp(xr[j] - m);
        ref[i] = want[i] > 0.0f ? log(sum) : 0.0;
        tol[i] = 1e-6 * (fabs(ref[i]) > 1.0 ? fabs(ref[i]) : 1.0);
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    float *bits = case_alloc(s, (size_t)rows, sizeof(float));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_in(&a, "x", dt, S2(rows, v_len), x.bits);
        struct tensor tw = arena_in(&a, "want", DTYPE_F32, S1(rows), want);
        struct tensor tl = arena_out(&a, "lse", DTYPE_F32, S1(rows), NULL, bits);
        if (SUPPORTED(&v, b, logit_lse)) op_logit_lse(b, &tl, &tx, &tw);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, DTYPE_F32, (size_t)rows);
    }
    check_close(s, &v, "lse", got, ref, tol, (size_t)rows, 1);
    case_end(s, name, &v);
}

/* op_logit_mask (a constraint's masks on the device): every other row masked by random bits (one
 * row's mask all ones, one all zeros, the last word's unused bits set); exact. */
static void case_logit_mask(struct suite *s, enum dtype dt, int rows, int v_len)
{
    char name[96];
    snprintf(name, sizeof name, "logit_mask %s rows=%d v=%d", dtype_name(dt), rows, v_len);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const int words = (v_len + 31) / 32, m = (rows + 1) / 2;
    struct hbuf x = hbuf_make(s, dt, (size_t)rows * v_len), want = hbuf_make(s, dt, (size_t)rows * v_len);
    for (size_t i = 0; i < x.n; i++) hbuf_set(&x, i, 3.0 * rng_normal(&r));
    for (size_t i = 0; i < x.n; i++) hbuf_set(&want, i, x.val[i]);
    int32_t *mr = case_alloc(s, (size_t)m, sizeof(int32_t));
    uint32_t *mask = case_alloc(s, (size_t)m * words, sizeof(uint32_t));
    for (int k = 0; k < m; k++) {
        mr[k] = rows - 1 - 2 * k;
        for (int w = 0; w < words; w++)
            mask[(size_t)k * words + w] = k == 0 ? 0xffffffffu : k == 1 ? 0u
                                        : (uint32_t)(rng_range(&r, 0.0, 65535.99)) << 16 | (uint32_t)rng_range(&r, 0.0, 65535.99);
        for (int j = 0; j < v_len; j++)
            if (!(mask[(size_t)k * words + (j >> 5)] >> (j & 31) & 1))
                hbuf_set(&want, (size_t)mr[k] * v_len + j, -INFINITY);
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, x.n, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = arena_out(&a, "x", dt, S2(rows, v_len), x.bits, bits);
        struct tensor trow = arena_in(&a, "rows", DTYPE_I32, S1(m), mr);
        struct tensor tm = arena_in(&a, "mask", DTYPE_I32, S2(m, words), mask);
        if (SUPPORTED(&v, b, logit_mask)) op_logit_mask(b, &tx, &trow, &tm);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, x.n);
    }
    check_exact(s, &v, "x", got, want.val, x.n, (size_t)v_len, 1);
    case_end(s, name, &v);
}

/* ==== the case list ========================================================================= */

static void run_all(struct suite *s)
{
    static const enum dtype all_dtypes[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    static const enum activation acts[3] = {ACTIVATION_SILU, ACTIVATION_GELU_TANH,
                                            ACTIVATION_GELU_ERF};

    case_host_convert(s);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) {
            case_cast(s, all_dtypes[i], all_dtypes[j], 1);
            case_cast(s, all_dtypes[i], all_dtypes[j], 33);
            case_cast(s, all_dtypes[i], all_dtypes[j], 1031);
        }
    /* Sizes past the CPU backend's threshold for splitting elementwise work across threads
     * (32768 elements), and not a multiple of any plausible chunk: the parallel paths. */
    case_cast(s, DTYPE_F32, DTYPE_BF16, 100003);
    case_cast(s, DTYPE_F32, DTYPE_F16, 100003);
    case_cast(s, DTYPE_F16, DTYPE_F32, 100003);

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_embedding(s, dt, 1, 64, 100, 0);
        case_embedding(s, dt, 17, 67, 33, 0);
        case_embedding(s, dt, 33, 129, 50, 1000);
        case_embedding(s, dt, 5, 1, 7, 3);
        case_embedding(s, dt, 0, 16, 8, 0);
        case_position_embedding_add(s, dt, 1, 64, 16);
        case_position_embedding_add(s, dt, 17, 67, 33);
        case_position_embedding_add(s, dt, 33, 129, 1024);
        case_embedding(s, dt, 300, 129, 77, 40);
        case_position_embedding_add(s, dt, 300, 129, 301);
    }

    static const int mm[][3] = {
        {1, 1, 1},    {1, 67, 33},   {3, 17, 129}, {17, 33, 67},   {33, 129, 1},
        {1, 1024, 129}, {64, 128, 96}, {7, 256, 688}, {2, 4096, 17}, {0, 16, 8},
        /* one row (the gemv) with k past each of its vector loops: 17, 40, 95, 240 */
        {1, 17, 9},   {1, 40, 31},   {1, 95, 13},  {1, 240, 40},
        /* CUDA's own decode product (16-bit, m <= 8, k a multiple of 8): each row count */
        {8, 64, 24},  {4, 2048, 40}, {5, 8, 3},    {1, 8, 1},    {6, 136, 9},  {3, 1024, 300},
        /* ... with 2 and 4 warps per feature and a last thread block short of features */
        {2, 512, 77}, {7, 1024, 301},
    };
    for (int di = 0; di < 3; di++)
        for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
            for (int bias = 0; bias <= 1; bias++)
                case_matmul(s, float_dtypes[di], mm[i][0], mm[i][1], mm[i][2], bias);
    /* q, k, v-like and gate, up-like groups: decode rows (CUDA's one launch), a row count past
     * the gemv's (cuBLAS each), and k not a multiple of 8 (no gemv). */
    static const int mm_many[][5] = {{1, 256, 64, 16, 16}, {4, 512, 96, 32, 32}, {2, 64, 300, 300, 8},
                                     {8, 128, 40, 8, 24},  {9, 64, 32, 16, 16}, {1, 36, 16, 8, 8}};
    for (int di = 0; di < 3; di++)
        for (size_t i = 0; i < sizeof mm_many / sizeof mm_many[0]; i++)
            case_matmul_many(s, float_dtypes[di], mm_many[i][0], mm_many[i][1], &mm_many[i][2]);

    static const int norm_shapes[][2] = {{1, 1},  {3, 17},   {17, 33},  {1, 4096}, {5, 67},
                                         {3, 768}, {0, 16}, {2, 8192}, {2, 2048}, {1, 8200}};
    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        for (size_t i = 0; i < sizeof norm_shapes / sizeof norm_shapes[0]; i++) {
            int n = norm_shapes[i][0], d = norm_shapes[i][1];
            case_rmsnorm(s, dt, n, d, 1e-5, (int)i % 2, 1.0);
            case_layernorm(s, dt, n, d, 1e-5, 0, 0);
            case_layernorm(s, dt, n, d, 1e-5, 1, (int)i % 2);
        }
        case_rmsnorm(s, dt, 4, 129, 1e-6, 1, 1.0);
        case_rmsnorm(s, dt, 3, 67, 1e-6, 0, 100.0);
        case_layernorm(s, dt, 4, 129, 1e-6, 1, 1);
        case_rmsnorm(s, dt, 64, 769, 1e-5, 0, 1.0);
        case_layernorm(s, dt, 64, 769, 1e-5, 1, 0);
        for (int alias = 0; alias < 3; alias++) {
            case_add_rmsnorm(s, dt, 5, 2048, alias);
            case_add_rmsnorm(s, dt, 3, 67, alias);
        }
        case_add_rmsnorm(s, dt, 64, 576, 0);
    }

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        static const int sizes[] = {1, 17, 4099, 100003};
        for (int i = 0; i < 4; i++) {
            for (int alias = 0; alias <= 2; alias++) case_add(s, dt, sizes[i], alias);
            case_map(s, OP_SCALE, dt, sizes[i], i == 0 ? 0.5f : -3.7f, 0);
            case_map(s, OP_SCALE, dt, sizes[i], i == 2 ? 1e-3f : 1.0f / 3.0f, 1);
            case_map(s, OP_SOFTCAP, dt, sizes[i], i == 0 ? 30.0f : 2.5f, i == 1);
        }
        case_scatter_add_rows(s, dt, 5, 37, 12);
        case_scatter_add_rows(s, dt, 64, 256, 300);
    }

    for (int di = 0; di < 3; di++) {
        enum dtype dt = float_dtypes[di];
        case_rope(s, dt, 1, 8, 128, 128, 10000.0f, ROPE_STYLE_PAIRS, 2047, 0);
        case_rope(s, dt, 3, 8, 128, 128, 10000.0f, ROPE_STYLE_HALVES, 2047, 0);
        case_rope(s, dt, 17, 4, 64, 32, 500000.0f, ROPE_STYLE_HALVES, 4095, 0);
        case_rope(s, dt, 5, 2, 80, 80, 10000.0f, ROPE_STYLE_PAIRS, 300, 0);
        case_rope(s, dt, 5, 2, 80, 24, 1000000.0f, ROPE_STYLE_HALVES, 300, 0);
        case_rope(s, dt, 4, 3, 8, 8, 10.0f, ROPE_STYLE_PAIRS, 100, 0);
        case_rope(s, dt, 4, 3, 16, 2, 10000.0f, ROPE_STYLE_HALVES, 100, 0);
        case_rope(s, dt, 3, 2, 64, 64, 10000.0f, ROPE_STYLE_PAIRS, 32767, 0);
        case_rope(s, dt, 3, 2, 64, 48, 10000.0f, ROPE_STYLE_HALVES, 32767, 0);
        case_rope_qk(s, dt, 1, 32, 8, 64, 64, ROPE_STYLE_HALVES); /* a decode row of the 1B shape */
        case_rope_qk(s, dt, 7, 4, 1, 128, 96, ROPE_STYLE_PAIRS);
        case_rope_qk(s, dt, 300, 8, 2, 64, 64, ROPE_STYLE_HALVES); /* prefill rows: one thread per pair */
        case_rope(s, dt, 5, 2, 64, 64, 500000.0f, ROPE_STYLE_HALVES, 8191, 1);
        case_rope(s, dt, 4, 3, 80, 24, 10000.0f, ROPE_STYLE_PAIRS, 300, 1);
        case_rope(s, dt, 40, 8, 128, 128, 10000.0f, ROPE_STYLE_HALVES, 4095, 0);
    }

    run_attention_cases(s); /* kv_write and attention: test_ops_attention.c */

    for (int di = 0; di < 3; di++)
        for (int ai = 0; ai < 3; ai++) {
            case_activation(s, float_dtypes[di], acts[ai], 1, 0);
            case_activation(s, float_dtypes[di], acts[ai], 67, 1);
            case_activation(s, float_dtypes[di], acts[ai], 1029, 0);
            case_gated_activation(s, float_dtypes[di], acts[ai], 1, 1, 0);
            case_gated_activation(s, float_dtypes[di], acts[ai], 3, 67, 1);
            case_gated_activation(s, float_dtypes[di], acts[ai], 2, 688, 2);
            case_activation(s, float_dtypes[di], acts[ai], 40009, ai % 2);
            case_gated_activation(s, float_dtypes[di], acts[ai], 8, 5003, ai % 3);
        }
    /* GPT-OSS's clamped SwiGLU is gated only (op_activation refuses it). */
    for (int di = 0; di < 3; di++) {
        case_gated_activation(s, float_dtypes[di], ACTIVATION_SWIGLU_OAI, 1, 1, 0);
        case_oai_nan(s, float_dtypes[di]);
        case_gated_activation(s, float_dtypes[di], ACTIVATION_SWIGLU_OAI, 3, 67, 1);
        case_gated_activation(s, float_dtypes[di], ACTIVATION_SWIGLU_OAI, 2, 688, 2);
        case_gated_activation(s, float_dtypes[di], ACTIVATION_SWIGLU_OAI, 8, 5003, 0);
    }

    static const int sm[][2] = {{1, 1}, {5, 3}, {5, 17}, {5, 129}, {5, 1000}, {2, 32003}};
    for (int di = 0; di < 3; di++)
        for (int log_out = 0; log_out <= 1; log_out++)
            for (size_t i = 0; i < sizeof sm / sizeof sm[0]; i++)
                case_softmax(s, float_dtypes[di], log_out, sm[i][0], sm[i][1], (int)i % 2);

    static const int am[] = {1, 3, 17, 33, 129, 1000, 32003};
    static const int tk[][3] = {{4, 1, 1}, {4, 3, 1}, {4, 3, 3}, {4, 17, 5}, {4, 67, 67},
                                {4, 129, 10}, {4, 1000, 40}, {2, 32003, 50},
                                {4, 10007, 100}};
    for (int di = 0; di < 3; di++) {
        for (size_t i = 0; i < sizeof am / sizeof am[0]; i++)
            case_argmax(s, float_dtypes[di], 8, am[i]);
        for (size_t i = 0; i < sizeof tk / sizeof tk[0]; i++)
            case_topk(s, float_dtypes[di], tk[i][0], tk[i][1], tk[i][2]);
        case_logit_mass(s, float_dtypes[di], 8, 1000);
        case_logit_mass(s, float_dtypes[di], 4, 49152);
        case_logit_draw(s, float_dtypes[di], 64, 1000, 0);
        case_logit_draw(s, float_dtypes[di], 8, 49152, 0);
        case_logit_draw(s, float_dtypes[di], 64, 1000, 1);
        case_logit_draw(s, float_dtypes[di], 8, 49152, 1);
        case_logit_edit(s, float_dtypes[di], 1, 1);
        case_logit_edit(s, float_dtypes[di], 16, 1000);
        case_logit_lse(s, float_dtypes[di], 9, 1001);
        case_logit_mask(s, float_dtypes[di], 7, 1000);
        case_logit_lse(s, float_dtypes[di], 3, 49152);
    }
}

int main(int argc, char **argv)
{
    return suite_main(argc, argv, "test_ops", "ops_cuda", run_all);
}
