/* engine/parallel/parallel_mpi.h - what the MPI files of the parallel runtime share (parallel.c,
 * parallel_comm.c, parallel_msg.c), and nothing outside engine/parallel/ sees: the world's MPI
 * state, the one place an MPI error becomes a status (parallel_mpi_fail, MPI_TRY), and the
 * wait that turns a hung peer into STATUS_UNAVAILABLE (parallel_mpi_wait).
 * Not here: NCCL (parallel_nccl.c). Tests: tests/test_parallel.c. */
#ifndef SHARDLM_PARALLEL_MPI_H
#define SHARDLM_PARALLEL_MPI_H

#include <mpi.h>
#include <pthread.h>

#include "parallel.h"

#define MODULE "parallel"

/* A message posted by parallel_msg_send and not yet known to be delivered. */
struct pending_send {
    MPI_Request req;
    void  *buf;        /* owned: freed once the send completes */
    double posted;     /* base_now_s() when posted */
};

/* The world's MPI state (struct parallel_world.impl). */
struct world_impl {
    MPI_Comm comm;     /* a duplicate of MPI_COMM_WORLD: agree, bcast_bytes, barrier, splits */
    MPI_Comm msgs;     /* another duplicate: parallel_msg_* (top-level worlds only) */
    int owns_mpi;      /* MPI_Init_thread was called here, so MPI_Finalize is ours too */
    int n_abandoned;   /* operations left pending by a timeout: MPI_Finalize would wait on them */
    int mpi_failed;    /* an MPI call returned an error */
    struct world_impl *parent; /* a sub-world's parent (its failures count there too) */
    struct parallel_watch *watch; /* the job's heartbeats (the top-level world's only):
                                     parallel_watch.c */
    pthread_mutex_t send_mu;   /* pending sends: any thread may post, any may progress */
    struct pending_send *sends; /* (cap_sends), n_sends of them */
    size_t cap_sends;
    int n_sends;
};

/* The one place an MPI error code becomes a status: names the call (up to its '(') and the
 * group, with MPI's own text; marks the world (and its parents) failed. */
enum status parallel_mpi_fail(struct parallel_world *w, int rc, const char *call, const char *group);

/* Returns from the calling function with parallel_mpi_fail's status when the MPI call fails. */
#define MPI_TRY(w, group, call)                                                                 \
    do {                                                                                        \
        int mpi_try_rc_ = (call);                                                               \
        if (mpi_try_rc_ != MPI_SUCCESS) return parallel_mpi_fail((w), mpi_try_rc_, #call, (group)); \
    } while (0)

/* STATUS_OK, or STATUS_UNAVAILABLE with the first failure once the world is broken. */
enum status parallel_world_usable(const struct parallel_world *w);

/* Completes *req. Without a timeout this is MPI_Wait. With one, it polls MPI_Test (yielding the
 * core after a short spin: ranks may share cores) until the deadline, then leaves the request
 * pending (MPI cannot cancel a collective), marks the world broken and fails. st may be NULL. */
enum status parallel_mpi_wait(struct parallel_world *w, MPI_Request *req, MPI_Status *st,
                              const char *what, const char *group);

/* n as MPI's int count, or STATUS_UNSUPPORTED when it does not fit. */
enum status parallel_mpi_int_count(size_t n, const char *what, const char *group, int *out);

/* The MPI communicator of a group (parallel_comm.c). Takes ownership of mc (MPI_COMM_NULL: a
 * group of one without MPI). */
enum status parallel_mpi_comm_wrap(struct parallel_world *w, const char *name, MPI_Comm mc,
                                   struct comm **out);

#endif
