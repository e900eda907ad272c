/* tests/test_quant.c - the quantized product (kernels/quant.h) against the formats wing: for
 * every type, weights built from random bytes with small finite f16 scales are written into a
 * GGUF file and dequantized by engine/formats (bit-exact with gguf-py, tests/test_gguf.c),
 * which is the reference:
 *   - quant_dequantize_row equals it bit for bit, and the geometry (block and row bytes)
 *     equals the reader's;
 *   - quant_matmul of every implementation this CPU runs (scalar always, AVX2, AVX512-VNNI:
 *     each forced through quant_matmul_impl; the others reported SKIP) against the f64
 *     product of the dequantized W with the exact x, within a bound derived from the int8
 *     activation rounding: |y - y_ref| <= sum over x blocks b of d_b / 2 * sum_{k in b} |w_k|
 *     (d_b = max|x_b| / 127) plus an f32 rounding term; and the SIMD results against the
 *     scalar one within f32 reassociation;
 *   - odd shapes (m 1, 3, 17; n 1, 7, 33; k one block and several), one and two threads, the
 *     scratch passed or allocated, guard bytes after y and the scratch, y finite;
 *   - MXFP4: its E8M0 half scale against 2^(e - 128) in f64 for e 0 .. 255 (ggml's subnormal
 *     rule at e 0 and 1), rows of odd byte counts from an odd base address (test_gguf holds its
 *     dequantization bit-exact against gguf-py's, edge scales included);
 *   - through the op interface (kernels/ops.h, CPU backend at 1 and 2 threads): op_matmul with a
 *     block-quantized w (DTYPE_Q*), with and without a bias, equals quant_matmul (plus the bias)
 *     bit for bit, guard bytes after y intact; op_embedding from a quantized table equals
 *     quant_dequantize_row per row and zeroes ids outside the shard; tensor_nbytes and
 *     tensor_rows_at of block tensors count real bytes.
 * Not here: speed (tests/bench_quant.c); whole models (tests/test_gguf_serve.c). Exits 1 on any
 * failure. */
#define _GNU_SOURCE
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "cpu/cpu_ops.h"
#include "gguf.h"
#include "ops.h"
#include "quant.h"
#include "quant_fill.h"
#include "tensor.h"

#define GUARD 64
#define GUARD_BYTE 0xA5

static const enum quant_type types[] = {
    QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K, QUANT_TYPE_Q5_0,
    QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1, QUANT_TYPE_Q5_1, QUANT_TYPE_Q5_K,
    QUANT_TYPE_Q2_K, QUANT_TYPE_Q3_K, QUANT_TYPE_IQ4_NL, QUANT_TYPE_IQ4_XS,
    QUANT_TYPE_MXFP4,
};
#define N_TYPES (int)(sizeof types / sizeof types[0])

/* ---- random data ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static double rnd_uniform(void) { return (rnd32() & 0xFFFFFF) / (double)0x1000000; } /* [0, 1) */

static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* nblocks blocks of type: random quants with small finite f16 scales, so that weights are
 * O(0.1 .. 1) (tests/quant_fill.h, shared with the CUDA block tests). */
static uint64_t fill_seed = 0x7e57c0de;
static void fill_blocks(enum quant_type t, uint8_t *w, int64_t nblocks) { qfill_blocks(t, w, nblocks, 0, &fill_seed); }

/* The 6-bit min of sub-block j of a Q4_K/Q5_K block (ggml-common.h packing). */
static int k_min(int j, const uint8_t *q)
{
    return j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}

/* |the min part| of element e of a weight row: the term the product computes apart from the
 * scaled integer sum (Q4_1/Q5_1: m; Q4_K/Q5_K: dmin * m_j; Q2_K: dmin * m_g), which may cancel against it and
 * so enters the f32 rounding bound. 0 for the types whose offsets stay in the integers. */
static double min_part(enum quant_type t, const uint8_t *row, int64_t e)
{
    const int bs = quant_block_size(t);
    const uint8_t *blk = row + (size_t)(e / bs) * quant_block_bytes(t);
    switch (t) {
    case QUANT_TYPE_Q4_1: case QUANT_TYPE_Q5_1: return fabs(f16_to_f32(get16(blk + 2)));
    case QUANT_TYPE_Q4_K: case QUANT_TYPE_Q5_K:
        return fabs(f16_to_f32(get16(blk + 2)) * k_min((int)(e % bs) / 32, blk + 4));
    case QUANT_TYPE_Q2_K: return fabs(f16_to_f32(get16(blk + 82)) * (blk[(e % bs) / 16] >> 4));
    default: return 0.0;
    }
}

/* ---- the reference: the formats wing's dequantizer through a GGUF file ---- */

static char tmp_path[64];

static void put_u32(FILE *f, uint32_t v) { CHECK(fwrite(&v, 4, 1, f) == 1, "write"); }
static void put_u64(FILE *f, uint64_t v) { CHECK(fwrite(&v, 8, 1, f) == 1, "write"); }

/* Writes a GGUF v3 file holding one tensor "w" of n rows of k elements of type t, reads it back
 * dequantized into ref (n * k), and checks the reader's idea of the geometry. */
static void reference_dequantize(enum quant_type t, const uint8_t *w, int64_t n, int64_t k, float *ref)
{
    const size_t bytes = (size_t)n * quant_row_bytes(t, k);
    FILE *f = fopen(tmp_path, "wb");
    CHECK(f, "cannot write %s", tmp_path);
    fwrite("GGUF", 1, 4, f);
    put_u32(f, 3);
    put_u64(f, 1); /* tensors */
    put_u64(f, 0); /* metadata entries */
    put_u64(f, 1);
    fwrite("w", 1, 1, f);
    put_u32(f, 2);
    put_u64(f, (uint64_t)k); /* ne[0], innermost */
    put_u64(f, (uint64_t)n);
    put_u32(f, (uint32_t)t);
    put_u64(f, 0);
    static const uint8_t zeros[32];
    const long pos = ftell(f);
    fwrite(zeros, 1, (size_t)((32 - pos % 32) % 32), f);
    CHECK(fwrite(w, 1, bytes, f) == bytes, "write");
    CHECK(fclose(f) == 0, "close %s", tmp_path);

    struct gguf *g;
    CHECK(gguf_open(tmp_path, &g) == STATUS_OK, "gguf_open: %s", status_message());
    const struct gguf_tensor *gt = gguf_find_tensor(g, "w");
    CHECK(gt && gt->supported, "tensor w of type %s", quant_type_name(t));
    CHECK(gt->block_size == quant_block_size(t) && (size_t)gt->type_size == quant_block_bytes(t) &&
              gt->nbytes == bytes,
          "%s geometry: reader block %d / %d bytes, tensor %llu bytes; quant.h %d / %zu, %zu",
          quant_type_name(t), gt->block_size, gt->type_size, (unsigned long long)gt->nbytes,
          quant_block_size(t), quant_block_bytes(t), bytes);
    CHECK(gguf_tensor_read_f32(g, gt, ref) == STATUS_OK, "read: %s", status_message());
    gguf_close(g);
}

/* ---- the product's checks ---- */

struct worst {
    double ratio;        /* max |y - y_ref| / bound */
    double simd_ratio;   /* max |y - y_scalar| / (2 * f32 term) */
    double q_ratio;      /* max |y - f64 product with int8 x| / (f32 term + tie slack) */
    int    bad;          /* cases over a bound, non-finite, or guards touched */
};

static int guard_ok(const uint8_t *p)
{
    for (int i = 0; i < GUARD; i++)
        if (p[i] != GUARD_BYTE) return 0;
    return 1;
}

/* One shape: W (n, k) of type t already in w with its dequantization wf; x random. Runs every
 * available implementation and folds the results into worst[impl]. */
static void check_shape(enum quant_type t, const uint8_t *w, const float *wf, int64_t m, int64_t n,
                        int64_t k, struct worst worst[QUANT_IMPL_COUNT])
{
    const int bs = quant_block_size(t);
    const int xbs = bs; /* x is quantized in blocks of the weight's block size */
    float *x = malloc((size_t)(m * k) * sizeof(float));
    /* Each block of x gets its own magnitude, some blocks zero: per-block scales matter. */
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < k / xbs; b++) {
            const double mag = rnd32() % 7 == 0 ? 0.0 : pow(10.0, 2.0 * rnd_uniform() - 1.0);
            for (int e = 0; e < xbs; e++)
                x[i * k + b * xbs + e] = (float)(mag * (2.0 * rnd_uniform() - 1.0));
        }

    /* Per output: the f64 reference with the exact x and its bound; and the f64 product with x
     * rounded to int8 as the contract says (d = max|x_b| / 127, q = nearest(x / d)), which the
     * kernels must match within f32 rounding, plus d |w| where x / d is within 1e-4 of a tie
     * (x * (1 / d) in f32 may round the other way). */
    const size_t mn = (size_t)(m * n) * sizeof(double);
    double *yref = malloc(mn), *bound = malloc(mn), *fterm = malloc(mn), *yq = malloc(mn), *qslack = malloc(mn);
    const double eps = ldexp(1.0, -23);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            const float *xr = x + i * k, *wr = wf + j * k;
            const uint8_t *wrow = w + (size_t)j * quant_row_bytes(t, k);
            double s = 0.0, sq = 0.0, act = 0.0, mag = 0.0, slack = 0.0;
            for (int64_t b = 0; b < k / xbs; b++) {
                double amax = 0.0;
                for (int e = 0; e < xbs; e++) amax = fmax(amax, fabs(xr[b * xbs + e]));
                const double dx = (double)((float)amax / 127.0f), half_dx = dx / 2.0 * (1.0 + 1e-4);
                for (int64_t e = b * xbs; e < (b + 1) * xbs; e++) {
                    s += (double)xr[e] * wr[e];
                    act += half_dx * fabs(wr[e]);
                    mag += (fabs(wr[e]) + 2.0 * min_part(t, wrow, e)) * (fabs(xr[e]) + half_dx);
                    const double r = dx > 0.0 ? xr[e] / dx : 0.0;
                    sq += dx * nearbyint(r) * wr[e];
                    if (fabs(fabs(r - floor(r)) - 0.5) < 1e-4) slack += dx * fabs(wr[e]);
                }
            }
            yref[i * n + j] = s;
            fterm[i * n + j] = (double)(k / bs + 8) * eps * mag + 1e-30;
            bound[i * n + j] = act + fterm[i * n + j];
            yq[i * n + j] = sq;
            qslack[i * n + j] = slack + fterm[i * n + j];
        }

    float *y_scalar = NULL;
    const size_t ybytes = (size_t)(m * n) * sizeof(float);
    const size_t sbytes = quant_matmul_scratch_bytes(t, m, k);
    for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
        if (!quant_impl_available((enum quant_impl)impl)) continue;
        for (int variant = 0; variant < 2; variant++) { /* 0: 1 thread, own scratch; 1: 2 threads, NULL */
            uint8_t *ybuf = malloc(ybytes + GUARD), *sbuf = malloc(sbytes + GUARD);
            memset(ybuf, 0x7F, ybytes); /* garbage where y goes: every element must be written */
            memset(ybuf + ybytes, GUARD_BYTE, GUARD);
            memset(sbuf + sbytes, GUARD_BYTE, GUARD);
            float *y = (float *)ybuf;
            quant_matmul_impl((enum quant_impl)impl, t, y, x, w, m, n, k, variant ? NULL : sbuf,
                              variant ? 2 : 1);
            struct worst *wo = &worst[impl];
            if (!guard_ok(ybuf + ybytes) || !guard_ok(sbuf + sbytes)) {
                if (!wo->bad) printf("  %s %s m=%lld n=%lld k=%lld: guard bytes overwritten\n",
                                     quant_type_name(t), quant_impl_name(impl), (long long)m,
                                     (long long)n, (long long)k);
                wo->bad++;
            }
            for (int64_t e = 0; e < m * n; e++) {
                const double err = fabs((double)y[e] - yref[e]);
                const double r = isfinite(y[e]) ? err / bound[e] : INFINITY;
                if (r > wo->ratio) wo->ratio = r;
                const double rq = fabs((double)y[e] - yq[e]) / qslack[e];
                if (rq > wo->q_ratio) wo->q_ratio = rq;
                double rs = 0.0;
                if (y_scalar) {
                    rs = fabs((double)y[e] - y_scalar[e]) / (2.0 * fterm[e]);
                    if (rs > wo->simd_ratio) wo->simd_ratio = rs;
                }
                if (r > 1.0 || rs > 1.0 || rq > 1.0) {
                    if (!wo->bad)
                        printf("  %s %s m=%lld n=%lld k=%lld threads=%d: y[%lld] = %.9g, f64 %.9g, "
                               "bound %.3g (f32 term %.3g), scalar %.9g, f64 of int8 x %.9g\n",
                               quant_type_name(t), quant_impl_name(impl), (long long)m, (long long)n,
                               (long long)k, variant ? 2 : 1, (long long)e, y[e], yref[e], bound[e],
                               fterm[e], y_scalar ? y_scalar[e] : NAN, yq[e]);
                    wo->bad++;
                }
            }
            if (impl == QUANT_IMPL_SCALAR && variant == 0) {
                y_scalar = malloc(ybytes);
                memcpy(y_scalar, y, ybytes);
            }
            free(ybuf);
            free(sbuf);
        }
    }
    free(y_scalar);
    free(yref);
    free(bound);
    free(fterm);
    free(yq);
    free(qslack);
    free(x);
}

/* quant_dequantize_row and every available implementation of it (scalar, the x86 ones' AVX2)
 * against the reference, row by row, bit for bit. */
static int dequantize_rows_equal(enum quant_type t, const uint8_t *w, const float *wf, int64_t n, int64_t k)
{
    float *row = malloc((size_t)k * sizeof(float) + GUARD);
    int ok = 1;
    for (int impl = -1; impl < QUANT_IMPL_COUNT; impl++) {
        if (impl >= 0 && !quant_impl_available((enum quant_impl)impl)) continue;
        for (int64_t j = 0; j < n && ok; j++) {
            const uint8_t *src = w + (size_t)j * quant_row_bytes(t, k);
            memset(row + k, GUARD_BYTE, GUARD);
            if (impl < 0) quant_dequantize_row(t, src, row, k);
            else quant_dequantize_row_impl((enum quant_impl)impl, t, src, row, k);
            ok = memcmp(row, wf + j * k, (size_t)k * sizeof(float)) == 0 && guard_ok((uint8_t *)(row + k));
        }
    }
    free(row);
    return ok;
}

static void check_type(enum quant_type t)
{
    static const int64_t ms[] = {1, 3, 17}, ns[] = {1, 7, 33};
    const int bs = quant_block_size(t);
    const int64_t ks[] = {bs, 3 * bs, bs == 32 ? 20 * bs : 4 * bs};
    struct worst worst[QUANT_IMPL_COUNT];
    memset(worst, 0, sizeof worst);
    int deq_ok = 1;
    for (int ik = 0; ik < 3; ik++)
        for (int in = 0; in < 3; in++) {
            const int64_t n = ns[in], k = ks[ik];
            const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
            uint8_t *w = malloc(wbytes + GUARD);
            fill_blocks(t, w, (int64_t)(wbytes / quant_block_bytes(t)));
            float *wf = malloc((size_t)(n * k) * sizeof(float));
            reference_dequantize(t, w, n, k, wf);
            deq_ok &= dequantize_rows_equal(t, w, wf, n, k);
            for (int im = 0; im < 3; im++) check_shape(t, w, wf, ms[im], n, k, worst);
            free(wf);
            free(w);
        }
    /* One product large enough for the parallel path (m n k >= 2^18) on two threads. */
    {
        const int64_t m = 5, n = 301, k = 4 * bs * (bs == 32 ? 8 : 1);
        const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
        uint8_t *w = malloc(wbytes);
        fill_blocks(t, w, (int64_t)(wbytes / quant_block_bytes(t)));
        float *wf = malloc((size_t)(n * k) * sizeof(float));
        reference_dequantize(t, w, n, k, wf);
        check_shape(t, w, wf, m, n, k, worst);
        free(wf);
        free(w);
    }
    check(deq_ok, "%s: quant_dequantize_row (every implementation) bit-exact with the formats dequantizer", quant_type_name(t));
    for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
        if (!quant_impl_available((enum quant_impl)impl)) {
            printf("SKIP %s %s: not available on this CPU or build\n", quant_type_name(t),
                   quant_impl_name((enum quant_impl)impl));
            continue;
        }
        check(!worst[impl].bad,
              "%s %s: product within the int8 bound (worst |err| / bound %.3f), equal to the f64 "
              "product of the int8-rounded x within f32 rounding (worst %.3f of it), guards intact",
              quant_type_name(t), quant_impl_name((enum quant_impl)impl), worst[impl].ratio,
              worst[impl].q_ratio);
        if (impl) printf("     %s %s vs scalar: worst |diff| / (2 f32 term) %.3f\n", quant_type_name(t),
                         quant_impl_name((enum quant_impl)impl), worst[impl].simd_ratio);
        /* The types of the block-exact order (kernels/cpu/quant_impl.h) give the scalar bits. */
        const int exact = t != QUANT_TYPE_Q2_K && t != QUANT_TYPE_Q3_K && t != QUANT_TYPE_IQ4_NL &&
                          t != QUANT_TYPE_IQ4_XS && t != QUANT_TYPE_MXFP4;
        if (impl && exact)
            check(worst[impl].simd_ratio == 0.0, "%s %s: the scalar product's bits (the block-exact order)",
                  quant_type_name(t), quant_impl_name((enum quant_impl)impl));
    }
}

/* The value x rounded to bf16 and back. */
static double bf16_round(float v) { return (double)bf16_to_f32(f32_to_bf16(v)); }

/* Whether every y[i][j] is within f32 reassociation of the f64 product x @ w^T (+ bias),
 * |err| <= (k + 2) u sum |x w| (u = 2^-24), with x and w first rounded to bf16 when bf16 (the
 * AMX tiles' operands; their products are exact in f32). */
static int close_to_f64(const float *y, const float *x, const float *wf, const float *bias, int64_t m,
                        int64_t n, int64_t k, int bf16)
{
    int ok = 1;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double exact = bias ? bias[j] : 0.0, mag = fabs(exact);
            for (int64_t c = 0; c < k; c++) {
                const float xv = x[i * k + c], wv = wf[j * k + c];
                const double p = bf16 ? bf16_round(xv) * bf16_round(wv) : (double)xv * (double)wv;
                exact += p;
                mag += fabs(p);
            }
            ok &= fabs((double)y[i * n + j] - exact) <= (double)(k + 2) * 0x1p-24 * mag;
        }
    return ok;
}

/* op_matmul / op_embedding with w of type t on the CPU backend against quant.h directly. */
static void check_backend_ops(struct backend *b, int n_threads, enum quant_type t)
{
    const enum dtype dt = (enum dtype)dtype_of_quant_type((uint32_t)t);
    const int bs = quant_block_size(t);
    const int64_t n = 37, k = bs == 32 ? 9 * bs : 3 * bs, row = (int64_t)quant_row_bytes(t, k);
    uint8_t *w = malloc((size_t)(n * row));
    fill_blocks(t, w, n * row / (int64_t)quant_block_bytes(t));
    struct tensor wt = tensor_make(w, dt, DEVICE_CPU, 2, n, k);
    struct tensor w3 = tensor_rows_at(&wt, 3, 2);
    int ok_geom = tensor_nbytes(&wt) == (size_t)(n * row) && tensor_row_bytes(&wt) == (size_t)row &&
                  w3.data == w + 3 * row && dtype_quant_type(dt) == (uint32_t)t;
    float bias[37];
    for (int j = 0; j < n; j++) bias[j] = (float)(rnd_uniform() - 0.5);
    struct tensor bt = tensor_make(bias, DTYPE_F32, DEVICE_CPU, 1, n);
    /* With AMX off: m = 1 and 16 (decode, small batches) must be quant_matmul's int8 product bit
     * for bit; m = 64 and 67 (prefill) the f32 product of the dequantized w (tiles for sgemm):
     * within f32 reassociation of the f64 product (close_to_f64), far below the int8 rounding
     * of x, so an int8 product fails it; m = 5 may take either path. Where the CPU has AMX,
     * m = 16, 64 and 67 run once more on the tiles (from 8 rows): the f32-summed product of x
     * and w rounded to bf16, to the same bound (a product of unrounded operands, or an int8
     * one, fails it). With b->rows_as_decode (a step verifying drafts) every m must give the
     * int8 product bit for bit, on the tiles' CPUs too (ok_decode). */
    float *wf = malloc((size_t)(n * k) * sizeof *wf);
    for (int64_t j = 0; j < n; j++) quant_dequantize_row(t, w + j * row, wf + j * k, k);
    int ok_mm = 1, ok_amx = 1, ok_decode = 1;
    const int amx_before = cpu_amx_set_enabled(1), amx = cpu_amx_enabled();
    static const int64_t ms[] = {1, 5, 16, 64, 67};
    for (int im = 0; im < 5; im++)
        for (int with_bias = 0; with_bias < 2; with_bias++)
            for (int use_amx = 0; use_amx <= (amx && ms[im] >= 16) + 1; use_amx++) {
                const int64_t m = ms[im];
                const int as_decode = use_amx == (amx && m >= 16) + 1; /* the last pass: AMX as the CPU has it */
                float *x = malloc((size_t)(m * k) * sizeof *x), *ref = malloc((size_t)(m * n) * sizeof *ref);
                float *y = malloc((size_t)(m * n) * sizeof *y + GUARD);
                for (int64_t i = 0; i < m * k; i++) x[i] = (float)(rnd_uniform() * 4 - 2);
                memset(y + m * n, GUARD_BYTE, GUARD);
                struct tensor xt = tensor_make(x, DTYPE_F32, DEVICE_CPU, 2, m, k);
                struct tensor yt = tensor_make(y, DTYPE_F32, DEVICE_CPU, 2, m, n);
                cpu_amx_set_enabled(as_decode ? amx : use_amx);
                b->rows_as_decode = as_decode;
                op_matmul(b, &yt, &xt, &wt, with_bias ? &bt : NULL);
                b->rows_as_decode = 0;
                quant_matmul(t, ref, x, w, m, n, k, NULL, n_threads);
                for (int64_t i = 0; with_bias && i < m; i++)
                    for (int64_t j = 0; j < n; j++) ref[i * n + j] += bias[j];
                const int int8_equal = memcmp(y, ref, (size_t)(m * n) * sizeof *y) == 0;
                const int f32_close = close_to_f64(y, x, wf, with_bias ? bias : NULL, m, n, k, use_amx);
                /* From cpu_quant_sgemm_min_m rows (32, or as SHARDLM_CPU_QUANT_SGEMM_MIN_M says) the
                 * tiles; below it the int8 product. */
                const int tiles = m >= 64 && m >= cpu_quant_sgemm_min_m();
                const int ok = guard_ok((uint8_t *)(y + m * n)) &&
                               (use_amx || tiles ? f32_close : m == 5 ? int8_equal || f32_close : int8_equal);
                if (as_decode) ok_decode &= guard_ok((uint8_t *)(y + m * n)) && int8_equal;
                else if (use_amx) ok_amx &= ok;
                else ok_mm &= ok;
                free(x);
                free(ref);
                free(y);
            }
    cpu_amx_set_enabled(amx_before);
    check(ok_decode, "%s through the CPU backend (%d threads) with rows_as_decode: quant_matmul's int8 product at "
          "every m (1 to 67)%s", quant_type_name(t), n_threads, amx ? ", AMX on" : "");
    if (amx) check(ok_amx, "%s through the CPU backend (%d threads) on AMX tiles at m 16/64/67: the f32 sum of the "
                   "bf16-rounded x and w within f32 reassociation", quant_type_name(t), n_threads);
    else printf("SKIP %s on AMX tiles: this CPU has no AMX-BF16\n", quant_type_name(t));
    free(wf);
    /* Embedding: ids inside the shard [10, 10 + n) and outside it. */
    int32_t ids[5] = {10, 46, 9, 47, 20};
    float *out = malloc((size_t)(5 * k) * sizeof *out + GUARD), *want = malloc((size_t)k * sizeof *want);
    memset(out + 5 * k, GUARD_BYTE, GUARD);
    struct tensor it = tensor_make(ids, DTYPE_I32, DEVICE_CPU, 1, (int64_t)5);
    struct tensor ot = tensor_make(out, DTYPE_F32, DEVICE_CPU, 2, (int64_t)5, k);
    op_embedding(b, &ot, &wt, &it, 10);
    int ok_emb = guard_ok((uint8_t *)(out + 5 * k));
    for (int i = 0; i < 5; i++) {
        const int64_t r = ids[i] - 10;
        if (r >= 0 && r < n) quant_dequantize_row(t, w + r * row, want, k);
        else memset(want, 0, (size_t)k * sizeof *want);
        ok_emb &= memcmp(out + i * k, want, (size_t)k * sizeof *want) == 0;
    }
    check(ok_geom && ok_mm && ok_emb,
          "%s through the CPU backend (%d threads): tensor geometry %s, op_matmul (+ bias) == "
          "quant_matmul at m 1/16, at m 64/67 %s %s, op_embedding rows == quant_dequantize_row, other shards' ids zero %s",
          quant_type_name(t), n_threads, ok_geom ? "ok" : "WRONG",
          64 >= cpu_quant_sgemm_min_m() ? "the f32 product of the dequantized w" : "quant_matmul's (int8 at every m)",
          ok_mm ? "ok" : "WRONG", ok_emb ? "ok" : "WRONG");
    free(out);
    free(want);
    free(w);
}

/* The packed layout (quant_pack_rows8) of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K: its product gives the stored
 * product's bits in every implementation, thread count and row count of x; every implementation
 * gives the same bits (the block-exact order, kernels/cpu/quant_impl.h), and a row of x gives the
 * same bits alone as among others; a row dequantized from the packed copy is the stored row's. */
static void check_packed(enum quant_type t)
{
    const int64_t n = 40, k = quant_block_size(t) == 32 ? 9 * 32 : 3 * 256, row = (int64_t)quant_row_bytes(t, k);
    uint8_t *w = malloc((size_t)(n * row)), *wp = malloc(quant_packed_bytes(t, n, k));
    fill_blocks(t, w, n * row / (int64_t)quant_block_bytes(t));
    quant_pack_rows8(t, wp, w, n, k);
    int ok_mm = 1, ok_impl = 1, ok_rows = 1, ok_deq = 1, n_runs = 0;
    static const int64_t ms[] = {1, 3, 5, 7, 17};
    float *x = malloc((size_t)(17 * k) * sizeof *x), *ref = malloc((size_t)(17 * n) * sizeof *ref);
    float *y = malloc((size_t)(17 * n) * sizeof *y), *first = malloc((size_t)(17 * n) * sizeof *first);
    for (int64_t i = 0; i < 17 * k; i++) x[i] = (float)(rnd_uniform() * 4 - 2);
    for (int im = 0; im < 5; im++) {
        const int64_t m = ms[im];
        int have_first = 0;
        for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
            if (!quant_impl_available((enum quant_impl)impl)) continue;
            for (int nt = 1; nt <= 2; nt++) {
                quant_matmul_impl((enum quant_impl)impl, t, ref, x, w, m, n, k, NULL, nt);
                memset(y, 0xff, (size_t)(m * n) * sizeof *y); /* NaNs: a row the product skips cannot pass */
                quant_matmul_packed_impl((enum quant_impl)impl, t, y, x, wp, m, n, k, NULL, nt);
                ok_mm &= memcmp(y, ref, (size_t)(m * n) * sizeof *y) == 0;
                if (!have_first) memcpy(first, ref, (size_t)(m * n) * sizeof *ref), have_first = 1;
                ok_impl &= memcmp(first, ref, (size_t)(m * n) * sizeof *ref) == 0;
                n_runs++;
            }
        }
        /* Each row of x alone (m = 1, the row path) against the same row among m. */
        for (int64_t i = 0; i < m; i++) {
            quant_matmul(t, y, x + i * k, w, 1, n, k, NULL, 1);
            ok_rows &= memcmp(y, first + i * n, (size_t)n * sizeof *y) == 0;
        }
    }
    float *a = malloc((size_t)k * sizeof *a), *b = malloc((size_t)k * sizeof *b);
    float *many = malloc((size_t)(n * k) * sizeof *many);
    quant_dequantize_rows_packed(t, wp, 3, n - 5, many, k); /* rows 3 .. n - 3: partial groups at both ends */
    for (int64_t j = 0; j < n; j++) {
        quant_dequantize_row(t, w + j * row, a, k);
        quant_dequantize_row_packed(t, wp, j, b, k);
        ok_deq &= memcmp(a, b, (size_t)k * sizeof *a) == 0;
        if (j >= 3 && j < n - 2) ok_deq &= memcmp(a, many + (j - 3) * k, (size_t)k * sizeof *a) == 0;
    }
    free(many);
    check(ok_mm && ok_impl && ok_rows && ok_deq && n_runs >= 8,
          "%s packed eight rows at a time (n %lld, k %lld, m 1/3/5/7/17, 1 and 2 threads, %d runs): packed product == "
          "stored product %s, every implementation the same bits %s, a row alone == among others %s, rows dequantized "
          "from the packed copy == stored %s", quant_type_name(t), (long long)n, (long long)k, n_runs,
          ok_mm ? "ok" : "WRONG", ok_impl ? "ok" : "WRONG", ok_rows ? "ok" : "WRONG", ok_deq ? "ok" : "WRONG");
    free(a), free(b), free(x), free(ref), free(y), free(first), free(w), free(wp);
}

/* The 32-element packed types on AMX int8 tiles (kernels/cpu/quant_amx.c), from 2 rows of x: the
 * stored product's bits (the VNNI kernels') at every row count a step meets (2..16 in one call,
 * 17 and 33 as 16 + 1 and 16 + 16 + 1), over one, two and three groups in flight (n 328 and 680:
 * calls of 2, 4 and 8 groups and last ones of 1, 3 and 5), an odd block count, 1 and 2 threads.
 * SKIP on a CPU without the tiles. */
static void check_packed_amx(enum quant_type t)
{
    if (!quant_amx_int8_on()) {
        printf("SKIP %s on AMX int8 tiles: %s\n", quant_type_name(t),
               cpu_amx_enabled() ? "SHARDLM_CPU_AMX_INT8=0" : "this CPU has no AMX (or it is off)");
        return;
    }
    static const int64_t ns[] = {328, 680}, ms[] = {2, 3, 4, 5, 8, 16, 17, 33};
    const int64_t k = 9 * 32, row = (int64_t)quant_row_bytes(t, k), mmax = 33;
    int ok = 1, runs = 0;
    for (int in = 0; in < 2; in++) {
        const int64_t n = ns[in];
        uint8_t *w = malloc((size_t)(n * row)), *wp = malloc(quant_packed_bytes(t, n, k));
        float *x = malloc((size_t)(mmax * k) * sizeof *x), *ref = malloc((size_t)(mmax * n) * sizeof *ref);
        float *y = malloc((size_t)(mmax * n) * sizeof *y);
        fill_blocks(t, w, n * row / (int64_t)quant_block_bytes(t));
        quant_pack_rows8(t, wp, w, n, k);
        for (int64_t i = 0; i < mmax * k; i++) x[i] = (float)(rnd_uniform() * 4 - 2);
        for (size_t im = 0; im < sizeof ms / sizeof *ms; im++)
            for (int nt = 1; nt <= 2; nt++) {
                const int64_t m = ms[im];
                quant_matmul_impl(QUANT_IMPL_AVX512_VNNI, t, ref, x, w, m, n, k, NULL, nt);
                quant_matmul_packed_impl(QUANT_IMPL_AVX512_VNNI, t, y, x, wp, m, n, k, NULL, nt);
                ok &= memcmp(y, ref, (size_t)(m * n) * sizeof *y) == 0;
                runs++;
            }
        free(w), free(wp), free(x), free(ref), free(y);
    }
    check(ok && runs == 32, "%s packed on AMX int8 tiles (n 328 and 680, k %lld, m 2..33, 1 and 2 threads): the stored "
          "product's bits %s", quant_type_name(t), (long long)k, ok ? "ok" : "WRONG");
}

/* MXFP4's scale and its 17-byte blocks. The E8M0 byte e is half a scale of 2^(e - 127) (the
 * values are the E2M1 floats doubled): element values against 2^(e - 128) computed in f64 for
 * every e that matters (0 and 1 the f32 subnormals 2^-128 and 2^-127 of ggml's
 * ggml_e8m0_to_fp32_half, 254 and 255 the top, where 12 * 2^(e - 128) passes FLT_MAX and gives
 * +Inf); then rows that start at odd addresses (a row of one block is 17 bytes, and here the
 * whole matrix starts one byte past an aligned one): every implementation's product and
 * dequantization the same bits as from an aligned copy. */
static void check_mxfp4(void)
{
    /* The OCP MX spec's reading: X = 2^(e - 127) * E2M1(nibble), E2M1 sign bit 3 and magnitudes
     * below; nibble 8 (E2M1's -0) is +0 in ggml (its value is the integer 0). Element j of the
     * block holds nibble j, element 16 + j nibble 15 - j. */
    static const double e2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    uint8_t blk[17];
    for (int j = 0; j < 16; j++) blk[1 + j] = (uint8_t)(j | (15 - j) << 4);
    int ok = 1;
    for (int e = 0; e < 256; e++)
        for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
            if (!quant_impl_available((enum quant_impl)impl)) continue;
            blk[0] = (uint8_t)e;
            float y[32];
            quant_dequantize_row_impl((enum quant_impl)impl, QUANT_TYPE_MXFP4, blk, y, 32);
            for (int j = 0; j < 32; j++) {
                const int q = j < 16 ? j : 31 - j;
                double want = ldexp(1.0, e - 127) * (q & 8 ? -e2m1[q & 7] : e2m1[q & 7]) + 0.0;
                if (fabs(want) > FLT_MAX) want = copysign(INFINITY, want); /* else exact in f32 */
                if ((double)y[j] != want || !signbit(y[j]) != !signbit(want)) {
                    if (ok) printf("     MXFP4 e=%d %s: element %d is %.9g, want %.9g\n", e,
                                   quant_impl_name((enum quant_impl)impl), j, y[j], want);
                    ok = 0;
                }
            }
        }
    uint32_t bits0, bits1;
    float y[32];
    blk[0] = 0;
    quant_dequantize_row(QUANT_TYPE_MXFP4, blk, y, 32);
    memcpy(&bits0, &y[2], 4); /* nibble 2: the value 2 times the half scale */
    blk[0] = 1;
    quant_dequantize_row(QUANT_TYPE_MXFP4, blk, y, 32);
    memcpy(&bits1, &y[2], 4);
    check(ok && bits0 == 0x00400000 && bits1 == 0x00800000,
          "MXFP4 values: 2^(e - 127) E2M1(q) for every e 0 .. 255 and nibble q in every implementation (e 0 and 1 "
          "through ggml's e8m0 half rule: halves 2^-128 and 2^-127, 2 x them the bits 0x00400000, 0x00800000), +-Inf past FLT_MAX");

    /* n rows of k = 32 or 96 (17 or 51 bytes) at an odd base address. */
    int ok_mm = 1, ok_deq = 1;
    for (int64_t k = 32; k <= 96; k += 64) {
        const int64_t m = 5, n = 9, row = (int64_t)quant_row_bytes(QUANT_TYPE_MXFP4, k);
        uint8_t *w0 = malloc((size_t)(n * row)), *buf = malloc((size_t)(n * row) + 1), *w1 = buf + 1;
        fill_blocks(QUANT_TYPE_MXFP4, w0, n * k / 32);
        memcpy(w1, w0, (size_t)(n * row));
        float *x = malloc((size_t)(m * k) * sizeof *x), *y0 = malloc((size_t)(m * n) * sizeof *y0);
        float *y1 = malloc((size_t)(m * n) * sizeof *y1), *r0 = malloc((size_t)k * sizeof *r0), *r1 = malloc((size_t)k * sizeof *r1);
        for (int64_t i = 0; i < m * k; i++) x[i] = (float)(rnd_uniform() * 4 - 2);
        for (int impl = 0; impl < QUANT_IMPL_COUNT; impl++) {
            if (!quant_impl_available((enum quant_impl)impl)) continue;
            quant_matmul_impl((enum quant_impl)impl, QUANT_TYPE_MXFP4, y0, x, w0, m, n, k, NULL, 1);
            quant_matmul_impl((enum quant_impl)impl, QUANT_TYPE_MXFP4, y1, x, w1, m, n, k, NULL, 2);
            ok_mm &= memcmp(y0, y1, (size_t)(m * n) * sizeof *y0) == 0;
            for (int64_t j = 0; j < n; j++) {
                quant_dequantize_row_impl((enum quant_impl)impl, QUANT_TYPE_MXFP4, w0 + j * row, r0, k);
                quant_dequantize_row_impl((enum quant_impl)impl, QUANT_TYPE_MXFP4, w1 + j * row, r1, k);
                ok_deq &= memcmp(r0, r1, (size_t)k * sizeof *r0) == 0;
            }
        }
        free(w0), free(buf), free(x), free(y0), free(y1), free(r0), free(r1);
    }
    check(ok_mm && ok_deq, "MXFP4 rows of 17 and 51 bytes from an odd base address: every implementation's product %s "
          "and dequantization %s the aligned copy's bits", ok_mm ? "==" : "!=", ok_deq ? "==" : "!=");
}

/* Packed block w (as model_load packs it) through op_matmul on the CPU backend: where the int8
 * products take packed weights at every row count (cpu_quant_int8_packed), a product of fewer
 * than cpu_quant_amx_packed_min_m rows is quant_matmul's int8 product bit for bit, AMX on or off;
 * from that many rows with AMX on it takes the tiles: the unpacked w's product on the tiles bit
 * for bit (dequantized from the packed copy), not the int8 one. */
static void check_packed_backend(struct backend *b, int n_threads)
{
    const enum quant_type t = QUANT_TYPE_Q4_K;
    const int64_t n = 24, k = 3 * 256, row = (int64_t)quant_row_bytes(t, k);
    if (!cpu_quant_int8_packed()) {
        printf("SKIP packed weights' row threshold (%d threads): packed weights take the int8 products at every row "
               "count only with SIMD int8 products and SHARDLM_CPU_QUANT_SGEMM_MIN_M unset\n", n_threads);
        return;
    }
    const int thr = cpu_quant_amx_packed_min_m();
    uint8_t *w = malloc((size_t)(n * row)), *wp = malloc(quant_packed_bytes(t, n, k));
    fill_blocks(t, w, n * row / (int64_t)quant_block_bytes(t));
    quant_pack_rows8(t, wp, w, n, k);
    const enum dtype dt = (enum dtype)dtype_of_quant_type((uint32_t)t);
    struct tensor wt = tensor_make(w, dt, DEVICE_CPU, 2, n, k), plain = wt;
    wt.packed = wp, wt.packed_of = w, wt.packed_rows = n, wt.packed_cols = k;
    const int amx_before = cpu_amx_set_enabled(1), amx = cpu_amx_enabled();
    const int64_t ms[] = {1, thr > 1 ? thr - 1 : 1, thr};
    int ok_int8 = 1, ok_tiles = 1, n_tiles = 0;
    for (int im = 0; im < 3; im++) {
        const int64_t m = ms[im];
        float *x = malloc((size_t)(m * k) * sizeof *x), *y = malloc((size_t)(m * n) * sizeof *y);
        float *ref = malloc((size_t)(m * n) * sizeof *ref), *tiles = malloc((size_t)(m * n) * sizeof *tiles);
        for (int64_t i = 0; i < m * k; i++) x[i] = (float)(rnd_uniform() * 4 - 2);
        struct tensor xt = tensor_make(x, DTYPE_F32, DEVICE_CPU, 2, m, k);
        struct tensor yt = tensor_make(y, DTYPE_F32, DEVICE_CPU, 2, m, n);
        struct tensor tt = tensor_make(tiles, DTYPE_F32, DEVICE_CPU, 2, m, n);
        quant_matmul(t, ref, x, w, m, n, k, NULL, n_threads);
        for (int on = 0; on <= amx; on++) {
            cpu_amx_set_enabled(on);
            op_matmul(b, &yt, &xt, &wt, NULL);
            const int int8_equal = memcmp(y, ref, (size_t)(m * n) * sizeof *y) == 0;
            if (on && m >= thr && m >= 8) {
                op_matmul(b, &tt, &xt, &plain, NULL); /* unpacked w from 8 rows: the tiles */
                ok_tiles &= memcmp(y, tiles, (size_t)(m * n) * sizeof *y) == 0 && !int8_equal;
                n_tiles++;
            } else {
                ok_int8 &= int8_equal;
            }
        }
        free(x), free(y), free(ref), free(tiles);
    }
    cpu_amx_set_enabled(amx_before);
    check(ok_int8, "packed Q4_K through the CPU backend (%d threads) at m 1 and %d (under the tiles' %d rows for "
          "packed weights): quant_matmul's int8 product bit for bit, AMX %s", n_threads, (int)ms[1], thr,
          amx ? "on and off" : "absent");
    if (amx && thr >= 8)
        check(ok_tiles && n_tiles == 1, "packed Q4_K through the CPU backend (%d threads) at m %d (AMX on): the "
              "tiles' product of the unpacked w bit for bit, not the int8 one", n_threads, thr);
    else
        printf("SKIP packed weights on AMX tiles (%d threads): %s\n", n_threads,
               amx ? "the tiles' threshold for packed weights is under 8 rows" : "this CPU has no AMX-BF16");
    free(w), free(wp);
}

int main(void)
{
    snprintf(tmp_path, sizeof tmp_path, "/tmp/test_quant_%d.gguf", (int)getpid());
    printf("best implementation here: %s\n", quant_impl_name(quant_impl_best()));
    check(quant_type_supported(QUANT_TYPE_Q4_K) && !quant_type_supported(9) &&
              quant_block_size(QUANT_TYPE_Q6_K) == 256 && quant_block_bytes(QUANT_TYPE_Q6_K) == 210 &&
              quant_row_bytes(QUANT_TYPE_Q8_0, 640) == 20 * 34 && quant_block_size(1) == 0 &&
              quant_block_size(QUANT_TYPE_MXFP4) == 32 && quant_block_bytes(QUANT_TYPE_MXFP4) == 17 &&
              quant_row_bytes(QUANT_TYPE_MXFP4, 2880) == 1530 && quant_row_bytes(QUANT_TYPE_MXFP4, 32) == 17 &&
              !strcmp(quant_type_name(39), "MXFP4") && dtype_of_quant_type(39) == DTYPE_MXFP4 &&
              !strcmp(dtype_name(DTYPE_MXFP4), "mxfp4"),
          "geometry: supported types, block sizes and row bytes");
    for (int i = 0; i < N_TYPES; i++) check_type(types[i]);
    check_mxfp4();
    check_packed(QUANT_TYPE_Q4_0);
    check_packed(QUANT_TYPE_Q4_1);
    check_packed(QUANT_TYPE_Q8_0);
    check_packed(QUANT_TYPE_Q4_K);
    check_packed(QUANT_TYPE_Q5_0);
    check_packed(QUANT_TYPE_Q5_1);
    check_packed(QUANT_TYPE_Q6_K);
    check_packed_amx(QUANT_TYPE_Q8_0);
    check_packed_amx(QUANT_TYPE_Q4_0);
    check_packed_amx(QUANT_TYPE_Q4_1);
    check_packed_amx(QUANT_TYPE_Q5_0);
    check_packed_amx(QUANT_TYPE_Q5_1);
    check(!quant_packable(QUANT_TYPE_IQ4_NL, 8, 32) && !quant_packable(QUANT_TYPE_MXFP4, 8, 64) && !quant_packable(QUANT_TYPE_Q5_K, 8, 256) &&
              quant_packable(QUANT_TYPE_Q6_K, 8, 256) && !quant_packable(QUANT_TYPE_Q6_K, 8, 128) &&
              quant_packed_bytes(QUANT_TYPE_Q6_K, 16, 256) == 16 * quant_row_bytes(QUANT_TYPE_Q6_K, 256) &&
              !quant_packable(QUANT_TYPE_Q4_K, 8, 32) && !quant_packable(QUANT_TYPE_Q4_1, 12, 32) &&
              quant_packable(QUANT_TYPE_Q8_0, 16, 64) && quant_packable(QUANT_TYPE_Q4_K, 8, 512) &&
              quant_packed_bytes(QUANT_TYPE_Q4_K, 8, 512) == 2 * 1184 &&
              quant_packed_bytes(QUANT_TYPE_Q4_1, 16, 64) == 16 * quant_row_bytes(QUANT_TYPE_Q4_1, 64),
          "quant_packable / quant_packed_bytes: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K with rows in eights only");
    /* k == 0: y is zeroed; m == 0 or n == 0: nothing is written. */
    float y[3] = {1, 2, 3};
    quant_matmul(QUANT_TYPE_Q8_0, y, NULL, NULL, 1, 2, 0, NULL, 1);
    quant_matmul(QUANT_TYPE_Q8_0, y + 2, NULL, NULL, 0, 5, 32, NULL, 1);
    check(y[0] == 0.0f && y[1] == 0.0f && y[2] == 3.0f, "k == 0 zeroes y; m == 0 writes nothing");
    for (int nt = 1; nt <= 2; nt++) {
        struct backend *b = NULL;
        CHECK(backend_open(DEVICE_CPU, 0, nt, &b) == STATUS_OK, "cpu backend");
        for (int i = 0; i < N_TYPES; i++) check_backend_ops(b, nt, types[i]);
        check_packed_backend(b, nt);
        backend_close(b);
    }
    unlink(tmp_path);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
