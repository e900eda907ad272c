/* server/reflection.h - the index behind grpc.reflection.v1alpha: the FileDescriptorSet that
 * protos/CMakeLists.txt compiles into the binary, split into its files, with every service and
 * fully-qualified symbol (messages, nested messages, enums, services, methods) they define.
 * Not here: the bidirectional call itself (call.c, methods.c) and the reflection messages (convert.c).
 * Tests: tests/server/test_server.py (reflection lists the service and resolves its file). */
#ifndef SHARDLM_REFLECTION_H
#define SHARDLM_REFLECTION_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "convert.h"

struct reflection;

/* Parses the embedded descriptor set. STATUS_BAD_FORMAT if it does not parse (a build bug). */
enum status reflection_init(struct reflection **out);
void        reflection_free(struct reflection *r); /* accepts NULL */

#define REFLECTION_MAX_FILES 32

/* Storage for one answer; a->... points into it and into r, valid until the next answer on
 * the same storage or reflection_free. */
struct reflection_answer_buf {
    const uint8_t *files[REFLECTION_MAX_FILES];
    size_t         lens[REFLECTION_MAX_FILES];
    char           message[256];
};

/* Answers q: the service list, the requested file with its transitive imports (the file
 * first), or an error (NOT_FOUND for unknown files, symbols and for extensions, which no
 * shardlm file defines; INVALID_ARGUMENT for an empty request). */
void reflection_answer(const struct reflection *r, const struct reflection_query *q, struct reflection_answer *a,
                       struct reflection_answer_buf *buf);

#endif
