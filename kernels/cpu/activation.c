/* kernels/cpu/activation.c - op_activation on the CPU (SiLU, GELU tanh, GELU erf), and the
 * scalar activation shared with gated_activation.c.
 * Tests: tests/test_ops.c (activation cases). */
#include <math.h>

#include "cpu_ops.h"

#define ACT_CHUNK 1024

float cpu_activate(float x, enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: return x / (1.0f + expf(-x));
    case ACTIVATION_GELU_TANH: {
        const float k = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case ACTIVATION_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    }
    return x;
}

void cpu_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                    enum activation act)
{
    int64_t n = tensor_numel(out);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += ACT_CHUNK) {
        float t[ACT_CHUNK];
        size_t len = (size_t)(n - i < ACT_CHUNK ? n - i : ACT_CHUNK);
        const float *px = cpu_load_row(x, (size_t)i, len, t);
        float *po = cpu_out_row(out, (size_t)i, t);
        for (size_t j = 0; j < len; j++) po[j] = cpu_activate(px[j], act);
        cpu_store_row(out, (size_t)i, len, po);
    }
}
