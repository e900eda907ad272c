/* kernels/cpu/attention_impl.h - private to op_attention on the CPU (kernels/cpu/attention*.c):
 * the table of inner kernels that each implementation fills (portable C in attention_portable.c,
 * AVX2 in attention_avx2.c, AVX-512 in attention_avx512.c), and the choice of one by CPU features.
 * The kernels work on f32 rows reached through row pointers, so that the caller can hand them
 * K and V rows where they lie in the paged cache (f32) or where it widened them (bf16, f16).
 * Not here: the op itself, its work split and its softmax (attention.c).
 * Tests: tests/test_attention_kernels.c (every implementation against a double reference),
 * tests/test_ops.c (the op through the best implementation). */
#ifndef SHARDLM_ATTENTION_IMPL_H
#define SHARDLM_ATTENTION_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_ops.h"
#include "tensor.h"

/* Scores of gn query vectors against nk keys:
 *   s[g * lds + i] = sum_d q[g * hd + d] * k[i][d]   for g < gn, i < nk,
 * q (gn, hd) contiguous, k nk row pointers of hd floats each, s (gn, lds) with lds >= nk. Each
 * key row is loaded once for all gn queries (the query heads of a KV group share it). */
typedef void (*attn_scores_fn)(const float *q, int gn, int hd, const float *const *k, int nk,
                               float *s, int lds);

/* Weighted sum of nk value rows into gn accumulators:
 *   acc[g * hd + d] += sum_i p[g * ldp + i] * v[i][d]   for g < gn, d < hd,
 * acc (gn, hd) contiguous, p (gn, ldp) with ldp >= nk, v nk row pointers of hd floats each. */
typedef void (*attn_accumulate_fn)(float *acc, int gn, int hd, const float *p, int ldp,
                                   const float *const *v, int nk);

/* dst (n) = src (n) widened to f32, exactly; t is DTYPE_BF16 or DTYPE_F16. */
typedef void (*attn_widen_fn)(float *dst, const uint16_t *src, enum dtype t, size_t n);

/* The online softmax's two passes over n >= 1 scores: the max of m and s[0..n), and
 * s[i] = e^(s[i] - m) (cpu_exp) for i < n with their sum returned. */
typedef float (*attn_max_fn)(const float *s, int n, float m);
typedef float (*attn_exp_sum_fn)(float *s, int n, float m);

struct attn_kernels {
    const char        *name;
    attn_scores_fn     scores;
    attn_accumulate_fn accumulate;
    attn_widen_fn      widen;
    attn_max_fn        max;
    attn_exp_sum_fn    exp_sum;
};

/* The bodies of max and exp_sum, written for the compiler to vectorise without pragmas (clang
 * refuses, under -Werror, an `omp simd` loop it cannot vectorise): eight partial results that
 * the compiler keeps in one vector, combined at the end. Each implementation wraps them in a
 * function built for its own instruction set; the order of the sum is fixed (the same in every
 * implementation), the exponentials differ by vector width only in rounding. */
__attribute__((always_inline)) static inline float attn_max_body(const float *s, int n, float m)
{
    float part[8];
    for (int j = 0; j < 8; j++) part[j] = m;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] = s[i + j] > part[j] ? s[i + j] : part[j];
    for (int j = 0; j < 8; j++) m = part[j] > m ? part[j] : m;
    for (; i < n; i++) m = s[i] > m ? s[i] : m;
    return m;
}

__attribute__((always_inline)) static inline float attn_exp_sum_body(float *s, int n, float m)
{
    for (int i = 0; i < n; i++) s[i] = cpu_exp(s[i] - m);
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, sum = 0.0f;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) part[j] += s[i + j];
    for (int j = 0; j < 8; j++) sum += part[j];
    for (; i < n; i++) sum += s[i];
    return sum;
}

/* The table's max and exp_sum entries for one instruction set: ATTN_SOFTMAX_FNS(avx2,
 * __attribute__((target("avx2,fma")))) defines max_avx2 and exp_sum_avx2. */
#define ATTN_SOFTMAX_FNS(suffix, attr)                                                             \
    attr static float max_##suffix(const float *s, int n, float m) { return attn_max_body(s, n, m); } \
    attr static float exp_sum_##suffix(float *s, int n, float m) { return attn_exp_sum_body(s, n, m); }

/* Each returns its table, or NULL when the implementation is not compiled for this target (the
 * caller asks the CPU). */
const struct attn_kernels *attn_kernels_portable(void);
const struct attn_kernels *attn_kernels_avx2(void);
const struct attn_kernels *attn_kernels_avx512(void);

/* The fastest table that runs on this CPU (asked once, then remembered). */
const struct attn_kernels *attn_kernels_best(void);

#endif
