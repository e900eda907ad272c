/* tests/fuzz/fuzz_proxy_reply.c - a replica's answer as the router reads it (server/proxy.c,
 * proxy_read_reply): the input's first byte's low bit asks for a HEAD request's reading, the
 * rest is what the replica sends, written into a socket pair by a thread. An answer read whole
 * must have a code in 100..599 and a body no longer than the input, NUL-terminated; anything
 * else is refused without a crash or a leak. Corpus: tests/fuzz/corpus/proxy_reply
 * (tests/fuzz/make_seeds.py). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "proxy.h"

struct feed {
    int fd;
    const uint8_t *data;
    size_t size;
};

static void *feed_all(void *arg)
{
    struct feed *f = arg;
    for (size_t at = 0; at < f->size;) {
        ssize_t k = write(f->fd, f->data + at, f->size - at);
        if (k <= 0) break;
        at += (size_t)k;
    }
    close(f->fd);
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 0;
    struct feed f = {sv[1], data + 1, size - 1};
    pthread_t t;
    pthread_create(&t, NULL, feed_all, &f);
    int code = 0;
    char *body = NULL;
    size_t len = 0;
    int rc = proxy_read_reply(sv[0], data[0] & 1, &code, &body, &len);
    close(sv[0]); /* before the join: a writer blocked on a full buffer gets an error */
    pthread_join(t, NULL);
    if (rc == 0 && (code < 100 || code > 599 || len > size || body[len] != 0)) {
        fprintf(stderr, "proxy_read_reply accepted an answer it cannot have read: code %d, %zu bytes of %zu\n", code, len,
                size);
        abort();
    }
    free(body);
    return fuzz_report(rc == 0 ? 0 : 3);
}
