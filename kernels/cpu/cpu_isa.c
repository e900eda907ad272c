/* kernels/cpu/cpu_isa.c - the one place that asks the CPU which instruction sets it has and
 * reads SHARDLM_CPU_ISA (and its older alias SHARDLM_CPU_AMX), once per process; the contract is
 * in cpu_isa.h. CPUID traps to the hypervisor in a VM (microseconds), so nothing may ask it per
 * call: the answer is kept after the first one.
 * Not here: the choice inside each kernel family (quant.c, amx.c, attention.c, matmul.c,
 * activation.c), which compares its own needs with cpu_isa().
 * Tests: tests/test_cpu_isa.c. */
#include "cpu_isa.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_impl.h"
#include "base.h"
#include "cpu_ops.h"
#include "quant.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define ISA_ARCH_REQ_XCOMP_PERM 0x1023
#define ISA_XFEATURE_XTILEDATA  18
#endif

static const char *const isa_names[CPU_ISA_COUNT] = {"scalar", "avx2", "avx512", "avx512-vnni", "amx"};

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static enum cpu_isa   isa_supported = CPU_ISA_SCALAR, isa_effective = CPU_ISA_SCALAR;
static enum cpu_isa   isa_ceiling = CPU_ISA_COUNT; /* none */
static char           isa_model[64] = "unknown";
static int            isa_avx_vnni; /* the CPU has AVX-VNNI and SHARDLM_CPU_AVX_VNNI allows it */
static int            isa_amd;      /* CPUID's vendor is AuthenticAMD */

const char *cpu_isa_name(enum cpu_isa level)
{
    return (unsigned)level < CPU_ISA_COUNT ? isa_names[level] : "?";
}

enum cpu_isa cpu_isa_parse(const char *s)
{
    if (!s) return CPU_ISA_COUNT;
    for (int i = 0; i < CPU_ISA_COUNT; i++)
        if (!strcmp(s, isa_names[i])) return (enum cpu_isa)i;
    if (!strcmp(s, "avx512vnni") || !strcmp(s, "avx512_vnni")) return CPU_ISA_AVX512_VNNI;
    return CPU_ISA_COUNT;
}

#if defined(__x86_64__) || defined(__i386__)
/* The highest level whose features (and those of every level below) this CPU has. The F16C
 * bit comes from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know
 * "f16c"; the builtins check XGETBV, i.e. that the OS saves the YMM/ZMM state. */
static enum cpu_isa probe_supported(void)
{
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c >> 29 & 1) || !__builtin_cpu_supports("avx2") ||
        !__builtin_cpu_supports("fma"))
        return CPU_ISA_SCALAR;
    if (!__builtin_cpu_supports("avx512f")) return CPU_ISA_AVX2;
    if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bw"))
        return CPU_ISA_AVX512;
    /* AMX-TILE, AMX-BF16, AMX-INT8 (CPUID 7.0 EDX bits 24, 22, 25: amx.c and quant_amx.c),
     * AVX512-BF16 (7.1 EAX bit 5). */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1) || !(d >> 22 & 1) || !(d >> 25 & 1))
        return CPU_ISA_AVX512_VNNI;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a >> 5 & 1)) return CPU_ISA_AVX512_VNNI;
#if defined(__x86_64__) && defined(__linux__)
    return CPU_ISA_AMX;
#else
    return CPU_ISA_AVX512_VNNI; /* amx.c has tiles only for x86-64 Linux */
#endif
}

/* AVX-VNNI: CPUID 7.1 EAX bit 4 (with AVX2: the caller checks the level). */
static int probe_avx_vnni(void)
{
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}

static void probe_model(void)
{
    unsigned r[12];
    if (__get_cpuid(0, &r[0], &r[1], &r[2], &r[3])) /* vendor: EBX, EDX, ECX */
        isa_amd = r[1] == 0x68747541u && r[3] == 0x69746e65u && r[2] == 0x444d4163u; /* "Auth" "enti" "cAMD" */
    /* __get_cpuid_max is int in clang's cpuid.h, unsigned in gcc's: -Wsign-compare under clang. */
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]);
        char brand[49];
        memcpy(brand, r, 48);
        brand[48] = 0;
        const char *s = brand;
        while (*s == ' ') s++;
        if (*s) {
            snprintf(isa_model, sizeof isa_model, "%s", s);
            return;
        }
    }
}
#else
static enum cpu_isa probe_supported(void) { return CPU_ISA_SCALAR; }
static int          probe_avx_vnni(void) { return 0; }
static void         probe_model(void) {}
#endif

/* /proc/cpuinfo's "model name" where CPUID has no brand string (other architectures). */
static void model_from_proc(void)
{
    if (strcmp(isa_model, "unknown")) return;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (!colon || strncmp(line, "model name", 10)) continue;
        colon++;
        while (*colon == ' ' || *colon == '\t') colon++;
        snprintf(isa_model, sizeof isa_model, "%.*s", (int)strcspn(colon, "\n"), colon);
        break;
    }
    fclose(f);
}

static void isa_init(void)
{
    isa_supported = probe_supported();
    probe_model();
    model_from_proc();

    const char *e = getenv("SHARDLM_CPU_ISA");
    if (e && *e) {
        isa_ceiling = cpu_isa_parse(e);
        if (isa_ceiling == CPU_ISA_COUNT)
            LOG_WARN("cpu", "SHARDLM_CPU_ISA=%s is not one of scalar, avx2, avx512, avx512-vnni, amx: "
                            "ignored", e);
    }
    const char *amx = getenv("SHARDLM_CPU_AMX");
    if (amx && (!strcmp(amx, "0") || !strcmp(amx, "off")) &&
        (isa_ceiling == CPU_ISA_COUNT || isa_ceiling > CPU_ISA_AVX512_VNNI))
        isa_ceiling = CPU_ISA_AVX512_VNNI;

    enum cpu_isa level = isa_supported;
    if (isa_ceiling != CPU_ISA_COUNT && isa_ceiling < level) level = isa_ceiling;
    /* The tile state needs the kernel's permission (Linux hands out the 8 KiB per thread only
     * after asking); asked only when the tiles would be used. */
#if defined(__x86_64__) && defined(__linux__)
    if (level == CPU_ISA_AMX &&
        syscall(SYS_arch_prctl, ISA_ARCH_REQ_XCOMP_PERM, ISA_XFEATURE_XTILEDATA) != 0) {
        isa_supported = CPU_ISA_AVX512_VNNI;
        level = CPU_ISA_AVX512_VNNI;
    }
#endif
    const enum cpu_isa asked = cpu_isa_parse(e);
    if (asked != CPU_ISA_COUNT && asked > isa_supported)
        LOG_WARN("cpu", "SHARDLM_CPU_ISA=%s: this CPU (%s) supports up to %s; using %s", e,
                 isa_model, cpu_isa_name(isa_supported), cpu_isa_name(level));
    isa_effective = level;
    const char *vnni = getenv("SHARDLM_CPU_AVX_VNNI");
    isa_avx_vnni = level >= CPU_ISA_AVX2 && probe_avx_vnni() && !(vnni && (!strcmp(vnni, "0") || !strcmp(vnni, "off")));
}

int cpu_isa_amd(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_amd;
}

int cpu_avx_vnni(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_avx_vnni;
}

enum cpu_isa cpu_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_effective;
}

int cpu_isa_at_least(enum cpu_isa level) { return cpu_isa() >= level; }

enum cpu_isa cpu_isa_supported(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_supported;
}

enum cpu_isa cpu_isa_ceiling(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_ceiling;
}

const char *cpu_isa_model(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_model;
}

char *openblas_get_corename(void);

char *cpu_isa_describe(char *buf, size_t n)
{
    const struct attn_kernels *at = attn_kernels_best();
    const enum quant_impl qi = quant_impl_best();
    char sgemm_from[32] = "never", amx[64] = "off";
    if (cpu_quant_sgemm_min_m() < INT_MAX)
        snprintf(sgemm_from, sizeof sgemm_from, "from %d rows%s", cpu_quant_sgemm_min_m(),
                 cpu_quant_int8_packed() ? " (packed: never)" : "");
    if (cpu_amx_enabled() && cpu_quant_int8_packed())
        snprintf(amx, sizeof amx, "on (packed from %d rows%s)", cpu_quant_amx_packed_min_m(),
                 quant_amx_int8_on() ? "; 32-element types int8 from 2" : "");
    else if (cpu_amx_enabled())
        snprintf(amx, sizeof amx, "on");
    snprintf(buf, n,
             "%s; isa %s (supported %s%s%s); quant %s, dequant %s, amx %s, bf16 dot %s, huge pages %s, attention %s, "
             "gemv %s, activation %s, prefetch %zu, blocks' sgemm %s, GOMP_SPINCOUNT %s, OpenBLAS %s",
             cpu_isa_model(), cpu_isa_name(cpu_isa()), cpu_isa_name(cpu_isa_supported()),
             cpu_isa_ceiling() != CPU_ISA_COUNT ? ", ceiling " : "",
             cpu_isa_ceiling() != CPU_ISA_COUNT ? cpu_isa_name(cpu_isa_ceiling()) : "",
             quant_impl_name(qi), qi == QUANT_IMPL_SCALAR ? "scalar" : "avx2",
             amx, cpu_bf16_dot_enabled() ? "on" : "off", cpu_hugepages_on() ? "on" : "off", at->name, cpu_gemv_path(),
             cpu_activation_path(),
             quant_prefetch_bytes(), sgemm_from, getenv("GOMP_SPINCOUNT") ? getenv("GOMP_SPINCOUNT") : "unset",
             openblas_get_corename());
    return buf;
}

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_describe(void)
{
    char line[384];
    LOG_INFO("cpu", "%s", cpu_isa_describe(line, sizeof line));
}

void cpu_isa_log(void) { pthread_once(&log_once, log_describe); }
