/* server/tool_json.c - JSON read byte by byte for the incremental reply parser (tool_json.h):
 * strings, any value, a tool call. Not here: the reply's structure (tool_stream.c).
 * Tests: tests/test_tool_stream.c, tests/fuzz/fuzz_tool_parse.c. */
#include "tool_json.h"

#include <stdlib.h>
#include <string.h>


void tool_json_buf_add(struct tool_json_buf *b, const char *s, size_t n)
{
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tool_json_buf_reset(struct tool_json_buf *b)
{
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

int tool_json_is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static void add_utf8(struct tool_json_buf *b, unsigned c)
{
    char u[4];
    size_t k;
    if (c < 0x80) u[0] = (char)c, k = 1;
    else if (c < 0x800) u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3F)), k = 2;
    else if (c < 0x10000) u[0] = (char)(0xE0 | c >> 12), u[1] = (char)(0x80 | (c >> 6 & 0x3F)), u[2] = (char)(0x80 | (c & 0x3F)), k = 3;
    else u[0] = (char)(0xF0 | c >> 18), u[1] = (char)(0x80 | (c >> 12 & 0x3F)), u[2] = (char)(0x80 | (c >> 6 & 0x3F)),
         u[3] = (char)(0x80 | (c & 0x3F)), k = 4;
    tool_json_buf_add(b, u, k);
}

static int hex4(const char *s, unsigned *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = s[k];
        unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0') : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                   : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 16u;
        if (d > 15) return -1;
        *v = *v * 16 + d;
    }
    return 0;
}

/* ---- JSON, byte by byte ---------------------------------------------------------------------- */

/* A string's bytes; out (may be NULL) gets the decoded text, as far as whole escapes go: \u needs
 * its four digits (and a high surrogate its low half) before it is accepted or refused. */
int tool_json_str_byte(struct tool_json_str *j, unsigned char c, struct tool_json_buf *out)
{
    switch (j->st) {
    case 0:
        if (c == '"') return TOOL_JSON_DONE;
        if (c < 0x20) return TOOL_JSON_BAD;
        if (c == '\\') j->st = 1;
        else if (out) tool_json_buf_add(out, (const char *)&c, 1);
        return TOOL_JSON_MORE;
    case 1: {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = c ? strchr(from, c) : NULL;
        if (e) {
            if (out) tool_json_buf_add(out, &to[e - from], 1);
            j->st = 0;
            return TOOL_JSON_MORE;
        }
        if (c != 'u') return TOOL_JSON_BAD;
        j->st = 2, j->n_hex = 0;
        return TOOL_JSON_MORE;
    }
    case 2: {
        j->hex[j->n_hex++] = (char)c;
        if (j->n_hex < 4) return TOOL_JSON_MORE;
        unsigned v;
        if (hex4(j->hex, &v)) return TOOL_JSON_BAD;
        if (v >= 0xD800 && v < 0xDC00) { /* a high surrogate: its low half must follow */
            j->hi = v, j->st = 3, j->n_hex = 0;
            return TOOL_JSON_MORE;
        }
        if (v >= 0xDC00 && v < 0xE000) return TOOL_JSON_BAD;
        if (out) add_utf8(out, v);
        j->st = 0;
        return TOOL_JSON_MORE;
    }
    default: {
        j->hex[j->n_hex++] = (char)c;
        if (j->n_hex < 6) return TOOL_JSON_MORE;
        unsigned lo;
        if (j->hex[0] != '\\' || j->hex[1] != 'u' || hex4(j->hex + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) return TOOL_JSON_BAD;
        if (out) add_utf8(out, 0x10000 + ((j->hi - 0xD800) << 10) + (lo - 0xDC00));
        j->st = 0;
        return TOOL_JSON_MORE;
    }
    }
}

/* The bytes of a number or a literal (a NUL too, as the whole-text scanner took them). */
static int lit_byte(unsigned char c) { return !c || strchr("+-.eE", c) || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); }

/* A value's states: its start, in a string or a number/literal; in a container: after its
 * opening, before a key, in a key, before the colon, after an element. */
enum { V_START, V_STR, V_LIT, C_FIRST, C_KEYSTART, C_KEY, C_COLON, C_AFTER };

static int jval_done(struct tool_json_value *v)
{
    if (v->depth == 0) return TOOL_JSON_DONE;
    v->st = C_AFTER;
    return TOOL_JSON_MORE;
}

static int jval_enter(struct tool_json_value *v)
{
    if (v->depth + 1 > TOOL_JSON_MAX_DEPTH) return TOOL_JSON_BAD;
    v->st = V_START;
    return TOOL_JSON_MORE;
}

static int jval_byte(struct tool_json_value *v, unsigned char c)
{
    for (;;) {
        switch (v->st) {
        case V_START:
            if (tool_json_is_ws(c)) return TOOL_JSON_MORE;
            if (c == '"') {
                memset(&v->s, 0, sizeof v->s);
                v->st = V_STR;
            } else if (c == '{' || c == '[') {
                v->stack[v->depth++] = (char)c;
                v->st = C_FIRST;
            } else if (lit_byte(c)) {
                v->lit[0] = (char)c, v->n_lit = 1;
                v->st = V_LIT;
            } else {
                return TOOL_JSON_BAD;
            }
            return TOOL_JSON_MORE;
        case V_STR: {
            int r = tool_json_str_byte(&v->s, c, NULL);
            return r == TOOL_JSON_DONE ? jval_done(v) : r;
        }
        case V_LIT: {
            if (lit_byte(c)) {
                if (v->n_lit < 6) v->lit[v->n_lit] = (char)c;
                v->n_lit++;
                return TOOL_JSON_MORE;
            }
            static const char *const lits[] = {"true", "false", "null"};
            int ok = v->lit[0] == '-' || (v->lit[0] >= '0' && v->lit[0] <= '9');
            for (int k = 0; k < 3 && !ok; k++)
                ok = (size_t)v->n_lit == strlen(lits[k]) && !memcmp(v->lit, lits[k], (size_t)v->n_lit);
            if (!ok) return TOOL_JSON_BAD;
            if (v->depth == 0) return TOOL_JSON_AGAIN;
            v->st = C_AFTER;
            continue; /* c goes on after the number */
        }
        case C_FIRST: {
            if (tool_json_is_ws(c)) return TOOL_JSON_MORE;
            char open = v->stack[v->depth - 1];
            if (c == (open == '{' ? '}' : ']')) {
                v->depth--;
                return jval_done(v);
            }
            if (open == '[') {
                if (jval_enter(v) == TOOL_JSON_BAD) return TOOL_JSON_BAD;
                continue;
            }
            v->st = C_KEYSTART;
            continue;
        }
        case C_KEYSTART:
            if (tool_json_is_ws(c)) return TOOL_JSON_MORE;
            if (c != '"') return TOOL_JSON_BAD;
            memset(&v->s, 0, sizeof v->s);
            v->st = C_KEY;
            return TOOL_JSON_MORE;
        case C_KEY: {
            int r = tool_json_str_byte(&v->s, c, NULL);
            if (r == TOOL_JSON_DONE) v->st = C_COLON;
            return r == TOOL_JSON_BAD ? TOOL_JSON_BAD : TOOL_JSON_MORE;
        }
        case C_COLON:
            if (tool_json_is_ws(c)) return TOOL_JSON_MORE;
            return c == ':' ? jval_enter(v) : TOOL_JSON_BAD;
        default: { /* C_AFTER */
            if (tool_json_is_ws(c)) return TOOL_JSON_MORE;
            char open = v->stack[v->depth - 1];
            if (c == (open == '{' ? '}' : ']')) {
                v->depth--;
                return jval_done(v);
            }
            if (c != ',') return TOOL_JSON_BAD;
            if (open == '[') return jval_enter(v);
            v->st = C_KEYSTART;
            return TOOL_JSON_MORE;
        }
        }
    }
}

/* ---- one call: {"<name key>": "...", "<args key>": {...}} ------------------------------------ */

enum { K_OPEN, K_KEYSTART, K_KEY, K_COLON, K_VALSTART, K_NAME, K_VAL, K_AFTER };

void tool_json_call_start(struct tool_json_call *c)
{
    tool_json_buf_reset(&c->key);
    tool_json_buf_reset(&c->name);
    struct tool_json_buf key = c->key, name = c->name;
    memset(c, 0, sizeof *c);
    c->key = key, c->name = name;
}

/* One byte at position pos of the text. name_key: "name" or "tool_name"; args_key: "parameters"
 * or "arguments" ("arguments" is accepted for any key). */
int tool_json_call_byte(struct tool_json_call *c, unsigned char ch, size_t pos, const char *name_key, const char *args_key,
                        int *oom)
{
    for (;;) {
        switch (c->st) {
        case K_OPEN:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != '{') return TOOL_JSON_BAD;
            c->st = K_KEYSTART, c->first = 1;
            return TOOL_JSON_MORE;
        case K_KEYSTART:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != '"') return TOOL_JSON_BAD; /* {} names no function */
            tool_json_buf_reset(&c->key);
            memset(&c->s, 0, sizeof c->s);
            c->st = K_KEY;
            return TOOL_JSON_MORE;
        case K_KEY: {
            int r = tool_json_str_byte(&c->s, ch, &c->key);
            if (c->key.oom) return *oom = 1, TOOL_JSON_BAD;
            if (r != TOOL_JSON_DONE) return r;
            const char *k = c->key.p ? c->key.p : ""; /* compared as C strings, as before */
            c->is_name = !strcmp(k, name_key);
            c->is_args = !strcmp(k, args_key) || !strcmp(k, "arguments");
            c->st = K_COLON;
            return TOOL_JSON_MORE;
        }
        case K_COLON:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != ':') return TOOL_JSON_BAD;
            c->st = K_VALSTART;
            return TOOL_JSON_MORE;
        case K_VALSTART:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (c->is_name && !c->has_name) {
                if (ch != '"') return TOOL_JSON_BAD;
                tool_json_buf_reset(&c->name);
                memset(&c->s, 0, sizeof c->s);
                c->st = K_NAME;
                return TOOL_JSON_MORE;
            }
            c->in_args = c->is_args && !c->has_args;
            if (c->in_args) c->args0 = pos;
            memset(&c->v, 0, sizeof c->v);
            c->st = K_VAL;
            continue;
        case K_NAME: {
            int r = tool_json_str_byte(&c->s, ch, &c->name);
            if (c->name.oom) return *oom = 1, TOOL_JSON_BAD;
            if (r != TOOL_JSON_DONE) return r;
            if (!c->name.p) tool_json_buf_add(&c->name, "", 0);
            if (c->name.oom) return *oom = 1, TOOL_JSON_BAD;
            c->has_name = 1;
            c->st = K_AFTER;
            return TOOL_JSON_MORE;
        }
        case K_VAL: {
            int r = jval_byte(&c->v, ch);
            if (r == TOOL_JSON_MORE || r == TOOL_JSON_BAD) return r;
            if (c->in_args) c->args1 = r == TOOL_JSON_DONE ? pos + 1 : pos, c->in_args = 0, c->has_args = 1;
            c->st = K_AFTER;
            if (r == TOOL_JSON_DONE) return TOOL_JSON_MORE;
            continue;
        }
        default: /* K_AFTER */
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch == '}') return c->has_name ? TOOL_JSON_DONE : TOOL_JSON_BAD;
            if (ch != ',') return TOOL_JSON_BAD;
            c->st = K_KEYSTART, c->first = 0;
            return TOOL_JSON_MORE;
        }
    }
}


/* ---- a built-in call: name.call(k=v, ...) ----------------------------------------------------- */

/* The states: before the name, in it, before '.', in "call", before '(', before a key (or ')'
 * when first), in a key, before '=', before a value, in it, after it. */
enum { BI_NAME0, BI_NAME, BI_DOT, BI_CALL, BI_PAREN, BI_KEY0, BI_KEY, BI_EQ, BI_VAL0, BI_VAL, BI_AFTER };

int tool_json_ident_byte(unsigned char c, int first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

void tool_json_builtin_start(struct tool_json_builtin *b)
{
    tool_json_buf_reset(&b->name);
    tool_json_buf_reset(&b->args);
    struct tool_json_buf name = b->name, args = b->args;
    memset(b, 0, sizeof *b);
    b->name = name, b->args = args;
}

static int builtin_out(struct tool_json_builtin *b, const char *s, size_t n, int *oom)
{
    tool_json_buf_add(&b->args, s, n);
    if (b->args.oom) return *oom = 1, TOOL_JSON_BAD;
    return TOOL_JSON_MORE;
}

int tool_json_builtin_byte(struct tool_json_builtin *b, unsigned char ch, int *oom)
{
    static const char CALL[] = "call";
    const char c = (char)ch;
    for (;;) {
        switch (b->st) {
        case BI_NAME0:
        case BI_KEY0:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (b->st == BI_KEY0 && ch == ')' && !b->n_args) return builtin_out(b, "{}", 2, oom) == TOOL_JSON_MORE ? TOOL_JSON_DONE : TOOL_JSON_BAD;
            if (!tool_json_ident_byte(ch, 1)) return TOOL_JSON_BAD;
            if (b->st == BI_KEY0 && builtin_out(b, b->n_args ? ", \"" : "{\"", b->n_args ? 3 : 2, oom) == TOOL_JSON_BAD)
                return TOOL_JSON_BAD;
            b->st = b->st == BI_NAME0 ? BI_NAME : BI_KEY;
            continue;
        case BI_NAME:
            if (tool_json_ident_byte(ch, 0)) {
                tool_json_buf_add(&b->name, &c, 1);
                return b->name.oom ? (*oom = 1, TOOL_JSON_BAD) : TOOL_JSON_MORE;
            }
            b->st = BI_DOT;
            continue;
        case BI_DOT:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != '.') return TOOL_JSON_BAD;
            b->st = BI_CALL, b->v.n_lit = 0;
            return TOOL_JSON_MORE;
        case BI_CALL: /* (v.n_lit counts the bytes of "call" read) */
            if (!b->v.n_lit && tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (b->v.n_lit < 4) return c == CALL[b->v.n_lit++] ? TOOL_JSON_MORE : TOOL_JSON_BAD;
            b->st = BI_PAREN;
            continue;
        case BI_PAREN:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != '(') return TOOL_JSON_BAD;
            b->st = BI_KEY0;
            return TOOL_JSON_MORE;
        case BI_KEY:
            if (tool_json_ident_byte(ch, 0)) return builtin_out(b, &c, 1, oom);
            b->st = BI_EQ;
            if (builtin_out(b, "\": ", 3, oom) == TOOL_JSON_BAD) return TOOL_JSON_BAD;
            continue;
        case BI_EQ:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch != '=') return TOOL_JSON_BAD;
            b->st = BI_VAL0;
            return TOOL_JSON_MORE;
        case BI_VAL0:
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            memset(&b->v, 0, sizeof b->v);
            b->st = BI_VAL;
            continue;
        case BI_VAL: {
            int r = jval_byte(&b->v, ch);
            if (r == TOOL_JSON_BAD) return r;
            if (r != TOOL_JSON_AGAIN && builtin_out(b, &c, 1, oom) == TOOL_JSON_BAD) return TOOL_JSON_BAD;
            if (r == TOOL_JSON_MORE) return r;
            b->st = BI_AFTER, b->n_args++;
            if (r == TOOL_JSON_DONE) return TOOL_JSON_MORE;
            continue; /* (a number or literal ended before this byte) */
        }
        default: /* BI_AFTER */
            if (tool_json_is_ws(ch)) return TOOL_JSON_MORE;
            if (ch == ',') {
                b->st = BI_KEY0;
                return TOOL_JSON_MORE;
            }
            if (ch != ')') return TOOL_JSON_BAD;
            return builtin_out(b, "}", 1, oom) == TOOL_JSON_MORE ? TOOL_JSON_DONE : TOOL_JSON_BAD;
        }
    }
}
