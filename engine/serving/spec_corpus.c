/* engine/serving/spec_corpus.c - the corpus drafter's suffix array and its rule (spec_corpus.h).
 * Tests: tests/test_spec_corpus.c (the rule against a scan of every position). */
#include "spec_corpus.h"

#include <stdlib.h>
#include <string.h>

struct spec_corpus {
    int32_t *ids;   /* (n + SPEC_CORPUS_SPAN) the texts, each ended by -1; -1 padding after */
    int32_t *sa;    /* (n_sa) the positions of every id >= 0, sorted by their next SPEC_CORPUS_SPAN ids */
    int64_t  n, n_sa, n_texts;
};

/* Orders two positions by their ids up to SPEC_CORPUS_SPAN, a text's end (-1) first; equal
 * spans by position, so that the order is total and the same on every machine. */
static int cmp_pos(const int32_t *ids, int32_t a, int32_t b)
{
    for (int k = 0; k < SPEC_CORPUS_SPAN; k++) {
        const int32_t x = ids[a + k], y = ids[b + k];
        if (x != y) return x < y ? -1 : 1;
        if (x < 0) break;
    }
    return a < b ? -1 : a > b;
}

/* A bottom-up merge sort of sa[0..n) (tmp: n more), stable and without a global comparator. */
static void sort_positions(const int32_t *ids, int32_t *sa, int32_t *tmp, int64_t n)
{
    int32_t *src = sa, *dst = tmp;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = cmp_pos(ids, src[i], src[j]) <= 0 ? src[i++] : src[j++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int32_t *t = src;
        src = dst, dst = t;
    }
    if (src != sa) memcpy(sa, src, (size_t)n * sizeof *sa);
}

enum status spec_corpus_new(const int32_t *ids, int64_t n, struct spec_corpus **out)
{
    *out = NULL;
    if (n < 2 || ids[n - 1] != -1 || n > INT32_MAX - SPEC_CORPUS_SPAN)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec corpus: %lld ids, %s", (long long)n,
                             n < 2 ? "fewer than one text" : n > INT32_MAX - SPEC_CORPUS_SPAN ? "too many" : "the last text not ended by -1");
    int64_t n_sa = 0, n_texts = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < -1) return status_errorf(STATUS_INVALID_ARGUMENT, "spec corpus: id %d at %lld", ids[i], (long long)i);
        n_sa += ids[i] >= 0;
        n_texts += ids[i] < 0;
    }
    struct spec_corpus *c = calloc(1, sizeof *c);
    int32_t *tmp = NULL;
    if (c) c->ids = malloc((size_t)(n + SPEC_CORPUS_SPAN) * sizeof *c->ids);
    if (c && c->ids) c->sa = malloc((size_t)(n_sa ? n_sa : 1) * sizeof *c->sa);
    if (c && c->sa) tmp = malloc((size_t)(n_sa ? n_sa : 1) * sizeof *tmp);
    if (!tmp) {
        spec_corpus_free(c);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "spec corpus: out of host memory for %lld ids", (long long)n);
    }
    memcpy(c->ids, ids, (size_t)n * sizeof *ids);
    for (int k = 0; k < SPEC_CORPUS_SPAN; k++) c->ids[n + k] = -1;
    c->n = n, c->n_sa = n_sa, c->n_texts = n_texts;
    int64_t j = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0) c->sa[j++] = (int32_t)i;
    sort_positions(c->ids, c->sa, tmp, n_sa);
    free(tmp);
    *out = c;
    return STATUS_OK;
}

void spec_corpus_free(struct spec_corpus *c)
{
    if (!c) return;
    free(c->ids);
    free(c->sa);
    free(c);
}

int64_t spec_corpus_tokens(const struct spec_corpus *c) { return c->n_sa; }
int64_t spec_corpus_texts(const struct spec_corpus *c) { return c->n_texts; }

/* Compares the ids at position p with pat[0..n): < 0, 0 (p starts with pat), > 0. */
static int cmp_pat(const int32_t *ids, int32_t p, const int32_t *pat, int n)
{
    for (int k = 0; k < n; k++)
        if (ids[p + k] != pat[k]) return ids[p + k] < pat[k] ? -1 : 1;
    return 0;
}

/* The suffix array's range [*lo, *hi) of the positions that start with pat[0..n). */
static void find_range(const struct spec_corpus *c, const int32_t *pat, int n, int64_t *lo, int64_t *hi)
{
    int64_t a = 0, b = c->n_sa;
    while (a < b) { /* the first not below pat */
        const int64_t m = a + (b - a) / 2;
        if (cmp_pat(c->ids, c->sa[m], pat, n) < 0) a = m + 1;
        else b = m;
    }
    *lo = a;
    b = c->n_sa;
    while (a < b) { /* the first above it */
        const int64_t m = a + (b - a) / 2;
        if (cmp_pat(c->ids, c->sa[m], pat, n) <= 0) a = m + 1;
        else b = m;
    }
    *hi = a;
}

int spec_corpus_draft(const struct spec_corpus *c, const int32_t *ctx, int n_ctx, int n_min, float p_min, int max,
                      int32_t *out, int *matched)
{
    if (matched) *matched = 0;
    if (n_min < 1) n_min = 1;
    if (max > SPEC_CORPUS_SPAN - SPEC_CORPUS_MAX_MATCH) max = SPEC_CORPUS_SPAN - SPEC_CORPUS_MAX_MATCH;
    /* n*: the longest match whose occurrences go on (a position's text ends where the id at
     * offset n is -1: those sort first in the range, so the range goes on when its last does). */
    int best = 0;
    int64_t lo = 0, hi = 0;
    const int top = n_ctx < SPEC_CORPUS_MAX_MATCH ? n_ctx : SPEC_CORPUS_MAX_MATCH;
    for (int n = n_min; n <= top; n++) {
        int64_t l, h;
        find_range(c, ctx + n_ctx - n, n, &l, &h);
        if (l == h || c->ids[c->sa[h - 1] + n] < 0) break;
        best = n, lo = l, hi = h;
    }
    if (!best) return 0;
    if (matched) *matched = best;
    while (c->ids[c->sa[lo] + best] < 0) lo++; /* the occurrences are those that go on */
    /* Walk down: within [lo, hi) the ids at offset o are sorted, so each token's occurrences are
     * one run; the longest run (the first of equal ones: the smallest id) is the draft. */
    double share = 1.0;
    int k = 0;
    for (int o = best; k < max; o++) {
        int64_t run_lo = lo, run_len = 0;
        for (int64_t i = lo; i < hi;) {
            const int32_t t = c->ids[c->sa[i] + o];
            int64_t j = i + 1;
            while (j < hi && c->ids[c->sa[j] + o] == t) j++;
            if (t >= 0 && j - i > run_len) run_lo = i, run_len = j - i;
            i = j;
        }
        if (!run_len) break;
        share *= (double)run_len / (double)(hi - lo);
        if (share < (double)p_min) break;
        out[k++] = c->ids[c->sa[run_lo] + o];
        lo = run_lo, hi = run_lo + run_len;
    }
    return k;
}
