/* kernels/cpu/logit_mass.c - op_logit_mass on the CPU: per row, the sum of the sampler's weights
 * exp((x - max) w) within its floor ((x - max) w >= ln(1e-12)), in f64.
 * Tests: tests/test_ops.c (logit_mass cases). */
#include <math.h>

#include "cpu_ops.h"

void cpu_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                    const struct tensor *inv_temp)
{
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    const float *w = inv_temp->data;
    float *out = mass->data;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        if (!(w[i] > 0.0f)) {
            out[i] = 0.0f;
            continue;
        }
        float m = -INFINITY;
        for (int64_t j = 0; j < v; j++) {
            const float e = dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j));
            if (e > m) m = e;
        }
        double s = 0.0;
        for (int64_t j = 0; j < v; j++) {
            const float d = (dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j)) - m) * w[i];
            if (d >= -27.631021f) s += exp((double)d);
        }
        out[i] = (float)s;
    }
}
