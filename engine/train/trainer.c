/* engine/train/trainer.c - the training loop of one rank (trainer.h).
 * Tests: tests/test_train.sh, tests/test_train_step.py. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_optimizer.h"
#include "eagle_train.h"
#include "lora.h"
#include "lora_ranks.h"
#include "model_train.h"
#include "moe.h"
#include "out_dir.h"
#include "jinja.h"
#include "tokenizer.h"
#include "train_checkpoint.h"
#include "train_parallel.h"

struct trainer {
    const struct train_options *o;
    struct backend *b;
    struct tokenizer *tok;
    struct model *m;
    struct model_train *mt;       /* the training passes' state (activations, adapters, hook) */
    struct model_weights grads;
    void *grads_mem;
    /* Mixed precision: the f32 master weights (the model's weights were these before the
     * compute copy took their place); in f32 training, master is m->w itself. */
    struct model_weights master_store;
    struct model_weights *master;
    void *compute_mem;
    struct param_table params, gparams; /* what AdamW updates, and its gradients (row for row) */
    struct param_table compute;   /* mixed precision: the model's compute copy, row for row with params */
    struct lora *lora;            /* LoRA training: the adapters (the base is frozen) */
    const char *start;            /* the directory the model (and tokenizer) came from */
    struct optimizer opt;         /* with the distributed optimizer: its options and step only */
    struct dist_optimizer dist;   /* --use-distributed-optimizer at dp > 1 */
    int use_dist;
    int masters_sharded;          /* mixed precision + dist: no whole f32 masters (shard_masters) */
    struct train_dataset train, eval;
    struct micro_batch *mbs;      /* (num_microbatches) of the current iteration */
    struct train_batch *tbs;      /* (num_microbatches): the non-empty ones, in order */
    int num_microbatches;
    struct train_ranks ranks;     /* the world, its layout and groups (a world of one alone) */
    struct train_state state;
    int64_t train_iters;
    FILE *metrics;
    double t_start;
    int64_t *expert_load;         /* a mixture of experts: (n_layers, n_experts), one step's, the world's */
    double *moe_sums;             /* (3 + n_layers * n_experts): moe_step_stats' sums over the world */
};

/* ---- setup ------------------------------------------------------------------------------- */

static enum status check_options(const struct train_options *o, int *num_micro)
{
    if (o->micro_batch_size < 1 || o->global_batch_size < 1 || o->global_batch_size % o->micro_batch_size)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "--global-batch-size (%d) must be a positive multiple of --micro-batch-size (%d)",
                             o->global_batch_size, o->micro_batch_size);
    if (o->seq_length < 2) return status_errorf(STATUS_INVALID_ARGUMENT, "--seq-length must be at least 2");
    if (o->train_iters <= 0 && o->epochs <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "give --train-iters or --epochs");
    if (!(o->opt.lr > 0) || o->opt.min_lr < 0 || o->opt.min_lr > o->opt.lr)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--lr must be > 0 and --min-lr in [0, lr]");
    if (!(o->opt.beta1 >= 0 && o->opt.beta1 < 1) || !(o->opt.beta2 >= 0 && o->opt.beta2 < 1) || !(o->opt.eps > 0))
        return status_errorf(STATUS_INVALID_ARGUMENT, "--adam-beta1/2 must lie in [0, 1) and --adam-eps be > 0");
    if (o->opt.weight_decay < 0 || o->opt.clip_grad < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--weight-decay and --clip-grad must be >= 0");
    *num_micro = o->global_batch_size / o->micro_batch_size;
    return STATUS_OK;
}

static int64_t iters_for_epochs(struct trainer *t)
{
    return train_iters_for_epochs(t->o, &t->train, t->num_microbatches, &t->mbs[0]);
}

static enum status load_data(struct trainer *t)
{
    return train_load_data(t->o, t->start, t->m, t->tok, &t->train, &t->eval);
}

/* compute = master rounded to the compute dtype, tensor by tensor (the two tables match row
 * for row: the compute copy was made like the masters). */
static void sync_compute(struct trainer *t)
{
    CHECK(t->compute.n == t->params.n, "master and compute tables differ");
    for (size_t i = 0; i < t->params.n; i++) op_cast(t->b, t->compute.p[i].t, t->params.p[i].t);
}

/* Mixed precision: the model's f32 weights become the master copy; the model computes with a
 * bf16 / f16 copy of them (activations in that dtype too), refreshed after every step. */
static enum status make_compute_copy(struct trainer *t)
{
    const enum dtype dt = t->o->precision == TRAIN_PRECISION_BF16 ? DTYPE_BF16 : DTYPE_F16;
    struct model_weights compute;
    enum status st = weights_alloc_like(t->b, &t->m->w, dt, &compute, &t->compute_mem);
    if (st != STATUS_OK) return st;
    t->master_store = t->m->w;  /* its layers array is now the trainer's to free */
    t->master = &t->master_store;
    t->m->w = compute;
    t->m->dtype = dt;
    return STATUS_OK;
}

/* LoRA: new adapters (or the resumed ones), and the tables of A, B and their gradients. */
static enum status setup_lora(struct trainer *t)
{
    const struct train_options *o = t->o;
    if (t->m->cfg.family != MODEL_FAMILY_LLAMA && t->m->cfg.family != MODEL_FAMILY_GEMMA3)
        return status_errorf(STATUS_UNSUPPORTED, "LoRA training is built for Llama-family models (Llama, Mistral, "
                             "Gemma 3), not %s", t->m->cfg.architecture);
    enum status st = o->resume_dir ? lora_load_peft(t->m, o->resume_dir, &t->lora)
                                   : lora_create(t->m, o->lora_rank, o->lora_alpha, o->lora_targets, o->seed, &t->lora);
    if (st != STATUS_OK) return st;
    lora_set_dropout(t->lora, o->lora_dropout, o->seed);
    if ((st = lora_reserve(t->lora, t->b, o->micro_batch_size * o->seq_length, t->m->dtype)) != STATUS_OK) return st;
    char name[96];
    for (int i = 0; i < t->lora->n_layers && st == STATUS_OK; i++)
        for (int k = 0; k < LORA_TARGET_COUNT && st == STATUS_OK; k++) {
            struct lora_site *s = &t->lora->sites[i][k];
            if (!s->a.data) continue;
            const char *tn = lora_target_name((enum lora_target)k);
            snprintf(name, sizeof name, "lora/%s/%d/A", tn, t->m->layer_first + i);
            /* A fused member's A is its leader's (lora.h): one parameter, its gradient summed. */
            if (lora_target_leader(t->lora, (enum lora_target)k) == (enum lora_target)k &&
                (st = param_table_add(&t->params, name, &s->a, 1)) == STATUS_OK)
                st = param_table_add(&t->gparams, name, &s->da, 1);
            snprintf(name, sizeof name, "lora/%s/%d/B", tn, t->m->layer_first + i);
            if (st == STATUS_OK && (st = param_table_add(&t->params, name, &s->b, 1)) == STATUS_OK)
                st = param_table_add(&t->gparams, name, &s->db, 1);
        }
    LOG_INFO("train", "LoRA rank %d, alpha %g, dropout %g on %s%s%s%s%s%s%s: %lld trainable parameters (f32); "
             "the base frozen in %s, %zu bytes of weights on this rank%s",
             t->lora->rank, t->lora->alpha, (double)t->lora->dropout, t->lora->targets & 1 ? "q " : "",
             t->lora->targets & 2 ? "k " : "", t->lora->targets & 4 ? "v " : "", t->lora->targets & 8 ? "o " : "",
             t->lora->targets & 16 ? "gate " : "", t->lora->targets & 32 ? "up " : "", t->lora->targets & 64 ? "down" : "",
             (long long)param_table_numel(&t->params), dtype_name(t->m->dtype), t->m->weight_bytes,
             o->resume_dir ? ", resumed" : "");
    return st;
}

/* Mixed precision with the distributed optimizer: each rank keeps the f32 masters of its shard
 * only; the whole masters (the model's f32 weights, loaded before the compute copy took their
 * place) are freed. From here on the masters exist whole only while a checkpoint is written. */
static enum status shard_masters(struct trainer *t)
{
    enum status st = dist_optimizer_shard_masters(&t->dist, &t->params, &t->compute);
    if (st != STATUS_OK) return st;
    size_t freed = 0;
    for (size_t i = 0; i < t->params.n; i++) freed += model_release_weight(t->m, t->params.p[i].t);
    if (t->master_store.tied) t->master_store.lm_head.data = NULL;
    t->masters_sharded = 1;
    if (train_ranks_leader(&t->ranks))
        LOG_INFO("train", "distributed optimizer: %.1f MiB of whole f32 masters freed; each rank keeps %.1f MiB of its "
                 "shard", (double)freed / 1048576.0,
                 (double)(t->dist.shard + (t->dist.experts ? t->dist.experts->shard : 0)) * 4.0 / 1048576.0);
    return STATUS_OK;
}

/* The training state of --resume; the distributed optimizer takes its shard of the moments. */
static enum status load_state(struct trainer *t)
{
    if (!t->use_dist) return train_checkpoint_load_state(t->o->resume_dir, t->m, &t->params, &t->opt, &t->state);
    struct optimizer full;
    enum status st = optimizer_init(&full, t->b, &t->params, &t->opt.o);
    if (st == STATUS_OK) st = train_checkpoint_load_state(t->o->resume_dir, t->m, &t->params, &full, &t->state);
    if (st == STATUS_OK) {
        dist_optimizer_scatter_state(&t->dist, &full);
        t->opt.step = full.step;
    }
    optimizer_free(&full, t->b);
    return st;
}

/* What the trainer does for a mixture of experts: the auxiliary losses (refused for a dense
 * model), the routing's statistics for the metrics, and no LoRA on the experts. */
static enum status check_moe(struct trainer *t)
{
    const struct train_options *o = t->o;
    const struct model_config *c = &t->m->cfg;
    if (!c->n_experts && (o->moe_aux_loss_coeff != 0.0f || o->moe_z_loss_coeff != 0.0f))
        return status_errorf(STATUS_INVALID_ARGUMENT, "--moe-aux-loss-coeff %g / --moe-z-loss-coeff %g: %s is not a "
                             "mixture of experts", (double)o->moe_aux_loss_coeff, (double)o->moe_z_loss_coeff,
                             c->architecture);
    if (o->moe_router_bias_update_rate > 0.0f && !c->moe_sel_bias)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--moe-router-bias-update-rate %g: %s has no router selection bias "
                             "to update (MiniMax-M2's e_score_correction_bias)", (double)o->moe_router_bias_update_rate,
                             c->architecture);
    if (o->moe_router_bias_update_rate > 0.0f && o->lora_rank > 0)
        return status_errorf(STATUS_UNSUPPORTED, "--moe-router-bias-update-rate with LoRA: the base (and its bias) is "
                             "frozen; train it fully");
    if (!c->n_experts) return STATUS_OK;
    const unsigned mlp = 1u << LORA_TARGET_GATE | 1u << LORA_TARGET_UP | 1u << LORA_TARGET_DOWN;
    if (o->lora_rank > 0 && (o->lora_targets & mlp))
        return status_errorf(STATUS_UNSUPPORTED, "LoRA on a mixture of experts' MLP (gate, up, down: the experts and "
                             "the shared expert) is not built; --lora-targets q,k,v,o trains the attention of %s",
                             c->architecture);
    const size_t cells = (size_t)c->n_experts * (size_t)c->n_layers;
    t->expert_load = calloc(cells, sizeof *t->expert_load);
    t->moe_sums = calloc(3 + cells, sizeof *t->moe_sums);
    return t->expert_load && t->moe_sums ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
}

static enum status setup(struct trainer *t)
{
    const struct train_options *o = t->o;
    enum status st = check_options(o, &t->num_microbatches);
    if (st != STATUS_OK) return st;
    /* A full fine-tune resumes from its own checkpoint (the model file is the trained model);
     * LoRA resumes the adapter on the same base. */
    const char *start = o->resume_dir && o->lora_rank <= 0 ? o->resume_dir : o->model_dir;
    t->start = start;
    if (o->lora_rank > 0 && !o->model_dir)
        return status_errorf(STATUS_INVALID_ARGUMENT, "LoRA training needs --model (the base) also with --resume");
    char path[4200];
    if ((st = train_ranks_init(&t->ranks, o, t->num_microbatches)) != STATUS_OK) return st;
    if ((st = out_dir_check(o->out_dir, o->model_dir, o->resume_dir, o->overwrite_out)) != STATUS_OK) return st;
    if (o->overwrite_out && train_ranks_leader(&t->ranks) &&
        (st = out_dir_clear_checkpoints(o->out_dir, o->resume_dir)) != STATUS_OK)
        return st;
    const int multi = t->ranks.world->size > 1;
    if (multi && o->lora_rank > 0 && o->resume_dir)
        return status_errorf(STATUS_UNSUPPORTED, "resuming LoRA training on several ranks is not built (the state "
                             "file's moments are whole, not sliced on resume); resume on one rank");
    if ((st = train_ranks_connect(&t->ranks, o->device, o->threads, &t->b)) != STATUS_OK) return st;
    /* Loaded in f32: these are the master weights; mixed precision adds a compute copy below.
     * A LoRA base is frozen, so it needs no master: it is loaded in the compute dtype itself. */
    const enum dtype compute_dt = o->precision == TRAIN_PRECISION_BF16 ? DTYPE_BF16
                                : o->precision == TRAIN_PRECISION_FP16 ? DTYPE_F16 : DTYPE_F32;
    st = model_load_as(start, t->b, &t->ranks.par, o->lora_rank > 0 ? compute_dt : DTYPE_F32, &t->m);
    if ((st = parallel_agree(t->ranks.world, st)) != STATUS_OK) return st;
    if (t->m->cfg.encoder) /* no LM head to train, no backward for bidirectional attention or post-LN */
        return status_errorf(STATUS_UNSUPPORTED, "train: %s is an encoder (embeddings only); shardlm trains decoders",
                             t->m->cfg.architecture);
    const struct checkpoint *ck = t->m->checkpoint;
    if ((st = tokenizer_load_for_model(start, ck->tokenizer_proto, ck->tokenizer_proto_n, t->m->cfg.vocab_size,
                                       &t->tok)) != STATUS_OK)
        return st;
    if ((st = check_moe(t)) != STATUS_OK) return st;
    if ((st = model_weights_make_writable(t->m)) != STATUS_OK) return st;
    t->master = &t->m->w;
    if (o->lora_rank > 0) { /* the base frozen: a gradient struct without tensors */
        t->grads.n_layers = t->m->w.n_layers;
        t->grads.layers = calloc((size_t)(t->grads.n_layers > 0 ? t->grads.n_layers : 1), sizeof *t->grads.layers);
        if (!t->grads.layers) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
    } else if ((st = weights_alloc_like(t->b, &t->m->w, DTYPE_F32, &t->grads, &t->grads_mem)) != STATUS_OK) {
        return st;
    }
    struct optimizer_options opt = o->opt;
    t->mbs = calloc((size_t)t->num_microbatches, sizeof *t->mbs);
    t->tbs = calloc((size_t)t->num_microbatches, sizeof *t->tbs);
    if (!t->mbs || !t->tbs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
    for (int i = 0; i < t->num_microbatches; i++)
        if ((st = micro_batch_init(&t->mbs[i], o->micro_batch_size, o->seq_length)) != STATUS_OK) return st;
    if ((st = load_data(t)) != STATUS_OK) return st;
    t->train_iters = o->train_iters > 0 ? o->train_iters : iters_for_epochs(t);
    if (opt.decay_iters <= 0) opt.decay_iters = t->train_iters;
    /* Mixed precision: the f32 weights become the master copy before the tables point at them. */
    if (o->precision != TRAIN_PRECISION_F32 && o->lora_rank <= 0 &&
        ((st = make_compute_copy(t)) != STATUS_OK ||
         (st = param_table_from_weights(&t->compute, &t->m->w, t->m->layer_first)) != STATUS_OK))
        return st;
    if (o->lora_rank > 0) {
        if ((st = setup_lora(t)) == STATUS_OK) lora_ranks_mark(t->m, &t->params, &t->gparams);
    } else if ((st = param_table_from_weights(&t->params, t->master, t->m->layer_first)) == STATUS_OK) {
        st = param_table_from_weights(&t->gparams, &t->grads, t->m->layer_first);
    }
    if (st != STATUS_OK) return st;
    t->use_dist = o->distributed_optimizer && t->ranks.dp > 1 && !t->lora;
    if (o->distributed_optimizer && !t->use_dist && train_ranks_leader(&t->ranks))
        LOG_WARN("train", "--use-distributed-optimizer has no effect at dp 1");
    if (t->use_dist) { /* moments for this rank's shard only */
        t->ranks.dist_opt = 1;
        /* Under expert parallelism the experts' rows are sharded over their own dp group. */
        unsigned char *experts = t->ranks.ep > 1 ? calloc(t->params.n + 1, 1) : NULL;
        if (t->ranks.ep > 1 && !experts) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of memory");
        for (size_t i = 0; experts && i < t->params.n; i++)
            experts[i] = param_is_expert(&t->params.p[i]);
        st = dist_optimizer_init(&t->dist, t->b, t->ranks.groups.dp, &t->params, &t->gparams, &t->grads_mem, &opt,
                                 t->ranks.groups.edp, experts);
        free(experts);
        if (st != STATUS_OK) return st;
        if (t->grads.tied) t->grads.lm_head = t->grads.tok_embedding; /* moved with the table */
        t->opt.o = opt;
        t->opt.n = t->params.n;
    } else if ((st = optimizer_init(&t->opt, t->b, &t->params, &opt)) != STATUS_OK) {
        return st;
    }
    t->state = (struct train_state){.cursor = {.seed = o->seed}, .scaler = loss_scaler_constant(1.0)};
    if (o->precision == TRAIN_PRECISION_FP16)
        t->state.scaler = o->loss_scale > 0 ? loss_scaler_constant(o->loss_scale)
                                            : loss_scaler_dynamic(o->initial_loss_scale, o->min_loss_scale,
                                                                  o->loss_scale_window, o->hysteresis);
    if (o->resume_dir && (st = load_state(t)) != STATUS_OK) return st;
    if (o->resume_dir && t->state.cursor.seed != o->seed)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--seed %llu differs from the checkpoint's %llu",
                             (unsigned long long)o->seed, (unsigned long long)t->state.cursor.seed);
    if (t->master != &t->m->w) sync_compute(t); /* the compute copy of the (restored) masters */
    if (t->use_dist && t->master != &t->m->w && o->moe_router_bias_update_rate > 0.0f)
        return status_errorf(STATUS_UNSUPPORTED, "--moe-router-bias-update-rate with --%s and the distributed optimizer: "
                             "the sharded masters would undo the bias's update (use f32, or the optimizer whole)",
                             o->precision == TRAIN_PRECISION_BF16 ? "bf16" : "fp16");
    if (t->use_dist && t->master != &t->m->w && (st = shard_masters(t)) != STATUS_OK) return st;
    struct train_memory mem = o->memory;
    const int in_flight = t->ranks.pp - t->m->pp_rank; /* 1F1B's micro-batches in flight */
    mem.sets = in_flight < t->ranks.micro_per_replica ? in_flight : t->ranks.micro_per_replica;
    if (mem.sets < 1) mem.sets = 1;
    if ((st = model_train_new(t->m, o->micro_batch_size * o->seq_length, &mem, &t->mt)) != STATUS_OK) return st;
    if (train_ranks_leader(&t->ranks))
        LOG_INFO("train", "activations: %.1f MiB on the device (%d set(s) of %d tokens)",
                 (double)model_train_activation_bytes(t->mt) / 1048576.0, mem.sets, o->micro_batch_size * o->seq_length);
    model_train_set_lora(t->mt, t->lora);
    model_train_set_moe_loss(t->mt, o->moe_aux_loss_coeff, o->moe_z_loss_coeff);
    if ((st = train_ranks_attach(&t->ranks, t->mt, &t->gparams, &t->opt)) != STATUS_OK) return st;
    snprintf(path, sizeof path, "%s/metrics.jsonl", o->out_dir);
    const char *mp = o->metrics_path ? o->metrics_path : path;
    if ((st = train_checkpoint_make_dir(o->out_dir)) != STATUS_OK) return st;
    if (!train_ranks_leader(&t->ranks)) return STATUS_OK;
    t->metrics = fopen(mp, o->resume_dir ? "a" : "w");
    if (!t->metrics) return status_errorf(STATUS_IO, "%s: cannot open the metrics file", mp);
    LOG_INFO("train", "%s: %lld parameters, %d layers; %lld iterations of %d packed sequences of up to %d tokens "
             "(%d micro-batches of %d per step)%s",
             t->m->cfg.architecture, (long long)weights_numel(&t->m->w), t->m->cfg.n_layers,
             (long long)t->train_iters, o->global_batch_size, o->seq_length, t->num_microbatches,
             o->micro_batch_size, o->resume_dir ? ", resumed" : "");
    char ep[64] = "";
    if (t->ranks.ep > 1) snprintf(ep, sizeof ep, ", ep %d (the experts split over dp ranks)", t->ranks.ep);
    if (multi)
        LOG_INFO("train", "%d ranks: tp %d x pp %d x dp %d%s%s%s; recomputation %s; %d activation set(s) on this stage",
                 t->ranks.world->size, t->ranks.tp, t->ranks.pp, t->ranks.dp, ep,
                 o->memory.sequence_parallel && t->ranks.tp > 1 ? ", sequence parallel" : "",
                 t->ranks.dist_opt ? ", distributed optimizer" : "",
                 mem.recompute == TRAIN_RECOMPUTE_NONE ? "none" : mem.recompute == TRAIN_RECOMPUTE_SELECTIVE ? "selective" : "full",
                 mem.sets);
    return STATUS_OK;
}

static void teardown(struct trainer *t)
{
    if (t->metrics) fclose(t->metrics);
    for (int i = 0; t->mbs && i < t->num_microbatches; i++) micro_batch_free(&t->mbs[i]);
    free(t->mbs);
    free(t->tbs);
    data_free(&t->train);
    data_free(&t->eval);
    if (t->b) {
        optimizer_free(&t->opt, t->b);
        dist_optimizer_free(&t->dist);
        param_table_free(&t->params);
        param_table_free(&t->gparams);
        param_table_free(&t->compute);
        lora_free(t->lora, t->b);
        if (t->master == &t->master_store) weights_free_layers(&t->master_store);
        backend_free(t->b, t->compute_mem);
        weights_free_layers(&t->grads);
        backend_free(t->b, t->grads_mem);
    }
    model_train_free(t->mt);
    free(t->expert_load);
    free(t->moe_sums);
    model_free(t->m);
    tokenizer_free(t->tok);
    if (t->ranks.world) train_ranks_free(&t->ranks);
    backend_close(t->b);
}

/* ---- one iteration ----------------------------------------------------------------------- */

static struct train_batch batch_of(const struct micro_batch *mb, float grad_scale)
{
    return (struct train_batch){
        .n_tokens = mb->n_tokens, .tokens = mb->tokens, .targets = mb->targets,
        .positions = mb->positions, .n_docs = mb->n_docs, .doc_start = mb->doc_start,
        .grad_scale = grad_scale,
    };
}

struct step_result {
    double loss;        /* mean per-token loss of the global batch */
    int stop;           /* a stop signal reached some rank: every rank stops after this step */
    double grad_norm;   /* of the unscaled gradients */
    double lr;
    double loss_scale;
    double moe_aux, moe_z; /* a mixture of experts: the auxiliary losses' means over layers and
                              micro-batches, without coefficients (the load in expert_load) */
    int skipped;        /* fp16: the step was skipped for an overflow */
    int64_t tokens, targets;
};

/* Sequence parallelism splits the rows over tp: a micro-batch is padded to a multiple of tp
 * with one more document of masked rows (no loss, and no gradient reaches the others). */
static void pad_rows(struct micro_batch *mb, int multiple)
{
    if (multiple <= 1 || mb->n_tokens % multiple == 0) return;
    const int n = mb->n_tokens, pad = multiple - n % multiple;
    CHECK(n + pad <= mb->capacity, "padding beyond the micro-batch");
    for (int i = n; i < n + pad; i++) {
        mb->tokens[i] = 0;
        mb->targets[i] = -1;
        mb->positions[i] = i - n;
    }
    mb->n_tokens = n + pad;
    mb->doc_start[++mb->n_docs] = mb->n_tokens;
}

/* Reads the step's micro-batches (every rank reads all of them, so that every rank knows every
 * size), and lays this replica's non-empty ones out as train batches. */
static int next_micro_batches(struct trainer *t, int64_t *targets, int64_t *tokens, float *scale_out, double loss_scale)
{
    const struct train_options *o = t->o;
    *targets = *tokens = 0;
    for (int i = 0; i < t->num_microbatches; i++) {
        data_next_micro_batch(&t->train, &t->state.cursor, o->micro_batch_size, o->seq_length, &t->mbs[i]);
        *targets += t->mbs[i].n_targets;
        *tokens += t->mbs[i].n_tokens;
        pad_rows(&t->mbs[i], model_train_row_multiple(t->m, &o->memory));
    }
    /* Every micro-batch's gradient is scaled by (loss scale) / (targets of the whole global
     * batch): the mean per-token loss of the global batch, times the fp16 loss scale. */
    *scale_out = *targets > 0 ? (float)(loss_scale / (double)*targets) : 0.0f;
    const int per = t->ranks.micro_per_replica, first = t->ranks.dp_rank * per;
    int n = 0;
    for (int i = first; i < first + per; i++)
        if (t->mbs[i].n_tokens > 0) {
            t->tbs[n] = batch_of(&t->mbs[i], *scale_out);
            t->tbs[n].dropout = 1; /* LoRA's masks: keyed by the step and the global micro-batch */
            t->tbs[n].step = t->state.iteration;
            t->tbs[n].aux_scale = (float)(loss_scale / t->num_microbatches); /* the mean over micro-batches */
            t->tbs[n++].micro = i;
        }
    return n;
}

/* Whether this rank holds a share of the loss that the world's sum should count once: the
 * last stage's tp rank 0, of every replica (train) or of the first (evaluation). */
static int loss_owner(const struct trainer *t, int all_replicas)
{
    return model_is_last_stage(t->m) && t->m->tp_rank == 0 && (all_replicas || t->ranks.dp_rank == 0);
}

/* A mixture of experts: the step's routing statistics summed over the world (every rank holds
 * its stage's layers, at their global index, and its replica's micro-batches; of a tp group only
 * rank 0 counts them, train_moe_count), into t->expert_load and the auxiliary losses' means over layers and
 * micro-batches. A collective: every rank calls it after the same step. */
static enum status moe_step_stats(struct trainer *t, struct step_result *r)
{
    const struct model *m = t->m;
    const size_t E = (size_t)m->cfg.n_experts, cells = E * (size_t)m->cfg.n_layers;
    double *v = t->moe_sums; /* aux sum, z sum, forwards x layers, then the load */
    memset(t->expert_load, 0, cells * sizeof *t->expert_load);
    const int fw = model_train_moe_stats(t->mt, &v[0], &v[1], t->expert_load + (size_t)m->layer_first * E);
    int sparse = 0; /* the MoE layers of this stage (GLM-4.5's dense first layers route nothing) */
    for (int l = m->layer_first; l < m->layer_first + m->n_layers_local; l++) sparse += config_layer_moe(&m->cfg, l);
    v[2] = (double)fw * sparse;
    for (size_t i = 0; i < cells; i++) v[3 + i] = (double)t->expert_load[i]; /* exact below 2^53 */
    enum status st = train_ranks_sum(&t->ranks, v, (int)(3 + cells));
    if (st != STATUS_OK) return st;
    r->moe_aux = v[2] > 0 ? v[0] / v[2] : 0.0;
    r->moe_z = v[2] > 0 ? v[1] / v[2] : 0.0;
    for (size_t i = 0; i < cells; i++) t->expert_load[i] = (int64_t)v[3 + i];
    return STATUS_OK;
}

static enum status train_step(struct trainer *t, struct step_result *r)
{
    int64_t targets = 0, tokens = 0;
    weights_zero(t->b, &t->grads);
    if (t->lora) lora_zero_grads(t->lora, t->b);
    const double loss_scale = t->state.scaler.scale;
    float grad_scale = 0.0f;
    const int n = next_micro_batches(t, &targets, &tokens, &grad_scale, loss_scale);
    /* Under expert parallelism every rank of an ep group runs the same number of forwards (each
     * MoE layer is a collective): an empty micro-batch, which a replica skips, is refused on every
     * rank (each rank reads every micro-batch of the step). */
    for (int i = 0; t->ranks.ep > 1 && i < t->num_microbatches; i++)
        if (t->mbs[i].n_tokens == 0)
            return status_errorf(STATUS_UNSUPPORTED, "iteration %lld: micro-batch %d is empty (no tokens); --ep needs "
                                 "every micro-batch non-empty", (long long)t->state.iteration + 1, i);
    double loss_sum = 0.0;
    model_train_moe_stats(t->mt, &r->moe_aux, &r->moe_z, NULL); /* forget the evaluations' routing */
    enum status st = train_ranks_step(&t->ranks, t->mt, t->tbs, n, &t->grads, &loss_sum);
    if (st == STATUS_OK) st = train_ranks_reduce_grads(&t->ranks, t->mt, &t->grads, &t->gparams);
    /* The stop flag travels with the loss: the world's sum is the same on every rank, so every
     * rank stops after the same iteration, whichever ranks the signal reached. */
    double v[2] = {loss_owner(t, 1) ? loss_sum : 0.0, t->o->stop_signal && *t->o->stop_signal ? 1.0 : 0.0};
    if (st == STATUS_OK) st = train_ranks_sum(&t->ranks, v, 2);
    loss_sum = v[0];
    r->stop = v[1] > 0.0;
    if (st == STATUS_OK && t->expert_load) st = moe_step_stats(t, r);
    if (st != STATUS_OK) return st;
    r->loss = targets > 0 ? loss_sum / (double)targets : 0.0;
    double scaled_norm;
    if (t->use_dist) {
        if ((st = dist_optimizer_reduce(&t->dist)) != STATUS_OK) return st;
        const double local = dist_optimizer_sumsq(&t->dist, &t->gparams);
        scaled_norm = sqrt(t->opt.reduce_sumsq ? t->opt.reduce_sumsq(t->opt.reduce_ctx, local) : local);
    } else {
        scaled_norm = optimizer_grad_norm(&t->opt, t->b, &t->gparams);
    }
    if (t->ranks.failed != STATUS_OK) return t->ranks.failed; /* the norm's collective failed */
    r->grad_norm = scaled_norm / loss_scale;
    /* The schedule advances with the updates taken (Megatron: skipped steps do not move it). */
    r->lr = optimizer_lr(&t->opt.o, t->opt.step);
    r->loss_scale = loss_scale;
    r->tokens = tokens;
    r->targets = targets;
    const int found_inf = !isfinite(scaled_norm);
    if (t->o->precision == TRAIN_PRECISION_FP16) {
        /* An overflow skips the step (and lowers the scale); the iteration still counts. */
        r->skipped = loss_scaler_update(&t->state.scaler, found_inf);
    } else if (!isfinite(r->loss) || found_inf) {
        return status_errorf(STATUS_INTERNAL, "iteration %lld: the loss (%g) or the gradient norm (%g) is not finite",
                             (long long)t->state.iteration + 1, r->loss, r->grad_norm);
    }
    if (!r->skipped) {
        if (t->use_dist) {
            if ((st = dist_optimizer_step(&t->dist, &t->params, r->lr, r->grad_norm, 1.0 / loss_scale)) != STATUS_OK)
                return st;
            t->opt.step = t->dist.step;
        } else {
            optimizer_step(&t->opt, t->b, &t->params, &t->gparams, r->lr, r->grad_norm, 1.0 / loss_scale);
        }
        if (t->master != &t->m->w && !t->masters_sharded) sync_compute(t); /* else done by the all-gather */
        if (t->o->moe_router_bias_update_rate > 0.0f) /* DeepSeek-V3's loss-free balancing */
            moe_update_sel_bias(t->m, t->master, t->expert_load, t->o->moe_router_bias_update_rate);
    }
    t->state.iteration++;
    t->state.consumed_tokens += tokens;
    return STATUS_OK;
}

/* Mean per-token loss over eval_iters micro-batches of the held-out set, read from its start
 * in a fixed order (the same tokens at every evaluation). */
static enum status evaluate(struct trainer *t, double *loss, int64_t *targets)
{
    const struct train_options *o = t->o;
    struct data_cursor cur = {.seed = o->seed, .epoch = 0, .index = 0};
    double v[2] = {0.0, 0.0};
    for (int it = 0; it < o->eval_iters; it++) {
        data_next_micro_batch(&t->eval, &cur, o->micro_batch_size, o->seq_length, &t->mbs[0]);
        if (o->memory.sequence_parallel) pad_rows(&t->mbs[0], t->ranks.tp);
        if (t->mbs[0].n_tokens == 0) break;
        struct train_batch tb = batch_of(&t->mbs[0], 0.0f);
        double ls = 0.0;
        int nr = 0;
        enum status st = train_ranks_forward(&t->ranks, t->mt, &tb, &ls, &nr);
        if (st != STATUS_OK) return st;
        if (loss_owner(t, 0)) {
            v[0] += ls;
            v[1] += nr;
        }
        if (cur.epoch > 0) break; /* the whole held-out set was read */
    }
    enum status st = train_ranks_sum(&t->ranks, v, 2);
    if (st != STATUS_OK) return st;
    *loss = v[1] > 0 ? v[0] / v[1] : 0.0;
    *targets = (int64_t)v[1];
    return STATUS_OK;
}

/* ---- reporting --------------------------------------------------------------------------- */

static void fmt_duration(char *buf, size_t n, double s)
{
    if (s < 0 || !isfinite(s)) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
}

static void report(struct trainer *t, const struct step_result *r, double step_s)
{
    if (!t->metrics) return; /* not the leader */
    const int64_t it = t->state.iteration;
    const double elapsed = base_now_s() - t->t_start, tps = step_s > 0 ? (double)r->tokens / step_s : 0.0;
    char norm[32]; /* JSON has no NaN or Inf: an overflowed norm is null */
    if (isfinite(r->grad_norm)) snprintf(norm, sizeof norm, "%.6g", r->grad_norm);
    else snprintf(norm, sizeof norm, "null");
    fprintf(t->metrics,
            "{\"iter\": %lld, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %s, \"loss_scale\": %.17g, "
            "\"skipped\": %d, \"tokens\": %lld, \"targets\": %lld, \"tokens_per_s\": %.1f, \"elapsed_s\": %.3f",
            (long long)it, r->loss, r->lr, norm, r->loss_scale, r->skipped, (long long)r->tokens,
            (long long)r->targets, tps, elapsed);
    if (t->expert_load) { /* a mixture of experts: the routing (docs/training.md) */
        const int E = t->m->cfg.n_experts;
        fprintf(t->metrics, ", \"moe_aux_loss\": %.6g, \"moe_z_loss\": %.6g, \"expert_load\": [", r->moe_aux, r->moe_z);
        for (int l = 0; l < t->m->cfg.n_layers; l++)
            for (int e = 0; e < E; e++)
                fprintf(t->metrics, "%s%lld%s", e ? ", " : l ? ", [" : "[", (long long)t->expert_load[(size_t)l * E + e],
                        e == E - 1 ? "]" : "");
        fprintf(t->metrics, "]");
    }
    fprintf(t->metrics, "}\n");
    if (r->skipped)
        LOG_WARN("train", "step %lld skipped: the fp16 gradients overflowed at loss scale %g (now %g; %lld skipped "
                 "so far)",
                 (long long)it, r->loss_scale, t->state.scaler.scale, (long long)t->state.scaler.skipped);
    fflush(t->metrics);
    if (it % t->o->log_interval != 0 && it != t->train_iters) return;
    char eta[32];
    fmt_duration(eta, sizeof eta, step_s * (double)(t->train_iters - it));
    if (t->o->progress)
        fprintf(stderr, "\r\033[Kstep %lld/%lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tok/s | ETA %s",
                (long long)it, (long long)t->train_iters, r->loss, r->lr, r->grad_norm, tps, eta);
    else
        LOG_INFO("train", "step %lld/%lld | loss %.4f | lr %.3g | grad norm %.3f | %.0f tok/s | ETA %s",
                 (long long)it, (long long)t->train_iters, r->loss, r->lr, r->grad_norm, tps, eta);
}

static enum status maybe_evaluate(struct trainer *t, int force)
{
    const int64_t it = t->state.iteration;
    if (t->eval.n == 0 || t->o->eval_iters <= 0) return STATUS_OK;
    if (!force && (t->o->eval_interval <= 0 || it % t->o->eval_interval != 0)) return STATUS_OK;
    double loss = 0.0;
    int64_t n = 0;
    enum status st = evaluate(t, &loss, &n);
    if (st != STATUS_OK || !t->metrics) return st;
    fprintf(t->metrics, "{\"iter\": %lld, \"eval_loss\": %.6f, \"eval_ppl\": %.4f, \"eval_targets\": %lld}\n",
            (long long)it, loss, exp(loss), (long long)n);
    fflush(t->metrics);
    if (t->o->progress) fputc('\n', stderr);
    LOG_INFO("train", "eval at step %lld: loss %.4f, perplexity %.2f (%lld tokens)", (long long)it, loss, exp(loss),
             (long long)n);
    return STATUS_OK;
}

static enum status save_checkpoint(struct trainer *t, const char *dir)
{
    if (t->lora && t->ranks.world->size > 1)
        return lora_ranks_save(dir, t->m, t->lora, t->o->model_dir, &t->params, &t->opt, &t->state);
    if (t->lora)
        return train_checkpoint_save_adapter(dir, t->m, t->lora, t->o->model_dir, &t->params, &t->opt, &t->state);
    if (!t->use_dist) return train_checkpoint_save(dir, t->m, t->master, &t->params, &t->opt, &t->state);
    struct optimizer full; /* the whole moments, for the file */
    struct model_weights whole = {0}; /* and the whole masters when they are sharded */
    struct param_table whole_rows = {0};
    void *whole_mem = NULL;
    enum status st = optimizer_init(&full, t->b, &t->params, &t->opt.o);
    if (st == STATUS_OK) st = dist_optimizer_gather_state(&t->dist, &full);
    if (st == STATUS_OK && t->masters_sharded &&
        (st = weights_alloc_like(t->b, &t->m->w, DTYPE_F32, &whole, &whole_mem)) == STATUS_OK &&
        (st = param_table_from_weights(&whole_rows, &whole, t->m->layer_first)) == STATUS_OK)
        st = dist_optimizer_gather_masters(&t->dist, &whole_rows);
    if (st == STATUS_OK)
        st = t->masters_sharded ? train_checkpoint_save(dir, t->m, &whole, &whole_rows, &full, &t->state)
                                : train_checkpoint_save(dir, t->m, t->master, &t->params, &full, &t->state);
    optimizer_free(&full, t->b);
    param_table_free(&whole_rows);
    weights_free_layers(&whole);
    backend_free(t->b, whole_mem);
    return st;
}

void train_options_default(struct train_options *o)
{
    *o = (struct train_options){
        .micro_batch_size = 1, .seq_length = 1024, .seed = 1234, .eval_iters = 10, .log_interval = 1,
        .device = DEVICE_CPU,
        .opt = {.lr = 1e-4, .min_lr = 0.0, .decay_style = LR_DECAY_COSINE, .weight_decay = 0.01,
                .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .clip_grad = 1.0},
        .data_opt = {.overflow = DATA_OVERFLOW_TRUNCATE},
        .initial_loss_scale = 4294967296.0, .min_loss_scale = 1.0, .loss_scale_window = 1000, .hysteresis = 2,
        .lora_alpha = 32.0f, .lora_targets = (1u << LORA_TARGET_COUNT) - 1,
        .keep_checkpoints = 3,
    };
}

enum status train_run(const struct train_options *given)
{
    /* --resume DIR: DIR itself, or the latest complete checkpoint under it. */
    struct train_options resolved = *given;
    char resume[4200];
    long long resume_iter = -1;
    if (given->resume_dir) {
        enum status st = out_dir_resolve_resume(given->resume_dir, resume, sizeof resume, &resume_iter);
        if (st == STATUS_OK) st = train_checkpoint_check_kind(resume, given->eagle);
        if (st != STATUS_OK) return st;
        resolved.resume_dir = resume;
    }
    const struct train_options *o = &resolved;
    if (o->eagle) return eagle_train_run(o);
    struct trainer t = {.o = o};
    enum status st = setup(&t);
    if (st == STATUS_OK && o->resume_dir && train_ranks_leader(&t.ranks))
        LOG_INFO("train", "resuming from %s (iteration %lld)", o->resume_dir, resume_iter);
    if (t.ranks.world) st = parallel_agree(t.ranks.world, st);
    t.t_start = base_now_s();
    if (st == STATUS_OK && t.state.iteration == 0) st = maybe_evaluate(&t, 1);
    int stopped = 0;
    char stop_dir[4200] = "";
    while (st == STATUS_OK && t.state.iteration < t.train_iters) {
        struct step_result r = {0};
        const double t0 = base_now_s();
        if ((st = train_step(&t, &r)) != STATUS_OK) break;
        report(&t, &r, base_now_s() - t0);
        if ((st = maybe_evaluate(&t, t.state.iteration == t.train_iters)) != STATUS_OK) break;
        stopped = r.stop && t.state.iteration < t.train_iters;
        if (stopped || (o->save_interval > 0 && t.state.iteration % o->save_interval == 0 &&
                        t.state.iteration < t.train_iters)) {
            snprintf(stop_dir, sizeof stop_dir, "%s/checkpoints/iter_%07lld", o->out_dir, (long long)t.state.iteration);
            if (o->progress) fputc('\n', stderr);
            if ((st = save_checkpoint(&t, stop_dir)) == STATUS_OK && train_ranks_leader(&t.ranks))
                st = out_dir_prune(o->out_dir, o->keep_checkpoints);
        }
        if (stopped) break;
    }
    if (o->progress && st == STATUS_OK) fputc('\n', stderr);
    if (st == STATUS_OK && stopped)
        st = status_errorf(STATUS_CANCELLED, "stopped by a signal after iteration %lld of %lld; checkpoint %s written "
                           "(continue with --resume %s)", (long long)t.state.iteration, (long long)t.train_iters,
                           stop_dir, o->out_dir);
    else if (st == STATUS_OK) st = save_checkpoint(&t, o->out_dir);
    if (st == STATUS_OK && t.m) moe_ep_train_log(t.m); /* every ep rank its own line */
    if (st == STATUS_OK)
        LOG_INFO("train", "wrote %s after %lld iterations (%.1f s)", o->out_dir, (long long)t.state.iteration,
                 base_now_s() - t.t_start);
    char why[1024] = "", who[512] = "";
    const int rank = t.ranks.world ? t.ranks.world->rank : 0;
    if (st != STATUS_OK) snprintf(why, sizeof why, "%s", status_message());
    /* Named once: a timeout's own message already names the silent ranks (parallel_watch). */
    if (st == STATUS_UNAVAILABLE && t.ranks.world && !strstr(why, "silent for"))
        train_ranks_explain(&t.ranks, who, sizeof who);
    teardown(&t); /* may leave messages of its own: the failure is told after it */
    if (st == STATUS_UNAVAILABLE) /* a peer failed: say where, and which one, if known */
        return status_errorf(st, "rank %d, iteration %lld: %s%s%s", rank, (long long)t.state.iteration + 1, why,
                             who[0] ? "; " : "", who);
    if (st != STATUS_OK) return status_errorf(st, "%s", why);
    return st;
}
