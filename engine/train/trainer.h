/* engine/train/trainer.h - `shardlm train`: the training loop of one rank. Each iteration
 * reads num_microbatches = global_batch_size / micro_batch_size packed micro-batches, runs
 * forward and backward on each (gradients accumulated in f32), scales the loss by the real
 * target tokens of the whole global batch (Megatron's per-token loss, so that 1 x 8 and 8 x 1
 * give the same update), clips by the global norm and takes an AdamW step; logs, evaluates
 * and saves checkpoints at the chosen intervals.
 * Not here: data formats (data.c), AdamW (optimizer.c), checkpoint files (train_checkpoint.c),
 * the flags (cli/train.c).
 * Tests: tests/test_train.sh (stories260K on tinyshakespeare, resume, serving the result),
 * tests/test_train_step.py (whole steps against JAX + optax). */
#ifndef SHARDLM_TRAINER_H
#define SHARDLM_TRAINER_H

#include <signal.h>
#include <stdint.h>

#include "data.h"
#include "loss_scaler.h"
#include "ops.h"
#include "model_train.h"
#include "optimizer.h"

/* The compute precision (--bf16, --fp16): weights and activations in that dtype with f32 math,
 * fp32 master weights, gradients and moments. */
enum train_precision { TRAIN_PRECISION_F32, TRAIN_PRECISION_BF16, TRAIN_PRECISION_FP16 };

enum { EAGLE_GIVEN_FEATURE_LOSS = 1, EAGLE_GIVEN_FEATURE_NOISE = 2, EAGLE_GIVEN_UNROLL = 4 };

struct train_options {
    const char *model_dir;        /* the model to start from (anything serve loads) */
    const char *data;             /* comma-separated training files */
    const char *eval_data;        /* held-out files, or NULL */
    int         split_percent;    /* --split 98,2: the held-out percent, when no eval_data */
    const char *out_dir;          /* the final checkpoint (serving layout + training state) */
    const char *resume_dir;       /* a checkpoint written by this trainer, or NULL */
    const char *metrics_path;     /* JSONL metrics; NULL = out_dir/metrics.jsonl */
    int         micro_batch_size, global_batch_size, seq_length;
    int64_t     train_iters;      /* 0: from epochs */
    double      epochs;           /* used when train_iters is 0 */
    struct optimizer_options opt;
    uint64_t    seed;
    int         eval_interval, eval_iters, save_interval, log_interval;
    int         keep_checkpoints; /* interval checkpoints kept under out_dir/checkpoints (0: all) */
    int         overwrite_out;    /* --overwrite-out: an out_dir holding a model may be replaced (out_dir.h) */
    /* Set (to the signal's number) by the command's SIGTERM / SIGINT / SIGUSR1 handler; NULL:
     * no handler. Read once per iteration; the ranks agree through the step's loss sum. */
    volatile sig_atomic_t *stop_signal;
    struct data_options data_opt;
    int         chat_template_auto; /* 1: the chat template is chosen from the model: its own Jinja
                                       template when its tokenizer encodes special tokens (as
                                       serving does), else a built-in (chat_template_detect) */
    const char *chat_template_file; /* --chat-template FILE.jinja, or NULL */
    enum train_precision precision;
    double      loss_scale;       /* fp16: a constant scale; 0 = dynamic (below) */
    double      initial_loss_scale, min_loss_scale;
    int         loss_scale_window, hysteresis;
    int         lora_rank;        /* > 0: train LoRA adapters on a frozen base (lora.h) */
    float       lora_alpha;
    unsigned    lora_targets;     /* bit mask of enum lora_target */
    float       lora_dropout;     /* p in [0, 1) on the adapters' input in training (lora.h) */
    /* A mixture of experts: Megatron's --moe-aux-loss-coeff and --moe-z-loss-coeff (moe.h); a
     * non-zero one is refused for a dense model. */
    float       moe_aux_loss_coeff, moe_z_loss_coeff;
    /* DeepSeek-V3's auxiliary-loss-free balancing (Megatron's --moe-router-enable-expert-bias,
     * --moe-router-bias-update-rate): after every step each layer's selection bias moves by rate
     * towards the experts that got fewer tokens than the mean, b_e += rate sign(mean - load_e);
     * 0: off. A router with a selection bias (MiniMax-M2) only. */
    float       moe_router_bias_update_rate;
    /* Parallelism (mpirun -n tp x pp x dp): Megatron's flags. */
    int         tp, pp;             /* --tensor-model-parallel-size, --pipeline-model-parallel-size */
    int         ep;                 /* --expert-model-parallel-size (--ep): a mixture's experts split
                                       over ep data-parallel ranks (train_parallel.h); 1 without */
    const char *pp_layers;          /* --pp-layers 8,4: layers per stage (NULL: balanced) */
    int         distributed_optimizer; /* --use-distributed-optimizer: ZeRO-1 over dp */
    struct train_memory memory;     /* --sequence-parallel, --recompute-*: model_train.h */
    double      rank_timeout_s;     /* --rank-timeout: a peer silent this long ends the job */
    /* --eagle-head: train an EAGLE-1 draft head for the model (eagle_train.h) instead of the
     * model itself, written as OUT/eagle_head.safetensors; eagle_ffn its MLP's rows (0: the
     * model's own, which a mixture of experts lacks). */
    int         eagle;
    int         eagle_ffn;
    const char *eagle_token_map;  /* --spec-token-map FILE: the head's logits over those tokens */
    float       eagle_feature_loss; /* --eagle-feature-loss W: EAGLE-1's feature regression's weight */
    float       eagle_feature_noise; /* --eagle-feature-noise A: EAGLE-1's noise on the features read */
    int         eagle_unroll;        /* --eagle-unroll: a second pass reading the head's own outputs */
    unsigned    eagle_given;         /* which of those three the command line gave (EAGLE_GIVEN_*): a
                                        resumed run takes the others from its checkpoint */
    const char *eagle_init;       /* --eagle-init FILE: start from this head (its MLP size too) */
    enum device device;
    int         threads;
    int         progress;         /* 1: a live progress line (a terminal), 0: plain log lines */
};

/* The defaults of `shardlm train`'s flags (cli/train.c; the server's fine-tuning jobs start from
 * them too, server/http_finetune.c): micro-batch 1, sequence 1024, seed 1234, AdamW at 1e-4 with
 * cosine decay, LoRA alpha 32 on every target (rank 0: off), f32 on the CPU, no stop flag. */
void train_options_default(struct train_options *o);

/* Runs the whole training; returns STATUS_OK after writing out_dir. Errors (bad flags, data,
 * files, a non-finite loss, an out_dir that holds a model: out_dir.h) come back with a message.
 * A resume_dir is resolved first (out_dir_resolve_resume: an interrupted run's directory
 * continues from its latest complete checkpoint). When *stop_signal becomes non-zero on any
 * rank, every rank finishes the same iteration, the checkpoint of that iteration is written
 * under out_dir/checkpoints/ and STATUS_CANCELLED comes back saying where (unless it was the
 * last iteration: then the run ends as usual). */
enum status train_run(const struct train_options *o);

/* The run's data (train_data.c): the training set and the held-out one (--eval-data, or --split
 * of the training set; eval->n 0 without either), tokenized by tok, chat examples rendered with
 * --chat-template or, with chat_template_auto, the template chosen from the model m loaded from
 * `start` as serving chooses it. */
struct tokenizer;
enum status train_load_data(const struct train_options *o, const char *start, const struct model *m,
                            const struct tokenizer *tok, struct train_dataset *train, struct train_dataset *eval);
/* How chat examples are rendered when data are read for a model (train_data.c): the Jinja
 * template of template_file (--chat-template FILE.jinja) or, with auto_detect, the model's own
 * template `own` when its tokenizer encodes the special tokens a template writes (as serving
 * chooses), else the built-in one chat_template_detect finds from `start` (the model's directory
 * or file). *jt (or NULL) is set in dopt and freed by the caller after data_load. */
struct jinja_template;
enum status data_chat_options(const char *template_file, int auto_detect, const char *own, const char *start,
                              const struct tokenizer *tok, struct data_options *dopt, struct jinja_template **jt);
/* Iterations for --epochs: the micro-batches of one pass over the shuffled data, counted by
 * running a cursor through it (packing makes the number depend on the order; scratch receives
 * them), in steps of num_micro. */
int64_t train_iters_for_epochs(const struct train_options *o, struct train_dataset *train, int num_micro,
                               struct micro_batch *scratch);

#endif
