/* engine/grammar/grammar_gbnf.c - GBNF, llama.cpp's grammar format: `name ::= alternatives`,
 * literals "..." with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, classes [a-z] [^...], `.`,
 * rule references, groups, repetition * + ? {m} {m,} {m,n}, comments from #, start rule `root`.
 * A newline ends a rule except after `::=`, after `|` and inside parentheses (as llama.cpp).
 * Errors name the line. Tests: tests/test_grammar.c, tests/fuzz/fuzz_grammar.c. */
#include <stdio.h>
#include <string.h>

#include "grammar_impl.h"

struct gp {
    struct gbuild *b;
    const char    *s;
    size_t         n, i;
    int            depth;
};

static int line_of(const struct gp *p)
{
    int line = 1;
    for (size_t k = 0; k < p->i && k < p->n; k++) line += p->s[k] == '\n';
    return line;
}

static enum status gp_fail(struct gp *p, const char *what)
{
    return gb_fail(p->b, STATUS_INVALID_ARGUMENT, "grammar: line %d: %s", line_of(p), what);
}

static void space(struct gp *p, int newline_ok)
{
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '#') {
            while (p->i < p->n && p->s[p->i] != '\n') p->i++;
        } else if (c == ' ' || c == '\t' || c == '\r' || (newline_ok && c == '\n')) {
            p->i++;
        } else {
            break;
        }
    }
}

static int is_name(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

static int hexv(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

/* One character of a literal or class, escapes decoded; -1 on error. */
static int64_t gp_char(struct gp *p)
{
    if (p->i >= p->n) return gp_fail(p, "unexpected end"), -1;
    const uint8_t *u = (const uint8_t *)p->s;
    if (u[p->i] == '\\') {
        p->i++;
        if (p->i >= p->n) return gp_fail(p, "unexpected end after \\"), -1;
        char c = p->s[p->i++];
        int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
        if (digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; k++) {
                if (p->i >= p->n || hexv(p->s[p->i]) < 0) return gp_fail(p, "bad hex escape"), -1;
                v = v * 16 + (uint32_t)hexv(p->s[p->i++]);
            }
            if (v > 0x10FFFF) return gp_fail(p, "code point out of range"), -1;
            return v;
        }
        switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': return c;
        default: return gp_fail(p, "unknown escape"), -1;
        }
    }
    int n = u[p->i] < 0x80 ? 1 : u[p->i] >= 0xF0 ? 4 : u[p->i] >= 0xE0 ? 3 : u[p->i] >= 0xC0 ? 2 : 0;
    if (!n || p->i + (size_t)n > p->n) return gp_fail(p, "invalid UTF-8"), -1;
    uint32_t c = n == 1 ? u[p->i] : u[p->i] & (0x7F >> n);
    for (int k = 1; k < n; k++) {
        if ((u[p->i + (size_t)k] & 0xC0) != 0x80) return gp_fail(p, "invalid UTF-8"), -1;
        c = c << 6 | (u[p->i + (size_t)k] & 63);
    }
    p->i += (size_t)n;
    return c;
}

static struct gx *cp_expr(struct gp *p, uint32_t c)
{
    return gx_codepoints(p->b, &c, &c, 1);
}

static struct gx *gp_alts(struct gp *p);

static struct gx *gp_primary(struct gp *p)
{
    struct gbuild *b = p->b;
    char c = p->s[p->i];
    if (c == '"') {
        p->i++;
        struct gx *parts[256];
        struct gx *acc = NULL;
        int n = 0;
        while (p->i < p->n && p->s[p->i] != '"') {
            int64_t cp = gp_char(p);
            if (cp < 0) return NULL;
            if (n == 256) acc = acc ? gx_seq2(b, acc, gx_seq(b, n, parts)) : gx_seq(b, n, parts), n = 0;
            parts[n++] = cp_expr(p, (uint32_t)cp);
        }
        if (p->i >= p->n) return gp_fail(p, "unterminated literal"), NULL;
        p->i++;
        struct gx *tail = gx_seq(b, n, parts);
        return acc ? gx_seq2(b, acc, tail) : tail;
    }
    if (c == '[') {
        p->i++;
        struct cpset s = {0};
        int neg = p->i < p->n && p->s[p->i] == '^';
        if (neg) p->i++;
        while (p->i < p->n && p->s[p->i] != ']') {
            int64_t lo = gp_char(p), hi = lo;
            if (lo < 0) { cpset_free(&s); return NULL; }
            if (p->i + 1 < p->n && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                p->i++;
                hi = gp_char(p);
                if (hi < 0) { cpset_free(&s); return NULL; }
                if (hi < lo) { cpset_free(&s); return gp_fail(p, "reversed range"), NULL; }
            }
            cpset_add(&s, (uint32_t)lo, (uint32_t)hi);
        }
        if (p->i >= p->n) { cpset_free(&s); return gp_fail(p, "unterminated class"), NULL; }
        p->i++;
        if (neg) cpset_negate(&s);
        cpset_normalize(&s);
        struct gx *x = s.n ? gx_codepoints(b, s.lo, s.hi, s.n) : (gp_fail(p, "empty class"), NULL);
        cpset_free(&s);
        return x;
    }
    if (c == '.') {
        p->i++;
        uint32_t lo = 0, hi = 0x10FFFF;
        return gx_codepoints(b, &lo, &hi, 1);
    }
    if (c == '(') {
        p->i++;
        if (++p->depth > GRAMMAR_MAX_DEPTH) return gp_fail(p, "groups nested too deep"), NULL;
        space(p, 1);
        struct gx *x = gp_alts(p);
        p->depth--;
        if (!x) return NULL;
        if (p->i >= p->n || p->s[p->i] != ')') return gp_fail(p, "missing )"), NULL;
        p->i++;
        return x;
    }
    if (is_name(c)) {
        size_t st = p->i;
        while (p->i < p->n && is_name(p->s[p->i])) p->i++;
        char name[128];
        if (p->i - st >= sizeof name) return gp_fail(p, "rule name too long"), NULL;
        memcpy(name, p->s + st, p->i - st);
        name[p->i - st] = 0;
        return gx_ref(b, gb_rule(b, name));
    }
    return gp_fail(p, "expected a literal, class, rule name or group"), NULL;
}

static int gp_int(struct gp *p, int *v)
{
    size_t st = p->i;
    long x = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9' && x <= GRAMMAR_MAX_REPEAT) x = x * 10 + (p->s[p->i++] - '0');
    *v = (int)x;
    return p->i > st ? 0 : -1;
}

static struct gx *gp_seq(struct gp *p)
{
    struct gx *items[128];
    struct gx *acc = NULL;
    int n = 0, nested = p->depth > 0;
    while (p->i < p->n) {
        char c = p->s[p->i];
        if (c == '|' || c == ')' || c == '\n') break;
        struct gx *x = gp_primary(p);
        if (!x) return NULL;
        space(p, nested);
        while (p->i < p->n) {
            char q = p->s[p->i];
            int lo, hi;
            if (q == '*') lo = 0, hi = -1, p->i++;
            else if (q == '+') lo = 1, hi = -1, p->i++;
            else if (q == '?') lo = 0, hi = 1, p->i++;
            else if (q == '{') {
                p->i++;
                space(p, nested);
                if (gp_int(p, &lo)) return gp_fail(p, "expected a number after {"), NULL;
                space(p, nested);
                hi = lo;
                if (p->i < p->n && p->s[p->i] == ',') {
                    p->i++;
                    space(p, nested);
                    if (gp_int(p, &hi)) hi = -1;
                    space(p, nested);
                }
                if (p->i >= p->n || p->s[p->i] != '}') return gp_fail(p, "expected }"), NULL;
                p->i++;
            } else break;
            x = gx_repeat(p->b, x, lo, hi);
            if (!x) return NULL;
            space(p, nested);
        }
        if (n == 128) acc = acc ? gx_seq2(p->b, acc, gx_seq(p->b, n, items)) : gx_seq(p->b, n, items), n = 0;
        items[n++] = x;
    }
    struct gx *tail = gx_seq(p->b, n, items);
    return acc ? gx_seq2(p->b, acc, tail) : tail;
}

/* A line that opens with '|' continues the rule above (llama.cpp wants such lines inside
 * parentheses; accepting them at the top level too is strictly more lenient). */
static void continuation(struct gp *p)
{
    size_t save = p->i;
    space(p, 1);
    if (p->i >= p->n || p->s[p->i] != '|') p->i = save;
}

static struct gx *gp_alts(struct gp *p)
{
    struct gx *x = gp_seq(p);
    if (x) continuation(p);
    while (x && p->i < p->n && p->s[p->i] == '|') {
        p->i++;
        space(p, 1);
        struct gx *y = gp_seq(p);
        if (!y) return NULL;
        x = gx_alt2(p->b, x, y);
        continuation(p);
    }
    return x;
}

enum status gbnf_parse(struct gbuild *b, const char *src, size_t n, int *root)
{
    struct gp p = {.b = b, .s = src, .n = n};
    space(&p, 1);
    while (p.i < p.n && !b->failed) {
        size_t st = p.i;
        while (p.i < p.n && is_name(p.s[p.i])) p.i++;
        if (p.i == st) return gp_fail(&p, "expected a rule name");
        char name[128];
        if (p.i - st >= sizeof name) return gp_fail(&p, "rule name too long");
        memcpy(name, src + st, p.i - st);
        name[p.i - st] = 0;
        space(&p, 0);
        if (p.i + 3 > p.n || memcmp(src + p.i, "::=", 3)) return gp_fail(&p, "expected ::=");
        p.i += 3;
        space(&p, 1);
        int r = gb_rule(b, name);
        if (r < 0) break;
        if (b->rules[r].expr) {
            char msg[200];
            snprintf(msg, sizeof msg, "rule '%s' defined twice", name);
            return gp_fail(&p, msg);
        }
        struct gx *x = gp_alts(&p);
        if (!x) return b->failed ? (enum status)b->failed : gp_fail(&p, "syntax error");
        b->rules[r].expr = x;
        if (p.i < p.n && p.s[p.i] != '\n') return gp_fail(&p, "unexpected character");
        space(&p, 1);
    }
    if (b->failed) return (enum status)b->failed;
    for (int r = 0; r < b->n_rules; r++)
        if (!strcmp(b->rules[r].name, "root") && b->rules[r].expr) return *root = r, STATUS_OK;
    return gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: no rule named root");
}
