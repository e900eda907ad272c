/* engine/formats/safetensors.c - safetensors reader (mmap, full header validation) and writer
 * (streaming, atomic rename). See safetensors.h for the format and the contracts.
 * Not here: model tensor names and layouts (checkpoint.c).
 * Tests: tests/test_formats.c. */
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

static const char *st_dtype_string(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_I32: return "I32";
    }
    return "?";
}

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

/* Parses and validates the header of an open mapping into st. */
static enum status st_parse_header(struct safetensors *st, const unsigned char *base, size_t size)
{
    enum status s = STATUS_OK;
    const char *path = st->path;
    cJSON *root = NULL;
    struct st_range *ranges = NULL;

    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)base[i] << (8 * i);
    if (n == 0) return status_errorf(STATUS_BAD_FORMAT, "%s: header length is 0", path);
    if (n >= ST_MAX_HEADER_SIZE)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: header length %llu is implausible (limit %d bytes)", path,
                             (unsigned long long)n, ST_MAX_HEADER_SIZE);
    if (n > size - 8)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: header length %llu exceeds the file size %zu (truncated file?)",
                             path, (unsigned long long)n, size);
    const char *header = (const char *)base + 8;
    const unsigned char *data = base + 8 + n;
    uint64_t data_size = size - 8 - n;
    if (header[0] != '{') {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: header does not start with '{'", path);
        goto out;
    }

    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(header, (size_t)n, &end, 0);
    if (!root || !cJSON_IsObject(root)) {
        const char *at = cJSON_GetErrorPtr();
        s = status_errorf(STATUS_BAD_FORMAT, "%s: header is not a valid JSON object (near byte %ld)",
                          path, at && at >= header ? (long)(at - header) : -1L);
        goto out;
    }
    for (const char *p = end; p && p < header + n; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: garbage after the JSON header at byte %ld",
                              path, (long)(p - header));
            goto out;
        }
    }

    int count = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        if (strcmp(it->string, "__metadata__")) count++;
    }
    st->tensors = calloc((size_t)count + 1, sizeof *st->tensors);
    st->by_name = calloc((size_t)count + 1, sizeof *st->by_name);
    ranges = calloc((size_t)count + 1, sizeof *ranges);
    if (!st->tensors || !st->by_name || !ranges) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for %d tensors", path, count);
        goto out;
    }

    cJSON_ArrayForEach(it, root) {
        const char *name = it->string;
        if (!strcmp(name, "__metadata__")) {
            if (!cJSON_IsObject(it)) {
                s = status_errorf(STATUS_BAD_FORMAT, "%s: __metadata__ is not a JSON object", path);
                goto out;
            }
            int nm = cJSON_GetArraySize(it);
            st->meta = calloc((size_t)nm + 1, sizeof *st->meta);
            if (!st->meta) {
                s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
                goto out;
            }
            const cJSON *m;
            cJSON_ArrayForEach(m, it) {
                if (!cJSON_IsString(m)) {
                    s = status_errorf(STATUS_BAD_FORMAT,
                                      "%s: __metadata__ value of '%s' is not a string", path,
                                      m->string);
                    goto out;
                }
                struct st_meta *e = &st->meta[st->n_meta];
                e->key = strdup(m->string);
                e->value = strdup(m->valuestring);
                if (!e->key || !e->value) {
                    free(e->key);
                    free(e->value);
                    s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
                    goto out;
                }
                st->n_meta++;
            }
            continue;
        }

        struct st_tensor *t = &st->tensors[st->n_tensors];
        if (!cJSON_IsObject(it)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': entry is not a JSON object",
                              path, name);
            goto out;
        }
        if (!(t->name = strdup(name))) {
            s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            goto out;
        }
        st->n_tensors++;

        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        if (!cJSON_IsString(dt)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': missing or non-string 'dtype'",
                              path, name);
            goto out;
        }
        st_set_dtype(t, dt->valuestring);

        const cJSON *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        if (!cJSON_IsArray(shape)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': missing or non-list 'shape'", path,
                              name);
            goto out;
        }
        int ndim = cJSON_GetArraySize(shape);
        if (ndim > ST_MAX_DIMS) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': %d dimensions (at most %d)", path,
                              name, ndim, ST_MAX_DIMS);
            goto out;
        }
        t->ndim = ndim;
        uint64_t numel = 1;
        int overflow = 0;
        for (int d = 0; d < ndim; d++) {
            uint64_t v;
            if (!st_json_u64(cJSON_GetArrayItem(shape, d), &v)) {
                s = status_errorf(STATUS_BAD_FORMAT,
                                  "%s: tensor '%s': shape[%d] is not a non-negative integer", path,
                                  name, d);
                goto out;
            }
            t->shape[d] = (int64_t)v;
            overflow |= __builtin_mul_overflow(numel, v, &numel);
        }
        uint64_t nbytes = 0;
        if (!overflow && t->elem_size)
            overflow |= __builtin_mul_overflow(numel, (uint64_t)t->elem_size, &nbytes);
        if (overflow || numel > (uint64_t)INT64_MAX) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s': shape overflows 64 bits", path,
                              name);
            goto out;
        }
        t->numel = (int64_t)numel;

        const cJSON *offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        uint64_t b, e;
        if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 ||
            !st_json_u64(cJSON_GetArrayItem(offs, 0), &b) ||
            !st_json_u64(cJSON_GetArrayItem(offs, 1), &e)) {
            s = status_errorf(STATUS_BAD_FORMAT,
                              "%s: tensor '%s': 'data_offsets' must be [begin, end], two "
                              "non-negative integers",
                              path, name);
            goto out;
        }
        if (b > e || e > data_size) {
            s = status_errorf(STATUS_BAD_FORMAT,
                              "%s: tensor '%s': data_offsets [%llu, %llu] out of bounds of the "
                              "data section (%llu bytes)",
                              path, name, (unsigned long long)b, (unsigned long long)e,
                              (unsigned long long)data_size);
            goto out;
        }
        if (t->elem_size && e - b != nbytes) {
            s = status_errorf(STATUS_BAD_FORMAT,
                              "%s: tensor '%s': data_offsets span %llu bytes but shape and dtype "
                              "%s need %llu",
                              path, name, (unsigned long long)(e - b), t->dtype_name,
                              (unsigned long long)nbytes);
            goto out;
        }
        t->nbytes = (size_t)(e - b);
        t->file_offset = 8 + n + b;
        t->data = data + b;
        ranges[st->n_tensors - 1] = (struct st_range){b, e, st->n_tensors - 1};
    }

    /* Overlaps: sorted by begin, each non-empty range must end before the next one begins. */
    qsort(ranges, (size_t)st->n_tensors, sizeof *ranges, st_cmp_range);
    uint64_t reach = 0;
    int reach_index = -1;
    for (int i = 0; i < st->n_tensors; i++) {
        if (ranges[i].begin == ranges[i].end) continue;
        if (reach_index >= 0 && ranges[i].begin < reach) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section",
                              path, st->tensors[reach_index].name,
                              st->tensors[ranges[i].index].name);
            goto out;
        }
        reach = ranges[i].end;
        reach_index = ranges[i].index;
    }

    for (int i = 0; i < st->n_tensors; i++) st->by_name[i] = &st->tensors[i];
    qsort(st->by_name, (size_t)st->n_tensors, sizeof *st->by_name, st_cmp_name);
    for (int i = 1; i < st->n_tensors; i++) {
        if (!strcmp(st->by_name[i]->name, st->by_name[i - 1]->name)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' appears twice in the header", path,
                              st->by_name[i]->name);
            goto out;
        }
    }
out:
    free(ranges);
    cJSON_Delete(root);
    return s;
}

enum status safetensors_open(const char *path, struct safetensors **out)
{
    enum status s = STATUS_OK;
    struct safetensors *st = NULL;
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return status_errorf(STATUS_NOT_FOUND, "%s: no such file", path);
        return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        s = status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(sb.st_mode)) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: not a regular file", path);
        goto out;
    }
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

/* ---- writer ----------------------------------------------------------------------------- */

struct st_entry {
    char               *name;
    enum dtype          dtype;
    int                 ndim;
    int64_t             shape[ST_MAX_DIMS];
    size_t              nbytes;
    const void         *data; /* borrowed, or NULL with fill */
    safetensors_fill_fn fill;
    void               *ctx;
    uint64_t            begin;
};

struct safetensors_writer {
    char            *path, *tmp;
    FILE            *f;
    struct st_entry *entries;
    int              n_entries, cap_entries;
    struct st_meta  *meta;
    int              n_meta, cap_meta;
};

/* A growable string for the header. */
struct st_buf {
    char  *p;
    size_t len, cap;
    int    failed;
};

static void buf_put(struct st_buf *b, const char *s, size_t n)
{
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void buf_puts(struct st_buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_printf(struct st_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct st_buf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    CHECK(n >= 0 && (size_t)n < sizeof tmp, "format overflow");
    buf_put(b, tmp, (size_t)n);
}

/* A JSON string literal. */
static void buf_json_string(struct st_buf *b, const char *s)
{
    buf_puts(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"') buf_puts(b, "\\\"");
        else if (*p == '\\') buf_puts(b, "\\\\");
        else if (*p < 0x20) buf_printf(b, "\\u%04x", *p);
        else buf_put(b, (const char *)p, 1);
    }
    buf_puts(b, "\"");
}

enum status safetensors_writer_begin(const char *path, struct safetensors_writer **out)
{
    enum status s = STATUS_OK;
    *out = NULL;
    struct safetensors_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path) + 5;
    if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(n))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        goto out;
    }
    snprintf(w->tmp, n, "%s.tmp", path);
    if (!(w->f = fopen(w->tmp, "wb"))) {
        s = status_errorf(STATUS_IO, "%s: %s", w->tmp, strerror(errno));
        goto out;
    }
    *out = w;
    w = NULL;
out:
    safetensors_writer_free(w);
    return s;
}

void safetensors_writer_free(struct safetensors_writer *w)
{
    if (!w) return;
    if (w->f) {
        fclose(w->f);
        remove(w->tmp);
    }
    for (int i = 0; i < w->n_entries; i++) free(w->entries[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->entries);
    free(w->meta);
    free(w->path);
    free(w->tmp);
    free(w);
}

static enum status st_writer_push(struct safetensors_writer *w, const char *name, enum dtype dtype,
                                  int ndim, const int64_t *shape, const void *data,
                                  safetensors_fill_fn fill, void *ctx)
{
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: bad tensor name '%s'", w->path,
                             name ? name : "(null)");
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s': %d dimensions", w->path, name,
                             ndim);
    uint64_t bytes = dtype_size(dtype);
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s': bad shape", w->path, name);
    }
    if (!data && !fill && bytes)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s': no data", w->path, name);
    for (int i = 0; i < w->n_entries; i++)
        if (!strcmp(w->entries[i].name, name))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s' added twice", w->path,
                                 name);
    if (w->n_entries == w->cap_entries) {
        int cap = w->cap_entries ? 2 * w->cap_entries : 64;
        struct st_entry *e = realloc(w->entries, (size_t)cap * sizeof *e);
        if (!e) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", w->path);
        w->entries = e;
        w->cap_entries = cap;
    }
    struct st_entry *e = &w->entries[w->n_entries];
    memset(e, 0, sizeof *e);
    if (!(e->name = strdup(name))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    e->dtype = dtype;
    e->ndim = ndim;
    for (int d = 0; d < ndim; d++) e->shape[d] = shape[d];
    e->nbytes = (size_t)bytes;
    e->data = data;
    e->fill = fill;
    e->ctx = ctx;
    w->n_entries++;
    return STATUS_OK;
}

enum status safetensors_writer_add(struct safetensors_writer *w, const char *name,
                                   enum dtype dtype, int ndim, const int64_t *shape,
                                   const void *data)
{
    return st_writer_push(w, name, dtype, ndim, shape, data, NULL, NULL);
}

enum status safetensors_writer_add_deferred(struct safetensors_writer *w, const char *name,
                                            enum dtype dtype, int ndim, const int64_t *shape,
                                            safetensors_fill_fn fill, void *ctx)
{
    CHECK(fill, "add_deferred needs a fill function");
    return st_writer_push(w, name, dtype, ndim, shape, NULL, fill, ctx);
}

enum status safetensors_writer_set_metadata(struct safetensors_writer *w, const char *key,
                                            const char *value)
{
    for (int i = 0; i < w->n_meta; i++) {
        if (!strcmp(w->meta[i].key, key)) {
            char *v = strdup(value);
            if (!v) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            free(w->meta[i].value);
            w->meta[i].value = v;
            return STATUS_OK;
        }
    }
    if (w->n_meta == w->cap_meta) {
        int cap = w->cap_meta ? 2 * w->cap_meta : 8;
        struct st_meta *m = realloc(w->meta, (size_t)cap * sizeof *m);
        if (!m) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        w->meta = m;
        w->cap_meta = cap;
    }
    struct st_meta *m = &w->meta[w->n_meta];
    m->key = strdup(key);
    m->value = strdup(value);
    if (!m->key || !m->value) {
        free(m->key);
        free(m->value);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    w->n_meta++;
    return STATUS_OK;
}

/* Data order: larger elements first (stable), so each tensor stays aligned to its element size
 * given an 8-aligned data section. */
static int st_cmp_entry(const void *a, const void *b)
{
    const struct st_entry *const *x = a, *const *y = b;
    size_t sx = dtype_size((*x)->dtype), sy = dtype_size((*y)->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return *x < *y ? -1 : *x > *y;
}

enum status safetensors_writer_finish(struct safetensors_writer *w)
{
    enum status s = STATUS_OK;
    struct st_buf h = {0};
    struct st_entry **order = NULL;
    void *scratch = NULL;
    size_t scratch_size = 0;

    order = malloc(((size_t)w->n_entries + 1) * sizeof *order);
    if (!order) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", w->path);
        goto out;
    }
    for (int i = 0; i < w->n_entries; i++) order[i] = &w->entries[i];
    qsort(order, (size_t)w->n_entries, sizeof *order, st_cmp_entry);

    buf_puts(&h, "{");
    if (w->n_meta) {
        buf_puts(&h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) buf_puts(&h, ",");
            buf_json_string(&h, w->meta[i].key);
            buf_puts(&h, ":");
            buf_json_string(&h, w->meta[i].value);
        }
        buf_puts(&h, "}");
    }
    uint64_t offset = 0;
    for (int i = 0; i < w->n_entries; i++) {
        struct st_entry *e = order[i];
        e->begin = offset;
        offset += e->nbytes;
        if (i || w->n_meta) buf_puts(&h, ",");
        buf_json_string(&h, e->name);
        buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_string(e->dtype));
        for (int d = 0; d < e->ndim; d++) buf_printf(&h, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        buf_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)e->begin,
                   (unsigned long long)offset);
    }
    buf_puts(&h, "}");
    while (!h.failed && h.len % 8) buf_puts(&h, " ");
    if (h.failed) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for the header", w->path);
        goto out;
    }
    if (h.len >= ST_MAX_HEADER_SIZE) {
        s = status_errorf(STATUS_INVALID_ARGUMENT, "%s: header of %zu bytes is too large", w->path,
                          h.len);
        goto out;
    }

    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)h.len >> (8 * i));
    if (fwrite(len8, 1, 8, w->f) != 8 || fwrite(h.p, 1, h.len, w->f) != h.len) goto io_error;
    for (int i = 0; i < w->n_entries; i++) {
        struct st_entry *e = order[i];
        const void *bytes = e->data;
        if (e->fill && e->nbytes) {
            if (e->nbytes > scratch_size) {
                free(scratch);
                scratch_size = (e->nbytes + 63) & ~(size_t)63;
                scratch = aligned_alloc(64, scratch_size);
                if (!scratch) {
                    scratch_size = 0;
                    s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for tensor '%s'",
                                      w->path, e->name);
                    goto out;
                }
            }
            if ((s = e->fill(e->ctx, scratch, e->nbytes))) goto out;
            bytes = scratch;
        }
        if (e->nbytes && fwrite(bytes, 1, e->nbytes, w->f) != e->nbytes) goto io_error;
    }
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) goto io_error;
    int rc = fclose(w->f);
    w->f = NULL;
    if (rc != 0) {
        remove(w->tmp);
        goto io_error;
    }
    if (rename(w->tmp, w->path) != 0) {
        s = status_errorf(STATUS_IO, "rename %s -> %s: %s", w->tmp, w->path, strerror(errno));
        remove(w->tmp);
        goto out;
    }
    goto out;
io_error:
    s = status_errorf(STATUS_IO, "%s: write failed: %s", w->tmp, strerror(errno));
out:
    free(scratch);
    free(order);
    free(h.p);
    safetensors_writer_free(w); /* removes path.tmp when it is still open */
    return s;
}
