/* engine/formats/safetensors.c - the safetensors reader: mmap, and full validation of the header
 * (st_parse_header, one function per stage, the last of which presents shardlm's ggml block
 * tensors). See safetensors.h for the format and the contracts.
 * Not here: the writer (safetensors_write.c), model tensor names and layouts (checkpoint.c,
 * weight_names.c).
 * Tests: tests/test_formats.c (every kind of corrupt file); tests/test_keep_blocks.c (block
 * tensors: round trip and every malformed SAFETENSORS_BLOCKS_KEY). */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: JSON numbers above it are not exact doubles */

/* Byte sizes of the dtype names of the safetensors specification. Sub-byte types (F4, F6_*)
 * are absent: their size is unknown to this reader and they are treated as unknown names. */
static const struct {
    const char *name;
    int         size;
} st_dtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
    {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
    {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8},
};

struct st_meta {
    char *key, *value;
};

struct safetensors {
    char             *path;
    void             *map;       /* the whole file, read-only */
    size_t            map_size;
    int               n_tensors;
    struct st_tensor *tensors;   /* (n_tensors), header order */
    const struct st_tensor **by_name; /* (n_tensors) into tensors, sorted by name */
    int               n_meta;
    struct st_meta   *meta;      /* (n_meta) */
};

/* ---- reader ----------------------------------------------------------------------------- */

static void st_set_dtype(struct st_tensor *t, const char *s)
{
    snprintf(t->dtype_name, sizeof t->dtype_name, "%s", s);
    t->elem_size = 0;
    t->supported = 1;
    if (!strcmp(s, "F32")) t->dtype = DTYPE_F32;
    else if (!strcmp(s, "BF16")) t->dtype = DTYPE_BF16;
    else if (!strcmp(s, "F16")) t->dtype = DTYPE_F16;
    else if (!strcmp(s, "I32")) t->dtype = DTYPE_I32;
    else t->supported = 0;
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (!strcmp(s, st_dtypes[i].name)) t->elem_size = st_dtypes[i].size;
}

/* A JSON number that is an exact non-negative integer (<= 2^53). */
static int st_json_u64(const cJSON *it, uint64_t *out)
{
    if (!cJSON_IsNumber(it)) return 0;
    double d = it->valuedouble;
    if (!(d >= 0.0) || d > ST_MAX_EXACT || d != floor(d)) return 0;
    *out = (uint64_t)d;
    return 1;
}

static int st_cmp_name(const void *a, const void *b)
{
    const struct st_tensor *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

struct st_range {
    uint64_t begin, end;
    int      index;
};

static int st_cmp_range(const void *a, const void *b)
{
    const struct st_range *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Where the tensor entries point: the data section after the header. */
struct st_data {
    const unsigned char *base;   /* the data section in the mapping */
    uint64_t             size;   /* its bytes */
    uint64_t             header; /* 8 + header length: the file offset of base */
};

/* Stage 1: the 8-byte little-endian header length, plausible and inside the file. */
static enum status st_read_header_len(const char *path, const unsigned char *base, size_t size,
                                      uint64_t *n)
{
    *n = 0;
    for (int i = 0; i < 8; i++) *n |= (uint64_t)base[i] << (8 * i);
    if (*n == 0) return status_errorf(STATUS_BAD_FORMAT, "%s: header length is 0", path);
    if (*n >= ST_MAX_HEADER_SIZE)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: header length %llu is implausible (limit %d bytes)", path,
                             (unsigned long long)*n, ST_MAX_HEADER_SIZE);
    if (*n > size - 8)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: header length %llu exceeds the file size %zu (truncated file?)",
                             path, (unsigned long long)*n, size);
    return STATUS_OK;
}

/* Stage 2: the header is one JSON object, followed by nothing but whitespace. */
static enum status st_parse_json(const char *path, const char *header, uint64_t n, cJSON **root)
{
    *root = NULL;
    if (header[0] != '{')
        return status_errorf(STATUS_BAD_FORMAT, "%s: header does not start with '{'", path);
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(header, (size_t)n, &end, 0);
    if (!r || !cJSON_IsObject(r)) {
        const char *at = cJSON_GetErrorPtr();
        cJSON_Delete(r);
        return status_errorf(STATUS_BAD_FORMAT, "%s: header is not a valid JSON object (near byte %ld)",
                             path, at && at >= header ? (long)(at - header) : -1L);
    }
    for (const char *p = end; p && p < header + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(r);
            return status_errorf(STATUS_BAD_FORMAT, "%s: garbage after the JSON header at byte %ld",
                                 path, (long)(p - header));
        }
    }
    *root = r;
    return STATUS_OK;
}

/* Stage 3a: the optional __metadata__ entry, an object of strings. */
static enum status st_parse_metadata(struct safetensors *st, const cJSON *it)
{
    const char *path = st->path;
    if (!cJSON_IsObject(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: __metadata__ is not a JSON object", path);
    /* A second __metadata__ would be parsed into a new array while n_meta counts on. */
    if (st->meta) return status_errorf(STATUS_BAD_FORMAT, "%s: __metadata__ appears twice in the header", path);
    int nm = cJSON_GetArraySize(it);
    st->meta = calloc((size_t)nm + 1, sizeof *st->meta);
    if (!st->meta) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    const cJSON *m;
    cJSON_ArrayForEach(m, it) {
        if (!cJSON_IsString(m))
            return status_errorf(STATUS_BAD_FORMAT, "%s: __metadata__ value of '%s' is not a string",
                                 path, m->string);
        struct st_meta *e = &st->meta[st->n_meta];
        e->key = strdup(m->string);
        e->value = strdup(m->valuestring);
        if (!e->key || !e->value) {
            free(e->key);
            free(e->value);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        }
        st->n_meta++;
    }
    return STATUS_OK;
}

/* The shape of tensor entry t: at most ST_MAX_DIMS non-negative integers; *nbytes is what shape
 * and dtype need (0 for a dtype of unknown size), without overflow. */
static enum status st_parse_shape(const char *path, const cJSON *shape, struct st_tensor *t,
                                  uint64_t *nbytes)
{
    const char *name = t->name;
    if (!cJSON_IsArray(shape))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': missing or non-list 'shape'", path,
                             name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > ST_MAX_DIMS)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", path,
                             name, ndim, ST_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < ndim; d++) {
        uint64_t v;
        if (!st_json_u64(cJSON_GetArrayItem(shape, d), &v))
            return status_errorf(STATUS_BAD_FORMAT,
                                 "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                                 name, d);
        t->shape[d] = (int64_t)v;
        overflow |= __builtin_mul_overflow(numel, v, &numel);
    }
    *nbytes = 0;
    if (!overflow && t->elem_size)
        overflow |= __builtin_mul_overflow(numel, (uint64_t)t->elem_size, nbytes);
    if (overflow || numel > (uint64_t)INT64_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': shape overflows 64 bits", path,
                             name);
    t->numel = (int64_t)numel;
    return STATUS_OK;
}

/* Stage 3b: one tensor entry: dtype, shape, and data_offsets inside the data section and
 * consistent with shape and dtype. Appends the tensor to st and its byte range to *range. */
static enum status st_parse_tensor(struct safetensors *st, const cJSON *it, const struct st_data *data,
                                   struct st_range *range)
{
    enum status s;
    const char *path = st->path, *name = it->string;
    struct st_tensor *t = &st->tensors[st->n_tensors];
    if (!cJSON_IsObject(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': entry is not a JSON object", path,
                             name);
    if (!(t->name = strdup(name))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    st->n_tensors++;

    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    if (!cJSON_IsString(dt))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': missing or non-string 'dtype'", path,
                             name);
    st_set_dtype(t, dt->valuestring);
    uint64_t nbytes = 0;
    if ((s = st_parse_shape(path, cJSON_GetObjectItemCaseSensitive(it, "shape"), t, &nbytes))) return s;

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    uint64_t b, e;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
        !st_json_u64(cJSON_GetArrayItem(offs, 0), &b) || !st_json_u64(cJSON_GetArrayItem(offs, 1), &e))
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: tensor '%s': 'data_offsets' must be [begin, end], two "
                             "non-negative integers",
                             path, name);
    if (b > e || e > data->size)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: tensor '%s': data_offsets [%llu, %llu] out of bounds of the "
                             "data section (%llu bytes)",
                             path, name, (unsigned long long)b, (unsigned long long)e,
                             (unsigned long long)data->size);
    if (t->elem_size && e - b != nbytes)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype "
                             "%s need %llu",
                             path, name, (unsigned long long)(e - b), t->dtype_name,
                             (unsigned long long)nbytes);
    t->nbytes = (size_t)(e - b);
    t->file_offset = data->header + b;
    t->data = data->base + b;
    *range = (struct st_range){b, e, st->n_tensors - 1};
    return STATUS_OK;
}

/* Stage 3: every entry of the header object, __metadata__ or a tensor, in header order. */
static enum status st_parse_entries(struct safetensors *st, const cJSON *root,
                                    const struct st_data *data, struct st_range **ranges)
{
    enum status s;
    int count = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__")) count++;
    }
    st->tensors = calloc((size_t)count + 1, sizeof *st->tensors);
    st->by_name = calloc((size_t)count + 1, sizeof *st->by_name);
    *ranges = calloc((size_t)count + 1, sizeof **ranges);
    if (!st->tensors || !st->by_name || !*ranges)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for %d tensors", st->path,
                             count);
    cJSON_ArrayForEach(it, root) {
        if (!strcmp(it->string, "__metadata__")) s = st_parse_metadata(st, it);
        else s = st_parse_tensor(st, it, data, &(*ranges)[st->n_tensors]);
        if (s) return s;
    }
    return STATUS_OK;
}

/* Stage 4: no two non-empty byte ranges overlap (sorted by begin, each must end before the
 * next one begins). */
static enum status st_check_overlaps(const struct safetensors *st, struct st_range *ranges)
{
    qsort(ranges, (size_t)st->n_tensors, sizeof *ranges, st_cmp_range);
    uint64_t reach = 0;
    int reach_index = -1;
    for (int i = 0; i < st->n_tensors; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (reach_index >= 0 && ranges[i].begin < reach)
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                                 st->path, st->tensors[reach_index].name,
                                 st->tensors[ranges[i].index].name);
        reach = ranges[i].end;
        reach_index = ranges[i].index;
    }
    return STATUS_OK;
}

/* Stage 5: the by-name index, which also finds a name given twice. */
static enum status st_index_names(struct safetensors *st)
{
    for (int i = 0; i < st->n_tensors; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, st_cmp_name);
    for (int i = 1; i < st->n_tensors; i++)
        if (!strcmp(st->by_name[i]->name, st->by_name[i - 1]->name))
            return status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' appears twice in the header",
                                 st->path, st->by_name[i]->name);
    return STATUS_OK;
}

/* The block dtype whose ggml type name (quant_type_name: "Q4_K", ...) is name, or -1. */
static int st_block_dtype(const char *name)
{
    for (int d = DTYPE_Q4_0; dtype_is_quant((enum dtype)d); d++)
        if (!strcmp(name, quant_type_name(dtype_quant_type((enum dtype)d)))) return d;
    return -1;
}

/* The block types' names, "Q4_0, Q4_1, ...", into buf (n bytes). */
static void st_block_dtype_names(char *buf, size_t n)
{
    size_t len = 0;
    buf[0] = 0;
    for (int d = DTYPE_Q4_0; dtype_is_quant((enum dtype)d) && len < n; d++)
        len += (size_t)snprintf(buf + len, n - len, "%s%s", len ? ", " : "", quant_type_name(dtype_quant_type((enum dtype)d)));
}

/* Presents U8 tensor t, [rows, row bytes], as a tensor of block dtype dt, [rows, cols]. */
static enum status st_make_block_tensor(const char *path, struct st_tensor *t, enum dtype dt)
{
    const uint32_t qt = dtype_quant_type(dt);
    const size_t bb = quant_block_bytes(qt);
    if (t->supported && dtype_is_quant(t->dtype))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s names tensor '%s' twice", path, SAFETENSORS_BLOCKS_KEY,
                             t->name);
    if (strcmp(t->dtype_name, "U8") || t->ndim != 2)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: %s names tensor '%s' as %s blocks, but it is %s with %d dimensions "
                             "(block tensors are U8 [rows, row bytes])",
                             path, SAFETENSORS_BLOCKS_KEY, t->name, quant_type_name(qt), t->dtype_name, t->ndim);
    if (t->shape[1] == 0 || (uint64_t)t->shape[1] % bb)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: %s: tensor '%s': rows of %lld bytes are not a whole number of %s blocks "
                             "(%zu bytes each)",
                             path, SAFETENSORS_BLOCKS_KEY, t->name, (long long)t->shape[1], quant_type_name(qt), bb);
    t->dtype = dt;
    t->supported = 1;
    t->elem_size = 0;
    t->shape[1] = t->shape[1] / (int64_t)bb * quant_block_size(qt);
    t->numel = t->shape[0] * t->shape[1];
    return STATUS_OK;
}

/* Stage 6: the tensors that __metadata__[SAFETENSORS_BLOCKS_KEY] names are ggml blocks. */
static enum status st_apply_blocks(struct safetensors *st)
{
    const char *value = safetensors_metadata(st, SAFETENSORS_BLOCKS_KEY), *path = st->path;
    if (!value) return STATUS_OK;
    enum status s = STATUS_OK;
    cJSON *map = cJSON_ParseWithOpts(value, NULL, 1);
    if (!cJSON_IsObject(map)) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: __metadata__ \"%s\" is not a JSON object of tensor name to ggml type", path,
                          SAFETENSORS_BLOCKS_KEY);
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        const int dt = cJSON_IsString(it) ? st_block_dtype(it->valuestring) : -1;
        /* The entry is ours (the struct's), only its public view is const. */
        struct st_tensor *t = (struct st_tensor *)safetensors_find(st, it->string);
        if (!cJSON_IsString(it))
            s = status_errorf(STATUS_BAD_FORMAT, "%s: %s: the entry of tensor '%s' is not a string", path,
                              SAFETENSORS_BLOCKS_KEY, it->string);
        else if (dt < 0) {
            char known[128];
            st_block_dtype_names(known, sizeof known);
            s = status_errorf(STATUS_BAD_FORMAT, "%s: %s: tensor '%s' has unknown block type '%s' (%s)", path,
                              SAFETENSORS_BLOCKS_KEY, it->string, it->valuestring, known);
        }
        else if (!t)
            s = status_errorf(STATUS_BAD_FORMAT, "%s: %s names tensor '%s', which the file does not have", path,
                              SAFETENSORS_BLOCKS_KEY, it->string);
        else
            s = st_make_block_tensor(path, t, (enum dtype)dt);
        if (s) break;
    }
out:
    cJSON_Delete(map);
    return s;
}

/* Parses and validates the header of an open mapping into st, stage by stage. */
static enum status st_parse_header(struct safetensors *st, const unsigned char *base, size_t size)
{
    enum status s;
    cJSON *root = NULL;
    struct st_range *ranges = NULL;
    uint64_t n;
    if ((s = st_read_header_len(st->path, base, size, &n))) return s;
    const struct st_data data = {base + 8 + n, size - 8 - n, 8 + n};
    if (!(s = st_parse_json(st->path, (const char *)base + 8, n, &root)) &&
        !(s = st_parse_entries(st, root, &data, &ranges)) && !(s = st_check_overlaps(st, ranges)) &&
        !(s = st_index_names(st)))
        s = st_apply_blocks(st);
    free(ranges);
    cJSON_Delete(root);
    return s;
}

enum status safetensors_open(const char *path, struct safetensors **out)
{
    enum status s = STATUS_OK;
    struct safetensors *st = NULL;
    *out = NULL;
    int fd;
    struct stat sb;
    if ((s = base_open_file(path, &fd, &sb)) != STATUS_OK) return s;
    if (sb.st_size < 8) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: file is %lld bytes, too short for the 8-byte header length", path,
                          (long long)sb.st_size);
        goto out;
    }
    st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        goto out;
    }
    st->map_size = (size_t)sb.st_size;
    st->map = mmap(NULL, st->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        s = status_errorf(STATUS_IO, "%s: mmap of %zu bytes failed: %s", path, st->map_size,
                          strerror(errno));
        goto out;
    }
    if ((s = st_parse_header(st, st->map, st->map_size))) goto out;
    *out = st;
    st = NULL;
out:
    safetensors_close(st);
    close(fd);
    return s;
}

void safetensors_close(struct safetensors *st)
{
    if (!st) return;
    if (st->map) munmap(st->map, st->map_size);
    for (int i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta[i].key);
        free(st->meta[i].value);
    }
    free(st->tensors);
    free(st->by_name);
    free(st->meta);
    free(st->path);
    free(st);
}

const char *safetensors_path(const struct safetensors *st) { return st->path; }

int safetensors_count(const struct safetensors *st) { return st->n_tensors; }

const struct st_tensor *safetensors_tensor(const struct safetensors *st, int i)
{
    CHECK(i >= 0 && i < st->n_tensors, "tensor index %d of %d", i, st->n_tensors);
    return &st->tensors[i];
}

const struct st_tensor *safetensors_find(const struct safetensors *st, const char *name)
{
    int lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const struct st_tensor *t = st->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

enum status safetensors_get(const struct safetensors *st, const char *name,
                            const struct st_tensor **out)
{
    const struct st_tensor *t = safetensors_find(st, name);
    *out = NULL;
    if (!t) return status_errorf(STATUS_NOT_FOUND, "%s: no tensor '%s'", st->path, name);
    if (!t->supported)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: tensor %s has dtype %s which shardlm does not load%s", st->path,
                             name, t->dtype_name, t->elem_size ? "" : " (an unknown dtype name)");
    *out = t;
    return STATUS_OK;
}

const char *safetensors_metadata(const struct safetensors *st, const char *key)
{
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta[i].key, key)) return st->meta[i].value;
    return NULL;
}

int safetensors_metadata_count(const struct safetensors *st) { return st->n_meta; }

void safetensors_metadata_at(const struct safetensors *st, int i, const char **key,
                             const char **value)
{
    CHECK(i >= 0 && i < st->n_meta, "metadata index %d of %d", i, st->n_meta);
    *key = st->meta[i].key;
    *value = st->meta[i].value;
}

void safetensors_gather(void *dst, enum dtype dst_dtype, const void *src, enum dtype src_dtype,
                        size_t n, size_t stride)
{
    CHECK((dst_dtype == DTYPE_I32) == (src_dtype == DTYPE_I32), "no conversion %s -> %s",
          dtype_name(src_dtype), dtype_name(dst_dtype));
    size_t ss = dtype_size(src_dtype), ds = dtype_size(dst_dtype);
    const unsigned char *s = src;
    unsigned char *d = dst;
    if (dst_dtype == src_dtype && stride == 1) {
        memcpy(d, s, n * ss);
        return;
    }
    if (dst_dtype != src_dtype)
        CHECK((uintptr_t)dst % ds == 0, "destination %p not aligned to %zu", dst, ds);
    if (dst_dtype != src_dtype && stride == 1 && (uintptr_t)src % ss == 0) {
        dtype_convert(d, dst_dtype, s, src_dtype, n);
        return;
    }
    /* Gather into an aligned scratch buffer with memcpy, then convert in chunks. */
    enum { CHUNK = 1024 };
    _Alignas(16) unsigned char tmp[CHUNK * 4];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        if (stride == 1) {
            memcpy(tmp, s + i * ss, m * ss);
        } else {
            for (size_t j = 0; j < m; j++) memcpy(tmp + j * ss, s + (i + j) * stride * ss, ss);
        }
        dtype_convert(d + i * ds, dst_dtype, tmp, src_dtype, m);
    }
}

enum status safetensors_read(const struct st_tensor *t, enum dtype dtype, void *dst,
                             size_t dst_size)
{
    if (!t->supported)
        return status_errorf(STATUS_UNSUPPORTED, "tensor %s has dtype %s which shardlm does not load",
                             t->name, t->dtype_name);
    if (dtype_is_quant(t->dtype) || dtype_is_quant(dtype))
        return status_errorf(STATUS_UNSUPPORTED, "tensor %s: %s blocks are read through a checkpoint, not copied as %s",
                             t->name, dtype_name(t->dtype), dtype_name(dtype));
    if ((dtype == DTYPE_I32) != (t->dtype == DTYPE_I32))
        return status_errorf(STATUS_UNSUPPORTED, "tensor %s: no conversion from %s to %s", t->name,
                             dtype_name(t->dtype), dtype_name(dtype));
    size_t need = (size_t)t->numel * dtype_size(dtype);
    if (dst_size < need)
        return status_errorf(STATUS_INVALID_ARGUMENT, "tensor %s: needs %zu bytes, buffer has %zu",
                             t->name, need, dst_size);
    safetensors_gather(dst, dtype, t->data, t->dtype, (size_t)t->numel, 1);
    return STATUS_OK;
}
