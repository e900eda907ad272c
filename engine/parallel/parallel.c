/* engine/parallel/parallel.c - the world of ranks, the dp x pp x tp layout, the group communicators and
 * the MPI communicator (CPU tensors); the only file that calls MPI.
 * Not here: NCCL (parallel_nccl.c), what the model communicates when (model.c).
 * Tests: tests/test_parallel.c. Notes: docs/parallel.md.
 *
 * Every MPI operation is posted non-blocking and completed by mpi_wait, which either blocks
 * (no timeout) or polls against the world's timeout, so that a hung or dead peer becomes a
 * STATUS_UNAVAILABLE on this rank instead of a hang. Every MPI call goes through MPI_TRY. */
#include "parallel.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MODULE "parallel"

/* A message posted by parallel_msg_send and not yet known to be delivered. */
struct pending_send {
    MPI_Request req;
    void  *buf;        /* owned: freed once the send completes */
    double posted;     /* base_now_s() when posted */
};

/* The world's MPI state. */
struct world_impl {
    MPI_Comm comm;     /* a duplicate of MPI_COMM_WORLD: agree, bcast_bytes, barrier, splits */
    MPI_Comm msgs;     /* another duplicate: parallel_msg_* (top-level worlds only) */
    int owns_mpi;      /* MPI_Init_thread was called here, so MPI_Finalize is ours too */
    int n_abandoned;   /* operations left pending by a timeout: MPI_Finalize would wait on them */
    int mpi_failed;    /* an MPI call returned an error */
    struct world_impl *parent; /* a sub-world's parent (its failures count there too) */
    pthread_mutex_t send_mu;   /* pending sends: any thread may post, any may progress */
    struct pending_send *sends;
    int n_sends, cap_sends;
};

/* The MPI communicator's state (struct comm.impl). */
struct mpi_comm {
    MPI_Comm comm;     /* MPI_COMM_NULL for a group of one in a world without MPI */
    void    *scratch;  /* host memory for dtype widening and the last-dim gather */
    size_t   scratch_bytes;
};

static const struct comm_ops mpi_comm_ops;

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

/* The one place an MPI error code becomes a status: names the call (up to its '(') and the
 * group, with MPI's own text. */
static enum status mpi_fail(struct parallel_world *w, int rc, const char *call, const char *group)
{
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
    int call_len = (int)strcspn(call, "(");
    for (struct world_impl *wi = w->impl; wi; wi = wi->parent) wi->mpi_failed = 1;
    return parallel_world_fail(w, "%.*s on the %s group failed: %s", call_len, call, group, text);
}

#define MPI_TRY(w, group, call)                                                                 \
    do {                                                                                        \
        int mpi_try_rc_ = (call);                                                               \
        if (mpi_try_rc_ != MPI_SUCCESS) return mpi_fail((w), mpi_try_rc_, #call, (group));      \
    } while (0)

static enum status world_usable(const struct parallel_world *w)
{
    if (!w->broken) return STATUS_OK;
    return status_errorf(STATUS_UNAVAILABLE,
                         "parallel: rank %d cannot communicate after an earlier failure: %s",
                         w->rank, w->failure);
}

/* Completes *req. Without a timeout this is MPI_Wait. With one, it polls MPI_Test (yielding the
 * core after a short spin: ranks may share cores) until the deadline, then leaves the request
 * pending (MPI cannot cancel a collective), marks the world broken and fails. */
static enum status mpi_wait(struct parallel_world *w, MPI_Request *req, MPI_Status *st,
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
            return parallel_world_fail(w,
                                       "%s on the %s group made no progress in %.1f s: a rank "
                                       "is hung or gone",
                                       what, group, w->timeout_s);
        }
    }
}

static enum status mpi_int_count(size_t n, const char *what, const char *group, int *out)
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

static enum status mpi_comm_wrap(struct parallel_world *w, const char *name, MPI_Comm mc,
                                 struct comm **out);

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

    MPI_TRY(w, "world", MPI_Comm_dup(wi->comm, &wi->msgs));
    MPI_Comm control;
    MPI_TRY(w, "world", MPI_Comm_dup(wi->comm, &control));
    return mpi_comm_wrap(w, "control", control, &w->control);
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
    enum status st;
    if (launched_by_mpi()) {
        w->mpi = 1;
        st = world_init_mpi(w, wi, argc, argv);
        if (st == STATUS_OK)
            LOG_DEBUG(MODULE, "rank %d of %d (node rank %d of %d), MPI", w->rank, w->size,
                      w->local_rank, w->local_size);
    } else {
        st = mpi_comm_wrap(w, "control", MPI_COMM_NULL, &w->control);
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
    enum status st = world_usable(w);
    if (st != STATUS_OK) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    int mine = local == STATUS_OK ? w->size : w->rank, first = 0;
    MPI_TRY(w, "world", MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, wi->comm, &req));
    if ((st = mpi_wait(w, &req, NULL, "agreement", "world")) != STATUS_OK) return st;
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
    if ((st = mpi_wait(w, &req, NULL, "agreement", "world")) != STATUS_OK) return st;
    m.msg[sizeof m.msg - 1] = '\0';
    return status_errorf((enum status)m.status, "rank %d: %s", first, m.msg);
}

enum status parallel_bcast_bytes(struct parallel_world *w, void *buf, size_t n, int root)
{
    CHECK(root >= 0 && root < w->size, "root %d outside a world of %d", root, w->size);
    CHECK(buf || n == 0, "NULL buffer of %zu bytes", n);
    enum status st = world_usable(w);
    if (st != STATUS_OK || w->size == 1) return st;
    int count = 0;
    if ((st = mpi_int_count(n, "byte broadcast", "world", &count)) != STATUS_OK) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Ibcast(buf, count, MPI_BYTE, root, wi->comm, &req));
    return mpi_wait(w, &req, NULL, "byte broadcast", "world");
}

enum status parallel_barrier(struct parallel_world *w)
{
    enum status st = world_usable(w);
    if (st != STATUS_OK || w->size == 1) return st;
    struct world_impl *wi = w->impl;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Ibarrier(wi->comm, &req));
    return mpi_wait(w, &req, NULL, "barrier", "world");
}

/* ---- sub-worlds ---------------------------------------------------------------------------- */

enum status parallel_world_split(struct parallel_world *w, int color, int key,
                                 struct parallel_world **out)
{
    *out = NULL;
    enum status st = world_usable(w);
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
    sub->rank = 0;
    sub->size = 1;
    MPI_Comm control = MPI_COMM_NULL;
    if (w->mpi) {
        int rc = MPI_Comm_split(wi->comm, color, key, &si->comm);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(si->comm, &sub->rank);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_size(si->comm, &sub->size);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(si->comm, &control);
        if (rc != MPI_SUCCESS) st = mpi_fail(w, rc, "MPI_Comm_split", "world");
    }
    if (st == STATUS_OK) st = mpi_comm_wrap(sub, "control", control, &sub->control);
    if (st != STATUS_OK) return world_discard(sub, st, "split the world");
    *out = sub;
    return STATUS_OK;
}

/* ---- messages ------------------------------------------------------------------------------ */

enum status parallel_msg_send(struct parallel_world *w, int dest, void *buf, size_t n)
{
    CHECK(dest >= 0 && dest < w->size && dest != w->rank, "message to rank %d from rank %d of %d",
          dest, w->rank, w->size);
    CHECK(w->mpi && ((struct world_impl *)w->impl)->msgs != MPI_COMM_NULL,
          "parallel_msg_send on a world without its own MPI message channel");
    enum status st = world_usable(w);
    int count = 0;
    if (st == STATUS_OK) st = mpi_int_count(n, "message", "world", &count);
    if (st != STATUS_OK) {
        free(buf);
        return st;
    }
    struct world_impl *wi = w->impl;
    pthread_mutex_lock(&wi->send_mu);
    if (wi->n_sends == wi->cap_sends) {
        int cap = wi->cap_sends ? 2 * wi->cap_sends : 64;
        struct pending_send *ns = realloc(wi->sends, (size_t)cap * sizeof *ns);
        if (!ns) {
            pthread_mutex_unlock(&wi->send_mu);
            free(buf);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "parallel: out of memory for a message");
        }
        wi->sends = ns;
        wi->cap_sends = cap;
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
        return mpi_fail(w, rc, "MPI_Isend", "world");
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
            if (rc != MPI_SUCCESS) st = mpi_fail(w, rc, "MPI_Test", "world");
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
    if (st == STATUS_OK) st = world_usable(w);
    return st;
}

enum status parallel_msg_poll(struct parallel_world *w, int *got, int *source, size_t *n)
{
    *got = 0;
    *source = -1;
    *n = 0;
    struct world_impl *wi = w->impl;
    enum status st = world_usable(w);
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
    enum status st = world_usable(w);
    if (st == STATUS_OK) st = mpi_int_count(n, "message", "world", &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(w, "world", MPI_Irecv(buf, count, MPI_BYTE, source, 0, wi->msgs, &req));
    return mpi_wait(w, &req, NULL, "message receive", "world");
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
        st = parallel_agree(w, mpi_comm_wrap(w, name, mc, out)); /* takes mc */
        mc = MPI_COMM_NULL;
    } else {
        unsigned char id[PARALLEL_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        st = parallel_agree(w, rank == 0 ? parallel_nccl_unique_id(id) : STATUS_OK);
        if (st == STATUS_OK && mc != MPI_COMM_NULL) {
            MPI_Request req;
            int rc = MPI_Ibcast(id, (int)sizeof id, MPI_BYTE, 0, mc, &req);
            st = rc == MPI_SUCCESS ? mpi_wait(w, &req, NULL, "NCCL id broadcast", name)
                                   : mpi_fail(w, rc, "MPI_Ibcast", name);
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
    enum status st = world_usable(w);
    if (st != STATUS_OK) return st;
    if (device == DEVICE_CUDA) {
        st = parallel_nccl_check_device(device_id);
        if ((st = parallel_agree(w, st)) != STATUS_OK) return st;
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

void parallel_groups_free(struct parallel_groups *g)
{
    comm_free(g->tp);
    comm_free(g->pp);
    comm_free(g->dp);
    memset(g, 0, sizeof *g);
}

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
        enum status comm_run_st_ = world_usable((c)->world);                                    \
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

enum status comm_reserve(struct comm *c, size_t max_numel) { return c->ops->reserve(c, max_numel); }

enum status comm_synchronize(struct comm *c)
{
    enum status st = world_usable(c->world);
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

/* Takes ownership of mc (MPI_COMM_NULL: a group of one without MPI). */
static enum status mpi_comm_wrap(struct parallel_world *w, const char *name, MPI_Comm mc,
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
            enum status st = mpi_fail(w, rc, "MPI_Comm_rank", name);
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
    enum status st = mpi_int_count(n, "all_reduce", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, MPI_SUM, m->comm,
                                              &req));
    return mpi_wait(c->world, &req, NULL, "all_reduce", c->name);
}

static enum status mpi_all_reduce(struct comm *c, const struct tensor *x)
{
    if (c->size == 1) return STATUS_OK;
    size_t n = (size_t)tensor_numel(x);
    if (x->dtype == DTYPE_F32) return mpi_sum(c, x->data, n, MPI_FLOAT);
    if (x->dtype == DTYPE_I32) return mpi_sum(c, x->data, n, MPI_INT32_T);
    /* bf16/f16: the sum in f32, one rounding on the way back, as the ops do. */
    void *wide;
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
    enum status st = mpi_int_count(nbytes, "all_gather (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Iallgather(src, count, MPI_BYTE, dst, count, MPI_BYTE, m->comm,
                                              &req));
    return mpi_wait(c->world, &req, NULL, "all_gather", c->name);
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
    enum status st = mpi_int_count(n_in, "reduce_scatter", c->name, &count);
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
    if ((st = mpi_wait(c->world, &req, NULL, "reduce_scatter", c->name)) != STATUS_OK) return st;
    if (wide) dtype_convert(out->data, out->dtype, recv, DTYPE_F32, n_out);
    return STATUS_OK;
}

static enum status mpi_broadcast(struct comm *c, const struct tensor *x, int root)
{
    struct mpi_comm *m = c->impl;
    if (c->size == 1) return STATUS_OK;
    int count = 0;
    enum status st = mpi_int_count(tensor_nbytes(x), "broadcast (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Ibcast(x->data, count, MPI_BYTE, root, m->comm, &req));
    return mpi_wait(c->world, &req, NULL, "broadcast", c->name);
}

/* Point-to-point messages of one group share a tag: MPI keeps them in order per sender. */
enum { PARALLEL_P2P_TAG = 17 };

static enum status mpi_send(struct comm *c, const struct tensor *x, int peer)
{
    struct mpi_comm *m = c->impl;
    int count = 0;
    enum status st = mpi_int_count(tensor_nbytes(x), "send (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_TRY(c->world, c->name, MPI_Isend(x->data, count, MPI_BYTE, peer, PARALLEL_P2P_TAG,
                                         m->comm, &req));
    return mpi_wait(c->world, &req, NULL, "send", c->name);
}

static enum status mpi_recv(struct comm *c, const struct tensor *x, int peer)
{
    struct mpi_comm *m = c->impl;
    int count = 0, got = 0;
    enum status st = mpi_int_count(tensor_nbytes(x), "recv (bytes)", c->name, &count);
    if (st != STATUS_OK) return st;
    MPI_Request req;
    MPI_Status mst;
    MPI_TRY(c->world, c->name, MPI_Irecv(x->data, count, MPI_BYTE, peer, PARALLEL_P2P_TAG, m->comm,
                                         &req));
    if ((st = mpi_wait(c->world, &req, &mst, "recv", c->name)) != STATUS_OK) return st;
    MPI_TRY(c->world, c->name, MPI_Get_count(&mst, MPI_BYTE, &got));
    /* A longer message fails inside MPI (truncation); a shorter one is a mismatched pair. */
    CHECK(got == count, "%s comm: rank %d received %d bytes from %d, expected %d", c->name,
          c->rank, got, peer, count);
    return STATUS_OK;
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
    .reserve = mpi_comm_reserve,
    .synchronize = mpi_synchronize,
    .free = mpi_comm_free,
};
