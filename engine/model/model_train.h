/* engine/model/model_train.h - the training passes of the model: a forward over packed
 * training sequences that keeps the activations the backward needs, the cross-entropy over the
 * LM head, and model_backward, the mirror of the forward, layer by layer in reverse, which
 * accumulates the gradient of every weight into state laid out like the weights (weights.h).
 * Not here: the data, the optimizer and the loop (engine/train/), the serving forward over the
 * paged KV cache (model.c).
 * Tests: tests/test_train_moe.py (mixtures of experts against JAX + optax),
 * tests/test_train_grad.py (every gradient against JAX on small random Llama, GPT-2
 * and Gemma 3 models), tests/test_train.c.
 *
 * Contracts:
 * - Parallelism as Megatron's: with tp > 1 the column- and row-parallel products of serving
 *   with their conjugate collectives in backward (an all-reduce of the column-parallel inputs'
 *   gradients; none for the row-parallel outputs' gradients), the vocab-parallel embedding and
 *   the vocab-parallel cross-entropy (each rank its shard of the logits; the per-row statistics
 *   gathered, never the logits). Every rank of a tp group calls every function with the same
 *   batch. Sequence parallelism (struct train_memory) splits the norm and residual regions
 *   along the rows: all-gather before the column-parallel products, reduce-scatter after the
 *   row-parallel ones, forward and backward. With pp > 1 each stage runs its layers; the
 *   caller moves the stage boundary (model_train_boundary) between stages.
 * - Gradients of weights that every tp rank holds but sees only part of the rows or heads of
 *   (model_train_grad_partial: the QK norms; with sequence parallelism every norm and the
 *   learned positions) are this rank's part: the caller all-reduces them over tp.
 * - The weights must be writable device memory (model_weights_make_writable) before an
 *   optimizer updates them; the forward and backward only read them.
 * - Activations are kept per layer unless recomputed (struct train_memory); the formula of
 *   what is kept is in docs/training.md. */
#ifndef SHARDLM_MODEL_TRAIN_H
#define SHARDLM_MODEL_TRAIN_H

#include "model.h"

struct lora;

#ifdef __cplusplus
extern "C" {
#endif

/* One micro-batch of packed training sequences, in host memory. Row i predicts targets[i]
 * (the next token of its document, or -1: no loss on that row, e.g. a prompt token, padding,
 * or a document's last token). positions restart at 0 for each document; attention never
 * crosses documents. */
struct train_batch {
    int            n_tokens;
    const int32_t *tokens;     /* (n_tokens) */
    const int32_t *targets;    /* (n_tokens), -1 = masked */
    const int32_t *positions;  /* (n_tokens), position within the row's document */
    int            n_docs;
    const int32_t *doc_start;  /* (n_docs + 1): row offsets of the documents, 0 .. n_tokens */
    float          grad_scale; /* the loss whose gradient is taken is grad_scale x the summed
                                  per-token loss: loss_scale / (real tokens of the global batch)
                                  gives Megatron's per-token mean over the whole batch */
    int            dropout;    /* training: LoRA dropout masks are drawn (lora.h), keyed by */
    int64_t        step;       /* the optimizer step and */
    int            micro;      /* the micro-batch's index in the global batch; 0: evaluation */
    float          aux_scale;  /* a mixture of experts: the gradient taken is also that of
                                  aux_scale x the auxiliary losses of this micro-batch's layers
                                  (model_train_set_moe_loss): loss_scale / (micro-batches of the
                                  global batch) gives Megatron's mean over the micro-batches */
    const struct tensor *input; /* one rank: the first layer's input rows (n_tokens, d_model) in
                                  the compute dtype, on the device, in place of the embedding
                                  (an EAGLE head's fc output, eagle_train.h); NULL: the embedding.
                                  After model_backward, model_train_boundary_grad holds their
                                  gradient, and no embedding gradient is taken */
    int            hidden_only; /* the forward stops after the final norm: no loss
                                  (model_train_final_hidden; a frozen target's features) */
    const struct tensor *extra_grad; /* one rank: (n_tokens, d_model) in the compute dtype, on the
                                  device, added by model_backward to the gradient of the rows
                                  after the final norm: a loss on them that the caller computes
                                  (an EAGLE head's feature regression); NULL: none */
};

/* Modules whose insides selective recomputation recomputes (Megatron's --recompute-modules). */
enum train_recompute_module {
    TRAIN_RECOMPUTE_CORE_ATTN = 1u, /* the attention kernel: its log-sum-exp (q, k, v and the
                                       output, the projection's input, stay) */
    TRAIN_RECOMPUTE_MLP = 2u,       /* gate, up and the activation, from the normed input */
    TRAIN_RECOMPUTE_LAYERNORM = 4u, /* the two pre-norms' outputs, from their inputs */
};

enum train_recompute {
    TRAIN_RECOMPUTE_NONE,
    TRAIN_RECOMPUTE_SELECTIVE,      /* the modules of `modules`, every layer */
    TRAIN_RECOMPUTE_UNIFORM,        /* full: chunks of num_layers layers keep only their input */
    TRAIN_RECOMPUTE_BLOCK,          /* full: the first num_layers layers of the stage keep only
                                       their input; the others keep everything */
};

/* How the training passes spend memory. */
struct train_memory {
    enum train_recompute recompute;
    unsigned modules;               /* selective: enum train_recompute_module bits */
    int num_layers;                 /* uniform / block */
    int sequence_parallel;          /* tp > 1 only; batches' rows must be a multiple of tp */
    int sets;                       /* activation sets: micro-batches in flight (>= 1) */
};

/* The training passes' state, owned by the caller (the trainer), never by the model: the
 * activation sets sized for micro-batches of at most max_tokens rows under a memory plan (NULL:
 * one set, nothing recomputed), the trained adapters and a per-layer hook. The model is
 * borrowed and must outlive it; several may exist for one model. STATUS_INVALID_ARGUMENT for a
 * plan that does not fit the model (rows not a multiple of model_train_row_multiple,
 * num_layers out of range), STATUS_UNSUPPORTED for a tp the training passes cannot run (a
 * vocabulary or KV heads that do not split evenly), STATUS_RESOURCE_EXHAUSTED when out of
 * memory. */
struct model_train;
enum status model_train_new(struct model *m, int max_tokens, const struct train_memory *mem,
                            struct model_train **out);
void model_train_free(struct model_train *t);
struct model *model_train_model(const struct model_train *t);

/* The one owner of the rule "a micro-batch's rows are a multiple of tp under sequence
 * parallelism": the multiple (tp, or 1). The trainer pads micro-batches to it; the passes
 * refuse others. */
int model_train_row_multiple(const struct model *m, const struct train_memory *mem);

/* The adapters the passes apply and train (lora.h; borrowed, NULL: none). */
void model_train_set_lora(struct model_train *t, struct lora *lora);
/* Called by model_backward after each layer's backward (local layer index), when set: the
 * trainer starts that layer's data-parallel gradient reduction there, overlapping it with the
 * backward of the layers below. NULL: none. */
void model_train_set_layer_hook(struct model_train *t, void (*fn)(void *ctx, int layer), void *ctx);

/* A mixture of experts: the coefficients of Megatron's load-balancing loss and router z-loss
 * (--moe-aux-loss-coeff, --moe-z-loss-coeff; moe.h defines both), 0 and 0 until set. */
void model_train_set_moe_loss(struct model_train *t, float aux_coeff, float z_coeff);
/* The routing of every model_forward_train since the last call (zeros for a dense model), and
 * the sums restart: returns the number of those forwards; *aux, *z receive their load-balancing
 * and z losses summed over the forwards and this stage's layers, without coefficients, and,
 * when load is not NULL, load (n_layers_local, n_experts) += the tokens routed to each expert. */
int model_train_moe_stats(struct model_train *t, double *aux, double *z, int64_t *load);

/* Picks the activation set the next forward writes and the next backward reads (0 ..
 * sets - 1): a pipeline keeps one per micro-batch in flight. */
void model_train_use_set(struct model_train *t, int set);
int model_train_n_sets(const struct model_train *t);
/* Device bytes of the training activations (all sets). */
size_t model_train_activation_bytes(const struct model_train *t);

/* The stage boundary of the current set, (rows, d) with rows = n_tokens (n_tokens / tp under
 * sequence parallelism): before model_forward_train on a stage after the first, the caller
 * writes the previous stage's output into model_train_boundary; after it, on a stage before
 * the last, the stage's output is there. Before model_backward on a stage before the last,
 * the caller writes the gradient of that output into model_train_boundary_grad; after it, on a
 * stage after the first, the gradient of the stage's input is there. */
struct tensor model_train_boundary(struct model_train *t, int n_tokens);
struct tensor model_train_boundary_grad(struct model_train *t, int n_tokens);

/* The last forward's rows after the final norm, (n_tokens, d_model) in the compute dtype (last
 * stage, tp 1): what the LM head read (a model without a final norm: the residual stream). */
struct tensor model_train_final_hidden(struct model_train *t, int n_tokens);

/* The one owner of "which weights' gradients are a per-rank part to all-reduce over tp" (see
 * the contracts above; the adapters' rule is lora_grad_partial in lora.h). */
int model_train_grad_partial(const struct model_train *t, enum weight_kind kind);

/* Copies every weight that points into the read-only checkpoint mapping (CPU zero-copy
 * loading) into memory the model owns, so that an optimizer may update the weights in place. */
enum status model_weights_make_writable(struct model *m);
/* Frees the memory behind t, one of the model's own weight allocations (made writable above),
 * and leaves t->data NULL; returns the bytes freed (0 when t did not own an allocation of the
 * model). The trainer's distributed optimizer drops the whole f32 masters this way. */
size_t model_release_weight(struct model *m, struct tensor *t);

/* Forward over tb keeping the activations, then the loss (last stage). *loss_sum receives the
 * sum of the per-token losses (natural log) over the unmasked rows, *n_real their number (0
 * and 0 on other stages). STATUS_UNAVAILABLE when a collective fails. */
enum status model_forward_train(struct model_train *t, const struct train_batch *tb, double *loss_sum,
                                int *n_real);

/* The backward of the last model_forward_train (same tb): grads += d(grad_scale x loss_sum) /
 * d(weights), for every present weight; grads was made by weights_alloc_like(m->w) in f32 (or
 * the compute dtype). A tied LM head's gradient joins the embedding's. A tensor of grads with
 * data == NULL is not computed (a frozen weight). */
enum status model_backward(struct model_train *t, const struct train_batch *tb,
                           struct model_weights *grads);

#ifdef __cplusplus
}
#endif

#endif
