/* engine/train/loss_scaler.h - the loss scaler of fp16 training, as Megatron's
 * DynamicGradScaler: the loss (so every gradient) is multiplied by `scale` before the backward,
 * so that small fp16 activation gradients do not flush to zero; a step whose gradients hold an
 * Inf or NaN is skipped; after `hysteresis` such steps (not necessarily consecutive) the scale
 * is multiplied by backoff (0.5), never below min_scale; after `window` clean steps in a row it
 * is multiplied by growth (2) and the hysteresis is restored. A constant scaler (--loss-scale)
 * skips overflowing steps and never changes its scale.
 * Not here: applying the scale (trainer.c multiplies the loss's gradient by it and AdamW's
 * grad_scale divides it out). Tests: tests/test_train_data.c, tests/test_train.sh (--fp16). */
#ifndef SHARDLM_LOSS_SCALER_H
#define SHARDLM_LOSS_SCALER_H

#include <stdint.h>

struct loss_scaler {
    double  scale;
    double  min_scale, growth, backoff;
    int     window, hysteresis;
    int     dynamic;           /* 0: a constant scale */
    /* state (part of the training checkpoint) */
    int     growth_tracker;    /* clean steps since the last change */
    int     hysteresis_left;
    int64_t skipped;           /* steps skipped for an overflow, in all */
};

/* Megatron's defaults: initial 2^32, minimum 1, window 1000, hysteresis 2, x2 / x0.5. */
struct loss_scaler loss_scaler_dynamic(double initial, double min_scale, int window, int hysteresis);
struct loss_scaler loss_scaler_constant(double scale);

/* Records the outcome of a step (found_inf: its gradients were not finite, so the step is
 * skipped) and updates the scale. Returns 1 when the step must be skipped. */
int loss_scaler_update(struct loss_scaler *s, int found_inf);

#endif
