/* kernels/ops.h - the one op interface of shardlm. A backend (CPU or CUDA) is a table of
 * functions with identical signatures, chosen at runtime by backend_open(); the engine calls
 * the op_* wrappers below and never names a backend.
 * Not here: models, requests, ranks (engine/), or how a backend does its work (kernels/cpu/,
 * kernels/cuda/).
 * Tests: tests/test_ops.c (CPU against a double-precision reference; CUDA against CPU, label
 * gpu).
 *
 * Contracts shared by every op:
 * - All tensors of a call live on the backend's device; they are dense and row-major.
 * - All floating-point tensors of one call share a dtype (f32, bf16 or f16) unless the op says
 *   otherwise; integer index tensors are i32. Arithmetic is done in f32 whatever the storage
 *   dtype (fp32 accumulation); results are rounded once, on store.
 * - Outputs may alias an input only where the op says so.
 * - Shape mismatches are bugs: the op_* wrappers CHECK them (abort with file:line).
 * - Ops are asynchronous with respect to the host on devices that queue work (CUDA: one stream
 *   per backend); backend_synchronize() waits. With SHARDLM_SYNC_CHECK=1 in the environment,
 *   every op_* call synchronizes and checks for errors, to pin an asynchronous fault to the op
 *   that caused it.
 * - A backend is used by one thread at a time.
 * - The backward of an op joins it as op_<name>_backward, declared beside its forward, with a
 *   matching slot in struct backend_ops. Tests: tests/test_ops_backward.c (finite differences
 *   and a double-precision analytic reference; CUDA against CPU, label gpu).
 *
 * Contracts shared by the backward ops (training):
 * - d<name> is the gradient of the scalar loss with respect to <name>. A backward takes the
 *   gradient of its forward's output (dout, dy) and the forward's inputs as they were.
 * - Gradients of weights (dtable, dw, dweight, dbias) ACCUMULATE, d += ..., so that the
 *   micro-batches of a step add up (zero them with backend_memset_zero when a step begins).
 *   Each is either f32, whatever the dtype of the activations (fp32 gradient accumulation: the
 *   mixed-precision recipe, and the one to use with bf16/f16 activations), or the
 *   activations' dtype; the sum is formed in f32 and rounded once per call and element (the
 *   embedding backwards excepted, see there). A NULL weight gradient is not computed (a frozen
 *   weight).
 * - Gradients of activations (dx, dh, dgate, dup) are written, overwriting what was there,
 *   unless the op takes an accumulate flag. They have the activations' dtype.
 * - The CPU backend is deterministic (for a given thread count); the CUDA backend is too,
 *   except the embedding backwards, which add with atomics.
 */
#ifndef SHARDLM_OPS_H
#define SHARDLM_OPS_H

#include "base.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

enum rope_style {
    ROPE_STYLE_PAIRS,  /* rotate (x[2i], x[2i+1]): llama2.c, Megatron's interleaved rotary */
    ROPE_STYLE_HALVES, /* rotate (x[i], x[i + rot_dim/2]): Hugging Face Llama, GPT-NeoX */
};

/* A rotary embedding: pair i of the first rot_dim features turns by pos * freqs[i] (host memory,
 * rot_dim / 2 values, at most ROPE_MAX_PAIRS: rope_frequencies' table, which a model computes once
 * at load), and the rotated features are multiplied by attn_factor (YaRN's attention factor on cos
 * and sin; 1 otherwise). A backend may pass the table to its kernels by value (CUDA). */
#define ROPE_MAX_PAIRS 256
struct rope_params {
    const float *freqs;
    float        attn_factor;
};

/* freqs[i] = theta^(-2i / rot_dim) / factors[i] for i < rot_dim / 2 (factors NULL: 1; else a rope
 * scaling, linear, llama3 or YaRN, or a GGUF's rope_freqs), in f32 as llama2.c and Hugging Face
 * compute them (powf, then the division). */
void rope_frequencies(float theta, int rot_dim, const float *factors, float *freqs);

enum activation {
    ACTIVATION_SILU,      /* x * sigmoid(x) */
    ACTIVATION_GELU_TANH, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    ACTIVATION_GELU_ERF,  /* 0.5 x (1 + erf(x / sqrt(2))) */
    /* GPT-OSS's clamped SwiGLU, gated only (op_gated_activation; op_activation refuses it):
     * g = min(gate, 7), u = clamp(up, -7, 7), out = g sigmoid(1.702 g) (u + 1). Its backward
     * is 0 through a clamped input (d/dgate where gate > 7, d/dup where |up| > 7). */
    ACTIVATION_SWIGLU_OAI,
};

#include "attention_batch.h" /* struct attention_batch, struct attention_train_batch */

/* Hyperparameters of one AdamW step (op_adamw). */
struct adamw_params {
    float   lr;           /* learning rate of this step (the schedule is the caller's) */
    float   beta1, beta2; /* moment decay rates, e.g. 0.9, 0.95 */
    float   eps;          /* added to sqrt(v_hat) */
    float   weight_decay; /* decoupled: p -= lr * weight_decay * p; 0 for norms and biases */
    int64_t step;         /* 1 for the first step: bias corrections 1 - beta^step */
    float   grad_scale;   /* g is multiplied by this first: 1 / loss_scale, times the clipping
                             factor max_norm / grad_norm when clipping */
};

struct backend;

/* The table a backend fills in. Each slot has the signature of its op_* wrapper without the
 * checks; see the wrappers for the contracts. */
struct backend_ops {
    const char *name;

    /* memory */
    enum status (*alloc)(struct backend *b, size_t nbytes, void **ptr);
    void (*free)(struct backend *b, void *ptr);
    /* backend_host_alloc / backend_host_free; NULL (or host_alloc failing): ordinary aligned host
     * memory, which host_free must then free too */
    enum status (*host_alloc)(struct backend *b, size_t nbytes, void **ptr);
    void (*host_free)(struct backend *b, void *ptr);
    void (*upload)(struct backend *b, void *dst_device, const void *src_host, size_t nbytes);
    void (*download)(struct backend *b, void *dst_host, const void *src_device, size_t nbytes);
    void (*copy)(struct backend *b, void *dst_device, const void *src_device, size_t nbytes);
    void (*memset_zero)(struct backend *b, void *dst_device, size_t nbytes);
    void (*synchronize)(struct backend *b);
    void (*close)(struct backend *b);
    enum status (*mem_info)(struct backend *b, size_t *free_bytes, size_t *total_bytes);

    /* forward ops */
    void (*cast)(struct backend *b, const struct tensor *out, const struct tensor *in);
    void (*embedding)(struct backend *b, const struct tensor *out, const struct tensor *table,
                      const struct tensor *ids, int64_t vocab_start);
    void (*position_embedding_add)(struct backend *b, const struct tensor *x,
                                   const struct tensor *table, const struct tensor *positions);
    void (*matmul)(struct backend *b, const struct tensor *y, const struct tensor *x,
                   const struct tensor *w, const struct tensor *bias);
    /* op_matmul_many; NULL: each product through matmul */
    void (*matmul_many)(struct backend *b, int count, const struct tensor *const *y, const struct tensor *x,
                        const struct tensor *const *w, const struct tensor *const *bias);
    void (*rmsnorm)(struct backend *b, const struct tensor *out, const struct tensor *x,
                    const struct tensor *weight, float eps);
    void (*add_rmsnorm)(struct backend *b, const struct tensor *sum, const struct tensor *out,
                        const struct tensor *a, const struct tensor *c, const struct tensor *weight, float eps);
    void (*layernorm)(struct backend *b, const struct tensor *out, const struct tensor *x,
                      const struct tensor *weight, const struct tensor *bias, float eps);
    void (*add)(struct backend *b, const struct tensor *out, const struct tensor *a,
                const struct tensor *c);
    void (*scale)(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);
    void (*softcap)(struct backend *b, const struct tensor *out, const struct tensor *x, float cap);
    void (*scatter_add_rows)(struct backend *b, const struct tensor *out, const struct tensor *y,
                             const struct tensor *ids, const struct tensor *weights);
    void (*dropout)(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key,
                    int64_t col0, float p);
    void (*rope)(struct backend *b, const struct tensor *x, const struct tensor *positions,
                 int rot_dim, const struct rope_params *rp, enum rope_style style);
    /* op_rope_qk; NULL: rope on each */
    void (*rope_qk)(struct backend *b, const struct tensor *q, const struct tensor *k, const struct tensor *positions,
                    int rot_dim, const struct rope_params *rp, enum rope_style style);
    void (*kv_write)(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                     const struct tensor *k, const struct tensor *v, const struct tensor *slots);
    void (*attention)(struct backend *b, const struct tensor *out, const struct tensor *q,
                      const struct tensor *k_cache, const struct tensor *v_cache,
                      const struct attention_batch *batch);
    void (*activation)(struct backend *b, const struct tensor *out, const struct tensor *x,
                       enum activation act);
    void (*gated_activation)(struct backend *b, const struct tensor *out,
                             const struct tensor *gate, const struct tensor *up,
                             enum activation act);
    void (*softmax)(struct backend *b, const struct tensor *out, const struct tensor *x);
    void (*log_softmax)(struct backend *b, const struct tensor *out, const struct tensor *x);
    void (*argmax)(struct backend *b, const struct tensor *ids, const struct tensor *x);
    void (*topk)(struct backend *b, const struct tensor *values, const struct tensor *ids,
                 const struct tensor *x);
    void (*logit_mass)(struct backend *b, const struct tensor *mass, const struct tensor *x,
                       const struct tensor *inv_temp);
    void (*logit_draw)(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                       const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                       const struct tensor *u);
    void (*logit_edit)(struct backend *b, const struct tensor *x, const struct tensor *rows,
                       const struct tensor *ids, const struct tensor *vals);
    void (*logit_mask)(struct backend *b, const struct tensor *x, const struct tensor *rows,
                       const struct tensor *mask);
    void (*logit_lse)(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want);

    /* training attention (kernels/cpu/attention_train.c, kernels/cuda/attention_train.cu) */
    void (*attention_train)(struct backend *b, const struct tensor *out, const struct tensor *lse,
                            const struct tensor *q, const struct tensor *k,
                            const struct tensor *v, const struct attention_train_batch *batch);
    void (*attention_train_backward)(struct backend *b, const struct tensor *dq,
                                     const struct tensor *dk, const struct tensor *dv,
                                     const struct tensor *dout, const struct tensor *out,
                                     const struct tensor *lse, const struct tensor *q,
                                     const struct tensor *k, const struct tensor *v,
                                     const struct attention_train_batch *batch);
    void (*attention_sinks_backward)(struct backend *b, const struct tensor *dsinks,
                                     const struct tensor *dout, const struct tensor *out,
                                     const struct tensor *lse, const struct tensor *sinks);

    /* backward ops and the optimizer (training) */
    void (*embedding_backward)(struct backend *b, const struct tensor *dtable,
                               const struct tensor *dout, const struct tensor *ids,
                               int64_t vocab_start);
    void (*position_embedding_add_backward)(struct backend *b, const struct tensor *dtable,
                                            const struct tensor *dx,
                                            const struct tensor *positions);
    void (*matmul_backward)(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                            const struct tensor *dbias, const struct tensor *dy,
                            const struct tensor *x, const struct tensor *w, int accumulate_dx);
    void (*rmsnorm_backward)(struct backend *b, const struct tensor *dx,
                             const struct tensor *dweight, const struct tensor *dout,
                             const struct tensor *x, const struct tensor *weight, float eps);
    void (*layernorm_backward)(struct backend *b, const struct tensor *dx,
                               const struct tensor *dweight, const struct tensor *dbias,
                               const struct tensor *dout, const struct tensor *x,
                               const struct tensor *weight, float eps);
    void (*rope_backward)(struct backend *b, const struct tensor *dx,
                          const struct tensor *positions, int rot_dim, const struct rope_params *rp,
                          enum rope_style style);
    void (*activation_backward)(struct backend *b, const struct tensor *dx,
                                const struct tensor *dout, const struct tensor *x,
                                enum activation act);
    void (*gated_activation_backward)(struct backend *b, const struct tensor *dgate,
                                      const struct tensor *dup, const struct tensor *dout,
                                      const struct tensor *gate, const struct tensor *up,
                                      enum activation act);
    void (*cross_entropy_stats)(struct backend *b, const struct tensor *stats,
                                const struct tensor *h, const struct tensor *w,
                                const struct tensor *targets, int64_t vocab_start, float softcap);
    void (*cross_entropy_combine)(struct backend *b, const struct tensor *loss,
                                  const struct tensor *lse, const struct tensor *stats,
                                  const struct tensor *targets);
    void (*cross_entropy_backward)(struct backend *b, const struct tensor *dh,
                                   const struct tensor *dw, const struct tensor *h,
                                   const struct tensor *w, const struct tensor *targets,
                                   const struct tensor *lse, const struct tensor *row_scale,
                                   float scale, int64_t vocab_start, int accumulate_dh, float softcap);
    void (*adamw)(struct backend *b, const struct tensor *p, const struct tensor *g,
                  const struct tensor *m, const struct tensor *v,
                  const struct adamw_params *hp);
    void (*sum_squares)(struct backend *b, const struct tensor *out, const struct tensor *x);
    void (*scatter_add_rows_backward)(struct backend *b, const struct tensor *dy,
                                      const struct tensor *dweights, const struct tensor *dout,
                                      const struct tensor *y, const struct tensor *ids,
                                      const struct tensor *weights);

    /* backend_graph_*; NULL: the backend records no graphs */
    enum status (*graph_begin)(struct backend *b);
    enum status (*graph_end)(struct backend *b, void **graph);
    enum status (*graph_launch)(struct backend *b, void *graph);
    void (*graph_free)(struct backend *b, void *graph);
};

/* An open backend. Fields other than ops are read-only for callers. */
struct backend {
    const struct backend_ops *ops;
    enum device device;
    int         device_id;   /* CUDA ordinal; 0 on CPU */
    int         n_threads;   /* CPU worker threads (OpenMP and OpenBLAS); 0 on CUDA */
    int         sync_check;  /* SHARDLM_SYNC_CHECK=1: synchronize and check after every op */
    int         batch_invariant; /* SHARDLM_BATCH_INVARIANT=1: a product row's result never depends
                                    on how many rows share the call (CPU: block-quantized weights
                                    always take the int8 row products, never the dequantized
                                    tiles or AMX; f32 and half-precision weights take the
                                    row-by-row gemv products, never sgemm; attention computes
                                    every query row as a decode row would, on either of
                                    its paths; docs/determinism.md) */
    int         rows_as_decode; /* set by model_forward for the one step whose batch holds rows
                                   that verify drafts (forward_batch.seq_row_path), cleared after
                                   it: the matrix products take batch_invariant's paths for that
                                   step, so that a verified row gives the bits its decode step
                                   would (CPU: AMX tiles and dequantized tiles left out; attention
                                   reads the per-sequence mark itself) */
    long        n_uploads, n_downloads; /* backend_upload / backend_download calls so far (tests
                                           count a step's host <-> device copies) */
    void       *stream;      /* the queue every op of this backend runs on, in order: CUDA's
                                cudaStream_t (a non-blocking stream); NULL on the CPU. Give it to
                                parallel_groups_init, so that communication queues on it too and
                                is ordered with the ops without any synchronisation */
    void       *impl;        /* backend-private state: handles, streams, workspaces */
};

/* Opens a backend for `device` (device_id selects the GPU; n_threads sets CPU threads, 0 =
 * all cores). Returns STATUS_UNAVAILABLE with a message when the backend was not built or no
 * device is present. On success *out is owned by the caller; free with backend_close. */
enum status backend_open(enum device device, int device_id, int n_threads, struct backend **out);
void        backend_close(struct backend *b); /* accepts NULL */
/* Whether this build contains the CUDA backend (it may still find no GPU at runtime). */
int         backend_cuda_compiled(void);
/* The CPU backend's matrix products on AMX tiles (kernels/cpu/amx.c): x rounded to bf16, w bf16
 * or blocks dequantized and rounded to bf16, sums in f32; used for bf16 w, and for block w
 * from 32 rows of x, where the CPU has AMX-BF16. cpu_amx_enabled says whether they are in use
 * (off when SHARDLM_CPU_ISA is below amx or SHARDLM_CPU_AMX=0: kernels/cpu/cpu_isa.h);
 * cpu_amx_set_enabled switches them process-wide (on only where available; tests compare both
 * paths) and returns the previous state. */
/* The OpenBLAS kernels (an OPENBLAS_CORETYPE name: "SkylakeX", "Haswell") this CPU can run when
 * the library chose older ones (its release predates the CPU model: "Prescott", the SSE3
 * kernels, for an Emerald Rapids Xeon in OpenBLAS 0.3.21), else NULL. The library reads
 * OPENBLAS_CORETYPE once, at load: cli/main.c sets it and runs itself again. */
const char *cpu_blas_better_core(void);
int         cpu_amx_enabled(void);
int         cpu_amx_set_enabled(int on);
/* 1 when the CPU backend multiplies weights of dtype dt (bf16 or f16) in place at every row
 * count, so that serving keeps them so (half the memory of an f32 copy, half the bytes a decode
 * step reads): bf16 on AMX tiles; either (no tiles) by a decode gemv that widens them in
 * registers (kernels/cpu/gemv.c; prefill takes vdpbf16ps for bf16 where the CPU has it, else
 * widens blocks of rows into scratch for sgemm). */
int         cpu_half_weights_in_place(enum dtype dt);
/* The vdpbf16ps products of bf16 weights (kernels/cpu/bf16_dot.c: AVX512-BF16 CPUs without AMX
 * tiles in use; x rounded to bf16 as on the tiles), used from 2 rows of x outside batch-invariant
 * steps; SHARDLM_CPU_BF16_DOT=0 turns them off. cpu_bf16_dot_set_enabled switches them
 * process-wide (on only where available and not turned off; tests compare both paths) and
 * returns the previous state. */
int         cpu_bf16_dot_set_enabled(int on);
/* Huge pages for what every step streams (the weights): cpu_memory_huge advises the whole 2 MB
 * pages inside [p, p + n) to be backed by transparent huge pages (backend_alloc aligns host
 * allocations from 2 MB to 2 MB, so all but the tail are); call it before the first write.
 * cpu_hugepages_on: 0 under SHARDLM_CPU_HUGEPAGES=0 or when the kernel's are "never". */
int         cpu_hugepages_on(void);
void        cpu_memory_huge(void *p, size_t n);
/* Parses "cpu" / "cuda" into *out; STATUS_INVALID_ARGUMENT otherwise. */
enum status backend_parse_device(const char *name, enum device *out);

/* Memory. Allocations are aligned to 256 bytes. backend_alloc returns
 * STATUS_RESOURCE_EXHAUSTED with a message when the device is out of memory. */
enum status backend_alloc(struct backend *b, size_t nbytes, void **ptr);
void        backend_free(struct backend *b, void *ptr); /* accepts NULL */
/* Allocates a tensor of the given shape on the backend (data owned by the caller, freed with
 * backend_free(b, t->data)). */
enum status backend_alloc_tensor(struct backend *b, struct tensor *t, enum dtype dtype, int ndim,
                                 const int64_t *shape);
/* Host memory that the backend's downloads and uploads fill fastest, for buffers every step
 * downloads into (the engine's logits): on CUDA page-locked (cudaHostAlloc: a copy to pageable
 * memory goes through a staging buffer at a fraction of the bus's rate), falling back to
 * ordinary memory when the driver refuses; on the CPU ordinary memory. 256-byte aligned; NULL
 * and STATUS_RESOURCE_EXHAUSTED when out of host memory. Free with backend_host_free (accepts
 * NULL) before the backend closes. */
enum status backend_host_alloc(struct backend *b, size_t nbytes, void **ptr);
void        backend_host_free(struct backend *b, void *ptr);
/* Host <-> device copies from ordinary (pageable) host memory. The host buffer of an upload
 * may be reused as soon as the call returns; a download has finished when it returns (it
 * waits for the queued ops that write its source). */
void backend_upload(struct backend *b, void *dst_device, const void *src_host, size_t nbytes);
void backend_download(struct backend *b, void *dst_host, const void *src_device, size_t nbytes);
/* Device-to-device copy; the ranges must not overlap. */
void backend_copy(struct backend *b, void *dst_device, const void *src_device, size_t nbytes);
void backend_memset_zero(struct backend *b, void *dst_device, size_t nbytes);
void backend_synchronize(struct backend *b);
/* Host work spread over the host's cores: fn(ctx, i, worker) for every i in [0, n), in no set
 * order, worker in [0, backend_host_workers(b)) naming the thread that runs it (for per-thread
 * scratch); returns when every call has returned. The threads are the CPU backend's (its
 * n_threads), or beside a device backend the host's OpenMP threads, at most
 * BACKEND_HOST_MAX_WORKERS. For work between ops (the engine's sampling of many rows), never
 * while an op runs. */
#define BACKEND_HOST_MAX_WORKERS 16
int  backend_host_workers(const struct backend *b);
void backend_host_parallel(struct backend *b, int n, void (*fn)(void *ctx, int i, int worker), void *ctx);
/* Memory the device has free now and in all (CPU: MemAvailable / MemTotal of the host), for
 * sizing pools by a fraction of free memory. */
enum status backend_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes);

/* Graphs: a run of ops recorded once and queued again and again in one call (CUDA graphs: one
 * launch for a decode step's hundreds of kernels). backend_graph_begin starts recording: the ops
 * that follow, until backend_graph_end, do not run; each is recorded with its arguments as they
 * are then (tensor pointers and shapes, scalars, the attention batch, rope's table). What the
 * tensors point at is read when the graph runs: backend_graph_launch queues the recorded ops, in
 * order, on the backend's stream. So a replay computes what the recorded calls would compute on
 * the data as it is at launch, and nothing passed by value may differ from the recording's
 * (a graph is captured per shape and per such value: engine/model/model.c's step graphs).
 * Between begin and end: only ops, backend_copy and backend_memset_zero; an upload, a download,
 * a synchronize, an alloc or an op scratch that would have to grow makes end fail.
 * begin: STATUS_UNAVAILABLE where the backend records none (its log says why). end: the graph
 * (free it with backend_graph_free before the backend closes), or STATUS_UNAVAILABLE when the
 * recording failed (nothing ran: run the ops without a graph). launch: STATUS_UNAVAILABLE when the
 * graph no longer holds (the backend moved a scratch area it points at): nothing was queued; free
 * it and record again. The CPU backend records too, a mirror for tests: its replay calls the
 * recorded CPU ops with the recorded arguments (ops other than the serving forward's run at once
 * even while recording; no forward calls them). */
struct backend_graph;
enum status backend_graph_begin(struct backend *b);
enum status backend_graph_end(struct backend *b, struct backend_graph **out);
enum status backend_graph_launch(struct backend *b, struct backend_graph *g);
void        backend_graph_free(struct backend *b, struct backend_graph *g); /* accepts NULL */

/* ---- forward ops ---------------------------------------------------------------------- */

/* out = in converted to out's dtype; same shape; any float dtypes. No aliasing. */
void op_cast(struct backend *b, const struct tensor *out, const struct tensor *in);

/* out[i,:] = table[ids[i] - vocab_start, :] when vocab_start <= ids[i] < vocab_start + rows of
 * table, else zeros (the masked lookup of a vocab-parallel shard; vocab_start = 0 and a full
 * table for tp = 1). out (n, d), table (vocab_local, d), ids i32 (n). The table may be
 * block-quantized (a DTYPE_Q*, tensor.h): looked-up rows are dequantized bit-exactly with
 * quant_dequantize_row (ggml's values), into an f32 out on the CPU, into an out of any float
 * dtype on CUDA (rounded once to it). On the CPU a bf16 or f16 table may also fill an f32 out
 * (half-precision weights served beside f32 activations: model_load). */
void op_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                  const struct tensor *ids, int64_t vocab_start);
/* Backward: dtable[ids[i] - vocab_start, :] += dout[i, :] for the ids inside the shard (the
 * others belong to another vocab-parallel rank). dtable (vocab_local, d), f32 or dout's dtype;
 * dout (n, d); ids i32 (n). A row that several ids hit receives their sum in id order on the
 * CPU, in any order on CUDA (atomics); with a bf16/f16 dtable each added row is rounded on
 * its own. */
void op_embedding_backward(struct backend *b, const struct tensor *dtable,
                           const struct tensor *dout, const struct tensor *ids,
                           int64_t vocab_start);

/* x[i,:] += table[positions[i], :] (learned absolute positions, GPT-2). x (n, d), table
 * (max_positions, d), positions i32 (n), each in [0, max_positions). In place. */
void op_position_embedding_add(struct backend *b, const struct tensor *x,
                               const struct tensor *table, const struct tensor *positions);
/* Backward: dtable[positions[i], :] += dx[i, :], as op_embedding_backward with every row in
 * the table (a position outside it is a bug). dx, the gradient of the in-place x, passes
 * through unchanged: the caller keeps using it. dtable (max_positions, d), f32 or dx's dtype. */
void op_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                        const struct tensor *dx,
                                        const struct tensor *positions);

/* y = x @ w^T (+ bias). x (m, k), w (n, k) stored output-major as checkpoints store linear
 * layers, bias (n) or NULL, y (m, n). y must not alias x or w. w may be block-quantized (a
 * DTYPE_Q*, tensor.h; k a multiple of its block size), with x, y and bias of one float dtype:
 * - CPU: f32 only; below 32 rows of x (8 on AMX) quant_matmul's product (x quantized per block
 *   to int8, integer dots; its error bound is in kernels/quant.h), x's int8 copy in the
 *   backend's scratch arena; from there the dequantized w in tiles: f32 with sgemm, or on AMX
 *   bf16 (x and w rounded to bf16, f32 sums; cpu_amx_enabled below).
 * - CUDA: f32, bf16 or f16; w dequantized inside the kernels (values bit-exact with
 *   quant_dequantize_row), x not quantized: the f32 product of x and the dequantized w, as for
 *   a float w (kernels/cuda/matmul_quant.cu).
 * No backward for those. On the CPU w may also be bf16 or f16 beside f32 x, y and bias
 * (half-precision weights served: model_load; AMX tiles and vdpbf16ps round x to bf16 for bf16
 * w, one row of x reads w in place where cpu_gemv_reads says so, else w is widened). */
void op_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
               const struct tensor *w, const struct tensor *bias);
/* count (1 .. OP_MATMUL_MANY_MAX) products of the same x: y[i] = x @ w[i]^T + bias[i] (bias[i]
 * NULL: none), each exactly as op_matmul computes it; a backend may run them together (CUDA: one
 * launch of its decode gemv for q, k and v, or gate and up, where each would take it). No y may
 * alias x, a w or another y. */
#define OP_MATMUL_MANY_MAX 4
void op_matmul_many(struct backend *b, int count, const struct tensor *const *y, const struct tensor *x,
                    const struct tensor *const *w, const struct tensor *const *bias);
/* Backward of y = x @ w^T + bias, for dy (m, n):
 *   dx (m, k)  = dy @ w        (accumulate_dx: dx += dy @ w, for an input read by two products)
 *   dw (n, k) += dy^T @ x
 *   dbias (n) += the sum of dy's rows.
 * dy, x, w and dx share a dtype; dw and dbias are f32 or that dtype, independently. Any of dx,
 * dw, dbias may be NULL (not computed); x may be NULL when dw is, w when dx is. dx must not
 * alias dy, x or w. The products accumulate in f32 (OpenBLAS sgemm; cuBLAS with f32 compute,
 * no TF32). */
void op_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                        const struct tensor *dbias, const struct tensor *dy,
                        const struct tensor *x, const struct tensor *w, int accumulate_dx);

/* out = x / sqrt(mean(x^2) + eps) * weight, per row. x, out (n, d); weight (d). out may
 * alias x. */
void op_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                const struct tensor *weight, float eps);
/* The residual add and the next norm in one pass: sum = a + c, then out = op_rmsnorm(sum) (the
 * bits of op_add then op_rmsnorm: the norm reads the sum as stored in sum's dtype). a, c, sum,
 * out (n, d) of one dtype; weight (d); sum may alias a or c; out aliases none of them. */
void op_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out, const struct tensor *a,
                    const struct tensor *c, const struct tensor *weight, float eps);
/* Backward, per row, r = 1 / sqrt(mean(x^2) + eps):
 *   dx = r (dout * weight) - r^3 / d * sum(dout * weight * x) * x,   dweight += dout * x * r
 * summed over the rows. weight is the one the forward multiplied by: Gemma's (1 + w) is added
 * at load (model_load.c), so dweight is also the gradient of Gemma's stored w. dx, dout, x
 * (n, d); weight (d); dweight (d) f32 or x's dtype, or NULL. dx may alias dout. */
void op_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                         const struct tensor *dout, const struct tensor *x,
                         const struct tensor *weight, float eps);

/* out = (x - mean) / sqrt(var + eps) * weight (+ bias), per row, biased variance. bias may be
 * NULL. out may alias x. */
void op_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, const struct tensor *bias, float eps);
/* Backward, per row, xhat = (x - mean) r, r = 1 / sqrt(var + eps), g = dout * weight:
 *   dx = r (g - mean(g) - xhat mean(g xhat)),  dweight += dout * xhat,  dbias += dout
 * summed over the rows. dweight, dbias (d) f32 or x's dtype, or NULL. dx may alias dout. (The
 * bias itself is not needed.) */
void op_layernorm_backward(struct backend *b, const struct tensor *dx,
                           const struct tensor *dweight, const struct tensor *dbias,
                           const struct tensor *dout, const struct tensor *x,
                           const struct tensor *weight, float eps);

/* out = a + c, same shape (the residual add). out may alias a or c. */
void op_add(struct backend *b, const struct tensor *out, const struct tensor *a,
            const struct tensor *c);

/* out = alpha * x, same shape. out may alias x. */
void op_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha);

/* out[ids[i]] += weights[i] * y[i] for each row i of y (n, d): a mixture of experts' combine.
 * out (rows, d) and y share a float dtype; ids i32 (n), distinct, in [0, rows) (checked where
 * they live: CPU CHECK, CUDA a device-side trap); weights f32 (n). f32 math, one rounding to
 * out's dtype per element; rows not named are unchanged. Distinct ids make the result
 * independent of the order rows are visited in. */
void op_scatter_add_rows(struct backend *b, const struct tensor *out, const struct tensor *y,
                         const struct tensor *ids, const struct tensor *weights);
/* Backward, for dout = dL/dout (rows, d) (which also flows on to the out the forward added
 * into, unchanged: the caller keeps it):
 *   dy[i] = weights[i] dout[ids[i]],   dweights[i] = dout[ids[i]] . y[i]
 * dy (n, d) in y's dtype and dweights f32 (n) are written, not accumulated (activation
 * gradients); dweights may be NULL. f32 math, the dot product summed in f32 in column order on
 * both backends. ids as the forward's (distinct not required here). dy must not alias dout. */
void op_scatter_add_rows_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                  const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                  const struct tensor *weights);

/* out = cap * tanh(x / cap) (logit soft-capping, Gemma 2's final_logit_softcapping), same shape,
 * f32 math; cap > 0. out may alias x. */
void op_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap);

/* Dropout by a counter-based mask, nothing stored: the backward, and a recomputation, draw the
 * same mask from the same key. For x (n, d):
 *   out[i, j] = keep(i, col0 + j) ? x[i, j] / (1 - p) : 0,
 *   keep(r, c) = (op_dropout_hash(key ^ (r << 32 | c)) >> 40) >= op_dropout_threshold(p),
 * the hash being splitmix64's finaliser and the threshold round(p 2^24) (below: one formula for
 * both backends and the tests' references). A global column offset col0 lets a tensor-parallel
 * slice draw the columns one rank would. Being a multiplication by a fixed mask, its backward is
 * itself with the same key. p in [0, 1); out may alias x. */
void op_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key,
                int64_t col0, float p);
static inline uint64_t op_dropout_hash(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline uint32_t op_dropout_threshold(float p) { return (uint32_t)((double)p * 16777216.0 + 0.5); }

/* Rotary position embedding, in place, on x (n, n_heads, head_dim) with positions i32 (n):
 * within each head the first rot_dim (even, <= head_dim) features are rotated, pair i by angle
 * positions[t] * theta^(-2i/rot_dim); the rest pass through. `style` says which features pair
 * up (see enum rope_style). */
void op_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
             int rot_dim, const struct rope_params *rp, enum rope_style style);
/* op_rope on q (n, n_heads, head_dim) and on k (n, n_kv_heads, head_dim), the same rows and
 * positions: each result exactly op_rope's; a backend may rotate both in one launch (CUDA). */
void op_rope_qk(struct backend *b, const struct tensor *q, const struct tensor *k, const struct tensor *positions,
                int rot_dim, const struct rope_params *rp, enum rope_style style);
/* Backward, in place on the gradient dx (n, n_heads, head_dim): the rotation is orthogonal, so
 * its gradient is the inverse rotation (angle -positions[t] * freq_i, the same angles as the
 * forward to the bit); the features past rot_dim pass through. */
void op_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                      int rot_dim, const struct rope_params *rp, enum rope_style style);

/* Writes the K and V rows of new tokens into the paged cache: token t goes to slot
 * slots[t] = block * block_tokens + offset. k_cache, v_cache (n_blocks, block_tokens,
 * n_kv_heads, head_dim); k, v (n, n_kv_heads, head_dim); slots i32 (n); a negative slot skips
 * the token (padding). */
void op_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                 const struct tensor *k, const struct tensor *v, const struct tensor *slots);

/* Causal attention over the paged cache for a batch of sequences (see struct
 * attention_batch). q, out (n, n_heads, head_dim); k_cache, v_cache as in op_kv_write;
 * n_heads a multiple of n_kv_heads (grouped-query: query head h reads KV head
 * h / (n_heads / n_kv_heads)). Softmax is computed online in f32 (numerically stable for any
 * context length). out must not alias q. */
void op_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                  const struct tensor *k_cache, const struct tensor *v_cache,
                  const struct attention_batch *batch);

/* out = act(x), elementwise. out may alias x. */
void op_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                   enum activation act);
/* Backward: dx = dout * act'(x), elementwise. dx may alias dout or x. */
void op_activation_backward(struct backend *b, const struct tensor *dx, const struct tensor *dout,
                            const struct tensor *x, enum activation act);

/* out = act(gate) * up, elementwise (SwiGLU with SILU, GeGLU with GELU_*; with
 * ACTIVATION_SWIGLU_OAI, act(gate) * (clamp(up, -7, 7) + 1): see enum activation). out may alias
 * gate or up. */
void op_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                         const struct tensor *up, enum activation act);
/* Backward: dgate = dout * up * act'(gate), dup = dout * act(gate), elementwise (SWIGLU_OAI:
 * clamp(up, -7, 7) + 1 for up, and dup = 0 where |up| > 7). dgate may alias gate or dout, dup
 * may alias up or dout (overwriting the saved activations), but dgate and dup are distinct. */
void op_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                  const struct tensor *dup, const struct tensor *dout,
                                  const struct tensor *gate, const struct tensor *up,
                                  enum activation act);

/* Per row: out = softmax(x), out = log_softmax(x). x, out (n, v); out may alias x. */
void op_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);
void op_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x);

/* Per row of x (n, v): ids i32 (n) = index of the largest value (the lowest index on ties,
 * -0 and +0 tie; NaN is never chosen over a number; an all-NaN row gives 0). */
void op_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x);

/* Per row of x (n, v): the k largest values in descending order (ties, -0 == +0 included:
 * lower index first; NaN ranks below every number, NaNs among themselves by index), values
 * f32 (n, k) whatever x's dtype, ids i32 (n, k); k <= v (k <= 4096 on CUDA). */
void op_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
             const struct tensor *x);

/* Per row i of x (n, v), with its largest value m and w = inv_temp[i] (f32 (n)): mass f32 (n) =
 * the sum of exp((x_ij - m) w) over the j where (x_ij - m) w >= ln(1e-12), accumulated in f64
 * (the sampler's weights within its floor: engine/serving/sampler.c); 0 where w <= 0. Rows
 * holding NaN or Inf give an unspecified value (the caller checks finiteness). */
void op_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                   const struct tensor *inv_temp);

/* Plain temperature sampling's draw, per row i of x (n, v) with temp[i] > 0 and u[i] in [0, 1)
 * (f32 (n) each): with m the row's largest value and the sampler's weights w_j = e^((x_ij - m) /
 * temp[i]) (0 where that exponent is at or below -87), ids i32 (n) = the first j whose cumulative
 * weight in id order exceeds u[i] times the row's total (f64 sums), and margin f32 (n) = that
 * target's distance to the nearer end of token j's interval, over the total (the caller's own
 * sums may differ a little: engine/serving/sampler.c sampler_draw_decided); ids -1 and margin 0
 * where temp[i] <= 0 or no token is reached. Rows holding NaN or Inf give unspecified values.
 * top_p NULL, or f32 (n): a row with top_p[i] < 1 draws as the sampler's top_p does instead (the
 * nucleus): over the tokens within its floor ((x_ij - m) / temp[i] >= ln(1e-12)), whose total S is
 * summed in id order, the cut at the first token in order of logit (highest first, ties by id)
 * where the running sum of w / S reaches top_p[i] (every token when none does), then the first of
 * the kept tokens, in that order, whose cumulative weight exceeds u[i] times their sum; margin =
 * the smaller of the cut's (the running sum's distance to top_p[i] at the cut and just before it)
 * and the draw's (as above, over the kept sum). The CPU forms every sum in the host sampler's
 * order; a backend may return -1 for such rows (not supported: the caller samples on the host). */
void op_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                   const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                   const struct tensor *u);

/* A sampler's edits of single logits, in place: for each entry k, the element e = x[rows[k],
 * ids[k]] of x (n, v) with (add, rep, sub) = vals[k] (f32 (e, 3)) becomes e + add (skipped where
 * add is 0; -inf bans the token), then e / rep where e > 0 and e * rep elsewhere (rep 1: none),
 * then e - sub: a logit bias, a banned id, a repetition penalty and presence / frequency
 * penalties, in the host sampler's order and arithmetic (engine/serving/sampler.c). rows, ids i32
 * (e); no (row, id) twice; rep > 0. */
void op_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *ids,
                   const struct tensor *vals);

/* A constraint's masks, in place: for each k, row rows[k] of x (n, v) keeps the logits whose bit
 * of mask row k (i32 (m, words), words >= ceil(v / 32); bit j % 32 of word j / 32) is set and
 * every other becomes -inf (a structured output's grammar, engine/serving/constraint.c). rows i32
 * (m), distinct. */
void op_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *mask);

/* Log-probabilities' normaliser, per row i of x (n, v) where want[i] > 0 (f32 (n)): lse f32 (n) =
 * (float)log(sum of the sampler's weights e^(x_ij - m)), m the row's largest value, the weights as
 * the host sampler forms them (base_exp), summed in f64 (the CPU in the host's very order:
 * engine/serving/sampler.c sampler_log_softmax); 0 where want[i] <= 0. A row's log-probabilities
 * are then (x_ij - m) - lse. Rows holding NaN or Inf give unspecified values. */
void op_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want);

/* ---- training attention ------------------------------------------------------------------ */

/* Causal self-attention over the packed documents of a training micro-batch (see struct
 * attention_train_batch), flash-style: the attention matrix is never stored. q, out (n,
 * n_heads, head_dim); k, v (n, n_kv_heads, head_dim), the K and V of the same n rows; n_heads
 * a multiple of n_kv_heads (grouped-query: query head h reads KV head
 * h / (n_heads / n_kv_heads)); q, k, v, out share one float dtype. For each row i and head h,
 * with s_j = scale * q[i,h,:] . k[j,kvh,:] over the attended rows j:
 *     out[i,h,:] = sum_j softmax(s)_j v[j,kvh,:],    lse[i,h] = log(sum_j exp(s_j)),
 * the natural log-sum-exp of the scaled scores, kept in f32 whatever the dtype: lse is f32 (n,
 * n_heads). With batch.sinks, S_h joins every softmax: out = sum_j e^(s_j - lse) v_j with
 * lse = log(e^S_h + sum_j exp(s_j)). The backward needs out and lse as this op wrote them. Softmax is computed online in
 * f32 (stable for any document length). out and lse must not alias an input. The result equals
 * op_attention's on the same rows written to a paged cache (one sequence per document), up to
 * f32 rounding. head_dim <= 256 on CUDA. */
void op_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                        const struct tensor *q, const struct tensor *k, const struct tensor *v,
                        const struct attention_train_batch *batch);

/* On CUDA, bf16 and f16 at head_dim 32, 64 or 128 (96 when forced) may run on tensor cores
 * (kernels/cuda/attention_train_tc.cu), which round the probabilities (and, in the backward,
 * dS) to the inputs' dtype before their second product, as FlashAttention does: an error of
 * that dtype's unit roundoff times sum_j P_ij |v_j| (and the like for the gradients) beyond the
 * f32 arithmetic described here. SHARDLM_CUDA_TRAIN_ATTENTION=tc or simple picks the form;
 * unset or "auto", this default (1: tensor cores where they fit; on an H200 on 2026-12-04 they
 * took a bf16 training step of a Llama-3.2-1B shape from 0.519 s to 0.101 s, MFU 6 % to 31 %). */
#define CUDA_TRAIN_ATTENTION_TC_DEFAULT 1

/* The gradients of op_attention_train: given dout = dL/dout (n, n_heads, head_dim) and the
 * forward's q, k, v, out and lse (the same batch), writes dq = dL/dq (shape of q) and dk, dv =
 * dL/dk, dL/dv (shape of k): each element is overwritten, not accumulated into. For
 * grouped-query attention dk and dv sum the contributions of every query head of the group.
 * The probabilities are recomputed from q, k and lse (P_ij = exp(s_ij - lse_i)), and
 * D_i = sum_d dout[i,h,d] out[i,h,d] stands for sum_j P_ij dP_ij (FlashAttention's identity), so
 * out must be the forward's output (its rounding to the storage dtype enters the gradients
 * through D, as it does in FlashAttention). All arithmetic is f32; dk and dv are summed over the
 * group in f32 and rounded once. The gradients must not alias each other or an input. No
 * workspace is needed (the CPU backend uses its scratch arena; CUDA, shared memory only).
 * Results do not depend on the number of threads or on timing (no atomics).
 * Tests: tests/test_attention_train.c (both ops, against double references, finite
 * differences and op_attention on a paged cache). */
void op_attention_train_backward(struct backend *b, const struct tensor *dq,
                                 const struct tensor *dk, const struct tensor *dv,
                                 const struct tensor *dout, const struct tensor *out,
                                 const struct tensor *lse, const struct tensor *q,
                                 const struct tensor *k, const struct tensor *v,
                                 const struct attention_train_batch *batch);

/* The gradient of the attention sinks of op_attention_train (batch.sinks), added:
 *     dsinks[h] += -sum_i exp(sinks[h] - lse[i,h]) (dout[i,h,:] . out[i,h,:])
 * over every row i (the sink is one more logit of row i's softmax with probability
 * P_i = exp(sinks[h] - lse[i,h]) and no value, so dL/dsinks[h] = sum_i P_i (0 - D_i) with
 * D_i = dout_i . out_i, FlashAttention's identity). dsinks, sinks f32 (n_heads); dout, out
 * (n, n_heads, head_dim) of one float dtype; lse f32 (n, n_heads), the forward's (sinks
 * included). Sums in f32 in a fixed order per head (no atomics), so the result does not depend
 * on the number of threads. Tests: tests/test_attention_train.c. */
void op_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                 const struct tensor *out, const struct tensor *lse, const struct tensor *sinks);

/* ---- training: the loss over the LM head and the optimizer ------------------------------ */

/* Cross-entropy over the LM head, fused: the logits z = h @ w^T are formed a chunk of
 * vocabulary columns at a time (a few thousand, so that the (n, vocab) matrix never exists)
 * and thrown away, twice: once for the statistics, once for the gradients. Shaped as
 * Megatron's vocab-parallel cross-entropy: each tensor-parallel rank holds a shard of w (rows
 * vocab_start .. vocab_start + vocab_local - 1) and the full h, and the ranks exchange only
 * per-row statistics between the two passes:
 *
 *   op_cross_entropy_stats    on every rank: its shard's (max, sum of exp, target logit) per row
 *   (all-gather the stats over tp: (tp, n, 3); with tp = 1 there is nothing to do)
 *   op_cross_entropy_combine  on every rank: loss and lse per row, from every shard's stats
 *   op_cross_entropy_backward on every rank: dw for its shard, and its shard's part of dh
 *   (all-reduce dh over tp)
 *
 * h (n, d) and w (vocab_local, d) share a dtype; targets i32 (n) are global token ids, a
 * negative one masks its row (loss 0, no gradient). Logits and everything after them are f32;
 * the gradient of the logits is rounded to h's dtype before the two products of the backward
 * (as a bf16 LM head's backward does in Megatron), on both backends. softcap > 0: the logits
 * are z = softcap * tanh((h @ w^T) / softcap) (Gemma 2's final_logit_softcapping), in the
 * statistics and the backward alike; 0 = none. */

/* stats f32 (n, 3), written: per row, over this shard's columns, [0] the largest logit m,
 * [1] sum(exp(z - m)), [2] the target's logit when the target lies in the shard, else 0. */
void op_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                            const struct tensor *w, const struct tensor *targets,
                            int64_t vocab_start, float softcap);

/* From stats f32 (n_shards, n, 3), every shard's op_cross_entropy_stats (n_shards = 1 for
 * tp = 1), writes per row lse = log(sum over the whole vocabulary of exp(z)) and loss = lse -
 * z[target], or 0 for a masked row; loss, lse f32 (n). The mean loss over real tokens is the
 * caller's sum (download loss, or weight it). */
void op_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                              const struct tensor *lse, const struct tensor *stats,
                              const struct tensor *targets);

/* The gradients of sum_i c_i loss_i, c_i = scale * row_scale[i] (row_scale f32 (n), or NULL
 * for 1; e.g. scale = loss_scale / num_real_tokens), for this shard:
 *   dz = c_i (softmax(z)_ij - [j == target_i]),  dh (n, d) = dz @ w (accumulate_dh: +=),
 *   dw (vocab_local, d) += dz^T @ h
 * lse f32 (n) from op_cross_entropy_combine. dh has h's dtype and must not alias h or w; dw is
 * f32 or h's dtype, or NULL (a frozen head). With tp > 1, each rank's dh holds its shard's part:
 * all-reduce (sum) it over tp. */
void op_cross_entropy_backward(struct backend *b, const struct tensor *dh, const struct tensor *dw,
                               const struct tensor *h, const struct tensor *w,
                               const struct tensor *targets, const struct tensor *lse,
                               const struct tensor *row_scale, float scale, int64_t vocab_start,
                               int accumulate_dh, float softcap);

/* One AdamW step on n parameters, in place, all f32 (n): fp32 master weights p, gradients g,
 * first and second moments m and v (zero before step 1). The semantics of optax.adamw and of
 * Megatron's (PyTorch's) AdamW, eps outside the square root, no eps_root:
 *   g' = grad_scale g;  m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2
 *   p -= lr (m / (1 - b1^step) / (sqrt(v / (1 - b2^step)) + eps) + weight_decay p)
 * g is read only. The bias corrections are computed in double from hp->step (>= 1). */
void op_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
              const struct tensor *m, const struct tensor *v, const struct adamw_params *hp);

/* out f32 (1) += sum(x^2) over every element of x (any float dtype): the global gradient norm
 * is the square root of these sums over every gradient tensor (and over ranks: all-reduce out).
 * Also the loss scaler's overflow check: an Inf or NaN anywhere in x makes out Inf or NaN. */
void op_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x);

#ifdef __cplusplus
}
#endif

#endif
