/* kernels/cpu/quant_x86.h - what the two x86 implementations of the quantized product share:
 * AVX2 helpers (horizontal sum, nibble and fifth-bit unpacking) and the dot products of the
 * 32-element types, written once over an integer dot `dot_u8s8` that the including file
 * defines before including this one: quant_avx2.c with vpmaddubsw + vpmaddwd, and
 * quant_avx512_vnni.c with vpdpbusd. QX_TARGET is the includer's target attribute, so that the
 * library builds for generic x86-64 and the CPU is asked at run time (quant.c).
 * Each x86 file includes it once; every function here is static.
 * Not here: the K-quants (quant_avx2.c, shared by both), the scalar reference (quant_scalar.c).
 * Tests: tests/test_quant.c. */
#ifndef SHARDLM_QUANT_X86_H
#define SHARDLM_QUANT_X86_H

#include <immintrin.h>
#include <string.h>

#include "quant_impl.h"

#define QX_AVX2 __attribute__((target("avx2,fma,f16c")))

QX_AVX2 static inline float qx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QX_AVX2 static inline float qx_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* The 32 elements of a Q4 block as bytes 0..15: low nibbles (elements 0-15) in the low lane,
 * high nibbles (16-31) in the high lane. */
QX_AVX2 static inline __m256i qx_nibbles(const uint8_t qs[16])
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Byte i = 0x10 when bit i of the little-endian u32 qh is set: the fifth bits of a Q5 block. */
QX_AVX2 static inline __m256i qx_fifth_bits(const uint8_t qh[4])
{
    uint32_t v;
    memcpy(&v, qh, 4);
    /* Bytes 0-7 of the result take qh's byte 0, 8-15 byte 1, and so on; then each byte keeps
     * its own bit (i mod 8). */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)v),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* v with lane 0 lowered by c: the integer offset of a Q4_0/Q5_0 block, kept exact. */
QX_AVX2 static inline __m256i qx_sub_lane0(__m256i v, int32_t c)
{
    return _mm256_sub_epi32(v, _mm256_zextsi128_si256(_mm_cvtsi32_si128(c)));
}

/* ---- the 32-element types over dot_u8s8 (defined by the includer) ---- */

/* Q8_0: the weights are signed, so the sign moves onto x (vpsign) and |w| is the unsigned
 * operand; |w| <= 128 and |x| <= 127 keep vpmaddubsw's pair sums below 2^15. */
QX_TARGET static float dot_q8_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q8_0 *w = wv;
    const struct act_q8 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)w[b].qs);
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i p = dot_u8s8(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(p), acc);
    }
    return qx_hsum(acc);
}

/* Q4_0 and Q5_0 use their unsigned values and subtract the offset (8 or 16) times sum(x)
 * in the integers. */
QX_TARGET static float dot_q4_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_0 *w = wv;
    const struct act_q8 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i p = qx_sub_lane0(dot_u8s8(qx_nibbles(w[b].qs), qx), 8 * x[b].sum);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(p), acc);
    }
    return qx_hsum(acc);
}

QX_TARGET static float dot_q5_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_0 *w = wv;
    const struct act_q8 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256i q = _mm256_or_si256(qx_nibbles(w[b].qs), qx_fifth_bits(w[b].qh));
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[b].qs);
        const __m256i p = qx_sub_lane0(dot_u8s8(q, qx), 16 * x[b].sum);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(p), acc);
    }
    return qx_hsum(acc);
}

/* Q4_1 and Q5_1: the min m contributes m * d_x * sum(x), kept apart in a scalar. */
QX_TARGET static float dot_q4_1(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_1 *w = wv;
    const struct act_q8 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const __m256i p = dot_u8s8(qx_nibbles(w[b].qs), _mm256_loadu_si256((const __m256i *)x[b].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(p), acc);
        acc_m += qx_h2f(w[b].m) * x[b].d * (float)x[b].sum;
    }
    return qx_hsum(acc) + acc_m;
}

QX_TARGET static float dot_q5_1(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_1 *w = wv;
    const struct act_q8 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float acc_m = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const __m256i q = _mm256_or_si256(qx_nibbles(w[b].qs), qx_fifth_bits(w[b].qh));
        const __m256i p = dot_u8s8(q, _mm256_loadu_si256((const __m256i *)x[b].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d), _mm256_cvtepi32_ps(p), acc);
        acc_m += qx_h2f(w[b].m) * x[b].d * (float)x[b].sum;
    }
    return qx_hsum(acc) + acc_m;
}

#endif
