/* kernels/base/fastexp.h - e^x as plain float arithmetic, for loops that must vectorise.
 * Tests: tests/test_ops.c (the activations and attention against float64), tests/test_sampler.c
 * (sampler_exp's ulp error). */
#ifndef SHARDLM_FASTEXP_H
#define SHARDLM_FASTEXP_H

#include <stdint.h>
#include <string.h>

/* e^x in plain arithmetic that GCC and clang vectorise (libm's expf and tanhf are calls per
 * element, which cost a twentieth of a Gemma decode step in the activations): x clamped to
 * [-87, 88], n = round(x log2 e) through the 1.5 * 2^23 trick, r = x - n ln 2 in two parts
 * (Cody-Waite), e^r by Cephes' degree-7 polynomial, 2^n built in the exponent bits. Relative
 * error about 2e-7 (tests/test_ops.c checks the activations and attention against float64).
 * A NaN x gives NaN. Used by the CPU activations and attention's softmax (cpu_exp) and the
 * sampler's weights and log-softmax (engine/serving/sampler.c sampler_exp). */
static inline float base_exp(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float z = x * 1.44269504088896341f + 12582912.0f;
    const float n = z - 12582912.0f;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t zi;
    memcpy(&zi, &z, sizeof zi);
    /* n + 127 in the exponent field; unsigned, so that a NaN x (whose z holds any bits: the
     * result is NaN through p) is no signed overflow */
    const uint32_t bits = (zi - 0x4B400000u + 127u) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
