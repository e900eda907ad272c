/* server/http_tools.c - OpenAI tool calling (tools, tool_choice, parallel_tool_calls) and the
 * request side of Jinja chat templates (their render context: http_tools_context.c). Two ways (docs/tools.md):
 *  - the model's own format (tool_format.h: Hermes <tool_call>, Mistral [TOOL_CALLS], Llama 3
 *    JSON, Phi-4 <|tool_call|>) when the served Jinja template has one: the template renders
 *    the tools, the assistant messages' tool_calls and the tool messages itself (the context is
 *    built here as transformers' apply_chat_template gets it, arguments as objects). Under
 *    tool_choice required or a named function the call's opening marker is written after the
 *    prompt and the call's JSON is constrained (one call; Mistral: a list); under auto the
 *    output is free until the model writes the marker, then the call is constrained (a lazy
 *    grammar; Llama 3's format, which has no marker: from the reply's first `{`; reasoning
 *    templates: the marker is watched for after </think>).
 *  - otherwise llama.cpp's "generic" format, which any model can follow and which can never
 *    fail to parse: the tools and the reply format are described in the system message, and
 *    the whole reply is constrained (a JSON Schema, engine/grammar/) to one JSON object, either
 *      {"tool_calls": [{"name": NAME, "arguments": {...}}, ...]}   (each call valid for its tool)
 *    or {"response": "text for the user"}                          (tool_choice "auto" only).
 *    The history is written the same way: an assistant message's tool_calls become the JSON the
 *    model would have produced, a "tool" message a user turn {"tool_response": {...}}.
 * Replies are parsed back (tool_format.c) into OpenAI's message.tool_calls (finish_reason
 * "tool_calls"), content and reasoning_content. gRPC's Chat RPCs come here through chat_tools.c
 * (their request written as an OpenAI chat request). Not here: streaming (the chunks:
 * http_openai_out.c). Tests: tests/server/test_tools.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "grammar.h"
#include "http_internal.h"
#include "tool_format.h"
#include "tool_stream_impl.h" /* DeepSeek's markers */

#define TOOLS_MAX 128              /* functions in one request */
#define TOOLS_MAX_NAME 64          /* bytes of a function's name */

static char *dup_json(const cJSON *v) { return cJSON_PrintUnformatted(v); }

/* A function name as OpenAI allows it: [A-Za-z0-9_-], 1..64 bytes. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > TOOLS_MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || s[i] == '-' || (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z') ||
              (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

/* Function f's parameters schema (a copy), or an object without properties when it has none. */
static cJSON *params_schema(const cJSON *f)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    return params && !cJSON_IsNull(params) ? cJSON_Duplicate(params, 1)
                                           : cJSON_Parse("{\"type\": \"object\", \"properties\": {}}");
}

/* The schema of one call of function f in format fmt: {name_key: const, args_key: its
 * parameters}, Command R7B's with its "tool_call_id" (digits, as its template numbers calls) first. */
static cJSON *call_schema(const cJSON *f, enum tool_format fmt)
{
    const char *name_key = tool_format_name_key(fmt), *args_key = tool_format_args_key(fmt);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_CreateArray();
    cJSON_AddStringToObject(s, "type", "object");
    if (fmt == TOOL_FORMAT_COMMAND_R7B) {
        cJSON *id = cJSON_AddObjectToObject(props, "tool_call_id");
        cJSON_AddStringToObject(id, "type", "string");
        cJSON_AddStringToObject(id, "pattern", "^[0-9]{1,4}$");
        cJSON_AddItemToArray(req, cJSON_CreateString("tool_call_id"));
    }
    cJSON *n = cJSON_AddObjectToObject(props, name_key);
    cJSON_AddStringToObject(n, "const", name->valuestring);
    cJSON_AddItemToObject(props, args_key, params_schema(f));
    cJSON_AddItemToArray(req, cJSON_CreateString(name_key));
    cJSON_AddItemToArray(req, cJSON_CreateString(args_key));
    cJSON_AddItemToObject(s, "required", req);
    cJSON_AddFalseToObject(s, "additionalProperties");
    return s;
}

/* The reply's schema: the calls (of the chosen function, or of any), or a response. */
static cJSON *reply_schema(const cJSON *tools, const char *only, int required, int parallel)
{
    cJSON *calls = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(calls, "properties");
    cJSON_AddStringToObject(calls, "type", "object");
    cJSON *arr = cJSON_AddObjectToObject(props, "tool_calls");
    cJSON_AddStringToObject(arr, "type", "array");
    cJSON *any = cJSON_AddArrayToObject(cJSON_AddObjectToObject(arr, "items"), "anyOf");
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (only && strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, only)) continue;
        cJSON_AddItemToArray(any, call_schema(f, TOOL_FORMAT_GENERIC));
    }
    cJSON_AddNumberToObject(arr, "minItems", 1);
    if (!parallel) cJSON_AddNumberToObject(arr, "maxItems", 1);
    cJSON *req = cJSON_AddArrayToObject(calls, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("tool_calls"));
    cJSON_AddFalseToObject(calls, "additionalProperties");
    if (required) return calls;
    cJSON *resp = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"response\": {\"type\": \"string\"}}, "
                              "\"required\": [\"response\"], \"additionalProperties\": false}");
    cJSON *s = cJSON_CreateObject(), *of = cJSON_AddArrayToObject(s, "anyOf");
    cJSON_AddItemToArray(of, calls);
    cJSON_AddItemToArray(of, resp);
    return s;
}

/* Harmony's calls (tool_harmony.c), after " to=functions.": the function's name and the rest of
 * the header in one of the shapes gpt-oss meets (the recipient in the channel's header, as
 * OpenAI's harmony guide shows the model writing it; in the role's, as the HF template and the
 * openai-harmony renderer write a call back), then its arguments: one branch per shape and
 * function, each with its text (grammar.h GRAMMAR_SCHEMA_PREFIX in anyOf branches). One call:
 * the model ends its reply with <|call|> after it. */
static cJSON *harmony_schema(const cJSON *tools, const char *only, int required)
{
    static const char *const shapes[] = {" <|constrain|>json<|message|>", "<|channel|>commentary json<|message|>",
                                         "<|channel|>commentary <|constrain|>json<|message|>"};
    /* A required call is opened by the prompt or the grammar as <|channel|>commentary to=...: the
     * channel is written, so only the first shape can follow. */
    const size_t n_shapes = required ? 1 : sizeof shapes / sizeof *shapes;
    cJSON *s = cJSON_CreateObject(), *any = s ? cJSON_AddArrayToObject(s, "anyOf") : NULL;
    /* '<' only as \u003c in the arguments' free strings: a marker token (<|call|>, <|end|>) would
     * otherwise be seven characters of a string there, and end the message in the parser. */
    if (any && !cJSON_AddStringToObject(s, GRAMMAR_SCHEMA_ESCAPE, "<")) any = NULL;
    if (!any) {
        cJSON_Delete(s);
        return NULL; /* (set_schema: out of memory) */
    }
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        if (only && strcmp(name, only)) continue;
        for (size_t k = 0; k < n_shapes; k++) {
            char text[TOOLS_MAX_NAME + 64];
            snprintf(text, sizeof text, "%s%s", name, shapes[k]);
            cJSON *b = params_schema(fn);
            if (!b || !cJSON_AddStringToObject(b, GRAMMAR_SCHEMA_PREFIX, text) || !cJSON_AddItemToArray(any, b)) {
                cJSON_Delete(b);
                cJSON_Delete(s);
                return NULL;
            }
        }
    }
    return s;
}

/* One anyOf branch per function of tools (the named one only, when `only`) into any: its whole
 * parameters schema after its text, fmt (printf) of its name and index. 0 when out of memory. */
static int add_branches(cJSON *any, const cJSON *tools, const char *only, const char *fmt, int index)
{
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
        if (only && strcmp(name, only)) continue;
        char text[TOOLS_MAX_NAME + 64];
        snprintf(text, sizeof text, fmt, name, index); /* (fmt reads the index or not) */
        cJSON *b = params_schema(fn);
        if (!b || !cJSON_AddStringToObject(b, GRAMMAR_SCHEMA_PREFIX, text) || !cJSON_AddItemToArray(any, b)) {
            cJSON_Delete(b);
            return 0;
        }
    }
    return 1;
}

/* DeepSeek's calls (tool_stream_blocks.c tool_stream_read_deepseek), after <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>
 * (the prompt's when a call is required; under auto the trigger is <｜tool▁calls▁begin｜> and the
 * schema writes <｜tool▁call▁begin｜> itself): one branch per function, its text V3.1's
 * `NAME<｜tool▁sep｜>` or R1's `function<｜tool▁sep｜>NAME\n```json\n` (fenced), then its
 * arguments (the whole parameters schema: strict or not); each call closed (R1's fence first),
 * with parallel calls more opened after it (R1's on a new line), and the list ended, as the
 * templates write them; the model then ends its turn. '<' only as \u003c in free strings: no
 * marker inside an argument. Kimi-K2's (kimi): the same with its markers, a branch's text
 * `functions.NAME:INDEX<|tool_call_argument_begin|>` with INDEX the conversation's next call's
 * (the template's counter), one more for each parallel call after it (at most 16: the grammar's
 * "numbered" repeat). */
static cJSON *deepseek_schema(const cJSON *tools, const char *only, int parallel, int fenced, int lazy, int kimi,
                              int index)
{
    cJSON *s = cJSON_CreateObject(), *any = s ? cJSON_AddArrayToObject(s, "anyOf") : NULL;
    cJSON *rep = any && cJSON_AddStringToObject(s, GRAMMAR_SCHEMA_ESCAPE, "<") ? cJSON_AddObjectToObject(s, GRAMMAR_SCHEMA_REPEAT)
                                                                             : NULL;
    const char *close = kimi ? TOOL_KIMI_CALL_END : fenced ? "\n```" TOOL_DS_CALL_END : TOOL_DS_CALL_END;
    const char *open = kimi ? TOOL_KIMI_CALL_BEGIN : fenced ? "\n" TOOL_DS_CALL_BEGIN : TOOL_DS_CALL_BEGIN;
    cJSON *num = kimi ? cJSON_CreateIntArray((const int[]){index, parallel ? 16 : 1}, 2) : NULL;
    int ok = rep && cJSON_AddStringToObject(rep, "close", close) &&
             (!(parallel || kimi) || cJSON_AddStringToObject(rep, "open", open)) &&
             cJSON_AddStringToObject(rep, "end", kimi ? TOOL_KIMI_CALLS_END : TOOL_DS_CALLS_END) &&
             (!kimi || (num && cJSON_AddItemToObject(rep, "numbered", num))) &&
             (!lazy || cJSON_AddStringToObject(s, GRAMMAR_SCHEMA_PREFIX, kimi ? TOOL_KIMI_CALL_BEGIN : TOOL_DS_CALL_BEGIN));
    if (!ok && num && !(rep && cJSON_GetObjectItemCaseSensitive(rep, "numbered") == num)) cJSON_Delete(num);
    /* (Kimi's "%%d": the grammar numbers it) */
    if (ok) ok = add_branches(any, tools, only, kimi ? "functions.%s:%%d" TOOL_KIMI_ARGS
                                                : fenced ? "function" TOOL_DS_SEP "%s\n```json\n" : "%s" TOOL_DS_SEP, index);
    if (!ok) {
        cJSON_Delete(s);
        return NULL; /* (set_schema: out of memory) */
    }
    return s;
}

/* functionary v3.1's calls, after `<function=` (the prompt's when a call is required, the trigger
 * under auto): one branch per function, its text `NAME>`, then its arguments (the whole parameters
 * schema: strict or not); with parallel calls each closed by `</function>` and more after it,
 * each opened by `<function=` (the template writes them back to back). A reply that ends after a
 * call's arguments closes it (tool_stream.c). '<' only as \u003c in free strings: no
 * tag inside an argument. */
static cJSON *functionary_schema(const cJSON *tools, const char *only, int parallel)
{
    cJSON *s = cJSON_CreateObject(), *any = s ? cJSON_AddArrayToObject(s, "anyOf") : NULL, *rep = NULL;
    /* (one call: its arguments, then the model ends the reply, which closes it for the parser) */
    int ok = any && cJSON_AddStringToObject(s, GRAMMAR_SCHEMA_ESCAPE, "<") &&
             (!parallel || ((rep = cJSON_AddObjectToObject(s, GRAMMAR_SCHEMA_REPEAT)) &&
                            cJSON_AddStringToObject(rep, "close", TOOL_FUNCTIONARY_CALL_END) &&
                            cJSON_AddStringToObject(rep, "open", TOOL_FUNCTIONARY_CALL)));
    if (ok) ok = add_branches(any, tools, only, "%s>", 0);
    if (!ok) {
        cJSON_Delete(s);
        return NULL; /* (set_schema: out of memory) */
    }
    return s;
}

char *http_tools_functionary_schema(const cJSON *tools, const char *only, int parallel)
{
    cJSON *s = functionary_schema(tools, only, parallel);
    char *text = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    return text;
}

char *http_tools_deepseek_schema(const cJSON *tools, const char *only, int parallel, int fenced, int lazy, int kimi,
                                 int index)
{
    cJSON *s = deepseek_schema(tools, only, parallel, fenced, lazy, kimi, index);
    char *text = s ? cJSON_PrintUnformatted(s) : NULL;
    cJSON_Delete(s);
    return text;
}

/* The schema of a required call in the model's own format f (after its opening marker): one
 * call of the chosen function or of any, and with parallel calls in the hermes and phi4
 * formats, more calls after it, each closed and opened as the template writes them; Mistral's
 * is a list of calls; DeepSeek's (deepseek_schema: lazy, the schema of auto's trigger) its
 * markers around each. */
static cJSON *native_schema(enum tool_format f, const cJSON *tools, const char *only, int required, int parallel,
                            const struct http_chat_caps *caps, int index)
{
    if (f == TOOL_FORMAT_HARMONY) return harmony_schema(tools, only, required);
    if (f == TOOL_FORMAT_FUNCTIONARY) return functionary_schema(tools, only, parallel);
    if (f == TOOL_FORMAT_DEEPSEEK || f == TOOL_FORMAT_KIMI)
        return deepseek_schema(tools, only, parallel, caps->ds_fenced, !required, f == TOOL_FORMAT_KIMI, index);
    cJSON *one = cJSON_CreateObject(), *any = cJSON_AddArrayToObject(one, "anyOf");
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (only && strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, only)) continue;
        cJSON_AddItemToArray(any, call_schema(fn, f));
    }
    if (!tool_format_is_list(f)) {
        if (parallel && tool_format_call_close(f)) { /* more calls may follow, each closed */
            cJSON *rep = cJSON_AddObjectToObject(one, GRAMMAR_SCHEMA_REPEAT);
            cJSON_AddStringToObject(rep, "close", tool_format_call_close(f));
            cJSON_AddStringToObject(rep, "open", tool_format_next_call(f));
        }
        return one;
    }
    cJSON *arr = cJSON_CreateObject();
    cJSON_AddStringToObject(arr, "type", "array");
    cJSON_AddItemToObject(arr, "items", one);
    cJSON_AddNumberToObject(arr, "minItems", 1);
    if (!parallel) cJSON_AddNumberToObject(arr, "maxItems", 1);
    return arr;
}

/* The tools the template sees: all of them, or the named one. */
static cJSON *chosen_tools(const cJSON *tools, const char *only)
{
    cJSON *list = cJSON_CreateArray();
    for (const cJSON *t = tools->child; t && list; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!only || !strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, only))
            cJSON_AddItemToArray(list, cJSON_Duplicate(t, 1));
    }
    return list;
}

/* Sets q's constraint to the source text (kind; freed here); lazy when trigger is not NULL: the
 * constraint applies once the output holds the trigger (engine.h constraint_trigger_len). */
static enum status set_constraint(struct http_request *q, enum constraint_kind kind, char *text, const char *trigger)
{
    size_t t = trigger ? strlen(trigger) : 0, n = text ? strlen(text) : 0;
    char *src = text ? malloc(t + n + 1) : NULL;
    if (src) {
        memcpy(src, trigger ? trigger : "", t);
        memcpy(src + t, text, n + 1);
    }
    free(text);
    if (!src) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    struct gen_request *r = &q->r;
    r->constraint = src;
    r->constraint_len = t + n;
    r->params.constraint_kind = kind;
    r->params.constraint = src;
    r->params.constraint_len = r->constraint_len;
    r->params.constraint_trigger_len = t;
    return STATUS_OK;
}

/* set_constraint with the JSON Schema of schema (deleted here). */
static enum status set_schema(struct http_request *q, cJSON *schema, const char *trigger)
{
    char *json = schema ? cJSON_PrintUnformatted(schema) : NULL;
    cJSON_Delete(schema);
    return set_constraint(q, CONSTRAINT_JSON_SCHEMA, json, trigger);
}

/* Tools in the model's own format: the template renders them; a required call is opened in the
 * prompt and constrained; an optional one (auto) is constrained from its opening marker on (a
 * lazy grammar: the output is free until the model writes the marker; in the llama3 format,
 * whose call is the whole reply, when the reply opens with `{`), the marker watched for only
 * after a reasoning template's </think>. GLM's calls are not JSON: a GBNF grammar of them
 * (http_tools_glm.c), from the first byte when a call is required (its own optional <think>). */
static enum status native_tools(const cJSON *o, const cJSON *tools, const char *only, int required, int parallel,
                                const struct http_chat_caps *caps, struct http_request *q)
{
    enum tool_format f = (enum tool_format)caps->tool_format;
    /* Kimi-K2's next call index: the calls of the history when its template counts them across the
     * conversation, else 0 (the index within the message) */
    int index = 0;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    for (const cJSON *m = caps->kimi_counter && cJSON_IsArray(msgs) ? msgs->child : NULL; m; m = m->next) {
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        if (cJSON_IsArray(calls)) index += cJSON_GetArraySize(calls);
    }
    cJSON *list = chosen_tools(tools, only);
    enum status st = list ? http_tools_context(o, list, caps, q) : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    cJSON_Delete(list);
    if (st == STATUS_OK && tool_format_is_xml(f) && !(q->arg_types = tool_format_arg_types(tools)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    if (tool_format_is_xml(f) && st == STATUS_OK && required) { /* GBNF (not JSON): its grammar from the first byte */
        st = set_constraint(q, CONSTRAINT_GRAMMAR, http_tools_glm_grammar(f, tools, only, parallel, 0), NULL);
    } else if (st == STATUS_OK && required && caps->reasoning && *tool_format_call_prefix(f)) {
        /* A reasoning template: the model may think first, so the marker is the grammar's to
         * write (its schema's prefix), not the prompt's; gen_prompt.c (constrain_around_think)
         * makes it an opening constraint: <think> ... </think> then the call, or the call. */
        cJSON *schema = native_schema(f, tools, only, required, parallel, caps, index);
        if (schema) cJSON_AddStringToObject(schema, GRAMMAR_SCHEMA_PREFIX, tool_format_call_prefix(f));
        st = set_schema(q, schema, NULL);
    } else if (st == STATUS_OK && required) {
        if (!(q->r.prefill = strdup(tool_format_call_prefix(f))))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        st = set_schema(q, native_schema(f, tools, only, required, parallel, caps, index), NULL);
    } else if (st == STATUS_OK) {
        /* The trigger (engine.h TRIGGER_*): a reasoning template's is armed after </think> (a
         * marker inside the reasoning does not trigger; gen_prompt says when the prompt opened
         * it); Llama 3's call has no marker but is the whole reply: the reply's first `{`.
         * Qwen3-Coder's calls open with <tool_call> or, bare, with <function=: two markers, the
         * grammar reads the one that came. */
        char trigger[REQUEST_MAX_TRIGGER_BYTES + 1];
        const int qwen = f == TOOL_FORMAT_QWEN_XML;
        int flags = (caps->reasoning ? TRIGGER_MAY_REASON | (caps->reasoning - 1) << TRIGGER_MARKERS_SHIFT : 0) |
                    (f == TOOL_FORMAT_LLAMA3 ? TRIGGER_ANCHORED : 0) | (qwen ? TRIGGER_READS_MARKER : 0);
        const int head = engine_trigger_header(flags, trigger);
        snprintf(trigger + head, sizeof trigger - (size_t)head, "%s%s", f == TOOL_FORMAT_LLAMA3 ? "{" : tool_format_call_marker(f),
                 qwen ? TRIGGER_MARKER_SEP_STR "<function=" : "");
        if (tool_format_is_xml(f))
            st = set_constraint(q, CONSTRAINT_GRAMMAR, http_tools_glm_grammar(f, tools, only, parallel, qwen ? 2 : 1), trigger);
        else st = set_schema(q, native_schema(f, tools, only, required, parallel, caps, index), trigger);
    }
    q->tools = 1;
    q->tool_format = (int)f;
    q->max_calls = parallel ? 0 : 1;
    return st;
}

char *http_tools_functions_json(const cJSON *tools, const char *only)
{
    cJSON *list = cJSON_CreateArray();
    for (const cJSON *t = tools->child; t && list; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!only || !strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, only))
            cJSON_AddItemToArray(list, cJSON_Duplicate(f, 1));
    }
    char *fs = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(list);
    return fs;
}

static char *system_text(const cJSON *tools, const char *only, int required)
{
    char *fs = http_tools_functions_json(tools, only);
    if (!fs) return NULL;
    static const char head[] = "You can call these tools (JSON Schema of each function's arguments):\n";
    static const char call[] = "\n\nReply with one JSON object. To call tools: {\"tool_calls\": [{\"name\": "
                               "\"<function name>\", \"arguments\": {<arguments>}}]}";
    static const char answer[] = ". To answer the user directly: {\"response\": \"<your answer>\"}";
    size_t n = strlen(head) + strlen(fs) + strlen(call) + strlen(answer) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s%s%s", head, fs, call, required ? "." : answer);
    free(fs);
    return s;
}

enum status http_tools_parse(const cJSON *o, const struct http_chat_caps *caps, struct http_request *q)
{
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(o, "parallel_tool_calls");
    if (cJSON_IsNull(tools)) tools = NULL;
    if (cJSON_IsNull(choice)) choice = NULL;
    if (par && !cJSON_IsNull(par) && !cJSON_IsBool(par))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'parallel_tool_calls' must be a boolean");
    if (tools && !cJSON_IsArray(tools)) return status_errorf(STATUS_INVALID_ARGUMENT, "'tools' must be a list");
    int n = tools ? cJSON_GetArraySize(tools) : 0;
    if (n > TOOLS_MAX) return status_errorf(STATUS_INVALID_ARGUMENT, "'tools': at most %d functions, got %d", TOOLS_MAX, n);
    if (!q->is_chat && (n || choice))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'tools' and 'tool_choice' are for /v1/chat/completions");
    int i = 0;
    for (const cJSON *t = tools ? tools->child : NULL; t; t = t->next, i++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!cJSON_IsObject(t) || !cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsObject(f))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d]' must be {\"type\": \"function\", \"function\": {...}}", i);
        /* Every field of a tool is read or refused by name (strict: the grammar enforces the
         * schema either way, so false and true are both honoured). */
        static const char *const tool_fields[] = {"type", "function", NULL};
        static const char *const fn_fields[] = {"name", "description", "parameters", "strict", NULL};
        char where[48];
        snprintf(where, sizeof where, "tools[%d]", i);
        enum status fst = http_json_only_fields(t, where, tool_fields);
        snprintf(where, sizeof where, "tools[%d].function", i);
        if (fst == STATUS_OK) fst = http_json_only_fields(f, where, fn_fields);
        if (fst != STATUS_OK) return fst;
        const cJSON *strict = cJSON_GetObjectItemCaseSensitive(f, "strict");
        if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.strict' must be a boolean", i);
        if (cJSON_IsTrue(strict) && caps && caps->jinja && tool_format_is_xml((enum tool_format)caps->tool_format))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.strict': true needs calls constrained to "
                                 "the whole schema; this model's tool format (%s) is constrained to the declared "
                                 "names, keys and value types only", i, http_tools_xml_label(caps->tool_format));
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsString(name) || !valid_name(name->valuestring))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.parameters' must be a JSON Schema object", i);
        const char *key_end = NULL;
        const char *bad_key = caps && caps->jinja ? http_tools_xml_unwritable_key(caps->tool_format, params, &key_end) : NULL;
        if (bad_key)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.parameters.properties': the key '%.64s' "
                                 "cannot be written in this model's tool format (the %s format ends a key at '%s')", i, bad_key,
                                 tool_format_name((enum tool_format)caps->tool_format), key_end);
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"), "name")->valuestring,
                        name->valuestring))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'tools': the function '%s' is declared twice (tools[%d])",
                                     name->valuestring, i);
    }
    const char *only = NULL;
    int required = 0;
    if (cJSON_IsObject(choice)) { /* {"type": "function", "function": {"name": ...}}, nothing else */
        static const char *const choice_fields[] = {"type", "function", NULL}, *const function_fields[] = {"name", NULL};
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
        enum status st = http_json_only_fields(choice, "tool_choice", choice_fields);
        if (st == STATUS_OK && cJSON_IsObject(f)) st = http_json_only_fields(f, "tool_choice.function", function_fields);
        if (st != STATUS_OK) return st;
        if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "function")))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tool_choice.type' must be \"function\"");
    }
    if (choice) {
        const cJSON *f = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "function") : NULL;
        const cJSON *fname = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")) return STATUS_OK; /* no tools */
        if (cJSON_IsString(choice) && !strcmp(choice->valuestring, "required")) required = 1;
        else if (cJSON_IsString(fname)) required = 1, only = fname->valuestring;
        else if (!(cJSON_IsString(choice) && !strcmp(choice->valuestring, "auto")))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tool_choice' must be none, auto, required or "
                                 "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        if (required && n == 0)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tool_choice' asks for a tool call but 'tools' is empty");
        int found = !only;
        for (const cJSON *t = tools ? tools->child : NULL; t && !found; t = t->next)
            found = !strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name")->valuestring,
                            only);
        if (!found)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tool_choice' names the function '%.64s', which 'tools' "
                                 "does not declare", only);
    }
    if (n == 0) return STATUS_OK;
    if (q->r.params.constraint_kind != CONSTRAINT_NONE)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'tools' with a structured output (response_format, "
                             "structured_outputs, guided_*) is not supported: the tool format is itself one");
    int parallel = par ? cJSON_IsTrue(par) : 1;
    if (caps && caps->jinja && caps->tool_format != TOOL_FORMAT_GENERIC)
        return native_tools(o, tools, only, required, parallel, caps, q);
    cJSON *schema = reply_schema(tools, only, required, parallel);
    char *src = schema ? dup_json(schema) : NULL;
    cJSON_Delete(schema);
    char *sys = system_text(tools, only, required);
    if (!src || !sys) {
        free(src);
        free(sys);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    /* The tools' text opens the system message (a new one when the chat has none). */
    struct gen_request *r = &q->r;
    if (r->n_messages > 0 && r->messages[0].role == CHAT_ROLE_SYSTEM) {
        char *old = r->messages[0].content;
        size_t len = strlen(old) + strlen(sys) + 3;
        char *joined = malloc(len);
        if (!joined) {
            free(src);
            free(sys);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        snprintf(joined, len, "%s\n\n%s", old, sys);
        free(old);
        free(sys);
        r->messages[0].content = joined;
    } else {
        struct chat_message *m = realloc(r->messages, ((size_t)r->n_messages + 1) * sizeof *m);
        if (!m) {
            free(src);
            free(sys);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        memmove(m + 1, m, (size_t)r->n_messages * sizeof *m);
        m[0] = (struct chat_message){CHAT_ROLE_SYSTEM, sys};
        r->messages = m;
        r->n_messages++;
    }
    r->constraint = src;
    r->constraint_len = strlen(src);
    r->params.constraint_kind = CONSTRAINT_JSON_SCHEMA;
    r->params.constraint = src;
    r->params.constraint_len = r->constraint_len;
    q->tools = 1;
    q->tool_format = TOOL_FORMAT_GENERIC;
    q->max_calls = parallel ? 0 : 1;
    return STATUS_OK;
}

enum status http_show_special_check(const struct request_params *p, int tools, int reasoning, const char *field)
{
    if (!p->show_special) return STATUS_OK;
    const char *with = tools ? "tools (a tool_choice other than none)"
                       : p->constraint_kind != CONSTRAINT_NONE
                           ? "a structured-output constraint (response_format, structured_outputs, guided_*)"
                       : reasoning ? "this model's reasoning separation (its chat replies are split into reasoning_content)"
                                   : NULL;
    if (!with) return STATUS_OK;
    return status_errorf(STATUS_INVALID_ARGUMENT, "%s (special tokens shown) cannot be combined with %s", field, with);
}

enum status http_tools_message(const cJSON *msg, int i, const char *role, char **content)
{
    *content = NULL;
    cJSON *out = NULL;
    if (!strcmp(role, "tool")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (!cJSON_IsString(id)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].tool_call_id' must be a string", i);
        if (!cJSON_IsString(c)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].content' must be a string (the tool's result)", i);
        out = cJSON_CreateObject();
        cJSON *r = cJSON_AddObjectToObject(out, "tool_response");
        cJSON_AddStringToObject(r, "tool_call_id", id->valuestring);
        cJSON_AddStringToObject(r, "content", c->valuestring);
    } else {
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
        if (!calls || cJSON_IsNull(calls) || (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) == 0)) return STATUS_OK;
        if (strcmp(role, "assistant") || !cJSON_IsArray(calls))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].tool_calls': a list, in assistant messages only", i);
        out = cJSON_CreateObject();
        cJSON *list = cJSON_AddArrayToObject(out, "tool_calls");
        int k = 0;
        for (const cJSON *c = calls->child; c; c = c->next, k++) {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *name = f ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            const cJSON *args = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
            cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (!cJSON_IsString(name) || !parsed) {
                cJSON_Delete(parsed);
                cJSON_Delete(out);
                return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].tool_calls[%d]' must have function.name "
                                     "and function.arguments (a string of JSON)", i, k);
            }
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", name->valuestring);
            cJSON_AddItemToObject(e, "arguments", parsed);
            cJSON_AddItemToArray(list, e);
        }
    }
    *content = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    return *content ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

void http_tools_call_id(const struct http_request *q, const char *base, int k, char *out, size_t cap)
{
    if (q->tool_format != TOOL_FORMAT_MISTRAL) {
        snprintf(out, cap, "call_%s_%d", base, k);
        return;
    }
    /* Mistral's templates keep the last 9 characters of an id and expect letters and digits. */
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    unsigned long long h = 1469598103934665603ull; /* FNV-1a of base and k */
    h = base_fnv1a_str(h, base);
    h = (h ^ (unsigned)k) * 1099511628211ull;
    size_t i = 0;
    for (; i < 9 && i + 1 < cap; i++, h /= 62) out[i] = digits[h % 62];
    if (cap) out[i] = 0;
}

int http_tools_reply(const struct http_request *q, int think_open, const char *text, size_t n,
                     const char *call_id_base, cJSON *message)
{
    struct tool_parsed p;
    if (tool_parse_typed((enum tool_format)q->tool_format, q->tools, q->reasoning, think_open, q->max_calls, q->arg_types,
                         text, n, 1, &p))
        CHECK(0, "out of memory parsing a reply");
    if (p.has_reasoning) cJSON_AddStringToObject(message, "reasoning_content", p.reasoning);
    if (p.n_calls && !p.content_len) cJSON_AddNullToObject(message, "content");
    else cJSON_AddStringToObject(message, "content", p.content);
    if (p.n_calls) {
        cJSON *list = cJSON_AddArrayToObject(message, "tool_calls");
        for (int k = 0; k < p.n_calls; k++) {
            cJSON *e = cJSON_CreateObject();
            char id[HTTP_CALL_ID_MAX];
            http_tools_call_id(q, call_id_base, k, id, sizeof id);
            cJSON_AddNumberToObject(e, "index", k);
            cJSON_AddStringToObject(e, "id", id);
            cJSON_AddStringToObject(e, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(e, "function");
            cJSON_AddStringToObject(f, "name", p.calls[k].name);
            cJSON_AddStringToObject(f, "arguments", p.calls[k].args);
            cJSON_AddItemToArray(list, e);
        }
    }
    int calls = p.n_calls > 0;
    tool_parsed_free(&p);
    return calls;
}
