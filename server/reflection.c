/* server/reflection.c - a minimal protobuf wire reader over the embedded FileDescriptorSet:
 * enough of descriptor.proto (file name, package, dependencies, messages with their nested
 * messages and enums, enums, services with their methods) to answer reflection queries.
 * Not here: the call (call.c, methods.c), the reflection messages (convert.c).
 * Tests: tests/server/test_server.py (reflection). */
#include "reflection.h"

#include <grpc/status.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pbwire.h"
#include "proto_descriptors.h"

struct rfile {
    const uint8_t *data;  /* the serialized FileDescriptorProto, borrowed from the embedded set */
    size_t         len;
    char          *name;
    char         **deps;  /* (deps_cap), n_deps of them */
    size_t         deps_cap;
    int            n_deps;
};

struct reflection {
    struct rfile *files;    /* (files_cap), n_files of them */
    size_t        files_cap;
    int           n_files;
    char        **symbols;  /* (symbols_cap), n_symbols fully-qualified names, without the leading dot */
    int          *sym_file; /* (sym_file_cap), for each symbol its index into files */
    size_t        symbols_cap, sym_file_cap;
    int           n_symbols;
    char        **services; /* (services_cap), n_services of them */
    size_t        services_cap;
    int           n_services;
};

/* ---- wire reading ---- */

struct rd {
    const uint8_t *p, *end;
    int bad;
};

/* Reads the next field: its number, wire type, and for length-delimited fields its bytes.
 * Returns 0 at the end or on malformed input (r->bad set). */
static int rd_field(struct rd *r, int *num, int *wt, const uint8_t **data, size_t *len)
{
    if (r->bad || r->p >= r->end) return 0;
    struct pb_field f;
    size_t at = 0, n = (size_t)(r->end - r->p);
    if (pb_next_field(r->p, n, &at, &f)) {
        r->bad = 1;
        return 0;
    }
    *num = (int)f.number;
    *wt = f.wire_type;
    *data = f.wire_type == PB_WIRE_LEN ? r->p + f.payload : NULL;
    *len = f.wire_type == PB_WIRE_LEN ? f.end - f.payload : 0;
    r->p += at;
    return 1;
}

static char *dupn(const uint8_t *s, size_t n)
{
    char *t = malloc(n + 1);
    if (t) {
        memcpy(t, s, n);
        t[n] = 0;
    }
    return t;
}

/* The string field `field` of a message, malloc'd ("" when absent), or NULL on OOM. */
static char *msg_string(const uint8_t *data, size_t len, int field)
{
    struct rd r = {data, data + len, 0};
    int num, wt;
    const uint8_t *d;
    size_t n;
    const uint8_t *found = (const uint8_t *)"";
    size_t found_len = 0;
    while (rd_field(&r, &num, &wt, &d, &n))
        if (num == field && wt == 2) found = d, found_len = n;
    return dupn(found, found_len);
}

static int add_symbol(struct reflection *x, const char *prefix, const char *name, int file)
{
    size_t n = strlen(prefix) + strlen(name) + 2;
    char *s = malloc(n);
    size_t need = (size_t)x->n_symbols + 1;
    if (!s || base_grow((void **)&x->symbols, &x->symbols_cap, need, sizeof *x->symbols) ||
        base_grow((void **)&x->sym_file, &x->sym_file_cap, need, sizeof *x->sym_file)) {
        free(s);
        return -1;
    }
    snprintf(s, n, "%s%s%s", prefix, *prefix ? "." : "", name);
    x->symbols[x->n_symbols] = s;
    x->sym_file[x->n_symbols++] = file;
    return 0;
}

/* Adds a DescriptorProto (or EnumDescriptorProto when is_enum) and what it nests. */
static int add_message(struct reflection *x, const char *prefix, const uint8_t *data, size_t len, int file, int is_enum)
{
    char *name = msg_string(data, len, 1);
    if (!name || add_symbol(x, prefix, name, file)) {
        free(name);
        return -1;
    }
    const char *full = x->symbols[x->n_symbols - 1];
    free(name);
    if (is_enum) return 0;
    struct rd r = {data, data + len, 0};
    int num, wt, rc = 0;
    const uint8_t *d;
    size_t n;
    while (rc == 0 && rd_field(&r, &num, &wt, &d, &n)) {
        if (num == 3 && wt == 2) rc = add_message(x, full, d, n, file, 0);      /* nested_type */
        else if (num == 4 && wt == 2) rc = add_message(x, full, d, n, file, 1); /* enum_type */
    }
    return r.bad ? -1 : rc;
}

static int add_service(struct reflection *x, const char *prefix, const uint8_t *data, size_t len, int file)
{
    char *name = msg_string(data, len, 1);
    if (!name || add_symbol(x, prefix, name, file)) {
        free(name);
        return -1;
    }
    free(name);
    char *full = strdup(x->symbols[x->n_symbols - 1]);
    if (!full || base_grow((void **)&x->services, &x->services_cap, (size_t)x->n_services + 1, sizeof *x->services)) {
        free(full);
        return -1;
    }
    x->services[x->n_services++] = full;
    struct rd r = {data, data + len, 0};
    int num, wt, rc = 0;
    const uint8_t *d;
    size_t n;
    while (rc == 0 && rd_field(&r, &num, &wt, &d, &n))
        if (num == 2 && wt == 2) { /* method */
            char *m = msg_string(d, n, 1);
            rc = m ? add_symbol(x, full, m, file) : -1;
            free(m);
        }
    return r.bad ? -1 : rc;
}

static int add_file(struct reflection *x, const uint8_t *data, size_t len)
{
    int fi = x->n_files;
    if (base_grow((void **)&x->files, &x->files_cap, (size_t)fi + 1, sizeof *x->files)) return -1;
    struct rfile *f = &x->files[fi];
    memset(f, 0, sizeof *f);
    f->data = data;
    f->len = len;
    x->n_files++;
    char *package = msg_string(data, len, 2);
    if (!package || !(f->name = msg_string(data, len, 1))) {
        free(package);
        return -1;
    }
    struct rd r = {data, data + len, 0};
    int num, wt, rc = 0;
    const uint8_t *d;
    size_t n;
    while (rc == 0 && rd_field(&r, &num, &wt, &d, &n)) {
        if (num == 3 && wt == 2) {
            if (base_grow((void **)&f->deps, &f->deps_cap, (size_t)f->n_deps + 1, sizeof *f->deps) ||
                !(f->deps[f->n_deps] = dupn(d, n))) {
                rc = -1;
                break;
            }
            f->n_deps++;
        } else if (num == 4 && wt == 2) rc = add_message(x, package, d, n, fi, 0);
        else if (num == 5 && wt == 2) rc = add_message(x, package, d, n, fi, 1);
        else if (num == 6 && wt == 2) rc = add_service(x, package, d, n, fi);
    }
    free(package);
    return r.bad ? -1 : rc;
}

enum status reflection_init(struct reflection **out)
{
    *out = NULL;
    struct reflection *x = calloc(1, sizeof *x);
    if (!x) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "reflection: out of memory");
    struct rd r = {proto_descriptor_set, proto_descriptor_set + proto_descriptor_set_len, 0};
    int num, wt, rc = 0;
    const uint8_t *d;
    size_t n;
    while (rc == 0 && rd_field(&r, &num, &wt, &d, &n))
        if (num == 1 && wt == 2) rc = add_file(x, d, n);
    if (rc || r.bad || x->n_files == 0) {
        reflection_free(x);
        return status_errorf(STATUS_BAD_FORMAT, "reflection: the embedded descriptor set does not parse");
    }
    *out = x;
    return STATUS_OK;
}

void reflection_free(struct reflection *x)
{
    if (!x) return;
    for (int i = 0; i < x->n_files; i++) {
        free(x->files[i].name);
        for (int k = 0; k < x->files[i].n_deps; k++) free(x->files[i].deps[k]);
        free(x->files[i].deps);
    }
    free(x->files);
    for (int i = 0; i < x->n_symbols; i++) free(x->symbols[i]);
    free(x->symbols);
    free(x->sym_file);
    for (int i = 0; i < x->n_services; i++) free(x->services[i]);
    free(x->services);
    free(x);
}

static int find_file(const struct reflection *x, const char *name)
{
    for (int i = 0; i < x->n_files; i++)
        if (!strcmp(x->files[i].name, name)) return i;
    return -1;
}

/* Appends file fi and, recursively, its imports (each once). */
static void collect(const struct reflection *x, int fi, struct reflection_answer *a, struct reflection_answer_buf *b)
{
    for (int i = 0; i < a->n_files; i++)
        if (b->files[i] == x->files[fi].data) return;
    if (a->n_files == REFLECTION_MAX_FILES) return;
    b->files[a->n_files] = x->files[fi].data;
    b->lens[a->n_files++] = x->files[fi].len;
    for (int k = 0; k < x->files[fi].n_deps; k++) {
        int d = find_file(x, x->files[fi].deps[k]);
        if (d >= 0) collect(x, d, a, b);
    }
}

void reflection_answer(const struct reflection *x, const struct reflection_query *q, struct reflection_answer *a,
                       struct reflection_answer_buf *b)
{
    memset(a, 0, sizeof *a);
    a->files = b->files;
    a->file_lens = b->lens;
    int fi = -1;
    switch (q->kind) {
    case REFLECTION_QUERY_LIST_SERVICES:
        a->services = (const char *const *)x->services;
        a->n_services = x->n_services;
        return;
    case REFLECTION_QUERY_FILE_BY_FILENAME:
        fi = find_file(x, q->arg);
        if (fi < 0) snprintf(b->message, sizeof b->message, "file '%.200s' not found", q->arg);
        break;
    case REFLECTION_QUERY_FILE_CONTAINING_SYMBOL: {
        const char *s = q->arg[0] == '.' ? q->arg + 1 : q->arg;
        for (int i = 0; i < x->n_symbols && fi < 0; i++)
            if (!strcmp(x->symbols[i], s)) fi = x->sym_file[i];
        if (fi < 0) snprintf(b->message, sizeof b->message, "symbol '%.200s' not found", q->arg);
        break;
    }
    case REFLECTION_QUERY_FILE_CONTAINING_EXTENSION:
        snprintf(b->message, sizeof b->message, "no extensions of '%.200s'", q->arg);
        break;
    case REFLECTION_QUERY_EXTENSION_NUMBERS:
        a->base_type_name = q->arg; /* no shardlm message has extensions: an empty list */
        return;
    case REFLECTION_QUERY_NONE:
        a->error_code = GRPC_STATUS_INVALID_ARGUMENT;
        a->error_message = "the request sets no message_request field";
        return;
    }
    if (fi < 0) {
        a->error_code = GRPC_STATUS_NOT_FOUND;
        a->error_message = b->message;
        return;
    }
    collect(x, fi, a, b);
}
