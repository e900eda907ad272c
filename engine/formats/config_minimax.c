/* engine/formats/config_minimax.c - MiniMaxM2ForCausalLM's own config.json fields (config_impl.h):
 * its router (DeepSeek-V3's sigmoid scores with a selection bias) and its attention (the
 * whole-projection QK norm, rotary_dim). The rest of it is read as a Llama-family mixture of
 * experts by config.c (Mixtral's expert fields).
 * Tests: tests/test_config_moe.c. */
#include "config_impl.h"

#include <string.h>

/* MiniMax-M2's router (config.h moe_sigmoid, moe_sel_bias): scoring_func must be "sigmoid";
 * use_routing_bias (default true, transformers always has the buffer) says whether the checkpoint
 * holds e_score_correction_bias; shared experts (shared_intermediate_size) are not built. */
enum status config_parse_minimax_router(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    const char *score = NULL;
    int shared = 0;
    if ((st = config_get_string(root, name, "scoring_func", &score)) ||
        (st = config_get_bool(root, name, "use_routing_bias", 1, &c->moe_sel_bias)) ||
        (st = config_get_int(root, name, "shared_intermediate_size", 0, 0, &shared)))
        return st;
    if (score && strcmp(score, "sigmoid"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'scoring_func' = \"%s\": MiniMaxM2ForCausalLM's router "
                             "is read with \"sigmoid\" only", name, score);
    if (shared > 0)
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'shared_intermediate_size' = %d: MiniMax-M2's shared "
                             "experts are not built", name, shared);
    c->moe_sigmoid = 1;
    return STATUS_OK;
}

/* MiniMax-M2's attention (config.h): q and k RMS-normed over the whole projection (use_qk_norm,
 * qk_norm_type "per_layer"), the first rotary_dim features of each head rotated, every layer
 * full attention (attn_type_list, when given, all 1). */
enum status config_parse_minimax_attention(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    int use = 1;
    const char *type = NULL;
    if ((st = config_get_bool(root, name, "use_qk_norm", 1, &use)) ||
        (st = config_get_string(root, name, "qk_norm_type", &type)))
        return st;
    if (!use || (type && strcmp(type, "per_layer")))
        return status_errorf(STATUS_UNSUPPORTED, "%s: use_qk_norm %d, qk_norm_type \"%s\": MiniMax-M2 is read with q "
                             "and k normed over the whole projection (\"per_layer\") only", name, use,
                             type ? type : "per_layer");
    c->qk_norm = QK_NORM_FULL;
    const cJSON *rd = config_field(root, "rotary_dim");
    if (rd && !config_field(root, "rot_dim")) {
        int r = 0;
        if ((st = config_json_to_int(rd, name, "rotary_dim", &r))) return st;
        if (r < 2 || r > c->head_dim || r % 2)
            return status_errorf(STATUS_BAD_FORMAT, "%s: field 'rotary_dim' = %d must be even and in [2, head_dim %d]",
                                 name, r, c->head_dim);
        c->rot_dim = r;
    }
    const cJSON *types = config_field(root, "attn_type_list");
    for (int i = 0; types && cJSON_IsArray(types) && i < cJSON_GetArraySize(types); i++) {
        const cJSON *t = cJSON_GetArrayItem(types, i);
        if (!cJSON_IsNumber(t) || t->valuedouble != 1.0)
            return status_errorf(STATUS_UNSUPPORTED, "%s: attn_type_list[%d] is not 1: only full-attention layers "
                                 "are read (MiniMax's lightning attention is not built)", name, i);
    }
    return STATUS_OK;
}
