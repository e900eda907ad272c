/* engine/formats/config_gemma.c - config.json of Gemma 2 and Gemma 3 (config_impl.h): their
 * defaults, which layers are windowed, the rotary bases, soft-capping.
 * Not here: the other families and the checks every config passes (config.c).
 * Tests: tests/test_formats.c (Gemma 3 configs and errors), the gemma2 goldens (tests/reference/
 * make_models.py gemma2). */
#include "config_impl.h"

#include <math.h>
#include <string.h>

enum status config_layer_pattern(const cJSON *types, const char *name, int n_layers,
                                        int *pattern)
{
    if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != n_layers)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: field 'layer_types' must be a list of %d strings (one per layer)",
                             name, n_layers);
    int first_full = -1;
    for (int i = 0; i < n_layers; i++) {
        const cJSON *t = cJSON_GetArrayItem(types, i);
        if (!cJSON_IsString(t) || (strcmp(t->valuestring, "full_attention") &&
                                   strcmp(t->valuestring, "sliding_attention")))
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: layer_types[%d] must be \"full_attention\" or "
                                 "\"sliding_attention\"",
                                 name, i);
        if (first_full < 0 && !strcmp(t->valuestring, "full_attention")) first_full = i;
    }
    int p = first_full < 0 ? 0 : first_full + 1;
    for (int i = 0; i < n_layers; i++) {
        int full = !strcmp(cJSON_GetArrayItem(types, i)->valuestring, "full_attention");
        if (full != (p > 0 && (i + 1) % p == 0))
            return status_errorf(STATUS_UNSUPPORTED,
                                 "%s: field 'layer_types' is not periodic (one full_attention layer "
                                 "every N, the rest sliding_attention); layer %d breaks the period "
                                 "%d",
                                 name, i, p);
    }
    *pattern = p;
    return STATUS_OK;
}

/* One entry of transformers >= 5's per-layer-type "rope_parameters" (Gemma 3). */
static enum status gemma3_rope_entry(const cJSON *rp, const char *name, const char *key,
                                     float *theta)
{
    const cJSON *e = config_field(rp, key);
    if (!e) return STATUS_OK;
    if (!cJSON_IsObject(e))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'rope_parameters.%s' must be an object",
                             name, key);
    const char *type;
    enum status st = config_get_string(e, name, "rope_type", &type);
    if (st) return st;
    if (type && strcmp(type, "default"))
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: rope_parameters.%s.rope_type = \"%s\": scaled rotary embeddings "
                             "are not supported yet",
                             name, key, type);
    return config_get_float(e, name, "rope_theta", *theta, theta);
}

/* Gemma2ForCausalLM (Gemma2Config) and Gemma3ForCausalLM's text config (Gemma3TextConfig), defaults as in
 * transformers: Gemma 2 differs by its soft-capping (attention scores and final logits), one rotary base,
 * every other layer windowed, no QK norm, and its defaults. */
/* A soft-capping field of Gemma 2: absent gives dflt (Gemma2Config's), JSON null none (0), else a
 * positive number. */
static enum status get_softcap(const cJSON *root, const char *name, const char *key, float dflt, float *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it) {
        *out = dflt;
        return STATUS_OK;
    }
    if (cJSON_IsNull(it)) {
        *out = 0.0f;
        return STATUS_OK;
    }
    enum status st = config_get_float(root, name, key, dflt, out);
    if (st == STATUS_OK && !(*out > 0.0f))
        return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' = %g must be > 0 (or null: none)", name, key,
                             (double)*out);
    return st;
}

enum status config_parse_gemma(const cJSON *root, const char *name, int version, struct model_config *c)
{
    enum status st;
    const int g2 = version == 2;
    if (g2) {
        if ((st = get_softcap(root, name, "final_logit_softcapping", 30.0f, &c->final_softcap)) ||
            (st = get_softcap(root, name, "attn_logit_softcapping", 50.0f, &c->attn_softcap)))
            return st;
    } else {
        static const char *const unsupported_if_set[] = {"final_logit_softcapping", "attn_logit_softcapping"};
        for (size_t i = 0; i < sizeof unsupported_if_set / sizeof unsupported_if_set[0]; i++)
            if (config_field(root, unsupported_if_set[i]))
                return status_errorf(STATUS_UNSUPPORTED, "%s: field '%s' is set; Gemma 3 with logit softcapping is "
                                     "not supported", name, unsupported_if_set[i]);
    }
    int flag = 0;
    if ((st = config_get_bool(root, name, "use_bidirectional_attention", 0, &flag))) return st;
    if (flag)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: field 'use_bidirectional_attention' = true (an embedding model) "
                             "is not supported",
                             name);
    int qpas;
    if ((st = config_get_int(root, name, "hidden_size", 1, 0, &c->d_model)) ||
        (st = config_get_int(root, name, "intermediate_size", 1, 0, &c->ffn_hidden)) ||
        (st = config_get_int(root, name, "num_hidden_layers", 1, 0, &c->n_layers)) ||
        (st = config_get_int(root, name, "num_attention_heads", 0, 8, &c->n_heads)) ||
        (st = config_get_int(root, name, "vocab_size", 0, g2 ? 256000 : 262208, &c->vocab_size)) ||
        (st = config_get_int(root, name, "num_key_value_heads", 0, 4, &c->n_kv_heads)) ||
        (st = config_get_int(root, name, "head_dim", 0, 256, &c->head_dim)) ||
        (st = config_get_int(root, name, "max_position_embeddings", 0, g2 ? 8192 : 131072, &c->max_positions)) ||
        (st = config_get_float(root, name, "rms_norm_eps", 1e-6f, &c->norm_eps)) ||
        (st = config_get_float(root, name, "rope_theta", g2 ? 10000.0f : 1000000.0f, &c->rope_theta)) ||
        (st = config_get_float(root, name, "rope_local_base_freq", g2 ? c->rope_theta : 10000.0f, &c->rope_theta_local)) ||
        (st = config_get_int(root, name, "sliding_window", 0, 4096, &c->sliding_window)) ||
        (st = config_get_int(root, name, "query_pre_attn_scalar", 0, 256, &qpas)) ||
        (st = config_get_bool(root, name, "tie_word_embeddings", 1, &c->tied_embeddings)) ||
        (st = config_get_bool(root, name, "attention_bias", 0, &c->qkv_bias)) ||
        (st = config_get_float(root, name, "norm_weight_offset", 1.0f, &c->norm_weight_offset)))
        return st;
    if (qpas <= 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'query_pre_attn_scalar' = %d must be > 0",
                             name, qpas);
    c->attn_scale = (float)(1.0 / sqrt((double)qpas));
    /* shardlm's own exact value, written by config_save when no integer scalar gives it. */
    if ((st = config_get_float(root, name, "attn_scale", c->attn_scale, &c->attn_scale))) return st;
    c->attn_out_bias = c->qkv_bias;
    /* rope_scaling (Gemma 3 4B and up: linear, factor 8) applies to the global layers. */
    if ((st = config_parse_rope_scaling(root, config_field(root, "rope_scaling"), name, "rope_scaling", c))) return st;

    const cJSON *rp = config_field(root, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp))
            return status_errorf(STATUS_BAD_FORMAT, "%s: field 'rope_parameters' must be an object",
                                 name);
        if (g2 && config_field(rp, "rope_theta")) { /* one base for every layer */
            if ((st = config_get_float(rp, name, "rope_theta", c->rope_theta, &c->rope_theta))) return st;
            c->rope_theta_local = c->rope_theta;
        } else if ((st = gemma3_rope_entry(rp, name, "full_attention", &c->rope_theta)) ||
                   (st = gemma3_rope_entry(rp, name, "sliding_attention", &c->rope_theta_local))) {
            return st;
        }
    }

    /* Which layers are windowed: layer_types when given (newer transformers), else the pattern
     * (older "sliding_window_pattern", newer "_sliding_window_pattern"; default 6). */
    const cJSON *types = config_field(root, "layer_types");
    if (c->n_layers <= 0 || c->n_layers > CONFIG_MAX_DIM)
        return status_errorf(STATUS_BAD_FORMAT, "%s: num_hidden_layers = %d must be in 1..%d", name,
                             c->n_layers, CONFIG_MAX_DIM);
    if (types) {
        if ((st = config_layer_pattern(types, name, c->n_layers, &c->sliding_window_pattern)))
            return st;
    } else {
        const char *key = config_field(root, "sliding_window_pattern") ? "sliding_window_pattern"
                                                                : "_sliding_window_pattern";
        /* Gemma 2: every other layer windowed, from the first (Gemma2Config has no pattern field;
         * shardlm's own files carry it). */
        if ((st = config_get_int(root, name, key, 0, g2 ? 2 : 6, &c->sliding_window_pattern))) return st;
        if (c->sliding_window_pattern < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: field '%s' = %d must be >= 0", name, key,
                                 c->sliding_window_pattern);
    }

    const char *act;
    if ((st = config_get_string(root, name, "hidden_activation", &act))) return st;
    const char *act_key = "hidden_activation";
    if (!act) {
        act_key = "hidden_act";
        if ((st = config_get_string(root, name, act_key, &act))) return st;
    }
    c->activation = ACTIVATION_GELU_TANH; /* "gelu_pytorch_tanh" */
    if (act && (st = config_get_activation(name, act_key, act, &c->activation))) return st;

    c->family = MODEL_FAMILY_GEMMA3;
    c->norm = NORM_KIND_RMSNORM;
    c->gated_mlp = 1;
    c->positions = POSITION_KIND_ROTARY;
    c->rope_style = ROPE_STYLE_HALVES;
    c->rot_dim = c->head_dim;
    c->mlp_bias = 0;
    c->embed_scale = sqrtf((float)c->d_model);
    /* shardlm extra, written only when it is not sqrt(hidden_size). */
    if ((st = config_get_float(root, name, "embed_scale", c->embed_scale, &c->embed_scale))) return st;
    c->qk_norm = !g2; /* Gemma 3 only */
    c->sandwich_norms = 1;
    return STATUS_OK;
}
