/* engine/grammar/grammar_ir.c - the expression tree every front end builds, and the lowering to
 * the flat rule table (struct gflat) with its checks: undefined rules, rules that derive no
 * string, left recursion, size limits.
 * Not here: parsing any source text (grammar_gbnf.c, grammar_regex.c, grammar_schema.c); code
 * point sets and integer ranges as expressions (grammar_sets.c).
 * Tests: tests/test_grammar.c. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sanitizer/asan_interface.h> /* (its poisoning macros are no-ops without ASan) */

#include "grammar_impl.h"

/* The arena: allocations bump through 64 KiB chunks (one calloc each, so zeroed), a larger one
 * gets a block of its own. Under ASan each allocation is followed by a poisoned red zone, so that
 * an overflow between two is still reported (a calloc per node, as until 2026-12-02, cost the
 * compile a third of its time in Release and more under ASan). */
#if defined(__SANITIZE_ADDRESS__)
#define GB_REDZONE 16
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GB_REDZONE 16
#endif
#endif
#ifndef GB_REDZONE
#define GB_REDZONE 0
#endif
#define GB_CHUNK (64u << 10)
#define GB_BIG   (4u << 10)

void gb_init(struct gbuild *b) { memset(b, 0, sizeof *b); }

void gb_free(struct gbuild *b)
{
    for (size_t i = 0; i < b->n_blocks; i++) free(b->blocks[i]); /* (ASan takes poisoned user memory back) */
    free(b->blocks);
    free(b->rules);
    memset(b, 0, sizeof *b);
}

enum status gb_fail(struct gbuild *b, enum status s, const char *fmt, ...)
{
    if (!b->failed) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        status_errorf(s, "%s", msg);
        b->failed = (int)s;
    }
    return (enum status)b->failed;
}

/* A zeroed block of n bytes kept in b's list (freed by gb_free); NULL when out of memory. */
static void *gb_block(struct gbuild *b, size_t n)
{
    void *p = calloc(1, n);
    if (!p || base_grow((void **)&b->blocks, &b->cap_blocks, b->n_blocks + 1, sizeof *b->blocks)) {
        free(p);
        gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        return NULL;
    }
    return b->blocks[b->n_blocks++] = p;
}

void *gb_alloc(struct gbuild *b, size_t n)
{
    if (b->failed) return NULL;
    n = n ? n : 1;
    const size_t step = ((n + 15) & ~(size_t)15) + GB_REDZONE; /* (16-byte aligned, as malloc's) */
    if (step > GB_BIG) return gb_block(b, n);
    if (step > b->left) {
        char *c = gb_block(b, GB_CHUNK);
        if (!c) return NULL;
        ASAN_POISON_MEMORY_REGION(c, GB_CHUNK);
        b->cur = c, b->left = GB_CHUNK;
    }
    void *p = b->cur;
    b->cur += step, b->left -= step;
    ASAN_UNPOISON_MEMORY_REGION(p, n);
    return p;
}

int gb_rule(struct gbuild *b, const char *name)
{
    for (int i = 0; i < b->n_rules; i++)
        if (b->rules[i].name && !strcmp(b->rules[i].name, name)) return i;
    return gb_rule_new(b, name);
}

int gb_rule_new(struct gbuild *b, const char *name)
{
    if (b->failed) return -1;
    if (b->n_rules >= GRAMMAR_MAX_NODES / 4) {
        gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: more than %d rules", GRAMMAR_MAX_NODES / 4);
        return -1;
    }
    size_t cap = (size_t)b->cap_rules;
    if (base_grow((void **)&b->rules, &cap, (size_t)b->n_rules + 1, sizeof *b->rules)) {
        gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        return -1;
    }
    b->cap_rules = (int)cap;
    size_t len = strlen(name);
    char *copy = gb_alloc(b, len + 1);
    if (!copy) return -1;
    memcpy(copy, name, len);
    b->rules[b->n_rules].name = copy;
    b->rules[b->n_rules].expr = NULL;
    b->rules[b->n_rules].rep_base = -1, b->rules[b->n_rules].rep_k = 0;
    return b->n_rules++;
}

static struct gx *node(struct gbuild *b, int kind)
{
    if (b->failed) return NULL;
    if (++b->n_nodes > GRAMMAR_MAX_NODES) {
        gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: more than %d expression nodes (too large)", GRAMMAR_MAX_NODES);
        return NULL;
    }
    struct gx *x = gb_alloc(b, sizeof *x);
    if (x) x->kind = kind;
    return x;
}

struct gx *gx_empty(struct gbuild *b) { return node(b, GX_EMPTY); }

struct gx *gx_byte_range(struct gbuild *b, int lo, int hi)
{
    struct gx *x = node(b, GX_BYTES);
    if (x)
        for (int c = lo; c <= hi; c++) x->set[c >> 5] |= 1u << (c & 31);
    return x;
}

static struct gx *kids_node(struct gbuild *b, int kind, int n, struct gx **kids)
{
    for (int i = 0; i < n; i++)
        if (!kids[i]) return NULL;
    struct gx *x = node(b, kind);
    if (!x) return NULL;
    x->kids = gb_alloc(b, sizeof *kids * (size_t)(n ? n : 1));
    if (!x->kids) return NULL;
    memcpy(x->kids, kids, sizeof *kids * (size_t)n);
    x->n = n;
    return x;
}

struct gx *gx_seq(struct gbuild *b, int n, struct gx **kids)
{
    if (n == 1) return kids[0];
    return n == 0 ? gx_empty(b) : kids_node(b, GX_SEQ, n, kids);
}
struct gx *gx_alt(struct gbuild *b, int n, struct gx **kids)
{
    if (n == 1) return kids[0];
    return kids_node(b, GX_ALT, n, kids);
}
struct gx *gx_seq2(struct gbuild *b, struct gx *x, struct gx *y) { struct gx *k[2] = {x, y}; return gx_seq(b, 2, k); }
struct gx *gx_seq3(struct gbuild *b, struct gx *x, struct gx *y, struct gx *z)
{
    struct gx *k[3] = {x, y, z};
    return gx_seq(b, 3, k);
}
struct gx *gx_alt2(struct gbuild *b, struct gx *x, struct gx *y) { struct gx *k[2] = {x, y}; return gx_alt(b, 2, k); }

struct gx *gx_lit(struct gbuild *b, const char *s, size_t n)
{
    if (n == 0) return gx_empty(b);
    struct gx **k = gb_alloc(b, sizeof *k * n);
    if (!k) return NULL;
    for (size_t i = 0; i < n; i++) k[i] = gx_byte_range(b, (uint8_t)s[i], (uint8_t)s[i]);
    return gx_seq(b, (int)n, k);
}
struct gx *gx_str(struct gbuild *b, const char *s) { return gx_lit(b, s, strlen(s)); }

struct gx *gx_ref(struct gbuild *b, int rule)
{
    if (rule < 0) return NULL;
    struct gx *x = node(b, GX_REF);
    if (x) x->rule = rule;
    return x;
}

/* Whether x derives the empty string: 1 no, 2 yes, 3 unknown (a rule reference below, whose
 * rule may not be defined yet). Cached in the node: nodes do not change once built. */
static int derives_empty(const struct gx *x)
{
    if (x->nul) return x->nul;
    int r = 1;
    switch (x->kind) {
    case GX_EMPTY: r = 2; break;
    case GX_BYTES: r = 1; break;
    case GX_REF: r = 3; break;
    case GX_SEQ: /* all kids: "no" wins over "unknown" */
        r = 2;
        for (int i = 0; i < x->n && r != 1; i++) {
            int k = derives_empty(x->kids[i]);
            if (k == 1 || k == 3) r = k;
        }
        break;
    case GX_ALT: /* some kid: "yes" wins over "unknown" */
        r = 1;
        for (int i = 0; i < x->n && r != 2; i++) {
            int k = derives_empty(x->kids[i]);
            if (k == 2 || k == 3) r = k;
        }
        break;
    case GX_REPEAT: r = x->min == 0 ? 2 : derives_empty(x->kids[0]); break;
    }
    ((struct gx *)x)->nul = (signed char)r;
    return r;
}

#define DROP_EMPTY_MAX_SEQ 8 /* an all-nullable sequence of n grows by n^2: longer ones are left */

/* *out = an expression for x's strings other than "" (NULL: it has none), for an x that
 * derives "" (derives_empty 2). 0, or -1 when it cannot say (a long all-nullable sequence, a
 * failed allocation): the caller keeps x. */
static int drop_empty(struct gbuild *b, struct gx *x, struct gx **out)
{
    *out = NULL;
    if (derives_empty(x) != 2) {
        *out = x;
        return derives_empty(x) == 1 ? 0 : -1;
    }
    switch (x->kind) {
    case GX_EMPTY: return 0;
    case GX_ALT: {
        struct gx **kids = gb_alloc(b, sizeof *kids * (size_t)x->n);
        int n = 0;
        if (!kids) return -1;
        for (int i = 0; i < x->n; i++) {
            struct gx *k;
            if (drop_empty(b, x->kids[i], &k)) return -1;
            if (k) kids[n++] = k;
        }
        *out = n ? gx_alt(b, n, kids) : NULL;
        return n && !*out ? -1 : 0;
    }
    case GX_SEQ: { /* every kid derives "": (k0 R) - "" = (k0 - "") R | R - "", R = k1 ... */
        if (x->n > DROP_EMPTY_MAX_SEQ) return -1;
        struct gx *acc = NULL;
        for (int i = x->n - 1; i >= 0; i--) {
            struct gx *k;
            if (drop_empty(b, x->kids[i], &k)) return -1;
            struct gx *branch = k && i + 1 < x->n ? gx_seq2(b, k, gx_seq(b, x->n - i - 1, x->kids + i + 1)) : k;
            if (k && !branch) return -1;
            acc = !branch ? acc : !acc ? branch : gx_alt2(b, branch, acc);
            if (b->failed) return -1;
        }
        *out = acc;
        return 0;
    }
    case GX_REPEAT: { /* y{m,n} - "" = (y - ""){1,n}, whatever m (y{0,n} when y has no "") */
        struct gx *y;
        if (drop_empty(b, x->kids[0], &y)) return -1;
        if (!y) return 0;
        *out = gx_repeat(b, y, 1, x->max);
        return *out ? 0 : -1;
    }
    }
    return -1;
}

struct gx *gx_repeat(struct gbuild *b, struct gx *x, int min, int max)
{
    if (!x) return NULL;
    if (min < 0 || min > GRAMMAR_MAX_REPEAT || max > GRAMMAR_MAX_REPEAT || (max >= 0 && max < min)) {
        gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: repetition {%d,%d} out of range (at most %d)", min, max,
                GRAMMAR_MAX_REPEAT);
        return NULL;
    }
    if (min == 1 && max == 1) return x;
    if (max == 0) return gx_empty(b);
    /* A body that derives "": x{m,n} = (x - ""){0,n}. Otherwise every copy is reachable without
     * reading a byte, and nested counted repeats of such bodies multiply the automaton's live
     * stacks (thousands after one byte: docs/grammar.md). */
    if (derives_empty(x) == 2) {
        struct gx *y;
        if (!drop_empty(b, x, &y)) {
            if (!y) return gx_empty(b);
            x = y, min = 0;
        }
        if (b->failed) return NULL;
    }
    /* A repetition of an unbounded repetition that may start at 0 or 1 is one repetition:
     * (x*)* = (x+)* = (x*)+ = (x?)* = x*, (x+)+ = x+. Nested nullable loops otherwise make the
     * automaton's closures grow with the nesting. */
    if (x->kind == GX_REPEAT && x->min <= 1 && (max < 0 || x->max < 0) && (x->max < 0 || x->max == 1) && min <= 1 && (max < 0 || max == 1))
        return gx_repeat(b, x->kids[0], min && x->min ? 1 : 0, -1);
    struct gx *r = kids_node(b, GX_REPEAT, 1, &x);
    if (r) r->min = min, r->max = max;
    return r;
}

/* ---- lowering ---- */
struct ivec { int32_t *v; size_t n, cap; };

static int ivec_push(struct ivec *a, int32_t x)
{
    if (base_grow((void **)&a->v, &a->cap, a->n + 1, sizeof *a->v)) return -1;
    a->v[a->n++] = x;
    return 0;
}

struct lower {
    struct gbuild *b;
    struct ivec    el, alt_pos, rule_alt;
    uint32_t      *sets;
    size_t         n_sets, cap_sets;
    int32_t       *set_hash; /* open addressing over sets, (hash_cap) */
    size_t         hash_cap;
};

static int32_t set_index(struct lower *L, const uint32_t *set)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 8; i++) h = (h ^ set[i]) * 1099511628211ull;
    if (L->n_sets * 2 >= L->hash_cap) { /* rehash */
        size_t cap = L->hash_cap ? L->hash_cap * 2 : 256;
        int32_t *t = malloc(cap * sizeof *t);
        if (!t) return -1;
        memset(t, 0xff, cap * sizeof *t);
        for (size_t s = 0; s < L->n_sets; s++) {
            uint64_t g = 1469598103934665603ull;
            for (int i = 0; i < 8; i++) g = (g ^ L->sets[s * 8 + i]) * 1099511628211ull;
            size_t j = g & (cap - 1);
            while (t[j] >= 0) j = (j + 1) & (cap - 1);
            t[j] = (int32_t)s;
        }
        free(L->set_hash);
        L->set_hash = t, L->hash_cap = cap;
    }
    size_t j = h & (L->hash_cap - 1);
    while (L->set_hash[j] >= 0) {
        if (!memcmp(L->sets + (size_t)L->set_hash[j] * 8, set, 32)) return L->set_hash[j];
        j = (j + 1) & (L->hash_cap - 1);
    }
    if (base_grow((void **)&L->sets, &L->cap_sets, (L->n_sets + 1) * 8, sizeof *L->sets)) return -1;
    memcpy(L->sets + L->n_sets * 8, set, 32);
    L->set_hash[j] = (int32_t)L->n_sets;
    return (int32_t)L->n_sets++;
}

/* A rule for x (reusing x's rule when it is a reference). */
static int rule_of(struct lower *L, struct gx *x)
{
    if (x->kind == GX_REF) return x->rule;
    int r = gb_rule_new(L->b, "");
    if (r >= 0) L->b->rules[r].expr = x;
    return r;
}

static int emit(struct lower *L, struct ivec *out, struct gx *x)
{
    struct gbuild *b = L->b;
    if (b->failed) return -1;
    switch (x->kind) {
    case GX_EMPTY: return 0;
    case GX_BYTES: {
        int32_t s = set_index(L, x->set);
        return s < 0 ? -1 : ivec_push(out, s);
    }
    case GX_REF: return ivec_push(out, GEL_REF0 - x->rule);
    case GX_SEQ:
        for (int i = 0; i < x->n; i++)
            if (emit(L, out, x->kids[i])) return -1;
        return 0;
    case GX_ALT: {
        int r = rule_of(L, x);
        return r < 0 ? -1 : ivec_push(out, GEL_REF0 - r);
    }
    case GX_REPEAT: {
        /* x{min,max} = x ... x (min times), then x* (a right-recursive rule) or max-min nested
         * optionals o_k ::= x o_(k-1) | "". Right recursion keeps the automaton's stack flat. */
        struct gx *ref = x->kids[0];
        if (ref->kind != GX_BYTES && ref->kind != GX_REF) ref = gx_ref(b, rule_of(L, ref));
        if (!ref) return -1;
        for (int i = 0; i < x->min; i++)
            if (emit(L, out, ref)) return -1;
        if (x->max == x->min) return 0;
        int tail;
        if (x->max < 0) {
            tail = gb_rule_new(b, "");
            if (tail < 0) return -1;
            b->rules[tail].expr = gx_alt2(b, gx_seq2(b, ref, gx_ref(b, tail)), gx_empty(b));
        } else {
            tail = -1;
            int base = -1;
            for (int k = 0; k < x->max - x->min; k++) {
                int o = gb_rule_new(b, "");
                if (o < 0) return -1;
                b->rules[o].expr = gx_alt2(b, tail < 0 ? ref : gx_seq2(b, ref, gx_ref(b, tail)), gx_empty(b));
                if (base < 0) base = o;
                b->rules[o].rep_base = base, b->rules[o].rep_k = k + 1;
                tail = o;
            }
        }
        return b->failed ? -1 : ivec_push(out, GEL_REF0 - tail);
    }
    }
    return -1;
}

static int lower_rule(struct lower *L, int r)
{
    struct gx *x = L->b->rules[r].expr;
    if (ivec_push(&L->rule_alt, (int32_t)L->alt_pos.n)) return -1;
    int n = x->kind == GX_ALT ? x->n : 1;
    for (int i = 0; i < n; i++) {
        struct ivec a = {0};
        int rc = emit(L, &a, x->kind == GX_ALT ? x->kids[i] : x);
        if (!rc) rc = ivec_push(&L->alt_pos, (int32_t)L->el.n);
        for (size_t j = 0; !rc && j < a.n; j++) rc = ivec_push(&L->el, a.v[j]);
        if (!rc) rc = ivec_push(&L->el, GEL_END);
        free(a.v);
        if (rc) return -1;
        if (L->el.n > GRAMMAR_MAX_ELEMENTS) {
            gb_fail(L->b, STATUS_RESOURCE_EXHAUSTED, "grammar: more than %d elements (too large)", GRAMMAR_MAX_ELEMENTS);
            return -1;
        }
    }
    return 0;
}

void gflat_free(struct gflat *f)
{
    free(f->el), free(f->sets), free(f->alt_pos), free(f->rule_alt), free(f->pos_rule), free(f->rep_base), free(f->rep_k);
    memset(f, 0, sizeof *f);
}

/* Drops alternatives that reference rules deriving no string, then compacts. */
static enum status prune_unproductive(struct gbuild *b, struct gflat *f)
{
    uint8_t *prod = calloc((size_t)f->n_rules, 1);
    if (!prod) return gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < f->n_rules; r++) {
            if (prod[r]) continue;
            for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1] && !prod[r]; a++) {
                int ok = 1;
                for (int p = f->alt_pos[a]; f->el[p] != GEL_END; p++)
                    if (f->el[p] <= GEL_REF0 && !prod[GEL_REF0 - f->el[p]]) ok = 0;
                if (ok) prod[r] = 1, changed = 1;
            }
        }
    }
    if (!prod[f->root]) {
        free(prod);
        return gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: the grammar accepts no string (rule %s)",
                       b->rules[f->root].name[0] ? b->rules[f->root].name : "root");
    }
    /* Compact: keep productive alternatives, in place. */
    int n_alts = 0, n_el = 0;
    for (int r = 0; r < f->n_rules; r++) {
        int first = n_alts;
        for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1]; a++) {
            int ok = 1, p;
            for (p = f->alt_pos[a]; f->el[p] != GEL_END; p++)
                if (f->el[p] <= GEL_REF0 && !prod[GEL_REF0 - f->el[p]]) ok = 0;
            if (!ok) continue;
            int start = n_el;
            for (int q = f->alt_pos[a]; q <= p; q++) f->el[n_el++] = f->el[q];
            f->alt_pos[n_alts++] = start;
        }
        f->rule_alt[r] = first;
    }
    f->rule_alt[f->n_rules] = n_alts;
    f->n_alts = n_alts, f->n_el = n_el;
    free(prod);
    return STATUS_OK;
}

/* The next edge u -> v of the left-corner graph (v referenced in an alternative of u after only
 * nullable elements) after the one at (*c, *q) (*q < 0: none yet in alternative *c); -1 when
 * there is none. */
static int next_left(const struct gflat *f, const uint8_t *nullable, int u, int *c, int *q)
{
    for (; *c < f->rule_alt[u + 1]; (*c)++, *q = -1) {
        int p = *q < 0 ? f->alt_pos[*c] : *q;
        if (*q >= 0) {
            if (!nullable[GEL_REF0 - f->el[p]]) continue;
            p++;
        }
        if (f->el[p] <= GEL_REF0) {
            *q = p;
            return GEL_REF0 - f->el[p];
        }
    }
    return -1;
}

/* comp[u]: the strongly connected component of u in the left-corner graph (Tarjan's, without
 * recursion: frames of rule, alternative, position). Linear in the grammar. */
static int left_components(const struct gflat *f, const uint8_t *nullable, int *comp)
{
    const int n = f->n_rules;
    int *index = malloc(sizeof *index * (size_t)n), *low = malloc(sizeof *low * (size_t)n);
    int *stk = malloc(sizeof *stk * (size_t)n), *fr = malloc(sizeof *fr * 3 * (size_t)n);
    uint8_t *on = calloc((size_t)n, 1);
    if (!index || !low || !stk || !fr || !on) {
        free(index), free(low), free(stk), free(fr), free(on);
        return -1;
    }
    for (int i = 0; i < n; i++) index[i] = -1;
    int next = 0, sp = 0, nf = 0;
    for (int s = 0; s < n; s++) {
        if (index[s] >= 0) continue;
        index[s] = low[s] = next++, stk[sp++] = s, on[s] = 1;
        fr[0] = s, fr[1] = f->rule_alt[s], fr[2] = -1, nf = 1;
        while (nf) {
            int *top = fr + 3 * (nf - 1), u = top[0];
            int v = next_left(f, nullable, u, &top[1], &top[2]);
            if (v >= 0) {
                if (index[v] < 0) {
                    index[v] = low[v] = next++, stk[sp++] = v, on[v] = 1;
                    int *nw = fr + 3 * nf++;
                    nw[0] = v, nw[1] = f->rule_alt[v], nw[2] = -1;
                } else if (on[v] && index[v] < low[u]) {
                    low[u] = index[v];
                }
                continue;
            }
            nf--;
            if (low[u] == index[u]) {
                int w;
                do w = stk[--sp], on[w] = 0, comp[w] = u;
                while (w != u);
            }
            if (nf && low[u] < low[fr[3 * (nf - 1)]]) low[fr[3 * (nf - 1)]] = low[u];
        }
    }
    free(index), free(low), free(stk), free(fr), free(on);
    return 0;
}

/* Left recursion makes the automaton's stack grow without consuming input: refused. A growing
 * edge r -> t (t referenced after only nullable elements, with elements after it: a continuation
 * is pushed) on a cycle of the left-corner graph, that is, with r and t in one strongly connected
 * component, is left recursion. (Until 2026-12-02 a search from t for each growing edge: quadratic,
 * a third of the compile time of the fuzz corpus's large regexes.) */
static enum status check_left_recursion(struct gbuild *b, struct gflat *f)
{
    int n = f->n_rules;
    uint8_t *nullable = calloc((size_t)n + 1, 1);
    int *comp = malloc(sizeof *comp * (size_t)(n + 1));
    enum status s = STATUS_OK;
    if (!nullable || !comp) {
        s = gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        goto done;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1] && !nullable[r]; a++) {
                int ok = 1;
                for (int p = f->alt_pos[a]; f->el[p] != GEL_END && ok; p++)
                    ok = f->el[p] <= GEL_REF0 && nullable[GEL_REF0 - f->el[p]];
                if (ok) nullable[r] = 1, changed = 1;
            }
        }
    }
    if (left_components(f, nullable, comp)) {
        s = gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        goto done;
    }
    for (int r = 0; r < n && s == STATUS_OK; r++)
        for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1] && s == STATUS_OK; a++)
            for (int p = f->alt_pos[a]; f->el[p] <= GEL_REF0; p++) {
                int t = GEL_REF0 - f->el[p];
                if (f->el[p + 1] != GEL_END && comp[t] == comp[r]) {
                    s = gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: left recursion through rule %s",
                                b->rules[r].name[0] ? b->rules[r].name : "(anonymous)");
                    break;
                }
                if (!nullable[t]) break;
            }
done:
    free(nullable), free(comp);
    return s;
}

/* The rule of each element, and the counted chains (o_k ::= x o_(k-1) | "") whose x cannot
 * derive the empty string: a token of L bytes then uses at most L links of the chain, so the
 * mask entries of links beyond the longest token are equal (grammar_pda.c keys them alike). */
static enum status chains(struct gbuild *b, struct gflat *f)
{
    f->pos_rule = malloc(sizeof *f->pos_rule * (size_t)(f->n_el ? f->n_el : 1));
    f->rep_base = malloc(sizeof *f->rep_base * (size_t)(f->n_rules ? f->n_rules : 1));
    f->rep_k = calloc((size_t)(f->n_rules ? f->n_rules : 1), sizeof *f->rep_k);
    uint8_t *nullable = calloc((size_t)(f->n_rules ? f->n_rules : 1), 1);
    if (!f->pos_rule || !f->rep_base || !f->rep_k || !nullable) {
        free(nullable);
        return gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    }
    for (int r = 0; r < f->n_rules; r++)
        for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1]; a++)
            for (int p = f->alt_pos[a]; p < f->n_el; p++) {
                f->pos_rule[p] = r;
                if (f->el[p] == GEL_END) break;
            }
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < f->n_rules; r++) {
            if (nullable[r]) continue;
            for (int a = f->rule_alt[r]; a < f->rule_alt[r + 1] && !nullable[r]; a++) {
                int ok = 1;
                for (int p = f->alt_pos[a]; f->el[p] != GEL_END && ok; p++) ok = f->el[p] <= GEL_REF0 && nullable[GEL_REF0 - f->el[p]];
                if (ok) nullable[r] = 1, changed = 1;
            }
        }
    }
    for (int r = 0; r < f->n_rules; r++) {
        f->rep_base[r] = -1;
        const struct grule *g = &b->rules[r];
        if (g->rep_base < 0 || g->rep_k < 2 || f->rule_alt[r + 1] - f->rule_alt[r] != 2) continue;
        int32_t x = f->el[f->alt_pos[f->rule_alt[r]]];
        if (x <= GEL_REF0 && nullable[GEL_REF0 - x]) continue;
        f->rep_base[r] = g->rep_base, f->rep_k[r] = g->rep_k;
    }
    free(nullable);
    return STATUS_OK;
}

enum status gflat_build(struct gbuild *b, int root, struct gflat *f)
{
    memset(f, 0, sizeof *f);
    if (b->failed) return (enum status)b->failed;
    struct lower L = {.b = b};
    /* Rules are lowered in index order; lowering adds anonymous rules at the end. Every rule
     * gets an entry so that indices stay rule numbers. */
    for (int r = 0; r < b->n_rules; r++) {
        if (!b->rules[r].expr) {
            gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: rule '%s' is used but not defined", b->rules[r].name);
            break;
        }
        if (lower_rule(&L, r)) break;
    }
    enum status s = (enum status)b->failed;
    if (!s && ivec_push(&L.rule_alt, (int32_t)L.alt_pos.n)) s = gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
    free(L.set_hash);
    f->el = L.el.v, f->n_el = (int)L.el.n;
    f->sets = L.sets, f->n_sets = (int)L.n_sets;
    f->alt_pos = L.alt_pos.v, f->n_alts = (int)L.alt_pos.n;
    f->rule_alt = L.rule_alt.v, f->n_rules = b->n_rules;
    f->root = root;
    if (!s) s = prune_unproductive(b, f);
    if (!s) s = check_left_recursion(b, f);
    if (!s) s = chains(b, f);
    if (s) gflat_free(f);
    return s;
}
