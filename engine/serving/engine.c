/* engine/serving/engine.c - the serving engine (see engine.h): request intake, the continuously
 * batched scheduler, sampling, detokenization, stop conditions, events, and the engine thread.
 *
 * Each step:
 *   1. intake: newly submitted requests join the waiting queue (FCFS); cancellations and
 *      deadlines finish their samples and return their blocks;
 *   2. plan: every running sequence gets its rows for the step, decode rows (1 each) first,
 *      then prefill chunks, all under max_batch_tokens; a sequence that needs a block when the
 *      pool is dry preempts the newest running sequence (its blocks go back; it is recomputed
 *      later); waiting requests are admitted while the budget, max_seqs and the pool allow, after
 *      reusing any cached prefix blocks;
 *   3. forward: one model_forward over all rows, logits for the rows that end a sequence's
 *      pending tokens (and every prompt row when prompt log-probabilities are asked for);
 *   4. sample: each finished row yields a token per sample (n > 1 samples fork from the
 *      request's first sample when its prompt is done, sharing full blocks and copying the
 *      partial one), then text, stop checks and events.
 * Not here: the arithmetic (model.c), block pool (kv_cache.c), sampling maths (sampler.c). */
#include "engine.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kv_cache.h"
#include "model.h"
#include "parallel.h"
#include "router.h"
#include "tokenizer.h"

#define MAX_STOP_STRINGS 16
#define MAX_STOP_LEN 256
#define MAX_SAMPLES 16

const char *finish_reason_name(enum finish_reason r)
{
    switch (r) {
    case FINISH_REASON_NONE: return "none";
    case FINISH_REASON_LENGTH: return "length";
    case FINISH_REASON_STOP: return "stop";
    case FINISH_REASON_EOS: return "eos";
    case FINISH_REASON_CANCELLED: return "cancelled";
    case FINISH_REASON_DEADLINE: return "deadline";
    case FINISH_REASON_ERROR: return "error";
    }
    return "unknown";
}

struct engine_options engine_options_default(void)
{
    return (struct engine_options){.device = DEVICE_CPU, .block_tokens = 16, .max_batch_tokens = 512,
                                   .max_seqs = 64, .max_queue = 1024, .max_logprobs = 20,
                                   .prefix_caching = 1};
}

struct request_params request_params_default(void)
{
    return (struct request_params){.sampling = sampling_params_default(), .max_tokens = 16,
                                   .logprobs = -1, .prompt_logprobs = -1, .n = 1};
}

/* ---- requests and sequences --------------------------------------------------------------- */

struct request {
    uint64_t handle;
    char     id[128];
    int32_t *prompt;              /* (n_prompt) */
    int      n_prompt;
    struct request_params p;      /* arrays below are owned copies */
    int32_t *stop_ids;
    char    *stop[MAX_STOP_STRINGS];
    size_t   stop_len[MAX_STOP_STRINGS];
    int32_t *bias_ids;
    float   *bias_values;
    uint64_t seed;
    engine_event_fn on_event;
    void    *ctx;
    int      cancel_requested;    /* set under the engine mutex by engine_cancel */
    int      live_samples;        /* samples not yet FINISHED */
    int      forked;              /* samples 1..n-1 exist */
    float   *prompt_lp;           /* (n_prompt) prompt log-probabilities when asked */
    struct top_logprob *prompt_top; /* (n_prompt, prompt_logprobs) */
    int      prompt_lp_done;      /* rows of prompt_lp filled */
    int      prompt_lp_sent;
    struct request *next_all;     /* every live request, for cancel lookup */
    struct request *next_in;      /* the intake list */
};

enum seq_state { SEQ_WAITING, SEQ_RUNNING, SEQ_DONE };

struct seq {
    struct request *req;
    int      sample;
    enum seq_state state;
    int32_t *tokens;              /* (cap_tokens) prompt then generated */
    int      n_tokens, cap_tokens;
    int      n_generated;
    int      n_cached;            /* tokens whose K/V are in the cache */
    int32_t *blocks;              /* (cap_blocks) block table */
    int      n_blocks, cap_blocks;
    int      n_registered;        /* leading full blocks looked up or registered by hash */
    uint64_t last_hash;           /* prefix hash of block n_registered - 1 */
    int      prefix_checked;      /* the prefix cache was consulted on admission */
    int      cached_prompt_tokens;
    struct rng rng;
    struct detokenizer detok;
    char    *held;                /* (cap_held) text not yet emitted (stop-string look-back) */
    size_t   n_held, cap_held;
    uint64_t order;               /* admission order; the newest is preempted first */
    /* this step */
    int      row_start, n_rows, wants_sample;
    enum finish_reason doomed;    /* cancelled or past its deadline, seen at the step's start */
};

/* The step plan the conductor broadcasts to every rank: this header, then the arrays. */
struct step_plan_header {
    int32_t stop;                 /* 1: workers leave engine_run_worker */
    int32_t n_tokens, n_seqs, table_width, n_logits, n_copies;
    int32_t n_micro;              /* pipeline micro-batches of the step */
};

struct engine {
    struct engine_options o;
    struct router *router;        /* data parallelism: everything below is the router's replica */
    struct model_parallel par;    /* world of one when par.world is NULL */
    struct parallel_groups groups;
    int32_t *copies;              /* (cap_copies) pending (dst, src) block copy pairs, flattened */
    int      n_copies, cap_copies;  /* pairs; capacity in int32 elements */
    int32_t *plan;                /* (cap_plan) the packed arrays of a step plan */
    int      cap_plan;
    uint64_t worker_steps;        /* forwards run by engine_run_worker */
    int32_t *mb_qstart, *mb_rows; /* (max_seqs + 1), (max_logits): one micro-batch's offsets */
    int      failed;              /* the world broke: everything fails with UNAVAILABLE */
    char     failure[512];
    struct backend *b;
    struct model   *m;
    struct tokenizer *tok;
    struct kv_cache cache;
    struct sampler  smp;
    int      max_logits;
    float   *logits;              /* (max_logits, vocab) host */
    float   *scratch;             /* (2, vocab) log-softmax and a logits copy */
    int32_t *top_ids;             /* (vocab) */
    /* step arrays, (max_batch_tokens) or (max_seqs ...) */
    int32_t *f_tokens, *f_pos, *f_slots, *f_qstart, *f_seqlen, *f_table, *f_rows;
    int      table_width;         /* max blocks per sequence */
    struct seq **running;         /* (max_seqs) */
    int      n_running;
    struct seq **waiting;         /* FIFO ring of waiting sequences, (cap_waiting) */
    int      n_waiting, cap_waiting;
    uint64_t next_order;

    pthread_mutex_t mu;
    pthread_cond_t  cv;
    pthread_t thread;
    int       thread_running, stop_thread, draining;
    struct request *intake, *intake_tail;  /* submitted, not yet seen by the engine */
    int       n_intake;
    struct request *all;                  /* every live request */
    uint64_t  next_handle;
    struct engine_stats stats;            /* under mu */
};

/* ---- small helpers ------------------------------------------------------------------------ */

static enum status grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return STATUS_OK;
    int c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    *p = q;
    *cap = c;
    return STATUS_OK;
}

static void request_free(struct request *r)
{
    if (!r) return;
    free(r->prompt);
    free(r->stop_ids);
    for (int i = 0; i < MAX_STOP_STRINGS; i++) free(r->stop[i]);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->prompt_lp);
    free(r->prompt_top);
    free(r);
}

static void seq_free(struct seq *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    free(s->held);
    if (s->detok.tok) detokenizer_free(&s->detok);
    free(s);
}

static uint64_t sample_seed(uint64_t seed, int sample)
{
    /* Sample 0 uses the request's seed as is, so n = 1 matches `shardlm generate --seed`. */
    return sample == 0 ? seed : seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)sample);
}

static struct seq *seq_new(struct engine *e, struct request *r, int sample)
{
    struct seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->req = r;
    s->sample = sample;
    if (grow((void **)&s->tokens, &s->cap_tokens, r->n_prompt + r->p.max_tokens + 1, sizeof *s->tokens) != STATUS_OK) {
        free(s);
        return NULL;
    }
    memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof *s->tokens);
    s->n_tokens = r->n_prompt;
    rng_seed(&s->rng, sample_seed(r->seed, sample));
    detokenizer_init(&s->detok, e->tok);
    /* The prompt primes the detokenizer, so the first generated piece is spaced as a
     * continuation; its text is not part of the output. */
    for (int i = 0; i < r->n_prompt; i++) {
        const char *t;
        size_t n;
        if (detokenizer_push(&s->detok, r->prompt[i], &t, &n) != STATUS_OK) break;
    }
    return s;
}

/* ---- events ------------------------------------------------------------------------------- */

static void emit(struct engine *e, struct seq *s, struct engine_event *ev)
{
    struct request *r = s->req;
    ev->handle = r->handle;
    ev->request_id = r->id;
    ev->sample = s->sample;
    ev->prompt_tokens = r->n_prompt;
    ev->completion_tokens = s->n_generated;
    ev->seed = r->seed;
    ev->cached_prompt_tokens = s->cached_prompt_tokens;
    if (!ev->text) ev->text = ""; /* never NULL, so consumers may copy text_len bytes as is */
    (void)e;
    r->on_event(r->ctx, ev);
}

/* Text that can be emitted now: everything held except what could still be the start of a
 * stop string (the last MAX stop length - 1 bytes), cut back to a UTF-8 character boundary. */
static size_t releasable(const struct seq *s)
{
    const struct request *r = s->req;
    size_t keep = 0;
    for (int i = 0; i < r->p.n_stop; i++)
        if (r->stop_len[i] - 1 > keep) keep = r->stop_len[i] - 1;
    if (s->n_held <= keep) return 0;
    size_t n = s->n_held - keep;
    while (n > 0 && n < s->n_held && ((unsigned char)s->held[n] & 0xC0) == 0x80) n--;
    return n;
}

static void drop_held(struct seq *s, size_t n)
{
    memmove(s->held, s->held + n, s->n_held - n);
    s->n_held -= n;
}

/* Drops one live sample of r; the request is freed after its last. */
static void retire_sample(struct engine *e, struct request *r, int n_generated)
{
    pthread_mutex_lock(&e->mu);
    e->stats.generated_tokens += (uint64_t)n_generated;
    if (--r->live_samples > 0) {
        pthread_mutex_unlock(&e->mu);
        return;
    }
    struct request **pp = &e->all;
    while (*pp != r) pp = &(*pp)->next_all;
    *pp = r->next_all;
    e->stats.requests_finished++;
    pthread_mutex_unlock(&e->mu);
    request_free(r);
}

/* FINISHED for a sample that has no sequence (never forked, or could not be created). */
static void finish_absent(struct engine *e, struct request *r, int sample, enum finish_reason why,
                          enum status st, const char *message)
{
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .handle = r->handle, .text = "",
                              .request_id = r->id, .sample = sample, .finish = why, .status = st,
                              .message = message, .prompt_tokens = r->n_prompt, .seed = r->seed};
    r->on_event(r->ctx, &ev);
    retire_sample(e, r, 0);
}

/* Finishes a sample: releases its blocks, emits FINISHED with the first text_len bytes still
 * held, and marks the sequence SEQ_DONE (the step frees it when it compacts its lists; s->req
 * may be gone by then). A request's unforked samples finish with its first one. */
static void finish_seq(struct engine *e, struct seq *s, enum finish_reason why, enum status st,
                       const char *message, size_t text_len)
{
    struct request *r = s->req;
    kv_cache_release(&e->cache, s->n_blocks, s->blocks);
    s->n_blocks = 0;
    s->n_cached = 0;
    s->state = SEQ_DONE;
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .finish = why, .status = st,
                              .message = message, .text = s->held, .text_len = text_len};
    emit(e, s, &ev);
    if (s->sample == 0 && !r->forked) {
        r->forked = 1;
        for (int k = 1; k < r->p.n; k++) finish_absent(e, r, k, why, st, message);
    }
    retire_sample(e, r, s->n_generated);
    s->req = NULL;
}

/* ---- creation ----------------------------------------------------------------------------- */

enum status engine_create(const struct engine_options *opt, struct engine **out)
{
    *out = NULL;
    struct engine_options o = *opt;
    struct engine_options d = engine_options_default();
    if (!o.model_dir) return status_errorf(STATUS_INVALID_ARGUMENT, "engine: no model directory");
    if (o.block_tokens == 0) o.block_tokens = d.block_tokens;
    if (o.max_batch_tokens == 0) o.max_batch_tokens = d.max_batch_tokens;
    if (o.max_seqs == 0) o.max_seqs = d.max_seqs;
    if (o.max_queue == 0) o.max_queue = d.max_queue;
    if (o.max_logprobs == 0) o.max_logprobs = d.max_logprobs;
    if (o.block_tokens < 1 || o.block_tokens > 1024)
        return status_errorf(STATUS_INVALID_ARGUMENT, "block_tokens must be in [1, 1024], got %d", o.block_tokens);
    if (o.max_batch_tokens < 1 || o.max_seqs < 1 || o.max_queue < 1 || o.max_logprobs < 1 ||
        o.max_seqs > 4096 || o.max_batch_tokens > (1 << 20))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "engine limits must be positive (max_batch_tokens %d, max_seqs %d <= 4096, max_queue %d)",
                             o.max_batch_tokens, o.max_seqs, o.max_queue);
    if (o.max_batch_tokens < o.max_seqs)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "max_batch_tokens (%d) must be at least max_seqs (%d): every running sequence decodes one token per step",
                             o.max_batch_tokens, o.max_seqs);

    if (o.tp < 1) o.tp = 1;
    if (o.pp < 1) o.pp = 1;
    const int ranks = o.world ? o.world->size : 1;
    if (ranks % (o.tp * o.pp) != 0 || (o.dp > 0 && o.dp * o.tp * o.pp != ranks))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "the world has %d ranks, which is not dp x tp x pp (dp %d, tp %d, pp %d): launch with "
                             "mpirun -n <dp x tp x pp>", ranks, o.dp, o.tp, o.pp);
    const int dp = ranks / (o.tp * o.pp);

    struct engine *e = calloc(1, sizeof *e);
    if (!e) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    e->o = o;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_handle = 1;
    char path[4096];
    enum status st = STATUS_OK;
    if (dp > 1) { /* replicas, each an engine of its own, behind the router */
        if ((st = router_create(&o, dp, &e->router)) != STATUS_OK) goto fail;
        *out = e;
        return STATUS_OK;
    }
    const int multi = o.world && ranks > 1;
    int device_id = o.device_id;
    if (multi) {
        if ((st = parallel_layout(o.world, o.tp, o.pp, &e->par.layout)) != STATUS_OK) goto fail;
        device_id = o.world->local_rank; /* one GPU per rank on a node */
    }
    if ((st = backend_open((enum device)o.device, device_id, o.n_threads, &e->b)) != STATUS_OK) goto fail;
    if (multi) {
        if ((st = parallel_groups_init(o.world, &e->par.layout, (enum device)o.device, device_id, NULL, &e->groups)) != STATUS_OK)
            goto fail;
        e->par.world = o.world;
        e->par.groups = &e->groups;
        e->par.pp_layers = o.pp_layers;
    }
    snprintf(path, sizeof path, "%s/tokenizer.model", o.model_dir);
    st = tokenizer_load(path, &e->tok);
    if (st == STATUS_OK) st = model_load(o.model_dir, e->b, multi ? &e->par : NULL, &e->m);
    if (multi) st = parallel_agree(o.world, st); /* every rank fails together, none waits alone */
    if (st != STATUS_OK) goto fail;
    const struct model_config *c = &e->m->cfg;
    if (tokenizer_vocab_size(e->tok) > c->vocab_size) {
        st = status_errorf(STATUS_BAD_FORMAT, "%s: the tokenizer has %d pieces, the model only %d",
                           o.model_dir, tokenizer_vocab_size(e->tok), c->vocab_size);
        goto fail;
    }

    e->table_width = (c->max_positions + o.block_tokens - 1) / o.block_tokens; /* blocks per sequence */
    /* One logits row per running sequence, plus room for prompt log-probability rows; a large
     * vocabulary (262k for Gemma 3) makes every row cost 1 MiB on the device and the host. */
    e->max_logits = o.max_seqs + 64 < o.max_batch_tokens ? o.max_seqs + 64 : o.max_batch_tokens;
    if ((st = model_reserve(e->m, o.max_batch_tokens, o.max_seqs, e->table_width, e->max_logits)) != STATUS_OK) goto fail;
    /* The KV pool: bytes, a fraction of free memory, blocks, or enough for max_seqs full
     * contexts capped at 2 GiB. The weights and the workspace are already allocated. */
    const int bt = o.block_tokens;
    size_t block_bytes = kv_cache_block_bytes(e->m->n_layers_local, bt, e->m->n_kv_local, c->head_dim, e->m->dtype);
    long long n_blocks = o.kv_cache_blocks;
    if (o.kv_cache_bytes) {
        n_blocks = (long long)(o.kv_cache_bytes / block_bytes);
    } else if (o.kv_cache_fraction > 0) {
        size_t free_bytes = 0, total_bytes = 0;
        if (!(o.kv_cache_fraction <= 0.95)) {
            st = status_errorf(STATUS_INVALID_ARGUMENT, "kv_cache_fraction must be in (0, 0.95], got %g", o.kv_cache_fraction);
            goto fail;
        }
        if ((st = backend_mem_info(e->b, &free_bytes, &total_bytes)) != STATUS_OK) goto fail;
        n_blocks = (long long)((double)free_bytes * o.kv_cache_fraction / (double)block_bytes);
        LOG_INFO("engine", "KV pool: %.2f of %.0f MiB free", o.kv_cache_fraction, (double)free_bytes / 1048576.0);
    } else if (!n_blocks) {
        n_blocks = (long long)o.max_seqs * e->table_width;
        long long cap = (long long)((2ull << 30) / block_bytes);
        if (n_blocks > cap) n_blocks = cap;
    }
    if (multi) { /* every rank's pool must hold the same blocks: the conductor's count wins */
        int64_t nb = n_blocks;
        if ((st = parallel_bcast_bytes(o.world, &nb, sizeof nb, 0)) != STATUS_OK) goto fail;
        n_blocks = nb;
    }
    if (n_blocks < 1 || n_blocks > (1LL << 30)) {
        st = status_errorf(STATUS_INVALID_ARGUMENT, "the KV cache must hold at least one block of %zu bytes (got %lld blocks)",
                           block_bytes, n_blocks);
        goto fail;
    }
    if ((st = kv_cache_init(&e->cache, e->b, e->m->n_layers_local, (int)n_blocks, bt, e->m->n_kv_local,
                            c->head_dim, e->m->dtype)) != STATUS_OK)
        goto fail;
    if ((st = sampler_init(&e->smp, c->vocab_size)) != STATUS_OK) goto fail;
    const size_t V = (size_t)c->vocab_size, T = (size_t)o.max_batch_tokens, S = (size_t)o.max_seqs;
    e->logits = malloc((size_t)e->max_logits * V * sizeof *e->logits);
    e->scratch = malloc(2 * V * sizeof *e->scratch);
    e->top_ids = malloc(V * sizeof *e->top_ids);
    e->f_tokens = malloc(T * sizeof(int32_t));
    e->f_pos = malloc(T * sizeof(int32_t));
    e->f_slots = malloc(T * sizeof(int32_t));
    e->f_rows = malloc(T * sizeof(int32_t));
    e->f_qstart = malloc((S + 1) * sizeof(int32_t));
    e->f_seqlen = malloc(S * sizeof(int32_t));
    e->f_table = malloc(S * (size_t)e->table_width * sizeof(int32_t));
    e->running = calloc(S, sizeof *e->running);
    e->mb_qstart = malloc((S + 1) * sizeof(int32_t));
    e->mb_rows = malloc((size_t)e->max_logits * sizeof(int32_t));
    if (!e->logits || !e->scratch || !e->top_ids || !e->f_tokens || !e->f_pos || !e->f_slots ||
        !e->f_rows || !e->f_qstart || !e->f_seqlen || !e->f_table || !e->running || !e->mb_qstart || !e->mb_rows) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory for the step buffers");
        goto fail;
    }
    e->stats.kv_blocks_total = e->cache.n_blocks;
    e->stats.kv_blocks_free = e->cache.n_blocks; /* true before the first step too */
    e->stats.block_tokens = bt;
    /* Only the conductor times out: workers legitimately wait for the next plan forever. */
    if (multi && o.world->rank == 0) o.world->timeout_s = o.rank_timeout_s;
    LOG_INFO("engine", "ready: %d KV blocks of %d tokens (%.1f MiB), max_batch_tokens %d, max_seqs %d, prefix caching %s",
             e->cache.n_blocks, bt, (double)block_bytes * (double)e->cache.n_blocks / 1048576.0,
             o.max_batch_tokens, o.max_seqs, o.prefix_caching ? "on" : "off");
    *out = e;
    return STATUS_OK;
fail:
    engine_free(e);
    return st;
}

const struct tokenizer *engine_tokenizer(const struct engine *e)
{
    return e->router ? engine_tokenizer(router_local(e->router)) : e->tok;
}

void engine_get_model_info(const struct engine *e, struct engine_model_info *info)
{
    if (e->router) {
        engine_get_model_info(router_local(e->router), info);
        info->dp_size = router_replicas(e->router);
        return;
    }
    const struct model_config *c = &e->m->cfg;
    *info = (struct engine_model_info){
        .architecture = c->architecture, .n_layers = c->n_layers, .d_model = c->d_model,
        .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
        .ffn_hidden = c->ffn_hidden, .vocab_size = c->vocab_size, .max_positions = c->max_positions,
        .dtype = dtype_name(e->m->dtype), .device = e->b->ops->name, .tp_size = e->m->tp_size,
        .pp_size = e->m->pp_size, .dp_size = 1, .block_tokens = e->cache.block_tokens, .kv_blocks = e->cache.n_blocks,
        .bos_id = c->bos_id >= 0 ? c->bos_id : tokenizer_bos_id(e->tok),
        .eos_id = c->eos_id >= 0 ? c->eos_id : tokenizer_eos_id(e->tok),
    };
}

static int eos_id(const struct engine *e)
{
    return e->m->cfg.eos_id >= 0 ? e->m->cfg.eos_id : tokenizer_eos_id(e->tok);
}

/* ---- validation and submission ------------------------------------------------------------ */

enum status engine_validate(const struct engine *e, const int32_t *prompt, int n_prompt,
                            const struct request_params *p)
{
    if (e->router) return engine_validate(router_local(e->router), prompt, n_prompt, p);
    const struct model_config *c = &e->m->cfg;
    const int V = c->vocab_size;
    if (n_prompt < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "prompt: must hold at least one token");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return status_errorf(STATUS_INVALID_ARGUMENT, "prompt_token_ids[%d] = %d is outside the vocabulary [0, %d)",
                                 i, prompt[i], V);
    if (p->max_tokens < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "max_tokens must be >= 0, got %d", p->max_tokens);
    if (p->min_tokens < 0 || p->min_tokens > p->max_tokens)
        return status_errorf(STATUS_INVALID_ARGUMENT, "min_tokens must be in [0, max_tokens = %d], got %d",
                             p->max_tokens, p->min_tokens);
    if ((long long)n_prompt + p->max_tokens > c->max_positions)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "prompt (%d tokens) + max_tokens (%d) exceeds the model's context of %d tokens",
                             n_prompt, p->max_tokens, c->max_positions);
    long long need = ((long long)n_prompt + p->max_tokens + e->cache.block_tokens - 1) / e->cache.block_tokens;
    if (need > e->cache.n_blocks)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "prompt (%d tokens) + max_tokens (%d) needs %lld KV blocks; the cache holds %d",
                             n_prompt, p->max_tokens, need, e->cache.n_blocks);
    enum status st = sampling_params_validate(&p->sampling);
    if (st != STATUS_OK) return st;
    if (p->n < 1 || p->n > MAX_SAMPLES || p->n > e->o.max_seqs)
        return status_errorf(STATUS_INVALID_ARGUMENT, "n must be in [1, %d], got %d",
                             MAX_SAMPLES < e->o.max_seqs ? MAX_SAMPLES : e->o.max_seqs, p->n);
    if (p->n > 1 && p->n * need > e->cache.n_blocks)
        return status_errorf(STATUS_INVALID_ARGUMENT, "n = %d samples of this request could never fit the KV cache together (%lld of %d blocks)",
                             p->n, p->n * need, e->cache.n_blocks);
    if (p->logprobs < -1 || p->logprobs > e->o.max_logprobs)
        return status_errorf(STATUS_INVALID_ARGUMENT, "logprobs must be in [0, %d] (or unset), got %d",
                             e->o.max_logprobs, p->logprobs);
    if (p->prompt_logprobs < -1 || p->prompt_logprobs > e->o.max_logprobs)
        return status_errorf(STATUS_INVALID_ARGUMENT, "prompt_logprobs must be in [0, %d] (or unset), got %d",
                             e->o.max_logprobs, p->prompt_logprobs);
    if (p->n_stop < 0 || p->n_stop > MAX_STOP_STRINGS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "stop: at most %d strings, got %d", MAX_STOP_STRINGS, p->n_stop);
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n == 0 || n > MAX_STOP_LEN)
            return status_errorf(STATUS_INVALID_ARGUMENT, "stop[%d] must be 1 to %d bytes, got %zu", i, MAX_STOP_LEN, n);
    }
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > 1024)
        return status_errorf(STATUS_INVALID_ARGUMENT, "stop_token_ids: at most 1024 ids");
    for (int i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || p->stop_token_ids[i] >= V)
            return status_errorf(STATUS_INVALID_ARGUMENT, "stop_token_ids[%d] = %d is outside the vocabulary [0, %d)",
                                 i, p->stop_token_ids[i], V);
    if (p->n_logit_bias < 0 || p->n_logit_bias > V)
        return status_errorf(STATUS_INVALID_ARGUMENT, "logit_bias: at most %d entries", V);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || p->logit_bias_ids[i] >= V)
            return status_errorf(STATUS_INVALID_ARGUMENT, "logit_bias token %d is outside the vocabulary [0, %d)",
                                 p->logit_bias_ids[i], V);
        if (!(fabsf(p->logit_bias_values[i]) <= 100.0f))
            return status_errorf(STATUS_INVALID_ARGUMENT, "logit_bias value for token %d must be in [-100, 100]",
                                 p->logit_bias_ids[i]);
    }
    return STATUS_OK;
}

enum status engine_submit(struct engine *e, const char *request_id, const int32_t *prompt,
                          int n_prompt, const struct request_params *p, engine_event_fn on_event,
                          void *ctx, uint64_t *handle)
{
    if (e->router) return router_submit(e->router, request_id, prompt, n_prompt, p, on_event, ctx, handle);
    enum status st = engine_validate(e, prompt, n_prompt, p);
    if (st != STATUS_OK) return st;
    if (request_id && strlen(request_id) >= sizeof ((struct request *)0)->id)
        return status_errorf(STATUS_INVALID_ARGUMENT, "request_id: at most %zu bytes",
                             sizeof ((struct request *)0)->id - 1);
    struct request *r = calloc(1, sizeof *r);
    if (!r) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    r->p = *p;
    r->on_event = on_event;
    r->ctx = ctx;
    r->n_prompt = n_prompt;
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->stop_ids = malloc(((size_t)p->n_stop_token_ids + 1) * sizeof *r->stop_ids);
    r->bias_ids = malloc(((size_t)p->n_logit_bias + 1) * sizeof *r->bias_ids);
    r->bias_values = malloc(((size_t)p->n_logit_bias + 1) * sizeof *r->bias_values);
    int ok = r->prompt && r->stop_ids && r->bias_ids && r->bias_values;
    for (int i = 0; ok && i < p->n_stop; i++) {
        r->stop[i] = strdup(p->stop[i]);
        r->stop_len[i] = strlen(p->stop[i]);
        ok = r->stop[i] != NULL;
    }
    if (ok && p->prompt_logprobs >= 0) {
        r->prompt_lp = calloc((size_t)n_prompt, sizeof *r->prompt_lp);
        r->prompt_top = calloc((size_t)n_prompt * (size_t)(p->prompt_logprobs + 1), sizeof *r->prompt_top);
        ok = r->prompt_lp && r->prompt_top;
    }
    if (!ok) {
        request_free(r);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    }
    memcpy(r->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    if (p->n_stop_token_ids) memcpy(r->stop_ids, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *r->stop_ids);
    if (p->n_logit_bias) {
        memcpy(r->bias_ids, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *r->bias_ids);
        memcpy(r->bias_values, p->logit_bias_values, (size_t)p->n_logit_bias * sizeof *r->bias_values);
    }
    r->p.stop_token_ids = NULL; /* the copies above are what the engine reads */
    r->p.stop = NULL;
    r->p.logit_bias_ids = NULL;
    r->p.logit_bias_values = NULL;
    r->live_samples = p->n;

    pthread_mutex_lock(&e->mu);
    if (e->failed) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return status_errorf(STATUS_UNAVAILABLE, "the engine failed: %s", e->failure);
    }
    if (e->draining || e->stop_thread) {
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    }
    if (e->n_intake + e->stats.waiting >= e->o.max_queue) {
        int q = e->n_intake + e->stats.waiting;
        pthread_mutex_unlock(&e->mu);
        request_free(r);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "the request queue is full (%d waiting, --max-queue %d)",
                             q, e->o.max_queue);
    }
    r->handle = e->next_handle++;
    if (request_id && *request_id) snprintf(r->id, sizeof r->id, "%s", request_id);
    else snprintf(r->id, sizeof r->id, "req-%llu", (unsigned long long)r->handle);
    /* A seed the client did not choose is derived from the handle, and reported back. */
    r->seed = p->has_seed ? p->sampling.seed : (r->handle * 0x9e3779b97f4a7c15ull) ^ (uint64_t)time(NULL);
    r->next_all = e->all;
    e->all = r;
    if (e->intake_tail) e->intake_tail->next_in = r;
    else e->intake = r;
    e->intake_tail = r;
    e->n_intake++;
    e->stats.requests_submitted++;
    e->stats.prompt_tokens += (uint64_t)n_prompt;
    *handle = r->handle;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return STATUS_OK;
}

static enum status cancel_where(struct engine *e, uint64_t handle, const char *id)
{
    if (e->router) return router_cancel(e->router, handle, id);
    enum status st = STATUS_NOT_FOUND;
    pthread_mutex_lock(&e->mu);
    for (struct request *r = e->all; r; r = r->next_all)
        if ((id && !strcmp(r->id, id)) || (!id && r->handle == handle)) {
            r->cancel_requested = 1;
            st = STATUS_OK;
        }
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (st != STATUS_OK) status_errorf(st, "no running request %s", id ? id : "with that handle");
    return st;
}

enum status engine_cancel(struct engine *e, uint64_t handle) { return cancel_where(e, handle, NULL); }
enum status engine_cancel_id(struct engine *e, const char *id) { return cancel_where(e, 0, id); }

/* ---- the waiting queue (a ring; preempted sequences go to the front) ---------------------- */

static enum status waiting_reserve(struct engine *e)
{
    if (e->n_waiting < e->cap_waiting) return STATUS_OK;
    int cap = e->cap_waiting ? 2 * e->cap_waiting : 64;
    struct seq **w = malloc((size_t)cap * sizeof *w);
    if (!w) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    for (int i = 0; i < e->n_waiting; i++) w[i] = e->waiting[i];
    free(e->waiting);
    e->waiting = w;
    e->cap_waiting = cap;
    return STATUS_OK;
}

/* The queue is kept as a plain array in order (front at 0): intake volumes are small next to
 * a model step, so O(n) moves cost nothing measurable. */
static void waiting_push(struct engine *e, struct seq *s, int front)
{
    CHECK(waiting_reserve(e) == STATUS_OK, "engine: out of memory growing the waiting queue");
    if (front) {
        memmove(e->waiting + 1, e->waiting, (size_t)e->n_waiting * sizeof *e->waiting);
        e->waiting[0] = s;
    } else {
        e->waiting[e->n_waiting] = s;
    }
    e->n_waiting++;
    s->state = SEQ_WAITING;
}

static void waiting_pop_front(struct engine *e)
{
    memmove(e->waiting, e->waiting + 1, (size_t)(e->n_waiting - 1) * sizeof *e->waiting);
    e->n_waiting--;
}

/* Frees a running sequence's blocks and sends it back to the front of the queue; its tokens
 * (prompt and generated so far) are recomputed when it is admitted again. */
static void preempt(struct engine *e, struct seq *s)
{
    kv_cache_release(&e->cache, s->n_blocks, s->blocks);
    s->n_blocks = 0;
    s->n_cached = 0;
    s->n_registered = 0;
    s->last_hash = 0;
    s->n_rows = 0;
    s->wants_sample = 0;
    waiting_push(e, s, 1);
    e->stats.preemptions++;
    LOG_DEBUG("engine", "req=%s preempted sample %d at %d tokens", s->req->id, s->sample, s->n_tokens);
}

/* Makes the sequence's block table cover n tokens, preempting the newest running sequences
 * when the pool is dry. Returns 0 when s itself had to be preempted (it is then waiting). */
static int ensure_blocks(struct engine *e, struct seq *s, int n)
{
    const int bt = e->cache.block_tokens, need = (n + bt - 1) / bt - s->n_blocks;
    if (need <= 0) return 1;
    if (grow((void **)&s->blocks, &s->cap_blocks, s->n_blocks + need, sizeof *s->blocks) != STATUS_OK) return 0;
    while (kv_cache_available(&e->cache) < need) {
        struct seq *victim = e->running[e->n_running - 1];
        e->n_running--;
        preempt(e, victim);
        if (victim == s) return 0;
    }
    CHECK(kv_cache_alloc(&e->cache, need, s->blocks + s->n_blocks) == STATUS_OK, "kv alloc after check");
    s->n_blocks += need;
    return 1;
}

/* Reuses cached blocks for the leading full blocks of the tokens to compute, leaving at least
 * one row to run (its logits are needed). */
static void reuse_prefix(struct engine *e, struct seq *s)
{
    const int bt = e->cache.block_tokens;
    if (!e->o.prefix_caching || s->req->p.prompt_logprobs >= 0 || s->n_cached != 0) return;
    if (grow((void **)&s->blocks, &s->cap_blocks, s->n_tokens / bt + 1, sizeof *s->blocks) != STATUS_OK) return;
    while ((s->n_registered + 1) * bt <= s->n_tokens - 1) {
        const int32_t *t = s->tokens + (size_t)s->n_registered * bt;
        uint64_t h = kv_cache_hash(s->last_hash, t, bt);
        int32_t b = kv_cache_lookup(&e->cache, h, t);
        if (b < 0) break;
        s->blocks[s->n_blocks++] = b;
        s->n_registered++;
        s->last_hash = h;
        s->n_cached += bt;
    }
}

/* Registers the sequence's newly completed full blocks in the prefix cache. */
static void register_blocks(struct engine *e, struct seq *s)
{
    const int bt = e->cache.block_tokens;
    if (!e->o.prefix_caching) return;
    while ((s->n_registered + 1) * bt <= s->n_cached) {
        const int32_t *t = s->tokens + (size_t)s->n_registered * bt;
        uint64_t h = kv_cache_hash(s->last_hash, t, bt);
        kv_cache_register(&e->cache, s->blocks[s->n_registered], h, t);
        s->n_registered++;
        s->last_hash = h;
    }
}

/* ---- sampling a token and its consequences ------------------------------------------------ */

static void log_softmax_row(const float *x, float *out, int V)
{
    float mx = -INFINITY;
    for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)(x[i] - mx));
    float lse = (float)log(sum);
    for (int i = 0; i < V; i++) out[i] = (x[i] - mx) - lse;
}

/* The k largest entries of lp (descending, ties by lower id). */
static void top_k(const float *lp, int V, int k, struct top_logprob *out)
{
    int have = 0;
    for (int i = 0; i < V; i++) {
        if (have == k && !(lp[i] > out[k - 1].logprob)) continue;
        int at = have < k ? have++ : k - 1;
        while (at > 0 && lp[i] > out[at - 1].logprob) {
            out[at] = out[at - 1];
            at--;
        }
        out[at] = (struct top_logprob){.id = i, .logprob = lp[i]};
    }
}

static int is_stop_id(const struct request *r, int32_t t)
{
    for (int i = 0; i < r->p.n_stop_token_ids; i++)
        if (r->stop_ids[i] == t) return 1;
    return 0;
}

static enum status hold_text(struct seq *s, const char *t, size_t n)
{
    if (s->n_held + n > s->cap_held) {
        size_t cap = s->cap_held ? s->cap_held : 256;
        while (cap < s->n_held + n) cap *= 2;
        char *h = realloc(s->held, cap);
        if (!h) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
        s->held = h;
        s->cap_held = cap;
    }
    memcpy(s->held + s->n_held, t, n);
    s->n_held += n;
    return STATUS_OK;
}

/* Samples the next token of s from the logits row, then emits it and finishes the sample when a
 * stop condition holds. */
static void take_token(struct engine *e, struct seq *s, const float *row)
{
    struct request *r = s->req;
    const int V = e->m->cfg.vocab_size, eos = eos_id(e);
    if (r->p.max_tokens == 0) { /* scoring only */
        finish_seq(e, s, FINISH_REASON_LENGTH, STATUS_OK, NULL, 0);
        return;
    }
    float *lp = e->scratch, *lg = e->scratch + V;
    memcpy(lg, row, (size_t)V * sizeof *lg);
    for (int i = 0; i < r->p.n_logit_bias; i++) lg[r->bias_ids[i]] += r->bias_values[i];
    if (s->n_generated < r->p.min_tokens) { /* too early to stop: EOS and stop ids are banned */
        if (eos >= 0 && !r->p.ignore_eos) lg[eos] = -INFINITY;
        for (int i = 0; i < r->p.n_stop_token_ids; i++) lg[r->stop_ids[i]] = -INFINITY;
    }
    struct sampling_params sp = r->p.sampling;
    int32_t tok = sampler_sample(&e->smp, &sp, &s->rng, lg, r->prompt, r->n_prompt,
                                 s->tokens + r->n_prompt, s->n_generated);
    s->tokens[s->n_tokens++] = tok;
    s->n_generated++;

    /* Log-probabilities are those of the model's distribution (the raw logits). */
    float tok_lp = 0.0f;
    struct top_logprob top[64];
    int n_top = r->p.logprobs > 0 ? r->p.logprobs : 0;
    if (r->p.logprobs >= 0) {
        log_softmax_row(row, lp, V);
        tok_lp = lp[tok];
        if (n_top) top_k(lp, V, n_top, top);
    }

    enum finish_reason why = FINISH_REASON_NONE;
    size_t cut = (size_t)-1;
    if (is_stop_id(r, tok)) why = FINISH_REASON_STOP;
    else if (tok == eos && !r->p.ignore_eos) why = FINISH_REASON_EOS;
    if (why == FINISH_REASON_NONE) { /* the token's text; a stop token's text is never shown */
        const char *t;
        size_t n;
        if (detokenizer_push(&s->detok, tok, &t, &n) == STATUS_OK && n) {
            size_t before = s->n_held;
            if (hold_text(s, t, n) != STATUS_OK) {
                finish_seq(e, s, FINISH_REASON_ERROR, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
                return;
            }
            for (int i = 0; i < r->p.n_stop; i++) {
                /* A new occurrence ends inside the new text, so it starts after before - len. */
                size_t from = before >= r->stop_len[i] ? before - r->stop_len[i] + 1 : 0;
                for (size_t at = from; at + r->stop_len[i] <= s->n_held; at++)
                    if (!memcmp(s->held + at, r->stop[i], r->stop_len[i])) {
                        if (at < cut) cut = at;
                        break;
                    }
            }
            if (cut != (size_t)-1) why = FINISH_REASON_STOP;
        }
    }
    if (why == FINISH_REASON_NONE &&
        (s->n_generated >= r->p.max_tokens || s->n_tokens >= e->m->cfg.max_positions))
        why = FINISH_REASON_LENGTH;

    size_t release = why == FINISH_REASON_NONE ? releasable(s) : 0;
    struct engine_event ev = {.kind = ENGINE_EVENT_TOKENS, .tokens = &tok, .n_tokens = 1,
                              .text = s->held, .text_len = release,
                              .logprobs = r->p.logprobs >= 0 ? &tok_lp : NULL,
                              .top = n_top ? top : NULL, .n_top = n_top};
    emit(e, s, &ev);
    drop_held(s, release);
    if (why == FINISH_REASON_NONE) return;
    if (cut != (size_t)-1) {
        s->n_held = cut;
    } else {
        const char *t;
        size_t n;
        if (detokenizer_flush(&s->detok, &t, &n) == STATUS_OK && n) hold_text(s, t, n);
    }
    finish_seq(e, s, why, STATUS_OK, NULL, s->n_held);
}

/* Records prompt log-probabilities from the logits of prompt rows [p0, p0 + n) (row p predicts
 * token p + 1), and sends them once the whole prompt is scored. */
static void take_prompt_logprobs(struct engine *e, struct seq *s, int p0, int n, const float *rows)
{
    struct request *r = s->req;
    const int V = e->m->cfg.vocab_size, k = r->p.prompt_logprobs;
    for (int j = 0; j < n; j++) {
        int p = p0 + j;
        if (p + 1 >= r->n_prompt || p + 1 < r->prompt_lp_done) continue;
        log_softmax_row(rows + (size_t)j * V, e->scratch, V);
        r->prompt_lp[p + 1] = e->scratch[r->prompt[p + 1]];
        if (k > 0) top_k(e->scratch, V, k, r->prompt_top + (size_t)(p + 1) * k);
        r->prompt_lp_done = p + 2;
    }
    if (!r->prompt_lp_sent && (r->prompt_lp_done >= r->n_prompt || r->n_prompt == 1)) {
        r->prompt_lp_sent = 1;
        struct engine_event ev = {.kind = ENGINE_EVENT_PROMPT_LOGPROBS, .tokens = r->prompt,
                                  .n_tokens = r->n_prompt, .logprobs = r->prompt_lp,
                                  .top = k > 0 ? r->prompt_top : NULL, .n_top = k};
        emit(e, s, &ev);
    }
}

/* Creates samples 1..n-1 of s's request from s, whose prompt was just computed: they share its
 * full blocks and get a copy of its partial last block (copy-on-write, done eagerly since each
 * sample writes its next token there). A sample that finds no block waits and recomputes. */
static void fork_samples(struct engine *e, struct seq *s, struct seq **children)
{
    struct request *r = s->req;
    const int bt = e->cache.block_tokens;
    r->forked = 1;
    for (int k = 1; k < r->p.n; k++) {
        struct seq *c = seq_new(e, r, k);
        children[k - 1] = c;
        if (!c) continue;
        int full = s->n_cached / bt, partial = s->n_cached % bt != 0;
        if (grow((void **)&c->blocks, &c->cap_blocks, s->n_blocks + 1, sizeof *c->blocks) == STATUS_OK &&
            (!partial || kv_cache_available(&e->cache) >= 1)) {
            for (int i = 0; i < full; i++) {
                kv_cache_retain(&e->cache, s->blocks[i]);
                c->blocks[c->n_blocks++] = s->blocks[i];
            }
            if (partial) {
                int32_t b;
                CHECK(kv_cache_alloc(&e->cache, 1, &b) == STATUS_OK, "kv alloc after check");
                kv_cache_copy_block(&e->cache, b, s->blocks[full]);
                if (e->par.world) { /* workers repeat the copy before the next step */
                    CHECK(grow((void **)&e->copies, &e->cap_copies, 2 * (e->n_copies + 1), sizeof *e->copies) == STATUS_OK,
                          "engine: out of memory recording a block copy");
                    e->copies[2 * e->n_copies] = b;
                    e->copies[2 * e->n_copies + 1] = s->blocks[full];
                    e->n_copies++;
                }
                c->blocks[c->n_blocks++] = b;
            }
            c->n_cached = s->n_cached;
            c->n_registered = s->n_registered;
            c->last_hash = s->last_hash;
        }
        c->cached_prompt_tokens = s->cached_prompt_tokens;
    }
}

/* ---- multi-rank: the step plan and the workers -------------------------------------------- */

int engine_is_conductor(const struct engine *e)
{
    if (e->router) return router_is_front(e->router);
    return !e->par.world || e->par.world->rank == 0;
}

static enum status run_step(struct engine *e, int n_rows, int n_seqs, int n_logits, int n_micro);

/* The conductor packs and broadcasts the step's arrays (header first); a worker receives them
 * into the same fields. */
static enum status plan_exchange(struct engine *e, struct step_plan_header *h)
{
    struct parallel_world *w = e->par.world;
    enum status st = parallel_bcast_bytes(w, h, sizeof *h, 0);
    if (st != STATUS_OK || h->stop) return st;
    const int T = h->n_tokens, S = h->n_seqs, W = h->table_width, L = h->n_logits, C = h->n_copies;
    CHECK(T >= 0 && T <= e->o.max_batch_tokens && S >= 0 && S <= e->o.max_seqs && W == e->table_width &&
              L >= 0 && L <= e->max_logits && C >= 0,
          "step plan out of range (tokens %d seqs %d width %d logits %d copies %d)", T, S, W, L, C);
    const int n = 3 * T + (S + 1) + S + S * W + L + 2 * C;
    if (grow((void **)&e->plan, &e->cap_plan, n, sizeof *e->plan) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
    struct { int32_t *p; int n; } parts[] = {
        {e->f_tokens, T}, {e->f_pos, T}, {e->f_slots, T}, {e->f_qstart, S + 1}, {e->f_seqlen, S},
        {e->f_table, S * W}, {e->f_rows, L}, {NULL, 2 * C},
    };
    const int conductor = engine_is_conductor(e);
    if (!conductor && C > 0 && grow((void **)&e->copies, &e->cap_copies, 2 * C, sizeof *e->copies) != STATUS_OK)
        return STATUS_RESOURCE_EXHAUSTED;
    parts[7].p = e->copies;
    int off = 0;
    if (conductor)
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; off += parts[i].n, i++)
            if (parts[i].n) memcpy(e->plan + off, parts[i].p, (size_t)parts[i].n * sizeof *e->plan);
    if ((st = parallel_bcast_bytes(w, e->plan, (size_t)n * sizeof *e->plan, 0)) != STATUS_OK) return st;
    if (conductor) return STATUS_OK;
    off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; off += parts[i].n, i++)
        if (parts[i].n) memcpy(parts[i].p, e->plan + off, (size_t)parts[i].n * sizeof *e->plan);
    for (int i = 0; i < C; i++) kv_cache_copy_block(&e->cache, e->copies[2 * i], e->copies[2 * i + 1]);
    return STATUS_OK;
}

/* With pp > 1 the logits are on the last stage: its first rank sends them to the conductor,
 * which samples (a departure from sampling on the last stage: the sampler's per-request state
 * then lives in one place; the cost is n_logits x vocab floats per step over MPI). */
static enum status logits_to_conductor(struct engine *e, int n_logits)
{
    const struct parallel_layout *l = &e->par.layout;
    if (!e->par.world || l->pp_size == 1 || n_logits == 0) return STATUS_OK;
    struct tensor t = tensor_make(e->logits, DTYPE_F32, DEVICE_CPU, 2, (int64_t)n_logits,
                                  (int64_t)e->m->cfg.vocab_size);
    int last = parallel_layout_rank(l, 0, l->pp_size - 1, 0);
    if (engine_is_conductor(e)) return comm_recv(e->par.world->control, &t, last);
    if (l->rank == last) return comm_send(e->par.world->control, &t, 0);
    return STATUS_OK;
}

enum status engine_run_worker(struct engine *e)
{
    CHECK(!engine_is_conductor(e), "engine_run_worker on the conductor");
    if (e->router) return router_run(e->router);
    for (;;) {
        struct step_plan_header h;
        enum status st = plan_exchange(e, &h);
        if (st != STATUS_OK) return st;
        if (h.stop) return STATUS_OK;
        if (h.n_tokens == 0) continue;
        CHECK(h.n_micro >= 1 && h.n_micro <= h.n_seqs, "step plan: %d micro-batches for %d sequences", h.n_micro, h.n_seqs);
        if ((st = run_step(e, h.n_tokens, h.n_seqs, h.n_logits, h.n_micro)) != STATUS_OK) return st;
        e->worker_steps++;
    }
}

/* One line per rank at shutdown: time spent in each communicator per forward step. */
static void log_comm_time(struct engine *e)
{
    uint64_t steps = engine_is_conductor(e) ? e->stats.steps : e->worker_steps;
    if (!e->groups.tp || steps == 0) return;
    const struct comm *c[] = {e->groups.tp, e->groups.pp, e->par.world ? e->par.world->control : NULL};
    const char *names[] = {"tp", "pp", "control"};
    char line[256];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (c[i] && c[i]->size > 1)
            n += snprintf(line + n, sizeof line - (size_t)n, " %s %.3f ms/step (%.1f calls)", names[i],
                          1e3 * c[i]->seconds / (double)steps, (double)c[i]->n_calls / (double)steps);
    if (n) LOG_INFO("engine", "rank %d: %llu steps; communication:%s", e->par.layout.rank, (unsigned long long)steps, line);
}

/* Micro-batches per step (pp > 1, --pp-microbatches): the step's sequences are split so that
 * stages overlap (stage k runs micro-batch j while stage k+1 runs j-1). Off by default: decode
 * is bound by weight reads, and each micro-batch reads the stage's weights again (measured on 2
 * CPU cores: pp 2 at 16 streams, 94 tok/s as one micro-batch, 84 tok/s as two). */
static int micro_batches(const struct engine *e, int n_seqs)
{
    if (e->par.layout.pp_size <= 1 || e->o.pp_microbatches <= 1) return 1;
    return e->o.pp_microbatches < n_seqs ? e->o.pp_microbatches : n_seqs;
}

/* Runs the step held in the f_* arrays as n_micro micro-batches of contiguous sequences, in
 * the same order on every rank. Activations flow one way (stage to stage); the last stage
 * sends all logits to the conductor only after its last micro-batch, so no rank ever waits on
 * a rank that waits on it. Logit rows are ascending, so each micro-batch's are contiguous. */
static enum status run_step(struct engine *e, int n_rows, int n_seqs, int n_logits, int n_micro)
{
    const int V = e->m->cfg.vocab_size, per = (n_seqs + n_micro - 1) / n_micro;
    int l0 = 0;
    enum status st = STATUS_OK;
    for (int s0 = 0; s0 < n_seqs && st == STATUS_OK; s0 += per) {
        const int s1 = s0 + per < n_seqs ? s0 + per : n_seqs;
        const int r0 = e->f_qstart[s0], r1 = s1 < n_seqs ? e->f_qstart[s1] : n_rows;
        int l1 = l0;
        while (l1 < n_logits && e->f_rows[l1] < r1) l1++;
        for (int i = s0; i <= s1; i++) e->mb_qstart[i - s0] = (i < n_seqs ? e->f_qstart[i] : n_rows) - r0;
        for (int i = l0; i < l1; i++) e->mb_rows[i - l0] = e->f_rows[i] - r0;
        struct forward_batch fb = {.n_tokens = r1 - r0, .tokens = e->f_tokens + r0, .positions = e->f_pos + r0,
                                   .slots = e->f_slots + r0, .n_seqs = s1 - s0, .q_start = e->mb_qstart,
                                   .seq_len = e->f_seqlen + s0,
                                   .block_table = e->f_table + (size_t)s0 * (size_t)e->table_width,
                                   .max_blocks = e->table_width, .n_logits = l1 - l0, .logit_rows = e->mb_rows};
        st = model_forward(e->m, &e->cache, &fb, e->logits + (size_t)l0 * (size_t)V);
        l0 = l1;
    }
    if (st == STATUS_OK) st = logits_to_conductor(e, n_logits);
    return st;
}

/* Tells the workers to leave engine_run_worker (conductor only, once). */
static void stop_workers(struct engine *e)
{
    if (!e->par.world || !engine_is_conductor(e) || !e->m || e->failed) return;
    struct step_plan_header h = {.stop = 1};
    if (plan_exchange(e, &h) != STATUS_OK) LOG_WARN("engine", "could not tell the workers to stop: %s", status_message());
    e->par.world = NULL; /* nothing more goes to them */
}

/* The world broke (a rank gone or hung): every request fails with UNAVAILABLE, new ones are
 * refused, and the owner is told once. */
static void fail_engine(struct engine *e, enum status st)
{
    if (e->failed) return;
    pthread_mutex_lock(&e->mu);
    e->failed = 1;
    snprintf(e->failure, sizeof e->failure, "%s", status_message());
    pthread_mutex_unlock(&e->mu);
    LOG_ERROR("engine", "cannot go on: %s", e->failure);
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? e->waiting : e->running;
        int n = pass ? e->n_waiting : e->n_running;
        for (int i = 0; i < n; i++)
            if (list[i]->state != SEQ_DONE) finish_seq(e, list[i], FINISH_REASON_ERROR, STATUS_UNAVAILABLE, e->failure, 0);
    }
    if (e->o.on_fatal) e->o.on_fatal(e->o.fatal_ctx, st, e->failure);
}

/* ---- the step ------------------------------------------------------------------------------ */

/* Adds s's next `take` rows to the step being planned. */
static void plan_rows(struct engine *e, struct seq *s, int take, int *n_rows, int *n_seqs, int *n_logits)
{
    const int bt = e->cache.block_tokens;
    s->row_start = *n_rows;
    s->n_rows = take;
    for (int j = 0; j < take; j++) {
        int p = s->n_cached + j, row = *n_rows + j;
        e->f_tokens[row] = s->tokens[p];
        e->f_pos[row] = p;
        e->f_slots[row] = s->blocks[p / bt] * bt + p % bt;
    }
    s->wants_sample = s->n_cached + take == s->n_tokens;
    const struct request *r = s->req;
    int lp_rows = r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && s->sample == 0;
    for (int j = 0; j < take; j++) {
        int p = s->n_cached + j;
        if ((lp_rows && p + 1 < r->n_prompt) || (j == take - 1 && s->wants_sample)) e->f_rows[(*n_logits)++] = *n_rows + j;
    }
    int k = *n_seqs;
    e->f_qstart[k] = *n_rows;
    e->f_seqlen[k] = s->n_cached + take;
    memcpy(e->f_table + (size_t)k * e->table_width, s->blocks, (size_t)s->n_blocks * sizeof *s->blocks);
    (*n_seqs)++;
    *n_rows += take;
}

/* Rows s may run this step: its pending tokens, bounded by the token budget and, for
 * prompt-logprob rows, by the logits buffer. */
static int rows_for(const struct engine *e, const struct seq *s, int budget, int logits_left)
{
    int take = s->n_tokens - s->n_cached;
    if (take > budget) take = budget;
    const struct request *r = s->req;
    if (r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && s->sample == 0 && take > logits_left - 1)
        take = logits_left - 1;
    (void)e;
    return take > 0 ? take : 0;
}

static void stats_update(struct engine *e, int prefill_rows, int hit_tokens)
{
    pthread_mutex_lock(&e->mu);
    e->stats.waiting = e->n_waiting;
    e->stats.running = e->n_running;
    e->stats.kv_blocks_free = e->cache.n_free;
    e->stats.kv_blocks_cached = e->cache.n_cached;
    e->stats.prefill_tokens_computed += (uint64_t)prefill_rows;
    e->stats.prefix_cache_hit_tokens += (uint64_t)hit_tokens;
    pthread_mutex_unlock(&e->mu);
}

/* Removes finished sequences from both lists and frees them (a step boundary: nothing
 * refers to them any more). */
static void drop_finished(struct engine *e)
{
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? e->waiting : e->running;
        int *n = pass ? &e->n_waiting : &e->n_running, w = 0;
        for (int i = 0; i < *n; i++) {
            if (list[i]->state == SEQ_DONE) seq_free(list[i]);
            else list[w++] = list[i];
        }
        *n = w;
    }
}

int engine_step(struct engine *e)
{
    CHECK(!e->router, "engine_step with data-parallel replicas: use engine_start");
    /* 1. Intake and cancellation flags, under the lock. */
    pthread_mutex_lock(&e->mu);
    struct request *in = e->intake;
    e->intake = e->intake_tail = NULL;
    e->n_intake = 0;
    pthread_mutex_unlock(&e->mu);
    for (struct request *r = in, *next; r; r = next) {
        next = r->next_in;
        if (e->failed) { /* submitted just before the failure */
            r->forked = 1;
            for (int k = 0; k < r->p.n; k++) finish_absent(e, r, k, FINISH_REASON_ERROR, STATUS_UNAVAILABLE, e->failure);
            continue;
        }
        struct seq *s = seq_new(e, r, 0);
        if (!s) {
            r->forked = 1;
            for (int k = 0; k < r->p.n; k++)
                finish_absent(e, r, k, FINISH_REASON_ERROR, STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
            continue;
        }
        waiting_push(e, s, 0);
    }
    const int busy = e->n_waiting + e->n_running;
    if (busy == 0) {
        stats_update(e, 0, 0);
        return 0;
    }
    const double now = base_now_s();
    pthread_mutex_lock(&e->mu);
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? e->waiting : e->running;
        int n = pass ? e->n_waiting : e->n_running;
        for (int i = 0; i < n; i++) {
            struct request *r = list[i]->req;
            list[i]->doomed = r->cancel_requested ? FINISH_REASON_CANCELLED
                              : r->p.deadline > 0 && now > r->p.deadline ? FINISH_REASON_DEADLINE
                                                                         : FINISH_REASON_NONE;
        }
    }
    pthread_mutex_unlock(&e->mu);
    for (int pass = 0; pass < 2; pass++) { /* finish outside the lock: callbacks may cancel */
        struct seq **list = pass ? e->waiting : e->running;
        int n = pass ? e->n_waiting : e->n_running;
        for (int i = 0; i < n; i++)
            if (list[i]->doomed != FINISH_REASON_NONE) finish_seq(e, list[i], list[i]->doomed, STATUS_OK, NULL, 0);
    }

    drop_finished(e);

    /* 2. Plan: running sequences (oldest first, decode rows are 1 each), then admissions. */
    int budget = e->o.max_batch_tokens, n_rows = 0, n_seqs = 0, n_logits = 0, prefill_rows = 0, hits = 0;
    for (int i = 0; i < e->n_running; i++) e->running[i]->n_rows = 0, e->running[i]->wants_sample = 0;
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        struct seq *s = e->running[i];
        int take = rows_for(e, s, budget, e->max_logits - n_logits);
        if (take == 0) continue;
        if (!ensure_blocks(e, s, s->n_cached + take)) break; /* s itself was preempted: it was last */
        if (s->n_cached < s->req->n_prompt) prefill_rows += take;
        plan_rows(e, s, take, &n_rows, &n_seqs, &n_logits);
        budget -= take;
    }
    while (e->n_waiting > 0 && e->n_running < e->o.max_seqs && budget > 0) {
        struct seq *s = e->waiting[0];
        int reused_before = s->n_cached;
        reuse_prefix(e, s);
        int take = rows_for(e, s, budget, e->max_logits - n_logits);
        const int bt = e->cache.block_tokens;
        int need = (s->n_cached + take + bt - 1) / bt - s->n_blocks;
        if (take == 0 || kv_cache_available(&e->cache) < need ||
            grow((void **)&s->blocks, &s->cap_blocks, s->n_blocks + need, sizeof *s->blocks) != STATUS_OK) {
            /* Not now: give the reused prefix back so it does not pin blocks while waiting. */
            kv_cache_release(&e->cache, s->n_blocks, s->blocks);
            s->n_blocks = s->n_cached = s->n_registered = 0;
            s->last_hash = 0;
            break;
        }
        CHECK(kv_cache_alloc(&e->cache, need, s->blocks + s->n_blocks) == STATUS_OK, "kv alloc after check");
        s->n_blocks += need;
        waiting_pop_front(e);
        if (!s->prefix_checked) {
            s->prefix_checked = 1;
            s->cached_prompt_tokens = s->n_cached < s->req->n_prompt ? s->n_cached : s->req->n_prompt;
            hits += s->cached_prompt_tokens - reused_before;
        }
        s->state = SEQ_RUNNING;
        s->order = e->next_order++;
        e->running[e->n_running++] = s;
        if (s->n_cached < s->req->n_prompt) prefill_rows += take;
        plan_rows(e, s, take, &n_rows, &n_seqs, &n_logits);
        budget -= take;
    }
    if (n_rows == 0) {
        stats_update(e, 0, hits);
        return busy;
    }

    /* 3. The forward pass over every planned row (in micro-batches when pipelined). */
    e->f_qstart[n_seqs] = n_rows;
    enum status st = STATUS_OK;
    const int n_micro = micro_batches(e, n_seqs);
    if (e->par.world) {
        struct step_plan_header ph = {.n_tokens = n_rows, .n_seqs = n_seqs, .table_width = e->table_width,
                                      .n_logits = n_logits, .n_copies = e->n_copies, .n_micro = n_micro};
        st = plan_exchange(e, &ph);
        e->n_copies = 0;
    }
    if (st == STATUS_OK) st = run_step(e, n_rows, n_seqs, n_logits, n_micro);
    pthread_mutex_lock(&e->mu);
    e->stats.steps++;
    pthread_mutex_unlock(&e->mu);

    /* 4. Results, in planning order: the logits rows follow the same order. */
    const int V = e->m->cfg.vocab_size;
    int lrow = 0;
    int n_running = e->n_running; /* forks append to running; they sample here, not in this loop */
    for (int i = 0; i < n_running; i++) {
        struct seq *s = e->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING) continue;
        struct request *r = s->req;
        if (st != STATUS_OK) {
            finish_seq(e, s, FINISH_REASON_ERROR, st, status_message(), 0);
            continue;
        }
        int p0 = s->n_cached;
        s->n_cached += s->n_rows;
        register_blocks(e, s);
        int lp_rows = 0;
        if (r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && s->sample == 0) {
            for (int j = 0; j < s->n_rows; j++) lp_rows += p0 + j + 1 < r->n_prompt;
            if (lp_rows) take_prompt_logprobs(e, s, p0, lp_rows, e->logits + (size_t)lrow * V);
            else if (s->n_cached >= r->n_prompt) take_prompt_logprobs(e, s, p0, 0, NULL);
        }
        lrow += lp_rows;
        if (!s->wants_sample) continue;
        const float *row = e->logits + (size_t)lrow * V;
        lrow++;
        struct seq *children[MAX_SAMPLES];
        int n_children = 0;
        if (s->sample == 0 && !r->forked && r->p.n > 1 && r->p.max_tokens > 0) {
            n_children = r->p.n - 1;
            fork_samples(e, s, children);
        }
        r->forked = 1;
        for (int k = 0; k < n_children; k++) {
            struct seq *c = children[k];
            if (!c) {
                finish_absent(e, r, k + 1, FINISH_REASON_ERROR, STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
                continue;
            }
            if (c->n_cached > 0 && e->n_running < e->o.max_seqs) {
                c->state = SEQ_RUNNING;
                c->order = e->next_order++;
                e->running[e->n_running++] = c;
                take_token(e, c, row);
            } else { /* no block or no room: it recomputes when admitted */
                kv_cache_release(&e->cache, c->n_blocks, c->blocks);
                c->n_blocks = c->n_cached = c->n_registered = 0;
                c->last_hash = 0;
                waiting_push(e, c, 0);
            }
        }
        take_token(e, s, row);
    }

    if (st != STATUS_OK && e->par.world && e->par.world->broken) fail_engine(e, st);

    drop_finished(e);
    stats_update(e, prefill_rows, hits);
    return busy;
}

/* ---- the engine thread ---------------------------------------------------------------------- */

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        while (!e->stop_thread && !e->intake && e->n_running + e->n_waiting == 0)
            pthread_cond_wait(&e->cv, &e->mu);
        int stop = e->stop_thread;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        engine_step(e);
    }
    return NULL;
}

enum status engine_start(struct engine *e)
{
    if (e->router) return router_start(e->router);
    if (e->thread_running) return STATUS_OK;
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: cannot start the engine thread");
    e->thread_running = 1;
    return STATUS_OK;
}

static int engine_idle(struct engine *e)
{
    pthread_mutex_lock(&e->mu);
    int idle = !e->intake && e->all == NULL;
    pthread_mutex_unlock(&e->mu);
    return idle;
}

void engine_drain(struct engine *e, double timeout_s)
{
    if (e->router) {
        router_drain(e->router, timeout_s);
        return;
    }
    pthread_mutex_lock(&e->mu);
    e->draining = 1;
    pthread_mutex_unlock(&e->mu);
    const double end = base_now_s() + timeout_s;
    int cancelled = 0;
    for (;;) {
        if (engine_idle(e)) break;
        if (!cancelled && base_now_s() >= end) {
            pthread_mutex_lock(&e->mu);
            for (struct request *r = e->all; r; r = r->next_all) r->cancel_requested = 1;
            pthread_cond_signal(&e->cv);
            pthread_mutex_unlock(&e->mu);
            cancelled = 1;
        }
        if (!e->thread_running) engine_step(e);
        else {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    if (e->thread_running) {
        pthread_mutex_lock(&e->mu);
        e->stop_thread = 1;
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
        pthread_join(e->thread, NULL);
        e->thread_running = 0;
    }
}

void engine_get_stats(struct engine *e, struct engine_stats *s)
{
    if (e->router) {
        router_get_stats(e->router, s);
        return;
    }
    pthread_mutex_lock(&e->mu);
    *s = e->stats;
    s->waiting += e->n_intake;
    pthread_mutex_unlock(&e->mu);
}

int engine_replicas(const struct engine *e) { return e->router ? router_replicas(e->router) : 1; }

void engine_get_replica_stats(struct engine *e, int replica, struct engine_replica_stats *s)
{
    if (e->router) {
        router_get_replica_stats(e->router, replica, s);
        return;
    }
    CHECK(replica == 0, "replica %d of 1", replica);
    memset(s, 0, sizeof *s);
    engine_get_stats(e, &s->engine);
    s->outstanding = s->engine.waiting + s->engine.running;
    s->routed = s->engine.requests_submitted;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    if (e->router) {
        router_free(e->router);
        pthread_mutex_destroy(&e->mu);
        pthread_cond_destroy(&e->cv);
        free(e);
        return;
    }
    if (e->m && e->running && engine_is_conductor(e)) engine_drain(e, 0.0); /* cancels and reports what is left */
    log_comm_time(e);
    stop_workers(e);
    parallel_groups_free(&e->groups);
    free(e->copies);
    free(e->plan);
    free(e->mb_qstart);
    free(e->mb_rows);
    for (int i = 0; i < e->n_running; i++) seq_free(e->running[i]);
    for (int i = 0; i < e->n_waiting; i++) seq_free(e->waiting[i]);
    free(e->running);
    free(e->waiting);
    free(e->logits);
    free(e->scratch);
    free(e->top_ids);
    free(e->f_tokens);
    free(e->f_pos);
    free(e->f_slots);
    free(e->f_rows);
    free(e->f_qstart);
    free(e->f_seqlen);
    free(e->f_table);
    sampler_free(&e->smp);
    if (e->cache.b) kv_cache_free(&e->cache);
    model_free(e->m);
    tokenizer_free(e->tok);
    backend_close(e->b);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
