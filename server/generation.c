/* server/generation.c - Generate, Chat, GenerateStream and ChatStream: the request is parsed
 * (convert.c), templated and tokenized (gen_prompt.c, off the loop), checked against the model
 * and submitted to the engine; the engine's events are copied off the engine thread into a
 * queue, appended to each sample's output buffer (text, token ids, log-probabilities), and sent:
 * one message per sample and engine step for streams (what arrives while a message is on the
 * wire is coalesced into the next one), one message once every sample has finished for unary
 * calls. Chat replies with tools or reasoning are also parsed (chat_tools.c): whole for unary
 * calls, as deltas for streams.
 * Not here: the call's batches (call.c), protobuf (convert.c), the prompt (gen_prompt.c, built on
 * the loader's prompt thread: loader.c), templates (engine/text).
 * Tests: tests/server/test_server.py (basic, concurrency, cancel, deadline, invalid, drain, work:
 * the prompt off the loop). */
#include <grpc/grpc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert.h"
#include "http_internal.h"
#include "journal.h"
#include "metrics.h"
#include "server_internal.h"

/* ---- engine events ----------------------------------------------------------------------- */

/* One allocation holding a copy of ev and its arrays (aborts when out of memory). */
static struct queued_event *event_copy(struct call *c, const struct engine_event *ev)
{
    size_t n = ev->n_tokens > 0 ? (size_t)ev->n_tokens : 0, n_top = ev->top ? (size_t)ev->n_top : 0;
    size_t msg_len = ev->message ? strlen(ev->message) : 0;
    size_t size = sizeof(struct queued_event) + n * sizeof(int32_t) + (ev->logprobs ? n * sizeof(float) : 0) +
                  n * n_top * sizeof(struct top_logprob) + ev->text_len + 1 + msg_len + 1;
    struct queued_event *q = malloc(size);
    CHECK(q, "out of memory copying an engine event (%zu bytes)", size);
    char *p = (char *)(q + 1);
    memset(q, 0, sizeof *q);
    q->call = c;
    q->t = base_now_s();
    q->queue_seconds = ev->queue_seconds;
    q->kind = ev->kind;
    q->sample = ev->sample;
    q->n_tokens = (int)n;
    q->tokens = (int32_t *)p;
    if (n) memcpy(q->tokens, ev->tokens, n * sizeof(int32_t));
    p += n * sizeof(int32_t);
    if (ev->logprobs) {
        q->logprobs = (float *)p;
        memcpy(q->logprobs, ev->logprobs, n * sizeof(float));
        p += n * sizeof(float);
    }
    if (n_top) {
        q->top = (struct top_logprob *)p;
        q->n_top = (int)n_top;
        memcpy(q->top, ev->top, n * n_top * sizeof(struct top_logprob));
        p += n * n_top * sizeof(struct top_logprob);
    }
    q->text = p;
    q->text_len = ev->text_len;
    if (ev->text_len) memcpy(q->text, ev->text, ev->text_len);
    q->text[ev->text_len] = 0;
    p += ev->text_len + 1;
    q->message = p;
    if (msg_len) memcpy(q->message, ev->message, msg_len);
    q->message[msg_len] = 0;
    q->finish = ev->finish;
    q->status = ev->status;
    q->prompt_tokens = ev->prompt_tokens;
    q->completion_tokens = ev->completion_tokens;
    q->cached_prompt_tokens = ev->cached_prompt_tokens;
    q->seed = ev->seed;
    return q;
}

/* On the engine thread: journal (a journaled call), copy, queue, wake. Never blocks beyond a
 * short mutex and, with the journal, one write(2). */
/* Tests only (tests/server/test_journal_cut.py): the loop stops for d seconds (0: not), logged
 * with the environment variable name that asked for it, so that a test can kill the server at
 * that point of a journaled call. */
static void test_pause(const struct call *c, double d, const char *name)
{
    if (d <= 0.0) return;
    LOG_WARN("server", "req=%s: %s: a pause of %.1f s", c->request_id, name, d);
    struct timespec t = {(time_t)d, (long)((d - (float)(time_t)d) * 1e9f)};
    nanosleep(&t, NULL);
}

static void on_engine_event(void *ctx, const struct engine_event *ev)
{
    struct call *c = ctx;
    struct server *s = c->s;
    if (c->journaled) grpc_journal_event(c, ev); /* before the client can see it */
    struct queued_event *q = event_copy(c, ev);
    pthread_mutex_lock(&s->ev_mu);
    if (s->ev_tail) s->ev_tail->next = q;
    else s->ev_head = q;
    s->ev_tail = q;
    pthread_mutex_unlock(&s->ev_mu);
    server_wake(s);
}

/* ---- generation calls -------------------------------------------------------------------- */

void sample_buf_free(struct sample_buf *b)
{
    free(b->text);
    free(b->ids);
    free(b->lp);
    free(b->top);
}

void gen_call_release(struct call *c)
{
    /* Its client has its answer or gave up (a cancel): the journal forgets it, unless the
     * drain cut it short (a restart resumes it). */
    if (c->journaled && !c->drained) journal_end(c->s->journal, c->request_id);
    resume_key_release(c->s, &c->live);
    if (c->job) grpc_resume_detach(c);
    free(c->resume_token);
    free(c->resume_from);
    for (int i = 0; i < c->n_samples; i++) sample_buf_free(&c->samples[i]);
    free(c->samples);
    free(c->prompt_ids);
    free(c->prompt_lp);
    free(c->prompt_top);
    free(c->request_id);
    free(c->client);
    free(c->end_message);
    for (int i = 0; c->chat_streams && i < c->n_samples; i++) chat_stream_free(&c->chat_streams[i]);
    free(c->chat_streams);
    chat_parse_free(&c->chat);
}

void sample_buf_note_tokens(struct sample_buf *b, struct metrics *m, int n, double t)
{
    if (n <= 0) return;
    if (b->t_last_token > 0) metrics_observe_itl(m, t - b->t_last_token, n);
    b->t_last_token = t;
}

void sample_buf_append(struct sample_buf *b, const int32_t *tokens, int n_tokens, const float *logprobs,
                       const struct top_logprob *top, int n_top, const char *text, size_t text_len)
{
    if (n_tokens > 0) {
        int need = b->n + n_tokens;
        size_t old_cap = b->cap;
        /* lp and top follow the capacity of ids. */
        CHECK(base_grow((void **)&b->ids, &b->cap, (size_t)need, sizeof *b->ids) == 0, "out of memory");
        if (logprobs && (!b->has_lp || b->cap != old_cap)) {
            float *lp = realloc(b->lp, (size_t)b->cap * sizeof *lp);
            CHECK(lp, "out of memory");
            if (!b->has_lp) memset(lp, 0, (size_t)b->cap * sizeof *lp);
            b->lp = lp;
            b->has_lp = 1;
        }
        if (logprobs && top && n_top > 0 && (!b->top || b->cap != old_cap)) {
            if (!b->top) b->n_top = n_top;
            struct top_logprob *t = realloc(b->top, (size_t)b->cap * (size_t)b->n_top * sizeof *t);
            CHECK(t, "out of memory");
            if (!b->top) memset(t, 0, (size_t)b->cap * (size_t)b->n_top * sizeof *t);
            b->top = t;
        }
        memcpy(b->ids + b->n, tokens, (size_t)n_tokens * sizeof *b->ids);
        if (logprobs && b->lp) memcpy(b->lp + b->n, logprobs, (size_t)n_tokens * sizeof *b->lp);
        if (top && b->top && n_top == b->n_top)
            memcpy(b->top + (size_t)b->n * b->n_top, top, (size_t)n_tokens * (size_t)n_top * sizeof *b->top);
        b->n = need;
    }
    if (text_len) {
        CHECK(base_grow((void **)&b->text, &b->text_cap, b->text_len + text_len + 1, 1) == 0, "out of memory");
        memcpy(b->text + b->text_len, text, text_len);
        b->text_len += text_len;
        b->text[b->text_len] = 0;
    }
}

static struct gen_sample_out sample_view(const struct sample_buf *b, int index, int with_usage)
{
    struct gen_sample_out o = {
        .index = index, .text = b->text ? b->text : "", .text_len = b->text_len, .ids = b->ids, .n_ids = b->n,
        .logprobs = b->has_lp ? b->lp : NULL, .top = b->has_lp && b->n_top ? b->top : NULL, .n_top = b->n_top,
        .finish = with_usage ? b->finish : FINISH_REASON_NONE, .has_usage = with_usage,
        .prompt_tokens = b->prompt_tokens, .completion_tokens = b->completion_tokens,
        .cached_prompt_tokens = b->cached_prompt_tokens,
    };
    return o;
}

/* The status a finished generation call ends with. */
static void gen_final_status(struct call *c, grpc_status_code *code, const char **details)
{
    *code = server_grpc_code(c->end_status);
    *details = c->end_message ? c->end_message : "";
}

/* The prompt log-probabilities go with the first response message of a call, once. */
static void attach_prompt_logprobs(const struct call *c, struct gen_response_out *o)
{
    if (!c->prompt_lp_pending) return;
    o->prompt_ids = c->prompt_ids;
    o->prompt_logprobs = c->prompt_lp;
    o->prompt_top = c->prompt_top;
    o->n_prompt = c->n_prompt;
    o->n_prompt_top = c->n_prompt_top;
}

void gen_pump(struct call *c)
{
    if (c->close_done) {
        /* Nobody listens: drop what was accumulated. */
        for (int i = 0; i < c->n_samples; i++) c->samples[i].n = 0, c->samples[i].text_len = 0;
        return;
    }
    if (c->send_inflight || c->status_sent || !c->submitted || c->replaying) return;
    if (is_streaming(c->method)) {
        for (int k = 0; k < c->n_samples; k++) {
            int i = (c->rr + k) % c->n_samples;
            struct sample_buf *b = &c->samples[i];
            int final = b->finished && !b->final_sent;
            if (b->n == 0 && b->text_len == 0 && !final && !c->prompt_lp_pending) continue;
            struct gen_sample_out one = sample_view(b, i, final);
            struct gen_response_out o = {.request_id = c->request_id, .seed = c->seed, .unary = 0, .samples = &one,
                                         .n_samples = 1, .tok = c->m->tok};
            attach_prompt_logprobs(c, &o);
            uint8_t *msg;
            size_t len;
            struct chat_reply delta = {0};
            enum status st = c->chat_streams ? chat_stream_delta(&c->chat, &c->chat_streams[i], c->request_id, i,
                                                                 b->text ? b->text : "", b->text_len, final, &delta)
                                             : STATUS_OK;
            if (st == STATUS_OK) chat_reply_fill(&delta, &one);
            if (st == STATUS_OK) st = convert_gen_response(&o, &msg, &len);
            chat_reply_free(&delta);
            if (st != STATUS_OK) {
                if (c->job) grpc_resume_cancel(c);
                else if (c->engine_active > 0) engine_cancel(c->m->engine, c->handle);
                call_fail_status(c, st, status_message());
                return;
            }
            c->prompt_lp_pending = 0;
            b->n = 0;
            b->text_len = 0;
            if (final) b->final_sent = 1;
            c->rr = (i + 1) % c->n_samples;
            call_send(c, msg, len, 0, GRPC_STATUS_OK, NULL);
            return;
        }
        if (c->engine_active == 0) {
            grpc_status_code code;
            const char *details;
            gen_final_status(c, &code, &details);
            c->job_delivered = c->job != NULL;
            call_send(c, NULL, 0, 1, code, details);
        }
        return;
    }
    /* Unary: one response once every sample has finished. */
    if (c->engine_active > 0) return;
    grpc_status_code code;
    const char *details;
    gen_final_status(c, &code, &details);
    c->job_delivered = c->job != NULL;
    if (code != GRPC_STATUS_OK) {
        call_send(c, NULL, 0, 1, code, details);
        return;
    }
    struct gen_sample_out *outs = calloc((size_t)c->n_samples, sizeof *outs);
    CHECK(outs, "out of memory");
    struct chat_reply *replies = calloc((size_t)c->n_samples, sizeof *replies);
    CHECK(replies, "out of memory");
    enum status st = STATUS_OK;
    for (int i = 0; i < c->n_samples; i++) {
        const struct sample_buf *b = &c->samples[i];
        outs[i] = sample_view(b, i, 1);
        if (c->chat.on && st == STATUS_OK)
            st = chat_reply_whole(&c->chat, c->request_id, i, b->text ? b->text : "", b->text_len, &replies[i]);
        chat_reply_fill(&replies[i], &outs[i]);
    }
    struct gen_response_out o = {.request_id = c->request_id, .seed = c->seed, .unary = 1, .samples = outs,
                                 .n_samples = c->n_samples, .tok = c->m->tok};
    attach_prompt_logprobs(c, &o);
    uint8_t *msg;
    size_t len;
    if (st == STATUS_OK) st = convert_gen_response(&o, &msg, &len);
    for (int i = 0; i < c->n_samples; i++) chat_reply_free(&replies[i]);
    free(replies);
    free(outs);
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
    else call_send(c, msg, len, 1, GRPC_STATUS_OK, NULL);
}

/* Records why a request ended early (the first reason wins). */
static void gen_set_end(struct call *c, enum status st, const char *message)
{
    if (c->end_status != STATUS_OK) return;
    c->end_status = st;
    free(c->end_message);
    c->end_message = strdup(message ? message : "");
}

/* One event into c's buffers; 1 when the caller should pump (anything but a stray sample). */
static int gen_take_event(struct call *c, const struct queued_event *q)
{
    if (q->kind == ENGINE_EVENT_PROMPT_LOGPROBS) {
        if (q->n_tokens > 0 && q->logprobs) {
            free(c->prompt_ids);
            free(c->prompt_lp);
            free(c->prompt_top);
            c->prompt_ids = malloc((size_t)q->n_tokens * sizeof *c->prompt_ids);
            c->prompt_lp = malloc((size_t)q->n_tokens * sizeof *c->prompt_lp);
            c->prompt_top = q->top ? malloc((size_t)q->n_tokens * (size_t)q->n_top * sizeof *c->prompt_top) : NULL;
            CHECK(c->prompt_ids && c->prompt_lp && (!q->top || c->prompt_top), "out of memory");
            memcpy(c->prompt_ids, q->tokens, (size_t)q->n_tokens * sizeof *c->prompt_ids);
            memcpy(c->prompt_lp, q->logprobs, (size_t)q->n_tokens * sizeof *c->prompt_lp);
            if (q->top) memcpy(c->prompt_top, q->top, (size_t)q->n_tokens * (size_t)q->n_top * sizeof *c->prompt_top);
            c->n_prompt = q->n_tokens;
            c->n_prompt_top = q->top ? q->n_top : 0;
            c->prompt_lp_pending = 1;
        }
        return 1;
    }
    if (q->sample < 0 || q->sample >= c->n_samples) {
        LOG_ERROR("server", "req=%s: engine event for sample %d of %d", c->request_id, q->sample, c->n_samples);
        return 0;
    }
    struct sample_buf *b = &c->samples[q->sample];
    if (c->journaled && server_cut_event(c->s, q->kind, q->finish, q->status, c->cancelled_by_rpc)) {
        const int failed = engine_event_is_failure(q->kind, q->finish, q->status);
        /* The drain's cut or the engine's failure, not the sample's end: neither journaled nor
         * shown (the client sees no last message), so that after the restart it reattaches and
         * the sample goes on. */
        c->engine_active--;
        c->drained = 1;
        gen_set_end(c, STATUS_UNAVAILABLE, failed ? "the server failed before the request finished: reattach with "
                                                    "shardlm-resume-token after its restart"
                                                  : "the server shut down before the request finished (drain timeout): "
                                                    "reattach with shardlm-resume-token after its restart");
        return 1;
    }
    c->seed = q->seed;
    if (q->n_tokens > 0 && c->t_first_token == 0) c->t_first_token = q->t;
    if (!c->replaying) sample_buf_note_tokens(b, c->s->metrics, q->n_tokens, q->t); /* (a replay's are not latencies) */
    if (q->kind == ENGINE_EVENT_FINISHED && q->queue_seconds >= 0 && (c->queue_s < 0 || q->queue_seconds < c->queue_s))
        c->queue_s = q->queue_seconds;
    if (!c->close_done) sample_buf_append(b, q->tokens, q->n_tokens, q->logprobs, q->top, q->n_top, q->text, q->text_len);
    b->prompt_tokens = q->prompt_tokens;
    b->completion_tokens = q->completion_tokens;
    b->cached_prompt_tokens = q->cached_prompt_tokens;
    if (q->kind == ENGINE_EVENT_FINISHED && !b->finished) {
        b->finished = 1;
        b->finish = q->finish;
        c->engine_active--;
        switch (q->finish) {
        case FINISH_REASON_CANCELLED:
            if (c->cancelled_by_rpc) gen_set_end(c, STATUS_CANCELLED, "cancelled by Cancel");
            else if (atomic_load(&c->s->phase) >= PHASE_DRAINING)
                gen_set_end(c, STATUS_UNAVAILABLE, "the server shut down before the request finished (drain timeout)");
            else gen_set_end(c, STATUS_CANCELLED, "cancelled");
            break;
        case FINISH_REASON_DEADLINE:
            gen_set_end(c, STATUS_DEADLINE_EXCEEDED, "the request's deadline passed");
            break;
        case FINISH_REASON_ERROR:
            gen_set_end(c, q->status != STATUS_OK ? q->status : STATUS_INTERNAL, q->message);
            break;
        default: break;
        }
    }
    return 1;
}

static void gen_on_event(struct call *c, const struct queued_event *q)
{
    if (!gen_take_event(c, q)) return;
    gen_pump(c);
    call_maybe_free(c);
}

void gen_take_engine_event(struct call *c, const struct engine_event *ev)
{
    struct queued_event *q = event_copy(c, ev);
    gen_take_event(c, q);
    free(q);
}

void gen_drain_events(struct server *s)
{
    pthread_mutex_lock(&s->ev_mu);
    struct queued_event *q = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->ev_mu);
    while (q) {
        struct queued_event *next = q->next;
        gen_on_event(q->call, q);
        free(q);
        q = next;
    }
    if (s->journal) grpc_resume_pump(s);
}

struct call *gen_find_call(struct server *s, const char *request_id)
{
    for (struct call *c = s->calls; c; c = c->next) {
        if (!is_generation(c->method) || !c->request_id || strcmp(c->request_id, request_id)) continue;
        if (c->submitted ? c->engine_active > 0 : c->journaled && c->load_job != NULL) return c;
    }
    return NULL;
}

/* A request naming an adapter its key may not use (http_finetune_hidden: another key's fine-tune)
 * is answered as one naming an adapter that is not loaded. */
static enum status check_adapter(struct server *s, const struct gen_request *r, const char *owner)
{
    if (!r->adapter || !http_finetune_hidden(s, r->adapter, owner)) return STATUS_OK;
    return status_errorf(STATUS_NOT_FOUND, "no adapter named '%.100s' is loaded (see GetModelInfo)", r->adapter);
}

enum status gen_build(struct server *s, const uint8_t *data, size_t len, int is_chat, const char *owner,
                      struct gen_request *r, struct served_model **m, struct chat_parse *chat, int32_t **ids, int *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    enum status st = convert_gen_request(data, len, is_chat, r);
    r->params.owner = owner;
    if (st == STATUS_OK) st = check_adapter(s, r, owner);
    /* The model first: the prompt is its tokenizer's and its template's. */
    if (st == STATUS_OK) st = server_route(s, r->adapter, m);
    if (st == STATUS_OK) st = gen_build_prompt(*m, r, is_chat, chat, ids, n_ids);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        gen_request_free(r);
        return status_errorf(st, "%s", msg);
    }
    return STATUS_OK;
}

/* A request id for a call that gave none: unique among running calls and, with the journal,
 * across restarts and not guessable (resume_new_id). */
static char *gen_new_id(struct server *s)
{
    char id[64];
    do {
        if (s->journal) resume_new_id(s, "req", id, sizeof id);
        else snprintf(id, sizeof id, "req-%llu", (unsigned long long)++s->next_id);
    } while (gen_find_call(s, id));
    return strdup(id);
}

/* A Generate or Chat call's prompt, built on the loader's prompt thread (the template rendered
 * with the tools, tool calls and reasoning, the text tokenized: up to a 4 MiB message, seconds
 * of work that must not stall every stream; loader.c), from gen_start to gen_prepared. */
struct gen_prep {
    struct gen_request r;
    struct chat_parse  chat;
    int32_t           *ids;
    int                n_ids, is_chat;
    struct journal    *journal;     /* a journaled request's ACCEPT, synced by gen_sync_job */
    long long          accept_end;  /* the journal's bytes written by its ACCEPT */
    int                synced;      /* gen_sync_job made the ACCEPT durable */
    double             deadline_unix; /* the client's deadline in Unix seconds, or 0 */
};

static void gen_prep_free(struct gen_prep *p)
{
    free(p->ids);
    gen_request_free(&p->r);
    free(p);
}

static enum status gen_prep_job(struct load_job *j)
{
    struct gen_prep *p = j->ctx;
    return gen_build_prompt(j->call->m, &p->r, p->is_chat, &p->chat, &p->ids, &p->n_ids);
}

/* On the loader's journal thread: the ACCEPT on disk (one fdatasync may cover several). */
static enum status gen_sync_job(struct load_job *j)
{
    struct gen_prep *p = j->ctx;
    enum status st = journal_sync(p->journal, p->accept_end);
    p->synced = st == STATUS_OK;
    return st;
}

/* The engine's part, on the loop, once the ACCEPT (if any) is durable (st its outcome): the
 * request to the engine, the stream's headers. Frees p. */
static void gen_run(struct call *c, const uint8_t *data, size_t len, struct gen_prep *p, enum status st,
                    const char *message)
{
    struct server *s = c->s;
    struct gen_request *r = &p->r;
    const int32_t *ids = p->ids;
    const int n_ids = p->n_ids;
    /* A Cancel by its id while its prompt was built or its ACCEPT synced (methods.c's cancel found
     * nothing to cancel in the engine yet). */
    if (st == STATUS_OK && c->cancelled_by_rpc)
        st = status_errorf(STATUS_CANCELLED, "cancelled by Cancel"), message = status_message();
    if (st == STATUS_OK) {
        c->n_prompt_tokens = n_ids;
        c->engine_active = c->n_samples; /* before submit: events may arrive at once */
        /* With --journal-detach-grace the request is a job from the start, read by this call
         * (grpc_resume.c): a client that goes away can reattach while it runs on. */
        if (c->journaled && s->opts.journal_detach_grace_s > 0)
            st = grpc_resume_first_run(c, data, len, ids, n_ids, &r->params, p->deadline_unix);
        else st = engine_submit(c->m->engine, c->request_id, ids, n_ids, &r->params, on_engine_event, c, &c->handle);
        if (st != STATUS_OK) c->engine_active = 0;
        message = NULL;
    }
    if (st != STATUS_OK) {
        call_fail_status(c, st, message ? message : status_message());
    } else {
        c->submitted = 1;
        LOG_DEBUG("server", "req=%s method=%s submitted: prompt_tokens=%d max_tokens=%d n=%d", c->request_id,
                  call_method_name(c->method), n_ids, r->params.max_tokens, r->params.n);
        if (c->close_done || c->send_has_status) {
            /* Its client went away during the ACCEPT's sync (gen_synced): the job runs on
             * detached, as after call_on_close; the call's release detaches it. */
            c->engine_active = 0;
            LOG_INFO("server", "req=%s: its client went away during the journal's sync; it runs on for a reattach",
                     c->request_id);
        } else {
            /* Streams get their headers at once, so that clients see the call is accepted; so do
             * journaled unary calls, whose headers carry the resume token. */
            if (c->journaled || c->job) test_pause(c, s->test_pause_headers_s, "SHARDLM_TEST_PAUSE_BEFORE_HEADERS_S");
            if ((is_streaming(c->method) || c->journaled || c->job) && !c->close_done)
                call_send(c, NULL, 0, 0, GRPC_STATUS_OK, NULL);
        }
    }
    gen_prep_free(p);
}

/* The loop, after gen_sync_job (j->st CANCELLED when the call ended meanwhile). A client gone
 * during the sync (a cancel, a cut connection; not its deadline; a Cancel of its id ends it in
 * gen_run) with --journal-detach-grace:
 * its request is on disk, so it runs on as a detached job, which the client may reattach to by
 * its token as to any other (docs/reliability.md row 43). Else it never reaches the engine, and
 * its END follows with the call's end. */
static void gen_synced(struct load_job *j)
{
    struct call *c = j->call;
    struct gen_prep *p = j->ctx;
    enum status st = j->st;
    const char *message = j->message;
    const int ready = atomic_load(&c->s->phase) == PHASE_READY;
    if (st == STATUS_CANCELLED && p->synced && ready && c->s->opts.journal_detach_grace_s > 0 &&
        gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) > 0)
        st = STATUS_OK;
    if (st == STATUS_OK && !ready) /* a drain began meanwhile */
        st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down"), message = status_message();
    gen_run(c, j->request, j->request_len, p, st, message);
}

/* The rest of gen_start, on the loop, once the prompt is built (st its outcome): the request id,
 * the deadline, the engine's checks and the journal's ACCEPT; the ACCEPT's sync on the loader's
 * journal thread, then gen_run. Takes p. */
static void gen_submit(struct call *c, const uint8_t *data, size_t len, struct gen_prep *p, enum status st,
                       const char *message)
{
    struct server *s = c->s;
    struct gen_request *r = &p->r;
    if (st == STATUS_OK && atomic_load(&s->phase) != PHASE_READY)
        st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down"), message = status_message();
    if (st == STATUS_OK) {
        if (r->request_id[0]) {
            if (gen_find_call(s, r->request_id))
                st = status_errorf(STATUS_ALREADY_EXISTS, "request_id '%s' is already in use by a running request",
                                   r->request_id);
            else
                c->request_id = strdup(r->request_id);
        } else {
            c->request_id = gen_new_id(s);
        }
        if (st == STATUS_OK && !c->request_id) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        message = NULL;
    }
    /* Every numeric limit (token ids against the vocabulary, top_k, ...) is the engine's:
     * engine_validate below, the one validator. */
    double deadline_unix = 0;
    if (st == STATUS_OK && gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) < 0) {
        double left = gpr_timespec_to_micros(gpr_time_sub(c->deadline, gpr_now(c->deadline.clock_type))) * 1e-6;
        if (left <= 0) st = status_errorf(STATUS_DEADLINE_EXCEEDED, "the deadline passed before the request started");
        else r->params.deadline = base_now_s() + left;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        deadline_unix = (double)now.tv_sec + now.tv_nsec * 1e-9 + left;
    }
    r->params.client = c->client;
    r->params.owner = c->owner; /* its learned answers draft for its owner alone (engine.h) */
    if (st == STATUS_OK) st = gen_resolve_adapter(c->m, r);
    if (st == STATUS_OK) st = engine_validate(c->m->engine, p->ids, p->n_ids, &r->params);
    if (st == STATUS_OK) {
        c->n_samples = r->params.n;
        c->samples = calloc((size_t)c->n_samples, sizeof *c->samples);
        if (c->chat.on && is_streaming(c->method))
            c->chat_streams = calloc((size_t)c->n_samples, sizeof *c->chat_streams);
        if (!c->samples || (c->chat.on && is_streaming(c->method) && !c->chat_streams))
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    /* With the journal, the ACCEPT is on disk before the engine sees the request; its sync runs
     * on the loader's journal thread (milliseconds, more on a busy disk: not on the loop), and
     * runs whatever happened to the call: the record is written, and with
     * --journal-detach-grace its request runs on without its client (gen_synced). */
    if (st == STATUS_OK && s->journal) test_pause(c, s->test_pause_accept_s, "SHARDLM_TEST_PAUSE_BEFORE_ACCEPT_S");
    p->deadline_unix = deadline_unix;
    if (st == STATUS_OK && s->journal &&
        (st = grpc_journal_accept(c, data, len, &r->params, deadline_unix, &p->accept_end)) == STATUS_OK) {
        p->journal = s->journal;
        if ((st = loader_submit_work(c, LANE_SYNC, JOB_RUNS_ABANDONED, gen_sync_job, gen_synced, p, data, len)) == STATUS_OK)
            return; /* goes on in gen_synced */
    }
    gen_run(c, data, len, p, st, message);
}

/* The loop, after gen_prep_job (j->st CANCELLED when the call ended meanwhile: loader_drain). */
static void gen_prepared(struct load_job *j)
{
    struct gen_prep *p = j->ctx;
    j->call->chat = p->chat; /* the call's now (gen_call_release frees it) */
    gen_submit(j->call, j->request, j->request_len, p, j->st, j->message);
}

void gen_start(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    if (c->resume_token) { /* the rest of a journaled request's answer (grpc_resume.c) */
        grpc_resume_attach(c, data, len);
        return;
    }
    if (c->resume_from) {
        call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "metadata shardlm-resume-from goes with shardlm-resume-token");
        return;
    }
    struct gen_prep *p = calloc(1, sizeof *p);
    if (!p) {
        call_fail_status(c, STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    p->is_chat = c->method == METHOD_CHAT || c->method == METHOD_CHAT_STREAM;
    enum status st = convert_gen_request(data, len, p->is_chat, &p->r);
    if (st == STATUS_OK) st = check_adapter(s, &p->r, c->owner);
    if (st == STATUS_OK && atomic_load(&s->phase) != PHASE_READY)
        st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    /* The model first: the prompt is its tokenizer's and its template's. */
    if (st == STATUS_OK && (st = call_pin_model(c, p->r.adapter, data, len)) == STATUS_OK && !c->m) {
        gen_request_free(&p->r); /* its model is loading: call_dispatch brings the request back */
        free(p);
        return;
    }
    if (st == STATUS_OK && (st = loader_submit_work(c, LANE_GEN, 0, gen_prep_job, gen_prepared, p, data, len)) == STATUS_OK)
        return; /* goes on in gen_prepared */
    gen_submit(c, data, len, p, st, status_message());
}
