/* engine/serving/conductor_sample.c - the conductor's tokens: sampling the next token of a
 * sequence from its logits row (penalties, bias, a structured-output constraint's mask), prompt
 * log-probabilities, and prompt-lookup speculative decoding (drafting before a step, taking the
 * verified drafts after it; docs/speculative.md). The step that calls them: conductor.c.
 * Tests: tests/test_engine.c, tests/server/test_structured.py, tests/server/test_speculative.py. */
#include "conductor_impl.h"

#include <math.h>
#include <string.h>

#include "grammar.h"

/* ---- sampling a token and its consequences ------------------------------------------------ */

/* A constrained sample: the logits of the tokens its grammar forbids next become -inf (EOS and
 * the end-of-turn ids only where the output may end; c->gmask allows EOS from the vocabulary).
 * Returns 0 after finishing the sample with an error when nothing may follow. */
static int constrain(struct conductor *c, struct seq *s, float *lg)
{
    struct request *r = s->req;
    const int V = c->m->cfg.vocab_size;
    if (!s->gm && grammar_matcher_new(r->grammar, &s->gm) != STATUS_OK) {
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
        return 0;
    }
    grammar_matcher_fill_mask(s->gm, c->gmask);
    if (grammar_matcher_can_end(s->gm))
        for (int i = 0; i < r->p.n_end_ids; i++) c->gmask[r->p.end_ids[i] >> 5] |= 1u << (r->p.end_ids[i] & 31);
    int any = 0;
    for (int i = 0; i < V; i++) {
        if (c->gmask[i >> 5] >> (i & 31) & 1) any |= lg[i] > -INFINITY;
        else lg[i] = -INFINITY;
    }
    if (!any) {
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INVALID_ARGUMENT,
                   "constraint: no token the model may produce continues the output (the constraint needs a token "
                   "banned here, or its end needs EOS before min_tokens)", 0);
        return 0;
    }
    return 1;
}

/* Samples the next token of s from the logits row, then emits it and finishes the sample when a
 * stop condition holds. A row holding NaN or Inf (a numerical overflow, or weights that went bad
 * after the load-time check) ends the sample with an error instead of a made-up token. */
void take_token(struct conductor *c, struct seq *s, const float *row, int32_t greedy_id)
{
    struct request *r = s->req;
    const int V = c->m->cfg.vocab_size, eos = conductor_eos_id(c);
    if (greedy_id >= 0) { /* picked on the device (step_is_plain_greedy); every logit was finite */
        size_t text_len = 0;
        enum finish_reason why = request_take_token(s, greedy_id, eos, c->m->cfg.max_positions, NULL, NULL, 0, &text_len);
        if (why == FINISH_REASON_ERROR) finish_seq(c, s, why, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
        else if (why != FINISH_REASON_NONE) finish_seq(c, s, why, STATUS_OK, NULL, text_len);
        return;
    }
    if (!sampler_logits_finite(row, V)) {
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INTERNAL,
                   "the model produced NaN or Inf logits for this sequence; no token was sampled", 0);
        return;
    }
    if (r->p.max_tokens == 0) { /* scoring only */
        finish_seq(c, s, FINISH_REASON_LENGTH, STATUS_OK, NULL, 0);
        return;
    }
    float *lp = c->scratch, *lg = c->scratch + V;
    memcpy(lg, row, (size_t)V * sizeof *lg);
    for (int i = 0; i < r->p.n_logit_bias; i++) lg[r->bias_ids[i]] += r->bias_values[i];
    if (s->n_generated < r->p.min_tokens) { /* too early to stop: EOS and stop ids are banned */
        if (eos >= 0 && !r->p.ignore_eos) lg[eos] = -INFINITY;
        for (int i = 0; i < r->p.n_stop_token_ids; i++) lg[r->stop_ids[i]] = -INFINITY;
        for (int i = 0; i < r->p.n_end_ids && !r->p.ignore_eos; i++) lg[r->p.end_ids[i]] = -INFINITY;
    }
    if (r->grammar && !constrain(c, s, lg)) return;
    struct sampling_params sp = r->p.sampling;
    int32_t tok = sampler_sample(&c->smp, &sp, &s->rng, lg, r->prompt, r->n_prompt,
                                 s->tokens + r->n_prompt, s->n_generated);
    /* Log-probabilities are those of the model's distribution (the raw logits). */
    float tok_lp = 0.0f;
    struct top_logprob top[64];
    int n_top = r->p.logprobs > 0 ? r->p.logprobs : 0;
    if (r->p.logprobs >= 0) {
        sampler_log_softmax(row, lp, V);
        tok_lp = lp[tok];
        if (n_top) sampler_top_logprobs(lp, V, n_top, top);
    }
    if (s->gm && grammar_matcher_accept(s->gm, tok) == STATUS_OK) s->grammar_end = grammar_matcher_is_done(s->gm);
    size_t text_len = 0;
    enum finish_reason why = request_take_token(s, tok, eos, c->m->cfg.max_positions,
                                                r->p.logprobs >= 0 ? &tok_lp : NULL, top, n_top, &text_len);
    if (why == FINISH_REASON_ERROR) finish_seq(c, s, why, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
    else if (why != FINISH_REASON_NONE) finish_seq(c, s, why, STATUS_OK, NULL, text_len);
}

/* Records prompt log-probabilities from the logits of prompt rows [p0, p0 + n) (row p predicts
 * token p + 1), and sends them once the whole prompt is scored. */
void take_prompt_logprobs(struct conductor *c, struct seq *s, int p0, int n, const float *rows)
{
    struct request *r = s->req;
    const int V = c->m->cfg.vocab_size, k = r->p.prompt_logprobs;
    for (int j = 0; j < n; j++) {
        int p = p0 + j;
        if (p + 1 >= r->n_prompt || p + 1 < r->prompt_lp_done) continue;
        sampler_log_softmax(rows + (size_t)j * V, c->scratch, V);
        r->prompt_lp[p + 1] = c->scratch[r->prompt[p + 1]];
        if (k > 0) sampler_top_logprobs(c->scratch, V, k, r->prompt_top + (size_t)(p + 1) * k);
        r->prompt_lp_done = p + 2;
    }
    request_send_prompt_logprobs(s);
}

/* ---- speculative decoding: prompt lookup ------------------------------------------------ */

/* Whether s may draft this step: decoding (one real token pending), greedy with nothing that
 * makes a row's token depend on more than its logits' argmax. */
static int can_draft(const struct conductor *c, const struct seq *s)
{
    const struct request *r = s->req;
    const struct sampling_params *sp = &r->p.sampling;
    return s->state == SEQ_RUNNING && s->n_generated >= 1 && s->n_cached == s->n_tokens - 1 && !r->grammar &&
           sp->temperature == 0.0f && sp->repetition_penalty == 1.0f && sp->presence_penalty == 0.0f &&
           sp->frequency_penalty == 0.0f && r->p.n_logit_bias == 0 && r->p.logprobs < 0 && r->p.prompt_logprobs < 0 &&
           s->n_generated >= r->p.min_tokens && !c->device_greedy;
}

/* The tokens that followed the latest earlier occurrence of s's last n tokens (n from spec_ngram
 * down to 2), at most max of them, into out; their count. */
static int lookup_draft(const struct seq *s, int ngram, int max, int32_t *out)
{
    const int32_t *t = s->tokens;
    const int n_tok = s->n_tokens;
    for (int n = ngram; n >= 2; n--) {
        if (n_tok <= n) continue;
        const int32_t *tail = t + n_tok - n;
        for (int at = n_tok - n - 1; at >= 0; at--) {
            if (memcmp(t + at, tail, (size_t)n * sizeof *t)) continue;
            int k = 0;
            while (k < max && at + n + k < n_tok) out[k] = t[at + n + k], k++;
            if (k > 0) return k;
        }
    }
    return 0;
}

/* Before planning: every sequence's drafts of the last step are gone (take_results consumed the
 * verified ones); each eligible sequence appends new ones, within a budget of logits rows and
 * batch rows that leaves the other sequences theirs. */
void speculate(struct conductor *c)
{
    struct scheduler *sc = &c->sched;
    for (int i = 0; i < sc->n_running; i++) {
        struct seq *s = sc->running[i];
        s->n_tokens -= s->n_draft;
        s->n_draft = 0;
    }
    if (c->o.spec_draft <= 0 || sc->n_running > (c->o.spec_max_batch > 0 ? c->o.spec_max_batch : 4)) return;
    int budget = c->max_logits - 64 - sc->n_running, rows = c->o.max_batch_tokens - sc->n_running;
    if (rows < budget) budget = rows;
    const int ngram = c->o.spec_ngram > 0 ? c->o.spec_ngram : 3;
    for (int i = 0; i < sc->n_running && budget > 0; i++) {
        struct seq *s = sc->running[i];
        if (!can_draft(c, s)) continue;
        const struct request *r = s->req;
        int max = c->o.spec_draft < budget ? c->o.spec_draft : budget;
        const int left = r->p.max_tokens - s->n_generated - 1, room = c->m->cfg.max_positions - s->n_tokens - 1;
        if (max > left) max = left;
        if (max > room) max = room;
        if (max <= 0) continue;
        int k = lookup_draft(s, ngram, max, s->tokens + s->n_tokens); /* room: n_prompt + max_tokens + 1 */
        s->n_tokens += k;
        s->n_draft = k;
        budget -= k;
    }
}

/* s ran its real token and n_ver of its drafts (rows row[0 .. n_ver]): the drafts the target's
 * own greedy choice confirms are taken in order, then the target's token after the last of them;
 * the KV of rejected drafts is left behind (their positions are written again). Returns after
 * finishing s when a token ends it. */
void take_drafted(struct conductor *c, struct seq *s, const float *rows, int n_ver)
{
    struct request *r = s->req;
    const int V = c->m->cfg.vocab_size, eos = conductor_eos_id(c);
    const int real_end = s->n_tokens - s->n_draft;
    int32_t draft[64];
    const int n_draft = s->n_draft < 64 ? s->n_draft : 64;
    memcpy(draft, s->tokens + real_end, (size_t)n_draft * sizeof *draft);
    s->n_tokens = real_end;
    s->n_draft = 0;
    int n_accepted = 0;
    for (int i = 0; i <= n_ver; i++) {
        const float *row = rows + (size_t)i * V;
        if (!sampler_logits_finite(row, V)) {
            finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INTERNAL,
                       "the model produced NaN or Inf logits for this sequence; no token was sampled", 0);
            break;
        }
        float *lg = c->scratch + V;
        memcpy(lg, row, (size_t)V * sizeof *lg);
        struct sampling_params sp = r->p.sampling;
        const int32_t tok = sampler_sample(&c->smp, &sp, &s->rng, lg, r->prompt, r->n_prompt, s->tokens + r->n_prompt,
                                           s->n_generated);
        const int accepted = i < n_ver && tok == draft[i];
        n_accepted += accepted;
        size_t text_len = 0;
        enum finish_reason why = request_take_token(s, tok, eos, c->m->cfg.max_positions, NULL, NULL, 0, &text_len);
        if (why == FINISH_REASON_ERROR) {
            finish_seq(c, s, why, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
            break;
        }
        if (why != FINISH_REASON_NONE) {
            finish_seq(c, s, why, STATUS_OK, NULL, text_len);
            break;
        }
        if (!accepted) break; /* the target's token replaces the draft; the rest are dropped */
    }
    pthread_mutex_lock(&c->mu);
    c->stats.spec_drafted += (uint64_t)n_ver;
    c->stats.spec_accepted += (uint64_t)n_accepted;
    pthread_mutex_unlock(&c->mu);
}
