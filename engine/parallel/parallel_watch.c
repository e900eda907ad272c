/* engine/parallel/parallel_watch.c - heartbeats between every rank of a job, so that a timeout
 * can name the rank that stopped (parallel_watch_*, parallel.h). A thread per rank sends a
 * one-byte beat to every other rank every WATCH_BEAT_S on a communicator of its own (never
 * mixed with the collectives or parallel_msg_*) and notes when it last heard from each. A
 * stopped or dead rank falls silent while the live ones, blocked in the collective that waits
 * for it, keep beating: when the collective times out (parallel_mpi_wait, comm_synchronize), the
 * silent ranks are the ones that did not arrive. A collective itself cannot tell: MPI and NCCL
 * report completion, not who is missing.
 * Not here: the timed wait (parallel.c), the collectives (parallel_comm.c, parallel_nccl.c).
 * Tests: tests/test_serve_mpi.sh hang (serve_mpi_hang_rank names rank 1), tests/test_parallel.c
 * --hang (parallel_mpi2_hang). Notes: docs/parallel.md. */
#include "parallel.h"

#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel_mpi.h"

#define WATCH_BEAT_S 0.25
#define WATCH_SILENT_S 1.0 /* a live rank is heard from every WATCH_BEAT_S */
enum { WATCH_TAG = 23 };

struct parallel_watch {
    MPI_Comm comm;          /* a duplicate of the whole world's, for beats only */
    int rank, size;
    pthread_t thread;
    pthread_mutex_t lock;
    int stop;
    double *last;           /* (size): when each rank was last heard from */
    MPI_Request *sends;     /* (size): the beat in flight to each rank, or MPI_REQUEST_NULL */
    char out, in;           /* the beats' bytes (their content is not read) */
};

static struct world_impl *root_of(const struct parallel_world *w)
{
    struct world_impl *wi = w->impl;
    while (wi && wi->parent) wi = wi->parent;
    return wi;
}

static void *watch_main(void *arg)
{
    struct parallel_watch *pw = arg;
    double next = 0.0;
    for (;;) {
        pthread_mutex_lock(&pw->lock);
        const int stop = pw->stop;
        pthread_mutex_unlock(&pw->lock);
        if (stop) break;
        const double now = base_now_s();
        int ok = 1;
        if (now >= next) { /* a new beat to every rank whose previous one has gone out */
            for (int d = 0; d < pw->size && ok; d++) {
                if (d == pw->rank) continue;
                int done = 1;
                if (pw->sends[d] != MPI_REQUEST_NULL) ok = MPI_Test(&pw->sends[d], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS;
                if (ok && done) ok = MPI_Isend(&pw->out, 1, MPI_BYTE, d, WATCH_TAG, pw->comm, &pw->sends[d]) == MPI_SUCCESS;
            }
            next = now + WATCH_BEAT_S;
        }
        for (int got = 1; got && ok;) {
            MPI_Status s;
            ok = MPI_Iprobe(MPI_ANY_SOURCE, WATCH_TAG, pw->comm, &got, &s) == MPI_SUCCESS;
            if (!ok || !got) break;
            ok = MPI_Recv(&pw->in, 1, MPI_BYTE, s.MPI_SOURCE, WATCH_TAG, pw->comm, MPI_STATUS_IGNORE) == MPI_SUCCESS;
            pthread_mutex_lock(&pw->lock);
            pw->last[s.MPI_SOURCE] = base_now_s();
            pthread_mutex_unlock(&pw->lock);
        }
        if (!ok) break; /* MPI failed: the beats stop; the world's own calls report it */
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

enum status parallel_watch_start(struct parallel_world *w)
{
    struct world_impl *root = root_of(w);
    if (!w->mpi || !root || root->watch || w->broken) return STATUS_OK;
    if (!w->thread_multiple) {
        LOG_WARN(MODULE, "MPI lacks MPI_THREAD_MULTIPLE: a hung rank is detected but not named");
        return STATUS_OK;
    }
    struct parallel_watch *pw = calloc(1, sizeof *pw);
    if (!pw) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    pw->comm = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(root->comm, &pw->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(pw->comm, &pw->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(pw->comm, &pw->size);
    if (rc != MPI_SUCCESS) {
        free(pw);
        return parallel_mpi_fail(w, rc, "MPI_Comm_dup", "world");
    }
    pw->last = calloc((size_t)pw->size, sizeof *pw->last);
    pw->sends = calloc((size_t)pw->size, sizeof *pw->sends);
    if (!pw->last || !pw->sends) {
        free(pw->last);
        free(pw->sends);
        free(pw);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    }
    const double now = base_now_s();
    for (int i = 0; i < pw->size; i++) {
        pw->last[i] = now;
        pw->sends[i] = MPI_REQUEST_NULL;
    }
    pthread_mutex_init(&pw->lock, NULL);
    if (pthread_create(&pw->thread, NULL, watch_main, pw) != 0) {
        pthread_mutex_destroy(&pw->lock);
        free(pw->last);
        free(pw->sends);
        free(pw);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: cannot start the heartbeat thread");
    }
    root->watch = pw;
    return STATUS_OK;
}

void parallel_watch_stop(struct parallel_world *w)
{
    struct world_impl *root = w ? root_of(w) : NULL;
    struct parallel_watch *pw = root ? root->watch : NULL;
    if (!pw) return;
    pthread_mutex_lock(&pw->lock);
    pw->stop = 1;
    pthread_mutex_unlock(&pw->lock);
    pthread_join(pw->thread, NULL);
    root->watch = NULL;
    /* Beats are one byte (sent eagerly): give the last ones a moment, and leave any that a
     * silent peer never takes to the broken world's exit without MPI_Finalize. */
    int pending = 0;
    for (int i = 0; i < 100; i++) {
        pending = 0;
        for (int d = 0; d < pw->size; d++) {
            int done = 1;
            if (pw->sends[d] != MPI_REQUEST_NULL && MPI_Test(&pw->sends[d], &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
                done = 0;
            pending += !done;
        }
        if (!pending) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (pending) root->n_abandoned++;
    /* Beats that arrived and were never taken are dropped with the communicator. */
    if (!pending && !w->broken) MPI_Comm_free(&pw->comm);
    pthread_mutex_destroy(&pw->lock);
    free(pw->last);
    free(pw->sends);
    free(pw);
}

size_t parallel_watch_silent(const struct parallel_world *w, char *buf, size_t n)
{
    return parallel_watch_silent_over(w, WATCH_SILENT_S, buf, n);
}

size_t parallel_watch_silent_over(const struct parallel_world *w, double seconds, char *buf, size_t n)
{
    if (n) buf[0] = 0;
    struct world_impl *root = root_of(w);
    struct parallel_watch *pw = root ? root->watch : NULL;
    if (!pw || n == 0) return 0;
    const double now = base_now_s();
    size_t len = 0;
    pthread_mutex_lock(&pw->lock);
    for (int i = 0; i < pw->size && len < n; i++) {
        if (i == pw->rank || now - pw->last[i] < seconds) continue;
        len += (size_t)snprintf(buf + len, n - len, "%srank %d (silent for %.1f s)", len ? ", " : "", i,
                                now - pw->last[i]);
    }
    pthread_mutex_unlock(&pw->lock);
    return len < n ? len : n - 1;
}

void parallel_watch_explain(const struct parallel_world *w, char *buf, size_t n)
{
    struct world_impl *root = root_of(w);
    if (!root || !root->watch) {
        /* No watch: --rank-timeout 0, a world of one, or not started. */
        snprintf(buf, n, "a rank is hung or gone%s",
                 w->mpi && !w->thread_multiple ? " (not named: MPI lacks MPI_THREAD_MULTIPLE)" : "");
        return;
    }
    char who[320];
    if (parallel_watch_silent(w, who, sizeof who) > 0) snprintf(buf, n, "%s: hung or gone", who);
    else snprintf(buf, n, "a rank is hung or gone (every rank's heartbeats arrive: a rank that beats but never "
                  "joins, a deadlock)");
}
