/* engine/serving/conductor_embed.c - embeddings on one replica (engine_embed, engine_embed_submit):
 * each request becomes a job that the engine thread runs in forward passes of at most
 * max_batch_tokens rows and max_seqs inputs through model_embed, one pass before each step (no
 * KV cache, so running generation loses nothing but the time of the pass, and a long job does
 * not hold it up). A pass takes the waiting jobs' inputs in arrival order, across jobs: eight
 * clients sending one short query each share one pass instead of queueing for eight (a job
 * whose pooling or normalize differs from the pass's first job waits for the next pass). The
 * submitter learns the outcome from its done callback; engine_embed waits for it.
 * Not here: the forward pass and pooling (model.c, model_embed), the fronts (server/embed.c).
 * Tests: tests/server/test_embeddings.py (all-MiniLM-L6-v2 against a float64 NumPy forward,
 * concurrent requests over HTTP and gRPC equal to each alone; a decoder's last-token pooling;
 * bad input). */
#include "conductor_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One submitted request, owned by the conductor from submit until its done has been called. */
struct embed_job {
    struct engine_embed_req r;           /* the caller's request; its arrays borrowed */
    const struct engine_embed_req *key;  /* the caller's pointer: engine_embed_cancel finds the job by it */
    enum model_pooling pooling;
    int            next_input;           /* engine thread: the first input not embedded yet */
    int            cancelled;            /* under mu */
    enum status    st;                   /* engine thread: an error ends the job */
    char           message[512];
    struct embed_job *next;              /* under mu */
};

/* One job's share of a pass: its inputs first .. first + n - 1. */
struct pass_part {
    struct embed_job *job;
    int first, n;
};

/* Under mu: the inputs of the next pass into parts (*n_parts of them, *n_seqs inputs in all):
 * jobs in arrival order, cancelled ones skipped, while the inputs fit max_batch_tokens rows and
 * max_seqs sequences and the jobs share the first one's pooling and normalize. The first live
 * job's next input always fits (check_inputs), so every pass makes progress. */
static void plan_pass(struct conductor *c, struct pass_part *parts, int *n_parts, int *n_seqs)
{
    const int max_seqs = c->o.max_seqs, max_rows = c->o.max_batch_tokens;
    const struct embed_job *lead = NULL;
    int rows = 0;
    *n_parts = *n_seqs = 0;
    for (struct embed_job *j = c->embed_jobs; j && *n_seqs < max_seqs; j = j->next) {
        if (j->cancelled) continue;
        if (lead && (j->pooling != lead->pooling || j->r.normalize != lead->r.normalize)) break;
        if (!lead) lead = j;
        int k = j->next_input;
        for (; k < j->r.n_inputs && *n_seqs < max_seqs; k++, ++*n_seqs) {
            const int len = j->r.offsets[k + 1] - j->r.offsets[k];
            if (rows + len > max_rows) break;
            rows += len;
        }
        if (k > j->next_input) parts[(*n_parts)++] = (struct pass_part){j, j->next_input, k - j->next_input};
        if (k < j->r.n_inputs) break; /* its next input waits for the next pass, and so do later jobs */
    }
}

/* Under mu: unlinks every job that ended (all inputs embedded, an error, cancelled) onto *ended,
 * counting the tokens of those that succeeded. */
static void take_ended(struct conductor *c, struct embed_job **ended)
{
    struct embed_job **tail = ended;
    for (struct embed_job **p = &c->embed_jobs; *p;) {
        struct embed_job *j = *p;
        if (j->cancelled && j->st == STATUS_OK) {
            j->st = STATUS_CANCELLED;
            snprintf(j->message, sizeof j->message, "the embedding request was cancelled");
        }
        if (j->st == STATUS_OK && j->next_input < j->r.n_inputs) {
            p = &j->next;
            continue;
        }
        if (j->st == STATUS_OK) c->stats.prompt_tokens += (uint64_t)j->r.offsets[j->r.n_inputs];
        *p = j->next;
        j->next = NULL;
        *tail = j;
        tail = &j->next;
    }
}

/* Off mu: tells the callers of the ended jobs, and frees them; only then is the conductor idle
 * for the drain (the callers' answers are on their way). */
static void finish_jobs(struct conductor *c, struct embed_job *ended)
{
    int n = 0;
    while (ended) {
        struct embed_job *j = ended;
        ended = j->next;
        j->r.done(j->r.ctx, j->st, j->st == STATUS_OK ? "" : j->message);
        free(j);
        n++;
    }
    if (!n) return;
    pthread_mutex_lock(&c->mu);
    c->embed_active -= n;
    pthread_mutex_unlock(&c->mu);
}

/* One forward pass over the waiting jobs (plan_pass), its vectors copied to each job's out, then
 * the jobs that ended are answered. Engine thread (or the submitter without one); only this
 * function removes jobs, so the planned ones stay alive while the pass runs off the lock. */
static void run_pass(struct conductor *c)
{
    const int d = c->m->cfg.d_model, max_seqs = c->o.max_seqs;
    struct pass_part *parts = malloc((size_t)max_seqs * sizeof *parts);
    int32_t *tokens = malloc((size_t)c->o.max_batch_tokens * sizeof *tokens);
    int32_t *q_start = malloc(((size_t)max_seqs + 1) * sizeof *q_start);
    float *out = malloc((size_t)max_seqs * (size_t)d * sizeof *out);
    int n_parts = 0, n_seqs = 0;
    enum status st = STATUS_OK;
    pthread_mutex_lock(&c->mu);
    if (parts && tokens && q_start && out) plan_pass(c, parts, &n_parts, &n_seqs);
    else st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "embeddings: out of host memory");
    pthread_mutex_unlock(&c->mu);
    if (n_seqs > 0) {
        int s = 0;
        q_start[0] = 0;
        for (int p = 0; p < n_parts; p++)
            for (int i = parts[p].first; i < parts[p].first + parts[p].n; i++, s++) {
                const int32_t *o = parts[p].job->r.offsets;
                memcpy(tokens + q_start[s], parts[p].job->r.tokens + o[i], (size_t)(o[i + 1] - o[i]) * sizeof *tokens);
                q_start[s + 1] = q_start[s] + (o[i + 1] - o[i]);
            }
        const struct embed_job *lead = parts[0].job;
        st = model_embed(c->m, tokens, q_start, n_seqs, lead->pooling, lead->r.normalize, out);
        for (int p = 0, row = 0; p < n_parts && st == STATUS_OK; row += parts[p].n, p++)
            memcpy(parts[p].job->r.out + (size_t)parts[p].first * (size_t)d, out + (size_t)row * (size_t)d,
                   (size_t)parts[p].n * (size_t)d * sizeof *out);
    }
    struct embed_job *ended = NULL;
    pthread_mutex_lock(&c->mu);
    if (st != STATUS_OK && n_parts == 0 && c->embed_jobs) { /* out of memory before planning: the first job fails */
        c->embed_jobs->st = st;
        snprintf(c->embed_jobs->message, sizeof c->embed_jobs->message, "%s", status_message());
    }
    if (n_seqs > 0) c->stats.embed_passes++;
    for (int p = 0; p < n_parts; p++) {
        struct embed_job *j = parts[p].job;
        if (st == STATUS_OK) j->next_input += parts[p].n;
        else if (j->st == STATUS_OK) {
            j->st = st;
            snprintf(j->message, sizeof j->message, "%s", status_message());
        }
    }
    take_ended(c, &ended);
    pthread_mutex_unlock(&c->mu);
    finish_jobs(c, ended);
    free(parts);
    free(tokens);
    free(q_start);
    free(out);
}

/* One pass per engine step, so that a long embedding request and generation take turns (a step
 * of decoding between two passes) instead of one waiting for the other. */
void run_embed_jobs(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    const int any = c->embed_jobs != NULL;
    pthread_mutex_unlock(&c->mu);
    if (any) run_pass(c);
}

void fail_embed_jobs(struct conductor *c)
{
    pthread_mutex_lock(&c->mu);
    struct embed_job *ended = c->embed_jobs;
    c->embed_jobs = NULL;
    for (struct embed_job *j = ended; j; j = j->next) {
        j->st = STATUS_UNAVAILABLE;
        snprintf(j->message, sizeof j->message, "the engine stopped before the embeddings ran");
    }
    pthread_mutex_unlock(&c->mu);
    finish_jobs(c, ended);
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

enum status conductor_embed_submit(struct conductor *c, const struct engine_embed_req *req)
{
    if (c->par.world && c->par.world->size > 1)
        return status_errorf(STATUS_UNSUPPORTED, "embeddings are served by a model on one rank (tp 1, pp 1); this one "
                             "runs on %d", c->par.world->size);
    enum status st = check_inputs(c, req->tokens, req->offsets, req->n_inputs);
    if (st != STATUS_OK) return st;
    static const enum model_pooling by_name[] = {
        [EMBED_POOLING_MEAN] = MODEL_POOLING_MEAN, [EMBED_POOLING_CLS] = MODEL_POOLING_CLS,
        [EMBED_POOLING_LAST] = MODEL_POOLING_LAST};
    if (req->pooling < EMBED_POOLING_DEFAULT || req->pooling > EMBED_POOLING_LAST)
        return status_errorf(STATUS_INVALID_ARGUMENT, "pooling %d is not one of mean, cls, last", (int)req->pooling);
    struct embed_job *job = calloc(1, sizeof *job);
    if (!job) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "embeddings: out of host memory");
    *job = (struct embed_job){
        .r = *req, .key = req,
        .pooling = req->pooling != EMBED_POOLING_DEFAULT ? by_name[req->pooling]
                   : c->m->cfg.encoder                  ? MODEL_POOLING_MEAN
                                                        : MODEL_POOLING_LAST,
    };
    pthread_mutex_lock(&c->mu);
    if (c->failed) st = status_errorf(STATUS_UNAVAILABLE, "the engine failed: %s", c->failure);
    else if (c->draining || c->stop_thread) st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    if (st != STATUS_OK) {
        pthread_mutex_unlock(&c->mu);
        free(job);
        return st;
    }
    struct embed_job **tail = &c->embed_jobs;
    while (*tail) tail = &(*tail)->next;
    *tail = job;
    c->embed_active++;
    const int threaded = c->thread_running;
    if (threaded) pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    /* No engine thread: the caller steps the engine itself (engine_step), never at once, so the
     * passes run here, and done before this returns. */
    while (!threaded) {
        pthread_mutex_lock(&c->mu);
        const int more = c->embed_jobs != NULL;
        pthread_mutex_unlock(&c->mu);
        if (!more) break;
        run_pass(c);
    }
    return STATUS_OK;
}

void cancel_embed_jobs(struct conductor *c)
{
    for (struct embed_job *j = c->embed_jobs; j; j = j->next) j->cancelled = 1;
}

void conductor_embed_cancel(struct conductor *c, const struct engine_embed_req *req)
{
    pthread_mutex_lock(&c->mu);
    for (struct embed_job *j = c->embed_jobs; j; j = j->next)
        if (j->key == req) j->cancelled = 1;
    pthread_mutex_unlock(&c->mu);
}

/* engine_embed: a submitted request whose done wakes the waiting caller. */
struct embed_wait {
    struct conductor *c;
    int               done;  /* under c->mu */
    enum status       st;
    char              message[512];
};

static void embed_waited(void *ctx, enum status st, const char *message)
{
    struct embed_wait *w = ctx;
    pthread_mutex_lock(&w->c->mu);
    w->st = st;
    snprintf(w->message, sizeof w->message, "%s", message);
    w->done = 1;
    pthread_cond_broadcast(&w->c->embed_cv);
    pthread_mutex_unlock(&w->c->mu); /* w may be gone from here on */
}

enum status conductor_embed(struct conductor *c, const int32_t *tokens, const int32_t *offsets, int n_inputs,
                            enum embed_pooling pooling, int normalize, float *out)
{
    struct embed_wait w = {.c = c};
    const struct engine_embed_req req = {.tokens = tokens, .offsets = offsets, .n_inputs = n_inputs,
                                         .pooling = pooling, .normalize = normalize, .out = out,
                                         .done = embed_waited, .ctx = &w};
    enum status st = conductor_embed_submit(c, &req);
    if (st != STATUS_OK) return st;
    pthread_mutex_lock(&c->mu);
    while (!w.done) pthread_cond_wait(&c->embed_cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    return w.st == STATUS_OK ? STATUS_OK : status_errorf(w.st, "%s", w.message);
}
