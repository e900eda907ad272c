/* kernels/cpu/softmax.c - op_softmax on the CPU: per-row softmax, max-subtracted.
 * Tests: tests/test_ops.c (softmax cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    int64_t n = tensor_rows(x), v = tensor_cols(x);
    size_t per = (size_t)v;
    float *scratch = cpu_scratch(b, per);
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        const float *xr = cpu_load_row(x, (size_t)(i * v), (size_t)v, tmp);
        float mx = -INFINITY;
        for (int64_t j = 0; j < v; j++) mx = xr[j] > mx ? xr[j] : mx;
        float *o = cpu_out_row(out, (size_t)(i * v), tmp);
        double sum = 0.0;
        for (int64_t j = 0; j < v; j++) {
            o[j] = expf(xr[j] - mx);
            sum += o[j];
        }
        float inv = (float)(1.0 / sum);
        for (int64_t j = 0; j < v; j++) o[j] *= inv;
        cpu_store_row(out, (size_t)(i * v), (size_t)v, o);
    }
}
