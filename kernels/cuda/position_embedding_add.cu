/* kernels/cuda/position_embedding_add.cu - op_position_embedding_add: x += the learned
 * absolute position embedding of each row (GPT-2), in place.
 * Its backward, dtable[positions] += dx, is embedding.cu's scatter-add with every position
 * checked on the device.
 * Not here: rotary embeddings (rope.cu), token embeddings (embedding.cu).
 * Tests: tests/test_ops.c --backend cuda; tests/test_ops_backward.c --backend cuda. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void position_embedding_add_kernel(T *x, const T *table,
                                                     const int32_t *positions, int64_t n,
                                                     int64_t d, int64_t max_positions)
{
    int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / d, col = i % d;
        int64_t p = positions[row];
        DEVICE_CHECK(p >= 0 && p < max_positions);
        cuda_store(x + i, cuda_load(x + i) + cuda_load(table + p * d + col));
    }
}

/* x (n, d) += table (max_positions, d) [positions (n)]. */
void cuda_position_embedding_add(struct backend *b, const struct tensor *x,
                                 const struct tensor *table, const struct tensor *positions)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(positions), d = table->shape[1];
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        position_embedding_add_kernel<T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0,
                                           s->stream>>>(
            (T *)x->data, (const T *)table->data, (const int32_t *)positions->data, n, d,
            table->shape[0]);
        LAUNCH_CHECK());
}

/* dtable (max_positions, d)[positions (n)] += dx (n, d). */
void cuda_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                          const struct tensor *dx, const struct tensor *positions)
{
    cuda_scatter_add_rows(b, dtable, dx, (const int32_t *)positions->data, 0, 1);
}
