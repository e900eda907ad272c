/* engine/text/jinja_lex.c - the Jinja lexer, following jinja2 3.1's lexer.py: delimiters {{ }},
 * {% %}, {# #}; whitespace control with - and +; trim_blocks and lstrip_blocks; raw blocks;
 * Python string escapes; the token stream the parser reads (jinja_parse.c). Tokens live in the
 * template's arena. Tests: tests/test_jinja.py, tests/fuzz/fuzz_jinja.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

char *jparse_strdup(struct parser *p, const char *s, size_t n)
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
                /* Past int64 (Python's ints are unbounded: such a template is refused here). The
                 * string comparison orders digits only between literals of the same length: 20
                 * digits and more passed it ("1019..." < "9223..."). */
                if (d > 19 || (d == 19 && strcmp(num, "9223372036854775807") > 0))
                    PFAIL(p, p->line, "integer literal too large");
            }
            p->pos += n;
        } else if (isalpha((unsigned char)s[0]) || s[0] == '_') {
            size_t n = 1;
            while (n < rest && (isalnum((unsigned char)s[n]) || s[n] == '_')) n++;
            struct tok *t = push_tok(p, TK_NAME, p->line);
            t->p = jparse_strdup(p, s, n);
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
            t->p = jparse_strdup(p, s, n);
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

void jlex(struct parser *p)
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

/* ---- reading the token stream ----------------------------------------------------------- */

struct tok *jtok_cur(struct parser *p) { return &p->toks[p->at]; }
struct tok *jtok_peek(struct parser *p, int k)
{
    size_t i = p->at + (size_t)k;
    return &p->toks[i < p->n_toks ? i : p->n_toks - 1];
}
int jtok_is_op(const struct tok *t, const char *op) { return t->type == TK_OP && !strcmp(t->p, op); }
int jtok_is_name(const struct tok *t, const char *n) { return t->type == TK_NAME && !strcmp(t->p, n); }
struct tok *jtok_next(struct parser *p)
{
    struct tok *t = jtok_cur(p);
    if (t->type != TK_EOF) p->at++;
    return t;
}

const char *jtok_desc(const struct tok *t)
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

void jtok_expect_op(struct parser *p, const char *op)
{
    if (!jtok_is_op(jtok_cur(p), op)) PFAIL(p, jtok_cur(p)->line, "expected '%s', got %s", op, jtok_desc(jtok_cur(p)));
    jtok_next(p);
}

void jtok_expect_type(struct parser *p, enum tok_type type, const char *what)
{
    if (jtok_cur(p)->type != type) PFAIL(p, jtok_cur(p)->line, "expected %s, got %s", what, jtok_desc(jtok_cur(p)));
    jtok_next(p);
}

const char *jtok_expect_name(struct parser *p)
{
    if (jtok_cur(p)->type != TK_NAME) PFAIL(p, jtok_cur(p)->line, "expected a name, got %s", jtok_desc(jtok_cur(p)));
    return jtok_next(p)->p;
}

