/* tests/quant_fill.h - random ggml weight blocks for the tests of the CUDA block kernels
 * (tests/test_ops_quant.c, tests/test_quant_blocks.cu) and of the CPU product (tests/test_quant.c): random quants, and f16 scales either
 * random bits (every pattern: subnormal, Inf, NaN) or small and finite, so that weights are
 * O(0.1 .. 1), as in tests/test_quant.c; MXFP4's E8M0 scale byte likewise (raw: any of 0..255,
 * 2^-128 .. 2^127; else 118 .. 124, 2^-10 .. 2^-4). Header-only, C and C++ (nvcc), no state of its own:
 * the caller passes a splitmix64 state.
 * Not here: the reference dequantizer (kernels/quant.h's quant_dequantize_row). */
#ifndef SHARDLM_TESTS_QUANT_FILL_H
#define SHARDLM_TESTS_QUANT_FILL_H

#include <math.h>
#include <stdint.h>

#include "quant.h"
#include "tensor.h"

static inline uint64_t qfill_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A finite f16 of random sign and magnitude 10^[lo, hi). */
static inline uint16_t qfill_f16(uint64_t *s, double lo, double hi)
{
    const double u = (double)(qfill_next(s) >> 11) * 0x1p-53;
    const double v = pow(10.0, lo + (hi - lo) * u);
    return f32_to_f16((float)(qfill_next(s) & 1 ? -v : v));
}

static inline void qfill_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* nblocks blocks of type t at w: random bytes; unless raw, the f16 (MXFP4: E8M0) scale fields
 * are then made small and finite. */
static inline void qfill_blocks(enum quant_type t, uint8_t *w, int64_t nblocks, int raw, uint64_t *s)
{
    const size_t bb = quant_block_bytes(t);
    for (size_t i = 0; i < (size_t)nblocks * bb; i++) w[i] = (uint8_t)(qfill_next(s) >> 32);
    if (raw) return;
    for (int64_t b = 0; b < nblocks; b++) {
        uint8_t *p = w + (size_t)b * bb;
        switch (t) {
        case QUANT_TYPE_Q8_0: qfill_put16(p, qfill_f16(s, -3, -2)); break;
        case QUANT_TYPE_Q4_0: case QUANT_TYPE_Q5_0: qfill_put16(p, qfill_f16(s, -2.5, -1)); break;
        case QUANT_TYPE_Q4_1: case QUANT_TYPE_Q5_1:
            qfill_put16(p, qfill_f16(s, -2.5, -1));
            qfill_put16(p + 2, qfill_f16(s, -2, 0));
            break;
        case QUANT_TYPE_Q4_K: case QUANT_TYPE_Q5_K:
            qfill_put16(p, qfill_f16(s, -4, -2.5));
            qfill_put16(p + 2, qfill_f16(s, -4, -2.5));
            break;
        case QUANT_TYPE_Q6_K: qfill_put16(p + 208, qfill_f16(s, -4, -3)); break;
        case QUANT_TYPE_Q2_K:
            qfill_put16(p + 80, qfill_f16(s, -3, -1.5));
            qfill_put16(p + 82, qfill_f16(s, -3, -1.5));
            break;
        case QUANT_TYPE_Q3_K: qfill_put16(p + 108, qfill_f16(s, -3.5, -2)); break;
        case QUANT_TYPE_IQ4_NL: qfill_put16(p, qfill_f16(s, -3, -2)); break;
        case QUANT_TYPE_IQ4_XS: qfill_put16(p, qfill_f16(s, -4.5, -3)); break;
        case QUANT_TYPE_MXFP4: p[0] = (uint8_t)(118 + qfill_next(s) % 7); break;
        }
    }
}

/* The block types, in the order the tests iterate them. */
static const enum quant_type qfill_types[] = {
    QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1, QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1,
    QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q5_K, QUANT_TYPE_Q6_K,
    QUANT_TYPE_Q2_K, QUANT_TYPE_Q3_K, QUANT_TYPE_IQ4_NL, QUANT_TYPE_IQ4_XS,
    QUANT_TYPE_MXFP4,
};
#define QFILL_N_TYPES (int)(sizeof qfill_types / sizeof qfill_types[0])

#endif
