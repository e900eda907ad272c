/* engine/formats/config_bert.c - config.json of BERT encoders (config_impl.h): BertModel as
 * transformers' BertConfig defines it (all-MiniLM-L6-v2 and the sentence-transformers family).
 * Not here: the decoder families and the checks every config passes (config.c).
 * Tests: tests/test_formats.c (a BERT config and its errors), tests/server/test_embeddings.py
 * (all-MiniLM-L6-v2's own config.json). */
#include "config_impl.h"

#include <string.h>

enum status config_parse_bert(const cJSON *root, const char *name, struct model_config *c)
{
    enum status st;
    int is_decoder = 0;
    const char *act = NULL, *pos = NULL;
    if ((st = config_get_int(root, name, "hidden_size", 1, 0, &c->d_model)) ||
        (st = config_get_int(root, name, "num_hidden_layers", 1, 0, &c->n_layers)) ||
        (st = config_get_int(root, name, "num_attention_heads", 1, 0, &c->n_heads)) ||
        (st = config_get_int(root, name, "intermediate_size", 1, 0, &c->ffn_hidden)) ||
        (st = config_get_int(root, name, "vocab_size", 1, 0, &c->vocab_size)) ||
        (st = config_get_int(root, name, "max_position_embeddings", 0, 512, &c->max_positions)) ||
        (st = config_get_int(root, name, "type_vocab_size", 0, 2, &c->type_vocab_size)) ||
        (st = config_get_float(root, name, "layer_norm_eps", 1e-12f, &c->norm_eps)) ||
        (st = config_get_bool(root, name, "is_decoder", 0, &is_decoder)) ||
        (st = config_get_string(root, name, "hidden_act", &act)) ||
        (st = config_get_string(root, name, "position_embedding_type", &pos)))
        return st;
    if (c->n_heads <= 0 || c->d_model <= 0 || c->d_model % c->n_heads)
        return status_errorf(STATUS_BAD_FORMAT, "%s: hidden_size %d is not a positive multiple of num_attention_heads %d",
                             name, c->d_model, c->n_heads);
    if (is_decoder)
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'is_decoder' = true is not supported (BERT is served as "
                             "an encoder)", name);
    if (pos && strcmp(pos, "absolute"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'position_embedding_type' = \"%s\" is not supported "
                             "(absolute)", name, pos);
    c->activation = ACTIVATION_GELU_ERF; /* BertConfig's default, "gelu" */
    if (act && (st = config_get_activation(name, "hidden_act", act, &c->activation))) return st;
    if (c->activation == ACTIVATION_SILU)
        return status_errorf(STATUS_UNSUPPORTED, "%s: field 'hidden_act' = \"%s\" is not supported for BERT (gelu, "
                             "gelu_new)", name, act);
    c->family = MODEL_FAMILY_BERT;
    c->n_kv_heads = c->n_heads;
    c->head_dim = c->d_model / c->n_heads;
    c->norm = NORM_KIND_LAYERNORM;
    c->gated_mlp = 0;
    c->positions = POSITION_KIND_LEARNED;
    c->rope_style = ROPE_STYLE_HALVES;
    c->qkv_bias = c->attn_out_bias = c->mlp_bias = 1;
    c->encoder = 1;
    c->post_ln = 1;
    c->embed_norm = 1;
    return STATUS_OK;
}
