/* server/http_gen.c - one generation request of the HTTP front (struct http_gen): tokenized,
 * validated and submitted to the engine, its events gathered under its mutex, waited for,
 * streamed as server-sent events, cancelled when its client goes away (http_peer_gone), counted
 * when it ends. Reference-counted: the connection, the engine and a streaming response each hold
 * one (http_internal.h).
 * Not here: HTTP routing, early refusals and replies (http.c), the JSON (http_openai.c).
 * Tests: tests/server/test_http.py (disconnect, sse, prompts, echo, hardening). */
#define _GNU_SOURCE /* POLLRDHUP */
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_internal.h"
#include "metrics.h"
#include "tokenizer.h"
#include "tool_format.h"

#define HTTP_WAIT_MS 100 /* how often a waiting request checks its client's socket */
#define HTTP_HALF_CLOSE_GRACE_S 1.0 /* a FIN this soon after the request is a half-close (http_peer_gone) */

/* Whether the client of g is gone; with g->mu held. A reset or a socket error means gone. An
 * end of file (the client shut down its sending side: a FIN) is ambiguous: a client that
 * half-closes right after its request (`nc -N`, some proxies) still reads the answer, while a
 * client that gave up and closed its socket sends the same FIN, and only a write could tell
 * the two apart (a unary answer has nothing to write until the end). The rule: a FIN seen
 * within HTTP_HALF_CLOSE_GRACE_S of the request's submission is a half-close, and the answer
 * is sent; a FIN that comes later is a client that went away (nginx and uvicorn read every
 * FIN so), and its request is cancelled. A write that fails always means gone
 * (libmicrohttpd ends the response: http_stream_free, on_completed). */
int http_peer_gone(struct http_gen *g)
{
    if (g->fd < 0) return 0;
    struct pollfd p = {.fd = g->fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR)) return 1;
    if (!(p.revents & POLLRDHUP) || g->half_closed) return 0;
    if (base_now_s() - g->t_submit <= HTTP_HALF_CLOSE_GRACE_S) {
        g->half_closed = 1;
        return 0;
    }
    return 1;
}

/* ---- one generation request ---------------------------------------------------------------- */

void http_gen_unref(struct http_gen *g)
{
    if (atomic_fetch_sub(&g->refs, 1) != 1) return;
    struct server *s = g->s;
    http_responses_forget(g); /* before anything goes: a cancel by id may look for g until then */
    /* Its client has its answer (or gave up): the journal forgets it, unless the server's
     * drain cut it short, or it was resumed and nobody has fetched it (the retention sweep
     * ends those: http_resume.c). */
    if (g->journaled && !g->drained && (!g->resumed || g->delivered) && !g->end_journaled) journal_end(s->journal, g->id);
    http_resume_release(g);
    journal_entry_free(&g->log);
    free(g->subs);
    for (int i = 0; i < g->n_samples; i++) sample_buf_free(&g->samples[i]);
    free(g->samples);
    for (int i = 0; i < g->n_runs; i++) {
        struct http_run *r = &g->runs[i];
        free(r->ids);
        free(r->echo);
        free(r->prompt_ids);
        free(r->prompt_lp);
        free(r->prompt_top);
    }
    free(g->runs);
    for (int i = 0; g->ps && i < g->n_samples; i++) {
        tool_stream_free(g->ps[i].ts);
    }
    free(g->ps);
    free(g->out);
    if (g->q.model && !atomic_exchange(&g->model_released, 1)) server_release(s, g->m);
    http_request_free(&g->q);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
    atomic_fetch_sub(&s->http_active, 1);
}


void http_gen_release_model(struct http_gen *g)
{
    if (g->q.model && !g->resumed && !atomic_exchange(&g->model_released, 1)) server_release(g->s, g->m);
}

/* Engine thread: a copy of the prompt's log-probabilities for echo; with g->mu held. */
static void take_prompt_logprobs(struct http_run *r, const struct engine_event *ev)
{
    if (r->prompt_lp_ready || !r->g->q.echo || ev->n_tokens <= 0 || !ev->logprobs) return;
    size_t n = (size_t)ev->n_tokens, k = ev->top && ev->n_top > 0 ? (size_t)ev->n_top : 0;
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    r->prompt_lp = malloc(n * sizeof *r->prompt_lp);
    r->prompt_top = k ? malloc(n * k * sizeof *r->prompt_top) : NULL;
    CHECK(r->prompt_ids && r->prompt_lp && (!k || r->prompt_top), "out of memory");
    memcpy(r->prompt_ids, ev->tokens, n * sizeof *r->prompt_ids);
    memcpy(r->prompt_lp, ev->logprobs, n * sizeof *r->prompt_lp);
    if (k) memcpy(r->prompt_top, ev->top, n * k * sizeof *r->prompt_top);
    r->n_prompt = ev->n_tokens;
    r->n_prompt_top = (int)k;
    r->prompt_lp_ready = 1;
}

static int take_event(struct http_gen *g, struct http_run *r, const struct engine_event *ev, int journal)
{
    struct http_run *run = &g->runs[r->index];
    struct engine_event mapped = *ev; /* a resumed sample's events are its prompt's sample sample_base */
    mapped.sample += r->sample_base;
    if (journal && g->journaled) journal_event(g->s->journal, g->id, r->index, &mapped); /* before any client sees it */
    if ((g->resumed || g->keep_log) && !g->replaying && journal_entry_add(&g->log, r->index, &mapped) != STATUS_OK)
        LOG_WARN("http", "req=%s: out of memory keeping its events: a reattaching client may miss some", g->id);
    if (ev->kind == ENGINE_EVENT_PROMPT_LOGPROBS) {
        take_prompt_logprobs(run, ev);
        return 0;
    }
    const int sample = ev->sample + r->sample_base;
    if (ev->sample < 0 || sample >= g->n_per_run) return 0;
    struct sample_buf *b = &g->samples[r->index * g->n_per_run + sample];
    double now = base_now_s();
    if (ev->n_tokens > 0 && g->t_first == 0) g->t_first = now;
    if (!g->replaying) sample_buf_note_tokens(b, g->s->metrics, ev->n_tokens, now); /* (a replay's are not latencies) */
    if (ev->kind == ENGINE_EVENT_FINISHED && ev->queue_seconds >= 0 && (g->queue_s < 0 || ev->queue_seconds < g->queue_s))
        g->queue_s = ev->queue_seconds;
    sample_buf_append(b, ev->tokens, ev->n_tokens, ev->logprobs, ev->top, ev->n_top, ev->text, ev->text_len);
    b->completion_tokens = ev->completion_tokens;
    run->prompt_tokens = ev->prompt_tokens;
    run->cached_prompt_tokens = ev->cached_prompt_tokens;
    if (ev->kind != ENGINE_EVENT_FINISHED || b->finished) return 0;
    b->finished = 1;
    b->finish = ev->finish;
    int last = --g->active == 0;
    if (last) g->t_ended = now;
    enum status st = STATUS_OK;
    const char *msg = "";
    if (ev->finish == FINISH_REASON_CANCELLED) {
        int draining = atomic_load(&g->s->phase) >= PHASE_DRAINING;
        st = draining && !g->hangup ? STATUS_UNAVAILABLE : STATUS_CANCELLED;
        msg = draining && !g->hangup ? "the server shut down before the request finished (drain timeout)"
                                     : "cancelled: the client went away";
    } else if (ev->finish == FINISH_REASON_DEADLINE) {
        st = STATUS_DEADLINE_EXCEEDED, msg = "the request's deadline passed";
    } else if (ev->finish == FINISH_REASON_ERROR) {
        st = ev->status != STATUS_OK ? ev->status : STATUS_INTERNAL, msg = ev->message ? ev->message : "";
    }
    if (st != STATUS_OK && g->end_status == STATUS_OK) {
        g->end_status = st;
        snprintf(g->end_message, sizeof g->end_message, "%s", msg);
    }
    return last;
}

/* The SSE events of what g's samples hold now, and the closing ones once every sample has gone
 * out whole; with g->mu held. */
static void form_sse(struct http_gen *g)
{
    if (g->done) return;
    http_stream_chunks(g);
    int all_sent = 1;
    for (int i = 0; i < g->n_samples; i++) all_sent &= g->samples[i].final_sent;
    if (g->active == 0 && all_sent) http_stream_finish(g);
}

int http_gen_take_event(struct http_gen *g, struct http_run *r, const struct engine_event *ev, int journal)
{
    int last = take_event(g, r, ev, journal);
    /* A resumed request forms its events only for a client (one attaching replays the log). */
    if (g->sse_per_event && (!g->resumed || g->attached)) form_sse(g);
    return last;
}

/* Engine thread (ctx: the run): append, signal; the engine's reference goes with the last
 * FINISHED of the last run. A journaled request's cancellation by the drain is neither
 * journaled nor shown: the request stays open in the journal, and a restart resumes it. */
void http_gen_on_event(void *ctx, const struct engine_event *ev)
{
    struct http_run *r = ctx;
    struct http_gen *g = r->g;
    pthread_mutex_lock(&g->mu);
    int last;
    if (g->journaled && (!g->hangup || g->drained) && server_cut_event(g->s, ev->kind, ev->finish, ev->status, 0)) {
        /* The drain's cut or the engine's failure: not this server's to finish. The restart
         * resumes the sample, and its client, cut off without a last chunk, reconnects. (Once
         * a sample was cut, the client's connection is cut too: the hangup that follows is
         * ours, so the other samples' cuts are cuts as well, not a client's cancel.) */
        g->drained = 1;
        last = --g->active == 0;
    } else {
        last = http_gen_take_event(g, r, ev, 1);
        if (last && g->resumed && !g->attached) http_resume_store_final(g);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (last) http_gen_unref(g);
}

/* Waits up to HTTP_WAIT_MS for an event; with g->mu held. */
void http_gen_wait(struct http_gen *g)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += HTTP_WAIT_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&g->cv, &g->mu, &ts);
}

/* The connection is done with g (its client went away, or its stream or answer went out: a
 * server cannot tell bytes a client read from bytes lost in a dropped connection); with g->mu
 * held. Returns HTTP_HANGUP_CANCEL when the caller must engine_cancel the request after
 * unlocking (the engine frees its blocks at the next step; engine_cancel is never called under
 * g->mu, which the engine thread takes in on_engine_event), HTTP_HANGUP_DETACH when a journaled
 * first run (keep_log: --journal-detach-grace) becomes a detached request that runs on and
 * stays reattachable for the grace (http_resume.c adopts it, which takes the resumed list's
 * lock). */
enum http_hangup http_gen_hangup(struct http_gen *g)
{
    if (g->keep_log && g->eos_sent && !g->end_journaled) {
        /* Handed over whole: the grace keeps it for a client whose connection lost the last
         * bytes, but a restart does not bring it back (the END, after --journal-end-delay). */
        journal_end(g->s->journal, g->id);
        g->end_journaled = 1;
    }
    if (g->resumed) { /* it runs on for the next client to attach (http_resume.c) */
        if (g->attached && g->keep_log) g->t_detached = base_now_s();
        g->attached = 0;
        g->fd = -1;
        return HTTP_HANGUP_NONE;
    }
    if (g->hangup) return HTTP_HANGUP_NONE;
    if (g->keep_log && !g->drained) {
        g->resumed = 1; /* from here on as a resumed request, with its first run's pin */
        g->attached = 0;
        g->fd = -1;
        g->t_detached = base_now_s();
        return HTTP_HANGUP_DETACH; /* (logged once adopted: http_gen_after_hangup) */
    }
    g->hangup = 1;
    return g->active > 0 ? HTTP_HANGUP_CANCEL : HTTP_HANGUP_NONE;
}

void http_gen_after_hangup(struct http_gen *g, enum http_hangup h)
{
    if (h == HTTP_HANGUP_DETACH && http_resume_adopt(g)) {
        pthread_mutex_lock(&g->mu);
        const int running = g->active > 0;
        pthread_mutex_unlock(&g->mu);
        LOG_INFO("journal", "req=%s: its client went away; %s for %.0f s for the client to reattach", g->id,
                 running ? "it runs on" : "its answer waits", g->s->opts.journal_detach_grace_s);
    } else if (h == HTTP_HANGUP_DETACH) {
        /* --journal-detach-max are kept already: a hang-up as with no grace. */
        pthread_mutex_lock(&g->mu);
        g->resumed = 0;
        g->hangup = 1;
        h = g->active > 0 ? HTTP_HANGUP_CANCEL : HTTP_HANGUP_NONE;
        pthread_mutex_unlock(&g->mu);
        LOG_WARN("journal", "req=%s: its client went away with %s requests running for theirs: %s", g->id,
                 g->detach_limit, h == HTTP_HANGUP_CANCEL ? "cancelled" : "forgotten");
    }
    if (h == HTTP_HANGUP_CANCEL) http_gen_cancel(g);
}

/* Cancels every submitted run (a run that already ended is not found: no harm). Runs are only
 * submitted before the request is handed to its connection, so reading them is safe here. The
 * model is pinned meanwhile: the request's own pin may be gone (http_gen_release_model), and an
 * unloaded model has nothing left to cancel. */
void http_gen_cancel(struct http_gen *g)
{
    struct served_model *m = server_pin_if_loaded(g->s, g->m);
    if (!m) return;
    for (int i = 0; i < g->n_runs; i++)
        if (g->runs[i].submitted) engine_cancel(m->engine, g->runs[i].handle);
    for (int i = 0; i < g->n_subs; i++)
        if (g->subs[i].submitted) engine_cancel(m->engine, g->subs[i].handle);
    server_unpin_quietly(g->s, m);
}

/* Counts the request once it ended (once: a later call does nothing); g->mu held. */
void http_gen_observe(struct http_gen *g, enum status st)
{
    if (g->counted) return;
    g->counted = 1;
    int completion = 0, prompt = 0;
    for (int i = 0; i < g->n_samples; i++) completion += g->samples[i].completion_tokens;
    for (int i = 0; i < g->n_runs; i++) prompt += g->runs[i].prompt_tokens;
    double now = base_now_s();
    metrics_observe_request(g->s->metrics, METRICS_API_HTTP, server_grpc_code_name(server_grpc_code(st)),
                            g->t_first > 0 ? g->t_first - g->t_submit : -1.0, now - g->t_submit, g->queue_s);
    LOG_INFO("http", "req=%s status=%s prompts=%d prompt_tokens=%d completion_tokens=%d total_ms=%.1f", g->id,
             status_name(st), g->n_runs, prompt, completion, (now - g->t_submit) * 1e3);
}

/* libmicrohttpd's content reader of a stream: blocks until there is something to send. */
ssize_t http_stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    struct http_gen *g = cls;
    int formed = 0; /* the last bytes are formed in this call: the model pin goes before they do */
    pthread_mutex_lock(&g->mu);
    for (;;) {
        if (g->sse_per_event && g->done && !g->observed) { /* formed with the last engine event */
            g->observed = 1;
            http_gen_observe(g, g->end_status);
            formed = 1;
        }
        if (g->out_pos < g->out_len) {
            size_t n = g->out_len - g->out_pos < max ? g->out_len - g->out_pos : max;
            memcpy(buf, g->out + g->out_pos, n);
            g->out_pos += n;
            pthread_mutex_unlock(&g->mu);
            if (formed) http_gen_release_model(g);
            return (ssize_t)n;
        }
        if (g->done) {
            g->eos_sent = 1;
            pthread_mutex_unlock(&g->mu);
            if (formed) http_gen_release_model(g);
            return MHD_CONTENT_READER_END_OF_STREAM;
        }
        g->out_len = g->out_pos = 0;
        if (g->drained && g->journaled) { /* cut: the client reconnects to the restarted server */
            pthread_mutex_unlock(&g->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!g->sse_per_event) {
            http_stream_chunks(g);
            int all_sent = 1;
            for (int i = 0; i < g->n_samples; i++) all_sent &= g->samples[i].final_sent;
            if (g->active == 0 && all_sent && !g->out_len) {
                http_stream_finish(g);
                http_gen_observe(g, g->end_status);
                formed = 1;
            }
        }
        if (g->out_len) continue;
        http_gen_wait(g);
        if (http_peer_gone(g)) {
            const enum http_hangup h = http_gen_hangup(g);
            pthread_mutex_unlock(&g->mu);
            http_gen_after_hangup(g, h);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

/* The stream's response is gone (sent, or its connection died): cancel what still runs. */
void http_stream_free(void *cls)
{
    struct http_gen *g = cls;
    pthread_mutex_lock(&g->mu);
    /* The stream went out whole or was cut: a journaled first run stays reattachable for
     * --journal-detach-grace either way (its last bytes may be lost with the connection). */
    const enum http_hangup h = http_gen_hangup(g);
    if (g->resumed) { /* delivered whole, or its client went away: either way it is not cancelled */
        const int delivered = g->eos_sent && !g->keep_log; /* keep_log: the grace forgets it */
        http_gen_hangup(g);
        pthread_mutex_unlock(&g->mu);
        http_gen_after_hangup(g, h);
        pthread_mutex_lock(&g->mu);
        if (!g->resumed && !g->done) { /* not adopted (--journal-detach-max): cancelled, counted so */
            http_gen_observe(g, STATUS_CANCELLED);
            g->done = 1;
        }
        pthread_mutex_unlock(&g->mu);
        http_resume_detach(g, delivered);
        http_gen_unref(g);
        return;
    }
    if (!g->done) {
        http_gen_observe(g, STATUS_CANCELLED);
        g->done = 1;
    }
    pthread_mutex_unlock(&g->mu);
    http_gen_after_hangup(g, h);
    http_gen_unref(g);
}

/* ---- the generation endpoints -------------------------------------------------------------- */

/* Prompt i of g's request as token ids (*ids malloc'd) through gen_prompt, and its echo text:
 * the prompt as given, or the decoded token ids. Errors name the prompt when there are several. */
static enum status run_prompt(struct http_gen *g, int i, int32_t **ids, int *n_ids)
{
    struct gen_request *r = &g->q.r;
    struct http_prompt *p = g->q.is_chat ? NULL : &g->q.prompts[i];
    if (p) { /* gen_prompt reads r's prompt: lend it this one (it takes token ids over) */
        r->prompt = p->text;
        r->prompt_len = p->text_len;
        r->prompt_ids = p->ids;
        r->n_prompt_ids = p->n_ids;
        p->ids = NULL;
    }
    enum status st = gen_prompt(g->m, r, g->q.is_chat, ids, n_ids);
    if (p) {
        free(r->prompt_ids); /* only when gen_prompt failed before taking them */
        r->prompt = NULL;
        r->prompt_len = 0;
        r->prompt_ids = NULL;
        r->n_prompt_ids = 0;
    }
    struct request_params *rp = &r->params;
    if (st == STATUS_OK && rp->max_tokens < 0) { /* chat's default: the rest of the context */
        struct engine_model_info info;
        engine_get_model_info(g->m->engine, &info);
        rp->max_tokens = info.max_positions > *n_ids ? info.max_positions - *n_ids : 1;
    }
    if (st == STATUS_OK) st = engine_validate(g->m->engine, *ids, *n_ids, rp);
    struct http_run *run = &g->runs[i];
    if (st == STATUS_OK && p && g->q.echo) {
        if (p->text) {
            run->echo = strdup(p->text);
            run->echo_len = p->text_len;
            if (!run->echo) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else {
            st = tokenizer_decode(g->m->tok, *ids, *n_ids, &run->echo, &run->echo_len);
        }
    }
    if (st != STATUS_OK && g->n_runs > 1) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        return status_errorf(st, "prompt[%d]: %s", i, msg);
    }
    return st;
}

enum status http_gen_prepare(struct server *s, struct http_request *q, int fd, const char *id, struct http_gen **out)
{
    *out = NULL;
    struct http_gen *g = calloc(1, sizeof *g);
    if (!g) {
        http_request_free(q);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    atomic_init(&g->refs, 1);
    atomic_fetch_add(&s->http_active, 1);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->s = s;
    g->m = q->model ? q->model : &s->models[0];
    if (q->model) server_pin(s, q->model); /* the handler's pin ends with the handler */
    g->q = *q;
    g->q.r.params.owner = g->q.owner; /* its learned answers draft for its owner alone (engine.h) */
    g->fd = fd;
    g->created = (long long)time(NULL);
    g->t_submit = base_now_s();
    g->queue_s = -1.0;
    unsigned long long n = (unsigned long long)atomic_fetch_add(&s->http_next_id, 1) + 1;
    const char *kind = q->is_chat ? "chatcmpl" : "cmpl";
    if (id) snprintf(g->id, sizeof g->id, "%s", id);
    else if (s->journal) resume_new_id(s, kind, g->id, sizeof g->id); /* unique across restarts, not guessable */
    else snprintf(g->id, sizeof g->id, "%s-%llu", kind, n);
    int n_runs = q->is_chat ? 1 : q->n_prompts;
    if (!q->is_chat && g->q.r.params.max_tokens < 0) g->q.r.params.max_tokens = 16; /* OpenAI's default */
    int32_t **ids = calloc((size_t)n_runs, sizeof *ids);
    int *n_ids = calloc((size_t)n_runs, sizeof *n_ids);
    g->runs = calloc((size_t)n_runs, sizeof *g->runs);
    enum status st = STATUS_OK;
    if (!ids || !n_ids || !g->runs) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    else g->n_runs = n_runs;
    for (int i = 0; st == STATUS_OK && i < n_runs; i++) {
        g->runs[i].g = g;
        g->runs[i].index = i;
        st = run_prompt(g, i, &ids[i], &n_ids[i]);
        if (st == STATUS_OK) {
            g->runs[i].ids = ids[i], g->runs[i].n_ids = n_ids[i];
            ids[i] = NULL;
        }
    }
    struct request_params *p = &g->q.r.params;
    if (st == STATUS_OK && n_runs > 1) st = engine_validate_prompts(g->m->engine, n_runs, p->n);
    if (st == STATUS_OK) st = gen_resolve_adapter(g->m, &g->q.r);
    if (st == STATUS_OK) {
        g->n_per_run = p->n;
        g->n_samples = n_runs * p->n;
        g->samples = calloc((size_t)g->n_samples, sizeof *g->samples);
        if (!g->samples) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; ids && i < n_runs; i++) free(ids[i]);
    free(ids);
    free(n_ids);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        http_gen_unref(g);
        return status_errorf(st, "%s", msg);
    }
    g->active = g->n_samples; /* before submitting: events may arrive at once */
    *out = g;
    return STATUS_OK;
}

int http_gen_front(const struct http_gen *g)
{
    return g->q.anthropic   ? JOURNAL_HTTP_MESSAGES
           : g->q.responses ? JOURNAL_HTTP_RESPONSES
           : g->q.is_chat   ? JOURNAL_HTTP_CHAT
                            : JOURNAL_HTTP_COMPLETIONS;
}

/* The journal's ACCEPT of a new request (its seed fixed first, so that a sample resumed
 * before its first event starts where it would have). */
static enum status journal_accept_gen(struct http_gen *g, const char *body, size_t body_len)
{
    struct request_params *p = &g->q.r.params;
    if (!p->has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->sampling.seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)g;
        p->has_seed = 1;
    }
    char *translated = g->q.responses ? http_responses_journal_body(g) : NULL;
    struct journal_entry e = {.front = http_gen_front(g), .created = g->created, .seed = p->sampling.seed,
                              .body = translated ? translated : (char *)body,
                              .body_len = translated ? strlen(translated) : body_len};
    snprintf(e.key, sizeof e.key, "%s", g->id);
    snprintf(e.owner, sizeof e.owner, "%s", g->q.owner);
    enum status st = journal_accept(g->s->journal, &e);
    free(translated);
    if (st != STATUS_OK)
        return status_errorf(STATUS_UNAVAILABLE, "the stream journal cannot take the request (%s)", status_message());
    g->journaled = 1;
    g->keep_log = g->s->opts.journal_detach_grace_s > 0;
    g->front = e.front;
    g->sse_per_event = g->q.stream && (g->q.anthropic || g->q.responses);
    return STATUS_OK;
}

/* Tokenizes, validates and submits q (whose ownership moves into a new http_gen, *out, holding
 * the caller's reference): every prompt is checked before any is submitted, and when one
 * cannot be submitted (a full queue) those already submitted are cancelled. On error nothing
 * is left (the engine drops its reference as the cancelled runs finish). With the journal
 * (body: the request's bytes, id: its Idempotency-Key or NULL), an OpenAI request's ACCEPT is
 * on disk before the engine sees it. */
enum status http_gen_submit(struct server *s, struct http_request *q, int fd, const char *body, size_t body_len,
                            const char *id, struct http_gen **out)
{
    struct http_gen *g;
    enum status st = http_gen_prepare(s, q, fd, id, &g);
    *out = NULL;
    if (st != STATUS_OK) return st;
    if (s->journal &&
        ((st = http_resume_claim(s, g)) != STATUS_OK || (st = journal_accept_gen(g, body, body_len)) != STATUS_OK)) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        http_gen_unref(g);
        return status_errorf(st, "%s", msg);
    }
    const int n_runs = g->n_runs;
    const struct request_params *p = &g->q.r.params;
    int submitted = 0;
    atomic_fetch_add(&g->refs, 1); /* the engine's, until the last FINISHED */
    for (; st == STATUS_OK && submitted < n_runs; submitted++) {
        struct http_run *r = &g->runs[submitted];
        char rid[sizeof g->id + 16];
        if (n_runs > 1) snprintf(rid, sizeof rid, "%s-%d", g->id, submitted);
        else snprintf(rid, sizeof rid, "%s", g->id);
        r->prompt_tokens = r->n_ids;
        st = engine_submit(g->m->engine, rid, r->ids, r->n_ids, p, http_gen_on_event, r, &r->handle);
        if (st == STATUS_OK) r->submitted = 1;
    }
    if (st != STATUS_OK) {
        submitted--; /* the one that failed */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        pthread_mutex_lock(&g->mu);
        g->active -= (n_runs - submitted) * p->n;
        int last = g->active == 0;
        g->hangup = 1; /* nobody waits for the cancelled runs */
        pthread_mutex_unlock(&g->mu);
        http_gen_cancel(g);
        if (last) atomic_fetch_sub(&g->refs, 1);
        http_gen_unref(g);
        return status_errorf(st, "%s%s", msg, submitted ? " (the request's other prompts were cancelled)" : "");
    }
    *out = g;
    return STATUS_OK;
}
