/* engine/serving/scheduler.h - continuous batching for one replica: the waiting queue (in
 * arrival order, preempted sequences at its front), the admission policy (FCFS, fair between
 * clients, or by priority), the running set, admission under a token budget,
 * preemption by recomputation when the KV pool runs dry, prefix-block reuse, and the rows of
 * the next step (struct step_batch).
 * Not here: requests, text and events (request.c), the forward pass and the plan broadcast
 * (conductor.c), the block pool itself (engine/model/kv_cache.c).
 * Tests: tests/test_scheduler.c (without a model: a CPU KV pool of tiny blocks),
 * tests/test_engine.c (with one).
 *
 * Threads: a scheduler belongs to one thread (the conductor's engine thread); nothing here
 * locks. Ownership: sequences handed to scheduler_enqueue belong to the scheduler until
 * scheduler_drop_finished frees them (after the caller marked them SEQ_DONE); the KV cache is
 * borrowed and must outlive the scheduler. */
#ifndef SHARDLM_SCHEDULER_H
#define SHARDLM_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#include "kv_cache.h"
#include "request.h"

/* The rows of one step, in planning order (every array carved for the largest step). */
struct step_batch {
    int32_t *tokens, *pos, *slots; /* (max_batch_tokens) token id, position, KV slot of each row */
    int32_t *qstart;               /* (max_seqs + 1) first row of each sequence */
    int32_t *seqlen;               /* (max_seqs) tokens in the cache after the step */
    int32_t *table;                /* (max_seqs, table_width) block tables */
    int32_t *rows;                 /* (max_logits) rows whose logits are wanted, ascending */
    int32_t *adapter;              /* (max_seqs) serving adapter of each sequence, -1 = the base */
    int32_t *row_path;             /* (max_seqs) 1: the sequence's rows verify drafts (each must give
                                      a decode row's result: forward_batch.seq_row_path) */
    int      table_width;
    int      n_rows, n_seqs, n_logits;
    int      prefill_rows;         /* rows of prompt tokens (stats) */
    int      hit_tokens;           /* prompt tokens newly served from the prefix cache (stats) */
};

struct scheduler_options {
    int max_seqs;                  /* running sequences at once */
    int max_batch_tokens;          /* rows per step */
    int max_logits;                /* logits rows per step (>= 2) */
    int table_width;               /* blocks per sequence (the model's context / block_tokens) */
    int prefix_caching;            /* share full blocks by hash */
    int record_copies;             /* keep the block copies of forks for other ranks */
    enum scheduling_policy policy; /* which waiting sequence is admitted next */
};

struct scheduler {
    struct scheduler_options o;
    struct kv_cache *cache;        /* borrowed */
    struct seq **running;          /* (max_seqs), oldest admission first (SCHEDULING_PRIORITY:
                                      sorted by priority at each plan's start, then by
                                      admission); preemption takes the last */
    int      n_running;
    struct seq **waiting;          /* (cap_waiting), front at 0 */
    int      n_waiting;
    size_t   cap_waiting;
    uint64_t next_order;
    uint64_t preemptions;
    int32_t *copies;               /* (cap_copies) pending (dst, src) block copies, flattened */
    int      n_copies;             /* pairs */
    size_t   cap_copies;
    struct seq **planned;          /* (max_seqs) this step's sequences before they enter the batch */
    uint64_t *client_keys;         /* (max_seqs) SCHEDULING_FAIR: the clients of the running set */
    int      *client_running;      /* (max_seqs) and how many running sequences each has */
    int      n_clients;
    int      n_planned;
    int      logits_planned;        /* logits rows of this step's decisions so far (<= max_logits) */
    struct step_batch batch;
};

/* STATUS_RESOURCE_EXHAUSTED when out of host memory (s is then freeable). */
enum status scheduler_init(struct scheduler *s, struct kv_cache *cache, const struct scheduler_options *o);
/* Frees every sequence still queued or running (without events) and the arrays; accepts a
 * zeroed struct. */
void scheduler_free(struct scheduler *s);

/* Appends a new sequence to the waiting queue (state SEQ_WAITING). Takes ownership. */
void scheduler_enqueue(struct scheduler *s, struct seq *q);

/* Plans the next step into s->batch: running sequences first (in running order; decode rows
 * are 1 each, prompts in chunks), taking blocks as they grow and preempting the last running
 * sequences (the newest; SCHEDULING_PRIORITY: the lowest priority, then the newest) when the
 * pool is dry; then waiting sequences are admitted while the token budget, max_seqs and the
 * pool allow, after reusing cached prefix blocks, in the policy's order:
 *   SCHEDULING_FCFS      the queue's order (preempted sequences first, then arrival);
 *   SCHEDULING_FAIR      the first waiting sequence of the client with the fewest running
 *                        sequences (counting those admitted in this plan), ties in queue order;
 *                        before planning, when it finds no slot or no blocks for its first
 *                        chunk, the newest sequences of the most-served client are preempted
 *                        while that client runs at least two more than its own;
 *   SCHEDULING_PRIORITY  the lowest request priority, ties in queue order; before planning,
 *                        when the best waiting sequence finds no slot or no blocks for its
 *                        first chunk, the last running sequences of a lower priority are
 *                        preempted to make that room.
 * The first sequence in that order that cannot be admitted stops admission for the step (no
 * smaller one overtakes it, so none starves). Sequences with rows have n_rows > 0
 * (wants_sample: their last row ends their pending tokens). Returns the number of rows (0:
 * nothing can run). */
int scheduler_plan(struct scheduler *s);

/* After the step ran: q's planned rows are in the cache; its newly full blocks are
 * registered for prefix reuse. */
void scheduler_commit(struct scheduler *s, struct seq *q);

/* Returns q's blocks to the pool (a finished sample; the caller marks it SEQ_DONE). */
void scheduler_release(struct scheduler *s, struct seq *q);

/* The samples waiting: a request that has not started counts its n (its first sequence forks
 * the others once the prompt is done), and one admitted but not forked yet its n - 1 (they
 * join the queue or the batch at the fork), as --max-queue does. */
int scheduler_waiting_samples(const struct scheduler *s);

/* Frees the sequences marked SEQ_DONE and closes the gaps (a step boundary). */
void scheduler_drop_finished(struct scheduler *s);

/* Creates samples 1..n-1 of q's request into children[0..n-2] once q's prompt is in the
 * cache (tok: as seq_new). Each shares q's full blocks and gets a copy of its partial one
 * (recorded in s->copies when record_copies). A child that got its blocks joins the running
 * set (SEQ_RUNNING) when there is room: it samples from the same logits row as q now. Any
 * other waits at the back of the queue (SEQ_WAITING) and recomputes. NULL: out of host
 * memory (the caller finishes that sample). Returns n - 1. */
int scheduler_fork(struct scheduler *s, struct seq *q, const struct tokenizer *tok, struct seq **children);

#endif
