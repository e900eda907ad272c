/* tests/fuzz/tool_parse_ref.h - the whole-text reply parser that server/tool_stream.c replaced,
 * kept as the reference the incremental parser is checked against (tool_parse_ref.c). */
#ifndef SHARDLM_TOOL_PARSE_REF_H
#define SHARDLM_TOOL_PARSE_REF_H

#include "tool_format.h"

/* tool_parse's contract (tool_format.h); the result is freed with tool_parsed_free. */
int tool_parse_ref(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *text,
                   size_t n, int final, struct tool_parsed *out);

#endif
