/* server/grpc_resume.c - the gRPC front's side of the stream journal (journal.h,
 * docs/reliability.md). With `serve --journal`, a Generate / GenerateStream / Chat / ChatStream
 * call is journaled as an HTTP request is: its ACCEPT (the protobuf request, its seed, its
 * deadline) on disk before the engine sees it, each engine event written before the client can
 * get it, END once the client has the answer (or cancelled). Every journaled call carries its
 * resume token, the request id, in its initial metadata (`shardlm-resume-token`) and in every
 * message (request_id).
 *
 * After a restart each open gRPC request becomes a job: rebuilt from its body, its unfinished
 * samples resubmitted with the tokens and RNG state the journal holds
 * (request_params.resume_*), running with no client. A client reattaches with a new call of the
 * same method carrying metadata `shardlm-resume-token: ID` and, when it already has part of a
 * stream, `shardlm-resume-from: S0,S1,...` (per sample: the number of token ids it got, with
 * "!" once it got the sample's last message); its request message is empty or the original.
 * It gets the rest exactly once. A request whose deadline passed while the server was down
 * ends with DEADLINE_EXCEEDED.
 *
 * Threads: jobs get engine events on the engine thread (job_on_event: journal, log, wake);
 * everything else runs on the completion-queue thread. A reattached call reads its job's log
 * from the loop (grpc_resume_pump), never from the engine thread, so no event is ever queued
 * for a call that may be gone.
 * Not here: the file (journal.c), the key registry and the start (resume.c), the HTTP side
 * (http_resume.c). Tests: tests/server/test_journal_grpc.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "journal.h"
#include "server_internal.h"

#define MODULE "journal"

/* One engine request of a job: the whole request (sample_base 0) or one resumed sample. */
struct grpc_sub {
    struct grpc_job *j;
    int              sample_base; /* its events' sample 0 is the job's sample sample_base */
    uint64_t         handle;
    int              submitted;
};

struct grpc_job {
    struct grpc_job     *next;      /* s->grpc_jobs, under s->resumed_mu */
    struct server       *s;
    atomic_int           refs;      /* the list's, the engine's (until the last FINISHED), an attached call's */
    pthread_mutex_t      mu;        /* guards what follows */
    struct journal_entry log;       /* the ACCEPT's fields and every event (journaled and new) */
    int                  n_samples, active; /* samples; those without their FINISHED yet */
    int                  attached, delivered, cancelled;
    int                  first_run;     /* a first run (--journal-detach-grace), not a restart's */
    int                  abandoned;     /* first run, its client not back within the grace: no call
                                           may reattach; listed (its key taken) until its END is queued */
    struct grpc_job     *next_cancel;   /* the sweep's list of those to cancel */
    int                  end_journaled; /* first run: its END went to the journal (delivered whole) */
    double               t_ended;   /* base_now_s when active reached 0; 0 before */
    double               t_detached; /* first run: when its last call went; 0 while one reads it */
    struct grpc_sub     *subs;      /* (n_subs) */
    int                  n_subs;
    struct served_model *m;         /* the model its samples run on (a journal's models never unload) */
};

static const enum method FRONT_METHODS[] = {
    [JOURNAL_GRPC_GENERATE] = METHOD_GENERATE, [JOURNAL_GRPC_GENERATE_STREAM] = METHOD_GENERATE_STREAM,
    [JOURNAL_GRPC_CHAT] = METHOD_CHAT, [JOURNAL_GRPC_CHAT_STREAM] = METHOD_CHAT_STREAM};

static enum method method_of(int front)
{
    return front >= JOURNAL_GRPC_GENERATE && front <= JOURNAL_GRPC_CHAT_STREAM ? FRONT_METHODS[front] : METHOD_UNKNOWN;
}

static int front_of(enum method m)
{
    for (int f = JOURNAL_GRPC_GENERATE; f <= JOURNAL_GRPC_CHAT_STREAM; f++)
        if (FRONT_METHODS[f] == m) return f;
    return 0;
}

static double unix_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- first runs -------------------------------------------------------------------------- */

/* c's ACCEPT fields (its body borrowed from data): what the journal writes, and a first run's
 * job keeps (grpc_resume_first_run, with its own copy of the body). */
static struct journal_entry accept_entry(const struct call *c, const uint8_t *data, size_t len,
                                         const struct request_params *p, double deadline)
{
    struct journal_entry e = {.front = front_of(c->method), .created = (long long)time(NULL), .deadline = deadline,
                              .seed = p->sampling.seed, .body = (char *)data, .body_len = len};
    snprintf(e.key, sizeof e.key, "%s", c->request_id);
    snprintf(e.owner, sizeof e.owner, "%s", c->owner);
    return e;
}

enum status grpc_journal_accept(struct call *c, const uint8_t *data, size_t len, struct request_params *p,
                                double deadline, long long *end)
{
    struct server *s = c->s;
    if (strlen(c->request_id) > JOURNAL_KEY_MAX)
        return status_errorf(STATUS_INVALID_ARGUMENT, "request_id: at most %d bytes on a server with a stream journal",
                             JOURNAL_KEY_MAX);
    resume_sweep(s); /* no thread of its own: each journaled call forgets what waited too long */
    c->live.key = c->request_id;
    enum resume_key_state who = resume_key_claim(s, &c->live);
    if (who != RESUME_KEY_FREE)
        return status_errorf(STATUS_ALREADY_EXISTS, "request_id '%s' is taken by a journaled request that %s",
                             c->request_id, who == RESUME_KEY_LIVE ? "is running" : "waits for its client to reattach");
    if (!p->has_seed) { /* fixed now, so that a sample resumed before its first event starts where it would have */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        p->sampling.seed = ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)c;
        p->has_seed = 1;
    }
    struct journal_entry e = accept_entry(c, data, len, p, deadline);
    if (journal_accept_write(s->journal, &e, end) != STATUS_OK)
        return status_errorf(STATUS_UNAVAILABLE, "the stream journal cannot take the request (%s)", status_message());
    c->journaled = 1; /* its END comes with the call's end, whatever happens now */
    return STATUS_OK;
}

void grpc_journal_event(struct call *c, const struct engine_event *ev)
{
    if (!server_cut_event(c->s, ev->kind, ev->finish, ev->status, c->cancelled_by_rpc))
        journal_event(c->s->journal, c->request_id, 0, ev);
}

/* ---- jobs: resumed requests ------------------------------------------------------------------ */

static void job_unref(struct grpc_job *j)
{
    if (atomic_fetch_sub(&j->refs, 1) != 1) return;
    if (j->delivered && !j->end_journaled) journal_end(j->s->journal, j->log.key); /* its client has it: forgotten */
    journal_entry_free(&j->log);
    free(j->subs);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* One event of the job (sample numbers the job's): journaled, logged; with j->mu held.
 * Returns 1 when it was the last sample's FINISHED. */
static int job_take(struct grpc_job *j, const struct engine_event *ev)
{
    journal_event(j->s->journal, j->log.key, 0, ev);
    if (journal_entry_add(&j->log, 0, ev) != STATUS_OK)
        LOG_WARN(MODULE, "req=%s: out of memory keeping its events: a reattaching client may miss some", j->log.key);
    if (ev->kind != ENGINE_EVENT_FINISHED) return 0;
    if (--j->active > 0) return 0;
    j->t_ended = base_now_s();
    return 1;
}

/* Ends sample `sample` without the engine (a deadline passed, a resubmission failed); with
 * j->mu held. Returns 1 when it was the last. */
static int job_finish(struct grpc_job *j, int sample, enum finish_reason finish, enum status st, const char *message)
{
    struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .request_id = j->log.key, .sample = sample, .text = "",
                              .finish = finish, .status = st, .message = message, .queue_seconds = -1.0};
    return job_take(j, &ev);
}

/* Engine thread. */
static void job_on_event(void *ctx, const struct engine_event *ev)
{
    struct grpc_sub *sub = ctx;
    struct grpc_job *j = sub->j;
    struct engine_event mapped = *ev;
    mapped.sample += sub->sample_base;
    pthread_mutex_lock(&j->mu);
    const int cut = server_cut_event(j->s, ev->kind, ev->finish, ev->status, j->cancelled);
    int last = cut ? --j->active == 0 : job_take(j, &mapped);
    pthread_mutex_unlock(&j->mu);
    server_wake(j->s); /* a reattached call takes it from the loop */
    if (last) job_unref(j);
}

/* Submits what j still has to generate (r: its rebuilt request); with j->mu held. A request
 * with no event at all goes as it was first submitted; every other unfinished sample on its own
 * from its journaled tokens and RNG state. Returns 1 when nothing is left for the engine. */
static int job_submit(struct grpc_job *j, struct served_model *m, const int32_t *ids, int n_ids,
                      const struct request_params *p, int expired)
{
    int last = 0;
    j->subs = calloc((size_t)j->n_samples, sizeof *j->subs);
    for (int i = 0; i < j->n_samples && !last; i++) {
        if (journal_entry_finished(&j->log, 0, i)) continue;
        if (expired) {
            last = job_finish(j, i, FINISH_REASON_DEADLINE, STATUS_DEADLINE_EXCEEDED,
                              "the request's deadline passed while the server was down");
            continue;
        }
        enum status st = j->subs ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        int32_t *tokens = NULL;
        uint64_t rng[4];
        struct request_params rp = *p;
        char rid[JOURNAL_KEY_MAX + 32];
        const int whole = j->log.n_events == 0;
        if (st == STATUS_OK && !whole) st = journal_entry_resume(&j->log, 0, i, p, &rp, &tokens, rng);
        if (st == STATUS_OK) {
            struct grpc_sub *sub = &j->subs[j->n_subs++];
            *sub = (struct grpc_sub){.j = j, .sample_base = whole ? 0 : i};
            snprintf(rid, sizeof rid, whole ? "%s" : "%s-s%d", j->log.key, i);
            pthread_mutex_unlock(&j->mu); /* its events take j->mu */
            st = engine_submit(m->engine, rid, ids, n_ids, &rp, job_on_event, sub, &sub->handle);
            pthread_mutex_lock(&j->mu);
            sub->submitted = st == STATUS_OK;
        }
        free(tokens);
        if (st != STATUS_OK) {
            LOG_ERROR(MODULE, "req=%s: sample %d cannot be resumed: %s", j->log.key, i, status_message());
            for (int k = i; k < (whole ? j->n_samples : i + 1) && !last; k++)
                last = job_finish(j, k, FINISH_REASON_ERROR, st, status_message());
        }
        if (whole) break; /* one engine request for every sample */
    }
    return last;
}

int grpc_resume_entry(struct server *s, struct journal_entry *e)
{
    const enum method method = method_of(e->front);
    const int is_chat = method == METHOD_CHAT || method == METHOD_CHAT_STREAM;
    struct gen_request r;
    struct served_model *m = NULL;
    struct chat_parse chat = {0};
    int32_t *ids = NULL;
    int n_ids = 0;
    enum status st = gen_build(s, (const uint8_t *)e->body, e->body_len, is_chat, e->owner, &r, &m, &chat, &ids, &n_ids);
    chat_parse_free(&chat); /* a reattaching call builds its own */
    const double now = unix_now();
    if (st == STATUS_OK) {
        r.params.sampling.seed = e->seed;
        r.params.has_seed = 1;
        if (e->deadline > now) r.params.deadline = base_now_s() + (e->deadline - now); /* (passed: job_submit) */
        st = gen_resolve_adapter(m, &r);
        if (st == STATUS_OK) st = engine_validate(m->engine, ids, n_ids, &r.params);
        if (st != STATUS_OK) gen_request_free(&r);
    }
    if (st != STATUS_OK) {
        /* The model or its adapters changed since: the request cannot go on. */
        LOG_ERROR(MODULE, "req=%s cannot be resumed (%s): forgotten", e->key, status_message());
        journal_end(s->journal, e->key);
        free(ids);
        return 0;
    }
    struct grpc_job *j = calloc(1, sizeof *j);
    CHECK(j, "out of memory");
    j->s = s;
    atomic_init(&j->refs, 1); /* the list's */
    pthread_mutex_init(&j->mu, NULL);
    j->log = *e;
    j->m = m;
    memset(e, 0, sizeof *e);
    j->n_samples = r.params.n;
    for (int i = 0; i < j->n_samples; i++) j->active += !journal_entry_finished(&j->log, 0, i);
    const int expired = j->log.deadline > 0 && now >= j->log.deadline;
    pthread_mutex_lock(&j->mu);
    if (j->active == 0) j->t_ended = base_now_s();
    else {
        atomic_fetch_add(&j->refs, 1); /* the engine's, until the last FINISHED */
        if (job_submit(j, m, ids, n_ids, &r.params, expired)) atomic_fetch_sub(&j->refs, 1);
    }
    LOG_INFO(MODULE, "req=%s (gRPC %s): resumed, %d of %d samples running%s", j->log.key, call_method_name(method),
             j->active, j->n_samples, expired ? " (its deadline passed while the server was down)" : "");
    pthread_mutex_unlock(&j->mu);
    free(ids);
    gen_request_free(&r);
    pthread_mutex_lock(&s->resumed_mu);
    j->next = s->grpc_jobs;
    s->grpc_jobs = j;
    pthread_mutex_unlock(&s->resumed_mu);
    return 1;
}

enum status grpc_resume_first_run(struct call *c, const uint8_t *data, size_t len, const int32_t *ids, int n_ids,
                                  const struct request_params *p, double deadline)
{
    struct server *s = c->s;
    struct grpc_job *j = calloc(1, sizeof *j);
    char *body = malloc(len + 1);
    if (!j || !body) {
        free(j);
        free(body);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (len) memcpy(body, data, len);
    body[len] = 0;
    j->subs = calloc(1, sizeof *j->subs);
    if (!j->subs) {
        free(j);
        free(body);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    j->s = s;
    atomic_init(&j->refs, 3); /* the list's, the call's, the engine's (until the last FINISHED) */
    pthread_mutex_init(&j->mu, NULL);
    j->log = accept_entry(c, data, len, p, deadline);
    j->log.body = body;
    j->m = c->m;
    j->n_samples = j->active = p->n;
    j->first_run = 1;
    j->attached = 1;
    /* One engine request for every sample, as a first run's. Refused (a full queue, a drain that
     * began meanwhile), it fails the call as before: the job goes, nothing was journaled but the
     * ACCEPT, which the caller's call ends (c->journaled). */
    struct grpc_sub *sub = &j->subs[0];
    *sub = (struct grpc_sub){.j = j, .sample_base = 0};
    enum status st = engine_submit(c->m->engine, c->request_id, ids, n_ids, p, job_on_event, sub, &sub->handle);
    if (st != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        pthread_mutex_destroy(&j->mu);
        journal_entry_free(&j->log);
        free(j->subs);
        free(j);
        return status_errorf(st, "%s", msg);
    }
    sub->submitted = 1;
    j->n_subs = 1;
    c->job = j;
    c->journaled = 0; /* from here the job journals its events and, once its answer is done with, its END */
    pthread_mutex_lock(&s->resumed_mu); /* listed only now: job_cancel reads subs unlocked */
    resume_key_unlink(s, &c->live);     /* the key is never free in between */
    j->next = s->grpc_jobs;
    s->grpc_jobs = j;
    pthread_mutex_unlock(&s->resumed_mu);
    return STATUS_OK;
}

int grpc_resume_detached(struct server *s, const char *owner)
{
    int n = 0;
    for (struct grpc_job *j = s->grpc_jobs; j; j = j->next) {
        pthread_mutex_lock(&j->mu);
        n += j->first_run && !j->attached && !j->abandoned && j->active > 0 && (!owner || !strcmp(j->log.owner, owner));
        pthread_mutex_unlock(&j->mu);
    }
    return n;
}

struct grpc_job *grpc_resume_find(struct server *s, const char *key)
{
    struct grpc_job *j = s->grpc_jobs;
    while (j && strcmp(j->log.key, key)) j = j->next;
    return j;
}

/* j leaves s->grpc_jobs, delivered or as good as (s->resumed_mu and j->mu held): its END is
 * queued first, so that its key is never free while an event or the END of it could still follow
 * a new request's ACCEPT under the same key (a journal with two open ACCEPTs of one key does not
 * load). */
static void end_before_unlink(struct grpc_job *j)
{
    j->delivered = 1;
    if (!j->end_journaled) {
        journal_end(j->s->journal, j->log.key);
        j->end_journaled = 1;
    }
}

/* Takes j (delivered) out of s->grpc_jobs (when in) and drops the list's reference. */
static void job_forget(struct server *s, struct grpc_job *j)
{
    int found = 0;
    pthread_mutex_lock(&s->resumed_mu);
    for (struct grpc_job **pp = &s->grpc_jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            found = 1;
            break;
        }
    pthread_mutex_lock(&j->mu);
    if (found) end_before_unlink(j);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_unlock(&s->resumed_mu);
    if (found) job_unref(j);
}

static int job_cancel(struct grpc_job *j);

/* Forgets the resumed requests whose answer waited past the retention, and the first runs whose
 * client did not come back within --journal-detach-grace: one still running is cancelled and
 * stays listed, abandoned (no call may reattach, its key stays taken), until its last event. */
void grpc_resume_sweep(struct server *s)
{
    const double retain = s->opts.journal_retain_s > 0 ? s->opts.journal_retain_s : 600.0;
    const double grace = s->opts.journal_detach_grace_s;
    const double now = base_now_s();
    const int draining = atomic_load(&s->phase) >= PHASE_DRAINING;
    struct grpc_job *gone = NULL, *cancel = NULL;
    pthread_mutex_lock(&s->resumed_mu);
    for (struct grpc_job **pp = &s->grpc_jobs; *pp;) {
        struct grpc_job *j = *pp;
        pthread_mutex_lock(&j->mu);
        const int expired = j->active == 0 && !j->attached && j->t_ended > 0 && now - j->t_ended > retain;
        /* (Not while the server drains: a first run the drain cut stays open for the restart.) */
        const int abandoned = j->first_run && !j->attached && !draining &&
                              (j->abandoned || (j->t_detached > 0 && now - j->t_detached > grace));
        const int cancel_it = abandoned && j->active > 0 && !j->abandoned;
        const int leave = (expired || abandoned) && j->active == 0;
        if (abandoned && !j->abandoned)
            LOG_INFO(MODULE, "req=%s: its client did not come back within %.0f s (--journal-detach-grace): %s",
                     j->log.key, grace, cancel_it ? "cancelled" : "forgotten");
        else if (expired) LOG_INFO(MODULE, "req=%s: nobody came for its answer within %.0f s: forgotten", j->log.key, retain);
        j->abandoned |= abandoned;
        if (leave) end_before_unlink(j);
        pthread_mutex_unlock(&j->mu);
        if (cancel_it) {
            atomic_fetch_add(&j->refs, 1);
            j->next_cancel = cancel;
            cancel = j;
        }
        if (!leave) {
            pp = &j->next;
            continue;
        }
        *pp = j->next;
        j->next = gone;
        gone = j;
    }
    pthread_mutex_unlock(&s->resumed_mu);
    for (struct grpc_job *next; cancel; cancel = next) { /* never under resumed_mu */
        next = cancel->next_cancel;
        job_cancel(cancel);
        job_unref(cancel);
    }
    for (struct grpc_job *next; gone; gone = next) {
        next = gone->next;
        job_unref(gone);
    }
}

void grpc_resume_stop(struct server *s)
{
    pthread_mutex_lock(&s->resumed_mu);
    struct grpc_job *j = s->grpc_jobs;
    s->grpc_jobs = NULL;
    pthread_mutex_unlock(&s->resumed_mu);
    for (struct grpc_job *next; j; j = next) { /* undelivered: no END, the next start offers them again */
        next = j->next;
        job_unref(j);
    }
}

/* ---- clients that come back ------------------------------------------------------------------ */

/* What the client already has (shardlm-resume-from, NULL: nothing): per sample, token ids and
 * whether its last message came. */
struct resume_from {
    long *tokens;  /* (n_samples) still to skip, counted down */
    int  *final;   /* (n_samples) */
};

static enum status parse_from(const char *s, int n_samples, struct resume_from *f)
{
    const char *p = s;
    for (int i = 0; i < n_samples; i++) {
        if (i && *p++ != ',') goto bad;
        char *end;
        long t = strtol(p, &end, 10);
        if (end == p || t < 0) goto bad;
        p = end;
        f->final[i] = *p == '!';
        if (f->final[i]) p++;
        f->tokens[i] = t;
    }
    if (*p) goto bad;
    return STATUS_OK;
bad:
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "shardlm-resume-from: \"%s\" is not %d comma-separated counts of token ids (each with \"!\" "
                         "once its sample's last message came)", s, n_samples);
}

/* Takes j's new events into c (loop thread). With f (the reattach's first take), the events
 * the client has are dropped: whole events only, as messages carry them. */
static enum status take_events(struct call *c, struct resume_from *f)
{
    struct grpc_job *j = c->job;
    enum status st = STATUS_OK;
    pthread_mutex_lock(&j->mu);
    for (; c->job_next < j->log.n_events && st == STATUS_OK; c->job_next++) {
        struct engine_event ev;
        journal_event_view(&j->log.events[c->job_next], &ev);
        ev.request_id = j->log.key;
        if (f && ev.kind == ENGINE_EVENT_PROMPT_LOGPROBS) continue; /* it went with the first message */
        if (f && ev.sample >= 0 && ev.sample < c->n_samples && !f->final[ev.sample] && f->tokens[ev.sample] > 0) {
            long *left = &f->tokens[ev.sample];
            if (ev.kind == ENGINE_EVENT_FINISHED || ev.n_tokens > *left) {
                st = status_errorf(STATUS_INVALID_ARGUMENT,
                                   "shardlm-resume-from: sample %d's count is not a position of its stream (the sum "
                                   "of the token ids of its messages before its last)", ev.sample);
                break;
            }
            *left -= ev.n_tokens;
            if (c->chat_streams && ev.text_len) { /* the reply's parse must see what the client saw */
                struct chat_reply skip = {0};
                st = chat_stream_delta(&c->chat, &c->chat_streams[ev.sample], c->request_id, ev.sample, ev.text,
                                       ev.text_len, 0, &skip);
                chat_reply_free(&skip);
            }
            continue;
        }
        gen_take_engine_event(c, &ev);
    }
    pthread_mutex_unlock(&j->mu);
    if (st != STATUS_OK || !f) return st;
    for (int i = 0; i < c->n_samples; i++) {
        struct sample_buf *b = &c->samples[i];
        if (!f->final[i] && f->tokens[i] > 0)
            return status_errorf(STATUS_INVALID_ARGUMENT, "shardlm-resume-from: sample %d has %ld token id(s) more "
                                 "than it generated so far", i, f->tokens[i]);
        if (!f->final[i]) continue;
        if (!b->finished || b->n != f->tokens[i])
            return status_errorf(STATUS_INVALID_ARGUMENT, "shardlm-resume-from: sample %d did not end after %ld token "
                                 "id(s) (\"!\")", i, f->tokens[i]);
        b->final_sent = 1; /* its last message went out before the restart */
        b->n = 0;
        b->text_len = 0;
    }
    return STATUS_OK;
}

void grpc_resume_attach(struct call *c, const uint8_t *data, size_t len)
{
    struct server *s = c->s;
    const char *key = c->resume_token;
    if (!s->journal) {
        call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "metadata shardlm-resume-token is honoured only by a server with a "
                                                   "stream journal (serve --journal DIR)");
        return;
    }
    if (!*key || strlen(key) > JOURNAL_KEY_MAX) {
        call_fail(c, GRPC_STATUS_INVALID_ARGUMENT, "metadata shardlm-resume-token: a request id of 1 to 100 bytes");
        return;
    }
    resume_sweep(s);
    pthread_mutex_lock(&s->resumed_mu);
    struct grpc_job *j = grpc_resume_find(s, key);
    if (j && strcmp(j->log.owner, c->owner)) j = NULL; /* another API key's: as if it did not exist */
    if (j && j->abandoned) j = NULL;                   /* given up on: it goes once its last event came */
    int busy = 0;
    const int fits = j && method_of(j->log.front) == c->method &&
                     (!len || (len == j->log.body_len && !memcmp(data, j->log.body, len)));
    if (j && fits) {
        /* Claimed under the lists' lock, so that no sweep gives it up in between. */
        pthread_mutex_lock(&j->mu);
        busy = j->attached;
        if (!busy) j->attached = 1, j->t_detached = 0;
        pthread_mutex_unlock(&j->mu);
    }
    if (j) atomic_fetch_add(&j->refs, 1);
    const enum resume_key_state who = j ? RESUME_KEY_RESUMED_GRPC : resume_key_state(s, key);
    pthread_mutex_unlock(&s->resumed_mu);
    enum status st = STATUS_OK;
    if (who == RESUME_KEY_LIVE) /* a first run is answered on its own call only (it ends when that goes) */
        st = status_errorf(STATUS_FAILED_PRECONDITION, "request %s is running and answered on the call that sent it: "
                           "it can be taken over only after a server restart", key);
    else if (who == RESUME_KEY_RESUMED_HTTP)
        st = status_errorf(STATUS_FAILED_PRECONDITION, "request %s was an HTTP request: reattach over HTTP "
                           "(Last-Event-ID or Idempotency-Key)", key);
    else if (!j)
        st = status_errorf(STATUS_NOT_FOUND, "no journaled request %s (its answer was delivered, or it was never "
                           "journaled)", key);
    else if (method_of(j->log.front) != c->method)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "request %s was a %s call: reattach with %s", key,
                           call_method_name(method_of(j->log.front)), call_method_name(method_of(j->log.front)));
    else if (len && (len != j->log.body_len || memcmp(data, j->log.body, len)))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "a reattaching call's request must be empty or the original "
                           "request of %s", key);
    if (st == STATUS_OK && busy) {
        pthread_mutex_lock(&j->mu);
        const int running = j->active > 0;
        pthread_mutex_unlock(&j->mu);
        st = status_errorf(STATUS_FAILED_PRECONDITION, "request %s: another client is reading its answer (%s); "
                           "reattach once that call has ended", key, running ? "it is running" : "it ended");
    }
    if (st != STATUS_OK) {
        if (j) job_unref(j);
        /* ABORTED for a reader still attached: a conflict of the moment (often the client's own
         * earlier call, whose dropped connection the server has not seen yet), worth retrying. */
        if (busy) call_fail(c, GRPC_STATUS_ABORTED, status_message());
        else call_fail_status(c, st, status_message());
        return;
    }
    /* The call's own view of the request, as its first run built it. */
    const int is_chat = c->method == METHOD_CHAT || c->method == METHOD_CHAT_STREAM;
    struct gen_request r;
    int32_t *ids = NULL;
    struct served_model *m = NULL;
    st = gen_build(s, (const uint8_t *)j->log.body, j->log.body_len, is_chat, c->owner, &r, &m, &c->chat, &ids,
                   &c->n_prompt_tokens);
    free(ids);
    /* The call pins its model as a first run's does (call_free gives the pin back). */
    if (st == STATUS_OK && !(c->m = server_pin_if_loaded(s, m))) {
        gen_request_free(&r);
        st = status_errorf(STATUS_UNAVAILABLE, "model %s is not loaded", m->model_id);
    }
    c->job = j; /* from here grpc_resume_detach gives it back */
    c->request_id = strdup(key);
    CHECK(c->request_id, "out of memory");
    if (st != STATUS_OK) {
        call_fail_status(c, st, status_message());
        return;
    }
    c->n_samples = j->n_samples;
    gen_request_free(&r);
    c->samples = calloc((size_t)c->n_samples, sizeof *c->samples);
    if (c->chat.on && is_streaming(c->method)) c->chat_streams = calloc((size_t)c->n_samples, sizeof *c->chat_streams);
    CHECK(c->samples && (!c->chat.on || !is_streaming(c->method) || c->chat_streams), "out of memory");
    c->engine_active = c->n_samples; /* FINISHED events from the log count it down */
    c->submitted = 1;
    struct resume_from f = {calloc((size_t)c->n_samples, sizeof *f.tokens),
                            calloc((size_t)c->n_samples, sizeof *f.final)};
    CHECK(f.tokens && f.final, "out of memory");
    c->replaying = 1;
    st = !c->resume_from ? STATUS_OK
         : is_streaming(c->method)
             ? parse_from(c->resume_from, c->n_samples, &f)
             : status_errorf(STATUS_INVALID_ARGUMENT,
                             "shardlm-resume-from is for streams: a unary call gets the whole answer");
    if (st == STATUS_OK) st = take_events(c, c->resume_from ? &f : NULL);
    c->replaying = 0;
    free(f.tokens);
    free(f.final);
    if (st != STATUS_OK) {
        call_fail_status(c, st, status_message());
        return;
    }
    LOG_INFO(MODULE, "req=%s: a gRPC client reattached at %s: %d events, %d of %d samples to come", key,
             c->resume_from ? c->resume_from : "the start", c->job_next, c->engine_active, c->n_samples);
    call_send(c, NULL, 0, 0, GRPC_STATUS_OK, NULL); /* headers with the token; gen_pump once they are out */
}

void grpc_resume_pump(struct server *s)
{
    const int drained = atomic_load(&s->phase) >= PHASE_DRAINED;
    for (struct call *c = s->calls; c; c = c->next) {
        if (!c->job || c->close_done || c->status_sent || c->send_has_status) continue;
        if (take_events(c, NULL) != STATUS_OK) continue; /* (without f it cannot fail) */
        if (drained && c->engine_active > 0 && !c->send_inflight)
            call_fail(c, GRPC_STATUS_UNAVAILABLE, "the server shut down before the request finished: reattach with "
                      "shardlm-resume-token after its restart");
        else gen_pump(c);
    }
}

void grpc_resume_detach(struct call *c)
{
    struct grpc_job *j = c->job;
    if (!j) return;
    c->job = NULL;
    c->engine_active = 0; /* its samples are the job's: nothing of the engine refers to the call */
    /* The whole answer, or the request's error, reached the client (gen_pump's last send). */
    const int delivered = c->job_delivered && c->status_sent && !c->client_cancelled;
    /* A first run stays for --journal-detach-grace after its call went, answered whole or not (a
     * server cannot tell what a dropped connection lost); answered whole, a restart does not
     * bring it back (its END, after --journal-end-delay). With --journal-detach-max kept
     * already it goes as with no grace (abandoned: cancelled, forgotten once ended). A
     * restart's job is forgotten once delivered. */
    struct server *s = c->s;
    const int grace = j->first_run && s->opts.journal_detach_grace_s > 0;
    int full = 0;
    char limit[80] = "";
    if (grace && !delivered) {
        pthread_mutex_lock(&s->resumed_mu);
        pthread_mutex_lock(&j->mu);
        const int running = j->active > 0;
        pthread_mutex_unlock(&j->mu);
        full = running && resume_detach_full(s, j->log.owner, limit, sizeof limit) != NULL;
        pthread_mutex_unlock(&s->resumed_mu);
    }
    const int keep = grace && !full;
    pthread_mutex_lock(&j->mu);
    j->attached = 0;
    if (keep) j->t_detached = base_now_s();
    const int running = j->active > 0;
    if (delivered && keep && !j->end_journaled) {
        journal_end(s->journal, j->log.key);
        j->end_journaled = 1;
    }
    if (grace && !keep && !delivered) j->abandoned = 1;
    if (delivered && !keep) j->delivered = 1;
    pthread_mutex_unlock(&j->mu);
    if (delivered && !keep) job_forget(s, j);
    else if (grace && !keep) {
        LOG_WARN(MODULE, "req=%s: its client went away with %s requests running for theirs: %s", j->log.key,
                 *limit ? limit : "--journal-detach-max", running ? "cancelled" : "forgotten");
        if (running) job_cancel(j);
    } else if (keep && !delivered)
        LOG_INFO(MODULE, "req=%s: its client went away; %s for %.0f s for the client to reattach", j->log.key,
                 running ? "it runs on" : "its answer waits", s->opts.journal_detach_grace_s);
    job_unref(j); /* the call's */
}

/* Cancels j's engine requests; 0 when nothing of it was running any more. */
static int job_cancel(struct grpc_job *j)
{
    pthread_mutex_lock(&j->mu);
    const int running = j->active > 0;
    j->cancelled = 1;
    pthread_mutex_unlock(&j->mu);
    /* Subs are written only before the job is listed: reading them here is safe. */
    for (int i = 0; i < j->n_subs && running; i++)
        if (j->subs[i].submitted) engine_cancel(j->m->engine, j->subs[i].handle);
    return running;
}

void grpc_resume_cancel(struct call *c) { (void)job_cancel(c->job); }

enum status grpc_resume_cancel_key(struct server *s, const char *key, const char *owner, int *cancelled)
{
    *cancelled = 0;
    pthread_mutex_lock(&s->resumed_mu);
    struct grpc_job *j = s->journal ? grpc_resume_find(s, key) : NULL;
    if (j && strcmp(j->log.owner, owner)) j = NULL; /* another API key's */
    if (j) atomic_fetch_add(&j->refs, 1);
    pthread_mutex_unlock(&s->resumed_mu);
    if (!j) return status_errorf(STATUS_NOT_FOUND, "no running request has id '%s'", key);
    *cancelled = job_cancel(j);
    LOG_INFO(MODULE, "req=%s (resumed, no client attached) %s by Cancel", key,
             *cancelled ? "cancelled" : "had already finished: nothing cancelled");
    job_unref(j);
    return STATUS_OK;
}
