/* server/proxy_internal.h - what the router's two files share (proxy.h):
 *   proxy.c       the replicas, choosing one, forwarding and relaying, the front's callbacks, the
 *                 probes, start and stop
 *   proxy_wire.c  one replica's connection: dialing, the request's head as sent on, the answer's
 *                 head and body read back (Content-Length, chunked or to the end)
 * Nothing outside these two files includes it. Tests: tests/test_proxy.c, tests/fuzz/fuzz_proxy_reply.c,
 * tests/server/test_router.py. */
#ifndef SHARDLM_PROXY_INTERNAL_H
#define SHARDLM_PROXY_INTERNAL_H

#include <microhttpd.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#define PROXY_IO_BUF (16 << 10)
#define PROXY_HELD_BODY_MAX (1 << 20) /* a 404 / 503 kept while the next replica is asked */

/* A replica's answer being read: the socket, its buffered bytes, the body's framing. */
struct reply {
    const atomic_int *stop;         /* the router stopping (NULL: never): a read ends */
    atomic_int *in_flight;          /* the replica's count of requests on it, decremented when freed */
    int backend;                    /* the replica's index (proxy.c) */
    int fd, client_fd;              /* client_fd: the client's socket, watched for a hang-up (-1: none) */
    int code;
    char *head;                     /* the head's header lines (NUL-terminated, CRLF each) */
    int chunked;
    long long remaining;            /* Content-Length bytes (or the chunk's) left; -1: to EOF */
    int chunk_state;                /* chunked: 0 size line next, 1 data, 2 its CRLF, 3 done */
    int client_gone;                /* proxy_fill saw the client hang up (or the router stop) */
    char buf[PROXY_IO_BUF];
    size_t pos, end;
};

/* A growing NUL-terminated text (oom set on a failed allocation, then it stays as it was). */
struct proxy_text {
    char *p;
    size_t len, cap;
    int oom;
};
void proxy_text_add(struct proxy_text *h, const char *s, size_t n);
void proxy_text_str(struct proxy_text *h, const char *s);

double proxy_now_s(void);
/* A connected socket (blocking, TCP_NODELAY, keepalive ~8 s, sends time out after 120 s), or -1
 * when the address cannot be reached within timeout_s. */
int proxy_dial(const struct sockaddr_storage *ss, socklen_t sl, double timeout_s);
int proxy_send_all(int fd, const char *p, size_t n);
/* More bytes into x->buf: > 0 read, 0 end of stream, -1 an error, past deadline (> 0), the router
 * stopping or the client gone (x->client_gone). */
ssize_t proxy_fill(struct reply *x, double deadline);
/* The head (status code, header lines, the body's framing; head_only: no body): 0, or -1 when the
 * connection ended or broke first, or no byte came for wait_s seconds. */
int proxy_read_head(struct reply *x, int head_only, double wait_s);
/* Up to max bytes of the body: > 0 bytes, 0 its end, -1 cut or malformed. */
ssize_t proxy_body_read(struct reply *x, char *out, size_t max);
/* The whole body when it is at most PROXY_HELD_BODY_MAX (malloc'd, NUL-terminated), else NULL. */
char *proxy_hold_body(struct reply *x, size_t *len);
/* Closes x's socket, gives back its in_flight count, frees it (NULL: nothing). */
void proxy_reply_free(struct reply *x);
/* A header's value (case-insensitive name) in head, copied into v; 0 when absent. */
int proxy_head_value(const char *head, const char *name, char *v, size_t cap);
/* Headers that are one connection's (RFC 9110 7.6.1) or that the router writes itself. */
int proxy_hop_header(const char *k);
/* The request's head as the replica at host gets it (malloc'd, *len bytes), NULL when out of memory. */
char *proxy_request_head(struct MHD_Connection *c, const char *method, const char *uri, const char *host,
                         size_t body_len, size_t *len);

#endif
