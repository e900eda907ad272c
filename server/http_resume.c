/* server/http_resume.c - the HTTP front's side of the stream journal (journal.h,
 * docs/reliability.md): after a restart, every chat / completions / Anthropic messages /
 * Responses request the journal holds open is rebuilt (its body parsed again, its events
 * replayed into a new http_gen) and its unfinished samples resumed in the engine
 * (request_params.resume_*); a client reconnects with `Last-Event-ID: KEY;STATE` (a streamed
 * answer: the SSE id of the last chunk it got) or `Idempotency-Key: KEY` (the whole answer) and
 * gets what it has not had, exactly once.
 *
 * A journaled stream's SSE ids are "KEY;S0,S1,..." with one state per sample: "-" before its
 * first chunk, else "T.B" (T tokens and B bytes of generated text handed out) with "!" once its
 * last chunk (finish_reason) went out; "KEY;done" marks the usage (or error) chunk after them.
 * A reattaching client's view is rebuilt from every event of the request and the state's tokens
 * and bytes are skipped, so chunk boundaries need not repeat.
 * Anthropic and Responses streams, whose chunks become several events each, form their events
 * as the engine's events come (http_gen_take_event: sse_per_event), so that the stream is a
 * function of the log; their ids are "KEY;eN" (the Nth event), and a reattaching client's
 * stream is formed again from the log with its first N events skipped.
 *
 * Resumed requests live in s->resumed (the list holds one reference each) until a client has
 * the whole answer, or until journal_retain_s after they ended (then the journal forgets them);
 * a client that goes away does not cancel them.
 * Not here: the file (journal.c), opening it and the registry of taken ids (resume.c), the gRPC
 * side (grpc_resume.c), the engine's replay (request.c), the SSE writer (http_openai_out.c).
 * Tests: tests/server/test_journal.py. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "tool_format.h"

#define MODULE "journal"

void http_resume_sse_id(struct http_gen *g, int done)
{
    char buf[64];
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "id: ", 4);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, g->id, strlen(g->id));
    if (done) {
        http_buf_append(&g->out, &g->out_len, &g->out_cap, ";done\n", 6);
        return;
    }
    for (int i = 0; i < g->n_samples; i++) {
        const struct sample_buf *b = &g->samples[i];
        int n = b->role_sent ? snprintf(buf, sizeof buf, "%s%d.%zu%s", i ? "," : ";", b->sent_tokens, b->sent_text,
                                        b->final_sent ? "!" : "")
                             : snprintf(buf, sizeof buf, "%s-", i ? "," : ";");
        http_buf_append(&g->out, &g->out_len, &g->out_cap, buf, (size_t)n);
    }
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "\n", 1);
}

void http_resume_event_id(struct http_gen *g)
{
    if (!g->sse_per_event) return;
    char buf[JOURNAL_KEY_MAX + 32];
    int n = snprintf(buf, sizeof buf, "id: %s;e%d\n", g->id, ++g->sse_events);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, buf, (size_t)n);
}

/* ---- rebuilding a request from its journal entry --------------------------------------------- */

/* Replays every logged event into g's (empty) buffers; with g->mu held. */
static void replay(struct http_gen *g, const struct journal_entry *e)
{
    g->replaying = 1;
    for (int k = 0; k < e->n_events; k++) {
        const struct journal_event *je = &e->events[k];
        if (je->run < 0 || je->run >= g->n_runs) continue;
        struct engine_event ev;
        journal_event_view(je, &ev);
        ev.request_id = g->id;
        http_gen_take_event(g, &g->runs[je->run], &ev, 0);
    }
    g->replaying = 0;
}

/* A sample that cannot be resumed ends with an error (journaled: a restart does not retry it);
 * with g->mu held. Returns 1 when it was g's last. */
static int fail_sample(struct http_gen *g, int run, int j, enum status st, const char *message)
{
    struct http_run sub = {.g = g, .index = run, .sample_base = j};
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .request_id = g->id, .text = "",
                              .finish = FINISH_REASON_ERROR, .status = st, .message = message,
                              .queue_seconds = -1.0};
    return http_gen_take_event(g, &sub, &ev, 1);
}

/* Submits what g still has to generate: a run with no event at all as it was first submitted,
 * every other unfinished sample resumed on its own. */
static void resubmit(struct server *s, struct http_gen *g, const struct journal_entry *e)
{
    const struct request_params *p = &g->q.r.params;
    g->subs = calloc((size_t)g->n_samples, sizeof *g->subs);
    atomic_fetch_add(&g->refs, 1); /* the engine's, until the last FINISHED */
    pthread_mutex_lock(&g->mu);
    int last = g->active == 0;
    for (int i = 0; i < g->n_runs && !last; i++) {
        struct http_run *run = &g->runs[i];
        int any = 0;
        for (int k = 0; k < e->n_events; k++) any |= e->events[k].run == i;
        if (!any) {
            pthread_mutex_unlock(&g->mu); /* its events take g->mu */
            enum status st = engine_submit(s->models[0].engine, g->id, run->ids, run->n_ids, p, http_gen_on_event, run, &run->handle);
            pthread_mutex_lock(&g->mu);
            run->submitted = st == STATUS_OK;
            for (int j = 0; st != STATUS_OK && j < g->n_per_run && !last; j++)
                last = fail_sample(g, i, j, st, status_message());
            continue;
        }
        for (int j = 0; j < g->n_per_run && !last; j++) {
            if (g->samples[i * g->n_per_run + j].finished) continue;
            struct http_run *sub = g->subs ? &g->subs[g->n_subs] : NULL;
            int32_t *tokens = NULL;
            uint64_t rng[4];
            struct request_params rp;
            enum status st = sub ? journal_entry_resume(e, i, j, p, &rp, &tokens, rng)
                                 : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            if (st == STATUS_OK) {
                *sub = (struct http_run){.g = g, .index = i, .sample_base = j};
                char rid[JOURNAL_KEY_MAX + 32];
                snprintf(rid, sizeof rid, "%s-p%d-s%d", g->id, i, j);
                g->n_subs++;
                pthread_mutex_unlock(&g->mu);
                st = engine_submit(s->models[0].engine, rid, run->ids, run->n_ids, &rp, http_gen_on_event, sub, &sub->handle);
                pthread_mutex_lock(&g->mu);
                sub->submitted = st == STATUS_OK;
            }
            free(tokens);
            if (st != STATUS_OK) {
                LOG_ERROR(MODULE, "req=%s: sample %d of prompt %d cannot be resumed: %s", g->id, j, i, status_message());
                last = fail_sample(g, i, j, st, status_message());
            }
        }
    }
    pthread_mutex_unlock(&g->mu);
    if (last) http_gen_unref(g); /* nothing left for the engine */
}

struct http_gen *http_resume_find(struct server *s, const char *key)
{
    struct http_gen *g = s->resumed;
    while (g && strcmp(g->id, key)) g = g->next_resumed;
    return g;
}

const char *http_resume_endpoint(int front)
{
    switch (front) {
    case JOURNAL_HTTP_COMPLETIONS: return "/v1/completions";
    case JOURNAL_HTTP_CHAT: return "/v1/chat/completions";
    case JOURNAL_HTTP_MESSAGES: return "/v1/messages";
    case JOURNAL_HTTP_RESPONSES: return "/v1/responses";
    default: return "another endpoint";
    }
}

int http_resume_entry(struct server *s, struct journal_entry *e)
{
    struct http_adapter_snapshot an; /* (the adapters its owner may use, as when it was accepted) */
    http_adapter_snapshot(s, &s->models[0], e->owner, &an);
    const struct http_chat_caps caps = http_model_caps(&s->models[0]);
    const char *model_id = s->models[0].model_id;
    struct http_request q;
    struct http_gen *g = NULL;
    enum status st;
    switch (e->front) {
    case JOURNAL_HTTP_MESSAGES: st = http_anthropic_parse(e->body, e->body_len, 0, model_id, an.ptrs, an.n, &caps, &q); break;
    case JOURNAL_HTTP_RESPONSES: st = http_responses_restore(e->body, e->body_len, model_id, an.ptrs, an.n, &caps, &q); break;
    default: st = http_parse_request(e->body, e->body_len, e->front == JOURNAL_HTTP_CHAT, model_id, an.ptrs, an.n, &caps, &q);
    }
    if (st != STATUS_OK) http_request_free(&q);
    if (st == STATUS_OK) {
        snprintf(q.owner, sizeof q.owner, "%s", e->owner);
        q.r.params.sampling.seed = e->seed;
        q.r.params.has_seed = 1;
        st = http_gen_prepare(s, &q, -1, e->key, &g);
    }
    if (st != STATUS_OK) {
        /* The model or its adapters changed since: the request cannot go on. */
        LOG_ERROR(MODULE, "req=%s cannot be resumed (%s): forgotten", e->key, status_message());
        journal_end(s->journal, e->key);
        return 0;
    }
    g->created = e->created;
    g->journaled = g->resumed = 1;
    g->front = e->front;
    g->sse_per_event = g->q.stream && (g->q.anthropic || g->q.responses);
    if (g->q.responses) http_responses_begin(g); /* in the store again, in progress */
    pthread_mutex_lock(&g->mu);
    g->log = *e; /* from now on it grows with the engine's events (http_gen_take_event) */
    memset(e, 0, sizeof *e);
    replay(g, &g->log);
    if (g->active == 0) g->t_ended = base_now_s();
    pthread_mutex_unlock(&g->mu);
    resubmit(s, g, &g->log);
    pthread_mutex_lock(&s->resumed_mu);
    g->next_resumed = s->resumed;
    s->resumed = g;
    pthread_mutex_unlock(&s->resumed_mu);
    return 1;
}

/* ---- clients that come back ------------------------------------------------------------------ */

int http_resume_detached(struct server *s, const char *owner)
{
    int n = 0;
    for (struct http_gen *g = s->resumed; g; g = g->next_resumed) {
        pthread_mutex_lock(&g->mu);
        n += g->keep_log && !g->attached && !g->abandoned && g->active > 0 && (!owner || !strcmp(g->q.owner, owner));
        pthread_mutex_unlock(&g->mu);
    }
    return n;
}

int http_resume_adopt(struct http_gen *g)
{
    struct server *s = g->s;
    pthread_mutex_lock(&s->resumed_mu);
    pthread_mutex_lock(&g->mu);
    const int running = g->active > 0;
    pthread_mutex_unlock(&g->mu);
    if (running && resume_detach_full(s, g->q.owner, g->detach_limit, sizeof g->detach_limit)) {
        pthread_mutex_unlock(&s->resumed_mu);
        return 0;
    }
    atomic_fetch_add(&g->refs, 1); /* the list's */
    resume_key_unlink(s, &g->live); /* the key is never free in between */
    g->next_resumed = s->resumed;
    s->resumed = g;
    pthread_mutex_unlock(&s->resumed_mu);
    return 1;
}

/* g leaves s->resumed, delivered or as good as (s->resumed_mu and g->mu held): its END is queued
 * first, so that its key is never free while an event or the END of it could still follow a new
 * request's ACCEPT under the same key (a journal with two open ACCEPTs of one key does not load). */
static void end_before_unlink(struct http_gen *g)
{
    g->delivered = 1;
    if (g->journaled && !g->drained && !g->end_journaled) {
        journal_end(g->s->journal, g->id);
        g->end_journaled = 1;
    }
}

/* The sweep's result: the requests that left s->resumed (to unref) and those to cancel (a
 * reference each), both handled outside s->resumed_mu (never under a lock the engine thread
 * takes). */
struct swept {
    struct http_gen *gone, *cancel;
};

/* Ends the resumed requests whose answer waited past the retention, and the detached first runs
 * whose client did not come back within --journal-detach-grace: one still running is cancelled
 * and stays listed, abandoned (no client may reattach, its key stays taken), until its last
 * event; with s->resumed_mu held. */
static struct swept sweep(struct server *s)
{
    const double retain = s->opts.journal_retain_s > 0 ? s->opts.journal_retain_s : 600.0;
    const double grace = s->opts.journal_detach_grace_s;
    const double now = base_now_s();
    struct swept out = {NULL, NULL};
    for (struct http_gen **pp = &s->resumed; *pp;) {
        struct http_gen *g = *pp;
        pthread_mutex_lock(&g->mu);
        const int expired = g->active == 0 && !g->attached && g->t_ended > 0 && now - g->t_ended > retain;
        const int abandoned = !g->attached && (g->abandoned || (g->t_detached > 0 && now - g->t_detached > grace));
        const int cancel = abandoned && g->active > 0 && !g->abandoned;
        const int leave = (expired || abandoned) && g->active == 0;
        if (abandoned && !g->abandoned)
            LOG_INFO(MODULE, "req=%s: its client did not come back within %.0f s (--journal-detach-grace): %s", g->id,
                     grace, cancel ? "cancelled" : "forgotten");
        else if (expired) LOG_INFO(MODULE, "req=%s: nobody came for its answer within %.0f s: forgotten", g->id, retain);
        g->abandoned |= abandoned;
        if (leave) end_before_unlink(g);
        if (leave) http_gen_observe(g, g->end_status); /* a detached request no stream ended: counted here */
        pthread_mutex_unlock(&g->mu);
        if (cancel) {
            atomic_fetch_add(&g->refs, 1);
            g->next_cancel = out.cancel;
            out.cancel = g;
        }
        if (!leave) {
            pp = &g->next_resumed;
            continue;
        }
        *pp = g->next_resumed;
        g->next_resumed = out.gone;
        out.gone = g;
    }
    return out;
}

static void unref_all(struct http_gen *g)
{
    for (struct http_gen *next; g; g = next) {
        next = g->next_resumed;
        http_gen_unref(g);
    }
}

static void swept_finish(struct swept w)
{
    for (struct http_gen *g = w.cancel, *next; g; g = next) {
        next = g->next_cancel;
        http_gen_cancel(g);
        http_gen_unref(g);
    }
    unref_all(w.gone);
}

void http_resume_sweep(struct server *s)
{
    pthread_mutex_lock(&s->resumed_mu);
    struct swept w = s->resumed ? sweep(s) : (struct swept){NULL, NULL};
    pthread_mutex_unlock(&s->resumed_mu);
    swept_finish(w);
}

/* The state "eN" of an Anthropic or Responses stream applied to its view, rebuilt with its
 * events: the first N go no more. */
static enum status skip_events(struct http_gen *g, const char *state)
{
    char *end = NULL;
    long n = state[0] == 'e' && state[1] >= '0' && state[1] <= '9' ? strtol(state + 1, &end, 10) : -1;
    if (n < 0 || *end || n > g->sse_events)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "Last-Event-ID: \"%s;%s\" is not a position of this stream (an id its events carried)", g->id,
                             state);
    size_t at = 0;
    for (long k = 0; k < n; k++) { /* an event ends with a blank line; its JSON holds no newline */
        const char *p = memmem(g->out + at, g->out_len - at, "\n\n", 2);
        CHECK(p, "an event without its end");
        at = (size_t)(p - g->out) + 2;
    }
    g->out_pos = at;
    return STATUS_OK;
}

/* A state ("-", "T.B", "T.B!" per sample, or "done") applied to g's rebuilt view. */
static enum status apply_state(struct http_gen *g, const char *state)
{
    if (g->sse_per_event) return skip_events(g, state);
    if (!strcmp(state, "done")) {
        for (int i = 0; i < g->n_samples; i++) http_stream_skip(g, i, 1 << 30, (size_t)-1, 1);
        g->usage_sent = 1;
        return STATUS_OK;
    }
    const char *p = state;
    for (int i = 0; i < g->n_samples; i++) {
        if (i && *p++ != ',') goto bad;
        if (*p == '-') {
            p++;
            continue;
        }
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || *end != '.' || t < 0) goto bad;
        p = end + 1;
        unsigned long long b = strtoull(p, &end, 10);
        if (end == p) goto bad;
        p = end;
        int final = *p == '!';
        if (final) p++;
        const struct sample_buf *sb = &g->samples[i];
        if (t > sb->n || b > sb->text_len) goto bad; /* more than the request ever gave */
        http_stream_skip(g, i, (int)t, (size_t)b, final);
    }
    if (*p) goto bad;
    return STATUS_OK;
bad:
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "Last-Event-ID: \"%s;%s\" is not a position of this stream (an id its chunks carried)", g->id,
                         state);
}

enum status http_resume_claim(struct server *s, struct http_gen *g)
{
    g->live.key = g->id;
    if (resume_key_claim(s, &g->live) == RESUME_KEY_FREE) return STATUS_OK;
    return status_errorf(STATUS_ALREADY_EXISTS,
                         "Idempotency-Key %s: a request with this key is running (sent twice, on two connections); "
                         "its answer goes to the first connection", g->id);
}

void http_resume_release(struct http_gen *g) { resume_key_release(g->s, &g->live); }

/* g's view from the first event, as a client that attaches sees it (its SSE events formed again
 * when sse_per_event and attached); with g->mu held. */
static void rebuild_view(struct http_gen *g)
{
    for (int i = 0; i < g->n_samples; i++) {
        sample_buf_free(&g->samples[i]);
        memset(&g->samples[i], 0, sizeof g->samples[i]);
    }
    for (int i = 0; g->ps && i < g->n_samples; i++) tool_stream_free(g->ps[i].ts);
    free(g->ps);
    g->ps = NULL;
    for (int i = 0; i < g->n_runs; i++) g->runs[i].prompt_lp_ready = 0;
    g->out_len = g->out_pos = 0;
    g->done = g->usage_sent = g->observed = g->sse_events = g->eos_sent = 0;
    memset(&g->an, 0, sizeof g->an);
    if (g->q.responses) http_responses_reset_stream(g->q.responses);
    g->active = g->n_samples;
    g->end_status = STATUS_OK;
    g->end_message[0] = '\0';
    const double t_ended = g->t_ended;
    replay(g, &g->log);
    if (t_ended > 0) g->t_ended = t_ended; /* the retention counts from the real end, not a replay's */
}

void http_resume_store_final(struct http_gen *g)
{
    if (!g->q.responses) return;
    rebuild_view(g); /* a client that attached and went may have had part of it */
    free(http_responses_response(g));
}

enum status http_resume_attach(struct server *s, const char *key, int front, const char *owner, const char *state,
                               int fd, struct http_gen **out)
{
    *out = NULL;
    pthread_mutex_lock(&s->resumed_mu);
    struct swept w = sweep(s);
    struct http_gen *g = http_resume_find(s, key);
    if (g && strcmp(g->q.owner, owner)) g = NULL; /* another API key's: as if it did not exist */
    int other = 0, sent_to = front;
    if (g) {
        /* Claimed under the lists' lock, so that no sweep gives it up in between. */
        pthread_mutex_lock(&g->mu);
        other = g->attached, sent_to = g->front;
        if (!g->abandoned && !other && sent_to == front) g->attached = 1;
        pthread_mutex_unlock(&g->mu);
    }
    if (g && g->abandoned) g = NULL; /* given up on: it goes once its last event came */
    if (g) atomic_fetch_add(&g->refs, 1);
    const enum resume_key_state state_of = g ? RESUME_KEY_RESUMED_HTTP : resume_key_state(s, key);
    pthread_mutex_unlock(&s->resumed_mu);
    swept_finish(w);
    if (state_of == RESUME_KEY_LIVE) /* answered on its own connection only (it ends when that goes) */
        return status_errorf(STATUS_FAILED_PRECONDITION,
                             "request %s is running and answered on the connection that sent it: it can be "
                             "taken over only after a server restart", key);
    if (state_of == RESUME_KEY_RESUMED_GRPC)
        return status_errorf(STATUS_FAILED_PRECONDITION,
                             "request %s was a gRPC call: reattach with gRPC (metadata shardlm-resume-token)", key);
    if (!g) return status_errorf(STATUS_NOT_FOUND, "no journaled request %s", key);
    if (other || sent_to != front) { /* (not claimed) */
        http_gen_unref(g);
        if (other) return status_errorf(STATUS_FAILED_PRECONDITION, "request %s: another client is reading its answer", key);
        return status_errorf(STATUS_INVALID_ARGUMENT, "request %s was sent to %s: reattach to it there", key,
                             http_resume_endpoint(sent_to));
    }
    pthread_mutex_lock(&g->mu); /* attached (claimed above) before the replay: an Anthropic or
                                   Responses stream forms its events in it */
    rebuild_view(g);
    enum status st = state ? apply_state(g, state) : STATUS_OK;
    LOG_INFO(MODULE, "req=%s: a client reattached at %s: %d events, %d of %d samples running", key, state ? state : "the start",
             g->log.n_events, g->active, g->n_samples);
    if (st == STATUS_OK) g->fd = fd, g->t_detached = 0;
    else g->attached = 0;
    pthread_mutex_unlock(&g->mu);
    if (st != STATUS_OK) {
        http_gen_unref(g);
        return st;
    }
    *out = g;
    return STATUS_OK;
}

void http_resume_detach(struct http_gen *g, int delivered)
{
    struct server *s = g->s;
    if (!delivered) return; /* it stays for the next client */
    pthread_mutex_lock(&s->resumed_mu);
    int found = 0;
    for (struct http_gen **pp = &s->resumed; *pp; pp = &(*pp)->next_resumed)
        if (*pp == g) {
            *pp = g->next_resumed;
            found = 1;
            break;
        }
    pthread_mutex_lock(&g->mu);
    if (found) end_before_unlink(g); /* (still under s->resumed_mu: its key is not free yet) */
    g->delivered = 1;
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_unlock(&s->resumed_mu);
    if (found) http_gen_unref(g); /* the list's */
}

void http_resume_stop(struct server *s)
{
    pthread_mutex_lock(&s->resumed_mu);
    struct http_gen *g = s->resumed;
    s->resumed = NULL;
    pthread_mutex_unlock(&s->resumed_mu);
    for (struct http_gen *r = g; r; r = r->next_resumed) {
        pthread_mutex_lock(&r->mu);
        if (r->keep_log && r->eos_sent && !r->attached) r->delivered = 1; /* went out whole: kept for retries only */
        pthread_mutex_unlock(&r->mu);
    }
    unref_all(g); /* undelivered: no END, the next start offers them again */
}
