/* kernels/base/codec.h - a byte codec for the project's own binary records: fields written and
 * read 8-byte aligned, so that arrays are read in place; a reader that runs short marks its
 * buffer bad instead of reading past it. Used by the data-parallel router's messages
 * (engine/serving/router_msg.h) and the stream journal's records (server/journal.c).
 * Not here: framing, checksums, what the fields mean (their users).
 * Tests: tests/test_engine.c (--dp), tests/server/test_journal.py.
 * Threads: a wbuf or rbuf belongs to one thread; nothing here is shared. */
#ifndef SHARDLM_CODEC_H
#define SHARDLM_CODEC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

struct wbuf {
    unsigned char *p;
    size_t n, cap;
    int oom;
};

static inline void put(struct wbuf *b, const void *x, size_t n)
{
    size_t padded = (n + 7) & ~(size_t)7;
    if (b->oom) return;
    if (base_grow((void **)&b->p, &b->cap, b->n + padded, 1) != 0) {
        b->oom = 1;
        return;
    }
    if (n) memcpy(b->p + b->n, x, n);
    memset(b->p + b->n + n, 0, padded - n);
    b->n += padded;
}

static inline void put_str(struct wbuf *b, const char *s)
{
    uint64_t n = s ? strlen(s) : 0;
    put(b, &n, sizeof n);
    put(b, s ? s : "", n + 1);
}

struct rbuf {
    const unsigned char *p;
    size_t n, off;
    int bad;
};

/* n bytes in place (8-byte aligned, since every put is), or NULL when the message is short. */
static inline const void *get(struct rbuf *b, size_t n)
{
    size_t padded = (n + 7) & ~(size_t)7;
    if (b->bad || padded < n || b->n - b->off < padded) {
        b->bad = 1;
        return NULL;
    }
    const void *x = b->p + b->off;
    b->off += padded;
    return x;
}

static inline int get_copy(struct rbuf *b, void *dst, size_t n)
{
    const void *x = get(b, n);
    if (x && n) memcpy(dst, x, n);
    return x != NULL;
}

static inline const char *get_str(struct rbuf *b)
{
    uint64_t n = 0;
    if (!get_copy(b, &n, sizeof n) || n > b->n) {
        b->bad = 1;
        return NULL;
    }
    const char *s = get(b, (size_t)n + 1);
    if (s && s[n] != '\0') b->bad = 1;
    return b->bad ? NULL : s;
}

#endif
