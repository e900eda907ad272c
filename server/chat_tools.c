/* server/chat_tools.c - tool calling, chat_template_kwargs and reasoning for the gRPC chat RPCs
 * (chat_tools.h), through the HTTP chat's code: http_tools.c applies the request, tool_format.c
 * parses the replies. Nothing here decides a format or a check of its own.
 * Tests: tests/server/test_tools.py, tests/server/test_tools_native.py. */
#include "chat_tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "http_internal.h"
#include "server_internal.h"
#include "tool_format.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

/* Rewrites the messages of o (the request's chat part) that the tool format writes itself
 * (tool results, assistant tool calls) into r's messages, as the HTTP chat's parse_messages
 * does. */
static enum status tool_messages(const cJSON *o, struct gen_request *r)
{
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    int i = 0;
    for (const cJSON *e = msgs ? msgs->child : NULL; e && i < r->n_messages; e = e->next, i++) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(e, "role");
        char *content = NULL;
        enum status st = http_tools_message(e, i, role->valuestring, &content);
        if (st != STATUS_OK) return st;
        if (!content) continue;
        free(r->messages[i].content);
        r->messages[i].content = content;
    }
    return STATUS_OK;
}

enum status chat_tools_apply(const struct served_model *m, struct gen_request *r, struct chat_parse *cp)
{
    memset(cp, 0, sizeof *cp);
    const struct http_chat_caps caps = http_model_caps(m);
    enum status st = STATUS_OK;
    if (r->chat_request) {
        cJSON *o = cJSON_Parse(r->chat_request);
        if (!o) return oom();
        /* http_tools.c works on an HTTP request: r is moved into one and back. */
        struct http_request q;
        memset(&q, 0, sizeof q);
        q.r = *r;
        q.is_chat = 1;
        st = tool_messages(o, &q.r);
        if (st == STATUS_OK) st = http_tools_parse(o, &caps, &q);
        if (st == STATUS_OK) st = http_tools_context(o, NULL, &caps, &q);
        cJSON_Delete(o);
        *r = q.r;
        cp->tools = q.tools;
        cp->tool_format = q.tool_format;
        cp->max_calls = q.max_calls;
        cp->arg_types = q.arg_types; /* (taken: q is not freed) */
    }
    cp->reasoning = m->reasoning;
    cp->on = cp->tools || cp->reasoning;
    return st;
}

enum status chat_parse_note_prompt(struct chat_parse *cp, const struct gen_request *r)
{
    cp->think_open = r->think_open;
    if (r->prefill && !(cp->prefill = strdup(r->prefill))) return oom();
    return STATUS_OK;
}

void chat_parse_free(struct chat_parse *cp)
{
    free(cp->prefill);
    free(cp->arg_types);
    memset(cp, 0, sizeof *cp);
}

/* Call k's id, as the HTTP chat's (http_tools_call_id) with "<request id>_<sample>" as base. */
static char *call_id(const struct chat_parse *cp, const char *request_id, int sample, int k)
{
    struct http_request q;
    memset(&q, 0, sizeof q);
    q.tool_format = cp->tool_format;
    char base[160], id[200];
    snprintf(base, sizeof base, "%.128s_%d", request_id, sample);
    http_tools_call_id(&q, base, k, id, sizeof id);
    return strdup(id);
}

/* Takes s (malloc'd, may be NULL) into r's owned strings; returns it, or NULL when out of
 * memory (s is then freed). */
static char *own(struct chat_reply *r, char *s)
{
    if (!s) return NULL;
    char **o = realloc(r->owned, ((size_t)r->n_owned + 1) * sizeof *o);
    if (!o) {
        free(s);
        return NULL;
    }
    r->owned = o;
    r->owned[r->n_owned++] = s;
    return s;
}

static char *dup_n(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* Parses text[0..n) of cp's format into *p. */
static enum status parse(const struct chat_parse *cp, const char *text, size_t n, int final, struct tool_parsed *p)
{
    if (tool_parse_typed((enum tool_format)cp->tool_format, cp->tools, cp->reasoning, cp->think_open, cp->max_calls,
                         cp->arg_types, text, n, final, p))
        return oom();
    return STATUS_OK;
}

enum status chat_reply_whole(const struct chat_parse *cp, const char *request_id, int sample, const char *text,
                             size_t n, struct chat_reply *out)
{
    memset(out, 0, sizeof *out);
    size_t pre = cp->prefill ? strlen(cp->prefill) : 0;
    char *full = malloc(pre + n + 1);
    if (!full) return oom();
    if (pre) memcpy(full, cp->prefill, pre);
    if (n) memcpy(full + pre, text, n);
    full[pre + n] = 0;
    struct tool_parsed p;
    enum status st = parse(cp, full, pre + n, 1, &p);
    free(full);
    if (st != STATUS_OK) return st;
    out->content = own(out, p.content), p.content = NULL;
    out->reasoning = own(out, p.reasoning), p.reasoning = NULL;
    if (!out->content || !out->reasoning) st = oom();
    if (st == STATUS_OK && p.n_calls && !(out->calls = calloc((size_t)p.n_calls, sizeof *out->calls))) st = oom();
    for (int k = 0; k < p.n_calls && st == STATUS_OK; k++) {
        struct gen_tool_call *c = &out->calls[k];
        c->index = k;
        c->id = own(out, call_id(cp, request_id, sample, k));
        c->name = own(out, p.calls[k].name), p.calls[k].name = NULL;
        c->args = own(out, p.calls[k].args), p.calls[k].args = NULL;
        if (!c->id || !c->name || !c->args) st = oom();
        out->n_calls = k + 1;
    }
    out->ended_with_calls = p.n_calls > 0;
    tool_parsed_free(&p);
    if (st != STATUS_OK) chat_reply_free(out);
    return st;
}

void chat_reply_fill(const struct chat_reply *r, struct gen_sample_out *o)
{
    o->content = r->content;
    o->reasoning = r->reasoning;
    o->calls = r->calls;
    o->n_calls = r->n_calls;
    o->ended_with_calls = r->ended_with_calls;
}

void chat_reply_free(struct chat_reply *r)
{
    free(r->calls);
    for (int i = 0; i < r->n_owned; i++) free(r->owned[i]);
    free(r->owned);
    memset(r, 0, sizeof *r);
}

enum status chat_stream_delta(const struct chat_parse *cp, struct chat_stream *st, const char *request_id, int sample,
                              const char *text, size_t n, int final, struct chat_reply *out)
{
    memset(out, 0, sizeof *out);
    if (!st->ts) {
        const char *pre = cp->prefill ? cp->prefill : "";
        if (tool_stream_new((enum tool_format)cp->tool_format, cp->tools, cp->reasoning, cp->think_open, cp->max_calls,
                            &st->ts) || tool_stream_arg_types(st->ts, cp->arg_types) ||
            tool_stream_feed(st->ts, pre, strlen(pre), 0))
            return oom();
    }
    struct tool_delta d;
    if (tool_stream_delta(st->ts, text, n, final, &d)) return oom();
    int failed = 0;
    if (d.reasoning && !(out->reasoning = own(out, dup_n(d.reasoning, d.reasoning_len)))) failed = 1;
    if (d.content && !(out->content = own(out, dup_n(d.content, d.content_len)))) failed = 1;
    if (d.n_calls && !(out->calls = calloc((size_t)d.n_calls, sizeof *out->calls))) failed = 1;
    for (int k = 0; k < d.n_calls && !failed; k++) {
        const struct tool_delta_call *e = &d.calls[k];
        struct gen_tool_call *g = &out->calls[out->n_calls++];
        g->index = e->index;
        if (e->is_new) { /* a new call: its header, and the arguments so far */
            g->id = own(out, call_id(cp, request_id, sample, e->index));
            g->name = own(out, strdup(e->name));
            failed = !g->id || !g->name;
        }
        if (!(g->args = own(out, dup_n(e->args, e->args_len)))) failed = 1;
    }
    out->ended_with_calls = d.calls_sent;
    if (!failed) return STATUS_OK;
    chat_reply_free(out);
    return oom();
}

void chat_stream_free(struct chat_stream *st)
{
    tool_stream_free(st->ts);
    memset(st, 0, sizeof *st);
}
