/* engine/model/model_train.c - the training forward (activations kept), the cross-entropy over
 * the LM head, and model_backward, its mirror (model_train.h).
 * Not here: the serving forward (model.c), data, optimizer and loop (engine/train/).
 * Tests: tests/test_train_grad.py (gradients against JAX), tests/test_train.c. */
#include "model_train_impl.h"

#include "layer.h"

#include "lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct tensor *opt(const struct tensor *t) { return t && t->data ? t : NULL; }

/* ---- forward ----------------------------------------------------------------------------- */

/* dx = d norm(x) / dx applied to dout; dweight/dbias += (NULL-data tensors are skipped). */
static void norm_bwd(const struct model *m, const struct tensor *dx, const struct tensor *dw,
                     const struct tensor *dbias, const struct tensor *dout, const struct tensor *x,
                     const struct tensor *w)
{
    if (m->cfg.norm == NORM_KIND_RMSNORM) op_rmsnorm_backward(m->b, dx, opt(dw), dout, x, w, m->cfg.norm_eps);
    else op_layernorm_backward(m->b, dx, opt(dw), opt(dbias), dout, x, w, m->cfg.norm_eps);
}

/* dres += d pre_norm(x) / dx applied to dsum (dtmp as scratch; the weight's gradient +=): the
 * norm's backward, or dsum itself for a model without pre-norms (layer_pre_norm). */
static void pre_norm_bwd(const struct model *m, const struct tensor *dres, const struct tensor *dtmp,
                         const struct tensor *dw, const struct tensor *dbias, const struct tensor *dsum,
                         const struct tensor *x, const struct tensor *w)
{
    if (m->cfg.no_pre_norms || !w->data) { /* no norm there (an EAGLE head's attention) */
        op_add(m->b, dres, dres, dsum);
        return;
    }
    norm_bwd(m, dtmp, dw, dbias, dsum, x, w);
    op_add(m->b, dres, dres, dtmp);
}

static struct attention_train_batch attention_batch(const struct model_train *t, const struct train_batch *tb)
{
    const struct model *m = t->m;
    const struct train_activations *a = t->a;
    return (struct attention_train_batch){
        .n_docs = tb->n_docs,
        .doc_start = tensor_first_rows(&a->doc_start, tb->n_docs + 1),
        .scale = m->cfg.attn_scale > 0.0f ? m->cfg.attn_scale : 1.0f / sqrtf((float)m->cfg.head_dim),
        .window = 0,
        .softcap = m->cfg.attn_softcap,
    };
}

/* The adapters of a target, when the model has them (lora.h): y += s (x A^T) B^T, and back. */
static void adapt(struct model_train *t, int l, enum lora_target target, const struct tensor *y, const struct tensor *x)
{
    if (t->lora) lora_forward(t->lora, t->m->b, l, target, y, x);
}

static void adapt_back(struct model_train *t, int l, enum lora_target target, const struct tensor *dx,
                       const struct tensor *dy, const struct tensor *x)
{
    if (t->lora) lora_backward(t->lora, t->m->b, l, target, dx, dy, x);
}

/* One decoder layer, in the order of the math (as layer_forward in model.c), keeping what the
 * backward needs. x (T, d) is the residual stream, read and updated in place. */
#define TRY(call)                                                                                  \
    do {                                                                                           \
        enum status try_st_ = (call);                                                              \
        if (try_st_ != STATUS_OK) return try_st_;                                                  \
    } while (0)

/* ---- tensor parallelism's collectives ----------------------------------------------------- */

/* Rows of the residual stream this rank holds: T / tp under sequence parallelism. */
static int64_t local_rows(const struct model_train *t, int64_t T) { return train_sp(t) ? T / t->m->tp_size : T; }

/* All T rows of a residual-stream tensor held as local rows: all-gathered into buf under
 * sequence parallelism (Megatron's g), the tensor itself otherwise. */
static enum status gather_rows(struct model_train *t, const struct tensor *local, const struct tensor *buf, int64_t T,
                               struct tensor *full)
{
    struct model *m = t->m;
    if (!train_sp(t)) {
        *full = *local;
        return STATUS_OK;
    }
    *full = tensor_first_rows(buf, T);
    return comm_all_gather(m->par.groups->tp, full, local);
}

/* The buffer a row-parallel product writes its partial sums (T rows) into: dfull under
 * sequence parallelism, out (local = T rows) itself otherwise. */
static struct tensor partial_rows(struct model_train *t, const struct tensor *out, int64_t T)
{
    return train_sp(t) ? tensor_first_rows(&t->a->dfull, T) : *out;
}

/* Sums partial (T rows) over tp into out (local rows): reduce-scatter under sequence
 * parallelism, all-reduce in place otherwise (partial is out). Megatron's f. */
static enum status reduce_rows(struct model_train *t, const struct tensor *partial, const struct tensor *out)
{
    struct model *m = t->m;
    if (m->tp_size == 1) return STATUS_OK;
    if (!train_sp(t)) return comm_all_reduce(m->par.groups->tp, partial);
    return comm_reduce_scatter(m->par.groups->tp, out, partial);
}

/* The gradient of a column-parallel block's input: dxn (T rows) summed over tp into local rows
 * (*out: dxn itself, or the first local rows of dfull under sequence parallelism). */
static enum status sum_input_grad(struct model_train *t, int64_t T, struct tensor *out)
{
    struct tensor dxn = tensor_first_rows(&t->a->dxn, T);
    *out = train_sp(t) ? tensor_first_rows(&t->a->dfull, local_rows(t, T)) : dxn;
    return reduce_rows(t, &dxn, out);
}

/* ---- one layer, forward --------------------------------------------------------------------- */

/* The layer's training hooks (layer.h): sequence parallelism's gathers and reduce-scatters,
 * the trained adapters, attention within the micro-batch's documents. */
struct train_ctx {
    struct model_train *t;
    const struct attention_train_batch *batch;
};

static enum status train_gather(void *ctx, const struct tensor *local, int64_t T, struct tensor *full)
{
    struct model_train *t = ((struct train_ctx *)ctx)->t;
    return gather_rows(t, local, &t->a->gath, T, full);
}

static struct tensor train_partial(void *ctx, const struct tensor *out, int64_t T)
{
    return partial_rows(((struct train_ctx *)ctx)->t, out, T);
}

static enum status train_reduce(void *ctx, const struct tensor *partial, const struct tensor *out)
{
    return reduce_rows(((struct train_ctx *)ctx)->t, partial, out);
}

static void train_adapt(void *ctx, int l, enum lora_target target, const struct tensor *y, const struct tensor *x)
{
    adapt(((struct train_ctx *)ctx)->t, l, target, y, x);
}

static void train_attend(void *ctx, int l, int window, const struct tensor *q3, const struct tensor *k3,
                         const struct tensor *v3, const struct tensor *att3, const struct tensor *lse)
{
    struct train_ctx *tc = ctx;
    struct attention_train_batch ab = *tc->batch;
    ab.window = window;
    ab.sinks = tc->t->m->w.layers[l].sinks; /* GPT-OSS's, f32; data NULL for every other model */
    op_attention_train(tc->t->m->b, att3, lse, q3, k3, v3, &ab);
}

static struct layer_hooks train_hooks(struct train_ctx *tc)
{
    return (struct layer_hooks){.ctx = tc, .gather = train_gather, .partial = train_partial, .reduce = train_reduce,
                                .adapt = train_adapt, .attend = train_attend};
}

/* Layer l's activation set as the layer's tensors (layer.h); x (Tl rows) is the residual
 * stream (NULL: none, for a recomputation of the layer's insides). */
static struct layer_tensors train_tensors(struct model_train *t, int l, int64_t T, const struct tensor *x)
{
    struct model *m = t->m;
    struct layer_acts *la = &t->a->layers[l];
    const int64_t Tl = local_rows(t, T);
    const int qk = m->cfg.qk_norm, sandwich = m->cfg.sandwich_norms;
    struct tensor dtmp = tensor_first_rows(&t->a->dtmp, Tl);
    return (struct layer_tensors){
        .x = x ? *x : dtmp, .x_in = tensor_first_rows(&la->x_in, Tl), .x_mid = tensor_first_rows(&la->x_mid, Tl),
        .xn1 = tensor_first_rows(&la->xn1, Tl), .xn2 = tensor_first_rows(&la->xn2, Tl),
        .q_pre = qk ? la->q_pre : la->q, .k_pre = qk ? la->k_pre : la->k,
        .q = la->q, .k = la->k, .v = la->v, .att = la->att, .lse = la->lse,
        .gate = la->gate, .up = la->up, .hact = la->hact,
        .attn_out = sandwich ? tensor_first_rows(&la->attn_out, Tl) : dtmp,
        .mlp_out = sandwich ? tensor_first_rows(&la->mlp_out, Tl) : dtmp,
        .normed = dtmp, .pos = t->a->positions, .moe = config_layer_moe(&m->cfg, m->layer_first + l) ? &la->moe : NULL,
        .qk_full = t->a->qk_full,
    };
}

/* One decoder layer (layer.c), keeping what the backward needs. x (Tl, d) is the residual
 * stream, read and updated in place. */
static enum status layer_forward_train(struct model_train *t, int l, int64_t T, const struct tensor *x,
                                       const struct attention_train_batch *batch)
{
    struct model *m = t->m;
    struct train_ctx tc = {.t = t, .batch = batch};
    const struct layer_tensors lt = train_tensors(t, l, T, x);
    const struct layer_hooks h = train_hooks(&tc);
    return layer_forward(m, l, T, &lt, &h, 0);
}

static enum status check_batch(const struct model_train *t, const struct train_batch *tb)
{
    const struct model *m = t->m;
    if (tb->n_tokens <= 0 || tb->n_tokens > t->a->max_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch of %d tokens (at most %d)",
                             tb->n_tokens, t->a->max_tokens);
    const int multiple = model_train_row_multiple(m, &t->mem);
    if (tb->n_tokens % multiple)
        return status_errorf(STATUS_INVALID_ARGUMENT, "sequence parallelism: a micro-batch of %d rows is not a "
                             "multiple of tp %d", tb->n_tokens, multiple);
    if (tb->n_docs <= 0 || tb->doc_start[0] != 0 || tb->doc_start[tb->n_docs] != tb->n_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: documents do not cover its %d rows",
                             tb->n_tokens);
    for (int i = 0; i < 2; i++) {
        const struct tensor *r = i ? tb->extra_grad : tb->input;
        if (r && (m->tp_size > 1 || m->pp_size > 1 || tensor_rows(r) != tb->n_tokens ||
                  tensor_cols(r) != m->cfg.d_model || r->dtype != m->dtype))
            return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: %s needs one rank and (%d, %d) rows "
                                 "of the compute dtype", i ? "an extra gradient" : "input rows", tb->n_tokens,
                                 m->cfg.d_model);
    }
    for (int i = 0; i < tb->n_docs; i++)
        if (tb->doc_start[i + 1] < tb->doc_start[i])
            return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: document %d ends before it starts", i);
    for (int i = 0; i < tb->n_tokens; i++) {
        if (tb->tokens[i] < 0 || tb->tokens[i] >= m->cfg.vocab_size || tb->targets[i] >= m->cfg.vocab_size)
            return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: token %d at row %d is outside the vocabulary (%d)",
                                 tb->tokens[i] < 0 || tb->tokens[i] >= m->cfg.vocab_size ? tb->tokens[i] : tb->targets[i],
                                 i, m->cfg.vocab_size);
        if (tb->positions[i] < 0 || tb->positions[i] >= m->cfg.max_positions)
            return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: position %d is outside the model's context (%d)",
                                 tb->positions[i], m->cfg.max_positions);
    }
    return STATUS_OK;
}

/* The positions of this rank's local rows of the residual stream. */
static struct tensor local_positions(struct model_train *t, int64_t T)
{
    struct model *m = t->m;
    const int64_t Tl = local_rows(t, T);
    return tensor_rows_at(&t->a->positions, train_sp(t) ? m->tp_rank * Tl : 0, Tl);
}

/* The vocab-parallel cross-entropy's loss and log-sum-exp per row (all T rows, on every tp
 * rank): this shard's statistics, every shard's gathered (tp, T, 3), combined. */
static enum status loss_fwd(struct model_train *t, int64_t T, const struct tensor *h_full)
{
    struct model *m = t->m;
    struct backend *b = m->b;
    struct train_activations *a = t->a;
    struct tensor stats = tensor_first_rows(&a->stats, T), targets = tensor_first_rows(&a->targets, T);
    struct tensor loss = tensor_first_rows(&a->loss, T), lse = tensor_first_rows(&a->lse, T);
    op_cross_entropy_stats(b, &stats, h_full, &m->w.lm_head, &targets, m->vocab_start, m->cfg.final_softcap);
    struct tensor all = stats;
    if (m->tp_size > 1) {
        all = tensor_first_rows(&a->stats_all, (int64_t)m->tp_size * T);
        TRY(comm_all_gather(m->par.groups->tp, &all, &stats));
    }
    struct tensor stats3 = tensor_make(all.data, DTYPE_F32, b->device, 3, (int64_t)m->tp_size, T, (int64_t)3);
    op_cross_entropy_combine(b, &loss, &lse, &stats3, &targets);
    return STATUS_OK;
}

enum status model_forward_train(struct model_train *t, const struct train_batch *tb, double *loss_sum,
                                int *n_real)
{
    struct model *m = t->m;
    enum status st = check_batch(t, tb);
    if (st != STATUS_OK) return st;
    struct backend *b = m->b;
    struct train_activations *a = t->a;
    const int64_t T = tb->n_tokens, Tl = local_rows(t, T);
    *loss_sum = 0.0;
    *n_real = 0;
    if (t->lora) lora_dropout_batch(t->lora, tb->dropout, tb->step, tb->micro);
    backend_upload(b, a->tokens.data, tb->tokens, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->targets.data, tb->targets, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->positions.data, tb->positions, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->doc_start.data, tb->doc_start, (size_t)(tb->n_docs + 1) * sizeof(int32_t));
    const struct attention_train_batch ab = attention_batch(t, tb);

    /* Embedding (vocab-parallel: a masked lookup summed over tp) and learned positions, or the
     * previous stage's output; the residual stream lives in x_final between layers. */
    struct tensor x = tensor_first_rows(&a->x_final, Tl), tokens = tensor_first_rows(&a->tokens, T);
    if (m->pp_rank == 0 && tb->input) {
        backend_copy(b, x.data, tb->input->data, tensor_nbytes(&x));
    } else if (m->pp_rank == 0) {
        struct tensor part = partial_rows(t, &x, T), pos = local_positions(t, T);
        op_embedding(b, &part, &m->w.tok_embedding, &tokens, m->vocab_start);
        TRY(reduce_rows(t, &part, &x));
        if (m->cfg.embed_scale != 0.0f && m->cfg.embed_scale != 1.0f) op_scale(b, &x, &x, m->cfg.embed_scale);
        if (m->cfg.positions == POSITION_KIND_LEARNED) op_position_embedding_add(b, &x, &m->w.pos_embedding, &pos);
    }

    for (int l = 0; l < m->n_layers_local; l++) TRY(layer_forward_train(t, l, T, &x, &ab));
    train_moe_count(t);
    if (!model_is_last_stage(m)) return STATUS_OK;

    /* Final norm and the loss: the fused, vocab-parallel cross-entropy. */
    struct tensor h = tensor_first_rows(&a->h_final, Tl), h_full;
    if (m->w.final_norm.data) layer_norm(m, &h, &x, &m->w.final_norm, &m->w.final_norm_bias);
    else backend_copy(b, h.data, x.data, tensor_nbytes(&x)); /* none (an EAGLE head) */
    if (tb->hidden_only) return STATUS_OK;
    TRY(gather_rows(t, &h, &a->gath, T, &h_full));
    TRY(loss_fwd(t, T, &h_full));
    backend_download(b, a->host_loss, a->loss.data, (size_t)T * sizeof(float));
    double sum = 0.0;
    int n = 0;
    for (int64_t i = 0; i < T; i++)
        if (tb->targets[i] >= 0) {
            sum += a->host_loss[i];
            n++;
        }
    *loss_sum = sum;
    *n_real = n;
    return STATUS_OK;
}

/* ---- one layer, backward -------------------------------------------------------------------- */

/* Selective recomputation: what a module threw away, recomputed from what it kept. */
static enum status recompute_mlp(struct model_train *t, int l, int64_t T, struct tensor *xn2_full)
{
    struct model *m = t->m;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &t->a->layers[l];
    const unsigned mods = t->mem.recompute == TRAIN_RECOMPUTE_SELECTIVE ? t->mem.modules : 0;
    struct tensor xn2 = tensor_first_rows(&la->xn2, local_rows(t, T)), x_mid = tensor_first_rows(&la->x_mid, local_rows(t, T));
    if (mods & TRAIN_RECOMPUTE_LAYERNORM) layer_pre_norm(m, &xn2, &x_mid, &w->mlp_norm, &w->mlp_norm_bias);
    TRY(gather_rows(t, &xn2, &t->a->gath, T, xn2_full));
    if (mods & TRAIN_RECOMPUTE_MLP && config_layer_moe(&m->cfg, m->layer_first + l)) { /* the experts' insides, from the kept routing */
        struct moe_tensors mt = la->moe;
        mt.recompute = 1;
        return moe_forward(m, l, T, xn2_full, NULL, &mt);
    }
    if (mods & TRAIN_RECOMPUTE_MLP) {
        struct train_ctx tc = {.t = t, .batch = NULL};
        const struct layer_tensors lt = train_tensors(t, l, T, NULL);
        const struct layer_hooks h = train_hooks(&tc);
        layer_mlp_inner(m, l, T, xn2_full, &lt, &h);
    }
    return STATUS_OK;
}

/* The QK norm's backward, in place on d (T rows of `heads` local heads: dL/dq, then dL/dq_pre),
 * x_pre the norm's input, dw += the weight's gradient. Over the whole projection at tp > 1 as
 * the forward (layer_qk_norm): the rows of d and x_pre gathered over tp, the whole row's backward
 * (so every rank adds the whole dw), this rank's columns kept. */
static enum status qk_norm_backward(struct model_train *t, int64_t T, const struct tensor *d,
                                    const struct tensor *x_pre, const struct tensor *w, const struct tensor *dw,
                                    int64_t heads)
{
    struct model *m = t->m;
    struct tensor dh = layer_qk_norm_view(m, d, T, heads), xh = layer_qk_norm_view(m, x_pre, T, heads);
    if (m->cfg.qk_norm != QK_NORM_FULL || m->tp_size == 1) {
        op_rmsnorm_backward(m->b, &dh, dw, &dh, &xh, w, m->cfg.norm_eps);
        return STATUS_OK;
    }
    const int64_t wide = tensor_cols(&dh) * m->tp_size;
    struct tensor df = tensor_view2(&t->a->qk_dfull, T, wide), xf = tensor_view2(&t->a->qk_full, T, wide);
    TRY(comm_all_gather_last(m->par.groups->tp, &df, &dh));
    TRY(comm_all_gather_last(m->par.groups->tp, &xf, &xh));
    op_rmsnorm_backward(m->b, &df, dw, &df, &xf, w, m->cfg.norm_eps);
    layer_tp_columns(m, &dh, &df);
    return STATUS_OK;
}

static enum status recompute_attention(struct model_train *t, int l, int64_t T, const struct attention_train_batch *ab,
                                       struct tensor *xn1_full)
{
    struct model *m = t->m;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &t->a->layers[l];
    const int64_t hd = m->cfg.head_dim;
    const unsigned mods = t->mem.recompute == TRAIN_RECOMPUTE_SELECTIVE ? t->mem.modules : 0;
    if (mods & TRAIN_RECOMPUTE_CORE_ATTN) {
        struct tensor q3 = tensor_view3(&la->q, T, m->n_heads_local, hd), k3 = tensor_view3(&la->k, T, m->n_kv_local, hd);
        struct tensor v3 = tensor_view3(&la->v, T, m->n_kv_local, hd), att3 = tensor_view3(&la->att, T, m->n_heads_local, hd);
        struct tensor lse = tensor_first_rows(&la->lse, T);
        op_attention_train(m->b, &att3, &lse, &q3, &k3, &v3, ab);
    }
    struct tensor xn1 = tensor_first_rows(&la->xn1, local_rows(t, T)), x_in = tensor_first_rows(&la->x_in, local_rows(t, T));
    if (mods & TRAIN_RECOMPUTE_LAYERNORM) layer_pre_norm(m, &xn1, &x_in, &w->attn_norm, &w->attn_norm_bias);
    return gather_rows(t, &xn1, &t->a->gath, T, xn1_full);
}

/* The gradient of a row-parallel product's output (all T rows, *dfull) from dres (the gradient
 * of the residual add's output, local rows), through the sandwich norm (its weight's gradient
 * +=). dres flows to x unchanged (the caller keeps it). */
static enum status residual_output_grad(struct model_train *t, int64_t T, const struct tensor *kept,
                                        const struct tensor *post_norm, const struct tensor *gpost, struct tensor *dfull)
{
    struct model *m = t->m;
    struct train_activations *a = t->a;
    const int64_t Tl = local_rows(t, T);
    struct tensor dres = tensor_first_rows(&a->dres, Tl), dtmp = tensor_first_rows(&a->dtmp, Tl), dproj = dres;
    if (m->cfg.sandwich_norms) { /* dtmp = d post_norm(kept) */
        struct tensor out = tensor_first_rows(kept, Tl);
        norm_bwd(m, &dtmp, gpost, NULL, &dres, &out, post_norm);
        dproj = dtmp;
    }
    return gather_rows(t, &dproj, &a->dfull, T, dfull);
}

/* The backward of row_parallel_residual: from dres (the gradient of out, local rows), the
 * gradient of the product's input into din (all T rows) and of the weights. dres flows to x
 * unchanged (the caller keeps it). */
static enum status row_parallel_backward(struct model_train *t, int l, enum lora_target target, int64_t T,
                                         const struct tensor *din, const struct tensor *in, const struct tensor *w,
                                         const struct tensor *gw, const struct tensor *gbias, const struct tensor *kept,
                                         const struct tensor *post_norm, const struct tensor *gpost)
{
    struct model *m = t->m;
    struct tensor dfull;
    TRY(residual_output_grad(t, T, kept, post_norm, gpost, &dfull));
    /* The bias, added on tp rank 0 only, gets its gradient on every rank (the same full rows),
     * so that the replicated copies stay equal. */
    op_matmul_backward(m->b, din, opt(gw), opt(gbias), &dfull, in, w, 0);
    adapt_back(t, l, target, din, &dfull, in);
    return STATUS_OK;
}

/* The dense MLP's backward, from dres: dxn (T rows) = the gradient of its input xn (full). */
static enum status mlp_backward(struct model_train *t, int l, int64_t T, const struct tensor *full,
                                const struct layer_weights *g)
{
    struct model *m = t->m;
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &t->a->layers[l];
    struct train_activations *a = t->a;
    struct tensor dxn = tensor_first_rows(&a->dxn, T);
    struct tensor dh = layer_ffn_view(&a->dup, T, w), hact = layer_ffn_view(&la->hact, T, w);
    TRY(row_parallel_backward(t, l, LORA_TARGET_DOWN, T, &dh, &hact, &w->w_down, &g->w_down, &g->b_down, &la->mlp_out,
                              &w->post_mlp_norm, &g->post_mlp_norm));
    struct tensor up = layer_ffn_view(&la->up, T, w), dup = layer_ffn_view(&a->dup, T, w);
    if (c->gated_mlp) {
        struct tensor gate = layer_ffn_view(&la->gate, T, w), dgate = layer_ffn_view(&a->dgate, T, w);
        op_gated_activation_backward(b, &dgate, &dup, &dh, &gate, &up, c->activation);
        op_matmul_backward(b, &dxn, opt(&g->w_gate), opt(&g->b_gate), &dgate, full, &w->w_gate, 0);
        adapt_back(t, l, LORA_TARGET_GATE, &dxn, &dgate, full);
        op_matmul_backward(b, &dxn, opt(&g->w_up), opt(&g->b_up), &dup, full, &w->w_up, 1);
    } else {
        op_activation_backward(b, &dup, &dh, &up, c->activation);
        op_matmul_backward(b, &dxn, opt(&g->w_up), opt(&g->b_up), &dup, full, &w->w_up, 0);
    }
    adapt_back(t, l, LORA_TARGET_UP, &dxn, &dup, full);
    return STATUS_OK;
}

/* The mirror of layer_forward_train. On entry dres (Tl, d) holds dL/d(layer output); on return
 * dL/d(layer input). g holds this layer's weight gradients (+=); a mixture of experts' auxiliary
 * losses enter with the weight aux_scale (train_batch). */
static enum status layer_backward(struct model_train *t, int l, int64_t T, const struct layer_weights *g,
                                  const struct attention_train_batch *batch, float aux_scale)
{
    struct model *m = t->m;
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &t->a->layers[l];
    struct train_activations *a = t->a;
    const int64_t hd = c->head_dim, hq = (int64_t)m->n_heads_local * hd, hkv = (int64_t)m->n_kv_local * hd;
    const int64_t Tl = local_rows(t, T);
    struct attention_train_batch ab = *batch;
    struct rope_params rope;
    layer_attention_kind(m, m->layer_first + l, &ab.window, &rope);
    ab.sinks = w->sinks; /* GPT-OSS's: the forward's softmax included them */
    struct tensor dres = tensor_first_rows(&a->dres, Tl), dtmp = tensor_first_rows(&a->dtmp, Tl);
    struct tensor pos = tensor_first_rows(&a->positions, T), dxn = tensor_first_rows(&a->dxn, T), full, dsum;

    /* MLP block, in reverse: a mixture of experts (moe.h), or the dense MLP. */
    TRY(recompute_mlp(t, l, T, &full));
    if (config_layer_moe(c, m->layer_first + l)) {
        struct tensor dproj;
        const struct moe_loss loss = {t->moe_aux_coeff, t->moe_z_coeff, aux_scale};
        TRY(residual_output_grad(t, T, &la->mlp_out, &w->post_mlp_norm, &g->post_mlp_norm, &dproj));
        TRY(moe_backward(m, l, T, &full, &dproj, &dxn, &la->moe, &a->moe_grad, g, &loss));
    } else {
        TRY(mlp_backward(t, l, T, &full, g));
    }
    TRY(sum_input_grad(t, T, &dsum));
    struct tensor x_mid = tensor_first_rows(&la->x_mid, Tl);
    pre_norm_bwd(m, &dres, &dtmp, &g->mlp_norm, &g->mlp_norm_bias, &dsum, &x_mid, &w->mlp_norm); /* dL/dx_mid */

    /* Attention block, in reverse. */
    struct tensor att = tensor_view2(&la->att, T, hq), datt = tensor_view2(&a->datt, T, hq);
    TRY(recompute_attention(t, l, T, &ab, &full));
    TRY(row_parallel_backward(t, l, LORA_TARGET_O, T, &datt, &att, &w->wo, &g->wo, &g->bo, &la->attn_out,
                              &w->post_attn_norm, &g->post_attn_norm));
    struct tensor dq3 = tensor_view3(&a->dq, T, m->n_heads_local, hd), dk3 = tensor_view3(&a->dk, T, m->n_kv_local, hd);
    struct tensor dv3 = tensor_view3(&a->dv, T, m->n_kv_local, hd), datt3 = tensor_view3(&a->datt, T, m->n_heads_local, hd);
    struct tensor q3 = tensor_view3(&la->q, T, m->n_heads_local, hd), k3 = tensor_view3(&la->k, T, m->n_kv_local, hd);
    struct tensor v3 = tensor_view3(&la->v, T, m->n_kv_local, hd), att3 = tensor_view3(&la->att, T, m->n_heads_local, hd);
    struct tensor lse = tensor_first_rows(&la->lse, T);
    op_attention_train_backward(b, &dq3, &dk3, &dv3, &datt3, &att3, &lse, &q3, &k3, &v3, &ab);
    if (ab.sinks.data && opt(&g->sinks)) op_attention_sinks_backward(b, &g->sinks, &datt3, &att3, &lse, &ab.sinks);
    if (c->positions == POSITION_KIND_ROTARY) {
        op_rope_backward(b, &dq3, &pos, c->rot_dim, &rope, c->rope_style);
        op_rope_backward(b, &dk3, &pos, c->rot_dim, &rope, c->rope_style);
    }
    if (c->qk_norm) { /* through the QK RMSNorm (per head, or over the projection), in place on dq, dk */
        TRY(qk_norm_backward(t, T, &a->dq, &la->q_pre, &w->q_norm, opt(&g->q_norm), m->n_heads_local));
        TRY(qk_norm_backward(t, T, &a->dk, &la->k_pre, &w->k_norm, opt(&g->k_norm), m->n_kv_local));
    }
    struct tensor dq = tensor_view2(&a->dq, T, hq), dk = tensor_view2(&a->dk, T, hkv), dv = tensor_view2(&a->dv, T, hkv);
    op_matmul_backward(b, &dxn, opt(&g->wq), opt(&g->bq), &dq, &full, &w->wq, 0);
    adapt_back(t, l, LORA_TARGET_Q, &dxn, &dq, &full);
    op_matmul_backward(b, &dxn, opt(&g->wk), opt(&g->bk), &dk, &full, &w->wk, 1);
    adapt_back(t, l, LORA_TARGET_K, &dxn, &dk, &full);
    op_matmul_backward(b, &dxn, opt(&g->wv), opt(&g->bv), &dv, &full, &w->wv, 1);
    adapt_back(t, l, LORA_TARGET_V, &dxn, &dv, &full);
    TRY(sum_input_grad(t, T, &dsum));
    struct tensor x_in = tensor_first_rows(&la->x_in, Tl);
    pre_norm_bwd(m, &dres, &dtmp, &g->attn_norm, &g->attn_norm_bias, &dsum, &x_in, &w->attn_norm); /* dL/dx_in */
    return STATUS_OK;
}

/* Full recomputation: before the backward of the last layer of a chunk, its layers' forward
 * again from the chunk's kept input (through x_final, free by then). */
static enum status recompute_chunk(struct model_train *t, int first, int last, int64_t T,
                                   const struct attention_train_batch *ab)
{
    struct model *m = t->m;
    struct tensor x = tensor_first_rows(&t->a->x_final, local_rows(t, T));
    struct tensor x_in = tensor_first_rows(&t->a->layers[first].x_in, local_rows(t, T));
    backend_copy(m->b, x.data, x_in.data, tensor_nbytes(&x));
    for (int l = first; l <= last; l++) TRY(layer_forward_train(t, l, T, &x, ab));
    return STATUS_OK;
}

enum status model_backward(struct model_train *t, const struct train_batch *tb,
                           struct model_weights *grads)
{
    struct model *m = t->m;
    enum status st = check_batch(t, tb);
    if (st != STATUS_OK) return st;
    struct backend *b = m->b;
    struct train_activations *a = t->a;
    const int64_t T = tb->n_tokens, Tl = local_rows(t, T);
    const struct attention_train_batch ab = attention_batch(t, tb);
    struct tensor dres = tensor_first_rows(&a->dres, Tl), dsum;
    if (t->lora) lora_dropout_batch(t->lora, tb->dropout, tb->step, tb->micro); /* the forward's masks again */

    /* Loss and final norm, in reverse (last stage): dh from the cross-entropy (its shard's part,
     * summed over tp), then dres = dL/dx. Other stages received dres from the next one. */
    if (model_is_last_stage(m)) {
        struct tensor h = tensor_first_rows(&a->h_final, Tl), x = tensor_first_rows(&a->x_final, Tl), h_full;
        struct tensor targets = tensor_first_rows(&a->targets, T), lse = tensor_first_rows(&a->lse, T);
        struct tensor dxn = tensor_first_rows(&a->dxn, T);
        TRY(gather_rows(t, &h, &a->gath, T, &h_full));
        op_cross_entropy_backward(b, &dxn, opt(&grads->lm_head), &h_full, &m->w.lm_head, &targets, &lse, NULL,
                                  tb->grad_scale, m->vocab_start, 0, m->cfg.final_softcap);
        TRY(sum_input_grad(t, T, &dsum));
        if (tb->extra_grad) op_add(b, &dsum, &dsum, tb->extra_grad);
        if (m->w.final_norm.data) norm_bwd(m, &dres, &grads->final_norm, &grads->final_norm_bias, &dsum, &x, &m->w.final_norm);
        else backend_copy(b, dres.data, dsum.data, tensor_nbytes(&dres));
    }

    for (int l = m->n_layers_local - 1; l >= 0; l--) {
        int first = 0, last = 0;
        if (train_layer_full(t, l, &first, &last) && l == last) TRY(recompute_chunk(t, first, last, T, &ab));
        TRY(layer_backward(t, l, T, &grads->layers[l], &ab, tb->aux_scale));
        if (t->layer_done) t->layer_done(t->hook_ctx, l);
    }

    /* Embedding, in reverse (first stage): x0 = scale * E[tokens] (+ P[positions]); given input
     * rows keep their gradient in dres. */
    if (m->pp_rank == 0 && !tb->input) {
        struct tensor tokens = tensor_first_rows(&a->tokens, T), pos = local_positions(t, T), dfull;
        if (m->cfg.positions == POSITION_KIND_LEARNED && opt(&grads->pos_embedding))
            op_position_embedding_add_backward(b, &grads->pos_embedding, &dres, &pos);
        if (m->cfg.embed_scale != 0.0f && m->cfg.embed_scale != 1.0f) op_scale(b, &dres, &dres, m->cfg.embed_scale);
        TRY(gather_rows(t, &dres, &a->dfull, T, &dfull));
        if (opt(&grads->tok_embedding)) op_embedding_backward(b, &grads->tok_embedding, &dfull, &tokens, m->vocab_start);
    }
    backend_synchronize(b);
    return STATUS_OK;
}
