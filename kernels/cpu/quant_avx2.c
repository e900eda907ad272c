/* kernels/cpu/quant_avx2.c - the AVX2 implementation of the quantized product (x86-64 with AVX2,
 * FMA and F16C, compiled with target attributes so that the library still builds for generic
 * x86-64; quant.c asks the CPU): x rows to int8 blocks, the 32-element types through
 * quant_x86.h over vpmaddubsw + vpmaddwd, and the K-quants, whose sub-block scales are applied
 * to 16-bit pair sums with vpmaddwd (the AVX512-VNNI table reuses these K-quant kernels and the
 * quantizers: vpdpbusd would not save the scale multiply there).
 * Not here: the scalar reference (quant_scalar.c), the driver (quant.c).
 * Tests: tests/test_quant.c (against the scalar reference and the f64 product). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#define QX_TARGET QX_AVX2
#include <immintrin.h>

/* Unsigned u (0..63) times signed s (-127..127), bytes in groups of four summed into int32:
 * vpmaddubsw's pair sums stay below 2^15. */
__attribute__((target("avx2,fma,f16c"))) static inline __m256i dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

#include "quant_x86.h"

/* ---- activations ---- */

/* 32 floats at x times id, rounded to nearest even (as lrintf in quant_scalar.c, so both
 * quantize x identically) into 32 int8 at q; returns their sum, and the sums of each 16 in
 * s16[0..1]. */
QX_AVX2 static int32_t act_round32(const float *x, __m256 id, int8_t *q, int32_t s16[2])
{
    __m256i v[4];
    for (int i = 0; i < 4; i++)
        v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), id));
    const __m256i s0 = _mm256_add_epi32(v[0], v[1]), s1 = _mm256_add_epi32(v[2], v[3]);
    /* Packing works per 128-bit lane; the permute puts the eight groups of four back in order. */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m128i h0 = _mm_add_epi32(_mm256_castsi256_si128(s0), _mm256_extracti128_si256(s0, 1));
    __m128i h1 = _mm_add_epi32(_mm256_castsi256_si128(s1), _mm256_extracti128_si256(s1, 1));
    __m128i h = _mm_hadd_epi32(h0, h1); /* {s0 01, s0 23, s1 01, s1 23} */
    h = _mm_hadd_epi32(h, h);
    s16[0] = _mm_cvtsi128_si32(h);
    s16[1] = _mm_extract_epi32(h, 1);
    return s16[0] + s16[1];
}

/* max |x[i]| over n (a multiple of 8) floats. */
QX_AVX2 static float act_amax(const float *x, int n)
{
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QX_AVX2 void quant_avx2_act_q8(const float *x, void *out, int64_t nb)
{
    struct act_q8 *q = out;
    for (int64_t b = 0; b < nb; b++, x += QK) {
        const float d = act_amax(x, QK) / 127.0f;
        int32_t s16[2];
        q[b].d = d;
        q[b].sum = act_round32(x, _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f), q[b].qs, s16);
        q[b].dsum = d * (float)q[b].sum;
    }
}

QX_AVX2 void quant_avx2_act_q8_k(const float *x, void *out, int64_t nb)
{
    struct act_q8_k *q = out;
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        const float d = act_amax(x, QK_K) / 127.0f;
        const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
        q[b].d = d;
        for (int c = 0; c < QK_K / 32; c++) {
            int32_t s16[2];
            act_round32(x + 32 * c, id, q[b].qs + 32 * c, s16);
            q[b].bsums[2 * c] = (int16_t)s16[0];
            q[b].bsums[2 * c + 1] = (int16_t)s16[1];
        }
    }
}

/* ---- K-quants ---- */

/* Q4_K and Q5_K: per pair p of sub-blocks, 32 bytes give sub-block 2p (low nibbles) and 2p + 1
 * (high nibbles); Q5_K adds bit 2p / 2p + 1 of qh[l] as 16. The mins go through the 32-sums
 * of x in the integers. */
QX_AVX2 static void dot_k_sc_min(const uint16_t dd[2], const uint8_t *scales, const uint8_t *qs,
                                 const uint8_t *qh, const struct act_q8_k *x, float *acc, float *accm)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    uint8_t sc[8], mn[8];
    int32_t summ = 0;
    for (int j = 0; j < 8; j++) {
        quant_k_scale_min(j, scales, &sc[j], &mn[j]);
        summ += mn[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    __m256i sumi = _mm256_setzero_si256();
    __m256i hbits = qh ? _mm256_loadu_si256((const __m256i *)qh) : _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * p));
        __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if (qh) {
            /* Shifting 16-bit lanes by at most 6 never brings a neighbour's bit to bit 0. */
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hbits, one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 1), one), 4));
            hbits = _mm256_srli_epi16(hbits, 2);
        }
        const __m256i xl = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * p));
        const __m256i xh = _mm256_loadu_si256((const __m256i *)(x->qs + 64 * p + 32));
        const __m256i pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_set1_epi16(sc[2 * p]));
        const __m256i ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), _mm256_set1_epi16(sc[2 * p + 1]));
        sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
    }
    quant_k_accumulate(qx_h2f(dd[0]), qx_h2f(dd[1]), x->d, qx_hsum_epi32(sumi), summ, acc, accm);
}

QX_AVX2 float quant_avx2_dot_q4_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        const uint16_t dd[2] = {w[b].d, w[b].dmin};
        dot_k_sc_min(dd, w[b].scales, w[b].qs, NULL, &x[b], &acc, &accm);
    }
    return acc - accm;
}

QX_AVX2 float quant_avx2_dot_q5_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        const uint16_t dd[2] = {w[b].d, w[b].dmin};
        dot_k_sc_min(dd, w[b].scales, w[b].qs, w[b].qh, &x[b], &acc, &accm);
    }
    return acc - accm;
}

/* vpshufb controls that turn the 16 int8 scales of a Q6_K block into, for chunk t (32
 * elements), bytes {sc[2t] x 8, sc[2t + 1] x 8}: after widening, the scale of each 16-bit pair
 * sum of the chunk. */
static const uint8_t q6_scale_ctrl[8][16] = {
#define Q6_CTRL(t) {2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, 2 * t, \
                    2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1, 2 * t + 1}
    Q6_CTRL(0), Q6_CTRL(1), Q6_CTRL(2), Q6_CTRL(3), Q6_CTRL(4), Q6_CTRL(5), Q6_CTRL(6), Q6_CTRL(7),
#undef Q6_CTRL
};

/* The 16 bytes {v[2c] x 8, v[2c + 1] x 8} of 16 int8 v widened to int16: the scale of each
 * 16-bit pair sum of chunk c (32 elements, groups 2c and 2c + 1) of a block with one scale per
 * 16 (Q2_K, Q3_K, Q6_K). */
QX_AVX2 static inline __m256i k_group_scales(__m128i v, int c)
{
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(v, _mm_loadu_si128((const __m128i *)q6_scale_ctrl[c])));
}

/* Q6_K: per half of 128, ql[0..32) and ql[32..64) give chunks 0 and 1 (low nibbles) and 2 and 3
 * (high nibbles), qh[0..32) their two top bits (bits 2c, 2c + 1 for chunk c). The -32 is
 * taken once per block as 32 * sum_g sc_g * sum(x of g). */
QX_AVX2 float quant_avx2_dot_q6_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q6_k *w = wv;
    const struct act_q8_k *x = xv;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)w[b].scales);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[b].ql + 64 * h, *qhp = w[b].qh + 32 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int c = 0; c < 4; c++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[b].qs + 128 * h + 32 * c));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[c], xq), k_group_scales(sc8, 4 * h + c)));
            }
        }
        const __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                              _mm256_loadu_si256((const __m256i *)x[b].bsums));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 5));
        acc = fmaf(qx_h2f(w[b].d) * x[b].d, (float)qx_hsum_epi32(sumi), acc); /* block-exact */
    }
    return acc + 0.0f;
}

/* Q2_K: chunk c = 4 h + s (32 elements) is bits 2s, 2s + 1 of qs[32 h ..]; per group g of 16,
 * sc_g (low nibble) times the pair sums, and the mins m_g (high nibble) through the 16-sums of
 * x, both in the integers. */
QX_AVX2 float quant_avx2_dot_q2_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q2_k *w = wv;
    const struct act_q8_k *x = xv;
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        const __m128i sc = _mm_loadu_si128((const __m128i *)w[b].scales);
        const __m128i sc_lo = _mm_and_si128(sc, m4), sc_hi = _mm_and_si128(_mm_srli_epi16(sc, 4), m4);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const int c = 4 * h + s;
                /* 16-bit shifts by at most 6: the mask keeps each byte's own bits. */
                const __m256i u = _mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m2);
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * c));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), k_group_scales(sc_lo, c)));
            }
        }
        const __m256i summ = _mm256_madd_epi16(_mm256_cvtepu8_epi16(sc_hi), _mm256_loadu_si256((const __m256i *)x[b].bsums));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(sumi), acc);
        acc = _mm256_fnmadd_ps(_mm256_set1_ps(qx_h2f(w[b].dmin) * x[b].d), _mm256_cvtepi32_ps(summ), acc);
    }
    return qx_hsum(acc);
}

/* Q3_K: as Q2_K's bits, plus bit c of hmask[l] as 4 for chunk c: u = q + 4 (0..7); per group,
 * sc_g * (sum(u x) - 4 sum(x)), the -4 once per block through the 16-sums of x. */
QX_AVX2 float quant_avx2_dot_q3_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q3_k *w = wv;
    const struct act_q8_k *x = xv;
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        int8_t sc[16];
        for (int g = 0; g < 16; g++) sc[g] = (int8_t)quant_q3_k_scale(g, w[b].scales);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)sc);
        const __m256i hm = _mm256_loadu_si256((const __m256i *)w[b].hmask);
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[b].qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                const int c = 4 * h + s;
                const __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(c)), one);
                const __m256i u = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2 * s), m2), _mm256_slli_epi16(hb, 2));
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * c));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(u, xq), k_group_scales(sc8, c)));
            }
        }
        const __m256i off = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), _mm256_loadu_si256((const __m256i *)x[b].bsums));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(off, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return qx_hsum(acc);
}

/* IQ4_XS: sub-block j is an IQ4_NL block (its values looked up, their signs moved onto x as in
 * s8_rows) whose pair sums take the scale sc_j in vpmaddwd. */
QX_AVX2 float quant_avx2_dot_iq4_xs(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_iq4_xs *w = wv;
    const struct act_q8_k *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        qx_prefetch(w + b, sizeof *w);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < QK_K / 32; j++) {
            const __m256i v = qx_iq4_lookup(qx_nibbles(w[b].qs + 16 * j));
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * j));
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(xq, v));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_set1_epi16((short)quant_iq4_xs_scale(j, &w[b]))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return qx_hsum(acc);
}

/* Three and five rows of Q8_0, Q4_0, Q5_0, Q4_1 and Q5_1 in one pass, AVX2 only: their sums fit
 * the sixteen registers without VNNI's partial sums; the VNNI tables keep four, two, one. (Q4_K
 * and Q6_K were tried: docs/quantization.md.) */
QX_PACKED_R(q8_0, packed8_q8, 3)
QX_PACKED_R(q8_0, packed8_q8, 5)
QX_PACKED_R(q5_0, QX_Q5_0, 3)
QX_PACKED_R(q5_0, QX_Q5_0, 5)
QX_PACKED_R(q4_0, QX_Q4_0, 3)
QX_PACKED_R(q4_0, QX_Q4_0, 5)
QX_PACKED_R(q4_1, QX_Q4_1, 3)
QX_PACKED_R(q4_1, QX_Q4_1, 5)
QX_PACKED_R(q5_1, QX_Q5_1, 3)
QX_PACKED_R(q5_1, QX_Q5_1, 5)

static const struct quant_kernels avx2_kernels = {
    .dot = {
        [SLOT_Q4_0] = dot_q4_0, [SLOT_Q4_1] = dot_q4_1, [SLOT_Q5_0] = dot_q5_0,
        [SLOT_Q5_1] = dot_q5_1, [SLOT_Q8_0] = dot_q8_0, [SLOT_Q4_K] = quant_avx2_dot_q4_k,
        [SLOT_Q5_K] = quant_avx2_dot_q5_k, [SLOT_Q6_K] = quant_avx2_dot_q6_k,
        [SLOT_Q2_K] = quant_avx2_dot_q2_k, [SLOT_Q3_K] = quant_avx2_dot_q3_k,
        [SLOT_IQ4_NL] = dot_iq4_nl, [SLOT_IQ4_XS] = quant_avx2_dot_iq4_xs, [SLOT_MXFP4] = dot_mxfp4,
    },
    .dot4 = {
        [SLOT_Q4_0] = dot4_q4_0, [SLOT_Q4_1] = dot4_q4_1, [SLOT_Q5_0] = dot4_q5_0,
        [SLOT_Q5_1] = dot4_q5_1, [SLOT_Q8_0] = dot4_q8_0, [SLOT_IQ4_NL] = dot4_iq4_nl,
        [SLOT_MXFP4] = dot4_mxfp4,
    },
    .dotw4 = {
        [SLOT_Q4_0] = dotw4_q4_0, [SLOT_Q4_1] = dotw4_q4_1, [SLOT_Q5_0] = dotw4_q5_0,
        [SLOT_Q5_1] = dotw4_q5_1, [SLOT_Q8_0] = dotw4_q8_0,
    },
    .packed8 = {[SLOT_Q4_0] = packed8_q4_0, [SLOT_Q4_1] = packed8_q4_1, [SLOT_Q8_0] = packed8_q8_0,
                [SLOT_Q4_K] = packed8_q4_k, [SLOT_Q5_0] = packed8_q5_0, [SLOT_Q5_1] = packed8_q5_1, [SLOT_Q6_K] = packed8_q6_k},
    .packed8x4 = {[SLOT_Q4_0] = packed8x4_q4_0, [SLOT_Q4_1] = packed8x4_q4_1, [SLOT_Q8_0] = packed8x4_q8_0,
                  [SLOT_Q4_K] = packed8x4_q4_k, [SLOT_Q5_0] = packed8x4_q5_0, [SLOT_Q5_1] = packed8x4_q5_1, [SLOT_Q6_K] = packed8x4_q6_k},
    .packed8x2 = {[SLOT_Q4_0] = packed8x2_q4_0, [SLOT_Q4_1] = packed8x2_q4_1, [SLOT_Q8_0] = packed8x2_q8_0,
                  [SLOT_Q4_K] = packed8x2_q4_k, [SLOT_Q5_0] = packed8x2_q5_0, [SLOT_Q5_1] = packed8x2_q5_1, [SLOT_Q6_K] = packed8x2_q6_k},
    .packed8x3 = {[SLOT_Q8_0] = packed8x3_q8_0, [SLOT_Q5_0] = packed8x3_q5_0, [SLOT_Q4_0] = packed8x3_q4_0,
                  [SLOT_Q4_1] = packed8x3_q4_1, [SLOT_Q5_1] = packed8x3_q5_1},
    .packed8x5 = {[SLOT_Q8_0] = packed8x5_q8_0, [SLOT_Q5_0] = packed8x5_q5_0, [SLOT_Q4_0] = packed8x5_q4_0,
                  [SLOT_Q4_1] = packed8x5_q4_1, [SLOT_Q5_1] = packed8x5_q5_1},
    .act_q8 = quant_avx2_act_q8,
    .act_q8_k = quant_avx2_act_q8_k,
};

const struct quant_kernels *quant_kernels_avx2(void) { return &avx2_kernels; }

#else

const struct quant_kernels *quant_kernels_avx2(void) { return NULL; }

#endif
