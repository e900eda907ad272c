/* kernels/cpu/gemv.c - the one-row product decode's weights stream through: y[j] = w_rows[j] . x
 * for the rows of a block of w, f32 / bf16 / f16 weights read in place (half precision widened
 * in registers, exactly). Kernels: eight rows per pass or one row after the other (the knob
 * SHARDLM_CPU_GEMV_ROWS), 512- or 256-bit vectors (SHARDLM_CPU_GEMV_BITS; both read in
 * matmul.c's knobs), at the level cpu_isa() allows; gemv_kernel picks one, cpu_gemv_path names
 * it for the cpu log line. matmul.c calls cpu_gemv_rows / cpu_gemv_rows_typed (cpu_ops.h).
 * Tests: tests/test_ops.c (matmul at every level and knob: ops_cpu_gemv_rows*),
 * tests/test_matmul_half.c (half-precision rows against their widened f32 sums, bit for bit),
 * tests/test_cpu_isa.c (the kernel each level and knob takes). */
#include <stdint.h>

#include "cpu_isa.h"
#include "cpu_ops.h"

/* y[j] = w_rows[j] . x for j < nb (rows of k): eight rows of w per pass over x (then four, then
 * one), each sum in vector lanes (omp simd lets the compiler reassociate it). Decode's f32
 * products are this and nothing else: with four rows it decoded the stories110M shape 4 % faster
 * than OpenBLAS's sgemv (31.2-31.7 against 30.0-30.4 tok/s at one thread, 59.2-60.1 against
 * 57.3-58.1 at two, alternating runs, 2026-11-25), eight rows another 3 % (30.3-32.3 against
 * 29.4-30.8; 59.7-60.0 against 57.5-58.5); prefetching 1 KiB ahead in chunks of 16 halved it
 * (the sums were reduced per chunk).
 * One copy per vector width (the body inlined into each), chosen per call by cpu_isa() so
 * that SHARDLM_CPU_ISA can force any of them (cpu_gemv_rows). */
__attribute__((always_inline)) static inline void gemv_rows_body(float *y, const float *w_rows,
                                                                 const float *x, int64_t nb, int64_t k)
{
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
        const float *w0 = w_rows + j * k;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, s4 = 0.0f, s5 = 0.0f, s6 = 0.0f, s7 = 0.0f;
        #pragma omp simd reduction(+ : s0, s1, s2, s3, s4, s5, s6, s7)
        for (int64_t c = 0; c < k; c++) {
            s0 += w0[c] * x[c];
            s1 += w0[k + c] * x[c];
            s2 += w0[2 * k + c] * x[c];
            s3 += w0[3 * k + c] * x[c];
            s4 += w0[4 * k + c] * x[c];
            s5 += w0[5 * k + c] * x[c];
            s6 += w0[6 * k + c] * x[c];
            s7 += w0[7 * k + c] * x[c];
        }
        y[j] = s0, y[j + 1] = s1, y[j + 2] = s2, y[j + 3] = s3;
        y[j + 4] = s4, y[j + 5] = s5, y[j + 6] = s6, y[j + 7] = s7;
    }
    for (; j + 4 <= nb; j += 4) {
        const float *w0 = w_rows + j * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
        #pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t c = 0; c < k; c++) {
            s0 += w0[c] * x[c];
            s1 += w1[c] * x[c];
            s2 += w2[c] * x[c];
            s3 += w3[c] * x[c];
        }
        y[j] = s0, y[j + 1] = s1, y[j + 2] = s2, y[j + 3] = s3;
    }
    for (; j < nb; j++) {
        const float *w0 = w_rows + j * k;
        float s0 = 0.0f;
        #pragma omp simd reduction(+ : s0)
        for (int64_t c = 0; c < k; c++) s0 += w0[c] * x[c];
        y[j] = s0;
    }
}

static void gemv_rows_default(float *y, const float *w_rows, const float *x, int64_t nb, int64_t k)
{
    gemv_rows_body(y, w_rows, x, nb, k);
}

/* The weights' element types the gemv reads: f32 in place, and bf16 or f16 (the intrinsics
 * kernels below widen them in registers, exactly: every bf16 and f16 value is an f32 value), so
 * that a half-precision decode reads each weight's 2 bytes once where it widened blocks of rows
 * into scratch and read them again. The products and their order are the f32 kernel's: a row's
 * sum is the same bits whichever the weights' type, and cpu_gemv_reads says where. */
enum gemv_w { GEMV_W_F32, GEMV_W_BF16, GEMV_W_F16 };

/* w[c] as f32 (the tails). */
__attribute__((always_inline)) static inline float gemv_w1(const void *w, int64_t c, enum gemv_w kind)
{
    const uint16_t *h = w;
    return kind == GEMV_W_BF16 ? bf16_to_f32(h[c]) : kind == GEMV_W_F16 ? f16_to_f32(h[c]) : ((const float *)w)[c];
}

/* Row j of w_rows (rows of k weights of the type kind). */
__attribute__((always_inline)) static inline const void *gemv_row(const void *w_rows, int64_t j, int64_t k, enum gemv_w kind)
{
    return (const char *)w_rows + (size_t)(j * k) * (kind == GEMV_W_F32 ? sizeof(float) : sizeof(uint16_t));
}

#if defined(__x86_64__)
#include <immintrin.h>

#define GEMV_512 __attribute__((target("avx512f"), always_inline)) static inline
#define GEMV_256 __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* 16 weights from w + c as f32. */
GEMV_512 __m512 gemv_load16(const void *w, int64_t c, enum gemv_w kind)
{
    const __m256i *h = (const __m256i *)((const uint16_t *)w + c);
    if (kind == GEMV_W_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(h)), 16));
    if (kind == GEMV_W_F16) return _mm512_cvtph_ps(_mm256_loadu_si256(h));
    return _mm512_loadu_ps((const float *)w + c);
}

/* The k - c (1 to 15) weights from w + c as f32 and zeros after them, as a masked load of f32. */
GEMV_512 __m512 gemv_load16_tail(const void *w, int64_t c, int64_t k, enum gemv_w kind)
{
    if (kind == GEMV_W_F32) return _mm512_maskz_loadu_ps((__mmask16)((1u << (k - c)) - 1), (const float *)w + c);
    float t[16] = {0};
    for (int64_t i = c; i < k; i++) t[i - c] = gemv_w1(w, i, kind);
    return _mm512_loadu_ps(t);
}

/* 8 weights from w + c as f32. */
GEMV_256 __m256 gemv_load8(const void *w, int64_t c, enum gemv_w kind)
{
    const __m128i *h = (const __m128i *)((const uint16_t *)w + c);
    if (kind == GEMV_W_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
    if (kind == GEMV_W_F16) return _mm256_cvtph_ps(_mm_loadu_si128(h));
    return _mm256_loadu_ps((const float *)w + c);
}

/* A row's sum from its accumulator v (the lanes added pairwise), then its columns c .. k - 1 added
 * in order with scalar fused multiply-adds. */
GEMV_256 float gemv_finish8(__m256 v, const void *w, const float *x, int64_t c, int64_t k, enum gemv_w kind)
{
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    float sum = _mm_cvtss_f32(h);
    for (; c < k; c++) sum = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(gemv_w1(w, c, kind)), _mm_set_ss(x[c]), _mm_set_ss(sum)));
    return sum;
}

/* The other order of the same products (gemv_rows_per_pass 1): y[j] = w_rows[j] . x one row
 * after the other, so that the weights stream from memory as one sequential read (the rows are
 * contiguous), where the eight-row pass reads eight places 4 k bytes apart. Four accumulators of
 * a vector each, then one vector at a time, then the tail (masked with AVX-512, scalar with
 * AVX2); the lanes are summed once per row. On the AMD EPYC VM of 2026-11-30 (AVX-512, no AMX)
 * it decoded the stories110M shape at one thread at 41-43 tok/s against 33-36 for eight rows
 * (docs/performance.md). */
GEMV_512 void gemv_row1_avx512_body(float *y, const void *w_rows, const float *x, int64_t nb, int64_t k,
                                    enum gemv_w kind)
{
    for (int64_t j = 0; j < nb; j++) {
        const void *w = gemv_row(w_rows, j, k, kind);
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
        int64_t c = 0;
        for (; c + 64 <= k; c += 64) {
            a0 = _mm512_fmadd_ps(gemv_load16(w, c, kind), _mm512_loadu_ps(x + c), a0);
            a1 = _mm512_fmadd_ps(gemv_load16(w, c + 16, kind), _mm512_loadu_ps(x + c + 16), a1);
            a2 = _mm512_fmadd_ps(gemv_load16(w, c + 32, kind), _mm512_loadu_ps(x + c + 32), a2);
            a3 = _mm512_fmadd_ps(gemv_load16(w, c + 48, kind), _mm512_loadu_ps(x + c + 48), a3);
        }
        for (; c + 16 <= k; c += 16) a0 = _mm512_fmadd_ps(gemv_load16(w, c, kind), _mm512_loadu_ps(x + c), a0);
        if (c < k) {
            const __mmask16 m = (__mmask16)((1u << (k - c)) - 1);
            a1 = _mm512_fmadd_ps(gemv_load16_tail(w, c, k, kind), _mm512_maskz_loadu_ps(m, x + c), a1);
        }
        y[j] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

GEMV_256 void gemv_row1_avx2_body(float *y, const void *w_rows, const float *x, int64_t nb, int64_t k,
                                  enum gemv_w kind)
{
    for (int64_t j = 0; j < nb; j++) {
        const void *w = gemv_row(w_rows, j, k, kind);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int64_t c = 0;
        for (; c + 32 <= k; c += 32) {
            a0 = _mm256_fmadd_ps(gemv_load8(w, c, kind), _mm256_loadu_ps(x + c), a0);
            a1 = _mm256_fmadd_ps(gemv_load8(w, c + 8, kind), _mm256_loadu_ps(x + c + 8), a1);
            a2 = _mm256_fmadd_ps(gemv_load8(w, c + 16, kind), _mm256_loadu_ps(x + c + 16), a2);
            a3 = _mm256_fmadd_ps(gemv_load8(w, c + 24, kind), _mm256_loadu_ps(x + c + 24), a3);
        }
        for (; c + 8 <= k; c += 8) a0 = _mm256_fmadd_ps(gemv_load8(w, c, kind), _mm256_loadu_ps(x + c), a0);
        y[j] = gemv_finish8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)), w, x, c, k, kind);
    }
}

/* Rows j .. nb - 1 of the eight-row passes (fewer than eight) by gemv_rows_body, half-precision
 * ones widened into wf first. */
__attribute__((always_inline)) static inline void gemv_rows_rest(float *y, const void *w_rows, const float *x, int64_t j,
                                                                 int64_t nb, int64_t k, enum gemv_w kind, float *wf)
{
    if (j == nb) return;
    if (kind == GEMV_W_F32) {
        gemv_rows_body(y + j, gemv_row(w_rows, j, k, kind), x, nb - j, k);
        return;
    }
    for (int64_t i = 0; i < (nb - j) * k; i++) wf[i] = gemv_w1(gemv_row(w_rows, j, k, kind), i, kind);
    gemv_rows_body(y + j, wf, x, nb - j, k);
}

/* The eight-row pass written out for AVX-512: eight accumulators (one per row of w) against one
 * load of x per 16 columns, the tail masked; rows left over (nb % 8) by gemv_rows_body, half
 * precision ones widened into wf (7 k floats) first. On the Intel Xeon with AMX of 2026-12-02
 * it decoded the stories110M shape 6-8 % faster than the same pass compiled from gemv_rows_body
 * (32.1-32.3 against 29.6-30.6 tok/s at one thread, 64.8-65.5 against 60.2-61.6 at two,
 * alternating runs); software prefetching 256 B to 1 KiB ahead in it gained nothing there (the
 * hardware prefetcher keeps up with eight streams). */
GEMV_512 void gemv_rows_avx512_body(float *y, const void *w_rows, const float *x, int64_t nb, int64_t k,
                                    enum gemv_w kind, float *wf)
{
    const int64_t k16 = k / 16 * 16;
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
        __m512 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm512_setzero_ps();
        for (int64_t c = 0; c < k16; c += 16) {
            const __m512 xv = _mm512_loadu_ps(x + c);
            for (int r = 0; r < 8; r++) a[r] = _mm512_fmadd_ps(gemv_load16(gemv_row(w_rows, j + r, k, kind), c, kind), xv, a[r]);
        }
        if (k16 < k) {
            const __m512 xv = _mm512_maskz_loadu_ps((__mmask16)((1u << (k - k16)) - 1), x + k16);
            for (int r = 0; r < 8; r++)
                a[r] = _mm512_fmadd_ps(gemv_load16_tail(gemv_row(w_rows, j + r, k, kind), k16, k, kind), xv, a[r]);
        }
        for (int r = 0; r < 8; r++) y[j + r] = _mm512_reduce_add_ps(a[r]);
    }
    gemv_rows_rest(y, w_rows, x, j, nb, k, kind, wf);
}

/* The eight-row pass written out for AVX2: eight ymm accumulators against one load of x per 8
 * columns; each row's lanes summed once, then its k % 8 tail added in order (gemv_finish8, as in
 * gemv_row1_avx2_body); rows left over (nb % 8) as in gemv_rows_avx512_body.
 * Written out so that bf16 / f16 rows are read in place (gemv_rows_body, which the compiler
 * vectorises, could not promise a half-precision row the sums of its widened copy). */
GEMV_256 void gemv_rows_avx2_body(float *y, const void *w_rows, const float *x, int64_t nb, int64_t k,
                                  enum gemv_w kind, float *wf)
{
    const int64_t k8 = k / 8 * 8;
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) {
        __m256 a[8];
        for (int r = 0; r < 8; r++) a[r] = _mm256_setzero_ps();
        for (int64_t c = 0; c < k8; c += 8) {
            const __m256 xv = _mm256_loadu_ps(x + c);
            for (int r = 0; r < 8; r++) a[r] = _mm256_fmadd_ps(gemv_load8(gemv_row(w_rows, j + r, k, kind), c, kind), xv, a[r]);
        }
        for (int r = 0; r < 8; r++) y[j + r] = gemv_finish8(a[r], gemv_row(w_rows, j + r, k, kind), x, k8, k, kind);
    }
    gemv_rows_rest(y, w_rows, x, j, nb, k, kind, wf);
}

/* One copy of each body per weight type. */
__attribute__((target("avx512f"))) static void gemv_row1_avx512(float *y, const void *w, const float *x, int64_t nb,
                                                                int64_t k, enum gemv_w kind)
{
    if (kind == GEMV_W_BF16) gemv_row1_avx512_body(y, w, x, nb, k, GEMV_W_BF16);
    else if (kind == GEMV_W_F16) gemv_row1_avx512_body(y, w, x, nb, k, GEMV_W_F16);
    else gemv_row1_avx512_body(y, w, x, nb, k, GEMV_W_F32);
}

__attribute__((target("avx2,fma,f16c"))) static void gemv_row1_avx2(float *y, const void *w, const float *x, int64_t nb,
                                                                    int64_t k, enum gemv_w kind)
{
    if (kind == GEMV_W_BF16) gemv_row1_avx2_body(y, w, x, nb, k, GEMV_W_BF16);
    else if (kind == GEMV_W_F16) gemv_row1_avx2_body(y, w, x, nb, k, GEMV_W_F16);
    else gemv_row1_avx2_body(y, w, x, nb, k, GEMV_W_F32);
}

__attribute__((target("avx512f"))) static void gemv_rows_avx512(float *y, const void *w, const float *x, int64_t nb,
                                                                int64_t k, enum gemv_w kind, float *wf)
{
    if (kind == GEMV_W_BF16) gemv_rows_avx512_body(y, w, x, nb, k, GEMV_W_BF16, wf);
    else if (kind == GEMV_W_F16) gemv_rows_avx512_body(y, w, x, nb, k, GEMV_W_F16, wf);
    else gemv_rows_avx512_body(y, w, x, nb, k, GEMV_W_F32, wf);
}

__attribute__((target("avx2,fma,f16c"))) static void gemv_rows_avx2(float *y, const void *w, const float *x, int64_t nb,
                                                                    int64_t k, enum gemv_w kind, float *wf)
{
    if (kind == GEMV_W_BF16) gemv_rows_avx2_body(y, w, x, nb, k, GEMV_W_BF16, wf);
    else if (kind == GEMV_W_F16) gemv_rows_avx2_body(y, w, x, nb, k, GEMV_W_F16, wf);
    else gemv_rows_avx2_body(y, w, x, nb, k, GEMV_W_F32, wf);
}
#endif

/* Which gemv kernel cpu_isa() and the knobs choose (cpu_gemv_path names it). */
enum gemv_kernel { GEMV_ROW1_512, GEMV_ROWS8_512, GEMV_ROW1_256, GEMV_ROWS8_256, GEMV_PORTABLE };

static enum gemv_kernel gemv_kernel(void)
{
#if defined(__x86_64__)
    const enum cpu_isa isa = cpu_isa();
    const int one = cpu_gemv_rows_per_pass() == 1;
    if (isa >= CPU_ISA_AVX512 && cpu_gemv_bits() == 512) return one ? GEMV_ROW1_512 : GEMV_ROWS8_512;
    if (isa >= CPU_ISA_AVX2) return one ? GEMV_ROW1_256 : GEMV_ROWS8_256;
#endif
    return GEMV_PORTABLE;
}

const char *cpu_gemv_path(void)
{
    /* "baseline": the x86-64 baseline (SSE2) as the compiler vectorises it, or plain C */
    static const char *const names[] = {"avx512 x1", "avx512 x8", "avx2 x1", "avx2 x8", "baseline"};
    return names[gemv_kernel()];
}

/* Whether gemv_rows reads w of type dt in place: f32 always, bf16 and f16 where the kernel is one
 * of the intrinsics ones (all but the portable one, gemv_rows_body, whose vectorisation the
 * compiler chooses, so widened rows keep their sums). */
int cpu_gemv_reads(enum dtype dt)
{
    if (dt == DTYPE_F32) return 1;
    return (dt == DTYPE_BF16 || dt == DTYPE_F16) && gemv_kernel() != GEMV_PORTABLE;
}

int cpu_half_weights_in_place(enum dtype dt)
{
    return (dt == DTYPE_BF16 && cpu_amx_enabled()) || ((dt == DTYPE_BF16 || dt == DTYPE_F16) && cpu_gemv_reads(dt));
}

/* y[j] = w_rows[j] . x for j < nb, w_rows of dtype dt (cpu_gemv_reads(dt)); wf: nb * k floats of
 * scratch for the rows a kernel widens (half precision only). */
void cpu_gemv_rows_typed(float *y, const void *w_rows, enum dtype dt, const float *x, int64_t nb, int64_t k,
                         float *wf)
{
    const enum gemv_w kind = dt == DTYPE_BF16 ? GEMV_W_BF16 : dt == DTYPE_F16 ? GEMV_W_F16 : GEMV_W_F32;
    (void)kind;
    (void)wf;
    switch (gemv_kernel()) {
#if defined(__x86_64__)
    case GEMV_ROW1_512: gemv_row1_avx512(y, w_rows, x, nb, k, kind); return;
    case GEMV_ROWS8_512: gemv_rows_avx512(y, w_rows, x, nb, k, kind, wf); return;
    case GEMV_ROW1_256: gemv_row1_avx2(y, w_rows, x, nb, k, kind); return;
    case GEMV_ROWS8_256: gemv_rows_avx2(y, w_rows, x, nb, k, kind, wf); return;
#endif
    default: gemv_rows_default(y, w_rows, x, nb, k); return;
    }
}

void cpu_gemv_rows(float *y, const float *w_rows, const float *x, int64_t nb, int64_t k)
{
    cpu_gemv_rows_typed(y, w_rows, DTYPE_F32, x, nb, k, NULL);
}
