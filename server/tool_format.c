/* server/tool_format.c - tool-call formats: detection from a chat template's text, and whole
 * or partial replies parsed at once into reasoning, content and calls (tool_format.h), through
 * the incremental parser of tool_stream.c. Not here: the request side (tools in the template,
 * constraints: http_tools.c), the JSON bodies (http_openai_out.c).
 * Tests: tests/server/test_tools.py, tests/test_tool_stream.c, tests/fuzz/fuzz_tool_parse.c. */
#include "tool_format.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "tool_stream_impl.h" /* DeepSeek's markers */

/* GPT-OSS's harmony messages: its template writes every message's header. */
static int is_harmony(const char *src)
{
    return src && strstr(src, "<|channel|>") && strstr(src, "<|message|>") && strstr(src, "<|start|>");
}

enum tool_format tool_format_detect(const char *src)
{
    if (is_harmony(src)) return TOOL_FORMAT_HARMONY;
    /* DeepSeek V3.2 / V4 (llama.cpp's test): the template names its ｜DSML｜ token and writes the
     * calls' block with it, V3.2's named function_calls, V4's tool_calls */
    if (src && strstr(src, "dsml_token") && strstr(src, "DSML") && (strstr(src, "function_calls") || strstr(src, "tool_calls")))
        return strstr(src, "function_calls") ? TOOL_FORMAT_DSML : TOOL_FORMAT_DSML_V4;
    /* DeepSeek's templates write calls but never read `tools` (the server describes them:
     * tool_format_tools_prompt) */
    if (src && strstr(src, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) return TOOL_FORMAT_DEEPSEEK; /* tool▁calls▁begin */
    if (src && strstr(src, TOOL_KIMI_CALLS_BEGIN)) return TOOL_FORMAT_KIMI;
    if (!src || !strstr(src, "tools")) return TOOL_FORMAT_GENERIC;
    if (strstr(src, "<|START_ACTION|>")) return TOOL_FORMAT_COMMAND_R7B;
    if (strstr(src, "<minimax:tool_call>") && strstr(src, "<invoke name=")) return TOOL_FORMAT_MINIMAX;
    if (strstr(src, "'" TOOL_GEMMA4_CALL "call:'")) return TOOL_FORMAT_GEMMA4; /* (llama.cpp's test) */
    if (strstr(src, "<TOOLCALL>") && strstr(src, "</TOOLCALL>")) return TOOL_FORMAT_NEMOTRON;
    if (strstr(src, "<arg_key>")) return TOOL_FORMAT_GLM; /* before Hermes: GLM's calls open with <tool_call> too */
    if (strstr(src, TOOL_SEED_CALL) && strstr(src, "<function=")) return TOOL_FORMAT_SEED_OSS;
    /* Qwen3-Coder, Qwen3.5 (llama.cpp's test: the tags, less a template without the newlines
     * between them) */
    if (strstr(src, "<tool_call>") && strstr(src, "<function=") && strstr(src, "<parameter=") &&
        !strstr(src, "'<tool_call><function=' ~ tool_call.name ~ '>'"))
        return TOOL_FORMAT_QWEN_XML;
    if (strstr(src, "<tool_call>")) return TOOL_FORMAT_HERMES;
    if (strstr(src, "[TOOL_CALLS]")) return TOOL_FORMAT_MISTRAL;
    if (strstr(src, "<|tool_call|>") && strstr(src, "<|/tool_call|>")) return TOOL_FORMAT_PHI4;
    /* Granite 3.1+ (3.0's template takes calls and results as roles of its own, assistant_tool_call
     * and tool_response, which the generic format's history does not need) */
    if (strstr(src, "<|tool_call|>") && !strstr(src, "tool_response")) return TOOL_FORMAT_GRANITE;
    if (strstr(src, "<|start_header_id|>") && strstr(src, "<function=")) return TOOL_FORMAT_FUNCTIONARY; /* (llama.cpp's test) */
    if (strstr(src, "<|start_header_id|>") && strstr(src, "ipython")) return TOOL_FORMAT_LLAMA3;
    return TOOL_FORMAT_GENERIC;
}

enum tool_reasoning tool_format_detect_reasoning(const char *src)
{
    if (!src) return TOOL_REASONING_OFF;
    if (is_harmony(src)) return TOOL_REASONING_HARMONY;
    if (strstr(src, "<think>")) return TOOL_REASONING_THINK;
    /* (Gemma 4's template writes its opening marker's newline as the escape \n) */
    if (strstr(src, "<|channel>thought") && strstr(src, "<channel|>")) return TOOL_REASONING_GEMMA4;
    for (int r = TOOL_REASONING_MISTRAL; r <= TOOL_REASONING_SEED; r++)
        if (r != TOOL_REASONING_HARMONY && r != TOOL_REASONING_GEMMA4 &&
            strstr(src, tool_reasoning_open((enum tool_reasoning)r)) && strstr(src, tool_reasoning_close((enum tool_reasoning)r)))
            return (enum tool_reasoning)r;
    return TOOL_REASONING_OFF;
}

/* The markers' one table is the engine's (its lazy constraints watch them): kind r - 1. */
const char *tool_reasoning_open(enum tool_reasoning r) { return engine_reasoning_marker((int)r - 1, 0); }
const char *tool_reasoning_close(enum tool_reasoning r) { return engine_reasoning_marker((int)r - 1, 1); }


const char *tool_format_name(enum tool_format f)
{
    static const char *const names[] = {"generic", "hermes", "mistral", "llama3", "phi4", "harmony", "glm", "deepseek", "granite", "kimi",
                                         "command-r7b", "qwen3-coder", "minimax-m2", "nemotron", "deepseek-v3.2", "deepseek-v4", "gemma4", "functionary", "seed-oss"};
    return (unsigned)f < sizeof names / sizeof *names ? names[f] : "?";
}

const char *tool_format_call_prefix(enum tool_format f)
{
    switch (f) {
    case TOOL_FORMAT_HERMES: return "<tool_call>\n";
    case TOOL_FORMAT_MISTRAL: return "[TOOL_CALLS]";
    case TOOL_FORMAT_PHI4: return "<|tool_call|>";
    case TOOL_FORMAT_LLAMA3: return "";
    case TOOL_FORMAT_HARMONY: return HARMONY_CALL_PREFIX;
    case TOOL_FORMAT_DEEPSEEK: return TOOL_DS_CALLS_BEGIN TOOL_DS_CALL_BEGIN;
    case TOOL_FORMAT_GRANITE: return "<|tool_call|>";
    case TOOL_FORMAT_KIMI: return TOOL_KIMI_CALLS_BEGIN TOOL_KIMI_CALL_BEGIN;
    case TOOL_FORMAT_COMMAND_R7B: return TOOL_R7B_ACTION;
    case TOOL_FORMAT_NEMOTRON: return "<TOOLCALL>";
    case TOOL_FORMAT_FUNCTIONARY: return TOOL_FUNCTIONARY_CALL;
    default: return NULL; /* (GENERIC; the XML-like formats' grammar writes their marker) */
    }
}

const char *tool_format_call_marker(enum tool_format f)
{
    switch (f) {
    case TOOL_FORMAT_HERMES: return "<tool_call>";
    case TOOL_FORMAT_MISTRAL: return "[TOOL_CALLS]";
    case TOOL_FORMAT_PHI4: return "<|tool_call|>";
    case TOOL_FORMAT_HARMONY: return HARMONY_CALL_MARKER;
    case TOOL_FORMAT_GLM: return "<tool_call>";
    case TOOL_FORMAT_DEEPSEEK: return TOOL_DS_CALLS_BEGIN;
    case TOOL_FORMAT_GRANITE: return "<|tool_call|>";
    case TOOL_FORMAT_KIMI: return TOOL_KIMI_CALLS_BEGIN;
    case TOOL_FORMAT_COMMAND_R7B: return TOOL_R7B_ACTION;
    case TOOL_FORMAT_QWEN_XML: return "<tool_call>";
    case TOOL_FORMAT_MINIMAX: return TOOL_MINIMAX_CALLS;
    case TOOL_FORMAT_NEMOTRON: return "<TOOLCALL>";
    case TOOL_FORMAT_DSML: return TOOL_DSML_CALLS;
    case TOOL_FORMAT_DSML_V4: return TOOL_DSML_V4_CALLS;
    case TOOL_FORMAT_GEMMA4: return TOOL_GEMMA4_CALL;
    case TOOL_FORMAT_FUNCTIONARY: return TOOL_FUNCTIONARY_CALL;
    case TOOL_FORMAT_SEED_OSS: return TOOL_SEED_CALL;
    default: return NULL;
    }
}

const char *tool_format_call_close(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES ? "\n</tool_call>" : f == TOOL_FORMAT_PHI4 ? "<|/tool_call|>" : NULL;
}

const char *tool_format_next_call(enum tool_format f)
{
    return f == TOOL_FORMAT_HERMES ? "\n<tool_call>\n" : f == TOOL_FORMAT_PHI4 ? "<|tool_call|>" : NULL;
}

const char *tool_format_args_key(enum tool_format f)
{
    return f == TOOL_FORMAT_LLAMA3 || f == TOOL_FORMAT_COMMAND_R7B ? "parameters" : "arguments";
}

const char *tool_format_name_key(enum tool_format f) { return f == TOOL_FORMAT_COMMAND_R7B ? "tool_name" : "name"; }

char *tool_format_tools_prompt(enum tool_prompt p, const char *functions_json)
{
#define BAR "\xef\xbd\x9c"
#define SP "\xe2\x96\x81"
    static const char head[] = "You can call these tools (JSON Schema of each function's arguments):\n";
    static const char v31[] = "\n\nTo call tools, write exactly:\n<" BAR "tool" SP "calls" SP "begin" BAR "><" BAR "tool" SP "call"
                              SP "begin" BAR ">FUNCTION_NAME<" BAR "tool" SP "sep" BAR ">{ARGUMENTS AS JSON}<" BAR "tool" SP "call" SP
                              "end" BAR "><" BAR "tool" SP "calls" SP "end" BAR ">\nwith one <" BAR "tool" SP "call" SP "begin" BAR
                              "> ... <" BAR "tool" SP "call" SP "end" BAR "> for each call.";
    static const char r1[] = "\n\nTo call tools, write exactly:\n<" BAR "tool" SP "calls" SP "begin" BAR "><" BAR "tool" SP "call"
                             SP "begin" BAR ">function<" BAR "tool" SP "sep" BAR ">FUNCTION_NAME\n```json\n{ARGUMENTS AS JSON}\n```<"
                             BAR "tool" SP "call" SP "end" BAR "><" BAR "tool" SP "calls" SP "end" BAR ">\nwith one <" BAR "tool" SP
                             "call" SP "begin" BAR "> ... <" BAR "tool" SP "call" SP "end" BAR "> for each call.";
#undef BAR
#undef SP
    const char *how = p == TOOL_PROMPT_DEEPSEEK_R1 ? r1 : v31;
    const size_t n = strlen(head) + strlen(functions_json) + strlen(how) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s", head, functions_json, how);
    return s;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

void tool_parsed_free(struct tool_parsed *o)
{
    free(o->reasoning);
    free(o->content);
    for (int i = 0; i < o->n_calls; i++) {
        free(o->calls[i].name);
        free(o->calls[i].args);
    }
    free(o->calls);
    memset(o, 0, sizeof *o);
}

int tool_parse(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *text, size_t n,
               int final, struct tool_parsed *out)
{
    return tool_parse_typed(f, tools, reasoning, think_open, max_calls, NULL, text, n, final, out);
}

int tool_parse_typed(enum tool_format f, int tools, int reasoning, int think_open, int max_calls, const char *types,
                     const char *text, size_t n, int final, struct tool_parsed *out)
{
    memset(out, 0, sizeof *out);
    struct tool_stream *ts;
    int fail = tool_stream_new(f, tools, reasoning, think_open, max_calls, &ts) || tool_stream_arg_types(ts, types) ||
               tool_stream_feed(ts, text, n, final);
    if (!fail) {
        struct tool_view v;
        tool_stream_view(ts, &v);
        out->has_reasoning = v.has_reasoning;
        out->reasoning = dup_n(v.reasoning, v.reasoning_len), out->reasoning_len = v.reasoning_len;
        out->content = dup_n(v.content, v.content_len), out->content_len = v.content_len;
        out->calls = v.n_calls ? calloc((size_t)v.n_calls, sizeof *out->calls) : NULL;
        fail = !out->reasoning || !out->content || (v.n_calls && !out->calls);
        for (int k = 0; k < v.n_calls && !fail; k++) {
            struct tool_view_call c;
            tool_stream_call(ts, k, &c);
            struct tool_parsed_call *o = &out->calls[k];
            out->n_calls = k + 1;
            o->name = dup_n(c.name, strlen(c.name));
            o->args = dup_n(c.args, c.args_len);
            o->args_len = c.args_len, o->complete = c.complete;
            fail = !o->name || !o->args;
        }
    }
    tool_stream_free(ts);
    if (fail) tool_parsed_free(out);
    return fail ? -1 : 0;
}

/* The one kind (tool_stream_arg_types' T) a property's schema gives its raw value, or 0: 's' when
 * its type is "string" (or a list of that one) or it is an enum of strings only; 'b' for
 * "boolean", 'z' for "null". */
static char arg_kind(const cJSON *schema)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(schema, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(schema, "enum");
    if (cJSON_IsArray(type) && cJSON_GetArraySize(type) == 1) type = type->child;
    if (!type && cJSON_IsArray(en) && en->child) {
        for (const cJSON *v = en->child; v; v = v->next)
            if (!cJSON_IsString(v)) return 0;
        return 's';
    }
    if (!cJSON_IsString(type)) return 0;
    return !strcmp(type->valuestring, "string") ? 's' : !strcmp(type->valuestring, "boolean") ? 'b'
         : !strcmp(type->valuestring, "null")   ? 'z' : 0;
}

char *tool_format_arg_types(const cJSON *tools)
{
    size_t cap = 64, len = 1;
    char *out = malloc(cap);
    if (!out) return NULL;
    out[0] = '\x1e', out[1] = 0;
    for (const cJSON *t = cJSON_IsArray(tools) ? tools->child : NULL; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *props = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(fn, "parameters"),
                                                              "properties");
        if (!cJSON_IsString(name) || strpbrk(name->valuestring, "\x1e\x1f") || !cJSON_IsObject(props)) continue;
        for (const cJSON *p = props->child; p; p = p->next) {
            const char kind = arg_kind(p);
            if (!kind || !p->string || strpbrk(p->string, "\x1e\x1f")) continue;
            const size_t need = len + strlen(name->valuestring) + strlen(p->string) + 5;
            if (need > cap) {
                char *grown = realloc(out, cap = need * 2);
                if (!grown) return free(out), NULL;
                out = grown;
            }
            len += (size_t)snprintf(out + len, cap - len, "%s\x1f%s\x1f%c\x1e", name->valuestring, p->string, kind);
        }
    }
    return out;
}
