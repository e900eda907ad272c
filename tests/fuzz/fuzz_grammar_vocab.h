/* tests/fuzz/fuzz_grammar_vocab.h - the vocabulary the grammar fuzz targets compile against
 * (fuzz_grammar.c, fuzz_grammar_compile.c): the 256 bytes, some multi-byte tokens JSON makes
 * (and one of two bytes of UTF-8), and an empty end token. Aborts when it cannot be built. */
#ifndef SHARDLM_FUZZ_GRAMMAR_VOCAB_H
#define SHARDLM_FUZZ_GRAMMAR_VOCAB_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "grammar.h"

static struct grammar_vocab *fuzz_grammar_vocab(void)
{
    static const char *multi[] = {"{\"", "\":", "\",", "true", "null", "ab", "\xc3\xa9", "\\\"", "12", "a\"", NULL};
    static char bytes[256];
    const char *toks[300];
    int lens[300], n = 0;
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, toks[n] = &bytes[i], lens[n++] = 1;
    for (int i = 0; multi[i]; i++) toks[n] = multi[i], lens[n++] = (int)strlen(multi[i]);
    int32_t end = n;
    toks[n] = "", lens[n++] = 0;
    struct grammar_vocab *v;
    if (grammar_vocab_new_bytes(toks, lens, n, n + 3, &end, 1, &v) != STATUS_OK) abort();
    return v;
}

/* The targets' vocabulary, built once by libFuzzer's initializer (each target includes this
 * header once). */
static struct grammar_vocab *vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    vocab = fuzz_grammar_vocab();
    return 0;
}

/* The input's grammar (byte 0 the kind, mod 5; the rest the source), compiled into *g
 * (grammar_compile; only parsed when parse_only: grammar_parse); 0 when it does not compile
 * (then the error must come with a message, else abort) or the input is out of bounds. */
static inline int fuzz_grammar_compile_input(const struct grammar_vocab *v, const uint8_t *data, size_t size,
                                             int parse_only, struct grammar **g)
{
    *g = NULL;
    if (size < 1 || size > 4096) return 0;
    enum grammar_kind kind = (enum grammar_kind)(data[0] % 5);
    const char *src = (const char *)data + 1;
    if (fuzz_report(parse_only ? grammar_parse(v, kind, src, size - 1, g) : grammar_compile(v, kind, src, size - 1, g)) ==
        STATUS_OK)
        return 1;
    if (!status_message()[0]) {
        fprintf(stderr, "grammar_compile failed without a message\n");
        abort();
    }
    return 0;
}

#endif
