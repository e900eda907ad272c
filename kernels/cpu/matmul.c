/* kernels/cpu/matmul.c - op_matmul on the CPU: y = x @ w^T (+ bias) through OpenBLAS. f32
 * calls sgemm (sgemv for one row) directly on the tensors; bf16/f16 widen x and blocks of w
 * into the scratch arena, multiply in f32, and round y once.
 * Tests: tests/test_ops.c (matmul cases); benchmark: tests/bench_ops.c. */
#include <cblas.h>
#include <string.h>

#include "cpu_ops.h"

/* Rows of w widened per block in the bf16/f16 path: bounds scratch at W_BLOCK * k floats. */
#define W_BLOCK 256

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

void cpu_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                const struct tensor *w, const struct tensor *bias)
{
    int64_t m = tensor_rows(x), k = tensor_cols(x), n = w->shape[0];
    if (m == 0 || n == 0) return;

    if (x->dtype == DTYPE_F32) {
        float *yf = y->data;
        if (k == 0)
            memset(yf, 0, tensor_nbytes(y));
        else if (m == 1)
            cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)n, (int)k, 1.0f, w->data, (int)k,
                        x->data, 1, 0.0f, yf, 1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f,
                        x->data, (int)k, w->data, (int)k, 0.0f, yf, (int)n);
        if (bias) add_bias(yf, bias, m, n);
        return;
    }

    /* Half-precision storage: scratch = x (m, k) | w block (W_BLOCK, k) | y (m, n), all f32. */
    size_t xs = (size_t)(m * k), ws = (size_t)W_BLOCK * (size_t)k, ys = (size_t)(m * n);
    float *xf = cpu_scratch(b, (xs + ws + ys + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    float *wf = xf + xs, *yf = wf + ws;
    dtype_convert(xf, DTYPE_F32, x->data, x->dtype, xs);
    if (k == 0) memset(yf, 0, ys * sizeof(float));
    for (int64_t j0 = 0; k > 0 && j0 < n; j0 += W_BLOCK) {
        int64_t nb = n - j0 < W_BLOCK ? n - j0 : W_BLOCK;
        dtype_convert(wf, DTYPE_F32, (const char *)w->data + (size_t)(j0 * k) * dtype_size(w->dtype),
                      w->dtype, (size_t)(nb * k));
        /* y[:, j0:j0+nb] = x @ wblock^T, written with leading dimension n. */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)nb, (int)k, 1.0f, xf,
                    (int)k, wf, (int)k, 0.0f, yf + j0, (int)n);
    }
    if (bias) add_bias(yf, bias, m, n);
    dtype_convert(y->data, y->dtype, yf, DTYPE_F32, ys);
}
