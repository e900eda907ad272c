/* engine/serving/sampler.c - token sampling (see sampler.h). The filters apply in the order vLLM and
 * Hugging Face use: penalties, temperature, top-k, top-p, min-p, then one uniform draw
 * against the renormalised distribution; the host log-softmax and top-k that log-probabilities
 * need. Not here: the sampling parameters' bounds (the limits table in request.c). */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fastexp.h"
#include "ops.h"
#include "request.h"

struct sampling_params sampling_params_default(void)
{
    return (struct sampling_params){
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
}

enum status sampling_params_validate(const struct sampling_params *p)
{
    /* The bounds are the sampling rows of the engine's one limits table (request.c). */
    struct request_params rp = {.sampling = *p};
    return request_limits_check(&rp, NULL, 1);
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(struct rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t rng_next(struct rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float rng_uniform(struct rng *r) { return (float)(rng_next(r) >> 40) * (1.0f / 16777216.0f); }

enum status sampler_init(struct sampler *s, int vocab_size)
{
    memset(s, 0, sizeof *s);
    if (vocab_size <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "sampler: vocab_size %d", vocab_size);
    s->vocab_size = vocab_size;
    s->order = malloc((size_t)vocab_size * sizeof *s->order);
    s->probs = malloc((size_t)vocab_size * sizeof *s->probs);
    s->counts = calloc((size_t)vocab_size, sizeof *s->counts);
    if (!s->order || !s->probs || !s->counts) {
        sampler_free(s);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "sampler: out of memory");
    }
    return STATUS_OK;
}

void sampler_free(struct sampler *s)
{
    free(s->order);
    free(s->probs);
    free(s->counts);
    memset(s, 0, sizeof *s);
}

float sampler_exp(float x)
{
    const float v = base_exp(x); /* (computed either way: a select of values is what vectorizes) */
    return x > -87.0f ? v : 0.0f; /* (base_exp clamps at -87: a masked, -Inf logit must weigh 0) */
}

/* The largest value of x[0..n) that is not NaN (-Inf when none is): eight running maxima, no
 * element waiting on the one before, so the compiler vectorizes it. */
float sampler_max(const float *x, int n)
{
    float m8[8];
    for (int j = 0; j < 8; j++) m8[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) m8[j] = x[i + j] > m8[j] ? x[i + j] : m8[j]; /* (NaN: never greater) */
    float m = -INFINITY;
    for (int j = 0; j < 8; j++) m = m8[j] > m ? m8[j] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The first index of the largest logit that is not NaN (0 when all are NaN): the maximum, then
 * the first index holding it. One pass keeping the best index ran at about 2.5 ns an element
 * (each step waited on the last compare: 0.65 ms a token over Gemma 3's 262,144 logits, serial
 * between the step's parallel products). */
int32_t sampler_argmax(const float *x, int n)
{
    const float m = sampler_max(x, n);
    for (int i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

static void apply_penalties(struct sampler *s, const struct sampling_params *p, float *logits,
                            const int32_t *prompt, int n_prompt, const int32_t *output, int n_output)
{
    const int V = s->vocab_size;
    if (p->repetition_penalty != 1.0f) {
        /* Each seen token is penalised once: mark it through counts, then clear the marks. */
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *ids = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = ids[i];
                if (t < 0 || t >= V || s->counts[t]) continue;
                s->counts[t] = 1;
                logits[t] = logits[t] > 0 ? logits[t] / p->repetition_penalty
                                          : logits[t] * p->repetition_penalty;
            }
        }
        for (int i = 0; i < n_prompt; i++) if (prompt[i] >= 0 && prompt[i] < V) s->counts[prompt[i]] = 0;
        for (int i = 0; i < n_output; i++) if (output[i] >= 0 && output[i] < V) s->counts[output[i]] = 0;
    }
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int i = 0; i < n_output; i++) if (output[i] >= 0 && output[i] < V) s->counts[output[i]]++;
        for (int i = 0; i < n_output; i++) {
            int32_t t = output[i];
            if (t < 0 || t >= V || s->counts[t] == 0) continue;
            logits[t] -= p->presence_penalty + p->frequency_penalty * (float)s->counts[t];
            s->counts[t] = 0; /* applied once per distinct token */
        }
    }
}

static _Thread_local const float *sort_key; /* qsort has no context argument; samplers run on several threads */

static int by_logit_desc(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float x = sort_key[i], y = sort_key[j];
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* Moves to the front of order[0..n) the candidates whose logits fall in the highest bins (NB of
 * them, evenly over [lo, top]) up to the first where the count reaches want (want > 0) or the
 * weights' mass (w[0..n), unnormalised, by the same positions as order) reaches want_mass, and
 * the bin after it (against the rounding of that mass); sorts them by logit, highest first (ties:
 * lowest id first) and returns how many there are. Every candidate left behind has a lower logit
 * than every one moved, so the sorted front is the front of the whole order by logit: the filters
 * read only the front, and sorting all candidates (up to the whole vocabulary) for every token
 * cost a sampled decode on Gemma 3 a third or more (top_p 0.95: 39 against 64-71 tok/s greedy,
 * 2 threads, the Zen 3 VM; docs/performance.md). */
#define SAMPLER_BINS 2048

/* The bin of a candidate d below the top logit (0 <= d <= top - lo), scale bins a logit. */
static int bin_of(float d, float scale)
{
    const float f = d * scale;
    return scale == 0.0f || !(f > 0.0f) ? 0 : f < (float)(SAMPLER_BINS - 1) ? (int)f : SAMPLER_BINS - 1;
}

static int gather_front(struct sampler *s, int n, const float *logits, float lo, float top, int want,
                        const float *w, double want_mass)
{
    static _Thread_local int count[SAMPLER_BINS];
    static _Thread_local double mass[SAMPLER_BINS];
    const float scale = top > lo && isfinite(top - lo) ? (float)(SAMPLER_BINS - 1) / (top - lo) : 0.0f;
    memset(count, 0, sizeof count);
    memset(mass, 0, sizeof mass);
    for (int i = 0; i < n; i++) {
        const int b = bin_of(top - logits[s->order[i]], scale); /* (0: the highest logits) */
        count[b]++;
        if (w) mass[b] += w[i];
    }
    int last = 0, have = 0;
    double got = 0.0;
    for (; last < SAMPLER_BINS; last++) {
        have += count[last], got += mass[last];
        if (want > 0 ? have >= want : got >= want_mass) break;
    }
    last = last + 1 < SAMPLER_BINS ? last + 1 : SAMPLER_BINS - 1;
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (bin_of(top - logits[s->order[i]], scale) <= last) {
            const int32_t t = s->order[m];
            s->order[m++] = s->order[i], s->order[i] = t;
        }
    }
    sort_key = logits;
    qsort(s->order, (size_t)m, sizeof *s->order, by_logit_desc);
    return m;
}

/* The candidates sampler_sample draws among after every filter: their ids in s->order[0 .. n),
 * their unnormalised weights in s->probs[0 .. n) (the plain-temperature case lists every id).
 * logits have had penalties and NaN clearing applied; top is their largest value; temperature > 0.
 * Returns n (>= 1). The same tokens and weights as sorting every candidate and cutting the sorted
 * list (gather_front); top_p's normalising sum adds the weights in another order when top_k
 * does not cut first (a last-bit difference, which can move the cut only where the cumulative
 * mass lands within that of top_p). */
static int candidates(struct sampler *s, const struct sampling_params *p, const float *logits, float top)
{
    const int V = s->vocab_size;
    if (p->top_k == 0 && p->top_p >= 1.0f && p->min_p == 0.0f) {
        for (int i = 0; i < V; i++) {
            s->order[i] = i;
            s->probs[i] = sampler_exp((logits[i] - top) / p->temperature);
        }
        return V;
    }
    /* Only tokens within a factor 1e-12 of the most likely one are candidates: the rest carry at
     * most V * 1e-12 of the mass (2.6e-7 for a 262k vocabulary). */
    const float floor_logit = top + p->temperature * -27.631021f; /* ln(1e-12) */
    int n = 0;
    for (int i = 0; i < V; i++)
        if (logits[i] >= floor_logit) s->order[n++] = i;
    int sorted = 0; /* how many of the front are in order */
    if (p->top_k > 0 && p->top_k < n) {
        gather_front(s, n, logits, floor_logit, top, p->top_k, NULL, 0.0);
        sorted = n = p->top_k;
    }
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += s->probs[i] = sampler_exp((logits[s->order[i]] - top) / p->temperature);
    if (p->top_p < 1.0f) {
        if (sorted < n) sorted = gather_front(s, n, logits, floor_logit, top, 0, s->probs, (double)p->top_p * sum);
        for (;;) {
            for (int i = 0; i < sorted; i++) s->probs[i] = sampler_exp((logits[s->order[i]] - top) / p->temperature);
            double cum = 0.0;
            int cut = 0;
            for (int i = 0; i < sorted && !cut; i++) {
                cum += s->probs[i] / sum;
                if (cum >= p->top_p) cut = i + 1;
            }
            if (cut || sorted == n) {
                n = cut ? cut : n;
                break;
            }
            /* (the sum's rounding left the cut beyond the gathered bins: order every candidate) */
            sort_key = logits;
            qsort(s->order, (size_t)n, sizeof *s->order, by_logit_desc);
            sorted = n;
        }
    } else if (sorted < n) { /* min_p alone: the weights at least min_p of the largest (1), in order */
        int m = 0;
        for (int i = 0; i < n; i++)
            if (s->probs[i] >= p->min_p) {
                const int32_t t = s->order[m];
                s->order[m++] = s->order[i], s->order[i] = t;
            }
        sort_key = logits;
        qsort(s->order, (size_t)m, sizeof *s->order, by_logit_desc);
        for (int i = 0; i < m; i++) s->probs[i] = sampler_exp((logits[s->order[i]] - top) / p->temperature);
        n = m;
    }
    if (p->min_p > 0.0f) { /* probs[0] is the largest */
        float cut = p->min_p * s->probs[0];
        int keep = 1;
        while (keep < n && s->probs[keep] >= cut) keep++;
        n = keep;
    }
    return n;
}

/* Penalties, then NaN logits to -inf; the largest logit. */
static float prepare(struct sampler *s, const struct sampling_params *p, float *logits, const int32_t *prompt,
                     int n_prompt, const int32_t *output, int n_output)
{
    const int V = s->vocab_size;
    apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
    for (int i = 0; i < V; i++) if (isnan(logits[i])) logits[i] = -INFINITY;
    return sampler_max(logits, V);
}

/* Plain temperature sampling needs no order: the weights of the whole vocabulary once (kept in
 * s->probs, not computed again for the draw), then the first token whose cumulative weight in id
 * order exceeds u times the total (f64 sums; the last token of nonzero weight when rounding leaves
 * the target past them all). *margin, when margin is non-NULL: the target's distance to the nearer
 * end of the token's interval over the total (-1 in that rounding case). */
static int32_t plain_draw(struct sampler *s, const float *logits, float top, float temperature, float u,
                          double *margin)
{
    const int V = s->vocab_size;
    double total = 0.0;
    for (int i = 0; i < V; i++) s->probs[i] = sampler_exp((logits[i] - top) / temperature); /* (vectorized) */
    for (int i = 0; i < V; i++) total += s->probs[i];
    const double target = (double)u * total;
    double acc = 0.0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        const float w = s->probs[i];
        if (w == 0.0f) continue;
        last = i;
        const double before = acc;
        acc += w;
        if (target < acc) {
            if (margin) *margin = fmin(target - before, acc - target) / total;
            return i;
        }
    }
    if (margin) *margin = -1.0;
    return last;
}

int32_t sampler_sample(struct sampler *s, const struct sampling_params *p, struct rng *r,
                       float *logits, const int32_t *prompt, int n_prompt, const int32_t *output,
                       int n_output)
{
    const int V = s->vocab_size;
    if (p->temperature == 0.0f) {
        apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
        return sampler_argmax(logits, V);
    }
    const float top = prepare(s, p, logits, prompt, n_prompt, output, n_output);
    if (p->top_k == 0 && p->top_p >= 1.0f && p->min_p == 0.0f)
        return plain_draw(s, logits, top, p->temperature, rng_uniform(r), NULL);
    const int n = candidates(s, p, logits, top);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += s->probs[i];
    double u = (double)rng_uniform(r) * sum, cum = 0.0;
    for (int i = 0; i < n; i++) {
        cum += s->probs[i];
        if (u < cum) return s->order[i];
    }
    return s->order[n - 1];
}

int sampler_penalised(const struct sampling_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

struct sampling_params sampler_unpenalised(const struct sampling_params *p)
{
    struct sampling_params u = *p;
    u.repetition_penalty = 1.0f, u.presence_penalty = 0.0f, u.frequency_penalty = 0.0f;
    return u;
}

int sampler_top_exact(const struct sampling_params *p, int k)
{
    return p->temperature > 0.0f && p->top_k >= 1 && p->top_k < k && !sampler_penalised(p);
}

/* The k go into a row of their own in id order, so that the sampler meets them in the whole row's
 * order: with more than top_k within its floor it sorts the first top_k by logit (ties by id, as
 * op_topk ranks them); with fewer, it adds their weights in id order (top_p's normalising sum) before
 * it sorts them, as over the whole row, so that even the sum's last bit is the same. */
int32_t sampler_sample_top(struct sampler *s, const struct sampling_params *p, struct rng *r,
                           const float *values, const int32_t *ids, int k, float *lg, int32_t *tok)
{
    for (int i = 0; i < k; i++) { /* insertion by id (k is small) */
        int j = i;
        for (; j > 0 && tok[j - 1] > ids[i]; j--) tok[j] = tok[j - 1], lg[j] = lg[j - 1];
        tok[j] = ids[i], lg[j] = values[i];
    }
    return tok[sampler_sample(s, p, r, lg, NULL, 0, NULL, 0)];
}

int sampler_nucleus_fits(const struct sampling_params *p)
{
    return p->temperature > 0.0f && p->top_k == 0 && (p->top_p < 1.0f || p->min_p > 0.0f) && !sampler_penalised(p);
}

/* candidates() over the whole row, read from the k: top_p's cut at the first sorted token whose
 * cumulative weight over the row's mass reaches top_p (decided only where every mass within the
 * tolerance puts it there), or min_p alone keeping the weights >= min_p (decided when the k-th is
 * below it: every token outside is lower); then min_p over the kept, and the draw over them in
 * sorted order, as sampler_sample's. */
int32_t sampler_sample_nucleus(const struct sampling_params *p, struct rng *r, const float *values,
                               const int32_t *ids, int k, double mass, float *w)
{
    const float top = values[0], floor_logit = top + p->temperature * -27.631021f;
    int n = 0; /* candidates within the floor */
    while (n < k && values[n] >= floor_logit) {
        w[n] = sampler_exp((values[n] - top) / p->temperature);
        n++;
    }
    int keep = 0;
    if (p->top_p < 1.0f) {
        const double lo = mass * (1.0 - SAMPLER_MASS_TOL), hi = mass * (1.0 + SAMPLER_MASS_TOL);
        double cum = 0.0;
        for (int i = 0; i < n && !keep; i++) {
            cum += w[i];
            if (cum / hi >= p->top_p) keep = i + 1; /* reached for any mass up to hi */
            else if (cum / lo >= p->top_p) return -1; /* reached for some masses, not others */
        }
        if (!keep) return -1; /* the nucleus reaches past the k */
    } else {
        if (n == k && k > 0 && w[k - 1] >= p->min_p) return -1; /* tokens outside may pass min_p */
        keep = n;
    }
    if (p->min_p > 0.0f) { /* w[0] is 1, the largest */
        const float cut = p->min_p * w[0];
        int m = 1;
        while (m < keep && w[m] >= cut) m++;
        keep = m;
    }
    double sum = 0.0;
    for (int i = 0; i < keep; i++) sum += w[i];
    const double u = (double)rng_uniform(r) * sum;
    double cum = 0.0;
    for (int i = 0; i < keep; i++) {
        cum += w[i];
        if (u < cum) return ids[i];
    }
    return ids[keep - 1];
}

int sampler_draw_fits(const struct sampling_params *p)
{
    return p->temperature > 0.0f && p->top_k == 0 && p->top_p >= 1.0f && p->min_p == 0.0f && !sampler_penalised(p);
}

int32_t sampler_draw(struct sampler *s, const float *logits, float temperature, float u, double *margin)
{
    return plain_draw(s, logits, sampler_max(logits, s->vocab_size), temperature, u, margin);
}

void sampler_probs(struct sampler *s, const struct sampling_params *p, float *logits, const int32_t *prompt,
                   int n_prompt, const int32_t *output, int n_output, float *out)
{
    const int V = s->vocab_size;
    memset(out, 0, (size_t)V * sizeof *out);
    if (p->temperature == 0.0f) {
        apply_penalties(s, p, logits, prompt, n_prompt, output, n_output);
        out[sampler_argmax(logits, V)] = 1.0f;
        return;
    }
    const float top = prepare(s, p, logits, prompt, n_prompt, output, n_output);
    const int n = candidates(s, p, logits, top);
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += s->probs[i];
    for (int i = 0; i < n; i++) out[s->order[i]] = (float)(s->probs[i] / sum);
}

int sampler_logits_finite(const float *x, int n)
{
    uint32_t bad = 0; /* (the bits, so that it vectorizes: an exponent of all ones is Inf or NaN) */
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u);
        bad |= (~u & 0x7f800000u) == 0;
    }
    return !bad;
}

void sampler_log_softmax(const float *x, float *out, int V)
{
    const float mx = sampler_max(x, V);
    for (int i = 0; i < V; i++) out[i] = sampler_exp(x[i] - mx); /* (the weights, for now: vectorized) */
    double part[4] = {0.0, 0.0, 0.0, 0.0}; /* (four sums: no add waiting on the one before) */
    int i = 0;
    for (; i + 4 <= V; i += 4)
        for (int j = 0; j < 4; j++) part[j] += out[i + j];
    double sum = (part[0] + part[1]) + (part[2] + part[3]);
    for (; i < V; i++) sum += out[i];
    const float lse = (float)log(sum);
    for (i = 0; i < V; i++) out[i] = (x[i] - mx) - lse;
}

void sampler_top_logprobs(const float *lp, int V, int k, struct top_logprob *out)
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
