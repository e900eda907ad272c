/* engine/train/train_checkpoint.h - training checkpoints: the model in the serving layout (what
 * `shardlm serve` and `generate` load as they are: config.json, tokenizer files,
 * model.safetensors in the Hugging Face layout of the source model's family, in its dtype) plus
 * train_state.safetensors: the AdamW moments (and the f32 master weights when the model file
 * holds another dtype), laid out by the weights' table, with the iteration, the data cursor and
 * the seed in its metadata. Written atomically: into DIR.tmp, then renamed over DIR.
 * Every tensor is stored whole, in the canonical layout (checkpoint.h), whatever tp x pp x dp
 * layout wrote it, so that any layout resumes it: a multi-rank save gathers onto world rank 0
 * (train_checkpoint_ranks.c), a load cuts each rank's tensor-parallel slice.
 * Not here: the loop (trainer.c), the formats' writers (engine/formats/checkpoint_write.c).
 * Tests: tests/test_train.sh (bitwise resume; the result served), tests/test_train_ckpt_parallel.c
 * (saves at tp 2 x pp 2, tp 2, pp 2 and tp 4 under mpirun -n 4, resumed at other layouts). */
#ifndef SHARDLM_TRAIN_CHECKPOINT_H
#define SHARDLM_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "data.h"
#include "lora.h"
#include "loss_scaler.h"
#include "model.h"
#include "optimizer.h"
#include "params.h"

/* The training state's file in a checkpoint directory and its format (metadata "format"; an
 * EAGLE head's checkpoint, eagle_train.h, carries it too, with metadata "trained": "eagle_head"). */
#define TRAIN_STATE_FILE "train_state.safetensors"
#define TRAIN_STATE_FORMAT "shardlm-train-state-1"

struct train_state {
    int64_t iteration;          /* iterations done (skipped fp16 steps included, as Megatron) */
    int64_t consumed_tokens;
    struct data_cursor cursor;  /* where the next micro-batch starts (seed included) */
    struct loss_scaler scaler;  /* fp16 only; scale 1 and no skips otherwise */
};

/* Creates dir (and its parents) when missing. */
enum status train_checkpoint_make_dir(const char *dir);

/* Writes the checkpoint of (master, opt, st) to dir, replacing what was there only once it is
 * complete: the model file from master (the f32 master copy of m's weights; m->w itself in f32
 * training), the state of the trained parameters `params` (their moments in opt, and their
 * values when the model file cannot hold them exactly).
 * When m is one shard of a model split over several ranks (m->par.world of more than one rank)
 * this is a collective over that world: every rank calls it with its local shard, params being
 * param_table_from_weights(master) (full fine-tuning; anything else is STATUS_UNSUPPORTED).
 * The ranks of data-parallel rank 0 send their slices over world->control to world rank 0,
 * which assembles the canonical tensors in host memory (the whole model and its state: 3, or 4
 * with masters, f32 copies of every parameter) and alone writes dir, the same files a one-rank
 * save writes. Other data-parallel replicas send nothing (their values must be identical), nor
 * does the last stage's copy of tied embeddings at pp > 1 (its row "lm_head/-1": the first
 * stage's embedding is the one parameter written; the trainer keeps the two equal).
 * The metadata (st, opt->step) are world rank 0's. Every rank returns the same status
 * (parallel_agree). The one-rank path is unchanged. */
enum status train_checkpoint_save(const char *dir, struct model *m, struct model_weights *master,
                                  const struct param_table *params, struct optimizer *opt,
                                  const struct train_state *st);

/* The same for LoRA training: the adapter in the PEFT layout (adapter_config.json naming
 * base_model, adapter_model.safetensors) instead of the model, plus the training state. One
 * rank only: STATUS_UNSUPPORTED when m is split over several ranks. */
enum status train_checkpoint_save_adapter(const char *dir, struct model *m, const struct lora *lora,
                                          const char *base_model, const struct param_table *params,
                                          struct optimizer *opt, const struct train_state *st);

/* The same written by one rank for adapters that cover the whole model (lora_create_whole: rank
 * 0 of a job, after lora_ranks_save gathered them), whatever m's layout. */
enum status train_checkpoint_save_adapter_whole(const char *dir, struct model *m, const struct lora *lora,
                                                const char *base_model, const struct param_table *params,
                                                struct optimizer *opt, const struct train_state *st);

/* Writes m's weights as a checkpoint in the serving layout of its family (shardlm merge-lora).
 * One rank only: STATUS_UNSUPPORTED when m is split over several ranks. */
enum status train_checkpoint_write_model(const char *dir, struct model *m);

/* Has write(ctx, tmp) fill DIR.tmp (made empty first), then makes it dir: a new directory
 * appears whole (one rename); an existing one (the final --out, beside metrics.jsonl) receives
 * the files one rename each. On failure DIR.tmp is removed and dir is untouched. */
enum status train_checkpoint_write_dir(const char *dir, enum status (*write)(void *ctx, const char *tmp), void *ctx);

/* Removes a checkpoint directory (its files, then the directory: checkpoints are flat).
 * STATUS_IO when it is still there afterwards. */
enum status train_checkpoint_remove(const char *dir);

/* Whether dir's training state is of the kind a run continues (eagle: an EAGLE head's, metadata
 * "trained": "eagle_head"; else a model's or adapter's): STATUS_INVALID_ARGUMENT naming the
 * other. STATUS_OK when dir has no state (the load then names what is missing). */
enum status train_checkpoint_check_kind(const char *dir, int eagle);

/* The integer metadata value key of sf; *ok = 0 when absent or not an integer. */
struct safetensors;
int64_t train_checkpoint_meta_i64(const struct safetensors *sf, const char *key, int *ok);

/* The iteration recorded in dir/train_state.safetensors (its metadata only). */
enum status train_checkpoint_iteration(const char *dir, int64_t *iteration);

/* Reads dir/train_state.safetensors into opt and *st for the trained parameters `params` of m
 * (on m->b; the f32 values, when stored, replace the parameters'). A row named "kind/layer"
 * (a weight) receives the slice of the canonical tensor that m's (tp_rank, tp_size) shard holds,
 * cut as checkpoint_describe(m->checkpoint, ...) cuts the weights (vocab padding rows zero),
 * so a state written at any layout loads at any other; other rows (LoRA's) are read whole. With
 * tied embeddings, a row "lm_head/-1" (the last stage's copy at pp > 1) reads the embedding's.
 * Local: no communication; each rank reads the file itself. Errors: a missing or foreign state
 * file, a tensor missing, or not of the weight's canonical shape (the message names both). */
enum status train_checkpoint_load_state(const char *dir, struct model *m, const struct param_table *params,
                                        struct optimizer *opt, struct train_state *st);

#endif
