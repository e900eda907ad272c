/* engine/serving/request.h - requests and their samples (sequences): the owned copy of what a
 * client asked for, the request limits (one table, the only place that states them), stop
 * conditions, held text, events and finish reasons.
 * Not here: which sequences run and their KV blocks (scheduler.c), the step (conductor.c),
 * sampling maths (sampler.c).
 * Tests: tests/test_scheduler.c (limits, requests and samples without a model),
 * tests/test_engine.c (stops, events and finish reasons on a real model).
 *
 * Threads: a request is built by the submitting thread (request_new) and from then on belongs
 * to its conductor's engine thread, except cancel_requested and the conductor's list links,
 * which the conductor guards with its mutex. Events are emitted on the engine thread. */
#ifndef SHARDLM_REQUEST_H
#define SHARDLM_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

struct grammar;
struct grammar_matcher;
#include "tokenizer.h"

/* Request limits that are not model facts (documented in protos/shardlm/v1/text_generation.proto). */
#define REQUEST_MAX_SAMPLES        16   /* n */
#define REQUEST_MAX_STOP           16   /* stop strings (a chat template's own included) */
#define REQUEST_MAX_STOP_BYTES     256  /* bytes per stop string */
#define REQUEST_MAX_CONSTRAINT_BYTES (256 * 1024) /* a constraint's source (schema, regex, grammar) */
#define REQUEST_MAX_TRIGGER_BYTES 31 /* a lazy constraint's trigger (a tool call's opening marker) */
#define REQUEST_MAX_STOP_TOKEN_IDS 64   /* stop token ids (a chat template's own included) */
#define REQUEST_MAX_LOGIT_BIAS     256  /* logit_bias entries */
#define REQUEST_MAX_LOGIT_BIAS_ABS 100  /* |logit_bias value| */
#define REQUEST_MAX_CACHE_SALT_BYTES 1024 /* cache_salt (HTTP and gRPC) */
#define REQUEST_DEFAULT_MAX_LOGPROBS 20 /* engine_options.max_logprobs when 0 */
#define REQUEST_MAX_TOP_LOGPROBS     64 /* the largest engine_options.max_logprobs (a token's top-n on the stack) */
#define REQUEST_ID_MAX_BYTES       100  /* request_id */

/* ---- limits --------------------------------------------------------------------------------- */

/* Where a limit's bound comes from: a constant of the table, or a fact of the engine. */
enum request_bound {
    REQUEST_BOUND_CONST = 0,    /* the row's value */
    REQUEST_BOUND_NONE,         /* unbounded on this side */
    REQUEST_BOUND_VOCAB,        /* vocab_size */
    REQUEST_BOUND_MAX_LOGPROBS, /* engine_options.max_logprobs */
    REQUEST_BOUND_MAX_SAMPLES,  /* min(REQUEST_MAX_SAMPLES, max_seqs, max_queue) */
    REQUEST_BOUND_MAX_TOKENS,   /* the request's own max_tokens */
};

enum request_field_type { REQUEST_FIELD_FLOAT, REQUEST_FIELD_INT };

/* One row of the table: a scalar field of struct request_params (sampling.* included) and its
 * allowed range. The message reads "<name> must be in [lo, hi]<note>, got <value>", with ( or )
 * for an open end. A field equal to `unset` (INT only) is not checked. */
struct request_limit {
    const char *name;               /* as the API names it: "sampling.temperature" */
    size_t      offset;             /* offsetof(struct request_params, ...) */
    enum request_field_type type;
    double      lo, hi;             /* with REQUEST_BOUND_CONST */
    enum request_bound lo_bound, hi_bound;
    int         lo_open, hi_open;   /* 1: the bound itself is excluded */
    int         sampling;           /* 1: a field of struct sampling_params */
    int         has_unset;
    int         unset;
    const char *note;               /* after the range: " (0 = greedy)" */
};

/* The table (n rows), for documentation tools and tests. */
const struct request_limit *request_limits(int *n);

/* Engine facts the bounds refer to. 0 (or a zeroed struct) for a fact that is not known:
 * the bound is then not checked. */
struct request_bounds {
    int vocab_size;
    int max_positions;   /* the model's context */
    int block_tokens, n_blocks; /* the KV pool */
    int max_logprobs;
    int max_seqs;
    int max_queue;       /* waiting samples: a request of n samples must fit the queue */
    int scheduling;      /* enum scheduling_policy: a priority other than 0 is refused unless
                            SCHEDULING_PRIORITY (as vLLM does) */
};

/* Checks every row of the table (only the sampling rows when sampling_only; then p->sampling
 * is all that is read). STATUS_INVALID_ARGUMENT with the row's message on the first failure. */
enum status request_limits_check(const struct request_params *p, const struct request_bounds *b, int sampling_only);

/* The context rule, its one owner: a prompt of n_prompt tokens and max_tokens (< 0: unset, 0)
 * must fit the model's context (b->max_positions; <= 0: no bound). bytes not NULL: n_prompt is a
 * lower bound counted from *bytes bytes of text before tokenizing (the server's early refusal of a
 * prompt too long to be worth encoding; tokenizer_min_tokens). request_validate applies it to
 * the exact prompt. */
enum status request_context_check(long long n_prompt, long long max_tokens, const size_t *bytes,
                                  const struct request_bounds *b);

/* engine_validate's whole check (see engine.h): the table, then the prompt, the context, the
 * KV pool and the arrays (stops, stop ids, logit bias). */
enum status request_validate(const int32_t *prompt, int n_prompt, const struct request_params *p,
                             const struct request_bounds *b);

/* NULL or "" (the engine assigns one) or at most REQUEST_ID_MAX_BYTES bytes. */
enum status request_id_check(const char *request_id);

/* ---- requests and samples ----------------------------------------------------------------- */

struct request {
    uint64_t handle;
    char     id[REQUEST_ID_MAX_BYTES + 28]; /* room for "req-<handle>" too */
    int32_t *prompt;              /* (n_prompt) */
    int      n_prompt;
    struct request_params p;      /* arrays below are owned copies; p's own pointers are NULL */
    int32_t *stop_ids;            /* (p.n_stop_token_ids) */
    char    *stop[REQUEST_MAX_STOP];
    size_t   stop_len[REQUEST_MAX_STOP];
    int32_t *bias_ids;            /* (p.n_logit_bias) */
    float   *bias_values;         /* (p.n_logit_bias) */
    struct grammar *grammar;      /* the compiled constraint (a reference), or NULL */
    char     trigger[REQUEST_MAX_TRIGGER_BYTES + 1]; /* a lazy constraint's markers (engine.h
                                     constraint_trigger_len: its flags' header, when any, not here),
                                     each ended by a NUL (TRIGGER_MARKER_SEP in the request) */
    int      trigger_flags;       /* TRIGGER_* (engine.h) */
    int      n_markers;           /* markers in trigger, 0 .. TRIGGER_MAX_MARKERS; 0 only with
                                     TRIGGER_IN_REASONING or TRIGGER_MAY_REASON */
    int      marker_off[TRIGGER_MAX_MARKERS], marker_len[TRIGGER_MAX_MARKERS]; /* marker k: trigger + marker_off[k] */
    int32_t  marker_id[TRIGGER_MAX_MARKERS]; /* the token whose text is marker k, or -1 */
    int32_t  think_ids[2];        /* the tokens whose text is think[0], think[1], or -1 */
    const char *think[2];         /* the reasoning markers (engine_reasoning_marker of the flags) */
    int      think_len[2];        /* their lengths */
    uint64_t seed;
    engine_event_fn on_event;
    void    *ctx;
    int      cancel_requested;    /* set under the conductor's mutex */
    int      live_samples;        /* samples not yet FINISHED */
    int      forked;              /* samples 1..n-1 exist (or finished without existing) */
    float   *prompt_lp;           /* (n_prompt) prompt log-probabilities when asked */
    struct top_logprob *prompt_top; /* (n_prompt, prompt_logprobs) */
    int32_t *resume;              /* (p.n_resume) a resumed sample's generated tokens */
    uint64_t resume_rng[4];
    int      resumed;             /* p.resume_rng was given: resume and resume_rng hold */
    int      prompt_lp_done;      /* rows of prompt_lp filled */
    int      prompt_lp_sent;
    double   t_submit;            /* base_now_s() at submission (queue time) */
    int      adapter;             /* index into the model's serving adapters; -1 = the base */
    uint64_t adapter_key;         /* 0 for the base, else unique to the adapter: the prefix-cache
                                     hash chains start from it, so no KV is shared across adapters */
    int      adapter_held;        /* the adapter set counts this request (conductor.c) */
    uint64_t cache_salt;          /* FNV-1a of p.cache_salt (and of p.owner under prefix_cache_per_owner);
                                     0: none. The conductor makes cache_seed of it */
    uint64_t cache_seed;          /* where the prefix cache's hash chain starts: adapter_key, mixed
                                     with cache_salt when there is one, so that KV is shared only
                                     between requests of one adapter and one salt */
    uint32_t spec_scope;          /* p.owner's and p.adapter's (never 0): a learned speculative corpus
                                     drafts for a request only from its scope's answers (spec_corpus.h) */
    uint64_t client_key;          /* a hash of p.client (0: none given), the unit of
                                     SCHEDULING_FAIR; a collision merges two clients' turns */
    struct request *next_all;     /* the conductor's list of live requests */
    struct request *next_in;      /* the conductor's intake list */
};

enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

/* Where a step's draftless drafts came from (seq.spec_lookup). */
enum spec_from { SPEC_FROM_LOOKUP = 1, SPEC_FROM_CORPUS = 2 };

/* One sample of a request: its tokens, KV block table and text not yet emitted. */
struct seq {
    struct request *req;          /* borrowed; NULL once the sample finished */
    int      sample;
    enum seq_state state;
    int32_t *tokens;              /* (cap_tokens) prompt then generated */
    int      n_tokens;
    size_t   cap_tokens;
    int      n_generated;
    int      n_cached;            /* tokens whose K/V are in the cache */
    int32_t *blocks;              /* (cap_blocks) block table */
    int      n_blocks;
    size_t   cap_blocks;
    int      n_registered;        /* leading full blocks looked up or registered by hash */
    uint64_t last_hash;           /* prefix hash of block n_registered - 1 */
    int      prefix_checked;      /* the prefix cache was consulted on admission */
    int      cached_prompt_tokens;
    double   t_admit;             /* base_now_s() at its first admission; 0 before */
    struct rng rng;
    struct detokenizer detok;
    struct grammar_matcher *gm;   /* the constraint's state (req->grammar), made at its first token */
    struct grammar_matcher *gm_check; /* SHARDLM_SPEC_CHECK_GRAMMAR: a matcher fed only the output's
                                         tokens, never a draft (conductor_speculate.c check_matcher) */
    int      gm_check_n;          /* output tokens gm_check has been fed */
    int      n_draft;             /* speculation: tokens[n_tokens - n_draft, n_tokens) are drafts
                                     this step verifies (conductor.c speculate) */
    int      grammar_end;         /* the constraint is complete and nothing may follow: stop */
    int      lazy_on;             /* a lazy constraint's trigger was seen: gm constrains the output */
    int      lazy_match;          /* a lazy constraint, not yet on, in reasoning: bytes of <think> /
                                     </think> the output ends with */
    int      lazy_mk[TRIGGER_MAX_MARKERS]; /* and once armed: bytes of each marker the output ends with
                                     (anchored: the reply's first bytes; -1 when they are not) */
    int      lazy_phase;          /* a lazy constraint, not yet on: where the watch is (constraint.c) */
    int      lazy_brk[2];         /* in harmony's analysis: bytes of <|start|>, <|channel|> the output
                                     ends with (constraint.c HARMONY_BREAKS) */
    /* Speculation's adaptive rule (conductor_speculate.c, docs/speculative.md). */
    int      spec_len;            /* drafts it may append next, 1 .. the draft limit; 0 = not begun */
    int      spec_win_drafted, spec_win_accepted; /* drafts verified / accepted in the current window */
    int      spec_resume_at;      /* n_generated from which it drafts again after a backoff */
    int      spec_backoff;        /* generated tokens of its next backoff; 0 = the first */
    int      draft_slot;          /* draft model: 1 + its cache slot (draft.h), 0 = none */
    int      spec_lookup;         /* where this step's drafts came from when not from the draft model:
                                     SPEC_FROM_LOOKUP (prompt lookup), SPEC_FROM_CORPUS; 0 otherwise */
    const float *spec_q;          /* draft model, sampled: the draft's distribution of each draft
                                     (n_draft, vocab), borrowed from the conductor; NULL = one-hot */
    char    *held;                /* (cap_held) text not yet emitted (stop-string look-back) */
    size_t   n_held, cap_held;
    uint64_t order;               /* admission order; the newest is preempted first */
    /* this step */
    int      row_start, n_rows, wants_sample;
    int      logit_row;           /* its first row of the step's logits (prompt log-probabilities, then the sample's) */
    enum finish_reason doomed;    /* cancelled or past its deadline, seen at the step's start */
};

/* Copies prompt and p's arrays into a new request (handle, id and seed are the caller's to
 * set). p must have passed request_validate. STATUS_RESOURCE_EXHAUSTED: nothing allocated. */
enum status request_new(const int32_t *prompt, int n_prompt, const struct request_params *p,
                        engine_event_fn on_event, void *ctx, struct request **out);
void request_free(struct request *r); /* accepts NULL */

/* A new sample of r (state SEQ_WAITING, no blocks). tok NULL: no text (tests); else borrowed,
 * primed with the prompt. NULL when out of host memory. */
struct seq *seq_new(struct request *r, int sample, const struct tokenizer *tok);
void        seq_free(struct seq *s); /* accepts NULL */

/* Calls the request's callback with ev after filling its request fields (handle, id, sample,
 * usage, seed). */
void request_emit(struct seq *s, struct engine_event *ev);
/* FINISHED for sample `sample` of r, which has no sequence. */
void request_emit_absent(struct request *r, int sample, enum finish_reason why, enum status st,
                         const char *message);

/* Appends the sampled token tok to s and emits its TOKENS event (text, logprobs). Returns the
 * finish reason it causes (FINISH_REASON_NONE: go on); then s->held[0..*text_len) is the text
 * the FINISHED event carries. FINISH_REASON_ERROR: out of host memory (status set). */
/* Whether t is one of r's end-of-turn ids (request_params.end_ids). */
int request_is_end_id(const struct request *r, int32_t t);
enum finish_reason request_take_token(struct seq *s, int32_t tok, int eos, int max_positions,
                                      const float *tok_lp, const struct top_logprob *top, int n_top,
                                      size_t *text_len);

/* Sends the PROMPT_LOGPROBS event once every prompt row is scored. */
void request_send_prompt_logprobs(struct seq *s);

#endif
