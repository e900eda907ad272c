/* kernels/cpu/rmsnorm.c - op_rmsnorm on the CPU: x / sqrt(mean(x^2) + eps) * weight.
 * Tests: tests/test_ops.c (rmsnorm cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                 const struct tensor *weight, float eps)
{
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    size_t per = 3 * (size_t)d;
    float *scratch = cpu_scratch(b, per);
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        const float *xr = cpu_load_row(x, (size_t)(i * d), (size_t)d, tmp);
        const float *wr = cpu_load_row(weight, 0, (size_t)d, tmp + d);
        /* A double sum keeps the mean exact enough for any d without pairwise tricks. */
        double ss = 0.0;
        for (int64_t j = 0; j < d; j++) ss += (double)xr[j] * xr[j];
        float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
        float *o = cpu_out_row(out, (size_t)(i * d), tmp + 2 * d);
        for (int64_t j = 0; j < d; j++) o[j] = xr[j] * inv * wr[j];
        cpu_store_row(out, (size_t)(i * d), (size_t)d, o);
    }
}
