/* server/proxy_wire.c - one replica's connection for `shardlm route` (proxy.h, proxy_internal.h):
 * dialing it, the request's head as sent on (the client's end-to-end headers, Host, Content-Length,
 * Connection: close, X-Forwarded-For), and its answer read back: the status line and headers,
 * then the body unframed from Content-Length, chunked (extensions, trailers) or end-of-stream
 * framing, a chunk at a time, while watching the client's socket for a hang-up.
 * Not here: which replica, relaying, the front (proxy.c). Tests: tests/test_proxy.c,
 * tests/fuzz/fuzz_proxy_reply.c. */
#define _GNU_SOURCE /* memmem, strcasestr */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "proxy.h"
#include "proxy_internal.h"

double proxy_now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}


/* ---- a replica's connection ---------------------------------------------------------------- */

/* A connected socket (blocking, TCP_NODELAY), or -1 when the replica cannot be reached within
 * timeout_s. */
int proxy_dial(const struct sockaddr_storage *ss, socklen_t sl, double timeout_s)
{
    int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -1;
    if (connect(fd, (const struct sockaddr *)ss, sl) != 0) {
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

int proxy_send_all(int fd, const char *p, size_t n)
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
ssize_t proxy_fill(struct reply *x, double deadline)
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
        if ((x->stop && atomic_load(x->stop)) || (np == 2 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR)))) {
            x->client_gone = 1;
            return -1;
        }
        if (k > 0 && p[0].revents) {
            ssize_t n = recv(x->fd, x->buf + x->end, sizeof x->buf - x->end, 0);
            if (n < 0 && errno == EINTR) continue;
            if (n > 0) x->end += (size_t)n;
            return n < 0 ? -1 : n;
        }
        if (deadline > 0 && proxy_now_s() > deadline) return -1;
    }
}

/* One CRLF-ended line of the body's chunk framing (without the CRLF) into line; -1 when the
 * stream ends or breaks first. */
static int wire_read_line(struct reply *x, char *line, size_t cap)
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
        if (proxy_fill(x, 0) <= 0) return -1;
    }
}

/* Up to max bytes of the body into out: > 0 bytes, 0 the body's end, -1 cut or malformed. */
ssize_t proxy_body_read(struct reply *x, char *out, size_t max)
{
    for (;;) {
        if (x->chunked && x->chunk_state != 1) {
            char line[128];
            if (x->chunk_state == 3) return 0;
            if (wire_read_line(x, line, sizeof line) != 0) return -1;
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
                    if (wire_read_line(x, line, sizeof line) != 0) return -1;
                } while (line[0]);
                x->chunk_state = 3;
                return 0;
            }
            x->remaining = n, x->chunk_state = 1;
        }
        if (x->remaining == 0) return 0;
        if (x->pos == x->end) {
            ssize_t k = proxy_fill(x, 0);
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

void proxy_reply_free(struct reply *x)
{
    if (!x) return;
    if (x->fd >= 0) close(x->fd);
    if (x->in_flight) atomic_fetch_sub(x->in_flight, 1);
    free(x->head);
    free(x);
}

/* A header line's value (case-insensitive name) in head, copied into v; 0 when absent. */
int proxy_head_value(const char *head, const char *name, char *v, size_t cap)
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
int proxy_read_head(struct reply *x, int head_only, double wait_s)
{
    char *end;
    for (;;) {
        end = memmem(x->buf, x->end, "\r\n\r\n", 4);
        if (end) break;
        if (x->end >= sizeof x->buf || proxy_fill(x, proxy_now_s() + wait_s) <= 0) return -1;
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
    else if (proxy_head_value(x->head, "Transfer-Encoding", v, sizeof v) && strcasestr(v, "chunked")) x->chunked = 1;
    else if (proxy_head_value(x->head, "Content-Length", v, sizeof v)) {
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
    if (proxy_read_head(x, head_only, 3600) != 0) goto out;
    for (;;) {
        if (cap - n < PROXY_IO_BUF) {
            char *q = realloc(p, cap * 2);
            if (!q) goto out;
            p = q, cap *= 2;
        }
        ssize_t k = proxy_body_read(x, p + n, cap - n - 1);
        if (k < 0) goto out;
        if (k == 0) break;
        n += (size_t)k;
    }
    p[n] = 0;
    *code = x->code, *body = p, *len = n;
    p = NULL, rc = 0;
out:
    if (x) x->fd = -1; /* the caller's */
    proxy_reply_free(x);
    free(p);
    return rc;
}

/* ---- the request sent on --------------------------------------------------------------------- */


void proxy_text_add(struct proxy_text *h, const char *s, size_t n)
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

void proxy_text_str(struct proxy_text *h, const char *s) { proxy_text_add(h, s, strlen(s)); }

/* Headers that are one connection's (RFC 9110 7.6.1) or that the router writes itself. */
int proxy_hop_header(const char *k)
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
    struct proxy_text *h = cls;
    if (!proxy_hop_header(k) && strcasecmp(k, "X-Forwarded-For")) {
        proxy_text_str(h, k);
        proxy_text_str(h, ": ");
        proxy_text_str(h, v ? v : "");
        proxy_text_str(h, "\r\n");
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
char *proxy_request_head(struct MHD_Connection *c, const char *method, const char *uri, const char *host,
                          size_t body_len, size_t *len)
{
    struct proxy_text h = {0};
    char line[512], addr[64];
    proxy_text_str(&h, method);
    proxy_text_str(&h, " ");
    proxy_text_str(&h, uri);
    snprintf(line, sizeof line, " HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", host);
    proxy_text_str(&h, line);
    MHD_get_connection_values(c, MHD_HEADER_KIND, add_request_header, &h);
    const char *xff = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Forwarded-For");
    client_address(c, addr, sizeof addr);
    proxy_text_str(&h, "X-Forwarded-For: ");
    if (xff) proxy_text_str(&h, xff), proxy_text_str(&h, ", ");
    proxy_text_str(&h, addr);
    snprintf(line, sizeof line, "\r\nContent-Length: %zu\r\n\r\n", body_len);
    proxy_text_str(&h, line);
    if (h.oom) {
        free(h.p);
        return NULL;
    }
    *len = h.len;
    return h.p;
}

/* A 404 or 503 read whole so that the next replica can be asked: the body, or NULL when it is
 * over PROXY_HELD_BODY_MAX or broken. */
char *proxy_hold_body(struct reply *x, size_t *len)
{
    if (x->remaining > PROXY_HELD_BODY_MAX) return NULL;
    size_t cap = 4096, n = 0;
    char *p = malloc(cap);
    for (ssize_t k; p; n += (size_t)k) {
        if (cap - n < 1024) {
            char *q = n + 1024 < PROXY_HELD_BODY_MAX ? realloc(p, cap * 2) : NULL;
            if (!q) break;
            p = q, cap *= 2;
        }
        k = proxy_body_read(x, p + n, cap - n - 1);
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

