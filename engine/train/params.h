/* engine/train/params.h - the trained parameters as a flat table: a name and a tensor per row,
 * and whether weight decay applies. The optimizer, the gradient norm and the training state
 * file work on tables, so that full fine-tuning (every present weight of the layout table,
 * weights.h) and LoRA (the adapters' A and B, lora.h) share one optimizer and one checkpoint
 * format. Two tables describe the same parameters when their rows match one for one (params
 * and their gradients; the moments are made like the params).
 * Not here: the tensors' memory (whoever made the tensors owns it).
 * Tests: tests/test_train_step.py, tests/test_train.sh. */
#ifndef SHARDLM_TRAIN_PARAMS_H
#define SHARDLM_TRAIN_PARAMS_H

#include "weight_names.h"
#include "weights.h"

struct param {
    char           name[96];  /* "q/3" (kind/layer) for weights, "lora/q/3/A" for adapters */
    struct tensor *t;         /* borrowed */
    int            decay;     /* AdamW weight decay applies (matrices; not biases and norms) */
    int            kind;      /* enum weight_kind for weights, -1 for adapters */
    int            layer;     /* the global layer of a per-layer weight, else -1 */
    int            counted;   /* 1: its gradient counts in the global norm on this rank; 0 for a
                                 copy another rank counts (a tp-replicated weight off tp rank 0,
                                 the last stage's tied embedding) */
    int            tp_partial;/* its gradient is this rank's part of a sum over tp (all-reduced
                                 after the backward): LoRA's lora_ranks_mark sets it */
};

struct param_table {
    struct param *p;          /* (n), owned */
    size_t n, cap;
};

/* Whether p is a mixture's expert weight (stacked expert by expert: a rank holds a block of whole
 * experts, and under expert parallelism its gradient is reduced over the experts' own dp group). */
static inline int param_is_expert(const struct param *p)
{
    return p->kind >= 0 && weight_kind_per_expert((enum weight_kind)p->kind);
}

enum status param_table_add(struct param_table *pt, const char *name, struct tensor *t, int decay);
/* Every present tensor of w in layout-table order, named "kind/layer" (layer -1 outside the
 * layers), decay on 2-D tensors. */
enum status param_table_from_weights(struct param_table *pt, struct model_weights *w, int layer_first);
void param_table_free(struct param_table *pt);
int64_t param_table_numel(const struct param_table *pt);

#endif
