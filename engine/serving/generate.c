/* engine/serving/generate.c - one-sequence generation (see generate.h). */
#include "generate.h"

#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>
#include <time.h>

#include "tokenizer.h"

/* The next token from the last stage's logits, or -1 when they hold NaN or Inf. */
static int32_t sample_finite(const struct model *m, struct sampler *smp, const struct generate_options *o,
                             struct rng *rng, float *logits, const int32_t *prompt, int n_prompt,
                             const int32_t *out, int n_out)
{
    if (!sampler_logits_finite(logits, m->cfg.vocab_size)) return -1;
    return sampler_sample(smp, &o->sampling, rng, logits, prompt, n_prompt, out, n_out);
}

/* Every rank takes the last stage's token; -1 (non-finite logits) fails them all alike. */
static enum status shared_token(struct model *m, int32_t *next)
{
    enum status st = model_share_tokens(m, next, 1);
    if (st == STATUS_OK && *next < 0)
        st = status_errorf(STATUS_INTERNAL, "generate: the model produced NaN or Inf logits; no token was sampled");
    return st;
}

enum status generate_run(struct model *m, struct kv_cache *cache, const int32_t *prompt,
                         int n_prompt, const struct generate_options *o, generate_token_fn on_token,
                         void *ctx, int32_t *out, int *n_out, struct generate_stats *stats)
{
    *n_out = 0;
    memset(stats, 0, sizeof *stats);
    const int V = m->cfg.vocab_size, bt = cache->block_tokens;
    if (m->cfg.encoder)
        return status_errorf(STATUS_INVALID_ARGUMENT, "generate: the model (%s) is an encoder: it serves embeddings "
                             "(/v1/embeddings), not generation", m->cfg.architecture);
    if (n_prompt < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "generate: the prompt is empty");
    if (o->max_tokens < 0) return status_errorf(STATUS_INVALID_ARGUMENT, "max_tokens must be >= 0");
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return status_errorf(STATUS_INVALID_ARGUMENT, "prompt token %d at %d is outside the vocabulary (%d)",
                                 prompt[i], i, V);
    /* The last generated token is never fed back, so the context needs n_prompt + max - 1. */
    int total = n_prompt + (o->max_tokens > 0 ? o->max_tokens - 1 : 0);
    if (total > m->cfg.max_positions)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "prompt (%d tokens) + max_tokens (%d) exceeds the model's context of %d",
                             n_prompt, o->max_tokens, m->cfg.max_positions);
    int max_blocks = (total + bt - 1) / bt;
    if (max_blocks > cache->n_blocks)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "generate: %d tokens need %d KV blocks, the cache has %d", total,
                             max_blocks, cache->n_blocks);
    int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : m->ws.max_tokens;
    if (chunk > m->ws.max_tokens) chunk = m->ws.max_tokens;
    enum status st = sampling_params_validate(&o->sampling);
    if (st != STATUS_OK) return st;

    int32_t *table = calloc((size_t)max_blocks, sizeof *table);
    int32_t *rows = malloc((size_t)chunk * 3 * sizeof *rows);
    float *logits = malloc((size_t)V * sizeof *logits);
    struct sampler smp = {0};
    if (!table || !rows || !logits) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "generate: out of memory");
        goto done;
    }
    if ((st = sampler_init(&smp, V)) != STATUS_OK) goto done;
    st = kv_cache_alloc(cache, max_blocks, table);
    if (st != STATUS_OK) goto done;
    struct rng rng;
    rng_seed(&rng, o->sampling.seed);

    int32_t *positions = rows, *slots = rows + chunk;
    int n_cached = 0; /* tokens whose K/V are in the cache */
    int32_t next = -1;
    double t0 = base_now_s();
    /* Prefill in chunks; logits only for the prompt's last row. */
    while (n_cached < n_prompt) {
        int n = n_prompt - n_cached < chunk ? n_prompt - n_cached : chunk;
        for (int i = 0; i < n; i++) {
            int p = n_cached + i;
            positions[i] = p;
            slots[i] = table[p / bt] * bt + p % bt;
        }
        int32_t q_start[2] = {0, n}, seq_len = n_cached + n, last = n - 1;
        int want = n_cached + n == n_prompt && o->max_tokens > 0;
        struct forward_batch fb = {
            .n_tokens = n, .tokens = prompt + n_cached, .positions = positions, .slots = slots,
            .n_seqs = 1, .q_start = q_start, .seq_len = &seq_len, .block_table = table,
            .max_blocks = max_blocks, .n_logits = want, .logit_rows = &last,
        };
        if ((st = model_forward(m, cache, &fb, logits)) != STATUS_OK) goto release;
        n_cached += n;
        if (want) {
            /* The last stage samples; every rank then feeds the same token. */
            if (model_is_last_stage(m)) next = sample_finite(m, &smp, o, &rng, logits, prompt, n_prompt, out, 0);
            if ((st = shared_token(m, &next)) != STATUS_OK) goto release;
        }
    }
    double t1 = base_now_s();
    stats->prefill_seconds = t1 - t0;
    stats->n_prompt = n_prompt;

    while (*n_out < o->max_tokens) {
        out[(*n_out)++] = next;
        if (on_token && on_token(ctx, next)) break;
        if (!o->ignore_eos && next == o->eos_id) break;
        if (*n_out == o->max_tokens) break;
        /* Feed the token back: one row at position n_cached. */
        int32_t pos = n_cached, slot = table[pos / bt] * bt + pos % bt;
        int32_t q_start[2] = {0, 1}, seq_len = n_cached + 1, row = 0;
        struct forward_batch fb = {
            .n_tokens = 1, .tokens = &next, .positions = &pos, .slots = &slot, .n_seqs = 1,
            .q_start = q_start, .seq_len = &seq_len, .block_table = table,
            .max_blocks = max_blocks, .n_logits = 1, .logit_rows = &row,
        };
        if ((st = model_forward(m, cache, &fb, logits)) != STATUS_OK) goto release;
        n_cached++;
        if (model_is_last_stage(m)) next = sample_finite(m, &smp, o, &rng, logits, prompt, n_prompt, out, *n_out);
        if ((st = shared_token(m, &next)) != STATUS_OK) goto release;
    }
    stats->decode_seconds = base_now_s() - t1;
    stats->n_generated = *n_out;
release:
    kv_cache_release(cache, max_blocks, table);
done:
    sampler_free(&smp);
    free(table);
    free(rows);
    free(logits);
    return st;
}

enum status generate_load_tokenizer(const char *model_path, const struct model *m,
                                    struct tokenizer **out)
{
    struct checkpoint *ck = m->checkpoint;
    const enum status st = tokenizer_load_for_model(model_path, ck->tokenizer_proto, ck->tokenizer_proto_n,
                                                    m->cfg.vocab_size, out);
    if (st == STATUS_OK && ck->tokenizer_proto) { /* SentencePiece holds its own parsed copy */
        free(ck->tokenizer_proto);
        ck->tokenizer_proto = NULL;
    }
    checkpoint_release_pages(ck, 0); /* the metadata's pages */
#ifdef __GLIBC__
    /* Building a byte-level BPE from a GGUF parses its vocabulary as JSON (megabytes of cJSON
     * nodes, freed by now); glibc keeps freed heap pages resident until asked to return them. */
    malloc_trim(0);
#endif

    return st;
}
