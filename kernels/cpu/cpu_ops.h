/* kernels/cpu/cpu_ops.h - private to the CPU backend: the per-op entry points (one file per
 * op, each named after it), the backend state, and row helpers that let every op compute in
 * f32 whatever the storage dtype.
 * Not here: contract checks (kernels/ops.c does them once for every backend).
 * Tests: tests/test_ops.c --backend cpu. */
#ifndef SHARDLM_CPU_OPS_H
#define SHARDLM_CPU_OPS_H

#include <omp.h>

#include "ops.h"

/* Backend-private state. The scratch arena grows to the largest request and then stays: ops
 * allocate nothing per call once the largest shape has been seen. */
struct cpu_state {
    float *scratch;       /* (scratch_floats) */
    size_t scratch_floats;
};

/* Returns a scratch area of per_thread floats for each of b->n_threads threads (thread i uses
 * base + i * cpu_scratch_stride(per_thread)). Valid until the next cpu_scratch call; call it
 * outside parallel regions. */
float *cpu_scratch(struct backend *b, size_t per_thread);
static inline size_t cpu_scratch_stride(size_t per_thread) { return (per_thread + 15) & ~(size_t)15; }

/* Row i (length n) of a float tensor as f32: a pointer into the tensor when it is f32,
 * otherwise tmp filled with the converted values. */
static inline const float *cpu_load_row(const struct tensor *t, size_t offset, size_t n, float *tmp)
{
    if (t->dtype == DTYPE_F32) return (const float *)t->data + offset;
    for (size_t i = 0; i < n; i++) tmp[i] = dtype_load_f32(t->data, t->dtype, offset + i);
    return tmp;
}

/* Where an op writes row values in f32: the tensor's memory when it is f32, otherwise tmp,
 * which cpu_store_row then rounds into the tensor. */
static inline float *cpu_out_row(const struct tensor *t, size_t offset, float *tmp)
{
    return t->dtype == DTYPE_F32 ? (float *)t->data + offset : tmp;
}

static inline void cpu_store_row(const struct tensor *t, size_t offset, size_t n, const float *src)
{
    if (t->dtype == DTYPE_F32) return;
    for (size_t i = 0; i < n; i++) dtype_store_f32(t->data, t->dtype, offset + i, src[i]);
}

/* Every parallel region names its team size, num_threads(b->n_threads): OpenMP's default team
 * size is a per-thread setting, and the engine runs ops on its own thread, where the default
 * is every core; the scratch arena is sized for b->n_threads slices. */

/* Minimum elements per OpenMP thread before an elementwise loop is split. */
#define CPU_PARALLEL_MIN 32768

void cpu_cast(struct backend *b, const struct tensor *out, const struct tensor *in);
void cpu_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                   const struct tensor *ids, int64_t vocab_start);
void cpu_position_embedding_add(struct backend *b, const struct tensor *x,
                                const struct tensor *table, const struct tensor *positions);
void cpu_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                const struct tensor *w, const struct tensor *bias);
void cpu_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                 const struct tensor *weight, float eps);
void cpu_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                   const struct tensor *weight, const struct tensor *bias, float eps);
void cpu_add(struct backend *b, const struct tensor *out, const struct tensor *a,
             const struct tensor *c);
void cpu_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);
void cpu_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
              int rot_dim, float theta, enum rope_style style);
void cpu_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                  const struct tensor *k, const struct tensor *v, const struct tensor *slots);
void cpu_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                   const struct tensor *k_cache, const struct tensor *v_cache,
                   const struct attention_batch *batch);
void cpu_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                    enum activation act);
void cpu_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                          const struct tensor *up, enum activation act);
void cpu_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);
void cpu_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);
void cpu_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x);
void cpu_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
              const struct tensor *x);

/* training attention (attention_train.c) */
void cpu_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                         const struct tensor *q, const struct tensor *k, const struct tensor *v,
                         const struct attention_train_batch *batch);
void cpu_attention_train_backward(struct backend *b, const struct tensor *dq,
                                  const struct tensor *dk, const struct tensor *dv,
                                  const struct tensor *dout, const struct tensor *out,
                                  const struct tensor *lse, const struct tensor *q,
                                  const struct tensor *k, const struct tensor *v,
                                  const struct attention_train_batch *batch);

/* Shared by activation.c and gated_activation.c. */
float cpu_activate(float x, enum activation act);

#endif
