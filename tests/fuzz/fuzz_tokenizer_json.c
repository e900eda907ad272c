/* tests/fuzz/fuzz_tokenizer_json.c - tokenizer.json parsing and encoding (engine/text/tokenizer_json.c,
 * tokenizer_json_steps.c, bpe.c, wordpiece.c, unigram.c, normalizer.c, text_decode.c). The input is
 * split at its first NUL byte: before it the tokenizer.json text (tokenizer_load_from_memory), after
 * it a text to encode. A file that loads must encode the text (or refuse it with a status), decode
 * the ids, and the streaming detokenizer must give the decode of the first 64 ids byte for byte
 * (special tokens shown and not: tokenizer_decode_opts), else the target aborts.
 * A first byte other than '{' makes it a tiktoken rank file (engine/text/tiktoken.c).
 * Corpus: tests/fuzz/corpus/tokenizer_json (small WordPiece, WordLevel (one without its unk), Unigram,
 * character and byte-level BPE files, one with a Precompiled normalizer, two with normalized added
 * tokens and post-processor tokens (seed-*-added), tiktoken rank files, each
 * with a text; tests/fuzz/make_seeds.py does not write them). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

/* Aborts unless the streaming detokenizer gives tokenizer_decode_opts's text, special tokens
 * shown or not. */
static void stream_equals_decode(const struct tokenizer *t, const int32_t *ids, int n_ids, int show)
{
    char *dec = NULL;
    size_t dn = 0;
    if (fuzz_report(tokenizer_decode_opts(t, ids, n_ids, show, &dec, &dn)) != STATUS_OK) return;
    struct detokenizer d;
    detokenizer_init(&d, t);
    detokenizer_show_special(&d, show);
    char *streamed = malloc(dn + 1);
    size_t sn = 0;
    int same = streamed != NULL;
    for (int i = 0; i <= n_ids && same; i++) {
        const char *piece;
        size_t pn;
        const enum status s = i < n_ids ? detokenizer_push(&d, ids[i], &piece, &pn) : detokenizer_flush(&d, &piece, &pn);
        if (s != STATUS_OK || sn + pn > dn) same = 0;
        else memcpy(streamed + sn, piece, pn), sn += pn;
    }
    if (!same || sn != dn || memcmp(streamed, dec, dn)) {
        fprintf(stderr, "the streaming detokenizer differs from tokenizer_decode_opts (show_special %d)\n", show);
        abort();
    }
    detokenizer_free(&d);
    free(streamed);
    free(dec);
}

static void round_trip(const struct tokenizer *t, const char *text, size_t n)
{
    int32_t *ids = NULL;
    int n_ids = 0;
    if (fuzz_report(tokenizer_encode(t, text, n, 1, &ids, &n_ids)) != STATUS_OK) return;
    for (int i = 0; i < n_ids; i++)
        if (ids[i] < 0 || ids[i] >= tokenizer_vocab_size(t)) {
            fprintf(stderr, "tokenizer_encode gave id %d outside the vocabulary of %d\n", ids[i], tokenizer_vocab_size(t));
            abort();
        }
    /* The first 64 ids: the streaming detokenizer's cost per id grows with what it holds back, and
     * a longer run adds time (the target ran at 260 inputs a second), not cases. */
    for (int show = 0; show <= 1; show++) stream_equals_decode(t, ids, n_ids < 64 ? n_ids : 64, show);
    for (int i = 0; i < n_ids; i++) {
        char buf[256];
        (void)tokenizer_token_bytes(t, ids[i], buf, (int)sizeof buf);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t n_json = nul ? (size_t)(nul - data) : size;
    struct tokenizer *t = NULL;
    /* JSON, or a tiktoken rank file (its first byte base64) under one of the built-in patterns,
     * chosen by the first byte; a ModelProto goes to SentencePiece, which fuzz_detokenize covers. */
    static const char *const patterns[] = {"cl100k", "o200k", "llama3", "r50k"};
    if (n_json == 0) return 0;
    const enum status s = data[0] == '{' ? tokenizer_load_from_memory(data, n_json, &t)
                                         : tokenizer_load_tiktoken_from_memory(data, n_json, patterns[data[0] & 3], &t);
    if (fuzz_report(s) != STATUS_OK) return 0;
    const char *text = nul ? (const char *)nul + 1 : "";
    round_trip(t, text, nul ? size - n_json - 1 : 0);
    tokenizer_free(t);
    return 0;
}
