/* engine/text/tokenizer_json.h - internal to tokenizer_json.c and tokenizer_json_steps.c: the
 * parsers of a tokenizer.json's normalizer, decoder and the pre-tokenizers of the non-byte-level
 * kinds (bpe.h), with the helpers they share. Every error names the file and the field.
 * Tests: tests/test_tokenizer_kinds.py, tests/test_bpe.py (malformed files). */
#ifndef SHARDLM_TOKENIZER_JSON_H
#define SHARDLM_TOKENIZER_JSON_H

#include <cjson/cJSON.h>

#include "bpe.h"

const char *tjson_type(const cJSON *o);
enum status tjson_bad(const struct bpe *b, const char *field, const char *what);
enum status tjson_bool(const struct bpe *b, const cJSON *o, const char *key, const char *field, int def, int *v);
enum status tjson_add_split(struct bpe *b, const char *pattern, int literal, enum bpe_split_behavior behavior, int invert);

/* The special tokens of a tokenizer_config.json object cfg (NULL: none): eos_token, pad_token,
 * unk_token, and bos_token with add_bos_token, each a string or {"content": ...} naming a piece. */
enum status tjson_config(struct bpe *b, const cJSON *cfg);

/* Appends the steps of "normalizer" n (null, one step or a Sequence) to b->norms. */
enum status tjson_normalizer(struct bpe *b, const cJSON *n, int depth);
/* Appends the steps of "decoder" d to b->decs; *byte_level is set when a ByteLevel step is met
 * (which only byte-level BPE takes). */
enum status tjson_decoder(struct bpe *b, const cJSON *d, int depth, int *byte_level);
/* The pre-tokenizers of the other kinds (BertPreTokenizer, Whitespace, WhitespaceSplit,
 * Punctuation, Metaspace) as Split steps and b->metaspace; 0 in *handled for another type. */
enum status tjson_pre_other(struct bpe *b, const cJSON *p, const char *type, const char *field, int *handled);

#endif
