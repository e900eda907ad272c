/* engine/formats/gguf_tensor.c - the data of GGUF tensors: the ggml tensor types (block sizes),
 * dequantization of ggml's block-quantized types into f32, and the gguf_tensor_read_* calls of
 * gguf.h (whole tensors or row ranges, f32 or bf16).
 *
 * The block types are dequantized by the kernels' quant_dequantize_row (kernels/cpu/
 * quant_dequantize.c: ggml's block layouts and the same float32 operations in the same order
 * as gguf-py's gguf.quants, so results are bit-exact); this file had a second copy until
 * issue 25.
 * Not here: parsing the file (gguf.c), what the tensors mean (gguf_convert.c, the model).
 * Tests: tests/test_gguf.c (every supported type bit-exact against gguf-py). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "gguf_impl.h"
#include "quant.h"
#include "tensor.h"

/* ---- ggml tensor types ------------------------------------------------------------------ */

/* Every tensor type ggml defines: name, elements per block, bytes per block, and whether this
 * file dequantizes it. Sizes from ggml-common.h. */
static const struct gguf_ggml_type gguf_ggml_types[] = {
    {0, "F32", 1, 4, 1},
    {1, "F16", 1, 2, 1},
    {2, "Q4_0", 32, 2 + 16, 1},
    {3, "Q4_1", 32, 2 + 2 + 16, 1},
    {6, "Q5_0", 32, 2 + 4 + 16, 1},
    {7, "Q5_1", 32, 2 + 2 + 4 + 16, 1},
    {8, "Q8_0", 32, 2 + 32, 1},
    {9, "Q8_1", 32, 4 + 4 + 32, 0},
    {10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4, 1},
    {11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12, 1},
    {12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, 1},
    {13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, 1},
    {14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, 1},
    {15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8, 0},
    {16, "IQ2_XXS", QK_K, 2 + QK_K / 4, 0},
    {17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, 0},
    {18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, 0},
    {19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, 0},
    {20, "IQ4_NL", 32, 2 + 16, 1},
    {21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, 0},
    {22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, 0},
    {23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, 1},
    {24, "I8", 1, 1, 0},
    {25, "I16", 1, 2, 0},
    {26, "I32", 1, 4, 0},
    {27, "I64", 1, 8, 0},
    {28, "F64", 1, 8, 0},
    {29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, 0},
    {30, "BF16", 1, 2, 1},
    {34, "TQ1_0", QK_K, 2 + 4 * 13, 0},
    {35, "TQ2_0", QK_K, 2 + 64, 0},
    {39, "MXFP4", 32, 1 + 16, 1},
};
#define GGUF_N_GGML_TYPES (int)(sizeof gguf_ggml_types / sizeof gguf_ggml_types[0])

const struct gguf_ggml_type *gguf_ggml_type(uint32_t type)
{
    for (int i = 0; i < GGUF_N_GGML_TYPES; i++)
        if (gguf_ggml_types[i].id == type) return &gguf_ggml_types[i];
    return NULL;
}

const char *gguf_ggml_type_name(uint32_t type)
{
    const struct gguf_ggml_type *tt = gguf_ggml_type(type);
    return tt ? tt->name : NULL;
}

void gguf_supported_types(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < GGUF_N_GGML_TYPES && len < n; i++)
        if (gguf_ggml_types[i].supported)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", gguf_ggml_types[i].name);
}

/* ---- dequantization -------------------------------------------------------------------- */

/* Dequantizes n elements (a whole number of blocks) of type at x. The block types are the
 * kernels' one dequantizer (kernels/quant.h: bit-exact with ggml's dequantize_row_*), in its
 * plain C implementation: the reference that test_gguf holds against gguf-py and test_quant
 * holds the SIMD implementations against. */
static void gguf_dequantize(uint32_t type, const uint8_t *x, int64_t n, float *y)
{
    switch (type) {
    case GGML_TYPE_F32: memcpy(y, x, (size_t)n * 4); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) y[i] = f16_to_f32(gguf_rd16(x + 2 * i));
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(gguf_rd16(x + 2 * i));
        return;
    }
    CHECK(quant_type_supported(type), "gguf_dequantize: type %" PRIu32 " marked supported but not implemented", type);
    quant_dequantize_row_impl(QUANT_IMPL_SCALAR, (enum quant_type)type, x, y, n);
}

static enum status gguf_check_tensor(const struct gguf *g, const struct gguf_tensor *t)
{
    CHECK(t >= g->tensors && t < g->tensors + g->n_tensors, "tensor does not belong to %s", g->path);
    if (!t->supported) {
        const struct gguf_tensor *dummy;
        return gguf_get_tensor(g, t->name, &dummy);
    }
    return STATUS_OK;
}

enum status gguf_tensor_read_f32(const struct gguf *g, const struct gguf_tensor *t, float *dst)
{
    enum status s = gguf_check_tensor(g, t);
    if (s) return s;
    gguf_dequantize(t->type, t->data, t->numel, dst);
    return STATUS_OK;
}

/* The byte range and element count of rows [row_start, row_start + n_rows). */
static enum status gguf_row_range(const struct gguf *g, const struct gguf_tensor *t, int64_t row_start,
                                  int64_t n_rows, const uint8_t **src, int64_t *n_elems)
{
    enum status s = gguf_check_tensor(g, t);
    if (s) return s;
    const int64_t rows = t->shape[0];
    if (row_start < 0 || n_rows < 0 || row_start > rows || n_rows > rows - row_start)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: rows [%" PRId64 ", %" PRId64 ") of tensor %s are outside [0, %" PRId64 ")",
                             g->path, row_start, row_start + n_rows, t->name, rows);
    const int64_t row_numel = rows ? t->numel / rows : 0;
    if (row_numel % t->block_size != 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor %s: a row of %" PRId64 " elements is not a whole number of %s blocks (%d)",
                             g->path, t->name, row_numel, t->type_name, t->block_size);
    *src = (const uint8_t *)t->data + (uint64_t)(row_start * (row_numel / t->block_size)) * (uint64_t)t->type_size;
    *n_elems = n_rows * row_numel;
    return STATUS_OK;
}

enum status gguf_tensor_read_rows_f32(const struct gguf *g, const struct gguf_tensor *t, int64_t row_start,
                                      int64_t n_rows, float *dst)
{
    const uint8_t *src = NULL;
    int64_t n = 0;
    enum status s = gguf_row_range(g, t, row_start, n_rows, &src, &n);
    if (s) return s;
    gguf_dequantize(t->type, src, n, dst);
    return STATUS_OK;
}

enum status gguf_tensor_read_rows_bf16(const struct gguf *g, const struct gguf_tensor *t, int64_t row_start,
                                       int64_t n_rows, uint16_t *dst)
{
    const uint8_t *src = NULL;
    int64_t n = 0;
    enum status s = gguf_row_range(g, t, row_start, n_rows, &src, &n);
    if (s) return s;
    /* Through an f32 scratch of a bounded number of blocks, so no tensor-sized buffer. */
    enum { CHUNK = 16 * QK_K };
    float buf[CHUNK];
    const int64_t step = CHUNK - CHUNK % t->block_size;
    const uint64_t step_bytes = (uint64_t)(step / t->block_size) * (uint64_t)t->type_size;
    for (int64_t i = 0; i < n; i += step, src += step_bytes) {
        const int64_t m = n - i < step ? n - i : step;
        gguf_dequantize(t->type, src, m, buf);
        for (int64_t j = 0; j < m; j++) dst[i + j] = f32_to_bf16(buf[j]);
    }
    return STATUS_OK;
}
