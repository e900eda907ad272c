/* kernels/cpu/scale.c - op_scale and op_softcap on the CPU: out = alpha * x, out = cap *
 * tanh(x / cap).
 * Tests: tests/test_ops.c (scale and softcap cases). */
#include <math.h>

#include "cpu_ops.h"

#define SCALE_CHUNK 1024

/* out = p * x, or p * tanh(x / p) when softcap, a chunk of elements per step. */
static void map(struct backend *b, const struct tensor *out, const struct tensor *x, float p, int softcap)
{
    int64_t n = tensor_numel(out);
    const float inv = 1.0f / p;
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += SCALE_CHUNK) {
        float t[SCALE_CHUNK];
        size_t len = (size_t)(n - i < SCALE_CHUNK ? n - i : SCALE_CHUNK);
        const float *px = cpu_load_row(x, (size_t)i, len, t);
        float *po = cpu_out_row(out, (size_t)i, t);
        if (softcap)
            for (size_t j = 0; j < len; j++) po[j] = p * tanhf(px[j] * inv);
        else
            for (size_t j = 0; j < len; j++) po[j] = p * px[j];
        cpu_store_row(out, (size_t)i, len, po);
    }
}

void cpu_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha)
{
    map(b, out, x, alpha, 0);
}

void cpu_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap)
{
    map(b, out, x, cap, 1);
}
