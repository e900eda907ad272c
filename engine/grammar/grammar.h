/* engine/grammar/grammar.h - constrained decoding: a grammar (JSON Schema, JSON object, regular
 * expression, GBNF, choice list) compiled to a byte-level pushdown automaton over a tokenizer's
 * vocabulary, and per-sequence matchers that give the token mask of each decode step.
 * Not here: applying the mask in the sampler (engine/serving), request parsing (server/).
 * Design, supported subset and figures: docs/grammar.md. Tests: tests/test_grammar.c,
 * tests/test_grammar.py, tests/fuzz/fuzz_grammar.c; benchmark tests/bench_grammar.c.
 *
 * Threads: a grammar_vocab is immutable once made and may be shared by every thread. A compiled
 * grammar is logically immutable and refcounted: matchers on many threads may share it (its
 * lazily filled mask cache is guarded by its own mutex). A grammar_cache may be used from many
 * threads at once. A grammar_matcher belongs to one sequence and is used by one thread at a
 * time.
 *
 * End tokens: the end_ids given to grammar_vocab_new (EOS, end-of-turn) are allowed by a mask
 * only where the input so far is complete (grammar_matcher_can_end); accepting one ends the
 * matcher (grammar_matcher_is_done then answers 1, and later masks allow nothing). Every other
 * control/special token, and the padding rows beyond the tokenizer's size, are never allowed. */
#ifndef SHARDLM_GRAMMAR_H
#define SHARDLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

struct tokenizer;
struct grammar_vocab;   /* per tokenizer: every id's bytes, sorted for trie walks; immutable */
struct grammar;         /* a compiled grammar for one vocab; refcounted, shareable */
struct grammar_matcher; /* per sequence state */
struct grammar_cache;   /* compiled grammars by (kind, source), LRU bounded, thread-safe */

/* Values only ever appended (they may reach the wire). */
enum grammar_kind {
    GRAMMAR_JSON_SCHEMA, /* a JSON Schema text (docs/grammar.md: the subset) */
    GRAMMAR_JSON_OBJECT, /* any JSON object; src is ignored */
    GRAMMAR_REGEX,       /* the whole output matches (ECMAScript/Python subset) */
    GRAMMAR_EBNF,        /* GBNF as llama.cpp writes it, start rule `root` */
    GRAMMAR_CHOICE,      /* a JSON array of strings: the output is one of them, verbatim */
};

/* Builds the vocabulary view of t for a model of model_vocab rows (>= the tokenizer's size; the
 * extra rows are never allowed). end_ids[0..n_end) (copied) are the ids that end a sequence.
 * t is borrowed for the call only. Errors: STATUS_INVALID_ARGUMENT (sizes, an end id out of
 * range), STATUS_RESOURCE_EXHAUSTED. */
enum status grammar_vocab_new(const struct tokenizer *t, int model_vocab, const int32_t *end_ids, int n_end,
                              struct grammar_vocab **out);
/* The same from the bytes of each token: tokens[i][0..lens[i]) for i < n_tok (copied; a token
 * of 0 bytes is never allowed). For tests, tools and tokenizers built elsewhere. */
enum status grammar_vocab_new_bytes(const char *const *tokens, const int *lens, int n_tok, int model_vocab,
                                    const int32_t *end_ids, int n_end, struct grammar_vocab **out);
/* The bytes token id contributes (*len of them; NULL and 0 when none), valid while v lives. */
const char *grammar_vocab_token(const struct grammar_vocab *v, int32_t id, int *len);
/* Accepts NULL. No grammar made from v may still be alive. */
void grammar_vocab_free(struct grammar_vocab *v);
/* Words of a mask: (model_vocab + 31) / 32. */
int grammar_vocab_mask_words(const struct grammar_vocab *v);

/* A JSON Schema's root may hold this keyword: a string of 1 to 64 bytes that the output writes
 * before the JSON value (a tool call's opening marker, server/http_tools.c), after at most 8
 * bytes of whitespace (space, tab, CR, LF); or a list of 1 to 8 strings of 0 to 64 bytes, one
 * of which the output writes there (harmony's answer: server/generation.c). So may each branch of a root that is only
 * {"anyOf": [...]} (1 to 128 bytes, then in every branch): the output is one branch's text then
 * a value of that branch (harmony's call header after the function's name). Anywhere else it is
 * an unsupported keyword. */
#define GRAMMAR_SCHEMA_PREFIX "x-shardlm-prefix"
/* And this one: {"close": C, "open": O} (strings of 1 to 64 bytes) makes the output one or more
 * values: V, then optionally C, then any number of O V C (a tool format's parallel calls:
 * `{...}\n</tool_call>\n<tool_call>\n{...}\n</tool_call>`); the output may end after V or
 * after any C. With "end": E as well, every value is closed and the list ended: V C (O V C)* E
 * (DeepSeek's `...<｜tool▁call▁end｜><｜tool▁calls▁end｜>`); {"close": C, "end": E} is V C E. */
#define GRAMMAR_SCHEMA_REPEAT "x-shardlm-repeat"
/* And this one: a string of 1 to 16 printable ASCII characters (space too; not '"' or '\\') that free
 * strings and free object keys write only as \u00XX escapes, never as themselves (harmony's call
 * arguments escape '<': a marker such as <|call|>, a token whose text the grammar would otherwise
 * read as seven characters of a string, then cannot stand inside one, where the reply's parser
 * would end the message). Strings from enum, const and pattern keep their own text, and so do the
 * declared property names (a free key is refused the raw characters too). */
#define GRAMMAR_SCHEMA_ESCAPE "x-shardlm-escape"

/* Compiles src[0..n) (borrowed) into *out (one reference; v is borrowed and must outlive it).
 * Errors: STATUS_INVALID_ARGUMENT with a message naming the problem (the schema path such as
 * "/properties/age/minimum", the grammar line, the regex offset, an unsupported keyword),
 * including grammars that accept no string and left recursion; STATUS_RESOURCE_EXHAUSTED for
 * a grammar over the size limits (docs/grammar.md) or out of memory. Work and memory are
 * bounded by those limits whatever the input. */
enum status grammar_compile(const struct grammar_vocab *v, enum grammar_kind kind, const char *src, size_t n,
                            struct grammar **out);
/* grammar_compile's first half: src parsed, checked and flattened into *out, without the first
 * step's mask over v (no vocabulary work, so no refusal of a grammar too ambiguous to follow
 * from its start: its first mask is computed when a matcher needs it, within the same work
 * bounds). Errors as grammar_compile's, but that one. For the compilers' fuzz target
 * (tests/fuzz/fuzz_grammar_compile.c), which would otherwise spend its time in that mask. */
enum status grammar_parse(const struct grammar_vocab *v, enum grammar_kind kind, const char *src, size_t n,
                          struct grammar **out);
/* The vocabulary g was compiled for (borrowed). */
const struct grammar_vocab *grammar_vocab_of(const struct grammar *g);
/* Reference counting (atomic); the last unref frees. Both accept NULL. */
void grammar_ref(struct grammar *g);
void grammar_unref(struct grammar *g);

/* A cache of at most capacity compiled grammars over v (borrowed, must outlive the cache). */
enum status grammar_cache_new(const struct grammar_vocab *v, int capacity, struct grammar_cache **out);
/* Drops the cache's references (grammars still referenced elsewhere live on). Accepts NULL. */
void grammar_cache_free(struct grammar_cache *c);
/* *out: a new reference to the grammar of (kind, src[0..n)), compiled on a miss (outside the
 * cache's lock). Errors as grammar_compile (failures are not cached). */
enum status grammar_cache_get(struct grammar_cache *c, enum grammar_kind kind, const char *src, size_t n,
                              struct grammar **out);

/* A matcher at the start of g; takes a reference to g, dropped by grammar_matcher_free.
 * Errors: STATUS_RESOURCE_EXHAUSTED. */
enum status grammar_matcher_new(struct grammar *g, struct grammar_matcher **out);
/* Accepts NULL. */
void grammar_matcher_free(struct grammar_matcher *m);
/* Writes the allowed tokens of the next step: mask[0..grammar_vocab_mask_words) words, bit i
 * (word i/32, bit i%32) set iff token i is allowed. Does not change the matcher's state (it may
 * fill g's shared mask entries, under g's lock). All zero after an end token was accepted; only
 * the end ids when is_done (complete, nothing more may follow): with no end ids, stop there.
 * The work of one call is bounded (docs/grammar.md, Limits): a grammar whose parses multiply
 * past it (counted repeats of overlapping alternatives) gives STATUS_INVALID_ARGUMENT with a
 * message, and an all-zero mask, instead of holding the thread for minutes. */
enum status grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask);
/* Advances by one token. A token the mask forbids gives STATUS_INVALID_ARGUMENT and leaves the
 * state unchanged; so does any token after an end token was accepted. */
enum status grammar_matcher_accept(struct grammar_matcher *m, int32_t token);
/* Advances by the bytes s[0..n) (forced text); counts as one step for rollback. Bytes that
 * cannot continue the grammar give STATUS_INVALID_ARGUMENT, state unchanged. */
enum status grammar_matcher_accept_bytes(struct grammar_matcher *m, const char *s, size_t n);
/* 1 when the last new / accept / accept_bytes / fill_mask failed because the grammar is too
 * ambiguous to follow (a byte's closure past its bound, or the stack nodes': the error says so)
 * rather than because the input does not continue it. */
int grammar_matcher_overflowed(const struct grammar_matcher *m);
/* Undoes the last n steps (accepted tokens or byte strings); n larger than the history goes
 * back to the start. */
void grammar_matcher_rollback(struct grammar_matcher *m, int n_tokens);
/* 1 when the input so far is a complete sentence of the grammar (an end token is allowed). */
int grammar_matcher_can_end(const struct grammar_matcher *m);
/* 1 when complete and nothing more may follow, or an end token was accepted: stop the sequence. */
int grammar_matcher_is_done(const struct grammar_matcher *m);

#endif
