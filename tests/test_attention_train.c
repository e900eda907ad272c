/* tests/test_attention_train.c - op_attention_train and op_attention_train_backward (training
 * attention over packed documents, kernels/ops.h), in every float dtype, on odd shapes: row
 * counts that are not multiples of 32, head_dim 8 to 256, one-row and empty documents, several
 * documents packed in one batch, multi-head, grouped-query (4:1) and multi-query heads, sliding
 * windows (1, inside a document, wider than it), and bidirectional documents (an encoder's
 * attention: forward only).
 *
 * Each case draws q, k, v and dout in double, rounds them to the storage dtype, and runs a plain
 * double-precision reference on the rounded values, written here from the definitions (softmax
 * over the attended keys, and the gradients by the chain rule), not from any backend's code:
 * - forward: out and lse against the reference; the same rows written to a paged KV cache with
 *   op_kv_write and run through op_attention (serving's attention) must give the same out, which
 *   ties training to serving;
 * - backward: dq, dk, dv against the analytic reference, given the reference's out (rounded to
 *   the dtype) and lse (rounded to f32), so that every backend sees identical inputs; and, on a
 *   sample of elements, against central finite differences of the double forward;
 * - "reference" cases check the analytic double reference itself against central finite
 *   differences (all elements of small cases, a sample of larger ones);
 * - --backend cuda: the same cases on CUDA, compared with the double reference and with the CPU
 *   backend on identical inputs. Prints "SKIP: attention_train_cuda: ..." and exits 77 when
 *   the build has no CUDA backend or the machine has no GPU.
 * As in tests/test_ops.c: every device buffer sits between guard bytes that must come back
 * untouched, every input must come back unchanged, every output starts as NaN (an element never
 * written is caught), every output is checked for NaN/Inf, and an empty backend slot is a
 * failure, never a pass (that harness is tests/op_check.c, shared with test_ops.c and
 * test_ops_backward.c). The backward also runs twice and must give the same bits (the ops
 * promise results that do not depend on timing).
 *
 * Tolerances. An element passes when |got - want| <= u |want| + (1 + u) (4 U32 |want| + U32 mag)
 * + floor, with u and floor the storage rounding of the output dtype (as in test_ops.c) and mag
 * an error magnitude, in units of U32, that the reference computes alongside each value from
 * the error sources of f32 arithmetic:
 * - a score s_ij = scale q_i . k_j: a dot product of length D, 2 sqrt(D) scale sum_d |q k|
 *   (probabilistic bound, as for matmul in test_ops.c), plus |s| for rounding scale * q;
 * - a probability P_ij = exp(s_ij - lse_i): the score error, |lse| (lse is rounded to f32),
 *   |s - lse| and a few more for exp: E_ij = 2 sqrt(D) scale sum|q k| + |s| + |lse| + |s - lse|
 *   + 4 (relative);
 * - dP_ij = dout_i . v_j and D_i = dout_i . out_i: 2 sqrt(D) sum_d |dout v| and
 *   (2 sqrt(D) + u_out / U32) sum_d |dout out|, where u_out is the storage rounding of out (the
 *   backward reads out as stored, as FlashAttention does);
 * - dS_ij = P_ij (dP_ij - D_i): P (|dP - D| E + the two above) + 2 |dS|;
 * - each sum over c terms adds (2 sqrt(c) + 2) times the sum of the absolute terms.
 * Forward: mag(out) = 4 sum_j P_j |v_j| (4 + 2 sqrt(c) + 2 sqrt(D) scale max_j sum|q k|) as in
 * test_ops.c, mag(lse) = 4 (4 + 2 sqrt(c) + 2 sqrt(D) scale max_j sum|q k| + |max s| + |lse|).
 * Backward: mag(dv_j) = 2 sum_i P_ij |dout_i| (E_ij + 2 sqrt(c) + 2), mag(dq_i) = 2 scale
 * sum_j |k_j| (err(dS_ij) + (2 sqrt(c) + 2) |dS_ij|), and mag(dk_j) likewise with |q_i|.
 * Where CUDA's tensor-core form runs (ops.h; SHARDLM_CUDA_TRAIN_ATTENTION), P and dS are
 * rounded to the 16-bit dtype u before their second product: mag(out) gains 2 (u / U32)
 * sum_j P_j |v_j|, mag(dv_j) 2 (u / U32) sum_i P_ij |dout_i|, mag(dq_i) and mag(dk_j)
 * 2 (u / U32) scale sum |dS_ij| |k_j| (|q_i|).
 * A CUDA result must also be within twice the bound of the CPU result (each may sit on either
 * side of the reference); the paged forward within twice the bound of the training forward.
 * Finite differences: h = 1e-5, whose truncation and rounding errors (about 1e-9 here) sit far
 * below the bound of 1e-6 (|g| + max |g| of the tensor).
 *
 * Run:  test_attention_train --backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N]
 * Each case prints "ok" with its name and worst err/tol ratio, or "FAIL" with its name and every
 * failed check indented below; the last line is "N passed, M failed". Exit status: 0 all
 * passed, 1 a failure, 2 bad usage, 77 skipped. Inputs are drawn from the seed and the case's
 * name, so --filter reproduces a case exactly. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"

#define REL_TOL (4 * U32)
#define FD_STEP 1e-5
#define FD_TOL 1e-6
#define FD_SAMPLES 40 /* elements per tensor checked by finite differences, beyond small cases */

/* tol[i] for an output of dtype t from the reference's want and mag (units of U32). */
static void make_tol(double *tol, enum dtype t, const double *want, const double *mag, size_t n)
{
    const struct storage_rounding *sr = &storage_rounding[t];
    for (size_t i = 0; i < n; i++) {
        double w = fabs(want[i]);
        tol[i] = sr->u * w + (1.0 + sr->u) * (REL_TOL * w + U32 * mag[i]) + sr->floor;
    }
}

/* ==== the double-precision reference ========================================================= */

/* One case on the host: the packed documents and the exact values of the rounded inputs. */
struct problem {
    int      n, H, Hk, D, G, window, n_docs;
    int      bidir;     /* bidirectional: every row attends to its whole document */
    double   scale;
    int32_t *doc_start; /* (n_docs + 1) */
    int     *doc_of;    /* (n): the document of each row */
    double  *q, *dout;  /* (n, H, D) */
    double  *k, *v;     /* (n, Hk, D) */
    double  *sinks;     /* (H): attention sinks (GPT-OSS), exact f32 values; NULL: none */
    double   u_tc;      /* CUDA's tensor-core form runs (ops.h): the unit roundoff of the
                           probabilities and dS it rounds, in units of U32; 0 otherwise */
};

/* p->u_tc for a case of dtype dt on the suite's backends: the CUDA backend takes the tensor-core
 * form for bf16 and f16 at head_dim 32, 64 and 128 where SHARDLM_CUDA_TRAIN_ATTENTION (or its
 * default) says so, and at 96 when it is forced (=tc). The bound it adds applies to the CPU results of that run as well. */
static double tc_roundoff(const struct suite *s, enum dtype dt, int head_dim)
{
    const char *e = getenv("SHARDLM_CUDA_TRAIN_ATTENTION");
    const int forced = e && !strcmp(e, "tc");
    const int tc = e && *e && strcmp(e, "auto") ? forced : CUDA_TRAIN_ATTENTION_TC_DEFAULT;
    const int cuda = s->n_backends > 1;
    const int fits = head_dim == 32 || head_dim == 64 || head_dim == 128 || (head_dim == 96 && forced);
    return tc && cuda && fits && dt != DTYPE_F32 ? storage_rounding[dt].u / U32 : 0.0;
}

/* The first key that row i attends to, and one past the last row that attends to key j. */
static int ref_lo(const struct problem *p, int i)
{
    int begin = p->doc_start[p->doc_of[i]];
    return p->window > 0 && i - p->window + 1 > begin ? i - p->window + 1 : begin;
}

/* The last key that row i attends to: itself, or its document's last row (bidirectional). */
static int ref_hi(const struct problem *p, int i) { return p->bidir ? p->doc_start[p->doc_of[i] + 1] - 1 : i; }

static int ref_key_end(const struct problem *p, int j)
{
    int end = p->doc_start[p->doc_of[j] + 1];
    return p->window > 0 && j + p->window < end ? j + p->window : end;
}

static size_t qi(const struct problem *p, int i, int h) { return ((size_t)i * p->H + h) * p->D; }
static size_t ki(const struct problem *p, int j, int kvh) { return ((size_t)j * p->Hk + kvh) * p->D; }

/* Softmax of row i, head h over its keys lo .. hi (and the head's sink, a score with no value,
 * when the case has sinks): prob[j - lo], the scores' max (the sink's included), lse, and
 * A = max_j sum_d |q_d k_jd|. Returns the number of keys. */
static int ref_probs(const struct problem *p, int i, int h, double *prob, double *score,
                     double *smax, double *lse, double *amax)
{
    int lo = ref_lo(p, i), hi = ref_hi(p, i), kvh = h / p->G;
    const double *qv = p->q + qi(p, i, h);
    double m = -INFINITY, a_max = 0.0;
    for (int j = lo; j <= hi; j++) {
        const double *kv = p->k + ki(p, j, kvh);
        double dot = 0.0, a = 0.0;
        for (int d = 0; d < p->D; d++) {
            dot += qv[d] * kv[d];
            a += fabs(qv[d] * kv[d]);
        }
        score[j - lo] = p->scale * dot;
        if (score[j - lo] > m) m = score[j - lo];
        if (a > a_max) a_max = a;
    }
    if (p->sinks && p->sinks[h] > m) m = p->sinks[h];
    double sum = p->sinks ? exp(p->sinks[h] - m) : 0.0;
    for (int j = lo; j <= hi; j++) sum += exp(score[j - lo] - m);
    for (int j = lo; j <= hi; j++) prob[j - lo] = exp(score[j - lo] - m) / sum;
    *smax = m;
    *lse = m + log(sum);
    *amax = a_max;
    return hi - lo + 1;
}

/* out (n, H, D), lse (n, H), and their error magnitudes (see the top of the file). */
static void ref_forward(const struct problem *p, double *out, double *lse, double *mag_out,
                        double *mag_lse)
{
    double *prob = xcalloc((size_t)p->n + 1, sizeof(double));
    double *score = xcalloc((size_t)p->n + 1, sizeof(double));
    for (int i = 0; i < p->n; i++)
        for (int h = 0; h < p->H; h++) {
            double m, l, amax;
            int lo = ref_lo(p, i), c = ref_probs(p, i, h, prob, score, &m, &l, &amax);
            double factor = 4.0 + 2.0 * sqrt((double)c) + 2.0 * sqrt((double)p->D) * p->scale * amax;
            for (int d = 0; d < p->D; d++) {
                double o = 0.0, o_abs = 0.0;
                for (int j = lo; j <= ref_hi(p, i); j++) {
                    double vv = p->v[ki(p, j, h / p->G) + d];
                    o += prob[j - lo] * vv;
                    o_abs += prob[j - lo] * fabs(vv);
                }
                out[qi(p, i, h) + d] = o;
                mag_out[qi(p, i, h) + d] = 4.0 * o_abs * factor + 2.0 * p->u_tc * o_abs;
            }
            lse[(size_t)i * p->H + h] = l;
            mag_lse[(size_t)i * p->H + h] = 4.0 * (factor + fabs(m) + fabs(l));
        }
    free(prob);
    free(score);
}

/* L = sum over rows i0 .. i1-1 and heads h0 .. h1-1 of dout . out: the part of the loss that
 * a perturbation of one element can change (finite differences). */
static double ref_loss_part(const struct problem *p, int i0, int i1, int h0, int h1)
{
    double *prob = xcalloc((size_t)p->n + 1, sizeof(double));
    double *score = xcalloc((size_t)p->n + 1, sizeof(double));
    double loss = 0.0;
    for (int i = i0; i < i1; i++)
        for (int h = h0; h < h1; h++) {
            double m, l, amax;
            int lo = ref_lo(p, i);
            ref_probs(p, i, h, prob, score, &m, &l, &amax);
            for (int d = 0; d < p->D; d++) {
                double o = 0.0;
                for (int j = lo; j <= ref_hi(p, i); j++) o += prob[j - lo] * p->v[ki(p, j, h / p->G) + d];
                loss += p->dout[qi(p, i, h) + d] * o;
            }
        }
    free(prob);
    free(score);
    return loss;
}

/* The analytic gradients of L = sum dout . out by the chain rule through the softmax:
 * P_ij, dP_ij = dout_i . v_j, dS_ij = P_ij (dP_ij - sum_j' P_ij' dP_ij'), dq_i = scale sum_j
 * dS_ij k_j, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dout_i (sums over the query heads
 * of a group for dk and dv). With sinks, dsinks_h = -sum_i P_sink,i D_i (P_sink,i =
 * exp(S_h - lse_i), D_i = sum_j P_ij dP_ij), and mag_dsinks_h = 2 sum_i P_sink,i (|D_i| (E_i +
 * 2 sqrt(n) + 2) + (2 sqrt(D) + u_out) C_i), E_i as for a probability; dsinks and mag_dsinks may
 * be NULL without sinks. Error magnitudes as at the top of the file; u_out is the storage
 * rounding of out, in units of U32. */
static void ref_backward(const struct problem *p, double u_out, double *dq, double *dk,
                         double *dv, double *mag_dq, double *mag_dk, double *mag_dv, double *dsinks,
                         double *mag_dsinks)
{
    size_t nq = (size_t)p->n * p->H * p->D, nk = (size_t)p->n * p->Hk * p->D;
    memset(dq, 0, nq * sizeof(double));
    memset(dk, 0, nk * sizeof(double));
    memset(dv, 0, nk * sizeof(double));
    memset(mag_dq, 0, nq * sizeof(double));
    memset(mag_dk, 0, nk * sizeof(double));
    memset(mag_dv, 0, nk * sizeof(double));
    for (int h = 0; p->sinks && h < p->H; h++) dsinks[h] = mag_dsinks[h] = 0.0;
    double *prob = xcalloc((size_t)p->n + 1, sizeof(double));
    double *score = xcalloc((size_t)p->n + 1, sizeof(double));
    double *dp = xcalloc((size_t)p->n + 1, sizeof(double));
    double *edp = xcalloc((size_t)p->n + 1, sizeof(double));
    double *out = xcalloc((size_t)p->D, sizeof(double));
    const double sd = sqrt((double)p->D);
    for (int i = 0; i < p->n; i++)
        for (int h = 0; h < p->H; h++) {
            const int kvh = h / p->G, lo = ref_lo(p, i);
            const double *qv = p->q + qi(p, i, h), *dov = p->dout + qi(p, i, h);
            double m, lse, amax;
            const int c = ref_probs(p, i, h, prob, score, &m, &lse, &amax);
            double Di = 0.0, Ci = 0.0;
            for (int d = 0; d < p->D; d++) out[d] = 0.0;
            for (int j = lo; j <= i; j++) {
                const double *vv = p->v + ki(p, j, kvh);
                double s = 0.0, b = 0.0;
                for (int d = 0; d < p->D; d++) {
                    s += dov[d] * vv[d];
                    b += fabs(dov[d] * vv[d]);
                    out[d] += prob[j - lo] * vv[d];
                }
                dp[j - lo] = s;
                edp[j - lo] = 2.0 * sd * b;
                Di += prob[j - lo] * s;
            }
            for (int d = 0; d < p->D; d++) Ci += fabs(dov[d] * out[d]);
            if (p->sinks) {
                const double Ps = exp(p->sinks[h] - lse);
                const double Es = fabs(p->sinks[h]) + fabs(lse) + fabs(p->sinks[h] - lse) + 4.0;
                dsinks[h] -= Ps * Di;
                mag_dsinks[h] += 2.0 * Ps * (fabs(Di) * (Es + 2.0 * sqrt((double)p->n) + 2.0) + (2.0 * sd + u_out) * Ci);
            }
            for (int j = lo; j <= i; j++) {
                const double *kv = p->k + ki(p, j, kvh);
                const double P = prob[j - lo], dS = P * (dp[j - lo] - Di);
                double a = 0.0;
                for (int d = 0; d < p->D; d++) a += fabs(qv[d] * kv[d]);
                const double E = 2.0 * sd * p->scale * a + fabs(score[j - lo]) + fabs(lse) +
                                 fabs(score[j - lo] - lse) + 4.0;
                const double e_ds = P * (fabs(dp[j - lo] - Di) * E + edp[j - lo] + (2.0 * sd + u_out) * Ci) +
                                    2.0 * fabs(dS);
                const int ck = (ref_key_end(p, j) - j) * p->G; /* terms summed into dk_j, dv_j */
                const double sum_q = 2.0 * sqrt((double)c) + 2.0, sum_k = 2.0 * sqrt((double)ck) + 2.0;
                for (int d = 0; d < p->D; d++) {
                    dq[qi(p, i, h) + d] += p->scale * dS * kv[d];
                    mag_dq[qi(p, i, h) + d] += 2.0 * p->scale * fabs(kv[d]) * (e_ds + (sum_q + p->u_tc) * fabs(dS));
                    dk[ki(p, j, kvh) + d] += p->scale * dS * qv[d];
                    mag_dk[ki(p, j, kvh) + d] += 2.0 * p->scale * fabs(qv[d]) * (e_ds + (sum_k + p->u_tc) * fabs(dS));
                    dv[ki(p, j, kvh) + d] += P * dov[d];
                    mag_dv[ki(p, j, kvh) + d] += 2.0 * P * fabs(dov[d]) * (E + sum_k + p->u_tc);
                }
            }
        }
    free(prob);
    free(score);
    free(dp);
    free(edp);
    free(out);
}

/* Central finite difference of L with respect to element e of x (one of q, k, v, sinks), from
 * the rows and heads that element reaches. */
static double ref_fd(struct problem *p, double *x, size_t e)
{
    int i0, i1, h0, h1;
    if (x == p->sinks) { /* a head's sink joins every row's softmax */
        i0 = 0;
        i1 = p->n;
        h0 = (int)e;
        h1 = h0 + 1;
    } else if (x == p->q) {
        i0 = (int)(e / ((size_t)p->H * p->D));
        i1 = i0 + 1;
        h0 = (int)(e / p->D % p->H);
        h1 = h0 + 1;
    } else {
        int j = (int)(e / ((size_t)p->Hk * p->D)), kvh = (int)(e / p->D % p->Hk);
        i0 = j;
        i1 = ref_key_end(p, j);
        h0 = kvh * p->G;
        h1 = h0 + p->G;
    }
    const double x0 = x[e];
    x[e] = x0 + FD_STEP;
    double up = ref_loss_part(p, i0, i1, h0, h1);
    x[e] = x0 - FD_STEP;
    double down = ref_loss_part(p, i0, i1, h0, h1);
    x[e] = x0;
    return (up - down) / (2.0 * FD_STEP);
}

/* Elements of an m-element tensor to check by finite differences: all of a small one;
 * otherwise the first and last, and FD_SAMPLES - 2 drawn at random. Returns the count. */
static int fd_sample(struct rng *r, size_t m, size_t *idx)
{
    if (m == 0) return 0;
    if (m <= FD_SAMPLES) {
        for (size_t i = 0; i < m; i++) idx[i] = i;
        return (int)m;
    }
    idx[0] = 0;
    idx[1] = m - 1;
    for (int i = 2; i < FD_SAMPLES; i++) idx[i] = (size_t)(rng_next(r) % m);
    return FD_SAMPLES;
}

/* ==== cases ================================================================================= */

struct train_spec {
    const char *label;
    int         n_heads, n_kv_heads, head_dim, window;
    double      scale; /* 0: 1 / sqrt(head_dim) */
    int         n_docs;
    int         doc_len[8];
    int         bidirectional; /* forward only: the backward is not built for it */
    int         sinks;         /* 1: one attention sink per query head (GPT-OSS) */
};

/* Draws the case's inputs, rounded to dt. Queries in [-2, 2] give scores of standard deviation
 * about 1 at scale 1/sqrt(D); dout, k, v in [-1, 1]. */
static struct problem make_problem(struct suite *s, const struct train_spec *sp, enum dtype dt,
                                   struct rng *r, void **q_bits, void **k_bits, void **v_bits,
                                   void **dout_bits)
{
    struct problem p = {.H = sp->n_heads, .Hk = sp->n_kv_heads, .D = sp->head_dim,
                        .window = sp->window, .n_docs = sp->n_docs, .bidir = sp->bidirectional};
    p.G = p.H / p.Hk;
    p.scale = (double)(sp->scale > 0 ? (float)sp->scale : 1.0f / sqrtf((float)p.D));
    p.doc_start = case_alloc(s, (size_t)p.n_docs + 1, sizeof(int32_t));
    for (int d = 0; d < p.n_docs; d++) p.doc_start[d + 1] = p.doc_start[d] + sp->doc_len[d];
    p.n = p.doc_start[p.n_docs];
    p.doc_of = case_alloc(s, (size_t)p.n + 1, sizeof(int));
    for (int d = 0; d < p.n_docs; d++)
        for (int i = p.doc_start[d]; i < p.doc_start[d + 1]; i++) p.doc_of[i] = d;
    size_t nq = (size_t)p.n * p.H * p.D, nk = (size_t)p.n * p.Hk * p.D;
    double **vals[4] = {&p.q, &p.k, &p.v, &p.dout};
    void **bits[4] = {q_bits, k_bits, v_bits, dout_bits};
    const size_t sizes[4] = {nq, nk, nk, nq};
    const double range[4] = {2.0, 1.0, 1.0, 1.0};
    for (int t = 0; t < 4; t++) {
        *vals[t] = case_alloc(s, sizes[t], sizeof(double));
        if (bits[t]) *bits[t] = case_alloc(s, sizes[t], dtype_size(dt));
        for (size_t i = 0; i < sizes[t]; i++) {
            double x = fmt_round(rng_range(r, -range[t], range[t]), dt);
            (*vals[t])[i] = x;
            if (bits[t]) fmt_store(*bits[t], dt, i, x);
        }
    }
    if (sp->sinks) { /* f32 whatever dt, drawn after the rest: the other inputs stay as without */
        p.sinks = case_alloc(s, (size_t)p.H, sizeof(double));
        for (int h = 0; h < p.H; h++) p.sinks[h] = (double)(float)rng_range(r, -2.0, 2.0);
    }
    return p;
}

static void spec_name(char *name, size_t n, const char *kind, enum dtype dt,
                      const struct train_spec *sp)
{
    int rows = 0;
    for (int d = 0; d < sp->n_docs; d++) rows += sp->doc_len[d];
    snprintf(name, n, "%s %s %s (heads %d/%d head_dim %d window %d docs %d rows %d%s)", kind,
             dtype_name(dt), sp->label, sp->n_heads, sp->n_kv_heads, sp->head_dim, sp->window,
             sp->n_docs, rows, sp->sinks ? " sinks" : "");
}

/* The analytic double reference against central finite differences of the double forward. */
static void case_reference(struct suite *s, const struct train_spec *sp)
{
    char name[200];
    spec_name(name, sizeof name, "reference fd", DTYPE_F32, sp);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    struct problem p = make_problem(s, sp, DTYPE_F32, &r, NULL, NULL, NULL, NULL);
    size_t nq = (size_t)p.n * p.H * p.D, nk = (size_t)p.n * p.Hk * p.D;
    const size_t sizes[4] = {nq, nk, nk, p.sinks ? (size_t)p.H : 0};
    double *g[4], *mag[4];
    for (int t = 0; t < 4; t++) {
        g[t] = case_alloc(s, sizes[t] + 1, sizeof(double));
        mag[t] = case_alloc(s, sizes[t] + 1, sizeof(double));
    }
    ref_backward(&p, 1.0, g[0], g[1], g[2], mag[0], mag[1], mag[2], g[3], mag[3]);
    struct verdict v = {.worst_ratio = -1.0};
    double *xs[4] = {p.q, p.k, p.v, p.sinks};
    const char *names[4] = {"dq", "dk", "dv", "dsinks"};
    size_t idx[FD_SAMPLES];
    for (int t = 0; t < 4; t++) {
        size_t m = sizes[t];
        double gmax = 0.0;
        for (size_t i = 0; i < m; i++) gmax = fabs(g[t][i]) > gmax ? fabs(g[t][i]) : gmax;
        int cnt = fd_sample(&r, m, idx);
        for (int c = 0; c < cnt; c++) {
            double fd = ref_fd(&p, xs[t], idx[c]), an = g[t][idx[c]];
            double tol = FD_TOL * (fabs(an) + gmax) + 1e-12, err = fabs(fd - an);
            if (err / tol > v.worst_ratio) v.worst_ratio = err / tol;
            if (!(err <= tol))
                verdict_fail(&v, "%s[%zu]: analytic %.12g, finite difference %.12g (err %.3g > %.3g)",
                             names[t], idx[c], an, fd, err, tol);
        }
    }
    case_end(s, name, &v);
}

/* The case's sinks as f32 (exact: they were drawn as f32 values). */
static float *sinks_f32(struct suite *s, const struct problem *p)
{
    float *f = case_alloc(s, (size_t)p->H, sizeof(float));
    for (int h = 0; h < p->H; h++) f[h] = (float)p->sinks[h];
    return f;
}

/* Writes the rows of every document into a paged cache (op_kv_write, blocks of bt tokens in a
 * shuffled order) and runs op_attention with one sequence per document: serving's attention on
 * the same data. out_bits receives its output. */
static void run_paged(struct suite *s, struct backend *b, struct verdict *v, const struct problem *p,
                      enum dtype dt, struct rng *r, const void *q_bits, const void *k_bits,
                      const void *v_bits, void *out_bits)
{
    const int bt = 5, n_docs = p->n_docs;
    int max_blocks = 1, n_blocks = 0;
    for (int d = 0; d < n_docs; d++) {
        int nb = (p->doc_start[d + 1] - p->doc_start[d] + bt - 1) / bt;
        n_blocks += nb;
        if (nb > max_blocks) max_blocks = nb;
    }
    n_blocks += 1; /* a spare block: table entries past a document's end point at it */
    int *perm = case_alloc(s, (size_t)n_blocks, sizeof(int));
    for (int i = 0; i < n_blocks; i++) perm[i] = i;
    rng_shuffle(r, perm, n_blocks);
    int32_t *table = case_alloc(s, (size_t)n_docs * max_blocks + 1, sizeof(int32_t));
    int32_t *seq_len = case_alloc(s, (size_t)n_docs + 1, sizeof(int32_t));
    int32_t *slots = case_alloc(s, (size_t)p->n + 1, sizeof(int32_t));
    for (int d = 0, next = 0; d < n_docs; d++) {
        int len = p->doc_start[d + 1] - p->doc_start[d], nb = (len + bt - 1) / bt;
        seq_len[d] = len;
        for (int j = 0; j < max_blocks; j++)
            table[(size_t)d * max_blocks + j] = j < nb ? perm[next++] : perm[n_blocks - 1];
        for (int t = 0; t < len; t++)
            slots[p->doc_start[d] + t] = table[(size_t)d * max_blocks + t / bt] * bt + t % bt;
    }
    struct arena a = {.b = b};
    struct tensor tq = arena_in(&a, "q", dt, S3(p->n, p->H, p->D), q_bits);
    struct tensor tk = arena_in(&a, "k", dt, S3(p->n, p->Hk, p->D), k_bits);
    struct tensor tv = arena_in(&a, "v", dt, S3(p->n, p->Hk, p->D), v_bits);
    struct tensor ts = arena_in(&a, "slots", DTYPE_I32, S1(p->n), slots);
    struct tensor kc = arena_out(&a, "k_cache", dt, S4(n_blocks, bt, p->Hk, p->D), NULL, NULL);
    struct tensor vc = arena_out(&a, "v_cache", dt, S4(n_blocks, bt, p->Hk, p->D), NULL, NULL);
    struct tensor to = arena_out(&a, "paged out", dt, S3(p->n, p->H, p->D), NULL, out_bits);
    struct attention_batch batch = {
        .n_seqs = n_docs,
        .block_tokens = bt,
        .max_blocks = max_blocks,
        .q_start = arena_in(&a, "q_start", DTYPE_I32, S1(n_docs + 1), p->doc_start),
        .seq_len = arena_in(&a, "seq_len", DTYPE_I32, S1(n_docs), seq_len),
        .block_table = arena_in(&a, "block_table", DTYPE_I32, S2(n_docs, max_blocks), table),
        .scale = (float)p->scale,
        .window = p->window,
    };
    if (p->sinks) batch.sinks = arena_in(&a, "sinks", DTYPE_F32, S1(p->H), sinks_f32(s, p));
    if (SUPPORTED(v, b, kv_write) && SUPPORTED(v, b, attention)) {
        op_kv_write(b, &kc, &vc, &tk, &tv, &ts);
        op_attention(b, &to, &tq, &kc, &vc, &batch);
    }
    arena_finish(&a, v);
}

/* The backward on one backend with the given inputs; the results land in grad_bits (with sinks,
 * grad_bits[3] gets op_attention_sinks_backward's dsinks, added to dsinks_init). Runs the ops
 * twice and requires the same bits. */
static void run_backward(struct suite *s, struct backend *b, struct verdict *v,
                         const struct problem *p, enum dtype dt, const void *const in_bits[6],
                         void *const grad_bits[4], const float *dsinks_init)
{
    size_t bytes[4] = {(size_t)p->n * p->H * p->D * dtype_size(dt),
                       (size_t)p->n * p->Hk * p->D * dtype_size(dt),
                       (size_t)p->n * p->Hk * p->D * dtype_size(dt),
                       p->sinks ? (size_t)p->H * sizeof(float) : 0};
    const int n_grads = p->sinks ? 4 : 3;
    void *first[4] = {0};
    for (int run = 0; run < 2; run++) {
        void *dst[4];
        for (int t = 0; t < n_grads; t++) dst[t] = run == 0 ? grad_bits[t] : case_alloc(s, bytes[t], 1);
        struct arena a = {.b = b};
        struct tensor tdout = arena_in(&a, "dout", dt, S3(p->n, p->H, p->D), in_bits[0]);
        struct tensor tout = arena_in(&a, "out", dt, S3(p->n, p->H, p->D), in_bits[1]);
        struct tensor tlse = arena_in(&a, "lse", DTYPE_F32, S2(p->n, p->H), in_bits[2]);
        struct tensor tq = arena_in(&a, "q", dt, S3(p->n, p->H, p->D), in_bits[3]);
        struct tensor tk = arena_in(&a, "k", dt, S3(p->n, p->Hk, p->D), in_bits[4]);
        struct tensor tv = arena_in(&a, "v", dt, S3(p->n, p->Hk, p->D), in_bits[5]);
        struct tensor tdq = arena_out(&a, "dq", dt, S3(p->n, p->H, p->D), NULL, dst[0]);
        struct tensor tdk = arena_out(&a, "dk", dt, S3(p->n, p->Hk, p->D), NULL, dst[1]);
        struct tensor tdv = arena_out(&a, "dv", dt, S3(p->n, p->Hk, p->D), NULL, dst[2]);
        struct attention_train_batch batch = {
            .n_docs = p->n_docs,
            .doc_start = arena_in(&a, "doc_start", DTYPE_I32, S1(p->n_docs + 1), p->doc_start),
            .scale = (float)p->scale,
            .window = p->window,
        };
        struct tensor tds = {0};
        if (p->sinks) {
            batch.sinks = arena_in(&a, "sinks", DTYPE_F32, S1(p->H), sinks_f32(s, p));
            tds = arena_out(&a, "dsinks", DTYPE_F32, S1(p->H), dsinks_init, dst[3]);
        }
        if (SUPPORTED(v, b, attention_train_backward))
            op_attention_train_backward(b, &tdq, &tdk, &tdv, &tdout, &tout, &tlse, &tq, &tk, &tv, &batch);
        if (p->sinks && SUPPORTED(v, b, attention_sinks_backward))
            op_attention_sinks_backward(b, &tds, &tdout, &tout, &tlse, &batch.sinks);
        arena_finish(&a, v);
        static const char *const names[4] = {"dq", "dk", "dv", "dsinks"};
        for (int t = 0; t < n_grads; t++) {
            if (run == 0) first[t] = dst[t];
            else if (memcmp(first[t], dst[t], bytes[t]))
                verdict_fail(v, "%s: %s differs between two runs on the same inputs", b->ops->name, names[t]);
        }
    }
}

static void case_train(struct suite *s, enum dtype dt, const struct train_spec *sp)
{
    char name[200];
    spec_name(name, sizeof name, "attention_train", dt, sp);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    void *q_bits, *k_bits, *v_bits, *dout_bits;
    struct problem p = make_problem(s, sp, dt, &r, &q_bits, &k_bits, &v_bits, &dout_bits);
    const size_t nq = (size_t)p.n * p.H * p.D, nk = (size_t)p.n * p.Hk * p.D, nl = (size_t)p.n * p.H;
    struct verdict v = {.worst_ratio = -1.0};
    p.u_tc = tc_roundoff(s, dt, p.D);

    /* Forward. */
    double *want_out = case_alloc(s, nq, sizeof(double)), *mag_out = case_alloc(s, nq, sizeof(double));
    double *want_lse = case_alloc(s, nl, sizeof(double)), *mag_lse = case_alloc(s, nl, sizeof(double));
    double *tol_out = case_alloc(s, nq, sizeof(double)), *tol_lse = case_alloc(s, nl, sizeof(double));
    ref_forward(&p, want_out, want_lse, mag_out, mag_lse);
    make_tol(tol_out, dt, want_out, mag_out, nq);
    make_tol(tol_lse, DTYPE_F32, want_lse, mag_lse, nl);
    double *got_out[2] = {0}, *got_lse[2] = {0}, *got_paged[2] = {0};
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        void *out_bits = case_alloc(s, nq, dtype_size(dt)), *paged_bits = case_alloc(s, nq, dtype_size(dt));
        float *lse_bits = case_alloc(s, nl, sizeof(float));
        struct arena a = {.b = b};
        struct tensor tq = arena_in(&a, "q", dt, S3(p.n, p.H, p.D), q_bits);
        struct tensor tk = arena_in(&a, "k", dt, S3(p.n, p.Hk, p.D), k_bits);
        struct tensor tv = arena_in(&a, "v", dt, S3(p.n, p.Hk, p.D), v_bits);
        struct tensor to = arena_out(&a, "out", dt, S3(p.n, p.H, p.D), NULL, out_bits);
        struct tensor tl = arena_out(&a, "lse", DTYPE_F32, S2(p.n, p.H), NULL, lse_bits);
        struct attention_train_batch batch = {
            .n_docs = p.n_docs,
            .doc_start = arena_in(&a, "doc_start", DTYPE_I32, S1(p.n_docs + 1), p.doc_start),
            .scale = (float)p.scale,
            .window = p.window,
            .bidirectional = p.bidir,
        };
        if (p.sinks) batch.sinks = arena_in(&a, "sinks", DTYPE_F32, S1(p.H), sinks_f32(s, &p));
        if (SUPPORTED(&v, b, attention_train)) op_attention_train(b, &to, &tl, &tq, &tk, &tv, &batch);
        arena_finish(&a, &v);
        got_out[bi] = decode(s, out_bits, dt, nq);
        got_lse[bi] = decode(s, lse_bits, DTYPE_F32, nl);
        if (p.n_docs > 0 && !p.bidir) { /* the paged cache is causal */
            run_paged(s, b, &v, &p, dt, &r, q_bits, k_bits, v_bits, paged_bits);
            got_paged[bi] = decode(s, paged_bits, dt, nq);
        }
    }
    check_close(s, &v, "out", got_out, want_out, tol_out, nq, (size_t)p.D);
    check_close(s, &v, "lse", got_lse, want_lse, tol_lse, nl, (size_t)p.H);
    for (int bi = 0; bi < s->n_backends && p.n_docs > 0 && !p.bidir; bi++) {
        char label[96];
        snprintf(label, sizeof label, "%s: paged op_attention vs reference", s->backend_name[bi]);
        compare_close(&v, label, got_paged[bi], want_out, tol_out, 1.0, nq, (size_t)p.D);
        snprintf(label, sizeof label, "%s: paged op_attention vs op_attention_train", s->backend_name[bi]);
        compare_close(&v, label, got_paged[bi], got_out[bi], tol_out, 2.0, nq, (size_t)p.D);
    }

    if (p.bidir) { /* encoders are served, not trained: no backward to check (ops.h) */
        case_end(s, name, &v);
        return;
    }

    /* Backward, from the reference's out (rounded to dt) and lse (rounded to f32). */
    void *out_in = case_alloc(s, nq, dtype_size(dt));
    float *lse_in = case_alloc(s, nl, sizeof(float));
    for (size_t i = 0; i < nq; i++) fmt_store(out_in, dt, i, fmt_round(want_out[i], dt));
    for (size_t i = 0; i < nl; i++) lse_in[i] = (float)want_lse[i];
    const int n_grads = p.sinks ? 4 : 3;
    double *want[4], *mag[4], *tol[4], *got[4][2] = {{0}};
    const size_t sizes[4] = {nq, nk, nk, p.sinks ? (size_t)p.H : 0};
    const enum dtype gdt[4] = {dt, dt, dt, DTYPE_F32}; /* sinks and their gradient are f32 */
    for (int t = 0; t < 4; t++) {
        want[t] = case_alloc(s, sizes[t] + 1, sizeof(double));
        mag[t] = case_alloc(s, sizes[t] + 1, sizeof(double));
        tol[t] = case_alloc(s, sizes[t] + 1, sizeof(double));
    }
    double u_out = (dt == DTYPE_F32 ? U32 : storage_rounding[dt].u) / U32;
    ref_backward(&p, u_out, want[0], want[1], want[2], mag[0], mag[1], mag[2], want[3], mag[3]);
    /* dsinks is added to: it starts at values of its own, and the op's share must come on top. */
    float *dsinks_init = case_alloc(s, sizes[3] + 1, sizeof(float));
    for (size_t h = 0; h < sizes[3]; h++) {
        dsinks_init[h] = 0.25f * (float)h - 0.5f;
        want[3][h] += dsinks_init[h];
    }
    for (int t = 0; t < n_grads; t++) make_tol(tol[t], gdt[t], want[t], mag[t], sizes[t]);
    const void *const in_bits[6] = {dout_bits, out_in, lse_in, q_bits, k_bits, v_bits};
    for (int bi = 0; bi < s->n_backends; bi++) {
        void *grad_bits[4];
        for (int t = 0; t < n_grads; t++) grad_bits[t] = case_alloc(s, sizes[t], dtype_size(gdt[t]));
        run_backward(s, s->backend[bi], &v, &p, dt, in_bits, grad_bits, dsinks_init);
        for (int t = 0; t < n_grads; t++) got[t][bi] = decode(s, grad_bits[t], gdt[t], sizes[t]);
    }
    static const char *const names[4] = {"dq", "dk", "dv", "dsinks"};
    for (int t = 0; t < n_grads; t++)
        check_close(s, &v, names[t], got[t], want[t], tol[t], sizes[t], t < 3 ? (size_t)p.D : sizes[3]);

    /* The backward against finite differences of the double forward, on a sample. */
    double *xs[4] = {p.q, p.k, p.v, p.sinks};
    size_t idx[FD_SAMPLES];
    for (int t = 0; t < n_grads; t++) {
        double gmax = 0.0;
        for (size_t i = 0; i < sizes[t]; i++) gmax = fabs(want[t][i]) > gmax ? fabs(want[t][i]) : gmax;
        int cnt = fd_sample(&r, sizes[t], idx);
        for (int c = 0; c < cnt && c < 8; c++) {
            const size_t e = idx[c];
            const double fd = ref_fd(&p, xs[t], e) + (t == 3 ? dsinks_init[e] : 0.0);
            const double bound = tol[t][e] + FD_TOL * (fabs(fd) + gmax);
            for (int bi = 0; bi < s->n_backends; bi++) {
                const double err = fabs(got[t][bi][e] - fd);
                if (!(err <= bound))
                    verdict_fail(&v, "%s: %s[%zu] = %.9g, finite difference %.9g (err %.3g > %.3g)",
                                 s->backend_name[bi], names[t], e, got[t][bi][e], fd, err, bound);
            }
        }
    }
    case_end(s, name, &v);
}

/* ==== the case list ========================================================================= */

static const struct train_spec specs[] = {
    {"one document", 4, 4, 64, 0, 0, 1, {37}, 0, 0},
    /* A grouped-query batch with a one-row document between two longer ones. */
    {"packed gqa4", 8, 2, 64, 0, 0, 4, {17, 1, 40, 3}, 0, 0},
    {"mqa head_dim=24", 4, 1, 24, 0, 0, 5, {1, 1, 30, 1, 9}, 0, 0},
    {"one-row documents", 2, 1, 8, 0, 0, 5, {1, 1, 1, 1, 1}, 0, 0},
    {"window=7", 8, 4, 32, 7, 0, 2, {50, 23}, 0, 0},
    {"window=1", 4, 2, 8, 1, 0, 2, {6, 5}, 0, 0},
    {"window>document", 4, 4, 16, 100, 0, 2, {20, 35}, 0, 0},
    {"empty documents", 4, 2, 16, 0, 0, 6, {0, 12, 0, 0, 7, 0}, 0, 0},
    {"head_dim=128 scale=0.3", 4, 2, 128, 0, 0.3, 2, {45, 20}, 0, 0},
    /* Phi-3's head size (CUDA's tensor-core form takes it only when forced) over several tiles. */
    {"head_dim=96 packed", 4, 2, 96, 0, 0, 2, {70, 90}, 0, 0},
    /* Gemma 3 270M's attention: multi-query, head_dim 256, a sliding window. */
    {"gemma3-like head_dim=256", 4, 1, 256, 16, 0, 2, {33, 8}, 0, 0},
    /* Long enough for several tiles and blocks on both backends; not a multiple of 32. */
    {"long document", 2, 1, 64, 0, 0, 1, {300}, 0, 0},
    {"long window=64 head_dim=80", 4, 2, 80, 64, 0, 2, {129, 200}, 0, 0},
    {"head_dim=8 eight documents", 8, 8, 8, 0, 0, 8, {3, 7, 1, 12, 5, 2, 9, 4}, 0, 0},
    {"empty batch", 4, 2, 16, 0, 0, 0, {0}, 0, 0},
    /* Bidirectional (an encoder's attention, BERT): every row sees its whole document. */
    {"bidirectional packed gqa4", 8, 2, 64, 0, 0, 4, {17, 1, 40, 3}, 1, 0},
    {"bidirectional minilm-like 12 heads head_dim=32", 12, 12, 32, 0, 0, 3, {9, 130, 4}, 1, 0},
    {"bidirectional long document", 2, 1, 64, 0, 0, 2, {300, 45}, 1, 0},
    /* Attention sinks (GPT-OSS): one learned logit per query head in every softmax. */
    {"packed gqa4", 8, 2, 64, 0, 0, 4, {17, 1, 40, 3}, 0, 1},
    {"window=5 mqa head_dim=32", 4, 1, 32, 5, 0, 3, {30, 1, 9}, 0, 1},
    {"gpt-oss-like window=16 long", 8, 2, 64, 16, 0, 2, {150, 20}, 0, 1},
};

static void run_all(struct suite *s)
{
    const size_t n_specs = sizeof specs / sizeof specs[0];
    for (size_t i = 0; i < n_specs; i++)
        if (!specs[i].bidirectional) case_reference(s, &specs[i]); /* the backward's own check */
    for (int di = 0; di < 3; di++)
        for (size_t i = 0; i < n_specs; i++) case_train(s, float_dtypes[di], &specs[i]);
}

int main(int argc, char **argv)
{
    return suite_main(argc, argv, "test_attention_train", "attention_train_cuda", run_all);
}
