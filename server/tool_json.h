/* server/tool_json.h - JSON read byte by byte, for the incremental reply parser (tool_stream.c):
 * a string (decoded as far as whole escapes go), any value (a stack of open containers), and
 * a tool call {"name": "...", "<args key>": {...}} with where its arguments lie in the text, and
 * Llama 3.1's built-in call `name.call(k=v, ...)`.
 * Each machine takes one byte at a time and never looks back, so a reply fed in pieces is read
 * once. What they accept is what the whole-text scanner before them accepted (a NUL counts as a
 * number's byte, escapes are judged once whole, nesting deeper than TOOL_JSON_MAX_DEPTH is
 * malformed). Private to the server's reply parser. Tests: tests/test_tool_stream.c. */
#ifndef SHARDLM_TOOL_JSON_H
#define SHARDLM_TOOL_JSON_H

#include <stddef.h>

#define TOOL_JSON_MAX_DEPTH 128 /* nesting of a call's JSON; deeper is malformed */

/* What a byte did: more is needed, the value is done (with this byte), done before this byte
 * (a number ended: the byte belongs to what follows), or the text is malformed. */
enum { TOOL_JSON_MORE, TOOL_JSON_DONE, TOOL_JSON_AGAIN, TOOL_JSON_BAD };

/* A growable NUL-terminated buffer (p NULL until the first byte). */
struct tool_json_buf {
    char  *p;
    size_t n, cap;
    int    oom;
};

/* Appends s[0..n) (b stays NUL-terminated); out of memory sets b->oom and drops the bytes. */
void tool_json_buf_add(struct tool_json_buf *b, const char *s, size_t n);
void tool_json_buf_reset(struct tool_json_buf *b);
int  tool_json_is_ws(unsigned char c);

/* A JSON string after its opening quote. Escapes must be whole to be judged: \u needs its four
 * digits (and a high surrogate its low half) before it is accepted or refused. */
struct tool_json_str {
    int  st;      /* 0 body, 1 after a backslash, 2 in \uXXXX, 3 in a low surrogate's \uXXXX */
    int  n_hex;
    char hex[6];
    unsigned hi;
};

/* One byte of a string after its opening quote; out (may be NULL) gets the decoded text. */
int  tool_json_str_byte(struct tool_json_str *j, unsigned char c, struct tool_json_buf *out);

/* Any JSON value; depth counts the open containers (a value inside d of them is at depth d + 1,
 * and values deeper than TOOL_JSON_MAX_DEPTH are malformed). */
struct tool_json_value {
    int  st, depth;
    char stack[TOOL_JSON_MAX_DEPTH + 1];
    struct tool_json_str s;
    char lit[6];
    int  n_lit;
};

/* A call object: its state, the decoded key being read and the name (whole once has_name). */
struct tool_json_call {
    int         st, first, is_name, is_args, in_args, has_name, has_args;
    struct tool_json_str s;
    struct tool_json_buf key, name;
    struct tool_json_value v;
    size_t      args0, args1; /* the arguments' text: [args0, args1), or to the end while in_args */
};

/* Resets c for a new call (keeping its buffers). */
void tool_json_call_start(struct tool_json_call *c);
/* One byte at position pos of the text; name_key, args_key: the format's keys of the function's
 * name and of the arguments ("arguments" is accepted for any); other keys' values are skipped.
 * *oom is set when out of memory (the call is then BAD). */
int  tool_json_call_byte(struct tool_json_call *c, unsigned char ch, size_t pos, const char *name_key, const char *args_key,
                         int *oom);

/* Llama 3.1's built-in tool call, the text after <|python_tag|>: `name.call(k=v, ...)` with
 * identifiers ([A-Za-z0-9_], not starting with a digit) for the name and the keys, any JSON
 * value for each v (the template writes strings: `query="..."`), whitespace between the parts.
 * name gets the function's name, args the arguments as one JSON object, `{"k": v, ...}`, the
 * values as the model wrote them (whole once DONE, which the closing parenthesis gives). */
struct tool_json_builtin {
    int  st, n_args;
    struct tool_json_buf name, args;
    struct tool_json_value v;
};

/* 1 when c may be in an identifier (first: may start one). */
int  tool_json_ident_byte(unsigned char c, int first);
/* Resets b for a new call (keeping its buffers). */
void tool_json_builtin_start(struct tool_json_builtin *b);
/* One byte; *oom is set when out of memory (the call is then BAD). */
int  tool_json_builtin_byte(struct tool_json_builtin *b, unsigned char ch, int *oom);

#endif
