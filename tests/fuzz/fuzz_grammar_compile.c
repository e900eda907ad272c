/* tests/fuzz/fuzz_grammar_compile.c - the grammar engine's compilers alone (engine/grammar/): the
 * JSON Schema compiler, the GBNF parser, the regex parser and choice lists, over the vocabulary
 * of fuzz_grammar.c. The first input byte picks the kind (mod 5), the rest is the source. A
 * source that compiles must give a matcher; a compile error must come with a message. No
 * decoding here: fuzz_grammar runs the matcher on what compiles (masks against accept and
 * rollback), at about a hundredth of this target's speed, so that the parsers get the
 * executions (issue 28: 10 million for each) and the matcher its own campaign.
 * Corpus: tests/fuzz/corpus/grammar_compile (a link to fuzz_grammar's seeds). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "fuzz_grammar_vocab.h"


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct grammar *g;
    if (!fuzz_grammar_compile_input(vocab, data, size, &g)) return 0;
    struct grammar_matcher *m = NULL;
    if (grammar_matcher_new(g, &m) != STATUS_OK && !status_message()[0]) {
        fprintf(stderr, "grammar_matcher_new failed without a message\n");
        abort();
    }
    grammar_matcher_free(m);
    grammar_unref(g);
    return 0;
}
