/* server/wire.h - request bytes read in the protobuf wire format before protobuf-c unpacks them,
 * for what protobuf-c (1.4, Debian 12's; 1.5 is the same) cannot be trusted with:
 *
 *  - Strings. protobuf-c hands a `string` field over as a NUL-terminated char * and drops its
 *    length, so a string holding U+0000 (valid UTF-8, valid in proto3) would silently end at
 *    the NUL. The server does not take NUL in request strings: it refuses them here, naming
 *    the field, while the wire length is still known.
 *  - Merging. A singular message field that occurs more than once must merge (the protobuf
 *    spec: as if the occurrences' bytes were concatenated). protobuf-c's merge_messages fails
 *    the whole unpack when the copies leave a oneof unset (every proto3 `optional` is a oneof
 *    for protoc-c: it looks up field number 0), and when it does not fail it loses proto3
 *    scalars that only the earlier copy set; a oneof member sent twice is replaced, not
 *    merged. The bytes are rewritten here so that each
 *    singular message field occurs once, with the concatenation of its occurrences as payload
 *    (recursively), and protobuf-c never merges.
 *
 * Fields are found through the generated descriptors, so this works for every message. Bytes
 * that are not a well-formed message are passed on untouched for protobuf-c to refuse.
 * Not here: unpacking and everything field-specific (convert.c, which with this file is the
 * only code that sees protobuf-c). Tests: tests/server/test_server.py (nul_in, merge). */
#ifndef SHARDLM_WIRE_H
#define SHARDLM_WIRE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

/* Prepares data[0..len), a message of type d, for protobuf_c_message_unpack. On success *out is
 * NULL when the bytes can be unpacked as they are, or a malloc'd rewrite of *out_len bytes
 * (the caller frees it) with every singular message field merged into one occurrence.
 * STATUS_INVALID_ARGUMENT when a string field holds a NUL, with a message naming the field as
 * the API does ("messages[2].content must not contain U+0000 (NUL)");
 * STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status wire_prepare(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, uint8_t **out,
                         size_t *out_len);

#endif
