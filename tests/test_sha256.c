/* tests/test_sha256.c - kernels/base/sha256.c against published vectors:
 *  - SHA-256: FIPS 180-2 appendix B ("abc", the 448-bit message, one million 'a'), the empty
 *    message, and the padding boundaries (55, 56, 63, 64, 119, 120 bytes of 'a', values from
 *    Python's hashlib); every length up to 200 fed in pieces of 1, 7 and 65 bytes gives the
 *    one-call digest;
 *  - HMAC-SHA256: RFC 4231 test cases 1, 2 and 6 (a key longer than a block);
 *  - PBKDF2-HMAC-SHA256: password "password", salt "salt", c = 1 and 4096, dkLen 32, and the
 *    longer password and salt with dkLen 40 (two blocks, the last cut) at c = 4096 (the values
 *    published for RFC 6070's inputs with SHA-256, checked against Python's
 *    hashlib.pbkdf2_hmac).
 * Usage: test_sha256. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "sha256.h"

static void hex(const unsigned char *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", p[i]);
    out[2 * n] = '\0';
}

static void check_digest(const void *msg, size_t n, const char *want, const char *what)
{
    unsigned char d[SHA256_DIGEST_BYTES];
    char got[2 * SHA256_DIGEST_BYTES + 1];
    sha256_digest(msg, n, d);
    hex(d, sizeof d, got);
    check(!strcmp(got, want), "SHA-256 %s: %s", what, got);
}

static void check_hmac(const void *key, size_t key_len, const char *msg, const char *want, const char *what)
{
    unsigned char d[SHA256_DIGEST_BYTES];
    char got[2 * SHA256_DIGEST_BYTES + 1];
    sha256_hmac(key, key_len, msg, strlen(msg), d);
    hex(d, sizeof d, got);
    check(!strcmp(got, want), "HMAC-SHA256 %s: %s", what, got);
}

static void check_pbkdf2(const char *pw, const char *salt, unsigned c, size_t dk_len, const char *want)
{
    unsigned char d[64];
    char got[2 * sizeof d + 1];
    sha256_pbkdf2(pw, strlen(pw), salt, strlen(salt), c, d, dk_len);
    hex(d, dk_len, got);
    check(!strcmp(got, want), "PBKDF2-HMAC-SHA256 \"%s\" \"%s\" c=%u dkLen=%zu: %s", pw, salt, c, dk_len, got);
}

int main(void)
{
    check_digest("abc", 3, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "\"abc\"");
    const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    check_digest(m448, strlen(m448), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
                 "448-bit message");
    check_digest(NULL, 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    static unsigned char a[1000000];
    memset(a, 'a', sizeof a);
    check_digest(a, sizeof a, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0", "a million 'a'");
    static const struct { size_t n; const char *want; } pads[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    for (size_t i = 0; i < sizeof pads / sizeof pads[0]; i++) {
        char what[32];
        snprintf(what, sizeof what, "%zu bytes of 'a'", pads[i].n);
        check_digest(a, pads[i].n, pads[i].want, what);
    }

    /* Fed in pieces: the partial-block bookkeeping of sha256_update. */
    unsigned char msg[200];
    for (size_t i = 0; i < sizeof msg; i++) msg[i] = (unsigned char)(i * 37 + 11);
    int pieces_ok = 1;
    for (size_t n = 0; n <= sizeof msg; n++) {
        unsigned char want[SHA256_DIGEST_BYTES], got[SHA256_DIGEST_BYTES];
        sha256_digest(msg, n, want);
        static const size_t steps[] = {1, 7, 65};
        for (int s = 0; s < 3; s++) {
            struct sha256 c;
            sha256_init(&c);
            for (size_t off = 0; off < n; off += steps[s])
                sha256_update(&c, msg + off, n - off < steps[s] ? n - off : steps[s]);
            sha256_final(&c, got);
            pieces_ok &= !memcmp(got, want, sizeof got);
        }
    }
    check(pieces_ok, "SHA-256 of every length 0..200 fed in pieces of 1, 7 and 65 bytes equals the one-call digest");

    unsigned char k1[20], k6[131];
    memset(k1, 0x0b, sizeof k1);
    memset(k6, 0xaa, sizeof k6);
    check_hmac(k1, sizeof k1, "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
               "RFC 4231 case 1");
    check_hmac("Jefe", 4, "what do ya want for nothing?",
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843", "RFC 4231 case 2");
    check_hmac(k6, sizeof k6, "Test Using Larger Than Block-Size Key - Hash Key First",
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54", "RFC 4231 case 6");

    check_pbkdf2("password", "salt", 1, 32, "120fb6cffcf8b32c43e7225256c4f837a86548c92ccc35480805987cb70be17b");
    check_pbkdf2("password", "salt", 4096, 32, "c5e478d59288c841aa530db6845c4c8d962893a001ce4e11a4963873aa98134a");
    check_pbkdf2("passwordPASSWORDpassword", "saltSALTsaltSALTsaltSALTsaltSALTsalt", 4096, 40,
                 "348c89dbcbd32b2f32d814b8116e84cf2b17347ebc1800181c4e2a1fb8dd53e1c635518c7dac47e9");

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
