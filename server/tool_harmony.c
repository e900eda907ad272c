/* server/tool_harmony.c - GPT-OSS's harmony replies, read incrementally (tool_stream_impl.h):
 * the text a model writes after its prompt's `<|start|>assistant` is a run of messages
 *
 *   [<|start|>ROLE] HEADER <|message|> BODY (<|end|> | <|call|> | <|return|> | the reply's end)
 *
 * where the first message's role is the prompt's, and HEADER holds `<|channel|>CHANNEL` and, for
 * a tool call, ` to=RECIPIENT` (before or after the channel), maybe ` <|constrain|>json`. What a
 * message becomes, as OpenAI's harmony format defines the channels (and llama.cpp, vLLM read them):
 *   - a recipient `functions.NAME` (tools on): a tool call NAME, its arguments the body as written;
 *   - another recipient (a built-in tool: `python`, `browser.search`; or a function call when the
 *     request had no tools): reasoning (the model's own action, never the user's answer);
 *   - channel `analysis`: reasoning;
 *   - channel `final`, `commentary` without a recipient (a preamble), any other or none: content.
 * Messages of one kind are joined by "\n". A header that does not reach <|message|> within
 * HEADER_MAX bytes (or before the reply ends), and text outside any message, are content as
 * written (nothing the model wrote is lost) but for whitespace before a message's header. A body ends at <|end|>, <|call|>, <|return|>, or where
 * a new <|start|> or <|channel|> begins (gpt-oss-20b sometimes leaves out <|end|>).
 * Partial parses hold back bytes that may start a marker, so every partial view is a prefix of
 * the final one. Tests: tests/test_tool_stream.c (prefixes, linear work), tests/test_harmony.py
 * (against the openai-harmony package's parser). */
#include "tool_stream_impl.h"

#include <stdlib.h>
#include <string.h>

enum harmony_state { HS_MSG, HS_HEAD, HS_BODY };
enum harmony_dest { HD_REASONING, HD_CONTENT, HD_CALL, HD_DROP };

#define HEADER_MAX 256

static const char START[] = "<|start|>", CHANNEL[] = "<|channel|>", MESSAGE[] = "<|message|>",
                  CONSTRAIN[] = "<|constrain|>", TO[] = " to=";
/* What a message opens with (after an optional <|start|>ROLE). */
static const char *const HEADS[] = {START, CHANNEL, MESSAGE, CONSTRAIN, TO};
/* What ends a body: the first three are consumed, the others begin the next message. */
static const char *const ENDS[] = {"<|end|>", "<|call|>", "<|return|>", START, CHANNEL};

/* 1 when text[p..len) is a proper prefix of marker (more bytes may complete it). */
static int may_become(const struct tool_stream *ts, size_t p, const char *marker)
{
    size_t have = ts->len - p, m = strlen(marker);
    return have < m && !memcmp(ts->text + p, marker, have);
}

static int starts(const struct tool_stream *ts, size_t p, const char *marker)
{
    size_t m = strlen(marker);
    return ts->len - p >= m && !memcmp(ts->text + p, marker, m);
}

/* Gives the body's bytes up to limit to its destination. */
static void body_to(struct tool_stream *ts, size_t limit)
{
    size_t from = ts->h_body + ts->h_done;
    if (limit <= from) return;
    size_t n = limit - from;
    if (ts->h_dest == HD_REASONING || ts->h_dest == HD_CONTENT) {
        int k = ts->h_dest == HD_CONTENT;
        struct tool_json_buf *b = k ? &ts->content : &ts->rbuf;
        if (!ts->h_done && ts->h_pieces[k]++ && !(k && ts->h_glue)) tool_json_buf_add(b, "\n", 1);
        ts->h_glue = 0;
        tool_json_buf_add(b, ts->text + from, n);
        ts->oom |= b->oom;
    }
    ts->h_done += n;
}

/* The message's body ends (its bytes all given): a call is kept. */
static void body_end(struct tool_stream *ts)
{
    if (ts->h_dest == HD_CALL) {
        struct tcall *t = tool_stream_new_call(ts, ts->h_name, strlen(ts->h_name));
        if (t) t->args0 = ts->h_body, t->args1 = ts->h_body + ts->h_done, t->no_args = !ts->h_done;
    }
    free(ts->h_name);
    ts->h_name = NULL;
    ts->h_st = HS_MSG;
    ts->h_ws = 0; /* (message_begin reads whitespace from pos on) */
}

/* The word after key in the header [h, e): up to whitespace, a marker's '<' or the header's end. */
static void header_word(const char *h, const char *e, const char *key, const char **w, size_t *n)
{
    *w = NULL, *n = 0;
    size_t k = strlen(key);
    for (const char *p = h; p + k <= e; p++) {
        if (memcmp(p, key, k)) continue;
        if (key[0] == 't' && p > h && !tool_json_is_ws((unsigned char)p[-1]) && p[-1] != '>') continue; /* a word */
        const char *s = p + k, *q = s;
        while (q < e && !tool_json_is_ws((unsigned char)*q) && *q != '<') q++;
        *w = s, *n = (size_t)(q - s);
        return;
    }
}

static void start_body(struct tool_stream *ts, size_t at, int dest)
{
    ts->h_st = HS_BODY, ts->h_dest = dest;
    ts->h_body = ts->pos = at, ts->h_done = 0;
}

/* The header [h_at, q) is whole (<|message|> at q): where its body goes. */
static void header_done(struct tool_stream *ts, size_t q)
{
    const char *h = ts->text + ts->h_at, *e = ts->text + q, *to, *ch;
    size_t n_to, n_ch;
    header_word(h, e, "to=", &to, &n_to);
    header_word(h, e, CHANNEL, &ch, &n_ch);
    ts->steps += 2 * (size_t)(e - h);
    int dest = HD_CONTENT;
    static const char FN[] = "functions.";
    size_t fn = sizeof FN - 1;
    if (to && n_to && !(n_to == 9 && !memcmp(to, "assistant", 9))) {
        if (ts->tools && n_to > fn && !memcmp(to, FN, fn)) {
            dest = ts->max_calls > 0 && ts->n_calls >= ts->max_calls ? HD_DROP : HD_CALL;
            if (dest == HD_CALL && !(ts->h_name = malloc(n_to - fn + 1))) ts->oom = 1, dest = HD_DROP;
            if (dest == HD_CALL) memcpy(ts->h_name, to + fn, n_to - fn), ts->h_name[n_to - fn] = 0;
        } else {
            dest = HD_REASONING;
        }
    } else if (ch && n_ch == 8 && !memcmp(ch, "analysis", 8)) {
        dest = HD_REASONING;
    }
    if (dest == HD_REASONING) ts->has_reasoning = 1;
    ts->h_glue = 0;
    start_body(ts, q + sizeof MESSAGE - 1, dest);
}

/* HS_MSG: a message begins at pos, after whitespace, which is nothing before a header (the
 * grammar of a call lets the model write some) or at the reply's end; returns 0 when more bytes
 * are needed to tell. The whitespace is read once (h_ws), however the reply is fed. */
static int message_begin(struct tool_stream *ts)
{
    size_t p = ts->pos, q = ts->h_ws > p ? ts->h_ws : p;
    while (q < ts->len && tool_json_is_ws((unsigned char)ts->text[q])) q++, ts->steps++;
    ts->h_ws = q;
    if (q == ts->len) {
        if (ts->final) ts->pos = q; /* trailing whitespace: nothing */
        return ts->final;
    }
    /* " to=" begins with its own space: the last whitespace byte may be its. */
    const size_t to_at = q > p && ts->text[q - 1] == ' ' ? q - 1 : q;
    for (size_t i = 0; i < sizeof HEADS / sizeof *HEADS; i++) {
        const size_t at = HEADS[i] == TO ? to_at : q;
        ts->steps++;
        if (!ts->final && may_become(ts, at, HEADS[i])) return 0;
        if (!starts(ts, at, HEADS[i])) continue;
        ts->h_st = HS_HEAD;
        ts->h_at = ts->pos = HEADS[i] == START ? at + sizeof START - 1 : at;
        ts->h_body = p, ts->h_mark = at; /* (where the message began, were it text after all) */
        return 1;
    }
    start_body(ts, p, HD_CONTENT); /* text outside any message, as written */
    return 1;
}

/* HS_HEAD: looks for <|message|> from pos. A header that does not reach it within HEADER_MAX
 * bytes, or before the reply ends, is text from the message's start (its whitespace included),
 * continuing a text that ended at its marker. */
static void header_advance(struct tool_stream *ts)
{
    const size_t m = sizeof MESSAGE - 1;
    size_t p = ts->pos;
    for (; p + m <= ts->len && p - ts->h_at <= HEADER_MAX; p++) {
        ts->steps++;
        if (ts->text[p] == '<' && !memcmp(ts->text + p, MESSAGE, m)) {
            header_done(ts, p);
            return;
        }
    }
    if (p - ts->h_at > HEADER_MAX || ts->final) {
        const size_t mark = ts->h_mark;
        start_body(ts, ts->h_body, HD_CONTENT);
        ts->pos = mark + 1; /* (the marker's first byte is text now, not a body's end) */
        return;
    }
    ts->pos = p;
}

/* HS_BODY: gives bytes to the body's destination up to its end, or up to a possible marker. */
static void body_advance(struct tool_stream *ts)
{
    size_t p = ts->pos;
    for (; p < ts->len; p++) {
        ts->steps++;
        if (ts->text[p] != '<') continue;
        for (size_t i = 0; i < sizeof ENDS / sizeof *ENDS; i++) {
            ts->steps++;
            if (!ts->final && may_become(ts, p, ENDS[i])) { /* held back until known */
                body_to(ts, p);
                ts->pos = p;
                return;
            }
            if (!starts(ts, p, ENDS[i])) continue;
            body_to(ts, p);
            const int glue = i >= 3 && ts->h_dest == HD_CONTENT; /* text that a failed header may continue */
            body_end(ts);
            ts->h_glue = glue;
            ts->pos = i < 3 ? p + strlen(ENDS[i]) : p;
            return;
        }
    }
    body_to(ts, ts->len);
    ts->pos = ts->len;
    if (ts->final) body_end(ts);
}

void harmony_start(struct tool_stream *ts, int think_open)
{
    ts->h_st = HS_MSG;
    if (think_open) {
        start_body(ts, 0, HD_REASONING);
        ts->has_reasoning = 1;
    }
}

void harmony_advance(struct tool_stream *ts)
{
    for (;;) {
        size_t pos = ts->pos;
        int st = ts->h_st;
        if (st == HS_MSG) {
            if (pos == ts->len || !message_begin(ts)) return;
        } else if (st == HS_HEAD) {
            header_advance(ts);
        } else {
            body_advance(ts);
        }
        if (ts->oom || (ts->pos == pos && ts->h_st == st)) return; /* waiting for more */
    }
}

int harmony_open_call(const struct tool_stream *ts, const char **name, const char **args, size_t *args_len)
{
    if (ts->h_st != HS_BODY || ts->h_dest != HD_CALL) return 0;
    *name = ts->h_name, *args = ts->text + ts->h_body, *args_len = ts->h_done;
    return 1;
}
