/* kernels/cpu/add.c - op_add on the CPU: the residual add, out = a + c; and op_scatter_add_rows,
 * a mixture of experts' weighted combine into named rows, with its backward.
 * Tests: tests/test_ops.c (add and scatter_add_rows cases), tests/test_ops_backward.c
 * (scatter_add_rows_backward). */
#include "cpu_ops.h"

#include <omp.h>

#define ADD_CHUNK 1024

void cpu_add(struct backend *b, const struct tensor *out, const struct tensor *a,
             const struct tensor *c)
{
    int64_t n = tensor_numel(out);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += ADD_CHUNK) {
        float ta[ADD_CHUNK], tc[ADD_CHUNK];
        size_t len = (size_t)(n - i < ADD_CHUNK ? n - i : ADD_CHUNK);
        const float *pa = cpu_load_row(a, (size_t)i, len, ta);
        const float *pc = cpu_load_row(c, (size_t)i, len, tc);
        float *po = cpu_out_row(out, (size_t)i, ta); /* ta is dead once read */
        for (size_t j = 0; j < len; j++) po[j] = pa[j] + pc[j];
        cpu_store_row(out, (size_t)i, len, po);
    }
}

void cpu_scatter_add_weighted(struct backend *b, const struct tensor *out, const struct tensor *y,
                              const struct tensor *ids, const struct tensor *weights)
{
    const int64_t n = tensor_rows(y), d = tensor_cols(y), rows = tensor_rows(out);
    const int32_t *id = ids->data;
    const float *w = weights->data;
    for (int64_t i = 0; i < n; i++)
        CHECK(id[i] >= 0 && id[i] < rows, "scatter_add_rows: id %d at %lld outside [0, %lld)", id[i], (long long)i,
              (long long)rows);
    float *scratch = cpu_scratch(b, 2 * (size_t)d); /* per thread: y's row and out's row, widened */
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *ty = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(2 * (size_t)d), *to = ty + d;
        const float *py = cpu_load_row(y, (size_t)(i * d), (size_t)d, ty);
        const size_t orow = (size_t)id[i] * (size_t)d;
        const float *po = cpu_load_row(out, orow, (size_t)d, to);
        float *dst = cpu_out_row(out, orow, to);
        for (int64_t j = 0; j < d; j++) dst[j] = po[j] + w[i] * py[j];
        cpu_store_row(out, orow, (size_t)d, dst);
    }
}

void cpu_scatter_add_weighted_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                       const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                       const struct tensor *weights)
{
    const int64_t n = tensor_rows(y), d = tensor_cols(y), rows = tensor_rows(dout);
    const int32_t *id = ids->data;
    const float *w = weights->data;
    float *dw = dweights ? dweights->data : NULL;
    for (int64_t i = 0; i < n; i++)
        CHECK(id[i] >= 0 && id[i] < rows, "scatter_add_rows_backward: id %d at %lld outside [0, %lld)", id[i],
              (long long)i, (long long)rows);
    float *scratch = cpu_scratch(b, 2 * (size_t)d); /* per thread: dout's row and y's row, widened */
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tg = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(2 * (size_t)d), *ty = tg + d;
        const float *pg = cpu_load_row(dout, (size_t)id[i] * (size_t)d, (size_t)d, tg);
        if (dw) {
            const float *py = cpu_load_row(y, (size_t)(i * d), (size_t)d, ty);
            float dot = 0.0f;
            for (int64_t j = 0; j < d; j++) dot += pg[j] * py[j];
            dw[i] = dot;
        }
        float *dst = cpu_out_row(dy, (size_t)(i * d), ty);
        for (int64_t j = 0; j < d; j++) dst[j] = w[i] * pg[j];
        cpu_store_row(dy, (size_t)(i * d), (size_t)d, dst);
    }
}
