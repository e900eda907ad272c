/* engine/model/eagle_head.c - the shape of an EAGLE-1 head beside a target, and a draft head's
 * token map (eagle_head.h).
 * Tests: tests/server/test_speculative_eagle_targets.py, tests/test_train_eagle.py. */
#include "eagle_head.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* The head's own layer is Llama-style whatever the target's layers are (eagle_head_shape); what
 * it borrows is the target's two ends (embeddings, LM head, rotary base and scaling) and its
 * features. */
const char *eagle_head_unfit(const struct model *t)
{
    const struct model_config *c = &t->cfg;
    if (c->encoder) return "an encoder has no LM head";
    if (c->positions != POSITION_KIND_ROTARY) return "its positions are learned, and the head's layer is rotary";
    return NULL;
}

/* The head's configuration from the target's: one Llama-style layer (RMS norms, SwiGLU, rotary
 * at the target's base and scaling, full causal attention scaled by 1/sqrt(head_dim), no biases,
 * no QK, sandwich or other norms, no soft-capped scores, no sinks, a dense MLP of ffn rows), of
 * the target's attention widths. What the target's ends do stays: its embedding scale (Gemma's
 * sqrt(d): the head reads the embedding as the target's first layer does) and its final soft-cap
 * on the logits. ffn is the head's own (a mixture of experts' head has a dense MLP of a size
 * the target's config does not give: SGLang's EAGLE-3 heads for Qwen 3 MoE, Llama 4). */
static void head_config(struct model_config *c, int ffn)
{
    c->ffn_hidden = ffn;
    c->n_experts = c->n_experts_used = c->moe_ffn = c->norm_topk_prob = c->shared_expert = 0;
    c->moe_bias = c->moe_sigmoid = c->moe_sel_bias = c->moe_groups = c->moe_group_topk = 0;
    c->moe_routed_scale = 0.0f;
    c->moe_dense_first = c->dense_ffn = 0;
    c->norm = NORM_KIND_RMSNORM;
    c->activation = ACTIVATION_SILU;
    c->gated_mlp = 1;
    c->qk_norm = c->sandwich_norms = c->no_pre_norms = c->post_ln = 0;
    c->qkv_bias = c->attn_out_bias = c->mlp_bias = 0;
    c->sliding_window = c->sliding_window_pattern = 0;
    c->rope_theta_local = 0.0f;
    c->attn_scale = c->attn_softcap = 0.0f;
    c->attn_sinks = 0;
}

void eagle_head_shape(struct model *h, const struct model *target, const struct model *ends, int ffn)
{
    h->cfg = target->cfg;
    head_config(&h->cfg, ffn);
    h->par.layout = (struct parallel_layout){.world_size = 1, .tp_size = 1, .pp_size = 1, .dp_size = 1,
                                             .pp_prev = -1, .pp_next = -1};
    h->dtype = target->dtype;
    h->tp_size = h->pp_size = h->ep_size = 1;
    h->layer_first = target->cfg.n_layers - 1;
    h->n_layers_local = h->w.n_layers = 1;
    h->n_heads_local = h->cfg.n_heads;
    h->n_kv_local = h->cfg.n_kv_heads;
    h->ffn_local = h->cfg.ffn_hidden;
    h->vocab_local = ends->vocab_local;
    h->w.tok_embedding = ends->w.tok_embedding;
    h->w.lm_head = ends->w.lm_head;
    memcpy(h->rope_freqs, ends->rope_freqs, sizeof h->rope_freqs);
    snprintf(h->quantization, sizeof h->quantization, "none");
}

void eagle_head_tensors(struct model *h, struct eagle_head_tensor out[EAGLE_HEAD_TENSORS])
{
    const struct model_config *c = &h->cfg;
    const int64_t D = c->d_model, hq = (int64_t)c->n_heads * c->head_dim, hkv = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t F = c->ffn_hidden;
    struct layer_weights *w = &h->w.layers[0];
    const struct eagle_head_tensor all[EAGLE_HEAD_TENSORS] = {
        {"fc.weight", D, 2 * D, NULL, 0},
        {"fc.bias", D, 0, &h->input_fc_bias, 1},
        {"layers.0.self_attn.q_proj.weight", hq, D, &w->wq, 0},
        {"layers.0.self_attn.k_proj.weight", hkv, D, &w->wk, 0},
        {"layers.0.self_attn.v_proj.weight", hkv, D, &w->wv, 0},
        {"layers.0.self_attn.o_proj.weight", D, hq, &w->wo, 0},
        {"layers.0.post_attention_layernorm.weight", D, 0, &w->mlp_norm, 0},
        {"layers.0.mlp.gate_proj.weight", F, D, &w->w_gate, 0},
        {"layers.0.mlp.up_proj.weight", F, D, &w->w_up, 0},
        {"layers.0.mlp.down_proj.weight", D, F, &w->w_down, 0},
    };
    memcpy(out, all, sizeof all);
}

enum status eagle_head_read(const struct safetensors *st, const char *what, const char *who,
                            const struct eagle_head_tensor *want, float **host, int *absent)
{
    *absent = 0;
    const struct st_tensor *t = safetensors_find(st, want->name);
    if (!t && want->optional) {
        *absent = 1;
        return STATUS_OK;
    }
    if (!t) return status_errorf(STATUS_INVALID_ARGUMENT, "%s: no tensor '%s' (an EAGLE-1 head)", what, want->name);
    const int dims = want->cols ? 2 : 1;
    if (!t->supported || t->elem_size == 0 || t->ndim != dims || t->shape[0] != want->rows ||
        (dims == 2 && t->shape[1] != want->cols))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor %s is %s of %d dimensions (%lld x %lld); %s needs "
                             "float (%lld x %lld)", what, want->name, t->dtype_name, t->ndim, (long long)t->shape[0],
                             (long long)(t->ndim > 1 ? t->shape[1] : 1), who, (long long)want->rows,
                             (long long)(want->cols ? want->cols : 1));
    float *grown = realloc(*host, (size_t)t->numel * sizeof **host);
    if (!grown) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of host memory", what);
    *host = grown;
    return safetensors_read(t, DTYPE_F32, grown, (size_t)t->numel * sizeof *grown);
}

void eagle_head_fc_split(const float *fc, int64_t d, float *w_emb, float *w_feat)
{
    for (int64_t r = 0; r < d; r++) {
        memcpy(w_emb + r * d, fc + r * 2 * d, (size_t)d * sizeof *fc);
        memcpy(w_feat + r * d, fc + r * 2 * d + d, (size_t)d * sizeof *fc);
    }
}

static enum status parse_token_map(const char *path, const char *text, int vocab, int32_t **ids, int *n)
{
#define MAP_ERR(...) status_errorf(STATUS_INVALID_ARGUMENT, "--spec-token-map %s: " __VA_ARGS__)
    uint8_t *seen = calloc((size_t)vocab, 1);
    int32_t *out = malloc((size_t)vocab * sizeof *out);
    enum status st = STATUS_OK;
    int k = 0;
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (!seen || !out) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "--spec-token-map: out of host memory");
    } else if (*p++ != '[') {
        st = MAP_ERR("not a JSON array of token ids", path);
    } else {
        for (;;) {
            while (isspace((unsigned char)*p)) p++;
            if (*p == ']' && k == 0) break;
            char *end;
            errno = 0;
            const long long v = strtoll(p, &end, 10);
            if (end == p || errno) {
                st = MAP_ERR("entry %d is not an integer", path, k + 1);
                break;
            }
            if (v < 0 || v >= vocab) {
                st = MAP_ERR("token id %lld is outside the vocabulary [0, %d)", path, v, vocab);
                break;
            }
            if (seen[v]++) {
                st = MAP_ERR("token id %lld is listed twice", path, v);
                break;
            }
            out[k++] = (int32_t)v;
            for (p = end; isspace((unsigned char)*p); p++) {}
            if (*p == ',') { p++; continue; }
            if (*p != ']') st = MAP_ERR("expected ',' or ']' after entry %d", path, k);
            break;
        }
        if (st == STATUS_OK) {
            for (p++; isspace((unsigned char)*p); p++) {}
            if (*p) st = MAP_ERR("text after the array", path);
            else if (k == 0) st = MAP_ERR("the array is empty", path);
        }
    }
    if (st == STATUS_OK) { /* ascending: the order of the head's rows */
        k = 0;
        for (int i = 0; i < vocab; i++)
            if (seen[i]) out[k++] = i;
        *ids = out, *n = k;
    } else {
        free(out);
    }
    free(seen);
    return st;
#undef MAP_ERR
}

enum status eagle_head_token_map(const struct safetensors *st, const char *what, int vocab, int32_t **ids, int *n)
{
    *ids = NULL, *n = 0;
    const struct st_tensor *t = safetensors_find(st, EAGLE_HEAD_TOKEN_MAP);
    if (!t) return STATUS_OK;
    if (strcmp(t->dtype_name, "I32") || t->ndim != 1 || t->shape[0] < 1 || t->shape[0] > vocab)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor " EAGLE_HEAD_TOKEN_MAP " is %s of %d dimensions "
                             "(%lld); a token map is int32 (I32) ids, 1 to %d of them", what, t->dtype_name, t->ndim,
                             (long long)(t->ndim ? t->shape[0] : 0), vocab);
    int32_t *out = malloc((size_t)t->shape[0] * sizeof *out);
    if (!out) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of host memory", what);
    enum status ret = safetensors_read(t, DTYPE_I32, out, (size_t)t->shape[0] * sizeof *out);
    for (int64_t i = 0; ret == STATUS_OK && i < t->shape[0]; i++)
        if (out[i] < 0 || out[i] >= vocab || (i > 0 && out[i] <= out[i - 1]))
            ret = status_errorf(STATUS_INVALID_ARGUMENT, "%s: " EAGLE_HEAD_TOKEN_MAP " entry %lld (%d) is %s", what,
                                (long long)i, (int)out[i],
                                out[i] < 0 || out[i] >= vocab ? "outside the vocabulary" : "not above the one before it");
    if (ret != STATUS_OK) {
        free(out);
        return ret;
    }
    *ids = out, *n = (int)t->shape[0];
    return STATUS_OK;
}

enum status draft_token_map_read(const char *path, int vocab, int32_t **ids, int *n)
{
    char *text = NULL;
    size_t len = 0;
    enum status st = base_read_file(path, (size_t)vocab * 16 + 4096, "token map", &text, &len);
    if (st != STATUS_OK) return status_errorf(st, "--spec-token-map: %s", status_message());
    st = parse_token_map(path, text, vocab, ids, n);
    free(text);
    return st;
}
