/* engine/serving/conductor_speculate.c - speculative decoding (docs/speculative.md) by prompt lookup
 * or with a draft model (draft.c runs its forwards; propose here samples its drafts):
 * drafting before a step (speculate), taking the verified drafts after it (take_drafted), and the
 * per-sequence adaptive rule that sets the draft length and backs a sequence off when its drafts
 * are rarely accepted. Not here: how a row's token is sampled (conductor_sample.c take_token,
 * sampler.c), how draft rows are planned and committed (scheduler.c plan_rows / logit_rows).
 * Tests: tests/server/test_speculative.py (greedy equality, opt-out),
 * tests/server/test_speculative_sampling.py (the sampled distribution, chi-square),
 * tests/server/test_speculative_draft.py (draft models: greedy equality, chi-square, refusals).
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
 * f32 / bf16 paths, whose rows do not depend on the rest of the batch). A draft model's sampled
 * drafts have a non-degenerate q: they are verified with the general rule (verify_sampled) and
 * its extra draws; its greedy drafts are one-hot and take the path above. */
#include "conductor_impl.h"

#include <stdlib.h>
#include <string.h>

#include "draft.h"
#include "grammar.h"
#include "spec_corpus.h"

/* The adaptive rule's constants (docs/speculative.md). */
#define SPEC_MAX_DRAFT      32  /* --spec-draft's and speculative_n_max's upper bound */
#define SPEC_WINDOW         16  /* drafts verified before a sequence's acceptance is judged */
#define SPEC_MIN_ACCEPT_DEN 4   /* below 1/4 of them accepted: back off */
#define SPEC_BACKOFF_FIRST  16  /* generated tokens without drafting, the first time */
#define SPEC_BACKOFF_MAX    256 /* each consecutive backoff doubles, up to this */
#define SPEC_PRIOR_MIN      32  /* drafts verified server-wide before the prior judges */
#define SPEC_PRIOR_HALVE    1024 /* the server-wide counts are halved beyond this (recent drafts weigh most) */
#define SPEC_GATE_MIN       16  /* the draft's proposals counted before draft_gate judges */
#define SPEC_GATE_PROBE     16  /* while the draft is gated, one opportunity in this many proposes */
#define SPEC_GATE_STALE     32  /* decode steps after which a batch size's plain step is timed again */
#define SPEC_GATE_PROBE_SHARE 64 /* while the draft is gated, its probes cost at most this share of the time */

/* Whether s may draft this step: decoding (one real token pending), not opted out, not on the
 * device-greedy path (its argmax comes from the device, one row per sequence), and past its
 * prompt log-probabilities. Sampling controls, penalties, logit bias, min_tokens,
 * log-probabilities and a structured-output constraint are all honoured row by row by take_token
 * (whose grammar matcher only ever advances by the tokens taken), so they do not matter here. */
static int can_draft(const struct conductor *c, const struct seq *s)
{
    const struct request *r = s->req;
    return s->state == SEQ_RUNNING && s->n_generated >= 1 && s->n_cached == s->n_tokens - 1 &&
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

/* The least probability a draft model's or head's best token must have for its chain to go on
 * (llama.cpp's p_min): the request's speculative_p_min when set, else the server's --spec-p-min. */
static float draft_p_min(const struct conductor *c, const struct request *r)
{
    return r->p.speculative_p_min >= 0.0f ? r->p.speculative_p_min : c->o.spec_p_min;
}

/* The tokens that followed the latest earlier occurrence of s's last n tokens (n from ngram down
 * to ngram_min), at most max of them, into out; their count. */
static int lookup_draft(const struct seq *s, int ngram, int ngram_min, int max, int32_t *out)
{
    const int32_t *t = s->tokens;
    const int n_tok = s->n_tokens;
    for (int n = ngram; n >= ngram_min; n--) {
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

/* The draft model's k-th draft of s (k from 0) from its logits row: shaped as the target's row of
 * that position will be (sampling_logits, the constraint's mask at the matcher's state after the
 * drafts before it, then the sampler's penalties and filters, with the drafts before it counted
 * as output), then the argmax when greedy, or a draw from that distribution q, which goes to q
 * (vocab) for verification. -1 when the constraint allows nothing. (draft_run has checked that
 * the row is finite: over the token map, -Inf elsewhere.) */
static int32_t draft_pick(struct conductor *c, struct seq *s, const float *row, int k, float *q)
{
    const struct request *r = s->req;
    const int V = c->m->cfg.vocab_size;
    float *lg = c->scratch + V;
    const int n_out = s->n_generated + k;
    const struct sampling_params *p = &r->p.sampling;
    /* A greedy row that nothing below would change (no logit bias, no min_tokens ban, no penalty,
     * no constraint): its argmax as it is, without the vocabulary-wide passes (q stays unused:
     * greedy drafts are one-hot). */
    if (p->temperature == 0.0f && !r->grammar && !r->p.n_logit_bias && n_out >= r->p.min_tokens &&
        p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f && p->frequency_penalty == 0.0f)
        return draft_argmax(&c->draft, row);
    sampling_logits(c, s, row, n_out, lg);
    if (r->grammar && constraint_mask(c, s, lg) <= 0) return -1;
    struct sampling_params sp = r->p.sampling;
    sampler_probs(&c->smp, &sp, lg, r->prompt, r->n_prompt, s->tokens + r->n_prompt, n_out, q);
    int32_t last = 0;
    double u = sp.temperature == 0.0f ? 0.0 : (double)rng_uniform(&s->rng), acc = 0.0;
    for (int i = 0; i < V; i++) {
        if (q[i] <= 0.0f) continue;
        last = i;
        acc += q[i];
        if (u < acc) return i;
    }
    return last;
}

/* A constrained s's grammar matcher over the drafts: advanced by each draft the draft model
 * picks (so that the next one is masked at the right state), and rolled back over all of them
 * once the step's drafts are made, so that verification starts from the state of the real
 * tokens and advances it only by the tokens it takes (take_chosen): rejected drafts never stay
 * in it. Returns 0 when the matcher refuses tok (then not advanced). *steps counts the advances. */
static int matcher_draft(struct seq *s, int32_t tok, int *steps)
{
    const struct request *r = s->req;
    if (!r->grammar || !s->gm || (r->p.constraint_trigger_len && !s->lazy_on)) return 1;
    if (grammar_matcher_accept(s->gm, tok) != STATUS_OK) return 0;
    ++*steps;
    return 1;
}

/* Undoes matcher_draft's advances of each ds[i] (gm_steps[i] of them). */
static void matcher_undraft(struct seq **ds, int *gm_steps, int n)
{
    for (int i = 0; i < n; i++)
        if (gm_steps[i]) grammar_matcher_rollback(ds[i]->gm, gm_steps[i]), gm_steps[i] = 0;
}

/* propose's drafts, with each sequence's matcher advances counted in gm_steps. */
static void propose_drafts(struct conductor *c, struct seq **ds, const int *want, int n, int *gm_steps)
{
    const size_t V = (size_t)c->m->cfg.vocab_size;
    const int kmax = c->o.spec_draft < SPEC_MAX_DRAFT ? c->o.spec_draft : SPEC_MAX_DRAFT;
    int stopped[DRAFT_MAX_SLOTS] = {0};
    for (;;) {
        struct seq *run[DRAFT_MAX_SLOTS];
        int idx[DRAFT_MAX_SLOTS], m = 0;
        for (int i = 0; i < n; i++)
            if (!stopped[i] && ds[i]->n_draft < want[i]) run[m] = ds[i], idx[m++] = i;
        if (m == 0) return;
        enum status st = draft_run(&c->draft, run, m);
        if (st != STATUS_OK) {
            LOG_WARN(MODULE, "draft model forward failed (%s); this step verifies no drafts", status_message());
            for (int i = 0; i < n; i++) {
                ds[i]->n_tokens -= ds[i]->n_draft;
                ds[i]->n_draft = 0;
                ds[i]->spec_q = NULL;
            }
            for (int k = 0; k < c->draft.n_slots; k++) c->draft.owner[k] = NULL;
            return;
        }
        for (int t = 0; t < m; t++) {
            struct seq *s = run[t];
            float *q = c->spec_q + ((size_t)idx[t] * (size_t)kmax + (size_t)s->n_draft) * V;
            const float *row = c->draft.logits + (size_t)t * V, p_min = draft_p_min(c, s->req);
            /* --spec-p-min: the chain ends where the draft is unsure, judged before any draw (a
             * stop that depended on the drawn token would bias verify_sampled's rule) */
            const int32_t tok = c->draft.row_ok[t] && (p_min <= 0.0f || draft_top_prob(&c->draft, row) >= p_min)
                                    ? draft_pick(c, s, row, s->n_draft, q)
                                    : -1;
            if (tok < 0 || !matcher_draft(s, tok, &gm_steps[idx[t]])) {
                stopped[idx[t]] = 1;
                continue;
            }
            if (s->req->p.sampling.temperature != 0.0f) s->spec_q = c->spec_q + (size_t)idx[t] * (size_t)kmax * V;
            s->tokens[s->n_tokens++] = tok;
            s->n_draft++;
        }
    }
}

/* The draft model proposes want[i] tokens for each ds[i], one batched draft forward per draft
 * position (the first also catches each slot up with the tokens the draft has not seen). A
 * sampled sequence's draft distributions go to c->spec_q (its row i of slots) and s->spec_q; a
 * greedy one's stay one-hot (NULL). A constrained sequence's drafts are masked by its grammar
 * (matcher_draft), whose matcher is back at the real tokens' state on return. A failed draft
 * forward drops every draft of the step and frees the slots (the target decodes as without
 * speculation). */
static void propose(struct conductor *c, struct seq **ds, const int *want, int n)
{
    int gm_steps[DRAFT_MAX_SLOTS] = {0};
    propose_drafts(c, ds, want, n, gm_steps);
    matcher_undraft(ds, gm_steps, n);
}

/* The server-wide prior of the adaptive rule: whether drafts verified lately, over every
 * sequence, were accepted below 1 / SPEC_MIN_ACCEPT_DEN (with at least SPEC_PRIOR_MIN of them).
 * A sequence's own window needs SPEC_WINDOW drafts before it backs off, which a short answer pays
 * at a weak draft's full cost (a draft model's forwards: 0.44x the speed without it, measured with
 * a weak trained draft of SmolLM2, docs/speculative.md); with the prior, a new sequence begins
 * with the current server-wide backoff instead, and drafts only once it has generated that many
 * tokens: a long one probes again, and its windows move the prior back when drafts pay again. */
static int spec_prior_low(const struct conductor *c)
{
    return c->spec_prior && c->spec_g_drafted >= SPEC_PRIOR_MIN &&
           c->spec_g_accepted * SPEC_MIN_ACCEPT_DEN < c->spec_g_drafted;
}

/* Whether the draft model or head may propose for a sequence this step (beside prompt lookup:
 * where lookup found nothing for it). Acceptance alone does not say whether it pays: its forwards
 * cost time even where they end in no draft (--spec-p-min), its first proposal for a sequence
 * runs over the whole prompt, and the rows of its drafts make the verifying step slower than a
 * plain one. On SQuAD questions (Gemma 3 + the chat adapter, long passages and answers of a few
 * tokens) a head that drafted nothing at all took lookup first from 1.42x to 1.25x of the speed
 * without speculation, and head SU alone ran at 0.94x with 29.8 % of its drafts accepted, above
 * the adaptive rule's 1/4. So what it costs and saves is counted server-wide (spec_gate_step);
 * once SPEC_GATE_MIN proposals are counted, while the decode seconds its accepted tokens saved
 * are below the seconds it cost, it proposes at one opportunity in SPEC_GATE_PROBE only, enough
 * for the counts to follow the traffic and open the gate again, and only while these probes have
 * cost less than 1 / SPEC_GATE_PROBE_SHARE of the time since it closed (a probe for a new
 * sequence runs the head over its whole prompt: on SQuAD one in 16 opportunities still cost
 * 8 %). Off with the prior (SHARDLM_SPEC_PRIOR=0). */
static int draft_gate(struct conductor *c)
{
    const int shut = c->spec_d_runs >= SPEC_GATE_MIN && c->spec_d_saved < c->spec_d_seconds;
    if (shut != c->spec_d_gated) {
        LOG_INFO("engine", "speculative: the draft %s (it cost %.3f s lately, its accepted tokens saved about %.3f s "
                 "of decode steps)", shut ? "now proposes at one opportunity in 16: it costs more than it saves"
                 : "proposes again", c->spec_d_seconds, c->spec_d_saved);
        c->spec_d_credit = 0.0;
    }
    c->spec_d_gated = shut;
    if (!shut) return 1;
    return c->spec_d_credit > 0.0 && c->spec_d_opportunities++ % SPEC_GATE_PROBE == 0;
}

/* The plain-step reference a batch of n sequences uses (batches beyond the last share it). */
static int gate_batch(int n) { return n < SPEC_GATE_BATCHES ? n : SPEC_GATE_BATCHES - 1; }

/* Whether this step must be a plain one (no drafts at all) for draft_gate's reference: a plain
 * decode step's seconds at n sequences unknown, or measured more than SPEC_GATE_STALE decode
 * steps ago (the contexts grow; other traffic comes and goes). */
static int plain_step_due(const struct conductor *c, int n)
{
    n = gate_batch(n);
    return c->spec_plain_s[n] <= 0.0 || c->spec_decode_steps - c->spec_plain_at[n] > SPEC_GATE_STALE;
}

/* After a step of dt seconds: a plain decode step (no prompt rows, no draft rows) updates the
 * reference of its batch size B (a moving mean); with that reference T known, the draft's
 * proposals before the step count as cost, and in a decode step so do the seconds beyond T, in
 * the share of the step's draft rows that were the draft's (the rest were prompt lookup's or the
 * corpus'); each token of its drafts accepted saved T / B (a step of B sequences gives each one
 * token: with a drafts accepted over the batch, (B + a) tokens in T + extra seconds pay exactly
 * when a * T / B exceeds the extra). */
void spec_gate_step(struct conductor *c, double dt)
{
    if (!c->spec_gate) return;
    const struct step_batch *b = &c->sched.batch;
    const int B = gate_batch(b->n_seqs), drafts = b->n_rows - b->n_seqs;
    const int decode = b->prefill_rows == 0 && B > 0;
    double *T = &c->spec_plain_s[B];
    if (decode) {
        c->spec_decode_steps++;
        if (drafts == 0) {
            *T = *T > 0.0 ? *T + (dt - *T) / 8.0 : dt;
            c->spec_plain_at[B] = c->spec_decode_steps;
        }
    }
    double cost = 0.0;
    if (B > 0 && *T > 0.0 && (c->step_propose_s > 0.0 || c->step_d_rows > 0)) {
        cost = c->step_propose_s;
        if (decode && drafts > 0) cost += (dt - *T) * c->step_d_rows / drafts;
        c->spec_d_seconds += cost;
        c->spec_d_saved += c->step_d_accepted * *T / B;
    }
    if (c->spec_d_gated) { /* the probes' allowance: a share of the time, less what they cost (at most a step's ahead) */
        c->spec_d_credit += (dt + c->step_propose_s) / SPEC_GATE_PROBE_SHARE - (cost > 0.0 ? cost : 0.0);
        if (c->spec_d_credit > dt) c->spec_d_credit = dt;
    }
    c->step_propose_s = 0.0;
    c->step_d_rows = c->step_d_accepted = 0;
}

/* draft_gate's count of proposals, after proposals for n sequences (the counts are halved beyond
 * SPEC_PRIOR_HALVE: recent proposals weigh most). */
static void draft_gate_count(struct conductor *c, int n)
{
    c->spec_d_runs += (uint64_t)n;
    if (c->spec_d_runs > SPEC_PRIOR_HALVE) c->spec_d_runs /= 2, c->spec_d_seconds /= 2, c->spec_d_saved /= 2;
}

/* The prior after a sequence's window was judged (low or not) and its n_ver verified drafts, of
 * which n_accepted were accepted. */
static void spec_prior_update(struct conductor *c, int n_ver, int n_accepted, int judged, int low)
{
    c->spec_g_drafted += (uint64_t)n_ver;
    c->spec_g_accepted += (uint64_t)n_accepted;
    if (c->spec_g_drafted > SPEC_PRIOR_HALVE) c->spec_g_drafted /= 2, c->spec_g_accepted /= 2;
    if (!c->spec_g_backoff) c->spec_g_backoff = SPEC_BACKOFF_FIRST;
    if (judged) c->spec_g_backoff = low ? (2 * c->spec_g_backoff > SPEC_BACKOFF_MAX ? SPEC_BACKOFF_MAX
                                                                                  : 2 * c->spec_g_backoff)
                                        : SPEC_BACKOFF_FIRST;
}

void spec_learn(struct conductor *c, const struct seq *s, enum finish_reason why)
{
    const struct request *r = s->req;
    if (c->o.spec_corpus_learn <= 0 || why == FINISH_REASON_ERROR || s->n_generated <= 0 ||
        r->n_prompt + s->n_generated > s->n_tokens)
        return;
    const int lead = r->n_prompt < SPEC_LEARN_LEAD ? r->n_prompt : SPEC_LEARN_LEAD, n = lead + s->n_generated;
    if (c->n_learn + n + 1 > c->learn_cap) {
        const int64_t cap = 2 * (c->n_learn + n + 1);
        int32_t *grown = realloc(c->learn, (size_t)cap * sizeof *grown);
        if (!grown) return; /* out of memory: this answer is not learned, nothing else changes */
        c->learn = grown, c->learn_cap = cap;
    }
    if (c->n_learn_texts + 1 > c->learn_scope_cap) {
        const int64_t cap = 2 * (c->n_learn_texts + 1);
        uint32_t *grown = realloc(c->learn_scope, (size_t)cap * sizeof *grown);
        if (!grown) return;
        c->learn_scope = grown, c->learn_scope_cap = cap;
    }
    memcpy(c->learn + c->n_learn, s->tokens + r->n_prompt - lead, (size_t)n * sizeof *c->learn);
    c->n_learn += n;
    c->learn[c->n_learn++] = -1;
    c->learn_scope[c->n_learn_texts++] = r->spec_scope; /* its owner's and adapter's alone */
}

/* learn_join moves the kept outputs into the corpus, then forgets the oldest learned texts while
 * the learned ids exceed spec_corpus_learn (slack more: a quarter of it while serving, so that
 * the O(N) cut comes once in a while; none for a kept file read at start). On an error (memory)
 * the outputs are dropped and the corpus stays as it was. learn_flush calls it at every step
 * where at most one sequence runs (so a lone client's next request drafts from its last answer),
 * else once SPEC_LEARN_BATCH ids wait, and then writes a kept corpus's file when the last write
 * is keep_every_s old (a crash loses at most that much of what was learned). */
#define SPEC_LEARN_BATCH 4096
static enum status learn_join(struct conductor *c, int64_t slack)
{
    enum status st = c->corpus ? spec_corpus_append(c->corpus, c->learn, c->n_learn, c->learn_scope)
                               : spec_corpus_new(c->learn, c->n_learn, c->learn_scope, &c->corpus);
    c->n_learn = 0, c->n_learn_texts = 0;
    if (st != STATUS_OK) {
        if (!c->learn_failed) LOG_WARN("engine", "speculative corpus: answers not learned: %s", status_message());
        c->learn_failed = 1; /* said once */
        return st;
    }
    const int64_t learned = spec_corpus_ids(c->corpus) - c->corpus_given, cap = c->o.spec_corpus_learn;
    if (learned > cap) spec_corpus_forget(c->corpus, c->corpus_given, learned - cap + slack);
    pthread_mutex_lock(&c->mu);
    c->stats.spec_corpus_tokens = (uint64_t)spec_corpus_tokens(c->corpus);
    pthread_mutex_unlock(&c->mu);
    return STATUS_OK;
}

static void learn_flush(struct conductor *c)
{
    if (!c->n_learn || (c->sched.n_running > 1 && c->n_learn < SPEC_LEARN_BATCH)) return;
    if (learn_join(c, c->o.spec_corpus_learn / 4) == STATUS_OK && c->corpus_kept &&
        base_now_s() - c->keep_written_s >= c->keep_every_s)
        spec_keep_write_async(c);
}

/* What a kept corpus is bound to: the vocabulary's size and an FNV-1a 64 over every token's
 * piece (a file kept by a model with another tokenizer would draft nonsense). */
static uint64_t tokenizer_fingerprint(const struct tokenizer *t)
{
    uint64_t h = BASE_FNV1A_BASIS;
    for (int32_t id = 0; id < tokenizer_vocab_size(t); id++) {
        const char *piece = tokenizer_id_to_piece(t, id);
        h = base_fnv1a(base_fnv1a_str(h, piece ? piece : ""), "\xff", 1); /* the piece's end (0xff is no UTF-8 byte) */
    }
    return h;
}

enum status spec_keep_load(struct conductor *c)
{
    const char *path = c->o.spec_corpus_keep;
    if (!path || !conductor_is_first_rank(c)) return STATUS_OK;
    int32_t *ids = NULL;
    uint32_t *scopes = NULL; /* one per text; NULL: a file of version 1, every text of scope 0 */
    int64_t n = 0;
    c->keep_fingerprint = tokenizer_fingerprint(c->tok);
    enum status st = spec_corpus_file_read(path, c->m->cfg.vocab_size, c->keep_fingerprint, &ids, &scopes, &n);
    if (st != STATUS_OK) return status_errorf(st, "--spec-corpus-keep: %s", status_message());
    /* The newest kept texts, up to spec_corpus_learn ids (dropped before the index is made); an
     * error here (memory) fails the start, so that the file is not written back emptied. */
    int64_t from = 0, texts_from = 0, texts = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] >= 0) continue;
        texts++;
        if (n - from > c->o.spec_corpus_learn) from = i + 1, texts_from = texts; /* this text too old */
    }
    if (n - from > 0) { /* before the engine starts nothing waits to be learned: the kept texts take the buffers */
        memmove(ids, ids + from, (size_t)(n - from) * sizeof *ids);
        if (!scopes) scopes = calloc((size_t)(texts - texts_from), sizeof *scopes);
        else memmove(scopes, scopes + texts_from, (size_t)(texts - texts_from) * sizeof *scopes);
        if (!scopes) {
            free(ids);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "--spec-corpus-keep %s: out of host memory", path);
        }
        free(c->learn), free(c->learn_scope);
        c->learn = ids, c->n_learn = n - from, c->learn_cap = n - from;
        c->learn_scope = scopes, c->n_learn_texts = texts - texts_from, c->learn_scope_cap = texts - texts_from;
        ids = NULL, scopes = NULL;
        st = learn_join(c, 0);
        free(c->learn), free(c->learn_scope); /* the file's size, not kept for the engine's life */
        c->learn = NULL, c->learn_cap = 0, c->learn_scope = NULL, c->learn_scope_cap = 0;
        if (st != STATUS_OK) return status_errorf(st, "--spec-corpus-keep %s: %s", path, status_message());
    }
    free(ids);
    free(scopes);
    c->corpus_kept = 1;
    const char *every = getenv("SHARDLM_TEST_SPEC_KEEP_EVERY_S"); /* tests: a write at every join */
    c->keep_every_s = every ? atof(every) : SPEC_KEEP_EVERY_S;
    c->keep_written_s = base_now_s();
    LOG_INFO("engine", "speculative corpus: %lld tokens, those kept in %s included",
             (long long)(c->corpus ? spec_corpus_tokens(c->corpus) : 0), path);
    return STATUS_OK;
}

/* Writes the learned ids to the kept file; a failure is a warning (the server goes on). */
static enum status keep_write(const struct conductor *c, const int32_t *ids, const uint32_t *scope, int64_t n)
{
    enum status st = spec_corpus_file_write(c->o.spec_corpus_keep, c->m->cfg.vocab_size, c->keep_fingerprint, ids,
                                            scope, n);
    if (st != STATUS_OK) LOG_WARN("engine", "--spec-corpus-keep: the learned corpus was not kept: %s", status_message());
    return st;
}

static void *keep_writer(void *arg)
{
    struct conductor *c = arg;
    keep_write(c, c->keep_job, c->keep_job_scope, c->keep_job_n);
    atomic_store(&c->keep_thread_done, 1);
    return NULL;
}

/* Joins the writer thread once it is done (wait: also while it writes); 1 when none is left. */
static int keep_writer_join(struct conductor *c, int wait)
{
    if (!c->keep_thread_live) return 1;
    if (!wait && !atomic_load(&c->keep_thread_done)) return 0;
    pthread_join(c->keep_thread, NULL);
    c->keep_thread_live = 0;
    free(c->keep_job), free(c->keep_job_scope);
    c->keep_job = NULL, c->keep_job_scope = NULL;
    return 1;
}

void spec_keep_write_async(struct conductor *c)
{
    if (!keep_writer_join(c, 0)) return; /* the last write is still going: the next flush tries again */
    c->keep_written_s = base_now_s();
    int64_t n = 0;
    const int32_t *ids = c->corpus ? spec_corpus_id_data(c->corpus, c->corpus_given, &n) : NULL;
    c->keep_job = malloc((size_t)(n ? n : 1) * sizeof *c->keep_job);
    c->keep_job_scope = malloc((size_t)(n ? n : 1) * sizeof *c->keep_job_scope);
    if (c->keep_job && c->keep_job_scope && n) {
        memcpy(c->keep_job, ids, (size_t)n * sizeof *ids);
        memcpy(c->keep_job_scope, spec_corpus_scope_data(c->corpus, c->corpus_given), (size_t)n * sizeof *c->keep_job_scope);
    }
    c->keep_job_n = n;
    atomic_store(&c->keep_thread_done, 0);
    if (!c->keep_job || !c->keep_job_scope || pthread_create(&c->keep_thread, NULL, keep_writer, c) != 0) {
        free(c->keep_job), free(c->keep_job_scope); /* out of memory, no thread: written at the end instead */
        c->keep_job = NULL, c->keep_job_scope = NULL;
        return;
    }
    c->keep_thread_live = 1;
}

void spec_keep_save(struct conductor *c)
{
    keep_writer_join(c, 1); /* a periodic write still going ends before this one starts */
    if (!c->corpus_kept) return;
    if (c->n_learn) learn_join(c, c->o.spec_corpus_learn / 4);
    int64_t n = 0;
    const int32_t *ids = c->corpus ? spec_corpus_id_data(c->corpus, c->corpus_given, &n) : NULL;
    const uint32_t *scope = c->corpus ? spec_corpus_scope_data(c->corpus, c->corpus_given) : NULL;
    if (keep_write(c, ids, scope, n) == STATUS_OK) LOG_INFO("engine", "speculative corpus: %lld learned ids kept in %s", (long long)n, c->o.spec_corpus_keep);
}

/* Before planning: the answers a learning corpus kept join it (learn_flush); every sequence's
 * drafts of the last step are gone (take_results consumed the verified ones); each eligible sequence that is not backing off appends new ones, up to its
 * adaptive length, within a budget of logits rows and batch rows that leaves the other sequences
 * theirs: by prompt lookup, or from the draft model when there is one (for the sequences that
 * get one of its cache slots), or both (spec_lookup_first: lookup where its last tokens match
 * earlier ones, the draft elsewhere; a draft slot that sat out steps catches up with the tokens
 * taken meanwhile at its next proposal, draft_run). */
void speculate(struct conductor *c)
{
    struct scheduler *sc = &c->sched;
    learn_flush(c);
    for (int i = 0; i < sc->n_running; i++) {
        struct seq *s = sc->running[i];
        s->n_tokens -= s->n_draft;
        s->n_draft = 0;
        s->spec_q = NULL;
        s->spec_lookup = 0;
    }
    /* Slots of sequences that no longer run are freed every step, drafting or not (a batch
     * above --spec-max-batch drafts nothing, but its finished owners' slots must not stay taken). */
    if (c->draft.m) draft_sweep(&c->draft, sc->running, sc->n_running);
    if (c->o.spec_draft <= 0 || sc->n_running > (c->o.spec_max_batch > 0 ? c->o.spec_max_batch : 4)) return;
    if (c->spec_gate && plain_step_due(c, sc->n_running)) return; /* draft_gate's reference: a plain step */
    /* (64 logits rows, or half of a small step's, kept for prompts that ask for log-probabilities:
     * with --max-batch-tokens 64 a fixed 64 left none, and speculation silently never drafted) */
    const int keep = c->max_logits / 2 < 64 ? c->max_logits / 2 : 64;
    int budget = c->max_logits - keep - sc->n_running, rows = c->o.max_batch_tokens - sc->n_running;
    if (rows < budget) budget = rows;
    const int ngram = c->o.spec_ngram > 0 ? c->o.spec_ngram : 3;
    const int ngram_min = c->o.spec_ngram_min > 0 ? c->o.spec_ngram_min : 2;
    const int corpus_min = c->o.spec_corpus_min > 0 ? c->o.spec_corpus_min : SPEC_CORPUS_MIN_DEFAULT;
    const float corpus_p_min = c->o.spec_corpus_p_min > 0.0f ? c->o.spec_corpus_p_min : SPEC_CORPUS_P_MIN_DEFAULT;
    struct seq *ds[DRAFT_MAX_SLOTS];
    int want[DRAFT_MAX_SLOTS], n_ds = 0;
    for (int i = 0; i < sc->n_running && budget > 0; i++) {
        struct seq *s = sc->running[i];
        if (!can_draft(c, s) || s->n_generated < s->spec_resume_at) continue;
        const struct request *r = s->req;
        const int limit = draft_limit(c, r);
        if (s->spec_len <= 0 && spec_prior_low(c)) { /* a new sequence while drafts rarely pay: it waits */
            s->spec_len = limit;
            s->spec_resume_at = s->n_generated + c->spec_g_backoff;
            pthread_mutex_lock(&c->mu);
            c->stats.spec_backoffs++;
            pthread_mutex_unlock(&c->mu);
            continue;
        }
        if (s->spec_len <= 0 || s->spec_len > limit) s->spec_len = limit;
        int max = s->spec_len < budget ? s->spec_len : budget;
        const int left = r->p.max_tokens - s->n_generated - 1, room = c->m->cfg.max_positions - s->n_tokens - 1;
        if (max > left) max = left;
        if (max > room) max = room;
        if (max <= 0) continue;
        /* The corpus where its match is long (SPEC_CORPUS_FIRST_MATCH: an answer repeating an
         * earlier one); else prompt lookup (room: n_prompt + max_tokens + 1), alone or first; then
         * the corpus; the draft model where none finds anything. */
        int32_t *room_at = s->tokens + s->n_tokens, from_corpus[SPEC_CORPUS_SPAN];
        int matched = 0, k_corpus = 0, k = 0, from = 0;
        if (c->corpus)
            k_corpus = spec_corpus_draft(c->corpus, s->tokens, s->n_tokens, corpus_min, corpus_p_min, max,
                                         r->spec_scope, from_corpus, &matched);
        if (k_corpus <= 0 || matched < SPEC_CORPUS_FIRST_MATCH) {
            k = !c->draft.m || c->o.spec_lookup_first ? lookup_draft(s, ngram, ngram_min, max, room_at) : 0;
            from = k > 0 ? SPEC_FROM_LOOKUP : 0;
        }
        if (!k && k_corpus > 0) {
            memcpy(room_at, from_corpus, (size_t)k_corpus * sizeof *room_at);
            k = k_corpus, from = SPEC_FROM_CORPUS;
        }
        if (k > 0 || !c->draft.m) {
            s->n_tokens += k;
            s->n_draft = k;
            s->spec_lookup = from;
            budget -= k;
            continue;
        }
        if (n_ds == c->draft.n_slots || (c->spec_gate && !draft_gate(c)) || !draft_claim(&c->draft, s, max))
            continue;
        ds[n_ds] = s;
        want[n_ds++] = max;
        budget -= max;
    }
    if (!n_ds) return;
    const double t0 = c->spec_gate ? base_now_s() : 0.0;
    propose(c, ds, want, n_ds);
    if (c->spec_gate) draft_gate_count(c, n_ds), c->step_propose_s += base_now_s() - t0;
}

enum status conductor_set_spec_corpus(struct conductor *c, const int32_t *ids, int64_t n)
{
    if (c->thread_running)
        return status_errorf(STATUS_FAILED_PRECONDITION, "a speculative corpus is given before the engine starts");
    if (c->o.spec_draft <= 0)
        return status_errorf(STATUS_FAILED_PRECONDITION, "a speculative corpus needs speculation on (--speculative)");
    const int V = c->m->cfg.vocab_size;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= V)
            return status_errorf(STATUS_INVALID_ARGUMENT, "speculative corpus: id %d at %lld is outside the vocabulary (%d)",
                                 ids[i], (long long)i, V);
    struct spec_corpus *corpus = NULL;
    enum status st = spec_corpus_new(ids, n, NULL, &corpus); /* the given texts draft for every request */
    int64_t n_kept = 0; /* texts read from --spec-corpus-keep's file (conductor_create) go after the given */
    const int32_t *kept = c->corpus ? spec_corpus_id_data(c->corpus, c->corpus_given, &n_kept) : NULL;
    if (st == STATUS_OK && n_kept) { /* with their scopes: each text's, at its end */
        const uint32_t *per_id = spec_corpus_scope_data(c->corpus, c->corpus_given);
        int64_t texts = 0;
        for (int64_t i = 0; i < n_kept; i++) texts += kept[i] < 0;
        uint32_t *scopes = malloc((size_t)texts * sizeof *scopes);
        if (!scopes) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "speculative corpus: out of host memory");
        for (int64_t i = 0, t = 0; scopes && i < n_kept; i++)
            if (kept[i] < 0) scopes[t++] = per_id[i];
        if (st == STATUS_OK) st = spec_corpus_append(corpus, kept, n_kept, scopes);
        free(scopes);
    }
    if (st != STATUS_OK) {
        spec_corpus_free(corpus);
        return st;
    }
    spec_corpus_free(c->corpus);
    c->corpus = corpus;
    c->corpus_given = spec_corpus_ids(corpus) - n_kept;
    c->stats.spec_corpus_tokens = (uint64_t)spec_corpus_tokens(corpus);
    return STATUS_OK;
}

/* The adaptive rule, after s verified n_ver drafts and accepted n_accepted of them. The length
 * follows Hugging Face's assisted-generation heuristic: +2 when every draft was accepted, else
 * -1, within [1, limit]. Every SPEC_WINDOW verified drafts the window's acceptance is judged:
 * below 1 / SPEC_MIN_ACCEPT_DEN the sequence stops drafting for a backoff of generated tokens
 * (SPEC_BACKOFF_FIRST, doubling while consecutive windows stay low, up to SPEC_BACKOFF_MAX) and
 * then tries again at the full length; a window at or above it resets the backoff. Returns 1
 * when s began a backoff. Reads and writes only s's own fields (s may have finished). */
static int adapt(struct conductor *c, struct seq *s, int limit, int n_ver, int n_accepted)
{
    if (n_ver <= 0) return 0;
    s->spec_len = n_accepted == n_ver ? s->spec_len + 2 : s->spec_len - 1;
    if (s->spec_len > limit) s->spec_len = limit;
    if (s->spec_len < 1) s->spec_len = 1;
    s->spec_win_drafted += n_ver;
    s->spec_win_accepted += n_accepted;
    const int judged = s->spec_win_drafted >= SPEC_WINDOW;
    const int low = s->spec_win_accepted * SPEC_MIN_ACCEPT_DEN < s->spec_win_drafted;
    spec_prior_update(c, n_ver, n_accepted, judged, low);
    if (!judged) return 0;
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

/* The general rejection rule (Leviathan et al. / Chen et al.) for a draft d drawn from the
 * draft model's distribution q (vocab) at a row whose target distribution is p (every sampling
 * control applied, sampler_probs): accept d with probability min(1, p(d) / q(d)); otherwise draw
 * from max(0, p - q) renormalised. Either way the token is distributed as p. Draws one uniform,
 * and a second on rejection. Returns the token (s not yet told), or -1 when s's constraint allows
 * nothing (s finished with the error, as take_token does). */
static int32_t verify_sampled(struct conductor *c, struct seq *s, const float *row, int32_t d, const float *q)
{
    const struct request *r = s->req;
    const int V = c->m->cfg.vocab_size;
    float *p = c->spec_p, *lg = c->scratch + V;
    sampling_logits(c, s, row, s->n_generated, lg);
    if (r->grammar && !constrain(c, s, lg)) return -1;
    struct sampling_params sp = r->p.sampling;
    sampler_probs(&c->smp, &sp, lg, r->prompt, r->n_prompt, s->tokens + r->n_prompt, s->n_generated, p);
    if ((double)rng_uniform(&s->rng) * q[d] < p[d]) return d; /* q[d] > 0: d was drawn from q */
    double total = 0.0;
    for (int i = 0; i < V; i++) total += p[i] > q[i] ? p[i] - q[i] : 0.0;
    const int residual = total > 0.0; /* p == q up to rounding: fall back to p itself */
    if (!residual) for (int i = 0; i < V; i++) total += p[i];
    double u = (double)rng_uniform(&s->rng) * total, acc = 0.0;
    int32_t last = 0;
    for (int i = 0; i < V; i++) {
        const double w = residual ? (p[i] > q[i] ? p[i] - q[i] : 0.0) : p[i];
        if (w <= 0.0) continue;
        last = i;
        acc += w;
        if (u < acc) return i;
    }
    return last;
}

/* SHARDLM_SPEC_CHECK_GRAMMAR (tests/server/test_speculative_grammar.py): after a constrained s
 * verified drafts, its matcher must be in the state of a run that never drafted. That run's
 * matcher is kept beside it (s->gm_check), fed only the output's tokens as take_chosen feeds them
 * (refused tokens, the end ids, leave it as it is); the two must give the same mask, can_end and
 * is_done, else s finishes with STATUS_INTERNAL naming the difference. Non-lazy constraints only
 * (a lazy one's matcher starts at its trigger). */
static void check_matcher(struct conductor *c, struct seq *s)
{
    if (!c->spec_check_grammar || s->state != SEQ_RUNNING) return; /* finished: s->req may be gone */
    const struct request *r = s->req;
    if (!r->grammar || r->p.constraint_trigger_len || !s->gm) return;
    if (!s->gm_check && grammar_matcher_new(r->grammar, &s->gm_check) != STATUS_OK) return;
    for (; s->gm_check_n < s->n_generated; s->gm_check_n++)
        (void)grammar_matcher_accept(s->gm_check, s->tokens[r->n_prompt + s->gm_check_n]);
    const int words = grammar_vocab_mask_words(grammar_vocab_of(r->grammar));
    uint32_t *other = malloc((size_t)words * sizeof *other);
    if (!other) return;
    const enum status a = grammar_matcher_fill_mask(s->gm, c->gmask), b = grammar_matcher_fill_mask(s->gm_check, other);
    const int same_mask = a == b && !memcmp(c->gmask, other, (size_t)words * sizeof *other);
    free(other);
    if (!same_mask || grammar_matcher_can_end(s->gm) != grammar_matcher_can_end(s->gm_check) ||
        grammar_matcher_is_done(s->gm) != grammar_matcher_is_done(s->gm_check))
        finish_seq(c, s, FINISH_REASON_ERROR, STATUS_INTERNAL,
                   same_mask ? "speculation: the grammar matcher's end state after verification differs from a run's "
                               "that never drafted"
                             : "speculation: the grammar matcher's mask after verification differs from a run's that "
                               "never drafted", 0);
}

/* Adds drafted and accepted tokens (from where they came: seq.spec_lookup) and backoffs to the
 * engine's counters. take_drafted counts each before the token that may finish the request is
 * taken, so that a client that saw its request end finds its drafts counted in GetServerStats.
 * (An accepted draft whose taking then failed, out of memory starting a constraint's matcher,
 * stays counted.) */
static void count_spec(struct conductor *c, int from, int drafted, int accepted, int backoffs)
{
    pthread_mutex_lock(&c->mu);
    c->stats.spec_drafted += (uint64_t)drafted;
    c->stats.spec_accepted += (uint64_t)accepted;
    if (from == SPEC_FROM_LOOKUP) {
        c->stats.spec_lookup_drafted += (uint64_t)drafted;
        c->stats.spec_lookup_accepted += (uint64_t)accepted;
    } else if (from == SPEC_FROM_CORPUS) {
        c->stats.spec_corpus_drafted += (uint64_t)drafted;
        c->stats.spec_corpus_accepted += (uint64_t)accepted;
    }
    c->stats.spec_backoffs += (uint64_t)backoffs;
    pthread_mutex_unlock(&c->mu);
}

/* s ran its real token and n_ver of its drafts (rows row[0 .. n_ver]). Row by row the target's
 * token is taken: for a prompt-lookup or greedy draft (one-hot q) it is sampled exactly as a
 * plain decode step samples it (take_token: the same controls, the same random stream, the
 * target's log-probabilities) and the draft is accepted while they are equal (see the file
 * comment for why this is the rejection-sampling rule); for a sampled draft-model draft the
 * general rule decides (verify_sampled). The first row whose token differs from the draft gives
 * that token and the drafts after it are dropped; when every verified draft is accepted the last
 * row gives one more token. The KV of rejected drafts is left behind (their positions are
 * written again), and the draft model's slot rolls back to the accepted prefix. Returns after
 * finishing s when a token ends it. */
void take_drafted(struct conductor *c, struct seq *s, const float *rows, int n_ver)
{
    const int V = c->m->cfg.vocab_size;
    const int limit = draft_limit(c, s->req);
    const int real_end = s->n_tokens - s->n_draft;
    int32_t draft[SPEC_MAX_DRAFT];
    const int n_draft = s->n_draft < SPEC_MAX_DRAFT ? s->n_draft : SPEC_MAX_DRAFT;
    memcpy(draft, s->tokens + real_end, (size_t)n_draft * sizeof *draft);
    const float *q = s->spec_q;
    if (n_ver > n_draft) n_ver = n_draft;
    s->n_tokens = real_end;
    s->n_draft = 0;
    s->spec_q = NULL;
    const int from = s->spec_lookup;
    int n_accepted = 0;
    count_spec(c, from, n_ver, 0, 0);
    for (int i = 0; i <= n_ver; i++) {
        const float *row = rows + (size_t)i * V;
        const int32_t tok = q && i < n_ver && sampler_logits_finite(row, V) && s->req->p.max_tokens > 0
                                ? verify_sampled(c, s, row, draft[i], q + (size_t)i * V)
                                : sample_token(c, s, row);
        if (tok < 0) break; /* s finished instead */
        const int match = i < n_ver && tok == draft[i];
        if (match) count_spec(c, from, 0, 1, 0);
        const int accepted = take_chosen(c, s, row, tok) >= 0 && match;
        n_accepted += accepted;
        if (s->state != SEQ_RUNNING || !accepted) break; /* finished, or the target's token replaced the draft */
    }
    if (c->draft.m) draft_rollback(&c->draft, s, real_end + n_accepted);
    check_matcher(c, s);
    const int backoff = adapt(c, s, limit, n_ver, n_accepted);
    if (!s->spec_lookup && c->spec_gate) c->step_d_rows += n_ver, c->step_d_accepted += n_accepted;
    if (backoff && s->state == SEQ_RUNNING) count_spec(c, from, 0, 0, backoff); /* (a finished one drafts no more) */
}
