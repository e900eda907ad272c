/* kernels/cpu/bf16_dot.c - y = x @ w^T for bf16 w with AVX512-BF16's vdpbf16ps, on CPUs that have
 * it but no AMX tiles in use (AMD Zen 4, Intel Cooper Lake, Xeons whose VM hides the tiles):
 * a prefill against a bf16 checkpoint's weights. The numbers are the AMX tiles' (amx.c): x is
 * rounded to bf16 once per product (round to nearest even), each bf16 x bf16 product is exact in
 * f32 and the sums are f32, so the result is the f32 product of the bf16-rounded operands up to
 * f32 reassociation (vdpbf16ps treats denormal inputs as zero and flushes denormal sums, as the
 * tiles do). Decode (one row of x) and batch-invariant steps keep the gemv, which reads bf16
 * weights in place with f32 x (matmul.c); this path is for m >= 2 rows where the caller does not
 * ask for invariance.
 *
 * Layout: vdpbf16ps multiplies 16 lanes of bf16 pairs, lane i of the accumulator gaining
 * a[2i] b[2i] + a[2i+1] b[2i+1]. x's row r, as bf16 pairs (k rounded up to even, a zero pad), is
 * broadcast one pair (32 bits) at a time; w's rows are repacked per call, 16 rows at a time, as
 * [pair p][row 0..15][2], so that one 64-byte load holds pair p of 16 rows: each accumulator is 16
 * columns of y. The micro-kernel keeps 6 rows x 32 columns (12 accumulators) in registers.
 * Tests: tests/test_matmul_half.c (against the float64 product of the bf16-rounded operands, and
 * the unrounded operands' product must be told apart). */
#include <stdint.h>
#include <string.h>

#include "cpu_isa.h"
#include "cpu_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define BF16DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

int cpu_bf16_dot_supported(void)
{
    return cpu_isa_at_least(CPU_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
}

/* Rows r0 .. r0 + R (R <= 6) of x against 16 x G (G 1 or 2) columns at wp (a packed group and,
 * for G 2, the next one): y's columns c0 .. c0 + 16 G, the last group's lanes from `lanes` on
 * not stored. */
BF16DOT __attribute__((always_inline)) static inline void micro(float *y, int64_t ldy, const uint32_t *xp, int64_t ldx,
                                                                const uint16_t *wp0, const uint16_t *wp1, int64_t pairs,
                                                                int R, int G, __mmask16 last)
{
    __m512 acc[6][2];
    for (int r = 0; r < 6; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp0 + p * 32);
        const __m512bh w1 = G == 2 ? (__m512bh)_mm512_loadu_si512(wp1 + p * 32) : w0;
        for (int r = 0; r < R; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)xp[r * ldx + p]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, w0);
            if (G == 2) acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, w1);
        }
    }
    for (int r = 0; r < R; r++) {
        if (G == 2) {
            _mm512_storeu_ps(y + r * ldy, acc[r][0]);
            _mm512_mask_storeu_ps(y + r * ldy + 16, last, acc[r][1]);
        } else {
            _mm512_mask_storeu_ps(y + r * ldy, last, acc[r][0]);
        }
    }
}

/* One call of micro per shape, R and G constant in each. */
BF16DOT static void micro_any(float *y, int64_t ldy, const uint32_t *xp, int64_t ldx, const uint16_t *wp0,
                              const uint16_t *wp1, int64_t pairs, int R, int G, __mmask16 last)
{
#define MICRO(r)                                                                                                      \
    case r:                                                                                                           \
        if (G == 2) micro(y, ldy, xp, ldx, wp0, wp1, pairs, r, 2, last);                                              \
        else micro(y, ldy, xp, ldx, wp0, wp1, pairs, r, 1, last);                                                     \
        return;
    switch (R) {
        MICRO(1)
        MICRO(2)
        MICRO(3)
        MICRO(4)
        MICRO(5)
        MICRO(6)
    default: return;
    }
#undef MICRO
}

size_t cpu_bf16_dot_x_elems(int64_t m, int64_t k) { return (size_t)m * (size_t)((k + 1) / 2 * 2); }

BF16DOT void cpu_bf16_dot_round_x(uint16_t *xb, const float *x, int64_t m, int64_t k)
{
    const int64_t k2 = (k + 1) / 2 * 2;
    for (int64_t r = 0; r < m; r++) {
        const float *src = x + r * k;
        uint16_t *dst = xb + r * k2;
        int64_t c = 0;
        for (; c + 16 <= k; c += 16)
            _mm256_storeu_si256((__m256i *)(dst + c), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + c)));
        if (c < k) {
            const __mmask16 m16 = (__mmask16)((1u << (k - c)) - 1);
            const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m16, src + c));
            _mm256_mask_storeu_epi16(dst + c, m16, h);
        }
        if (k2 > k) dst[k] = 0;
    }
}

size_t cpu_bf16_dot_w_elems(int64_t nb, int64_t k) { return (size_t)((nb + 15) / 16 * 16) * (size_t)((k + 1) / 2 * 2); }

void cpu_bf16_dot_pack_w(uint16_t *wp, const uint16_t *w, int64_t ldw, int64_t nb, int64_t k)
{
    const int64_t pairs = (k + 1) / 2, groups = (nb + 15) / 16;
    for (int64_t g = 0; g < groups; g++) {
        uint16_t *dst = wp + g * pairs * 32;
        for (int64_t i = 0; i < 16; i++) {
            const int64_t row = g * 16 + i;
            const uint16_t *src = w + row * ldw;
            for (int64_t p = 0; p < pairs; p++) {
                const int64_t c = 2 * p;
                dst[p * 32 + 2 * i] = row < nb ? src[c] : 0;
                dst[p * 32 + 2 * i + 1] = row < nb && c + 1 < k ? src[c + 1] : 0;
            }
        }
    }
}

void cpu_bf16_dot_gemm(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *wp, int64_t m, int64_t nb,
                       int64_t k)
{
    const int64_t pairs = (k + 1) / 2, groups = (nb + 15) / 16;
    const uint32_t *xp = (const uint32_t *)xb;
    for (int64_t g = 0; g < groups; g += 2) {
        const int G = g + 1 < groups ? 2 : 1;
        const int64_t cols = nb - (g + G - 1) * 16; /* columns of the last group */
        const __mmask16 last = cols >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << cols) - 1);
        const uint16_t *wp0 = wp + g * pairs * 32, *wp1 = wp0 + pairs * 32;
        for (int64_t r = 0; r < m; r += 6) {
            const int R = m - r < 6 ? (int)(m - r) : 6;
            micro_any(y + r * ldy + g * 16, ldy, xp + r * pairs, pairs, wp0, wp1, pairs, R, G, last);
        }
    }
}

#else

int    cpu_bf16_dot_supported(void) { return 0; }
size_t cpu_bf16_dot_x_elems(int64_t m, int64_t k) { return (size_t)m * (size_t)((k + 1) / 2 * 2); }
void   cpu_bf16_dot_round_x(uint16_t *xb, const float *x, int64_t m, int64_t k) { (void)xb, (void)x, (void)m, (void)k; }
size_t cpu_bf16_dot_w_elems(int64_t nb, int64_t k) { return (size_t)((nb + 15) / 16 * 16) * (size_t)((k + 1) / 2 * 2); }
void   cpu_bf16_dot_pack_w(uint16_t *wp, const uint16_t *w, int64_t ldw, int64_t nb, int64_t k)
{
    (void)wp, (void)w, (void)ldw, (void)nb, (void)k;
}
void cpu_bf16_dot_gemm(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *wp, int64_t m, int64_t nb,
                       int64_t k)
{
    (void)y, (void)ldy, (void)xb, (void)wp, (void)m, (void)nb, (void)k;
}

#endif
