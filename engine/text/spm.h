/* engine/text/spm.h - SentencePiece's BPE model (model_type BPE: Llama 2, llama2.c's stories,
 * Gemma, every GGUF `llama` vocabulary) read from its serialized ModelProto and run without
 * libsentencepiece, in a compact form: the pieces in one arena, open-addressing tables of ids.
 * libsentencepiece keeps the parsed proto (a message and a std::string per piece) and its own
 * hash maps: about 45 MB for Gemma's 262,144 pieces, against about 7 MB here.
 *
 * What it reproduces, from SentencePiece 0.1.97's sources (normalizer.cc, bpe_model.cc,
 * model_interface.cc, sentencepiece_processor.cc): the normalizer without a character map
 * (malformed UTF-8 to U+FFFD, user-defined symbols passed through, add_dummy_prefix,
 * remove_extra_whitespaces, escape_whitespaces, treat_whitespace_as_suffix); the BPE merges by
 * the merged piece's score, ties to the leftmost, user-defined symbols frozen, unused pieces split
 * back into the pair that made them; byte fallback and runs of unknown characters as one unk id;
 * decoding with the first piece's dummy-prefix space dropped, byte runs as UTF-8 (U+FFFD per
 * malformed byte), control pieces invisible, the unknown piece as unk_surface.
 * What it does not take (spm_load answers STATUS_UNSUPPORTED and tokenizer.cc keeps
 * libsentencepiece for it): the Unigram, word and char models, a precompiled character map or
 * normalization rules, a denormalizer, self-test samples (SentencePiece checks them at load), and
 * protos SentencePiece would refuse (malformed wire format, duplicate or empty pieces, no unknown
 * piece, byte pieces without byte_fallback or not all 256 of them), so that SentencePiece's own
 * message names the fault.
 * Internal to engine/text (tokenizer.cc). Tests: tests/test_spm.py (ids and text against
 * libsentencepiece and the sentencepiece package over the assets' tokenizers, GGUF vocabularies and
 * trained models, random and malformed text), tests/fuzz/fuzz_spm.c (differential against
 * libsentencepiece), and every tokenizer test through tokenizer.h.
 * Threads: after spm_load a struct spm is immutable; encode and decode may run on many threads. */
#ifndef SHARDLM_SPM_H
#define SHARDLM_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SentencePiece's piece types (sentencepiece_model.proto). */
enum spm_type { SPM_NORMAL = 1, SPM_UNKNOWN = 2, SPM_CONTROL = 3, SPM_USER_DEFINED = 4, SPM_UNUSED = 5, SPM_BYTE = 6 };

struct spm;

/* The model of the serialized ModelProto proto[0..n) into *out. STATUS_UNSUPPORTED (no message
 * is logged) for what the header says it does not take; STATUS_RESOURCE_EXHAUSTED when out of
 * memory. */
enum status spm_load(const void *proto, size_t n, struct spm **out);
void spm_free(struct spm *m); /* accepts NULL */

int32_t spm_size(const struct spm *m);
/* Piece id's text, NUL-terminated, its length in *len (may be NULL); id in [0, spm_size). */
const char *spm_piece(const struct spm *m, int32_t id, size_t *len);
enum spm_type spm_piece_type(const struct spm *m, int32_t id);
/* SentencePiece's PieceToId: a control, unknown or byte piece first, then the others, else the
 * unknown id. */
int32_t spm_piece_to_id(const struct spm *m, const char *s, size_t n);
/* SentencePiece's bos_id() and kin: the id of the trainer spec's bos_piece when it is a control
 * piece (unk: an unknown one), else -1. */
void spm_special_ids(const struct spm *m, int32_t *unk, int32_t *bos, int32_t *eos, int32_t *pad);

/* Appends the ids of text[0..len) (SentencePieceProcessor::Encode) to *ids (growing *cap with
 * base_grow). STATUS_INTERNAL where SentencePiece fails too (a merged piece that is also a
 * control piece); STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status spm_encode(const struct spm *m, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap);
/* The text of ids[0..n) (SentencePieceProcessor::Decode; ids already checked in range), appended
 * to *out (growing *cap with base_grow; not NUL-terminated). */
enum status spm_decode(const struct spm *m, const int32_t *ids, size_t n, char **out, size_t *len, size_t *cap);

#ifdef __cplusplus
}
#endif

#endif
