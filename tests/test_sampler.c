/* tests/test_sampler.c - the sampler: greedy is argmax; top-k, top-p and min-p never emit a
 * token they exclude; at temperature 1 the empirical distribution matches softmax (chi-square
 * on a fixed seed); temperature sharpens; penalties change logits exactly as specified; the RNG
 * stream depends only on its seed; parameter validation names the field; drawing from a row's
 * 64 largest logits (sampler_sample_top) gives the whole row's token where it promises to; so does
 * a plain temperature draw made elsewhere (op_logit_draw) wherever its margin is SAMPLER_DRAW_TOL.
 * Prints one line per check and "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "sampler.h"

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *detail)
{
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

#define V 50

static void make_logits(float *x, unsigned seed)
{
    struct rng r;
    rng_seed(&r, seed);
    for (int i = 0; i < V; i++) x[i] = 4.0f * rng_uniform(&r) - 2.0f;
}

/* Draws n samples with params p from logits x (copied each time: the sampler edits them). */
static void histogram(struct sampler *s, const struct sampling_params *p, const float *x, int n, int *counts)
{
    float buf[V];
    struct rng r;
    rng_seed(&r, p->seed);
    memset(counts, 0, V * sizeof *counts);
    for (int i = 0; i < n; i++) {
        memcpy(buf, x, sizeof buf);
        counts[sampler_sample(s, p, &r, buf, NULL, 0, NULL, 0)]++;
    }
}

static void softmax(const float *x, double t, double *p)
{
    double mx = -1e300, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, x[i]);
    for (int i = 0; i < V; i++) sum += p[i] = exp((x[i] - mx) / t);
    for (int i = 0; i < V; i++) p[i] /= sum;
}

/* The filters as sampler.c ran them before its gather_front (2026-12-01): every candidate within
 * 1e-12 of the top sorted by logit (ties: lowest id first), then top-k, the weights, top-p against
 * their sum in that order, min-p. Returns n; order / w the kept ids and weights. */
static const float *ref_key;
static int ref_desc(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (ref_key[i] != ref_key[j]) return ref_key[i] > ref_key[j] ? -1 : 1;
    return i < j ? -1 : 1;
}
static int ref_candidates(const float *x, int nv, const struct sampling_params *p, int32_t *order, float *w)
{
    float top = -INFINITY;
    for (int i = 0; i < nv; i++) top = x[i] > top ? x[i] : top;
    const float floor_logit = top + p->temperature * -27.631021f;
    int n = 0;
    for (int i = 0; i < nv; i++)
        if (x[i] >= floor_logit) order[n++] = i;
    ref_key = x;
    qsort(order, (size_t)n, sizeof *order, ref_desc);
    if (p->top_k > 0 && p->top_k < n) n = p->top_k;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += w[i] = sampler_exp((x[order[i]] - top) / p->temperature);
    if (p->top_p < 1.0f) {
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += w[i] / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        int keep = 1;
        while (keep < n && w[keep] >= p->min_p * w[0]) keep++;
        n = keep;
    }
    return n;
}

/* sampler_exp against exp in double over [-86.75, 0] (every 2^-12, and the ends): within 3 ulp of
 * e^x, 0 at or below -87 and at -Inf, exactly 1 at 0. */
static void check_exp(void)
{
    double worst = 0.0;
    int ok = sampler_exp(0.0f) == 1.0f && sampler_exp(-INFINITY) == 0.0f && sampler_exp(-87.0f) == 0.0f &&
             sampler_exp(-1000.0f) == 0.0f;
    for (float x = -86.75f; x <= 0.0f; x += 1.0f / 4096.0f) {
        const double want = exp((double)x), got = sampler_exp(x);
        const double ulps = fabs(got - want) / (ldexp(1.0, -23) * want);
        if (ulps > worst) worst = ulps;
    }
    char d[64];
    snprintf(d, sizeof d, "worst %.2f ulp", worst);
    check(ok && worst <= 3.0, "sampler_exp is e^x within 3 ulp on [-86.75, 0], 0 at -87 and below and at -Inf, 1 at 0", d);
}

/* Large vocabularies (the filters gather only the front they read: sampler.c gather_front)
 * against ref_candidates: the same kept tokens with the same probabilities (sampler_probs), and
 * the same token for the same seed in 16 draws each, for peaked, flat, tied and masked logits
 * under top-k, top-p, min-p and their mixes. */
static void check_filters_large(void)
{
    enum { NV = 70001 };
    static float x[NV], buf[NV], got[NV], w[NV];
    static int32_t order[NV];
    struct sampler g;
    if (sampler_init(&g, NV) != STATUS_OK) exit(1);
    static const struct {
        float t, top_p, min_p;
        int top_k;
    } ps[] = {{1.0f, 0.95f, 0.0f, 0}, {0.7f, 0.9f, 0.0f, 0},    {1.0f, 1.0f, 0.0f, 40},  {0.8f, 0.95f, 0.05f, 0},
              {1.3f, 1.0f, 0.1f, 0},  {1.0f, 0.5f, 0.0f, 1000}, {2.0f, 0.99f, 0.0f, 5}, {1.0f, 0.999f, 0.0f, 0},
              {0.5f, 1.0f, 0.02f, 300}};
    int bad = 0, draws = 0;
    char d[160] = "";
    for (int shape = 0; shape < 4; shape++)
        for (size_t c = 0; c < sizeof ps / sizeof *ps; c++) {
            struct rng r;
            rng_seed(&r, 1000 + (uint64_t)shape);
            for (int i = 0; i < NV; i++) {
                const float u = rng_uniform(&r);
                x[i] = shape == 0 ? 8.0f * u - 4.0f                       /* flat-ish */
                     : shape == 1 ? (i % 997 == 0 ? 12.0f : 0.0f) + 3.0f * u  /* a few peaks */
                     : shape == 2 ? (float)(int)(6.0f * u)                 /* six tied levels */
                                  : (u < 0.7f ? -INFINITY : 5.0f * u);      /* masked (a grammar) */
            }
            struct sampling_params p = sampling_params_default();
            p.temperature = ps[c].t, p.top_p = ps[c].top_p, p.min_p = ps[c].min_p, p.top_k = ps[c].top_k;
            const int n = ref_candidates(x, NV, &p, order, w);
            double sum = 0.0;
            for (int i = 0; i < n; i++) sum += w[i];
            memcpy(buf, x, sizeof buf);
            sampler_probs(&g, &p, buf, NULL, 0, NULL, 0, got);
            int support = 0;
            for (int i = 0; i < NV; i++) support += got[i] > 0.0f;
            int same = support == n;
            for (int i = 0; i < n && same; i++) same = fabsf(got[order[i]] - (float)(w[i] / sum)) <= 1e-6f;
            for (int k = 0; k < 16 && same; k++, draws++) {
                struct rng ra, rb;
                rng_seed(&ra, (uint64_t)k), rng_seed(&rb, (uint64_t)k);
                memcpy(buf, x, sizeof buf);
                const int32_t tok = sampler_sample(&g, &p, &ra, buf, NULL, 0, NULL, 0);
                const double u = (double)rng_uniform(&rb) * sum;
                double cum = 0.0;
                int32_t want = order[n - 1];
                for (int i = 0; i < n; i++)
                    if (u < (cum += w[i])) {
                        want = order[i];
                        break;
                    }
                same = tok == want;
            }
            if (!same && !bad++)
                snprintf(d, sizeof d, "shape %d, T %.1f top_p %.3f min_p %.2f top_k %d: %d kept, want %d", shape, ps[c].t,
                         ps[c].top_p, ps[c].min_p, ps[c].top_k, support, n);
        }
    char what[96];
    snprintf(what, sizeof what, "filters over %d logits equal the sort-everything rule (36 cases, %d draws)", (int)NV, draws);
    check(!bad, what, bad ? d : NULL);
    sampler_free(&g);
}

/* sampler_sample_top from a row's 64 largest logits against sampler_sample over the whole row:
 * the same token and the same random stream for every seed, on rows where the floor holds more
 * than top_k tokens, where it holds fewer (a handful of near-equal tokens far above the rest, so
 * that their order matters: id order there, as over the whole row), and rows of many ties (the
 * 64th place among equal logits); and sampler_top_exact refuses what it cannot promise. */
#define TOP_V 1000
#define TOP_K 64
static const float *top_key;
static int top_desc(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (top_key[i] != top_key[j]) return top_key[i] > top_key[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The row's TOP_K largest as op_topk gives them (values descending, ties by lower id); order
 * (TOP_V) is left holding the whole row's ranking. */
static void top_of(const float *row, int32_t *order, float *vals, int32_t *ids)
{
    for (int i = 0; i < TOP_V; i++) order[i] = i;
    top_key = row;
    qsort(order, TOP_V, sizeof *order, top_desc);
    for (int i = 0; i < TOP_K; i++) ids[i] = order[i], vals[i] = row[order[i]];
}

static void check_top(void)
{
    static float row[TOP_V], work[TOP_V], vals[TOP_K], lg[TOP_K];
    static int32_t order[TOP_V], ids[TOP_K], tok[TOP_K];
    struct sampler whole, top;
    if (sampler_init(&whole, TOP_V) != STATUS_OK || sampler_init(&top, TOP_K) != STATUS_OK) return;
    const float temps[] = {0.3f, 0.7f, 1.0f, 1.7f}, top_ps[] = {1.0f, 0.9f, 0.5f}, min_ps[] = {0.0f, 0.05f};
    const int top_ks[] = {1, 5, 40, 63};
    long draws = 0, differ = 0, streams = 0, few = 0;
    char d[256] = "";
    for (int kind = 0; kind < 3; kind++)
        for (unsigned seed = 1; seed <= 6; seed++) {
            struct rng g;
            rng_seed(&g, 1000 * (unsigned)kind + seed);
            for (int i = 0; i < TOP_V; i++) {
                const float u = rng_uniform(&g);
                row[i] = kind == 0 ? 8.0f * u - 4.0f          /* many within the floor */
                       : kind == 1 ? -40.0f - 10.0f * u         /* the rest far below ... */
                                   : (float)(int)(6.0f * u) * 0.5f; /* ties everywhere */
            }
            if (kind == 1) /* ... a handful of near-equal tokens at scattered ids */
                for (int i = 0; i < 6; i++) row[(i * 397 + (int)seed * 31) % TOP_V] = 0.4f * rng_uniform(&g);
            top_of(row, order, vals, ids);
            for (size_t a = 0; a < sizeof temps / sizeof *temps; a++)
                for (size_t b = 0; b < sizeof top_ks / sizeof *top_ks; b++)
                    for (size_t c = 0; c < sizeof top_ps / sizeof *top_ps; c++)
                        for (size_t e = 0; e < sizeof min_ps / sizeof *min_ps; e++) {
                            struct sampling_params p = sampling_params_default();
                            p.temperature = temps[a], p.top_k = top_ks[b], p.top_p = top_ps[c], p.min_p = min_ps[e];
                            int within = 0; /* tokens within the sampler's floor */
                            for (int i = 0; i < TOP_V; i++) within += row[i] >= row[order[0]] + p.temperature * -27.631021f;
                            few += within < p.top_k;
                            for (uint64_t k = 0; k < 40; k++) {
                                struct rng r1, r2;
                                rng_seed(&r1, k * 7919 + seed), rng_seed(&r2, k * 7919 + seed);
                                memcpy(work, row, sizeof row);
                                const int32_t t1 = sampler_sample(&whole, &p, &r1, work, NULL, 0, NULL, 0);
                                const int32_t t2 = sampler_sample_top(&top, &p, &r2, vals, ids, TOP_K, lg, tok);
                                draws++;
                                if (t1 != t2 && !differ++)
                                    snprintf(d, sizeof d, "kind %d, T %g, top_k %d, top_p %g, min_p %g: %d against %d",
                                             kind, p.temperature, p.top_k, p.top_p, p.min_p, t2, t1);
                                streams += rng_next(&r1) != rng_next(&r2);
                            }
                        }
        }
    char what[160];
    snprintf(what, sizeof what, "sampler_sample_top: %ld draws from the top %d of %d, the whole row's tokens "
             "(%ld settings with fewer within the floor than top_k)", draws, TOP_K, TOP_V, few);
    check(differ == 0 && streams == 0 && few > 0, what, differ || streams ? d : NULL);
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f, p.top_k = 40;
    const int yes = sampler_top_exact(&p, TOP_K);
    p.top_k = TOP_K;
    const int at_k = sampler_top_exact(&p, TOP_K);
    p.top_k = 0;
    const int none = sampler_top_exact(&p, TOP_K);
    p.top_k = 40, p.presence_penalty = 0.5f;
    const int pen = sampler_top_exact(&p, TOP_K);
    p.presence_penalty = 0.0f, p.repetition_penalty = 1.1f;
    const int rep = sampler_top_exact(&p, TOP_K);
    p.repetition_penalty = 1.0f, p.temperature = 0.0f;
    const int greedy = sampler_top_exact(&p, TOP_K);
    check(yes && !at_k && !none && !pen && !rep && !greedy,
          "sampler_top_exact: top_k 40 of 64 yes; top_k 64, top_k 0, penalties, temperature 0 no", NULL);
    sampler_free(&whole);
    sampler_free(&top);
}

/* sampler_sample_nucleus (top_p and / or min_p, no top_k) from a row's 64 largest logits and its
 * mass, given within 5e-5 of the host's sum (either side): wherever it decides, the whole row's
 * token and random stream; where it does not, nothing drawn. Rows from peaked (a few tokens far
 * above the rest: decided) to flat (the nucleus past the 64: not). */
static void check_nucleus(void)
{
    static float row[TOP_V], work[TOP_V], vals[TOP_K], w[TOP_K];
    static int32_t order[TOP_V], ids[TOP_K];
    struct sampler whole;
    if (sampler_init(&whole, TOP_V) != STATUS_OK) return;
    const float temps[] = {0.5f, 1.0f}, top_ps[] = {1.0f, 0.95f, 0.8f}, min_ps[] = {0.0f, 0.02f, 0.2f};
    long decided = 0, undecided = 0, differ = 0, streams = 0, decided_p = 0, decided_minp = 0;
    char d[256] = "";
    for (int kind = 0; kind < 4; kind++)
        for (unsigned seed = 1; seed <= 6; seed++) {
            struct rng g;
            rng_seed(&g, 7000 * (unsigned)kind + seed);
            for (int i = 0; i < TOP_V; i++) { /* 0 flat; 1-3 a head of 8 * kind tokens over a tail */
                const float u = rng_uniform(&g);
                row[i] = kind == 0 ? 2.0f * u : -6.0f - 6.0f * u;
            }
            for (int i = 0; kind > 0 && i < 8 * kind; i++) row[(i * 131 + (int)seed * 17) % TOP_V] = 3.0f * rng_uniform(&g);
            top_of(row, order, vals, ids);
            for (size_t a = 0; a < sizeof temps / sizeof *temps; a++)
                for (size_t c = 0; c < sizeof top_ps / sizeof *top_ps; c++)
                    for (size_t e = 0; e < sizeof min_ps / sizeof *min_ps; e++) {
                        struct sampling_params p = sampling_params_default();
                        p.temperature = temps[a], p.top_p = top_ps[c], p.min_p = min_ps[e];
                        if (!sampler_nucleus_fits(&p)) continue;
                        const float top = vals[0], floor_logit = top + p.temperature * -27.631021f;
                        double mass = 0.0;
                        for (int i = 0; i < TOP_V; i++)
                            if (row[i] >= floor_logit) mass += sampler_exp((row[i] - top) / p.temperature);
                        for (uint64_t k = 0; k < 30; k++) {
                            struct rng r1, r2;
                            rng_seed(&r1, k * 104729 + seed), rng_seed(&r2, k * 104729 + seed);
                            memcpy(work, row, sizeof row);
                            const int32_t t1 = sampler_sample(&whole, &p, &r1, work, NULL, 0, NULL, 0);
                            const double given = mass * (1.0 + (k % 3 == 0 ? 5e-5 : k % 3 == 1 ? -5e-5 : 0.0));
                            const int32_t t2 = sampler_sample_nucleus(&p, &r2, vals, ids, TOP_K, given, w);
                            if (t2 < 0) {
                                undecided++;
                                struct rng fresh;
                                rng_seed(&fresh, k * 104729 + seed);
                                streams += rng_next(&fresh) != rng_next(&r2);
                                continue;
                            }
                            decided++;
                            decided_p += p.top_p < 1.0f, decided_minp += p.top_p >= 1.0f;
                            if (t1 != t2 && !differ++)
                                snprintf(d, sizeof d, "kind %d, T %g, top_p %g, min_p %g: %d against %d", kind,
                                         p.temperature, p.top_p, p.min_p, t2, t1);
                            streams += rng_next(&r1) != rng_next(&r2);
                        }
                    }
        }
    char what[320];
    snprintf(what, sizeof what, "sampler_sample_nucleus: %ld of %ld draws decided from the top %d (%ld top_p, %ld "
             "min_p alone), each the whole row's token; the rest drew nothing", decided, decided + undecided, TOP_K,
             decided_p, decided_minp);
    check(differ == 0 && streams == 0 && decided_p > 0 && decided_minp > 0 && undecided > 0, what,
          differ || streams ? d : NULL);
    sampler_free(&whole);
}

/* A plain temperature draw as a device makes it (op_logit_draw), four ways: 0 the CPU backend's
 * op; 1 CUDA's algorithm (the host's weights, base_exp's bits; f64 sums of 256 chunks, then the
 * walk within one); 2 the same with weights by exp in double, rounded (a device whose exp is not
 * base_exp); 3 the host's weights each moved 3.6e-7 (3 ulp), up in the row's first half and down
 * in the second (the cumulative sums move most so), the worst SAMPLER_DRAW_TOL claims to cover. Returns the token, *margin its margin (-1 when none). */
#define DRAW_V 4096
static int32_t device_draw(int how, struct backend *b, const float *row, float t, float u, float *margin)
{
    if (how == 0) {
        int32_t id = -1;
        float mg = 0.0f;
        struct tensor x = tensor_make((void *)row, DTYPE_F32, DEVICE_CPU, 2, (int64_t)1, (int64_t)DRAW_V);
        struct tensor ti = tensor_make(&id, DTYPE_I32, DEVICE_CPU, 1, (int64_t)1);
        struct tensor tm = tensor_make(&mg, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
        struct tensor tt = tensor_make(&t, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
        struct tensor tu = tensor_make(&u, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
        op_logit_draw(b, &ti, &tm, &x, &tt, NULL, &tu);
        *margin = mg;
        return id;
    }
    static double w[DRAW_V];
    const float m = sampler_max(row, DRAW_V);
    double total = 0.0, chunk[256] = {0};
    for (int j = 0; j < DRAW_V; j++) {
        const float d = (row[j] - m) / t;
        if (how == 1) w[j] = sampler_exp(d);
        else if (how == 2) w[j] = d > -87.0f ? (double)(float)exp((double)d) : 0.0;
        else w[j] = (double)(float)(sampler_exp(d) * (1.0 + (j < DRAW_V / 2 ? 3.6e-7 : -3.6e-7)));
        chunk[j / (DRAW_V / 256)] += w[j];
    }
    for (int k = 0; k < 256; k++) total += chunk[k];
    const double target = (double)u * total;
    double acc = 0.0;
    for (int j = 0; j < DRAW_V; j++) {
        if (w[j] == 0.0) continue;
        const double before = acc;
        acc += w[j];
        if (target < acc) {
            *margin = (float)(fmin(target - before, acc - target) / total);
            return j;
        }
    }
    *margin = -1.0f;
    return -1;
}

/* Rows of DRAW_V logits (flat; a head over a tail; N(0, 3)) at four temperatures, 100 seeded
 * draws each, by device_draw's way how at tolerance tol: *decided and *undecided count the draws
 * that land at least tol inside their token and the rest, *moved the largest distance between a
 * draw's margin and the host's (sampler_draw; beyond the f32 margin's own rounding); returns how
 * many decided draws are not sampler_sample's token or leave another random state than the
 * host's after it (d: the first). */
static long draws_differ(int how, double tol, struct sampler *whole, struct backend *b, long *decided, long *undecided,
                         double *moved, char *d, size_t dn)
{
    static float row[DRAW_V], work[DRAW_V];
    const float temps[] = {0.5f, 1.0f, 1.5f, 2.0f};
    long differ = 0;
    *decided = *undecided = 0;
    *moved = 0.0;
    for (int kind = 0; kind < 3; kind++)
        for (unsigned seed = 1; seed <= 3; seed++) {
            struct rng g;
            rng_seed(&g, 9100 * (unsigned)kind + seed);
            for (int i = 0; i < DRAW_V; i++) {
                const float a = rng_uniform(&g), c = rng_uniform(&g);
                row[i] = kind == 0 ? 2.0f * a : kind == 1 ? -6.0f - 6.0f * a
                       : 3.0f * sqrtf(-2.0f * logf(1.0f - a)) * cosf(6.2831853f * c);
            }
            for (int i = 0; kind == 1 && i < 24; i++) row[(i * 131 + (int)seed * 17) % DRAW_V] = 3.0f * rng_uniform(&g);
            for (size_t a = 0; a < sizeof temps / sizeof *temps; a++) {
                struct sampling_params p = sampling_params_default();
                p.temperature = temps[a];
                if (!sampler_draw_fits(&p)) continue;
                for (uint64_t k = 0; k < 100; k++) {
                    struct rng r1, r2;
                    rng_seed(&r1, k * 7919 + seed), rng_seed(&r2, k * 7919 + seed);
                    memcpy(work, row, sizeof row);
                    const int32_t t1 = sampler_sample(whole, &p, &r1, work, NULL, 0, NULL, 0);
                    float margin = 0.0f;
                    const float u = rng_uniform(&r2);
                    const int32_t t2 = device_draw(how, b, row, p.temperature, u, &margin);
                    double host_margin = 0.0;
                    if (sampler_draw(whole, row, p.temperature, u, &host_margin) == t2) {
                        const double gap = fabs((double)margin - host_margin) - 6e-8 * host_margin;
                        *moved = gap > *moved ? gap : *moved;
                    }
                    if (t2 < 0 || margin < (float)tol) {
                        ++*undecided;
                        continue;
                    }
                    ++*decided;
                    if ((t1 != t2 || rng_next(&r1) != rng_next(&r2)) && !differ++)
                        snprintf(d, dn, "kind %d, T %g, draw %d: %d (margin %.3g) against %d", kind, p.temperature,
                                 (int)k, t2, (double)margin, t1);
                }
            }
        }
    return differ;
}

/* CUDA's nucleus algorithm (kernels/cuda/logit_mass.cu logit_nucleus_kernel) on the host: the
 * candidates binned by logit (2048 even bins over [floor, max], the same float arithmetic), each
 * bin's weight summed (f64, id order here: any order there), the crossing bin's members sorted
 * alone and walked; the cut, then the draw among the kept, margins as the kernel forms them. */
#define NUC_BINS 2048
static int nuc_bin(float x, float m, float scale)
{
    const float f = (m - x) * scale;
    return f > 0.0f ? (f < (float)(NUC_BINS - 1) ? (int)f : NUC_BINS - 1) : 0;
}

static const float *nuc_row;
static int nuc_order(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (nuc_row[i] != nuc_row[j]) return nuc_row[i] > nuc_row[j] ? -1 : 1;
    return i < j ? -1 : 1;
}

/* The select: the first candidate (sampler's order) whose running sum reaches goal (strict:
 * exceeds); *lo, *hi the sum before and at it. */
static int32_t nuc_select(const float *row, float m, float t, float floor_logit, float scale, double goal, int strict,
                          double *lo, double *hi)
{
    static double mass[NUC_BINS];
    static int32_t members[DRAW_V];
    memset(mass, 0, sizeof mass);
    for (int j = 0; j < DRAW_V; j++)
        if (row[j] >= floor_logit) mass[nuc_bin(row[j], m, scale)] += sampler_exp((row[j] - m) / t);
    double acc = 0.0;
    int bin = -1;
    for (int b = 0; b < NUC_BINS && bin < 0; b++) {
        if (strict ? acc + mass[b] > goal : acc + mass[b] >= goal) bin = b;
        else acc += mass[b];
    }
    if (bin < 0) return -1;
    int n = 0;
    for (int j = 0; j < DRAW_V; j++)
        if (row[j] >= floor_logit && nuc_bin(row[j], m, scale) == bin) members[n++] = j;
    nuc_row = row;
    qsort(members, (size_t)n, sizeof *members, nuc_order);
    for (int k = 0; k < n; k++) {
        *lo = acc;
        acc += sampler_exp((row[members[k]] - m) / t);
        if (strict ? acc > goal : acc >= goal) {
            *hi = acc;
            return members[k];
        }
    }
    return -1;
}

static int32_t nucleus_binned(const float *row, float t, float top_p, float u, float *margin)
{
    const float m = sampler_max(row, DRAW_V), floor_logit = m + t * -27.631021f, span = m - floor_logit;
    const float scale = span > 0.0f && isfinite(span) ? (float)(NUC_BINS - 1) / span : 0.0f;
    double total = 0.0, lo = 0.0, hi = 0.0;
    for (int j = 0; j < DRAW_V; j++)
        if (row[j] >= floor_logit) total += sampler_exp((row[j] - m) / t);
    *margin = 0.0f;
    const int32_t cut = nuc_select(row, m, t, floor_logit, scale, (double)top_p * total, 0, &lo, &hi);
    if (cut < 0) return -1;
    const double kept = hi, cut_margin = fmin(hi / total - (double)top_p, (double)top_p - lo / total);
    const double goal = (double)u * kept;
    const int32_t tok = nuc_select(row, m, t, floor_logit, scale, goal, 1, &lo, &hi);
    if (tok < 0 || row[tok] < row[cut] || (row[tok] == row[cut] && tok > cut)) return -1; /* past the cut */
    *margin = (float)fmin(cut_margin, fmin(goal - lo, hi - goal) / kept);
    return tok;
}

/* op_logit_draw's top_p rows (the nucleus drawn on the device) on the CPU backend against
 * sampler_sample over the whole row with the same random state: rows of DRAW_V logits (flat, a
 * head over a tail, N(0, 3), and a row of ties), four temperatures, four top_p, 40 seeded draws
 * each. Every draw decided at the exact tolerance must be the host's token and leave the host's
 * random stream, nearly all must be decided, and many must have nuclei wider than the 64
 * candidates (where sampler_sample_nucleus cannot decide: what the op is for). */
static void check_nucleus_draw(void)
{
    static float row[DRAW_V], work[DRAW_V], vals[TOP_K], w[TOP_K];
    static int32_t order[DRAW_V], ids[TOP_K];
    struct sampler whole;
    struct backend *b = NULL;
    if (sampler_init(&whole, DRAW_V) != STATUS_OK || backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK) {
        check(0, "op_logit_draw top_p: a sampler and a CPU backend", NULL);
        return;
    }
    const float temps[] = {0.5f, 1.0f, 1.5f, 2.0f}, top_ps[] = {0.5f, 0.9f, 0.95f, 0.99f};
    long decided = 0, undecided = 0, differ = 0, wide = 0, decided_b = 0, undecided_b = 0, differ_b = 0;
    char d[256] = "", db[256] = "";
    for (int kind = 0; kind < 4; kind++)
        for (unsigned seed = 1; seed <= 2; seed++) {
            struct rng g;
            rng_seed(&g, 4400 * (unsigned)kind + seed);
            for (int i = 0; i < DRAW_V; i++) {
                const float a = rng_uniform(&g), c = rng_uniform(&g);
                row[i] = kind == 0 ? 2.0f * a : kind == 1 ? -6.0f - 6.0f * a
                       : kind == 2 ? 3.0f * sqrtf(-2.0f * logf(1.0f - a)) * cosf(6.2831853f * c)
                                   : (float)(int)(4.0f * a); /* ties: four values */
            }
            for (int i = 0; kind == 1 && i < 24; i++) row[(i * 131 + (int)seed * 17) % DRAW_V] = 3.0f * rng_uniform(&g);
            for (int i = 0; i < DRAW_V; i++) order[i] = i;
            top_key = row;
            qsort(order, DRAW_V, sizeof *order, top_desc);
            for (int i = 0; i < TOP_K; i++) ids[i] = order[i], vals[i] = row[order[i]];
            for (size_t a = 0; a < sizeof temps / sizeof *temps; a++)
                for (size_t q = 0; q < sizeof top_ps / sizeof *top_ps; q++) {
                    struct sampling_params p = sampling_params_default();
                    p.temperature = temps[a], p.top_p = top_ps[q];
                    double mass = 0.0; /* (the exact whole-row mass: only "past the 64" is asked of it) */
                    for (int i = 0; i < DRAW_V; i++) mass += sampler_exp((row[i] - vals[0]) / p.temperature);
                    struct rng r0;
                    rng_seed(&r0, 1);
                    wide += sampler_sample_nucleus(&p, &r0, vals, ids, TOP_K, mass, w) < 0;
                    for (uint64_t k = 0; k < 40; k++) {
                        struct rng r1, r2;
                        rng_seed(&r1, k * 6007 + seed), rng_seed(&r2, k * 6007 + seed);
                        memcpy(work, row, sizeof row);
                        const int32_t t1 = sampler_sample(&whole, &p, &r1, work, NULL, 0, NULL, 0);
                        float u = rng_uniform(&r2), margin = 0.0f;
                        int32_t t2 = -1;
                        struct tensor x = tensor_make(row, DTYPE_F32, DEVICE_CPU, 2, (int64_t)1, (int64_t)DRAW_V);
                        struct tensor ti = tensor_make(&t2, DTYPE_I32, DEVICE_CPU, 1, (int64_t)1);
                        struct tensor tm = tensor_make(&margin, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
                        struct tensor tt = tensor_make(&p.temperature, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
                        struct tensor tp = tensor_make(&p.top_p, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
                        struct tensor tu = tensor_make(&u, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
                        op_logit_draw(b, &ti, &tm, &x, &tt, &tp, &tu);
                        float mb = 0.0f;
                        const int32_t t3 = nucleus_binned(row, p.temperature, p.top_p, u, &mb);
                        if (t3 < 0 || mb < (float)SAMPLER_DRAW_TOL_EXACT) undecided_b++;
                        else if (decided_b++, t3 != t1 && !differ_b++)
                            snprintf(db, sizeof db, "kind %d, T %g, top_p %g, draw %d: %d (margin %.3g) against %d", kind,
                                     (double)p.temperature, (double)p.top_p, (int)k, t3, (double)mb, t1);
                        if (t2 < 0 || margin < (float)SAMPLER_DRAW_TOL_EXACT) {
                            undecided++;
                            continue;
                        }
                        decided++;
                        if ((t1 != t2 || rng_next(&r1) != rng_next(&r2)) && !differ++)
                            snprintf(d, sizeof d, "kind %d, T %g, top_p %g, draw %d: %d (margin %.3g) against %d", kind,
                                     (double)p.temperature, (double)p.top_p, (int)k, t2, (double)margin, t1);
                    }
                }
        }
    char what[320];
    snprintf(what, sizeof what, "op_logit_draw top_p (the CPU op): %ld of %ld nucleus draws decided at %g, each the "
             "whole row's token and random stream; %ld of 128 nuclei past the top %d", decided, decided + undecided,
             SAMPLER_DRAW_TOL_EXACT, wide, TOP_K);
    check(differ == 0 && decided * 1000 >= (decided + undecided) * 995 && wide >= 32, what, differ ? d : NULL);
    snprintf(what, sizeof what, "CUDA's nucleus algorithm (bins, the crossing bin sorted): %ld of %ld draws decided at "
             "%g, each the whole row's token", decided_b, decided_b + undecided_b, SAMPLER_DRAW_TOL_EXACT);
    check(differ_b == 0 && decided_b * 1000 >= (decided_b + undecided_b) * 990, what, differ_b ? db : NULL);
    backend_close(b);
    sampler_free(&whole);
}

/* Backends whose draws are wrong: the CPU op's, each token moved by one, on every call (wrong_all)
 * or only on calls with top_p (the nucleus: wrong_nucleus). */
static const struct backend_ops *cpu_ops;

static void move_tokens(const struct tensor *ids, const struct tensor *x)
{
    int32_t *id = ids->data;
    for (int64_t i = 0; i < tensor_numel(ids); i++)
        if (id[i] >= 0) id[i] = (int32_t)((id[i] + 1) % tensor_cols(x));
}

static void wrong_all(struct backend *b, const struct tensor *ids, const struct tensor *margin, const struct tensor *x,
                      const struct tensor *temp, const struct tensor *top_p, const struct tensor *u)
{
    cpu_ops->logit_draw(b, ids, margin, x, temp, top_p, u);
    move_tokens(ids, x);
}

static void wrong_nucleus(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                          const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                          const struct tensor *u)
{
    cpu_ops->logit_draw(b, ids, margin, x, temp, top_p, u);
    if (top_p) move_tokens(ids, x);
}

/* sampler_device_check: the CPU backend agrees; a CPU backend with one of the ops made wrong
 * (its first output moved) is refused, naming the op. */
static void spoil(const struct tensor *t)
{
    if (t->dtype == DTYPE_I32) ((int32_t *)t->data)[0] += 1;
    else ((float *)t->data)[0] += 0.5f;
}

static void bad_edit(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *ids,
                     const struct tensor *vals)
{
    cpu_ops->logit_edit(b, x, rows, ids, vals);
    ((float *)x->data)[(size_t)((int32_t *)ids->data)[1]] += 0.5f; /* row 0's second edit */
}

static void bad_mask(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *mask)
{
    cpu_ops->logit_mask(b, x, rows, mask);
    ((float *)x->data)[(size_t)((int32_t *)rows->data)[0] * (size_t)tensor_cols(x) + 2] = 0.0f; /* a masked token kept */
}

static void bad_mass(struct backend *b, const struct tensor *mass, const struct tensor *x, const struct tensor *w)
{
    cpu_ops->logit_mass(b, mass, x, w);
    spoil(mass);
}

static void bad_lse(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want)
{
    cpu_ops->logit_lse(b, lse, x, want);
    spoil(lse);
}

static void bad_topk(struct backend *b, const struct tensor *v, const struct tensor *ids, const struct tensor *x)
{
    cpu_ops->topk(b, v, ids, x);
    int32_t *id = ids->data;
    const int32_t t = id[1];
    id[1] = id[2], id[2] = t; /* two candidates swapped */
}

static void bad_argmax(struct backend *b, const struct tensor *ids, const struct tensor *x)
{
    cpu_ops->argmax(b, ids, x);
    spoil(ids);
}

static void check_device_ops(void)
{
    struct backend *b = NULL;
    if (backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK) return check(0, "sampler_device_check: a CPU backend", NULL);
    char why[256], what[400];
    int ok = sampler_device_check(b, why, sizeof why);
    snprintf(what, sizeof what, "sampler_device_check: the CPU backend's sampling ops agree (%s)", why);
    check(ok, what, NULL);
    cpu_ops = b->ops;
    const char *names[] = {"op_logit_edit", "op_logit_mask", "op_logit_mass", "op_logit_lse", "op_topk", "op_argmax"};
    for (int k = 0; k < 6; k++) {
        struct backend_ops bad = *cpu_ops;
        if (k == 0) bad.logit_edit = bad_edit;
        if (k == 1) bad.logit_mask = bad_mask;
        if (k == 2) bad.logit_mass = bad_mass;
        if (k == 3) bad.logit_lse = bad_lse;
        if (k == 4) bad.topk = bad_topk;
        if (k == 5) bad.argmax = bad_argmax;
        b->ops = &bad;
        ok = sampler_device_check(b, why, sizeof why);
        b->ops = cpu_ops;
        snprintf(what, sizeof what, "sampler_device_check: a wrong %s is refused, named (%s)", names[k], why);
        check(!ok && strstr(why, names[k]), what, NULL);
    }
    backend_close(b);
}

/* Every way's decided draws are the host's at its tolerance (the exact one where the weights are
 * the host's bits; nearly every draw decided there), and its margins within the bound its
 * tolerance assumes (1.2e-10 of the total, 8.4e-7); weights 3 ulp off move them past the exact
 * tolerance (what SAMPLER_DRAW_TOL is for); sampler_draw_tolerance finds the CPU backend exact. */
static void check_draw(void)
{
    struct sampler whole;
    struct backend *b = NULL;
    if (sampler_init(&whole, DRAW_V) != STATUS_OK || backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK) {
        check(0, "op_logit_draw: a sampler and a CPU backend", NULL);
        return;
    }
    const char *names[] = {"the CPU op", "CUDA's algorithm", "exp in double", "weights 3 ulp off"};
    const double tols[] = {SAMPLER_DRAW_TOL_EXACT, SAMPLER_DRAW_TOL_EXACT, SAMPLER_DRAW_TOL, SAMPLER_DRAW_TOL};
    for (int how = 0; how < 4; how++) {
        long decided, undecided;
        double moved;
        char d[256] = "", what[400];
        const long differ = draws_differ(how, tols[how], &whole, b, &decided, &undecided, &moved, d, sizeof d);
        const int exact = tols[how] == SAMPLER_DRAW_TOL_EXACT;
        const long need = exact ? 999 : 900; /* per mille decided */
        const double bound = exact ? 1.2e-10 : 8.4e-7;
        snprintf(what, sizeof what, "op_logit_draw (%s) at tolerance %g: %ld of %ld plain temperature draws decided, "
                 "each the whole row's token and random stream; margins within %.2g of the host's (bound %.2g)",
                 names[how], tols[how], decided, decided + undecided, moved, bound);
        check(differ == 0 && decided * 1000 >= (decided + undecided) * need && moved <= bound, what, differ ? d : NULL);
        if (how == 3) {
            snprintf(what, sizeof what, "weights 3 ulp off move margins by %.2g, past the exact tolerance %g", moved,
                     SAMPLER_DRAW_TOL_EXACT);
            check(moved > SAMPLER_DRAW_TOL_EXACT, what, NULL);
        }
    }
    { /* op_logit_lse on the CPU: the host's very log-probabilities, (x - m) - lse */
        static float row[DRAW_V], lp[DRAW_V];
        long same = 0, total = 0;
        for (unsigned seed = 1; seed <= 8; seed++) {
            struct rng g;
            rng_seed(&g, 777 + seed);
            for (int i = 0; i < DRAW_V; i++) row[i] = (float)seed * (rng_uniform(&g) - 0.5f) * 4.0f;
            float lse = 0.0f, want = 1.0f;
            struct tensor x = tensor_make(row, DTYPE_F32, DEVICE_CPU, 2, (int64_t)1, (int64_t)DRAW_V);
            struct tensor tl = tensor_make(&lse, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
            struct tensor tw = tensor_make(&want, DTYPE_F32, DEVICE_CPU, 1, (int64_t)1);
            op_logit_lse(b, &tl, &x, &tw);
            sampler_log_softmax(row, lp, DRAW_V);
            const float m = sampler_max(row, DRAW_V);
            for (int i = 0; i < DRAW_V; i++) same += (row[i] - m) - lse == lp[i], total++;
        }
        char w[160];
        snprintf(w, sizeof w, "op_logit_lse on the CPU gives the host's log-probabilities bit for bit: %ld of %ld", same,
                 total);
        check(same == total, w, NULL);
    }
    const double tol = sampler_draw_tolerance(b);
    char what[160];
    snprintf(what, sizeof what, "sampler_draw_tolerance: the CPU backend's weights are the host's bits (%g)", tol);
    check(tol == SAMPLER_DRAW_TOL_EXACT, what, NULL);
    /* a backend whose draws are not the host's tokens is refused: no draw taken */
    cpu_ops = b->ops;
    struct backend_ops wrong = *b->ops;
    const char *wrong_names[] = {"every draw", "only nucleus draws"};
    for (int k = 0; k < 2; k++) {
        wrong.logit_draw = k == 0 ? wrong_all : wrong_nucleus;
        b->ops = &wrong;
        const double t = sampler_draw_tolerance(b);
        b->ops = cpu_ops;
        snprintf(what, sizeof what, "sampler_draw_tolerance: a backend with %s a token off is refused (%g)",
                 wrong_names[k], t);
        check(isinf(t), what, NULL);
    }
    backend_close(b);
    sampler_free(&whole);
}

int main(void)
{
    struct sampler s;
    if (sampler_init(&s, V) != STATUS_OK) return 1;
    float x[V];
    make_logits(x, 1);
    int counts[V];
    char detail[256];

    /* Greedy. */
    struct sampling_params p = sampling_params_default();
    p.temperature = 0;
    int best = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[best]) best = i;
    histogram(&s, &p, x, 100, counts);
    check(counts[best] == 100, "temperature 0 is argmax", NULL);
    /* Greedy's edge cases against the one-pass rule (the first index of the largest logit that
     * is not NaN, 0 when all are NaN), lengths on both sides of the eight-wide pass. */
    {
        struct sampler g;
        const float inf = INFINITY, nan = NAN;
        static const struct {
            int n;
            float v[19];
        } cases[] = {{1, {nan}},
                     {3, {nan, nan, nan}},
                     {9, {nan, -inf, -inf, nan, nan, nan, nan, nan, -inf}},
                     {10, {1, 3, 3, 2, 0, 0, 0, 0, 0, 3}},
                     {19, {nan, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5}},
                     {8, {-1, -2, inf, 7, inf, nan, 0, 1}},
                     {17, {-5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -5, -4}},
                     {16, {2, nan, 9, 1, 1, 1, 1, 1, 9, 1, 1, 1, 1, 1, 1, 1}}};
        int ok = 1;
        char d[96] = "";
        for (size_t c = 0; c < sizeof cases / sizeof *cases && ok; c++) {
            const int n = cases[c].n;
            int want = 0;
            for (int i = 1; i < n; i++)
                if (cases[c].v[i] > cases[c].v[want] || (isnan(cases[c].v[want]) && !isnan(cases[c].v[i]))) want = i;
            float buf[19];
            memcpy(buf, cases[c].v, sizeof buf);
            struct rng r;
            rng_seed(&r, 1);
            if (sampler_init(&g, n) != STATUS_OK) return 1;
            const int got = sampler_sample(&g, &p, &r, buf, NULL, 0, NULL, 0);
            sampler_free(&g);
            if (got != want) ok = 0, snprintf(d, sizeof d, "case %zu: %d, want %d", c, got, want);
        }
        check(ok, "temperature 0: first of equal maxima, NaN never chosen over a number, all NaN 0", ok ? NULL : d);
        const float fin[9] = {0, 1, -1, 3.4e38f, -3.4e38f, 1e-45f, 0, 0, 0};
        float bad[9];
        int finite_ok = sampler_logits_finite(fin, 9);
        for (int k = 0; k < 9; k++)
            for (int w = 0; w < 3; w++) {
                memcpy(bad, fin, sizeof bad);
                bad[k] = w == 0 ? inf : w == 1 ? -inf : nan;
                finite_ok &= !sampler_logits_finite(bad, 9);
            }
        check(finite_ok, "sampler_logits_finite: finite rows pass, an Inf, -Inf or NaN anywhere fails", NULL);
    }

    /* Chi-square at temperature 1: 50 categories, 49 dof; the 0.999 quantile is 85.4. */
    p = sampling_params_default();
    p.seed = 12345;
    const int N = 200000;
    histogram(&s, &p, x, N, counts);
    double prob[V], chi2 = 0;
    softmax(x, 1.0, prob);
    for (int i = 0; i < V; i++) chi2 += (counts[i] - N * prob[i]) * (counts[i] - N * prob[i]) / (N * prob[i]);
    snprintf(detail, sizeof detail, "chi2 %.1f with 49 degrees of freedom (0.999 quantile 85.4)", chi2);
    check(chi2 < 85.4, "temperature 1 matches softmax", detail);

    /* A wrong temperature would fail the same statistic. */
    p.temperature = 0.5f;
    histogram(&s, &p, x, N, counts);
    double chi_wrong = 0, chi_right = 0, p_half[V];
    softmax(x, 0.5, p_half);
    for (int i = 0; i < V; i++) {
        chi_wrong += (counts[i] - N * prob[i]) * (counts[i] - N * prob[i]) / (N * prob[i]);
        chi_right += (counts[i] - N * p_half[i]) * (counts[i] - N * p_half[i]) / (N * p_half[i]);
    }
    snprintf(detail, sizeof detail, "chi2 vs softmax(x/0.5) %.1f, vs softmax(x) %.0f", chi_right, chi_wrong);
    check(chi_right < 85.4 && chi_wrong > 1000, "temperature 0.5 matches softmax(x / 0.5)", detail);

    /* top-k: only the k largest. */
    p = sampling_params_default();
    p.top_k = 5;
    p.seed = 7;
    histogram(&s, &p, x, 20000, counts);
    int order[V];
    for (int i = 0; i < V; i++) order[i] = i;
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (x[order[j]] > x[order[i]]) { int t = order[i]; order[i] = order[j]; order[j] = t; }
    int outside = 0, used = 0;
    for (int r = 0; r < V; r++) {
        if (r >= 5) outside += counts[order[r]];
        else used += counts[order[r]] > 0;
    }
    snprintf(detail, sizeof detail, "%d draws outside the top 5, %d of the 5 used", outside, used);
    check(outside == 0 && used == 5, "top_k never emits excluded tokens", detail);

    /* top-p: the smallest prefix with mass >= p. */
    p = sampling_params_default();
    p.top_p = 0.6f;
    p.seed = 8;
    double cum = 0;
    int keep = 0;
    while (cum < 0.6) cum += prob[order[keep++]];
    histogram(&s, &p, x, 20000, counts);
    outside = 0;
    for (int r = keep; r < V; r++) outside += counts[order[r]];
    snprintf(detail, sizeof detail, "nucleus of %d tokens, %d draws outside", keep, outside);
    check(outside == 0 && counts[order[keep - 1]] > 0, "top_p never emits excluded tokens", detail);

    /* min-p: drop tokens below min_p * p_max. */
    p = sampling_params_default();
    p.min_p = 0.3f;
    p.seed = 9;
    histogram(&s, &p, x, 20000, counts);
    outside = 0;
    int allowed = 0;
    for (int i = 0; i < V; i++) {
        int ok = prob[i] >= 0.3 * prob[order[0]];
        allowed += ok;
        if (!ok) outside += counts[i];
    }
    snprintf(detail, sizeof detail, "%d allowed, %d draws outside", allowed, outside);
    check(outside == 0, "min_p never emits excluded tokens", detail);

    /* Penalties: exact arithmetic on the logits the sampler sees (greedy shows the edit). */
    float y[V];
    for (int i = 0; i < V; i++) y[i] = 0.0f;
    y[3] = 2.0f;
    y[4] = -1.0f;
    int32_t prompt[] = {3}, out[] = {4, 4, 7};
    struct sampling_params q = sampling_params_default();
    q.temperature = 0;
    q.repetition_penalty = 2.0f;
    q.presence_penalty = 0.5f;
    q.frequency_penalty = 0.25f;
    struct rng r;
    rng_seed(&r, 1);
    sampler_sample(&s, &q, &r, y, prompt, 1, out, 3);
    /* token 3 (prompt): 2 / 2 = 1; token 4 (output x2): -1 * 2 - 0.5 - 0.25 * 2 = -3;
     * token 7 (output x1): 0 * 2 - 0.5 - 0.25 = -0.75; others unchanged. */
    snprintf(detail, sizeof detail, "logit[3] %g logit[4] %g logit[7] %g logit[0] %g", y[3], y[4], y[7], y[0]);
    check(fabsf(y[3] - 1.0f) < 1e-6f && fabsf(y[4] + 3.0f) < 1e-6f && fabsf(y[7] + 0.75f) < 1e-6f && y[0] == 0.0f,
          "repetition, presence and frequency penalties as specified", detail);
    int clean = 1;
    for (int i = 0; i < V; i++) clean &= s.counts[i] == 0;
    check(clean, "penalty bookkeeping is cleared after use", NULL);

    /* The RNG stream depends only on the seed. */
    struct rng a, b;
    rng_seed(&a, 99);
    rng_seed(&b, 99);
    int same = 1;
    for (int i = 0; i < 1000; i++) same &= rng_next(&a) == rng_next(&b);
    rng_seed(&b, 100);
    check(same && rng_next(&a) != rng_next(&b), "seeded streams repeat and differ by seed", NULL);

    /* Validation names the field. */
    struct sampling_params bad = sampling_params_default();
    bad.top_p = 1.5f;
    check(sampling_params_validate(&bad) == STATUS_INVALID_ARGUMENT && strstr(status_message(), "top_p"),
          "top_p out of range is rejected by name", status_message());
    bad = sampling_params_default();
    bad.temperature = NAN;
    check(sampling_params_validate(&bad) == STATUS_INVALID_ARGUMENT && strstr(status_message(), "temperature"),
          "NaN temperature is rejected by name", status_message());

    check_exp();
    check_filters_large();
    check_top();
    check_nucleus();
    check_draw();
    check_device_ops();
    check_nucleus_draw();
    sampler_free(&s);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
