/* engine/model/step_graph.h - a step's inputs uploaded in one copy, its block table as wide as it
 * needs (step_upload, step_table), and decode steps run from backend graphs (ops.h
 * backend_graph_*): the ops of a step, from the token embedding to the LM head, recorded once
 * per shape and replayed in one launch (CUDA graphs: a decode step of a 1B model is ~200
 * kernels, each a few microseconds to launch, against under a millisecond of weight reads). Private to
 * engine/model/.
 * A graph replays every value passed by value as it was recorded, so a step takes one only when
 * all of them are the same: one rank (tp = pp = ep = 1, no communication inside), a decode step
 * (one new row per sequence), no adapter, no mixture of experts, no EAGLE features, hidden states
 * or other head, no draft rows; and the key holds the rest: the KV pool, the sequences, the
 * logits rows, the block table's width and max_seq_len, rounded up to a power of two in blocks
 * (attention's split count; a bound above every seq_len is correct, only slower), the width the
 * block table is uploaded with (step_table). A key is run
 * op by op the first time it is seen (scratch areas grow to its needs), captured the second (its
 * first launch checked against the same step run op by op right after: logits off by more than
 * GRAPH_VERIFY_TOL turn graphs off for good, with a warning), replayed after that; at most STEP_GRAPHS_MAX are kept (the least recently used goes).
 * Batch sizes are padded to buckets (step_graph_pad: 1, 2, 4, 8, then multiples of 8, as far as
 * the workspace holds), so that a server whose batch size moves every step replays a few graphs
 * instead of capturing one per size; the padded rows write no KV and their logits are not read.
 * Tests: tests/test_step_graph.c (the CPU backend's recording mirror against steps run op by
 * op, bit for bit); on a GPU tools/gpu_check.sh. */
#ifndef SHARDLM_STEP_GRAPH_H
#define SHARDLM_STEP_GRAPH_H

#include "model.h"

#define STEP_GRAPHS_MAX 64

struct step_graph_key {
    const void *pool;        /* the cache's first K pool */
    int64_t     pool_blocks; /* and its blocks */
    int         n_seqs, n_logits, max_blocks, max_seq_len;
};

/* Reads SHARDLM_GRAPHS once (model_reserve): an unknown value is refused by name. */
enum status step_graphs_setup(struct model *m);
void        step_graphs_free(struct model *m); /* every graph, and the state */
/* Drops every graph (the workspace moved); the state stays. */
void        step_graphs_drop(struct model *m);
/* The batch a decode step of fb's n sequences runs a graph at: fb itself, or fb padded to its
 * bucket in *out (arrays of the model's): the padded sequences repeat the last one's token and
 * block table with one cached token (seq_len 1, position 0: they read that sequence's first
 * cached row), write no KV (slot -1) and ask for their own logits rows after fb's. Only where
 * the step may take a graph, and every sequence wants its logits row; the caller's step reads
 * its first fb->n_logits logits rows as before. */
const struct forward_batch *step_graph_pad(struct model *m, const struct forward_batch *fb, struct forward_batch *out);
/* 1 when the step may run from a graph (see above); then *key is its key, ab->max_seq_len the
 * table's reach (ab->max_blocks, step_table's width, in tokens) and ab->row_path NULL (its marks
 * are all 0). */
int         step_graph_fits(struct model *m, const struct kv_cache *cache, const struct forward_batch *fb,
                            struct attention_batch *ab, struct step_graph_key *key);
/* The block table a step uploads and its width (*width): the caller's rows cut to the step's
 * longest sequence's blocks, rounded up to a power of two (a server's rows span the whole
 * context: 8,192 blocks of a 128k one, 32 KB a sequence every step), in a host buffer of the
 * model's; the caller's own when that is no narrower and nothing is padded. Rows at or past real
 * (fb's sequences before step_graph_pad) repeat row real - 1, which fb->block_table ends with.
 * Entries past a row's blocks are never read (attention reads seq_len's blocks). */
const int32_t *step_table(struct model *m, const struct forward_batch *fb, int real, int block_tokens,
                          int max_seq_len, int *width);
/* The bucket of a batch of n sequences (step_graph_pad), at most cap (and at least n). */
int step_graph_bucket(int n, int cap);
/* The step's inputs (tokens, positions, slots, logits rows, q_start, seq_len and the block table
 * `width` wide) into the workspace in one upload: they lie together there (model_reserve's
 * table), and are packed into a host buffer of the model's at the same offsets. */
void step_upload(struct model *m, const struct forward_batch *fb, const int32_t *table, int width);
/* Runs body(ctx) (the step's ops: nothing in it may upload, download or synchronize) for key: op
 * by op, or recorded and replayed. Returns body's status. */
enum status step_graph_run(struct model *m, const struct step_graph_key *key, enum status (*body)(void *ctx),
                           void *ctx);

#endif
