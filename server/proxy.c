/* server/proxy.c - `shardlm route` (proxy.h): an HTTP/1.1 reverse proxy over separate serve
 * jobs. The front is libmicrohttpd (a thread per connection, as the serve front); each request
 * opens its own connection to a replica ("Connection: close": no pool), so a thread blocks in
 * plain socket reads and writes; a relayed body is read back chunk by chunk and handed to
 * libmicrohttpd as it comes (chunked or Content-Length framing from the replica, then framed
 * again by libmicrohttpd for the client).
 * Not here: one replica's connection and the answer's framing (proxy_wire.c), the flags and
 * signals (cli/route.c). Tests: tests/server/test_router.py. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "journal.h"
#include "proxy.h"
#include "proxy_internal.h"

#define MODULE "route"

struct backend {
    char name[256];                 /* as given: HOST:PORT */
    char host[256];                 /* the Host header */
    struct sockaddr_storage ss;
    socklen_t sl;
    atomic_int up;
    atomic_int in_flight;           /* requests of the router's on it now */
    atomic_ullong relayed;          /* answers relayed from it */
    atomic_ullong failures;         /* connections refused, cut before a head, probes failed */
};

struct sticky {
    char key[JOURNAL_KEY_MAX + 1];
    int backend;
};

struct proxy {
    struct proxy_options o;
    struct backend b[ROUTER_MAX_BACKENDS];
    int n;
    struct MHD_Daemon *d;
    pthread_t prober;
    int prober_started;
    pthread_mutex_t mu;             /* the prober's sleep, the sticky table */
    pthread_cond_t cv;
    atomic_int stop;                /* the prober ends; relays still running are cut */
    atomic_uint turn;               /* ties among equally loaded replicas taken in turn */
    atomic_ullong requests, retries, unavailable;
    struct sticky sticky[ROUTER_STICKY];
    int sticky_next;
};

/* One client connection's request: its full URI and body, then the replica's answer. */
struct rconn {
    char *uri;
    char *body;
    size_t len, cap;
    int too_big;
    int headed;     /* the first call (headers only) has been */
};


static void set_up(struct backend *b, int up, const char *why)
{
    if (atomic_exchange(&b->up, up) != up) {
        if (up) LOG_INFO(MODULE, "replica %s is up", b->name);
        else LOG_WARN(MODULE, "replica %s is down (%s)", b->name, why);
    }
    if (!up) atomic_fetch_add(&b->failures, 1);
}

static enum status resolve(const char *addr, char *host, size_t cap, struct sockaddr_storage *ss, socklen_t *sl)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr || !colon[1])
        return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' is not HOST:PORT", addr);
    size_t hn = (size_t)(colon - addr);
    const char *h = addr;
    if (hn >= 2 && h[0] == '[' && h[hn - 1] == ']') h++, hn -= 2;
    if (hn >= cap) return status_errorf(STATUS_INVALID_ARGUMENT, "'%s': host name too long", addr);
    memcpy(host, h, hn);
    host[hn] = 0;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int rc = getaddrinfo(host, colon + 1, &hints, &res);
    if (rc != 0) return status_errorf(STATUS_INVALID_ARGUMENT, "'%s': %s", addr, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sl = res->ai_addrlen;
    freeaddrinfo(res);
    return STATUS_OK;
}

/* ---- choosing replicas ----------------------------------------------------------------------- */

static int sticky_find(struct proxy *r, const char *key)
{
    int found = -1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < ROUTER_STICKY && found < 0; i++)
        if (r->sticky[i].key[0] && !strcmp(r->sticky[i].key, key)) found = r->sticky[i].backend;
    pthread_mutex_unlock(&r->mu);
    return found;
}

static void sticky_put(struct proxy *r, const char *key, int backend)
{
    if (strlen(key) > JOURNAL_KEY_MAX) return;
    pthread_mutex_lock(&r->mu);
    int at = -1;
    for (int i = 0; i < ROUTER_STICKY && at < 0; i++)
        if (r->sticky[i].key[0] && !strcmp(r->sticky[i].key, key)) at = i;
    if (at < 0) at = r->sticky_next, r->sticky_next = (r->sticky_next + 1) % ROUTER_STICKY;
    snprintf(r->sticky[at].key, sizeof r->sticky[at].key, "%s", key);
    r->sticky[at].backend = backend;
    pthread_mutex_unlock(&r->mu);
}

/* The replicas to try, in order, into order[] (every replica once); returns r->n. Up ones come
 * before down ones. With an Idempotency-Key: the one it went to before, then the key's
 * rendezvous order; else the least loaded first, ties in turn. */
static int candidates(struct proxy *r, const char *idem, int *order)
{
    double w[ROUTER_MAX_BACKENDS];
    unsigned start = atomic_fetch_add(&r->turn, 1);
    int first = idem ? sticky_find(r, idem) : -1;
    for (int i = 0; i < r->n; i++) {
        order[i] = i;
        const struct backend *b = &r->b[i];
        double down = atomic_load(&b->up) ? 0.0 : 1e12;
        if (idem) {
            uint64_t h = base_fnv1a_str(base_fnv1a_str(BASE_FNV1A_BASIS, b->name), idem);
            w[i] = (i == first ? -1e13 : 0.0) + down + (double)(h >> 11) * 1e-9;
        } else {
            unsigned rot = ((unsigned)i + (unsigned)r->n - start % (unsigned)r->n) % (unsigned)r->n;
            w[i] = down + (double)atomic_load(&b->in_flight) + (double)rot / (double)r->n;
        }
    }
    for (int i = 1; i < r->n; i++) /* insertion sort by weight */
        for (int j = i; j > 0 && w[order[j]] < w[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    return r->n;
}

/* ---- answering ------------------------------------------------------------------------------- */

static enum MHD_Result answer(struct MHD_Connection *c, unsigned code, const char *ctype, const char *body,
                              const char *retry_after)
{
    struct MHD_Response *rs = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!rs) return MHD_NO;
    MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (retry_after) MHD_add_response_header(rs, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
    enum MHD_Result ret = MHD_queue_response(c, code, rs);
    MHD_destroy_response(rs);
    return ret;
}

static enum MHD_Result answer_error(struct MHD_Connection *c, unsigned code, const char *type, const char *codename,
                                    const char *message, const char *retry_after)
{
    char body[768];
    snprintf(body, sizeof body, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":\"%s\"}}",
             message, type, codename);
    return answer(c, code, "application/json", body, retry_after);
}

static enum MHD_Result answer_health(struct proxy *r, struct MHD_Connection *c)
{
    int up = 0;
    for (int i = 0; i < r->n; i++) up += atomic_load(&r->b[i].up);
    char body[128];
    snprintf(body, sizeof body, "{\"status\":\"%s\",\"replicas_up\":%d,\"replicas\":%d}", up ? "SERVING" : "NOT_SERVING",
             up, r->n);
    return answer(c, up ? 200 : 503, "application/json", body, NULL);
}

static enum MHD_Result answer_metrics(struct proxy *r, struct MHD_Connection *c)
{
    struct proxy_text h = {0};
    char line[512];
    static const char *const help[][3] = {
        {"shardlm_router_replica_up", "gauge", "1 while the replica answers its health probe"},
        {"shardlm_router_replica_in_flight", "gauge", "requests of the router's on the replica now"},
        {"shardlm_router_replica_relayed_total", "counter", "answers relayed from the replica"},
        {"shardlm_router_replica_failures_total", "counter", "connections refused or cut before a response head, failed probes"},
    };
    for (int k = 0; k < 4; k++) {
        snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", help[k][0], help[k][2], help[k][0], help[k][1]);
        proxy_text_str(&h, line);
        for (int i = 0; i < r->n; i++) {
            const struct backend *b = &r->b[i];
            unsigned long long v = k == 0   ? (unsigned long long)atomic_load(&b->up)
                                   : k == 1 ? (unsigned long long)atomic_load(&b->in_flight)
                                   : k == 2 ? atomic_load(&b->relayed)
                                            : atomic_load(&b->failures);
            snprintf(line, sizeof line, "%s{replica=\"%s\"} %llu\n", help[k][0], b->name, v);
            proxy_text_str(&h, line);
        }
    }
    snprintf(line, sizeof line,
             "# HELP shardlm_router_requests_total requests the router took\n# TYPE shardlm_router_requests_total counter\n"
             "shardlm_router_requests_total %llu\n"
             "# HELP shardlm_router_retries_total requests sent on to another replica (unreachable, 404 or 503)\n"
             "# TYPE shardlm_router_retries_total counter\nshardlm_router_retries_total %llu\n"
             "# HELP shardlm_router_unavailable_total requests answered 503 for want of a replica\n"
             "# TYPE shardlm_router_unavailable_total counter\nshardlm_router_unavailable_total %llu\n",
             atomic_load(&r->requests), atomic_load(&r->retries), atomic_load(&r->unavailable));
    proxy_text_str(&h, line);
    if (h.oom) return free(h.p), MHD_NO;
    enum MHD_Result ret = answer(c, 200, "text/plain; version=0.0.4", h.p, NULL);
    free(h.p);
    return ret;
}

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = proxy_body_read(cls, buf, max);
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void relay_free(void *cls) { proxy_reply_free(cls); }

/* Relays x's answer (code, end-to-end headers, body as it comes); x is the response's now. */
static enum MHD_Result relay(struct proxy *r, struct MHD_Connection *c, struct reply *x)
{
    uint64_t size = !x->chunked && x->remaining >= 0 ? (uint64_t)x->remaining : MHD_SIZE_UNKNOWN;
    struct MHD_Response *rs = MHD_create_response_from_callback(size, PROXY_IO_BUF, relay_read, x, relay_free);
    if (!rs) {
        proxy_reply_free(x);
        return MHD_NO;
    }
    for (char *p = x->head; *p;) {
        char *e = strstr(p, "\r\n"), *colon = memchr(p, ':', e ? (size_t)(e - p) : 0);
        if (!e) break;
        if (colon) {
            *colon = 0, *e = 0;
            const char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            if (!proxy_hop_header(p)) MHD_add_response_header(rs, p, v);
        }
        p = e + 2;
    }
    atomic_fetch_add(&r->b[x->backend].relayed, 1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)x->code, rs);
    MHD_destroy_response(rs);
    return ret;
}

/* Whether the request names something only one replica may hold (proxy.h). */
static int names_object(struct MHD_Connection *c, const char *uri, const struct rconn *rc)
{
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID")) return 1;
    if (!strncmp(uri, "/v1/responses/", 14) || !strncmp(uri, "/v1/files/", 10) ||
        !strncmp(uri, "/v1/fine_tuning/jobs/", 21))
        return 1;
    return rc->len && memmem(rc->body, rc->len, "\"previous_response_id\"", 22) != NULL;
}

static int connection_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* Sends the request to one replica and reads its head: the reply, or NULL when the replica
 * cannot be reached or ended the connection first (it is marked down), or when the client went
 * away meanwhile (*gone set). */
static struct reply *ask(struct proxy *r, struct MHD_Connection *c, int bi, const char *method, const struct rconn *rc,
                         int *gone)
{
    struct backend *b = &r->b[bi];
    int fd = proxy_dial(&b->ss, b->sl, r->o.connect_timeout_s);
    if (fd < 0) {
        set_up(b, 0, "connection refused or timed out");
        return NULL;
    }
    size_t hl = 0;
    char *head = proxy_request_head(c, method, rc->uri, b->host, rc->len, &hl);
    struct reply *x = head ? calloc(1, sizeof *x) : NULL;
    if (!x) {
        free(head);
        close(fd);
        return NULL;
    }
    x->stop = &r->stop, x->fd = fd, x->client_fd = connection_fd(c);
    /* A replica may answer and close before taking the whole body (a 413): its answer is read
     * even when sending failed. */
    (void)(proxy_send_all(fd, head, hl) == 0 && rc->len && proxy_send_all(fd, rc->body, rc->len));
    free(head);
    atomic_fetch_add(&b->in_flight, 1);
    x->in_flight = &b->in_flight, x->backend = bi;
    if (proxy_read_head(x, !strcmp(method, "HEAD"), 3600) != 0) { /* (a long prefill: an hour) */
        *gone = x->client_gone;
        if (!x->client_gone) set_up(b, 0, "the connection ended before a response head");
        proxy_reply_free(x);
        return NULL;
    }
    set_up(b, 1, NULL);
    return x;
}

static enum MHD_Result forward(struct proxy *r, struct MHD_Connection *c, const char *method, struct rconn *rc)
{
    int order[ROUTER_MAX_BACKENDS];
    const char *idem = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    if (MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID")) idem = NULL;
    int n = candidates(r, idem, order), unreachable = 0, lookup = names_object(c, rc->uri, rc);
    atomic_fetch_add(&r->requests, 1);
    struct reply *held = NULL; /* the last 404 / 503, relayed when no replica does better */
    char *held_body = NULL;
    size_t held_len = 0;
    for (int k = 0; k < n; k++) {
        if (k > 0) atomic_fetch_add(&r->retries, 1);
        int gone = 0;
        struct reply *x = ask(r, c, order[k], method, rc, &gone);
        if (gone) { /* nobody to answer */
            proxy_reply_free(held);
            free(held_body);
            return MHD_NO;
        }
        if (!x) {
            unreachable++;
            continue;
        }
        if (x->code == 404 || x->code == 503) {
            size_t len = 0;
            char *body = proxy_hold_body(x, &len);
            if (!body) { /* over PROXY_HELD_BODY_MAX or cut: not an answer to relay, part of it read */
                proxy_reply_free(x);
                continue;
            }
            proxy_reply_free(held);
            free(held_body);
            held = x, held_body = body, held_len = len;
            continue;
        }
        proxy_reply_free(held);
        free(held_body);
        if (idem && x->code < 500) sticky_put(r, idem, order[k]);
        return relay(r, c, x);
    }
    if (!held || (unreachable && lookup && held->code == 404)) {
        proxy_reply_free(held);
        free(held_body);
        atomic_fetch_add(&r->unavailable, 1);
        return answer_error(c, 503, "service_unavailable_error", "no_replica",
                            held ? "no reachable replica holds what this request names; a replica is unreachable and "
                                   "may hold it (in its journal): retry"
                                 : "no replica is reachable; retry",
                            "1");
    }
    /* Every replica answered 404 or 503: the last one's answer. */
    struct MHD_Response *rs = MHD_create_response_from_buffer(held_len, held_body, MHD_RESPMEM_MUST_FREE);
    if (!rs) {
        proxy_reply_free(held);
        free(held_body);
        return MHD_NO;
    }
    char v[256];
    if (proxy_head_value(held->head, "Content-Type", v, sizeof v)) MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, v);
    if (proxy_head_value(held->head, "Retry-After", v, sizeof v)) MHD_add_response_header(rs, MHD_HTTP_HEADER_RETRY_AFTER, v);
    if (held->code == 503) atomic_fetch_add(&r->unavailable, 1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)held->code, rs);
    MHD_destroy_response(rs);
    proxy_reply_free(held);
    return ret;
}

/* ---- libmicrohttpd's callbacks --------------------------------------------------------------- */

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c)
{
    (void)cls, (void)c;
    struct rconn *rc = calloc(1, sizeof *rc);
    if (rc) rc->uri = strdup(uri);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    struct proxy *r = cls;
    struct rconn *rc = *con_cls;
    if (!rc || !rc->uri) return MHD_NO;
    if (!rc->headed) { /* the headers: the body (if any) comes in the next calls */
        rc->headed = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (rc->too_big || rc->len + n > r->o.max_body_bytes) {
            rc->too_big = 1;
            return MHD_YES;
        }
        if (rc->len + n > rc->cap) {
            size_t cap = rc->cap ? rc->cap : 4096;
            while (cap < rc->len + n) cap *= 2;
            char *p = realloc(rc->body, cap);
            if (!p) return MHD_NO;
            rc->body = p, rc->cap = cap;
        }
        memcpy(rc->body + rc->len, upload, n);
        rc->len += n;
        return MHD_YES;
    }
    if (rc->too_big) {
        char why[160];
        snprintf(why, sizeof why, "the request body is over the router's --max-body-bytes (%zu)", r->o.max_body_bytes);
        return answer_error(c, 413, "invalid_request_error", "body_too_large", why, NULL);
    }
    if (!strcmp(url, "/health") && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) return answer_health(r, c);
    if (!strcmp(url, "/metrics") && (!strcmp(method, "GET") || !strcmp(method, "HEAD"))) return answer_metrics(r, c);
    if (atomic_load(&r->stop))
        return answer_error(c, 503, "service_unavailable_error", "shutting_down", "the router is shutting down", "1");
    return forward(r, c, method, rc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why)
{
    (void)cls, (void)c, (void)why;
    struct rconn *rc = *con_cls;
    if (!rc) return;
    free(rc->uri);
    free(rc->body);
    free(rc);
    *con_cls = NULL;
}

/* ---- the probe thread ------------------------------------------------------------------------ */

/* GET /health on one replica: 1 when it answers 200. */
static int probe(struct proxy *r, struct backend *b)
{
    int fd = proxy_dial(&b->ss, b->sl, r->o.connect_timeout_s);
    if (fd < 0) return 0;
    char req[512];
    int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", b->host);
    struct reply *x = calloc(1, sizeof *x);
    if (!x) return close(fd), 0;
    x->stop = &r->stop, x->fd = fd, x->client_fd = -1;
    int ok = proxy_send_all(fd, req, (size_t)n) == 0 && proxy_read_head(x, 1, r->o.connect_timeout_s) == 0 &&
             x->code == 200;
    proxy_reply_free(x);
    return ok;
}

static void probe_all(struct proxy *r)
{
    for (int i = 0; i < r->n && !atomic_load(&r->stop); i++) {
        struct backend *b = &r->b[i];
        set_up(b, probe(r, b), "its health probe failed");
    }
}

static void *prober(void *arg)
{
    struct proxy *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!atomic_load(&r->stop)) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        double at = (double)t.tv_sec + 1e-9 * (double)t.tv_nsec + r->o.probe_interval_s;
        t.tv_sec = (time_t)at;
        t.tv_nsec = (long)((at - (double)t.tv_sec) * 1e9);
        pthread_cond_timedwait(&r->cv, &r->mu, &t);
        if (atomic_load(&r->stop)) break;
        pthread_mutex_unlock(&r->mu);
        probe_all(r);
        pthread_mutex_lock(&r->mu);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- start and stop -------------------------------------------------------------------------- */

enum status proxy_start(const struct proxy_options *o, struct proxy **out)
{
    *out = NULL;
    if (o->n_backends < 1 || o->n_backends > ROUTER_MAX_BACKENDS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "route needs 1 to %d --replica addresses, got %d", ROUTER_MAX_BACKENDS,
                             o->n_backends);
    struct proxy *r = calloc(1, sizeof *r);
    if (!r) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    r->o = *o;
    r->n = o->n_backends;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    enum status st = STATUS_OK;
    for (int i = 0; i < r->n && st == STATUS_OK; i++) {
        struct backend *b = &r->b[i];
        snprintf(b->name, sizeof b->name, "%s", o->backends[i]);
        char host[256];
        st = resolve(o->backends[i], host, sizeof host, &b->ss, &b->sl);
        if (st != STATUS_OK) status_errorf(st, "--replica %s", status_message());
        snprintf(b->host, sizeof b->host, "%s", o->backends[i]);
        for (int j = 0; j < i && st == STATUS_OK; j++)
            if (!strcmp(r->b[j].name, b->name)) st = status_errorf(STATUS_INVALID_ARGUMENT, "--replica %s given twice", b->name);
    }
    struct sockaddr_storage ss;
    socklen_t sl;
    char host[256];
    if (st == STATUS_OK) {
        st = resolve(o->listen, host, sizeof host, &ss, &sl);
        if (st != STATUS_OK) status_errorf(st, "--listen %s", status_message());
    }
    if (st != STATUS_OK) {
        proxy_stop(r);
        return st;
    }
    probe_all(r);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    r->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, r, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, r, MHD_OPTION_NOTIFY_COMPLETED, on_completed, r,
                            MHD_OPTION_END);
    if (!r->d) {
        proxy_stop(r);
        return status_errorf(STATUS_UNAVAILABLE, "cannot serve HTTP on %s (address in use or invalid)", o->listen);
    }
    if (pthread_create(&r->prober, NULL, prober, r) != 0) {
        proxy_stop(r);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cannot start the probe thread");
    }
    r->prober_started = 1;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(r->d, MHD_DAEMON_INFO_BIND_PORT);
    int up = 0;
    for (int i = 0; i < r->n; i++) up += atomic_load(&r->b[i].up);
    printf("shardlm: route listening on %s:%d\n", host, di ? di->port : 0);
    fflush(stdout);
    LOG_INFO(MODULE, "%d replica(s), %d up; probes every %.1f s", r->n, up, o->probe_interval_s);
    *out = r;
    return STATUS_OK;
}

static int in_flight(struct proxy *r)
{
    int n = 0;
    for (int i = 0; i < r->n; i++) n += atomic_load(&r->b[i].in_flight);
    return n;
}

void proxy_stop(struct proxy *r)
{
    if (!r) return;
    int listen_fd = -1;
    if (r->d) {
        listen_fd = MHD_quiesce_daemon(r->d); /* no new connections; the socket is ours to close */
        double until = proxy_now_s() + r->o.drain_timeout_s;
        while (in_flight(r) > 0 && proxy_now_s() < until) usleep(20000);
    }
    pthread_mutex_lock(&r->mu);
    atomic_store(&r->stop, 1);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    if (r->prober_started) pthread_join(r->prober, NULL);
    if (r->d) MHD_stop_daemon(r->d);
    if (listen_fd >= 0) close(listen_fd);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}
