/* engine/serving/router_msg.h - the messages between rank 0's router and the replicas' leaders
 * (private to router.c and router_agent.c): their types, fixed heads, and a codec that writes
 * and reads fields 8-byte aligned, so that arrays are read in place.
 * Not here: sending them (parallel_msg_* through router_send_to), what they mean (router.c,
 * router_agent.c). Tests: tests/test_engine.c (--dp) and tests/test_serve_mpi.sh.
 * Threads: a wbuf or rbuf belongs to one thread; nothing here is shared. */
#ifndef SHARDLM_ROUTER_MSG_H
#define SHARDLM_ROUTER_MSG_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

enum msg_type {
    MSG_SUBMIT = 1, MSG_CANCEL, MSG_DRAIN, MSG_SHUTDOWN,       /* rank 0 -> leader */
    MSG_EVENT, MSG_REJECT, MSG_STATS, MSG_DRAINED, MSG_FATAL, /* leader -> rank 0 */
};

static inline void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* ---- message buffers ------------------------------------------------------------------------ */

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

struct event_head {
    uint32_t type, kind;
    uint64_t handle, seed, text_len;
    int32_t  sample, n_tokens, has_logprobs, n_top, finish, status;
    int32_t  prompt_tokens, completion_tokens, cached_prompt_tokens, pad;
    double   queue_seconds;
};

struct submit_head {
    uint32_t type;
    int32_t  n_prompt;
    uint64_t handle;
    double   deadline_in;         /* seconds left, < 0: none */
    struct request_params p;      /* pointers meaningless: the arrays follow */
};

struct status_head {
    uint32_t type;
    int32_t  status;
    uint64_t handle;
};

/* The shape of CANCEL, DRAIN, SHUTDOWN, REJECT, DRAINED and FATAL: a header, a number and a
 * text (unused fields zero or empty). */
static inline int get_plain(struct rbuf *rb, struct status_head *h, double *value, const char **text)
{
    if (!get_copy(rb, h, sizeof *h) || !get_copy(rb, value, sizeof *value)) return 0;
    *text = get_str(rb);
    return !rb->bad;
}

#endif
