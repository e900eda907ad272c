/* tests/test_matmul_half.c - the CPU backend's products against bf16 and f16 weights
 * (kernels/cpu/matmul.c, gemv.c, bf16_dot.c). Decode (cpu_gemv_rows_typed): where the gemv kernel
 * reads them in place (widened in registers), one row of x must give, bit for bit, what the same
 * product gives with the weights widened to f32 first, both as an f32 weight (the f32 gemv) and as
 * the rows of a batched decode step (rows_as_decode, which widens blocks of w into scratch); and
 * every result must be the float64 product within f32 rounding (and the f16 rounding of y where
 * the activations are f16: f16 weights are checked beside f16 and f32 activations, bf16 ones
 * beside f32, as the CPU serves both). Shapes cover each kernel's tails (k not a multiple of 16 or
 * 64, rows not a multiple of 8), subnormal f16 weights, and 1 and 2 threads. Prefill rows against
 * bf16 weights (check_rows): with vdpbf16ps the float64 product of the bf16-rounded x, told apart
 * from the unrounded one; without it the unrounded one. AMX is turned off here (bf16 weights take
 * the tiles there, a product of x rounded to bf16). Runs at every ISA level and with each gemv
 * knob (tests/isa.cmake). Also dtype_convert's f16 widening (F16C where the CPU has it) against
 * f16_to_f32 over all 65,536 values. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/cpu_isa.h"
#include "cpu/cpu_ops.h"
#include "ops.h"
#include "tensor.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double rnd(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / (double)(1ull << 52) - 1.0;
}

/* Half-precision values of dtype at (bf16 or f16). */
static uint16_t to_half(enum dtype at, float v) { return at == DTYPE_BF16 ? f32_to_bf16(v) : f32_to_f16(v); }
static float from_half(enum dtype at, uint16_t h) { return at == DTYPE_BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

/* One shape: 0 on any mismatch, with the first one printed. */
static int check_shape(struct backend *b, enum dtype dt, enum dtype at, int64_t n, int64_t k, double *worst)
{
    const int64_t m = 3;
    const size_t as = dtype_size(at);
    uint16_t *wh = malloc((size_t)(n * k) * sizeof *wh);
    float *wf = malloc((size_t)(n * k) * sizeof *wf), *x = malloc((size_t)(m * k) * sizeof *x);
    void *xa = malloc((size_t)(m * k) * as), *y1 = malloc((size_t)(m * n) * as), *yb = malloc((size_t)(m * n) * as);
    float *yf = malloc((size_t)(m * n) * sizeof *yf);
    for (int64_t i = 0; i < n * k; i++) {
        /* every 7th weight tiny: f16 subnormals (below 6.1e-5) */
        wh[i] = to_half(dt, (float)(i % 7 == 3 ? rnd() * 3e-5 : rnd()));
        wf[i] = from_half(dt, wh[i]);
    }
    for (int64_t i = 0; i < m * k; i++) {
        x[i] = (float)(2.0 * rnd());
        if (at == DTYPE_F16) ((uint16_t *)xa)[i] = f32_to_f16(x[i]), x[i] = f16_to_f32(((uint16_t *)xa)[i]);
        else ((float *)xa)[i] = x[i];
    }
    const struct tensor tw = tensor_make(wh, dt, DEVICE_CPU, 2, n, k);
    const struct tensor twf = tensor_make(wf, DTYPE_F32, DEVICE_CPU, 2, n, k);
    for (int64_t i = 0; i < m; i++) {
        const struct tensor xi = tensor_make((char *)xa + (size_t)(i * k) * as, at, DEVICE_CPU, 2, 1, k);
        const struct tensor xf = tensor_make(x + i * k, DTYPE_F32, DEVICE_CPU, 2, 1, k);
        const struct tensor t1 = tensor_make((char *)y1 + (size_t)(i * n) * as, at, DEVICE_CPU, 2, 1, n);
        const struct tensor tf = tensor_make(yf + i * n, DTYPE_F32, DEVICE_CPU, 2, 1, n);
        op_matmul(b, &t1, &xi, &tw, NULL);
        op_matmul(b, &tf, &xf, &twf, NULL);
    }
    const struct tensor tx = tensor_make(xa, at, DEVICE_CPU, 2, m, k);
    const struct tensor tb = tensor_make(yb, at, DEVICE_CPU, 2, m, n);
    b->rows_as_decode = 1;
    op_matmul(b, &tb, &tx, &tw, NULL);
    b->rows_as_decode = 0;
    int ok = 1;
    for (int64_t i = 0; i < m && ok; i++)
        for (int64_t j = 0; j < n && ok; j++) {
            double ref = 0.0, mag = 0.0;
            for (int64_t c = 0; c < k; c++) {
                ref += (double)wf[j * k + c] * (double)x[i * k + c];
                mag += fabs((double)wf[j * k + c] * (double)x[i * k + c]);
            }
            const size_t o = (size_t)(i * n + j);
            /* the f32 weights' product in the activations' dtype, as the half path rounds y */
            const float f = yf[o];
            const uint16_t fh = at == DTYPE_F16 ? f32_to_f16(f) : 0;
            const void *want = at == DTYPE_F16 ? (const void *)&fh : (const void *)&f;
            const float g = at == DTYPE_F16 ? f16_to_f32(((uint16_t *)y1)[o]) : ((float *)y1)[o];
            const double bound = (double)k * FLT_EPSILON * mag + (at == DTYPE_F16 ? fabs(ref) / 2048.0 + 6e-8 : 0.0);
            const double err = fabs((double)g - ref) / (bound + DBL_MIN);
            if (err > *worst) *worst = err;
            if (memcmp((char *)y1 + o * as, want, as) || memcmp((char *)yb + o * as, want, as) || err > 1.0) {
                printf("  %s n=%lld k=%lld row %lld col %lld: in place %.9g, f32 weights %.9g, float64 %.9g\n",
                       dtype_name(dt), (long long)n, (long long)k, (long long)i, (long long)j, (double)g, (double)f, ref);
                ok = 0;
            }
        }
    free(wh), free(wf), free(x), free(xa), free(y1), free(yf), free(yb);
    return ok;
}

/* bf16 w against m rows of f32 x through op_matmul (no invariance asked): with vdpbf16ps
 * (cpu_bf16_dot_enabled) every element must be the float64 product of x rounded to bf16 and w
 * within f32 reassociation, and some element must be farther than that bound from the product of
 * the unrounded x (so that the rounding is the one claimed); without it, the unrounded product's
 * bound. Returns 0 on a failure, with the first one printed. */
static int check_rows(struct backend *b, int64_t m, int64_t n, int64_t k, int dot, double *worst)
{
    uint16_t *wh = malloc((size_t)(n * k) * sizeof *wh);
    float *x = malloc((size_t)(m * k) * sizeof *x), *y = malloc((size_t)(m * n) * sizeof *y);
    for (int64_t i = 0; i < n * k; i++) wh[i] = f32_to_bf16((float)rnd());
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)(2.0 * rnd());
    const struct tensor tw = tensor_make(wh, DTYPE_BF16, DEVICE_CPU, 2, n, k);
    const struct tensor tx = tensor_make(x, DTYPE_F32, DEVICE_CPU, 2, m, k);
    const struct tensor ty = tensor_make(y, DTYPE_F32, DEVICE_CPU, 2, m, n);
    op_matmul(b, &ty, &tx, &tw, NULL);
    int ok = 1, apart = 0;
    for (int64_t i = 0; i < m && ok; i++)
        for (int64_t j = 0; j < n && ok; j++) {
            double rounded = 0.0, exact = 0.0, mag = 0.0;
            for (int64_t c = 0; c < k; c++) {
                const double wv = (double)bf16_to_f32(wh[j * k + c]);
                rounded += wv * (double)bf16_to_f32(f32_to_bf16(x[i * k + c]));
                exact += wv * (double)x[i * k + c];
                mag += fabs(wv * (double)x[i * k + c]);
            }
            const double bound = (double)k * FLT_EPSILON * mag + 1e-30, g = (double)y[i * n + j];
            const double err = fabs(g - (dot ? rounded : exact)) / bound;
            if (err > *worst) *worst = err;
            apart |= fabs(g - exact) > bound;
            if (err > 1.0) {
                printf("  m=%lld n=%lld k=%lld row %lld col %lld: %.9g, float64 %.9g (x rounded to bf16) %.9g (not)\n",
                       (long long)m, (long long)n, (long long)k, (long long)i, (long long)j, g, rounded, exact);
                ok = 0;
            }
        }
    if (dot && ok && !apart) {
        printf("  m=%lld n=%lld k=%lld: within the bound of the unrounded product too\n", (long long)m, (long long)n,
               (long long)k);
        ok = 0;
    }
    free(wh), free(x), free(y);
    return ok;
}

int main(void)
{
    static const int64_t shapes[][2] = {{37, 1},  {37, 15},  {40, 17},  {64, 100}, {19, 256},
                                        {9, 2048}, {16, 64}, {300, 773}, {1, 33},   {600, 520}};
    const int amx_was = cpu_amx_set_enabled(0);
    printf("kernels: gemv %s\n", cpu_gemv_path());
    /* What widened rows go through (dtype_convert: F16C where the CPU has it): every f16 value. */
    static uint16_t all[65536];
    static float wide[65536];
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    dtype_convert(wide, DTYPE_F32, all, DTYPE_F16, 65536);
    int same = 0;
    for (int i = 0; i < 65536; i++) {
        const float want = f16_to_f32(all[i]);
        same += isnan(want) ? isnan(wide[i]) : !memcmp(&wide[i], &want, sizeof want);
    }
    check(same == 65536, "dtype_convert f16 -> f32: %d of 65536 values equal f16_to_f32's (NaN as NaN)", same);
    for (int nt = 1; nt <= 2; nt++) {
        struct backend *b = NULL;
        CHECK(backend_open(DEVICE_CPU, 0, nt, &b) == STATUS_OK, "cpu backend");
        /* bf16 and f16 weights beside f32 activations (how the CPU serves them), f16 beside f16. */
        static const enum dtype kinds[][2] = {{DTYPE_BF16, DTYPE_F32}, {DTYPE_F16, DTYPE_F32}, {DTYPE_F16, DTYPE_F16}};
        for (size_t d = 0; d < sizeof kinds / sizeof *kinds; d++) {
            const enum dtype dt = kinds[d][0], at = kinds[d][1];
            int ok = 1;
            double worst = 0.0;
            for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
                ok &= check_shape(b, dt, at, shapes[s][0], shapes[s][1], &worst);
            check(ok, "%s weights, %s x, %d thread(s), gemv %s: one row equals the f32 weights' product and the decode "
                  "rows' bit for bit, within f32 rounding of float64 (worst %.3f of the bound) over %zu shapes",
                  dtype_name(dt), dtype_name(at), nt, cpu_gemv_path(), worst, sizeof shapes / sizeof *shapes);
        }
        /* Prefill rows: vdpbf16ps where the CPU has AVX512-BF16 (and the tiles are off). */
        static const int64_t rows[][3] = {{2, 37, 64}, {7, 40, 17}, {6, 32, 256}, {13, 300, 773}, {64, 600, 520}, {5, 16, 1}};
        const int dot = cpu_bf16_dot_enabled();
        int ok = 1;
        double worst = 0.0;
        for (size_t s = 0; s < sizeof rows / sizeof *rows; s++) ok &= check_rows(b, rows[s][0], rows[s][1], rows[s][2], dot, &worst);
        check(ok, "bf16 weights, %d thread(s), 2 to 64 rows of x: %s (worst %.3f of the f32 reassociation bound)", nt,
              dot ? "vdpbf16ps, the product of x rounded to bf16" : "the f32 product of the widened weights", worst);
        backend_close(b);
    }
    if (!cpu_bf16_dot_enabled())
        printf("SKIP vdpbf16ps products: %s\n", cpu_bf16_dot_supported() ? "turned off (SHARDLM_CPU_BF16_DOT=0)"
                                                                        : "this CPU (or SHARDLM_CPU_ISA) has no AVX512-BF16");
    cpu_amx_set_enabled(amx_was);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
