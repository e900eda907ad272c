/* tests/test_cpu_isa.c - the instruction-set level (kernels/cpu/cpu_isa.h): names parse both
 * ways, the level in use is the CPU's capped by SHARDLM_CPU_ISA, and every kernel family that
 * dispatches by instruction set follows it (quantized products and dequantizer, AMX tiles,
 * attention kernels, the f32 one-row product, the activation rows), and the weights' huge pages
 * follow their knob. Registered once per level
 * (cpu_isa_<level>, through isa_gate), so each ceiling this CPU supports is checked. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/attention_impl.h"
#include "cpu/cpu_isa.h"
#include "cpu/cpu_ops.h"
#include "ops.h"
#include "quant.h"

/* The VmFlags of the mapping that holds address a (/proc/self/smaps), "" when not found. */
static void vm_flags_at(const void *a, char *flags, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    char l[512];
    int in = 0;
    flags[0] = 0;
    while (f && fgets(l, sizeof l, f)) {
        unsigned long lo, hi;
        if (sscanf(l, "%lx-%lx ", &lo, &hi) == 2) in = (uintptr_t)a >= lo && (uintptr_t)a < hi;
        else if (in && !strncmp(l, "VmFlags:", 8)) snprintf(flags, n, "%.200s", l + 8);
    }
    if (f) fclose(f);
}

/* The weights' huge pages (cpu_hugepages_on, cpu_memory_huge): on unless SHARDLM_CPU_HUGEPAGES=0
 * or the kernel's transparent huge pages are "never"; the cpu line says which; a host
 * allocation from 2 MB starts on a 2 MB boundary, and cpu_memory_huge advises its whole 2 MB
 * pages (the mapping's VmFlags "hg") only when on. Whether the kernel then backs them with huge
 * pages depends on its free memory: printed, not checked. */
static void check_huge_pages(const char *line)
{
    const char *env = getenv("SHARDLM_CPU_HUGEPAGES");
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f && !fgets(mode, sizeof mode, f)) mode[0] = 0;
    if (f) fclose(f);
    const int want = !(env && !strcmp(env, "0")) && f && !strstr(mode, "[never]");
    check(cpu_hugepages_on() == want && strstr(line, want ? "huge pages on" : "huge pages off") != NULL,
          "huge pages %s (want %s: SHARDLM_CPU_HUGEPAGES=%s, kernel: %.40s)", cpu_hugepages_on() ? "on" : "off",
          want ? "on" : "off", env ? env : "", f ? mode : "no transparent huge pages");
    struct backend *b = NULL;
    void *p = NULL;
    const size_t n = (size_t)5 << 20;
    if (backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK || backend_alloc(b, n, &p) != STATUS_OK) {
        check(0, "a cpu backend and 5 MB of host memory");
        return;
    }
    check((uintptr_t)p % ((size_t)2 << 20) == 0, "a 5 MB host allocation starts on a 2 MB boundary (%p)", p);
    cpu_memory_huge(p, n);
    char flags[256];
    vm_flags_at((char *)p + ((size_t)1 << 20), flags, sizeof flags);
    check(flags[0] && (strstr(flags, " hg") != NULL) == want, "its whole 2 MB pages advised: VmFlags%s",
          flags[0] ? flags : " not found\n");
    memset(p, 1, n);
    f = fopen("/proc/self/smaps_rollup", "r");
    char l[256];
    while (f && fgets(l, sizeof l, f))
        if (!strncmp(l, "AnonHugePages:", 14)) printf("after writing them, %s", l);
    if (f) fclose(f);
    backend_free(b, p);
    backend_close(b);
}

int main(void)
{
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        check(cpu_isa_parse(cpu_isa_name((enum cpu_isa)i)) == (enum cpu_isa)i, "parse(name(%d)) = %d (%s)",
              i, i, cpu_isa_name((enum cpu_isa)i));
    check(cpu_isa_parse("avx512vnni") == CPU_ISA_AVX512_VNNI, "avx512vnni is an alias of avx512-vnni");
    check(cpu_isa_parse("sse9") == CPU_ISA_COUNT && cpu_isa_parse(NULL) == CPU_ISA_COUNT,
          "an unknown name is no level");

    const enum cpu_isa sup = cpu_isa_supported(), ceil = cpu_isa_ceiling(), lvl = cpu_isa();
    const char *env = getenv("SHARDLM_CPU_ISA"), *amx_env = getenv("SHARDLM_CPU_AMX");
    enum cpu_isa want_ceil = cpu_isa_parse(env);
    if (amx_env && (!strcmp(amx_env, "0") || !strcmp(amx_env, "off")) &&
        (want_ceil == CPU_ISA_COUNT || want_ceil > CPU_ISA_AVX512_VNNI))
        want_ceil = CPU_ISA_AVX512_VNNI;
    check(ceil == want_ceil, "ceiling %s from SHARDLM_CPU_ISA=%s SHARDLM_CPU_AMX=%s",
          ceil == CPU_ISA_COUNT ? "none" : cpu_isa_name(ceil), env ? env : "", amx_env ? amx_env : "");
    const enum cpu_isa want = ceil != CPU_ISA_COUNT && ceil < sup ? ceil : sup;
    check(lvl == want, "level %s = min(ceiling, supported %s)", cpu_isa_name(lvl), cpu_isa_name(sup));
    check(cpu_isa_at_least(lvl) && (lvl == CPU_ISA_AMX || !cpu_isa_at_least((enum cpu_isa)(lvl + 1))),
          "cpu_isa_at_least agrees with cpu_isa");

    /* Each family follows the level. */
    enum quant_impl qwant = QUANT_IMPL_SCALAR;
    if (lvl >= CPU_ISA_AVX2 && quant_impl_available(QUANT_IMPL_AVX2)) qwant = QUANT_IMPL_AVX2;
    const char *vnni_env = getenv("SHARDLM_CPU_AVX_VNNI");
    const int vnni_off = vnni_env && (!strcmp(vnni_env, "0") || !strcmp(vnni_env, "off"));
    check(!cpu_avx_vnni() || (lvl >= CPU_ISA_AVX2 && !vnni_off), "AVX-VNNI %s under level %s%s",
          cpu_avx_vnni() ? "on" : "off", cpu_isa_name(lvl), vnni_off ? " and SHARDLM_CPU_AVX_VNNI=0" : "");
    check(quant_impl_available(QUANT_IMPL_AVX_VNNI) == cpu_avx_vnni(), "the AVX-VNNI products follow cpu_avx_vnni");
    if (quant_impl_available(QUANT_IMPL_AVX_VNNI)) qwant = QUANT_IMPL_AVX_VNNI;
    if (lvl >= CPU_ISA_AVX512_VNNI && quant_impl_available(QUANT_IMPL_AVX512_VNNI))
        qwant = QUANT_IMPL_AVX512_VNNI;
    check(quant_impl_best() == qwant, "quantized products: %s", quant_impl_name(quant_impl_best()));
    check(lvl >= CPU_ISA_AVX2 || (!quant_impl_available(QUANT_IMPL_AVX2) && !quant_impl_available(QUANT_IMPL_AVX_VNNI) &&
                                  !quant_impl_available(QUANT_IMPL_AVX512_VNNI)),
          "below avx2 only the scalar products are available");
    const char *want_attn = lvl >= CPU_ISA_AVX512 && attn_kernels_avx512() ? "avx512"
                            : lvl >= CPU_ISA_AVX2 && attn_kernels_avx2()   ? "avx2"
                                                                           : "portable";
    check(!strcmp(attn_kernels_best()->name, want_attn), "attention kernels: %s (want %s)",
          attn_kernels_best()->name, want_attn);
    check(cpu_amx_enabled() == (lvl == CPU_ISA_AMX), "AMX tiles %s", cpu_amx_enabled() ? "on" : "off");
    const int was = cpu_amx_set_enabled(1);
    check(cpu_amx_enabled() == (lvl == CPU_ISA_AMX), "cpu_amx_set_enabled(1) stays under the ceiling");
    cpu_amx_set_enabled(was);
#if defined(__x86_64__)
    const char *vec = lvl >= CPU_ISA_AVX512 ? "avx512" : lvl >= CPU_ISA_AVX2 ? "avx2" : "baseline";
#else
    const char *vec = "baseline";
#endif
    /* The gemv names its rows per pass after the width (SHARDLM_CPU_GEMV_ROWS, else 1 on AMD, 8
     * elsewhere). */
    FILE *ci = fopen("/proc/cpuinfo", "r");
    char l[256];
    int amd_proc = -1; /* the kernel's vendor_id, against CPUID's as cpu_isa_amd reads it */
    while (ci && amd_proc < 0 && fgets(l, sizeof l, ci))
        if (!strncmp(l, "vendor_id", 9)) amd_proc = strstr(l, "AuthenticAMD") != NULL;
    if (ci) fclose(ci);
    if (amd_proc >= 0) check(cpu_isa_amd() == amd_proc, "CPU vendor AMD: %d (/proc/cpuinfo: %d)", cpu_isa_amd(), amd_proc);
    /* Its vector width on AVX-512 CPUs (SHARDLM_CPU_GEMV_BITS, else 256 on AMD, 512 elsewhere). */
    const char *bits_env = getenv("SHARDLM_CPU_GEMV_BITS");
    const int bits = bits_env && (!strcmp(bits_env, "256") || !strcmp(bits_env, "512")) ? atoi(bits_env)
                     : cpu_isa_amd()                                                   ? 256
                                                                                       : 512;
    check(cpu_gemv_bits() == bits, "gemv vector bits %d (want %d)", cpu_gemv_bits(), bits);
    const char *gemv_vec = !strcmp(vec, "avx512") && bits == 256 ? "avx2" : vec;
    const char *rows_env = getenv("SHARDLM_CPU_GEMV_ROWS");
    const int rows = rows_env && (!strcmp(rows_env, "1") || !strcmp(rows_env, "8")) ? atoi(rows_env) : cpu_isa_amd() ? 1 : 8;
    char gemv[32];
    snprintf(gemv, sizeof gemv, strcmp(gemv_vec, "baseline") ? "%s x%d" : "%s", gemv_vec, rows);
    check(cpu_gemv_rows_per_pass() == rows, "gemv rows per pass %d (want %d; CPU vendor %s)", cpu_gemv_rows_per_pass(),
          rows, cpu_isa_amd() ? "AMD" : "not AMD");
    check(!strcmp(cpu_gemv_path(), gemv) && !strcmp(cpu_activation_path(), vec), "gemv %s, activation %s",
          cpu_gemv_path(), cpu_activation_path());

    char line[384];
    printf("kernels: %s\n", cpu_isa_describe(line, sizeof line));
    check(strstr(line, cpu_isa_model()) != NULL, "the description names the CPU (%s)", cpu_isa_model());
    /* The bf16 weights' vdpbf16ps products (bf16_dot.c): where the CPU has AVX512-BF16 at the
     * level in use, unless SHARDLM_CPU_BF16_DOT=0; the line says which. */
    const char *dot_env = getenv("SHARDLM_CPU_BF16_DOT");
#if defined(__x86_64__)
    const int dot = lvl >= CPU_ISA_AVX512 && __builtin_cpu_supports("avx512bf16") &&
                    !(dot_env && (!strcmp(dot_env, "0") || !strcmp(dot_env, "off")));
#else
    const int dot = 0;
    (void)dot_env;
#endif
    check(cpu_bf16_dot_enabled() == dot && strstr(line, dot ? "bf16 dot on" : "bf16 dot off") != NULL,
          "bf16 dot products %s (want %s; the line says so)", cpu_bf16_dot_enabled() ? "on" : "off", dot ? "on" : "off");

    check_huge_pages(line);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
