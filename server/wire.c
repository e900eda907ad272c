/* server/wire.c - request bytes read in the protobuf wire format before protobuf-c unpacks them
 * (see wire.h for why): strings holding U+0000 are refused by name.
 * Not here: unpacking (convert.c). Tests: tests/server/test_server.py (nul_in). */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Messages nest at most this deep (the API's nest 3 deep); deeper bytes are left to protobuf-c. */
#define WIRE_MAX_DEPTH 32
#define WIRE_MAX_FIELD_NUMBER ((1u << 29) - 1)

/* One field of a message: its tag at data[start], its payload data[payload..end) (for varints
 * and fixed-size values too: the bytes after the tag). */
struct wire_field {
    uint32_t number;
    int      wire_type; /* PROTOBUF_C_WIRE_TYPE_* */
    size_t   start, payload, end;
};

static int read_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *at < len; shift += 7) {
        uint8_t b = p[(*at)++];
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return 0;
        }
    }
    return -1;
}

/* Reads the field at data[*at..len) and moves *at past it; -1 when the bytes are not a field
 * (protobuf-c refuses them, groups included). */
static int next_field(const uint8_t *data, size_t len, size_t *at, struct wire_field *f)
{
    uint64_t tag, n = 0;
    f->start = *at;
    if (read_varint(data, len, at, &tag) || tag >> 3 == 0 || tag >> 3 > WIRE_MAX_FIELD_NUMBER) return -1;
    f->number = (uint32_t)(tag >> 3);
    f->wire_type = (int)(tag & 7);
    f->payload = *at;
    switch (f->wire_type) {
    case PROTOBUF_C_WIRE_TYPE_VARINT:
        if (read_varint(data, len, at, &n)) return -1;
        f->end = *at;
        return 0;
    case PROTOBUF_C_WIRE_TYPE_64BIT: n = 8; break;
    case PROTOBUF_C_WIRE_TYPE_32BIT: n = 4; break;
    case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
        if (read_varint(data, len, at, &n)) return -1;
        break;
    default: return -1;
    }
    if (n > len - *at) return -1;
    f->payload = *at;
    *at += n;
    f->end = *at;
    return 0;
}

/* The field descriptor of a length-delimited field, or NULL (unknown, or not length-delimited:
 * protobuf-c checks the wire type of known fields itself). */
static const ProtobufCFieldDescriptor *len_field(const ProtobufCMessageDescriptor *d, const struct wire_field *f)
{
    if (f->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED) return NULL;
    return protobuf_c_message_descriptor_get_field(d, (unsigned)f->number);
}

/* How many fields numbered `number` come before data[before]: the index of a repeated field's
 * element, counted only on the error path. */
static size_t occurrence(const uint8_t *data, size_t before, uint32_t number)
{
    size_t k = 0;
    struct wire_field f;
    for (size_t at = 0; at < before && !next_field(data, before, &at, &f);) k += f.number == number;
    return k;
}

/* 1 when a string field of the message in data[0..len) (message type d), or of a message inside
 * it, holds a NUL; path[0..cap) then names it ("messages[2].content"). 0 otherwise, and for
 * bytes that are not a message. */
static int find_nul(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, int depth, char *path,
                    size_t cap)
{
    struct wire_field f;
    for (size_t at = 0; at < len;) {
        if (next_field(data, len, &at, &f)) return 0;
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

enum status wire_prepare(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, uint8_t **out,
                         size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    char path[256];
    if (find_nul(d, data, len, 0, path, sizeof path))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s must not contain U+0000 (NUL)", path);
    return STATUS_OK;
}
