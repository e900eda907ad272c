/* engine/text/bpe.c - the tokenizer.json tokenizer (see bpe.h): the byte <-> unicode map, the
 * tables built at load, the NFC normalizer of byte-level BPE (ICU), the
 * regex pre-tokenizer (PCRE2, JIT when available), and the BPE merge loop (a min-heap of candidate
 * pairs over a linked list of symbols, the order Hugging Face's Word::merge_all uses) over bytes
 * (byte-level) or characters with byte fallback (BPE_MODEL_BPE).
 * Not here: added tokens' keys and matching (bpe_added.c), tokenizer.json parsing
 * (tokenizer_json.c), the other normalizers (normalizer.c),
 * WordPiece and Unigram (wordpiece.c, unigram.c), decoders (text_decode.c), the streaming
 * detokenizer (tokenizer.cc).
 * Tests: tests/test_bpe.py, tests/test_tokenizer.c. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bpe.h"

#include <limits.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

/* ---- the GPT-2 byte map --------------------------------------------------------------------
 * Bytes that are printable Latin-1 ('!'..'~', U+00A1..U+00AC, U+00AE..U+00FF) stand for
 * themselves; the 68 others take U+0100, U+0101, ... in byte order. */

static int byte_is_printable(int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE); }

uint32_t bpe_byte_to_cp(uint8_t c)
{
    if (byte_is_printable(c)) return c;
    uint32_t n = 0;
    for (int k = 0; k < c; k++) n += !byte_is_printable(k);
    return 256 + n;
}

int bpe_cp_to_byte(uint32_t cp)
{
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    uint32_t n = 256;
    for (int k = 0; k < 256; k++)
        if (!byte_is_printable(k) && n++ == cp) return k;
    return -1;
}

/* ---- hash tables -------------------------------------------------------------------------- */

/* 16 bytes: a slot of a byte-keyed table keeps only the hash and the id; the key is the id's
 * own bytes (the table's keys, lens), not a copy of the pointer and length (32-byte slots cost a
 * 49,152-piece vocabulary 12 MB of tables, 6 now). */
struct bpe_slot {
    uint64_t h;    /* the hash, or the pair key (left << 32 | right) */
    int32_t  val;  /* id, or rank; -1: empty slot */
    int32_t  val2; /* merged id of a pair */
};

struct bpe_table {
    size_t                 mask;
    struct bpe_slot       *slots;
    /* Byte-keyed tables: the key of the slot holding id v is keys[v], lens[v] bytes long (lens
     * NULL: NUL-terminated). */
    const uint8_t *const *keys;
    const uint32_t       *lens;
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static uint64_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = mix64(h ^ w);
    }
    uint64_t w = 0;
    memcpy(&w, s + i, n - i);
    return mix64(h ^ w ^ ((uint64_t)(n - i) << 56));
}

static struct bpe_table *table_new(size_t n_entries, const uint8_t *const *keys, const uint32_t *lens)
{
    size_t cap = 16;
    while (cap < 2 * n_entries + 16) cap <<= 1;
    struct bpe_table *t = malloc(sizeof *t);
    if (!t) return NULL;
    t->mask = cap - 1;
    t->keys = keys;
    t->lens = lens;
    t->slots = malloc(cap * sizeof *t->slots);
    if (!t->slots) return free(t), NULL;
    for (size_t i = 0; i < cap; i++) t->slots[i].val = -1;
    return t;
}

static void table_free(struct bpe_table *t)
{
    if (t) free(t->slots), free(t);
}

/* Whether the key of id v is the n bytes at s. */
static int table_key_is(const struct bpe_table *t, int32_t v, const uint8_t *s, size_t n)
{
    const uint8_t *k = t->keys[v];
    const size_t kn = t->lens ? t->lens[v] : strnlen((const char *)k, n + 1);
    return kn == n && !memcmp(k, s, n);
}

/* The slot of key (found, or the empty one where it goes: the caller sets its val to an id whose
 * key is s). */
static struct bpe_slot *table_bytes_slot(const struct bpe_table *t, const uint8_t *s, size_t n)
{
    const uint64_t h = hash_bytes(s, n);
    for (size_t i = h & t->mask;; i = (i + 1) & t->mask) {
        struct bpe_slot *e = &t->slots[i];
        if (e->val < 0 || (e->h == h && table_key_is(t, e->val, s, n))) {
            e->h = h;
            return e;
        }
    }
}

static struct bpe_slot *table_pair_slot(const struct bpe_table *t, int32_t a, int32_t b)
{
    const uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (size_t i = mix64(k) & t->mask;; i = (i + 1) & t->mask) {
        struct bpe_slot *e = &t->slots[i];
        if (e->val < 0 || e->h == k) {
            e->h = k;
            return e;
        }
    }
}

int32_t bpe_piece_to_id(const struct bpe *b, const char *piece, size_t n)
{
    const struct bpe_slot *e = table_bytes_slot(b->by_piece, (const uint8_t *)piece, n);
    return e->val;
}

static int32_t bytes_to_id(const struct bpe *b, const uint8_t *s, size_t n)
{
    return table_bytes_slot(b->by_bytes, s, n)->val;
}

/* ---- building ---------------------------------------------------------------------------- */

struct bpe *bpe_alloc(const char *name)
{
    struct bpe *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    if (!(b->name = strdup(name ? name : "tokenizer"))) return free(b), NULL;
    b->unk_id = b->bos_id = b->eos_id = b->pad_id = b->model_unk_id = -1;
    for (int c = 0; c < 256; c++) b->byte_id[c] = b->byte_piece[c] = -1;
    return b;
}

void bpe_free(struct bpe *b)
{
    if (!b) return;
    for (int i = 0; i < b->n_vocab; i++) {
        free(b->pieces[i]);
        free(b->bytes[i]);
    }
    free(b->pieces), free(b->bytes), free(b->n_bytes), free(b->flags), free(b->merges);
    for (int i = 0; i < b->n_added; i++) free(b->added[i].content), free(b->added[i].key);
    free(b->added);
    for (int i = 0; i < b->n_splits; i++) {
        free(b->splits[i].pattern);
        pcre2_code_free(b->splits[i].code);
    }
    free(b->splits);
    for (int i = 0; i < b->n_norms; i++)
        free(b->norms[i].text), free(b->norms[i].with), free(b->norms[i].map), pcre2_code_free(b->norms[i].code);
    free(b->norms), free(b->scores), free(b->wp_prefix);
    for (int i = 0; i < b->n_decs; i++) free(b->decs[i].text), free(b->decs[i].with);
    free(b->decs);
    table_free(b->by_piece), table_free(b->by_bytes), table_free(b->by_pair);
    for (int c = 0; c < 256; c++) free(b->added_by_byte[0][c]), free(b->added_by_byte[1][c]);
    for (int i = 0; b->dec_piece && i < b->n_vocab; i++) free(b->dec_piece[i]);
    free(b->dec_piece);
    free((void *)b->name);
    free(b);
}

/* Turns a piece into the bytes it stands for; 0 (and *out NULL) when some character is not a
 * byte-unicode one. */
static enum status piece_bytes(const char *piece, uint8_t **out, uint32_t *n, int *mapped)
{
    const size_t len = strlen(piece);
    uint8_t *o = malloc(len + 1);
    if (!o) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    size_t k = 0;
    *mapped = 1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        const size_t step = bpe_utf8_next((const uint8_t *)piece + i, len - i, &cp);
        const int byte = step ? bpe_cp_to_byte(cp) : -1;
        if (byte < 0) {
            *mapped = 0;
            break;
        }
        o[k++] = (uint8_t)byte;
        i += step;
    }
    if (!*mapped) {
        memcpy(o, piece, len);
        k = len;
    }
    *out = o;
    *n = (uint32_t)k;
    return STATUS_OK;
}

static int is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* The pattern as PCRE2 reads it: Hugging Face compiles tokenizer.json regexes with Oniguruma's
 * Ruby syntax, whose \uHHHH (four hex digits) PCRE2 refuses, so each unescaped one becomes
 * \x{HHHH}. Everything else is taken as written. Returns a malloc'd string, or NULL when out of
 * memory. */
static char *onig_to_pcre2(const char *pattern)
{
    const size_t len = strlen(pattern);
    char *o = malloc(len + len / 6 * 2 + 1); /* each 6-byte \uHHHH grows by 2 */
    if (!o) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        if (pattern[i] == '\\' && pattern[i + 1] == 'u' && is_hex(pattern[i + 2]) && is_hex(pattern[i + 3]) &&
            is_hex(pattern[i + 4]) && is_hex(pattern[i + 5])) {
            memcpy(o + k, "\\x{", 3);
            memcpy(o + k + 3, pattern + i + 2, 4);
            o[k + 7] = '}';
            k += 8, i += 6;
        } else if (pattern[i] == '\\' && pattern[i + 1]) { /* an escape pair, \\ included */
            o[k++] = pattern[i++];
            o[k++] = pattern[i++];
        } else {
            o[k++] = pattern[i++];
        }
    }
    o[k] = 0;
    return o;
}

static enum status compile_split(struct bpe *b, struct bpe_split *sp, const char *field, int k)
{
    int err;
    PCRE2_SIZE at;
    /* PCRE2_LITERAL refuses PCRE2_UCP (which only changes classes a literal has none of). */
    const uint32_t opts = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF | (sp->literal ? PCRE2_LITERAL : PCRE2_UCP);
    char *pattern = sp->literal ? NULL : onig_to_pcre2(sp->pattern);
    if (!sp->literal && !pattern) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)(pattern ? pattern : sp->pattern), PCRE2_ZERO_TERMINATED, opts, &err,
                                     &at, NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        const int changed = pattern && strcmp(pattern, sp->pattern) != 0;
        enum status s = status_errorf(STATUS_BAD_FORMAT, "%s: %s step %d: regex /%s/%s%s%s at offset %zu: %s", b->name,
                                      field, k, sp->pattern, changed ? " (as PCRE2 reads it: /" : "",
                                      changed ? pattern : "", changed ? "/)" : "", (size_t)at, (const char *)msg);
        free(pattern);
        return s;
    }
    free(pattern);
    /* JIT is an optimisation: without it (PCRE2 built without, or no executable memory) the
     * interpreter gives the same matches. */
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    sp->code = code;
    return STATUS_OK;
}

enum status bpe_index_pieces(struct bpe *b)
{
    table_free(b->by_piece);
    if (!(b->by_piece = table_new((size_t)b->n_vocab, (const uint8_t *const *)b->pieces, NULL)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    for (int id = 0; id < b->n_vocab; id++) {
        if (b->flags[id] & BPE_PIECE_UNUSED) continue;
        const char *p = b->pieces[id];
        struct bpe_slot *e = table_bytes_slot(b->by_piece, (const uint8_t *)p, strlen(p));
        if (e->val >= 0 && !(b->flags[id] & BPE_PIECE_ADDED) && !(b->flags[e->val] & BPE_PIECE_ADDED))
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.vocab: ids %d and %d have the same piece \"%.60s\"", b->name,
                                 e->val, id, p);
        if (e->val < 0) e->val = id;
    }
    return STATUS_OK;
}

static enum status finish_other(struct bpe *b);

/* OpenAI's harmony vocabulary (o200k_harmony, GPT-OSS): when <|return|> and <|call|> are both
 * special, the reply's structural markers <|channel|>, <|message|>, <|start|>, <|constrain|> and
 * <|end|> (which ends a message, not the reply) are shown in decoded text, as llama.cpp makes them
 * user-defined (llama-vocab.cpp), so that the harmony parser (server/tool_harmony.c) sees them;
 * they stay added tokens, matched whole. */
static void harmony_markers(struct bpe *b)
{
    static const char *const ends[] = {"<|return|>", "<|call|>"};
    static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "<|end|>"};
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        const int32_t id = bpe_piece_to_id(b, ends[i], strlen(ends[i]));
        if (id < 0 || !(b->flags[id] & BPE_PIECE_SPECIAL)) return;
    }
    for (size_t i = 0; i < sizeof shown / sizeof *shown; i++) {
        const int32_t id = bpe_piece_to_id(b, shown[i], strlen(shown[i]));
        if (id >= 0) b->flags[id] &= (uint8_t)~BPE_PIECE_SPECIAL;
    }
}

enum status bpe_finish(struct bpe *b)
{
    enum status s;
    if (b->n_vocab <= 0) return status_errorf(STATUS_BAD_FORMAT, "%s: model.vocab is empty", b->name);
    for (int k = 0; k < b->n_norms; k++) {
        struct bpe_norm *nm = &b->norms[k];
        if (nm->kind != BPE_NORM_REPLACE_REGEX) continue;
        struct bpe_split sp = {.pattern = nm->text};
        if ((s = compile_split(b, &sp, "normalizer", k))) return s;
        nm->code = sp.code;
    }
    if (b->nfc) {
        UErrorCode err = U_ZERO_ERROR;
        b->nfc_impl = unorm2_getNFCInstance(&err);
        if (U_FAILURE(err) || !b->nfc_impl)
            return status_errorf(STATUS_INTERNAL, "%s: ICU's NFC normalizer is unavailable (%s)", b->name, u_errorName(err));
    }
    if ((s = bpe_added_keys(b))) return s;
    if (!b->by_piece && (s = bpe_index_pieces(b))) return s;
    harmony_markers(b);
    if (!(b->by_bytes = table_new((size_t)b->n_vocab, (const uint8_t *const *)b->bytes, b->n_bytes)) ||
        !(b->by_pair = table_new((size_t)b->n_merges, NULL, NULL)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    size_t most = 1;
    for (int id = 0; id < b->n_vocab; id++) {
        if (b->flags[id] & BPE_PIECE_UNUSED) continue;
        const char *p = b->pieces[id];
        if (!b->bytes[id]) {
            int mapped = 0;
            if ((s = piece_bytes(p, &b->bytes[id], &b->n_bytes[id], &mapped))) return s;
            if (mapped && b->model == BPE_MODEL_BYTE_LEVEL) b->flags[id] |= BPE_PIECE_MAPPED;
        }
        if (b->model != BPE_MODEL_BYTE_LEVEL && !(b->flags[id] & BPE_PIECE_ADDED)) {
            const int byte = bpe_byte_piece_value(p);
            if (byte >= 0 && b->byte_piece[byte] < 0) b->byte_piece[byte] = id;
        }
        if (b->flags[id] & BPE_PIECE_MAPPED) {
            struct bpe_slot *f = table_bytes_slot(b->by_bytes, b->bytes[id], b->n_bytes[id]);
            if (f->val < 0) f->val = id;
            if (b->n_bytes[id] == 1 && b->byte_id[b->bytes[id][0]] < 0) b->byte_id[b->bytes[id][0]] = id;
        }
        const size_t covers = (b->flags[id] & BPE_PIECE_ADDED) ? strlen(p) : b->n_bytes[id];
        if (!(b->flags[id] & BPE_PIECE_SPECIAL) && covers > most) most = covers;
    }
    /* Each id covers at most `most` bytes of the text, and without a normalizer every input byte
     * reaches some id (invalid UTF-8 too: it falls between regex matches and is encoded byte by
     * byte), so ceil(non-space bytes / most) ids at least. A missing byte piece (dropped or
     * <unk>) or NFC (which composes characters) breaks that. */
    int all_bytes = 1;
    for (int c = 0; c < 256; c++) all_bytes &= b->byte_id[c] >= 0;
    b->max_token_bytes = (all_bytes && !b->nfc && b->model == BPE_MODEL_BYTE_LEVEL) ? most : 0;
    if (b->model != BPE_MODEL_BYTE_LEVEL) return finish_other(b);

    for (int r = 0; r < b->n_merges; r++) {
        const int32_t l = b->merges[2 * r], rr = b->merges[2 * r + 1];
        if (l < 0 || rr < 0 || l >= b->n_vocab || rr >= b->n_vocab || !(b->flags[l] & BPE_PIECE_MAPPED) ||
            !(b->flags[rr] & BPE_PIECE_MAPPED))
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.merges[%d] names a piece that is not a byte-level piece of the vocabulary",
                                 b->name, r);
        const size_t nl = b->n_bytes[l], nr = b->n_bytes[rr];
        uint8_t *cat = malloc(nl + nr);
        if (!cat) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
        memcpy(cat, b->bytes[l], nl);
        memcpy(cat + nl, b->bytes[rr], nr);
        const int32_t merged = bytes_to_id(b, cat, nl + nr);
        free(cat);
        if (merged < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.merges[%d] (\"%s %s\"): the merged piece is not in the vocabulary",
                                 b->name, r, b->pieces[l], b->pieces[rr]);
        struct bpe_slot *e = table_pair_slot(b->by_pair, l, rr);
        if (e->val < 0) e->val = b->merge_by_id ? merged : r, e->val2 = merged; /* a repeated merge keeps its first rank */
    }

    if ((s = bpe_build_added(b))) return s;
    for (int k = 0; k < b->n_splits; k++)
        if ((s = compile_split(b, &b->splits[k], "pre_tokenizer", k))) return s;
    return STATUS_OK;
}

/* The rest of bpe_finish for the non-byte-level kinds: merges of character BPE by the pieces'
 * concatenation, Unigram's score range and longest piece, and the added-token and regex tables
 * bpe_finish builds for every kind. */
static enum status finish_other(struct bpe *b)
{
    enum status s;
    for (int r = 0; r < b->n_merges; r++) {
        const int32_t l = b->merges[2 * r], rr = b->merges[2 * r + 1];
        const size_t nl = strlen(b->pieces[l]), nr = strlen(b->pieces[rr]);
        char *cat = malloc(nl + nr + 1);
        if (!cat) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
        memcpy(cat, b->pieces[l], nl);
        memcpy(cat + nl, b->pieces[rr], nr);
        const int32_t merged = bpe_piece_to_id(b, cat, nl + nr);
        free(cat);
        if (merged < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.merges[%d] (\"%.40s %.40s\"): the merged piece is not in the vocabulary",
                                 b->name, r, b->pieces[l], b->pieces[rr]);
        struct bpe_slot *e = table_pair_slot(b->by_pair, l, rr);
        if (e->val < 0) e->val = r, e->val2 = merged;
    }
    if (b->model == BPE_MODEL_UNIGRAM) {
        b->min_score = 0;
        for (int id = 0; id < b->n_vocab; id++) {
            if (isnan(b->scores[id])) continue;
            if (b->scores[id] < b->min_score) b->min_score = b->scores[id];
            int chars = 0;
            for (const char *q = b->pieces[id]; *q; q++) chars += ((uint8_t)*q & 0xC0) != 0x80;
            if (chars > b->max_piece_chars) b->max_piece_chars = chars;
        }
    }
    if ((s = bpe_build_added(b))) return s;
    for (int k = 0; k < b->n_splits; k++)
        if ((s = compile_split(b, &b->splits[k], "pre_tokenizer", k))) return s;
    return STATUS_OK;
}

/* ---- encoding ---------------------------------------------------------------------------- */

struct range {
    size_t at, n;
};

/* Per-call scratch: grown, never shrunk, freed at the end of bpe_encode. */
struct scratch {
    struct range *r[2];
    size_t        cap_r[2];
    uint8_t      *norm;    /* the segment after normalization */
    size_t        cap_norm;
    uint8_t      *pre;     /* one piece of it between normalized added tokens, after the prefix
                              space or Metaspace's replacement */
    size_t        cap_pre;
    UChar        *u16[2];
    size_t        cap_u16[2];
    int32_t      *sym_id, *sym_prev, *sym_next;
    size_t        cap_sym[3];
    struct merge *heap;
    size_t        cap_heap;
    pcre2_match_data *md;
};

struct merge {
    int32_t rank, pos, new_id;
};

static int merge_before(const struct merge *x, const struct merge *y)
{
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(struct merge *h, size_t *n, struct merge m)
{
    size_t i = (*n)++;
    while (i > 0) {
        const size_t p = (i - 1) / 2;
        if (!merge_before(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static struct merge heap_pop(struct merge *h, size_t *n)
{
    const struct merge top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_before(&h[c + 1], &h[c])) c++;
        if (!merge_before(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

enum status bpe_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap && base_grow((void **)ids, cap, *n + 1, sizeof **ids))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    (*ids)[(*n)++] = id;
    return STATUS_OK;
}

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory"); }

/* BPE over the bytes of one pre-token: one symbol per byte, then the lowest-ranked adjacent pair
 * merged first (leftmost on ties), as long as some adjacent pair is a merge. */
static enum status encode_word(const struct bpe *b, struct scratch *sc, const uint8_t *w, size_t n, int32_t **ids,
                               size_t *n_ids, size_t *cap)
{
    if (n == 1 && b->byte_id[w[0]] >= 0) return bpe_push_id(ids, n_ids, cap, b->byte_id[w[0]]);
    if (b->ignore_merges) {
        /* With ignore_merges a word that is a whole piece wins outright. */
        const int32_t whole = b->model == BPE_MODEL_BPE ? bpe_piece_to_id(b, (const char *)w, n) : bytes_to_id(b, w, n);
        if (whole >= 0) return bpe_push_id(ids, n_ids, cap, whole);
    }
    if (base_grow((void **)&sc->sym_id, &sc->cap_sym[0], n, sizeof(int32_t)) ||
        base_grow((void **)&sc->sym_prev, &sc->cap_sym[1], n, sizeof(int32_t)) ||
        base_grow((void **)&sc->sym_next, &sc->cap_sym[2], n, sizeof(int32_t)) ||
        /* The heap starts with at most n-1 pairs; each merge pops one and pushes at most two. */
        base_grow((void **)&sc->heap, &sc->cap_heap, 2 * n, sizeof(struct merge)))
        return oom();
    int32_t *id = sc->sym_id, *prev = sc->sym_prev, *next = sc->sym_next;
    int m = 0;
    /* Character BPE: one symbol per character; one without a piece becomes its <0xNN> pieces
     * (byte_fallback, when all of them exist) or <unk>, consecutive <unk>s fused into one. */
    for (size_t i = 0; i < n && b->model == BPE_MODEL_BPE;) {
        uint32_t cp;
        size_t k = bpe_utf8_next(w + i, n - i, &cp);
        if (!k) k = 1;
        int32_t x = bpe_piece_to_id(b, (const char *)w + i, k);
        int fell_back = 0;
        if (x < 0 && b->byte_fallback) {
            fell_back = 1;
            for (size_t j = 0; j < k; j++) fell_back &= b->byte_piece[w[i + j]] >= 0;
            for (size_t j = 0; j < k && fell_back; j++) id[m] = b->byte_piece[w[i + j]], prev[m] = m - 1, next[m] = m + 1, m++;
        }
        if (x < 0 && !fell_back && (x = b->model_unk_id) >= 0 && b->fuse_unk && m > 0 && id[m - 1] == x) x = -1;
        if (x >= 0) id[m] = x, prev[m] = m - 1, next[m] = m + 1, m++;
        i += k;
    }
    /* A byte without a piece becomes <unk> (Hugging Face's BPE), or nothing without one. */
    for (size_t i = 0; i < n && b->model == BPE_MODEL_BYTE_LEVEL; i++) {
        const int32_t x = b->byte_id[w[i]] >= 0 ? b->byte_id[w[i]] : b->model_unk_id;
        if (x < 0) continue;
        id[m] = x, prev[m] = m - 1, next[m] = m + 1;
        m++;
    }
    if (!m) return STATUS_OK;
    next[m - 1] = -1;
    size_t nh = 0;
    for (int i = 0; i + 1 < m; i++) {
        const struct bpe_slot *e = table_pair_slot(b->by_pair, id[i], id[i + 1]);
        if (e->val >= 0) heap_push(sc->heap, &nh, (struct merge){e->val, i, e->val2});
    }
    while (nh) {
        const struct merge top = heap_pop(sc->heap, &nh);
        const int32_t p = top.pos, q = next[p];
        /* Stale entries: the left symbol was merged away (id -1) or the pair changed. */
        if (id[p] < 0 || q < 0) continue;
        const struct bpe_slot *e = table_pair_slot(b->by_pair, id[p], id[q]);
        if (e->val < 0 || e->val2 != top.new_id) continue;
        id[p] = top.new_id;
        id[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            const struct bpe_slot *f = table_pair_slot(b->by_pair, id[prev[p]], id[p]);
            if (f->val >= 0) heap_push(sc->heap, &nh, (struct merge){f->val, prev[p], f->val2});
        }
        if (next[p] >= 0) {
            const struct bpe_slot *f = table_pair_slot(b->by_pair, id[p], id[next[p]]);
            if (f->val >= 0) heap_push(sc->heap, &nh, (struct merge){f->val, p, f->val2});
        }
    }
    enum status s = STATUS_OK;
    for (int i = 0; i >= 0 && s == STATUS_OK; i = next[i]) s = bpe_push_id(ids, n_ids, cap, id[i]);
    return s;
}

/* The matches of split step sp in text[0..n): calls emit for each resulting piece per the
 * behaviour. Pieces are appended to *out. */
static enum status split_range(const struct bpe *b, const struct bpe_split *sp, struct scratch *sc,
                               const uint8_t *text, struct range in, struct range **out, size_t *n_out,
                               size_t *cap_out)
{
    const uint8_t *s = text + in.at;
    size_t at = 0, gap = 0; /* gap: where the text not yet emitted starts */
    size_t pending_at = 0, pending_n = 0; /* a piece held for MergedWith* and Contiguous */
    int have_pending = 0, pending_is_match = 0;
#define EMIT(a, len)                                                                               \
    do {                                                                                           \
        if ((len) > 0) {                                                                           \
            if (*n_out == *cap_out && base_grow((void **)out, cap_out, *n_out + 1, sizeof **out))  \
                return oom();                                                                      \
            (*out)[(*n_out)++] = (struct range){in.at + (a), (len)};                               \
        }                                                                                          \
    } while (0)
    /* Feeds one (start, length, is_match) segment through the behaviour. */
#define SEGMENT(a, len, is_match_)                                                                  \
    do {                                                                                            \
        const size_t sa_ = (a), sn_ = (len);                                                        \
        const int m_ = (is_match_) != sp->invert;                                                   \
        if (sn_ == 0) break;                                                                        \
        switch (sp->behavior) {                                                                     \
        case BPE_SPLIT_ISOLATED: EMIT(sa_, sn_); break;                                             \
        case BPE_SPLIT_REMOVED: if (!m_) EMIT(sa_, sn_); break;                                     \
        case BPE_SPLIT_MERGED_WITH_PREVIOUS:                                                        \
            if (m_ && have_pending) pending_n += sn_;                                               \
            else {                                                                                  \
                if (have_pending) EMIT(pending_at, pending_n);                                      \
                pending_at = sa_, pending_n = sn_, have_pending = 1;                                \
            }                                                                                       \
            break;                                                                                  \
        case BPE_SPLIT_MERGED_WITH_NEXT:                                                            \
            if (have_pending && pending_is_match) pending_n += sn_, pending_is_match = m_;          \
            else {                                                                                  \
                if (have_pending) EMIT(pending_at, pending_n);                                      \
                pending_at = sa_, pending_n = sn_, have_pending = 1, pending_is_match = m_;         \
            }                                                                                       \
            break;                                                                                  \
        case BPE_SPLIT_CONTIGUOUS:                                                                  \
            if (have_pending && m_ && pending_is_match) pending_n += sn_;                           \
            else {                                                                                  \
                if (have_pending) EMIT(pending_at, pending_n);                                      \
                pending_at = sa_, pending_n = sn_, have_pending = 1, pending_is_match = m_;         \
            }                                                                                       \
            break;                                                                                  \
        }                                                                                           \
    } while (0)

    while (at <= in.n) {
        int rc = pcre2_match(sp->code, s, in.n, at, 0, sc->md, NULL);
        /* A repeated group over a long run (exaone-moe's words joined by single spaces) can
         * outgrow the JIT's 32 KiB stack; the interpreter keeps its frames on the heap. */
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) rc = pcre2_match(sp->code, s, in.n, at, PCRE2_NO_JIT, sc->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return status_errorf(STATUS_INTERNAL, "%s: regex /%s/ failed: %s", b->name, sp->pattern, (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        const size_t ms = ov[0], me = ov[1];
        if (me == ms) {
            /* An empty match splits nothing; step over one character. */
            at = ms + 1;
            while (at < in.n && (s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        SEGMENT(gap, ms - gap, 0);
        SEGMENT(ms, me - ms, 1);
        gap = at = me;
    }
    SEGMENT(gap, in.n - gap, 0);
    if (have_pending) EMIT(pending_at, pending_n);
#undef SEGMENT
#undef EMIT
    return STATUS_OK;
}

/* NFC of s[0..n) into sc->norm; *n_out its length. Text
 * that is not valid UTF-8 is normalized with U+FFFD in place of each invalid subpart. */
static enum status nfc_into(const struct bpe *b, struct scratch *sc, const uint8_t *s, size_t n, size_t *n_out)
{
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = s[i] < 0x80;
    if (ascii || !b->nfc) {
        if (base_grow((void **)&sc->norm, &sc->cap_norm, n + 1, 1)) return oom();
        memcpy(sc->norm, s, n);
        *n_out = n;
        return STATUS_OK;
    }
    if (n > INT32_MAX / 4) return status_errorf(STATUS_INVALID_ARGUMENT, "tokenizer: text too long to normalize");
    UErrorCode err = U_ZERO_ERROR;
    int32_t n16 = 0;
    if (base_grow((void **)&sc->u16[0], &sc->cap_u16[0], n + 1, sizeof(UChar))) return oom();
    u_strFromUTF8WithSub(sc->u16[0], (int32_t)n + 1, &n16, (const char *)s, (int32_t)n, 0xFFFD, NULL, &err);
    if (U_FAILURE(err)) return status_errorf(STATUS_INTERNAL, "tokenizer: UTF-8 to UTF-16: %s", u_errorName(err));
    const size_t cap16 = 3 * (size_t)n16 + 16; /* NFC grows text by at most 3x */
    if (base_grow((void **)&sc->u16[1], &sc->cap_u16[1], cap16, sizeof(UChar))) return oom();
    const int32_t m16 = unorm2_normalize(b->nfc_impl, sc->u16[0], n16, sc->u16[1], (int32_t)cap16, &err);
    if (U_FAILURE(err)) return status_errorf(STATUS_INTERNAL, "tokenizer: NFC: %s", u_errorName(err));
    const size_t cap8 = 3 * (size_t)m16 + 1;
    if (base_grow((void **)&sc->norm, &sc->cap_norm, cap8, 1)) return oom();
    int32_t m8 = 0;
    u_strToUTF8((char *)sc->norm, (int32_t)cap8, &m8, sc->u16[1], m16, &err);
    if (U_FAILURE(err)) return status_errorf(STATUS_INTERNAL, "tokenizer: UTF-16 to UTF-8: %s", u_errorName(err));
    *n_out = (size_t)m8;
    return STATUS_OK;
}

/* A normalized piece of text between added tokens (the text's first when first is non-zero):
 * the prefix space (ByteLevel) or Metaspace's replacement, the pre-tokenizer's splits, the model
 * on each pre-token. */
static enum status encode_piece(const struct bpe *b, struct scratch *sc, const uint8_t *s, size_t n, int first,
                                int32_t **ids, size_t *n_ids, size_t *cap)
{
    if (!n) return STATUS_OK;
    size_t m = n;
    enum status st;
    if (b->model != BPE_MODEL_BYTE_LEVEL && b->metaspace) {
        if ((st = metaspace_apply(b, s, n, first, &sc->pre, &m, &sc->cap_pre))) return st;
    } else {
        const size_t prefix = b->model == BPE_MODEL_BYTE_LEVEL && b->add_prefix_space && s[0] != ' ';
        if (base_grow((void **)&sc->pre, &sc->cap_pre, prefix + n + 1, 1)) return oom();
        if (prefix) sc->pre[0] = ' ';
        memcpy(sc->pre + prefix, s, n);
        m = prefix + n;
    }
    const uint8_t *text = sc->pre;
    size_t nr = 1;
    if (base_grow((void **)&sc->r[0], &sc->cap_r[0], 1, sizeof(struct range))) return oom();
    sc->r[0][0] = (struct range){0, m};
    int cur = 0;
    for (int k = 0; k < b->n_splits; k++) {
        size_t n_next = 0;
        for (size_t i = 0; i < nr; i++)
            if ((st = split_range(b, &b->splits[k], sc, text, sc->r[cur][i], &sc->r[!cur], &n_next, &sc->cap_r[!cur])))
                return st;
        cur = !cur;
        nr = n_next;
    }
    for (size_t i = 0; i < nr; i++) {
        const uint8_t *w = text + sc->r[cur][i].at;
        const size_t wn = sc->r[cur][i].n;
        if (b->model == BPE_MODEL_WORDPIECE) st = wordpiece_encode_word(b, w, wn, ids, n_ids, cap);
        else if (b->model == BPE_MODEL_UNIGRAM) st = unigram_encode_word(b, w, wn, ids, n_ids, cap);
        else if (b->model == BPE_MODEL_WORDLEVEL) st = wordlevel_encode_word(b, w, wn, ids, n_ids, cap);
        else st = encode_word(b, sc, w, wn, ids, n_ids, cap);
        if (st) return st;
    }
    return STATUS_OK;
}

/* s[0..n) by the tokenizer's normalizer (NFC or none for byte-level BPE) into sc->norm. */
static enum status normalize_into(const struct bpe *b, struct scratch *sc, const uint8_t *s, size_t n, size_t *m)
{
    if (b->model != BPE_MODEL_BYTE_LEVEL) return normalizer_apply(b, s, n, &sc->norm, m, &sc->cap_norm);
    return nfc_into(b, sc, s, n, m);
}

enum status bpe_normalize(const struct bpe *b, const uint8_t *s, size_t n, uint8_t **out, size_t *n_out)
{
    struct scratch sc;
    memset(&sc, 0, sizeof sc);
    enum status st = normalize_into(b, &sc, s, n, n_out);
    free(sc.u16[0]), free(sc.u16[1]);
    if (st != STATUS_OK) free(sc.norm), sc.norm = NULL;
    *out = sc.norm;
    return st;
}

/* One stretch of the raw text between the added tokens matched on it (the text's first when
 * first is non-zero): normalized, then cut at the `normalized` added tokens (matched on the
 * normalized text, as Hugging Face's second pass does), each piece between them encoded. */
static enum status encode_segment(const struct bpe *b, struct scratch *sc, const uint8_t *s, size_t n, int first,
                                  int32_t **ids, size_t *n_ids, size_t *cap)
{
    if (!n) return STATUS_OK;
    size_t m = 0;
    enum status st;
    if ((st = normalize_into(b, sc, s, n, &m))) return st;
    for (size_t pos = 0; pos < m;) {
        size_t at = m, end = m;
        const int k = bpe_find_added(b, 1, sc->norm, m, pos, &at, &end);
        if (k < 0) at = end = m;
        if ((st = encode_piece(b, sc, sc->norm + pos, at - pos, first && pos == 0, ids, n_ids, cap))) return st;
        if (k >= 0 && (st = bpe_push_id(ids, n_ids, cap, b->added[k].id))) return st;
        pos = end;
    }
    return STATUS_OK;
}

enum status bpe_encode(const struct bpe *b, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap)
{
    struct scratch sc;
    memset(&sc, 0, sizeof sc);
    enum status st = STATUS_OK;
    const uint8_t *s = (const uint8_t *)text;
    if (b->n_splits && !(sc.md = pcre2_match_data_create(8, NULL))) return oom();
    for (size_t pos = 0; pos < len && st == STATUS_OK;) {
        size_t at = len, end = len;
        const int k = b->n_added ? bpe_find_added(b, 0, s, len, pos, &at, &end) : -1;
        if (k < 0) at = end = len;
        st = encode_segment(b, &sc, s + pos, at - pos, pos == 0, ids, n, cap);
        if (st == STATUS_OK && k >= 0) st = bpe_push_id(ids, n, cap, b->added[k].id);
        pos = end;
    }
    pcre2_match_data_free(sc.md);
    free(sc.r[0]), free(sc.r[1]), free(sc.norm), free(sc.pre), free(sc.u16[0]), free(sc.u16[1]);
    free(sc.sym_id), free(sc.sym_prev), free(sc.sym_next), free(sc.heap);
    return st;
}
