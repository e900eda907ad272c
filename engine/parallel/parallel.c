/* engine/parallel/parallel.c - the world of ranks (parallel_init, sub-worlds, agreement, byte
 * broadcast, barrier), the dp x pp x tp layout and the group communicators (tp, pp, dp: MPI
 * for CPU tensors, NCCL bootstrapped over MPI for CUDA tensors); MPI error handling and the
 * timed wait shared by the MPI files.
 * Not here: the comm_* operations and the MPI communicator (parallel_comm.c), point-to-point
 * messages (parallel_msg.c), NCCL (parallel_nccl.c), what the model communicates when
 * (engine/model/model.c).
 * Tests: tests/test_parallel.c. Notes: docs/parallel.md.
 *
 * Every MPI operation is posted non-blocking and completed by parallel_mpi_wait, which either
 * blocks (no timeout) or polls against the world's timeout, so that a hung or dead peer becomes
 * a STATUS_UNAVAILABLE on this rank instead of a hang. Every MPI call goes through MPI_TRY. */
#include "parallel.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel_mpi.h"

/* ---- error handling ------------------------------------------------------------------- */

enum status parallel_world_fail(struct parallel_world *w, const char *fmt, ...)
{
    char msg[sizeof w->failure];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* several threads may fail a world */
    pthread_mutex_lock(&mu);
    if (!w->broken) {
        memcpy(w->failure, msg, sizeof msg);
        w->broken = 1;
        LOG_DEBUG(MODULE, "rank %d: %s", w->rank, msg);
    }
    pthread_mutex_unlock(&mu);
    return status_errorf(STATUS_UNAVAILABLE, "%s", msg);
}

enum status parallel_mpi_fail(struct parallel_world *w, int rc, const char *call, const char *group)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    int call_len = (int)strcspn(call, "(");
    for (struct world_impl *wi = w->impl; wi; wi = wi->parent) wi->mpi_failed = 1;
    return parallel_world_fail(w, "%.*s on the %s group failed: %s", call_len, call, group, text);
}

enum status parallel_world_usable(const struct parallel_world *w)
{
    if (!w->broken) return STATUS_OK;
    return status_errorf(STATUS_UNAVAILABLE,
                         "parallel: rank %d cannot communicate after an earlier failure: %s",
                         w->rank, w->failure);
}

enum status parallel_mpi_wait(struct parallel_world *w, MPI_Request *req, MPI_Status *st,
                              const char *what, const char *group)
{
    MPI_Status ignored;
    if (!st) st = &ignored;
    if (w->timeout_s <= 0) {
        MPI_TRY(w, group, MPI_Wait(req, st));
        return STATUS_OK;
    }
    double start = base_now_s();
    for (long spin = 0;; spin++) {
        int done = 0;
        MPI_TRY(w, group, MPI_Test(req, &done, st));
        if (done) return STATUS_OK;
        if (spin >= 1000) sched_yield();
        if ((spin & 15) == 0 && base_now_s() - start > w->timeout_s) {
            ((struct world_impl *)w->impl)->n_abandoned++;
            char who[400];
            parallel_watch_explain(w, who, sizeof who);
            return parallel_world_fail(w, "%s on the %s group made no progress in %.1f s: %s", what, group,
                                       w->timeout_s, who);
        }
    }
}

enum status parallel_mpi_int_count(size_t n, const char *what, const char *group, int *out)
{
    if (n > (size_t)INT_MAX)
        return status_errorf(STATUS_UNSUPPORTED,
                             "parallel: %s of %zu elements on the %s group exceeds MPI's int count",
                             what, n, group);
    *out = (int)n;
    return STATUS_OK;
}

/* ---- the world ----------------------------------------------------------------------------- */

static int launched_by_mpi(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                       "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* w->gpu. One GPU per rank on a node, or, with SHARDLM_SHARE_GPU=1, every rank on device 0: a
 * test mode for machines with one GPU (tp 2, pp 2, dp 2 on it; correctness only, timings mean
 * nothing). NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected")
 * unless each believes it runs on a host of its own, so each rank gets its own NCCL_HOSTID and
 * the ranks talk through sockets over loopback. Set before any NCCL call of this process. */
static void world_pick_gpu(struct parallel_world *w)
{
    const char *share = getenv("SHARDLM_SHARE_GPU");
    if (!share || strcmp(share, "1") != 0) {
        w->gpu = w->local_rank;
        w->gpu_sharers = 1;
        return;
    }
    w->gpu = 0;
    w->gpu_sharers = w->local_size;
    if (w->size > 1) {
        char host_id[64];
        snprintf(host_id, sizeof host_id, "shardlm-shared-gpu-rank-%d", w->rank);
        setenv("NCCL_HOSTID", host_id, 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
    }
}

static enum status world_init_mpi(struct parallel_world *w, struct world_impl *wi, int *argc,
                                  char ***argv)
{
    int initialized = 0;
    MPI_TRY(w, "world", MPI_Initialized(&initialized));
    if (!initialized) {
        int provided = MPI_THREAD_SINGLE;
        MPI_TRY(w, "world", MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
        wi->owns_mpi = 1;
        w->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
        if (provided < MPI_THREAD_SERIALIZED)
            LOG_WARN(MODULE, "MPI provides thread level %d < MPI_THREAD_SERIALIZED: call the "
                     "parallel runtime from the thread that called parallel_init only", provided);
    } else {
        int provided = MPI_THREAD_SINGLE;
        MPI_TRY(w, "world", MPI_Query_thread(&provided));
        w->thread_multiple = provided >= MPI_THREAD_MULTIPLE;
    }
    /* Errors on our communicators come back as codes (inherited by dups and splits). */
    MPI_TRY(w, "world", MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_TRY(w, "world", MPI_Comm_dup(MPI_COMM_WORLD, &wi->comm));
    MPI_TRY(w, "world", MPI_Comm_rank(wi->comm, &w->rank));
    MPI_TRY(w, "world", MPI_Comm_size(wi->comm, &w->size));

    MPI_Comm node;
    MPI_TRY(w, "world", MPI_Comm_split_type(wi->comm, MPI_COMM_TYPE_SHARED, w->rank,
                                            MPI_INFO_NULL, &node));
    MPI_TRY(w, "node", MPI_Comm_rank(node, &w->local_rank));
    MPI_TRY(w, "node", MPI_Comm_size(node, &w->local_size));
    MPI_TRY(w, "node", MPI_Comm_free(&node));
    world_pick_gpu(w);

    MPI_TRY(w, "world", MPI_Comm_dup(wi->comm, &wi->msgs));
    MPI_Comm control;
    MPI_TRY(w, "world", MPI_Comm_dup(wi->comm, &control));
    return parallel_mpi_comm_wrap(w, "control", control, &w->control);
}

static struct world_impl *world_impl_new(void)
{
    struct world_impl *wi = calloc(1, sizeof *wi);
    if (!wi) return NULL;
    wi->comm = MPI_COMM_NULL;
    wi->msgs = MPI_COMM_NULL;
    pthread_mutex_init(&wi->send_mu, NULL);
    return wi;
}

static void world_impl_free(struct world_impl *wi);

/* Frees a world that failed to start; returns st with "cannot <what>: <the failure>". */
static enum status world_discard(struct parallel_world *w, enum status st, const char *what)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", status_message());
    comm_free(w->control);
    world_impl_free(w->impl);
    free(w);
    return status_errorf(st, "parallel: cannot %s: %s", what, msg);
}

static void world_impl_free(struct world_impl *wi)
{
    if (!wi) return;
    for (int i = 0; i < wi->n_sends; i++) free(wi->sends[i].buf); /* abandoned with the world */
    free(wi->sends);
    pthread_mutex_destroy(&wi->send_mu);
    free(wi);
}

enum status parallel_init(int *argc, char ***argv, struct parallel_world **out)
{
    *out = NULL;
    struct parallel_world *w = calloc(1, sizeof *w);
    struct world_impl *wi = world_impl_new();
    if (!w || !wi) {
        free(w);
        world_impl_free(wi);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    }
    w->impl = wi;
    w->rank = 0;
    w->size = 1;
    w->local_rank = 0;
    w->local_size = 1;
    w->gpu_sharers = 1;
    enum status st;
    if (launched_by_mpi()) {
        w->mpi = 1;
        st = world_init_mpi(w, wi, argc, argv);
        if (st == STATUS_OK)
            LOG_DEBUG(MODULE, "rank %d of %d (node rank %d of %d), MPI", w->rank, w->size,
                      w->local_rank, w->local_size);
    } else {
        st = parallel_mpi_comm_wrap(w, "control", MPI_COMM_NULL, &w->control);
    }
    /* On failure MPI is left initialised: finalising now could wait on ranks that started fine. */
    if (st != STATUS_OK) return world_discard(w, st, "start the world");
    *out = w;
    return STATUS_OK;
}

void parallel_finalize(struct parallel_world *w)
{
    if (!w) return;
    struct world_impl *wi = w->impl;
    if (!wi->parent) parallel_watch_stop(w);
    comm_free(w->control);
    w->control = NULL;
    if (w->mpi) {
        /* Messages still on their way (a final notice to a peer) get a short grace period. */
        int pending = 0;
        double oldest = 0;
        for (int i = 0; i < 200; i++) {
            if (parallel_msg_progress(w, &pending, &oldest) != STATUS_OK || pending == 0) break;
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (pending) wi->n_abandoned++;
        int clean = !w->broken && !wi->n_abandoned && !wi->mpi_failed;
        if (clean && wi->msgs != MPI_COMM_NULL) MPI_Comm_free(&wi->msgs);
        if (clean && wi->comm != MPI_COMM_NULL) MPI_Comm_free(&wi->comm);
        if (!clean && wi->parent) wi->parent->n_abandoned++;
        if (wi->owns_mpi) {
            if (clean) {
                MPI_Finalize();
            } else {
                LOG_WARN(MODULE, "rank %d: leaving MPI without MPI_Finalize after a "
                         "communication failure (it would wait on the missing ranks)", w->rank);
            }
        }
    }
    world_impl_free(wi);
    free(w);
}

enum status parallel_agree(struct parallel_world *w, enum status local)
{
    /* The local message first: the calls below may overwrite the thread's message. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", local == STATUS_OK ? "" : status_message());
    if (!w->mpi || w->size == 1) return local == STATUS_OK ? STATUS_OK : status_errorf(local, "%s", msg);
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    int mine = local == STATUS_OK ? w->size : w->rank, first = 0;
    MPI_TRY(w, "world", MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, wi->comm, &req));
    if ((st = parallel_mpi_wait(w, &req, NULL, "agreement", "world")) != STATUS_OK) return st;
    if (first == w->size) return STATUS_OK;
    struct {
        int32_t status;
        char    msg[1020];
    } m;
    memset(&m, 0, sizeof m);
    if (w->rank == first) {
        m.status = (int32_t)local;
        snprintf(m.msg, sizeof m.msg, "%.1000s", msg);
    }
    MPI_TRY(w, "world", MPI_Ibcast(&m, (int)sizeof m, MPI_BYTE, first, wi->comm, &req));
    if ((st = parallel_mpi_wait(w, &req, NULL, "agreement", "world")) != STATUS_OK) return st;
    m.msg[sizeof m.msg - 1] = '\0';
    return status_errorf((enum status)m.status, "rank %d: %s", first, m.msg);
}

enum status parallel_bcast_bytes(struct parallel_world *w, void *buf, size_t n, int root)
{
    CHECK(root >= 0 && root < w->size, "root %d outside a world of %d", root, w->size);
    CHECK(buf || n == 0, "NULL buffer of %zu bytes", n);
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK || w->size == 1) return st;
    int count = 0;
    if ((st = parallel_mpi_int_count(n, "byte broadcast", "world", &count)) != STATUS_OK) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Ibcast(buf, count, MPI_BYTE, root, wi->comm, &req));
    return parallel_mpi_wait(w, &req, NULL, "byte broadcast", "world");
}

enum status parallel_min_i64(struct parallel_world *w, int64_t *v)
{
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK || w->size == 1) return st;
    struct world_impl *wi = w->impl;
    int64_t mine = *v;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Iallreduce(&mine, v, 1, MPI_INT64_T, MPI_MIN, wi->comm, &req));
    return parallel_mpi_wait(w, &req, NULL, "minimum", "world");
}

enum status parallel_barrier(struct parallel_world *w)
{
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK || w->size == 1) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Ibarrier(wi->comm, &req));
    return parallel_mpi_wait(w, &req, NULL, "barrier", "world");
}

/* ---- sub-worlds ---------------------------------------------------------------------------- */

enum status parallel_world_split(struct parallel_world *w, int color, int key,
                                 struct parallel_world **out)
{
    *out = NULL;
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK) return st;
    struct parallel_world *sub = calloc(1, sizeof *sub);
    struct world_impl *si = world_impl_new();
    if (!sub || !si) {
        free(sub);
        world_impl_free(si);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory");
    }
    struct world_impl *wi = w->impl;
    sub->impl = si;
    si->parent = wi;
    sub->mpi = w->mpi;
    sub->thread_multiple = w->thread_multiple;
    sub->local_rank = w->local_rank; /* the node's GPU numbering does not change */
    sub->local_size = w->local_size;
    sub->gpu = w->gpu;
    sub->gpu_sharers = w->gpu_sharers;
    sub->rank = 0;
    sub->size = 1;
    MPI_Comm control = MPI_COMM_NULL;
    if (w->mpi) {
        int rc = MPI_Comm_split(wi->comm, color, key, &si->comm);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(si->comm, &sub->rank);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_size(si->comm, &sub->size);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(si->comm, &control);
        if (rc != MPI_SUCCESS) st = parallel_mpi_fail(w, rc, "MPI_Comm_split", "world");
    }
    if (st == STATUS_OK) st = parallel_mpi_comm_wrap(sub, "control", control, &sub->control);
    if (st != STATUS_OK) return world_discard(sub, st, "split the world");
    *out = sub;
    return STATUS_OK;
}

/* ---- the layout ---------------------------------------------------------------------------- */

enum status parallel_layout_make(int world_size, int rank, int tp, int pp,
                                 struct parallel_layout *out)
{
    memset(out, 0, sizeof *out);
    if (world_size < 1 || rank < 0 || rank >= world_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "parallel: rank %d in a world of %d",
                             rank, world_size);
    if (tp < 1 || pp < 1)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "parallel: tensor- and pipeline-parallel sizes must be >= 1 "
                             "(got tp %d, pp %d)", tp, pp);
    if ((long)tp * pp > world_size || world_size % (tp * pp) != 0)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "parallel: world size %d is not a multiple of tp %d x pp %d = %ld "
                             "(world = tp x pp x dp)", world_size, tp, pp, (long)tp * pp);
    out->world_size = world_size;
    out->rank = rank;
    out->tp_size = tp;
    out->pp_size = pp;
    out->dp_size = world_size / (tp * pp);
    out->tp_rank = rank % tp;
    out->pp_rank = (rank / tp) % pp;
    out->dp_rank = rank / (tp * pp);
    out->pp_prev = out->pp_rank > 0 ? rank - tp : -1;
    out->pp_next = out->pp_rank < pp - 1 ? rank + tp : -1;
    return STATUS_OK;
}

enum status parallel_layout(const struct parallel_world *w, int tp, int pp,
                            struct parallel_layout *out)
{
    enum status st = parallel_layout_make(w->size, w->rank, tp, pp, out);
    if (st != STATUS_OK && tp >= 1 && pp >= 1) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", status_message());
        return status_errorf(st, "%s; launch with mpirun -n %ld (or a multiple of it for data "
                             "parallelism)", msg, (long)tp * pp);
    }
    return st;
}

int parallel_layout_rank(const struct parallel_layout *l, int dp_rank, int pp_rank, int tp_rank)
{
    CHECK(dp_rank >= 0 && dp_rank < l->dp_size && pp_rank >= 0 && pp_rank < l->pp_size &&
              tp_rank >= 0 && tp_rank < l->tp_size,
          "coordinates (dp %d, pp %d, tp %d) outside dp %d x pp %d x tp %d", dp_rank, pp_rank,
          tp_rank, l->dp_size, l->pp_size, l->tp_size);
    return (dp_rank * l->pp_size + pp_rank) * l->tp_size + tp_rank;
}

/* ---- groups ------------------------------------------------------------------------------- */

/* Builds one group's communicator on every rank: MPI over the split communicator for CPU
 * tensors (which it takes), or NCCL bootstrapped over it for CUDA tensors (it is freed once the
 * NCCL communicator exists). The world agrees on the outcome, so a failure on any rank is a
 * failure on all. */
static enum status group_create(struct parallel_world *w, const char *name, int color, int key,
                                int size, enum device device, int device_id, void *stream,
                                struct comm **out)
{
    *out = NULL;
    struct world_impl *wi = w->impl;
    MPI_Comm mc = MPI_COMM_NULL;
    int rank = 0;
    if (w->mpi) {
        MPI_TRY(w, "world", MPI_Comm_split(wi->comm, color, key, &mc));
        int got_size = 0;
        MPI_TRY(w, name, MPI_Comm_rank(mc, &rank));
        MPI_TRY(w, name, MPI_Comm_size(mc, &got_size));
        CHECK(got_size == size && rank == key, "%s group: rank %d of %d, expected %d of %d",
              name, rank, got_size, key, size);
    }
    enum status st;
    if (device == DEVICE_CPU) {
        st = parallel_agree(w, parallel_mpi_comm_wrap(w, name, mc, out)); /* takes mc */
        mc = MPI_COMM_NULL;
    } else {
        unsigned char id[PARALLEL_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        st = parallel_agree(w, rank == 0 ? parallel_nccl_unique_id(id) : STATUS_OK);
        if (st == STATUS_OK && mc != MPI_COMM_NULL) {
            MPI_Request req;
            int rc = MPI_Ibcast(id, (int)sizeof id, MPI_BYTE, 0, mc, &req);
            st = rc == MPI_SUCCESS ? parallel_mpi_wait(w, &req, NULL, "NCCL id broadcast", name)
                                   : parallel_mpi_fail(w, rc, "MPI_Ibcast", name);
        }
        if (st == STATUS_OK)
            st = parallel_nccl_comm_create(w, name, id, rank, size, device_id, stream, out);
        st = parallel_agree(w, st);
    }
    if (mc != MPI_COMM_NULL && !w->broken) MPI_Comm_free(&mc); /* NCCL bootstrapped over it */
    if (st != STATUS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", status_message());
        comm_free(*out);
        *out = NULL;
        return status_errorf(st, "%s", msg);
    }
    return STATUS_OK;
}

enum status parallel_groups_init(struct parallel_world *w, const struct parallel_layout *l,
                                 enum device device, int device_id, void *stream,
                                 struct parallel_groups *out)
{
    memset(out, 0, sizeof *out);
    CHECK(l->world_size == w->size && l->rank == w->rank,
          "layout of rank %d in a world of %d used on rank %d of %d", l->rank, l->world_size,
          w->rank, w->size);
    enum status st = parallel_world_usable(w);
    if (st != STATUS_OK) return st;
    if (device == DEVICE_CUDA) {
        st = parallel_nccl_check_device(device_id);
        if ((st = parallel_agree(w, st)) != STATUS_OK) return st;
        CHECK(stream, "NCCL groups without the backend's stream: their operations would not be ordered with its ops");
    }
    /* Colors number the groups; keys order ranks inside them by their coordinate. */
    st = group_create(w, "tp", l->dp_rank * l->pp_size + l->pp_rank, l->tp_rank, l->tp_size,
                      device, device_id, stream, &out->tp);
    if (st == STATUS_OK)
        st = group_create(w, "pp", l->dp_rank * l->tp_size + l->tp_rank, l->pp_rank, l->pp_size,
                          device, device_id, stream, &out->pp);
    if (st == STATUS_OK)
        st = group_create(w, "dp", l->pp_rank * l->tp_size + l->tp_rank, l->dp_rank, l->dp_size,
                          device, device_id, stream, &out->dp);
    if (st != STATUS_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", status_message());
        parallel_groups_free(out);
        return status_errorf(st, "%s", msg);
    }
    return STATUS_OK;
}

enum status parallel_groups_add_ep(struct parallel_world *w, const struct parallel_layout *l, int ep,
                                   enum device device, int device_id, void *stream, struct parallel_groups *g)
{
    CHECK(ep >= 1 && l->dp_size % ep == 0, "ep %d does not divide dp %d", ep, l->dp_size);
    const int slot = l->pp_rank * l->tp_size + l->tp_rank, cells = l->pp_size * l->tp_size;
    enum status st = group_create(w, "ep", (l->dp_rank / ep) * cells + slot, l->dp_rank % ep, ep, device, device_id,
                                  stream, &g->ep);
    if (st == STATUS_OK)
        st = group_create(w, "edp", (l->dp_rank % ep) * cells + slot, l->dp_rank / ep, l->dp_size / ep, device,
                          device_id, stream, &g->edp);
    if (st != STATUS_OK) {
        comm_free(g->ep);
        comm_free(g->edp);
        g->ep = g->edp = NULL;
    }
    return st;
}

enum status parallel_groups_add_atp(struct parallel_world *w, const struct parallel_layout *l, int n,
                                    enum device device, int device_id, void *stream, struct parallel_groups *g)
{
    CHECK(n >= 1 && l->tp_size % n == 0, "attention tp %d does not divide the block of %d", n, l->tp_size);
    const int blocks = l->tp_size / n, color = (l->dp_rank * l->pp_size + l->pp_rank) * blocks + l->tp_rank / n;
    return group_create(w, "atp", color, l->tp_rank % n, n, device, device_id, stream, &g->atp);
}

void parallel_groups_free(struct parallel_groups *g)
{
    comm_free(g->tp);
    comm_free(g->pp);
    comm_free(g->dp);
    comm_free(g->ep);
    comm_free(g->edp);
    comm_free(g->atp);
    memset(g, 0, sizeof *g);
}
