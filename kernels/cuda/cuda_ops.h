/* kernels/cuda/cuda_ops.h - the CUDA backend's op functions, one per slot of struct
 * backend_ops, each defined in the .cu file named after its op. Private to kernels/cuda/:
 * backend_cuda.cu puts them in the table; the engine reaches them only through ops.h.
 * Contracts (shapes, dtypes, aliasing) are those of the op_* wrappers in ops.h, which have
 * already checked them; every function queues its work on the backend's stream and returns
 * without waiting.
 * Not here: memory ops and open/close (backend_cuda.cu).
 * Tests: tests/test_ops.c --backend cuda. */
#ifndef SHARDLM_CUDA_OPS_H
#define SHARDLM_CUDA_OPS_H

#include "ops.h"

struct cuda_state;

/* matmul.cu owns the cuBLAS handle and the matmul scratch: created (the handle on the state's
 * stream) at open, destroyed at close (accepts a state whose handle or scratch was never
 * created). */
enum status cuda_matmul_init(struct cuda_state *s);
void        cuda_matmul_free(struct cuda_state *s);

void cuda_cast(struct backend *b, const struct tensor *out, const struct tensor *in);
void cuda_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                    const struct tensor *ids, int64_t vocab_start);
void cuda_position_embedding_add(struct backend *b, const struct tensor *x,
                                 const struct tensor *table, const struct tensor *positions);
void cuda_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                 const struct tensor *w, const struct tensor *bias);
void cuda_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, float eps);
void cuda_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                    const struct tensor *weight, const struct tensor *bias, float eps);
void cuda_add(struct backend *b, const struct tensor *out, const struct tensor *a,
              const struct tensor *c);
void cuda_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);
void cuda_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
               int rot_dim, float theta, enum rope_style style);
void cuda_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                   const struct tensor *k, const struct tensor *v, const struct tensor *slots);
void cuda_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                    const struct tensor *k_cache, const struct tensor *v_cache,
                    const struct attention_batch *batch);
void cuda_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                     enum activation act);
void cuda_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                           const struct tensor *up, enum activation act);
void cuda_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);
void cuda_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);
void cuda_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x);
void cuda_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
               const struct tensor *x);

#endif
