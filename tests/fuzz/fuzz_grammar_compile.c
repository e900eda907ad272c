/* tests/fuzz/fuzz_grammar_compile.c - the grammar engine's compilers alone (engine/grammar/): the
 * JSON Schema compiler, the GBNF parser, the regex parser and choice lists, over the vocabulary
 * of fuzz_grammar.c. The first input byte picks the kind (mod 5), the rest is the source. A
 * source that compiles (grammar_parse: parsed, checked, flattened) must give a matcher (its
 * start expanded, within MAX_WORK) or an error with a message; a compile error must come with a
 * message. No mask and no decoding here: the first mask that grammar_compile adds cost up to
 * 0.5 s an input on the corpus's regexes of nested counted repeats (9 in 10 of this target's
 * time until 2026-12-02); fuzz_grammar runs it and the matcher (masks against accept and
 * rollback) on what compiles, so that the parsers get the executions (issue 28: 10 million for
 * each) and the matcher its own campaign.
 * Corpus: tests/fuzz/corpus/grammar_compile (a link to fuzz_grammar's seeds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "fuzz_grammar_vocab.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar *g;
    if (!fuzz_grammar_compile_input(vocab, data, size, 1, &g)) return 0;
    struct grammar_matcher *m = NULL;
    if (grammar_matcher_new(g, &m) != STATUS_OK && !status_message()[0]) {
        fprintf(stderr, "grammar_matcher_new failed without a message\n");
        abort();
    }
    grammar_matcher_free(m);
    grammar_unref(g);
    return 0;
}
