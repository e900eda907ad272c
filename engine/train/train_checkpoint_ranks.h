/* engine/train/train_checkpoint_ranks.h - private to train_checkpoint*.c: training checkpoints
 * across ranks. Saving at tp x pp x dp gathers every canonical tensor (the model's weights, the
 * AdamW moments and, when kept, the f32 masters) from the dp-rank-0 replica onto world rank 0,
 * which then writes the one-rank files from host memory; loading cuts each rank's (tp_rank,
 * tp_size) slice out of the canonical state tensors with the weights' slice geometry
 * (checkpoint_describe), so that any layout resumes any other.
 * Not here: the files themselves and the one-rank save (train_checkpoint.c).
 * Tests: tests/test_train_ckpt_parallel.c (under mpirun -n 4), tests/test_train.sh (one rank). */
#ifndef SHARDLM_TRAIN_CHECKPOINT_RANKS_H
#define SHARDLM_TRAIN_CHECKPOINT_RANKS_H

#include <stdint.h>

#include "model.h"
#include "optimizer.h"
#include "params.h"
#include "safetensors.h"

/* One canonical tensor (checkpoint.h's layout) of the whole model. */
struct ckpt_canon {
    enum weight_kind kind;
    int layer;                 /* global layer; -1 for whole-model weights */
    int stage;                 /* the pipeline stage that holds it (the first for a tied embedding) */
    int ndim;                  /* 1 or 2 */
    int64_t rows, cols;        /* canonical shape; cols 1 for vectors */
    float *w, *m, *v, *master; /* rank 0 only: (rows, cols) host copies of the model weight, the
                                  two moments, and the f32 master (with_master), else NULL */
};

/* What world rank 0 holds after a gather. Rank 0 keeps the whole model and its state in host
 * memory: 3 (4 with masters) f32 copies of every parameter. Other ranks hold the list only. */
struct ckpt_gathered {
    struct ckpt_canon *t;      /* (n) in weights_table order of a whole model, owned */
    int n;
    float *mem;                /* rank 0: one host allocation behind every w, m, v, master */
    float norm_weight_offset;  /* taken off norm weights again by the source (model_source) */
    /* Rank 0: the state as write_state wants it, all host tensors: tensors (3n) holds the
     * masters (with_master; else the weights) at [0, n), exp_avg at [n, 2n), exp_avg_sq at
     * [2n, 3n); params names the first n "kind/layer". */
    struct tensor *tensors;
    struct param_table params;
};

/* Whether m is one shard of a model split over several ranks (a world of more than one). */
int ckpt_multi_rank(const struct model *m);

/* A collective over m->par.world: every rank passes its local shard (master: m's f32 master
 * weights; params: param_table_from_weights of master, every row "kind/layer"; opt: their
 * moments). Ranks of dp rank 0 send their slices to world rank 0 over world->control in the
 * canonical (kind, layer) order, then tp rank order; a slice that repeats an earlier tp rank's
 * (replicated norms and biases, shared K/V heads) is sent once. Every rank returns the same
 * status; on error nothing is held (ckpt_gathered_free is still safe). */
enum status ckpt_gather(struct model *m, struct model_weights *master, const struct param_table *params,
                        struct optimizer *opt, int with_master, struct ckpt_gathered *g);
/* checkpoint_source_fn over a gather's weights (rank 0): ctx is the struct ckpt_gathered. */
enum status ckpt_gathered_source(void *ctx, enum weight_kind kind, int layer, float *dst, int64_t n);
void ckpt_gathered_free(struct ckpt_gathered *g); /* accepts a zeroed struct */

/* Parses a parameter name "kind/layer" (params.h); 0 when the name is not a weight's (LoRA). */
int ckpt_param_kind(const char *name, enum weight_kind *kind, int *layer);

/* The slice of canonical state tensor t (f32, named name in the file path) that belongs to
 * (kind, layer) of ck at (tp_rank, tp_size), into dst (n elements: the local tensor's size),
 * vocab padding rows zero. STATUS_BAD_FORMAT with a message when t is not f32 or does not have
 * the canonical shape, or the local tensor is not the slice's size. */
enum status ckpt_state_slice(struct checkpoint *ck, const struct st_tensor *t, const char *path, enum weight_kind kind,
                             int layer, int tp_rank, int tp_size, float *dst, int64_t n);

#endif
