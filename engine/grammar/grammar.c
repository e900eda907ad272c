/* engine/grammar/grammar.c - the public face of the grammar engine: the vocabulary view (every
 * token's bytes, sorted with common prefixes for trie walks), compiling a source of each kind,
 * reference counting, the compiled-grammar LRU cache, choice lists.
 * Not here: the automaton and masks (grammar_pda.c), the front ends. Tests: tests/test_grammar.c. */
#define _GNU_SOURCE /* qsort_r */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "tokenizer.h"

int grammar_vocab_mask_words(const struct grammar_vocab *v) { return (v->model_vocab + 31) / 32; }

static int cmp_tokens(const void *a, const void *b, void *ctx)
{
    const struct grammar_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return (x > y) - (x < y);
}

enum status grammar_vocab_new(const struct tokenizer *t, int model_vocab, const int32_t *end_ids, int n_end,
                              struct grammar_vocab **out)
{
    *out = NULL;
    int n_tok = tokenizer_vocab_size(t);
    char **pieces = calloc((size_t)n_tok + 1, sizeof *pieces);
    int *lens = calloc((size_t)n_tok + 1, sizeof *lens);
    enum status s = STATUS_OK;
    if (!pieces || !lens) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    char buf[1024];
    for (int i = 0; i < n_tok && !s; i++) {
        int n = tokenizer_token_bytes(t, i, buf, (int)sizeof buf);
        lens[i] = n < 0 ? 0 : n; /* a piece over 1 KiB: never allowed */
        if (!(pieces[i] = malloc((size_t)lens[i] + 1))) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        else memcpy(pieces[i], buf, (size_t)lens[i]);
    }
    if (!s) s = grammar_vocab_new_bytes((const char *const *)pieces, lens, n_tok, model_vocab, end_ids, n_end, out);
    for (int i = 0; pieces && i < n_tok; i++) free(pieces[i]);
    free(pieces), free(lens);
    return s;
}

enum status grammar_vocab_new_bytes(const char *const *tokens, const int *lens, int n_tok, int model_vocab,
                                    const int32_t *end_ids, int n_end, struct grammar_vocab **out)
{
    *out = NULL;
    if (n_tok < 0 || model_vocab < n_tok || n_end < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: model vocabulary %d smaller than the tokenizer's %d",
                             model_vocab, n_tok);
    for (int i = 0; i < n_end; i++)
        if (end_ids[i] < 0 || end_ids[i] >= model_vocab)
            return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: end id %d out of range", (int)end_ids[i]);
    struct grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    v->n_tok = n_tok, v->model_vocab = model_vocab;
    v->off = malloc(sizeof *v->off * ((size_t)n_tok + 1));
    v->end_ids = malloc(sizeof *v->end_ids * (size_t)(n_end ? n_end : 1));
    v->sorted = malloc(sizeof *v->sorted * (size_t)(n_tok ? n_tok : 1));
    v->lcp = malloc(sizeof *v->lcp * (size_t)(n_tok ? n_tok : 1));
    size_t cap = 0, used = 0;
    enum status s = STATUS_OK;
    if (!v->off || !v->end_ids || !v->sorted || !v->lcp) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    for (int i = 0; i < n_tok && !s; i++) {
        v->off[i] = (uint32_t)used;
        int n = lens[i];
        for (int j = 0; j < n_end; j++)
            if (end_ids[j] == i) n = 0;
        if (base_grow((void **)&v->bytes, &cap, used + (size_t)n + 1, 1)) {
            s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
            break;
        }
        if (n) memcpy(v->bytes + used, tokens[i], (size_t)n);
        used += (size_t)n;
        if (n > v->max_len) v->max_len = n;
        if (n) v->sorted[v->n_sorted++] = i;
    }
    if (s) {
        grammar_vocab_free(v);
        return s;
    }
    v->off[n_tok] = (uint32_t)used;
    memcpy(v->end_ids, end_ids, sizeof *end_ids * (size_t)n_end);
    v->n_end = n_end;
    qsort_r(v->sorted, (size_t)v->n_sorted, sizeof *v->sorted, cmp_tokens, v);
    v->soff = malloc(sizeof *v->soff * ((size_t)v->n_sorted + 1));
    v->sbytes = malloc(used ? used : 1);
    if (!v->soff || !v->sbytes) {
        grammar_vocab_free(v);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    }
    size_t at = 0;
    for (int i = 0; i < v->n_sorted; i++) {
        int32_t id = v->sorted[i];
        v->soff[i] = (uint32_t)at;
        memcpy(v->sbytes + at, v->bytes + v->off[id], v->off[id + 1] - v->off[id]);
        at += v->off[id + 1] - v->off[id];
    }
    v->soff[v->n_sorted] = (uint32_t)at;
    v->skip = malloc(sizeof *v->skip * (at ? at : 1));
    if (!v->skip) {
        grammar_vocab_free(v);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    }
    for (int i = 0; i < v->n_sorted; i++) {
        if (!i) { v->lcp[i] = 0; continue; }
        int32_t a = v->sorted[i - 1], b = v->sorted[i];
        uint32_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b], k = 0;
        while (k < la && k < lb && v->bytes[v->off[a] + k] == v->bytes[v->off[b] + k]) k++;
        v->lcp[i] = (int32_t)k;
    }
    /* end(i, d) = i+1 when token i+1 differs within the first d+1 bytes, else end(i+1, d). */
    for (int i = v->n_sorted - 1; i >= 0; i--) {
        uint32_t len = v->soff[i + 1] - v->soff[i];
        for (uint32_t d = 0; d < len; d++)
            v->skip[v->soff[i] + d] = i + 1 == v->n_sorted || (uint32_t)v->lcp[i + 1] <= d ? i + 1 : v->skip[v->soff[i + 1] + d];
    }
    *out = v;
    return STATUS_OK;
}

/* The bytes of token id (NULL and 0 for ids without any), for tests and tools. */
const char *grammar_vocab_token(const struct grammar_vocab *v, int32_t id, int *len)
{
    if (id < 0 || id >= v->n_tok) return *len = 0, NULL;
    *len = (int)(v->off[id + 1] - v->off[id]);
    return (const char *)v->bytes + v->off[id];
}

void grammar_vocab_free(struct grammar_vocab *v)
{
    if (!v) return;
    free(v->off), free(v->bytes), free(v->sorted), free(v->lcp), free(v->end_ids), free(v->soff), free(v->sbytes), free(v->skip);
    free(v);
}

/* ---- choice lists ---- */
enum status choice_build(struct gbuild *b, const char *src, size_t n, int *root)
{
    cJSON *j = cJSON_ParseWithLength(src, n);
    if (!j || !cJSON_IsArray(j) || cJSON_GetArraySize(j) == 0) {
        cJSON_Delete(j);
        return gb_fail(b, STATUS_INVALID_ARGUMENT, "choice: expected a non-empty JSON array of strings");
    }
    int k = cJSON_GetArraySize(j), i = 0;
    struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)k);
    for (cJSON *e = j->child; e && alts; e = e->next, i++) {
        if (!cJSON_IsString(e)) {
            cJSON_Delete(j);
            return gb_fail(b, STATUS_INVALID_ARGUMENT, "choice: element %d is not a string", i);
        }
        alts[i] = gx_str(b, e->valuestring);
    }
    cJSON_Delete(j);
    *root = gb_rule(b, "root");
    if (*root >= 0 && alts) b->rules[*root].expr = gx_alt(b, k, alts);
    return (enum status)b->failed;
}

/* ---- compile ---- */
enum status grammar_parse(const struct grammar_vocab *v, enum grammar_kind kind, const char *src, size_t n,
                          struct grammar **out)
{
    *out = NULL;
    struct gbuild b;
    gb_init(&b);
    int root = -1;
    enum status s;
    if (!src && n) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: no source");
    switch (kind) {
    case GRAMMAR_JSON_SCHEMA: s = schema_build(&b, src, n, 0, &root); break;
    case GRAMMAR_JSON_OBJECT: s = schema_build(&b, NULL, 0, 1, &root); break;
    case GRAMMAR_EBNF: s = gbnf_parse(&b, src, n, &root); break;
    case GRAMMAR_CHOICE: s = choice_build(&b, src, n, &root); break;
    case GRAMMAR_REGEX: {
        struct gx *x = NULL;
        s = regex_parse(&b, src, n, 0, &x);
        root = gb_rule(&b, "root");
        if (!s && root >= 0) b.rules[root].expr = x;
        if (!s) s = (enum status)b.failed;
        break;
    }
    default: s = status_errorf(STATUS_INVALID_ARGUMENT, "grammar: unknown kind %d", (int)kind);
    }
    struct grammar *g = NULL;
    if (!s) {
        g = calloc(1, sizeof *g);
        if (!g) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    }
    if (!s) s = gflat_build(&b, root, &g->f);
    gb_free(&b);
    if (s) {
        free(g);
        return s;
    }
    g->refs = 1;
    g->vocab = v;
    pthread_mutex_init(&g->lock, NULL);
    *out = g;
    return STATUS_OK;
}

enum status grammar_compile(const struct grammar_vocab *v, enum grammar_kind kind, const char *src, size_t n,
                            struct grammar **out)
{
    struct grammar *g;
    enum status s = grammar_parse(v, kind, src, n, &g);
    *out = NULL;
    if (s) return s;
    /* The first step's mask, here on the compiling (submitting) thread: its entries stay cached
     * for every sequence, and a grammar too ambiguous to follow from its start is refused now,
     * before admission, instead of costing a decode step its work bound (about 0.2-0.3 s on a
     * real vocabulary: docs/grammar.md). */
    struct grammar_matcher *m = NULL;
    uint32_t *mask = malloc(sizeof *mask * (size_t)grammar_vocab_mask_words(v));
    s = mask ? grammar_matcher_new(g, &m) : status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    if (!s) s = grammar_matcher_fill_mask(m, mask);
    grammar_matcher_free(m);
    free(mask);
    if (s) {
        grammar_unref(g);
        return s;
    }
    *out = g;
    return STATUS_OK;
}

const struct grammar_vocab *grammar_vocab_of(const struct grammar *g) { return g->vocab; }

void grammar_ref(struct grammar *g)
{
    if (g) __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED);
}

void grammar_unref(struct grammar *g)
{
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) > 0) return;
    grammar_cache_entries_free(g);
    gflat_free(&g->f);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

/* ---- the compiled-grammar cache: a short list in LRU order (capacities are small) ---- */
struct cache_slot {
    enum grammar_kind kind;
    char             *src;
    size_t            n;
    struct grammar   *g;
    uint64_t          used;
};

struct grammar_cache {
    const struct grammar_vocab *v;
    pthread_mutex_t             lock;
    struct cache_slot          *slots; /* (capacity) */
    int                         capacity;
    uint64_t                    clock;
};

enum status grammar_cache_new(const struct grammar_vocab *v, int capacity, struct grammar_cache **out)
{
    *out = NULL;
    if (capacity < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar cache: capacity %d < 1", capacity);
    struct grammar_cache *c = calloc(1, sizeof *c);
    if (c) c->slots = calloc((size_t)capacity, sizeof *c->slots);
    if (!c || !c->slots) {
        free(c);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar cache: out of memory");
    }
    c->v = v, c->capacity = capacity;
    pthread_mutex_init(&c->lock, NULL);
    *out = c;
    return STATUS_OK;
}

void grammar_cache_free(struct grammar_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->capacity; i++) free(c->slots[i].src), grammar_unref(c->slots[i].g);
    pthread_mutex_destroy(&c->lock);
    free(c->slots), free(c);
}

static struct grammar *cache_find(struct grammar_cache *c, enum grammar_kind kind, const char *src, size_t n)
{
    for (int i = 0; i < c->capacity; i++) {
        struct cache_slot *s = &c->slots[i];
        if (s->g && s->kind == kind && s->n == n && (!n || !memcmp(s->src, src, n))) {
            s->used = ++c->clock;
            grammar_ref(s->g);
            return s->g;
        }
    }
    return NULL;
}

enum status grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *src, size_t n,
                              struct grammar **out)
{
    pthread_mutex_lock(&c->lock);
    *out = cache_find(c, kind, src, n);
    pthread_mutex_unlock(&c->lock);
    if (*out) return STATUS_OK;
    struct grammar *g;
    enum status s = grammar_compile(c->v, kind, src, n, &g);
    if (s) return s;
    char *copy = malloc(n ? n : 1);
    if (!copy) {
        grammar_unref(g);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar cache: out of memory");
    }
    if (n) memcpy(copy, src, n);
    pthread_mutex_lock(&c->lock);
    struct grammar *other = cache_find(c, kind, src, n);
    if (other) { /* compiled meanwhile by another thread */
        pthread_mutex_unlock(&c->lock);
        grammar_unref(g), free(copy);
        *out = other;
        return STATUS_OK;
    }
    int victim = 0;
    for (int i = 1; i < c->capacity; i++)
        if (c->slots[i].used < c->slots[victim].used) victim = i;
    struct cache_slot old = c->slots[victim];
    grammar_ref(g);
    c->slots[victim] = (struct cache_slot){kind, copy, n, g, ++c->clock};
    pthread_mutex_unlock(&c->lock);
    free(old.src), grammar_unref(old.g);
    *out = g;
    return STATUS_OK;
}
