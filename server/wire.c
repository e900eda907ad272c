/* server/wire.c - request bytes read in the protobuf wire format before protobuf-c unpacks them
 * (see wire.h for why): singular message fields sent more than once are merged into one
 * occurrence, then strings holding U+0000 are refused by name.
 * Not here: unpacking (convert.c). Tests: tests/server/test_server.py (nul_in, merge). */
#include "pbwire.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages nest at most this deep (the API's nest 3 deep); deeper bytes are left to protobuf-c. */
#define WIRE_MAX_DEPTH 32

/* The field descriptor of a length-delimited field, or NULL (unknown, or not length-delimited:
 * protobuf-c checks the wire type of known fields itself). */
static const ProtobufCFieldDescriptor *len_field(const ProtobufCMessageDescriptor *d, const struct pb_field *f)
{
    if (f->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) return NULL;
    return protobuf_c_message_descriptor_get_field(d, (unsigned)f->number);
}

/* How many fields numbered `number` come before data[before]: the index of a repeated field's
 * element, counted only on the error path. */
static size_t occurrence(const uint8_t *data, size_t before, uint32_t number)
{
    size_t k = 0;
    struct pb_field f;
    for (size_t at = 0; at < before && !pb_next_field(data, before, &at, &f);) k += f.number == number;
    return k;
}

/* 1 when a string field of the message in data[0..len) (message type d), or of a message inside
 * it, holds a NUL; path[0..cap) then names it ("messages[2].content"). 0 otherwise, and for
 * bytes that are not a message. */
static int find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, int depth, char *path,
                    size_t cap)
{
    struct pb_field f;
    for (size_t at = 0; at < len;) {
        if (pb_next_field(data, len, &at, &f)) return 0;
        const ProtobufCFieldDescriptor *fd = len_field(d, &f);
        if (!fd) continue;
        const uint8_t *p = data + f.payload;
        size_t n = f.end - f.payload;
        char inner[256] = "";
        int bad = 0;
        if (fd->type == PROTOBUF_C_TYPE_STRING) bad = memchr(p, 0, n) != NULL;
        else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && depth < WIRE_MAX_DEPTH)
            bad = find_nul(fd->descriptor, p, n, depth + 1, inner, sizeof inner);
        if (!bad) continue;
        const char *dot = inner[0] ? "." : "";
        if (fd->label == PROTOBUF_C_LABEL_REPEATED)
            snprintf(path, cap, "%s[%zu]%s%s", fd->name, occurrence(data, f.start, f.number), dot, inner);
        else
            snprintf(path, cap, "%s%s%s", fd->name, dot, inner);
        return 1;
    }
    return 0;
}

/* ---- merging --------------------------------------------------------------------------------- */

static int is_singular_message(const ProtobufCFieldDescriptor *fd)
{
    return fd && fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED;
}

/* 1 when a and b are distinct members of one oneof (protobuf-c: same case field). */
static int same_oneof(const ProtobufCFieldDescriptor *a, const ProtobufCFieldDescriptor *b)
{
    return a != b && (a->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && (b->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
           a->quantifier_offset == b->quantifier_offset;
}

/* 1 when a singular message field occurs more than once in the message data[0..len) of type d,
 * or in a message within it (also 1 when out of memory: merge_into then reports it). */
static int needs_merge(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, int depth)
{
    if (depth >= WIRE_MAX_DEPTH) return 0;
    unsigned char *seen = calloc(d->n_fields + 1, 1); /* by field index */
    if (!seen) return 1;
    int need = 0;
    struct pb_field f;
    for (size_t at = 0; at < len && !need;) {
        if (pb_next_field(data, len, &at, &f)) break;
        const ProtobufCFieldDescriptor *fd = len_field(d, &f);
        if (!fd || fd->type != PROTOBUF_C_TYPE_MESSAGE) continue;
        if (is_singular_message(fd) && seen[fd - d->fields]++) need = 1;
        else need = needs_merge(fd->descriptor, data + f.payload, f.end - f.payload, depth + 1);
    }
    free(seen);
    return need;
}

static void merge_into(struct pb_buf *b, const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                       int depth);

/* Appends field `number` holding the message data[0..len) of type d, merged within. */
static void put_message_field(struct pb_buf *b, uint32_t number, const ProtobufCMessageDescriptor *d,
                              const uint8_t *data, size_t len, int depth)
{
    struct pb_buf m = {0};
    merge_into(&m, d, data, len, depth);
    pb_buf_len_field(b, number, m.p, m.n);
    b->oom |= m.oom;
    free(m.p);
}

/* Appends the message data[0..len) of type d to b with each singular message field once, where
 * it last occurs, holding the concatenation of its occurrences' payloads (what the spec
 * defines merging to be), merged again within. An occurrence of another member of the same
 * oneof in between ends a run: protobuf clears a oneof when its member changes, so the earlier
 * run stays as it is (and is replaced on unpacking). Other fields are copied as they are. */
static void merge_into(struct pb_buf *b, const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len,
                       int depth)
{
    struct pb_field f;
    size_t n = 0;
    int ok = depth < WIRE_MAX_DEPTH;
    for (size_t at = 0; ok && at < len; n++) ok = !pb_next_field(data, len, &at, &f);
    if (!ok) {
        pb_buf_bytes(b, data, len); /* too deep, or not a message: protobuf-c judges it */
        return;
    }
    const size_t NONE = (size_t)-1;
    struct pb_field *fs = malloc((n + 1) * sizeof *fs);
    size_t *first = malloc((n + 1) * sizeof *first);         /* the first occurrence of the run */
    size_t *next = malloc((n + 1) * sizeof *next);           /* the next occurrence of the run */
    size_t *last = malloc((d->n_fields + 1) * sizeof *last); /* by field index: the open run's latest */
    if (!fs || !first || !next || !last) {
        b->oom = 1;
        goto out;
    }
    for (unsigned k = 0; k < d->n_fields; k++) last[k] = NONE;
    n = 0;
    for (size_t at = 0; at < len; n++) {
        pb_next_field(data, len, &at, &fs[n]);
        const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field(d, fs[n].number);
        first[n] = n;
        next[n] = NONE;
        if (fd && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) /* any member, a scalar one too */
            for (unsigned k = 0; k < d->n_fields; k++)
                if (same_oneof(fd, &d->fields[k])) last[k] = NONE;
        if (!is_singular_message(fd) || fs[n].wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) continue;
        size_t k = (size_t)(fd - d->fields);
        if (last[k] != NONE) {
            first[n] = first[last[k]];
            next[last[k]] = n;
        }
        last[k] = n;
    }
    for (size_t i = 0; i < n && !b->oom; i++) {
        const struct pb_field *x = &fs[i];
        const ProtobufCFieldDescriptor *fd = len_field(d, x);
        if (!fd || fd->type != PROTOBUF_C_TYPE_MESSAGE) {
            pb_buf_bytes(b, data + x->start, x->end - x->start);
        } else if (next[i] == NONE && first[i] == i) {
            put_message_field(b, x->number, fd->descriptor, data + x->payload, x->end - x->payload, depth + 1);
        } else if (next[i] == NONE) { /* the last of a run: all of it, here */
            struct pb_buf run = {0};
            for (size_t j = first[i]; j != NONE; j = next[j]) pb_buf_bytes(&run, data + fs[j].payload, fs[j].end - fs[j].payload);
            put_message_field(b, x->number, fd->descriptor, run.p, run.n, depth + 1);
            b->oom |= run.oom;
            free(run.p);
        }
    }
out:
    free(fs);
    free(first);
    free(next);
    free(last);
}

enum status wire_prepare(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, uint8_t **out,
                         size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (needs_merge(d, data, len, 0)) {
        struct pb_buf b = {0};
        merge_into(&b, d, data, len, 0);
        if (b.oom) {
            free(b.p);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory merging a %s", d->name);
        }
        *out = b.p ? b.p : malloc(1);
        *out_len = b.n;
        data = *out;
        len = *out_len;
        if (!data) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory merging a %s", d->name);
    }
    /* After merging, so that the indices of repeated fields are those the engine sees. */
    char path[256];
    if (find_nul(d, data, len, 0, path, sizeof path)) {
        free(*out);
        *out = NULL;
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s must not contain U+0000 (NUL)", path);
    }
    return STATUS_OK;
}
