/* engine/serving/spec_corpus.h - drafts from a corpus of the model's own earlier outputs
 * (suffix decoding, Oliaro et al. 2024 / Arctic Inference; docs/speculative.md "Drafts from a
 * corpus"): a suffix array over the corpus's texts; a sequence's last tokens are looked up in it
 * and the continuation most of their occurrences share is proposed, as far as the share of
 * occurrences that agree stays above a threshold.
 *
 * The rule, exactly (tests/test_spec_corpus.c checks it against a scan of every position):
 * let ctx be the sequence's tokens. For n from n_min to min(|ctx|, SPEC_CORPUS_MAX_MATCH), the
 * occurrences of n are the (text, position i) where the text's tokens i .. i + n - 1 equal ctx's
 * last n tokens and the text goes on after them; n* is the largest n with any (a longer match has
 * occurrences only where a shorter one has, so the search stops at the first n without). Then,
 * with S the occurrences of n* and o = n*: among S, the tokens at offset o (the texts that end
 * there count as none); the most frequent, the smallest id on a tie, is drafted when its count
 * over |S| times the shares of the drafts before it is at least p_min; S keeps the occurrences
 * that go on with it, o grows by one, up to max drafts. Drafting stops at the first position
 * that fails. Deterministic: no sampling, so a draft is verified as prompt lookup's are
 * (conductor_speculate.c: one-hot q, the target's distribution kept exactly).
 * Scopes: each text has one (a uint32; 0: every request's). A request of scope s drafts only from
 * the texts of scope 0 or s: the occurrences above are those of such texts alone (the rule is the
 * same on them). The engine gives a learned answer its request's scope (the API key's owner and
 * the adapter, conductor_speculate.c), so that one tenant's answers never speed up another's. */
#ifndef SHARDLM_SPEC_CORPUS_H
#define SHARDLM_SPEC_CORPUS_H

#include <stdint.h>

#include "base.h"

#define SPEC_CORPUS_MAX_MATCH 32 /* the longest context match looked up */
#define SPEC_CORPUS_SPAN      64 /* match + drafts at most: the suffix array orders this many tokens */
#define SPEC_CORPUS_MIN_DEFAULT   3    /* engine_options.spec_corpus_min's 0 */
#define SPEC_CORPUS_P_MIN_DEFAULT 0.5f /* engine_options.spec_corpus_p_min's 0 */
#define SPEC_CORPUS_FIRST_MATCH 24 /* a match this long drafts before prompt lookup (conductor_speculate.c) */
#define SPEC_LEARN_LEAD  4          /* prompt tokens a learned answer keeps before it */
#define SPEC_LEARN_MAX   (1 << 28)  /* engine_options.spec_corpus_learn's bound (ids) */
#define SPEC_KEEP_EVERY_S 60.0      /* a kept corpus is written at most this often while serving */

struct spec_corpus;

/* An index over texts given back to back in ids[0..n): each text ends with a -1, every other id
 * is >= 0 (STATUS_INVALID_ARGUMENT otherwise, and for n < 2 or a last id that is not -1). The
 * ids are copied; text t is of scope text_scope[t] (NULL: all 0). O(n log n) comparisons of at
 * most SPEC_CORPUS_SPAN tokens. */
enum status spec_corpus_new(const int32_t *ids, int64_t n, const uint32_t *text_scope, struct spec_corpus **out);
void spec_corpus_free(struct spec_corpus *c); /* accepts NULL */

/* Adds texts ids[0..n) (as spec_corpus_new's, checked alike) after c's, text t of scope
 * text_scope[t] (NULL: all 0): the index becomes the one
 * spec_corpus_new would make of all of them; O(N + n log n) (N: c's ids). On an error c is
 * unchanged. Not while another thread reads c. */
enum status spec_corpus_append(struct spec_corpus *c, const int32_t *ids, int64_t n, const uint32_t *text_scope);
/* Drops whole texts from the one that starts at id from (0, or just after a -1) on, as few as
 * hold at least n_min ids (those to the end at most); the later texts move down. Returns the ids
 * dropped (0 when from is no text's start or n_min <= 0). O(N). Not while another thread reads c. */
int64_t spec_corpus_forget(struct spec_corpus *c, int64_t from, int64_t n_min);

int64_t spec_corpus_ids(const struct spec_corpus *c);    /* every id, the -1s counted */
int64_t spec_corpus_tokens(const struct spec_corpus *c); /* ids indexed, the -1s not counted */
int64_t spec_corpus_texts(const struct spec_corpus *c);

/* c's ids from position from on (a text's start: 0, or just after a -1) to the end: *n of them at
 * *ids, c's own memory, valid until c changes. */
const int32_t *spec_corpus_id_data(const struct spec_corpus *c, int64_t from, int64_t *n);
/* The scopes of the same ids (each id's text's), c's own memory. */
const uint32_t *spec_corpus_scope_data(const struct spec_corpus *c, int64_t from);

/* A kept corpus (`serve --spec-corpus-keep FILE`, docs/speculative.md "A learned corpus kept
 * across restarts"): texts as spec_corpus_new takes them, in a file of this layout (little-endian):
 *   "SHLMSPC1"  u32 version (2)  i32 vocab  u64 tokenizer fingerprint  u64 n
 *   i32 ids[n]  u32 scope[T] (each of the T texts', in order)  u64 FNV-1a 64 of ids' and scopes' bytes
 * (version 1, written before scopes, has no scope[]: read as every text of scope 0).
 * spec_corpus_file_write writes a temporary of its own beside PATH (mode 0600), syncs it and
 * renames it over PATH. A file that is there but is no such file (another magic: a file of the
 * user's, never overwritten) is refused (STATUS_FAILED_PRECONDITION), as one for another
 * vocabulary or tokenizer; a cut, altered or other-version one is STATUS_BAD_FORMAT.
 * spec_corpus_file_read: *ids (malloc'd) and *n, *text_scope (malloc'd, one per text; NULL for a
 * version 1 file or no text); *ids NULL and *n 0 when PATH is not there or empty.
 * spec_corpus_file_write: scope[i] is id i's text's (per id, as spec_corpus_scope_data; NULL: 0). */
enum status spec_corpus_file_read(const char *path, int32_t vocab, uint64_t fingerprint, int32_t **ids,
                                  uint32_t **text_scope, int64_t *n);
enum status spec_corpus_file_write(const char *path, int32_t vocab, uint64_t fingerprint, const int32_t *ids,
                                   const uint32_t *scope, int64_t n);

/* The drafts for the context ctx[0..n_ctx) of a request of scope `scope` by the rule above
 * (n_min >= 1, p_min in [0, 1]), at most max (<= SPEC_CORPUS_SPAN - SPEC_CORPUS_MAX_MATCH) of
 * them into out; their count, 0 when none. *matched (may be NULL) gets n*, 0 when no match. Reads
 * only: safe from several threads. With scoped texts each step scans the occurrences' range: a
 * match of few tokens in a large corpus costs its occurrences' count. */
int spec_corpus_draft(const struct spec_corpus *c, const int32_t *ctx, int n_ctx, int n_min, float p_min, int max,
                      uint32_t scope, int32_t *out, int *matched);

#endif
