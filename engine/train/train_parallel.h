/* engine/train/train_parallel.h - the ranks of a training job and what passes between them, as
 * Megatron-LM does it: the world split into tp x pp x dp (the same layout and communicators as
 * serving: parallel.h), each data-parallel replica taking its share of a step's micro-batches,
 * the pipeline's 1F1B schedule over them (warm-up forwards, one forward one backward in the
 * steady state, cool-down backwards; activations and their gradients over point-to-point
 * messages), and the gradient reductions after the backward: the tied embedding between the
 * first and last stage, the per-rank parts of replicated weights over tp, and the replicas'
 * gradients over dp (all-reduced, or reduce-scattered for the distributed optimizer, which
 * lives in dist_optimizer.c). Expert parallelism (--ep) carves ep groups out of dp as Megatron
 * does: the ep ranks of a group hold different experts (moe_ep.c dispatches the tokens), so
 * expert gradients are reduced over the experts' own data-parallel group (dp / ep ranks) and
 * everything else over dp; the global norm counts the dense gradients once per group.
 * Not here: the model's own collectives (model_train.c), the loop (trainer.c).
 * Tests: tests/test_train_parallel.sh (every layout against one rank). */
#ifndef SHARDLM_TRAIN_PARALLEL_H
#define SHARDLM_TRAIN_PARALLEL_H

#include "model_train.h"
#include "params.h"
#include "trainer.h"

struct dp_bucket;

struct train_ranks {
    struct parallel_world *world;   /* owned */
    struct parallel_groups groups;
    struct model_parallel par;      /* what model_load takes */
    int tp, pp, dp, dp_rank;
    int ep;                         /* expert parallelism (--ep): the experts split over ep dp ranks
                                       (groups.ep), their gradients reduced over groups.edp */
    int micro_per_replica;          /* micro-batches of a step each replica runs */
    int dist_opt;                   /* gradients reduce-scattered over dp (dist_optimizer.c) */
    struct tensor tied_tmp;         /* pp > 1 with tied embeddings: the other stage's gradient */
    void *tied_mem;
    struct backend *b;              /* borrowed, once train_ranks_attach */
    struct tensor sumsq;            /* f32 (1) on the device: the norm's all-reduce */
    /* Data parallelism without the distributed optimizer: one bucket per local layer (its
     * gradients are one contiguous range of the gradient allocation), all-reduced over dp as
     * soon as the layer's backward of the step's last micro-batch is done; the gradients outside
     * the layers (embeddings, final norm, head) are reduced after the backward. */
    struct dp_bucket *buckets;      /* (n_buckets) */
    int n_buckets;
    struct tensor *rest;            /* (n_rest): the gradients outside the layers */
    int n_rest;
    enum status bucket_status;      /* the first failure of a start inside the hook */
    enum status failed;             /* a failure inside the norm's reduction (it returns NaN) */
};

/* Starts the world (mpirun, or a world of one) and splits it for o->tp x o->pp; the data-parallel
 * size is what is left. Errors name the mismatch (a world that tp x pp does not divide, a
 * global batch whose micro-batches do not split over the replicas). On error *r may be
 * partly set up: train_ranks_free it. */
enum status train_ranks_init(struct train_ranks *r, const struct train_options *o, int num_microbatches);
/* The backend (*b, on this rank's GPU for cuda), agreed over the ranks, the tp / pp / dp groups
 * with their communicators on its stream (model_ranks_open, the one bring-up), and with
 * --rank-timeout the heartbeats that name a hung rank (parallel_watch_start). On error
 * train_ranks_free r (and close *b if set). */
enum status train_ranks_connect(struct train_ranks *r, enum device dev, int threads, struct backend **b);
/* After the model is loaded and its training state made: buffers that depend on it; marks which
 * gradients count in the norm (params.h counted) and which weights' gradients are per-rank
 * parts (tp_partial, from model_train_grad_partial; the adapters' are marked by
 * lora_ranks_mark), and hooks the norm's reduction into opt. */
enum status train_ranks_attach(struct train_ranks *r, struct model_train *mt, struct param_table *gparams,
                               struct optimizer *opt);
void train_ranks_free(struct train_ranks *r);

/* Forward and backward over this replica's micro-batches tbs[0 .. n) (n = micro_per_replica),
 * scheduled 1F1B when pp > 1; gradients accumulate into grads. *loss_sum (last stage) receives
 * the summed per-token losses. */
enum status train_ranks_step(struct train_ranks *r, struct model_train *mt, const struct train_batch *tbs, int n,
                             struct model_weights *grads, double *loss_sum);
/* Forward only through the stages (evaluation); *loss_sum, *n_real on the last stage. */
enum status train_ranks_forward(struct train_ranks *r, struct model_train *mt, const struct train_batch *tb,
                                double *loss_sum, int *n_real);
/* The reductions after the backward (see the top); the dp part was done by train_ranks_step
 * (overlapped with the backward), or is left to the distributed optimizer. */
enum status train_ranks_reduce_grads(struct train_ranks *r, struct model_train *mt, struct model_weights *grads,
                                     const struct param_table *gparams);
/* v[0 .. n) summed over the whole world (each value given by the ranks it belongs to, 0
 * elsewhere), in f64 on the host: losses and token counts for the log. */
enum status train_ranks_sum(struct train_ranks *r, double *v, int n);
/* After a failed step (STATUS_UNAVAILABLE): a sentence naming the ranks whose heartbeats
 * stopped (hung or dead) into buf, or "" when none is known. */
void train_ranks_explain(struct train_ranks *r, char *buf, size_t n);
/* Whether this rank writes logs and metrics (world rank 0). */
int train_ranks_leader(const struct train_ranks *r);

#endif
