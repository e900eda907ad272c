/* engine/text/tiktoken.c - a tiktoken rank file read into a byte-level struct bpe (bpe.h): OpenAI's
 * *.tiktoken files, Llama 3's original tokenizer.model, Kimi's tiktoken.model. Each line is
 * "BASE64 RANK": the token's bytes and its rank, which is also its id. The file carries neither the
 * pre-tokenizer pattern nor the special tokens; they come from the caller, a tokenizer_config.json
 * beside the file ("pat_str", "added_tokens_decoder", "bos_token"/"eos_token"), or the encoding the
 * number of ranks names (r50k, cl100k, o200k, Llama 3).
 * tiktoken's merge rule is kept exactly: the adjacent pair whose concatenation has the lowest rank
 * is merged first, leftmost on ties, and a pre-token that is a token is taken whole. So every split
 * of a token into two tokens becomes a merge whose priority is the merged token's id
 * (b->merge_by_id), and ignore_merges is on.
 * Every error names the file and the line or field. Not here: the BPE itself (bpe.c), the
 * regexes' compilation (bpe_finish), tokenizer_config.json's bos/eos/pad (tjson_config).
 * Tests: tests/test_tiktoken.py (against the tiktoken package), tests/fuzz/fuzz_tokenizer_json.c. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_json.h"

/* The largest rank accepted: beyond any real vocabulary (o200k_harmony has 201,088 ids). */
#define TIKTOKEN_MAX_RANK (1 << 22)
/* The longest token accepted, in bytes (base64 of 256 bytes is 344 characters): the published
 * encodings' longest are 128; the merges cost the square of a token's length. */
#define TIKTOKEN_MAX_TOKEN 256

/* The patterns of the encodings tiktoken ships (tiktoken_ext/openai_public.py, 0.14) and of Llama
 * 3's tokenizer.py, in PCRE2 syntax (possessive quantifiers and (?i:) are the same there). */
static const char r50k_pattern[] = "'(?:[sdmt]|ll|ve|re)| ?\\p{L}++| ?\\p{N}++| ?[^\\s\\p{L}\\p{N}]++|\\s++$|\\s+(?!\\S)|\\s";
static const char cl100k_pattern[] = "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+"
                                     "|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s";
static const char o200k_pattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char llama3_pattern[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Llama 3.1's named special tokens; ids 128000.. in this order, then <|reserved_special_token_N|>
 * up to 256 of them. */
static const char *const llama3_specials[] = {
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
    "<|python_tag|>"};

struct special {
    const char *text;
    int32_t     id;
};

static const struct special r50k_specials[] = {{"<|endoftext|>", 50256}};
static const struct special cl100k_specials[] = {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258},
                                                 {"<|fim_middle|>", 100259}, {"<|fim_suffix|>", 100260},
                                                 {"<|endofprompt|>", 100276}};
static const struct special o200k_specials[] = {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};

/* An encoding: its name (for "pat_str" and the caller), the rank count that identifies its file,
 * its pattern and default special tokens (Llama 3's are generated). */
static const struct encoding {
    const char           *name;
    int                   n_ranks;
    const char           *pattern;
    const struct special *specials;
    int                   n_specials;
} encodings[] = {
    {"r50k", 50256, r50k_pattern, r50k_specials, 1},
    {"cl100k", 100256, cl100k_pattern, cl100k_specials, 5},
    {"o200k", 199998, o200k_pattern, o200k_specials, 2},
    {"llama3", 128000, llama3_pattern, NULL, 0},
};

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

long bpe_base64_decode(const char *s, size_t n, uint8_t *out)
{
    while (n && s[n - 1] == '=') n--;
    if (n % 4 == 1) return -1;
    long k = 0;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) {
        const int v = b64_value((unsigned char)s[i]);
        if (v < 0) return -1;
        acc = acc << 6 | (uint32_t)v;
        if (i % 4 == 3) out[k++] = (uint8_t)(acc >> 16), out[k++] = (uint8_t)(acc >> 8), out[k++] = (uint8_t)acc, acc = 0;
    }
    if (n % 4 == 2) out[k++] = (uint8_t)(acc >> 4);
    if (n % 4 == 3) out[k++] = (uint8_t)(acc >> 10), out[k++] = (uint8_t)(acc >> 2);
    return k;
}

/* The piece of bytes w[0..n): each byte as its GPT-2 byte-unicode character (at most 2 UTF-8
 * bytes, as every code point of the map is below U+0800); off[k] (n + 1 entries) is where byte k's
 * character starts. */
static char *bytes_to_piece(const uint8_t *w, size_t n, uint32_t *off)
{
    char *p = malloc(2 * n + 1);
    if (!p) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const uint32_t cp = bpe_byte_to_cp(w[i]);
        off[i] = (uint32_t)k;
        if (cp < 0x80) p[k++] = (char)cp;
        else p[k++] = (char)(0xC0 | cp >> 6), p[k++] = (char)(0x80 | (cp & 0x3F));
    }
    off[n] = (uint32_t)k;
    p[k] = 0;
    return p;
}

/* Line [at, end) as "BASE64 RANK" (a '\r' before the newline allowed): the base64's length and
 * the rank; 0 when malformed or the rank is out of range. */
static int parse_line(const char *text, size_t at, size_t end, size_t *len, int32_t *rank)
{
    if (end > at && text[end - 1] == '\r') end--;
    const char *sp = memchr(text + at, ' ', end - at);
    if (!sp || sp == text + at || (size_t)(sp - text) + 1 >= end) return 0;
    long r = 0;
    for (const char *c = sp + 1; c < text + end; c++) {
        if (*c < '0' || *c > '9' || (r = 10 * r + (*c - '0')) >= TIKTOKEN_MAX_RANK) return 0;
    }
    *len = (size_t)(sp - text) - at, *rank = (int32_t)r;
    return 1;
}

/* One "BASE64 RANK" line per token into b->pieces, allocated for ids up to the largest rank or
 * top_special. */
static enum status read_ranks(struct bpe *b, const char *text, size_t n, int32_t top_special)
{
    int32_t top = top_special, r;
    size_t len, line = 1;
    /* First pass: the largest rank, so that the per-id arrays are sized once. */
    for (size_t at = 0, end; at < n; at = end + 1, line++) {
        const char *nl = memchr(text + at, '\n', n - at);
        end = nl ? (size_t)(nl - text) : n;
        if (end == at) continue;
        if (!parse_line(text, at, end, &len, &r))
            return status_errorf(STATUS_BAD_FORMAT, "%s: line %zu is not \"BASE64 RANK\" with a rank in [0, %d)", b->name, line,
                                 TIKTOKEN_MAX_RANK);
        top = r > top ? r : top;
    }
    if (top < 0) return status_errorf(STATUS_BAD_FORMAT, "%s: holds no ranks", b->name);
    b->n_vocab = top + 1;
    const size_t nv = (size_t)b->n_vocab;
    if (!(b->pieces = calloc(nv, sizeof *b->pieces)) || !(b->bytes = calloc(nv, sizeof *b->bytes)) ||
        !(b->n_bytes = calloc(nv, sizeof *b->n_bytes)) || !(b->flags = calloc(nv, 1)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    uint8_t *buf = NULL;
    uint32_t *off = NULL;
    size_t cap = 0;
    enum status s = STATUS_OK;
    line = 1;
    for (size_t at = 0, end; at < n && s == STATUS_OK; at = end + 1, line++) {
        const char *nl = memchr(text + at, '\n', n - at);
        end = nl ? (size_t)(nl - text) : n;
        if (end == at) continue;
        parse_line(text, at, end, &len, &r);
        if (len + 1 > cap) {
            free(buf), free(off);
            cap = 2 * len + 16;
            if (!(buf = malloc(cap)) || !(off = malloc((cap + 1) * sizeof *off))) {
                s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
                break;
            }
        }
        const long nb = len > 4 * TIKTOKEN_MAX_TOKEN / 3 + 4 ? -1 : bpe_base64_decode(text + at, len, buf);
        if (nb <= 0 || nb > TIKTOKEN_MAX_TOKEN)
            s = status_errorf(STATUS_BAD_FORMAT, "%s: line %zu: the token is not base64 of 1 to %d bytes", b->name, line, TIKTOKEN_MAX_TOKEN);
        else if (b->pieces[r]) s = status_errorf(STATUS_BAD_FORMAT, "%s: line %zu: rank %d is given twice", b->name, line, r);
        else if (!(b->pieces[r] = bytes_to_piece(buf, (size_t)nb, off)))
            s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    }
    free(buf), free(off);
    return s;
}

/* Every split of every token into two tokens, as a merge (bpe_finish gives it the merged id as
 * its priority). */
static enum status build_merges(struct bpe *b)
{
    size_t n = 0, cap = 0;
    for (int32_t id = 0; id < b->n_vocab; id++) {
        const char *p = b->pieces[id];
        if (b->flags[id] & (BPE_PIECE_UNUSED | BPE_PIECE_ADDED)) continue;
        const size_t len = strlen(p);
        for (size_t k = 0; k < len;) {
            k += ((unsigned char)p[k] < 0x80) ? 1 : 2; /* the next character: a split point */
            if (k >= len) break;
            const int32_t l = bpe_piece_to_id(b, p, k), r = bpe_piece_to_id(b, p + k, len - k);
            if (l < 0 || r < 0 || (b->flags[l] | b->flags[r]) & BPE_PIECE_ADDED) continue;
            if (n == cap && base_grow((void **)&b->merges, &cap, 2 * (n + 1), 2 * sizeof *b->merges))
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
            b->merges[2 * n] = l, b->merges[2 * n + 1] = r;
            n++;
        }
    }
    if (n > INT32_MAX) return status_errorf(STATUS_BAD_FORMAT, "%s: too many merges", b->name);
    b->n_merges = (int)n;
    return STATUS_OK;
}

/* Adds special (or plain added) token text as id: matched on the raw text first. */
static enum status add_token(struct bpe *b, const char *text, int32_t id, int special, const char *field)
{
    if (id < 0 || id >= b->n_vocab || !*text) return tjson_bad(b, field, "has an id out of range or an empty content");
    if (b->pieces[id] && !(b->flags[id] & BPE_PIECE_UNUSED))
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s: id %d (\"%.40s\") is also a rank of the file", b->name, field, id, text);
    struct bpe_added *a = &b->added[b->n_added];
    memset(a, 0, sizeof *a);
    a->id = id, a->special = special, a->normalized = !special, a->n = strlen(text);
    free(b->pieces[id]);
    /* tiktoken decodes a special token to its text as it is (bytes set here are kept by bpe_finish). */
    free(b->bytes[id]);
    if (!(a->content = strdup(text)) || !(b->pieces[id] = strdup(text)) || !(b->bytes[id] = (uint8_t *)strdup(text)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    b->n_bytes[id] = (uint32_t)a->n;
    b->n_added++;
    b->flags[id] = BPE_PIECE_ADDED | (special ? BPE_PIECE_SPECIAL : 0);
    return STATUS_OK;
}

/* The special tokens: the config's added_tokens_decoder when it has one, else the encoding's. */
static enum status add_specials(struct bpe *b, const cJSON *decoder, const struct encoding *enc)
{
    const cJSON *e;
    const int n = decoder ? cJSON_GetArraySize(decoder) : enc ? (enc->specials ? enc->n_specials : 256) : 0;
    if (!(b->added = calloc((size_t)n + 1, sizeof *b->added))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    enum status s = STATUS_OK;
    cJSON_ArrayForEach(e, decoder)
    {
        char *stop;
        const long id = strtol(e->string, &stop, 10);
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(e, "content");
        int special = 1;
        if (*stop || stop == e->string || !cJSON_IsString(content))
            return tjson_bad(b, "tokenizer_config.json added_tokens_decoder", "needs \"ID\": {\"content\": ...} entries");
        if ((s = tjson_bool(b, e, "special", "added_tokens_decoder", 1, &special)) ||
            (s = add_token(b, content->valuestring, id < 0 || id >= INT32_MAX ? -1 : (int32_t)id, special, "added_tokens_decoder")))
            return s;
    }
    if (decoder || !enc) return STATUS_OK;
    for (int i = 0; i < n && s == STATUS_OK; i++) {
        char name[64];
        if (enc->specials) {
            s = add_token(b, enc->specials[i].text, enc->specials[i].id, 1, "special tokens");
            continue;
        }
        const int named = (int)(sizeof llama3_specials / sizeof *llama3_specials);
        snprintf(name, sizeof name, "<|reserved_special_token_%d|>", i - named + 2);
        s = add_token(b, i < named ? llama3_specials[i] : name, enc->n_ranks + i, 1, "special tokens");
    }
    if (s == STATUS_OK && !enc->specials) b->bos_id = enc->n_ranks, b->add_bos = 1, b->eos_id = enc->n_ranks + 1;
    else if (s == STATUS_OK) b->eos_id = enc->specials[0].id;
    return s;
}

/* The largest id among the specials to come, so that the id arrays hold them. */
static int32_t top_special(const cJSON *decoder, const struct encoding *enc)
{
    int32_t top = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, decoder)
    {
        const long id = strtol(e->string, NULL, 10);
        if (id >= 0 && id < TIKTOKEN_MAX_RANK && id > top) top = (int32_t)id;
    }
    if (!decoder && enc) top = enc->specials ? enc->specials[enc->n_specials - 1].id : enc->n_ranks + 255;
    return top;
}

/* The number of ranks in the file: its non-empty lines. */
static int count_ranks(const char *text, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) k += text[i] == '\n' && (i == 0 || text[i - 1] != '\n');
    return k + (n && text[n - 1] != '\n');
}

enum status bpe_load_tiktoken(const char *text, size_t n, const char *name, const char *pattern, const char *config,
                              size_t config_n, struct bpe **out)
{
    *out = NULL;
    struct bpe *b = bpe_alloc(name);
    if (!b) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
    cJSON *cfg = config ? cJSON_ParseWithLength(config, config_n) : NULL;
    enum status s = STATUS_OK;
    if (config && !cJSON_IsObject(cfg)) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: its tokenizer_config.json is not a JSON object", name);
        goto out;
    }
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(cfg, "pat_str");
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder");
    if ((pat && !cJSON_IsString(pat)) || (decoder && !cJSON_IsObject(decoder))) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer_config.json: pat_str is not a string or added_tokens_decoder not an object",
                          name);
        goto out;
    }
    if (!pattern && pat) pattern = pat->valuestring;
    /* The encoding: named by pattern, else identified by the number of ranks. */
    const struct encoding *enc = NULL;
    const int n_ranks = count_ranks(text, n);
    for (size_t k = 0; k < sizeof encodings / sizeof *encodings; k++)
        if (pattern ? !strcmp(pattern, encodings[k].name) : n_ranks == encodings[k].n_ranks) enc = &encodings[k];
    if (!pattern && !enc) {
        s = status_errorf(STATUS_UNSUPPORTED,
                          "%s: %d ranks name no known encoding (r50k, cl100k, o200k, llama3): give the pattern "
                          "(\"pat_str\" in a tokenizer_config.json beside it)", name, n_ranks);
        goto out;
    }
    /* A named encoding's specials are its own only for its own file. */
    const struct encoding *spec = enc && enc->n_ranks == n_ranks ? enc : NULL;
    b->model = BPE_MODEL_BYTE_LEVEL;
    b->ignore_merges = 1;
    b->merge_by_id = 1;
    if ((s = read_ranks(b, text, n, top_special(decoder, spec))) || (s = add_specials(b, decoder, spec))) goto out;
    for (int i = 0; i < b->n_vocab; i++)
        if (!b->pieces[i]) {
            if (!(b->pieces[i] = strdup(""))) {
                s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
                goto out;
            }
            b->flags[i] |= BPE_PIECE_UNUSED;
        }
    if ((s = bpe_index_pieces(b)) || (s = build_merges(b)) ||
        (s = tjson_add_split(b, enc ? enc->pattern : pattern, 0, BPE_SPLIT_ISOLATED, 0)) ||
        (s = tjson_config(b, cfg)))
        goto out;
    s = bpe_finish(b);
out:
    cJSON_Delete(cfg);
    if (s != STATUS_OK) {
        bpe_free(b);
        return s;
    }
    *out = b;
    return STATUS_OK;
}
