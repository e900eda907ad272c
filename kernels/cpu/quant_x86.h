/* kernels/cpu/quant_x86.h - what the two x86 implementations of the quantized product share:
 * AVX2 helpers (horizontal sum, nibble and fifth-bit unpacking) and the dot products of the
 * 32-element types (Q4_0 ... Q8_0, IQ4_NL), written once over an integer dot `dot_u8s8` that the including file
 * defines before including this one: quant_avx2.c with vpmaddubsw + vpmaddwd, and
 * quant_avx512_vnni.c with vpdpbusd. QX_TARGET is the includer's target attribute, so that the
 * library builds for generic x86-64 and the CPU is asked at run time (quant.c).
 * Each x86 file includes it once; every function here is static.
 * Not here: the K-quants (quant_avx2.c, shared by both), the scalar reference (quant_scalar.c).
 * Tests: tests/test_quant.c. */
#ifndef SHARDLM_QUANT_X86_H
#define SHARDLM_QUANT_X86_H

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "quant_impl.h"
#include "quant_x86_unpack.h"

#define QX_AVX2 __attribute__((target("avx2,fma,f16c")))

QX_AVX2 static inline float qx_hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

QX_AVX2 static inline float qx_h2f(uint16_t h) { return _cvtsh_ss(h); }

/* v with lane 0 lowered by c: the integer offset of a Q4_0/Q5_0 block, kept exact. */
QX_AVX2 static inline __m256i qx_sub_lane0(__m256i v, int32_t c)
{
    return _mm256_sub_epi32(v, _mm256_zextsi128_si256(_mm_cvtsi32_si128(c)));
}

/* ---- the 32-element types over dot_u8s8 (defined by the includer) ----
 * Each type's kernel exists for one row of x (dot_*) and for four (dot4_*, prefill): a weight
 * block is loaded and unpacked once for the four rows, which is most of the work of Q4/Q5. */

/* The 32 signed weights of a Q8_0 block, and of an IQ4_NL block (its nibbles looked up in
 * quant_iq4_values, a vpshufb per lane). */
QX_AVX2 static inline __m256i qx_load_q8_0(const uint8_t *blk) { return _mm256_loadu_si256((const __m256i *)(blk + 2)); }
QX_AVX2 static inline __m256i qx_iq4_lookup(__m256i nibbles)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)quant_iq4_values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(v, v), nibbles);
}
QX_AVX2 static inline __m256i qx_load_iq4_nl(const uint8_t *blk) { return qx_iq4_lookup(qx_nibbles(blk + 2)); }

/* Q8_0 and IQ4_NL (blocks of block_bytes with an f16 d first, load giving the 32 signed
 * weights) for nr (1 or 4, a constant after inlining) rows of x, xs bytes apart; y[r * ys].
 * The weights are signed, so their sign moves onto x (vpsign) and |w| is the unsigned operand;
 * |w| <= 128 and |x| <= 127 keep vpmaddubsw's pair sums below 2^15. */
QX_TARGET __attribute__((always_inline)) static inline void
s8_rows(int64_t nb, const void *wv, size_t block_bytes, __m256i (*load)(const uint8_t *), const uint8_t *xb,
        size_t xs, int nr, float *y, int64_t ys)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = (const uint8_t *)wv + (size_t)b * block_bytes;
        qx_prefetch(blk, 1);
        const __m256i qw = load(blk);
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        uint16_t d16;
        memcpy(&d16, blk, 2);
        const float dw = qx_h2f(d16);
        for (int r = 0; r < nr; r++) {
            const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)r * xs) + b;
            const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
            const __m256i p = dot_u8s8(aw, _mm256_sign_epi8(qx, qw));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) y[r * ys] = qx_hsum(acc[r]);
}

/* A Q4/Q5 block ready for any row of x: unsigned values u and w = d * (u - off) + m. */
struct qx_block {
    __m256i u;
    float   d, m;
    int32_t off;
};

QX_AVX2 static inline struct qx_block qx_unpack_q4_0(const void *w, int64_t b)
{
    const struct blk_q4_0 *p = (const struct blk_q4_0 *)w + b;
    return (struct qx_block){qx_nibbles(p->qs), qx_h2f(p->d), 0.0f, 8};
}
QX_AVX2 static inline struct qx_block qx_unpack_q4_1(const void *w, int64_t b)
{
    const struct blk_q4_1 *p = (const struct blk_q4_1 *)w + b;
    return (struct qx_block){qx_nibbles(p->qs), qx_h2f(p->d), qx_h2f(p->m), 0};
}
QX_AVX2 static inline struct qx_block qx_unpack_q5_0(const void *w, int64_t b)
{
    const struct blk_q5_0 *p = (const struct blk_q5_0 *)w + b;
    return (struct qx_block){_mm256_or_si256(qx_nibbles(p->qs), qx_fifth_bits(p->qh)), qx_h2f(p->d), 0.0f, 16};
}
QX_AVX2 static inline struct qx_block qx_unpack_q5_1(const void *w, int64_t b)
{
    const struct blk_q5_1 *p = (const struct blk_q5_1 *)w + b;
    return (struct qx_block){_mm256_or_si256(qx_nibbles(p->qs), qx_fifth_bits(p->qh)), qx_h2f(p->d),
                             qx_h2f(p->m), 0};
}

/* Q4_0, Q4_1, Q5_0, Q5_1: nw rows of W (ws bytes apart) against nr rows of x (xs bytes apart),
 * nw * nr <= 4, y[rw * yw + rx * ys]: one row of W against four of x (prefill tiles, as
 * s8_rows), or four rows of W against one of x (decode: four weight streams in flight, x's
 * block loaded once). The offset (8 or 16) times sum(x) is subtracted in the integers, exactly;
 * the min (has_min: Q4_1, Q5_1) contributes m * d_x * sum(x), kept apart in a scalar. */
QX_TARGET __attribute__((always_inline)) static inline void
q45_tile(int64_t nb, const void *w, size_t ws, int nw, size_t block_bytes,
         struct qx_block (*unpack)(const void *, int64_t), int has_min, const uint8_t *xb, size_t xs, int nr,
         float *y, int64_t yw, int64_t ys)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    float acc_m[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b = 0; b < nb; b++) {
        for (int rw = 0; rw < nw; rw++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)rw * ws;
            qx_prefetch(wr + (size_t)b * block_bytes, 1); /* 18-24 bytes: a line each */
            const struct qx_block q = unpack(wr, b);
            for (int rx = 0; rx < nr; rx++) {
                const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)rx * xs) + b;
                const int a = rw * nr + rx;
                __m256i p = dot_u8s8(q.u, _mm256_loadu_si256((const __m256i *)x->qs));
                if (q.off) p = qx_sub_lane0(p, q.off * x->sum);
                acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(q.d * x->d), _mm256_cvtepi32_ps(p), acc[a]);
                /* fmaf, not a * b + c: GCC contracted the latter in some of this function's
                 * inlined copies and not in others, so that a row's result depended on whether
                 * it went through dot, dot4 or dotw4 (batch invariance broke). */
                if (has_min) acc_m[a] = fmaf(q.m, x->dsum, acc_m[a]);
            }
        }
    }
    for (int rw = 0; rw < nw; rw++)
        for (int rx = 0; rx < nr; rx++) y[rw * yw + rx * ys] = qx_hsum(acc[rw * nr + rx]) + acc_m[rw * nr + rx];
}

/* The table's entry points: one row (quant_dot_fn), four rows of x (quant_dot4_fn) and four
 * rows of W (quant_dotw4_fn; not for Q8_0, whose row-by-row kernel was 10 % faster than four
 * rows: 23.5 against 25.6-26.0 ms in bench_quant --lm-head). Four rows of W measured
 * (bench_quant --lm-head: 262,144 x 640, one thread, VNNI, 2026-11-25): Q5_0 22.3 ms against
 * 28.7-30.3 ms row by row, Q4_0 16.6 against 25.5-26.3 ms. */
#define QX_Q45(name, has_min)                                                                    \
    QX_TARGET static float dot_##name(int64_t nb, const void *w, const void *xq)                 \
    {                                                                                            \
        float y;                                                                                 \
        q45_tile(nb, w, 0, 1, sizeof(struct blk_##name), qx_unpack_##name, has_min, xq, 0, 1, &y, 0, 0); \
        return y;                                                                                \
    }                                                                                            \
    QX_TARGET static void dot4_##name(int64_t nb, const void *w, const void *xq, size_t xs,      \
                                      float *y, int64_t ys)                                      \
    {                                                                                            \
        q45_tile(nb, w, 0, 1, sizeof(struct blk_##name), qx_unpack_##name, has_min, xq, xs, 4, y, 0, ys); \
    }                                                                                            \
    QX_TARGET static void dotw4_##name(int64_t nb, const void *w, size_t ws, const void *xq, float *y) \
    {                                                                                            \
        q45_tile(nb, w, ws, 4, sizeof(struct blk_##name), qx_unpack_##name, has_min, xq, 0, 1, y, 1, 0); \
    }
QX_Q45(q4_0, 0)
QX_Q45(q4_1, 1)
QX_Q45(q5_0, 0)
QX_Q45(q5_1, 1)
#undef QX_Q45

#define QX_S8(name)                                                                              \
    QX_TARGET static float dot_##name(int64_t nb, const void *w, const void *xq)                 \
    {                                                                                            \
        float y;                                                                                 \
        s8_rows(nb, w, sizeof(struct blk_##name), qx_load_##name, xq, 0, 1, &y, 0);               \
        return y;                                                                                \
    }                                                                                            \
    QX_TARGET static void dot4_##name(int64_t nb, const void *w, const void *xq, size_t xs,      \
                                      float *y, int64_t ys)                                      \
    {                                                                                            \
        s8_rows(nb, w, sizeof(struct blk_##name), qx_load_##name, xq, xs, 4, y, ys);              \
    }
QX_S8(q8_0)
QX_S8(iq4_nl)
#undef QX_S8

#endif
