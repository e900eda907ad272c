/* engine/serving/request.c - requests and samples (see request.h): the limits table and the
 * validator, owned copies of requests, samples' text and stop conditions, events.
 * Not here: scheduling and KV blocks (scheduler.c), the step (conductor.c), sampling maths
 * (sampler.c). Tests: tests/test_scheduler.c, tests/test_engine.c, tests/server/test_server.py
 * (the table of invalid requests). */
#include "request.h"

#include "constraint.h"
#include "grammar.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

struct request_params request_params_default(void)
{
    return (struct request_params){.sampling = sampling_params_default(), .max_tokens = 16,
                                   .logprobs = -1, .prompt_logprobs = -1, .n = 1, .speculative_p_min = -1.0f};
}

enum status speculative_mode_parse(const char *s, const char *field, enum speculative_mode *out)
{
    if (!s || !*s || !strcmp(s, "auto")) *out = SPECULATIVE_MODE_AUTO;
    else if (!strcmp(s, "off")) *out = SPECULATIVE_MODE_OFF;
    else return status_errorf(STATUS_INVALID_ARGUMENT, "%s must be one of auto, off; got '%.64s'", field, s);
    return STATUS_OK;
}

/* ---- the limits table ----------------------------------------------------------------------- */

#define SAMPLING(field) offsetof(struct request_params, sampling.field), REQUEST_FIELD_FLOAT
#define INT_FIELD(field) offsetof(struct request_params, field), REQUEST_FIELD_INT
#define C REQUEST_BOUND_CONST

/* Every numeric limit of a request, in the order they are checked. Keep the .proto comments
 * (protos/shardlm/v1/text_generation.proto, SamplingParams) in step with these rows. */
static const struct request_limit limits[] = {
    {"sampling.max_tokens", INT_FIELD(max_tokens), 0, 0, C, REQUEST_BOUND_NONE, 0, 0, 0, 0, 0,
     " (and prompt + max_tokens within the context)"},
    {"sampling.min_tokens", INT_FIELD(min_tokens), 0, 0, C, REQUEST_BOUND_MAX_TOKENS, 0, 0, 0, 0, 0, ""},
    {"sampling.temperature", SAMPLING(temperature), 0, 100, C, C, 0, 0, 1, 0, 0, " (0 = greedy)"},
    {"sampling.top_k", offsetof(struct request_params, sampling.top_k), REQUEST_FIELD_INT, 0, 0, C,
     REQUEST_BOUND_VOCAB, 0, 0, 1, 0, 0, " (0 = off)"},
    {"sampling.top_p", SAMPLING(top_p), 0, 1, C, C, 1, 0, 1, 0, 0, ""},
    {"sampling.min_p", SAMPLING(min_p), 0, 1, C, C, 0, 0, 1, 0, 0, ""},
    {"sampling.repetition_penalty", SAMPLING(repetition_penalty), 0, 10, C, C, 1, 0, 1, 0, 0, " (1 = off)"},
    {"sampling.presence_penalty", SAMPLING(presence_penalty), -2, 2, C, C, 0, 0, 1, 0, 0, ""},
    {"sampling.frequency_penalty", SAMPLING(frequency_penalty), -2, 2, C, C, 0, 0, 1, 0, 0, ""},
    {"sampling.n", INT_FIELD(n), 1, 0, C, REQUEST_BOUND_MAX_SAMPLES, 0, 0, 0, 0, 0, ""},
    {"sampling.logprobs", INT_FIELD(logprobs), 0, 0, C, REQUEST_BOUND_MAX_LOGPROBS, 0, 0, 0, 1, -1, " (or unset)"},
    {"sampling.prompt_logprobs", INT_FIELD(prompt_logprobs), 0, 0, C, REQUEST_BOUND_MAX_LOGPROBS, 0, 0, 0, 1, -1,
     " (or unset)"},
    {"sampling.speculative_n_max", INT_FIELD(speculative_n_max), 0, 32, C, C, 0, 0, 0, 0, 0,
     " (0 = the server's --spec-draft)"},
    {"sampling.speculative_p_min", offsetof(struct request_params, speculative_p_min), REQUEST_FIELD_FLOAT, 0, 1, C, C,
     0, 0, 0, 1, -1, " (or unset: the server's --spec-p-min)"},
};

#undef SAMPLING
#undef INT_FIELD
#undef C

const struct request_limit *request_limits(int *n)
{
    *n = (int)(sizeof limits / sizeof limits[0]);
    return limits;
}

/* The bound of one side, or 0 with *known 0 when it is not checked. */
static double bound_value(enum request_bound kind, double value, const struct request_params *p,
                          const struct request_bounds *b, int *known)
{
    static const struct request_bounds none;
    if (!b) b = &none;
    *known = 1;
    switch (kind) {
    case REQUEST_BOUND_CONST: return value;
    case REQUEST_BOUND_NONE: break;
    case REQUEST_BOUND_VOCAB:
        if (b->vocab_size > 0) return b->vocab_size;
        break;
    case REQUEST_BOUND_MAX_LOGPROBS:
        return b->max_logprobs > 0 ? b->max_logprobs : REQUEST_DEFAULT_MAX_LOGPROBS;
    case REQUEST_BOUND_MAX_SAMPLES: {
        int n = REQUEST_MAX_SAMPLES;
        if (b->max_seqs > 0 && b->max_seqs < n) n = b->max_seqs;
        if (b->max_queue > 0 && b->max_queue < n) n = b->max_queue;
        return n;
    }
    case REQUEST_BOUND_MAX_TOKENS: return p->max_tokens;
    }
    *known = 0;
    return 0;
}

static enum status limit_error(const struct request_limit *l, double v, double lo, double hi, int hi_known)
{
    char range[96], value[32];
    if (!hi_known) snprintf(range, sizeof range, "%s %g", l->lo_open ? ">" : ">=", lo);
    else if (l->hi_bound == REQUEST_BOUND_MAX_TOKENS) snprintf(range, sizeof range, "in [%g, max_tokens = %g]", lo, hi);
    else snprintf(range, sizeof range, "in %c%g, %g%c", l->lo_open ? '(' : '[', lo, hi, l->hi_open ? ')' : ']');
    snprintf(value, sizeof value, "%g", v);
    return status_errorf(STATUS_INVALID_ARGUMENT, "%s must be %s%s, got %s", l->name, range, l->note, value);
}

enum status request_limits_check(const struct request_params *p, const struct request_bounds *b, int sampling_only)
{
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        const struct request_limit *l = &limits[i];
        if (sampling_only && !l->sampling) continue;
        const char *at = (const char *)p + l->offset;
        double v;
        if (l->type == REQUEST_FIELD_FLOAT) {
            float f;
            memcpy(&f, at, sizeof f);
            if (l->has_unset && f == (float)l->unset) continue;
            v = f;
        } else {
            int x;
            memcpy(&x, at, sizeof x);
            if (l->has_unset && x == l->unset) continue;
            v = x;
        }
        int lo_known, hi_known;
        double lo = bound_value(l->lo_bound, l->lo, p, b, &lo_known);
        double hi = bound_value(l->hi_bound, l->hi, p, b, &hi_known);
        int ok = !isnan(v);
        if (ok && lo_known) ok = l->lo_open ? v > lo : v >= lo;
        if (ok && hi_known) ok = l->hi_open ? v < hi : v <= hi;
        if (!ok) return limit_error(l, v, lo, hi, hi_known);
    }
    return STATUS_OK;
}

static enum status check_arrays(const struct request_params *p, int V)
{
    if (p->n_stop < 0 || p->n_stop > REQUEST_MAX_STOP)
        return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop: at most %d strings, got %d", REQUEST_MAX_STOP,
                             p->n_stop);
    for (int i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n == 0 || n > REQUEST_MAX_STOP_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop[%d] must be 1 to %d bytes long, got %zu", i,
                                 REQUEST_MAX_STOP_BYTES, n);
    }
    if (p->n_stop_token_ids < 0 || p->n_stop_token_ids > REQUEST_MAX_STOP_TOKEN_IDS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop_token_ids: at most %d ids, got %d",
                             REQUEST_MAX_STOP_TOKEN_IDS, p->n_stop_token_ids);
    for (int i = 0; i < p->n_stop_token_ids; i++)
        if (p->stop_token_ids[i] < 0 || (V > 0 && p->stop_token_ids[i] >= V))
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop_token_ids[%d] must be in [0, %d), got %d", i, V,
                                 p->stop_token_ids[i]);
    if (p->n_end_ids < 0 || p->n_end_ids > REQUEST_MAX_END_IDS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "end_ids: at most %d ids, got %d", REQUEST_MAX_END_IDS,
                             p->n_end_ids);
    for (int i = 0; i < p->n_end_ids; i++)
        if (p->end_ids[i] < 0 || (V > 0 && p->end_ids[i] >= V))
            return status_errorf(STATUS_INVALID_ARGUMENT, "end_ids[%d] must be in [0, %d), got %d", i, V, p->end_ids[i]);
    if ((int)p->constraint_kind < CONSTRAINT_NONE || (int)p->constraint_kind > CONSTRAINT_CHOICE)
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: unknown kind %d", (int)p->constraint_kind);
    if (p->constraint_kind != CONSTRAINT_NONE && p->constraint_kind != CONSTRAINT_JSON_OBJECT &&
        (!p->constraint || p->constraint_len == 0))
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: empty");
    if (p->constraint_len > REQUEST_MAX_CONSTRAINT_BYTES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "constraint: at most %d bytes, got %zu",
                             REQUEST_MAX_CONSTRAINT_BYTES, p->constraint_len);
    if (p->n_logit_bias < 0 || p->n_logit_bias > REQUEST_MAX_LOGIT_BIAS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.logit_bias: at most %d entries, got %d",
                             REQUEST_MAX_LOGIT_BIAS, p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias_ids[i] < 0 || (V > 0 && p->logit_bias_ids[i] >= V))
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.logit_bias key must be in [0, %d), got %d", V,
                                 p->logit_bias_ids[i]);
        if (!(fabsf(p->logit_bias_values[i]) <= (float)REQUEST_MAX_LOGIT_BIAS_ABS))
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.logit_bias[%d] must be in [-%d, %d], got %g",
                                 p->logit_bias_ids[i], REQUEST_MAX_LOGIT_BIAS_ABS, REQUEST_MAX_LOGIT_BIAS_ABS,
                                 (double)p->logit_bias_values[i]);
        /* (each entry is added to its logit: a key twice, which a raw protobuf map can carry,
         * would pass the bound on one entry's value) */
        for (int j = 0; j < i; j++)
            if (p->logit_bias_ids[j] == p->logit_bias_ids[i])
                return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.logit_bias: token %d appears twice",
                                     p->logit_bias_ids[i]);
    }
    return STATUS_OK;
}

enum status request_context_check(long long n_prompt, long long max_tokens, const size_t *bytes,
                                  const struct request_bounds *b)
{
    if (max_tokens < 0) max_tokens = 0; /* HTTP's unset */
    if (b->max_positions <= 0 || n_prompt + max_tokens <= b->max_positions) return STATUS_OK;
    if (bytes)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "prompt (at least %lld tokens: %zu bytes) + max_tokens (%lld) exceeds the model's context "
                             "of %d tokens", n_prompt, *bytes, max_tokens, b->max_positions);
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "prompt (%lld tokens) + max_tokens (%lld) exceeds the model's context of %d tokens", n_prompt,
                         max_tokens, b->max_positions);
}

/* A journaled sample's resumption (request_params.resume_*). */
static enum status check_resume(const struct request_params *p, int V)
{
    if (!p->resume_rng) {
        if (p->n_resume || p->resume_tokens)
            return status_errorf(STATUS_INVALID_ARGUMENT, "resume_tokens need resume_rng");
        return STATUS_OK;
    }
    if (p->n != 1 || p->prompt_logprobs >= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "a resumed sample takes n = 1 and no prompt_logprobs");
    if (p->n_resume < 0 || p->n_resume >= p->max_tokens || (p->n_resume && !p->resume_tokens))
        return status_errorf(STATUS_INVALID_ARGUMENT, "resume_tokens: %d tokens, must be in [0, max_tokens = %d)",
                             p->n_resume, p->max_tokens);
    for (int i = 0; i < p->n_resume; i++)
        if (p->resume_tokens[i] < 0 || (V > 0 && p->resume_tokens[i] >= V))
            return status_errorf(STATUS_INVALID_ARGUMENT, "resume_tokens[%d] must be in [0, %d), got %d", i, V,
                                 p->resume_tokens[i]);
    return STATUS_OK;
}

enum status request_validate(const int32_t *prompt, int n_prompt, const struct request_params *p,
                             const struct request_bounds *b)
{
    const int V = b->vocab_size;
    if (n_prompt < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "prompt: must hold at least one token");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || (V > 0 && prompt[i] >= V))
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "prompt_token_ids[%d] must be in [0, %d) (the vocabulary), got %d", i, V, prompt[i]);
    enum status st = request_limits_check(p, b, 0);
    if (st != STATUS_OK) return st;
    if (p->max_tokens == 0 && p->prompt_logprobs < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "sampling.max_tokens must be >= 1 unless prompt_logprobs is set (0 = score the prompt only)");
    if (p->priority != 0 && b->scheduling != SCHEDULING_PRIORITY)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "priority must be 0 unless the server schedules by priority (serve --scheduling-policy "
                             "priority), got %d",
                             p->priority);
    if ((st = request_context_check(n_prompt, p->max_tokens, NULL, b)) != STATUS_OK) return st;
    if ((st = check_resume(p, V)) != STATUS_OK) return st;
    if (b->block_tokens > 0) {
        long long need = ((long long)n_prompt + p->max_tokens + b->block_tokens - 1) / b->block_tokens;
        if (need > b->n_blocks)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "prompt (%d tokens) + max_tokens (%d) needs %lld KV blocks; the cache holds %d",
                                 n_prompt, p->max_tokens, need, b->n_blocks);
        if (p->n > 1 && p->n * need > b->n_blocks)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "n = %d samples of this request could never fit the KV cache together (%lld of %d blocks)",
                                 p->n, p->n * need, b->n_blocks);
    }
    return check_arrays(p, V);
}

enum status request_id_check(const char *request_id)
{
    size_t n = request_id ? strlen(request_id) : 0;
    if (n > REQUEST_ID_MAX_BYTES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "request_id must be at most %d bytes, got %zu",
                             REQUEST_ID_MAX_BYTES, n);
    return STATUS_OK;
}

/* ---- requests and samples ----------------------------------------------------------------- */

void request_free(struct request *r)
{
    if (!r) return;
    free(r->prompt);
    free(r->stop_ids);
    for (int i = 0; i < REQUEST_MAX_STOP; i++) free(r->stop[i]);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->prompt_lp);
    free(r->prompt_top);
    free(r->resume);
    if (r->grammar) grammar_unref(r->grammar);
    free(r);
}

/* The scope of a learned answer (spec_corpus.h): FNV-1a of the owner and the adapter, folded to 32
 * bits; 0 is the given corpus's (every request's), so never 0. */
static uint32_t spec_scope(const char *owner, const char *adapter)
{
    uint64_t h = base_fnv1a_str(BASE_FNV1A_BASIS, owner ? owner : "");
    h = base_fnv1a(h, "", 1); /* the two names' border */
    h = base_fnv1a_str(h, adapter ? adapter : "");
    const uint32_t s = (uint32_t)(h ^ (h >> 32));
    return s ? s : 1;
}

/* FNV-1a of the client's name; 0 is kept for "none given". */
static uint64_t client_key(const char *client)
{
    if (!client || !client[0]) return 0;
    const uint64_t h = base_fnv1a_str(BASE_FNV1A_BASIS, client);
    return h ? h : 1;
}

enum status request_new(const int32_t *prompt, int n_prompt, const struct request_params *p,
                        engine_event_fn on_event, void *ctx, struct request **out)
{
    *out = NULL;
    struct request *r = calloc(1, sizeof *r);
    if (!r) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    r->p = *p;
    r->on_event = on_event;
    r->ctx = ctx;
    r->n_prompt = n_prompt;
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    r->resume = malloc(((size_t)p->n_resume + 1) * sizeof *r->resume);
    r->stop_ids = malloc(((size_t)p->n_stop_token_ids + 1) * sizeof *r->stop_ids);
    r->bias_ids = malloc(((size_t)p->n_logit_bias + 1) * sizeof *r->bias_ids);
    r->bias_values = malloc(((size_t)p->n_logit_bias + 1) * sizeof *r->bias_values);
    int ok = r->prompt && r->resume && r->stop_ids && r->bias_ids && r->bias_values;
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
    if (p->n_resume) memcpy(r->resume, p->resume_tokens, (size_t)p->n_resume * sizeof *r->resume);
    if (p->resume_rng) memcpy(r->resume_rng, p->resume_rng, sizeof r->resume_rng);
    r->p.resume_tokens = NULL;
    r->p.resume_rng = NULL;
    r->resumed = p->resume_rng != NULL;
    r->p.stop_token_ids = NULL; /* the copies above are what the engine reads */
    r->p.stop = NULL;
    r->p.logit_bias_ids = NULL;
    r->p.logit_bias_values = NULL;
    r->live_samples = p->n;
    r->adapter = -1;
    r->spec_scope = spec_scope(p->owner, p->adapter);
    r->cache_salt = p->cache_salt && *p->cache_salt ? base_fnv1a_str(BASE_FNV1A_BASIS, p->cache_salt) : 0;
    r->p.cache_salt = NULL; /* borrowed: only its hash is kept (the owner joins it at submission) */
    r->p.owner = NULL;   /* borrowed: only its hash is kept */
    r->p.adapter = NULL; /* borrowed: resolved into adapter / adapter_key at submission */
    r->client_key = client_key(p->client);
    r->p.client = NULL;  /* borrowed: only its hash is kept */
    r->p.constraint = NULL; /* compiled into r->grammar by the conductor */
    r->p.constraint_len = 0;
    *out = r;
    return STATUS_OK;
}

void seq_free(struct seq *s)
{
    if (!s) return;
    free(s->tokens);
    free(s->blocks);
    free(s->held);
    if (s->detok.tok) detokenizer_free(&s->detok);
    grammar_matcher_free(s->gm);
    grammar_matcher_free(s->gm_check);
    free(s);
}

static uint64_t sample_seed(uint64_t seed, int sample)
{
    /* Sample 0 uses the request's seed as is, so n = 1 matches `shardlm generate --seed`. */
    return sample == 0 ? seed : seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)sample);
}

static enum status take_text(struct seq *s, int32_t tok, int eos, enum finish_reason *why, size_t *cut);
static enum status replay_constraint(struct seq *s, int32_t tok);

void engine_sample_rng(uint64_t seed, int sample, uint64_t out[4])
{
    struct rng g;
    rng_seed(&g, sample_seed(seed, sample));
    memcpy(out, g.s, sizeof g.s);
}

struct seq *seq_new(struct request *r, int sample, const struct tokenizer *tok)
{
    struct seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->req = r;
    s->sample = sample;
    if (base_grow((void **)&s->tokens, &s->cap_tokens, (size_t)r->n_prompt + (size_t)r->p.max_tokens + 1,
                  sizeof *s->tokens) != 0) {
        free(s);
        return NULL;
    }
    memcpy(s->tokens, r->prompt, (size_t)r->n_prompt * sizeof *s->tokens);
    s->n_tokens = r->n_prompt;
    rng_seed(&s->rng, sample_seed(r->seed, sample));
    if (r->resumed) memcpy(s->rng.s, r->resume_rng, sizeof s->rng.s);
    if (tok) {
        detokenizer_init(&s->detok, tok);
        detokenizer_show_special(&s->detok, r->p.show_special);
        /* The prompt primes the detokenizer, so the first generated piece is spaced as a
         * continuation; its text is not part of the output. */
        for (int i = 0; i < r->n_prompt; i++) {
            const char *t;
            size_t n;
            if (detokenizer_push(&s->detok, r->prompt[i], &t, &n) != STATUS_OK) break;
        }
    }
    /* A resumed sample takes its generated tokens back as they were taken the first time,
     * without events: the held text, the constraint's state and the counts end where they
     * stood (none of them finished it then, so none does now). */
    for (int i = 0; i < r->p.n_resume; i++)
        if (take_text(s, r->resume[i], -1, NULL, NULL) != STATUS_OK || replay_constraint(s, r->resume[i]) != STATUS_OK) {
            seq_free(s);
            return NULL;
        }
    return s;
}

/* ---- events ------------------------------------------------------------------------------- */

void request_emit(struct seq *s, struct engine_event *ev)
{
    struct request *r = s->req;
    ev->handle = r->handle;
    ev->request_id = r->id;
    ev->sample = s->sample;
    ev->prompt_tokens = r->n_prompt;
    ev->completion_tokens = s->n_generated;
    ev->seed = r->seed;
    ev->cached_prompt_tokens = s->cached_prompt_tokens;
    ev->queue_seconds = s->t_admit > 0 ? s->t_admit - r->t_submit : -1.0;
    ev->rng = s->rng.s;
    if (!ev->text) ev->text = ""; /* never NULL, so consumers may copy text_len bytes as is */
    r->on_event(r->ctx, ev);
}

void request_emit_absent(struct request *r, int sample, enum finish_reason why, enum status st, const char *message)
{
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .handle = r->handle, .text = "",
                              .request_id = r->id, .sample = sample, .finish = why, .status = st,
                              .message = message, .prompt_tokens = r->n_prompt, .seed = r->seed,
                              .queue_seconds = -1.0};
    r->on_event(r->ctx, &ev);
}

void request_send_prompt_logprobs(struct seq *s)
{
    struct request *r = s->req;
    if (r->prompt_lp_sent || !(r->prompt_lp_done >= r->n_prompt || r->n_prompt == 1)) return;
    r->prompt_lp_sent = 1;
    const int k = r->p.prompt_logprobs;
    struct engine_event ev = {.kind = ENGINE_EVENT_PROMPT_LOGPROBS, .tokens = r->prompt,
                              .n_tokens = r->n_prompt, .logprobs = r->prompt_lp,
                              .top = k > 0 ? r->prompt_top : NULL, .n_top = k};
    request_emit(s, &ev);
}

/* ---- text and stops ------------------------------------------------------------------------ */

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
    if (n == 0) return; /* s->held may be NULL (nothing ever held): memmove's arguments must not be */
    memmove(s->held, s->held + n, s->n_held - n);
    s->n_held -= n;
}

static enum status hold_text(struct seq *s, const char *t, size_t n)
{
    if (base_grow((void **)&s->held, &s->cap_held, s->n_held + n, 1) != 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    memcpy(s->held + s->n_held, t, n);
    s->n_held += n;
    return STATUS_OK;
}

int request_is_end_id(const struct request *r, int32_t t)
{
    for (int i = 0; i < r->p.n_end_ids; i++)
        if (r->p.end_ids[i] == t) return 1;
    return 0;
}

static int is_stop_id(const struct request *r, int32_t t)
{
    for (int i = 0; i < r->p.n_stop_token_ids; i++)
        if (r->stop_ids[i] == t) return 1;
    return 0;
}

/* The earliest offset in held at which a stop string ends inside the newest `added` bytes,
 * or (size_t)-1. */
static size_t find_stop(const struct seq *s, size_t before)
{
    const struct request *r = s->req;
    size_t cut = (size_t)-1;
    for (int i = 0; i < r->p.n_stop; i++) {
        /* A new occurrence ends inside the new text, so it starts after before - len. */
        size_t from = before >= r->stop_len[i] ? before - r->stop_len[i] + 1 : 0;
        for (size_t at = from; at + r->stop_len[i] <= s->n_held; at++)
            if (!memcmp(s->held + at, r->stop[i], r->stop_len[i])) {
                if (at < cut) cut = at;
                break;
            }
    }
    return cut;
}

/* Appends tok to s and its text to held (eos: the model's EOS id). *why: the finish it causes by a stop id, EOS or a
 * stop string (then *cut is where the stop string starts in held, else (size_t)-1); why NULL
 * (a resumed sample's replay): the token is known not to have finished it. */
static enum status take_text(struct seq *s, int32_t tok, int eos, enum finish_reason *why, size_t *cut)
{
    struct request *r = s->req;
    s->tokens[s->n_tokens++] = tok;
    s->n_generated++;
    enum finish_reason w = FINISH_REASON_NONE;
    if (cut) *cut = (size_t)-1;
    if (why && is_stop_id(r, tok)) w = FINISH_REASON_STOP;
    else if (why && (tok == eos || request_is_end_id(r, tok)) && !r->p.ignore_eos) w = FINISH_REASON_EOS;
    if (w == FINISH_REASON_NONE && s->detok.tok) { /* the token's text; a stop token's text is never shown */
        const char *t;
        size_t n;
        if (detokenizer_push(&s->detok, tok, &t, &n) == STATUS_OK && n) {
            size_t before = s->n_held;
            if (hold_text(s, t, n) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
            if (cut) *cut = find_stop(s, before);
            if (cut && *cut != (size_t)-1) w = FINISH_REASON_STOP;
        }
    }
    if (why) *why = w;
    else drop_held(s, releasable(s)); /* what its TOKENS event carried the first time */
    return STATUS_OK;
}

/* A resumed sample's replayed token through its constraint (as conductor_sample.c takes it). */
static enum status replay_constraint(struct seq *s, int32_t tok)
{
    return s->req->grammar ? constraint_take(s, tok) : STATUS_OK;
}

enum finish_reason request_take_token(struct seq *s, int32_t tok, int eos, int max_positions,
                                      const float *tok_lp, const struct top_logprob *top, int n_top,
                                      size_t *text_len)
{
    struct request *r = s->req;
    *text_len = 0;
    enum finish_reason why;
    size_t cut;
    if (take_text(s, tok, eos, &why, &cut) != STATUS_OK) {
        status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
        return FINISH_REASON_ERROR;
    }
    if (why == FINISH_REASON_NONE && s->grammar_end) why = FINISH_REASON_STOP;
    if (why == FINISH_REASON_NONE && (s->n_generated >= r->p.max_tokens || s->n_tokens >= max_positions))
        why = FINISH_REASON_LENGTH;

    size_t release = why == FINISH_REASON_NONE ? releasable(s) : 0;
    struct engine_event ev = {.kind = ENGINE_EVENT_TOKENS, .tokens = &tok, .n_tokens = 1,
                              .text = s->held, .text_len = release, .logprobs = tok_lp,
                              .top = n_top ? top : NULL, .n_top = n_top};
    request_emit(s, &ev);
    drop_held(s, release);
    if (why == FINISH_REASON_NONE) return why;
    if (cut != (size_t)-1) {
        s->n_held = cut;
    } else if (s->detok.tok) {
        const char *t;
        size_t n;
        if (detokenizer_flush(&s->detok, &t, &n) == STATUS_OK && n) hold_text(s, t, n);
    }
    *text_len = s->n_held;
    return why;
}
