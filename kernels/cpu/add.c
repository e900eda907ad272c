/* kernels/cpu/add.c - op_add on the CPU: the residual add, out = a + c.
 * Tests: tests/test_ops.c (add cases). */
#include "cpu_ops.h"

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
