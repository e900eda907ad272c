/* kernels/cpu/quant_scalar.c - the plain C implementation of the quantized product: x rows to
 * int8 activation blocks, and the dot product of each weight type with them. It runs on every
 * CPU and is the reference the SIMD implementations are tested against: integer sums within a
 * block, offsets (the -8 of Q4_0, the -32 of Q6_K) and mins taken through the sums of the
 * quantized x, scales applied in f32 once per block.
 * Not here: the driver and the row dequantizers (quant.c, quant_dequantize.c), SIMD
 * (quant_avx2.c, quant_avx512_vnni.c).
 * Tests: tests/test_quant.c. */
#include <math.h>

#include "quant_impl.h"
#include "tensor.h"

static float h2f(uint16_t h) { return f16_to_f32(h); }

/* ---- activations ---- */

/* Scale of one block of n values: max|x| / 127, and its inverse (0 for an all-zero block). */
static float act_scale(const float *x, int n, float *id)
{
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return d;
}

static void act_q8_scalar(const float *x, void *out, int64_t nb)
{
    struct act_q8 *q = out;
    for (int64_t b = 0; b < nb; b++, x += QK) {
        float id;
        q[b].d = act_scale(x, QK, &id);
        int32_t sum = 0;
        for (int i = 0; i < QK; i++) {
            q[b].qs[i] = (int8_t)lrintf(x[i] * id);
            sum += q[b].qs[i];
        }
        q[b].sum = sum;
        q[b].dsum = q[b].d * (float)sum;
    }
}

static void act_q8_k_scalar(const float *x, void *out, int64_t nb)
{
    struct act_q8_k *q = out;
    for (int64_t b = 0; b < nb; b++, x += QK_K) {
        float id;
        q[b].d = act_scale(x, QK_K, &id);
        for (int g = 0; g < QK_K / 16; g++) {
            int sum = 0;
            for (int i = g * 16; i < g * 16 + 16; i++) {
                q[b].qs[i] = (int8_t)lrintf(x[i] * id);
                sum += q[b].qs[i];
            }
            q[b].bsums[g] = (int16_t)sum;
        }
    }
}

/* ---- 32-element types ---- */

/* Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 in the block-exact order (quant_impl.h). */
static float dot_q8_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q8_0 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t s = 0;
        for (int i = 0; i < QK; i++) s += w[b].qs[i] * x[b].qs[i];
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)s, acc);
    }
    return acc + 0.0f;
}

/* sum over the block of q_i * x_i for the unsigned 4-bit (or, with qh, 5-bit) values q. */
static int32_t sum_q4(const uint8_t *qs, const int8_t *xq)
{
    int32_t s = 0;
    for (int i = 0; i < QK / 2; i++) s += (qs[i] & 0x0F) * xq[i] + (qs[i] >> 4) * xq[i + 16];
    return s;
}

static int32_t sum_q5(const uint8_t *qs, const uint8_t qh_bytes[4], const int8_t *xq)
{
    const uint32_t qh = (uint32_t)qh_bytes[0] | (uint32_t)qh_bytes[1] << 8 |
                        (uint32_t)qh_bytes[2] << 16 | (uint32_t)qh_bytes[3] << 24;
    int32_t s = 0;
    for (int i = 0; i < QK / 2; i++) {
        const int lo = (qs[i] & 0x0F) | (int)((qh >> i) & 1) << 4;
        const int hi = (qs[i] >> 4) | (int)((qh >> (i + 16)) & 1) << 4;
        s += lo * xq[i] + hi * xq[i + 16];
    }
    return s;
}

static float dot_q4_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_0 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++)
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)(sum_q4(w[b].qs, x[b].qs) - 8 * x[b].sum), acc);
    return acc + 0.0f;
}

static float dot_q4_1(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_1 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)sum_q4(w[b].qs, x[b].qs), acc);
        accm = fmaf(h2f(w[b].m), x[b].dsum, accm);
    }
    return acc + accm;
}

static float dot_q5_0(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_0 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++)
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)(sum_q5(w[b].qs, w[b].qh, x[b].qs) - 16 * x[b].sum), acc);
    return acc + 0.0f;
}

static float dot_q5_1(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_1 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)sum_q5(w[b].qs, w[b].qh, x[b].qs), acc);
        accm = fmaf(h2f(w[b].m), x[b].dsum, accm);
    }
    return acc + accm;
}

/* ---- K-quants ---- */

/* Q4_K and Q5_K: per sub-block j, sc_j * sum(q * x) and m_j * sum(x), both exact in int32,
 * added into acc and accm in the block-exact order (quant_k_accumulate); qh is NULL for Q4_K. */
static void dot_k_sc_min(const uint16_t dd[2], const uint8_t *scales, const uint8_t *qs,
                         const uint8_t *qh, const struct act_q8_k *x, float *acc, float *accm)
{
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        quant_k_scale_min(j, scales, &sc, &m);
        /* Sub-blocks come in pairs: 2p the low nibbles of 32 bytes, 2p + 1 their high ones. */
        const uint8_t *q = qs + 32 * (j / 2);
        const int shift = 4 * (j & 1);
        const int8_t *xq = x->qs + 32 * j;
        int32_t s = 0;
        for (int i = 0; i < 32; i++) {
            int v = (q[i] >> shift) & 0x0F;
            if (qh) v |= ((qh[i] >> j) & 1) << 4;
            s += v * xq[i];
        }
        sumi += sc * s;
        summ += m * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    }
    quant_k_accumulate(h2f(dd[0]), h2f(dd[1]), x->d, sumi, summ, acc, accm);
}

static float dot_q4_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q4_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t dd[2] = {w[b].d, w[b].dmin};
        dot_k_sc_min(dd, w[b].scales, w[b].qs, NULL, &x[b], &acc, &accm);
    }
    return acc - accm;
}

static float dot_q5_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q5_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint16_t dd[2] = {w[b].d, w[b].dmin};
        dot_k_sc_min(dd, w[b].scales, w[b].qs, w[b].qh, &x[b], &acc, &accm);
    }
    return acc - accm;
}

/* Q6_K: element e of a half (128) is, for e = 32 c + l, the nibble of ql[l + 32 (c & 1)]
 * (low for c < 2) with bits 2c, 2c + 1 of qh[l] on top; group g of 16 has scale sc[g]. The -32
 * is taken once per group through the sums of x: sc * (sum(q x) - 32 sum(x)). */
static float dot_q6_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q6_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            const int h = g / 8, c = (g / 2) & 3, l0 = 16 * (g & 1);
            const uint8_t *ql = w[b].ql + 64 * h + 32 * (c & 1), *qh = w[b].qh + 32 * h;
            const int8_t *xq = x[b].qs + 16 * g;
            int32_t s = 0;
            for (int l = l0; l < l0 + 16; l++) {
                const int q = ((ql[l] >> (4 * (c >> 1))) & 0x0F) | ((qh[l] >> (2 * c)) & 3) << 4;
                s += q * xq[l - l0];
            }
            sumi += w[b].scales[g] * (s - 32 * x[b].bsums[g]);
        }
        acc = fmaf(h2f(w[b].d) * x[b].d, (float)sumi, acc); /* the block-exact order */
    }
    return acc + 0.0f;
}

/* Q2_K: per group g of 16, sc_g * sum(q x) and m_g * sum(x), both exact in int32. */
static float dot_q2_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q2_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int32_t s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++)
                s += ((w[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) * x[b].qs[e];
            sumi += (w[b].scales[g] & 0x0F) * s;
            summ += (w[b].scales[g] >> 4) * x[b].bsums[g];
        }
        acc += x[b].d * (h2f(w[b].d) * (float)sumi - h2f(w[b].dmin) * (float)summ);
    }
    return acc;
}

/* Q3_K: q = u - 4 with u = the two low bits + 4 * the hmask bit (0..7); the -4 is taken once
 * per group through the sums of x: sc * (sum(u x) - 4 sum(x)). */
static float dot_q3_k(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q3_k *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int g = 0; g < QK_K / 16; g++) {
            int32_t s = 0;
            for (int e = 16 * g; e < 16 * g + 16; e++) {
                const int u = ((w[b].qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3) |
                              ((w[b].hmask[e % 32] >> (e / 32)) & 1) << 2;
                s += u * x[b].qs[e];
            }
            sumi += quant_q3_k_scale(g, w[b].scales) * (s - 4 * x[b].bsums[g]);
        }
        acc += h2f(w[b].d) * x[b].d * (float)sumi;
    }
    return acc;
}

/* sum over a 32-element block of nibbles laid out as Q4_0's of values[q_i] * x_i: the IQ4
 * values, or MXFP4's. */
static int32_t sum_lut(const int8_t values[16], const uint8_t *qs, const int8_t *xq)
{
    int32_t s = 0;
    for (int i = 0; i < QK / 2; i++) s += values[qs[i] & 0x0F] * xq[i] + values[qs[i] >> 4] * xq[i + 16];
    return s;
}

static int32_t sum_iq4(const uint8_t *qs, const int8_t *xq) { return sum_lut(quant_iq4_values, qs, xq); }

static float dot_iq4_nl(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_iq4_nl *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) acc += h2f(w[b].d) * x[b].d * (float)sum_iq4(w[b].qs, x[b].qs);
    return acc;
}

static float dot_iq4_xs(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_iq4_xs *w = wv;
    const struct act_q8_k *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int32_t sumi = 0;
        for (int j = 0; j < QK_K / 32; j++)
            sumi += quant_iq4_xs_scale(j, &w[b]) * sum_iq4(w[b].qs + 16 * j, x[b].qs + 32 * j);
        acc += h2f(w[b].d) * x[b].d * (float)sumi;
    }
    return acc;
}

/* MXFP4: IQ4_NL's product with the doubled E2M1 values and the E8M0 half scale (ggml's
 * ggml_vec_dot_mxfp4_q8_0: d_w d_x sum(v q_x)). */
static float dot_mxfp4(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_mxfp4 *w = wv;
    const struct act_q8 *x = xv;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++)
        acc += quant_mxfp4_half(w[b].e) * x[b].d * (float)sum_lut(quant_mxfp4_values, w[b].qs, x[b].qs);
    return acc;
}

static const struct quant_kernels scalar_kernels = {
    .dot = {
        [SLOT_Q4_0] = dot_q4_0, [SLOT_Q4_1] = dot_q4_1, [SLOT_Q5_0] = dot_q5_0,
        [SLOT_Q5_1] = dot_q5_1, [SLOT_Q8_0] = dot_q8_0, [SLOT_Q4_K] = dot_q4_k,
        [SLOT_Q5_K] = dot_q5_k, [SLOT_Q6_K] = dot_q6_k, [SLOT_Q2_K] = dot_q2_k,
        [SLOT_Q3_K] = dot_q3_k, [SLOT_IQ4_NL] = dot_iq4_nl, [SLOT_IQ4_XS] = dot_iq4_xs,
        [SLOT_MXFP4] = dot_mxfp4,
    },
    .packed8 = {
        [SLOT_Q4_0] = quant_scalar_packed8_q4_0, [SLOT_Q4_1] = quant_scalar_packed8_q4_1,
        [SLOT_Q8_0] = quant_scalar_packed8_q8_0, [SLOT_Q4_K] = quant_scalar_packed8_q4_k,
        [SLOT_Q5_0] = quant_scalar_packed8_q5_0, [SLOT_Q5_1] = quant_scalar_packed8_q5_1,
        [SLOT_Q6_K] = quant_scalar_packed8_q6_k,
    },
    .act_q8 = act_q8_scalar,
    .act_q8_k = act_q8_k_scalar,
};

const struct quant_kernels *quant_kernels_scalar(void) { return &scalar_kernels; }
