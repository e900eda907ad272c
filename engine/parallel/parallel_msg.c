/* engine/parallel/parallel_msg.c - point-to-point messages between ranks of a world
 * (parallel_msg_*), on the world's own MPI communicator: sends are posted non-blocking from a
 * buffer they own and completed by parallel_msg_progress, so no thread ever blocks on a peer
 * to send; receives probe, then take one message whole.
 * Not here: tensors between the ranks of a group (comm_send / comm_recv in parallel_comm.c).
 * Tests: tests/test_parallel.c, the data-parallel engine and server tests (tests/parallel.cmake,
 * tests/test_serve_mpi.sh). Notes: docs/parallel.md. */
#include "parallel.h"

#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>

#include "parallel_mpi.h"

enum status parallel_msg_send(struct parallel_world *w, int dest, void *buf, size_t n)
{
    CHECK(dest >= 0 && dest < w->size && dest != w->rank, "message to rank %d from rank %d of %d",
          dest, w->rank, w->size);
    CHECK(w->mpi && ((struct world_impl *)w->impl)->msgs != MPI_COMM_NULL,
          "parallel_msg_send on a world without its own MPI message channel");
    enum status st = parallel_world_usable(w);
    int count = 0;
    if (st == STATUS_OK) st = parallel_mpi_int_count(n, "message", "world", &count);
    if (st != STATUS_OK) {
        free(buf);
        return st;
    }
    struct world_impl *wi = w->impl;
    pthread_mutex_lock(&wi->send_mu);
    if (base_grow((void **)&wi->sends, &wi->cap_sends, (size_t)wi->n_sends + 1, sizeof *wi->sends)) {
        pthread_mutex_unlock(&wi->send_mu);
        free(buf);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory for a message");
    }
    struct pending_send *ps = &wi->sends[wi->n_sends];
    int rc = MPI_Isend(buf, count, MPI_BYTE, dest, 0, wi->msgs, &ps->req);
    if (rc == MPI_SUCCESS) {
        ps->buf = buf;
        ps->posted = base_now_s();
        wi->n_sends++;
    }
    pthread_mutex_unlock(&wi->send_mu);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return parallel_mpi_fail(w, rc, "MPI_Isend", "world");
    }
    return STATUS_OK;
}

enum status parallel_msg_progress(struct parallel_world *w, int *pending, double *oldest_s)
{
    struct world_impl *wi = w->impl;
    *pending = 0;
    *oldest_s = 0;
    if (!w->mpi || wi->msgs == MPI_COMM_NULL) return STATUS_OK;
    enum status st = STATUS_OK;
    const double now = base_now_s();
    pthread_mutex_lock(&wi->send_mu);
    int kept = 0;
    for (int i = 0; i < wi->n_sends; i++) {
        struct pending_send *ps = &wi->sends[i];
        int done = 0;
        if (st == STATUS_OK && !w->broken) {
            int rc = MPI_Test(&ps->req, &done, MPI_STATUS_IGNORE);
            if (rc != MPI_SUCCESS) st = parallel_mpi_fail(w, rc, "MPI_Test", "world");
        }
        if (done) {
            free(ps->buf);
            continue;
        }
        if (now - ps->posted > *oldest_s) *oldest_s = now - ps->posted;
        wi->sends[kept++] = *ps;
    }
    wi->n_sends = kept;
    *pending = kept;
    pthread_mutex_unlock(&wi->send_mu);
    if (st == STATUS_OK) st = parallel_world_usable(w);
    return st;
}

enum status parallel_msg_poll(struct parallel_world *w, int *got, int *source, size_t *n)
{
    *got = 0;
    *source = -1;
    *n = 0;
    struct world_impl *wi = w->impl;
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK || !w->mpi || wi->msgs == MPI_COMM_NULL) return st;
    MPI_Status s;
    MPI_TRY(w, "world", MPI_Iprobe(MPI_ANY_SOURCE, 0, wi->msgs, got, &s));
    if (!*got) return STATUS_OK;
    int count = 0;
    MPI_TRY(w, "world", MPI_Get_count(&s, MPI_BYTE, &count));
    *source = s.MPI_SOURCE;
    *n = (size_t)count;
    return STATUS_OK;
}

enum status parallel_msg_recv(struct parallel_world *w, int source, void *buf, size_t n)
{
    CHECK(source >= 0 && source < w->size && source != w->rank, "message from rank %d on rank %d",
          source, w->rank);
    struct world_impl *wi = w->impl;
    CHECK(w->mpi && wi->msgs != MPI_COMM_NULL, "parallel_msg_recv without a message channel");
    int count = 0;
    enum status st = parallel_world_usable(w);
    if (st == STATUS_OK) st = parallel_mpi_int_count(n, "message", "world", &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Irecv(buf, count, MPI_BYTE, source, 0, wi->msgs, &req));
    return parallel_mpi_wait(w, &req, NULL, "message receive", "world");
}
