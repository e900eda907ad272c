/* kernels/ops.c - the op_* wrappers of ops.h: each checks its shape and dtype contract once,
 * for every backend, then calls the backend's slot; with sync_check it synchronizes after the
 * op so that an asynchronous device error is reported by the op that caused it.
 * Not here: any arithmetic (kernels/cpu/, kernels/cuda/); the training ops' wrappers
 * (ops_train.c).
 * Tests: tests/test_ops.c. */
#include "ops.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend_impl.h"
#include "ops_check.h"
#include "quant.h"

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
    const char *bi = getenv("SHARDLM_BATCH_INVARIANT");
    (*out)->batch_invariant = bi && bi[0] == '1';
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

enum status backend_host_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    if (b->ops->host_alloc && b->ops->host_alloc(b, nbytes, ptr) == STATUS_OK) return STATUS_OK;
    *ptr = NULL; /* ordinary memory: no backend kind, or the backend's refused (host_free tells them apart) */
    if (posix_memalign(ptr, 256, nbytes ? nbytes : 256) != 0) {
        *ptr = NULL;
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of host memory allocating %zu bytes", nbytes);
    }
    return STATUS_OK;
}

void backend_host_free(struct backend *b, void *ptr)
{
    if (!ptr) return;
    if (b->ops->host_free) b->ops->host_free(b, ptr);
    else free(ptr);
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

void backend_upload(struct backend *b, void *dst, const void *src, size_t n)
{
    b->n_uploads++;
    b->ops->upload(b, dst, src, n);
    after_op(b);
}

void backend_download(struct backend *b, void *dst, const void *src, size_t n)
{
    b->n_downloads++;
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

enum status backend_graph_begin(struct backend *b)
{
    if (!b->ops->graph_begin) return status_errorf(STATUS_UNAVAILABLE, "%s: no graphs", b->ops->name);
    return b->ops->graph_begin(b);
}

enum status backend_graph_end(struct backend *b, struct backend_graph **out)
{
    void *g = NULL;
    const enum status st = b->ops->graph_end(b, &g);
    *out = st == STATUS_OK ? g : NULL;
    return st;
}

enum status backend_graph_launch(struct backend *b, struct backend_graph *g)
{
    const enum status st = b->ops->graph_launch(b, g);
    if (st == STATUS_OK) after_op(b);
    return st;
}

void backend_graph_free(struct backend *b, struct backend_graph *g)
{
    if (g) b->ops->graph_free(b, g);
}

int backend_host_workers(const struct backend *b)
{
    const int t = b->device == DEVICE_CPU && b->n_threads > 0 ? b->n_threads : omp_get_max_threads();
    return t < 1 ? 1 : t > BACKEND_HOST_MAX_WORKERS ? BACKEND_HOST_MAX_WORKERS : t;
}

void backend_host_parallel(struct backend *b, int n, void (*fn)(void *ctx, int i, int worker), void *ctx)
{
    const int w = backend_host_workers(b), t = w < n ? w : n;
    if (t <= 1) {
        for (int i = 0; i < n; i++) fn(ctx, i, 0);
        return;
    }
#pragma omp parallel for num_threads(t) schedule(dynamic, 1)
    for (int i = 0; i < n; i++) fn(ctx, i, omp_get_thread_num());
}

enum status backend_mem_info(struct backend *b, size_t *free_bytes, size_t *total_bytes)
{
    return b->ops->mem_info(b, free_bytes, total_bytes);
}

/* ---- contract checks --------------------------------------------------------------------- */

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

/* A bf16 or f16 weight beside f32 activations: the CPU backend reads it so (model_load). */
static int cpu_half_weight(const struct backend *b, const struct tensor *w, const struct tensor *act)
{
    return b->device == DEVICE_CPU && (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16) && act->dtype == DTYPE_F32;
}

void op_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                  const struct tensor *ids, int64_t vocab_start)
{
    check_float(b, out, "embedding out");
    if (dtype_is_quant(table->dtype)) { /* rows dequantized on lookup */
        check_quant_weight(b, table, out, "embedding table");
    } else {
        check_float(b, table, "embedding table");
        CHECK(out->dtype == table->dtype || cpu_half_weight(b, table, out),
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

static void check_matmul(struct backend *b, const struct tensor *y, const struct tensor *x, const struct tensor *w,
                         const struct tensor *bias)
{
    check_float(b, y, "matmul y");
    check_float(b, x, "matmul x");
    if (dtype_is_quant(w->dtype)) check_quant_weight(b, w, x, "matmul w"); /* quant.h's product */
    else check_float(b, w, "matmul w");
    CHECK((x->dtype == w->dtype || dtype_is_quant(w->dtype) || cpu_half_weight(b, w, x)) && y->dtype == x->dtype,
          "matmul dtypes y %s x %s w %s", DESC(y), DESC(x), DESC(w));
    CHECK(w->ndim == 2 && tensor_cols(x) == w->shape[1] && tensor_cols(y) == w->shape[0] &&
              tensor_rows(y) == tensor_rows(x),
          "matmul: y %s = x %s @ w %s^T", DESC(y), DESC(x), DESC(w));
    CHECK(y->data != x->data && y->data != w->data, "matmul: y aliases an input");
    if (bias) {
        check_float(b, bias, "matmul bias");
        check_vector(bias, w->shape[0], x->dtype, "matmul bias");
    }
}

void op_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
               const struct tensor *w, const struct tensor *bias)
{
    check_matmul(b, y, x, w, bias);
    b->ops->matmul(b, y, x, w, bias);
    after_op(b);
}

void op_matmul_many(struct backend *b, int count, const struct tensor *const *y, const struct tensor *x,
                    const struct tensor *const *w, const struct tensor *const *bias)
{
    CHECK(count >= 1 && count <= OP_MATMUL_MANY_MAX, "matmul_many: %d products (1 .. %d)", count, OP_MATMUL_MANY_MAX);
    for (int i = 0; i < count; i++) {
        check_matmul(b, y[i], x, w[i], bias[i]);
        for (int j = 0; j < i; j++)
            CHECK(!y[i]->data || y[i]->data != y[j]->data, "matmul_many: y[%d] aliases y[%d]", i, j);
    }
    if (b->ops->matmul_many) {
        b->ops->matmul_many(b, count, y, x, w, bias);
    } else {
        for (int i = 0; i < count; i++) b->ops->matmul(b, y[i], x, w[i], bias[i]);
    }
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

void op_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out, const struct tensor *a,
                    const struct tensor *c, const struct tensor *weight, float eps)
{
    check_float(b, sum, "add_rmsnorm sum");
    check_float(b, out, "add_rmsnorm out");
    check_float(b, a, "add_rmsnorm a");
    check_float(b, c, "add_rmsnorm c");
    check_float(b, weight, "add_rmsnorm weight");
    check_same(sum, a, "add_rmsnorm sum/a");
    check_same(a, c, "add_rmsnorm a/c");
    check_same(out, a, "add_rmsnorm out/a");
    check_vector(weight, tensor_cols(a), a->dtype, "add_rmsnorm weight");
    CHECK(out->data != sum->data && out->data != a->data && out->data != c->data,
          "add_rmsnorm: out aliases sum, a or c");
    CHECK(eps >= 0.0f, "add_rmsnorm eps %g", (double)eps);
    b->ops->add_rmsnorm(b, sum, out, a, c, weight, eps);
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

void op_scatter_add_rows(struct backend *b, const struct tensor *out, const struct tensor *y,
                         const struct tensor *ids, const struct tensor *weights)
{
    check_float(b, out, "scatter_add_rows out");
    check_float(b, y, "scatter_add_rows y");
    check_i32(b, ids, "scatter_add_rows ids");
    check_on(b, weights, "scatter_add_rows weights");
    CHECK(y->dtype == out->dtype && tensor_cols(y) == tensor_cols(out) && out->ndim == 2 && y->ndim == 2,
          "scatter_add_rows: out %s y %s", DESC(out), DESC(y));
    check_vector(ids, tensor_rows(y), DTYPE_I32, "scatter_add_rows ids");
    check_vector(weights, tensor_rows(y), DTYPE_F32, "scatter_add_rows weights");
    if (tensor_rows(y) == 0) return;
    b->ops->scatter_add_rows(b, out, y, ids, weights);
    after_op(b);
}

void op_scatter_add_rows_backward(struct backend *b, const struct tensor *dy, const struct tensor *dweights,
                                  const struct tensor *dout, const struct tensor *y, const struct tensor *ids,
                                  const struct tensor *weights)
{
    check_float(b, dy, "scatter_add_rows_backward dy");
    check_float(b, dout, "scatter_add_rows_backward dout");
    check_float(b, y, "scatter_add_rows_backward y");
    check_i32(b, ids, "scatter_add_rows_backward ids");
    check_on(b, weights, "scatter_add_rows_backward weights");
    CHECK(y->dtype == dout->dtype && dy->dtype == y->dtype && tensor_cols(y) == tensor_cols(dout) &&
              dout->ndim == 2 && y->ndim == 2 && dy->ndim == 2 && tensor_rows(dy) == tensor_rows(y) &&
              tensor_cols(dy) == tensor_cols(y) && dy->data != dout->data,
          "scatter_add_rows_backward: dy %s dout %s y %s", DESC(dy), DESC(dout), DESC(y));
    check_vector(ids, tensor_rows(y), DTYPE_I32, "scatter_add_rows_backward ids");
    check_vector(weights, tensor_rows(y), DTYPE_F32, "scatter_add_rows_backward weights");
    if (dweights) {
        check_on(b, dweights, "scatter_add_rows_backward dweights");
        check_vector(dweights, tensor_rows(y), DTYPE_F32, "scatter_add_rows_backward dweights");
    }
    if (tensor_rows(y) == 0) return;
    b->ops->scatter_add_rows_backward(b, dy, dweights, dout, y, ids, weights);
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

static void check_rope_args(struct backend *b, const struct tensor *x, const struct tensor *positions, int rot_dim,
                            const struct rope_params *rp, enum rope_style style)
{
    check_float(b, x, "rope x");
    check_i32(b, positions, "rope positions");
    CHECK(x->ndim == 3 && x->shape[0] == tensor_numel(positions),
          "rope: x %s must be (n, n_heads, head_dim), positions %s", DESC(x), DESC(positions));
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= x->shape[2], "rope: rot_dim %d, head_dim %lld",
          rot_dim, (long long)x->shape[2]);
    check_rope(rp, rot_dim);
    CHECK(style == ROPE_STYLE_PAIRS || style == ROPE_STYLE_HALVES, "rope style %d", (int)style);
}

void rope_frequencies(float theta, int rot_dim, const float *factors, float *freqs)
{
    for (int i = 0; i < rot_dim / 2; i++) {
        freqs[i] = powf(theta, -(float)(2 * i) / (float)rot_dim);
        if (factors) freqs[i] /= factors[i];
    }
}

void op_rope(struct backend *b, const struct tensor *x, const struct tensor *positions,
             int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    check_rope_args(b, x, positions, rot_dim, rp, style);
    b->ops->rope(b, x, positions, rot_dim, rp, style);
    after_op(b);
}

void op_rope_qk(struct backend *b, const struct tensor *q, const struct tensor *k, const struct tensor *positions,
                int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    check_rope_args(b, q, positions, rot_dim, rp, style);
    check_rope_args(b, k, positions, rot_dim, rp, style);
    CHECK(q->dtype == k->dtype && q->shape[2] == k->shape[2] && q->data != k->data,
          "rope_qk: q %s and k %s must share a dtype and head_dim, and not alias", DESC(q), DESC(k));
    if (b->ops->rope_qk) {
        b->ops->rope_qk(b, q, k, positions, rot_dim, rp, style);
    } else {
        b->ops->rope(b, q, positions, rot_dim, rp, style);
        b->ops->rope(b, k, positions, rot_dim, rp, style);
    }
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
    if (batch->sinks.data) { /* attention sinks: one f32 logit per query head of this call */
        check_on(b, &batch->sinks, "attention sinks");
        CHECK(batch->sinks.dtype == DTYPE_F32 && batch->sinks.ndim == 1 &&
                  batch->sinks.shape[0] == q->shape[1],
              "attention sinks must be f32 (n_heads = %lld), are %s", (long long)q->shape[1],
              DESC(&batch->sinks));
    }
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
          "activation %d (ACTIVATION_SWIGLU_OAI is gated only)", (int)act);
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
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF ||
              act == ACTIVATION_SWIGLU_OAI,
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

void op_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                   const struct tensor *inv_temp)
{
    check_float(b, x, "logit_mass x");
    check_on(b, mass, "logit_mass mass");
    check_on(b, inv_temp, "logit_mass inv_temp");
    CHECK(mass->dtype == DTYPE_F32 && inv_temp->dtype == DTYPE_F32 && tensor_numel(mass) == tensor_rows(x) &&
              tensor_numel(inv_temp) == tensor_rows(x),
          "logit_mass: mass %s inv_temp %s x %s", DESC(mass), DESC(inv_temp), DESC(x));
    b->ops->logit_mass(b, mass, x, inv_temp);
    after_op(b);
}

void op_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                   const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                   const struct tensor *u)
{
    check_float(b, x, "logit_draw x");
    check_i32(b, ids, "logit_draw ids");
    check_on(b, margin, "logit_draw margin");
    check_on(b, temp, "logit_draw temp");
    check_on(b, u, "logit_draw u");
    const int64_t n = tensor_rows(x);
    CHECK(margin->dtype == DTYPE_F32 && temp->dtype == DTYPE_F32 && u->dtype == DTYPE_F32 &&
              tensor_numel(ids) == n && tensor_numel(margin) == n && tensor_numel(temp) == n && tensor_numel(u) == n,
          "logit_draw: ids %s margin %s temp %s u %s x %s", DESC(ids), DESC(margin), DESC(temp), DESC(u), DESC(x));
    if (top_p) {
        check_on(b, top_p, "logit_draw top_p");
        CHECK(top_p->dtype == DTYPE_F32 && tensor_numel(top_p) == n, "logit_draw: top_p %s x %s", DESC(top_p), DESC(x));
    }
    b->ops->logit_draw(b, ids, margin, x, temp, top_p, u);
    after_op(b);
}

void op_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *ids,
                   const struct tensor *vals)
{
    check_float(b, x, "logit_edit x");
    check_i32(b, rows, "logit_edit rows");
    check_i32(b, ids, "logit_edit ids");
    check_on(b, vals, "logit_edit vals");
    const int64_t e = tensor_numel(ids);
    CHECK(vals->dtype == DTYPE_F32 && tensor_numel(rows) == e && tensor_numel(vals) == 3 * e,
          "logit_edit: rows %s ids %s vals %s x %s", DESC(rows), DESC(ids), DESC(vals), DESC(x));
    if (e == 0) return;
    b->ops->logit_edit(b, x, rows, ids, vals);
    after_op(b);
}

void op_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *mask)
{
    check_float(b, x, "logit_mask x");
    check_i32(b, rows, "logit_mask rows");
    check_i32(b, mask, "logit_mask mask");
    CHECK(tensor_rows(mask) == tensor_numel(rows) && tensor_cols(mask) * 32 >= tensor_cols(x),
          "logit_mask: rows %s mask %s x %s", DESC(rows), DESC(mask), DESC(x));
    if (tensor_numel(rows) == 0) return;
    b->ops->logit_mask(b, x, rows, mask);
    after_op(b);
}

void op_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want)
{
    check_float(b, x, "logit_lse x");
    check_on(b, lse, "logit_lse lse");
    check_on(b, want, "logit_lse want");
    CHECK(lse->dtype == DTYPE_F32 && want->dtype == DTYPE_F32 && tensor_numel(lse) == tensor_rows(x) &&
              tensor_numel(want) == tensor_rows(x),
          "logit_lse: lse %s want %s x %s", DESC(lse), DESC(want), DESC(x));
    b->ops->logit_lse(b, lse, x, want);
    after_op(b);
}
