/* kernels/cpu/argmax.c - op_argmax on the CPU: greedy token choice per row; lowest index on
 * ties, NaN never chosen over a number (an all-NaN row gives 0).
 * Tests: tests/test_ops.c (argmax cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x)
{
    int64_t n = tensor_rows(x), v = tensor_cols(x);
    int32_t *out = ids->data;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        int64_t best = 0;
        float best_v = NAN;
        for (int64_t j = 0; j < v; j++) {
            float val = dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j));
            if (isnan(val)) continue;
            if (isnan(best_v) || val > best_v) {
                best_v = val;
                best = j;
            }
        }
        out[i] = (int32_t)best;
    }
}
