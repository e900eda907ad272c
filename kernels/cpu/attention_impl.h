/* kernels/cpu/attention_impl.h - private to op_attention on the CPU (kernels/cpu/attention*.c):
 * the table of inner kernels that each implementation fills (portable C in attention_portable.c,
 * AVX-512 in attention_avx512.c), and the choice of one by CPU features.
 * The kernels work on f32 rows reached through row pointers, so that the caller can hand them
 * K and V rows where they lie in the paged cache (f32) or where it widened them (bf16, f16).
 * Not here: the op itself, its work split and its softmax (attention.c).
 * Tests: tests/test_attention_kernels.c (every implementation against a double reference),
 * tests/test_ops.c (the op through the best implementation). */
#ifndef SHARDLM_ATTENTION_IMPL_H
#define SHARDLM_ATTENTION_IMPL_H

#include <stddef.h>
#include <stdint.h>

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

struct attn_kernels {
    const char        *name;
    attn_scores_fn     scores;
    attn_accumulate_fn accumulate;
    attn_widen_fn      widen;
};

/* Each returns its table, or NULL when the implementation is not compiled for this target (the
 * caller asks the CPU). */
const struct attn_kernels *attn_kernels_portable(void);
const struct attn_kernels *attn_kernels_avx512(void);

/* The fastest table that runs on this CPU (asked once, then remembered). */
const struct attn_kernels *attn_kernels_best(void);

#endif
