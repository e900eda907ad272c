/* kernels/cpu/sum_squares.c - op_sum_squares on the CPU: out += sum(x^2), for the global
 * gradient norm and the loss scaler's overflow check (Inf or NaN propagates into out).
 * Tests: tests/test_ops_backward.c (sum_squares cases). */
#include "cpu_ops.h"

#define SQ_CHUNK 4096

void cpu_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    const int64_t n = tensor_numel(x);
    const int64_t n_chunks = (n + SQ_CHUNK - 1) / SQ_CHUNK;
    /* One double per chunk, summed in chunk order afterwards: the same result for any thread
     * count. */
    double *part = (double *)cpu_scratch(b, (size_t)(2 * n_chunks + b->n_threads) / (size_t)b->n_threads + 2);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t c = 0; c < n_chunks; c++) {
        float tmp[SQ_CHUNK];
        size_t i0 = (size_t)(c * SQ_CHUNK), len = (size_t)(n - c * SQ_CHUNK < SQ_CHUNK ? n - c * SQ_CHUNK : SQ_CHUNK);
        const float *px = cpu_load_row(x, i0, len, tmp);
        float s = 0.0f;
        for (size_t j = 0; j < len; j++) s += px[j] * px[j];
        part[c] = s;
    }
    double total = 0.0;
    for (int64_t c = 0; c < n_chunks; c++) total += part[c];
    float *o = out->data;
    o[0] = (float)((double)o[0] + total);
}
