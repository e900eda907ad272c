/* engine/serving/constraint.h - a sample's structured-output constraint as tokens are taken:
 * its grammar matcher, and for a lazy constraint (request_params.constraint_trigger_len, tool
 * calls under tool_choice auto) the watch for its trigger in the output before the matcher
 * starts. One function, used where tokens are taken (conductor_sample.c) and where a journaled
 * sample's tokens are replayed (request.c), so that both reach the same state.
 * Not here: the mask (conductor_sample.c constrain). Tests: tests/server/test_tools_lazy.py,
 * tests/server/test_structured.py. docs/tools.md. */
#ifndef SHARDLM_CONSTRAINT_H
#define SHARDLM_CONSTRAINT_H

#include <stdint.h>

#include "request.h"

/* Token tok was taken by s, whose request has a grammar: advances its matcher (made at the first
 * token, or at the trigger), or, for a lazy constraint not yet on, looks for the trigger in the
 * token's bytes (across tokens) or takes the trigger's own token; from the trigger's end
 * (whitespace skipped) the matcher constrains s. A complete grammar with nothing allowed after it
 * sets s->grammar_end (the sample stops). Bytes after the trigger in its token that the grammar
 * cannot start with leave s free. Errors: STATUS_RESOURCE_EXHAUSTED (no matcher could be made). */
enum status constraint_take(struct seq *s, int32_t tok);

#endif
