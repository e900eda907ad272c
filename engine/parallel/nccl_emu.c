/* engine/parallel/nccl_emu.c - the NCCL calls parallel_nccl.c makes, between processes on one host
 * through POSIX shared memory, for the CUDA emulator (kernels/cuda_emu/README.md): with it,
 * parallel_nccl.c itself is built into libshardlm_nccl_emu.so (SHARDLM_NCCL_LIB), whose device
 * memory is the emulator's, so that tp, pp and ep on "CUDA" run under mpirun without a GPU.
 * A communicator is one shared segment named by its unique id: a barrier, a slot of EMU_CHUNK
 * bytes per rank for the collectives, a mailbox per (sender, receiver) for send and receive.
 * Collectives run at the call, in chunks, each rank between two barriers (the emulator's streams
 * run their work at once too); sums are taken in rank order with the dtype's rounding after each
 * add, so every rank gets the same bits (NCCL's ring rounds each hop as well). Sends and receives
 * queue inside ncclGroupStart / ncclGroupEnd and then progress together, so a group's exchange in
 * both directions cannot deadlock on a full mailbox. A peer that does not arrive within
 * SHARDLM_NCCL_EMU_TIMEOUT_S (120 s) fails the call (ncclRemoteError) instead of hanging.
 * Not emulated: reductions other than the sum, collectives inside a group, more than 64 ranks. */
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "tensor.h" /* the dtypes' conversions (f16's: the executable's, as parallel_nccl.c's tensor calls) */

#define EMU_CHUNK ((size_t)256 << 10)
#define EMU_MAX_RANKS 64
#define EMU_HEADER 4096

struct emu_header {
    atomic_int      attached;
    atomic_uint     bar_count, bar_gen;
    atomic_int      aborted;
};

struct emu_mailbox {
    atomic_size_t full; /* 0 empty, else the bytes in data */
    char          pad[56];
    char          data[EMU_CHUNK];
};

struct ncclComm {
    struct emu_header *h;
    unsigned char     *base;
    size_t             bytes;
    int                nranks, rank;
    char               error[256];
};

static _Thread_local char last_error[256];

static size_t segment_bytes(int n)
{
    return EMU_HEADER + (size_t)n * EMU_CHUNK + (size_t)n * (size_t)n * sizeof(struct emu_mailbox);
}
static unsigned char *slot(struct ncclComm *c, int r) { return c->base + EMU_HEADER + (size_t)r * EMU_CHUNK; }
static struct emu_mailbox *mailbox(struct ncclComm *c, int from, int to)
{
    return (struct emu_mailbox *)(c->base + EMU_HEADER + (size_t)c->nranks * EMU_CHUNK) + (size_t)from * c->nranks + to;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double timeout_s(void)
{
    const char *e = getenv("SHARDLM_NCCL_EMU_TIMEOUT_S");
    return e && *e ? atof(e) : 120.0;
}

static ncclResult_t fail(struct ncclComm *c, ncclResult_t r, const char *what)
{
    snprintf(last_error, sizeof last_error, "NCCL emulator: %s", what);
    if (c) snprintf(c->error, sizeof c->error, "%s", last_error);
    return r;
}

/* Spins (yielding) until *v != old or the peers are gone: 0, or the failure. */
static ncclResult_t wait_change(struct ncclComm *c, atomic_uint *v, unsigned old)
{
    const double start = now_s(), limit = timeout_s();
    for (long spin = 0; atomic_load(v) == old; spin++) {
        if (atomic_load(&c->h->aborted)) return fail(c, ncclRemoteError, "a peer aborted the communicator");
        if ((spin & 1023) == 1023 && now_s() - start > limit)
            return fail(c, ncclRemoteError, "a peer did not reach the collective in time");
        sched_yield();
    }
    return ncclSuccess;
}

static ncclResult_t barrier(struct ncclComm *c)
{
    struct emu_header *h = c->h;
    const unsigned gen = atomic_load(&h->bar_gen);
    if (atomic_fetch_add(&h->bar_count, 1) + 1 == (unsigned)c->nranks) {
        atomic_store(&h->bar_count, 0);
        atomic_fetch_add(&h->bar_gen, 1);
        return ncclSuccess;
    }
    return wait_change(c, &h->bar_gen, gen);
}

static size_t type_bytes(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

/* out[i] = the sum over ranks (in rank order) of slot r's element i, each add rounded in t. */
static ncclResult_t sum_slots(struct ncclComm *c, void *out, size_t n, ncclDataType_t t)
{
    for (size_t i = 0; i < n; i++) {
        switch (t) {
        case ncclFloat32: {
            float a = ((const float *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a += ((const float *)slot(c, r))[i];
            ((float *)out)[i] = a;
        } break;
        case ncclFloat64: {
            double a = ((const double *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a += ((const double *)slot(c, r))[i];
            ((double *)out)[i] = a;
        } break;
        case ncclBfloat16: {
            uint16_t a = ((const uint16_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a = f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(((const uint16_t *)slot(c, r))[i]));
            ((uint16_t *)out)[i] = a;
        } break;
        case ncclFloat16: {
            uint16_t a = ((const uint16_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a = f32_to_f16(f16_to_f32(a) + f16_to_f32(((const uint16_t *)slot(c, r))[i]));
            ((uint16_t *)out)[i] = a;
        } break;
        case ncclInt32: case ncclUint32: {
            uint32_t a = ((const uint32_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a += ((const uint32_t *)slot(c, r))[i];
            ((uint32_t *)out)[i] = a;
        } break;
        case ncclInt64: case ncclUint64: {
            uint64_t a = ((const uint64_t *)slot(c, 0))[i];
            for (int r = 1; r < c->nranks; r++) a += ((const uint64_t *)slot(c, r))[i];
            ((uint64_t *)out)[i] = a;
        } break;
        default: return fail(c, ncclInvalidArgument, "no sum for this data type");
        }
    }
    return ncclSuccess;
}

/* ---- the API ---------------------------------------------------------------------------------- */

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm) { return comm ? comm->error : last_error; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_uint counter;
    memset(id, 0, sizeof *id);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    snprintf(id->internal, sizeof id->internal, "/shardlm-nccl-emu-%d-%u-%ld-%ld", (int)getpid(),
             atomic_fetch_add(&counter, 1), (long)t.tv_sec, t.tv_nsec);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    *out = NULL;
    if (nranks < 1 || nranks > EMU_MAX_RANKS || rank < 0 || rank >= nranks || strncmp(id.internal, "/shardlm-nccl-emu-", 18))
        return fail(NULL, ncclInvalidArgument, "ncclCommInitRank: bad rank, size or unique id");
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return fail(NULL, ncclSystemError, "out of memory");
    c->nranks = nranks;
    c->rank = rank;
    c->bytes = segment_bytes(nranks);
    char name[NCCL_UNIQUE_ID_BYTES + 1];
    memcpy(name, id.internal, NCCL_UNIQUE_ID_BYTES);
    name[NCCL_UNIQUE_ID_BYTES] = 0;
    const int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)c->bytes) != 0) {
        if (fd >= 0) close(fd);
        free(c);
        return fail(NULL, ncclSystemError, "shm_open / ftruncate of the communicator's segment failed");
    }
    void *p = mmap(NULL, c->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        free(c);
        return fail(NULL, ncclSystemError, "mmap of the communicator's segment failed");
    }
    c->base = p;
    c->h = p;
    atomic_fetch_add(&c->h->attached, 1);
    const double start = now_s(), limit = timeout_s();
    while (atomic_load(&c->h->attached) < nranks) {
        if (now_s() - start > limit) {
            munmap(c->base, c->bytes);
            free(c);
            return fail(NULL, ncclRemoteError, "ncclCommInitRank: not every rank attached in time");
        }
        sched_yield();
    }
    ncclResult_t r = barrier(c); /* every rank has the segment mapped: its name may go */
    if (rank == 0) shm_unlink(name);
    if (r != ncclSuccess) {
        munmap(c->base, c->bytes);
        free(c);
        return r;
    }
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c)
{
    if (!c) return ncclSuccess;
    munmap(c->base, c->bytes);
    free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c)
{
    if (!c) return ncclSuccess;
    atomic_store(&c->h->aborted, 1);
    return ncclCommDestroy(c);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async)
{
    (void)c;
    *async = ncclSuccess; /* every call has finished when it returns */
    return ncclSuccess;
}

/* Sums count elements of t at src over the ranks, chunk by chunk: into dst on rank dest, or on
 * every rank where dest is -1 (dst NULL on the ranks that only give). */
static ncclResult_t reduce_to(struct ncclComm *c, const char *src, char *dst, size_t count, ncclDataType_t t, int dest)
{
    const size_t es = type_bytes(t), per = EMU_CHUNK / es;
    for (size_t off = 0; off < count; off += per) {
        const size_t n = count - off < per ? count - off : per;
        memcpy(slot(c, c->rank), src + off * es, n * es);
        ncclResult_t r = barrier(c);
        if (r == ncclSuccess && (dest < 0 || dest == c->rank)) r = sum_slots(c, dst + off * es, n, t);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                           cudaStream_t stream)
{
    (void)stream;
    if (op != ncclSum || !type_bytes(t)) return fail(c, ncclInvalidArgument, "ncclAllReduce: only sums of known types");
    return reduce_to(c, send, recv, count, t, -1);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c, cudaStream_t stream)
{
    (void)stream;
    const size_t bytes = count * type_bytes(t);
    for (size_t off = 0; off < bytes; off += EMU_CHUNK) {
        const size_t n = bytes - off < EMU_CHUNK ? bytes - off : EMU_CHUNK;
        memcpy(slot(c, c->rank), (const char *)send + off, n);
        ncclResult_t r = barrier(c);
        for (int k = 0; k < c->nranks && r == ncclSuccess; k++) memcpy((char *)recv + (size_t)k * bytes + off, slot(c, k), n);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t stream)
{
    (void)stream;
    const size_t es = type_bytes(t);
    if (op != ncclSum || !es) return fail(c, ncclInvalidArgument, "ncclReduceScatter: only sums of known types");
    for (int d = 0; d < c->nranks; d++) {
        const ncclResult_t r = reduce_to(c, (const char *)send + (size_t)d * count * es, recv, count, t, d);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t c,
                           cudaStream_t stream)
{
    (void)stream;
    const size_t bytes = count * type_bytes(t);
    if (root < 0 || root >= c->nranks) return fail(c, ncclInvalidArgument, "ncclBroadcast: no such root");
    for (size_t off = 0; off < bytes; off += EMU_CHUNK) {
        const size_t n = bytes - off < EMU_CHUNK ? bytes - off : EMU_CHUNK;
        if (c->rank == root) memcpy(slot(c, root), (const char *)send + off, n);
        ncclResult_t r = barrier(c);
        if (r == ncclSuccess && (c->rank != root || recv != send)) memmove((char *)recv + off, slot(c, root), n);
        if (r == ncclSuccess) r = barrier(c);
        if (r != ncclSuccess) return r;
    }
    return ncclSuccess;
}

/* ---- point to point --------------------------------------------------------------------------- */

struct p2p {
    struct ncclComm *c;
    char            *buf;
    size_t           bytes, done;
    int              peer, send;
};

static _Thread_local struct p2p *queue;
static _Thread_local int queued, queue_cap, group_depth;

/* Moves every queued send and receive forward until all are done (each (comm, peer, direction)
 * in queue order). */
static ncclResult_t progress_all(void)
{
    ncclResult_t r = ncclSuccess;
    const double start = now_s(), limit = timeout_s();
    for (long spin = 0;; spin++) {
        int left = 0, moved = 0;
        for (int i = 0; i < queued; i++) {
            struct p2p *o = &queue[i];
            if (o->done == o->bytes) continue;
            left++;
            int earlier = 0; /* an earlier unfinished op of the same channel goes first */
            for (int j = 0; j < i && !earlier; j++)
                earlier = queue[j].c == o->c && queue[j].peer == o->peer && queue[j].send == o->send &&
                          queue[j].done < queue[j].bytes;
            if (earlier) continue;
            struct emu_mailbox *m = o->send ? mailbox(o->c, o->c->rank, o->peer) : mailbox(o->c, o->peer, o->c->rank);
            const size_t full = atomic_load(&m->full);
            if (o->send && !full) {
                const size_t n = o->bytes - o->done < EMU_CHUNK ? o->bytes - o->done : EMU_CHUNK;
                memcpy(m->data, o->buf + o->done, n);
                atomic_store(&m->full, n);
                o->done += n, moved = 1;
            } else if (!o->send && full) {
                if (full > o->bytes - o->done) {
                    r = fail(o->c, ncclInvalidUsage, "a receive shorter than the matching send");
                    goto out;
                }
                memcpy(o->buf + o->done, m->data, full);
                atomic_store(&m->full, 0);
                o->done += full, moved = 1;
            }
        }
        if (!left) break;
        if (!moved) {
            for (int i = 0; i < queued; i++)
                if (atomic_load(&queue[i].c->h->aborted)) {
                    r = fail(queue[i].c, ncclRemoteError, "a peer aborted the communicator");
                    goto out;
                }
            if ((spin & 1023) == 1023 && now_s() - start > limit) {
                r = fail(queue[0].c, ncclRemoteError, "a peer did not send or receive in time");
                goto out;
            }
            sched_yield();
        }
    }
out:
    queued = 0;
    return r;
}

static ncclResult_t enqueue(ncclComm_t c, const void *buf, size_t count, ncclDataType_t t, int peer, int send)
{
    if (peer < 0 || peer >= c->nranks || peer == c->rank) return fail(c, ncclInvalidArgument, "send / recv: bad peer");
    const size_t bytes = count * type_bytes(t);
    if (!bytes) return ncclSuccess;
    if (queued == queue_cap) {
        const int cap = queue_cap ? 2 * queue_cap : 16;
        struct p2p *q = realloc(queue, (size_t)cap * sizeof *q);
        if (!q) return fail(c, ncclSystemError, "out of memory");
        queue = q, queue_cap = cap;
    }
    queue[queued++] = (struct p2p){.c = c, .buf = (char *)buf, .bytes = bytes, .peer = peer, .send = send};
    return group_depth ? ncclSuccess : progress_all();
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream)
{
    (void)stream;
    return enqueue(c, buf, count, t, peer, 1);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t stream)
{
    (void)stream;
    return enqueue(c, buf, count, t, peer, 0);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) return fail(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    return --group_depth ? ncclSuccess : progress_all();
}
