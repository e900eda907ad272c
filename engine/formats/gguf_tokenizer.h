/* engine/formats/gguf_tokenizer.h - the tokenizer of a GGUF file (tokenizer.ggml.* metadata) as a
 * serialized SentencePiece ModelProto (`llama` vocabularies) or a tokenizer.json text (`gpt2`
 * vocabularies, byte-level BPE): what tokenizer_load_from_memory loads.
 * Not here: the GGUF reader (gguf.h), the tokenizer itself (engine/text/tokenizer.h).
 * Tests: tests/test_gguf.c. */
#ifndef SHARDLM_GGUF_TOKENIZER_H
#define SHARDLM_GGUF_TOKENIZER_H

#include <stddef.h>

#include "base.h"
#include "gguf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Builds a serialized SentencePiece ModelProto from tokenizer.ggml.* when tokenizer.ggml.model
 * is "llama" (SentencePiece vocabularies: Llama, Gemma, Mistral...): pieces with scores and
 * types (GGUF token types have SentencePiece's numbering; UNDEFINED becomes NORMAL and the
 * tokenizer.ggml.unknown_token_id piece UNKNOWN), model type BPE (llama.cpp's SPM tokenizer
 * merges by score, which is SentencePiece BPE), byte_fallback when there are BYTE pieces,
 * unk/bos/eos/pad ids from the metadata (-1 when absent), and an identity normalizer that
 * only escapes spaces to U+2581 and adds a dummy prefix when tokenizer.ggml.add_space_prefix
 * says so (default true, as llama.cpp). Load the result with tokenizer_load_from_memory.
 * When tokenizer.ggml.model is "gpt2", writes instead the text of a Hugging Face tokenizer.json:
 * model BPE with the tokens as vocab and tokenizer.ggml.merges, CONTROL pieces as special added
 * tokens and USER_DEFINED ones as plain added tokens, a Sequence of Split pre-tokenizers with
 * the regexes llama.cpp uses for tokenizer.ggml.pre (llama-bpe, qwen2, smollm, gpt-2,
 * deepseek-v3, default and their aliases; ignore_merges for Llama 3) then ByteLevel, a
 * ByteLevel decoder, and a "shardlm" object with the metadata's bos/eos/pad/unk ids and
 * add_bos_token (default false, as llama.cpp). Another pre is STATUS_UNSUPPORTED naming it.
 * On success *data is malloc'd (free with free()) and *n its size. Errors: STATUS_NOT_FOUND
 * (no tokenizer keys), STATUS_UNSUPPORTED naming another tokenizer.ggml.model,
 * STATUS_BAD_FORMAT (arrays of mismatched lengths or types, ids out of range). */
enum status gguf_tokenizer_model_proto(const struct gguf *g, void **data, size_t *n);

#ifdef __cplusplus
}
#endif

#endif
