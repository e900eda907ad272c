/* kernels/base/base.c - status messages, CHECK failure and logging (see base.h). */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char status_msg[1024];

enum status status_errorf(enum status s, const char *fmt, ...)
{
    /* Formatted apart first: callers wrap the last message, status_errorf(st, "FILE: %s",
     * status_message()), and vsnprintf's source and destination must not overlap. */
    char msg[sizeof status_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(status_msg, msg, sizeof msg);
    return s;
}

const char *status_message(void) { return status_msg; }

const char *status_name(enum status s)
{
    static const char *const names[] = {
        [STATUS_OK] = "OK",
        [STATUS_INVALID_ARGUMENT] = "INVALID_ARGUMENT",
        [STATUS_NOT_FOUND] = "NOT_FOUND",
        [STATUS_BAD_FORMAT] = "BAD_FORMAT",
        [STATUS_UNSUPPORTED] = "UNSUPPORTED",
        [STATUS_RESOURCE_EXHAUSTED] = "RESOURCE_EXHAUSTED",
        [STATUS_UNAVAILABLE] = "UNAVAILABLE",
        [STATUS_IO] = "IO",
        [STATUS_INTERNAL] = "INTERNAL",
        [STATUS_CANCELLED] = "CANCELLED",
        [STATUS_DEADLINE_EXCEEDED] = "DEADLINE_EXCEEDED",
        [STATUS_ALREADY_EXISTS] = "ALREADY_EXISTS",
        [STATUS_FAILED_PRECONDITION] = "FAILED_PRECONDITION",
    };
    if ((unsigned)s < sizeof names / sizeof names[0] && names[s]) return names[s];
    return "UNKNOWN";
}

void base_check_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    fprintf(stderr, "%s:%d: CHECK(%s) failed: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    abort();
}

int base_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int base_parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end) return -1;
    *out = v;
    return 0;
}

/* -1 means "not read from the environment yet". Racy first read is benign: every thread
 * computes the same value. */
static int log_threshold = -1;

void log_set_level(enum log_level level) { log_threshold = (int)level; }

int log_enabled(enum log_level level)
{
    if (log_threshold < 0) {
        const char *e = getenv("SHARDLM_LOG");
        int t = LOG_LEVEL_INFO;
        if (e && !strcmp(e, "debug")) t = LOG_LEVEL_DEBUG;
        else if (e && !strcmp(e, "warn")) t = LOG_LEVEL_WARN;
        else if (e && !strcmp(e, "error")) t = LOG_LEVEL_ERROR;
        log_threshold = t;
    }
    return (int)level >= log_threshold;
}

void log_write(enum log_level level, const char *module, const char *fmt, ...)
{
    static const char *const tags[] = {"D", "I", "W", "E"};
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%s %02d:%02d:%02d.%03ld %s: ", tags[level], tm.tm_hour,
                     tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, module);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line) vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); /* one call per line, so concurrent lines do not interleave */
}

size_t base_utf8_valid_prefix(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int n;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) n = 1, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) n = 2, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) n = 3, cp = c & 0x07;
        else return i;
        if (i + (size_t)n >= len) return i; /* truncated sequence */
        for (int k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += (size_t)n + 1;
    }
    return len;
}

int base_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return 0;
    size_t n = *cap > SIZE_MAX / 2 ? need : 2 * *cap;
    if (n < need) n = need;
    if (n < 16) n = 16;
    if (elem == 0 || n > SIZE_MAX / elem) return -1;
    void *q = realloc(*p, n * elem);
    if (!q) return -1;
    *p = q;
    *cap = n;
    return 0;
}

static const char *file_kind(mode_t m)
{
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a file";
}

enum status base_open_file(const char *path, int *fd, struct stat *st)
{
    *fd = -1;
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
    int f = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        if (errno == ENOENT) return status_errorf(STATUS_NOT_FOUND, "%s: no such file", path);
        return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        const int e = errno;
        close(f);
        return status_errorf(STATUS_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a regular file (%s): refused", path, file_kind(sb.st_mode));
    }
    const int flags = fcntl(f, F_GETFL);
    if (flags >= 0) (void)fcntl(f, F_SETFL, flags & ~O_NONBLOCK); /* regular files ignore it; reads stay plain */
    if (st) *st = sb;
    *fd = f;
    return STATUS_OK;
}

enum status base_copy_file(const char *from, const char *to)
{
    int fd;
    enum status st = base_open_file(from, &fd, NULL);
    if (st != STATUS_OK) return st;
    struct base_atomic out;
    if ((st = base_atomic_open(&out, to, 0644)) != STATUS_OK) {
        close(fd);
        return st;
    }
    char buf[1 << 16];
    for (;;) {
        const ssize_t got = read(fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) st = status_errorf(STATUS_IO, "%s: read failed: %s", from, strerror(errno));
        if (got <= 0 || (st = base_atomic_write(&out, buf, (size_t)got)) != STATUS_OK) break;
    }
    close(fd);
    if (st != STATUS_OK) {
        base_atomic_abort(&out);
        return st;
    }
    return base_atomic_commit(&out);
}

enum status base_read_file(const char *path, size_t max_bytes, const char *what, char **text, size_t *len)
{
    *text = NULL;
    if (len) *len = 0;
    int fd;
    enum status st = base_open_file(path, &fd, NULL);
    if (st != STATUS_OK) return st;
    return base_read_fd(fd, path, max_bytes, what, text, len);
}

enum status base_read_fd(int fd, const char *path, size_t max_bytes, const char *what, char **text, size_t *len)
{
    *text = NULL;
    if (len) *len = 0;
    enum status st = STATUS_OK;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (base_grow((void **)&buf, &cap, n + 65536 + 1, 1)) {
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            break;
        }
        const size_t got = fread(buf + n, 1, 65536, f);
        n += got;
        if (max_bytes && n > max_bytes) {
            st = status_errorf(STATUS_BAD_FORMAT, "%s: more than %zu bytes, not a plausible %s", path, max_bytes,
                               what ? what : "file");
            break;
        }
        if (got < 65536) {
            if (ferror(f)) st = status_errorf(STATUS_IO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (st != STATUS_OK) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    *text = buf;
    if (len) *len = n;
    return STATUS_OK;
}

void base_dir_of(const char *path, char *out, size_t cap)
{
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash == out) slash[1] = '\0';
    else if (slash) *slash = '\0';
    else snprintf(out, cap, ".");
}

enum status base_atomic_open(struct base_atomic *a, const char *path, unsigned mode)
{
    a->fd = -1;
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path ||
        snprintf(a->tmp, sizeof a->tmp, "%s.XXXXXX", path) >= (int)sizeof a->tmp)
        return status_errorf(STATUS_INVALID_ARGUMENT, "path too long (%zu bytes) to write: %.200s...", strlen(path), path);
    if ((a->fd = mkstemp(a->tmp)) < 0)
        return status_errorf(STATUS_IO, "%s: cannot create a temporary beside it: %s", path, strerror(errno));
    if (fchmod(a->fd, (mode_t)mode) != 0) {
        enum status st = status_errorf(STATUS_IO, "%s: %s", a->tmp, strerror(errno));
        base_atomic_abort(a);
        return st;
    }
    return STATUS_OK;
}

enum status base_atomic_write(struct base_atomic *a, const void *data, size_t n)
{
    for (size_t done = 0; done < n;) {
        const ssize_t w = write(a->fd, (const char *)data + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return status_errorf(STATUS_IO, "%s: cannot write: %s", a->tmp, w < 0 ? strerror(errno) : "no progress");
        done += (size_t)w;
    }
    return STATUS_OK;
}

void base_atomic_abort(struct base_atomic *a)
{
    if (a->fd < 0) return;
    close(a->fd);
    unlink(a->tmp);
    a->fd = -1;
}

enum status base_atomic_commit(struct base_atomic *a)
{
    enum status st = STATUS_OK;
    if (fsync(a->fd) != 0) st = status_errorf(STATUS_IO, "%s: cannot sync: %s", a->tmp, strerror(errno));
    const int rc = close(a->fd);
    a->fd = -1;
    if (st == STATUS_OK && rc != 0) st = status_errorf(STATUS_IO, "%s: %s", a->tmp, strerror(errno));
    if (st == STATUS_OK && rename(a->tmp, a->path) != 0)
        st = status_errorf(STATUS_IO, "%s: cannot rename its temporary over it: %s", a->path, strerror(errno));
    if (st != STATUS_OK) {
        unlink(a->tmp);
        return st;
    }
    /* The rename lasts once the directory is synced (a failure there is not the file's: ignored). */
    char dir[4096];
    base_dir_of(a->path, dir, sizeof dir);
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return STATUS_OK;
}

enum status base_write_file(const char *path, const void *data, size_t n, unsigned mode)
{
    struct base_atomic a;
    enum status st = base_atomic_open(&a, path, mode);
    if (st == STATUS_OK && (st = base_atomic_write(&a, data, n)) != STATUS_OK) base_atomic_abort(&a);
    return st == STATUS_OK ? base_atomic_commit(&a) : st;
}

enum status base_write_text(const char *path, const char *text, unsigned mode)
{
    struct base_atomic a;
    enum status st = base_atomic_open(&a, path, mode);
    if (st == STATUS_OK && ((st = base_atomic_write(&a, text, strlen(text))) != STATUS_OK ||
                            (st = base_atomic_write(&a, "\n", 1)) != STATUS_OK))
        base_atomic_abort(&a);
    return st == STATUS_OK ? base_atomic_commit(&a) : st;
}

double base_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
