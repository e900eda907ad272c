/* kernels/ops.c - the op_* wrappers of ops.h: each checks its shape and dtype contract once,
 * for every backend, then calls the backend's slot; with sync_check it synchronizes after the
 * op so that an asynchronous device error is reported by the op that caused it.
 * Not here: any arithmetic (kernels/cpu/, kernels/cuda/).
 * Tests: tests/test_ops.c. */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "backend_impl.h"
#include "quant.h"

#define DESC(t) tensor_describe((t), (char[64]){0}, 64)

enum status backend_open(enum device device, int device_id, int n_threads, struct backend **out)
{
    *out = NULL;
    enum status st;
    switch (device) {
    case DEVICE_CPU: st = cpu_backend_open(n_threads, out); break;
    case DEVICE_CUDA: st = cuda_backend_open(device_id, out); break;
    default: return status_errorf(STATUS_INVALID_ARGUMENT, "unknown device %d", (int)device);
    }
    if (st != STATUS_OK) return st;
    const char *e = getenv("SHARDLM_SYNC_CHECK");
    (*out)->sync_check = e && e[0] == '1';
    return STATUS_OK;
}

void backend_close(struct backend *b)
{
    if (b) b->ops->close(b);
}

int backend_cuda_compiled(void) { return cuda_backend_compiled(); }

enum status backend_parse_device(const char *name, enum device *out)
{
    if (!strcmp(name, "cpu")) *out = DEVICE_CPU;
    else if (!strcmp(name, "cuda")) *out = DEVICE_CUDA;
    else return status_errorf(STATUS_INVALID_ARGUMENT, "unknown device '%s' (cpu or cuda)", name);
    return STATUS_OK;
}

enum status backend_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    return b->ops->alloc(b, nbytes, ptr);
}

void backend_free(struct backend *b, void *ptr)
{
    if (ptr) b->ops->free(b, ptr);
}

enum status backend_alloc_tensor(struct backend *b, struct tensor *t, enum dtype dtype, int ndim,
                                 const int64_t *shape)
{
    CHECK(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "ndim %d", ndim);
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->device = b->device;
    t->ndim = ndim;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t->shape[i] = i < ndim ? shape[i] : 1;
    return b->ops->alloc(b, tensor_nbytes(t), &t->data);
}

static void after_op(struct backend *b)
{
    if (b->sync_check) b->ops->synchronize(b);
}

void backend_upload(struct backend *b, void *dst, const void *src, size_t n)
{
    b->ops->upload(b, dst, src, n);
    after_op(b);
}

void backend_download(struct backend *b, void *dst, const void *src, size_t n)
{
    b->ops->download(b, dst, src, n);
}

void backend_copy(struct backend *b, void *dst, const void *src, size_t n)
{
    CHECK((const char *)dst + n <= (const char *)src || (const char *)src + n <= (const char *)dst,
          "backend_copy: overlapping ranges");
    b->ops->copy(b, dst, src, n);
    after_op(b);
}

void backend_memset_zero(struct backend *b, void *dst, size_t n)
{
    b->ops->memset_zero(b, dst, n);
    after_op(b);
}

void backend_synchronize(struct backend *b) { b->ops->synchronize(b); }

enum status backend_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes)
{
    return b->ops->mem_info(b, free_bytes, total_bytes);
}

/* ---- contract checks --------------------------------------------------------------------- */

static void check_on(struct backend *b, const struct tensor *t, const char *what)
{
    CHECK(t->device == b->device, "%s is on the wrong device for backend %s", what, b->ops->name);
    CHECK(t->data != NULL || tensor_numel(t) == 0, "%s has no data", what);
}

static void check_float(struct backend *b, const struct tensor *t, const char *what)
{
    check_on(b, t, what);
    CHECK(dtype_is_float(t->dtype), "%s must be a float tensor, is %s", what, DESC(t));
}

static void check_i32(struct backend *b, const struct tensor *t, const char *what)
{
    check_on(b, t, what);
    CHECK(t->dtype == DTYPE_I32, "%s must be i32, is %s", what, DESC(t));
}

static void check_same(const struct tensor *a, const struct tensor *c, const char *what)
{
    CHECK(tensor_same_shape(a, c) && a->dtype == c->dtype, "%s: %s vs %s", what, DESC(a), DESC(c));
}

static void check_vector(const struct tensor *t, int64_t n, enum dtype dtype, const char *what)
{
    CHECK(tensor_numel(t) == n && t->dtype == dtype, "%s must be %s[%lld], is %s", what,
          dtype_name(dtype), (long long)n, DESC(t));
}

/* A weight stored as ggml blocks (tensor.h), with rows of whole blocks: beside f32 activations
 * on the CPU (quant.h's int8 product), beside any float activations on CUDA (dequantized inside
 * the kernels). Model loading keeps blocks only where that holds, so a violation is a bug. */
static void check_quant_weight(struct backend *b, const struct tensor *w, const struct tensor *act,
                               const char *what)
{
    check_on(b, w, what);
    CHECK(b->device == DEVICE_CPU || b->device == DEVICE_CUDA,
          "%s %s: backend %s has no kernels for block-quantized weights", what, DESC(w), b->ops->name);
    CHECK(act->dtype == DTYPE_F32 || b->device == DEVICE_CUDA,
          "%s %s needs f32 activations on the CPU backend, has %s", what, DESC(w), DESC(act));
    CHECK(w->ndim == 2 && w->shape[1] % quant_block_size(dtype_quant_type(w->dtype)) == 0,
          "%s %s: rows must be whole blocks", what, DESC(w));
}

/* ---- forward ops ----------------------------------------------------------------------- */

void op_cast(struct backend *b, const struct tensor *out, const struct tensor *in)
{
    check_float(b, out, "cast out");
    check_float(b, in, "cast in");
    CHECK(tensor_numel(out) == tensor_numel(in), "cast: %s vs %s", DESC(out), DESC(in));
    b->ops->cast(b, out, in);
    after_op(b);
}

/* A bf16 weight beside f32 activations: the CPU backend reads it so (AMX tiles, model_load). */
static int cpu_bf16_weight(const struct backend *b, const struct tensor *w, const struct tensor *act)
{
    return b->device == DEVICE_CPU && w->dtype == DTYPE_BF16 && act->dtype == DTYPE_F32;
}

void op_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                  const struct tensor *ids, int64_t vocab_start)
{
    check_float(b, out, "embedding out");
    if (dtype_is_quant(table->dtype)) { /* rows dequantized on lookup */
        check_quant_weight(b, table, out, "embedding table");
    } else {
        check_float(b, table, "embedding table");
        CHECK(out->dtype == table->dtype || cpu_bf16_weight(b, table, out),
              "embedding dtypes %s vs %s", DESC(out), DESC(table));
    }
    check_i32(b, ids, "embedding ids");
    CHECK(table->ndim == 2 && tensor_cols(out) == table->shape[1] &&
              tensor_rows(out) == tensor_numel(ids),
          "embedding: out %s table %s ids %s", DESC(out), DESC(table), DESC(ids));
    CHECK(vocab_start >= 0, "vocab_start %lld", (long long)vocab_start);
    b->ops->embedding(b, out, table, ids, vocab_start);
    after_op(b);
}

void op_position_embedding_add(struct backend *b, const struct tensor *x,
                               const struct tensor *table, const struct tensor *positions)
{
    check_float(b, x, "position_embedding x");
    check_float(b, table, "position_embedding table");
    check_i32(b, positions, "position_embedding positions");
    CHECK(x->dtype == table->dtype && table->ndim == 2 && tensor_cols(x) == table->shape[1] &&
              tensor_rows(x) == tensor_numel(positions),
          "position_embedding: x %s table %s positions %s", DESC(x), DESC(table), DESC(positions));
    b->ops->position_embedding_add(b, x, table, positions);
    after_op(b);
}

void op_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
               const struct tensor *w, const struct tensor *bias)
{
    check_float(b, y, "matmul y");
    check_float(b, x, "matmul x");
    if (dtype_is_quant(w->dtype)) check_quant_weight(b, w, x, "matmul w"); /* quant.h's product */
    else check_float(b, w, "matmul w");
    CHECK((x->dtype == w->dtype || dtype_is_quant(w->dtype) || cpu_bf16_weight(b, w, x)) && y->dtype == x->dtype,
          "matmul dtypes y %s x %s w %s", DESC(y), DESC(x), DESC(w));
    CHECK(w->ndim == 2 && tensor_cols(x) == w->shape[1] && tensor_cols(y) == w->shape[0] &&
              tensor_rows(y) == tensor_rows(x),
          "matmul: y %s = x %s @ w %s^T", DESC(y), DESC(x), DESC(w));
    CHECK(y->data != x->data && y->data != w->data, "matmul: y aliases an input");
    if (bias) {
        check_float(b, bias, "matmul bias");
        check_vector(bias, w->shape[0], x->dtype, "matmul bias");
    }
    b->ops->matmul(b, y, x, w, bias);
    after_op(b);
}

void op_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                const struct tensor *weight, float eps)
{
    check_float(b, out, "rmsnorm out");
    check_float(b, x, "rmsnorm x");
    check_float(b, weight, "rmsnorm weight");
    check_same(out, x, "rmsnorm out/x");
    check_vector(weight, tensor_cols(x), x->dtype, "rmsnorm weight");
    CHECK(eps >= 0.0f, "rmsnorm eps %g", (double)eps);
    b->ops->rmsnorm(b, out, x, weight, eps);
    after_op(b);
}

void op_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, const struct tensor *bias, float eps)
{
    check_float(b, out, "layernorm out");
    check_float(b, x, "layernorm x");
    check_float(b, weight, "layernorm weight");
    check_same(out, x, "layernorm out/x");
    check_vector(weight, tensor_cols(x), x->dtype, "layernorm weight");
    if (bias) {
        check_float(b, bias, "layernorm bias");
        check_vector(bias, tensor_cols(x), x->dtype, "layernorm bias");
    }
    CHECK(eps >= 0.0f, "layernorm eps %g", (double)eps);
    b->ops->layernorm(b, out, x, weight, bias, eps);
    after_op(b);
}

void op_add(struct backend *b, const struct tensor *out, const struct tensor *a,
            const struct tensor *c)
{
    check_float(b, out, "add out");
    check_float(b, a, "add a");
    check_float(b, c, "add c");
    check_same(out, a, "add out/a");
    check_same(a, c, "add a/c");
    b->ops->add(b, out, a, c);
    after_op(b);
}

void op_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha)
{
    check_float(b, out, "scale out");
    check_float(b, x, "scale x");
    check_same(out, x, "scale out/x");
    b->ops->scale(b, out, x, alpha);
    after_op(b);
}

void op_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap)
{
    check_float(b, out, "softcap out");
    check_float(b, x, "softcap x");
    check_same(out, x, "softcap out/x");
    CHECK(cap > 0.0f && isfinite(cap), "softcap %g must be positive", (double)cap);
    b->ops->softcap(b, out, x, cap);
    after_op(b);
}

void op_dropout(struct backend *b, const struct tensor *out, const struct tensor *x, uint64_t key,
                int64_t col0, float p)
{
    check_float(b, out, "dropout out");
    check_float(b, x, "dropout x");
    check_same(out, x, "dropout out/x");
    CHECK(out->ndim == 2 && col0 >= 0 && p >= 0.0f && p < 1.0f, "dropout: %s, col0 %lld, p %g", DESC(out),
          (long long)col0, (double)p);
    b->ops->dropout(b, out, x, key, col0, p);
    after_op(b);
}

static void check_rope(struct backend *b, const struct rope_params *rp, int rot_dim)
{
    CHECK(rp && rp->theta > 0.0f && rp->attn_factor > 0.0f, "rope theta %g, attn_factor %g",
          rp ? (double)rp->theta : 0.0, rp ? (double)rp->attn_factor : 0.0);
    if (!rp->factors) return;
    check_on(b, rp->factors, "rope factors");
    CHECK(rp->factors->dtype == DTYPE_F32, "rope factors must be f32, are %s", DESC(rp->factors));
    CHECK(tensor_numel(rp->factors) == rot_dim / 2, "rope factors %s for rot_dim %d", DESC(rp->factors), rot_dim);
}

void op_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
             int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    check_float(b, x, "rope x");
    check_i32(b, positions, "rope positions");
    CHECK(x->ndim == 3 && x->shape[0] == tensor_numel(positions),
          "rope: x %s must be (n, n_heads, head_dim), positions %s", DESC(x), DESC(positions));
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= x->shape[2], "rope: rot_dim %d, head_dim %lld",
          rot_dim, (long long)x->shape[2]);
    check_rope(b, rp, rot_dim);
    CHECK(style == ROPE_STYLE_PAIRS || style == ROPE_STYLE_HALVES, "rope style %d", (int)style);
    b->ops->rope(b, x, positions, rot_dim, rp, style);
    after_op(b);
}

static void check_cache(struct backend *b, const struct tensor *k_cache,
                        const struct tensor *v_cache)
{
    check_float(b, k_cache, "k_cache");
    check_float(b, v_cache, "v_cache");
    check_same(k_cache, v_cache, "k_cache/v_cache");
    CHECK(k_cache->ndim == 4, "kv cache %s must be (n_blocks, block_tokens, n_kv_heads, head_dim)",
          DESC(k_cache));
}

void op_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                 const struct tensor *k, const struct tensor *v, const struct tensor *slots)
{
    check_cache(b, k_cache, v_cache);
    check_float(b, k, "kv_write k");
    check_float(b, v, "kv_write v");
    check_i32(b, slots, "kv_write slots");
    check_same(k, v, "kv_write k/v");
    CHECK(k->dtype == k_cache->dtype && k->ndim == 3 && k->shape[1] == k_cache->shape[2] &&
              k->shape[2] == k_cache->shape[3] && k->shape[0] == tensor_numel(slots),
          "kv_write: k %s cache %s slots %s", DESC(k), DESC(k_cache), DESC(slots));
    b->ops->kv_write(b, k_cache, v_cache, k, v, slots);
    after_op(b);
}

void op_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                  const struct tensor *k_cache, const struct tensor *v_cache,
                  const struct attention_batch *batch)
{
    check_float(b, out, "attention out");
    check_float(b, q, "attention q");
    check_cache(b, k_cache, v_cache);
    check_same(out, q, "attention out/q");
    CHECK(q->ndim == 3 && q->dtype == k_cache->dtype && q->shape[2] == k_cache->shape[3] &&
              k_cache->shape[2] > 0 && q->shape[1] % k_cache->shape[2] == 0,
          "attention: q %s (n, n_heads, head_dim) vs cache %s", DESC(q), DESC(k_cache));
    CHECK(out->data != q->data, "attention: out aliases q");
    CHECK(batch->n_seqs >= 0 && batch->block_tokens == k_cache->shape[1] && batch->max_blocks > 0,
          "attention batch: n_seqs %d block_tokens %d (cache %lld) max_blocks %d", batch->n_seqs,
          batch->block_tokens, (long long)k_cache->shape[1], batch->max_blocks);
    check_i32(b, &batch->q_start, "attention q_start");
    check_i32(b, &batch->seq_len, "attention seq_len");
    check_i32(b, &batch->block_table, "attention block_table");
    CHECK(tensor_numel(&batch->q_start) == batch->n_seqs + 1 &&
              tensor_numel(&batch->seq_len) == batch->n_seqs &&
              tensor_numel(&batch->block_table) == (int64_t)batch->n_seqs * batch->max_blocks,
          "attention batch tensors: q_start %s seq_len %s block_table %s",
          DESC(&batch->q_start), DESC(&batch->seq_len), DESC(&batch->block_table));
    CHECK(batch->window >= 0 && batch->scale > 0.0f && batch->softcap >= 0.0f && isfinite(batch->softcap),
          "attention window %d scale %g softcap %g", batch->window, (double)batch->scale, (double)batch->softcap);
    b->ops->attention(b, out, q, k_cache, v_cache, batch);
    after_op(b);
}

void op_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                   enum activation act)
{
    check_float(b, out, "activation out");
    check_float(b, x, "activation x");
    check_same(out, x, "activation out/x");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF,
          "activation %d", (int)act);
    b->ops->activation(b, out, x, act);
    after_op(b);
}

void op_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                         const struct tensor *up, enum activation act)
{
    check_float(b, out, "gated_activation out");
    check_float(b, gate, "gated_activation gate");
    check_float(b, up, "gated_activation up");
    check_same(out, gate, "gated_activation out/gate");
    check_same(gate, up, "gated_activation gate/up");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF,
          "activation %d", (int)act);
    b->ops->gated_activation(b, out, gate, up, act);
    after_op(b);
}

void op_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    check_float(b, out, "softmax out");
    check_float(b, x, "softmax x");
    check_same(out, x, "softmax out/x");
    b->ops->softmax(b, out, x);
    after_op(b);
}

void op_log_softmax(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    check_float(b, out, "log_softmax out");
    check_float(b, x, "log_softmax x");
    check_same(out, x, "log_softmax out/x");
    b->ops->log_softmax(b, out, x);
    after_op(b);
}

void op_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x)
{
    check_float(b, x, "argmax x");
    check_i32(b, ids, "argmax ids");
    CHECK(tensor_numel(ids) == tensor_rows(x) && tensor_cols(x) > 0, "argmax: ids %s x %s",
          DESC(ids), DESC(x));
    b->ops->argmax(b, ids, x);
    after_op(b);
}

void op_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
             const struct tensor *x)
{
    check_float(b, x, "topk x");
    check_on(b, values, "topk values");
    check_i32(b, ids, "topk ids");
    CHECK(values->dtype == DTYPE_F32, "topk values must be f32, is %s", DESC(values));
    CHECK(tensor_same_shape(values, ids) && tensor_rows(values) == tensor_rows(x) &&
              tensor_cols(values) >= 1 && tensor_cols(values) <= tensor_cols(x),
          "topk: values %s ids %s x %s", DESC(values), DESC(ids), DESC(x));
    b->ops->topk(b, values, ids, x);
    after_op(b);
}

/* ---- training attention ------------------------------------------------------------------ */

/* The shapes shared by op_attention_train and its backward: q (n, n_heads, head_dim), k and v
 * (n, n_kv_heads, head_dim), lse f32 (n, n_heads), and the batch description. */
static void check_attention_train(struct backend *b, const struct tensor *lse,
                                  const struct tensor *q, const struct tensor *k,
                                  const struct tensor *v, const struct attention_train_batch *batch)
{
    check_float(b, q, "attention_train q");
    check_float(b, k, "attention_train k");
    check_float(b, v, "attention_train v");
    check_on(b, lse, "attention_train lse");
    check_same(k, v, "attention_train k/v");
    CHECK(q->ndim == 3 && k->ndim == 3 && q->dtype == k->dtype && q->shape[0] == k->shape[0] &&
              q->shape[2] == k->shape[2] && k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0,
          "attention_train: q %s (n, n_heads, head_dim) vs k %s (n, n_kv_heads, head_dim)",
          DESC(q), DESC(k));
    CHECK(lse->dtype == DTYPE_F32 && lse->ndim == 2 && lse->shape[0] == q->shape[0] &&
              lse->shape[1] == q->shape[1],
          "attention_train: lse %s must be f32 (n, n_heads) for q %s", DESC(lse), DESC(q));
    CHECK(batch->n_docs >= 0 && (batch->n_docs > 0 || q->shape[0] == 0),
          "attention_train batch: %d documents for %lld rows", batch->n_docs,
          (long long)q->shape[0]);
    check_i32(b, &batch->doc_start, "attention_train doc_start");
    CHECK(tensor_numel(&batch->doc_start) == (int64_t)batch->n_docs + 1,
          "attention_train doc_start %s must have n_docs + 1 = %d entries",
          DESC(&batch->doc_start), batch->n_docs + 1);
    CHECK(batch->window >= 0 && batch->scale > 0.0f && batch->softcap >= 0.0f && isfinite(batch->softcap),
          "attention_train window %d scale %g softcap %g", batch->window, (double)batch->scale,
          (double)batch->softcap);
}

/* Whether the memory of two tensors overlaps (compared as addresses: they may be unrelated
 * allocations). */
static int overlaps(const struct tensor *a, const struct tensor *c)
{
    uintptr_t pa = (uintptr_t)a->data, pc = (uintptr_t)c->data;
    size_t na = tensor_nbytes(a), nc = tensor_nbytes(c);
    return na && nc && pa < pc + nc && pc < pa + na;
}

void op_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                        const struct tensor *q, const struct tensor *k, const struct tensor *v,
                        const struct attention_train_batch *batch)
{
    check_attention_train(b, lse, q, k, v, batch);
    check_float(b, out, "attention_train out");
    check_same(out, q, "attention_train out/q");
    const struct tensor *ins[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        CHECK(!overlaps(out, ins[i]) && !overlaps(lse, ins[i]),
              "attention_train: out or lse overlaps an input");
    CHECK(!overlaps(out, lse), "attention_train: out overlaps lse");
    b->ops->attention_train(b, out, lse, q, k, v, batch);
    after_op(b);
}

void op_attention_train_backward(struct backend *b, const struct tensor *dq,
                                 const struct tensor *dk, const struct tensor *dv,
                                 const struct tensor *dout, const struct tensor *out,
                                 const struct tensor *lse, const struct tensor *q,
                                 const struct tensor *k, const struct tensor *v,
                                 const struct attention_train_batch *batch)
{
    check_attention_train(b, lse, q, k, v, batch);
    check_float(b, dq, "attention_train_backward dq");
    check_float(b, dk, "attention_train_backward dk");
    check_float(b, dv, "attention_train_backward dv");
    check_float(b, dout, "attention_train_backward dout");
    check_float(b, out, "attention_train_backward out");
    check_same(dq, q, "attention_train_backward dq/q");
    check_same(dk, k, "attention_train_backward dk/k");
    check_same(dv, v, "attention_train_backward dv/v");
    check_same(dout, q, "attention_train_backward dout/q");
    check_same(out, q, "attention_train_backward out/q");
    const struct tensor *grads[3] = {dq, dk, dv}, *ins[6] = {dout, out, lse, q, k, v};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 6; j++)
            CHECK(!overlaps(grads[i], ins[j]), "attention_train_backward: a gradient overlaps an input");
        for (int j = i + 1; j < 3; j++)
            CHECK(!overlaps(grads[i], grads[j]), "attention_train_backward: gradients overlap");
    }
    b->ops->attention_train_backward(b, dq, dk, dv, dout, out, lse, q, k, v, batch);
    after_op(b);
}

/* ---- backward ops and the optimizer ------------------------------------------------------ */

/* A weight gradient: f32 (fp32 accumulation) or the activations' dtype, shaped like its
 * weight. */
static void check_weight_grad(struct backend *b, const struct tensor *g, const struct tensor *like,
                              enum dtype act_dtype, const char *what)
{
    check_float(b, g, what);
    CHECK(g->dtype == DTYPE_F32 || g->dtype == act_dtype, "%s must be f32 or %s, is %s", what,
          dtype_name(act_dtype), DESC(g));
    CHECK(tensor_numel(g) == tensor_numel(like) && tensor_cols(g) == tensor_cols(like),
          "%s %s must be shaped like %s", what, DESC(g), DESC(like));
}

void op_embedding_backward(struct backend *b, const struct tensor *dtable,
                           const struct tensor *dout, const struct tensor *ids, int64_t vocab_start)
{
    check_float(b, dtable, "embedding_backward dtable");
    check_float(b, dout, "embedding_backward dout");
    check_i32(b, ids, "embedding_backward ids");
    CHECK(dtable->dtype == DTYPE_F32 || dtable->dtype == dout->dtype,
          "embedding_backward: dtable %s must be f32 or dout's dtype (%s)", DESC(dtable), DESC(dout));
    CHECK(dtable->ndim == 2 && tensor_cols(dout) == dtable->shape[1] &&
              tensor_rows(dout) == tensor_numel(ids),
          "embedding_backward: dtable %s dout %s ids %s", DESC(dtable), DESC(dout), DESC(ids));
    CHECK(vocab_start >= 0, "vocab_start %lld", (long long)vocab_start);
    b->ops->embedding_backward(b, dtable, dout, ids, vocab_start);
    after_op(b);
}

void op_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                        const struct tensor *dx, const struct tensor *positions)
{
    check_float(b, dtable, "position_embedding_backward dtable");
    check_float(b, dx, "position_embedding_backward dx");
    check_i32(b, positions, "position_embedding_backward positions");
    CHECK(dtable->dtype == DTYPE_F32 || dtable->dtype == dx->dtype,
          "position_embedding_backward: dtable %s must be f32 or dx's dtype (%s)", DESC(dtable),
          DESC(dx));
    CHECK(dtable->ndim == 2 && tensor_cols(dx) == dtable->shape[1] &&
              tensor_rows(dx) == tensor_numel(positions),
          "position_embedding_backward: dtable %s dx %s positions %s", DESC(dtable), DESC(dx),
          DESC(positions));
    b->ops->position_embedding_add_backward(b, dtable, dx, positions);
    after_op(b);
}

void op_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                        const struct tensor *dbias, const struct tensor *dy,
                        const struct tensor *x, const struct tensor *w, int accumulate_dx)
{
    check_float(b, dy, "matmul_backward dy");
    const int64_t m = tensor_rows(dy), n = tensor_cols(dy);
    if (dx) {
        CHECK(w != NULL, "matmul_backward: dx needs w");
        check_float(b, dx, "matmul_backward dx");
        CHECK(dx->dtype == dy->dtype && tensor_rows(dx) == m,
              "matmul_backward: dx %s dy %s", DESC(dx), DESC(dy));
        CHECK(dx->data != dy->data && (!x || dx->data != x->data) && dx->data != w->data,
              "matmul_backward: dx aliases an input");
    }
    if (w) {
        check_float(b, w, "matmul_backward w");
        CHECK(w->dtype == dy->dtype && w->ndim == 2 && w->shape[0] == n &&
                  (!dx || tensor_cols(dx) == w->shape[1]),
              "matmul_backward: w %s dy %s dx %s", DESC(w), DESC(dy), dx ? DESC(dx) : "NULL");
    }
    if (dw) {
        CHECK(x != NULL, "matmul_backward: dw needs x");
        check_float(b, dw, "matmul_backward dw");
        CHECK(dw->dtype == DTYPE_F32 || dw->dtype == dy->dtype,
              "matmul_backward: dw %s must be f32 or %s", DESC(dw), dtype_name(dy->dtype));
        CHECK(dw->ndim == 2 && dw->shape[0] == n && dw->shape[1] == tensor_cols(x),
              "matmul_backward: dw %s for dy %s x %s", DESC(dw), DESC(dy), DESC(x));
    }
    if (x) {
        check_float(b, x, "matmul_backward x");
        CHECK(x->dtype == dy->dtype && tensor_rows(x) == m && (!w || tensor_cols(x) == w->shape[1]),
              "matmul_backward: x %s dy %s w %s", DESC(x), DESC(dy), w ? DESC(w) : "NULL");
    }
    if (dbias) {
        check_float(b, dbias, "matmul_backward dbias");
        CHECK((dbias->dtype == DTYPE_F32 || dbias->dtype == dy->dtype) && tensor_numel(dbias) == n,
              "matmul_backward: dbias %s for dy %s", DESC(dbias), DESC(dy));
    }
    if (!dx && !dw && !dbias) return;
    b->ops->matmul_backward(b, dx, dw, dbias, dy, x, w, accumulate_dx);
    after_op(b);
}

void op_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                         const struct tensor *dout, const struct tensor *x,
                         const struct tensor *weight, float eps)
{
    check_float(b, dx, "rmsnorm_backward dx");
    check_float(b, dout, "rmsnorm_backward dout");
    check_float(b, x, "rmsnorm_backward x");
    check_float(b, weight, "rmsnorm_backward weight");
    check_same(dx, x, "rmsnorm_backward dx/x");
    check_same(dout, x, "rmsnorm_backward dout/x");
    check_vector(weight, tensor_cols(x), x->dtype, "rmsnorm_backward weight");
    if (dweight) check_weight_grad(b, dweight, weight, x->dtype, "rmsnorm_backward dweight");
    CHECK(dx->data != x->data, "rmsnorm_backward: dx aliases x");
    CHECK(eps >= 0.0f, "rmsnorm eps %g", (double)eps);
    b->ops->rmsnorm_backward(b, dx, dweight, dout, x, weight, eps);
    after_op(b);
}

void op_layernorm_backward(struct backend *b, const struct tensor *dx,
                           const struct tensor *dweight, const struct tensor *dbias,
                           const struct tensor *dout, const struct tensor *x,
                           const struct tensor *weight, float eps)
{
    check_float(b, dx, "layernorm_backward dx");
    check_float(b, dout, "layernorm_backward dout");
    check_float(b, x, "layernorm_backward x");
    check_float(b, weight, "layernorm_backward weight");
    check_same(dx, x, "layernorm_backward dx/x");
    check_same(dout, x, "layernorm_backward dout/x");
    check_vector(weight, tensor_cols(x), x->dtype, "layernorm_backward weight");
    if (dweight) check_weight_grad(b, dweight, weight, x->dtype, "layernorm_backward dweight");
    if (dbias) check_weight_grad(b, dbias, weight, x->dtype, "layernorm_backward dbias");
    CHECK(dx->data != x->data, "layernorm_backward: dx aliases x");
    CHECK(eps >= 0.0f, "layernorm eps %g", (double)eps);
    b->ops->layernorm_backward(b, dx, dweight, dbias, dout, x, weight, eps);
    after_op(b);
}

void op_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                      int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    check_float(b, dx, "rope_backward dx");
    check_i32(b, positions, "rope_backward positions");
    CHECK(dx->ndim == 3 && dx->shape[0] == tensor_numel(positions),
          "rope_backward: dx %s must be (n, n_heads, head_dim), positions %s", DESC(dx),
          DESC(positions));
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= dx->shape[2],
          "rope_backward: rot_dim %d, head_dim %lld", rot_dim, (long long)dx->shape[2]);
    check_rope(b, rp, rot_dim);
    CHECK(style == ROPE_STYLE_PAIRS || style == ROPE_STYLE_HALVES, "rope style %d", (int)style);
    b->ops->rope_backward(b, dx, positions, rot_dim, rp, style);
    after_op(b);
}

void op_activation_backward(struct backend *b, const struct tensor *dx, const struct tensor *dout,
                            const struct tensor *x, enum activation act)
{
    check_float(b, dx, "activation_backward dx");
    check_float(b, dout, "activation_backward dout");
    check_float(b, x, "activation_backward x");
    check_same(dx, x, "activation_backward dx/x");
    check_same(dout, x, "activation_backward dout/x");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF,
          "activation %d", (int)act);
    b->ops->activation_backward(b, dx, dout, x, act);
    after_op(b);
}

void op_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                  const struct tensor *dup, const struct tensor *dout,
                                  const struct tensor *gate, const struct tensor *up,
                                  enum activation act)
{
    check_float(b, dgate, "gated_activation_backward dgate");
    check_float(b, dup, "gated_activation_backward dup");
    check_float(b, dout, "gated_activation_backward dout");
    check_float(b, gate, "gated_activation_backward gate");
    check_float(b, up, "gated_activation_backward up");
    check_same(dgate, gate, "gated_activation_backward dgate/gate");
    check_same(dup, gate, "gated_activation_backward dup/gate");
    check_same(dout, gate, "gated_activation_backward dout/gate");
    check_same(up, gate, "gated_activation_backward up/gate");
    CHECK(dgate->data != dup->data && dgate->data != up->data && dup->data != gate->data,
          "gated_activation_backward: dgate and dup must be distinct, dgate must not alias up "
          "nor dup gate");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF,
          "activation %d", (int)act);
    b->ops->gated_activation_backward(b, dgate, dup, dout, gate, up, act);
    after_op(b);
}

/* h (n, d) and w (vocab_local, d) of one dtype, targets i32 (n). */
static void check_lm_head(struct backend *b, const struct tensor *h, const struct tensor *w,
                          const struct tensor *targets, int64_t vocab_start, const char *what)
{
    check_float(b, h, what);
    check_float(b, w, what);
    check_i32(b, targets, what);
    CHECK(h->dtype == w->dtype && w->ndim == 2 && tensor_cols(h) == w->shape[1] &&
              tensor_numel(targets) == tensor_rows(h),
          "%s: h %s w %s targets %s", what, DESC(h), DESC(w), DESC(targets));
    CHECK(vocab_start >= 0, "%s: vocab_start %lld", what, (long long)vocab_start);
}

void op_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                            const struct tensor *w, const struct tensor *targets,
                            int64_t vocab_start, float softcap)
{
    CHECK(softcap >= 0.0f && isfinite(softcap), "cross_entropy_stats: softcap %g", (double)softcap);
    check_lm_head(b, h, w, targets, vocab_start, "cross_entropy_stats");
    check_on(b, stats, "cross_entropy_stats stats");
    CHECK(stats->dtype == DTYPE_F32 && tensor_cols(stats) == 3 &&
              tensor_rows(stats) == tensor_rows(h),
          "cross_entropy_stats: stats %s must be f32 (n, 3) for h %s", DESC(stats), DESC(h));
    CHECK(w->shape[0] > 0, "cross_entropy_stats: empty vocabulary shard");
    b->ops->cross_entropy_stats(b, stats, h, w, targets, vocab_start, softcap);
    after_op(b);
}

void op_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                              const struct tensor *lse, const struct tensor *stats,
                              const struct tensor *targets)
{
    check_on(b, loss, "cross_entropy_combine loss");
    check_on(b, lse, "cross_entropy_combine lse");
    check_on(b, stats, "cross_entropy_combine stats");
    check_i32(b, targets, "cross_entropy_combine targets");
    int64_t n = tensor_numel(targets);
    check_vector(loss, n, DTYPE_F32, "cross_entropy_combine loss");
    check_vector(lse, n, DTYPE_F32, "cross_entropy_combine lse");
    CHECK(stats->dtype == DTYPE_F32 && tensor_cols(stats) == 3 &&
              (n == 0 || (tensor_rows(stats) % n == 0 && tensor_rows(stats) >= n)),
          "cross_entropy_combine: stats %s must be f32 (n_shards, %lld, 3)", DESC(stats),
          (long long)n);
    CHECK(n == 0 || loss->data != lse->data, "cross_entropy_combine: loss aliases lse");
    if (n == 0) return;
    b->ops->cross_entropy_combine(b, loss, lse, stats, targets);
    after_op(b);
}

void op_cross_entropy_backward(struct backend *b, const struct tensor *dh, const struct tensor *dw,
                               const struct tensor *h, const struct tensor *w,
                               const struct tensor *targets, const struct tensor *lse,
                               const struct tensor *row_scale, float scale, int64_t vocab_start,
                               int accumulate_dh, float softcap)
{
    CHECK(softcap >= 0.0f && isfinite(softcap), "cross_entropy_backward: softcap %g", (double)softcap);
    check_lm_head(b, h, w, targets, vocab_start, "cross_entropy_backward");
    check_float(b, dh, "cross_entropy_backward dh");
    check_same(dh, h, "cross_entropy_backward dh/h");
    CHECK(dh->data != h->data && dh->data != w->data, "cross_entropy_backward: dh aliases h or w");
    if (dw) check_weight_grad(b, dw, w, h->dtype, "cross_entropy_backward dw");
    check_on(b, lse, "cross_entropy_backward lse");
    check_vector(lse, tensor_rows(h), DTYPE_F32, "cross_entropy_backward lse");
    if (row_scale) {
        check_on(b, row_scale, "cross_entropy_backward row_scale");
        check_vector(row_scale, tensor_rows(h), DTYPE_F32, "cross_entropy_backward row_scale");
    }
    b->ops->cross_entropy_backward(b, dh, dw, h, w, targets, lse, row_scale, scale, vocab_start,
                                   accumulate_dh, softcap);
    after_op(b);
}

void op_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
              const struct tensor *m, const struct tensor *v, const struct adamw_params *hp)
{
    const struct tensor *all[4] = {p, g, m, v};
    static const char *const names[4] = {"adamw p", "adamw g", "adamw m", "adamw v"};
    for (int i = 0; i < 4; i++) {
        check_on(b, all[i], names[i]);
        check_vector(all[i], tensor_numel(p), DTYPE_F32, names[i]);
    }
    CHECK(p->data != g->data && p->data != m->data && p->data != v->data && g->data != m->data &&
              g->data != v->data && m->data != v->data,
          "adamw: p, g, m, v must be distinct buffers");
    CHECK(hp->step >= 1 && hp->beta1 >= 0.0f && hp->beta1 < 1.0f && hp->beta2 >= 0.0f &&
              hp->beta2 < 1.0f && hp->eps >= 0.0f,
          "adamw: step %lld beta1 %g beta2 %g eps %g", (long long)hp->step, (double)hp->beta1,
          (double)hp->beta2, (double)hp->eps);
    b->ops->adamw(b, p, g, m, v, hp);
    after_op(b);
}

void op_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    check_float(b, x, "sum_squares x");
    check_on(b, out, "sum_squares out");
    check_vector(out, 1, DTYPE_F32, "sum_squares out");
    b->ops->sum_squares(b, out, x);
    after_op(b);
}
