/* kernels/cpu/matmul.c - op_matmul on the CPU: y = x @ w^T (+ bias) through OpenBLAS.
 * One thread pool serves the whole backend: OpenBLAS runs single-threaded inside each OpenMP
 * thread, and the output columns (rows of w) are split across the threads. Two pools (OpenMP
 * for the other ops, OpenBLAS's pthreads here) fight for the cores: OpenMP workers spin after
 * each region while OpenBLAS needs them, which was measured at 60x slower decode on 2 cores.
 * f32 multiplies the tensors in place (sgemv for one row); bf16/f16 widen x once and blocks of
 * w per thread into the scratch arena, multiply in f32, and round y once.
 * Tests: tests/test_ops.c (matmul cases); benchmark: tests/bench_ops.c. */
#include <cblas.h>
#include <string.h>

#include "cpu_ops.h"

/* Rows of w widened per block in the bf16/f16 path: bounds scratch at W_BLOCK * k floats per
 * thread. */
#define W_BLOCK 256
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

/* y_cols (m rows of nb, leading dimension n) = x (m, k) @ w_rows (nb, k)^T, all f32. */
static void gemm_cols(float *y_cols, const float *x, const float *w_rows, int64_t m, int64_t n,
                      int64_t k, int64_t nb)
{
    if (m == 1)
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)nb, (int)k, 1.0f, w_rows, (int)k, x, 1,
                    0.0f, y_cols, 1);
    else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nb, (int)k, 1.0f, x,
                    (int)k, w_rows, (int)k, 0.0f, y_cols, (int)n);
}

void cpu_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                const struct tensor *w, const struct tensor *bias)
{
    const int64_t m = tensor_rows(x), k = tensor_cols(x), n = w->shape[0];
    if (m == 0 || n == 0) return;
    const int nt = m * n * k >= MATMUL_PARALLEL_MIN ? b->n_threads : 1;

    if (x->dtype == DTYPE_F32) {
        float *yf = y->data;
        if (k == 0) {
            memset(yf, 0, tensor_nbytes(y));
        } else {
            /* Column slices rounded to 16 keep each thread's stores on its own cache lines. */
            const int64_t per = ((n + nt - 1) / nt + 15) / 16 * 16;
            #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
            for (int64_t j0 = 0; j0 < n; j0 += per)
                gemm_cols(yf + j0, x->data, (const float *)w->data + j0 * k, m, n, k,
                          n - j0 < per ? n - j0 : per);
        }
        if (bias) add_bias(yf, bias, m, n);
        return;
    }

    /* Half-precision storage: x (m, k) | y (m, n) shared, then a w block (W_BLOCK, k) per
     * thread, all f32, carved from one scratch request. */
    const size_t xs = (size_t)(m * k), ys = (size_t)(m * n), ws = (size_t)W_BLOCK * (size_t)k;
    const size_t total = xs + ys + (size_t)b->n_threads * ws;
    float *xf = cpu_scratch(b, (total + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    float *yf = xf + xs, *wf_all = yf + ys;
    dtype_convert(xf, DTYPE_F32, x->data, x->dtype, xs);
    if (k == 0) memset(yf, 0, ys * sizeof(float));
    const size_t wsize = dtype_size(w->dtype);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1 && k > 0)
    for (int64_t j0 = 0; j0 < (k > 0 ? n : 0); j0 += W_BLOCK) {
        float *wf = wf_all + (size_t)omp_get_thread_num() * ws;
        int64_t nb = n - j0 < W_BLOCK ? n - j0 : W_BLOCK;
        dtype_convert(wf, DTYPE_F32, (const char *)w->data + (size_t)(j0 * k) * wsize, w->dtype,
                      (size_t)(nb * k));
        gemm_cols(yf + j0, xf, wf, m, n, k, nb);
    }
    if (bias) add_bias(yf, bias, m, n);
    dtype_convert(y->data, y->dtype, yf, DTYPE_F32, ys);
}
