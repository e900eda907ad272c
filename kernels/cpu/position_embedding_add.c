/* kernels/cpu/position_embedding_add.c - op_position_embedding_add on the CPU: x += wpe[pos],
 * and its backward, dwpe[pos] += dx (cpu_scatter_add_rows in embedding.c).
 * Tests: tests/test_ops.c (position_embedding cases), tests/test_ops_backward.c. */
#include "cpu_ops.h"

void cpu_position_embedding_add(struct backend *b, const struct tensor *x,
                                const struct tensor *table, const struct tensor *positions)
{
    int64_t n = tensor_numel(positions), d = table->shape[1];
    const int32_t *pos = positions->data;
    for (int64_t i = 0; i < n; i++)
        CHECK(pos[i] >= 0 && pos[i] < table->shape[0], "position %d outside the table (%lld rows)",
              pos[i], (long long)table->shape[0]);
    float *scratch = cpu_scratch(b, 2 * (size_t)d);
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(2 * (size_t)d);
        const float *xr = cpu_load_row(x, (size_t)(i * d), (size_t)d, tmp);
        const float *pr = cpu_load_row(table, (size_t)pos[i] * (size_t)d, (size_t)d, tmp + d);
        float *o = cpu_out_row(x, (size_t)(i * d), tmp);
        for (int64_t j = 0; j < d; j++) o[j] = xr[j] + pr[j];
        cpu_store_row(x, (size_t)(i * d), (size_t)d, o);
    }
}

void cpu_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                         const struct tensor *dx, const struct tensor *positions)
{
    int64_t n = tensor_numel(positions);
    const int32_t *pos = positions->data;
    for (int64_t i = 0; i < n; i++)
        CHECK(pos[i] >= 0 && pos[i] < dtable->shape[0], "position %d outside the table (%lld rows)",
              pos[i], (long long)dtable->shape[0]);
    cpu_scatter_add_rows(b, dtable, dx, pos, 0);
}
