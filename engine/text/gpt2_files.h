/* engine/text/gpt2_files.h - vocab.json + merges.txt (GPT-2's tokenizer files) read as the
 * tokenizer.json text of the same byte-level BPE (gpt2_files.c). */
#ifndef SHARDLM_GPT2_FILES_H
#define SHARDLM_GPT2_FILES_H

#include <stddef.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether path names a vocab.json (its last component). */
int gpt2_files_is_vocab(const char *path);

/* *json (malloc'd, NUL-terminated; the caller frees it) = the tokenizer.json of the BPE whose
 * vocabulary is vocab[0..vocab_n) (the bytes of vocab_path) and whose merges are the
 * merges.txt beside vocab_path: GPT-2's byte-level pre-tokenizer and decoder. Errors naming
 * the file (and line): STATUS_NOT_FOUND without merges.txt, STATUS_BAD_FORMAT for a vocabulary
 * that is not an object of non-negative integer ids or a merge line that is not two pieces,
 * STATUS_IO, STATUS_RESOURCE_EXHAUSTED. Merges naming unknown pieces are the BPE loader's to
 * refuse. */
enum status gpt2_files_json(const char *vocab, size_t vocab_n, const char *vocab_path, char **json);

#ifdef __cplusplus
}
#endif

#endif
