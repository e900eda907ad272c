/* engine/serving/grammar.h - the grammar engine's interface (engine/grammar/grammar.h, issue 28), with
 * grammar_stub.c behind it until the engine is merged. */
#ifndef SHARDLM_GRAMMAR_H
#define SHARDLM_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>
#include "base.h"
struct tokenizer;
struct grammar_vocab; struct grammar; struct grammar_matcher; struct grammar_cache;
enum grammar_kind { GRAMMAR_JSON_SCHEMA, GRAMMAR_JSON_OBJECT, GRAMMAR_REGEX, GRAMMAR_EBNF, GRAMMAR_CHOICE };
enum status grammar_vocab_new(const struct tokenizer *t, int model_vocab, const int32_t *end_ids, int n_end, struct grammar_vocab **out);
void grammar_vocab_free(struct grammar_vocab *v);
void grammar_ref(struct grammar *g); void grammar_unref(struct grammar *g);
enum status grammar_cache_new(const struct grammar_vocab *v, int capacity, struct grammar_cache **out); void grammar_cache_free(struct grammar_cache *c);
enum status grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *src, size_t n, struct grammar **out);
enum status grammar_matcher_new(struct grammar *g, struct grammar_matcher **out); void grammar_matcher_free(struct grammar_matcher *m);
void grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask);
enum status grammar_matcher_accept(struct grammar_matcher *m, int32_t token);
int grammar_matcher_can_end(const struct grammar_matcher *m);
int grammar_matcher_is_done(const struct grammar_matcher *m);
#endif
