/* server/auth.c - API keys (--api-key-file: metadata "authorization: Bearer <key>") and the
 * server's credentials (insecure, or TLS from --tls-cert / --tls-key).
 * The HTTP front checks the same keys (Authorization: Bearer) with auth_key_index.
 * Not here: where a call is refused (call.c: UNAUTHENTICATED before its message is read).
 * Tests: tests/server/test_server.py (auth, tls). */
#include <errno.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

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
    if (key < 0 || key >= s->n_keys) {
        snprintf(out, cap, "%s", "");
        return;
    }
    /* FNV-1a, 64 bits, of a fixed prefix and the key: the same key gives the same owner after a
     * restart or a reordered key file, and the journal never holds the key itself. */
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)"shardlm-owner:"; *p; p++) h = (h ^ *p) * 1099511628211ull;
    for (const unsigned char *p = (const unsigned char *)s->keys[key]; *p; p++) h = (h ^ *p) * 1099511628211ull;
    snprintf(out, cap, "key-%016llx", (unsigned long long)h);
}
