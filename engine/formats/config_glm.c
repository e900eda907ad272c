/* engine/formats/config_glm.c - Glm4MoeForCausalLM's (GLM-4.5, GLM-4.6) own config.json fields
 * (config_impl.h): its experts behind DeepSeek-V3's router (sigmoid scores, the selection bias,
 * group-limited choice, routed_scaling_factor), the shared experts added as they are, and the
 * dense layers before the first sparse one. Its attention (q, k, v biases, partial rotary, the
 * optional per-head QK norm) is read by config.c's Llama-family parser.
 * Tests: tests/test_config_moe.c. */
#include "config_impl.h"

#include <string.h>

enum status config_parse_glm4_moe(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    int shared = 1, groups = 1, group_topk = 1;
    float scale = 1.0f;
    c->dense_ffn = c->ffn_hidden; /* intermediate_size: the dense layers' MLP */
    if ((st = config_get_int(root, name, "n_routed_experts", 0, 128, &c->n_experts)) ||
        (st = config_get_int(root, name, "num_experts_per_tok", 0, 8, &c->n_experts_used)) ||
        (st = config_get_int(root, name, "moe_intermediate_size", 0, 1408, &c->moe_ffn)) ||
        (st = config_get_bool(root, name, "norm_topk_prob", 1, &c->norm_topk_prob)) ||
        (st = config_get_int(root, name, "n_shared_experts", 0, 1, &shared)) ||
        (st = config_get_int(root, name, "first_k_dense_replace", 0, 1, &c->moe_dense_first)) ||
        (st = config_get_float(root, name, "routed_scaling_factor", 1.0f, &scale)) ||
        (st = config_get_int(root, name, "n_group", 0, 1, &groups)) ||
        (st = config_get_int(root, name, "topk_group", 0, 1, &group_topk)))
        return st;
    if (c->n_experts < 1 || c->n_experts > 1024 || c->n_experts_used < 1 || c->n_experts_used > c->n_experts ||
        c->moe_ffn < 1 || c->moe_ffn > CONFIG_MAX_DIM)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %d experts, %d per token, of %d features: need 1 <= per token <= "
                             "experts <= 1024 and a positive size", name, c->n_experts, c->n_experts_used, c->moe_ffn);
    if (shared < 0 || (int64_t)shared * c->moe_ffn > CONFIG_MAX_DIM)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'n_shared_experts' = %d", name, shared);
    if (c->moe_dense_first < 0 || c->moe_dense_first >= c->n_layers)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'first_k_dense_replace' = %d must be in [0, %d): a layer "
                             "at least runs the experts", name, c->moe_dense_first, c->n_layers);
    if (!(scale > 0.0f) || scale > 1e6f)
        return status_errorf(STATUS_BAD_FORMAT, "%s: field 'routed_scaling_factor' = %g must be positive", name,
                             (double)scale);
    /* Each group is scored by its two best experts (transformers' topk(2)), so a group holds two at least. */
    if (groups < 1 || c->n_experts % groups || (groups > 1 && c->n_experts / groups < 2) || group_topk < 1 ||
        group_topk > groups || (int64_t)group_topk * (c->n_experts / groups) < c->n_experts_used)
        return status_errorf(STATUS_BAD_FORMAT, "%s: n_group %d, topk_group %d: the groups must split the %d experts "
                             "into groups of two or more, and the chosen groups hold the %d experts per token", name,
                             groups, group_topk, c->n_experts, c->n_experts_used);
    c->moe_groups = groups > 1 ? groups : 0;
    c->moe_group_topk = groups > 1 ? group_topk : 0;
    c->moe_routed_scale = scale;
    c->moe_sigmoid = c->moe_sel_bias = 1; /* Glm4MoeTopkRouter: sigmoid, e_score_correction_bias always */
    if (shared > 0) c->shared_expert = SHARED_EXPERT_PLAIN, c->ffn_hidden = shared * c->moe_ffn;
    if (!c->moe_dense_first) c->dense_ffn = 0;
    const char *act = NULL;
    if ((st = config_get_string(root, name, "scoring_func", &act))) return st;
    if (act && strcmp(act, "sigmoid"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'scoring_func' = \"%s\": Glm4MoeForCausalLM's router "
                             "is read with \"sigmoid\" only", name, act);
    return STATUS_OK;
}
