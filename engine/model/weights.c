/* engine/model/weights.c - the weights' layout table and state shaped like the weights
 * (weights.h). Tests: tests/test_weights.c, and every model test loads through the table. */
#include "weights.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The per-layer fields in enum weight_kind order. */
static const struct {
    enum weight_kind kind;
    size_t offset;
} layer_fields[] = {
    {WEIGHT_KIND_ATTN_NORM, offsetof(struct layer_weights, attn_norm)},
    {WEIGHT_KIND_ATTN_NORM_BIAS, offsetof(struct layer_weights, attn_norm_bias)},
    {WEIGHT_KIND_Q, offsetof(struct layer_weights, wq)},
    {WEIGHT_KIND_Q_BIAS, offsetof(struct layer_weights, bq)},
    {WEIGHT_KIND_K, offsetof(struct layer_weights, wk)},
    {WEIGHT_KIND_K_BIAS, offsetof(struct layer_weights, bk)},
    {WEIGHT_KIND_V, offsetof(struct layer_weights, wv)},
    {WEIGHT_KIND_V_BIAS, offsetof(struct layer_weights, bv)},
    {WEIGHT_KIND_O, offsetof(struct layer_weights, wo)},
    {WEIGHT_KIND_O_BIAS, offsetof(struct layer_weights, bo)},
    {WEIGHT_KIND_MLP_NORM, offsetof(struct layer_weights, mlp_norm)},
    {WEIGHT_KIND_MLP_NORM_BIAS, offsetof(struct layer_weights, mlp_norm_bias)},
    {WEIGHT_KIND_GATE, offsetof(struct layer_weights, w_gate)},
    {WEIGHT_KIND_GATE_BIAS, offsetof(struct layer_weights, b_gate)},
    {WEIGHT_KIND_UP, offsetof(struct layer_weights, w_up)},
    {WEIGHT_KIND_UP_BIAS, offsetof(struct layer_weights, b_up)},
    {WEIGHT_KIND_DOWN, offsetof(struct layer_weights, w_down)},
    {WEIGHT_KIND_DOWN_BIAS, offsetof(struct layer_weights, b_down)},
    {WEIGHT_KIND_Q_NORM, offsetof(struct layer_weights, q_norm)},
    {WEIGHT_KIND_K_NORM, offsetof(struct layer_weights, k_norm)},
    {WEIGHT_KIND_POST_ATTN_NORM, offsetof(struct layer_weights, post_attn_norm)},
    {WEIGHT_KIND_POST_MLP_NORM, offsetof(struct layer_weights, post_mlp_norm)},
    {WEIGHT_KIND_ROUTER, offsetof(struct layer_weights, router)},
    {WEIGHT_KIND_EXP_GATE, offsetof(struct layer_weights, exp_gate)},
    {WEIGHT_KIND_EXP_UP, offsetof(struct layer_weights, exp_up)},
    {WEIGHT_KIND_EXP_DOWN, offsetof(struct layer_weights, exp_down)},
    {WEIGHT_KIND_SHARED_GATE, offsetof(struct layer_weights, shared_gate)},
    {WEIGHT_KIND_SINKS, offsetof(struct layer_weights, sinks)},
    {WEIGHT_KIND_ROUTER_BIAS, offsetof(struct layer_weights, router_bias)},
    {WEIGHT_KIND_EXP_GATE_BIAS, offsetof(struct layer_weights, exp_gate_bias)},
    {WEIGHT_KIND_EXP_UP_BIAS, offsetof(struct layer_weights, exp_up_bias)},
    {WEIGHT_KIND_EXP_DOWN_BIAS, offsetof(struct layer_weights, exp_down_bias)},
    {WEIGHT_KIND_ROUTER_SEL_BIAS, offsetof(struct layer_weights, router_sel_bias)},
};
#define N_LAYER_FIELDS ((int)(sizeof layer_fields / sizeof layer_fields[0]))

int weights_table_max(int n_layers) { return 8 + n_layers * N_LAYER_FIELDS; }

static int push(struct weight_ref *out, int n, int present_only, enum weight_kind kind, int layer,
                int local, struct tensor *t)
{
    if (present_only && !t->data) return n;
    out[n] = (struct weight_ref){.kind = kind, .layer = layer, .local_layer = local, .t = t};
    return n + 1;
}

int weights_table(struct model_weights *w, int layer_first, int present_only, struct weight_ref *out)
{
    int n = 0;
    n = push(out, n, present_only, WEIGHT_KIND_TOK_EMBEDDING, -1, -1, &w->tok_embedding);
    n = push(out, n, present_only, WEIGHT_KIND_POS_EMBEDDING, -1, -1, &w->pos_embedding);
    n = push(out, n, present_only, WEIGHT_KIND_TYPE_EMBEDDING, -1, -1, &w->type_embedding);
    n = push(out, n, present_only, WEIGHT_KIND_EMBED_NORM, -1, -1, &w->embed_norm);
    n = push(out, n, present_only, WEIGHT_KIND_EMBED_NORM_BIAS, -1, -1, &w->embed_norm_bias);
    for (int l = 0; l < w->n_layers; l++)
        for (int f = 0; f < N_LAYER_FIELDS; f++)
            n = push(out, n, present_only, layer_fields[f].kind, layer_first + l, l,
                     (struct tensor *)((char *)&w->layers[l] + layer_fields[f].offset));
    n = push(out, n, present_only, WEIGHT_KIND_FINAL_NORM, -1, -1, &w->final_norm);
    n = push(out, n, present_only, WEIGHT_KIND_FINAL_NORM_BIAS, -1, -1, &w->final_norm_bias);
    if (!w->tied) n = push(out, n, present_only, WEIGHT_KIND_LM_HEAD, -1, -1, &w->lm_head);
    return n;
}

static struct weight_ref *table_of(struct model_weights *w, int *n)
{
    struct weight_ref *t = malloc((size_t)weights_table_max(w->n_layers) * sizeof *t);
    if (t) *n = weights_table(w, 0, 1, t);
    return t;
}

/* The dtype of a kind's copy: attention sinks and the router's selection bias stay f32 whatever
 * the rest (the attention ops and the host's routing read them as f32; model_load keeps them so
 * too). */
static enum dtype like_dtype(enum weight_kind kind, enum dtype dtype)
{
    return kind == WEIGHT_KIND_SINKS || kind == WEIGHT_KIND_ROUTER_SEL_BIAS ? DTYPE_F32 : dtype;
}

enum status weights_alloc_like(struct backend *b, struct model_weights *like, enum dtype dtype,
                               struct model_weights *out, void **mem)
{
    memset(out, 0, sizeof *out);
    *mem = NULL;
    out->n_layers = like->n_layers;
    out->tied = like->tied;
    const int max = weights_table_max(like->n_layers);
    out->layers = calloc((size_t)(like->n_layers > 0 ? like->n_layers : 1), sizeof *out->layers);
    struct weight_ref *src = malloc((size_t)max * sizeof *src), *dst = malloc((size_t)max * sizeof *dst);
    enum status st = STATUS_OK;
    void *base = NULL;
    if (!out->layers || !src || !dst) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "weights: out of host memory");
        goto done;
    }
    /* Both tables list every field in the same order, so rows match by position. */
    const int n = weights_table(like, 0, 0, src);
    weights_table(out, 0, 0, dst);
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (!src[i].t->data) continue;
        struct tensor t = *src[i].t;
        t.dtype = like_dtype(src[i].kind, dtype);
        total += (tensor_nbytes(&t) + 255) / 256 * 256;
    }
    if (total > 0) {
        if ((st = backend_alloc(b, total, &base)) != STATUS_OK) goto done;
        backend_memset_zero(b, base, total);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!src[i].t->data) continue;
        struct tensor t = *src[i].t;
        t.dtype = like_dtype(src[i].kind, dtype);
        t.device = b->device;
        t.data = (char *)base + off;
        *dst[i].t = t;
        off += (tensor_nbytes(&t) + 255) / 256 * 256;
    }
    if (out->tied) out->lm_head = out->tok_embedding;
    *mem = base;
done:
    free(src);
    free(dst);
    if (st != STATUS_OK) weights_free_layers(out);
    return st;
}

void weights_zero(struct backend *b, struct model_weights *w)
{
    int n = 0;
    struct weight_ref *t = table_of(w, &n);
    CHECK(t, "weights: out of host memory for the layout table");
    for (int i = 0; i < n; i++) backend_memset_zero(b, t[i].t->data, tensor_nbytes(t[i].t));
    free(t);
}

void weights_free_layers(struct model_weights *w)
{
    free(w->layers);
    w->layers = NULL;
}

int64_t weights_numel(struct model_weights *w)
{
    int n = 0;
    struct weight_ref *t = table_of(w, &n);
    CHECK(t, "weights: out of host memory for the layout table");
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += tensor_numel(t[i].t);
    free(t);
    return total;
}
