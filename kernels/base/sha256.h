/* kernels/base/sha256.h - SHA-256 (FIPS 180-4), HMAC-SHA256 (RFC 2104) and
 * PBKDF2-HMAC-SHA256 (RFC 8018 section 5.2), written from those documents: the server's
 * owner of an API key (server/auth.c) is a salted PBKDF2 hash of the key, so that what reaches
 * disk (the journal, the fine-tuning index) is slow to test candidate keys against.
 * Not here: anything that needs a vetted constant-time or hardware-accelerated implementation
 * (TLS is gRPC's); these functions branch on lengths only, never on the bytes hashed.
 * Threads: no state outside the arguments; every function may run on any thread.
 * Tests: tests/test_sha256.c (FIPS 180-2, RFC 4231 and RFC 7914 / RFC 6070-style vectors). */
#ifndef SHARDLM_SHA256_H
#define SHARDLM_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SHA256_DIGEST_BYTES 32
#define SHA256_BLOCK_BYTES 64

/* A running hash. Fill it with sha256_init, feed it with sha256_update, read it with
 * sha256_final; a copy of a running hash goes on independently of the original (HMAC and
 * PBKDF2 start each block from a copy of the keyed state). */
struct sha256 {
    uint32_t      h[8];                       /* the chaining value */
    uint64_t      n_bytes;                    /* bytes fed so far */
    unsigned char block[SHA256_BLOCK_BYTES];  /* the partial block, n_bytes % 64 of them */
};

void sha256_init(struct sha256 *c);
/* Feeds data[0..n) (NULL allowed when n is 0). */
void sha256_update(struct sha256 *c, const void *data, size_t n);
/* Writes the digest into out (32 bytes); c must be initialised again before it is reused. */
void sha256_final(struct sha256 *c, unsigned char out[SHA256_DIGEST_BYTES]);
/* The digest of data[0..n) in one call. */
void sha256_digest(const void *data, size_t n, unsigned char out[SHA256_DIGEST_BYTES]);

/* HMAC-SHA256(key, msg) into out (32 bytes); a key longer than a block is hashed first. */
void sha256_hmac(const void *key, size_t key_len, const void *msg, size_t msg_len,
                 unsigned char out[SHA256_DIGEST_BYTES]);

/* PBKDF2 with HMAC-SHA256 as its PRF: out_len bytes (any length) derived from password and
 * salt with `iterations` (>= 1) rounds per 32-byte block. Costs 2 * iterations compressions of
 * SHA-256 per output block (the keyed inner and outer states are computed once). */
void sha256_pbkdf2(const void *password, size_t password_len, const void *salt, size_t salt_len,
                   uint32_t iterations, unsigned char *out, size_t out_len);

#ifdef __cplusplus
}
#endif

#endif
