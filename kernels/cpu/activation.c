/* kernels/cpu/activation.c - op_activation on the CPU (SiLU, GELU tanh, GELU erf) and its
 * backward, the vectorised forward rows and the scalar activation and derivative shared with
 * gated_activation.c.
 * Tests: tests/test_ops.c (activation cases), tests/test_ops_backward.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_isa.h"
#include "cpu_ops.h"

#define ACT_CHUNK 1024

/* out[j] = act(x[j]) for j < len: the forward of op_activation and op_gated_activation, one
 * loop per activation so that each vectorises.
 * SiLU is x / (1 + e^-x); GELU tanh 0.5 x (1 + tanh u) is x / (1 + e^(-2u)), the same function;
 * GELU erf keeps libm's erff. out may alias x. The loops vectorise because the kernels
 * are built with -fno-trapping-math (kernels/CMakeLists.txt): GCC otherwise keeps cpu_exp's
 * clamp as branches. */
/* One copy per vector width (the body inlined into each), chosen per call by cpu_isa() so that
 * SHARDLM_CPU_ISA can force any of them (it was a target_clones ifunc, fixed at load time). */
__attribute__((always_inline)) static inline void activate_rows(float *out, const float *x, size_t len,
                                                                enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU:
        for (size_t j = 0; j < len; j++) out[j] = x[j] / (1.0f + cpu_exp(-x[j]));
        break;
    case ACTIVATION_GELU_TANH: {
        const float k2 = 2.0f * 0.7978845608028654f; /* 2 sqrt(2/pi) */
        for (size_t j = 0; j < len; j++) {
            const float v = x[j], u2 = k2 * (v + 0.044715f * v * v * v);
            out[j] = v / (1.0f + cpu_exp(-u2));
        }
        break;
    }
    case ACTIVATION_GELU_ERF:
        for (size_t j = 0; j < len; j++) out[j] = cpu_activate(x[j], act);
        break;
    case ACTIVATION_SWIGLU_OAI: /* the gate's part: g sigmoid(1.702 g), g = min(x, 7) (a NaN stays NaN) */
        for (size_t j = 0; j < len; j++) {
            const float g = x[j] > ACT_OAI_LIMIT ? ACT_OAI_LIMIT : x[j];
            out[j] = g / (1.0f + cpu_exp(-ACT_OAI_ALPHA * g));
        }
        break;
    }
}

static void activate_rows_default(float *out, const float *x, size_t len, enum activation act)
{
    activate_rows(out, x, len, act);
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static void activate_rows_avx512(float *out, const float *x,
                                                                    size_t len, enum activation act)
{
    activate_rows(out, x, len, act);
}

__attribute__((target("avx2"))) static void activate_rows_avx2(float *out, const float *x, size_t len,
                                                               enum activation act)
{
    activate_rows(out, x, len, act);
}
#endif

const char *cpu_activation_path(void)
{
#if defined(__x86_64__)
    if (cpu_isa_at_least(CPU_ISA_AVX512)) return "avx512";
    if (cpu_isa_at_least(CPU_ISA_AVX2)) return "avx2";
#endif
    return "baseline"; /* the x86-64 baseline (SSE2) as the compiler vectorises it, or plain C */
}

static void activate_rows_isa(float *out, const float *x, size_t len, enum activation act)
{
#if defined(__x86_64__)
    const enum cpu_isa isa = cpu_isa();
    if (isa >= CPU_ISA_AVX512) {
        activate_rows_avx512(out, x, len, act);
        return;
    }
    if (isa >= CPU_ISA_AVX2) {
        activate_rows_avx2(out, x, len, act);
        return;
    }
#endif
    activate_rows_default(out, x, len, act);
}

/* Whole groups of ACT_GROUP elements, the last one padded: an element's value must not depend
 * on where it falls in the call (gated_activation cuts the rows of a batch into chunks, so the
 * vector loop's remainder held other elements at other batch sizes, and the compiler's
 * remainder code rounds differently: found as log-probabilities that changed with the batch on
 * an AVX-512 CPU, docs/determinism.md). */
#define ACT_GROUP 16
void cpu_activate_rows(float *out, const float *x, size_t len, enum activation act)
{
    const size_t body = len / ACT_GROUP * ACT_GROUP;
    for (size_t i = 0; i < body; i += ACT_GROUP) activate_rows_isa(out + i, x + i, ACT_GROUP, act);
    if (body < len) {
        float xt[ACT_GROUP] = {0}, ot[ACT_GROUP];
        memcpy(xt, x + body, (len - body) * sizeof *xt);
        activate_rows_isa(ot, xt, ACT_GROUP, act);
        memcpy(out + body, ot, (len - body) * sizeof *ot);
    }
}

float cpu_activate(float x, enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: return x / (1.0f + expf(-x));
    case ACTIVATION_GELU_TANH: {
        const float k = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case ACTIVATION_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case ACTIVATION_SWIGLU_OAI: {
        const float g = x > ACT_OAI_LIMIT ? ACT_OAI_LIMIT : x;
        return g / (1.0f + expf(-ACT_OAI_ALPHA * g));
    }
    }
    return x;
}

/* d act / dx. SiLU: s (1 + x (1 - s)), s = sigmoid(x). GELU tanh: with u = k (x + c x^3),
 * 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) k (1 + 3 c x^2). GELU erf: Phi(x) + x phi(x). */
float cpu_activate_grad(float x, enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f + x * (1.0f - s));
    }
    case ACTIVATION_GELU_TANH: {
        const float k = 0.7978845608028654f, c = 0.044715f;
        float x2 = x * x, t = tanhf(k * (x + c * x * x2));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x2);
    }
    case ACTIVATION_GELU_ERF:
        return 0.5f * (1.0f + erff(x * 0.7071067811865476f)) +
               x * 0.3989422804014327f * expf(-0.5f * x * x); /* 1/sqrt(2 pi) */
    case ACTIVATION_SWIGLU_OAI: { /* of the gate's part: 0 above the clamp */
        if (x > ACT_OAI_LIMIT) return 0.0f;
        const float s = 1.0f / (1.0f + expf(-ACT_OAI_ALPHA * x));
        return s * (1.0f + ACT_OAI_ALPHA * x * (1.0f - s));
    }
    }
    return 1.0f;
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
        cpu_activate_rows(po, px, len, act);
        cpu_store_row(out, (size_t)i, len, po);
    }
}

void cpu_activation_backward(struct backend *b, const struct tensor *dx, const struct tensor *dout,
                             const struct tensor *x, enum activation act)
{
    int64_t n = tensor_numel(dx);
    #pragma omp parallel for schedule(static) if (n > CPU_PARALLEL_MIN / 8) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i += ACT_CHUNK) {
        float tx[ACT_CHUNK], tg[ACT_CHUNK];
        size_t len = (size_t)(n - i < ACT_CHUNK ? n - i : ACT_CHUNK);
        const float *px = cpu_load_row(x, (size_t)i, len, tx);
        const float *pg = cpu_load_row(dout, (size_t)i, len, tg);
        float *po = cpu_out_row(dx, (size_t)i, tg); /* dx may alias dout or x: elementwise */
        for (size_t j = 0; j < len; j++) po[j] = pg[j] * cpu_activate_grad(px[j], act);
        cpu_store_row(dx, (size_t)i, len, po);
    }
}
