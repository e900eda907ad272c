/* engine/text/tokenizer_json_steps.c - a tokenizer.json's normalizer and decoder steps and the
 * pre-tokenizers of the non-byte-level kinds, read into a struct bpe (bpe.h): what
 * normalizer.c and text_decode.c then apply. Refused with STATUS_UNSUPPORTED naming the type:
 * Replace with a Regex pattern in a decoder, UnicodeScripts, CharDelimiterSplit,
 * the CTC and BPEDecoder decoders.
 * Not here: the model, vocabulary and added tokens (tokenizer_json.c).
 * Tests: tests/test_tokenizer_kinds.py. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_json.h"

static enum status oom(const struct bpe *b) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name); }

static const char *str_field(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(x) ? x->valuestring : NULL;
}

/* Replace's pattern: {"String": "..."} (a Regex is refused). */
static enum status pattern_string(const struct bpe *b, const cJSON *o, const char *field, const char **out)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (cJSON_GetObjectItemCaseSensitive(pat, "Regex"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: %s: Replace with a Regex pattern is not supported", b->name, field);
    *out = str_field(pat, "String");
    if (!*out || strlen(*out) > 64) return tjson_bad(b, field, "Replace has no pattern.String (of at most 64 bytes)");
    return STATUS_OK;
}

static enum status add_norm(struct bpe *b, enum bpe_norm_kind kind, const char *text, const char *with, int left, int right)
{
    size_t cap = (size_t)b->n_norms;
    if (base_grow((void **)&b->norms, &cap, cap + 1, sizeof *b->norms)) return oom(b);
    struct bpe_norm *k = &b->norms[b->n_norms];
    memset(k, 0, sizeof *k);
    k->kind = kind, k->left = left, k->right = right;
    if ((text && !(k->text = strdup(text))) || (with && !(k->with = strdup(with)))) return free(k->text), oom(b);
    b->n_norms++;
    return STATUS_OK;
}

enum status tjson_normalizer(struct bpe *b, const cJSON *n, int depth)
{
    if (!n || cJSON_IsNull(n)) return STATUS_OK;
    const char *type = tjson_type(n);
    enum status s;
    if (!cJSON_IsObject(n) || !type) return tjson_bad(b, "normalizer", "is not an object with a \"type\"");
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(type, forms[k])) return add_norm(b, (enum bpe_norm_kind)(BPE_NORM_NFC + k), NULL, NULL, 0, 0);
    if (!strcmp(type, "Lowercase")) return add_norm(b, BPE_NORM_LOWERCASE, NULL, NULL, 0, 0);
    if (!strcmp(type, "StripAccents")) return add_norm(b, BPE_NORM_STRIP_ACCENTS, NULL, NULL, 0, 0);
    if (!strcmp(type, "Sequence") && depth < 8) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return tjson_bad(b, "normalizer", "has no \"normalizers\" array");
        cJSON_ArrayForEach(e, list) if ((s = tjson_normalizer(b, e, depth + 1))) return s;
        return STATUS_OK;
    }
    if (!strcmp(type, "BertNormalizer")) {
        /* Hugging Face's order: clean_text, handle_chinese_chars, strip_accents (NFD, then the
         * marks dropped; null means as lowercase), lowercase. */
        int clean, chinese, lower, strip;
        if ((s = tjson_bool(b, n, "clean_text", "normalizer", 1, &clean)) ||
            (s = tjson_bool(b, n, "handle_chinese_chars", "normalizer", 1, &chinese)) ||
            (s = tjson_bool(b, n, "lowercase", "normalizer", 1, &lower)) ||
            (s = tjson_bool(b, n, "strip_accents", "normalizer", -1, &strip)))
            return s;
        if (strip < 0) strip = lower;
        if ((clean && (s = add_norm(b, BPE_NORM_BERT_CLEAN, NULL, NULL, 0, 0))) ||
            (chinese && (s = add_norm(b, BPE_NORM_BERT_CHINESE, NULL, NULL, 0, 0))) ||
            (strip && ((s = add_norm(b, BPE_NORM_NFD, NULL, NULL, 0, 0)) || (s = add_norm(b, BPE_NORM_STRIP_ACCENTS, NULL, NULL, 0, 0)))) ||
            (lower && (s = add_norm(b, BPE_NORM_LOWERCASE, NULL, NULL, 0, 0))))
            return s;
        return STATUS_OK;
    }
    if (!strcmp(type, "Replace")) {
        const char *pat, *with = str_field(n, "content");
        const char *re = str_field(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "Regex");
        if (re && with) return add_norm(b, BPE_NORM_REPLACE_REGEX, re, with, 0, 0);
        if ((s = pattern_string(b, n, "normalizer", &pat))) return s;
        if (!with || strlen(with) > 64) return tjson_bad(b, "normalizer", "Replace has no \"content\" string (of at most 64 bytes)");
        return add_norm(b, BPE_NORM_REPLACE, pat, with, 0, 0);
    }
    if (!strcmp(type, "Prepend")) {
        const char *with = str_field(n, "prepend");
        if (!with || strlen(with) > 64) return tjson_bad(b, "normalizer", "Prepend has no \"prepend\" string (of at most 64 bytes)");
        return add_norm(b, BPE_NORM_PREPEND, NULL, with, 0, 0);
    }
    if (!strcmp(type, "Precompiled")) {
        const char *map = str_field(n, "precompiled_charsmap");
        s = STATUS_OK;
        const size_t len = map ? strlen(map) : 0;
        uint8_t *bytes = map ? malloc(len / 4 * 3 + 4) : NULL;
        const long got = bytes ? bpe_base64_decode(map, len, bytes) : -1;
        if (map && !bytes) return oom(b);
        if (got < 0) s = tjson_bad(b, "normalizer", "Precompiled has no base64 \"precompiled_charsmap\" string");
        if (!s) s = charsmap_check(bytes, (size_t)got, b->name);
        if (!s) s = add_norm(b, BPE_NORM_PRECOMPILED, NULL, NULL, 0, 0);
        if (s) return free(bytes), s;
        b->norms[b->n_norms - 1].map = bytes, b->norms[b->n_norms - 1].map_n = (size_t)got;
        return STATUS_OK;
    }
    if (!strcmp(type, "Strip")) {
        int l, r;
        if ((s = tjson_bool(b, n, "strip_left", "normalizer", 1, &l)) || (s = tjson_bool(b, n, "strip_right", "normalizer", 1, &r)))
            return s;
        return add_norm(b, BPE_NORM_STRIP, NULL, NULL, l, r);
    }
    return status_errorf(STATUS_UNSUPPORTED,
                         "%s: normalizer type \"%s\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, "
                         "BertNormalizer, Replace, Prepend, Strip, Precompiled, Sequence)", b->name, type);
}

static enum status add_dec(struct bpe *b, enum bpe_dec_kind kind, const char *text, const char *with, int start, int stop, int flag)
{
    size_t cap = (size_t)b->n_decs;
    if (base_grow((void **)&b->decs, &cap, cap + 1, sizeof *b->decs)) return oom(b);
    struct bpe_dec *d = &b->decs[b->n_decs];
    memset(d, 0, sizeof *d);
    d->kind = kind, d->start = start, d->stop = stop, d->flag = flag;
    if ((text && !(d->text = strdup(text))) || (with && !(d->with = strdup(with)))) return free(d->text), oom(b);
    b->n_decs++;
    return STATUS_OK;
}

/* A Metaspace's prepend_scheme (or the older add_prefix_space): 0 never, 1 first, 2 always. */
static enum status prepend_scheme(const struct bpe *b, const cJSON *o, const char *field, int *scheme)
{
    const char *rep = str_field(o, "replacement"), *ps = str_field(o, "prepend_scheme");
    if (rep && strcmp(rep, "\xE2\x96\x81"))
        return status_errorf(STATUS_UNSUPPORTED, "%s: %s: Metaspace with a replacement other than U+2581", b->name, field);
    if (ps) {
        *scheme = !strcmp(ps, "never") ? 0 : !strcmp(ps, "first") ? 1 : !strcmp(ps, "always") ? 2 : -1;
        if (*scheme < 0) return tjson_bad(b, field, "Metaspace has an unknown prepend_scheme");
        return STATUS_OK;
    }
    int add = 1;
    enum status s = tjson_bool(b, o, "add_prefix_space", field, 1, &add);
    *scheme = add ? 2 : 0;
    return s;
}

static int get_count(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(x) && x->valuedouble >= 0 && x->valuedouble <= 64 ? (int)x->valuedouble : -1;
}

enum status tjson_decoder(struct bpe *b, const cJSON *d, int depth, int *byte_level)
{
    if (!d || cJSON_IsNull(d)) return STATUS_OK;
    const char *type = tjson_type(d);
    enum status s;
    if (!cJSON_IsObject(d) || !type) return tjson_bad(b, "decoder", "is not an object with a \"type\"");
    if (!strcmp(type, "ByteLevel")) return *byte_level = 1, STATUS_OK;
    if (!strcmp(type, "Sequence") && depth < 8) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        if (!cJSON_IsArray(list)) return tjson_bad(b, "decoder", "has no \"decoders\" array");
        cJSON_ArrayForEach(e, list) if ((s = tjson_decoder(b, e, depth + 1, byte_level))) return s;
        return STATUS_OK;
    }
    if (!strcmp(type, "ByteFallback")) return add_dec(b, BPE_DEC_BYTE_FALLBACK, NULL, NULL, 0, 0, 0);
    if (!strcmp(type, "Fuse")) return add_dec(b, BPE_DEC_FUSE, NULL, NULL, 0, 0, 0);
    if (!strcmp(type, "Replace")) {
        const char *pat, *with = str_field(d, "content");
        if ((s = pattern_string(b, d, "decoder", &pat))) return s;
        if (!with) return tjson_bad(b, "decoder", "Replace has no \"content\" string");
        return add_dec(b, BPE_DEC_REPLACE, pat, with, 0, 0, 0);
    }
    if (!strcmp(type, "Strip")) {
        const char *content = str_field(d, "content");
        const int start = get_count(d, "start"), stop = get_count(d, "stop");
        if (!content || start < 0 || stop < 0) return tjson_bad(b, "decoder", "Strip needs \"content\", \"start\" and \"stop\" (0..64)");
        return add_dec(b, BPE_DEC_STRIP, content, NULL, start, stop, 0);
    }
    if (!strcmp(type, "Metaspace")) {
        int scheme = 2;
        if ((s = prepend_scheme(b, d, "decoder", &scheme))) return s;
        return add_dec(b, BPE_DEC_METASPACE, NULL, NULL, 0, 0, scheme != 0);
    }
    if (!strcmp(type, "WordPiece")) {
        const char *prefix = str_field(d, "prefix");
        int cleanup;
        if ((s = tjson_bool(b, d, "cleanup", "decoder", 1, &cleanup))) return s;
        return add_dec(b, BPE_DEC_WORDPIECE, prefix ? prefix : "##", NULL, 0, 0, cleanup);
    }
    return status_errorf(STATUS_UNSUPPORTED,
                         "%s: decoder type \"%s\" is not supported (ByteLevel, ByteFallback, Fuse, Replace, Strip, Metaspace, "
                         "WordPiece, Sequence)", b->name, type);
}

/* BERT's punctuation (ASCII punctuation or any Unicode P*). */
#define PUNCT "[!-/:-@\\[-`{-~\\p{P}]"
/* Oniguruma's \w, which Hugging Face's Whitespace pre-tokenizer matches with: Alphabetic, marks,
 * decimal digits, connector punctuation, ZWNJ and ZWJ. Spelled without \p{Alphabetic} (PCRE2 >=
 * 10.40 only): letters, letter numbers, and the So characters that are Other_Alphabetic (circled
 * and squared Latin letters); PCRE2's own \w has neither the marks nor those. Checked against
 * `tokenizers` on every code point Unicode 3.2 assigns (tests/test_tokenizer_kinds.py); Hugging Face's
 * Oniguruma knows characters newer than PCRE2 10.42's Unicode 14. */
#define WORD_CHARS "\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}\\x{24B6}-\\x{24E9}\\x{1F130}-\\x{1F149}\\x{1F150}-\\x{1F169}\\x{1F170}-\\x{1F189}"
/* Rust's char::is_whitespace, also Oniguruma's \s as Hugging Face's Whitespace splits. */
#define WHITE_CHARS "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"
#define WHITE "[" WHITE_CHARS "]"

enum status tjson_pre_other(struct bpe *b, const cJSON *p, const char *type, const char *field, int *handled)
{
    enum status s;
    *handled = 1;
    if (!strcmp(type, "BertPreTokenizer"))
        return (s = tjson_add_split(b, WHITE "+", 0, BPE_SPLIT_REMOVED, 0)) ? s : tjson_add_split(b, PUNCT, 0, BPE_SPLIT_ISOLATED, 0);
    if (!strcmp(type, "WhitespaceSplit")) return tjson_add_split(b, WHITE "+", 0, BPE_SPLIT_REMOVED, 0);
    if (!strcmp(type, "Whitespace"))
        return tjson_add_split(b, "[" WORD_CHARS "]+|[^" WORD_CHARS WHITE_CHARS "]+", 0, BPE_SPLIT_REMOVED, 1);
    if (!strcmp(type, "Punctuation")) {
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        const char *beh = str_field(p, "behavior");
        int k = 0;
        while (beh && k < 5 && strcmp(beh, names[k])) k++;
        if (beh && k == 5) return tjson_bad(b, field, "Punctuation has an unknown behavior");
        return tjson_add_split(b, PUNCT, 0, beh ? (enum bpe_split_behavior)k : BPE_SPLIT_ISOLATED, 0);
    }
    if (!strcmp(type, "Metaspace")) {
        /* Its replacement is applied to the whole segment (normalizer.c), right only as the first step. */
        int split = 1;
        if (b->n_splits || b->metaspace)
            return status_errorf(STATUS_UNSUPPORTED, "%s: %s: Metaspace after another pre-tokenizer step", b->name, field);
        if ((s = prepend_scheme(b, p, field, &b->metaspace_prepend)) || (s = tjson_bool(b, p, "split", field, 1, &split))) return s;
        b->metaspace = 1;
        return split ? tjson_add_split(b, "\xE2\x96\x81", 1, BPE_SPLIT_MERGED_WITH_NEXT, 0) : STATUS_OK;
    }
    *handled = 0;
    return STATUS_OK;
}
