/* engine/text/bpe_added.c - a tokenizer.json tokenizer's added tokens (see bpe.h): their keys
 * (the content, normalized for the `normalized` ones, as Hugging Face makes them), the tables
 * they are matched by (raw text first, normalized text second: Hugging Face's two passes), and
 * the matching itself with lstrip / rstrip / single_word.
 * Not here: parsing them (tokenizer_json.c, tiktoken.c), encoding around them (bpe.c).
 * Tests: tests/test_bpe.py, tests/test_tokenizer_kinds.py. */
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>

#include "bpe.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory"); }

/* The keys of the added tokens: the content, or for a `normalized` one its content normalized,
 * which also becomes its content and piece (Hugging Face matches and decodes such a token as the
 * normalized text). An id that is a piece of the model too keeps its piece for the merges and
 * the model; the non-byte-level decoders take the key from dec_piece (byte-level BPE decodes
 * the piece: a known difference). The piece index is rebuilt if a piece changed after it was
 * built. */
enum status bpe_added_keys(struct bpe *b)
{
    enum status st = STATUS_OK;
    int changed = 0;
    for (int i = 0; i < b->n_added && !st; i++) {
        struct bpe_added *a = &b->added[i];
        size_t m = a->n;
        uint8_t *norm = NULL;
        const uint8_t *k = (const uint8_t *)a->content;
        if (a->normalized && a->n && !(st = bpe_normalize(b, k, a->n, &norm, &m))) k = norm;
        if (!st && !(a->key = malloc(m + 1))) st = oom();
        if (!st) memcpy(a->key, k, m), a->key[m] = 0, a->n_key = m;
        free(norm);
        if (st) break;
        if (m == a->n && !memcmp(a->key, a->content, m)) continue;
        if (a->in_model) {
            if (b->model == BPE_MODEL_BYTE_LEVEL) continue;
            if (!b->dec_piece && !(b->dec_piece = calloc((size_t)b->n_vocab, sizeof *b->dec_piece))) {
                st = oom();
                break;
            }
            free(b->dec_piece[a->id]);
            if (!(b->dec_piece[a->id] = strdup(a->key))) st = oom();
            continue;
        }
        char *c = strdup(a->key), *p = strdup(a->key);
        if (!c || !p) {
            free(c), free(p);
            st = oom();
            break;
        }
        free(a->content), a->content = c, a->n = m;
        free(b->pieces[a->id]), b->pieces[a->id] = p;
        free(b->bytes[a->id]), b->bytes[a->id] = NULL, b->n_bytes[a->id] = 0;
        changed = 1;
    }
    if (!st && changed && b->by_piece) st = bpe_index_pieces(b);
    return st;
}

/* Added tokens by their key's first byte, longest first, in two tables: the tokens matched on
 * the raw text and the `normalized` ones. */
enum status bpe_build_added(struct bpe *b)
{
    for (int t = 0; t < 2; t++)
        for (int c = 0; c < 256; c++) {
#define IN_TABLE(a) ((a)->n_key && !(a)->normalized == !t && (uint8_t)(a)->key[0] == c)
            int cnt = 0;
            for (int i = 0; i < b->n_added; i++) cnt += IN_TABLE(&b->added[i]);
            if (!cnt) continue;
            int32_t *l = b->added_by_byte[t][c] = malloc(((size_t)cnt + 1) * sizeof(int32_t));
            if (!l) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
            cnt = 0;
            for (int i = 0; i < b->n_added; i++)
                if (IN_TABLE(&b->added[i])) l[cnt++] = i;
#undef IN_TABLE
            /* Longest first (leftmost-longest matching), by insertion: the lists are short. */
            for (int i = 1; i < cnt; i++)
                for (int j = i; j > 0 && b->added[l[j]].n_key > b->added[l[j - 1]].n_key; j--) {
                    const int32_t x = l[j];
                    l[j] = l[j - 1], l[j - 1] = x;
                }
            l[cnt] = -1;
        }
    return STATUS_OK;
}

/* Rust regex's \w (Hugging Face's single_word test): alphabetic, marks, decimal digits,
 * connector punctuation, join controls. */
static int cp_is_word(uint32_t c)
{
    if (c < 0x80) return c == '_' || (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z');
    const int8_t t = u_charType((UChar32)c);
    return u_hasBinaryProperty((UChar32)c, UCHAR_ALPHABETIC) || t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK ||
           t == U_COMBINING_SPACING_MARK || t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION ||
           u_hasBinaryProperty((UChar32)c, UCHAR_JOIN_CONTROL);
}

/* Whether the character ending at s[at] (before it) or starting at s[at] (after it) is a word
 * character; invalid UTF-8 is not. */
static int word_before(const uint8_t *s, size_t at)
{
    for (size_t len = 1; len <= 4 && len <= at; len++) {
        uint32_t cp;
        if (bpe_utf8_next(s + at - len, len, &cp) == len) return cp_is_word(cp);
    }
    return 0;
}

static int word_after(const uint8_t *s, size_t n, size_t at)
{
    uint32_t cp;
    return at < n && bpe_utf8_next(s + at, n - at, &cp) && cp_is_word(cp);
}

/* The first added token of added_by_byte[table] in s[from..n) (leftmost, then longest): its
 * index, and the span it takes with lstrip/rstrip whitespace (never before `from`). -1 when none. */
int bpe_find_added(const struct bpe *b, int table, const uint8_t *s, size_t n, size_t from, size_t *m_at,
                      size_t *m_end)
{
    for (size_t p = from; p < n; p++) {
        const int32_t *cand = b->added_by_byte[table][s[p]];
        if (!cand) continue;
        for (; *cand >= 0; cand++) {
            const struct bpe_added *a = &b->added[*cand];
            if (a->n_key > n - p || memcmp(s + p, a->key, a->n_key)) continue;
            size_t at = p, end = p + a->n_key;
            if (a->single_word && (word_before(s, at) || word_after(s, n, end)))
                continue;
            if (a->lstrip)
                while (at > from) { /* step back one whole whitespace character at a time */
                    size_t back = 0;
                    uint32_t cp = 0;
                    for (size_t len = 1; len <= 4 && len <= at - from && !back; len++)
                        if (bpe_utf8_next(s + at - len, len, &cp) == len) back = len;
                    if (!back || !bpe_cp_is_space(cp)) break;
                    at -= back;
                }
            if (a->rstrip)
                for (;;) {
                    uint32_t cp;
                    const size_t step = bpe_utf8_next(s + end, n - end, &cp);
                    if (!step || !bpe_cp_is_space(cp)) break;
                    end += step;
                }
            *m_at = at, *m_end = end;
            return *cand;
        }
    }
    return -1;
}

