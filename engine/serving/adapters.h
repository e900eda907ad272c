/* engine/serving/adapters.h - the LoRA adapters a conductor serves without merging
 * (engine_options.adapters, `shardlm serve --lora NAME=DIR`): loaded for this rank's layers,
 * found by name for each request, and keyed for the prefix cache.
 * Not here: the low-rank products (engine/model/lora.c, applied per run of rows by model.c), the
 * batch grouped by adapter (scheduler.c).
 * Tests: tests/server/test_lora_serving.py (server_lora). */
#ifndef SHARDLM_ADAPTERS_H
#define SHARDLM_ADAPTERS_H

#include <stdint.h>

#include "lora.h"

struct adapter_set {
    struct lora       **lora;  /* (n) */
    const char *const  *names; /* (n) borrowed from the options */
    int                 n;
};

/* Loads every adapter for m (tp 1, f32 compute only: STATUS_UNSUPPORTED otherwise) and lends the
 * list to m (m->adapters, m->max_adapter_rank). A name given twice is STATUS_INVALID_ARGUMENT;
 * a bad adapter file fails with lora_load_peft's message. s is freeable on error. */
enum status adapter_set_load(struct adapter_set *s, struct model *m, const char *const *names,
                             const char *const *dirs, int n);
void        adapter_set_free(struct adapter_set *s, struct backend *b); /* accepts a zeroed set */
/* The index of the adapter a request names: -1 for the base (NULL or ""), NOT_FOUND otherwise. */
enum status adapter_set_find(const struct adapter_set *s, const char *name, int *index);
/* The prefix-cache key of adapter `index`: 0 for the base (-1), else distinct per index, so that
 * KV computed under one adapter never serves another. */
uint64_t    adapter_key(int index);

#endif
