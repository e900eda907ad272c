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

/* Q2_K: per group g of 16, (d * sc_g) * q - dmin * m_g. */
static void deq_q2_k(const struct blk_q2_k *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK_K) {
        const float d = h2f(x[b].d), dmin = h2f(x[b].dmin);
        for (int e = 0; e < QK_K; e++) {
            const int g = e / 16, q = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            const float dl = d * (float)(x[b].scales[g] & 0x0F), ml = dmin * (float)(x[b].scales[g] >> 4);
            y[e] = dl * (float)q - ml;
        }
    }
}

/* Q3_K: per group g of 16, (d * sc_g) * q, q = 2 low bits - 4 where the hmask bit is clear. */
static void deq_q3_k(const struct blk_q3_k *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK_K) {
        const float d = h2f(x[b].d);
        for (int e = 0; e < QK_K; e++) {
            const int lo = (x[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            const int q = lo - ((x[b].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
            y[e] = (d * (float)quant_q3_k_scale(e / 16, x[b].scales)) * (float)q;
        }
    }
}

static void deq_iq4_nl(const struct blk_iq4_nl *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = d * (float)quant_iq4_values[x[b].qs[j] & 0x0F];
            y[j + 16] = d * (float)quant_iq4_values[x[b].qs[j] >> 4];
        }
    }
}

/* IQ4_XS: sub-block j is an IQ4_NL block of scale d * sc_j. */
static void deq_iq4_xs(const struct blk_iq4_xs *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++) {
        const float d = h2f(x[b].d);
        for (int j = 0; j < QK_K / 32; j++, y += 32) {
            const float dl = d * (float)quant_iq4_xs_scale(j, &x[b]);
            const uint8_t *qs = x[b].qs + 16 * j;
            for (int l = 0; l < 16; l++) {
                y[l] = dl * (float)quant_iq4_values[qs[l] & 0x0F];
                y[l + 16] = dl * (float)quant_iq4_values[qs[l] >> 4];
            }
        }
    }
}

/* MXFP4: ggml's dequantize_row_mxfp4 computes value * d (int8 to float, then one product). */
static void deq_mxfp4(const struct blk_mxfp4 *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, y += QK) {
        const float d = quant_mxfp4_half(x[b].e);
        for (int j = 0; j < QK / 2; j++) {
            y[j] = (float)quant_mxfp4_values[x[b].qs[j] & 0x0F] * d;
            y[j + 16] = (float)quant_mxfp4_values[x[b].qs[j] >> 4] * d;
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
    case QUANT_TYPE_Q2_K: deq_q2_k(src, nb, dst); return;
    case QUANT_TYPE_Q3_K: deq_q3_k(src, nb, dst); return;
    case QUANT_TYPE_IQ4_NL: deq_iq4_nl(src, nb, dst); return;
    case QUANT_TYPE_IQ4_XS: deq_iq4_xs(src, nb, dst); return;
    case QUANT_TYPE_MXFP4: deq_mxfp4(src, nb, dst); return;
    }
}

void quant_dequantize_row(enum quant_type type, const void *src, float *dst, int64_t k)
{
    quant_dequantize_row_impl(quant_impl_best(), type, src, dst, k);
}
