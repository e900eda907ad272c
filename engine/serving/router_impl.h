/* engine/serving/router_impl.h - the state of data-parallel serving shared by rank 0's router
 * (router.c) and the leaders' agent (router_agent.c); private to those two files.
 * Not here: the public contract (router.h), the message formats (router_msg.h).
 * Tests: tests/test_engine.c (--dp), tests/test_serve_mpi.sh.
 * Threads: fields are guarded by mu unless a comment says which one thread owns them. */
#ifndef SHARDLM_ROUTER_IMPL_H
#define SHARDLM_ROUTER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "conductor.h"
#include "parallel.h"
#include "request.h"
#include "router.h"
#include "router_msg.h"

#define MODULE "router"
#define ROUTE_BUCKETS 1024
#define PREFIX_SLOTS 16384      /* prompt-prefix hash -> replica, direct-mapped */
#define PREFIX_MAX_BLOCKS 256   /* leading blocks of a prompt that routing looks at */
#define STATS_PERIOD_S 0.2      /* leaders report (and prove they are alive) this often */
#define IDLE_WAIT_NS 500000     /* a polling loop with nothing to do sleeps this long */

enum role { ROLE_FRONT, ROLE_LEADER, ROLE_WORKER };

/* ---- state ---------------------------------------------------------------------------------- */

struct router;

struct route { /* rank 0: one request routed to a replica */
    struct router *r;
    uint64_t handle;              /* rank 0's handle: what the caller sees */
    uint64_t inner;               /* replica 0: its engine's handle */
    int      replica;
    int      n, live;             /* samples, and those not yet finished */
    int      submitted;           /* handed to its replica (the failure path skips it before) */
    int      cancel_pending;      /* cancelled before it was handed over: router_submit forwards it */
    unsigned char done[16];       /* sample finished (n <= 16: engine_validate) */
    engine_event_fn on_event;
    void    *ctx;
    char     id[REQUEST_ID_MAX_BYTES + 1];
    struct route *next;           /* hash chain */
};

struct replica { /* rank 0's view of one replica */
    int      leader;              /* world rank */
    int      outstanding;         /* samples routed and not finished */
    uint64_t routed, routed_by_prefix;
    struct engine_stats stats;    /* its last report (replica 0: unused) */
    double   heard;               /* when it last sent anything */
    double   stats_at;
    int      drained;
};

struct remote_req { /* a leader: one request of rank 0's, on this replica's engine */
    struct router *r;
    uint64_t outer, inner;
    int      live;
    struct remote_req *next;
};

struct outmsg {
    void  *buf;
    size_t n;
    struct outmsg *next;
};

struct prefix_slot {
    uint64_t hash;
    int32_t  replica;
};

struct router {
    struct engine_options o;
    struct parallel_world *world;     /* borrowed: the whole world */
    struct parallel_world *sub;       /* owned: this rank's replica */
    struct parallel_layout layout;
    int    dp, role, block_tokens;
    struct conductor *local;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    /* front */
    struct replica *rep;
    struct route *buckets[ROUTE_BUCKETS];
    uint64_t next_handle;
    int      rr;                       /* ties go round robin */
    struct prefix_slot *prefix;
    int      draining, failed;
    char     failure[512];
    enum status fail_status;
    int      fatal_pending;            /* set by any thread; the router thread acts on it */
    pthread_t thread;
    int      thread_running;
    atomic_int stop_thread;
    /* leader */
    struct remote_req *reqs;
    struct outmsg *out_head, *out_tail;
    int      shutdown, local_fatal;
    int      n_done_reqs;              /* remote_reqs finished since the agent last pruned */
    pthread_t drain_thread;
    int      drain_started;
    atomic_int drain_done;
    double   drain_timeout;
};

/* Sends a finished wbuf to a rank of the whole world (frees its buffer either way). */
enum status router_send_to(struct router *r, int rank, struct wbuf *b);
/* CANCEL, DRAIN, SHUTDOWN, REJECT, DRAINED and FATAL: a header, a number and a text. */
enum status router_send_plain(struct router *r, int rank, uint32_t type, uint64_t handle, int32_t status,
                              const char *text, double value);
/* The on_fatal callback of this rank's conductor (any thread). */
void router_on_local_fatal(void *ctx, enum status st, const char *message);
/* A leader's agent loop (router_agent.c): until rank 0 sends SHUTDOWN or the world fails. */
enum status router_leader_run(struct router *r);

#endif
