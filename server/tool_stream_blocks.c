/* server/tool_stream_blocks.c - the tool-call blocks that tool_stream.c holds until a closing
 * marker and then reads whole: the XML-like calls (GLM-4.5's, Qwen3-Coder's, Gemma 4's,
 * functionary's; MiniMax-M2's and DSML's blocks of <invoke>s: tool_glm.c reads each body) and
 * DeepSeek's and Kimi-K2's lists of calls. Each byte is looked at once (ts->search resumes a
 * scan). Tests: tests/test_tool_stream.c, tests/fuzz/fuzz_tool_parse.c. */
#include "tool_stream_impl.h"

#include <stdlib.h>
#include <string.h>

/* The first lit in the text from ts->search, or -1 (ts->search then where a later search
 * resumes, so that each byte is looked at once). */
static size_t scan_for(struct tool_stream *ts, const char *lit)
{
    const size_t m = strlen(lit);
    size_t p = ts->search;
    for (; p + m <= ts->len; p++) {
        ts->steps++;
        if (ts->text[p] == lit[0] && !memcmp(ts->text + p, lit, m)) return p;
    }
    ts->search = p;
    return (size_t)-1;
}

/* Gemma 4: the first <tool_call|> from ts->search outside its strings (a string, between <|"|>
 * marks, may hold the tag), or -1 (scan_for's resumption; a '<' too close to the end to tell
 * waits for more text). */
static size_t scan_gemma4(struct tool_stream *ts)
{
    const size_t mq = strlen(TOOL_GEMMA4_QUOTE), me = strlen(TOOL_GEMMA4_CALL_END);
    size_t p = ts->search;
    for (; p + mq <= ts->len; p++) {
        ts->steps++;
        if (ts->text[p] != '<') continue;
        if (!memcmp(ts->text + p, TOOL_GEMMA4_QUOTE, mq)) {
            ts->g4_str ^= 1, p += mq - 1;
            continue;
        }
        if (ts->g4_str) continue;
        if (p + me > ts->len) break;
        if (!memcmp(ts->text + p, TOOL_GEMMA4_CALL_END, me)) return p;
    }
    ts->search = p;
    return (size_t)-1;
}

/* A call's body not closed yet: wait for more text, or, at the end, the block is malformed. */
static void body_open(struct tool_stream *ts)
{
    ts->pos = ts->len;
    if (ts->final) tool_stream_call_bad(ts);
}

/* Keeps a call named s[name_at..) with the arguments in args (taken) unless max_calls are kept. */
static void keep_xml_call(struct tool_stream *ts, const char *s, size_t name_at, size_t name_len, struct tool_json_buf *args)
{
    if (ts->max_calls <= 0 || ts->n_calls < ts->max_calls) {
        struct tcall *t = tool_stream_new_call(ts, s + name_at, name_len);
        if (t) t->own_args = args->p, t->own_len = args->n, *args = (struct tool_json_buf){0};
        ts->kept_block++;
    }
}

/* MiniMax-M2's or DSML's block body s[0..n): one or more <invoke>s, whitespace around them; with
 * keep, the calls are kept (a first pass checks them all). Returns 0 when the body is not that.
 * With cut (a reply that ended inside the block: max_tokens), the whole <invoke>s before the first
 * that is not are kept, and their count returned. */
static int invoke_body(struct tool_stream *ts, const char *s, size_t n, int keep, int cut, struct tool_json_buf *args)
{
    const int dsml = ts->f != TOOL_FORMAT_MINIMAX;
    int calls = 0;
    for (size_t at = 0;;) {
        while (at < n && tool_json_is_ws((unsigned char)s[at])) at++;
        if (at == n) return calls > 0;
        size_t used = 0, name_at = 0, name_len = 0;
        if (!tool_invoke(s + at, n - at, dsml, ts->types, &used, &name_at, &name_len, args)) return cut ? calls : 0;
        if (keep) keep_xml_call(ts, s + at, name_at, name_len, args);
        at += used, calls++;
    }
}

/* B_GLM: a call's body up to </tool_call> (held until it is whole), then made a call by
 * tool_glm.c (GLM's, Qwen3-Coder's, Gemma 4's or functionary's; MiniMax-M2's block up to </minimax:tool_call>, DSML's up
 * to its block's end, their calls);
 * a body that is not a call, or cut short, makes the block text. */
void tool_stream_read_glm(struct tool_stream *ts)
{
    /* (a bare Qwen3-Coder call: its body from <function= to </function>, both its own) */
    const char *close = ts->bare ? TOOL_FUNCTIONARY_CALL_END : tool_stream_close_marker(ts->f);
    const size_t m = strlen(close), b0 = ts->bare ? ts->block : ts->block + strlen(tool_stream_open_marker(ts->f));
    const size_t p = ts->f == TOOL_FORMAT_GEMMA4 ? scan_gemma4(ts) : scan_for(ts, close);
    struct tool_json_buf args = {0};
    const char *body = ts->text + b0;
    if (p == (size_t)-1) {
        if (ts->final && tool_format_is_invoke(ts->f) && ts->len > b0) { /* cut inside the block: its whole calls */
            ts->steps += ts->len - b0;
            invoke_body(ts, body, ts->len - b0, 1, 1, &args);
            if (args.oom) ts->oom = 1;
            free(args.p);
        }
        size_t name_at = 0, name_len = 0;
        if (ts->final && ts->f == TOOL_FORMAT_FUNCTIONARY && ts->len > b0) { /* a whole call the reply's end closes */
            ts->steps += ts->len - b0;
            if (tool_functionary_call(body, ts->len - b0, &name_at, &name_len, &args)) {
                keep_xml_call(ts, body, name_at, name_len, &args);
                free(args.p);
                tool_stream_text_from(ts, ts->len);
                return;
            }
            if (args.oom) ts->oom = 1;
            free(args.p);
        }
        body_open(ts); /* (final: the rest dropped after kept calls, else text) */
        return;
    }
    size_t name_at = 0, name_len = 0;
    ts->steps += p - b0;
    const size_t n_body = ts->bare ? p + m - b0 : p - b0;
    const int ok = tool_format_is_invoke(ts->f) ? invoke_body(ts, body, p - b0, 0, 0, &args)
                 : ts->f == TOOL_FORMAT_QWEN_XML || ts->f == TOOL_FORMAT_SEED_OSS
                     ? tool_qwen_xml_call(body, n_body, ts->types, ts->f == TOOL_FORMAT_QWEN_XML, &name_at, &name_len, &args)
                 : ts->f == TOOL_FORMAT_GEMMA4   ? tool_gemma4_call(body, p - b0, &name_at, &name_len, &args)
                 : ts->f == TOOL_FORMAT_FUNCTIONARY ? tool_functionary_call(body, p - b0, &name_at, &name_len, &args)
                                                 : tool_glm_call(body, p - b0, ts->types, &name_at, &name_len, &args);
    if (!ok) {
        if (args.oom) ts->oom = 1;
        free(args.p);
        tool_stream_call_bad(ts);
        return;
    }
    if (tool_format_is_invoke(ts->f)) {
        ts->steps += p - b0;
        invoke_body(ts, body, p - b0, 1, 0, &args);
        if (args.oom) ts->oom = 1;
    } else {
        keep_xml_call(ts, body, name_at, name_len, &args);
    }
    free(args.p);
    tool_stream_text_from(ts, p + m);
}

/* Whether the n bytes at s are a proper start of lit (all of s, fewer bytes than lit). */
static int starts_lit(const char *s, size_t n, const char *lit)
{
    const size_t m = strlen(lit);
    return n < m && !memcmp(s, lit, n);
}

/* B_DS: DeepSeek's list after <｜tool▁calls▁begin｜>: calls, each `<｜tool▁call▁begin｜>BODY<｜tool▁call▁end｜>`
 * (the body held until it is whole, then made a call by tool_glm.c's tool_deepseek_call), up to
 * <｜tool▁calls▁end｜>; whitespace between them is nothing. A reply that ends after a call without
 * the list's end keeps its calls; anything else malformed makes the block text (or, once calls
 * were kept, drops the rest: tool_stream_call_bad). Kimi-K2's list is the same with its own markers
 * (<|tool_calls_section_begin|>, <|tool_call_begin|>, ...) and bodies (tool_kimi_call). */
void tool_stream_read_deepseek(struct tool_stream *ts)
{
    const int kimi = ts->f == TOOL_FORMAT_KIMI;
    const char *const call_begin = kimi ? TOOL_KIMI_CALL_BEGIN : TOOL_DS_CALL_BEGIN;
    const char *const call_end = kimi ? TOOL_KIMI_CALL_END : TOOL_DS_CALL_END;
    const char *const calls_end = kimi ? TOOL_KIMI_CALLS_END : TOOL_DS_CALLS_END;
    const size_t mb = strlen(call_begin), me = strlen(call_end), ml = strlen(calls_end);
    for (;;) {
        if (ts->close_at == (size_t)-1) { /* between calls */
            size_t p = ts->search;
            for (; p < ts->len && tool_json_is_ws((unsigned char)ts->text[p]); p++) ts->steps++;
            ts->search = p;
            const size_t rest = ts->len - p;
            ts->steps += mb + ml;
            if (rest >= mb && !memcmp(ts->text + p, call_begin, mb)) {
                ts->close_at = ts->search = p + mb;
                continue;
            }
            if (rest >= ml && !memcmp(ts->text + p, calls_end, ml)) {
                tool_stream_text_from(ts, p + ml);
                return;
            }
            if (!ts->final && (starts_lit(ts->text + p, rest, call_begin) ||
                               starts_lit(ts->text + p, rest, calls_end))) {
                ts->pos = ts->len; /* wait for the marker to be whole */
                return;
            }
            if (ts->final && rest == 0 && ts->kept_block) tool_stream_text_from(ts, p); /* ended after a call */
            else tool_stream_call_bad(ts);
            return;
        }
        const size_t p = scan_for(ts, call_end); /* in a body: looking for its end */
        if (p == (size_t)-1) {
            body_open(ts);
            return;
        }
        const size_t b0 = ts->close_at;
        size_t name_at, name_len, args_at, args_len;
        ts->steps += p - b0;
        if (!(kimi ? tool_kimi_call : tool_deepseek_call)(ts->text + b0, p - b0, &name_at, &name_len, &args_at, &args_len)) {
            tool_stream_call_bad(ts);
            return;
        }
        if (ts->max_calls <= 0 || ts->n_calls < ts->max_calls) {
            struct tcall *t = tool_stream_new_call(ts, ts->text + b0 + name_at, name_len);
            if (t) t->args0 = b0 + args_at, t->args1 = b0 + args_at + args_len;
            ts->kept_block++;
        }
        ts->close_at = (size_t)-1;
        ts->search = p + me;
    }
}
