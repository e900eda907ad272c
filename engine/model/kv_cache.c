/* engine/model/kv_cache.c - the paged KV block pool with reference counts and the prefix cache
 * (see kv_cache.h). */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

size_t kv_cache_block_bytes(int n_layers, int block_tokens, int n_kv_heads, int head_dim,
                            enum dtype dtype)
{
    return 2 * (size_t)n_layers * (size_t)block_tokens * (size_t)n_kv_heads * (size_t)head_dim *
           dtype_size(dtype);
}

enum status kv_cache_init(struct kv_cache *c, struct backend *b, int n_layers, int n_blocks,
                          int block_tokens, int n_kv_heads, int head_dim, enum dtype dtype)
{
    memset(c, 0, sizeof *c);
    if (n_layers <= 0 || n_blocks <= 0 || block_tokens <= 0 || n_kv_heads <= 0 || head_dim <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "kv_cache: sizes must be positive (layers %d, blocks %d, block_tokens %d)",
                             n_layers, n_blocks, block_tokens);
    c->b = b;
    c->n_layers = n_layers;
    c->n_blocks = n_blocks;
    c->block_tokens = block_tokens;
    c->n_kv_heads = n_kv_heads;
    c->head_dim = head_dim;
    c->dtype = dtype;
    c->table_size = 16;
    while (c->table_size < 2 * n_blocks) c->table_size *= 2;
    const size_t nb = (size_t)n_blocks;
    size_t per = nb * (size_t)block_tokens * (size_t)n_kv_heads * (size_t)head_dim * dtype_size(dtype);
    c->k = calloc((size_t)n_layers, sizeof *c->k);
    c->v = calloc((size_t)n_layers, sizeof *c->v);
    c->free_list = malloc(nb * sizeof *c->free_list);
    c->ref = calloc(nb, sizeof *c->ref);
    c->hash = calloc(nb, sizeof *c->hash);
    c->tokens = malloc(nb * (size_t)block_tokens * sizeof *c->tokens);
    c->lru_prev = malloc(nb * sizeof *c->lru_prev);
    c->lru_next = malloc(nb * sizeof *c->lru_next);
    c->table = malloc((size_t)c->table_size * sizeof *c->table);
    enum status st = STATUS_OK;
    if (!c->k || !c->v || !c->free_list || !c->ref || !c->hash || !c->tokens || !c->lru_prev ||
        !c->lru_next || !c->table) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "kv_cache: out of host memory for %d blocks", n_blocks);
        goto fail;
    }
    st = backend_alloc(b, 2 * per * (size_t)n_layers, &c->memory);
    if (st != STATUS_OK) goto fail;
    for (int l = 0; l < n_layers; l++) {
        c->k[l] = tensor_make((char *)c->memory + (2 * (size_t)l) * per, dtype, b->device, 4,
                              (int64_t)n_blocks, (int64_t)block_tokens, (int64_t)n_kv_heads,
                              (int64_t)head_dim);
        c->v[l] = c->k[l];
        c->v[l].data = (char *)c->memory + (2 * (size_t)l + 1) * per;
    }
    /* Lowest ids are handed out first, so small runs touch the start of the pool. */
    for (int i = 0; i < n_blocks; i++) c->free_list[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    c->lru_head = c->lru_tail = -1;
    for (int i = 0; i < c->table_size; i++) c->table[i] = -1;
    return STATUS_OK;
fail:
    kv_cache_free(c);
    return st;
}

void kv_cache_free(struct kv_cache *c)
{
    if (c->b) backend_free(c->b, c->memory);
    free(c->k);
    free(c->v);
    free(c->free_list);
    free(c->ref);
    free(c->hash);
    free(c->tokens);
    free(c->lru_prev);
    free(c->lru_next);
    free(c->table);
    free(c->features);
    memset(c, 0, sizeof *c);
}

enum status kv_cache_features_init(struct kv_cache *c, int width)
{
    free(c->features);
    c->features = calloc((size_t)c->n_blocks * (size_t)c->block_tokens * (size_t)width, sizeof *c->features);
    c->feature_width = c->features ? width : 0;
    if (!c->features)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "kv_cache: out of host memory for %d floats beside each of %d slots",
                             width, c->n_blocks * c->block_tokens);
    return STATUS_OK;
}

void kv_cache_write_features(struct kv_cache *c, const int32_t *slots, int n, const float *rows)
{
    const size_t w = (size_t)c->feature_width;
    for (int i = 0; i < n; i++) /* a negative slot skips its row, as op_kv_write does */
        if (slots[i] >= 0) memcpy(c->features + (size_t)slots[i] * w, rows + (size_t)i * w, w * sizeof *rows);
}

int kv_cache_available(const struct kv_cache *c) { return c->n_free + c->n_cached; }

/* ---- LRU of cached blocks ---------------------------------------------------------------- */

static void lru_push(struct kv_cache *c, int32_t b)
{
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_cached++;
}

static void lru_remove(struct kv_cache *c, int32_t b)
{
    if (c->lru_prev[b] >= 0) c->lru_next[c->lru_prev[b]] = c->lru_next[b];
    else c->lru_head = c->lru_next[b];
    if (c->lru_next[b] >= 0) c->lru_prev[c->lru_next[b]] = c->lru_prev[b];
    else c->lru_tail = c->lru_prev[b];
    c->n_cached--;
}

/* ---- hash table (linear probing, deletion by backward shift) ----------------------------- */

static int slot_of(const struct kv_cache *c, uint64_t h) { return (int)(h & (uint64_t)(c->table_size - 1)); }

static void table_insert(struct kv_cache *c, int32_t b)
{
    int i = slot_of(c, c->hash[b]);
    while (c->table[i] >= 0) i = (i + 1) & (c->table_size - 1);
    c->table[i] = b;
}

static void table_remove(struct kv_cache *c, int32_t b)
{
    int i = slot_of(c, c->hash[b]);
    while (c->table[i] != b) {
        CHECK(c->table[i] >= 0, "kv_cache: block %d missing from the hash table", b);
        i = (i + 1) & (c->table_size - 1);
    }
    /* Shift back later entries of the run whose home slot is at or before the hole. */
    int hole = i, j = i;
    for (;;) {
        j = (j + 1) & (c->table_size - 1);
        if (c->table[j] < 0) break;
        int home = slot_of(c, c->hash[c->table[j]]);
        int between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (between) continue;
        c->table[hole] = c->table[j];
        hole = j;
    }
    c->table[hole] = -1;
}

static int32_t table_find(const struct kv_cache *c, uint64_t h, const int32_t *tokens)
{
    for (int i = slot_of(c, h); c->table[i] >= 0; i = (i + 1) & (c->table_size - 1)) {
        int32_t b = c->table[i];
        if (c->hash[b] == h &&
            !memcmp(c->tokens + (size_t)b * (size_t)c->block_tokens, tokens,
                    (size_t)c->block_tokens * sizeof *tokens))
            return b;
    }
    return -1;
}

static void unregister(struct kv_cache *c, int32_t b)
{
    table_remove(c, b);
    c->hash[b] = 0;
}

/* ---- public ------------------------------------------------------------------------------ */

enum status kv_cache_alloc(struct kv_cache *c, int n, int32_t *table)
{
    CHECK(n >= 0, "kv_cache_alloc n %d", n);
    if (n > kv_cache_available(c))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "kv_cache: %d blocks wanted, %d available",
                             n, kv_cache_available(c));
    for (int i = 0; i < n; i++) {
        int32_t b;
        if (c->n_free > 0) {
            b = c->free_list[--c->n_free];
        } else { /* evict the least recently released cached block */
            b = c->lru_head;
            lru_remove(c, b);
            unregister(c, b);
        }
        CHECK(c->ref[b] == 0, "kv_cache: allocating block %d with ref %d", b, c->ref[b]);
        c->ref[b] = 1;
        table[i] = b;
    }
    return STATUS_OK;
}

void kv_cache_release(struct kv_cache *c, int n, const int32_t *table)
{
    for (int i = 0; i < n; i++) {
        int32_t b = table[i];
        CHECK(b >= 0 && b < c->n_blocks && c->ref[b] > 0, "kv_cache_release: block %d (pool %d, ref %d)",
              b, c->n_blocks, b >= 0 && b < c->n_blocks ? c->ref[b] : -1);
        if (--c->ref[b] > 0) continue;
        if (c->hash[b]) lru_push(c, b);
        else c->free_list[c->n_free++] = b;
    }
}

void kv_cache_retain(struct kv_cache *c, int32_t b)
{
    CHECK(b >= 0 && b < c->n_blocks && c->ref[b] > 0, "kv_cache_retain: block %d not held", b);
    c->ref[b]++;
}

uint64_t kv_cache_hash(uint64_t parent, const int32_t *tokens, int block_tokens)
{
    /* splitmix64-style mixing of the parent hash and each token. */
    uint64_t h = parent ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < block_tokens; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
        h ^= h >> 31;
    }
    return h ? h : 1;
}

int32_t kv_cache_lookup(struct kv_cache *c, uint64_t hash, const int32_t *tokens)
{
    int32_t b = table_find(c, hash, tokens);
    if (b < 0) return -1;
    if (c->ref[b] == 0) lru_remove(c, b);
    c->ref[b]++;
    return b;
}

void kv_cache_register(struct kv_cache *c, int32_t b, uint64_t hash, const int32_t *tokens)
{
    CHECK(b >= 0 && b < c->n_blocks && c->ref[b] > 0 && hash != 0, "kv_cache_register: block %d", b);
    if (c->hash[b] || table_find(c, hash, tokens) >= 0) return;
    c->hash[b] = hash;
    memcpy(c->tokens + (size_t)b * (size_t)c->block_tokens, tokens,
           (size_t)c->block_tokens * sizeof *tokens);
    table_insert(c, b);
}

void kv_cache_copy_block(struct kv_cache *c, int32_t dst, int32_t src)
{
    size_t bytes = (size_t)c->block_tokens * (size_t)c->n_kv_heads * (size_t)c->head_dim * dtype_size(c->dtype);
    for (int l = 0; l < c->n_layers; l++) {
        backend_copy(c->b, (char *)c->k[l].data + (size_t)dst * bytes, (char *)c->k[l].data + (size_t)src * bytes, bytes);
        backend_copy(c->b, (char *)c->v[l].data + (size_t)dst * bytes, (char *)c->v[l].data + (size_t)src * bytes, bytes);
    }
    if (c->features) {
        const size_t w = (size_t)c->block_tokens * (size_t)c->feature_width;
        memcpy(c->features + (size_t)dst * w, c->features + (size_t)src * w, w * sizeof *c->features);
    }
}
