/* engine/model/layer.c - one decoder layer's forward, for serving and training (layer.h).
 * Tests: tests/test_model.c, tests/test_train_grad.py, the tp/pp invariance tests. */
#include "layer.h"

#include "moe.h"
#include "parallel.h"

static const struct tensor *opt(const struct tensor *t) { return t && t->data ? t : NULL; }

void layer_attention_kind(const struct model *m, int layer, int *window, struct rope_params *rope)
{
    const int pattern = m->cfg.sliding_window_pattern;
    const int global = pattern > 0 && (layer + 1) % pattern == 0;
    const int local_theta = !global && pattern > 0 && m->cfg.rope_theta_local > 0.0f;
    *window = pattern > 0 && global ? 0 : m->cfg.sliding_window;
    /* A rope scaling applies to the layers of rope_theta (Gemma 3: the global ones). */
    *rope = (struct rope_params){.freqs = m->rope_freqs[local_theta],
                                 .attn_factor = local_theta ? 1.0f : m->cfg.rope_scaling.attention_factor};
    if (!(rope->attn_factor > 0.0f)) rope->attn_factor = 1.0f; /* a config built by hand, not parsed */
}

void layer_norm(const struct model *m, const struct tensor *out, const struct tensor *x, const struct tensor *w,
                const struct tensor *bias)
{
    if (m->cfg.norm == NORM_KIND_RMSNORM) op_rmsnorm(m->b, out, x, w, m->cfg.norm_eps);
    else op_layernorm(m->b, out, x, w, opt(bias), m->cfg.norm_eps);
}

void layer_pre_norm(const struct model *m, const struct tensor *out, const struct tensor *x, const struct tensor *w,
                    const struct tensor *bias)
{
    if (!m->cfg.no_pre_norms && !m->cfg.post_ln && w->data) layer_norm(m, out, x, w, bias);
    else if (out->data != x->data) backend_copy(m->b, out->data, x->data, tensor_nbytes(x));
}

/* q and k as the QK norm sees them: each head's features (rows T * heads), or the whole
 * projection at once (rows T; OLMo 2). */
struct tensor layer_qk_norm_view(const struct model *m, const struct tensor *t, int64_t T, int64_t heads)
{
    const int64_t hd = m->cfg.head_dim;
    return m->cfg.qk_norm == QK_NORM_FULL ? tensor_view2(t, T, heads * hd) : tensor_view2(t, T * heads, hd);
}

enum status layer_qk_norm(struct model *m, const struct tensor *out, const struct tensor *in, const struct tensor *w,
                          int64_t T, int64_t heads, const struct tensor *full)
{
    const struct tensor x = layer_qk_norm_view(m, in, T, heads), y = layer_qk_norm_view(m, out, T, heads);
    if (m->cfg.qk_norm != QK_NORM_FULL || m->tp_size == 1) {
        op_rmsnorm(m->b, &y, &x, w, m->cfg.norm_eps);
        return STATUS_OK;
    }
    const int64_t cols = tensor_cols(&x), wide = cols * m->tp_size;
    CHECK(full->data && tensor_numel(full) >= T * wide && tensor_numel(w) == wide,
          "QK norm over tp: scratch of %lld for %lld x %lld, weight of %lld", (long long)tensor_numel(full),
          (long long)T, (long long)wide, (long long)tensor_numel(w));
    struct tensor f = tensor_view2(full, T, wide);
    enum status st = comm_all_gather_last(model_tp_comm(m), &f, &x);
    if (st != STATUS_OK) return st;
    op_rmsnorm(m->b, &f, &f, w, m->cfg.norm_eps);
    layer_tp_columns(m, &y, &f);
    return STATUS_OK;
}

void layer_tp_columns(const struct model *m, const struct tensor *out, const struct tensor *full)
{
    const int64_t T = out->shape[0], cols = tensor_cols(out), wide = tensor_cols(full);
    CHECK(full->shape[0] == T && wide == cols * m->tp_size && full->dtype == out->dtype, "tp columns: (%lld, %lld) "
          "of (%lld, %lld)", (long long)T, (long long)cols, (long long)full->shape[0], (long long)wide);
    const size_t es = dtype_size(out->dtype), row = (size_t)cols * es;
    for (int64_t i = 0; i < T; i++)
        backend_copy(m->b, (char *)out->data + (size_t)i * row,
                     (char *)full->data + ((size_t)(i * wide) + (size_t)m->tp_rank * (size_t)cols) * es, row);
}

enum status layer_attention_inner(struct model *m, int l, int64_t T, const struct tensor *xn,
                                  const struct layer_tensors *t, const struct layer_hooks *h)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t hd = c->head_dim, nh = m->n_heads_local, nkv = m->n_kv_local;
    int window;
    struct rope_params rope;
    layer_attention_kind(m, m->layer_first + l, &window, &rope);
    struct tensor q3 = tensor_view3(&t->q, T, nh, hd), k3 = tensor_view3(&t->k, T, nkv, hd);
    struct tensor v3 = tensor_view3(&t->v, T, nkv, hd), att3 = tensor_view3(&t->att, T, nh, hd);
    struct tensor qp = tensor_view2(&t->q_pre, T, nh * hd), kp = tensor_view2(&t->k_pre, T, nkv * hd);
    struct tensor v = tensor_view2(&t->v, T, nkv * hd);
    {   /* q, k and v from the same rows: one launch where the backend can (a decode step on CUDA) */
        const struct tensor *ys[3] = {&qp, &kp, &v}, *ws[3] = {&w->wq, &w->wk, &w->wv};
        const struct tensor *bs[3] = {opt(&w->bq), opt(&w->bk), opt(&w->bv)};
        op_matmul_many(b, 3, ys, xn, ws, bs);
    }
    h->adapt(h->ctx, l, LORA_TARGET_Q, &qp, xn);
    h->adapt(h->ctx, l, LORA_TARGET_K, &kp, xn);
    h->adapt(h->ctx, l, LORA_TARGET_V, &v, xn);
    if (c->qk_norm) { /* RMSNorm over each head's features, or all of them (in place when q_pre is q) */
        enum status st = layer_qk_norm(m, &t->q, &t->q_pre, &w->q_norm, T, nh, &t->qk_full);
        if (st == STATUS_OK) st = layer_qk_norm(m, &t->k, &t->k_pre, &w->k_norm, T, nkv, &t->qk_full);
        if (st != STATUS_OK) return st;
    }
    if (c->positions == POSITION_KIND_ROTARY) {
        struct tensor pos = tensor_first_rows(&t->pos, T);
        op_rope_qk(b, &q3, &k3, &pos, c->rot_dim, &rope, c->rope_style); /* one launch on CUDA */
    }
    struct tensor lse = t->lse.data ? tensor_first_rows(&t->lse, T) : t->lse;
    h->attend(h->ctx, l, window, &q3, &k3, &v3, &att3, &lse);
    return STATUS_OK;
}

void layer_mlp_inner(struct model *m, int l, int64_t T, const struct tensor *xn, const struct layer_tensors *t,
                     const struct layer_hooks *h)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    struct tensor up = layer_ffn_view(&t->up, T, w), hact = layer_ffn_view(&t->hact, T, w);
    if (c->gated_mlp) { /* act(gate) * up (SwiGLU, GeGLU); the two products in one launch where the backend can */
        struct tensor gate = layer_ffn_view(&t->gate, T, w);
        const struct tensor *ys[2] = {&up, &gate}, *ws[2] = {&w->w_up, &w->w_gate};
        const struct tensor *bs[2] = {opt(&w->b_up), opt(&w->b_gate)};
        op_matmul_many(b, 2, ys, xn, ws, bs);
        h->adapt(h->ctx, l, LORA_TARGET_UP, &up, xn);
        h->adapt(h->ctx, l, LORA_TARGET_GATE, &gate, xn);
        op_gated_activation(b, &hact, &gate, &up, c->activation);
    } else { /* act(up) (GPT-2) */
        op_matmul(b, &up, xn, &w->w_up, opt(&w->b_up));
        h->adapt(h->ctx, l, LORA_TARGET_UP, &up, xn);
        op_activation(b, &hact, &up, c->activation);
    }
}

/* The weight of the pre-norm that follows a residual add when the two may run as one pass
 * (op_add_rmsnorm: the same bits as the add, then layer_pre_norm's op_rmsnorm), else NULL. */
static const struct tensor *fused_pre_norm(const struct model *m, const struct tensor *w)
{
    return m->cfg.norm == NORM_KIND_RMSNORM && !m->cfg.no_pre_norms && !m->cfg.post_ln && w->data ? w : NULL;
}

/* The weight of local layer l's attention pre-norm when a chain of layers (layer_forward) computes
 * it in layer l - 1's last residual add, else NULL. */
static const struct tensor *chained_pre_norm(const struct model *m, int l, int chain)
{
    return chain && l >= 1 && l < m->n_layers_local ? fused_pre_norm(m, &m->w.layers[l].attn_norm) : NULL;
}

/* out = x + [post_norm](proj): the sandwich norm (normed is its output) when the model has one;
 * with next_w (fused_pre_norm), next = the following pre-norm of out, in the same pass. */
static void residual_add(struct model *m, const struct tensor *out, const struct tensor *x, const struct tensor *proj,
                         const struct tensor *normed, const struct tensor *post_norm, const struct tensor *next,
                         const struct tensor *next_w)
{
    const struct tensor *add = proj;
    if (m->cfg.sandwich_norms) {
        layer_norm(m, normed, proj, post_norm, NULL);
        add = normed;
    }
    if (next_w) op_add_rmsnorm(m->b, out, next, x, add, next_w, m->cfg.norm_eps);
    else op_add(m->b, out, x, add);
}

/* out = x + [sandwich norm](the row-parallel product of in (T rows) by w, summed over tp into
 * proj (local rows)). The bias, replicated, joins on tp rank 0 only; an adapter's low-rank
 * product joins the partial sum before the reduction (A is split along the inputs like W). */
static enum status row_parallel_residual(struct model *m, int l, enum lora_target target, int64_t T,
                                         const struct tensor *out, const struct tensor *x, const struct tensor *in,
                                         const struct tensor *w, const struct tensor *bias,
                                         const struct tensor *proj, const struct tensor *normed,
                                         const struct tensor *post_norm, const struct layer_hooks *h,
                                         const struct tensor *next, const struct tensor *next_w)
{
    struct tensor part = h->partial(h->ctx, proj, T);
    op_matmul(m->b, &part, in, w, m->tp_rank == 0 ? opt(bias) : NULL);
    h->adapt(h->ctx, l, target, &part, in);
    enum status st = h->reduce(h->ctx, &part, proj);
    if (st != STATUS_OK) return st;
    residual_add(m, out, x, proj, normed, post_norm, next, next_w);
    return STATUS_OK;
}

enum status layer_forward(struct model *m, int l, int64_t T, const struct layer_tensors *t,
                          const struct layer_hooks *h, int chain)
{
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t hq = (int64_t)m->n_heads_local * m->cfg.head_dim;
    struct tensor full;
    enum status st;

    /* Attention block: x_mid = x_in + [norm](attention(norm(x_in)) W_o^T). */
    if (t->x_in.data != t->x.data) backend_copy(m->b, t->x_in.data, t->x.data, tensor_nbytes(&t->x));
    if (!chained_pre_norm(m, l, chain)) layer_pre_norm(m, &t->xn1, &t->x_in, &w->attn_norm, &w->attn_norm_bias);
    if ((st = h->gather(h->ctx, &t->xn1, T, &full)) != STATUS_OK) return st;
    if ((st = layer_attention_inner(m, l, T, &full, t, h)) != STATUS_OK) return st;
    struct tensor att = tensor_view2(&t->att, T, hq);
    /* x_mid's add and the MLP's pre-norm (xn2) in one pass where they may be (RMSNorm before it) */
    const struct tensor *mlp_norm = fused_pre_norm(m, &w->mlp_norm);
    if ((st = row_parallel_residual(m, l, LORA_TARGET_O, T, &t->x_mid, &t->x_in, &att, &w->wo, &w->bo, &t->attn_out,
                                    &t->normed, &w->post_attn_norm, h, &t->xn2, mlp_norm)) != STATUS_OK)
        return st;
    /* Post-LN (BERT): x_mid = norm(x_in + attention), in place. Training refuses encoders, so
     * its backward never needs this norm's input. */
    if (m->cfg.post_ln) layer_norm(m, &t->x_mid, &t->x_mid, &w->attn_norm, &w->attn_norm_bias);

    /* MLP block: x = x_mid + [norm](down(act(gate(xn2)) * up(xn2))), or down(act(up(xn2))); with
     * the next layer's pre-norm into xn1 in the same pass where the chain allows it. */
    const struct tensor *next_w = chained_pre_norm(m, l + 1, chain), *next = next_w ? &t->xn1 : NULL;
    if (!mlp_norm) layer_pre_norm(m, &t->xn2, &t->x_mid, &w->mlp_norm, &w->mlp_norm_bias);
    if ((st = h->gather(h->ctx, &t->xn2, T, &full)) != STATUS_OK) return st;
    if (config_layer_moe(&m->cfg, m->layer_first + l)) { /* a mixture of experts (moe.h); each tp rank its experts, summed as a row-parallel product */
        struct tensor proj = tensor_first_rows(&t->mlp_out, tensor_rows(&t->x)), part = h->partial(h->ctx, &proj, T);
        if ((st = moe_forward(m, l, T, &full, &part, t->moe)) != STATUS_OK) return st;
        /* Serving's expert parallelism joined the slices over the whole ep group (moe_ep_join). */
        if (!m->par.ep && (st = h->reduce(h->ctx, &part, &proj)) != STATUS_OK) return st;
        residual_add(m, &t->x, &t->x_mid, &proj, &t->normed, &w->post_mlp_norm, next, next_w);
        return STATUS_OK;
    }
    layer_mlp_inner(m, l, T, &full, t, h);
    struct tensor hact = layer_ffn_view(&t->hact, T, w);
    if ((st = row_parallel_residual(m, l, LORA_TARGET_DOWN, T, &t->x, &t->x_mid, &hact, &w->w_down, &w->b_down,
                                    &t->mlp_out, &t->normed, &w->post_mlp_norm, h, next, next_w)) != STATUS_OK)
        return st;
    if (m->cfg.post_ln) layer_norm(m, &t->x, &t->x, &w->mlp_norm, &w->mlp_norm_bias); /* x = norm(x_mid + mlp) */
    return STATUS_OK;
}
