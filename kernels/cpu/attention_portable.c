/* kernels/cpu/attention_portable.c - the plain C implementation of op_attention's inner kernels
 * (attention_impl.h): it runs on every CPU and is the one the SIMD implementations are tested
 * against. Loops are written so that the compiler can vectorise them for the baseline target
 * (the dot product's reduction may be reordered: still f32).
 * Not here: the driver (attention.c), SIMD (attention_avx512.c).
 * Tests: tests/test_attention_kernels.c. */
#include "attention_impl.h"

static void scores_portable(const float *q, int gn, int hd, const float *const *k, int nk, float *s,
                            int lds)
{
    for (int i = 0; i < nk; i++) {
        const float *kr = k[i];
        for (int g = 0; g < gn; g++) {
            const float *qg = q + (size_t)g * (size_t)hd;
            float dot = 0.0f;
            #pragma omp simd reduction(+ : dot)
            for (int d = 0; d < hd; d++) dot += qg[d] * kr[d];
            s[(size_t)g * (size_t)lds + (size_t)i] = dot;
        }
    }
}

static void accumulate_portable(float *acc, int gn, int hd, const float *p, int ldp,
                                const float *const *v, int nk)
{
    for (int i = 0; i < nk; i++) {
        const float *vr = v[i];
        for (int g = 0; g < gn; g++) {
            const float w = p[(size_t)g * (size_t)ldp + (size_t)i];
            float *ag = acc + (size_t)g * (size_t)hd;
            for (int d = 0; d < hd; d++) ag[d] += w * vr[d];
        }
    }
}

static void widen_portable(float *dst, const uint16_t *src, enum dtype t, size_t n)
{
    if (t == DTYPE_BF16) {
        for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) dst[i] = f16_to_f32(src[i]);
    }
}

ATTN_SOFTMAX_FNS(portable, )

static const struct attn_kernels portable_kernels = {
    .name = "portable",
    .scores = scores_portable,
    .accumulate = accumulate_portable,
    .widen = widen_portable,
    .max = max_portable,
    .exp_sum = exp_sum_portable,
};

const struct attn_kernels *attn_kernels_portable(void) { return &portable_kernels; }
