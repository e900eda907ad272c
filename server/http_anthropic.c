/* server/http_anthropic.c - Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens) as a translation onto the chat path: the request body is checked
 * field by field (unknown fields refused by name), rewritten as the equivalent OpenAI chat
 * request, and parsed by http_parse_request, so that templates, tools, grammar constraints,
 * reasoning and every validation are the chat endpoint's own.
 * Not here: the reply, stream events and error bodies (http_anthropic_out.c); routes and keys
 * (http.c).
 * Tests: tests/server/test_anthropic.py. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "tool_format.h"

static enum status bad(const char *fmt, const char *a, const char *b)
{
    return status_errorf(STATUS_INVALID_ARGUMENT, fmt, a, b);
}

#define get http_json_field
#define only_fields http_json_only_fields
#define dup_item http_json_dup

/* Text blocks (or a string) of `name` into one string appended to *text. Blocks may carry
 * cache_control (ignored: the prefix cache is automatic). */
static enum status text_of(const cJSON *v, const char *name, char **text, size_t *len, size_t *cap)
{
    static const char *const fields[] = {"type", "text", "cache_control", NULL};
    if (cJSON_IsString(v)) {
        http_buf_append(text, len, cap, v->valuestring, strlen(v->valuestring));
        return STATUS_OK;
    }
    if (!cJSON_IsArray(v)) return bad("'%s' must be a string or a list of text blocks%s", name, "");
    int k = 0;
    for (const cJSON *b = v->child; b; b = b->next, k++) {
        char where[96];
        snprintf(where, sizeof where, "%s[%d]", name, k);
        const cJSON *type = get(b, "type"), *t = get(b, "text");
        if (!cJSON_IsObject(b) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t))
            return bad("'%s' must be a text block {\"type\": \"text\", \"text\": ...}%s", where, "");
        enum status st = only_fields(b, where, fields);
        if (st != STATUS_OK) return st;
        http_buf_append(text, len, cap, t->valuestring, strlen(t->valuestring));
    }
    if (!*text) http_buf_append(text, len, cap, "", 0);
    return STATUS_OK;
}

/* One Anthropic message (index i) appended to the OpenAI list out: a user turn's tool_result
 * blocks become "tool" messages (before its text), an assistant's tool_use blocks its
 * tool_calls; thinking blocks of earlier turns are dropped (as Anthropic's own API does for
 * most models). */
static enum status add_message(const cJSON *m, int i, cJSON *out)
{
    static const char *const fields[] = {"role", "content", NULL};
    char where[64];
    snprintf(where, sizeof where, "messages[%d]", i);
    if (!cJSON_IsObject(m)) return bad("'%s' must be an object%s", where, "");
    enum status st = only_fields(m, where, fields);
    if (st != STATUS_OK) return st;
    const cJSON *role = get(m, "role"), *content = get(m, "content");
    if (!cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'%s.role' must be user or assistant, got '%.32s'", where,
                             cJSON_IsString(role) ? role->valuestring : "(not a string)");
    int user = !strcmp(role->valuestring, "user");
    if (!content) return bad("'%s.content' is required%s", where, "");
    char *text = NULL;
    size_t len = 0, cap = 0;
    cJSON *calls = NULL;
    if (cJSON_IsString(content)) http_buf_append(&text, &len, &cap, content->valuestring, strlen(content->valuestring));
    else if (!cJSON_IsArray(content)) return bad("'%s.content' must be a string or a list of content blocks%s", where, "");
    int k = 0;
    for (const cJSON *b = cJSON_IsArray(content) ? content->child : NULL; b && st == STATUS_OK; b = b->next, k++) {
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content[%d]", where, k);
        const cJSON *type = get(b, "type");
        if (!cJSON_IsObject(b) || !cJSON_IsString(type)) {
            st = bad("'%s' must be a content block with a string 'type'%s", bw, "");
            break;
        }
        const char *t = type->valuestring;
        if (!strcmp(t, "text")) {
            cJSON *one = dup_item(b);
            cJSON *list = cJSON_CreateArray();
            cJSON_AddItemToArray(list, one);
            st = text_of(list, bw, &text, &len, &cap);
            cJSON_Delete(list);
        } else if (!strcmp(t, "tool_use") && !user) {
            static const char *const tf[] = {"type", "id", "name", "input", "cache_control", NULL};
            const cJSON *id = get(b, "id"), *name = get(b, "name"), *input = get(b, "input");
            if ((st = only_fields(b, bw, tf)) != STATUS_OK) break;
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                st = bad("'%s' (tool_use) needs id and name (strings) and input (an object)%s", bw, "");
                break;
            }
            if (!calls) calls = cJSON_CreateArray();
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *f = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(f, "name", name->valuestring);
            char *args = cJSON_PrintUnformatted(input);
            CHECK(args, "out of memory");
            cJSON_AddStringToObject(f, "arguments", args);
            free(args);
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(t, "tool_result") && user) {
            static const char *const rf[] = {"type", "tool_use_id", "content", "is_error", "cache_control", NULL};
            const cJSON *id = get(b, "tool_use_id"), *rc = get(b, "content"), *err = get(b, "is_error");
            if ((st = only_fields(b, bw, rf)) != STATUS_OK) break;
            if (!cJSON_IsString(id)) {
                st = bad("'%s.tool_use_id' must be a string%s", bw, "");
                break;
            }
            if (err && !cJSON_IsBool(err)) {
                st = bad("'%s.is_error' must be a boolean%s", bw, "");
                break;
            }
            char *r = NULL;
            size_t rl = 0, rcap = 0;
            char rw[128];
            snprintf(rw, sizeof rw, "%s.content", bw);
            /* An error result reads as one to the model: the template has no field for it. */
            if (cJSON_IsTrue(err)) http_buf_append(&r, &rl, &rcap, "Error: ", 7);
            if (rc) st = text_of(rc, rw, &r, &rl, &rcap);
            if (!r) http_buf_append(&r, &rl, &rcap, "", 0);
            cJSON *tm = cJSON_CreateObject();
            cJSON_AddStringToObject(tm, "role", "tool");
            cJSON_AddStringToObject(tm, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(tm, "content", r);
            cJSON_AddItemToArray(out, tm);
            free(r);
        } else if ((!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) && !user) {
            continue;
        } else {
            st = status_errorf(STATUS_INVALID_ARGUMENT, "'%s': content blocks of type '%.32s' are not supported in %s "
                               "messages (text%s are)", bw, t, role->valuestring,
                               user ? ", tool_result" : ", tool_use, thinking");
        }
    }
    if (st != STATUS_OK) {
        free(text);
        cJSON_Delete(calls);
        return st;
    }
    /* A user turn of tool results alone has no user message of its own. */
    if (text || calls || !cJSON_IsArray(content) || k == 0 || !user) {
        cJSON *om = cJSON_CreateObject();
        cJSON_AddStringToObject(om, "role", role->valuestring);
        cJSON_AddStringToObject(om, "content", text ? text : "");
        if (calls) cJSON_AddItemToObject(om, "tool_calls", calls);
        cJSON_AddItemToArray(out, om);
    }
    free(text);
    return STATUS_OK;
}

/* tools: [{name, description, input_schema}] -> OpenAI function tools. */
static enum status add_tools(const cJSON *tools, cJSON *out)
{
    static const char *const fields[] = {"name", "description", "input_schema", "cache_control", "type", NULL};
    if (!cJSON_IsArray(tools)) return bad("'tools' must be a list%s%s", "", "");
    cJSON *list = cJSON_AddArrayToObject(out, "tools");
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        char where[32];
        snprintf(where, sizeof where, "tools[%d]", k);
        if (!cJSON_IsObject(t)) return bad("'%s' must be an object%s", where, "");
        enum status st = only_fields(t, where, fields);
        if (st != STATUS_OK) return st;
        const cJSON *type = get(t, "type"), *name = get(t, "name"), *schema = get(t, "input_schema");
        if (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "custom")))
            return bad("'%s.type': only custom tools (with an input_schema) are supported%s", where, "");
        if (!cJSON_IsString(name) || !cJSON_IsObject(schema))
            return bad("'%s' needs name (a string) and input_schema (an object)%s", where, "");
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(f, "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        const cJSON *d = get(t, "description");
        if (d) cJSON_AddItemToObject(fn, "description", dup_item(d));
        cJSON_AddItemToObject(fn, "parameters", dup_item(schema));
        cJSON_AddItemToArray(list, f);
    }
    return STATUS_OK;
}

/* tool_choice {type: auto|any|tool|none, name, disable_parallel_tool_use}. */
static enum status add_tool_choice(const cJSON *tc, cJSON *out)
{
    static const char *const fields[] = {"type", "name", "disable_parallel_tool_use", NULL};
    if (!cJSON_IsObject(tc)) return bad("'tool_choice' must be an object%s%s", "", "");
    enum status st = only_fields(tc, "tool_choice", fields);
    if (st != STATUS_OK) return st;
    const cJSON *type = get(tc, "type"), *name = get(tc, "name"), *dp = get(tc, "disable_parallel_tool_use");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (!strcmp(t, "auto") || !strcmp(t, "none")) cJSON_AddStringToObject(out, "tool_choice", t);
    else if (!strcmp(t, "any")) cJSON_AddStringToObject(out, "tool_choice", "required");
    else if (!strcmp(t, "tool")) {
        if (!cJSON_IsString(name)) return bad("'tool_choice.name' is required with type tool%s%s", "", "");
        cJSON *c = cJSON_AddObjectToObject(out, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    } else
        return bad("'tool_choice.type' must be auto, any, tool or none%s%s", "", "");
    if (name && strcmp(t, "tool")) return bad("'tool_choice.name' is only for type tool%s%s", "", "");
    if (dp && !cJSON_IsBool(dp)) return bad("'tool_choice.disable_parallel_tool_use' must be a boolean%s%s", "", "");
    if (cJSON_IsTrue(dp)) cJSON_AddFalseToObject(out, "parallel_tool_calls");
    return STATUS_OK;
}

/* thinking {type: enabled|disabled, budget_tokens}: the template's enable_thinking. */
static enum status add_thinking(const cJSON *th, const cJSON *max_tokens, const struct http_chat_caps *caps,
                                cJSON *out)
{
    static const char *const fields[] = {"type", "budget_tokens", NULL};
    if (!cJSON_IsObject(th)) return bad("'thinking' must be an object%s%s", "", "");
    enum status st = only_fields(th, "thinking", fields);
    if (st != STATUS_OK) return st;
    const cJSON *type = get(th, "type"), *budget = get(th, "budget_tokens");
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (strcmp(t, "enabled") && strcmp(t, "disabled")) return bad("'thinking.type' must be enabled or disabled%s%s", "", "");
    if (budget && !cJSON_IsNumber(budget)) return bad("'thinking.budget_tokens' must be an integer%s%s", "", "");
    if (caps && caps->reasoning == TOOL_REASONING_HARMONY && !strcmp(t, "disabled"))
        return status_errorf(STATUS_UNSUPPORTED, "'thinking' disabled is not honoured: GPT-OSS's template cannot turn "
                             "its reasoning off");
    if (caps && caps->reasoning && caps->jinja && !caps->thinking_switch && !strcmp(t, "disabled"))
        return status_errorf(STATUS_UNSUPPORTED, "'thinking' disabled is not honoured: the served chat template does "
                             "not read enable_thinking, so its reasoning cannot be turned off");
    if (!caps || !caps->reasoning || !caps->jinja) {
        if (!strcmp(t, "disabled")) return STATUS_OK; /* nothing to turn off */
        return status_errorf(STATUS_UNSUPPORTED, "'thinking': the served model's chat template has no reasoning "
                             "(<think>) split, so thinking cannot be enabled");
    }
    /* Only max_tokens bounds the reply (thinking and text together): a smaller budget would not be
     * honoured, so it is refused by name. */
    if (budget && cJSON_IsNumber(max_tokens) && budget->valuedouble < max_tokens->valuedouble)
        return status_errorf(STATUS_UNSUPPORTED, "'thinking.budget_tokens' below max_tokens is not enforced (max_tokens "
                             "bounds thinking and text together): omit it or make it at least max_tokens");
    cJSON *kw = cJSON_AddObjectToObject(out, "chat_template_kwargs");
    cJSON_AddBoolToObject(kw, "enable_thinking", !strcmp(t, "enabled"));
    return STATUS_OK;
}

/* The Anthropic body o as an OpenAI chat body (*out). count: count_tokens (no max_tokens and
 * no sampling fields). */
static enum status translate(const cJSON *o, int count, const struct http_chat_caps *caps, cJSON **out)
{
    static const char *const fields[] = {"model",  "max_tokens", "messages",    "system", "temperature",
                                         "top_p",  "top_k",      "stop_sequences", "stream", "metadata",
                                         "tools",  "tool_choice", "thinking",   "cache_salt", NULL};
    static const char *const count_fields[] = {"model", "messages", "system", "tools", "tool_choice", "thinking", NULL};
    enum status st = only_fields(o, "", count ? count_fields : fields);
    if (st != STATUS_OK) return st;
    cJSON *c = cJSON_CreateObject();
    CHECK(c, "out of memory");
    *out = c;
    const cJSON *v;
    if ((v = get(o, "model"))) cJSON_AddItemToObject(c, "model", dup_item(v));
    if (!count) {
        v = get(o, "max_tokens");
        if (!v) return bad("'max_tokens' is required%s%s", "", "");
        if (!cJSON_IsNumber(v)) return bad("'max_tokens' must be an integer%s%s", "", "");
        if (v->valuedouble < 1) return bad("'max_tokens' must be >= 1%s%s", "", "");
        cJSON_AddItemToObject(c, "max_tokens", dup_item(v));
        /* cache_salt: vLLM's extra field (the SDK's extra_body), checked by the chat parser. */
        static const char *const pass[] = {"temperature", "top_p", "top_k", "stream", "cache_salt"};
        for (size_t i = 0; i < sizeof pass / sizeof *pass; i++)
            if ((v = get(o, pass[i]))) cJSON_AddItemToObject(c, pass[i], dup_item(v));
        if (!get(o, "temperature")) cJSON_AddNumberToObject(c, "temperature", 1.0); /* Anthropic's default */
        if ((v = get(o, "stop_sequences"))) {
            if (!cJSON_IsArray(v)) return bad("'stop_sequences' must be a list of strings%s%s", "", "");
            for (const cJSON *s = v->child; s; s = s->next)
                if (!cJSON_IsString(s)) return bad("'stop_sequences' must be a list of strings%s%s", "", "");
            cJSON_AddItemToObject(c, "stop", dup_item(v));
        }
        if ((v = get(o, "metadata"))) {
            static const char *const mf[] = {"user_id", NULL};
            if (!cJSON_IsObject(v)) return bad("'metadata' must be an object%s%s", "", "");
            if ((st = only_fields(v, "metadata", mf)) != STATUS_OK) return st;
            const cJSON *u = get(v, "user_id");
            if (u && !cJSON_IsString(u)) return bad("'metadata.user_id' must be a string%s%s", "", "");
            if (u) cJSON_AddStringToObject(c, "user", u->valuestring); /* the client of --scheduling-policy fair */
        }
    }
    cJSON *msgs = cJSON_AddArrayToObject(c, "messages");
    if ((v = get(o, "system"))) {
        char *text = NULL;
        size_t len = 0, cap = 0;
        st = text_of(v, "system", &text, &len, &cap);
        if (st == STATUS_OK) {
            cJSON *sm = cJSON_CreateObject();
            cJSON_AddStringToObject(sm, "role", "system");
            cJSON_AddStringToObject(sm, "content", text ? text : "");
            cJSON_AddItemToArray(msgs, sm);
        }
        free(text);
        if (st != STATUS_OK) return st;
    }
    v = get(o, "messages");
    if (!v) return bad("'messages' is required%s%s", "", "");
    if (!cJSON_IsArray(v) || !v->child) return bad("'messages' must be a non-empty list of messages%s%s", "", "");
    int i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++)
        if ((st = add_message(m, i, msgs)) != STATUS_OK) return st;
    if ((v = get(o, "tools")) && (st = add_tools(v, c)) != STATUS_OK) return st;
    if ((v = get(o, "tool_choice")) && (st = add_tool_choice(v, c)) != STATUS_OK) return st;
    if ((v = get(o, "thinking")) && (st = add_thinking(v, get(o, "max_tokens"), caps, c)) != STATUS_OK) return st;
    return STATUS_OK;
}

enum status http_anthropic_parse(const char *body, size_t len, int count, const char *served_model,
                                 const char *const *adapters, int n_adapters, const struct http_chat_caps *caps,
                                 struct http_request *q)
{
    memset(q, 0, sizeof *q);
    /* The body read as every route reads it (http_json_parse_body: one JSON object and nothing
     * after it, no NUL, no member twice): the chat body translate writes cannot carry what the
     * client sent twice, so the duplicate must be refused here, before the first one is taken. */
    cJSON *o = NULL;
    enum status st = http_json_parse_body(body, len, &o);
    if (st != STATUS_OK) return st;
    cJSON *c = NULL;
    st = translate(o, count, caps, &c);
    int n_user_stops = 0;
    const cJSON *stops = get(o, "stop_sequences");
    if (cJSON_IsArray(stops)) n_user_stops = cJSON_GetArraySize(stops);
    cJSON_Delete(o);
    char *text = st == STATUS_OK ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (st != STATUS_OK) return st;
    CHECK(text, "out of memory");
    st = http_parse_request(text, strlen(text), 1, served_model, adapters, n_adapters, caps, q);
    free(text);
    q->anthropic = 1;
    q->n_user_stops = n_user_stops;
    return st;
}
