/* engine/kv_cache.h - the paged KV cache: a fixed pool of blocks on the backend's device, one
 * K and one V tensor per local layer, and a free list of block ids.
 * Not here: which sequences run (the scheduler) or how attention reads blocks (op_attention).
 * Tests: tests/test_model.c (generation through the cache). */
#ifndef SHARDLM_KV_CACHE_H
#define SHARDLM_KV_CACHE_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kv_cache {
    struct backend *b;           /* borrowed */
    int             n_layers;    /* local layers (this pipeline stage) */
    int             block_tokens;
    int             n_blocks;    /* pool size, fixed at init */
    int             n_kv_heads;  /* local KV heads (this tensor shard) */
    int             head_dim;
    enum dtype      dtype;
    struct tensor  *k, *v;       /* (n_layers) tensors, each (n_blocks, block_tokens, n_kv_heads, head_dim) */
    void           *memory;      /* one device allocation holding every k and v */
    int32_t        *free_list;   /* (n_blocks) */
    int             n_free;
};

/* Bytes one block takes across all local layers (K and V). */
size_t kv_cache_block_bytes(int n_layers, int block_tokens, int n_kv_heads, int head_dim,
                            enum dtype dtype);

/* Allocates the pool: n_blocks blocks of block_tokens tokens. Returns
 * STATUS_RESOURCE_EXHAUSTED when the device cannot hold it, STATUS_INVALID_ARGUMENT for
 * non-positive sizes. Borrows b for the cache's lifetime. */
enum status kv_cache_init(struct kv_cache *c, struct backend *b, int n_layers, int n_blocks,
                          int block_tokens, int n_kv_heads, int head_dim, enum dtype dtype);
void kv_cache_free(struct kv_cache *c); /* accepts a zeroed struct */

/* Takes n blocks from the pool into table[0..n). Returns STATUS_RESOURCE_EXHAUSTED and takes
 * nothing when fewer than n are free: the caller preempts or waits. */
enum status kv_cache_alloc(struct kv_cache *c, int n, int32_t *table);
/* Returns n blocks to the pool. */
void kv_cache_release(struct kv_cache *c, int n, const int32_t *table);

#ifdef __cplusplus
}
#endif

#endif
