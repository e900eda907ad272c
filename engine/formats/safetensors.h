/* engine/formats/safetensors.h - the safetensors file format: a validating, mmap-backed reader and a
 * streaming, atomic writer.
 *
 * A file is: 8 bytes little-endian N; N bytes of JSON header (padded with spaces); the data
 * section. The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data section) plus an optional "__metadata__" string-to-string map.
 *
 * ggml block tensors (shardlm's extension, docs/models.md "Kept-blocks directories"): a weight
 * matrix of R rows and C columns kept as ggml blocks (Q4_0 ... Q6_K, kernels/quant.h) is stored
 * as a standard tensor of dtype "U8" and shape [R, quant_row_bytes(type, C)], its bytes those of
 * a GGUF file (row r at r * row bytes, ggml's block layout), and __metadata__ holds one key,
 * SAFETENSORS_BLOCKS_KEY, whose value is a JSON object (as a string) mapping each such tensor's
 * name to its ggml type name, e.g. {"model.layers.0.mlp.down_proj.weight": "Q4_K"}. Other
 * safetensors readers see plain uint8 arrays; this one presents those tensors with dtype
 * DTYPE_Q* and their logical shape [R, C].
 *
 * Not here: which tensors a model has or how they are laid out (checkpoint.c).
 * Tests: tests/test_formats.c (round trip, every kind of corrupt file). */
#ifndef SHARDLM_SAFETENSORS_H
#define SHARDLM_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ST_MAX_DIMS        8
#define ST_MAX_HEADER_SIZE 100000000 /* as the reference implementation: 100 MB */
#define SAFETENSORS_BLOCKS_KEY "shardlm.blocks" /* __metadata__ key of the block tensors (above) */

/* One tensor of an open file. Everything here is owned by the struct safetensors and valid
 * until safetensors_close.
 *
 * Alignment: `data` points into the mapping at 8 + N + begin. Nothing in the format promises
 * that this is a multiple of the element size (writers usually keep it so, this one does, but a
 * foreign file may not). Read it through safetensors_read / safetensors_gather (memcpy
 * semantics), or check st_tensor_aligned before casting it to float * etc. */
struct st_tensor {
    const char *name;
    char        dtype_name[16];      /* as written in the header, e.g. "BF16", "F64" ("U8" for
                                        block tensors) */
    int         supported;           /* 1 when dtype_name is F32, BF16, F16 or I32, or for a block
                                        tensor (named in SAFETENSORS_BLOCKS_KEY) */
    enum dtype  dtype;               /* valid when supported; a DTYPE_Q* for block tensors */
    int         elem_size;           /* bytes per element; 0 for a dtype this reader does not know
                                        and for block tensors */
    int         ndim;                /* 0 (a scalar) .. ST_MAX_DIMS */
    int64_t     shape[ST_MAX_DIMS];  /* block tensors: the logical [rows, cols], not the header's
                                        [rows, row bytes] */
    int64_t     numel;               /* block tensors: rows * cols */
    size_t      nbytes;              /* end - begin */
    uint64_t    file_offset;         /* absolute offset of the first byte in the file */
    const void *data;                /* read-only, into the mapping */
};

static inline int st_tensor_aligned(const struct st_tensor *t)
{
    return t->elem_size > 0 && ((uintptr_t)t->data % (uintptr_t)t->elem_size) == 0;
}

struct safetensors;

/* Maps `path` read-only (MAP_PRIVATE, PROT_READ) and validates its header completely: the length
 * (within the file, below ST_MAX_HEADER_SIZE), the JSON, and for every tensor its dtype, shape
 * (at most ST_MAX_DIMS non-negative dims), data_offsets (inside the data section, end - begin
 * == numel * element size, computed with overflow checks) and that no two tensors' bytes
 * overlap; names are unique; __metadata__, when present, maps strings to strings. A dtype that
 * shardlm does not load (F64, I64, I8, U8, BOOL, F8_E4M3, ...) is not an error here, only when
 * such a tensor is fetched through safetensors_get. Unknown dtype names are accepted the same
 * way (their byte size cannot be checked, only their bounds). Holes between tensors are allowed.
 * The SAFETENSORS_BLOCKS_KEY entry, when present, must be a JSON object of strings naming
 * tensors of the file that are U8, 2-D, with rows of a whole number of blocks of a type this
 * build knows (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K); those tensors then read as
 * block tensors (struct st_tensor). Other metadata keys are not interpreted.
 * Errors: STATUS_NOT_FOUND (no such file), STATUS_IO, STATUS_BAD_FORMAT naming the file and
 * the fault. On success *out owns the mapping; close it with safetensors_close. The file must not
 * be truncated while mapped (reading a vanished page raises SIGBUS, as with any mmap). */
enum status safetensors_open(const char *path, struct safetensors **out);
/* Unmaps and frees; accepts NULL. Every st_tensor and data pointer of the file dies with it. */
void        safetensors_close(struct safetensors *st);

const char *safetensors_path(const struct safetensors *st);
/* Tensors in header order: i in 0 .. safetensors_count - 1. */
int                     safetensors_count(const struct safetensors *st);
const struct st_tensor *safetensors_tensor(const struct safetensors *st, int i);
/* The tensor called name (binary search), or NULL. Does not check the dtype. */
const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name);
/* The same, as a status: STATUS_NOT_FOUND "FILE: no tensor 'X'", or STATUS_UNSUPPORTED
 * "FILE: tensor X has dtype F64 which shardlm does not load". */
enum status safetensors_get(const struct safetensors *st, const char *name,
                            const struct st_tensor **out);
/* The __metadata__ value for key, or NULL. */
const char *safetensors_metadata(const struct safetensors *st, const char *key);
int         safetensors_metadata_count(const struct safetensors *st);
void        safetensors_metadata_at(const struct safetensors *st, int i, const char **key,
                                    const char **value);

/* Copies tensor t, converted to dtype, into dst (dst_size bytes, aligned to dtype_size(dtype)).
 * Float dtypes convert among themselves (round to nearest even); I32 only to I32.
 * STATUS_UNSUPPORTED for a dtype shardlm does not load or a conversion it does not do (block
 * tensors: checkpoint_get dequantizes them);
 * STATUS_INVALID_ARGUMENT when dst_size is too small. */
enum status safetensors_read(const struct st_tensor *t, enum dtype dtype, void *dst,
                             size_t dst_size);

/* Element-wise copy with conversion from memory of any alignment: element i is read from
 * src + i * stride * dtype_size(src_dtype) (memcpy semantics) and written to dst[i]. dst must be
 * aligned to dtype_size(dst_dtype) when the dtypes differ. Int <-> float is a bug (CHECK). */
void safetensors_gather(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
                        size_t n, size_t stride);

/* ---- writer ------------------------------------------------------------------------------
 * Usage: begin; add / add_deferred / set_metadata any number of times; finish (or free to
 * abandon). The file appears at `path` only when finish succeeds: it is written to a temporary
 * of its own beside path (base_atomic_*: mkstemp's PATH.XXXXXX, mode 0644), synced and renamed,
 * the directory synced. The header is padded with spaces to a multiple of 8, and the
 * data of larger element types is placed first, so that every tensor's data is aligned to its
 * element size when the file is mapped. Not thread-safe: one writer, one thread. */
struct safetensors_writer;

/* Fills dst (nbytes, 64-byte aligned, the tensor's bytes) when finish writes the tensor. */
typedef enum status (*safetensors_fill_fn)(void *ctx, void *dst, size_t nbytes);

/* Creates the temporary now, so that an unwritable directory fails early (STATUS_IO). */
enum status safetensors_writer_begin(const char *path, struct safetensors_writer **out);
/* Adds a tensor of shape[0..ndim) (ndim 0 .. ST_MAX_DIMS). Borrows data: it must stay valid and
 * unchanged until finish or free returns. Name and shape are copied. A duplicate or empty name
 * or a bad shape is STATUS_INVALID_ARGUMENT and adds nothing. A block dtype (DTYPE_Q*) takes the
 * logical shape [rows, cols] (cols a multiple of the block size) and rows * quant_row_bytes
 * bytes; finish writes it as a U8 block tensor and records it in SAFETENSORS_BLOCKS_KEY (top of
 * this file). Block data is placed after the 4-byte dtypes, so it stays 2-byte aligned, which
 * the quantized kernels need (quant.h). */
enum status safetensors_writer_add(struct safetensors_writer *w, const char *name,
                                   enum dtype dtype, int ndim, const int64_t *shape,
                                   const void *data);
/* The same, but the bytes are produced by fill(ctx, ...) during finish, one tensor at a time,
 * so that a large file never needs all its tensors in memory. ctx is borrowed until finish or
 * free returns. An error status from fill aborts finish with that status. */
enum status safetensors_writer_add_deferred(struct safetensors_writer *w, const char *name,
                                            enum dtype dtype, int ndim, const int64_t *shape,
                                            safetensors_fill_fn fill, void *ctx);
/* Sets __metadata__[key] = value (both copied; a second call with the same key replaces).
 * SAFETENSORS_BLOCKS_KEY is the writer's own (STATUS_INVALID_ARGUMENT). */
enum status safetensors_writer_set_metadata(struct safetensors_writer *w, const char *key,
                                            const char *value);
/* Writes header and data, then renames the temporary to path. Frees w whatever the outcome; on
 * failure the temporary is removed and path is untouched. */
enum status safetensors_writer_finish(struct safetensors_writer *w);
/* Abandons the writer: removes the temporary and frees. Accepts NULL. */
void        safetensors_writer_free(struct safetensors_writer *w);

#ifdef __cplusplus
}
#endif

#endif
