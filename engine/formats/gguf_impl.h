/* engine/formats/gguf_impl.h - what the two files of the GGUF reader share: struct gguf itself,
 * little-endian loads from the mapping, and the table of ggml tensor types. Private to
 * engine/formats: gguf.c (the container: header, metadata, tensor infos) and gguf_tensor.c
 * (tensor data: ggml types, dequantization, reads) include it; nothing else does.
 * Not here: the public contract (gguf.h).
 * Tests: tests/test_gguf.c. */
#ifndef SHARDLM_GGUF_IMPL_H
#define SHARDLM_GGUF_IMPL_H

#include <stdint.h>

#include "gguf.h"

#define QK_K 256 /* elements per k-quant super-block */

struct gguf {
    char               *path;
    void               *map;        /* the whole file, read-only */
    size_t              map_size;
    uint32_t            version;
    uint32_t            alignment;
    uint64_t            data_offset; /* absolute start of the data section */
    int                 n_kv;
    struct gguf_kv     *kv;         /* (n_kv), file order */
    struct gguf_kv    **kv_by_key;  /* (n_kv), sorted by key */
    int                 n_tensors;
    struct gguf_tensor *tensors;    /* (n_tensors), file order */
    struct gguf_tensor **by_name;   /* (n_tensors), sorted by name */
};

static inline uint16_t gguf_rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t gguf_rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t gguf_rd64(const uint8_t *p)
{
    return (uint64_t)gguf_rd32(p) | (uint64_t)gguf_rd32(p + 4) << 32;
}

/* One tensor type that ggml defines: elements per block, bytes per block, and whether
 * gguf_tensor.c dequantizes it. */
struct gguf_ggml_type {
    uint32_t    id;
    const char *name;
    int         block_size, type_size, supported;
};

/* The entry of ggml type number `type`, or NULL when ggml does not define it. */
const struct gguf_ggml_type *gguf_ggml_type(uint32_t type);

#endif
