/* tests/fuzz/tool_parse_ref.c - the reference for server/tool_stream.c: the whole-text parser
 * of tool calls and reasoning that the incremental one replaced (server/tool_format.c as of
 * commit 390c781, unchanged but for its name), which re-parsed a stream's whole text at each
 * chunk (one addition since: Llama 3.1's built-in call after <|python_tag|>, scan_builtin). The
 * incremental parser must give what this one gives, at every prefix, final or not
 * (tests/test_tool_stream.c, tests/fuzz/fuzz_tool_parse.c). Not built into the server. */
#include "tool_parse_ref.h"

#include <stdlib.h>
#include <string.h>

#define SCAN_INCOMPLETE (-2) /* the text ends before the value does */
#define SCAN_INVALID    (-1)
#define SCAN_MAX_DEPTH  128  /* nesting of a call's JSON; deeper is malformed */

static const char *ref_args_key(enum tool_format f) { return f == TOOL_FORMAT_LLAMA3 ? "parameters" : "arguments"; }

static const char *open_marker(enum tool_format f)
{
    switch (f) {
    case TOOL_FORMAT_HERMES: return "<tool_call>";
    case TOOL_FORMAT_MISTRAL: return "[TOOL_CALLS]";
    case TOOL_FORMAT_PHI4:
    case TOOL_FORMAT_GRANITE: return "<|tool_call|>"; /* (GRANITE: MISTRAL's list, 2026-12-01) */
    default: return NULL;
    }
}

static const char *close_marker(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES ? "</tool_call>" : f == TOOL_FORMAT_PHI4 ? "<|/tool_call|>" : NULL;
}

/* ---- text helpers ---------------------------------------------------------------------------- */

struct sbuf {
    char  *p;
    size_t n, cap;
    int    oom;
};

static void sb_add(struct sbuf *b, const char *s, size_t n)
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

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && is_ws(s[i])) i++;
    return i;
}

/* Where marker starts in s[0..n), or n. */
static size_t find(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == marker[0] && !memcmp(s + i, marker, m)) return i;
    return n;
}

/* The length of the longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t holdback(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

/* 1 when s[0..n) is a proper prefix of marker (n < its length). */
static int is_prefix_of(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    return n < m && !memcmp(s, marker, n);
}

/* Adds s[0..n) with whitespace trimmed at both ends. */
static void sb_add_trimmed(struct sbuf *b, const char *s, size_t n)
{
    size_t i = skip_ws(s, n, 0);
    while (n > i && is_ws(s[n - 1])) n--;
    sb_add(b, s + i, n - i);
}

/* ---- JSON scanning (partial input allowed) --------------------------------------------------- */

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

static void add_utf8(struct sbuf *b, unsigned c)
{
    char u[4];
    size_t k;
    if (c < 0x80) u[0] = (char)c, k = 1;
    else if (c < 0x800) u[0] = (char)(0xC0 | c >> 6), u[1] = (char)(0x80 | (c & 0x3F)), k = 2;
    else if (c < 0x10000) u[0] = (char)(0xE0 | c >> 12), u[1] = (char)(0x80 | (c >> 6 & 0x3F)), u[2] = (char)(0x80 | (c & 0x3F)), k = 3;
    else u[0] = (char)(0xF0 | c >> 18), u[1] = (char)(0x80 | (c >> 12 & 0x3F)), u[2] = (char)(0x80 | (c >> 6 & 0x3F)),
         u[3] = (char)(0x80 | (c & 0x3F)), k = 4;
    sb_add(b, u, k);
}

/* A JSON string at s[i] == '"': returns the index after its closing quote, SCAN_INCOMPLETE or
 * SCAN_INVALID. out (may be NULL) gets the decoded text, as far as whole escapes go. */
static long scan_string(const char *s, size_t n, size_t i, struct sbuf *out)
{
    if (i >= n) return SCAN_INCOMPLETE;
    if (s[i] != '"') return SCAN_INVALID;
    for (i++; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') return (long)i + 1;
        if (c < 0x20) return SCAN_INVALID;
        if (c != '\\') {
            size_t j = i;
            while (j < n && s[j] != '"' && s[j] != '\\' && (unsigned char)s[j] >= 0x20) j++;
            if (out) sb_add(out, s + i, j - i);
            i = j;
            continue;
        }
        if (i + 1 >= n) return SCAN_INCOMPLETE;
        char e = s[i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            if (out) sb_add(out, &to[simple - "\"\\/bfnrt"], 1);
            i += 2;
            continue;
        }
        if (e != 'u') return SCAN_INVALID;
        unsigned v, lo;
        if (i + 6 > n) return SCAN_INCOMPLETE;
        if (hex4(s + i + 2, &v)) return SCAN_INVALID;
        i += 6;
        if (v >= 0xD800 && v < 0xDC00) { /* a high surrogate: its low half must follow */
            if (i + 6 > n) return SCAN_INCOMPLETE;
            if (s[i] != '\\' || s[i + 1] != 'u' || hex4(s + i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) return SCAN_INVALID;
            v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
        } else if (v >= 0xDC00 && v < 0xE000) {
            return SCAN_INVALID;
        }
        if (out) add_utf8(out, v);
    }
    return SCAN_INCOMPLETE;
}

/* Any JSON value at s[i]: the index after it, SCAN_INCOMPLETE or SCAN_INVALID. A number or
 * literal that reaches the end of the text is incomplete (more digits may follow). */
static long scan_value(const char *s, size_t n, size_t i, int depth)
{
    if (depth > SCAN_MAX_DEPTH) return SCAN_INVALID;
    i = skip_ws(s, n, i);
    if (i >= n) return SCAN_INCOMPLETE;
    char c = s[i];
    if (c == '"') return scan_string(s, n, i, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, n, i + 1);
        if (i >= n) return SCAN_INCOMPLETE;
        if (s[i] == close) return (long)i + 1;
        for (;;) {
            if (c == '{') {
                long k = scan_string(s, n, skip_ws(s, n, i), NULL);
                if (k < 0) return k;
                i = skip_ws(s, n, (size_t)k);
                if (i >= n) return SCAN_INCOMPLETE;
                if (s[i++] != ':') return SCAN_INVALID;
            }
            long v = scan_value(s, n, i, depth + 1);
            if (v < 0) return v;
            i = skip_ws(s, n, (size_t)v);
            if (i >= n) return SCAN_INCOMPLETE;
            if (s[i] == close) return (long)i + 1;
            if (s[i++] != ',') return SCAN_INVALID;
        }
    }
    size_t j = i;
    while (j < n && (strchr("+-.eE", s[j]) || (s[j] >= '0' && s[j] <= '9') || (s[j] >= 'a' && s[j] <= 'z'))) j++;
    if (j == i) return SCAN_INVALID;
    if (j == n) return SCAN_INCOMPLETE;
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++)
        if (j - i == strlen(lits[k]) && !memcmp(s + i, lits[k], j - i)) return (long)j;
    if (!(c == '-' || (c >= '0' && c <= '9'))) return SCAN_INVALID;
    return (long)j; /* a number (its exact syntax is the client's JSON parser's concern) */
}

static void call_free(struct tool_parsed_call *c)
{
    free(c->name);
    free(c->args);
    memset(c, 0, sizeof *c);
}

/* One call object {"name": "...", "<args_key>": {...}} at s[i] ("arguments" is accepted for
 * any key). Returns the index after it, SCAN_INCOMPLETE (c holds the name once it is whole, and
 * the arguments so far) or SCAN_INVALID. c is zeroed first; the caller frees it. */
static long scan_call(const char *s, size_t n, size_t i, const char *args_key, struct tool_parsed_call *c, int *oom)
{
    memset(c, 0, sizeof *c);
    i = skip_ws(s, n, i);
    if (i >= n) return SCAN_INCOMPLETE;
    if (s[i] != '{') return SCAN_INVALID;
    i++;
    int has_args = 0;
    for (int first = 1;; first = 0) {
        i = skip_ws(s, n, i);
        if (i >= n) return SCAN_INCOMPLETE;
        if (first && s[i] == '}') return SCAN_INVALID; /* {} names no function */
        struct sbuf key = {0};
        long k = scan_string(s, n, i, &key);
        if (k < 0 || key.oom) {
            *oom |= key.oom;
            free(key.p);
            return k < 0 ? k : SCAN_INVALID;
        }
        i = skip_ws(s, n, (size_t)k);
        int is_name = key.p && !strcmp(key.p, "name");
        int is_args = key.p && (!strcmp(key.p, args_key) || !strcmp(key.p, "arguments"));
        free(key.p);
        if (i >= n) return SCAN_INCOMPLETE;
        if (s[i++] != ':') return SCAN_INVALID;
        i = skip_ws(s, n, i);
        long v;
        if (is_name && !c->name) {
            struct sbuf name = {0};
            v = scan_string(s, n, i, &name);
            if (v >= 0 && !name.oom) c->name = name.p ? name.p : calloc(1, 1);
            else free(name.p);
            *oom |= name.oom || (v >= 0 && !c->name);
        } else if (is_args && !has_args) {
            v = scan_value(s, n, i, 1);
            size_t end = v >= 0 ? (size_t)v : n;
            if (v == SCAN_INVALID) return v;
            free(c->args);
            c->args = malloc(end - i + 1);
            if (!c->args) return *oom = 1, SCAN_INVALID;
            memcpy(c->args, s + i, end - i);
            c->args[end - i] = 0;
            c->args_len = end - i;
            has_args = v >= 0;
        } else {
            v = scan_value(s, n, i, 1);
        }
        if (v < 0) return v;
        i = skip_ws(s, n, (size_t)v);
        if (i >= n) return SCAN_INCOMPLETE;
        if (s[i] == '}') break;
        if (s[i++] != ',') return SCAN_INVALID;
    }
    if (!c->name) return SCAN_INVALID;
    if (!has_args) { /* a call without arguments takes none */
        free(c->args);
        c->args = malloc(3);
        if (!c->args) return *oom = 1, SCAN_INVALID;
        memcpy(c->args, "{}", 3);
        c->args_len = 2;
    }
    c->complete = 1;
    return (long)i + 1;
}

/* ---- the parser ------------------------------------------------------------------------------ */

struct parse {
    enum tool_format f;
    int   final, max_calls, oom;
    struct sbuf content;
    struct tool_parsed *out;
};

/* Keeps call c (a complete one, or the last one when it has its name); 0 when it was dropped. */
static int keep_call(struct parse *p, struct tool_parsed_call *c)
{
    struct tool_parsed *o = p->out;
    if (!c->name || (p->max_calls > 0 && o->n_calls >= p->max_calls)) {
        call_free(c);
        return 0;
    }
    struct tool_parsed_call *a = realloc(o->calls, ((size_t)o->n_calls + 1) * sizeof *a);
    if (!a) {
        p->oom = 1;
        call_free(c);
        return 0;
    }
    if (!c->args) c->args = calloc(1, 1);
    if (!c->args) p->oom = 1;
    o->calls = a;
    o->calls[o->n_calls++] = *c;
    return 1;
}

/* The generic format: {"tool_calls": [call, ...]} or {"response": "..."}. */
static void parse_generic(struct parse *p, const char *s, size_t n)
{
    size_t i = skip_ws(s, n, 0);
    if (i >= n) return;
    long k = SCAN_INVALID;
    struct sbuf key = {0};
    if (s[i] == '{') k = scan_string(s, n, skip_ws(s, n, i + 1), &key);
    if (k >= 0) i = skip_ws(s, n, (size_t)k);
    if (k >= 0 && (i >= n || s[i] != ':')) k = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
    if (k >= 0) i = skip_ws(s, n, i + 1);
    if (k >= 0 && key.p && !strcmp(key.p, "response")) {
        k = scan_string(s, n, i, &p->content);
    } else if (k >= 0 && key.p && !strcmp(key.p, "tool_calls")) {
        if (i >= n) k = SCAN_INCOMPLETE;
        else if (s[i] != '[') k = SCAN_INVALID;
        for (i++; k >= 0;) {
            struct tool_parsed_call c;
            k = scan_call(s, n, i, "arguments", &c, &p->oom);
            if (k == SCAN_INCOMPLETE && c.name) keep_call(p, &c);
            else if (k >= 0) keep_call(p, &c);
            else call_free(&c);
            if (k < 0) break;
            i = skip_ws(s, n, (size_t)k);
            if (i >= n) k = SCAN_INCOMPLETE;
            else if (s[i] == ']') break;
            else if (s[i++] != ',') k = SCAN_INVALID;
        }
    } else if (k >= 0) {
        k = SCAN_INVALID;
    }
    free(key.p);
    /* Nothing understood in a whole reply (an unconstrained or cut-short one): the raw text. */
    if (p->final && k < 0 && !p->content.n && !p->out->n_calls) sb_add(&p->content, s, n);
}

/* Text outside calls: content, trimmed, with a possible marker's start held back while partial. */
static void add_text(struct parse *p, const char *s, size_t n, const char *marker)
{
    if (!p->final && marker) n -= holdback(s, n, marker);
    if (!p->final && marker && n == 0) return;
    if (p->content.n) { /* text after calls: one space joins it to what came before */
        size_t i = skip_ws(s, n, 0);
        if (i < n) sb_add(&p->content, " ", 1);
    }
    sb_add_trimmed(&p->content, s, n);
}

/* HERMES, PHI4, MISTRAL: text, then the opening marker and the calls. */
static void parse_marked(struct parse *p, const char *s, size_t n)
{
    const char *open = open_marker(p->f), *close = close_marker(p->f);
    size_t at = find(s, n, open);
    add_text(p, s, at, at == n ? open : NULL);
    size_t i = at;
    while (i < n) { /* s[i..] starts with open */
        size_t start = i;
        i += strlen(open);
        long k = 0;
        int in_list = p->f == TOOL_FORMAT_MISTRAL || p->f == TOOL_FORMAT_GRANITE;
        if (in_list) {
            i = skip_ws(s, n, i);
            k = i >= n ? SCAN_INCOMPLETE : s[i] == '[' ? (long)++i : SCAN_INVALID;
        }
        int kept = 0;
        while (k >= 0) {
            struct tool_parsed_call c;
            k = scan_call(s, n, i, ref_args_key(p->f), &c, &p->oom);
            if (k >= 0 || (k == SCAN_INCOMPLETE && c.name)) kept += keep_call(p, &c);
            else call_free(&c);
            if (k < 0) break;
            i = skip_ws(s, n, (size_t)k);
            if (!in_list) break;
            if (i >= n) k = SCAN_INCOMPLETE;
            else if (s[i] == ']') i++, in_list = 0;
            else if (s[i++] != ',') k = SCAN_INVALID;
            if (!in_list) break;
        }
        if (k == SCAN_INCOMPLETE) return;
        if (k == SCAN_INVALID) { /* not a call after all: the rest is text */
            if (!kept) add_text(p, s + start, n - start, NULL);
            return;
        }
        i = skip_ws(s, n, i);
        if (close) {
            size_t m = strlen(close);
            if (n - i < m && !memcmp(s + i, close, n - i)) return; /* the closing marker is on its way */
            if (n - i >= m && !memcmp(s + i, close, m)) i += m;
        }
        size_t next = i + find(s + i, n - i, open);
        add_text(p, s + i, next - i, next == n ? open : NULL);
        i = next;
    }
}

static int ident_byte(char c, int first)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (!first && c >= '0' && c <= '9');
}

/* An identifier at s[i]: the index after it (into *out when not NULL), SCAN_INCOMPLETE when it
 * reaches the end, SCAN_INVALID when there is none. */
static long scan_ident(const char *s, size_t n, size_t i, struct sbuf *out)
{
    if (i >= n) return SCAN_INCOMPLETE;
    if (!ident_byte(s[i], 1)) return SCAN_INVALID;
    size_t j = i + 1;
    while (j < n && ident_byte(s[j], 0)) j++;
    if (j == n) return SCAN_INCOMPLETE;
    if (out) sb_add(out, s + i, j - i);
    return (long)j;
}

/* Added with the built-in call (after the incremental parser's machine was written): Llama
 * 3.1's `name.call(k=v, ...)` at s[i], as the Llama 3.1 template writes it after <|python_tag|>.
 * Returns the index after it, SCAN_INCOMPLETE or SCAN_INVALID; c (zeroed first, freed by the
 * caller) gets the name and the arguments {"k": v, ...} when complete. */
static long scan_builtin(const char *s, size_t n, size_t i, struct tool_parsed_call *c, int *oom)
{
    memset(c, 0, sizeof *c);
    struct sbuf name = {0}, args = {0};
    long k = scan_ident(s, n, i, &name), r = k;
    if (k < 0) goto out;
    r = SCAN_INVALID;
    i = skip_ws(s, n, (size_t)k);
    if (i >= n || s[i] != '.') {
        r = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
        goto out;
    }
    i = skip_ws(s, n, i + 1);
    for (const char *w = "call"; *w; w++, i++)
        if (i >= n || s[i] != *w) {
            r = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
            goto out;
        }
    i = skip_ws(s, n, i);
    if (i >= n || s[i] != '(') {
        r = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
        goto out;
    }
    i = skip_ws(s, n, i + 1);
    if (i >= n) {
        r = SCAN_INCOMPLETE;
        goto out;
    }
    sb_add(&args, "{", 1);
    for (int first = 1;; first = 0) {
        if (first && s[i] == ')') break;
        if (!first) sb_add(&args, ", ", 2);
        sb_add(&args, "\"", 1);
        if ((k = scan_ident(s, n, i, &args)) < 0) {
            r = k;
            goto out;
        }
        sb_add(&args, "\": ", 3);
        i = skip_ws(s, n, (size_t)k);
        if (i >= n || s[i] != '=') {
            r = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
            goto out;
        }
        i = skip_ws(s, n, i + 1);
        long v = scan_value(s, n, i, 1);
        if (v < 0) {
            r = v;
            goto out;
        }
        sb_add(&args, s + i, (size_t)v - i);
        i = skip_ws(s, n, (size_t)v);
        if (i >= n || (s[i] != ',' && s[i] != ')')) {
            r = i >= n ? SCAN_INCOMPLETE : SCAN_INVALID;
            goto out;
        }
        if (s[i] == ')') break;
        i = skip_ws(s, n, i + 1);
        if (i >= n) {
            r = SCAN_INCOMPLETE;
            goto out;
        }
    }
    sb_add(&args, "}", 1);
    *oom |= name.oom || args.oom;
    if (name.oom || args.oom) goto out;
    c->name = name.p, c->args = args.p, c->args_len = args.n, c->complete = 1;
    return (long)i + 1;
out:
    free(name.p);
    free(args.p);
    return r;
}

/* LLAMA3: the whole reply is a call (several separated by ';'), or it is text. */
static void parse_llama3(struct parse *p, const char *s, size_t n)
{
    static const char tag[] = "<|python_tag|>";
    size_t i = skip_ws(s, n, 0);
    if (!p->final && is_prefix_of(s + i, n - i, tag)) return;
    int tagged = n - i >= strlen(tag) && !memcmp(s + i, tag, strlen(tag));
    if (tagged) i = skip_ws(s, n, i + strlen(tag));
    static const char *const builtin[] = {"brave_search", "wolfram_alpha"}; /* (the tag as a control token: no text) */
    for (int k = 0; k < 2 && !tagged; k++) {
        size_t b = strlen(builtin[k]);
        if (n - i <= b && !memcmp(s + i, builtin[k], n - i) && !p->final) return;
        tagged = n - i >= b && !memcmp(s + i, builtin[k], b) && (n - i == b || !ident_byte(s[i + b], 0));
    }
    if (i >= n) return;
    if (tagged && s[i] != '{') { /* a built-in call */
        struct tool_parsed_call c;
        long k = scan_builtin(s, n, i, &c, &p->oom);
        if (k == SCAN_INCOMPLETE && !p->final) return;
        if (k < 0) {
            add_text(p, s, n, NULL);
            return;
        }
        keep_call(p, &c);
        i = skip_ws(s, n, (size_t)k);
        if (i < n && s[i] == ';') i = skip_ws(s, n, i + 1);
        if (i < n && s[i] != '{') {
            add_text(p, s + i, n - i, NULL);
            return;
        }
    }
    if (i >= n) return;
    if (s[i] != '{') {
        add_text(p, s, n, NULL);
        return;
    }
    while (i < n) {
        struct tool_parsed_call c;
        long k = scan_call(s, n, i, "parameters", &c, &p->oom);
        if (k == SCAN_INVALID && !p->out->n_calls) {
            call_free(&c);
            add_text(p, s, n, NULL);
            return;
        }
        if (k >= 0 || (k == SCAN_INCOMPLETE && c.name)) keep_call(p, &c);
        else call_free(&c);
        if (k < 0) return;
        i = skip_ws(s, n, (size_t)k);
        if (i < n && s[i] == ';') i = skip_ws(s, n, i + 1);
        if (i < n && s[i] != '{') {
            add_text(p, s + i, n - i, NULL);
            return;
        }
    }
}

/* Splits off <think>...</think> (or the markers of the reasoning kind: a later addition, with
 * the template-specific markers of tool_format.h); returns where the reply proper starts (*rest)
 * or 0 when the whole text is held back. */
static int split_reasoning(struct parse *p, int reasoning, int think_open, const char *s, size_t n, size_t *rest)
{
    const char *open = tool_reasoning_open((enum tool_reasoning)reasoning);
    const char *close = tool_reasoning_close((enum tool_reasoning)reasoning);
    size_t start = 0;
    *rest = 0;
    if (!think_open) {
        size_t j = skip_ws(s, n, 0);
        if (!p->final && is_prefix_of(s + j, n - j, open)) return 0;
        if (n - j < strlen(open) || memcmp(s + j, open, strlen(open))) return 1;
        start = j + strlen(open);
    }
    struct tool_parsed *o = p->out;
    o->has_reasoning = 1;
    size_t e = start + find(s + start, n - start, close);
    struct sbuf r = {0};
    if (e < n) {
        sb_add_trimmed(&r, s + start, e - start);
        *rest = skip_ws(s, n, e + strlen(close));
    } else {
        sb_add_trimmed(&r, s + start, n - start - (p->final ? 0 : holdback(s + start, n - start, close)));
        *rest = n;
    }
    p->oom |= r.oom;
    free(o->reasoning);
    o->reasoning = r.p;
    o->reasoning_len = r.n;
    return 1;
}

int tool_parse_ref(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *text, size_t n,
               int final, struct tool_parsed *out)
{
    memset(out, 0, sizeof *out);
    struct parse p = {.f = f, .final = final, .max_calls = max_calls, .out = out};
    size_t rest = 0;
    int go = reasoning ? split_reasoning(&p, reasoning, think_open, text, n, &rest) : 1;
    if (go) {
        const char *s = text + rest;
        size_t m = n - rest;
        if (!tools) sb_add(&p.content, s, m);
        else if (f == TOOL_FORMAT_GENERIC) parse_generic(&p, s, m);
        else if (f == TOOL_FORMAT_LLAMA3) parse_llama3(&p, s, m);
        else parse_marked(&p, s, m);
    }
    p.oom |= p.content.oom;
    out->content = p.content.p ? p.content.p : calloc(1, 1);
    out->content_len = p.content.n;
    if (!out->reasoning) out->reasoning = calloc(1, 1);
    if (p.oom || !out->content || !out->reasoning) {
        tool_parsed_free(out);
        return -1;
    }
    return 0;
}
