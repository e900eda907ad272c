/* engine/serving/conductor_device.c - what a planned step asks the device for beside its logits, so
 * that its sampled rows need not come to the host: the step's grade (argmax, top candidates, or
 * whole rows), the edits of single logits (a logit bias, banned ids, penalties) and constraint
 * masks made there first, and each row's mass, draw or log-probabilities' normaliser. The forward
 * pass that carries them: conductor_ranks.c run_forward, engine/model/device_sampling.c (in one
 * upload and one download); the tokens taken from them: conductor_sample.c take_top.
 * Tests: tests/server/test_device_sampling.py, tests/test_sampler.c, tools/gpu_paths.sh. */
#include "conductor_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "constraint.h"

/* How the planned step's logits rows may stay on the device: 2 when every sampled row is an argmax
 * (greedy, no log-probabilities, row_alone; a logit bias, banned ids and penalties are edited in on
 * the device, a constraint's mask applied there: step_edits, step_masks), so the device picks the
 * tokens; 1 when every sampled row is that or top_eligible (sampled, or with log-probabilities), so
 * the device sends each row's top candidates; 0 when some row needs its whole row on the host. */
static int step_device_sampling(const struct conductor *c)
{
    const struct scheduler *sc = &c->sched;
    int mode = 2;
    for (int i = 0; i < sc->n_running && mode; i++) {
        const struct seq *s = sc->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING) continue;
        const struct request *r = s->req;
        const struct sampling_params *sp = &r->p.sampling;
        if (r->p.prompt_logprobs >= 0) return 0;
        if (!s->wants_sample) continue;
        if (!row_alone(s)) return 0;
        if (sp->temperature != 0.0f || r->p.logprobs >= 0) mode = top_eligible(c, s) ? 1 : 0;
    }
    return mode;
}

/* What each sampled logits row of a step of top candidates asks the device for beside them: a
 * row that sampler_sample_nucleus draws (top_p or min_p without top_k) its mass at inverse
 * temperature 1 / T (c->top_inv_temp; 0 for the others), a plain temperature row its draw
 * (c->draw_temp, and the uniform its random state would give next: c->draw_u, c->draw_rng; 0 for
 * the others), a top_p row without min_p both its mass and its nucleus's draw (c->draw_top_p, 1
 * for the others), a row with log-probabilities its normaliser (c->lse_want). Sets step_mass,
 * step_draw and step_lse: whether any row wants each. (In a step of top
 * candidates no row is a prompt log-probability's or a draft's: a sequence's sampled row is its
 * logit_row.) */
static void top_requests(struct conductor *c)
{
    const struct scheduler *sc = &c->sched;
    c->step_mass = c->step_draw = c->step_lse = 0;
    for (int i = 0; i < sc->batch.n_logits; i++)
        c->top_inv_temp[i] = c->draw_temp[i] = c->draw_u[i] = c->lse_want[i] = 0.0f, c->draw_top_p[i] = 1.0f;
    for (int i = 0; i < sc->n_running; i++) {
        const struct seq *s = sc->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING || !s->wants_sample) continue;
        const struct sampling_params sp = sampler_unpenalised(&s->req->p.sampling); /* (edited on the device) */
        const int row = s->logit_row;
        if (s->req->p.logprobs >= 0) c->lse_want[row] = 1.0f, c->step_lse = 1;
        if (sampler_nucleus_fits(&sp)) {
            c->top_inv_temp[row] = 1.0f / sp.temperature;
            c->step_mass = 1;
        }
        if (sampler_draw_fits(&sp) || (sampler_nucleus_fits(&sp) && sp.min_p == 0.0f)) {
            c->draw_top_p[row] = sp.top_p;
            c->draw_rng[row] = s->rng;
            c->draw_u[row] = rng_uniform(&c->draw_rng[row]);
            c->draw_temp[row] = sp.temperature;
            c->step_draw = 1;
        }
    }
}

/* Grows the array at *arr (void **, as &c->edit_rows) to n entries of size bytes: 0 when out of
 * memory (*arr kept as it was). */
static int grow(void *arr, size_t n, size_t size)
{
    void *old;
    memcpy(&old, arr, sizeof old);
    void *p = realloc(old, n * size);
    if (p) memcpy(arr, &p, sizeof p);
    return p != NULL;
}

/* The entry of token id in the row being built (row_edits): found through c->edit_at, or a new one
 * that changes nothing yet (add 0, rep 1, sub 0). -1 when out of memory. */
static int edit_of(struct conductor *c, int row, int32_t id)
{
    if (c->edit_at[id] >= 0) return c->edit_at[id];
    if (c->n_edits == c->edits_cap) {
        const size_t cap = c->edits_cap ? 2 * (size_t)c->edits_cap : 1024;
        if (!(grow(&c->edit_rows, cap, sizeof *c->edit_rows) & grow(&c->edit_ids, cap, sizeof *c->edit_ids) &
              grow(&c->edit_vals, 3 * cap, sizeof *c->edit_vals)))
            return -1;
        c->edits_cap = (int)cap;
    }
    const int e = c->n_edits++;
    c->edit_rows[e] = row, c->edit_ids[e] = id;
    c->edit_vals[3 * e] = 0.0f, c->edit_vals[3 * e + 1] = 1.0f, c->edit_vals[3 * e + 2] = 0.0f;
    c->edit_at[id] = e;
    return e;
}

/* Appends the edits of s's logits row (row) as the host would make them: sampling_logits' logit
 * bias and the ids banned before min_tokens (-inf), then the sampler's penalties (apply_penalties:
 * repetition over the distinct tokens of prompt and output, presence and frequency over the
 * output's, each count in f32 as there), one entry per token. Returns 0 when out of memory. */
static int row_edits(struct conductor *c, const struct seq *s, int row)
{
    const struct request *r = s->req;
    const struct sampling_params *p = &r->p.sampling;
    const int V = c->m->cfg.vocab_size, first = c->n_edits;
    const int32_t *out = s->tokens + r->n_prompt;
    int ok = 1;
    for (int i = 0; i < r->p.n_logit_bias && ok; i++) {
        const int e = edit_of(c, row, r->bias_ids[i]);
        if ((ok = e >= 0)) c->edit_vals[3 * e] = r->bias_values[i];
    }
    for (int i = 0, n = ban_slots(s, s->n_generated); i < n && ok; i++) {
        const int32_t id = ban_id(c, s, i);
        if (id < 0) continue;
        const int e = edit_of(c, row, id);
        if ((ok = e >= 0)) c->edit_vals[3 * e] = -INFINITY;
    }
    if (p->repetition_penalty != 1.0f)
        for (int pass = 0; pass < 2 && ok; pass++) {
            const int32_t *ids = pass ? out : r->prompt;
            const int n = pass ? s->n_generated : r->n_prompt;
            for (int i = 0; i < n && ok; i++) {
                if (ids[i] < 0 || ids[i] >= V) continue;
                const int e = edit_of(c, row, ids[i]);
                if ((ok = e >= 0)) c->edit_vals[3 * e + 1] = p->repetition_penalty;
            }
        }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int i = 0; i < s->n_generated && ok; i++) {
            if (out[i] < 0 || out[i] >= V) continue;
            const int e = edit_of(c, row, out[i]);
            if ((ok = e >= 0)) c->edit_vals[3 * e + 2] += 1.0f; /* the count first (exact below 2^24) */
        }
        for (int e = first; e < c->n_edits && ok; e++) {
            const float count = c->edit_vals[3 * e + 2];
            if (count > 0.0f) c->edit_vals[3 * e + 2] = p->presence_penalty + p->frequency_penalty * count;
        }
    }
    for (int e = first; e < c->n_edits; e++) c->edit_at[c->edit_ids[e]] = -1;
    return ok;
}

/* The step's edits (c->n_edits): every sampled row of a sequence that needs them (seq_edited).
 * Returns 0 when out of memory (the step then downloads its rows). */
static int step_edits(struct conductor *c)
{
    const struct scheduler *sc = &c->sched;
    c->n_edits = 0;
    for (int i = 0; i < sc->n_running; i++) {
        const struct seq *s = sc->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING || !s->wants_sample || !seq_edited(s)) continue;
        if (!row_edits(c, s, s->logit_row)) {
            c->n_edits = 0;
            return 0;
        }
    }
    if (c->n_edits && !c->edits_used) {
        c->edits_used = 1;
        LOG_INFO(MODULE, "a logit bias, banned ids or penalties were applied on the device (%d edits in a step)",
                 c->n_edits);
    }
    return 1;
}

/* Whether id is banned from s's next token (ban_slots). */
static int banned(const struct conductor *c, const struct seq *s, int32_t id)
{
    for (int i = 0, n = ban_slots(s, s->n_generated); i < n; i++)
        if (ban_id(c, s, i) == id) return 1;
    return 0;
}

/* The step's constraint masks (c->n_masks): every sampled row of a constrained sequence whose
 * constraint masks this token (constraint_fill_mask; a lazy one before its trigger does not).
 * Returns 0 when the step must sample on the host instead, which then reports what went wrong: a
 * mask failed (the grammar too ambiguous, memory), or it allows no token that is not banned
 * (constraint_mask's "no token continues": the logits are finite, a bias is, so a token is out
 * only where it is banned). */
static int step_masks(struct conductor *c)
{
    const struct scheduler *sc = &c->sched;
    const int V = c->m->cfg.vocab_size, words = (V + 31) / 32;
    c->n_masks = 0;
    for (int i = 0; i < sc->n_running; i++) {
        struct seq *s = sc->running[i];
        if (s->n_rows == 0 || s->state != SEQ_RUNNING || !s->wants_sample || !s->req->grammar) continue;
        if (c->n_masks == c->masks_cap) {
            const int cap = c->masks_cap ? 2 * c->masks_cap : 8;
            if (!(grow(&c->mask_rows, (size_t)cap, sizeof *c->mask_rows) &
                  grow(&c->masks, (size_t)cap * (size_t)words, sizeof *c->masks)))
                return 0;
            c->masks_cap = cap;
        }
        uint32_t *mask = c->masks + (size_t)c->n_masks * (size_t)words;
        memset(mask, 0, (size_t)words * sizeof *mask);
        const int got = constraint_fill_mask(s, mask);
        if (got < 0) return 0;
        if (got == 0) continue; /* free this token */
        int any = 0;
        for (int w = 0; w < words && !any; w++)
            for (uint32_t m = mask[w]; m && !any; m &= m - 1) {
                const int32_t id = w * 32 + __builtin_ctz(m);
                any = id < V && !banned(c, s, id);
            }
        if (!any) return 0;
        c->mask_rows[c->n_masks++] = s->logit_row;
    }
    if (c->n_masks && !c->masks_used) {
        c->masks_used = 1;
        LOG_INFO(MODULE, "a constraint's mask was applied on the device (%d rows in a step)", c->n_masks);
    }
    return 1;
}

/* Step 3's device plan: the grade (step_greedy, step_top), the edits and masks, and what the top
 * candidates' rows ask for beside them; a step of several micro-batches (run_forward takes the
 * host's path then) or whose edits or masks cannot be made downloads its rows. */
void conductor_device_plan(struct conductor *c, int n_micro)
{
    int dev = c->device_greedy && n_micro == 1 ? step_device_sampling(c) : 0;
    c->n_edits = c->n_masks = 0;
    if (dev && (!step_edits(c) || !step_masks(c))) dev = 0, c->n_edits = c->n_masks = 0;
    c->step_greedy = dev > 0;
    c->step_top = dev == 1;
    c->step_mass = c->step_draw = c->step_lse = 0;
    if (c->step_top) top_requests(c);
}
