/* kernels/base/pbwire.h - the protobuf wire format's primitives, the one implementation for
 * every file that reads or writes protobuf bytes by hand (server/wire.c's duplicate-field
 * merge, server/reflection.c's descriptor reading, server/convert.c's NUL-safe text fields,
 * engine/formats/gguf_tokenizer.c's SentencePiece model): varints and field headers. Messages
 * as a whole are protobuf-c's.
 * Tests: tests/test_server.py reflection and merge groups, the fuzz targets over gRPC bodies,
 * tests/test_gguf.c (the tokenizer proto SentencePiece loads). */
#ifndef SHARDLM_PBWIRE_H
#define SHARDLM_PBWIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base.h"

enum {
    PB_WIRE_VARINT = 0,
    PB_WIRE_64BIT = 1,
    PB_WIRE_LEN = 2,
    PB_WIRE_32BIT = 5,
    PB_VARINT_MAX_BYTES = 10,
};
#define PB_MAX_FIELD_NUMBER ((1u << 29) - 1)

/* Bytes of v as a varint. */
static inline size_t pb_varint_size(uint64_t v)
{
    size_t n = 1;
    for (; v >= 0x80; v >>= 7) n++;
    return n;
}

/* Writes v as a varint at p (room for pb_varint_size(v) <= 10 bytes); returns the end. */
static inline uint8_t *pb_put_varint(uint8_t *p, uint64_t v)
{
    for (; v >= 0x80; v >>= 7) *p++ = (uint8_t)(v | 0x80);
    *p++ = (uint8_t)v;
    return p;
}

/* The tag of field `number` with wire type `wire`. */
static inline uint64_t pb_tag(uint32_t number, int wire) { return (uint64_t)number << 3 | (uint64_t)wire; }

/* Reads a varint at p[*at..len) into *v and moves *at past it; -1 when it runs past len or
 * past 10 bytes. */
static inline int pb_read_varint(const uint8_t *p, size_t len, size_t *at, uint64_t *v)
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

/* One field of a message: its tag at data[start], its payload data[payload..end) (for varints
 * and fixed-size values too: the bytes after the tag; for length-delimited ones the bytes after
 * the length). */
struct pb_field {
    uint32_t number;
    int      wire_type; /* PB_WIRE_* */
    size_t   start, payload, end;
};

/* Reads the field at data[*at..len) and moves *at past it; -1 when the bytes are not a field
 * (a field number of 0 or past 2^29 - 1, a wire type other than the four above: groups
 * included, a length past the end). */
static inline int pb_next_field(const uint8_t *data, size_t len, size_t *at, struct pb_field *f)
{
    uint64_t tag, n = 0;
    f->start = *at;
    if (pb_read_varint(data, len, at, &tag) || tag >> 3 == 0 || tag >> 3 > PB_MAX_FIELD_NUMBER) return -1;
    f->number = (uint32_t)(tag >> 3);
    f->wire_type = (int)(tag & 7);
    f->payload = *at;
    switch (f->wire_type) {
    case PB_WIRE_VARINT:
        if (pb_read_varint(data, len, at, &n)) return -1;
        f->end = *at;
        return 0;
    case PB_WIRE_64BIT: n = 8; break;
    case PB_WIRE_32BIT: n = 4; break;
    case PB_WIRE_LEN:
        if (pb_read_varint(data, len, at, &n)) return -1;
        break;
    default: return -1;
    }
    if (n > len - *at) return -1;
    f->payload = *at;
    *at += (size_t)n;
    f->end = *at;
    return 0;
}

/* ---- writing into a growable buffer ----------------------------------------------------------- */

/* The bytes written so far; oom latches the first allocation failure (later writes do nothing). */
struct pb_buf {
    uint8_t *p;
    size_t   n, cap;
    int      oom;
};

static inline void pb_buf_bytes(struct pb_buf *b, const void *src, size_t n)
{
    if (b->oom || !n) return;
    if (n > SIZE_MAX - b->n || base_grow((void **)&b->p, &b->cap, b->n + n, 1)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static inline void pb_buf_varint(struct pb_buf *b, uint64_t v)
{
    uint8_t t[PB_VARINT_MAX_BYTES];
    pb_buf_bytes(b, t, (size_t)(pb_put_varint(t, v) - t));
}

/* A length-delimited field: tag, length, the n bytes of s. */
static inline void pb_buf_len_field(struct pb_buf *b, uint32_t number, const void *s, size_t n)
{
    pb_buf_varint(b, pb_tag(number, PB_WIRE_LEN));
    pb_buf_varint(b, n);
    pb_buf_bytes(b, s, n);
}

#endif
