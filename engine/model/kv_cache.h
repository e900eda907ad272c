/* engine/model/kv_cache.h - the paged KV cache: a fixed pool of blocks on the backend's device, one
 * K and one V tensor per local layer, reference counts, and the prefix cache.
 *
 * A block is in one of three states: free (on the free list), in use (ref > 0), or cached
 * (ref == 0 but its contents are registered under a prefix hash and may be reused; cached
 * blocks are evicted least-recently-released first, only when the free list cannot serve an
 * allocation). A full block's prefix hash covers every token from the start of the sequence
 * to the end of the block, so equal hashes mean equal K/V; the tokens are also stored and
 * compared, so a 64-bit collision can never hand out wrong K/V.
 * Not here: which sequences run (engine.c) or how attention reads blocks (op_attention).
 * Tests: tests/test_engine.c (prefix cache, copy-on-write, preemption, pool accounting). */
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
    /* Host-side bookkeeping, (n_blocks) each. */
    int32_t        *ref;         /* holders of each block */
    uint64_t       *hash;        /* prefix hash of a registered full block; 0 = none */
    int32_t        *tokens;      /* (n_blocks, block_tokens) tokens of registered blocks */
    int32_t        *lru_prev, *lru_next; /* cached (ref 0, registered) blocks, oldest first */
    int32_t         lru_head, lru_tail;
    int             n_cached;
    int32_t        *table;       /* (table_size) open-addressing hash table of block ids, -1 empty */
    int             table_size;  /* a power of two >= 2 n_blocks */
    /* Optional host rows beside every slot (kv_cache_features_init; EAGLE's features: the target's
     * final hidden state of the token whose K/V the slot holds), (n_blocks * block_tokens,
     * feature_width) f32, written with the slot (kv_cache_write_features) and copied with its
     * block, so they are valid wherever the slot's K/V are (a prefix-cache hit, a fork's copy).
     * NULL = none. */
    float          *features;
    int             feature_width;
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
/* Adds the host rows of width floats beside every slot (struct kv_cache.features), zeroed.
 * STATUS_RESOURCE_EXHAUSTED when the host cannot hold them. */
enum status kv_cache_features_init(struct kv_cache *c, int width);
/* Writes rows[i] (n rows of feature_width floats) beside slot slots[i] (block * block_tokens +
 * offset, as struct forward_batch.slots; a negative slot skips its row, as op_kv_write). */
void kv_cache_write_features(struct kv_cache *c, const int32_t *slots, int n, const float *rows);
/* The row beside slot (block * block_tokens + offset). */
static inline const float *kv_cache_feature(const struct kv_cache *c, int64_t slot)
{
    return c->features + slot * c->feature_width;
}

/* Blocks an allocation can get now: free plus cached (evictable). */
int kv_cache_available(const struct kv_cache *c);

/* Takes n blocks into table[0..n), each with ref 1, from the free list first, then by
 * evicting cached blocks oldest first. Returns STATUS_RESOURCE_EXHAUSTED and takes nothing
 * when fewer than n are available: the caller preempts or waits. */
enum status kv_cache_alloc(struct kv_cache *c, int n, int32_t *table);
/* Drops one reference from each of n blocks. A block whose last reference goes becomes cached
 * when it is registered, free otherwise. */
void kv_cache_release(struct kv_cache *c, int n, const int32_t *table);
/* Adds a reference to a block already held (sharing it with another sequence). */
void kv_cache_retain(struct kv_cache *c, int32_t block);

/* The prefix hash of a block of block_tokens tokens that follows a prefix with hash parent
 * (0 for the first block). Never returns 0. */
uint64_t kv_cache_hash(uint64_t parent, const int32_t *tokens, int block_tokens);
/* Looks up a registered block with this hash and these tokens; on a hit takes a reference
 * and returns its id, otherwise returns -1. */
int32_t kv_cache_lookup(struct kv_cache *c, uint64_t hash, const int32_t *tokens);
/* Registers a full block (held by the caller) under hash, so that later requests with the
 * same prefix reuse it. Does nothing when the hash is already registered. */
void kv_cache_register(struct kv_cache *c, int32_t block, uint64_t hash, const int32_t *tokens);
/* Copies the K/V contents of block src to block dst on every local layer (copy-on-write). */
void kv_cache_copy_block(struct kv_cache *c, int32_t dst, int32_t src);

#ifdef __cplusplus
}
#endif

#endif
