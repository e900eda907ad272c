/* kernels/cpu/layernorm.c - op_layernorm on the CPU: (x - mean) / sqrt(var + eps) * w (+ b),
 * biased variance as PyTorch's LayerNorm, and its backward.
 * Tests: tests/test_ops.c (layernorm cases), tests/test_ops_backward.c (layernorm_backward). */
#include <string.h>

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

/* Per row, xhat = (x - mean) r, gw = dout * w:
 *   dx = r (gw - mean(gw) - xhat mean(gw xhat)); dweight += dout xhat; dbias += dout,
 * the weight and bias sums kept per thread, then added in thread order. */
void cpu_layernorm_backward(struct backend *b, const struct tensor *dx,
                            const struct tensor *dweight, const struct tensor *dbias,
                            const struct tensor *dout, const struct tensor *x,
                            const struct tensor *weight, float eps)
{
    const int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    const int nt = n * d > CPU_PARALLEL_MIN ? b->n_threads : 1;
    const size_t per = 6 * (size_t)d, stride = cpu_scratch_stride(per);
    float *scratch = cpu_scratch(b, per);
    for (int t = 0; t < nt; t++)
        memset(scratch + (size_t)t * stride + 4 * (size_t)d, 0, 2 * (size_t)d * sizeof(float));
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * stride;
        float *acc_w = tmp + 4 * d, *acc_b = tmp + 5 * d;
        const size_t off = (size_t)(i * d);
        const float *xr = cpu_load_row(x, off, (size_t)d, tmp);
        const float *wr = cpu_load_row(weight, 0, (size_t)d, tmp + d);
        const float *gr = cpu_load_row(dout, off, (size_t)d, tmp + 2 * d);
        double sum = 0.0;
        for (int64_t j = 0; j < d; j++) sum += xr[j];
        const double mean = sum / (double)d;
        double var = 0.0;
        for (int64_t j = 0; j < d; j++) var += ((double)xr[j] - mean) * ((double)xr[j] - mean);
        const float r = (float)(1.0 / sqrt(var / (double)d + (double)eps)), meanf = (float)mean;
        double sg = 0.0, sgx = 0.0;
        for (int64_t j = 0; j < d; j++) {
            float gw = gr[j] * wr[j], xhat = (xr[j] - meanf) * r;
            sg += gw;
            sgx += (double)gw * xhat;
        }
        const float a = (float)(sg / (double)d), c = (float)(sgx / (double)d);
        /* dx may alias dout: element j of dout is read before element j of dx is written. */
        float *o = cpu_out_row(dx, off, tmp + 3 * d);
        for (int64_t j = 0; j < d; j++) {
            float g = gr[j], xhat = (xr[j] - meanf) * r;
            acc_w[j] += g * xhat;
            acc_b[j] += g;
            o[j] = r * (g * wr[j] - a - xhat * c);
        }
        cpu_store_row(dx, off, (size_t)d, o);
    }
    if (dweight) cpu_add_partials(dweight, scratch + 4 * (size_t)d, nt, stride, d);
    if (dbias) cpu_add_partials(dbias, scratch + 5 * (size_t)d, nt, stride, d);
}
