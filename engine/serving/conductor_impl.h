/* engine/serving/conductor_impl.h - private to conductor.c and conductor_ranks.c: struct
 * conductor and the step plan, which only the conductor's own files read.
 * Not here: the public API (conductor.h). */
#ifndef SHARDLM_CONDUCTOR_IMPL_H
#define SHARDLM_CONDUCTOR_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "adapters.h"
#include "conductor.h"
#include "draft.h"
#include "kv_cache.h"
#include "model.h"
#include "parallel.h"
#include "request.h"
#include "sampler.h"
#include "scheduler.h"

#define MODULE "engine"
#define VERIFY_MAX_JOBS 8 /* prefix-cache hits verified after one step at most */
#define SPEC_GATE_BATCHES 65 /* draft_gate's plain-step times by batch size: 1 .. 64 (DRAFT_MAX_SLOTS) */

struct verify_job;

/* The step plan the first rank broadcasts to every rank: this header, then the arrays. */
struct step_plan_header {
    int32_t stop;                 /* 1: workers leave conductor_run_worker */
    int32_t n_tokens, n_seqs, table_width, n_logits, n_copies;
    int32_t n_micro;              /* pipeline micro-batches of the step */
};

struct conductor {
    struct engine_options o;      /* resolved */
    struct model_parallel par;    /* world of one when par.world is NULL */
    struct parallel_groups groups;
    int32_t *plan;                /* (cap_plan) the packed arrays of a step plan */
    size_t   cap_plan;
    uint64_t worker_steps;        /* forwards run by conductor_run_worker */
    int32_t *mb_qstart, *mb_rows; /* (max_seqs + 1), (max_logits): one micro-batch's offsets */
    int      failed;              /* the world broke: everything fails with UNAVAILABLE */
    char     failure[512];
    struct backend *b;
    struct model   *m;
    struct tokenizer *tok;
    struct adapter_set adapters;  /* served LoRA adapters; the model borrows them */
    struct kv_cache cache;
    struct scheduler sched;
    struct sampler  smp;
    /* Sampling many rows at once on the host's cores (conductor.c presample): one sampler and
     * one vocab-long scratch row per worker (backend_host_workers), the token each running
     * sequence drew this step (-1: none yet; (max_seqs)), and the indexes of those drawing.
     * Made at the first step that has two rows to sample; NULL with one worker.
     * SHARDLM_PARALLEL_SAMPLING=0 (presample_off) keeps every draw on the engine thread. */
    int      presample_off;
    struct sampler *pre_smp;
    int      n_pre_smp;
    float   *pre_scratch;
    int32_t *pre_tok, *pre_idx;   /* freed by conductor_presample_free */
    /* Speculative decoding with a draft model (--draft-model; draft.m NULL without one): the
     * draft distributions of sampled drafting sequences, (draft.n_slots, spec_draft, vocab),
     * and the target's distribution of the row being verified (vocab). */
    struct draft    draft;
    struct spec_corpus *corpus;  /* drafts from a corpus (engine_set_spec_corpus, learned), or NULL */
    int64_t  corpus_given;       /* its first ids, the given corpus's (never forgotten); the learned after */
    int32_t *learn;              /* (learn_cap) finished outputs not yet in corpus (spec_corpus_learn) */
    int64_t  n_learn, learn_cap;
    uint32_t *learn_scope;       /* (learn_scope_cap) each of those texts' scope (request.spec_scope) */
    int64_t  n_learn_texts, learn_scope_cap;
    int      corpus_kept;        /* spec_corpus_keep's file was read (or absent) at start: write it back at the end */
    double   keep_written_s;     /* when it was last written (base_now_s); keep_every_s apart at least while serving */
    double   keep_every_s;       /* SPEC_KEEP_EVERY_S (SHARDLM_TEST_SPEC_KEEP_EVERY_S) */
    uint64_t keep_fingerprint;   /* the tokenizer's, as the file holds it */
    int      learn_failed;       /* an answer could not join the corpus (said once in the log) */
    /* The periodic write runs on a thread of its own (spec_keep_write_async), from a copy of the
     * learned ids: the steps do not wait for the disk. keep_job is that copy while it is written. */
    pthread_t keep_thread;
    int       keep_thread_live;  /* keep_thread was started and not joined yet */
    _Atomic int keep_thread_done;
    int32_t  *keep_job;
    uint32_t *keep_job_scope;    /* (keep_job_n) each id's text's scope */
    int64_t   keep_job_n;
    float   *spec_q, *spec_p;
    float   *eagle_hidden;       /* EAGLE: the step's hidden states, (max_batch_tokens, d_model): on the
                                    first rank, and at pp > 1 on the last stage's first tp rank */
    int      spec_check_grammar; /* SHARDLM_SPEC_CHECK_GRAMMAR set: check_matcher after each verification */
    /* The adaptive rule's server-wide prior (conductor_speculate.c spec_prior_low): the drafts
     * verified and accepted lately over every sequence (halved as they grow), and the backoff a
     * new sequence starts with while that acceptance is low; spec_prior off:
     * SHARDLM_SPEC_PRIOR=0 (tests that need every sequence to draft). */
    uint64_t spec_g_drafted, spec_g_accepted;
    int      spec_g_backoff, spec_prior;
    /* What the draft model or head costs and saves (draft_gate, spec_gate_step), over the
     * sequences it proposed for (halved as they grow): the seconds of its proposals and of the
     * verifying steps' time beyond a plain step's that its rows took, and the decode seconds its
     * accepted tokens saved; while it costs more than it saves, only one opportunity in
     * SPEC_GATE_PROBE proposes, which spec_d_opportunities counts. A plain decode step's seconds
     * (no draft rows) by batch size (a moving mean; spec_plain_at: the decode step it was last
     * measured at, of spec_decode_steps), and this step's proposals' seconds, the draft's rows
     * verified and tokens accepted. */
    double   spec_d_seconds, spec_d_saved;
    double   spec_d_credit;       /* while gated, the seconds its probes may still cost (draft_gate) */
    uint64_t spec_d_runs, spec_d_opportunities;
    double   spec_plain_s[SPEC_GATE_BATCHES];
    uint64_t spec_plain_at[SPEC_GATE_BATCHES], spec_decode_steps;
    double   step_propose_s;
    int      step_d_rows, step_d_accepted;
    int      spec_d_gated;        /* the gate's last state, for its log line when it changes */
    int      spec_gate;           /* a draft model or head, the prior on: draft_gate applies (conductor_setup) */
    int      max_logits;
    float   *logits;              /* (max_logits, vocab) host */
    float   *scratch;             /* (2, vocab) log-softmax and a logits copy */
    /* Greedy sampling on the device (forward_batch.greedy_ids): device_greedy says whether this
     * replica may use it (SHARDLM_DEVICE_SAMPLING=1 / 0; default: on CUDA, off on the CPU, where
     * the host reads the logits in place); step_greedy whether this step does (every sampled
     * row is a plain argmax, or top candidates: step_top); greedy_done whether the forward pass
     * gave ids (greedy_ids, or top_ids). */
    int      device_greedy, step_greedy, greedy_done;
    int32_t *greedy_ids;          /* (max_logits) */
    /* Sampled rows from the device's top candidates (forward_batch.top_k), wherever device_greedy
     * is on: step_top says whether this step asks for them (every sampled row greedy or
     * top_eligible), top_k how many a row brings (MODEL_MAX_TOP_K or the vocabulary), top_values /
     * top_ids those of the step's rows (max_logits, top_k), top_smp the sampler over one row's
     * candidates, top_lg / top_tok its row in id order (take_top); top_inv_temp / top_mass each
     * row's inverse temperature for its mass (0: none wanted) and the mass (sampler_sample_nucleus),
     * step_mass whether this step wants any. Plain temperature rows (sampler_draw_fits) are drawn
     * on the device too (op_logit_draw): draw_temp each row's temperature (0: none), draw_u its
     * uniform, drawn from draw_rng[row], a copy of the sequence's random state that becomes the
     * sequence's only where the draw is taken (sampler_draw_decided; else the host draws the same
     * uniform from the row fetched whole); draw_ids / draw_margin the device's draws, taken where
     * the margin is at least draw_tol (SAMPLER_DRAW_TOL; SHARDLM_TEST_DRAW_TOL sets another, so that
     * tests see rows fetched); step_draw whether this step makes any. A top_p row without min_p
     * asks for a draw as well (draw_top_p its top_p; 1 for the others): the nucleus drawn on the
     * device, taken where its 64 candidates and mass leave the token undecided (nucleus_used). */
    int      step_top, step_mass, top_k, top_used, top_fetched, nucleus_used;
    float   *top_values, *top_lg, *top_inv_temp, *top_mass;
    int32_t *top_ids, *top_tok;
    int      step_draw, draw_used, draw_fetched;
    double   draw_tol;
    /* Log-probabilities from the top candidates: lse_want each row's wish (1: its request asks for
     * them), top_lse the device's op_logit_lse, step_lse whether this step wants any. */
    int      step_lse, lse_used;
    float   *lse_want, *top_lse;
    /* Edits of single logits made on the device before all of it (op_logit_edit, row_edits): a
     * row's logit bias, the ids banned before min_tokens, its penalties, one entry per (row, token):
     * n_edits of them this step in edit_rows / edit_ids / edit_vals (edits_cap allocated); edit_at
     * (vocab, -1 between rows) a token's entry in the row being built; edits_used whether any step
     * made any (logged once). */
    int      n_edits, edits_cap, edits_used;
    int32_t *edit_rows, *edit_ids, *edit_at;
    float   *edit_vals;
    /* Constraints' masks made on the device after the edits (op_logit_mask, step_masks): n_masks
     * rows this step, mask_rows their logits rows, masks their bits ((vocab + 31) / 32 words each,
     * masks_cap rows allocated); masks_used whether any step made any (logged once). */
    int       n_masks, masks_cap, masks_used;
    int32_t  *mask_rows;
    uint32_t *masks;
    float   *draw_temp, *draw_u, *draw_top_p, *draw_margin;
    int32_t *draw_ids;
    struct rng *draw_rng;
    struct sampler top_smp;
    /* Constraints (structured outputs): the vocabulary's token bytes and the compiled-grammar
     * cache, made at the first constrained request (gmu guards that), and one token mask. */
    pthread_mutex_t gmu;
    struct grammar_vocab *gvocab;
    struct grammar_cache *gcache;
    uint32_t *gmask;              /* ((vocab + 31) / 32) */

    /* Prefix-cache shadow verification (conductor_verify.c): the sampled fraction, its draws,
     * the test fault, and the jobs of this step. */
    double   verify_rate;
    struct rng verify_rng;
    int      verify_fault;
    struct verify_job *vjobs[VERIFY_MAX_JOBS];
    int      n_vjobs;
    /* Tests: $SHARDLM_TEST_STEP_DELAY_MS slows every planned step (a drain that lasts);
     * $SHARDLM_TEST_DRAFT_ROW_DELAY_MS slows a decode step by each draft row (draft_gate's test). */
    long     test_step_delay_ns, test_draft_row_delay_ns;
    long     test_finish_delay_ns; /* $SHARDLM_TEST_FINISH_DELAY_MS: the engine waits that long after each
                                    * FINISHED event (the stats' test) */

    pthread_mutex_t mu;
    pthread_cond_t  cv;
    pthread_cond_t  embed_cv;             /* an engine_embed caller's request ended (conductor_embed.c) */
    struct embed_job *embed_jobs;         /* under mu: waiting for the engine thread */
    int       embed_active;               /* under mu: embedding jobs submitted whose done has not
                                             returned yet (the drain waits for them) */
    pthread_t thread;
    int       thread_running, stop_thread, draining;
    struct request *intake, *intake_tail;  /* submitted, not yet seen by the engine thread */
    int       n_intake_samples;               /* their samples (n each) */
    struct request *all;                  /* every live request */
    uint64_t  next_handle;
    struct engine_stats stats;            /* under mu */
};

/* conductor_ranks.c: the multi-rank side of a step. */
enum status plan_exchange(struct conductor *c, struct step_plan_header *h);
int         micro_batches(const struct conductor *c, int n_seqs);
int         conductor_last_stage_rank(const struct conductor *c); /* the rank that sends the first rank its logits */
enum status run_forward(struct conductor *c, int n_rows, int n_seqs, int n_logits, int n_micro);
void        log_comm_time(struct conductor *c);
void        stop_workers(struct conductor *c);
/* conductor.c */
int         conductor_eos_id(const struct conductor *c);
void        conductor_presample_free(struct conductor *c); /* the per-worker samplers (conductor.c presample) */
void        finish_seq(struct conductor *c, struct seq *s, enum finish_reason why, enum status st, const char *message,
                       size_t text_len);
/* conductor_sample.c */
int32_t     take_token(struct conductor *c, struct seq *s, const float *row, int32_t greedy_id);
/* Whether s's next token may be drawn from its row's top c->top_k candidates (sampler_top_exact),
 * or from them and the row's mass (sampler_nucleus_fits), as the very token sampler_sample would
 * draw from the whole row, with nothing else read from the row: no logit bias, banned ids
 * (min_tokens), constraint or log-probabilities, one sample. */
int         top_eligible(const struct conductor *c, const struct seq *s);
/* Step 3's device plan (conductor_device.c) for a step of n_micro micro-batches: how its logits
 * rows may stay on the device (only with one micro-batch) and what they ask it for (step_greedy,
 * step_top, the edits and masks, masses, draws, normalisers). */
void        conductor_device_plan(struct conductor *c, int n_micro);
/* Whether s's logits row needs edits before its sampler reads it (a logit bias, ids banned before
 * min_tokens, a penalty): made on the device (row_edits) when its step samples there. */
int         seq_edited(const struct seq *s);
/* Its part that is not the sampler's: nothing but the row's logits (edited: seq_edited; masked by
 * its constraint: step_masks) and the sampler decide s's token (no log-probabilities; not the row
 * an n > 1 request's samples fork from; a token wanted; a repetition penalty, if any, above 0). */
int         row_alone(const struct seq *s);
/* take_token for a top_eligible s whose step brought top candidates: its token drawn from the
 * candidates of logits row lrow (c->top_values / c->top_ids, sampler_sample_top, or
 * sampler_sample_nucleus with c->top_mass), or the device's draw (c->draw_ids), then taken
 * (take_chosen); where neither decides it, from the whole row fetched from the device
 * (model_logits_row) by take_token. */
int32_t     take_top(struct conductor *c, struct seq *s, int lrow);
/* take_token's sampling without the taking: the token s draws from row (every sampling control and
 * its constraint), or -1 when s finished instead (logits not finite, scoring only, the constraint
 * failed). take_chosen then takes it. */
int32_t     sample_token(struct conductor *c, struct seq *s, const float *row);
/* A constrained sample's row lg (vocab, after sampling_logits): the logits of the tokens its
 * grammar forbids next, at the matcher's state s->gm, become -inf (EOS and the end-of-turn ids
 * only where the output may end; c->gmask allows EOS from the vocabulary); a lazy constraint
 * before its trigger leaves lg as it is. constraint_mask returns 1, 0 when nothing may follow,
 * -1 when the matcher could not be made, -2 when the grammar's mask is over its work bound
 * (constraint_fill_mask), and never finishes s (the draft model masks its drafts
 * with it); constrain finishes s with the error in both failures and returns 0, else 1. */
int         constraint_mask(struct conductor *c, struct seq *s, float *lg);
int         constrain(struct conductor *c, struct seq *s, float *lg);
/* The logits s samples from at its n_generated-th output token, before the sampler's own
 * transforms: row plus the logit bias, with EOS and the stop ids banned before min_tokens, into
 * lg (vocab). take_token applies it, and the draft model shapes its rows with it. */
void        sampling_logits(struct conductor *c, const struct seq *s, const float *row, int n_generated, float *lg);
/* The ids banned from s's sample after n_generated output tokens: before min_tokens, EOS and the
 * end-of-turn ids (unless ignore_eos) and the stop ids. Slots 0 .. ban_slots - 1, each ban_id: an
 * id, or -1 for one that bans nothing. sampling_logits bans them on the host, the device's edits
 * (row_edits) and its masks' check (banned) read the same list. */
int         ban_slots(const struct seq *s, int n_generated);
int32_t     ban_id(const struct conductor *c, const struct seq *s, int slot);
/* Emits tok, chosen from row, as s's next token (log-probabilities from row, stop conditions),
 * finishing s when it ends; returns tok, or -1 when s ended with an error instead (out of memory
 * starting its constraint's matcher). c->scratch[0 .. V) is overwritten. */
int32_t     take_chosen(struct conductor *c, struct seq *s, const float *row, int32_t tok);
/* Records a lazy constraint's trigger (p's first constraint_trigger_len source bytes) in r, and the
 * token whose text is the whole trigger when the vocabulary has one (conductor_sample.c). */
void        conductor_lazy_setup(struct conductor *c, struct request *r, const struct request_params *p);
void        take_prompt_logprobs(struct conductor *c, struct seq *s, int p0, int n, const float *rows);
/* conductor_embed.c */
struct embed_job;
void        run_embed_jobs(struct conductor *c);  /* engine thread, between steps */
void        fail_embed_jobs(struct conductor *c); /* the engine thread stops: UNAVAILABLE to every job */
void        cancel_embed_jobs(struct conductor *c); /* under mu: the drain's timeout: every job ends before its next pass */
/* conductor_verify.c: --verify-prefix-cache. verify_consider (step 4, before s samples its
 * first token from row) may keep a job; verify_run_pending (after the step) recomputes the jobs'
 * prompts without the cache and counts mismatches (an error: a forward failed);
 * verify_inject_fault (between planning and the forward) zeroes the first reused block of every
 * sequence just admitted with a hit when SHARDLM_TEST_PREFIX_CACHE_FAULT=1 (tests only). */
void        verify_init(struct conductor *c);
void        verify_free(struct conductor *c);
void        verify_consider(struct conductor *c, const struct seq *s, const float *row);
void        verify_inject_fault(struct conductor *c);
enum status verify_run_pending(struct conductor *c);
/* conductor_speculate.c */
void        speculate(struct conductor *c);
/* A finished sample's output (after the last SPEC_LEARN_LEAD prompt tokens) kept for the corpus
 * (engine_options.spec_corpus_learn; finish_seq calls it; errors and empty outputs are not kept). */
void        spec_learn(struct conductor *c, const struct seq *s, enum finish_reason why);
void        take_drafted(struct conductor *c, struct seq *s, const float *rows, int n_ver);
/* After a step's results (step 4), its seconds dt: draft_gate's counts (a no-op without spec_gate). */
void        spec_gate_step(struct conductor *c, double dt);
/* engine_options.spec_corpus_keep: the learned texts kept in the file are read into the corpus
 * when the engine is made (conductor_create; a corpus given later goes before them), and the
 * corpus's learned texts written back while serving (learn_flush: at most every keep_every_s,
 * a copy written by a thread of its own) and once it has stopped (conductor_free, after that
 * thread); only when the file was read,
 * so that a file refused there is never overwritten. */
enum status spec_keep_load(struct conductor *c);
void        spec_keep_save(struct conductor *c); /* from conductor_free: the last write (logged) */
void        spec_keep_write_async(struct conductor *c);    /* the periodic write, on its own thread */

#endif
