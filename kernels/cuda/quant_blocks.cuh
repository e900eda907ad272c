/* kernels/cuda/quant_blocks.cuh - the ggml block formats (DTYPE_Q*, kernels/quant.h) as the CUDA
 * kernels read them: element e of a row of blocks, decoded on its own, with the f32 operations
 * of kernels/cpu/quant_dequantize.c in the same order, so that every weight value equals the
 * CPU's (and ggml's) bit for bit; and the dispatch from a runtime enum quant_type to a
 * compile-time one.
 * Byte layouts (ggml-common.h; kernels/cpu/quant_impl.h has them as structs), f16 fields
 * little-endian:
 *   Q4_0  18 bytes: d@0, qs[16]@2                  w = (q - 8) d
 *   Q4_1  20 bytes: d@0, m@2, qs[16]@4             w = d q + m
 *   Q5_0  22 bytes: d@0, qh[4]@2, qs[16]@6         w = (q - 16) d, bit j of qh the fifth bit
 *   Q5_1  24 bytes: d@0, m@2, qh[4]@4, qs[16]@8    w = d q + m
 *   Q8_0  34 bytes: d@0, qs[32] (int8)@2           w = q d
 *   Q4_K 144 bytes: d@0, dmin@2, scales[12]@4, qs[128]@16              w = (d sc) q - dmin m
 *   Q5_K 176 bytes: d@0, dmin@2, scales[12]@4, qh[32]@16, qs[128]@48   the same with 5 bits
 *   Q6_K 210 bytes: ql[128]@0, qh[64]@128, scales[16] (int8)@192, d@208  w = (d sc) (q - 32)
 *   Q2_K  84 bytes: scales[16]@0, qs[64]@16, d@80, dmin@82      w = (d sc) q - dmin m, 16 groups of 16
 *   Q3_K 110 bytes: hmask[32]@0, qs[64]@32, scales[12]@96, d@108  w = (d (sc - 32)) q, q in -4..3
 *   IQ4_NL 18 bytes: d@0, qs[16]@2                 w = d v[q], v the 16 IQ4 values
 *   IQ4_XS 136 bytes: d@0, scales_h@2, scales_l[4]@4, qs[128]@8   w = (d (sc - 32)) v[q], 8 of 32
 *   MXFP4  17 bytes: e@0 (E8M0), qs[16]@1          w = v[q] 2^(e - 128), v the doubled E2M1 values
 * In the 32-element types element j < 16 is the low nibble of qs[j], element j + 16 its high
 * nibble. An MXFP4 row of an odd number of blocks is an odd number of bytes: every read here is
 * by bytes, so no row or block needs any alignment.
 *
 * Every function here is __host__ __device__: on the device the products and sums go through
 * the _rn intrinsics, which nvcc never fuses into an FMA (a fused d * q + m would differ from
 * the CPU's in the last bit); on the host they are plain float operations (x86-64 has no FMA
 * without target flags, so none is formed), which lets tests/test_quant_blocks.cu check the
 * index arithmetic against quant_dequantize_row on a machine without a GPU.
 * Not here: the kernels (matmul_quant.cu, embedding.cu), the CPU product (kernels/cpu/quant*.c).
 * Tests: tests/test_quant_blocks.cu (host, every type, bit-exact with quant_dequantize_row);
 * tests/test_ops_quant.c --backend cuda (the kernels on a GPU, label gpu). */
#ifndef SHARDLM_QUANT_BLOCKS_CUH
#define SHARDLM_QUANT_BLOCKS_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "base.h"
#include "quant.h"
#include "tensor.h"

/* Elements and bytes of one block of type QT (the numbers of quant_block_size and
 * quant_block_bytes, at compile time). */
template <int QT> struct quant_block_traits;
template <> struct quant_block_traits<QUANT_TYPE_Q4_0> { static constexpr int elems = 32, bytes = 18; };
template <> struct quant_block_traits<QUANT_TYPE_Q4_1> { static constexpr int elems = 32, bytes = 20; };
template <> struct quant_block_traits<QUANT_TYPE_Q5_0> { static constexpr int elems = 32, bytes = 22; };
template <> struct quant_block_traits<QUANT_TYPE_Q5_1> { static constexpr int elems = 32, bytes = 24; };
template <> struct quant_block_traits<QUANT_TYPE_Q8_0> { static constexpr int elems = 32, bytes = 34; };
template <> struct quant_block_traits<QUANT_TYPE_Q4_K> { static constexpr int elems = 256, bytes = 144; };
template <> struct quant_block_traits<QUANT_TYPE_Q5_K> { static constexpr int elems = 256, bytes = 176; };
template <> struct quant_block_traits<QUANT_TYPE_Q6_K> { static constexpr int elems = 256, bytes = 210; };
template <> struct quant_block_traits<QUANT_TYPE_Q2_K> { static constexpr int elems = 256, bytes = 84; };
template <> struct quant_block_traits<QUANT_TYPE_Q3_K> { static constexpr int elems = 256, bytes = 110; };
template <> struct quant_block_traits<QUANT_TYPE_IQ4_NL> { static constexpr int elems = 32, bytes = 18; };
template <> struct quant_block_traits<QUANT_TYPE_IQ4_XS> { static constexpr int elems = 256, bytes = 136; };
template <> struct quant_block_traits<QUANT_TYPE_MXFP4> { static constexpr int elems = 32, bytes = 17; };

/* ---- f32 operations that are the CPU's, to the bit ---- */

__host__ __device__ __forceinline__ float qb_f16(const uint8_t *p)
{
    const uint16_t h = (uint16_t)(p[0] | p[1] << 8); /* byte reads: no alignment assumed */
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half(h)); /* exact, subnormals included */
#else
    return f16_to_f32(h);
#endif
}

__host__ __device__ __forceinline__ float qb_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__host__ __device__ __forceinline__ float qb_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

__host__ __device__ __forceinline__ float qb_sub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

/* The 4-bit quant j (0..31) of a 32-element block whose nibbles start at qs. */
__host__ __device__ __forceinline__ int qb_nibble(const uint8_t *qs, int j)
{
    return j < 16 ? qs[j] & 0x0F : qs[j - 16] >> 4;
}

/* Bit j (0..31) of the little-endian 32-bit word at qh. */
__host__ __device__ __forceinline__ int qb_bit(const uint8_t *qh, int j)
{
    return (qh[j >> 3] >> (j & 7)) & 1;
}

/* The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block (quant_k_scale_min in
 * kernels/cpu/quant_impl.h). */
__host__ __device__ __forceinline__ void qb_k_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- element j of one block ---- */

template <int QT> __host__ __device__ float quant_block_elem(const uint8_t *x, int j);

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q4_0>(const uint8_t *x, int j)
{
    return qb_mul((float)(qb_nibble(x + 2, j) - 8), qb_f16(x));
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q4_1>(const uint8_t *x, int j)
{
    return qb_add(qb_mul(qb_f16(x), (float)qb_nibble(x + 4, j)), qb_f16(x + 2));
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q5_0>(const uint8_t *x, int j)
{
    const int q = qb_nibble(x + 6, j) | qb_bit(x + 2, j) << 4;
    return qb_mul((float)(q - 16), qb_f16(x));
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q5_1>(const uint8_t *x, int j)
{
    const int q = qb_nibble(x + 8, j) | qb_bit(x + 4, j) << 4;
    return qb_add(qb_mul(qb_f16(x), (float)q), qb_f16(x + 2));
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q8_0>(const uint8_t *x, int j)
{
    return qb_mul((float)(int8_t)x[2 + j], qb_f16(x));
}

/* Q4_K and Q5_K (qh NULL for Q4_K): 4 pairs of sub-blocks; in pair p, elements 0..31 are the
 * low nibbles of qs[32p ..], sub-block 2p, and 32..63 their high nibbles, sub-block 2p + 1;
 * Q5_K's fifth bit of element l of sub-block s is bit s of qh[l]. */
__host__ __device__ __forceinline__ float qb_k_sc_min_elem(const uint8_t *x, const uint8_t *qh,
                                                           const uint8_t *qs, int j)
{
    const int p = j >> 6, r = j & 63, sub = 2 * p + (r >> 5), l = r & 31;
    int sc, m;
    qb_k_scale_min(sub, x + 4, &sc, &m);
    const float d1 = qb_mul(qb_f16(x), (float)sc), m1 = qb_mul(qb_f16(x + 2), (float)m);
    const uint8_t byte = qs[32 * p + l];
    int q = r < 32 ? byte & 0x0F : byte >> 4;
    if (qh && (qh[l] >> sub) & 1) q += 16;
    return qb_sub(qb_mul(d1, (float)q), m1);
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q4_K>(const uint8_t *x, int j)
{
    return qb_k_sc_min_elem(x, (const uint8_t *)0, x + 16, j);
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q5_K>(const uint8_t *x, int j)
{
    return qb_k_sc_min_elem(x, x + 16, x + 48, j);
}

/* Q6_K: two halves of 128; in half h, quarter t (0..3) of 32 elements takes its low 4 bits
 * from ql[64h + l] (t 0, 2) or ql[64h + 32 + l] (t 1, 3), low nibble for t < 2, high for
 * t >= 2, its top 2 bits from bits 2t of qh[32h + l], and scale scales[8h + l / 16 + 2t]. */
template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q6_K>(const uint8_t *x, int j)
{
    const int h = j >> 7, t = (j >> 5) & 3, l = j & 31;
    const uint8_t lo = x[64 * h + 32 * (t & 1) + l];
    const int q = (t < 2 ? lo & 0x0F : lo >> 4) | ((x[128 + 32 * h + l] >> (2 * t)) & 3) << 4;
    const int sc = (int8_t)x[192 + 8 * h + l / 16 + 2 * t];
    return qb_mul(qb_mul(qb_f16(x + 208), (float)sc), (float)(q - 32));
}

/* Q2_K and Q3_K: the 2 low bits of element j, bits 2s, 2s + 1 of qs[32 h + l] for
 * j = 128 h + 32 s + l. */
__host__ __device__ __forceinline__ int qb_k_2bits(const uint8_t *qs, int j)
{
    return (qs[32 * (j >> 7) + (j & 31)] >> (2 * ((j >> 5) & 3))) & 3;
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q2_K>(const uint8_t *x, int j)
{
    const int sc = x[j >> 4];
    const float dl = qb_mul(qb_f16(x + 80), (float)(sc & 0x0F)), ml = qb_mul(qb_f16(x + 82), (float)(sc >> 4));
    return qb_sub(qb_mul(dl, (float)qb_k_2bits(x + 16, j)), ml);
}

/* Q3_K: scale g (0..15) has its low 4 bits in nibble g / 8 of scales[g % 8] and its top 2 at
 * bit 2 (g / 4) of scales[8 + g % 4]; the quant is 4 lower where bit j / 32 of hmask[j % 32]
 * is clear. */
template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_Q3_K>(const uint8_t *x, int j)
{
    const uint8_t *scales = x + 96;
    const int g = j >> 4;
    const int sc = (((scales[g & 7] >> (4 * (g >> 3))) & 0x0F) | ((scales[8 + (g & 3)] >> (2 * (g >> 2))) & 3) << 4) - 32;
    const int q = qb_k_2bits(x + 32, j) - ((x[j & 31] >> (j >> 5)) & 1 ? 0 : 4);
    return qb_mul(qb_mul(qb_f16(x + 108), (float)sc), (float)q);
}

/* The IQ4 value of nibble q (ggml's kvalues_iq4nl: -127 -104 -83 -65 -49 -35 -22 -10 1 13 25
 * 38 53 69 89 113), byte q of two packed words: no table in device memory. */
__host__ __device__ __forceinline__ float qb_iq4_value(int q)
{
    const uint64_t lo = 0xf6eaddcfbfad9881ull, hi = 0x7159453526190d01ull;
    return (float)(int8_t)((q < 8 ? lo : hi) >> (8 * (q & 7)));
}

template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_IQ4_NL>(const uint8_t *x, int j)
{
    return qb_mul(qb_f16(x), qb_iq4_value(qb_nibble(x + 2, j)));
}

/* IQ4_XS: sub-block s = j / 32 is an IQ4_NL block at qs + 16 s with scale d (sc_s - 32); sc_s
 * has its low 4 bits in nibble s % 2 of scales_l[s / 2], its top 2 at bit 2s of scales_h. */
template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_IQ4_XS>(const uint8_t *x, int j)
{
    const int s = j >> 5, scales_h = x[2] | x[3] << 8;
    const int sc = (((x[4 + (s >> 1)] >> (4 * (s & 1))) & 0x0F) | ((scales_h >> (2 * s)) & 3) << 4) - 32;
    return qb_mul(qb_mul(qb_f16(x), (float)sc), qb_iq4_value(qb_nibble(x + 8 + 16 * s, j & 31)));
}

/* MXFP4's half scale 2^(e - 128) (quant_mxfp4_half in kernels/cpu/quant_impl.h, ggml's
 * ggml_e8m0_to_fp32_half): the f32 of exponent field e - 1, or for e 0 and 1 the subnormals
 * 0x00200000 << e. */
__host__ __device__ __forceinline__ float qb_e8m0_half(uint8_t e)
{
    const uint32_t bits = e < 2 ? (uint32_t)0x00200000 << e : (uint32_t)(e - 1) << 23;
#ifdef __CUDA_ARCH__
    return __uint_as_float(bits);
#else
    float d;
    memcpy(&d, &bits, sizeof d);
    return d;
#endif
}

/* The MXFP4 value of nibble q (ggml's kvalues_mxfp4: 0 1 2 3 4 6 8 12 0 -1 -2 -3 -4 -6 -8 -12),
 * byte q of two packed words as qb_iq4_value. */
__host__ __device__ __forceinline__ float qb_mxfp4_value(int q)
{
    const uint64_t lo = 0x0c08060403020100ull, hi = 0xf4f8fafcfdfeff00ull;
    return (float)(int8_t)((q < 8 ? lo : hi) >> (8 * (q & 7)));
}

/* MXFP4: (float)v * d, ggml's dequantize_row_mxfp4. */
template <> __host__ __device__ __forceinline__ float quant_block_elem<QUANT_TYPE_MXFP4>(const uint8_t *x, int j)
{
    return qb_mul(qb_mxfp4_value(qb_nibble(x + 1, j)), qb_e8m0_half(x[0]));
}

/* Element e of a row of blocks starting at row (e < the row's k). */
template <int QT>
__host__ __device__ __forceinline__ float quant_row_elem(const uint8_t *row, int64_t e)
{
    typedef quant_block_traits<QT> tr;
    return quant_block_elem<QT>(row + (e / tr::elems) * tr::bytes, (int)(e % tr::elems));
}

/* Runs the statements after QT with QT a constexpr int equal to the quant type `qtype` (a
 * value of enum quant_type): one template instantiation per type. */
#define QUANT_DISPATCH_CASE_(value, QT, ...)                                                    \
    case value: {                                                                               \
        constexpr int QT = value;                                                               \
        __VA_ARGS__;                                                                            \
    } break;
#define QUANT_DISPATCH(qtype, QT, ...)                                                          \
    do {                                                                                        \
        switch ((int)(qtype)) {                                                                 \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q4_0, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q4_1, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q5_0, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q5_1, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q8_0, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q4_K, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q5_K, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q6_K, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q2_K, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_Q3_K, QT, __VA_ARGS__)                              \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_IQ4_NL, QT, __VA_ARGS__)                            \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_IQ4_XS, QT, __VA_ARGS__)                            \
            QUANT_DISPATCH_CASE_(QUANT_TYPE_MXFP4, QT, __VA_ARGS__)                             \
        default: CHECK(0, "quant type %d is not one of the block types", (int)(qtype));         \
        }                                                                                       \
    } while (0)

#endif
