/* engine/train/loss_scaler.c - the fp16 loss scaler (loss_scaler.h).
 * Tests: tests/test_train_data.c. */
#include "loss_scaler.h"

struct loss_scaler loss_scaler_dynamic(double initial, double min_scale, int window, int hysteresis)
{
    return (struct loss_scaler){.scale = initial, .min_scale = min_scale, .growth = 2.0, .backoff = 0.5,
                                .window = window, .hysteresis = hysteresis, .dynamic = 1,
                                .hysteresis_left = hysteresis};
}

struct loss_scaler loss_scaler_constant(double scale)
{
    return (struct loss_scaler){.scale = scale, .min_scale = scale, .growth = 1.0, .backoff = 1.0,
                                .window = 1, .hysteresis = 1, .dynamic = 0, .hysteresis_left = 1};
}

int loss_scaler_update(struct loss_scaler *s, int found_inf)
{
    if (found_inf) {
        s->skipped++;
        if (!s->dynamic) return 1;
        s->growth_tracker = 0;
        if (--s->hysteresis_left <= 0) {
            s->scale *= s->backoff;
            if (s->scale < s->min_scale) s->scale = s->min_scale;
        }
        return 1;
    }
    if (!s->dynamic) return 0;
    if (++s->growth_tracker == s->window) {
        s->growth_tracker = 0;
        s->hysteresis_left = s->hysteresis;
        s->scale *= s->growth;
    }
    return 0;
}
