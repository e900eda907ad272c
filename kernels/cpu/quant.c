/* kernels/cpu/quant.c - the quantized product's driver (kernels/quant.h): type geometry, the
 * choice of implementation by cpu_isa() (cpu_isa.h: the CPU's level capped by SHARDLM_CPU_ISA),
 * and quant_matmul itself: x quantized once per call
 * into the scratch, then each (row of x, row of W) an integer dot product, the rows of W split
 * across OpenMP threads. One thread pool, as everywhere in the CPU backend (kernels/cpu/
 * matmul.c says why): no BLAS here, only OpenMP.
 * Not here: the kernels (quant_scalar.c, quant_avx2.c, quant_avx512_vnni.c), the row
 * dequantizers (quant_dequantize.c).
 * Tests: tests/test_quant.c; benchmark: tests/bench_quant.c. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include "base.h"
#include "cpu_isa.h"
#include "ops.h"
#include "quant_impl.h"

/* Below this many multiply-adds one thread does the whole product (as op_matmul). */
#define QUANT_PARALLEL_MIN (1 << 18)
/* Rows of W per scheduling unit: 16 rows of y are one 64-byte line of f32, so threads never
 * share a line of y, and a tile of W (under 10 KB at k = 2048 for Q4_K) stays in L1 while every
 * row of x passes over it. */
#define ROW_TILE 16
#define AMX_TILE 256

struct type_info {
    enum quant_type type;
    const char     *name;
    int             block_size;
    size_t          block_bytes;
    size_t          align;       /* of the block struct: where a row may start (2, MXFP4's 1) */
};

/* In enum quant_slot order. */
static const struct type_info type_infos[SLOT_COUNT] = {
    {QUANT_TYPE_Q4_0, "Q4_0", QK, sizeof(struct blk_q4_0), _Alignof(struct blk_q4_0)},
    {QUANT_TYPE_Q4_1, "Q4_1", QK, sizeof(struct blk_q4_1), _Alignof(struct blk_q4_1)},
    {QUANT_TYPE_Q5_0, "Q5_0", QK, sizeof(struct blk_q5_0), _Alignof(struct blk_q5_0)},
    {QUANT_TYPE_Q5_1, "Q5_1", QK, sizeof(struct blk_q5_1), _Alignof(struct blk_q5_1)},
    {QUANT_TYPE_Q8_0, "Q8_0", QK, sizeof(struct blk_q8_0), _Alignof(struct blk_q8_0)},
    {QUANT_TYPE_Q4_K, "Q4_K", QK_K, sizeof(struct blk_q4_k), _Alignof(struct blk_q4_k)},
    {QUANT_TYPE_Q5_K, "Q5_K", QK_K, sizeof(struct blk_q5_k), _Alignof(struct blk_q5_k)},
    {QUANT_TYPE_Q6_K, "Q6_K", QK_K, sizeof(struct blk_q6_k), _Alignof(struct blk_q6_k)},
    {QUANT_TYPE_Q2_K, "Q2_K", QK_K, sizeof(struct blk_q2_k), _Alignof(struct blk_q2_k)},
    {QUANT_TYPE_Q3_K, "Q3_K", QK_K, sizeof(struct blk_q3_k), _Alignof(struct blk_q3_k)},
    {QUANT_TYPE_IQ4_NL, "IQ4_NL", QK, sizeof(struct blk_iq4_nl), _Alignof(struct blk_iq4_nl)},
    {QUANT_TYPE_IQ4_XS, "IQ4_XS", QK_K, sizeof(struct blk_iq4_xs), _Alignof(struct blk_iq4_xs)},
    {QUANT_TYPE_MXFP4, "MXFP4", QK, sizeof(struct blk_mxfp4), _Alignof(struct blk_mxfp4)},
};

static int slot_of(uint32_t type)
{
    for (int s = 0; s < SLOT_COUNT; s++)
        if ((uint32_t)type_infos[s].type == type) return s;
    return -1;
}

int quant_type_supported(uint32_t type) { return slot_of(type) >= 0; }

const char *quant_type_name(uint32_t type)
{
    const int s = slot_of(type);
    return s >= 0 ? type_infos[s].name : "?";
}

int quant_block_size(uint32_t type)
{
    const int s = slot_of(type);
    return s >= 0 ? type_infos[s].block_size : 0;
}

size_t quant_block_bytes(uint32_t type)
{
    const int s = slot_of(type);
    return s >= 0 ? type_infos[s].block_bytes : 0;
}

size_t quant_row_bytes(enum quant_type type, int64_t k)
{
    const int bs = quant_block_size(type);
    CHECK(bs > 0 && k >= 0 && k % bs == 0, "quant_row_bytes: type %d, k %lld", (int)type,
          (long long)k);
    return (size_t)(k / bs) * quant_block_bytes(type);
}

/* Bytes of one quantized row of x of k elements for a weight type of block size bs. */
static size_t act_row_bytes(int bs, int64_t k)
{
    return bs == QK_K ? (size_t)(k / QK_K) * sizeof(struct act_q8_k)
                      : (size_t)(k / QK) * sizeof(struct act_q8);
}

size_t quant_matmul_scratch_bytes(enum quant_type type, int64_t m, int64_t k)
{
    const int bs = quant_block_size(type);
    CHECK(bs > 0 && m >= 0 && k >= 0 && k % bs == 0, "quant_matmul_scratch_bytes: type %d, k %lld",
          (int)type, (long long)k);
    return (size_t)m * act_row_bytes(bs, k);
}

/* ---- implementations ---- */

const char *quant_impl_name(enum quant_impl impl)
{
    switch (impl) {
    case QUANT_IMPL_SCALAR: return "scalar";
    case QUANT_IMPL_AVX2: return "avx2";
    case QUANT_IMPL_AVX_VNNI: return "avxvnni";
    case QUANT_IMPL_AVX512_VNNI: return "avx512vnni";
    case QUANT_IMPL_COUNT: break;
    }
    return "?";
}

/* Bit i set when implementation i runs here: compiled in and allowed by cpu_isa() (the CPU's
 * level capped by SHARDLM_CPU_ISA, cpu_isa.h). Computed once; racing first calls compute the
 * same value. */
static _Atomic int impl_mask = -1;

static int available_mask(void)
{
    int mask = atomic_load_explicit(&impl_mask, memory_order_relaxed);
    if (mask < 0) {
        mask = 1 << QUANT_IMPL_SCALAR;
        if (quant_kernels_avx2() && cpu_isa_at_least(CPU_ISA_AVX2)) mask |= 1 << QUANT_IMPL_AVX2;
        if (quant_kernels_avx_vnni() && cpu_avx_vnni()) mask |= 1 << QUANT_IMPL_AVX_VNNI;
        if (quant_kernels_avx512_vnni() && cpu_isa_at_least(CPU_ISA_AVX512_VNNI))
            mask |= 1 << QUANT_IMPL_AVX512_VNNI;
        atomic_store_explicit(&impl_mask, mask, memory_order_relaxed);
    }
    return mask;
}

static const struct quant_kernels *kernels_of(enum quant_impl impl)
{
    if ((unsigned)impl >= QUANT_IMPL_COUNT || !(available_mask() >> impl & 1)) return NULL;
    switch (impl) {
    case QUANT_IMPL_SCALAR: return quant_kernels_scalar();
    case QUANT_IMPL_AVX2: return quant_kernels_avx2();
    case QUANT_IMPL_AVX_VNNI: return quant_kernels_avx_vnni();
    case QUANT_IMPL_AVX512_VNNI: return quant_kernels_avx512_vnni();
    case QUANT_IMPL_COUNT: break;
    }
    return NULL;
}

int quant_impl_available(enum quant_impl impl) { return kernels_of(impl) != NULL; }

enum quant_impl quant_impl_best(void)
{
    for (int impl = QUANT_IMPL_COUNT - 1; impl > QUANT_IMPL_SCALAR; impl--)
        if (quant_impl_available((enum quant_impl)impl)) return (enum quant_impl)impl;
    return QUANT_IMPL_SCALAR;
}

/* ---- the product ---- */

/* One product y[m][n] = x[m][k] . w[n][k]^T, stored or packed: what its column tiles read. */
struct product {
    const struct quant_kernels *kt;
    int slot;
    int64_t m, n, k, nb;
    size_t xq_row; /* bytes of one quantized row of x */
    size_t w_step; /* bytes of one stored row of w, or of one packed group of eight */
    const uint8_t *w, *xq;
    float *y;
    int amx; /* on AMX int8 tiles: runs of 2..16 rows of x there (quant_amx.c) */
};

typedef void (*product_tile_fn)(const struct product *p, int64_t j0, int64_t j1);

/* Both layouts' driver: every row of x quantized to the weights' activation type (in scratch,
 * m rows of xq_row bytes, or a buffer of its own), then the columns in tiles of ROW_TILE. */
static void product_run(struct product *p, const float *x, void *scratch, int n_threads, product_tile_fn tile)
{
    const int bs = type_infos[p->slot].block_size;
    p->nb = p->k / bs;
    p->xq_row = act_row_bytes(bs, p->k);
    void *owned = NULL;
    if (!scratch) {
        scratch = owned = malloc((size_t)p->m * p->xq_row);
        CHECK(scratch, "quant_matmul: out of memory for %zu bytes of scratch", (size_t)p->m * p->xq_row);
    }
    const quant_act_fn act = bs == QK_K ? p->kt->act_q8_k : p->kt->act_q8;
    uint8_t *xq = scratch;
    p->xq = xq;
    const int64_t m = p->m, n = p->n, k = p->k, nb = p->nb;
    const size_t xq_row = p->xq_row;
    const int nt = (double)m * (double)n * (double)k >= QUANT_PARALLEL_MIN ? n_threads : 1;
    /* AMX: wider tiles (up to AMX_TILE columns while each thread keeps at least 8 tiles), since
     * each call configures the tiles once. */
    int64_t tw = ROW_TILE;
    if (p->amx)
        while (tw < AMX_TILE && n >= (int64_t)nt * 8 * 2 * tw) tw *= 2;

    #pragma omp parallel num_threads(nt) if (nt > 1)
    {
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) act(x + i * k, xq + (size_t)i * xq_row, nb);
        /* The implied barrier: every row of x is quantized before any product reads it. */
        #pragma omp for schedule(static)
        for (int64_t j0 = 0; j0 < n; j0 += tw) tile(p, j0, j0 + tw < n ? j0 + tw : n);
    }
    free(owned);
}

/* Stored rows: four rows of x at a time against each weight row, then the rest four weight rows
 * at a time, then one by one. */
static void stored_tile(const struct product *p, int64_t j0, int64_t j1)
{
    const quant_dot_fn dot = p->kt->dot[p->slot];
    const quant_dot4_fn dot4 = p->kt->dot4[p->slot];
    const quant_dotw4_fn dotw4 = p->kt->dotw4[p->slot];
    const int64_t m = p->m, n = p->n, nb = p->nb;
    const size_t xq_row = p->xq_row, w_row = p->w_step;
    const uint8_t *wb = p->w, *xq = p->xq;
    float *y = p->y;
    int64_t i = 0;
    if (dot4)
        for (; i + 4 <= m; i += 4)
            for (int64_t j = j0; j < j1; j++)
                dot4(nb, wb + (size_t)j * w_row, xq + (size_t)i * xq_row, xq_row, y + i * n + j, n);
    for (; i < m; i++) {
        int64_t j = j0;
        if (dotw4)
            for (; j + 4 <= j1; j += 4) {
                float y4[4];
                dotw4(nb, wb + (size_t)j * w_row, w_row, xq + (size_t)i * xq_row, y4);
                for (int r = 0; r < 4; r++) y[i * n + j + r] = y4[r];
            }
        for (; j < j1; j++) y[i * n + j] = dot(nb, wb + (size_t)j * w_row, xq + (size_t)i * xq_row);
    }
}

/* Packed groups: two groups (16 rows of y, a line of f32) per tile, every row of x over them
 * while they are in L1. */
size_t quant_prefetch_far = QUANT_PREFETCH_DEFAULT;
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;
/* The 32-element types' packed products of 2 or more rows on AMX int8 tiles where AMX is on
 * (quant_amx.c); SHARDLM_CPU_AMX_INT8=0 keeps them on the VNNI kernels (the same bits; for
 * benchmarks). */
static int amx_int8 = 1;

static void knobs_init(void)
{
    const char *a = getenv("SHARDLM_CPU_AMX_INT8");
    if (a && *a && strcmp(a, "0") && strcmp(a, "1"))
        LOG_WARN("cpu", "SHARDLM_CPU_AMX_INT8=%s is not 0 or 1: ignored", a);
    else if (a && !strcmp(a, "0"))
        amx_int8 = 0;
    const char *e = getenv("SHARDLM_CPU_PREFETCH");
    char *end = NULL;
    const long v = e && *e ? strtol(e, &end, 10) : -1;
    if (e && *e && (*end || v < 0 || v > (1 << 20)))
        LOG_WARN("cpu", "SHARDLM_CPU_PREFETCH=%s is not a byte count in 0..1048576: ignored", e);
    else if (v >= 0)
        quant_prefetch_far = (size_t)v;
}

size_t quant_prefetch_bytes(void)
{
    pthread_once(&knobs_once, knobs_init);
    return quant_prefetch_far;
}

int quant_amx_int8_on(void)
{
    pthread_once(&knobs_once, knobs_init);
    return amx_int8 && cpu_amx_enabled();
}

/* One pass of fn (rows of x from row i) over the tile's groups. */
static void packed_pass(const struct product *p, quant_packed8x4_fn fn, int64_t i, int64_t j0, int64_t j1)
{
    for (int64_t j = j0; j < j1; j += 8)
        fn(p->nb, p->w + (size_t)(j / 8) * p->w_step, p->xq + (size_t)i * p->xq_row, p->xq_row, p->y + i * p->n + j,
           p->n);
}

/* Four rows of x at a time over each group (each block unpacked once for the four), five or
 * three in one pass where the kernels have them and the rest is just that, then two, then the
 * rest one by one; a row's bits are the same either way. */
static void packed_tile(const struct product *p, int64_t j0, int64_t j1)
{
    const struct quant_kernels *kt = p->kt;
    const int s = p->slot;
    int64_t i = 0;
    if (p->amx)
        for (int rows; p->m - i >= 2; i += rows) {
            rows = p->m - i < 16 ? (int)(p->m - i) : 16;
            if (!quant_amx_packed(s, p->nb, p->w + (size_t)(j0 / 8) * p->w_step, p->w_step, (j1 - j0) / 8,
                                  p->xq + (size_t)i * p->xq_row, p->xq_row, rows, p->y + i * p->n + j0, p->n))
                break;
        }
    for (;;) {
        const int64_t left = p->m - i;
        int rows = 0;
        quant_packed8x4_fn fn = NULL;
        if (left == 5 && kt->packed8x5[s]) rows = 5, fn = kt->packed8x5[s];
        else if (left >= 4 && kt->packed8x4[s]) rows = 4, fn = kt->packed8x4[s];
        else if (left == 3 && kt->packed8x3[s]) rows = 3, fn = kt->packed8x3[s];
        else if (left >= 2 && kt->packed8x2[s]) rows = 2, fn = kt->packed8x2[s];
        if (!fn) break;
        packed_pass(p, fn, i, j0, j1);
        i += rows;
    }
    for (; i < p->m; i++)
        for (int64_t j = j0; j < j1; j += 8)
            kt->packed8[s](p->nb, p->w + (size_t)(j / 8) * p->w_step, p->xq + (size_t)i * p->xq_row, p->y + i * p->n + j);
}

void quant_matmul_impl(enum quant_impl impl, enum quant_type type, float *y, const float *x,
                       const void *w, int64_t m, int64_t n, int64_t k, void *scratch,
                       int n_threads)
{
    const int slot = slot_of(type);
    CHECK(slot >= 0, "quant_matmul: unsupported ggml type %d", (int)type);
    const int bs = type_infos[slot].block_size;
    CHECK(m >= 0 && n >= 0 && k >= 0 && k % bs == 0,
          "quant_matmul: %s with m %lld, n %lld, k %lld (k must be a multiple of %d)",
          type_infos[slot].name, (long long)m, (long long)n, (long long)k, bs);
    CHECK(n_threads >= 1, "quant_matmul: n_threads %d", n_threads);
    CHECK((uintptr_t)w % type_infos[slot].align == 0, "quant_matmul: %s weight blocks must be %zu-byte aligned",
          type_infos[slot].name, type_infos[slot].align);
    const struct quant_kernels *kt = kernels_of(impl);
    CHECK(kt, "quant_matmul: implementation %s is not available here", quant_impl_name(impl));
    if (m == 0 || n == 0) return;
    if (k == 0) {
        memset(y, 0, (size_t)(m * n) * sizeof(float));
        return;
    }
    struct product p = {.kt = kt, .slot = slot, .m = m, .n = n, .k = k, .w = w, .y = y,
                        .w_step = (size_t)(k / bs) * type_infos[slot].block_bytes};
    product_run(&p, x, scratch, n_threads, stored_tile);
}

void quant_matmul_packed_impl(enum quant_impl impl, enum quant_type type, float *y, const float *x,
                              const void *wp, int64_t m, int64_t n, int64_t k, void *scratch, int n_threads)
{
    const int slot = slot_of(type);
    CHECK(slot >= 0 && m >= 0 && quant_packable(type, n, k) && n_threads >= 1,
          "quant_matmul_packed: %s with m %lld, n %lld, k %lld, %d threads", quant_type_name(type), (long long)m,
          (long long)n, (long long)k, n_threads);
    const struct quant_kernels *kt = kernels_of(impl);
    CHECK(kt && kt->packed8[slot], "quant_matmul_packed: implementation %s is not available here", quant_impl_name(impl));
    if (m == 0) return;
    (void)quant_prefetch_bytes(); /* sets quant_prefetch_far, which the kernels read */
    struct product p = {.kt = kt, .slot = slot, .m = m, .n = n, .k = k, .w = wp, .y = y,
                        .w_step = quant_packed_bytes(type, 8, k),
                        .amx = type_infos[slot].block_size == 32 && impl == QUANT_IMPL_AVX512_VNNI && m >= 2 &&
                               quant_amx_int8_on()};
    product_run(&p, x, scratch, n_threads, packed_tile);
}

void quant_matmul_packed(enum quant_type type, float *y, const float *x, const void *wp, int64_t m, int64_t n,
                         int64_t k, void *scratch, int n_threads)
{
    quant_matmul_packed_impl(quant_impl_best(), type, y, x, wp, m, n, k, scratch, n_threads);
}

void quant_matmul(enum quant_type type, float *y, const float *x, const void *w, int64_t m,
                  int64_t n, int64_t k, void *scratch, int n_threads)
{
    quant_matmul_impl(quant_impl_best(), type, y, x, w, m, n, k, scratch, n_threads);
}
