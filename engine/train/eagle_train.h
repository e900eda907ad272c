/* engine/train/eagle_train.h - `shardlm train --eagle-head`: an EAGLE-1 draft head (Li et al.
 * 2024; eagle_head.h) trained for a frozen model from that model's own hidden states, written
 * as the file `shardlm serve --speculative eagle --draft-model` loads.
 *
 * A micro-batch of packed documents runs through the frozen model (its training forward, up to
 * the final norm: the features f); the head's row p (a position p > 0 of its document) reads
 * x_p = embed(t_p) W_e^T + f_{p-1} W_f^T + b, its one layer, and the model's own LM head
 * (frozen), and its loss is the cross-entropy against the data's next token t_{p+1} where the
 * data carry a target (EAGLE-3's token loss; the data are best the model's own answers,
 * tools/distill_data.py), plus, when asked, EAGLE-1's regression of the head's output on the
 * model's own row (eagle_trainer_set_feature_loss). Gradients reach the layer and the fc only; AdamW as the trainer's.
 * With a token map the head's logits cover the map's tokens only (the rest carry no loss).
 * The head starts as the probe's (tools/eagle_probe.py): the model's last layer where its shapes
 * match, its output projections damped x 0.05, the fc the identity on the feature half.
 *
 * One rank, f32 (the CPU, or one GPU): refused by name otherwise. Checkpoints every
 * --save-interval iterations (OUT/checkpoints/iter_N, --keep-checkpoints), on a stop signal, and
 * at the end (OUT); --resume continues one bit for bit.
 * Here: the trainer (eagle_train.c) and the command (eagle_run.c). Not here: the model's own
 * training (trainer.c), serving the head (engine/serving/draft.c).
 * Tests: tests/test_train_eagle.py (steps against JAX + optax; the head served). */
#ifndef SHARDLM_EAGLE_TRAIN_H
#define SHARDLM_EAGLE_TRAIN_H

#include "model_train.h"
#include "optimizer.h"
#include "params.h"
#include "trainer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct eagle_trainer;

/* The head's file in an --out or checkpoint directory. */
#define EAGLE_HEAD_FILE "eagle_head.safetensors"

/* A head of ffn MLP rows (0: the target's ffn_hidden) for target (one rank, f32, borrowed:
 * it must outlive the trainer), micro-batches of at most max_tokens rows, AdamW per o (its lr
 * is each step's), random weights (where the target's last layer does not fit) drawn from seed.
 * map (n_map ascending ids, draft_token_map_read; NULL: the whole vocabulary): the head's
 * logits cover those tokens only, the LM head's rows cut to them as serving with
 * --spec-token-map cuts them (a rare token's row then costs nothing: Gemma's 262,144 rows).
 * STATUS_UNSUPPORTED for a target that cannot carry a head or is sharded / not f32. */
enum status eagle_trainer_new(struct model *target, int ffn, int max_tokens, const struct optimizer_options *o,
                              uint64_t seed, const int32_t *map, int n_map, struct eagle_trainer **out);
void eagle_trainer_free(struct eagle_trainer *e);

/* The head's targets of a data micro-batch: tb's targets as rows of the head's logits (their
 * index in the token map; -1, no loss, for a token outside it), -1 at each document's first row
 * (no feature before it). Returns how many are >= 0. out has tb->n_tokens entries. */
int eagle_head_targets(const struct eagle_trainer *e, const struct train_batch *tb, int32_t *out);

/* EAGLE-1's feature regression beside the token loss (0, the default: none): each row with a
 * target also costs weight x the mean over d_model of smooth-L1(h_p - f_p) (beta 1) between the
 * head's output h_p and the frozen model's own row f_p, so that the head's output can stand in
 * for the model's features when a chain drafts from it. tools/eagle_probe.py's loss,
 * smooth-L1 + 0.1 x cross-entropy, is this at weight 10 (scaled by 10). */
void eagle_trainer_set_feature_loss(struct eagle_trainer *e, float weight);

/* EAGLE-1's noise on the features in training (0, the default: none): each feature row f the
 * head reads in a training micro-batch (backward set) becomes f + amount x rms(f) x u, u
 * uniform in [-1, 1) per element, drawn from (seed, the trainer's count of noisy micro-batches
 * since this call, the row in the micro-batch, the column) by a splitmix64 finalizer (noise_u in
 * eagle_train.c), so that a run is repeatable and a test can draw the same; the regression's
 * target stays the clean row. Serving drafts from the head's own outputs, which are never the
 * model's rows exactly: the noise trains the head to read rows a little off. */
void eagle_trainer_set_feature_noise(struct eagle_trainer *e, float amount, uint64_t seed);

/* A second, unrolled pass in training (0, the default: none; after EAGLE-3's training-time test,
 * simplified): after the first pass and its backward, the head runs again on the same micro-batch
 * with row p reading the first pass's output row p - 1 (taken as given: no gradient flows through
 * it) in place of the model's row, against the same targets and, with the feature loss, the same
 * rows; its loss joins the first's and its gradients accumulate. Served, a chain's second and later
 * drafts read the head's own outputs: this pass trains the head for them. Unlike EAGLE-3's, every
 * row of the second pass reads the head's own output (its attention sees those rows too, not the
 * model's). Held-out losses (backward 0) stay the first pass's. Turning it on allocates the first
 * pass's rows (max_tokens x d floats on the host): STATUS_RESOURCE_EXHAUSTED when that fails. */
enum status eagle_trainer_set_unroll(struct eagle_trainer *e, int on);

/* The features alone: the frozen model's rows after its final norm for tb, (n_tokens, d_model) f32
 * host rows into out, as eagle_trainer_micro computes them (a resumed run refills its cache with
 * them). */
enum status eagle_trainer_features(struct eagle_trainer *e, const struct train_batch *tb, float *out);

/* Zeroes the gradients (a step begins). */
void eagle_trainer_zero_grads(struct eagle_trainer *e);
/* One micro-batch: the features, the head's forward (loss summed into *loss_sum over *n_real
 * rows) and, when backward, its backward: the gradients += grad_scale x d(loss sum). targets
 * from eagle_head_targets(tb). The features are the frozen model's rows after its final norm,
 * (n_tokens, d_model) f32 host rows: given in hidden (its forward skipped; NULL: run), and, when
 * hidden_out is not NULL, the rows the forward computed copied there (a caller's cache: a
 * document's rows depend on that document alone). */
enum status eagle_trainer_micro(struct eagle_trainer *e, const struct train_batch *tb, const int32_t *targets,
                                float grad_scale, int backward, const float *hidden, float *hidden_out,
                                double *loss_sum, int *n_real);
/* Clips by the global norm and takes one AdamW step at lr; returns the norm before clipping. */
double eagle_trainer_step(struct eagle_trainer *e, double lr);

/* What trains, in a fixed order: the layer's weights named as weights.h's table ("q/L", ...)
 * and "fc_emb", "fc_feat", "fc_bias"; and their gradients, row for row. */
const struct param_table *eagle_trainer_params(const struct eagle_trainer *e);

/* Replaces the head's weights with those of an open EAGLE-1 head file (path: how messages name
 * it, e.g. "--eagle-init FILE") of the same shapes (as eagle_trainer_save writes them, or
 * tools/eagle_probe.py export): a head continued on more data (--eagle-init) or a run resumed.
 * STATUS_INVALID_ARGUMENT naming a missing or mis-shaped tensor. */
struct safetensors;
enum status eagle_trainer_load(struct eagle_trainer *e, const struct safetensors *sf, const char *path);

/* Writes the head: EAGLE's tensor names (fc.weight (d, 2d) = [W_e | W_f], fc.bias,
 * layers.0.self_attn.*, layers.0.post_attention_layernorm.weight, layers.0.mlp.*), f32, with
 * metadata rope_style and the target's architecture. */
enum status eagle_trainer_save(struct eagle_trainer *e, const char *path);

/* Where a run is: iterations done and the data's cursor (its seed the run's, which also seeds
 * the features' noise). */
struct eagle_progress {
    int64_t iteration;
    struct data_cursor cursor;
};
/* A checkpoint, written into DIR.tmp and then made dir (train_checkpoint_write_dir):
 * dir/eagle_head.safetensors (as eagle_trainer_save, with metadata "iteration") and
 * dir/train_state.safetensors (TRAIN_STATE_FORMAT, metadata "trained": "eagle_head"): AdamW's
 * moments ("exp_avg/<name>", "exp_avg_sq/<name>" for each row of eagle_trainer_params) and step,
 * p, and the noise's count. */
enum status eagle_trainer_save_checkpoint(struct eagle_trainer *e, const char *dir, const struct eagle_progress *p);
/* Reads such a checkpoint into a trainer of the same shapes (--resume): the head, the moments,
 * the step and the noise's stream; *p where the run was. STATUS_BAD_FORMAT naming what is wrong
 * (a missing or mis-sized tensor, not an EAGLE head's state, a head of another iteration). */
enum status eagle_trainer_load_checkpoint(struct eagle_trainer *e, const char *dir, struct eagle_progress *p);
/* The settings a checkpoint's run trained with (recorded in its training state as metadata
 * eagle_feature_loss, eagle_feature_noise, eagle_unroll): --resume continues with them, refusing
 * a different value given on the command line (eagle_run.c). *found 0 for a checkpoint written
 * before they were recorded; STATUS_BAD_FORMAT for a value that is not a number, or some missing. */
struct eagle_settings {
    float feature_loss, feature_noise;
    int unroll;
};
enum status eagle_checkpoint_settings(const char *dir, struct eagle_settings *s, int *found);

/* The command: o->model_dir's model frozen, o->data, the schedule and AdamW of o, the token
 * map o->eagle_token_map (or none), the head written to o->out_dir/eagle_head.safetensors with
 * its state and o->out_dir/metrics.jsonl; o->resume_dir (resolved: a checkpoint directory)
 * continues a run. */
enum status eagle_train_run(const struct train_options *o);

#ifdef __cplusplus
}
#endif

#endif
