/* engine/model/model_train.c - the training forward (activations kept), the cross-entropy over
 * the LM head, and model_backward, its mirror (model_train.h).
 * Not here: the serving forward (model.c), data, optimizer and loop (engine/train/).
 * Tests: tests/test_train_grad.py (gradients against JAX), tests/test_train.c. */
#include "model_train.h"

#include "lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What one layer keeps from its forward for its backward. (T = max_tokens rows.) */
struct layer_acts {
    struct tensor x_in;        /* (T, d): the layer's input, the residual stream */
    struct tensor xn1;         /* (T, d): attention norm of x_in */
    struct tensor q_pre, k_pre;/* (T*heads_local, hd), (T*kv_local, hd): q, k before the QK norm */
    struct tensor q, k, v;     /* (T, heads_local|kv_local, hd): as attention read them */
    struct tensor att;         /* (T, heads_local, hd): attention output */
    struct tensor lse;         /* f32 (T, heads_local): its log-sum-exp */
    struct tensor attn_out;    /* (T, d): output projection, before the sandwich norm */
    struct tensor x_mid;       /* (T, d): x_in + attention block */
    struct tensor xn2;         /* (T, d): MLP norm of x_mid */
    struct tensor gate, up;    /* (T, ffn_local): before the activation */
    struct tensor hact;        /* (T, ffn_local): act(gate) * up, or act(up) */
    struct tensor mlp_out;     /* (T, d): down projection, before the sandwich norm */
};

struct train_activations {
    int max_tokens;
    void *mem;                     /* one device allocation */
    struct layer_acts *layers;     /* (n_layers_local) */
    struct tensor x_final, h_final;/* (T, d): after the last layer, after the final norm */
    /* backward scratch */
    struct tensor dres, dtmp, dxn; /* (T, d) */
    struct tensor dq, datt;        /* (T, heads_local * hd) */
    struct tensor dk, dv;          /* (T, kv_local * hd) */
    struct tensor dgate, dup;      /* (T, ffn_local) */
    /* loss */
    struct tensor stats;           /* f32 (T, 3) */
    struct tensor loss, lse;       /* f32 (T) */
    float *host_loss;              /* (T) */
    struct tensor tokens, targets, positions; /* i32 (T) */
    struct tensor doc_start;       /* i32 (T + 1) */
};

static const struct tensor *opt(const struct tensor *t) { return t && t->data ? t : NULL; }

/* ---- memory ------------------------------------------------------------------------------ */

struct act_entry {
    struct tensor *t;
    enum dtype dtype;
    int ndim;
    int64_t shape[2];
};

void model_train_free(struct model *m)
{
    if (!m || !m->train) return;
    backend_free(m->b, m->train->mem);
    free(m->train->layers);
    free(m->train->host_loss);
    free(m->train);
    m->train = NULL;
}

enum status model_reserve_train(struct model *m, int max_tokens)
{
    if (m->tp_size != 1 || m->pp_size != 1)
        return status_errorf(STATUS_UNSUPPORTED,
                             "training runs on one rank for now (tp %d, pp %d)", m->tp_size, m->pp_size);
    if (max_tokens <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch of %d tokens", max_tokens);
    if (m->train && m->train->max_tokens >= max_tokens) return STATUS_OK;
    model_train_free(m);
    struct train_activations *a = calloc(1, sizeof *a);
    if (!a) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    const struct model_config *c = &m->cfg;
    const int L = m->n_layers_local;
    a->max_tokens = max_tokens;
    a->layers = calloc((size_t)L, sizeof *a->layers);
    a->host_loss = malloc((size_t)max_tokens * sizeof *a->host_loss);
    const int n_entries = L * 16 + 20;
    struct act_entry *e = calloc((size_t)n_entries, sizeof *e);
    if (!a->layers || !a->host_loss || !e) {
        free(e);
        m->train = a;
        model_train_free(m);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    }
    const int64_t T = max_tokens, d = c->d_model, hd = c->head_dim;
    const int64_t hq = (int64_t)m->n_heads_local * hd, hkv = (int64_t)m->n_kv_local * hd;
    const int64_t ffn = m->ffn_local, qk = c->qk_norm ? 1 : 0, sw = c->sandwich_norms ? 1 : 0;
    const enum dtype dt = m->dtype;
    int n = 0;
#define ENTRY(ptr, dtype_, r, cols) e[n++] = (struct act_entry){(ptr), (dtype_), 2, {(r), (cols)}}
    for (int l = 0; l < L; l++) {
        struct layer_acts *la = &a->layers[l];
        ENTRY(&la->x_in, dt, T, d);
        ENTRY(&la->xn1, dt, T, d);
        ENTRY(&la->q_pre, dt, qk * T, hq);
        ENTRY(&la->k_pre, dt, qk * T, hkv);
        ENTRY(&la->q, dt, T, hq);
        ENTRY(&la->k, dt, T, hkv);
        ENTRY(&la->v, dt, T, hkv);
        ENTRY(&la->att, dt, T, hq);
        ENTRY(&la->lse, DTYPE_F32, T, m->n_heads_local);
        ENTRY(&la->attn_out, dt, sw * T, d);
        ENTRY(&la->x_mid, dt, T, d);
        ENTRY(&la->xn2, dt, T, d);
        ENTRY(&la->gate, dt, c->gated_mlp ? T : 0, ffn);
        ENTRY(&la->up, dt, T, ffn);
        ENTRY(&la->hact, dt, T, ffn);
        ENTRY(&la->mlp_out, dt, sw * T, d);
    }
    ENTRY(&a->x_final, dt, T, d);
    ENTRY(&a->h_final, dt, T, d);
    ENTRY(&a->dres, dt, T, d);
    ENTRY(&a->dtmp, dt, T, d);
    ENTRY(&a->dxn, dt, T, d);
    ENTRY(&a->dq, dt, T, hq);
    ENTRY(&a->datt, dt, T, hq);
    ENTRY(&a->dk, dt, T, hkv);
    ENTRY(&a->dv, dt, T, hkv);
    ENTRY(&a->dgate, dt, T, ffn);
    ENTRY(&a->dup, dt, T, ffn);
    ENTRY(&a->stats, DTYPE_F32, T, 3);
    ENTRY(&a->loss, DTYPE_F32, T, 1);
    ENTRY(&a->lse, DTYPE_F32, T, 1);
    ENTRY(&a->tokens, DTYPE_I32, T, 1);
    ENTRY(&a->targets, DTYPE_I32, T, 1);
    ENTRY(&a->positions, DTYPE_I32, T, 1);
    ENTRY(&a->doc_start, DTYPE_I32, T + 1, 1);
#undef ENTRY
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        struct tensor t = tensor_make(NULL, e[i].dtype, m->b->device, 2, e[i].shape[0], e[i].shape[1]);
        total += (tensor_nbytes(&t) + 255) / 256 * 256;
    }
    enum status st = backend_alloc(m->b, total, &a->mem);
    if (st != STATUS_OK) {
        free(e);
        m->train = a;
        model_train_free(m);
        return st;
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        *e[i].t = tensor_make((char *)a->mem + off, e[i].dtype, m->b->device, 2, e[i].shape[0],
                              e[i].shape[1]);
        off += (tensor_nbytes(e[i].t) + 255) / 256 * 256;
    }
    /* 1-D views for the per-row vectors. */
    a->loss = tensor_make(a->loss.data, DTYPE_F32, m->b->device, 1, T);
    a->lse = tensor_make(a->lse.data, DTYPE_F32, m->b->device, 1, T);
    a->tokens = tensor_make(a->tokens.data, DTYPE_I32, m->b->device, 1, T);
    a->targets = tensor_make(a->targets.data, DTYPE_I32, m->b->device, 1, T);
    a->positions = tensor_make(a->positions.data, DTYPE_I32, m->b->device, 1, T);
    a->doc_start = tensor_make(a->doc_start.data, DTYPE_I32, m->b->device, 1, T + 1);
    free(e);
    m->train = a;
    return STATUS_OK;
}

enum status model_weights_make_writable(struct model *m)
{
    if (m->weight_bytes_mapped == 0) return STATUS_OK;
    struct weight_ref *table = malloc((size_t)weights_table_max(m->w.n_layers) * sizeof *table);
    if (!table) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    const int n = weights_table(&m->w, m->layer_first, 1, table);
    enum status st = STATUS_OK;
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        struct tensor *t = table[i].t;
        int owned = 0;
        for (size_t j = 0; j < m->n_owned && !owned; j++) owned = m->owned[j] == t->data;
        if (owned) continue;
        void *mem = NULL;
        if ((st = backend_alloc(m->b, tensor_nbytes(t), &mem)) != STATUS_OK) break;
        if (base_grow((void **)&m->owned, &m->cap_owned, m->n_owned + 1, sizeof *m->owned)) {
            backend_free(m->b, mem);
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
            break;
        }
        m->owned[m->n_owned++] = mem;
        backend_copy(m->b, mem, t->data, tensor_nbytes(t));
        t->data = mem;
    }
    free(table);
    if (st == STATUS_OK) {
        if (m->w.tied) m->w.lm_head = m->w.tok_embedding;
        m->weight_bytes_mapped = 0;
    }
    return st;
}

/* ---- forward ----------------------------------------------------------------------------- */

static void norm_fwd(const struct model *m, const struct tensor *out, const struct tensor *x,
                     const struct tensor *w, const struct tensor *bias)
{
    if (m->cfg.norm == NORM_KIND_RMSNORM) op_rmsnorm(m->b, out, x, w, m->cfg.norm_eps);
    else op_layernorm(m->b, out, x, w, opt(bias), m->cfg.norm_eps);
}

/* dx = d norm(x) / dx applied to dout; dweight/dbias += (NULL-data tensors are skipped). */
static void norm_bwd(const struct model *m, const struct tensor *dx, const struct tensor *dw,
                     const struct tensor *dbias, const struct tensor *dout, const struct tensor *x,
                     const struct tensor *w)
{
    if (m->cfg.norm == NORM_KIND_RMSNORM) op_rmsnorm_backward(m->b, dx, opt(dw), dout, x, w, m->cfg.norm_eps);
    else op_layernorm_backward(m->b, dx, opt(dw), opt(dbias), dout, x, w, m->cfg.norm_eps);
}

/* The attention variant of a layer: Gemma 3 interleaves sliding-window layers (with their own
 * rotary base) and a global layer every sliding_window_pattern layers. */
static void layer_attention_kind(const struct model *m, int layer, int *window, float *theta)
{
    const int pattern = m->cfg.sliding_window_pattern;
    const int global = pattern > 0 && (layer + 1) % pattern == 0;
    *window = pattern > 0 && global ? 0 : m->cfg.sliding_window;
    *theta = !global && pattern > 0 && m->cfg.rope_theta_local > 0.0f ? m->cfg.rope_theta_local
                                                                      : m->cfg.rope_theta;
}

static struct attention_train_batch attention_batch(const struct model *m, const struct train_batch *tb)
{
    const struct train_activations *a = m->train;
    return (struct attention_train_batch){
        .n_docs = tb->n_docs,
        .doc_start = tensor_first_rows(&a->doc_start, tb->n_docs + 1),
        .scale = m->cfg.attn_scale > 0.0f ? m->cfg.attn_scale : 1.0f / sqrtf((float)m->cfg.head_dim),
        .window = 0,
    };
}

/* The adapters of a target, when the model has them (lora.h): y += s (x A^T) B^T, and back. */
static void adapt(struct model *m, int l, enum lora_target t, const struct tensor *y, const struct tensor *x)
{
    if (m->lora) lora_forward(m->lora, m->b, l, t, y, x);
}

static void adapt_back(struct model *m, int l, enum lora_target t, const struct tensor *dx, const struct tensor *dy,
                       const struct tensor *x)
{
    if (m->lora) lora_backward(m->lora, m->b, l, t, dx, dy, x);
}

/* One decoder layer, in the order of the math (as layer_forward in model.c), keeping what the
 * backward needs. x (T, d) is the residual stream, read and updated in place. */
static void layer_forward_train(struct model *m, int l, int64_t T, const struct tensor *x,
                                const struct attention_train_batch *batch)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &m->train->layers[l];
    const int64_t hd = c->head_dim, hq = (int64_t)m->n_heads_local * hd, hkv = (int64_t)m->n_kv_local * hd;
    struct attention_train_batch ab = *batch;
    float theta;
    layer_attention_kind(m, m->layer_first + l, &ab.window, &theta);
    struct tensor pos = tensor_first_rows(&m->train->positions, T);
    struct tensor x_in = tensor_first_rows(&la->x_in, T), xn1 = tensor_first_rows(&la->xn1, T);
    struct tensor q = tensor_view2(&la->q, T, hq), k = tensor_view2(&la->k, T, hkv), v = tensor_view2(&la->v, T, hkv);
    struct tensor q3 = tensor_view3(&la->q, T, m->n_heads_local, hd), k3 = tensor_view3(&la->k, T, m->n_kv_local, hd);
    struct tensor v3 = tensor_view3(&la->v, T, m->n_kv_local, hd), att3 = tensor_view3(&la->att, T, m->n_heads_local, hd);
    struct tensor att = tensor_view2(&la->att, T, hq), lse = tensor_first_rows(&la->lse, T);

    /* Attention block: xn1 = norm(x); q, k, v = xn1 W^T (+ b); QK norm; rotary; attention. */
    backend_copy(b, x_in.data, x->data, tensor_nbytes(x));
    norm_fwd(m, &xn1, &x_in, &w->attn_norm, &w->attn_norm_bias);
    if (c->qk_norm) {
        struct tensor qp = tensor_view2(&la->q_pre, T, hq), kp = tensor_view2(&la->k_pre, T, hkv);
        op_matmul(b, &qp, &xn1, &w->wq, opt(&w->bq));
        op_matmul(b, &kp, &xn1, &w->wk, opt(&w->bk));
        adapt(m, l, LORA_TARGET_Q, &qp, &xn1);
        adapt(m, l, LORA_TARGET_K, &kp, &xn1);
        struct tensor qph = tensor_view2(&la->q_pre, T * m->n_heads_local, hd), kph = tensor_view2(&la->k_pre, T * m->n_kv_local, hd);
        struct tensor qh = tensor_view2(&la->q, T * m->n_heads_local, hd), kh = tensor_view2(&la->k, T * m->n_kv_local, hd);
        op_rmsnorm(b, &qh, &qph, &w->q_norm, c->norm_eps);
        op_rmsnorm(b, &kh, &kph, &w->k_norm, c->norm_eps);
    } else {
        op_matmul(b, &q, &xn1, &w->wq, opt(&w->bq));
        op_matmul(b, &k, &xn1, &w->wk, opt(&w->bk));
        adapt(m, l, LORA_TARGET_Q, &q, &xn1);
        adapt(m, l, LORA_TARGET_K, &k, &xn1);
    }
    op_matmul(b, &v, &xn1, &w->wv, opt(&w->bv));
    adapt(m, l, LORA_TARGET_V, &v, &xn1);
    if (c->positions == POSITION_KIND_ROTARY) {
        op_rope(b, &q3, &pos, c->rot_dim, theta, c->rope_style);
        op_rope(b, &k3, &pos, c->rot_dim, theta, c->rope_style);
    }
    op_attention_train(b, &att3, &lse, &q3, &k3, &v3, &ab);
    struct tensor proj = c->sandwich_norms ? tensor_first_rows(&la->attn_out, T) : tensor_first_rows(&m->train->dtmp, T);
    op_matmul(b, &proj, &att, &w->wo, m->tp_rank == 0 ? opt(&w->bo) : NULL);
    adapt(m, l, LORA_TARGET_O, &proj, &att);
    struct tensor x_mid = tensor_first_rows(&la->x_mid, T);
    if (c->sandwich_norms) {
        struct tensor normed = tensor_first_rows(&m->train->dtmp, T);
        norm_fwd(m, &normed, &proj, &w->post_attn_norm, NULL);
        op_add(b, &x_mid, &x_in, &normed);
    } else {
        op_add(b, &x_mid, &x_in, &proj);
    }

    /* MLP block: x = x_mid + down(act(gate(xn2)) * up(xn2)), or down(act(up(xn2))). */
    struct tensor xn2 = tensor_first_rows(&la->xn2, T), up = tensor_first_rows(&la->up, T), hact = tensor_first_rows(&la->hact, T);
    norm_fwd(m, &xn2, &x_mid, &w->mlp_norm, &w->mlp_norm_bias);
    op_matmul(b, &up, &xn2, &w->w_up, opt(&w->b_up));
    adapt(m, l, LORA_TARGET_UP, &up, &xn2);
    if (c->gated_mlp) {
        struct tensor gate = tensor_first_rows(&la->gate, T);
        op_matmul(b, &gate, &xn2, &w->w_gate, opt(&w->b_gate));
        adapt(m, l, LORA_TARGET_GATE, &gate, &xn2);
        op_gated_activation(b, &hact, &gate, &up, c->activation);
    } else {
        op_activation(b, &hact, &up, c->activation);
    }
    proj = c->sandwich_norms ? tensor_first_rows(&la->mlp_out, T) : tensor_first_rows(&m->train->dtmp, T);
    op_matmul(b, &proj, &hact, &w->w_down, m->tp_rank == 0 ? opt(&w->b_down) : NULL);
    adapt(m, l, LORA_TARGET_DOWN, &proj, &hact);
    if (c->sandwich_norms) {
        struct tensor normed = tensor_first_rows(&m->train->dtmp, T);
        norm_fwd(m, &normed, &proj, &w->post_mlp_norm, NULL);
        op_add(b, x, &x_mid, &normed);
    } else {
        op_add(b, x, &x_mid, &proj);
    }
}

static enum status check_batch(const struct model *m, const struct train_batch *tb)
{
    if (!m->train) return status_errorf(STATUS_INVALID_ARGUMENT, "model: model_reserve_train first");
    if (tb->n_tokens <= 0 || tb->n_tokens > m->train->max_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch of %d tokens (at most %d)",
                             tb->n_tokens, m->train->max_tokens);
    if (tb->n_docs <= 0 || tb->doc_start[0] != 0 || tb->doc_start[tb->n_docs] != tb->n_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch: documents do not cover its %d rows",
                             tb->n_tokens);
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

enum status model_forward_train(struct model *m, const struct train_batch *tb, double *loss_sum,
                                int *n_real)
{
    enum status st = check_batch(m, tb);
    if (st != STATUS_OK) return st;
    struct backend *b = m->b;
    struct train_activations *a = m->train;
    const int64_t T = tb->n_tokens;
    backend_upload(b, a->tokens.data, tb->tokens, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->targets.data, tb->targets, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->positions.data, tb->positions, (size_t)T * sizeof(int32_t));
    backend_upload(b, a->doc_start.data, tb->doc_start, (size_t)(tb->n_docs + 1) * sizeof(int32_t));
    const struct attention_train_batch ab = attention_batch(m, tb);

    /* Embedding (and learned positions); the residual stream lives in x_final between layers. */
    struct tensor x = tensor_first_rows(&a->x_final, T), tokens = tensor_first_rows(&a->tokens, T), pos = tensor_first_rows(&a->positions, T);
    op_embedding(b, &x, &m->w.tok_embedding, &tokens, m->vocab_start);
    if (m->cfg.embed_scale != 0.0f && m->cfg.embed_scale != 1.0f) op_scale(b, &x, &x, m->cfg.embed_scale);
    if (m->cfg.positions == POSITION_KIND_LEARNED) op_position_embedding_add(b, &x, &m->w.pos_embedding, &pos);

    for (int l = 0; l < m->n_layers_local; l++) layer_forward_train(m, l, T, &x, &ab);

    /* Final norm and the loss: the fused, vocab-parallel-shaped cross-entropy. */
    struct tensor h = tensor_first_rows(&a->h_final, T), targets = tensor_first_rows(&a->targets, T);
    norm_fwd(m, &h, &x, &m->w.final_norm, &m->w.final_norm_bias);
    struct tensor stats = tensor_first_rows(&a->stats, T), loss = tensor_first_rows(&a->loss, T), lse = tensor_first_rows(&a->lse, T);
    op_cross_entropy_stats(b, &stats, &h, &m->w.lm_head, &targets, m->vocab_start);
    struct tensor stats3 = tensor_make(stats.data, DTYPE_F32, b->device, 3, (int64_t)1, T, (int64_t)3);
    op_cross_entropy_combine(b, &loss, &lse, &stats3, &targets);
    backend_download(b, a->host_loss, loss.data, (size_t)T * sizeof(float));
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

/* ---- backward ---------------------------------------------------------------------------- */

/* The mirror of layer_forward_train. On entry dres (T, d) holds dL/d(layer output); on return
 * dL/d(layer input). g holds this layer's weight gradients (+=). */
static void layer_backward(struct model *m, int l, int64_t T, const struct layer_weights *g,
                           const struct attention_train_batch *batch)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    struct layer_acts *la = &m->train->layers[l];
    struct train_activations *a = m->train;
    const int64_t hd = c->head_dim, hq = (int64_t)m->n_heads_local * hd, hkv = (int64_t)m->n_kv_local * hd;
    struct attention_train_batch ab = *batch;
    float theta;
    layer_attention_kind(m, m->layer_first + l, &ab.window, &theta);
    const int bias_rank = m->tp_rank == 0;
    struct tensor dres = tensor_first_rows(&a->dres, T), dtmp = tensor_first_rows(&a->dtmp, T), dxn = tensor_first_rows(&a->dxn, T);
    struct tensor pos = tensor_first_rows(&a->positions, T);

    /* MLP block, in reverse: x = x_mid + [norm](down(h)). dres flows to x_mid unchanged. */
    struct tensor dproj = dres;
    if (c->sandwich_norms) { /* dtmp = d post_mlp_norm(mlp_out) */
        struct tensor mlp_out = tensor_first_rows(&la->mlp_out, T);
        norm_bwd(m, &dtmp, &g->post_mlp_norm, NULL, &dres, &mlp_out, &w->post_mlp_norm);
        dproj = dtmp;
    }
    struct tensor dh = tensor_first_rows(&a->dup, T), hact = tensor_first_rows(&la->hact, T);
    op_matmul_backward(b, &dh, opt(&g->w_down), bias_rank ? opt(&g->b_down) : NULL, &dproj, &hact, &w->w_down, 0);
    adapt_back(m, l, LORA_TARGET_DOWN, &dh, &dproj, &hact);
    struct tensor up = tensor_first_rows(&la->up, T), xn2 = tensor_first_rows(&la->xn2, T);
    struct tensor dup = tensor_first_rows(&a->dup, T);
    if (c->gated_mlp) {
        struct tensor gate = tensor_first_rows(&la->gate, T), dgate = tensor_first_rows(&a->dgate, T);
        op_gated_activation_backward(b, &dgate, &dup, &dh, &gate, &up, c->activation);
        op_matmul_backward(b, &dxn, opt(&g->w_gate), opt(&g->b_gate), &dgate, &xn2, &w->w_gate, 0);
        adapt_back(m, l, LORA_TARGET_GATE, &dxn, &dgate, &xn2);
        op_matmul_backward(b, &dxn, opt(&g->w_up), opt(&g->b_up), &dup, &xn2, &w->w_up, 1);
    } else {
        op_activation_backward(b, &dup, &dh, &up, c->activation);
        op_matmul_backward(b, &dxn, opt(&g->w_up), opt(&g->b_up), &dup, &xn2, &w->w_up, 0);
    }
    adapt_back(m, l, LORA_TARGET_UP, &dxn, &dup, &xn2);
    struct tensor x_mid = tensor_first_rows(&la->x_mid, T);
    norm_bwd(m, &dtmp, &g->mlp_norm, &g->mlp_norm_bias, &dxn, &x_mid, &w->mlp_norm);
    op_add(b, &dres, &dres, &dtmp); /* dL/dx_mid */

    /* Attention block, in reverse: x_mid = x_in + [norm](att W_o^T). */
    dproj = dres;
    if (c->sandwich_norms) {
        struct tensor attn_out = tensor_first_rows(&la->attn_out, T);
        norm_bwd(m, &dtmp, &g->post_attn_norm, NULL, &dres, &attn_out, &w->post_attn_norm);
        dproj = dtmp;
    }
    struct tensor att = tensor_view2(&la->att, T, hq), datt = tensor_view2(&a->datt, T, hq);
    op_matmul_backward(b, &datt, opt(&g->wo), bias_rank ? opt(&g->bo) : NULL, &dproj, &att, &w->wo, 0);
    adapt_back(m, l, LORA_TARGET_O, &datt, &dproj, &att);
    struct tensor dq3 = tensor_view3(&a->dq, T, m->n_heads_local, hd), dk3 = tensor_view3(&a->dk, T, m->n_kv_local, hd);
    struct tensor dv3 = tensor_view3(&a->dv, T, m->n_kv_local, hd), datt3 = tensor_view3(&a->datt, T, m->n_heads_local, hd);
    struct tensor q3 = tensor_view3(&la->q, T, m->n_heads_local, hd), k3 = tensor_view3(&la->k, T, m->n_kv_local, hd);
    struct tensor v3 = tensor_view3(&la->v, T, m->n_kv_local, hd), att3 = tensor_view3(&la->att, T, m->n_heads_local, hd);
    struct tensor lse = tensor_first_rows(&la->lse, T);
    op_attention_train_backward(b, &dq3, &dk3, &dv3, &datt3, &att3, &lse, &q3, &k3, &v3, &ab);
    if (c->positions == POSITION_KIND_ROTARY) {
        op_rope_backward(b, &dq3, &pos, c->rot_dim, theta, c->rope_style);
        op_rope_backward(b, &dk3, &pos, c->rot_dim, theta, c->rope_style);
    }
    if (c->qk_norm) { /* through the per-head RMSNorm, in place on dq, dk */
        struct tensor dqh = tensor_view2(&a->dq, T * m->n_heads_local, hd), dkh = tensor_view2(&a->dk, T * m->n_kv_local, hd);
        struct tensor qph = tensor_view2(&la->q_pre, T * m->n_heads_local, hd), kph = tensor_view2(&la->k_pre, T * m->n_kv_local, hd);
        op_rmsnorm_backward(b, &dqh, opt(&g->q_norm), &dqh, &qph, &w->q_norm, c->norm_eps);
        op_rmsnorm_backward(b, &dkh, opt(&g->k_norm), &dkh, &kph, &w->k_norm, c->norm_eps);
    }
    struct tensor xn1 = tensor_first_rows(&la->xn1, T);
    struct tensor dq = tensor_view2(&a->dq, T, hq), dk = tensor_view2(&a->dk, T, hkv), dv = tensor_view2(&a->dv, T, hkv);
    op_matmul_backward(b, &dxn, opt(&g->wq), opt(&g->bq), &dq, &xn1, &w->wq, 0);
    adapt_back(m, l, LORA_TARGET_Q, &dxn, &dq, &xn1);
    op_matmul_backward(b, &dxn, opt(&g->wk), opt(&g->bk), &dk, &xn1, &w->wk, 1);
    adapt_back(m, l, LORA_TARGET_K, &dxn, &dk, &xn1);
    op_matmul_backward(b, &dxn, opt(&g->wv), opt(&g->bv), &dv, &xn1, &w->wv, 1);
    adapt_back(m, l, LORA_TARGET_V, &dxn, &dv, &xn1);
    struct tensor x_in = tensor_first_rows(&la->x_in, T);
    norm_bwd(m, &dtmp, &g->attn_norm, &g->attn_norm_bias, &dxn, &x_in, &w->attn_norm);
    op_add(b, &dres, &dres, &dtmp); /* dL/dx_in */
}

enum status model_backward(struct model *m, const struct train_batch *tb,
                           struct model_weights *grads)
{
    enum status st = check_batch(m, tb);
    if (st != STATUS_OK) return st;
    struct backend *b = m->b;
    struct train_activations *a = m->train;
    const int64_t T = tb->n_tokens;
    const struct attention_train_batch ab = attention_batch(m, tb);

    /* Loss and final norm, in reverse: dh_final from the cross-entropy, then dres = dL/dx. */
    struct tensor h = tensor_first_rows(&a->h_final, T), x = tensor_first_rows(&a->x_final, T);
    struct tensor targets = tensor_first_rows(&a->targets, T), lse = tensor_first_rows(&a->lse, T);
    struct tensor dxn = tensor_first_rows(&a->dxn, T), dres = tensor_first_rows(&a->dres, T);
    op_cross_entropy_backward(b, &dxn, opt(&grads->lm_head), &h, &m->w.lm_head, &targets, &lse, NULL,
                              tb->grad_scale, m->vocab_start, 0);
    norm_bwd(m, &dres, &grads->final_norm, &grads->final_norm_bias, &dxn, &x, &m->w.final_norm);

    for (int l = m->n_layers_local - 1; l >= 0; l--) layer_backward(m, l, T, &grads->layers[l], &ab);

    /* Embedding, in reverse: x0 = scale * E[tokens] (+ P[positions]). */
    struct tensor tokens = tensor_first_rows(&a->tokens, T), pos = tensor_first_rows(&a->positions, T);
    if (m->cfg.positions == POSITION_KIND_LEARNED && opt(&grads->pos_embedding))
        op_position_embedding_add_backward(b, &grads->pos_embedding, &dres, &pos);
    if (m->cfg.embed_scale != 0.0f && m->cfg.embed_scale != 1.0f) op_scale(b, &dres, &dres, m->cfg.embed_scale);
    if (opt(&grads->tok_embedding)) op_embedding_backward(b, &grads->tok_embedding, &dres, &tokens, m->vocab_start);
    backend_synchronize(b);
    return STATUS_OK;
}
