/* engine/formats/config_impl.h - private to the config.json parser (config.c, config_json.c,
 * config_gemma.c, config_bert.c, config_minimax.c): the typed field readers every family's parser uses, and the parsers that
 * live apart from config.c.
 * Each reader names the file (name) and the field in its error; absent and JSON null both mean
 * "use the default". */
#ifndef SHARDLM_CONFIG_IMPL_H
#define SHARDLM_CONFIG_IMPL_H

#include "config.h"

#include <cjson/cJSON.h>

#define CONFIG_MAX_DIM (1 << 24) /* bounds every size so that products fit in int64 */

/* The item for key, or NULL when it is absent or JSON null. */
const cJSON *config_field(const cJSON *root, const char *key);
/* STATUS_BAD_FORMAT: "missing field" or "field is null". */
enum status config_missing(const cJSON *root, const char *name, const char *key);
enum status config_json_to_int(const cJSON *it, const char *name, const char *key, int *out);
/* An integer field; absent or null gives dflt, or an error when required. */
enum status config_get_int(const cJSON *root, const char *name, const char *key, int required, int dflt,
                           int *out);
enum status config_get_float(const cJSON *root, const char *name, const char *key, float dflt, float *out);
enum status config_get_bool(const cJSON *root, const char *name, const char *key, int dflt, int *out);
/* An optional string field: *out is NULL when absent or null. */
enum status config_get_string(const cJSON *root, const char *name, const char *key, const char **out);
/* hidden_act / hidden_activation names (silu, gelu_new, gelu_pytorch_tanh, gelu). */
enum status config_get_activation(const char *name, const char *key, const char *s, enum activation *out);

/* rope_scaling (or rope_parameters) rs into c->rope_scaling (config.c). */
enum status config_parse_rope_scaling(const cJSON *root, const cJSON *rs, const char *name, const char *key,
                                      struct model_config *c);

/* Gemma2ForCausalLM (version 2) and Gemma3ForCausalLM's text config (version 3), defaults as in
 * transformers (config_gemma.c). */
/* layer_types (["sliding_attention", ..., "full_attention", ...]: Gemma 3, GPT-OSS) as a period:
 * layer i is global when (i + 1) % pattern == 0. No full layer at all is pattern 0 (every layer
 * windowed); a list that no period describes is STATUS_UNSUPPORTED. */
enum status config_layer_pattern(const cJSON *types, const char *name, int n_layers, int *pattern);
enum status config_parse_gemma(const cJSON *root, const char *name, int version, struct model_config *c);

/* MiniMax-M2's router (moe_sigmoid, moe_sel_bias) and attention (qk_norm, rot_dim) fields, with
 * their refusals by name (config_minimax.c). */
enum status config_parse_minimax_router(const cJSON *root, const char *name, struct model_config *c);
enum status config_parse_minimax_attention(const cJSON *root, const char *name, struct model_config *c);

/* Glm4MoeForCausalLM's experts, router, shared experts and dense first layers (config_glm.c). */
enum status config_parse_glm4_moe(const cJSON *root, const char *name, struct model_config *c);

/* BertModel (an encoder), defaults as in transformers' BertConfig (config_bert.c). */
enum status config_parse_bert(const cJSON *root, const char *name, struct model_config *c);

#endif
