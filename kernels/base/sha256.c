/* kernels/base/sha256.c - SHA-256, HMAC-SHA256 and PBKDF2-HMAC-SHA256 (sha256.h), from FIPS
 * 180-4 sections 4.1.2, 4.2.2, 5.1.1, 5.3.3 and 6.2, RFC 2104 section 2 and RFC 8018 section
 * 5.2. Portable C: the owner hashes of a server's API keys are its only users, at start-up.
 * Tests: tests/test_sha256.c. */
#include "sha256.h"

#include <string.h>

/* FIPS 180-4 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first
 * 64 primes. */
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static uint32_t load_be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static void store_be32(unsigned char *p, uint32_t x)
{
    p[0] = (unsigned char)(x >> 24), p[1] = (unsigned char)(x >> 16), p[2] = (unsigned char)(x >> 8);
    p[3] = (unsigned char)x;
}

/* FIPS 180-4 6.2.2: one 64-byte block into the chaining value h. */
static void compress(uint32_t h[8], const unsigned char block[SHA256_BLOCK_BYTES])
{
    uint32_t w[64];
    for (int t = 0; t < 16; t++) w[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++) {
        uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);   /* sigma0 */
        uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);    /* sigma1 */
        w[t] = s1 + w[t - 7] + s0 + w[t - 16];
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int t = 0; t < 64; t++) {
        uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);                          /* Sigma1 */
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = k + S1 + ch + K[t] + w[t];
        uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);                          /* Sigma0 */
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = S0 + maj;
        k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void sha256_init(struct sha256 *c)
{
    /* FIPS 180-4 5.3.3: the first 32 bits of the fractional parts of the square roots of the
     * first 8 primes. */
    static const uint32_t H0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(c->h, H0, sizeof H0);
    c->n_bytes = 0;
}

void sha256_update(struct sha256 *c, const void *data, size_t n)
{
    if (n == 0) return;
    const unsigned char *p = data;
    size_t used = (size_t)(c->n_bytes % SHA256_BLOCK_BYTES);
    c->n_bytes += n;
    if (used) {
        size_t take = SHA256_BLOCK_BYTES - used < n ? SHA256_BLOCK_BYTES - used : n;
        memcpy(c->block + used, p, take);
        p += take, n -= take, used += take;
        if (used < SHA256_BLOCK_BYTES) return;
        compress(c->h, c->block);
    }
    for (; n >= SHA256_BLOCK_BYTES; p += SHA256_BLOCK_BYTES, n -= SHA256_BLOCK_BYTES) compress(c->h, p);
    if (n) memcpy(c->block, p, n);
}

void sha256_final(struct sha256 *c, unsigned char out[SHA256_DIGEST_BYTES])
{
    /* FIPS 180-4 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the length in bits (64-bit
     * big-endian). */
    uint64_t bits = c->n_bytes * 8;
    size_t used = (size_t)(c->n_bytes % SHA256_BLOCK_BYTES);
    c->block[used++] = 0x80;
    if (used > SHA256_BLOCK_BYTES - 8) {
        memset(c->block + used, 0, SHA256_BLOCK_BYTES - used);
        compress(c->h, c->block);
        used = 0;
    }
    memset(c->block + used, 0, SHA256_BLOCK_BYTES - 8 - used);
    store_be32(c->block + 56, (uint32_t)(bits >> 32));
    store_be32(c->block + 60, (uint32_t)bits);
    compress(c->h, c->block);
    for (int i = 0; i < 8; i++) store_be32(out + 4 * i, c->h[i]);
}

void sha256_digest(const void *data, size_t n, unsigned char out[SHA256_DIGEST_BYTES])
{
    struct sha256 c;
    sha256_init(&c);
    sha256_update(&c, data, n);
    sha256_final(&c, out);
}

/* RFC 2104 section 2: the states after H(K ^ ipad) and H(K ^ opad), K zero-padded to a block
 * (hashed first when longer). HMAC(K, m) = H(K ^ opad || H(K ^ ipad || m)). */
static void hmac_keyed(const void *key, size_t key_len, struct sha256 *inner, struct sha256 *outer)
{
    unsigned char k[SHA256_BLOCK_BYTES] = {0}, pad[SHA256_BLOCK_BYTES];
    if (key_len > SHA256_BLOCK_BYTES) sha256_digest(key, key_len, k);
    else if (key_len) memcpy(k, key, key_len);
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) pad[i] = k[i] ^ 0x36;
    sha256_init(inner);
    sha256_update(inner, pad, sizeof pad);
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) pad[i] = k[i] ^ 0x5c;
    sha256_init(outer);
    sha256_update(outer, pad, sizeof pad);
}

/* HMAC of msg from the keyed states (left unchanged: each call works on copies). */
static void hmac_from(const struct sha256 *inner, const struct sha256 *outer, const void *msg, size_t n,
                      unsigned char out[SHA256_DIGEST_BYTES])
{
    struct sha256 c = *inner;
    unsigned char ih[SHA256_DIGEST_BYTES];
    sha256_update(&c, msg, n);
    sha256_final(&c, ih);
    c = *outer;
    sha256_update(&c, ih, sizeof ih);
    sha256_final(&c, out);
}

void sha256_hmac(const void *key, size_t key_len, const void *msg, size_t msg_len,
                 unsigned char out[SHA256_DIGEST_BYTES])
{
    struct sha256 inner, outer;
    hmac_keyed(key, key_len, &inner, &outer);
    hmac_from(&inner, &outer, msg, msg_len, out);
}

void sha256_pbkdf2(const void *password, size_t password_len, const void *salt, size_t salt_len,
                   uint32_t iterations, unsigned char *out, size_t out_len)
{
    /* RFC 8018 5.2: T_i = U_1 ^ U_2 ^ ... ^ U_c, U_1 = PRF(P, S || INT(i)), U_j = PRF(P, U_j-1),
     * DK = T_1 || T_2 || ... truncated to out_len. */
    struct sha256 inner, outer;
    hmac_keyed(password, password_len, &inner, &outer);
    for (uint32_t i = 1; out_len > 0; i++) {
        unsigned char be_i[4], u[SHA256_DIGEST_BYTES], t[SHA256_DIGEST_BYTES];
        store_be32(be_i, i);
        struct sha256 c = inner;
        sha256_update(&c, salt, salt_len);
        sha256_update(&c, be_i, sizeof be_i);
        sha256_final(&c, u);
        c = outer;
        sha256_update(&c, u, sizeof u);
        sha256_final(&c, u);
        memcpy(t, u, sizeof t);
        for (uint32_t j = 1; j < iterations; j++) {
            hmac_from(&inner, &outer, u, sizeof u, u);
            for (int b = 0; b < SHA256_DIGEST_BYTES; b++) t[b] ^= u[b];
        }
        size_t take = out_len < sizeof t ? out_len : sizeof t;
        memcpy(out, t, take);
        out += take, out_len -= take;
    }
}
