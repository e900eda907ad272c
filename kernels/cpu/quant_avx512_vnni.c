/* kernels/cpu/quant_avx512_vnni.c - the AVX512-VNNI implementation of the quantized product:
 * the 32-element types of quant_x86.h (IQ4_NL among them) over vpdpbusd on 256-bit vectors (AVX512-VNNI with VL:
 * one instruction where AVX2 needs vpmaddubsw + vpmaddwd, and no 16-bit saturation), the
 * 256-element types (K-quants, IQ4_XS) and the x quantizers borrowed from quant_avx2.c. Compiled with target attributes;
 * quant.c asks the CPU.
 * Not here: AVX-VNNI (the VEX form of the same instruction on CPUs without AVX-512), 512-bit
 * vectors (except Q8_0's one-row kernel).
 * Tests: tests/test_quant.c (against the scalar reference and the f64 product). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#define QX_TARGET __attribute__((target("avx512vnni,avx512vl,avx512bw,avx2,fma,f16c")))
#include <immintrin.h>

/* Unsigned u times signed s, bytes in groups of four summed into int32. */
QX_TARGET static inline __m256i dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

#include "quant_x86.h"

#define QX_TARGET512 __attribute__((target("avx512f,avx512bw,avx512vnni,avx512vl,avx2,fma,f16c")))

/* Q8_0 for one row of x with 512-bit vectors: two blocks per vpdpbusd (lanes 0-7 block b,
 * 8-15 block b + 1), the weights' signs moved onto x with a mask. Decode's LM head (Gemma's
 * 262,144 rows of Q8_0) is most of a step: bench_quant --lm-head (2026-11-25, one thread)
 * 22.0-22.5 ms against 24.2-24.8 ms for AVX2 in the same runs (the 256-bit VNNI row kernel
 * was 23.5-23.8 against 24.5-24.9 earlier). */
QX_TARGET512 static float dot_q8_0_zmm(int64_t nb, const void *wv, const void *xv)
{
    const struct blk_q8_0 *w = wv;
    const struct act_q8 *x = xv;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        qx_prefetch(w + b, 1);
        qx_prefetch(w + b + 1, 1);
        const __m512i qw = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)w[b].qs)),
                                              _mm256_loadu_si256((const __m256i *)w[b + 1].qs), 1);
        const __m512i qx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)x[b].qs)),
                                              _mm256_loadu_si256((const __m256i *)x[b + 1].qs), 1);
        const __m512i sx = _mm512_mask_sub_epi8(qx, _mm512_movepi8_mask(qw), _mm512_setzero_si512(), qx);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(qw), sx);
        const __m512 d = _mm512_castpd_ps(_mm512_insertf64x4(
            _mm512_castpd256_pd512(_mm256_castps_pd(_mm256_set1_ps(qx_h2f(w[b].d) * x[b].d))),
            _mm256_castps_pd(_mm256_set1_ps(qx_h2f(w[b + 1].d) * x[b + 1].d)), 1));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float y = _mm512_reduce_add_ps(acc);
    if (b < nb) y += dot_q8_0(nb - b, w + b, x + b);
    return y;
}

static const struct quant_kernels vnni_kernels = {
    .dot = {
        [SLOT_Q4_0] = dot_q4_0, [SLOT_Q4_1] = dot_q4_1, [SLOT_Q5_0] = dot_q5_0,
        [SLOT_Q5_1] = dot_q5_1, [SLOT_Q8_0] = dot_q8_0_zmm, [SLOT_Q4_K] = quant_avx2_dot_q4_k,
        [SLOT_Q5_K] = quant_avx2_dot_q5_k, [SLOT_Q6_K] = quant_avx2_dot_q6_k,
        [SLOT_Q2_K] = quant_avx2_dot_q2_k, [SLOT_Q3_K] = quant_avx2_dot_q3_k,
        [SLOT_IQ4_NL] = dot_iq4_nl, [SLOT_IQ4_XS] = quant_avx2_dot_iq4_xs,
    },
    .dot4 = {
        [SLOT_Q4_0] = dot4_q4_0, [SLOT_Q4_1] = dot4_q4_1, [SLOT_Q5_0] = dot4_q5_0,
        [SLOT_Q5_1] = dot4_q5_1, [SLOT_Q8_0] = dot4_q8_0, [SLOT_IQ4_NL] = dot4_iq4_nl,
    },
    .dotw4 = {
        [SLOT_Q4_0] = dotw4_q4_0, [SLOT_Q4_1] = dotw4_q4_1, [SLOT_Q5_0] = dotw4_q5_0,
        [SLOT_Q5_1] = dotw4_q5_1,
    },
    .act_q8 = quant_avx2_act_q8,
    .act_q8_k = quant_avx2_act_q8_k,
};

const struct quant_kernels *quant_kernels_avx512_vnni(void) { return &vnni_kernels; }

#else

const struct quant_kernels *quant_kernels_avx512_vnni(void) { return NULL; }

#endif
