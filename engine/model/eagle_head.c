/* engine/model/eagle_head.c - the shape of an EAGLE-1 head beside a target (eagle_head.h).
 * Tests: tests/server/test_speculative_eagle_targets.py, tests/test_train_eagle.py. */
#include "eagle_head.h"

#include <stdio.h>

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
    h->rope_factors = ends->rope_factors;
    snprintf(h->quantization, sizeof h->quantization, "none");
}
