/* kernels/cuda/kv_write.cu - op_kv_write: scatters the K and V rows of new tokens into their
 * paged-cache slots (slot = block * block_tokens + offset, a row index into the cache seen as
 * (n_blocks * block_tokens, n_kv_heads * head_dim)); a negative slot skips its token.
 * Not here: reading the cache (attention.cu), choosing slots (engine/model/kv_cache.c).
 * Tests: tests/test_ops.c --backend cuda (kv_write and attention cases, padding slots). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

/* Rows are copied as stored (same dtype): a move, not arithmetic. */
template <typename T>
static __global__ void kv_write_kernel(T *k_cache, T *v_cache, const T *k, const T *v,
                                       const int32_t *slots, int64_t n, int64_t row,
                                       int64_t n_slots)
{
    int64_t total = n * row;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / row, j = i % row;
        int64_t slot = slots[t];
        if (slot < 0) continue;
        DEVICE_CHECK(slot < n_slots);
        k_cache[slot * row + j] = k[i];
        v_cache[slot * row + j] = v[i];
    }
}

/* k_cache, v_cache (n_blocks, block_tokens, n_kv_heads, head_dim); k, v (n, n_kv_heads,
 * head_dim); slots i32 (n). Two tokens with the same slot race (the CPU keeps the last one):
 * the engine never gives one slot twice in a call. */
void cuda_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                   const struct tensor *k, const struct tensor *v, const struct tensor *slots)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(slots), row = k_cache->shape[2] * k_cache->shape[3];
    int64_t n_slots = k_cache->shape[0] * k_cache->shape[1];
    if (n == 0 || row == 0) return;
    CUDA_DISPATCH_FLOAT(k->dtype, T,
        kv_write_kernel<T><<<cuda_blocks_for(n * row, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)k_cache->data, (T *)v_cache->data, (const T *)k->data, (const T *)v->data,
            (const int32_t *)slots->data, n, row, n_slots);
        LAUNCH_CHECK());
}
