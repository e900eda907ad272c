/* engine/text/jinja_parse.c - the Jinja lexer and parser: template text to the syntax tree of
 * jinja_impl.h, following jinja2 3.1's lexer.py and parser.py (delimiters {{ }}, {% %}, {# #};
 * whitespace control with - and +; trim_blocks and lstrip_blocks; raw blocks; one trailing
 * newline dropped; newlines normalized to \n; Python string escapes). The tree lives in the
 * template's arena. Not here: evaluation (jinja_eval.c). Tests: tests/test_jinja.py. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

enum tok_type {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};

struct tok {
    enum tok_type type;
    int           line;
    const char   *p; /* TK_NAME, TK_OP: NUL-terminated copy; TK_DATA, TK_STRING: value */
    size_t        n;
    int64_t       i;
    double        f;
};

struct parser {
    struct jstate *st;
    const struct jinja_options *opt;
    const char *src;
    size_t      len, pos;
    int         line;
    struct tok *toks;
    size_t      n_toks, cap_toks, at;
    int         depth;    /* expression nesting */
    int         in_loop;  /* for break / continue */
};

#define PFAIL(p, line_, ...) ((p)->st->line = (line_), jfail((p)->st, STATUS_BAD_FORMAT, __VA_ARGS__))

static char *pdup(struct parser *p, const char *s, size_t n)
{
    char *d = jalloc(p->st, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static struct tok *push_tok(struct parser *p, enum tok_type type, int line)
{
    if (p->n_toks == p->cap_toks) {
        size_t cap = p->cap_toks ? 2 * p->cap_toks : 256;
        struct tok *t = jalloc(p->st, cap * sizeof(*t));
        if (p->n_toks) memcpy(t, p->toks, p->n_toks * sizeof(*t));
        p->toks = t;
        p->cap_toks = cap;
    }
    struct tok *t = &p->toks[p->n_toks++];
    memset(t, 0, sizeof(*t));
    t->type = type;
    t->line = line;
    return t;
}

static int count_lines(const char *s, size_t n)
{
    int c = 0;
    for (size_t i = 0; i < n; i++) c += s[i] == '\n';
    return c;
}

/* ---- lexer ---------------------------------------------------------------------------- */

/* Python's unicode-escape decoding of a string literal's body. */
static void unescape(struct parser *p, const char *s, size_t n, struct tok *t)
{
    char *d = jalloc(p->st, n + 1);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 >= n) {
            d[o++] = s[i];
            continue;
        }
        char c = s[++i];
        const char *simple = strchr("nrtabfv\\'\"\n", c);
        if (simple && c) {
            static const char from[] = "nrtabfv\\'\"";
            static const char to[] = "\n\r\t\a\b\f\v\\'\"";
            if (c == '\n') continue; /* backslash-newline: a line continuation */
            d[o++] = to[strchr(from, c) - from];
        } else if (c == 'x' || c == 'u' || c == 'U' || (c >= '0' && c <= '7')) {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 3;
            int base = c >= '0' && c <= '7' ? 8 : 16;
            size_t j = c >= '0' && c <= '7' ? i : i + 1;
            uint32_t cp = 0;
            int k = 0;
            for (; k < digits && j < n; k++, j++) {
                int v = isdigit((unsigned char)s[j]) ? s[j] - '0'
                        : isxdigit((unsigned char)s[j]) ? (tolower((unsigned char)s[j]) - 'a' + 10)
                                                        : 99;
                if (v >= base) break;
                cp = cp * (uint32_t)base + (uint32_t)v;
            }
            if (base == 16 && k < digits) PFAIL(p, t->line, "truncated \\%c escape", c);
            if (cp > 0x10FFFF) PFAIL(p, t->line, "illegal Unicode character");
            i = j - 1;
            if (cp < 0x80) d[o++] = (char)cp;
            else if (cp < 0x800) d[o++] = (char)(0xC0 | cp >> 6), d[o++] = (char)(0x80 | (cp & 63));
            else if (cp < 0x10000)
                d[o++] = (char)(0xE0 | cp >> 12), d[o++] = (char)(0x80 | ((cp >> 6) & 63)),
                d[o++] = (char)(0x80 | (cp & 63));
            else
                d[o++] = (char)(0xF0 | cp >> 18), d[o++] = (char)(0x80 | ((cp >> 12) & 63)),
                d[o++] = (char)(0x80 | ((cp >> 6) & 63)), d[o++] = (char)(0x80 | (cp & 63));
        } else {
            d[o++] = '\\';
            d[o++] = c;
        }
    }
    d[o] = 0;
    t->p = d;
    t->n = o;
}

static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static int starts(const struct parser *p, size_t at, const char *s)
{
    size_t n = strlen(s);
    return at + n <= p->len && !memcmp(p->src + at, s, n);
}

static void emit_data(struct parser *p, size_t from, size_t to, int line)
{
    if (to <= from) return;
    struct tok *t = push_tok(p, TK_DATA, line);
    t->p = p->src + from;
    t->n = to - from;
}

/* Lexes the inside of a {{ }} or {% %} tag from p->pos; returns with p->pos after the end
 * delimiter and the trailing whitespace it removes. Sets *line_starting. */
static void lex_tag(struct parser *p, int is_block, int *line_starting)
{
    int balance = 0;
    const char *close = is_block ? "%}" : "}}";
    for (;;) {
        while (p->pos < p->len && is_space(p->src[p->pos])) {
            if (p->src[p->pos] == '\n') p->line++;
            p->pos++;
        }
        if (p->pos >= p->len) PFAIL(p, p->line, "unexpected end of template, expected '%s'", close);
        const char *s = p->src + p->pos;
        size_t rest = p->len - p->pos;
        if (!balance) {
            int dash = s[0] == '-' && rest >= 3 && !memcmp(s + 1, close, 2);
            int plus = s[0] == '+' && rest >= 3 && !memcmp(s + 1, close, 2) && is_block;
            if (dash || plus || (rest >= 2 && !memcmp(s, close, 2))) {
                push_tok(p, is_block ? TK_BLOCK_END : TK_VAR_END, p->line);
                p->pos += dash || plus ? 3 : 2;
                *line_starting = 0;
                if (dash) {
                    while (p->pos < p->len && is_space(p->src[p->pos])) {
                        if (p->src[p->pos] == '\n') p->line++, *line_starting = 1;
                        else *line_starting = 0;
                        p->pos++;
                    }
                } else if (!plus && is_block && p->opt->trim_blocks && p->pos < p->len &&
                           p->src[p->pos] == '\n') {
                    p->pos++, p->line++, *line_starting = 1;
                }
                return;
            }
        }
        if (isdigit((unsigned char)s[0])) {
            size_t n = 0, d;
            char num[128];
            int is_float = 0;
            while (n < rest && (isdigit((unsigned char)s[n]) || (s[n] == '_' && n + 1 < rest && isdigit((unsigned char)s[n + 1])))) n++;
            if (n + 1 < rest && s[n] == '.' && isdigit((unsigned char)s[n + 1])) {
                is_float = 1;
                n++;
                while (n < rest && (isdigit((unsigned char)s[n]) || s[n] == '_')) n++;
            }
            if (n < rest && (s[n] == 'e' || s[n] == 'E')) {
                size_t m = n + 1;
                if (m < rest && (s[m] == '+' || s[m] == '-')) m++;
                if (m < rest && isdigit((unsigned char)s[m])) {
                    while (m < rest && isdigit((unsigned char)s[m])) m++;
                    n = m;
                    is_float = 1;
                }
            }
            if (n >= sizeof(num)) PFAIL(p, p->line, "number too long");
            d = 0;
            for (size_t k = 0; k < n; k++)
                if (s[k] != '_') num[d++] = s[k];
            num[d] = 0;
            struct tok *t = push_tok(p, is_float ? TK_FLOAT : TK_INT, p->line);
            if (is_float) {
                t->f = strtod(num, NULL);
            } else {
                char *end;
                t->i = strtoll(num, &end, 10);
                if (d > 18 && strcmp(num, "9223372036854775807") > 0 && d >= 19)
                    PFAIL(p, p->line, "integer literal too large");
            }
            p->pos += n;
        } else if (isalpha((unsigned char)s[0]) || s[0] == '_') {
            size_t n = 1;
            while (n < rest && (isalnum((unsigned char)s[n]) || s[n] == '_')) n++;
            struct tok *t = push_tok(p, TK_NAME, p->line);
            t->p = pdup(p, s, n);
            t->n = n;
            p->pos += n;
        } else if (s[0] == '\'' || s[0] == '"') {
            size_t n = 1;
            while (n < rest && s[n] != s[0]) n += s[n] == '\\' ? 2 : 1;
            if (n >= rest) PFAIL(p, p->line, "unexpected end of string");
            struct tok *t = push_tok(p, TK_STRING, p->line);
            unescape(p, s + 1, n - 1, t);
            p->line += count_lines(s, n);
            p->pos += n + 1;
        } else {
            static const char *ops2[] = {"//", "**", "==", "!=", ">=", "<="};
            size_t n = 0;
            for (size_t k = 0; k < sizeof(ops2) / sizeof(ops2[0]); k++)
                if (rest >= 2 && !memcmp(s, ops2[k], 2)) n = 2;
            if (!n && strchr("+-/*%~[](){}<>=.:|,;", s[0])) n = 1;
            if (!n || !s[0]) PFAIL(p, p->line, "unexpected char '%c'", s[0] ? s[0] : '?');
            if (strchr("([{", s[0])) balance++;
            if (strchr(")]}", s[0]) && n == 1) {
                if (!balance) PFAIL(p, p->line, "unexpected '%c'", s[0]);
                balance--;
            }
            struct tok *t = push_tok(p, TK_OP, p->line);
            t->p = pdup(p, s, n);
            t->n = n;
            p->pos += n;
        }
    }
}

/* {% raw %} ... {% endraw %}: p->pos is after the raw tag. */
static void lex_raw(struct parser *p, int *line_starting)
{
    for (size_t at = p->pos; at + 1 < p->len; at++) {
        if (p->src[at] != '{' || p->src[at + 1] != '%') continue;
        size_t k = at + 2;
        int dash = k < p->len && p->src[k] == '-';
        if (k < p->len && (p->src[k] == '-' || p->src[k] == '+')) k++;
        while (k < p->len && is_space(p->src[k])) k++;
        if (!starts(p, k, "endraw")) continue;
        k += 6;
        while (k < p->len && is_space(p->src[k])) k++;
        int rdash = k < p->len && p->src[k] == '-', rplus = k < p->len && p->src[k] == '+';
        if (rdash || rplus) k++;
        if (!starts(p, k, "%}")) continue;
        size_t end = at;
        if (dash)
            while (end > p->pos && is_space(p->src[end - 1])) end--;
        emit_data(p, p->pos, end, p->line);
        p->line += count_lines(p->src + p->pos, k + 2 - p->pos);
        p->pos = k + 2;
        *line_starting = 0;
        if (rdash) {
            while (p->pos < p->len && is_space(p->src[p->pos])) p->line += p->src[p->pos++] == '\n';
        } else if (!rplus && p->opt->trim_blocks && p->pos < p->len && p->src[p->pos] == '\n') {
            p->pos++, p->line++, *line_starting = 1;
        }
        return;
    }
    PFAIL(p, p->line, "missing end of raw directive");
}

static void lex(struct parser *p)
{
    int line_starting = 1;
    while (p->pos < p->len) {
        size_t at = p->pos;
        while (at + 1 < p->len && !(p->src[at] == '{' && strchr("{%#", p->src[at + 1]))) at++;
        if (at + 1 >= p->len) {
            emit_data(p, p->pos, p->len, p->line);
            p->line += count_lines(p->src + p->pos, p->len - p->pos);
            break;
        }
        char kind = p->src[at + 1];
        char sign = at + 2 < p->len ? p->src[at + 2] : 0;
        size_t text_end = at;
        if (sign == '-') {
            while (text_end > p->pos && is_space(p->src[text_end - 1])) text_end--;
        } else if (sign != '+' && p->opt->lstrip_blocks && kind != '{') {
            size_t l = at;
            while (l > p->pos && p->src[l - 1] != '\n') l--;
            int all_space = l < at;
            for (size_t k = l; k < at; k++) all_space &= is_space(p->src[k]);
            if ((l > p->pos || line_starting) && all_space) text_end = l;
        }
        int data_line = p->line;
        p->line += count_lines(p->src + p->pos, at - p->pos);
        size_t tag = at + 2 + (sign == '-' || sign == '+');
        /* a raw block? */
        size_t k = tag;
        while (k < p->len && is_space(p->src[k])) k++;
        int is_raw = 0;
        if (kind == '%' && starts(p, k, "raw")) {
            size_t m = k + 3;
            while (m < p->len && is_space(p->src[m])) m++;
            int dash = m < p->len && p->src[m] == '-';
            if (starts(p, m + dash, "%}") && (m == k + 3 || is_space(p->src[k + 3]) || dash || starts(p, k + 3, "%}"))) {
                emit_data(p, p->pos, text_end, data_line);
                p->line += count_lines(p->src + at, m + dash + 2 - at);
                p->pos = m + dash + 2;
                if (dash)
                    while (p->pos < p->len && is_space(p->src[p->pos])) p->line += p->src[p->pos++] == '\n';
                lex_raw(p, &line_starting);
                is_raw = 1;
            }
        }
        if (is_raw) continue;
        emit_data(p, p->pos, text_end, data_line);
        p->pos = tag;
        if (kind == '#') {
            size_t e = tag;
            while (e + 1 < p->len && !(p->src[e] == '#' && p->src[e + 1] == '}')) e++;
            if (e + 1 >= p->len) PFAIL(p, p->line, "missing end of comment tag");
            int dash = e > tag && p->src[e - 1] == '-', plus = e > tag && p->src[e - 1] == '+';
            p->line += count_lines(p->src + tag, e + 2 - tag);
            p->pos = e + 2;
            line_starting = 0;
            if (dash) {
                while (p->pos < p->len && is_space(p->src[p->pos])) {
                    line_starting = p->src[p->pos] == '\n';
                    p->line += p->src[p->pos++] == '\n';
                }
            } else if (!plus && p->opt->trim_blocks && p->pos < p->len && p->src[p->pos] == '\n') {
                p->pos++, p->line++, line_starting = 1;
            }
            continue;
        }
        push_tok(p, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, p->line);
        lex_tag(p, kind == '%', &line_starting);
    }
    push_tok(p, TK_EOF, p->line);
}

/* ---- parser --------------------------------------------------------------------------- */

static struct tok *cur(struct parser *p) { return &p->toks[p->at]; }
static struct tok *peek(struct parser *p, int k)
{
    size_t i = p->at + (size_t)k;
    return &p->toks[i < p->n_toks ? i : p->n_toks - 1];
}
static int is_op(const struct tok *t, const char *op) { return t->type == TK_OP && !strcmp(t->p, op); }
static int is_name(const struct tok *t, const char *n) { return t->type == TK_NAME && !strcmp(t->p, n); }
static struct tok *next(struct parser *p)
{
    struct tok *t = cur(p);
    if (t->type != TK_EOF) p->at++;
    return t;
}

static const char *tok_desc(const struct tok *t)
{
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: return t->p;
    }
}

static void expect_op(struct parser *p, const char *op)
{
    if (!is_op(cur(p), op)) PFAIL(p, cur(p)->line, "expected '%s', got %s", op, tok_desc(cur(p)));
    next(p);
}

static void expect_type(struct parser *p, enum tok_type type, const char *what)
{
    if (cur(p)->type != type) PFAIL(p, cur(p)->line, "expected %s, got %s", what, tok_desc(cur(p)));
    next(p);
}

static const char *expect_name(struct parser *p)
{
    if (cur(p)->type != TK_NAME) PFAIL(p, cur(p)->line, "expected a name, got %s", tok_desc(cur(p)));
    return next(p)->p;
}

static struct jnode *node(struct parser *p, enum jnode_kind kind, int line)
{
    struct jnode *n = jalloc(p->st, sizeof(*n));
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable array of node pointers during parsing. */
struct nvec {
    struct jnode **v;
    const char  **names;
    int           n, cap;
};

static void nvec_push(struct parser *p, struct nvec *v, struct jnode *x, const char *name)
{
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 8;
        struct jnode **nv = jalloc(p->st, (size_t)cap * sizeof(*nv));
        const char **nn = jalloc(p->st, (size_t)cap * sizeof(*nn));
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(*nv)), memcpy(nn, v->names, (size_t)v->n * sizeof(*nn));
        v->v = nv, v->names = nn, v->cap = cap;
    }
    v->names[v->n] = name;
    v->v[v->n++] = x;
}

static struct jnode *parse_expression(struct parser *p, int with_condexpr);
static struct jnode *parse_or(struct parser *p);
static struct jnode *parse_unary(struct parser *p, int with_filter);
static struct jnode *parse_primary(struct parser *p);
static struct jnode *parse_postfix(struct parser *p, struct jnode *n);

static void enter(struct parser *p)
{
    if (++p->depth > 200) PFAIL(p, cur(p)->line, "expression nested too deeply");
}

/* Call arguments after '(' up to and including ')': positional into n->kids, keywords into
 * n->kw_names / kw_vals. */
static void parse_call_args(struct parser *p, struct jnode *n)
{
    struct nvec pos = {0}, kw = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (pos.n || kw.n) expect_op(p, ",");
        if (is_op(cur(p), ")")) break;
        if (is_op(cur(p), "*") || is_op(cur(p), "**"))
            PFAIL(p, cur(p)->line, "*args and **kwargs are not supported");
        if (cur(p)->type == TK_NAME && is_op(peek(p, 1), "=")) {
            const char *name = next(p)->p;
            next(p);
            nvec_push(p, &kw, parse_expression(p, 1), name);
        } else {
            if (kw.n) PFAIL(p, cur(p)->line, "positional argument after keyword argument");
            nvec_push(p, &pos, parse_expression(p, 1), NULL);
        }
    }
    next(p);
    n->kids = pos.v, n->n_kids = pos.n;
    n->kw_names = kw.names, n->kw_vals = kw.v, n->n_kw = kw.n;
}

static struct jnode *parse_tuple(struct parser *p, int with_condexpr, int explicit_parens)
{
    int line = cur(p)->line;
    struct nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) expect_op(p, ",");
        struct tok *t = cur(p);
        if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(t, ")") || is_op(t, "]") ||
            is_op(t, "}") || (items.n && (is_name(t, "in") || is_op(t, "="))) || t->type == TK_EOF)
            break;
        nvec_push(p, &items, with_condexpr ? parse_expression(p, 1) : parse_or(p), NULL);
        if (!is_op(cur(p), ",")) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) PFAIL(p, line, "expected an expression, got %s", tok_desc(cur(p)));
    }
    struct jnode *n = node(p, JN_TUPLE, line);
    n->kids = items.v, n->n_kids = items.n;
    return n;
}

static struct jnode *parse_primary(struct parser *p)
{
    struct tok *t = cur(p);
    struct jnode *n;
    enter(p);
    if (t->type == TK_NAME) {
        next(p);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True") || !strcmp(t->p, "false") ||
            !strcmp(t->p, "False")) {
            n = node(p, JN_LITERAL, t->line);
            n->lit = jv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) {
            n = node(p, JN_LITERAL, t->line);
            n->lit = jv_none();
        } else {
            n = node(p, JN_NAME, t->line);
            n->name = t->p;
        }
    } else if (t->type == TK_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0, k = p->at;
        while (p->toks[k].type == TK_STRING) total += p->toks[k++].n;
        char *s = jalloc(p->st, total + 1);
        size_t o = 0;
        while (cur(p)->type == TK_STRING) {
            memcpy(s + o, cur(p)->p, cur(p)->n);
            o += cur(p)->n;
            next(p);
        }
        s[o] = 0;
        n = node(p, JN_LITERAL, t->line);
        n->lit.type = JV_STRING;
        n->lit.u.s.p = s;
        n->lit.u.s.n = o;
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        next(p);
        n = node(p, JN_LITERAL, t->line);
        n->lit = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (is_op(t, "(")) {
        next(p);
        n = parse_tuple(p, 1, 1);
        expect_op(p, ")");
    } else if (is_op(t, "[") || is_op(t, "{")) {
        int dict = t->p[0] == '{';
        next(p);
        struct nvec items = {0};
        while (!is_op(cur(p), dict ? "}" : "]")) {
            if (items.n) expect_op(p, ",");
            if (is_op(cur(p), dict ? "}" : "]")) break;
            nvec_push(p, &items, parse_expression(p, 1), NULL);
            if (dict) {
                expect_op(p, ":");
                nvec_push(p, &items, parse_expression(p, 1), NULL);
            }
        }
        next(p);
        n = node(p, dict ? JN_DICT : JN_LIST, t->line);
        n->kids = items.v, n->n_kids = items.n;
    } else {
        PFAIL(p, t->line, "unexpected %s", tok_desc(t));
    }
    p->depth--;
    return n;
}

static struct jnode *parse_subscript_part(struct parser *p)
{
    int line = cur(p)->line;
    struct jnode *start = NULL, *stop = NULL, *step = NULL;
    if (!is_op(cur(p), ":")) {
        start = parse_expression(p, 1);
        if (!is_op(cur(p), ":")) return start;
    }
    next(p);
    if (!is_op(cur(p), "]") && !is_op(cur(p), ",") && !is_op(cur(p), ":")) stop = parse_expression(p, 1);
    if (is_op(cur(p), ":")) {
        next(p);
        if (!is_op(cur(p), "]") && !is_op(cur(p), ",")) step = parse_expression(p, 1);
    }
    struct jnode *n = node(p, JN_SLICE, line);
    n->b = start, n->c = stop, n->d = step;
    return n;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *n)
{
    for (;;) {
        struct tok *t = cur(p);
        if (is_op(t, ".")) {
            next(p);
            struct tok *a = next(p);
            struct jnode *g;
            if (a->type == TK_NAME) {
                g = node(p, JN_GETATTR, t->line);
                g->name = a->p;
            } else if (a->type == TK_INT) {
                g = node(p, JN_GETITEM, t->line);
                g->b = node(p, JN_LITERAL, t->line);
                g->b->lit = jv_int(a->i);
            } else {
                PFAIL(p, a->line, "expected a name after '.'");
            }
            g->a = n;
            n = g;
        } else if (is_op(t, "[")) {
            next(p);
            struct nvec parts = {0};
            while (!is_op(cur(p), "]")) {
                if (parts.n) expect_op(p, ",");
                if (is_op(cur(p), "]")) break;
                nvec_push(p, &parts, parse_subscript_part(p), NULL);
            }
            next(p);
            if (parts.n == 0) PFAIL(p, t->line, "expected a subscript");
            struct jnode *key = parts.v[0];
            if (parts.n > 1) {
                for (int k = 0; k < parts.n; k++)
                    if (parts.v[k]->kind == JN_SLICE) PFAIL(p, t->line, "slices inside a tuple subscript are not supported");
                key = node(p, JN_TUPLE, t->line);
                key->kids = parts.v, key->n_kids = parts.n;
            }
            if (key->kind == JN_SLICE) {
                key->a = n;
                n = key;
            } else {
                struct jnode *g = node(p, JN_GETITEM, t->line);
                g->a = n, g->b = key;
                n = g;
            }
        } else if (is_op(t, "(")) {
            struct jnode *c = node(p, JN_CALL, t->line);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static const char *parse_dotted_name(struct parser *p)
{
    const char *name = expect_name(p);
    while (is_op(cur(p), ".") && peek(p, 1)->type == TK_NAME) {
        next(p);
        const char *more = next(p)->p;
        size_t a = strlen(name), b = strlen(more);
        char *s = jalloc(p->st, a + b + 2);
        memcpy(s, name, a), s[a] = '.', memcpy(s + a + 1, more, b + 1);
        name = s;
    }
    return name;
}

/* One filter applied to in (NULL in filter blocks): after the '|'. */
static struct jnode *parse_filter(struct parser *p, struct jnode *in)
{
    struct jnode *f = node(p, JN_FILTER, cur(p)->line);
    f->name = parse_dotted_name(p);
    f->a = in;
    if (is_op(cur(p), "(")) parse_call_args(p, f);
    return f;
}

static struct jnode *parse_filter_expr(struct parser *p, struct jnode *n)
{
    for (;;) {
        struct tok *t = cur(p);
        if (is_op(t, "|")) {
            next(p);
            n = parse_filter(p, n);
        } else if (is_name(t, "is")) {
            next(p);
            struct jnode *test = node(p, JN_TEST, t->line);
            if (is_name(cur(p), "not")) next(p), test->op = 1;
            test->name = parse_dotted_name(p);
            test->a = n;
            struct tok *c = cur(p);
            if (is_op(c, "(")) {
                parse_call_args(p, test);
            } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
                        c->type == TK_FLOAT || is_op(c, "(") || is_op(c, "[") || is_op(c, "{")) &&
                       !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
                if (is_name(c, "is")) PFAIL(p, c->line, "You cannot chain multiple tests with is");
                struct jnode *arg = parse_postfix(p, parse_primary(p));
                test->kids = jalloc(p->st, sizeof(*test->kids));
                test->kids[0] = arg;
                test->n_kids = 1;
            }
            n = test;
        } else if (is_op(t, "(")) {
            struct jnode *c = node(p, JN_CALL, t->line);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_unary(struct parser *p, int with_filter)
{
    struct tok *t = cur(p);
    struct jnode *n;
    enter(p);
    if (is_op(t, "-") || is_op(t, "+")) {
        next(p);
        n = node(p, JN_UNARY, t->line);
        n->op = t->p[0];
        n->a = parse_unary(p, 0);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static struct jnode *binop(struct parser *p, int op, struct jnode *a, struct jnode *b, int line)
{
    struct jnode *n = node(p, JN_BINOP, line);
    n->op = op, n->a = a, n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *p)
{
    struct jnode *n = parse_unary(p, 1);
    while (is_op(cur(p), "**")) {
        int line = next(p)->line;
        n = binop(p, 'p', n, parse_unary(p, 1), line);
    }
    return n;
}

static struct jnode *parse_math2(struct parser *p)
{
    struct jnode *n = parse_pow(p);
    for (;;) {
        struct tok *t = cur(p);
        int op = is_op(t, "*") ? '*' : is_op(t, "/") ? '/' : is_op(t, "//") ? 'f' : is_op(t, "%") ? '%' : 0;
        if (!op) return n;
        next(p);
        n = binop(p, op, n, parse_pow(p), t->line);
    }
}

static struct jnode *parse_concat(struct parser *p)
{
    struct jnode *n = parse_math2(p);
    while (is_op(cur(p), "~")) {
        int line = next(p)->line;
        n = binop(p, '~', n, parse_math2(p), line);
    }
    return n;
}

static struct jnode *parse_math1(struct parser *p)
{
    struct jnode *n = parse_concat(p);
    for (;;) {
        struct tok *t = cur(p);
        int op = is_op(t, "+") ? '+' : is_op(t, "-") ? '-' : 0;
        if (!op) return n;
        next(p);
        n = binop(p, op, n, parse_concat(p), t->line);
    }
}

static struct jnode *parse_compare(struct parser *p)
{
    struct jnode *first = parse_math1(p);
    struct nvec rest = {0};
    int ops[64];
    for (;;) {
        struct tok *t = cur(p);
        int op = -1;
        if (is_op(t, "==")) op = JCMP_EQ;
        else if (is_op(t, "!=")) op = JCMP_NE;
        else if (is_op(t, "<")) op = JCMP_LT;
        else if (is_op(t, "<=")) op = JCMP_LE;
        else if (is_op(t, ">")) op = JCMP_GT;
        else if (is_op(t, ">=")) op = JCMP_GE;
        else if (is_name(t, "in")) op = JCMP_IN;
        else if (is_name(t, "not") && is_name(peek(p, 1), "in")) op = JCMP_NOT_IN, next(p);
        if (op < 0) break;
        if (rest.n == 64) PFAIL(p, t->line, "comparison chain too long");
        next(p);
        ops[rest.n] = op;
        nvec_push(p, &rest, parse_math1(p), NULL);
    }
    if (!rest.n) return first;
    struct jnode *n = node(p, JN_COMPARE, first->line);
    n->a = first, n->kids = rest.v, n->n_kids = rest.n;
    n->ops = jalloc(p->st, (size_t)rest.n * sizeof(int));
    memcpy(n->ops, ops, (size_t)rest.n * sizeof(int));
    return n;
}

static struct jnode *parse_not(struct parser *p)
{
    if (is_name(cur(p), "not")) {
        int line = next(p)->line;
        enter(p);
        struct jnode *n = node(p, JN_UNARY, line);
        n->op = 'n';
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p)
{
    struct jnode *n = parse_not(p);
    while (is_name(cur(p), "and")) {
        int line = next(p)->line;
        struct jnode *a = node(p, JN_AND, line);
        a->a = n, a->b = parse_not(p);
        n = a;
    }
    return n;
}

static struct jnode *parse_or(struct parser *p)
{
    struct jnode *n = parse_and(p);
    while (is_name(cur(p), "or")) {
        int line = next(p)->line;
        struct jnode *o = node(p, JN_OR, line);
        o->a = n, o->b = parse_and(p);
        n = o;
    }
    return n;
}

static struct jnode *parse_expression(struct parser *p, int with_condexpr)
{
    enter(p);
    struct jnode *n = parse_or(p);
    while (with_condexpr && is_name(cur(p), "if")) {
        int line = next(p)->line;
        struct jnode *c = node(p, JN_COND, line);
        c->b = n;
        c->a = parse_or(p);
        if (is_name(cur(p), "else")) {
            next(p);
            c->c = parse_expression(p, 1);
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* ---- statements ----------------------------------------------------------------------- */

static struct jnode *parse_body(struct parser *p, const char *const *ends);

static struct jnode *parse_assign_target(struct parser *p, int allow_attr)
{
    int line = cur(p)->line;
    int parens = is_op(cur(p), "(");
    if (parens) next(p);
    struct nvec names = {0};
    for (;;) {
        const char *name = expect_name(p);
        struct jnode *n = node(p, JN_NAME, line);
        n->name = name;
        if (allow_attr && !names.n && is_op(cur(p), ".")) {
            next(p);
            struct jnode *g = node(p, JN_GETATTR, line);
            g->a = n;
            g->name = expect_name(p);
            return g;
        }
        nvec_push(p, &names, n, NULL);
        if (!is_op(cur(p), ",")) break;
        next(p);
        if (cur(p)->type != TK_NAME) break;
    }
    if (parens) expect_op(p, ")");
    if (names.n == 1 && !parens) return names.v[0];
    struct jnode *t = node(p, JN_TUPLE, line);
    t->kids = names.v, t->n_kids = names.n;
    return t;
}

static void parse_macro_params(struct parser *p, struct jnode *m)
{
    struct nvec params = {0};
    expect_op(p, "(");
    while (!is_op(cur(p), ")")) {
        if (params.n) expect_op(p, ",");
        const char *name = expect_name(p);
        struct jnode *def = NULL;
        if (is_op(cur(p), "=")) {
            next(p);
            def = parse_expression(p, 1);
        }
        nvec_push(p, &params, def, name);
    }
    next(p);
    m->kw_names = params.names, m->kw_vals = params.v, m->n_kw = params.n;
}

static struct jnode *parse_filter_chain(struct parser *p)
{
    struct jnode *f = parse_filter(p, NULL);
    while (is_op(cur(p), "|")) {
        next(p);
        f = parse_filter(p, f);
    }
    return f;
}

/* After '{%' and the statement's name. */
static struct jnode *parse_statement(struct parser *p)
{
    struct tok *t = next(p);
    int line = t->line;
    const char *kw = t->type == TK_NAME ? t->p : "";
    struct jnode *n;
    if (!strcmp(kw, "for")) {
        static const char *const body_end[] = {"endfor", "else", NULL};
        static const char *const else_end[] = {"endfor", NULL};
        n = node(p, JN_FOR, line);
        n->a = parse_assign_target(p, 0);
        if (!is_name(cur(p), "in")) PFAIL(p, cur(p)->line, "expected 'in' in for loop");
        next(p);
        n->b = parse_tuple(p, 0, 0);
        if (is_name(cur(p), "if")) {
            next(p);
            n->c = parse_expression(p, 1);
        }
        if (is_name(cur(p), "recursive")) PFAIL(p, line, "recursive for loops are not supported");
        expect_type(p, TK_BLOCK_END, "'%}'");
        int saved = p->in_loop;
        p->in_loop = 1;
        n->d = parse_body(p, body_end);
        p->in_loop = saved;
        if (is_name(next(p), "else")) {
            expect_type(p, TK_BLOCK_END, "'%}'");
            n->e = parse_body(p, else_end);
            next(p);
        }
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "if")) {
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        static const char *const else_end[] = {"endif", NULL};
        struct jnode *top = node(p, JN_IF, line), *n_if = top;
        for (;;) {
            n_if->a = parse_tuple(p, 0, 0);
            expect_type(p, TK_BLOCK_END, "'%}'");
            n_if->b = parse_body(p, ends);
            struct tok *e = next(p);
            if (is_name(e, "elif")) {
                struct jnode *elif = node(p, JN_IF, e->line);
                n_if->c = node(p, JN_BODY, e->line);
                n_if->c->kids = jalloc(p->st, sizeof(struct jnode *));
                n_if->c->kids[0] = elif;
                n_if->c->n_kids = 1;
                n_if = elif;
                continue;
            }
            if (is_name(e, "else")) {
                expect_type(p, TK_BLOCK_END, "'%}'");
                n_if->c = parse_body(p, else_end);
                next(p);
            }
            break;
        }
        expect_type(p, TK_BLOCK_END, "'%}'");
        return top;
    }
    if (!strcmp(kw, "set")) {
        static const char *const ends[] = {"endset", NULL};
        struct jnode *target = parse_assign_target(p, 1);
        if (is_op(cur(p), "=")) {
            next(p);
            n = node(p, JN_SET, line);
            n->a = target;
            n->b = parse_tuple(p, 1, 0);
            expect_type(p, TK_BLOCK_END, "'%}'");
            return n;
        }
        if (target->kind != JN_NAME) PFAIL(p, line, "a block set assigns one name");
        n = node(p, JN_SETBLOCK, line);
        n->name = target->name;
        if (is_op(cur(p), "|")) {
            next(p);
            n->c = parse_filter_chain(p);
        }
        expect_type(p, TK_BLOCK_END, "'%}'");
        n->b = parse_body(p, ends);
        next(p);
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "macro") || !strcmp(kw, "call")) {
        int is_macro = kw[0] == 'm';
        static const char *const mend[] = {"endmacro", NULL};
        static const char *const cend[] = {"endcall", NULL};
        n = node(p, is_macro ? JN_MACRO : JN_CALLBLOCK, line);
        if (is_macro) {
            n->name = expect_name(p);
            parse_macro_params(p, n);
        } else {
            if (is_op(cur(p), "(")) parse_macro_params(p, n);
            n->a = parse_expression(p, 1);
            if (n->a->kind != JN_CALL) PFAIL(p, line, "expected a call after 'call'");
        }
        expect_type(p, TK_BLOCK_END, "'%}'");
        int saved = p->in_loop;
        p->in_loop = 0;
        n->b = parse_body(p, is_macro ? mend : cend);
        p->in_loop = saved;
        next(p);
        if (is_macro && cur(p)->type == TK_NAME) next(p); /* {% endmacro name %} */
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = node(p, JN_FILTERBLOCK, line);
        n->c = parse_filter_chain(p);
        expect_type(p, TK_BLOCK_END, "'%}'");
        n->b = parse_body(p, ends);
        next(p);
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' assistant-mask tag: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        expect_type(p, TK_BLOCK_END, "'%}'");
        n = parse_body(p, ends);
        next(p);
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!p->in_loop) PFAIL(p, line, "'%s' outside loop", kw);
        n = node(p, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    PFAIL(p, line, "unknown or unsupported tag '%s'", t->type == TK_NAME ? kw : tok_desc(t));
}

/* Statements up to one of the block names in ends (NULL: the end of the template), which is
 * left as the current token (after its '{%'). */
static struct jnode *parse_body(struct parser *p, const char *const *ends)
{
    struct jnode *body = node(p, JN_BODY, cur(p)->line);
    struct nvec kids = {0};
    if (++p->depth > 200) PFAIL(p, cur(p)->line, "blocks nested too deeply");
    for (;;) {
        struct tok *t = cur(p);
        if (t->type == TK_EOF) {
            if (ends) PFAIL(p, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == TK_DATA) {
            struct jnode *n = node(p, JN_TEXT, t->line);
            n->lit.type = JV_STRING;
            n->lit.u.s.p = t->p;
            n->lit.u.s.n = t->n;
            nvec_push(p, &kids, n, NULL);
            next(p);
        } else if (t->type == TK_VAR_BEGIN) {
            next(p);
            struct jnode *n = node(p, JN_OUTPUT, t->line);
            n->a = parse_tuple(p, 1, 0);
            expect_type(p, TK_VAR_END, "'}}'");
            nvec_push(p, &kids, n, NULL);
        } else if (t->type == TK_BLOCK_BEGIN) {
            struct tok *name = peek(p, 1);
            int is_end = 0;
            for (int k = 0; ends && ends[k]; k++) is_end |= is_name(name, ends[k]);
            if (is_end) {
                next(p);
                break;
            }
            if (name->type == TK_NAME && (!strncmp(name->p, "end", 3) || !strcmp(name->p, "else") ||
                                          !strcmp(name->p, "elif")))
                PFAIL(p, name->line, "unexpected '%s'%s%s", name->p, ends ? ", expected " : "",
                      ends ? ends[0] : "");
            next(p);
            nvec_push(p, &kids, parse_statement(p), NULL);
        } else {
            PFAIL(p, t->line, "unexpected %s", tok_desc(t));
        }
    }
    p->depth--;
    body->kids = kids.v, body->n_kids = kids.n;
    return body;
}

enum status jinja_parse(struct jinja_template *t, const char *src, size_t len)
{
    struct jstate *st = calloc(1, sizeof(*st));
    if (!st) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "jinja: out of memory");
    st->arena = &t->arena;
    st->line = 1;
    struct parser p = {.st = st, .opt = &t->opt, .line = 1};
    if (setjmp(st->jb)) {
        enum status s = status_errorf(st->err, "jinja: %s", st->msg);
        free(st);
        return s;
    }
    /* Newlines normalized to \n and one trailing newline dropped, as jinja2 does. */
    char *norm = jalloc(st, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    p.src = norm;
    p.len = n;
    lex(&p);
    t->root = parse_body(&p, NULL);
    free(st);
    return STATUS_OK;
}
