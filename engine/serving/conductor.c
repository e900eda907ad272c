/* engine/serving/conductor.c - one replica (see conductor.h): intake, the step and the engine
 * thread; its creation and release are conductor_setup.c, the multi-rank side of a step (plan
 * broadcast, worker replay) conductor_ranks.c, the served LoRA adapters adapters.c.
 *
 * Each step (conductor_step):
 *   1. take_intake: newly submitted requests join the waiting queue (FCFS); cancellations and
 *      deadlines finish their samples and return their blocks;
 *   2. scheduler_plan: the rows of every running sequence and of the admitted waiting ones,
 *      under max_batch_tokens, preempting when the pool is dry (scheduler.c);
 *   3. run_planned_step: the plan goes to every rank of the replica, then one model_forward
 *      over all rows (in micro-batches when pipelined); logits for the rows that end a
 *      sequence's pending tokens (and every prompt row when prompt log-probabilities are asked);
 *   4. take_results: each finished row yields a token per sample (n > 1 samples fork from the
 *      request's first sample when its prompt is done), then text, stop checks and events.
 * Not here: the arithmetic (model.c), block bookkeeping (scheduler.c, kv_cache.c), requests and
 * stops (request.c), sampling maths (sampler.c). Tests: tests/test_engine.c. */
#include "conductor_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate.h"
#include "grammar.h"
#include "moe.h"
#include "tokenizer.h"


int conductor_eos_id(const struct conductor *c)
{
    return c->m->cfg.eos_id >= 0 ? c->m->cfg.eos_id : tokenizer_eos_id(c->tok);
}

int conductor_is_first_rank(const struct conductor *c) { return !c->par.world || c->par.world->rank == 0; }

/* ---- finishing samples ---------------------------------------------------------------------- */

/* Counts the end of one of r's samples before its FINISHED event is emitted, so that a client that
 * saw its request end finds it counted (GetServerStats: generated tokens, finished requests) and
 * may unload its adapter at once: at the last sample r leaves the conductor's list and stops
 * counting as a user of its adapter (the sequence is done: no later forward reads the adapter
 * for it). Returns whether this was r's last sample: the caller frees r after the event. */
static int end_sample(struct conductor *c, struct request *r, int n_generated)
{
    pthread_mutex_lock(&c->mu);
    c->stats.generated_tokens += (uint64_t)n_generated;
    const int last = --r->live_samples == 0;
    if (last) {
        struct request **pp = &c->all;
        while (*pp != r) pp = &(*pp)->next_all;
        *pp = r->next_all;
        if (r->adapter_held) adapter_set_release(&c->adapters, r->adapter);
        r->adapter_held = 0;
        c->stats.requests_finished++;
    }
    pthread_mutex_unlock(&c->mu);
    return last;
}

/* Test hook, right after each FINISHED event: the engine waits $SHARDLM_TEST_FINISH_DELAY_MS, so
 * that a count made after the event is missed by a client reading the stats at once. */
static void hold_after_finished(const struct conductor *c)
{
    if (c->test_finish_delay_ns > 0) nanosleep(&(struct timespec){0, c->test_finish_delay_ns}, NULL);
}

/* FINISHED for a sample that has no sequence (never forked, or could not be created); frees r
 * after its last. */
static void finish_absent(struct conductor *c, struct request *r, int sample, enum finish_reason why,
                          enum status st, const char *message)
{
    const int last = end_sample(c, r, 0);
    request_emit_absent(r, sample, why, st, message);
    hold_after_finished(c);
    if (last) request_free(r);
}

/* Finishes a sample: releases its blocks, emits FINISHED with the first text_len bytes still
 * held, and marks the sequence SEQ_DONE (the step frees it when it compacts its lists; s->req
 * may be gone by then). A request's unforked samples finish with its first one. */
void finish_seq(struct conductor *c, struct seq *s, enum finish_reason why, enum status st,
                const char *message, size_t text_len)
{
    struct request *r = s->req;
    spec_learn(c, s, why);
    scheduler_release(&c->sched, s);
    s->state = SEQ_DONE;
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .finish = why, .status = st,
                              .message = message, .text = s->held, .text_len = text_len};
    const int forks = s->sample == 0 && !r->forked, n = r->p.n;
    if (forks) r->forked = 1;
    const int last = end_sample(c, r, s->n_generated); /* (unforked samples count in live_samples) */
    request_emit(s, &ev);
    hold_after_finished(c);
    s->req = NULL;
    if (last) request_free(r);
    else if (forks)
        for (int k = 1; k < n; k++) finish_absent(c, r, k, why, st, message); /* the last frees r */
}

/* Finishes every sample of a request that has no sequence yet. */
static void finish_unstarted(struct conductor *c, struct request *r, enum status st, const char *message)
{
    r->forked = 1;
    for (int k = 0; k < r->p.n; k++) finish_absent(c, r, k, FINISH_REASON_ERROR, st, message);
}

const struct tokenizer *conductor_tokenizer(const struct conductor *c) { return c->tok; }

void conductor_get_model_info(const struct conductor *c, struct engine_model_info *info)
{
    const struct model_config *cfg = &c->m->cfg;
    *info = (struct engine_model_info){
        .architecture = cfg->architecture, .n_layers = cfg->n_layers, .d_model = cfg->d_model,
        .n_heads = cfg->n_heads, .n_kv_heads = cfg->n_kv_heads, .head_dim = cfg->head_dim,
        .ffn_hidden = cfg->ffn_hidden, .vocab_size = cfg->vocab_size, .max_positions = cfg->max_positions,
        .dtype = dtype_name(c->m->dtype), .device = c->b->ops->name, .tp_size = c->m->tp_size,
        .pp_size = c->m->pp_size, .dp_size = 1, .block_tokens = c->cache.block_tokens, .kv_blocks = c->cache.n_blocks,
        .bos_id = cfg->bos_id >= 0 ? cfg->bos_id : tokenizer_bos_id(c->tok),
        .eos_id = conductor_eos_id(c), .max_loras = c->adapters.cap, .max_lora_rank = c->adapters.max_rank,
        .max_queue = c->o.max_queue, .quantization = c->m->quantization, .encoder = c->m->cfg.encoder,
        .max_batch_tokens = c->o.max_batch_tokens,
        .chat_template = c->m->checkpoint->chat_template,
    };
}

/* ---- validation, submission, cancellation --------------------------------------------------- */

enum status conductor_validate(const struct conductor *c, const int32_t *prompt, int n_prompt,
                               const struct request_params *p)
{
    if (c->m->cfg.encoder)
        return status_errorf(STATUS_INVALID_ARGUMENT, "the model (%s) is an encoder: it serves embeddings "
                             "(/v1/embeddings), not generation", c->m->cfg.architecture);
    const struct request_bounds b = {.vocab_size = c->m->cfg.vocab_size, .max_positions = c->m->cfg.max_positions,
                                     .block_tokens = c->cache.block_tokens, .n_blocks = c->cache.n_blocks,
                                     .max_logprobs = c->o.max_logprobs, .max_seqs = c->o.max_seqs,
                                     .max_queue = c->o.max_queue, .scheduling = c->o.scheduling};
    return request_validate(prompt, n_prompt, p, &b);
}

/* Under mu: why the conductor takes no request of n samples now (STATUS_OK: it does). The
 * queue counts samples, as stats.waiting does: a request takes its n places at once. */
static enum status refusal(struct conductor *c, int n)
{
    if (c->failed) return status_errorf(STATUS_UNAVAILABLE, "the engine failed: %s", c->failure);
    if (c->draining || c->stop_thread) return status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    const int waiting = c->n_intake_samples + c->stats.waiting;
    if (waiting + n > c->o.max_queue)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "the request queue is full (%d samples waiting + %d asked > --max-queue %d samples)",
                             waiting, n, c->o.max_queue);
    return STATUS_OK;
}

/* p's constraint compiled for this model's vocabulary (*g a new reference; NULL for none), through
 * the cache; the vocabulary's token bytes are read at the first constrained request. A source
 * that does not compile is the request's error (INVALID_ARGUMENT naming the problem). */
enum status conductor_compile_constraint(struct conductor *c, const struct request_params *p, struct grammar **g)
{
    *g = NULL;
    if (p->constraint_kind == CONSTRAINT_NONE)
        return p->constraint_trigger_len ? status_errorf(STATUS_INVALID_ARGUMENT, "constraint: a lazy constraint's "
                                                         "trigger without a constraint") : STATUS_OK;
    enum status st = STATUS_OK;
    pthread_mutex_lock(&c->gmu);
    if (!c->gcache) {
        const int32_t eos = conductor_eos_id(c);
        st = grammar_vocab_new(c->tok, c->m->cfg.vocab_size, &eos, eos >= 0, &c->gvocab);
        if (st == STATUS_OK) st = grammar_cache_new(c->gvocab, 256, &c->gcache);
        if (st != STATUS_OK) {
            grammar_vocab_free(c->gvocab);
            c->gvocab = NULL;
        }
    }
    pthread_mutex_unlock(&c->gmu);
    if (st != STATUS_OK) return st;
    static const enum grammar_kind kinds[] = {
        [CONSTRAINT_JSON_SCHEMA] = GRAMMAR_JSON_SCHEMA, [CONSTRAINT_JSON_OBJECT] = GRAMMAR_JSON_OBJECT,
        [CONSTRAINT_REGEX] = GRAMMAR_REGEX,             [CONSTRAINT_GRAMMAR] = GRAMMAR_EBNF,
        [CONSTRAINT_CHOICE] = GRAMMAR_CHOICE,
    };
    const char *src = p->constraint ? p->constraint : "";
    size_t n = p->constraint ? p->constraint_len : 0, trig = p->constraint_trigger_len;
    if (trig && (trig > REQUEST_MAX_TRIGGER_BYTES || trig > n || memchr(src, 0, trig)))
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: a lazy constraint's trigger is 1 to %d bytes (no NUL) "
                             "before its source, got %zu of %zu", REQUEST_MAX_TRIGGER_BYTES, trig, n);
    int flags = 0;
    const int head = engine_trigger_read(src, trig, &flags);
    if (head < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: a lazy constraint's trigger header (%u, %u) names "
                             "no flags and reasoning markers", (unsigned char)src[0], trig > 1 ? (unsigned char)src[1] : 0);
    const int bare = (size_t)head == trig; /* flags and no marker */
    int markers = !bare, empty = 0;
    for (size_t i = (size_t)head; i < trig; i++)
        if (src[i] == TRIGGER_MARKER_SEP)
            markers++, empty |= i == (size_t)head || i + 1 == trig || src[i + 1] == TRIGGER_MARKER_SEP;
    if (markers > TRIGGER_MAX_MARKERS || empty)
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: a lazy constraint's trigger holds 1 to %d markers, "
                             "none empty, separated by byte %d; got %d%s", TRIGGER_MAX_MARKERS, TRIGGER_MARKER_SEP, markers,
                             empty ? " with an empty one" : "");
    if (head && ((bare && !(flags & (TRIGGER_IN_REASONING | TRIGGER_MAY_REASON))) || (bare && flags & (TRIGGER_ANCHORED | TRIGGER_READS_MARKER)) ||
                 (flags & TRIGGER_MAY_REASON && flags & TRIGGER_IN_REASONING)))
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: a lazy constraint's trigger flags %d: a marker is "
                             "needed unless the output starts inside reasoning or may open it (never anchored or read), "
                             "and inside excludes may-reason", flags);
    return grammar_cache_get(c->gcache, kinds[p->constraint_kind], src + trig, n - trig, g);
}

enum status conductor_submit(struct conductor *c, const char *request_id, const int32_t *prompt, int n_prompt,
                             const struct request_params *p, engine_event_fn on_event, void *ctx, uint64_t *handle)
{
    enum status st = conductor_validate(c, prompt, n_prompt, p);
    if (st == STATUS_OK) st = request_id_check(request_id);
    if (st != STATUS_OK) return st;
    struct grammar *g = NULL;
    if ((st = conductor_compile_constraint(c, p, &g)) != STATUS_OK) return st;
    struct request *r;
    if ((st = request_new(prompt, n_prompt, p, on_event, ctx, &r)) != STATUS_OK) {
        if (g) grammar_unref(g);
        return st;
    }
    r->grammar = g;
    conductor_lazy_setup(c, r, p);
    r->t_submit = base_now_s();
    pthread_mutex_lock(&c->mu);
    st = refusal(c, p->n);
    /* The request counts as a user of its adapter until just before its last FINISHED event
     * (end_sample): until then UnloadAdapter refuses. */
    if (st == STATUS_OK) st = adapter_set_acquire(&c->adapters, p->adapter, &r->adapter, &r->adapter_key);
    r->adapter_held = st == STATUS_OK && r->adapter >= 0;
    /* The prefix cache's chain starts from the adapter's key, mixed with the salt (the request's
     * cache_salt, and its owner under prefix_cache_per_owner): blocks are shared within one. */
    if (c->o.prefix_cache_per_owner && p->owner && *p->owner)
        r->cache_salt = base_fnv1a_str(base_fnv1a(r->cache_salt ? r->cache_salt : BASE_FNV1A_BASIS, "\1", 1), p->owner);
    r->cache_seed = r->cache_salt ? base_fnv1a(r->cache_salt, &r->adapter_key, sizeof r->adapter_key) : r->adapter_key;
    if (st != STATUS_OK) {
        pthread_mutex_unlock(&c->mu);
        request_free(r);
        return st;
    }
    r->handle = c->next_handle++;
    if (request_id && *request_id) snprintf(r->id, sizeof r->id, "%s", request_id);
    else snprintf(r->id, sizeof r->id, "req-%llu", (unsigned long long)r->handle);
    /* A seed the client did not choose is derived from the handle, and reported back. */
    r->seed = p->has_seed ? p->sampling.seed : (r->handle * 0x9e3779b97f4a7c15ull) ^ (uint64_t)time(NULL);
    r->next_all = c->all;
    c->all = r;
    if (c->intake_tail) c->intake_tail->next_in = r;
    else c->intake = r;
    c->intake_tail = r;
    c->n_intake_samples += p->n;
    c->stats.requests_submitted++;
    c->stats.prompt_tokens += (uint64_t)n_prompt;
    *handle = r->handle;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return STATUS_OK;
}

enum status conductor_cancel(struct conductor *c, uint64_t handle, const char *id)
{
    enum status st = STATUS_NOT_FOUND;
    pthread_mutex_lock(&c->mu);
    for (struct request *r = c->all; r; r = r->next_all)
        if ((id && !strcmp(r->id, id)) || (!id && r->handle == handle)) {
            r->cancel_requested = 1;
            st = STATUS_OK;
        }
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (st != STATUS_OK) status_errorf(st, "no running request %s", id ? id : "with that handle");
    return st;
}

/* The world broke (a rank gone or hung): every request fails with UNAVAILABLE, new ones are
 * refused, and the owner is told once. */
static void fail_conductor(struct conductor *c, enum status st)
{
    if (c->failed) return;
    pthread_mutex_lock(&c->mu);
    c->failed = 1;
    snprintf(c->failure, sizeof c->failure, "%s", status_message());
    pthread_mutex_unlock(&c->mu);
    LOG_ERROR(MODULE, "cannot go on: %s", c->failure);
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? c->sched.waiting : c->sched.running;
        int n = pass ? c->sched.n_waiting : c->sched.n_running;
        for (int i = 0; i < n; i++)
            if (list[i]->state != SEQ_DONE) finish_seq(c, list[i], FINISH_REASON_ERROR, STATUS_UNAVAILABLE, c->failure, 0);
    }
    if (c->o.on_fatal) c->o.on_fatal(c->o.fatal_ctx, st, c->failure);
}

/* ---- the step ------------------------------------------------------------------------------ */

static void stats_refresh_waiting(struct conductor *c)
{
    const int waiting = scheduler_waiting_samples(&c->sched);
    pthread_mutex_lock(&c->mu);
    c->stats.waiting = waiting;
    pthread_mutex_unlock(&c->mu);
}

static void stats_update(struct conductor *c, int prefill_rows, int hit_tokens)
{
    const int waiting = scheduler_waiting_samples(&c->sched);
    pthread_mutex_lock(&c->mu);
    c->stats.waiting = waiting;
    c->stats.running = c->sched.n_running;
    c->stats.kv_blocks_free = c->cache.n_free;
    c->stats.kv_blocks_cached = c->cache.n_cached;
    c->stats.prefill_tokens_computed += (uint64_t)prefill_rows;
    c->stats.prefix_cache_hit_tokens += (uint64_t)hit_tokens;
    c->stats.preemptions = c->sched.preemptions;
    pthread_mutex_unlock(&c->mu);
}

/* Step 1: newly submitted requests join the queue; cancelled samples and those past their
 * deadline finish (their blocks return at this boundary). */
static void take_intake(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    adapter_set_sync(&c->adapters, c->b); /* adapters loaded and unloaded since the last step */
    struct request *in = c->intake;
    c->intake = c->intake_tail = NULL;
    /* They wait in the scheduler from now on: counted there until stats_update counts exactly,
     * so that refusal never sees them in neither place. */
    c->stats.waiting += c->n_intake_samples;
    c->n_intake_samples = 0;
    pthread_mutex_unlock(&c->mu);
    for (struct request *r = in, *next; r; r = next) {
        next = r->next_in;
        if (c->failed) { /* submitted just before the failure */
            finish_unstarted(c, r, STATUS_UNAVAILABLE, c->failure);
            continue;
        }
        struct seq *s = seq_new(r, 0, c->tok);
        if (!s) finish_unstarted(c, r, STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
        else scheduler_enqueue(&c->sched, s);
    }
    const double now = base_now_s();
    struct scheduler *sc = &c->sched;
    pthread_mutex_lock(&c->mu);
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? sc->waiting : sc->running;
        int n = pass ? sc->n_waiting : sc->n_running;
        for (int i = 0; i < n; i++) {
            struct request *r = list[i]->req;
            list[i]->doomed = r->cancel_requested ? FINISH_REASON_CANCELLED
                              : r->p.deadline > 0 && now > r->p.deadline ? FINISH_REASON_DEADLINE
                                                                         : FINISH_REASON_NONE;
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (int pass = 0; pass < 2; pass++) { /* finish outside the lock: callbacks may cancel */
        struct seq **list = pass ? sc->waiting : sc->running;
        int n = pass ? sc->n_waiting : sc->n_running;
        for (int i = 0; i < n; i++)
            if (list[i]->doomed != FINISH_REASON_NONE) finish_seq(c, list[i], list[i]->doomed, STATUS_OK, NULL, 0);
    }
    scheduler_drop_finished(sc);
}

/* Step 3: the plan to every rank of the replica, then the forward pass over the planned rows. */
static enum status run_planned_step(struct conductor *c)
{
    const struct step_batch *b = &c->sched.batch;
    enum status st = STATUS_OK;
    const int n_micro = micro_batches(c, b->n_seqs);
    if (c->par.world) {
        struct step_plan_header ph = {.n_tokens = b->n_rows, .n_seqs = b->n_seqs, .table_width = b->table_width,
                                      .n_logits = b->n_logits, .n_copies = c->sched.n_copies, .n_micro = n_micro};
        st = plan_exchange(c, &ph);
        c->sched.n_copies = 0;
    }
    conductor_device_plan(c, n_micro);
    if (st == STATUS_OK) st = run_forward(c, b->n_rows, b->n_seqs, b->n_logits, n_micro);
    pthread_mutex_lock(&c->mu);
    c->stats.steps++;
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* Step 4 for the first sample of a request whose prompt is done: samples 1..n-1 fork from it
 * and those that run take their first token from the same row. */
static void fork_and_take(struct conductor *c, struct seq *s, const float *row)
{
    struct request *r = s->req;
    struct seq *children[REQUEST_MAX_SAMPLES];
    int n_children = scheduler_fork(&c->sched, s, c->tok, children);
    for (int k = 0; k < n_children; k++) {
        if (!children[k]) finish_absent(c, r, k + 1, FINISH_REASON_ERROR, STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
        else if (children[k]->state == SEQ_RUNNING) take_token(c, children[k], row, -1);
    }
}

/* ---- sampling the step's rows on the host's cores ------------------------------------------ */

/* Whether running sequence s draws its token in take_results by take_token's plain path from
 * its first logits row (s->logit_row): no device-greedy ids, no speculation, no prompt
 * log-probabilities this step, no constraint, not the first sample of an n > 1 request (it forks
 * first), a token wanted. Such draws depend only on the row and on s (its parameters, output and
 * random state), so they may run in any order, on any thread, before the loop that takes them. */
static int presample_eligible(const struct conductor *c, const struct seq *s)
{
    if (c->greedy_done || s->n_rows == 0 || s->state != SEQ_RUNNING || !s->wants_sample || s->n_draft > 0)
        return 0;
    const struct request *r = s->req;
    if (r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && s->sample == 0) return 0;
    if (r->grammar || r->p.max_tokens == 0) return 0;
    return !(s->sample == 0 && !r->forked && r->p.n > 1);
}

static void presample_one(void *ctx, int j, int worker)
{
    struct conductor *c = ctx;
    const int i = c->pre_idx[j], V = c->m->cfg.vocab_size;
    struct seq *s = c->sched.running[i];
    const struct request *r = s->req;
    const float *row = c->logits + (size_t)s->logit_row * (size_t)V;
    if (!sampler_logits_finite(row, V)) return; /* take_token reports it */
    float *lg = c->pre_scratch + (size_t)worker * (size_t)V;
    sampling_logits(c, s, row, s->n_generated, lg);
    struct sampling_params sp = r->p.sampling;
    c->pre_tok[i] = sampler_sample(&c->pre_smp[worker], &sp, &s->rng, lg, r->prompt, r->n_prompt,
                                   s->tokens + r->n_prompt, s->n_generated);
}

void conductor_presample_free(struct conductor *c)
{
    for (int w = 0; w < c->n_pre_smp; w++) sampler_free(&c->pre_smp[w]);
    free(c->pre_smp);
    free(c->pre_scratch);
    free(c->pre_tok);
    free(c->pre_idx);
    c->pre_smp = NULL;
    c->pre_scratch = NULL;
    c->pre_tok = c->pre_idx = NULL;
    c->n_pre_smp = 0;
}

/* The per-worker samplers and scratch, at the first step that needs them; 0 when there is one
 * worker or no memory (sampling then stays on the engine thread). */
static int presample_ready(struct conductor *c)
{
    if (c->pre_smp) return 1;
    if (c->presample_off) return 0;
    const int W = backend_host_workers(c->b), S = c->sched.o.max_seqs, V = c->m->cfg.vocab_size;
    if (W < 2) return 0;
    c->pre_smp = calloc((size_t)W, sizeof *c->pre_smp);
    c->pre_scratch = malloc((size_t)W * (size_t)V * sizeof *c->pre_scratch);
    c->pre_tok = malloc((size_t)S * sizeof *c->pre_tok);
    c->pre_idx = malloc((size_t)S * sizeof *c->pre_idx);
    int ok = c->pre_smp && c->pre_scratch && c->pre_tok && c->pre_idx;
    for (c->n_pre_smp = 0; ok && c->n_pre_smp < W; c->n_pre_smp++)
        ok = sampler_init(&c->pre_smp[c->n_pre_smp], V) == STATUS_OK;
    if (!ok) conductor_presample_free(c);
    return ok;
}

/* The tokens of every eligible sequence of the first n_running, drawn in parallel when two or
 * more draw: c->pre_tok[i] (-1 for the others). Each draw reads its row and its own sequence and
 * advances only its own random state, so the tokens are those of the sequential loop. Returns
 * whether it drew (0: take_results draws every token itself). */
static int presample(struct conductor *c, int n_running)
{
    if (!c->pre_smp) { /* made only once a step has two draws */
        int n = 0;
        for (int i = 0; i < n_running && n < 2; i++) n += presample_eligible(c, c->sched.running[i]);
        if (n < 2 || !presample_ready(c)) return 0;
    }
    int n = 0;
    for (int i = 0; i < n_running; i++) {
        c->pre_tok[i] = -1;
        if (presample_eligible(c, c->sched.running[i])) c->pre_idx[n++] = i;
    }
    if (n < 2) return 0;
    backend_host_parallel(c->b, n, presample_one, c);
    return 1;
}

/* Step 4: the results, in planning order (the logits rows follow the same order): prompt
 * log-probabilities, then a token for each sequence whose pending rows all ran. */
static void take_results(struct conductor *c, enum status st)
{
    struct scheduler *sc = &c->sched;
    const int V = c->m->cfg.vocab_size;
    int n_running = sc->n_running; /* forks append to running; they sample here, not in this loop */
    const int pre = st == STATUS_OK && presample(c, n_running);
    for (int i = 0; i < n_running; i++) {
        struct seq *s = sc->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING) continue;
        struct request *r = s->req;
        if (st != STATUS_OK) {
            finish_seq(c, s, FINISH_REASON_ERROR, st, status_message(), 0);
            continue;
        }
        int p0 = s->n_cached, lrow = s->logit_row; /* the batch is grouped by adapter, not in running order */
        if (s->n_draft > 0 && s->wants_sample) { /* speculation: the real token's row, then the drafts' */
            const int n_ver = s->n_rows - 1;
            s->n_rows = 1;                       /* cached for sure: the real token; accepted drafts below */
            scheduler_commit(sc, s);
            const int before = s->n_generated;
            r->forked = 1; /* before the tokens: the last one may finish r's last sample and free r */
            take_drafted(c, s, c->logits + (size_t)lrow * V, n_ver);
            /* Accepted drafts are cached too: their rows ran with the right tokens before them. */
            const int extra = s->n_generated - before - 1;
            if (extra > 0 && s->state == SEQ_RUNNING) {
                s->n_rows = extra;
                scheduler_commit(sc, s);
            }
            continue;
        }
        scheduler_commit(sc, s);
        int lp_rows = 0;
        if (r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && s->sample == 0) {
            for (int j = 0; j < s->n_rows; j++) lp_rows += p0 + j + 1 < r->n_prompt;
            if (lp_rows) take_prompt_logprobs(c, s, p0, lp_rows, c->logits + (size_t)lrow * V);
            else if (s->n_cached >= r->n_prompt) take_prompt_logprobs(c, s, p0, 0, NULL);
        }
        lrow += lp_rows;
        if (!s->wants_sample) continue;
        const float *row = c->logits + (size_t)lrow * V;
        const int top = c->greedy_done && c->step_top;
        const int32_t greedy_id = !c->greedy_done ? -1 : top ? c->top_ids[(size_t)lrow * (size_t)c->top_k] : c->greedy_ids[lrow];
        lrow++;
        if (s->sample == 0 && !r->forked && r->p.n > 1 && r->p.max_tokens > 0) fork_and_take(c, s, row);
        verify_consider(c, s, row);
        r->forked = 1;
        if (pre && c->pre_tok[i] >= 0) take_chosen(c, s, row, c->pre_tok[i]); /* drawn by presample */
        else if (top && (r->p.sampling.temperature > 0.0f || r->p.logprobs >= 0)) take_top(c, s, lrow - 1);
        else take_token(c, s, row, greedy_id);
    }
}

int conductor_step(struct conductor *c)
{
    run_embed_jobs(c);                                       /* embeddings between steps */
    take_intake(c);                                          /* 1 */
    const int busy = c->sched.n_waiting + c->sched.n_running;
    if (busy == 0) {
        stats_update(c, 0, 0);
        return 0;
    }
    speculate(c);
    const int planned = scheduler_plan(&c->sched);           /* 2 */
    /* The queue as planned, before step 4 answers anyone: a client answered there and sending
     * its next request at once must not find its finished request still counted as waiting. */
    stats_refresh_waiting(c);
    if (planned == 0) {
        stats_update(c, 0, c->sched.batch.hit_tokens);
        return busy;
    }
    verify_inject_fault(c);
    const double t0 = c->spec_gate ? base_now_s() : 0.0;
    enum status st = run_planned_step(c);                    /* 3 */
    if (c->test_step_delay_ns > 0) nanosleep(&(struct timespec){0, c->test_step_delay_ns}, NULL);
    if (c->test_draft_row_delay_ns > 0 && c->sched.batch.prefill_rows == 0)
        for (int i = c->sched.batch.n_seqs; i < c->sched.batch.n_rows; i++)
            nanosleep(&(struct timespec){0, c->test_draft_row_delay_ns}, NULL);
    take_results(c, st);                                     /* 4 */
    if (c->spec_gate) spec_gate_step(c, base_now_s() - t0);
    if (st != STATUS_OK && c->par.world && c->par.world->broken) fail_conductor(c, st);
    scheduler_drop_finished(&c->sched);
    stats_update(c, c->sched.batch.prefill_rows, c->sched.batch.hit_tokens);
    /* The step's batch is spent: --verify-prefix-cache's recomputations plan their own. */
    if (c->n_vjobs && (st = verify_run_pending(c)) != STATUS_OK && c->par.world && c->par.world->broken)
        fail_conductor(c, st);
    return busy;
}

/* ---- the engine thread ---------------------------------------------------------------------- */

/* An idle conductor of several ranks still learns of a hung or dead one: a collective's
 * timeout only fires while a step waits for it, so a worker stopped while nothing runs would go
 * unnoticed until the next request (and the server would say SERVING meanwhile). The ranks'
 * heartbeats (parallel_watch.c) tell it: a rank silent for longer than --rank-timeout fails
 * the engine as a timed-out collective would. */
static void check_idle_ranks(struct conductor *c)
{
    struct parallel_world *w = c->par.world;
    char who[320];
    if (c->failed || w->broken || parallel_watch_silent_over(w, w->timeout_s, who, sizeof who) == 0) return;
    enum status st = parallel_world_fail(w, "no heartbeat for more than --rank-timeout %.1f s while idle: %s: hung or gone",
                                         w->timeout_s, who);
    fail_conductor(c, st);
}

static void *conductor_main(void *arg)
{
    struct conductor *c = arg;
    struct parallel_world *w = c->par.world;
    const int watch = w && w->size > 1 && w->timeout_s > 0;
    for (;;) {
        pthread_mutex_lock(&c->mu);
        int idle = 0;
        while (!c->stop_thread && !c->intake && !c->embed_jobs && !c->adapters.dirty &&
               c->sched.n_running + c->sched.n_waiting == 0) {
            if (!watch) {
                pthread_cond_wait(&c->cv, &c->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 250 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) != 0) {
                idle = 1;
                break;
            }
        }
        int stop = c->stop_thread;
        pthread_mutex_unlock(&c->mu);
        if (stop) break;
        if (idle) check_idle_ranks(c);
        else conductor_step(c);
    }
    fail_embed_jobs(c); /* whoever still waits learns that the engine stopped */
    return NULL;
}

enum status conductor_start(struct conductor *c)
{
    if (c->thread_running) return STATUS_OK;
    if (pthread_create(&c->thread, NULL, conductor_main, c) != 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: cannot start the engine thread");
    c->thread_running = 1;
    return STATUS_OK;
}

static int conductor_idle(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    int idle = !c->intake && c->all == NULL && c->embed_active == 0;
    pthread_mutex_unlock(&c->mu);
    return idle;
}

void conductor_drain(struct conductor *c, double timeout_s)
{
    pthread_mutex_lock(&c->mu);
    c->draining = 1;
    pthread_mutex_unlock(&c->mu);
    const double end = base_now_s() + timeout_s;
    int cancelled = 0;
    for (;;) {
        if (conductor_idle(c)) break;
        if (!cancelled && base_now_s() >= end) {
            pthread_mutex_lock(&c->mu);
            for (struct request *r = c->all; r; r = r->next_all) r->cancel_requested = 1;
            cancel_embed_jobs(c);
            pthread_cond_signal(&c->cv);
            pthread_mutex_unlock(&c->mu);
            cancelled = 1;
        }
        if (!c->thread_running) conductor_step(c);
        else {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    }
    if (c->thread_running) {
        pthread_mutex_lock(&c->mu);
        c->stop_thread = 1;
        pthread_cond_signal(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
        c->thread_running = 0;
    }
}

void conductor_get_stats(struct conductor *c, struct engine_stats *s)
{
    pthread_mutex_lock(&c->mu);
    *s = c->stats;
    s->waiting += c->n_intake_samples;
    pthread_mutex_unlock(&c->mu);
}

enum status conductor_get_expert_load(const struct conductor *c, struct engine_expert_load *out)
{
    const struct model *m = c->m;
    *out = (struct engine_expert_load){0};
    if (!m->cfg.n_experts || m->n_layers_local < 1) return STATUS_OK;
    out->load = malloc((size_t)m->n_layers_local * (size_t)m->cfg.n_experts * sizeof *out->load);
    if (!out->load) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "expert load: out of memory");
    out->layer_first = m->layer_first;
    out->n_experts = m->cfg.n_experts;
    out->n_layers = moe_load_read(m, out->load);
    return STATUS_OK;
}
