/* engine/serving/constraint.c - a sample's constraint as tokens are taken (constraint.h).
 * Tests: tests/server/test_tools_lazy.py, tests/server/test_structured.py. */
#include "constraint.h"

#include <limits.h>
#include <string.h>

#include "grammar.h"

static const char *const MARKERS[][2] = {
    [TRIGGER_MARKERS_THINK] = {"<think>", "</think>"},
    [TRIGGER_MARKERS_MISTRAL] = {"[THINK]", "[/THINK]"},
    [TRIGGER_MARKERS_THOUGHT] = {"<|begin_of_thought|>", "<|end_of_thought|>"},
    [TRIGGER_MARKERS_HARMONY] = {"<|channel|>analysis<|message|>", "<|end|>"},
    [TRIGGER_MARKERS_GEMMA4] = {"<|channel>thought\n", "<channel|>"},
    [TRIGGER_MARKERS_R7B] = {"<|START_THINKING|>", "<|END_THINKING|>"},
    [TRIGGER_MARKERS_SEED] = {"<seed:think>", "</seed:think>"},
};

int engine_trigger_header(int flags, char out[TRIGGER_HEADER_LEN])
{
    if (!flags) return 0;
    out[0] = (char)(flags & TRIGGER_READS_MARKER ? 16 | (flags & 15) : 8 | (flags & 7));
    out[1] = (char)(1 + (flags >> TRIGGER_MARKERS_SHIFT));
    return TRIGGER_HEADER_LEN;
}

int engine_trigger_read(const char *src, size_t n, int *flags)
{
    *flags = 0;
    if (!n || (unsigned char)src[0] >= 32) return 0;
    const unsigned char b0 = (unsigned char)src[0], b1 = n >= 2 ? (unsigned char)src[1] : 0;
    /* (8..15: three flag bits; 24..31: four, TRIGGER_READS_MARKER set) */
    if (n < TRIGGER_HEADER_LEN || b0 < 8 || (b0 > 15 && b0 < 24) || b1 < 1 || b1 >= 32 || !engine_reasoning_marker(b1 - 1, 0))
        return -1;
    *flags = (b0 & (b0 >= 24 ? 15 : 7)) | (b1 - 1) << TRIGGER_MARKERS_SHIFT;
    return TRIGGER_HEADER_LEN;
}

/* Harmony's analysis body also ends where a new message begins (the reply parser's rule,
 * server/tool_harmony.c: gpt-oss-20b sometimes leaves out <|end|>), so the watch ends its
 * reasoning there too: a marker-less grammar (response_format) then reads the marker itself and
 * what follows (its schema lets the final message's header come first: server/generation.c
 * harmony_answer_schema), a marker trigger is looked for after it. */
static const char *const HARMONY_BREAKS[2] = {"<|start|>", "<|channel|>"};
static const int HARMONY_BREAK_LEN[2] = {sizeof "<|start|>" - 1, sizeof "<|channel|>" - 1};

static int is_harmony(const struct request *r)
{
    return r->trigger_flags >> TRIGGER_MARKERS_SHIFT == TRIGGER_MARKERS_HARMONY;
}

/* (Below, <think> and </think> stand for the request's markers, r->think: set from its trigger's
 * flags by conductor_lazy_setup.) */
const char *engine_reasoning_marker(int kind, int close)
{
    return kind >= 0 && kind < (int)(sizeof MARKERS / sizeof *MARKERS) ? MARKERS[kind][close != 0] : NULL;
}

/* Where a lazy sample's watch is, before its trigger (seq.lazy_phase; 0 until its first byte).
 * An opening constraint (TRIGGER_MAY_REASON, no marker) starts in LAZY_OPEN: its output so far
 * (lazy_match bytes) is a proper prefix of <think> that its grammar (s->gm) also took; in
 * LAZY_OPEN_THINK the grammar refused those bytes and only <think> may follow. */
enum { LAZY_BEGIN, LAZY_DETECT, LAZY_REASONING, LAZY_ARMED, LAZY_DEAD, LAZY_OPEN, LAZY_OPEN_THINK };

static int is_ws(char b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

/* The bytes of the marker t matched after byte b, k of them matched before (the longest prefix of
 * t that the output now ends with). */
static int trigger_next(const char *t, int k, char b)
{
    for (int m = k + 1; m > 0; m--) /* try the longest first: t[0..m) == t[k-m+1..k) + b */
        if (t[m - 1] == b && !memcmp(t, t + k - m + 1, (size_t)m - 1)) return m;
    return 0;
}

/* The sample's matcher, started at the grammar's beginning when it has none. Errors as
 * grammar_matcher_new (STATUS_INVALID_ARGUMENT: the grammar too ambiguous to start). */
static enum status matcher_start(struct seq *s)
{
    return s->gm ? STATUS_OK : grammar_matcher_new(s->req->grammar, &s->gm);
}

/* A start the grammar refused (s stays free): its matcher back at the grammar's beginning, for
 * the next marker (a failed accept changes nothing, but what it took before the refusal stays). */
static void start_refused(struct seq *s)
{
    s->lazy_on = 0;
    grammar_matcher_rollback(s->gm, INT_MAX);
}

/* Feeds rest[0..n) (the output after a marker) to the matcher as written, or, when the grammar
 * refuses that, without its leading whitespace (a JSON call after its marker's newline): 1 when
 * either was taken (one step), 2 when there was nothing to take (empty, or whitespace the grammar
 * refuses), 0 when refused. Until 2026-12-02 the whitespace was always dropped, which refused a
 * grammar that reads it (Qwen3-Coder's block: "\n<function=" after <tool_call>) when the token
 * that completed the marker carried it. */
static int accept_rest(struct grammar_matcher *gm, const char *rest, size_t n)
{
    if (!n) return 2;
    if (grammar_matcher_accept_bytes(gm, rest, n) == STATUS_OK) return 1;
    if (grammar_matcher_overflowed(gm)) return 0;
    size_t k = 0;
    while (k < n && is_ws(rest[k])) k++;
    return !k ? 0 : k == n ? 2 : grammar_matcher_accept_bytes(gm, rest + k, n - k) == STATUS_OK;
}

/* The watch armed afresh: no byte of any marker matched. */
static void arm(struct seq *s)
{
    s->lazy_phase = LAZY_ARMED, s->lazy_match = 0;
    memset(s->lazy_mk, 0, sizeof s->lazy_mk);
}

/* Marker k is complete and rest[0..n) of the output follows it: the grammar starts there
 * (accept_rest: leading whitespace skipped where the grammar refuses it; an anchored marker, or
 * any under TRIGGER_READS_MARKER, is the call's start and read first). Bytes the grammar cannot
 * start with leave the sample free (the output already holds them; docs/tools.md). */
static enum status lazy_start(struct seq *s, int k, const char *rest, size_t n)
{
    const struct request *r = s->req;
    arm(s); /* (when it stays free, the next marker is looked for) */
    enum status st = matcher_start(s);
    if (st != STATUS_OK) return st;
    int ok = 1;
    if (r->trigger_flags & (TRIGGER_ANCHORED | TRIGGER_READS_MARKER)) {
        ok = grammar_matcher_accept_bytes(s->gm, r->trigger + r->marker_off[k], (size_t)r->marker_len[k]) == STATUS_OK;
        if (r->trigger_flags & TRIGGER_ANCHORED)
            s->lazy_phase = LAZY_DEAD; /* (an anchored marker that the grammar refuses never comes again) */
    }
    s->lazy_on = ok && accept_rest(s->gm, rest, n) != 0;
    if (grammar_matcher_overflowed(s->gm)) return STATUS_INVALID_ARGUMENT; /* (its message set) */
    if (!s->lazy_on) start_refused(s);
    return STATUS_OK;
}

/* Harmony's analysis broken by brk (HARMONY_BREAKS), rest[0..n) of the output after it: a
 * marker-less grammar starts with brk itself, then rest (no whitespace skipped); left free when
 * it refuses them. */
static enum status lazy_start_at_break(struct seq *s, const char *brk, const char *rest, size_t n)
{
    arm(s);
    enum status st = matcher_start(s);
    if (st != STATUS_OK) return st;
    s->lazy_on = grammar_matcher_accept_bytes(s->gm, brk, strlen(brk)) == STATUS_OK &&
                 (!n || grammar_matcher_accept_bytes(s->gm, rest, n) == STATUS_OK);
    if (grammar_matcher_overflowed(s->gm)) return STATUS_INVALID_ARGUMENT; /* (its message set) */
    if (!s->lazy_on) start_refused(s);
    return STATUS_OK;
}

/* Byte b of the output, in the armed phase: 1 + the marker it completes (the first of the
 * trigger's, when it completes several), or 0. Anchored markers are the reply's first bytes
 * (whitespace before them skipped): a byte that continues none of them ends the watch. */
static int armed_byte(const struct request *r, struct seq *s, char b)
{
    const int anchored = r->trigger_flags & TRIGGER_ANCHORED;
    int begun = 0, live = 0, opens = 0;
    for (int k = 0; k < r->n_markers && anchored; k++)
        begun |= s->lazy_mk[k] != 0, opens |= r->trigger[r->marker_off[k]] == b;
    const int skip = anchored && !begun && is_ws(b); /* (whitespace before the reply's first bytes) */
    if (skip && !opens) return 0;
    /* (no marker at all, after reasoning whose grammar refused what followed it: free for good) */
    for (int k = 0; k < r->n_markers; k++) {
        const char *m = r->trigger + r->marker_off[k];
        if (!anchored) s->lazy_mk[k] = trigger_next(m, s->lazy_mk[k], b);
        else if (s->lazy_mk[k] >= 0) s->lazy_mk[k] = b == m[s->lazy_mk[k]] ? s->lazy_mk[k] + 1 : skip ? 0 : -1;
        live |= s->lazy_mk[k] >= 0;
        if (s->lazy_mk[k] == r->marker_len[k]) return k + 1;
    }
    if (!live) s->lazy_phase = LAZY_DEAD;
    return 0;
}

/* Feeds byte b (of bytes p[0..n), b == p[0]) to a lazy sample not yet on; returns how many of the
 * bytes after b the grammar was started with (then the sample's trigger is complete), or -1. */
static long lazy_byte(struct seq *s, const char *p, size_t n, enum status *st)
{
    const struct request *r = s->req;
    const char b = p[0];
    switch (s->lazy_phase) {
    case LAZY_DETECT: /* is the output's first (non-whitespace) text <think>? */
        if (!s->lazy_match && is_ws(b)) return -1;
        if (b == r->think[0][s->lazy_match]) {
            if (++s->lazy_match == r->think_len[0]) s->lazy_phase = LAZY_REASONING, s->lazy_match = 0;
            return -1;
        }
        /* Not reasoning: the bytes read since the whitespace are the reply's, b after them. */
        char again[32]; /* (the longest opening marker, and b) */
        int k = s->lazy_match, mk;
        memcpy(again, r->think[0], (size_t)k);
        again[k] = b;
        arm(s);
        for (int i = 0; i <= k; i++)
            if (s->lazy_phase == LAZY_ARMED && (mk = armed_byte(r, s, again[i]))) {
                /* (a marker within "<thin" + b: the grammar starts with the rest of them, then p's) */
                if ((*st = lazy_start(s, mk - 1, again + i + 1, (size_t)(k - i))) != STATUS_OK || !s->lazy_on) return 0;
                if (grammar_matcher_accept_bytes(s->gm, p + 1, n - 1) == STATUS_OK) return (long)n - 1;
                if (grammar_matcher_overflowed(s->gm)) *st = STATUS_INVALID_ARGUMENT;
                else start_refused(s);
                return 0;
            }
        return -1;
    case LAZY_REASONING: {
        s->lazy_match = trigger_next(r->think[1], s->lazy_match, b);
        const char *brk = NULL;
        for (int i = 0; i < 2 && is_harmony(r); i++) {
            s->lazy_brk[i] = trigger_next(HARMONY_BREAKS[i], s->lazy_brk[i], b);
            if (s->lazy_brk[i] == HARMONY_BREAK_LEN[i]) brk = HARMONY_BREAKS[i];
        }
        if (s->lazy_match < r->think_len[1] && !brk) return -1;
        arm(s);
        s->lazy_brk[0] = s->lazy_brk[1] = 0;
        if (r->n_markers) return -1;
        /* no marker: the grammar starts after </think>, or with harmony's break */
        *st = brk ? lazy_start_at_break(s, brk, p + 1, n - 1) : lazy_start(s, 0, p + 1, n - 1);
        return (long)n - 1;
    }
    case LAZY_ARMED: {
        const int mk = armed_byte(r, s, b);
        if (!mk) return -1;
        *st = lazy_start(s, mk - 1, p + 1, n - 1);
        /* (refused and still armed: the token's next bytes are looked at for the next marker) */
        return *st != STATUS_OK || s->lazy_on || s->lazy_phase != LAZY_ARMED ? (long)n - 1 : -1;
    }
    default:
        return -1;
    }
}

/* The bytes token tok adds to the output (the marker's and <think>'s own tokens: their text). */
static const char *token_text(const struct request *r, int32_t tok, int *len)
{
    for (int k = 0; k < r->n_markers; k++)
        if (tok == r->marker_id[k]) return *len = r->marker_len[k], r->trigger + r->marker_off[k];
    for (int i = 0; i < 2; i++)
        if (tok == r->think_ids[i]) return *len = r->think_len[i], r->think[i];
    return grammar_vocab_token(grammar_vocab_of(r->grammar), tok, len);
}

/* An opening constraint: a whole-output constraint that lets the model open <think> itself. */
static int is_opening(const struct request *r)
{
    return r->n_markers == 0 && (r->trigger_flags & TRIGGER_MAY_REASON);
}

/* Whether the bytes b[0..len) continue an output of k bytes that is a prefix of <think> and
 * keep it one (or complete it, anything may follow). */
static int continues_think(const struct request *r, int k, const char *b, int len)
{
    const int left = r->think_len[0] - k, m = len < left ? len : left;
    return len > 0 && !memcmp(b, r->think[0] + k, (size_t)m);
}

/* An opening constraint's state (constraint_fill_mask): 0 when s is not (or no longer) in its
 * opening; 1 when its output so far (a proper prefix of <think>, maybe empty) is also a prefix of
 * the grammar's; 2 when only <think> may follow. */
static int opening_state(const struct seq *s)
{
    const struct request *r = s->req;
    if (!r->p.constraint_trigger_len || s->lazy_on || !is_opening(r)) return 0;
    if (s->lazy_phase == LAZY_BEGIN || s->lazy_phase == LAZY_OPEN) return 1;
    return s->lazy_phase == LAZY_OPEN_THINK ? 2 : 0;
}

/* Sets in mask[0..n_words) the bits of the tokens whose text keeps s's output (in its opening) a
 * prefix of <think> or completes it (anything may follow in the same token); <think>'s own token
 * counts as its text. One pass over the vocabulary: only the opening's steps pay it. */
static void think_mask(const struct seq *s, uint32_t *mask, int n_words)
{
    const struct request *r = s->req;
    for (int32_t i = 0; i < n_words * 32; i++) {
        int len = 0;
        const char *b = token_text(r, i, &len);
        if (b && continues_think(r, s->lazy_match, b, len)) mask[i >> 5] |= 1u << (i & 31);
    }
}

/* Token tok (bytes b[0..len)) taken by an opening constraint (LAZY_OPEN or LAZY_OPEN_THINK):
 * <think> completed goes to reasoning (the grammar starts afresh after </think>), a proper prefix
 * of it waits, anything else is the constrained reply from the output's first byte. A grammar
 * that accepts <think> itself (a regex that asks for it) keeps it: the output is the grammar's. */
static enum status opening_take(struct seq *s, int32_t tok, const char *b, int len)
{
    const int k = s->lazy_match, open_len = s->req->think_len[0];
    const int think = continues_think(s->req, k, b, len);
    const int gram = s->lazy_phase == LAZY_OPEN && s->gm && grammar_matcher_accept(s->gm, tok) == STATUS_OK;
    if (think && k + len >= open_len && !gram) { /* <think> is complete: the rest of the token is reasoning */
        grammar_matcher_free(s->gm);
        s->gm = NULL;
        s->lazy_phase = LAZY_REASONING, s->lazy_match = 0;
        enum status st = STATUS_OK;
        for (int i = open_len - k; i < len && s->lazy_phase != LAZY_DEAD; i++)
            if (lazy_byte(s, b + i, (size_t)(len - i), &st) >= 0) return st;
        return STATUS_OK;
    }
    if (think && k + len < open_len) { /* a proper prefix of <think>: both may go on, or only <think> */
        s->lazy_match = k + len;
        if (!gram) {
            grammar_matcher_free(s->gm);
            s->gm = NULL;
            s->lazy_phase = LAZY_OPEN_THINK;
        }
        return STATUS_OK;
    }
    /* Not reasoning (or a grammar that writes <think> itself: it keeps it): the constraint has
     * held from the first token. */
    s->lazy_on = 1;
    if (gram) s->grammar_end = grammar_matcher_is_done(s->gm);
    return STATUS_OK;
}

/* In the reasoning of a sample whose grammar starts right after the closing marker, with a
 * proper prefix of that marker (or of harmony's breaks) written: a token that would complete the
 * marker is allowed only when the grammar takes the rest of its bytes (whitespace skipped), as
 * lazy_start will feed them (after a break, the break and the rest: lazy_start_at_break); every
 * other token stays free. Without it such a token left the sample free for good (a SmolLM2 reply
 * began ".1{" after "[/THINK]"). Not covered: a token holding the whole marker and more, taken
 * with nothing of the marker written yet (docs/tools.md). */
static int closing_mask(struct seq *s, uint32_t *mask, int n_words)
{
    const struct request *r = s->req;
    const enum status st = matcher_start(s);
    if (st != STATUS_OK) return st == STATUS_INVALID_ARGUMENT ? -2 : -1;
    memset(mask, 0xff, (size_t)n_words * sizeof *mask);
    const int harmony = is_harmony(r);
    for (int32_t i = 0; i < n_words * 32; i++) {
        int len = 0, k = s->lazy_match, kb[2] = {s->lazy_brk[0], s->lazy_brk[1]}, j = 0;
        const char *b = token_text(r, i, &len), *brk = NULL;
        if (!b) continue;
        while (j < len && k < r->think_len[1] && !brk) {
            k = trigger_next(r->think[1], k, b[j]);
            for (int m = 0; m < 2 && harmony; m++)
                if ((kb[m] = trigger_next(HARMONY_BREAKS[m], kb[m], b[j])) == HARMONY_BREAK_LEN[m])
                    brk = HARMONY_BREAKS[m];
            j++;
        }
        if (k < r->think_len[1] && !brk) continue;
        if (j == len && !brk) continue;
        int took = 0, ok = 1;
        if (brk) { /* (lazy_start_at_break: the break, then the rest as written) */
            ok = grammar_matcher_accept_bytes(s->gm, brk, strlen(brk)) == STATUS_OK, took += ok;
            if (ok && j < len) ok = grammar_matcher_accept_bytes(s->gm, b + j, (size_t)(len - j)) == STATUS_OK, took += ok;
        } else { /* (lazy_start: accept_rest) */
            const int a = accept_rest(s->gm, b + j, (size_t)(len - j));
            ok = a != 0, took += a == 1;
        }
        if (took) grammar_matcher_rollback(s->gm, took);
        if (!ok) mask[i >> 5] &= ~(1u << (i & 31));
    }
    return 1;
}

void constraint_set_markers(struct request *r, const char *m, size_t n)
{
    n = n < REQUEST_MAX_TRIGGER_BYTES ? n : REQUEST_MAX_TRIGGER_BYTES;
    memcpy(r->trigger, m, n);
    r->trigger[n] = 0;
    r->n_markers = 0;
    const int len = (int)n;
    for (int at = 0; at < len && r->n_markers < TRIGGER_MAX_MARKERS; r->n_markers++) {
        char *sep = memchr(r->trigger + at, TRIGGER_MARKER_SEP, (size_t)(len - at));
        const int end = sep ? (int)(sep - r->trigger) : len;
        r->trigger[end] = 0;
        r->marker_off[r->n_markers] = at, r->marker_len[r->n_markers] = end - at, r->marker_id[r->n_markers] = -1;
        at = end + 1;
    }
}

int constraint_fill_mask(struct seq *s, uint32_t *mask)
{
    const struct request *r = s->req;
    const int opening = opening_state(s);
    if (r->p.constraint_trigger_len && !s->lazy_on && !opening) { /* lazy, before its trigger: free */
        if (s->lazy_phase != LAZY_REASONING || r->n_markers || !(s->lazy_match | s->lazy_brk[0] | s->lazy_brk[1]))
            return 0;
        return closing_mask(s, mask, grammar_vocab_mask_words(grammar_vocab_of(r->grammar)));
    }
    const int n_words = grammar_vocab_mask_words(grammar_vocab_of(r->grammar));
    if (opening == 2) {
        memset(mask, 0, (size_t)n_words * sizeof *mask);
    } else {
        const enum status st = matcher_start(s);
        if (st != STATUS_OK) return st == STATUS_INVALID_ARGUMENT ? -2 : -1;
        if (grammar_matcher_fill_mask(s->gm, mask) != STATUS_OK) return -2;
        if (grammar_matcher_can_end(s->gm))
            for (int i = 0; i < r->p.n_end_ids; i++) mask[r->p.end_ids[i] >> 5] |= 1u << (r->p.end_ids[i] & 31);
    }
    if (opening) think_mask(s, mask, n_words);
    return 1;
}

enum status constraint_take(struct seq *s, int32_t tok)
{
    struct request *r = s->req;
    if (r->p.constraint_trigger_len && !s->lazy_on) {
        if (s->lazy_phase == LAZY_BEGIN) {
            s->lazy_phase = r->trigger_flags & TRIGGER_IN_REASONING ? LAZY_REASONING
                          : is_opening(r)                           ? LAZY_OPEN
                          : r->trigger_flags & TRIGGER_MAY_REASON   ? LAZY_DETECT
                                                                    : LAZY_ARMED;
            const enum status st = s->lazy_phase == LAZY_OPEN ? matcher_start(s) : STATUS_OK;
            if (st != STATUS_OK) return st;
        }
        int len = 0;
        const char *b = token_text(r, tok, &len);
        if (s->lazy_phase == LAZY_OPEN || s->lazy_phase == LAZY_OPEN_THINK) return opening_take(s, tok, b, len);
        enum status st = STATUS_OK;
        for (int i = 0; i < len && s->lazy_phase != LAZY_DEAD; i++)
            if (lazy_byte(s, b + i, (size_t)(len - i), &st) >= 0) return st; /* the token's rest went to the grammar */
        return STATUS_OK;
    }
    enum status st = matcher_start(s);
    if (st != STATUS_OK) return st;
    /* The mask allowed tok: only a grammar too ambiguous to follow can refuse it (an error of
     * the request's, the message set); the sample is not left on a state that missed it. */
    st = grammar_matcher_accept(s->gm, tok);
    if (st == STATUS_OK) s->grammar_end = grammar_matcher_is_done(s->gm);
    else if (grammar_matcher_overflowed(s->gm)) return st;
    return STATUS_OK;
}
