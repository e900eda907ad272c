/* engine/kv_cache.c - the paged KV block pool (see kv_cache.h). */
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
    size_t per = (size_t)n_blocks * (size_t)block_tokens * (size_t)n_kv_heads * (size_t)head_dim *
                 dtype_size(dtype);
    c->k = calloc((size_t)n_layers, sizeof *c->k);
    c->v = calloc((size_t)n_layers, sizeof *c->v);
    c->free_list = malloc((size_t)n_blocks * sizeof *c->free_list);
    enum status st = STATUS_OK;
    if (!c->k || !c->v || !c->free_list) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "kv_cache: out of host memory");
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
    memset(c, 0, sizeof *c);
}

enum status kv_cache_alloc(struct kv_cache *c, int n, int32_t *table)
{
    CHECK(n >= 0, "kv_cache_alloc n %d", n);
    if (n > c->n_free)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "kv_cache: %d blocks wanted, %d free", n,
                             c->n_free);
    for (int i = 0; i < n; i++) table[i] = c->free_list[--c->n_free];
    return STATUS_OK;
}

void kv_cache_release(struct kv_cache *c, int n, const int32_t *table)
{
    for (int i = 0; i < n; i++) {
        CHECK(table[i] >= 0 && table[i] < c->n_blocks && c->n_free < c->n_blocks,
              "kv_cache_release: block %d (pool %d, free %d)", table[i], c->n_blocks, c->n_free);
        c->free_list[c->n_free++] = table[i];
    }
}
