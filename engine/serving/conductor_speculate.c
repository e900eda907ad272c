/* engine/serving/conductor_speculate.c - prompt-lookup speculative decoding (docs/speculative.md):
 * drafting before a step (speculate), taking the verified drafts after it (take_drafted), and the
 * per-sequence adaptive rule that sets the draft length and backs a sequence off when its drafts
 * are rarely accepted. Not here: how a row's token is sampled (conductor_sample.c take_token,
 * sampler.c), how draft rows are planned and committed (scheduler.c plan_rows / logit_rows).
 * Tests: tests/server/test_speculative.py (greedy equality, opt-out),
 * tests/server/test_speculative_sampling.py (the sampled distribution, chi-square).
 *
 * Why sampled requests keep their distribution exactly. A prompt-lookup draft d is deterministic:
 * its draft distribution q is one-hot on d. Leviathan et al. / Chen et al.'s rule then reads:
 * accept d with probability min(1, p(d) / q(d)) = p(d); on rejection, sample from
 * max(0, p - q) renormalised, which is p with d removed and renormalised. take_drafted realises
 * that rule by sampling the target's token t from p (take_token: every sampling control, from the
 * row's logits and the tokens taken so far) and accepting d exactly when t == d:
 * P(accept) = p(d), and given a rejection t is distributed as p(x) / (1 - p(d)) over x != d. So
 * every token is drawn from the target's distribution with the one uniform the non-speculative
 * path would draw for it, in the same order: the random stream a sample consumes does not depend
 * on drafting, and a seeded sample equals its non-speculative self whenever the logits do (the
 * f32 / bf16 paths, whose rows do not depend on the rest of the batch). A draft model with a
 * non-degenerate q would need the general rule and its extra draws; prompt lookup does not. */
#include "conductor_impl.h"

#include <string.h>

/* The adaptive rule's constants (docs/speculative.md). */
#define SPEC_MAX_DRAFT      32  /* --spec-draft's and speculative_n_max's upper bound */
#define SPEC_WINDOW         16  /* drafts verified before a sequence's acceptance is judged */
#define SPEC_MIN_ACCEPT_DEN 4   /* below 1/4 of them accepted: back off */
#define SPEC_BACKOFF_FIRST  16  /* generated tokens without drafting, the first time */
#define SPEC_BACKOFF_MAX    256 /* each consecutive backoff doubles, up to this */

/* Whether s may draft this step: decoding (one real token pending), not constrained, not opted
 * out, not on the device-greedy path (its argmax comes from the device, one row per sequence),
 * and past its prompt log-probabilities. Sampling controls, penalties, logit bias, min_tokens and
 * log-probabilities are all honoured row by row by take_token, so they do not matter here. */
static int can_draft(const struct conductor *c, const struct seq *s)
{
    const struct request *r = s->req;
    return s->state == SEQ_RUNNING && s->n_generated >= 1 && s->n_cached == s->n_tokens - 1 && !r->grammar &&
           r->p.speculative != SPECULATIVE_MODE_OFF && (r->p.prompt_logprobs < 0 || r->prompt_lp_sent) &&
           !c->device_greedy;
}

/* The most drafts a step of r's samples may verify: the server's --spec-draft, lowered by the
 * request's speculative_n_max. */
static int draft_limit(const struct conductor *c, const struct request *r)
{
    int k = c->o.spec_draft;
    if (r->p.speculative_n_max > 0 && r->p.speculative_n_max < k) k = r->p.speculative_n_max;
    return k < SPEC_MAX_DRAFT ? k : SPEC_MAX_DRAFT;
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
 * verified ones); each eligible sequence that is not backing off appends new ones, up to its
 * adaptive length, within a budget of logits rows and batch rows that leaves the other sequences
 * theirs. */
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
        if (!can_draft(c, s) || s->n_generated < s->spec_resume_at) continue;
        const struct request *r = s->req;
        const int limit = draft_limit(c, r);
        if (s->spec_len <= 0 || s->spec_len > limit) s->spec_len = limit;
        int max = s->spec_len < budget ? s->spec_len : budget;
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

/* The adaptive rule, after s verified n_ver drafts and accepted n_accepted of them. The length
 * follows Hugging Face's assisted-generation heuristic: +2 when every draft was accepted, else
 * -1, within [1, limit]. Every SPEC_WINDOW verified drafts the window's acceptance is judged:
 * below 1 / SPEC_MIN_ACCEPT_DEN the sequence stops drafting for a backoff of generated tokens
 * (SPEC_BACKOFF_FIRST, doubling while consecutive windows stay low, up to SPEC_BACKOFF_MAX) and
 * then tries again at the full length; a window at or above it resets the backoff. Returns 1
 * when s began a backoff. Reads and writes only s's own fields (s may have finished). */
static int adapt(struct seq *s, int limit, int n_ver, int n_accepted)
{
    if (n_ver <= 0) return 0;
    s->spec_len = n_accepted == n_ver ? s->spec_len + 2 : s->spec_len - 1;
    if (s->spec_len > limit) s->spec_len = limit;
    if (s->spec_len < 1) s->spec_len = 1;
    s->spec_win_drafted += n_ver;
    s->spec_win_accepted += n_accepted;
    if (s->spec_win_drafted < SPEC_WINDOW) return 0;
    const int low = s->spec_win_accepted * SPEC_MIN_ACCEPT_DEN < s->spec_win_drafted;
    s->spec_win_drafted = s->spec_win_accepted = 0;
    if (!low) {
        s->spec_backoff = 0;
        return 0;
    }
    s->spec_backoff = s->spec_backoff ? 2 * s->spec_backoff : SPEC_BACKOFF_FIRST;
    if (s->spec_backoff > SPEC_BACKOFF_MAX) s->spec_backoff = SPEC_BACKOFF_MAX;
    s->spec_resume_at = s->n_generated + s->spec_backoff;
    s->spec_len = limit;
    return 1;
}

/* s ran its real token and n_ver of its drafts (rows row[0 .. n_ver]). Row by row the target's
 * token is sampled exactly as a plain decode step samples it (take_token: the same controls, the
 * same random stream, the target's log-probabilities); while it equals the draft the draft is
 * accepted, the first row where it differs gives the target's token instead and the drafts after
 * it are dropped, and when every verified draft is accepted the last row gives one more token
 * (see the file comment for why this is the rejection-sampling rule). The KV of rejected drafts
 * is left behind (their positions are written again). Returns after finishing s when a token
 * ends it. */
void take_drafted(struct conductor *c, struct seq *s, const float *rows, int n_ver)
{
    const int V = c->m->cfg.vocab_size;
    const int limit = draft_limit(c, s->req);
    const int real_end = s->n_tokens - s->n_draft;
    int32_t draft[SPEC_MAX_DRAFT];
    const int n_draft = s->n_draft < SPEC_MAX_DRAFT ? s->n_draft : SPEC_MAX_DRAFT;
    memcpy(draft, s->tokens + real_end, (size_t)n_draft * sizeof *draft);
    if (n_ver > n_draft) n_ver = n_draft;
    s->n_tokens = real_end;
    s->n_draft = 0;
    int n_accepted = 0;
    for (int i = 0; i <= n_ver; i++) {
        const int32_t tok = take_token(c, s, rows + (size_t)i * V, -1);
        const int accepted = i < n_ver && tok == draft[i];
        n_accepted += accepted;
        if (s->state != SEQ_RUNNING || !accepted) break; /* finished, or the target's token replaced the draft */
    }
    const int backoff = adapt(s, limit, n_ver, n_accepted);
    pthread_mutex_lock(&c->mu);
    c->stats.spec_drafted += (uint64_t)n_ver;
    c->stats.spec_accepted += (uint64_t)n_accepted;
    c->stats.spec_backoffs += (uint64_t)backoff;
    pthread_mutex_unlock(&c->mu);
}
