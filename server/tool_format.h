/* server/tool_format.h - the tool-call formats models write, found from their chat template's
 * text, and the parser that turns a reply (whole, or the prefix a stream has so far) into
 * reasoning, content and tool calls. Pure text in, text out: no server, engine or JSON library
 * state, so that it can be fuzzed alone (tests/fuzz/fuzz_tool_parse.c).
 *
 * Formats (the detection follows llama.cpp's common/chat.cpp: markers searched in the
 * template's source):
 *   GENERIC  {"tool_calls": [{"name", "arguments"}, ...]} or {"response": "..."}: the whole reply
 *            is one JSON object (server/http_tools.c constrains it); any template
 *   HERMES   <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call> (Qwen 2.5 / 3, Hermes 2
 *            Pro, SmolLM3): the template holds "<tool_call>"
 *   MISTRAL  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral Nemo / Small 3.x):
 *            "[TOOL_CALLS]"
 *   LLAMA3   {"name": ..., "parameters": {...}} as the whole reply (Llama 3.1 / 3.2 / 3.3):
 *            "<|start_header_id|>" and "ipython"
 *   PHI4     <|tool_call|>{"name": ..., "arguments": {...}}<|/tool_call|> (Phi-4-mini): both markers
 *   KIMI     <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:INDEX<|tool_call_argument_begin|>
 *            {...}<|tool_call_end|>...<|tool_calls_section_end|> (Kimi-K2, -Thinking):
 *            "<|tool_calls_section_begin|>"; parsed as DEEPSEEK's list; a call constrained by a
 *            JSON Schema whose INDEX is the conversation's next (one call a reply)
 *   GRANITE  <|tool_call|>[{"name": ..., "arguments": {...}}, ...] (Granite 3.1-3.3): "<|tool_call|>"
 *            without Phi-4's closing marker nor 3.0's tool_response role (3.0: GENERIC); parsed and
 *            constrained as MISTRAL's list. Its
 *            templates never write an assistant's tool_calls: the server writes them into the
 *            message's content in this form (http_tools_context.c raw_message)
 *   HARMONY  GPT-OSS's messages: <|channel|>analysis<|message|>...<|end|><|start|>assistant
 *            <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
 *            (tool_harmony.c): "<|channel|>", "<|message|>" and "<|start|>"; whether or not the
 *            template reads `tools`, since its channels are also its reasoning (the `reasoning`
 *            argument is then unused)
 *   GLM      <tool_call>NAME\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>...</tool_call> (GLM-4.5 /
 *            4.6: "<arg_key>", looked for before Hermes' "<tool_call>"): calls parsed into JSON
 *            arguments (server/tool_glm.c; a value that is whole JSON is that JSON, anything else a
 *            string), each visible once its </tool_call> is read; a required or named
 *            tool_choice is held to a GBNF grammar of the declared calls (http_tools_glm.c), auto
 *            is free
 *   COMMAND_R7B <|START_ACTION|>[{"tool_call_id": "0", "tool_name": ..., "parameters": {...}}, ...]<|END_ACTION|>
 *            (Cohere's Command R7B: "<|START_ACTION|>"): MISTRAL's list with its keys (the id is not
 *            kept) and its closing marker; a plain answer's <|START_RESPONSE|> ... <|END_RESPONSE|>
 *            markers are dropped from the content. Its <|START_THINKING|> plan is not split off
 *            (the template closes it empty unless enable_thinking)
 *   DEEPSEEK <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...
 *            <｜tool▁calls▁end｜> (DeepSeek V3.1), or R1's body `function<｜tool▁sep｜>NAME\n```json\n{...}\n```
 *            (DeepSeek R1 and its Qwen / Llama distills): "tool▁calls▁begin"; each call visible once its
 *            <｜tool▁call▁end｜> is read, its arguments the JSON object as written; calls constrained by
 *            a JSON Schema with the markers (http_tools.c deepseek_schema), lazily under auto
 *   FUNCTIONARY <function=NAME>{...}</function>... (meetkai's functionary v3.1 on Llama 3.1:
 *            "<|start_header_id|>" and "<function="): each call seen whole once its </function> is
 *            read, its arguments the JSON object as written; constrained by a JSON Schema with the
 *            tags (http_tools.c functionary_schema), lazily from "<function=" under auto
 *   GEMMA4   <|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>... (Gemma 4: "<|tool_call>call:"),
 *            VALUE in its template's notation: a string between <|"|> marks, an object with bare
 *            keys, a list, a JSON number, true / false / null; each call seen whole once its
 *            <tool_call|> is read; constrained by a GBNF grammar (http_tools_gemma4.c)
 * A template that never reads `tools` gets GENERIC whatever it holds.
 *
 * Reasoning: with `reasoning` on (enum tool_reasoning: the markers), a reply that opens with the
 * opening marker (or whose prompt ended inside it: think_open) has its text up to the closing
 * marker as reasoning (trimmed), the rest as the reply.
 *
 * Partial parses (final = 0) give prefixes of what the final parse of any longer text that
 * starts with the same bytes gives, as long as that text stays well formed: bytes that could be
 * the start of a marker are held back, and a call is reported once its name is complete (its
 * arguments then grow byte by byte, as the model wrote them). A malformed call in free-form
 * output (tool_choice auto) is content in a final parse; a stream may already have sent it as a
 * call (docs/tools.md). Arguments are the raw JSON text the model wrote (compact under a
 * grammar).
 *
 * The parser is incremental (struct tool_stream, tool_stream.c): a stream feeds each sample's
 * reply piece by piece and reads, after each piece, what a parse of the whole text so far
 * gives, or the delta since the last piece; each byte is read a bounded number of times, so a
 * stream's parsing costs work linear in its reply's length. tool_parse is the same parser fed
 * once. Tests: tests/server/test_tools.py, tests/test_tool_stream.c (against the whole-text
 * parser this one replaced, at every prefix; linear work), tests/fuzz/fuzz_tool_parse.c. */
#ifndef SHARDLM_TOOL_FORMAT_H
#define SHARDLM_TOOL_FORMAT_H

#include <stddef.h>

enum tool_format {
    TOOL_FORMAT_GENERIC,
    TOOL_FORMAT_HERMES,
    TOOL_FORMAT_MISTRAL,
    TOOL_FORMAT_LLAMA3,
    TOOL_FORMAT_PHI4,
    TOOL_FORMAT_HARMONY,
    TOOL_FORMAT_GLM, /* parsed (tool_glm.c); required / named: a GBNF grammar (http_tools_glm.c) */
    TOOL_FORMAT_DEEPSEEK, /* parsed (tool_stream.c, tool_glm.c); constrained by a JSON Schema with its markers
                             (http_tools.c deepseek_schema) */
    TOOL_FORMAT_GRANITE,  /* <|tool_call|>[{...}, ...]: MISTRAL's list after Granite 3's marker */
    TOOL_FORMAT_KIMI,     /* DEEPSEEK's shape with Kimi-K2's markers; one call constrained */
    TOOL_FORMAT_COMMAND_R7B, /* <|START_ACTION|>[{tool_call_id, tool_name, parameters}, ...]<|END_ACTION|> */
    TOOL_FORMAT_QWEN_XML, /* Qwen3-Coder, Qwen3.5: <tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...
                             </function>\n</tool_call>; parsed (tool_glm.c) and constrained as GLM's */
    TOOL_FORMAT_MINIMAX,  /* MiniMax-M2: <minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V</parameter>\n...
                             </invoke>\n...</minimax:tool_call>; parsed (tool_glm.c) and constrained as GLM's */
    TOOL_FORMAT_NEMOTRON, /* Nemotron Nano v2: <TOOLCALL>[{"name", "arguments"}, ...]</TOOLCALL>: MISTRAL's list */
    TOOL_FORMAT_DSML,     /* DeepSeek V3.2: MINIMAX's shape, each tag after ｜DSML｜, in <｜DSML｜function_calls>; a
                             parameter's string="true|false" says whether its value is raw or JSON */
    TOOL_FORMAT_DSML_V4,  /* DeepSeek V4: DSML's calls in <｜DSML｜tool_calls> */
    TOOL_FORMAT_GEMMA4,   /* Gemma 4: <|tool_call>call:NAME{KEY:VALUE,...}<tool_call|>, its values in its
                             template's notation (strings between <|"|> marks, keys bare) */
    TOOL_FORMAT_FUNCTIONARY, /* functionary v3.1 (Llama 3.1): <function=NAME>{...}</function>, each call seen
                                whole once closed; constrained by a JSON Schema with its tags */
    TOOL_FORMAT_SEED_OSS, /* ByteDance Seed-OSS: <seed:tool_call>\n<function=NAME>\n<parameter=K>V</parameter>\n...
                             </function>\n</seed:tool_call>: QWEN_XML's tags, its values as written */
};

/* Whether f's calls are XML-like, their values written raw (GLM, QWEN_XML, MINIMAX, DSML,
 * DSML_V4), or Gemma 4's notation (GEMMA4): each call seen whole once its closing tag is read,
 * parsed by tool_glm.c, constrained by a GBNF grammar (http_tools_glm.c, http_tools_gemma4.c),
 * never by a JSON Schema. */
static inline int tool_format_is_xml(enum tool_format f)
{
    return f == TOOL_FORMAT_GLM || f == TOOL_FORMAT_QWEN_XML || f == TOOL_FORMAT_MINIMAX || f == TOOL_FORMAT_DSML ||
           f == TOOL_FORMAT_DSML_V4 || f == TOOL_FORMAT_GEMMA4 || f == TOOL_FORMAT_SEED_OSS;
}

/* Whether f's calls are read whole once their closing tag is (tool_stream.c B_GLM): the XML-like
 * formats and FUNCTIONARY's. */
static inline int tool_format_whole_calls(enum tool_format f)
{
    return tool_format_is_xml(f) || f == TOOL_FORMAT_FUNCTIONARY;
}

/* Whether f's calls are blocks of <invoke>s (MINIMAX, DSML, DSML_V4). */
static inline int tool_format_is_invoke(enum tool_format f)
{
    return f == TOOL_FORMAT_MINIMAX || f == TOOL_FORMAT_DSML || f == TOOL_FORMAT_DSML_V4;
}

/* Whether f's calls are one JSON list after the marker (MISTRAL, GRANITE, COMMAND_R7B, NEMOTRON). */
static inline int tool_format_is_list(enum tool_format f)
{
    return f == TOOL_FORMAT_MISTRAL || f == TOOL_FORMAT_GRANITE || f == TOOL_FORMAT_COMMAND_R7B || f == TOOL_FORMAT_NEMOTRON;
}
/* The format a template's source (NUL-terminated) asks for; GENERIC when it has no tools. */
enum tool_format tool_format_detect(const char *template_src);
/* How the tools reach a model whose template never reads `tools` (DeepSeek's: its calls are the
 * model's own format, its tools only what the system message says): the server's system text,
 * describing V3.1's call shape or R1's (tool_format_tools_prompt). */
enum tool_prompt { TOOL_PROMPT_NONE, TOOL_PROMPT_DEEPSEEK, TOOL_PROMPT_DEEPSEEK_R1 };
/* The system text of kind p for the functions' JSON (a list of {name, description, parameters}),
 * malloc'd; NULL when out of memory. */
char *tool_format_tools_prompt(enum tool_prompt p, const char *functions_json);
/* The markers a reasoning block is written between, chosen by the template's text (its source
 * holds the opening marker, and the closing one but for <think>). Values are this parser's
 * `reasoning` argument (0: not split). */
enum tool_reasoning {
    TOOL_REASONING_OFF,
    TOOL_REASONING_THINK,   /* <think> ... </think> (Qwen 3, DeepSeek R1 and their distills) */
    TOOL_REASONING_MISTRAL, /* [THINK] ... [/THINK] (Mistral's Magistral) */
    TOOL_REASONING_THOUGHT, /* <|begin_of_thought|> ... <|end_of_thought|> (Sky-T1, Bespoke-Stratos) */
    TOOL_REASONING_HARMONY, /* GPT-OSS's analysis channel, <|channel|>analysis<|message|> ... <|end|>:
                               replies are read as harmony messages whatever the format argument */
    TOOL_REASONING_GEMMA4,  /* Gemma 4's thought channel, <|channel>thought\n ... <channel|> */
    TOOL_REASONING_R7B,     /* Command R7B's plan, <|START_THINKING|> ... <|END_THINKING|> */
    TOOL_REASONING_SEED,    /* Seed-OSS: <seed:think> ... </seed:think> */
};  /* (r - 1 is the engine's TRIGGER_MARKERS_* kind: engine.h) */
enum tool_reasoning tool_format_detect_reasoning(const char *template_src);
/* The opening and closing markers of kind r (not OFF). */
const char *tool_reasoning_open(enum tool_reasoning r);
const char *tool_reasoning_close(enum tool_reasoning r);
const char *tool_format_name(enum tool_format f);
/* Harmony's call header up to the function's name, as the model writes it (a required call's
 * prompt ends with it), and the part of it a lazy constraint watches for (tool_choice auto: the
 * recipient may also come first, `<|start|>assistant to=functions.NAME<|channel|>...`). */
#define HARMONY_CALL_PREFIX "<|channel|>commentary to=functions."
#define HARMONY_CALL_MARKER " to=functions."
/* The text a call opens with (written into the prompt when a call is required: the model
 * continues with the call's JSON); "" for LLAMA3, NULL for GENERIC. */
const char *tool_format_call_prefix(enum tool_format f);
/* The marker a call opens with, without the whitespace the model may write after it (the
 * trigger of a lazy grammar under tool_choice auto); NULL for GENERIC and LLAMA3. */
const char *tool_format_call_marker(enum tool_format f);
/* Parallel calls in one reply (the grammar's x-shardlm-repeat): the text that closes a call as
 * the template writes it ("\n</tool_call>", "<|/tool_call|>") and the text between a closed call
 * and the next call's JSON ("\n<tool_call>\n", "<|tool_call|>"); NULL for the formats with one
 * call per reply (LLAMA3) or a list (MISTRAL), and GENERIC. */
const char *tool_format_call_close(enum tool_format f);
const char *tool_format_next_call(enum tool_format f);
/* The key of a call's arguments in the model's JSON ("parameters" for LLAMA3 and COMMAND_R7B),
 * and of its function's name ("tool_name" for COMMAND_R7B, else "name"). */
const char *tool_format_args_key(enum tool_format f);
const char *tool_format_name_key(enum tool_format f);

struct tool_parsed_call {
    char  *name;       /* NUL-terminated, malloc'd */
    char  *args;       /* args_len bytes, NUL-terminated, malloc'd: raw JSON text (a prefix while partial) */
    size_t args_len;
    int    complete;   /* the call's JSON is whole */
};

struct tool_parsed {
    char  *reasoning, *content;   /* NUL-terminated, malloc'd (never NULL after a parse) */
    size_t reasoning_len, content_len;
    int    has_reasoning;         /* a <think> block was seen (reasoning_content is then sent) */
    struct tool_parsed_call *calls; /* (n_calls) */
    int    n_calls;
};

/* Parses text[0..n) (the reply, a call prefix written into the prompt included). tools: 0 when
 * the request had none (then only reasoning is split off); max_calls: calls kept at most (more
 * are dropped; 0: no limit). Returns 0, or -1 when out of memory (out is then freed). */
int  tool_parse(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *text,
                size_t n, int final, struct tool_parsed *out);
/* tool_parse with arg types (tool_stream_arg_types; NULL: none). */
int  tool_parse_typed(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *types,
                      const char *text, size_t n, int final, struct tool_parsed *out);
/* Frees what out owns and zeroes it; accepts a zeroed struct. */
void tool_parsed_free(struct tool_parsed *out);

/* ---- incremental parsing (one per sample of a stream) ---- */
struct tool_stream;

/* A parser of one reply with tool_parse's settings. Returns 0, or -1 out of memory (*out NULL). */
int  tool_stream_new(enum tool_format f, int tools, int reasoning, int think_open, int max_calls,
                     struct tool_stream **out);
/* The XML-like formats (tool_format_is_xml) write every value raw, a string as it is: a value
 * that is one whole JSON value is read back as that JSON unless types (copied; NULL: none) says
 * otherwise. types: entries "\x1eNAME\x1fKEY\x1fT", T 's' (the key's schema is a string: its
 * value is the raw text), 'b' (a boolean: true / false in any case, Python's True and False), 'z'
 * (null: null or Python's None), then a final "\x1e"; made from the request's tools by
 * tool_format_arg_types. Call before the first feed. Returns 0, or -1 out of memory. */
int  tool_stream_arg_types(struct tool_stream *ts, const char *types);
/* The arg types (above) of tools, a JSON list as the API takes it (cJSON), malloc'd; NULL out
 * of memory. Keys or names holding the bytes 0x1e or 0x1f are left out. */
struct cJSON;
char *tool_format_arg_types(const struct cJSON *tools);
/* Accepts NULL. */
void tool_stream_free(struct tool_stream *ts);
/* Appends text[0..n) (copied) to the reply and parses it; final: the reply ends here (bytes
 * held back as a possible marker's start are then released; nothing may be fed after).
 * Returns 0, or -1 out of memory (the stream is then unusable). */
int  tool_stream_feed(struct tool_stream *ts, const char *text, size_t n, int final);
/* Work done so far: bytes read by the parser's machines, markers compared. Linear in the
 * reply's length however it was cut (tests/test_tool_stream.c). */
unsigned long long tool_stream_steps(const struct tool_stream *ts);

/* What a parse of the text fed so far gives (tool_parse's result, final as fed). Pointers are
 * into ts and valid until the next feed; strings are not NUL-terminated (lengths given). */
struct tool_view {
    const char *reasoning, *content;
    size_t      reasoning_len, content_len;
    int         has_reasoning, n_calls;
};
struct tool_view_call {
    const char *name;  /* NUL-terminated */
    const char *args;
    size_t      args_len;
    int         complete;
};
void tool_stream_view(const struct tool_stream *ts, struct tool_view *v);
/* Call k < view.n_calls. */
void tool_stream_call(const struct tool_stream *ts, int k, struct tool_view_call *c);

/* A stream's news since the last delta: reasoning and content fragments (NULL: none), and for
 * calls a new call's header (is_new: index, name, the arguments so far) or its arguments' new
 * fragment. Fragments follow what went out before (a text that turned out shorter, a call
 * that turned out malformed, sends nothing back). Pointers valid until the next feed. */
struct tool_delta_call {
    int         index, is_new;
    const char *name;  /* is_new only */
    const char *args;  /* the new arguments bytes (args_len of them) */
    size_t      args_len;
};
struct tool_delta {
    const char *reasoning, *content;
    size_t      reasoning_len, content_len;
    const struct tool_delta_call *calls;
    int         n_calls;
    int         calls_sent;  /* some call went out, now or before */
};
/* Feeds text[0..n) (tool_stream_feed) and fills *d. Returns 0, or -1 out of memory. */
int  tool_stream_delta(struct tool_stream *ts, const char *text, size_t n, int final, struct tool_delta *d);

#endif
