/* engine/formats/weight_names.c - the one table of weight names (see weight_names.h): every
 * weight kind with its canonical shape, pipeline place, and its Hugging Face, Megatron-Core and
 * GGUF names.
 * Not here: slicing and fusing (checkpoint.c, checkpoint_write.c), the files (safetensors.c,
 * gguf.c).
 * Tests: tests/test_formats.c, the golden and reshard tests. */
#include "weight_names.h"

#include <stdio.h>

#define L "layers.%d."         /* Hugging Face Llama family, after "model." */
#define H "h.%d."              /* Hugging Face GPT-2, after "transformer." */
#define M "decoder.layers.%d." /* Megatron-Core local spec, stage-local layer */
#define G "blk.%d."            /* llama.cpp */

/* Rows in Megatron file order. HF Gemma 3 differs from Llama in the norms: Llama's
 * post_attention_layernorm is the pre-MLP norm; Gemma's is the norm of the attention output
 * (llama.cpp's post_attention_norm), its pre-MLP norm being pre_feedforward_layernorm
 * (llama.cpp's ffn_norm). Megatron-Core's local spec has no post-attention or post-MLP norm:
 * post_self_attn_layernorm and post_mlp_layernorm are shardlm's names. */
static const struct weight_names table[WEIGHT_KIND_COUNT] = {
#define ROW(kind, name, place, rows, cols) \
    WEIGHT_KIND_##kind, name, WEIGHT_PLACE_##place, WEIGHT_DIM_##rows, WEIGHT_DIM_##cols
    {ROW(TOK_EMBEDDING, "tok_embedding", FIRST, VOCAB, D_MODEL), "embed_tokens.weight", NULL,
     "wte.weight", WEIGHT_GPT2_AS_IS, "embedding.word_embeddings.weight", NULL,
     WEIGHT_MEGATRON_VOCAB, "token_embd.weight"},
    {ROW(POS_EMBEDDING, "pos_embedding", FIRST, POSITIONS, D_MODEL), NULL, NULL, "wpe.weight",
     WEIGHT_GPT2_AS_IS, "embedding.position_embeddings.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     "position_embd.weight"},
    {ROW(TYPE_EMBEDDING, "type_embedding", FIRST, TYPES, D_MODEL), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     "embedding.tokentype_embeddings.weight", NULL, WEIGHT_MEGATRON_REPLICATED, "token_types.weight"},
    {ROW(EMBED_NORM, "embed_norm", FIRST, D_MODEL, ONE), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     "embedding.layernorm.weight", NULL, WEIGHT_MEGATRON_REPLICATED, "token_embd_norm.weight"},
    {ROW(EMBED_NORM_BIAS, "embed_norm_bias", FIRST, D_MODEL, ONE), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     "embedding.layernorm.bias", NULL, WEIGHT_MEGATRON_REPLICATED, "token_embd_norm.bias"},

    {ROW(ATTN_NORM, "attn_norm", LAYER, D_MODEL, ONE), L "input_layernorm.weight", NULL,
     H "ln_1.weight", WEIGHT_GPT2_AS_IS, M "input_layernorm.weight",
     M "self_attention.linear_qkv.layer_norm_weight", WEIGHT_MEGATRON_REPLICATED,
     G "attn_norm.weight"},
    {ROW(ATTN_NORM_BIAS, "attn_norm_bias", LAYER, D_MODEL, ONE), NULL, NULL, H "ln_1.bias",
     WEIGHT_GPT2_AS_IS, M "input_layernorm.bias", M "self_attention.linear_qkv.layer_norm_bias",
     WEIGHT_MEGATRON_REPLICATED, G "attn_norm.bias"},
    {ROW(Q, "q", LAYER, Q, D_MODEL), L "self_attn.q_proj.weight", NULL, H "attn.c_attn.weight",
     WEIGHT_GPT2_QKV, M "self_attention.linear_qkv.weight", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_q.weight"},
    {ROW(Q_BIAS, "q_bias", LAYER, Q, ONE), L "self_attn.q_proj.bias", NULL, H "attn.c_attn.bias",
     WEIGHT_GPT2_QKV_BIAS, M "self_attention.linear_qkv.bias", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_q.bias"},
    {ROW(K, "k", LAYER, KV, D_MODEL), L "self_attn.k_proj.weight", NULL, H "attn.c_attn.weight",
     WEIGHT_GPT2_QKV, M "self_attention.linear_qkv.weight", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_k.weight"},
    {ROW(K_BIAS, "k_bias", LAYER, KV, ONE), L "self_attn.k_proj.bias", NULL, H "attn.c_attn.bias",
     WEIGHT_GPT2_QKV_BIAS, M "self_attention.linear_qkv.bias", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_k.bias"},
    {ROW(V, "v", LAYER, KV, D_MODEL), L "self_attn.v_proj.weight", NULL, H "attn.c_attn.weight",
     WEIGHT_GPT2_QKV, M "self_attention.linear_qkv.weight", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_v.weight"},
    {ROW(V_BIAS, "v_bias", LAYER, KV, ONE), L "self_attn.v_proj.bias", NULL, H "attn.c_attn.bias",
     WEIGHT_GPT2_QKV_BIAS, M "self_attention.linear_qkv.bias", NULL, WEIGHT_MEGATRON_QKV,
     G "attn_v.bias"},
    {ROW(Q_NORM, "q_norm", LAYER, HEAD_DIM, ONE), L "self_attn.q_norm.weight", NULL, NULL,
     WEIGHT_GPT2_AS_IS, M "self_attention.q_layernorm.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     G "attn_q_norm.weight"},
    {ROW(K_NORM, "k_norm", LAYER, HEAD_DIM, ONE), L "self_attn.k_norm.weight", NULL, NULL,
     WEIGHT_GPT2_AS_IS, M "self_attention.k_layernorm.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     G "attn_k_norm.weight"},
    {ROW(O, "o", LAYER, D_MODEL, Q), L "self_attn.o_proj.weight", NULL, H "attn.c_proj.weight",
     WEIGHT_GPT2_CONV1D, M "self_attention.linear_proj.weight", NULL, WEIGHT_MEGATRON_COLUMNS,
     G "attn_output.weight"},
    {ROW(O_BIAS, "o_bias", LAYER, D_MODEL, ONE), L "self_attn.o_proj.bias", NULL,
     H "attn.c_proj.bias", WEIGHT_GPT2_AS_IS, M "self_attention.linear_proj.bias", NULL,
     WEIGHT_MEGATRON_REPLICATED, G "attn_output.bias"},
    {ROW(POST_ATTN_NORM, "post_attn_norm", LAYER, D_MODEL, ONE), L "post_attention_layernorm.weight",
     NULL, NULL, WEIGHT_GPT2_AS_IS, M "post_self_attn_layernorm.weight", NULL,
     WEIGHT_MEGATRON_REPLICATED, G "post_attention_norm.weight"},
    {ROW(MLP_NORM, "mlp_norm", LAYER, D_MODEL, ONE), L "post_attention_layernorm.weight",
     L "pre_feedforward_layernorm.weight", H "ln_2.weight", WEIGHT_GPT2_AS_IS,
     M "pre_mlp_layernorm.weight", M "mlp.linear_fc1.layer_norm_weight", WEIGHT_MEGATRON_REPLICATED,
     G "ffn_norm.weight"},
    {ROW(MLP_NORM_BIAS, "mlp_norm_bias", LAYER, D_MODEL, ONE), NULL, NULL, H "ln_2.bias",
     WEIGHT_GPT2_AS_IS, M "pre_mlp_layernorm.bias", M "mlp.linear_fc1.layer_norm_bias",
     WEIGHT_MEGATRON_REPLICATED, G "ffn_norm.bias"},
    {ROW(GATE, "gate", LAYER, FFN, D_MODEL), L "mlp.gate_proj.weight", NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.linear_fc1.weight", NULL, WEIGHT_MEGATRON_FC1, G "ffn_gate.weight"},
    {ROW(GATE_BIAS, "gate_bias", LAYER, FFN, ONE), L "mlp.gate_proj.bias", NULL, NULL,
     WEIGHT_GPT2_AS_IS, M "mlp.linear_fc1.bias", NULL, WEIGHT_MEGATRON_FC1, G "ffn_gate.bias"},
    {ROW(UP, "up", LAYER, FFN, D_MODEL), L "mlp.up_proj.weight", NULL, H "mlp.c_fc.weight",
     WEIGHT_GPT2_CONV1D, M "mlp.linear_fc1.weight", NULL, WEIGHT_MEGATRON_FC1, G "ffn_up.weight"},
    {ROW(UP_BIAS, "up_bias", LAYER, FFN, ONE), L "mlp.up_proj.bias", NULL, H "mlp.c_fc.bias",
     WEIGHT_GPT2_AS_IS, M "mlp.linear_fc1.bias", NULL, WEIGHT_MEGATRON_FC1, G "ffn_up.bias"},
    {ROW(DOWN, "down", LAYER, D_MODEL, FFN), L "mlp.down_proj.weight", NULL, H "mlp.c_proj.weight",
     WEIGHT_GPT2_CONV1D, M "mlp.linear_fc2.weight", NULL, WEIGHT_MEGATRON_COLUMNS,
     G "ffn_down.weight"},
    {ROW(DOWN_BIAS, "down_bias", LAYER, D_MODEL, ONE), L "mlp.down_proj.bias", NULL,
     H "mlp.c_proj.bias", WEIGHT_GPT2_AS_IS, M "mlp.linear_fc2.bias", NULL,
     WEIGHT_MEGATRON_REPLICATED, G "ffn_down.bias"},
    {ROW(POST_MLP_NORM, "post_mlp_norm", LAYER, D_MODEL, ONE), L "post_feedforward_layernorm.weight",
     NULL, NULL, WEIGHT_GPT2_AS_IS, M "post_mlp_layernorm.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     G "post_ffw_norm.weight"},
    /* Experts: Hugging Face keeps one tensor per expert (checkpoint.c assembles them; Mixtral's
     * and Qwen's names differ there); the Megatron names are shardlm's own, unsplit. */
    {ROW(ROUTER, "router", LAYER, EXPERTS, D_MODEL), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.router.weight", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_gate_inp.weight"},
    {ROW(EXP_GATE, "exp_gate", LAYER, EXP_FFN, D_MODEL), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.gate.weight", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_gate_exps.weight"},
    {ROW(EXP_UP, "exp_up", LAYER, EXP_FFN, D_MODEL), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.up.weight", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_up_exps.weight"},
    {ROW(EXP_DOWN, "exp_down", LAYER, EXP_D, MOE_FFN), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.down.weight", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_down_exps.weight"},
    {ROW(SHARED_GATE, "shared_gate", LAYER, ONE, D_MODEL), L "mlp.shared_expert_gate.weight", NULL, NULL,
     WEIGHT_GPT2_AS_IS, M "mlp.shared_expert_gate.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     G "ffn_gate_inp_shexp.weight"},
    /* GPT-OSS: the sinks (HF: no ".weight"), the router's bias, the experts' biases (HF keeps
     * them, and the experts, as 3-D tensors: checkpoint.c). */
    {ROW(SINKS, "sinks", LAYER, HEADS, ONE), L "self_attn.sinks", NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "self_attention.sinks", NULL, WEIGHT_MEGATRON_REPLICATED, G "attn_sinks.weight"},
    {ROW(ROUTER_BIAS, "router_bias", LAYER, EXPERTS, ONE), L "mlp.router.bias", NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.router.bias", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_gate_inp.bias"},
    {ROW(EXP_GATE_BIAS, "exp_gate_bias", LAYER, EXP_FFN, ONE), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.gate.bias", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_gate_exps.bias"},
    {ROW(EXP_UP_BIAS, "exp_up_bias", LAYER, EXP_FFN, ONE), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.up.bias", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_up_exps.bias"},
    {ROW(EXP_DOWN_BIAS, "exp_down_bias", LAYER, EXP_D, ONE), NULL, NULL, NULL, WEIGHT_GPT2_AS_IS,
     M "mlp.experts.down.bias", NULL, WEIGHT_MEGATRON_REPLICATED, G "ffn_down_exps.bias"},
    /* MiniMax-M2: the router's selection bias (HF: a buffer, no ".weight"). */
    {ROW(ROUTER_SEL_BIAS, "router_sel_bias", LAYER, EXPERTS, ONE), L "block_sparse_moe.e_score_correction_bias", NULL,
     NULL, WEIGHT_GPT2_AS_IS, M "mlp.router.expert_bias", NULL, WEIGHT_MEGATRON_REPLICATED, G "exp_probs_b.bias"},

    {ROW(FINAL_NORM, "final_norm", LAST, D_MODEL, ONE), "norm.weight", NULL, "ln_f.weight",
     WEIGHT_GPT2_AS_IS, "decoder.final_layernorm.weight", NULL, WEIGHT_MEGATRON_REPLICATED,
     "output_norm.weight"},
    {ROW(FINAL_NORM_BIAS, "final_norm_bias", LAST, D_MODEL, ONE), NULL, NULL, "ln_f.bias",
     WEIGHT_GPT2_AS_IS, "decoder.final_layernorm.bias", NULL, WEIGHT_MEGATRON_REPLICATED,
     "output_norm.bias"},
    {ROW(LM_HEAD, "lm_head", LAST, VOCAB, D_MODEL), "lm_head.weight", NULL, NULL, WEIGHT_GPT2_AS_IS,
     "output_layer.weight", NULL, WEIGHT_MEGATRON_VOCAB, "output.weight"},
#undef ROW
};

/* kind -> its row (the table lists every kind once, in file order, not by enum value). */
static const struct weight_names *row_of(enum weight_kind kind)
{
    CHECK((unsigned)kind < WEIGHT_KIND_COUNT, "weight kind %d", (int)kind);
    for (int i = 0; i < WEIGHT_KIND_COUNT; i++)
        if (table[i].kind == kind) return &table[i];
    CHECK(0, "weight kind %d missing from the name table", (int)kind);
    return NULL;
}

const struct weight_names *weight_names_at(int i)
{
    CHECK(i >= 0 && i < WEIGHT_KIND_COUNT, "weight name row %d", i);
    return &table[i];
}

const struct weight_names *weight_names_of(enum weight_kind kind) { return row_of(kind); }

const char *weight_kind_name(enum weight_kind kind)
{
    return (unsigned)kind < WEIGHT_KIND_COUNT ? row_of(kind)->name : "?";
}

int weight_kind_per_layer(enum weight_kind kind)
{
    return (unsigned)kind < WEIGHT_KIND_COUNT && row_of(kind)->place == WEIGHT_PLACE_LAYER;
}

int weight_kind_is_norm(enum weight_kind k)
{
    return k == WEIGHT_KIND_ATTN_NORM || k == WEIGHT_KIND_MLP_NORM || k == WEIGHT_KIND_FINAL_NORM ||
           k == WEIGHT_KIND_Q_NORM || k == WEIGHT_KIND_K_NORM || k == WEIGHT_KIND_POST_ATTN_NORM ||
           k == WEIGHT_KIND_POST_MLP_NORM;
}

int weight_kind_per_expert(enum weight_kind k)
{
    return k == WEIGHT_KIND_EXP_GATE || k == WEIGHT_KIND_EXP_UP || k == WEIGHT_KIND_EXP_DOWN ||
           k == WEIGHT_KIND_EXP_GATE_BIAS || k == WEIGHT_KIND_EXP_UP_BIAS || k == WEIGHT_KIND_EXP_DOWN_BIAS;
}

int weight_kind_exists(const struct model_config *c, enum weight_kind kind)
{
    int ln = c->norm == NORM_KIND_LAYERNORM;
    switch (kind) {
    case WEIGHT_KIND_POS_EMBEDDING: return c->positions == POSITION_KIND_LEARNED;
    case WEIGHT_KIND_ATTN_NORM_BIAS:
    case WEIGHT_KIND_MLP_NORM_BIAS: return ln;
    case WEIGHT_KIND_FINAL_NORM_BIAS: return ln && !c->encoder;
    case WEIGHT_KIND_Q_BIAS:
    case WEIGHT_KIND_K_BIAS:
    case WEIGHT_KIND_V_BIAS: return c->qkv_bias;
    case WEIGHT_KIND_O_BIAS: return c->attn_out_bias;
    case WEIGHT_KIND_GATE: return c->gated_mlp && (!c->n_experts || c->shared_expert);
    case WEIGHT_KIND_UP:
    case WEIGHT_KIND_DOWN: return !c->n_experts || c->shared_expert;
    case WEIGHT_KIND_SHARED_GATE: return c->n_experts && c->shared_expert == SHARED_EXPERT_GATED;
    case WEIGHT_KIND_SINKS: return c->attn_sinks;
    case WEIGHT_KIND_ROUTER_SEL_BIAS: return c->n_experts > 0 && c->moe_sel_bias;
    case WEIGHT_KIND_ROUTER_BIAS:
    case WEIGHT_KIND_EXP_GATE_BIAS:
    case WEIGHT_KIND_EXP_UP_BIAS:
    case WEIGHT_KIND_EXP_DOWN_BIAS: return c->n_experts > 0 && c->moe_bias;
    case WEIGHT_KIND_ROUTER:
    case WEIGHT_KIND_EXP_GATE:
    case WEIGHT_KIND_EXP_UP:
    case WEIGHT_KIND_EXP_DOWN: return c->n_experts > 0;
    case WEIGHT_KIND_GATE_BIAS: return c->gated_mlp && c->mlp_bias;
    case WEIGHT_KIND_UP_BIAS:
    case WEIGHT_KIND_DOWN_BIAS: return c->mlp_bias;
    case WEIGHT_KIND_Q_NORM:
    case WEIGHT_KIND_K_NORM: return c->qk_norm;
    case WEIGHT_KIND_POST_ATTN_NORM:
    case WEIGHT_KIND_POST_MLP_NORM: return c->sandwich_norms;
    case WEIGHT_KIND_ATTN_NORM:
    case WEIGHT_KIND_MLP_NORM: return !c->no_pre_norms;
    case WEIGHT_KIND_TYPE_EMBEDDING: return c->type_vocab_size > 0;
    case WEIGHT_KIND_EMBED_NORM:
    case WEIGHT_KIND_EMBED_NORM_BIAS: return c->embed_norm;
    case WEIGHT_KIND_FINAL_NORM:
    case WEIGHT_KIND_LM_HEAD: return !c->encoder;
    case WEIGHT_KIND_COUNT: return 0;
    default: return (unsigned)kind < WEIGHT_KIND_COUNT;
    }
}

/* A dense layer among a mixture's experts (config.h moe_dense_first). */
static int dense_layer(const struct model_config *c, int layer)
{
    return c->n_experts > 0 && layer >= 0 && layer < c->moe_dense_first;
}

int weight_kind_exists_at(const struct model_config *c, enum weight_kind kind, int layer)
{
    if (!dense_layer(c, layer) || !weight_kind_per_layer(kind)) return weight_kind_exists(c, kind);
    switch (kind) {
    case WEIGHT_KIND_GATE: return c->gated_mlp;
    case WEIGHT_KIND_UP:
    case WEIGHT_KIND_DOWN: return 1;
    case WEIGHT_KIND_SHARED_GATE:
    case WEIGHT_KIND_ROUTER:
    case WEIGHT_KIND_ROUTER_BIAS:
    case WEIGHT_KIND_ROUTER_SEL_BIAS:
    case WEIGHT_KIND_EXP_GATE:
    case WEIGHT_KIND_EXP_UP:
    case WEIGHT_KIND_EXP_DOWN:
    case WEIGHT_KIND_EXP_GATE_BIAS:
    case WEIGHT_KIND_EXP_UP_BIAS:
    case WEIGHT_KIND_EXP_DOWN_BIAS: return 0;
    default: return weight_kind_exists(c, kind);
    }
}

static int64_t dim_size(const struct model_config *c, enum weight_dim d)
{
    switch (d) {
    case WEIGHT_DIM_ONE: return 1;
    case WEIGHT_DIM_D_MODEL: return c->d_model;
    case WEIGHT_DIM_HEAD_DIM: return c->head_dim;
    case WEIGHT_DIM_Q: return (int64_t)c->n_heads * c->head_dim;
    case WEIGHT_DIM_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case WEIGHT_DIM_FFN: return c->ffn_hidden;
    case WEIGHT_DIM_VOCAB: return c->vocab_size;
    case WEIGHT_DIM_POSITIONS: return c->max_positions;
    case WEIGHT_DIM_EXPERTS: return c->n_experts;
    case WEIGHT_DIM_EXP_FFN: return (int64_t)c->n_experts * c->moe_ffn;
    case WEIGHT_DIM_EXP_D: return (int64_t)c->n_experts * c->d_model;
    case WEIGHT_DIM_MOE_FFN: return c->moe_ffn;
    case WEIGHT_DIM_TYPES: return c->type_vocab_size;
    case WEIGHT_DIM_HEADS: return c->n_heads;
    }
    return 0;
}

void weight_kind_shape_at(const struct model_config *c, enum weight_kind kind, int layer, int *ndim, int64_t *rows,
                          int64_t *cols)
{
    weight_kind_shape(c, kind, ndim, rows, cols);
    if (!dense_layer(c, layer)) return;
    const struct weight_names *w = row_of(kind);
    if (w->rows == WEIGHT_DIM_FFN) *rows = c->dense_ffn; /* the dense layers' own MLP size */
    if (w->cols == WEIGHT_DIM_FFN) *cols = c->dense_ffn;
}

void weight_kind_shape(const struct model_config *c, enum weight_kind kind, int *ndim, int64_t *rows,
                       int64_t *cols)
{
    const struct weight_names *w = row_of(kind);
    *ndim = w->cols == WEIGHT_DIM_ONE ? 1 : 2;
    *rows = dim_size(c, w->rows);
    *cols = dim_size(c, w->cols);
    if (c->qk_norm == QK_NORM_FULL && (kind == WEIGHT_KIND_Q_NORM || kind == WEIGHT_KIND_K_NORM)) /* OLMo 2 */
        *rows = dim_size(c, kind == WEIGHT_KIND_Q_NORM ? WEIGHT_DIM_Q : WEIGHT_DIM_KV);
}

const char *weight_names_hf(enum weight_kind kind, int gemma3)
{
    const struct weight_names *w = row_of(kind);
    return gemma3 && w->hf_gemma3 ? w->hf_gemma3 : w->hf;
}

const char *weight_names_hf_llama(const struct model_config *c, enum weight_kind kind, int layer)
{
    const int glm = config_is_glm4_moe(c); /* GLM-4.5's names */
    if (c->shared_expert && config_layer_moe(c, layer)) { /* the dense MLP's kinds are the shared expert */
        if (kind == WEIGHT_KIND_GATE) return glm ? "layers.%d.mlp.shared_experts.gate_proj.weight"
                                                 : "layers.%d.mlp.shared_expert.gate_proj.weight";
        if (kind == WEIGHT_KIND_UP) return glm ? "layers.%d.mlp.shared_experts.up_proj.weight"
                                               : "layers.%d.mlp.shared_expert.up_proj.weight";
        if (kind == WEIGHT_KIND_DOWN) return glm ? "layers.%d.mlp.shared_experts.down_proj.weight"
                                                 : "layers.%d.mlp.shared_expert.down_proj.weight";
    }
    if (kind == WEIGHT_KIND_ROUTER_SEL_BIAS && !config_hf_mixtral_names(c)) return "layers.%d.mlp.gate.e_score_correction_bias";
    return weight_names_hf(kind, config_hf_gemma_names(c));
}

/* BertModel's names (transformers' modeling_bert): the embeddings with their LayerNorm, then per
 * layer the self-attention, its output projection and post-LayerNorm (attn_norm under
 * cfg.post_ln), the intermediate (up) and output (down) projections and the MLP's post-LayerNorm
 * (mlp_norm). BERT has no final norm and no LM head. */
const char *weight_names_hf_bert(enum weight_kind kind)
{
    static const struct {
        enum weight_kind kind;
        const char *name;
    } bert[] = {
        {WEIGHT_KIND_TOK_EMBEDDING, "embeddings.word_embeddings.weight"},
        {WEIGHT_KIND_POS_EMBEDDING, "embeddings.position_embeddings.weight"},
        {WEIGHT_KIND_TYPE_EMBEDDING, "embeddings.token_type_embeddings.weight"},
        {WEIGHT_KIND_EMBED_NORM, "embeddings.LayerNorm.weight"},
        {WEIGHT_KIND_EMBED_NORM_BIAS, "embeddings.LayerNorm.bias"},
        {WEIGHT_KIND_Q, "encoder.layer.%d.attention.self.query.weight"},
        {WEIGHT_KIND_Q_BIAS, "encoder.layer.%d.attention.self.query.bias"},
        {WEIGHT_KIND_K, "encoder.layer.%d.attention.self.key.weight"},
        {WEIGHT_KIND_K_BIAS, "encoder.layer.%d.attention.self.key.bias"},
        {WEIGHT_KIND_V, "encoder.layer.%d.attention.self.value.weight"},
        {WEIGHT_KIND_V_BIAS, "encoder.layer.%d.attention.self.value.bias"},
        {WEIGHT_KIND_O, "encoder.layer.%d.attention.output.dense.weight"},
        {WEIGHT_KIND_O_BIAS, "encoder.layer.%d.attention.output.dense.bias"},
        {WEIGHT_KIND_ATTN_NORM, "encoder.layer.%d.attention.output.LayerNorm.weight"},
        {WEIGHT_KIND_ATTN_NORM_BIAS, "encoder.layer.%d.attention.output.LayerNorm.bias"},
        {WEIGHT_KIND_UP, "encoder.layer.%d.intermediate.dense.weight"},
        {WEIGHT_KIND_UP_BIAS, "encoder.layer.%d.intermediate.dense.bias"},
        {WEIGHT_KIND_DOWN, "encoder.layer.%d.output.dense.weight"},
        {WEIGHT_KIND_DOWN_BIAS, "encoder.layer.%d.output.dense.bias"},
        {WEIGHT_KIND_MLP_NORM, "encoder.layer.%d.output.LayerNorm.weight"},
        {WEIGHT_KIND_MLP_NORM_BIAS, "encoder.layer.%d.output.LayerNorm.bias"},
    };
    for (size_t i = 0; i < sizeof bert / sizeof bert[0]; i++)
        if (bert[i].kind == kind) return bert[i].name;
    return NULL;
}

int weight_names_qkv_part(enum weight_kind kind)
{
    switch (kind) {
    case WEIGHT_KIND_Q:
    case WEIGHT_KIND_Q_BIAS: return 0;
    case WEIGHT_KIND_K:
    case WEIGHT_KIND_K_BIAS: return 1;
    case WEIGHT_KIND_V:
    case WEIGHT_KIND_V_BIAS: return 2;
    default: return -1;
    }
}

int weight_names_format(char *buf, size_t n, const char *prefix, const char *pattern, int layer)
{
    char local[256];
    CHECK(pattern, "no name pattern");
    /* Patterns are the table's string literals, with at most one %d: never user text. */
    int k = snprintf(local, sizeof local, pattern, layer);
    if (k < 0 || (size_t)k >= sizeof local) return -1;
    k = snprintf(buf, n, "%s%s", prefix ? prefix : "", local);
    return k < 0 || (size_t)k >= n ? -1 : 0;
}
