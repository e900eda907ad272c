/* engine/model/model_train_impl.h - private to model_train.c and model_train_mem.c: what the
 * training passes keep between forward and backward, and how it is laid out in memory.
 *
 * Per layer, each tensor is either the layer's own (kept from forward to backward) or shared
 * by every layer (a recomputed module's insides: written by each layer's forward, thrown away,
 * and written again by the recomputation just before that layer's backward reads it). Which
 * tensors are shared follows struct train_memory (model_train.h). Under sequence parallelism
 * the residual-stream tensors (x_in, xn1, attn_out, x_mid, xn2, mlp_out) hold this rank's
 * T / tp rows; the tensor-parallel region (q .. hact) holds all T rows of its heads / columns. */
#ifndef SHARDLM_MODEL_TRAIN_IMPL_H
#define SHARDLM_MODEL_TRAIN_IMPL_H

#include "model_train.h"
#include "moe.h"

/* What one layer keeps from its forward for its backward. (T = max_tokens rows; Tl = local.) */
struct layer_acts {
    struct tensor x_in;        /* (Tl, d): the layer's input, the residual stream */
    struct tensor xn1;         /* (Tl, d): attention norm of x_in */
    struct tensor q_pre, k_pre;/* (T*heads_local, hd), (T*kv_local, hd): q, k before the QK norm */
    struct tensor q, k, v;     /* (T, heads_local|kv_local, hd): as attention read them */
    struct tensor att;         /* (T, heads_local, hd): attention output */
    struct tensor lse;         /* f32 (T, heads_local): its log-sum-exp */
    struct tensor attn_out;    /* (Tl, d): output projection, before the sandwich norm */
    struct tensor x_mid;       /* (Tl, d): x_in + attention block */
    struct tensor xn2;         /* (Tl, d): MLP norm of x_mid */
    struct tensor gate, up;    /* (T, ffn_local): before the activation */
    struct tensor hact;        /* (T, ffn_local): act(gate) * up, or act(up) */
    struct tensor mlp_out;     /* (Tl, d): down projection, before the sandwich norm */
    /* A mixture of experts (moe.h; absent otherwise): the routing, always kept (ids, w, sw on
     * the device, route on the host), and the experts' insides per slot (moe.gate, up, hact:
     * (T * k, moe_ffn); moe.y (T * k, d); moe.s_y (T, d), the shared expert's output; recomputed
     * under the mlp module). moe.s_gate .. s_hact are gate .. hact above (the shared expert's).
     * Under expert parallelism moe.gate .. hact hold the rows this rank's experts ran on
     * (moe_ep_rows) and moe.xr their inputs (kept under the mlp module, recomputed with the layer). */
    struct moe_tensors moe;
    struct moe_routing route;
};

/* One set of activations: one micro-batch in flight. */
struct train_activations {
    int max_tokens;                /* T */
    void *mem;                     /* one device allocation */
    size_t bytes;                  /* its size */
    struct layer_acts *layers;     /* (n_layers_local) */
    struct tensor x_final, h_final;/* (Tl, d): the residual stream / after the final norm */
    /* backward scratch, and sequence parallelism's full-row buffers */
    struct tensor dres, dtmp;      /* (Tl, d) */
    struct tensor dxn;             /* (T, d): column-parallel input gradients (partial sums) */
    struct tensor gath, dfull;     /* (T, d): all-gathered rows; row-parallel partial outputs and
                                      all-gathered output gradients (sequence parallel only) */
    struct tensor dq, datt;        /* (T, heads_local * hd) */
    struct tensor dk, dv;          /* (T, kv_local * hd) */
    struct tensor qk_full, qk_dfull;/* (T, n_heads * hd): q or k before the QK norm and its gradient,
                                      gathered over tp (QK_NORM_FULL at tp > 1 only: layer_qk_norm) */
    struct tensor dgate, dup;      /* (T, ffn_local), or (T, max(ffn_local, moe_ffn)) */
    /* a mixture of experts: the router's logits and one expert's rows (forward scratch: T rows,
     * moe.h), the shared expert's rows 0 .. T-1, and moe_backward's scratch */
    struct tensor moe_logits, moe_logits32, moe_x, moe_rows;
    struct tensor ep_buf, ep_in, ep_out, ep_idx; /* expert parallelism's scratch (moe.h), or absent */
    struct moe_grad_scratch moe_grad;
    /* loss */
    struct tensor stats;           /* f32 (T, 3): this shard's cross-entropy statistics */
    struct tensor stats_all;       /* f32 (tp * T, 3): every shard's */
    struct tensor loss, lse;       /* f32 (T) */
    float *host_loss;              /* (T) */
    struct tensor tokens, targets, positions; /* i32 (T) */
    struct tensor doc_start;       /* i32 (T + 1) */
};

/* The training passes' state (model_train.h): the model they run on (borrowed), the memory
 * plan, the activation sets and the one in use, the trained adapters and the per-layer hook. */
struct model_train {
    struct model *m;
    struct train_memory mem;
    struct train_activations **sets; /* (n_sets + 1): the last holds the memory all sets share */
    int n_sets;
    struct train_activations *a;     /* the set the next pass uses */
    struct lora *lora;               /* borrowed, or NULL */
    float moe_aux_coeff, moe_z_coeff; /* model_train_set_moe_loss */
    void *moe_host;                  /* the host memory of every set's routing and the scratch */
    int32_t *ep_host;                /* in it: expert parallelism's host index lists (moe.h), or NULL */
    int moe_forwards;                /* model_train_moe_stats's sums since its last call */
    double moe_aux_sum, moe_z_sum;
    int64_t *moe_load;               /* (n_layers_local, n_experts) */
    void (*layer_done)(void *ctx, int layer);
    void *hook_ctx;
};

/* Whether layer l (local) recomputes everything from its input in backward, and the first
 * local layer of its recomputation chunk (full recomputation; model_train_mem.c). */
int train_layer_full(const struct model_train *t, int l, int *chunk_first, int *chunk_last);
/* Adds the current set's routing (the forward just run) to model_train_moe_stats's sums. */
void train_moe_count(struct model_train *t);
/* Sequence parallelism in effect (asked for, and tp > 1). */
int train_sp(const struct model_train *t);

#endif
