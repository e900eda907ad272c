/* engine/parallel/parallel_nccl.c - the NCCL communicator: CUDA tensors between GPU ranks, every
 * operation queued on the stream given at creation; the only file that calls NCCL. Compiled
 * only when the build has CUDA and NCCL (engine/CMakeLists.txt), into libshardlm_nccl.so, whose
 * nccl_lib_* entry points parallel_nccl_loader.c resolves with dlsym on first use (so that a
 * process without NCCL groups never maps NCCL or the CUDA runtime); parallel_nccl_unavailable.c
 * stands in otherwise. Its parallel_* and status_* calls bind to the executable's (exported:
 * kernels/CMakeLists.txt).
 * Not here: MPI (parallel.c creates the groups and broadcasts the NCCL unique id), the
 * shape checks (the comm_* wrappers in parallel_comm.c).
 * Tests: tests/test_parallel.c --nccl (label gpu: SKIP without one GPU per rank). Compiled in
 * CI; it has never run on the build machines, which have no GPU (docs/parallel.md). */
#include "parallel.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == PARALLEL_NCCL_ID_BYTES, "PARALLEL_NCCL_ID_BYTES is stale");

struct nccl_comm {
    ncclComm_t   comm;
    cudaStream_t stream;        /* borrowed from the caller (the backend's stream) */
    int          device_id;
    void        *scratch;       /* device memory for the last-dim gather */
    size_t       scratch_bytes;
};

static const struct comm_ops nccl_comm_ops;

/* The one place NCCL and CUDA error codes become statuses: every call goes through NCCL_TRY or
 * CUDA_TRY, which name the call (up to its '(') and the group; the world is then broken. */
static enum status nccl_fail(struct parallel_world *w, ncclComm_t comm, ncclResult_t r,
                             const char *call, const char *group)
{
    const char *detail = comm ? ncclGetLastError(comm) : "";
    return parallel_world_fail(w, "%.*s on the %s group failed: %s%s%s", (int)strcspn(call, "("),
                               call, group, ncclGetErrorString(r), detail && *detail ? ": " : "",
                               detail ? detail : "");
}

static enum status cuda_fail(struct parallel_world *w, cudaError_t e, const char *call,
                             const char *group)
{
    return parallel_world_fail(w, "%.*s on the %s group failed: %s (%s)", (int)strcspn(call, "("),
                               call, group, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define NCCL_TRY(w, comm, group, call)                                                          \
    do {                                                                                        \
        ncclResult_t nccl_try_r_ = (call);                                                      \
        if (nccl_try_r_ != ncclSuccess) return nccl_fail((w), (comm), nccl_try_r_, #call, (group)); \
    } while (0)

#define CUDA_TRY(w, group, call)                                                                \
    do {                                                                                        \
        cudaError_t cuda_try_e_ = (call);                                                       \
        if (cuda_try_e_ != cudaSuccess) return cuda_fail((w), cuda_try_e_, #call, (group));    \
    } while (0)

static ncclDataType_t nccl_dtype(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return ncclFloat32;
    case DTYPE_BF16: return ncclBfloat16;
    case DTYPE_F16: return ncclFloat16;
    case DTYPE_I32: return ncclInt32;
    default: break; /* block dtypes are weights: never communicated */
    }
    CHECK(0, "no NCCL type for dtype %d", (int)t);
    return ncclFloat32;
}

/* Every entry point starts here: CUDA's current device is per host thread. */
static struct nccl_comm *nccl_enter(struct comm *c, enum status *st)
{
    struct nccl_comm *n = c->impl;
    cudaError_t e = cudaSetDevice(n->device_id);
    *st = e == cudaSuccess ? STATUS_OK : cuda_fail(c->world, e, "cudaSetDevice", c->name);
    return n;
}

/* ---- local queries ------------------------------------------------------------------------ */

unsigned long nccl_lib_abi(void) { return NCCL_LIB_ABI; }

int nccl_lib_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

enum status nccl_lib_check_device(int device_id)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return status_errorf(STATUS_UNAVAILABLE, "parallel: NCCL needs a GPU and none is visible%s%s",
                             e != cudaSuccess ? ": " : "", e != cudaSuccess ? cudaGetErrorString(e) : "");
    if (device_id < 0 || device_id >= n)
        return status_errorf(STATUS_UNAVAILABLE, "parallel: GPU %d does not exist (%d visible)",
                             device_id, n);
    if ((e = cudaSetDevice(device_id)) != cudaSuccess)
        return status_errorf(STATUS_UNAVAILABLE, "parallel: cannot use GPU %d: %s", device_id,
                             cudaGetErrorString(e));
    return STATUS_OK;
}

enum status nccl_lib_unique_id(unsigned char id[PARALLEL_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return status_errorf(STATUS_UNAVAILABLE, "parallel: ncclGetUniqueId failed: %s",
                             ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return STATUS_OK;
}

/* ---- creation ------------------------------------------------------------------------------ */

enum status nccl_lib_comm_create(struct parallel_world *w, const char *name,
                                 const unsigned char id[PARALLEL_NCCL_ID_BYTES], int rank,
                                 int size, int device_id, void *stream, struct comm **out)
{
    *out = NULL;
    struct comm *c = calloc(1, sizeof *c);
    struct nccl_comm *n = calloc(1, sizeof *n);
    if (!c || !n) {
        free(c);
        free(n);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    }
    c->ops = &nccl_comm_ops;
    c->name = name;
    c->device = DEVICE_CUDA;
    c->rank = rank;
    c->size = size;
    c->world = w;
    c->impl = n;
    n->stream = (cudaStream_t)stream;
    n->device_id = device_id;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    cudaError_t e = cudaSetDevice(device_id);
    ncclResult_t r = ncclSuccess;
    enum status st = STATUS_OK;
    if (e != cudaSuccess) st = cuda_fail(w, e, "cudaSetDevice", name);
    else if ((r = ncclCommInitRank(&n->comm, size, u, rank)) != ncclSuccess)
        st = nccl_fail(w, NULL, r, "ncclCommInitRank", name);
    if (st != STATUS_OK) {
        n->comm = NULL;
        comm_free(c);
        return st;
    }
    *out = c;
    return STATUS_OK;
}

static void nccl_comm_free(struct comm *c)
{
    struct nccl_comm *n = c->impl;
    if (n->comm) {
        cudaSetDevice(n->device_id);
        /* Destroy waits for queued work, which may never finish once a peer failed. */
        if (c->world->broken) ncclCommAbort(n->comm);
        else ncclCommDestroy(n->comm);
    }
    cudaFree(n->scratch);
    free(n);
    free(c);
}

/* ---- operations ---------------------------------------------------------------------------- */

static enum status nccl_scratch(struct comm *c, struct nccl_comm *n, size_t nbytes, void **out)
{
    if (nbytes > n->scratch_bytes) {
        /* The old scratch may still be read by queued work: wait for the stream first. */
        CUDA_TRY(c->world, c->name, cudaStreamSynchronize(n->stream));
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, nbytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                                 "parallel: no GPU memory for %zu bytes of %s scratch: %s", nbytes,
                                 c->name, cudaGetErrorString(e));
        }
        CUDA_TRY(c->world, c->name, cudaFree(n->scratch));
        n->scratch = p;
        n->scratch_bytes = nbytes;
    }
    *out = n->scratch;
    return STATUS_OK;
}

static enum status nccl_reserve(struct comm *c, size_t max_numel)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    void *p;
    return st != STATUS_OK ? st : nccl_scratch(c, n, max_numel * sizeof(float), &p);
}

/* NCCL sums bf16/f16 in their own precision along its ring or tree (each hop rounds), as
 * Megatron's all-reduces do; every rank still ends with identical values. */
static enum status nccl_all_reduce(struct comm *c, const struct tensor *x)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclAllReduce(x->data, x->data, (size_t)tensor_numel(x), nccl_dtype(x->dtype), ncclSum,
                           n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_all_gather(struct comm *c, const struct tensor *out,
                                   const struct tensor *in)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclAllGather(in->data, out->data, tensor_nbytes(in), ncclInt8, n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_all_gather_last(struct comm *c, const struct tensor *out,
                                        const struct tensor *in)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    size_t in_bytes = tensor_nbytes(in), rows = (size_t)tensor_rows(in);
    size_t row_bytes = (size_t)tensor_cols(in) * dtype_size(in->dtype);
    void *stage = NULL;
    if ((st = nccl_scratch(c, n, in_bytes * (size_t)c->size, &stage)) != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclAllGather(in->data, stage, in_bytes, ncclInt8, n->comm, n->stream));
    if (in_bytes == 0) return STATUS_OK;
    /* Rank g's (rows, k) block becomes columns g*k .. g*k+k-1 of out: one strided copy each. */
    for (int g = 0; g < c->size; g++)
        CUDA_TRY(c->world, c->name,
                 cudaMemcpy2DAsync((unsigned char *)out->data + (size_t)g * row_bytes,
                                   row_bytes * (size_t)c->size,
                                   (const unsigned char *)stage + (size_t)g * in_bytes, row_bytes,
                                   row_bytes, rows, cudaMemcpyDeviceToDevice, n->stream));
    return STATUS_OK;
}

static enum status nccl_reduce_scatter(struct comm *c, const struct tensor *out,
                                       const struct tensor *in)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclReduceScatter(in->data, out->data, (size_t)tensor_numel(out), nccl_dtype(in->dtype),
                               ncclSum, n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_broadcast(struct comm *c, const struct tensor *x, int root)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclBroadcast(x->data, x->data, tensor_nbytes(x), ncclInt8, root, n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_send(struct comm *c, const struct tensor *x, int peer)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclSend(x->data, tensor_nbytes(x), ncclInt8, peer, n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_recv(struct comm *c, const struct tensor *x, int peer)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name,
             ncclRecv(x->data, tensor_nbytes(x), ncclInt8, peer, n->comm, n->stream));
    return STATUS_OK;
}

static enum status nccl_sendrecv(struct comm *c, const struct tensor *send, int send_peer,
                                 const struct tensor *recv, int recv_peer)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    NCCL_TRY(c->world, n->comm, c->name, ncclGroupStart());
    NCCL_TRY(c->world, n->comm, c->name,
             ncclSend(send->data, tensor_nbytes(send), ncclInt8, send_peer, n->comm, n->stream));
    NCCL_TRY(c->world, n->comm, c->name,
             ncclRecv(recv->data, tensor_nbytes(recv), ncclInt8, recv_peer, n->comm, n->stream));
    NCCL_TRY(c->world, n->comm, c->name, ncclGroupEnd());
    return STATUS_OK;
}

/* Queued on the stream: later work on it sees the sum, so there is nothing to wait for. */
static enum status nccl_all_reduce_start(struct comm *c, const struct tensor *x, struct comm_request *req)
{
    req->active = 0;
    return nccl_all_reduce(c, x);
}

static enum status nccl_wait(struct comm *c, struct comm_request *req)
{
    (void)c;
    (void)req;
    return STATUS_OK;
}

/* Polls the stream rather than blocking in cudaStreamSynchronize, so that an asynchronous NCCL
 * error (a peer gone) or the world's timeout ends the wait; either aborts the communicator. */
static enum status nccl_synchronize(struct comm *c)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    double start = base_now_s();
    for (long spin = 0;; spin++) {
        cudaError_t e = cudaStreamQuery(n->stream);
        ncclResult_t async = ncclSuccess;
        NCCL_TRY(c->world, n->comm, c->name, ncclCommGetAsyncError(n->comm, &async));
        if (async != ncclSuccess && async != ncclInProgress) {
            st = nccl_fail(c->world, n->comm, async, "ncclCommGetAsyncError", c->name);
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return st;
        }
        if (e == cudaSuccess) return STATUS_OK;
        if (e != cudaErrorNotReady) return cuda_fail(c->world, e, "cudaStreamQuery", c->name);
        if (c->world->timeout_s > 0 && base_now_s() - start > c->world->timeout_s) {
            char who[400];
            parallel_watch_explain(c->world, who, sizeof who);
            st = parallel_world_fail(c->world, "NCCL work on the %s group made no progress in %.1f s: %s", c->name,
                                     c->world->timeout_s, who);
            ncclCommAbort(n->comm);
            n->comm = NULL;
            return st;
        }
        if (spin >= 1000) sched_yield();
    }
}

/* One grouped ncclSend / ncclRecv per peer (the rows to this rank itself copied on the stream).
 * No GPU has run it; the CUDA emulator's NCCL has (nccl_emu.c, docs/parallel.md). */
static enum status nccl_all_to_all_rows(struct comm *c, const struct tensor *send, const int64_t *send_rows,
                                        const struct tensor *recv, const int64_t *recv_rows)
{
    enum status st;
    struct nccl_comm *n = nccl_enter(c, &st);
    if (st != STATUS_OK) return st;
    const size_t row = tensor_nbytes(send) / (size_t)(send->shape[0] ? send->shape[0] : 1);
    size_t so = 0, ro = 0;
    NCCL_TRY(c->world, n->comm, c->name, ncclGroupStart());
    for (int r = 0; r < c->size; r++) {
        const size_t sb = (size_t)send_rows[r] * row, rb = (size_t)recv_rows[r] * row;
        if (r == c->rank) {
            CUDA_TRY(c->world, c->name, cudaMemcpyAsync((char *)recv->data + ro, (const char *)send->data + so, sb,
                                                        cudaMemcpyDeviceToDevice, n->stream));
        } else {
            if (sb) NCCL_TRY(c->world, n->comm, c->name, ncclSend((const char *)send->data + so, sb, ncclInt8, r, n->comm, n->stream));
            if (rb) NCCL_TRY(c->world, n->comm, c->name, ncclRecv((char *)recv->data + ro, rb, ncclInt8, r, n->comm, n->stream));
        }
        so += sb, ro += rb;
    }
    NCCL_TRY(c->world, n->comm, c->name, ncclGroupEnd());
    return STATUS_OK;
}

static const struct comm_ops nccl_comm_ops = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .all_gather_last = nccl_all_gather_last,
    .reduce_scatter = nccl_reduce_scatter,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .all_to_all_rows = nccl_all_to_all_rows,
    .all_reduce_start = nccl_all_reduce_start,
    .wait = nccl_wait,
    .reserve = nccl_reserve,
    .synchronize = nccl_synchronize,
    .free = nccl_comm_free,
};
