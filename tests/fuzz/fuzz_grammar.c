/* tests/fuzz/fuzz_grammar.c - the grammar engine's parsers (engine/grammar/): the JSON Schema
 * compiler, the GBNF parser, the regex parser and choice lists. The first input byte picks the
 * kind (mod 5), the rest is the source. A source that compiles is then run: a few mask steps
 * on a vocabulary of the 256 bytes plus some multi-byte tokens, each mask bit of a sample of
 * tokens checked against accept + rollback (a disagreement aborts; a mask over the work bound
 * must fail with a message), the source's first bytes fed with accept_bytes. A compile error
 * must come with a message. Corpus: tests/fuzz/corpus/grammar (tests/fuzz/make_seeds.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "fuzz_grammar_vocab.h"


static void run(struct grammar *g, const uint8_t *data, size_t size)
{
    struct grammar_matcher *m;
    if (grammar_matcher_new(g, &m) != STATUS_OK) return;
    uint32_t mask[(300 + 31) / 32];
    for (int step = 0; step < 8 && !grammar_matcher_is_done(m); step++) {
        if (grammar_matcher_fill_mask(m, mask) != STATUS_OK) { /* over the work bound: must say why */
            if (!status_message()[0]) {
                fprintf(stderr, "grammar_matcher_fill_mask failed without a message\n");
                abort();
            }
            break;
        }
        int first = -1;
        for (int t = 0; t < grammar_vocab_mask_words(vocab) * 32; t += 1 + (int)(size % 7)) {
            int bit = mask[t >> 5] >> (t & 31) & 1;
            int ok = grammar_matcher_accept(m, t) == STATUS_OK;
            if (ok) grammar_matcher_rollback(m, 1);
            if (ok != bit) {
                fprintf(stderr, "mask bit %d for token %d, accept says %d\n", bit, t, ok);
                abort();
            }
            if (bit && first < 0) first = t;
        }
        if (first < 0) break;
        grammar_matcher_accept(m, first);
    }
    grammar_matcher_rollback(m, 100);
    /* At most 64 bytes: each byte's closure may take MAX_WORK steps (grammar_pda.c) on a grammar
     * whose parses multiply, and a longer run says nothing more. */
    grammar_matcher_accept_bytes(m, (const char *)data, size < 64 ? size : 64);
    grammar_matcher_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar *g;
    if (!fuzz_grammar_compile_input(vocab, data, size, 0, &g)) return 0;
    run(g, data + 1, size - 1);
    grammar_unref(g);
    return 0;
}
