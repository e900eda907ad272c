/* engine/formats/weight_names.h - the one table of weight names: every weight kind of the canonical
 * layout (checkpoint.h) with its canonical shape, where it lives in a pipeline, and its name in
 * each family of files: Hugging Face (Llama/Mistral, Gemma 3, GPT-2), Megatron-Core (shardlm's
 * Megatron-style layout, plus Transformer-Engine norm names) and GGUF (llama.cpp). Every reader
 * and writer of weights takes its names from here: checkpoint.c (reading HF and Megatron),
 * checkpoint_write.c (writing both), gguf_convert.c (GGUF to HF).
 * Not here: how a layout slices or fuses tensors beyond what a row states (checkpoint.c), the
 * files themselves (safetensors.h, gguf.h).
 * Tests: tests/test_formats.c (every weight of every family through every reader and writer),
 * the golden and reshard tests (GPT-2's fused c_attn, Megatron at tp/pp > 1). */
#ifndef SHARDLM_WEIGHT_NAMES_H
#define SHARDLM_WEIGHT_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Values never reach files; new kinds are appended. */
enum weight_kind {
    WEIGHT_KIND_TOK_EMBEDDING,  /* (vocab, d_model) */
    WEIGHT_KIND_POS_EMBEDDING,  /* (max_positions, d_model) */
    WEIGHT_KIND_ATTN_NORM,      /* (d_model), per layer */
    WEIGHT_KIND_ATTN_NORM_BIAS,
    WEIGHT_KIND_Q,              /* (n_heads * head_dim, d_model), per layer */
    WEIGHT_KIND_Q_BIAS,
    WEIGHT_KIND_K,              /* (n_kv_heads * head_dim, d_model), per layer */
    WEIGHT_KIND_K_BIAS,
    WEIGHT_KIND_V,
    WEIGHT_KIND_V_BIAS,
    WEIGHT_KIND_O,              /* (d_model, n_heads * head_dim), per layer */
    WEIGHT_KIND_O_BIAS,
    WEIGHT_KIND_MLP_NORM,       /* (d_model), per layer */
    WEIGHT_KIND_MLP_NORM_BIAS,
    WEIGHT_KIND_GATE,           /* (ffn_hidden, d_model), per layer */
    WEIGHT_KIND_GATE_BIAS,
    WEIGHT_KIND_UP,
    WEIGHT_KIND_UP_BIAS,
    WEIGHT_KIND_DOWN,           /* (d_model, ffn_hidden), per layer */
    WEIGHT_KIND_DOWN_BIAS,
    WEIGHT_KIND_FINAL_NORM,     /* (d_model) */
    WEIGHT_KIND_FINAL_NORM_BIAS,
    WEIGHT_KIND_LM_HEAD,        /* (vocab, d_model) */
    WEIGHT_KIND_Q_NORM,         /* (head_dim), per layer; cfg.qk_norm; replicated */
    WEIGHT_KIND_K_NORM,         /* (head_dim), per layer; cfg.qk_norm; replicated */
    WEIGHT_KIND_POST_ATTN_NORM, /* (d_model), per layer; cfg.sandwich_norms; replicated */
    WEIGHT_KIND_POST_MLP_NORM,  /* (d_model), per layer; cfg.sandwich_norms; replicated */
    /* Mixture of experts (cfg.n_experts > 0): the MLP of every layer is n_experts experts, each
     * a gated MLP of moe_ffn, stacked expert by expert (GGUF's ffn_*_exps as they are). */
    WEIGHT_KIND_ROUTER,         /* (n_experts, d_model), per layer */
    WEIGHT_KIND_EXP_GATE,       /* (n_experts * moe_ffn, d_model), per layer */
    WEIGHT_KIND_EXP_UP,         /* (n_experts * moe_ffn, d_model), per layer */
    WEIGHT_KIND_EXP_DOWN,       /* (n_experts * d_model, moe_ffn), per layer */
    WEIGHT_KIND_SHARED_GATE,    /* (1, d_model), per layer: the shared expert's sigmoid gate
                                   (cfg.shared_expert; the shared expert itself is GATE, UP, DOWN) */
    /* Encoders (BERT): the token type (segment) embedding and the LayerNorm of the summed
     * embeddings (cfg.type_vocab_size, cfg.embed_norm); first stage, replicated. */
    WEIGHT_KIND_TYPE_EMBEDDING, /* (type_vocab_size, d_model) */
    WEIGHT_KIND_EMBED_NORM,     /* (d_model) */
    WEIGHT_KIND_EMBED_NORM_BIAS,
    /* GPT-OSS (cfg.attn_sinks, cfg.moe_bias), per layer. */
    WEIGHT_KIND_SINKS,          /* (n_heads): each query head's sink logit; split by heads */
    WEIGHT_KIND_ROUTER_BIAS,    /* (n_experts): replicated */
    WEIGHT_KIND_EXP_GATE_BIAS,  /* (n_experts * moe_ffn), expert by expert */
    WEIGHT_KIND_EXP_UP_BIAS,    /* (n_experts * moe_ffn) */
    WEIGHT_KIND_EXP_DOWN_BIAS,  /* (n_experts * d_model) */
    /* MiniMax-M2 (cfg.moe_sel_bias), per layer: added to the sigmoid scores to choose the top k
     * (HF e_score_correction_bias); f32 whatever the model's dtype; replicated. */
    WEIGHT_KIND_ROUTER_SEL_BIAS, /* (n_experts) */
    WEIGHT_KIND_COUNT
};

const char *weight_kind_name(enum weight_kind kind); /* "q", "attn_norm_bias", ... */
int         weight_kind_per_layer(enum weight_kind kind);
/* Whether the kind is a norm's weight (not its bias): the weights that a norm_weight_offset
 * applies to (Gemma stores w for x * (1 + w)). */
int         weight_kind_is_norm(enum weight_kind kind);
/* Whether the kind is stacked expert by expert (the experts' matrices and GPT-OSS's biases):
 * the weights a rank holds whole experts of (tp, or the ep group). */
int         weight_kind_per_expert(enum weight_kind kind);
/* Whether a model with this config has the weight (biases, GATE, POS_EMBEDDING depend on it). */
int         weight_kind_exists(const struct model_config *cfg, enum weight_kind kind);

/* Canonical shape: the weight in row-major nn.Linear orientation (out, in); vectors are
 * (rows) with *ndim 1 and *cols 1. Shapes for every kind are listed in checkpoint.h. */
void weight_kind_shape(const struct model_config *cfg, enum weight_kind kind, int *ndim,
                       int64_t *rows, int64_t *cols);
/* The same for layer `layer` (any value for the kinds that are not per layer): a mixture's dense
 * first layers (cfg.moe_dense_first) have GATE, UP, DOWN of dense_ffn and none of the experts'
 * kinds; every other layer is what the kind-wide answers say. */
int  weight_kind_exists_at(const struct model_config *cfg, enum weight_kind kind, int layer);
void weight_kind_shape_at(const struct model_config *cfg, enum weight_kind kind, int layer, int *ndim,
                          int64_t *rows, int64_t *cols);

/* The sizes that canonical shapes are made of. */
enum weight_dim {
    WEIGHT_DIM_ONE,       /* 1: the cols of a vector */
    WEIGHT_DIM_D_MODEL,
    WEIGHT_DIM_HEAD_DIM,
    WEIGHT_DIM_Q,         /* n_heads * head_dim */
    WEIGHT_DIM_KV,        /* n_kv_heads * head_dim */
    WEIGHT_DIM_FFN,       /* ffn_hidden */
    WEIGHT_DIM_VOCAB,
    WEIGHT_DIM_POSITIONS, /* max_positions */
    WEIGHT_DIM_EXPERTS,   /* n_experts */
    WEIGHT_DIM_EXP_FFN,   /* n_experts * moe_ffn */
    WEIGHT_DIM_EXP_D,     /* n_experts * d_model */
    WEIGHT_DIM_MOE_FFN,   /* moe_ffn */
    WEIGHT_DIM_TYPES,     /* type_vocab_size */
    WEIGHT_DIM_HEADS,     /* n_heads */
};

/* Where a weight lives in a pipeline split. */
enum weight_place {
    WEIGHT_PLACE_FIRST, /* stage 0 only: the embeddings */
    WEIGHT_PLACE_LAYER, /* one per layer, on the stage that holds the layer */
    WEIGHT_PLACE_LAST,  /* the last stage only: final norm, LM head */
};

/* How GPT-2 (Hugging Face GPT2LMHeadModel) stores a weight. */
enum weight_gpt2 {
    WEIGHT_GPT2_AS_IS,    /* the canonical tensor */
    WEIGHT_GPT2_CONV1D,   /* Conv1D: stored transposed, (in, out) */
    WEIGHT_GPT2_QKV,      /* a third of c_attn: (d_model, q + 2 kv), transposed, Q then K then V */
    WEIGHT_GPT2_QKV_BIAS, /* a third of c_attn's bias: (q + 2 kv) */
};

/* How the Megatron-style layout stores a weight across its tp ranks (checkpoint.h). */
enum weight_megatron {
    WEIGHT_MEGATRON_REPLICATED, /* the full tensor on every rank (read from rank 0) */
    WEIGHT_MEGATRON_VOCAB,      /* rows of the padded vocabulary, split over the ranks */
    WEIGHT_MEGATRON_QKV,        /* a part of linear_qkv, grouped per query group */
    WEIGHT_MEGATRON_FC1,        /* a part of linear_fc1: [gate; up] rows per rank */
    WEIGHT_MEGATRON_COLUMNS,    /* input columns split over the ranks (row-parallel) */
};

/* One row of the table. Name patterns take the (global for HF and GGUF, stage-local for
 * Megatron) layer number as their one %d; whole-model weights have no %d. */
struct weight_names {
    enum weight_kind     kind;
    const char          *name;       /* weight_kind_name: "q", "attn_norm_bias", ... */
    enum weight_place    place;
    enum weight_dim      rows, cols; /* canonical shape (cols WEIGHT_DIM_ONE: a vector) */
    /* Hugging Face, Llama family (Llama, Mistral, Gemma 3), after the body prefix "model."
     * (LM_HEAD: the whole name, outside the body). */
    const char          *hf;
    const char          *hf_gemma3;  /* Gemma 3's name where it differs from hf, else NULL */
    /* Hugging Face GPT-2, after the optional "transformer." prefix; NULL: GPT-2 lacks it. */
    const char          *hf_gpt2;
    enum weight_gpt2     gpt2;
    const char          *megatron;   /* Megatron-Core local spec */
    const char          *megatron_te; /* Transformer-Engine norm name (read only), or NULL */
    enum weight_megatron megatron_layout;
    const char          *gguf;       /* llama.cpp, or NULL */
};

/* The rows in Megatron file order (embeddings; per layer: attention norm, QKV, QK-norms,
 * projection, post-attention norm, MLP norm, fc1, fc2, post-MLP norm; final norm, head):
 * i in 0 .. WEIGHT_KIND_COUNT - 1. */
const struct weight_names *weight_names_at(int i);
/* The row of kind (a valid kind, else CHECK). */
const struct weight_names *weight_names_of(enum weight_kind kind);
/* The Hugging Face pattern of kind for a Llama-family model (gemma3: Gemma 3's names). */
const char *weight_names_hf(enum weight_kind kind, int gemma3);
/* A Llama-family model's HF name pattern of kind in layer `layer` (weight_names_hf, with Gemma's
 * norms by config_hf_gemma_names, a mixture's shared expert as mlp.shared_expert.* (Qwen 2 MoE)
 * or mlp.shared_experts.* (GLM-4.5) on its sparse layers, and the selection bias as
 * mlp.gate.e_score_correction_bias outside Mixtral's naming). The router and experts are named by
 * the readers and writers of the experts. */
const char *weight_names_hf_llama(const struct model_config *c, enum weight_kind kind, int layer);
/* The Hugging Face BertModel name of kind (after the optional "bert." prefix), or NULL when a
 * BERT model has no such weight. */
const char *weight_names_hf_bert(enum weight_kind kind);
/* Which third of a fused QKV tensor kind is: 0 Q, 1 K, 2 V (and their biases); -1 otherwise. */
int         weight_names_qkv_part(enum weight_kind kind);

/* Writes prefix followed by pattern with layer in place of its %d (if any) into buf (n bytes).
 * Returns 0, or -1 when the name does not fit. */
int weight_names_format(char *buf, size_t n, const char *prefix, const char *pattern, int layer);

#ifdef __cplusplus
}
#endif

#endif
