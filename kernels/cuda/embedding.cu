/* kernels/cuda/embedding.cu - op_embedding: the masked row lookup of a vocab-parallel
 * embedding shard (rows outside the shard give zeros).
 * Not here: learned position embeddings (position_embedding_add.cu).
 * Tests: tests/test_ops.c --backend cuda (ids inside and outside the shard, vocab_start > 0). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

/* Rows are copied as stored (same dtype, no rounding): a lookup, not arithmetic. */
template <typename T>
static __global__ void embedding_kernel(T *out, const T *table, const int32_t *ids, int64_t n,
                                        int64_t d, int64_t vocab_start, int64_t vocab_local)
{
    int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / d, col = i % d;
        int64_t r = (int64_t)ids[row] - vocab_start;
        if (r >= 0 && r < vocab_local) out[i] = table[r * d + col];
        else cuda_store(out + i, 0.0f);
    }
}

/* out (n, d) = table (vocab_local, d) [ids (n) - vocab_start], zeros outside the shard. */
void cuda_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                    const struct tensor *ids, int64_t vocab_start)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(ids), d = table->shape[1], vocab_local = table->shape[0];
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        embedding_kernel<T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)table->data, (const int32_t *)ids->data, n, d, vocab_start,
            vocab_local);
        LAUNCH_CHECK());
}
