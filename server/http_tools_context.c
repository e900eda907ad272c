/* server/http_tools_context.c - the render context of a Jinja chat template: the request's
 * messages, tools and chat_template_kwargs as transformers' apply_chat_template gets them (a
 * call's arguments as objects; GPT-OSS's thinking; the calls written into the content for a
 * template that never reads tool_calls; the tools' text in the system message for one that
 * never reads tools), with the request's reasoning_effort and response_format where the template
 * reads them. Tools and tool_choice themselves: http_tools.c. Tests: tests/server/test_tools_native.py,
 * tests/test_jinja.py (docs/tools.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "tool_format.h"

/* GPT-OSS's template reads an assistant message's reasoning as `thinking`, refuses content and
 * thinking beside a tool call, and tests `... in message.content` whenever content is there (a
 * null is an error in jinja2): as llama.cpp gives it messages, reasoning_content becomes
 * thinking, and a tool call's message keeps no null content, nor any content beside thinking. */
static void harmony_message(cJSON *out)
{
    cJSON *rc = cJSON_GetObjectItemCaseSensitive(out, "reasoning_content");
    int calls = cJSON_GetObjectItemCaseSensitive(out, "tool_calls") != NULL;
    if (cJSON_IsString(rc)) cJSON_AddStringToObject(out, "thinking", rc->valuestring);
    if (calls && (cJSON_IsString(rc) || cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(out, "content"))))
        cJSON_DeleteItemFromObjectCaseSensitive(out, "content");
}

/* calls_marker + the calls as the model writes them (a compact JSON list of {name, arguments}),
 * after the message's content: for a template that never writes an assistant's tool_calls
 * (Granite 3's). 0, or -1 when out of memory. */
static int calls_into_content(cJSON *out, const cJSON *calls, const char *calls_marker)
{
    cJSON *list = cJSON_CreateArray();
    for (const cJSON *t = calls->child; t && list; t = t->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name"), *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        /* the arguments as their JSON (compact), or as sent when they are not JSON */
        cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!obj) obj = cJSON_IsString(args) && args->valuestring[0] ? cJSON_CreateRaw(args->valuestring) : cJSON_CreateObject();
        cJSON *e = cJSON_CreateObject();
        int ok = e && obj && cJSON_AddStringToObject(e, "name", cJSON_IsString(name) ? name->valuestring : "") &&
                 cJSON_AddItemToObject(e, "arguments", obj);
        if (ok) obj = NULL; /* (e's) */
        ok = ok && cJSON_AddItemToArray(list, e);
        if (ok) e = NULL; /* (list's) */
        cJSON_Delete(obj);
        cJSON_Delete(e);
        if (!ok) {
            cJSON_Delete(list);
            list = NULL;
        }
    }
    char *json = list ? cJSON_PrintUnformatted(list) : NULL;
    cJSON_Delete(list);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(out, "content");
    const char *before = cJSON_IsString(c) ? c->valuestring : "";
    size_t n = json ? strlen(before) + strlen(calls_marker) + strlen(json) + 1 : 0;
    char *text = n ? malloc(n) : NULL;
    if (text) snprintf(text, n, "%s%s%s", before, calls_marker, json);
    int ok = text && (c ? cJSON_ReplaceItemInObjectCaseSensitive(out, "content", cJSON_CreateString(text))
                        : cJSON_AddStringToObject(out, "content", text) != NULL);
    free(text);
    free(json);
    return ok ? 0 : -1;
}

/* Message i of the request as transformers' apply_chat_template gets it: role ("developer" is
 * "system"), content (text parts joined; absent or null as sent), tool_calls with arguments as
 * JSON objects (templates write them with tojson), tool_call_id, name, reasoning_content. With
 * calls_marker (a template that never writes tool_calls), the calls go into the content instead
 * (calls_into_content). NULL when out of memory. */
static cJSON *raw_message(const cJSON *m, int harmony, const char *calls_marker)
{
    cJSON *out = cJSON_CreateObject();
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    cJSON_AddStringToObject(out, "role", strcmp(role->valuestring, "developer") ? role->valuestring : "system");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsNull(c)) cJSON_AddNullToObject(out, "content");
    else if (cJSON_IsString(c)) cJSON_AddStringToObject(out, "content", c->valuestring);
    else if (cJSON_IsArray(c)) { /* text parts (parse_messages checked them): joined */
        char *text = NULL;
        size_t len = 0, cap = 0;
        http_buf_append(&text, &len, &cap, "", 0);
        for (const cJSON *part = c->child; part; part = part->next) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t)) http_buf_append(&text, &len, &cap, t->valuestring, strlen(t->valuestring));
        }
        cJSON_AddStringToObject(out, "content", text);
        free(text);
    }
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls_marker && cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        if (calls_into_content(out, calls, calls_marker) != 0) {
            cJSON_Delete(out);
            return NULL;
        }
    } else if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0) {
        cJSON *list = cJSON_AddArrayToObject(out, "tool_calls");
        for (const cJSON *t = calls->child; t; t = t->next) {
            cJSON *d = cJSON_Duplicate(t, 1), *f = cJSON_GetObjectItemCaseSensitive(d, "function");
            cJSON *args = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
            cJSON *obj = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
            if (obj) cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", obj);
            cJSON_AddItemToArray(list, d);
        }
    }
    static const char *const strings[] = {"tool_call_id", "name", "reasoning_content"};
    for (size_t k = 0; k < sizeof strings / sizeof *strings; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, strings[k]);
        if (cJSON_IsString(v)) cJSON_AddStringToObject(out, strings[k], v->valuestring);
    }
    if (harmony) harmony_message(out);
    return out;
}

/* A template that never reads `tools` (DeepSeek's): their text (tool_format_tools_prompt) ends the
 * first system message of msgs, or is one of its own before the others. -1: out of memory. */
static int tools_into_system(cJSON *msgs, const cJSON *tools, enum tool_prompt kind)
{
    char *json = http_tools_functions_json(tools, NULL);
    char *text = json ? tool_format_tools_prompt(kind, json) : NULL;
    free(json);
    if (!text) return -1;
    cJSON *first = msgs->child, *content = first ? cJSON_GetObjectItemCaseSensitive(first, "content") : NULL;
    const cJSON *role = first ? cJSON_GetObjectItemCaseSensitive(first, "role") : NULL;
    int ok;
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "system") && cJSON_IsString(content)) {
        const size_t n = strlen(content->valuestring) + strlen(text) + 3;
        char *joined = malloc(n);
        if (joined) snprintf(joined, n, "%s\n\n%s", content->valuestring, text);
        ok = joined && cJSON_ReplaceItemInObjectCaseSensitive(first, "content", cJSON_CreateString(joined));
        free(joined);
    } else {
        cJSON *m = cJSON_CreateObject();
        ok = m && cJSON_AddStringToObject(m, "role", "system") && cJSON_AddStringToObject(m, "content", text) &&
             cJSON_InsertItemInArray(msgs, 0, m);
    }
    free(text);
    return ok ? 0 : -1;
}

enum status http_tools_context(const cJSON *o, const cJSON *tools, const struct http_chat_caps *caps,
                               struct http_request *q)
{
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(o, "chat_template_kwargs");
    if (cJSON_IsNull(kw)) kw = NULL;
    if (kw && !q->is_chat) return status_errorf(STATUS_INVALID_ARGUMENT, "'chat_template_kwargs' is for /v1/chat/completions");
    if (kw && !(caps && caps->jinja))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'chat_template_kwargs' needs a Jinja chat template (the model's "
                             "own or --chat-template FILE.jinja); this server uses a built-in one");
    if (kw && !cJSON_IsObject(kw)) return status_errorf(STATUS_INVALID_ARGUMENT, "'chat_template_kwargs' must be an object");
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(o, "reasoning_effort");
    if (cJSON_IsNull(effort)) effort = NULL;
    if (effort) {
        const char *e = cJSON_IsString(effort) ? effort->valuestring : "";
        if (strcmp(e, "low") && strcmp(e, "medium") && strcmp(e, "high"))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'reasoning_effort' must be one of low, medium, high");
        const cJSON *kw_effort = cJSON_GetObjectItemCaseSensitive(kw, "reasoning_effort");
        if (kw_effort && !cJSON_IsNull(kw_effort))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'reasoning_effort' and 'chat_template_kwargs.reasoning_effort' "
                                 "are both set: give one");
    }
    static const char *const reserved[] = {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"};
    for (const cJSON *e = kw ? kw->child : NULL; e; e = e->next)
        for (size_t k = 0; k < sizeof reserved / sizeof *reserved; k++)
            if (!strcmp(e->string, reserved[k]))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'chat_template_kwargs.%s' is set by the server, not the "
                                     "request", reserved[k]);
    if (!q->is_chat || !caps || !caps->jinja || q->r.chat_context) return STATUS_OK;
    struct gen_request *r = &q->r;
    cJSON *ctx = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(ctx, "messages");
    /* The template writes tool calls and results itself; or it reasons and the chat has no tools
     * at all (then messages keep their reasoning_content, which its history may write back). */
    int raw = caps->tool_format != TOOL_FORMAT_GENERIC && !(q->tools && q->tool_format == TOOL_FORMAT_GENERIC);
    if (!raw && caps->reasoning && !tools && !q->tools) {
        raw = 1;
        for (const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages")->child; m && raw; m = m->next)
            raw = !cJSON_GetObjectItemCaseSensitive(m, "tool_calls") && !cJSON_GetObjectItemCaseSensitive(m, "tool_call_id") &&
                  strcmp(cJSON_GetObjectItemCaseSensitive(m, "role")->valuestring, "tool");
    }
    if (raw) {
        const char *calls_marker = caps->calls_as_text ? tool_format_call_marker((enum tool_format)caps->tool_format) : NULL;
        int oom = 0;
        for (const cJSON *m = cJSON_GetObjectItemCaseSensitive(o, "messages")->child; m; m = m->next) {
            cJSON *one = raw_message(m, caps->tool_format == TOOL_FORMAT_HARMONY, calls_marker);
            oom |= !one;
            if (one) cJSON_AddItemToArray(msgs, one);
        }
        if (oom || (tools && caps->tools_prompt && tools_into_system(msgs, tools, (enum tool_prompt)caps->tools_prompt) != 0)) {
            cJSON_Delete(ctx);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
    } else {
        static const char *const roles[] = {"system", "user", "assistant"};
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "messages"), *src = ms ? ms->child : NULL;
        /* http_tools_parse may have opened the chat with a system message of its own (the tools'
         * text): no message of the body, no name; the body's names go to the messages after it. */
        const int n_body = ms ? cJSON_GetArraySize(ms) : 0, added = r->n_messages > n_body ? r->n_messages - n_body : 0;
        for (int i = 0; i < r->n_messages; i++) {
            const cJSON *from = i < added ? NULL : src;
            if (from) src = src->next;
            cJSON *m = cJSON_CreateObject();
            int k = (int)r->messages[i].role;
            cJSON_AddStringToObject(m, "role", k >= 0 && k < 3 ? roles[k] : "user");
            cJSON_AddStringToObject(m, "content", r->messages[i].content);
            const cJSON *name = from ? cJSON_GetObjectItemCaseSensitive(from, "name") : NULL;
            if (cJSON_IsString(name)) cJSON_AddStringToObject(m, "name", name->valuestring);
            cJSON_AddItemToArray(msgs, m);
        }
    }
    cJSON_AddItemToObject(ctx, "tools", tools ? cJSON_Duplicate(tools, 1) : cJSON_CreateNull());
    cJSON_AddNullToObject(ctx, "documents");
    if (effort) /* (http_openai.c let it in: the template reads it) */
        cJSON_AddItemToObject(ctx, "reasoning_effort", cJSON_Duplicate(effort, 1));
    /* A template that writes the reply's schema into its prompt (DeepSeek V4's `response_format`,
     * as llama.cpp gives it): the request's JSON Schema, {"type": "object"} for JSON object mode;
     * not a tool call's schema (a request with tools has no other constraint). */
    const enum constraint_kind ck = r->params.constraint_kind;
    if (caps->response_format && !tools && !q->tools && (ck == CONSTRAINT_JSON_SCHEMA || ck == CONSTRAINT_JSON_OBJECT)) {
        cJSON *schema = ck == CONSTRAINT_JSON_OBJECT ? cJSON_CreateObject() : cJSON_ParseWithLength(r->constraint, r->constraint_len);
        if (schema && ck == CONSTRAINT_JSON_OBJECT) cJSON_AddStringToObject(schema, "type", "object");
        /* (a source that is not JSON is given nothing: compiling it refuses the request) */
        if (schema && !cJSON_AddItemToObject(ctx, "response_format", schema)) {
            cJSON_Delete(schema);
            cJSON_Delete(ctx);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
    }
    for (const cJSON *e = kw ? kw->child : NULL; e; e = e->next)
        if (!(effort && !strcmp(e->string, "reasoning_effort"))) /* (a null one: the request's) */
            cJSON_AddItemToObject(ctx, e->string, cJSON_Duplicate(e, 1));
    r->chat_context = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    return r->chat_context ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
}
