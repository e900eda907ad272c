/* engine/formats/gguf.h - the GGUF file format (llama.cpp / ggml): a validating, mmap-backed reader
 * (gguf.c) and dequantization of ggml's block-quantized tensor types into f32 or bf16
 * (gguf_tensor.c). The tokenizer in the metadata, as a SentencePiece ModelProto, is the
 * converter's: gguf_tokenizer.h.
 *
 * A file (little-endian, versions 2 and 3) is:
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x { string key, u32 value type, value },
 *   n_tensors x { string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset },
 *   padding to general.alignment (default 32), the data section.
 * A string is u64 length + bytes (no NUL). An array is u32 element type, u64 count, elements.
 * Tensor offsets are relative to the data section and multiples of the alignment.
 *
 * Shapes: GGUF lists dims innermost first (ne[0] is the contiguous dimension, as in ggml).
 * shardlm shapes are row-major, outermost first, so shape[i] = ne[n_dims - 1 - i]. A GGUF
 * matrix [640, 1024] (ne) is shape (1024, 640): 1024 rows of 640 contiguous elements, which is
 * the (out_features, in_features) layout of a PyTorch nn.Linear weight. "Rows" below are the
 * slices along shape[0], the outermost dimension.
 *
 * Not here: which tensors a model has or what they mean (gguf_convert.c, weight_names.c); the
 * chat template (engine/text). Tests: tests/test_gguf.c with the files written by tests/gguf_setup.py
 * (dequantization bit-exact against gguf-py, metadata round trip, corrupt files, tokenizer). */
#ifndef SHARDLM_GGUF_H
#define SHARDLM_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GGUF_MAX_DIMS          4  /* as ggml (GGML_MAX_DIMS) */
#define GGUF_DEFAULT_ALIGNMENT 32

/* Metadata value types, numbered as in the file. */
enum gguf_type {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
};

/* ggml tensor types that this reader dequantizes, numbered as in the file (ggml.h). Other
 * numbers may appear in a file; their names and block sizes are known to gguf_type_name /
 * the validation when ggml defines them, and reading such a tensor is STATUS_UNSUPPORTED. */
enum ggml_type {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_BF16 = 30,
};

/* One metadata entry. Everything is owned by the struct gguf and valid until gguf_close. */
struct gguf_kv {
    const char    *key;      /* NUL-terminated copy */
    enum gguf_type type;     /* GGUF_TYPE_ARRAY for arrays */
    enum gguf_type arr_type; /* element type when type is GGUF_TYPE_ARRAY */
    uint64_t       n;        /* element count of an array; 1 for a scalar */
    const void    *data;     /* into the mapping: the scalar, or the first element of a
                                non-string array (unaligned: read with memcpy) */
    const char    *str;      /* GGUF_TYPE_STRING: NUL-terminated copy of the value */
    uint64_t       str_len;  /* its length in bytes (the value may contain NULs) */
    const char   **strs;     /* string arrays: (n) pointers into the mapping, NOT NUL-terminated */
    uint64_t      *strs_len; /* string arrays: (n) lengths */
};

/* One tensor. Everything is owned by the struct gguf and valid until gguf_close. */
struct gguf_tensor {
    const char *name;                  /* NUL-terminated copy */
    uint32_t    type;                  /* ggml type number (enum ggml_type when supported) */
    const char *type_name;             /* "Q4_K", or "type 99" for a number ggml does not define */
    int         supported;             /* 1 when gguf_tensor_read_f32 can dequantize it */
    int         n_dims;                /* 1 .. GGUF_MAX_DIMS */
    int64_t     ne[GGUF_MAX_DIMS];     /* GGUF order, innermost first; 1 past n_dims */
    int64_t     shape[GGUF_MAX_DIMS];  /* shardlm order, outermost first: shape[i] = ne[n_dims-1-i] */
    int64_t     numel;
    int         block_size;            /* elements per block (1 for F32/F16/BF16); 0 if unknown type */
    int         type_size;             /* bytes per block; 0 if unknown type */
    uint64_t    nbytes;                /* 0 if unknown type */
    uint64_t    offset;                /* relative to the data section */
    uint64_t    file_offset;           /* absolute */
    const void *data;                  /* read-only, into the mapping */
};

struct gguf;

/* Maps `path` read-only and validates it completely: magic, version (2 or 3; 1 and
 * big-endian files are STATUS_UNSUPPORTED), counts plausible for the file size, every key
 * (unique, non-empty) and value (all 13 value types; arrays of arrays are rejected), every
 * string within the file and valid as a length, general.alignment (UINT32, a power of two),
 * every tensor info (unique name, 1..4 dims, dims >= 0, element count without overflow,
 * ne[0] a multiple of the type's block size, offset a multiple of the alignment, bytes
 * inside the data section, no two tensors overlapping). A tensor type that ggml defines but
 * this reader cannot dequantize, or a number it does not know, is not an error here, only
 * when the tensor is read (unknown numbers: only bounds are checked, not the size).
 * Errors: STATUS_NOT_FOUND, STATUS_IO, STATUS_BAD_FORMAT / STATUS_UNSUPPORTED naming the file
 * and the fault, STATUS_RESOURCE_EXHAUSTED. On success *out owns the mapping; the file must
 * not be truncated while mapped (a vanished page raises SIGBUS, as with any mmap). */
enum status gguf_open(const char *path, struct gguf **out);
/* Unmaps and frees; accepts NULL. Every kv, tensor and data pointer of the file dies with it. */
void        gguf_close(struct gguf *g);
/* Gives back the resident pages of the mapping's metadata, or with data_too of the whole file
 * (MADV_DONTNEED; a later read brings them back from the file): after loading, what was read for
 * the tokenizer, or by a model that reads nothing from the mapping (model_load.c), stops counting
 * in the resident set. */
void        gguf_release_pages(struct gguf *g, int data_too);

const char *gguf_path(const struct gguf *g);
uint32_t    gguf_version(const struct gguf *g);
uint32_t    gguf_alignment(const struct gguf *g);
uint64_t    gguf_data_offset(const struct gguf *g); /* absolute offset of the data section */

/* Metadata in file order: i in 0 .. gguf_n_kv - 1. */
int                   gguf_n_kv(const struct gguf *g);
const struct gguf_kv *gguf_kv_at(const struct gguf *g, int i);
/* The entry called key, or NULL. */
const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key);

/* Typed getters. STATUS_NOT_FOUND "FILE: no metadata key 'K'" when absent; STATUS_BAD_FORMAT
 * naming the key and both types when the value has another type:
 *   gguf_get_str:   a STRING; *out is NUL-terminated and owned by g.
 *   gguf_get_int:   any integer type (an UINT64 above INT64_MAX is BAD_FORMAT), or BOOL.
 *   gguf_get_float: FLOAT32, FLOAT64 or any integer type.
 *   gguf_get_bool:  BOOL (0 or 1).
 *   gguf_get_arr:   an ARRAY; *out is the entry (n, arr_type), read with gguf_arr_*. */
enum status gguf_get_str(const struct gguf *g, const char *key, const char **out);
enum status gguf_get_int(const struct gguf *g, const char *key, int64_t *out);
enum status gguf_get_float(const struct gguf *g, const char *key, double *out);
enum status gguf_get_bool(const struct gguf *g, const char *key, int *out);
enum status gguf_get_arr(const struct gguf *g, const char *key, const struct gguf_kv **out);

/* Element i (< kv->n, checked) of an array, converted: gguf_arr_int for integer and BOOL
 * elements, gguf_arr_float for float and integer elements (a wrong element type is a bug:
 * CHECK), gguf_arr_str for STRING elements (not NUL-terminated, *len bytes). */
int64_t     gguf_arr_int(const struct gguf_kv *kv, uint64_t i);
double      gguf_arr_float(const struct gguf_kv *kv, uint64_t i);
const char *gguf_arr_str(const struct gguf_kv *kv, uint64_t i, uint64_t *len);

const char *gguf_type_name(enum gguf_type t); /* "UINT32", ..., "?" */
/* "Q4_K", "F32", ...; NULL for a number ggml does not define. */
const char *gguf_ggml_type_name(uint32_t type);
/* The tensor types shardlm reads, "F32, F16, Q4_0, ...", into buf (n bytes, NUL-terminated,
 * cut short if n is too small; 160 bytes hold them all): for the errors that refuse a type. */
void        gguf_supported_types(char *buf, size_t n);

/* Tensors in file order: i in 0 .. gguf_n_tensors - 1. */
int                       gguf_n_tensors(const struct gguf *g);
const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, int i);
/* The tensor called name (binary search), or NULL. Does not check the type. */
const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name);
/* The same as a status: STATUS_NOT_FOUND "FILE: no tensor 'X'", or STATUS_UNSUPPORTED
 * "FILE: tensor X has ggml type IQ2_XXS, which shardlm cannot dequantize". */
enum status gguf_get_tensor(const struct gguf *g, const char *name, const struct gguf_tensor **out);

/* Dequantizes the whole tensor into dst[0 .. t->numel), row-major (shardlm order: which, for
 * the data as stored, is simply the file's element order). t must belong to g.
 * STATUS_UNSUPPORTED naming the type when t is not supported. Bit-exact with ggml's
 * dequantize_row_* reference functions and gguf-py's gguf.quants.dequantize. */
enum status gguf_tensor_read_f32(const struct gguf *g, const struct gguf_tensor *t, float *dst);
/* Rows row_start .. row_start + n_rows - 1 along shape[0] into dst[0 .. n_rows * row numel),
 * where row numel = numel / shape[0] (for a 1-D tensor a row is one element). For tensor-
 * parallel loading of a slice. STATUS_INVALID_ARGUMENT when the range is outside [0, shape[0])
 * or a row is not a whole number of blocks (a 1-D quantized tensor); STATUS_UNSUPPORTED as
 * above. */
enum status gguf_tensor_read_rows_f32(const struct gguf *g, const struct gguf_tensor *t,
                                      int64_t row_start, int64_t n_rows, float *dst);
/* The same rounded to bf16 (round to nearest even, through f32). */
enum status gguf_tensor_read_rows_bf16(const struct gguf *g, const struct gguf_tensor *t,
                                       int64_t row_start, int64_t n_rows, uint16_t *dst);

/* Opens path and prints its header, metadata (long arrays abbreviated) and tensor table
 * (name, type, shape in shardlm order, bytes, offset) to out, then closes it. Errors as
 * gguf_open. */
enum status gguf_inspect(const char *path, FILE *out);

#ifdef __cplusplus
}
#endif

#endif
