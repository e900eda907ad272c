/* engine/parallel/parallel_comm.c - the comm_* operations of parallel.h (the contracts on
 * shapes, dtypes and devices checked once for every implementation, then the implementation's
 * ops table), and the MPI communicator that carries CPU tensors: bytes for data movement, f32
 * (or i32) sums with bf16/f16 widened into its scratch.
 * Not here: NCCL (parallel_nccl.c), how groups are made (parallel.c).
 * Tests: tests/test_parallel.c. Notes: docs/parallel.md. */
#include "parallel.h"

#include <mpi.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_mpi.h"

/* The MPI communicator's state (struct comm.impl). */
struct mpi_comm {
    MPI_Comm comm;     /* MPI_COMM_NULL for a group of one in a world without MPI */
    void    *scratch;  /* host memory for dtype widening and the last-dim gather */
    size_t   scratch_bytes;
};

static const struct comm_ops mpi_comm_ops;

/* ---- the comm_* wrappers: contracts checked once for every implementation ------------------ */

static void check_tensor(const struct comm *c, const struct tensor *t, const char *what)
{
    char d[64];
    CHECK(t->ndim >= 1 && t->ndim <= TENSOR_MAX_DIMS, "%s comm: %s has %d dims", c->name, what,
          t->ndim);
    for (int i = 0; i < t->ndim; i++)
        CHECK(t->shape[i] >= 0, "%s comm: %s %s has a negative dim", c->name, what,
              tensor_describe(t, d, sizeof d));
    CHECK(t->device == c->device, "%s comm (%s) carries %s tensors, %s is on %s", c->name,
          c->ops->name, c->device == DEVICE_CPU ? "CPU" : "CUDA", what,
          t->device == DEVICE_CPU ? "the CPU" : "CUDA");
    CHECK(t->data || tensor_numel(t) == 0, "%s comm: %s has no data", c->name, what);
}

static void check_no_overlap(const struct comm *c, const struct tensor *a, const struct tensor *b)
{
    uintptr_t pa = (uintptr_t)a->data, pb = (uintptr_t)b->data;
    size_t na = tensor_nbytes(a), nb = tensor_nbytes(b);
    CHECK(na == 0 || nb == 0 || pa + na <= pb || pb + nb <= pa, "%s comm: out overlaps in",
          c->name);
}

/* out has in's shape except dimension `dim`, which is size times in's. */
static void check_gathered(const struct comm *c, const struct tensor *big,
                           const struct tensor *small, int dim, const char *op)
{
    char a[64], b[64];
    int ok = big->dtype == small->dtype && big->ndim == small->ndim;
    for (int i = 0; ok && i < big->ndim; i++)
        ok = big->shape[i] == (i == dim ? c->size * small->shape[i] : small->shape[i]);
    CHECK(ok, "%s comm %s: %s and %s do not match a group of %d", c->name, op,
          tensor_describe(big, a, sizeof a), tensor_describe(small, b, sizeof b), c->size);
}

/* Runs one operation with the counters of struct comm. */
#define COMM_RUN(c, nbytes, call)                                                               \
    do {                                                                                        \
        enum status comm_run_st_ = parallel_world_usable((c)->world);                                    \
        if (comm_run_st_ != STATUS_OK) return comm_run_st_;                                     \
        double comm_run_t0_ = base_now_s();                                                          \
        comm_run_st_ = (call);                                                                  \
        (c)->seconds += base_now_s() - comm_run_t0_;                                                 \
        (c)->n_calls++;                                                                         \
        (c)->n_bytes += (nbytes);                                                               \
        return comm_run_st_;                                                                    \
    } while (0)

static void check_reducible(const struct comm *c, const struct tensor *x, int allow_int)
{
    CHECK(dtype_is_float(x->dtype) || (allow_int && x->dtype == DTYPE_I32),
          "%s comm: cannot sum %s tensors", c->name, dtype_name(x->dtype));
}

enum status comm_all_reduce(struct comm *c, const struct tensor *x)
{
    check_tensor(c, x, "x");
    check_reducible(c, x, 1);
    COMM_RUN(c, tensor_nbytes(x), c->ops->all_reduce(c, x));
}

enum status comm_all_reduce_start(struct comm *c, const struct tensor *x, struct comm_request *req)
{
    check_tensor(c, x, "x");
    CHECK(x->dtype == DTYPE_F32, "%s comm: an asynchronous all-reduce takes f32", c->name);
    CHECK(!req->active, "%s comm: a request still in flight", c->name);
    COMM_RUN(c, tensor_nbytes(x), c->ops->all_reduce_start(c, x, req));
}

enum status comm_wait(struct comm *c, struct comm_request *req)
{
    if (!req->active) return STATUS_OK;
    enum status st = parallel_world_usable(c->world);
    if (st != STATUS_OK) return st;
    const double t0 = base_now_s();
    st = c->ops->wait(c, req);
    c->seconds += base_now_s() - t0;
    req->active = 0;
    return st;
}

enum status comm_all_gather(struct comm *c, const struct tensor *out, const struct tensor *in)
{
    check_tensor(c, out, "out");
    check_tensor(c, in, "in");
    check_gathered(c, out, in, 0, "all_gather");
    check_no_overlap(c, out, in);
    COMM_RUN(c, tensor_nbytes(out), c->ops->all_gather(c, out, in));
}

enum status comm_all_gather_last(struct comm *c, const struct tensor *out,
                                 const struct tensor *in)
{
    check_tensor(c, out, "out");
    check_tensor(c, in, "in");
    check_gathered(c, out, in, in->ndim - 1, "all_gather_last");
    check_no_overlap(c, out, in);
    COMM_RUN(c, tensor_nbytes(out), c->ops->all_gather_last(c, out, in));
}

enum status comm_reduce_scatter(struct comm *c, const struct tensor *out, const struct tensor *in)
{
    check_tensor(c, out, "out");
    check_tensor(c, in, "in");
    check_reducible(c, in, 0);
    check_gathered(c, in, out, 0, "reduce_scatter");
    check_no_overlap(c, out, in);
    COMM_RUN(c, tensor_nbytes(in), c->ops->reduce_scatter(c, out, in));
}

enum status comm_broadcast(struct comm *c, const struct tensor *x, int root)
{
    check_tensor(c, x, "x");
    CHECK(root >= 0 && root < c->size, "%s comm: root %d outside a group of %d", c->name, root,
          c->size);
    COMM_RUN(c, tensor_nbytes(x), c->ops->broadcast(c, x, root));
}

enum status comm_send(struct comm *c, const struct tensor *x, int peer)
{
    check_tensor(c, x, "x");
    CHECK(peer >= 0 && peer < c->size && peer != c->rank,
          "%s comm: rank %d cannot send to %d in a group of %d", c->name, c->rank, peer, c->size);
    COMM_RUN(c, tensor_nbytes(x), c->ops->send(c, x, peer));
}

enum status comm_recv(struct comm *c, const struct tensor *x, int peer)
{
    check_tensor(c, x, "x");
    CHECK(peer >= 0 && peer < c->size && peer != c->rank,
          "%s comm: rank %d cannot receive from %d in a group of %d", c->name, c->rank, peer,
          c->size);
    COMM_RUN(c, tensor_nbytes(x), c->ops->recv(c, x, peer));
}

enum status comm_sendrecv(struct comm *c, const struct tensor *send, int send_peer,
                          const struct tensor *recv, int recv_peer)
{
    check_tensor(c, send, "send");
    check_tensor(c, recv, "recv");
    CHECK(send_peer >= 0 && send_peer < c->size && send_peer != c->rank && recv_peer >= 0 &&
              recv_peer < c->size && recv_peer != c->rank,
          "%s comm: rank %d cannot exchange with %d / %d in a group of %d", c->name, c->rank,
          send_peer, recv_peer, c->size);
    COMM_RUN(c, tensor_nbytes(send), c->ops->sendrecv(c, send, send_peer, recv, recv_peer));
}

enum status comm_all_to_all_rows(struct comm *c, const struct tensor *send, const int64_t *send_rows,
                                 const struct tensor *recv, const int64_t *recv_rows)
{
    check_tensor(c, send, "send");
    check_tensor(c, recv, "recv");
    check_no_overlap(c, send, recv);
    const int64_t width = tensor_numel(send) / (send->shape[0] ? send->shape[0] : 1);
    CHECK(send->dtype == recv->dtype && tensor_numel(recv) / (recv->shape[0] ? recv->shape[0] : 1) == width,
          "%s comm: all-to-all of rows of %s x %lld into %s x %lld", c->name, dtype_name(send->dtype),
          (long long)width, dtype_name(recv->dtype), (long long)(tensor_numel(recv) / (recv->shape[0] ? recv->shape[0] : 1)));
    int64_t ns = 0, nr = 0, remote = 0;
    for (int r = 0; r < c->size; r++) {
        CHECK(send_rows[r] >= 0 && recv_rows[r] >= 0, "%s comm: all-to-all with a negative count", c->name);
        ns += send_rows[r], nr += recv_rows[r];
        if (r != c->rank) remote += send_rows[r];
    }
    CHECK(ns <= send->shape[0] && nr <= recv->shape[0] && send_rows[c->rank] == recv_rows[c->rank],
          "%s comm: all-to-all of %lld rows from %lld, %lld into %lld (self %lld / %lld)", c->name, (long long)ns,
          (long long)send->shape[0], (long long)nr, (long long)recv->shape[0], (long long)send_rows[c->rank],
          (long long)recv_rows[c->rank]);
    COMM_RUN(c, (uint64_t)remote * (uint64_t)width * dtype_size(send->dtype),
             c->ops->all_to_all_rows(c, send, send_rows, recv, recv_rows));
}

enum status comm_reserve(struct comm *c, size_t max_numel) { return c->ops->reserve(c, max_numel); }

enum status comm_synchronize(struct comm *c)
{
    enum status st = parallel_world_usable(c->world);
    if (st != STATUS_OK) return st;
    double t0 = base_now_s();
    st = c->ops->synchronize(c);
    c->seconds += base_now_s() - t0;
    return st;
}

void comm_free(struct comm *c)
{
    if (c) c->ops->free(c);
}

/* ---- the MPI communicator ------------------------------------------------------------------ */

enum status parallel_mpi_comm_wrap(struct parallel_world *w, const char *name, MPI_Comm mc,
                                   struct comm **out)
{
    *out = NULL;
    struct comm *c = calloc(1, sizeof *c);
    struct mpi_comm *m = calloc(1, sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        if (mc != MPI_COMM_NULL) MPI_Comm_free(&mc);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    }
    c->ops = &mpi_comm_ops;
    c->name = name;
    c->device = DEVICE_CPU;
    c->world = w;
    c->impl = m;
    c->rank = 0;
    c->size = 1;
    m->comm = mc;
    if (mc != MPI_COMM_NULL) {
        int rc = MPI_Comm_rank(mc, &c->rank);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mc, &c->size);
        if (rc != MPI_SUCCESS) {
            enum status st = parallel_mpi_fail(w, rc, "MPI_Comm_rank", name);
            comm_free(c);
            return st;
        }
    }
    *out = c;
    return STATUS_OK;
}

static void mpi_comm_free(struct comm *c)
{
    struct mpi_comm *m = c->impl;
    struct world_impl *wi = c->world->impl;
    /* After a failure, MPI_Comm_free could wait on a request that never completes. */
    if (m->comm != MPI_COMM_NULL && !wi->n_abandoned && !wi->mpi_failed) MPI_Comm_free(&m->comm);
    free(m->scratch);
    free(m);
    free(c);
}

static enum status mpi_scratch(struct comm *c, size_t nbytes, void **out)
{
    struct mpi_comm *m = c->impl;
    if (nbytes > m->scratch_bytes) {
        void *p = malloc(nbytes);
        if (!p)
            return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                                 "parallel: no memory for %zu bytes of %s scratch", nbytes, c->name);
        LOG_DEBUG(MODULE, "%s comm scratch: %zu -> %zu bytes", c->name, m->scratch_bytes, nbytes);
        free(m->scratch);
        m->scratch = p;
        m->scratch_bytes = nbytes;
    }
    *out = m->scratch;
    return STATUS_OK;
}

static enum status mpi_comm_reserve(struct comm *c, size_t max_numel)
{
    if (c->size == 1) return STATUS_OK;
    void *p;
    /* The largest need: reduce_scatter of a bf16/f16 input widened to f32 plus its f32 output. */
    return mpi_scratch(c, max_numel * 2 * sizeof(float), &p);
}

/* Sums n f32 or i32 values in place across the group. */
static enum status mpi_sum(struct comm *c, void *buf, size_t n, MPI_Datatype type)
{
    struct mpi_comm *m = c->impl;
    int count = 0;
    enum status st = parallel_mpi_int_count(n, "all_reduce", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, MPI_SUM, m->comm,
                                              &req));
    return parallel_mpi_wait(c->world, &req, NULL, "all_reduce", c->name);
}

_Static_assert(sizeof(MPI_Request) <= sizeof(((struct comm_request *)0)->handle), "MPI_Request fits");

static enum status mpi_all_reduce_start(struct comm *c, const struct tensor *x, struct comm_request *req)
{
    if (c->size == 1) return STATUS_OK;
    struct mpi_comm *m = c->impl;
    int count = 0;
    enum status st = parallel_mpi_int_count((size_t)tensor_numel(x), "all_reduce", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request r;
    MPI_TRY(c->world, c->name, MPI_Iallreduce(MPI_IN_PLACE, x->data, count, MPI_FLOAT, MPI_SUM, m->comm, &r));
    memcpy(req->handle, &r, sizeof r);
    req->active = 1;
    return STATUS_OK;
}

static enum status mpi_wait(struct comm *c, struct comm_request *req)
{
    MPI_Request r;
    memcpy(&r, req->handle, sizeof r);
    return parallel_mpi_wait(c->world, &r, NULL, "all_reduce (started earlier)", c->name);
}

static enum status mpi_all_reduce(struct comm *c, const struct tensor *x)
{
    if (c->size == 1) return STATUS_OK;
    size_t n = (size_t)tensor_numel(x);
    if (x->dtype == DTYPE_F32) return mpi_sum(c, x->data, n, MPI_FLOAT);
    if (x->dtype == DTYPE_I32) return mpi_sum(c, x->data, n, MPI_INT32_T);
    /* bf16/f16: the sum in f32, one rounding on the way back, as the ops do. */
    void *wide = NULL;
    enum status st = mpi_scratch(c, n * sizeof(float), &wide);
    if (st != STATUS_OK) return st;
    dtype_convert(wide, DTYPE_F32, x->data, x->dtype, n);
    if ((st = mpi_sum(c, wide, n, MPI_FLOAT)) != STATUS_OK) return st;
    dtype_convert(x->data, x->dtype, wide, DTYPE_F32, n);
    return STATUS_OK;
}

/* Each rank's in (nbytes) into dst, rank r at dst + r * nbytes. */
static enum status mpi_gather_bytes(struct comm *c, void *dst, const void *src, size_t nbytes)
{
    struct mpi_comm *m = c->impl;
    if (c->size == 1) {
        memcpy(dst, src, nbytes);
        return STATUS_OK;
    }
    int count = 0;
    enum status st = parallel_mpi_int_count(nbytes, "all_gather (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Iallgather(src, count, MPI_BYTE, dst, count, MPI_BYTE, m->comm,
                                              &req));
    return parallel_mpi_wait(c->world, &req, NULL, "all_gather", c->name);
}

static enum status mpi_all_gather(struct comm *c, const struct tensor *out, const struct tensor *in)
{
    return mpi_gather_bytes(c, out->data, in->data, tensor_nbytes(in));
}

static enum status mpi_all_gather_last(struct comm *c, const struct tensor *out,
                                       const struct tensor *in)
{
    size_t in_bytes = tensor_nbytes(in);
    size_t rows = (size_t)tensor_rows(in);
    size_t row_bytes = (size_t)tensor_cols(in) * dtype_size(in->dtype);
    if (c->size == 1) {
        memcpy(out->data, in->data, in_bytes);
        return STATUS_OK;
    }
    /* Gathered rank-major (size, rows, k), then interleaved into (rows, size * k). */
    void *stage;
    enum status st = mpi_scratch(c, in_bytes * (size_t)c->size, &stage);
    if (st == STATUS_OK) st = mpi_gather_bytes(c, stage, in->data, in_bytes);
    if (st != STATUS_OK) return st;
    const unsigned char *s = stage;
    unsigned char *d = out->data;
    for (size_t r = 0; r < rows; r++)
        for (int g = 0; g < c->size; g++)
            memcpy(d + (r * (size_t)c->size + (size_t)g) * row_bytes,
                   s + ((size_t)g * rows + r) * row_bytes, row_bytes);
    return STATUS_OK;
}

static enum status mpi_reduce_scatter(struct comm *c, const struct tensor *out,
                                      const struct tensor *in)
{
    struct mpi_comm *m = c->impl;
    size_t n_out = (size_t)tensor_numel(out), n_in = (size_t)tensor_numel(in);
    if (c->size == 1) {
        memcpy(out->data, in->data, tensor_nbytes(in));
        return STATUS_OK;
    }
    int count = 0;
    enum status st = parallel_mpi_int_count(n_in, "reduce_scatter", c->name, &count);
    if (st != STATUS_OK) return st;
    count = (int)n_out;
    const void *send = in->data;
    void *recv = out->data, *wide = NULL;
    if (in->dtype != DTYPE_F32) {
        if ((st = mpi_scratch(c, (n_in + n_out) * sizeof(float), &wide)) != STATUS_OK) return st;
        dtype_convert(wide, DTYPE_F32, in->data, in->dtype, n_in);
        send = wide;
        recv = (float *)wide + n_in;
    }
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Ireduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM,
                                                         m->comm, &req));
    if ((st = parallel_mpi_wait(c->world, &req, NULL, "reduce_scatter", c->name)) != STATUS_OK) return st;
    if (wide) dtype_convert(out->data, out->dtype, recv, DTYPE_F32, n_out);
    return STATUS_OK;
}

static enum status mpi_broadcast(struct comm *c, const struct tensor *x, int root)
{
    struct mpi_comm *m = c->impl;
    if (c->size == 1) return STATUS_OK;
    int count = 0;
    enum status st = parallel_mpi_int_count(tensor_nbytes(x), "broadcast (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Ibcast(x->data, count, MPI_BYTE, root, m->comm, &req));
    return parallel_mpi_wait(c->world, &req, NULL, "broadcast", c->name);
}

/* Point-to-point messages of one group share a tag: MPI keeps them in order per sender. */
enum { PARALLEL_P2P_TAG = 17 };

static enum status mpi_send(struct comm *c, const struct tensor *x, int peer)
{
    struct mpi_comm *m = c->impl;
    int count = 0;
    enum status st = parallel_mpi_int_count(tensor_nbytes(x), "send (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Isend(x->data, count, MPI_BYTE, peer, PARALLEL_P2P_TAG,
                                         m->comm, &req));
    char what[48];
    snprintf(what, sizeof what, "send to %s rank %d", c->name, peer); /* the one rank it waits for */
    return parallel_mpi_wait(c->world, &req, NULL, what, c->name);
}

static enum status mpi_recv(struct comm *c, const struct tensor *x, int peer)
{
    struct mpi_comm *m = c->impl;
    int count = 0, got = 0;
    enum status st = parallel_mpi_int_count(tensor_nbytes(x), "recv (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_Status mst;
    MPI_TRY(c->world, c->name, MPI_Irecv(x->data, count, MPI_BYTE, peer, PARALLEL_P2P_TAG, m->comm,
                                         &req));
    char what[48];
    snprintf(what, sizeof what, "recv from %s rank %d", c->name, peer);
    if ((st = parallel_mpi_wait(c->world, &req, &mst, what, c->name)) != STATUS_OK) return st;
    MPI_TRY(c->world, c->name, MPI_Get_count(&mst, MPI_BYTE, &got));
    /* A longer message fails inside MPI (truncation); a shorter one is a mismatched pair. */
    CHECK(got == count, "%s comm: rank %d received %d bytes from %d, expected %d", c->name,
          c->rank, got, peer, count);
    return STATUS_OK;
}

static enum status mpi_sendrecv(struct comm *c, const struct tensor *send, int send_peer,
                                const struct tensor *recv, int recv_peer)
{
    struct mpi_comm *m = c->impl;
    int scount = 0, rcount = 0, got = 0;
    enum status st = parallel_mpi_int_count(tensor_nbytes(send), "sendrecv (bytes)", c->name, &scount);
    if (st == STATUS_OK) st = parallel_mpi_int_count(tensor_nbytes(recv), "sendrecv (bytes)", c->name, &rcount);
    if (st != STATUS_OK) return st;
    MPI_Request req[2];
    MPI_Status mst;
    MPI_TRY(c->world, c->name, MPI_Irecv(recv->data, rcount, MPI_BYTE, recv_peer, PARALLEL_P2P_TAG,
                                         m->comm, &req[0]));
    MPI_TRY(c->world, c->name, MPI_Isend(send->data, scount, MPI_BYTE, send_peer, PARALLEL_P2P_TAG,
                                         m->comm, &req[1]));
    char what[64];
    snprintf(what, sizeof what, "sendrecv (send to %s rank %d)", c->name, send_peer);
    if ((st = parallel_mpi_wait(c->world, &req[1], NULL, what, c->name)) != STATUS_OK) return st;
    snprintf(what, sizeof what, "sendrecv (recv from %s rank %d)", c->name, recv_peer);
    if ((st = parallel_mpi_wait(c->world, &req[0], &mst, what, c->name)) != STATUS_OK) return st;
    MPI_TRY(c->world, c->name, MPI_Get_count(&mst, MPI_BYTE, &got));
    CHECK(got == rcount, "%s comm: rank %d received %d bytes from %d, expected %d", c->name, c->rank,
          got, recv_peer, rcount);
    return STATUS_OK;
}

/* MPI_Alltoallv in bytes (counts and displacements from the row counts). */
static enum status mpi_all_to_all_rows(struct comm *c, const struct tensor *send, const int64_t *send_rows,
                                       const struct tensor *recv, const int64_t *recv_rows)
{
    struct mpi_comm *m = c->impl;
    const size_t row = tensor_nbytes(send) / (size_t)(send->shape[0] ? send->shape[0] : 1);
    if (c->size == 1) {
        memcpy(recv->data, send->data, (size_t)send_rows[0] * row);
        return STATUS_OK;
    }
    int *v = malloc(4 * (size_t)c->size * sizeof *v);
    if (!v) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s comm: out of host memory for the all-to-all counts", c->name);
    int *sc = v, *sd = v + c->size, *rc = v + 2 * c->size, *rd = v + 3 * c->size;
    size_t so = 0, ro = 0;
    enum status st = STATUS_OK;
    for (int r = 0; r < c->size && st == STATUS_OK; r++) {
        st = parallel_mpi_int_count((size_t)send_rows[r] * row, "all-to-all (bytes)", c->name, &sc[r]);
        if (st == STATUS_OK) st = parallel_mpi_int_count((size_t)recv_rows[r] * row, "all-to-all (bytes)", c->name, &rc[r]);
        if (st == STATUS_OK) st = parallel_mpi_int_count(so, "all-to-all (offset)", c->name, &sd[r]);
        if (st == STATUS_OK) st = parallel_mpi_int_count(ro, "all-to-all (offset)", c->name, &rd[r]);
        so += (size_t)send_rows[r] * row, ro += (size_t)recv_rows[r] * row;
    }
    if (st == STATUS_OK) {
        MPI_Request req;
        int rc_ = MPI_Ialltoallv(send->data, sc, sd, MPI_BYTE, recv->data, rc, rd, MPI_BYTE, m->comm, &req);
        if (rc_ != MPI_SUCCESS) st = parallel_mpi_fail(c->world, rc_, "MPI_Ialltoallv", c->name);
        else st = parallel_mpi_wait(c->world, &req, NULL, "all-to-all", c->name);
    }
    free(v);
    return st;
}

static enum status mpi_synchronize(struct comm *c)
{
    (void)c;
    return STATUS_OK;
}

static const struct comm_ops mpi_comm_ops = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .all_gather_last = mpi_all_gather_last,
    .reduce_scatter = mpi_reduce_scatter,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .all_to_all_rows = mpi_all_to_all_rows,
    .all_reduce_start = mpi_all_reduce_start,
    .wait = mpi_wait,
    .reserve = mpi_comm_reserve,
    .synchronize = mpi_synchronize,
    .free = mpi_comm_free,
};
