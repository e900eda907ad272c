/* engine/serving/conductor_verify.c - prefix-cache shadow verification (--verify-prefix-cache
 * RATE, issue 33): a sampled fraction of the requests whose prompt was served partly from the
 * prefix cache are recomputed without it, and the logits of the prompt's last token, which the
 * request sampled its first token from, are compared. A cache that served wrong K/V (a hash
 * collision the token check missed, a block overwritten while shared, a kernel whose result
 * depends on how the prompt was chunked) shows up as a mismatch: counted
 * (engine_stats.prefix_cache_mismatches, /metrics shardlm_prefix_cache_mismatch_total) and
 * logged with the request id. The request's own answer is not changed: verification observes.
 *
 * How: when a request's first sample finishes its prompt after a hit (take_results calls
 * verify_consider with the row it samples from), a job keeps a copy of that row and of the
 * prompt. After the step's results are taken, verify_run_pending recomputes each job's prompt
 * alone, from position 0, in blocks of its own (never registered: the shadow adds nothing to the
 * cache), in chunks of at most max_batch_tokens rows, as ordinary step plans (so every rank of a
 * tp / pp replica runs them), and compares the last row. A job that finds no free blocks is
 * skipped (counted). The shadow's cost is one prompt's prefill per verified request, on the
 * engine thread between two steps.
 *
 * Mismatch: a different argmax, or a logit further than VERIFY_TOLERANCE from the cached run's.
 * The cached and uncached runs compute the prompt's last rows in different chunks: on the CPU's
 * f32 path rows do not depend on the batch, but attention may take its tile path for one chunk
 * and its row path for the other (docs/determinism.md), so the logits may differ in their last
 * bits; the largest difference seen is kept (prefix_cache_max_abs_diff).
 * Tests: tests/server/test_http.py group verify_prefix (a clean cache: 0 mismatches; a cache
 * corrupted on purpose by SHARDLM_TEST_PREFIX_CACHE_FAULT=1: every hit a mismatch). */
#include "conductor_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VERIFY_TOLERANCE 1e-3 /* absolute, on logits */

struct verify_job {
    char     id[REQUEST_ID_MAX_BYTES + 28];
    int32_t *prompt;  /* (n_prompt) */
    int      n_prompt;
    int      adapter; /* the request's serving adapter (-1: the base) */
    float   *want;    /* (vocab) the cached run's logits of the prompt's last token */
};

static void job_free(struct verify_job *j)
{
    if (!j) return;
    free(j->prompt);
    free(j->want);
    free(j);
}

void verify_init(struct conductor *c)
{
    c->verify_rate = c->o.verify_prefix_cache;
    rng_seed(&c->verify_rng, 0x5eedu);
    const char *fault = getenv("SHARDLM_TEST_PREFIX_CACHE_FAULT");
    c->verify_fault = fault && !strcmp(fault, "1");
    if (c->verify_fault) LOG_WARN(MODULE, "SHARDLM_TEST_PREFIX_CACHE_FAULT=1: every prefix-cache hit reads a zeroed block");
}

void verify_free(struct conductor *c)
{
    for (int i = 0; i < c->n_vjobs; i++) job_free(c->vjobs[i]);
    c->n_vjobs = 0;
}

void verify_consider(struct conductor *c, const struct seq *s, const float *row)
{
    const struct request *r = s->req;
    if (c->verify_rate <= 0 || s->sample != 0 || s->n_generated != 0 || s->cached_prompt_tokens <= 0 ||
        s->n_cached != r->n_prompt)
        return;
    if (c->verify_rate < 1 && rng_uniform(&c->verify_rng) >= c->verify_rate) return;
    /* Full: more sampled hits in one step than verified between two. Device-greedy steps
     * (SHARDLM_DEVICE_SAMPLING, CUDA's default) bring back token ids, not the row. */
    if (c->n_vjobs == VERIFY_MAX_JOBS || c->greedy_done) {
        pthread_mutex_lock(&c->mu);
        c->stats.prefix_cache_verify_skipped++;
        pthread_mutex_unlock(&c->mu);
        return;
    }
    const int V = c->m->cfg.vocab_size;
    struct verify_job *j = calloc(1, sizeof *j);
    if (!j || !(j->prompt = malloc((size_t)r->n_prompt * sizeof *j->prompt)) || !(j->want = malloc((size_t)V * sizeof *j->want))) {
        job_free(j);
        return; /* out of memory: not verified, the request unharmed */
    }
    snprintf(j->id, sizeof j->id, "%s", r->id);
    memcpy(j->prompt, r->prompt, (size_t)r->n_prompt * sizeof *j->prompt);
    memcpy(j->want, row, (size_t)V * sizeof *j->want);
    j->n_prompt = r->n_prompt;
    j->adapter = r->adapter;
    c->vjobs[c->n_vjobs++] = j;
}

void verify_inject_fault(struct conductor *c)
{
    if (!c->verify_fault) return;
    const struct kv_cache *kv = &c->cache;
    const size_t bytes = (size_t)kv->block_tokens * (size_t)kv->n_kv_heads * (size_t)kv->head_dim * dtype_size(kv->dtype);
    for (int i = 0; i < c->sched.n_planned; i++) {
        const struct seq *s = c->sched.planned[i];
        /* The first step after a hit: the prompt's reused blocks, not yet read by this request. */
        if (s->cached_prompt_tokens <= 0 || s->n_cached != s->cached_prompt_tokens || s->n_generated) continue;
        for (int l = 0; l < kv->n_layers; l++) {
            backend_memset_zero(c->b, (char *)kv->k[l].data + (size_t)s->blocks[0] * bytes, bytes);
            backend_memset_zero(c->b, (char *)kv->v[l].data + (size_t)s->blocks[0] * bytes, bytes);
        }
    }
}

/* One chunk of the shadow prompt as this step's plan: rows [p0, p0 + take) of one sequence
 * whose blocks are `blocks`, with the last row's logits when it ends the prompt. */
static enum status run_chunk(struct conductor *c, const struct verify_job *j, const int32_t *blocks, int n_blocks,
                             int p0, int take)
{
    struct step_batch *b = &c->sched.batch;
    const int bt = c->cache.block_tokens, last = p0 + take == j->n_prompt;
    for (int k = 0; k < take; k++) {
        const int p = p0 + k;
        b->tokens[k] = j->prompt[p];
        b->pos[k] = p;
        b->slots[k] = blocks[p / bt] * bt + p % bt;
    }
    b->n_rows = take;
    b->n_seqs = 1;
    b->qstart[0] = 0;
    b->qstart[1] = take;
    b->seqlen[0] = p0 + take;
    b->adapter[0] = j->adapter;
    b->row_path[0] = 0;
    memcpy(b->table, blocks, (size_t)n_blocks * sizeof *blocks);
    b->n_logits = last;
    b->rows[0] = take - 1;
    b->prefill_rows = b->hit_tokens = 0;
    c->sched.n_planned = 0;
    enum status st = STATUS_OK;
    if (c->par.world) {
        struct step_plan_header ph = {.n_tokens = take, .n_seqs = 1, .table_width = b->table_width, .n_logits = last,
                                      .n_copies = c->sched.n_copies, .n_micro = 1};
        st = plan_exchange(c, &ph);
        c->sched.n_copies = 0;
    }
    c->step_greedy = c->step_top = 0; /* the whole row is wanted */
    return st == STATUS_OK ? run_forward(c, take, 1, last, 1) : st;
}

/* Recomputes job j's prompt without the cache; *diff = the largest logit difference, *same_top
 * = whether both rows have the same argmax. STATUS_UNAVAILABLE: no free blocks now. */
static enum status shadow_run(struct conductor *c, const struct verify_job *j, double *diff, int *same_top)
{
    const int bt = c->cache.block_tokens, need = (j->n_prompt + bt - 1) / bt, V = c->m->cfg.vocab_size;
    if (need > c->sched.batch.table_width || kv_cache_available(&c->cache) < need) return STATUS_UNAVAILABLE;
    int32_t *blocks = malloc((size_t)need * sizeof *blocks);
    if (!blocks) return STATUS_UNAVAILABLE;
    CHECK(kv_cache_alloc(&c->cache, need, blocks) == STATUS_OK, "kv alloc after check");
    enum status st = STATUS_OK;
    for (int p0 = 0; p0 < j->n_prompt && st == STATUS_OK; p0 += c->o.max_batch_tokens) {
        const int take = j->n_prompt - p0 < c->o.max_batch_tokens ? j->n_prompt - p0 : c->o.max_batch_tokens;
        st = run_chunk(c, j, blocks, need, p0, take);
    }
    kv_cache_release(&c->cache, need, blocks);
    free(blocks);
    if (st != STATUS_OK) return st;
    int top_want = 0, top_got = 0;
    double d = 0;
    for (int v = 0; v < V; v++) {
        const double e = fabs((double)c->logits[v] - (double)j->want[v]);
        if (!(e <= d)) d = e; /* NaN counts as the largest */
        if (j->want[v] > j->want[top_want]) top_want = v;
        if (c->logits[v] > c->logits[top_got]) top_got = v;
    }
    *diff = d;
    *same_top = top_want == top_got;
    return STATUS_OK;
}

enum status verify_run_pending(struct conductor *c)
{
    enum status st = STATUS_OK;
    for (int i = 0; i < c->n_vjobs; i++) {
        struct verify_job *j = c->vjobs[i];
        double diff = 0;
        int same_top = 1;
        enum status vs = st == STATUS_OK ? shadow_run(c, j, &diff, &same_top) : STATUS_UNAVAILABLE;
        if (vs != STATUS_OK && vs != STATUS_UNAVAILABLE) st = vs; /* a forward failed: the engine's failure */
        const int mismatch = vs == STATUS_OK && (!same_top || !(diff <= VERIFY_TOLERANCE));
        if (mismatch)
            LOG_WARN(MODULE, "req=%s prefix cache mismatch: the cached run's logits differ from a recomputation "
                     "without the cache by up to %.3g (argmax %s)", j->id, diff, same_top ? "the same" : "differs");
        else if (vs == STATUS_OK)
            LOG_DEBUG(MODULE, "req=%s prefix cache verified: logits within %.3g", j->id, diff);
        pthread_mutex_lock(&c->mu);
        if (vs == STATUS_OK) {
            c->stats.prefix_cache_verified++;
            c->stats.prefix_cache_mismatches += (uint64_t)mismatch;
            if (!(diff <= c->stats.prefix_cache_max_abs_diff)) c->stats.prefix_cache_max_abs_diff = diff;
        } else {
            c->stats.prefix_cache_verify_skipped++;
        }
        pthread_mutex_unlock(&c->mu);
        job_free(j);
    }
    c->n_vjobs = 0;
    return st;
}
