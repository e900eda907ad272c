/* engine/serving/constraint.c - a sample's constraint as tokens are taken (constraint.h).
 * Tests: tests/server/test_tools_lazy.py, tests/server/test_structured.py. */
#include "constraint.h"

#include <string.h>

#include "grammar.h"

static const char THINK[2][9] = {"<think>", "</think>"};

/* Where a lazy sample's watch is, before its trigger (seq.lazy_phase; 0 until its first byte). */
enum { LAZY_BEGIN, LAZY_DETECT, LAZY_REASONING, LAZY_ARMED, LAZY_DEAD };

static int is_ws(char b) { return b == ' ' || b == '\n' || b == '\t' || b == '\r'; }

/* The bytes of the marker t matched after byte b, k of them matched before (the longest prefix of
 * t that the output now ends with). */
static int trigger_next(const char *t, int k, char b)
{
    for (int m = k + 1; m > 0; m--) /* try the longest first: t[0..m) == t[k-m+1..k) + b */
        if (t[m - 1] == b && !memcmp(t, t + k - m + 1, (size_t)m - 1)) return m;
    return 0;
}

/* The marker is complete and rest[0..n) of the output follows it: the grammar starts there
 * (leading whitespace skipped; an anchored marker is the call's start and read first). Bytes the
 * grammar cannot start with leave the sample free (the output already holds them; docs/tools.md). */
static enum status lazy_start(struct seq *s, const char *rest, size_t n)
{
    const struct request *r = s->req;
    s->lazy_match = 0, s->lazy_phase = LAZY_ARMED; /* (when it stays free, the next marker is looked for) */
    while (n && is_ws(*rest)) rest++, n--;
    if (!s->gm && grammar_matcher_new(r->grammar, &s->gm) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
    int ok = 1;
    if (r->trigger_flags & TRIGGER_ANCHORED) {
        ok = grammar_matcher_accept_bytes(s->gm, r->trigger, (size_t)r->trigger_len) == STATUS_OK;
        s->lazy_phase = LAZY_DEAD; /* (an anchored marker that the grammar refuses never comes again) */
    }
    s->lazy_on = ok && (!n || grammar_matcher_accept_bytes(s->gm, rest, n) == STATUS_OK);
    return STATUS_OK;
}

/* Byte b of the output, in the armed phase: whether it completes the marker. */
static int armed_byte(const struct request *r, struct seq *s, char b)
{
    if (!(r->trigger_flags & TRIGGER_ANCHORED)) {
        s->lazy_match = trigger_next(r->trigger, s->lazy_match, b);
    } else if (b == r->trigger[s->lazy_match]) {
        s->lazy_match++;
    } else if (s->lazy_match || !is_ws(b)) {
        s->lazy_phase = LAZY_DEAD;
        return 0;
    }
    return s->lazy_match == r->trigger_len;
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
        if (b == THINK[0][s->lazy_match]) {
            if (++s->lazy_match == 7) s->lazy_phase = LAZY_REASONING, s->lazy_match = 0;
            return -1;
        }
        /* Not reasoning: the bytes read since the whitespace are the reply's, b after them. */
        char again[8];
        int k = s->lazy_match;
        memcpy(again, THINK[0], (size_t)k);
        again[k] = b;
        s->lazy_phase = LAZY_ARMED, s->lazy_match = 0;
        for (int i = 0; i <= k; i++)
            if (s->lazy_phase == LAZY_ARMED && armed_byte(r, s, again[i])) {
                /* (a marker within "<thin" + b: the grammar starts with the rest of them, then p's) */
                if ((*st = lazy_start(s, again + i + 1, (size_t)(k - i))) != STATUS_OK || !s->lazy_on) return 0;
                return grammar_matcher_accept_bytes(s->gm, p + 1, n - 1) == STATUS_OK ? (long)n - 1
                                                                                        : (s->lazy_on = 0, 0);
            }
        return -1;
    case LAZY_REASONING:
        s->lazy_match = trigger_next(THINK[1], s->lazy_match, b);
        if (s->lazy_match < 8) return -1;
        s->lazy_phase = LAZY_ARMED, s->lazy_match = 0;
        if (r->trigger_len) return -1;
        *st = lazy_start(s, p + 1, n - 1); /* no marker: the grammar starts after </think> */
        return (long)n - 1;
    case LAZY_ARMED:
        if (!armed_byte(r, s, b)) return -1;
        *st = lazy_start(s, p + 1, n - 1);
        return (long)n - 1;
    default:
        return -1;
    }
}

/* The bytes token tok adds to the output (the marker's and <think>'s own tokens: their text). */
static const char *token_text(const struct request *r, int32_t tok, int *len)
{
    if (tok == r->trigger_id) return *len = r->trigger_len, r->trigger;
    for (int i = 0; i < 2; i++)
        if (tok == r->think_ids[i]) return *len = (int)strlen(THINK[i]), THINK[i];
    return grammar_vocab_token(grammar_vocab_of(r->grammar), tok, len);
}

enum status constraint_take(struct seq *s, int32_t tok)
{
    struct request *r = s->req;
    if (r->p.constraint_trigger_len && !s->lazy_on) {
        if (s->lazy_phase == LAZY_BEGIN)
            s->lazy_phase = r->trigger_flags & TRIGGER_IN_REASONING ? LAZY_REASONING
                          : r->trigger_flags & TRIGGER_MAY_REASON   ? LAZY_DETECT
                                                                    : LAZY_ARMED;
        int len = 0;
        const char *b = token_text(r, tok, &len);
        enum status st = STATUS_OK;
        for (int i = 0; i < len && s->lazy_phase != LAZY_DEAD; i++)
            if (lazy_byte(s, b + i, (size_t)(len - i), &st) >= 0) return st; /* the token's rest went to the grammar */
        return STATUS_OK;
    }
    if (!s->gm && grammar_matcher_new(r->grammar, &s->gm) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
    if (grammar_matcher_accept(s->gm, tok) == STATUS_OK) s->grammar_end = grammar_matcher_is_done(s->gm);
    return STATUS_OK;
}
