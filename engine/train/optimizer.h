/* engine/train/optimizer.h - AdamW over a table of parameters (params.h): the moments are f32
 * tensors made like the parameters from one allocation, decoupled weight decay where the table
 * says (matrices, not biases and norms: Megatron's default), clipping by the global gradient
 * norm, and the learning rate schedule (linear warm-up, then cosine, linear or constant decay
 * to min_lr).
 * Not here: the loss scaler of fp16 training (loss_scaler.h), the loop (trainer.c).
 * Tests: tests/test_train_step.py (steps against optax.adamw), tests/test_train_data.c
 * (the schedule). */
#ifndef SHARDLM_TRAIN_OPTIMIZER_H
#define SHARDLM_TRAIN_OPTIMIZER_H

#include <stdint.h>

#include "params.h"

enum lr_decay_style { LR_DECAY_CONSTANT, LR_DECAY_LINEAR, LR_DECAY_COSINE };

struct optimizer_options {
    double lr, min_lr;
    int64_t warmup_iters;      /* linear warm-up from 0 over these iterations */
    int64_t decay_iters;       /* decay from lr to min_lr ends here (usually --train-iters) */
    enum lr_decay_style decay_style;
    double weight_decay, beta1, beta2, eps;
    double clip_grad;          /* clip by global norm; 0 = off */
};

struct optimizer {
    struct optimizer_options o;
    size_t n;                  /* rows of the parameter table it was made for */
    struct tensor *m, *v;      /* (n) f32 moments, like the parameters */
    void *mem;                 /* one device allocation behind m and v */
    int64_t step;              /* AdamW steps taken */
    struct tensor norm_acc;    /* f32 (1) on the device: sum of squares */
    /* Across ranks: the sum of squares of this rank's counted gradients in, the whole model's
     * out (the trainer's all-reduce over tp, pp and, with a distributed optimizer, dp); NULL on
     * one rank. A NaN stays NaN. */
    double (*reduce_sumsq)(void *ctx, double local);
    void *reduce_ctx;
};

/* The learning rate after `it` updates (0-based): Megatron's OptimizerParamScheduler, warm-up
 * (lr * (it + 1) / warmup_iters) then decay over [warmup_iters, decay_iters] to min_lr. */
double optimizer_lr(const struct optimizer_options *o, int64_t it);

/* Allocates zeroed moments like the parameters of params. */
enum status optimizer_init(struct optimizer *opt, struct backend *b, const struct param_table *params,
                           const struct optimizer_options *o);
void optimizer_free(struct optimizer *opt, struct backend *b);

/* The global L2 norm of the gradient table (f32; the rows marked counted, summed over ranks by
 * reduce_sumsq), as a double on the host; Inf or NaN when any gradient is (the overflow
 * check). */
double optimizer_grad_norm(struct optimizer *opt, struct backend *b, const struct param_table *grads);

/* One AdamW step of params from grads (row for row) at learning rate lr, grads first multiplied
 * by unscale (1 / loss scale) and by the clipping factor min(1, clip_grad / (grad_norm + 1e-6)),
 * where grad_norm is the norm after unscaling. */
void optimizer_step(struct optimizer *opt, struct backend *b, const struct param_table *params,
                    const struct param_table *grads, double lr, double grad_norm, double unscale);

#endif
