/* kernels/cpu/cast.c - op_cast on the CPU: dtype conversion, rounding to nearest even.
 * Tests: tests/test_ops.c (cast cases). */
#include "cpu_ops.h"

void cpu_cast(struct backend *b, const struct tensor *out, const struct tensor *in)
{
    int64_t n = tensor_numel(in);
    const int64_t chunk = 4096;
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t len = n - i < chunk ? n - i : chunk;
        dtype_convert((char *)out->data + (size_t)i * dtype_size(out->dtype), out->dtype,
                      (const char *)in->data + (size_t)i * dtype_size(in->dtype), in->dtype,
                      (size_t)len);
    }
}
