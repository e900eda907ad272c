/* engine/formats/config.c - config.json parsing and validation (see config.h).
 * Not here: writing config.json (config_write.c), weights or their layouts (checkpoint.c).
 * Tests: tests/test_formats.c (Llama, Mistral, GPT-2 and Gemma 3 configs, errors, save/load
 * round trip). */
#include "config_impl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CONFIG_MAX_BYTES (16 << 20) /* a config.json is a few KB; anything huge is not one */

static const char *const supported_architectures =
    "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, Olmo2ForCausalLM, "
    "MixtralForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, OlmoeForCausalLM, GptOssForCausalLM, "
    "MiniMaxM2ForCausalLM, Glm4MoeForCausalLM, GPT2LMHeadModel, "
    "Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text only), BertModel (embeddings)";

/* bos_token_id / eos_token_id: an int, or a list whose first element is taken; absent -> -1. */
static enum status get_token_id(const cJSON *root, const char *name, const char *key, int *out)
{
    const cJSON *it = config_field(root, key);
    *out = -1;
    if (!it) return STATUS_OK;
    if (cJSON_IsArray(it)) {
        it = cJSON_GetArrayItem(it, 0);
        if (!it) return STATUS_OK;
    }
    return config_json_to_int(it, name, key, out);
}

static enum status get_dtype(const cJSON *root, const char *name, enum dtype *out)
{
    const char *key = "torch_dtype";
    const char *s;
    enum status st = config_get_string(root, name, key, &s);
    if (st) return st;
    if (!s) { /* newer transformers releases write "dtype" */
        key = "dtype";
        if ((st = config_get_string(root, name, key, &s))) return st;
    }
    if (!s || !strcmp(s, "float32")) *out = DTYPE_F32;
    else if (!strcmp(s, "bfloat16")) *out = DTYPE_BF16;
    else if (!strcmp(s, "float16")) *out = DTYPE_F16;
    else
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: field '%s' = \"%s\" is not supported (float32, bfloat16, float16)",
                             name, key, s);
    return STATUS_OK;
}

/* ---- architectures ---------------------------------------------------------------------- */

/* The Llama-shaped families: one parser, their differences in defaults. */
enum llama_flavor {
    LLAMA_PLAIN,   /* LlamaForCausalLM */
    LLAMA_MISTRAL, /* MistralForCausalLM: a sliding window by default */
    LLAMA_QWEN2,   /* Qwen2ForCausalLM: q, k, v biases (always; o has none) */
    LLAMA_QWEN3,   /* Qwen3ForCausalLM: RMSNorm of each head's q and k before rotary */
    LLAMA_PHI3,    /* Phi3ForCausalLM (Phi-3, 3.5, 4-mini): fused qkv_proj and gate_up_proj (checkpoint.c),
                      partial_rotary_factor, longrope, the config's sliding_window */
    LLAMA_OLMO2,   /* Olmo2ForCausalLM: norms after attention and the MLP only, q and k normed over the
                      whole projection */
    LLAMA_MIXTRAL, /* MixtralForCausalLM: 8 experts, top 2, renormalised */
    LLAMA_QWEN3_MOE, /* Qwen3MoeForCausalLM: Qwen 3's attention, experts of moe_intermediate_size */
    LLAMA_QWEN2_MOE, /* Qwen2MoeForCausalLM: Qwen 2's attention (q, k, v biases), experts and a shared
                        expert with its sigmoid gate */
    LLAMA_OLMOE,   /* OlmoeForCausalLM: experts; q and k normed over the whole projection */
    LLAMA_GPT_OSS, /* GptOssForCausalLM: experts with biases and a clamped SwiGLU, a biased router,
                      attention sinks, sliding and full layers alternating, YaRN */
    LLAMA_MINIMAX_M2, /* MiniMaxM2ForCausalLM: Mixtral's experts behind a sigmoid router whose top k
                         a per-expert bias selects; q and k normed over the whole projection;
                         rotary_dim of each head rotated */
    LLAMA_GLM4_MOE, /* Glm4MoeForCausalLM (GLM-4.5, 4.6): q, k, v biases, half of each head rotated,
                       the optional per-head QK norm; dense first layers, then experts behind
                       DeepSeek-V3's router with plain shared experts (config_glm.c) */
};

/* rot_dim / 2 positive numbers of list `what` of rs into out. */
static enum status get_factors(const cJSON *rs, const char *name, const char *key, const char *what,
                               const struct model_config *c, float *out)
{
    const cJSON *f = config_field(rs, what);
    const int n = cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
    if (n != c->rot_dim / 2 || n > ROPE_MAX_FACTORS)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s.%s must be a list of rot_dim / 2 = %d numbers", name, key,
                             what, c->rot_dim / 2);
    int i = 0;
    for (const cJSON *e = f->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0.0) || !isfinite(e->valuedouble))
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s.%s[%d] must be a positive number", name, key, what, i);
        out[i] = (float)e->valuedouble;
    }
    return STATUS_OK;
}

/* LongRoPE (Phi-3 "longrope" / "su"), as transformers' _compute_longrope_parameters: frequencies
 * divided by short_factor up to original_max_position_embeddings tokens and by long_factor past
 * them, cos and sin times sqrt(1 + ln(max / original) / ln(original)). transformers switches the
 * whole sequence to the long factors once it outgrows the original context, which a KV cache
 * cannot follow (the cached keys were rotated with the short ones): shardlm keeps the short
 * factors and caps the context at the original length, exact within it. */
static enum status parse_longrope(const cJSON *root, const cJSON *rs, const char *name, const char *key,
                                  struct model_config *c)
{
    struct rope_scaling *s = &c->rope_scaling;
    int orig = 0;
    enum status st = config_get_int(rs, name, "original_max_position_embeddings", 0, 0, &orig);
    if (st == STATUS_OK && orig == 0) st = config_get_int(root, name, "original_max_position_embeddings", 0, 0, &orig);
    float af = 0.0f;
    if (st || (st = get_factors(rs, name, key, "short_factor", c, s->factors)) ||
        (st = get_factors(rs, name, key, "long_factor", c, s->long_factors)) ||
        (st = config_get_float(rs, name, "attention_factor", 0.0f, &af)))
        return st;
    if (orig <= 0) orig = c->max_positions;
    const double factor = (double)c->max_positions / orig;
    s->kind = ROPE_SCALING_LONGROPE;
    s->original_max_positions = orig;
    s->attention_factor = af > 0.0f ? af : factor <= 1.0 ? 1.0f : (float)sqrt(1.0 + log(factor) / log((double)orig));
    if (c->max_positions > orig) {
        LOG_WARN("config", "%s: longrope: the context is capped at original_max_position_embeddings %d (of %d): "
                 "past it transformers rotates the whole sequence with long_factor, which a KV cache cannot follow",
                 name, orig, c->max_positions);
        c->max_positions = orig;
    }
    return STATUS_OK;
}

/* rope_scaling (or transformers >= 5's rope_parameters) of a model whose max_positions is read:
 * {"rope_type" (or "type"): "default" | "linear" | "llama3" | "yarn" | "dynamic" | "longrope" |
 * "su", "factor", ...}; other kinds are refused by name. */
enum status config_parse_rope_scaling(const cJSON *root, const cJSON *rs, const char *name, const char *key,
                                      struct model_config *c)
{
    struct rope_scaling *s = &c->rope_scaling;
    *s = (struct rope_scaling){.kind = ROPE_SCALING_NONE, .factor = 1.0f, .attention_factor = 1.0f};
    if (!rs) return STATUS_OK;
    if (!cJSON_IsObject(rs)) return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' must be an object", name, key);
    const char *type;
    enum status st = config_get_string(rs, name, "rope_type", &type);
    if (st == STATUS_OK && !type) st = config_get_string(rs, name, "type", &type);
    if (st) return st;
    if (!type || !strcmp(type, "default")) return STATUS_OK;
    if (!strcmp(type, "factors")) { /* shardlm's own: a GGUF's rope_freqs, or LongRoPE's short factors */
        if ((st = get_factors(rs, name, key, "factors", c, s->factors)) ||
            (st = config_get_float(rs, name, "attention_factor", 1.0f, &s->attention_factor)))
            return st;
        if (!(s->attention_factor > 0.0f))
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s.attention_factor must be positive", name, key);
        s->kind = ROPE_SCALING_FACTORS;
        return STATUS_OK;
    }
    if (!strcmp(type, "longrope") || !strcmp(type, "su")) return parse_longrope(root, rs, name, key, c);
    if (!strcmp(type, "linear")) s->kind = ROPE_SCALING_LINEAR;
    else if (!strcmp(type, "llama3")) s->kind = ROPE_SCALING_LLAMA3;
    else if (!strcmp(type, "yarn")) s->kind = ROPE_SCALING_YARN;
    else if (!strcmp(type, "dynamic")) s->kind = ROPE_SCALING_DYNAMIC;
    else
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: %s.rope_type \"%s\" is not supported (default, linear, llama3, yarn, dynamic and "
                             "longrope are)",
                             name, key, type);
    if ((st = config_get_float(rs, name, "factor", 0.0f, &s->factor))) return st;
    if (!(s->factor >= 1.0f))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s.factor = %g must be >= 1", name, key, (double)s->factor);
    if (s->kind == ROPE_SCALING_LLAMA3) {
        if ((st = config_get_float(rs, name, "low_freq_factor", 1.0f, &s->low_freq_factor)) ||
            (st = config_get_float(rs, name, "high_freq_factor", 4.0f, &s->high_freq_factor)) ||
            (st = config_get_int(rs, name, "original_max_position_embeddings", 1, 0, &s->original_max_positions)))
            return st;
        if (!(s->high_freq_factor > s->low_freq_factor && s->low_freq_factor > 0.0f) || s->original_max_positions <= 0)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: %s: llama3 needs high_freq_factor > low_freq_factor > 0 and "
                                 "original_max_position_embeddings > 0",
                                 name, key);
    }
    if (s->kind == ROPE_SCALING_YARN) {
        float af = 0.0f;
        if ((st = config_get_float(rs, name, "beta_fast", 32.0f, &s->beta_fast)) ||
            (st = config_get_float(rs, name, "beta_slow", 1.0f, &s->beta_slow)) ||
            (st = config_get_float(rs, name, "attention_factor", 0.0f, &af)) ||
            (st = config_get_int(rs, name, "original_max_position_embeddings", 0, c->max_positions,
                          &s->original_max_positions)))
            return st;
        int truncate = 1;
        if ((st = config_get_bool(rs, name, "truncate", 1, &truncate))) return st;
        s->untruncated = !truncate;
        /* transformers: an original_max_position_embeddings makes the factor max / original. */
        if (config_field(rs, "original_max_position_embeddings") && s->original_max_positions > 0)
            s->factor = (float)c->max_positions / (float)s->original_max_positions;
        if (config_field(rs, "mscale") || config_field(rs, "mscale_all_dim"))
            return status_errorf(STATUS_UNSUPPORTED, "%s: %s: YaRN's mscale / mscale_all_dim (DeepSeek) are not "
                                 "supported", name, key);
        s->attention_factor = af > 0.0f ? af : s->factor <= 1.0f ? 1.0f : (float)(0.1 * log((double)s->factor) + 1.0);
        if (s->original_max_positions <= 0 || !(s->beta_fast > s->beta_slow && s->beta_slow > 0.0f))
            return status_errorf(STATUS_BAD_FORMAT, "%s: %s: YaRN needs beta_fast > beta_slow > 0 and a positive "
                                 "original_max_position_embeddings", name, key);
    }
    return STATUS_OK;
}

/* The experts of Mixtral, Qwen 2 / 3 MoE and OLMoE (config.h): their count, top-k and size, Qwen
 * 2 MoE's shared expert (its size becomes ffn_hidden), with the classes' defaults; every layer
 * must be sparse. */
static enum status parse_moe(const cJSON *root, const char *name, enum llama_flavor flavor, struct model_config *c)
{
    enum status st;
    c->n_experts = c->n_experts_used = c->moe_ffn = c->norm_topk_prob = c->shared_expert = 0;
    c->moe_sigmoid = c->moe_sel_bias = 0;
    c->moe_groups = c->moe_group_topk = c->moe_dense_first = c->dense_ffn = 0;
    c->moe_routed_scale = 0.0f;
    if (flavor == LLAMA_GLM4_MOE) return config_parse_glm4_moe(root, name, c);
    if (flavor != LLAMA_MIXTRAL && flavor != LLAMA_QWEN3_MOE && flavor != LLAMA_QWEN2_MOE && flavor != LLAMA_OLMOE &&
        flavor != LLAMA_GPT_OSS && flavor != LLAMA_MINIMAX_M2) {
        if (config_field(root, "num_local_experts") || config_field(root, "num_experts"))
            return status_errorf(STATUS_BAD_FORMAT, "%s: experts in a dense architecture", name);
        return STATUS_OK;
    }
    const int minimax = flavor == LLAMA_MINIMAX_M2;
    const int mixtral = flavor == LLAMA_MIXTRAL || minimax, qwen2 = flavor == LLAMA_QWEN2_MOE, oss = flavor == LLAMA_GPT_OSS;
    const int qwen = flavor == LLAMA_QWEN3_MOE || qwen2;
    int per_tok = mixtral ? 2 : qwen2 ? 4 : oss ? 4 : 8;
    if (oss && (st = config_get_int(root, name, "experts_per_token", 0, per_tok, &per_tok))) return st;
    if ((st = config_get_int(root, name, mixtral || oss ? "num_local_experts" : "num_experts", 0,
                             mixtral ? 8 : qwen2 ? 60 : qwen ? 128 : oss ? 32 : 64, &c->n_experts)) ||
        (st = config_get_int(root, name, "num_experts_per_tok", 0, per_tok, &c->n_experts_used)) ||
        (st = config_get_int(root, name, qwen ? "moe_intermediate_size" : "intermediate_size", 0,
                             qwen2 ? 1408 : qwen ? 768 : 0, &c->moe_ffn)) ||
        (st = config_get_bool(root, name, "norm_topk_prob", mixtral, &c->norm_topk_prob)))
        return st;
    if (mixtral || oss) c->norm_topk_prob = 1; /* Mixtral, MiniMax-M2 and GPT-OSS always renormalise their top k */
    if (minimax && (st = config_parse_minimax_router(root, name, c))) return st;
    if (c->n_experts < 1 || c->n_experts > 1024 || c->n_experts_used < 1 || c->n_experts_used > c->n_experts ||
        c->moe_ffn < 1 || c->moe_ffn > CONFIG_MAX_DIM)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %d experts, %d per token, of %d features: need 1 <= per token <= "
                             "experts <= 1024 and a positive size", name, c->n_experts, c->n_experts_used, c->moe_ffn);
    if (qwen2) { /* the shared expert: the dense MLP's weights, of its own size */
        if ((st = config_get_int(root, name, "shared_expert_intermediate_size", 0, 5632, &c->ffn_hidden))) return st;
        if (c->ffn_hidden < 1 || c->ffn_hidden > CONFIG_MAX_DIM)
            return status_errorf(STATUS_BAD_FORMAT, "%s: shared_expert_intermediate_size %d", name, c->ffn_hidden);
        c->shared_expert = SHARED_EXPERT_GATED;
    }
    if (qwen) {
        int step = 1;
        if ((st = config_get_int(root, name, "decoder_sparse_step", 0, 1, &step))) return st;
        const cJSON *dense = config_field(root, "mlp_only_layers");
        if (step != 1 || (dense && (!cJSON_IsArray(dense) || cJSON_GetArraySize(dense) > 0)))
            return status_errorf(STATUS_UNSUPPORTED, "%s: dense layers among the experts (decoder_sparse_step %d, "
                                 "mlp_only_layers) are not supported", name, step);
    }
    return STATUS_OK;
}

/* GPT-OSS beyond its experts (config.h): the clamped SwiGLU, the sinks and biases, which layers
 * are windowed (layer_types, else GptOssConfig's alternation from a sliding layer 0). */
static enum status parse_gpt_oss(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    float limit = 7.0f;
    if ((st = config_get_float(root, name, "swiglu_limit", 7.0f, &limit))) return st;
    if (limit != 7.0f) /* transformers and llama.cpp hard-code 7 */
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'swiglu_limit' = %g: only 7 is supported", name,
                             (double)limit);
    const cJSON *q = config_field(root, "quantization_config");
    if (q) { /* the published checkpoints: MXFP4 experts (checkpoint_mxfp4.c), the rest as stored */
        const cJSON *m = cJSON_IsObject(q) ? config_field(q, "quant_method") : NULL;
        if (!cJSON_IsString(m) || strcmp(m->valuestring, "mxfp4"))
            return status_errorf(STATUS_UNSUPPORTED, "%s: field 'quantization_config': quant_method %s%s%s is not "
                                 "supported (mxfp4 is)", name, cJSON_IsString(m) ? "\"" : "",
                                 cJSON_IsString(m) ? m->valuestring : "(missing)", cJSON_IsString(m) ? "\"" : "");
    }
    c->activation = ACTIVATION_SWIGLU_OAI; /* hidden_act says silu; the experts clamp */
    c->attn_sinks = c->moe_bias = 1;
    c->sliding_window = 128;
    const cJSON *sw = config_field(root, "sliding_window");
    if (sw && (st = config_json_to_int(sw, name, "sliding_window", &c->sliding_window))) return st;
    const cJSON *types = config_field(root, "layer_types");
    c->sliding_window_pattern = 2;
    if (types && (st = config_layer_pattern(types, name, c->n_layers, &c->sliding_window_pattern))) return st;
    if (c->sliding_window <= 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'sliding_window' = %d must be positive", name,
                             c->sliding_window);
    return STATUS_OK;
}

static enum status parse_llama(const cJSON *root, const char *name, enum llama_flavor flavor,
                               struct model_config *c)
{
    const int mistral = flavor == LLAMA_MISTRAL || flavor == LLAMA_MIXTRAL;
    const int qwen = flavor == LLAMA_QWEN2 || flavor == LLAMA_QWEN3 || flavor == LLAMA_QWEN3_MOE ||
                     flavor == LLAMA_QWEN2_MOE;
    const int oss = flavor == LLAMA_GPT_OSS, glm = flavor == LLAMA_GLM4_MOE;
    enum status st;
    if ((st = config_get_int(root, name, "hidden_size", 1, 0, &c->d_model)) ||
        (st = config_get_int(root, name, "intermediate_size", 1, 0, &c->ffn_hidden)) ||
        (st = config_get_int(root, name, "num_hidden_layers", 1, 0, &c->n_layers)) ||
        (st = config_get_int(root, name, "num_attention_heads", 1, 0, &c->n_heads)) ||
        (st = config_get_int(root, name, "vocab_size", 1, 0, &c->vocab_size)) ||
        (st = config_get_int(root, name, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads)) ||
        (st = config_get_int(root, name, "max_position_embeddings", 0, mistral || oss ? 4096 * 32 : 2048,
                      &c->max_positions)) ||
        (st = config_get_float(root, name, "rms_norm_eps", flavor == LLAMA_OLMO2 || oss || glm ? 1e-5f : 1e-6f, &c->norm_eps)) ||
        (st = config_get_float(root, name, "rope_theta", oss ? 150000.0f : 10000.0f, &c->rope_theta)) ||
        (st = config_get_bool(root, name, "tie_word_embeddings", 0, &c->tied_embeddings)) ||
        (st = config_get_bool(root, name, "attention_bias", flavor == LLAMA_QWEN2 || flavor == LLAMA_QWEN2_MOE || oss,
                              &c->qkv_bias)) ||
        (st = config_get_bool(root, name, "attention_out_bias",
                              flavor == LLAMA_QWEN2 || flavor == LLAMA_QWEN2_MOE || glm ? 0 : c->qkv_bias, &c->attn_out_bias)) ||
        (st = config_get_bool(root, name, "mlp_bias", 0, &c->mlp_bias)))
        return st;
    if (c->n_heads <= 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'num_attention_heads' = %d must be > 0",
                             name, c->n_heads);
    if ((st = config_get_int(root, name, "head_dim", 0, c->d_model / c->n_heads, &c->head_dim)) ||
        (st = config_get_int(root, name, "rot_dim", 0, c->head_dim, &c->rot_dim)))
        return st;
    float partial = 1.0f; /* Phi-4-mini: 0.75 of each head rotated (the first features, rotate-half among them) */
    if ((st = config_get_float(root, name, "partial_rotary_factor", glm ? 0.5f : 1.0f, &partial))) return st;
    if (partial != 1.0f && !config_field(root, "rot_dim")) { /* shardlm's exact rot_dim wins */
        const double r = (double)c->head_dim * partial;
        if (!(partial > 0.0f && partial < 1.0f) || r != floor(r) || (int)r % 2)
            return status_errorf(STATUS_BAD_FORMAT, "%s: partial_rotary_factor %g of head_dim %d is not an even number "
                                 "of features", name, (double)partial, c->head_dim);
        c->rot_dim = (int)r;
    }

    /* transformers >= 5 moves rope settings into "rope_parameters". */
    const cJSON *rp = config_field(root, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp))
            return status_errorf(STATUS_BAD_FORMAT, "%s: field 'rope_parameters' must be an object",
                                 name);
        if ((st = config_get_float(rp, name, "rope_theta", c->rope_theta, &c->rope_theta))) return st;
    }
    if ((st = config_parse_rope_scaling(root, rp ? rp : config_field(root, "rope_scaling"), name, rp ? "rope_parameters" : "rope_scaling",
                                 c)))
        return st;

    const char *act;
    if ((st = config_get_string(root, name, "hidden_act", &act))) return st;
    c->activation = ACTIVATION_SILU;
    if (act && (st = config_get_activation(name, "hidden_act", act, &c->activation))) return st;

    c->sliding_window = 0;
    c->qk_norm = flavor == LLAMA_QWEN3 || flavor == LLAMA_QWEN3_MOE ? QK_NORM_HEAD
               : flavor == LLAMA_OLMO2 || flavor == LLAMA_OLMOE ? QK_NORM_FULL : 0;
    if (glm) { /* Glm4MoeAttention: use_qk_norm, an RMSNorm of each head's q and k */
        int use = 0;
        if ((st = config_get_bool(root, name, "use_qk_norm", 0, &use))) return st;
        if (use) c->qk_norm = QK_NORM_HEAD;
    }
    if ((st = parse_moe(root, name, flavor, c))) return st;
    if (oss && (st = parse_gpt_oss(root, name, c))) return st;
    if (flavor == LLAMA_MINIMAX_M2 && (st = config_parse_minimax_attention(root, name, c))) return st;
    c->sandwich_norms = c->no_pre_norms = flavor == LLAMA_OLMO2;
    if (qwen) { /* Qwen's window covers only the layers from max_window_layers on: not modelled */
        int use = 0;
        if ((st = config_get_bool(root, name, "use_sliding_window", 0, &use))) return st;
        if (use)
            return status_errorf(STATUS_UNSUPPORTED, "%s: field 'use_sliding_window' is true; Qwen's sliding "
                                 "window (layers from max_window_layers on) is not supported", name);
    }
    if (flavor == LLAMA_PHI3) { /* Phi3Config: sliding_window None by default; every layer when set */
        const cJSON *sw = config_field(root, "sliding_window");
        if (sw && (st = config_json_to_int(sw, name, "sliding_window", &c->sliding_window))) return st;
    }
    if (mistral) {
        const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        if (!sw) c->sliding_window = flavor == LLAMA_MIXTRAL ? 0 : 4096; /* MistralConfig's default; Mixtral's none */
        else if (!cJSON_IsNull(sw) && (st = config_json_to_int(sw, name, "sliding_window", &c->sliding_window)))
            return st;
    }

    const char *style;
    if ((st = config_get_string(root, name, "rope_style", &style))) return st;
    if (!style || !strcmp(style, "halves")) c->rope_style = ROPE_STYLE_HALVES;
    else if (!strcmp(style, "pairs")) c->rope_style = ROPE_STYLE_PAIRS;
    else
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: field 'rope_style' = \"%s\" must be \"halves\" or \"pairs\"", name,
                             style);

    c->family = MODEL_FAMILY_LLAMA;
    c->norm = NORM_KIND_RMSNORM;
    c->gated_mlp = 1;
    c->positions = POSITION_KIND_ROTARY;
    return STATUS_OK;
}

static enum status parse_gpt2(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    int flag = 0;
    if ((st = config_get_int(root, name, "n_embd", 1, 0, &c->d_model)) ||
        (st = config_get_int(root, name, "n_layer", 1, 0, &c->n_layers)) ||
        (st = config_get_int(root, name, "n_head", 1, 0, &c->n_heads)) ||
        (st = config_get_int(root, name, "vocab_size", 1, 0, &c->vocab_size)) ||
        (st = config_get_float(root, name, "layer_norm_epsilon", 1e-5f, &c->norm_eps)))
        return st;
    if (config_field(root, "n_positions")) {
        if ((st = config_get_int(root, name, "n_positions", 1, 0, &c->max_positions))) return st;
    } else if (config_field(root, "n_ctx")) {
        if ((st = config_get_int(root, name, "n_ctx", 1, 0, &c->max_positions))) return st;
    } else {
        return status_errorf(STATUS_BAD_FORMAT, "%s: missing field 'n_positions' (or 'n_ctx')",
                             name);
    }
    if (c->n_heads <= 0 || c->d_model <= 0 || c->d_model % c->n_heads)
        return status_errorf(STATUS_BAD_FORMAT, "%s: n_embd %d is not a positive multiple of n_head %d",
                             name, c->d_model, c->n_heads);
    /* 4 * n_embd overflows int for n_embd past INT_MAX / 4, which config_validate refuses later
     * (d_model in 1..2^24): the default only needs to be an int until then. */
    const int inner = c->d_model <= INT_MAX / 4 ? 4 * c->d_model : INT_MAX;
    if ((st = config_get_int(root, name, "n_inner", 0, inner, &c->ffn_hidden))) return st;

    const char *act;
    if ((st = config_get_string(root, name, "activation_function", &act))) return st;
    c->activation = ACTIVATION_GELU_TANH; /* GPT2Config's default, "gelu_new" */
    if (act) {
        if (!strcmp(act, "silu") || !strcmp(act, "swish"))
            return status_errorf(STATUS_UNSUPPORTED,
                                 "%s: field 'activation_function' = \"%s\" is not supported for "
                                 "GPT-2 (gelu_new, gelu_pytorch_tanh, gelu)",
                                 name, act);
        if ((st = config_get_activation(name, "activation_function", act, &c->activation))) return st;
    }
    /* Variants that change the math of attention. */
    if ((st = config_get_bool(root, name, "scale_attn_by_inverse_layer_idx", 0, &flag))) return st;
    if (flag)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: field 'scale_attn_by_inverse_layer_idx' = true is not supported",
                             name);
    if ((st = config_get_bool(root, name, "scale_attn_weights", 1, &flag))) return st;
    if (!flag)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: field 'scale_attn_weights' = false is not supported", name);

    c->family = MODEL_FAMILY_GPT2;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->d_model / c->n_heads;
    c->norm = NORM_KIND_LAYERNORM;
    c->gated_mlp = 0;
    c->positions = POSITION_KIND_LEARNED;
    c->rope_theta = 0.0f;
    c->rope_style = ROPE_STYLE_HALVES;
    c->rot_dim = 0;
    c->sliding_window = 0;
    c->tied_embeddings = 1;
    c->qkv_bias = c->attn_out_bias = c->mlp_bias = 1;
    return STATUS_OK;
}

enum status config_parse(const char *json, const char *name, struct model_config *cfg)
{
    enum status st = STATUS_OK;
    struct model_config c;
    memset(&c, 0, sizeof c);
    const cJSON *text = NULL; /* Gemma3ForConditionalGeneration's text_config */
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        st = status_errorf(STATUS_BAD_FORMAT, "%s: not valid JSON (near byte %ld)", name,
                           at && at >= json ? (long)(at - json) : -1L);
        goto out;
    }
    if (!cJSON_IsObject(root)) {
        st = status_errorf(STATUS_BAD_FORMAT, "%s: not a JSON object", name);
        goto out;
    }

    /* The architecture: HF's "architectures": [...], shardlm's "architecture", or model_type. */
    const char *arch = NULL;
    const cJSON *archs = config_field(root, "architectures");
    if (archs) {
        const cJSON *a0 = cJSON_GetArrayItem(archs, 0);
        if (!cJSON_IsArray(archs) || !cJSON_IsString(a0)) {
            st = status_errorf(STATUS_BAD_FORMAT,
                               "%s: field 'architectures' must be a non-empty list of strings", name);
            goto out;
        }
        arch = a0->valuestring;
    } else {
        if ((st = config_get_string(root, name, "architecture", &arch))) goto out;
    }
    if (!arch) {
        const char *mt;
        if ((st = config_get_string(root, name, "model_type", &mt))) goto out;
        if (!mt) {
            st = status_errorf(STATUS_BAD_FORMAT, "%s: missing field 'architectures'", name);
            goto out;
        }
        if (!strcmp(mt, "llama")) arch = "LlamaForCausalLM";
        else if (!strcmp(mt, "mistral")) arch = "MistralForCausalLM";
        else if (!strcmp(mt, "qwen2")) arch = "Qwen2ForCausalLM";
        else if (!strcmp(mt, "qwen3")) arch = "Qwen3ForCausalLM";
        else if (!strcmp(mt, "phi3")) arch = "Phi3ForCausalLM";
        else if (!strcmp(mt, "olmo2")) arch = "Olmo2ForCausalLM";
        else if (!strcmp(mt, "mixtral")) arch = "MixtralForCausalLM";
        else if (!strcmp(mt, "qwen3_moe")) arch = "Qwen3MoeForCausalLM";
        else if (!strcmp(mt, "qwen2_moe")) arch = "Qwen2MoeForCausalLM";
        else if (!strcmp(mt, "olmoe")) arch = "OlmoeForCausalLM";
        else if (!strcmp(mt, "gpt_oss")) arch = "GptOssForCausalLM";
        else if (!strcmp(mt, "minimax_m2")) arch = "MiniMaxM2ForCausalLM";
        else if (!strcmp(mt, "glm4_moe")) arch = "Glm4MoeForCausalLM";
        else if (!strcmp(mt, "gpt2")) arch = "GPT2LMHeadModel";
        else if (!strcmp(mt, "gemma2")) arch = "Gemma2ForCausalLM";
        else if (!strcmp(mt, "gemma3_text")) arch = "Gemma3ForCausalLM";
        else if (!strcmp(mt, "gemma3")) arch = "Gemma3ForConditionalGeneration";
        else if (!strcmp(mt, "bert")) arch = "BertModel";
        else {
            st = status_errorf(STATUS_UNSUPPORTED,
                               "%s: model_type \"%s\" is not supported (supported: %s)", name, mt,
                               supported_architectures);
            goto out;
        }
    }

    if (!strcmp(arch, "LlamaForCausalLM")) st = parse_llama(root, name, LLAMA_PLAIN, &c);
    else if (!strcmp(arch, "MistralForCausalLM")) st = parse_llama(root, name, LLAMA_MISTRAL, &c);
    else if (!strcmp(arch, "Qwen2ForCausalLM")) st = parse_llama(root, name, LLAMA_QWEN2, &c);
    else if (!strcmp(arch, "Qwen3ForCausalLM")) st = parse_llama(root, name, LLAMA_QWEN3, &c);
    else if (!strcmp(arch, "Phi3ForCausalLM")) st = parse_llama(root, name, LLAMA_PHI3, &c);
    else if (!strcmp(arch, "Olmo2ForCausalLM")) st = parse_llama(root, name, LLAMA_OLMO2, &c);
    else if (!strcmp(arch, "MixtralForCausalLM")) st = parse_llama(root, name, LLAMA_MIXTRAL, &c);
    else if (!strcmp(arch, "Qwen3MoeForCausalLM")) st = parse_llama(root, name, LLAMA_QWEN3_MOE, &c);
    else if (!strcmp(arch, "Qwen2MoeForCausalLM")) st = parse_llama(root, name, LLAMA_QWEN2_MOE, &c);
    else if (!strcmp(arch, "OlmoeForCausalLM")) st = parse_llama(root, name, LLAMA_OLMOE, &c);
    else if (!strcmp(arch, "GptOssForCausalLM")) st = parse_llama(root, name, LLAMA_GPT_OSS, &c);
    else if (!strcmp(arch, "MiniMaxM2ForCausalLM")) st = parse_llama(root, name, LLAMA_MINIMAX_M2, &c);
    else if (!strcmp(arch, "Glm4MoeForCausalLM")) st = parse_llama(root, name, LLAMA_GLM4_MOE, &c);
    else if (!strcmp(arch, "GPT2LMHeadModel")) st = parse_gpt2(root, name, &c);
    else if (!strcmp(arch, "Gemma2ForCausalLM")) st = config_parse_gemma(root, name, 2, &c);
    else if (!strcmp(arch, "Gemma3ForCausalLM")) st = config_parse_gemma(root, name, 3, &c);
    else if (!strcmp(arch, "BertModel")) st = config_parse_bert(root, name, &c);
    else if (!strcmp(arch, "Gemma3ForConditionalGeneration")) {
        /* The text half only: its "text_config" is a Gemma3ForCausalLM config, and the result
         * is one (the vision tower's weights are never read). */
        text = config_field(root, "text_config");
        if (!text || !cJSON_IsObject(text)) {
            st = status_errorf(STATUS_UNSUPPORTED,
                               "%s: Gemma3ForConditionalGeneration without an object 'text_config' "
                               "is not supported",
                               name);
            goto out;
        }
        st = config_parse_gemma(text, name, 3, &c);
        arch = "Gemma3ForCausalLM";
    } else
        st = status_errorf(STATUS_UNSUPPORTED,
                           "%s: architecture \"%s\" is not supported (supported: %s)", name, arch,
                           supported_architectures);
    if (st) goto out;
    snprintf(c.architecture, sizeof c.architecture, "%s", arch);

    /* Token ids and dtype: a nested text_config's own when it has them, else the top level's. */
    const cJSON *ids = text && config_field(text, "bos_token_id") ? text : root;
    if ((st = get_token_id(ids, name, "bos_token_id", &c.bos_id))) goto out;
    ids = text && config_field(text, "eos_token_id") ? text : root;
    if ((st = get_token_id(ids, name, "eos_token_id", &c.eos_id))) goto out;
    ids = text && (config_field(text, "torch_dtype") || config_field(text, "dtype")) ? text : root;
    if ((st = get_dtype(ids, name, &c.dtype))) goto out;
    if ((st = config_validate(&c, name))) goto out;
    *cfg = c;
out:
    cJSON_Delete(root);
    return st;
}

enum status config_load(const char *path, struct model_config *cfg)
{
    char *text = NULL;
    enum status st = base_read_file(path, CONFIG_MAX_BYTES, "config.json", &text, NULL);
    if (st == STATUS_OK) st = config_parse(text, path, cfg);
    free(text);
    return st;
}

/* ---- validation ------------------------------------------------------------------------- */

static enum status positive(const char *name, const char *what, int v)
{
    if (v <= 0 || v > CONFIG_MAX_DIM)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %d must be in 1..%d", name, what, v,
                             CONFIG_MAX_DIM);
    return STATUS_OK;
}

enum status config_validate(const struct model_config *c, const char *name)
{
    enum status st;
    if ((st = positive(name, "n_layers", c->n_layers)) ||
        (st = positive(name, "d_model", c->d_model)) ||
        (st = positive(name, "n_heads", c->n_heads)) ||
        (st = positive(name, "n_kv_heads", c->n_kv_heads)) ||
        (st = positive(name, "head_dim", c->head_dim)) ||
        (st = positive(name, "ffn_hidden", c->ffn_hidden)) ||
        (st = positive(name, "vocab_size", c->vocab_size)) ||
        (st = positive(name, "max_positions", c->max_positions)))
        return st;
    if (c->n_heads % c->n_kv_heads)
        return status_errorf(STATUS_BAD_FORMAT, "%s: n_heads %d is not a multiple of n_kv_heads %d",
                             name, c->n_heads, c->n_kv_heads);
    if (!(c->norm_eps > 0.0f) || !isfinite(c->norm_eps))
        return status_errorf(STATUS_BAD_FORMAT, "%s: norm epsilon %g must be positive", name,
                             (double)c->norm_eps);
    if (c->bos_id < -1 || c->bos_id >= c->vocab_size || c->eos_id < -1 || c->eos_id >= c->vocab_size)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: bos_token_id %d / eos_token_id %d outside the vocabulary (%d)",
                             name, c->bos_id, c->eos_id, c->vocab_size);
    if (c->sliding_window < 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: sliding_window %d must be >= 0", name,
                             c->sliding_window);
    if (c->dtype != DTYPE_F32 && c->dtype != DTYPE_BF16 && c->dtype != DTYPE_F16)
        return status_errorf(STATUS_BAD_FORMAT, "%s: weight dtype %s is not a float type", name,
                             dtype_name(c->dtype));
    if (c->positions == POSITION_KIND_ROTARY) {
        if (!(c->rope_theta > 0.0f) || !isfinite(c->rope_theta))
            return status_errorf(STATUS_BAD_FORMAT, "%s: rope_theta %g must be positive", name,
                                 (double)c->rope_theta);
        if (c->rot_dim <= 0 || c->rot_dim > c->head_dim || c->rot_dim % 2)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: rot_dim %d must be even and in 2..head_dim (%d)", name,
                                 c->rot_dim, c->head_dim);
        if (c->rot_dim / 2 > ROPE_MAX_FACTORS)
            return status_errorf(STATUS_UNSUPPORTED, "%s: rot_dim %d: at most %d rotated features a head are supported",
                                 name, c->rot_dim, 2 * ROPE_MAX_FACTORS);
    }
    if (!isfinite(c->embed_scale) || c->embed_scale < 0.0f || !isfinite(c->attn_scale) ||
        c->attn_scale < 0.0f || !isfinite(c->norm_weight_offset) || !isfinite(c->rope_theta_local) ||
        c->rope_theta_local < 0.0f || c->sliding_window_pattern < 0)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: embed_scale %g, attn_scale %g, rope_theta_local %g must be finite "
                             "and >= 0, norm_weight_offset %g finite, sliding_window_pattern %d >= 0",
                             name, (double)c->embed_scale, (double)c->attn_scale,
                             (double)c->rope_theta_local, (double)c->norm_weight_offset,
                             c->sliding_window_pattern);
    const int gemma2 = !strcmp(c->architecture, "Gemma2ForCausalLM");
    if (!isfinite(c->attn_softcap) || c->attn_softcap < 0.0f || !isfinite(c->final_softcap) || c->final_softcap < 0.0f)
        return status_errorf(STATUS_BAD_FORMAT, "%s: attn_softcap %g and final_softcap %g must be finite and >= 0",
                             name, (double)c->attn_softcap, (double)c->final_softcap);
    if (!gemma2 && (c->attn_softcap != 0.0f || c->final_softcap != 0.0f))
        return status_errorf(STATUS_BAD_FORMAT, "%s: logit soft-capping belongs to Gemma 2, not to %s", name,
                             c->architecture);
    if (c->n_experts &&
        (c->family != MODEL_FAMILY_LLAMA || !c->gated_mlp || c->mlp_bias || c->n_experts_used < 1 ||
         c->n_experts_used > c->n_experts || c->moe_ffn < 1 || c->n_experts > 1024))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %d experts of %d features, %d per token: experts belong to "
                             "gated Llama-family MLPs without biases, 1 <= per token <= experts <= 1024", name,
                             c->n_experts, c->moe_ffn, c->n_experts_used);
    if (!c->n_experts && (c->n_experts_used || c->moe_ffn || c->norm_topk_prob || c->shared_expert))
        return status_errorf(STATUS_BAD_FORMAT, "%s: expert settings without experts", name);
    const int minimax = !strcmp(c->architecture, "MiniMaxM2ForCausalLM");
    const int glm = config_is_glm4_moe(c);
    if (c->moe_sigmoid != (minimax || glm) || (c->moe_sel_bias && !c->moe_sigmoid) || (minimax && !c->norm_topk_prob))
        return status_errorf(STATUS_BAD_FORMAT, "%s: a sigmoid router (with its selection bias) belongs to MiniMax-M2, "
                             "renormalised, and GLM-4.5, not to %s", name, c->architecture);
    if (!glm && (c->moe_groups || c->moe_group_topk || (c->moe_routed_scale != 0.0f && c->moe_routed_scale != 1.0f) ||
                 c->moe_dense_first || c->dense_ffn || c->shared_expert == SHARED_EXPERT_PLAIN))
        return status_errorf(STATUS_BAD_FORMAT, "%s: group-limited routing, routed_scaling_factor, dense layers among "
                             "the experts and plain shared experts belong to GLM-4.5, not to %s", name, c->architecture);
    if (glm && (c->moe_dense_first < 0 || c->moe_dense_first >= c->n_layers || (c->moe_dense_first && (c->dense_ffn < 1 ||
                c->dense_ffn > CONFIG_MAX_DIM)) || c->moe_groups < 0 || c->moe_group_topk < 0 ||
                (c->moe_groups > 1 && (c->n_experts % c->moe_groups || c->n_experts / c->moe_groups < 2 ||
                 c->moe_group_topk < 1 || c->moe_group_topk > c->moe_groups ||
                 c->moe_group_topk * (c->n_experts / c->moe_groups) < c->n_experts_used)) ||
                !(c->moe_routed_scale > 0.0f) || c->moe_routed_scale > 1e6f || c->shared_expert == SHARED_EXPERT_GATED))
        return status_errorf(STATUS_BAD_FORMAT, "%s: GLM-4.5's dense layers (%d of %d features), groups (%d, top %d) "
                             "or routed_scaling_factor %g are out of range", name, c->moe_dense_first, c->dense_ffn,
                             c->moe_groups, c->moe_group_topk, (double)c->moe_routed_scale);
    if (c->type_vocab_size < 0 || c->type_vocab_size > 1024)
        return status_errorf(STATUS_BAD_FORMAT, "%s: type_vocab_size %d must be in 0..1024", name, c->type_vocab_size);
    if (c->family != MODEL_FAMILY_BERT && (c->encoder || c->post_ln || c->type_vocab_size || c->embed_norm))
        return status_errorf(STATUS_BAD_FORMAT, "%s: encoder, post_ln, type_vocab_size and embed_norm are BERT "
                             "features and must be 0 in a %s model", name, c->architecture);
    /* What each family implies; a loader relies on these. */
    const int olmo2 = !strcmp(c->architecture, "Olmo2ForCausalLM");
    const int full_qk_norm = olmo2 || !strcmp(c->architecture, "OlmoeForCausalLM") || minimax;
    const int head_qk_norm = (c->family == MODEL_FAMILY_GEMMA3 && !gemma2) || !strcmp(c->architecture, "Qwen3ForCausalLM") ||
                             !strcmp(c->architecture, "Qwen3MoeForCausalLM");
    if (c->qk_norm != (head_qk_norm ? QK_NORM_HEAD : full_qk_norm ? QK_NORM_FULL : 0) && !(glm && c->qk_norm == QK_NORM_HEAD))
        return status_errorf(STATUS_BAD_FORMAT, "%s: qk_norm %d: per head belongs to Gemma 3 and Qwen 3, over the whole "
                             "projection to OLMo 2, OLMoE and MiniMax-M2, none to %s", name, c->qk_norm, c->architecture);
    if (c->no_pre_norms != olmo2 || (olmo2 && !c->sandwich_norms))
        return status_errorf(STATUS_BAD_FORMAT, "%s: no_pre_norms %d: OLMo 2 (and only it) has post norms only", name,
                             c->no_pre_norms);
    const int gpt_oss = !strcmp(c->architecture, "GptOssForCausalLM");
    if (c->attn_sinks != gpt_oss || c->moe_bias != gpt_oss || (c->activation == ACTIVATION_SWIGLU_OAI) != gpt_oss ||
        (gpt_oss && (!c->n_experts || !c->norm_topk_prob || c->shared_expert || !c->sliding_window)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: attention sinks, MoE biases and the clamped SwiGLU belong to "
                             "GPT-OSS (and all of them, with renormalised experts and a window, to it), not to %s",
                             name, c->architecture);
    if (c->family != MODEL_FAMILY_GEMMA3 &&
        (c->embed_scale != 0.0f || (c->sandwich_norms && !olmo2) || c->norm_weight_offset != 0.0f ||
         c->attn_scale != 0.0f || (c->sliding_window_pattern && !gpt_oss) || c->rope_theta_local != 0.0f))
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: embed_scale, sandwich_norms, norm_weight_offset, "
                             "attn_scale, sliding_window_pattern and rope_theta_local are Gemma 3 "
                             "features and must be 0 in a %s model",
                             name, c->family == MODEL_FAMILY_GPT2 ? "GPT-2" : "Llama-family");
    switch (c->family) {
    case MODEL_FAMILY_LLAMA:
        if (c->norm != NORM_KIND_RMSNORM || c->positions != POSITION_KIND_ROTARY || !c->gated_mlp)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: a Llama-family model has RMSNorm, rotary positions and a "
                                 "gated MLP",
                                 name);
        break;
    case MODEL_FAMILY_GPT2:
        if (c->norm != NORM_KIND_LAYERNORM || c->positions != POSITION_KIND_LEARNED ||
            c->gated_mlp || !c->tied_embeddings || !c->qkv_bias || !c->attn_out_bias ||
            !c->mlp_bias || c->n_kv_heads != c->n_heads ||
            (int64_t)c->n_heads * c->head_dim != c->d_model || c->sliding_window ||
            c->activation == ACTIVATION_SILU || c->rot_dim || c->rope_theta != 0.0f)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: a GPT-2 model has LayerNorm, learned positions, tied "
                                 "embeddings, biases everywhere, n_heads * head_dim == d_model and "
                                 "a GELU MLP",
                                 name);
        break;
    case MODEL_FAMILY_BERT:
        if (!c->encoder || !c->post_ln || !c->embed_norm || c->norm != NORM_KIND_LAYERNORM ||
            c->positions != POSITION_KIND_LEARNED || c->gated_mlp || !c->qkv_bias || !c->attn_out_bias ||
            !c->mlp_bias || c->n_kv_heads != c->n_heads || c->sliding_window || c->tied_embeddings || c->rot_dim)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: a BERT model is an encoder with post-LayerNorm blocks, an embedding "
                                 "LayerNorm, learned positions, biases everywhere and a plain MLP",
                                 name);
        break;
    case MODEL_FAMILY_GEMMA3:
        if (c->norm != NORM_KIND_RMSNORM || c->positions != POSITION_KIND_ROTARY || !c->gated_mlp ||
            c->mlp_bias || c->qkv_bias != c->attn_out_bias || c->qk_norm == gemma2 || !c->sandwich_norms ||
            !(c->embed_scale > 0.0f) || !(c->attn_scale > 0.0f) ||
            c->rope_style != ROPE_STYLE_HALVES || c->rot_dim != c->head_dim ||
            !(c->rope_theta_local > 0.0f))
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: a Gemma 2 / 3 model has RMSNorm, full rotary in halves with a "
                                 "local base, a gated MLP without biases, QK-norm (Gemma 3 only), sandwich "
                                 "norms, and positive embed_scale and attn_scale",
                                 name);
        break;
    default:
        return status_errorf(STATUS_BAD_FORMAT, "%s: unknown model family %d", name, (int)c->family);
    }
    return STATUS_OK;
}

/* Two rope scalings are the same when both are none, or their kind and parameters agree. */
static int rope_scaling_equal(const struct rope_scaling *a, const struct rope_scaling *b)
{
    if (a->kind != b->kind) return 0;
    if (a->kind == ROPE_SCALING_NONE) return 1;
    if (a->kind == ROPE_SCALING_FACTORS)
        return !memcmp(a->factors, b->factors, sizeof a->factors) && a->attention_factor == b->attention_factor;
    if (a->kind == ROPE_SCALING_LONGROPE)
        return !memcmp(a->factors, b->factors, sizeof a->factors) &&
               !memcmp(a->long_factors, b->long_factors, sizeof a->long_factors) &&
               a->attention_factor == b->attention_factor && a->original_max_positions == b->original_max_positions;
    return a->factor == b->factor && a->low_freq_factor == b->low_freq_factor &&
           a->high_freq_factor == b->high_freq_factor && a->original_max_positions == b->original_max_positions &&
           a->beta_fast == b->beta_fast && a->beta_slow == b->beta_slow && a->attention_factor == b->attention_factor &&
           a->untruncated == b->untruncated;
}

int config_equal(const struct model_config *a, const struct model_config *b)
{
    return rope_scaling_equal(&a->rope_scaling, &b->rope_scaling) && a->family == b->family && !strcmp(a->architecture, b->architecture) &&
           a->n_layers == b->n_layers && a->d_model == b->d_model && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
           a->ffn_hidden == b->ffn_hidden && a->vocab_size == b->vocab_size &&
           a->max_positions == b->max_positions && a->norm == b->norm &&
           !memcmp(&a->norm_eps, &b->norm_eps, sizeof(float)) && a->activation == b->activation &&
           a->gated_mlp == b->gated_mlp && a->positions == b->positions &&
           !memcmp(&a->rope_theta, &b->rope_theta, sizeof(float)) &&
           a->rope_style == b->rope_style && a->rot_dim == b->rot_dim &&
           a->sliding_window == b->sliding_window && a->tied_embeddings == b->tied_embeddings &&
           a->qkv_bias == b->qkv_bias && a->attn_out_bias == b->attn_out_bias &&
           a->mlp_bias == b->mlp_bias && a->bos_id == b->bos_id && a->eos_id == b->eos_id &&
           a->dtype == b->dtype && !memcmp(&a->embed_scale, &b->embed_scale, sizeof(float)) &&
           a->qk_norm == b->qk_norm && a->sandwich_norms == b->sandwich_norms &&
           !memcmp(&a->norm_weight_offset, &b->norm_weight_offset, sizeof(float)) &&
           !memcmp(&a->attn_softcap, &b->attn_softcap, sizeof(float)) &&
           a->n_experts == b->n_experts && a->n_experts_used == b->n_experts_used && a->moe_ffn == b->moe_ffn &&
           a->norm_topk_prob == b->norm_topk_prob && a->shared_expert == b->shared_expert &&
           a->moe_bias == b->moe_bias && a->attn_sinks == b->attn_sinks && a->moe_sigmoid == b->moe_sigmoid &&
           a->moe_sel_bias == b->moe_sel_bias && a->moe_groups == b->moe_groups &&
           a->moe_group_topk == b->moe_group_topk && !memcmp(&a->moe_routed_scale, &b->moe_routed_scale, sizeof(float)) &&
           a->moe_dense_first == b->moe_dense_first && a->dense_ffn == b->dense_ffn &&
           !memcmp(&a->final_softcap, &b->final_softcap, sizeof(float)) &&
           !memcmp(&a->attn_scale, &b->attn_scale, sizeof(float)) &&
           a->sliding_window_pattern == b->sliding_window_pattern &&
           !memcmp(&a->rope_theta_local, &b->rope_theta_local, sizeof(float)) && a->encoder == b->encoder &&
           a->post_ln == b->post_ln && a->type_vocab_size == b->type_vocab_size && a->embed_norm == b->embed_norm;
}
