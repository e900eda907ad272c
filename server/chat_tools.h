/* server/chat_tools.h - tool calling, chat_template_kwargs and reasoning on the gRPC Chat and
 * ChatStream RPCs, with the HTTP chat's own code: the request's chat part (convert.c writes it
 * as an OpenAI chat request's JSON: gen_request.chat_request) is checked and applied by
 * http_tools.c (tools in the template's native format or the generic one, the call's grammar,
 * the Jinja render context), and replies are parsed by tool_format.c into content,
 * reasoning_content and tool calls, whole (unary) or as deltas (streams) that assemble to the
 * whole. Front-neutral: no protobuf and no HTTP connection here (docs/tools.md).
 * Tests: tests/server/test_tools.py, test_tools_native.py (gRPC equals HTTP). */
#ifndef SHARDLM_CHAT_TOOLS_H
#define SHARDLM_CHAT_TOOLS_H

#include <stddef.h>

#include "convert.h"
#include "tool_format.h"

struct served_model;

/* How a chat call's replies are parsed (set by chat_tools_apply, completed by
 * chat_parse_note_prompt once the prompt is rendered). on 0: replies are sent as they come. */
struct chat_parse {
    int   on;                 /* tools, or a template that reasons */
    int   tools, tool_format, max_calls, reasoning, think_open;
    char *arg_types;          /* malloc'd: the XML-like formats' value types (http_request's), or NULL */
    char *prefill;            /* malloc'd: the text written after the prompt (a required call's
                                 opening marker), which the parsed reply starts with; or NULL */
};

/* Applies r->chat_request (when set) to r, for model m's template: rewrites tool messages and
 * assistant tool calls as the tool format writes them, adds the tools (system text or template
 * context) and the call grammar, the render context with chat_template_kwargs. Fills *cp (zeroed first). Errors:
 * INVALID_ARGUMENT naming the field, as the HTTP chat's. */
enum status chat_tools_apply(const struct served_model *m, struct gen_request *r, struct chat_parse *cp);
/* After gen_prompt: records r's think_open and prefill in cp. */
enum status chat_parse_note_prompt(struct chat_parse *cp, const struct gen_request *r);
void        chat_parse_free(struct chat_parse *cp);

/* A parsed reply, or a stream's delta of one, as gen_sample_out fields (fill_sample). */
struct chat_reply {
    char  *content, *reasoning;    /* NUL-terminated (in owned); NULL: nothing (new) */
    struct gen_tool_call *calls;   /* (n_calls) */
    int    n_calls;
    int    ended_with_calls;       /* the reply holds calls (stream: calls went out) */
    char **owned;                  /* (n_owned) every string the reply points to */
    int    n_owned;
};

/* The whole reply text[0..n) of sample `sample` (prefill first is added here) of request id. */
enum status chat_reply_whole(const struct chat_parse *cp, const char *request_id, int sample, const char *text,
                             size_t n, struct chat_reply *out);
/* Copies what out holds into o's parsed fields (pointers into out). */
void        chat_reply_fill(const struct chat_reply *r, struct gen_sample_out *o);
void        chat_reply_free(struct chat_reply *r);

/* One sample of a stream: its incremental parse (tool_format.h), made at its first piece. */
struct chat_stream {
    struct tool_stream *ts;
};

/* Appends text[0..n) to the sample's stream, parses what is new (final: the sample ended) and
 * puts in *out what did not go out yet: new reasoning, new content, new calls (index, id, name
 * and their arguments so far) and the arguments' new fragments. */
enum status chat_stream_delta(const struct chat_parse *cp, struct chat_stream *st, const char *request_id, int sample,
                              const char *text, size_t n, int final, struct chat_reply *out);
void        chat_stream_free(struct chat_stream *st);

#endif
