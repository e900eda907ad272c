/* engine/model/weights.h - the weights of one pipeline stage on one tensor-parallel shard, and
 * their layout table: one row per tensor (kind, layer, local shape). The same struct holds any
 * per-parameter state with the weights' shapes (gradients, AdamW moments, fp32 master copies:
 * llm.c's ParameterTensors), so that allocating, zeroing, checkpointing and resharding that
 * state is one loop over the table, not a list of fields written again.
 * Not here: reading weights from files (model_load.c, formats/), the forward pass (model.c).
 * Tests: tests/test_model.c (loading through the table), tests/test_weights.c. */
#ifndef SHARDLM_WEIGHTS_H
#define SHARDLM_WEIGHTS_H

#include "checkpoint.h"
#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A weight that a model may lack (biases): data == NULL when absent. Shapes are LOCAL: this
 * rank's slice (n_heads_local, n_kv_local, ffn_local, vocab_local). */
struct layer_weights {
    struct tensor attn_norm, attn_norm_bias; /* (d_model) */
    struct tensor wq, bq;                    /* (n_heads_local * head_dim, d_model), (n_heads_local * head_dim) */
    struct tensor wk, bk;                    /* (n_kv_local * head_dim, d_model), (n_kv_local * head_dim) */
    struct tensor wv, bv;                    /* as wk, bk */
    struct tensor wo, bo;                    /* (d_model, n_heads_local * head_dim), (d_model) */
    struct tensor mlp_norm, mlp_norm_bias;   /* (d_model) */
    struct tensor w_gate, b_gate;            /* (ffn_local, d_model), (ffn_local); gated MLPs only */
    struct tensor w_up, b_up;                /* (ffn_local, d_model), (ffn_local); GPT-2's c_fc */
    struct tensor w_down, b_down;            /* (d_model, ffn_local), (d_model) */
    struct tensor q_norm, k_norm;            /* (head_dim): per-head RMSNorm of q and k (Gemma 3) */
    struct tensor post_attn_norm, post_mlp_norm; /* (d_model): norms of the sublayer outputs (Gemma) */
    struct tensor router;                    /* (n_experts, d_model): mixture of experts only */
    struct tensor exp_gate, exp_up;          /* (n_experts * moe_ffn, d_model), expert by expert */
    struct tensor exp_down;                  /* (n_experts * d_model, moe_ffn), expert by expert */
    struct tensor shared_gate;               /* (1, d_model): Qwen 2 MoE's shared expert's gate */
    struct tensor sinks;                     /* (n_heads_local): GPT-OSS's attention sinks */
    struct tensor router_bias;               /* (n_experts): GPT-OSS */
    struct tensor exp_gate_bias, exp_up_bias; /* (n_experts_local * moe_ffn): GPT-OSS */
    struct tensor exp_down_bias;             /* (n_experts_local * d_model): GPT-OSS */
    struct tensor router_sel_bias;           /* (n_experts), f32: MiniMax-M2's selection bias */
};

struct model_weights {
    int n_layers;                  /* layers of this stage */
    struct tensor tok_embedding;   /* (vocab_local, d_model); first stage, and last when tied */
    struct tensor pos_embedding;   /* (max_positions, d_model); learned positions only */
    struct tensor type_embedding;  /* (type_vocab_size, d_model); encoders (BERT) only */
    struct tensor embed_norm, embed_norm_bias; /* (d_model): the embeddings' LayerNorm (BERT) */
    struct layer_weights *layers;  /* (n_layers), owned */
    struct tensor final_norm, final_norm_bias; /* (d_model); last stage */
    struct tensor lm_head;         /* (vocab_local, d_model); last stage; shares tok_embedding's
                                      data when the embeddings are tied (tied = 1) */
    int tied;                      /* lm_head is tok_embedding (one parameter, two uses) */
};

/* One row of the layout table. */
struct weight_ref {
    enum weight_kind kind;
    int layer;                     /* the global layer index (layer_first + local), -1 outside layers */
    int local_layer;               /* index into layers[], -1 outside layers */
    struct tensor *t;              /* the tensor inside the struct the table was made of */
};

/* Makes the layout table of w: every tensor field of w, in a fixed order (embedding, layers
 * in order with their fields in enum weight_kind order, final norm, LM head), including the
 * absent ones (t->data == NULL) unless present_only. A tied lm_head is never listed (its one
 * parameter is tok_embedding). layer_first is added to local layer indices. Returns the
 * number of rows written to out (at most weights_table_max(w->n_layers)). */
int weights_table(struct model_weights *w, int layer_first, int present_only,
                  struct weight_ref *out);
int weights_table_max(int n_layers);

/* Allocates state shaped like `like` (every present tensor, same shapes) in dtype `dtype`
 * from ONE device allocation carved by the table, zero-filled: the pattern for gradients and
 * optimizer moments (attention sinks are f32 whatever `dtype`: a bf16 compute copy keeps them
 * f32). *mem receives the allocation (free with backend_free); out->layers is
 * owned by out (free with weights_free_layers). STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status weights_alloc_like(struct backend *b, struct model_weights *like, enum dtype dtype,
                               struct model_weights *out, void **mem);
/* Zero-fills every present tensor of w (gradients before accumulation). */
void weights_zero(struct backend *b, struct model_weights *w);
/* Frees w->layers (not tensor data, which belongs to whoever allocated it). Accepts an empty w. */
void weights_free_layers(struct model_weights *w);
/* The number of parameters (elements) of the present tensors of w. */
int64_t weights_numel(struct model_weights *w);

#ifdef __cplusplus
}
#endif

#endif
