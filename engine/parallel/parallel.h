/* engine/parallel/parallel.h - the parallel runtime's communication layer: the world of ranks (one
 * process per rank, launched by mpirun, or a world of one without it), the rank layout
 * world = dp x pp x tp, and communicators that move struct tensors between ranks: MPI for CPU
 * tensors, NCCL for CUDA tensors, behind one ops table (like the kernels' struct backend).
 * Not here: what is communicated when (engine/model/model.c: the Megatron all-reduces, the logits
 * gather and the pipeline hand-over; the engine: the step plan), the tensors' memory
 * (backend_alloc). Implemented in engine/parallel/: parallel.c (the world, the layout, the
 * groups), parallel_comm.c (the comm_* operations and the MPI communicator), parallel_msg.c
 * (parallel_msg_*): the only files that call MPI; parallel_nccl.c, the only one that calls
 * NCCL (builds without CUDA link parallel_nccl_unavailable.c instead).
 * Tests: tests/test_parallel.c (under mpirun -n 2, 3 and 4 and as a world of one; the NCCL
 * part is labelled gpu). Design notes: docs/parallel.md.
 *
 * Contracts shared by everything below:
 * - Thread: one thread per rank makes every collective and communicator call for a given
 *   world (not necessarily the thread that called parallel_init). MPI is initialised with
 *   MPI_THREAD_MULTIPLE where the library provides it (w->thread_multiple), so that
 *   different threads may use different worlds (a replica's sub-world on the engine thread,
 *   the parent world's messages on a router thread) and the parallel_msg_* calls may come
 *   from any thread.
 * - Order: a collective is called by every rank of its group, in the same order on all of
 *   them, with matching shapes, dtypes and roots; a send on one rank is matched by a recv of
 *   the same byte size on its peer. Breaking this is a bug that shows up as a hang (or, with
 *   a timeout set, as STATUS_UNAVAILABLE).
 * - Errors: every MPI and NCCL call is checked. A failing call, or a wait that exceeds the
 *   world's timeout, returns STATUS_UNAVAILABLE with a message naming the call, the group and
 *   the library's error text, and marks the world broken: every later call on it fails at
 *   once with STATUS_UNAVAILABLE. A broken world cannot be repaired; the caller reports and
 *   exits non-zero (mpirun then ends the other ranks). Nothing here calls exit() or abort()
 *   on a communication error; caller bugs (shape mismatches, a CUDA tensor handed to an MPI
 *   communicator, a bad peer) are CHECKed.
 * - Devices: a communicator carries tensors of one device. CPU tensors go through MPI (host
 *   memory, any dtype; sums are done in f32, bf16/f16 widened through a scratch buffer and
 *   rounded once). CUDA tensors go through NCCL, queued on the stream given at creation
 *   (the backend's stream, passed as void * so that engine headers never include CUDA
 *   headers): NCCL calls return once queued, like ops, and comm_synchronize waits.
 * - Ownership: parallel_init returns a world the caller owns (parallel_finalize frees it and
 *   finalises MPI). Communicators borrow the world: free them before parallel_finalize.
 *   Tensors are borrowed for the duration of a call (CUDA: until the stream passes the
 *   queued operation).
 */
#ifndef SHARDLM_PARALLEL_H
#define SHARDLM_PARALLEL_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

struct comm;

/* An all-reduce in flight (comm_all_reduce_start .. comm_wait). Opaque storage for the
 * implementation's handle (an MPI_Request); zeroed = nothing in flight. */
struct comm_request {
    int active;
    unsigned char handle[16];
};

/* ---- the world ---------------------------------------------------------------------- */

/* One per process. Fields other than timeout_s are read-only for callers. */
struct parallel_world {
    int    rank, size;              /* this process in the world, and the number of ranks */
    int    local_rank, local_size;  /* among the ranks on this node */
    int    gpu;                     /* the CUDA device this rank uses: local_rank (one GPU
                                     * per rank on a node), or 0 for every rank when
                                     * SHARDLM_SHARE_GPU=1 (parallel_init: a test mode) */
    int    gpu_sharers;             /* ranks of this node on that GPU: 1, or local_size when
                                     * shared (memory sized by free fractions is split) */
    int    mpi;                     /* 1 when MPI was initialised (launched by mpirun) */
    double timeout_s;               /* > 0: a wait on peers longer than this fails with
                                     * STATUS_UNAVAILABLE (a hung or dead rank); 0 (default):
                                     * wait forever. Per rank; settable at any time. Ranks that
                                     * legitimately idle on the step plan leave it 0. */
    int    thread_multiple;         /* MPI runs at MPI_THREAD_MULTIPLE (parallel_msg_* and
                                     * sub-worlds used from several threads need it) */
    int    broken;                  /* set by the first failed communication call */
    char   failure[512];            /* that call's message ("" while not broken) */
    struct comm *control;           /* every rank, world rank order, CPU tensors, over MPI:
                                     * the control plane (step plan, sampled tokens) */
    void  *impl;                    /* MPI state (struct world_impl, parallel_mpi.h) */
};

/* Initialises the world. When the process was started by an MPI launcher (mpirun/mpiexec of
 * Open MPI, or a PMI/PMIx launcher: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the
 * environment), MPI is initialised (MPI_Init_thread, MPI_THREAD_MULTIPLE) and errors on
 * its communicators are returned instead of aborting the job. Otherwise the world is one
 * rank and MPI is never touched, so that a plain `shardlm generate` needs no MPI runtime.
 * argc/argv may be NULL. Returns STATUS_UNAVAILABLE with a message when MPI cannot start.
 * On success *out is owned by the caller. */
enum status parallel_init(int *argc, char ***argv, struct parallel_world **out);

/* Frees the world's control communicator and finalises MPI (a collective: every rank calls
 * it). On a broken world, MPI_Finalize is skipped after a grace period if the abandoned
 * operations never completed, since it would wait for the missing peers; the process should
 * then exit non-zero. Accepts NULL. */
void parallel_finalize(struct parallel_world *w);

/* Every rank's status agreed on (a collective on the world): returns STATUS_OK on every rank
 * when every rank passed STATUS_OK; otherwise every rank returns the status of the lowest
 * failing rank, with its message prefixed by "rank N: ". Use it after a step that can fail on
 * some ranks only (loading a shard, allocating), so that no rank goes on into a collective
 * that the failed rank will never join. */
enum status parallel_agree(struct parallel_world *w, enum status local);

/* Control plane: broadcasts n bytes of host memory from the world rank `root` to every rank
 * (rank 0's step plan). buf is read on root and written elsewhere. A collective. */
enum status parallel_bcast_bytes(struct parallel_world *w, void *buf, size_t n, int root);
enum status parallel_barrier(struct parallel_world *w);
/* *v becomes the smallest of every rank's *v. A collective. */
enum status parallel_min_i64(struct parallel_world *w, int64_t *v);

/* ---- sub-worlds and messages ---------------------------------------------------------------
 * Data-parallel serving runs one engine per replica, each in its own sub-world (the replica's
 * pp x tp ranks), and a router on rank 0 that talks to each replica's first rank with
 * point-to-point messages on the parent world. */

/* Splits w into sub-worlds (a collective over w): ranks passing the same color form one,
 * ordered by key. The sub-world has its own control communicator, rank and size, the
 * parent's node-local rank (GPU choice) and thread level, and its own timeout and broken
 * state. parallel_finalize on a sub-world frees its communicators but leaves MPI running;
 * finalize sub-worlds before their parent. In a world without MPI the sub-world is a world
 * of one. */
enum status parallel_world_split(struct parallel_world *w, int color, int key,
                                 struct parallel_world **out);

/* Posts buf (n bytes, malloc'ed; ownership passes here, also on error) to world rank dest and
 * returns at once: nothing blocks on the receiver. Messages from one rank to another arrive in
 * the order posted. parallel_msg_progress completes posted sends (and frees their buffers);
 * call it regularly. Top-level MPI worlds only (CHECKed). Any thread. */
enum status parallel_msg_send(struct parallel_world *w, int dest, void *buf, size_t n);
/* Tests posted sends: *pending still on their way, the oldest posted *oldest_s seconds ago (a
 * receiver that stopped receiving shows up here). */
enum status parallel_msg_progress(struct parallel_world *w, int *pending, double *oldest_s);
/* Whether a message waits (*got), from which rank and how long; does not receive it. One thread
 * per rank polls and receives. A world without MPI never has messages. */
enum status parallel_msg_poll(struct parallel_world *w, int *got, int *source, size_t *n);
/* Receives the message parallel_msg_poll reported (n bytes from source) into buf. */
enum status parallel_msg_recv(struct parallel_world *w, int source, void *buf, size_t n);

/* ---- the layout --------------------------------------------------------------------- */

/* world = dp x pp x tp, tp fastest: rank = (dp_rank * pp_size + pp_rank) * tp_size + tp_rank.
 * A tensor-parallel group is a run of tp consecutive ranks (on one node when tp <= GPUs per
 * node); a replica (dp_rank) is a contiguous block of pp * tp ranks; rank 0 is dp 0, stage 0,
 * tp 0. With dp = 1 this is Megatron-LM's order; for dp > 1 Megatron puts pp outermost, we
 * put dp outermost because serving replicas are independent (docs/parallel.md). */
struct parallel_layout {
    int world_size, rank;
    int tp_size, pp_size, dp_size;
    int tp_rank, pp_rank, dp_rank;
    int pp_prev, pp_next;  /* world ranks of the previous and next stage with the same
                            * (dp_rank, tp_rank); -1 on the first / last stage */
};

/* The layout of `rank` in a world of world_size ranks with the given tp and pp; dp is
 * world_size / (tp * pp). Returns STATUS_INVALID_ARGUMENT with a message (and leaves *out
 * zeroed) when tp or pp is < 1 or world_size is not a multiple of tp * pp. Pure: no
 * communication. */
enum status parallel_layout_make(int world_size, int rank, int tp, int pp,
                                 struct parallel_layout *out);
/* parallel_layout_make for this process's world; the error message says how to launch. */
enum status parallel_layout(const struct parallel_world *w, int tp, int pp,
                            struct parallel_layout *out);
/* The world rank at coordinates (dp_rank, pp_rank, tp_rank) of l's shape. */
int parallel_layout_rank(const struct parallel_layout *l, int dp_rank, int pp_rank, int tp_rank);

/* ---- communicators ------------------------------------------------------------------ */

/* The table an implementation fills in (parallel_comm.c: MPI; parallel_nccl.c: NCCL). Slots have
 * the signatures of the comm_* wrappers below, which check shapes before calling them. */
struct comm_ops {
    const char *name; /* "mpi" or "nccl" */
    enum status (*all_reduce)(struct comm *c, const struct tensor *x);
    enum status (*all_gather)(struct comm *c, const struct tensor *out, const struct tensor *in);
    enum status (*all_gather_last)(struct comm *c, const struct tensor *out,
                                   const struct tensor *in);
    enum status (*reduce_scatter)(struct comm *c, const struct tensor *out,
                                  const struct tensor *in);
    enum status (*broadcast)(struct comm *c, const struct tensor *x, int root);
    enum status (*send)(struct comm *c, const struct tensor *x, int peer);
    enum status (*recv)(struct comm *c, const struct tensor *x, int peer);
    enum status (*sendrecv)(struct comm *c, const struct tensor *send, int send_peer,
                            const struct tensor *recv, int recv_peer);
    enum status (*all_to_all_rows)(struct comm *c, const struct tensor *send, const int64_t *send_rows,
                                   const struct tensor *recv, const int64_t *recv_rows);
    enum status (*all_reduce_start)(struct comm *c, const struct tensor *x, struct comm_request *req);
    enum status (*wait)(struct comm *c, struct comm_request *req);
    enum status (*reserve)(struct comm *c, size_t max_numel);
    enum status (*synchronize)(struct comm *c);
    void (*free)(struct comm *c);
};

/* A group of ranks that communicate. Fields other than impl are read-only for callers. */
struct comm {
    const struct comm_ops *ops;
    const char *name;             /* "tp", "pp", "dp" or "control": for messages */
    enum device device;           /* the device of every tensor it carries */
    int rank, size;               /* this process in the group; group ranks count from 0 */
    struct parallel_world *world; /* borrowed: timeout and broken state */
    /* Counters kept by the comm_* wrappers for the benchmarks (communication time per step):
     * calls, payload bytes of this rank (its input; out for gathers), and host seconds spent
     * in them (MPI: the whole transfer; NCCL: queueing only, plus comm_synchronize's wait).
     * Callers may reset them. */
    uint64_t n_calls, n_bytes;
    double   seconds;
    void *impl;
};

/* The groups of one rank for a layout. Group ranks are the layout coordinates: in tp the
 * group rank is tp_rank, in pp it is pp_rank (the previous stage is pp_rank - 1), in dp it is
 * dp_rank. The control communicator is w->control. */
struct parallel_groups {
    struct comm *tp; /* tp_size ranks: same (dp, pp); the Megatron all-reduces, logits gather */
    struct comm *pp; /* pp_size ranks: same (dp, tp); activations stage to stage */
    struct comm *dp; /* dp_size ranks: same (pp, tp); replicas (gradients in training) */
    /* Expert parallelism in training (parallel_groups_add_ep; NULL otherwise), carved out of dp as
     * Megatron does: the ep consecutive dp ranks dp_rank / ep hold the experts between them (group
     * rank dp_rank % ep), and the experts' own data-parallel group joins the dp ranks of equal
     * dp_rank % ep (group rank dp_rank / ep), over which expert gradients are reduced. */
    struct comm *ep;  /* ep ranks: same (pp, tp, dp_rank / ep) */
    struct comm *edp; /* dp / ep ranks: same (pp, tp, dp_rank % ep) */
    /* Expert parallelism with tensor-parallel attention in serving (parallel_groups_add_atp; NULL
     * otherwise): the layout's tp group is then the ep x tp block that holds the experts, and atp
     * joins its n consecutive ranks tp_rank / n, over which attention, the vocabulary and the
     * dense layers are tensor-parallel (group rank tp_rank % n). */
    struct comm *atp; /* n ranks: same (dp, pp, tp_rank / n) */
};

/* Creates this rank's groups for layout l: a collective over the whole world (every rank
 * calls it with the same tp/pp). device CPU gives MPI communicators (stream: NULL); device CUDA
 * gives NCCL communicators on GPU device_id with their operations queued on `stream`, which
 * must be the backend's (struct backend.stream; NULL is a bug: CHECK), the NCCL unique id of
 * each group being created on the group's rank 0 and broadcast over MPI.
 *
 * The ordering contract on GPUs: the backend's ops and the groups' operations are queued on
 * one stream, so each runs after everything queued before it and before everything queued
 * after it. An all-reduce reads the finished output of the matmul that fed it, the op after it
 * reads the reduced sum, a send reads a finished tensor and the op after a recv its data, with
 * no synchronisation and no event. (Communicators on the legacy default stream would not be
 * ordered at all with the backend's cudaStreamNonBlocking stream: that was the race of issue
 * 25.) Host code that reads a result downloads it (backend_download waits for the stream). NCCL needs one GPU per rank of a group. Errors on
 * any rank (no CUDA in this build: STATUS_UNAVAILABLE; no GPU; NCCL failing) are agreed on, so
 * every rank returns the same status and *out is then zeroed. Free with
 * parallel_groups_free. */
enum status parallel_groups_init(struct parallel_world *w, const struct parallel_layout *l,
                                 enum device device, int device_id, void *stream,
                                 struct parallel_groups *out);
void parallel_groups_free(struct parallel_groups *g); /* accepts a zeroed struct */

/* Adds g->ep and g->edp (above) for ep ranks an expert group, ep dividing l->dp_size (CHECKed:
 * the caller names the mismatch first): a collective over the whole world, on the same device
 * and stream as parallel_groups_init's. Errors are agreed on; g->ep and g->edp are then NULL. */
enum status parallel_groups_add_ep(struct parallel_world *w, const struct parallel_layout *l, int ep,
                                   enum device device, int device_id, void *stream, struct parallel_groups *g);

/* Adds g->atp (above) for a block (the layout's tp group) of ep x n ranks, n dividing l->tp_size
 * (CHECKed): a collective over the whole world, as parallel_groups_add_ep. Errors are agreed on;
 * g->atp is then NULL. */
enum status parallel_groups_add_atp(struct parallel_world *w, const struct parallel_layout *l, int n,
                                    enum device device, int device_id, void *stream, struct parallel_groups *g);

/* Operations. Every tensor is dense, on c->device, and the same on every rank of the group
 * unless said otherwise. Shape or dtype mismatches are bugs (CHECK). Collectives on a group of
 * one rank on the CPU move data locally and never call MPI (a world of one has no MPI); NCCL
 * groups of one run through NCCL. */

/* x = sum of x over the group, in place. f32, bf16, f16 or i32. MPI sums bf16/f16 in f32 and
 * rounds once; NCCL sums in the dtype, rounding at each hop (as Megatron does). Every rank
 * ends with bit-identical values. */
enum status comm_all_reduce(struct comm *c, const struct tensor *x);

/* comm_all_reduce of an f32 tensor, started and not waited for: the sum lands in x by the time
 * comm_wait(req) returns (MPI: MPI_Iallreduce, progressed by this and later MPI calls of the
 * process; NCCL: queued on the stream, so later work on the stream sees the sum and comm_wait
 * has nothing to do). x must not be read or written in between. Data parallelism overlaps the
 * gradients' reduction with the rest of the backward this way. */
enum status comm_all_reduce_start(struct comm *c, const struct tensor *x, struct comm_request *req);
enum status comm_wait(struct comm *c, struct comm_request *req);

/* Concatenation along the outermost dimension: out (size * n, ...) holds rank r's in (n, ...)
 * at rows r*n .. r*n+n-1. Any dtype; out must not overlap in. */
enum status comm_all_gather(struct comm *c, const struct tensor *out, const struct tensor *in);

/* Concatenation along the last dimension: out (..., size * k) holds rank r's in (..., k) at
 * columns r*k .. r*k+k-1 of every row; the vocab-parallel logits gather (rows, vocab_local) ->
 * (rows, tp * vocab_local). Any dtype; out must not overlap in. Uses the comm's scratch
 * (out's size). */
enum status comm_all_gather_last(struct comm *c, const struct tensor *out,
                                 const struct tensor *in);

/* Sum, then scatter along the outermost dimension: out (n, ...) on rank r = the sum over the
 * group of rows r*n .. r*n+n-1 of in (size * n, ...). Float dtypes as comm_all_reduce; out
 * must not overlap in. (Sequence parallelism's reduce-scatter.) */
enum status comm_reduce_scatter(struct comm *c, const struct tensor *out,
                                const struct tensor *in);

/* x on every rank = x on group rank `root`. Any dtype. */
enum status comm_broadcast(struct comm *c, const struct tensor *x, int root);

/* Point-to-point between group ranks (peer != c->rank). send returns when x may be reused
 * (MPI: the message is buffered or delivered; NCCL: queued on the stream, x must stay valid
 * until the stream passes it); recv fills x, whose byte size must equal the sent one. Messages
 * between two ranks of one group arrive in the order sent. Blocking on MPI: a ring of sends
 * must order them (send then recv on one rank, recv then send on the others). */
enum status comm_send(struct comm *c, const struct tensor *x, int peer);
enum status comm_recv(struct comm *c, const struct tensor *x, int peer);

/* send to send_peer and recv from recv_peer at once (both posted before either is waited on),
 * so that neighbours exchanging in opposite directions never deadlock: the pipeline
 * schedule's send-forward-receive-backward. send and recv must not overlap. */
enum status comm_sendrecv(struct comm *c, const struct tensor *send, int send_peer,
                          const struct tensor *recv, int recv_peer);

/* The all-to-all of rows (MPI_Alltoallv; NCCL: grouped ncclSend / ncclRecv): send holds
 * send_rows[0] rows for group rank 0, then send_rows[1] for rank 1, ... (rows of send's last
 * dims, packed from row 0); recv gets recv_rows[0] rows from rank 0, then rank 1's, ... The counts
 * (size entries each) must agree pairwise (what rank a sends to b is what b expects from a: a
 * mismatch is an MPI truncation error or a CHECK), send and recv share dtype and row width and
 * must not overlap. The rows this rank sends itself are copied locally. n_bytes counts the rows
 * sent to other ranks only (what crosses between processes). Expert parallelism's token
 * dispatch and combine (engine/model/moe_ep.c). */
enum status comm_all_to_all_rows(struct comm *c, const struct tensor *send, const int64_t *send_rows,
                                 const struct tensor *recv, const int64_t *recv_rows);

/* Sizes the comm's scratch for operations on tensors of up to max_numel elements (the larger
 * of in and out), so that no later call allocates (call it from model_reserve). Without it
 * the scratch grows on first use to the largest size seen. Local: no communication. */
enum status comm_reserve(struct comm *c, size_t max_numel);

/* Waits until every operation queued on c has finished (NCCL: the stream, bounded by the
 * world's timeout, after which the NCCL communicator is aborted); a no-op for MPI, whose
 * calls return finished. */
enum status comm_synchronize(struct comm *c);

void comm_free(struct comm *c); /* accepts NULL; frees the implementation's resources */

/* ---- the NCCL implementation (private to the parallel runtime) ----------------------------
 * parallel.c creates NCCL communicators through these so that it never calls NCCL and
 * parallel_nccl.c never calls MPI. Builds with NCCL build parallel_nccl.c into
 * libshardlm_nccl.so and link parallel_nccl_loader.c, which loads it on first use; builds
 * without link parallel_nccl_unavailable.c, whose functions return STATUS_UNAVAILABLE (and 0). */
#define PARALLEL_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId), checked in parallel_nccl.c */

/* ---- heartbeats: naming the rank a timeout waited for (parallel_watch.c) ---------------- */

/* A collective that times out cannot say who is missing (MPI and NCCL report completion only).
 * With the watch started, a thread on every rank sends a one-byte beat to every other rank of
 * the whole job every 0.25 s, on a communicator of its own, and notes when it last heard from
 * each: a stopped or dead rank falls silent while the live ones, blocked in the collective,
 * keep beating. Every timeout message (parallel_mpi_wait, comm_synchronize) then names the ranks
 * silent for over 1 s ("rank 1 (silent for 2.3 s): hung or gone", ranks of the whole job as
 * mpirun numbers them). Start it on every rank of the job, once (w may be a sub-world: the watch
 * is the whole job's; later calls do nothing), after the groups exist; it needs
 * MPI_THREAD_MULTIPLE (otherwise it warns, does nothing, and timeouts say the rank cannot be
 * named). parallel_finalize of the top-level world stops it; parallel_watch_stop may stop it
 * earlier (any sub-world, accepts NULL and no watch). Errors: STATUS_RESOURCE_EXHAUSTED, or an
 * MPI failure as every call here. */
enum status parallel_watch_start(struct parallel_world *w);
void        parallel_watch_stop(struct parallel_world *w);
/* "rank 2 (silent for 3.1 s), rank 3 (...)" into buf (n bytes) for the ranks silent for over 1 s;
 * "" without a watch or when every rank beats. Returns the length written. Any thread. */
size_t      parallel_watch_silent(const struct parallel_world *w, char *buf, size_t n);
/* The same for the ranks silent for over `seconds` (a rank that misses its beats that long is
 * hung or gone even when no collective waits for it: an idle server checks this). */
size_t      parallel_watch_silent_over(const struct parallel_world *w, double seconds, char *buf, size_t n);
/* What a timeout message says about who: the silent ranks, or why none can be named. */
void        parallel_watch_explain(const struct parallel_world *w, char *buf, size_t n);

/* Marks w broken, keeps the first failure's message in w->failure, and returns
 * STATUS_UNAVAILABLE with the message (printf-style). */
enum status parallel_world_fail(struct parallel_world *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 1 when the build has NCCL and libshardlm_nccl.so is found (not loaded); 0 otherwise. */
int parallel_nccl_compiled(void);
/* Visible CUDA devices (0 when none, without CUDA, or when libshardlm_nccl.so cannot be
 * loaded). The other three load the library on first use; a missing or unloadable one is
 * STATUS_UNAVAILABLE naming the path and dlerror(). */
int parallel_nccl_device_count(void);
/* Makes GPU device_id current and checks it exists; STATUS_UNAVAILABLE otherwise. Local. */
enum status parallel_nccl_check_device(int device_id);
/* A fresh NCCL unique id (on the group's rank 0). Local. */
enum status parallel_nccl_unique_id(unsigned char id[PARALLEL_NCCL_ID_BYTES]);
/* ncclCommInitRank for group rank `rank` of `size` (a collective over the group) on GPU
 * device_id, operations queued on stream. On success *out is owned by the caller. */
enum status parallel_nccl_comm_create(struct parallel_world *w, const char *name,
                                      const unsigned char id[PARALLEL_NCCL_ID_BYTES], int rank,
                                      int size, int device_id, void *stream, struct comm **out);

/* libshardlm_nccl.so's entry points (parallel_nccl.c): the four above, resolved by name with
 * dlsym by parallel_nccl_loader.c on first use, and the layout check (a library from another
 * build, with another struct comm_ops, is refused rather than called). */
#define NCCL_LIB_ABI ((unsigned long)sizeof(struct comm_ops) << 16 | sizeof(struct comm))
unsigned long nccl_lib_abi(void);
int           nccl_lib_device_count(void);
enum status   nccl_lib_check_device(int device_id);
enum status   nccl_lib_unique_id(unsigned char id[PARALLEL_NCCL_ID_BYTES]);
enum status   nccl_lib_comm_create(struct parallel_world *w, const char *name,
                                   const unsigned char id[PARALLEL_NCCL_ID_BYTES], int rank,
                                   int size, int device_id, void *stream, struct comm **out);

#ifdef __cplusplus
}
#endif

#endif
