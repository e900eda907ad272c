/* engine/serving/conductor_sample.c - the conductor's tokens: sampling the next token of a
 * sequence from its logits row (penalties, bias, a structured-output constraint's mask) and
 * prompt log-probabilities. The step that calls them: conductor.c; speculative decoding, which
 * takes its verified drafts through take_token row by row: conductor_speculate.c.
 * Tests: tests/test_engine.c, tests/server/test_structured.py, tests/server/test_speculative*.py. */
#include "conductor_impl.h"

#include <math.h>
#include <string.h>

#include "constraint.h"
#include "grammar.h"
#include "tokenizer.h"

static int32_t take_with(struct conductor *c, struct seq *s, int32_t tok, const float *tok_lp,
                         const struct top_logprob *top, int n_top);

/* ---- sampling a token and its consequences ------------------------------------------------ */

int constraint_mask(struct conductor *c, struct seq *s, float *lg)
{
    const int V = c->m->cfg.vocab_size;
    const int got = constraint_fill_mask(s, c->gmask);
    if (got <= 0) return got < 0 ? got : 1; /* (0: lazy, before its trigger: free) */
    int any = 0;
    for (int i = 0; i < V; i++) {
        if (c->gmask[i >> 5] >> (i & 31) & 1) any |= lg[i] > -INFINITY;
        else lg[i] = -INFINITY;
    }
    return any;
}

int constrain(struct conductor *c, struct seq *s, float *lg)
{
    const int got = constraint_mask(c, s, lg);
    if (got < 0) /* -2: the grammar too ambiguous to follow (the request's fault); -1: out of memory */
        finish_seq(c, s, FINISH_REASON_ERROR, got == -2 ? STATUS_INVALID_ARGUMENT : STATUS_RESOURCE_EXHAUSTED,
                   status_message(), 0);
    if (got == 0)
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INVALID_ARGUMENT,
                   "constraint: no token the model may produce continues the output (the constraint needs a token "
                   "banned here, or its end needs EOS before min_tokens)", 0);
    return got > 0;
}

/* ---- lazy constraints (tool calls under tool_choice auto) -------------------------------------- */

void conductor_lazy_setup(struct conductor *c, struct request *r, const struct request_params *p)
{
    size_t n = p->constraint_trigger_len;
    r->think_ids[0] = r->think_ids[1] = -1;
    r->n_markers = 0;
    if (!n || !r->grammar) return; /* (conductor_compile_constraint refuses a trigger without one) */
    int flags = 0;
    const size_t skip = (size_t)engine_trigger_read(p->constraint, n, &flags); /* (checked by
                                                                                conductor_compile_constraint) */
    r->trigger_flags = flags;
    constraint_set_markers(r, p->constraint + skip, n - skip);
    for (int k = 0; k < r->n_markers; k++) r->marker_id[k] = tokenizer_piece_to_id(c->tok, r->trigger + r->marker_off[k]);
    for (int i = 0; i < 2; i++) {
        r->think[i] = engine_reasoning_marker(r->trigger_flags >> TRIGGER_MARKERS_SHIFT, i);
        r->think_len[i] = (int)strlen(r->think[i]);
        if (r->trigger_flags & (TRIGGER_MAY_REASON | TRIGGER_IN_REASONING))
            r->think_ids[i] = tokenizer_piece_to_id(c->tok, r->think[i]);
    }
}

/* Samples the next token of s from the logits row, then emits it and finishes the sample when a
 * stop condition holds. A row holding NaN or Inf (a numerical overflow, or weights that went bad
 * after the load-time check) ends the sample with an error instead of a made-up token. Returns
 * the token taken (s may have finished with it: s->state says), or -1 when none was. Draws from
 * s->rng exactly what sampler_sample draws: one number when temperature > 0, none when greedy. */
int32_t take_token(struct conductor *c, struct seq *s, const float *row, int32_t greedy_id)
{
    const int eos = conductor_eos_id(c);
    if (greedy_id >= 0 && s->req->grammar) return take_chosen(c, s, row, greedy_id); /* its constraint takes it too */
    if (greedy_id >= 0) { /* picked on the device (step_device_sampling); every logit was finite */
        size_t text_len = 0;
        enum finish_reason why = request_take_token(s, greedy_id, eos, c->m->cfg.max_positions, NULL, NULL, 0, &text_len);
        if (why == FINISH_REASON_ERROR) finish_seq(c, s, why, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
        else if (why != FINISH_REASON_NONE) finish_seq(c, s, why, STATUS_OK, NULL, text_len);
        return greedy_id;
    }
    const int32_t tok = sample_token(c, s, row);
    return tok < 0 ? -1 : take_chosen(c, s, row, tok);
}

int32_t sample_token(struct conductor *c, struct seq *s, const float *row)
{
    const struct request *r = s->req;
    const int V = c->m->cfg.vocab_size;
    if (!sampler_logits_finite(row, V)) {
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INTERNAL,
                   "the model produced NaN or Inf logits for this sequence; no token was sampled", 0);
        return -1;
    }
    if (r->p.max_tokens == 0) { /* scoring only */
        finish_seq(c, s, FINISH_REASON_LENGTH, STATUS_OK, NULL, 0);
        return -1;
    }
    float *lg = c->scratch + V;
    sampling_logits(c, s, row, s->n_generated, lg);
    if (r->grammar && !constrain(c, s, lg)) return -1;
    struct sampling_params sp = r->p.sampling;
    return sampler_sample(&c->smp, &sp, &s->rng, lg, r->prompt, r->n_prompt, s->tokens + r->n_prompt,
                          s->n_generated);
}

int row_alone(const struct seq *s)
{
    const struct request *r = s->req;
    const int forks = s->sample == 0 && !r->forked && r->p.n > 1; /* its row gives every sample's first token */
    return !forks && r->p.max_tokens > 0 &&
           r->p.sampling.repetition_penalty > 0.0f; /* (op_logit_edit's rep > 0) */
}

int seq_edited(const struct seq *s)
{
    const struct request *r = s->req;
    return r->p.n_logit_bias > 0 || s->n_generated < r->p.min_tokens || sampler_penalised(&r->p.sampling);
}

int top_eligible(const struct conductor *c, const struct seq *s)
{
    const struct request *r = s->req;
    const struct sampling_params sp = sampler_unpenalised(&r->p.sampling); /* (edited on the device) */
    const int picks = sp.temperature == 0.0f || sampler_top_exact(&sp, c->top_k) || sampler_nucleus_fits(&sp) ||
                      sampler_draw_fits(&sp);
    /* log-probabilities are the raw logits': from the candidates and op_logit_lse, on a row left as it came */
    const int lp = r->p.logprobs < 0 || (!seq_edited(s) && !r->grammar && r->p.logprobs <= c->top_k);
    return row_alone(s) && picks && lp;
}

/* take_token's path for a row edited on the device (op_logit_edit, op_logit_mask) and fetched
 * whole: its bias, bans, penalties and constraint's mask are in it already. */
static int32_t take_edited(struct conductor *c, struct seq *s, const float *row)
{
    const int V = c->m->cfg.vocab_size;
    float *lg = c->scratch + V;
    memcpy(lg, row, (size_t)V * sizeof *lg);
    struct sampling_params sp = sampler_unpenalised(&s->req->p.sampling);
    return take_chosen(c, s, row, sampler_sample(&c->smp, &sp, &s->rng, lg, NULL, 0, NULL, 0));
}

int32_t take_top(struct conductor *c, struct seq *s, int lrow)
{
    const size_t K = (size_t)c->top_k;
    struct sampling_params sp = sampler_unpenalised(&s->req->p.sampling); /* (edited on the device) */
    const float *values = c->top_values + (size_t)lrow * K;
    const int32_t *ids = c->top_ids + (size_t)lrow * K;
    const int draw = sp.temperature != 0.0f && !sampler_top_exact(&sp, c->top_k) &&
                     !sampler_nucleus_fits(&sp); /* (sampler_draw_fits) */
    /* the device's draw (plain temperature, or a nucleus past the candidates), where it asked for one */
    const int drawn = c->step_draw && c->draw_temp[lrow] > 0.0f && c->draw_ids[lrow] >= 0 &&
                      c->draw_margin[lrow] >= c->draw_tol;
    int32_t tok = -1;
    if (sp.temperature == 0.0f) /* greedy, top_eligible for its log-probabilities */
        tok = ids[0];
    else if (sampler_top_exact(&sp, c->top_k))
        tok = sampler_sample_top(&c->top_smp, &sp, &s->rng, values, ids, c->top_k, c->top_lg, c->top_tok);
    else if (!draw && (tok = sampler_sample_nucleus(&sp, &s->rng, values, ids, c->top_k, c->top_mass[lrow],
                                                    c->top_lg)) < 0 && drawn) {
        tok = c->draw_ids[lrow]; /* (sampler_sample_nucleus drew nothing from s->rng) */
        s->rng = c->draw_rng[lrow];
        if (!c->nucleus_used) {
            c->nucleus_used = 1;
            LOG_INFO(MODULE, "a top_p nucleus reaching past the device's top %d logits was drawn on the device "
                             "(margin at least %g; not the whole row)", c->top_k, c->draw_tol);
        }
    } else if (draw && drawn) {
        tok = c->draw_ids[lrow];
        s->rng = c->draw_rng[lrow]; /* the uniform it drew is spent */
    }
    int *said = draw ? (tok < 0 ? &c->draw_fetched : &c->draw_used) : (tok < 0 ? &c->top_fetched : &c->top_used);
    if (!*said) {
        *said = 1;
        if (!draw) LOG_INFO(MODULE, tok < 0 ? "a sampled row's nucleus reached past the device's top %d logits: its whole "
                                              "row was fetched" : "a sampled row drew from the device's top %d logits (not "
                                              "the whole row)", c->top_k);
        else LOG_INFO(MODULE, tok < 0 ? "a plain temperature draw on the device landed within %g of its token's edge: "
                                        "its whole row was fetched" : "a plain temperature row was drawn on the device "
                                        "(margin at least %g; not the whole row)", c->draw_tol);
    }
    if (tok < 0) { /* the device could not decide it: the whole row, still on the device */
        const size_t V = (size_t)c->m->cfg.vocab_size;
        float *row = c->logits + (size_t)lrow * V;
        const enum status st = model_logits_row(c->m, lrow, row);
        if (st != STATUS_OK) {
            finish_seq(c, s, FINISH_REASON_ERROR, st, status_message(), 0);
            return -1;
        }
        return seq_edited(s) || s->req->grammar ? take_edited(c, s, row) : take_token(c, s, row, -1);
    }
    const struct request *r = s->req;
    if (r->p.logprobs < 0) return take_chosen(c, s, NULL, tok);
    if (!c->lse_used) {
        c->lse_used = 1;
        LOG_INFO(MODULE, "log-probabilities from the device's top %d logits and the row's normaliser (not the "
                         "whole row)", c->top_k);
    }
    /* The raw row's log-probabilities, (x - max) - lse, from the candidates, op_logit_lse and, for a
     * drawn token outside the candidates, its own logit from the device */
    const float top = values[0], lse = c->top_lse[lrow];
    float x = 0.0f;
    int at = 0;
    while (at < c->top_k && ids[at] != tok) at++;
    if (at < c->top_k) x = values[at];
    else {
        const enum status st = model_logit_at(c->m, lrow, tok, &x);
        if (st != STATUS_OK) {
            finish_seq(c, s, FINISH_REASON_ERROR, st, status_message(), 0);
            return -1;
        }
    }
    const float tok_lp = (x - top) - lse;
    struct top_logprob best[REQUEST_MAX_TOP_LOGPROBS];
    const int n_top = r->p.logprobs;
    for (int i = 0; i < n_top; i++) best[i] = (struct top_logprob){.id = ids[i], .logprob = (values[i] - top) - lse};
    return take_with(c, s, tok, &tok_lp, best, n_top);
}

void sampling_logits(struct conductor *c, const struct seq *s, const float *row, int n_generated, float *lg)
{
    const struct request *r = s->req;
    memcpy(lg, row, (size_t)c->m->cfg.vocab_size * sizeof *lg);
    for (int i = 0; i < r->p.n_logit_bias; i++) lg[r->bias_ids[i]] += r->bias_values[i];
    for (int i = 0, n = ban_slots(s, n_generated); i < n; i++) { /* too early to stop */
        const int32_t id = ban_id(c, s, i);
        if (id >= 0) lg[id] = -INFINITY;
    }
}

int ban_slots(const struct seq *s, int n_generated)
{
    const struct request *r = s->req;
    return n_generated < r->p.min_tokens ? 1 + r->p.n_stop_token_ids + r->p.n_end_ids : 0;
}

int32_t ban_id(const struct conductor *c, const struct seq *s, int slot)
{
    const struct request *r = s->req;
    if (slot == 0) return r->p.ignore_eos ? -1 : conductor_eos_id(c);
    if (--slot < r->p.n_stop_token_ids) return r->stop_ids[slot];
    return r->p.ignore_eos ? -1 : r->p.end_ids[slot - r->p.n_stop_token_ids];
}

/* take_chosen's taking, with tok's log-probability and the top ones (top_lp NULL: none asked). */
static int32_t take_with(struct conductor *c, struct seq *s, int32_t tok, const float *tok_lp,
                         const struct top_logprob *top, int n_top)
{
    struct request *r = s->req;
    enum status taken = r->grammar ? constraint_take(s, tok) : STATUS_OK;
    if (taken != STATUS_OK) { /* out of memory starting a lazy call, or a grammar too ambiguous to follow */
        finish_seq(c, s, FINISH_REASON_ERROR, taken, status_message(), 0);
        return -1;
    }
    size_t text_len = 0;
    enum finish_reason why = request_take_token(s, tok, conductor_eos_id(c), c->m->cfg.max_positions, tok_lp, top,
                                                n_top, &text_len);
    if (why == FINISH_REASON_ERROR) finish_seq(c, s, why, STATUS_RESOURCE_EXHAUSTED, status_message(), 0);
    else if (why != FINISH_REASON_NONE) finish_seq(c, s, why, STATUS_OK, NULL, text_len);
    return tok;
}

int32_t take_chosen(struct conductor *c, struct seq *s, const float *row, int32_t tok)
{
    const struct request *r = s->req;
    const int V = c->m->cfg.vocab_size;
    float *lp = c->scratch;
    /* Log-probabilities are those of the model's distribution (the raw logits). */
    float tok_lp = 0.0f;
    struct top_logprob top[REQUEST_MAX_TOP_LOGPROBS]; /* (engine_create refuses a larger max_logprobs) */
    int n_top = r->p.logprobs > 0 ? r->p.logprobs : 0;
    if (r->p.logprobs >= 0) {
        sampler_log_softmax(row, lp, V);
        tok_lp = lp[tok];
        if (n_top) sampler_top_logprobs(lp, V, n_top, top);
    }
    return take_with(c, s, tok, r->p.logprobs >= 0 ? &tok_lp : NULL, top, n_top);
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
