/* engine/model/eagle_head.h - the shape of an EAGLE-1 head (Li et al. 2024) beside a target model:
 * one Llama-style decoder layer of the target's widths, whose row at position p reads
 * fc([embed(x_p), f_{p-1}]) (f the target's final hidden state) and whose output is read by the
 * target's own LM head. One owner of that shape for serving (engine/serving/draft.c loads a head)
 * and training (engine/train/eagle_train.c trains one), and of a draft head's token map (the
 * vocabulary its logits cover: --spec-token-map).
 * Not here: the head's weights (its file, or the trainer's initial ones), the forward
 * (model.c's input_fc_*, model_train.c's train_batch.input).
 * Tests: tests/server/test_speculative_eagle*.py (served), tests/test_train_eagle.py (trained). */
#ifndef SHARDLM_EAGLE_HEAD_H
#define SHARDLM_EAGLE_HEAD_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why target t cannot carry an EAGLE head, or NULL when it can. */
const char *eagle_head_unfit(const struct model *t);

/* Fills h (zeroed by the caller, h->w.layers one zeroed layer, h->b set) as the head of target:
 * its configuration (the target's with one Llama-style layer of ffn MLP rows: RMS norms, SwiGLU,
 * full causal attention at 1/sqrt(head_dim), rotary at the target's base and scaling, no biases,
 * no routing; the target's embedding scale and final soft-cap kept), one rank, one layer at the
 * target's last index, and the ends borrowed from `ends` (the target itself, or a whole copy of
 * its ends when the target is sharded): token embeddings, LM head, rotary factors. The layer's
 * weights and the fc are the caller's. */
void eagle_head_shape(struct model *h, const struct model *target, const struct model *ends, int ffn);

/* A draft head's token map (--spec-token-map FILE, serving and training): a JSON array of
 * distinct token ids of [0, vocab), read into *ids (malloc'd, ascending: the order of the cut
 * head's rows) and *n. STATUS_INVALID_ARGUMENT naming the file and the entry otherwise. */
enum status draft_token_map_read(const char *path, int vocab, int32_t **ids, int *n);

#ifdef __cplusplus
}
#endif

#endif
