/* tests/bench_cuda.c - throughput of the CUDA backend's memory-bound ops, next to the device's
 * own copy bandwidth measured in the same run:
 *   - baseline: cudaMemcpyAsync device to device of 1 GiB, in GB/s of bytes read + written
 *     (and half of it, the read side alone);
 *   - op_attention decode (bf16, GQA 32 query heads / 8 KV heads, head_dim 128, block_tokens
 *     16; 1, 8 and 32 sequences of 4096 tokens, one new row each) in GB/s of K and V read, and
 *     that over the copy bandwidth, for both kernels (SHARDLM_CUDA_ATTENTION=simple and
 *     =split, one backend opened under each);
 *   - op_attention prefill (the same heads; 1 sequence of 2048 new rows, 8 of 256) in TFLOP/s of
 *     its causal products, the simple kernel against the tensor-core one (=tc);
 *   - op_matmul bf16 at m = 1, 4, 8 (the gemv kernel and cuBLAS) and 64 on the Llama-3.2-1B
 *     decode products (q/o, k/v, gate/up, down, the LM head), in GB/s
 *     of weights and TFLOP/s.
 * Successive calls rotate through at least 256 MiB of distinct KV blocks or weights (several
 * block tables over one pool; several weight copies), so that nothing is served from the L2
 * (50 MB on an H100). Times come from CUDA events around many back-to-back calls on the
 * backend's stream; each figure is the best of a few such runs.
 *
 * A benchmark, never a pass/fail gate: it exits 0 whatever the numbers are, and 77 with
 * "SKIP: no CUDA device" when the CUDA backend cannot be opened. It sets
 * SHARDLM_CUDA_ATTENTION itself (overriding the environment's).
 * Not here: correctness (tests/test_ops.c --backend cuda), the CPU backend (bench_ops.c).
 *
 * Run: bench_cuda [--quick] [--filter SUBSTR]   (well under 60 s on an H100) */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#define BENCH_CUDA_CHECK(call)                                                                  \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        CHECK(e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                     \
    } while (0)

#define MIB ((size_t)1 << 20)
#define ROTATE_BYTES (256 * MIB) /* distinct bytes successive calls cycle through, at least */

struct bench {
    struct backend *simple, *split, *tc; /* the same device, one backend per attention kernel */
    int             quick;
    const char     *filter;
    int             reps;       /* timed runs per figure; the best counts */
    double          run_time_s; /* seconds one timed run aims for */
    double          copy_gbs;   /* device-to-device copy, read + written */
};

static int bench_selected(const struct bench *bn, const char *name)
{
    return !bn->filter || strstr(name, bn->filter);
}

static void *bench_dev_alloc(struct backend *b, size_t nbytes)
{
    void *p = NULL;
    enum status st = backend_alloc(b, nbytes, &p);
    CHECK(st == STATUS_OK, "backend_alloc(%zu): %s", nbytes, status_message());
    return p;
}

/* bf16 bits of a cheap deterministic pattern in [-1, 1) (truncated f32). */
static void bench_fill_bf16(uint16_t *p, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float f = (float)(s >> 8) * 0x1p-23f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        p[i] = (uint16_t)(u >> 16);
    }
}

/* Fills nbytes of device memory with the bf16 pattern, through a 16 MiB host buffer. */
static void bench_dev_fill_bf16(struct backend *b, void *dst, size_t nbytes, uint32_t seed)
{
    const size_t chunk = 16 * MIB;
    uint16_t *host = malloc(chunk);
    CHECK(host, "out of host memory");
    bench_fill_bf16(host, chunk / 2, seed);
    for (size_t off = 0; off < nbytes; off += chunk)
        backend_upload(b, (char *)dst + off, host, nbytes - off < chunk ? nbytes - off : chunk);
    backend_synchronize(b);
    free(host);
}

/* Runs fn(ctx, i) for i = 0, 1, ... back to back on b's stream, between CUDA events: once to
 * warm up, once to size a run to about run_time_s, then bn->reps runs; returns the best
 * seconds per call. */
static double bench_time_calls(const struct bench *bn, struct backend *b,
                               void (*fn)(void *ctx, int i), void *ctx)
{
    cudaStream_t stream = (cudaStream_t)b->stream;
    cudaEvent_t start, stop;
    BENCH_CUDA_CHECK(cudaEventCreate(&start));
    BENCH_CUDA_CHECK(cudaEventCreate(&stop));
    int calls = 4, call = 0;
    double best = INFINITY;
    for (int rep = -1; rep < bn->reps; rep++) {
        BENCH_CUDA_CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < calls; i++) fn(ctx, call++);
        BENCH_CUDA_CHECK(cudaEventRecord(stop, stream));
        BENCH_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        const double per = 1e-3 * (double)ms / calls;
        if (rep < 0) { /* the warm-up run sizes the others */
            double want = bn->run_time_s / (per > 1e-7 ? per : 1e-7);
            calls = want < 4 ? 4 : want > 2000 ? 2000 : (int)want;
            continue;
        }
        if (per < best) best = per;
    }
    backend_synchronize(b); /* reports any fault of the calls */
    BENCH_CUDA_CHECK(cudaEventDestroy(start));
    BENCH_CUDA_CHECK(cudaEventDestroy(stop));
    return best;
}

/* ---- the baseline: device-to-device copy ------------------------------------------------- */

struct copy_ctx {
    struct backend *b;
    void           *dst, *src;
    size_t          nbytes;
};

static void copy_call(void *ctx, int i)
{
    struct copy_ctx *c = ctx;
    (void)i;
    BENCH_CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, c->nbytes, cudaMemcpyDeviceToDevice,
                                     (cudaStream_t)c->b->stream));
}

static void bench_copy(struct bench *bn)
{
    struct copy_ctx c = {.b = bn->split, .nbytes = 1024 * MIB};
    c.src = bench_dev_alloc(c.b, c.nbytes);
    c.dst = bench_dev_alloc(c.b, c.nbytes);
    bench_dev_fill_bf16(c.b, c.src, c.nbytes, 1);
    const double t = bench_time_calls(bn, c.b, copy_call, &c);
    bn->copy_gbs = 2.0 * (double)c.nbytes / t * 1e-9;
    printf("copy d2d 1 GiB            %8.3f ms   %7.1f GB/s read+written   %7.1f GB/s read\n",
           t * 1e3, bn->copy_gbs, bn->copy_gbs / 2);
    backend_free(c.b, c.src);
    backend_free(c.b, c.dst);
}

/* ---- decode attention --------------------------------------------------------------------- */

#define ATT_HEADS 32
#define ATT_KV_HEADS 8
#define ATT_HEAD_DIM 128
#define ATT_BLOCK_TOKENS 16
#define ATT_TOKENS 4096
#define ATT_MAX_SEQS 32
#define ATT_BLOCKS_PER_SEQ (ATT_TOKENS / ATT_BLOCK_TOKENS)

/* One pool of KV blocks for every case: the largest batch's blocks, at least ROTATE_BYTES of
 * K + V. A case of n sequences has pool / (n * ATT_BLOCKS_PER_SEQ) block tables ("copies"),
 * each over distinct blocks in a shuffled order, and call i uses copy i % copies. */
struct attention_ctx {
    struct backend *b;
    struct tensor   q, out, k_cache, v_cache;
    int32_t        *q_start, *seq_len, *tables; /* device */
    int             n_seqs, copies;
    struct attention_batch batch;
};

static void attention_call(void *ctx, int i)
{
    struct attention_ctx *c = ctx;
    struct attention_batch batch = c->batch;
    const int64_t per_copy = (int64_t)c->n_seqs * ATT_BLOCKS_PER_SEQ;
    batch.block_table = tensor_make(c->tables + (i % c->copies) * per_copy, DTYPE_I32,
                                    DEVICE_CUDA, 2, (int64_t)c->n_seqs,
                                    (int64_t)ATT_BLOCKS_PER_SEQ);
    op_attention(c->b, &c->out, &c->q, &c->k_cache, &c->v_cache, &batch);
}

static void prefill_call(void *ctx, int i)
{
    struct attention_ctx *c = ctx;
    (void)i;
    op_attention(c->b, &c->out, &c->q, &c->k_cache, &c->v_cache, &c->batch);
}

static void bench_attention(struct bench *bn)
{
    static const int seqs[] = {1, 8, 32};
    struct backend *b = bn->split;
    const size_t block_bytes = (size_t)ATT_BLOCK_TOKENS * ATT_KV_HEADS * ATT_HEAD_DIM * 2;
    int64_t n_blocks = (int64_t)ATT_MAX_SEQS * ATT_BLOCKS_PER_SEQ;
    while ((size_t)n_blocks * block_bytes * 2 < ROTATE_BYTES) n_blocks *= 2;
    const size_t pool_bytes = (size_t)n_blocks * block_bytes;
    void *k = bench_dev_alloc(b, pool_bytes), *v = bench_dev_alloc(b, pool_bytes);
    bench_dev_fill_bf16(b, k, pool_bytes, 2);
    bench_dev_fill_bf16(b, v, pool_bytes, 3);
    const size_t q_elems = (size_t)ATT_MAX_SEQS * ATT_HEADS * ATT_HEAD_DIM;
    void *q = bench_dev_alloc(b, q_elems * 2), *out = bench_dev_alloc(b, q_elems * 2);
    bench_dev_fill_bf16(b, q, q_elems * 2, 4);

    /* Every block of the pool once, shuffled; copy c of an n-sequence case takes the entries
     * from c * n * ATT_BLOCKS_PER_SEQ on. */
    int32_t *perm = malloc((size_t)n_blocks * sizeof(int32_t));
    int32_t *host_idx = malloc((ATT_MAX_SEQS + 1) * sizeof(int32_t) * 2);
    CHECK(perm && host_idx, "out of host memory");
    for (int64_t i = 0; i < n_blocks; i++) perm[i] = (int32_t)i;
    uint32_t s = 12345u;
    for (int64_t i = n_blocks - 1; i > 0; i--) {
        s = s * 1664525u + 1013904223u;
        int64_t j = (int64_t)((s >> 8) % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tables = bench_dev_alloc(b, (size_t)n_blocks * sizeof(int32_t));
    backend_upload(b, tables, perm, (size_t)n_blocks * sizeof(int32_t));
    int32_t *q_start_h = host_idx, *seq_len_h = host_idx + ATT_MAX_SEQS + 1;
    for (int i = 0; i <= ATT_MAX_SEQS; i++) q_start_h[i] = i;
    for (int i = 0; i < ATT_MAX_SEQS; i++) seq_len_h[i] = ATT_TOKENS;
    int32_t *q_start = bench_dev_alloc(b, (ATT_MAX_SEQS + 1) * sizeof(int32_t));
    int32_t *seq_len = bench_dev_alloc(b, ATT_MAX_SEQS * sizeof(int32_t));
    backend_upload(b, q_start, q_start_h, (ATT_MAX_SEQS + 1) * sizeof(int32_t));
    backend_upload(b, seq_len, seq_len_h, ATT_MAX_SEQS * sizeof(int32_t));
    backend_synchronize(b);

    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
        const int n = seqs[si];
        for (int mode = 0; mode < 2; mode++) {
            char name[96];
            snprintf(name, sizeof name, "attention decode %s %d x %d", mode ? "split" : "simple",
                     n, ATT_TOKENS);
            if (!bench_selected(bn, name)) continue;
            struct attention_ctx c = {
                .b = mode ? bn->split : bn->simple,
                .q = tensor_make(q, DTYPE_BF16, DEVICE_CUDA, 3, (int64_t)n, (int64_t)ATT_HEADS,
                                 (int64_t)ATT_HEAD_DIM),
                .out = tensor_make(out, DTYPE_BF16, DEVICE_CUDA, 3, (int64_t)n,
                                   (int64_t)ATT_HEADS, (int64_t)ATT_HEAD_DIM),
                .k_cache = tensor_make(k, DTYPE_BF16, DEVICE_CUDA, 4, n_blocks,
                                       (int64_t)ATT_BLOCK_TOKENS, (int64_t)ATT_KV_HEADS,
                                       (int64_t)ATT_HEAD_DIM),
                .v_cache = tensor_make(v, DTYPE_BF16, DEVICE_CUDA, 4, n_blocks,
                                       (int64_t)ATT_BLOCK_TOKENS, (int64_t)ATT_KV_HEADS,
                                       (int64_t)ATT_HEAD_DIM),
                .tables = tables,
                .n_seqs = n,
                .copies = (int)(n_blocks / ((int64_t)n * ATT_BLOCKS_PER_SEQ)),
                .batch = {
                    .n_seqs = n,
                    .block_tokens = ATT_BLOCK_TOKENS,
                    .max_blocks = ATT_BLOCKS_PER_SEQ,
                    .q_start = tensor_make(q_start, DTYPE_I32, DEVICE_CUDA, 1, (int64_t)n + 1),
                    .seq_len = tensor_make(seq_len, DTYPE_I32, DEVICE_CUDA, 1, (int64_t)n),
                    .scale = 1.0f / sqrtf((float)ATT_HEAD_DIM),
                    .decode_only = 1,
                },
            };
            const double t = bench_time_calls(bn, c.b, attention_call, &c);
            const double kv = (double)n * ATT_TOKENS * 2.0 * ATT_KV_HEADS * ATT_HEAD_DIM * 2.0;
            const double gbs = kv / t * 1e-9;
            printf("%-34s %8.1f us   %7.1f GB/s K+V   %5.1f %% of copy   (%d MiB rotated)\n",
                   name, t * 1e6, gbs, 100.0 * gbs / bn->copy_gbs,
                   (int)((size_t)c.copies * n * ATT_BLOCKS_PER_SEQ * block_bytes * 2 / MIB));
        }
    }
    free(perm);
    free(host_idx);
    backend_free(b, tables);
    backend_free(b, q_start);
    backend_free(b, seq_len);
    backend_free(b, q);
    backend_free(b, out);
    backend_free(b, k);
    backend_free(b, v);
}

/* ---- matmul ------------------------------------------------------------------------------- */

/* The decode step's products of a Llama-3.2-1B-shape model, (n, k) of w: q and o, k and v,
 * gate and up, down, the LM head. */
static const int mm_shapes[][2] = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};

struct matmul_ctx {
    struct backend *b;
    struct tensor   y, x;
    char           *w; /* copies of (n, k) bf16, back to back */
    int             copies, n, k;
};

static void matmul_call(void *ctx, int i)
{
    struct matmul_ctx *c = ctx;
    const size_t w_bytes = (size_t)c->n * c->k * 2;
    struct tensor w = tensor_make(c->w + (size_t)(i % c->copies) * w_bytes, DTYPE_BF16,
                                  DEVICE_CUDA, 2, (int64_t)c->n, (int64_t)c->k);
    op_matmul(c->b, &c->y, &c->x, &w, NULL);
}

/* Each shape at m = 1, 4, 8 (the decode products: matmul.cu's gemv kernel, and cuBLAS on the
 * backend opened with SHARDLM_CUDA_GEMV_ROWS=0) and m = 64 (cuBLAS). */
static void bench_matmul(struct bench *bn)
{
    static const int ms[] = {1, 4, 8, 64};
    for (size_t si = 0; si < sizeof mm_shapes / sizeof mm_shapes[0]; si++) {
        const int n = mm_shapes[si][0], k = mm_shapes[si][1];
        const size_t w_bytes = (size_t)n * k * 2;
        const int copies = (int)((ROTATE_BYTES + w_bytes - 1) / w_bytes);
        struct backend *b = bn->split;
        char *w = NULL;
        void *x = NULL, *y = NULL;
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (int kernel = 0; kernel < 2; kernel++) { /* 0: cuBLAS, 1: the default (gemv for m <= 8) */
                const int m = ms[mi];
                if (kernel == 1 && m > 8) continue; /* cuBLAS either way */
                char name[96];
                snprintf(name, sizeof name, "matmul bf16 m=%d k=%d n=%d %s", m, k, n,
                         kernel == 0 ? "cuBLAS" : "gemv");
                if (!bench_selected(bn, name)) continue;
                if (!w) {
                    w = bench_dev_alloc(b, (size_t)copies * w_bytes);
                    bench_dev_fill_bf16(b, w, (size_t)copies * w_bytes, 5);
                    x = bench_dev_alloc(b, (size_t)64 * k * 2);
                    y = bench_dev_alloc(b, (size_t)64 * n * 2);
                    bench_dev_fill_bf16(b, x, (size_t)64 * k * 2, 6);
                }
                struct matmul_ctx c = {
                    .b = kernel == 0 ? bn->simple : bn->split,
                    .y = tensor_make(y, DTYPE_BF16, DEVICE_CUDA, 2, (int64_t)m, (int64_t)n),
                    .x = tensor_make(x, DTYPE_BF16, DEVICE_CUDA, 2, (int64_t)m, (int64_t)k),
                    .w = w,
                    .copies = copies,
                    .n = n,
                    .k = k,
                };
                const double t = bench_time_calls(bn, c.b, matmul_call, &c);
                const double gbs = (double)w_bytes / t * 1e-9;
                printf("%-44s %8.1f us   %7.1f GB/s weights   %5.1f %% of copy   %6.2f TFLOP/s   "
                       "(%d MiB rotated)\n",
                       name, t * 1e6, gbs, 100.0 * gbs / bn->copy_gbs, 2.0 * m * k * n / t * 1e-12,
                       (int)((size_t)copies * w_bytes / MIB));
            }
        if (w) {
            backend_free(b, w);
            backend_free(b, x);
            backend_free(b, y);
        }
    }
}

/* ---- prefill attention --------------------------------------------------------------------- */

/* A fresh prefill of n sequences of `rows` tokens each (bf16, the decode case's heads), causal:
 * the simple kernel and the tensor-core one (SHARDLM_CUDA_ATTENTION=simple and =tc), in TFLOP/s
 * of the causal products (2 x 2 x head_dim per query head and attended key). Compute-bound: the
 * K and V of a case (at most 8 MiB) are not rotated. */
static void bench_prefill(struct bench *bn)
{
    static const int cases[][2] = {{1, 2048}, {8, 256}}; /* sequences, rows each */
    struct backend *b = bn->tc;
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int n = cases[ci][0], rows = cases[ci][1], nb = rows / ATT_BLOCK_TOKENS;
        const int64_t total = (int64_t)n * rows, n_blocks = (int64_t)n * nb;
        const size_t pool_bytes = (size_t)n_blocks * ATT_BLOCK_TOKENS * ATT_KV_HEADS * ATT_HEAD_DIM * 2;
        const size_t q_bytes = (size_t)total * ATT_HEADS * ATT_HEAD_DIM * 2;
        void *k = bench_dev_alloc(b, pool_bytes), *v = bench_dev_alloc(b, pool_bytes);
        void *q = bench_dev_alloc(b, q_bytes), *out = bench_dev_alloc(b, q_bytes);
        bench_dev_fill_bf16(b, k, pool_bytes, 5);
        bench_dev_fill_bf16(b, v, pool_bytes, 6);
        bench_dev_fill_bf16(b, q, q_bytes, 7);
        int32_t *h = malloc(sizeof(int32_t) * (size_t)(2 * n + 1 + n_blocks));
        CHECK(h, "out of host memory");
        for (int i = 0; i <= n; i++) h[i] = i * rows;                 /* q_start */
        for (int i = 0; i < n; i++) h[n + 1 + i] = rows;              /* seq_len */
        for (int64_t i = 0; i < n_blocks; i++) h[2 * n + 1 + i] = (int32_t)i; /* tables */
        int32_t *idx = bench_dev_alloc(b, sizeof(int32_t) * (size_t)(2 * n + 1 + n_blocks));
        backend_upload(b, idx, h, sizeof(int32_t) * (size_t)(2 * n + 1 + n_blocks));
        backend_synchronize(b);
        for (int mode = 0; mode < 2; mode++) {
            char name[96];
            snprintf(name, sizeof name, "attention prefill %s %d x %d", mode ? "tc" : "simple", n, rows);
            if (!bench_selected(bn, name)) continue;
            struct attention_ctx c = {
                .b = mode ? bn->tc : bn->simple,
                .q = tensor_make(q, DTYPE_BF16, DEVICE_CUDA, 3, total, (int64_t)ATT_HEADS, (int64_t)ATT_HEAD_DIM),
                .out = tensor_make(out, DTYPE_BF16, DEVICE_CUDA, 3, total, (int64_t)ATT_HEADS, (int64_t)ATT_HEAD_DIM),
                .k_cache = tensor_make(k, DTYPE_BF16, DEVICE_CUDA, 4, n_blocks, (int64_t)ATT_BLOCK_TOKENS,
                                       (int64_t)ATT_KV_HEADS, (int64_t)ATT_HEAD_DIM),
                .v_cache = tensor_make(v, DTYPE_BF16, DEVICE_CUDA, 4, n_blocks, (int64_t)ATT_BLOCK_TOKENS,
                                       (int64_t)ATT_KV_HEADS, (int64_t)ATT_HEAD_DIM),
                .n_seqs = n,
                .batch = {
                    .n_seqs = n,
                    .block_tokens = ATT_BLOCK_TOKENS,
                    .max_blocks = nb,
                    .q_start = tensor_make(idx, DTYPE_I32, DEVICE_CUDA, 1, (int64_t)n + 1),
                    .seq_len = tensor_make(idx + n + 1, DTYPE_I32, DEVICE_CUDA, 1, (int64_t)n),
                    .block_table = tensor_make(idx + 2 * n + 1, DTYPE_I32, DEVICE_CUDA, 2, (int64_t)n, (int64_t)nb),
                    .scale = 1.0f / sqrtf((float)ATT_HEAD_DIM),
                },
            };
            const double t = bench_time_calls(bn, c.b, prefill_call, &c);
            const double flops = 4.0 * ATT_HEAD_DIM * ATT_HEADS * (double)n * rows * (rows + 1) / 2.0;
            printf("%-34s %8.1f us   %7.1f TFLOP/s (causal products)\n", name, t * 1e6, flops / t * 1e-12);
        }
        free(h);
        backend_free(b, idx), backend_free(b, q), backend_free(b, out), backend_free(b, k), backend_free(b, v);
    }
}

/* ---- main --------------------------------------------------------------------------------- */

/* Opens the CUDA backend with SHARDLM_CUDA_ATTENTION=mode (read once, at open); cublas_only:
 * with SHARDLM_CUDA_GEMV_ROWS=0 (every product through cuBLAS), else as the environment says. */
static enum status bench_open(const char *mode, int cublas_only, struct backend **b)
{
    const char *env = getenv("SHARDLM_CUDA_GEMV_ROWS");
    char *saved = env ? strdup(env) : NULL;
    setenv("SHARDLM_CUDA_ATTENTION", mode, 1);
    if (cublas_only) setenv("SHARDLM_CUDA_GEMV_ROWS", "0", 1);
    enum status st = backend_open(DEVICE_CUDA, 0, 0, b);
    if (saved) setenv("SHARDLM_CUDA_GEMV_ROWS", saved, 1);
    else unsetenv("SHARDLM_CUDA_GEMV_ROWS");
    free(saved);
    return st;
}

int main(int argc, char **argv)
{
    struct bench bn = {0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) bn.quick = 1;
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) bn.filter = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--filter SUBSTR]\n", argv[0]);
            return 2;
        }
    }
    bn.reps = bn.quick ? 2 : 5;
    bn.run_time_s = bn.quick ? 0.02 : 0.1;
    /* The simple-attention backend also runs every product through cuBLAS (the matmul rows
     * named cuBLAS); the split one is the default otherwise. */
    if (bench_open("simple", 1, &bn.simple) != STATUS_OK || bench_open("split", 0, &bn.split) != STATUS_OK ||
        bench_open("tc", 0, &bn.tc) != STATUS_OK) {
        printf("SKIP: no CUDA device (%s)\n", status_message());
        backend_close(bn.simple);
        backend_close(bn.split);
        return 77;
    }
    struct cudaDeviceProp prop;
    BENCH_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("bench_cuda: %s (%d SMs, %.0f MiB L2, %.1f GiB)%s\n", prop.name,
           prop.multiProcessorCount, prop.l2CacheSize / 1048576.0,
           (double)prop.totalGlobalMem / (1 << 30), bn.quick ? ", quick" : "");

    bench_copy(&bn); /* always: the other figures are given against it */
    bench_attention(&bn);
    bench_prefill(&bn);
    bench_matmul(&bn);

    backend_close(bn.simple);
    backend_close(bn.split);
    backend_close(bn.tc);
    return 0;
}
