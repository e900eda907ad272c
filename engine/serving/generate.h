/* engine/serving/generate.h - generation of one sequence on one rank: chunked prefill of the prompt,
 * then decode step by step through the paged KV cache, sampling each token. It is what
 * `shardlm generate` runs and what golden tests drive; the continuously batched engine
 * (scheduler) serves many sequences at once with the same model_forward. Under mpirun every
 * rank calls it with the same arguments; the last stage samples and shares each token.
 * Tests: tests/test_model.c. */
#ifndef SHARDLM_GENERATE_H
#define SHARDLM_GENERATE_H

#include "kv_cache.h"
#include "model.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

struct generate_options {
    int max_tokens;                  /* tokens to generate (>= 0) */
    int prefill_chunk;               /* prompt rows per forward (<= the model's workspace) */
    int ignore_eos;                  /* keep going past EOS */
    int eos_id;                      /* -1: none */
    struct sampling_params sampling;
};

struct generate_stats {
    int    n_prompt, n_generated;
    double prefill_seconds, decode_seconds;
};

/* Called with each generated token; returning non-zero stops generation (not an error). */
typedef int (*generate_token_fn)(void *ctx, int32_t token);

/* Generates up to o->max_tokens tokens after prompt (n_prompt >= 1) into out (capacity
 * o->max_tokens), *n_out set to how many. Takes blocks from cache as the sequence grows and
 * returns them all before returning. Errors: the prompt plus max_tokens beyond the model's
 * context or the cache (STATUS_INVALID_ARGUMENT / STATUS_RESOURCE_EXHAUSTED, nothing run). */
enum status generate_run(struct model *m, struct kv_cache *cache, const int32_t *prompt,
                         int n_prompt, const struct generate_options *o, generate_token_fn on_token,
                         void *ctx, int32_t *out, int *n_out, struct generate_stats *stats);

struct tokenizer;
/* The tokenizer of the model m loaded from model_path: a GGUF file's, built from its metadata
 * (checkpoint.tokenizer_proto), or model_path/tokenizer.model for a directory; one with more
 * pieces than the model has rows is refused (tokenizer_load_for_model). What `generate` and
 * the conductor (serve) both load. *out owned by the caller (tokenizer_free). A GGUF's
 * tokenizer bytes are released once the tokenizer is built from them (checkpoint.h
 * tokenizer_digest stays): call it once per model. */
enum status generate_load_tokenizer(const char *model_path, const struct model *m,
                                    struct tokenizer **out);

#ifdef __cplusplus
}
#endif

#endif
