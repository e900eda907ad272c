/* engine/serving/constraint.c - a sample's constraint as tokens are taken (constraint.h).
 * Tests: tests/server/test_tools_lazy.py, tests/server/test_structured.py. */
#include "constraint.h"

#include <string.h>

#include "grammar.h"

/* The bytes of the trigger matched after byte b, k of them matched before (the longest prefix of
 * the trigger that the output now ends with). */
static int trigger_next(const char *t, int k, char b)
{
    for (int m = k + 1; m > 0; m--) /* try the longest first: t[0..m) == t[k-m+1..k) + b */
        if (t[m - 1] == b && !memcmp(t, t + k - m + 1, (size_t)m - 1)) return m;
    return 0;
}

/* The trigger is complete and rest[0..n) of the token that completed it follows: the grammar
 * starts there (leading whitespace skipped). Bytes the grammar cannot start with leave the
 * sample free (the output already holds them; docs/tools.md). */
static enum status lazy_start(struct seq *s, const char *rest, size_t n)
{
    s->lazy_match = 0; /* (when it stays free, the next trigger is looked for from scratch) */
    while (n && (*rest == ' ' || *rest == '\n' || *rest == '\t' || *rest == '\r')) rest++, n--;
    if (!s->gm && grammar_matcher_new(s->req->grammar, &s->gm) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
    s->lazy_on = !n || grammar_matcher_accept_bytes(s->gm, rest, n) == STATUS_OK;
    return STATUS_OK;
}

enum status constraint_take(struct seq *s, int32_t tok)
{
    struct request *r = s->req;
    if (r->p.constraint_trigger_len && !s->lazy_on) {
        if (tok == r->trigger_id) return lazy_start(s, "", 0);
        int len = 0;
        const char *b = grammar_vocab_token(grammar_vocab_of(r->grammar), tok, &len);
        for (int i = 0; i < len; i++) {
            s->lazy_match = trigger_next(r->trigger, s->lazy_match, b[i]);
            if ((size_t)s->lazy_match == r->p.constraint_trigger_len) return lazy_start(s, b + i + 1, (size_t)(len - i - 1));
        }
        return STATUS_OK;
    }
    if (!s->gm && grammar_matcher_new(r->grammar, &s->gm) != STATUS_OK) return STATUS_RESOURCE_EXHAUSTED;
    if (grammar_matcher_accept(s->gm, tok) == STATUS_OK) s->grammar_end = grammar_matcher_is_done(s->gm);
    return STATUS_OK;
}
