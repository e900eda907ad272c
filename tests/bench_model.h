/* tests/bench_model.h - what the training benchmarks share: a Llama checkpoint of a given shape
 * with random weights (the stories110M shape in bench_train and bench_train_parallel), and the
 * process's resident memory. */
#ifndef SHARDLM_BENCH_MODEL_H
#define SHARDLM_BENCH_MODEL_H

#include "base.h"

/* Peak (VmHWM) and current (VmRSS) resident memory of this process, KiB; -1 when unknown. */
long vm_hwm_kib(void);
long vm_rss_kib(void);
/* Resets VmHWM to the current RSS (Linux clear_refs 5); 0 on success. */
int vm_hwm_reset(void);

/* A deterministic uniform value in [-0.5, 0.5). */
float bench_rnd(void);

/* Writes config.json and model.safetensors of an untied Llama (MHA) with random f32 weights. */
enum status write_model(const char *dir, int d, int layers, int heads, int ffn, int vocab, int ctx);

#endif
