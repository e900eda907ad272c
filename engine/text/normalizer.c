/* engine/text/normalizer.c - the normalizers of the non-byte-level tokenizer.json kinds, applied to
 * one segment of text (between added tokens) in the file's order: NFC, NFD, NFKC, NFKD (ICU),
 * Lowercase, StripAccents, BertNormalizer's steps, Replace (String and Regex patterns), Prepend, Strip,
 * Precompiled (charsmap.c); and a leading Metaspace pre-tokenizer's replacement of ' ' by U+2581
 * and its prepend (metaspace_apply, after the normalized added tokens are split off).
 * Character classes are Rust's (char::is_whitespace, char::to_lowercase) and the unicode
 * categories of ICU, as close to Hugging Face tokenizers as one library's tables allow (the
 * Unicode versions may differ for characters assigned recently).
 * Not here: NFC of byte-level BPE (bpe.c, which keeps invalid UTF-8 bytes), parsing (tokenizer_json.c).
 * Tests: tests/test_tokenizer_kinds.py. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include "bpe.h"

struct cps {
    uint32_t *p;
    size_t    n, cap;
};

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory"); }

static int cps_push(struct cps *v, uint32_t c)
{
    if (v->n == v->cap && base_grow((void **)&v->p, &v->cap, v->n + 1, sizeof *v->p)) return 0;
    v->p[v->n++] = c;
    return 1;
}

/* BERT's CJK ideograph blocks (tokenizers' normalizers/bert.rs). */
static int is_chinese(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* General category C* (Cc, Cf, Cs, Co, Cn): BERT's "control", tab, LF and CR excepted. */
static int is_other(uint32_t c)
{
    const int8_t t = u_charType((UChar32)c);
    return t == U_CONTROL_CHAR || t == U_FORMAT_CHAR || t == U_SURROGATE || t == U_PRIVATE_USE_CHAR ||
           t == U_UNASSIGNED;
}

/* One of ICU's four normalization forms over v, in place. */
static enum status unicode_form(enum bpe_norm_kind kind, struct cps *v)
{
    UErrorCode err = U_ZERO_ERROR;
    const UNormalizer2 *nz = kind == BPE_NORM_NFC    ? unorm2_getNFCInstance(&err)
                             : kind == BPE_NORM_NFD  ? unorm2_getNFDInstance(&err)
                             : kind == BPE_NORM_NFKC ? unorm2_getNFKCInstance(&err)
                                                     : unorm2_getNFKDInstance(&err);
    if (U_FAILURE(err)) return status_errorf(STATUS_INTERNAL, "tokenizer: ICU normalizer: %s", u_errorName(err));
    if (v->n > INT32_MAX / 8) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: text too long to normalize");
    const int32_t cap16 = (int32_t)(2 * v->n + 1), cap_out = (int32_t)(18 * v->n + 16); /* NFKD grows 18x at most */
    UChar *a = malloc((size_t)cap16 * sizeof *a), *o = malloc((size_t)cap_out * sizeof *o);
    enum status st = STATUS_OK;
    int32_t n16 = 0, m16 = 0;
    if (!a || !o) st = oom();
    if (!st) u_strFromUTF32(a, cap16, &n16, (const UChar32 *)v->p, (int32_t)v->n, &err);
    if (!st && !U_FAILURE(err)) m16 = unorm2_normalize(nz, a, n16, o, cap_out, &err);
    if (!st && U_FAILURE(err)) st = status_errorf(STATUS_INTERNAL, "tokenizer: normalization: %s", u_errorName(err));
    if (!st && base_grow((void **)&v->p, &v->cap, (size_t)m16 + 1, sizeof *v->p)) st = oom();
    int32_t n32 = 0;
    if (!st) u_strToUTF32((UChar32 *)v->p, (int32_t)v->cap, &n32, o, m16, &err);
    if (!st && U_FAILURE(err)) st = status_errorf(STATUS_INTERNAL, "tokenizer: normalization: %s", u_errorName(err));
    if (!st) v->n = (size_t)n32;
    free(a), free(o);
    return st;
}

/* One step from src into dst (emptied first); the forms are done in place (returns 2). */
static int step(const struct bpe_norm *k, const struct cps *src, struct cps *dst)
{
    dst->n = 0;
    const size_t n = src->n;
    const uint32_t *s = src->p;
    switch (k->kind) {
    case BPE_NORM_LOWERCASE:
        for (size_t i = 0; i < n; i++) {
            /* Rust's full lowercase mapping differs from the simple one only for U+0130. */
            if (s[i] == 0x130) {
                if (!cps_push(dst, 'i') || !cps_push(dst, 0x307)) return 0;
            } else if (!cps_push(dst, (uint32_t)u_tolower((UChar32)s[i])))
                return 0;
        }
        return 1;
    case BPE_NORM_STRIP_ACCENTS:
        for (size_t i = 0; i < n; i++)
            if (u_charType((UChar32)s[i]) != U_NON_SPACING_MARK && !cps_push(dst, s[i])) return 0;
        return 1;
    case BPE_NORM_BERT_CLEAN:
        for (size_t i = 0; i < n; i++) {
            const uint32_t c = s[i];
            const int ws = c == '\t' || c == '\n' || c == '\r' || bpe_cp_is_space(c);
            if (c == 0 || c == 0xFFFD || (!ws && is_other(c))) continue;
            if (!cps_push(dst, ws ? ' ' : c)) return 0;
        }
        return 1;
    case BPE_NORM_BERT_CHINESE:
        for (size_t i = 0; i < n; i++) {
            const int cjk = is_chinese(s[i]);
            if ((cjk && !cps_push(dst, ' ')) || !cps_push(dst, s[i]) || (cjk && !cps_push(dst, ' '))) return 0;
        }
        return 1;
    case BPE_NORM_STRIP: {
        size_t a = 0, e = n;
        while (k->left && a < e && bpe_cp_is_space(s[a])) a++;
        while (k->right && e > a && bpe_cp_is_space(s[e - 1])) e--;
        for (size_t i = a; i < e; i++)
            if (!cps_push(dst, s[i])) return 0;
        return 1;
    }
    case BPE_NORM_PREPEND:
    case BPE_NORM_REPLACE: {
        /* The texts as code points (they are valid UTF-8: cJSON gave them). */
        uint32_t pat[64], with[64];
        size_t np = 0, nw = 0;
        const char *t = k->kind == BPE_NORM_PREPEND ? k->with : k->text;
        for (size_t i = 0, len = strlen(t); i < len && np < 64;) {
            size_t step_ = bpe_utf8_next((const uint8_t *)t + i, len - i, &pat[np]);
            i += step_ ? step_ : 1, np += step_ != 0;
        }
        for (size_t i = 0, len = strlen(k->with); k->kind == BPE_NORM_REPLACE && i < len && nw < 64;) {
            size_t step_ = bpe_utf8_next((const uint8_t *)k->with + i, len - i, &with[nw]);
            i += step_ ? step_ : 1, nw += step_ != 0;
        }
        if (k->kind == BPE_NORM_PREPEND) {
            for (size_t i = 0; n && i < np; i++)
                if (!cps_push(dst, pat[i])) return 0;
            for (size_t i = 0; i < n; i++)
                if (!cps_push(dst, s[i])) return 0;
            return 1;
        }
        for (size_t i = 0; i < n;) {
            if (np && i + np <= n && !memcmp(s + i, pat, np * sizeof *pat)) {
                for (size_t j = 0; j < nw; j++)
                    if (!cps_push(dst, with[j])) return 0;
                i += np;
            } else if (!cps_push(dst, s[i++]))
                return 0;
        }
        return 1;
    }
    default:
        return 2;
    }
}

/* Writes p[0..n) as UTF-8 to o (room for 4n bytes); the byte count. */
static size_t to_utf8(const uint32_t *p, size_t n, uint8_t *out)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t c = p[i];
        uint8_t *o = out + m;
        if (c < 0x80) o[0] = (uint8_t)c, m += 1;
        else if (c < 0x800) o[0] = (uint8_t)(0xC0 | c >> 6), o[1] = (uint8_t)(0x80 | (c & 63)), m += 2;
        else if (c < 0x10000)
            o[0] = (uint8_t)(0xE0 | c >> 12), o[1] = (uint8_t)(0x80 | (c >> 6 & 63)), o[2] = (uint8_t)(0x80 | (c & 63)), m += 3;
        else
            o[0] = (uint8_t)(0xF0 | c >> 18), o[1] = (uint8_t)(0x80 | (c >> 12 & 63)), o[2] = (uint8_t)(0x80 | (c >> 6 & 63)),
            o[3] = (uint8_t)(0x80 | (c & 63)), m += 4;
    }
    return m;
}

/* Replace with a Regex: every match of k->code in src replaced by k->with, into dst. */
static enum status replace_regex(const struct bpe_norm *k, const struct cps *src, struct cps *dst)
{
    dst->n = 0;
    uint8_t *in = malloc(4 * src->n + 1), *o = NULL;
    if (!in) return oom();
    const size_t n_in = to_utf8(src->p, src->n, in);
    PCRE2_SIZE n_out = 2 * n_in + 64;
    int rc = PCRE2_ERROR_NOMEMORY;
    const uint32_t opts = PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH;
    for (int tries = 0; tries < 2 && rc == PCRE2_ERROR_NOMEMORY; tries++) {
        free(o);
        if (!(o = malloc(n_out + 1))) break;
        rc = pcre2_substitute((const pcre2_code *)k->code, in, n_in, 0, opts, NULL, NULL, (PCRE2_SPTR)k->with,
                              PCRE2_ZERO_TERMINATED, o, &n_out);
    }
    enum status st = STATUS_OK;
    if (!o) st = oom();
    else if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        st = status_errorf(STATUS_INTERNAL, "tokenizer: normalizer Replace /%s/: %s", k->text, (const char *)msg);
    }
    for (size_t i = 0; !st && i < n_out;) {
        uint32_t c;
        size_t step_ = bpe_utf8_next(o + i, n_out - i, &c);
        if (!step_) c = 0xFFFD, step_ = 1;
        if (!cps_push(dst, c)) st = oom();
        i += step_;
    }
    free(in), free(o);
    return st;
}

enum status normalizer_apply(const struct bpe *b, const uint8_t *s, size_t n, uint8_t **out, size_t *n_out, size_t *cap)
{
    struct cps v[2] = {{0}, {0}};
    enum status st = STATUS_OK;
    int cur = 0;
    if (base_grow((void **)&v[0].p, &v[0].cap, n + 1, sizeof(uint32_t))) return oom();
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = bpe_utf8_next(s + i, n - i, &c);
        if (!k) c = 0xFFFD, k = 1; /* as Rust's from_utf8_lossy would, one per byte */
        v[0].p[v[0].n++] = c;
        i += k;
    }
    for (int i = 0; i < b->n_norms && !st; i++) {
        const struct bpe_norm *k = &b->norms[i];
        if (k->kind == BPE_NORM_PRECOMPILED || k->kind == BPE_NORM_REPLACE_REGEX) {
            st = k->kind == BPE_NORM_PRECOMPILED ? charsmap_apply(k->map, k->map_n, v[cur].p, v[cur].n, &v[!cur].p, &v[!cur].n, &v[!cur].cap)
                                                 : replace_regex(k, &v[cur], &v[!cur]);
            cur = !cur;
            continue;
        }
        const int r = step(k, &v[cur], &v[!cur]);
        if (r == 0) st = oom();
        else if (r == 1) cur = !cur;
        else st = unicode_form(b->norms[i].kind, &v[cur]);
    }
    if (!st && base_grow((void **)out, cap, 4 * v[cur].n + 1, 1)) st = oom();
    const size_t m = st ? 0 : to_utf8(v[cur].p, v[cur].n, *out);
    *n_out = m;
    free(v[0].p), free(v[1].p);
    return st;
}

enum status metaspace_apply(const struct bpe *b, const uint8_t *s, size_t n, int first, uint8_t **out, size_t *n_out,
                            size_t *cap)
{
    static const uint8_t meta[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
    const int prepend = n && (b->metaspace_prepend == 2 || (b->metaspace_prepend == 1 && first)) && s[0] != ' ' &&
                        !(n >= 3 && !memcmp(s, meta, 3)); /* Hugging Face checks after the replacement */
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++) spaces += s[i] == ' ';
    if (base_grow((void **)out, cap, n + 2 * spaces + 3 * (size_t)prepend + 1, 1)) return oom();
    uint8_t *o = *out;
    if (prepend) memcpy(o, meta, 3), o += 3;
    for (size_t i = 0; i < n; i++)
        if (s[i] == ' ') memcpy(o, meta, 3), o += 3;
        else *o++ = s[i];
    *n_out = (size_t)(o - *out);
    return STATUS_OK;
}
