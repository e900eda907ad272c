/* tests/test_tool_stream.c - the incremental reply parser (server/tool_stream.c) against the
 * whole-text parser it replaced (tests/fuzz/tool_parse_ref.c):
 *  - every prefix of every reply (the fuzz corpus, hand-written cases, thousands of random
 *    replies built from markers, JSON pieces and text), in every format and setting, final or
 *    not: the same reasoning, content and calls, byte for byte;
 *  - a stream cut into random pieces sends the deltas the old stream code sent (re-parse the
 *    whole text, send what grew past what went out);
 *  - Llama 3.1's built-in calls (`<|python_tag|>name.call(k=v)`) give the calls worked out by hand;
 *  - the work is linear: long calls, long text, long reasoning, long call lists fed one byte
 *    at a time cost at most a constant number of parser steps per byte, and twice the reply
 *    costs twice the steps (counted, not timed).
 * The formats the old parser never read (GLM, DeepSeek, Kimi, Command R7B): their cases in
 * test_tool_stream_formats.c.
 * Usage: test_tool_stream [corpus_dir]. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base.h"
#include "http_internal.h"
#include "tool_format.h"
#include "tool_json.h"
#include "tool_parse_ref.h"
#include "test_tool_stream.h"

static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static unsigned rnd(unsigned n)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return n ? (unsigned)(rng_state % n) : 0;
}

static long n_compared;

struct cfg {
    enum tool_format f;
    int tools, reasoning, think_open, max_calls;
};

static void describe(const struct cfg *c, const char *text, size_t n, size_t cut, int final)
{
    fprintf(stderr, "format %s tools %d reasoning %d think_open %d max_calls %d, cut %zu of %zu, final %d: '%.*s'\n",
            tool_format_name(c->f), c->tools, c->reasoning, c->think_open, c->max_calls, cut, n, final, (int)cut, text);
}

static int same(const char *a, size_t na, const char *b, size_t nb) { return na == nb && !memcmp(a, b, na); }

/* tool_parse (the incremental parser fed once) equals the reference on text[0..cut). */
static void compare_parse(const struct cfg *c, const char *text, size_t n, size_t cut, int final)
{
    struct tool_parsed a, b;
    CHECK(tool_parse(c->f, c->tools, c->reasoning, c->think_open, c->max_calls, text, cut, final, &a) == 0, "oom");
    CHECK(tool_parse_ref(c->f, c->tools, c->reasoning, c->think_open, c->max_calls, text, cut, final, &b) == 0, "oom");
    int ok = a.has_reasoning == b.has_reasoning && same(a.reasoning, a.reasoning_len, b.reasoning, b.reasoning_len) &&
             same(a.content, a.content_len, b.content, b.content_len) && a.n_calls == b.n_calls;
    for (int k = 0; ok && k < a.n_calls; k++)
        ok = !strcmp(a.calls[k].name, b.calls[k].name) &&
             same(a.calls[k].args, a.calls[k].args_len, b.calls[k].args, b.calls[k].args_len) &&
             a.calls[k].complete == b.calls[k].complete;
    if (!ok) {
        describe(c, text, n, cut, final);
        fprintf(stderr, "  new: reasoning %d '%s' content '%s' calls %d\n", a.has_reasoning, a.reasoning, a.content, a.n_calls);
        for (int k = 0; k < a.n_calls; k++) fprintf(stderr, "    %s %s %d\n", a.calls[k].name, a.calls[k].args, a.calls[k].complete);
        fprintf(stderr, "  old: reasoning %d '%s' content '%s' calls %d\n", b.has_reasoning, b.reasoning, b.content, b.n_calls);
        for (int k = 0; k < b.n_calls; k++) fprintf(stderr, "    %s %s %d\n", b.calls[k].name, b.calls[k].args, b.calls[k].complete);
        CHECK(0, "the incremental parser differs from the whole-text one");
    }
    n_compared++;
    tool_parsed_free(&a);
    tool_parsed_free(&b);
}

/* A log of what a stream sends: one line per fragment. */
struct log {
    char  *p;
    size_t n, cap;
};

static void log_add(struct log *l, const char *tag, int k, const char *s, size_t n)
{
    char head[64];
    int h = snprintf(head, sizeof head, "%s %d %zu:", tag, k, n);
    CHECK(base_grow((void **)&l->p, &l->cap, l->n + (size_t)h + n + 2, 1) == 0, "oom");
    memcpy(l->p + l->n, head, (size_t)h);
    memcpy(l->p + l->n + h, s, n);
    l->n += (size_t)h + n;
    l->p[l->n++] = '\n';
    l->p[l->n] = 0;
}

/* The old streams' deltas (http_openai_out.c and chat_tools.c before tool_stream.c): re-parse the
 * whole text at each piece, send what grew past what went out. */
struct old_stream {
    size_t sent_reasoning, sent_content, sent_args[64];
    int    sent_calls;
};

static void old_delta(const struct cfg *c, struct old_stream *st, const char *text, size_t cut, int final, struct log *l)
{
    struct tool_parsed p;
    CHECK(tool_parse_ref(c->f, c->tools, c->reasoning, c->think_open, c->max_calls, text, cut, final, &p) == 0, "oom");
    if (p.reasoning_len > st->sent_reasoning) log_add(l, "r", 0, p.reasoning + st->sent_reasoning, p.reasoning_len - st->sent_reasoning);
    if (p.reasoning_len > st->sent_reasoning) st->sent_reasoning = p.reasoning_len;
    if (p.content_len > st->sent_content) log_add(l, "c", 0, p.content + st->sent_content, p.content_len - st->sent_content);
    if (p.content_len > st->sent_content) st->sent_content = p.content_len;
    for (int k = 0; k < p.n_calls && k < 64; k++) {
        const struct tool_parsed_call *pc = &p.calls[k];
        if (k >= st->sent_calls) {
            log_add(l, "name", k, pc->name, strlen(pc->name));
            log_add(l, "a", k, pc->args, pc->args_len);
            st->sent_args[k] = pc->args_len;
            st->sent_calls = k + 1;
        } else if (pc->args_len > st->sent_args[k]) {
            log_add(l, "a", k, pc->args + st->sent_args[k], pc->args_len - st->sent_args[k]);
            st->sent_args[k] = pc->args_len;
        }
    }
    tool_parsed_free(&p);
}

static void new_delta(struct tool_stream *ts, const char *piece, size_t n, int final, struct log *l)
{
    struct tool_delta d;
    CHECK(tool_stream_delta(ts, piece, n, final, &d) == 0, "oom");
    if (d.reasoning) log_add(l, "r", 0, d.reasoning, d.reasoning_len);
    if (d.content) log_add(l, "c", 0, d.content, d.content_len);
    for (int k = 0; k < d.n_calls; k++) {
        if (d.calls[k].is_new) log_add(l, "name", d.calls[k].index, d.calls[k].name, strlen(d.calls[k].name));
        log_add(l, "a", d.calls[k].index, d.calls[k].args, d.calls[k].args_len);
    }
}

/* The text cut into random pieces (ends included), streamed both ways. */
static void compare_stream(const struct cfg *c, const char *text, size_t n)
{
    struct log a = {0}, b = {0};
    struct old_stream old = {0};
    struct tool_stream *ts;
    CHECK(tool_stream_new(c->f, c->tools, c->reasoning, c->think_open, c->max_calls, &ts) == 0, "oom");
    size_t at = 0;
    for (;;) {
        size_t step = rnd(4) == 0 ? 0 : 1 + rnd(rnd(3) == 0 ? 40 : 4);
        size_t to = at + step > n ? n : at + step;
        int final = to == n && rnd(3) != 0;
        new_delta(ts, text + at, to - at, final, &a);
        old_delta(c, &old, text, to, final, &b);
        at = to;
        if (final) break;
        if (at == n) {
            new_delta(ts, "", 0, 1, &a);
            old_delta(c, &old, text, n, 1, &b);
            break;
        }
    }
    if (!same(a.p ? a.p : "", a.n, b.p ? b.p : "", b.n)) {
        describe(c, text, n, n, 1);
        fprintf(stderr, "new deltas:\n%s\nold deltas:\n%s\n", a.p ? a.p : "", b.p ? b.p : "");
        CHECK(0, "a stream's deltas differ from the old stream's");
    }
    tool_stream_free(ts);
    free(a.p);
    free(b.p);
}

static void check_text(const char *text, size_t n, int every_cfg)
{
    /* The formats the whole-text parser (tool_parse_ref.c) reads: GENERIC .. PHI4, and GRANITE
     * (MISTRAL's list after <|tool_call|>). */
    static const enum tool_format formats[] = {TOOL_FORMAT_GENERIC, TOOL_FORMAT_HERMES, TOOL_FORMAT_MISTRAL,
                                               TOOL_FORMAT_LLAMA3, TOOL_FORMAT_PHI4, TOOL_FORMAT_GRANITE};
    for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++)
        for (int bits = 0; bits < 16; bits++) {
            if (!every_cfg && rnd(4)) continue;
            const enum tool_format f = formats[fi];
            struct cfg c = {f, !(bits & 1) || rnd(8) != 0, bits >> 1 & 1 ? 1 + (int)rnd(3) : 0,
                            bits >> 2 & 1, bits >> 3 & 1}; /* (reasoning: one of the markers' kinds) */
            for (size_t cut = 0; cut <= n; cut += n > 600 ? 1 + rnd(13) : 1) compare_parse(&c, text, n, cut, 0);
            compare_parse(&c, text, n, n, 1);
            compare_stream(&c, text, n);
        }
}

/* A random reply from the pieces models write (and break). */
static size_t random_reply(char *out, size_t cap)
{
    static const char *const pieces[] = {
        "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|tool_call|>", "<|/tool_call|>", "<|python_tag|>",
        "<think>", "</think>", "<tool_c", "</tool", "<thi", "{", "}", "[", "]", ",", ":", ";", " ", "\n", "  \t",
        "\"name\"", "\"arguments\"", "\"parameters\"", "\"tool_calls\"", "\"response\"", "\"get_weather\"",
        "\"city\"", "\"Paris\"", "\"a\\\"b\\n\"", "\"\\u00e9\\ud83d\\ude00\"", "\"\\ud800\"", "\"\\u12", "\"\\x\"",
        "12", "-3.5e2", "true", "false", "null", "nul", "tru", "x", "hello world", "Sure, ", "{\"name\": \"f\", ",
        "\"arguments\": {\"x\": 1}}", "{\"name\":\"g\",\"parameters\":{\"q\":[1,2,{\"z\":null}]}}", "\x01", "\"\x01\"",
        "{\"tool_calls\": [", "{\"response\": \"", "\\", "\"", "é", "brave_search", "wolfram_alpha", ".call(", "query=", " = ",
        "call", ")", ".", "[THINK]", "[/THINK]", "[/THI", "<|begin_of_thought|>", "<|end_of_thought|>", "\0",
    };
    const int n_pieces = (int)(sizeof pieces / sizeof *pieces);
    size_t n = 0;
    int k = 1 + (int)rnd(30);
    for (int i = 0; i < k; i++) {
        int j = (int)rnd((unsigned)n_pieces);
        size_t m = j == n_pieces - 1 ? 1 : strlen(pieces[j]);
        if (n + m > cap) break;
        memcpy(out + n, pieces[j], m);
        n += m;
    }
    return n;
}

static void check_corpus(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "no corpus at %s: skipped\n", dir);
        return;
    }
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *data = NULL;
        size_t n = 0;
        if (base_read_file(path, 1 << 20, "corpus file", &data, &n) != STATUS_OK || n == 0) {
            free(data);
            continue;
        }
        check_text(data + 1, n - 1, 1); /* byte 0 is the fuzz target's settings */
        free(data);
        files++;
    }
    closedir(d);
    fprintf(stderr, "corpus: %d files\n", files);
}

/* Steps to parse text fed `piece` bytes at a time. */
static unsigned long long steps_of(enum tool_format f, int reasoning, const char *text, size_t n, size_t piece)
{
    struct tool_stream *ts;
    CHECK(tool_stream_new(f, 1, reasoning, 0, 0, &ts) == 0, "oom");
    struct tool_delta d;
    for (size_t at = 0; at < n; at += piece)
        CHECK(tool_stream_delta(ts, text + at, at + piece > n ? n - at : piece, 0, &d) == 0, "oom");
    CHECK(tool_stream_delta(ts, "", 0, 1, &d) == 0, "oom");
    unsigned long long s = tool_stream_steps(ts);
    tool_stream_free(ts);
    return s;
}

/* A reply of about `size` bytes of the given shape. */
static char *long_reply(int shape, size_t size, size_t *n)
{
    char *s = malloc(size + 256);
    CHECK(s, "oom");
    size_t k = 0;
    switch (shape) {
    case 0: /* one hermes call with a long string argument */
        k += (size_t)sprintf(s, "<tool_call>\n{\"name\": \"write\", \"arguments\": {\"text\": \"");
        for (; k < size || k % 5; k++) s[k] = "ab \\n"[k % 5]; /* whole "\\n" escapes */
        k += (size_t)sprintf(s + k, "\"}}\n</tool_call>");
        break;
    case 1: /* one hermes call with many keys and nested arrays */
        k += (size_t)sprintf(s, "<tool_call>{\"name\": \"f\", \"arguments\": {");
        for (int i = 0; k < size; i++) k += (size_t)sprintf(s + k, "\"k%d\": [%d, {\"x\": [true, null]}], ", i, i);
        k += (size_t)sprintf(s + k, "\"end\": 1}}</tool_call>");
        break;
    case 2: /* long text with near-markers, then a call */
        while (k < size) k += (size_t)sprintf(s + k, "some text <tool_ and more < ");
        k += (size_t)sprintf(s + k, "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>");
        break;
    case 3: /* a long mistral list of calls */
        k += (size_t)sprintf(s, "[TOOL_CALLS][");
        while (k < size) k += (size_t)sprintf(s + k, "{\"name\": \"f\", \"arguments\": {\"a\": 1}}, ");
        k += (size_t)sprintf(s + k, "{\"name\": \"g\", \"arguments\": {}}]");
        break;
    case 4: /* long reasoning, then a generic reply */
        k += (size_t)sprintf(s, "<think>");
        while (k < size) k += (size_t)sprintf(s + k, "hmm </thin let me think   ");
        k += (size_t)sprintf(s + k, "</think>{\"response\": \"done\"}");
        break;
    default: /* a generic reply: a long response string */
        k += (size_t)sprintf(s, "{\"response\": \"");
        while (k < size) k += (size_t)sprintf(s + k, "word \\u00e9 ");
        k += (size_t)sprintf(s + k, "\"}");
        break;
    }
    *n = k;
    return s;
}

static void check_linear(void)
{
    static const enum tool_format fmt[] = {TOOL_FORMAT_HERMES, TOOL_FORMAT_HERMES, TOOL_FORMAT_HERMES,
                                           TOOL_FORMAT_MISTRAL, TOOL_FORMAT_GENERIC, TOOL_FORMAT_GENERIC};
    for (int shape = 0; shape < 6; shape++) {
        size_t n1, n2;
        char *a = long_reply(shape, 100000, &n1), *b = long_reply(shape, 200000, &n2);
        int reasoning = shape == 4;
        unsigned long long s1 = steps_of(fmt[shape], reasoning, a, n1, 1), s2 = steps_of(fmt[shape], reasoning, b, n2, 1);
        unsigned long long s1w = steps_of(fmt[shape], reasoning, a, n1, n1); /* the same text in one piece */
        double per_byte = (double)s1 / (double)n1, growth = (double)s2 / (double)s1 * (double)n1 / (double)n2;
        fprintf(stderr, "linear: shape %d, %zu bytes: %llu steps byte by byte (%.2f a byte; whole: %llu), "
                "twice the bytes: x%.3f per byte\n", shape, n1, s1, per_byte, s1w, growth);
        CHECK(per_byte < 40, "shape %d: %.1f steps a byte fed byte by byte", shape, per_byte);
        CHECK(growth < 1.05, "shape %d: the steps per byte grow with the length (x%.3f)", shape, growth);
        /* And the result equals the reference's, whole. */
        struct cfg c = {fmt[shape], 1, reasoning, 0, 0};
        compare_parse(&c, a, n1, n1, 1);
        struct tool_parsed p;
        CHECK(tool_parse(c.f, 1, reasoning, 0, 0, a, n1, 1, &p) == 0, "oom");
        CHECK(shape == 2 || shape >= 4 ? p.content_len > 0 : p.n_calls > 0 && p.calls[p.n_calls - 1].complete,
              "shape %d: the long reply did not parse as meant", shape);
        tool_parsed_free(&p);
        free(a);
        free(b);
    }
}

/* Llama 3.1's built-in calls, as its template writes them after <|python_tag|>
 * (`name.call(k="v", ...)`): parsed into the call and arguments worked out by hand. */
static void check_builtin(void)
{
    static const struct { const char *text, *name, *args, *content; } cases[] = {
        {"<|python_tag|>brave_search.call(query=\"weather in Paris\")", "brave_search",
         "{\"query\": \"weather in Paris\"}", ""},
        {"\n<|python_tag|>wolfram_alpha.call(query=\"2+2\", n=3)", "wolfram_alpha", "{\"query\": \"2+2\", \"n\": 3}", ""},
        {"<|python_tag|>f.call()", "f", "{}", ""},
        {"<|python_tag|>f.call(a=1) and then", "f", "{\"a\": 1}", "and then"},
        {"<|python_tag|>print(1)", NULL, NULL, "<|python_tag|>print(1)"},
        {"<|python_tag|>f.call(a=1,)", NULL, NULL, "<|python_tag|>f.call(a=1,)"},
        {"<|python_tag|>f.call(a=\"x\"", NULL, NULL, "<|python_tag|>f.call(a=\"x\""},
        /* <|python_tag|> as a control token adds no text: a built-in tool's name opens the call */
        {" brave_search.call(query=\"x\")", "brave_search", "{\"query\": \"x\"}", ""},
        {"brave_search is a tool", NULL, NULL, "brave_search is a tool"},
        {"brave_searcher.call(a=1)", NULL, NULL, "brave_searcher.call(a=1)"},
        {"f.call(a=1)", NULL, NULL, "f.call(a=1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tool_parsed p;
        CHECK(!tool_parse(TOOL_FORMAT_LLAMA3, 1, 0, 0, 0, cases[i].text, strlen(cases[i].text), 1, &p), "oom");
        int ok = cases[i].name ? p.n_calls == 1 && !strcmp(p.calls[0].name, cases[i].name) &&
                                     !strcmp(p.calls[0].args, cases[i].args) && p.calls[0].complete
                               : p.n_calls == 0;
        ok = ok && !strcmp(p.content, cases[i].content);
        if (!ok) {
            fprintf(stderr, "FAIL built-in call '%s': %d calls (%s %s), content '%s'\n", cases[i].text, p.n_calls,
                    p.n_calls ? p.calls[0].name : "", p.n_calls ? p.calls[0].args : "", p.content);
            exit(1);
        }
        tool_parsed_free(&p);
    }
}

/* A call's closing marker written inside a JSON string of its arguments (hermes, phi4): the call's
 * JSON is read with its strings, so the marker's text stays in the argument and the call ends at
 * the real marker after the JSON (these formats end nothing at the marker: unlike harmony's
 * <|call|>, which stops generation and needs the grammar's escape of '<', docs/tools.md). */
static void check_marker_in_string(void)
{
    static const struct { enum tool_format f; const char *text, *args; } cases[] = {
        {TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"a</tool_call>b\"}}\n</tool_call>",
         "{\"s\": \"a</tool_call>b\"}"},
        {TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"<tool_call>x\"}}</tool_call>",
         "{\"s\": \"<tool_call>x\"}"},
        {TOOL_FORMAT_PHI4, "<|tool_call|>{\"name\": \"f\", \"arguments\": {\"s\": \"<|/tool_call|>\"}}<|/tool_call|>",
         "{\"s\": \"<|/tool_call|>\"}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tool_parsed p;
        CHECK(!tool_parse(cases[i].f, 1, 0, 0, 0, cases[i].text, strlen(cases[i].text), 1, &p), "oom");
        const int ok = p.n_calls == 1 && !strcmp(p.calls[0].name, "f") && !strcmp(p.calls[0].args, cases[i].args) &&
                       p.calls[0].complete && !strcmp(p.content, "");
        if (!ok) {
            fprintf(stderr, "FAIL marker inside a string '%s': %d calls (%s), content '%s'\n", cases[i].text, p.n_calls,
                    p.n_calls ? p.calls[0].args : "", p.content);
            exit(1);
        }
        tool_parsed_free(&p);
        check_text(cases[i].text, strlen(cases[i].text), 1);
    }
}

/* The template-specific reasoning markers: each kind splits its own block, no other. */
static void check_reasoning_kinds(void)
{
    static const struct { int kind; const char *text, *reasoning, *content; } cases[] = {
        {TOOL_REASONING_MISTRAL, "[THINK] plan it [/THINK]\n The answer.", "plan it", "The answer."},
        {TOOL_REASONING_THOUGHT, "<|begin_of_thought|>steps<|end_of_thought|>done", "steps", "done"},
        {TOOL_REASONING_THINK, "[THINK] plan [/THINK] x", "", "[THINK] plan [/THINK] x"},
        {TOOL_REASONING_MISTRAL, "<think> a </think> b", "", "<think> a </think> b"},
        {TOOL_REASONING_MISTRAL, "[THINK] unclosed", "unclosed", ""},
        {TOOL_REASONING_GEMMA4, "<|channel>thought\nweigh it<channel|>The answer.", "weigh it", "The answer."},
        {TOOL_REASONING_GEMMA4, "<think>a</think>b", "", "<think>a</think>b"},
        {TOOL_REASONING_R7B, "<|START_THINKING|>I will plan.<|END_THINKING|>Done.", "I will plan.", "Done."},
        {TOOL_REASONING_R7B, "<|START_THINKING|>cut", "cut", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct tool_parsed p;
        CHECK(!tool_parse(TOOL_FORMAT_HERMES, 0, cases[i].kind, 0, 0, cases[i].text, strlen(cases[i].text), 1, &p), "oom");
        if (strcmp(p.reasoning, cases[i].reasoning) || strcmp(p.content, cases[i].content)) {
            fprintf(stderr, "FAIL reasoning kind %d '%s': reasoning '%s' content '%s'\n", cases[i].kind, cases[i].text,
                    p.reasoning, p.content);
            exit(1);
        }
        tool_parsed_free(&p);
    }
    /* Command R7B's plan, then its action: the plan is the reasoning, the list its calls. */
    static const char r7b[] = "<|START_THINKING|>Look it up.<|END_THINKING|><|START_ACTION|>[{\"tool_call_id\": \"0\", "
                              "\"tool_name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}]<|END_ACTION|>";
    struct tool_parsed p;
    CHECK(!tool_parse(TOOL_FORMAT_COMMAND_R7B, 1, TOOL_REASONING_R7B, 0, 0, r7b, strlen(r7b), 1, &p), "oom");
    if (strcmp(p.reasoning, "Look it up.") || p.n_calls != 1 || strcmp(p.calls[0].name, "get_weather") || p.content_len) {
        fprintf(stderr, "FAIL Command R7B's plan and action: reasoning '%s', %d calls, content '%s'\n", p.reasoning,
                p.n_calls, p.content);
        exit(1);
    }
    tool_parsed_free(&p);
    check_text(r7b, strlen(r7b), 1);
}

/* ---- harmony (server/tool_harmony.c): no earlier parser to compare with; the properties ---- */

static int is_prefix(const char *a, size_t na, const char *b, size_t nb) { return na <= nb && !memcmp(a, b, na); }

/* Every partial parse of text[0..cut) is a prefix of the final parse of text[0..n): its
 * reasoning, its content, its calls (same names, arguments a prefix; whole when complete). */
void format_prefixes(enum tool_format f, int tools, int max_calls, const char *text, size_t n)
{
    struct tool_parsed whole, part;
    CHECK(tool_parse(f, tools, 0, 0, max_calls, text, n, 1, &whole) == 0, "oom");
    CHECK(max_calls <= 0 || whole.n_calls <= max_calls, "harmony: %d calls kept of %d", whole.n_calls, max_calls);
    for (size_t cut = 0; cut <= n; cut++) {
        CHECK(tool_parse(f, tools, 0, 0, max_calls, text, cut, 0, &part) == 0, "oom");
        int ok = is_prefix(part.reasoning, part.reasoning_len, whole.reasoning, whole.reasoning_len) &&
                 is_prefix(part.content, part.content_len, whole.content, whole.content_len) &&
                 part.n_calls <= whole.n_calls && (!part.has_reasoning || whole.has_reasoning);
        for (int k = 0; ok && k < part.n_calls; k++)
            ok = !strcmp(part.calls[k].name, whole.calls[k].name) &&
                 (part.calls[k].complete ? same : is_prefix)(part.calls[k].args, part.calls[k].args_len,
                                                             whole.calls[k].args, whole.calls[k].args_len);
        if (!ok) {
            fprintf(stderr, "harmony tools %d max_calls %d, cut %zu of %zu: '%.*s'\n  part: r '%s' c '%s' calls %d\n"
                    "  whole: r '%s' c '%s' calls %d\n", tools, max_calls, cut, n, (int)n, text, part.reasoning,
                    part.content, part.n_calls, whole.reasoning, whole.content, whole.n_calls);
            CHECK(0, "a partial harmony parse is not a prefix of the whole one");
        }
        n_compared++;
        tool_parsed_free(&part);
    }
    /* A stream cut at random sends deltas that add up to the whole parse. */
    struct tool_stream *ts;
    CHECK(tool_stream_new(f, tools, 0, 0, max_calls, &ts) == 0, "oom");
    struct tool_json_buf r = {0}, c = {0}, args[8] = {{0}};
    int n_calls = 0;
    for (size_t at = 0;;) {
        size_t step = rnd(6), to = at + step > n ? n : at + step;
        struct tool_delta d;
        CHECK(tool_stream_delta(ts, text + at, to - at, to == n, &d) == 0, "oom");
        if (d.reasoning) tool_json_buf_add(&r, d.reasoning, d.reasoning_len);
        if (d.content) tool_json_buf_add(&c, d.content, d.content_len);
        for (int k = 0; k < d.n_calls; k++) {
            CHECK(d.calls[k].index < 8, "harmony test: too many calls");
            if (d.calls[k].is_new) n_calls++;
            tool_json_buf_add(&args[d.calls[k].index], d.calls[k].args, d.calls[k].args_len);
        }
        if ((at = to) == n) break;
    }
    int ok = same(r.p ? r.p : "", r.n, whole.reasoning, whole.reasoning_len) &&
             same(c.p ? c.p : "", c.n, whole.content, whole.content_len) && n_calls == whole.n_calls;
    for (int k = 0; ok && k < n_calls; k++)
        ok = same(args[k].p ? args[k].p : "", args[k].n, whole.calls[k].args, whole.calls[k].args_len);
    if (!ok) fprintf(stderr, "harmony stream of '%.*s' (tools %d, max_calls %d)\n  stream: r '%s' c '%s' calls %d\n"
                     "  whole: r '%s' c '%s' calls %d\n", (int)n, text, tools, max_calls, r.p ? r.p : "", c.p ? c.p : "",
                     n_calls, whole.reasoning, whole.content, whole.n_calls);
    CHECK(ok, "a harmony stream's deltas do not add up to the whole parse");
    free(r.p), free(c.p);
    for (int k = 0; k < 8; k++) free(args[k].p);
    tool_stream_free(ts);
    tool_parsed_free(&whole);
}

static void check_harmony(void)
{
    static const char *const pieces[] = {
        "<|start|>", "assistant", "<|channel|>", "analysis", "final", "commentary", " to=functions.get_weather",
        " to=functions.f", " to=python", " to=assistant", " <|constrain|>json", " json", "<|message|>", "<|end|>",
        "<|call|>", "<|return|>", "<|sta", "<|chan", "<|mess", "<|", "<", "|>", "{\"city\": \"Paris\"}", "{}", "[1, 2",
        "Let me think.", " ", "\n", "é", "to=", "functions.", "answer 42", "<|constrain|>",
    };
    static const char *const fixed[] = {
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
        " <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b<|return|>",
        " to=functions.f<|channel|>commentary json<|message|>{}<|end|><|start|>assistant to=functions.g<|channel|>"
        "commentary json<|message|>{\"x\": 1}",
        "plain text without headers", "<|channel|>final<|message|>x<|sta", "<|channel|>fin",
    };
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        for (int bits = 0; bits < 4; bits++) format_prefixes(TOOL_FORMAT_HARMONY, bits & 1, bits >> 1, fixed[i], strlen(fixed[i]));
    /* Whitespace before a message's header is nothing; text outside messages stays as written. */
    static const char *const ws[][3] = {
        {"\n\n<|channel|>final<|message|>x", "x", ""},
        {"  hello <|end|>", "  hello ", ""},
        {"\n <|channel|>commentary to=functions.f <|constrain|>json<|message|>{}", "", "f"},
        {"\n to=functions.f<|channel|>commentary json<|message|>{}", "", "f"}, /* (review of 2026-11-30: ...) */
        {"  to=functions.f<|channel|>commentary json<|message|>{}", "", "f"},  /* (... whitespace before " to=") */
        {"<|channel|>commentary to=functions.f\n<|message|>{}", "", "f"},     /* (a name ends at whitespace) */
        {"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>\n", "", "f"}, /* (trailing) */
        {"\n<|start|>assistant", "\n<|start|>assistant", ""},  /* a failed header: text as written */
        {"hello <|start|>junk", "hello <|start|>junk", ""},
        {"<|start|><|start|><|start|>", "<|start|><|start|><|start|>", ""},
        {"<|channel|>final<|message|>x<|end|> <|channel|>", "x\n <|channel|>", ""},
    };
    for (int i = 0; i < (int)(sizeof ws / sizeof *ws); i++) {
        struct tool_parsed p;
        CHECK(tool_parse(TOOL_FORMAT_HARMONY, 1, 0, 0, 0, ws[i][0], strlen(ws[i][0]), 1, &p) == 0, "oom");
        CHECK(!strcmp(p.content, ws[i][1]) && (ws[i][2][0] ? p.n_calls == 1 && !strcmp(p.calls[0].name, ws[i][2]) : !p.n_calls),
              "harmony: '%s' gave content '%s' and %d calls", ws[i][0], p.content, p.n_calls);
        tool_parsed_free(&p);
    }
    char buf[1024];
    const int n_pieces = (int)(sizeof pieces / sizeof *pieces);
    for (int i = 0; i < 1500; i++) {
        size_t n = 0;
        for (int k = 1 + (int)rnd(24); k > 0; k--) {
            const char *p = pieces[rnd((unsigned)n_pieces)];
            size_t m = strlen(p);
            if (n + m > sizeof buf) break;
            memcpy(buf + n, p, m), n += m;
        }
        format_prefixes(TOOL_FORMAT_HARMONY, rnd(4) != 0, (int)rnd(3), buf, n);
    }
    /* Linear work: long reasoning full of near-markers, then a call with long arguments; a long run
     * of whitespace between messages (read once however it is fed). */
    for (int shape = 0; shape < 3; shape++) {
        unsigned long long steps[2];
        size_t lens[2];
        for (int t = 0; t < 2; t++) {
            size_t size = (size_t)(t + 1) * 100000, k = 0;
            char *s = malloc(size + 256);
            CHECK(s, "oom");
            if (shape == 0) {
                k += (size_t)sprintf(s, "<|channel|>analysis<|message|>");
                while (k < size) k += (size_t)sprintf(s + k, "a <| b <|en c <|sta d < ");
                k += (size_t)sprintf(s + k, "<|end|><|start|>assistant<|channel|>final<|message|>ok");
            } else if (shape == 1) {
                k += (size_t)sprintf(s, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"t\": \"");
                while (k < size) k += (size_t)sprintf(s + k, "xyz<|cal ");
                k += (size_t)sprintf(s + k, "\"}<|call|>");
            } else {
                k += (size_t)sprintf(s, "<|channel|>final<|message|>ok<|end|>");
                for (; k < size; k++) s[k] = "\n \t"[k % 3];
                k += (size_t)sprintf(s + k, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}");
            }
            struct tool_stream *ts;
            CHECK(tool_stream_new(TOOL_FORMAT_HARMONY, 1, 0, 0, 0, &ts) == 0, "oom");
            struct tool_delta d;
            for (size_t at = 0; at < k; at++) CHECK(tool_stream_delta(ts, s + at, 1, 0, &d) == 0, "oom");
            CHECK(tool_stream_delta(ts, "", 0, 1, &d) == 0, "oom");
            struct tool_view v;
            tool_stream_view(ts, &v);
            CHECK(shape == 0 ? v.reasoning_len > size - 100 && v.content_len == 2 : v.n_calls == 1 && (shape == 1 || v.content_len == 2),
                  "harmony: the long reply of shape %d did not parse as meant", shape);
            steps[t] = tool_stream_steps(ts), lens[t] = k;
            tool_stream_free(ts);
            free(s);
        }
        double per_byte = (double)steps[0] / (double)lens[0];
        double growth = (double)steps[1] / (double)steps[0] * (double)lens[0] / (double)lens[1];
        fprintf(stderr, "linear: harmony shape %d: %.2f steps a byte, twice the bytes: x%.3f per byte\n", shape, per_byte,
                growth);
        CHECK(per_byte < 40 && growth < 1.05, "harmony shape %d: %.1f steps a byte, x%.3f", shape, per_byte, growth);
    }
}

/* --parse-glm FILE [TOOLS_JSON] (--parse-deepseek FILE, --parse-kimi FILE, --parse-command-r7b FILE,
 * --parse-qwen-xml, --parse-minimax, --parse-dsml, --parse-dsml-v4 FILE [TOOLS_JSON]): the replies of FILE (separated by the byte 0x1e) parsed in
 * GLM's (DeepSeek's, ...) format, the values read by the tools' declared types when given
 * (tool_format_arg_types); for each, every call as "name<TAB>arguments" on a line, then "--"
 * (tests/server/test_tools_glm.py, test_tools_xml.py and test_tools_deepseek.py render calls
 * with the models' templates in jinja2 and compare them with what comes back). */
static int parse_file(enum tool_format fmt, const char *path, const char *tools_json)
{
    cJSON *tools = tools_json ? cJSON_Parse(tools_json) : NULL;
    CHECK(!tools_json || cJSON_IsArray(tools), "--parse-*: the tools are not a JSON list");
    char *types = tools ? tool_format_arg_types(tools) : NULL;
    CHECK(!tools || types, "out of memory");
    cJSON_Delete(tools);
    FILE *f = fopen(path, "rb");
    CHECK(f, "cannot open %s", path);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t at = 0; at <= n;) {
        const char *end = memchr(buf + at, 0x1e, n - at);
        size_t len = end ? (size_t)(end - (buf + at)) : n - at;
        struct tool_parsed p;
        CHECK(!tool_parse_typed(fmt, 1, 0, 0, 0, types, buf + at, len, 1, &p), "oom");
        for (int k = 0; k < p.n_calls; k++) printf("%s\t%s\n", p.calls[k].name, p.calls[k].args);
        printf("--\n");
        tool_parsed_free(&p);
        if (!end) break;
        at += len + 1;
    }
    free(types);
    return 0;
}

/* --glm-grammar TOOLS_JSON ONLY PARALLEL LAZY (--qwen-xml-grammar, --minimax-grammar, --dsml-grammar,
 * --dsml-v4-grammar ...): the GBNF grammar
 * server/http_tools_glm.c makes of the tools (a JSON list as the API takes it; ONLY "" for none)
 * on stdout (test_tools_glm.py and test_tools_xml.py check the templates' own renderings
 * against it with test_grammar). */
static int glm_grammar(enum tool_format f, const char *tools_json, const char *only, int parallel, int lazy)
{
    cJSON *tools = cJSON_Parse(tools_json);
    CHECK(cJSON_IsArray(tools), "--glm-grammar: the tools are not a JSON list");
    char *g = http_tools_glm_grammar(f, tools, only[0] ? only : NULL, parallel, lazy);
    fputs(g, stdout);
    free(g);
    cJSON_Delete(tools);
    return 0;
}

/* --deepseek-schema TOOLS_JSON ONLY PARALLEL FENCED LAZY [KIMI INDEX]: the JSON Schema
 * server/http_tools.c constrains DeepSeek's (Kimi-K2's) calls with, on stdout
 * (test_tools_deepseek.py checks the templates' own renderings against it with test_grammar). */
static int deepseek_schema(const char *tools_json, const char *only, int parallel, int fenced, int lazy, int kimi,
                           int index)
{
    cJSON *tools = cJSON_Parse(tools_json);
    CHECK(cJSON_IsArray(tools), "--deepseek-schema: the tools are not a JSON list");
    char *s = http_tools_deepseek_schema(tools, only[0] ? only : NULL, parallel, fenced, lazy, kimi, index);
    CHECK(s, "out of memory");
    fputs(s, stdout);
    free(s);
    cJSON_Delete(tools);
    return 0;
}

/* --detect FILE...: each chat template's tool format and reasoning markers, as the server reads
 * them at start-up (tool_format_detect, tool_format_detect_reasoning). */
static int detect_files(int n, char **paths)
{
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(paths[i], "rb");
        CHECK(f, "cannot open %s", paths[i]);
        static char buf[1 << 20];
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        const enum tool_reasoning r = tool_format_detect_reasoning(buf);
        printf("%s\t%s\t%s\n", paths[i], tool_format_name(tool_format_detect(buf)), r ? tool_reasoning_open(r) : "-");
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 2 && !strcmp(argv[1], "--detect")) return detect_files(argc - 2, argv + 2);
    static const struct {
        const char *flag;
        enum tool_format f;
    } parsers[] = {{"--parse-glm", TOOL_FORMAT_GLM},         {"--parse-deepseek", TOOL_FORMAT_DEEPSEEK},
                   {"--parse-kimi", TOOL_FORMAT_KIMI},       {"--parse-command-r7b", TOOL_FORMAT_COMMAND_R7B},
                   {"--parse-qwen-xml", TOOL_FORMAT_QWEN_XML}, {"--parse-minimax", TOOL_FORMAT_MINIMAX},
                   {"--parse-dsml", TOOL_FORMAT_DSML},         {"--parse-dsml-v4", TOOL_FORMAT_DSML_V4},
                   {"--parse-gemma4", TOOL_FORMAT_GEMMA4},     {"--parse-functionary", TOOL_FORMAT_FUNCTIONARY},
                   {"--parse-seed-oss", TOOL_FORMAT_SEED_OSS}};
    for (size_t i = 0; argc > 2 && i < sizeof parsers / sizeof *parsers; i++)
        if (!strcmp(argv[1], parsers[i].flag)) return parse_file(parsers[i].f, argv[2], argc > 3 ? argv[3] : NULL);
    static const struct {
        const char *flag;
        enum tool_format f;
    } grammars[] = {{"--glm-grammar", TOOL_FORMAT_GLM},         {"--qwen-xml-grammar", TOOL_FORMAT_QWEN_XML},
                    {"--minimax-grammar", TOOL_FORMAT_MINIMAX}, {"--dsml-grammar", TOOL_FORMAT_DSML},
                    {"--dsml-v4-grammar", TOOL_FORMAT_DSML_V4}, {"--gemma4-grammar", TOOL_FORMAT_GEMMA4},
                    {"--seed-oss-grammar", TOOL_FORMAT_SEED_OSS}};
    for (size_t i = 0; argc > 5 && i < sizeof grammars / sizeof *grammars; i++)
        if (!strcmp(argv[1], grammars[i].flag)) return glm_grammar(grammars[i].f, argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    if (argc > 4 && !strcmp(argv[1], "--functionary-schema")) {
        cJSON *tools = cJSON_Parse(argv[2]);
        CHECK(cJSON_IsArray(tools), "--functionary-schema: the tools are not a JSON list");
        char *s = http_tools_functionary_schema(tools, argv[3][0] ? argv[3] : NULL, atoi(argv[4]));
        CHECK(s, "out of memory");
        fputs(s, stdout);
        free(s);
        cJSON_Delete(tools);
        return 0;
    }
    if (argc > 6 && !strcmp(argv[1], "--deepseek-schema"))
        return deepseek_schema(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), argc > 8 ? atoi(argv[7]) : 0,
                               argc > 8 ? atoi(argv[8]) : 0);
    static const char *const cases[] = {
        "Sure.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call> done",
        "<tool_call>{\"arguments\": {\"a\": [1, 2]}, \"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\"}</tool_call>",
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": {\"x\": 1}}] after",
        "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {}}, {\"name\": 3}] after",
        "<|tool_call|>{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}<|/tool_call|>",
        "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": 1}}; {\"name\": \"g\", \"parameters\": {}} tail",
        "  {\"name\": \"f\", \"parameters\": 12} ;; x",
        "<think> plan </think>  {\"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"a\": -1.5e3}}]}",
        "{\"response\": \"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\"\"}",
        "{\"response\": \"bad \x01 ctl\"}",
        "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call> text after",
        "   <thi", "<tool_c", "<|python", "{\"tool_calls\": []}",
        "<|python_tag|>brave_search.call(query=\"weather in Paris\")",
        "<|python_tag|> wolfram_alpha . call ( query = \"2+2\" , n=3, opts={\"a\": [1]}, x=true) ; {\"name\": \"f\"}",
        "<|python_tag|>f.call()", "<|python_tag|>f.call(a=1,)", "<|python_tag|>f.cal(a=1)", "<|python_tag|>print(1)",
        "<|python_tag|>f.call(a=1) trailing text", "<|python_tag|>f.call(a=\"x\"",
        "brave_search.call(query=\"x\")", "wolfram_alpha", "[THINK]plan[/THINK] answer", " [THINK] open",
        "<|begin_of_thought|>a<|end_of_thought|>{\"name\": \"f\", \"parameters\": {}}", "[THI", "brave_search is a tool", "brave_searcher.call(q=1)",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_text(cases[i], strlen(cases[i]), 1);
    check_corpus(argc > 1 ? argv[1] : SHARDLM_SOURCE_DIR "/tests/fuzz/corpus/tool_parse");
    char buf[2048];
    for (int i = 0; i < 3000; i++) {
        size_t n = random_reply(buf, sizeof buf);
        check_text(buf, n, 0);
    }
    /* Deep nesting: the depth limit falls at the same byte. */
    char deep[700];
    size_t k = (size_t)sprintf(deep, "<tool_call>{\"name\": \"f\", \"arguments\": ");
    for (int i = 0; i < 130; i++) {
        if (i % 2) deep[k++] = '[';
        else k += (size_t)sprintf(deep + k, "{\"k\":");
    }
    check_text(deep, k, 1);
    check_linear();
    check_builtin();
    check_marker_in_string();
    check_reasoning_kinds();
    check_harmony();
    check_glm();
    check_deepseek();
    check_kimi();
    check_command_r7b();
    check_qwen_xml();
    check_minimax();
    check_nemotron();
    check_dsml();
    check_gemma4();
    check_functionary();
    printf("test_tool_stream: %ld parses compared, streams equal, work linear: PASS\n", n_compared);
    return 0;
}
