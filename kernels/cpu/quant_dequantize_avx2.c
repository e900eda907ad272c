/* kernels/cpu/quant_dequantize_avx2.c - rows of ggml blocks to f32 with AVX2 and F16C, bit-exact
 * with the scalar dequantizers of quant_dequantize.c (and so with ggml): each element takes the
 * same f32 operations in the same order, a multiply then an add, never fused. The target has no
 * "fma", so the compiler cannot contract them. Used for embedding lookups, the scale check at
 * load, and the prefill product (kernels/cpu/matmul.c dequantizes tiles of W for sgemm), where
 * the scalar loops cost as much as the product itself.
 * Not here: the scalar reference (quant_dequantize.c), the int8 products.
 * Tests: tests/test_quant.c (every implementation bit-exact with the formats dequantizer). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#include "quant_x86_unpack.h"

#define DQ_TARGET __attribute__((target("avx2,f16c")))

DQ_TARGET static inline float dq_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* y[0..32) = q * s0 for bytes 0-15 of q and q * s1 for 16-31; q signed bytes. */
DQ_TARGET static inline void dq_i8x32(float *y, __m256i q, float s0, float s1)
{
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) {
        const __m256 s = _mm256_set1_ps(i < 2 ? s0 : s1);
        _mm256_storeu_ps(y + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i])), s));
    }
}

/* y[0..32) = d * u + m; u unsigned bytes. */
DQ_TARGET static inline void dq_u8x32(float *y, __m256i u, float d, float m)
{
    const __m128i lo = _mm256_castsi256_si128(u), hi = _mm256_extracti128_si256(u, 1);
    const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    for (int i = 0; i < 4; i++) {
        const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[i]));
        _mm256_storeu_ps(y + 8 * i, _mm256_add_ps(_mm256_mul_ps(dv, q), mv));
    }
}

/* The 32-element types: (float)(q - off) * d, or d * q + m for the types with a min. */
DQ_TARGET static void dq_q4_0(const struct blk_q4_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = dq_h2f(x[b].d);
        dq_i8x32(y, _mm256_sub_epi8(qx_nibbles(x[b].qs), _mm256_set1_epi8(8)), d, d);
    }
}

DQ_TARGET static void dq_q4_1(const struct blk_q4_1 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) dq_u8x32(y, qx_nibbles(x[b].qs), dq_h2f(x[b].d), dq_h2f(x[b].m));
}

DQ_TARGET static void dq_q5_0(const struct blk_q5_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = dq_h2f(x[b].d);
        const __m256i u = _mm256_or_si256(qx_nibbles(x[b].qs), qx_fifth_bits(x[b].qh));
        dq_i8x32(y, _mm256_sub_epi8(u, _mm256_set1_epi8(16)), d, d);
    }
}

DQ_TARGET static void dq_q5_1(const struct blk_q5_1 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK)
        dq_u8x32(y, _mm256_or_si256(qx_nibbles(x[b].qs), qx_fifth_bits(x[b].qh)), dq_h2f(x[b].d),
                 dq_h2f(x[b].m));
}

DQ_TARGET static void dq_q8_0(const struct blk_q8_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = dq_h2f(x[b].d);
        dq_i8x32(y, _mm256_loadu_si256((const __m256i *)x[b].qs), d, d);
    }
}

/* MXFP4: the nibbles looked up in quant_mxfp4_values (a vpshufb per lane), then (float)v * d as
 * the scalar loop. */
DQ_TARGET static void dq_mxfp4(const struct blk_mxfp4 *x, int64_t nb, float *y)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)quant_mxfp4_values);
    const __m256i values = _mm256_set_m128i(v, v);
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = quant_mxfp4_half(x[b].e);
        dq_i8x32(y, _mm256_shuffle_epi8(values, qx_nibbles(x[b].qs)), d, d);
    }
}

/* Q4_K and Q5_K (qh NULL for Q4_K): sub-blocks in pairs, the low nibbles of 32 bytes then their
 * high nibbles, each d * sc * (q + 16 h) - dmin * m; "- m1" is "+ (-m1)", the same f32 result. */
DQ_TARGET static void dq_k_sc_min(uint16_t d16, uint16_t dmin16, const uint8_t *scales,
                                  const uint8_t *q, const uint8_t *qh, float *y)
{
    const float d = dq_h2f(d16), dmin = dq_h2f(dmin16);
    const __m256i low4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int p = 0; p < QK_K / 64; p++, q += 32, y += 64) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)q);
        __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        if (qh) {
            const __m256i h0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * p)), one);
            const __m256i h1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * p + 1)), one);
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(h0, 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(h1, 4));
        }
        uint8_t sc, m;
        quant_k_scale_min(2 * p, scales, &sc, &m);
        dq_u8x32(y, lo, d * (float)sc, -(dmin * (float)m));
        quant_k_scale_min(2 * p + 1, scales, &sc, &m);
        dq_u8x32(y + 32, hi, d * (float)sc, -(dmin * (float)m));
    }
}

/* Q6_K: per half of 128, four groups of 32 built from ql's nibbles and two bits of qh, each
 * (d * sc) * (q - 32) with one scale per 16. */
DQ_TARGET static void dq_q6_k(const struct blk_q6_k *x, int64_t nb, float *y)
{
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int64_t b = 0; b < nb; b++) {
        const float d = dq_h2f(x[b].d);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(h, low2), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), low2), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), low2), 4)),
            };
            for (int g = 0; g < 4; g++)
                dq_i8x32(y + 32 * g, _mm256_sub_epi8(q[g], off), d * (float)sc[2 * g],
                         d * (float)sc[2 * g + 1]);
        }
    }
}

int quant_avx2_dequantize(enum quant_type type, const void *src, float *dst, int64_t nb)
{
    switch (type) {
    case QUANT_TYPE_Q4_0: dq_q4_0(src, nb, dst); return 1;
    case QUANT_TYPE_Q4_1: dq_q4_1(src, nb, dst); return 1;
    case QUANT_TYPE_Q5_0: dq_q5_0(src, nb, dst); return 1;
    case QUANT_TYPE_Q5_1: dq_q5_1(src, nb, dst); return 1;
    case QUANT_TYPE_Q8_0: dq_q8_0(src, nb, dst); return 1;
    case QUANT_TYPE_Q4_K:
        for (const struct blk_q4_k *x = src; x < (const struct blk_q4_k *)src + nb; x++, dst += QK_K)
            dq_k_sc_min(x->d, x->dmin, x->scales, x->qs, NULL, dst);
        return 1;
    case QUANT_TYPE_Q5_K:
        for (const struct blk_q5_k *x = src; x < (const struct blk_q5_k *)src + nb; x++, dst += QK_K)
            dq_k_sc_min(x->d, x->dmin, x->scales, x->qs, x->qh, dst);
        return 1;
    case QUANT_TYPE_Q6_K: dq_q6_k(src, nb, dst); return 1;
    case QUANT_TYPE_MXFP4: dq_mxfp4(src, nb, dst); return 1;
    /* Not vectorised yet: the scalar loops of quant_dequantize.c. */
    case QUANT_TYPE_Q2_K: case QUANT_TYPE_Q3_K: case QUANT_TYPE_IQ4_NL: case QUANT_TYPE_IQ4_XS: return 0;
    }
    return 0;
}

#else

int quant_avx2_dequantize(enum quant_type type, const void *src, float *dst, int64_t nb)
{
    (void)type, (void)src, (void)dst, (void)nb;
    return 0;
}

#endif
