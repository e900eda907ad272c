/* engine/grammar/grammar_regex.c - regular expressions (the ECMAScript/Python subset: classes,
 * escapes \d \w \s and their negations, quantifiers * + ? {m} {m,} {m,n} with lazy forms, groups
 * (capturing, (?:...), named), alternation, ^ and $ at the ends) to expression trees, for
 * GRAMMAR_REGEX (the whole output matches) and for JSON Schema "pattern"/"format" (the content
 * of a JSON string, characters escaped as JSON writes them). Refused with the offset named:
 * backreferences, lookaround, word boundaries, flags, anchors inside.
 * Tests: tests/test_grammar.c, tests/test_grammar.py (against Python's re). */
#include <string.h>

#include "grammar_impl.h"

struct rx {
    struct gbuild *b;
    const char    *s;
    size_t         n, i;
    int            json; /* inside a JSON string */
    int            depth;
};

static enum status rx_fail(struct rx *r, const char *what)
{
    return gb_fail(r->b, STATUS_INVALID_ARGUMENT, "regex: %s at offset %zu", what, r->i);
}

static int utf8_cp(struct rx *r, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)r->s + r->i;
    size_t left = r->n - r->i;
    int n = u[0] < 0x80 ? 1 : u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 0;
    if (!n || (size_t)n > left) return rx_fail(r, "invalid UTF-8"), -1;
    uint32_t c = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int k = 1; k < n; k++) {
        if ((u[k] & 0xC0) != 0x80) return rx_fail(r, "invalid UTF-8"), -1;
        c = c << 6 | (u[k] & 63);
    }
    r->i += (size_t)n;
    *cp = c;
    return 0;
}

/* A code point set as an expression; inside JSON strings '"', '\' and controls take their
 * escaped forms (\" \\ \n \r \t \b \f; other controls as \u00XX is not generated). */
static struct gx *set_expr(struct rx *r, struct cpset *s)
{
    struct gbuild *b = r->b;
    cpset_normalize(s);
    if (!r->json) return s->n ? gx_codepoints(b, s->lo, s->hi, s->n) : (rx_fail(r, "empty class"), NULL);
    struct cpset t = {0};
    struct gx *alts[10];
    int na = 0;
    static const char esc_from[] = "\"\\\n\r\t\b\f", esc_to[] = "\"\\nrtbf";
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->lo[i] < 0x20 ? 0x20 : s->lo[i], hi = s->hi[i];
        for (uint32_t c = lo; c <= hi;) { /* split around '"' and '\' */
            uint32_t stop = hi;
            if (c <= '"' && '"' <= stop) stop = c == '"' ? '"' : '"' - 1;
            if (c <= '\\' && '\\' <= stop) stop = c == '\\' ? '\\' : '\\' - 1;
            if (c != '"' && c != '\\') cpset_add(&t, c, stop);
            if (c <= 0x7F && 0x7F <= stop) { /* DEL is written \u007f in canonical JSON: left out */
                t.n--;
                if (c < 0x7F) cpset_add(&t, c, 0x7E);
                if (stop > 0x7F) cpset_add(&t, 0x80, stop);
            }
            c = stop + 1;
            if (stop == 0xFFFFFFFFu) break;
        }
        for (int k = 0; k < 7; k++)
            if (s->lo[i] <= (uint8_t)esc_from[k] && (uint8_t)esc_from[k] <= s->hi[i]) {
                char e[2] = {'\\', esc_to[k]};
                alts[na++] = gx_lit(b, e, 2);
            }
    }
    if (t.n) alts[na++] = gx_codepoints(b, t.lo, t.hi, t.n);
    cpset_free(&t);
    if (!na) return rx_fail(r, "empty class"), NULL;
    return gx_alt(b, na, alts);
}

static void class_escape(struct cpset *s, char c)
{
    switch (c) {
    case 'd': cpset_add(s, '0', '9'); break;
    case 'w': cpset_add(s, '0', '9'), cpset_add(s, 'A', 'Z'), cpset_add(s, 'a', 'z'), cpset_add(s, '_', '_'); break;
    case 's': cpset_add(s, '\t', '\r'), cpset_add(s, ' ', ' '); break;
    }
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

/* After a backslash: a single code point into *cp (returns 0), a class into s (returns 1), or
 * an error (-1). in_class: \b is a backspace there. */
static int escape(struct rx *r, uint32_t *cp, struct cpset *s, int in_class)
{
    if (r->i >= r->n) return rx_fail(r, "trailing backslash"), -1;
    char c = r->s[r->i++];
    switch (c) {
    case 'd': case 'w': case 's': class_escape(s, c); return 1;
    case 'D': case 'W': case 'S': {
        struct cpset t = {0};
        class_escape(&t, (char)(c | 32));
        cpset_negate(&t);
        for (int i = 0; i < t.n; i++) cpset_add(s, t.lo[i], t.hi[i]);
        cpset_free(&t);
        return 1;
    }
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'b':
        if (in_class) return *cp = '\b', 0;
        return rx_fail(r, "word boundary \\b is not supported"), -1;
    case 'x': case 'u': {
        int digits = c == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int k = 0; k < digits; k++) {
            if (r->i >= r->n || hexval(r->s[r->i]) < 0) return rx_fail(r, "bad hex escape"), -1;
            v = v * 16 + (uint32_t)hexval(r->s[r->i++]);
        }
        *cp = v;
        return 0;
    }
    default:
        if ((c >= '1' && c <= '9') || c == 'k') return rx_fail(r, "backreferences are not supported"), -1;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return rx_fail(r, "unknown escape"), -1;
        r->i--;
        return utf8_cp(r, cp) ? -1 : 0;
    }
}

static struct gx *parse_class(struct rx *r)
{
    struct cpset s = {0};
    int neg = r->i < r->n && r->s[r->i] == '^';
    if (neg) r->i++;
    int first = 1;
    while (1) {
        if (r->i >= r->n) { cpset_free(&s); return rx_fail(r, "unterminated class"), NULL; }
        if (r->s[r->i] == ']' && !first) { r->i++; break; }
        first = 0;
        uint32_t lo;
        int k;
        if (r->s[r->i] == '\\') {
            r->i++;
            k = escape(r, &lo, &s, 1);
        } else {
            k = utf8_cp(r, &lo);
        }
        if (k < 0) { cpset_free(&s); return NULL; }
        if (k == 1) continue;
        uint32_t hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            if (r->s[r->i] == '\\') {
                r->i++;
                struct cpset dummy = {0};
                k = escape(r, &hi, &dummy, 1);
                cpset_free(&dummy);
                if (k != 0) { cpset_free(&s); return k < 0 ? NULL : (rx_fail(r, "class in a range"), NULL); }
            } else if (utf8_cp(r, &hi)) {
                cpset_free(&s);
                return NULL;
            }
            if (hi < lo) { cpset_free(&s); return rx_fail(r, "reversed range"), NULL; }
        }
        cpset_add(&s, lo, hi);
    }
    if (neg) cpset_negate(&s);
    struct gx *x = set_expr(r, &s);
    cpset_free(&s);
    return x;
}

static struct gx *parse_alt(struct rx *r);

static int parse_int(struct rx *r, int *v)
{
    size_t st = r->i;
    long x = 0;
    while (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9' && x <= GRAMMAR_MAX_REPEAT) x = x * 10 + (r->s[r->i++] - '0');
    *v = (int)x;
    return r->i > st ? 0 : -1;
}

static struct gx *parse_atom(struct rx *r)
{
    char c = r->s[r->i];
    struct cpset s = {0};
    struct gx *x = NULL;
    if (c == '(') {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            r->i++;
            if (r->i < r->n && r->s[r->i] == ':') r->i++;
            else if (r->i < r->n && (r->s[r->i] == 'P' || r->s[r->i] == '<') &&
                     !(r->s[r->i] == '<' && r->i + 1 < r->n && (r->s[r->i + 1] == '=' || r->s[r->i + 1] == '!'))) {
                while (r->i < r->n && r->s[r->i] != '>') r->i++; /* a named group: the name is dropped */
                r->i++;
            } else return rx_fail(r, "lookaround and inline flags are not supported"), NULL;
        }
        if (++r->depth > GRAMMAR_MAX_DEPTH) return rx_fail(r, "groups nested too deep"), NULL;
        x = parse_alt(r);
        r->depth--;
        if (!x) return NULL;
        if (r->i >= r->n || r->s[r->i] != ')') return rx_fail(r, "missing )"), NULL;
        r->i++;
        return x;
    }
    if (c == '[') {
        r->i++;
        return parse_class(r);
    }
    if (c == '.') {
        r->i++;
        cpset_add(&s, 0, '\n' - 1), cpset_add(&s, '\n' + 1, 0x10FFFF);
    } else if (c == '\\') {
        r->i++;
        uint32_t cp;
        int k = escape(r, &cp, &s, 0);
        if (k < 0) { cpset_free(&s); return NULL; }
        if (k == 0) cpset_add(&s, cp, cp);
    } else if (c == '*' || c == '+' || c == '?' || (c == '{' && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9')) {
        return rx_fail(r, "nothing to repeat"), NULL;
    } else if (c == '^' || c == '$') {
        return rx_fail(r, "anchors are supported only at the ends"), NULL;
    } else {
        uint32_t cp;
        if (utf8_cp(r, &cp)) return NULL;
        cpset_add(&s, cp, cp);
    }
    x = set_expr(r, &s);
    cpset_free(&s);
    return x;
}

static struct gx *parse_seq(struct rx *r)
{
    struct gx *items[64];
    struct gx *acc = NULL;
    int n = 0;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '$' && r->i + 1 == r->n && !r->depth) { r->i++; break; }
        struct gx *x = parse_atom(r);
        if (!x) return NULL;
        int quantified = 0;
        while (r->i < r->n) { /* quantifiers */
            char q = r->s[r->i];
            int lo, hi;
            if (q == '*') lo = 0, hi = -1, r->i++;
            else if (q == '+') lo = 1, hi = -1, r->i++;
            else if (q == '?') lo = 0, hi = 1, r->i++;
            else if (q == '{' && r->i + 1 < r->n && r->s[r->i + 1] >= '0' && r->s[r->i + 1] <= '9') {
                r->i++;
                parse_int(r, &lo);
                hi = lo;
                if (r->i < r->n && r->s[r->i] == ',') {
                    r->i++;
                    if (parse_int(r, &hi)) hi = -1;
                }
                if (r->i >= r->n || r->s[r->i] != '}') return rx_fail(r, "bad {m,n}"), NULL;
                r->i++;
            } else break;
            if (quantified++) return rx_fail(r, "multiple repeat"), NULL; /* as Python's re */
            if (r->i < r->n && (r->s[r->i] == '?' || r->s[r->i] == '+')) r->i++; /* lazy/possessive: same language */
            x = gx_repeat(r->b, x, lo, hi);
            if (!x) return NULL;
        }
        if (n == 64) { /* long sequences: fold */
            acc = acc ? gx_seq2(r->b, acc, gx_seq(r->b, n, items)) : gx_seq(r->b, n, items);
            n = 0;
        }
        items[n++] = x;
    }
    struct gx *tail = gx_seq(r->b, n, items);
    return acc ? gx_seq2(r->b, acc, tail) : tail;
}

static struct gx *parse_alt(struct rx *r)
{
    struct gx *x = parse_seq(r);
    while (x && r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        struct gx *y = parse_seq(r);
        if (!y) return NULL;
        x = gx_alt2(r->b, x, y);
    }
    return x;
}

enum status regex_parse(struct gbuild *b, const char *src, size_t n, int json_string, struct gx **out)
{
    struct rx r = {.b = b, .s = src, .n = n, .json = json_string};
    *out = NULL;
    int anchored_start = n && src[0] == '^';
    if (anchored_start) r.i = 1;
    struct gx *x = parse_alt(&r);
    if (!x) return b->failed ? (enum status)b->failed : rx_fail(&r, "syntax error");
    if (r.i < r.n) return rx_fail(&r, "unbalanced )");
    int anchored_end = n && src[n - 1] == '$' && (n < 2 || src[n - 2] != '\\');
    if (json_string) { /* JSON Schema patterns search: an unanchored end matches anything there */
        struct cpset any = {0};
        cpset_add(&any, 0, 0x10FFFF);
        struct gx *star = gx_repeat(b, set_expr(&r, &any), 0, -1);
        cpset_free(&any);
        if (!anchored_start) x = gx_seq2(b, star, x);
        if (!anchored_end) x = gx_seq2(b, x, star);
    }
    *out = x;
    return (enum status)b->failed;
}
