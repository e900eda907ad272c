/* kernels/cpu/cpu_isa.h - the instruction-set level the CPU backend's kernels may use: what this
 * CPU supports, capped by SHARDLM_CPU_ISA, decided once per process in one place (cpu_isa.c).
 * Every kernel family that has more than one path asks cpu_isa() (or cpu_isa_at_least) instead
 * of CPUID: the quantized products and the dequantizer (quant.c), the AMX tiles (amx.c), the
 * attention kernels (attention.c, attn_kernels_best), the f32 one-row product (gemv.c
 * cpu_gemv_rows) and the activation rows (activation.c).
 *
 * SHARDLM_CPU_ISA=scalar|avx2|avx512|avx512-vnni|amx is a ceiling: the level used is the best
 * one at or below it that this CPU supports. Asking for a level the CPU lacks logs one warning
 * and uses the best level below it. SHARDLM_CPU_AMX=0 (or off) is kept as an alias for a
 * ceiling of avx512-vnni. An unknown value logs a warning and is ignored.
 * The levels are cumulative; each needs every feature of the ones below it:
 *   scalar       no vector extension beyond the x86-64 baseline (SSE2): plain C everywhere
 *   avx2         AVX2, FMA, F16C
 *   avx512       + AVX512F
 *   avx512-vnni  + AVX512-VNNI, AVX512VL, AVX512BW
 *   amx          + AMX-TILE, AMX-BF16, AVX512-BF16 and the kernel's permission for tile data
 * Thread safety: every function may be called from any thread; the first call decides.
 * Tests: tests/test_cpu_isa.c; every kernel test runs again under each level (tests/CMakeLists.txt,
 * the *_isa_<level> variants, through tests/isa_gate.c). */
#ifndef SHARDLM_CPU_ISA_H
#define SHARDLM_CPU_ISA_H

#include <stddef.h>

enum cpu_isa {
    CPU_ISA_SCALAR = 0,
    CPU_ISA_AVX2,
    CPU_ISA_AVX512,
    CPU_ISA_AVX512_VNNI,
    CPU_ISA_AMX,
    CPU_ISA_COUNT,
};

/* 1 when the kernels may use AVX-VNNI (the VEX form of vpdpbusd, outside the ladder of levels:
 * AVX2 CPUs may have it, AVX-512 ones may lack it): the CPU has it (CPUID 7.1 EAX bit 4), the
 * level is at least avx2, and SHARDLM_CPU_AVX_VNNI is not 0 (or off). The quantized products
 * take it over plain AVX2 (quant.c), below avx512-vnni. */
int          cpu_avx_vnni(void);
/* The level the kernels use: min(ceiling, cpu_isa_supported()). */
enum cpu_isa cpu_isa(void);
/* 1 when cpu_isa() >= level. */
int          cpu_isa_at_least(enum cpu_isa level);
/* The best level this CPU (and this build's target) supports, whatever the environment says. */
enum cpu_isa cpu_isa_supported(void);
/* The ceiling asked for by SHARDLM_CPU_ISA / SHARDLM_CPU_AMX; CPU_ISA_COUNT when none. */
enum cpu_isa cpu_isa_ceiling(void);
/* "scalar", "avx2", "avx512", "avx512-vnni", "amx"; "?" otherwise. */
const char  *cpu_isa_name(enum cpu_isa level);
/* The level named s (the names above; "avx512vnni" too), or CPU_ISA_COUNT when none. */
enum cpu_isa cpu_isa_parse(const char *s);
/* The CPU's model name (CPUID brand string, else /proc/cpuinfo), "unknown" when neither says. */
const char  *cpu_isa_model(void);
/* 1 when CPUID's vendor is AuthenticAMD (a tuning default: kernels/cpu/gemv.c's rows per pass). */
int          cpu_isa_amd(void);
/* Writes one line into buf (n bytes, NUL-terminated, truncated if short): the CPU model, the
 * level and the path each kernel family takes, e.g.
 * "AMD EPYC; isa avx2 (supported avx2); quant avx2, dequant avx2, amx off, attention avx2,
 * gemv avx2 x1, activation avx2, prefetch 4096, blocks' sgemm from 32 rows, GOMP_SPINCOUNT 5000,
 * OpenBLAS Haswell" (the last: the kernels OpenBLAS runs, cli/main.c). Returns buf. */
char        *cpu_isa_describe(char *buf, size_t n);
/* Logs cpu_isa_describe at INFO once per process (module "cpu"); the CPU backend calls it when
 * it opens. */
void         cpu_isa_log(void);

#endif
