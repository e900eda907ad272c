/* kernels/cpu/backend_cpu.c - the CPU backend: its table, host memory, the scratch arena and
 * thread settings. C11 + OpenMP threads; matrix products through OpenBLAS (matmul.c).
 * Not here: the ops themselves (one file each in this folder).
 * Tests: tests/test_ops.c --backend cpu. */
#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../backend_impl.h"
#include "cpu_isa.h"
#include "cpu_ops.h"

/* OpenBLAS's own header declares these only in some versions; they exist in every build. */
void openblas_set_num_threads(int num_threads);
char *openblas_get_corename(void);

const char *cpu_blas_better_core(void)
{
    static const char *const old[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                                      "Katmai", "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona", "Bobcat",
                                      "Bulldozer", "Piledriver", "Steamroller", "Excavator", "Nano", "Unknown"};
    const char *core = openblas_get_corename();
    int is_old = 0;
    for (size_t i = 0; core && i < sizeof old / sizeof *old && !is_old; i++) is_old = !strcasecmp(core, old[i]);
    if (!is_old) return NULL;
    const enum cpu_isa isa = cpu_isa_supported();
    return isa >= CPU_ISA_AVX512_VNNI ? "SkylakeX" : isa >= CPU_ISA_AVX2 ? "Haswell" : NULL;
}

#define CPU_ALIGN 256
#define CPU_HUGE  ((size_t)2 << 20) /* x86-64's transparent huge page */

/* SHARDLM_CPU_HUGEPAGES=0 turns the weights' huge pages off (cpu_hugepages_on, ops.h); so does
 * a kernel whose transparent huge pages are "never". */
static int            hugepages;
static pthread_once_t hugepages_once = PTHREAD_ONCE_INIT;

static void hugepages_init(void)
{
    const char *env = getenv("SHARDLM_CPU_HUGEPAGES");
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (f) {
        if (!fgets(mode, sizeof mode, f)) mode[0] = 0;
        fclose(f);
    }
    hugepages = !(env && !strcmp(env, "0")) && f && !strstr(mode, "[never]");
}

int cpu_hugepages_on(void)
{
    pthread_once(&hugepages_once, hugepages_init);
    return hugepages;
}

void cpu_memory_huge(void *p, size_t n)
{
    const uintptr_t a = (uintptr_t)p, lo = (a + CPU_HUGE - 1) / CPU_HUGE * CPU_HUGE,
                    hi = (a + n) / CPU_HUGE * CPU_HUGE;
    if (hi > lo && cpu_hugepages_on()) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
}

static enum status cpu_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    (void)b;
    size_t n = (nbytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
    if (n == 0) n = CPU_ALIGN;
    /* From 2 MB, aligned to a huge page, so that cpu_memory_huge covers all its whole 2 MB
     * (the skipped head is address space, never touched). posix_memalign: C11's aligned_alloc
     * wants a size that is a multiple of the alignment (ASan enforces it). */
    if (posix_memalign(ptr, n >= CPU_HUGE ? CPU_HUGE : CPU_ALIGN, n)) *ptr = NULL;
    if (!*ptr)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cpu: out of host memory allocating %zu bytes",
                             nbytes);
    return STATUS_OK;
}

static void cpu_free(struct backend *b, void *ptr)
{
    (void)b;
    free(ptr);
}

static void cpu_upload(struct backend *b, void *dst, const void *src, size_t n)
{
    (void)b;
    if (n) memcpy(dst, src, n);
}

static void cpu_copy(struct backend *b, void *dst, const void *src, size_t n)
{
    (void)b;
    if (n) memcpy(dst, src, n);
}

static void cpu_memset_zero(struct backend *b, void *dst, size_t n)
{
    (void)b;
    if (n) memset(dst, 0, n);
}

static void cpu_synchronize(struct backend *b) { (void)b; }

/* Host memory from /proc/meminfo: MemAvailable is what can be allocated without swapping. */
static enum status cpu_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes)
{
    (void)b;
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return status_errorf(STATUS_IO, "cpu: cannot read /proc/meminfo");
    char line[256];
    unsigned long long avail = 0, total = 0, kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = kb;
        else if (sscanf(line, "MemTotal: %llu kB", &kb) == 1) total = kb;
    }
    fclose(f);
    if (!avail || !total) return status_errorf(STATUS_IO, "cpu: /proc/meminfo has no MemAvailable / MemTotal");
    *free_bytes = (size_t)avail * 1024;
    *total_bytes = (size_t)total * 1024;
    return STATUS_OK;
}

static void cpu_close(struct backend *b)
{
    struct cpu_state *s = b->impl;
    if (s->graph) { /* closed while recording */
        void *g = NULL;
        if (cpu_graph_end(b, &g) == STATUS_OK) cpu_graph_free(b, g);
    }
    free(s->scratch);
    free(s);
    free(b);
}

float *cpu_scratch(struct backend *b, size_t per_thread)
{
    struct cpu_state *s = b->impl;
    size_t need = cpu_scratch_stride(per_thread) * (size_t)b->n_threads;
    if (need > s->scratch_floats) {
        free(s->scratch);
        s->scratch = aligned_alloc(64, need * sizeof(float));
        CHECK(s->scratch, "cpu: out of memory for %zu scratch floats", need);
        s->scratch_floats = need;
    }
    return s->scratch;
}

static const struct backend_ops cpu_backend_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_upload,
    .copy = cpu_copy,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .mem_info = cpu_mem_info,
    .close = cpu_close,
    .cast = cpu_cast,
    .embedding = cpu_embedding,
    .position_embedding_add = cpu_position_embedding_add,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .layernorm = cpu_layernorm,
    .add = cpu_add,
    .scale = cpu_scale,
    .softcap = cpu_softcap,
    .scatter_add_rows = cpu_scatter_add_weighted,
    .dropout = cpu_dropout,
    .rope = cpu_rope,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .activation = cpu_activation,
    .gated_activation = cpu_gated_activation,
    .softmax = cpu_softmax,
    .log_softmax = cpu_log_softmax,
    .argmax = cpu_argmax,
    .topk = cpu_topk,
    .logit_mass = cpu_logit_mass,
    .logit_draw = cpu_logit_draw,
    .logit_edit = cpu_logit_edit,
    .logit_mask = cpu_logit_mask,
    .logit_lse = cpu_logit_lse,
    .attention_train = cpu_attention_train,
    .attention_train_backward = cpu_attention_train_backward,
    .attention_sinks_backward = cpu_attention_sinks_backward,
    .embedding_backward = cpu_embedding_backward,
    .position_embedding_add_backward = cpu_position_embedding_add_backward,
    .matmul_backward = cpu_matmul_backward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .layernorm_backward = cpu_layernorm_backward,
    .rope_backward = cpu_rope_backward,
    .activation_backward = cpu_activation_backward,
    .gated_activation_backward = cpu_gated_activation_backward,
    .cross_entropy_stats = cpu_cross_entropy_stats,
    .cross_entropy_combine = cpu_cross_entropy_combine,
    .cross_entropy_backward = cpu_cross_entropy_backward,
    .adamw = cpu_adamw,
    .sum_squares = cpu_sum_squares,
    .scatter_add_rows_backward = cpu_scatter_add_weighted_backward,
    .graph_begin = cpu_graph_begin,
    .graph_end = cpu_graph_end,
    .graph_launch = cpu_graph_launch,
    .graph_free = cpu_graph_free,
};

enum status cpu_backend_open(int n_threads, struct backend **out)
{
    *out = NULL;
    if (n_threads < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "cpu: n_threads must be >= 0, got %d", n_threads);
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    struct backend *b = calloc(1, sizeof *b);
    struct cpu_state *s = calloc(1, sizeof *s);
    if (!b || !s) {
        free(b);
        free(s);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cpu: out of memory opening the backend");
    }
    b->ops = &cpu_backend_ops;
    b->device = DEVICE_CPU;
    b->n_threads = n_threads;
    b->impl = s;
    /* One pool: OpenMP threads, each calling a single-threaded OpenBLAS (see matmul.c). Both
     * are process-wide settings: the last backend opened sets them. */
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(1);
    cpu_isa_log(); /* the CPU model and each kernel family's path, once per process */
    *out = b;
    return STATUS_OK;
}
