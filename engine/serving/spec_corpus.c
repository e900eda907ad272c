/* engine/serving/spec_corpus.c - the corpus drafter's suffix array and its rule (spec_corpus.h).
 * Tests: tests/test_spec_corpus.c (the rule against a scan of every position). */
#include "spec_corpus.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct spec_corpus {
    int32_t *ids;   /* (n + SPEC_CORPUS_SPAN) the texts, each ended by -1; -1 padding after */
    uint32_t *scope; /* (n + SPEC_CORPUS_SPAN) each id's text's scope (0: every request's) */
    int64_t  n_scoped; /* ids of texts of a scope other than 0: none, and drafting skips the filter */
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

static enum status out_of_memory(int64_t n)
{
    return status_errorf(STATUS_RESOURCE_EXHAUSTED, "spec corpus: out of host memory for %lld ids", (long long)n);
}

enum status spec_corpus_new(const int32_t *ids, int64_t n, const uint32_t *text_scope, struct spec_corpus **out)
{
    *out = NULL;
    struct spec_corpus *c = calloc(1, sizeof *c);
    if (!c) return out_of_memory(n);
    const enum status st = spec_corpus_append(c, ids, n, text_scope);
    if (st != STATUS_OK) {
        spec_corpus_free(c);
        return st;
    }
    *out = c;
    return STATUS_OK;
}

/* The old positions keep their order when texts are appended: a comparison stops at a text's
 * -1, so no old position's span reaches the new ids, and every new position is above every old
 * one (cmp_pos's tie-break). So the new positions are sorted alone and merged in from the back:
 * the index is the one spec_corpus_new makes of all the texts at once. */
enum status spec_corpus_append(struct spec_corpus *c, const int32_t *ids, int64_t n, const uint32_t *text_scope)
{
    if (n < 2 || ids[n - 1] != -1 || n > INT32_MAX - SPEC_CORPUS_SPAN - c->n)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec corpus: %lld ids, %s", (long long)n,
                             n < 2 ? "fewer than one text" : n > INT32_MAX - SPEC_CORPUS_SPAN - c->n ? "too many" : "the last text not ended by -1");
    int64_t add_sa = 0, add_texts = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < -1) return status_errorf(STATUS_INVALID_ARGUMENT, "spec corpus: id %d at %lld", ids[i], (long long)i);
        add_sa += ids[i] >= 0;
        add_texts += ids[i] < 0;
    }
    int32_t *grown = realloc(c->ids, (size_t)(c->n + n + SPEC_CORPUS_SPAN) * sizeof *c->ids);
    if (!grown) return out_of_memory(c->n + n);
    c->ids = grown; /* (its old ids and padding kept: c is unchanged until the end) */
    uint32_t *scopes = realloc(c->scope, (size_t)(c->n + n + SPEC_CORPUS_SPAN) * sizeof *c->scope);
    if (!scopes) return out_of_memory(c->n + n);
    c->scope = scopes;
    grown = realloc(c->sa, (size_t)(c->n_sa + add_sa ? c->n_sa + add_sa : 1) * sizeof *c->sa);
    if (!grown) return out_of_memory(c->n + n);
    c->sa = grown;
    int32_t *fresh = malloc((size_t)(add_sa ? 2 * add_sa : 1) * sizeof *fresh); /* and the sort's scratch */
    if (!fresh) return out_of_memory(c->n + n);
    memcpy(c->ids + c->n, ids, (size_t)n * sizeof *ids);
    for (int k = 0; k < SPEC_CORPUS_SPAN; k++) c->ids[c->n + n + k] = -1, c->scope[c->n + n + k] = 0;
    for (int64_t i = 0, t = 0; i < n; i++) { /* each id takes its text's scope */
        c->scope[c->n + i] = text_scope ? text_scope[t] : 0;
        c->n_scoped += c->scope[c->n + i] != 0;
        t += ids[i] < 0;
    }
    int64_t j = 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] >= 0) fresh[j++] = (int32_t)(c->n + i);
    sort_positions(c->ids, fresh, fresh + add_sa, add_sa);
    for (int64_t a = c->n_sa - 1, b = add_sa - 1, k = c->n_sa + add_sa - 1; b >= 0; k--)
        c->sa[k] = a >= 0 && cmp_pos(c->ids, c->sa[a], fresh[b]) > 0 ? c->sa[a--] : fresh[b--];
    free(fresh);
    c->n += n, c->n_sa += add_sa, c->n_texts += add_texts;
    return STATUS_OK;
}

/* The survivors keep their order: their spans are unchanged (each stops at its own text's -1)
 * and moving the later ones down by the same amount keeps every tie-break. */
int64_t spec_corpus_forget(struct spec_corpus *c, int64_t from, int64_t n_min)
{
    if (from < 0 || from >= c->n || (from > 0 && c->ids[from - 1] >= 0) || n_min <= 0) return 0;
    int64_t to = from + n_min < c->n ? from + n_min : c->n;
    while (c->ids[to - 1] >= 0) to++; /* to the end of the text (ids[n - 1] is -1) */
    const int64_t gone = to - from;
    int64_t texts = 0;
    for (int64_t i = from; i < to; i++) texts += c->ids[i] < 0, c->n_scoped -= c->scope[i] != 0;
    memmove(c->ids + from, c->ids + to, (size_t)(c->n + SPEC_CORPUS_SPAN - to) * sizeof *c->ids);
    memmove(c->scope + from, c->scope + to, (size_t)(c->n + SPEC_CORPUS_SPAN - to) * sizeof *c->scope);
    int64_t k = 0;
    for (int64_t i = 0; i < c->n_sa; i++) {
        const int32_t p = c->sa[i];
        if (p < from) c->sa[k++] = p;
        else if (p >= to) c->sa[k++] = (int32_t)(p - gone);
    }
    c->n -= gone, c->n_sa = k, c->n_texts -= texts;
    return gone;
}

void spec_corpus_free(struct spec_corpus *c)
{
    if (!c) return;
    free(c->ids);
    free(c->scope);
    free(c->sa);
    free(c);
}

int64_t spec_corpus_tokens(const struct spec_corpus *c) { return c->n_sa; }
int64_t spec_corpus_ids(const struct spec_corpus *c) { return c->n; }
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

/* Whether the position p may draft for a request of scope `scope`: its text is every request's
 * (scope 0) or of the same scope. */
static inline int allowed(const struct spec_corpus *c, int32_t p, uint32_t scope)
{
    return !c->scope[p] || c->scope[p] == scope;
}

/* Whether [lo, hi) (the occurrences of a match of n tokens) holds one that the scope allows and
 * whose text goes on after the match. */
static int goes_on(const struct spec_corpus *c, int64_t lo, int64_t hi, int n, uint32_t scope)
{
    if (!c->n_scoped) return lo < hi && c->ids[c->sa[hi - 1] + n] >= 0; /* those that end sort first */
    for (int64_t i = hi; i-- > lo;) {
        const int32_t p = c->sa[i];
        if (c->ids[p + n] < 0) return 0;
        if (allowed(c, p, scope)) return 1;
    }
    return 0;
}

int spec_corpus_draft(const struct spec_corpus *c, const int32_t *ctx, int n_ctx, int n_min, float p_min, int max,
                      uint32_t scope, int32_t *out, int *matched)
{
    if (matched) *matched = 0;
    if (n_min < 1) n_min = 1;
    if (max > SPEC_CORPUS_SPAN - SPEC_CORPUS_MAX_MATCH) max = SPEC_CORPUS_SPAN - SPEC_CORPUS_MAX_MATCH;
    /* n*: the longest match with an occurrence that the scope allows and that goes on. */
    int best = 0;
    int64_t lo = 0, hi = 0;
    const int top = n_ctx < SPEC_CORPUS_MAX_MATCH ? n_ctx : SPEC_CORPUS_MAX_MATCH;
    for (int n = n_min; n <= top; n++) {
        int64_t l, h;
        find_range(c, ctx + n_ctx - n, n, &l, &h);
        if (!goes_on(c, l, h, n, scope)) break;
        best = n, lo = l, hi = h;
    }
    if (!best) return 0;
    if (matched) *matched = best;
    while (c->ids[c->sa[lo] + best] < 0) lo++; /* the occurrences are those that go on */
    /* Walk down: within [lo, hi) the ids at offset o are sorted, so each token's occurrences are
     * one run; the run of the most allowed occurrences (the first of equal ones: the smallest id)
     * is the draft, its share those over every allowed occurrence of [lo, hi). */
    double share = 1.0;
    int k = 0;
    for (int o = best; k < max; o++) {
        int64_t run_lo = lo, run_end = lo, run_n = 0, total = 0;
        for (int64_t i = lo; i < hi;) {
            const int32_t t = c->ids[c->sa[i] + o];
            int64_t j = i, n_ok = 0;
            for (; j < hi && c->ids[c->sa[j] + o] == t; j++) n_ok += !c->n_scoped || allowed(c, c->sa[j], scope);
            total += n_ok;
            if (t >= 0 && n_ok > run_n) run_lo = i, run_end = j, run_n = n_ok;
            i = j;
        }
        if (!run_n) break;
        share *= (double)run_n / (double)total;
        if (share < (double)p_min) break;
        out[k++] = c->ids[c->sa[run_lo] + o];
        lo = run_lo, hi = run_end;
    }
    return k;
}

const int32_t *spec_corpus_id_data(const struct spec_corpus *c, int64_t from, int64_t *n)
{
    *n = from < c->n ? c->n - from : 0;
    return c->ids + (from < c->n ? from : c->n);
}

const uint32_t *spec_corpus_scope_data(const struct spec_corpus *c, int64_t from)
{
    return c->scope + (from < c->n ? from : c->n);
}

/* The kept corpus's file (spec_corpus.h). */
#define KEEP_MAGIC   "SHLMSPC1"
#define KEEP_VERSION 2 /* 1: no scopes (every text every request's) */
#define KEEP_HEADER  32 /* magic 8, version 4, vocab 4, fingerprint 8, n 8 */

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

enum status spec_corpus_file_write(const char *path, int32_t vocab, uint64_t fingerprint, const int32_t *ids,
                                   const uint32_t *scope, int64_t n)
{
    int64_t texts = 0;
    for (int64_t i = 0; i < n; i++) texts += ids[i] < 0;
    const size_t body = 4 * (size_t)n + 4 * (size_t)texts, size = KEEP_HEADER + body + 8;
    unsigned char *b = malloc(size);
    if (!b) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of host memory for %lld ids", path, (long long)n);
    memcpy(b, KEEP_MAGIC, 8);
    put_le(b + 8, KEEP_VERSION, 4);
    put_le(b + 12, (uint32_t)vocab, 4);
    put_le(b + 16, fingerprint, 8);
    put_le(b + 24, (uint64_t)n, 8);
    unsigned char *t = b + KEEP_HEADER + 4 * (size_t)n; /* each text's scope, at its end */
    for (int64_t i = 0; i < n; i++) {
        put_le(b + KEEP_HEADER + 4 * i, (uint32_t)ids[i], 4);
        if (ids[i] < 0) put_le(t, scope ? scope[i] : 0, 4), t += 4;
    }
    put_le(b + KEEP_HEADER + body, base_fnv1a(BASE_FNV1A_BASIS, b + KEEP_HEADER, body), 8);
    /* Mode 0600: the answers it holds are the users'. Processes that keep the same file (generate
     * runs at once) never write into each other's temporary; the last rename wins. */
    enum status st = base_write_file(path, b, size, 0600);
    free(b);
    return st;
}

enum status spec_corpus_file_read(const char *path, int32_t vocab, uint64_t fingerprint, int32_t **ids,
                                  uint32_t **text_scope, int64_t *n)
{
    *ids = NULL, *text_scope = NULL, *n = 0;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return STATUS_OK; /* nothing kept yet */
    char *text = NULL;
    size_t len = 0;
    enum status st = base_read_file(path, (size_t)KEEP_HEADER + 8 * (size_t)SPEC_LEARN_MAX * 2 + 8, "kept corpus",
                                    &text, &len);
    if (st != STATUS_OK) return st;
    const unsigned char *b = (const unsigned char *)text;
    if (len == 0) { /* nothing to lose (a file made empty by a crash before the sync): an empty start */
        free(text);
        return STATUS_OK;
    }
    if (len < 8 || memcmp(b, KEEP_MAGIC, 8) != 0) {
        free(text);
        return status_errorf(STATUS_FAILED_PRECONDITION, "%s is there and is not a kept speculative corpus (no %s "
                             "header): it is left as it is; name another file", path, KEEP_MAGIC);
    }
    const uint64_t version = len >= KEEP_HEADER ? get_le(b + 8, 4) : 0, count = len >= KEEP_HEADER ? get_le(b + 24, 8) : 0;
    /* Version 1 has no scopes; version 2 one per text after the ids (counted once the ids are read). */
    uint64_t texts = 0;
    if (len >= KEEP_HEADER && count <= (uint64_t)SPEC_LEARN_MAX * 2 && len >= KEEP_HEADER + 4 * count)
        for (uint64_t i = 0; i < count; i++) texts += (int32_t)get_le(b + KEEP_HEADER + 4 * i, 4) < 0;
    const uint64_t body = 4 * count + (version == 2 ? 4 * texts : 0);
    if (len < KEEP_HEADER || (version != 1 && version != 2) || count > (uint64_t)SPEC_LEARN_MAX * 2 ||
        len != KEEP_HEADER + body + 8)
        st = status_errorf(STATUS_BAD_FORMAT, "%s: a kept speculative corpus cut short or of another version (%zu "
                           "bytes, version %llu, %llu ids)", path, len, (unsigned long long)version,
                           (unsigned long long)count);
    else if ((int32_t)get_le(b + 12, 4) != vocab || get_le(b + 16, 8) != fingerprint)
        st = status_errorf(STATUS_FAILED_PRECONDITION, "%s was kept by a model with another tokenizer (vocabulary "
                           "%d, fingerprint %016llx; this one %d, %016llx): its drafts would not fit; remove it or "
                           "name another file", path, (int32_t)get_le(b + 12, 4),
                           (unsigned long long)get_le(b + 16, 8), vocab, (unsigned long long)fingerprint);
    else if (base_fnv1a(BASE_FNV1A_BASIS, b + KEEP_HEADER, body) != get_le(b + KEEP_HEADER + body, 8))
        st = status_errorf(STATUS_BAD_FORMAT, "%s: the kept ids do not match their checksum (the file was altered)",
                           path);
    int32_t *out = st == STATUS_OK && count ? malloc(count * sizeof *out) : NULL;
    uint32_t *scopes = st == STATUS_OK && version == 2 && texts ? calloc(texts, sizeof *scopes) : NULL;
    if (st == STATUS_OK && ((count && !out) || (version == 2 && texts && !scopes)))
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of host memory", path);
    for (uint64_t i = 0; st == STATUS_OK && i < count; i++) {
        out[i] = (int32_t)get_le(b + KEEP_HEADER + 4 * i, 4);
        if (out[i] < -1 || out[i] >= vocab || (i + 1 == count && out[i] != -1))
            st = status_errorf(STATUS_BAD_FORMAT, "%s: id %d at %llu is not a token or a text's end", path, out[i],
                               (unsigned long long)i);
    }
    for (uint64_t i = 0; st == STATUS_OK && version == 2 && i < texts; i++)
        scopes[i] = (uint32_t)get_le(b + KEEP_HEADER + 4 * count + 4 * i, 4);
    free(text);
    if (st != STATUS_OK) {
        free(out);
        free(scopes);
        return st;
    }
    *ids = out, *text_scope = scopes, *n = (int64_t)count;
    return STATUS_OK;
}
