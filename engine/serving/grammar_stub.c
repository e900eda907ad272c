/* engine/serving/grammar_stub.c - a stand-in for the grammar engine (engine/grammar/, issue 28)
 * while it is not merged: every constraint is refused by name (STATUS_UNSUPPORTED), never
 * ignored. Removed when engine/grammar/ lands. */
#include "grammar.h"

#include <stdlib.h>

enum status grammar_vocab_new(const struct tokenizer *t, int model_vocab, const int32_t *end_ids, int n_end,
                              struct grammar_vocab **out)
{
    (void)t, (void)model_vocab, (void)end_ids, (void)n_end;
    *out = NULL;
    return status_errorf(STATUS_UNSUPPORTED, "structured outputs are not built into this server yet (no grammar engine)");
}
void grammar_vocab_free(struct grammar_vocab *v) { (void)v; }
void grammar_ref(struct grammar *g) { (void)g; }
void grammar_unref(struct grammar *g) { (void)g; }
enum status grammar_cache_new(const struct grammar_vocab *v, int capacity, struct grammar_cache **out)
{
    (void)v, (void)capacity;
    *out = NULL;
    return status_errorf(STATUS_UNSUPPORTED, "structured outputs are not built into this server yet (no grammar engine)");
}
void grammar_cache_free(struct grammar_cache *c) { (void)c; }
enum status grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *src, size_t n,
                              struct grammar **out)
{
    (void)c, (void)kind, (void)src, (void)n;
    *out = NULL;
    return status_errorf(STATUS_UNSUPPORTED, "structured outputs are not built into this server yet (no grammar engine)");
}
enum status grammar_matcher_new(struct grammar *g, struct grammar_matcher **out)
{
    (void)g;
    *out = NULL;
    return STATUS_UNSUPPORTED;
}
void grammar_matcher_free(struct grammar_matcher *m) { (void)m; }
void grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask) { (void)m, (void)mask; }
enum status grammar_matcher_accept(struct grammar_matcher *m, int32_t token)
{
    (void)m, (void)token;
    return STATUS_UNSUPPORTED;
}
int grammar_matcher_can_end(const struct grammar_matcher *m) { (void)m; return 1; }
int grammar_matcher_is_done(const struct grammar_matcher *m) { (void)m; return 0; }
