/* engine/text/wordpiece.c - the word models of a tokenizer.json. WordPiece (BERT): each pre-token is cut
 * greedily into the longest pieces of the vocabulary from the left, every piece after the first
 * spelled with the continuing-subword prefix ("##"); a word with a part no piece matches, or longer
 * than max_input_chars_per_word characters, becomes the one unk id (Hugging Face's
 * models/wordpiece). WordLevel: each pre-token whole is one id, else the unk id (models/wordlevel).
 * Not here: BertNormalizer (normalizer.c), BertPreTokenizer (Split steps,
 * tokenizer_json.c), the WordPiece decoder (text_decode.c).
 * Tests: tests/test_tokenizer_kinds.py, tests/test_vocab_vectors.py (llama.cpp's bert-bge vectors). */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

enum status wordpiece_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                  size_t *cap)
{
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += (w[i] & 0xC0) != 0x80;
    if (chars > (size_t)b->wp_max_chars) return bpe_push_id(ids, n_ids, cap, b->model_unk_id);
    const size_t np = strlen(b->wp_prefix), mark = *n_ids;
    char stack[256];
    char *key = n + np <= sizeof stack ? stack : malloc(n + np);
    if (!key) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    memcpy(key, b->wp_prefix, np);
    enum status st = STATUS_OK;
    int bad = 0;
    for (size_t start = 0; start < n && !bad && !st;) {
        size_t end = n;
        int32_t found = -1;
        while (start < end) {
            /* The prefix goes before every piece but the first. */
            const size_t off = start > 0 ? np : 0;
            memcpy(key + np, w + start, end - start);
            found = bpe_piece_to_id(b, key + np - off, end - start + off);
            if (found >= 0) break;
            do end--; /* back one whole character */
            while (end > start && (w[end] & 0xC0) == 0x80);
        }
        if (found < 0) bad = 1;
        else st = bpe_push_id(ids, n_ids, cap, found), start = end;
    }
    if (key != stack) free(key);
    if (st) return st;
    if (bad) {
        *n_ids = mark;
        return bpe_push_id(ids, n_ids, cap, b->model_unk_id);
    }
    return STATUS_OK;
}

enum status wordlevel_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                  size_t *cap)
{
    int32_t id = bpe_piece_to_id(b, (const char *)w, n);
    if (id < 0) id = b->model_unk_id;
    if (id < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: \"%.*s\" is not in the WordLevel vocabulary and model.unk_token is not either",
                             b->name, n > 60 ? 60 : (int)n, (const char *)w);
    return bpe_push_id(ids, n_ids, cap, id);
}
