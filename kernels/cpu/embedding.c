/* kernels/cpu/embedding.c - op_embedding on the CPU: masked row lookup for a (possibly
 * vocab-parallel) embedding table; its backward, the masked scatter-add, and the row
 * scatter-add that position_embedding_add.c shares. A block-quantized table (DTYPE_Q*) has its
 * looked-up rows dequantized.
 * Tests: tests/test_ops.c (embedding cases), tests/test_ops_backward.c (embedding_backward),
 * tests/test_quant.c (a quantized table). */
#include <string.h>

#include "cpu_ops.h"
#include "quant.h"

/* The lookup from a block-quantized table: each row dequantized into out (f32), from the
 * packed copy when the table has one (the same bits). */
static void embedding_quant(struct backend *b, const struct tensor *out, const struct tensor *table,
                            const struct tensor *ids, int64_t vocab_start)
{
    const int64_t n = tensor_numel(ids), d = table->shape[1], rows = table->shape[0];
    const enum quant_type qt = (enum quant_type)dtype_quant_type(table->dtype);
    const size_t row_bytes = quant_row_bytes(qt, d);
    const int32_t *id = ids->data;
    const void *packed = tensor_packed(table); /* a tied head's packed copy: the stored rows stay cold */
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)id[i] - vocab_start;
        float *dst = (float *)out->data + i * d;
        if (r < 0 || r >= rows) memset(dst, 0, (size_t)d * sizeof *dst); /* another shard's id */
        else if (packed) quant_dequantize_row_packed(qt, packed, r, dst, d);
        else quant_dequantize_row(qt, (const char *)table->data + (size_t)r * row_bytes, dst, d);
    }
}

void cpu_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                   const struct tensor *ids, int64_t vocab_start)
{
    if (dtype_is_quant(table->dtype)) {
        embedding_quant(b, out, table, ids, vocab_start);
        return;
    }
    int64_t n = tensor_numel(ids), d = table->shape[1], rows = table->shape[0];
    size_t row_bytes = (size_t)d * dtype_size(out->dtype);
    const int32_t *id = ids->data;
    #pragma omp parallel for schedule(static) if (n * d > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (int64_t)id[i] - vocab_start;
        char *dst = (char *)out->data + (size_t)i * row_bytes;
        if (r < 0 || r >= rows) {
            memset(dst, 0, row_bytes); /* another vocab shard owns this id */
            continue;
        }
        if (table->dtype == out->dtype) memcpy(dst, (const char *)table->data + (size_t)r * row_bytes, row_bytes);
        else dtype_convert(dst, out->dtype, (const char *)table->data + (size_t)(r * d) * dtype_size(table->dtype),
                           table->dtype, (size_t)d); /* a bf16 table, f32 rows (ops.h) */
    }
}

void cpu_scatter_add_rows(struct backend *b, const struct tensor *dst, const struct tensor *src,
                          const int32_t *idx, int64_t offset)
{
    const int64_t n = tensor_rows(src), d = tensor_cols(src), rows = dst->shape[0];
    if (n == 0 || d == 0) return;
    const int nt = n * d > CPU_PARALLEL_MIN ? b->n_threads : 1;
    const int64_t per = ((d + nt - 1) / nt + 15) / 16 * 16;
    float *scratch = cpu_scratch(b, 2 * (size_t)per);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t c0 = 0; c0 < d; c0 += per) {
        float *tmp = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(2 * (size_t)per);
        size_t len = (size_t)(d - c0 < per ? d - c0 : per);
        for (int64_t i = 0; i < n; i++) {
            int64_t r = (int64_t)idx[i] - offset;
            if (r < 0 || r >= rows) continue; /* another vocab shard owns this id */
            const float *s = cpu_load_row(src, (size_t)(i * d + c0), len, tmp);
            size_t off = (size_t)(r * d + c0);
            float *o = (float *)cpu_load_row(dst, off, len, tmp + per); /* in place when f32 */
            for (size_t j = 0; j < len; j++) o[j] += s[j];
            cpu_store_row(dst, off, len, o);
        }
    }
}

void cpu_embedding_backward(struct backend *b, const struct tensor *dtable,
                            const struct tensor *dout, const struct tensor *ids, int64_t vocab_start)
{
    cpu_scatter_add_rows(b, dtable, dout, ids->data, vocab_start);
}
