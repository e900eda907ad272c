/* server/proxy.c - `shardlm route` (proxy.h): an HTTP/1.1 reverse proxy over separate serve
 * jobs. The front is libmicrohttpd (a thread per connection, as the serve front); each request
 * opens its own connection to a replica ("Connection: close": no pool), so a thread blocks in
 * plain socket reads and writes; a relayed body is read back chunk by chunk and handed to
 * libmicrohttpd as it comes (chunked or Content-Length framing from the replica, then framed
 * again by libmicrohttpd for the client).
 * Not here: the flags and signals (cli/route.c). Tests: tests/server/test_router.py. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "journal.h"
#include "proxy.h"

#define MODULE "route"
#define HEAD_MAX (64 << 10)   /* a replica's response head at most */
#define HELD_BODY_MAX (1 << 20) /* a 404 / 503 kept while the next replica is asked */
#define IO_BUF (16 << 10)

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
    atomic_int connections;         /* client connections open */
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

/* A replica's answer being read: the socket, its buffered bytes, the body's framing. */
struct reply {
    struct proxy *r;
    struct backend *b;
    int fd, client_fd;
    int code;
    char *head;                     /* the head's header lines (NUL-terminated, CRLF each) */
    int chunked;
    long long remaining;            /* Content-Length bytes (or the chunk's) left; -1: to EOF */
    int chunk_state;                /* chunked: 0 size line next, 1 data, 2 its CRLF, 3 done */
    int client_gone;                /* fill saw the client hang up (or the router stop) */
    char buf[IO_BUF];
    size_t pos, end;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

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

/* ---- a replica's connection ---------------------------------------------------------------- */

/* A connected socket (blocking, TCP_NODELAY), or -1 when the replica cannot be reached within
 * timeout_s. */
static int dial(const struct backend *b, double timeout_s)
{
    int fd = socket(b->ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)&b->ss, b->sl) != 0) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t el = sizeof err;
        if (errno != EINPROGRESS || poll(&p, 1, (int)(timeout_s * 1000)) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err != 0) {
            close(fd);
            return -1;
        }
    }
    int fl = fcntl(fd, F_GETFL), one = 1, idle = 5, intvl = 1, cnt = 3;
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* A replica whose machine went silent (no reset: a partition, a powered-off node) is given
     * up about 8 s after its last byte, so that a request waiting on it can go elsewhere; a live
     * replica's kernel answers the probes however long a prefill takes. */
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    struct timeval send_limit = {.tv_sec = 120}; /* a replica that stops taking a body */
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
    return fd;
}

static int send_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* More bytes from the replica into x->buf: > 0 read, 0 end of stream, -1 an error, the
 * router stopping, or the client gone (its socket hung up) - a relay then ends. A stream may be
 * silent for long (a long prefill), so there is no time limit here. */
static ssize_t fill(struct reply *x, double deadline)
{
    if (x->pos > 0 && x->pos == x->end) x->pos = x->end = 0;
    if (x->pos > 0 && x->end == sizeof x->buf) {
        memmove(x->buf, x->buf + x->pos, x->end - x->pos);
        x->end -= x->pos, x->pos = 0;
    }
    if (x->end == sizeof x->buf) return -1; /* a line longer than the buffer */
    for (;;) {
        struct pollfd p[2] = {{.fd = x->fd, .events = POLLIN}, {.fd = x->client_fd, .events = POLLRDHUP}};
        int np = x->client_fd >= 0 ? 2 : 1;
        int k = poll(p, (nfds_t)np, 200);
        if (k < 0 && errno != EINTR) return -1;
        if ((x->r && atomic_load(&x->r->stop)) || (np == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
            x->client_gone = 1;
            return -1;
        }
        if (k > 0 && p[0].revents) {
            ssize_t n = recv(x->fd, x->buf + x->end, sizeof x->buf - x->end, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n > 0) x->end += (size_t)n;
            return n < 0 ? -1 : n;
        }
        if (deadline > 0 && now_s() > deadline) return -1;
    }
}

/* One CRLF-ended line of the body's chunk framing (without the CRLF) into line; -1 when the
 * stream ends or breaks first. */
static int read_line(struct reply *x, char *line, size_t cap)
{
    for (;;) {
        char *nl = memchr(x->buf + x->pos, '\n', x->end - x->pos);
        if (nl) {
            size_t n = (size_t)(nl - (x->buf + x->pos));
            if (n > 0 && nl[-1] == '\r') n--;
            if (n >= cap) return -1;
            memcpy(line, x->buf + x->pos, n);
            line[n] = 0;
            x->pos = (size_t)(nl - x->buf) + 1;
            return 0;
        }
        if (fill(x, 0) <= 0) return -1;
    }
}

/* Up to max bytes of the body into out: > 0 bytes, 0 the body's end, -1 cut or malformed. */
static ssize_t body_read(struct reply *x, char *out, size_t max)
{
    for (;;) {
        if (x->chunked && x->chunk_state != 1) {
            char line[128];
            if (x->chunk_state == 3) return 0;
            if (read_line(x, line, sizeof line) != 0) return -1;
            if (x->chunk_state == 2) { /* the CRLF after a chunk's data */
                if (line[0]) return -1;
                x->chunk_state = 0;
                continue;
            }
            char *end;
            long long n = strtoll(line, &end, 16);
            if (end == line || n < 0 || (*end && *end != ';')) return -1;
            if (n == 0) { /* trailers until an empty line */
                do {
                    if (read_line(x, line, sizeof line) != 0) return -1;
                } while (line[0]);
                x->chunk_state = 3;
                return 0;
            }
            x->remaining = n, x->chunk_state = 1;
        }
        if (x->remaining == 0) return 0;
        if (x->pos == x->end) {
            ssize_t k = fill(x, 0);
            if (k == 0 && x->remaining < 0 && !x->chunked) return 0; /* to EOF: ended */
            if (k <= 0) return -1;
        }
        size_t n = x->end - x->pos;
        if (n > max) n = max;
        if (x->remaining >= 0 && (long long)n > x->remaining) n = (size_t)x->remaining;
        memcpy(out, x->buf + x->pos, n);
        x->pos += n;
        if (x->remaining > 0) x->remaining -= (long long)n;
        if (x->chunked && x->remaining == 0) x->chunk_state = 2;
        return (ssize_t)n;
    }
}

static void reply_free(struct reply *x)
{
    if (!x) return;
    if (x->fd >= 0) close(x->fd);
    if (x->b) atomic_fetch_sub(&x->b->in_flight, 1);
    free(x->head);
    free(x);
}

/* A header line's value (case-insensitive name) in head, copied into v; 0 when absent. */
static int head_value(const char *head, const char *name, char *v, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = head; *p;) {
        const char *e = strstr(p, "\r\n");
        if (!e) break;
        if ((size_t)(e - p) > nl && !strncasecmp(p, name, nl) && p[nl] == ':') {
            const char *s = p + nl + 1;
            while (*s == ' ' || *s == '\t') s++;
            size_t n = (size_t)(e - s);
            if (n >= cap) n = cap - 1;
            memcpy(v, s, n);
            v[n] = 0;
            return 1;
        }
        p = e + 2;
    }
    return 0;
}

/* The response head: status code and header lines, and the body's framing. 0, or -1 when the
 * replica ended or broke the connection first (nothing of the answer came). */
static int read_head(struct reply *x, int head_only)
{
    char *end;
    for (;;) {
        end = memmem(x->buf, x->end, "\r\n\r\n", 4);
        if (end) break;
        if (x->end >= sizeof x->buf || fill(x, now_s() + 3600) <= 0) return -1;
    }
    size_t head_len = (size_t)(end - x->buf) + 4;
    if (head_len < 16 || strncmp(x->buf, "HTTP/1.", 7) || x->buf[8] != ' ') return -1;
    x->code = atoi(x->buf + 9);
    if (x->code < 100 || x->code > 599) return -1;
    const char *lines = memchr(x->buf, '\n', head_len);
    size_t n = head_len - 2 - (size_t)(lines + 1 - x->buf);
    x->head = malloc(n + 1);
    if (!x->head) return -1;
    memcpy(x->head, lines + 1, n);
    x->head[n] = 0;
    x->pos = head_len;
    char v[64];
    x->remaining = -1;
    if (head_only || x->code == 204 || x->code == 304 || x->code < 200) x->remaining = 0;
    else if (head_value(x->head, "Transfer-Encoding", v, sizeof v) && strcasestr(v, "chunked")) x->chunked = 1;
    else if (head_value(x->head, "Content-Length", v, sizeof v)) {
        char *e;
        x->remaining = strtoll(v, &e, 10);
        if (*e || x->remaining < 0) return -1;
    }
    return 0;
}

int proxy_read_reply(int fd, int head_only, int *code, char **body, size_t *len)
{
    struct reply *x = calloc(1, sizeof *x);
    size_t cap = 4096, n = 0;
    char *p = malloc(cap);
    int rc = -1;
    if (!x || !p) goto out;
    x->fd = fd, x->client_fd = -1;
    if (read_head(x, head_only) != 0) goto out;
    for (;;) {
        if (cap - n < IO_BUF) {
            char *q = realloc(p, cap * 2);
            if (!q) goto out;
            p = q, cap *= 2;
        }
        ssize_t k = body_read(x, p + n, cap - n - 1);
        if (k < 0) goto out;
        if (k == 0) break;
        n += (size_t)k;
    }
    p[n] = 0;
    *code = x->code, *body = p, *len = n;
    p = NULL, rc = 0;
out:
    if (x) x->fd = -1; /* the caller's */
    reply_free(x);
    free(p);
    return rc;
}

/* ---- the request sent on --------------------------------------------------------------------- */

struct out_head {
    char *p;
    size_t len, cap;
    int oom;
};

static void out_add(struct out_head *h, const char *s, size_t n)
{
    if (h->oom) return;
    if (h->len + n + 1 > h->cap) {
        size_t cap = (h->len + n + 1) * 2;
        char *p = realloc(h->p, cap);
        if (!p) {
            h->oom = 1;
            return;
        }
        h->p = p, h->cap = cap;
    }
    memcpy(h->p + h->len, s, n);
    h->len += n;
    h->p[h->len] = 0;
}

static void out_str(struct out_head *h, const char *s) { out_add(h, s, strlen(s)); }

/* Headers that are one connection's (RFC 9110 7.6.1) or that the router writes itself. */
static int hop_header(const char *k)
{
    static const char *const hop[] = {"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding",
                                      "TE", "Trailer", "Upgrade", "Content-Length", "Host", "Expect",
                                      "Proxy-Authorization", "Proxy-Authenticate", "Date"};
    for (size_t i = 0; i < sizeof hop / sizeof hop[0]; i++)
        if (!strcasecmp(k, hop[i])) return 1;
    return 0;
}

static enum MHD_Result add_request_header(void *cls, enum MHD_ValueKind kind, const char *k, const char *v)
{
    (void)kind;
    struct out_head *h = cls;
    if (!hop_header(k) && strcasecmp(k, "X-Forwarded-For")) {
        out_str(h, k);
        out_str(h, ": ");
        out_str(h, v ? v : "");
        out_str(h, "\r\n");
    }
    return MHD_YES;
}

static void client_address(struct MHD_Connection *c, char *host, size_t cap)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *sa = ci ? ci->client_addr : NULL;
    snprintf(host, cap, "unknown");
    if (sa && sa->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, (socklen_t)cap);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, (socklen_t)cap);
}

/* The request's head as the replica gets it: the client's end-to-end headers, Host, the body's
 * Content-Length, Connection: close, X-Forwarded-For (the client's, after any it sent). */
static char *request_head(struct MHD_Connection *c, const char *method, const char *uri, const struct backend *b,
                          size_t body_len, size_t *len)
{
    struct out_head h = {0};
    char line[512], addr[64];
    out_str(&h, method);
    out_str(&h, " ");
    out_str(&h, uri);
    snprintf(line, sizeof line, " HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", b->host);
    out_str(&h, line);
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_request_header, &h);
    const char *xff = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Forwarded-For");
    client_address(c, addr, sizeof addr);
    out_str(&h, "X-Forwarded-For: ");
    if (xff) out_str(&h, xff), out_str(&h, ", ");
    out_str(&h, addr);
    snprintf(line, sizeof line, "\r\nContent-Length: %zu\r\n\r\n", body_len);
    out_str(&h, line);
    if (h.oom) {
        free(h.p);
        return NULL;
    }
    *len = h.len;
    return h.p;
}

/* ---- choosing replicas ----------------------------------------------------------------------- */

static uint64_t fnv1a(const char *s, uint64_t h)
{
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

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
            uint64_t h = fnv1a(idem, fnv1a(b->name, 14695981039346656037ull));
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
    struct out_head h = {0};
    char line[512];
    static const char *const help[][3] = {
        {"shardlm_router_replica_up", "gauge", "1 while the replica answers its health probe"},
        {"shardlm_router_replica_in_flight", "gauge", "requests of the router's on the replica now"},
        {"shardlm_router_replica_relayed_total", "counter", "answers relayed from the replica"},
        {"shardlm_router_replica_failures_total", "counter", "connections refused or cut before a response head, failed probes"},
    };
    for (int k = 0; k < 4; k++) {
        snprintf(line, sizeof line, "# HELP %s %s\n# TYPE %s %s\n", help[k][0], help[k][2], help[k][0], help[k][1]);
        out_str(&h, line);
        for (int i = 0; i < r->n; i++) {
            const struct backend *b = &r->b[i];
            unsigned long long v = k == 0   ? (unsigned long long)atomic_load(&b->up)
                                   : k == 1 ? (unsigned long long)atomic_load(&b->in_flight)
                                   : k == 2 ? atomic_load(&b->relayed)
                                            : atomic_load(&b->failures);
            snprintf(line, sizeof line, "%s{replica=\"%s\"} %llu\n", help[k][0], b->name, v);
            out_str(&h, line);
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
    out_str(&h, line);
    if (h.oom) return free(h.p), MHD_NO;
    enum MHD_Result ret = answer(c, 200, "text/plain; version=0.0.4", h.p, NULL);
    free(h.p);
    return ret;
}

static ssize_t relay_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    ssize_t n = body_read(cls, buf, max);
    if (n > 0) return n;
    return n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void relay_free(void *cls) { reply_free(cls); }

/* Relays x's answer (code, end-to-end headers, body as it comes); x is the response's now. */
static enum MHD_Result relay(struct MHD_Connection *c, struct reply *x)
{
    uint64_t size = !x->chunked && x->remaining >= 0 ? (uint64_t)x->remaining : MHD_SIZE_UNKNOWN;
    struct MHD_Response *rs = MHD_create_response_from_callback(size, IO_BUF, relay_read, x, relay_free);
    if (!rs) {
        reply_free(x);
        return MHD_NO;
    }
    for (char *p = x->head; *p;) {
        char *e = strstr(p, "\r\n"), *colon = memchr(p, ':', e ? (size_t)(e - p) : 0);
        if (!e) break;
        if (colon) {
            *colon = 0, *e = 0;
            const char *v = colon + 1;
            while (*v == ' ' || *v == '\t') v++;
            if (!hop_header(p)) MHD_add_response_header(rs, p, v);
        }
        p = e + 2;
    }
    atomic_fetch_add(&x->b->relayed, 1);
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
    int fd = dial(b, r->o.connect_timeout_s);
    if (fd < 0) {
        set_up(b, 0, "connection refused or timed out");
        return NULL;
    }
    size_t hl = 0;
    char *head = request_head(c, method, rc->uri, b, rc->len, &hl);
    struct reply *x = head ? calloc(1, sizeof *x) : NULL;
    if (!x) {
        free(head);
        close(fd);
        return NULL;
    }
    x->r = r, x->fd = fd, x->client_fd = connection_fd(c);
    /* A replica may answer and close before taking the whole body (a 413): its answer is read
     * even when sending failed. */
    (void)(send_all(fd, head, hl) == 0 && rc->len && send_all(fd, rc->body, rc->len));
    free(head);
    atomic_fetch_add(&b->in_flight, 1);
    x->b = b;
    if (read_head(x, !strcmp(method, "HEAD")) != 0) {
        *gone = x->client_gone;
        if (!x->client_gone) set_up(b, 0, "the connection ended before a response head");
        reply_free(x);
        return NULL;
    }
    set_up(b, 1, NULL);
    return x;
}

/* A 404 or 503 read whole so that the next replica can be asked: the body, or NULL when it is
 * over HELD_BODY_MAX or broken. */
static char *hold_body(struct reply *x, size_t *len)
{
    if (x->remaining > HELD_BODY_MAX) return NULL;
    size_t cap = 4096, n = 0;
    char *p = malloc(cap);
    for (ssize_t k; p; n += (size_t)k) {
        if (cap - n < 1024) {
            char *q = n + 1024 < HELD_BODY_MAX ? realloc(p, cap * 2) : NULL;
            if (!q) break;
            p = q, cap *= 2;
        }
        k = body_read(x, p + n, cap - n - 1);
        if (k == 0) {
            p[n] = 0;
            *len = n;
            return p;
        }
        if (k < 0) break;
    }
    free(p);
    return NULL;
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
            reply_free(held);
            free(held_body);
            return MHD_NO;
        }
        if (!x) {
            unreachable++;
            continue;
        }
        if (x->code == 404 || x->code == 503) {
            size_t len = 0;
            char *body = hold_body(x, &len);
            if (!body) { /* over HELD_BODY_MAX or cut: not an answer to relay, part of it read */
                reply_free(x);
                continue;
            }
            reply_free(held);
            free(held_body);
            held = x, held_body = body, held_len = len;
            continue;
        }
        reply_free(held);
        free(held_body);
        if (idem && x->code < 500) sticky_put(r, idem, order[k]);
        return relay(c, x);
    }
    if (!held || (unreachable && lookup && held->code == 404)) {
        reply_free(held);
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
        reply_free(held);
        free(held_body);
        return MHD_NO;
    }
    char v[256];
    if (head_value(held->head, "Content-Type", v, sizeof v)) MHD_add_response_header(rs, MHD_HTTP_HEADER_CONTENT_TYPE, v);
    if (head_value(held->head, "Retry-After", v, sizeof v)) MHD_add_response_header(rs, MHD_HTTP_HEADER_RETRY_AFTER, v);
    if (held->code == 503) atomic_fetch_add(&r->unavailable, 1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)held->code, rs);
    MHD_destroy_response(rs);
    reply_free(held);
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

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode t)
{
    (void)c, (void)socket_context;
    struct proxy *r = cls;
    atomic_fetch_add(&r->connections, t == MHD_CONNECTION_NOTIFY_STARTED ? 1 : -1);
}

/* ---- the probe thread ------------------------------------------------------------------------ */

/* GET /health on one replica: 1 when it answers 200. */
static int probe(struct proxy *r, struct backend *b)
{
    int fd = dial(b, r->o.connect_timeout_s);
    if (fd < 0) return 0;
    char req[512];
    int n = snprintf(req, sizeof req, "GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", b->host);
    struct reply *x = calloc(1, sizeof *x);
    if (!x) return close(fd), 0;
    x->r = r, x->fd = fd, x->client_fd = -1;
    int ok = send_all(fd, req, (size_t)n) == 0;
    double deadline = now_s() + r->o.connect_timeout_s;
    while (ok && !memmem(x->buf, x->end, "\r\n\r\n", 4)) ok = x->end < sizeof x->buf && fill(x, deadline) > 0;
    ok = ok && !strncmp(x->buf, "HTTP/1.", 7) && x->end > 12 && atoi(x->buf + 9) == 200;
    reply_free(x);
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
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, r, MHD_OPTION_END);
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
        double until = now_s() + r->o.drain_timeout_s;
        while (in_flight(r) > 0 && now_s() < until) usleep(20000);
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
