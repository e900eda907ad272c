/* tests/fuzz/fuzz_tool_parse.c - the reply parser of tool calls and reasoning
 * (server/tool_format.c tool_parse): model output is outside input (a model can write anything
 * under tool_choice auto). Each input is parsed whole and, as a stream would, at its prefixes
 * (every one of a short reply, 24 of a longer one: pick_cuts);
 * checked: no crash or sanitizer report, the lengths agree with the strings, the reasoning of
 * a prefix is a prefix of the reasoning of the whole, and every parse (the incremental parser,
 * server/tool_stream.c) equals the whole-text parser it replaced (tool_parse_ref.c); harmony
 * (server/tool_harmony.c), GLM, Qwen3-Coder, MiniMax-M2, DSML and DeepSeek (server/tool_glm.c) and
 * Command R7B, which
 * that parser never read: content and calls of a prefix are prefixes of the whole's (but for the
 * list formats, Command R7B and Nemotron, whose partial calls may go, as Mistral's under the
 * reference).
 * Input: byte 0 picks the format (bits 0-2: the first eight formats; 2, mistral, is granite
 * (nemotron when the length is 1 modulo 4),
 * 7, deepseek, kimi and 6, glm, command-r7b when the input's length is even: the same lists after
 * other markers; 6 is qwen3-coder when the length is 3 modulo 4 (seed-oss when 31 modulo 32), minimax-m2 when it is 1 modulo
 * 8, gemma4 when it is 13 modulo 16; 4, phi4, is functionary when the length is 2 modulo 4; 7 is deepseek-v3.2 (DSML) when the length is 3 modulo 8,
 * deepseek-v4 when it is 7 modulo 8;
 * the XML-like formats read with
 * declared types for function f's keys s, b and z: a string, a boolean, a null),
 * tools (bit 3), reasoning
 * (bits 4 and 7: enum tool_reasoning, the markers; 3, thought, is Gemma 4's when the length is 1
 * modulo 3, Command R7B's when 2), think_open (bit 5), one call at most (bit 6);
 * the rest is the reply.
 * Corpus: tests/fuzz/corpus/tool_parse (replies in every format, cut, malformed). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "fuzz_util.h"
#include "tool_format.h"
#include "tool_parse_ref.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static int same(const char *a, size_t na, const char *b, size_t nb) { return na == nb && !memcmp(a, b, na); }

/* p (tool_parse) equals the reference's parse of the same text. */
static void check_ref(const struct tool_parsed *p, enum tool_format f, int tools, int reasoning, int think_open,
                      int max_calls, const char *text, size_t n, int final)
{
    struct tool_parsed r;
    CHECK(tool_parse_ref(f, tools, reasoning, think_open, max_calls, text, n, final, &r) == 0, "out of memory");
    CHECK(p->has_reasoning == r.has_reasoning && same(p->reasoning, p->reasoning_len, r.reasoning, r.reasoning_len) &&
          same(p->content, p->content_len, r.content, r.content_len) && p->n_calls == r.n_calls,
          "the parse differs from the reference's (cut %zu, final %d)", n, final);
    for (int k = 0; k < p->n_calls; k++)
        CHECK(!strcmp(p->calls[k].name, r.calls[k].name) && p->calls[k].complete == r.calls[k].complete &&
              same(p->calls[k].args, p->calls[k].args_len, r.calls[k].args, r.calls[k].args_len),
              "call %d differs from the reference's (cut %zu, final %d)", k, n, final);
    tool_parsed_free(&r);
}

static void check_parsed(const struct tool_parsed *p)
{
    CHECK(strlen(p->content) <= p->content_len && strlen(p->reasoning) <= p->reasoning_len, "lengths");
    for (int k = 0; k < p->n_calls; k++) CHECK(p->calls[k].name && p->calls[k].args, "call %d without name or arguments", k);
}

/* The prefixes a reply is cut at, as a stream's chunks end: every one up to CUTS_ALL bytes;
 * beyond, CUTS_MAX of them (each prefix parse costs O(n), so every cut of a 4 KB reply made the
 * target run at 250-320 inputs a second, and 96 cuts of the grown corpus's replies (175 bytes on
 * average) 500-700): at each marker-like byte (< > [ ] { } | and the byte after it, where formats
 * begin and end) spread over the reply, and the rest pseudo-random from a hash of the reply
 * (another reply, other cuts; over millions of mutations, every cut of a short reply's kind).
 * 24 since 2026-12-02 (from 96): issue 28 asks for 10 million executions. */
#define CUTS_ALL 24
#define CUTS_MAX 24
static int pick_cuts(const char *t, size_t n, size_t *cuts)
{
    int k = 0;
    if (n <= CUTS_ALL) {
        for (size_t c = 0; c <= n; c++) cuts[k++] = c;
        return k;
    }
    size_t marks = 0;
    for (size_t i = 0; i < n; i++) marks += strchr("<>[]{}|", t[i]) != NULL && t[i];
    const size_t every = marks / (CUTS_MAX / 4) + 1;
    size_t seen = 0;
    for (size_t i = 0; i < n && k + 2 <= CUTS_MAX / 2; i++)
        if (t[i] && strchr("<>[]{}|", t[i]) && seen++ % every == 0) cuts[k++] = i, cuts[k++] = i + 1;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)t[i]) * 1099511628211ull;
    cuts[k++] = 0;
    cuts[k++] = n;
    while (k < CUTS_MAX) {
        h = h * 6364136223846793005ull + 1442695040888963407ull;
        cuts[k++] = (size_t)(h >> 33) % (n + 1);
    }
    return k;
}

/* A harmony (or GLM) reply's partial parse is a prefix of the whole one: content, calls (names
 * equal, arguments a prefix, and equal once complete). */
static void harmony_prefix(const struct tool_parsed *part, const struct tool_parsed *whole)
{
    CHECK(part->content_len <= whole->content_len && !memcmp(part->content, whole->content, part->content_len),
          "harmony: the content of a prefix is not a prefix of the whole reply's");
    CHECK(part->n_calls <= whole->n_calls, "harmony: a prefix has more calls than the whole reply");
    for (int k = 0; k < part->n_calls; k++) {
        const struct tool_parsed_call *a = &part->calls[k], *b = &whole->calls[k];
        CHECK(!strcmp(a->name, b->name) && a->args_len <= b->args_len && !memcmp(a->args, b->args, a->args_len) &&
              (!a->complete || a->args_len == b->args_len), "harmony: call %d of a prefix differs from the whole reply's", k);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    enum tool_format f = (enum tool_format)(data[0] & 7); /* (5: harmony, 6: glm, 7: deepseek) */
    if (f == TOOL_FORMAT_MISTRAL && size % 2 == 0) f = TOOL_FORMAT_GRANITE; /* (a reply of odd length: mistral) */
    if (f == TOOL_FORMAT_MISTRAL && size % 4 == 1) f = TOOL_FORMAT_NEMOTRON;
    if (f == TOOL_FORMAT_DEEPSEEK && size % 2 == 0) f = TOOL_FORMAT_KIMI;   /* (likewise: deepseek) */
    if (f == TOOL_FORMAT_GLM && size % 2 == 0) f = TOOL_FORMAT_COMMAND_R7B; /* (likewise: glm) */
    if (f == TOOL_FORMAT_GLM && size % 4 == 3) f = size % 32 == 31 ? TOOL_FORMAT_SEED_OSS : TOOL_FORMAT_QWEN_XML;
    if (f == TOOL_FORMAT_GLM && size % 8 == 1) f = TOOL_FORMAT_MINIMAX;
    if (f == TOOL_FORMAT_GLM && size % 16 == 13) f = TOOL_FORMAT_GEMMA4;
    if (f == TOOL_FORMAT_PHI4 && size % 4 == 2) f = TOOL_FORMAT_FUNCTIONARY;
    if (f == TOOL_FORMAT_DEEPSEEK && size % 4 == 3) f = size % 8 == 7 ? TOOL_FORMAT_DSML_V4 : TOOL_FORMAT_DSML;
    static const char declared[] = "\x1e" "f\x1fs\x1fs\x1e" "f\x1f" "b\x1f" "b\x1e" "f\x1fz\x1fz\x1e";
    const char *types = tool_format_is_xml(f) ? declared : NULL;
    int tools = data[0] >> 3 & 1, think_open = data[0] >> 5 & 1;
    int reasoning = (data[0] >> 4 & 1) | (data[0] >> 6 & 2); /* enum tool_reasoning: off, <think>, [THINK], thought */
    if (reasoning == TOOL_REASONING_THOUGHT && size % 3) /* Gemma 4's thought channel, Command R7B's plan */
        reasoning = size % 3 == 1 ? TOOL_REASONING_GEMMA4 : TOOL_REASONING_R7B;
    int max_calls = data[0] >> 6 & 1;
    size_t n = size - 1;
    char *text = malloc(n ? n : 1); /* exactly the reply's bytes, so that ASan sees any overread */
    CHECK(text, "out of memory");
    memcpy(text, data + 1, n);
    struct tool_parsed whole;
    CHECK(tool_parse_typed(f, tools, reasoning, think_open, max_calls, types, text, n, 1, &whole) == 0, "out of memory");
    check_parsed(&whole);
    /* (harmony, the formats read whole (glm, functionary, ...) and the newer lists: no earlier
     * parser; their prefix property instead) */
    const int ref = f != TOOL_FORMAT_HARMONY && !tool_format_whole_calls(f) && f != TOOL_FORMAT_DEEPSEEK && f != TOOL_FORMAT_KIMI &&
                    f != TOOL_FORMAT_COMMAND_R7B && f != TOOL_FORMAT_NEMOTRON;
    if (ref) check_ref(&whole, f, tools, reasoning, think_open, max_calls, text, n, 1);
    size_t cuts[CUTS_ALL + 1 > CUTS_MAX ? CUTS_ALL + 1 : CUTS_MAX];
    const int n_cuts = pick_cuts(text, n, cuts);
    for (int c = 0; c < n_cuts; c++) {
        const size_t cut = cuts[c];
        struct tool_parsed part;
        CHECK(tool_parse_typed(f, tools, reasoning, think_open, max_calls, types, text, cut, 0, &part) == 0, "out of memory");
        check_parsed(&part);
        if (ref) check_ref(&part, f, tools, reasoning, think_open, max_calls, text, cut, 0);
        /* (a list format's call shows while its JSON comes, and goes when the JSON turns out
         * malformed, as Mistral's does under the reference: no prefix property for those) */
        else if (!tool_format_is_list(f)) harmony_prefix(&part, &whole);
        CHECK(part.reasoning_len <= whole.reasoning_len && !memcmp(part.reasoning, whole.reasoning, part.reasoning_len),
              "the reasoning of a prefix is not a prefix of the whole reply's");
        tool_parsed_free(&part);
    }
    tool_parsed_free(&whole);
    free(text);
    return 0;
}
