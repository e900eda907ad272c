/* server/convert_impl.h - private to server/convert.c and server/convert_admin.c: the
 * protobuf-c helpers both use. */
#ifndef SHARDLM_CONVERT_IMPL_H
#define SHARDLM_CONVERT_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "base.h"

/* STATUS_RESOURCE_EXHAUSTED, "out of memory". */
enum status convert_oom(void);
/* Unpacks data[0..len) as a message of type d (named `type` in the error, d's name when NULL),
 * after wire_prepare: a string holding a NUL is refused by name, a singular message field sent
 * twice is merged as the spec says. NULL with *st set on error. Free the message with
 * protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *convert_unpack(const ProtobufCMessageDescriptor *d, const void *data, size_t len,
                                 const char *type, enum status *st);
/* Packs any message into a malloc'd buffer. */
enum status convert_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len);

#endif
