/* kernels/cpu/matmul.c - op_matmul and op_matmul_backward on the CPU through OpenBLAS, and the
 * threaded f32 products cross_entropy.c shares (cpu_gemm_*).
 * One thread pool serves the whole backend: OpenBLAS runs single-threaded inside each OpenMP
 * thread, and the output columns (rows of w) are split across the threads. Two pools (OpenMP
 * for the other ops, OpenBLAS's pthreads here) fight for the cores: OpenMP workers spin after
 * each region while OpenBLAS needs them, which was measured at 60x slower decode on 2 cores.
 * f32 multiplies the tensors in place (cpu_gemv_rows, gemv.c, for one row; sgemm otherwise);
 * bf16/f16 widen x once and blocks of w per thread into the scratch arena, multiply in f32, and
 * round y once (one row of x reads them in place through the gemv where it can);
 * block-quantized w (DTYPE_Q*) goes to quant_matmul (kernels/quant.h) with x's int8 copy in the
 * scratch arena below QUANT_SGEMM_MIN_M rows (at any row count with batch_invariant: the two
 * paths round differently; and for weights packed eight rows at a time, tensor_packed, on CPUs
 * with VNNI), else to dequantized tiles (f32 + sgemm; packed weights are dequantized from the
 * packed copy). On CPUs
 * with AMX, bf16 w and block w from QUANT_AMX_MIN_M rows take the bf16 tiles (amx.c), packed
 * block w that the int8 products take at every row count only from QUANT_AMX_PACKED_MIN_M (below
 * it the int8 products of the 32-element types run on the int8 tiles themselves: quant_amx.c).
 * The backward converts dy and x to f32 once, and w and a half-precision dw a block of rows at a
 * time, so that scratch never holds a whole weight.
 * Tests: tests/test_ops.c (matmul cases), tests/test_ops_backward.c (matmul_backward cases),
 * tests/test_quant.c (quantized w through op_matmul equals quant_matmul);
 * benchmark: tests/bench_ops.c. */
#include <cblas.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_isa.h"
#include "cpu_ops.h"
#include "quant.h"

/* Rows of w widened per block in the bf16/f16 path: bounds scratch at W_BLOCK * k floats per
 * thread. */
#define W_BLOCK 256
/* Block-quantized w: from this many rows of x on, tiles of QUANT_W_BLOCK rows of w are
 * dequantized to f32 and multiplied by OpenBLAS's register-tiled sgemm; below it, int8 dot
 * products per (row of x, row of w) (quant_matmul) win. Measured by tests/bench_quant.c.
 * cpu_quant_sgemm_min_m: this, or SHARDLM_CPU_QUANT_SGEMM_MIN_M=N. Weights packed eight rows at
 * a time on a CPU with VNNI take the int8 products at every row count instead (knobs.int8_packed
 * below: x rounded to int8 at prefill too, as llama.cpp does), unless that variable is set; the
 * goldens of the f32 prefill bound set it to 32. */
#define QUANT_SGEMM_MIN_M 32
/* The same on AMX tiles (amx.c): from 8 rows (a decode batch of 8 sequences included) the
 * tiles beat the int8 dot products (bench_quant, 2026-11-25: Gemma's ffn.down at one thread,
 * m 4: 232 us against 205; m 8: 231 against 410; m 64: 363 against 1394 for f32 tiles). */
#define QUANT_AMX_MIN_M 8
/* Weights packed eight rows at a time (tensor_packed) where the int8 products take them at every
 * row count (knobs.int8_packed): the tiles only from this many rows, since the four-row packed
 * VNNI kernels beat the tiles below it (cpu_quant_amx_packed_min_m: this, or
 * SHARDLM_CPU_AMX_PACKED_MIN_M=N). */
#define QUANT_AMX_PACKED_MIN_M 96
#define QUANT_W_BLOCK 256
/* Below this many multiply-adds one thread does the whole product. */
#define MATMUL_PARALLEL_MIN (1 << 18)

static void add_bias(float *y, const struct tensor *bias, int64_t m, int64_t n)
{
    float tmp[4096];
    for (int64_t j0 = 0; j0 < n; j0 += 4096) {
        size_t len = (size_t)(n - j0 < 4096 ? n - j0 : 4096);
        const float *bp = cpu_load_row(bias, (size_t)j0, len, tmp);
        for (int64_t i = 0; i < m; i++) {
            float *yr = y + (size_t)(i * n + j0);
            for (size_t j = 0; j < len; j++) yr[j] += bp[j];
        }
    }
}

/* The tuning knobs read from the environment once (the first product), both logged by the CPU
 * backend's start line:
 * - rows per pass over x of the AVX2 / AVX-512 gemv: 8 (gemv_rows_body) or 1 (gemv_row1_*).
 *   SHARDLM_CPU_GEMV_ROWS=1|8 forces either; by default 1 on AMD CPUs and 8 elsewhere: each was
 *   faster on the machine it was measured on (eight rows on the Intel Xeon of 2026-11-25, one row
 *   on the AMD EPYC of 2026-11-30; docs/performance.md), neither was measured on both;
 * - the vector width of that gemv on AVX-512 CPUs: 512 bits (gemv_*_avx512) or 256 (gemv_*_avx2).
 *   SHARDLM_CPU_GEMV_BITS=256|512 forces either; by default 256 on AMD CPUs and 512 elsewhere: on
 *   the AMD EPYC Zen 4 of 2026-12-03 the one-row product streamed a stories110M token's 418 MiB of
 *   f32 weights 1.15-1.4x faster with 256-bit loads and four accumulators than with 512-bit ones
 *   (29.5 against 24.8 GB/s at one thread, 46-51 against 34-37 at two: a standalone copy of both
 *   kernels, alternating in one process, best of 30, six runs); the Intel Xeons' figures were
 *   measured with 512 bits, 256 was not tried there;
 * - the row count from which block weights take the f32 tiles (QUANT_SGEMM_MIN_M, or
 *   SHARDLM_CPU_QUANT_SGEMM_MIN_M=N);
 * - int8_packed: weights packed eight rows at a time take the int8 products at every row count
 *   where the CPU has SIMD int8 products (AVX2 and up) and SHARDLM_CPU_QUANT_SGEMM_MIN_M is not
 *   set: the four-row packed kernels prefill 1.3x faster than the f32 tiles with VNNI
 *   (2026-11-30) and, forced to AVX2 on the same AMD Zen 4, 1.32x (2026-12-01; OpenBLAS's tiles
 *   still on AVX-512 there: docs/quantization.md), and a row's logits no longer depend on how
 *   many rows its step holds. */
static struct {
    int gemv_rows, gemv_bits, quant_sgemm_min, int8_packed, amx_packed_min, bf16_dot_allowed, bf16_dot;
} knobs = {8, 512, QUANT_SGEMM_MIN_M, 0, QUANT_AMX_PACKED_MIN_M, 0, 0};
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;

/* A row count >= 1 from the environment variable name, else fallback (a warning when set). */
static int env_rows(const char *name, int fallback, int *set)
{
    const char *e = getenv(name);
    if (!e || !*e) return fallback;
    char *end = NULL;
    const long v = strtol(e, &end, 10);
    if (*end || v < 1) {
        LOG_WARN("cpu", "%s=%s is not a row count >= 1: ignored", name, e);
        return fallback;
    }
    if (set) *set = 1;
    return v > INT_MAX ? INT_MAX : (int)v;
}

static void knobs_init(void)
{
    const char *e = getenv("SHARDLM_CPU_GEMV_ROWS");
    knobs.gemv_rows = cpu_isa_amd() ? 1 : 8;
    if (e && *e) {
        if (!strcmp(e, "1") || !strcmp(e, "8")) knobs.gemv_rows = atoi(e);
        else LOG_WARN("cpu", "SHARDLM_CPU_GEMV_ROWS=%s is not 1 or 8: ignored", e);
    }
    e = getenv("SHARDLM_CPU_GEMV_BITS");
    knobs.gemv_bits = cpu_isa_amd() ? 256 : 512;
    if (e && *e) {
        if (!strcmp(e, "256") || !strcmp(e, "512")) knobs.gemv_bits = atoi(e);
        else LOG_WARN("cpu", "SHARDLM_CPU_GEMV_BITS=%s is not 256 or 512: ignored", e);
    }
    e = getenv("SHARDLM_CPU_BF16_DOT");
    knobs.bf16_dot_allowed = cpu_bf16_dot_supported() && !(e && (!strcmp(e, "0") || !strcmp(e, "off")));
    knobs.bf16_dot = knobs.bf16_dot_allowed;
    int min_m_set = 0;
    knobs.quant_sgemm_min = env_rows("SHARDLM_CPU_QUANT_SGEMM_MIN_M", QUANT_SGEMM_MIN_M, &min_m_set);
    knobs.amx_packed_min = env_rows("SHARDLM_CPU_AMX_PACKED_MIN_M", QUANT_AMX_PACKED_MIN_M, NULL);
    const enum quant_impl best = quant_impl_best();
    knobs.int8_packed = !min_m_set && best != QUANT_IMPL_SCALAR;
}

int cpu_gemv_rows_per_pass(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.gemv_rows;
}

int cpu_gemv_bits(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.gemv_bits;
}

int cpu_bf16_dot_enabled(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.bf16_dot;
}

int cpu_bf16_dot_set_enabled(int on)
{
    pthread_once(&knobs_once, knobs_init);
    const int was = knobs.bf16_dot;
    knobs.bf16_dot = on && knobs.bf16_dot_allowed;
    return was;
}

int cpu_quant_sgemm_min_m(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.quant_sgemm_min;
}

int cpu_quant_int8_packed(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.int8_packed;
}

int cpu_quant_amx_packed_min_m(void)
{
    pthread_once(&knobs_once, knobs_init);
    return knobs.amx_packed_min;
}

/* Whether a block w with m rows of x takes the int8 products (else the tiles), the knobs read once. */
static int quant_takes_int8(const struct tensor *w, int64_t m)
{
    pthread_once(&knobs_once, knobs_init);
    return m < knobs.quant_sgemm_min || (knobs.int8_packed && tensor_packed(w));
}

/* y_cols (m rows of nb, leading dimension n) = x (m, k) @ w_rows (nb, k)^T, all f32. */
/* y's columns of w_rows: one row by cpu_gemv_rows (its sums vectorised along k), several by sgemm.
 * invariant (batch_invariant, ops.h): every row by cpu_gemv_rows, one after the other over the same
 * block of w (still in cache), so that a row's sums are formed in the same order whatever m is.
 * sgemm cannot promise that: OpenBLAS 0.3 (Debian's, Zen kernels) gives a row different last
 * bits depending on how many rows the call has, at every size tried (k 64 to 768, m 1 to 200;
 * tests/server/test_determinism.py found it as different log-probabilities). */
static void gemm_cols(float *y_cols, const float *x, const float *w_rows, int64_t m, int64_t n,
                      int64_t k, int64_t nb, int invariant)
{
    if (m == 1 || invariant)
        for (int64_t i = 0; i < m; i++) cpu_gemv_rows(y_cols + i * n, w_rows, x + i * k, nb, k);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nb, (int)k, 1.0f, x,
                    (int)k, w_rows, (int)k, 0.0f, y_cols, (int)n);
}

/* Rows j0 .. j0 + nb of w (n, k) in f32 at wf (nb, k): half precision widened, blocks
 * dequantized (bit-exact with ggml's dequantizers). */
static void widen_rows(float *wf, const struct tensor *w, int64_t j0, int64_t nb, int64_t k)
{
    if (dtype_is_quant(w->dtype)) {
        const enum quant_type qt = (enum quant_type)dtype_quant_type(w->dtype);
        const size_t row = quant_row_bytes(qt, k);
        const void *packed = tensor_packed(w); /* read what decode reads: the stored rows stay cold */
        if (packed) quant_dequantize_rows_packed(qt, packed, j0, nb, wf, k);
        else
            for (int64_t i = 0; i < nb; i++)
                quant_dequantize_row(qt, (const char *)w->data + (size_t)(j0 + i) * row, wf + i * k, k);
    } else {
        dtype_convert(wf, DTYPE_F32, (const char *)w->data + (size_t)(j0 * k) * dtype_size(w->dtype),
                      w->dtype, (size_t)(nb * k));
    }
}

/* y (m, n) f32 = x (m, k) f32 @ w^T (+ bias) with w as ggml blocks and fewer than
 * QUANT_SGEMM_MIN_M rows: quant_matmul's int8 dot products. Its int8 copy of x lives in the
 * scratch arena, which is sized once for the largest call, so serving allocates nothing per
 * step; quant_matmul threads over w's rows itself. */
static void matmul_quant(struct backend *b, const struct tensor *y, const struct tensor *x,
                         const struct tensor *w, const struct tensor *bias, int64_t m, int64_t n,
                         int64_t k)
{
    const enum quant_type qt = (enum quant_type)dtype_quant_type(w->dtype);
    const size_t floats = (quant_matmul_scratch_bytes(qt, m, k) + sizeof(float) - 1) / sizeof(float);
    void *scratch = cpu_scratch(b, (floats + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    const void *packed = tensor_packed(w);
    if (packed) quant_matmul_packed(qt, y->data, x->data, packed, m, n, k, scratch, b->n_threads);
    else quant_matmul(qt, y->data, x->data, w->data, m, n, k, scratch, b->n_threads);
    if (bias) add_bias(y->data, bias, m, n);
}

/* AMX tiles take bf16 w and block w (dequantized), with k a multiple of their 32-wide chunks;
 * block w only from QUANT_AMX_MIN_M rows of x (the int8 products win below), packed block w
 * taken by the int8 products at every row count only from knobs.amx_packed_min rows. */
static int matmul_amx_fits(const struct tensor *w, int64_t m, int64_t k)
{
    if (k == 0 || k % 32 || !cpu_amx_enabled()) return 0;
    if (w->dtype == DTYPE_BF16) return 1;
    if (!dtype_is_quant(w->dtype)) return 0;
    pthread_once(&knobs_once, knobs_init);
    const int packed_int8 = knobs.int8_packed && tensor_packed(w);
    return m >= (packed_int8 ? knobs.amx_packed_min : QUANT_AMX_MIN_M);
}

/* Rows of a packed block w dequantized together before their rounding to bf16 (one group). */
#define AMX_DQ_ROWS 8

/* The AMX product: x packed into xv (groups of 16 rows spread over the threads), then per block
 * of w's rows: bf16 w in place where 16-row groups stay inside w, otherwise the rows rounded
 * (dequantized first for blocks) into the thread's wb with zero rows up to the next 16. */
static void matmul_amx(float *yf, const float *xf, uint16_t *xv, float *w_all,
                       size_t ws, const struct tensor *w, int64_t m, int64_t n, int64_t k,
                       int64_t w_block, int nt)
{
    const int64_t groups = (m + 15) / 16, wrows = (w_block + 15) / 16 * 16;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && groups > 1)
    for (int64_t h = 0; h < groups; h++) {
        uint16_t *tmp = (uint16_t *)(w_all + (size_t)omp_get_thread_num() * ws);
        cpu_amx_pack_x(xv, xf, m, k, h, tmp);
    }
    const enum quant_type qt = dtype_is_quant(w->dtype) ? (enum quant_type)dtype_quant_type(w->dtype) : (enum quant_type)0;
    const size_t row_bytes = dtype_is_quant(w->dtype) ? quant_row_bytes(qt, k) : (size_t)k * 2;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t j0 = 0; j0 < n; j0 += w_block) {
        uint16_t *wb = (uint16_t *)(w_all + (size_t)omp_get_thread_num() * ws);
        float *row = (float *)(wb + (size_t)wrows * (size_t)k);
        const int64_t nb = n - j0 < w_block ? n - j0 : w_block, padded = (nb + 15) / 16 * 16;
        const char *src = (const char *)w->data + (size_t)j0 * row_bytes;
        const uint16_t *wp = wb;
        if (w->dtype == DTYPE_BF16 && j0 + padded <= n) {
            wp = (const uint16_t *)src;
        } else {
            for (int64_t i = 0; i < nb; i++) {
                if (w->dtype == DTYPE_BF16) {
                    memcpy(wb + i * k, src + (size_t)i * row_bytes, row_bytes);
                } else if (tensor_packed(w)) {
                    /* Eight rows (a packed group) dequantized at once, each rounded in turn. */
                    if (i % AMX_DQ_ROWS == 0)
                        quant_dequantize_rows_packed(qt, tensor_packed(w), j0 + i, nb - i < AMX_DQ_ROWS ? nb - i : AMX_DQ_ROWS,
                                                     row, k);
                    cpu_amx_round_rows(wb + i * k, row + (i % AMX_DQ_ROWS) * k, k);
                } else {
                    quant_dequantize_row(qt, src + (size_t)i * row_bytes, row, k);
                    cpu_amx_round_rows(wb + i * k, row, k);
                }
            }
            memset(wb + nb * k, 0, (size_t)((padded - nb) * k) * sizeof *wb);
        }
        cpu_amx_gemm(yf + j0, n, xv, wp, k, m, nb, k);
    }
}

void cpu_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                const struct tensor *w, const struct tensor *bias)
{
    const int64_t m = tensor_rows(x), k = tensor_cols(x), n = w->shape[0];
    if (m == 0 || n == 0) return;
    const int invariant = b->batch_invariant || b->rows_as_decode;
    if (dtype_is_quant(w->dtype) && (invariant || (!matmul_amx_fits(w, m, k) && quant_takes_int8(w, m)))) {
        matmul_quant(b, y, x, w, bias, m, n, k);
        return;
    }
    const int nt = m * n * k >= MATMUL_PARALLEL_MIN ? b->n_threads : 1;

    if (w->dtype == DTYPE_F32) {
        float *yf = y->data;
        if (k == 0) {
            memset(yf, 0, tensor_nbytes(y));
        } else {
            /* Column slices rounded to 16 keep each thread's stores on its own cache lines. */
            const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
            #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
            for (int64_t j0 = 0; j0 < n; j0 += per)
                gemm_cols(yf + j0, x->data, (const float *)w->data + j0 * k, m, n, k,
                          n - j0 < per ? n - j0 : per, invariant);
        }
        if (bias) add_bias(yf, bias, m, n);
        return;
    }

    /* Half-precision or block w (and x, y in any float dtype): x (m, k) | y (m, n) in f32 where
     * they are not f32 already, then a block of w (w_block, k) per thread, widened to f32, all
     * carved from one scratch request. On AMX the block goes to bf16 instead (bf16 w is read
     * in place) and x is packed for the tiles once. */
    /* Each thread's equal share of w's rows cut into equal blocks of at most w_block_max, so
     * that the static schedule gives every thread the same rows: Gemma's O and DOWN (640 rows)
     * in blocks of 256 went 512 / 128 rows on two threads, a speed-up of 1.25 (bench_quant,
     * 2026-11-25); blocks of 160 are 320 / 320. */
    const int amx = matmul_amx_fits(w, m, k);
    /* Rows of x against bf16 w on AVX512-BF16 without the tiles: vdpbf16ps (bf16_dot.c), the
     * tiles' numbers; not for one row or batch-invariant steps (the gemv reads w in place). */
    const int bf16dot = !amx && !invariant && m > 1 && w->dtype == DTYPE_BF16 && cpu_bf16_dot_enabled();
    const int64_t w_block_max = dtype_is_quant(w->dtype) ? QUANT_W_BLOCK : W_BLOCK;
    const int64_t share = ((n + nt - 1) / nt + 15) / 16 * 16, per_share = (share + w_block_max - 1) / w_block_max;
    const int64_t w_block = ((share + per_share - 1) / per_share + 15) / 16 * 16;
    const size_t xs = x->dtype == DTYPE_F32 ? 0 : (size_t)(m * k);
    const size_t ys = y->dtype == DTYPE_F32 ? 0 : (size_t)(m * n);
    /* Per thread: f32 rows, or bf16 rows (padded to 16) and AMX_DQ_ROWS f32 rows; shared: packed x. */
    const size_t ws = amx ? (size_t)((w_block + 15) / 16 * 16) * (size_t)k / 2 + (size_t)AMX_DQ_ROWS * (size_t)k
                          : (size_t)w_block * (size_t)k;
    const size_t xv = amx ? cpu_amx_x_elems(m, k) / 2 : bf16dot ? (cpu_bf16_dot_x_elems(m, k) + 1) / 2 : 0;
    const size_t total = xs + ys + xv + (size_t)b->n_threads * ws;
    float *scratch = cpu_scratch(b, (total + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    float *xf = xs ? scratch : x->data, *yf = ys ? scratch + xs : y->data;
    float *wf_all = scratch + xs + ys + xv;
    if (xs) dtype_convert(xf, DTYPE_F32, x->data, x->dtype, xs);
    if (k == 0) memset(yf, 0, (size_t)(m * n) * sizeof(float));
    if (amx) {
        matmul_amx(yf, xf, (uint16_t *)(scratch + xs + ys), wf_all, ws, w, m, n, k, w_block, nt);
    } else if (bf16dot) {
        uint16_t *xb = (uint16_t *)(scratch + xs + ys);
        cpu_bf16_dot_round_x(xb, xf, m, k);
        #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
        for (int64_t j0 = 0; j0 < n; j0 += w_block) {
            uint16_t *wp = (uint16_t *)(wf_all + (size_t)omp_get_thread_num() * ws);
            const int64_t nb = n - j0 < w_block ? n - j0 : w_block;
            cpu_bf16_dot_pack_w(wp, (const uint16_t *)w->data + (size_t)(j0 * k), k, nb, k);
            cpu_bf16_dot_gemm(yf + j0, n, xb, wp, m, nb, k);
        }
    } else {
        /* One row of x (decode) against bf16 / f16 w: the gemv reads w in place (the same sums
         * as widening it first; tests/test_matmul_half.c). */
        const int in_place = m == 1 && !dtype_is_quant(w->dtype) && cpu_gemv_reads(w->dtype);
        #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && k > 0)
        for (int64_t j0 = 0; j0 < (k > 0 ? n : 0); j0 += w_block) {
            float *wf = wf_all + (size_t)omp_get_thread_num() * ws;
            int64_t nb = n - j0 < w_block ? n - j0 : w_block;
            if (in_place) {
                cpu_gemv_rows_typed(yf + j0, (const char *)w->data + (size_t)(j0 * k) * dtype_size(w->dtype), w->dtype,
                                    xf, nb, k, wf);
            } else {
                widen_rows(wf, w, j0, nb, k);
                gemm_cols(yf + j0, xf, wf, m, n, k, nb, invariant);
            }
        }
    }
    if (bias) add_bias(yf, bias, m, n);
    if (ys) dtype_convert(y->data, y->dtype, yf, DTYPE_F32, ys);
}

/* ---- the threaded f32 products --------------------------------------------------------- */

/* Slices of `total` for nt threads, rounded to 16 so that each thread's stores stay on its own
 * cache lines. */
static int64_t gemm_slice(int64_t total, int nt) { return ((total + nt - 1) / nt + 15) / 16 * 16; }

static int gemm_threads(struct backend *b, int64_t m, int64_t n, int64_t k)
{
    return m * n * k >= MATMUL_PARALLEL_MIN ? b->n_threads : 1;
}

/* c (m, n) = beta c for an empty sum (k = 0), where BLAS wants leading dimensions >= 1. */
static void gemm_empty(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

/* c (m, n) = beta c + op(a) @ op(b) through OpenBLAS inside our OpenMP team: with op(a) = a
 * the threads take slices of c's columns, with op(a) = a^T (a (k, m)) slices of its rows. */
static void gemm_sliced(struct backend *b, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n,
                        int64_t k, const float *a, int64_t lda, const float *bm, int64_t ldb, float beta,
                        float *c, int64_t ldc)
{
    if (m == 0 || n == 0) return;
    if (k == 0) {
        gemm_empty(m, n, beta, c, ldc);
        return;
    }
    const int nt = gemm_threads(b, m, n, k);
    const int by_rows = ta == CblasTrans;
    const int64_t total = by_rows ? m : n, per = gemm_slice(total, nt);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t s0 = 0; s0 < total; s0 += per) {
        const int64_t len = total - s0 < per ? total - s0 : per;
        if (by_rows) /* rows s0.. of c: columns s0.. of a (k, m) */
            cblas_sgemm(CblasRowMajor, ta, tb, (int)len, (int)n, (int)k, 1.0f, a + s0, (int)lda, bm, (int)ldb, beta,
                        c + s0 * ldc, (int)ldc);
        else /* columns s0.. of c: rows s0.. of b (n, k), or its columns s0.. (k, n) */
            cblas_sgemm(CblasRowMajor, ta, tb, (int)m, (int)len, (int)k, 1.0f, a, (int)lda,
                        bm + (tb == CblasTrans ? s0 * ldb : s0), (int)ldb, beta, c + s0, (int)ldc);
    }
}

void cpu_gemm_nt(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc)
{
    gemm_sliced(b, CblasNoTrans, CblasTrans, m, n, k, a, lda, bm, ldb, beta, c, ldc);
}

void cpu_gemm_nn(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc)
{
    gemm_sliced(b, CblasNoTrans, CblasNoTrans, m, n, k, a, lda, bm, ldb, beta, c, ldc);
}

void cpu_gemm_tn(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc)
{
    gemm_sliced(b, CblasTrans, CblasNoTrans, m, n, k, a, lda, bm, ldb, beta, c, ldc);
}

/* ---- backward ------------------------------------------------------------------------------ */

/* Rows of w (and of a half-precision dw) widened to f32 per block in the backward. */
#define BACKWARD_BLOCK 512

void cpu_rows_to_f32(struct backend *b, float *dst, const struct tensor *t, int64_t r0,
                        int64_t nr, int64_t cols)
{
    const size_t es = dtype_size(t->dtype);
    #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (nr * cols > CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < nr; i++)
        dtype_convert(dst + i * cols, DTYPE_F32, (const char *)t->data + (size_t)((r0 + i) * cols) * es,
                      t->dtype, (size_t)cols);
}

void cpu_rows_from_f32(struct backend *b, const struct tensor *t, const float *src, int64_t r0,
                          int64_t nr, int64_t cols)
{
    const size_t es = dtype_size(t->dtype);
    #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (nr * cols > CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < nr; i++)
        dtype_convert((char *)t->data + (size_t)((r0 + i) * cols) * es, t->dtype, src + i * cols,
                      DTYPE_F32, (size_t)cols);
}

/* dbias (n) += the column sums of dyf (m, n), each summed in row order in f32. */
static void bias_grad(struct backend *b, const struct tensor *dbias, const float *dyf, int64_t m,
                      int64_t n)
{
    enum { COLS = 256 };
    #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (m * n > CPU_PARALLEL_MIN)
    for (int64_t j0 = 0; j0 < n; j0 += COLS) {
        float acc[COLS], tmp[COLS];
        size_t len = (size_t)(n - j0 < COLS ? n - j0 : COLS);
        memset(acc, 0, sizeof acc);
        for (int64_t i = 0; i < m; i++) {
            const float *r = dyf + i * n + j0;
            for (size_t j = 0; j < len; j++) acc[j] += r[j];
        }
        float *db = (float *)cpu_load_row(dbias, (size_t)j0, len, tmp); /* in place when f32 */
        for (size_t j = 0; j < len; j++) db[j] += acc[j];
        cpu_store_row(dbias, (size_t)j0, len, db);
    }
}

void cpu_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                         const struct tensor *dbias, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w, int accumulate_dx)
{
    const int64_t m = tensor_rows(dy), n = tensor_cols(dy);
    const int64_t k = w ? w->shape[1] : x ? tensor_cols(x) : 0; /* 0: dbias alone */
    if (m == 0) return; /* no rows: dx is empty and nothing is added to dw, dbias */
    const int half = dy->dtype != DTYPE_F32;

    /* Scratch, f32: dy (m, n) and x (m, k) widened, dx's sum (m, k), and one block of rows of w
     * or of dw (BACKWARD_BLOCK, k); the f32 path needs none of them. */
    const size_t dys = half ? (size_t)(m * n) : 0, xs = half && dw ? (size_t)(m * k) : 0;
    const size_t dxs = half && dx ? (size_t)(m * k) : 0;
    const size_t blk = (half && dx) || (dw && dw->dtype != DTYPE_F32) ? (size_t)BACKWARD_BLOCK * (size_t)k : 0;
    const size_t total = dys + xs + dxs + blk;
    float *base = total ? cpu_scratch(b, (total + (size_t)b->n_threads - 1) / (size_t)b->n_threads) : NULL;
    float *dyf = half ? base : (float *)dy->data;
    float *xf = !dw ? NULL : half ? base + dys : (float *)x->data;
    float *dxf = !dx ? NULL : half ? base + dys + xs : (float *)dx->data;
    float *blkf = base ? base + dys + xs + dxs : NULL;
    if (half) {
        cpu_rows_to_f32(b, dyf, dy, 0, m, n);
        if (dw) cpu_rows_to_f32(b, xf, x, 0, m, k);
    }

    /* dx (m, k) = dy (m, n) @ w (n, k), summed over blocks of w's rows. */
    if (dx) {
        if (!half) {
            cpu_gemm_nn(b, m, k, n, dyf, n, w->data, k, accumulate_dx ? 1.0f : 0.0f, dxf, k);
        } else {
            if (accumulate_dx) cpu_rows_to_f32(b, dxf, dx, 0, m, k);
            else memset(dxf, 0, (size_t)(m * k) * sizeof(float));
            for (int64_t j0 = 0; j0 < n; j0 += BACKWARD_BLOCK) {
                int64_t nb = n - j0 < BACKWARD_BLOCK ? n - j0 : BACKWARD_BLOCK;
                cpu_rows_to_f32(b, blkf, w, j0, nb, k);
                cpu_gemm_nn(b, m, k, nb, dyf + j0, n, blkf, k, 1.0f, dxf, k);
            }
            cpu_rows_from_f32(b, dx, dxf, 0, m, k);
        }
    }

    /* dw (n, k) += dy^T (n, m) @ x (m, k): in place when dw is f32, else a block of rows at a
     * time through f32, rounded once. */
    if (dw) {
        if (dw->dtype == DTYPE_F32) {
            cpu_gemm_tn(b, n, k, m, dyf, n, xf, k, 1.0f, dw->data, k);
        } else {
            for (int64_t j0 = 0; j0 < n; j0 += BACKWARD_BLOCK) {
                int64_t nb = n - j0 < BACKWARD_BLOCK ? n - j0 : BACKWARD_BLOCK;
                cpu_rows_to_f32(b, blkf, dw, j0, nb, k);
                cpu_gemm_tn(b, nb, k, m, dyf + j0, n, xf, k, 1.0f, blkf, k);
                cpu_rows_from_f32(b, dw, blkf, j0, nb, k);
            }
        }
    }

    if (dbias) bias_grad(b, dbias, dyf, m, n);
}
