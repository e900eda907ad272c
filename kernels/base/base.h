/* kernels/base/base.h - what every shardlm file may use: the status enum that carries errors a user
 * or the outside world can cause, CHECK for bugs, and level-filtered logging.
 * Not here: anything about tensors (tensor.h) or ops (ops.h).
 * Tests: tests/test_ops.c uses CHECK and status through every op. */
#ifndef SHARDLM_BASE_H
#define SHARDLM_BASE_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors a user, a file or a peer can cause. Values reach the wire through the server's one
 * mapping table, so they are only ever appended. */
enum status {
    STATUS_OK = 0,
    STATUS_INVALID_ARGUMENT,   /* a bad request field, flag or parameter */
    STATUS_NOT_FOUND,          /* a missing file, tensor or id */
    STATUS_BAD_FORMAT,         /* a corrupt, truncated or inconsistent file */
    STATUS_UNSUPPORTED,        /* a well-formed input this build cannot handle */
    STATUS_RESOURCE_EXHAUSTED, /* out of memory, pool or queue */
    STATUS_UNAVAILABLE,        /* a device or service that is not there */
    STATUS_IO,                 /* an operating-system I/O failure */
    STATUS_INTERNAL,           /* a failure we could not attribute (a library said no) */
    STATUS_CANCELLED,
    STATUS_DEADLINE_EXCEEDED,
    STATUS_ALREADY_EXISTS,     /* a name that is taken (an adapter loaded twice) */
    STATUS_FAILED_PRECONDITION,/* not now, in this state (an adapter that requests still use) */
};

/* Records a message for the calling thread and returns s, so that error paths read
 * `return status_errorf(STATUS_BAD_FORMAT, "%s: header truncated", path);`. */
enum status status_errorf(enum status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The calling thread's last message set by status_errorf ("" when none). Valid until the next
 * status_errorf on the same thread. */
const char *status_message(void);
const char *status_name(enum status s);

/* CHECK: a broken invariant is a bug. Aborts with file:line in every build type. */
#define CHECK(cond, ...)                                                                    \
    do {                                                                                    \
        if (!(cond)) base_check_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);               \
    } while (0)
void base_check_fail(const char *file, int line, const char *cond, const char *fmt,
                               ...) __attribute__((noreturn, format(printf, 4, 5)));

/* Strict parsing of numbers from flags and config text: the whole string must parse (no
 * trailing characters, no overflow) and an integer must lie in [lo, hi]. Return 0 and set *out,
 * or return -1 and leave *out alone. */
int base_parse_long(const char *s, long lo, long hi, long *out);
int base_parse_float(const char *s, float *out);

/* FNV-1a, 64 bits: h (BASE_FNV1A_BASIS to start, or an earlier result to go on) folded with the
 * bytes p[0..n) or the string s. The project's one non-cryptographic hash of names, texts and
 * files' bodies (checksums against damage, never against an adversary). Some older callers start
 * from 1469598103934665603 (a digit short of the basis): what they hash is persisted or shown,
 * so they keep it. */
#define BASE_FNV1A_BASIS 14695981039346656037ull
static inline uint64_t base_fnv1a(uint64_t h, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}
static inline uint64_t base_fnv1a_str(uint64_t h, const char *s)
{
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Seconds on CLOCK_MONOTONIC: deadlines, timeouts and durations everywhere (never wall time). */
double base_now_s(void);

/* Grows a heap array so that it holds at least `need` elements of `elem` bytes: when *cap is
 * smaller, *p is reallocated to max(need, 2 * *cap, 16) elements (contents kept, new elements
 * uninitialised) and *cap updated. The one growth helper of the project (buffers, lists,
 * queues). Returns 0, or -1 on overflow or out of memory with *p and *cap unchanged (the
 * caller turns that into STATUS_RESOURCE_EXHAUSTED). */
int base_grow(void **p, size_t *cap, size_t need, size_t elem);

/* Opens path for reading and returns its descriptor in *fd (the caller closes it) and, when st
 * is not NULL, its fstat. Only a regular file is accepted: the open never blocks (O_NONBLOCK,
 * cleared once the file is known to be regular), so that a FIFO or a device named by a user
 * cannot stop the calling thread; anything else is STATUS_BAD_FORMAT ("PATH: not a regular file
 * (a FIFO)"). A missing file is STATUS_NOT_FOUND ("PATH: no such file"), other failures
 * STATUS_IO with the system's reason. The one way the project opens a file it reads (every
 * reader below, safetensors, GGUF, llama2.c checkpoints). */
struct stat;
enum status base_open_file(const char *path, int *fd, struct stat *st);

/* The length of the longest prefix of s[0..len) that is valid UTF-8 (no overlongs, no
 * surrogates, nothing above U+10FFFF; a sequence cut off by len is invalid): len when all of it
 * is. The one UTF-8 rule of the project (the server's request checks, the training data). */
size_t base_utf8_valid_prefix(const char *s, size_t len);

/* Reads the whole file at path into *text (malloc'd, NUL-terminated, the caller frees) and its
 * length into *len (may be NULL), opened by base_open_file (its errors). A file over max_bytes
 * (0: no limit) is STATUS_BAD_FORMAT ("PATH: more than N bytes, not a plausible <what>"); other
 * failures STATUS_IO or STATUS_RESOURCE_EXHAUSTED. The one file reader of the project (configs,
 * JSON, data, key files). */
enum status base_read_file(const char *path, size_t max_bytes, const char *what, char **text, size_t *len);
/* The same from fd (closed here, whatever happens), opened by base_open_file on path (named in
 * the errors): a caller that must find the file under a lock reads it after the lock. */
enum status base_read_fd(int fd, const char *path, size_t max_bytes, const char *what, char **text, size_t *len);

/* The directory of a file's path into out (cap bytes): "dir/name" -> "dir", "/name" -> "/",
 * "name" -> ".". */
void base_dir_of(const char *path, char *out, size_t cap);

/* A file written whole or not at all: a temporary of its own beside path (mkstemp, so that two
 * processes writing the same path never write into each other's), given `mode`, synced and
 * renamed over path by base_atomic_commit (the directory synced too), so that a reader, a crash or
 * a power cut sees the old file or the new one, never a part. base_atomic_abort removes the
 * temporary (commit does on failure). Errors: STATUS_IO naming the file. */
struct base_atomic {
    int  fd;
    char path[4096], tmp[4096 + 8];
};
enum status base_atomic_open(struct base_atomic *a, const char *path, unsigned mode);
enum status base_atomic_write(struct base_atomic *a, const void *data, size_t n);
enum status base_atomic_commit(struct base_atomic *a);
void        base_atomic_abort(struct base_atomic *a);

/* Writes data[0..n) to path with the given mode through base_atomic_*; base_write_text writes a
 * NUL-terminated text and a newline after it (JSON files). */
enum status base_write_file(const char *path, const void *data, size_t n, unsigned mode);
enum status base_write_text(const char *path, const char *text, unsigned mode);
/* Copies the file at from (opened by base_open_file: a regular file only) to `to` (mode 0644)
 * through base_atomic_*. Errors: base_open_file's, STATUS_IO naming the file. */
enum status base_copy_file(const char *from, const char *to);

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* The threshold is read once from SHARDLM_LOG (debug|info|warn|error, default info) and may be
 * changed by log_set_level; it is a process-wide setting, not model state. */
void log_set_level(enum log_level level);
int  log_enabled(enum log_level level);
void log_write(enum log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG(module, ...) \
    do { if (log_enabled(LOG_LEVEL_DEBUG)) log_write(LOG_LEVEL_DEBUG, module, __VA_ARGS__); } while (0)
#define LOG_INFO(module, ...) \
    do { if (log_enabled(LOG_LEVEL_INFO)) log_write(LOG_LEVEL_INFO, module, __VA_ARGS__); } while (0)
#define LOG_WARN(module, ...) \
    do { if (log_enabled(LOG_LEVEL_WARN)) log_write(LOG_LEVEL_WARN, module, __VA_ARGS__); } while (0)
#define LOG_ERROR(module, ...) \
    do { if (log_enabled(LOG_LEVEL_ERROR)) log_write(LOG_LEVEL_ERROR, module, __VA_ARGS__); } while (0)

#ifdef __cplusplus
}
#endif

#endif
