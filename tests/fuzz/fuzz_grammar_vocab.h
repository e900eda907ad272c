/* tests/fuzz/fuzz_grammar_vocab.h - the vocabulary the grammar fuzz targets compile against
 * (fuzz_grammar.c, fuzz_grammar_compile.c): the 256 bytes, some multi-byte tokens JSON makes
 * (and one of two bytes of UTF-8), and an empty end token. Aborts when it cannot be built. */
#ifndef SHARDLM_FUZZ_GRAMMAR_VOCAB_H
#define SHARDLM_FUZZ_GRAMMAR_VOCAB_H

#include <stdlib.h>
#include <string.h>

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

#endif
