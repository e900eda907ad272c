/* engine/serving/constraint.h - a sample's structured-output constraint as tokens are taken:
 * its grammar matcher, and for a lazy constraint (request_params.constraint_trigger_len, tool
 * calls under tool_choice auto) the watch for its trigger in the output before the matcher
 * starts. One function, used where tokens are taken (conductor_sample.c) and where a journaled
 * sample's tokens are replayed (request.c), so that both reach the same state.
 * Not here: the mask (conductor_sample.c constrain), but for an opening constraint's <think> part. Tests: tests/test_constraint.c, tests/server/test_tools_lazy.py,
 * tests/server/test_structured.py, tests/server/test_tools_lazy_formats.py. docs/tools.md. */
#ifndef SHARDLM_CONSTRAINT_H
#define SHARDLM_CONSTRAINT_H

#include <stdint.h>

#include "request.h"

/* Token tok was taken by s, whose request has a grammar: advances its matcher (made at the first
 * token, or at the trigger), or, for a lazy constraint not yet on, looks for the trigger in the
 * token's bytes (across tokens) or takes the trigger's own token; from the trigger's end
 * (whitespace skipped where the grammar refuses it) the matcher constrains s. A complete grammar with nothing allowed after it
 * sets s->grammar_end (the sample stops). Bytes after the trigger in its token that the grammar
 * cannot start with leave s free. Errors: STATUS_RESOURCE_EXHAUSTED (no matcher could be made). */
enum status constraint_take(struct seq *s, int32_t tok);

/* The tokens s may take next under its constraint, as bits of mask[0..grammar_vocab_mask_words)
 * (bit i of word i/32: token i): the grammar's at s->gm's state (made here at the first call),
 * with the request's end-of-turn ids where the grammar may end. Returns 1 when filled, 0 when
 * the output is free (a lazy constraint before its trigger: mask untouched), -1 when no matcher
 * could be made (out of memory), -2 when the grammar's mask is over its work bound
 * (grammar_matcher_fill_mask: the constraint is too ambiguous; status_message() says). An opening constraint (engine.h: TRIGGER_MAY_REASON with no marker, a
 * response_format under a template where the model may open <think> itself) constrains its
 * first tokens to the union of two languages: the grammar's, and <think> (then free reasoning
 * up to </think>, after which the grammar starts afresh, whitespace skipped); its mask is the
 * grammar's plus the tokens that keep the output a prefix of <think> or complete it, until the
 * output leaves <think> (the grammar alone) or completes it (free). */
int constraint_fill_mask(struct seq *s, uint32_t *mask);

/* Sets r's markers from a trigger's marker text m[0..n) (TRIGGER_MARKER_SEP between them; the
 * request's checked by conductor.c): r->trigger, n_markers, marker_off / len, and
 * marker_id all -1 (the caller looks up the tokens whose text is a whole marker). */
void constraint_set_markers(struct request *r, const char *m, size_t n);

#endif
