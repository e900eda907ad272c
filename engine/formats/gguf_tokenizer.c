/* engine/formats/gguf_tokenizer.c - the converter's side of a GGUF tokenizer: the
 * tokenizer.ggml.* metadata turned into a serialized SentencePiece ModelProto, with the small
 * protobuf wire-format encoder that writes it (see gguf_tokenizer.h).
 * Not here: reading GGUF (gguf.c), loading the proto (engine/text/tokenizer.h).
 * Tests: tests/test_gguf.c (a tiny vocabulary built by tests/gguf_setup.py, loaded by
 * SentencePiece; the Gemma 3 vocabulary when the real file is present). */
#include "gguf_tokenizer.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- protobuf wire format (what sentencepiece_model.proto needs) ------------------------ */

/* A growable byte buffer for the protobuf wire format. */
struct pb {
    uint8_t *p;
    size_t   n, cap;
    int      oom;
};

static void pb_bytes(struct pb *b, const void *src, size_t n)
{
    if (b->oom) return;
    if (n > SIZE_MAX - b->n || base_grow((void **)&b->p, &b->cap, b->n + n, 1)) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void pb_varint(struct pb *b, uint64_t v)
{
    uint8_t tmp[10];
    int n = 0;
    do {
        tmp[n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(b, tmp, (size_t)n);
}

/* Wire types: 0 varint, 2 length-delimited, 5 fixed32. */
static void pb_tag(struct pb *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

/* int32 and enum fields: negative values are sign-extended to 64 bits, as protobuf does. */
static void pb_int32(struct pb *b, int field, int32_t v)
{
    pb_tag(b, field, 0);
    pb_varint(b, (uint64_t)(int64_t)v);
}

static void pb_str(struct pb *b, int field, const void *s, size_t n)
{
    pb_tag(b, field, 2);
    pb_varint(b, n);
    pb_bytes(b, s, n);
}

static void pb_float(struct pb *b, int field, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint8_t le[4] = {(uint8_t)u, (uint8_t)(u >> 8), (uint8_t)(u >> 16), (uint8_t)(u >> 24)};
    pb_tag(b, field, 5);
    pb_bytes(b, le, 4);
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

enum status gguf_tokenizer_model_proto(const struct gguf *g, void **data, size_t *n)
{
    *data = NULL;
    *n = 0;
    const char *model;
    const struct gguf_kv *tokens, *scores = NULL, *types = NULL;
    enum status s = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (s) return s;
    if (strcmp(model, "llama") != 0)
        return status_errorf(STATUS_UNSUPPORTED,
                             "%s: tokenizer.ggml.model is '%s'; only SentencePiece vocabularies ('llama') are supported",
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
    if (types && (types->n != nv || !gguf_tokenizer_int_type(types->arr_type)))
        return status_errorf(STATUS_BAD_FORMAT, "%s: tokenizer.ggml.token_type has %" PRIu64 " %s, expected %" PRIu64 " INT32",
                             gguf_path(g), types->n, gguf_type_name(types->arr_type), nv);

    int32_t unk, bos, eos, pad;
    if ((s = gguf_tokenizer_id(g, "tokenizer.ggml.unknown_token_id", nv, &unk)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.bos_token_id", nv, &bos)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.eos_token_id", nv, &eos)) ||
        (s = gguf_tokenizer_id(g, "tokenizer.ggml.padding_token_id", nv, &pad)))
        return s;
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

    struct pb out = {0}, sub = {0};
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
        pb_str(&sub, 1, p, (size_t)len);
        pb_float(&sub, 2, scores ? (float)gguf_arr_float(scores, i) : 0.0f);
        pb_int32(&sub, 3, (int32_t)type);
        if (sub.oom) break;
        pb_str(&out, 1, sub.p, sub.n);
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
        pb_str(&sub, 45 + k, p, (size_t)len); /* unk_piece, bos_piece, eos_piece, pad_piece */
    }
    if (!sub.oom) pb_str(&out, 2, sub.p, sub.n);

    /* NormalizerSpec (field 3): no Unicode normalization (llama.cpp applies none), spaces
     * escaped to U+2581, runs of spaces kept. */
    sub.n = 0;
    pb_str(&sub, 1, "identity", 8);
    pb_int32(&sub, 3, add_space_prefix);
    pb_int32(&sub, 4, 0); /* remove_extra_whitespaces */
    pb_int32(&sub, 5, 1); /* escape_whitespaces */
    if (!sub.oom) pb_str(&out, 3, sub.p, sub.n);

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
