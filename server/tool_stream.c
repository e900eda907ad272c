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
#include "tool_stream_impl.h"

#include "base.h"

#include <stdlib.h>
#include <string.h>

size_t tool_stream_holdback(const char *s, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, marker, k)) return k;
    return 0;
}

/* ---- the reply ------------------------------------------------------------------------------- */

static const char PYTHON_TAG[] = "<|python_tag|>";
/* Llama 3.1's built-in tools called as `name.call(...)` (its template's "Tools:" line; its
 * code_interpreter writes code, not a call, and is not mapped). */
static const char *const BUILTIN_TOOLS[2] = {"brave_search", "wolfram_alpha"};

const char *tool_stream_open_marker(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES || f == TOOL_FORMAT_GLM || f == TOOL_FORMAT_QWEN_XML ? "<tool_call>"
         : f == TOOL_FORMAT_MISTRAL ? "[TOOL_CALLS]"
         : f == TOOL_FORMAT_PHI4 || f == TOOL_FORMAT_GRANITE ? "<|tool_call|>" : f == TOOL_FORMAT_DEEPSEEK ? TOOL_DS_CALLS_BEGIN
         : f == TOOL_FORMAT_KIMI ? TOOL_KIMI_CALLS_BEGIN : f == TOOL_FORMAT_COMMAND_R7B ? TOOL_R7B_ACTION
         : f == TOOL_FORMAT_MINIMAX ? TOOL_MINIMAX_CALLS : f == TOOL_FORMAT_NEMOTRON ? "<TOOLCALL>"
         : f == TOOL_FORMAT_DSML ? TOOL_DSML_CALLS : f == TOOL_FORMAT_DSML_V4 ? TOOL_DSML_V4_CALLS
         : f == TOOL_FORMAT_GEMMA4 ? TOOL_GEMMA4_CALL : f == TOOL_FORMAT_FUNCTIONARY ? TOOL_FUNCTIONARY_CALL
         : f == TOOL_FORMAT_SEED_OSS ? TOOL_SEED_CALL
                                 : NULL;
}

/* What closes a call (HERMES, GLM, QWEN_XML, PHI4, GEMMA4, FUNCTIONARY) or the list of calls (COMMAND_R7B, MINIMAX,
 * DSML, DSML_V4, NEMOTRON). */
const char *tool_stream_close_marker(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES || f == TOOL_FORMAT_GLM || f == TOOL_FORMAT_QWEN_XML ? "</tool_call>" : f == TOOL_FORMAT_PHI4 ? "<|/tool_call|>"
         : f == TOOL_FORMAT_COMMAND_R7B                    ? TOOL_R7B_ACTION_END
         : f == TOOL_FORMAT_MINIMAX                        ? TOOL_MINIMAX_CALLS_END
         : f == TOOL_FORMAT_DSML                           ? TOOL_DSML_CALLS_END
         : f == TOOL_FORMAT_DSML_V4                        ? TOOL_DSML_V4_CALLS_END
         : f == TOOL_FORMAT_NEMOTRON                       ? "</TOOLCALL>"
         : f == TOOL_FORMAT_GEMMA4                         ? TOOL_GEMMA4_CALL_END
         : f == TOOL_FORMAT_FUNCTIONARY                    ? TOOL_FUNCTIONARY_CALL_END
         : f == TOOL_FORMAT_SEED_OSS                       ? TOOL_SEED_CALL_END
                                                           : NULL;
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
        if (tool_json_is_ws((unsigned char)ts->text[g->scanned])) continue;
        if (!g->has) g->first = g->scanned, g->has = 1;
        g->end = g->scanned + 1;
    }
    if (!to_content || !g->has || g->end - g->first == g->emitted) return;
    if (!g->emitted && g->base) tool_json_buf_add(&ts->content, " ", 1);
    tool_json_buf_add(&ts->content, ts->text + g->first + g->emitted, g->end - g->first - g->emitted);
    g->emitted = g->end - g->first;
}

/* The call in progress counts once its name is whole and max_calls leaves room for it. */
static int call_visible(const struct tool_stream *ts)
{
    return ts->st == B_CALL && ts->call.has_name && (ts->max_calls <= 0 || ts->n_calls < ts->max_calls);
}

static void begin_call(struct tool_stream *ts)
{
    tool_json_call_start(&ts->call);
    ts->st = B_CALL;
}

struct tcall *tool_stream_new_call(struct tool_stream *ts, const char *name, size_t n)
{
    if (ts->n_calls == ts->cap_calls) {
        int cap = ts->cap_calls ? 2 * ts->cap_calls : 4;
        struct tcall *a = realloc(ts->calls, (size_t)cap * sizeof *a);
        if (!a) return ts->oom = 1, NULL;
        ts->calls = a, ts->cap_calls = cap;
    }
    struct tcall *t = &ts->calls[ts->n_calls];
    memset(t, 0, sizeof *t);
    if (!(t->name = malloc(n + 1))) return ts->oom = 1, NULL;
    memcpy(t->name, name, n);
    t->name[n] = 0;
    ts->n_calls++;
    return t;
}

/* Keeps the call just completed (when max_calls leaves room); returns whether it was kept. */
static int keep_call(struct tool_stream *ts)
{
    if (!call_visible(ts)) return 0;
    struct tool_json_call *c = &ts->call;
    struct tcall *t = tool_stream_new_call(ts, c->name.p, c->name.n);
    if (!t) return 0;
    t->args0 = c->args0, t->args1 = c->args1, t->no_args = !c->has_args;
    return 1;
}

/* Keeps the built-in call just completed (llama3, after <|python_tag|>; the first of the reply). */
static void keep_builtin(struct tool_stream *ts)
{
    struct tool_json_builtin *b = &ts->builtin;
    struct tcall *t = tool_stream_new_call(ts, b->name.p, b->name.n);
    if (!t) return;
    if (!(t->own_args = malloc(b->args.n + 1))) {
        ts->oom = 1;
        return;
    }
    memcpy(t->own_args, b->args.p, b->args.n + 1);
    t->own_len = b->args.n;
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
void tool_stream_call_bad(struct tool_stream *ts)
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
    else if (tool_format_is_list(ts->f)) ts->st = B_LIST_AFTER;
    else ts->st = B_AFTER_CALL, ts->close_at = (size_t)-1;
}

void tool_stream_text_from(struct tool_stream *ts, size_t start)
{
    ts->st = B_TEXT;
    seg_open(ts, &ts->cseg, start);
    ts->search = start;
    ts->pos = start;
}

/* Command R7B's text from ts->search: the position of its list's marker, or -1 once the text
 * up to where a marker may still begin is read into the content (ts->search there). Its answer's
 * markers are dropped: each ends the content's segment and opens the next after it. */
static size_t r7b_scan(struct tool_stream *ts)
{
    static const char *const mk[3] = {TOOL_R7B_ACTION, TOOL_R7B_RESPONSE, TOOL_R7B_RESPONSE_END};
    size_t p = ts->search;
    for (; p < ts->len; p++) {
        int k, undecided = 0;
        for (k = 0; k < 3; k++) {
            const size_t m = strlen(mk[k]), have = ts->len - p < m ? ts->len - p : m;
            ts->steps++;
            if (memcmp(ts->text + p, mk[k], have)) continue;
            if (have == m) break;
            undecided |= !ts->final; /* the text so far ends inside this marker */
        }
        if (k == 0) return p;
        if (k < 3) {
            seg_advance(ts, &ts->cseg, p, 1);
            seg_open(ts, &ts->cseg, p + strlen(mk[k]));
            p += strlen(mk[k]) - 1;
            continue;
        }
        if (undecided) break;
    }
    ts->search = p;
    seg_advance(ts, &ts->cseg, p, 1);
    ts->pos = ts->len;
    return (size_t)-1;
}

/* B_TEXT: reads the text up to the next opening marker, or all of it (holding back a possible
 * marker's start). */
static void read_text(struct tool_stream *ts)
{
    const char *open = tool_stream_open_marker(ts->f);
    /* Qwen3-Coder's calls also come without their <tool_call> (llama.cpp reads them so too) */
    const char *bare = ts->f == TOOL_FORMAT_QWEN_XML ? TOOL_FUNCTIONARY_CALL : NULL;
    size_t m = strlen(open), mb = bare ? strlen(bare) : 0, p = ts->search;
    int is_bare = 0;
    if (ts->f == TOOL_FORMAT_COMMAND_R7B) {
        if ((p = r7b_scan(ts)) == (size_t)-1) return;
    } else {
        for (; p + m <= ts->len || (bare && p + mb <= ts->len); p++) {
            ts->steps++;
            if (p + m <= ts->len && ts->text[p] == open[0] && !memcmp(ts->text + p, open, m)) break;
            if (bare && p + mb <= ts->len && ts->text[p] == bare[0] && !memcmp(ts->text + p, bare, mb)) {
                is_bare = 1;
                break;
            }
        }
    }
    if (is_bare || p + m <= ts->len) { /* a marker: the text before it is whole, a block of calls opens */
        seg_advance(ts, &ts->cseg, p, 1);
        ts->block = p, ts->kept_block = 0;
        ts->pos = is_bare ? p + mb : p + m;
        ts->bare = is_bare;
        if (tool_format_is_list(ts->f)) ts->st = B_LIST_OPEN;
        else if (tool_format_whole_calls(ts->f)) ts->st = B_GLM, ts->search = ts->pos, ts->g4_str = 0;
        else if (ts->f == TOOL_FORMAT_DEEPSEEK || ts->f == TOOL_FORMAT_KIMI)
            ts->st = B_DS, ts->search = p + m, ts->close_at = (size_t)-1;
        else begin_call(ts);
        return;
    }
    /* (resumed where the longer marker did not fit yet: its start may be among the last bytes) */
    const size_t m_max = m > mb ? m : mb;
    if (bare && ts->len + 1 >= m_max && ts->len + 1 - m_max < p) p = ts->len + 1 - m_max > ts->search ? ts->len + 1 - m_max : ts->search;
    ts->search = p;
    size_t s0 = ts->cseg.start, hold = tool_stream_holdback(ts->text + s0, ts->len - s0, open);
    if (bare) {
        const size_t hb = tool_stream_holdback(ts->text + s0, ts->len - s0, bare);
        if (hb > hold) hold = hb;
    }
    size_t limit = ts->final ? ts->len : ts->len - hold;
    ts->steps += m + mb;
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
    const char *close = tool_stream_close_marker(ts->f);
    switch (ts->st) {
    case B_CALL: {
        int r = tool_json_call_byte(&ts->call, c, at, tool_format_name_key(ts->f), tool_format_args_key(ts->f), &ts->oom);
        if (r == TOOL_JSON_DONE) call_done(ts);
        else if (r == TOOL_JSON_BAD) tool_stream_call_bad(ts);
        return;
    }
    case B_LIST_OPEN:
        if (tool_json_is_ws(c)) return;
        if (c == '[') begin_call(ts);
        else tool_stream_call_bad(ts);
        return;
    case B_LIST_AFTER:
        if (tool_json_is_ws(c)) return;
        if (c == ']' && close) ts->st = B_AFTER_CALL, ts->close_at = (size_t)-1; /* the list's closing marker */
        else if (c == ']') tool_stream_text_from(ts, at + 1);
        else if (c == ',') begin_call(ts);
        else tool_stream_call_bad(ts);
        return;
    case B_AFTER_CALL:
        if (!close) {
            tool_stream_text_from(ts, at);
            return;
        }
        if (ts->close_at == (size_t)-1) {
            if (tool_json_is_ws(c)) return;
            ts->close_at = at;
        }
        if (c != close[at - ts->close_at]) tool_stream_text_from(ts, ts->close_at); /* not the closing marker: text */
        else if (at + 1 - ts->close_at == strlen(close)) tool_stream_text_from(ts, at + 1);
        return;
    case G_OPEN:
        if (tool_json_is_ws(c)) return;
        ts->seen = 1;
        ts->st = c == '{' ? G_KEYSTART : B_DEAD;
        return;
    case G_KEYSTART:
        if (tool_json_is_ws(c)) return;
        tool_json_buf_reset(&ts->gkey);
        memset(&ts->gs, 0, sizeof ts->gs);
        ts->st = c == '"' ? G_KEY : B_DEAD;
        return;
    case G_KEY: {
        int r = tool_json_str_byte(&ts->gs, c, &ts->gkey);
        ts->oom |= ts->gkey.oom;
        if (r == TOOL_JSON_BAD) ts->st = B_DEAD;
        else if (r == TOOL_JSON_DONE) ts->st = G_COLON;
        return;
    }
    case G_COLON: {
        if (tool_json_is_ws(c)) return;
        const char *k = ts->gkey.p ? ts->gkey.p : "";
        ts->st = c != ':' ? B_DEAD : !strcmp(k, "response") ? G_RSTART : !strcmp(k, "tool_calls") ? G_LSTART : B_DEAD;
        return;
    }
    case G_RSTART:
        if (tool_json_is_ws(c)) return;
        memset(&ts->gs, 0, sizeof ts->gs);
        ts->st = c == '"' ? G_RESP : B_DEAD;
        return;
    case G_RESP: {
        int r = tool_json_str_byte(&ts->gs, c, &ts->content);
        if (r == TOOL_JSON_DONE) ts->gdone = 1;
        if (r != TOOL_JSON_MORE) ts->st = B_DEAD;
        return;
    }
    case G_LSTART:
        if (tool_json_is_ws(c)) return;
        if (c == '[') begin_call(ts);
        else ts->st = B_DEAD;
        return;
    case G_LAFTER:
        if (tool_json_is_ws(c)) return;
        if (c == ']') ts->gdone = 1, ts->st = B_DEAD;
        else if (c == ',') begin_call(ts);
        else ts->st = B_DEAD;
        return;
    case L_CALLSTART:
        if (tool_json_is_ws(c)) return;
        if (c == '{') begin_call(ts), ts->pos = at; /* the call's machine reads the brace */
        else if (ts->tagged) tool_json_builtin_start(&ts->builtin), ts->st = L_BUILTIN, ts->pos = at;
        else rest_is_text(ts, ts->body);
        return;
    case L_BUILTIN: {
        int r = tool_json_builtin_byte(&ts->builtin, c, &ts->oom);
        if (r == TOOL_JSON_DONE) {
            keep_builtin(ts);
            ts->st = L_AFTER;
        } else if (r == TOOL_JSON_BAD) {
            tool_stream_call_bad(ts);
        }
        return;
    }
    case L_AFTER:
    case L_SEMI:
        if (tool_json_is_ws(c)) return;
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
 * still be the tag's start (or a built-in tool's name). */
static void llama3_start(struct tool_stream *ts)
{
    while (ts->rscan < ts->len && tool_json_is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
    size_t j = ts->rscan, have = ts->len - j, m = strlen(PYTHON_TAG);
    int prefix = !memcmp(ts->text + j, PYTHON_TAG, have < m ? have : m);
    ts->steps += m;
    if (prefix && have < m && !ts->final) {
        ts->pos = ts->len;
        return;
    }
    ts->st = L_CALLSTART;
    ts->tagged = prefix && have >= m;
    ts->pos = ts->tagged ? j + m : j;
    if (ts->tagged) return;
    /* A control token <|python_tag|> adds no text: a reply that opens with a built-in tool's name
     * (then not a name's byte) may be its call; held while that is not known. */
    for (int k = 0; k < 2; k++) {
        size_t b = strlen(BUILTIN_TOOLS[k]), cmp = have < b ? have : b;
        ts->steps += b;
        if (memcmp(ts->text + j, BUILTIN_TOOLS[k], cmp)) continue;
        if (have <= b && !ts->final) {
            ts->st = L_START, ts->pos = ts->len;
            return;
        }
        ts->tagged = have == b || (have > b && !tool_json_ident_byte((unsigned char)ts->text[j + b], 0));
    }
}

/* The reply proper starts at p. */
static void body_begin(struct tool_stream *ts, size_t p)
{
    ts->body = ts->pos = p;
    ts->rscan = p;
    if (!ts->tools) ts->st = B_RAW;
    else if (ts->f == TOOL_FORMAT_GENERIC) ts->st = G_OPEN;
    else if (ts->f == TOOL_FORMAT_LLAMA3) ts->st = L_START;
    else tool_stream_text_from(ts, p);
}

/* The reasoning block: finds where the reply proper starts. */
static void reasoning_advance(struct tool_stream *ts)
{
    if (ts->rph == R_DETECT) {
        while (ts->rscan < ts->len && tool_json_is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
        size_t j = ts->rscan, have = ts->len - j, m = strlen(ts->ropen);
        int prefix = !memcmp(ts->text + j, ts->ropen, have < m ? have : m);
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
        size_t m = strlen(ts->rclose), p = ts->rscan;
        for (; p + m <= ts->len; p++) {
            ts->steps++;
            if (ts->text[p] == ts->rclose[0] && !memcmp(ts->text + p, ts->rclose, m)) break;
        }
        if (p + m > ts->len) {
            ts->rscan = p;
            size_t s0 = ts->rseg.start;
            ts->steps += m;
            seg_advance(ts, &ts->rseg, ts->final ? ts->len : ts->len - tool_stream_holdback(ts->text + s0, ts->len - s0, ts->rclose), 0);
            return;
        }
        seg_advance(ts, &ts->rseg, p, 0);
        ts->rph = R_GAP, ts->rscan = p + m;
    }
    if (ts->rph == R_GAP) {
        while (ts->rscan < ts->len && tool_json_is_ws((unsigned char)ts->text[ts->rscan])) ts->rscan++, ts->steps++;
        if (ts->rscan == ts->len) return;
        ts->rph = R_OFF;
        body_begin(ts, ts->rscan);
    }
}

/* Reads what was appended (and, once final, what was held back). */
static void advance(struct tool_stream *ts)
{
    if (ts->f == TOOL_FORMAT_HARMONY) {
        harmony_advance(ts);
        return;
    }
    if (ts->st == B_WAIT) reasoning_advance(ts);
    while (ts->st != B_WAIT && (ts->pos < ts->len || (ts->final && ts->st == L_START))) {
        if (ts->st == B_TEXT) read_text(ts);
        else if (ts->st == B_RAW) {
            ts->steps += ts->len - ts->pos;
            tool_json_buf_add(&ts->content, ts->text + ts->pos, ts->len - ts->pos);
            ts->pos = ts->len;
        } else if (ts->st == L_START) llama3_start(ts);
        else if (ts->st == B_GLM) tool_stream_read_glm(ts);
        else if (ts->st == B_DS) tool_stream_read_deepseek(ts);
        else if (ts->st == B_REST) seg_advance(ts, &ts->cseg, ts->len, 1), ts->pos = ts->len;
        else if (ts->st == B_DEAD) ts->pos = ts->len;
        else body_byte(ts);
    }
    if (ts->final && ts->st == B_GLM) tool_stream_read_glm(ts); /* a body cut short: text */
    if (ts->final && ts->st == B_DS) tool_stream_read_deepseek(ts); /* cut short: text, or the calls before */
    if (ts->final && ts->st == B_TEXT) seg_advance(ts, &ts->cseg, ts->len, 1);
    if (ts->final && ts->st == L_BUILTIN) tool_stream_call_bad(ts); /* a built-in call cut short: text */
}

/* ---- the interface --------------------------------------------------------------------------- */

int tool_stream_new(enum tool_format f, int tools, int reasoning, int think_open, int max_calls,
                    struct tool_stream **out)
{
    struct tool_stream *ts = calloc(1, sizeof *ts);
    *out = ts;
    if (!ts) return -1;
    if (reasoning == TOOL_REASONING_HARMONY) f = TOOL_FORMAT_HARMONY; /* (a request without tools) */
    ts->f = f, ts->tools = tools, ts->reasoning = reasoning, ts->max_calls = max_calls;
    ts->st = B_WAIT;
    if (f == TOOL_FORMAT_HARMONY) { /* its channels are its reasoning (tool_harmony.c) */
        harmony_start(ts, think_open);
        return 0;
    }
    if (reasoning) ts->ropen = tool_reasoning_open((enum tool_reasoning)reasoning),
                   ts->rclose = tool_reasoning_close((enum tool_reasoning)reasoning);
    CHECK(!reasoning || ts->ropen, "tool_stream_new: reasoning %d names no markers", reasoning);
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

int tool_stream_arg_types(struct tool_stream *ts, const char *types)
{
    free(ts->types);
    ts->types = types ? strdup(types) : NULL;
    return types && !ts->types ? -1 : 0;
}

void tool_stream_free(struct tool_stream *ts)
{
    if (!ts) return;
    free(ts->types);
    for (int k = 0; k < ts->n_calls; k++) free(ts->calls[k].name), free(ts->calls[k].own_args);
    free(ts->calls);
    free(ts->text);
    free(ts->content.p);
    free(ts->gkey.p);
    free(ts->call.key.p);
    free(ts->call.name.p);
    free(ts->builtin.name.p);
    free(ts->builtin.args.p);
    free(ts->sent_args);
    free(ts->dcalls);
    free(ts->rbuf.p);
    free(ts->h_name);
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
        tool_json_buf_add(&ts->content, ts->text + ts->body, ts->len - ts->body);
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
    if (ts->rbuf.p) v->reasoning = ts->rbuf.p, v->reasoning_len = ts->rbuf.n; /* harmony's */
    v->content = ts->content.p ? ts->content.p : "";
    v->content_len = ts->content.n;
    const char *name, *args;
    size_t n;
    v->n_calls = ts->n_calls + (ts->f == TOOL_FORMAT_HARMONY ? harmony_open_call(ts, &name, &args, &n) : call_visible(ts));
}

void tool_stream_call(const struct tool_stream *ts, int k, struct tool_view_call *c)
{
    memset(c, 0, sizeof *c);
    if (k < ts->n_calls) {
        const struct tcall *t = &ts->calls[k];
        c->name = t->name, c->complete = 1;
        if (t->own_args) c->args = t->own_args, c->args_len = t->own_len;
        else if (t->no_args) c->args = "{}", c->args_len = 2;
        else c->args = ts->text + t->args0, c->args_len = t->args1 - t->args0;
        return;
    }
    if (ts->f == TOOL_FORMAT_HARMONY) {
        harmony_open_call(ts, &c->name, &c->args, &c->args_len);
        return;
    }
    const struct tool_json_call *j = &ts->call; /* the call in progress (call_visible) */
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
