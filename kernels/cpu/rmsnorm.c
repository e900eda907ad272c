/* kernels/cpu/rmsnorm.c - op_rmsnorm on the CPU: x / sqrt(mean(x^2) + eps) * weight, and its
 * backward; op_add_rmsnorm, the residual add before it in the same pass.
 * Tests: tests/test_ops.c (rmsnorm cases), tests/test_ops_backward.c (rmsnorm_backward). */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

/* sum(x^2) in double, which keeps the mean exact enough for any d without pairwise tricks; in
 * eight interleaved sums (the compiler's vectors), not one chain of dependent adds: a row's value
 * depends only on the row. */
static double sum_squares_f64(const float *x, int64_t d)
{
    double s[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= d; j += 8)
        for (int u = 0; u < 8; u++) s[u] += (double)x[j + u] * x[j + u];
    for (; j < d; j++) s[j % 8] += (double)x[j] * x[j];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

/* Rows of out = rmsnorm(x); with c non-NULL, x is first a + c, stored in sum as op_add stores it and
 * read back from there (its dtype's rounding), as op_rmsnorm would read it. */
static void norm_rows(struct backend *b, const struct tensor *sum, const struct tensor *out, const struct tensor *x,
                      const struct tensor *c, const struct tensor *weight, float eps)
{
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    size_t per = 4 * (size_t)d;
    float *scratch = cpu_scratch(b, per);
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        const size_t off = (size_t)(i * d);
        const float *xr = cpu_load_row(x, off, (size_t)d, tmp);
        if (c) {
            const float *cr = cpu_load_row(c, off, (size_t)d, tmp + 3 * d);
            float *sr = cpu_out_row(sum, off, tmp + 3 * d); /* (cr's element j is read before sr's is written) */
            for (int64_t j = 0; j < d; j++) sr[j] = xr[j] + cr[j];
            cpu_store_row(sum, off, (size_t)d, sr);
            xr = cpu_load_row(sum, off, (size_t)d, tmp); /* in place when f32; else the stored, rounded sum */
        }
        const float *wr = cpu_load_row(weight, 0, (size_t)d, tmp + d);
        const double ss = sum_squares_f64(xr, d);
        float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
        float *o = cpu_out_row(out, off, tmp + 2 * d);
        for (int64_t j = 0; j < d; j++) o[j] = xr[j] * inv * wr[j];
        cpu_store_row(out, off, (size_t)d, o);
    }
}

void cpu_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                 const struct tensor *weight, float eps)
{
    norm_rows(b, NULL, out, x, NULL, weight, eps);
}

void cpu_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out, const struct tensor *a,
                     const struct tensor *c, const struct tensor *weight, float eps)
{
    norm_rows(b, sum, out, a, c, weight, eps);
}

/* Deterministic for a given thread count: threads are summed in their order. */
void cpu_add_partials(const struct tensor *g, const float *acc, int nt, size_t stride, int64_t d)
{
    enum { COLS = 1024 };
    for (int64_t j0 = 0; j0 < d; j0 += COLS) {
        float tmp[COLS];
        size_t len = (size_t)(d - j0 < COLS ? d - j0 : COLS);
        float *o = (float *)cpu_load_row(g, (size_t)j0, len, tmp); /* in place when f32 */
        for (size_t j = 0; j < len; j++) {
            float s = 0.0f;
            for (int t = 0; t < nt; t++) s += acc[(size_t)t * stride + (size_t)j0 + j];
            o[j] += s;
        }
        cpu_store_row(g, (size_t)j0, len, o);
    }
}

/* Per row: dx = r (g w) - (r^3 / d) sum(g w x) x; dweight += g x r, summed by each thread over
 * its rows, then over threads in order. */
void cpu_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                          const struct tensor *dout, const struct tensor *x,
                          const struct tensor *weight, float eps)
{
    const int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    const int nt = n * d > CPU_PARALLEL_MIN ? b->n_threads : 1;
    const size_t per = 5 * (size_t)d, stride = cpu_scratch_stride(per);
    float *scratch = cpu_scratch(b, per);
    for (int t = 0; t < nt; t++) memset(scratch + (size_t)t * stride + 4 * (size_t)d, 0, (size_t)d * sizeof(float));
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * stride;
        float *acc = tmp + 4 * d;
        const size_t off = (size_t)(i * d);
        const float *xr = cpu_load_row(x, off, (size_t)d, tmp);
        const float *wr = cpu_load_row(weight, 0, (size_t)d, tmp + d);
        const float *gr = cpu_load_row(dout, off, (size_t)d, tmp + 2 * d);
        double ss = 0.0, dot = 0.0;
        for (int64_t j = 0; j < d; j++) {
            ss += (double)xr[j] * xr[j];
            dot += (double)gr[j] * wr[j] * xr[j];
        }
        const double rd = 1.0 / sqrt(ss / (double)d + (double)eps);
        const float r = (float)rd, c = (float)(rd * rd * rd * dot / (double)d);
        /* dx may alias dout: element j of dout is read before element j of dx is written. */
        float *o = cpu_out_row(dx, off, tmp + 3 * d);
        for (int64_t j = 0; j < d; j++) {
            float g = gr[j];
            if (dweight) acc[j] += g * xr[j] * r;
            o[j] = r * (g * wr[j]) - c * xr[j];
        }
        cpu_store_row(dx, off, (size_t)d, o);
    }
    if (dweight) cpu_add_partials(dweight, scratch + 4 * (size_t)d, nt, stride, d);
}
