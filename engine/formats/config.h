/* engine/formats/config.h - the model configuration: one struct for the GPT family as Megatron-Core
 * models it (Llama/Mistral-style, GPT-2-style and Gemma 3 decoders), read from a checkpoint's
 * config.json (Hugging Face configs, or shardlm's own Megatron-style metadata).
 * Not here: weights (checkpoint.c / model.c), tokenizer (tokenizer.h).
 * Tests: tests/test_formats.c. */
#ifndef SHARDLM_CONFIG_H
#define SHARDLM_CONFIG_H

#include <string.h>

#include "base.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum norm_kind {
    NORM_KIND_RMSNORM,
    NORM_KIND_LAYERNORM,
};

enum position_kind {
    POSITION_KIND_ROTARY,  /* rotary embedding, rope_theta / rope_style / rot_dim */
    POSITION_KIND_LEARNED, /* learned absolute position table (GPT-2 wpe) */
};

enum model_family {
    MODEL_FAMILY_LLAMA, /* LlamaForCausalLM, MistralForCausalLM, llama2.c */
    MODEL_FAMILY_GPT2,  /* GPT2LMHeadModel */
    MODEL_FAMILY_GEMMA3, /* Gemma3ForCausalLM (text only) */
    MODEL_FAMILY_BERT,   /* BertModel: an encoder (embeddings only, no LM head) */
};

/* A scaled rotary embedding (Hugging Face's rope_scaling / rope_parameters), as transformers'
 * _compute_*_parameters define them; the model turns it into per-pair frequency divisors at
 * load (model_rope_factors). */
enum rope_scaling_kind {
    ROPE_SCALING_NONE,
    ROPE_SCALING_LINEAR,
    ROPE_SCALING_LLAMA3,
    ROPE_SCALING_YARN,
    ROPE_SCALING_FACTORS, /* the divisors themselves: a GGUF's rope_freqs tensor (llama.cpp writes Llama
                             3's scaling so); config.json carries them as shardlm's rope_type
                             "factors" with a "factors" list */
    ROPE_SCALING_LONGROPE, /* Phi-3's: factors = short_factor (the context capped at the original
                              length), long_factors kept to be written back */
    ROPE_SCALING_DYNAMIC,  /* dynamic NTK: transformers rescales the base only for a sequence longer
                              than max_position_embeddings, which is the context here, so within it
                              the rotation is the unscaled one, exactly; factor kept to be written
                              back */
};
#define ROPE_MAX_FACTORS 256 /* rot_dim / 2 at most, for ROPE_SCALING_FACTORS */
struct rope_scaling {
    enum rope_scaling_kind kind;
    float factors[ROPE_MAX_FACTORS]; /* FACTORS: rot_dim / 2 divisors */
    float long_factors[ROPE_MAX_FACTORS]; /* LONGROPE: long_factor, read, checked and written back,
                                             unused (the context is capped at original_max_positions) */
    float factor;                 /* every kind */
    float low_freq_factor;        /* llama3 (1) */
    float high_freq_factor;       /* llama3 (4) */
    int   original_max_positions; /* llama3, YaRN (YaRN default: max_position_embeddings) */
    float beta_fast, beta_slow;   /* YaRN (32, 1) */
    float attention_factor;       /* YaRN: cos and sin scale (0.1 ln(factor) + 1 when unset); 1 else */
    int   untruncated;            /* YaRN: transformers' truncate false (GPT-OSS): the ramp's ends
                                     kept as computed, not floored / ceiled; 0: truncated */
};

enum { QK_NORM_HEAD = 1, QK_NORM_FULL = 2 }; /* model_config.qk_norm */
enum { SHARED_EXPERT_GATED = 1, SHARED_EXPERT_PLAIN = 2 }; /* model_config.shared_expert */

struct model_config {
    enum model_family family;
    char     architecture[64];  /* as named in config.json, e.g. "LlamaForCausalLM" */
    int      n_layers;
    int      d_model;           /* hidden size */
    int      n_heads;
    int      n_kv_heads;        /* == n_heads without GQA; divides n_heads */
    int      head_dim;          /* usually d_model / n_heads */
    int      ffn_hidden;        /* MLP inner size (intermediate_size, n_inner or 4*d_model) */
    int      vocab_size;
    int      max_positions;     /* context length */
    enum norm_kind     norm;
    float    norm_eps;
    enum activation    activation;   /* SILU for SwiGLU; GELU_* for GPT-2 */
    int      gated_mlp;         /* 1: act(gate) * up (SwiGLU); 0: act(fc) (GPT-2) */
    enum position_kind positions;
    float    rope_theta;        /* rotary base (0 for learned positions) */
    enum rope_style    rope_style;    /* pairs (llama2.c / Megatron interleaved) or halves (HF) */
    int      rot_dim;           /* rotated features per head (== head_dim unless partial; 0 for
                                   learned positions) */
    int      sliding_window;    /* attention window in tokens (Mistral); 0 = full causal */
    int      tied_embeddings;   /* LM head shares the token embedding */
    int      qkv_bias;          /* biases on Q, K, V projections */
    int      attn_out_bias;     /* bias on the attention output projection */
    int      mlp_bias;          /* biases on MLP projections */
    int      bos_id, eos_id;    /* -1 when absent */
    enum dtype dtype;           /* stored dtype of the weights (torch_dtype; f32 when absent) */
    /* Gemma-style features (0 / defaults for every other family). */
    float    embed_scale;       /* token embeddings are multiplied by this; 0 or 1 = none
                                   (Gemma: sqrt(d_model)) */
    int      qk_norm;           /* RMSNorm of q and k before rotary: QK_NORM_HEAD over each head's
                                   features (Gemma 3, Qwen 3), QK_NORM_FULL over the whole
                                   projection, every head at once (OLMo 2); 0 = none */
    int      sandwich_norms;    /* extra norms on the attention and MLP outputs, before each
                                   residual add (Gemma 2/3 post_*_layernorm; OLMo 2's only norms) */
    int      no_pre_norms;      /* 1: no norm before attention and the MLP, only the post norms
                                   (OLMo 2); 0: every other model */
    float    norm_weight_offset;/* added to every norm weight (q/k norms included) at load: HF
                                   Gemma stores w for x * (1 + w), so 1; a GGUF-converted
                                   checkpoint has the 1 folded in, so 0 */
    float    attn_scale;        /* attention score scale; 0 = 1/sqrt(head_dim) (Gemma 3:
                                   1/sqrt(query_pre_attn_scalar)) */
    int      sliding_window_pattern; /* > 0: layer i is global when (i + 1) % pattern == 0 and
                                   uses sliding_window otherwise (Gemma 3: 6); 0: every layer
                                   uses sliding_window */
    float    rope_theta_local;  /* rotary base of the sliding-window layers; 0 = rope_theta
                                   (Gemma 3: 10000, global layers rope_theta = 1e6) */
    struct rope_scaling rope_scaling; /* of the layers that use rope_theta (kind NONE: none) */
    float    attn_softcap;      /* > 0: attention scores soft-capped, cap * tanh(s / cap) (Gemma 2's
                                   attn_logit_softcapping); 0 = none */
    float    final_softcap;     /* > 0: the logits soft-capped (final_logit_softcapping); 0 = none */
    /* Mixture of experts (Mixtral, Qwen 3 MoE): every layer's MLP is n_experts gated MLPs of
     * moe_ffn; each token goes to the n_experts_used (top-k) of softmax(router x), their outputs
     * weighted by those probabilities, renormalised over the k when norm_topk_prob. 0: dense. */
    int      n_experts;
    int      n_experts_used;
    int      moe_ffn;
    int      norm_topk_prob;
    int      shared_expert;     /* beside the experts, a gated MLP of ffn_hidden that every token
                                   takes: SHARED_EXPERT_GATED (Qwen 2 MoE,
                                   shared_expert_intermediate_size) scaled by sigmoid(
                                   shared_expert_gate x), SHARED_EXPERT_PLAIN (GLM-4.5, DeepSeek:
                                   n_shared_experts x moe_intermediate_size) added as it is */
    int      moe_bias;          /* GPT-OSS: biases on the router (before its top-k) and on each
                                   expert's gate, up and down projections */
    int      moe_sigmoid;       /* MiniMax-M2 (DeepSeek-V3's router): each expert's score is
                                   sigmoid(router x) instead of a softmax over the experts */
    int      moe_sel_bias;      /* the top k chosen by score + a per-expert bias (HF
                                   e_score_correction_bias; it selects, it does not weight) */
    /* DeepSeek-V3's group-limited routing (n_group, topk_group): the experts in moe_groups equal
     * groups, each scored by the sum of its two best selection scores; only the moe_group_topk best
     * groups' experts may be chosen (the others' scores taken as 0, as transformers masks them).
     * 0 or 1 group: off. */
    int      moe_groups, moe_group_topk;
    float    moe_routed_scale;  /* routed_scaling_factor: the chosen experts' weights (after the
                                   renormalisation) times this; 0 = 1 */
    int      moe_dense_first;   /* first_k_dense_replace (GLM-4.5, DeepSeek): layers [0, k) have a
                                   dense gated MLP of dense_ffn (GATE, UP, DOWN) instead of the
                                   experts; 0: every layer sparse */
    int      dense_ffn;
    int      attn_sinks;        /* GPT-OSS: one learned logit per query head in every softmax's
                                   denominator (ops.h attention_batch.sinks) */
    /* Encoders (BERT; 0 for every decoder family). */
    int      encoder;           /* 1: bidirectional attention and no LM head (no final norm): the
                                   model embeds and never generates */
    int      post_ln;           /* 1: each block's norm (attn_norm, mlp_norm) is applied to the
                                   sum after the residual add, x = norm(x + f(x)), instead of to
                                   the sublayer's input (the original Transformer, BERT) */
    int      type_vocab_size;   /* rows of the token type (segment) embedding; 0 = none */
    int      embed_norm;        /* 1: a LayerNorm (with bias) on the summed embeddings */
};

/* Whether layer `layer` of c runs the experts (a mixture's layers but its first moe_dense_first). */
static inline int config_layer_moe(const struct model_config *c, int layer)
{
    return c->n_experts > 0 && layer >= c->moe_dense_first;
}

/* Whether the Hugging Face layout of c names its norms as Gemma does: post_attention_layernorm
 * is the attention output's norm (not the pre-MLP norm as in Llama), pre_ / post_feedforward_
 * layernorm the MLP's (Gemma 2/3, OLMo 2). */
static inline int config_hf_gemma_names(const struct model_config *c)
{
    return c->family == MODEL_FAMILY_GEMMA3 || c->no_pre_norms;
}

/* Whether the Hugging Face layout of c names a mixture's experts as Mixtral does
 * (block_sparse_moe.gate, experts.E.w1 / w3 / w2: Mixtral, MiniMax-M2), not mlp.gate,
 * mlp.experts.E.gate_proj / up_proj / down_proj (Qwen 2 / 3 MoE, OLMoE). */
static inline int config_hf_mixtral_names(const struct model_config *c)
{
    return !strcmp(c->architecture, "MixtralForCausalLM") || !strcmp(c->architecture, "MiniMaxM2ForCausalLM");
}

/* Whether c is GLM-4.5's (Glm4MoeForCausalLM): its names (mlp.shared_experts.*, the
 * selection bias under mlp.gate, GGUF's post_attention_norm), its config.json keys, its GGUF
 * next-token-prediction blocks. */
static inline int config_is_glm4_moe(const struct model_config *c)
{
    return !strcmp(c->architecture, "Glm4MoeForCausalLM");
}

/* Whether the Hugging Face layout of c fuses q, k, v into self_attn.qkv_proj and gate, up into
 * mlp.gate_up_proj (Phi-3: checkpoint.c reads the parts, checkpoint_write.c writes them fused). */
static inline int config_hf_fused(const struct model_config *c)
{
    return c->family == MODEL_FAMILY_LLAMA && !strcmp(c->architecture, "Phi3ForCausalLM");
}

/* Parses config.json at `path` into *cfg. Unknown architecture, a missing required field or an
 * inconsistent value (head_dim * n_heads, n_heads % n_kv_heads, ...) returns
 * STATUS_BAD_FORMAT / STATUS_UNSUPPORTED with a message naming the file and field; nothing is
 * guessed silently. Fields with well-known defaults in the Hugging Face classes (e.g.
 * rope_theta 10000, rms_norm_eps 1e-6 for Llama) take those documented defaults.
 * A missing file is STATUS_NOT_FOUND. *cfg is written only on success.
 *
 * Accepted architectures ("architectures": [name] or shardlm's "architecture": name):
 * - LlamaForCausalLM, MistralForCausalLM: hidden_size, intermediate_size, num_hidden_layers,
 *   num_attention_heads, vocab_size required; num_key_value_heads (default
 *   num_attention_heads), head_dim (default hidden_size / num_attention_heads),
 *   max_position_embeddings (default 2048 Llama, 131072 Mistral), rms_norm_eps (1e-6),
 *   rope_theta (10000; also read from "rope_parameters"), hidden_act (silu), attention_bias,
 *   mlp_bias, tie_word_embeddings (false), sliding_window (Mistral only: default 4096, null
 *   = none). A non-null rope_scaling is STATUS_UNSUPPORTED.
 * - GptOssForCausalLM (model_type gpt_oss): Llama's fields with GptOssConfig's defaults
 *   (num_local_experts 32, num_experts_per_tok or experts_per_token 4, intermediate_size the
 *   experts' size, rope_theta 150000, rms_norm_eps 1e-5, attention_bias true, sliding_window
 *   128, layer_types alternating from sliding); always the router's top-k renormalised, the
 *   clamped SwiGLU (swiglu_limit must be 7), attention sinks and MoE biases. YaRN's truncate
 *   false is honoured (any family). quantization_config: quant_method "mxfp4" (the published
 *   checkpoints' experts as transformers' blocks and scales) is read, any other refused.
 * - GPT2LMHeadModel: n_embd, n_layer, n_head, vocab_size, n_positions (or n_ctx) required;
 *   n_inner (null: 4 * n_embd), layer_norm_epsilon (1e-5), activation_function (gelu_new).
 * - Gemma3ForCausalLM (model_type gemma3_text): hidden_size, intermediate_size,
 *   num_hidden_layers required; Gemma3TextConfig defaults for num_attention_heads (8),
 *   num_key_value_heads (4), head_dim (256), vocab_size (262208), max_position_embeddings
 *   (131072), rms_norm_eps (1e-6), rope_theta (1e6; global layers), rope_local_base_freq (1e4;
 *   rope_theta_local), sliding_window (4096), query_pre_attn_scalar (256; attn_scale =
 *   1/sqrt of it), hidden_activation (gelu_pytorch_tanh), tie_word_embeddings (true),
 *   attention_bias (false); transformers 5's per-layer-type "rope_parameters" also read. Which
 *   layers are windowed: "layer_types" when present (must be periodic: one full_attention
 *   every N layers; all sliding gives pattern 0), else sliding_window_pattern /
 *   _sliding_window_pattern (6). Always: embed_scale sqrt(hidden_size), qk_norm,
 *   sandwich_norms, halves rotary over the whole head, norm_weight_offset 1. Non-null
 *   rope_scaling, final_logit_softcapping, attn_logit_softcapping, or
 *   use_bidirectional_attention true: STATUS_UNSUPPORTED naming the field.
 *   Gemma3ForConditionalGeneration (model_type gemma3): its "text_config" object is parsed as
 *   above and the result is a Gemma3ForCausalLM config (token ids and dtype from text_config,
 *   else the top level).
 * - BertModel (model_type bert, config_bert.c): hidden_size, num_hidden_layers,
 *   num_attention_heads, intermediate_size, vocab_size required; max_position_embeddings (512),
 *   type_vocab_size (2), layer_norm_eps (1e-12), hidden_act (gelu);
 *   position_embedding_type other than "absolute" and is_decoder true: STATUS_UNSUPPORTED.
 *   Always: encoder, post_ln, embed_norm, LayerNorm, learned positions, biases everywhere.
 * All: bos_token_id / eos_token_id (int, or a list: its first element; absent: -1),
 * torch_dtype (or "dtype"): float32 / bfloat16 / float16.
 * shardlm extras, absent from Hugging Face files: "rope_style": "halves" (default) | "pairs",
 * "rot_dim" (default head_dim), "attention_out_bias" (default attention_bias); Gemma 3:
 * "norm_weight_offset" (default 1), "attn_scale" (default 1/sqrt(query_pre_attn_scalar); written
 * only when no integer scalar gives it exactly), "embed_scale" (default sqrt(hidden_size)).
 * Every other family has embed_scale, qk_norm, sandwich_norms, norm_weight_offset, attn_scale,
 * sliding_window_pattern and rope_theta_local all 0 (config_validate enforces it). */
enum status config_load(const char *path, struct model_config *cfg);

/* The same, from a NUL-terminated JSON text already in memory (name is used in messages). */
enum status config_parse(const char *json, const char *name, struct model_config *cfg);

/* Writes cfg as a Hugging Face-style config.json (architecture, sizes, and the shardlm extras
 * "rope_style" etc. that HF lacks) that config_load reads back to an identical struct
 * (config_equal). Writes path.tmp and renames it over path. */
enum status config_save(const char *path, const struct model_config *cfg);

/* Checks internal consistency; returns STATUS_BAD_FORMAT with a message naming the field. */
enum status config_validate(const struct model_config *cfg, const char *name);

/* 1 when every field of a and b is equal (floats bit for bit), else 0. */
int config_equal(const struct model_config *a, const struct model_config *b);

#ifdef __cplusplus
}
#endif

#endif
