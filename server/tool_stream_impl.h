/* server/tool_stream_impl.h - the state of the incremental reply parser (tool_format.h: struct
 * tool_stream), shared by its machines: tool_stream.c (the marked formats, generic, llama3, the
 * reasoning block, views and deltas) and tool_harmony.c (GPT-OSS's harmony messages). Private
 * to those two files. */
#ifndef SHARDLM_TOOL_STREAM_IMPL_H
#define SHARDLM_TOOL_STREAM_IMPL_H

#include <stddef.h>

#include "tool_format.h"
#include "tool_json.h"

/* A run of text that becomes content (or the reasoning): trimmed of whitespace at both ends,
 * joined to content before it by one space; read up to a limit that only grows. */
struct seg {
    size_t start, scanned, first, end; /* [first, end): the trimmed text so far */
    int    has;                        /* a non-whitespace byte was seen */
    size_t base, emitted;              /* content's length when the run began; bytes of it added */
};

enum body {
    B_WAIT,       /* the reasoning block is not over */
    B_RAW,        /* no tools: the rest is content as written */
    B_TEXT,       /* marked formats: text, looking for the opening marker */
    B_LIST_OPEN,  /* mistral: after [TOOL_CALLS], expecting '[' */
    B_CALL,       /* in a call's JSON */
    B_LIST_AFTER, /* mistral: after a call in the list */
    B_AFTER_CALL, /* marked: after a call, before its closing marker */
    B_REST,       /* the rest is text (trimmed, no markers) */
    B_DEAD,       /* the rest is dropped */
    G_OPEN, G_KEYSTART, G_KEY, G_COLON, G_RSTART, G_RESP, G_LSTART, G_LAFTER, /* generic */
    L_START, L_CALLSTART, L_AFTER, L_SEMI, L_BUILTIN,                         /* llama3 */
    B_GLM,        /* glm: in a call's body, looking for </tool_call> (tool_glm.c) */
    B_DS,         /* deepseek: in the list of calls (close_at: -1 between calls, else where the body starts) */
};

enum rphase { R_OFF, R_DETECT, R_IN, R_GAP };

struct tcall {
    char  *name;
    size_t args0, args1;
    int    no_args; /* a call without arguments takes none: "{}" */
    char  *own_args; /* a built-in call's arguments, made from its k=v pairs (own_len bytes); or NULL */
    size_t own_len;
};

struct tool_stream {
    enum tool_format f;
    int    tools, reasoning, max_calls, final, oom;
    char  *types;         /* tool_stream_arg_types (malloc'd), or NULL */
    char  *text;
    size_t len, cap, pos; /* pos: the next byte the body's machines read */
    unsigned long long steps;

    enum rphase rph;
    const char *ropen, *rclose; /* the reasoning block's markers (tool_reasoning_open / _close) */
    int    has_reasoning;
    size_t rscan;         /* R_DETECT / R_GAP: bytes skipped; R_IN: where to look for </think> next */
    struct seg rseg;
    size_t body;          /* where the reply proper starts */

    enum body st;
    struct seg cseg;
    size_t search;        /* B_TEXT: positions before this hold no opening marker */
    size_t block;         /* where the current block of calls opened (its marker) */
    size_t close_at;      /* B_AFTER_CALL: the first byte after the call's whitespace, or -1 */
    int    kept_block, seen, gdone; /* calls kept in this block; generic: non-space seen, reply whole */
    int    g4_str;        /* gemma4, B_GLM: the search is inside a <|"|> string (tool_glm.c) */
    int    bare;          /* qwen3-coder, B_GLM: a call without its <tool_call>, from its <function= to
                             its </function> (tool_stream_blocks.c) */
    struct tool_json_buf content, gkey;
    struct tool_json_str gs;
    struct tool_json_call call;
    struct tool_json_builtin builtin; /* llama3: a built-in call after <|python_tag|> */
    int    tagged;                    /* llama3: the reply opened with <|python_tag|> (text) or a
                                         built-in tool's name: a built-in call may follow */
    struct tcall *calls;
    int    n_calls, cap_calls;

    size_t sent_reasoning, sent_content, *sent_args;
    int    sent_calls, cap_args;
    struct tool_delta_call *dcalls;
    int    cap_dcalls;

    /* harmony (tool_harmony.c): the message being read, reasoning from every analysis message */
    int    h_st, h_dest;        /* enum harmony_state, enum harmony_dest (tool_harmony.c) */
    size_t h_at;                /* where the header (or the text without one) begins */
    size_t h_body, h_done;      /* the body's first byte; bytes of it given to h_dest so far */
    size_t h_mark, h_ws;        /* HS_HEAD: the header's marker; HS_MSG: whitespace read up to here */
    int    h_glue;              /* the next content bytes continue the last piece (no "\n") */
    int    h_pieces[2];         /* reasoning, content: messages that gave them bytes (joined by "\n") */
    struct tool_json_buf rbuf;  /* the reasoning */
    char  *h_name;              /* the call being read (malloc'd), or NULL */
};

/* The length of the longest suffix of s[0..n) that is a proper prefix of marker. */
size_t tool_stream_holdback(const char *s, size_t n, const char *marker);
/* GLM-4.5's call body s[0..n) (between <tool_call> and </tool_call>): its name at s + *name_at
 * (*name_len bytes) and its arguments as a JSON object in args (reset first), each value read
 * by types (tool_stream_arg_types; NULL: none). Returns 0 when the body is not a call
 * (tool_glm.c). tool_qwen_xml_call: the same for Qwen3-Coder's body,
 * `\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n` (trim: the newlines around
 * V are the template's; Seed-OSS's, without trim, writes V as it is). */
int tool_glm_call(const char *s, size_t n, const char *types, size_t *name_at, size_t *name_len,
                  struct tool_json_buf *args);
int tool_qwen_xml_call(const char *s, size_t n, const char *types, int trim, size_t *name_at, size_t *name_len,
                       struct tool_json_buf *args);
/* Gemma 4's markers and the body of one call, `call:NAME{KEY:VALUE,...}` (tool_glm.c): its name
 * at s + *name_at and its arguments as a JSON object in args (reset first); 0 when the body is
 * not a call. */
/* functionary v3.1's tags and the body of one call, `NAME>{...}` (tool_glm.c): its name at
 * s + *name_at, its arguments (one JSON object, whitespace around it trimmed) copied into args
 * (reset first); 0 when the body is not a call. */
#define TOOL_SEED_CALL            "<seed:tool_call>"
#define TOOL_SEED_CALL_END        "</seed:tool_call>"
#define TOOL_FUNCTIONARY_CALL     "<function="
#define TOOL_FUNCTIONARY_CALL_END "</function>"
int tool_functionary_call(const char *s, size_t n, size_t *name_at, size_t *name_len, struct tool_json_buf *args);
#define TOOL_GEMMA4_CALL     "<|tool_call>"
#define TOOL_GEMMA4_CALL_END "<tool_call|>"
#define TOOL_GEMMA4_QUOTE    "<|\"|>"
int tool_gemma4_call(const char *s, size_t n, size_t *name_at, size_t *name_len, struct tool_json_buf *args);
/* DeepSeek's markers (R1, V3, V3.1) and the body of one call (tool_glm.c): 1 with the name and the
 * arguments' JSON object as offsets into s, 0 when the body is not a call. */
#define TOOL_DS_BAR "\xef\xbd\x9c" /* U+FF5C, the fullwidth bar */
#define TOOL_DS_SP  "\xe2\x96\x81" /* U+2581, SentencePiece's space */
#define TOOL_DS_CALLS_BEGIN "<" TOOL_DS_BAR "tool" TOOL_DS_SP "calls" TOOL_DS_SP "begin" TOOL_DS_BAR ">"
#define TOOL_DS_CALLS_END   "<" TOOL_DS_BAR "tool" TOOL_DS_SP "calls" TOOL_DS_SP "end" TOOL_DS_BAR ">"
#define TOOL_DS_CALL_BEGIN  "<" TOOL_DS_BAR "tool" TOOL_DS_SP "call" TOOL_DS_SP "begin" TOOL_DS_BAR ">"
#define TOOL_DS_CALL_END    "<" TOOL_DS_BAR "tool" TOOL_DS_SP "call" TOOL_DS_SP "end" TOOL_DS_BAR ">"
#define TOOL_DS_SEP         "<" TOOL_DS_BAR "tool" TOOL_DS_SP "sep" TOOL_DS_BAR ">"
int tool_deepseek_call(const char *s, size_t n, size_t *name_at, size_t *name_len, size_t *args_at, size_t *args_len);
/* Kimi-K2's markers and the body of one call, `functions.NAME:INDEX<|tool_call_argument_begin|>ARGS`
 * (tool_glm.c; as tool_deepseek_call). */
#define TOOL_KIMI_CALLS_BEGIN "<|tool_calls_section_begin|>"
#define TOOL_KIMI_CALLS_END   "<|tool_calls_section_end|>"
#define TOOL_KIMI_CALL_BEGIN  "<|tool_call_begin|>"
#define TOOL_KIMI_CALL_END    "<|tool_call_end|>"
#define TOOL_KIMI_ARGS        "<|tool_call_argument_begin|>"
int tool_kimi_call(const char *s, size_t n, size_t *name_at, size_t *name_len, size_t *args_at, size_t *args_len);
/* MiniMax-M2's block of calls and DeepSeek V3.2's / V4's (DSML: every tag after ｜DSML｜), and one
 * call of it `<invoke name="NAME">...</invoke>` (dsml: `<｜DSML｜invoke name="NAME">...</｜DSML｜invoke>`)
 * at s[0..n) (whitespace before it skipped): 1 with its name and arguments (as tool_glm_call) and
 * *used, the bytes up to the end of its closing tag; 0 when s does not start with one (tool_glm.c). */
#define TOOL_MINIMAX_CALLS     "<minimax:tool_call>"
#define TOOL_MINIMAX_CALLS_END "</minimax:tool_call>"
#define TOOL_DSML              "<" TOOL_DS_BAR "DSML" TOOL_DS_BAR
#define TOOL_DSML_END          "</" TOOL_DS_BAR "DSML" TOOL_DS_BAR
#define TOOL_DSML_CALLS        TOOL_DSML "function_calls>"
#define TOOL_DSML_CALLS_END    TOOL_DSML_END "function_calls>"
#define TOOL_DSML_V4_CALLS     TOOL_DSML "tool_calls>"
#define TOOL_DSML_V4_CALLS_END TOOL_DSML_END "tool_calls>"
int tool_invoke(const char *s, size_t n, int dsml, const char *types, size_t *used, size_t *name_at, size_t *name_len,
                struct tool_json_buf *args);
/* Command R7B's markers: its list of calls, and the answer's (dropped from the content). */
#define TOOL_R7B_ACTION     "<|START_ACTION|>"
#define TOOL_R7B_ACTION_END "<|END_ACTION|>"
#define TOOL_R7B_RESPONSE   "<|START_RESPONSE|>"
#define TOOL_R7B_RESPONSE_END "<|END_RESPONSE|>"
/* A new slot for a call named name[0..n) (zeroed but for the name), or NULL out of memory. */
struct tcall *tool_stream_new_call(struct tool_stream *ts, const char *name, size_t n);
/* Format f's marker that opens a call or list of calls, and the one that closes it (NULL: none). */
const char *tool_stream_open_marker(enum tool_format f);
const char *tool_stream_close_marker(enum tool_format f);
/* A call, or the list around it, is malformed: its text stays text, or the rest is dropped. */
void tool_stream_call_bad(struct tool_stream *ts);
/* Text again from start (the content's next segment). */
void tool_stream_text_from(struct tool_stream *ts, size_t start);
/* B_GLM and B_DS, the blocks read whole once closed (tool_stream_blocks.c). */
void tool_stream_read_glm(struct tool_stream *ts);
void tool_stream_read_deepseek(struct tool_stream *ts);

/* Harmony: the reply begins (inside an analysis message when think_open: its prompt ended with
 * <|channel|>analysis<|message|>). */
void harmony_start(struct tool_stream *ts, int think_open);
/* Harmony: reads what was appended (all of it once final); tool_stream.c's advance for
 * TOOL_FORMAT_HARMONY. */
void harmony_advance(struct tool_stream *ts);
/* The call in progress, if any (its name is whole): name and the arguments so far. */
int  harmony_open_call(const struct tool_stream *ts, const char **name, const char **args, size_t *args_len);

#endif
