/* engine/model/model_train.h - the training passes of the model: a forward over packed
 * training sequences that keeps the activations the backward needs, the cross-entropy over the
 * LM head, and model_backward, the mirror of the forward, layer by layer in reverse, which
 * accumulates the gradient of every weight into state laid out like the weights (weights.h).
 * Not here: the data, the optimizer and the loop (engine/train/), the serving forward over the
 * paged KV cache (model.c).
 * Tests: tests/test_train_grad.py (every gradient against JAX on small random Llama, GPT-2
 * and Gemma 3 models), tests/test_train.c.
 *
 * Contracts:
 * - One rank (tp = pp = 1) for now: model_reserve_train refuses other layouts with
 *   STATUS_UNSUPPORTED. The code is written as Megatron's: row-parallel biases join on tp rank
 *   0, the loss is the vocab-parallel cross-entropy's, so that tensor parallelism adds the
 *   collectives and nothing else.
 * - The weights must be writable device memory (model_weights_make_writable) before an
 *   optimizer updates them; the forward and backward only read them.
 * - Activations are kept for every layer of the micro-batch (no recomputation yet): about
 *   T x (10 d + 4 ffn + 3 heads x head_dim) elements per layer for T tokens. */
#ifndef SHARDLM_MODEL_TRAIN_H
#define SHARDLM_MODEL_TRAIN_H

#include "model.h"

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
};

/* Sizes the training activations for micro-batches of at most max_tokens rows (again to
 * grow). STATUS_UNSUPPORTED for tp or pp > 1, STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status model_reserve_train(struct model *m, int max_tokens);

/* Copies every weight that points into the read-only checkpoint mapping (CPU zero-copy
 * loading) into memory the model owns, so that an optimizer may update the weights in place. */
enum status model_weights_make_writable(struct model *m);

/* Forward over tb keeping the activations, then the loss. *loss_sum receives the sum of the
 * per-token losses (natural log) over the unmasked rows, *n_real their number. */
enum status model_forward_train(struct model *m, const struct train_batch *tb, double *loss_sum,
                                int *n_real);

/* The backward of the last model_forward_train (same tb): grads += d(grad_scale x loss_sum) /
 * d(weights), for every present weight; grads was made by weights_alloc_like(m->w) in f32 (or
 * the compute dtype). A tied LM head's gradient joins the embedding's. A tensor of grads with
 * data == NULL is not computed (a frozen weight). */
enum status model_backward(struct model *m, const struct train_batch *tb,
                           struct model_weights *grads);

/* Frees the training activations (model_free calls it). */
void model_train_free(struct model *m);

#ifdef __cplusplus
}
#endif

#endif
