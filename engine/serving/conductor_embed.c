/* engine/serving/conductor_embed.c - embeddings on one replica (engine_embed): a caller's inputs
 * become a job that the engine thread runs in forward passes of at most max_batch_tokens rows
 * and max_seqs inputs through model_embed, one pass before each step (no KV cache, so running
 * generation loses nothing but the time of the pass, and a long job does not hold it up); the
 * caller waits for the last pass.
 * Not here: the forward pass and pooling (model.c, model_embed), the HTTP front
 * (server/http_embeddings.c).
 * Tests: tests/server/test_embeddings.py (all-MiniLM-L6-v2 against a float64 NumPy forward; a
 * decoder's last-token pooling; bad input). */
#include "conductor_impl.h"

#include <stdio.h>
#include <stdlib.h>

/* One engine_embed call, owned by the waiting caller (on its stack). */
struct embed_job {
    const int32_t *tokens, *offsets;   /* borrowed from the caller: (offsets[n_inputs]), (n_inputs + 1) */
    int            n_inputs;
    int            next_input;         /* engine thread: the first input not embedded yet */
    enum model_pooling pooling;
    int            normalize;
    float         *out;                /* (n_inputs, d_model) */
    int            done;               /* under mu */
    enum status    st;
    char           message[512];
    struct embed_job *next;
};

/* One forward pass of job: its next inputs, as many as fit the workspace (max_batch_tokens
 * rows, max_seqs inputs; every input fits alone: check_inputs). */
static void run_pass(struct conductor *c, struct embed_job *job)
{
    const int d = c->m->cfg.d_model, i = job->next_input;
    int32_t *q_start = malloc(((size_t)c->o.max_seqs + 1) * sizeof *q_start);
    if (!q_start) {
        job->st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "embeddings: out of host memory");
    } else {
        const int32_t base = job->offsets[i];
        int j = i;
        q_start[0] = 0;
        for (; j < job->n_inputs && j - i < c->o.max_seqs && job->offsets[j + 1] - base <= c->o.max_batch_tokens; j++)
            q_start[j - i + 1] = job->offsets[j + 1] - base;
        job->st = model_embed(c->m, job->tokens + base, q_start, j - i, job->pooling, job->normalize,
                              job->out + (size_t)i * (size_t)d);
        job->next_input = j;
    }
    if (job->st != STATUS_OK) snprintf(job->message, sizeof job->message, "%s", status_message());
    free(q_start);
}

/* Under mu: job is finished; its caller may return (and the job go) once done is set. */
static void finish_job(struct conductor *c, struct embed_job *job)
{
    if (job->st == STATUS_OK) c->stats.prompt_tokens += (uint64_t)job->offsets[job->n_inputs];
    job->done = 1;
    pthread_cond_broadcast(&c->embed_cv);
}

/* One pass of the first waiting job per engine step, so that a long embedding request and
 * generation take turns (a step of decoding between two passes) instead of one waiting for the
 * other. Only the engine thread removes jobs; callers only append. */
void run_embed_jobs(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    struct embed_job *job = c->embed_jobs;
    pthread_mutex_unlock(&c->mu);
    if (!job) return;
    run_pass(c, job);
    if (job->st == STATUS_OK && job->next_input < job->n_inputs) return;
    pthread_mutex_lock(&c->mu);
    c->embed_jobs = job->next;
    finish_job(c, job);
    pthread_mutex_unlock(&c->mu);
}

void fail_embed_jobs(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    for (struct embed_job *j = c->embed_jobs, *next; j; j = next) {
        next = j->next;
        j->st = STATUS_UNAVAILABLE;
        snprintf(j->message, sizeof j->message, "the engine stopped before the embeddings ran");
        finish_job(c, j);
    }
    c->embed_jobs = NULL;
    pthread_mutex_unlock(&c->mu);
}

/* The inputs' checks, before anything is queued: every one must run in one pass. */
static enum status check_inputs(const struct conductor *c, const int32_t *tokens, const int32_t *offsets, int n)
{
    const struct model_config *cfg = &c->m->cfg;
    if (n < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "input: at least one input is needed");
    if (offsets[0] != 0) return status_errorf(STATUS_INVALID_ARGUMENT, "input: offsets must start at 0");
    for (int i = 0; i < n; i++) {
        const int len = offsets[i + 1] - offsets[i];
        if (len < 1) return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d] is empty", i);
        if (len > cfg->max_positions)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "input[%d] has %d tokens, more than the model's maximum context length of %d tokens", i,
                                 len, cfg->max_positions);
        if (len > c->o.max_batch_tokens)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "input[%d] has %d tokens, more than --max-batch-tokens %d (an input runs in one pass)",
                                 i, len, c->o.max_batch_tokens);
        for (int32_t k = offsets[i]; k < offsets[i + 1]; k++)
            if (tokens[k] < 0 || tokens[k] >= cfg->vocab_size)
                return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d]: token id %d is outside the vocabulary [0, %d)",
                                     i, tokens[k], cfg->vocab_size);
    }
    return STATUS_OK;
}

enum status conductor_embed(struct conductor *c, const int32_t *tokens, const int32_t *offsets, int n_inputs,
                            enum embed_pooling pooling, int normalize, float *out)
{
    if (c->par.world && c->par.world->size > 1)
        return status_errorf(STATUS_UNSUPPORTED, "embeddings are served by a model on one rank (tp 1, pp 1); this one "
                             "runs on %d", c->par.world->size);
    enum status st = check_inputs(c, tokens, offsets, n_inputs);
    if (st != STATUS_OK) return st;
    static const enum model_pooling by_name[] = {
        [EMBED_POOLING_MEAN] = MODEL_POOLING_MEAN, [EMBED_POOLING_CLS] = MODEL_POOLING_CLS,
        [EMBED_POOLING_LAST] = MODEL_POOLING_LAST};
    if (pooling < EMBED_POOLING_DEFAULT || pooling > EMBED_POOLING_LAST)
        return status_errorf(STATUS_INVALID_ARGUMENT, "pooling %d is not one of mean, cls, last", (int)pooling);
    struct embed_job job = {
        .tokens = tokens, .offsets = offsets, .n_inputs = n_inputs, .normalize = normalize, .out = out,
        .pooling = pooling != EMBED_POOLING_DEFAULT ? by_name[pooling]
                   : c->m->cfg.encoder          ? MODEL_POOLING_MEAN
                                                : MODEL_POOLING_LAST,
    };
    pthread_mutex_lock(&c->mu);
    if (c->failed) st = status_errorf(STATUS_UNAVAILABLE, "the engine failed: %s", c->failure);
    else if (c->draining || c->stop_thread) st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    if (st != STATUS_OK || !c->thread_running) {
        pthread_mutex_unlock(&c->mu);
        if (st != STATUS_OK) return st;
        /* No engine thread: the caller steps the engine itself (engine_step), never at once. */
        while (job.st == STATUS_OK && job.next_input < job.n_inputs) run_pass(c, &job);
        pthread_mutex_lock(&c->mu);
        finish_job(c, &job);
        pthread_mutex_unlock(&c->mu);
    } else {
        struct embed_job **tail = &c->embed_jobs;
        while (*tail) tail = &(*tail)->next;
        *tail = &job;
        pthread_cond_signal(&c->cv);
        while (!job.done) pthread_cond_wait(&c->embed_cv, &c->mu);
        pthread_mutex_unlock(&c->mu);
    }
    if (job.st != STATUS_OK) return status_errorf(job.st, "%s", job.message);
    return STATUS_OK;
}
