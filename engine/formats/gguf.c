/* engine/formats/gguf.c - the GGUF container: mmap, full validation of the header, metadata and
 * tensor infos (gguf_parse, one function per stage), lookups, typed metadata getters, and
 * gguf_inspect. See gguf.h for the format and the contracts.
 * Not here: tensor data, ggml types and dequantization (gguf_tensor.c); the tokenizer
 * metadata as a SentencePiece ModelProto (gguf_tokenizer.c, the converter's); what the
 * tensors mean (gguf_convert.c).
 * Tests: tests/test_gguf.c (metadata round trip, corrupt and truncated files). */
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

#include "gguf_impl.h"

/* ---- small helpers --------------------------------------------------------------------- */

const char *gguf_type_name(enum gguf_type t)
{
    static const char *names[] = {"UINT8",  "INT8",   "UINT16", "INT16",  "UINT32",
                                  "INT32",  "FLOAT32", "BOOL",  "STRING", "ARRAY",
                                  "UINT64", "INT64",  "FLOAT64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
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
    *v = gguf_rd32(c->base + c->pos);
    c->pos += 4;
    return STATUS_OK;
}

static enum status cur_u64(struct gguf_cursor *c, uint64_t *v, const char *what)
{
    enum status s = cur_need(c, 8, what);
    if (s) return s;
    *v = gguf_rd64(c->base + c->pos);
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

/* Stage 1: magic, version and the two counts, checked against the file size; the arrays of
 * metadata entries and tensor infos allocated for them. */
static enum status gguf_parse_header(struct gguf *g, struct gguf_cursor *c, uint64_t *n_kv,
                                     uint64_t *n_tensors)
{
    enum status s;
    if (g->map_size < 4 || memcmp(g->map, "GGUF", 4) != 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a GGUF file (no 'GGUF' magic)", g->path);
    c->pos = 4;
    if ((s = cur_u32(c, &g->version, "the version"))) return s;
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
    if ((s = cur_u64(c, n_tensors, "the tensor count")) || (s = cur_u64(c, n_kv, "the metadata count")))
        return s;
    /* A metadata entry takes at least 8 + 1 + 4 + 1 bytes, a tensor info 8 + 1 + 4 + 8 + 4 + 8. */
    if (*n_kv > (c->size - c->pos) / 14 || *n_kv > INT_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: metadata count %" PRIu64 " is implausible for a file of %" PRIu64
                             " bytes (corrupt or truncated)", g->path, *n_kv, c->size);
    if (*n_tensors > (c->size - c->pos) / 33 || *n_tensors > INT_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor count %" PRIu64 " is implausible for a file of %" PRIu64
                             " bytes (corrupt or truncated)", g->path, *n_tensors, c->size);

    g->kv = calloc(*n_kv ? *n_kv : 1, sizeof *g->kv);
    g->kv_by_key = calloc(*n_kv ? *n_kv : 1, sizeof *g->kv_by_key);
    g->tensors = calloc(*n_tensors ? *n_tensors : 1, sizeof *g->tensors);
    g->by_name = calloc(*n_tensors ? *n_tensors : 1, sizeof *g->by_name);
    if (!g->kv || !g->kv_by_key || !g->tensors || !g->by_name)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
    return STATUS_OK;
}

/* Stage 2: the n_kv metadata entries (key, type, value), then the keys unique. */
static enum status gguf_parse_kvs(struct gguf *g, struct gguf_cursor *c, uint64_t n_kv)
{
    enum status s;
    const char *p;
    uint64_t len;
    for (uint64_t i = 0; i < n_kv; i++) {
        struct gguf_kv *kv = &g->kv[i];
        char what[48];
        snprintf(what, sizeof what, "the key of metadata entry %" PRIu64, i);
        if ((s = cur_str(c, &p, &len, what))) return s;
        if (len == 0) return status_errorf(STATUS_BAD_FORMAT, "%s: metadata entry %" PRIu64 " has an empty key", g->path, i);
        if (!(kv->key = dup_n(p, len)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
        g->n_kv = (int)i + 1;
        if (strlen(kv->key) != len)
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata key %" PRIu64 " contains a NUL byte", g->path, i);
        uint32_t t;
        snprintf(what, sizeof what, "the type of '%.30s'", kv->key);
        if ((s = cur_u32(c, &t, what))) return s;
        if (t > GGUF_TYPE_FLOAT64)
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata '%s' has invalid value type %" PRIu32,
                                 g->path, kv->key, t);
        kv->type = (enum gguf_type)t;
        kv->n = 1;
        if ((s = gguf_parse_value(g, c, kv))) return s;
        g->kv_by_key[i] = kv;
    }
    qsort(g->kv_by_key, (size_t)g->n_kv, sizeof *g->kv_by_key, cmp_kv);
    for (int i = 1; i < g->n_kv; i++)
        if (!strcmp(g->kv_by_key[i - 1]->key, g->kv_by_key[i]->key))
            return status_errorf(STATUS_BAD_FORMAT, "%s: metadata key '%s' appears twice", g->path,
                                 g->kv_by_key[i]->key);
    return STATUS_OK;
}

/* Stage 3: general.alignment, when present, a UINT32 power of two (default 32). */
static enum status gguf_parse_alignment(struct gguf *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const struct gguf_kv *al = gguf_find_kv(g, "general.alignment");
    if (!al) return STATUS_OK;
    if (al->type != GGUF_TYPE_UINT32)
        return status_errorf(STATUS_BAD_FORMAT, "%s: general.alignment has type %s, expected UINT32",
                             g->path, gguf_type_name(al->type));
    uint32_t a = gguf_rd32(al->data);
    if (a == 0 || (a & (a - 1)) != 0)
        return status_errorf(STATUS_BAD_FORMAT, "%s: general.alignment %" PRIu32 " is not a power of two",
                             g->path, a);
    g->alignment = a;
    return STATUS_OK;
}

/* The dims of tensor info t: 1..GGUF_MAX_DIMS of them, the element count without overflow. */
static enum status gguf_parse_dims(struct gguf *g, struct gguf_cursor *c, struct gguf_tensor *t,
                                   const char *what)
{
    enum status s;
    uint32_t nd;
    if ((s = cur_u32(c, &nd, what))) return s;
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' has %" PRIu32 " dims (1..%d allowed)",
                             g->path, t->name, nd, GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t numel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((s = cur_u64(c, &ne, what))) return s;
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
    return STATUS_OK;
}

/* Stage 4, per tensor: the info of tensor i (name, dims, ggml type, offset); its byte size
 * when ggml defines the type; the offset a multiple of the alignment. */
static enum status gguf_parse_tensor_info(struct gguf *g, struct gguf_cursor *c, uint64_t i)
{
    enum status s;
    struct gguf_tensor *t = &g->tensors[i];
    const char *p;
    uint64_t len;
    char what[64];
    snprintf(what, sizeof what, "the name of tensor %" PRIu64, i);
    if ((s = cur_str(c, &p, &len, what))) return s;
    if (!(t->name = dup_n(p, len)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
    g->n_tensors = (int)i + 1;
    g->by_name[i] = t;
    if (len == 0 || strlen(t->name) != len)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor %" PRIu64 " has an empty name or one with a NUL byte",
                             g->path, i);
    snprintf(what, sizeof what, "the dims of tensor '%.30s'", t->name);
    if ((s = gguf_parse_dims(g, c, t, what))) return s;
    snprintf(what, sizeof what, "the type of tensor '%.30s'", t->name);
    if ((s = cur_u32(c, &t->type, what))) return s;
    snprintf(what, sizeof what, "the offset of tensor '%.30s'", t->name);
    if ((s = cur_u64(c, &t->offset, what))) return s;
    const struct gguf_ggml_type *tt = gguf_ggml_type(t->type);
    if (tt) {
        t->type_name = tt->name;
        t->block_size = tt->block_size;
        t->type_size = tt->type_size;
        t->supported = tt->supported;
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
    return STATUS_OK;
}

/* Stage 5: the data section, at the next multiple of the alignment after the infos; every
 * tensor's bytes inside it. */
static enum status gguf_place_data(struct gguf *g, const struct gguf_cursor *c)
{
    uint64_t data_off = c->pos + (g->alignment - c->pos % g->alignment) % g->alignment;
    g->data_offset = data_off;
    uint64_t data_size = data_off <= c->size ? c->size - data_off : 0;
    if (g->n_tensors > 0 && data_off > c->size)
        return status_errorf(STATUS_BAD_FORMAT, "%s: truncated file: the data section would start at %" PRIu64
                             " but the file has %" PRIu64 " bytes", g->path, data_off, c->size);
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
    return STATUS_OK;
}

/* Stage 6: tensor names unique (and sorted for lookup); no two tensors' bytes overlap. */
static enum status gguf_check_tensors(struct gguf *g)
{
    enum status s = STATUS_OK;
    qsort(g->by_name, (size_t)g->n_tensors, sizeof *g->by_name, cmp_tensor);
    for (int i = 1; i < g->n_tensors; i++)
        if (!strcmp(g->by_name[i - 1]->name, g->by_name[i]->name))
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' appears twice", g->path, g->by_name[i]->name);
    if (g->n_tensors < 2) return STATUS_OK;
    struct gguf_tensor **by_off = malloc((size_t)g->n_tensors * sizeof *by_off);
    if (!by_off) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", g->path);
    for (int i = 0; i < g->n_tensors; i++) by_off[i] = &g->tensors[i];
    qsort(by_off, (size_t)g->n_tensors, sizeof *by_off, cmp_offset);
    for (int i = 1; i < g->n_tensors && !s; i++) {
        const struct gguf_tensor *a = by_off[i - 1], *b = by_off[i];
        if (a->nbytes > 0 && b->nbytes > 0 && a->offset + a->nbytes > b->offset)
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                              g->path, a->name, b->name);
    }
    free(by_off);
    return s;
}

/* Validates the whole mapping, stage by stage, in file order. */
static enum status gguf_parse(struct gguf *g)
{
    enum status s;
    struct gguf_cursor c = {g->map, g->map_size, 0, g->path};
    uint64_t n_kv, n_tensors;
    if ((s = gguf_parse_header(g, &c, &n_kv, &n_tensors)) || (s = gguf_parse_kvs(g, &c, n_kv)) ||
        (s = gguf_parse_alignment(g)))
        return s;
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((s = gguf_parse_tensor_info(g, &c, i))) return s;
    if ((s = gguf_place_data(g, &c))) return s;
    return gguf_check_tensors(g);
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
    struct stat st;
    if ((s = base_open_file(path, &fd, &st)) != STATUS_OK) goto fail;
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

void gguf_release_pages(struct gguf *g, int data_too)
{
    /* The metadata (everything before the data section; whole pages, those below the data
     * section's first), and with data_too the whole file: weights still read from the mapping
     * would come back at their first use, a page fault each (a stored Q6_K or f16 model's first
     * prefill), so the model asks for it only when it reads none of them. */
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t n = !g || !g->map ? 0 : data_too ? g->map_size : (size_t)g->data_offset / page * page;
    if (n) (void)madvise(g->map, n, MADV_DONTNEED); /* failing costs memory only */
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
        char supported[256];
        gguf_supported_types(supported, sizeof supported);
        if (!gguf_ggml_type(t->type))
            return status_errorf(STATUS_UNSUPPORTED, "%s: tensor %s has ggml type %" PRIu32
                                 ", which ggml does not define and shardlm cannot dequantize (it reads %s)",
                                 g->path, name, t->type, supported);
        return status_errorf(STATUS_UNSUPPORTED, "%s: tensor %s has ggml type %s, which shardlm cannot dequantize "
                             "(it reads %s)", g->path, name, t->type_name, supported);
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
    case GGUF_TYPE_UINT16: return gguf_rd16(p);
    case GGUF_TYPE_INT16: return (int16_t)gguf_rd16(p);
    case GGUF_TYPE_UINT32: return gguf_rd32(p);
    case GGUF_TYPE_INT32: return (int32_t)gguf_rd32(p);
    case GGUF_TYPE_INT64: return (int64_t)gguf_rd64(p);
    case GGUF_TYPE_UINT64: {
        uint64_t v = gguf_rd64(p);
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
        uint32_t u = gguf_rd32(p);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        uint64_t u = gguf_rd64(p);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    if (t == GGUF_TYPE_UINT64) return (double)gguf_rd64(p);
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

/* ---- inspect ---------------------------------------------------------------------------- */

static void gguf_print_scalar(FILE *out, const uint8_t *p, enum gguf_type t)
{
    int ok;
    if (t == GGUF_TYPE_FLOAT32 || t == GGUF_TYPE_FLOAT64) fprintf(out, "%.9g", gguf_load_float(p, t));
    else if (t == GGUF_TYPE_BOOL) fputs(p[0] ? "true" : "false", out);
    else if (t == GGUF_TYPE_UINT64) fprintf(out, "%" PRIu64, gguf_rd64(p));
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
        if (!gguf_ggml_type(t->type)) snprintf(tn, sizeof tn, "type %" PRIu32, t->type);
        else snprintf(tn, sizeof tn, "%s%s", t->type_name, t->supported ? "" : "(!)");
        fprintf(out, "  %-36s %-9s %-18s %12" PRIu64 " bytes at %" PRIu64 "\n", t->name, tn, shape, t->nbytes,
                t->file_offset);
    }
    gguf_close(g);
    return STATUS_OK;
}
