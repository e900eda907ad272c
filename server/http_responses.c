/* server/http_responses.c - OpenAI's Responses API (POST /v1/responses) as a translation onto the
 * chat path, and the store of responses. The body is checked field by field (unknown fields,
 * and known ones this server does not honour, refused by name), its input items (and those of
 * the conversation that previous_response_id names) rewritten as the equivalent chat request
 * and parsed by http_parse_request, so that templates, tools, grammar constraints, reasoning and
 * every validation are the chat endpoint's own.
 * The store keeps each response stored with `store` (the default) for GET, cancel and
 * previous_response_id: at most --responses-store entries and HTTP_RESPONSES_STORE_BYTES of
 * JSON, the least recently used evicted first; lookups are a walk (the store is small).
 * Not here: Response objects, stream events and the id routes (http_responses_out.c); routes
 * and keys (http.c).
 * Tests: tests/server/test_responses.py. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "http_responses.h"
#include "tool_format.h"

#define get http_json_field
#define only_fields http_json_only_fields
#define dup_item http_json_dup

static enum status bad(const char *fmt, const char *a)
{
    return status_errorf(STATUS_INVALID_ARGUMENT, fmt, a);
}

static enum status unsupported(const char *fmt, const char *a)
{
    return status_errorf(STATUS_UNSUPPORTED, fmt, a);
}

/* ---- the store ------------------------------------------------------------------------------- */

struct stored {
    char   id[48];
    char   owner[JOURNAL_OWNER_MAX + 1]; /* auth_owner of its API key; "" without keys */
    char  *response;      /* the Response object, JSON */
    char  *items;         /* the conversation's input items, JSON */
    int    done;          /* response is final */
    struct http_gen *g;   /* while in progress: the request (no reference: forget clears it) */
    size_t bytes;
    struct stored *prev, *next; /* most recently used first */
};

struct http_responses_store {
    pthread_mutex_t mu;
    pthread_cond_t  cv;   /* broadcast when a response ends */
    struct stored  *head, *tail;
    int             n, max_entries;
    size_t          bytes, max_bytes;
};

enum status http_responses_store_init(int max_entries, size_t max_bytes, struct http_responses_store **out)
{
    struct http_responses_store *st = calloc(1, sizeof *st);
    if (!st) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cv, NULL);
    st->max_entries = max_entries;
    st->max_bytes = max_bytes;
    *out = st;
    return STATUS_OK;
}

static void unlink_entry(struct http_responses_store *st, struct stored *e)
{
    if (e->prev) e->prev->next = e->next;
    else st->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else st->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(struct http_responses_store *st, struct stored *e)
{
    e->next = st->head;
    if (st->head) st->head->prev = e;
    st->head = e;
    if (!st->tail) st->tail = e;
}

static void drop_entry(struct http_responses_store *st, struct stored *e)
{
    unlink_entry(st, e);
    st->n--;
    st->bytes -= e->bytes;
    free(e->response);
    free(e->items);
    free(e);
}

void http_responses_store_free(struct http_responses_store *st)
{
    if (!st) return;
    while (st->head) drop_entry(st, st->head);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cv);
    free(st);
}

/* With st->mu held: the entry of id that owner may see, made the most recently used. */
static struct stored *find(struct http_responses_store *st, const char *id, const char *owner)
{
    for (struct stored *e = st->head; e; e = e->next)
        if (!strcmp(e->id, id) && !strcmp(e->owner, owner)) {
            unlink_entry(st, e);
            push_front(st, e);
            return e;
        }
    return NULL;
}

static enum status not_found(const char *id)
{
    return status_errorf(STATUS_NOT_FOUND, "no response with id '%.64s' is stored (unknown, deleted, stored with "
                         "store: false, or evicted: see --responses-store)", id);
}

/* With st->mu held: evicts the least recently used finished entries past the bounds. */
static void evict(struct http_responses_store *st)
{
    struct stored *e = st->tail;
    while (e && (st->n > st->max_entries || st->bytes > st->max_bytes)) {
        struct stored *prev = e->prev;
        if (e->done) drop_entry(st, e);
        e = prev;
    }
}

static void set_bytes(struct http_responses_store *st, struct stored *e)
{
    st->bytes -= e->bytes;
    e->bytes = sizeof *e + (e->response ? strlen(e->response) : 0) + (e->items ? strlen(e->items) : 0);
    st->bytes += e->bytes;
}

enum status responses_store_get(struct http_responses_store *st, const char *id, const char *owner, int want_done,
                                char **response, char **items)
{
    pthread_mutex_lock(&st->mu);
    struct stored *e = find(st, id, owner);
    enum status s = STATUS_OK;
    if (!e) s = not_found(id);
    else if (want_done && !e->done)
        s = status_errorf(STATUS_FAILED_PRECONDITION, "the response '%.64s' is still in progress", id);
    if (s == STATUS_OK && response) CHECK(*response = strdup(e->response), "out of memory");
    if (s == STATUS_OK && items) CHECK(*items = strdup(e->items), "out of memory");
    pthread_mutex_unlock(&st->mu);
    return s;
}

void responses_store_put(struct http_responses_store *st, struct http_gen *g, char *response, int done)
{
    const struct http_responses *r = g->q.responses;
    pthread_mutex_lock(&st->mu);
    struct stored *e = NULL;
    for (e = st->head; e && strcmp(e->id, r->id); e = e->next) {}
    if (!e && !done) { /* a new response, in progress */
        CHECK(e = calloc(1, sizeof *e), "out of memory");
        snprintf(e->id, sizeof e->id, "%s", r->id);
        snprintf(e->owner, sizeof e->owner, "%s", g->q.owner); /* auth_owner of its API key */
        CHECK(e->items = cJSON_PrintUnformatted(r->items), "out of memory");
        e->g = g;
        push_front(st, e);
        st->n++;
    }
    if (e) {
        free(e->response);
        e->response = response;
        response = NULL;
        if (done) e->done = 1, e->g = NULL;
        set_bytes(st, e);
        evict(st);
    }
    free(response); /* the entry was deleted (or evicted) meanwhile */
    pthread_cond_broadcast(&st->cv);
    pthread_mutex_unlock(&st->mu);
}

enum status responses_store_delete(struct http_responses_store *st, const char *id, const char *owner)
{
    pthread_mutex_lock(&st->mu);
    struct stored *e = find(st, id, owner);
    if (e) drop_entry(st, e);
    pthread_mutex_unlock(&st->mu);
    return e ? STATUS_OK : not_found(id);
}

/* A reference to g unless it is being freed (its count reached 0). */
static int try_ref(struct http_gen *g)
{
    int n = atomic_load(&g->refs);
    while (n > 0)
        if (atomic_compare_exchange_weak(&g->refs, &n, n + 1)) return 1;
    return 0;
}

/* Whether the Response object json has status "cancelled". */
static int is_cancelled(const char *json)
{
    cJSON *o = cJSON_Parse(json);
    const char *status = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "status"));
    int yes = status && !strcmp(status, "cancelled");
    cJSON_Delete(o);
    return yes;
}

enum status responses_store_cancel(struct http_responses_store *st, const char *id, const char *owner, char **response)
{
    pthread_mutex_lock(&st->mu);
    struct stored *e = find(st, id, owner);
    if (!e) {
        pthread_mutex_unlock(&st->mu);
        return not_found(id);
    }
    struct http_gen *g = !e->done && e->g && try_ref(e->g) ? e->g : NULL;
    if (g) atomic_store(&g->q.responses->cancelled, 1);
    pthread_mutex_unlock(&st->mu);
    if (g) {
        http_gen_cancel(g); /* never under a lock the engine thread takes */
        http_gen_unref(g);
    }
    /* The request's connection writes the final (cancelled) object: waited for, briefly. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    pthread_mutex_lock(&st->mu);
    int rc = 0;
    while ((e = find(st, id, owner)) && !e->done && rc == 0) rc = pthread_cond_timedwait(&st->cv, &st->mu, &ts);
    enum status s = STATUS_OK;
    if (!e) s = not_found(id);
    else if (e->done && !is_cancelled(e->response))
        s = status_errorf(STATUS_FAILED_PRECONDITION, "the response '%.64s' already ended: only a response in "
                          "progress can be cancelled", id);
    else CHECK(*response = strdup(e->response), "out of memory");
    pthread_mutex_unlock(&st->mu);
    return s;
}

void http_responses_forget(struct http_gen *g)
{
    struct http_responses_store *st = g->s->http_responses;
    if (!st || !g->q.responses) return;
    pthread_mutex_lock(&st->mu);
    for (struct stored *e = st->head; e; e = e->next)
        if (e->g == g) e->g = NULL;
    pthread_mutex_unlock(&st->mu);
}

void http_responses_begin(struct http_gen *g)
{
    struct http_responses *r = g->q.responses;
    if (!r->store || !g->s->http_responses) return;
    cJSON *o = responses_object(g, "in_progress", NULL);
    char *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    CHECK(json, "out of memory");
    responses_store_put(g->s->http_responses, g, json, 0);
}

void http_responses_free(struct http_responses *r)
{
    if (!r) return;
    cJSON_Delete(r->echo);
    cJSON_Delete(r->items);
    cJSON_Delete(r->output);
    free(r->acc);
    free(r->chat);
    free(r);
}

void http_responses_reset_stream(struct http_responses *r)
{
    r->seq = r->started = r->open = r->kind = 0;
    r->index = -1;
    r->acc_len = 0;
    cJSON_Delete(r->output);
    r->output = NULL;
}

/* ---- input items into chat messages ---------------------------------------------------------- */

/* A content of a message item: a string, or a list of input_text / output_text parts (joined),
 * as one string (malloc'd). */
static enum status content_text(const cJSON *c, const char *where, char **out)
{
    static const char *const part_fields[] = {"type", "text", "annotations", "logprobs", NULL};
    char *text = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&text, &len, &cap, "", 0);
    if (cJSON_IsString(c)) http_buf_append(&text, &len, &cap, c->valuestring, strlen(c->valuestring));
    else if (!cJSON_IsArray(c)) {
        free(text);
        return bad("'%s.content' must be a string or a list of input_text parts", where);
    }
    int k = 0;
    for (const cJSON *p = cJSON_IsArray(c) ? c->child : NULL; p; p = p->next, k++) {
        char pw[96];
        snprintf(pw, sizeof pw, "%s.content[%d]", where, k);
        const cJSON *type = get(p, "type"), *t = get(p, "text");
        enum status st = STATUS_OK;
        if (!cJSON_IsObject(p) || !cJSON_IsString(type))
            st = bad("'%s' must be a content part with a string 'type'", pw);
        else if (strcmp(type->valuestring, "input_text") && strcmp(type->valuestring, "output_text"))
            st = status_errorf(STATUS_UNSUPPORTED, "'%s': content parts of type '%.32s' are not supported (input_text "
                               "and output_text are)", pw, type->valuestring);
        else if ((st = only_fields(p, pw, part_fields)) == STATUS_OK && !cJSON_IsString(t))
            st = bad("'%s.text' must be a string", pw);
        if (st != STATUS_OK) {
            free(text);
            return st;
        }
        http_buf_append(&text, &len, &cap, t->valuestring, strlen(t->valuestring));
    }
    *out = text;
    return STATUS_OK;
}

static void add_message(cJSON *msgs, const char *role, const char *content)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(msgs, m);
}

/* Item it (named where) appended to the chat messages msgs: a message as itself, a function
 * call as a tool call of an assistant message (the one just before, when the calls follow its
 * text), a call's output as a "tool" message; reasoning items of earlier turns are dropped (the
 * templates drop them too). */
static enum status add_item(const cJSON *it, const char *where, cJSON *msgs)
{
    static const char *const msg_fields[] = {"type", "role", "content", "id", "status", NULL};
    static const char *const call_fields[] = {"type", "call_id", "name", "arguments", "id", "status", NULL};
    static const char *const out_fields[] = {"type", "call_id", "output", "id", "status", NULL};
    static const char *const rs_fields[] = {"type", "id", "summary", "content", "encrypted_content", "status", NULL};
    if (!cJSON_IsObject(it)) return bad("'%s' must be an object (an input item)", where);
    const cJSON *type = get(it, "type");
    if (type && !cJSON_IsString(type)) return bad("'%s.type' must be a string", where);
    const char *t = type ? type->valuestring : "message";
    enum status st;
    if (!strcmp(t, "message")) {
        if ((st = only_fields(it, where, msg_fields)) != STATUS_OK) return st;
        const cJSON *role = get(it, "role");
        static const char *const roles[] = {"user", "system", "developer", "assistant"};
        int ok = 0;
        for (size_t i = 0; i < 4 && cJSON_IsString(role) && !ok; i++) ok = !strcmp(role->valuestring, roles[i]);
        if (!ok) return bad("'%s.role' must be user, system, developer or assistant", where);
        if (!get(it, "content")) return bad("'%s.content' is required", where);
        char *text = NULL;
        if ((st = content_text(get(it, "content"), where, &text)) != STATUS_OK) return st;
        add_message(msgs, role->valuestring, text);
        free(text);
        return STATUS_OK;
    }
    if (!strcmp(t, "function_call")) {
        if ((st = only_fields(it, where, call_fields)) != STATUS_OK) return st;
        const cJSON *id = get(it, "call_id"), *name = get(it, "name"), *args = get(it, "arguments");
        if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsString(args))
            return bad("'%s' (function_call) needs call_id, name and arguments (strings)", where);
        cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
        const cJSON *lrole = last ? cJSON_GetObjectItem(last, "role") : NULL;
        if (!lrole || strcmp(lrole->valuestring, "assistant")) {
            add_message(msgs, "assistant", "");
            last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
        }
        cJSON *calls = cJSON_GetObjectItem(last, "tool_calls");
        if (!calls) calls = cJSON_AddArrayToObject(last, "tool_calls");
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "id", id->valuestring);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", args->valuestring);
        cJSON_AddItemToArray(calls, c);
        return STATUS_OK;
    }
    if (!strcmp(t, "function_call_output")) {
        if ((st = only_fields(it, where, out_fields)) != STATUS_OK) return st;
        const cJSON *id = get(it, "call_id"), *out = get(it, "output");
        if (!cJSON_IsString(id) || !out) return bad("'%s' (function_call_output) needs call_id and output", where);
        char *text = NULL;
        if ((st = content_text(out, where, &text)) != STATUS_OK) return st;
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
        free(text);
        return STATUS_OK;
    }
    if (!strcmp(t, "reasoning")) return only_fields(it, where, rs_fields);
    return status_errorf(STATUS_UNSUPPORTED, "'%s': input items of type '%.32s' are not supported (message, "
                         "function_call, function_call_output and reasoning are)", where, t);
}

/* ---- the request ----------------------------------------------------------------------------- */

/* tools: [{type: function, name, description, parameters, strict}] -> chat tools; the Responses
 * shape is kept for the Response object. strict is accepted: calls are always constrained. */
static enum status add_tools(const cJSON *tools, cJSON *chat)
{
    static const char *const fields[] = {"type", "name", "description", "parameters", "strict", NULL};
    if (!cJSON_IsArray(tools)) return bad("'tools' must be a list%s", "");
    cJSON *list = cJSON_AddArrayToObject(chat, "tools");
    int k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        char where[32];
        snprintf(where, sizeof where, "tools[%d]", k);
        if (!cJSON_IsObject(t)) return bad("'%s' must be an object", where);
        const cJSON *type = get(t, "type"), *name = get(t, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return status_errorf(STATUS_UNSUPPORTED, "'%s.type': only function tools are supported, got '%.32s'", where,
                                 cJSON_IsString(type) ? type->valuestring : "(not a string)");
        enum status st = only_fields(t, where, fields);
        if (st != STATUS_OK) return st;
        if (!cJSON_IsString(name)) return bad("'%s.name' must be a string", where);
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "type", "function");
        cJSON *fn = cJSON_AddObjectToObject(f, "function");
        static const char *const pass[] = {"name", "description", "parameters"};
        for (size_t i = 0; i < 3; i++)
            if (get(t, pass[i])) cJSON_AddItemToObject(fn, pass[i], dup_item(get(t, pass[i])));
        cJSON_AddItemToArray(list, f);
    }
    return STATUS_OK;
}

/* tool_choice: none | auto | required | {type: function, name}. */
static enum status add_tool_choice(const cJSON *tc, cJSON *chat)
{
    static const char *const fields[] = {"type", "name", NULL};
    if (cJSON_IsString(tc)) {
        if (strcmp(tc->valuestring, "none") && strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "required"))
            return bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}%s", "");
        cJSON_AddItemToObject(chat, "tool_choice", dup_item(tc));
        return STATUS_OK;
    }
    const cJSON *type = get(tc, "type"), *name = get(tc, "name");
    if (!cJSON_IsObject(tc) || !cJSON_IsString(type))
        return bad("'tool_choice' must be none, auto, required or {\"type\": \"function\", \"name\": ...}%s", "");
    if (strcmp(type->valuestring, "function"))
        return unsupported("'tool_choice.type': only function is supported, got '%.32s'", type->valuestring);
    enum status st = only_fields(tc, "tool_choice", fields);
    if (st != STATUS_OK) return st;
    if (!cJSON_IsString(name)) return bad("'tool_choice.name' must be a string%s", "");
    cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice");
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", name->valuestring);
    return STATUS_OK;
}

/* text: {format: {type: text | json_object | json_schema (name, schema, description, strict)}}
 * -> response_format. strict: false is enforced too (the grammar always is). */
static enum status add_text(const cJSON *text, cJSON *chat)
{
    static const char *const fields[] = {"format", "verbosity", NULL};
    static const char *const schema_fields[] = {"type", "name", "schema", "description", "strict", NULL};
    if (!cJSON_IsObject(text)) return bad("'text' must be an object%s", "");
    enum status st = only_fields(text, "text", fields);
    if (st != STATUS_OK) return st;
    if (get(text, "verbosity")) return unsupported("'text.verbosity' is not supported by this server%s", "");
    const cJSON *f = get(text, "format");
    if (!f) return STATUS_OK;
    const cJSON *type = get(f, "type");
    if (!cJSON_IsObject(f) || !cJSON_IsString(type)) return bad("'text.format' must be an object with a 'type'%s", "");
    const char *t = type->valuestring;
    if (!strcmp(t, "text") || !strcmp(t, "json_object")) {
        static const char *const plain[] = {"type", NULL};
        if ((st = only_fields(f, "text.format", plain)) != STATUS_OK) return st;
        if (!strcmp(t, "json_object")) cJSON_AddStringToObject(cJSON_AddObjectToObject(chat, "response_format"), "type", t);
        return STATUS_OK;
    }
    if (strcmp(t, "json_schema")) return bad("'text.format.type' must be text, json_object or json_schema, got '%.32s'", t);
    if ((st = only_fields(f, "text.format", schema_fields)) != STATUS_OK) return st;
    if (!cJSON_IsString(get(f, "name")) || !cJSON_IsObject(get(f, "schema")))
        return bad("'text.format' (json_schema) needs name (a string) and schema (an object)%s", "");
    cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
    cJSON_AddStringToObject(rf, "type", "json_schema");
    cJSON *js = cJSON_AddObjectToObject(rf, "json_schema");
    cJSON_AddItemToObject(js, "name", dup_item(get(f, "name")));
    cJSON_AddItemToObject(js, "schema", dup_item(get(f, "schema")));
    return STATUS_OK;
}

/* reasoning: {effort, summary}. The chat path can only turn a template's thinking on or off
 * (chat_template_kwargs.enable_thinking): effort "none" turns it off; graded efforts and
 * summaries are not honoured, so they are refused. */
static enum status add_reasoning(const cJSON *rs, const struct http_chat_caps *caps, cJSON *chat)
{
    static const char *const fields[] = {"effort", "summary", "generate_summary", NULL};
    if (!cJSON_IsObject(rs)) return bad("'reasoning' must be an object%s", "");
    enum status st = only_fields(rs, "reasoning", fields);
    if (st != STATUS_OK) return st;
    if (get(rs, "summary") || get(rs, "generate_summary"))
        return unsupported("'reasoning.summary' is not supported: reasoning comes as the reasoning items' text, "
                           "never summarized%s", "");
    const cJSON *e = get(rs, "effort");
    if (!e) return STATUS_OK;
    if (!cJSON_IsString(e)) return bad("'reasoning.effort' must be a string%s", "");
    const char *v = e->valuestring;
    if (caps && caps->jinja && caps->effort && (!strcmp(v, "low") || !strcmp(v, "medium") || !strcmp(v, "high"))) {
        cJSON_AddStringToObject(chat, "reasoning_effort", v); /* the template's own (GPT-OSS's) */
        return STATUS_OK;
    }
    if (strcmp(e->valuestring, "none"))
        return unsupported("'reasoning.effort' '%.16s' is not honoured: the server can only turn the template's "
                           "thinking off (effort none), leave it as the template has it (no effort), or give low, "
                           "medium or high to a template that reads reasoning_effort (GPT-OSS's)", e->valuestring);
    if (caps && caps->reasoning == TOOL_REASONING_HARMONY)
        return unsupported("'reasoning.effort' none is not honoured: GPT-OSS's template cannot turn its reasoning "
                           "off (low is the least)%s", "");
    if (caps && caps->reasoning && caps->jinja && !caps->thinking_switch)
        return unsupported("'reasoning.effort' none is not honoured: the served chat template does not read "
                           "enable_thinking, so its reasoning cannot be turned off%s", "");
    if (caps && caps->reasoning && caps->jinja)
        cJSON_AddFalseToObject(cJSON_AddObjectToObject(chat, "chat_template_kwargs"), "enable_thinking");
    return STATUS_OK;
}

/* metadata: at most 16 string values (keys up to 64 bytes, values up to 512), kept and repeated. */
static enum status check_metadata(const cJSON *m)
{
    if (!cJSON_IsObject(m)) return bad("'metadata' must be an object of strings%s", "");
    if (cJSON_GetArraySize(m) > 16) return bad("'metadata' holds at most 16 pairs%s", "");
    for (const cJSON *e = m->child; e; e = e->next)
        if (!cJSON_IsString(e) || strlen(e->string) > 64 || strlen(e->valuestring) > 512)
            return bad("'metadata.%.64s' must be a string of at most 512 bytes (keys at most 64)", e->string);
    return STATUS_OK;
}

/* Fields that ask for nothing when absent, null or this value (a JSON literal) are accepted
 * then; any other value is refused by name. */
static enum status refuse_inert(const cJSON *o)
{
    static const struct {
        const char *name, *inert;
    } fields[] = {{"background", "false"}, {"truncation", "\"disabled\""}, {"include", "[]"},
                  {"service_tier", "\"auto\""}, {"max_tool_calls", NULL}, {"top_logprobs", "0"},
                  {"prompt", NULL}, {"prompt_cache_key", NULL}, {"safety_identifier", NULL},
                  {"conversation", NULL}, {"stream_options", NULL}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        const cJSON *v = get(o, fields[i].name);
        if (!v) continue;
        char *s = cJSON_PrintUnformatted(v);
        int inert = s && fields[i].inert && !strcmp(s, fields[i].inert);
        free(s);
        if (!inert) return unsupported("'%s' is not supported by this server", fields[i].name);
    }
    return STATUS_OK;
}

/* The Response object's repetition of the request (its defaults filled in). */
static cJSON *echo_of(const cJSON *o)
{
    cJSON *e = cJSON_CreateObject();
    CHECK(e, "out of memory");
    static const struct {
        const char *name, *dflt;
    } fields[] = {{"instructions", "null"},     {"max_output_tokens", "null"}, {"metadata", "{}"},
                  {"parallel_tool_calls", "true"}, {"previous_response_id", "null"},
                  {"reasoning", "{\"effort\":null,\"summary\":null}"},      {"store", "true"},
                  {"temperature", "1"},         {"text", "{\"format\":{\"type\":\"text\"}}"},
                  {"tool_choice", "\"auto\""},  {"tools", "[]"},            {"top_p", "1"},
                  {"truncation", "\"disabled\""}, {"background", "false"},   {"user", "null"}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        const cJSON *v = get(o, fields[i].name);
        cJSON *d = v ? dup_item(v) : cJSON_Parse(fields[i].dflt);
        CHECK(d, "out of memory");
        cJSON_AddItemToObject(e, fields[i].name, d);
    }
    return e;
}

/* The fields of POST /v1/responses/input_tokens (the official client's): the request's prompt
 * only, nothing about generating or keeping the answer. */
static const char *const count_fields[] = {"model", "input", "instructions", "tools", "tool_choice",
                                           "parallel_tool_calls", "text", "reasoning", "previous_response_id",
                                           "truncation", "conversation", NULL};

/* An id for this request's input item k (of type t) that came without one, so that
 * /v1/responses/{id}/input_items can page by ids: "<kind>_<response id's hex>_in<k>". */
static void give_id(const struct http_responses *r, cJSON *it, int k)
{
    if (!cJSON_IsObject(it) || get(it, "id")) return; /* a wrong item is refused by add_item */
    const char *t = cJSON_GetStringValue(get(it, "type"));
    const char *prefix = !t || !strcmp(t, "message")      ? "msg"
                         : !strcmp(t, "function_call")        ? "fc"
                         : !strcmp(t, "function_call_output") ? "fco"
                         : !strcmp(t, "reasoning")            ? "rs"
                                                              : "item";
    char id[96];
    snprintf(id, sizeof id, "%s_%s_in%d", prefix, r->id + 5, k);
    cJSON_AddItemToObject(it, "id", http_json_ok(cJSON_CreateString(id)));
}

/* The Responses body o as a chat body (*out), and the conversation's items into r->items
 * (count: /v1/responses/input_tokens, whose fields are count_fields). */
static enum status translate(struct server *s, const cJSON *o, const char *owner, const struct http_chat_caps *caps,
                             int count, struct http_responses *r, cJSON **out)
{
    static const char *const fields[] = {
        "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text", "reasoning",
        "max_output_tokens", "temperature", "top_p", "seed", "metadata", "store", "stream", "previous_response_id",
        "user", "background", "truncation", "include", "service_tier", "max_tool_calls", "top_logprobs", "prompt",
        "prompt_cache_key", "safety_identifier", "conversation", "stream_options", "cache_salt", NULL};
    enum status st = only_fields(o, "", count ? count_fields : fields);
    if (st == STATUS_OK) st = refuse_inert(o);
    if (st != STATUS_OK) return st;
    cJSON *c = cJSON_CreateObject();
    CHECK(c, "out of memory");
    *out = c;
    /* cache_salt: vLLM's extra field, checked by the chat parser. */
    static const char *const pass[] = {"model", "temperature", "top_p", "seed", "stream", "user", "parallel_tool_calls",
                                       "cache_salt"};
    for (size_t i = 0; i < sizeof pass / sizeof *pass; i++)
        if (get(o, pass[i])) cJSON_AddItemToObject(c, pass[i], dup_item(get(o, pass[i])));
    const cJSON *v;
    if ((v = get(o, "max_output_tokens"))) cJSON_AddItemToObject(c, "max_tokens", dup_item(v));
    if ((v = get(o, "store")) && !cJSON_IsBool(v)) return bad("'store' must be a boolean%s", "");
    r->store = !v || cJSON_IsTrue(v);
    if ((v = get(o, "metadata")) && (st = check_metadata(v)) != STATUS_OK) return st;
    cJSON *msgs = cJSON_AddArrayToObject(c, "messages");
    if ((v = get(o, "instructions"))) {
        if (!cJSON_IsString(v)) return bad("'instructions' must be a string%s", "");
        add_message(msgs, "system", v->valuestring);
    }
    /* The conversation: the previous response's items and output, then this input. */
    CHECK(r->items = cJSON_CreateArray(), "out of memory");
    int n_prev = 0;
    if ((v = get(o, "previous_response_id"))) {
        if (!cJSON_IsString(v)) return bad("'previous_response_id' must be a string%s", "");
        if (!s->http_responses) return not_found(v->valuestring);
        char *resp = NULL, *items = NULL;
        st = responses_store_get(s->http_responses, v->valuestring, owner, 1, &resp, &items);
        if (st != STATUS_OK) return st;
        cJSON *pi = cJSON_Parse(items), *pr = cJSON_Parse(resp);
        free(items);
        free(resp);
        CHECK(pi && pr, "a stored response did not parse");
        cJSON_Delete(r->items);
        r->items = pi;
        cJSON *output = cJSON_DetachItemFromObject(pr, "output");
        cJSON_Delete(pr);
        while (output && output->child) cJSON_AddItemToArray(r->items, cJSON_DetachItemViaPointer(output, output->child));
        cJSON_Delete(output);
        n_prev = cJSON_GetArraySize(r->items);
    }
    v = get(o, "input");
    if (!v) return bad("'input' is required%s", "");
    if (cJSON_IsString(v)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "type", "message");
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", v->valuestring);
        give_id(r, m, 0);
        cJSON_AddItemToArray(r->items, m);
    } else if (cJSON_IsArray(v) && v->child) {
        int k = 0;
        for (const cJSON *it = v->child; it; it = it->next, k++) {
            cJSON *copy = dup_item(it);
            give_id(r, copy, k);
            cJSON_AddItemToArray(r->items, copy);
        }
    } else {
        return bad("'input' must be a string or a non-empty list of input items%s", "");
    }
    /* As many items as a chat's messages (http_openai.c), before any of them is read: a function
     * call item looks for the message before it (a walk of the list), which over a 4 MB body of
     * tens of thousands of items was seconds of a core per request. */
    const int n_items = cJSON_GetArraySize(r->items);
    if (n_items > HTTP_MAX_MESSAGES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'input': at most %d items with those of previous_response_id, "
                             "got %d", HTTP_MAX_MESSAGES, n_items);
    int i = 0;
    for (const cJSON *it = r->items->child; it; it = it->next, i++) {
        char where[48];
        if (i < n_prev) snprintf(where, sizeof where, "(previous_response_id's item %d)", i);
        else snprintf(where, sizeof where, "input[%d]", i - n_prev);
        if ((st = add_item(it, where, msgs)) != STATUS_OK) return st;
    }
    if ((v = get(o, "tools")) && (st = add_tools(v, c)) != STATUS_OK) return st;
    if ((v = get(o, "tool_choice")) && (st = add_tool_choice(v, c)) != STATUS_OK) return st;
    if ((v = get(o, "text")) && (st = add_text(v, c)) != STATUS_OK) return st;
    if ((v = get(o, "reasoning")) && (st = add_reasoning(v, caps, c)) != STATUS_OK) return st;
    r->echo = echo_of(o);
    return STATUS_OK;
}

/* http_responses_parse, or with count http_responses_count_parse. */
static enum status parse(struct server *s, const char *model_id, const char *body, size_t len, const char *owner,
                         int count,
                         const char *const *adapters, int n_adapters, const struct http_chat_caps *caps,
                         struct http_request *q)
{
    memset(q, 0, sizeof *q);
    cJSON *o = NULL;
    enum status st = http_json_parse_body(body, len, &o);
    if (st != STATUS_OK) return st;
    struct http_responses *r = calloc(1, sizeof *r);
    if (!r) {
        cJSON_Delete(o);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    unsigned char rnd[12];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) {
        cJSON_Delete(o);
        free(r);
        return status_errorf(STATUS_INTERNAL, "no random bytes for a response id");
    }
    int o_len = snprintf(r->id, sizeof r->id, "resp_");
    for (size_t i = 0; i < sizeof rnd; i++) o_len += snprintf(r->id + o_len, sizeof r->id - (size_t)o_len, "%02x", rnd[i]);
    r->created = (long long)time(NULL);
    r->index = -1;
    cJSON *c = NULL;
    st = translate(s, o, owner, caps, count, r, &c);
    cJSON_Delete(o);
    char *text = st == STATUS_OK ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(c);
    if (st != STATUS_OK) {
        http_responses_free(r);
        return st;
    }
    CHECK(text, "out of memory");
    st = http_parse_request(text, strlen(text), 1, model_id, adapters, n_adapters, caps, q);
    r->chat = text;
    q->responses = r; /* freed with q */
    return st;
}

/* ---- the stream journal ---------------------------------------------------------------------- */

char *http_responses_journal_body(const struct http_gen *g)
{
    const struct http_responses *r = g->q.responses;
    cJSON *o = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "id", r->id);
    cJSON_AddNumberToObject(o, "created", (double)r->created);
    cJSON_AddBoolToObject(o, "store", r->store);
    cJSON_AddItemToObject(o, "echo", dup_item(r->echo));
    cJSON_AddItemToObject(o, "items", dup_item(r->items));
    cJSON_AddStringToObject(o, "chat", r->chat);
    return http_json_print(o);
}

enum status http_responses_restore(const char *body, size_t len, const char *model_id, const char *const *adapters,
                                   int n_adapters, const struct http_chat_caps *caps, struct http_request *q)
{
    memset(q, 0, sizeof *q);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *id = get(o, "id"), *created = get(o, "created"), *chat = get(o, "chat");
    if (!cJSON_IsString(id) || strlen(id->valuestring) >= sizeof ((struct http_responses *)0)->id ||
        !cJSON_IsNumber(created) || !cJSON_IsString(chat) || !get(o, "echo") ||
        !cJSON_IsArray(get(o, "items"))) {
        cJSON_Delete(o);
        return status_errorf(STATUS_BAD_FORMAT, "a journaled /v1/responses request is malformed");
    }
    enum status st = http_parse_request(chat->valuestring, strlen(chat->valuestring), 1, model_id, adapters,
                                        n_adapters, caps, q);
    struct http_responses *r = calloc(1, sizeof *r);
    CHECK(r, "out of memory");
    snprintf(r->id, sizeof r->id, "%s", id->valuestring);
    r->created = (long long)created->valuedouble;
    r->store = cJSON_IsTrue(get(o, "store"));
    r->index = -1;
    r->echo = cJSON_DetachItemFromObjectCaseSensitive(o, "echo");
    r->items = cJSON_DetachItemFromObjectCaseSensitive(o, "items");
    CHECK(r->chat = strdup(chat->valuestring), "out of memory");
    q->responses = r;
    cJSON_Delete(o);
    return st;
}

enum status http_responses_parse(struct server *s, const char *model_id, const char *body, size_t len,
                                 const char *owner, const char *const *adapters,
                                 int n_adapters, const struct http_chat_caps *caps, struct http_request *q)
{
    return parse(s, model_id, body, len, owner, 0, adapters, n_adapters, caps, q);
}

enum status http_responses_count_parse(struct server *s, const char *model_id, const char *body, size_t len,
                                       const char *owner, const char *const *adapters,
                                       int n_adapters, const struct http_chat_caps *caps, struct http_request *q)
{
    return parse(s, model_id, body, len, owner, 1, adapters, n_adapters, caps, q);
}
