/* server/http_guard.c - who may hold an HTTP connection, and for how long before its request is
 * read: the defences against clients that take slots without asking anything (issue 35,
 * defects 3 and 4: 256 connections sending headers a byte at a time shut every other client
 * out, since libmicrohttpd's timeout is an idle timeout).
 *
 *   - every connection is a slot, opened when libmicrohttpd accepts the socket and closed when
 *     it lets it go; a slot over --http-max-connections, or over
 *     --http-max-connections-per-address from one peer address, is admitted only to be answered
 *     503 (http.c, when its headers are in) and closed;
 *   - a deadline per phase: HEADERS (from the accept, or from the end of the previous response
 *     on a kept-alive connection, to the end of the request's headers) and BODY (from there to
 *     the body's last byte); HANDLING (the engine works, a stream is sent) has none. A watchdog
 *     thread shuts down the socket of a slot past its deadline, which wakes the connection's
 *     thread with an end of file: libmicrohttpd then closes it.
 *
 * The watchdog works on a duplicate of the socket's descriptor that the slot owns, so that it
 * can never shut down a descriptor number that libmicrohttpd has closed and the kernel has
 * given to a new connection.
 * Not here: the checks made once the headers are in (route, method, API key, content type and
 * length, in http.c before any body byte is read).
 * Tests: tests/server/test_http.py (group guard). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netdb.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http_internal.h"

#define GUARD_TICK_MS 100 /* how often the watchdog looks at the deadlines */
#define HTTP_GUARD_REFUSED_PER_ADDR 8 /* refused connections one address keeps waiting for their 503 */

struct http_slot {
    struct http_slot *prev, *next;
    int               fd;            /* our duplicate of the socket, -1 if dup failed */
    char              addr[64];      /* the peer's address, without port */
    enum http_phase   phase;
    double            t_phase;       /* base_now_s() when the phase began */
    const char       *refused;       /* NULL: admitted; else why it is answered 503 */
    int               cut;           /* the watchdog shut it down */
};

struct http_guard {
    pthread_mutex_t   mu;            /* guards the list, the counts and every slot's phase */
    pthread_cond_t    cv;
    struct http_slot *head;
    int               n_admitted;
    double            header_s, body_s, send_s;
    int               max_conn, max_per_addr; /* max_per_addr 0: no cap */
    int               stop;
    pthread_t         thread;
    long long         n_cut, n_refused; /* for the log */
};

static void peer_address(const struct sockaddr *sa, char *out, size_t cap)
{
    snprintf(out, cap, "?");
    if (sa && sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, out, (socklen_t)cap);
    else if (sa && sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, out, (socklen_t)cap);
}

static void *watchdog(void *arg)
{
    struct http_guard *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += GUARD_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
        double now = base_now_s();
        for (struct http_slot *s = g->head; s; s = s->next) {
            if (s->cut || s->fd < 0 || s->phase == HTTP_PHASE_HANDLING) continue;
            double limit = s->phase == HTTP_PHASE_HEADERS ? g->header_s : g->body_s;
            if (now - s->t_phase <= limit) continue;
            shutdown(s->fd, SHUT_RDWR);
            s->cut = 1;
            g->n_cut++;
            LOG_INFO("http", "closed a connection from %s: its request %s took more than %.0f s (%lld so far)", s->addr,
                     s->phase == HTTP_PHASE_HEADERS ? "headers" : "body", limit, g->n_cut);
        }
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

enum status http_guard_start(double header_s, double body_s, double send_s, int max_conn, int max_per_addr,
                             struct http_guard **out)
{
    *out = NULL;
    struct http_guard *g = calloc(1, sizeof *g);
    if (!g) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->header_s = header_s;
    g->body_s = body_s;
    g->send_s = send_s;
    g->max_conn = max_conn;
    g->max_per_addr = max_per_addr;
    if (pthread_create(&g->thread, NULL, watchdog, g)) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        free(g);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cannot start the HTTP connection watchdog");
    }
    *out = g;
    return STATUS_OK;
}

void http_guard_stop(struct http_guard *g)
{
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->stop = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    /* libmicrohttpd has stopped: every slot was closed through http_guard_close. */
    CHECK(!g->head, "HTTP connection slots left after the daemon stopped");
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

/* A peer that vanished without a FIN or a reset (a host or a NAT gone) is found within about a
 * minute, not TCP's 15 of retransmissions: keepalive probes after 20 s idle (3, 5 s apart), and
 * sent data unacknowledged, or not taken by a client whose window stays shut, for send_s seconds
 * (--send-timeout, 60 by default) ends the connection (TCP_USER_TIMEOUT, as nginx's send_timeout:
 * a client that stops reading is gone too; send_s 0: not set). Until then a journaled request's
 * reattaching client is refused (409: its old connection still reads it). */
static void keep_alive(int fd, double send_s)
{
    const int on = 1, idle = 20, intvl = 5, cnt = 3;
    const unsigned timeout_ms = (unsigned)(send_s * 1000.0 + 0.5);
    if (fd < 0) return;
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    if (timeout_ms > 0) (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout_ms, sizeof timeout_ms);
}

struct http_slot *http_guard_open(struct http_guard *g, int fd, const struct sockaddr *peer)
{
    struct http_slot *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    keep_alive(fd, g->send_s);
    s->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    peer_address(peer, s->addr, sizeof s->addr);
    s->phase = HTTP_PHASE_HEADERS;
    s->t_phase = base_now_s();
    pthread_mutex_lock(&g->mu);
    int same = 0, same_refused = 0;
    for (struct http_slot *o = g->head; o; o = o->next)
        if (!strcmp(o->addr, s->addr)) same += !o->refused, same_refused += o->refused != NULL;
    if (g->n_admitted >= g->max_conn) s->refused = "the server has as many HTTP connections as it takes (--http-max-connections)";
    else if (g->max_per_addr > 0 && same >= g->max_per_addr) {
        s->refused = "this address has as many HTTP connections open as one address may (--http-max-connections-per-address)";
        /* A refused connection is answered 503 once its headers come (or cut at their deadline):
         * until then it holds one of libmicrohttpd's connections, whose limit counts refused ones
         * too. An address past its cap keeps HTTP_GUARD_REFUSED_PER_ADDR of those; the rest are
         * shut at once, unanswered, so that one address's idle sockets cannot fill the daemon
         * and lock every other client out. */
        if (same_refused >= HTTP_GUARD_REFUSED_PER_ADDR && s->fd >= 0) shutdown(s->fd, SHUT_RDWR);
    }
    if (s->refused) g->n_refused++;
    else g->n_admitted++;
    s->next = g->head;
    if (g->head) g->head->prev = s;
    g->head = s;
    pthread_mutex_unlock(&g->mu);
    return s;
}

void http_guard_close(struct http_guard *g, struct http_slot *s)
{
    if (!s) return;
    pthread_mutex_lock(&g->mu);
    if (s->prev) s->prev->next = s->next;
    else g->head = s->next;
    if (s->next) s->next->prev = s->prev;
    if (!s->refused) g->n_admitted--;
    pthread_mutex_unlock(&g->mu);
    if (s->fd >= 0) close(s->fd);
    free(s);
}

const char *http_guard_refusal(const struct http_slot *s) { return s ? s->refused : NULL; }

void http_guard_phase(struct http_guard *g, struct http_slot *s, enum http_phase p)
{
    if (!s) return;
    pthread_mutex_lock(&g->mu);
    s->phase = p;
    s->t_phase = base_now_s();
    pthread_mutex_unlock(&g->mu);
}

enum status http_parse_address(const char *addr, struct sockaddr_storage *ss, socklen_t *sl, char *host, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    const char *port = colon ? colon + 1 : addr;
    size_t hn = colon ? (size_t)(colon - addr) : 0;
    if (hn >= 2 && addr[0] == '[' && addr[hn - 1] == ']') addr++, hn -= 2;
    if (hn >= cap) return status_errorf(STATUS_INVALID_ARGUMENT, "--http %s: host name too long", addr);
    memcpy(host, addr, hn);
    host[hn] = 0;
    if (!hn) snprintf(host, cap, "127.0.0.1");
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) return status_errorf(STATUS_INVALID_ARGUMENT, "--http %s: %s", addr, gai_strerror(rc));
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sl = res->ai_addrlen;
    freeaddrinfo(res);
    return STATUS_OK;
}
