/* engine/grammar/grammar_pda.c - the byte-level pushdown automaton and the matcher: stacks as
 * hash-consed nodes (a stack is the id of its top node, shared tails, so a state is a small set
 * of ints and rollback is popping a history), token masks from per-stack-top precomputed
 * entries (tokens accepted whatever lies below the top KEY_DEPTH nodes, plus the few
 * "uncertain" ones checked against the whole stack at run time), in the spirit of XGrammar's
 * context-independent token cache. Not here: building grammars (grammar_ir.c and the front
 * ends), the vocabulary (grammar.c). Tests: tests/test_grammar.c. */
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define KEY_DEPTH      8       /* stack nodes a mask entry is keyed by */
#define MAX_STACK      4000    /* deeper stacks are dropped (nesting bound) */
#define MAX_NODES      (1 << 24)
#define MAX_CACHE      8192    /* mask entries per grammar */
#define MAX_CACHE_BYTES (64u << 20) /* and their memory; beyond either, entries are per use */
#define MAX_WORK       (1 << 18) /* closure steps per byte: a bound on pathological grammars */
#define MASK_WORK      (1LL << 23) /* work of one mask (grammar_matcher_fill_mask): 45x the most a JSON
                                     * schema's cold step took on Gemma's vocabulary (docs/grammar.md) */
#define P_NONE         (-1)    /* the bottom: popping it completes the input */
#define P_CTX          (-2)    /* the cut of a truncated stack: popping it leaves the frame */

struct pnode { int32_t pos, parent, depth; };

/* A set of stacks: ids of top nodes (each at a terminal), plus flags. */
struct pstate {
    int32_t *ids;
    int      n, cap;
    int      done;   /* the empty stack: the input may end here */
    int      ctx;    /* a truncated stack popped to its cut exactly here */
    int      exited; /* some path left the frame before the end of the bytes */
};

struct pda {
    const struct gflat *f;
    struct pnode       *nodes;
    size_t              n_nodes, cap_nodes;
    int32_t            *hash; /* (hash_cap) node ids, -1 empty */
    size_t              hash_cap;
    uint32_t           *mark; /* (cap_mark) generation per node */
    size_t              cap_mark;
    uint32_t            gen;
    long                budget; /* closure steps left in this step */
    long long           spent;  /* work so far: closure steps, stack ids interned into DFA states */
    int32_t            *work; /* closure worklist, pairs */
    size_t              n_work, cap_work;
    int                 overflow;
};

static void pda_init(struct pda *p, const struct gflat *f)
{
    memset(p, 0, sizeof *p);
    p->f = f;
}

static void pda_free(struct pda *p)
{
    free(p->nodes), free(p->hash), free(p->mark), free(p->work);
    memset(p, 0, sizeof *p);
}

static uint64_t mix(uint64_t h)
{
    h ^= h >> 33, h *= 0xff51afd7ed558ccdull, h ^= h >> 33, h *= 0xc4ceb9fe1a85ec53ull, h ^= h >> 33;
    return h;
}

static int32_t intern(struct pda *p, int32_t pos, int32_t parent)
{
    if ((p->n_nodes + 1) * 2 > p->hash_cap) {
        size_t cap = p->hash_cap ? p->hash_cap * 2 : 1024;
        int32_t *t = malloc(cap * sizeof *t);
        CHECK(t, "grammar: out of memory");
        memset(t, 0xff, cap * sizeof *t);
        for (size_t i = 0; i < p->n_nodes; i++) {
            size_t j = mix((uint64_t)(uint32_t)p->nodes[i].pos << 32 | (uint32_t)p->nodes[i].parent) & (cap - 1);
            while (t[j] >= 0) j = (j + 1) & (cap - 1);
            t[j] = (int32_t)i;
        }
        free(p->hash);
        p->hash = t, p->hash_cap = cap;
    }
    size_t j = mix((uint64_t)(uint32_t)pos << 32 | (uint32_t)parent) & (p->hash_cap - 1);
    for (; p->hash[j] >= 0; j = (j + 1) & (p->hash_cap - 1)) {
        const struct pnode *n = &p->nodes[p->hash[j]];
        if (n->pos == pos && n->parent == parent) return p->hash[j];
    }
    if (p->n_nodes >= MAX_NODES) return p->overflow = 1, -1;
    CHECK(!base_grow((void **)&p->nodes, &p->cap_nodes, p->n_nodes + 1, sizeof *p->nodes), "grammar: out of memory");
    if (p->cap_mark < p->cap_nodes) {
        uint32_t *m = realloc(p->mark, p->cap_nodes * sizeof *m);
        CHECK(m, "grammar: out of memory");
        memset(m + p->cap_mark, 0, (p->cap_nodes - p->cap_mark) * sizeof *m);
        p->mark = m, p->cap_mark = p->cap_nodes;
    }
    int32_t id = (int32_t)p->n_nodes++;
    p->nodes[id] = (struct pnode){pos, parent, parent >= 0 ? p->nodes[parent].depth + 1 : 1};
    p->hash[j] = id;
    return id;
}

static void state_push(struct pstate *s, int32_t id)
{
    size_t cap = (size_t)s->cap;
    CHECK(!base_grow((void **)&s->ids, &cap, (size_t)s->n + 1, sizeof *s->ids), "grammar: out of memory");
    s->cap = (int)cap;
    s->ids[s->n++] = id;
}

static void work_push(struct pda *p, int32_t pos, int32_t parent)
{
    CHECK(!base_grow((void **)&p->work, &p->cap_work, p->n_work + 2, sizeof *p->work), "grammar: out of memory");
    p->work[p->n_work++] = pos, p->work[p->n_work++] = parent;
}

/* Adds to out every normalized stack (top at a terminal, or done/ctx) that continuing at pos
 * over the stack `parent` leads to without consuming input. Uses the current generation's
 * marks, so repeated calls within one step deduplicate (and nullable loops end). */
static void expand(struct pda *p, int32_t pos, int32_t parent, struct pstate *out)
{
    const struct gflat *f = p->f;
    work_push(p, pos, parent);
    while (p->n_work) {
        if (--p->budget < 0) { /* dropped: the grammar is too ambiguous here */
            p->overflow = 1, p->n_work = 0;
            break;
        }
        p->spent++;
        int32_t par = p->work[--p->n_work], q = p->work[--p->n_work];
        int32_t e = f->el[q];
        if (e == GEL_END) {
            if (par == P_NONE) out->done = 1;
            else if (par == P_CTX) out->ctx = 1;
            else work_push(p, p->nodes[par].pos, p->nodes[par].parent);
            continue;
        }
        int32_t id = intern(p, q, par);
        if (id < 0 || p->mark[id] == p->gen) continue;
        p->mark[id] = p->gen;
        if (e >= 0) {
            state_push(out, id);
            continue;
        }
        int32_t cont = par;
        if (f->el[q + 1] != GEL_END) {
            if (par >= 0 && p->nodes[par].depth >= MAX_STACK) continue;
            cont = intern(p, q + 1, par);
            if (cont < 0) continue;
        }
        int r = GEL_REF0 - e;
        for (int a = f->rule_alt[r + 1] - 1; a >= f->rule_alt[r]; a--) work_push(p, f->alt_pos[a], cont);
    }
}

/* out = the stacks of in after the byte c. */
static void advance(struct pda *p, const struct pstate *in, uint8_t c, struct pstate *out)
{
    const struct gflat *f = p->f;
    out->n = 0, out->done = 0, out->ctx = 0;
    out->exited = in->exited || in->ctx;
    p->gen++;
    p->budget = MAX_WORK;
    for (int i = 0; i < in->n; i++) {
        const struct pnode *n = &p->nodes[in->ids[i]];
        const uint32_t *set = f->sets + (size_t)f->el[n->pos] * 8;
        if (set[c >> 5] >> (c & 31) & 1) expand(p, n->pos + 1, n->parent, out);
    }
}

static int state_live(const struct pstate *s) { return s->n > 0 || s->done || s->ctx; }

/* ---- precomputed mask entries ---- */
struct mask_entry {
    uint64_t  hash;
    int32_t   key[KEY_DEPTH];
    int       key_n, truncated;
    uint32_t *bits;  /* accepted tokens as a bitmap (mask words), or NULL: then acc */
    int32_t  *acc;   /* (n_acc) accepted tokens, when few */
    int       n_acc;
    int32_t  *unc;   /* (n_unc) tokens that leave the frame: checked against the whole stack */
    int       n_unc;
};

static void entry_free(struct mask_entry *e)
{
    if (!e) return;
    free(e->bits), free(e->acc), free(e->unc), free(e);
}

void grammar_cache_entries_free(struct grammar *g)
{
    for (int i = 0; i < g->cap_cache; i++) entry_free(g->cache[i]);
    free(g->cache);
    g->cache = NULL, g->cap_cache = g->n_cache = 0;
}

/* A DFA built lazily over the states of one truncated stack: states interned by content, a
 * dense transition table, so that walking the sorted vocabulary costs a table read per byte
 * once the states are known (string contents: one state). */
struct dfa {
    struct pda     p;
    struct pstate *states;
    int            n_states, cap_states;
    int32_t       *trans; /* (n_states, 256), -1 unknown */
    uint8_t       *live;  /* (n_states) 1: some stack is left; 0: dead, the token rejected; 2: dead,
                           * after leaving the frame (uncertain) */
    int32_t       *hash;
    int            hash_cap;
};

static uint64_t state_hash(const struct pstate *s)
{
    uint64_t h = mix((uint64_t)(s->done | s->ctx << 1 | s->exited << 2) + 1);
    for (int i = 0; i < s->n; i++) h = mix(h ^ (uint64_t)s->ids[i]);
    return h;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int dfa_intern(struct dfa *d, struct pstate *s)
{
    d->p.spent += s->n;
    if (s->n > 1) qsort(s->ids, (size_t)s->n, sizeof *s->ids, cmp_i32);
    if ((d->n_states + 1) * 2 > d->hash_cap) {
        int cap = d->hash_cap ? d->hash_cap * 2 : 64;
        int32_t *t = malloc((size_t)cap * sizeof *t);
        CHECK(t, "grammar: out of memory");
        memset(t, 0xff, (size_t)cap * sizeof *t);
        for (int i = 0; i < d->n_states; i++) {
            int j = (int)(state_hash(&d->states[i]) & (uint64_t)(cap - 1));
            while (t[j] >= 0) j = (j + 1) & (cap - 1);
            t[j] = i;
        }
        free(d->hash);
        d->hash = t, d->hash_cap = cap;
    }
    int j = (int)(state_hash(s) & (uint64_t)(d->hash_cap - 1));
    for (; d->hash[j] >= 0; j = (j + 1) & (d->hash_cap - 1)) {
        const struct pstate *o = &d->states[d->hash[j]];
        if (o->n == s->n && o->done == s->done && o->ctx == s->ctx && o->exited == s->exited &&
            (!s->n || !memcmp(o->ids, s->ids, sizeof *s->ids * (size_t)s->n)))
            return d->hash[j];
    }
    size_t cap = (size_t)d->cap_states;
    CHECK(!base_grow((void **)&d->states, &cap, (size_t)d->n_states + 1, sizeof *d->states), "grammar: out of memory");
    size_t tcap = cap * 256;
    if ((int)cap != d->cap_states) {
        int32_t *t = realloc(d->trans, tcap * sizeof *t);
        uint8_t *l = realloc(d->live, cap);
        CHECK(t && l, "grammar: out of memory");
        d->trans = t, d->live = l;
    }
    d->cap_states = (int)cap;
    struct pstate *n = &d->states[d->n_states];
    *n = *s;
    n->ids = malloc(sizeof *n->ids * (size_t)(s->n ? s->n : 1));
    CHECK(n->ids, "grammar: out of memory");
    if (s->n) memcpy(n->ids, s->ids, sizeof *s->ids * (size_t)s->n);
    n->cap = s->n;
    memset(d->trans + (size_t)d->n_states * 256, 0xff, 256 * sizeof *d->trans);
    d->live[d->n_states] = state_live(s) ? 1 : s->exited ? 2 : 0;
    d->hash[j] = d->n_states;
    return d->n_states++;
}

static void dfa_free(struct dfa *d)
{
    for (int i = 0; i < d->n_states; i++) free(d->states[i].ids);
    free(d->states), free(d->trans), free(d->hash), free(d->live);
    pda_free(&d->p);
}

static int dfa_step(struct dfa *d, int s, uint8_t c, struct pstate *tmp)
{
    int32_t t = d->trans[(size_t)s * 256 + c];
    if (t >= 0) return t;
    struct pstate in = d->states[s]; /* copied: interning may move the array */
    advance(&d->p, &in, c, tmp);
    t = dfa_intern(d, tmp);
    d->trans[(size_t)s * 256 + c] = t;
    return t;
}

struct ilist { int32_t *v; size_t n, cap; };
static void ilist_push(struct ilist *l, int32_t x)
{
    CHECK(!base_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v), "grammar: out of memory");
    l->v[l->n++] = x;
}

/* Classifies every token from the truncated stack key[0..n) (top first) over the sorted
 * vocabulary: accepted (some path stays in the frame, or leaves it exactly at the token's end),
 * uncertain (only paths that leave it), rejected (none). Prunes whole prefix ranges. Adds its
 * work to *spent; NULL when that passes limit (the walk stops there). */
static struct mask_entry *entry_compute(const struct grammar *g, const int32_t *key, int n, int truncated,
                                        long long limit, long long *spent)
{
    const struct grammar_vocab *v = g->vocab;
    struct dfa d;
    memset(&d, 0, sizeof d);
    pda_init(&d.p, &g->f);
    int32_t parent = truncated ? P_CTX : P_NONE;
    for (int i = n - 1; i >= 0; i--) parent = intern(&d.p, key[i], parent);
    CHECK(parent >= 0, "grammar: node overflow");
    struct pstate st = {0}, tmp = {0};
    state_push(&st, parent);
    int start = dfa_intern(&d, &st);
    free(st.ids);
    int *sstack = malloc(sizeof *sstack * (size_t)(v->max_len + 1));
    CHECK(sstack, "grammar: out of memory");
    sstack[0] = start;
    int words = grammar_vocab_mask_words(v);
    uint32_t *bits = calloc((size_t)words, sizeof *bits);
    CHECK(bits, "grammar: out of memory");
    int n_acc = 0;
    struct ilist unc = {0};
    int valid = 0; /* sstack[0..valid] hold the states after the prefix of the previous token */
    int over = 0;
    for (int i = 0; i < v->n_sorted && !(over = d.p.spent > limit); i++) {
        int32_t id = v->sorted[i];
        const uint8_t *b = v->sbytes + v->soff[i];
        int len = (int)(v->soff[i + 1] - v->soff[i]);
        int k = v->lcp[i] < valid ? v->lcp[i] : valid;
        int dead_at = -1;
        for (; k < len; k++) {
            int s2 = dfa_step(&d, sstack[k], b[k], &tmp);
            sstack[k + 1] = s2;
            if (d.live[s2] != 1) {
                dead_at = k;
                break;
            }
        }
        if (dead_at < 0) {
            bits[id >> 5] |= 1u << (id & 31), n_acc++;
            valid = len;
            continue;
        }
        /* Every following token sharing the first dead_at+1 bytes ends the same way. */
        int uncertain = d.live[sstack[dead_at + 1]] == 2;
        int end = v->skip[v->soff[i] + (uint32_t)dead_at];
        if (uncertain)
            for (int j = i; j < end; j++) ilist_push(&unc, v->sorted[j]);
        i = end - 1;
        valid = dead_at;
    }
    free(sstack), free(tmp.ids);
    *spent += d.p.spent + v->n_sorted / 64;
    over |= d.p.overflow; /* a closure cut short: the entry would miss tokens */
    dfa_free(&d);
    if (over) {
        free(bits), free(unc.v);
        return NULL;
    }
    struct mask_entry *e = calloc(1, sizeof *e);
    CHECK(e, "grammar: out of memory");
    if (n) memcpy(e->key, key, sizeof *key * (size_t)n);
    e->key_n = n, e->truncated = truncated;
    if (n_acc > words) { /* many: the bitmap; few: a list, cheaper to OR in */
        e->bits = bits;
    } else {
        e->acc = malloc(sizeof *e->acc * (size_t)(n_acc ? n_acc : 1));
        CHECK(e->acc, "grammar: out of memory");
        for (int w = 0; w < words; w++)
            for (uint32_t x = bits[w]; x; x &= x - 1) e->acc[e->n_acc++] = w * 32 + __builtin_ctz(x);
        free(bits);
    }
    e->unc = unc.v, e->n_unc = (int)unc.n;
    return e;
}

static uint64_t key_hash(const int32_t *key, int n, int truncated)
{
    uint64_t h = mix((uint64_t)truncated + 7);
    for (int i = 0; i < n; i++) h = mix(h ^ (uint64_t)(uint32_t)key[i]);
    return h;
}

/* The entry of a key, from the grammar's cache or computed (outside the lock) and inserted.
 * *owned is set when the entry is not in the cache (full) and the caller must free it. A
 * computation adds its work to *spent; NULL when that passes limit. */
static struct mask_entry *entry_get(struct grammar *g, const int32_t *key, int n, int truncated, int *owned,
                                    long long limit, long long *spent)
{
    uint64_t h = key_hash(key, n, truncated);
    *owned = 0;
    pthread_mutex_lock(&g->lock);
    if (g->cap_cache) {
        for (int j = (int)(h & (uint64_t)(g->cap_cache - 1)); g->cache[j]; j = (j + 1) & (g->cap_cache - 1)) {
            struct mask_entry *e = g->cache[j];
            if (e->hash == h && e->key_n == n && e->truncated == truncated && !memcmp(e->key, key, sizeof *key * (size_t)n)) {
                pthread_mutex_unlock(&g->lock);
                return e; /* entries live as long as the grammar: safe to use unlocked */
            }
        }
    }
    pthread_mutex_unlock(&g->lock);
    struct mask_entry *e = entry_compute(g, key, n, truncated, limit, spent);
    if (!e) return NULL;
    e->hash = h;
    pthread_mutex_lock(&g->lock);
    size_t bytes = sizeof *e + (e->bits ? (size_t)grammar_vocab_mask_words(g->vocab) * 4 : (size_t)e->n_acc * 4) + (size_t)e->n_unc * 4;
    if (g->n_cache >= MAX_CACHE || g->cache_bytes + bytes > MAX_CACHE_BYTES) {
        pthread_mutex_unlock(&g->lock);
        *owned = 1;
        return e;
    }
    if ((g->n_cache + 1) * 2 > g->cap_cache) {
        int cap = g->cap_cache ? g->cap_cache * 2 : 64;
        struct mask_entry **t = calloc((size_t)cap, sizeof *t);
        CHECK(t, "grammar: out of memory");
        for (int i = 0; i < g->cap_cache; i++)
            if (g->cache[i]) {
                int j = (int)(g->cache[i]->hash & (uint64_t)(cap - 1));
                while (t[j]) j = (j + 1) & (cap - 1);
                t[j] = g->cache[i];
            }
        free(g->cache);
        g->cache = t, g->cap_cache = cap;
    }
    int j = (int)(h & (uint64_t)(g->cap_cache - 1));
    for (; g->cache[j]; j = (j + 1) & (g->cap_cache - 1)) {
        struct mask_entry *o = g->cache[j];
        if (o->hash == h && o->key_n == n && o->truncated == truncated && !memcmp(o->key, key, sizeof *key * (size_t)n)) {
            pthread_mutex_unlock(&g->lock); /* another thread was first */
            entry_free(e);
            return o;
        }
    }
    g->cache[j] = e, g->n_cache++, g->cache_bytes += bytes;
    pthread_mutex_unlock(&g->lock);
    return e;
}

/* A position inside link o_k of a counted chain with k beyond the longest token stands for the
 * same position in link o_C, C = longest token + 2: their entries are equal (grammar_ir.c,
 * chains()), so that x{0,10000} costs C entries, not 10000. Links k >= 2 share one layout. */
static int32_t canonical_pos(const struct grammar *g, int32_t pos)
{
    const struct gflat *f = &g->f;
    int32_t r = f->pos_rule[pos];
    int C = g->vocab->max_len + 2;
    if (f->rep_base[r] < 0 || f->rep_k[r] <= C) return pos;
    int32_t rc = f->rep_base[r] + C - 1; /* links are consecutive rules: o_k = o_1 + k - 1 */
    if (rc >= f->n_rules || f->rep_base[rc] != f->rep_base[r] || f->rep_k[rc] != C) return pos;
    return pos - f->alt_pos[f->rule_alt[r]] + f->alt_pos[f->rule_alt[rc]];
}

/* ---- matcher ---- */
struct hist { size_t off; int n, done, ended; };

struct grammar_matcher {
    struct grammar *g;
    struct pda      p;
    int32_t        *pool; /* ids of every state in the history, concatenated */
    size_t          n_pool, cap_pool;
    struct hist    *hist; /* (n_hist) hist[0]: the start */
    size_t          n_hist, cap_hist;
    struct pstate   a, b; /* scratch */
    struct pstate  *lv;   /* (max_len + 1) states along the current token, for the uncertain checks */
};

static void push_state(struct grammar_matcher *m, const struct pstate *s, int ended)
{
    CHECK(!base_grow((void **)&m->hist, &m->cap_hist, m->n_hist + 1, sizeof *m->hist), "grammar: out of memory");
    CHECK(!base_grow((void **)&m->pool, &m->cap_pool, m->n_pool + (size_t)s->n, sizeof *m->pool), "grammar: out of memory");
    if (s->n) memcpy(m->pool + m->n_pool, s->ids, sizeof *s->ids * (size_t)s->n);
    m->hist[m->n_hist++] = (struct hist){m->n_pool, s->n, s->done, ended};
    m->n_pool += (size_t)s->n;
}

static void current(const struct grammar_matcher *m, struct pstate *s)
{
    const struct hist *h = &m->hist[m->n_hist - 1];
    s->n = 0, s->done = h->done, s->ctx = 0, s->exited = 0;
    for (int i = 0; i < h->n; i++) state_push(s, m->pool[h->off + (size_t)i]);
}

/* The error of a step whose closure was cut short (MAX_WORK steps for one byte, or MAX_NODES
 * stack nodes): its result would silently miss parses, so the step fails instead. */
static enum status too_ambiguous(void)
{
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "grammar: the constraint is too ambiguous to follow here: one byte needs more than %d "
                         "steps, or the parses more than %d stack nodes (counted repeats of overlapping "
                         "alternatives multiply them); simplify the pattern", MAX_WORK, MAX_NODES);
}

int grammar_matcher_overflowed(const struct grammar_matcher *m) { return m->p.overflow; }

enum status grammar_matcher_new(struct grammar *g, struct grammar_matcher **out)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof *m);
    if (!m) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "grammar matcher: out of memory");
    grammar_ref(g);
    m->g = g;
    pda_init(&m->p, &g->f);
    struct pstate s = {0};
    m->p.gen++;
    m->p.budget = MAX_WORK;
    /* The root's alternatives, over the empty stack. */
    const struct gflat *f = &g->f;
    for (int a = f->rule_alt[f->root]; a < f->rule_alt[f->root + 1]; a++) expand(&m->p, f->alt_pos[a], P_NONE, &s);
    push_state(m, &s, 0);
    free(s.ids);
    if (m->p.overflow) {
        enum status st = too_ambiguous();
        grammar_matcher_free(m);
        return st;
    }
    *out = m;
    return STATUS_OK;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m) return;
    pda_free(&m->p);
    free(m->pool), free(m->hist), free(m->a.ids), free(m->b.ids);
    for (int i = 0; m->lv && i <= m->g->vocab->max_len; i++) free(m->lv[i].ids);
    free(m->lv);
    grammar_unref(m->g);
    free(m);
}

static int is_end_id(const struct grammar_vocab *v, int32_t t)
{
    for (int i = 0; i < v->n_end; i++)
        if (v->end_ids[i] == t) return 1;
    return 0;
}

/* Runs bytes from state a; the result in a (b is scratch). 0 when some stack survives. */
static int run_bytes(struct grammar_matcher *m, const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        advance(&m->p, &m->a, s[i], &m->b);
        struct pstate t = m->a;
        m->a = m->b, m->b = t;
        m->a.exited = 0;
        if (!m->a.n && !m->a.done) return -1;
    }
    return 0;
}

enum status grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n)
{
    if (m->hist[m->n_hist - 1].ended) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: the sequence has ended");
    current(m, &m->a);
    m->p.overflow = 0;
    const int dead = run_bytes(m, (const uint8_t *)s, n);
    if (m->p.overflow) return too_ambiguous();
    if (dead) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: the text does not continue the grammar");
    push_state(m, &m->a, 0);
    return STATUS_OK;
}

enum status grammar_matcher_accept(struct grammar_matcher *m, int32_t token)
{
    const struct grammar_vocab *v = m->g->vocab;
    const struct hist *h = &m->hist[m->n_hist - 1];
    if (h->ended) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: token %d after the end", (int)token);
    if (token < 0 || token >= v->model_vocab)
        return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: token %d out of range", (int)token);
    if (is_end_id(v, token)) {
        if (!h->done) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: end token %d before the grammar is complete", (int)token);
        struct pstate e = {0};
        push_state(m, &e, 1);
        return STATUS_OK;
    }
    if (token >= v->n_tok || v->off[token + 1] == v->off[token])
        return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: token %d has no text the grammar may take", (int)token);
    current(m, &m->a);
    m->p.overflow = 0;
    const int dead = run_bytes(m, v->bytes + v->off[token], v->off[token + 1] - v->off[token]);
    if (m->p.overflow) return too_ambiguous();
    if (dead) return status_errorf(STATUS_INVALID_ARGUMENT, "grammar: token %d is not allowed here", (int)token);
    push_state(m, &m->a, 0);
    return STATUS_OK;
}

void grammar_matcher_rollback(struct grammar_matcher *m, int n_tokens)
{
    if (n_tokens <= 0) return;
    size_t keep = (size_t)n_tokens >= m->n_hist ? 1 : m->n_hist - (size_t)n_tokens;
    m->n_hist = keep;
    m->n_pool = m->hist[keep - 1].off + (size_t)m->hist[keep - 1].n;
}

int grammar_matcher_can_end(const struct grammar_matcher *m)
{
    const struct hist *h = &m->hist[m->n_hist - 1];
    return h->done || h->ended;
}

int grammar_matcher_is_done(const struct grammar_matcher *m)
{
    const struct hist *h = &m->hist[m->n_hist - 1];
    return h->ended || (h->done && h->n == 0);
}

/* The uncertain tokens of e against the whole stack `top`. They come in byte order, so the
 * states after a common prefix with the previous token checked are reused (lv[k]: after k
 * bytes), as in the entry walk. -1 (unfinished) once m->p.spent passes limit. */
static int check_uncertain(struct grammar_matcher *m, const struct mask_entry *e, int32_t top, uint32_t *mask,
                           long long limit)
{
    const struct grammar_vocab *v = m->g->vocab;
    if (!m->lv) {
        m->lv = calloc((size_t)v->max_len + 1, sizeof *m->lv);
        CHECK(m->lv, "grammar: out of memory");
    }
    struct pstate *lv = m->lv;
    lv[0].n = 0, lv[0].done = 0, lv[0].ctx = 0, lv[0].exited = 0;
    state_push(&lv[0], top);
    const uint8_t *prev = NULL;
    int valid = 0; /* lv[0..valid] hold the states along prev */
    for (int j = 0; j < e->n_unc; j++) {
        int32_t t = e->unc[j];
        if (m->p.spent > limit) return -1;
        if (mask[t >> 5] >> (t & 31) & 1) continue;
        const uint8_t *b = v->bytes + v->off[t];
        int len = (int)(v->off[t + 1] - v->off[t]), k = 0;
        while (k < valid && k < len && b[k] == prev[k]) k++;
        for (; k < len; k++) {
            advance(&m->p, &lv[k], b[k], &lv[k + 1]);
            lv[k + 1].exited = 0;
            if (!lv[k + 1].n && !lv[k + 1].done) break;
        }
        if (k == len) mask[t >> 5] |= 1u << (t & 31);
        prev = b, valid = k;
    }
    return 0;
}

enum status grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask)
{
    const struct grammar_vocab *v = m->g->vocab;
    int words = grammar_vocab_mask_words(v);
    memset(mask, 0, sizeof *mask * (size_t)words);
    const struct hist *h = &m->hist[m->n_hist - 1];
    m->p.overflow = 0;
    if (h->ended) return STATUS_OK;
    if (h->done)
        for (int i = 0; i < v->n_end; i++) mask[v->end_ids[i] >> 5] |= 1u << (v->end_ids[i] & 31);
    /* The work (closure steps, state ids, words ORed) is bounded: a grammar whose parses
     * multiply (counted repeats of overlapping alternatives) fails here instead of holding the
     * thread for minutes. Both counters only grow, so spent is the work of this call. */
    long long extra = 0, start = m->p.spent; /* extra: work outside m->p (entry walks, words ORed) */
    int over = 0;
    for (int i = 0; i < h->n && !over; i++) {
        int32_t top = m->pool[h->off + (size_t)i];
        int32_t key[KEY_DEPTH];
        int n = 0;
        int32_t q = top;
        while (q >= 0 && n < KEY_DEPTH) key[n++] = canonical_pos(m->g, m->p.nodes[q].pos), q = m->p.nodes[q].parent;
        int owned;
        long long left = MASK_WORK - (m->p.spent - start) - extra;
        struct mask_entry *e = left > 0 ? entry_get(m->g, key, n, q >= 0, &owned, left, &extra) : NULL;
        if (!e) {
            over = 1;
            break;
        }
        if (e->bits) {
            for (int w = 0; w < words; w++) mask[w] |= e->bits[w];
            extra += 1 + words / 64;
        } else {
            for (int j = 0; j < e->n_acc; j++) mask[e->acc[j] >> 5] |= 1u << (e->acc[j] & 31);
            extra += 1 + e->n_acc / 64;
        }
        over = check_uncertain(m, e, top, mask, start + MASK_WORK - extra) < 0;
        if (owned) entry_free(e);
    }
    if (!over && m->p.overflow) {
        memset(mask, 0, sizeof *mask * (size_t)words);
        return too_ambiguous();
    }
    if (!over) return STATUS_OK;
    memset(mask, 0, sizeof *mask * (size_t)words);
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "grammar: the constraint is too ambiguous to follow here: one token's mask needs more than "
                         "%lld steps with %d parses alive (counted repeats of overlapping alternatives multiply "
                         "them); simplify the pattern",
                         (long long)MASK_WORK, h->n);
}
