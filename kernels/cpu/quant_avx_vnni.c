/* kernels/cpu/quant_avx_vnni.c - the AVX-VNNI implementation of the quantized product: the
 * VEX form of vpdpbusd that CPUs without AVX-512 have (Intel Alder Lake and later client cores,
 * Sierra Forest's E-cores; AMD Zen 5 has it beside AVX-512): quant_avx512_vnni.c's kernels over
 * _mm256_dpbusd_avx_epi32, with the AVX2 unpacking of Q5's fifth bits (no masked moves without
 * AVX512BW). The 256-element types (K-quants, IQ4_XS) and the x quantizers are quant_avx2.c's.
 * Compiled with target attributes; quant.c asks the CPU (cpu_isa.h cpu_avx_vnni).
 * Chosen over plain AVX2 where the CPU has AVX-VNNI and no AVX512-VNNI, or when forced
 * (quant_matmul_impl); SHARDLM_CPU_AVX_VNNI=0 turns it off.
 * Tests: tests/test_quant.c (against the scalar reference and the f64 product). */
#include "quant_impl.h"

#if defined(__x86_64__) || defined(__i386__)

#define QX_TARGET __attribute__((target("avxvnni,avx2,fma,f16c")))
#include <immintrin.h>

/* Unsigned u times signed s, bytes in groups of four summed into int32. */
QX_TARGET static inline __m256i dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
}

#define QX_VNNI 1 /* the packed kernels accumulate with vpdpbusd (Q5's fifth bits: AVX2's unpacking) */
#define QX_DPBUSD _mm256_dpbusd_avx_epi32
#include "quant_x86.h"

static const struct quant_kernels avx_vnni_kernels = QX_VNNI_TABLE;

const struct quant_kernels *quant_kernels_avx_vnni(void) { return &avx_vnni_kernels; }

#else

const struct quant_kernels *quant_kernels_avx_vnni(void) { return NULL; }

#endif
