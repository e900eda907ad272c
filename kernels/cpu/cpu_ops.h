/* kernels/cpu/cpu_ops.h - private to the CPU backend: the per-op entry points (one file per
 * op, each named after it), the backend state, and row helpers that let every op compute in
 * f32 whatever the storage dtype.
 * Not here: contract checks (kernels/ops.c does them once for every backend).
 * Tests: tests/test_ops.c --backend cpu. */
#ifndef SHARDLM_CPU_OPS_H
#define SHARDLM_CPU_OPS_H

#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "fastexp.h"
#include "ops.h"

/* Backend-private state. The scratch arena grows to the largest request and then stays: ops
 * allocate nothing per call once the largest shape has been seen. */
struct cpu_graph;
struct cpu_state {
    float *scratch;       /* (scratch_floats) */
    size_t scratch_floats;
    struct cpu_graph *graph; /* the graph being recorded (graph.c), or NULL */
};

/* The graph slots (graph.c; ops.h backend_graph_*). */
enum status cpu_graph_begin(struct backend *b);
enum status cpu_graph_end(struct backend *b, void **graph);
enum status cpu_graph_launch(struct backend *b, void *graph);
void        cpu_graph_free(struct backend *b, void *graph);

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

/* AMX-BF16 tile products (amx.c; whether they are on: cpu_amx_enabled, ops.h). x is packed
 * with cpu_amx_pack_x into cpu_amx_x_elems(m, k) bf16 (k a multiple of 32), group h of 16 rows
 * per call; w is bf16 rows (ldw apart) of which (nb + 15) / 16 * 16 are readable; cpu_amx_gemm
 * writes y (m rows, ldy apart) columns 0 .. nb = x @ w^T. cpu_amx_round_rows: n (a multiple of
 * 32) floats to bf16. */
/* The path the f32 one-row product (gemv.c) and the activation rows (activation.c) take at
 * cpu_isa(): "avx512", "avx2" or "baseline" (cpu_isa.c logs them). */
const char *cpu_gemv_path(void);
/* Rows of w per pass over x in that gemv: 1 or 8 (SHARDLM_CPU_GEMV_ROWS, else 1 on AMD). */
int         cpu_gemv_rows_per_pass(void);
/* Vector width of that gemv on AVX-512 CPUs: 256 or 512 (SHARDLM_CPU_GEMV_BITS, else 256 on AMD). */
int         cpu_gemv_bits(void);
/* 1 when that gemv reads weights of dtype dt in place: f32, and bf16 / f16 where the kernel taken
 * widens them in registers (AVX2 one row at a time, AVX-512 either way); else a decode widens
 * blocks of rows into scratch first. */
int         cpu_gemv_reads(enum dtype dt);
/* The gemv (gemv.c): y[j] = w_rows[j] . x for j < nb (rows of k), by the kernel cpu_gemv_path
 * names. _typed: w_rows of dtype dt (cpu_gemv_reads(dt)), wf nb * k floats of scratch for rows a
 * kernel widens (half precision only; NULL for f32). */
void        cpu_gemv_rows(float *y, const float *w_rows, const float *x, int64_t nb, int64_t k);
void        cpu_gemv_rows_typed(float *y, const void *w_rows, enum dtype dt, const float *x, int64_t nb, int64_t k,
                                float *wf);
/* Rows of x from which a block-quantized product dequantizes tiles for sgemm instead of int8 dot
 * products (matmul.c: 32, or SHARDLM_CPU_QUANT_SGEMM_MIN_M). */
int         cpu_quant_sgemm_min_m(void);
/* 1 when weights packed eight rows at a time take the int8 products at every row count (a CPU
 * with VNNI and no SHARDLM_CPU_QUANT_SGEMM_MIN_M: matmul.c). */
int         cpu_quant_int8_packed(void);
/* Rows of x from which such packed weights take the AMX tiles where AMX is on (matmul.c: 96, or
 * SHARDLM_CPU_AMX_PACKED_MIN_M). */
int         cpu_quant_amx_packed_min_m(void);
const char *cpu_activation_path(void);

/* vdpbf16ps products for bf16 w (bf16_dot.c; AVX512-BF16 without AMX tiles in use), x rounded to
 * bf16: cpu_bf16_dot_round_x writes m rows of (k rounded up to even) bf16, cpu_bf16_dot_pack_w
 * packs nb rows of w (ldw apart) into cpu_bf16_dot_w_elems(nb, k), cpu_bf16_dot_gemm writes y
 * (m rows, ldy apart) columns 0 .. nb. cpu_bf16_dot_enabled: supported and not turned off
 * (SHARDLM_CPU_BF16_DOT=0; matmul.c). */
int    cpu_bf16_dot_supported(void);
int    cpu_bf16_dot_enabled(void);
size_t cpu_bf16_dot_x_elems(int64_t m, int64_t k);
void   cpu_bf16_dot_round_x(uint16_t *xb, const float *x, int64_t m, int64_t k);
size_t cpu_bf16_dot_w_elems(int64_t nb, int64_t k);
void   cpu_bf16_dot_pack_w(uint16_t *wp, const uint16_t *w, int64_t ldw, int64_t nb, int64_t k);
void   cpu_bf16_dot_gemm(float *y, int64_t ldy, const uint16_t *xb, const uint16_t *wp, int64_t m, int64_t nb,
                         int64_t k);

size_t cpu_amx_x_elems(int64_t m, int64_t k);
void   cpu_amx_pack_x(uint16_t *xv, const float *x, int64_t m, int64_t k, int64_t h, uint16_t *tmp);
void   cpu_amx_round_rows(uint16_t *dst, const float *src, int64_t n);
void   cpu_amx_gemm(float *y, int64_t ldy, const uint16_t *xv, const uint16_t *w, int64_t ldw,
                    int64_t m, int64_t nb, int64_t k);

/* e^x in plain arithmetic that vectorises: kernels/base/fastexp.h (used by the activations and
 * attention's softmax). */
static inline float cpu_exp(float x) { return base_exp(x); }

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
void cpu_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out,
                    const struct tensor *a, const struct tensor *c, const struct tensor *weight, float eps);
void cpu_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                   const struct tensor *weight, const struct tensor *bias, float eps);
void cpu_add(struct backend *b, const struct tensor *out, const struct tensor *a,
             const struct tensor *c);
void cpu_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);
void cpu_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap);
void cpu_scatter_add_weighted(struct backend *b, const struct tensor *out, const struct tensor *y,
                              const struct tensor *ids, const struct tensor *weights);
void cpu_scatter_add_weighted_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                       const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                       const struct tensor *weights);
void cpu_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key, int64_t col0,
                 float p);
void cpu_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
              int rot_dim, const struct rope_params *rp, enum rope_style style);
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
void cpu_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                    const struct tensor *inv_temp);
void cpu_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                   const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                   const struct tensor *u);
void cpu_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows,
                   const struct tensor *ids, const struct tensor *vals);
void cpu_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows,
                   const struct tensor *mask);
void cpu_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x,
                  const struct tensor *want);
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
void cpu_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                  const struct tensor *out, const struct tensor *lse, const struct tensor *sinks);

/* Shared by activation.c and gated_activation.c. */
/* Backward ops and the optimizer: each beside its forward in the forward's file, except the
 * three of cross_entropy.c, and adamw.c, sum_squares.c. */
void cpu_embedding_backward(struct backend *b, const struct tensor *dtable,
                            const struct tensor *dout, const struct tensor *ids,
                            int64_t vocab_start);
void cpu_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                         const struct tensor *dx, const struct tensor *positions);
void cpu_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                         const struct tensor *dbias, const struct tensor *dy,
                         const struct tensor *x, const struct tensor *w, int accumulate_dx);
void cpu_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                          const struct tensor *dout, const struct tensor *x,
                          const struct tensor *weight, float eps);
void cpu_layernorm_backward(struct backend *b, const struct tensor *dx,
                            const struct tensor *dweight, const struct tensor *dbias,
                            const struct tensor *dout, const struct tensor *x,
                            const struct tensor *weight, float eps);
void cpu_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                       int rot_dim, const struct rope_params *rp, enum rope_style style);
void cpu_activation_backward(struct backend *b, const struct tensor *dx, const struct tensor *dout,
                             const struct tensor *x, enum activation act);
void cpu_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                   const struct tensor *dup, const struct tensor *dout,
                                   const struct tensor *gate, const struct tensor *up,
                                   enum activation act);
void cpu_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                             const struct tensor *w, const struct tensor *targets,
                             int64_t vocab_start, float softcap);
void cpu_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                               const struct tensor *lse, const struct tensor *stats,
                               const struct tensor *targets);
void cpu_cross_entropy_backward(struct backend *b, const struct tensor *dh, const struct tensor *dw,
                                const struct tensor *h, const struct tensor *w,
                                const struct tensor *targets, const struct tensor *lse,
                                const struct tensor *row_scale, float scale, int64_t vocab_start,
                                int accumulate_dh, float softcap);
void cpu_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
               const struct tensor *m, const struct tensor *v, const struct adamw_params *hp);
void cpu_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x);

/* ACTIVATION_SWIGLU_OAI's constants (GPT-OSS: transformers' GptOssExperts, llama.cpp's swiglu_oai). */
#define ACT_OAI_ALPHA 1.702f
#define ACT_OAI_LIMIT 7.0f
/* Up's part of ACTIVATION_SWIGLU_OAI: clamp(u, -7, 7) + 1 (other activations: u). */
static inline float cpu_gated_up(float u, enum activation act)
{
    if (act != ACTIVATION_SWIGLU_OAI) return u;
    return (u < -ACT_OAI_LIMIT ? -ACT_OAI_LIMIT : u > ACT_OAI_LIMIT ? ACT_OAI_LIMIT : u) + 1.0f;
}

/* Shared by activation.c and gated_activation.c: the activation and its derivative (of the
 * gate's part, for ACTIVATION_SWIGLU_OAI). */
float cpu_activate(float x, enum activation act);
/* out[j] = act(x[j]) for j < len, vectorised (activation.c); out may alias x. */
void  cpu_activate_rows(float *out, const float *x, size_t len, enum activation act);
float cpu_activate_grad(float x, enum activation act);

/* Shared by embedding.c and position_embedding_add.c: dst[idx[i] - offset, :] += src[i, :] for
 * the rows inside dst (others skipped). Threads split the columns and each walks the rows in
 * order, so the sums are deterministic and no element has two writers. */
void cpu_scatter_add_rows(struct backend *b, const struct tensor *dst, const struct tensor *src,
                          const int32_t *idx, int64_t offset);

/* Shared by rmsnorm.c and layernorm.c: g (d) += the sum, in thread order, of the nt per-thread
 * partial sums acc + t * stride (d floats each). */
void cpu_add_partials(const struct tensor *g, const float *acc, int nt, size_t stride, int64_t d);

/* Shared by matmul.c and cross_entropy.c: rows [r0, r0 + nr) of a float tensor of `cols`
 * columns converted to f32 (dst, nr x cols) or back from f32 (one rounding), split across
 * threads by rows. */
void cpu_rows_to_f32(struct backend *b, float *dst, const struct tensor *t, int64_t r0, int64_t nr,
                     int64_t cols);
void cpu_rows_from_f32(struct backend *b, const struct tensor *t, const float *src, int64_t r0,
                       int64_t nr, int64_t cols);

/* Shared by matmul.c and cross_entropy.c: the f32 products, split across the backend's threads
 * (each calling a single-threaded OpenBLAS), all row-major with leading dimensions:
 *   cpu_gemm_nt: c (m, n) = beta c + a (m, k) @ b (n, k)^T, threads split n
 *   cpu_gemm_nn: c (m, n) = beta c + a (m, k) @ b (k, n),   threads split n
 *   cpu_gemm_tn: c (m, n) = beta c + a (k, m)^T @ b (k, n), threads split m */
void cpu_gemm_nt(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc);
void cpu_gemm_nn(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc);
void cpu_gemm_tn(struct backend *b, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                 const float *bm, int64_t ldb, float beta, float *c, int64_t ldc);

#endif
