/* engine/text/tokenizer_json.c - a Hugging Face tokenizer.json read into a struct bpe (bpe.h): the
 * model (BPE byte-level or with byte_fallback, WordPiece, Unigram, WordLevel), vocab, merges (either
 * spelling), added_tokens with their flags, pre_tokenizer (ByteLevel, Split, Digits, Sequence and,
 * through tokenizer_json_steps.c, the others), the post-processor's BOS and suffix, and a
 * tokenizer_config.json's special tokens. Every error names the file and the field; nothing here
 * trusts a size it read.
 * Not here: normalizer and decoder steps (tokenizer_json_steps.c), the tokenizer itself (bpe.c), GGUF metadata (engine/formats/gguf_tokenizer.c writes a
 * tokenizer.json text from it, with a "shardlm" object of special ids read below).
 * Tests: tests/test_bpe.py (against Hugging Face tokenizers, and malformed files). */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_json.h"

/* The largest id accepted: beyond any real vocabulary, small enough that the per-id arrays of an
 * absurd file cannot exhaust memory. */
#define BPE_MAX_VOCAB (1 << 22)

/* GPT-2's pattern: what ByteLevel splits with when use_regex is true. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum status tjson_bad(const struct bpe *b, const char *field, const char *what)
{
    return status_errorf(STATUS_BAD_FORMAT, "%s: %s %s", b->name, field, what);
}

const char *tjson_type(const cJSON *o)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "type");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

/* A boolean field: def when absent or null; BAD_FORMAT when another type. */
enum status tjson_bool(const struct bpe *b, const cJSON *o, const char *key, const char *field, int def, int *v)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!x || cJSON_IsNull(x)) return *v = def, STATUS_OK;
    if (!cJSON_IsBool(x)) return status_errorf(STATUS_BAD_FORMAT, "%s: %s.%s is not a boolean", b->name, field, key);
    *v = cJSON_IsTrue(x);
    return STATUS_OK;
}

/* A JSON number that is an integer in [lo, hi]. */
static int get_int(const cJSON *x, double lo, double hi, int32_t *v)
{
    if (!cJSON_IsNumber(x) || x->valuedouble < lo || x->valuedouble > hi || x->valuedouble != (double)(int64_t)x->valuedouble)
        return 0;
    *v = (int32_t)x->valuedouble;
    return 1;
}

enum status tjson_add_split(struct bpe *b, const char *pattern, int literal, enum bpe_split_behavior behavior, int invert)
{
    if (base_grow((void **)&b->splits, &(size_t){(size_t)b->n_splits}, (size_t)b->n_splits + 1, sizeof *b->splits))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    struct bpe_split *sp = &b->splits[b->n_splits];
    memset(sp, 0, sizeof *sp);
    if (!(sp->pattern = strdup(pattern))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    sp->literal = literal, sp->behavior = behavior, sp->invert = invert;
    b->n_splits++;
    return STATUS_OK;
}

static enum status parse_pre(struct bpe *b, const cJSON *p, const char *field, int depth, int *byte_level)
{
    enum status s;
    if (!p || cJSON_IsNull(p)) return STATUS_OK;
    const char *type = tjson_type(p);
    if (!cJSON_IsObject(p) || !type) return tjson_bad(b, field, "is not an object with a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (!cJSON_IsArray(list) || depth > 8) return tjson_bad(b, field, "has no \"pretokenizers\" array");
        const cJSON *e;
        cJSON_ArrayForEach(e, list) if ((s = parse_pre(b, e, field, depth + 1, byte_level))) return s;
        return STATUS_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        int prefix = 0, use_regex = 0;
        if ((s = tjson_bool(b, p, "add_prefix_space", field, 1, &prefix)) || (s = tjson_bool(b, p, "use_regex", field, 1, &use_regex)))
            return s;
        if (prefix && b->n_splits)
            return status_errorf(STATUS_UNSUPPORTED, "%s: %s: ByteLevel with add_prefix_space after another step", b->name, field);
        b->add_prefix_space = prefix;
        *byte_level = 1;
        return use_regex ? tjson_add_split(b, gpt2_pattern, 0, BPE_SPLIT_ISOLATED, 0) : STATUS_OK;
    }
    if (!strcmp(type, "Digits")) {
        int individual = 0;
        if ((s = tjson_bool(b, p, "individual_digits", field, 0, &individual))) return s;
        return tjson_add_split(b, individual ? "\\p{N}" : "\\p{N}+", 0, BPE_SPLIT_ISOLATED, 0);
    }
    if (!strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex"), *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        int invert = 0;
        if ((s = tjson_bool(b, p, "invert", field, 0, &invert))) return s;
        if (!cJSON_IsString(re) && !cJSON_IsString(str)) return tjson_bad(b, field, "Split has no pattern.Regex or pattern.String");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
        int k = 0;
        while (k < 5 && !(cJSON_IsString(beh) && !strcmp(beh->valuestring, names[k]))) k++;
        if (k == 5) return tjson_bad(b, field, "Split has an unknown behavior");
        return tjson_add_split(b, cJSON_IsString(re) ? re->valuestring : str->valuestring, !cJSON_IsString(re),
                         (enum bpe_split_behavior)k, invert);
    }
    int handled = 0;
    if ((s = tjson_pre_other(b, p, type, field, &handled)) || handled) return s;
    return status_errorf(STATUS_UNSUPPORTED,
                         "%s: %s type \"%s\" is not supported (ByteLevel, Split, Digits, BertPreTokenizer, Whitespace, "
                         "WhitespaceSplit, Punctuation, Metaspace, Sequence)", b->name, field, type);
}

/* The BOS of a TemplateProcessing post-processor (a SpecialToken before $A in "single") and the
 * tokens after $A; BertProcessing and RobertaProcessing's [CLS] and [SEP]. */
static enum status parse_post(struct bpe *b, const cJSON *p, int depth)
{
    if (!p || cJSON_IsNull(p)) return STATUS_OK;
    const char *type = tjson_type(p);
    if (!cJSON_IsObject(p) || !type) return tjson_bad(b, "post_processor", "is not an object with a \"type\"");
    if (!strcmp(type, "Sequence") && depth < 8) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        if (!cJSON_IsArray(list)) return tjson_bad(b, "post_processor", "has no \"processors\" array");
        enum status s;
        cJSON_ArrayForEach(e, list) if ((s = parse_post(b, e, depth + 1))) return s;
        return STATUS_OK;
    }
    if ((!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing"))) {
        /* "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]: [CLS] $A [SEP]. */
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(p, "cls"), *sep = cJSON_GetObjectItemCaseSensitive(p, "sep");
        int32_t a, z;
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep) || !get_int(cJSON_GetArrayItem(cls, 1), 0, b->n_vocab - 1, &a) ||
            !get_int(cJSON_GetArrayItem(sep, 1), 0, b->n_vocab - 1, &z))
            return tjson_bad(b, "post_processor", "needs \"cls\" and \"sep\" as [token, id] with ids of the vocabulary");
        b->bos_id = a, b->add_bos = 1, b->post_suffix[0] = z, b->n_post_suffix = 1;
        return STATUS_OK;
    }
    if (strcmp(type, "TemplateProcessing")) return STATUS_OK; /* ByteLevel: no token */
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *e;
    if (!cJSON_IsArray(single)) return tjson_bad(b, "post_processor.single", "is not an array");
    int after = 0;
    cJSON_ArrayForEach(e, single)
    {
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
            after = 1;
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
        if (!cJSON_IsString(name)) return tjson_bad(b, "post_processor.single", "has a SpecialToken without an \"id\" string");
        const int32_t id = bpe_piece_to_id(b, name->valuestring, strlen(name->valuestring));
        if (id < 0) return tjson_bad(b, "post_processor.single", "names a special token that is not in the vocabulary");
        /* The token before the text is the BOS; those after it (BERT's [SEP], the EOS that
         * embedding models such as Qwen3-Embedding pool at) come with add_bos too. */
        if (!after && b->add_bos)
            return status_errorf(STATUS_UNSUPPORTED, "%s: post_processor.single: more than one token before $A", b->name);
        if (!after) b->bos_id = id, b->add_bos = 1;
        else if (b->n_post_suffix == 2)
            return status_errorf(STATUS_UNSUPPORTED, "%s: post_processor.single: more than two tokens after $A", b->name);
        else b->post_suffix[b->n_post_suffix++] = id;
    }
    return STATUS_OK;
}

/* A special token of tokenizer_config.json ("eos_token": "<|im_end|>" or {"content": ...}). */
static int32_t config_token(const struct bpe *b, const cJSON *cfg, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(x)) x = cJSON_GetObjectItemCaseSensitive(x, "content");
    if (!cJSON_IsString(x)) return -1;
    return bpe_piece_to_id(b, x->valuestring, strlen(x->valuestring));
}

enum status tjson_config(struct bpe *b, const cJSON *cfg)
{
    int32_t id;
    if (!cfg) return STATUS_OK;
    if ((id = config_token(b, cfg, "eos_token")) >= 0) b->eos_id = id;
    if ((id = config_token(b, cfg, "pad_token")) >= 0) b->pad_id = id;
    if ((id = config_token(b, cfg, "unk_token")) >= 0) b->unk_id = id;
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token");
    if (cJSON_IsBool(add) && (id = config_token(b, cfg, "bos_token")) >= 0) {
        b->add_bos = cJSON_IsTrue(add);
        b->bos_id = id;
    }
    return STATUS_OK;
}

static enum status parse_vocab(struct bpe *b, const cJSON *root, const cJSON *model)
{
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab"), *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *e;
    const int unigram = b->model == BPE_MODEL_UNIGRAM;
    if (unigram ? !cJSON_IsArray(vocab) : !cJSON_IsObject(vocab))
        return tjson_bad(b, "model.vocab", unigram ? "is not an array of [piece, score]" : "is not an object");
    if (added && !cJSON_IsNull(added) && !cJSON_IsArray(added)) return tjson_bad(b, "added_tokens", "is not an array");
    int32_t top = -1, id;
    cJSON_ArrayForEach(e, vocab)
    {
        if (unigram) {
            if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(e->child) || !cJSON_IsNumber(e->child->next))
                return status_errorf(STATUS_BAD_FORMAT, "%s: model.vocab[%d] is not [piece, score]", b->name, top + 1);
            if (++top >= BPE_MAX_VOCAB) return tjson_bad(b, "model.vocab", "has too many pieces");
            continue;
        }
        if (!get_int(e, 0, BPE_MAX_VOCAB - 1, &id))
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.vocab[\"%.40s\"] is not an id in [0, %d)", b->name, e->string,
                                 BPE_MAX_VOCAB);
        top = id > top ? id : top;
    }
    int n_added = 0;
    cJSON_ArrayForEach(e, added)
    {
        if (!get_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, BPE_MAX_VOCAB - 1, &id) ||
            !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "content")))
            return status_errorf(STATUS_BAD_FORMAT, "%s: added_tokens[%d] needs an \"id\" in [0, %d) and a \"content\" string",
                                 b->name, n_added, BPE_MAX_VOCAB);
        top = id > top ? id : top;
        n_added++;
    }
    if (top < 0) return tjson_bad(b, "model.vocab", "is empty");
    b->n_vocab = top + 1;
    const size_t nv = (size_t)b->n_vocab;
    if (!(b->pieces = calloc(nv, sizeof *b->pieces)) || !(b->bytes = calloc(nv, sizeof *b->bytes)) ||
        !(b->n_bytes = calloc(nv, sizeof *b->n_bytes)) || !(b->flags = calloc(nv, 1)) ||
        !(b->added = calloc((size_t)n_added + 1, sizeof *b->added)) || (unigram && !(b->scores = malloc(nv * sizeof *b->scores))))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    for (size_t i = 0; unigram && i < nv; i++) b->scores[i] = NAN; /* not a piece of the model */
    id = -1;
    cJSON_ArrayForEach(e, vocab)
    {
        if (unigram) {
            id++;
            if (!(b->pieces[id] = strdup(e->child->valuestring))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
            b->scores[id] = e->child->next->valuedouble;
            continue;
        }
        get_int(e, 0, BPE_MAX_VOCAB - 1, &id);
        if (b->pieces[id])
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.vocab gives id %d to \"%.40s\" and \"%.40s\"", b->name, id,
                                 b->pieces[id], e->string);
        if (!(b->pieces[id] = strdup(e->string))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    }
    enum status s;
    cJSON_ArrayForEach(e, added)
    {
        struct bpe_added *a = &b->added[b->n_added];
        const char *field = "added_tokens[]";
        get_int(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, BPE_MAX_VOCAB - 1, &a->id);
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if ((s = tjson_bool(b, e, "special", field, 0, &a->special)) || (s = tjson_bool(b, e, "lstrip", field, 0, &a->lstrip)) ||
            (s = tjson_bool(b, e, "rstrip", field, 0, &a->rstrip)) ||
            (s = tjson_bool(b, e, "single_word", field, 0, &a->single_word)) ||
            (s = tjson_bool(b, e, "normalized", field, !a->special, &a->normalized)))
            return s;
        a->n = strlen(content);
        if (!(a->content = strdup(content))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
        b->n_added++;
        /* The piece of an added id is its content (what Hugging Face decodes it to). */
        a->in_model = b->pieces[a->id] != NULL;
        free(b->pieces[a->id]);
        if (!(b->pieces[a->id] = strdup(content))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
        b->flags[a->id] |= BPE_PIECE_ADDED | (a->special ? BPE_PIECE_SPECIAL : 0);
    }
    for (int i = 0; i < b->n_vocab; i++)
        if (!b->pieces[i]) {
            if (!(b->pieces[i] = strdup(""))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
            b->flags[i] |= BPE_PIECE_UNUSED;
        }
    return STATUS_OK;
}

/* Merges after the vocabulary: "left right" strings or [left, right] pairs. */
static enum status parse_merges(struct bpe *b, const cJSON *model)
{
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges"), *e;
    if (!merges || cJSON_IsNull(merges)) return STATUS_OK;
    if (!cJSON_IsArray(merges)) return tjson_bad(b, "model.merges", "is not an array");
    const int n = cJSON_GetArraySize(merges);
    if (!(b->merges = malloc(((size_t)n + 1) * 2 * sizeof *b->merges)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
    int r = 0;
    cJSON_ArrayForEach(e, merges)
    {
        const char *l = NULL, *rt = NULL;
        size_t nl = 0, nr = 0;
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            if (sp) l = e->valuestring, nl = (size_t)(sp - l), rt = sp + 1, nr = strlen(rt);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) && cJSON_IsString(e->child->next)) {
            l = e->child->valuestring, nl = strlen(l), rt = e->child->next->valuestring, nr = strlen(rt);
        }
        if (!l) return status_errorf(STATUS_BAD_FORMAT, "%s: model.merges[%d] is neither \"left right\" nor [left, right]", b->name, r);
        const int32_t a = bpe_piece_to_id(b, l, nl), c = bpe_piece_to_id(b, rt, nr);
        if (a < 0 || c < 0)
            return status_errorf(STATUS_BAD_FORMAT, "%s: model.merges[%d] names \"%.*s\", which is not in model.vocab", b->name, r,
                                 (int)(a < 0 ? (nl > 60 ? 60 : nl) : (nr > 60 ? 60 : nr)), a < 0 ? l : rt);
        b->merges[2 * r] = a, b->merges[2 * r + 1] = c;
        r++;
    }
    b->n_merges = r;
    return STATUS_OK;
}

static const char *models_name(enum bpe_model m)
{
    return m == BPE_MODEL_UNIGRAM ? "Unigram" : m == BPE_MODEL_WORDPIECE ? "WordPiece" : m == BPE_MODEL_WORDLEVEL ? "WordLevel" : "BPE";
}

/* The model, steps and special ids of the non-byte-level kinds (b->model already set). */
static enum status load_other(struct bpe *b, const cJSON *root, const cJSON *model)
{
    enum status s;
    int byte_level = 0;
    const char *field = "model";
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (b->model == BPE_MODEL_BPE) {
        const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix"),
                    *eow = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
        if ((cJSON_IsString(csp) && *csp->valuestring) || (cJSON_IsString(eow) && *eow->valuestring))
            return status_errorf(STATUS_UNSUPPORTED, "%s: model: continuing_subword_prefix and end_of_word_suffix are not supported",
                                 b->name);
        if ((s = tjson_bool(b, model, "byte_fallback", field, 0, &b->byte_fallback)) ||
            (s = tjson_bool(b, model, "ignore_merges", field, 0, &b->ignore_merges)) ||
            (s = tjson_bool(b, model, "fuse_unk", field, 0, &b->fuse_unk)))
            return s;
    } else if (b->model == BPE_MODEL_WORDPIECE) {
        const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix");
        const cJSON *mx = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
        if (csp && !cJSON_IsString(csp)) return tjson_bad(b, "model.continuing_subword_prefix", "is not a string");
        if (!(b->wp_prefix = strdup(csp ? csp->valuestring : "##")))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", b->name);
        b->wp_max_chars = 100;
        if (mx && !get_int(mx, 0, INT32_MAX, &b->wp_max_chars))
            return tjson_bad(b, "model.max_input_chars_per_word", "is not a non-negative integer");
    } else if ((s = tjson_bool(b, model, "byte_fallback", field, 0, &b->byte_fallback))) {
        return s;
    }
    if ((s = parse_vocab(b, root, model)) || (s = bpe_index_pieces(b)) ||
        (b->model == BPE_MODEL_BPE && (s = parse_merges(b, model))) ||
        (s = tjson_normalizer(b, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0)) ||
        (s = parse_pre(b, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", 0, &byte_level)) ||
        (s = parse_post(b, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), 0)) ||
        (s = tjson_decoder(b, cJSON_GetObjectItemCaseSensitive(root, "decoder"), 0, &byte_level)))
        return s;
    if (byte_level)
        return status_errorf(STATUS_UNSUPPORTED, "%s: a ByteLevel step with a %s model", b->name,
                             b->model == BPE_MODEL_BPE ? "non-byte-level BPE" : models_name(b->model));
    if (b->model == BPE_MODEL_UNIGRAM) {
        const cJSON *uid = cJSON_GetObjectItemCaseSensitive(model, "unk_id");
        if (uid && !cJSON_IsNull(uid) && !get_int(uid, 0, b->n_vocab - 1, &b->model_unk_id))
            return tjson_bad(b, "model.unk_id", "is not an id of the vocabulary");
    } else if (cJSON_IsString(unk)) {
        b->model_unk_id = bpe_piece_to_id(b, unk->valuestring, strlen(unk->valuestring));
    } else if (b->model == BPE_MODEL_WORDLEVEL && !unk) { /* Hugging Face's default unk_token */
        b->model_unk_id = bpe_piece_to_id(b, "<unk>", 5);
    }
    if (b->model == BPE_MODEL_WORDPIECE && b->model_unk_id < 0)
        return tjson_bad(b, "model.unk_token", "is missing or not in the vocabulary (WordPiece needs one)");
    b->unk_id = b->model_unk_id;
    return STATUS_OK;
}

enum status bpe_load_json(const char *json, size_t n, const char *name, const char *config, size_t config_n, struct bpe **out)
{
    *out = NULL;
    struct bpe *b = bpe_alloc(name);
    if (!b) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
    cJSON *root = cJSON_ParseWithLength(json, n), *cfg = NULL;
    enum status s = STATUS_OK;
    int byte_level = 0;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const char *mtype = tjson_type(model);
    if (!cJSON_IsObject(root)) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: not a JSON object (a tokenizer.json)", name);
        goto out;
    }
    if (!cJSON_IsObject(model)) {
        s = tjson_bad(b, "model", "is not an object");
        goto out;
    }
    /* Indexed by enum bpe_model; a model without a "type" is BPE. */
    static const char *const models[] = {"BPE", "BPE", "WordPiece", "Unigram", "WordLevel"};
    int k = 1;
    while (mtype && k < 5 && strcmp(mtype, models[k])) k++;
    if (mtype && k == 5) {
        s = status_errorf(STATUS_UNSUPPORTED, "%s: model.type \"%s\" is not supported (BPE, WordPiece, Unigram, WordLevel)", name,
                          mtype);
        goto out;
    }
    /* Model BPE is byte-level or not by its pre-tokenizer and decoder, below. */
    b->model = k >= 2 ? (enum bpe_model)k : BPE_MODEL_BYTE_LEVEL;
    if (b->model == BPE_MODEL_BYTE_LEVEL) {
        const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
        char *text = cJSON_PrintUnformatted(pre);
        if (!text && pre) {
            s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", name);
            goto out;
        }
        /* Byte-level when a ByteLevel step is there (cheaper than walking the Sequences twice). */
        if (!text || !strstr(text, "\"type\":\"ByteLevel\"")) b->model = BPE_MODEL_BPE;
        free(text);
    }
    if (b->model != BPE_MODEL_BYTE_LEVEL) {
        s = load_other(b, root, model);
        goto config;
    }
    int fallback = 0;
    const cJSON *csp = cJSON_GetObjectItemCaseSensitive(model, "continuing_subword_prefix"),
                *eow = cJSON_GetObjectItemCaseSensitive(model, "end_of_word_suffix");
    if ((s = tjson_bool(b, model, "byte_fallback", "model", 0, &fallback)) ||
        (s = tjson_bool(b, model, "ignore_merges", "model", 0, &b->ignore_merges)))
        goto out;
    if (fallback || (cJSON_IsString(csp) && *csp->valuestring) || (cJSON_IsString(eow) && *eow->valuestring)) {
        s = status_errorf(STATUS_UNSUPPORTED,
                          "%s: model: byte_fallback, continuing_subword_prefix and end_of_word_suffix are not supported "
                          "(SentencePiece-style BPE: use tokenizer.model)", name);
        goto out;
    }
    if ((s = parse_vocab(b, root, model)) || (s = bpe_index_pieces(b)) || (s = parse_merges(b, model)) ||
        (s = tjson_normalizer(b, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), 0)) ||
        (s = parse_pre(b, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer", 0, &byte_level)) ||
        (s = parse_post(b, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), 0)))
        goto out;
    for (int i = 0; i < b->n_norms; i++) {
        if (b->norms[i].kind != BPE_NORM_NFC) {
            s = status_errorf(STATUS_UNSUPPORTED, "%s: byte-level BPE takes only the NFC normalizer", name);
            goto out;
        }
        b->nfc = 1;
    }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    int dec_byte_level = 0;
    if (!byte_level || !dec || cJSON_IsNull(dec) || (s = tjson_decoder(b, dec, 0, &dec_byte_level)) || b->n_decs || !dec_byte_level) {
        if (s == STATUS_OK)
            s = status_errorf(STATUS_UNSUPPORTED, "%s: a ByteLevel pre_tokenizer needs a decoder of ByteLevel steps only", name);
        goto out;
    }
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (cJSON_IsString(unk)) b->unk_id = b->model_unk_id = bpe_piece_to_id(b, unk->valuestring, strlen(unk->valuestring));
config:
    if (s) goto out;
    /* What engine/formats/gguf_tokenizer.c writes for a GGUF vocabulary: the metadata's ids. */
    const cJSON *ours = cJSON_GetObjectItemCaseSensitive(root, "shardlm");
    if (cJSON_IsObject(ours)) {
        static const char *const keys[] = {"bos_id", "eos_id", "pad_id", "unk_id"};
        int32_t *dst[] = {&b->bos_id, &b->eos_id, &b->pad_id, &b->unk_id};
        for (int k = 0; k < 4; k++) {
            const cJSON *x = cJSON_GetObjectItemCaseSensitive(ours, keys[k]);
            if (x && !get_int(x, -1, b->n_vocab - 1, dst[k])) {
                s = status_errorf(STATUS_BAD_FORMAT, "%s: shardlm.%s is not an id of the vocabulary", name, keys[k]);
                goto out;
            }
        }
        if ((s = tjson_bool(b, ours, "add_bos", "shardlm", 0, &b->add_bos))) goto out;
    }
    if (config && !cJSON_IsObject(cfg = cJSON_ParseWithLength(config, config_n))) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: its tokenizer_config.json is not a JSON object", name);
        goto out;
    }
    tjson_config(b, cfg);
    /* The contract of tokenizer.h: a BOS id only where the tokenizer puts one first (callers
     * push tokenizer_bos_id whenever it is not -1). */
    if (!b->add_bos) b->bos_id = -1;
    s = bpe_finish(b);
out:
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (s != STATUS_OK) {
        bpe_free(b);
        return s;
    }
    *out = b;
    return STATUS_OK;
}
