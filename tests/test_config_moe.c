/* tests/test_config_moe.c - config.json of mixtures of experts whose router is not a softmax:
 * GLM-4.5-Air's and MiniMax-M2's as published (MiniMaxAI/MiniMax-M2's config.json fields that shardlm reads, the
 * sizes of the real model), what each field becomes (config.h moe_sigmoid, moe_sel_bias,
 * qk_norm, rot_dim), the refusals by name, and the save / load round trip.
 * The forward and the gradients: golden_minimax_m2*, golden_glm4_moe* (tests/test_model.c) and train_moe. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "config.h"

/* MiniMax-M2's config.json (the fields shardlm reads; the model's own sizes). */
#define MINIMAX_M2                                                                                                 \
    "{\"architectures\": [\"MiniMaxM2ForCausalLM\"], \"model_type\": \"minimax_m2\", \"hidden_size\": 3072,"       \
    " \"intermediate_size\": 1536, \"num_hidden_layers\": 62, \"num_attention_heads\": 48,"                        \
    " \"num_key_value_heads\": 8, \"head_dim\": 128, \"rotary_dim\": 64, \"vocab_size\": 200064,"                  \
    " \"max_position_embeddings\": 196608, \"rms_norm_eps\": 1e-06, \"rope_theta\": 5000000,"                       \
    " \"num_local_experts\": 256, \"num_experts_per_tok\": 8, \"scoring_func\": \"sigmoid\","                       \
    " \"use_routing_bias\": true, \"use_qk_norm\": true, \"qk_norm_type\": \"per_layer\","                          \
    " \"shared_intermediate_size\": 0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"                   \
    " \"bos_token_id\": 200034, \"eos_token_id\": 200020, \"use_mtp\": true, \"num_mtp_modules\": 3,"                \
    " \"attn_type_list\": [1, 1, 1, 1]}"

/* GLM-4.5-Air's config.json (zai-org/GLM-4.5-Air, the fields shardlm reads; n_group and topk_group
 * changed from its 1 to exercise the groups). */
#define GLM45_AIR                                                                                                   \
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"model_type\": \"glm4_moe\", \"hidden_size\": 4096,"          \
    " \"intermediate_size\": 10944, \"moe_intermediate_size\": 1408, \"num_hidden_layers\": 46,"                 \
    " \"num_attention_heads\": 96, \"num_key_value_heads\": 8, \"head_dim\": 128, \"partial_rotary_factor\": 0.5," \
    " \"vocab_size\": 151552, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05,"                    \
    " \"rope_theta\": 1000000, \"attention_bias\": true, \"use_qk_norm\": false, \"n_routed_experts\": 128,"   \
    " \"n_shared_experts\": 1, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 1,"                       \
    " \"norm_topk_prob\": true, \"routed_scaling_factor\": 1.0, \"n_group\": 8, \"topk_group\": 4,"            \
    " \"num_nextn_predict_layers\": 1, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false,"              \
    " \"eos_token_id\": [151329, 151336, 151338], \"pad_token_id\": 151329}"

static const char *base = MINIMAX_M2;

/* The base config with its field `from` (a "key": value text) replaced by `to`. */
static const char *with(const char *from, const char *to)
{
    static char buf[4096];
    const char *at = strstr(base, from);
    CHECK(at && strlen(base) + strlen(to) < sizeof buf, "no '%s' in the base config", from);
    const size_t head = (size_t)(at - base), nto = strlen(to), tail = strlen(at + strlen(from));
    memcpy(buf, base, head);
    memcpy(buf + head, to, nto);
    memcpy(buf + head + nto, at + strlen(from), tail + 1);
    return buf;
}

static void expect_error(const char *what, const char *json, enum status want, const char *needle)
{
    struct model_config c;
    check_status(config_parse(json, "config.json", &c), want, what, "config.json", needle, NULL);
}

int main(void)
{
    struct model_config c;
    enum status s = config_parse(base, "config.json", &c);
    check(s == STATUS_OK && !strcmp(c.architecture, "MiniMaxM2ForCausalLM") && c.n_experts == 256 &&
              c.n_experts_used == 8 && c.moe_ffn == 1536 && c.norm_topk_prob && c.moe_sigmoid && c.moe_sel_bias &&
              c.qk_norm == QK_NORM_FULL && c.rot_dim == 64 && c.head_dim == 128 && !c.shared_expert &&
              c.rope_theta == 5000000.0f && c.eos_id == 200020,
          "config: MiniMax-M2 as published: 256 experts top 8 of 1536, sigmoid scores with a selection bias, "
          "renormalised, whole-projection QK norm, 64 of 128 features rotated%s%s", s ? ": " : "",
          s ? status_message() : "");
    s = config_parse(with("\"use_routing_bias\": true", "\"use_routing_bias\": false"), "config.json", &c);
    check(s == STATUS_OK && c.moe_sigmoid && !c.moe_sel_bias, "config: MiniMax-M2 without the routing bias: sigmoid "
          "scores only");

    expect_error("config: MiniMax-M2 with a softmax router", with("\"scoring_func\": \"sigmoid\"", "\"scoring_func\": \"softmax\""),
                 STATUS_UNSUPPORTED, "'scoring_func' = \"softmax\"");
    expect_error("config: MiniMax-M2 with shared experts", with("\"shared_intermediate_size\": 0", "\"shared_intermediate_size\": 1024"),
                 STATUS_UNSUPPORTED, "shared experts are not built");
    expect_error("config: MiniMax-M2 with a per-head QK norm", with("\"per_layer\"", "\"per_head\""),
                 STATUS_UNSUPPORTED, "\"per_layer\") only");
    expect_error("config: MiniMax-M2 without a QK norm", with("\"use_qk_norm\": true", "\"use_qk_norm\": false"),
                 STATUS_UNSUPPORTED, "use_qk_norm 0");
    expect_error("config: MiniMax with lightning-attention layers", with("[1, 1, 1, 1]", "[1, 0, 1, 1]"),
                 STATUS_UNSUPPORTED, "attn_type_list[1] is not 1");
    expect_error("config: MiniMax-M2 with an odd rotary_dim", with("\"rotary_dim\": 64", "\"rotary_dim\": 63"), STATUS_BAD_FORMAT,
                 "'rotary_dim' = 63");

    /* GLM-4.5-Air: its dense first layer, 128 experts behind groups, plain shared experts. */
    base = GLM45_AIR;
    s = config_parse(base, "config.json", &c);
    check(s == STATUS_OK && !strcmp(c.architecture, "Glm4MoeForCausalLM") && c.n_experts == 128 &&
              c.n_experts_used == 8 && c.moe_ffn == 1408 && c.norm_topk_prob && c.moe_sigmoid && c.moe_sel_bias &&
              c.shared_expert == SHARED_EXPERT_PLAIN && c.ffn_hidden == 1408 && c.moe_dense_first == 1 &&
              c.dense_ffn == 10944 && c.moe_groups == 8 && c.moe_group_topk == 4 && c.moe_routed_scale == 1.0f &&
              c.qkv_bias && !c.attn_out_bias && !c.qk_norm && c.rot_dim == 64 && c.eos_id == 151329 &&
              config_layer_moe(&c, 1) && !config_layer_moe(&c, 0),
          "config: GLM-4.5-Air as published: layer 0 dense (10944), 128 experts top 8 of 1408 in 8 groups (best 4), "
          "one plain shared expert, q/k/v biases, 64 of 128 features rotated%s%s", s ? ": " : "", s ? status_message() : "");
    s = config_parse(with("\"use_qk_norm\": false", "\"use_qk_norm\": true"), "config.json", &c);
    check(s == STATUS_OK && c.qk_norm == QK_NORM_HEAD, "config: GLM-4.5 with use_qk_norm: each head's q and k normed");
    expect_error("config: GLM-4.5 whose groups do not split the experts", with("\"n_group\": 8", "\"n_group\": 6"),
                 STATUS_BAD_FORMAT, "n_group 6, topk_group 4");
    expect_error("config: GLM-4.5 whose chosen groups hold fewer than k experts", with("\"topk_group\": 4", "\"topk_group\": 0"),
                 STATUS_BAD_FORMAT, "topk_group 0");
    expect_error("config: GLM-4.5 with every layer dense", with("\"first_k_dense_replace\": 1", "\"first_k_dense_replace\": 46"),
                 STATUS_BAD_FORMAT, "'first_k_dense_replace' = 46");
    expect_error("config: GLM-4.5 with a softmax router", with("\"norm_topk_prob\": true", "\"scoring_func\": \"softmax\", \"norm_topk_prob\": true"),
                 STATUS_UNSUPPORTED, "'scoring_func' = \"softmax\"");
    expect_error("config: GLM-4.5 with a negative routed_scaling_factor",
                 with("\"routed_scaling_factor\": 1.0", "\"routed_scaling_factor\": -2.5"), STATUS_BAD_FORMAT,
                 "'routed_scaling_factor' = -2.5");

    /* Saved and read back: the same config (config_equal compares the router's fields too). */
    char dir[] = "/tmp/shardlm_config_moe_XXXXXX";
    if (!mkdtemp(dir)) {
        check(0, "config: a temporary directory");
    } else {
        char path[256];
        snprintf(path, sizeof path, "%s/config.json", dir);
        struct model_config back;
        const char *const configs[2] = {MINIMAX_M2, GLM45_AIR}, *const names[2] = {"MiniMax-M2", "GLM-4.5-Air"};
        for (int i = 0; i < 2; i++) {
            memset(&back, 0, sizeof back);
            s = config_parse(configs[i], "config.json", &c);
            if (!s) s = config_save(path, &c);
            if (!s) s = config_load(path, &back);
            check(s == STATUS_OK && config_equal(&c, &back) && back.moe_sigmoid && back.moe_sel_bias && back.rot_dim == 64,
                  "config: %s saved and loaded back unchanged%s%s", names[i], s ? ": " : "", s ? status_message() : "");
        }
        check_remove_tree(dir);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
