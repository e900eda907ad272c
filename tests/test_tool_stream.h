/* tests/test_tool_stream.h - what test_tool_stream.c and test_tool_stream_formats.c share. */
#ifndef SHARDLM_TEST_TOOL_STREAM_H
#define SHARDLM_TEST_TOOL_STREAM_H

#include <stddef.h>

#include "tool_format.h"

/* Every partial parse of text[0..cut) a prefix of the final parse of text[0..n), and a stream's
 * deltas adding up to it (test_tool_stream.c). */
void format_prefixes(enum tool_format f, int tools, int max_calls, const char *text, size_t n);

/* The formats with no earlier parser to compare with: hand-worked cases, every prefix
 * (test_tool_stream_formats.c). */
void check_glm(void);
void check_deepseek(void);
void check_kimi(void);
void check_command_r7b(void);
void check_qwen_xml(void);
void check_minimax(void);
void check_nemotron(void);
void check_dsml(void);
void check_gemma4(void);
void check_functionary(void);

#endif
