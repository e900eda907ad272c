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
void cuda_matmul_many(struct backend *b, int count, const struct tensor *const *y, const struct tensor *x,
                      const struct tensor *const *w, const struct tensor *const *bias);
void cuda_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, float eps);
void cuda_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out,
                     const struct tensor *a, const struct tensor *c, const struct tensor *weight, float eps);
void cuda_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                    const struct tensor *weight, const struct tensor *bias, float eps);
void cuda_add(struct backend *b, const struct tensor *out, const struct tensor *a,
              const struct tensor *c);
void cuda_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);
void cuda_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap);
void cuda_scatter_add_weighted(struct backend *b, const struct tensor *out, const struct tensor *y,
                               const struct tensor *ids, const struct tensor *weights);
void cuda_scatter_add_weighted_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                        const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                        const struct tensor *weights);
void cuda_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key, int64_t col0,
                  float p);
void cuda_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
               int rot_dim, const struct rope_params *rp, enum rope_style style);
void cuda_rope_qk(struct backend *b, const struct tensor *q, const struct tensor *k, const struct tensor *positions,
                  int rot_dim, const struct rope_params *rp, enum rope_style style);
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
void cuda_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                     const struct tensor *inv_temp);
void cuda_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                    const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                    const struct tensor *u);
void cuda_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows,
                    const struct tensor *ids, const struct tensor *vals);
void cuda_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows,
                    const struct tensor *mask);
void cuda_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x,
                   const struct tensor *want);
void cuda_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
               const struct tensor *x);

/* training attention (attention_train.cu) */
void cuda_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                          const struct tensor *q, const struct tensor *k, const struct tensor *v,
                          const struct attention_train_batch *batch);
void cuda_attention_train_backward(struct backend *b, const struct tensor *dq,
                                   const struct tensor *dk, const struct tensor *dv,
                                   const struct tensor *dout, const struct tensor *out,
                                   const struct tensor *lse, const struct tensor *q,
                                   const struct tensor *k, const struct tensor *v,
                                   const struct attention_train_batch *batch);
void cuda_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                   const struct tensor *out, const struct tensor *lse, const struct tensor *sinks);
/* Backward ops and the optimizer: each beside its forward in the forward's .cu file, except
 * cross_entropy.cu, adamw.cu and sum_squares.cu. */
void cuda_embedding_backward(struct backend *b, const struct tensor *dtable,
                             const struct tensor *dout, const struct tensor *ids,
                             int64_t vocab_start);
void cuda_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                          const struct tensor *dx, const struct tensor *positions);
void cuda_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                          const struct tensor *dbias, const struct tensor *dy,
                          const struct tensor *x, const struct tensor *w, int accumulate_dx);
void cuda_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                           const struct tensor *dout, const struct tensor *x,
                           const struct tensor *weight, float eps);
void cuda_layernorm_backward(struct backend *b, const struct tensor *dx,
                             const struct tensor *dweight, const struct tensor *dbias,
                             const struct tensor *dout, const struct tensor *x,
                             const struct tensor *weight, float eps);
void cuda_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                        int rot_dim, const struct rope_params *rp, enum rope_style style);
void cuda_activation_backward(struct backend *b, const struct tensor *dx,
                              const struct tensor *dout, const struct tensor *x,
                              enum activation act);
void cuda_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                    const struct tensor *dup, const struct tensor *dout,
                                    const struct tensor *gate, const struct tensor *up,
                                    enum activation act);
void cuda_cross_entropy_stats(struct backend *b, const struct tensor *stats,
                              const struct tensor *h, const struct tensor *w,
                              const struct tensor *targets, int64_t vocab_start, float softcap);
void cuda_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                                const struct tensor *lse, const struct tensor *stats,
                                const struct tensor *targets);
void cuda_cross_entropy_backward(struct backend *b, const struct tensor *dh,
                                 const struct tensor *dw, const struct tensor *h,
                                 const struct tensor *w, const struct tensor *targets,
                                 const struct tensor *lse, const struct tensor *row_scale,
                                 float scale, int64_t vocab_start, int accumulate_dh, float softcap);
void cuda_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
                const struct tensor *m, const struct tensor *v, const struct adamw_params *hp);
void cuda_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x);

/* Block-quantized weights (a DTYPE_Q* w or table, kernels/quant.h), dequantized inside the
 * kernels bit-exactly with the CPU (quant_blocks.cuh): cuda_matmul and cuda_embedding hand them
 * on to these. x, y, bias and out may be f32, bf16 or f16; arithmetic in f32, one rounding on
 * store. */
void cuda_matmul_quant(struct backend *b, const struct tensor *y, const struct tensor *x,
                       const struct tensor *w, const struct tensor *bias);   /* matmul_quant.cu */
void cuda_embedding_quant(struct backend *b, const struct tensor *out, const struct tensor *table,
                          const struct tensor *ids, int64_t vocab_start);   /* embedding.cu */

/* Shared by embedding.cu and position_embedding_add.cu: dst[idx[i] - offset, :] += src[i, :]
 * with atomics, skipping rows outside dst, or (check_range) stopping the kernel on them. */
void cuda_scatter_add_rows(struct backend *b, const struct tensor *dst, const struct tensor *src,
                           const int32_t *idx, int64_t offset, int check_range);

/* matmul.cu's cuBLAS product for the other files (cross_entropy.cu), all row-major:
 * c (m, n) = op(a) @ op(b) + beta c, where op(a) (m, k) is a with row stride lda, or, with
 * trans_a, the transpose of a stored (k, m); op(b) (k, n) is b with row stride ldb, or, with
 * trans_b, the transpose of b stored (n, k). a and b share ab_dtype; c is f32 or ab_dtype.
 * f32 accumulation (no TF32), queued on the backend's stream. With beta != 0 and a bf16/f16 c,
 * cuBLAS rounds the product to c's type before adding beta c (seen on H100: two roundings, and
 * a sum that cancels comes out 0), so the product goes to tmp (f32, tmp_floats >= n, a block
 * of rows at a time) and a kernel adds it into c with one rounding; tmp may be NULL otherwise.
 * CUDA_GEMM_TMP_FLOATS is the size callers give. */
#define CUDA_GEMM_TMP_FLOATS ((int64_t)1 << 22)
void cuda_gemm(struct cuda_state *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
               const void *a, int64_t lda, const void *bm, int64_t ldb, enum dtype ab_dtype,
               float beta, void *c, int64_t ldc, enum dtype c_dtype, float *tmp, int64_t tmp_floats);

#endif
