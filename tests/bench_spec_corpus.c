/* tests/bench_spec_corpus.c - the cost of a draft from the corpus drafter (engine/serving/
 * spec_corpus.c) with scoped texts against the same corpus unscoped, in the same run: synthetic
 * corpora of 100K to 4M tokens (texts of 50-400 tokens over a skewed vocabulary of 8,000, so that
 * short matches have many occurrences), every text of scope 0 (the unscoped path), of one scope
 * (a server without API keys and one adapter), or of one of 64 scopes (64 tenants); queries are
 * the last 8 tokens before random positions, drafted for scope 1 (n_min 3, p_min 0.5, at most 8).
 * Prints the CPU, microseconds per draft and the ratio to the unscoped corpus.
 *
 * A benchmark, never a pass/fail gate: it exits 0 whatever the numbers are.
 * Run: bench_spec_corpus [--quick] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "sampler.h"
#include "spec_corpus.h"

/* Microseconds per draft over the queries (the best of three passes). */
static double time_drafts(const struct spec_corpus *c, const int32_t *ids, const int64_t *at, int n_q, int *drafted)
{
    double best = 1e30;
    for (int pass = 0; pass < 3; pass++) {
        int total = 0;
        const double t0 = bench_now_s();
        for (int q = 0; q < n_q; q++) {
            int32_t out[SPEC_CORPUS_SPAN];
            total += spec_corpus_draft(c, ids + at[q] - 8, 8, 3, 0.5f, 8, 1, out, NULL);
        }
        const double us = (bench_now_s() - t0) * 1e6 / n_q;
        if (us < best) best = us;
        *drafted = total;
    }
    return best;
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    char cpu[256];
    bench_cpu_model(cpu, sizeof cpu);
    printf("bench_spec_corpus: %s\n", cpu);
    struct rng r;
    rng_seed(&r, 7);
    const int64_t sizes[] = {100000, 1000000, 4000000};
    const int n_sizes = quick ? 2 : 3, n_q = quick ? 2000 : 10000;
    for (int si = 0; si < n_sizes; si++) {
        const int64_t cap = sizes[si];
        int32_t *ids = malloc((size_t)(cap + 512) * sizeof *ids);
        uint32_t *one = malloc((size_t)cap * sizeof *one), *many = malloc((size_t)cap * sizeof *many);
        int64_t *at = malloc((size_t)n_q * sizeof *at);
        if (!ids || !one || !many || !at) return 1;
        int64_t n = 0, texts = 0;
        while (n < cap - 401) {
            const int len = 50 + (int)(rng_uniform(&r) * 350);
            for (int i = 0; i < len; i++) {
                const float u = rng_uniform(&r);
                ids[n++] = (int32_t)(8000.0f * u * u * u); /* skewed: common tokens repeat */
            }
            ids[n++] = -1;
            one[texts] = 1;
            many[texts] = 1 + (uint32_t)(rng_uniform(&r) * 64);
            texts++;
        }
        for (int q = 0; q < n_q; q++) {
            int64_t p;
            do p = 8 + (int64_t)(rng_uniform(&r) * (float)(n - 16));
            while (ids[p - 1] < 0 || ids[p - 2] < 0 || ids[p - 3] < 0 || ids[p - 4] < 0 || ids[p - 5] < 0 ||
                   ids[p - 6] < 0 || ids[p - 7] < 0 || ids[p - 8] < 0);
            at[q] = p;
        }
        struct spec_corpus *c0 = NULL, *c1 = NULL, *c64 = NULL;
        if (spec_corpus_new(ids, n, NULL, &c0) || spec_corpus_new(ids, n, one, &c1) ||
            spec_corpus_new(ids, n, many, &c64)) {
            printf("spec_corpus_new: %s\n", status_message());
            return 1;
        }
        int d0, d1, d64;
        const double t0 = time_drafts(c0, ids, at, n_q, &d0), t1 = time_drafts(c1, ids, at, n_q, &d1);
        const double t64 = time_drafts(c64, ids, at, n_q, &d64);
        printf("  %7lld tokens, %6lld texts: unscoped %6.2f us/draft (%d drafted) | one scope %6.2f us (%.2fx, %d) | "
               "64 scopes %6.2f us (%.2fx, %d)\n",
               (long long)(n - texts), (long long)texts, t0, d0, t1, t1 / t0, d1, t64, t64 / t0, d64);
        spec_corpus_free(c0), spec_corpus_free(c1), spec_corpus_free(c64);
        free(ids), free(one), free(many), free(at);
    }
    return 0;
}
