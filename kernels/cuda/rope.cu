/* kernels/cuda/rope.cu - op_rope: rotary position embedding in place on (n, n_heads,
 * head_dim), pair or half conventions, the first rot_dim features of each head rotated.
 * Angles follow the CPU reference (kernels/cpu/rope.c) formula for formula, in f32: the
 * caller's frequency table (rope_frequencies, computed once on the host: the CPU's very bits,
 * passed to the kernel by value, so a launch reads nothing but x and the positions),
 * angle = pos * freq_i, then cos and sin (times attn_factor).
 * Not here: where positions come from (engine/), learned positions (position_embedding_add.cu).
 * The backward rotates the gradient by the opposite angles (direction -1: sin negated).
 * Tests: tests/test_ops.c --backend cuda (both styles, partial rotation, large positions);
 * tests/test_ops_backward.c --backend cuda (rope_backward). */
#include <string.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

/* One thread per (token t, pair i, slice hs of the heads): heads hs, hs + hsplit, ... The
 * angle is computed per thread as on the CPU (every thread of a (t, i) gets the same bits),
 * and each pair is read and written by one thread only, so the update is in place without
 * hazards. hsplit (the launch picks it) spreads a decode step's few rows over the heads: one
 * thread looping over 32 heads waited for 32 dependent loads in turn (12 us a call on an
 * H200, 2026-12-04), where 32 threads wait for one each.
 * cos and sin are evaluated in double and rounded to f32: that is the correctly rounded f32
 * value, which is what the CPU's libm cosf/sinf return (within 1 ulp), whereas CUDA's f32 ones
 * may be further off. The product pos * freq stays f32, as on the CPU. (Until 2026-12-06 each
 * thread also computed theta^(-2i/rot_dim) with a double pow: now the host's powf bits, in the
 * table.) */
struct rope_table {
    float freq[ROPE_MAX_PAIRS];
};

template <typename T>
static __global__ void rope_kernel(T *x, const int32_t *positions, int64_t n, int64_t n_heads,
                                   int64_t head_dim, int rot_dim, const struct rope_table freqs,
                                   float attn_factor, int pairs_style, float direction, int hsplit,
                                   T *x2, int64_t n_heads2)
{
    /* x2 (n, n_heads2, head_dim), NULL or not: more heads of the same rows (op_rope_qk's k), heads
     * n_heads .. n_heads + n_heads2 - 1 of the loop below, with the same angles. */
    int half = rot_dim / 2;
    int64_t total = n * half * hsplit;
    for (int64_t w = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; w < total;
         w += (int64_t)gridDim.x * blockDim.x) {
        int i = (int)(w % half);
        int hs = (int)((w / half) % hsplit);
        int64_t t = w / ((int64_t)half * hsplit);
        float angle = (float)positions[t] * freqs.freq[i];
        float c = attn_factor * (float)cos((double)angle), sn = attn_factor * direction * (float)sin((double)angle);
        int i0 = pairs_style ? 2 * i : i;
        int i1 = pairs_style ? 2 * i + 1 : i + half;
        for (int64_t h = hs; h < n_heads + n_heads2; h += hsplit) {
            T *v = h < n_heads ? x + (t * n_heads + h) * head_dim : x2 + (t * n_heads2 + h - n_heads) * head_dim;
            float a = cuda_load(v + i0), b = cuda_load(v + i1);
            cuda_store(v + i0, a * c - b * sn);
            cuda_store(v + i1, a * sn + b * c);
        }
    }
}

/* Threads a rope launch aims at before it stops splitting the heads (about a quarter of what an
 * H100 holds resident): prefill's many rows keep one thread per pair, the angle computed once
 * for all heads, while a decode step spreads its few rows over the heads. */
#define ROPE_SPLIT_TARGET_THREADS 65536

/* x (n, n_heads, head_dim), positions i32 (n); rot_dim even, <= head_dim; direction +1 the
 * rotation, -1 its inverse. x2 NULL, or more heads of the same rows (op_rope_qk). */
static void rope_launch(struct backend *b, const struct tensor *x, const struct tensor *positions,
                        int rot_dim, const struct rope_params *rp, enum rope_style style, float direction,
                        const struct tensor *x2)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = x->shape[0], n_heads = x->shape[1], head_dim = x->shape[2], n_heads2 = x2 ? x2->shape[1] : 0;
    int64_t pairs = n * (rot_dim / 2);
    if (pairs == 0 || n_heads + n_heads2 == 0) return;
    int64_t hsplit = ROPE_SPLIT_TARGET_THREADS / pairs;
    if (hsplit > n_heads + n_heads2) hsplit = n_heads + n_heads2;
    if (hsplit < 1) hsplit = 1;
    struct rope_table table; /* (1 KB of kernel parameters; check_rope bounds rot_dim / 2) */
    memset(&table, 0, sizeof table);
    memcpy(table.freq, rp->freqs, (size_t)(rot_dim / 2) * sizeof *table.freq);
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        rope_kernel<T><<<cuda_blocks_for(pairs * hsplit, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)x->data, (const int32_t *)positions->data, n, n_heads, head_dim, rot_dim, table, rp->attn_factor, style == ROPE_STYLE_PAIRS,
            direction, (int)hsplit, x2 ? (T *)x2->data : (T *)NULL, n_heads2);
        LAUNCH_CHECK());
}

void cuda_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
               int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    rope_launch(b, x, positions, rot_dim, rp, style, 1.0f, NULL);
}

/* q and k in one launch: k's heads follow q's in the kernel's head loop. */
void cuda_rope_qk(struct backend *b, const struct tensor *q, const struct tensor *k, const struct tensor *positions,
                  int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    rope_launch(b, q, positions, rot_dim, rp, style, 1.0f, k);
}

/* dx (n, n_heads, head_dim), in place. */
void cuda_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                        int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    rope_launch(b, dx, positions, rot_dim, rp, style, -1.0f, NULL);
}
