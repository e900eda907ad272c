/* kernels/cpu/rope.c - op_rope on the CPU: rotary position embedding in place, pair or
 * half conventions, partial rotation. The frequencies come from the caller's table
 * (rope_frequencies: f32 as the reference implementations, llama2.c and Hugging Face, compute
 * them); angle = pos * freq_i in f32, then cosf and sinf, times attn_factor.
 * The backward rotates by the opposite angles (the same cos, sin negated); with attn_factor a
 * the forward is a times a rotation, so its transpose is a times the inverse rotation.
 * Tests: tests/test_ops.c (rope cases), tests/test_ops_backward.c (rope_backward). */
#include <math.h>

#include "cpu_ops.h"

/* direction +1: the forward rotation; -1: its inverse (the backward). */
static void rope_rotate(struct backend *b, const struct tensor *x, const struct tensor *positions,
                        int rot_dim, const struct rope_params *rp, enum rope_style style, float direction)
{
    int64_t n = x->shape[0], n_heads = x->shape[1], hd = x->shape[2];
    const int32_t *pos = positions->data;
    const float *freqs = rp->freqs;
    int half = rot_dim / 2;
    size_t per = (size_t)hd + 2 * (size_t)half;
    float *scratch = cpu_scratch(b, per);
    #pragma omp parallel for schedule(static) if (n * n_heads * hd > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t t = 0; t < n; t++) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        float *cs = tmp + hd, *sn = cs + half;
        for (int i = 0; i < half; i++) {
            float angle = (float)pos[t] * freqs[i];
            cs[i] = rp->attn_factor * cosf(angle);
            sn[i] = rp->attn_factor * direction * sinf(angle);
        }
        for (int64_t h = 0; h < n_heads; h++) {
            size_t off = (size_t)((t * n_heads + h) * hd);
            float *v = (float *)cpu_load_row(x, off, (size_t)hd, tmp); /* in place when f32 */
            for (int i = 0; i < half; i++) {
                int i0 = style == ROPE_STYLE_PAIRS ? 2 * i : i;
                int i1 = style == ROPE_STYLE_PAIRS ? 2 * i + 1 : i + half;
                float a = v[i0], c = v[i1];
                v[i0] = a * cs[i] - c * sn[i];
                v[i1] = a * sn[i] + c * cs[i];
            }
            cpu_store_row(x, off, (size_t)hd, v);
        }
    }
}

void cpu_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
              int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    rope_rotate(b, x, positions, rot_dim, rp, style, 1.0f);
}

void cpu_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                       int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    rope_rotate(b, dx, positions, rot_dim, rp, style, -1.0f);
}
