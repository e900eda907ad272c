/* engine/text/tokenizer.h - text <-> token ids, and incremental detokenization for streaming, for
 * two kinds of tokenizer: a SentencePiece model (.model file or its serialized ModelProto) and a
 * Hugging Face tokenizer.json or tiktoken rank file (byte-level BPE, WordPiece, Unigram, character BPE with byte fallback;
 * or a GGUF gpt2 / bert vocabulary, which engine/formats/gguf_tokenizer.c turns into one; bpe.h,
 * docs/tokenizers.md). For the tokenizer.json kinds add_bos means Hugging Face's
 * add_special_tokens: WordPiece, Unigram and character BPE also append the template's tokens after
 * the text (BERT's [SEP]).
 * SentencePiece (C++) lives behind this header only: tokenizer.cc is the one C++ file of the
 * project and no exception crosses into C (every failure is an enum status with a message).
 * Not here: chat templates, stop sequences (the server), sampling (sampler.c).
 * Tests: tests/test_tokenizer.c (SentencePiece), tests/test_bpe.py (byte-level BPE against
 * Hugging Face tokenizers), tests/test_tiktoken.py (rank files against tiktoken),
 * tests/test_sp_chat.py (SentencePiece with its own chat template).
 *
 * Threads: a loaded tokenizer is immutable. Every function taking `const struct tokenizer *`
 * may be called from many threads at once on the same tokenizer (SentencePiece's Encode and
 * Decode are const and keep no shared mutable state). A struct detokenizer belongs to one
 * request and is used by one thread at a time. */
#ifndef SHARDLM_TOKENIZER_H
#define SHARDLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct tokenizer; /* opaque */

/* Loads a SentencePiece .model file, or a tokenizer.json (a path ending in .json, or a file
 * opening with '{'; a tokenizer_config.json in the same directory supplies its special tokens). On success *out owns the tokenizer (free it with
 * tokenizer_free). Errors, with a message naming the path: STATUS_NOT_FOUND (no such file),
 * STATUS_IO (cannot open or read it), STATUS_BAD_FORMAT (not a usable SentencePiece model),
 * STATUS_RESOURCE_EXHAUSTED. *out is left NULL on error. */
enum status tokenizer_load(const char *path, struct tokenizer **out);

/* Loads a tiktoken rank file ("BASE64 RANK" lines: OpenAI's *.tiktoken, Llama 3's original
 * tokenizer.model; tokenizer_load recognises one by its first line). pattern is the pre-tokenizer:
 * an encoding's name ("r50k", "cl100k", "o200k", "llama3") or a PCRE2 regex; NULL takes the
 * "pat_str" of a tokenizer_config.json beside the file, else the encoding the number of ranks
 * identifies (STATUS_UNSUPPORTED when none does). Special tokens: that config's
 * added_tokens_decoder, else the identified encoding's own (docs/tokenizers.md). Errors as
 * tokenizer_load, naming the line. */
enum status tokenizer_load_tiktoken(const char *path, const char *pattern, struct tokenizer **out);
/* The same from a rank file's bytes data[0..n) (borrowed for the call), without a config. */
enum status tokenizer_load_tiktoken_from_memory(const void *data, size_t n, const char *pattern, struct tokenizer **out);

/* Loads the tokenizer of a model for a model of model_vocab rows: the serialized ModelProto
 * proto[0..proto_n) when proto is not NULL (a GGUF file's, built from its metadata: a ModelProto
 * or a tokenizer.json text), otherwise MODEL/tokenizer.model of a model directory, or
 * MODEL/tokenizer.json when there is no tokenizer.model. One with more pieces than model_vocab is refused
 * (STATUS_BAD_FORMAT, naming both sizes), since the model has no row for its last ids; fewer is
 * fine (vocabularies padded for tensor parallelism). The one check `serve`, `generate` and
 * `train` share, made at load. */
enum status tokenizer_load_for_model(const char *model, const void *proto, size_t proto_n, int model_vocab,
                                     struct tokenizer **out);

/* Same from a serialized ModelProto or a tokenizer.json text (data[0..n) opening with '{'). The
 * bytes are copied: data is borrowed for the duration of the call only. */
enum status tokenizer_load_from_memory(const void *data, size_t n, struct tokenizer **out);

/* Accepts NULL. No detokenizer may still use t. */
void tokenizer_free(struct tokenizer *t);

/* Number of pieces; ids are 0 .. vocab_size-1. */
int tokenizer_vocab_size(const struct tokenizer *t);
/* Which implementation runs t, for logs and tests: "sentencepiece-bpe" (engine/text/spm.c),
 * "libsentencepiece" (SentencePiece's own processor: Unigram models, character maps,
 * SHARDLM_SENTENCEPIECE=lib) or "tokenizer.json" (bpe.h's kinds, tiktoken). */
const char *tokenizer_kind(const struct tokenizer *t);
/* 1 when tokenizer_encode turns the strings of special tokens in a text into their ids (byte-level
 * BPE and the other tokenizer.json kinds: added tokens are matched first; SentencePiece: its
 * control and unknown pieces, "<s>", "<start_of_turn>"..., as Hugging Face's tokenizers do), so
 * that a rendered chat template can be encoded whole; 0 for a SentencePiece model without any. */
int tokenizer_encodes_special(const struct tokenizer *t);
/* Special ids, -1 when the model has none. A byte-level BPE has a BOS id only when it puts one
 * first (a TemplateProcessing post-processor, add_bos_token), since callers push it whenever it
 * is not -1. */
int tokenizer_bos_id(const struct tokenizer *t);
int tokenizer_eos_id(const struct tokenizer *t);
int tokenizer_pad_id(const struct tokenizer *t);
int tokenizer_unk_id(const struct tokenizer *t);

/* Encodes text[0..len) (arbitrary bytes: NULs count, invalid UTF-8 is encoded as U+FFFD by
 * SentencePiece's normalizer; a SentencePiece control piece's string becomes its id, leftmost then
 * longest, and each text between them is encoded on its own, dummy prefix included, as
 * Hugging Face's legacy Llama tokenizer does) into *ids[0..*n_ids), preceded by the BOS id when add_bos is
 * non-zero (STATUS_INVALID_ARGUMENT if a SentencePiece model has no BOS; a byte-level BPE
 * without one adds nothing, as Hugging Face's add_special_tokens). Byte-level BPE: special added
 * tokens' strings in the text become their ids; bytes without a piece are dropped. With add_bos
 * the tokenizer.json kinds also append the post-processor's tokens after the text (BERT's [SEP],
 * an EOS template's EOS). On success
 * *ids is a malloc'd array (never NULL, even when *n_ids == 0) that the caller frees with
 * free(); on error *ids is NULL and *n_ids is 0. text may be NULL when len is 0. */
enum status tokenizer_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                             int32_t **ids, int *n_ids);

/* A lower bound on the number of ids tokenizer_encode gives for any text that holds the n
 * texts texts[i][0..lens[i]) without overlap (a prompt, or the messages a chat template puts
 * into its text, whether it encodes them whole or in segments), BOS not counted. O(bytes), no
 * encoding: for a check that must not pay for encoding a huge text first. Each id covers at
 * most the bytes of the longest piece, and ASCII whitespace, which the normalizer may fold,
 * is not counted. 0 when the model allows no such bound: without byte fallback a run of unknown
 * characters becomes one <unk> id, and a normalization rule set (nmt_nfkc) may drop characters.
 * Tests: tests/test_tokenizer.c (the bound never exceeds the true count). */
size_t tokenizer_min_tokens(const struct tokenizer *t, const char *const *texts, const size_t *lens, int n);

/* Byte-level BPE: decodes as Hugging Face's ByteLevel decoder with skip_special_tokens (special
 * ids vanish (tokenizer_decode_opts below can show them), added tokens give their content, every
 * maximal invalid UTF-8 subpart of the bytes becomes U+FFFD). SentencePiece: decodes ids[0..n) exactly as SentencePiece does: control pieces (BOS, EOS, ...) vanish, U+2581
 * becomes ' ', the leading space of the first piece is dropped (add_dummy_prefix), runs of
 * byte pieces become their bytes with every invalid byte replaced by U+FFFD, so the result is
 * always valid UTF-8. On success *text is a malloc'd, NUL-terminated string of *len bytes
 * that the caller frees with free(). An id outside [0, vocab_size) gives
 * STATUS_INVALID_ARGUMENT naming the id and its position; *text is then NULL. */
enum status tokenizer_decode(const struct tokenizer *t, const int32_t *ids, int n, char **text,
                             size_t *len);
/* tokenizer_decode when show_special is 0. Otherwise as Hugging Face's decode with
 * skip_special_tokens=False of the model's tokenizer.json: byte-level BPE writes a special id's
 * content as it writes an added token's (ending the byte run before it, whose incomplete
 * character becomes U+FFFD); the other tokenizer.json kinds pass its content through the
 * decoders like any piece; SentencePiece writes the piece of a control or unknown id ("<s>",
 * "</s>", "<unk>": what LlamaConverter's tokenizer.json marks special) where it stands, the text
 * between two such ids decoded as SentencePiece decodes it (an incomplete character before one
 * becomes U+FFFD) and the leading space of the text's first piece dropped only when no shown id
 * comes before it (Hugging Face's Strip decoder strips the start of the whole text).
 * docs/tokenizers.md; tests: tests/test_bpe.py, tests/test_tokenizer_kinds.py. */
enum status tokenizer_decode_opts(const struct tokenizer *t, const int32_t *ids, int n, int show_special,
                                  char **text, size_t *len);

/* The piece of an id as stored in the model (with U+2581 for spaces, "<0xE2>" for byte
 * pieces, "<s>" for BOS...), NUL-terminated; NULL if id is out of range. The pointer stays
 * valid until tokenizer_free. */
const char *tokenizer_id_to_piece(const struct tokenizer *t, int32_t id);
/* The id of a piece, or -1 when the piece is not in the vocabulary (SentencePiece itself would
 * answer the unk id; callers that want that use tokenizer_unk_id). */
int32_t tokenizer_piece_to_id(const struct tokenizer *t, const char *piece);
/* 1 if id is a byte-fallback piece ("<0x00>".."<0xFF>"; never for byte-level BPE), resp. a
 * control piece (BOS, EOS, PAD..., a special added token); 0 otherwise, and for out-of-range ids. */
int tokenizer_is_byte(const struct tokenizer *t, int32_t id);
int tokenizer_is_control(const struct tokenizer *t, int32_t id);

/* The exact bytes token id contributes in the middle of a sequence (engine/text/token_bytes.c):
 * SentencePiece pieces with U+2581 as ' ', byte pieces as their byte, byte-level BPE pieces
 * through the GPT-2 byte map, added (not special) tokens as their content. Control and special
 * tokens, the unk id and out-of-range ids contribute none (0). Writes buf[0..cap) and returns
 * the count, or -1 when cap is too small. For constrained decoding (engine/grammar/). */
int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char *buf, int cap);

/* Incremental detokenization for streaming, one per request. Push the ids of a sequence one by
 * one (the prompt's BOS may be pushed or not: control ids print nothing unless
 * detokenizer_show_special asked for them); each push returns the
 * text that became final, always complete UTF-8: bytes of a character split over byte pieces
 * are held back until the character is complete. The concatenation of everything returned
 * by the pushes and a final detokenizer_flush equals tokenizer_decode of all the pushed ids,
 * byte for byte (for every sequence, valid UTF-8 or not: an incomplete character that is
 * interrupted, or left at the end, becomes U+FFFD in both), with one exception: a model with
 * a denormalizer rule set (none of the Llama-family models has one), whose rules apply to the
 * whole text.
 *
 * Byte-level BPE: the pushed piece's bytes, less an incomplete trailing character (held in
 * `held`, at most 3 bytes), with no exception. Cost per push for SentencePiece: one SentencePiece decode of the ids not yet turned into text, normally only
 * the pushed id (a few more while a character is incomplete), so a request of n tokens costs
 * O(n), not O(n^2). The fields are private: use the functions. */
struct detokenizer {
    const struct tokenizer *tok; /* borrowed; must outlive the detokenizer */
    int32_t *pending;            /* (cap_pending) ids whose text is not final yet */
    int      n_pending;
    size_t   cap_pending;
    char    *out;                /* (cap_out) text returned by the last push/flush */
    size_t   cap_out;
    int      started;            /* some non-empty text has been returned */
    uint8_t  held[4];            /* byte-level BPE: the bytes of an incomplete character */
    int      n_held;
    int      show_special;       /* special ids print their text (tokenizer_decode_opts) */
};

/* Prepares d for a new sequence; allocates nothing. t is borrowed. */
void detokenizer_init(struct detokenizer *d, const struct tokenizer *t);
/* Makes d print special ids as tokenizer_decode_opts with show_special does (show != 0) or not
 * (the default after detokenizer_init); call it before the first push. The concatenation of
 * the pushes and the flush then equals tokenizer_decode_opts of the pushed ids with the same
 * show_special, byte for byte. */
void detokenizer_show_special(struct detokenizer *d, int show);
/* Releases d's buffers (accepts NULL); d may be initialised again afterwards. Keeps the tokenizer
 * and the show_special choice. */
void detokenizer_free(struct detokenizer *d);
/* Feeds one id. On success *text (NUL-terminated, *len bytes, possibly "") is the newly final
 * text; it is owned by d and valid until the next push, flush or free on d. An id outside the
 * vocabulary gives STATUS_INVALID_ARGUMENT and leaves d unchanged. */
enum status detokenizer_push(struct detokenizer *d, int32_t id, const char **text, size_t *len);
/* Returns whatever is held back (an incomplete trailing character as U+FFFD per byte, as
 * tokenizer_decode writes it). d may take further pushes afterwards, which continue the same
 * text (no new leading-space stripping), except that a character left incomplete at the flush
 * stays U+FFFD even if later byte pieces would have completed it. Same ownership as push. */
enum status detokenizer_flush(struct detokenizer *d, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
