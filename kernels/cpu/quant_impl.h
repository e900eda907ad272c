/* kernels/cpu/quant_impl.h - private to the quantized product (kernels/cpu/quant*.c): the ggml
 * weight blocks (byte layouts of ggml-common.h), the int8 activation blocks, and the table of
 * kernels that each implementation (scalar, AVX2, AVX512-VNNI) fills.
 * Not here: the public contract (kernels/quant.h), the driver (quant.c).
 * Tests: tests/test_quant.c. */
#ifndef SHARDLM_QUANT_IMPL_H
#define SHARDLM_QUANT_IMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

#define QK 32   /* elements per block of the 32-element types */
#define QK_K 256 /* elements per K-quant super-block */

/* ---- weight blocks, as stored (f16 scales as raw bits) ---- */
struct blk_q4_0 { uint16_t d; uint8_t qs[QK / 2]; };               /* w = d * (q - 8) */
struct blk_q4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };            /* w = d * q + m */
struct blk_q5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; }; /* w = d * (q - 16) */
struct blk_q5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct blk_q8_0 { uint16_t d; int8_t qs[QK]; };                    /* w = d * q */
/* Element i < 16 of a Q4/Q5 block is the low nibble of qs[i], element i + 16 its high nibble;
 * bit i of qh (little-endian u32) is element i's fifth bit. */

/* K-quants: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes (Q4_K, Q5_K:
 * w = d * sc_j * q - dmin * m_j), or 16 sub-blocks of 16 with int8 scales (Q6_K:
 * w = d * sc_g * (q - 32)). */
struct blk_q4_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct blk_q5_k { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct blk_q6_k { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
/* Q2_K: 16 groups of 16 with 4-bit scale (low nibble) and min (high nibble) in scales[g],
 * w = d * sc_g * q - dmin * m_g, q 2 bits. Element e = 128 h + 32 s + l is bits 2s, 2s + 1 of
 * qs[32 h + l], in group e / 16. */
struct blk_q2_k { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
/* Q3_K: 16 groups of 16 with 6-bit scales (quant_q3_k_scale) less 32, w = d * sc_g * q with
 * q = (2 bits as Q2_K's) - 4 where bit e / 32 of hmask[e % 32] is clear. */
struct blk_q3_k { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
/* IQ4_NL: w = d * quant_iq4_values[q], the nibbles laid out as Q4_0's. */
struct blk_iq4_nl { uint16_t d; uint8_t qs[QK / 2]; };
/* IQ4_XS: 8 sub-blocks of 32, each laid out as an IQ4_NL block (qs[16 j ..]), with a 6-bit
 * scale less 32: low 4 bits in nibble j % 2 of scales_l[j / 2], top 2 bits at bit 2j of
 * scales_h; w = d * sc_j * quant_iq4_values[q]. */
struct blk_iq4_xs { uint16_t d, scales_h; uint8_t scales_l[QK_K / 64]; uint8_t qs[QK_K / 2]; };
/* MXFP4 (GPT-OSS's experts): w = quant_mxfp4_half(e) * quant_mxfp4_values[q], the nibbles laid out
 * as Q4_0's. Single bytes only: 17 bytes, alignment 1 (a row of an odd number of blocks is odd). */
struct blk_mxfp4 { uint8_t e; uint8_t qs[QK / 2]; };

_Static_assert(sizeof(struct blk_q4_0) == 18, "ggml block_q4_0");
_Static_assert(sizeof(struct blk_q4_1) == 20, "ggml block_q4_1");
_Static_assert(sizeof(struct blk_q5_0) == 22, "ggml block_q5_0");
_Static_assert(sizeof(struct blk_q5_1) == 24, "ggml block_q5_1");
_Static_assert(sizeof(struct blk_q8_0) == 34, "ggml block_q8_0");
_Static_assert(sizeof(struct blk_q4_k) == 144, "ggml block_q4_K");
_Static_assert(sizeof(struct blk_q5_k) == 176, "ggml block_q5_K");
_Static_assert(sizeof(struct blk_q6_k) == 210, "ggml block_q6_K");
_Static_assert(sizeof(struct blk_q2_k) == 84, "ggml block_q2_K");
_Static_assert(sizeof(struct blk_q3_k) == 110, "ggml block_q3_K");
_Static_assert(sizeof(struct blk_iq4_nl) == 18, "ggml block_iq4_nl");
_Static_assert(sizeof(struct blk_iq4_xs) == 136, "ggml block_iq4_xs");
_Static_assert(sizeof(struct blk_mxfp4) == 17 && _Alignof(struct blk_mxfp4) == 1, "ggml block_mxfp4");

/* The 16 values of an IQ4 nibble (ggml's kvalues_iq4nl). */
static const int8_t quant_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

/* The 16 values of an MXFP4 nibble: the E2M1 floats doubled, as ggml's kvalues_mxfp4 (sign bit 3,
 * so nibbles 0 and 8 are both 0). */
static const int8_t quant_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* Half the E8M0 scale of an MXFP4 block, 2^(e - 128), which the doubled values above undo: ggml's
 * ggml_e8m0_to_fp32_half, bit for bit. e >= 2 is the normal float of exponent field e - 1; e = 0
 * and 1 are the subnormals 2^-128 and 2^-127 (bits 0x00200000 << e); e = 255 gives 2^127, not
 * a NaN (ggml does not treat it apart either). */
static inline float quant_mxfp4_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? (uint32_t)0x00200000 << e : (uint32_t)(e - 1) << 23;
    float d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block: bytes 0-3 hold scales 0-3 (low 6
 * bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins, bytes 8-11 the low
 * 4 bits of scale (low nibble) and min (high nibble) 4-7. */
static inline void quant_k_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* The g-th (0..15) scale of a Q3_K block, less 32: the low 4 bits are nibble g / 8 of
 * scales[g % 8], the top 2 bits bits 2 (g / 4), 2 (g / 4) + 1 of scales[8 + g % 4]. */
static inline int quant_q3_k_scale(int g, const uint8_t *scales)
{
    const int lo = (scales[g % 8] >> (4 * (g / 8))) & 0x0F, hi = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    return (lo | hi << 4) - 32;
}

/* The j-th (0..7) scale of an IQ4_XS block, less 32. */
static inline int quant_iq4_xs_scale(int j, const struct blk_iq4_xs *b)
{
    return (((b->scales_l[j / 2] >> (4 * (j % 2))) & 0x0F) | ((b->scales_h >> (2 * j)) & 3) << 4) - 32;
}

/* ---- activation blocks (x quantized), x_i ~= d * qs[i] ---- */
struct act_q8 {      /* 32 elements, for the 32-element types */
    float   d;
    int32_t sum;     /* sum of qs: the offset terms of Q4_0/Q5_0, exact in the integers */
    float   dsum;    /* d * sum, rounded once: the min terms of Q4_1/Q5_1 (one product per block
                      * and row of w instead of a conversion and two) */
    int8_t  qs[QK];
};
struct act_q8_k {    /* 256 elements, for the K-quants */
    float   d;
    int8_t  qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sums of qs by 16: the mins of Q2_K/Q4_K/Q5_K, the offsets of Q3_K/Q6_K */
};

/* ---- eight rows packed together (quant_packed.c) ----
 * A packed block holds block b of eight consecutive rows: their f16 scales d[8], for Q4_1 their
 * mins m[8], then the quants: Q4_0 / Q4_1 in four chunks of 32 bytes, byte 4 r + t of chunk j
 * holding row r's element 4 j + t in its low nibble and element 16 + 4 j + t in its high
 * nibble; Q8_0 in eight chunks of 32 bytes, byte 4 r + t of chunk k row r's element 4 k + t
 * plus 128 (unsigned: vpdpbusd multiplies it by x as it is, and the 128 sum(x) it adds comes off
 * once per block through act_q8.sum). The same bytes as the eight rows' blocks, regrouped (Q8_0's
 * with their top bit flipped). */
#define QUANT_R8_Q4_0 144
#define QUANT_R8_Q4_1 160
#define QUANT_R8_Q8_0 272
/* Q5_0 / Q5_1: d[8] (and m[8]), then the fifth bits as eight 32-bit masks (mask 2 j: bit 4 r + t
 * is row r's element 4 j + t; mask 2 j + 1 its element 16 + 4 j + t), then the nibbles as Q4_0's. */
#define QUANT_R8_Q5_0 176
#define QUANT_R8_Q5_1 192
/* Q4_K (a super-block of eight rows): d[8] and dmin[8] (f16), the 6-bit scales as bytes
 * sc[j][r] (64: sub-block j, row r), the mins as bytes mn[q][r][2] (64: row r's mins of sub-blocks
 * 2q and 2q + 1 side by side), then the quants: for each pair p of sub-blocks eight chunks of 32
 * bytes, byte 4 r + t of chunk c holding row r's qs[32 p + 4 c + t] (element 4 c + t of
 * sub-block 2 p in its low nibble, of sub-block 2 p + 1 in its high one). 1,184 bytes for 1,152
 * stored. */
#define QUANT_R8_Q4_K 1184
/* Q6_K (a super-block of eight rows): d[8] (f16), then per chunk t of 32 elements (groups 2 t and
 * 2 t + 1 of 16) the int8 scale pairs sc[t][r][2] (16 bytes: row r's scales of the two groups
 * side by side), then per chunk 192 bytes of quants (q = the stored 6-bit value, 0..63): four
 * nibble vectors of 32 bytes, byte 4 r + i of vector j holding the low four bits of row r's
 * element 4 j + i of the chunk in its low nibble and of element 16 + 4 j + i in its high one
 * (Q4_0's order), then two vectors of top bits, byte 4 r + i of vector p holding the two top bits
 * of those elements for j = 2 p (bits 0-1 and 2-3) and j = 2 p + 1 (bits 4-5 and 6-7). 1,680
 * bytes, the eight stored blocks' size. */
#define QUANT_R8_Q6_K 1680

/* The block-exact order of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, which every implementation and both layouts
 * follow (quant_x86.h): per block the exact integer sum isum, acc = fmaf(d_w * d_x, isum, acc),
 * accm = fmaf(m, d_x * sum(x), accm) (Q4_1), y = acc + accm. The scalar kernels of the packed
 * layout (quant_packed.c), for the scalar table. */
void quant_scalar_packed8_q4_0(int64_t nb, const void *wp, const void *xq, float *y);
void quant_scalar_packed8_q4_1(int64_t nb, const void *wp, const void *xq, float *y);
void quant_scalar_packed8_q8_0(int64_t nb, const void *wp, const void *xq, float *y);
void quant_scalar_packed8_q4_k(int64_t nb, const void *wp, const void *xq, float *y);
void quant_scalar_packed8_q5_0(int64_t nb, const void *wp, const void *xq, float *y);
void quant_scalar_packed8_q5_1(int64_t nb, const void *wp, const void *xq, float *y);
/* Q6_K's order (every implementation, both layouts, as the stored dot): per super-block the exact
 * isum = sum_g sc_g (sum(q x) - 32 sum(x)) over its 16 groups, acc = fmaf(d * d_x, isum, acc),
 * y = acc + 0. */
void quant_scalar_packed8_q6_k(int64_t nb, const void *wp, const void *xq, float *y);
/* The 32-element packed types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) on AMX int8 tiles (quant_amx.c;
 * x86-64 Linux with cpu_amx_enabled): rows (1..16) rows of quantized x (xq, xs bytes apart)
 * against `groups` packed groups of eight rows of w (wp, w_step bytes apart) into
 * y[r ys + 8 g + 0..8]; every row's bits are packed8's. 0 (nothing written) for other types. */
int quant_amx_packed(int slot, int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq,
                     size_t xs, int rows, float *y, int64_t ys);


/* The block-exact order of Q4_K and Q5_K (every implementation, both layouts): per super-block
 * the exact sums isum = sum_j sc_j sum(q x) and msum = sum_j m_j sum(x) (int32),
 * acc = fmaf(d * d_x, isum, acc), accm = fmaf(dmin * d_x, msum, accm), y = acc - accm. */
static inline void quant_k_accumulate(float d, float dmin, float dx, int32_t isum, int32_t msum, float *acc,
                                      float *accm)
{
    *acc = fmaf(d * dx, (float)isum, *acc);
    *accm = fmaf(dmin * dx, (float)msum, *accm);
}

/* The types in table order. */
enum quant_slot { SLOT_Q4_0, SLOT_Q4_1, SLOT_Q5_0, SLOT_Q5_1, SLOT_Q8_0, SLOT_Q4_K, SLOT_Q5_K,
                  SLOT_Q6_K, SLOT_Q2_K, SLOT_Q3_K, SLOT_IQ4_NL, SLOT_IQ4_XS,
                  SLOT_MXFP4, SLOT_COUNT };

/* The dot product of one weight row (nb blocks) with one quantized x row (nb activation blocks
 * of the matching kind). */
typedef float (*quant_dot_fn)(int64_t nb, const void *w, const void *xq);
/* The same for four rows of x (xq, xq + xs, ... bytes) at once, into y[0], y[ys], y[2 ys],
 * y[3 ys]: prefill, where a weight block is unpacked once for four rows. */
typedef void (*quant_dot4_fn)(int64_t nb, const void *w, const void *xq, size_t xs, float *y,
                              int64_t ys);
/* One row of x against four rows of W (w, w + ws, w + 2 ws, w + 3 ws bytes) into y[0..4):
 * decode, where the four rows' loads overlap. */
typedef void (*quant_dotw4_fn)(int64_t nb, const void *w, size_t ws, const void *xq, float *y);
/* One row of x against a group of eight rows of W packed by quant_pack_rows8 (nb packed blocks
 * at wp) into y[0..8): decode over the packed layout (quant_packed.c). */
typedef void (*quant_packed8_fn)(int64_t nb, const void *wp, const void *xq, float *y);
/* The same for four rows of x (xq, xq + xs, ... bytes) into y[r ys + 0..8): several rows of a
 * step (verification of drafts, small batches, int8 prefill), each packed block unpacked once for
 * the four; every row's bits are packed8's. The packed8x2 entries take two rows. */
typedef void (*quant_packed8x4_fn)(int64_t nb, const void *wp, const void *xq, size_t xs, float *y, int64_t ys);
/* Quantizes nb blocks of x into activation blocks. */
typedef void (*quant_act_fn)(const float *x, void *xq, int64_t nb);

struct quant_kernels {
    quant_dot_fn  dot[SLOT_COUNT];
    quant_dot4_fn dot4[SLOT_COUNT]; /* NULL: four calls of dot */
    quant_dotw4_fn dotw4[SLOT_COUNT]; /* NULL: dot row by row */
    quant_packed8_fn packed8[SLOT_COUNT]; /* the packable types (quant_packable) only */
    quant_packed8x4_fn packed8x4[SLOT_COUNT]; /* NULL: packed8 row by row */
    quant_packed8x4_fn packed8x2[SLOT_COUNT]; /* the same type of function for two rows; NULL: packed8 */
    /* Three and five rows in one pass (AVX2: Q8_0's, the LM heads, Q4_0's and Q5_0's: a step
     * verifying two or four drafts), where four then one or two then one would pass twice;
     * NULL: not these. */
    quant_packed8x4_fn packed8x3[SLOT_COUNT], packed8x5[SLOT_COUNT];
    quant_act_fn act_q8;   /* to struct act_q8 */
    quant_act_fn act_q8_k; /* to struct act_q8_k */
};

/* Each returns its table, or NULL when the implementation is not compiled for this target
 * (the caller checks the CPU). */
const struct quant_kernels *quant_kernels_scalar(void);
const struct quant_kernels *quant_kernels_avx2(void);
const struct quant_kernels *quant_kernels_avx_vnni(void);
const struct quant_kernels *quant_kernels_avx512_vnni(void);

/* x86 only: the AVX2 kernels of the 256-element types and x quantizers (quant_avx2.c), which the AVX512-VNNI
 * table reuses. */
float quant_avx2_dot_q4_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q5_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q6_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q2_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q3_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_iq4_xs(int64_t nb, const void *w, const void *xq);
void  quant_avx2_act_q8(const float *x, void *xq, int64_t nb);
void  quant_avx2_act_q8_k(const float *x, void *xq, int64_t nb);
/* nb blocks of `type` at src to f32 at dst, bit-exact with the scalar dequantizer
 * (quant_dequantize_avx2.c); returns 0 (doing nothing) where AVX2 is not compiled in. The
 * caller checks the CPU. */
int   quant_avx2_dequantize(enum quant_type type, const void *src, float *dst, int64_t nb);

#endif
