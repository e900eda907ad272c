/* kernels/cpu/attention_avx2.c - the AVX2 + FMA implementation of op_attention's inner kernels
 * (attention_impl.h), for the CPUs without AVX-512 (most AMD Zen 1-3, Intel client parts),
 * compiled with target attributes so that the library still builds for generic x86-64;
 * attention.c asks the CPU before using it (cpu_isa level avx2: AVX2, FMA, F16C).
 * AVX2 has 16 vector registers of 8 floats, so the tiles are half the AVX-512 ones:
 * - scores: register tiles of 2 query vectors x 4 keys (8 accumulators): each 8-float chunk of
 *   a key row is loaded once for the two queries, each chunk of a query once for the four keys;
 *   the 8 sums are reduced together into one vector.
 * - accumulate: register tiles of 4 accumulator rows x 16 features (8 accumulators; 8 features
 *   when only those are left), kept in registers over every value row of the call.
 * A head_dim that is not a multiple of 8 is handled with masked loads and stores
 * (vmaskmovps never touches the masked-out lanes, so it reads nothing past a row).
 * Not here: the driver (attention.c), the portable reference (attention_portable.c).
 * Tests: tests/test_attention_kernels.c (against a double reference, beside the portable one). */
#include "attention_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

/* The mask whose first n lanes (0 <= n <= 8) are set. */
AVX2_INLINE __m256i lanes(int n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The sums of a0..a7, in that order, in one vector. */
AVX2_INLINE __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5,
                         __m256 a6, __m256 a7)
{
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    /* Lane l < 4 of h0 is the sum of a_l's elements 0-3, lane 4 + l the sum of its elements 4-7;
     * h1 alike for a4..a7. The halves' sum finishes each. */
    const __m256 lo = _mm256_permute2f128_ps(h0, h1, 0x20), hi = _mm256_permute2f128_ps(h0, h1, 0x31);
    return _mm256_add_ps(lo, hi);
}

/* s[g * lds + j] = q_g . k_j for g < gb, j < ib; gb is a constant after inlining. Keys past ib
 * repeat the last one (their sums are dropped). */
AVX2_INLINE void scores_tile(const float *q, int hd, const int gb, const float *const kp[4],
                             float *s, int lds, int ib)
{
    __m256 acc[2][4];
    for (int g = 0; g < 2; g++)
        for (int j = 0; j < 4; j++) acc[g][j] = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= hd; d += 8) {
        const __m256 k0 = _mm256_loadu_ps(kp[0] + d), k1 = _mm256_loadu_ps(kp[1] + d);
        const __m256 k2 = _mm256_loadu_ps(kp[2] + d), k3 = _mm256_loadu_ps(kp[3] + d);
        for (int g = 0; g < gb; g++) {
            const __m256 qv = _mm256_loadu_ps(q + (size_t)g * (size_t)hd + (size_t)d);
            acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
            acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
            acc[g][2] = _mm256_fmadd_ps(qv, k2, acc[g][2]);
            acc[g][3] = _mm256_fmadd_ps(qv, k3, acc[g][3]);
        }
    }
    if (d < hd) {
        const __m256i m = lanes(hd - d);
        const __m256 k0 = _mm256_maskload_ps(kp[0] + d, m), k1 = _mm256_maskload_ps(kp[1] + d, m);
        const __m256 k2 = _mm256_maskload_ps(kp[2] + d, m), k3 = _mm256_maskload_ps(kp[3] + d, m);
        for (int g = 0; g < gb; g++) {
            const __m256 qv = _mm256_maskload_ps(q + (size_t)g * (size_t)hd + (size_t)d, m);
            acc[g][0] = _mm256_fmadd_ps(qv, k0, acc[g][0]);
            acc[g][1] = _mm256_fmadd_ps(qv, k1, acc[g][1]);
            acc[g][2] = _mm256_fmadd_ps(qv, k2, acc[g][2]);
            acc[g][3] = _mm256_fmadd_ps(qv, k3, acc[g][3]);
        }
    }
    float sums[8];
    _mm256_storeu_ps(sums, hsum8(acc[0][0], acc[0][1], acc[0][2], acc[0][3], acc[1][0], acc[1][1],
                                 acc[1][2], acc[1][3]));
    for (int g = 0; g < gb; g++) {
        float *sg = s + (size_t)g * (size_t)lds;
        for (int j = 0; j < ib; j++) sg[j] = sums[4 * g + j];
    }
}

AVX2 static void scores_avx2(const float *q, int gn, int hd, const float *const *k, int nk, float *s,
                             int lds)
{
    for (int i0 = 0; i0 < nk; i0 += 4) {
        const int ib = nk - i0 < 4 ? nk - i0 : 4;
        const float *kp[4];
        for (int j = 0; j < 4; j++) kp[j] = k[i0 + (j < ib ? j : ib - 1)];
        for (int g0 = 0; g0 < gn; g0 += 2) {
            const float *qg = q + (size_t)g0 * (size_t)hd;
            float *sg = s + (size_t)g0 * (size_t)lds + (size_t)i0;
            if (gn - g0 == 1) scores_tile(qg, hd, 1, kp, sg, lds, ib);
            else scores_tile(qg, hd, 2, kp, sg, lds, ib);
        }
    }
}

/* Rows g < gb of acc, features d0 .. d0 + 8 * nc (the last chunk's lanes beyond hd masked off
 * by m1), plus the weighted sum of the nk value rows; gb and nc are constants after inlining. */
AVX2_INLINE void accumulate_tile(float *acc, int hd, const int gb, const int nc, const float *p,
                                 int ldp, const float *const *v, int nk, int d0, __m256i m0,
                                 __m256i m1)
{
    __m256 a[4][2];
    for (int g = 0; g < gb; g++) {
        float *ag = acc + (size_t)g * (size_t)hd + (size_t)d0;
        a[g][0] = _mm256_maskload_ps(ag, m0);
        if (nc == 2) a[g][1] = _mm256_maskload_ps(ag + 8, m1);
    }
    for (int i = 0; i < nk; i++) {
        const float *vr = v[i] + d0;
        const __m256 v0 = _mm256_maskload_ps(vr, m0);
        const __m256 v1 = nc == 2 ? _mm256_maskload_ps(vr + 8, m1) : _mm256_setzero_ps();
        for (int g = 0; g < gb; g++) {
            const __m256 w = _mm256_broadcast_ss(p + (size_t)g * (size_t)ldp + (size_t)i);
            a[g][0] = _mm256_fmadd_ps(w, v0, a[g][0]);
            if (nc == 2) a[g][1] = _mm256_fmadd_ps(w, v1, a[g][1]);
        }
    }
    for (int g = 0; g < gb; g++) {
        float *ag = acc + (size_t)g * (size_t)hd + (size_t)d0;
        _mm256_maskstore_ps(ag, m0, a[g][0]);
        if (nc == 2) _mm256_maskstore_ps(ag + 8, m1, a[g][1]);
    }
}

/* The rows g0 .. gn - 1 in tiles of four, nc chunks each (constants after inlining). */
#define ACCUMULATE_ROWS(NC)                                                                        \
    for (int g0 = 0; g0 < gn; g0 += 4) {                                                           \
        float *ag = acc + (size_t)g0 * (size_t)hd;                                                 \
        const float *pg = p + (size_t)g0 * (size_t)ldp;                                            \
        switch (gn - g0) {                                                                         \
        case 1: accumulate_tile(ag, hd, 1, NC, pg, ldp, v, nk, d0, m0, m1); break;                 \
        case 2: accumulate_tile(ag, hd, 2, NC, pg, ldp, v, nk, d0, m0, m1); break;                 \
        case 3: accumulate_tile(ag, hd, 3, NC, pg, ldp, v, nk, d0, m0, m1); break;                 \
        default: accumulate_tile(ag, hd, 4, NC, pg, ldp, v, nk, d0, m0, m1); break;                \
        }                                                                                          \
    }

AVX2 static void accumulate_avx2(float *acc, int gn, int hd, const float *p, int ldp,
                                 const float *const *v, int nk)
{
    for (int d0 = 0; d0 < hd; d0 += 16) {
        const int left = hd - d0;
        const __m256i m0 = lanes(left < 8 ? left : 8), m1 = lanes(left - 8 < 8 ? left - 8 : 8);
        if (left <= 8) {
            ACCUMULATE_ROWS(1)
        } else {
            ACCUMULATE_ROWS(2)
        }
    }
}

#undef ACCUMULATE_ROWS

AVX2 static void widen_avx2(float *dst, const uint16_t *src, enum dtype t, size_t n)
{
    size_t i = 0;
    if (t == DTYPE_BF16) {
        for (; i + 8 <= n; i += 8) {
            const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(h, 16)));
        }
        for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
        for (; i < n; i++) dst[i] = f16_to_f32(src[i]);
    }
}

ATTN_SOFTMAX_FNS(avx2, AVX2)

static const struct attn_kernels avx2_kernels = {
    .name = "avx2",
    .scores = scores_avx2,
    .accumulate = accumulate_avx2,
    .widen = widen_avx2,
    .max = max_avx2,
    .exp_sum = exp_sum_avx2,
};

const struct attn_kernels *attn_kernels_avx2(void) { return &avx2_kernels; }

#else

const struct attn_kernels *attn_kernels_avx2(void) { return NULL; }

#endif
