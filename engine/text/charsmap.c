/* engine/text/charsmap.c - the Precompiled normalizer: SentencePiece's precompiled_charsmap (what
 * T5, ALBERT, XLNet, XLM-R and mBART tokenizer.json files carry, base64 in the JSON), applied as
 * Hugging Face tokenizers applies it (normalizers/precompiled.rs and the spm_precompiled crate).
 * The map is a little-endian u32 trie size, a Darts-clone double-array trie of that many bytes (u32
 * units) over UTF-8 keys, then NUL-separated replacement strings the trie's values index.
 * Hugging Face's rule, kept exactly: the text is cut into extended grapheme clusters (ICU's
 * character break iterator); a cluster shorter than 6 bytes whose bytes have a prefix in the trie
 * is replaced whole by the replacement of the shortest such prefix; otherwise each character
 * with a prefix in the trie is replaced by that one's, the others kept.
 * Every read of the map is bounds-checked (a malformed map replaces nothing where it is broken,
 * never reads outside itself). Not here: parsing the JSON (tokenizer_json_steps.c).
 * Tests: tests/test_tokenizer_kinds.py (a charsmap from SentencePiece's nmt_nfkc rule, against
 * Hugging Face tokenizers). */
#include <stdlib.h>
#include <string.h>
#include <unicode/ubrk.h>
#include <unicode/ustring.h>

#include "bpe.h"

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

enum status charsmap_check(const uint8_t *m, size_t n, const char *name)
{
    if (n < 4 || le32(m) % 4 || le32(m) == 0 || (size_t)le32(m) > n - 4)
        return status_errorf(STATUS_BAD_FORMAT, "%s: normalizer: Precompiled's precompiled_charsmap is not a trie size, a trie "
                             "and its strings", name);
    return STATUS_OK;
}

/* The replacement of the shortest prefix of key[0..n) in the trie of map m[0..mn) into *out,
 * *out_n; 0 when no prefix is there. */
static int transform(const uint8_t *m, size_t mn, const uint8_t *key, size_t n, const uint8_t **out, size_t *out_n)
{
    const size_t units = le32(m) / 4;
    const uint8_t *trie = m + 4, *strs = m + 4 + 4 * units;
    const size_t n_strs = mn - 4 - 4 * units;
#define UNIT(i) le32(trie + 4 * (size_t)(i))
#define OFFSET(u) (((u) >> 10) << (((u) & (1u << 9)) >> 6))
    size_t pos = 0;
    uint32_t u = UNIT(0);
    pos ^= OFFSET(u);
    for (size_t i = 0; i < n && key[i]; i++) {
        pos ^= key[i];
        if (pos >= units) return 0;
        u = UNIT(pos);
        if ((u & ((1u << 31) | 0xFF)) != key[i]) return 0; /* the unit's label */
        pos ^= OFFSET(u);
        if (pos >= units) return 0;
        if (u >> 8 & 1) { /* has a leaf: its value is where the replacement starts */
            const size_t at = UNIT(pos) & 0x7FFFFFFFu;
            if (at >= n_strs) return 0;
            const uint8_t *end = memchr(strs + at, 0, n_strs - at);
            *out = strs + at, *out_n = end ? (size_t)(end - strs) - at : n_strs - at;
            return 1;
        }
    }
    return 0;
#undef UNIT
#undef OFFSET
}

/* Appends the code points of UTF-8 s[0..n) (invalid bytes as U+FFFD). */
static int push_utf8(uint32_t **dst, size_t *dn, size_t *dcap, const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = bpe_utf8_next(s + i, n - i, &c);
        if (!k) c = 0xFFFD, k = 1;
        if (*dn == *dcap && base_grow((void **)dst, dcap, *dn + 1, sizeof **dst)) return 0;
        (*dst)[(*dn)++] = c;
        i += k;
    }
    return 1;
}

static size_t put_utf8(uint32_t c, uint8_t *o)
{
    if (c < 0x80) return o[0] = (uint8_t)c, 1;
    if (c < 0x800) return o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), 2;
    if (c < 0x10000) return o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)), o[2] = (uint8_t)(0x80 | (c & 63)), 3;
    o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)), o[2] = (uint8_t)(0x80 | (c >> 6 & 63)),
    o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

enum status charsmap_apply(const uint8_t *m, size_t mn, const uint32_t *s, size_t n, uint32_t **dst, size_t *dn, size_t *dcap)
{
    *dn = 0;
    if (!n) return STATUS_OK;
    if (n > INT32_MAX / 4) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: text too long to normalize");
    /* The clusters by ICU over UTF-16; u16_at[k] is the UTF-16 index where code point k starts. */
    UChar *a = malloc((2 * n + 1) * sizeof *a);
    int32_t *cp_of = malloc((2 * n + 1) * sizeof *cp_of);
    enum status st = STATUS_OK;
    UErrorCode err = U_ZERO_ERROR;
    int32_t n16 = 0;
    UBreakIterator *it = NULL;
    if (!a || !cp_of) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    if (!st) u_strFromUTF32(a, (int32_t)(2 * n + 1), &n16, (const UChar32 *)s, (int32_t)n, &err);
    if (!st && !U_FAILURE(err)) it = ubrk_open(UBRK_CHARACTER, "", a, n16, &err);
    if (!st && U_FAILURE(err)) st = status_errorf(STATUS_INTERNAL, "tokenizer: ICU's grapheme breaker: %s", u_errorName(err));
    for (size_t k = 0, at = 0; !st && k < n; k++) {
        cp_of[at] = (int32_t)k;
        at += s[k] > 0xFFFF ? 2 : 1;
        if (k + 1 == n) cp_of[at] = (int32_t)n;
    }
    int32_t from = st ? UBRK_DONE : ubrk_first(it);
    uint8_t buf[6 * 4];
    while (!st && from != UBRK_DONE) {
        const int32_t to = ubrk_next(it);
        if (to == UBRK_DONE) break;
        const size_t ca = (size_t)cp_of[from], cb = (size_t)cp_of[to];
        const uint8_t *rep;
        size_t rn, bytes = 0;
        for (size_t k = ca; k < cb && bytes < 6; k++) bytes += put_utf8(s[k], buf + bytes);
        if (bytes < 6 && transform(m, mn, buf, bytes, &rep, &rn)) {
            if (!push_utf8(dst, dn, dcap, rep, rn)) st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
        } else {
            for (size_t k = ca; k < cb && !st; k++) {
                const size_t cn = put_utf8(s[k], buf);
                const int hit = transform(m, mn, buf, cn, &rep, &rn);
                if (!push_utf8(dst, dn, dcap, hit ? rep : buf, hit ? rn : cn))
                    st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
            }
        }
        from = to;
    }
    ubrk_close(it);
    free(a), free(cp_of);
    return st;
}
