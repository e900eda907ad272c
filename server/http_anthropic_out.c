/* server/http_anthropic_out.c - Anthropic's Messages API replies: the message object (from the
 * chat endpoint's own reply, so that reasoning and tool-call parsing stay in one place), the
 * stream's events (message_start, content_block_start / _delta / _stop, message_delta,
 * message_stop, error) made from the chat endpoint's chunks, and error bodies.
 * Not here: requests (http_anthropic.c); the chat reply itself (http_openai_out.c).
 * Tests: tests/server/test_anthropic.py. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

char *http_anthropic_error_json(unsigned code, const char *message)
{
    const char *type = code == 400 || code == 405 || code == 415 ? "invalid_request_error"
                       : code == 401                            ? "authentication_error"
                       : code == 403                            ? "permission_error"
                       : code == 404                            ? "not_found_error"
                       : code == 413                            ? "request_too_large"
                       : code == 429                            ? "rate_limit_error"
                       : code == 503                            ? "overloaded_error"
                                                                : "api_error";
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", "error");
    cJSON *e = http_json_ok(cJSON_AddObjectToObject(o, "error"));
    cJSON_AddStringToObject(e, "type", type);
    cJSON_AddStringToObject(e, "message", message);
    return http_json_print(o);
}

char *http_anthropic_count_json(int n_tokens)
{
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddNumberToObject(o, "input_tokens", n_tokens);
    return http_json_print(o);
}

/* stop_reason and stop_sequence of sample 0. A stop string of the client is told apart from
 * the template's end only by the finish reason (Jinja templates end on end ids: EOS); with
 * several stop_sequences the one that matched is not known (stop_sequence is then null). */
static void stop_reason(const struct http_gen *g, int calls, cJSON *o)
{
    const struct sample_buf *b = &g->samples[0];
    const struct http_request *q = &g->q;
    const char *r = "end_turn";
    const char *seq = NULL;
    if (b->finish == FINISH_REASON_LENGTH) r = "max_tokens"; /* a tool_use block may be cut short */
    else if (calls) r = "tool_use";
    else if (b->finish == FINISH_REASON_STOP && q->n_user_stops > 0 && !q->tools) {
        r = "stop_sequence";
        if (q->n_user_stops == 1) seq = q->r.stop[0];
    }
    cJSON_AddStringToObject(o, "stop_reason", r);
    if (seq) cJSON_AddStringToObject(o, "stop_sequence", seq);
    else cJSON_AddNullToObject(o, "stop_sequence");
}

/* Anthropic's input counts: input_tokens are the prompt tokens computed, cache_read_input_tokens
 * those the prefix cache served (the three add up to the prompt; shardlm's cache writes itself,
 * so nothing is reported as a cache write). */
static void add_input(const struct http_gen *g, cJSON *u)
{
    const int cached = g->runs[0].cached_prompt_tokens;
    cJSON_AddNumberToObject(u, "input_tokens", g->runs[0].prompt_tokens - cached);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", cached);
}

static void add_usage(const struct http_gen *g, cJSON *o, int input)
{
    cJSON *u = http_json_ok(cJSON_AddObjectToObject(o, "usage"));
    if (input) add_input(g, u);
    cJSON_AddNumberToObject(u, "output_tokens", g->samples[0].completion_tokens);
}

static const char *model_of(const struct http_gen *g)
{
    const char *adapter = g->q.r.params.adapter;
    return adapter && *adapter ? adapter : g->m->model_id;
}

/* The message object's head (id, type, role, model, content); content filled by the caller. */
static cJSON *message_head(const struct http_gen *g, cJSON **content)
{
    cJSON *o = http_json_ok(cJSON_CreateObject());
    char id[sizeof g->id + 8];
    snprintf(id, sizeof id, "msg_%s", g->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", model_of(g));
    *content = http_json_ok(cJSON_AddArrayToObject(o, "content"));
    return o;
}

char *http_anthropic_response(struct http_gen *g)
{
    char *chat = http_response_json(g);
    cJSON *c = cJSON_Parse(chat);
    free(chat);
    CHECK(c, "the chat reply did not parse");
    const cJSON *m = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0), "message");
    cJSON *content;
    cJSON *o = message_head(g, &content);
    const cJSON *r = cJSON_GetObjectItem(m, "reasoning_content");
    if (cJSON_IsString(r) && r->valuestring[0]) {
        cJSON *b = http_json_ok(cJSON_CreateObject());
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", r->valuestring);
        cJSON_AddStringToObject(b, "signature", "");
        cJSON_AddItemToArray(content, b);
    }
    const cJSON *t = cJSON_GetObjectItem(m, "content");
    const cJSON *calls = cJSON_GetObjectItem(m, "tool_calls");
    int n_calls = cJSON_IsArray(calls) ? cJSON_GetArraySize(calls) : 0;
    if (cJSON_IsString(t) && (t->valuestring[0] || (!n_calls && !cJSON_GetArraySize(content)))) {
        cJSON *b = http_json_ok(cJSON_CreateObject());
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", t->valuestring);
        cJSON_AddItemToArray(content, b);
    }
    for (const cJSON *call = n_calls ? calls->child : NULL; call; call = call->next) {
        const cJSON *f = cJSON_GetObjectItem(call, "function");
        const cJSON *args = cJSON_GetObjectItem(f, "arguments");
        cJSON *input = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
        if (!cJSON_IsObject(input)) cJSON_Delete(input), input = http_json_ok(cJSON_CreateObject());
        cJSON *b = http_json_ok(cJSON_CreateObject());
        char id[HTTP_CALL_ID_MAX + 8];
        snprintf(id, sizeof id, "toolu_%s", cJSON_GetStringValue(cJSON_GetObjectItem(call, "id")));
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", id);
        cJSON_AddStringToObject(b, "name", cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")));
        cJSON_AddItemToObject(b, "input", input);
        cJSON_AddItemToArray(content, b);
    }
    stop_reason(g, n_calls > 0, o);
    add_usage(g, o, 1);
    cJSON_Delete(c);
    return http_json_print(o);
}

/* ---- streams ----------------------------------------------------------------------------- */

static void event(struct http_gen *g, const char *name, cJSON *o)
{
    char *s = http_json_print(o);
    char head[64];
    int n = snprintf(head, sizeof head, "event: %s\ndata: ", name);
    http_resume_event_id(g);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, head, (size_t)n);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, s, strlen(s));
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
}

static cJSON *typed(const char *type)
{
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void start_message(struct http_gen *g)
{
    struct http_anthropic_stream *a = &g->an;
    if (a->started) return;
    a->started = 1;
    a->index = -1;
    cJSON *content;
    cJSON *m = message_head(g, &content);
    cJSON_AddNullToObject(m, "stop_reason");
    cJSON_AddNullToObject(m, "stop_sequence");
    cJSON *u = http_json_ok(cJSON_AddObjectToObject(m, "usage"));
    add_input(g, u);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
    cJSON *o = typed("message_start");
    cJSON_AddItemToObject(o, "message", m);
    event(g, "message_start", o);
}

static void stop_block(struct http_gen *g)
{
    struct http_anthropic_stream *a = &g->an;
    if (!a->open) return;
    cJSON *o = typed("content_block_stop");
    cJSON_AddNumberToObject(o, "index", a->index);
    event(g, "content_block_stop", o);
    a->open = 0;
}

/* Opens a block of kind (ANTHROPIC_BLOCK_*) unless one of that kind is open; block: its
 * content_block (taken). */
static void open_block(struct http_gen *g, int kind, cJSON *block)
{
    struct http_anthropic_stream *a = &g->an;
    stop_block(g);
    a->open = 1;
    a->kind = kind;
    a->index++;
    cJSON *o = typed("content_block_start");
    cJSON_AddNumberToObject(o, "index", a->index);
    cJSON_AddItemToObject(o, "content_block", block);
    event(g, "content_block_start", o);
}

static void delta(struct http_gen *g, const char *type, const char *name, const char *text)
{
    cJSON *o = typed("content_block_delta");
    cJSON_AddNumberToObject(o, "index", g->an.index);
    cJSON *d = http_json_ok(cJSON_AddObjectToObject(o, "delta"));
    cJSON_AddStringToObject(d, "type", type);
    cJSON_AddStringToObject(d, name, text);
    event(g, "content_block_delta", o);
}

enum { BLOCK_THINKING = 1, BLOCK_TEXT, BLOCK_TOOL };

void http_anthropic_chunk(struct http_gen *g, cJSON *chunk)
{
    struct http_anthropic_stream *a = &g->an;
    start_message(g);
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(chunk, "choices"), 0), "delta");
    const cJSON *r = cJSON_GetObjectItem(d, "reasoning_content");
    if (cJSON_IsString(r) && r->valuestring[0]) {
        if (!a->open || a->kind != BLOCK_THINKING) {
            cJSON *b = typed("thinking");
            cJSON_AddStringToObject(b, "thinking", "");
            cJSON_AddStringToObject(b, "signature", "");
            open_block(g, BLOCK_THINKING, b);
        }
        delta(g, "thinking_delta", "thinking", r->valuestring);
    }
    const cJSON *t = cJSON_GetObjectItem(d, "content");
    if (cJSON_IsString(t) && t->valuestring[0]) {
        if (!a->open || a->kind != BLOCK_TEXT) {
            cJSON *b = typed("text");
            cJSON_AddStringToObject(b, "text", "");
            open_block(g, BLOCK_TEXT, b);
        }
        delta(g, "text_delta", "text", t->valuestring);
    }
    const cJSON *calls = cJSON_GetObjectItem(d, "tool_calls");
    for (const cJSON *c = cJSON_IsArray(calls) ? calls->child : NULL; c; c = c->next) {
        const cJSON *f = cJSON_GetObjectItem(c, "function");
        const cJSON *id = cJSON_GetObjectItem(c, "id");
        if (cJSON_IsString(id)) { /* a new call */
            char tid[HTTP_CALL_ID_MAX + 8];
            snprintf(tid, sizeof tid, "toolu_%s", id->valuestring);
            cJSON *b = typed("tool_use");
            cJSON_AddStringToObject(b, "id", tid);
            cJSON_AddStringToObject(b, "name", cJSON_GetStringValue(cJSON_GetObjectItem(f, "name")));
            cJSON_AddItemToObject(b, "input", http_json_ok(cJSON_CreateObject()));
            open_block(g, BLOCK_TOOL, b);
            a->calls++;
        }
        const cJSON *args = cJSON_GetObjectItem(f, "arguments");
        if (cJSON_IsString(args) && args->valuestring[0] && a->open && a->kind == BLOCK_TOOL)
            delta(g, "input_json_delta", "partial_json", args->valuestring);
    }
    cJSON_Delete(chunk);
}

void http_anthropic_finish(struct http_gen *g)
{
    if (g->end_status != STATUS_OK) {
        cJSON *o = typed("error");
        cJSON *e = http_json_ok(cJSON_AddObjectToObject(o, "error"));
        const char *type;
        switch (g->end_status) {
        case STATUS_RESOURCE_EXHAUSTED:
        case STATUS_UNAVAILABLE: type = "overloaded_error"; break;
        case STATUS_INVALID_ARGUMENT: type = "invalid_request_error"; break;
        default: type = "api_error";
        }
        cJSON_AddStringToObject(e, "type", type);
        cJSON_AddStringToObject(e, "message", g->end_message);
        event(g, "error", o);
        g->done = 1;
        return;
    }
    start_message(g);
    /* A reply with no block at all still carries one (empty) text block, as the unary reply. */
    if (g->an.index < 0) {
        cJSON *b = typed("text");
        cJSON_AddStringToObject(b, "text", "");
        open_block(g, BLOCK_TEXT, b);
    }
    stop_block(g);
    cJSON *o = typed("message_delta");
    cJSON *d = http_json_ok(cJSON_AddObjectToObject(o, "delta"));
    stop_reason(g, g->an.calls > 0, d);
    add_usage(g, o, 0);
    event(g, "message_delta", o);
    event(g, "message_stop", typed("message_stop"));
    g->done = 1;
}
