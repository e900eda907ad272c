/* engine/serving/router_msg.h - the messages between rank 0's router and the replicas' leaders
 * (private to router.c and router_agent.c): their types and fixed heads, written and read with
 * kernels/base/codec.h.
 * Not here: sending them (parallel_msg_* through router_send_to), what they mean (router.c,
 * router_agent.c). Tests: tests/test_engine.c (--dp) and tests/test_serve_mpi.sh.
 * Threads: a wbuf or rbuf belongs to one thread; nothing here is shared. */
#ifndef SHARDLM_ROUTER_MSG_H
#define SHARDLM_ROUTER_MSG_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "codec.h"
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

struct event_head {
    uint32_t type, kind;
    uint64_t handle, seed, text_len;
    int32_t  sample, n_tokens, has_logprobs, n_top, finish, status;
    int32_t  prompt_tokens, completion_tokens, cached_prompt_tokens, has_rng;
    double   queue_seconds;
    uint64_t rng[4];              /* engine_event.rng when has_rng */
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
