/* kernels/cpu/layernorm.c - op_layernorm on the CPU: (x - mean) / sqrt(var + eps) * w (+ b),
 * biased variance as PyTorch's LayerNorm.
 * Tests: tests/test_ops.c (layernorm cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                   const struct tensor *weight, const struct tensor *bias, float eps)
{
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    size_t per = 4 * (size_t)d;
    float *scratch = cpu_scratch(b, per);
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        const float *xr = cpu_load_row(x, (size_t)(i * d), (size_t)d, tmp);
        const float *wr = cpu_load_row(weight, 0, (size_t)d, tmp + d);
        const float *br = bias ? cpu_load_row(bias, 0, (size_t)d, tmp + 2 * d) : NULL;
        double sum = 0.0;
        for (int64_t j = 0; j < d; j++) sum += xr[j];
        double mean = sum / (double)d, var = 0.0;
        for (int64_t j = 0; j < d; j++) var += ((double)xr[j] - mean) * ((double)xr[j] - mean);
        float inv = (float)(1.0 / sqrt(var / (double)d + (double)eps));
        float meanf = (float)mean;
        float *o = cpu_out_row(out, (size_t)(i * d), tmp + 3 * d);
        for (int64_t j = 0; j < d; j++) o[j] = (xr[j] - meanf) * inv * wr[j] + (br ? br[j] : 0.0f);
        cpu_store_row(out, (size_t)(i * d), (size_t)d, o);
    }
}
