/* engine/serving/engine.h - the serving engine's C API: requests in, events out. One engine thread
 * owns the model, the KV cache and the scheduler; any thread may submit, cancel and read
 * stats. Every engine step runs decode rows of all running sequences plus prefill chunks of
 * waiting ones (continuous batching), samples, detokenizes, checks stop conditions and emits
 * events. The server (server/) converts protobuf to these structs at its edge; the engine never
 * sees protobuf.
 * Not here: the step's arithmetic (model.c), block bookkeeping (kv_cache.c), sampling math
 * (sampler.c), tokenization of prompts (the caller does it; engine_tokenizer gives access).
 * Tests: tests/test_engine.c. */
#ifndef SHARDLM_ENGINE_H
#define SHARDLM_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct engine;
struct tokenizer;

#define ENGINE_MAX_ADAPTERS 64 /* the largest engine_options.max_loras */

/* Values reach the wire (the server maps them to the proto enum): only ever appended. */
enum finish_reason {
    FINISH_REASON_NONE = 0,   /* not finished */
    FINISH_REASON_LENGTH,     /* max_tokens reached (or the model's context) */
    FINISH_REASON_STOP,       /* a stop string or stop token id */
    FINISH_REASON_EOS,        /* the model's end-of-sequence token */
    FINISH_REASON_CANCELLED,  /* engine_cancel, client cancel or disconnect */
    FINISH_REASON_DEADLINE,   /* the request's deadline passed */
    FINISH_REASON_ERROR,      /* see the event's status and message */
};
const char *finish_reason_name(enum finish_reason r); /* "length", "stop", ... */

/* Which waiting sample a replica admits next (engine_options.scheduling; docs/engine.md,
 * "Scheduling policies"). Values reach flags and the wire: only ever appended. */
enum scheduling_policy {
    SCHEDULING_FCFS = 0,      /* first come, first served (preempted samples first) */
    SCHEDULING_FAIR,          /* the client with the fewest running samples first, then FCFS */
    SCHEDULING_PRIORITY,      /* the lowest request_params.priority first, then FCFS; a sample
                                 that outranks running ones preempts them for its room */
};
const char *scheduling_policy_name(enum scheduling_policy p); /* "fcfs", "fair", "priority" */

struct engine_options {
    const char *model_dir;     /* checkpoint directory (config.json, tokenizer.model, weights), or a GGUF file */
    int   device;              /* enum device: DEVICE_CPU or DEVICE_CUDA */
    int   device_id;
    int   n_threads;           /* CPU threads; 0 = all cores */
    int   block_tokens;        /* tokens per KV block; 0 = 16 */
    size_t kv_cache_bytes;     /* KV pool size in bytes; 0 = kv_cache_fraction decides */
    double kv_cache_fraction;  /* KV pool as this fraction of the device's free memory after the
                                  weights and workspace are loaded, in (0, 0.95]; 0 =
                                  kv_cache_blocks decides */
    int   kv_cache_blocks;     /* KV pool size in blocks when kv_cache_bytes is 0; 0 = enough
                                  for max_seqs sequences of the full context */
    int   max_batch_tokens;    /* token rows per step (decode + prefill); 0 = 512 */
    int   max_seqs;            /* running sequences at once; 0 = 64 */
    int   max_queue;           /* waiting samples at most: a request of n samples is refused when
                                  they would take the waiting samples above it (and n above it
                                  is invalid); 0 = 1024 */
    int   max_logprobs;        /* largest top-n a request may ask; 0 = 20; at most 64 */
    int   prefix_caching;      /* 1 = share full prompt blocks between requests by hash */
    int   prefix_cache_per_owner; /* 1 = only between requests of the same request_params.owner
                                  (`--prefix-cache-per-key`: no API key's prompts speed up another's) */
    double verify_prefix_cache; /* the fraction in [0, 1] of requests served partly from the
                                  prefix cache whose prompt is recomputed without it and whose
                                  first logits are compared (engine_stats counts mismatches);
                                  0 = never */
    int   scheduling;          /* enum scheduling_policy; 0 = SCHEDULING_FCFS */
    /* Speculative decoding by prompt lookup (draftless n-gram, docs/speculative.md): each step a
     * decoding sequence appends up to spec_draft tokens (fewer under its adaptive length) that
     * followed the latest earlier occurrence of its last spec_ngram (down to spec_ngram_min)
     * tokens, and the step verifies them by sampling the target's own tokens from their rows; the output's
     * distribution (and a seeded sample's tokens) do not change. 0 = off. Requests with
     * speculative "off" never draft (spec_draft > 0 turns the device-greedy path off); constrained ones do (their
     * grammar matcher advances only by the tokens taken). */
    int   spec_draft;
    int   spec_ngram;          /* 0 = 3 */
    int   spec_ngram_min;      /* the shortest match prompt lookup tries (vLLM's prompt_lookup_min),
                                  in [1, spec_ngram]; 0 = 2 */
    int   spec_max_batch;      /* draft only while at most this many sequences run (a full batch
                                  already keeps the cores busy: verifying drafts there costs more
                                  than it saves); 0 = 4 */
    /* A draft model (checkpoint directory or GGUF file) instead of prompt lookup: it must share
     * the served model's tokenizer (refused at load otherwise), keeps its own KV cache for at most
     * spec_max_batch sequences (draft.h), and proposes spec_draft tokens (0 = 5) a step by
     * sampling under each request's own controls; the target verifies them with the general
     * rejection rule, so the output's distribution does not change (docs/speculative.md). At any
     * tp / pp / dp: on the first rank of each replica only, unsharded. NULL = none. */
    const char *draft_model_dir;
    /* draft_model_dir is an EAGLE-1 head (a safetensors file: draft.h draft_load_eagle) on the
     * served model's own hidden states, not a model of its own (--speculative eagle). The served
     * model must be a decoder with rotary positions, experts or not (the head's own layer is a
     * dense Llama-style one). */
    int draft_eagle;
    /* With a draft model (or EAGLE head): prompt lookup first, as with spec_ngram above, and the
     * draft only for the sequences whose last spec_ngram (down to 2) tokens have no earlier match
     * this step (--spec-ngram N beside --draft-model: Arctic Inference's suffix + EAGLE idea, a
     * copied span is often longer and surer than a small draft's guess). 0 = the draft alone. */
    int spec_lookup_first;
    /* With a draft model (or EAGLE head): a step's chain of drafts ends before a position where
     * the draft's best token has a probability below this under the softmax of its own logits
     * (temperature 1; over the token map when there is one): llama.cpp's --draft-p-min, EAGLE-2's
     * observation that a draft's confidence predicts its acceptance. Judged before the draft's
     * token is drawn, so sampled requests keep the target's distribution. 0 = drafts every position
     * the adaptive length asks for. A request's speculative_p_min overrides it. */
    float spec_p_min;
    /* Drafts from a corpus of the model's own earlier outputs (engine_set_spec_corpus,
     * spec_corpus.h): where prompt lookup finds nothing (or does not run: a draft model without
     * spec_lookup_first), the continuation most occurrences of the sequence's last tokens share in
     * the corpus, before the draft model's. spec_corpus_min: the shortest match, in [1,
     * SPEC_CORPUS_MAX_MATCH]; 0 = 3. spec_corpus_p_min: a draft goes on while the share of the
     * occurrences that agree with it stays at least this, in [0, 1]; 0 = 0.5 (docs/speculative.md
     * "Drafts from a corpus": the replay that chose both). */
    int   spec_corpus_min;
    float spec_corpus_p_min;
    /* Drafts learned from the engine's own answers (suffix decoding's global tree: Arctic
     * Inference, vLLM's "suffix" method): each finished sample's output, after the last
     * SPEC_LEARN_LEAD tokens of its prompt, joins the corpus (the given one, if any, stays; the
     * learned texts come after it), at a step boundary (conductor_speculate.c learn_flush); beyond
     * this many learned ids the oldest learned texts are forgotten. 0 = off; needs speculation on;
     * at most SPEC_LEARN_MAX. Each replica learns from its own answers. */
    int64_t spec_corpus_learn;
    /* The learned texts kept across restarts in this file (`serve --spec-corpus-keep FILE`;
     * spec_corpus.h for its layout): read into the corpus by engine_create when the file is
     * there (a file of another kind, another tokenizer's, or altered is refused by name and left
     * as it is), written back (a temporary renamed over it) at most every SPEC_KEEP_EVERY_S (60 s)
     * while answers join (by a thread of its own, from a copy), and when the engine is freed: a
     * crash loses at most the last minute's.
     * Needs spec_corpus_learn; one replica (dp 1). NULL = not kept. */
    const char *spec_corpus_keep;
    /* The draft's vocabulary cut to the token ids listed in this file (a JSON array: SGLang's
     * --speculative-token-map, FR-Spec's frequency-ranked head): its LM head computes only those
     * rows, so a draft token costs less, and its drafts are only those tokens (the target still
     * verifies them with the same rule: the output's distribution does not change). NULL = the
     * whole vocabulary. Needs draft_model_dir. */
    const char *draft_token_map;
    /* Multi-rank serving (under mpirun): every rank calls engine_create with the same options;
     * rank 0 conducts (requests, scheduler, sampling) and every other rank runs
     * engine_run_worker. world NULL or a world of one: one rank. The world holds
     * dp x pp x tp ranks: dp data-parallel replicas, each a tp x pp model with its own
     * scheduler and KV cache (led by its first rank); rank 0 routes each request to a replica
     * (the least loaded, preferring one that served the same prompt prefix). */
    struct parallel_world *world; /* borrowed */
    int   tp, pp;
    int   dp;                  /* replicas; 0 = world size / (tp x pp) */
    int   ep_group;            /* 1: the layout's tp ranks are an expert-parallel group (--ep N
                                  sets tp = N and this; model_parallel.ep, moe_ep.c) */
    int   ep_tp;               /* with ep_group: attention, the vocabulary and the norms tensor-
                                  parallel over this many consecutive ranks of the group (--ep E
                                  --tp T sets tp = E x T and ep_tp = T; parallel_groups_add_atp);
                                  0 or 1: whole on every rank of the group */
    const char *pp_layers;     /* layers per pipeline stage ("2,3"); NULL = balanced */
    int   pp_microbatches;     /* micro-batches per step when pp > 1 (0 or 1 = off): the step's
                                  sequences are split so that pipeline stages overlap; off by
                                  default (each micro-batch reads the weights again) */
    double rank_timeout_s;     /* conductor: a peer making no progress this long is gone
                                  (0 = wait forever); set once the model is loaded */
    /* Called once, on the engine thread (the router thread with data parallelism), when the
     * engine can no longer run (a rank gone): every request has then finished with an error
     * (with data parallelism: those on the other replicas; rank 0's own replica's requests end
     * when the caller drains) and new ones are refused with UNAVAILABLE. */
    void (*on_fatal)(void *ctx, enum status st, const char *message);
    void *fatal_ctx;
    /* LoRA adapters served without merging (PEFT directories, lora.h), selected per request by
     * name (request_params.adapter); requests with different adapters share one batch. CPU
     * (f32) and tp 1 only for now; every rank loads them (pp: each stage its layers). */
    const char *const *adapter_names; /* (n_adapters) */
    const char *const *adapter_dirs;  /* (n_adapters) */
    int   n_adapters;
    int   max_loras;           /* adapters loaded at once at most, start-up ones included, in
                                  [0, ENGINE_MAX_ADAPTERS]; 0 = n_adapters (no room for
                                  engine_load_adapter) */
    int   max_lora_rank;       /* the largest rank the serving scratch is sized for (start-up and
                                  run-time adapters); 0 = the largest start-up rank, or 16 when
                                  it is smaller and max_loras leaves room for run-time loads */
};
struct engine_options engine_options_default(void);

/* What a request asks for. Arrays are borrowed by engine_submit, which copies them. */
#define REQUEST_MAX_END_IDS 4
/* What a constraint's source is (request_params.constraint); engine/grammar/grammar.h. */
/* Per-request speculative decoding (docs/speculative.md). The wire names are these values'
 * lower-case names ("auto", "off"); speculative_mode_parse is their one reader. */
enum speculative_mode {
    SPECULATIVE_MODE_AUTO = 0,  /* draft when the server speculates and the adaptive rule allows */
    SPECULATIVE_MODE_OFF  = 1,  /* never draft: decode one token per step */
};

/* Reads "auto" or "off" (NULL or "" read as auto) into *out. Anything else is
 * STATUS_INVALID_ARGUMENT whose message names `field` and the allowed values. */
enum status speculative_mode_parse(const char *s, const char *field, enum speculative_mode *out);

/* Flags of a lazy constraint's trigger (request_params.constraint_trigger_len): when its first
 * byte is below 32, its first TRIGGER_HEADER_LEN bytes hold them (engine_trigger_header); the
 * marker follows. Reasoning is the text from <think> to
 * </think> (or the markers TRIGGER_MARKERS_* name), as the server's reply parser reads it
 * (server/tool_stream.c): the marker is watched for only after it, so a marker written while
 * reasoning triggers nothing. */
enum {
    TRIGGER_MAY_REASON   = 1, /* an output that opens (whitespace skipped) with <think> reasons first;
                                 with no marker (an opening constraint: a whole-output constraint
                                 under a template where the model may open <think> itself) the
                                 output is constrained from its first token to the grammar or
                                 <think> (no whitespace before it), and after </think> (whitespace
                                 skipped) to the grammar: constraint.h constraint_opening */
    TRIGGER_IN_REASONING = 2, /* the output starts inside reasoning (the prompt ended with <think>);
                                 the only case where the marker may be empty (the grammar then
                                 starts right after </think>, whitespace skipped) */
    TRIGGER_ANCHORED     = 4, /* the marker must be the first bytes (whitespace skipped) of the reply
                                 after any reasoning, and is the call's first bytes: the grammar reads
                                 it (Llama 3's bare `{"name": ...}` call); otherwise never triggers */
    TRIGGER_READS_MARKER = 8, /* the marker is the call's first bytes wherever it comes: the grammar
                                 reads it, then what follows (several markers, each opening its own
                                 kind of call: Qwen3-Coder's <tool_call> and bare <function=); bytes
                                 the grammar refuses leave the sample free, the next marker looked for */
    TRIGGER_MARKERS_SHIFT = 4, /* bits 4 and up: the reasoning markers, TRIGGER_MARKERS_* */
    TRIGGER_HEADER_LEN    = 2, /* the flags' bytes before a trigger's marker */
    TRIGGER_MAX_MARKERS   = 4, /* markers of one trigger (TRIGGER_MARKER_SEP between them) */
};
/* Between the markers of a trigger: the first marker the output completes is the trigger (each
 * non-empty; with TRIGGER_ANCHORED, the reply's first bytes are one of them). */
#define TRIGGER_MARKER_SEP '\x1f'
#define TRIGGER_MARKER_SEP_STR "\x1f"
/* The reasoning markers of a trigger's flags (flags >> TRIGGER_MARKERS_SHIFT). */
enum {
    TRIGGER_MARKERS_THINK,   /* <think> ... </think> */
    TRIGGER_MARKERS_MISTRAL, /* [THINK] ... [/THINK] */
    TRIGGER_MARKERS_THOUGHT, /* <|begin_of_thought|> ... <|end_of_thought|> */
    TRIGGER_MARKERS_HARMONY, /* GPT-OSS: <|channel|>analysis<|message|> ... <|end|> (one analysis
                                message; the watch then reads what follows as the reply) */
    TRIGGER_MARKERS_GEMMA4,  /* Gemma 4: <|channel>thought\n ... <channel|> */
    TRIGGER_MARKERS_R7B,     /* Command R7B: <|START_THINKING|> ... <|END_THINKING|> */
    TRIGGER_MARKERS_SEED,    /* Seed-OSS: <seed:think> ... </seed:think> */
};
/* The opening (close = 0) or closing (close = 1) marker of TRIGGER_MARKERS_* kind; NULL for a
 * kind that is none of them. The one table of them: the server's reply parser reads it too. */
const char *engine_reasoning_marker(int kind, int close);
/* Writes the header of a trigger's flags (TRIGGER_* and the markers' kind << TRIGGER_MARKERS_SHIFT)
 * into out: 8 + the low three bits (16 + the low four when TRIGGER_READS_MARKER is set), then
 * 1 + the kind (no byte is NUL or 32 or more, so a marker never reads as one). Returns its
 * length: 0 for flags 0 (no header), else TRIGGER_HEADER_LEN. */
int engine_trigger_header(int flags, char out[TRIGGER_HEADER_LEN]);
/* Reads the header of a trigger of n bytes at src into *flags (0 when there is none): returns its
 * length, or -1 when the first byte is below 32 but the header is not one of known markers. */
int engine_trigger_read(const char *src, size_t n, int *flags);

enum constraint_kind {
    CONSTRAINT_NONE,
    CONSTRAINT_JSON_SCHEMA, /* a JSON Schema document */
    CONSTRAINT_JSON_OBJECT, /* any JSON object (the source is ignored) */
    CONSTRAINT_REGEX,       /* a regular expression the whole output must match */
    CONSTRAINT_GRAMMAR,     /* a GBNF grammar (llama.cpp's format) */
    CONSTRAINT_CHOICE,      /* a JSON array of strings: the output is one of them */
};
struct request_params {
    struct sampling_params sampling;  /* temperature 0 = greedy */
    int      has_seed;                /* 0: the engine picks a seed and reports it */
    int      max_tokens;              /* >= 0; 0 with prompt_logprobs = score the prompt only */
    int      min_tokens;              /* EOS and stops are ignored before this many tokens */
    int      ignore_eos;
    int      show_special;            /* the text shows special tokens (tokenizer.h's
                                         detokenizer_show_special; vLLM's skip_special_tokens
                                         false). A stop or EOS id that ends the sample is never
                                         shown */
    const int32_t *stop_token_ids;    /* (n_stop_token_ids) */
    int      n_stop_token_ids;
    const char *const *stop;          /* (n_stop) stop strings, matched on the detokenized text
                                         across token boundaries, not included in the output */
    int      n_stop;
    int32_t  end_ids[REQUEST_MAX_END_IDS]; /* (n_end_ids) the chat template's end-of-turn tokens:
                                         they end the sample as EOS does (finish reason EOS,
                                         banned before min_tokens, not under ignore_eos) */
    int      n_end_ids;
    enum constraint_kind constraint_kind; /* structured output: every sampled token keeps the
                                         output a prefix of a sentence of the constraint; the
                                         sample ends when the sentence is complete and nothing
                                         may follow, and EOS is allowed only where it may end */
    const char *constraint;           /* (constraint_len) its source; copied at submission */
    size_t   constraint_len;
    size_t   constraint_trigger_len;  /* 0, or a lazy constraint (tool_choice auto, docs/tools.md):
                                         the first constraint_trigger_len bytes of constraint are
                                         a trigger (at most REQUEST_MAX_TRIGGER_BYTES), the rest
                                         the grammar's source. Decoding is free (the logits
                                         untouched) until the output holds the trigger; from its
                                         end (leading whitespace skipped where the grammar
                                         refuses it) the grammar constrains it as a
                                         constraint does (the sample ends with the grammar).
                                         A trigger whose first byte is below 8 opens with
                                         TRIGGER_* flags, the marker after it */
    int      logprobs;                /* -1: none; 0: the chosen token's; k > 0: and top-k */
    int      prompt_logprobs;         /* -1: none; >= 0: log p of each prompt token after the
                                         first (and top-k alternatives when > 0) */
    int      n;                       /* independent samples of the prompt, >= 1 */
    const int32_t *logit_bias_ids;    /* (n_logit_bias) added to the logits before sampling */
    const float   *logit_bias_values;
    int      n_logit_bias;
    double   deadline;                /* CLOCK_MONOTONIC seconds; 0 = none */
    const char *adapter;              /* a served LoRA adapter's name; NULL or "" = the base model */
    const char *client;               /* who asked (an API key's name, a connection's peer, a
                                         user field), for SCHEDULING_FAIR: samples of one
                                         client share its turn; NULL or "" = one anonymous client */
    const char *cache_salt;           /* vLLM's cache_salt: the prefix cache shares blocks only
                                         between requests of the same salt (and owner under
                                         prefix_cache_per_owner); NULL or "" = none */
    const char *owner;                /* the API key's owner that the server authenticated (NULL or
                                         "" without API keys): a learned speculative corpus drafts
                                         for a request only from the answers of the same owner and
                                         adapter (--spec-corpus-learn; a self-declared `user` is
                                         not an owner) */
    int      priority;                /* SCHEDULING_PRIORITY: lower runs first (vLLM's
                                         convention); must be 0 under the other policies */
    enum speculative_mode speculative; /* whether this request's samples may draft when the
                                         server speculates (--speculative); default AUTO */
    int      speculative_n_max;       /* most drafts per step for this request (llama.cpp's
                                         speculative.n_max); 0 = the server's --spec-draft */
    float    speculative_p_min;       /* the draft's least confidence to go on drafting (llama.cpp's
                                         speculative.p_min, engine_options.spec_p_min) for this
                                         request; < 0 (the default) = the server's --spec-p-min */
    /* Resuming a sample a journal recorded (server/journal.c, docs/reliability.md): its first
     * n_resume tokens are the ones it already generated (computed into the KV cache like a
     * preempted sample's, never emitted again; stop strings, the constraint and penalties see
     * them), and its RNG continues from resume_rng (4 words: engine_event.rng of its last
     * event, or engine_sample_rng's start). n must be 1, prompt_logprobs -1, and n_resume below
     * max_tokens, which counts them. resume_rng NULL: a new request. */
    const int32_t  *resume_tokens;    /* (n_resume) */
    int             n_resume;
    const uint64_t *resume_rng;
};
struct request_params request_params_default(void);

struct top_logprob {
    int32_t id;
    float   logprob;
};

enum engine_event_kind {
    ENGINE_EVENT_PROMPT_LOGPROBS, /* once, before tokens, when prompt_logprobs >= 0 */
    ENGINE_EVENT_TOKENS,          /* new tokens of one sample (possibly with no text yet) */
    ENGINE_EVENT_FINISHED,        /* the sample ended: finish reason, usage, remaining text */
};

/* Everything an event points to is valid only during the callback. */
struct engine_event {
    enum engine_event_kind kind;
    uint64_t       handle;        /* as returned by engine_submit */
    const char    *request_id;
    int            sample;        /* 0 .. n-1 */
    const int32_t *tokens;        /* (n_tokens) new token ids (TOKENS; prompt ids for PROMPT_LOGPROBS) */
    int            n_tokens;
    const char    *text;          /* new complete UTF-8 text (text_len bytes, not NUL-terminated) */
    size_t         text_len;
    const float   *logprobs;      /* (n_tokens) log p of each token, or NULL when not asked;
                                     PROMPT_LOGPROBS: entry 0 (the first prompt token) is 0 */
    const struct top_logprob *top;/* (n_tokens, n_top), or NULL */
    int            n_top;
    enum finish_reason finish;    /* FINISHED only */
    enum status    status;        /* FINISHED with FINISH_REASON_ERROR: why */
    const char    *message;
    int            prompt_tokens, completion_tokens; /* usage so far (this sample) */
    uint64_t       seed;          /* the seed used (chosen by the engine when not given) */
    int            cached_prompt_tokens; /* prompt tokens served from the prefix cache */
    double         queue_seconds; /* FINISHED: from submission to the sample's first step in the
                                     engine (its first admission), -1 if it never ran */
    const uint64_t *rng;          /* TOKENS and FINISHED of a sample that ran: its RNG state (4
                                     words) after these tokens, what request_params.resume_rng
                                     takes to continue it (with data parallelism carried from
                                     remote replicas too); NULL otherwise */
};

/* Whether ev tells of the engine's own failure (a rank gone or hung: FINISHED with
 * FINISH_REASON_ERROR and STATUS_UNAVAILABLE, the only events with that status): the request
 * is not at fault, and a journaling server leaves it open for its restart to resume. */
static inline int engine_event_is_failure(enum engine_event_kind kind, enum finish_reason finish, enum status st)
{
    return kind == ENGINE_EVENT_FINISHED && finish == FINISH_REASON_ERROR && st == STATUS_UNAVAILABLE;
}

/* Called on the engine thread (with data parallelism: the thread of the replica serving the
 * request, rank 0's engine thread or its router thread, so different requests' events may
 * arrive concurrently; one request's events come from one thread, in order); must not block
 * and must not call into the engine except engine_cancel. After the FINISHED event of the last
 * sample, the request is gone and the callback is never called for it again. */
typedef void (*engine_event_fn)(void *ctx, const struct engine_event *ev);

/* The RNG state (4 words) sample `sample` of a request with this seed starts from: the
 * resume_rng of a journaled sample that has no event yet. */
void engine_sample_rng(uint64_t seed, int sample, uint64_t out[4]);

/* Loads the model and tokenizer and sizes the KV pool; does not start a thread. Errors are
 * returned with a message (bad directory, model, or options); *out is NULL then. */
enum status engine_create(const struct engine_options *o, struct engine **out);
/* Stops the thread if running (cancelling what is left) and frees everything; accepts NULL. */
void        engine_free(struct engine *e);

/* The tokenizer of the loaded model (borrowed; thread-safe for encode/decode). */
const struct tokenizer *engine_tokenizer(const struct engine *e);

/* Checks the request against the model and the engine's limits without submitting: returns
 * STATUS_INVALID_ARGUMENT with a message naming the field and its allowed range (empty prompt,
 * token ids outside the vocabulary, prompt + max_tokens beyond the context, a request that
 * could never fit the KV pool, sampling parameters, n, logprobs ...). */
enum status engine_validate(const struct engine *e, const int32_t *prompt, int n_prompt,
                            const struct request_params *p);

/* Whether a request of n_prompts prompts with n samples each, submitted together (an HTTP
 * completions request with a list of prompts), could ever be queued whole: STATUS_INVALID_ARGUMENT
 * when its samples exceed what the waiting queues hold (--max-queue on each data-parallel
 * replica), which no retry changes; engine_submit's STATUS_RESOURCE_EXHAUSTED for a full queue
 * is then kept for what a retry can cure. */
enum status engine_validate_prompts(const struct engine *e, int n_prompts, int n);

/* Queues a request (thread-safe). Copies prompt, params' arrays and request_id (NULL or "":
 * the engine assigns one; read it back from events). On success *handle identifies the request
 * and on_event will eventually receive a FINISHED event for every sample. Errors: as
 * engine_validate, STATUS_RESOURCE_EXHAUSTED when the waiting queue is full,
 * STATUS_UNAVAILABLE when the engine is draining or stopped; then on_event is never called. */
enum status engine_submit(struct engine *e, const char *request_id, const int32_t *prompt,
                          int n_prompt, const struct request_params *p, engine_event_fn on_event,
                          void *ctx, uint64_t *handle);

/* Cancels a request by handle or by request id (thread-safe; unknown ids are ignored and
 * return STATUS_NOT_FOUND). The request leaves the batch at the next step boundary, its blocks
 * return to the pool, and each unfinished sample gets FINISHED with FINISH_REASON_CANCELLED. */
enum status engine_cancel(struct engine *e, uint64_t handle);
enum status engine_cancel_id(struct engine *e, const char *request_id);

/* Runs one step on the calling thread (tests and single-threaded drivers; never while the
 * engine thread runs). Returns the number of sequences that were waiting or running before
 * the step (0 = idle). */
int engine_step(struct engine *e);

/* Whether this rank conducts (rank 0, or a world of one): only the conductor accepts requests. */
int engine_is_conductor(const struct engine *e);

/* On a worker rank: replays the conductor's step plans through the model until the conductor
 * stops (engine_free or engine_drain on rank 0); on the first rank of a data-parallel replica
 * other than rank 0's, runs that replica's engine for the requests rank 0 routes to it, until
 * rank 0 shuts it down. Returns STATUS_OK then, or the error that broke the world (a peer rank
 * gone). */
enum status engine_run_worker(struct engine *e);

/* Gives the engine a corpus to draft from (engine_options.spec_corpus_min, spec_corpus_p_min;
 * spec_corpus.h): texts back to back in ids[0..n), each ended by -1 (copied and indexed). Before
 * engine_start, with speculation on (spec_draft > 0), one replica (dp 1):
 * STATUS_FAILED_PRECONDITION or STATUS_UNSUPPORTED naming what is missing otherwise;
 * STATUS_INVALID_ARGUMENT for an id outside the vocabulary. A second call replaces the first.
 * Texts read from engine_options.spec_corpus_keep's file (at engine_create) stay, after these. */
enum status engine_set_spec_corpus(struct engine *e, const int32_t *ids, int64_t n);

/* Starts the engine thread, which steps while there is work and sleeps otherwise. */
enum status engine_start(struct engine *e);
/* Refuses new submissions (STATUS_UNAVAILABLE), lets running and queued requests finish for up
 * to timeout_s seconds, cancels what is left, and stops the thread. */
void engine_drain(struct engine *e, double timeout_s);

struct engine_stats {
    int      waiting, running;          /* samples now; a waiting request not started yet counts n */
    int      kv_blocks_total, kv_blocks_free, kv_blocks_cached; /* cached: reusable prefix blocks */
    int      block_tokens;
    uint64_t requests_submitted, requests_finished;
    uint64_t prompt_tokens, prefill_tokens_computed, prefix_cache_hit_tokens;
    uint64_t generated_tokens;
    uint64_t steps, preemptions;
    uint64_t spec_drafted, spec_accepted;   /* draft tokens verified, and accepted */
    uint64_t spec_lookup_drafted, spec_lookup_accepted; /* of those, the ones prompt lookup drafted
                                               (all of them with --speculative ngram; the lookup
                                               share beside a draft model, spec_lookup_first) */
    uint64_t spec_corpus_drafted, spec_corpus_accepted; /* of those, the ones the corpus drafted
                                               (engine_set_spec_corpus, spec_corpus_learn) */
    uint64_t spec_corpus_tokens;            /* the corpus's tokens now, given and learned */
    uint64_t spec_backoffs;                 /* times a sequence stopped drafting for low acceptance
                                               (docs/speculative.md, the adaptive rule) */
    /* --verify-prefix-cache (conductor_verify.c): prompts served from the prefix cache and
     * recomputed without it, those whose logits differed, those not verified for want of free
     * blocks, and the largest logit difference seen. */
    uint64_t prefix_cache_verified, prefix_cache_mismatches, prefix_cache_verify_skipped;
    double   prefix_cache_max_abs_diff;
    uint64_t embed_passes;              /* embedding forward passes (conductor_embed.c), which
                                           hold the inputs of one or more requests */
};
void engine_get_stats(struct engine *e, struct engine_stats *s); /* thread-safe snapshot; with
                                     data parallelism the sum over replicas (remote ones as of
                                     their last report, at most ~0.2 s old) */

/* A mixture of experts' load (moe.h, moe_load_read): load (n_layers, n_experts), malloc'd, the
 * tokens routed to each expert of layers layer_first .. layer_first + n_layers - 1 by the serving
 * forwards since start (every token run: k per token and layer). Those are the layers of rank 0's
 * pipeline stage, routed by rank 0's replica: with pp > 1 the later stages' layers, and with
 * dp > 1 the other replicas' tokens, are not included. */
struct engine_expert_load {
    int       layer_first, n_layers, n_experts;
    uint64_t *load;
};
/* Thread-safe snapshot into *out (free out->load); all zero and load NULL for a dense model.
 * STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status engine_get_expert_load(struct engine *e, struct engine_expert_load *out);

/* Data-parallel replicas, as rank 0's router sees them (thread-safe). */
struct engine_replica_stats {
    int      leader_rank;               /* world rank of the replica's first rank */
    int      outstanding;               /* samples routed here and not finished */
    uint64_t routed;                    /* requests routed here */
    uint64_t routed_by_prefix;          /* of those, chosen for a matching prompt prefix */
    double   report_age_s;              /* age of `engine` (0 for rank 0's own replica) */
    struct engine_stats engine;         /* the replica's engine */
};
int  engine_replicas(const struct engine *e);  /* dp (1 without data parallelism) */
void engine_get_replica_stats(struct engine *e, int replica, struct engine_replica_stats *s);

/* LoRA adapters at run time (thread-safe; admin operations). Only a single-rank replica on the
 * CPU backend with f32 compute (the setup that serves adapters at all) loads at run time;
 * elsewhere both calls return STATUS_UNSUPPORTED with a message (with data parallelism too).
 *
 * engine_load_adapter reads and checks the PEFT adapter in dir on the calling thread (a missing
 * directory or file: STATUS_NOT_FOUND; shapes the base does not have, another architecture, an
 * unsupported option or a rank above max_lora_rank: STATUS_INVALID_ARGUMENT /
 * STATUS_BAD_FORMAT, each naming the file), then hands the finished adapter to the engine
 * thread, which puts it in the model at the next step boundary. A request submitted after the
 * call returns may name it. A taken name: STATUS_ALREADY_EXISTS; max_loras adapters loaded:
 * STATUS_RESOURCE_EXHAUSTED; a bad name: STATUS_INVALID_ARGUMENT.
 *
 * engine_unload_adapter refuses while requests (queued or running) use the adapter:
 * STATUS_FAILED_PRECONDITION naming how many (cancel them or retry when they finish). On
 * success the name is free at once (new requests naming it fail with STATUS_NOT_FOUND, and it
 * may be loaded again); the memory is freed at the next step boundary. An unknown name:
 * STATUS_NOT_FOUND. Prefix-cache blocks computed under an unloaded adapter never serve another. */
enum status engine_load_adapter(struct engine *e, const char *name, const char *dir);
enum status engine_unload_adapter(struct engine *e, const char *name);

struct engine_adapter_info {
    const char *name;
    const char *dir;
    int         rank;
    float       alpha;
    int         n_requests;            /* queued or running requests that use it */
};
/* Calls fn for every loaded adapter, in load order, under the engine's lock (fn must not call
 * into the engine; what info points to is valid during the call only). Returns how many. With
 * data parallelism: rank 0's replica (every replica has the same start-up adapters). */
int engine_list_adapters(struct engine *e, void (*fn)(void *ctx, const struct engine_adapter_info *info), void *ctx);

/* Embeddings (docs/embeddings.md): how a sequence's final hidden states become one vector. */
enum embed_pooling {
    EMBED_POOLING_DEFAULT = 0, /* MEAN for an encoder (sentence-transformers' all-MiniLM-L6-v2), LAST
                                  for a decoder */
    EMBED_POOLING_MEAN,        /* the mean over every row of the input */
    EMBED_POOLING_CLS,         /* the first row (BERT's [CLS] token) */
    EMBED_POOLING_LAST,        /* the last row (a causal decoder's view of the whole input) */
};

/* Embeds n_inputs token sequences (thread-safe; blocks until done): input i is
 * tokens[offsets[i] .. offsets[i+1]) (offsets[0] = 0), encoded as the caller wants it (an
 * encoder's [CLS] ... [SEP] included). The engine thread runs them in forward passes of at most
 * max_batch_tokens rows and max_seqs inputs, one pass before each generation step (the two
 * take turns), without the KV cache; a pass holds the inputs of several concurrent requests
 * (engine_embed_submit)
 * (bidirectional attention for an encoder, causal for a decoder); out (n_inputs, d_model) f32
 * receives each input's pooled final hidden state (after a decoder's final norm), divided by its
 * L2 norm when normalize. Errors: STATUS_INVALID_ARGUMENT naming the input for an empty one, an
 * id outside the vocabulary, or one longer than the model's context (max_positions) or than
 * max_batch_tokens (an input is never split: bidirectional attention needs it whole);
 * STATUS_UNSUPPORTED with more than one rank (tp, pp or dp > 1); STATUS_UNAVAILABLE while the
 * engine drains or after it failed. */
enum status engine_embed(struct engine *e, const int32_t *tokens, const int32_t *offsets, int n_inputs,
                         enum embed_pooling pooling, int normalize, float *out);

/* engine_embed without blocking (the gRPC front's Embed, whose loop thread must not wait): the
 * same inputs, checks and passes, with the outcome given to done. Every pointer of *req, and req
 * itself, is borrowed until done has been called. */
struct engine_embed_req {
    const int32_t     *tokens;   /* (offsets[n_inputs]) */
    const int32_t     *offsets;  /* (n_inputs + 1), offsets[0] = 0 */
    int                n_inputs;
    enum embed_pooling pooling;
    int                normalize;
    float             *out;      /* (n_inputs, d_model) */
    /* Called exactly once when the request ended (STATUS_OK: out is filled; else st and its
     * message), on the engine thread, or on the submitting thread before engine_embed_submit
     * returns when no engine thread runs. It must not call into the engine's embeddings. */
    void (*done)(void *ctx, enum status st, const char *message);
    void              *ctx;
};
/* Queues req (the errors of engine_embed are returned at once, and then done is never called).
 * Requests run in arrival order; consecutive ones with the same pooling and normalize share
 * forward passes (one pass holds the inputs of several requests). */
enum status engine_embed_submit(struct engine *e, const struct engine_embed_req *req);
/* Thread-safe. req, submitted and whose done has not run yet, ends with STATUS_CANCELLED before
 * its next pass (done still comes); a no-op for a request that has ended. */
void        engine_embed_cancel(struct engine *e, const struct engine_embed_req *req);

/* Model facts for GetModelInfo. */
struct engine_model_info {
    const char *architecture;
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, ffn_hidden, vocab_size, max_positions;
    const char *dtype;                 /* compute dtype on the device */
    const char *quantization;          /* block types the weights are kept in ("Q4_1,Q8_0"), "none" */
    const char *chat_template;         /* the model's own Jinja chat template, or NULL (checkpoint.h) */
    const char *device;                /* "cpu" / "cuda" */
    int tp_size, pp_size, dp_size;
    int block_tokens, kv_blocks;       /* kv_blocks: per replica (rank 0's) */
    int bos_id, eos_id;
    int max_loras, max_lora_rank;      /* adapters loaded at once at most, the largest rank */
    int max_queue;                     /* samples waiting per replica at most (--max-queue) */
    int encoder;                       /* 1: an encoder (BERT): embeddings only, generation refused */
    int max_batch_tokens;              /* the longest input engine_embed takes (with max_positions) */
};
void engine_get_model_info(const struct engine *e, struct engine_model_info *info);

#ifdef __cplusplus
}
#endif

#endif
