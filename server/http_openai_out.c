/* server/http_openai_out.c - the OpenAI-compatible response bodies: completion and chat
 * completion objects (choices, logprobs, usage), their SSE chunks, and error bodies.
 * Not here: parsing requests (http_openai.c), connections and routes (http.c, http_gen.c).
 * Tests: tests/server/test_http.py (the openai package reads every body). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "tokenizer.h"
#include "tool_format.h"

/* ---- responses ----------------------------------------------------------------------------- */

void http_buf_append(char **p, size_t *len, size_t *cap, const char *data, size_t n)
{
    CHECK(base_grow((void **)p, cap, *len + n + 1, 1) == 0, "out of memory");
    if (n) memcpy(*p + *len, data, n);
    *len += n;
    (*p)[*len] = 0;
}

static cJSON *check_json(cJSON *j)
{
    CHECK(j, "out of memory building JSON");
    return j;
}

/* The text of one token for logprob entries: the piece with U+2581 as a space; a byte piece
 * "<0xNN>" is that byte when ASCII (otherwise the piece as it is, to keep the JSON UTF-8). */
/* A token as log-probabilities show it: bytes[0..return) its exact bytes (tokenizer_token_bytes:
 * SentencePiece's U+2581 as ' ', a byte piece as its byte, a byte-level BPE piece through the
 * GPT-2 byte map; a control or special token, which contributes none, as its piece's text), and
 * text those bytes where they are valid UTF-8 without NUL, else "bytes:\xNN..." as vLLM writes
 * part of a character. */
static int token_view(const struct tokenizer *tok, int32_t id, char *bytes, int bcap, char *text, size_t cap)
{
    int n = tokenizer_token_bytes(tok, id, bytes, bcap);
    if (n <= 0) {
        const char *p = tokenizer_id_to_piece(tok, id);
        n = snprintf(bytes, (size_t)bcap, "%s", p ? p : "");
        if (n >= bcap) n = bcap - 1;
    }
    if (base_utf8_valid_prefix(bytes, (size_t)n) == (size_t)n && !memchr(bytes, 0, (size_t)n)) {
        snprintf(text, cap, "%.*s", n, bytes);
        return n;
    }
    size_t o = (size_t)snprintf(text, cap, "bytes:");
    for (int i = 0; i < n && o + 5 < cap; i++) o += (size_t)snprintf(text + o, cap - o, "\\x%02x", (unsigned char)bytes[i]);
    return n;
}

static void token_text(const struct tokenizer *tok, int32_t id, char *out, size_t cap)
{
    char bytes[128];
    token_view(tok, id, bytes, sizeof bytes, out, cap);
}

/* Adds o[name] = s[0..n); s[n] must be readable (s is a NUL-terminated buffer). Generated text
 * may hold U+0000 (token <0x00>), which cJSON would cut (it measures strings with strlen), and a
 * sample's buffer holds old text past n after a chunk went out: such text goes in as a raw item
 * escaped here, as cJSON escapes ("\u0000" for the NUL). */
static void add_text(cJSON *o, const char *name, const char *s, size_t n)
{
    if (!memchr(s, 0, n)) {
        /* A string item even for a slice of a longer text: the Responses and Anthropic
         * converters read the chunk's strings back (a raw literal was dropped there: a call's
         * last argument bytes, cut from the text before the call's closing brace, never reached
         * a Responses stream). */
        char *t = s[n] == 0 ? NULL : malloc(n + 1);
        if (s[n] != 0) {
            CHECK(t, "out of memory");
            memcpy(t, s, n);
            t[n] = 0;
        }
        check_json(cJSON_AddStringToObject(o, name, t ? t : s));
        free(t);
        return;
    }
    char *lit = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&lit, &len, &cap, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else esc[0] = (char)c, esc[1] = 0;
        http_buf_append(&lit, &len, &cap, esc, strlen(esc));
    }
    http_buf_append(&lit, &len, &cap, "\"", 1);
    check_json(cJSON_AddRawToObject(o, name, lit));
    free(lit);
}

/* A chat log-probability entry's "token" and "bytes" (token_view) on e. */
static void add_token(cJSON *e, const struct tokenizer *tok, int32_t id)
{
    char bytes[128], t[256];
    const int n = token_view(tok, id, bytes, sizeof bytes, t, sizeof t);
    cJSON_AddStringToObject(e, "token", t);
    cJSON *a = check_json(cJSON_AddArrayToObject(e, "bytes"));
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, check_json(cJSON_CreateNumber((unsigned char)bytes[i])));
}

/* A completions top_logprobs entry: {"token text": logprob, ...} of top[0..n_top). */
static cJSON *top_dict(const struct tokenizer *tok, const struct top_logprob *top, int n_top)
{
    char t[256];
    cJSON *d = check_json(cJSON_CreateObject());
    for (int k = 0; top && k < n_top; k++) {
        token_text(tok, top[k].id, t, sizeof t);
        if (!cJSON_GetObjectItemCaseSensitive(d, t)) cJSON_AddNumberToObject(d, t, top[k].logprob);
    }
    return d;
}

/* Log-probabilities of a sample's tokens b->ids[0..b->n), in the endpoint's shape; NULL (JSON
 * null) when not asked. Completions: *offset is the text_offset of the first token, advanced
 * by each token's text; with `prompt` (echo with logprobs: the run whose prompt
 * log-probabilities arrived), the prompt's tokens come first, their offsets counted from 0 by
 * their texts (as vLLM does), the first one's log-probability and alternatives null. */
static cJSON *logprobs_json(const struct http_gen *g, const struct http_run *prompt, const struct sample_buf *b,
                            size_t *offset)
{
    if (g->q.logprobs < 0 || (!b->lp && !prompt)) return cJSON_CreateNull();
    const struct tokenizer *tok = g->m->tok;
    char t[256], bytes[128];
    if (g->q.is_chat) {
        cJSON *o = check_json(cJSON_CreateObject()), *content = check_json(cJSON_AddArrayToObject(o, "content"));
        for (int i = 0; i < b->n; i++) {
            cJSON *e = check_json(cJSON_CreateObject());
            add_token(e, tok, b->ids[i]);
            cJSON_AddNumberToObject(e, "logprob", b->lp[i]);
            cJSON *tops = check_json(cJSON_AddArrayToObject(e, "top_logprobs"));
            for (int k = 0; b->top && k < b->n_top; k++) {
                const struct top_logprob *x = &b->top[(size_t)i * b->n_top + k];
                cJSON *te = check_json(cJSON_CreateObject());
                add_token(te, tok, x->id);
                cJSON_AddNumberToObject(te, "logprob", x->logprob);
                cJSON_AddItemToArray(tops, te);
            }
            cJSON_AddItemToArray(content, e);
        }
        return o;
    }
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON *tokens = check_json(cJSON_AddArrayToObject(o, "tokens"));
    cJSON *lps = check_json(cJSON_AddArrayToObject(o, "token_logprobs"));
    cJSON *tops = g->q.logprobs > 0 ? check_json(cJSON_AddArrayToObject(o, "top_logprobs")) : NULL;
    if (!tops) cJSON_AddNullToObject(o, "top_logprobs");
    cJSON *offs = check_json(cJSON_AddArrayToObject(o, "text_offset"));
    size_t prompt_offset = 0;
    for (int i = 0; prompt && i < prompt->n_prompt; i++) {
        const int nb = token_view(tok, prompt->prompt_ids[i], bytes, sizeof bytes, t, sizeof t);
        cJSON_AddItemToArray(tokens, check_json(cJSON_CreateString(t)));
        cJSON_AddItemToArray(lps, check_json(i ? cJSON_CreateNumber(prompt->prompt_lp[i]) : cJSON_CreateNull()));
        cJSON_AddItemToArray(offs, check_json(cJSON_CreateNumber((double)prompt_offset)));
        prompt_offset += (size_t)nb;
        if (tops)
            cJSON_AddItemToArray(tops, i ? top_dict(tok, prompt->prompt_top ? &prompt->prompt_top[(size_t)i * prompt->n_prompt_top]
                                                                           : NULL,
                                                    prompt->n_prompt_top)
                                         : check_json(cJSON_CreateNull()));
    }
    for (int i = 0; b->lp && i < b->n; i++) {
        const int nb = token_view(tok, b->ids[i], bytes, sizeof bytes, t, sizeof t);
        cJSON_AddItemToArray(tokens, check_json(cJSON_CreateString(t)));
        cJSON_AddItemToArray(lps, check_json(cJSON_CreateNumber(b->lp[i])));
        cJSON_AddItemToArray(offs, check_json(cJSON_CreateNumber((double)*offset)));
        *offset += (size_t)nb; /* in bytes of the text */
        if (tops) cJSON_AddItemToArray(tops, top_dict(tok, b->top ? &b->top[(size_t)i * b->n_top] : NULL, b->n_top));
    }
    return o;
}

/* OpenAI's finish_reason; a reply that ended with tool calls is "tool_calls". */
static cJSON *finish_json(enum finish_reason f, int tool_calls)
{
    if (f == FINISH_REASON_LENGTH) return cJSON_CreateString("length");
    if (f == FINISH_REASON_STOP || f == FINISH_REASON_EOS) return cJSON_CreateString(tool_calls ? "tool_calls" : "stop");
    return cJSON_CreateNull();
}

static cJSON *usage_json(const struct http_gen *g)
{
    int completion = 0, prompt = 0, cached = 0;
    for (int i = 0; i < g->n_samples; i++) completion += g->samples[i].completion_tokens;
    for (int i = 0; i < g->n_runs; i++) prompt += g->runs[i].prompt_tokens, cached += g->runs[i].cached_prompt_tokens;
    cJSON *u = check_json(cJSON_CreateObject());
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = check_json(cJSON_AddObjectToObject(u, "prompt_tokens_details"));
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    return u;
}

/* The base of sample i's tool-call ids: the response id and the sample. */
static const char *call_id_base(const struct http_gen *g, int i)
{
    static _Thread_local char base[sizeof g->id + 16];
    snprintf(base, sizeof base, "%s_%d", g->id, i);
    return base;
}

/* The fields every response and chunk opens with. */
static cJSON *envelope(const struct http_gen *g, const char *object)
{
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "id", g->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)g->created);
    /* The model that answers (vLLM's): the adapter's name, or the base's id. */
    const char *adapter = g->q.r.params.adapter;
    cJSON_AddStringToObject(o, "model", adapter && *adapter ? adapter : g->m->model_id);
    return o;
}

static char *print_json(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    CHECK(s, "out of memory printing JSON");
    cJSON_Delete(o);
    return s;
}

/* The run (prompt) of sample i. */
static const struct http_run *run_of(const struct http_gen *g, int i) { return &g->runs[i / g->n_per_run]; }

/* The prompt-logprob run to put before sample i's tokens: echo with logprobs, once they came. */
static const struct http_run *echo_logprobs(const struct http_gen *g, int i)
{
    const struct http_run *r = run_of(g, i);
    return g->q.echo && g->q.logprobs >= 0 && r->prompt_lp_ready ? r : NULL;
}

/* Adds c.text: the echoed prompt (when given) then text[0..n). */
static void add_echoed_text(cJSON *c, const struct http_run *r, const char *text, size_t n)
{
    if (!r || !r->echo) {
        add_text(c, "text", text, n);
        return;
    }
    char *full = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&full, &len, &cap, r->echo, r->echo_len);
    http_buf_append(&full, &len, &cap, text, n);
    add_text(c, "text", full, len);
    free(full);
}

/* Whether g's chat replies are parsed (tool calls, reasoning) rather than sent as they come. */
static int parsed(const struct http_gen *g) { return g->q.is_chat && (g->q.tools || g->q.reasoning); }

/* Stream, parsed replies: feeds b's new text to sample i's incremental parse (final: the sample
 * ended) and adds to delta d what did not go out yet (tool_stream_delta): reasoning_content,
 * content, and tool_calls (a call's index, id, type and name once, then its arguments as they
 * grow). Returns whether d got anything; *calls: the reply holds tool calls. */
static int parsed_delta(struct http_gen *g, int i, const char *text, size_t n, int final, cJSON *d, int *calls)
{
    if (!g->ps) CHECK(g->ps = calloc((size_t)g->n_samples, sizeof *g->ps), "out of memory");
    struct http_parse_stream *ps = &g->ps[i];
    const struct http_request *q = &g->q;
    if (!ps->ts) {
        const char *pre = q->r.prefill ? q->r.prefill : "";
        CHECK(tool_stream_new((enum tool_format)q->tool_format, q->tools, q->reasoning, q->r.think_open, q->max_calls,
                              &ps->ts) == 0 && tool_stream_arg_types(ps->ts, q->arg_types) == 0 &&
              tool_stream_feed(ps->ts, pre, strlen(pre), 0) == 0, "out of memory");
    }
    struct tool_delta td;
    CHECK(tool_stream_delta(ps->ts, text, n, final, &td) == 0, "out of memory parsing a reply");
    int news = td.reasoning || td.content || td.n_calls;
    if (td.reasoning) add_text(d, "reasoning_content", td.reasoning, td.reasoning_len);
    if (td.content) add_text(d, "content", td.content, td.content_len);
    cJSON *list = td.n_calls ? check_json(cJSON_AddArrayToObject(d, "tool_calls")) : NULL;
    for (int k = 0; k < td.n_calls; k++) {
        const struct tool_delta_call *c = &td.calls[k];
        cJSON *e = check_json(cJSON_CreateObject());
        cJSON_AddNumberToObject(e, "index", c->index);
        if (c->is_new) { /* a new call: its header, and the arguments so far */
            char id[HTTP_CALL_ID_MAX];
            http_tools_call_id(q, call_id_base(g, i), c->index, id, sizeof id);
            cJSON_AddStringToObject(e, "id", id);
            cJSON_AddStringToObject(e, "type", "function");
        }
        cJSON *f = check_json(cJSON_AddObjectToObject(e, "function"));
        if (c->is_new) cJSON_AddStringToObject(f, "name", c->name);
        add_text(f, "arguments", c->args, c->args_len);
        cJSON_AddItemToArray(list, e);
    }
    *calls = td.calls_sent;
    return news;
}

char *http_response_json(struct http_gen *g)
{
    cJSON *o = envelope(g, g->q.is_chat ? "chat.completion" : "text_completion");
    cJSON *choices = check_json(cJSON_AddArrayToObject(o, "choices"));
    for (int i = 0; i < g->n_samples; i++) {
        struct sample_buf *b = &g->samples[i];
        const struct http_run *r = run_of(g, i);
        cJSON *c = check_json(cJSON_CreateObject());
        cJSON_AddNumberToObject(c, "index", i);
        const char *text = b->text ? b->text : "";
        size_t offset = r->echo ? r->echo_len : 0;
        int calls = 0;
        if (g->q.is_chat) {
            cJSON *m = check_json(cJSON_AddObjectToObject(c, "message"));
            cJSON_AddStringToObject(m, "role", "assistant");
            if (parsed(g)) {
                const char *pre = g->q.r.prefill ? g->q.r.prefill : "";
                char *full = NULL;
                size_t len = 0, cap = 0;
                http_buf_append(&full, &len, &cap, pre, strlen(pre));
                http_buf_append(&full, &len, &cap, text, b->text_len);
                calls = http_tools_reply(&g->q, g->q.r.think_open, full, len, call_id_base(g, i), m);
                free(full);
            } else {
                add_text(m, "content", text, b->text_len);
            }
        } else {
            add_echoed_text(c, r, text, b->text_len);
        }
        cJSON_AddItemToObject(c, "logprobs", check_json(logprobs_json(g, echo_logprobs(g, i), b, &offset)));
        cJSON_AddItemToObject(c, "finish_reason", check_json(finish_json(b->finish, calls)));
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(g));
    return print_json(o);
}

/* done: the usage or error chunk after every sample's last (its SSE id says so). */
static void sse_event(struct http_gen *g, cJSON *o, int done)
{
    if (g->q.anthropic) { /* the same chunk, as Anthropic's events */
        http_anthropic_chunk(g, o);
        return;
    }
    if (g->q.responses) { /* the same chunk, as Responses events */
        http_responses_chunk(g, o);
        return;
    }
    if (g->journaled) http_resume_sse_id(g, done); /* where a reconnecting client resumes */
    char *s = print_json(o);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "data: ", 6);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, s, strlen(s));
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
}

void http_stream_chunks(struct http_gen *g)
{
    for (int i = 0; i < g->n_samples; i++) {
        struct sample_buf *b = &g->samples[i];
        const struct http_run *r = run_of(g, i);
        int final = b->finished && !b->final_sent;
        if (b->final_sent) continue;
        /* Tokens without text yet (an incomplete UTF-8 sequence, a held-back stop prefix) wait
         * for their text unless their log-probabilities were asked. */
        if (b->text_len == 0 && !final && b->role_sent && (b->n == 0 || g->q.logprobs < 0)) continue;
        /* A parsed reply (tools, reasoning) goes out as its parts grow (parsed_delta). */
        cJSON *pd = NULL;
        int calls = 0;
        if (parsed(g)) {
            pd = check_json(cJSON_CreateObject());
            int news = parsed_delta(g, i, b->text ? b->text : "", b->text_len, final, pd, &calls);
            if (!news && !final && b->role_sent && (b->n == 0 || g->q.logprobs < 0)) {
                cJSON_Delete(pd);
                b->sent_tokens += b->n;
                b->sent_text += b->text_len;
                b->text_offset += b->text_len;
                b->text_len = 0;
                b->n = 0;
                continue;
            }
        }
        /* Echo with logprobs: a sample's first chunk carries its prompt's log-probabilities,
         * which the engine sends with the first sample's prefill; the others wait for them. */
        int first = !b->role_sent;
        if (!g->q.is_chat && first && g->q.echo && g->q.logprobs >= 0 && !r->prompt_lp_ready && !final) continue;
        cJSON *o = envelope(g, g->q.is_chat ? "chat.completion.chunk" : "text_completion");
        cJSON *choices = check_json(cJSON_AddArrayToObject(o, "choices"));
        cJSON *c = check_json(cJSON_CreateObject());
        cJSON_AddNumberToObject(c, "index", i);
        const char *text = b->text ? b->text : "";
        if (pd) {
            if (first) cJSON_AddStringToObject(pd, "role", "assistant");
            cJSON_AddItemToObject(c, "delta", pd);
        } else if (g->q.is_chat) {
            cJSON *d = check_json(cJSON_AddObjectToObject(c, "delta"));
            if (first) cJSON_AddStringToObject(d, "role", "assistant");
            if (b->text_len || first) add_text(d, "content", text, b->text_len);
        } else {
            add_echoed_text(c, first ? r : NULL, text, b->text_len);
            if (first && r->echo) b->text_offset += r->echo_len;
        }
        size_t offset = b->text_offset;
        cJSON_AddItemToObject(c, "logprobs", check_json(logprobs_json(g, first ? echo_logprobs(g, i) : NULL, b, &offset)));
        cJSON_AddItemToObject(c, "finish_reason", check_json(final ? finish_json(b->finish, calls) : cJSON_CreateNull()));
        cJSON_AddItemToArray(choices, c);
        if (g->q.include_usage) cJSON_AddNullToObject(o, "usage");
        b->sent_tokens += b->n;
        b->sent_text += b->text_len;
        b->role_sent = 1;
        if (final) b->final_sent = 1;
        sse_event(g, o, 0);
        b->text_offset += b->text_len;
        b->n = 0;
        b->text_len = 0;
    }
}

void http_stream_skip(struct http_gen *g, int i, int tokens, size_t bytes, int final_sent)
{
    struct sample_buf *b = &g->samples[i];
    if (tokens > b->n) tokens = b->n;
    if (bytes > b->text_len) bytes = b->text_len;
    if (parsed(g) && bytes) { /* the parts that text gave went out: the parse state says so */
        cJSON *d = check_json(cJSON_CreateObject());
        int calls;
        parsed_delta(g, i, b->text, bytes, 0, d, &calls);
        cJSON_Delete(d);
    }
    const size_t keep = (size_t)(b->n - tokens);
    memmove(b->ids, b->ids + tokens, keep * sizeof *b->ids);
    if (b->lp) memmove(b->lp, b->lp + tokens, keep * sizeof *b->lp);
    if (b->top) memmove(b->top, b->top + (size_t)tokens * b->n_top, keep * (size_t)b->n_top * sizeof *b->top);
    if (b->text) memmove(b->text, b->text + bytes, b->text_len - bytes);
    b->n -= tokens;
    b->text_len -= bytes;
    b->sent_tokens = tokens;
    b->sent_text = bytes;
    const struct http_run *r = run_of(g, i);
    b->text_offset = bytes + (!g->q.is_chat && r->echo ? r->echo_len : 0);
    b->role_sent = 1;
    b->final_sent = final_sent;
}

void http_stream_finish(struct http_gen *g)
{
    if (g->q.anthropic) {
        http_anthropic_finish(g);
        return;
    }
    if (g->q.responses) {
        http_responses_finish(g);
        return;
    }
    if (g->usage_sent) {
        /* a reattached client had the usage (or error) chunk: only [DONE] is left */
    } else if (g->end_status != STATUS_OK) {
        /* Headers are gone: an error after the first byte travels as an event (vLLM does so). */
        cJSON *o = check_json(cJSON_CreateObject());
        cJSON *e = check_json(cJSON_AddObjectToObject(o, "error"));
        cJSON_AddStringToObject(e, "message", g->end_message);
        cJSON_AddStringToObject(e, "type", "server_error");
        cJSON_AddNullToObject(e, "param");
        cJSON_AddStringToObject(e, "code", status_name(g->end_status));
        sse_event(g, o, 1);
    } else if (g->q.include_usage) {
        cJSON *o = envelope(g, g->q.is_chat ? "chat.completion.chunk" : "text_completion");
        check_json(cJSON_AddArrayToObject(o, "choices"));
        cJSON_AddItemToObject(o, "usage", usage_json(g));
        sse_event(g, o, 1);
    }
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "data: [DONE]\n\n", 14);
    g->done = 1;
}

char *http_error_json(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON *e = check_json(cJSON_AddObjectToObject(o, "error"));
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return print_json(o);
}
