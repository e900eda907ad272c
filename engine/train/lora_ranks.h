/* engine/train/lora_ranks.h - LoRA training across ranks: the trained parameters' flags for the
 * reductions, and the checkpoint gathered onto world rank 0.
 * Not here: the adapters' slices and their forward/backward (lora.c), the schedule
 * (train_parallel.c). Tests: tests/test_train_parallel.sh (LoRA at tp 2 and dp 2 against one
 * rank: losses, and the PEFT files). */
#ifndef SHARDLM_LORA_RANKS_H
#define SHARDLM_LORA_RANKS_H

#include "lora.h"
#include "optimizer.h"
#include "params.h"
#include "train_checkpoint.h"

/* Marks the adapter rows of params (and of grads, row for row): the gradients that are per-rank
 * parts to all-reduce over tp (a column-parallel target's A: every rank adds the product of its
 * output slice; a row-parallel target's B: every rank's input slice), and which copies count in
 * the global norm (the replicated ones on tp rank 0 only). Local. */
void lora_ranks_mark(const struct model *m, struct param_table *params, struct param_table *grads);

/* The adapter's checkpoint from a job of several ranks: every slice of A, B and their AdamW
 * moments goes to world rank 0 (replica 0's ranks send), which assembles the whole adapter and
 * writes exactly what a one-rank run writes (PEFT files + training state). A collective over
 * the world; every rank returns the same status. */
enum status lora_ranks_save(const char *dir, struct model *m, const struct lora *l, const char *base_model,
                            const struct param_table *params, struct optimizer *opt, const struct train_state *st);

#endif
