/* kernels/cpu/quant_impl.h - private to the quantized product (kernels/cpu/quant*.c): the ggml
 * weight blocks (byte layouts of ggml-common.h), the int8 activation blocks, and the table of
 * kernels that each implementation (scalar, AVX2, AVX512-VNNI) fills.
 * Not here: the public contract (kernels/quant.h), the driver (quant.c).
 * Tests: tests/test_quant.c. */
#ifndef SHARDLM_QUANT_IMPL_H
#define SHARDLM_QUANT_IMPL_H

#include <stddef.h>
#include <stdint.h>

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

_Static_assert(sizeof(struct blk_q4_0) == 18, "ggml block_q4_0");
_Static_assert(sizeof(struct blk_q4_1) == 20, "ggml block_q4_1");
_Static_assert(sizeof(struct blk_q5_0) == 22, "ggml block_q5_0");
_Static_assert(sizeof(struct blk_q5_1) == 24, "ggml block_q5_1");
_Static_assert(sizeof(struct blk_q8_0) == 34, "ggml block_q8_0");
_Static_assert(sizeof(struct blk_q4_k) == 144, "ggml block_q4_K");
_Static_assert(sizeof(struct blk_q5_k) == 176, "ggml block_q5_K");
_Static_assert(sizeof(struct blk_q6_k) == 210, "ggml block_q6_K");

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

/* ---- activation blocks (x quantized), x_i ~= d * qs[i] ---- */
struct act_q8 {      /* 32 elements, for the 32-element types */
    float   d;
    int32_t sum;     /* sum of qs: the offset and min terms of Q4/Q5 */
    int8_t  qs[QK];
};
struct act_q8_k {    /* 256 elements, for the K-quants */
    float   d;
    int8_t  qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sums of qs by 16: the mins of Q4_K/Q5_K, the -32 of Q6_K */
};

/* The types in table order. */
enum quant_slot { SLOT_Q4_0, SLOT_Q4_1, SLOT_Q5_0, SLOT_Q5_1, SLOT_Q8_0, SLOT_Q4_K, SLOT_Q5_K,
                  SLOT_Q6_K, SLOT_COUNT };

/* The dot product of one weight row (nb blocks) with one quantized x row (nb activation blocks
 * of the matching kind). */
typedef float (*quant_dot_fn)(int64_t nb, const void *w, const void *xq);
/* The same for four rows of x (xq, xq + xs, ... bytes) at once, into y[0], y[ys], y[2 ys],
 * y[3 ys]: prefill, where a weight block is unpacked once for four rows. */
typedef void (*quant_dot4_fn)(int64_t nb, const void *w, const void *xq, size_t xs, float *y,
                              int64_t ys);
/* Quantizes nb blocks of x into activation blocks. */
typedef void (*quant_act_fn)(const float *x, void *xq, int64_t nb);

struct quant_kernels {
    quant_dot_fn  dot[SLOT_COUNT];
    quant_dot4_fn dot4[SLOT_COUNT]; /* NULL: four calls of dot */
    quant_act_fn act_q8;   /* to struct act_q8 */
    quant_act_fn act_q8_k; /* to struct act_q8_k */
};

/* Each returns its table, or NULL when the implementation is not compiled for this target
 * (the caller checks the CPU). */
const struct quant_kernels *quant_kernels_scalar(void);
const struct quant_kernels *quant_kernels_avx2(void);
const struct quant_kernels *quant_kernels_avx512_vnni(void);

/* x86 only: the AVX2 K-quant kernels and x quantizers (quant_avx2.c), which the AVX512-VNNI
 * table reuses. */
float quant_avx2_dot_q4_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q5_k(int64_t nb, const void *w, const void *xq);
float quant_avx2_dot_q6_k(int64_t nb, const void *w, const void *xq);
void  quant_avx2_act_q8(const float *x, void *xq, int64_t nb);
void  quant_avx2_act_q8_k(const float *x, void *xq, int64_t nb);
/* nb blocks of `type` at src to f32 at dst, bit-exact with the scalar dequantizer
 * (quant_dequantize_avx2.c); returns 0 (doing nothing) where AVX2 is not compiled in. The
 * caller checks the CPU. */
int   quant_avx2_dequantize(enum quant_type type, const void *src, float *dst, int64_t nb);

#endif
