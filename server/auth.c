/* server/auth.c - API keys (--api-key-file: metadata "authorization: Bearer <key>"), the owner
 * each key's requests, files and jobs carry (a salted PBKDF2 hash of the key, derived once at
 * start from the salt in DIR/owner.salt of the server's state directories), and the server's
 * credentials (insecure, or TLS from --tls-cert / --tls-key).
 * The HTTP front checks the same keys (Authorization: Bearer) with auth_key_index.
 * Not here: where a call is refused (call.c: UNAUTHENTICATED before its message is read), the
 * hash itself (kernels/base/sha256.c).
 * Tests: tests/server/test_server.py (auth, tls); owners across restarts, owner.salt and the
 * migration of legacy owners: tests/server/test_journal_grpc.py (owners),
 * tests/server/test_finetune.py; the kept corpus's directory: tests/server/test_speculative_corpus.py
 * (scopes). */
#include <errno.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_internal.h"
#include "sha256.h"

#define MODULE "auth"

/* PBKDF2-HMAC-SHA256 rounds of a key's owner. 25000 cost 10.6 ms per key on one core of the
 * development VM ("AMD EPYC", -O3, best of 200; 13-20 ms with another build on its 2 cores),
 * paid once per key at start; an attacker holding a journal or an index pays 2 x 25000 SHA-256
 * compressions per candidate key and installation (the salt), where the unkeyed FNV hash it
 * replaces cost one multiply per byte. Changing it changes every owner: what was stored before
 * would belong to nobody. */
#define AUTH_OWNER_ITERATIONS 25000
#define AUTH_SALT_BYTES 16
#define AUTH_OWNER_BYTES 16                   /* of PBKDF2's output: "key-" and 32 hex digits */
#define AUTH_SALT_FILE "owner.salt"

enum status auth_load_keys(struct server *s, const char *path)
{
    char *text;
    enum status st = base_read_file(path, 1 << 20, "API key file", &text, NULL);
    if (st != STATUS_OK) return st;
    for (char *line = strtok(text, "\r\n"); line; line = strtok(NULL, "\r\n")) {
        while (*line == ' ' || *line == '\t') line++;
        size_t n = strlen(line);
        while (n && (line[n - 1] == ' ' || line[n - 1] == '\t')) line[--n] = 0;
        if (!n || line[0] == '#') continue;
        if (base_grow((void **)&s->keys, &s->keys_cap, (size_t)s->n_keys + 1, sizeof *s->keys) ||
            !(s->keys[s->n_keys] = strdup(line))) {
            free(text);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        s->n_keys++;
    }
    free(text);
    if (s->n_keys == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "--api-key-file %s holds no key", path);
    return STATUS_OK;
}

enum status auth_make_credentials(const struct server_options *o, grpc_server_credentials **out)
{
    *out = NULL;
    if (!o->tls_cert && !o->tls_key) {
        *out = grpc_insecure_server_credentials_create();
        return STATUS_OK;
    }
    if (!o->tls_cert || !o->tls_key)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--tls-cert and --tls-key must be given together");
    char *cert = NULL, *key = NULL;
    enum status st = base_read_file(o->tls_cert, 1 << 20, "PEM file", &cert, NULL);
    if (st == STATUS_OK) st = base_read_file(o->tls_key, 1 << 20, "PEM file", &key, NULL);
    if (st == STATUS_OK) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        *out = grpc_ssl_server_credentials_create(NULL, &pair, 1, 0, NULL);
        if (!*out) st = status_errorf(STATUS_INVALID_ARGUMENT, "cannot use the TLS certificate %s and key %s", o->tls_cert, o->tls_key);
    }
    free(cert);
    free(key);
    return st;
}


/* Compared in constant time per key. */
int auth_authorized(const struct server *s, const grpc_metadata_array *md, int *key)
{
    *key = -1;
    if (s->n_keys == 0) return 1;
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) != 13 || memcmp(GRPC_SLICE_START_PTR(m->key), "authorization", 13)) continue;
        const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
        size_t n = GRPC_SLICE_LENGTH(m->value);
        if (n < 7 || memcmp(v, "Bearer ", 7)) continue;
        *key = auth_key_index(s, v + 7, n - 7);
        return *key >= 0;
    }
    return 0;
}

int auth_key_index(const struct server *s, const char *v, size_t n)
{
    int found = -1;
    for (int k = 0; k < s->n_keys; k++) {
        size_t kn = strlen(s->keys[k]);
        unsigned diff = kn != n;
        for (size_t j = 0; j < n; j++) diff |= (unsigned char)v[j] ^ (unsigned char)s->keys[k][j < kn ? j : 0];
        if (diff == 0) found = k;
    }
    return found;
}

void auth_client_name(int key, char *out, size_t cap) { snprintf(out, cap, "key:%d", key); }

void auth_owner(const struct server *s, int key, char *out, size_t cap)
{
    /* A copy of what auth_derive_owners computed: called per request on several threads. */
    snprintf(out, cap, "%s", key < 0 || key >= s->n_keys || !s->owners ? "" : s->owners[key]);
}

void auth_owner_legacy(const char *key, char *out, size_t cap)
{
    /* FNV-1a, 64 bits, of a fixed prefix and the key: the owner before owner.salt. */
    const uint64_t h = base_fnv1a_str(base_fnv1a_str(1469598103934665603ull, "shardlm-owner:"), key);
    snprintf(out, cap, "key-%016llx", (unsigned long long)h);
}

int auth_owner_upgrade(const struct server *s, char *owner, size_t cap)
{
    if (strncmp(owner, "key-", 4) || strlen(owner) != 20 || strspn(owner + 4, "0123456789abcdef") != 16) return 0;
    for (int k = 0; k < s->n_keys; k++) {
        char legacy[32];
        auth_owner_legacy(s->keys[k], legacy, sizeof legacy);
        if (strcmp(legacy, owner)) continue;
        CHECK(strlen(s->owners[k]) < cap, "an owner buffer of %zu bytes is too small", cap);
        snprintf(owner, cap, "%s", s->owners[k]);
        return 1;
    }
    return 0; /* a key no longer in the key file: its things stay nobody's */
}

/* ---- owner.salt ------------------------------------------------------------------------------ */

static void salt_path(const char *dir, char *out, size_t cap) { snprintf(out, cap, "%s/" AUTH_SALT_FILE, dir); }

/* Reads DIR/owner.salt (32 hex digits, then optional white space) into salt; *found 0 when the
 * file does not exist. A file that exists but is not a salt is STATUS_BAD_FORMAT naming it: the
 * server must not make up another salt and with it other owners. */
static enum status salt_read(const char *dir, unsigned char salt[AUTH_SALT_BYTES], int *found)
{
    char path[PATH_MAX], *text = NULL;
    size_t len = 0;
    salt_path(dir, path, sizeof path);
    *found = 0;
    if (access(path, F_OK) != 0 && errno == ENOENT) return STATUS_OK;
    enum status st = base_read_file(path, 256, "owner salt", &text, &len);
    if (st != STATUS_OK) return st;
    *found = 1;
    int ok = len >= 2 * AUTH_SALT_BYTES && strspn(text, "0123456789abcdef") == 2 * AUTH_SALT_BYTES &&
             strspn(text + 2 * AUTH_SALT_BYTES, " \t\r\n") == len - 2 * AUTH_SALT_BYTES;
    for (int i = 0; ok && i < AUTH_SALT_BYTES; i++) {
        unsigned v;
        sscanf(text + 2 * i, "%2x", &v);
        salt[i] = (unsigned char)v;
    }
    free(text);
    if (!ok)
        return status_errorf(STATUS_BAD_FORMAT, "%s is not an owner salt (%d lowercase hex digits): restore it from a "
                             "backup, or remove it to give every API key a new owner (what they stored is then "
                             "nobody's)", path, 2 * AUTH_SALT_BYTES);
    return STATUS_OK;
}

/* Writes salt to DIR/owner.salt unless it exists: a file of its own (O_EXCL, mode 0600) written,
 * fsync'd and then linked to the name (renamed where hard links are not supported), so that a
 * crash never leaves a short salt and a salt another process wrote first is never replaced (the
 * caller reads the name back). */
static enum status salt_write(const char *dir, const unsigned char salt[AUTH_SALT_BYTES])
{
    char path[PATH_MAX], tmp[PATH_MAX + 32], text[2 * AUTH_SALT_BYTES + 2];
    salt_path(dir, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    for (int i = 0; i < AUTH_SALT_BYTES; i++) snprintf(text + 2 * i, 3, "%02x", salt[i]);
    text[2 * AUTH_SALT_BYTES] = '\n', text[2 * AUTH_SALT_BYTES + 1] = '\0';
    unlink(tmp); /* left by a process of the same id that died here */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return status_errorf(STATUS_IO, "%s: %s", tmp, strerror(errno));
    size_t n = strlen(text);
    int ok = write(fd, text, n) == (ssize_t)n && fsync(fd) == 0;
    int err = errno;
    ok = close(fd) == 0 && ok;
    if (ok && link(tmp, path) != 0 && errno != EEXIST) {
        /* A filesystem without hard links (some FUSE, SMB and vfat mounts): renamed onto the name
         * when none is there yet; two servers starting on one such directory in the same instant
         * could then each rename theirs (the caller's read-back sees the survivor). */
        const int e = errno;
        if ((e == EPERM || e == ENOTSUP || e == ENOSYS) && access(path, F_OK) != 0 && errno == ENOENT)
            ok = rename(tmp, path) == 0, err = errno;
        else ok = 0, err = e;
    }
    unlink(tmp);
    if (!ok) return status_errorf(STATUS_IO, "%s: %s", path, strerror(err));
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) fsync(dfd), close(dfd);
    return STATUS_OK;
}

/* The salt of this installation: the one in the state directories (--journal, --fine-tuning, and
 * the directory of --spec-corpus-keep's file, whose texts are scoped by owner), written to those
 * that lack it; a new random one when none has it; per process without state directories
 * (nothing on disk outlives it). The kept corpus's directory is not created (the file's writes
 * would fail anyway): when it is missing it holds no salt. */
#define SALT_PLACES 3
static enum status owner_salt(const struct server_options *o, unsigned char salt[AUTH_SALT_BYTES])
{
    char keep_dir[PATH_MAX] = "";
    if (o->engine.spec_corpus_keep) base_dir_of(o->engine.spec_corpus_keep, keep_dir, sizeof keep_dir);
    struct stat sb;
    const char *flag[SALT_PLACES] = {"--journal", "--fine-tuning", "--spec-corpus-keep"};
    const char *dir[SALT_PLACES] = {o->journal_dir, o->finetune_dir,
                                    keep_dir[0] && stat(keep_dir, &sb) == 0 && S_ISDIR(sb.st_mode) ? keep_dir : NULL};
    int found[SALT_PLACES] = {0}, from = -1;
    for (int i = 0; i < SALT_PLACES; i++) {
        if (!dir[i]) continue;
        if (i < 2 && mkdir(dir[i], 0700) != 0 && errno != EEXIST)
            return status_errorf(STATUS_IO, "%s %s: %s", flag[i], dir[i], strerror(errno));
        unsigned char got[AUTH_SALT_BYTES];
        enum status st = salt_read(dir[i], got, &found[i]);
        if (st != STATUS_OK) return st;
        if (!found[i]) continue;
        if (from < 0) {
            memcpy(salt, got, sizeof got);
            from = i;
        } else if (memcmp(salt, got, sizeof got)) {
            char a[PATH_MAX], b[PATH_MAX];
            salt_path(dir[from], a, sizeof a), salt_path(dir[i], b, sizeof b);
            return status_errorf(STATUS_FAILED_PRECONDITION, "%s and %s hold different owner salts: the same API key "
                                 "would own different requests and files in %s and %s. Copy one over the other (what "
                                 "was stored under the other salt becomes nobody's)", a, b, flag[from], flag[i]);
        }
    }
    if (from < 0 && getrandom(salt, AUTH_SALT_BYTES, 0) != AUTH_SALT_BYTES)
        return status_errorf(STATUS_IO, "getrandom: %s", strerror(errno));
    for (int i = 0; i < SALT_PLACES; i++) {
        if (!dir[i] || found[i]) continue;
        unsigned char got[AUTH_SALT_BYTES];
        enum status st = salt_write(dir[i], salt);
        if (st == STATUS_OK) st = salt_read(dir[i], got, &found[i]);
        if (st != STATUS_OK) return st;
        char path[PATH_MAX];
        salt_path(dir[i], path, sizeof path);
        if (!found[i] || memcmp(salt, got, sizeof got))
            return status_errorf(STATUS_FAILED_PRECONDITION, "%s changed while the server started (another server on "
                                 "the same directory?)", path);
        LOG_INFO(MODULE, "%s: a new owner salt (%s)", path, from < 0 ? "new installation" : "copied");
    }
    return STATUS_OK;
}

enum status auth_derive_owners(struct server *s)
{
    unsigned char salt[AUTH_SALT_BYTES];
    enum status st = owner_salt(&s->opts, salt);
    if (st != STATUS_OK) return st;
    s->owners = calloc((size_t)s->n_keys, sizeof *s->owners);
    if (!s->owners) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    double t0 = base_now_s();
    for (int k = 0; k < s->n_keys; k++) {
        unsigned char d[AUTH_OWNER_BYTES];
        sha256_pbkdf2(s->keys[k], strlen(s->keys[k]), salt, sizeof salt, AUTH_OWNER_ITERATIONS, d, sizeof d);
        char *p = s->owners[k] + snprintf(s->owners[k], sizeof s->owners[k], "key-");
        for (int i = 0; i < AUTH_OWNER_BYTES; i++) p += snprintf(p, 3, "%02x", d[i]);
    }
    LOG_INFO(MODULE, "the owners of %d API key(s) derived in %.0f ms (PBKDF2-HMAC-SHA256, %d rounds)", s->n_keys,
             (base_now_s() - t0) * 1e3, AUTH_OWNER_ITERATIONS);
    return STATUS_OK;
}
