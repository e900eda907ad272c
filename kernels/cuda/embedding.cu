/* kernels/cuda/embedding.cu - op_embedding: the masked row lookup of a vocab-parallel
 * embedding shard (rows outside the shard give zeros), from a float table or a block-quantized
 * one (DTYPE_Q*: the looked-up rows dequantized, bit-exact with quant_dequantize_row); its
 * backward, the masked scatter-add (with atomics: the order in which repeated ids add up is not
 * fixed), shared with position_embedding_add.cu.
 * Not here: learned position embeddings (position_embedding_add.cu); the block formats
 * (quant_blocks.cuh).
 * Tests: tests/test_ops.c --backend cuda (ids inside and outside the shard, vocab_start > 0);
 * tests/test_ops_quant.c --backend cuda (block tables, every type; never run on a GPU yet);
 * tests/test_ops_backward.c --backend cuda (embedding_backward). */
#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "quant_blocks.cuh"

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
    if (dtype_is_quant(table->dtype)) {
        cuda_embedding_quant(b, out, table, ids, vocab_start);
        return;
    }
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(ids), d = table->shape[1], vocab_local = table->shape[0];
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        embedding_kernel<T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)table->data, (const int32_t *)ids->data, n, d, vocab_start,
            vocab_local);
        LAUNCH_CHECK());
}

/* The lookup from a table of ggml blocks (vocab_local rows of row_bytes): each element decoded
 * in f32 exactly as the CPU does, then rounded once to out's dtype (no rounding for f32). */
template <int QT, typename T>
static __global__ void embedding_quant_kernel(T *out, const uint8_t *table, size_t row_bytes,
                                              const int32_t *ids, int64_t n, int64_t d,
                                              int64_t vocab_start, int64_t vocab_local)
{
    int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / d, col = i % d;
        int64_t r = (int64_t)ids[row] - vocab_start;
        float v = r >= 0 && r < vocab_local ? quant_row_elem<QT>(table + (size_t)r * row_bytes, col) : 0.0f;
        cuda_store(out + i, v);
    }
}

/* out (n, d) = the rows ids (n) - vocab_start of the block table (vocab_local, d), dequantized;
 * zeros outside the shard. */
void cuda_embedding_quant(struct backend *b, const struct tensor *out, const struct tensor *table,
                          const struct tensor *ids, int64_t vocab_start)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(ids), d = table->shape[1], vocab_local = table->shape[0];
    if (n == 0 || d == 0) return;
    const enum quant_type qt = (enum quant_type)dtype_quant_type(table->dtype);
    const size_t row_bytes = quant_row_bytes(qt, d);
    QUANT_DISPATCH(qt, QT,
        CUDA_DISPATCH_FLOAT(out->dtype, T,
            embedding_quant_kernel<QT, T><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0,
                                            s->stream>>>((T *)out->data, (const uint8_t *)table->data,
                                                         row_bytes, (const int32_t *)ids->data, n, d,
                                                         vocab_start, vocab_local);
            LAUNCH_CHECK()));
}

/* dst[idx[row] - offset, col] += src[row, col], one thread per element of src. */
template <typename T, typename G>
static __global__ void scatter_add_rows_kernel(G *dst, const T *src, const int32_t *idx, int64_t n,
                                               int64_t d, int64_t offset, int64_t rows,
                                               int check_range)
{
    int64_t total = n * d;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t row = i / d, col = i % d;
        int64_t r = (int64_t)idx[row] - offset;
        if (check_range) DEVICE_CHECK(r >= 0 && r < rows);
        if (r >= 0 && r < rows) cuda_atomic_add(dst + r * d + col, cuda_load(src + i));
    }
}

void cuda_scatter_add_rows(struct backend *b, const struct tensor *dst, const struct tensor *src,
                           const int32_t *idx, int64_t offset, int check_range)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(src), d = tensor_cols(src);
    if (n == 0 || d == 0) return;
    CUDA_DISPATCH_FLOAT(src->dtype, T,
        CUDA_DISPATCH_GRAD(dst->dtype, T, G,
            scatter_add_rows_kernel<T, G><<<cuda_blocks_for(n * d, CUDA_THREADS), CUDA_THREADS, 0,
                                            s->stream>>>((G *)dst->data, (const T *)src->data, idx,
                                                         n, d, offset, dst->shape[0], check_range);
            LAUNCH_CHECK()));
}

/* dtable (vocab_local, d)[ids (n) - vocab_start] += dout (n, d), ids outside the shard skipped. */
void cuda_embedding_backward(struct backend *b, const struct tensor *dtable,
                             const struct tensor *dout, const struct tensor *ids, int64_t vocab_start)
{
    cuda_scatter_add_rows(b, dtable, dout, (const int32_t *)ids->data, vocab_start, 0);
}
