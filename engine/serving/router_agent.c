/* engine/serving/router_agent.c - a replica leader's agent (the first rank of replica d > 0):
 * submits what rank 0 routes to this replica's conductor, posts its events back, reports
 * stats every STATS_PERIOD_S (the heartbeat), drains and reports failures (see router.h).
 * Not here: routing and rank 0's side (router.c), the message codec (router_msg.h).
 * Tests: tests/test_engine.c (--dp), tests/test_serve_mpi.sh (a hung replica leader).
 * Threads: the agent loop (router_leader_run) and the conductor's engine thread (events,
 * through the outbox under mu); a drain runs on a thread of its own. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "router_impl.h"

/* ---- leaders: the agent ------------------------------------------------------------------------ */

static void outbox_push(struct router *r, struct wbuf *b)
{
    struct outmsg *m = b->oom ? NULL : malloc(sizeof *m);
    if (!m) {
        free(b->p);
        router_on_local_fatal(r, STATUS_RESOURCE_EXHAUSTED, "router: out of host memory for an event");
        return;
    }
    m->buf = b->p;
    m->n = b->n;
    m->next = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->out_tail) r->out_tail->next = m;
    else r->out_head = m;
    r->out_tail = m;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* The leader's engine thread: an event of one of rank 0's requests, posted back. */
static void on_remote_event(void *ctx, const struct engine_event *ev)
{
    struct remote_req *q = ctx;
    struct router *r = q->r;
    size_t nt = ev->n_tokens > 0 ? (size_t)ev->n_tokens : 0;
    struct event_head h = {.type = MSG_EVENT, .kind = (uint32_t)ev->kind, .handle = q->outer, .seed = ev->seed,
                           .text_len = ev->text_len, .sample = ev->sample, .n_tokens = (int32_t)nt,
                           .has_logprobs = ev->logprobs != NULL, .n_top = ev->top ? ev->n_top : 0,
                           .finish = (int32_t)ev->finish, .status = (int32_t)ev->status,
                           .prompt_tokens = ev->prompt_tokens, .completion_tokens = ev->completion_tokens,
                           .cached_prompt_tokens = ev->cached_prompt_tokens,
                           .queue_seconds = ev->queue_seconds, .has_rng = ev->rng != NULL};
    if (ev->rng) memcpy(h.rng, ev->rng, sizeof h.rng);
    struct wbuf b = {0};
    put(&b, &h, sizeof h);
    put(&b, ev->tokens, nt * sizeof(int32_t));
    put(&b, ev->text, ev->text_len);
    if (h.has_logprobs) put(&b, ev->logprobs, nt * sizeof(float));
    if (h.n_top) put(&b, ev->top, nt * (size_t)h.n_top * sizeof(struct top_logprob));
    put_str(&b, ev->message);
    outbox_push(r, &b);
    if (ev->kind == ENGINE_EVENT_FINISHED) {
        pthread_mutex_lock(&r->mu);
        if (--q->live == 0) r->n_done_reqs++; /* the agent frees it */
        pthread_mutex_unlock(&r->mu);
    }
}

static void leader_reject(struct router *r, uint64_t handle, enum status st, const char *message)
{
    struct wbuf b = {0};
    struct status_head h = {.type = MSG_REJECT, .status = (int32_t)st, .handle = handle};
    double unused = 0;
    put(&b, &h, sizeof h);
    put(&b, &unused, sizeof unused);
    put_str(&b, message);
    outbox_push(r, &b);
}

static void leader_submit(struct router *r, struct rbuf *rb)
{
    struct submit_head h;
    if (!get_copy(rb, &h, sizeof h) || h.n_prompt < 1 || h.p.n_stop < 0 || h.p.n_stop > 1024 ||
        h.p.n_stop_token_ids < 0 || h.p.n_logit_bias < 0 || h.p.constraint_len > REQUEST_MAX_CONSTRAINT_BYTES ||
        h.p.n_resume < 0 || h.p.n_resume > (1 << 24)) {
        router_on_local_fatal(r, STATUS_INTERNAL, "router: a malformed SUBMIT from rank 0");
        return;
    }
    struct request_params p = h.p;
    const char *id = get_str(rb);
    const int32_t *prompt = get(rb, (size_t)h.n_prompt * sizeof(int32_t));
    p.stop_token_ids = get(rb, (size_t)p.n_stop_token_ids * sizeof(int32_t));
    const char *stops[1024];
    for (int i = 0; i < p.n_stop; i++) stops[i] = get_str(rb);
    p.stop = stops;
    p.logit_bias_ids = get(rb, (size_t)p.n_logit_bias * sizeof(int32_t));
    p.logit_bias_values = get(rb, (size_t)p.n_logit_bias * sizeof(float));
    p.adapter = get_str(rb);
    p.client = get_str(rb);
    p.owner = get_str(rb);
    p.cache_salt = get_str(rb);
    p.constraint = get(rb, p.constraint_len);
    const uint64_t *rng = get(rb, 4 * sizeof(uint64_t));
    p.resume_rng = h.p.resume_rng ? rng : NULL;
    const int32_t *resume = get(rb, (size_t)p.n_resume * sizeof(int32_t));
    p.resume_tokens = p.n_resume ? resume : NULL;
    p.deadline = h.deadline_in >= 0 ? base_now_s() + h.deadline_in : 0;
    if (rb->bad) {
        router_on_local_fatal(r, STATUS_INTERNAL, "router: a truncated SUBMIT from rank 0");
        return;
    }
    struct remote_req *q = calloc(1, sizeof *q);
    if (!q) {
        leader_reject(r, h.handle, STATUS_RESOURCE_EXHAUSTED, "replica: out of host memory");
        return;
    }
    q->r = r;
    q->outer = h.handle;
    q->live = p.n;
    pthread_mutex_lock(&r->mu);
    q->next = r->reqs;
    r->reqs = q;
    pthread_mutex_unlock(&r->mu);
    uint64_t inner = 0;
    enum status st = conductor_submit(r->local, id, prompt, h.n_prompt, &p, on_remote_event, q, &inner);
    pthread_mutex_lock(&r->mu);
    if (st == STATUS_OK) q->inner = inner;
    else q->live = 0;
    pthread_mutex_unlock(&r->mu);
    if (st != STATUS_OK) leader_reject(r, h.handle, st, status_message());
}

/* Agent, under mu: frees the requests whose samples have all finished. */
static void leader_prune(struct router *r)
{
    for (struct remote_req **p = &r->reqs; *p;) {
        struct remote_req *q = *p;
        if (q->live <= 0) {
            *p = q->next;
            free(q);
        } else {
            p = &q->next;
        }
    }
    r->n_done_reqs = 0;
}

/* Agent: this replica's handle of rank 0's request `outer` (*found 0: finished or unknown). */
static uint64_t leader_inner(struct router *r, uint64_t outer, int *found)
{
    *found = 0;
    uint64_t inner = 0;
    pthread_mutex_lock(&r->mu);
    leader_prune(r);
    for (struct remote_req *q = r->reqs; q && !*found; q = q->next)
        if (q->outer == outer) *found = 1, inner = q->inner;
    pthread_mutex_unlock(&r->mu);
    return inner;
}

static void *leader_drain_main(void *arg)
{
    struct router *r = arg;
    conductor_drain(r->local, r->drain_timeout);
    atomic_store(&r->drain_done, 1);
    pthread_mutex_lock(&r->mu);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Agent: one message from rank 0. */
static enum status leader_message(struct router *r, const unsigned char *buf, size_t n)
{
    struct rbuf rb = {.p = buf, .n = n};
    const uint32_t *type = get(&rb, sizeof(uint32_t));
    if (!type) return status_errorf(STATUS_INTERNAL, "router: an empty message from rank 0");
    rb.off = 0;
    if (*type == MSG_SUBMIT) {
        leader_submit(r, &rb);
        return STATUS_OK;
    }
    struct status_head h;
    double value = 0;
    const char *unused;
    if (!get_plain(&rb, &h, &value, &unused))
        return status_errorf(STATUS_INTERNAL, "router: a truncated message (type %u) from rank 0", *type);
    switch (*type) {
    case MSG_CANCEL: {
        int found = 0;
        uint64_t inner = leader_inner(r, h.handle, &found);
        if (found) conductor_cancel(r->local, inner, NULL);
        return STATUS_OK;
    }
    case MSG_DRAIN:
        if (!r->drain_started) {
            r->drain_timeout = value >= 0 ? value : 0;
            if (pthread_create(&r->drain_thread, NULL, leader_drain_main, r) != 0)
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: cannot start a drain thread");
            r->drain_started = 1;
        }
        return STATUS_OK;
    case MSG_SHUTDOWN:
        r->shutdown = 1;
        return STATUS_OK;
    default:
        return status_errorf(STATUS_INTERNAL, "router: an unknown message (type %u) from rank 0", *type);
    }
}

/* Agent: posts what the engine thread queued, and the periodic report. */
static enum status leader_flush(struct router *r, int with_stats)
{
    pthread_mutex_lock(&r->mu);
    struct outmsg *m = r->out_head;
    r->out_head = r->out_tail = NULL;
    if (r->n_done_reqs > 64) leader_prune(r);
    pthread_mutex_unlock(&r->mu);
    enum status st = STATUS_OK;
    while (m) {
        struct outmsg *next = m->next;
        if (st == STATUS_OK) st = parallel_msg_send(r->world, 0, m->buf, m->n);
        else free(m->buf);
        free(m);
        m = next;
    }
    if (st == STATUS_OK && with_stats) {
        struct engine_stats s;
        conductor_get_stats(r->local, &s);
        struct status_head h = {.type = MSG_STATS};
        struct wbuf b = {0};
        put(&b, &h, sizeof h);
        put(&b, &s, sizeof s);
        st = router_send_to(r, 0, &b);
    }
    int pending = 0;
    double oldest = 0;
    if (st == STATUS_OK) st = parallel_msg_progress(r->world, &pending, &oldest);
    return st;
}

enum status router_leader_run(struct router *r)
{
    enum status st = conductor_start(r->local);
    unsigned char *buf = NULL;
    size_t cap = 0;
    double last_stats = 0;
    int drained_sent = 0, fatal_sent = 0;
    while (st == STATUS_OK && !r->shutdown) {
        int busy = 0;
        for (int k = 0; k < 64 && st == STATUS_OK; k++) {
            int got = 0, source = -1;
            size_t n = 0;
            st = parallel_msg_poll(r->world, &got, &source, &n);
            if (st != STATUS_OK || !got) break;
            if (base_grow((void **)&buf, &cap, n, 1) != 0) {
                st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of memory for a %zu-byte message", n);
                break;
            }
            if ((st = parallel_msg_recv(r->world, source, buf, n)) != STATUS_OK) break;
            if (source == 0) st = leader_message(r, buf, n);
            busy = 1;
            if (r->shutdown) break;
        }
        if (st != STATUS_OK) break;
        double now = base_now_s();
        int with_stats = !drained_sent && now - last_stats >= STATS_PERIOD_S; /* rank 0 stops listening */
        if (with_stats) last_stats = now;
        if ((st = leader_flush(r, with_stats)) != STATUS_OK) break;
        if (r->drain_started && atomic_load(&r->drain_done) && !drained_sent) {
            drained_sent = 1;
            leader_flush(r, 1); /* the drain's last events and counters first */
            st = router_send_plain(r, 0, MSG_DRAINED, 0, 0, "", 0);
        }
        pthread_mutex_lock(&r->mu);
        int fatal = r->local_fatal && !fatal_sent;
        pthread_mutex_unlock(&r->mu);
        if (fatal && st == STATUS_OK) {
            fatal_sent = 1;
            st = router_send_plain(r, 0, MSG_FATAL, 0, (int32_t)r->fail_status, r->failure, 0);
        }
        if (!busy && st == STATUS_OK) {
            pthread_mutex_lock(&r->mu);
            if (!r->out_head) {
                struct timespec until;
                clock_gettime(CLOCK_REALTIME, &until);
                until.tv_nsec += IDLE_WAIT_NS;
                if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
                pthread_cond_timedwait(&r->cv, &r->mu, &until);
            }
            pthread_mutex_unlock(&r->mu);
        }
    }
    free(buf);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", st == STATUS_OK ? "" : status_message());
    if (r->drain_started) pthread_join(r->drain_thread, NULL);
    else conductor_drain(r->local, 0.0);
    r->drain_started = 0;
    if (st == STATUS_OK && (st = leader_flush(r, 0)) != STATUS_OK) snprintf(msg, sizeof msg, "%s", status_message());
    if (st == STATUS_OK && r->local_fatal) {
        snprintf(msg, sizeof msg, "%s", r->failure);
        st = r->fail_status;
    }
    if (st != STATUS_OK) {
        /* Tell rank 0 (best effort: the world may be what failed) and leave without
         * MPI_Finalize, which would wait for ranks that are going on. */
        if (!fatal_sent && !r->world->broken) {
            leader_flush(r, 0);
            router_send_plain(r, 0, MSG_FATAL, 0, (int32_t)st, msg, 0);
            int pending = 1;
            double oldest = 0;
            for (int i = 0; i < 100 && pending; i++) {
                if (parallel_msg_progress(r->world, &pending, &oldest) != STATUS_OK) break;
                if (pending) nap(10 * 1000 * 1000);
            }
        }
        parallel_world_fail(r->world, "replica leader: %s", msg);
        return status_errorf(st, "%s", msg);
    }
    return STATUS_OK;
}

