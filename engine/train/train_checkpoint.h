/* engine/train/train_checkpoint.h - training checkpoints: the model in the serving layout (what
 * `shardlm serve` and `generate` load as they are: config.json, tokenizer files,
 * model.safetensors in the Hugging Face layout of the source model's family, in its dtype) plus
 * train_state.safetensors: the AdamW moments (and the f32 master weights when the model file
 * holds another dtype), laid out by the weights' table, with the iteration, the data cursor and
 * the seed in its metadata. Written atomically: into DIR.tmp, then renamed over DIR.
 * Not here: the loop (trainer.c), the formats' writers (engine/formats/checkpoint_write.c).
 * Tests: tests/test_train.sh (bitwise resume; the result served). */
#ifndef SHARDLM_TRAIN_CHECKPOINT_H
#define SHARDLM_TRAIN_CHECKPOINT_H

#include <stdint.h>

#include "data.h"
#include "lora.h"
#include "loss_scaler.h"
#include "model.h"
#include "optimizer.h"
#include "params.h"

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
 * values when the model file cannot hold them exactly). */
enum status train_checkpoint_save(const char *dir, struct model *m, struct model_weights *master,
                                  const struct param_table *params, struct optimizer *opt,
                                  const struct train_state *st);

/* The same for LoRA training: the adapter in the PEFT layout (adapter_config.json naming
 * base_model, adapter_model.safetensors) instead of the model, plus the training state. */
enum status train_checkpoint_save_adapter(const char *dir, struct model *m, const struct lora *lora,
                                          const char *base_model, const struct param_table *params,
                                          struct optimizer *opt, const struct train_state *st);

/* Writes m's weights as a checkpoint in the serving layout of its family (shardlm merge-lora). */
enum status train_checkpoint_write_model(const char *dir, struct model *m);

/* Reads dir/train_state.safetensors into opt and *st for the trained parameters `params`
 * (loaded from dir: the f32 values, when stored, replace them). Errors: a missing or foreign
 * state file, a tensor whose shape differs from the parameter's. */
enum status train_checkpoint_load_state(const char *dir, struct backend *b, const struct param_table *params,
                                        struct optimizer *opt, struct train_state *st);

#endif
