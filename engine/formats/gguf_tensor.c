/* engine/formats/gguf_tensor.c - the data of GGUF tensors: the ggml tensor types (block sizes),
 * dequantization of ggml's block-quantized types into f32, and the gguf_tensor_read_* calls of
 * gguf.h (whole tensors or row ranges, f32 or bf16).
 *
 * The block layouts follow ggml-common.h and the arithmetic ggml's dequantize_row_* (the
 * same float32 operations in the same order as gguf-py's gguf.quants, so results are
 * bit-exact as long as the compiler does not fuse a*b-c into an FMA: GCC/Clang on x86-64
 * without -march flags never do).
 * Not here: parsing the file (gguf.c), what the tensors mean (gguf_convert.c, the model).
 * Tests: tests/test_gguf.c (every supported type bit-exact against gguf-py). */
#include <inttypes.h>
#include <string.h>

#include "gguf_impl.h"
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
    {10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4, 0},
    {11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12, 0},
    {12, "Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, 1},
    {13, "Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, 1},
    {14, "Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, 1},
    {15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8, 0},
    {16, "IQ2_XXS", QK_K, 2 + QK_K / 4, 0},
    {17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32, 0},
    {18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8, 0},
    {19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16, 0},
    {20, "IQ4_NL", 32, 2 + 16, 0},
    {21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, 0},
    {22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16, 0},
    {23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64, 0},
    {24, "I8", 1, 1, 0},
    {25, "I16", 1, 2, 0},
    {26, "I32", 1, 4, 0},
    {27, "I64", 1, 8, 0},
    {28, "F64", 1, 8, 0},
    {29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, 0},
    {30, "BF16", 1, 2, 1},
    {34, "TQ1_0", QK_K, 2 + 4 * 13, 0},
    {35, "TQ2_0", QK_K, 2 + 64, 0},
    {39, "MXFP4", 32, 1 + 16, 0},
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

/* ---- dequantization -------------------------------------------------------------------- */
static float h2f(const uint8_t *p) { return f16_to_f32(gguf_rd16(p)); }

/* Each dequantizes nb consecutive blocks at x into y[0 .. nb * block_size). */

static void deq_q4_0(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 18, y += 32) { /* {d f16, qs[16]} */
        const float d = h2f(x);
        const uint8_t *qs = x + 2;
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((qs[j] & 0x0F) - 8) * d;
            y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
        }
    }
}

static void deq_q4_1(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 20, y += 32) { /* {d f16, m f16, qs[16]} */
        const float d = h2f(x), m = h2f(x + 2);
        const uint8_t *qs = x + 4;
        for (int j = 0; j < 16; j++) {
            y[j] = d * (float)(qs[j] & 0x0F) + m;
            y[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    }
}

static void deq_q5_0(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 22, y += 32) { /* {d f16, qh[4] (u32 LE), qs[16]} */
        const float d = h2f(x);
        const uint32_t qh = gguf_rd32(x + 2);
        const uint8_t *qs = x + 6;
        for (int j = 0; j < 16; j++) {
            const int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = (float)(((qs[j] & 0x0F) | hi0) - 16) * d;
            y[j + 16] = (float)(((qs[j] >> 4) | hi1) - 16) * d;
        }
    }
}

static void deq_q5_1(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 24, y += 32) { /* {d, m, qh[4], qs[16]} */
        const float d = h2f(x), m = h2f(x + 2);
        const uint32_t qh = gguf_rd32(x + 4);
        const uint8_t *qs = x + 8;
        for (int j = 0; j < 16; j++) {
            const int hi0 = (int)((qh >> j) & 1) << 4, hi1 = (int)((qh >> (j + 16)) & 1) << 4;
            y[j] = d * (float)((qs[j] & 0x0F) | hi0) + m;
            y[j + 16] = d * (float)((qs[j] >> 4) | hi1) + m;
        }
    }
}

static void deq_q8_0(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 34, y += 32) { /* {d f16, qs[32] int8} */
        const float d = h2f(x);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)x[2 + j] * d;
    }
}

/* The j-th (0..7) 6-bit scale and min of a Q4_K/Q5_K block's 12 packed bytes: bytes 0-3 hold
 * scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for mins;
 * bytes 8-11 the low 4 bits of scale (low nibble) and min (high nibble) 4-7. */
static void k_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void deq_q4_k(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 144) { /* {d, dmin, scales[12], qs[128]} */
        const float d = h2f(x), dmin = h2f(x + 2);
        const uint8_t *scales = x + 4, *q = x + 16;
        for (int j = 0; j < QK_K / 64; j++, q += 32) { /* 64 values: 32 low nibbles, 32 high */
            int sc, m;
            k_scale_min(2 * j, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            k_scale_min(2 * j + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0x0F) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

static void deq_q5_k(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 176) { /* {d, dmin, scales[12], qh[32], qs[128]} */
        const float d = h2f(x), dmin = h2f(x + 2);
        const uint8_t *scales = x + 4, *qh = x + 16, *ql = x + 48;
        for (int j = 0; j < QK_K / 64; j++, ql += 32) {
            int sc, m;
            k_scale_min(2 * j, scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            k_scale_min(2 * j + 1, scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            const int u1 = 1 << (2 * j), u2 = 2 << (2 * j);
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0x0F) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

static void deq_q6_k(const uint8_t *x, int64_t nb, float *y)
{
    for (int64_t b = 0; b < nb; b++, x += 210) { /* {ql[128], qh[64], scales[16] int8, d f16} */
        const float d = h2f(x + 208);
        const uint8_t *ql = x, *qh = x + 128;
        const int8_t *sc = (const int8_t *)(x + 192);
        for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = (d * (float)sc[is]) * (float)q1;
                y[l + 32] = (d * (float)sc[is + 2]) * (float)q2;
                y[l + 64] = (d * (float)sc[is + 4]) * (float)q3;
                y[l + 96] = (d * (float)sc[is + 6]) * (float)q4;
            }
        }
    }
}

/* Dequantizes n elements (a whole number of blocks) of type at x. */
static void gguf_dequantize(uint32_t type, const uint8_t *x, int64_t n, float *y)
{
    switch (type) {
    case GGML_TYPE_F32: memcpy(y, x, (size_t)n * 4); return;
    case GGML_TYPE_F16:
        for (int64_t i = 0; i < n; i++) y[i] = h2f(x + 2 * i);
        return;
    case GGML_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(gguf_rd16(x + 2 * i));
        return;
    case GGML_TYPE_Q4_0: deq_q4_0(x, n / 32, y); return;
    case GGML_TYPE_Q4_1: deq_q4_1(x, n / 32, y); return;
    case GGML_TYPE_Q5_0: deq_q5_0(x, n / 32, y); return;
    case GGML_TYPE_Q5_1: deq_q5_1(x, n / 32, y); return;
    case GGML_TYPE_Q8_0: deq_q8_0(x, n / 32, y); return;
    case GGML_TYPE_Q4_K: deq_q4_k(x, n / QK_K, y); return;
    case GGML_TYPE_Q5_K: deq_q5_k(x, n / QK_K, y); return;
    case GGML_TYPE_Q6_K: deq_q6_k(x, n / QK_K, y); return;
    }
    CHECK(0, "gguf_dequantize: type %" PRIu32 " marked supported but not implemented", type);
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
