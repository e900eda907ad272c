/* tests/test_scheduler.c - the scheduler and the request limits without a model: a CPU KV pool
 * of tiny blocks, requests built with request_new, steps "run" by scheduler_commit. Checks
 * admission under the token budget and max_seqs (chunked prefill), preemption of the newest
 * running sequence when the pool runs dry (and its return to the front of the queue), prefix
 * block reuse by hash and the blocks' release, the waiting samples that --max-queue counts, and
 * the one limits table (engine and sampler agree, messages name the field and its bounds).
 * Not here: anything that needs logits (tests/test_engine.c). Label: unit. */
#include <stdlib.h>

#include "check.h"
#include "ops.h"
#include "request.h"
#include "scheduler.h"

#define BT 4 /* tokens per block */

static void on_event(void *ctx, const struct engine_event *ev)
{
    (void)ctx;
    (void)ev;
}

struct pool {
    struct backend *b;
    struct kv_cache cache;
    struct scheduler s;
};

static void pool_open(struct pool *p, int n_blocks, int max_seqs, int max_batch_tokens, int prefix_caching)
{
    memset(p, 0, sizeof *p);
    CHECK(backend_open(DEVICE_CPU, 0, 1, &p->b) == STATUS_OK, "cpu backend: %s", status_message());
    CHECK(kv_cache_init(&p->cache, p->b, 1, n_blocks, BT, 1, 4, DTYPE_F32) == STATUS_OK, "kv: %s", status_message());
    struct scheduler_options o = {.max_seqs = max_seqs, .max_batch_tokens = max_batch_tokens, .max_logits = 16,
                                  .table_width = 16, .prefix_caching = prefix_caching};
    CHECK(scheduler_init(&p->s, &p->cache, &o) == STATUS_OK, "scheduler: %s", status_message());
}

static void pool_close(struct pool *p)
{
    scheduler_free(&p->s);
    kv_cache_free(&p->cache);
    backend_close(p->b);
}

/* A request of n_prompt tokens first, first + 1, ... and n samples (its own request; freed by
 * finish). */
static struct seq *new_seq_n(int first, int n_prompt, int max_tokens, int n)
{
    int32_t prompt[64];
    for (int i = 0; i < n_prompt; i++) prompt[i] = first + i;
    struct request_params rp = request_params_default();
    rp.max_tokens = max_tokens;
    rp.n = n;
    struct request *r;
    CHECK(request_new(prompt, n_prompt, &rp, on_event, NULL, &r) == STATUS_OK, "request_new");
    struct seq *q = seq_new(r, 0, NULL);
    CHECK(q, "seq_new");
    return q;
}

static struct seq *new_seq(int first, int n_prompt, int max_tokens) { return new_seq_n(first, n_prompt, max_tokens, 1); }

/* Every planned sequence's rows ran; those that sampled get one more token. */
static void run_step(struct pool *p, int token)
{
    for (int i = 0; i < p->s.n_running; i++) {
        struct seq *q = p->s.running[i];
        if (q->n_rows == 0) continue;
        scheduler_commit(&p->s, q);
        if (q->wants_sample) q->tokens[q->n_tokens++] = token;
    }
}

/* Ends a sample as the conductor does (blocks back, SEQ_DONE), frees its request. */
static void finish(struct pool *p, struct seq *q)
{
    scheduler_release(&p->s, q);
    q->state = SEQ_DONE;
    request_free(q->req);
    q->req = NULL;
}

static void test_admission(void)
{
    struct pool p;
    pool_open(&p, 32, 4, 8, 0);
    struct seq *a = new_seq(10, 5, 8), *b = new_seq(20, 5, 8), *c = new_seq(30, 5, 8);
    scheduler_enqueue(&p.s, a);
    scheduler_enqueue(&p.s, b);
    scheduler_enqueue(&p.s, c);
    int rows = scheduler_plan(&p.s);
    const struct step_batch *bt = &p.s.batch;
    check(rows == 8 && bt->n_seqs == 2 && p.s.n_running == 2 && p.s.n_waiting == 1 && p.s.waiting[0] == c,
          "a budget of 8 rows admits the first prompt whole and 3 rows of the second (%d rows, %d running)", rows,
          p.s.n_running);
    check(a->n_rows == 5 && a->wants_sample && b->n_rows == 3 && !b->wants_sample && bt->n_logits == 1 &&
              bt->rows[0] == 4 && bt->qstart[1] == 5 && bt->pos[5] == 0 && bt->pos[7] == 2 && bt->tokens[5] == 20,
          "rows in planning order; logits only where a prompt ends");
    check(a->n_blocks == 2 && b->n_blocks == 1 && bt->slots[4] == a->blocks[1] * BT && bt->prefill_rows == 8,
          "blocks cover the planned rows (slot = block * block_tokens + offset)");
    run_step(&p, 99);
    rows = scheduler_plan(&p.s);
    check(rows == 8 && a->n_rows == 1 && b->n_rows == 2 && c->n_rows == 5 && p.s.n_waiting == 0,
          "next step: a decodes 1 row, b finishes its prompt (2), c is admitted with the rest (5)");
    check(bt->rows[0] == 0 && bt->n_logits == 3 && bt->prefill_rows == 7, "a's decode row is sampled; 7 prefill rows");
    finish(&p, a);
    finish(&p, b);
    finish(&p, c);
    scheduler_drop_finished(&p.s);
    check(p.s.n_running == 0 && p.cache.n_free == 32, "finished samples return every block");
    /* max_seqs bounds admission even with budget left. */
    struct seq *q[3];
    pool_close(&p);
    pool_open(&p, 32, 2, 64, 0);
    for (int i = 0; i < 3; i++) scheduler_enqueue(&p.s, q[i] = new_seq(40 + i, 3, 4));
    rows = scheduler_plan(&p.s);
    check(rows == 6 && p.s.n_running == 2 && p.s.n_waiting == 1 && p.s.waiting[0] == q[2],
          "max_seqs 2: the third request waits although 58 rows of budget are left");
    for (int i = 0; i < 3; i++) request_free(q[i]->req);
    pool_close(&p);
}

static void test_preemption(void)
{
    struct pool p;
    pool_open(&p, 4, 4, 64, 0);
    struct seq *q[3];
    for (int i = 0; i < 3; i++) scheduler_enqueue(&p.s, q[i] = new_seq(10 * (i + 1), BT, 8));
    scheduler_plan(&p.s);
    check(p.s.n_running == 3 && p.cache.n_free == 1, "three prompts of one block each run; one block left");
    run_step(&p, 7); /* each now holds 5 tokens: the next row needs a second block */
    scheduler_plan(&p.s);
    check(p.s.preemptions == 1 && p.s.n_running == 2 && p.s.running[0] == q[0] && p.s.running[1] == q[1],
          "the pool runs dry: the newest running sequence is preempted, the oldest keep running");
    check(q[2]->state == SEQ_WAITING && p.s.n_waiting == 1 && p.s.waiting[0] == q[2] && q[2]->n_blocks == 0 &&
              q[2]->n_cached == 0 && q[2]->n_tokens == BT + 1,
          "the preempted sequence waits at the front with its tokens kept and no blocks (recomputed later)");
    check(q[0]->n_rows == 1 && q[1]->n_rows == 1 && q[0]->n_blocks == 2 && q[1]->n_blocks == 2 && p.cache.n_free == 0,
          "the survivors each got their second block");
    /* One more arrival queues behind the preempted one. */
    struct seq *late = new_seq(90, 2, 4);
    scheduler_enqueue(&p.s, late);
    run_step(&p, 8);
    finish(&p, q[0]);
    scheduler_drop_finished(&p.s);
    scheduler_plan(&p.s);
    check(q[2]->state == SEQ_RUNNING && q[2]->n_rows == BT + 1 && p.s.waiting[0] == late,
          "once blocks return, the preempted sequence is admitted first and recomputes all %d tokens", BT + 1);
    finish(&p, q[1]);
    finish(&p, q[2]);
    request_free(late->req);
    late->req = NULL;
    pool_close(&p);
}

static void test_prefix_reuse(void)
{
    struct pool p;
    pool_open(&p, 16, 4, 64, 1);
    struct seq *a = new_seq(100, 2 * BT + 1, 4);
    scheduler_enqueue(&p.s, a);
    scheduler_plan(&p.s);
    run_step(&p, 5);
    int32_t shared[2] = {a->blocks[0], a->blocks[1]};
    check(a->n_registered == 2, "a's two full prompt blocks are registered by hash");
    finish(&p, a);
    scheduler_drop_finished(&p.s);
    check(p.cache.n_cached == 2 && kv_cache_available(&p.cache) == 16,
          "released registered blocks stay cached (reusable) yet available to allocation");
    struct seq *b = new_seq(100, 2 * BT + 2, 4); /* the same 8 leading tokens, then its own */
    b->tokens[2 * BT] = 555;
    b->tokens[2 * BT + 1] = 556;
    scheduler_enqueue(&p.s, b);
    scheduler_plan(&p.s);
    check(b->cached_prompt_tokens == 2 * BT && p.s.batch.hit_tokens == 2 * BT && b->blocks[0] == shared[0] &&
              b->blocks[1] == shared[1],
          "a request with the same leading blocks reuses them (%d tokens from the cache)", b->cached_prompt_tokens);
    check(b->n_rows == 2 && p.s.batch.pos[0] == 2 * BT && p.cache.n_cached == 0,
          "only the new tokens run; the shared blocks are held again (no longer merely cached)");
    /* A prompt that is entirely cached still computes its last token (its logits are needed). */
    struct seq *c = new_seq(100, 2 * BT, 4);
    scheduler_enqueue(&p.s, c);
    run_step(&p, 5);
    scheduler_plan(&p.s);
    check(c->n_cached == BT && c->n_rows == BT && c->cached_prompt_tokens == BT,
          "an exact repeat reuses all but the block of its last token");
    finish(&p, b);
    finish(&p, c);
    scheduler_drop_finished(&p.s);
    check(kv_cache_available(&p.cache) == 16 && p.cache.n_free + p.cache.n_cached == 16,
          "after both finish every block is free or cached again");
    pool_close(&p);
}

static void test_limits(void)
{
    const struct request_bounds b = {.vocab_size = 512, .max_positions = 512, .block_tokens = 16, .n_blocks = 64,
                                     .max_logprobs = 20, .max_seqs = 64};
    int32_t prompt[3] = {1, 2, 3};
    struct request_params p = request_params_default();
    check(request_validate(prompt, 3, &p, &b) == STATUS_OK, "the defaults pass");
    struct { const char *what, *needle; } bad[] = {
        {"temperature 100.5", "sampling.temperature must be in [0, 100] (0 = greedy), got 100.5"},
        {"repetition_penalty 0", "sampling.repetition_penalty must be in (0, 10]"},
        {"repetition_penalty 11", "sampling.repetition_penalty must be in (0, 10]"},
        {"top_k 513", "sampling.top_k must be in [0, 512]"},
        {"top_p 0", "sampling.top_p must be in (0, 1]"},
        {"n 17", "sampling.n must be in [1, 16], got 17"},
        {"logprobs 21", "sampling.logprobs must be in [0, 20]"},
        {"min_tokens 20 > max_tokens", "sampling.min_tokens must be in [0, max_tokens = 16], got 20"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct request_params q = request_params_default();
        switch (i) {
        case 0: q.sampling.temperature = 100.5f; break;
        case 1: q.sampling.repetition_penalty = 0; break;
        case 2: q.sampling.repetition_penalty = 11; break;
        case 3: q.sampling.top_k = 513; break;
        case 4: q.sampling.top_p = 0; break;
        case 5: q.n = 17; break;
        case 6: q.logprobs = 21; break;
        default: q.min_tokens = 20; break;
        }
        check_status(request_validate(prompt, 3, &q, &b), STATUS_INVALID_ARGUMENT, bad[i].what, bad[i].needle, NULL);
        if (i <= 4 && i != 3) /* the sampler's own check reads the same rows (it knows no vocabulary) */
            check_status(sampling_params_validate(&q.sampling), STATUS_INVALID_ARGUMENT, bad[i].what, bad[i].needle,
                         NULL);
    }
    struct request_params nan = request_params_default();
    nan.sampling.min_p = 0.0f / 0.0f;
    check_status(request_validate(prompt, 3, &nan, &b), STATUS_INVALID_ARGUMENT, "NaN min_p", "sampling.min_p", NULL);
    struct request_params unset = request_params_default();
    unset.logprobs = -1;
    unset.prompt_logprobs = -1;
    check(request_validate(prompt, 3, &unset, &b) == STATUS_OK, "-1 reads as unset for logprobs");
    struct request_params zero = request_params_default();
    zero.max_tokens = 0;
    check_status(request_validate(prompt, 3, &zero, &b), STATUS_INVALID_ARGUMENT, "max_tokens 0 alone",
                 "sampling.max_tokens must be >= 1 unless prompt_logprobs", NULL);
    zero.prompt_logprobs = 0;
    check(request_validate(prompt, 3, &zero, &b) == STATUS_OK, "max_tokens 0 with prompt_logprobs scores the prompt");
    char id[REQUEST_ID_MAX_BYTES + 2];
    memset(id, 'x', sizeof id - 1);
    id[sizeof id - 1] = 0;
    check_status(request_id_check(id), STATUS_INVALID_ARGUMENT, "a request id of 101 bytes",
                 "request_id must be at most 100 bytes", NULL);
}

/* Waiting samples, the unit of --max-queue: a request not started counts its n; once it forks,
 * each waiting child counts one. */
static void test_waiting_samples(void)
{
    struct pool p;
    pool_open(&p, 32, 1, 64, 0);
    struct seq *a = new_seq_n(10, 3, 4, 3), *b = new_seq(20, 3, 4), *kids[2];
    scheduler_enqueue(&p.s, a);
    scheduler_enqueue(&p.s, b);
    check(scheduler_waiting_samples(&p.s) == 4, "n = 3 and n = 1 waiting: 4 samples (%d)",
          scheduler_waiting_samples(&p.s));
    scheduler_plan(&p.s);
    run_step(&p, 99);
    check(p.s.n_running == 1 && scheduler_waiting_samples(&p.s) == 1, "a admitted (max_seqs 1): b's sample waits");
    check(scheduler_fork(&p.s, a, NULL, kids) == 2 && kids[0] && kids[1], "a forks 2 children");
    check(scheduler_waiting_samples(&p.s) == 3 && p.s.n_waiting == 3, "no room: the children wait, one sample each (%d)",
          scheduler_waiting_samples(&p.s));
    struct request *ra = a->req, *rb = b->req;
    pool_close(&p);
    request_free(ra);
    request_free(rb);
}

int main(void)
{
    test_admission();
    test_preemption();
    test_prefix_reuse();
    test_limits();
    test_waiting_samples();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
