/* engine/serving/router.c - data-parallel serving, rank 0's side (see router.h): creation of the
 * replicas, routing, the router thread, drain and teardown. The leaders' agent is in
 * router_agent.c, the message codec in router_msg.h, the shared state in router_impl.h.
 *
 * Messages (parallel_msg_*, point to point on the parent world; every field 8-byte aligned so
 * that arrays are read in place):
 *   rank 0 -> leader: SUBMIT (handle, request_id, params, prompt, stops, logit bias),
 *                     CANCEL (handle), DRAIN (timeout), SHUTDOWN;
 *   leader -> rank 0: EVENT (one engine event), REJECT (handle, status, message: the leader's
 *                     engine refused a submission), STATS (every 0.2 s: the heartbeat),
 *                     DRAINED, FATAL (status, message).
 * Handles are rank 0's: the leader keeps the map to its own engine's handles. Deadlines travel
 * as remaining seconds (clocks differ between nodes). Sends never block (parallel_msg_send
 * posts and returns), so no thread waits on another rank while holding anything.
 *
 * Threads on rank 0: callers (submit, cancel, stats), replica 0's engine thread (its events),
 * and the router thread (every message from leaders, remote events, failure handling). A
 * route is freed by the thread that delivers its last FINISHED event: replica 0's engine thread
 * for local routes, the router thread for remote ones; remote events find their route by
 * handle under the lock, so a late event for a failed route is dropped.
 * Tests: tests/test_engine.c (--dp), tests/test_serve_mpi.sh. */
#include "router.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conductor.h"
#include "grammar.h"
#include "parallel.h"
#include "request.h"
#include "router_impl.h"
#include "tokenizer.h"


struct conductor *router_local(const struct router *r) { return r->local; }
int router_is_front(const struct router *r) { return r->role == ROLE_FRONT; }
int router_replicas(const struct router *r) { return r->dp; }

/* ---- creation ------------------------------------------------------------------------------- */

enum status router_create(const struct engine_options *opt, int dp, struct router **out)
{
    *out = NULL;
    struct parallel_world *w = opt->world;
    CHECK(w && dp > 1, "router_create without data parallelism");
    struct router *r = calloc(1, sizeof *r);
    if (!r) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of host memory");
    r->o = *opt;
    r->world = w;
    r->dp = dp;
    r->next_handle = 1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    enum status st = STATUS_OK;
    int tp = opt->tp > 0 ? opt->tp : 1, pp = opt->pp > 0 ? opt->pp : 1;
    if (!w->thread_multiple)
        st = status_errorf(STATUS_UNAVAILABLE, "data parallelism needs an MPI library with MPI_THREAD_MULTIPLE");
    if (st == STATUS_OK) st = parallel_layout(w, tp, pp, &r->layout);
    st = parallel_agree(w, st);
    if (st != STATUS_OK) goto fail;
    const struct parallel_layout *l = &r->layout;
    r->role = w->rank == 0 ? ROLE_FRONT : (l->pp_rank == 0 && l->tp_rank == 0) ? ROLE_LEADER : ROLE_WORKER;
    if ((st = parallel_world_split(w, l->dp_rank, w->rank, &r->sub)) != STATUS_OK) goto fail;

    struct engine_options io = *opt;
    io.world = r->sub->size > 1 ? r->sub : NULL;
    io.dp = 1;
    io.tp = tp;
    io.pp = pp;
    io.on_fatal = router_on_local_fatal;
    io.fatal_ctx = r;
    if (r->role == ROLE_FRONT) {
        r->rep = calloc((size_t)dp, sizeof *r->rep);
        r->prefix = calloc(PREFIX_SLOTS, sizeof *r->prefix);
        if (!r->rep || !r->prefix) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of host memory");
        for (int d = 0; st == STATUS_OK && d < dp; d++) {
            r->rep[d].leader = parallel_layout_rank(l, d, 0, 0);
            r->rep[d].heard = base_now_s();
        }
    }
    if (st == STATUS_OK) st = conductor_create(&io, &r->local);
    st = parallel_agree(w, st); /* every replica loaded, or every rank fails */
    if (st != STATUS_OK) goto fail;
    struct engine_stats s;
    conductor_get_stats(r->local, &s);
    r->block_tokens = s.block_tokens;
    /* Messages between rank 0 and the leaders: a peer that stops in the middle of one is gone
     * after rank_timeout_s (the whole world is used for nothing else from here on). */
    if (r->role != ROLE_WORKER) w->timeout_s = opt->rank_timeout_s;
    if (opt->rank_timeout_s > 0 && (st = parallel_watch_start(w)) != STATUS_OK) goto fail; /* names a stopped rank */
    if (r->role == ROLE_FRONT) {
        LOG_INFO(MODULE, "%d data-parallel replicas of tp %d x pp %d; replica leaders at ranks %d, %d, ...", dp,
                 tp, pp, r->rep[0].leader, r->rep[1].leader);
    }
    *out = r;
    return STATUS_OK;
fail:
    router_free(r);
    return st;
}

/* ---- the front: routes ---------------------------------------------------------------------- */

static struct route **route_slot(struct router *r, uint64_t handle)
{
    struct route **p = &r->buckets[handle % ROUTE_BUCKETS];
    while (*p && (*p)->handle != handle) p = &(*p)->next;
    return p;
}

static void route_unlink(struct router *r, struct route *rt) /* under mu */
{
    struct route **p = route_slot(r, rt->handle);
    if (*p == rt) *p = rt->next;
}

/* Delivers one event of a route to the caller, keeping the books on FINISHED; frees the route
 * after its last sample. Called by the one thread that delivers this route's events. */
static void deliver(struct router *r, struct route *rt, struct engine_event *ev)
{
    ev->handle = rt->handle;
    ev->request_id = rt->id;
    int s = ev->sample;
    if (s < 0 || s >= rt->n) return;
    if (ev->kind != ENGINE_EVENT_FINISHED) { /* done[] is written by this thread only */
        if (!rt->done[s]) rt->on_event(rt->ctx, ev);
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (rt->done[s]) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    rt->done[s] = 1;
    rt->live--;
    r->rep[rt->replica].outstanding--;
    int last = rt->live == 0;
    if (last) route_unlink(r, rt);
    pthread_mutex_unlock(&r->mu);
    rt->on_event(rt->ctx, ev);
    if (last) free(rt);
}

/* Replica 0's engine thread. */
static void on_local_event(void *ctx, const struct engine_event *ev)
{
    struct route *rt = ctx;
    struct engine_event e = *ev;
    deliver(rt->r, rt, &e);
}

/* Router thread: finishes every unfinished sample of a remote route with an error. */
static void fail_route(struct router *r, struct route *rt, enum status st, const char *message)
{
    for (int s = 0, n = rt->n; s < n; s++) {
        pthread_mutex_lock(&r->mu);
        int done = rt->done[s], last = !done && rt->live == 1;
        pthread_mutex_unlock(&r->mu);
        if (done) continue;
        struct engine_event ev = {.kind = ENGINE_EVENT_FINISHED, .sample = s, .finish = FINISH_REASON_ERROR,
                                  .status = st, .message = message, .queue_seconds = -1.0};
        deliver(r, rt, &ev);
        if (last) return; /* rt is freed */
    }
}

/* Router thread: fails the remote routes that match (all of them, or one replica's). */
static void fail_remote_routes(struct router *r, int replica, enum status st, const char *message)
{
    for (;;) {
        struct route *victim = NULL;
        pthread_mutex_lock(&r->mu);
        for (int b = 0; b < ROUTE_BUCKETS && !victim; b++)
            for (struct route *rt = r->buckets[b]; rt && !victim; rt = rt->next)
                if (rt->replica != 0 && rt->submitted && (replica < 0 || rt->replica == replica)) victim = rt;
        pthread_mutex_unlock(&r->mu);
        if (!victim) return;
        fail_route(r, victim, st, message);
    }
}

/* Any thread: the engine can no longer serve. The router thread fails what is left and calls
 * on_fatal (once). */
static void router_fail(struct router *r, enum status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void router_fail(struct router *r, enum status st, const char *fmt, ...)
{
    pthread_mutex_lock(&r->mu);
    if (!r->failed && !r->fatal_pending) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->failure, sizeof r->failure, fmt, ap);
        va_end(ap);
        r->fail_status = st;
        r->fatal_pending = 1;
        LOG_ERROR(MODULE, "%s", r->failure);
    }
    pthread_mutex_unlock(&r->mu);
}

void router_on_local_fatal(void *ctx, enum status st, const char *message)
{
    struct router *r = ctx;
    if (r->role == ROLE_FRONT) {
        router_fail(r, st, "replica 0: %s", message);
    } else {
        pthread_mutex_lock(&r->mu);
        if (!r->local_fatal) {
            r->local_fatal = 1;
            snprintf(r->failure, sizeof r->failure, "%s", message);
            r->fail_status = st;
        }
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
}

/* Prompt-prefix hashes of the leading full blocks (chained: block i covers tokens 0..(i+1)*bt),
 * from a seed of what the replicas' prefix caches key blocks by besides the tokens (the adapter,
 * the cache salt, the owner under prefix_cache_per_owner: conductor_submit), so that a prompt is
 * routed to where its blocks can actually be reused. */
static int prefix_hashes(const struct router *r, const int32_t *prompt, int n_prompt, const struct request_params *p,
                         uint64_t *h)
{
    int bt = r->block_tokens > 0 ? r->block_tokens : 16;
    int nb = n_prompt / bt;
    if (nb > PREFIX_MAX_BLOCKS) nb = PREFIX_MAX_BLOCKS;
    uint64_t x = base_fnv1a_str(base_fnv1a(0x243f6a8885a308d3ull, "", 1), p->adapter ? p->adapter : "");
    x = base_fnv1a_str(base_fnv1a(x, "", 1), p->cache_salt ? p->cache_salt : "");
    if (r->o.prefix_cache_per_owner) x = base_fnv1a_str(base_fnv1a(x, "", 1), p->owner ? p->owner : "");
    for (int b = 0; b < nb; b++) {
        for (int i = 0; i < bt; i++) {
            x ^= (uint64_t)(uint32_t)prompt[b * bt + i];
            x *= 0x100000001b3ull;
            x ^= x >> 29;
        }
        h[b] = x | 1; /* 0 marks an empty slot */
    }
    return nb;
}

/* Under mu: the replica for a prompt of n samples, or -1 when every replica is full: each
 * holds at most max_seqs running + max_queue waiting samples (the counting unit of
 * --max-queue everywhere). */
static int choose_replica(struct router *r, const uint64_t *h, int nb, int n, int *by_prefix)
{
    *by_prefix = 0;
    const int cap = r->o.max_seqs + r->o.max_queue - n; /* outstanding samples that still leave room for n */
    int least = -1;
    for (int k = 0; k < r->dp; k++) {
        int d = (r->rr + k) % r->dp;
        if (least < 0 || r->rep[d].outstanding < r->rep[least].outstanding) least = d;
    }
    r->rr = (r->rr + 1) % r->dp;
    int chosen = least;
    /* A replica that holds the longest matching prefix wins unless it is busier than the least
     * loaded by more than a quarter of a batch (then balance beats the saved prefill). */
    const int slack = r->o.max_seqs / 4 > 2 ? r->o.max_seqs / 4 : 2;
    for (int b = nb - 1; b >= 0; b--) {
        const struct prefix_slot *ps = &r->prefix[h[b] % PREFIX_SLOTS];
        if (ps->hash != h[b]) continue;
        int d = ps->replica;
        if (d >= 0 && d < r->dp && r->rep[d].outstanding <= r->rep[least].outstanding + slack &&
            r->rep[d].outstanding <= cap) {
            chosen = d;
            *by_prefix = 1;
        }
        break;
    }
    if (r->rep[chosen].outstanding > cap) return -1;
    for (int b = 0; b < nb; b++) {
        struct prefix_slot *ps = &r->prefix[h[b] % PREFIX_SLOTS];
        ps->hash = h[b];
        ps->replica = chosen;
    }
    return chosen;
}

enum status router_send_to(struct router *r, int rank, struct wbuf *b)
{
    if (b->oom) {
        free(b->p);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of host memory for a message");
    }
    return parallel_msg_send(r->world, rank, b->p, b->n);
}

static enum status send_submit(struct router *r, const struct route *rt, const int32_t *prompt, int n_prompt,
                               const struct request_params *p)
{
    struct submit_head h = {.type = MSG_SUBMIT, .n_prompt = n_prompt, .handle = rt->handle, .p = *p,
                            .deadline_in = -1};
    if (p->deadline > 0) {
        h.deadline_in = p->deadline - base_now_s();
        if (h.deadline_in < 1e-6) h.deadline_in = 1e-6;
    }
    struct wbuf b = {0};
    put(&b, &h, sizeof h);
    put_str(&b, rt->id);
    put(&b, prompt, (size_t)n_prompt * sizeof *prompt);
    put(&b, p->stop_token_ids, (size_t)p->n_stop_token_ids * sizeof *p->stop_token_ids);
    for (int i = 0; i < p->n_stop; i++) put_str(&b, p->stop[i]);
    put(&b, p->logit_bias_ids, (size_t)p->n_logit_bias * sizeof *p->logit_bias_ids);
    put(&b, p->logit_bias_values, (size_t)p->n_logit_bias * sizeof *p->logit_bias_values);
    put_str(&b, p->adapter ? p->adapter : "");
    put_str(&b, p->client ? p->client : "");
    put_str(&b, p->owner ? p->owner : "");
    put_str(&b, p->cache_salt ? p->cache_salt : "");
    put(&b, p->constraint, p->constraint_len);
    uint64_t rng[4] = {0};
    if (p->resume_rng) memcpy(rng, p->resume_rng, sizeof rng);
    put(&b, rng, sizeof rng); /* has: h.p.resume_rng non-NULL (its value is meaningless there) */
    put(&b, p->resume_tokens, (size_t)p->n_resume * sizeof *p->resume_tokens);
    return router_send_to(r, r->rep[rt->replica].leader, &b);
}

enum status router_send_plain(struct router *r, int rank, uint32_t type, uint64_t handle, int32_t status,
                              const char *text, double value)
{
    struct status_head h = {.type = type, .status = status, .handle = handle};
    struct wbuf b = {0};
    put(&b, &h, sizeof h);
    put(&b, &value, sizeof value);
    put_str(&b, text);
    return router_send_to(r, rank, &b);
}

enum status router_submit(struct router *r, const char *request_id, const int32_t *prompt, int n_prompt,
                          const struct request_params *p, engine_event_fn on_event, void *ctx, uint64_t *handle)
{
    CHECK(r->role == ROLE_FRONT, "router_submit on rank %d", r->world->rank);
    enum status st = conductor_validate(r->local, prompt, n_prompt, p);
    if (st != STATUS_OK) return st;
    struct grammar *g = NULL; /* compiled here too: its errors are the caller's, not a replica's */
    st = conductor_compile_constraint(r->local, p, &g);
    if (g) grammar_unref(g);
    if (st == STATUS_OK) st = request_id_check(request_id);
    if (st != STATUS_OK) return st;
    if (p->n > (int)sizeof ((struct route *)0)->done)
        return status_errorf(STATUS_INVALID_ARGUMENT, "n: at most %zu samples", sizeof ((struct route *)0)->done);
    struct route *rt = calloc(1, sizeof *rt);
    if (!rt) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of host memory");
    uint64_t h[PREFIX_MAX_BLOCKS];
    int nb = r->o.prefix_caching ? prefix_hashes(r, prompt, n_prompt, p, h) : 0;
    rt->r = r;
    rt->n = rt->live = p->n;
    rt->on_event = on_event;
    rt->ctx = ctx;

    pthread_mutex_lock(&r->mu);
    if (r->failed || r->fatal_pending) {
        pthread_mutex_unlock(&r->mu);
        free(rt);
        return status_errorf(STATUS_UNAVAILABLE, "the engine failed: %s", r->failure);
    }
    if (r->draining) {
        pthread_mutex_unlock(&r->mu);
        free(rt);
        return status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    }
    int by_prefix = 0;
    int d = choose_replica(r, h, nb, p->n, &by_prefix);
    if (d < 0) {
        pthread_mutex_unlock(&r->mu);
        free(rt);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "every replica is full (%d replicas, each at most --max-seqs %d running + --max-queue %d "
                             "waiting samples; %d asked)", r->dp, r->o.max_seqs, r->o.max_queue, p->n);
    }
    rt->handle = r->next_handle++;
    rt->replica = d;
    if (request_id && *request_id) snprintf(rt->id, sizeof rt->id, "%s", request_id);
    else snprintf(rt->id, sizeof rt->id, "req-%llu", (unsigned long long)rt->handle);
    rt->next = r->buckets[rt->handle % ROUTE_BUCKETS];
    r->buckets[rt->handle % ROUTE_BUCKETS] = rt;
    r->rep[d].outstanding += rt->n;
    r->rep[d].routed++;
    r->rep[d].routed_by_prefix += (uint64_t)by_prefix;
    const uint64_t our_handle = rt->handle;
    pthread_mutex_unlock(&r->mu);

    if (d == 0) {
        uint64_t inner = 0;
        st = conductor_submit(r->local, rt->id, prompt, n_prompt, p, on_local_event, rt, &inner);
        int cancel = 0;
        if (st == STATUS_OK) {
            pthread_mutex_lock(&r->mu);
            if (*route_slot(r, our_handle) == rt) { /* else: already finished */
                rt->inner = inner;
                rt->submitted = 1;
                cancel = rt->cancel_pending;
            }
            pthread_mutex_unlock(&r->mu);
        }
        if (cancel) conductor_cancel(r->local, inner, NULL);
    } else {
        st = send_submit(r, rt, prompt, n_prompt, p);
        int cancel = 0;
        if (st == STATUS_OK) {
            pthread_mutex_lock(&r->mu);
            if (*route_slot(r, our_handle) == rt) { /* else: already rejected */
                rt->submitted = 1;
                cancel = rt->cancel_pending;
            }
            pthread_mutex_unlock(&r->mu);
        }
        if (cancel) router_send_plain(r, r->rep[d].leader, MSG_CANCEL, our_handle, 0, "", 0);
    }
    if (st != STATUS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", status_message());
        pthread_mutex_lock(&r->mu);
        route_unlink(r, rt);
        r->rep[d].outstanding -= rt->n;
        r->rep[d].routed--;
        r->rep[d].routed_by_prefix -= (uint64_t)by_prefix;
        pthread_mutex_unlock(&r->mu);
        free(rt);
        return status_errorf(st, "%s", msg);
    }
    *handle = our_handle;
    return STATUS_OK;
}

enum status router_cancel(struct router *r, uint64_t handle, const char *request_id)
{
    CHECK(r->role == ROLE_FRONT, "router_cancel on rank %d", r->world->rank);
    enum { MAXHIT = 64 }; /* one id used by more live requests than this: the rest on a next call */
    struct { int replica; uint64_t handle, inner; } hit[MAXHIT];
    int n = 0, found = 0;
    pthread_mutex_lock(&r->mu);
    for (int b = request_id ? 0 : (int)(handle % ROUTE_BUCKETS); b < ROUTE_BUCKETS; b++) {
        for (struct route *rt = r->buckets[b]; rt && n < MAXHIT; rt = rt->next) {
            if (request_id ? strcmp(rt->id, request_id) != 0 : rt->handle != handle) continue;
            found++;
            if (!rt->submitted) rt->cancel_pending = 1; /* router_submit forwards it */
            else hit[n++] = (__typeof__(hit[0])){rt->replica, rt->handle, rt->inner};
        }
        if (!request_id) break;
    }
    pthread_mutex_unlock(&r->mu);
    if (found == 0)
        return status_errorf(STATUS_NOT_FOUND, "no running request %s", request_id ? request_id : "with that handle");
    for (int i = 0; i < n; i++) {
        if (hit[i].replica == 0) conductor_cancel(r->local, hit[i].inner, NULL);
        else router_send_plain(r, r->rep[hit[i].replica].leader, MSG_CANCEL, hit[i].handle, 0, "", 0);
    }
    return STATUS_OK;
}

/* ---- the front: the router thread ----------------------------------------------------------- */

/* Router thread: the route of a remote event (NULL: finished already, or not replica d's). */
static struct route *find_route(struct router *r, uint64_t handle, int d)
{
    pthread_mutex_lock(&r->mu);
    struct route *rt = *route_slot(r, handle);
    if (rt && rt->replica != d) rt = NULL;
    pthread_mutex_unlock(&r->mu);
    return rt;
}

/* Router thread: one message from a leader. */
static void front_message(struct router *r, int source, const unsigned char *buf, size_t n)
{
    int d = -1;
    for (int k = 1; k < r->dp; k++)
        if (r->rep[k].leader == source) d = k;
    struct rbuf rb = {.p = buf, .n = n};
    const uint32_t *type = get(&rb, sizeof(uint32_t));
    if (d < 0 || !type) {
        router_fail(r, STATUS_INTERNAL, "router: a message of %zu bytes from rank %d, which leads no replica", n, source);
        return;
    }
    rb.off = 0;
    pthread_mutex_lock(&r->mu);
    r->rep[d].heard = base_now_s();
    pthread_mutex_unlock(&r->mu);
    switch (*type) {
    case MSG_EVENT: {
        struct event_head h;
        if (!get_copy(&rb, &h, sizeof h) || h.n_tokens < 0 || h.n_tokens > (1 << 24) || h.n_top < 0 ||
            h.n_top > 1024)
            break;
        struct engine_event ev = {.kind = (enum engine_event_kind)h.kind, .sample = h.sample, .n_tokens = h.n_tokens,
                                  .n_top = h.n_top, .finish = (enum finish_reason)h.finish,
                                  .status = (enum status)h.status, .prompt_tokens = h.prompt_tokens,
                                  .completion_tokens = h.completion_tokens, .seed = h.seed,
                                  .cached_prompt_tokens = h.cached_prompt_tokens,
                                  .queue_seconds = h.queue_seconds};
        if (h.has_rng) ev.rng = h.rng;
        size_t nt = (size_t)h.n_tokens;
        ev.tokens = get(&rb, nt * sizeof(int32_t));
        ev.text = get(&rb, h.text_len);
        ev.text_len = h.text_len;
        if (h.has_logprobs) ev.logprobs = get(&rb, nt * sizeof(float));
        if (h.n_top) ev.top = get(&rb, nt * (size_t)h.n_top * sizeof(struct top_logprob));
        ev.message = get_str(&rb);
        if (rb.bad) break;
        if (ev.message && !*ev.message) ev.message = NULL;
        struct route *rt = find_route(r, h.handle, d);
        if (rt) deliver(r, rt, &ev); /* remote routes are freed on this thread only */
        return;
    }
    case MSG_REJECT: {
        struct status_head h;
        double unused;
        const char *msg;
        if (!get_plain(&rb, &h, &unused, &msg)) break;
        struct route *rt = find_route(r, h.handle, d);
        if (rt) fail_route(r, rt, (enum status)h.status, msg);
        return;
    }
    case MSG_STATS: {
        struct status_head h;
        struct engine_stats s;
        if (!get_copy(&rb, &h, sizeof h) || !get_copy(&rb, &s, sizeof s)) break;
        pthread_mutex_lock(&r->mu);
        r->rep[d].stats = s;
        r->rep[d].stats_at = base_now_s();
        pthread_mutex_unlock(&r->mu);
        return;
    }
    case MSG_DRAINED:
        pthread_mutex_lock(&r->mu);
        r->rep[d].drained = 1;
        pthread_mutex_unlock(&r->mu);
        return;
    case MSG_FATAL: {
        struct status_head h;
        double unused;
        const char *msg;
        if (!get_plain(&rb, &h, &unused, &msg)) break;
        router_fail(r, (enum status)h.status, "replica %d (rank %d): %s", d, source, msg);
        return;
    }
    default: break;
    }
    router_fail(r, STATUS_INTERNAL, "router: a malformed message (type %u, %zu bytes) from rank %d", *type, n, source);
}

/* Router thread: the failure checks of one loop turn. */
static void front_watch(struct router *r)
{
    int pending = 0;
    double oldest = 0;
    enum status st = parallel_msg_progress(r->world, &pending, &oldest);
    if (st != STATUS_OK) router_fail(r, st, "router: %s", status_message());
    /* A leader reports every STATS_PERIOD_S: a timeout shorter than a few periods would mistake
     * a busy moment for a dead replica. */
    const double t = r->o.rank_timeout_s > 0 && r->o.rank_timeout_s < 5 * STATS_PERIOD_S ? 5 * STATS_PERIOD_S
                                                                                          : r->o.rank_timeout_s;
    if (t > 0 && oldest > t)
        router_fail(r, STATUS_UNAVAILABLE, "router: a message to a replica leader has not been taken for %.1f s: "
                    "a rank is hung or gone", oldest);
    if (t > 0) {
        double now = base_now_s();
        for (int d = 1; d < r->dp; d++) {
            pthread_mutex_lock(&r->mu);
            double silent = now - r->rep[d].heard;
            pthread_mutex_unlock(&r->mu);
            if (silent > t)
                router_fail(r, STATUS_UNAVAILABLE, "replica %d (rank %d) silent for %.1f s (--rank-timeout %.1f): "
                            "a rank is hung or gone", d, r->rep[d].leader, silent, t);
        }
    }
    pthread_mutex_lock(&r->mu);
    int act = r->fatal_pending && !r->failed, failed = r->failed || act;
    if (act) r->failed = 1;
    char msg[sizeof r->failure];
    memcpy(msg, r->failure, sizeof msg);
    enum status fst = r->fail_status;
    pthread_mutex_unlock(&r->mu);
    if (act) parallel_world_fail(r->world, "%s", msg); /* no clean MPI_Finalize with a rank gone */
    /* Every turn while failed: a submission that was in flight when the failure hit is handed
     * over (submitted) only afterwards. */
    if (failed) fail_remote_routes(r, -1, STATUS_UNAVAILABLE, msg);
    if (act && r->o.on_fatal) r->o.on_fatal(r->o.fatal_ctx, fst, msg);
}

static void *front_main(void *arg)
{
    struct router *r = arg;
    unsigned char *buf = NULL;
    size_t cap = 0;
    while (!atomic_load(&r->stop_thread)) {
        int busy = 0;
        for (int k = 0; k < 64 && !r->world->broken; k++) {
            int got = 0, source = -1;
            size_t n = 0;
            enum status st = parallel_msg_poll(r->world, &got, &source, &n);
            if (st == STATUS_OK && got && base_grow((void **)&buf, &cap, n, 1) != 0)
                st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: out of memory for a %zu-byte message", n);
            if (st == STATUS_OK && got) st = parallel_msg_recv(r->world, source, buf, n);
            if (st != STATUS_OK) {
                router_fail(r, st, "router: %s", status_message());
                break;
            }
            if (!got) break;
            front_message(r, source, buf, n);
            busy = 1;
        }
        front_watch(r);
        if (!busy) nap(IDLE_WAIT_NS);
    }
    free(buf);
    return NULL;
}

enum status router_start(struct router *r)
{
    if (r->role != ROLE_FRONT || r->thread_running) return STATUS_OK;
    enum status st = conductor_start(r->local);
    if (st != STATUS_OK) return st;
    pthread_mutex_lock(&r->mu);
    const double t = base_now_s();
    for (int d = 0; d < r->dp; d++) r->rep[d].heard = t; /* silence counts from now */
    pthread_mutex_unlock(&r->mu);
    if (pthread_create(&r->thread, NULL, front_main, r) != 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "router: cannot start the router thread");
    r->thread_running = 1;
    return STATUS_OK;
}

static int router_failed(struct router *r)
{
    pthread_mutex_lock(&r->mu);
    int failed = r->failed || r->fatal_pending;
    pthread_mutex_unlock(&r->mu);
    return failed;
}

static int all_drained(struct router *r)
{
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int d = 1; d < r->dp; d++) n += r->rep[d].drained;
    pthread_mutex_unlock(&r->mu);
    return n == r->dp - 1;
}

static int remote_outstanding(struct router *r)
{
    int n = 0;
    pthread_mutex_lock(&r->mu);
    for (int d = 1; d < r->dp; d++) n += r->rep[d].outstanding;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void router_drain(struct router *r, double timeout_s)
{
    CHECK(r->role == ROLE_FRONT, "router_drain on rank %d", r->world->rank);
    pthread_mutex_lock(&r->mu);
    int again = r->draining, failed = r->failed || r->fatal_pending;
    r->draining = 1;
    pthread_mutex_unlock(&r->mu);
    if (!again && !failed)
        for (int d = 1; d < r->dp; d++) router_send_plain(r, r->rep[d].leader, MSG_DRAIN, 0, 0, "", timeout_s);
    conductor_drain(r->local, timeout_s);
    if (!r->thread_running) return;
    /* The leaders cancel what is left at the same deadline; their last events need a moment. */
    double grace = r->o.rank_timeout_s > 0 && r->o.rank_timeout_s < 10 ? r->o.rank_timeout_s : 10;
    const double end = base_now_s() + timeout_s + grace;
    while ((remote_outstanding(r) > 0 || !all_drained(r)) && base_now_s() < end && !router_failed(r))
        nap(2 * 1000 * 1000);
    if (remote_outstanding(r) > 0 || !all_drained(r)) {
        /* A replica that does not finish draining is as good as gone: fatal, so that its
         * requests fail with UNAVAILABLE, the server exits non-zero and nobody waits in
         * MPI_Finalize for it. */
        router_fail(r, STATUS_UNAVAILABLE, "router: %d request(s) on remote replicas still unfinished %.1f s after "
                    "the drain deadline", remote_outstanding(r), grace);
        for (int i = 0; i < 5000 && remote_outstanding(r) > 0; i++) nap(1000 * 1000);
    }
}

enum status router_run(struct router *r)
{
    CHECK(r->role != ROLE_FRONT, "router_run on rank 0");
    if (r->role == ROLE_WORKER) return conductor_run_worker(r->local);
    return router_leader_run(r);
}

/* ---- stats and teardown ------------------------------------------------------------------------ */

void router_get_replica_stats(struct router *r, int replica, struct engine_replica_stats *s)
{
    CHECK(r->role == ROLE_FRONT && replica >= 0 && replica < r->dp, "replica %d of %d on rank %d", replica, r->dp,
          r->world->rank);
    memset(s, 0, sizeof *s);
    if (replica == 0) conductor_get_stats(r->local, &s->engine);
    pthread_mutex_lock(&r->mu);
    const struct replica *p = &r->rep[replica];
    s->leader_rank = p->leader;
    s->outstanding = p->outstanding;
    s->routed = p->routed;
    s->routed_by_prefix = p->routed_by_prefix;
    if (replica > 0) {
        s->engine = p->stats;
        s->report_age_s = p->stats_at > 0 ? base_now_s() - p->stats_at : -1;
    }
    pthread_mutex_unlock(&r->mu);
}

void router_get_stats(struct router *r, struct engine_stats *out)
{
    memset(out, 0, sizeof *out);
    for (int d = 0; d < r->dp; d++) {
        struct engine_replica_stats rs;
        router_get_replica_stats(r, d, &rs);
        const struct engine_stats *s = &rs.engine;
        out->waiting += s->waiting;
        out->running += s->running;
        out->kv_blocks_total += s->kv_blocks_total;
        out->kv_blocks_free += s->kv_blocks_free;
        out->kv_blocks_cached += s->kv_blocks_cached;
        out->block_tokens = s->block_tokens ? s->block_tokens : out->block_tokens;
        out->requests_submitted += s->requests_submitted;
        out->requests_finished += s->requests_finished;
        out->prompt_tokens += s->prompt_tokens;
        out->prefill_tokens_computed += s->prefill_tokens_computed;
        out->prefix_cache_hit_tokens += s->prefix_cache_hit_tokens;
        out->generated_tokens += s->generated_tokens;
        out->steps += s->steps;
        out->preemptions += s->preemptions;
        out->spec_drafted += s->spec_drafted;
        out->spec_accepted += s->spec_accepted;
        out->spec_lookup_drafted += s->spec_lookup_drafted;
        out->spec_lookup_accepted += s->spec_lookup_accepted;
        out->spec_corpus_drafted += s->spec_corpus_drafted;
        out->spec_corpus_accepted += s->spec_corpus_accepted;
        out->spec_corpus_tokens += s->spec_corpus_tokens;
        out->spec_backoffs += s->spec_backoffs;
        out->prefix_cache_verified += s->prefix_cache_verified;
        out->prefix_cache_mismatches += s->prefix_cache_mismatches;
        out->prefix_cache_verify_skipped += s->prefix_cache_verify_skipped;
        if (s->prefix_cache_max_abs_diff > out->prefix_cache_max_abs_diff)
            out->prefix_cache_max_abs_diff = s->prefix_cache_max_abs_diff;
    }
}

void router_free(struct router *r)
{
    if (!r) return;
    if (r->role == ROLE_FRONT && r->local) {
        if (r->thread_running) router_drain(r, 0.0);
        if (!r->world->broken)
            for (int d = 1; d < r->dp; d++) router_send_plain(r, r->rep[d].leader, MSG_SHUTDOWN, 0, 0, "", 0);
        if (r->thread_running) {
            atomic_store(&r->stop_thread, 1);
            pthread_join(r->thread, NULL);
            r->thread_running = 0;
        }
    }
    conductor_free(r->local);
    parallel_finalize(r->sub);
    if (r->rep) {
        for (int b = 0; b < ROUTE_BUCKETS; b++)
            for (struct route *rt = r->buckets[b], *next; rt; rt = next) {
                next = rt->next;
                free(rt);
            }
    }
    for (struct remote_req *q = r->reqs, *next; q; q = next) {
        next = q->next;
        free(q);
    }
    for (struct outmsg *m = r->out_head, *next; m; m = next) {
        next = m->next;
        free(m->buf);
        free(m);
    }
    free(r->rep);
    free(r->prefix);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
