/* tests/test_constraint.c - the lazy constraint's watch for its trigger (engine/serving/constraint.c,
 * engine.h TRIGGER_*), on a vocabulary of hand-picked pieces and a regex grammar `\{x\}`: the
 * grammar is complete (grammar_end) after the token "x}" only when it was started right after
 * the marker with the `{` (so each case checks both when the trigger fires and what the grammar
 * was given). Cases: a marker split across tokens; a marker inside <think>...</think> (ignored)
 * and after it; an output that does not open <think> (armed at once, "<t" re-read as the
 * marker's start); a prompt-opened reasoning with no marker (the grammar starts after </think>);
 * an anchored marker (the reply's first `{`, read by the grammar) and one that comes too late;
 * the marker's and </think>'s own tokens (no bytes in the vocabulary) taken as their text.
 * An opening constraint (TRIGGER_MAY_REASON, no marker: the model may open <think> itself): the
 * grammar from the first token, or <think> in pieces or as one token, free reasoning (a `{x}`
 * inside it completes nothing), the grammar after </think>; a grammar that asks for <think> itself
 * keeps it; and its masks (constraint_fill_mask)
 * after each prefix, against the sets worked out by hand from the pieces. The same with the
 * [THINK] ... [/THINK] markers (TRIGGER_MARKERS_MISTRAL): <think> is then text. With part of the
 * closing marker written, a piece that would complete it with bytes the grammar refuses is masked.
 * Harmony's analysis (TRIGGER_MARKERS_HARMONY): closed by <|end|> or broken by a new message's
 * <|start|> / <|channel|>, which a marker-less grammar then reads; its mask likewise. Gemma 4's
 * markers (a kind past two bits), and the trigger's header read back. Triggers of two markers
 * (TRIGGER_MARKER_SEP), read by the grammar (TRIGGER_READS_MARKER) or not, anchored or not: either
 * one triggers, a refused start leaves the sample free with its matcher back at the start and
 * the rest of its token looked at; the bytes after a marker given as written when the grammar
 * takes them; anchored markers that open with whitespace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constraint.h"
#include "engine.h"
#include "grammar.h"
#include "request.h"

static const char *const PIECES[] = {
    "<tool", "_call", ">\n{", "<think>", "x <tool_call> y", "</think>", "<tool_call>", "<t", "ool_call>",
    "abc", "</thi", "nk>\n{", "  ", "{", "hi {", "x}", "", "", "<tool_call>!", "\n",
    "<", "th", "ink>", "ink>{x}", "", "{x", "[THINK]", "[/THINK]", "nk>!",
    "<|channel|>analysis<|message|>", "<|end|>", "<|start|>", "assistant<|channel|>final<|message|>", "<|channel|>",
    "final<|message|>", "<|", "start|>", "start|>!", "start|>assistant", "<|channel>thought\n", "<channel|>",
    "<f=", "<f", "{y", "<f=!<f=",
};
enum { T_TOOL, T_CALL, T_GT_BRACE, T_THINK, T_INSIDE, T_UNTHINK, T_MARK, T_LT_T, T_OOL_CALL,
       T_ABC, T_UNTHI, T_NK_BRACE, T_SPACES, T_BRACE, T_HI_BRACE, T_X_CLOSE, T_MARK_ID, T_UNTHINK_ID,
       T_MARK_BANG, T_NL, T_LT, T_TH, T_INK_GT, T_INK_GT_X, T_THINK_ID, T_BRACE_X, T_MTHINK, T_MUNTHINK, T_NK_BANG,
       T_H_OPEN, T_H_END, T_H_START, T_H_AFINAL, T_H_CH, T_H_FINAL, T_H_LTBAR, T_H_START_REST, T_H_START_BANG,
       T_H_START_A, T_G4_OPEN, T_G4_CLOSE, T_F_EQ, T_LT_F, T_BRACE_Y, T_F_TWICE, N_PIECES };

static int failures;

/* A fresh sample s of request r (zeroed by the caller) with the trigger spec (flags, marker). */
static void sample_init(struct request *r, struct seq *s, struct grammar *g, int flags, const char *marker)
{
    r->grammar = g;
    constraint_set_markers(r, marker, strlen(marker));
    r->trigger_flags = flags;
    r->p.constraint_trigger_len = strlen(marker) + (flags ? TRIGGER_HEADER_LEN : 0);
    r->marker_id[0] = T_MARK_ID; /* (the first marker's own token) */
    r->think_ids[0] = T_THINK_ID, r->think_ids[1] = T_UNTHINK_ID;
    for (int i = 0; i < 2; i++) {
        r->think[i] = engine_reasoning_marker(flags >> TRIGGER_MARKERS_SHIFT, i);
        r->think_len[i] = (int)strlen(r->think[i]);
    }
    s->req = r;
}

/* Runs tokens toks[0..n) through a fresh sample of a request with the trigger spec (flags,
 * marker) and reports whether the grammar ended (started at the right place) and was on. */
static void run(struct grammar *g, const char *what, int flags, const char *marker, const int *toks, int n,
                int want_on_before_last, int want_end)
{
    struct request r;
    struct seq s;
    memset(&r, 0, sizeof r), memset(&s, 0, sizeof s);
    sample_init(&r, &s, g, flags, marker);
    int on_before_last = 0;
    for (int i = 0; i < n; i++) {
        if (i == n - 1) on_before_last = s.lazy_on;
        if (constraint_take(&s, toks[i]) != STATUS_OK) printf("FAIL %s: constraint_take failed\n", what), failures++;
    }
    int ok = on_before_last == want_on_before_last && s.grammar_end == want_end;
    printf("%s %s (on before the last token %d, grammar complete %d)\n", ok ? "PASS" : "FAIL", what, on_before_last,
           s.grammar_end);
    failures += !ok;
    grammar_matcher_free(s.gm);
}

/* Takes toks[0..n) in an opening sample, then compares constraint_fill_mask with want[0..n_want)
 * (n_want -1: the output is free, no mask). */
static void opening_mask(struct grammar *g, const char *what, int flags, const int *toks, int n, const int *want,
                         int n_want)
{
    struct request r;
    struct seq s;
    memset(&r, 0, sizeof r), memset(&s, 0, sizeof s);
    sample_init(&r, &s, g, TRIGGER_MAY_REASON | flags, "");
    for (int i = 0; i < n; i++) constraint_take(&s, toks[i]);
    uint32_t mask[2] = {0, 0}; /* (N_PIECES + 1 <= 64) */
    const int got = constraint_fill_mask(&s, mask);
    int ok = got == (n_want < 0 ? 0 : 1);
    for (int t = 0; t <= N_PIECES && n_want >= 0; t++) {
        int wanted = 0;
        for (int j = 0; j < n_want; j++) wanted |= want[j] == t;
        if (wanted != (int)(mask[t >> 5] >> (t & 31) & 1)) printf("  token %d (%s): wanted %d\n", t,
                                                                  t < N_PIECES ? PIECES[t] : "eos", wanted), ok = 0;
    }
    printf("%s %s\n", ok ? "PASS" : "FAIL", what);
    failures += !ok;
    grammar_matcher_free(s.gm);
}

int main(void)
{
    int lens[N_PIECES];
    for (int i = 0; i < N_PIECES; i++) lens[i] = (int)strlen(PIECES[i]);
    struct grammar_vocab *v = NULL;
    struct grammar *g = NULL;
    const int32_t eos = N_PIECES;
    if (grammar_vocab_new_bytes((const char *const *)PIECES, lens, N_PIECES, N_PIECES + 1, &eos, 1, &v) != STATUS_OK ||
        grammar_compile(v, GRAMMAR_REGEX, "\\{x\\}", 5, &g) != STATUS_OK) {
        printf("FAIL: the test grammar does not compile: %s\n", status_message());
        return 1;
    }
    const char *tc = "<tool_call>";
    run(g, "a marker split across tokens", 0, tc, (int[]){T_ABC, T_TOOL, T_CALL, T_GT_BRACE, T_X_CLOSE}, 5, 1, 1);
    run(g, "no marker: free", 0, tc, (int[]){T_ABC, T_TOOL, T_X_CLOSE}, 3, 0, 0);
    run(g, "reasoning: a marker inside <think> triggers nothing", TRIGGER_MAY_REASON, tc,
        (int[]){T_NL, T_THINK, T_INSIDE, T_MARK, T_NL, T_BRACE, T_X_CLOSE}, 7, 0, 0);
    run(g, "reasoning: the marker after </think> triggers", TRIGGER_MAY_REASON, tc,
        (int[]){T_THINK, T_INSIDE, T_UNTHINK, T_ABC, T_MARK, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g, "reasoning: </think>'s own token (no bytes) closes it", TRIGGER_MAY_REASON, tc,
        (int[]){T_THINK, T_INSIDE, T_UNTHINK_ID, T_MARK, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g, "reasoning: an output without <think> is armed at once (<t re-read)", TRIGGER_MAY_REASON, tc,
        (int[]){T_LT_T, T_OOL_CALL, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g, "in reasoning: a marker before </think> triggers nothing", TRIGGER_IN_REASONING, tc,
        (int[]){T_MARK, T_BRACE, T_X_CLOSE}, 3, 0, 0);
    run(g, "in reasoning, no marker: the grammar starts after </think>", TRIGGER_IN_REASONING, "",
        (int[]){T_ABC, T_INSIDE, T_UNTHI, T_NK_BRACE, T_X_CLOSE}, 5, 1, 1);
    run(g, "in reasoning, no marker: nothing before </think>", TRIGGER_IN_REASONING, "",
        (int[]){T_ABC, T_BRACE, T_X_CLOSE}, 3, 0, 0);
    run(g, "anchored: the reply's first { is the call's", TRIGGER_ANCHORED, "{",
        (int[]){T_SPACES, T_BRACE, T_X_CLOSE}, 3, 1, 1);
    run(g, "anchored: a { after text triggers nothing", TRIGGER_ANCHORED, "{", (int[]){T_HI_BRACE, T_X_CLOSE}, 2, 0, 0);
    run(g, "anchored after reasoning", TRIGGER_ANCHORED | TRIGGER_MAY_REASON, "{",
        (int[]){T_THINK, T_HI_BRACE, T_UNTHINK, T_NL, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g, "the marker's own token (no bytes) triggers", 0, tc, (int[]){T_ABC, T_MARK_ID, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g, "bytes the grammar refuses after the marker leave it free", 0, tc,
        (int[]){T_MARK_BANG, T_BRACE, T_X_CLOSE}, 3, 0, 0);
    const int op = TRIGGER_MAY_REASON;
    run(g, "opening: no <think>: the grammar from the first token", op, "", (int[]){T_BRACE, T_X_CLOSE}, 2, 1, 1);
    run(g, "opening: <think> in pieces, free reasoning, the grammar after </think>", op, "",
        (int[]){T_LT, T_TH, T_INK_GT, T_ABC, T_BRACE, T_X_CLOSE, T_UNTHINK, T_NL, T_BRACE, T_X_CLOSE}, 10, 1, 1);
    run(g, "opening: <think>'s own token, a {x} inside the reasoning completes nothing", op, "",
        (int[]){T_THINK_ID, T_BRACE, T_X_CLOSE}, 3, 0, 0);
    run(g, "opening: the token completing <think> carries reasoning", op, "",
        (int[]){T_LT, T_TH, T_INK_GT_X, T_UNTHI, T_NK_BRACE, T_X_CLOSE}, 6, 1, 1);
    struct grammar *g2 = NULL;
    if (grammar_compile(v, GRAMMAR_REGEX, "<think>\\{x\\}", 12, &g2) != STATUS_OK) {
        printf("FAIL: the second test grammar does not compile: %s\n", status_message());
        return 1;
    }
    run(g2, "opening: a grammar that asks for <think> itself keeps it (no reasoning)", op, "",
        (int[]){T_LT, T_TH, T_INK_GT, T_BRACE, T_X_CLOSE}, 5, 1, 1);
    grammar_unref(g2);
    opening_mask(g, "opening mask at the start: the grammar's { or a prefix of <think>", 0, NULL, 0,
                 (int[]){T_BRACE, T_BRACE_X, T_THINK, T_LT_T, T_LT, T_THINK_ID}, 6);
    opening_mask(g, "opening mask after <: only <think> goes on", 0, (int[]){T_LT}, 1, (int[]){T_TH}, 1);
    opening_mask(g, "opening mask after <th: ink> and ink>{x}", 0, (int[]){T_LT, T_TH}, 2, (int[]){T_INK_GT, T_INK_GT_X}, 2);
    opening_mask(g, "opening mask inside the reasoning: free", 0, (int[]){T_THINK}, 1, NULL, -1);
    /* With part of </think> written, a token that completes it must leave bytes the grammar
     * takes (closing_mask): "nk>!" is refused, "nk>\n{" and every other piece stay allowed. */
    int all_but_bang[N_PIECES + 1], n_abb = 0;
    for (int t = 0; t <= N_PIECES; t++)
        if (t != T_NK_BANG) all_but_bang[n_abb++] = t;
    opening_mask(g, "opening mask after </thi: a piece completing </think> with bytes the grammar refuses is masked", 0,
                 (int[]){T_THINK, T_ABC, T_UNTHI}, 3, all_but_bang, n_abb);
    opening_mask(g, "opening mask after </think>: the grammar alone", 0, (int[]){T_THINK, T_ABC, T_UNTHINK}, 3,
                 (int[]){T_BRACE, T_BRACE_X}, 2);
    opening_mask(g, "opening mask after {: the grammar alone", 0, (int[]){T_BRACE}, 1, (int[]){T_X_CLOSE}, 1);
    /* A grammar that writes the call's marker itself (a required tool call under a reasoning
     * template: http_tools.c gives the schema the marker as its prefix): think, then the marker
     * and the call, or the marker at once. */
    struct grammar *g3 = NULL;
    if (grammar_compile(v, GRAMMAR_REGEX, "<tool_call>\\n\\{x\\}", 18, &g3) != STATUS_OK) {
        printf("FAIL: the third test grammar does not compile: %s\n", status_message());
        return 1;
    }
    run(g3, "opening, the marker the grammar's: <think>, reasoning, </think>, the marker, the call", op, "",
        (int[]){T_THINK, T_ABC, T_UNTHINK, T_MARK, T_NL, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g3, "opening, the marker the grammar's: the call at once", op, "", (int[]){T_TOOL, T_CALL, T_GT_BRACE, T_X_CLOSE},
        4, 1, 1);
    opening_mask(g3, "opening mask, the marker the grammar's: a prefix of <think> or of the marker", 0, NULL, 0,
                 (int[]){T_TOOL, T_THINK, T_MARK, T_LT_T, T_LT, T_THINK_ID}, 6);
    opening_mask(g3, "opening mask after <t: the marker goes on (no piece goes on with <think>)", 0, (int[]){T_LT_T}, 1,
                 (int[]){T_OOL_CALL}, 1);
    opening_mask(g3, "opening mask after </think>: the marker", 0, (int[]){T_THINK, T_ABC, T_UNTHINK}, 3,
                 (int[]){T_TOOL, T_MARK, T_LT_T, T_LT}, 4);
    grammar_unref(g3);
    const int mm = TRIGGER_MARKERS_MISTRAL << TRIGGER_MARKERS_SHIFT;
    run(g, "[THINK] markers: a marker inside [THINK] triggers nothing, after [/THINK] it does",
        TRIGGER_MAY_REASON | mm, tc, (int[]){T_MTHINK, T_MARK, T_MUNTHINK, T_MARK, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g, "[THINK] markers: <think> is not reasoning (the marker in it triggers)", TRIGGER_MAY_REASON | mm, tc,
        (int[]){T_THINK, T_MARK, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g, "[THINK] markers, in reasoning, no marker: the grammar after [/THINK]", TRIGGER_IN_REASONING | mm, "",
        (int[]){T_ABC, T_UNTHINK, T_MUNTHINK, T_BRACE, T_X_CLOSE}, 5, 1, 1);
    run(g, "[THINK] markers, opening: [THINK], free reasoning, the grammar after [/THINK]", op | mm, "",
        (int[]){T_MTHINK, T_BRACE, T_X_CLOSE, T_MUNTHINK, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    opening_mask(g, "[THINK] markers, opening mask: the grammar's { or [THINK] (not <think>)", mm, NULL, 0,
                 (int[]){T_BRACE, T_BRACE_X, T_MTHINK, T_THINK_ID}, 4);
    /* Harmony's analysis (TRIGGER_MARKERS_HARMONY) ends at <|end|>, or where a new message begins
     * (<|start|>, <|channel|>: the reply parser's rule): a marker-less grammar then reads that
     * marker itself (its answer may start with the final message's header), a marker trigger is
     * looked for after it. */
    struct grammar *g4 = NULL;
    const char *ans = "(<\\|start\\|>assistant<\\|channel\\|>final<\\|message\\|>|<\\|channel\\|>final<\\|message\\|>)?\\{x\\}";
    if (grammar_compile(v, GRAMMAR_REGEX, ans, strlen(ans), &g4) != STATUS_OK) {
        printf("FAIL: the harmony test grammar does not compile: %s\n", status_message());
        return 1;
    }
    const int hm = TRIGGER_MARKERS_HARMONY << TRIGGER_MARKERS_SHIFT;
    run(g4, "harmony: the analysis, <|end|>, the answer", op | hm, "",
        (int[]){T_H_OPEN, T_ABC, T_BRACE, T_X_CLOSE, T_H_END, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g4, "harmony: the analysis, <|end|>, the final header, the answer", op | hm, "",
        (int[]){T_H_OPEN, T_ABC, T_H_END, T_H_START, T_H_AFINAL, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g4, "harmony: the analysis broken by <|start|>: the grammar reads it (the final header, the answer)", op | hm, "",
        (int[]){T_H_OPEN, T_ABC, T_H_START, T_H_AFINAL, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g4, "harmony: the analysis broken by <|channel|> in pieces", op | hm, "",
        (int[]){T_H_OPEN, T_ABC, T_H_LTBAR, T_CALL, T_H_CH, T_H_FINAL, T_BRACE, T_X_CLOSE}, 8, 1, 1);
    run(g4, "harmony, in reasoning, no marker: <|start|> in pieces breaks it", TRIGGER_IN_REASONING | hm, "",
        (int[]){T_ABC, T_H_LTBAR, T_H_START_A, T_H_CH, T_H_FINAL, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g, "harmony: a marker trigger is looked for after a break", TRIGGER_MAY_REASON | hm, tc,
        (int[]){T_H_OPEN, T_ABC, T_H_START, T_ABC, T_MARK, T_BRACE, T_X_CLOSE}, 7, 1, 1);
    run(g, "harmony: a marker inside the analysis triggers nothing", TRIGGER_MAY_REASON | hm, tc,
        (int[]){T_H_OPEN, T_ABC, T_MARK, T_BRACE, T_X_CLOSE}, 5, 0, 0);
    /* With <| written, a piece that completes <|start|> or <|channel|> must leave bytes the grammar
     * takes after it: "start|>!" is masked, and so is a second analysis's opening (its own token
     * too: the grammar takes <|channel|>, not "analysis" after it). */
    int all_but_start_bang[N_PIECES + 1], n_asb = 0;
    for (int t = 0; t <= N_PIECES; t++)
        if (t != T_H_START_BANG && t != T_H_OPEN && t != T_THINK_ID) all_but_start_bang[n_asb++] = t;
    opening_mask(g4, "harmony mask after <|: a piece completing <|start|> with bytes the grammar refuses is masked", hm,
                 (int[]){T_H_OPEN, T_ABC, T_H_LTBAR}, 3, all_but_start_bang, n_asb);
    grammar_unref(g4);
    /* Gemma 4's markers, a kind past the two bits the flags once had (the header's second byte). */
    const int gm4 = TRIGGER_MARKERS_GEMMA4 << TRIGGER_MARKERS_SHIFT;
    run(g, "Gemma 4 markers: a marker in the thought channel triggers nothing, after it it does", op | gm4, tc,
        (int[]){T_G4_OPEN, T_MARK, T_G4_CLOSE, T_MARK, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g, "Gemma 4 markers, in reasoning, no marker: the grammar after <channel|>", TRIGGER_IN_REASONING | gm4, "",
        (int[]){T_ABC, T_G4_CLOSE, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    /* Several markers (TRIGGER_MARKER_SEP between them): the first one completed is the trigger.
     * Read by the grammar (TRIGGER_READS_MARKER: Qwen3-Coder's <tool_call> and bare <function=),
     * the grammar (<tool_call>|<f=)\{x\} completes only when fed the marker that came. */
    struct grammar *g5 = NULL, *g6 = NULL;
    const char *two = "(<tool_call>|<f=)\\{x\\}", *either = "\\{x\\}|<f=\\{x\\}";
    if (grammar_compile(v, GRAMMAR_REGEX, two, strlen(two), &g5) != STATUS_OK ||
        grammar_compile(v, GRAMMAR_REGEX, either, strlen(either), &g6) != STATUS_OK) {
        printf("FAIL: the marker test grammars do not compile: %s\n", status_message());
        return 1;
    }
    const char *tc_f = "<tool_call>\x1f<f=";
    const int rm = TRIGGER_READS_MARKER;
    run(g5, "two markers, read: the second, after text", rm, tc_f, (int[]){T_ABC, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g5, "two markers, read: the first, split across tokens", rm, tc_f,
        (int[]){T_ABC, T_TOOL, T_CALL, T_GT_BRACE, T_X_CLOSE}, 5, 1, 1);
    run(g5, "two markers, read: the second after a false start (<f then <f=)", rm, tc_f,
        (int[]){T_LT_F, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g5, "two markers, read: the first's own token", rm, tc_f, (int[]){T_MARK_ID, T_BRACE, T_X_CLOSE}, 3, 1, 1);
    run(g5, "two markers, read: bytes refused after one leave it free, the next one triggers (the grammar rolled back)",
        rm, tc_f, (int[]){T_MARK_BANG, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g5, "two markers, read, after reasoning only", rm | TRIGGER_MAY_REASON, tc_f,
        (int[]){T_THINK, T_F_EQ, T_UNTHINK, T_F_EQ, T_BRACE, T_X_CLOSE}, 6, 1, 1);
    run(g, "two markers, not read: the grammar starts after the second", 0, tc_f,
        (int[]){T_ABC, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    /* A marker completed inside what was read as the start of <think> (<t of <think>, then {: "<t"
     * the first marker), the grammar taking "<t{" but not the token's rest: the matcher goes back to
     * its start, and the second marker then starts it cleanly. */
    struct grammar *g7 = NULL;
    const char *t_or_f = "(<t|<f=)\\{x\\}";
    if (grammar_compile(v, GRAMMAR_REGEX, t_or_f, strlen(t_or_f), &g7) != STATUS_OK) {
        printf("FAIL: the <t grammar does not compile: %s\n", status_message());
        return 1;
    }
    run(g7, "two markers, read, may reason: one inside a false <think>, refused after it: free", rm | TRIGGER_MAY_REASON,
        "<t\x1f<f=", (int[]){T_LT_T, T_BRACE_Y, T_ABC}, 3, 0, 0);
    run(g7, "two markers, read, may reason: one inside a false <think>, refused after it, then the other", rm | TRIGGER_MAY_REASON,
        "<t\x1f<f=", (int[]){T_LT_T, T_BRACE_Y, T_F_EQ, T_BRACE, T_X_CLOSE}, 5, 1, 1);
    grammar_unref(g7);
    run(g5, "two markers, read: refused after the first, the second in the same token", rm, tc_f,
        (int[]){T_ABC, T_F_TWICE, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    /* The bytes after a marker as written, when the grammar reads them (Qwen3-Coder's "\n" after
     * <tool_call>); without their leading whitespace only when it refuses that (the cases above). */
    struct grammar *g8 = NULL, *g9 = NULL;
    const char *nl = "<tool_call>\\n\\{x\\}|<f=\\{x\\}", *ws_first = "\\n?\\{x\\}|<f=\\{x\\}";
    if (grammar_compile(v, GRAMMAR_REGEX, nl, strlen(nl), &g8) != STATUS_OK ||
        grammar_compile(v, GRAMMAR_REGEX, ws_first, strlen(ws_first), &g9) != STATUS_OK) {
        printf("FAIL: the whitespace test grammars do not compile: %s\n", status_message());
        return 1;
    }
    run(g8, "two markers, read: the newline after the marker, in its token, is the grammar's", rm, tc_f,
        (int[]){T_TOOL, T_CALL, T_GT_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g9, "anchored markers, one opening with a newline: it", TRIGGER_ANCHORED, "\n{\x1f<f=",
        (int[]){T_NL, T_BRACE, T_X_CLOSE}, 3, 1, 1);
    run(g9, "anchored markers, one opening with a newline: spaces, then the other", TRIGGER_ANCHORED, "\n{\x1f<f=",
        (int[]){T_SPACES, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    grammar_unref(g8);
    grammar_unref(g9);
    /* No marker: a start refused after </think> leaves the sample free for good (until 2026-12-02
     * an empty marker "completed" at every later byte, so the grammar could start mid-text). */
    run(g, "in reasoning, no marker: refused after </think>, free for good", TRIGGER_IN_REASONING, "",
        (int[]){T_ABC, T_UNTHI, T_NK_BANG, T_HI_BRACE, T_X_CLOSE}, 5, 0, 0);
    run(g6, "two markers, anchored: the reply opens with the second", TRIGGER_ANCHORED, "{\x1f<f=",
        (int[]){T_SPACES, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 1, 1);
    run(g6, "two markers, anchored: the reply opens with the first", TRIGGER_ANCHORED, "{\x1f<f=",
        (int[]){T_SPACES, T_BRACE, T_X_CLOSE}, 3, 1, 1);
    run(g6, "two markers, anchored: text first triggers nothing", TRIGGER_ANCHORED, "{\x1f<f=",
        (int[]){T_HI_BRACE, T_F_EQ, T_BRACE, T_X_CLOSE}, 4, 0, 0);
    run(g6, "two markers, anchored: a start of one that turns into neither", TRIGGER_ANCHORED, "{\x1f<f=",
        (int[]){T_LT_T, T_BRACE, T_X_CLOSE}, 3, 0, 0);
    grammar_unref(g5);
    grammar_unref(g6);
    /* The header: every flag set and kind read back as written; old and malformed ones refused. */
    int hdr_ok = 1;
    for (int kind = TRIGGER_MARKERS_THINK; kind <= TRIGGER_MARKERS_SEED; kind++)
        for (int fl = 1; fl < 16; fl++) {
            char buf[8];
            const int flags = fl | kind << TRIGGER_MARKERS_SHIFT, h = engine_trigger_header(flags, buf);
            memcpy(buf + h, "<m>", 4);
            int back = -1;
            hdr_ok &= h == TRIGGER_HEADER_LEN && engine_trigger_read(buf, (size_t)h + 3, &back) == h && back == flags;
            hdr_ok &= (unsigned char)buf[0] == (fl & TRIGGER_READS_MARKER ? 16 + fl : 8 + fl); /* (the old form without it) */
        }
    int none = -1;
    hdr_ok &= engine_trigger_header(0, (char[2]){0, 0}) == 0 && engine_trigger_read("<m>", 3, &none) == 0 && none == 0;
    hdr_ok &= engine_trigger_read("\x01<m>", 4, &none) < 0 && engine_trigger_read("\x09", 1, &none) < 0 &&
              engine_trigger_read("\x09\x1f", 2, &none) < 0 && engine_trigger_read("\x10\x01", 2, &none) < 0;
    printf("%s the trigger header: flags and kinds read back, old and malformed headers refused\n", hdr_ok ? "PASS" : "FAIL");
    failures += !hdr_ok;
    grammar_unref(g);
    grammar_vocab_free(v);
    printf("%s\n", failures ? "FAILED" : "all passed");
    return failures != 0;
}
