/* engine/grammar/grammar_sets.c - sets as byte-level expressions of the tree (grammar_ir.c): code
 * point sets as UTF-8 byte sequences (gx_codepoints, for regex classes and JSON strings), and
 * decimal integers in a range digit by digit (gx_uint_range, for JSON Schema's bounds).
 * Tests: tests/test_grammar.c, tests/test_grammar.py (llguidance as the oracle). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

/* ---- code point sets ---- */
void cpset_add(struct cpset *s, uint32_t lo, uint32_t hi)
{
    if (lo > hi) return;
    size_t cap = (size_t)s->cap;
    size_t cap2 = cap;
    CHECK(!base_grow((void **)&s->lo, &cap, (size_t)s->n + 1, sizeof *s->lo), "out of memory");
    CHECK(!base_grow((void **)&s->hi, &cap2, (size_t)s->n + 1, sizeof *s->hi), "out of memory");
    s->cap = (int)cap;
    s->lo[s->n] = lo, s->hi[s->n] = hi, s->n++;
}

void cpset_normalize(struct cpset *s)
{
    for (int i = 1; i < s->n; i++) /* insertion sort: classes are short */
        for (int j = i; j > 0 && s->lo[j] < s->lo[j - 1]; j--) {
            uint32_t t = s->lo[j]; s->lo[j] = s->lo[j - 1]; s->lo[j - 1] = t;
            t = s->hi[j]; s->hi[j] = s->hi[j - 1]; s->hi[j - 1] = t;
        }
    int k = 0;
    for (int i = 0; i < s->n; i++) {
        if (k && s->lo[i] <= s->hi[k - 1] + 1) {
            if (s->hi[i] > s->hi[k - 1]) s->hi[k - 1] = s->hi[i];
        } else {
            s->lo[k] = s->lo[i], s->hi[k] = s->hi[i], k++;
        }
    }
    s->n = k;
}

void cpset_negate(struct cpset *s)
{
    cpset_normalize(s);
    struct cpset t = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->lo[i] > next) cpset_add(&t, next, s->lo[i] - 1);
        next = s->hi[i] + 1;
    }
    if (next <= 0x10FFFF) cpset_add(&t, next, 0x10FFFF);
    cpset_free(s);
    *s = t;
}

void cpset_free(struct cpset *s)
{
    free(s->lo), free(s->hi);
    memset(s, 0, sizeof *s);
}

static int utf8_encode(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | ((cp >> 6) & 63)), o[2] = (uint8_t)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)), o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

struct seqs { struct gx **v; int n, cap; };

static void seqs_push(struct gbuild *b, struct seqs *s, struct gx *x)
{
    if (!x) return;
    size_t cap = (size_t)s->cap;
    if (base_grow((void **)&s->v, &cap, (size_t)s->n + 1, sizeof *s->v)) {
        gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "grammar: out of memory");
        return;
    }
    s->cap = (int)cap;
    s->v[s->n++] = x;
}

/* The classic split of a code point range into ranges whose UTF-8 forms are products of byte
 * ranges (as Rust's utf8-ranges and RE2 do). lo and hi have the same encoded length. */
static void utf8_split(struct gbuild *b, struct seqs *out, uint32_t lo, uint32_t hi)
{
    uint8_t a[4], z[4];
    int n = utf8_encode(lo, a);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                utf8_split(b, out, lo, lo | m);
                utf8_split(b, out, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_split(b, out, lo, (hi & ~m) - 1);
                utf8_split(b, out, hi & ~m, hi);
                return;
            }
        }
    }
    utf8_encode(hi, z);
    struct gx *k[4];
    for (int i = 0; i < n; i++) k[i] = gx_byte_range(b, a[i], z[i]);
    seqs_push(b, out, gx_seq(b, n, k));
}

struct gx *gx_codepoints(struct gbuild *b, const uint32_t *lo, const uint32_t *hi, int n)
{
    static const uint32_t bounds[][2] = {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
    struct seqs out = {0};
    struct gx *ascii = NULL;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 5; j++) {
            uint32_t l = lo[i] > bounds[j][0] ? lo[i] : bounds[j][0];
            uint32_t h = hi[i] < bounds[j][1] ? hi[i] : bounds[j][1];
            if (l > h) continue;
            if (j == 0) { /* one byte set for all ASCII ranges */
                if (!ascii) ascii = gx_byte_range(b, 1, 0); /* (an empty byte set) */
                if (ascii)
                    for (uint32_t c = l; c <= h; c++) ascii->set[c >> 5] |= 1u << (c & 31);
            } else {
                utf8_split(b, &out, l, h);
            }
        }
    if (ascii) seqs_push(b, &out, ascii);
    struct gx *r = NULL;
    if (out.n == 0) {
        gb_fail(b, STATUS_INVALID_ARGUMENT, "grammar: an empty character class matches nothing");
    } else {
        r = gx_alt(b, out.n, out.v);
    }
    free(out.v);
    return r;
}

/* ---- integers in a range: digit-by-digit expressions (JSON Schema's minimum / maximum) ---- */
static struct gx *digit_range(struct gbuild *b, int lo, int hi) { return gx_byte_range(b, '0' + lo, '0' + hi); }

/* Numbers of exactly the digits of a..z (same length, decimal strings). Linear in n: the full
 * range 0..0 to 9..9 is one repeat, so that of the two recursions below, at most one goes on
 * (until 2026-12-02 both did: 2^n expressions, 0.1 s for 16 digits, a fuzzing find). */
static struct gx *same_len(struct gbuild *b, const char *a, const char *z, int n)
{
    if (n == 1) return digit_range(b, a[0] - '0', z[0] - '0');
    char nines[24], zeros[24];
    memset(nines, '9', (size_t)n), memset(zeros, '0', (size_t)n);
    if (!memcmp(a, zeros, (size_t)n) && !memcmp(z, nines, (size_t)n)) return gx_repeat(b, digit_range(b, 0, 9), n, n);
    if (a[0] == z[0]) return gx_seq2(b, digit_range(b, a[0] - '0', a[0] - '0'), same_len(b, a + 1, z + 1, n - 1));
    struct gx *alts[3];
    int k = 0;
    alts[k++] = gx_seq2(b, digit_range(b, a[0] - '0', a[0] - '0'), same_len(b, a + 1, nines, n - 1));
    if (a[0] + 1 <= z[0] - 1) alts[k++] = gx_seq2(b, digit_range(b, a[0] - '0' + 1, z[0] - '0' - 1), gx_repeat(b, digit_range(b, 0, 9), n - 1, n - 1));
    alts[k++] = gx_seq2(b, digit_range(b, z[0] - '0', z[0] - '0'), same_len(b, zeros, z + 1, n - 1));
    return gx_alt(b, k, alts);
}

struct gx *gx_uint_range(struct gbuild *b, long long lo, long long hi)
{
    char a[24], z[24];
    struct gx *alts[24];
    int k = 0;
    int la = snprintf(a, sizeof a, "%lld", lo);
    for (int len = la; len <= 19; len++) {
        long long top = 9223372036854775807LL; /* 19 digits: bounds are at most 1e18 */
        if (len < 19) { top = 1; for (int i = 0; i < len; i++) top *= 10; top -= 1; }
        long long from = len == la ? lo : top / 10 + 1;
        if (hi >= 0 && from > hi) break;
        if (hi < 0 && len > la) { /* every longer number */
            alts[k++] = gx_seq2(b, digit_range(b, 1, 9), gx_repeat(b, digit_range(b, 0, 9), len - 1, -1));
            break;
        }
        long long to = hi >= 0 && hi < top ? hi : top;
        snprintf(a, sizeof a, "%lld", from), snprintf(z, sizeof z, "%lld", to);
        alts[k++] = same_len(b, a, z, len);
        if (to == hi) break;
    }
    return gx_alt(b, k, alts);
}
