/* engine/model/device_sampling.h - the device's share of sampling for model_forward
 * (forward_batch.greedy_ids / top_k): a step's edits and masks, then the argmax or the top
 * candidates with their masses, draws and normalisers; its inputs go up in one copy and its
 * outputs come down in one. Private to engine/model/.
 * Tests: tests/test_step_graph.c; tests/server/test_device_sampling.py. */
#ifndef SHARDLM_DEVICE_SAMPLING_H
#define SHARDLM_DEVICE_SAMPLING_H

#include "model.h"

/* The bytes ws.sample_out needs for steps of at most max_logits rows and top_k candidates
 * (model_reserve). */
size_t device_sampling_out_bytes(int64_t max_logits, int top_k);
/* fb's sampling on the step's logits full (the last stage's, the whole vocabulary): returns 1 when
 * done (fb's outputs written, *fb->greedy_done = 1), 0 when a logit is not finite (the caller
 * downloads the rows, unedited), -1 when the inputs found no memory (device or host). With edits
 * or masks, *full may then name the f32 copy they were made in (ws.logits_edited). */
int  device_sampling_run(struct model *m, const struct forward_batch *fb, struct tensor *full);
void device_sampling_free(struct model *m); /* the inputs' buffer and the host image */

#endif
