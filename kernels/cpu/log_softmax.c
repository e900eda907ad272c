/* kernels/cpu/log_softmax.c - op_log_softmax on the CPU: (x - max) - log(sum(exp(x - max))),
 * per row, for token log-probabilities.
 * Tests: tests/test_ops.c (log_softmax cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
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
        double sum = 0.0;
        for (int64_t j = 0; j < v; j++) sum += exp((double)(xr[j] - mx));
        /* (x - max) - log(sum) keeps large logits exact; x - (max + log(sum)) does not. */
        float lse = (float)log(sum);
        float *o = cpu_out_row(out, (size_t)(i * v), tmp);
        for (int64_t j = 0; j < v; j++) o[j] = (xr[j] - mx) - lse;
        cpu_store_row(out, (size_t)(i * v), (size_t)v, o);
    }
}
