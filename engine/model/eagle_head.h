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

/* The tensors of an EAGLE-1 head file, under EAGLE's names, for head h (its shape set): fc.weight
 * first ((d, 2d): each row the embedding's columns, then the feature's; t NULL, its halves are
 * h->input_fc_emb and h->input_fc_feat), then fc.bias (optional in a file) and the layer's. One
 * owner of the format for loading (draft.c), training and saving (eagle_train.c). */
enum { EAGLE_HEAD_TENSORS = 10 };
struct eagle_head_tensor {
    const char *name;
    int64_t rows, cols;            /* cols 0: a vector */
    struct tensor *t;
    int optional;
};
void eagle_head_tensors(struct model *h, struct eagle_head_tensor out[EAGLE_HEAD_TENSORS]);

struct safetensors;
/* Tensor `want` of an open head file as f32 rows in *host (grown to fit; the caller frees),
 * its shape checked. *absent = 1 (and STATUS_OK) for an optional tensor the file lacks.
 * STATUS_INVALID_ARGUMENT otherwise, the message opening with `what` (the flag and file) and
 * naming `who` needs the shape ("the served model", "the head"). */
enum status eagle_head_read(const struct safetensors *st, const char *what, const char *who,
                            const struct eagle_head_tensor *want, float **host, int *absent);
/* fc.weight's rows (d, 2d) into its two halves W_e, W_f (d, d) each. */
void eagle_head_fc_split(const float *fc, int64_t d, float *w_emb, float *w_feat);

/* A draft head's token map (--spec-token-map FILE, serving and training): a JSON array of
 * distinct token ids of [0, vocab), read into *ids (malloc'd, ascending: the order of the cut
 * head's rows) and *n. STATUS_INVALID_ARGUMENT naming the file and the entry otherwise. */
enum status draft_token_map_read(const char *path, int vocab, int32_t **ids, int *n);

/* The token map a head file carries (`shardlm train --eagle-head --spec-token-map` writes it as
 * EAGLE_HEAD_TOKEN_MAP: int32, the ids ascending), so that serving the head needs no
 * --spec-token-map. Into *ids (malloc'd) and *n; *ids NULL and *n 0 when the file has none.
 * STATUS_INVALID_ARGUMENT, the message opening with `what`, for a tensor that is not one (not
 * 1-D int32, empty, an id outside [0, vocab), not ascending). */
#define EAGLE_HEAD_TOKEN_MAP "token_map"
enum status eagle_head_token_map(const struct safetensors *st, const char *what, int vocab, int32_t **ids, int *n);

#ifdef __cplusplus
}
#endif

#endif
