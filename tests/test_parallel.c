/* tests/test_parallel.c - the parallel runtime's communication layer (engine/parallel/parallel.h), run
 * as a world of one and under `mpirun -n 2|3|4 --oversubscribe` (tests/parallel.cmake):
 * - layouts: every (world, tp, pp) up to 16 ranks (bijective, tp fastest, pipeline
 *   neighbours), the groups of each layout of this world checked by gathering world ranks, and
 *   the errors for a world that is not a multiple of tp x pp;
 * - every collective of the tp group and of the control communicator (all_reduce,
 *   all_gather, all_gather_last, reduce_scatter, broadcast from the first and last rank)
 *   against a locally computed expectation, for odd shapes and every float dtype (and i32),
 *   with guard bytes around outputs and bit-identical all_reduce results across ranks, once
 *   blocking and once through the timeout-polling path;
 * - send/recv: a ring on the control communicator, a pipeline chain through the pp group,
 *   sampled tokens back to rank 0;
 * - the control plane: a step-plan-like byte buffer broadcast from rank 0 and the last rank,
 *   parallel_agree, barrier; asking for NCCL groups where there is no NCCL is an agreed error;
 * - --hang (mpirun -n 2): rank 1 hangs (its heartbeats stopped); rank 0 must fail with
 *   STATUS_UNAVAILABLE naming rank 1 after its timeout, and every later call must fail at once;
 * - --nccl: the same collectives on CUDA tensors through NCCL (label gpu): SKIP (exit 77)
 *   without NCCL or without one GPU per rank.
 * Rank 0 prints "N passed, M failed" for the whole world; every rank exits 1 when any failed. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"
#include "parallel.h"

static int n_pass, n_fail, my_rank;

static int expect(int ok, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int expect(int ok, int line, const char *fmt, ...)
{
    if (ok) {
        n_pass++;
        return 1;
    }
    n_fail++;
    va_list ap;
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("rank %d: FAIL (line %d): %s\n", my_rank, line, msg);
    fflush(stdout);
    return 0;
}
#define EXPECT(cond, ...) expect((cond), __LINE__, __VA_ARGS__)
#define EXPECT_OK(call)                                                                         \
    do {                                                                                        \
        enum status expect_st_ = (call);                                                        \
        EXPECT(expect_st_ == STATUS_OK, "%s: %s: %s", #call, status_name(expect_st_),           \
               status_message());                                                               \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- deterministic data: every rank can compute every other rank's input -------------------- */

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Element i of rank r's input for test `seed`, in [-1, 1) for floats, small ints for i32. */
static float gen(uint32_t seed, int r, size_t i)
{
    uint32_t h = mix(seed * 0x9e3779b9U ^ mix((uint32_t)r * 0x85ebca6bU ^ mix((uint32_t)i)));
    return (float)((double)(h >> 8) / 8388608.0 - 1.0);
}

static void fill(void *host, enum dtype dt, size_t n, uint32_t seed, int r)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == DTYPE_I32) ((int32_t *)host)[i] = (int32_t)(mix(seed ^ mix((uint32_t)(r * 7919 + (int)i))) % 2001) - 1000;
        else dtype_store_f32(host, dt, i, gen(seed, r, i));
    }
}

/* The stored (rounded) value of element i of rank r's input, widened to double. */
static double stored(enum dtype dt, uint32_t seed, int r, size_t i)
{
    unsigned char tmp[4];
    if (dt == DTYPE_I32) {
        int32_t v = (int32_t)(mix(seed ^ mix((uint32_t)(r * 7919 + (int)i))) % 2001) - 1000;
        return v;
    }
    dtype_store_f32(tmp, dt, 0, gen(seed, r, i));
    return dtype_load_f32(tmp, dt, 0);
}

/* Relative accuracy of one rounding to dt, per rank summed (NCCL rounds at every hop). */
static double tolerance(enum dtype dt, int size)
{
    switch (dt) {
    case DTYPE_F32: return 2e-7 * (size + 1);
    case DTYPE_BF16: return (1.0 / 256) * size;
    case DTYPE_F16: return (1.0 / 2048) * size;
    case DTYPE_I32: return 0;
    default: break;
    }
    return 0;
}

/* ---- tensors on the communicator's device, with guard bytes around them ---------------------- */

enum { GUARD = 64 };
static const unsigned char GUARD_BYTE = 0xA5;

struct buf {
    struct tensor t;    /* the view the comm sees */
    void  *base;        /* device allocation: GUARD | t | GUARD */
    size_t nbytes;      /* of t */
    unsigned char *host; /* host staging of the whole allocation */
};

static struct buf buf_make(struct backend *b, enum dtype dt, int ndim, const int64_t *shape)
{
    struct buf x;
    memset(&x, 0, sizeof x);
    size_t n = dtype_size(dt);
    for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    x.nbytes = n;
    enum status st = backend_alloc(b, n + 2 * GUARD, &x.base);
    if (st != STATUS_OK) {
        fprintf(stderr, "rank %d: cannot allocate %zu bytes: %s\n", my_rank, n, status_message());
        exit(1);
    }
    x.host = malloc(n + 2 * GUARD);
    if (!x.host) exit(1);
    memset(x.host, GUARD_BYTE, n + 2 * GUARD);
    backend_upload(b, x.base, x.host, n + 2 * GUARD);
    x.t.data = (unsigned char *)x.base + GUARD;
    x.t.dtype = dt;
    x.t.device = b->device;
    x.t.ndim = ndim;
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) x.t.shape[i] = i < ndim ? shape[i] : 1;
    return x;
}

/* The tensor's bytes: host + GUARD. */
static unsigned char *buf_data(struct buf *x) { return x->host + GUARD; }

static void buf_put(struct backend *b, struct buf *x)
{
    backend_upload(b, x->base, x->host, x->nbytes + 2 * GUARD);
    backend_synchronize(b);
}

/* Downloads, and says whether the guards are intact. */
static int buf_get(struct backend *b, struct buf *x)
{
    backend_synchronize(b);
    backend_download(b, x->host, x->base, x->nbytes + 2 * GUARD);
    for (size_t i = 0; i < GUARD; i++)
        if (x->host[i] != GUARD_BYTE || x->host[GUARD + x->nbytes + i] != GUARD_BYTE) return 0;
    return 1;
}

static void buf_free(struct backend *b, struct buf *x)
{
    backend_free(b, x->base);
    free(x->host);
    memset(x, 0, sizeof *x);
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* ---- collectives ------------------------------------------------------------------------- */

struct shape {
    int     ndim;
    int64_t d[3];
};

static const struct shape SHAPES[] = {
    {1, {1}}, {2, {1, 13}}, {2, {3, 7}}, {2, {5, 33}}, {3, {2, 3, 5}}, {2, {67, 1031}},
};
static const enum dtype FLOATS[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};

static uint32_t seed_counter = 1;

static void check_all_reduce(struct comm *c, struct backend *b, enum dtype dt, const struct shape *s,
                             const char *label)
{
    uint32_t seed = seed_counter++;
    struct buf x = buf_make(b, dt, s->ndim, s->d);
    size_t n = (size_t)numel_of(s->ndim, s->d);
    fill(buf_data(&x), dt, n, seed, c->rank);
    buf_put(b, &x);
    enum status st = comm_all_reduce(c, &x.t);
    if (st == STATUS_OK) st = comm_synchronize(c);
    int ok = EXPECT(st == STATUS_OK, "%s all_reduce %s: %s", label, dtype_name(dt), status_message());
    ok = ok && EXPECT(buf_get(b, &x), "%s all_reduce %s: guard bytes overwritten", label,
                      dtype_name(dt));
    double tol = tolerance(dt, c->size);
    size_t bad = 0, first_bad = 0;
    double got_bad = 0, exp_bad = 0;
    for (size_t i = 0; ok && i < n; i++) {
        double sum = 0, sum_abs = 0;
        for (int r = 0; r < c->size; r++) {
            double v = stored(dt, seed, r, i);
            sum += v;
            sum_abs += fabs(v);
        }
        double got = dt == DTYPE_I32 ? ((int32_t *)buf_data(&x))[i] : dtype_load_f32(buf_data(&x), dt, i);
        if (!(fabs(got - sum) <= tol * sum_abs + 1e-7)) {
            if (!bad++) first_bad = i, got_bad = got, exp_bad = sum;
        }
    }
    ok = ok && EXPECT(bad == 0, "%s all_reduce %s [%lld...]: %zu wrong, first at %zu: %g != %g",
                      label, dtype_name(dt), (long long)s->d[0], bad, first_bad, got_bad, exp_bad);
    /* Every rank must hold the same bits: replicated activations may never drift apart. */
    if (ok) {
        int64_t all_shape[4] = {c->size * s->d[0], s->d[1], s->d[2], 1};
        struct buf all = buf_make(b, dt, s->ndim, all_shape);
        st = comm_all_gather(c, &all.t, &x.t);
        if (st == STATUS_OK) st = comm_synchronize(c);
        EXPECT(st == STATUS_OK, "%s gather for identity: %s", label, status_message());
        buf_get(b, &all);
        int same = 1;
        for (int r = 0; r < c->size; r++)
            same &= !memcmp(buf_data(&all) + (size_t)r * x.nbytes, buf_data(&x), x.nbytes);
        EXPECT(same, "%s all_reduce %s: ranks disagree bitwise", label, dtype_name(dt));
        buf_free(b, &all);
    }
    buf_free(b, &x);
}

static void check_all_gather(struct comm *c, struct backend *b, enum dtype dt, const struct shape *s,
                             int last, const char *label)
{
    uint32_t seed = seed_counter++;
    struct buf in = buf_make(b, dt, s->ndim, s->d);
    int64_t out_shape[3] = {s->d[0], s->d[1], s->d[2]};
    int dim = last ? s->ndim - 1 : 0;
    out_shape[dim] *= c->size;
    struct buf out = buf_make(b, dt, s->ndim, out_shape);
    size_t n = (size_t)numel_of(s->ndim, s->d), es = dtype_size(dt);
    fill(buf_data(&in), dt, n, seed, c->rank);
    buf_put(b, &in);
    enum status st = last ? comm_all_gather_last(c, &out.t, &in.t) : comm_all_gather(c, &out.t, &in.t);
    if (st == STATUS_OK) st = comm_synchronize(c);
    const char *op = last ? "all_gather_last" : "all_gather";
    int ok = EXPECT(st == STATUS_OK, "%s %s %s: %s", label, op, dtype_name(dt), status_message());
    ok = ok && EXPECT(buf_get(b, &out), "%s %s %s: guard bytes overwritten", label, op,
                      dtype_name(dt));
    size_t k = (size_t)s->d[s->ndim - 1], rows = n / k, bad = 0;
    unsigned char *expect_r = malloc(n * es);
    for (int r = 0; ok && r < c->size; r++) {
        fill(expect_r, dt, n, seed, r);
        for (size_t row = 0; row < rows; row++) {
            size_t at = last ? (row * (size_t)c->size + (size_t)r) * k : ((size_t)r * rows + row) * k;
            bad += memcmp(buf_data(&out) + at * es, expect_r + row * k * es, k * es) != 0;
        }
    }
    free(expect_r);
    ok = ok && EXPECT(bad == 0, "%s %s %s [%lld...]: %zu rows wrong", label, op, dtype_name(dt),
                      (long long)s->d[0], bad);
    buf_free(b, &in);
    buf_free(b, &out);
}

static void check_reduce_scatter(struct comm *c, struct backend *b, enum dtype dt,
                                 const struct shape *s, const char *label)
{
    uint32_t seed = seed_counter++;
    int64_t in_shape[3] = {s->d[0] * c->size, s->d[1], s->d[2]};
    struct buf in = buf_make(b, dt, s->ndim, in_shape);
    struct buf out = buf_make(b, dt, s->ndim, s->d);
    size_t n = (size_t)numel_of(s->ndim, s->d);
    fill(buf_data(&in), dt, n * (size_t)c->size, seed, c->rank);
    buf_put(b, &in);
    enum status st = comm_reduce_scatter(c, &out.t, &in.t);
    if (st == STATUS_OK) st = comm_synchronize(c);
    int ok = EXPECT(st == STATUS_OK, "%s reduce_scatter %s: %s", label, dtype_name(dt),
                    status_message());
    ok = ok && EXPECT(buf_get(b, &out), "%s reduce_scatter %s: guard bytes overwritten", label,
                      dtype_name(dt));
    double tol = tolerance(dt, c->size);
    size_t bad = 0;
    for (size_t i = 0; ok && i < n; i++) {
        double sum = 0, sum_abs = 0;
        for (int r = 0; r < c->size; r++) {
            double v = stored(dt, seed, r, (size_t)c->rank * n + i);
            sum += v;
            sum_abs += fabs(v);
        }
        double got = dtype_load_f32(buf_data(&out), dt, i);
        bad += !(fabs(got - sum) <= tol * sum_abs + 1e-7);
    }
    ok = ok && EXPECT(bad == 0, "%s reduce_scatter %s [%lld...]: %zu wrong", label, dtype_name(dt),
                      (long long)s->d[0], bad);
    buf_free(b, &in);
    buf_free(b, &out);
}

static void check_broadcast(struct comm *c, struct backend *b, enum dtype dt, const struct shape *s,
                            int root, const char *label)
{
    uint32_t seed = seed_counter++;
    struct buf x = buf_make(b, dt, s->ndim, s->d);
    size_t n = (size_t)numel_of(s->ndim, s->d);
    /* Non-roots start from other data, so that a no-op cannot pass. */
    fill(buf_data(&x), dt, n, c->rank == root ? seed : seed + 1000003, c->rank);
    buf_put(b, &x);
    enum status st = comm_broadcast(c, &x.t, root);
    if (st == STATUS_OK) st = comm_synchronize(c);
    int ok = EXPECT(st == STATUS_OK, "%s broadcast %s: %s", label, dtype_name(dt), status_message());
    ok = ok && EXPECT(buf_get(b, &x), "%s broadcast: guard bytes overwritten", label);
    unsigned char *want = malloc(x.nbytes + 1);
    fill(want, dt, n, seed, root);
    ok = ok && EXPECT(!memcmp(want, buf_data(&x), x.nbytes), "%s broadcast %s from %d: wrong data",
                      label, dtype_name(dt), root);
    free(want);
    buf_free(b, &x);
}

/* The all-to-all of rows (comm_all_to_all_rows): rank r sends (3 r + 5 q + cols) % 4 rows (zero
 * included) of `cols` columns to rank q, rank r's whole send buffer filled from (seed, r); each
 * rank rebuilds every sender's buffer and compares the segment meant for it, checks the guard
 * bytes and that the byte counter grew by the rows sent to other ranks only. */
static int64_t a2a_rows(int r, int q, int64_t cols) { return (3 * r + 5 * q + cols) % 4; }

static void check_all_to_all(struct comm *c, struct backend *b, enum dtype dt, int64_t cols, const char *label)
{
    uint32_t seed = seed_counter++;
    const int N = c->size, me = c->rank;
    int64_t send[64], recv[64], ns = 0, nr = 0, remote = 0;
    if (N > 64) return;
    for (int q = 0; q < N; q++) {
        send[q] = a2a_rows(me, q, cols), recv[q] = a2a_rows(q, me, cols);
        ns += send[q], nr += recv[q];
        if (q != me) remote += send[q];
    }
    int64_t sshape[2] = {ns ? ns : 1, cols}, rshape[2] = {nr ? nr : 1, cols};
    struct buf sx = buf_make(b, dt, 2, sshape), rx = buf_make(b, dt, 2, rshape);
    fill(buf_data(&sx), dt, (size_t)(ns * cols), seed, me);
    buf_put(b, &sx);
    const uint64_t bytes0 = c->n_bytes;
    enum status st = comm_all_to_all_rows(c, &sx.t, send, &rx.t, recv);
    if (st == STATUS_OK) st = comm_synchronize(c);
    int ok = EXPECT(st == STATUS_OK, "%s all-to-all %s x %lld: %s", label, dtype_name(dt), (long long)cols,
                    status_message());
    ok = ok && EXPECT(buf_get(b, &rx), "%s all-to-all: guard bytes overwritten", label);
    ok = ok && EXPECT(c->n_bytes - bytes0 == (uint64_t)(remote * cols) * dtype_size(dt),
                      "%s all-to-all: counted %llu bytes, sent %lld rows to others", label,
                      (unsigned long long)(c->n_bytes - bytes0), (long long)remote);
    const size_t es = dtype_size(dt), row = (size_t)cols * es;
    size_t at = 0;
    for (int r = 0; r < N && ok; r++) {
        int64_t n_r = 0, off = 0; /* sender r's buffer, and where its rows for me start */
        for (int q = 0; q < N; q++) {
            if (q == me) off = n_r;
            n_r += a2a_rows(r, q, cols);
        }
        unsigned char *want = malloc((size_t)n_r * row + 1);
        fill(want, dt, (size_t)(n_r * cols), seed, r);
        ok = EXPECT(!memcmp(want + (size_t)off * row, buf_data(&rx) + at, (size_t)recv[r] * row),
                    "%s all-to-all %s x %lld: wrong rows from rank %d", label, dtype_name(dt), (long long)cols, r);
        at += (size_t)recv[r] * row;
        free(want);
    }
    buf_free(b, &sx);
    buf_free(b, &rx);
}

/* Every collective, every float dtype (i32 where it applies), every shape. */
static void check_collectives(struct comm *c, struct backend *b, const char *label, int n_shapes)
{
    for (int si = 0; si < n_shapes; si++) {
        const struct shape *s = &SHAPES[si];
        for (size_t di = 0; di < sizeof FLOATS / sizeof FLOATS[0]; di++) {
            enum dtype dt = FLOATS[di];
            check_all_reduce(c, b, dt, s, label);
            check_all_gather(c, b, dt, s, 0, label);
            check_all_gather(c, b, dt, s, 1, label);
            check_reduce_scatter(c, b, dt, s, label);
            check_broadcast(c, b, dt, s, 0, label);
            if (c->size > 1) check_broadcast(c, b, dt, s, c->size - 1, label);
        }
        check_all_reduce(c, b, DTYPE_I32, s, label);
        check_all_gather(c, b, DTYPE_I32, s, 1, label);
    }
    for (int64_t cols = 1; cols <= 1031; cols += 1030) {
        check_all_to_all(c, b, DTYPE_F32, cols, label);
        check_all_to_all(c, b, DTYPE_BF16, cols, label);
    }
}

/* The ordering contract of parallel.h: an op, the all-reduce of its output and an op on the
 * sum, queued back to back without any synchronisation, then one download (which waits for the
 * backend's stream). On CUDA all three run on the backend's stream, in order; communicators on
 * another stream (the legacy default one, before issue 25) could reduce y before op_scale wrote
 * it, or let the second op_scale read y before the sum landed. 4M floats, so that a race has
 * room to show (on the CPU every call is synchronous and the check holds trivially: 16K). */
static void check_stream_order(struct comm *c, struct backend *b, const char *label)
{
    const int64_t n = b->device == DEVICE_CUDA ? (int64_t)1 << 22 : (int64_t)1 << 14;
    const size_t bytes = (size_t)n * sizeof(float);
    float *host = malloc(bytes);
    CHECK(host, "out of memory");
    for (int64_t i = 0; i < n; i++) host[i] = (float)(i % 13 + c->rank);
    struct tensor x, y, z;
    EXPECT_OK(backend_alloc_tensor(b, &x, DTYPE_F32, 1, &n));
    EXPECT_OK(backend_alloc_tensor(b, &y, DTYPE_F32, 1, &n));
    EXPECT_OK(backend_alloc_tensor(b, &z, DTYPE_F32, 1, &n));
    for (int round = 0; round < 3; round++) {
        backend_upload(b, x.data, host, bytes);
        op_scale(b, &y, &x, 2.0f);
        enum status st = comm_all_reduce(c, &y);
        op_scale(b, &z, &y, 0.5f);
        float *got = calloc((size_t)n, sizeof *got);
        CHECK(got, "out of memory");
        backend_download(b, got, z.data, bytes);
        if (st == STATUS_OK) st = comm_synchronize(c);
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++) {
            /* sum over ranks of (i % 13 + rank): exact in f32 */
            float want = (float)(c->size * (i % 13) + c->size * (c->size - 1) / 2);
            if (got[i] != want && !bad++) first = i;
        }
        EXPECT(st == STATUS_OK, "%s ordered all_reduce: %s", label, status_message());
        EXPECT(bad == 0, "%s: op -> all_reduce -> op queued without synchronisation: %lld of %lld wrong (first at %lld)",
               label, (long long)bad, (long long)n, (long long)first);
        free(got);
    }
    backend_free(b, x.data);
    backend_free(b, y.data);
    backend_free(b, z.data);
    free(host);
}

/* ---- point to point ---------------------------------------------------------------------- */

/* A token ring: rank 0 sends first, the others receive first, so blocking sends cannot form a
 * cycle. */
static void check_ring(struct comm *c, struct backend *b, enum dtype dt, int64_t rows, int64_t cols,
                       const char *label)
{
    if (c->size < 2) return;
    uint32_t seed = seed_counter++;
    int64_t shape[2] = {rows, cols};
    struct buf out = buf_make(b, dt, 2, shape), in = buf_make(b, dt, 2, shape);
    size_t n = (size_t)(rows * cols);
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    fill(buf_data(&out), dt, n, seed, c->rank);
    buf_put(b, &out);
    enum status st = STATUS_OK;
    if (c->rank == 0) {
        st = comm_send(c, &out.t, next);
        if (st == STATUS_OK) st = comm_recv(c, &in.t, prev);
    } else {
        st = comm_recv(c, &in.t, prev);
        if (st == STATUS_OK) st = comm_send(c, &out.t, next);
    }
    if (st == STATUS_OK) st = comm_synchronize(c);
    int ok = EXPECT(st == STATUS_OK, "%s ring: %s", label, status_message());
    ok = ok && EXPECT(buf_get(b, &in), "%s ring: guard bytes overwritten", label);
    unsigned char *want = malloc(in.nbytes);
    fill(want, dt, n, seed, prev);
    ok = ok && EXPECT(!memcmp(want, buf_data(&in), in.nbytes), "%s ring %s (%lld x %lld): wrong data from %d",
                      label, dtype_name(dt), (long long)rows, (long long)cols, prev);
    free(want);
    buf_free(b, &out);
    buf_free(b, &in);
}

/* Activations through the pipeline: stage s receives from s-1, adds 1, sends to s+1; the last
 * stage holds the first stage's values + (pp - 1). Then, as sampled tokens do, the last stage's
 * tp-rank-0 sends an i32 vector to world rank 0 over the control communicator. */
static void check_pipeline(struct parallel_world *w, const struct parallel_layout *l,
                           struct comm *pp, struct backend *b, const char *label)
{
    uint32_t seed = seed_counter++;
    int64_t shape[2] = {7, 65};
    struct buf x = buf_make(b, DTYPE_F32, 2, shape);
    size_t n = 7 * 65;
    enum status st = STATUS_OK;
    if (pp->rank == 0) {
        fill(buf_data(&x), DTYPE_F32, n, seed, l->dp_rank * l->tp_size + l->tp_rank);
    } else {
        st = comm_recv(pp, &x.t, pp->rank - 1);
        if (st == STATUS_OK) st = comm_synchronize(pp);
        buf_get(b, &x);
    }
    for (size_t i = 0; i < n; i++) ((float *)buf_data(&x))[i] += 1.0f;
    buf_put(b, &x);
    if (st == STATUS_OK && pp->rank < pp->size - 1) st = comm_send(pp, &x.t, pp->rank + 1);
    if (st == STATUS_OK) st = comm_synchronize(pp);
    EXPECT(st == STATUS_OK, "%s pipeline: %s", label, status_message());
    if (pp->rank == pp->size - 1) {
        buf_get(b, &x);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            /* The same f32 additions in the same order: exact. */
            float v = gen(seed, l->dp_rank * l->tp_size + l->tp_rank, i);
            for (int s = 0; s < pp->size; s++) v += 1.0f;
            bad += ((float *)buf_data(&x))[i] != v;
        }
        EXPECT(bad == 0, "%s pipeline: %zu values wrong at the last stage", label, bad);
    }
    buf_free(b, &x);

    /* Sampled tokens of every replica's last stage return to rank 0 (host i32). */
    int32_t tokens[5];
    struct tensor t = tensor_make(tokens, DTYPE_I32, DEVICE_CPU, 1, (int64_t)5);
    int is_sampler = l->pp_rank == l->pp_size - 1 && l->tp_rank == 0;
    if (w->rank == 0) {
        for (int d = 0; d < l->dp_size; d++) {
            int src = parallel_layout_rank(l, d, l->pp_size - 1, 0);
            if (src == 0) continue;
            memset(tokens, 0, sizeof tokens);
            EXPECT_OK(comm_recv(w->control, &t, src));
            int good = 1;
            for (int i = 0; i < 5; i++) good &= tokens[i] == src * 100 + i;
            EXPECT(good, "%s tokens from rank %d: wrong", label, src);
        }
    } else if (is_sampler) {
        for (int i = 0; i < 5; i++) tokens[i] = w->rank * 100 + i;
        EXPECT_OK(comm_send(w->control, &t, 0));
    }
}

/* ---- layouts and groups ------------------------------------------------------------------- */

static void check_layout_math(void)
{
    int bad = 0;
    for (int ws = 1; ws <= 16; ws++)
        for (int tp = 1; tp <= ws; tp++)
            for (int pp = 1; pp <= ws; pp++) {
                if (ws % (tp * pp)) continue;
                int *seen = calloc((size_t)ws, sizeof *seen);
                for (int r = 0; r < ws; r++) {
                    struct parallel_layout l;
                    if (parallel_layout_make(ws, r, tp, pp, &l) != STATUS_OK) {
                        bad++;
                        continue;
                    }
                    int back = parallel_layout_rank(&l, l.dp_rank, l.pp_rank, l.tp_rank);
                    bad += back != r || l.dp_size != ws / (tp * pp);
                    if (back >= 0 && back < ws) seen[back]++;
                    /* tp fastest, then pp, then dp. */
                    bad += l.tp_rank != r % tp || l.pp_rank != (r / tp) % pp || l.dp_rank != r / (tp * pp);
                    int prev = l.pp_rank > 0 ? parallel_layout_rank(&l, l.dp_rank, l.pp_rank - 1, l.tp_rank) : -1;
                    int next = l.pp_rank < pp - 1 ? parallel_layout_rank(&l, l.dp_rank, l.pp_rank + 1, l.tp_rank) : -1;
                    bad += l.pp_prev != prev || l.pp_next != next;
                }
                for (int r = 0; r < ws; r++) bad += seen[r] != 1;
                free(seen);
            }
    EXPECT(bad == 0, "layout math: %d inconsistencies", bad);

    /* Known answers: 4 ranks as tp 2 x pp 2, and 8 as tp 2 x pp 2 x dp 2. */
    static const int tp2pp2[4][5] = {/* tp, pp, dp, prev, next */
                                     {0, 0, 0, -1, 2}, {1, 0, 0, -1, 3}, {0, 1, 0, 0, -1}, {1, 1, 0, 1, -1}};
    for (int r = 0; r < 4; r++) {
        struct parallel_layout l;
        parallel_layout_make(4, r, 2, 2, &l);
        EXPECT(l.tp_rank == tp2pp2[r][0] && l.pp_rank == tp2pp2[r][1] && l.dp_rank == tp2pp2[r][2] &&
                   l.pp_prev == tp2pp2[r][3] && l.pp_next == tp2pp2[r][4],
               "tp2 x pp2: rank %d is (tp %d, pp %d, dp %d, prev %d, next %d)", r, l.tp_rank,
               l.pp_rank, l.dp_rank, l.pp_prev, l.pp_next);
    }
    struct parallel_layout l;
    parallel_layout_make(8, 6, 2, 2, &l);
    EXPECT(l.tp_rank == 0 && l.pp_rank == 1 && l.dp_rank == 1 && l.pp_prev == 4 && l.pp_next == -1,
           "tp2 x pp2 x dp2: rank 6 wrong");

    /* Errors. */
    enum status st = parallel_layout_make(4, 0, 3, 1, &l);
    EXPECT(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "world size 4") &&
               strstr(status_message(), "tp 3"),
           "world 4 with tp 3: %s (%s)", status_name(st), status_message());
    st = parallel_layout_make(6, 0, 2, 2, &l);
    EXPECT(st == STATUS_INVALID_ARGUMENT && l.tp_size == 0, "world 6 with tp 2 x pp 2 accepted");
    st = parallel_layout_make(4, 0, 0, 1, &l);
    EXPECT(st == STATUS_INVALID_ARGUMENT, "tp 0 accepted");
    st = parallel_layout_make(2, 0, 4, 1, &l);
    EXPECT(st == STATUS_INVALID_ARGUMENT, "tp 4 on 2 ranks accepted");
}

/* Each group's members, gathered, are the ranks the layout says. */
static void check_membership(struct comm *c, const struct parallel_layout *l, int which,
                             struct parallel_world *w)
{
    int32_t me = w->rank, *all = calloc((size_t)c->size, sizeof *all);
    struct tensor in = tensor_make(&me, DTYPE_I32, DEVICE_CPU, 1, (int64_t)1);
    struct tensor out = tensor_make(all, DTYPE_I32, DEVICE_CPU, 1, (int64_t)c->size);
    EXPECT_OK(comm_all_gather(c, &out, &in));
    int good = 1;
    for (int g = 0; g < c->size; g++) {
        int want = which == 0 ? parallel_layout_rank(l, l->dp_rank, l->pp_rank, g)
                 : which == 1 ? parallel_layout_rank(l, l->dp_rank, g, l->tp_rank)
                              : parallel_layout_rank(l, g, l->pp_rank, l->tp_rank);
        good &= all[g] == want;
    }
    EXPECT(good, "tp %d pp %d: %s group of rank %d has the wrong members", l->tp_size, l->pp_size,
           c->name, w->rank);
    free(all);
}

/* Every (tp, pp) that divides the world: groups, their members, their collectives. */
static void check_groups(struct parallel_world *w, struct backend *b, enum device dev, int n_shapes)
{
    for (int tp = 1; tp <= w->size; tp++)
        for (int pp = 1; pp <= w->size; pp++) {
            if (w->size % (tp * pp)) continue;
            struct parallel_layout l;
            EXPECT_OK(parallel_layout(w, tp, pp, &l));
            struct parallel_groups g;
            enum status st = parallel_groups_init(w, &l, dev, b->device_id, b->stream, &g);
            if (!EXPECT(st == STATUS_OK, "groups tp %d pp %d: %s", tp, pp, status_message())) continue;
            EXPECT(g.tp->size == tp && g.tp->rank == l.tp_rank && g.pp->size == pp &&
                       g.pp->rank == l.pp_rank && g.dp->size == l.dp_size && g.dp->rank == l.dp_rank,
                   "groups tp %d pp %d: sizes/ranks", tp, pp);
            if (dev == DEVICE_CPU) {
                check_membership(g.tp, &l, 0, w);
                check_membership(g.pp, &l, 1, w);
                check_membership(g.dp, &l, 2, w);
            }
            char label[64];
            snprintf(label, sizeof label, "tp%d.pp%d/tp", tp, pp);
            check_collectives(g.tp, b, label, n_shapes);
            check_stream_order(g.tp, b, label);
            snprintf(label, sizeof label, "tp%d.pp%d/pp", tp, pp);
            check_ring(g.pp, b, DTYPE_BF16, 1, 1001, label);
            check_pipeline(w, &l, g.pp, b, label);
            EXPECT_OK(comm_reserve(g.tp, 4096));
            EXPECT(g.tp->n_calls > 0 && g.tp->n_bytes > 0 && g.tp->seconds > 0,
                   "tp group counters did not move (%llu calls, %llu bytes, %g s)",
                   (unsigned long long)g.tp->n_calls, (unsigned long long)g.tp->n_bytes,
                   g.tp->seconds);
            parallel_groups_free(&g);
        }
}

/* ---- the control plane ---------------------------------------------------------------------- */

struct plan_header {
    int32_t magic, n_seqs, n_tokens, max_blocks;
    int64_t step;
};

/* The payload a step plan of this header carries: tokens, positions, per-sequence lengths and
 * block tables, as int32. */
static size_t plan_payload(const struct plan_header *h)
{
    return (size_t)(2 * h->n_tokens + h->n_seqs + h->n_seqs * h->max_blocks);
}

static void check_step_plan(struct parallel_world *w, int root, int n_seqs, int n_tokens)
{
    struct plan_header h;
    memset(&h, 0, sizeof h);
    if (w->rank == root) h = (struct plan_header){0x504c414e, n_seqs, n_tokens, 9, 1234567890123LL + root};
    EXPECT_OK(parallel_bcast_bytes(w, &h, sizeof h, root));
    EXPECT(h.magic == 0x504c414e && h.n_seqs == n_seqs && h.n_tokens == n_tokens &&
               h.step == 1234567890123LL + root,
           "step plan header from %d: wrong", root);
    size_t n = plan_payload(&h);
    int32_t *p = malloc((n + 1) * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = w->rank == root ? (int32_t)mix((uint32_t)(i + 17 * (size_t)root)) : -1;
    EXPECT_OK(parallel_bcast_bytes(w, p, n * sizeof *p, root));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += p[i] != (int32_t)mix((uint32_t)(i + 17 * (size_t)root));
    EXPECT(bad == 0, "step plan payload from %d: %zu words wrong", root, bad);
    free(p);
}

static void check_control(struct parallel_world *w, struct backend *b)
{
    check_step_plan(w, 0, 3, 300);
    check_step_plan(w, w->size - 1, 0, 0);
    check_step_plan(w, w->size - 1, 64, 64);
    EXPECT_OK(parallel_barrier(w));

    EXPECT(parallel_agree(w, STATUS_OK) == STATUS_OK, "agree on OK: %s", status_message());
    enum status mine = STATUS_OK;
    if (w->rank == w->size - 1) mine = status_errorf(STATUS_NOT_FOUND, "shard mp_rank_01_002 missing");
    enum status st = parallel_agree(w, mine);
    EXPECT(st == STATUS_NOT_FOUND && strstr(status_message(), "shard mp_rank_01_002 missing"),
           "agree on a failure of the last rank: %s (%s)", status_name(st), status_message());

    struct parallel_layout l;
    st = parallel_layout(w, w->size + 1, 1, &l);
    EXPECT(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "mpirun -n"),
           "layout tp %d in a world of %d: %s (%s)", w->size + 1, w->size, status_name(st),
           status_message());

    /* NCCL groups where there is no NCCL or no GPU: every rank gets the same error, none hangs. */
    if (parallel_nccl_device_count() == 0) {
        parallel_layout(w, 1, 1, &l);
        struct parallel_groups g;
        st = parallel_groups_init(w, &l, DEVICE_CUDA, 0, NULL, &g);
        EXPECT(st == STATUS_UNAVAILABLE && g.tp == NULL, "NCCL groups without NCCL/GPU: %s (%s)",
               status_name(st), status_message());
    }

    check_ring(w->control, b, DTYPE_F32, 67, 1031, "control");
    check_ring(w->control, b, DTYPE_F16, 3, 5, "control");
}

/* ---- modes ------------------------------------------------------------------------------- */

/* Sums the world's counts on every rank; rank 0 prints them. Returns the exit code. */
static int report(struct parallel_world *w, const char *what)
{
    int32_t counts[2] = {n_pass, n_fail};
    struct tensor t = tensor_make(counts, DTYPE_I32, DEVICE_CPU, 1, (int64_t)2);
    if (comm_all_reduce(w->control, &t) != STATUS_OK) {
        printf("rank %d: cannot sum the counts: %s\n", w->rank, status_message());
        counts[0] = n_pass;
        counts[1] = n_fail + 1;
    }
    if (w->rank == 0)
        printf("test_parallel %s (world of %d%s): %d passed, %d failed\n", what, w->size,
               w->mpi ? ", MPI" : "", counts[0], counts[1]);
    return counts[1] > 0 ? 1 : 0;
}

static int run_cpu(struct parallel_world *w)
{
    struct backend *b = NULL;
    if (backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK) {
        printf("rank %d: FAIL: cpu backend: %s\n", w->rank, status_message());
        return 1;
    }
    double t0 = now_s();
    check_layout_math();
    check_control(w, b);
    check_collectives(w->control, b, "control", (int)(sizeof SHAPES / sizeof SHAPES[0]));
    check_groups(w, b, DEVICE_CPU, (int)(sizeof SHAPES / sizeof SHAPES[0]));
    /* Again through the polling path that a timeout selects. */
    w->timeout_s = 60;
    check_collectives(w->control, b, "control+timeout", 4);
    check_ring(w->control, b, DTYPE_F32, 67, 1031, "control+timeout");
    check_step_plan(w, 0, 5, 17);
    EXPECT_OK(parallel_barrier(w));
    w->timeout_s = 0;
    if (w->rank == 0) printf("collectives took %.2f s\n", now_s() - t0);
    int rc = report(w, "cpu");
    backend_close(b);
    return rc;
}

/* Rank 1 plays a hung rank; rank 0 must give up after its timeout and fail fast afterwards. */
static int run_hang(struct parallel_world *w)
{
    if (w->size < 2) {
        printf("SKIP: --hang needs mpirun -n 2 or more\n");
        return 77;
    }
    EXPECT_OK(parallel_watch_start(w));
    EXPECT_OK(parallel_barrier(w));
    if (w->rank != 0) {
        parallel_watch_stop(w); /* silent, as a stopped process is */
        sleep(60); /* hung: mpirun ends this rank once rank 0 has exited */
        return 0;
    }
    w->timeout_s = 1.5;
    double t0 = now_s();
    enum status st = parallel_barrier(w);
    double dt = now_s() - t0;
    EXPECT(st == STATUS_UNAVAILABLE && strstr(status_message(), "no progress"),
           "hung peer: %s (%s)", status_name(st), status_message());
    EXPECT(strstr(status_message(), "rank 1 (silent for") != NULL, "the silent rank is named: %s", status_message());
    EXPECT(dt >= 1.4 && dt < 10, "hung peer detected after %.2f s (timeout 1.5 s)", dt);
    EXPECT(w->broken, "world not marked broken");
    int32_t v = 1;
    struct tensor t = tensor_make(&v, DTYPE_I32, DEVICE_CPU, 1, (int64_t)1);
    t0 = now_s();
    st = comm_all_reduce(w->control, &t);
    dt = now_s() - t0;
    EXPECT(st == STATUS_UNAVAILABLE && strstr(status_message(), "earlier failure") && dt < 0.5,
           "call after the failure: %s (%s) after %.2f s", status_name(st), status_message(), dt);
    printf("hang: %s (%d passed, %d failed): %s\n", n_fail ? "FAIL" : "PASS", n_pass, n_fail,
           w->failure);
    fflush(stdout);
    return n_fail ? 1 : 0;
}

static int run_nccl(struct parallel_world *w)
{
    /* Every rank must take the same branch: skipping is agreed on. */
    enum status st = STATUS_OK;
    if (!parallel_nccl_compiled())
        st = status_errorf(STATUS_UNAVAILABLE, "built without NCCL");
    else if (parallel_nccl_device_count() <= w->gpu)
        st = status_errorf(STATUS_UNAVAILABLE, "NCCL needs one GPU per rank (or SHARDLM_SHARE_GPU=1): %d GPU(s) "
                           "for %d rank(s) on this node", parallel_nccl_device_count(), w->local_size);
    struct backend *b = NULL;
    if (st == STATUS_OK) st = backend_open(DEVICE_CUDA, w->gpu, 0, &b);
    st = parallel_agree(w, st);
    if (st != STATUS_OK) {
        if (w->rank == 0) printf("SKIP: %s\n", status_message());
        backend_close(b);
        return 77;
    }
    double t0 = now_s();
    check_groups(w, b, DEVICE_CUDA, (int)(sizeof SHAPES / sizeof SHAPES[0]));
    w->timeout_s = 60;
    check_groups(w, b, DEVICE_CUDA, 2);
    w->timeout_s = 0;
    if (w->rank == 0) printf("NCCL collectives took %.2f s\n", now_s() - t0);
    int rc = report(w, "nccl");
    backend_close(b);
    return rc;
}

int main(int argc, char **argv)
{
    struct parallel_world *w = NULL;
    enum status st = parallel_init(&argc, &argv, &w);
    if (st != STATUS_OK) {
        printf("FAIL: parallel_init: %s\n", status_message());
        return 1;
    }
    my_rank = w->rank;
    const char *mode = argc > 1 ? argv[1] : "";
    int rc;
    if (!strcmp(mode, "--hang")) rc = run_hang(w);
    else if (!strcmp(mode, "--nccl")) rc = run_nccl(w);
    else if (!*mode) rc = run_cpu(w);
    else {
        fprintf(stderr, "usage: test_parallel [--hang | --nccl]\n");
        rc = 2;
    }
    fflush(stdout);
    parallel_finalize(w);
    return rc;
}
