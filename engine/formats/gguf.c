/* engine/formats/gguf.c - GGUF reader (mmap, full validation), ggml block dequantization, and the
 * tokenizer metadata turned into a SentencePiece ModelProto. See gguf.h for the format and
 * the contracts.
 *
 * The block layouts follow ggml-common.h and the arithmetic ggml's dequantize_row_* (the
 * same float32 operations in the same order as gguf-py's gguf.quants, so results are
 * bit-exact as long as the compiler does not fuse a*b-c into an FMA: GCC/Clang on x86-64
 * without -march flags never do).
 * Not here: model tensor names (the model loader). Tests: tests/test_gguf.c. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tensor.h"

#define QK_K 256

/* Every tensor type ggml defines: name, elements per block, bytes per block, and whether this
 * file dequantizes it. Sizes from ggml-common.h. */
static const struct {
    uint32_t    id;
    const char *name;
    int         block_size, type_size, supported;
} gguf_ggml_types[] = {
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

/* ---- small helpers --------------------------------------------------------------------- */

const char *gguf_type_name(enum gguf_type t)
{
    static const char *names[] = {"UINT8",  "INT8",   "UINT16", "INT16",  "UINT32",
                                  "INT32",  "FLOAT32", "BOOL",  "STRING", "ARRAY",
                                  "UINT64", "INT64",  "FLOAT64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static int gguf_ggml_index(uint32_t type)
{
    for (int i = 0; i < GGUF_N_GGML_TYPES; i++)
        if (gguf_ggml_types[i].id == type) return i;
    return -1;
}

const char *gguf_ggml_type_name(uint32_t type)
{
    int i = gguf_ggml_index(type);
    return i < 0 ? NULL : gguf_ggml_types[i].name;
}

/* Bytes of one scalar of a fixed-size value type; 0 for STRING, ARRAY and invalid types. */
static int gguf_scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_INT8: case GGUF_TYPE_BOOL: return 1;
    case GGUF_TYPE_UINT16: case GGUF_TYPE_INT16: return 2;
    case GGUF_TYPE_UINT32: case GGUF_TYPE_INT32: case GGUF_TYPE_FLOAT32: return 4;
    case GGUF_TYPE_UINT64: case GGUF_TYPE_INT64: case GGUF_TYPE_FLOAT64: return 8;
    }
    return 0;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* ---- parsing --------------------------------------------------------------------------- */

/* A bounds-checked reader over the mapping. `what` names the field being read for messages. */
struct gguf_cursor {
    const uint8_t *base;
    uint64_t       size, pos;
    const char    *path;
};

static enum status cur_need(struct gguf_cursor *c, uint64_t n, const char *what)
{
    if (n > c->size - c->pos)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: truncated file: %s needs %" PRIu64 " bytes at offset %" PRIu64
                             " but the file has %" PRIu64,
                             c->path, what, n, c->pos, c->size);
    return STATUS_OK;
}

static enum status cur_u32(struct gguf_cursor *c, uint32_t *v, const char *what)
{
    enum status s = cur_need(c, 4, what);
    if (s) return s;
    *v = rd32(c->base + c->pos);
    c->pos += 4;
    return STATUS_OK;
}

static enum status cur_u64(struct gguf_cursor *c, uint64_t *v, const char *what)
{
    enum status s = cur_need(c, 8, what);
    if (s) return s;
    *v = rd64(c->base + c->pos);
    c->pos += 8;
    return STATUS_OK;
}

/* A string: *p points into the mapping, *len bytes. */
static enum status cur_str(struct gguf_cursor *c, const char **p, uint64_t *len, const char *what)
{
    enum status s = cur_u64(c, len, what);
    if (s) return s;
    if (*len > c->size - c->pos)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: %s has length %" PRIu64 " at offset %" PRIu64
                             ", past the end of the file (%" PRIu64 " bytes): corrupt or truncated",
                             c->path, what, *len, c->pos - 8, c->size);
    *p = (const char *)c->base + c->pos;
    c->pos += *len;
    return STATUS_OK;
}

static char *dup_n(const char *p, uint64_t n)
{
    char *s = malloc((size_t)n + 1);
    if (!s) return NULL;
    memcpy(s, p, (size_t)n);
    s[n] = 0;
    return s;
}

static int cmp_kv(const void *a, const void *b)
{
    const struct gguf_kv *const *x = a, *const *y = b;
    return strcmp((*x)->key, (*y)->key);
}

static int cmp_tensor(const void *a, const void *b)
{
    const struct gguf_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

static int cmp_offset(const void *a, const void *b)
{
    const struct gguf_tensor *const *x = a, *const *y = b;
    if ((*x)->offset != (*y)->offset) return (*x)->offset < (*y)->offset ? -1 : 1;
    return 0;
}

static enum status gguf_parse_value(struct gguf *g, struct gguf_cursor *c, struct gguf_kv *kv)
{
    enum status s;
    char what[64];
    snprintf(what, sizeof what, "the value of '%.40s'", kv->key);
    if (kv->type == GGUF_TYPE_STRING) {
        const char *p;
        uint64_t len;
        if ((s = cur_str(c, &p, &len, what))) return s;
        kv->data = p;
        kv->str_len = len;
        if (!(kv->str = dup_n(p, len)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        return STATUS_OK;
    }
    if (kv->type == GGUF_TYPE_ARRAY) {
        uint32_t at;
        uint64_t n;
        if ((s = cur_u32(c, &at, what)) || (s = cur_u64(c, &n, what))) return s;
        if (at == GGUF_TYPE_ARRAY)
            return status_errorf(STATUS_UNSUPPORTED,
                                 "%s: metadata '%s' is an array of arrays, which shardlm does not read",
                                 g->path, kv->key);
        if (at != GGUF_TYPE_STRING && gguf_scalar_size(at) == 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' has arrays of invalid type %" PRIu32,
                                 g->path, kv->key, at);
        kv->arr_type = (enum gguf_type)at;
        kv->n = n;
        if (at != GGUF_TYPE_STRING) {
            uint64_t es = (uint64_t)gguf_scalar_size(at);
            if (n > (c->size - c->pos) / es)
                return status_errorf(STATUS_BAD_FORMAT,
                                     "%s: truncated file: array '%s' of %" PRIu64 " %s needs %" PRIu64
                                     " more bytes than the file has",
                                     g->path, kv->key, n, gguf_type_name(kv->arr_type),
                                     n * es > n ? n * es - (c->size - c->pos) : 0);
            kv->data = c->base + c->pos;
            c->pos += n * es;
            return STATUS_OK;
        }
        /* Every string takes at least its 8-byte length. */
        if (n > (c->size - c->pos) / 8)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: truncated file: string array '%s' claims %" PRIu64
                                 " elements, more than the rest of the file can hold",
                                 g->path, kv->key, n);
        kv->strs = malloc((size_t)(n ? n : 1) * sizeof *kv->strs);
        kv->strs_len = malloc((size_t)(n ? n : 1) * sizeof *kv->strs_len);
        if (!kv->strs || !kv->strs_len)
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        kv->data = c->base + c->pos;
        for (uint64_t i = 0; i < n; i++) {
            if (cur_str(c, &kv->strs[i], &kv->strs_len[i], "a string"))
                return status_errorf(STATUS_BAD_FORMAT,
                                     "%s: truncated or corrupt file: element %" PRIu64 " of string array '%s' "
                                     "runs past the end of the file (%" PRIu64 " bytes)",
                                     g->path, i, kv->key, c->size);
        }
        return STATUS_OK;
    }
    int es = gguf_scalar_size(kv->type);
    if (es == 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' has invalid value type %u",
                             g->path, kv->key, (unsigned)kv->type);
    if ((s = cur_need(c, (uint64_t)es, what))) return s;
    kv->data = c->base + c->pos;
    if (kv->type == GGUF_TYPE_BOOL && c->base[c->pos] > 1)
        return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' is a BOOL with value %u",
                             g->path, kv->key, c->base[c->pos]);
    c->pos += (uint64_t)es;
    return STATUS_OK;
}

static enum status gguf_parse(struct gguf *g)
{
    enum status s;
    struct gguf_cursor c = {g->map, g->map_size, 0, g->path};
    const char *p;
    uint64_t len;

    if (g->map_size < 4 || memcmp(g->map, "GGUF", 4) != 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a GGUF file (no 'GGUF' magic)", g->path);
    c.pos = 4;
    if ((s = cur_u32(&c, &g->version, "the version"))) return s;
    if (g->version == 1)
        return status_errorf(STATUS_UNSUPPORTED, "%s: GGUF version 1 is not supported (2 and 3 are)",
                             g->path);
    if (g->version != 2 && g->version != 3) {
        if ((g->version & 0xffff) == 0)
            return status_errorf(STATUS_UNSUPPORTED,
                                 "%s: GGUF version 0x%08" PRIx32 " looks big-endian; only "
                                 "little-endian files are supported", g->path, g->version);
        return status_errorf(STATUS_UNSUPPORTED, "%s: GGUF version %" PRIu32 " is not supported (2 and 3 are)",
                             g->path, g->version);
    }
    uint64_t n_tensors, n_kv;
    if ((s = cur_u64(&c, &n_tensors, "the tensor count")) || (s = cur_u64(&c, &n_kv, "the metadata count")))
        return s;
    /* A metadata entry takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8. */
    if (n_kv > (c.size - c.pos) / 14 || n_kv > INT_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: metadata count %" PRIu64 " is implausible for a file of %" PRIu64
                             " bytes (corrupt or truncated)", g->path, n_kv, c.size);
    if (n_tensors > (c.size - c.pos) / 33 || n_tensors > INT_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor count %" PRIu64 " is implausible for a file of %" PRIu64
                             " bytes (corrupt or truncated)", g->path, n_tensors, c.size);

    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->kv_by_key = calloc(n_kv ? n_kv : 1, sizeof *g->kv_by_key);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->by_name = calloc(n_tensors ? n_tensors : 1, sizeof *g->by_name);
    if (!g->kv || !g->kv_by_key || !g->tensors || !g->by_name)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        char what[48];
        snprintf(what, sizeof what, "the key of metadata entry %" PRIu64, i);
        if ((s = cur_str(&c, &p, &len, what))) return s;
        if (len == 0) return status_errorf(STATUS_BAD_FORMAT, "%s: metadata entry %" PRIu64 " has an empty key", g->path, i);
        if (!(kv->key = dup_n(p, len)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        g->n_kv = (int)i + 1;
        if (strlen(kv->key) != len)
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata key %" PRIu64 " contains a NUL byte", g->path, i);
        uint32_t t;
        snprintf(what, sizeof what, "the type of '%.30s'", kv->key);
        if ((s = cur_u32(&c, &t, what))) return s;
        if (t > GGUF_TYPE_FLOAT64)
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' has invalid value type %" PRIu32,
                                 g->path, kv->key, t);
        kv->type = (enum gguf_type)t;
        kv->n = 1;
        if ((s = gguf_parse_value(g, &c, kv))) return s;
        g->kv_by_key[i] = kv;
    }
    qsort(g->kv_by_key, (size_t)g->n_kv, sizeof *g->kv_by_key, cmp_kv);
    for (int i = 1; i < g->n_kv; i++)
        if (!strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key))
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata key '%s' appears twice", g->path,
                                 g->kv_by_key[i]->key);

    const struct gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32)
            return status_errorf(STATUS_BAD_FORMAT, "%s: general.alignment has type %s, expected UINT32",
                                 g->path, gguf_type_name(al->type));
        uint32_t a = rd32(al->data);
        if (a == 0 || (a & (a - 1)) != 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: general.alignment %" PRIu32 " is not a power of two",
                                 g->path, a);
        g->alignment = a;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        char what[64];
        snprintf(what, sizeof what, "the name of tensor %" PRIu64, i);
        if ((s = cur_str(&c, &p, &len, what))) return s;
        if (!(t->name = dup_n(p, len)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        g->n_tensors = (int)i + 1;
        g->by_name[i] = t;
        if (len == 0 || strlen(t->name) != len)
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor %" PRIu64 " has an empty name or one with a NUL byte",
                                 g->path, i);
        uint32_t nd;
        snprintf(what, sizeof what, "the dims of tensor '%.30s'", t->name);
        if ((s = cur_u32(&c, &nd, what))) return s;
        if (nd < 1 || nd > GGUF_MAX_DIMS)
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' has %" PRIu32 " dims (1..%d allowed)",
                                 g->path, t->name, nd, GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        int64_t numel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (int d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if ((s = cur_u64(&c, &ne, what))) return s;
            if (ne > (uint64_t)INT64_MAX)
                return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' has dim %d = %" PRIu64 " (negative as int64)",
                                     g->path, t->name, d, ne);
            t->ne[d] = (int64_t)ne;
            if (ne != 0 && numel > INT64_MAX / (int64_t)ne)
                return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' element count overflows", g->path, t->name);
            numel *= (int64_t)ne;
        }
        t->numel = numel;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->shape[d] = d < t->n_dims ? t->ne[t->n_dims - 1 - d] : 1;
        snprintf(what, sizeof what, "the type of tensor '%.30s'", t->name);
        if ((s = cur_u32(&c, &t->type, what))) return s;
        snprintf(what, sizeof what, "the offset of tensor '%.30s'", t->name);
        if ((s = cur_u64(&c, &t->offset, what))) return s;
        int ti = gguf_ggml_index(t->type);
        if (ti >= 0) {
            t->type_name = gguf_ggml_types[ti].name;
            t->block_size = gguf_ggml_types[ti].block_size;
            t->type_size = gguf_ggml_types[ti].type_size;
            t->supported = gguf_ggml_types[ti].supported;
            if (t->ne[0] % t->block_size != 0)
                return status_errorf(STATUS_BAD_FORMAT,
                                     "%s: tensor '%s' has ne[0] = %" PRId64 ", not a multiple of the %s block size %d",
                                     g->path, t->name, t->ne[0], t->type_name, t->block_size);
            uint64_t nb = (uint64_t)(t->numel / t->block_size);
            if (nb > UINT64_MAX / (uint64_t)t->type_size)
                return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' byte size overflows", g->path, t->name);
            t->nbytes = nb * (uint64_t)t->type_size;
        } else {
            t->type_name = "unknown";
        }
        if (t->offset % g->alignment != 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' offset %" PRIu64 " is not a multiple of the alignment %" PRIu32,
                                 g->path, t->name, t->offset, g->alignment);
    }

    /* The data section starts at the next multiple of the alignment. */
    uint64_t data_off = c.pos + (g->alignment - c.pos % g->alignment) % g->alignment;
    g->data_offset = data_off;
    uint64_t data_size = data_off <= c.size ? c.size - data_off : 0;
    if (g->n_tensors > 0 && data_off > c.size)
        return status_errorf(STATUS_BAD_FORMAT, "%s: truncated file: the data section would start at %" PRIu64
                             " but the file has %" PRIu64 " bytes", g->path, data_off, c.size);
    for (int i = 0; i < g->n_tensors; i++) {
        struct gguf_tensor *t = &g->tensors[i];
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: truncated file: tensor '%s' (%s, %" PRIu64 " bytes at data offset %" PRIu64
                                 ") extends past the end of the data section (%" PRIu64 " bytes)",
                                 g->path, t->name, t->type_name, t->nbytes, t->offset, data_size);
        t->file_offset = data_off + t->offset;
        t->data = (const uint8_t *)g->map + t->file_offset;
    }

    /* Unique names; no two tensors' bytes overlap. */
    qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_tensor);
    for (int i = 1; i < g->n_tensors; i++)
        if (!strcmp(g->by_name[i - 1]->name, g->by_name[i]->name))
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' appears twice", g->path, g->by_name[i]->name);
    if (g->n_tensors > 1) {
        struct gguf_tensor **by_off = malloc((size_t)g->n_tensors * sizeof *by_off);
        if (!by_off) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        for (int i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
        qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_offset);
        for (int i = 1; i < g->n_tensors; i++) {
            const struct gguf_tensor *a = by_off[i - 1], *b = by_off[i];
            if (a->nbytes > 0 && b->nbytes > 0 && a->offset + a->nbytes > b->offset) {
                s = status_errorf(STATUS_BAD_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                                  g->path, a->name, b->name);
                free(by_off);
                return s;
            }
        }
        free(by_off);
    }
    return STATUS_OK;
}

enum status gguf_open(const char *path, struct gguf **out)
{
    *out = NULL;
    enum status s = STATUS_OK;
    struct gguf *g = calloc(1, sizeof *g);
    int fd = -1;
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        s = status_errorf(errno == ENOENT ? STATUS_NOT_FOUND : STATUS_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        s = status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        s = status_errorf(STATUS_IO, "%s: not a regular file", path);
        goto fail;
    }
    if (st.st_size < 24) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: %lld bytes is too short for a GGUF header (truncated?)", path,
                          (long long)st.st_size);
        goto fail;
    }
    g->map_size = (size_t)st.st_size;
    g->map = mmap(NULL, g->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (g->map == MAP_FAILED) {
        g->map = NULL;
        s = status_errorf(STATUS_IO, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    if ((s = gguf_parse(g))) goto fail;
    *out = g;
    return STATUS_OK;
fail:
    if (fd >= 0) close(fd);
    gguf_close(g);
    return s;
}

void gguf_close(struct gguf *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_kv; i++) {
        free((char *)g->kv[i].key);
        free((char *)g->kv[i].str);
        free(g->kv[i].strs);
        free(g->kv[i].strs_len);
    }
    for (int i = 0; i < g->n_tensors; i++) free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->kv_by_key);
    free(g->tensors);
    free(g->by_name);
    if (g->map) munmap(g->map, g->map_size);
    free(g->path);
    free(g);
}

const char *gguf_path(const struct gguf *g) { return g->path; }
uint32_t    gguf_version(const struct gguf *g) { return g->version; }
uint32_t    gguf_alignment(const struct gguf *g) { return g->alignment; }
uint64_t    gguf_data_offset(const struct gguf *g) { return g->data_offset; }
int         gguf_n_kv(const struct gguf *g) { return g->n_kv; }
int         gguf_n_tensors(const struct gguf *g) { return g->n_tensors; }

const struct gguf_kv *gguf_kv_at(const struct gguf *g, int i)
{
    CHECK(i >= 0 && i < g->n_kv, "kv index %d of %d", i, g->n_kv);
    return &g->kv[i];
}

const struct gguf_tensor *gguf_tensor_at(const struct gguf *g, int i)
{
    CHECK(i >= 0 && i < g->n_tensors, "tensor index %d of %d", i, g->n_tensors);
    return &g->tensors[i];
}

const struct gguf_kv *gguf_find_kv(const struct gguf *g, const char *key)
{
    int lo = 0, hi = g->n_kv - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g->kv_by_key[mid]->key, key);
        if (c == 0) return g->kv_by_key[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf *g, const char *name)
{
    int lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(g->by_name[mid]->name, name);
        if (c == 0) return g->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

enum status gguf_get_tensor(const struct gguf *g, const char *name, const struct gguf_tensor **out)
{
    *out = gguf_find_tensor(g, name);
    if (!*out) return status_errorf(STATUS_NOT_FOUND, "%s: no tensor '%s'", g->path, name);
    if (!(*out)->supported) {
        const struct gguf_tensor *t = *out;
        *out = NULL;
        if (gguf_ggml_index(t->type) < 0)
            return status_errorf(STATUS_UNSUPPORTED, "%s: tensor %s has ggml type %" PRIu32
                                 ", which ggml does not define and shardlm cannot dequantize", g->path, name, t->type);
        return status_errorf(STATUS_UNSUPPORTED, "%s: tensor %s has ggml type %s, which shardlm cannot dequantize",
                             g->path, name, t->type_name);
    }
    return STATUS_OK;
}

/* ---- metadata getters ------------------------------------------------------------------ */

static enum status gguf_lookup(const struct gguf *g, const char *key, const struct gguf_kv **kv)
{
    *kv = gguf_find_kv(g, key);
    if (!*kv) return status_errorf(STATUS_NOT_FOUND, "%s: no metadata key '%s'", g->path, key);
    return STATUS_OK;
}

static enum status gguf_wrong_type(const struct gguf *g, const struct gguf_kv *kv, const char *want)
{
    return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' has type %s, expected %s", g->path, kv->key,
                         gguf_type_name(kv->type), want);
}

static int gguf_is_int(enum gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_INT16 ||
           t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64;
}

/* The integer at p of type t (integer or BOOL). *ok is 0 for an UINT64 above INT64_MAX. */
static int64_t gguf_load_int(const uint8_t *p, enum gguf_type t, int *ok)
{
    *ok = 1;
    switch (t) {
    case GGUF_TYPE_UINT8: case GGUF_TYPE_BOOL: return p[0];
    case GGUF_TYPE_INT8: return (int8_t)p[0];
    case GGUF_TYPE_UINT16: return rd16(p);
    case GGUF_TYPE_INT16: return (int16_t)rd16(p);
    case GGUF_TYPE_UINT32: return rd32(p);
    case GGUF_TYPE_INT32: return (int32_t)rd32(p);
    case GGUF_TYPE_INT64: return (int64_t)rd64(p);
    case GGUF_TYPE_UINT64: {
        uint64_t v = rd64(p);
        if (v > (uint64_t)INT64_MAX) *ok = 0;
        return (int64_t)(v & (uint64_t)INT64_MAX);
    }
    default: break;
    }
    CHECK(0, "gguf_load_int on type %s", gguf_type_name(t));
    return 0;
}

static double gguf_load_float(const uint8_t *p, enum gguf_type t)
{
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t u = rd32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        uint64_t u = rd64(p);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    if (t == GGUF_TYPE_UINT64) return (double)rd64(p);
    int ok;
    return (double)gguf_load_int(p, t, &ok);
}

enum status gguf_get_str(const struct gguf *g, const char *key, const char **out)
{
    const struct gguf_kv *kv;
    enum status s = gguf_lookup(g, key, &kv);
    if (s) return s;
    if (kv->type != GGUF_TYPE_STRING) return gguf_wrong_type(g, kv, "STRING");
    *out = kv->str;
    return STATUS_OK;
}

enum status gguf_get_int(const struct gguf *g, const char *key, int64_t *out)
{
    const struct gguf_kv *kv;
    enum status s = gguf_lookup(g, key, &kv);
    if (s) return s;
    if (!gguf_is_int(kv->type) && kv->type != GGUF_TYPE_BOOL) return gguf_wrong_type(g, kv, "an integer");
    int ok;
    *out = gguf_load_int(kv->data, kv->type, &ok);
    if (!ok) return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' does not fit in int64", g->path, key);
    return STATUS_OK;
}

enum status gguf_get_float(const struct gguf *g, const char *key, double *out)
{
    const struct gguf_kv *kv;
    enum status s = gguf_lookup(g, key, &kv);
    if (s) return s;
    if (!gguf_is_int(kv->type) && kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64)
        return gguf_wrong_type(g, kv, "a number");
    *out = gguf_load_float(kv->data, kv->type);
    return STATUS_OK;
}

enum status gguf_get_bool(const struct gguf *g, const char *key, int *out)
{
    const struct gguf_kv *kv;
    enum status s = gguf_lookup(g, key, &kv);
    if (s) return s;
    if (kv->type != GGUF_TYPE_BOOL) return gguf_wrong_type(g, kv, "BOOL");
    *out = ((const uint8_t *)kv->data)[0];
    return STATUS_OK;
}

enum status gguf_get_arr(const struct gguf *g, const char *key, const struct gguf_kv **out)
{
    enum status s = gguf_lookup(g, key, out);
    if (s) return s;
    if ((*out)->type != GGUF_TYPE_ARRAY) {
        s = gguf_wrong_type(g, *out, "ARRAY");
        *out = NULL;
    }
    return s;
}

int64_t gguf_arr_int(const struct gguf_kv *kv, uint64_t i)
{
    CHECK(kv->type == GGUF_TYPE_ARRAY && i < kv->n, "gguf_arr_int(%s, %" PRIu64 ")", kv->key, i);
    CHECK(gguf_is_int(kv->arr_type) || kv->arr_type == GGUF_TYPE_BOOL, "%s: not an integer array", kv->key);
    int ok;
    return gguf_load_int((const uint8_t *)kv->data + i * (uint64_t)gguf_scalar_size(kv->arr_type), kv->arr_type, &ok);
}

double gguf_arr_float(const struct gguf_kv *kv, uint64_t i)
{
    CHECK(kv->type == GGUF_TYPE_ARRAY && i < kv->n, "gguf_arr_float(%s, %" PRIu64 ")", kv->key, i);
    CHECK(gguf_is_int(kv->arr_type) || kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64,
          "%s: not a numeric array", kv->key);
    return gguf_load_float((const uint8_t *)kv->data + i * (uint64_t)gguf_scalar_size(kv->arr_type), kv->arr_type);
}

const char *gguf_arr_str(const struct gguf_kv *kv, uint64_t i, uint64_t *len)
{
    CHECK(kv->type == GGUF_TYPE_ARRAY && kv->arr_type == GGUF_TYPE_STRING && i < kv->n,
          "gguf_arr_str(%s, %" PRIu64 ")", kv->key, i);
    *len = kv->strs_len[i];
    return kv->strs[i];
}

/* ---- dequantization -------------------------------------------------------------------- */

static float h2f(const uint8_t *p) { return f16_to_f32(rd16(p)); }

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
        const uint32_t qh = rd32(x + 2);
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
        const uint32_t qh = rd32(x + 4);
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
        for (int64_t i = 0; i < n; i++) y[i] = bf16_to_f32(rd16(x + 2 * i));
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
    const uint8_t *src;
    int64_t n;
    enum status s = gguf_row_range(g, t, row_start, n_rows, &src, &n);
    if (s) return s;
    gguf_dequantize(t->type, src, n, dst);
    return STATUS_OK;
}

enum status gguf_tensor_read_rows_bf16(const struct gguf *g, const struct gguf_tensor *t, int64_t row_start,
                                       int64_t n_rows, uint16_t *dst)
{
    const uint8_t *src;
    int64_t n;
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

/* ---- tokenizer: SentencePiece ModelProto ------------------------------------------------ */

/* A growable byte buffer for the protobuf wire format. */
struct pb {
    uint8_t *p;
    size_t   n, cap;
    int      oom;
};

static void pb_bytes(struct pb *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    uint8_t tmp[10];
    int n = 0;
    do {
        tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, tmp, (size_t)n);
}

/* Wire types: 0 varint, 2 length-delimited, 5 fixed32. */
static void pb_tag(struct pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

/* int32 and enum fields: negative values are sign-extended to 64 bits, as protobuf does. */
static void pb_int32(struct pb *b, int field, int32_t v)
{
    pb_tag(b, field, 0);
    pb_varint(b, (uint64_t)(int64_t)v);
}

static void pb_str(struct pb *b, int field, const void *s, size_t n)
{
    pb_tag(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static void pb_float(struct pb *b, int field, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t le[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    pb_tag(b, field, 5);
    pb_bytes(b, le, 4);
}

/* SentencePiece types (sentencepiece_model.proto), which GGUF token types reuse. */
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER_DEFINED = 4, SP_UNUSED = 5, SP_BYTE = 6 };

/* An optional id key: -1 when absent; out-of-range is BAD_FORMAT. */
static enum status gguf_token_id(const struct gguf *g, const char *key, uint64_t n_vocab, int32_t *id)
{
    int64_t v;
    *id = -1;
    enum status s = gguf_get_int(g, key, &v);
    if (s == STATUS_NOT_FOUND) return STATUS_OK;
    if (s) return s;
    if (v < 0 || (uint64_t)v >= n_vocab)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %" PRId64 " is outside the vocabulary (%" PRIu64 " tokens)",
                             g->path, key, v, n_vocab);
    *id = (int32_t)v;
    return STATUS_OK;
}

enum status gguf_tokenizer_model_proto(const struct gguf *g, void **data, size_t *n)
{
    *data = NULL;
    *n = 0;
    const char *model;
    const struct gguf_kv *tokens, *scores = NULL, *types = NULL;
    enum status s = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s) return s;
    if (strcmp(model, "llama") != 0)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: tokenizer.ggml.model is '%s'; only SentencePiece vocabularies ('llama') are supported",
                             g->path, model);
    if ((s = gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return s;
    if (tokens->arr_type != GGUF_TYPE_STRING)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens is an array of %s, expected STRING",
                             g->path, gguf_type_name(tokens->arr_type));
    const uint64_t nv = tokens->n;
    if (nv == 0 || nv > INT32_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries", g->path, nv);
    s = gguf_get_arr(g, "tokenizer.ggml.scores", &scores);
    if (s && s != STATUS_NOT_FOUND) return s;
    s = gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (s && s != STATUS_NOT_FOUND) return s;
    if (scores && (scores->n != nv || (scores->arr_type != GGUF_TYPE_FLOAT32 && scores->arr_type != GGUF_TYPE_FLOAT64)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.scores has %" PRIu64 " %s, expected %" PRIu64 " FLOAT32",
                             g->path, scores->n, gguf_type_name(scores->arr_type), nv);
    if (types && (types->n != nv || !gguf_is_int(types->arr_type)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.token_type has %" PRIu64 " %s, expected %" PRIu64 " INT32",
                             g->path, types->n, gguf_type_name(types->arr_type), nv);

    int32_t unk, bos, eos, pad;
    if ((s = gguf_token_id(g, "tokenizer.ggml.unknown_token_id", nv, &unk)) ||
        (s = gguf_token_id(g, "tokenizer.ggml.bos_token_id", nv, &bos)) ||
        (s = gguf_token_id(g, "tokenizer.ggml.eos_token_id", nv, &eos)) ||
        (s = gguf_token_id(g, "tokenizer.ggml.padding_token_id", nv, &pad)))
        return s;
    int add_space_prefix = 1; /* llama.cpp's default for SentencePiece vocabularies */
    s = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix);
    if (s && s != STATUS_NOT_FOUND) return s;

    /* SentencePiece needs exactly one UNKNOWN piece: the declared one, else the first piece
     * typed UNKNOWN, else one named <unk>. */
    if (unk < 0) {
        for (uint64_t i = 0; i < nv && unk < 0; i++)
            if (types && gguf_arr_int(types, i) == SP_UNKNOWN) unk = (int32_t)i;
        for (uint64_t i = 0; i < nv && unk < 0; i++) {
            uint64_t len;
            const char *p = gguf_arr_str(tokens, i, &len);
            if (len == 5 && !memcmp(p, "<unk>", 5)) unk = (int32_t)i;
        }
        if (unk < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: the vocabulary has no unknown token, which SentencePiece requires",
                                 g->path);
    }

    struct pb out = {0}, sub = {0};
    int have_bytes = 0;
    for (uint64_t i = 0; i < nv; i++) {
        uint64_t len;
        const char *p = gguf_arr_str(tokens, i, &len);
        int64_t type = types ? gguf_arr_int(types, i) : SP_NORMAL;
        if (type < SP_NORMAL || type > SP_BYTE) type = SP_NORMAL; /* UNDEFINED (0) and unknown values */
        if ((int32_t)i == unk) type = SP_UNKNOWN;
        else if (type == SP_UNKNOWN) type = SP_CONTROL; /* only one UNKNOWN allowed */
        if (type == SP_BYTE) have_bytes = 1;
        sub.n = 0;
        pb_str(&sub, 1, p, (size_t)len);
        pb_float(&sub, 2, scores ? (float)gguf_arr_float(scores, i) : 0.0f);
        pb_int32(&sub, 3, (int32_t)type);
        if (sub.oom) break;
        pb_str(&out, 1, sub.p, sub.n);
    }

    /* TrainerSpec (field 2). Ids and piece names are what SentencePieceProcessor reports as
     * bos_id() etc.: it looks the *_piece names up, so they must name the real pieces. */
    sub.n = 0;
    pb_int32(&sub, 3, 2); /* model_type = BPE */
    pb_int32(&sub, 4, (int32_t)nv);
    pb_int32(&sub, 35, have_bytes); /* byte_fallback */
    pb_int32(&sub, 40, unk);
    pb_int32(&sub, 41, bos);
    pb_int32(&sub, 42, eos);
    pb_int32(&sub, 43, pad);
    const int32_t special[4] = {unk, bos, eos, pad};
    for (int k = 0; k < 4; k++) {
        if (special[k] < 0) continue;
        uint64_t len;
        const char *p = gguf_arr_str(tokens, (uint64_t)special[k], &len);
        pb_str(&sub, 45 + k, p, (size_t)len); /* unk_piece, bos_piece, eos_piece, pad_piece */
    }
    if (!sub.oom) pb_str(&out, 2, sub.p, sub.n);

    /* NormalizerSpec (field 3): no Unicode normalization (llama.cpp applies none), spaces
     * escaped to U+2581, runs of spaces kept. */
    sub.n = 0;
    pb_str(&sub, 1, "identity", 8);
    pb_int32(&sub, 3, add_space_prefix);
    pb_int32(&sub, 4, 0); /* remove_extra_whitespaces */
    pb_int32(&sub, 5, 1); /* escape_whitespaces */
    if (!sub.oom) pb_str(&out, 3, sub.p, sub.n);

    int oom = out.oom || sub.oom;
    free(sub.p);
    if (oom) {
        free(out.p);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory building the tokenizer", g->path);
    }
    *data = out.p;
    *n = out.n;
    return STATUS_OK;
}

/* ---- inspect ---------------------------------------------------------------------------- */

static void gguf_print_scalar(FILE *out, const uint8_t *p, enum gguf_type t)
{
    int ok;
    if (t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64) fprintf(out, "%.9g", gguf_load_float(p, t));
    else if (t == GGUF_TYPE_BOOL) fputs(p[0] ? "true" : "false", out);
    else if (t == GGUF_TYPE_UINT64) fprintf(out, "%" PRIu64, rd64(p));
    else fprintf(out, "%" PRId64, gguf_load_int(p, t, &ok));
}

/* A string with control characters and quotes escaped, cut at max bytes. */
static void gguf_print_str(FILE *out, const char *s, uint64_t len, uint64_t max)
{
    fputc('"', out);
    for (uint64_t i = 0; i < len && i < max; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '"' || c == '\\') fprintf(out, "\\%c", c);
        else if (c < 0x20 || c == 0x7f) fprintf(out, "\\x%02x", c);
        else fputc(c, out);
    }
    fputc('"', out);
    if (len > max) fprintf(out, "... (%" PRIu64 " bytes)", len);
}

enum status gguf_inspect(const char *path, FILE *out)
{
    struct gguf *g;
    enum status s = gguf_open(path, &g);
    if (s) return s;
    fprintf(out, "%s: GGUF v%" PRIu32 ", %d metadata entries, %d tensors, alignment %" PRIu32 ", data at byte %" PRIu64 "\n",
            path, g->version, g->n_kv, g->n_tensors, g->alignment, g->data_offset);
    for (int i = 0; i < g->n_kv; i++) {
        const struct gguf_kv *kv = &g->kv[i];
        if (kv->type == GGUF_TYPE_STRING) {
            fprintf(out, "  %-44s STRING   ", kv->key);
            gguf_print_str(out, kv->str, kv->str_len, 200);
        } else if (kv->type == GGUF_TYPE_ARRAY) {
            fprintf(out, "  %-44s [%s x %" PRIu64 "] ", kv->key, gguf_type_name(kv->arr_type), kv->n);
            for (uint64_t j = 0; j < kv->n && j < 8; j++) {
                if (j) fputs(", ", out);
                if (kv->arr_type == GGUF_TYPE_STRING) gguf_print_str(out, kv->strs[j], kv->strs_len[j], 40);
                else gguf_print_scalar(out, (const uint8_t *)kv->data + j * (uint64_t)gguf_scalar_size(kv->arr_type), kv->arr_type);
            }
            if (kv->n > 8) fputs(", ...", out);
        } else {
            fprintf(out, "  %-44s %-8s ", kv->key, gguf_type_name(kv->type));
            gguf_print_scalar(out, kv->data, kv->type);
        }
        fputc('\n', out);
    }
    fprintf(out, "tensors (shape outermost first):\n");
    for (int i = 0; i < g->n_tensors; i++) {
        const struct gguf_tensor *t = &g->tensors[i];
        char shape[96];
        int k = snprintf(shape, sizeof shape, "(");
        for (int d = 0; d < t->n_dims; d++)
            k += snprintf(shape + k, sizeof shape - (size_t)k, "%s%" PRId64, d ? ", " : "", t->shape[d]);
        snprintf(shape + k, sizeof shape - (size_t)k, ")");
        char tn[24];
        if (gguf_ggml_index(t->type) < 0) snprintf(tn, sizeof tn, "type %" PRIu32, t->type);
        else snprintf(tn, sizeof tn, "%s%s", t->type_name, t->supported ? "" : "(!)");
        fprintf(out, "  %-36s %-9s %-18s %12" PRIu64 " bytes at %" PRIu64 "\n", t->name, tn, shape, t->nbytes,
                t->file_offset);
    }
    gguf_close(g);
    return STATUS_OK;
}
