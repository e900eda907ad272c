/* kernels/cpu/embedding.c - op_embedding on the CPU: masked row lookup for a (possibly
 * vocab-parallel) embedding table.
 * Tests: tests/test_ops.c (embedding cases). */
#include <string.h>

#include "cpu_ops.h"

void cpu_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                   const struct tensor *ids, int64_t vocab_start)
{
    int64_t n = tensor_numel(ids), d = table->shape[1], rows = table->shape[0];
    size_t row_bytes = (size_t)d * dtype_size(out->dtype);
    const int32_t *id = ids->data;
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)id[i] - vocab_start;
        char *dst = (char *)out->data + (size_t)i * row_bytes;
        if (r < 0 || r >= rows) {
            memset(dst, 0, row_bytes); /* another vocab shard owns this id */
            continue;
        }
        memcpy(dst, (const char *)table->data + (size_t)r * row_bytes, row_bytes);
    }
}
