/* engine/formats/config_write.c - config.json writing (config_save, see config.h): the Hugging
 * Face fields of each architecture plus shardlm's extras, written atomically.
 * Not here: parsing and validation (config.c), weights (checkpoint_write.c).
 * Tests: tests/test_formats.c (save/load round trip of every family). */
#include "config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *activation_hf_name(enum activation a)
{
    switch (a) {
    case ACTIVATION_SILU: return "silu";
    case ACTIVATION_GELU_TANH: return "gelu_pytorch_tanh";
    case ACTIVATION_GELU_ERF: return "gelu";
    case ACTIVATION_SWIGLU_OAI: return "silu"; /* GPT-OSS's config says silu; its architecture sets the clamp */
    }
    return "?";
}

static const char *dtype_torch_name(enum dtype t)
{
    switch (t) {
    case DTYPE_BF16: return "bfloat16";
    case DTYPE_F16: return "float16";
    default: return "float32";
    }
}

static int add_num(cJSON *o, const char *key, double v) { return cJSON_AddNumberToObject(o, key, v) != NULL; }

/* A float field as the shortest decimal that reads back to the same float ("1e-05", not
 * "9.99999974737875e-06"), so that config.json stays readable and round-trips exactly. */
static int add_float(cJSON *o, const char *key, float v)
{
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if ((float)strtod(buf, NULL) == v) break;
    }
    return add_num(o, key, strtod(buf, NULL));
}
static int add_bool(cJSON *o, const char *key, int v) { return cJSON_AddBoolToObject(o, key, v) != NULL; }
static int add_str(cJSON *o, const char *key, const char *v) { return cJSON_AddStringToObject(o, key, v) != NULL; }

/* rope_scaling as transformers reads it back (config.c parse_rope_scaling), when there is one. */
static int add_rope_scaling(cJSON *root, const struct model_config *c)
{
    const struct rope_scaling *s = &c->rope_scaling;
    if (s->kind == ROPE_SCALING_NONE) return 1;
    cJSON *o = cJSON_AddObjectToObject(root, "rope_scaling");
    if (!o) return 0;
    static const char *const names[] = {"default", "linear", "llama3", "yarn", "factors", "longrope", "dynamic"};
    if (s->kind == ROPE_SCALING_LONGROPE) { /* as transformers reads it: max_position_embeddings is the capped one */
        cJSON *sf = cJSON_AddArrayToObject(o, "short_factor"), *lf = cJSON_AddArrayToObject(o, "long_factor");
        int ok = sf && lf && add_str(o, "rope_type", names[s->kind]) &&
                 add_float(o, "attention_factor", s->attention_factor) &&
                 add_num(o, "original_max_position_embeddings", s->original_max_positions);
        for (int i = 0; ok && i < c->rot_dim / 2; i++)
            ok = cJSON_AddItemToArray(sf, cJSON_CreateNumber(s->factors[i])) &&
                 cJSON_AddItemToArray(lf, cJSON_CreateNumber(s->long_factors[i]));
        return ok;
    }
    if (s->kind == ROPE_SCALING_FACTORS) {
        cJSON *f = cJSON_AddArrayToObject(o, "factors");
        int ok = f && add_str(o, "rope_type", names[s->kind]);
        for (int i = 0; ok && i < c->rot_dim / 2; i++) ok = cJSON_AddItemToArray(f, cJSON_CreateNumber(s->factors[i]));
        return ok && add_float(o, "attention_factor", s->attention_factor);
    }
    int ok = add_str(o, "rope_type", names[s->kind]) && add_float(o, "factor", s->factor);
    if (s->kind == ROPE_SCALING_LLAMA3)
        ok = ok && add_float(o, "low_freq_factor", s->low_freq_factor) &&
             add_float(o, "high_freq_factor", s->high_freq_factor) &&
             add_num(o, "original_max_position_embeddings", s->original_max_positions);
    if (s->kind == ROPE_SCALING_YARN) { /* an original (when not the default) makes the factor max / original */
        ok = ok && add_float(o, "beta_fast", s->beta_fast) && add_float(o, "beta_slow", s->beta_slow) &&
             add_float(o, "attention_factor", s->attention_factor);
        if (s->original_max_positions != c->max_positions)
            ok = ok && add_num(o, "original_max_position_embeddings", s->original_max_positions);
        if (s->untruncated) ok = ok && add_bool(o, "truncate", 0);
    }
    return ok;
}

/* The config.json fields that Llama-family models and Gemma 3 spell alike. */
static int add_llama_dims(cJSON *root, const struct model_config *c)
{
    return add_rope_scaling(root, c) && add_num(root, "hidden_size", c->d_model) &&
           add_num(root, "intermediate_size", config_is_glm4_moe(c) && c->dense_ffn ? c->dense_ffn : c->ffn_hidden) &&
           add_num(root, "num_hidden_layers", c->n_layers) && add_num(root, "num_attention_heads", c->n_heads) &&
           add_num(root, "num_key_value_heads", c->n_kv_heads) && add_num(root, "head_dim", c->head_dim) &&
           add_num(root, "vocab_size", c->vocab_size) &&
           add_num(root, "max_position_embeddings", c->max_positions) &&
           add_float(root, "rms_norm_eps", c->norm_eps) && add_float(root, "rope_theta", c->rope_theta);
}

/* LlamaForCausalLM / MistralForCausalLM fields. Returns 0 when out of memory. */
static int add_llama(cJSON *root, const struct model_config *c)
{
    const int minimax = !strcmp(c->architecture, "MiniMaxM2ForCausalLM"), glm = config_is_glm4_moe(c);
    const int mixtral = !strcmp(c->architecture, "MixtralForCausalLM"), oss = !strcmp(c->architecture, "GptOssForCausalLM");
    int mistral = !strcmp(c->architecture, "MistralForCausalLM") || mixtral;
    const char *type = minimax ? "minimax_m2"
                     : glm ? "glm4_moe"
                     : mixtral ? "mixtral"
                     : oss ? "gpt_oss"
                     : mistral ? "mistral"
                     : !strcmp(c->architecture, "Qwen3MoeForCausalLM") ? "qwen3_moe"
                     : !strcmp(c->architecture, "Qwen2MoeForCausalLM") ? "qwen2_moe"
                     : !strcmp(c->architecture, "OlmoeForCausalLM") ? "olmoe"
                     : !strcmp(c->architecture, "Qwen2ForCausalLM") ? "qwen2"
                     : !strcmp(c->architecture, "Qwen3ForCausalLM") ? "qwen3"
                     : !strcmp(c->architecture, "Phi3ForCausalLM")  ? "phi3"
                     : !strcmp(c->architecture, "Olmo2ForCausalLM") ? "olmo2"
                                                                    : "llama";
    int ok = add_str(root, "model_type", type) && add_llama_dims(root, c) &&
             add_str(root, "hidden_act", activation_hf_name(c->activation)) &&
             add_bool(root, "attention_bias", c->qkv_bias) &&
             add_bool(root, "mlp_bias", c->mlp_bias) &&
             add_bool(root, "tie_word_embeddings", c->tied_embeddings) &&
             add_str(root, "rope_style", c->rope_style == ROPE_STYLE_PAIRS ? "pairs" : "halves");
    if (ok && !strcmp(type, "phi3") && c->rot_dim != c->head_dim) /* for transformers; rot_dim below for shardlm */
        ok = add_float(root, "partial_rotary_factor", (float)c->rot_dim / (float)c->head_dim);
    if (ok && (mistral || !strcmp(type, "phi3")))
        ok = c->sliding_window ? add_num(root, "sliding_window", c->sliding_window)
                               : cJSON_AddNullToObject(root, "sliding_window") != NULL;
    if (ok && c->rot_dim != c->head_dim) ok = add_num(root, "rot_dim", c->rot_dim);
    if (ok && (c->attn_out_bias != c->qkv_bias || !strncmp(type, "qwen2", 5)))
        ok = add_bool(root, "attention_out_bias", c->attn_out_bias);
    if (ok && glm) /* GLM-4.5's own keys: DeepSeek-V3's router, the shared and dense layers, half-rotary */
        return add_num(root, "n_routed_experts", c->n_experts) && add_num(root, "num_experts_per_tok", c->n_experts_used) &&
               add_num(root, "moe_intermediate_size", c->moe_ffn) && add_bool(root, "norm_topk_prob", c->norm_topk_prob) &&
               add_num(root, "n_shared_experts", c->shared_expert ? c->ffn_hidden / c->moe_ffn : 0) &&
               add_num(root, "first_k_dense_replace", c->moe_dense_first) &&
               add_float(root, "routed_scaling_factor", c->moe_routed_scale > 0.0f ? c->moe_routed_scale : 1.0f) &&
               add_num(root, "n_group", c->moe_groups > 1 ? c->moe_groups : 1) &&
               add_num(root, "topk_group", c->moe_groups > 1 ? c->moe_group_topk : 1) &&
               add_bool(root, "use_qk_norm", c->qk_norm == QK_NORM_HEAD) &&
               add_float(root, "partial_rotary_factor", (float)c->rot_dim / (float)c->head_dim);
    if (ok && c->n_experts) /* intermediate_size is the experts' size for Mixtral, OLMoE and GPT-OSS */
        ok = add_num(root, mixtral || oss || minimax ? "num_local_experts" : "num_experts", c->n_experts) &&
             add_num(root, "num_experts_per_tok", c->n_experts_used) &&
             add_bool(root, "norm_topk_prob", c->norm_topk_prob) &&
             (!strncmp(type, "qwen", 4) ? add_num(root, "moe_intermediate_size", c->moe_ffn) : 1) &&
             (c->shared_expert ? add_num(root, "shared_expert_intermediate_size", c->ffn_hidden) : 1);
    if (ok && minimax) /* MiniMax-M2's own keys: its router, the whole-projection QK norm, rotary_dim */
        ok = add_str(root, "scoring_func", "sigmoid") && add_bool(root, "use_routing_bias", c->moe_sel_bias) &&
             add_bool(root, "use_qk_norm", 1) && add_str(root, "qk_norm_type", "per_layer") &&
             add_num(root, "rotary_dim", c->rot_dim);
    if (ok && oss) { /* the window's layers as GptOssConfig lists them */
        cJSON *types = cJSON_AddArrayToObject(root, "layer_types");
        ok = types && add_num(root, "sliding_window", c->sliding_window) && add_float(root, "swiglu_limit", 7.0f);
        for (int i = 0; ok && i < c->n_layers; i++) {
            const int full = c->sliding_window_pattern > 0 && (i + 1) % c->sliding_window_pattern == 0;
            ok = cJSON_AddItemToArray(types, cJSON_CreateString(full ? "full_attention" : "sliding_attention"));
        }
    }
    return ok;
}

/* Gemma3ForCausalLM (text) fields, with the shardlm extras that Hugging Face files lack. */
static int add_gemma3(cJSON *root, const struct model_config *c)
{
    const int g2 = !strcmp(c->architecture, "Gemma2ForCausalLM");
    int ok = add_str(root, "model_type", g2 ? "gemma2" : "gemma3_text") && add_llama_dims(root, c) &&
             add_float(root, "rope_local_base_freq", c->rope_theta_local) &&
             add_num(root, "sliding_window", c->sliding_window) &&
             add_num(root, "sliding_window_pattern", c->sliding_window_pattern) &&
             add_str(root, "hidden_activation", activation_hf_name(c->activation)) &&
             add_bool(root, "attention_bias", c->qkv_bias) &&
             add_bool(root, "tie_word_embeddings", c->tied_embeddings) &&
             cJSON_AddNullToObject(root, "rope_scaling") &&
             (c->final_softcap > 0.0f ? add_float(root, "final_logit_softcapping", c->final_softcap)
                                      : cJSON_AddNullToObject(root, "final_logit_softcapping") != NULL) &&
             (c->attn_softcap > 0.0f ? add_float(root, "attn_logit_softcapping", c->attn_softcap)
                                     : cJSON_AddNullToObject(root, "attn_logit_softcapping") != NULL);
    /* query_pre_attn_scalar: the integer whose 1/sqrt is attn_scale; when none is, the exact
     * scale as the shardlm extra "attn_scale" (the parser prefers it). */
    double qpas = nearbyint(1.0 / ((double)c->attn_scale * (double)c->attn_scale));
    if (ok) ok = add_num(root, "query_pre_attn_scalar", qpas >= 1.0 ? qpas : 1.0);
    if (ok && (qpas < 1.0 || qpas > INT_MAX || (float)(1.0 / sqrt(qpas)) != c->attn_scale))
        ok = add_float(root, "attn_scale", c->attn_scale);
    /* The shardlm extra for checkpoints whose norm weights have the 1 folded in (GGUF). */
    if (ok && c->norm_weight_offset != 1.0f)
        ok = add_float(root, "norm_weight_offset", c->norm_weight_offset);
    if (ok && c->embed_scale != sqrtf((float)c->d_model))
        ok = add_float(root, "embed_scale", c->embed_scale);
    return ok;
}

/* GPT2LMHeadModel fields. */
static int add_gpt2(cJSON *root, const struct model_config *c)
{
    return add_str(root, "model_type", "gpt2") && add_num(root, "n_embd", c->d_model) &&
           add_num(root, "n_layer", c->n_layers) && add_num(root, "n_head", c->n_heads) &&
           add_num(root, "n_inner", c->ffn_hidden) && add_num(root, "vocab_size", c->vocab_size) &&
           add_num(root, "n_positions", c->max_positions) &&
           add_float(root, "layer_norm_epsilon", c->norm_eps) &&
           add_str(root, "activation_function",
                   c->activation == ACTIVATION_GELU_ERF ? "gelu" : "gelu_new") &&
           add_bool(root, "tie_word_embeddings", 1);
}

enum status config_save(const char *path, const struct model_config *c)
{
    enum status st = STATUS_OK;
    cJSON *root = NULL;
    char *text = NULL;

    if ((st = config_validate(c, path))) return st;
    if (c->family == MODEL_FAMILY_LLAMA && strcmp(c->architecture, "LlamaForCausalLM") &&
        strcmp(c->architecture, "MistralForCausalLM") && strcmp(c->architecture, "Qwen2ForCausalLM") &&
        strcmp(c->architecture, "Qwen3ForCausalLM") && strcmp(c->architecture, "Phi3ForCausalLM") &&
        strcmp(c->architecture, "Olmo2ForCausalLM") && strcmp(c->architecture, "MixtralForCausalLM") &&
        strcmp(c->architecture, "Qwen3MoeForCausalLM") && strcmp(c->architecture, "OlmoeForCausalLM") &&
        strcmp(c->architecture, "Qwen2MoeForCausalLM") && strcmp(c->architecture, "GptOssForCausalLM") &&
        strcmp(c->architecture, "MiniMaxM2ForCausalLM") && !config_is_glm4_moe(c))
        return status_errorf(STATUS_UNSUPPORTED, "%s: cannot save architecture \"%s\"", path,
                             c->architecture);
    if (c->family == MODEL_FAMILY_LLAMA && !strcmp(c->architecture, "LlamaForCausalLM") &&
        c->sliding_window)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: LlamaForCausalLM has no sliding window; use MistralForCausalLM",
                             path);
    if (c->family == MODEL_FAMILY_GPT2 && strcmp(c->architecture, "GPT2LMHeadModel"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: cannot save architecture \"%s\"", path,
                             c->architecture);
    if (c->family == MODEL_FAMILY_GEMMA3 && strcmp(c->architecture, "Gemma3ForCausalLM") &&
        strcmp(c->architecture, "Gemma2ForCausalLM"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: cannot save architecture \"%s\"", path,
                             c->architecture);
    if (c->family == MODEL_FAMILY_BERT) /* served as it is; convert, reshard and train do not take encoders */
        return status_errorf(STATUS_UNSUPPORTED, "%s: cannot save architecture \"%s\" (an encoder)", path,
                             c->architecture);
    int ok = 1;
    root = cJSON_CreateObject();
    cJSON *archs = cJSON_CreateStringArray((const char *const[]){c->architecture}, 1);
    ok = root && archs && cJSON_AddItemToObject(root, "architectures", archs);
    if (!ok) cJSON_Delete(archs);
    if (ok && c->family == MODEL_FAMILY_LLAMA) ok = add_llama(root, c);
    else if (ok && c->family == MODEL_FAMILY_GEMMA3) ok = add_gemma3(root, c);
    else if (ok) ok = add_gpt2(root, c);
    if (ok && c->bos_id >= 0) ok = add_num(root, "bos_token_id", c->bos_id);
    if (ok && c->eos_id >= 0) ok = add_num(root, "eos_token_id", c->eos_id);
    if (ok) ok = add_str(root, "torch_dtype", dtype_torch_name(c->dtype));
    if (ok) ok = (text = cJSON_Print(root)) != NULL;
    if (!ok) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory building JSON", path);
        goto out;
    }

    st = base_write_text(path, text, 0644);
out:
    cJSON_free(text);
    cJSON_Delete(root);
    return st;
}
