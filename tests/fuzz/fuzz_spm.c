/* tests/fuzz/fuzz_spm.c - SentencePiece BPE models read and run by engine/text/spm.c, differentially
 * against libsentencepiece. The input is a 2-byte little-endian length L, a serialized ModelProto
 * of L bytes (or what is left), then a text. A proto spm.c takes (tokenizer_kind
 * "sentencepiece-bpe") must load with libsentencepiece too (SHARDLM_SENTENCEPIECE=lib), and both
 * must give the same encode status, the same ids, and the same decode of those ids and of the
 * text's bytes read as ids, with special tokens shown and not; else the target aborts. A proto it
 * does not take goes to libsentencepiece through the same tokenizer_load_from_memory, which must
 * answer with a status (never crash).
 * Known and not checked: libsentencepiece's user-defined-symbol trie reads past its 64 results
 * when more than 64 user-defined pieces are prefixes of one position (spm.c takes the longest).
 * Corpus: tests/fuzz/corpus/spm (tests/fuzz/make_seeds.py spm_seeds). */
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

static struct tokenizer *load(const uint8_t *proto, size_t n, int lib)
{
    struct tokenizer *t = NULL;
    if (lib) setenv("SHARDLM_SENTENCEPIECE", "lib", 1);
    else unsetenv("SHARDLM_SENTENCEPIECE");
    if (fuzz_report(tokenizer_load_from_memory(proto, n, &t)) != STATUS_OK) t = NULL;
    unsetenv("SHARDLM_SENTENCEPIECE");
    return t;
}

static void same_decode(const struct tokenizer *a, const struct tokenizer *b, const int32_t *ids, int n)
{
    for (int show = 0; show <= 1; show++) {
        char *x = NULL, *y = NULL;
        size_t nx = 0, ny = 0;
        const enum status sx = tokenizer_decode_opts(a, ids, n, show, &x, &nx);
        const enum status sy = tokenizer_decode_opts(b, ids, n, show, &y, &ny);
        if (sx != sy || nx != ny || (nx && memcmp(x, y, nx))) {
            fprintf(stderr, "decode of %d ids (show_special %d) differs: spm.c status %d, %zu bytes; "
                    "libsentencepiece status %d, %zu bytes\n", n, show, (int)sx, nx, (int)sy, ny);
            abort();
        }
        free(x);
        free(y);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    size_t n_proto = (size_t)data[0] | (size_t)data[1] << 8;
    if (n_proto > size - 2) n_proto = size - 2;
    const uint8_t *proto = data + 2, *text = data + 2 + n_proto;
    const size_t n_text = size - 2 - n_proto;
    struct tokenizer *own = load(proto, n_proto, 0);
    if (!own) return 0;
    if (strcmp(tokenizer_kind(own), "sentencepiece-bpe") != 0) {
        tokenizer_free(own);
        return 0;
    }
    struct tokenizer *lib = load(proto, n_proto, 1);
    if (!lib) {
        fprintf(stderr, "spm.c took a proto libsentencepiece refuses: %s\n", status_message());
        abort();
    }
    if (tokenizer_vocab_size(own) != tokenizer_vocab_size(lib) || tokenizer_bos_id(own) != tokenizer_bos_id(lib) ||
        tokenizer_eos_id(own) != tokenizer_eos_id(lib) || tokenizer_pad_id(own) != tokenizer_pad_id(lib) ||
        tokenizer_unk_id(own) != tokenizer_unk_id(lib)) {
        fprintf(stderr, "vocabulary or special ids differ\n");
        abort();
    }
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    const enum status sa = tokenizer_encode(own, (const char *)text, n_text, 0, &a, &na);
    const enum status sb = tokenizer_encode(lib, (const char *)text, n_text, 0, &b, &nb);
    if (sa != sb || na != nb || (na && memcmp(a, b, (size_t)na * sizeof *a))) {
        fprintf(stderr, "encode differs: spm.c status %d, %d ids; libsentencepiece status %d, %d ids\n", (int)sa, na,
                (int)sb, nb);
        abort();
    }
    same_decode(own, lib, a, na);
    /* The text's bytes as ids of this vocabulary: every kind of piece in any order. */
    const int vocab = tokenizer_vocab_size(own);
    int32_t ids[256];
    int n_ids = 0;
    for (size_t i = 0; i < n_text && n_ids < 256; i++) ids[n_ids++] = (int32_t)(text[i] % (unsigned)vocab);
    same_decode(own, lib, ids, n_ids);
    free(a);
    free(b);
    tokenizer_free(own);
    tokenizer_free(lib);
    return 0;
}
