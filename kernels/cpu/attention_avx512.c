/* kernels/cpu/attention_avx512.c - the AVX-512 implementation of op_attention's inner kernels
 * (attention_impl.h), compiled with target attributes so that the library still builds for
 * generic x86-64; attention.c asks the CPU before using it.
 * - scores: register tiles of 4 query vectors x 4 keys (16 accumulators): each 16-float chunk
 *   of a key row is loaded once for the four queries, each chunk of a query once for the four
 *   keys; the 16 sums are reduced four at a time. Heads of at most 8 features: 8 keys per
 *   256-bit tile, reduced by a transpose of hadds (scores8_tile).
 * - accumulate: register tiles of 4 accumulator rows x 64 features (16 accumulators), kept in
 *   registers over every value row of the call: a value chunk is loaded once for four rows.
 * A head_dim that is not a multiple of 16 (or 64) is handled with masked loads and stores
 * (masked-out lanes are never read: AVX-512 suppresses their faults).
 * Not here: the driver (attention.c), the portable reference (attention_portable.c).
 * Tests: tests/test_attention_kernels.c (against a double reference, beside the portable one). */
#include "attention_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define A512 __attribute__((target("avx512f")))
#define A512_INLINE __attribute__((target("avx512f"), always_inline)) static inline

/* The sums of a0..a3, in that order. */
A512_INLINE __m128 hsum4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), \
                                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)))
    const __m256 b0 = HALVES(a0), b1 = HALVES(a1), b2 = HALVES(a2), b3 = HALVES(a3);
#undef HALVES
    /* Lanes of h: the four sums over elements 0-3 of b0..b3, then over elements 4-7. */
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* s[g * lds + j] = q_g . k_j for g < gb, j < ib; gb is a constant after inlining, so that the
 * accumulators stay in registers. Keys past ib repeat the last one (their sums are dropped). */
A512_INLINE void scores_tile(const float *q, int hd, const int gb, const float *const kp[4],
                             float *s, int lds, int ib)
{
    __m512 acc[4][4];
    for (int g = 0; g < 4; g++)
        for (int j = 0; j < 4; j++) acc[g][j] = _mm512_setzero_ps();
    int d = 0;
    for (; d + 16 <= hd; d += 16) {
        const __m512 k0 = _mm512_loadu_ps(kp[0] + d), k1 = _mm512_loadu_ps(kp[1] + d);
        const __m512 k2 = _mm512_loadu_ps(kp[2] + d), k3 = _mm512_loadu_ps(kp[3] + d);
        for (int g = 0; g < gb; g++) {
            const __m512 qv = _mm512_loadu_ps(q + (size_t)g * (size_t)hd + (size_t)d);
            acc[g][0] = _mm512_fmadd_ps(qv, k0, acc[g][0]);
            acc[g][1] = _mm512_fmadd_ps(qv, k1, acc[g][1]);
            acc[g][2] = _mm512_fmadd_ps(qv, k2, acc[g][2]);
            acc[g][3] = _mm512_fmadd_ps(qv, k3, acc[g][3]);
        }
    }
    if (d < hd) {
        const __mmask16 m = (__mmask16)((1u << (hd - d)) - 1u);
        const __m512 k0 = _mm512_maskz_loadu_ps(m, kp[0] + d), k1 = _mm512_maskz_loadu_ps(m, kp[1] + d);
        const __m512 k2 = _mm512_maskz_loadu_ps(m, kp[2] + d), k3 = _mm512_maskz_loadu_ps(m, kp[3] + d);
        for (int g = 0; g < gb; g++) {
            const __m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)g * (size_t)hd + (size_t)d);
            acc[g][0] = _mm512_fmadd_ps(qv, k0, acc[g][0]);
            acc[g][1] = _mm512_fmadd_ps(qv, k1, acc[g][1]);
            acc[g][2] = _mm512_fmadd_ps(qv, k2, acc[g][2]);
            acc[g][3] = _mm512_fmadd_ps(qv, k3, acc[g][3]);
        }
    }
    for (int g = 0; g < gb; g++) {
        const __m128 sums = hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        float *sg = s + (size_t)g * (size_t)lds;
        if (ib == 4) {
            _mm_storeu_ps(sg, sums);
        } else {
            float tmp[4];
            _mm_storeu_ps(tmp, sums);
            for (int j = 0; j < ib; j++) sg[j] = tmp[j];
        }
    }
}

/* Heads of at most 8 features (stories260K's): eight keys at once in 256-bit vectors, products
 * summed by an 8 x 8 transpose of hadds (a 16-lane tile above spends most of its work on
 * reducing empty lanes); s[g * lds + j] for g < gn, j < ib. */
A512_INLINE void scores8_tile(const float *q, int gn, int hd, const float *const kp[8], float *s, int lds, int ib)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(hd), lanes);
    __m256 k[8];
    for (int j = 0; j < 8; j++) k[j] = _mm256_maskload_ps(kp[j], m);
    for (int g = 0; g < gn; g++) {
        const __m256 qv = _mm256_maskload_ps(q + (size_t)g * (size_t)hd, m);
        const __m256 h01 = _mm256_hadd_ps(_mm256_mul_ps(qv, k[0]), _mm256_mul_ps(qv, k[1]));
        const __m256 h23 = _mm256_hadd_ps(_mm256_mul_ps(qv, k[2]), _mm256_mul_ps(qv, k[3]));
        const __m256 h45 = _mm256_hadd_ps(_mm256_mul_ps(qv, k[4]), _mm256_mul_ps(qv, k[5]));
        const __m256 h67 = _mm256_hadd_ps(_mm256_mul_ps(qv, k[6]), _mm256_mul_ps(qv, k[7]));
        const __m256 a = _mm256_hadd_ps(h01, h23), b = _mm256_hadd_ps(h45, h67);
        /* a: keys 0-3 over features 0-3 | over 4-7; b: the same for keys 4-7. */
        const __m256 sums = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
        float *sg = s + (size_t)g * (size_t)lds;
        if (ib == 8) {
            _mm256_storeu_ps(sg, sums);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, sums);
            for (int j = 0; j < ib; j++) sg[j] = tmp[j];
        }
    }
}

A512 static void scores_avx512(const float *q, int gn, int hd, const float *const *k, int nk,
                               float *s, int lds)
{
    if (hd <= 8) {
        for (int i0 = 0; i0 < nk; i0 += 8) {
            const int ib = nk - i0 < 8 ? nk - i0 : 8;
            const float *kp[8];
            for (int j = 0; j < 8; j++) kp[j] = k[i0 + (j < ib ? j : ib - 1)];
            scores8_tile(q, gn, hd, kp, s + i0, lds, ib);
        }
        return;
    }
    for (int i0 = 0; i0 < nk; i0 += 4) {
        const int ib = nk - i0 < 4 ? nk - i0 : 4;
        const float *kp[4];
        for (int j = 0; j < 4; j++) kp[j] = k[i0 + (j < ib ? j : ib - 1)];
        for (int g0 = 0; g0 < gn; g0 += 4) {
            const float *qg = q + (size_t)g0 * (size_t)hd;
            float *sg = s + (size_t)g0 * (size_t)lds + (size_t)i0;
            switch (gn - g0) {
            case 1: scores_tile(qg, hd, 1, kp, sg, lds, ib); break;
            case 2: scores_tile(qg, hd, 2, kp, sg, lds, ib); break;
            case 3: scores_tile(qg, hd, 3, kp, sg, lds, ib); break;
            default: scores_tile(qg, hd, 4, kp, sg, lds, ib); break;
            }
        }
    }
}

/* Rows g < gb of acc, features d0 .. d0 + 64 (lanes beyond hd masked off by m), plus the
 * weighted sum of the nk value rows; gb is a constant after inlining. */
A512_INLINE void accumulate_tile(float *acc, int hd, const int gb, const float *p, int ldp,
                                 const float *const *v, int nk, int d0, const __mmask16 m[4], const int nc)
{
    /* nc (1..4, a constant after inlining): the 16-feature chunks that hold features; a small
     * head (stories260K's 8) no longer pays for three empty ones. */
    __m512 a[4][4];
    for (int g = 0; g < gb; g++)
        for (int c = 0; c < nc; c++)
            a[g][c] = _mm512_maskz_loadu_ps(m[c], acc + (size_t)g * (size_t)hd + (size_t)(d0 + 16 * c));
    for (int i = 0; i < nk; i++) {
        const float *vr = v[i] + d0;
        __m512 vc[4];
        for (int c = 0; c < nc; c++) vc[c] = _mm512_maskz_loadu_ps(m[c], vr + 16 * c);
        for (int g = 0; g < gb; g++) {
            const __m512 w = _mm512_set1_ps(p[(size_t)g * (size_t)ldp + (size_t)i]);
            for (int c = 0; c < nc; c++) a[g][c] = _mm512_fmadd_ps(w, vc[c], a[g][c]);
        }
    }
    for (int g = 0; g < gb; g++)
        for (int c = 0; c < nc; c++)
            _mm512_mask_storeu_ps(acc + (size_t)g * (size_t)hd + (size_t)(d0 + 16 * c), m[c], a[g][c]);
}

/* accumulate_tile with gb rows, nc chunks dispatched to constants. */
#define ACC_TILE_NC(gb)                                                                                   \
    switch (nc) {                                                                                         \
    case 1: accumulate_tile(ag, hd, gb, pg, ldp, v, nk, d0, m, 1); break;                                  \
    case 2: accumulate_tile(ag, hd, gb, pg, ldp, v, nk, d0, m, 2); break;                                  \
    case 3: accumulate_tile(ag, hd, gb, pg, ldp, v, nk, d0, m, 3); break;                                  \
    default: accumulate_tile(ag, hd, gb, pg, ldp, v, nk, d0, m, 4); break;                                 \
    }

A512 static void accumulate_avx512(float *acc, int gn, int hd, const float *p, int ldp,
                                   const float *const *v, int nk)
{
    for (int d0 = 0; d0 < hd; d0 += 64) {
        __mmask16 m[4];
        for (int c = 0; c < 4; c++) {
            const int left = hd - d0 - 16 * c;
            m[c] = left >= 16 ? (__mmask16)0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1u) : 0;
        }
        const int nc = hd - d0 >= 64 ? 4 : (hd - d0 + 15) / 16;
        for (int g0 = 0; g0 < gn; g0 += 4) {
            float *ag = acc + (size_t)g0 * (size_t)hd;
            const float *pg = p + (size_t)g0 * (size_t)ldp;
            switch (gn - g0) {
            case 1: ACC_TILE_NC(1) break;
            case 2: ACC_TILE_NC(2) break;
            case 3: ACC_TILE_NC(3) break;
            default: ACC_TILE_NC(4) break;
            }
        }
    }
}

A512 static void widen_avx512(float *dst, const uint16_t *src, enum dtype t, size_t n)
{
    size_t i = 0;
    if (t == DTYPE_BF16) {
        for (; i + 16 <= n; i += 16) {
            const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
            _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
        }
        for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
    } else {
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
        for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
    }
}

ATTN_SOFTMAX_FNS(avx512, A512)

static const struct attn_kernels avx512_kernels = {
    .name = "avx512",
    .scores = scores_avx512,
    .accumulate = accumulate_avx512,
    .widen = widen_avx512,
    .max = max_avx512,
    .exp_sum = exp_sum_avx512,
};

const struct attn_kernels *attn_kernels_avx512(void) { return &avx512_kernels; }

#else

const struct attn_kernels *attn_kernels_avx512(void) { return NULL; }

#endif
