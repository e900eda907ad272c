/* server/http.c - the OpenAI-compatible HTTP front (`serve --http ADDR`) on libmicrohttpd: a
 * thread per connection and a bounded number of connections; routes POST /v1/completions,
 * POST /v1/chat/completions (unary, or server-sent events with `stream: true`), Anthropic's
 * POST /v1/messages and /v1/messages/count_tokens (http_anthropic.c), POST /v1/embeddings
 * (http_embeddings.c), OpenAI's Responses API (POST /v1/responses, GET / DELETE
 * /v1/responses/{id}, POST .../cancel, GET .../input_items, POST /v1/responses/input_tokens:
 * http_responses.c), GET
 * /v1/models, GET /health, GET /metrics; API keys as `Authorization: Bearer` or `x-api-key`; TLS from the
 * same files as gRPC; and the one mapping of enum status to HTTP codes and OpenAI error types
 * (http_status). Requests go through the same path as gRPC's: gen_prompt (template,
 * tokenizer), engine_validate (the one validator), engine_submit. A client that goes away
 * (its socket hung up, or a write failed) cancels its request, which frees its KV blocks.
 * Not here: a generation request's life with the engine (http_gen.c), connection slots and
 * deadlines (http_guard.c), the JSON (http_openai.c), gRPC (server.c), metrics (metrics.c).
 * Tests: tests/server/test_http.py. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include "http_internal.h"
#include "metrics.h"
#include "tokenizer.h"


/* The one mapping from shardlm errors to HTTP codes and OpenAI error types. */
static unsigned http_status(enum status s, const char **type)
{
    switch (s) {
    case STATUS_OK: *type = ""; return 200;
    case STATUS_INVALID_ARGUMENT:
    case STATUS_BAD_FORMAT:
    case STATUS_UNSUPPORTED: *type = "invalid_request_error"; return 400;
    case STATUS_NOT_FOUND: *type = "not_found_error"; return 404;
    case STATUS_RESOURCE_EXHAUSTED: *type = "rate_limit_error"; return 429;
    case STATUS_UNAVAILABLE: *type = "service_unavailable_error"; return 503;
    case STATUS_DEADLINE_EXCEEDED: *type = "timeout_error"; return 504;
    case STATUS_CANCELLED: *type = "cancelled_error"; return 499;
    case STATUS_ALREADY_EXISTS:
    case STATUS_FAILED_PRECONDITION: *type = "conflict_error"; return 409;
    case STATUS_IO:
    case STATUS_INTERNAL: break;
    }
    *type = "server_error";
    return 500;
}

/* Queues a response that takes body[0..len) (malloc'd), with up to two more headers (name,
 * value pairs; NULL names end the list). */
static enum MHD_Result reply_with(struct MHD_Connection *c, unsigned code, const char *ctype, char *body, size_t len,
                                  const char *h1, const char *v1, const char *h2, const char *v2)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (h1) MHD_add_response_header(r, h1, v1);
    if (h1 && h2) MHD_add_response_header(r, h2, v2);
    enum MHD_Result ret = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code, const char *ctype, char *body, size_t len)
{
    return reply_with(c, code, ctype, body, len, NULL, NULL, NULL, NULL);
}

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned code, char *json)
{
    return reply(c, code, "application/json", json, strlen(json));
}

/* An error body in the route's shape: OpenAI's, or Anthropic's (an: the /v1/messages routes,
 * whose error type follows from the code: http_anthropic_error_json). */
static char *error_body(int an, unsigned code, const char *type, const char *code_name, const char *message)
{
    return an ? http_anthropic_error_json(code, message) : http_error_json(message, type, NULL, code_name);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, int an, unsigned code, const char *type,
                                   const char *code_name, const char *message)
{
    return reply_json(c, code, error_body(an, code, type, code_name, message));
}

static enum MHD_Result reply_status(struct MHD_Connection *c, int an, enum status st, const char *message)
{
    const char *type;
    unsigned code = http_status(st, &type);
    return reply_error(c, an, code, type, status_name(st), message);
}

/* The key the request carries: `Authorization: Bearer <key>`, or Anthropic's `x-api-key:
 * <key>` (on every route); NULL when neither. */
static const char *request_key(struct MHD_Connection *c)
{
    const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (v && !strncmp(v, "Bearer ", 7)) return v + 7;
    return MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
}

/* 1 when no key is required or the request carries one of them. */
static int authorized(struct server *s, struct MHD_Connection *c)
{
    if (s->n_keys == 0) return 1;
    const char *k = request_key(c);
    return k && auth_key_index(s, k, strlen(k)) >= 0;
}

/* Who asks, for --scheduling-policy fair: the API key ("key:<index>", as over gRPC) when keys
 * are in use; else the request's `user` field when given ("user:<name>"); else the connection's
 * peer ("http:127.0.0.1:40312"). Replaces q->r.client. */
static void set_client(struct server *s, struct MHD_Connection *c, struct http_request *q)
{
    char name[128];
    const char *k = s->n_keys ? request_key(c) : NULL;
    if (k) {
        auth_client_name(auth_key_index(s, k, strlen(k)), name, sizeof name);
    } else if (q->r.client) {
        return; /* http_parse_request made it "user:<name>" */
    } else {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        char host[64] = "?";
        int port = 0;
        const struct sockaddr *sa = ci ? ci->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET) {
            const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
            inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
            port = ntohs(in->sin_port);
        } else if (sa && sa->sa_family == AF_INET6) {
            const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
            inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
            port = ntohs(in6->sin6_port);
        }
        snprintf(name, sizeof name, "http:%s:%d", host, port);
    }
    free(q->r.client);
    q->r.client = strdup(name);
    CHECK(q->r.client, "out of memory");
    q->r.params.client = q->r.client;
}


/* Who sends (auth_owner of the request's API key, "" without keys): who may reattach to a
 * journaled request and see a stored response. */
static void request_owner(struct server *s, struct MHD_Connection *c, char *out, size_t cap)
{
    const char *k = s->n_keys ? request_key(c) : NULL;
    auth_owner(s, k ? auth_key_index(s, k, strlen(k)) : -1, out, cap);
}

/* The first query parameter's name (cls: a char[64]). */
static enum MHD_Result first_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    (void)value;
    snprintf(cls, 64, "%s", key);
    return MHD_NO;
}

/* 1 when the request has a query parameter, refused by name in *ret: a route that pages a list
 * reads its own (http_list.c); on every other API route none is honoured. */
static int refuse_query(struct MHD_Connection *c, enum MHD_Result *ret)
{
    char arg[64] = "";
    if (MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, first_arg, arg) == 0) return 0;
    char msg[128];
    snprintf(msg, sizeof msg, "the query parameter '%s' is not supported by this server", arg);
    *ret = reply_status(c, 0, STATUS_UNSUPPORTED, msg);
    return 1;
}

/* GET / DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel (http_responses_out.c). Query
 * parameters (include, stream, starting_after) are refused by name (dispatch, refuse_query). */
static enum MHD_Result handle_response_item(struct server *s, struct MHD_Connection *c, const char *url,
                                            const char *method)
{
    char owner[JOURNAL_OWNER_MAX + 1], *json = NULL;
    request_owner(s, c, owner, sizeof owner);
    enum status st = http_responses_item(s, owner, method, url, &json);
    if (st != STATUS_OK) return reply_status(c, 0, st, status_message());
    return reply_json(c, 200, json);
}

/* Collects a query parameter into cls (a struct http_query). */
static enum MHD_Result query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    struct http_query *q = cls;
    if (q->n == HTTP_MAX_QUERY) return q->more = 1, MHD_NO;
    q->key[q->n] = key;
    q->value[q->n++] = value ? value : "";
    return MHD_YES;
}

/* GET /v1/responses/{id}/input_items: its query parameters are http_responses_out.c's to check. */
static enum MHD_Result handle_input_items(struct server *s, struct MHD_Connection *c, const char *url)
{
    char owner[JOURNAL_OWNER_MAX + 1], *json = NULL;
    struct http_query q = {.n = 0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, query_arg, &q);
    request_owner(s, c, owner, sizeof owner);
    enum status st = http_responses_input_items(s, owner, url, &q, &json);
    if (st != STATUS_OK) return reply_status(c, 0, st, status_message());
    return reply_json(c, 200, json);
}

/* The state of one HTTP request across libmicrohttpd's calls of the handler. */
struct http_conn {
    char   *body;
    size_t  len, cap;
    int     too_big;
    int     upload;     /* POST /v1/files (fine-tuning on): the upload limit, not a request's */
    enum http_route route;
    struct http_slot *slot; /* the connection's (http_guard.c) */
    struct http_gen *g;  /* a submitted generation request (one reference) */
};

/* The largest body of a request: a file upload's (--fine-tuning-max-file-mb, POST /v1/files where
 * fine-tuning is on), else a request's (--max-message-bytes: a job's creation too; without
 * fine-tuning its routes are answered 404 by their handler). */
static size_t body_limit(const struct server *s, const struct http_conn *hc)
{
    return hc->upload ? (size_t)s->opts.finetune_max_file_mb << 20 : (size_t)s->opts.max_receive_bytes;
}

static const char *body_limit_flag(const struct http_conn *hc)
{
    return hc->upload ? "--fine-tuning-max-file-mb" : "--max-message-bytes";
}

/* 413 for a body over body_limit (declared or grown past it), naming the limit and its flag. */
static enum MHD_Result reply_too_large(const struct server *s, struct MHD_Connection *c, int an_api,
                                       const struct http_conn *hc)
{
    char msg[128];
    snprintf(msg, sizeof msg, "the request body is larger than %zu bytes (%s)", body_limit(s, hc), body_limit_flag(hc));
    return reply_error(c, an_api, 413, "invalid_request_error", "request_too_large", msg);
}

static int connection_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The adapters loaded now, by name (LoadAdapter and UnloadAdapter change the list), but those the
 * request's key may not see (http_finetune_hidden). */
static void snapshot_adapter(void *ctx, const struct engine_adapter_info *a)
{
    struct http_adapter_snapshot *an = ctx;
    if (an->n == ENGINE_MAX_ADAPTERS || http_finetune_hidden(an->s, a->name, an->owner)) return;
    snprintf(an->names[an->n], sizeof an->names[an->n], "%s", a->name);
    an->ptrs[an->n] = an->names[an->n];
    an->n++;
}

void http_adapter_snapshot(struct server *s, struct served_model *m, const char *owner, struct http_adapter_snapshot *an)
{
    an->n = 0;
    an->s = s, an->owner = owner;
    engine_list_adapters(m->engine, snapshot_adapter, an);
}

/* /v1/messages/count_tokens (an_api) and /v1/responses/input_tokens: the prompt's token count as
 * the chat path makes it (gen_prompt), without submitting. */
static enum MHD_Result reply_count(struct server *s, struct MHD_Connection *c, struct http_request *q, int an_api)
{
    int32_t *ids = NULL;
    int n = 0;
    enum status st = gen_prompt(q->model ? q->model : &s->models[0], &q->r, 1, &ids, &n);
    free(ids);
    http_request_free(q);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        return reply_status(c, an_api, st, msg);
    }
    return reply_json(c, 200, an_api ? http_anthropic_count_json(n) : http_responses_count_json(n));
}

static enum MHD_Result serve_gen(struct server *s, struct MHD_Connection *c, struct http_conn *hc, struct http_gen *g,
                                 int an_api);

/* The journal's headers (docs/reliability.md): Last-Event-ID "KEY;STATE" or Idempotency-Key
 * "KEY" naming a journaled request reattach to it (*g, a reference). STATUS_OK with *g NULL: a
 * new request (*new_key: an Idempotency-Key that names none becomes its id, else NULL). Errors
 * refuse the request: a Last-Event-ID that names nothing is STATUS_NOT_FOUND. */
static enum status resume_header(struct server *s, struct MHD_Connection *c, struct http_conn *hc, struct http_gen **g,
                                 const char **new_key)
{
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    const char *name = last ? "Last-Event-ID" : "Idempotency-Key";
    *g = NULL, *new_key = NULL;
    resume_sweep(s);
    if (!last && !idem) return STATUS_OK;
    if (!s->journal)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s is honoured only by a server with a stream journal (serve --journal DIR)", name);
    const int front = hc->route == ROUTE_CHAT       ? JOURNAL_HTTP_CHAT
                      : hc->route == ROUTE_COMPLETIONS ? JOURNAL_HTTP_COMPLETIONS
                      : hc->route == ROUTE_MESSAGES    ? JOURNAL_HTTP_MESSAGES
                      : hc->route == ROUTE_RESPONSES   ? JOURNAL_HTTP_RESPONSES
                                                       : 0;
    if (!front)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s is honoured only on /v1/chat/completions, /v1/completions, "
                             "/v1/messages and /v1/responses", name);
    char key[JOURNAL_KEY_MAX + 1];
    const char *v = last ? last : idem, *semi = last ? strrchr(last, ';') : NULL;
    size_t n = semi ? (size_t)(semi - v) : strlen(v);
    int ok = n > 0 && n <= JOURNAL_KEY_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = (v[i] >= 'a' && v[i] <= 'z') || (v[i] >= 'A' && v[i] <= 'Z') || (v[i] >= '0' && v[i] <= '9') ||
             strchr("-_.:", v[i]);
    if (!ok || (last && !semi))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "%s must be %s (1 to %d of A-Z a-z 0-9 - _ . :), got \"%.120s\"", name,
                             last ? "KEY;STATE as the stream's SSE ids carry it" : "a key", JOURNAL_KEY_MAX, v);
    memcpy(key, v, n);
    key[n] = '\0';
    char owner[JOURNAL_OWNER_MAX + 1];
    request_owner(s, c, owner, sizeof owner);
    enum status st = http_resume_attach(s, key, front, owner, semi ? semi + 1 : NULL, connection_fd(c), g);
    if (st == STATUS_NOT_FOUND && last)
        return status_errorf(STATUS_NOT_FOUND,
                             "Last-Event-ID: no journaled request %s (it ended and its answer was delivered, its answer "
                             "expired, or it never existed)", key);
    if (st == STATUS_NOT_FOUND) *new_key = idem, st = STATUS_OK;
    return st;
}

/* The model a generation body names in its `model` field, pinned (server_acquire: loaded first
 * when it is not; a body that is not a JSON object, or whose model is no string, goes to the
 * first model, whose parse refuses it). */
static enum status route_body(struct server *s, const char *body, size_t len, struct served_model **m)
{
    if (s->n_models == 1) return server_acquire(s, NULL, 1, m);
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "model") : NULL;
    enum status st = server_acquire(s, cJSON_IsString(v) ? v->valuestring : NULL, 1, m);
    cJSON_Delete(o);
    return st;
}

/* handle_generation, once the request's model (m) is pinned. */
static enum MHD_Result generate_on(struct server *s, struct MHD_Connection *c, struct http_conn *hc, int is_chat,
                                   struct served_model *m, const char *key)
{
    const int an_api = http_route_anthropic(hc->route);
    struct http_request q;
    struct http_gen *g = NULL;
    enum status st;
    const char *body = hc->body ? hc->body : "";
    char owner[JOURNAL_OWNER_MAX + 1];
    request_owner(s, c, owner, sizeof owner);
    struct http_adapter_snapshot an; /* loaded now: run-time loads change the list */
    http_adapter_snapshot(s, m, owner, &an);
    const struct http_chat_caps caps = http_model_caps(m);
    if (hc->route == ROUTE_RESPONSES)
        st = http_responses_parse(s, m->model_id, body, hc->len, owner, an.ptrs, an.n, &caps, &q);
    else if (hc->route == ROUTE_RESPONSE_INPUT_TOKENS)
        st = http_responses_count_parse(s, m->model_id, body, hc->len, owner, an.ptrs, an.n, &caps, &q);
    else if (an_api)
        st = http_anthropic_parse(body, hc->len, hc->route == ROUTE_COUNT_TOKENS, m->model_id, an.ptrs, an.n, &caps, &q);
    else st = http_parse_request(body, hc->len, is_chat, m->model_id, an.ptrs, an.n, &caps, &q);
    q.model = m;
    snprintf(q.owner, sizeof q.owner, "%s", owner);
    if (st == STATUS_OK && (hc->route == ROUTE_COUNT_TOKENS || hc->route == ROUTE_RESPONSE_INPUT_TOKENS))
        return reply_count(s, c, &q, an_api);
    if (st != STATUS_OK) http_request_free(&q);
    else set_client(s, c, &q), st = http_gen_submit(s, &q, connection_fd(c), body, hc->len, key, &g);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        metrics_observe_request(s->metrics, METRICS_API_HTTP, server_grpc_code_name(server_grpc_code(st)), -1.0, 0.0,
                                -1.0);
        return reply_status(c, an_api, st, msg);
    }
    if (g->q.responses) http_responses_begin(g);
    return serve_gen(s, c, hc, g, an_api);
}

static enum MHD_Result handle_generation(struct server *s, struct MHD_Connection *c, struct http_conn *hc, int is_chat)
{
    const int an_api = http_route_anthropic(hc->route);
    if (hc->too_big) return reply_too_large(s, c, an_api, hc); /* a chunked body grew past the limit */
    if (atomic_load(&s->phase) != PHASE_READY) return reply_status(c, an_api, STATUS_UNAVAILABLE, "the server is not serving");
    struct http_gen *g = NULL;
    const char *key;
    enum status st = resume_header(s, c, hc, &g, &key);
    if (st == STATUS_OK && g) return serve_gen(s, c, hc, g, an_api);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        return reply_status(c, an_api, st, msg);
    }
    struct served_model *m = NULL; /* the model first: the parse checks names against its adapters */
    if ((st = route_body(s, hc->body ? hc->body : "", hc->len, &m)) != STATUS_OK) {
        char msg[1200];
        snprintf(msg, sizeof msg, "%s", status_message());
        return reply_status(c, an_api, st, msg);
    }
    enum MHD_Result r = generate_on(s, c, hc, is_chat, m, key);
    server_release(s, m); /* a request that runs on pins it too (http_gen_prepare) */
    return r;
}

/* Answers a submitted (or reattached) request: its stream, or its whole answer once it ends.
 * hc takes the caller's reference of g. */
static enum MHD_Result serve_gen(struct server *s, struct MHD_Connection *c, struct http_conn *hc, struct http_gen *g,
                                 int an_api)
{
    (void)s;
    hc->g = g;
    /* A FIN that came with the request (`nc -N`) is classed now, whatever the load does to the
     * first wait's timing: a half-close, not a client gone (peer_gone marks it; a reset is
     * found again by the waits below). */
    pthread_mutex_lock(&g->mu);
    (void)http_peer_gone(g);
    pthread_mutex_unlock(&g->mu);
    if (g->q.stream) {
        atomic_fetch_add(&g->refs, 1); /* the response's */
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, http_stream_read, g, http_stream_free);
        if (!r) {
            http_stream_free(g);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    pthread_mutex_lock(&g->mu);
    while (g->active > 0) {
        http_gen_wait(g);
        if (!http_peer_gone(g)) continue;
        const enum http_hangup h = http_gen_hangup(g);
        if (h != HTTP_HANGUP_NONE) {
            pthread_mutex_unlock(&g->mu);
            http_gen_after_hangup(g, h);
            pthread_mutex_lock(&g->mu);
        }
        if (g->resumed) { /* it runs on without this connection, for its client to reattach */
            pthread_mutex_unlock(&g->mu);
            return MHD_NO;
        }
    }
    enum status end = g->end_status;
    http_gen_observe(g, end);
    char *json = g->q.responses ? http_responses_response(g) /* a cancelled response is answered too */
                 : end != STATUS_OK ? NULL
                 : an_api           ? http_anthropic_response(g)
                                    : http_response_json(g);
    char msg[256];
    snprintf(msg, sizeof msg, "%s", g->end_message);
    int gone = g->hangup, drained = g->drained && g->journaled;
    /* Answered: a journaled first run stays reattachable by its Idempotency-Key for the grace
     * (the answer may be lost with the connection). */
    if (!gone && !drained) g->eos_sent = 1;
    const enum http_hangup h = !gone && !drained && g->keep_log ? http_gen_hangup(g) : HTTP_HANGUP_NONE;
    pthread_mutex_unlock(&g->mu);
    if (gone || drained) { /* a drained journaled request resumes after the restart: no answer yet */
        free(json);
        return MHD_NO; /* nobody to answer: close the connection */
    }
    if (g->resumed && !g->keep_log) http_resume_detach(g, 1);
    http_gen_after_hangup(g, h);
    http_gen_release_model(g); /* the answer is formed: before its bytes go out */
    if (!json) return reply_status(c, an_api, end, msg);
    return reply_json(c, 200, json);
}

/* ---- routes ---------------------------------------------------------------------------------- */

static enum MHD_Result handle_embeddings(struct server *s, struct MHD_Connection *c, struct http_conn *hc)
{
    if (hc->too_big) return reply_too_large(s, c, 0, hc);
    if (atomic_load(&s->phase) != PHASE_READY) return reply_status(c, 0, STATUS_UNAVAILABLE, "the server is not serving");
    char *json = NULL;
    enum status st = http_embeddings(s, hc->body ? hc->body : "", hc->len, &json);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        return reply_status(c, 0, st, msg);
    }
    return reply_json(c, 200, json);
}

static enum MHD_Result handle_models(struct server *s, struct MHD_Connection *c)
{
    size_t len = 0;
    char owner[JOURNAL_OWNER_MAX + 1];
    request_owner(s, c, owner, sizeof owner);
    char *json = server_models_json(s, owner, &len);
    return reply(c, 200, "application/json", json, len);
}

static enum MHD_Result handle_metrics(struct server *s, struct MHD_Connection *c)
{
    char *text;
    size_t len;
    /* Each model's engine gauges, its engine pinned meanwhile (docs/server.md, "Several models
     * in one server"). */
    _Static_assert(SERVER_METRICS_MAX_MODELS == SERVER_MAX_MODELS, "metrics.h's bound on the models");
    struct metrics_model ms[SERVER_MAX_MODELS];
    struct served_model *pinned[SERVER_MAX_MODELS];
    int up = atomic_load(&s->phase) >= PHASE_READY && atomic_load(&s->phase) != PHASE_FAILED;
    for (int i = 0; i < s->n_models; i++) {
        pinned[i] = up ? server_pin_if_loaded(s, &s->models[i]) : NULL;
        ms[i] = (struct metrics_model){s->models[i].model_id, pinned[i] ? pinned[i]->engine : NULL};
    }
    enum status st = metrics_render(s->metrics, ms, s->n_models, &text, &len);
    for (int i = 0; i < s->n_models; i++) server_unpin_quietly(s, pinned[i]);
    if (st != STATUS_OK) return reply_status(c, 0, st, status_message());
    return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, len);
}

static enum MHD_Result handle_finetune(struct server *s, struct MHD_Connection *c, struct http_conn *hc, const char *url,
                                      const char *method)
{
    if (hc->too_big) return reply_too_large(s, c, 0, hc);
    char *out = NULL;
    size_t len = 0;
    const char *type = NULL;
    struct http_query q = {.n = 0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, query_arg, &q);
    char owner[JOURNAL_OWNER_MAX + 1];
    request_owner(s, c, owner, sizeof owner);
    enum status st = http_finetune_handle(s, owner, method, url, &q, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type"),
                                          hc->body ? hc->body : "", hc->len, &out, &len, &type);
    if (st != STATUS_OK) return reply_status(c, 0, st, status_message());
    return reply(c, 200, type, out, len);
}

static struct http_slot *slot_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}


/* Everything that is decided by the headers alone, before a byte of the body is read: the
 * connection's admission, route, method, API key, content type and declared length. Returns 1
 * with *ret set when it answered (libmicrohttpd then closes the connection without reading
 * the body: a client without a key cannot make the server hold its 4 MB body). */
static int refuse_early(struct server *s, struct MHD_Connection *c, struct http_conn *hc, const char *method,
                        enum MHD_Result *ret)
{
    const int an = http_route_anthropic(hc->route);
    const char *why = http_guard_refusal(hc->slot);
    if (why) {
        char *json = error_body(an, 503, "service_unavailable_error", "too_many_connections", why);
        *ret = reply_with(c, 503, "application/json", json, strlen(json), MHD_HTTP_HEADER_RETRY_AFTER, "1",
                          MHD_HTTP_HEADER_CONNECTION, "close");
        return 1;
    }
    if (hc->route == ROUTE_NONE) {
        *ret = reply_error(c, an, 404, "not_found_error", "not_found", "no such route (see docs/server.md)");
        return 1;
    }
    if (!http_route_method_allowed(hc->route, method)) {
        char msg[96];
        snprintf(msg, sizeof msg, "method %.16s is not allowed here: use %s", method, http_route_allow(hc->route));
        char *json = error_body(an, 405, "invalid_request_error", "method_not_allowed", msg);
        *ret = reply_with(c, 405, "application/json", json, strlen(json), MHD_HTTP_HEADER_ALLOW, http_route_allow(hc->route),
                          NULL, NULL);
        return 1;
    }
    if (hc->route == ROUTE_HEALTH || hc->route == ROUTE_METRICS) return 0; /* open to probes and scrapers */
    if (!authorized(s, c)) {
        *ret = reply_error(c, an, 401, "authentication_error", "invalid_api_key",
                           "a valid API key is required (Authorization: Bearer <key>, or x-api-key: <key>)");
        return 1;
    }
    if (!http_route_generates(hc->route) && hc->route != ROUTE_FINETUNE) return 0;
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (hc->route != ROUTE_FINETUNE &&
        (!ct || strncasecmp(ct, "application/json", 16) || (ct[16] && ct[16] != ';' && ct[16] != ' '))) {
        *ret = reply_error(c, an, 415, "invalid_request_error", "unsupported_media_type",
                           "the request body must be JSON (Content-Type: application/json)");
        return 1;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    char *end = NULL;
    unsigned long long declared = cl ? strtoull(cl, &end, 10) : 0;
    if (cl && end != cl && declared > body_limit(s, hc)) {
        *ret = reply_too_large(s, c, an, hc);
        return 1;
    }
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct server *s = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) { /* the headers are in; the body (if any) follows */
        if (!(hc = calloc(1, sizeof *hc))) return MHD_NO;
        *con_cls = hc;
        hc->slot = slot_of(c);
        hc->route = http_route_of(url);
        hc->upload = hc->route == ROUTE_FINETUNE && s->finetune && !strcmp(method, "POST") && !strcmp(url, "/v1/files");
        enum MHD_Result ret;
        if (refuse_early(s, c, hc, method, &ret)) {
            http_guard_phase(s->http_guard, hc->slot, HTTP_PHASE_HANDLING);
            return ret;
        }
        http_guard_phase(s->http_guard, hc->slot, HTTP_PHASE_BODY);
        return MHD_YES;
    }
    if (*upload_size) {
        if (hc->len + *upload_size > body_limit(s, hc)) hc->too_big = 1;
        if (!hc->too_big) http_buf_append(&hc->body, &hc->len, &hc->cap, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    http_guard_phase(s->http_guard, hc->slot, HTTP_PHASE_HANDLING);
    enum MHD_Result refused;
    /* Probes and scrapers may add what they like to /health and /metrics; the lists read theirs. */
    if (hc->route != ROUTE_HEALTH && hc->route != ROUTE_METRICS && hc->route != ROUTE_FINETUNE &&
        hc->route != ROUTE_RESPONSE_INPUT_ITEMS && refuse_query(c, &refused))
        return refused;
    switch (hc->route) {
    case ROUTE_HEALTH: {
        int ok = atomic_load(&s->phase) == PHASE_READY;
        char *body = strdup(ok ? "{\"status\":\"SERVING\"}" : "{\"status\":\"NOT_SERVING\"}");
        return body ? reply_json(c, ok ? 200 : 503, body) : MHD_NO;
    }
    case ROUTE_METRICS: return handle_metrics(s, c);
    case ROUTE_MODELS: return handle_models(s, c);
    case ROUTE_COMPLETIONS:
    case ROUTE_CHAT:
    case ROUTE_MESSAGES:
    case ROUTE_COUNT_TOKENS:
    case ROUTE_RESPONSES:
    case ROUTE_RESPONSE_INPUT_TOKENS: return handle_generation(s, c, hc, hc->route != ROUTE_COMPLETIONS);
    case ROUTE_EMBEDDINGS: return handle_embeddings(s, c, hc);
    case ROUTE_RESPONSE_ITEM:
    case ROUTE_RESPONSE_CANCEL: return handle_response_item(s, c, url, method);
    case ROUTE_RESPONSE_INPUT_ITEMS: return handle_input_items(s, c, url);
    case ROUTE_FINETUNE: return handle_finetune(s, c, hc, url, method);
    case ROUTE_NONE: break;
    }
    return MHD_NO; /* refuse_early answered every other route */
}

/* A request ended (answered, or its connection died): drop its reference. */
static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe)
{
    (void)c;
    struct server *s = cls;
    struct http_conn *hc = *con_cls;
    if (!hc) return;
    /* A kept-alive connection now waits for its next request's headers, under their deadline. */
    http_guard_phase(s->http_guard, hc->slot, HTTP_PHASE_HEADERS);
    if (hc->g) {
        if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) {
            pthread_mutex_lock(&hc->g->mu);
            const enum http_hangup h = http_gen_hangup(hc->g);
            pthread_mutex_unlock(&hc->g->mu);
            http_gen_after_hangup(hc->g, h);
        }
        http_gen_unref(hc->g);
    }
    free(hc->body);
    free(hc);
    *con_cls = NULL;
}

/* ---- the daemon ------------------------------------------------------------------------------ */

/* Connections come and go: each is a slot of http_guard.c (admission, deadlines). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    struct server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        *socket_context = http_guard_open(s->http_guard, fi ? fi->connect_fd : -1, ai ? ai->client_addr : NULL);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        http_guard_close(s->http_guard, *socket_context);
        *socket_context = NULL;
    }
}

/* URLs are matched as they came: libmicrohttpd's percent-decoding made "/v1/completions%00"
 * the route "/v1/completions" (the NUL ended the string). No route has an escaped byte. */
static size_t unescape_none(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

enum status http_start(struct server *s)
{
    const struct server_options *o = &s->opts;
    struct sockaddr_storage ss;
    socklen_t sl;
    char host[256];
    enum status st = http_parse_address(o->http_listen, &ss, &sl, host, sizeof host);
    if (st != STATUS_OK) return st;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    char *cert = NULL, *key = NULL;
    if (o->tls_cert) {
        if ((st = base_read_file(o->tls_cert, 1 << 20, "PEM file", &cert, NULL)) != STATUS_OK) return st;
        if ((st = base_read_file(o->tls_key, 1 << 20, "PEM file", &key, NULL)) != STATUS_OK) {
            free(cert);
            return st;
        }
        flags |= MHD_USE_TLS;
    }
    unsigned max_conn = o->http_max_connections > 0 ? (unsigned)o->http_max_connections : 256;
    /* One address may hold three quarters of the slots by default: a single application server
     * in front of shardlm (the usual chatbot backend) keeps 192 streams of 256, and one client
     * alone cannot take every slot. */
    int per_addr = o->http_max_per_address > 0   ? o->http_max_per_address
                   : o->http_max_per_address < 0 ? 0
                                                 : (int)(max_conn * 3 / 4 > 0 ? max_conn * 3 / 4 : 1);
    double header_s = o->http_header_timeout_s > 0 ? o->http_header_timeout_s : 10.0;
    double body_s = o->http_body_timeout_s > 0 ? o->http_body_timeout_s : 60.0;
    /* Connections past max_conn (or past the per-address cap) are taken to be answered 503;
     * past max_conn + overflow libmicrohttpd closes them unanswered. */
    unsigned overflow = max_conn / 4 > 16 ? max_conn / 4 : 16;
    int max_stored = o->http_responses_store > 0 ? o->http_responses_store : 1024;
    if ((st = http_responses_store_init(max_stored, HTTP_RESPONSES_STORE_BYTES, &s->http_responses)) != STATUS_OK ||
        (o->finetune_dir && (st = http_finetune_start(s)) != STATUS_OK) ||
        (st = http_guard_start(header_s, body_s, s->opts.send_timeout_s, (int)max_conn, per_addr, &s->http_guard)) != STATUS_OK) {
        free(cert);
        free(key);
        return st;
    }
    struct MHD_OptionItem tls[] = {{MHD_OPTION_HTTPS_MEM_CERT, 0, cert}, {MHD_OPTION_HTTPS_MEM_KEY, 0, key},
                                   {MHD_OPTION_END, 0, NULL}};
    s->http = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                               MHD_OPTION_CONNECTION_LIMIT, max_conn + overflow, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
                               on_connection, s, MHD_OPTION_UNESCAPE_CALLBACK, unescape_none, NULL,
                               MHD_OPTION_ARRAY, cert ? tls : &tls[2], MHD_OPTION_END);
    s->http_cert = cert; /* libmicrohttpd reads them while it runs: freed by http_stop */
    s->http_key = key;
    if (!s->http)
        return status_errorf(STATUS_UNAVAILABLE, "cannot serve HTTP on %s (address in use or invalid%s)", o->http_listen,
                             o->tls_cert ? ", or TLS files unusable" : "");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->http, MHD_DAEMON_INFO_BIND_PORT);
    int port = di ? di->port : 0;
    printf("shardlm: http listening on %s:%d%s\n", host, port, o->tls_cert ? " (TLS)" : "");
    fflush(stdout);
    LOG_INFO("http",
             "OpenAI-compatible API on %s:%d, at most %u connections (%d per address), headers within %.0f s, "
             "bodies within %.0f s%s",
             host, port, max_conn, per_addr, header_s, body_s, s->n_keys ? ", API keys" : "");
    return STATUS_OK;
}

void http_stop(struct server *s)
{
    if (s->http) {
        /* The engine has drained: the streams still open write their last events (briefly). */
        for (int i = 0; i < 200 && atomic_load(&s->http_active) > 0; i++) usleep(10000);
        MHD_stop_daemon(s->http);
        s->http = NULL;
    }
    http_guard_stop(s->http_guard); /* after the daemon: no connection is left */
    s->http_guard = NULL;
    http_finetune_stop(s); /* a running job stops at its iteration's end */
    http_responses_store_free(s->http_responses); /* after the daemon: no request is left */
    s->http_responses = NULL;
    free(s->http_cert);
    free(s->http_key);
    s->http_cert = s->http_key = NULL;
}
