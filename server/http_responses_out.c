/* server/http_responses_out.c - OpenAI's Responses API replies: the Response object (its output
 * items made from the chat endpoint's own reply, so that reasoning and tool-call parsing stay in
 * one place), the stream's events made from the chat endpoint's chunks (response.created,
 * response.in_progress, then per item response.output_item.added, response.content_part.added,
 * response.output_text.delta / .reasoning_text.delta / .function_call_arguments.delta, their
 * .done, response.content_part.done, response.output_item.done, and at the end
 * response.completed, .incomplete or .failed), and the routes of a stored response (GET,
 * DELETE, cancel).
 * Not here: requests and the store (http_responses.c); the chat reply itself
 * (http_openai_out.c).
 * Tests: tests/server/test_responses.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_responses.h"
#include "tokenizer.h"

/* The tokens of text as the tokenizer encodes it (reasoning_tokens: the engine does not count
 * the reasoning's tokens apart, so they are counted again from its text). */
static int count_tokens(const struct http_gen *g, const char *text)
{
    int32_t *ids = NULL;
    int n = 0;
    if (tokenizer_encode(g->m->tok, text, strlen(text), 0, &ids, &n) != STATUS_OK) n = 0;
    free(ids);
    return n;
}

static cJSON *usage_of(const struct http_gen *g, const cJSON *output)
{
    int in = g->runs[0].prompt_tokens, out = g->samples[0].completion_tokens, reasoning = 0;
    for (const cJSON *it = output ? output->child : NULL; it; it = it->next) {
        const cJSON *c = cJSON_GetObjectItem(it, "content");
        if (!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(it, "type")), "reasoning") && cJSON_GetArraySize(c) > 0)
            reasoning += count_tokens(g, cJSON_GetStringValue(cJSON_GetObjectItem(c->child, "text")));
    }
    cJSON *u = http_json_ok(cJSON_CreateObject());
    cJSON_AddNumberToObject(u, "input_tokens", in);
    cJSON *d = http_json_ok(cJSON_AddObjectToObject(u, "input_tokens_details"));
    cJSON_AddNumberToObject(d, "cached_tokens", g->runs[0].cached_prompt_tokens);
    cJSON_AddNumberToObject(d, "cache_write_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", out);
    cJSON_AddNumberToObject(http_json_ok(cJSON_AddObjectToObject(u, "output_tokens_details")), "reasoning_tokens",
                            reasoning < out ? reasoning : out);
    cJSON_AddNumberToObject(u, "total_tokens", in + out);
    return u;
}

cJSON *responses_object(const struct http_gen *g, const char *status, cJSON *output)
{
    const struct http_responses *r = g->q.responses;
    cJSON *o = http_json_dup(r->echo);
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)r->created);
    cJSON_AddStringToObject(o, "status", status);
    const char *adapter = g->q.r.params.adapter;
    cJSON_AddStringToObject(o, "model", adapter && *adapter ? adapter : g->m->model_id);
    if (!strcmp(status, "failed") || !strcmp(status, "cancelled")) {
        cJSON *e = http_json_ok(cJSON_AddObjectToObject(o, "error"));
        cJSON_AddStringToObject(e, "code", status_name(g->end_status));
        cJSON_AddStringToObject(e, "message", atomic_load(&r->cancelled) ? "cancelled by POST /v1/responses/{id}/cancel"
                                                                          : g->end_message);
    } else {
        cJSON_AddNullToObject(o, "error");
    }
    if (!strcmp(status, "incomplete"))
        cJSON_AddStringToObject(http_json_ok(cJSON_AddObjectToObject(o, "incomplete_details")), "reason", "max_output_tokens");
    else cJSON_AddNullToObject(o, "incomplete_details");
    if (!output) output = http_json_ok(cJSON_CreateArray());
    int ended = strcmp(status, "in_progress") != 0;
    if (ended) cJSON_AddItemToObject(o, "usage", usage_of(g, output));
    else cJSON_AddNullToObject(o, "usage");
    cJSON_AddItemToObject(o, "output", output);
    return o;
}

/* The id of output item index of kind. */
static void item_id(const struct http_responses *r, int kind, int index, char *out, size_t cap)
{
    const char *prefix = kind == RESPONSES_ITEM_REASONING ? "rs" : kind == RESPONSES_ITEM_MESSAGE ? "msg" : "fc";
    snprintf(out, cap, "%s_%s_%d", prefix, r->id + 5, index);
}

/* A text part of a message or reasoning item. */
static cJSON *part_json(int kind, const char *text)
{
    cJSON *p = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(p, "type", kind == RESPONSES_ITEM_REASONING ? "reasoning_text" : "output_text");
    cJSON_AddStringToObject(p, "text", text);
    if (kind == RESPONSES_ITEM_MESSAGE) {
        cJSON_AddItemToObject(p, "annotations", http_json_ok(cJSON_CreateArray()));
        cJSON_AddItemToObject(p, "logprobs", http_json_ok(cJSON_CreateArray()));
    }
    return p;
}

/* Output item index of kind with its text (a call: its arguments; NULL: no part yet), status
 * "in_progress", "completed" or "incomplete"; call_id and name for a function call. */
static cJSON *item_json(const struct http_responses *r, int kind, int index, const char *status, const char *text,
                        const char *call_id, const char *name)
{
    char id[96];
    item_id(r, kind, index, id, sizeof id);
    cJSON *it = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(it, "id", id);
    if (kind == RESPONSES_ITEM_CALL) {
        cJSON_AddStringToObject(it, "type", "function_call");
        cJSON_AddStringToObject(it, "status", status);
        cJSON_AddStringToObject(it, "call_id", call_id);
        cJSON_AddStringToObject(it, "name", name);
        cJSON_AddStringToObject(it, "arguments", text ? text : "");
        return it;
    }
    cJSON_AddStringToObject(it, "type", kind == RESPONSES_ITEM_REASONING ? "reasoning" : "message");
    cJSON_AddStringToObject(it, "status", status);
    if (kind == RESPONSES_ITEM_MESSAGE) cJSON_AddStringToObject(it, "role", "assistant");
    else cJSON_AddItemToObject(it, "summary", http_json_ok(cJSON_CreateArray()));
    cJSON *content = http_json_ok(cJSON_AddArrayToObject(it, "content"));
    if (text) cJSON_AddItemToArray(content, part_json(kind, text));
    return it;
}

/* The status of a response whose engine request ended. */
static const char *end_status(const struct http_gen *g)
{
    if (g->end_status == STATUS_CANCELLED && atomic_load(&g->q.responses->cancelled)) return "cancelled";
    if (g->end_status != STATUS_OK) return "failed";
    return g->samples[0].finish == FINISH_REASON_LENGTH ? "incomplete" : "completed";
}

static void store(struct http_gen *g, const cJSON *o)
{
    if (!g->q.responses->store || !g->s->http_responses) return;
    char *json = cJSON_PrintUnformatted(o);
    CHECK(json, "out of memory");
    responses_store_put(g->s->http_responses, g, json, 1);
}

char *http_responses_response(struct http_gen *g)
{
    const struct http_responses *r = g->q.responses;
    const char *status = end_status(g);
    cJSON *output = http_json_ok(cJSON_CreateArray());
    if (!strcmp(status, "completed") || !strcmp(status, "incomplete") || !strcmp(status, "cancelled")) {
        char *chat = http_response_json(g);
        cJSON *c = cJSON_Parse(chat);
        free(chat);
        CHECK(c, "the chat reply did not parse");
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0), "message");
        const cJSON *rs = cJSON_GetObjectItem(m, "reasoning_content"), *t = cJSON_GetObjectItem(m, "content");
        const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
        int n_calls = cJSON_GetArraySize(calls), k = 0;
        const char *last = strcmp(status, "completed") ? "incomplete" : "completed";
        int has_text = cJSON_IsString(t) && t->valuestring[0];
        if (cJSON_IsString(rs) && rs->valuestring[0])
            cJSON_AddItemToArray(output, item_json(r, RESPONSES_ITEM_REASONING, k++,
                                                   has_text || n_calls ? "completed" : last, rs->valuestring, NULL, NULL));
        if (has_text || (!n_calls && !k))
            cJSON_AddItemToArray(output, item_json(r, RESPONSES_ITEM_MESSAGE, k++, n_calls ? "completed" : last,
                                                   cJSON_IsString(t) ? t->valuestring : "", NULL, NULL));
        for (const cJSON *call = n_calls ? calls->child : NULL; call; call = call->next, k++) {
            const cJSON *f = cJSON_GetObjectItem(call, "function");
            cJSON_AddItemToArray(output, item_json(r, RESPONSES_ITEM_CALL, k, call->next ? "completed" : last,
                                                   cJSON_GetStringValue(cJSON_GetObjectItem(f, "arguments")),
                                                   cJSON_GetStringValue(cJSON_GetObjectItem(call, "id")),
                                                   cJSON_GetStringValue(cJSON_GetObjectItem(f, "name"))));
        }
        cJSON_Delete(c);
    }
    cJSON *o = responses_object(g, status, output);
    store(g, o);
    if (!strcmp(status, "failed")) {
        cJSON_Delete(o);
        return NULL;
    }
    return http_json_print(o);
}

/* ---- streams ----------------------------------------------------------------------------- */

/* event: type, data: o (taken) with its type and sequence_number. */
static void event(struct http_gen *g, const char *type, cJSON *o)
{
    struct http_responses *r = g->q.responses;
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", r->seq++);
    char *s = http_json_print(o);
    char head[96];
    int n = snprintf(head, sizeof head, "event: %s\ndata: ", type);
    http_resume_event_id(g);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, head, (size_t)n);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, s, strlen(s));
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
}

/* An event about the open item: output_index and (item: 1) item_id, (part: 1) content_index. */
static cJSON *about(const struct http_responses *r, int item, int part)
{
    cJSON *o = http_json_ok(cJSON_CreateObject());
    if (item) {
        char id[96];
        item_id(r, r->kind, r->index, id, sizeof id);
        cJSON_AddStringToObject(o, "item_id", id);
    }
    cJSON_AddNumberToObject(o, "output_index", r->index);
    if (part) cJSON_AddNumberToObject(o, "content_index", 0);
    return o;
}

static void start(struct http_gen *g)
{
    struct http_responses *r = g->q.responses;
    if (r->started) return;
    r->started = 1;
    CHECK(r->output = cJSON_CreateArray(), "out of memory");
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddItemToObject(o, "response", responses_object(g, "in_progress", NULL));
    event(g, "response.created", o);
    o = http_json_ok(cJSON_CreateObject());
    cJSON_AddItemToObject(o, "response", responses_object(g, "in_progress", NULL));
    event(g, "response.in_progress", o);
}

/* Closes the open item with status: its .done events, and the item joins r->output. */
static void close_item(struct http_gen *g, const char *status)
{
    struct http_responses *r = g->q.responses;
    if (!r->open) return;
    r->open = 0;
    const char *text = r->acc ? r->acc : "";
    cJSON *o;
    if (r->kind == RESPONSES_ITEM_CALL) {
        o = about(r, 1, 0);
        cJSON_AddStringToObject(o, "arguments", text);
        event(g, "response.function_call_arguments.done", o);
    } else {
        int rs = r->kind == RESPONSES_ITEM_REASONING;
        o = about(r, 1, 1);
        cJSON_AddStringToObject(o, "text", text);
        if (!rs) cJSON_AddItemToObject(o, "logprobs", http_json_ok(cJSON_CreateArray()));
        event(g, rs ? "response.reasoning_text.done" : "response.output_text.done", o);
        o = about(r, 1, 1);
        cJSON_AddItemToObject(o, "part", part_json(r->kind, text));
        event(g, "response.content_part.done", o);
    }
    cJSON *item = item_json(r, r->kind, r->index, status, text, r->call_id, r->call_name);
    cJSON_AddItemToArray(r->output, http_json_dup(item));
    o = about(r, 0, 0);
    cJSON_AddItemToObject(o, "item", item);
    event(g, "response.output_item.done", o);
}

/* Opens an item of kind (a call: with its call_id and name). */
static void open_item(struct http_gen *g, int kind, const char *call_id, const char *name)
{
    struct http_responses *r = g->q.responses;
    close_item(g, "completed");
    r->open = 1;
    r->kind = kind;
    r->index++;
    r->acc_len = 0;
    http_buf_append(&r->acc, &r->acc_len, &r->acc_cap, "", 0);
    snprintf(r->call_id, sizeof r->call_id, "%s", call_id ? call_id : "");
    snprintf(r->call_name, sizeof r->call_name, "%s", name ? name : "");
    cJSON *o = about(r, 0, 0);
    cJSON_AddItemToObject(o, "item", item_json(r, kind, r->index, "in_progress", NULL, call_id, name));
    event(g, "response.output_item.added", o);
    if (kind == RESPONSES_ITEM_CALL) return;
    o = about(r, 1, 1);
    cJSON_AddItemToObject(o, "part", part_json(kind, ""));
    event(g, "response.content_part.added", o);
}

/* text appended to the open item of kind (opened first when another is open). */
static void delta(struct http_gen *g, int kind, const char *text)
{
    struct http_responses *r = g->q.responses;
    if (!r->open || r->kind != kind) {
        if (kind == RESPONSES_ITEM_CALL) return; /* arguments of a call never announced */
        open_item(g, kind, NULL, NULL);
    }
    http_buf_append(&r->acc, &r->acc_len, &r->acc_cap, text, strlen(text));
    cJSON *o = about(r, 1, kind != RESPONSES_ITEM_CALL);
    cJSON_AddStringToObject(o, "delta", text);
    if (kind == RESPONSES_ITEM_MESSAGE) cJSON_AddItemToObject(o, "logprobs", http_json_ok(cJSON_CreateArray()));
    event(g, kind == RESPONSES_ITEM_CALL        ? "response.function_call_arguments.delta"
             : kind == RESPONSES_ITEM_MESSAGE ? "response.output_text.delta"
                                              : "response.reasoning_text.delta",
          o);
}

void http_responses_chunk(struct http_gen *g, cJSON *chunk)
{
    start(g);
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(chunk, "choices"), 0), "delta");
    const cJSON *rs = cJSON_GetObjectItem(d, "reasoning_content"), *t = cJSON_GetObjectItem(d, "content");
    if (cJSON_IsString(rs) && rs->valuestring[0]) delta(g, RESPONSES_ITEM_REASONING, rs->valuestring);
    if (cJSON_IsString(t) && t->valuestring[0]) delta(g, RESPONSES_ITEM_MESSAGE, t->valuestring);
    const cJSON *calls = cJSON_GetObjectItem(d, "tool_calls");
    for (const cJSON *c = cJSON_IsArray(calls) ? calls->child : NULL; c; c = c->next) {
        const cJSON *f = cJSON_GetObjectItem(c, "function");
        const cJSON *id = cJSON_GetObjectItem(c, "id");
        if (cJSON_IsString(id))
            open_item(g, RESPONSES_ITEM_CALL, id->valuestring, cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")));
        const cJSON *args = cJSON_GetObjectItem(f, "arguments");
        if (cJSON_IsString(args) && args->valuestring[0]) delta(g, RESPONSES_ITEM_CALL, args->valuestring);
    }
    cJSON_Delete(chunk);
}

void http_responses_finish(struct http_gen *g)
{
    struct http_responses *r = g->q.responses;
    start(g);
    const char *status = end_status(g);
    int ok_end = !strcmp(status, "completed") || !strcmp(status, "incomplete");
    /* A reply with no item at all still carries one (empty) message, as the unary reply. */
    if (ok_end && r->index < 0) open_item(g, RESPONSES_ITEM_MESSAGE, NULL, NULL);
    close_item(g, !strcmp(status, "completed") ? "completed" : "incomplete");
    cJSON *output = r->output;
    r->output = NULL;
    cJSON *resp = responses_object(g, status, output);
    store(g, resp);
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddItemToObject(o, "response", resp);
    event(g, ok_end ? (!strcmp(status, "completed") ? "response.completed" : "response.incomplete") : "response.failed", o);
    g->done = 1;
}

/* ---- GET, DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel --------------------------- */

/* The {id} of url ("/v1/responses/{id}" and an optional suffix, one of suffixes) into buf;
 * *suffix: the suffix ("" for none). */
static enum status route_id(const char *url, char *buf, size_t cap, const char **suffix)
{
    const char *id = url + strlen("/v1/responses/");
    const char *slash = strchr(id, '/');
    size_t n = slash ? (size_t)(slash - id) : strlen(id);
    *suffix = slash ? slash : "";
    if (n == 0 || n >= cap || (slash && strcmp(slash, "/cancel") && strcmp(slash, "/input_items")))
        return status_errorf(STATUS_NOT_FOUND, "no such route: use /v1/responses/{id}, /v1/responses/{id}/cancel or "
                             "/v1/responses/{id}/input_items");
    memcpy(buf, id, n);
    buf[n] = 0;
    return STATUS_OK;
}

enum status http_responses_item(struct server *s, const char *owner, const char *method, const char *url, char **json)
{
    *json = NULL;
    char buf[96];
    const char *slash;
    enum status rs = route_id(url, buf, sizeof buf, &slash);
    if (rs != STATUS_OK) return rs;
    if (!slash[0]) slash = NULL;
    struct http_responses_store *st = s->http_responses;
    if (!st) return status_errorf(STATUS_NOT_FOUND, "no response with id '%.64s' is stored", buf);
    if (slash) return responses_store_cancel(st, buf, owner, json);
    if (strcmp(method, "DELETE")) return responses_store_get(st, buf, owner, 0, json, NULL);
    enum status e = responses_store_delete(st, buf, owner);
    if (e != STATUS_OK) return e;
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "id", buf);
    cJSON_AddStringToObject(o, "object", "response.deleted");
    cJSON_AddTrueToObject(o, "deleted");
    *json = http_json_print(o);
    return STATUS_OK;
}

/* ---- GET /v1/responses/{id}/input_items ------------------------------------------------------- */

/* Item it (stored as the client sent it, with an id: http_responses.c) in the shape OpenAI lists
 * input items in: a message's type written out and a string content as one input_text part
 * (output_text for the assistant's). */
static cJSON *listed_item(const cJSON *it)
{
    cJSON *o = http_json_dup(it);
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "type"));
    if (type && strcmp(type, "message")) return o;
    if (!type) cJSON_AddItemToObject(o, "type", http_json_ok(cJSON_CreateString("message")));
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(o, "content");
    if (cJSON_IsString(content)) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "role"));
        cJSON *parts = http_json_ok(cJSON_CreateArray()), *p = http_json_ok(cJSON_CreateObject());
        cJSON_AddStringToObject(p, "type", role && !strcmp(role, "assistant") ? "output_text" : "input_text");
        cJSON_AddStringToObject(p, "text", content->valuestring);
        cJSON_AddItemToArray(parts, p);
        cJSON_ReplaceItemInObjectCaseSensitive(o, "content", parts);
    }
    return o;
}

enum status http_responses_input_items(struct server *s, const char *owner, const char *url,
                                       const struct http_query *q, char **json)
{
    *json = NULL;
    char buf[96];
    const char *suffix;
    struct http_list lo;
    enum status st = route_id(url, buf, sizeof buf, &suffix);
    if (st == STATUS_OK) st = http_list_options(q, "after,limit,order", 20, 100, &lo);
    if (st != STATUS_OK) return st;
    if (!s->http_responses) return status_errorf(STATUS_NOT_FOUND, "no response with id '%.64s' is stored", buf);
    char *items_json = NULL;
    if ((st = responses_store_get(s->http_responses, buf, owner, 0, NULL, &items_json)) != STATUS_OK) return st;
    cJSON *items = cJSON_Parse(items_json);
    free(items_json);
    CHECK(items, "a stored response's items did not parse");
    /* The listing newest first: the stored items reversed, each as the list shows it. */
    cJSON *listed = http_json_ok(cJSON_CreateArray());
    for (const cJSON *it = items->child; it; it = it->next) cJSON_InsertItemInArray(listed, 0, listed_item(it));
    cJSON_Delete(items);
    char what[128];
    snprintf(what, sizeof what, "the response '%.64s'", buf);
    cJSON *o = NULL;
    if ((st = http_list_page(listed, &lo, what, &o)) != STATUS_OK) return st;
    *json = http_json_print(o);
    return STATUS_OK;
}

char *http_responses_count_json(int n_tokens)
{
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "object", "response.input_tokens");
    cJSON_AddNumberToObject(o, "input_tokens", n_tokens);
    return http_json_print(o);
}
