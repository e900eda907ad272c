/* kernels/cpu/quant_dequantize.c - quant_dequantize_row: one row of ggml blocks to f32 (for
 * embedding lookups of a quantized table, and tiles of W in the prefill product). The arithmetic is ggml's dequantize_row_* (the same
 * f32 operations in the same order), so results are bit-exact with ggml and with
 * engine/formats/gguf_tensor.c as long as the compiler does not fuse a*b+c (this file is
 * built without FMA target flags).
 * quant_dequantize_row takes the AVX2 dequantizer (quant_dequantize_avx2.c, bit-exact with these
 * loops) where the CPU has it; these loops are the reference and the fallback.
 * Not here: the product (quant.c and its kernels).
 * Tests: tests/test_quant.c (bit-exact against gguf_tensor_read_f32). */
#include "base.h"
#include "quant_impl.h"
#include "tensor.h"

static float h2f(uint16_t h) { return f16_to_f32(h); }

static void deq_q4_0(const struct blk_q4_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)((x[b].qs[j] & 0x0F) - 8) * d;
            y[j + 16] = (float)((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const struct blk_q4_1 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)(x[b].qs[j] & 0x0F) + m;
            y[j + 16] = d * (float)(x[b].qs[j] >> 4) + m;
        }
    }
}

static uint32_t rd32(const uint8_t p[4])
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void deq_q5_0(const struct blk_q5_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d);
        const uint32_t qh = rd32(x[b].qh);
        for (int j = 0; j < QK / 2; j++) {
            const int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(((x[b].qs[j] & 0x0F) | hi0) - 16) * d;
            y[j + 16] = (float)(((x[b].qs[j] >> 4) | hi1) - 16) * d;
        }
    }
}

static void deq_q5_1(const struct blk_q5_1 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d), m = h2f(x[b].m);
        const uint32_t qh = rd32(x[b].qh);
        for (int j = 0; j < QK / 2; j++) {
            const int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)((x[b].qs[j] & 0x0F) | hi0) + m;
            y[j + 16] = d * (float)((x[b].qs[j] >> 4) | hi1) + m;
        }
    }
}

static void deq_q8_0(const struct blk_q8_0 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < QK; j++) y[j] = (float)x[b].qs[j] * d;
    }
}

/* Q4_K and Q5_K (qh NULL for Q4_K): sub-blocks in pairs, the low nibbles of 32 bytes then
 * their high nibbles. */
static void deq_k_sc_min(uint16_t d16, uint16_t dmin16, const uint8_t *scales, const uint8_t *q,
                         const uint8_t *qh, float *y)
{
    const float d = h2f(d16), dmin = h2f(dmin16);
    for (int p = 0; p < QK_K / 64; p++, q += 32) {
        uint8_t sc, m;
        quant_k_scale_min(2 * p, scales, &sc, &m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        quant_k_scale_min(2 * p + 1, scales, &sc, &m);
        const float d2 = d * (float)sc, m2 = dmin * (float)m;
        for (int l = 0; l < 32; l++) {
            const int h = qh && (qh[l] >> (2 * p)) & 1 ? 16 : 0;
            *y++ = d1 * (float)((q[l] & 0x0F) + h) - m1;
        }
        for (int l = 0; l < 32; l++) {
            const int h = qh && (qh[l] >> (2 * p + 1)) & 1 ? 16 : 0;
            *y++ = d2 * (float)((q[l] >> 4) + h) - m2;
        }
    }
}

static void deq_q6_k(const struct blk_q6_k *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++) {
        const float d = h2f(x[b].d);
        const uint8_t *ql = x[b].ql, *qh = x[b].qh;
        const int8_t *sc = x[b].scales;
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is]) * (float)q1;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
    }
}

void quant_dequantize_row_impl(enum quant_impl impl, enum quant_type type, const void *src,
                               float *dst, int64_t k)
{
    CHECK(quant_type_supported(type) && k >= 0 && k % quant_block_size(type) == 0,
          "quant_dequantize_row: type %d, k %lld", (int)type, (long long)k);
    CHECK(quant_impl_available(impl), "quant_dequantize_row: implementation %s is not available here",
          quant_impl_name(impl));
    const int64_t nb = k / quant_block_size(type);
    /* AVX512-VNNI has nothing to add to a dequantizer: both x86 implementations use AVX2's. */
    if (impl != QUANT_IMPL_SCALAR && quant_avx2_dequantize(type, src, dst, nb)) return;
    switch (type) {
    case QUANT_TYPE_Q4_0: deq_q4_0(src, nb, dst); return;
    case QUANT_TYPE_Q4_1: deq_q4_1(src, nb, dst); return;
    case QUANT_TYPE_Q5_0: deq_q5_0(src, nb, dst); return;
    case QUANT_TYPE_Q5_1: deq_q5_1(src, nb, dst); return;
    case QUANT_TYPE_Q8_0: deq_q8_0(src, nb, dst); return;
    case QUANT_TYPE_Q4_K:
        for (const struct blk_q4_k *x = src; x < (const struct blk_q4_k *)src + nb; x++, dst += QK_K)
            deq_k_sc_min(x->d, x->dmin, x->scales, x->qs, NULL, dst);
        return;
    case QUANT_TYPE_Q5_K:
        for (const struct blk_q5_k *x = src; x < (const struct blk_q5_k *)src + nb; x++, dst += QK_K)
            deq_k_sc_min(x->d, x->dmin, x->scales, x->qs, x->qh, dst);
        return;
    case QUANT_TYPE_Q6_K: deq_q6_k(src, nb, dst); return;
    }
}

void quant_dequantize_row(enum quant_type type, const void *src, float *dst, int64_t k)
{
    quant_dequantize_row_impl(quant_impl_best(), type, src, dst, k);
}
