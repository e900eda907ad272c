/* engine/model/layer.h - one decoder layer's forward math, shared by serving (model.c: paged KV
 * cache, a workspace overwritten layer after layer) and training (model_train.c: activations
 * kept for the backward, sequence parallelism, recomputation). Every architecture feature of
 * the forward (biases, the QK norm, rotary and its per-layer base, Gemma's local/global
 * layers, sandwich norms, gated or plain MLP, LoRA on each projection) is spelled out here
 * once; the backward in model_train.c mirrors these blocks one by one.
 * What differs between the two callers is theirs, given as struct layer_hooks: how rows are
 * gathered and partial sums reduced over tp, how adapters apply, and how attention reads K/V.
 * Not here: embeddings, the final norm and the LM head (model.c, model_train.c).
 * Tests: tests/test_model.c (serving goldens), tests/test_train_grad.py (training vs JAX). */
#ifndef SHARDLM_LAYER_H
#define SHARDLM_LAYER_H

#include "lora.h"
#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

struct moe_tensors;

/* Rows [0, T) of buf, a buffer as wide as the widest dense MLP (ffn_local), as (T, F) with F the
 * MLP of layer weights w (GLM-4.5's dense first layers and its shared experts differ in width). */
static inline struct tensor layer_ffn_view(const struct tensor *buf, int64_t T, const struct layer_weights *w)
{
    return tensor_make(buf->data, buf->dtype, buf->device, 2, T, w->w_up.shape[0]);
}

/* Where one call's tensors live. Rows: T for the tensor-parallel region (q .. hact), Tl (the
 * rank's rows of the residual stream: T / tp under sequence parallelism, else T) for the rest.
 * Tensors whose data pointers are equal share storage, and the math then runs in place:
 * serving passes x_in = x_mid = x, q_pre = q, k_pre = k, hact = up, normed = attn_out =
 * mlp_out (its workspace); training passes distinct tensors it keeps. */
struct layer_tensors {
    struct tensor x;                /* (Tl, d): the residual stream, in and out */
    struct tensor x_in, x_mid;      /* (Tl, d): the layer's input, and after attention */
    struct tensor xn1, xn2;         /* (Tl, d): the attention and MLP norms' outputs */
    struct tensor q_pre, k_pre;     /* (T, heads * hd): q, k before the QK norm; the same as
                                     * q, k when the model has none */
    struct tensor q, k, v, att;     /* (T, heads, hd) */
    struct tensor lse;              /* f32 (T, heads): training attention's log-sum-exp */
    struct tensor gate, up, hact;   /* (T, ffn_local) */
    struct tensor attn_out, mlp_out;/* (Tl, d): the row-parallel products (summed over tp) */
    struct tensor normed;           /* (Tl, d): a sandwich norm's output before the residual add */
    struct tensor pos;              /* i32 (T): positions, for rotary */
    struct tensor qk_full;          /* (>= T, n_heads * hd): q or k gathered over tp for a QK norm
                                     * over the whole projection at tp > 1 (else no data needed) */
    const struct moe_tensors *moe;  /* a mixture of experts' tensors (moe.h); NULL: the serving
                                     * workspace */
};

/* What the caller decides. ctx is passed back to each. */
struct layer_hooks {
    void *ctx;
    /* All T rows of a tensor held as local rows (identity, or an all-gather). */
    enum status (*gather)(void *ctx, const struct tensor *local, int64_t T, struct tensor *full);
    /* The tensor a row-parallel product of T rows writes its partial sums into, for out. */
    struct tensor (*partial)(void *ctx, const struct tensor *out, int64_t T);
    /* Sums partial over tp into out (an all-reduce in place, or a reduce-scatter). */
    enum status (*reduce)(void *ctx, const struct tensor *partial, const struct tensor *out);
    /* y += the adapters' low-rank product of x for projection t of local layer l. */
    void (*adapt)(void *ctx, int l, enum lora_target t, const struct tensor *y, const struct tensor *x);
    /* att = attention of q over k, v for local layer l (causal, or bidirectional for an
     * encoder: cfg.encoder, served by model_embed only), windowed when window > 0
     * (serving writes the new K/V into its cache and reads it; training attends within the
     * micro-batch's documents and writes lse). */
    void (*attend)(void *ctx, int l, int window, const struct tensor *q3, const struct tensor *k3,
                   const struct tensor *v3, const struct tensor *att3, const struct tensor *lse);
};

/* The attention variant of global layer `layer`: Gemma 3 interleaves sliding-window layers
 * (with their own rotary base) and a global layer every sliding_window_pattern layers. */
void layer_attention_kind(const struct model *m, int layer, int *window, struct rope_params *rope);

/* norm(x) with the model's norm (RMSNorm, or LayerNorm with its optional bias). */
void layer_norm(const struct model *m, const struct tensor *out, const struct tensor *x, const struct tensor *w,
                const struct tensor *bias);
/* The norm before attention or the MLP: layer_norm, or for a model without pre-norms (OLMo 2;
 * BERT, whose norms follow the residual add: cfg.post_ln) or without that norm's weight (an
 * EAGLE head's attention: engine/serving/draft.c) x itself, copied into out unless out is x. */
void layer_pre_norm(const struct model *m, const struct tensor *out, const struct tensor *x, const struct tensor *w,
                    const struct tensor *bias);
/* q or k (T rows of heads x head_dim) as the QK norm normalises it: (T * heads, head_dim) for a
 * norm per head, (T, heads * head_dim) for one over the whole projection (QK_NORM_FULL). */
struct tensor layer_qk_norm_view(const struct model *m, const struct tensor *t, int64_t T, int64_t heads);

/* The QK norm of q_pre or k_pre (in, T rows of `heads` local heads) into q or k (out; may be in),
 * with weight w: per head, or over the whole projection. The whole projection at tp > 1: each
 * rank holds some heads' columns, so the rows are gathered side by side over tp (rank r's at
 * columns r * cols, ck_plan's order) into full (t->qk_full), normed whole with the whole weight
 * (replicated on every rank), and this rank's columns copied back out. Every rank must then hold
 * distinct heads (model_load refuses replicated KV heads for it). */
enum status layer_qk_norm(struct model *m, const struct tensor *out, const struct tensor *in, const struct tensor *w,
                          int64_t T, int64_t heads, const struct tensor *full);
/* out (T, cols) = this tp rank's columns of full (T, tp * cols), rows gathered side by side over
 * tp (comm_all_gather_last); the two must not overlap. */
void layer_tp_columns(const struct model *m, const struct tensor *out, const struct tensor *full);

/* The attention block's inside from the normed rows xn (T rows): q, k, v (+ biases, adapters),
 * the QK norm, rotary, attention into t->att. */
enum status layer_attention_inner(struct model *m, int l, int64_t T, const struct tensor *xn, const struct layer_tensors *t,
                           const struct layer_hooks *h);

/* The MLP's inside from the normed rows xn (T rows): up, gate (+ biases, adapters) and the
 * activation into t->hact. */
void layer_mlp_inner(struct model *m, int l, int64_t T, const struct tensor *xn, const struct layer_tensors *t,
                     const struct layer_hooks *h);

/* One decoder layer of local index l over T rows, in the order of the math:
 *   x_mid = x_in + [norm](attention(norm(x_in)) W_o^T),  x = x_mid + [norm](mlp(norm(x_mid))),
 * or with cfg.post_ln (an encoder layer, BERT):
 *   x_mid = norm(x_in + attention(x_in) W_o^T),  x = norm(x_mid + mlp(x_mid)).
 * chain 1: the caller runs local layers 0, 1, ... in turn over the same tensors, so a layer whose
 * successor's pre-norm is an RMSNorm computes it into t->xn1 in its last residual add
 * (op_add_rmsnorm, the same bits), and that successor skips its own (serving: one launch less a
 * layer); 0: each layer on its own (training keeps each layer's tensors apart). */
enum status layer_forward(struct model *m, int l, int64_t T, const struct layer_tensors *t,
                          const struct layer_hooks *h, int chain);

#ifdef __cplusplus
}
#endif

#endif
