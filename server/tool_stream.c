/* server/tool_stream.c - the incremental parser of replies into reasoning, content and tool
 * calls (tool_format.h: struct tool_stream), and the deltas a stream sends. Each byte of the
 * reply is read once by a set of small state machines (the reasoning block, the text between
 * calls and its markers, a call's JSON with a stack of open containers); what the parse has so
 * far is kept as positions in the text and one content buffer, so that feeding a reply in any
 * number of pieces costs work linear in its length (tool_stream_steps counts it). The result
 * after each piece is what a parse of the whole text so far would give (tests/test_tool_stream.c
 * checks it against the earlier whole-text parser at every prefix).
 * Not here: format detection (tool_format.c), the JSON of the fronts (http_openai_out.c,
 * chat_tools.c). Tests: tests/test_tool_stream.c, tests/fuzz/fuzz_tool_parse.c. */
#include "tool_format.h"

#include <stdlib.h>
#include <string.h>

#define SCAN_MAX_DEPTH 128 /* nesting of a call's JSON; deeper is malformed */

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

static void sb_reset(struct sbuf *b)
{
    b->n = 0;
    if (b->p) b->p[0] = 0;
}

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* The length of the longest suffix of s[0..n) that is a proper prefix of marker. */
static size_t holdback(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
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

enum { J_MORE, J_DONE, J_AGAIN, J_BAD }; /* AGAIN: done, and the byte belongs to what follows */

/* A JSON string after its opening quote. Escapes must be whole to be judged: \u needs its four
 * digits (and a high surrogate its low half) before it is accepted or refused. */
struct jstr {
    int  st;      /* 0 body, 1 after a backslash, 2 in \uXXXX, 3 in a low surrogate's \uXXXX */
    int  n_hex;
    char hex[6];
    unsigned hi;
};

/* out (may be NULL) gets the decoded text, as far as whole escapes go. */
static int jstr_byte(struct jstr *j, unsigned char c, struct sbuf *out)
{
    switch (j->st) {
    case 0:
        if (c == '"') return J_DONE;
        if (c < 0x20) return J_BAD;
        if (c == '\\') j->st = 1;
        else if (out) sb_add(out, (const char *)&c, 1);
        return J_MORE;
    case 1: {
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = c ? strchr(from, c) : NULL;
        if (e) {
            if (out) sb_add(out, &to[e - from], 1);
            j->st = 0;
            return J_MORE;
        }
        if (c != 'u') return J_BAD;
        j->st = 2, j->n_hex = 0;
        return J_MORE;
    }
    case 2: {
        j->hex[j->n_hex++] = (char)c;
        if (j->n_hex < 4) return J_MORE;
        unsigned v;
        if (hex4(j->hex, &v)) return J_BAD;
        if (v >= 0xD800 && v < 0xDC00) { /* a high surrogate: its low half must follow */
            j->hi = v, j->st = 3, j->n_hex = 0;
            return J_MORE;
        }
        if (v >= 0xDC00 && v < 0xE000) return J_BAD;
        if (out) add_utf8(out, v);
        j->st = 0;
        return J_MORE;
    }
    default: {
        j->hex[j->n_hex++] = (char)c;
        if (j->n_hex < 6) return J_MORE;
        unsigned lo;
        if (j->hex[0] != '\\' || j->hex[1] != 'u' || hex4(j->hex + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF) return J_BAD;
        if (out) add_utf8(out, 0x10000 + ((j->hi - 0xD800) << 10) + (lo - 0xDC00));
        j->st = 0;
        return J_MORE;
    }
    }
}

/* The bytes of a number or a literal (a NUL too, as the whole-text scanner took them). */
static int lit_byte(unsigned char c) { return !c || strchr("+-.eE", c) || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z'); }

enum { V_START, V_STR, V_LIT, C_FIRST, C_KEYSTART, C_KEY, C_COLON, C_AFTER };

/* Any JSON value; depth counts the open containers (a value inside d of them is at depth d + 1,
 * and values deeper than SCAN_MAX_DEPTH are malformed). */
struct jval {
    int  st, depth;
    char stack[SCAN_MAX_DEPTH + 1];
    struct jstr s;
    char lit[6];
    int  n_lit;
};

static int jval_done(struct jval *v)
{
    if (v->depth == 0) return J_DONE;
    v->st = C_AFTER;
    return J_MORE;
}

static int jval_enter(struct jval *v)
{
    if (v->depth + 1 > SCAN_MAX_DEPTH) return J_BAD;
    v->st = V_START;
    return J_MORE;
}

static int jval_byte(struct jval *v, unsigned char c)
{
    for (;;) {
        switch (v->st) {
        case V_START:
            if (is_ws(c)) return J_MORE;
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
                return J_BAD;
            }
            return J_MORE;
        case V_STR: {
            int r = jstr_byte(&v->s, c, NULL);
            return r == J_DONE ? jval_done(v) : r;
        }
        case V_LIT: {
            if (lit_byte(c)) {
                if (v->n_lit < 6) v->lit[v->n_lit] = (char)c;
                v->n_lit++;
                return J_MORE;
            }
            static const char *const lits[] = {"true", "false", "null"};
            int ok = v->lit[0] == '-' || (v->lit[0] >= '0' && v->lit[0] <= '9');
            for (int k = 0; k < 3 && !ok; k++)
                ok = (size_t)v->n_lit == strlen(lits[k]) && !memcmp(v->lit, lits[k], (size_t)v->n_lit);
            if (!ok) return J_BAD;
            if (v->depth == 0) return J_AGAIN;
            v->st = C_AFTER;
            continue; /* c goes on after the number */
        }
        case C_FIRST: {
            if (is_ws(c)) return J_MORE;
            char open = v->stack[v->depth - 1];
            if (c == (open == '{' ? '}' : ']')) {
                v->depth--;
                return jval_done(v);
            }
            if (open == '[') {
                if (jval_enter(v) == J_BAD) return J_BAD;
                continue;
            }
            v->st = C_KEYSTART;
            continue;
        }
        case C_KEYSTART:
            if (is_ws(c)) return J_MORE;
            if (c != '"') return J_BAD;
            memset(&v->s, 0, sizeof v->s);
            v->st = C_KEY;
            return J_MORE;
        case C_KEY: {
            int r = jstr_byte(&v->s, c, NULL);
            if (r == J_DONE) v->st = C_COLON;
            return r == J_BAD ? J_BAD : J_MORE;
        }
        case C_COLON:
            if (is_ws(c)) return J_MORE;
            return c == ':' ? jval_enter(v) : J_BAD;
        default: { /* C_AFTER */
            if (is_ws(c)) return J_MORE;
            char open = v->stack[v->depth - 1];
            if (c == (open == '{' ? '}' : ']')) {
                v->depth--;
                return jval_done(v);
            }
            if (c != ',') return J_BAD;
            if (open == '[') return jval_enter(v);
            v->st = C_KEYSTART;
            return J_MORE;
        }
        }
    }
}

/* ---- one call: {"name": "...", "<args key>": {...}} ------------------------------------------ */

enum { K_OPEN, K_KEYSTART, K_KEY, K_COLON, K_VALSTART, K_NAME, K_VAL, K_AFTER };

struct jcall {
    int         st, first, is_name, is_args, in_args, has_name, has_args;
    struct jstr s;
    struct sbuf key, name;
    struct jval v;
    size_t      args0, args1; /* the arguments' text: [args0, args1), or to the end while in_args */
};

static void jcall_start(struct jcall *c)
{
    sb_reset(&c->key);
    sb_reset(&c->name);
    struct sbuf key = c->key, name = c->name;
    memset(c, 0, sizeof *c);
    c->key = key, c->name = name;
}

/* One byte at position pos of the text. args_key: "parameters" or "arguments" ("arguments" is
 * accepted for any key). */
static int jcall_byte(struct jcall *c, unsigned char ch, size_t pos, const char *args_key, int *oom)
{
    for (;;) {
        switch (c->st) {
        case K_OPEN:
            if (is_ws(ch)) return J_MORE;
            if (ch != '{') return J_BAD;
            c->st = K_KEYSTART, c->first = 1;
            return J_MORE;
        case K_KEYSTART:
            if (is_ws(ch)) return J_MORE;
            if (ch != '"') return J_BAD; /* {} names no function */
            sb_reset(&c->key);
            memset(&c->s, 0, sizeof c->s);
            c->st = K_KEY;
            return J_MORE;
        case K_KEY: {
            int r = jstr_byte(&c->s, ch, &c->key);
            if (c->key.oom) return *oom = 1, J_BAD;
            if (r != J_DONE) return r;
            const char *k = c->key.p ? c->key.p : ""; /* compared as C strings, as before */
            c->is_name = !strcmp(k, "name");
            c->is_args = !strcmp(k, args_key) || !strcmp(k, "arguments");
            c->st = K_COLON;
            return J_MORE;
        }
        case K_COLON:
            if (is_ws(ch)) return J_MORE;
            if (ch != ':') return J_BAD;
            c->st = K_VALSTART;
            return J_MORE;
        case K_VALSTART:
            if (is_ws(ch)) return J_MORE;
            if (c->is_name && !c->has_name) {
                if (ch != '"') return J_BAD;
                sb_reset(&c->name);
                memset(&c->s, 0, sizeof c->s);
                c->st = K_NAME;
                return J_MORE;
            }
            c->in_args = c->is_args && !c->has_args;
            if (c->in_args) c->args0 = pos;
            memset(&c->v, 0, sizeof c->v);
            c->st = K_VAL;
            continue;
        case K_NAME: {
            int r = jstr_byte(&c->s, ch, &c->name);
            if (c->name.oom) return *oom = 1, J_BAD;
            if (r != J_DONE) return r;
            if (!c->name.p) sb_add(&c->name, "", 0);
            if (c->name.oom) return *oom = 1, J_BAD;
            c->has_name = 1;
            c->st = K_AFTER;
            return J_MORE;
        }
        case K_VAL: {
            int r = jval_byte(&c->v, ch);
            if (r == J_MORE || r == J_BAD) return r;
            if (c->in_args) c->args1 = r == J_DONE ? pos + 1 : pos, c->in_args = 0, c->has_args = 1;
            c->st = K_AFTER;
            if (r == J_DONE) return J_MORE;
            continue;
        }
        default: /* K_AFTER */
            if (is_ws(ch)) return J_MORE;
            if (ch == '}') return c->has_name ? J_DONE : J_BAD;
            if (ch != ',') return J_BAD;
            c->st = K_KEYSTART, c->first = 0;
            return J_MORE;
        }
    }
}

/* ---- the reply ------------------------------------------------------------------------------- */

/* A run of text that becomes content (or the reasoning): trimmed of whitespace at both ends,
 * joined to content before it by one space; read up to a limit that only grows. */
struct seg {
    size_t start, scanned, first, end; /* [first, end): the trimmed text so far */
    int    has;                        /* a non-whitespace byte was seen */
    size_t base, emitted;              /* content's length when the run began; bytes of it added */
};

enum body {
    B_WAIT,       /* the reasoning block is not over */
    B_RAW,        /* no tools: the rest is content as written */
    B_TEXT,       /* marked formats: text, looking for the opening marker */
    B_LIST_OPEN,  /* mistral: after [TOOL_CALLS], expecting '[' */
    B_CALL,       /* in a call's JSON */
    B_LIST_AFTER, /* mistral: after a call in the list */
    B_AFTER_CALL, /* marked: after a call, before its closing marker */
    B_REST,       /* the rest is text (trimmed, no markers) */
    B_DEAD,       /* the rest is dropped */
    G_OPEN, G_KEYSTART, G_KEY, G_COLON, G_RSTART, G_RESP, G_LSTART, G_LAFTER, /* generic */
    L_START, L_CALLSTART, L_AFTER, L_SEMI,                                    /* llama3 */
};

enum rphase { R_OFF, R_DETECT, R_IN, R_GAP };

struct tcall {
    char  *name;
    size_t args0, args1;
    int    no_args; /* a call without arguments takes none: "{}" */
};

struct tool_stream {
    enum tool_format f;
    int    tools, reasoning, max_calls, final, oom;
    char  *text;
    size_t len, cap, pos; /* pos: the next byte the body's machines read */
    unsigned long long steps;

    enum rphase rph;
    int    has_reasoning;
    size_t rscan;         /* R_DETECT / R_GAP: bytes skipped; R_IN: where to look for </think> next */
    struct seg rseg;
    size_t body;          /* where the reply proper starts */

    enum body st;
    struct seg cseg;
    size_t search;        /* B_TEXT: positions before this hold no opening marker */
    size_t block;         /* where the current block of calls opened (its marker) */
    size_t close_at;      /* B_AFTER_CALL: the first byte after the call's whitespace, or -1 */
    int    kept_block, seen, gdone; /* calls kept in this block; generic: non-space seen, reply whole */
    struct sbuf content, gkey;
    struct jstr gs;
    struct jcall call;
    struct tcall *calls;
    int    n_calls, cap_calls;

    size_t sent_reasoning, sent_content, *sent_args;
    int    sent_calls, cap_args;
    struct tool_delta_call *dcalls;
    int    cap_dcalls;
};

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>", PYTHON_TAG[] = "<|python_tag|>";

static const char *open_marker(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES ? "<tool_call>" : f == TOOL_FORMAT_MISTRAL ? "[TOOL_CALLS]"
         : f == TOOL_FORMAT_PHI4 ? "<|tool_call|>" : NULL;
}

static const char *close_marker(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES ? "</tool_call>" : f == TOOL_FORMAT_PHI4 ? "<|/tool_call|>" : NULL;
}

static void seg_open(struct tool_stream *ts, struct seg *g, size_t start)
{
    memset(g, 0, sizeof *g);
    g->start = g->scanned = start;
    g->base = ts->content.n;
}

/* Reads g up to limit; when to_content, adds its new trimmed text to the content. */
static void seg_advance(struct tool_stream *ts, struct seg *g, size_t limit, int to_content)
{
    for (; g->scanned < limit; g->scanned++) {
        ts->steps++;
        if (is_ws((unsigned char)ts->text[g->scanned])) continue;
        if (!g->has) g->first = g->scanned, g->has = 1;
        g->end = g->scanned + 1;
    }
    if (!to_content || !g->has || g->end - g->first == g->emitted) return;
    if (!g->emitted && g->base) sb_add(&ts->content, " ", 1);
    sb_add(&ts->content, ts->text + g->first + g->emitted, g->end - g->first - g->emitted);
    g->emitted = g->end - g->first;
}

/* The call in progress counts once its name is whole and max_calls leaves room for it. */
static int call_visible(const struct tool_stream *ts)
{
    return ts->st == B_CALL && ts->call.has_name && (ts->max_calls <= 0 || ts->n_calls < ts->max_calls);
}

static void begin_call(struct tool_stream *ts)
{
    jcall_start(&ts->call);
    ts->st = B_CALL;
}

/* Keeps the call just completed (when max_calls leaves room); returns whether it was kept. */
static int keep_call(struct tool_stream *ts)
{
    if (!call_visible(ts)) return 0;
    if (ts->n_calls == ts->cap_calls) {
        int cap = ts->cap_calls ? 2 * ts->cap_calls : 4;
        struct tcall *a = realloc(ts->calls, (size_t)cap * sizeof *a);
        if (!a) return ts->oom = 1, 0;
        ts->calls = a, ts->cap_calls = cap;
    }
    struct jcall *c = &ts->call;
    struct tcall *t = &ts->calls[ts->n_calls];
    t->name = malloc(c->name.n + 1);
    if (!t->name) return ts->oom = 1, 0;
    memcpy(t->name, c->name.p, c->name.n + 1);
    t->args0 = c->args0, t->args1 = c->args1, t->no_args = !c->has_args;
    ts->n_calls++;
    return 1;
}

/* The rest of the text from start is text (a format that turned out not to hold calls). */
static void rest_is_text(struct tool_stream *ts, size_t start)
{
    ts->st = B_REST;
    seg_open(ts, &ts->cseg, start);
    ts->pos = ts->len;
    seg_advance(ts, &ts->cseg, ts->len, 1);
}

/* A call, or the list around it, is malformed. */
static void call_bad(struct tool_stream *ts)
{
    if (ts->f == TOOL_FORMAT_GENERIC) ts->st = B_DEAD;
    else if (ts->f == TOOL_FORMAT_LLAMA3) ts->n_calls ? (void)(ts->st = B_DEAD) : rest_is_text(ts, ts->body);
    else if (ts->kept_block) ts->st = B_DEAD; /* a list with calls kept: the rest is dropped */
    else rest_is_text(ts, ts->block);
}

static void call_done(struct tool_stream *ts)
{
    ts->kept_block += keep_call(ts);
    if (ts->f == TOOL_FORMAT_GENERIC) ts->st = G_LAFTER;
    else if (ts->f == TOOL_FORMAT_LLAMA3) ts->st = L_AFTER;
    else if (ts->f == TOOL_FORMAT_MISTRAL) ts->st = B_LIST_AFTER;
    else ts->st = B_AFTER_CALL, ts->close_at = (size_t)-1;
}

static void text_from(struct tool_stream *ts, size_t start)
{
    ts->st = B_TEXT;
    seg_open(ts, &ts->cseg, start);
    ts->search = start;
    ts->pos = start;
}

/* B_TEXT: reads the text up to the next opening marker, or all of it (holding back a possible
 * marker's start). */
static void read_text(struct tool_stream *ts)
{
    const char *open = open_marker(ts->f);
    size_t m = strlen(open), p = ts->search;
    for (; p + m <= ts->len; p++) {
        ts->steps++;
        if (ts->text[p] == open[0] && !memcmp(ts->text + p, open, m)) break;
    }
    if (p + m <= ts->len) { /* a marker: the text before it is whole, a block of calls opens */
        seg_advance(ts, &ts->cseg, p, 1);
        ts->block = p, ts->kept_block = 0;
        ts->pos = p + m;
        if (ts->f == TOOL_FORMAT_MISTRAL) ts->st = B_LIST_OPEN;
        else begin_call(ts);
        return;
    }
    ts->search = p;
    size_t s0 = ts->cseg.start;
    size_t limit = ts->final ? ts->len : ts->len - holdback(ts->text + s0, ts->len - s0, open);
    ts->steps += m;
    seg_advance(ts, &ts->cseg, limit, 1);
    ts->pos = ts->len;
}

/* One byte of the body at ts->pos (the states that read byte by byte). */
static void body_byte(struct tool_stream *ts)
{
    size_t at = ts->pos;
    unsigned char c = (unsigned char)ts->text[at];
    ts->steps++;
    ts->pos++;
    const char *close = close_marker(ts->f);
    switch (ts->st) {
    case B_CALL: {
        int r = jcall_byte(&ts->call, c, at, tool_format_args_key(ts->f), &ts->oom);
        if (r == J_DONE) call_done(ts);
        else if (r == J_BAD) call_bad(ts);
        return;
    }
    case B_LIST_OPEN:
        if (is_ws(c)) return;
        if (c == '[') begin_call(ts);
        else call_bad(ts);
        return;
    case B_LIST_AFTER:
        if (is_ws(c)) return;
        if (c == ']') text_from(ts, at + 1);
        else if (c == ',') begin_call(ts);
        else call_bad(ts);
        return;
    case B_AFTER_CALL:
        if (!close) {
            text_from(ts, at);
            return;
        }
        if (ts->close_at == (size_t)-1) {
            if (is_ws(c)) return;
            ts->close_at = at;
        }
        if (c != close[at - ts->close_at]) text_from(ts, ts->close_at); /* not the closing marker: text */
        else if (at + 1 - ts->close_at == strlen(close)) text_from(ts, at + 1);
        return;
    case G_OPEN:
        if (is_ws(c)) return;
        ts->seen = 1;
        ts->st = c == '{' ? G_KEYSTART : B_DEAD;
        return;
    case G_KEYSTART:
        if (is_ws(c)) return;
        sb_reset(&ts->gkey);
        memset(&ts->gs, 0, sizeof ts->gs);
        ts->st = c == '"' ? G_KEY : B_DEAD;
        return;
    case G_KEY: {
        int r = jstr_byte(&ts->gs, c, &ts->gkey);
        ts->oom |= ts->gkey.oom;
        if (r == J_BAD) ts->st = B_DEAD;
        else if (r == J_DONE) ts->st = G_COLON;
        return;
    }
    case G_COLON: {
        if (is_ws(c)) return;
        const char *k = ts->gkey.p ? ts->gkey.p : "";
        ts->st = c != ':' ? B_DEAD : !strcmp(k, "response") ? G_RSTART : !strcmp(k, "tool_calls") ? G_LSTART : B_DEAD;
        return;
    }
    case G_RSTART:
        if (is_ws(c)) return;
        memset(&ts->gs, 0, sizeof ts->gs);
        ts->st = c == '"' ? G_RESP : B_DEAD;
        return;
    case G_RESP: {
        int r = jstr_byte(&ts->gs, c, &ts->content);
        if (r == J_DONE) ts->gdone = 1;
        if (r != J_MORE) ts->st = B_DEAD;
        return;
    }
    case G_LSTART:
        if (is_ws(c)) return;
        if (c == '[') begin_call(ts);
        else ts->st = B_DEAD;
        return;
    case G_LAFTER:
        if (is_ws(c)) return;
        if (c == ']') ts->gdone = 1, ts->st = B_DEAD;
        else if (c == ',') begin_call(ts);
        else ts->st = B_DEAD;
        return;
    case L_CALLSTART:
        if (is_ws(c)) return;
        if (c == '{') begin_call(ts), ts->pos = at; /* the call's machine reads the brace */
        else rest_is_text(ts, ts->body);
        return;
    case L_AFTER:
    case L_SEMI:
        if (is_ws(c)) return;
        if (c == ';' && ts->st == L_AFTER) ts->st = L_SEMI;
        else if (c == '{') begin_call(ts), ts->pos = at;
        else rest_is_text(ts, at);
        return;
    default:
        ts->pos = ts->len;
        return;
    }
}

/* L_START: after optional whitespace, <|python_tag|> (skipped) or not; held while the text could
 * still be the tag's start. */
static void llama3_start(struct tool_stream *ts)
{
    while (ts->rscan < ts->len && is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
    size_t j = ts->rscan, have = ts->len - j, m = strlen(PYTHON_TAG);
    int prefix = !memcmp(ts->text + j, PYTHON_TAG, have < m ? have : m);
    ts->steps += m;
    if (prefix && have < m && !ts->final) {
        ts->pos = ts->len;
        return;
    }
    ts->st = L_CALLSTART;
    ts->pos = prefix && have >= m ? j + m : j;
}

/* The reply proper starts at p. */
static void body_begin(struct tool_stream *ts, size_t p)
{
    ts->body = ts->pos = p;
    ts->rscan = p;
    if (!ts->tools) ts->st = B_RAW;
    else if (ts->f == TOOL_FORMAT_GENERIC) ts->st = G_OPEN;
    else if (ts->f == TOOL_FORMAT_LLAMA3) ts->st = L_START;
    else text_from(ts, p);
}

/* The reasoning block: finds where the reply proper starts. */
static void reasoning_advance(struct tool_stream *ts)
{
    if (ts->rph == R_DETECT) {
        while (ts->rscan < ts->len && is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
        size_t j = ts->rscan, have = ts->len - j, m = strlen(THINK_OPEN);
        int prefix = !memcmp(ts->text + j, THINK_OPEN, have < m ? have : m);
        ts->steps += m;
        if (prefix && have < m && !ts->final) return;
        if (!prefix || have < m) {
            ts->rph = R_OFF;
            body_begin(ts, 0);
            return;
        }
        ts->rph = R_IN, ts->has_reasoning = 1;
        memset(&ts->rseg, 0, sizeof ts->rseg);
        ts->rseg.start = ts->rseg.scanned = ts->rscan = j + m;
    }
    if (ts->rph == R_IN) {
        size_t m = strlen(THINK_CLOSE), p = ts->rscan;
        for (; p + m <= ts->len; p++) {
            ts->steps++;
            if (ts->text[p] == '<' && !memcmp(ts->text + p, THINK_CLOSE, m)) break;
        }
        if (p + m > ts->len) {
            ts->rscan = p;
            size_t s0 = ts->rseg.start;
            ts->steps += m;
            seg_advance(ts, &ts->rseg, ts->final ? ts->len : ts->len - holdback(ts->text + s0, ts->len - s0, THINK_CLOSE), 0);
            return;
        }
        seg_advance(ts, &ts->rseg, p, 0);
        ts->rph = R_GAP, ts->rscan = p + m;
    }
    if (ts->rph == R_GAP) {
        while (ts->rscan < ts->len && is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
        if (ts->rscan == ts->len) return;
        ts->rph = R_OFF;
        body_begin(ts, ts->rscan);
    }
}

/* Reads what was appended (and, once final, what was held back). */
static void advance(struct tool_stream *ts)
{
    if (ts->st == B_WAIT) reasoning_advance(ts);
    while (ts->st != B_WAIT && (ts->pos < ts->len || (ts->final && ts->st == L_START))) {
        if (ts->st == B_TEXT) read_text(ts);
        else if (ts->st == B_RAW) {
            ts->steps += ts->len - ts->pos;
            sb_add(&ts->content, ts->text + ts->pos, ts->len - ts->pos);
            ts->pos = ts->len;
        } else if (ts->st == L_START) llama3_start(ts);
        else if (ts->st == B_REST) seg_advance(ts, &ts->cseg, ts->len, 1), ts->pos = ts->len;
        else if (ts->st == B_DEAD) ts->pos = ts->len;
        else body_byte(ts);
    }
    if (ts->final && ts->st == B_TEXT) seg_advance(ts, &ts->cseg, ts->len, 1);
}

/* ---- the interface --------------------------------------------------------------------------- */

int tool_stream_new(enum tool_format f, int tools, int reasoning, int think_open, int max_calls,
                    struct tool_stream **out)
{
    struct tool_stream *ts = calloc(1, sizeof *ts);
    *out = ts;
    if (!ts) return -1;
    ts->f = f, ts->tools = tools, ts->reasoning = reasoning, ts->max_calls = max_calls;
    ts->st = B_WAIT;
    if (!reasoning) {
        ts->rph = R_OFF;
        body_begin(ts, 0);
    } else if (think_open) {
        ts->rph = R_IN, ts->has_reasoning = 1;
    } else {
        ts->rph = R_DETECT;
    }
    return 0;
}

void tool_stream_free(struct tool_stream *ts)
{
    if (!ts) return;
    for (int k = 0; k < ts->n_calls; k++) free(ts->calls[k].name);
    free(ts->calls);
    free(ts->text);
    free(ts->content.p);
    free(ts->gkey.p);
    free(ts->call.key.p);
    free(ts->call.name.p);
    free(ts->sent_args);
    free(ts->dcalls);
    free(ts);
}

int tool_stream_feed(struct tool_stream *ts, const char *text, size_t n, int final)
{
    if (ts->oom) return -1;
    if (ts->final && n) return -1; /* nothing may follow the end */
    if (ts->len + n + 1 > ts->cap) {
        size_t cap = ts->cap ? ts->cap : 256;
        while (cap < ts->len + n + 1) cap *= 2;
        char *p = realloc(ts->text, cap);
        if (!p) return ts->oom = 1, -1;
        ts->text = p, ts->cap = cap;
    }
    if (n) memcpy(ts->text + ts->len, text, n);
    ts->len += n;
    ts->text[ts->len] = 0;
    int was_final = ts->final;
    ts->final |= final;
    advance(ts);
    /* A generic reply that is not understood (unconstrained, or cut short): the raw text. */
    if (ts->final && !was_final && ts->tools && ts->f == TOOL_FORMAT_GENERIC && ts->seen && !ts->gdone &&
        !ts->content.n && !ts->n_calls && !call_visible(ts))
        sb_add(&ts->content, ts->text + ts->body, ts->len - ts->body);
    ts->oom |= ts->content.oom;
    return ts->oom ? -1 : 0;
}

unsigned long long tool_stream_steps(const struct tool_stream *ts) { return ts->steps; }

void tool_stream_view(const struct tool_stream *ts, struct tool_view *v)
{
    memset(v, 0, sizeof *v);
    v->has_reasoning = ts->has_reasoning;
    v->reasoning = "";
    if (ts->rseg.has) v->reasoning = ts->text + ts->rseg.first, v->reasoning_len = ts->rseg.end - ts->rseg.first;
    v->content = ts->content.p ? ts->content.p : "";
    v->content_len = ts->content.n;
    v->n_calls = ts->n_calls + call_visible(ts);
}

void tool_stream_call(const struct tool_stream *ts, int k, struct tool_view_call *c)
{
    memset(c, 0, sizeof *c);
    if (k < ts->n_calls) {
        const struct tcall *t = &ts->calls[k];
        c->name = t->name, c->complete = 1;
        if (t->no_args) c->args = "{}", c->args_len = 2;
        else c->args = ts->text + t->args0, c->args_len = t->args1 - t->args0;
        return;
    }
    const struct jcall *j = &ts->call; /* the call in progress (call_visible) */
    c->name = j->name.p;
    c->args = "";
    if (j->has_args) c->args = ts->text + j->args0, c->args_len = j->args1 - j->args0;
    else if (j->in_args) c->args = ts->text + j->args0, c->args_len = ts->len - j->args0;
}

int tool_stream_delta(struct tool_stream *ts, const char *text, size_t n, int final, struct tool_delta *d)
{
    memset(d, 0, sizeof *d);
    if (tool_stream_feed(ts, text, n, final)) return -1;
    struct tool_view v;
    tool_stream_view(ts, &v);
    if (v.reasoning_len > ts->sent_reasoning) {
        d->reasoning = v.reasoning + ts->sent_reasoning, d->reasoning_len = v.reasoning_len - ts->sent_reasoning;
        ts->sent_reasoning = v.reasoning_len;
    }
    if (v.content_len > ts->sent_content) {
        d->content = v.content + ts->sent_content, d->content_len = v.content_len - ts->sent_content;
        ts->sent_content = v.content_len;
    }
    if (v.n_calls > ts->cap_args) {
        size_t *a = realloc(ts->sent_args, (size_t)v.n_calls * sizeof *a);
        struct tool_delta_call *dc = a ? realloc(ts->dcalls, (size_t)v.n_calls * sizeof *dc) : NULL;
        if (a) ts->sent_args = a;
        if (dc) ts->dcalls = dc, ts->cap_args = v.n_calls;
        if (!dc) return ts->oom = 1, -1;
    }
    /* Only the last call (or a new one) can have grown: the ones before it are whole. */
    int k0 = ts->sent_calls < v.n_calls ? ts->sent_calls : v.n_calls;
    for (int k = k0 > 0 ? k0 - 1 : 0; k < v.n_calls; k++) {
        struct tool_view_call c;
        tool_stream_call(ts, k, &c);
        struct tool_delta_call *e = &ts->dcalls[d->n_calls];
        memset(e, 0, sizeof *e);
        e->index = k;
        if (k >= ts->sent_calls) { /* a new call: its header, and the arguments so far */
            e->is_new = 1, e->name = c.name;
            e->args = c.args, e->args_len = c.args_len;
            ts->sent_args[k] = c.args_len;
            ts->sent_calls = k + 1;
        } else if (c.args_len > ts->sent_args[k]) {
            e->args = c.args + ts->sent_args[k], e->args_len = c.args_len - ts->sent_args[k];
            ts->sent_args[k] = c.args_len;
        } else {
            continue;
        }
        d->n_calls++;
    }
    d->calls = ts->dcalls;
    d->calls_sent = ts->sent_calls > 0;
    return 0;
}
