/* kernels/cpu/kv_write.c - op_kv_write on the CPU: scatter new tokens' K/V rows into their
 * paged-cache slots.
 * Tests: tests/test_ops.c (kv_write and attention cases). */
#include <string.h>

#include "cpu_ops.h"

void cpu_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                  const struct tensor *k, const struct tensor *v, const struct tensor *slots)
{
    (void)b;
    int64_t n = tensor_numel(slots);
    int64_t n_slots = k_cache->shape[0] * k_cache->shape[1];
    size_t row = (size_t)(k_cache->shape[2] * k_cache->shape[3]) * dtype_size(k->dtype);
    const int32_t *slot = slots->data;
    for (int64_t t = 0; t < n; t++) {
        if (slot[t] < 0) continue;
        CHECK(slot[t] < n_slots, "kv_write: slot %d outside the cache (%lld slots)", slot[t],
              (long long)n_slots);
        memcpy((char *)k_cache->data + (size_t)slot[t] * row, (const char *)k->data + (size_t)t * row, row);
        memcpy((char *)v_cache->data + (size_t)slot[t] * row, (const char *)v->data + (size_t)t * row, row);
    }
}
