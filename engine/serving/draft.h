/* engine/serving/draft.h - the draft model of speculative decoding (docs/speculative.md): a
 * second, small model with the target's vocabulary, loaded beside it, that keeps its own KV cache
 * for the sequences that draft and runs their catch-up and draft rows in batched forwards.
 * What it proposes and how the target verifies it: conductor_speculate.c. Tests:
 * tests/server/test_speculative_draft.py.
 *
 * The cache: n_slots slots (one per sequence that may draft at once, --spec-max-batch), each a
 * fixed run of blocks holding at most ctx tokens (the smaller of the two models' contexts, cut so
 * that all slots' K/V fit DRAFT_KV_BUDGET, but never below DRAFT_MIN_CTX), so its memory is
 * bounded at load. A sequence claims a slot when it first
 * drafts; the slot is free again once its owner no longer runs (finished or preempted), and a
 * sequence longer than ctx stops drafting. The slot's cached length rolls back to the prefix the
 * target accepted (draft_rollback), and draft_run also keeps only the prefix that agrees with the
 * sequence's tokens (drafts never verified): rows past it are written again. Threads: the engine thread
 * only. On the first rank of a replica only (at tp / pp > 1 too): the draft runs unsharded there,
 * and the other ranks see its drafts only as rows of the step plan.
 *
 * EAGLE (--speculative eagle, draft_load_eagle): the draft is a head of one decoder layer built
 * on the target itself (its embeddings and LM head borrowed), whose row at position p reads
 * fc([embedding(x_p), f_{p-1}]), f_{p-1} the target's final hidden state at p - 1 (captured
 * from the target's own forwards and kept beside that position's K/V in the target's cache:
 * struct kv_cache.features) or, for a drafted x_p, the head's own output at p - 1; its output
 * predicts f_p and, through the LM head, x_{p+1}. A slot's head rows hold positions 1 .. (KV index p - 1: the
 * probe it was trained in, tools/eagle_probe.py, never feeds position 0), and only the rows
 * computed from the target's features outlive a step (n_exact). Tests:
 * tests/server/test_speculative_eagle.py. */
#ifndef SHARDLM_DRAFT_H
#define SHARDLM_DRAFT_H

#include <stdint.h>
#include <stdio.h>

#include "kv_cache.h"
#include "model.h"
#include "request.h"

#define DRAFT_MIN_CTX   2048 /* a slot holds the smaller context, and at least this many tokens when */
#define DRAFT_KV_BUDGET (256u << 20) /* ... the slots' K/V would pass this many bytes over it */
#define DRAFT_MAX_SLOTS 64   /* sequences drafting at once at most */
#define DRAFT_EAGLE_ALLOCS 24 /* an EAGLE head's allocations (its tensors, packed copies) */

struct draft {
    struct model *m;
    struct kv_cache cache;
    int       n_slots, slot_blocks, ctx, max_rows;
    struct seq **owner;          /* (n_slots) NULL = free */
    int      *n_cached;          /* (n_slots) tokens of the owner's in the slot */
    int32_t  *tables;            /* (n_slots, slot_blocks) */
    int32_t  *slot_tokens;       /* (n_slots, ctx) the tokens each slot's rows were written with */
    int32_t  *rows;              /* (4 max_rows + 2 n_slots + 1) the forward's arrays */
    int32_t  *table_rows;        /* (n_slots, slot_blocks) the forward's block tables */
    float    *logits;            /* (2 n_slots, vocab): each sequence's row, then the forward's */
    int      *row_ok;            /* (n_slots) whether each sequence's row of logits is finite */
    /* --spec-token-map: the head over map[0 .. n_map) only (ascending ids; the lm_head's rows,
     * same dtype, packed on the CPU like the model's), whose logits are spread over the
     * vocabulary with -Inf elsewhere. n_map 0 = the model's whole head. */
    int       n_map;
    int32_t  *map;
    struct tensor head;
    void     *head_packed;
    /* EAGLE (eagle = 1; see above). */
    int       eagle, d_model;
    void     *eagle_mem[DRAFT_EAGLE_ALLOCS]; /* the head's own tensors' backend allocations */
    int       n_eagle_mem;
    const struct kv_cache *target_kv; /* the target's cache: its features (struct kv_cache.features) */
    struct model *ends;          /* a sharded target's embeddings and LM head, whole (model_load_io), or NULL */
    int      *n_exact;           /* (n_slots) leading positions whose head rows read the target's features */
    float    *h_last;            /* (n_slots, d_model) the head's output at its slot's last row */
    int      *h_pos;             /* (n_slots) that row's position, -1 = none */
    float    *in_feats, *out_hidden; /* (max_rows, d_model) a head forward's features and outputs */
    FILE     *trace;             /* SHARDLM_EAGLE_TRACE=FILE (tests/server/test_speculative_eagle.py): one
                                    line per proposal, its sequence's tokens and the head's argmax */
};

/* Loads the draft at dir on b (the target's backend, one rank) and checks it against the target:
 * the same vocabulary size, BOS and EOS ids, and the same tokenizer when both checkpoints carry
 * one; otherwise STATUS_INVALID_ARGUMENT naming what differs. n_slots: sequences drafting at
 * once. */
enum status draft_load(const char *dir, struct backend *b, const struct model *target, int n_slots, struct draft *d);
/* Loads an EAGLE-1 head from the safetensors file at path (EAGLE's tensor names: fc.weight (d, 2d),
 * fc.bias, layers.0.self_attn.{q,k,v,o}_proj.weight, layers.0.post_attention_layernorm.weight,
 * layers.0.mlp.{gate,up,down}_proj.weight; no attention norm, no final norm) on the target's
 * backend (the first rank's), whole: one Llama-style layer (RMS norms, SwiGLU, full causal
 * attention) of the target's attention widths and a dense MLP of the file's own rows, rotary at
 * its base and scaling, whatever the target's own layers are (Gemma's QK and sandwich norms,
 * GeGLU and windows, a mixture of experts' routed and shared experts included); the target must
 * be a decoder with rotary positions (no encoder, no learned positions). The head
 * reads the embeddings as the target's first layer does (times Gemma's sqrt(d)) and the logits
 * are soft-capped as the target's are. At tp or pp > 1 the
 * head borrows a whole copy of the embeddings and LM head of the checkpoint at target_dir
 * (model_load_io) instead of the rank's slice. The file's "rope_style" metadata, when present,
 * must be the target's. STATUS_INVALID_ARGUMENT / UNSUPPORTED naming what differs. It gives
 * target_kv (the target's cache on this rank) its features (kv_cache_features_init, d_model
 * floats a slot), which the engine writes from every target forward (forward_batch.hidden; at
 * pp > 1 the last stage sends them: conductor_ranks.c). */
enum status draft_load_eagle(const char *path, const char *target_dir, struct backend *b, struct model *target,
                             struct kv_cache *target_kv, int n_slots, struct draft *d);
/* Cuts the loaded draft's head to the token ids of the JSON array in path (--spec-token-map):
 * each in [0, vocab), none twice, at least one; STATUS_INVALID_ARGUMENT naming the file and what
 * is wrong otherwise. It replaces the map an EAGLE head file carries (draft_load_eagle cuts the
 * head to that one: eagle_head_token_map). */
enum status draft_token_map(struct draft *d, const char *path);
void        draft_free(struct draft *d); /* accepts a zeroed struct */

/* Frees the slots whose owners are not among running[0 .. n_running). */
void        draft_sweep(struct draft *d, struct seq *const *running, int n_running);
/* Whether s holds (or now claims) a slot and has room in it for `extra` more tokens. */
int         draft_claim(struct draft *d, struct seq *s, int extra);
/* Runs the draft over each seqs[i]'s tokens its slot lacks (tokens[n_cached, n_tokens)), in as
 * many batched forwards as the row budget needs, and leaves the logits of each one's last token
 * in d->logits + i * vocab (-Inf outside the token map) and whether they are finite (over the
 * map) in d->row_ok[i]. Every seqs[i] holds a slot (draft_claim). */
enum status draft_run(struct draft *d, struct seq *const *seqs, int n);
/* The first id of a row of draft_run's logits with the row's largest logit (over the token map's
 * ids when there is one: -Inf elsewhere, and the map ascending, so the same id as over the whole row). */
int32_t     draft_argmax(const struct draft *d, const float *row);
/* The largest probability of the softmax (temperature 1) of a row of draft_run's logits, over the
 * token map's ids when there is one: how sure the draft is of its best token there (--spec-p-min). */
float       draft_top_prob(const struct draft *d, const float *row);
/* After verification: s's slot keeps only its first n_valid tokens. */
void        draft_rollback(struct draft *d, const struct seq *s, int n_valid);

#endif
