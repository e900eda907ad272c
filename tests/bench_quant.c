/* tests/bench_quant.c - speed of the quantized product (kernels/quant.h) on the shapes of
 * Gemma 3 270M (d_model 640, ffn 2048, 4 heads of 256: q 1024 wide), each next to the f32
 * product the CPU backend does today on the same weights dequantized (op_matmul: OpenBLAS
 * sgemv for one row, sgemm otherwise, single-threaded inside the OpenMP threads), measured in
 * the same run:
 *   per (shape, m, threads, type): time of one product with the best implementation here, the
 *   weight bandwidth it reaches (bytes of blocks read per second), the f32 product's time and
 *   bandwidth, the speed-up (f32 time / quantized time), and for the 32-element types the
 *   times of the other SIMD implementations that run here (avx2, avxvnni, avx512vnni).
 * The 256-element types (K-quants, IQ4_XS) need k a multiple of 256, so they only appear at k = 2048 (which is why Gemma's
 * Q4_K_M file stores its 640-wide rows as Q5_0 and Q8_0).
 * Every figure is the best of several timed repetitions after a warm-up call.
 *
 * A benchmark, never a pass/fail gate: it exits 0 whatever the numbers are.
 * Not here: correctness (tests/test_quant.c).
 *
 * Also decode's largest product, the LM head (178 MB of Q8_0), next to a plain read of as many
 * bytes in the same run (the kernel's fraction of the read bandwidth).
 *
 * --packed: the packed layout (quant_pack_rows8) at m rows in one call (four rows of x over each
 * unpacked block: packed8x4) against m calls of one row each (what m rows cost before packed8x4),
 * one thread, on SmolLM2-135M's and Gemma 3 270M's shapes: the verification steps of speculative
 * decoding (1 + drafts rows), small batches and int8 prefill.
 *
 * --verify: the LM head of Gemma 3 270M (packed Q8_0) at m = 1 .. 5 rows, 1 and 2 threads: what the
 * rows of a speculative verification step cost beside one decode row.
 *
 * Run: bench_quant [--quick | --lm-head | --packed | --verify]   (about a minute on 2 idle cores;
 * --quick about 15 s; --lm-head only the LM head at one thread) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "ops.h"
#include "quant.h"
#include "quant_fill.h"

struct bench {
    double min_time; /* seconds of timed repetitions per measurement */
    int    max_reps;
};

static double time_best(const struct bench *bn, void (*fn)(void *), void *ctx)
{
    return bench_time_best(bn->min_time, 3, bn->max_reps, fn, ctx);
}

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* Random blocks with small finite f16 scales (tests/quant_fill.h): speed does not depend on
 * the values. */
static uint64_t fill_seed = 0xbe7c4;
static void fill_blocks(enum quant_type t, uint8_t *w, size_t bytes)
{
    qfill_blocks(t, w, (int64_t)(bytes / quant_block_bytes(t)), 0, &fill_seed);
}

struct quant_ctx {
    enum quant_impl impl;
    enum quant_type type;
    float          *y;
    const float    *x;
    const void     *w;
    void           *scratch;
    int64_t         m, n, k;
    int             threads;
};

static void run_quant(void *p)
{
    struct quant_ctx *c = p;
    quant_matmul_impl(c->impl, c->type, c->y, c->x, c->w, c->m, c->n, c->k, c->scratch, c->threads);
}

/* The same product over the weights packed eight rows at a time (c->w packed). */
static void run_quant_packed(void *p)
{
    struct quant_ctx *c = p;
    quant_matmul_packed_impl(c->impl, c->type, c->y, c->x, c->w, c->m, c->n, c->k, c->scratch, c->threads);
}

/* Appends to extra (cap bytes) " (NAME T us)" for each SIMD implementation other than best that
 * runs here, timing fn over c with c->impl set to it (restored to best after). */
static void time_others(enum quant_impl best, void (*fn)(void *), struct quant_ctx *c, const struct bench *reps, char *extra,
                        size_t cap)
{
    for (int i = QUANT_IMPL_AVX2; i < QUANT_IMPL_COUNT; i++) {
        if (i == (int)best || !quant_impl_available((enum quant_impl)i)) continue;
        c->impl = (enum quant_impl)i;
        const size_t used = strlen(extra);
        snprintf(extra + used, cap - used, " (%s %.1f us)", quant_impl_name(c->impl), time_best(reps, fn, c) * 1e6);
    }
    c->impl = best;
}

struct f32_ctx {
    struct backend *b;
    struct tensor   y, x, w;
};

static void run_f32(void *p)
{
    struct f32_ctx *c = p;
    op_matmul(c->b, &c->y, &c->x, &c->w, NULL);
}

static const enum quant_type types[] = {
    QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K, QUANT_TYPE_Q5_0, QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1,
    QUANT_TYPE_Q5_1, QUANT_TYPE_Q5_K, QUANT_TYPE_Q2_K, QUANT_TYPE_Q3_K, QUANT_TYPE_IQ4_NL, QUANT_TYPE_IQ4_XS,
    QUANT_TYPE_MXFP4,
};

/* One shape at m rows on b's threads: the f32 product, then every type whose block fits k. */
static void bench_shape(const struct bench *bn, struct backend *b, const char *label, int64_t m,
                        int64_t k, int64_t n)
{
    float *x = malloc((size_t)(m * k) * sizeof(float)), *y = malloc((size_t)(m * n) * sizeof(float));
    float *wf = malloc((size_t)(n * k) * sizeof(float));
    for (int64_t i = 0; i < m * k; i++) x[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f;
    for (int64_t i = 0; i < n * k; i++) wf[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-4f;
    struct f32_ctx fc = {b, tensor_make(y, DTYPE_F32, DEVICE_CPU, 2, m, n),
                         tensor_make(x, DTYPE_F32, DEVICE_CPU, 2, m, k),
                         tensor_make(wf, DTYPE_F32, DEVICE_CPU, 2, n, k)};
    const double t_f32 = time_best(bn, run_f32, &fc);
    const double f32_bytes = (double)(n * k) * 4.0;
    printf("%-15s m=%-3lld k=%-5lld n=%-5lld threads %d: f32 op_matmul %8.1f us %6.1f GB/s\n", label,
           (long long)m, (long long)k, (long long)n, b->n_threads, t_f32 * 1e6, f32_bytes / t_f32 * 1e-9);
    const enum quant_impl best = quant_impl_best();
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const enum quant_type t = types[ti];
        if (k % quant_block_size(t)) continue;
        const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
        uint8_t *w = malloc(wbytes);
        void *scratch = malloc(quant_matmul_scratch_bytes(t, m, k));
        fill_blocks(t, w, wbytes);
        struct quant_ctx qc = {best, t, y, x, w, scratch, m, n, k, b->n_threads};
        const double tq = time_best(bn, run_quant, &qc);
        /* What serving runs: op_matmul with the block tensor (int8 dots for few rows, tiles
         * dequantized for sgemm from QUANT_SGEMM_MIN_M rows on: kernels/cpu/matmul.c). */
        struct f32_ctx oc = {b, fc.y, fc.x, tensor_make(w, (enum dtype)dtype_of_quant_type((uint32_t)t), DEVICE_CPU, 2, n, k)};
        const int amx = cpu_amx_set_enabled(0);
        const double to = time_best(bn, run_f32, &oc);
        char amx_note[64] = "";
        if (amx) {
            cpu_amx_set_enabled(1);
            const double ta = time_best(bn, run_f32, &oc);
            snprintf(amx_note, sizeof amx_note, ", with AMX %8.1f us (%5.2fx)", ta * 1e6, t_f32 / ta);
        }
        char extra[320] = "";
        if (quant_block_size(t) == 32) time_others(best, run_quant, &qc, bn, extra, sizeof extra);
        printf("    %-6s %-10s int8 %8.1f us %6.1f GB/s  %4.2f bytes/weight  speed-up vs f32 %5.2fx%s"
               "  | op_matmul %8.1f us (%5.2fx f32)%s\n",
               quant_type_name(t), quant_impl_name(best), tq * 1e6, (double)wbytes / tq * 1e-9,
               (double)wbytes / (double)(n * k), t_f32 / tq, extra, to * 1e6, t_f32 / to, amx_note);
        fflush(stdout);
        free(scratch);
        free(w);
    }
    free(wf);
    free(y);
    free(x);
}

struct read_ctx {
    const uint64_t *p;
    size_t          n;
};

static volatile uint64_t read_sink; /* keeps the sums, so the reads are not dropped */

/* The plain read bandwidth: four running sums over the buffer. */
static void run_read(void *p)
{
    struct read_ctx *c = p;
    uint64_t s[4] = {0, 0, 0, 0};
    for (size_t i = 0; i + 4 <= c->n; i += 4)
        for (int j = 0; j < 4; j++) s[j] += c->p[i + j];
    read_sink = read_sink + s[0] + s[1] + s[2] + s[3];
}

/* Decode's largest product: Gemma 3 270M's tied LM head (262,144 x 640, Q8_0 in the Q4_K_M
 * file: 178 MB, beyond every private cache) for one row of x, against a plain read of as many
 * bytes in the same run: the fraction of the read bandwidth the kernel reaches. */
static void bench_lm_head(const struct bench *bn, int threads)
{
    static const enum quant_type lm_types[] = {QUANT_TYPE_Q8_0, QUANT_TYPE_Q5_0, QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1,
                                               QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K};
    float *x = malloc((size_t)1024 * sizeof(float)), *y = malloc((size_t)262144 * sizeof(float));
    for (int64_t i = 0; i < 1024; i++) x[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f;
    for (size_t ti = 0; ti < sizeof lm_types / sizeof lm_types[0]; ti++) {
        const enum quant_type t = lm_types[ti];
        /* The K-quants' rows are whole super-blocks: the same elements as 163,840 x 1,024. */
        const int64_t k = quant_block_size(t) == 32 ? 640 : 1024, n = 262144 * 640 / k;
        const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
        uint8_t *w = malloc(wbytes);
        fill_blocks(t, w, wbytes);
        void *scratch = malloc(quant_matmul_scratch_bytes(t, 1, k));
        struct quant_ctx qc = {quant_impl_best(), t, y, x, w, scratch, 1, n, k, threads};
        struct read_ctx rc = {(const uint64_t *)w, wbytes / 8};
        const double tr = time_best(bn, run_read, &rc), tq = time_best(bn, run_quant, &qc);
        char extra[320] = "";
        time_others(qc.impl, run_quant, &qc, bn, extra, sizeof extra);
        if (quant_packable(t, n, k)) { /* decode's layout (quant_pack_rows8) */
            uint8_t *wp = malloc(quant_packed_bytes(t, n, k));
            quant_pack_rows8(t, wp, w, n, k);
            qc.impl = quant_impl_best(), qc.w = wp;
            const double tp = time_best(bn, run_quant_packed, &qc);
            const size_t used = strlen(extra);
            snprintf(extra + used, sizeof extra - used, " (packed %.1f us: %.2fx, kernel / read %.2f;", tp * 1e6,
                     tq / tp, tr / tp);
            time_others(qc.impl, run_quant_packed, &qc, bn, extra, sizeof extra);
            const size_t end = strlen(extra);
            snprintf(extra + end, sizeof extra - end, ")");
            free(wp);
        }
        printf("gemma lm_head   m=1   k=%-5lld n=%-6lld threads %d: %-5s %s %8.1f us%s %6.1f GB/s; plain "
               "read of %.0f MB %6.1f GB/s (1 thread); kernel / read %.2f\n", (long long)k, (long long)n,
               threads, quant_type_name(t), quant_impl_name(quant_impl_best()), tq * 1e6, extra,
               (double)wbytes / tq * 1e-9, (double)wbytes * 1e-6, (double)wbytes / tr * 1e-9, tr / tq);
        fflush(stdout);
        free(scratch);
        free(w);
    }
    free(y);
    free(x);
}

/* m one-row packed products (rows i .. i + 1 of x each), as the product ran m rows before packed8x4. */
static void run_packed_rows(void *p)
{
    struct quant_ctx *c = p;
    for (int64_t i = 0; i < c->m; i++)
        quant_matmul_packed_impl(c->impl, c->type, c->y + i * c->n, c->x + i * c->k, c->w, 1, c->n, c->k, c->scratch,
                                 c->threads);
}

static void bench_packed(const struct bench *bn)
{
    static const struct { const char *label; int64_t k, n; } shapes[] = {
        {"smollm2 ffn.up", 576, 1536}, {"smollm2 ffn.down", 1536, 576}, {"gemma ffn.up", 640, 2048},
        {"gemma ffn.down", 2048, 640},
    };
    static const enum quant_type pt[] = {QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1, QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1,
                                         QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q6_K};
    static const int64_t ms[] = {2, 3, 4, 5, 8, 16};
    printf("packed layout, one thread, %s: m rows in one call (packed8x4) against m one-row calls\n",
           quant_impl_name(quant_impl_best()));
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t ti = 0; ti < sizeof pt / sizeof pt[0]; ti++) {
            const enum quant_type t = pt[ti];
            const int64_t k = shapes[s].k, n = shapes[s].n;
            if (k % quant_block_size(t)) continue;
            const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
            uint8_t *w = malloc(wbytes), *wp = malloc(quant_packed_bytes(t, n, k));
            float *x = malloc((size_t)(16 * k) * sizeof(float)), *y = malloc((size_t)(16 * n) * sizeof(float));
            void *scratch = malloc(quant_matmul_scratch_bytes(t, 16, k));
            for (int64_t i = 0; i < 16 * k; i++) x[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f;
            fill_blocks(t, w, wbytes);
            quant_pack_rows8(t, wp, w, n, k);
            printf("  %-16s %-5s", shapes[s].label, quant_type_name(t));
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                struct quant_ctx qc = {quant_impl_best(), t, y, x, wp, scratch, ms[mi], n, k, 1};
                const double together = time_best(bn, run_quant_packed, &qc), apart = time_best(bn, run_packed_rows, &qc);
                printf("  m %-2lld %6.1f / %6.1f us %4.2fx", (long long)ms[mi], together * 1e6, apart * 1e6, apart / together);
            }
            printf("\n");
            fflush(stdout);
            free(scratch), free(y), free(x), free(wp), free(w);
        }
}

/* What a speculative verification row costs the LM head: Gemma 3 270M's Q8_0 head (640 x 262,144,
 * 178 MB: beyond every cache) packed, m = 1 .. 5, 8 and 16 rows in one call, at 1 and 2 threads; each
 * m's time as a multiple of m = 1's (a step verifying K drafts runs K + 1 rows; a decode step of a
 * batch one row a sequence). Where AMX is on, each m > 1 also on the int8 tiles (quant_amx.c). */
static void bench_verify(const struct bench *bn)
{
    const enum quant_type t = QUANT_TYPE_Q8_0;
    const int64_t k = 640, n = 262144;
    const size_t wbytes = (size_t)n * quant_row_bytes(t, k);
    uint8_t *w = malloc(wbytes), *wp = malloc(quant_packed_bytes(t, n, k));
    static const int64_t ms[] = {1, 2, 3, 4, 5, 8, 16};
    const int64_t mmax = 16;
    float *x = malloc((size_t)(mmax * k) * sizeof(float)), *y = malloc((size_t)(mmax * n) * sizeof(float));
    void *scratch = malloc(quant_matmul_scratch_bytes(t, mmax, k));
    if (!w || !wp || !x || !y || !scratch) {
        fprintf(stderr, "bench_verify: out of memory\n");
        free(scratch), free(y), free(x), free(wp), free(w);
        return;
    }
    for (int64_t i = 0; i < mmax * k; i++) x[i] = (float)((int)(rnd32() % 2001) - 1000) * 1e-3f;
    fill_blocks(t, w, wbytes);
    quant_pack_rows8(t, wp, w, n, k);
    free(w);
    const int amx = cpu_amx_enabled();
    printf("verification rows, gemma lm_head Q8_0 packed (k %lld, n %lld, %.0f MB), %s%s; each m's time as a multiple "
           "of m 1's:\n", (long long)k, (long long)n, (double)quant_packed_bytes(t, n, k) / 1e6,
           quant_impl_name(quant_impl_best()), amx ? ", the VNNI kernels then the AMX int8 tiles (quant_amx.c) in turn" : "");
    for (int threads = 1; threads <= 2; threads++) {
        double t1 = 0.0;
        printf("  threads %d:", threads);
        for (size_t im = 0; im < sizeof ms / sizeof *ms; im++) {
            const int64_t m = ms[im];
            struct quant_ctx qc = {quant_impl_best(), t, y, x, wp, scratch, m, n, k, threads};
            cpu_amx_set_enabled(0);
            const double tm = time_best(bn, run_quant_packed, &qc);
            cpu_amx_set_enabled(amx);
            if (m == 1) t1 = tm;
            printf("  m %lld %6.0f us (%.2fx)", (long long)m, tm * 1e6, tm / t1);
            if (amx && m > 1) {
                const double ta = time_best(bn, run_quant_packed, &qc);
                printf(" amx %6.0f us (%.2fx)", ta * 1e6, ta / t1);
            }
        }
        printf("\n");
        fflush(stdout);
    }
    free(scratch), free(y), free(x), free(wp);
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int lm_only = argc > 1 && !strcmp(argv[1], "--lm-head");
    int packed = argc > 1 && !strcmp(argv[1], "--packed");
    int verify = argc > 1 && !strcmp(argv[1], "--verify");
    if (argc > 1 && !quick && !lm_only && !packed && !verify) {
        fprintf(stderr, "usage: %s [--quick | --lm-head | --packed | --verify]\n", argv[0]);
        return 2;
    }
    struct bench bn = {quick ? 0.03 : 0.2, quick ? 20 : 2000};
    if (lm_only) {
        bench_lm_head(&bn, 1);
        return 0;
    }
    if (packed || verify) {
        char cpu[128];
        bench_cpu_model(cpu, sizeof cpu);
        printf("CPU: %s\n", cpu);
        if (packed) bench_packed(&bn);
        else bench_verify(&bn);
        return 0;
    }
    char cpu[128];
    bench_cpu_model(cpu, sizeof cpu);
    printf("quantized products (kernels/quant.h) on %s, best implementation here: %s; f32 baseline:\n"
           "the CPU backend's op_matmul on the dequantized weights. Times are the best of repetitions.\n\n",
           cpu, quant_impl_name(quant_impl_best()));
    bench_print_isa();
    static const struct { const char *label; int64_t k, n; } shapes[] = {
        {"gemma ffn.up", 640, 2048}, {"gemma ffn.down", 2048, 640}, {"gemma attn.q", 640, 1024},
    };
    for (int threads = 1; threads <= 2; threads++) {
        struct backend *b;
        if (backend_open(DEVICE_CPU, 0, threads, &b) != STATUS_OK) {
            fprintf(stderr, "bench_quant: cannot open the cpu backend: %s\n", status_message());
            return 1;
        }
        static const int64_t ms[] = {1, 4, 8, 16, 32, 64, 512};
        bench_lm_head(&bn, threads);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                bench_shape(&bn, b, shapes[s].label, ms[mi], shapes[s].k, shapes[s].n);
        backend_close(b);
    }
    return 0;
}
