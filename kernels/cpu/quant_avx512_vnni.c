/* kernels/cpu/quant_avx512_vnni.c - the AVX512-VNNI implementation of the quantized product:
 * the 32-element types of quant_x86.h (IQ4_NL and MXFP4 among them) over vpdpbusd on 256-bit vectors (AVX512-VNNI with VL:
 * one instruction where AVX2 needs vpmaddubsw + vpmaddwd, and no 16-bit saturation), the
 * 256-element types (K-quants, IQ4_XS) and the x quantizers borrowed from quant_avx2.c. Compiled with target attributes;
 * quant.c asks the CPU.
 * The packed (eight-row) Q4, Q5 and Q8_0 kernels of quant_x86.h accumulate with vpdpbusd here
 * (QX_VNNI) and unpack the Q5 fifth bits with one masked move: the same integer sums.
 * Not here: AVX-VNNI (the VEX form of the same instruction on CPUs without AVX-512:
 * quant_avx_vnni.c), 512-bit
 * vectors (Q8_0's one-row kernel over two blocks per vpdpbusd went: it summed in another order
 * than the block-exact one of quant_impl.h, and the packed layout replaced it for the LM head).
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

#define QX_VNNI 1 /* the packed kernels accumulate with vpdpbusd, Q5 unpacks with a masked move */
#define QX_DPBUSD _mm256_dpbusd_epi32
#define QX_MASKZ 1
/* vpdpbusd with the x word as an embedded broadcast ({1to8}): one instruction where the
 * intrinsics give a separate vpbroadcastd (gcc 12 does not fold it); the packed Q4 / Q5 kernels
 * issue one per 32 products, so the broadcasts were a fifth of their instructions. */
QX_TARGET static inline __m256i qx_dpbusd_bcast(__m256i acc, __m256i u, const int8_t *x)
{
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)x));
    return acc;
}
#define QX_DPBUSD_X qx_dpbusd_bcast
#include "quant_x86.h"

static const struct quant_kernels vnni_kernels = QX_VNNI_TABLE;

const struct quant_kernels *quant_kernels_avx512_vnni(void) { return &vnni_kernels; }

#else

const struct quant_kernels *quant_kernels_avx512_vnni(void) { return NULL; }

#endif
