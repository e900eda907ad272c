/* server/http_tools.c - OpenAI tool calling (tools, tool_choice, parallel_tool_calls) in a
 * format that any model can follow and that can never fail to parse, llama.cpp's "generic"
 * format: the tools and the reply format are described in the system message, and the whole
 * reply is constrained (a JSON Schema, engine/grammar/) to one JSON object, either
 *   {"tool_calls": [{"name": NAME, "arguments": {...}}, ...]}   (each call valid for its tool)
 * or {"response": "text for the user"}                          (tool_choice "auto" only).
 * The history is written the same way: an assistant message's tool_calls become the JSON the
 * model would have produced, a "tool" message a user turn {"tool_response": {...}}. The reply
 * is parsed back into OpenAI's message.tool_calls (finish_reason "tool_calls") or content.
 * Not here (docs/tools.md): the models' own tool formats (Hermes <tool_call>, Llama 3 JSON,
 * Mistral [TOOL_CALLS]) and their templates' `tools` variable; streaming a reply token by token
 * (a tool-calling stream sends the reply whole in its last chunk); tools over gRPC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"

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

/* The schema of one call of function f: {"name": const, "arguments": its parameters}. */
static cJSON *call_schema(const cJSON *f)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    cJSON *s = cJSON_CreateObject(), *props = cJSON_AddObjectToObject(s, "properties"), *req = cJSON_CreateArray();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *n = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(n, "const", name->valuestring);
    if (params && !cJSON_IsNull(params)) cJSON_AddItemToObject(props, "arguments", cJSON_Duplicate(params, 1));
    else cJSON_AddItemToObject(props, "arguments", cJSON_Parse("{\"type\": \"object\", \"properties\": {}}"));
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString("arguments"));
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
        cJSON_AddItemToArray(any, call_schema(f));
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

/* The system text that tells the model the tools and the reply format. */
static char *system_text(const cJSON *tools, const char *only, int required)
{
    cJSON *list = cJSON_CreateArray();
    for (const cJSON *t = tools->child; t; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!only || !strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, only))
            cJSON_AddItemToArray(list, cJSON_Duplicate(f, 1));
    }
    char *fs = cJSON_PrintUnformatted(list);
    cJSON_Delete(list);
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

enum status http_tools_parse(const cJSON *o, struct http_request *q)
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
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        if (!cJSON_IsString(name) || !valid_name(name->valuestring))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", i);
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'tools[%d].function.parameters' must be a JSON Schema object", i);
        for (const cJSON *u = tools->child; u != t; u = u->next)
            if (!strcmp(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(u, "function"), "name")->valuestring,
                        name->valuestring))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'tools': the function '%s' is declared twice (tools[%d])",
                                     name->valuestring, i);
    }
    const char *only = NULL;
    int required = 0;
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
    cJSON *schema = reply_schema(tools, only, required, par ? cJSON_IsTrue(par) : 1);
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
    return STATUS_OK;
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

int http_tools_reply(const char *text, size_t n, const char *call_id_base, cJSON *message)
{
    char *s = malloc(n + 1);
    cJSON *o = NULL;
    if (s) {
        memcpy(s, text, n);
        s[n] = 0;
        o = cJSON_Parse(s);
    }
    free(s);
    const cJSON *calls = o ? cJSON_GetObjectItemCaseSensitive(o, "tool_calls") : NULL;
    const cJSON *resp = o ? cJSON_GetObjectItemCaseSensitive(o, "response") : NULL;
    int is_calls = cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0;
    if (is_calls) {
        cJSON_AddNullToObject(message, "content");
        cJSON *list = cJSON_AddArrayToObject(message, "tool_calls");
        int k = 0;
        for (const cJSON *c = calls->child; c; c = c->next, k++) {
            cJSON *e = cJSON_CreateObject();
            char id[96];
            snprintf(id, sizeof id, "call_%s_%d", call_id_base, k);
            cJSON_AddNumberToObject(e, "index", k);
            cJSON_AddStringToObject(e, "id", id);
            cJSON_AddStringToObject(e, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(e, "function");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
            cJSON_AddStringToObject(f, "name", cJSON_IsString(name) ? name->valuestring : "");
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(c, "arguments"));
            cJSON_AddStringToObject(f, "arguments", args ? args : "{}");
            free(args);
            cJSON_AddItemToArray(list, e);
        }
    } else if (cJSON_IsString(resp)) {
        cJSON_AddStringToObject(message, "content", resp->valuestring);
    } else { /* cut short (max_tokens): the raw text, as it came */
        char *raw = malloc(n + 1);
        if (raw) {
            memcpy(raw, text, n);
            raw[n] = 0;
            cJSON_AddStringToObject(message, "content", raw);
        }
        free(raw);
    }
    cJSON_Delete(o);
    return is_calls;
}
