/* kernels/cpu/quant_x86.h - what the three x86 implementations of the quantized product share:
 * AVX2 helpers (horizontal sum, nibble and fifth-bit unpacking) and the dot products of the
 * 32-element types (Q4_0 ... Q8_0, IQ4_NL, MXFP4), written once over an integer dot `dot_u8s8` that the including file
 * defines before including this one: quant_avx2.c with vpmaddubsw + vpmaddwd, quant_avx_vnni.c
 * and quant_avx512_vnni.c with vpdpbusd (VEX and EVEX forms). QX_TARGET is the includer's target
 * attribute, so that the library builds for generic x86-64 and the CPU is asked at run time
 * (quant.c). The includer may also define QX_VNNI (the packed kernels accumulate with
 * QX_DPBUSD(acc, u8, s8), its vpdpbusd) and QX_MASKZ (AVX512BW: Q5's fifth bits by one masked
 * move).
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

/* QX_DPBUSD_X(acc, u, x): QX_DPBUSD with the signed operand the four bytes at x broadcast to
 * every lane. The includer may define it (AVX-512: the broadcast folded into the instruction). */
#if defined(QX_VNNI) && !defined(QX_DPBUSD_X)
#define QX_DPBUSD_X(acc, u, x) QX_DPBUSD((acc), (u), qx_bcast32(x))
QX_AVX2 static inline __m256i qx_bcast32(const int8_t *x)
{
    int32_t w;
    memcpy(&w, x, 4);
    return _mm256_set1_epi32(w);
}
#endif

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

/* The 32 signed weights of a Q8_0 block, and of an IQ4_NL or MXFP4 block (its nibbles looked up
 * in quant_iq4_values or quant_mxfp4_values, a vpshufb per lane); the scale of an IQ4_NL block
 * (an f16 first) and of an MXFP4 block (an E8M0 byte first, halved). */
QX_AVX2 static inline __m256i qx_load_q8_0(const uint8_t *blk) { return _mm256_loadu_si256((const __m256i *)(blk + 2)); }
QX_AVX2 static inline __m256i qx_lookup(const int8_t values[16], __m256i nibbles)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(v, v), nibbles);
}
QX_AVX2 static inline __m256i qx_iq4_lookup(__m256i nibbles) { return qx_lookup(quant_iq4_values, nibbles); }
QX_AVX2 static inline __m256i qx_load_iq4_nl(const uint8_t *blk) { return qx_iq4_lookup(qx_nibbles(blk + 2)); }
QX_AVX2 static inline __m256i qx_load_mxfp4(const uint8_t *blk) { return qx_lookup(quant_mxfp4_values, qx_nibbles(blk + 1)); }
QX_AVX2 static inline float qx_scale_iq4_nl(const uint8_t *blk)
{
    uint16_t d16;
    memcpy(&d16, blk, 2);
    return qx_h2f(d16);
}
QX_AVX2 static inline float qx_scale_mxfp4(const uint8_t *blk) { return quant_mxfp4_half(blk[0]); }

/* IQ4_NL and MXFP4 (blocks of block_bytes, load giving the 32 signed weights, scale their
 * scale) for nr (1 or 4, a constant after inlining) rows of x, xs bytes apart; y[r * ys].
 * The weights are signed, so their sign moves onto x (vpsign) and |w| is the unsigned operand;
 * |w| <= 128 and |x| <= 127 keep vpmaddubsw's pair sums below 2^15. */
QX_TARGET __attribute__((always_inline)) static inline void
s8_rows(int64_t nb, const void *wv, size_t block_bytes, __m256i (*load)(const uint8_t *),
        float (*scale)(const uint8_t *), const uint8_t *xb, size_t xs, int nr, float *y, int64_t ys)
{
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = (const uint8_t *)wv + (size_t)b * block_bytes;
        qx_prefetch(blk, 1);
        const __m256i qw = load(blk);
        const __m256i aw = _mm256_sign_epi8(qw, qw);
        const float dw = scale(blk);
        for (int r = 0; r < nr; r++) {
            const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)r * xs) + b;
            const __m256i qx = _mm256_loadu_si256((const __m256i *)x->qs);
            const __m256i p = dot_u8s8(aw, _mm256_sign_epi8(qx, qw));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x->d), _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) y[r * ys] = qx_hsum(acc[r]);
}

/* ---- Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0: the block-exact order (quant_impl.h) ----
 * Every implementation and layout of these types computes a row as: per block the exact
 * integer sum isum (Q4_0's offset included), acc = fmaf(d_w * d_x, isum, acc), the min apart as
 * accm = fmaf(m, d_x sum(x), accm), y = acc + accm. So a row's bits do not depend on the tile,
 * the layout (rows as stored, or eight at a time: quant_packed.c), the thread split or the
 * implementation. */

/* The four sums of a, b, c and d's eight int32 lanes. */
QX_AVX2 static inline __m128i qx_hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i s = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
}

QX_AVX2 static inline int32_t qx_hsum_epi32(__m256i a)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* A block of the exact types ready for any row of x: the unsigned operand u, the sign source
 * s of signed weights (Q8_0: u = |w|, and x takes w's sign), w = d * (u - off) + m. */
struct qx_exact {
    __m256i u, s;
    float   d, m;
    int32_t off;
};

QX_AVX2 static inline struct qx_exact qx_exact_q4_0(const void *w, int64_t b)
{
    const struct blk_q4_0 *p = (const struct blk_q4_0 *)w + b;
    return (struct qx_exact){qx_nibbles(p->qs), _mm256_setzero_si256(), qx_h2f(p->d), 0.0f, 8};
}
QX_AVX2 static inline struct qx_exact qx_exact_q4_1(const void *w, int64_t b)
{
    const struct blk_q4_1 *p = (const struct blk_q4_1 *)w + b;
    return (struct qx_exact){qx_nibbles(p->qs), _mm256_setzero_si256(), qx_h2f(p->d), qx_h2f(p->m), 0};
}
QX_AVX2 static inline struct qx_exact qx_exact_q5_0(const void *w, int64_t b)
{
    const struct blk_q5_0 *p = (const struct blk_q5_0 *)w + b;
    return (struct qx_exact){_mm256_or_si256(qx_nibbles(p->qs), qx_fifth_bits(p->qh)), _mm256_setzero_si256(),
                             qx_h2f(p->d), 0.0f, 16};
}
QX_AVX2 static inline struct qx_exact qx_exact_q5_1(const void *w, int64_t b)
{
    const struct blk_q5_1 *p = (const struct blk_q5_1 *)w + b;
    return (struct qx_exact){_mm256_or_si256(qx_nibbles(p->qs), qx_fifth_bits(p->qh)), _mm256_setzero_si256(),
                             qx_h2f(p->d), qx_h2f(p->m), 0};
}
QX_AVX2 static inline struct qx_exact qx_exact_q8_0(const void *w, int64_t b)
{
    const struct blk_q8_0 *p = (const struct blk_q8_0 *)w + b;
    const __m256i q = _mm256_loadu_si256((const __m256i *)p->qs);
    return (struct qx_exact){_mm256_sign_epi8(q, q), q, qx_h2f(p->d), 0.0f, 0};
}

/* nw rows of W against nr rows of x (nw * nr is 1 or 4, constants after inlining), as q45_tile,
 * in the block-exact order. */
QX_TARGET __attribute__((always_inline)) static inline void
exact_tile(int64_t nb, const void *w, size_t ws, int nw, size_t block_bytes,
           struct qx_exact (*unpack)(const void *, int64_t), int has_min, int signed_w, const uint8_t *xb, size_t xs, int nr, float *y, int64_t yw, int64_t ys)
{
    __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
    float acc1 = 0.0f, accm1 = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m256i p[4];
        float dd[4], mm[4], ds[4];
        int32_t off[4];
        for (int rw = 0; rw < nw; rw++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)rw * ws;
            qx_prefetch(wr + (size_t)b * block_bytes, 1);
            const struct qx_exact q = unpack(wr, b);
            for (int rx = 0; rx < nr; rx++) {
                const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)rx * xs) + b;
                const int a = rw * nr + rx;
                __m256i xv = _mm256_loadu_si256((const __m256i *)x->qs);
                if (signed_w) xv = _mm256_sign_epi8(xv, q.s);
                p[a] = dot_u8s8(q.u, xv);
                dd[a] = q.d * x->d, mm[a] = q.m, ds[a] = x->dsum, off[a] = q.off * x->sum;
            }
        }
        if (nw * nr == 1) {
            acc1 = fmaf(dd[0], (float)(qx_hsum_epi32(p[0]) - off[0]), acc1);
            if (has_min) accm1 = fmaf(mm[0], ds[0], accm1);
        } else {
            const __m128i is = _mm_sub_epi32(qx_hsum4_epi32(p[0], p[1], p[2], p[3]),
                                             _mm_setr_epi32(off[0], off[1], off[2], off[3]));
            acc = _mm_fmadd_ps(_mm_setr_ps(dd[0], dd[1], dd[2], dd[3]), _mm_cvtepi32_ps(is), acc);
            if (has_min)
                accm = _mm_fmadd_ps(_mm_setr_ps(mm[0], mm[1], mm[2], mm[3]), _mm_setr_ps(ds[0], ds[1], ds[2], ds[3]), accm);
        }
    }
    if (nw * nr == 1) {
        y[0] = acc1 + accm1;
        return;
    }
    float r[4];
    _mm_storeu_ps(r, _mm_add_ps(acc, accm));
    for (int rw = 0; rw < nw; rw++)
        for (int rx = 0; rx < nr; rx++) y[rw * yw + rx * ys] = r[rw * nr + rx];
}

#define QX_EXACT(name, has_min, signed_w)                                                        \
    QX_TARGET static float dot_##name(int64_t nb, const void *w, const void *xq)                 \
    {                                                                                            \
        float y;                                                                                 \
        exact_tile(nb, w, 0, 1, sizeof(struct blk_##name), qx_exact_##name, has_min, signed_w, xq, 0, 1, &y, 0, 0);         \
        return y;                                                                                \
    }                                                                                            \
    QX_TARGET static void dot4_##name(int64_t nb, const void *w, const void *xq, size_t xs,      \
                                      float *y, int64_t ys)                                      \
    {                                                                                            \
        exact_tile(nb, w, 0, 1, sizeof(struct blk_##name), qx_exact_##name, has_min, signed_w, xq, xs, 4, y, 0, ys);        \
    }                                                                                            \
    QX_TARGET static void dotw4_##name(int64_t nb, const void *w, size_t ws, const void *xq, float *y) \
    {                                                                                            \
        exact_tile(nb, w, ws, 4, sizeof(struct blk_##name), qx_exact_##name, has_min, signed_w, xq, 0, 1, y, 1, 0);         \
    }
QX_EXACT(q4_0, 0, 0)
QX_EXACT(q4_1, 1, 0)
QX_EXACT(q5_0, 0, 0)
QX_EXACT(q5_1, 1, 0)
QX_EXACT(q8_0, 0, 1)
#undef QX_EXACT

/* The fifth bits of a Q5 block as 0x10 bytes: one masked move where AVX512BW is there. */
#ifdef QX_MASKZ
#define QX_FIFTH(qh) _mm256_maskz_mov_epi8(qx_u32(qh), _mm256_set1_epi8(0x10))
QX_TARGET static inline __mmask32 qx_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return (__mmask32)v;
}
#else
#define QX_FIFTH(qh) qx_fifth_bits(qh)
#endif

/* ---- eight rows at a time (the packed layout of quant_packed.c) ----
 * R rows of x (R = 1: packed8, decode; R = 4 or 2: packed8x4 / x2; on AVX2 also 3 and 5 for Q8_0, Q4_0 and
 * Q5_0: several rows of a step) against a group
 * of eight rows packed by quant_pack_rows8: y[r ys + 0..8). The 32-bit lanes are the eight rows,
 * so the block's scales load as one vector and each x word is broadcast once for all eight rows;
 * with R = 4 each block's weights are loaded and unpacked once for the four rows of x. Each row
 * of x keeps its own accumulators and sums in the same order whatever R is, so a row's result
 * has the same bits alone as among four (test_quant).
 * packed8_q45: Q4_0 / Q4_1 (five 0) and Q5_0 / Q5_1 (five 1). Q5's fifth bits come as one 32-bit
 * mask per half chunk (bit 4 r + t: row r's element of that lane), spread to 0x10 bytes. Without
 * VNNI the products of a pair of chunks (four vpmaddubsw: values up to 31 by int8 x) add as int16
 * within 2^15 before one vpmaddwd each half; the integer sums are exact either way. */
QX_TARGET __attribute__((always_inline)) static inline void
packed8_q45(int64_t nb, const uint8_t *wp, int has_min, int five, const uint8_t *xb, size_t xs, float *y, int64_t ys,
            int R)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    (void)ones; /* not with QX_VNNI */
    const size_t pb = five ? (has_min ? QUANT_R8_Q5_1 : QUANT_R8_Q5_0) : (has_min ? QUANT_R8_Q4_1 : QUANT_R8_Q4_0);
    const size_t head = has_min ? 32 : 16;
    const int32_t zero = five ? 16 : 8; /* the offset of unsigned quants without a min */
    __m256 acc[5], accm[5];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wp += pb) {
        qx_prefetch_far(wp, pb);
        const uint8_t *hb = wp + head, *qs = five ? hb + 32 : hb;
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
        const struct act_q8 *x[5];
        __m256i is[5];
        for (int r = 0; r < R; r++) x[r] = (const struct act_q8 *)(xb + (size_t)r * xs) + b, is[r] = _mm256_setzero_si256();
#ifdef QX_VNNI
        __m256i lo[4], hi[4];
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            lo[j] = _mm256_and_si256(v, m4), hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (five)
                lo[j] = _mm256_or_si256(lo[j], QX_FIFTH(hb + 8 * j)), hi[j] = _mm256_or_si256(hi[j], QX_FIFTH(hb + 8 * j + 4));
        }
        for (int r = 0; r < R; r++) {
            const int8_t *xq = x[r]->qs;
            __m256i part[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                               _mm256_setzero_si256()};
            for (int j = 0; j < 4; j++) {
                part[j & 1] = QX_DPBUSD_X(part[j & 1], lo[j], xq + 4 * j);
                part[2 + (j & 1)] = QX_DPBUSD_X(part[2 + (j & 1)], hi[j], xq + 16 + 4 * j);
            }
            is[r] = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
        }
#else
        /* A pair of chunks at a time, unpacked once, then every row's products with it: four
         * live vectors of the block instead of eight, so that R = 4's sums stay in registers. */
        for (int j = 0; j < 4; j += 2) {
            __m256i lo[2], hi[2];
            for (int t = 0; t < 2; t++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j + t)));
                lo[t] = _mm256_and_si256(v, m4), hi[t] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five)
                    lo[t] = _mm256_or_si256(lo[t], QX_FIFTH(hb + 8 * (j + t))),
                    hi[t] = _mm256_or_si256(hi[t], QX_FIFTH(hb + 8 * (j + t) + 4));
            }
            for (int r = 0; r < R; r++) {
                const int8_t *xq = x[r]->qs;
                __m256i s16 = _mm256_setzero_si256();
                for (int t = 0; t < 2; t++) {
                    int32_t xl, xh;
                    memcpy(&xl, xq + 4 * (j + t), 4);
                    memcpy(&xh, xq + 16 + 4 * (j + t), 4);
                    s16 = _mm256_add_epi16(s16, _mm256_add_epi16(_mm256_maddubs_epi16(lo[t], _mm256_set1_epi32(xl)),
                                                                 _mm256_maddubs_epi16(hi[t], _mm256_set1_epi32(xh))));
                }
                is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(s16, ones));
            }
        }
#endif
        for (int r = 0; r < R; r++) {
            if (!has_min) is[r] = _mm256_sub_epi32(is[r], _mm256_set1_epi32(zero * x[r]->sum));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[r]->d)), _mm256_cvtepi32_ps(is[r]), acc[r]);
            if (has_min)
                accm[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + 16))),
                                          _mm256_set1_ps(x[r]->dsum), accm[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ys, _mm256_add_ps(acc[r], accm[r]));
}

/* Q8_0, packed as w + 128 (unsigned, quant_impl.h). With QX_VNNI one vpdpbusd per vector and x
 * word, sum((w + 128) x) - 128 sum(x) per block (exact in int32); otherwise the top bit flipped
 * back and each vector's sign moved onto the broadcast x word (as s8_rows), since a product pair
 * of vpmaddubsw reaches 2 * 128 * 127 only so, every vector with its own vpmaddwd. */
QX_TARGET __attribute__((always_inline)) static inline void
packed8_q8(int64_t nb, const uint8_t *wp, const uint8_t *xb, size_t xs, float *y, int64_t ys, int R)
{
    const __m256i ones = _mm256_set1_epi16(1);
    (void)ones; /* not with QX_VNNI */
    __m256 acc[5];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q8_0) {
        qx_prefetch_far(wp, QUANT_R8_Q8_0);
        /* Without VNNI each weight vector once, then every row's product with it: two live
         * vectors of the block instead of sixteen, so that up to five rows' sums stay in AVX2's
         * sixteen registers (the integer sums are exact, so their order changes no bit). */
        const struct act_q8 *x[5];
        __m256i is[5];
        for (int r = 0; r < R; r++) x[r] = (const struct act_q8 *)(xb + (size_t)r * xs) + b, is[r] = _mm256_setzero_si256();
#ifdef QX_VNNI
        /* (With VNNI, as before the reorder: four partial sums per row, for their latency.) */
        __m256i v[8];
        for (int k = 0; k < 8; k++) v[k] = _mm256_loadu_si256((const __m256i *)(wp + 16 + 32 * k));
        for (int r = 0; r < R; r++) {
            __m256i part[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                               _mm256_setzero_si256()};
            for (int k = 0; k < 8; k++) part[k & 3] = QX_DPBUSD_X(part[k & 3], v[k], x[r]->qs + 4 * k);
            is[r] = _mm256_add_epi32(_mm256_add_epi32(part[0], part[1]), _mm256_add_epi32(part[2], part[3]));
        }
#else
        for (int k = 0; k < 8; k++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wp + 16 + 32 * k));
            v = _mm256_xor_si256(v, _mm256_set1_epi8((char)0x80));
            const __m256i av = _mm256_sign_epi8(v, v);
            for (int r = 0; r < R; r++) {
                int32_t xw;
                memcpy(&xw, x[r]->qs + 4 * k, 4);
                const __m256i p = _mm256_maddubs_epi16(av, _mm256_sign_epi8(_mm256_set1_epi32(xw), v));
                is[r] = _mm256_add_epi32(is[r], _mm256_madd_epi16(p, ones));
            }
        }
#endif
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
        for (int r = 0; r < R; r++) {
#ifdef QX_VNNI
            is[r] = _mm256_sub_epi32(is[r], _mm256_set1_epi32(128 * x[r]->sum));
#endif
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(x[r]->d)), _mm256_cvtepi32_ps(is[r]), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ys, _mm256_add_ps(acc[r], _mm256_setzero_ps())); /* acc + 0, as the others */
}

/* Q4_K, R rows of x (1 or 4) against eight packed rows (quant_impl.h's layout): per pair of
 * sub-blocks eight chunks whose lanes are the rows, the nibbles of each sub-block summed as int16
 * (8 x 2 x 15 x 127 < 2^15) and scaled per row by one vpmaddwd with (sc, sc) pairs (with QX_VNNI:
 * summed as int32 by vpdpbusd, scaled by vpmulld); the mins by
 * four vpmaddwd of the (m, m') byte pairs with x's 32-sums. The block-exact order of
 * quant_k_accumulate, each row of x with its own sums (the same bits for R 1 and 4). Compiled once per
 * including file, so the AVX512-VNNI copy has 32 vector registers for R = 4's sums. */
QX_TARGET __attribute__((always_inline)) static inline void
packed8_q4k_rows(int64_t nb, const uint8_t *wp, const uint8_t *xb, size_t xs, float *y, int64_t ys, int R)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[4], accm[4];
    for (int r = 0; r < R; r++) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q4_K) {
        qx_prefetch_far(wp, QUANT_R8_Q4_K);
        __m256i isum[4], msum[4];
        for (int r = 0; r < R; r++) isum[r] = msum[r] = _mm256_setzero_si256();
#ifdef QX_VNNI
        for (int p = 0; p < 4; p++) {
            __m256i s_lo[4], s_hi[4];
            for (int r = 0; r < R; r++) s_lo[r] = s_hi[r] = _mm256_setzero_si256();
            for (int c = 0; c < 8; c++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(wp + 160 + 256 * p + 32 * c));
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                for (int r = 0; r < R; r++) {
                    const int8_t *xq = ((const struct act_q8_k *)(xb + (size_t)r * xs) + b)->qs;
                    /* the sub-block's sums in int32, one vpdpbusd per chunk */
                    s_lo[r] = QX_DPBUSD_X(s_lo[r], lo, xq + 64 * p + 4 * c);
                    s_hi[r] = QX_DPBUSD_X(s_hi[r], hi, xq + 64 * p + 32 + 4 * c);
                }
            }
            const __m256i sc_lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 32 + 16 * p)));
            const __m256i sc_hi = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 40 + 16 * p)));
            for (int r = 0; r < R; r++)
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(s_lo[r], sc_lo),
                                                                     _mm256_mullo_epi32(s_hi[r], sc_hi)));
        }
#else
        /* Without VNNI (16 vector registers) one sub-block at a time, the low nibbles' then the
         * high ones', each row's int16 sums scaled into its isum at once: R sums live, not 2 R
         * (the integer sums are exact, so their order changes no bit). */
        for (int p = 0; p < 4; p++)
            for (int h = 0; h < 2; h++) {
                __m256i s16[4];
                for (int r = 0; r < R; r++) s16[r] = _mm256_setzero_si256();
                for (int c = 0; c < 8; c++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(wp + 160 + 256 * p + 32 * c));
                    const __m256i q = _mm256_and_si256(h ? _mm256_srli_epi16(v, 4) : v, m4);
                    for (int r = 0; r < R; r++) {
                        const int8_t *xq = ((const struct act_q8_k *)(xb + (size_t)r * xs) + b)->qs;
                        int32_t xw;
                        memcpy(&xw, xq + 64 * p + 32 * h + 4 * c, 4);
                        s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(q, _mm256_set1_epi32(xw)));
                    }
                }
                __m256i sc = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(wp + 32 + 8 * h + 16 * p)));
                sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
                for (int r = 0; r < R; r++) isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(s16[r], sc));
            }
#endif
        for (int p = 0; p < 4; p++) {
            const __m256i mv = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(wp + 96 + 16 * p)));
            for (int r = 0; r < R; r++) {
                const struct act_q8_k *x = (const struct act_q8_k *)(xb + (size_t)r * xs) + b;
                const int32_t bs0 = x->bsums[4 * p] + x->bsums[4 * p + 1], bs1 = x->bsums[4 * p + 2] + x->bsums[4 * p + 3];
                msum[r] = _mm256_add_epi32(msum[r], _mm256_madd_epi16(mv, _mm256_set1_epi32((int32_t)((uint32_t)(uint16_t)bs0 |
                                                                                                      (uint32_t)bs1 << 16))));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
        const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wp + 16)));
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(((const struct act_q8_k *)(xb + (size_t)r * xs) + b)->d);
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(isum[r]), acc[r]);
            accm[r] = _mm256_fmadd_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(msum[r]), accm[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ys, _mm256_sub_ps(acc[r], accm[r]));
}

/* Q6_K, R rows of x against eight packed rows (quant_impl.h's layout): per chunk of 32 elements
 * four vectors of the low group's values and four of the high group's (nibble | top bits << 4,
 * 0..63, the lanes the rows), their products with x summed per group (int32, exact), times the
 * group's scale per row (vpmulld); the -32 once per block through x's 16-sums and the scale pairs
 * (vpmaddwd). The integer sum of the block is dot_q6_k's, so every layout and implementation
 * gives the same bits. */
QX_TARGET __attribute__((always_inline)) static inline void
packed8_q6k_rows(int64_t nb, const uint8_t *wp, const uint8_t *xb, size_t xs, float *y, int64_t ys, int R)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), ones = _mm256_set1_epi16(1);
    (void)ones; /* not with QX_VNNI */
    __m256 acc[4];
    for (int r = 0; r < R; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q6_K) {
        qx_prefetch_far(wp, QUANT_R8_Q6_K);
        __m256i isum[4], off[4];
        for (int r = 0; r < R; r++) isum[r] = off[r] = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            const uint8_t *qb = wp + 144 + 192 * t;
            const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wp + 16 + 16 * t)));
            const __m256i sc_lo = _mm256_srai_epi32(_mm256_slli_epi32(pair, 16), 16), sc_hi = _mm256_srai_epi32(pair, 16);
            const __m256i h0 = _mm256_loadu_si256((const __m256i *)(qb + 128)), h1 = _mm256_loadu_si256((const __m256i *)(qb + 160));
            __m256i lo[4], hi[4];
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qb + 32 * j)), h = j < 2 ? h0 : h1;
                const __m256i tl = j % 2 ? h : _mm256_slli_epi16(h, 4), th = j % 2 ? _mm256_srli_epi16(h, 2) : _mm256_slli_epi16(h, 2);
                lo[j] = _mm256_or_si256(_mm256_and_si256(v, m4), _mm256_and_si256(tl, m30));
                hi[j] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), _mm256_and_si256(th, m30));
            }
            for (int r = 0; r < R; r++) {
                const struct act_q8_k *x = (const struct act_q8_k *)(xb + (size_t)r * xs) + b;
                const int8_t *xq = x->qs + 32 * t;
                __m256i sl = _mm256_setzero_si256(), sh = _mm256_setzero_si256();
                for (int j = 0; j < 4; j++) {
#ifdef QX_VNNI
                    sl = QX_DPBUSD_X(sl, lo[j], xq + 4 * j);
                    sh = QX_DPBUSD_X(sh, hi[j], xq + 16 + 4 * j);
#else
                    int32_t xl, xh;
                    memcpy(&xl, xq + 4 * j, 4);
                    memcpy(&xh, xq + 16 + 4 * j, 4);
                    sl = _mm256_add_epi32(sl, _mm256_madd_epi16(_mm256_maddubs_epi16(lo[j], _mm256_set1_epi32(xl)), ones));
                    sh = _mm256_add_epi32(sh, _mm256_madd_epi16(_mm256_maddubs_epi16(hi[j], _mm256_set1_epi32(xh)), ones));
#endif
                }
                isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_mullo_epi32(sl, sc_lo), _mm256_mullo_epi32(sh, sc_hi)));
                int32_t bs;
                memcpy(&bs, x->bsums + 2 * t, 4); /* the 16-sums of the chunk's two groups */
                off[r] = _mm256_add_epi32(off[r], _mm256_madd_epi16(pair, _mm256_set1_epi32(bs)));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)wp));
        for (int r = 0; r < R; r++) {
            const __m256 dx = _mm256_set1_ps(((const struct act_q8_k *)(xb + (size_t)r * xs) + b)->d);
            const __m256i is = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(off[r], 5));
            acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(is), acc[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ys, _mm256_add_ps(acc[r], _mm256_setzero_ps()));
}

/* packed8xR_NAME: R rows of x against eight packed rows, one pass. QX_PACKED makes the one-row
 * kernel and the four- and two-row ones every table has; QX_PACKED_R (and the QX_Q* calls) stay
 * defined for the tables that add other row counts (quant_avx2.c's three and five). */
#define QX_PACKED_R(name, call, R)                                                               \
    QX_TARGET static void packed8x##R##_##name(int64_t nb, const void *wp, const void *xq,       \
                                                size_t xs, float *y, int64_t ys)                 \
    {                                                                                            \
        call(nb, wp, xq, xs, y, ys, R);                                                          \
    }
#define QX_PACKED(name, call)                                                                    \
    QX_TARGET static void packed8_##name(int64_t nb, const void *wp, const void *xq, float *y)   \
    {                                                                                            \
        call(nb, wp, xq, 0, y, 0, 1);                                                            \
    }                                                                                            \
    QX_PACKED_R(name, call, 4)                                                                   \
    QX_PACKED_R(name, call, 2)
#define QX_Q4_0(nb, wp, xq, xs, y, ys, R) packed8_q45(nb, wp, 0, 0, xq, xs, y, ys, R)
#define QX_Q4_1(nb, wp, xq, xs, y, ys, R) packed8_q45(nb, wp, 1, 0, xq, xs, y, ys, R)
#define QX_Q5_0(nb, wp, xq, xs, y, ys, R) packed8_q45(nb, wp, 0, 1, xq, xs, y, ys, R)
#define QX_Q5_1(nb, wp, xq, xs, y, ys, R) packed8_q45(nb, wp, 1, 1, xq, xs, y, ys, R)
QX_PACKED(q4_0, QX_Q4_0)
QX_PACKED(q4_1, QX_Q4_1)
QX_PACKED(q5_0, QX_Q5_0)
QX_PACKED(q5_1, QX_Q5_1)
QX_PACKED(q8_0, packed8_q8)
QX_PACKED(q4_k, packed8_q4k_rows)
QX_PACKED(q6_k, packed8_q6k_rows)
#undef QX_PACKED

#define QX_S8(name)                                                                              \
    QX_TARGET static float dot_##name(int64_t nb, const void *w, const void *xq)                 \
    {                                                                                            \
        float y;                                                                                 \
        s8_rows(nb, w, sizeof(struct blk_##name), qx_load_##name, qx_scale_##name, xq, 0, 1, &y, 0); \
        return y;                                                                                \
    }                                                                                            \
    QX_TARGET static void dot4_##name(int64_t nb, const void *w, const void *xq, size_t xs,      \
                                      float *y, int64_t ys)                                      \
    {                                                                                            \
        s8_rows(nb, w, sizeof(struct blk_##name), qx_load_##name, qx_scale_##name, xq, xs, 4, y, ys); \
    }
QX_S8(iq4_nl)
QX_S8(mxfp4)
#undef QX_S8

/* The kernel table of the two vpdpbusd implementations (quant_avx_vnni.c, quant_avx512_vnni.c). */
#define QX_VNNI_TABLE \
{                                                                                                                 \
    .dot = {                                                                                                      \
        [SLOT_Q4_0] = dot_q4_0, [SLOT_Q4_1] = dot_q4_1, [SLOT_Q5_0] = dot_q5_0,                                   \
        [SLOT_Q5_1] = dot_q5_1, [SLOT_Q8_0] = dot_q8_0, [SLOT_Q4_K] = quant_avx2_dot_q4_k,                        \
        [SLOT_Q5_K] = quant_avx2_dot_q5_k, [SLOT_Q6_K] = quant_avx2_dot_q6_k,                                     \
        [SLOT_Q2_K] = quant_avx2_dot_q2_k, [SLOT_Q3_K] = quant_avx2_dot_q3_k,                                     \
        [SLOT_IQ4_NL] = dot_iq4_nl, [SLOT_IQ4_XS] = quant_avx2_dot_iq4_xs, [SLOT_MXFP4] = dot_mxfp4,              \
    },                                                                                                            \
    .dot4 = {                                                                                                     \
        [SLOT_Q4_0] = dot4_q4_0, [SLOT_Q4_1] = dot4_q4_1, [SLOT_Q5_0] = dot4_q5_0,                                \
        [SLOT_Q5_1] = dot4_q5_1, [SLOT_Q8_0] = dot4_q8_0, [SLOT_IQ4_NL] = dot4_iq4_nl,                            \
        [SLOT_MXFP4] = dot4_mxfp4,                                                                                \
    },                                                                                                            \
    .dotw4 = {                                                                                                    \
        [SLOT_Q4_0] = dotw4_q4_0, [SLOT_Q4_1] = dotw4_q4_1, [SLOT_Q5_0] = dotw4_q5_0,                             \
        [SLOT_Q5_1] = dotw4_q5_1, [SLOT_Q8_0] = dotw4_q8_0,                                                       \
    },                                                                                                            \
    .packed8 = {[SLOT_Q4_0] = packed8_q4_0, [SLOT_Q4_1] = packed8_q4_1, [SLOT_Q8_0] = packed8_q8_0,               \
                [SLOT_Q4_K] = packed8_q4_k, [SLOT_Q5_0] = packed8_q5_0, [SLOT_Q5_1] = packed8_q5_1, [SLOT_Q6_K] = packed8_q6_k},   \
    .packed8x4 = {[SLOT_Q4_0] = packed8x4_q4_0, [SLOT_Q4_1] = packed8x4_q4_1, [SLOT_Q8_0] = packed8x4_q8_0,       \
                  [SLOT_Q4_K] = packed8x4_q4_k, [SLOT_Q5_0] = packed8x4_q5_0,                                     \
                  [SLOT_Q5_1] = packed8x4_q5_1, [SLOT_Q6_K] = packed8x4_q6_k},                                                                  \
    .packed8x2 = {[SLOT_Q4_0] = packed8x2_q4_0, [SLOT_Q4_1] = packed8x2_q4_1, [SLOT_Q8_0] = packed8x2_q8_0,       \
                  [SLOT_Q4_K] = packed8x2_q4_k, [SLOT_Q5_0] = packed8x2_q5_0,                                     \
                  [SLOT_Q5_1] = packed8x2_q5_1, [SLOT_Q6_K] = packed8x2_q6_k},                                                                  \
    .act_q8 = quant_avx2_act_q8,                                                                                  \
    .act_q8_k = quant_avx2_act_q8_k,                                                                              \
}

#endif
