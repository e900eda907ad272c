/* kernels/cpu/dropout.c - op_dropout on the CPU: out = x masked by the counter-based mask of
 * ops.h, scaled by 1 / (1 - p).
 * Tests: tests/test_ops_dropout.c. */
#include "cpu_ops.h"

void cpu_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key, int64_t col0,
                 float p)
{
    const int64_t n = out->shape[0], d = out->shape[1];
    const uint32_t threshold = op_dropout_threshold(p);
    const float scale = 1.0f / (1.0f - p);
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float t[1024];
        for (int64_t j0 = 0; j0 < d; j0 += 1024) {
            const size_t len = (size_t)(d - j0 < 1024 ? d - j0 : 1024), off = (size_t)(i * d + j0);
            const float *px = cpu_load_row(x, off, len, t);
            float *po = cpu_out_row(out, off, t);
            for (size_t j = 0; j < len; j++) {
                const uint64_t c = (uint64_t)(col0 + j0 + (int64_t)j);
                const int keep = (op_dropout_hash(key ^ ((uint64_t)i << 32 | c)) >> 40) >= threshold;
                po[j] = keep ? px[j] * scale : 0.0f;
            }
            cpu_store_row(out, off, len, po);
        }
    }
}
