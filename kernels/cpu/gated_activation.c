/* kernels/cpu/gated_activation.c - op_gated_activation on the CPU: act(gate) * up (SwiGLU,
 * GeGLU; GPT-OSS's clamped SwiGLU multiplies by clamp(up) + 1), and its backward.
 * Tests: tests/test_ops.c (gated_activation cases), tests/test_ops_backward.c. */
#include <string.h>

#include "cpu_ops.h"

#define GATED_CHUNK 1024

void cpu_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                          const struct tensor *up, enum activation act)
{
    int64_t n = tensor_numel(out);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += GATED_CHUNK) {
        float tg[GATED_CHUNK], tu[GATED_CHUNK], ta[GATED_CHUNK];
        size_t len = (size_t)(n - i < GATED_CHUNK ? n - i : GATED_CHUNK);
        const float *pg = cpu_load_row(gate, (size_t)i, len, tg);
        const float *pu = cpu_load_row(up, (size_t)i, len, tu);
        float *po = cpu_out_row(out, (size_t)i, tg);
        cpu_activate_rows(ta, pg, len, act); /* out may alias gate or up */
        if (act == ACTIVATION_SWIGLU_OAI)
            for (size_t j = 0; j < len; j++) po[j] = ta[j] * cpu_gated_up(pu[j], act);
        else
            for (size_t j = 0; j < len; j++) po[j] = ta[j] * pu[j];
        cpu_store_row(out, (size_t)i, len, po);
    }
}

/* dgate = dout up act'(gate), dup = dout act(gate). Each element's three inputs are read
 * before its two outputs are written, so the allowed aliases are safe. */
void cpu_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                   const struct tensor *dup, const struct tensor *dout,
                                   const struct tensor *gate, const struct tensor *up,
                                   enum activation act)
{
    int64_t n = tensor_numel(dout);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += GATED_CHUNK) {
        float tg[GATED_CHUNK], tu[GATED_CHUNK], td[GATED_CHUNK], og[GATED_CHUNK], ou[GATED_CHUNK];
        size_t len = (size_t)(n - i < GATED_CHUNK ? n - i : GATED_CHUNK);
        const float *pg = cpu_load_row(gate, (size_t)i, len, tg);
        const float *pu = cpu_load_row(up, (size_t)i, len, tu);
        const float *pd = cpu_load_row(dout, (size_t)i, len, td);
        for (size_t j = 0; j < len; j++) {
            float g = pg[j], u = pu[j], d = pd[j];
            og[j] = d * cpu_gated_up(u, act) * cpu_activate_grad(g, act);
            /* SWIGLU_OAI: 0 where up was clamped */
            const int clamped = act == ACTIVATION_SWIGLU_OAI && (u > ACT_OAI_LIMIT || u < -ACT_OAI_LIMIT);
            ou[j] = clamped ? 0.0f : d * cpu_activate(g, act);
        }
        float *pdg = cpu_out_row(dgate, (size_t)i, og), *pdu = cpu_out_row(dup, (size_t)i, ou);
        if (pdg != og) memcpy(pdg, og, len * sizeof(float));
        if (pdu != ou) memcpy(pdu, ou, len * sizeof(float));
        cpu_store_row(dgate, (size_t)i, len, og);
        cpu_store_row(dup, (size_t)i, len, ou);
    }
}
