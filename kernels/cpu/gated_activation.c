/* kernels/cpu/gated_activation.c - op_gated_activation on the CPU: act(gate) * up (SwiGLU,
 * GeGLU).
 * Tests: tests/test_ops.c (gated_activation cases). */
#include "cpu_ops.h"

#define GATED_CHUNK 1024

void cpu_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                          const struct tensor *up, enum activation act)
{
    int64_t n = tensor_numel(out);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += GATED_CHUNK) {
        float tg[GATED_CHUNK], tu[GATED_CHUNK];
        size_t len = (size_t)(n - i < GATED_CHUNK ? n - i : GATED_CHUNK);
        const float *pg = cpu_load_row(gate, (size_t)i, len, tg);
        const float *pu = cpu_load_row(up, (size_t)i, len, tu);
        float *po = cpu_out_row(out, (size_t)i, tg);
        for (size_t j = 0; j < len; j++) po[j] = cpu_activate(pg[j], act) * pu[j];
        cpu_store_row(out, (size_t)i, len, po);
    }
}
