/* tests/test_ops_quant.c - op_matmul with a block-quantized w and op_embedding with a
 * block-quantized table (DTYPE_Q*, kernels/quant.h) on the CUDA backend, which dequantizes the
 * blocks inside its kernels (kernels/cuda/matmul_quant.cu, embedding.cu).
 *
 * Every case draws random blocks with small finite f16 scales (tests/quant_fill.h) and their
 * f32 values wd = quant_dequantize_row (the CPU's dequantizer, bit-exact with ggml), and:
 *   - matmul, for each block type, x/y/bias in f32, bf16 and f16, m 1, 3, 8 (the last
 *     one-pass kernel shape), 9 (the first cuBLAS one), 64; k one block and three; n 37 (odd),
 *     with and without a bias; k = 0; and shapes that cross the cuBLAS path's tiles (n 262221 >
 *     one tile of w's rows at k 32; m 4100 > one chunk of x's rows): the CUDA y against the
 *     double product of the rounded x with wd, and against the CPU backend's f32 product of wd
 *     (op_matmul with an f32 w, x and bias widened to f32, y rounded to the case's dtype on the
 *     host). Guard bytes around every buffer (after y included), inputs unchanged, y NaN-filled
 *     before the op.
 *   - embedding, every type and dtype, d one block and three, ids inside and outside the shard
 *     (vocab_start 5): the rows equal wd rounded to out's dtype, bit for bit, zeros elsewhere;
 *     the CPU backend's lookup from the same blocks (f32 out) agrees.
 *
 * Tolerance of the products. The CUDA path does not round x (the CPU's block product rounds it
 * to int8; that path is tests/test_quant.c's): it forms the f32 products of exact operands (x
 * widened exactly, wd exact in f32) and sums them in some order (one warp's lanes then a tree;
 * or cuBLAS's, split-K included). Any order of k f32 additions of terms t_l is within
 * gamma_k sum |t_l| of the exact sum, gamma_k = k u / (1 - k u), u = 2^-24 (Higham, Accuracy
 * and Stability, 3.1), and each product adds u |t_l| (none with an FMA): within 1.01 k u
 * sum |x_l wd_l| for k u < 0.01. Adding the bias rounds once more (u |y|), and storing in a
 * bf16/f16 y once more (its unit roundoff u_T |y|, or half its subnormal spacing). So
 *     tol = u_T |want| + (1 + u_T) (2 u |want| + 2 u k sum_l |x_l wd_l|) + floor_T,
 * with a factor 2 of slack on the f32 terms; the CPU's f32 product obeys the same bound, and
 * CUDA against CPU is held to twice it (op_check.h). One weight decoded from the wrong nibble,
 * bit or scale moves y by about |x_l wd_l| ~ sum / k: 1 / (2 u k^2), i.e. 14 (k 768) to 8000
 * (k 32) times the f32 part of the bound; in bf16/f16 outputs the storage rounding dominates
 * and a single wrong weight may hide, a wrong row or tile offset never. The embedding cases
 * check the decoding itself bit for bit, in every dtype.
 *
 * --backend cuda: the above; SKIP (77) without a GPU. --backend cpu: the reference half only
 * (the CPU's f32 product of wd against the double one, the CPU's block lookup against wd; the
 * big tile-crossing shapes are left out), so that this file's references and tolerances run
 * where there is no GPU; the CPU's own block product is tests/test_quant.c's.
 * Not here: the decoder on the host (tests/test_quant_blocks.cu), whole models
 * (tests/test_gguf_serve.c --cuda).
 * Run: test_ops_quant --backend cpu|cuda [--filter SUBSTR] [--seed N]. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "op_check.h"
#include "quant.h"
#include "quant_fill.h"

static enum dtype block_dtype(enum quant_type t) { return (enum dtype)dtype_of_quant_type(t); }

/* n rows of k of type t, random (small finite scales), and their f32 values, case_alloc'd. */
static void make_blocks(struct suite *s, struct rng *r, enum quant_type t, int64_t n, int64_t k,
                        uint8_t **blocks, float **wd)
{
    const size_t row = quant_row_bytes(t, k);
    *blocks = case_alloc(s, (size_t)n * row + 1, 1);
    *wd = case_alloc(s, (size_t)(n * k) + 1, sizeof(float));
    if (k > 0) qfill_blocks(t, *blocks, n * (k / quant_block_size(t)), 0, &r->s);
    for (int64_t j = 0; j < n && k > 0; j++)
        quant_dequantize_row(t, *blocks + (size_t)j * row, *wd + (size_t)(j * k), k);
}

/* The f32 copy of a host buffer (exact: every float dtype widens exactly). */
static float *widen(struct suite *s, const struct hbuf *h)
{
    float *f = case_alloc(s, h->n + 1, sizeof(float));
    for (size_t i = 0; i < h->n; i++) f[i] = (float)h->val[i];
    return f;
}

/* ---- matmul ------------------------------------------------------------------------------ */

static void case_matmul(struct suite *s, enum quant_type qt, enum dtype dt, int64_t m, int64_t k,
                        int64_t n, int with_bias)
{
    char name[128];
    snprintf(name, sizeof name, "matmul %s %s m=%lld k=%lld n=%lld%s", quant_type_name(qt), dtype_name(dt),
             (long long)m, (long long)k, (long long)n, with_bias ? " bias" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    uint8_t *blocks;
    float *wd;
    make_blocks(s, &r, qt, n, k, &blocks, &wd);
    struct hbuf x = hbuf_uniform(s, dt, (size_t)(m * k), &r, -1, 1);
    struct hbuf bias = hbuf_uniform(s, dt, (size_t)n, &r, -1, 1);
    const size_t no = (size_t)(m * n);
    double *want = case_alloc(s, no, sizeof(double)), *tol = case_alloc(s, no, sizeof(double));
    const struct storage_rounding *sr = &storage_rounding[dt];
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0, acc_abs = 0.0;
            const double *xi = x.val + i * k;
            const float *wj = wd + j * k;
            for (int64_t l = 0; l < k; l++) {
                const double p = xi[l] * (double)wj[l];
                acc += p;
                acc_abs += fabs(p);
            }
            const double y = acc + (with_bias ? bias.val[j] : 0.0), ay = fabs(y);
            want[i * n + j] = y;
            tol[i * n + j] = sr->u * ay + (1.0 + sr->u) * (2 * U32 * ay + 2 * U32 * (double)k * acc_abs) + sr->floor;
        }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        if (b->device == DEVICE_CUDA) { /* the blocks, in the case's dtype */
            void *bits = case_alloc(s, no + 1, dtype_size(dt));
            struct tensor tx = arena_in(&a, "x", dt, S2(m, k), x.bits);
            struct tensor tw = arena_in(&a, "w", block_dtype(qt), S2(n, k), blocks);
            struct tensor tb = arena_in(&a, "bias", dt, S1(n), bias.bits);
            struct tensor ty = arena_out(&a, "y", dt, S2(m, n), NULL, bits);
            if (SUPPORTED(&v, b, matmul)) op_matmul(b, &ty, &tx, &tw, with_bias ? &tb : NULL);
            arena_finish(&a, &v);
            got[bi] = decode(s, bits, dt, no);
        } else { /* the CPU's f32 product of wd, rounded to the case's dtype */
            float *y32 = case_alloc(s, no + 1, sizeof(float));
            struct tensor tx = arena_in(&a, "x", DTYPE_F32, S2(m, k), widen(s, &x));
            struct tensor tw = arena_in(&a, "w", DTYPE_F32, S2(n, k), wd);
            struct tensor tb = arena_in(&a, "bias", DTYPE_F32, S1(n), widen(s, &bias));
            struct tensor ty = arena_out(&a, "y", DTYPE_F32, S2(m, n), NULL, y32);
            op_matmul(b, &ty, &tx, &tw, with_bias ? &tb : NULL);
            arena_finish(&a, &v);
            got[bi] = case_alloc(s, no + 1, sizeof(double));
            for (size_t i = 0; i < no; i++) got[bi][i] = fmt_round((double)y32[i], dt);
        }
    }
    check_close(s, &v, "y", got, want, tol, no, (size_t)n);
    case_end(s, name, &v);
}

/* ---- embedding ----------------------------------------------------------------------------- */

static void case_embedding(struct suite *s, enum quant_type qt, enum dtype dt, int64_t vocab_local,
                           int64_t d, int64_t n_ids, int64_t vocab_start)
{
    char name[128];
    snprintf(name, sizeof name, "embedding %s %s rows=%lld d=%lld ids=%lld start=%lld", quant_type_name(qt),
             dtype_name(dt), (long long)vocab_local, (long long)d, (long long)n_ids, (long long)vocab_start);
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    uint8_t *blocks;
    float *wd;
    make_blocks(s, &r, qt, vocab_local, d, &blocks, &wd);
    /* ids from 3 below the shard to 3 past it; the first and last row of the shard always. */
    int32_t *ids = case_alloc(s, (size_t)n_ids, sizeof(int32_t));
    for (int64_t i = 0; i < n_ids; i++)
        ids[i] = (int32_t)(vocab_start - 3 + rng_int(&r, (int)vocab_local + 6));
    ids[0] = (int32_t)vocab_start;
    ids[n_ids - 1] = (int32_t)(vocab_start + vocab_local - 1);
    const size_t no = (size_t)(n_ids * d);
    double *want = case_alloc(s, no, sizeof(double));
    for (int64_t i = 0; i < n_ids; i++) {
        const int64_t row = ids[i] - vocab_start;
        for (int64_t c = 0; c < d; c++)
            want[i * d + c] = row >= 0 && row < vocab_local ? fmt_round((double)wd[row * d + c], dt) : 0.0;
    }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        /* The CPU looks up into f32 only: its rows are rounded to the case's dtype here. */
        const enum dtype ot = b->device == DEVICE_CUDA ? dt : DTYPE_F32;
        void *bits = case_alloc(s, no + 1, dtype_size(ot));
        struct tensor tt = arena_in(&a, "table", block_dtype(qt), S2(vocab_local, d), blocks);
        struct tensor ti = arena_in(&a, "ids", DTYPE_I32, S1(n_ids), ids);
        struct tensor to = arena_out(&a, "out", ot, S2(n_ids, d), NULL, bits);
        if (SUPPORTED(&v, b, embedding)) op_embedding(b, &to, &tt, &ti, vocab_start);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, ot, no);
        if (ot != dt)
            for (size_t i = 0; i < no; i++) got[bi][i] = fmt_round(got[bi][i], dt);
    }
    check_exact(s, &v, "out", got, want, no, (size_t)d, 1);
    case_end(s, name, &v);
}

static void run_all(struct suite *s)
{
    const int cuda = s->n_backends == 2;
    static const int64_t ms[] = {1, 3, 8, 9, 64};
    for (int ti = 0; ti < QFILL_N_TYPES; ti++) {
        const enum quant_type qt = qfill_types[ti];
        const int64_t bs = quant_block_size(qt);
        for (int di = 0; di < 3; di++) {
            const enum dtype dt = float_dtypes[di];
            for (int mi = 0; mi < 5; mi++)
                for (int64_t nb = 1; nb <= 3; nb += 2)
                    for (int bias = 0; bias <= 1; bias++) case_matmul(s, qt, dt, ms[mi], nb * bs, 37, bias);
            for (int64_t nb = 1; nb <= 3; nb += 2) case_embedding(s, qt, dt, 37, nb * bs, 23, 5);
        }
    }
    for (int di = 0; di < 3; di++) {
        const enum dtype dt = float_dtypes[di];
        /* An empty sum: y is the bias (one-pass and cuBLAS shapes). */
        case_matmul(s, QUANT_TYPE_Q8_0, dt, 3, 0, 37, 1);
        case_matmul(s, QUANT_TYPE_Q8_0, dt, 64, 0, 37, 1);
        if (!cuda) continue;
        /* Across the cuBLAS path's tiles: n 262221 is two tiles of w rows at k 32 (8 Mi floats a
         * tile); m 4100 is two chunks of x rows (4096 a chunk). The one-pass kernel on the same
         * n: more rows than its grid's 65536 blocks of 4 warps (the grid-stride loop). */
        case_matmul(s, QUANT_TYPE_Q8_0, dt, 9, 32, 262221, 1);
        case_matmul(s, QUANT_TYPE_Q5_1, dt, 1, 32, 262221, 1);
        case_matmul(s, QUANT_TYPE_Q4_0, dt, 4100, 32, 7, 1);
        case_matmul(s, QUANT_TYPE_Q6_K, dt, 4100, 256, 3, 0);
    }
}

int main(int argc, char **argv)
{
    return suite_main(argc, argv, "test_ops_quant", "ops_quant_cuda", run_all);
}
