/* tests/test_proxy.c - the router's reading of a replica's answer (server/proxy.c,
 * proxy_read_reply, the code each relay runs): a head, then the body unframed from
 * Content-Length, chunked (extensions, trailers, chunks split across reads) or end-of-stream
 * framing; answers that are cut or malformed are refused (-1), never relayed as whole. Each
 * answer is written into a socket pair by a thread (bodies larger than the socket's buffer,
 * a byte at a time for one case) and read back from the other end.
 * Usage: test_proxy. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "proxy.h"

struct writer {
    int fd;
    const char *data;
    size_t len;
    int bytewise;
};

static void *write_all(void *arg)
{
    struct writer *w = arg;
    for (size_t at = 0; at < w->len;) {
        ssize_t k = write(w->fd, w->data + at, w->bytewise ? 1 : w->len - at);
        if (k <= 0) break;
        at += (size_t)k;
    }
    close(w->fd);
    return NULL;
}

/* proxy_read_reply over `wire`: its result, the code and the body. */
static int read_wire(const char *wire, size_t n, int head_only, int bytewise, int *code, char **body, size_t *len)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return -2;
    struct writer w = {sv[1], wire, n, bytewise};
    pthread_t t;
    pthread_create(&t, NULL, write_all, &w);
    *body = NULL;
    int rc = proxy_read_reply(sv[0], head_only, code, body, len);
    pthread_join(t, NULL);
    close(sv[0]);
    return rc;
}

static void expect_body(const char *what, const char *wire, int head_only, int want_code, const char *want)
{
    for (int bytewise = 0; bytewise < 2; bytewise++) {
        int code = 0;
        char *body;
        size_t len = 0;
        int rc = read_wire(wire, strlen(wire), head_only, bytewise, &code, &body, &len);
        check(rc == 0 && code == want_code && len == strlen(want) && !memcmp(body, want, len),
              "%s%s: rc %d, code %d, body \"%.40s\" (%zu bytes)", what, bytewise ? " (a byte per write)" : "", rc, code,
              rc == 0 ? body : "", len);
        free(body);
    }
}

static void expect_refused(const char *what, const char *wire)
{
    int code = 0;
    char *body;
    size_t len;
    int rc = read_wire(wire, strlen(wire), 0, 0, &code, &body, &len);
    check(rc == -1, "%s: refused (rc %d)", what, rc);
    if (rc == 0) free(body);
}

int main(void)
{
    expect_body("Content-Length", "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello", 0, 200,
                "hello");
    expect_body("Content-Length, more bytes after it (not the body's)",
                "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}garbage", 0, 404, "{}");
    expect_body("chunked, an extension and a trailer",
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;name=x\r\nhello\r\n6\r\n world\r\n0\r\n"
                "X-Trailer: 1\r\n\r\n",
                0, 200, "hello world");
    expect_body("chunked, upper-case hex sizes", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n",
                0, 200, "0123456789");
    expect_body("to the end of the stream", "HTTP/1.0 200 OK\r\nX: y\r\n\r\nabc", 0, 200, "abc");
    expect_body("HEAD: a Content-Length and no body", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 1, 200, "");
    expect_body("204: no body", "HTTP/1.1 204 No Content\r\n\r\n", 0, 204, "");
    expect_refused("Content-Length cut short", "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc");
    expect_refused("a chunk cut short", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel");
    expect_refused("no last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    expect_refused("a chunk size that is not hex", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n");
    expect_refused("a negative chunk size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n");
    expect_refused("chunk data longer than its size", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n");
    expect_refused("a head never ended", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n");
    expect_refused("not HTTP/1.x", "HTTP/2 200\r\n\r\n");
    expect_refused("a status out of range", "HTTP/1.1 999 What\r\n\r\n");
    expect_refused("a Content-Length that is not a number", "HTTP/1.1 200 OK\r\nContent-Length: 5x\r\n\r\nhello");
    expect_refused("nothing", "");

    /* A body far larger than the socket's buffer and the relay's, in many chunks. */
    size_t n = 3u << 20, chunk = 1000;
    char *want = malloc(n + 1), *wire = malloc(n * 2 + 4096);
    for (size_t i = 0; i < n; i++) want[i] = (char)('a' + (i * 7) % 26);
    want[n] = 0;
    size_t w = (size_t)sprintf(wire, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (size_t at = 0; at < n; at += chunk) {
        size_t k = n - at < chunk ? n - at : chunk;
        w += (size_t)sprintf(wire + w, "%zx\r\n", k);
        memcpy(wire + w, want + at, k);
        w += k;
        w += (size_t)sprintf(wire + w, "\r\n");
    }
    w += (size_t)sprintf(wire + w, "0\r\n\r\n");
    int code;
    char *body;
    size_t len;
    int rc = read_wire(wire, w, 0, 0, &code, &body, &len);
    check(rc == 0 && len == n && !memcmp(body, want, n), "3 MiB in 1000-byte chunks: rc %d, %zu bytes back", rc, len);
    if (rc == 0) free(body);
    free(want);
    free(wire);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
