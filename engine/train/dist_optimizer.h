/* engine/train/dist_optimizer.h - Megatron's distributed optimizer (ZeRO-1) over the
 * data-parallel group: the gradients of a replica, laid out as one flat f32 buffer, are
 * reduce-scattered so that dp rank r holds the summed gradients of the r-th 1/dp of it; each
 * rank keeps the AdamW moments of its shard only and updates the parameter elements of its
 * shard; the updated parameters are all-gathered back into every replica. Per parameter, the
 * moments cost 8 / dp bytes instead of 8; with mixed precision the f32 masters are sharded
 * too (dist_optimizer_shard_masters): 6 + 12 / dp bytes per parameter with bf16 weights
 * instead of 18, as Megatron's. The shard boundaries cut tensors anywhere: a tensor is updated in
 * pieces by the ranks that own them (AdamW is elementwise, so the update is the same).
 * Not here: the global norm's reduction over tp and pp (train_parallel.c), the schedule.
 * Tests: tests/test_train_parallel.sh (dp 2 x tp 2 with the distributed optimizer against one
 * rank), the checkpoint round trip there. */
#ifndef SHARDLM_DIST_OPTIMIZER_H
#define SHARDLM_DIST_OPTIMIZER_H

#include "optimizer.h"
#include "parallel.h"

struct dist_piece {
    size_t row;                /* the parameter table's row */
    int64_t lo, hi;            /* its elements [lo, hi) of the flat buffer, inside this shard */
    int64_t start;             /* where the row starts in the flat buffer */
};

struct dist_optimizer {
    struct optimizer_options o;
    struct comm *dp;           /* borrowed */
    struct backend *b;         /* borrowed */
    int64_t shard, padded;     /* elements of a shard, of the flat buffer (dp x shard) */
    void *flat_mem;            /* the gradients' flat buffer (owned): the grads table points in */
    struct tensor flat;        /* f32 (padded) */
    void *mem;                 /* shard scratch and moments */
    struct tensor buf, m, v;   /* f32 (shard) each */
    struct dist_piece *pieces;
    size_t n_pieces;
    int64_t *starts;           /* (n_rows): where each row starts in the flat buffer */
    size_t n_rows;
    struct tensor acc;         /* f32 (1): sum of squares */
    int64_t step;
    /* Mixed precision (dist_optimizer_shard_masters): the f32 masters of this rank's shard only,
     * and the compute copy (bf16 / fp16) the all-gathered values are rounded into. */
    void *master_mem;
    struct tensor master;      /* f32 (shard) */
    const struct param_table *compute; /* borrowed; NULL: the parameters are the f32 weights */
    /* Expert parallelism: the experts' rows are this second part's, sharded over the experts'
     * data-parallel group (dp / ep ranks that hold the same experts), and starts[] of this part
     * is -1 for them (and the other way round). Every function does both parts. */
    struct dist_optimizer *experts;
};

/* Lays the gradients of grads (a table whose tensors were carved from one allocation, e.g.
 * weights_alloc_like) out in a new flat buffer of dp x shard elements, re-pointing every
 * tensor of the table (and so the struct they belong to) into it, and frees *grads_mem (which
 * becomes the flat buffer, owned by d: set *grads_mem to NULL). Allocates this rank's moments.
 * expert_rows (NULL: none): rows (1) that are a mixture's experts under expert parallelism,
 * sharded over edp in a part of their own (d->experts); the others over dp. */
enum status dist_optimizer_init(struct dist_optimizer *d, struct backend *b, struct comm *dp,
                                const struct param_table *params, struct param_table *grads, void **grads_mem,
                                const struct optimizer_options *o, struct comm *edp, const unsigned char *expert_rows);
void dist_optimizer_free(struct dist_optimizer *d);

/* Reduce-scatter of the gradients over dp: this rank's shard, summed, in d->buf. */
enum status dist_optimizer_reduce(struct dist_optimizer *d);
/* The sum of squares of this rank's shard of the counted gradients (grads.p[].counted). */
double dist_optimizer_sumsq(struct dist_optimizer *d, const struct param_table *grads);
/* AdamW on this rank's shard of params, then the all-gather that gives every replica the whole
 * updated parameters (through the flat buffer: the gradients are gone afterwards). */
enum status dist_optimizer_step(struct dist_optimizer *d, const struct param_table *params, double lr,
                                double grad_norm, double unscale);
/* Mixed precision: keeps the f32 masters of this rank's shard (copied from the whole masters
 * params, which the caller may free afterwards) and from then on writes each step's
 * all-gathered values into compute (row for row with params) rounded to its dtype, so that no
 * rank holds whole f32 masters: with bf16 weights, 6 + 12 / dp bytes per parameter plus the
 * f32 gradients. Local. */
enum status dist_optimizer_shard_masters(struct dist_optimizer *d, const struct param_table *params,
                                         const struct param_table *compute);
/* The whole masters for a checkpoint into rows (f32 tensors shaped like the parameters), all-
 * gathered over dp (through the flat buffer). A collective over dp. */
enum status dist_optimizer_gather_masters(struct dist_optimizer *d, const struct param_table *rows);

/* Whole moments for a checkpoint: full (made by optimizer_init for params) receives every
 * element's moments, all-gathered over dp. A collective over dp. */
enum status dist_optimizer_gather_state(struct dist_optimizer *d, struct optimizer *full);
/* The inverse, on resume: this rank's shard of full's moments. Local. */
void dist_optimizer_scatter_state(struct dist_optimizer *d, const struct optimizer *full);

#endif
