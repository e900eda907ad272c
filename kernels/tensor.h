/* kernels/tensor.h - the tensor descriptor every op takes: a data pointer with its dtype,
 * shape and device, plus host-side dtype conversions.
 * Not here: allocation (the backend's alloc in ops.h) or any op.
 * Tests: tests/test_ops.c (casts and every op's dtype paths). */
#ifndef SHARDLM_TENSOR_H
#define SHARDLM_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Values reach files (safetensors dtype mapping) only through names, never as numbers.
 * The DTYPE_Q* are ggml block-quantized weights (kernels/quant.h, docs/quantization.md): a
 * tensor of such a dtype is (rows, cols) of whole blocks, row r at r * quant_row_bytes(cols).
 * They are weights only: op_matmul takes one as w and op_embedding as the table (with f32
 * x, y, out on the CPU; any float dtype on CUDA); every other op refuses them (they are not
 * float dtypes), and dtype_size, being per element, is a bug for them (CHECK): use
 * tensor_nbytes / tensor_row_bytes. */
enum dtype {
    DTYPE_F32,
    DTYPE_BF16,
    DTYPE_F16,
    DTYPE_I32,
    DTYPE_Q4_0,
    DTYPE_Q4_1,
    DTYPE_Q5_0,
    DTYPE_Q5_1,
    DTYPE_Q8_0,
    DTYPE_Q4_K,
    DTYPE_Q5_K,
    DTYPE_Q6_K,
    DTYPE_Q2_K,
    DTYPE_Q3_K,
    DTYPE_IQ4_NL,
    DTYPE_IQ4_XS,
    DTYPE_MXFP4,
};

enum device {
    DEVICE_CPU,
    DEVICE_CUDA,
};

#define TENSOR_MAX_DIMS 4

/* A dense, row-major (last dimension contiguous) view of memory it does not own. shape[0] is
 * the outermost dimension. A tensor is a value: copying the struct copies the view. */
struct tensor {
    void       *data;
    enum dtype  dtype;
    enum device device;
    int         ndim;
    int64_t     shape[TENSOR_MAX_DIMS];
    /* CPU weights of Q4_0, Q4_1 or Q8_0: the same blocks packed eight rows at a time
     * (quant_pack_rows8, kernels/quant.h) for the products, or NULL. Set by model loading;
     * tensor_packed says whether it still describes this view. */
    const void *packed;
    const void *packed_of;   /* the data it was packed from */
    int64_t     packed_rows, packed_cols;
};

/* The packed copy of a row view of a packed tensor whose rows start and end on groups of eight
 * (an expert's rows in a stacked ffn_*_exps tensor), or NULL (tensor.c). */
const void *tensor_packed_rows(const struct tensor *t);

/* t's packed copy, or NULL when it has none or t is another view of the same memory that the
 * packed copy cannot serve (a struct copied and then moved or narrowed keeps the fields, but not
 * the data and shape they were packed for; a view of whole groups of eight rows is served). */
static inline const void *tensor_packed(const struct tensor *t)
{
    if (!t->packed || t->ndim != 2 || t->shape[1] != t->packed_cols) return NULL;
    if (t->packed_of == t->data && t->shape[0] == t->packed_rows) return t->packed;
    return tensor_packed_rows(t);
}

size_t      dtype_size(enum dtype t);   /* bytes per element; CHECK for block dtypes */
const char *dtype_name(enum dtype t);
int         dtype_is_float(enum dtype t);
int         dtype_is_quant(enum dtype t);  /* one of the DTYPE_Q* */
/* The ggml type number (enum quant_type) of a DTYPE_Q*, CHECK otherwise; and back: the dtype of
 * a ggml type number, or -1 when it is none of the DTYPE_Q*. */
uint32_t    dtype_quant_type(enum dtype t);
int         dtype_of_quant_type(uint32_t ggml_type);
/* The index of the first NaN or Inf among n values of dt (f32, bf16 or f16; -1 for any other
 * dtype) at data (host memory), or -1. The one finiteness check of weights read from files: one
 * weight that is not finite makes every logit NaN, so model_load and lora_load_peft refuse it
 * at load, naming it, where at run time the model would emit <unk> and `nan` log-probabilities.
 * About one read of the data (measured in docs/engine.md). */
int64_t     dtype_first_non_finite(const void *data, enum dtype dt, size_t n);

/* tensor_make(data, dtype, device, ndim, d0, d1, ...): builds a view; unused dims are 1. */
struct tensor tensor_make(void *data, enum dtype dtype, enum device device, int ndim, ...);
int64_t       tensor_numel(const struct tensor *t);
/* Bytes of the data: numel * dtype_size, or rows * quant_row_bytes(cols) for block dtypes. */
size_t        tensor_nbytes(const struct tensor *t);
/* Bytes of one entry of the outermost dimension (tensor_nbytes / shape[0] when shape[0] > 0). */
size_t        tensor_row_bytes(const struct tensor *t);
/* Size of the last dimension, and the product of all the others (the "rows"). */
int64_t       tensor_cols(const struct tensor *t);
int64_t       tensor_rows(const struct tensor *t);
int           tensor_same_shape(const struct tensor *a, const struct tensor *b);
/* Views of the same memory: the first n entries of the outermost dimension, and t read as
 * (rows, cols) or (rows, heads, hd) (the element counts must fit what the caller allocated). */
static inline struct tensor tensor_first_rows(const struct tensor *t, int64_t n)
{
    struct tensor v = *t;
    v.shape[0] = n;
    return v;
}
/* Rows [r0, r0 + n) of the outermost dimension: a view starting r0 rows in. */
static inline struct tensor tensor_rows_at(const struct tensor *t, int64_t r0, int64_t n)
{
    struct tensor v = *t;
    v.data = (char *)t->data + (size_t)r0 * tensor_row_bytes(t);
    v.shape[0] = n;
    return v;
}
static inline struct tensor tensor_view2(const struct tensor *t, int64_t rows, int64_t cols)
{
    return tensor_make(t->data, t->dtype, t->device, 2, rows, cols);
}
static inline struct tensor tensor_view3(const struct tensor *t, int64_t rows, int64_t heads, int64_t hd)
{
    return tensor_make(t->data, t->dtype, t->device, 3, rows, heads, hd);
}
/* Writes "bf16[3,64]" into buf; returns buf. */
const char   *tensor_describe(const struct tensor *t, char *buf, size_t n);

/* Host-side scalar conversions, round-to-nearest-even, NaN preserved. */
static inline float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float    f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/* Element i of a float tensor's memory, widened to f32 (host memory only). */
static inline float dtype_load_f32(const void *p, enum dtype t, size_t i)
{
    switch (t) {
    case DTYPE_F32: return ((const float *)p)[i];
    case DTYPE_BF16: return bf16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_F16: return f16_to_f32(((const uint16_t *)p)[i]);
    case DTYPE_I32: return (float)((const int32_t *)p)[i];
    default: break; /* block dtypes have no element i: quant_dequantize_row */
    }
    return 0.0f;
}

static inline void dtype_store_f32(void *p, enum dtype t, size_t i, float v)
{
    switch (t) {
    case DTYPE_F32: ((float *)p)[i] = v; break;
    case DTYPE_BF16: ((uint16_t *)p)[i] = f32_to_bf16(v); break;
    case DTYPE_F16: ((uint16_t *)p)[i] = f32_to_f16(v); break;
    case DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    default: break; /* block dtypes are never written element by element */
    }
}

/* Converts n elements between host buffers of any float dtypes (src and dst must not overlap
 * unless the dtypes are equal). */
void dtype_convert(void *dst, enum dtype dst_t, const void *src, enum dtype src_t, size_t n);

#ifdef __cplusplus
}
#endif

#endif
