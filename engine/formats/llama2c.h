/* engine/formats/llama2c.h - import of llama2.c checkpoints (the `run.c` format: a 7-int header, then
 * f32 weights) into a Hugging Face-layout directory that every other path of shardlm loads.
 * Tests: tests/test_model.c (golden stories260K through the converted directory). */
#ifndef SHARDLM_LLAMA2C_H
#define SHARDLM_LLAMA2C_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes out_dir/config.json (LlamaForCausalLM), out_dir/model.safetensors (f32, HF names) and
 * a copy of the SentencePiece model as out_dir/tokenizer.model. llama2.c rotates adjacent
 * pairs (2i, 2i+1); HF Llama rotates halves (i, i + head_dim/2): the q and k projection rows
 * are permuted per head, as Hugging Face's own conversion does, so that the output is an
 * ordinary HF Llama checkpoint. out_dir is created if missing. Errors: unreadable or truncated
 * checkpoint (STATUS_BAD_FORMAT naming what is short), unwritable directory (STATUS_IO). */
enum status llama2c_convert(const char *checkpoint, const char *tokenizer, const char *out_dir);

#ifdef __cplusplus
}
#endif

#endif
