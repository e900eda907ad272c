/* tests/bench_ops.c - throughput of the CPU backend's heavy ops, each next to a baseline
 * measured in the same run on the same machine:
 *   - op_matmul in GFLOP/s, against raw OpenBLAS cblas_sgemm on the same shape and buffers
 *     (f32, OpenBLAS's own threads; for one row also cblas_sgemv, which a library would call
 *     there), and op_matmul with bf16 storage (what half-precision weights cost on the CPU);
 *   - op_attention decode (one query row per sequence) in GB/s of K and V actually read,
 *     against memcpy bandwidth (one thread, and all threads over disjoint chunks).
 * Shapes: a Llama-7B-like layer (d_model 4096, ffn 11008, 32 heads of 128, GQA 32/8 for
 * attention) at m = 1 (decode) and m = 64 (prefill), and a small GPT-2-like model (d 768,
 * ffn 3072, 12 heads of 64).
 * Every figure is the best of several timed repetitions after a warm-up call.
 *
 * A benchmark, never a pass/fail gate: it exits 0 whatever the numbers are.
 * Not here: correctness (tests/test_ops.c), the CUDA backend (a GPU benchmark joins later).
 *
 * Run: bench_ops [--quick] [--threads N]   (about 30-60 s on 2 cores; --quick about 10 s) */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench_common.h"
#include "ops.h"

struct bench {
    struct backend *b;
    int             quick;
    double          min_time; /* seconds of timed repetitions per measurement */
    int             max_reps;
    double          memcpy_gbs_1;  /* one thread */
    double          memcpy_gbs_n;  /* all threads */
};

static double time_best(const struct bench *bn, void (*fn)(void *), void *ctx)
{
    return bench_time_best(bn->min_time, 2, bn->max_reps, fn, ctx);
}

/* ---- machine and memory bandwidth ------------------------------------------------------ */

static void print_machine(const struct bench *bn)
{
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("machine: nproc %ld, cpu %s\n", sysconf(_SC_NPROCESSORS_ONLN), model);
    bench_print_isa();
    printf("backend: %s, %d threads; %s (core %s)\n", bn->b->ops->name, bn->b->n_threads,
           openblas_get_config(), openblas_get_corename());
}

struct memcpy_ctx {
    char  *dst;
    const char *src;
    size_t n;
    int    threads;
};

static void run_memcpy(void *p)
{
    struct memcpy_ctx *c = p;
    if (c->threads <= 1) {
        memcpy(c->dst, c->src, c->n);
        return;
    }
#ifdef _OPENMP
    /* Disjoint contiguous chunks, one per thread: the best a copy loop can do on this box. */
    #pragma omp parallel num_threads(c->threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t chunk = (c->n / (size_t)nt + 4095) & ~(size_t)4095;
        size_t lo = (size_t)t * chunk, hi = lo + chunk < c->n ? lo + chunk : c->n;
        if (lo < hi) memcpy(c->dst + lo, c->src + lo, hi - lo);
    }
#else
    memcpy(c->dst, c->src, c->n);
#endif
}

/* memcpy bandwidth in GB/s, counted as bytes copied per second (each byte is read once and
 * written once, so the memory system moves twice that). */
static void bench_memcpy(struct bench *bn)
{
    size_t n = (size_t)(bn->quick ? 64 : 256) << 20;
    char *src = malloc(n), *dst = malloc(n);
    CHECK(src && dst, "out of memory for the memcpy buffers");
    memset(src, 1, n); /* touch every page before timing */
    memset(dst, 2, n);
    struct memcpy_ctx c = {dst, src, n, 1};
    double t1 = time_best(bn, run_memcpy, &c);
    c.threads = bn->b->n_threads;
    double tn = time_best(bn, run_memcpy, &c);
    /* Called twice (at the start and right before attention): keep the better of the two, so
     * that a noisy moment does not flatter the attention ratios. */
    double g1 = (double)n / t1 * 1e-9, gn = (double)n / tn * 1e-9;
    if (g1 > bn->memcpy_gbs_1) bn->memcpy_gbs_1 = g1;
    if (gn > bn->memcpy_gbs_n) bn->memcpy_gbs_n = gn;
    printf("memcpy %zu MiB: 1 thread %.1f GB/s, %d threads %.1f GB/s (bytes copied per second, "
           "best of several; ratios below use the best seen: %.1f and %.1f)\n\n", n >> 20, g1,
           c.threads, gn, bn->memcpy_gbs_1, bn->memcpy_gbs_n);
    free(src);
    free(dst);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

struct matmul_ctx {
    struct backend *b;
    struct tensor   y, x, w;
    int             m, k, n;
};

static void run_op_matmul(void *p)
{
    struct matmul_ctx *c = p;
    op_matmul(c->b, &c->y, &c->x, &c->w, NULL);
    backend_synchronize(c->b);
}

static void run_sgemm(void *p)
{
    struct matmul_ctx *c = p;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, c->m, c->n, c->k, 1.0f, c->x.data, c->k,
                c->w.data, c->k, 0.0f, c->y.data, c->n);
}

static void run_sgemv(void *p)
{
    struct matmul_ctx *c = p;
    cblas_sgemv(CblasRowMajor, CblasNoTrans, c->n, c->k, 1.0f, c->w.data, c->k, c->x.data, 1,
                0.0f, c->y.data, 1);
}

/* Times a raw OpenBLAS call with OpenBLAS's own thread pool at the backend's thread count, the
 * best raw OpenBLAS can do here, whatever the backend set (the CPU backend may run OpenBLAS
 * single-threaded inside its own threads); restores the setting afterwards. */
static double time_blas(const struct bench *bn, void (*fn)(void *), void *ctx)
{
    int saved = openblas_get_num_threads();
    openblas_set_num_threads(bn->b->n_threads);
    double t = time_best(bn, fn, ctx);
    openblas_set_num_threads(saved);
    return t;
}

/* y (m, n) = x (m, k) @ w (n, k)^T, as op_matmul f32, raw cblas_sgemm f32, and op_matmul bf16. */
static void bench_matmul(struct bench *bn, const char *label, int m, int k, int n)
{
    struct backend *b = bn->b;
    size_t nx = (size_t)m * k, nw = (size_t)n * k, ny = (size_t)m * n;
    struct matmul_ctx c = {.b = b, .m = m, .k = k, .n = n};
    float *x = bench_alloc_host(b, nx * 4), *w = bench_alloc_host(b, nw * 4), *y = bench_alloc_host(b, ny * 4);
    bench_fill_f32(x, nx, 1);
    bench_fill_f32(w, nw, 2);
    c.x = tensor_make(x, DTYPE_F32, DEVICE_CPU, 2, (int64_t)m, (int64_t)k);
    c.w = tensor_make(w, DTYPE_F32, DEVICE_CPU, 2, (int64_t)n, (int64_t)k);
    c.y = tensor_make(y, DTYPE_F32, DEVICE_CPU, 2, (int64_t)m, (int64_t)n);
    double flop = 2.0 * m * (double)k * n;
    double t_op = time_best(bn, run_op_matmul, &c);
    double t_blas = time_blas(bn, run_sgemm, &c);
    double t_gemv = m == 1 ? time_blas(bn, run_sgemv, &c) : 0.0;

    /* The same product with bf16 storage. */
    uint16_t *xh = bench_alloc_host(b, nx * 2), *wh = bench_alloc_host(b, nw * 2), *yh = bench_alloc_host(b, ny * 2);
    dtype_convert(xh, DTYPE_BF16, x, DTYPE_F32, nx);
    dtype_convert(wh, DTYPE_BF16, w, DTYPE_F32, nw);
    struct matmul_ctx ch = c;
    ch.x = tensor_make(xh, DTYPE_BF16, DEVICE_CPU, 2, (int64_t)m, (int64_t)k);
    ch.w = tensor_make(wh, DTYPE_BF16, DEVICE_CPU, 2, (int64_t)n, (int64_t)k);
    ch.y = tensor_make(yh, DTYPE_BF16, DEVICE_CPU, 2, (int64_t)m, (int64_t)n);
    /* bf16 w: AMX tiles where the CPU has them (w read in place), else widened blocks. */
    const int amx = cpu_amx_set_enabled(0);
    double t_bf16 = time_best(bn, run_op_matmul, &ch), t_amx = 0;
    if (amx) {
        cpu_amx_set_enabled(1);
        t_amx = time_best(bn, run_op_matmul, &ch);
    }

    double g_op = flop / t_op * 1e-9, g_blas = flop / t_blas * 1e-9, g_bf = flop / t_bf16 * 1e-9;
    char gemv[64] = "";
    if (m == 1)
        snprintf(gemv, sizeof gemv, "  (sgemv %6.1f, ratio %4.2f)", flop / t_gemv * 1e-9,
                 g_op / (flop / t_gemv * 1e-9));
    char amx_note[48] = "";
    if (amx) snprintf(amx_note, sizeof amx_note, "  bf16 on AMX %7.1f", flop / t_amx * 1e-9);
    printf("  %-18s m=%-3d k=%-5d n=%-5d  op f32 %6.1f  sgemm %6.1f  ratio %4.2f%s  | op bf16 "
           "%6.1f%s\n", label, m, k, n, g_op, g_blas, g_op / g_blas, gemv, g_bf, amx_note);
    fflush(stdout);
    backend_free(b, x);
    backend_free(b, w);
    backend_free(b, y);
    backend_free(b, xh);
    backend_free(b, wh);
    backend_free(b, yh);
}

/* ---- attention decode ------------------------------------------------------------------------ */

struct attn_ctx {
    struct backend        *b;
    struct tensor          out, q, kc, vc;
    struct attention_batch batch;
};

static void run_attention(void *p)
{
    struct attn_ctx *c = p;
    op_attention(c->b, &c->out, &c->q, &c->kc, &c->vc, &c->batch);
    backend_synchronize(c->b);
}

/* n_seqs decode rows, each over ctx cached tokens, in blocks of block_tokens scattered over the
 * pool in a shuffled order (as a long-running server's pool is). */
static void bench_attention(struct bench *bn, const char *label, enum dtype dt, int n_seqs,
                            int ctx, int n_heads, int n_kv, int hd, int bt)
{
    struct backend *b = bn->b;
    int per_seq = (ctx + bt - 1) / bt, n_blocks = n_seqs * per_seq;
    size_t es = dtype_size(dt), ncache = (size_t)n_blocks * bt * n_kv * hd;
    size_t nq = (size_t)n_seqs * n_heads * hd;
    float *tmp = malloc((ncache > nq ? ncache : nq) * sizeof(float));
    CHECK(tmp, "out of memory");
    void *kc = bench_alloc_host(b, ncache * es), *vc = bench_alloc_host(b, ncache * es);
    void *q = bench_alloc_host(b, nq * es), *out = bench_alloc_host(b, nq * es);
    bench_fill_f32(tmp, ncache, 3);
    dtype_convert(kc, dt, tmp, DTYPE_F32, ncache);
    bench_fill_f32(tmp, ncache, 4);
    dtype_convert(vc, dt, tmp, DTYPE_F32, ncache);
    bench_fill_f32(tmp, nq, 5);
    dtype_convert(q, dt, tmp, DTYPE_F32, nq);
    free(tmp);

    int32_t *q_start = bench_alloc_host(b, (size_t)(n_seqs + 1) * 4);
    int32_t *seq_len = bench_alloc_host(b, (size_t)n_seqs * 4);
    int32_t *table = bench_block_table(b, n_blocks, 1);
    for (int i = 0; i <= n_seqs; i++) q_start[i] = i;
    for (int i = 0; i < n_seqs; i++) seq_len[i] = ctx;

    struct attn_ctx c = {.b = b};
    c.q = tensor_make(q, dt, DEVICE_CPU, 3, (int64_t)n_seqs, (int64_t)n_heads, (int64_t)hd);
    c.out = tensor_make(out, dt, DEVICE_CPU, 3, (int64_t)n_seqs, (int64_t)n_heads, (int64_t)hd);
    c.kc = tensor_make(kc, dt, DEVICE_CPU, 4, (int64_t)n_blocks, (int64_t)bt, (int64_t)n_kv,
                       (int64_t)hd);
    c.vc = c.kc;
    c.vc.data = vc;
    c.batch = bench_attention_batch(n_seqs, bt, per_seq, q_start, seq_len, table, hd, 0);
    double t = time_best(bn, run_attention, &c);
    /* K and V rows of every attended position, once each: what a decode step must read. */
    double bytes = 2.0 * n_seqs * (double)ctx * n_kv * hd * (double)es;
    double gbs = bytes / t * 1e-9;
    printf("  %-18s %-4s %d seqs x %d ctx, heads %d/%d x %d, block_tokens %d: %7.3f ms, KV %6.1f "
           "MB, %6.1f GB/s = %.2f of memcpy (1 thread), %.2f of memcpy (%d threads)\n",
           label, dtype_name(dt), n_seqs, ctx, n_heads, n_kv, hd, bt, t * 1e3, bytes * 1e-6, gbs,
           gbs / bn->memcpy_gbs_1, gbs / bn->memcpy_gbs_n, b->n_threads);
    fflush(stdout);
    backend_free(b, kc);
    backend_free(b, vc);
    backend_free(b, q);
    backend_free(b, out);
    backend_free(b, q_start);
    backend_free(b, seq_len);
    backend_free(b, table);
}

int main(int argc, char **argv)
{
    int quick = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--threads N]\n", argv[0]);
            return 2;
        }
    }
    struct bench bn = {.quick = quick, .min_time = quick ? 0.05 : 0.5, .max_reps = quick ? 5 : 100};
    enum status st = backend_open(DEVICE_CPU, 0, threads, &bn.b);
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_ops: cannot open the cpu backend: %s\n", status_message());
        return 1;
    }
    double t0 = bench_now_s();
    print_machine(&bn);
    bench_memcpy(&bn);

    printf("matmul, GFLOP/s (y = x @ w^T; sgemm: raw cblas_sgemm on the same f32 buffers with\n"
           "OpenBLAS's own %d threads; ratio = op / sgemm; for m = 1 also raw cblas_sgemv):\n",
           bn.b->n_threads);
    bench_matmul(&bn, "llama7b attn.wo", 1, 4096, 4096);
    bench_matmul(&bn, "llama7b mlp.up", 1, 4096, 11008);
    bench_matmul(&bn, "llama7b mlp.down", 1, 11008, 4096);
    if (!quick) bench_matmul(&bn, "llama7b attn.wqkv", 1, 4096, 12288);
    bench_matmul(&bn, "llama7b attn.wo", 64, 4096, 4096);
    if (!quick) {
        bench_matmul(&bn, "llama7b mlp.up", 64, 4096, 11008);
        bench_matmul(&bn, "llama7b mlp.down", 64, 11008, 4096);
    }
    bench_matmul(&bn, "small attn.wqkv", 1, 768, 2304);
    bench_matmul(&bn, "small mlp.up", 1, 768, 3072);
    bench_matmul(&bn, "small mlp.down", 1, 3072, 768);
    bench_matmul(&bn, "small attn.wqkv", 64, 768, 2304);
    bench_matmul(&bn, "small mlp.up", 64, 768, 3072);
    bench_matmul(&bn, "small mlp.down", 64, 3072, 768);

    printf("\n");
    bench_memcpy(&bn);
    printf("attention decode (one query row per sequence; GB/s of K+V bytes read):\n");
    bench_attention(&bn, "llama7b gqa", DTYPE_F32, 8, 1024, 32, 8, 128, 16);
    bench_attention(&bn, "llama7b gqa", DTYPE_BF16, 8, 1024, 32, 8, 128, 16);
    if (!quick) bench_attention(&bn, "llama7b gqa long", DTYPE_F32, 4, 4096, 32, 8, 128, 16);
    bench_attention(&bn, "small mha", DTYPE_F32, 8, 1024, 12, 12, 64, 16);
    bench_attention(&bn, "small mha", DTYPE_BF16, 8, 1024, 12, 12, 64, 16);

    printf("\nbench_ops: %.1f s\n", bench_now_s() - t0);
    backend_close(bn.b);
    return 0;
}
