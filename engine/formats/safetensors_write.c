/* engine/formats/safetensors_write.c - the safetensors writer: tensors added by pointer or by a
 * fill callback, written in one pass through a temporary of its own beside PATH (base_atomic_*:
 * synced, renamed into place, the directory synced); ggml block tensors
 * as U8 with their types in __metadata__ (see safetensors.h for the contracts).
 * Not here: the reader (safetensors.c), which tensors a checkpoint holds (checkpoint_write.c).
 * Tests: tests/test_formats.c (round trip, metadata, alignment of the data);
 * tests/test_keep_blocks.c (block tensors). */
#include "safetensors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "quant.h"

static const char *st_dtype_string(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return "F32";
    case DTYPE_BF16: return "BF16";
    case DTYPE_F16: return "F16";
    case DTYPE_I32: return "I32";
    default: break;
    }
    return "U8"; /* block dtypes: their bytes, named in SAFETENSORS_BLOCKS_KEY */
}

/* The alignment a tensor's data keeps in the file (st_cmp_entry): its element size, 2 for
 * blocks (quant.h), 1 for MXFP4's 17-byte blocks (so that they sort last: an odd-sized one
 * before them would move every 2-aligned tensor off its alignment). */
static size_t st_align(enum dtype t)
{
    return t == DTYPE_MXFP4 ? 1 : dtype_is_quant(t) ? 2 : dtype_size(t);
}

/* Bytes of a tensor of dtype and shape, or 0 with *bad set when they do not fit or a block
 * tensor is not [rows, cols] of whole blocks. */
static uint64_t st_tensor_bytes(enum dtype dtype, int ndim, const int64_t *shape, int *bad)
{
    uint64_t bytes = 1;
    *bad = 0;
    if (dtype_is_quant(dtype)) {
        const int bs = quant_block_size(dtype_quant_type(dtype));
        *bad = ndim != 2 || shape[0] < 0 || shape[1] < 0 || shape[1] % bs;
        if (*bad) return 0;
        bytes = quant_row_bytes((enum quant_type)dtype_quant_type(dtype), shape[1]);
        *bad = __builtin_mul_overflow(bytes, (uint64_t)shape[0], &bytes);
        return bytes;
    }
    bytes = dtype_size(dtype);
    for (int d = 0; d < ndim && !*bad; d++)
        *bad = shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes);
    return bytes;
}

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

struct st_meta {
    char *key, *value;
};

struct safetensors_writer {
    char            *path;
    struct base_atomic at; /* the file being written; f writes through a dup of its fd */
    FILE            *f;
    struct st_entry *entries;    /* (n_entries), in the order added */
    int              n_entries;
    size_t           cap_entries;
    struct st_meta  *meta;       /* (n_meta) */
    int              n_meta;
    size_t           cap_meta;
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
    if (n > SIZE_MAX - 1 - b->len || base_grow((void **)&b->p, &b->cap, b->len + n + 1, 1)) {
        b->failed = 1;
        return;
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
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    }
    if ((s = base_atomic_open(&w->at, path, 0644)) != STATUS_OK) {
        free(w->path);
        free(w);
        return s;
    }
    const int fd = dup(w->at.fd);
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        s = status_errorf(STATUS_IO, "%s: %s", w->at.tmp, strerror(errno));
        if (fd >= 0) close(fd);
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
    if (w->f) fclose(w->f);
    base_atomic_abort(&w->at); /* a no-op once committed */
    for (int i = 0; i < w->n_entries; i++) free(w->entries[i].name);
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta[i].key);
        free(w->meta[i].value);
    }
    free(w->entries);
    free(w->meta);
    free(w->path);
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
    int bad;
    uint64_t bytes = st_tensor_bytes(dtype, ndim, shape, &bad);
    if (bad)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s': bad shape%s", w->path, name,
                             dtype_is_quant(dtype) ? " (blocks are [rows, cols of whole blocks])" : "");
    if (!data && !fill && bytes)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s': no data", w->path, name);
    for (int i = 0; i < w->n_entries; i++)
        if (!strcmp(w->entries[i].name, name))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s: tensor '%s' added twice", w->path,
                                 name);
    if (base_grow((void **)&w->entries, &w->cap_entries, (size_t)w->n_entries + 1, sizeof *w->entries))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", w->path);
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
    if (!strcmp(key, SAFETENSORS_BLOCKS_KEY))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: __metadata__ key %s is written from the block tensors",
                             w->path, key);
    for (int i = 0; i < w->n_meta; i++) {
        if (!strcmp(w->meta[i].key, key)) {
            char *v = strdup(value);
            if (!v) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            free(w->meta[i].value);
            w->meta[i].value = v;
            return STATUS_OK;
        }
    }
    if (base_grow((void **)&w->meta, &w->cap_meta, (size_t)w->n_meta + 1, sizeof *w->meta))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
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

/* Dimension d of e as the header gives it: a block tensor's is [rows, row bytes]. */
static int64_t st_header_dim(const struct st_entry *e, int d)
{
    if (d != 1 || !dtype_is_quant(e->dtype)) return e->shape[d];
    return (int64_t)quant_row_bytes((enum quant_type)dtype_quant_type(e->dtype), e->shape[1]);
}

/* The value of SAFETENSORS_BLOCKS_KEY: a JSON object of each block tensor's name and ggml type
 * name, in *out (empty when the file has no block tensor). */
static enum status st_blocks_metadata(const struct safetensors_writer *w, struct st_buf *out)
{
    for (int i = 0; i < w->n_entries; i++) {
        const struct st_entry *e = &w->entries[i];
        if (!dtype_is_quant(e->dtype)) continue;
        buf_puts(out, out->len ? "," : "{");
        buf_json_string(out, e->name);
        buf_printf(out, ":\"%s\"", quant_type_name(dtype_quant_type(e->dtype)));
    }
    if (out->len) buf_puts(out, "}");
    if (out->failed) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory for the header", w->path);
    return STATUS_OK;
}

/* Data order: larger elements first (stable), so each tensor stays aligned to its element size
 * given an 8-aligned data section. */
static int st_cmp_entry(const void *a, const void *b)
{
    const struct st_entry *const *x = a, *const *y = b;
    size_t sx = st_align((*x)->dtype), sy = st_align((*y)->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return *x < *y ? -1 : *x > *y;
}

enum status safetensors_writer_finish(struct safetensors_writer *w)
{
    enum status s = STATUS_OK;
    struct st_buf h = {0}, blocks = {0};
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

    if ((s = st_blocks_metadata(w, &blocks))) goto out;
    buf_puts(&h, "{");
    if (w->n_meta || blocks.len) {
        buf_puts(&h, "\"__metadata__\":{");
        for (int i = 0; i < w->n_meta; i++) {
            if (i) buf_puts(&h, ",");
            buf_json_string(&h, w->meta[i].key);
            buf_puts(&h, ":");
            buf_json_string(&h, w->meta[i].value);
        }
        if (blocks.len) {
            if (w->n_meta) buf_puts(&h, ",");
            buf_json_string(&h, SAFETENSORS_BLOCKS_KEY);
            buf_puts(&h, ":");
            buf_json_string(&h, blocks.p);
        }
        buf_puts(&h, "}");
    }
    uint64_t offset = 0;
    for (int i = 0; i < w->n_entries; i++) {
        struct st_entry *e = order[i];
        e->begin = offset;
        offset += e->nbytes;
        if (i || w->n_meta || blocks.len) buf_puts(&h, ",");
        buf_json_string(&h, e->name);
        buf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_string(e->dtype));
        for (int d = 0; d < e->ndim; d++) buf_printf(&h, d ? ",%lld" : "%lld", (long long)st_header_dim(e, d));
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
    const int rc = fclose(w->f); /* flushes into the temporary; commit syncs and renames it */
    w->f = NULL;
    if (rc != 0) goto io_error;
    s = base_atomic_commit(&w->at);
    goto out;
io_error:
    s = status_errorf(STATUS_IO, "%s: write failed: %s", w->at.tmp, strerror(errno));
out:
    free(scratch);
    free(order);
    free(h.p);
    free(blocks.p);
    safetensors_writer_free(w); /* removes the temporary when it was not committed */
    return s;
}
