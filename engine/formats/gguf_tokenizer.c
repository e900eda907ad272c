/* engine/formats/gguf_tokenizer.c - the converter's side of a GGUF tokenizer: the
 * tokenizer.ggml.* metadata turned into a serialized SentencePiece ModelProto, with the small
 * protobuf wire-format encoder that writes it, or (gpt2 vocabularies) into a tokenizer.json text
 * with the pre-tokenizer regexes per tokenizer.ggml.pre (see gguf_tokenizer.h).
 * Not here: reading GGUF (gguf.c), loading the proto (engine/text/tokenizer.h).
 * Tests: tests/test_gguf.c (a tiny vocabulary built by tests/gguf_setup.py, loaded by
 * SentencePiece; the Gemma 3 vocabulary when the real file is present), tests/test_bpe.py
 * (SmolLM2's gpt2 vocabulary against Hugging Face tokenizers). */
#include "gguf_tokenizer.h"
#include "pbwire.h"

#include <cjson/cJSON.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- protobuf wire format (what sentencepiece_model.proto needs) ------------------------ */

/* The ModelProto's fields over pbwire.h's writer. int32 and enum fields: negative values are
 * sign-extended to 64 bits, as protobuf does. */
static void pb_int32(struct pb_buf *b, uint32_t field, int32_t v)
{
    pb_buf_varint(b, pb_tag(field, PB_WIRE_VARINT));
    pb_buf_varint(b, (uint64_t)(int64_t)v);
}

static void pb_float(struct pb_buf *b, uint32_t field, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t le[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    pb_buf_varint(b, pb_tag(field, PB_WIRE_32BIT));
    pb_buf_bytes(b, le, 4);
}

/* ---- the ModelProto ---------------------------------------------------------------------- */

/* Element types gguf_arr_int reads (integers; BOOL is not a token type). */
static int gguf_tokenizer_int_type(enum gguf_type t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_UINT16 || t == GGUF_TYPE_INT16 ||
           t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_INT32 || t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64;
}

/* SentencePiece types (sentencepiece_model.proto), which GGUF token types reuse. */
enum { SP_NORMAL = 1, SP_UNKNOWN = 2, SP_CONTROL = 3, SP_USER_DEFINED = 4, SP_UNUSED = 5, SP_BYTE = 6 };

/* An optional id key: -1 when absent; out-of-range is BAD_FORMAT. */
static enum status gguf_tokenizer_id(const struct gguf *g, const char *key, uint64_t n_vocab, int32_t *id)
{
    int64_t v;
    *id = -1;
    enum status s = gguf_get_int(g, key, &v);
    if (s == STATUS_NOT_FOUND) return STATUS_OK;
    if (s) return s;
    if (v < 0 || (uint64_t)v >= n_vocab)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s = %" PRId64 " is outside the vocabulary (%" PRIu64 " tokens)",
                             gguf_path(g), key, v, n_vocab);
    *id = (int32_t)v;
    return STATUS_OK;
}

/* What both vocabulary kinds check and read: token_type, when present, one int per token; the
 * unknown / BOS / EOS / padding ids (-1 when absent). */
static enum status gguf_tokenizer_types_and_ids(const struct gguf *g, const struct gguf_kv *types, uint64_t nv,
                                                int32_t *unk, int32_t *bos, int32_t *eos, int32_t *pad)
{
    enum status s;
    if (types && (types->n != nv || !gguf_tokenizer_int_type(types->arr_type)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.token_type has %" PRIu64 " %s, expected %" PRIu64 " INT32",
                             gguf_path(g), types->n, gguf_type_name(types->arr_type), nv);
    if ((s = gguf_tokenizer_id(g, "tokenizer.ggml.unknown_token_id", nv, unk)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.bos_token_id", nv, bos)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.eos_token_id", nv, eos)))
        return s;
    return gguf_tokenizer_id(g, "tokenizer.ggml.padding_token_id", nv, pad);
}

/* ---- GGUF `gpt2` vocabularies as a tokenizer.json --------------------------------------------
 * The pre-tokenizer regexes per tokenizer.ggml.pre, as llama.cpp's src/llama-vocab.cpp lists them
 * (llama-cpp-python 0.3.36's copy; the Hugging Face originals where llama.cpp rewrote (?i:...),
 * possessive quantifiers or case classes for its own regex engine, as its comments give them: PCRE2
 * and Hugging Face's Oniguruma take them as they are; characters beyond ASCII as \x{...}). Each
 * list is applied in order, every match isolated. ignore_merges is llama.cpp's flag. llama.cpp's
 * per-type defaults are taken too where the GGUF has no key of its own: a BOS first for the types
 * of GPT2_ADD_BOS without tokenizer.ggml.add_bos_token, none for ChatGLM's (its BOS id unused);
 * not its clean_spaces (llama.cpp's detokenize tidies spaces before punctuation; its streamed
 * pieces do not, nor does shardlm). */
#define GPT2_ADD_BOS "llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano|tekken|chameleon"
#define GPT2_PRE_MAX 6
struct gpt2_pre {
    const char *names;         /* tokenizer.ggml.pre values, '|'-separated */
    int ignore_merges;         /* llama.cpp sets it for Llama 3 and a few others */
    const char *regexes[GPT2_PRE_MAX];
};

#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
#define LLAMA3_RE CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define QWEN2_RE CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
/* DeepSeek V3's third step, and its CJK run. */
#define DSV3_RE "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
#define CJK_KANA "[\\x{4E00}-\\x{9FA5}\\x{3040}-\\x{309F}\\x{30A0}-\\x{30FF}]+"
/* DeepSeek LLM and Coder's CJK and Hangul run. */
#define CJK_HANGUL "[\\x{4E00}-\\x{9FA5}\\x{800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+"
/* Tekken's and GPT-4o's words: an optional non-letter, upper-case letters then lower-case ones. */
#define UPPER_LOWER "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
#define LOWER_AFTER "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
/* BLOOM, Poro, Viking: anything up to whitespace or one of these marks. */
#define BLOOM_RE " ?[^(\\s|.,!?\\x{2026}\\x{3002}\\x{FF0C}\\x{3001}\\x{964}\\x{6D4}\\x{60C})]+"
static const struct gpt2_pre gpt2_pres[] = {
    {"llama3|llama-v3|llama-bpe|dbrx|smaug-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano|glm4|glm5", 1, {LLAMA3_RE}},
    {"chatglm-bpe", 0, {LLAMA3_RE}},
    {"jais-2", 0,
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)"
      "|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}"}},
    {"qwen2|stablelm2|deepseek-r1-qwen|kormo|f2llmv2|megrez|hunyuan|solar-open|grok-2", 0, {QWEN2_RE}},
    {"qwen35", 0,
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"ufakzeka", 0, {"[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"seed-coder", 0,
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"bailingmoe|bailingmoe2|llada-moe", 0,
     {"'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    {"exaone-moe", 0,
     {CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
    {"minicpm5", 1,
     {"\\p{N}{1,3}", CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"laguna", 0, {"[^\\n]+|[\\n]+", QWEN2_RE}},
    {"tekken", 1, {UPPER_LOWER "|" LOWER_AFTER "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", 0,
     {UPPER_LOWER CONTRACTIONS "?|" LOWER_AFTER CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"youtu", 1,
     {"[\\x{AC00}-\\x{D7A3}\\x{3131}-\\x{318E}]+|[\\x{FF01}\\x{2026}\\x{201C}\\x{201D}\\x{2018}\\x{2019}\\x{2014}\\x{FF1A}\\x{FF1B}"
      "\\x{FF0C}\\x{3001}-\\x{303F}\\x{FE30}-\\x{FE4F}]+|[\\x{3105}-\\x{312F}]+|" CJK_KANA,
      UPPER_LOWER CONTRACTIONS "?|" LOWER_AFTER CONTRACTIONS "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b|mellum2", 0, {"\\p{N}", GPT2_RE}},
    {"gpt-2|gpt2|mpt|olmo|jais|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|exaone4|trillion|"
     "granite-docling", 0, {GPT2_RE}},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", 0, {"\\p{N}{1,3}", CJK_KANA, DSV3_RE "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"spark2_5", 0, {"\\p{N}{1,3}", CJK_KANA, DSV3_RE "|[\\r\\n]|\\s+(?!\\S)|\\s+", "\\p{N}"}},
    {"deepseek-llm", 0,
     {"[\\r\\n]",
      "\\s?[A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-\\x{2AF}\\x{370}-\\x{373}"
      "\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{3A1}\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}"
      "\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{13F5}\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}"
      "\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}-\\x{1D9A}\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}"
      "\\x{1F50}-\\x{1F57}\\x{1F59}\\x{1F5B}\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}"
      "\\x{1FC6}-\\x{1FCC}\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}\\x{2107}"
      "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-\\x{2134}\\x{2139}"
      "\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-\\x{2CE4}\\x{2CEB}-\\x{2CEE}\\x{2CF2}"
      "\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-\\x{A787}\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}"
      "\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}-\\x{FF5A}\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}"
      "\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{10CF2}\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}]+",
      "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+", "\\s+$", CJK_HANGUL, "\\p{N}+"}},
    {"deepseek-coder", 0, {"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", CJK_HANGUL, "\\p{N}"}},
    {"falcon", 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", GPT2_RE, "[0-9][0-9][0-9]"}},
    {"poro-chat|bloom|gpt3-finnish", 0, {BLOOM_RE}},
    {"viking", 0, {BLOOM_RE, "\\p{N}"}},
    {"chameleon", 0,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}", "[\\p{P}!-/:-@\\[-`{-~]", GPT2_RE}},
    {"default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", GPT2_RE, "\\p{N}+", "[0-9][0-9][0-9]"}},
};

/* Types llama.cpp knows that are refused, and why. */
static const struct {
    const char *names, *why;
} gpt2_pre_refused[] = {
    {"gemma4|granite-embed-multi-311m|sarvam-moe|whitespace",
     "a BPE over raw UTF-8 (SentencePiece style, no byte-level alphabet), which a gpt2 vocabulary here is not"},
    {"kimi-k2|afmoe", "llama.cpp splits it with code of its own, not a regex"},
    {"superbpe|tiny_aya|cohere2moe", "its digit grouping splits on lookaheads at empty matches, which the Split step does not"},
    {"granite-embed-multi-97m", "only llama.cpp's rewritten regex is known, not the original"},
    {"jina-v1-en|jina-v2-code|roberta-bpe", "its [SEP] after the text is not added by byte-level BPE here"},
};

/* 1 when pre is one of the '|'-separated names. */
static int name_in(const char *names, const char *pre)
{
    const size_t n = strlen(pre);
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        const size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !memcmp(p, pre, n)) return 1;
        p += len + (bar != NULL);
    }
    return 0;
}

static const struct gpt2_pre *gpt2_pre_find(const char *pre)
{
    for (size_t i = 0; i < sizeof gpt2_pres / sizeof gpt2_pres[0]; i++)
        if (name_in(gpt2_pres[i].names, pre)) return &gpt2_pres[i];
    return NULL;
}

/* STATUS_UNSUPPORTED naming pre, why when llama.cpp knows it, and every supported name. */
static enum status gpt2_pre_refuse(const struct gguf *g, const char *pre)
{
    const char *why = "llama.cpp does not know it either";
    for (size_t i = 0; i < sizeof gpt2_pre_refused / sizeof gpt2_pre_refused[0]; i++)
        if (name_in(gpt2_pre_refused[i].names, pre)) why = gpt2_pre_refused[i].why;
    char list[2048];
    size_t at = 0;
    for (size_t i = 0; i < sizeof gpt2_pres / sizeof gpt2_pres[0] && at < sizeof list; i++) {
        const int w = snprintf(list + at, sizeof list - at, "%s%s", i ? "|" : "", gpt2_pres[i].names);
        if (w < 0) break;
        at += (size_t)w;
    }
    return status_errorf(STATUS_UNSUPPORTED, "%s: tokenizer.ggml.pre '%.64s' is not supported (%s); supported: %s", gguf_path(g), pre,
                         why, list);
}

/* A GGUF string (not NUL-terminated) as a cJSON string; NULL when out of memory. */
static cJSON *json_str(const char *p, uint64_t len)
{
    char *z = malloc((size_t)len + 1);
    if (!z) return NULL;
    memcpy(z, p, (size_t)len);
    z[len] = '\0';
    cJSON *j = cJSON_CreateString(z);
    free(z);
    return j;
}

static enum status gguf_tokenizer_json(const struct gguf *g, void **data, size_t *n)
{
    const struct gguf_kv *tokens, *merges, *types = NULL;
    const char *pre_name = "default";
    enum status s = gguf_get_str(g, "tokenizer.ggml.pre", &pre_name);
    if (s && s != STATUS_NOT_FOUND) return s;
    const struct gpt2_pre *pre = gpt2_pre_find(pre_name);
    if (!pre) return gpt2_pre_refuse(g, pre_name);
    if ((s = gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return s;
    if ((s = gguf_get_arr(g, "tokenizer.ggml.merges", &merges))) return s;
    s = gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (s && s != STATUS_NOT_FOUND) return s;
    const uint64_t nv = tokens->n;
    if (tokens->arr_type != GGUF_TYPE_STRING || nv == 0 || nv > (1u << 22))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " %s, expected 1..4194304 STRING",
                             gguf_path(g), nv, gguf_type_name(tokens->arr_type));
    if (merges->arr_type != GGUF_TYPE_STRING)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.merges is an array of %s, expected STRING", gguf_path(g),
                             gguf_type_name(merges->arr_type));
    int32_t unk, bos, eos, pad;
    if ((s = gguf_tokenizer_types_and_ids(g, types, nv, &unk, &bos, &eos, &pad))) return s;
    int add_bos = 0; /* llama.cpp's default for BPE vocabularies, but for the types of GPT2_ADD_BOS */
    s = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos);
    if (s == STATUS_NOT_FOUND) add_bos = name_in(GPT2_ADD_BOS, pre_name);
    else if (s) return s;
    if (!strcmp(pre_name, "chatglm-bpe")) bos = -1; /* llama.cpp: no BOS for ChatGLM */

    int ok = 1;
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab"), *mlist = cJSON_AddArrayToObject(model, "merges");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    ok = root && model && vocab && mlist && added && cJSON_AddStringToObject(model, "type", "BPE") &&
         cJSON_AddBoolToObject(model, "ignore_merges", pre->ignore_merges);
    for (uint64_t i = 0; i < nv && ok; i++) {
        uint64_t len;
        const char *p = gguf_arr_str(tokens, i, &len);
        cJSON *piece = json_str(p, len), *num = cJSON_CreateNumber((double)i);
        ok = piece && num;
        if (ok) {
            /* Key = the piece; a GGUF piece with a NUL byte cannot be a key and is kept unused. */
            if (memchr(p, '\0', (size_t)len) == NULL) cJSON_AddItemToObject(vocab, piece->valuestring, num);
            else cJSON_Delete(num);
        } else
            cJSON_Delete(num);
        /* CONTROL (3) pieces are special added tokens, USER_DEFINED (4) plain added tokens:
         * both matched before pre-tokenization, as llama.cpp does. */
        const int64_t type = types ? gguf_arr_int(types, i) : 1;
        if (ok && (type == 3 || type == 4)) {
            cJSON *a = cJSON_CreateObject();
            /* Every field Hugging Face's AddedToken has: tokenizers refuses an entry without one. */
            ok = a && cJSON_AddNumberToObject(a, "id", (double)i) && cJSON_AddStringToObject(a, "content", piece->valuestring) &&
                 cJSON_AddBoolToObject(a, "single_word", 0) && cJSON_AddBoolToObject(a, "lstrip", 0) &&
                 cJSON_AddBoolToObject(a, "rstrip", 0) && cJSON_AddBoolToObject(a, "normalized", 0) &&
                 cJSON_AddBoolToObject(a, "special", type == 3);
            if (a) cJSON_AddItemToArray(added, a);
        }
        cJSON_Delete(piece);
    }
    for (uint64_t i = 0; i < merges->n && ok; i++) {
        uint64_t len;
        const char *p = gguf_arr_str(merges, i, &len);
        cJSON *m = json_str(p, len);
        ok = m != NULL;
        if (m) cJSON_AddItemToArray(mlist, m);
    }
    cJSON *pre_tok = cJSON_AddObjectToObject(root, "pre_tokenizer"), *steps = NULL;
    ok = ok && pre_tok && cJSON_AddStringToObject(pre_tok, "type", "Sequence") &&
         (steps = cJSON_AddArrayToObject(pre_tok, "pretokenizers"));
    for (int k = 0; k < GPT2_PRE_MAX && pre->regexes[k] && ok; k++) {
        cJSON *st = cJSON_CreateObject(), *pat;
        ok = st && cJSON_AddStringToObject(st, "type", "Split") && (pat = cJSON_AddObjectToObject(st, "pattern")) &&
             cJSON_AddStringToObject(pat, "Regex", pre->regexes[k]) && cJSON_AddStringToObject(st, "behavior", "Isolated") &&
             cJSON_AddBoolToObject(st, "invert", 0);
        if (st) cJSON_AddItemToArray(steps, st);
    }
    cJSON *bl = cJSON_CreateObject(), *dec = cJSON_AddObjectToObject(root, "decoder"), *ours = cJSON_AddObjectToObject(root, "shardlm");
    /* Every field Hugging Face's ByteLevel has (tokenizers refuses the file without them). */
    ok = ok && bl && cJSON_AddStringToObject(bl, "type", "ByteLevel") && cJSON_AddBoolToObject(bl, "add_prefix_space", 0) &&
         cJSON_AddBoolToObject(bl, "trim_offsets", 1) && cJSON_AddBoolToObject(bl, "use_regex", 0);
    if (bl) cJSON_AddItemToArray(steps ? steps : root, bl);
    ok = ok && dec && cJSON_AddStringToObject(dec, "type", "ByteLevel") && cJSON_AddBoolToObject(dec, "add_prefix_space", 1) &&
         cJSON_AddBoolToObject(dec, "trim_offsets", 1) && cJSON_AddBoolToObject(dec, "use_regex", 1) && ours &&
         cJSON_AddNumberToObject(ours, "bos_id", bos) && cJSON_AddNumberToObject(ours, "eos_id", eos) &&
         cJSON_AddNumberToObject(ours, "pad_id", pad) && cJSON_AddNumberToObject(ours, "unk_id", unk) &&
         cJSON_AddBoolToObject(ours, "add_bos", add_bos && bos >= 0);
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory building the tokenizer", gguf_path(g));
    *data = text;
    *n = strlen(text);
    return STATUS_OK;
}

/* ---- GGUF `bert` vocabularies as a WordPiece tokenizer.json ---------------------------------
 * llama.cpp's converter writes BERT's pieces in "phantom space" form: a word-initial piece with a
 * U+2581 in front, a continuing one without its "##", "[...]" tokens as they are. Undone here;
 * the rest is what llama.cpp's WPM tokenizer does (lowercase, accents stripped, BERT's
 * pre-tokenizer) in Hugging Face's words, with the [CLS] $A [SEP] template. */
static enum status gguf_tokenizer_wordpiece_json(const struct gguf *g, void **data, size_t *n)
{
    const struct gguf_kv *tokens, *types = NULL;
    enum status s;
    if ((s = gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return s;
    s = gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (s && s != STATUS_NOT_FOUND) return s;
    const uint64_t nv = tokens->n;
    if (tokens->arr_type != GGUF_TYPE_STRING || nv == 0 || nv > (1u << 22))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " %s, expected 1..4194304 STRING",
                             gguf_path(g), nv, gguf_type_name(tokens->arr_type));
    int32_t unk, bos, eos, pad, cls, sep;
    if ((s = gguf_tokenizer_types_and_ids(g, types, nv, &unk, &bos, &eos, &pad)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.cls_token_id", nv, &cls)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.seperator_token_id", nv, &sep)))
        return s;
    if (unk < 0) return status_errorf(STATUS_BAD_FORMAT, "%s: a bert vocabulary needs tokenizer.ggml.unknown_token_id", gguf_path(g));
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab"), *added = cJSON_AddArrayToObject(root, "added_tokens");
    int ok = root && model && vocab && added && cJSON_AddStringToObject(model, "type", "WordPiece") &&
             cJSON_AddStringToObject(model, "continuing_subword_prefix", "##") &&
             cJSON_AddNumberToObject(model, "max_input_chars_per_word", 100);
    char *buf = NULL;
    for (uint64_t i = 0; i < nv && ok; i++) {
        uint64_t len;
        const char *p = gguf_arr_str(tokens, i, &len);
        if (!(buf = realloc(buf, (size_t)len + 3))) {
            ok = 0;
            break;
        }
        size_t m = 0;
        if (len >= 2 && p[0] == '[' && p[len - 1] == ']') memcpy(buf, p, (size_t)len), m = (size_t)len;
        else if (len >= 3 && !memcmp(p, "\xE2\x96\x81", 3)) memcpy(buf, p + 3, (size_t)len - 3), m = (size_t)len - 3;
        else memcpy(buf, "##", 2), memcpy(buf + 2, p, (size_t)len), m = (size_t)len + 2;
        buf[m] = '\0';
        if (memchr(buf, '\0', m)) continue; /* a piece with a NUL cannot be a key: left unused */
        cJSON *num = cJSON_CreateNumber((double)i);
        ok = num != NULL;
        if (ok) cJSON_AddItemToObject(vocab, buf, num);
        if (ok && (int32_t)i == unk) ok = cJSON_AddStringToObject(model, "unk_token", buf) != NULL;
        if (ok && types && gguf_arr_int(types, i) == 3) { /* CONTROL: a special added token */
            cJSON *a = cJSON_CreateObject();
            ok = a && cJSON_AddNumberToObject(a, "id", (double)i) && cJSON_AddStringToObject(a, "content", buf) &&
                 cJSON_AddBoolToObject(a, "single_word", 0) && cJSON_AddBoolToObject(a, "lstrip", 0) &&
                 cJSON_AddBoolToObject(a, "rstrip", 0) && cJSON_AddBoolToObject(a, "normalized", 0) &&
                 cJSON_AddBoolToObject(a, "special", 1);
            if (a) cJSON_AddItemToArray(added, a);
        }
    }
    free(buf);
    cJSON *norm = cJSON_AddObjectToObject(root, "normalizer"), *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder"), *ours = cJSON_AddObjectToObject(root, "shardlm");
    ok = ok && norm && pre && dec && ours && cJSON_AddStringToObject(norm, "type", "BertNormalizer") &&
         cJSON_AddBoolToObject(norm, "clean_text", 1) && cJSON_AddBoolToObject(norm, "handle_chinese_chars", 1) &&
         cJSON_AddNullToObject(norm, "strip_accents") && cJSON_AddBoolToObject(norm, "lowercase", 1) &&
         cJSON_AddStringToObject(pre, "type", "BertPreTokenizer") && cJSON_AddStringToObject(dec, "type", "WordPiece") &&
         cJSON_AddStringToObject(dec, "prefix", "##") && cJSON_AddBoolToObject(dec, "cleanup", 1) &&
         cJSON_AddNumberToObject(ours, "pad_id", pad) && cJSON_AddNumberToObject(ours, "unk_id", unk) &&
         cJSON_AddNumberToObject(ours, "eos_id", sep >= 0 ? sep : eos) && cJSON_AddNumberToObject(ours, "bos_id", cls) &&
         cJSON_AddBoolToObject(ours, "add_bos", cls >= 0);
    if (ok && cls >= 0 && sep >= 0) {
        /* [CLS] $A [SEP], as BERT's tokenizer.json has it. */
        cJSON *post = cJSON_AddObjectToObject(root, "post_processor"), *single = NULL;
        ok = post && cJSON_AddStringToObject(post, "type", "TemplateProcessing") &&
             (single = cJSON_AddArrayToObject(post, "single"));
        const int32_t at[3] = {cls, -1, sep};
        for (int k = 0; k < 3 && ok; k++) {
            cJSON *e = cJSON_CreateObject(), *inner;
            uint64_t len = 0;
            const char *p = at[k] >= 0 ? gguf_arr_str(tokens, (uint64_t)at[k], &len) : "A";
            cJSON *name = at[k] >= 0 ? json_str(p, len) : cJSON_CreateString("A");
            ok = e && name && (inner = cJSON_AddObjectToObject(e, at[k] >= 0 ? "SpecialToken" : "Sequence")) &&
                 cJSON_AddStringToObject(inner, "id", name->valuestring) && cJSON_AddNumberToObject(inner, "type_id", 0);
            cJSON_Delete(name);
            if (e) cJSON_AddItemToArray(single, e);
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory building the tokenizer", gguf_path(g));
    *data = text;
    *n = strlen(text);
    return STATUS_OK;
}

enum status gguf_tokenizer_model_proto(const struct gguf *g, void **data, size_t *n)
{
    *data = NULL;
    *n = 0;
    const char *model;
    const struct gguf_kv *tokens, *scores = NULL, *types = NULL;
    enum status s = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s) return s;
    if (strcmp(model, "gpt2") == 0) return gguf_tokenizer_json(g, data, n);
    if (strcmp(model, "bert") == 0) return gguf_tokenizer_wordpiece_json(g, data, n);
    if (strcmp(model, "llama") != 0)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: tokenizer.ggml.model is '%s'; only SentencePiece ('llama'), byte-level BPE ('gpt2') and WordPiece ('bert') vocabularies are supported",
                             gguf_path(g), model);
    if ((s = gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens))) return s;
    if (tokens->arr_type != GGUF_TYPE_STRING)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens is an array of %s, expected STRING",
                             gguf_path(g), gguf_type_name(tokens->arr_type));
    const uint64_t nv = tokens->n;
    if (nv == 0 || nv > INT32_MAX)
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.tokens has %" PRIu64 " entries", gguf_path(g), nv);
    s = gguf_get_arr(g, "tokenizer.ggml.scores", &scores);
    if (s && s != STATUS_NOT_FOUND) return s;
    s = gguf_get_arr(g, "tokenizer.ggml.token_type", &types);
    if (s && s != STATUS_NOT_FOUND) return s;
    if (scores && (scores->n != nv || (scores->arr_type != GGUF_TYPE_FLOAT32 && scores->arr_type != GGUF_TYPE_FLOAT64)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.scores has %" PRIu64 " %s, expected %" PRIu64 " FLOAT32",
                             gguf_path(g), scores->n, gguf_type_name(scores->arr_type), nv);
    int32_t unk, bos, eos, pad;
    if ((s = gguf_tokenizer_types_and_ids(g, types, nv, &unk, &bos, &eos, &pad))) return s;
    int add_space_prefix = 1; /* llama.cpp's default for SentencePiece vocabularies */
    s = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix);
    if (s && s != STATUS_NOT_FOUND) return s;

    /* SentencePiece needs exactly one UNKNOWN piece: the declared one, else the first piece
     * typed UNKNOWN, else one named <unk>. */
    if (unk < 0) {
        for (uint64_t i = 0; i < nv && unk < 0; i++)
            if (types && gguf_arr_int(types, i) == SP_UNKNOWN) unk = (int32_t)i;
        for (uint64_t i = 0; i < nv && unk < 0; i++) {
            uint64_t len;
            const char *p = gguf_arr_str(tokens, i, &len);
            if (len == 5 && !memcmp(p, "<unk>", 5)) unk = (int32_t)i;
        }
        if (unk < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: the vocabulary has no unknown token, which SentencePiece requires",
                                 gguf_path(g));
    }

    struct pb_buf out = {0}, sub = {0};
    int have_bytes = 0;
    for (uint64_t i = 0; i < nv; i++) {
        uint64_t len;
        const char *p = gguf_arr_str(tokens, i, &len);
        int64_t type = types ? gguf_arr_int(types, i) : SP_NORMAL;
        if (type < SP_NORMAL || type > SP_BYTE) type = SP_NORMAL; /* UNDEFINED (0) and unknown values */
        if ((int32_t)i == unk) type = SP_UNKNOWN;
        else if (type == SP_UNKNOWN) type = SP_CONTROL; /* only one UNKNOWN allowed */
        if (type == SP_BYTE) have_bytes = 1;
        sub.n = 0;
        pb_buf_len_field(&sub, 1, p, (size_t)len);
        pb_float(&sub, 2, scores ? (float)gguf_arr_float(scores, i) : 0.0f);
        pb_int32(&sub, 3, (int32_t)type);
        if (sub.oom) break;
        pb_buf_len_field(&out, 1, sub.p, sub.n);
    }

    /* TrainerSpec (field 2). Ids and piece names are what SentencePieceProcessor reports as
     * bos_id() etc.: it looks the *_piece names up, so they must name the real pieces. */
    sub.n = 0;
    pb_int32(&sub, 3, 2); /* model_type = BPE */
    pb_int32(&sub, 4, (int32_t)nv);
    pb_int32(&sub, 35, have_bytes); /* byte_fallback */
    pb_int32(&sub, 40, unk);
    pb_int32(&sub, 41, bos);
    pb_int32(&sub, 42, eos);
    pb_int32(&sub, 43, pad);
    const int32_t special[4] = {unk, bos, eos, pad};
    for (int k = 0; k < 4; k++) {
        if (special[k] < 0) continue;
        uint64_t len;
        const char *p = gguf_arr_str(tokens, (uint64_t)special[k], &len);
        pb_buf_len_field(&sub, 45 + k, p, (size_t)len); /* unk_piece, bos_piece, eos_piece, pad_piece */
    }
    if (!sub.oom) pb_buf_len_field(&out, 2, sub.p, sub.n);

    /* NormalizerSpec (field 3): no Unicode normalization (llama.cpp applies none), spaces
     * escaped to U+2581, runs of spaces kept. */
    sub.n = 0;
    pb_buf_len_field(&sub, 1, "identity", 8);
    pb_int32(&sub, 3, add_space_prefix);
    pb_int32(&sub, 4, 0); /* remove_extra_whitespaces */
    pb_int32(&sub, 5, 1); /* escape_whitespaces */
    if (!sub.oom) pb_buf_len_field(&out, 3, sub.p, sub.n);

    int oom = out.oom || sub.oom;
    free(sub.p);
    if (oom) {
        free(out.p);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory building the tokenizer", gguf_path(g));
    }
    *data = out.p;
    *n = out.n;
    return STATUS_OK;
}
