/* tests/test_scheduler.c - the scheduler and the request limits without a model: a CPU KV pool
 * of tiny blocks, requests built with request_new, steps "run" by scheduler_commit. Checks
 * admission under the token budget and max_seqs (chunked prefill), preemption of the newest
 * running sequence when the pool runs dry (and its return to the front of the queue), prefix
 * block reuse by hash and the blocks' release, the waiting samples that --max-queue counts, the
 * admission order of each scheduling policy (fcfs; fair between clients and priority, each with
 * its preemption), and the one limits table (engine and sampler agree, messages name the field and
 * its bounds).
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

static void pool_open_policy(struct pool *p, int n_blocks, int max_seqs, int max_batch_tokens, int prefix_caching,
                             enum scheduling_policy policy)
{
    memset(p, 0, sizeof *p);
    CHECK(backend_open(DEVICE_CPU, 0, 1, &p->b) == STATUS_OK, "cpu backend: %s", status_message());
    CHECK(kv_cache_init(&p->cache, p->b, 1, n_blocks, BT, 1, 4, DTYPE_F32) == STATUS_OK, "kv: %s", status_message());
    struct scheduler_options o = {.max_seqs = max_seqs, .max_batch_tokens = max_batch_tokens, .max_logits = 16,
                                  .table_width = 16, .prefix_caching = prefix_caching, .policy = policy};
    CHECK(scheduler_init(&p->s, &p->cache, &o) == STATUS_OK, "scheduler: %s", status_message());
}

static void pool_open(struct pool *p, int n_blocks, int max_seqs, int max_batch_tokens, int prefix_caching)
{
    pool_open_policy(p, n_blocks, max_seqs, max_batch_tokens, prefix_caching, SCHEDULING_FCFS);
}

static void pool_close(struct pool *p)
{
    scheduler_free(&p->s);
    kv_cache_free(&p->cache);
    backend_close(p->b);
}

/* A request of n_prompt tokens first, first + 1, ... and n samples (its own request; freed by
 * finish). */
static struct seq *new_seq_full(int first, int n_prompt, int max_tokens, int n, const char *client, int priority)
{
    int32_t prompt[64];
    for (int i = 0; i < n_prompt; i++) prompt[i] = first + i;
    struct request_params rp = request_params_default();
    rp.max_tokens = max_tokens;
    rp.n = n;
    rp.client = client;
    rp.priority = priority;
    struct request *r;
    CHECK(request_new(prompt, n_prompt, &rp, on_event, NULL, &r) == STATUS_OK, "request_new");
    struct seq *q = seq_new(r, 0, NULL);
    CHECK(q, "seq_new");
    return q;
}

static struct seq *new_seq_n(int first, int n_prompt, int max_tokens, int n)
{
    return new_seq_full(first, n_prompt, max_tokens, n, NULL, 0);
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
    /* A logit_bias key twice (a raw protobuf map can carry it): each entry is added, so two of 100
     * would be 200, past the bound on one. */
    struct request_params twice = request_params_default();
    int32_t bias_ids[2] = {5, 5};
    float bias_values[2] = {100.0f, 100.0f};
    twice.logit_bias_ids = bias_ids;
    twice.logit_bias_values = bias_values;
    twice.n_logit_bias = 2;
    check_status(request_validate(prompt, 3, &twice, &b), STATUS_INVALID_ARGUMENT, "logit_bias token 5 twice",
                 "sampling.logit_bias: token 5 appears twice", NULL);
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
    check(p.s.n_running == 1 && scheduler_waiting_samples(&p.s) == 3,
          "a admitted (max_seqs 1): its 2 unforked samples and b's wait (%d)", scheduler_waiting_samples(&p.s));
    check(scheduler_fork(&p.s, a, NULL, kids) == 2 && kids[0] && kids[1], "a forks 2 children");
    check(scheduler_waiting_samples(&p.s) == 3 && p.s.n_waiting == 3, "no room: the children wait, one sample each (%d)",
          scheduler_waiting_samples(&p.s));
    struct request *ra = a->req, *rb = b->req;
    pool_close(&p);
    request_free(ra);
    request_free(rb);
}

/* The host rows kept beside each slot (struct kv_cache.features: an EAGLE head's inputs) travel
 * with the K/V: a fork's copy of its parent's partial block carries them, and a prefix-cache hit
 * hands out the block that holds them. */
static void test_slot_features(void)
{
    struct pool p;
    pool_open(&p, 16, 4, 64, 1);
    check(kv_cache_features_init(&p.cache, 2) == STATUS_OK && p.cache.feature_width == 2, "features of 2 floats a slot");
    struct seq *a = new_seq_n(10, BT + 3, 4, 2), *kids[1];
    scheduler_enqueue(&p.s, a);
    scheduler_plan(&p.s);
    int32_t slots[BT + 3];
    float rows[2 * (BT + 3)];
    for (int i = 0; i < BT + 3; i++) {
        slots[i] = a->blocks[i / BT] * BT + i % BT;
        rows[2 * i] = (float)i, rows[2 * i + 1] = -1.0f - (float)i;
    }
    kv_cache_write_features(&p.cache, slots, BT + 3, rows); /* as the engine does after the forward */
    run_step(&p, 99);
    check(scheduler_fork(&p.s, a, NULL, kids) == 1 && kids[0], "a forks its second sample");
    const struct seq *k = kids[0];
    int same = k->n_cached == BT + 3 && k->blocks[0] == a->blocks[0] && k->blocks[1] != a->blocks[1];
    for (int i = 0; same && i < BT + 3; i++) {
        const float *f = kv_cache_feature(&p.cache, (int64_t)k->blocks[i / BT] * BT + i % BT);
        same = f[0] == (float)i && f[1] == -1.0f - (float)i;
    }
    check(same, "the fork shares the full block and its copy of the partial one holds the same features");
    struct request *ra = a->req;
    pool_close(&p);
    request_free(ra);
}

/* The defect of issue 18: client A queues many samples, client B one short request, with room
 * for 2 running at once. FCFS admits A's in arrival order before B's; fair admits B as soon as
 * it has fewer running than A (at once here: A has 1 running when B's turn is weighed). */
static void test_policy_fcfs_fair(void)
{
    for (int fair = 0; fair < 2; fair++) {
        struct pool p;
        pool_open_policy(&p, 64, 2, 64, 0, fair ? SCHEDULING_FAIR : SCHEDULING_FCFS);
        struct seq *a[4], *b;
        for (int i = 0; i < 4; i++) scheduler_enqueue(&p.s, a[i] = new_seq_full(10 * i, 3, 4, 1, "key-a", 0));
        scheduler_enqueue(&p.s, b = new_seq_full(90, 3, 4, 1, "key-b", 0));
        scheduler_plan(&p.s);
        if (!fair)
            check(p.s.running[0] == a[0] && p.s.running[1] == a[1] && b->state == SEQ_WAITING,
                  "fcfs: A's first two samples run, B waits behind A's other two");
        else
            check(p.s.running[0] == a[0] && p.s.running[1] == b && p.s.n_waiting == 3 && p.s.waiting[0] == a[1],
                  "fair: A's first sample, then B's (A already has one running); A's others wait in order");
        run_step(&p, 7);
        finish(&p, a[0]);
        scheduler_drop_finished(&p.s);
        scheduler_plan(&p.s);
        if (!fair)
            check(p.s.running[1] == a[2] && b->state == SEQ_WAITING, "fcfs: A's third sample takes the freed slot");
        else
            check(p.s.running[1] == a[1] && p.s.waiting[0] == a[2],
                  "fair: A (0 running) takes the slot A freed; B keeps its own");
        for (int i = 1; i < 4; i++) finish(&p, a[i]);
        finish(&p, b);
        scheduler_drop_finished(&p.s);
        pool_close(&p);
    }
    /* Fair between three clients: admission takes the least-served client's first waiting
     * sample, ties in queue order; anonymous requests (no client) are one client. */
    struct pool p;
    pool_open_policy(&p, 64, 5, 64, 0, SCHEDULING_FAIR);
    struct seq *q[7];
    const char *who[7] = {"a", "a", "a", "b", "b", NULL, NULL};
    for (int i = 0; i < 7; i++) scheduler_enqueue(&p.s, q[i] = new_seq_full(10 * i, 2, 4, 1, who[i], 0));
    scheduler_plan(&p.s);
    check(p.s.n_running == 5 && p.s.running[0] == q[0] && p.s.running[1] == q[3] && p.s.running[2] == q[5] &&
              p.s.running[3] == q[1] && p.s.running[4] == q[4],
          "fair: a, b, anonymous, then a and b again (round robin by running count)");
    check(p.s.n_waiting == 2 && p.s.waiting[0] == q[2] && p.s.waiting[1] == q[6], "the rest wait in arrival order");
    for (int i = 0; i < 7; i++) finish(&p, q[i]);
    scheduler_drop_finished(&p.s);
    pool_close(&p);

    /* Fair with every slot taken by one client: a newcomer preempts that client's newest
     * sample while the client runs at least two more than the newcomer's; one client alone
     * never preempts itself. */
    pool_open_policy(&p, 64, 4, 64, 0, SCHEDULING_FAIR);
    struct seq *a[6], *nc[4];
    for (int i = 0; i < 6; i++) scheduler_enqueue(&p.s, a[i] = new_seq_full(10 * i, 2, 8, 1, "a", 0));
    scheduler_plan(&p.s);
    run_step(&p, 7);
    scheduler_plan(&p.s);
    check(p.s.n_running == 4 && p.s.preemptions == 0 && p.s.n_waiting == 2, "one client alone: FCFS, no preemption");
    const char *names[4] = {"b", "c", "d", "e"};
    for (int k = 0; k < 4; k++) {
        run_step(&p, 7);
        scheduler_enqueue(&p.s, nc[k] = new_seq_full(80 + k, 2, 8, 1, names[k], 0));
        scheduler_plan(&p.s);
    }
    check(p.s.preemptions == 3 && a[0]->state == SEQ_RUNNING && a[1]->state == SEQ_WAITING &&
              a[2]->state == SEQ_WAITING && a[3]->state == SEQ_WAITING,
          "b, c and d each preempt a's newest running sample (a: 4, 3, 2 running)");
    check(nc[0]->state == SEQ_RUNNING && nc[1]->state == SEQ_RUNNING && nc[2]->state == SEQ_RUNNING &&
              nc[3]->state == SEQ_WAITING,
          "e waits: every client runs one, so nobody runs two more than e");
    struct request *ra[10];
    for (int i = 0; i < 6; i++) ra[i] = a[i]->req;
    for (int k = 0; k < 4; k++) ra[6 + k] = nc[k]->req;
    pool_close(&p);
    for (int i = 0; i < 10; i++) request_free(ra[i]);
}

/* Priority: lower values first, ties in arrival order; an arrival that outranks the running
 * set preempts its lowest-priority, newest sequence for a slot or for blocks; equal priority
 * never preempts. */
static void test_policy_priority(void)
{
    struct pool p;
    pool_open_policy(&p, 64, 2, 64, 0, SCHEDULING_PRIORITY);
    struct seq *a = new_seq_full(10, 3, 8, 1, NULL, 5), *b = new_seq_full(20, 3, 8, 1, NULL, 1),
               *c = new_seq_full(30, 3, 8, 1, NULL, 1), *d = new_seq_full(40, 3, 8, 1, NULL, -2);
    scheduler_enqueue(&p.s, a);
    scheduler_enqueue(&p.s, b);
    scheduler_enqueue(&p.s, c);
    scheduler_enqueue(&p.s, d);
    scheduler_plan(&p.s);
    check(p.s.n_running == 2 && p.s.running[0] == d && p.s.running[1] == b && p.s.preemptions == 0,
          "priority: -2 then the first of the two 1s");
    run_step(&p, 7);
    struct seq *e = new_seq_full(50, 3, 8, 1, NULL, 1);
    scheduler_enqueue(&p.s, e);
    scheduler_plan(&p.s);
    check(p.s.preemptions == 0 && c->state == SEQ_WAITING && e->state == SEQ_WAITING,
          "a waiting 1 does not preempt a running 1 (max_seqs full)");
    run_step(&p, 7);
    struct seq *f = new_seq_full(60, 3, 8, 1, NULL, 0);
    scheduler_enqueue(&p.s, f);
    scheduler_plan(&p.s);
    check(p.s.preemptions == 1 && b->state == SEQ_WAITING && b->n_blocks == 0 && f->state == SEQ_RUNNING &&
              p.s.running[0] == d && p.s.running[1] == f,
          "a 0 arrives: the running 1 (the lowest priority) is preempted and the 0 admitted in the same plan");
    check(p.s.n_waiting == 4 && p.s.waiting[0] == b && p.s.waiting[3] == e,
          "the preempted 1 waits at the front, ahead of the 1s that never ran");
    run_step(&p, 7);
    finish(&p, d);
    scheduler_drop_finished(&p.s);
    scheduler_plan(&p.s);
    check(p.s.running[1] == b && b->n_rows == b->n_tokens, "the freed slot goes to the preempted 1 (recomputed)");
    struct request *rs[6] = {a->req, b->req, c->req, e->req, f->req};
    pool_close(&p);
    for (int i = 0; i < 5; i++) request_free(rs[i]);

    /* Pool dry: growing sequences preempt the lowest priority first (here the oldest one), and
     * an urgent arrival preempts for blocks, not only for slots. */
    pool_open_policy(&p, 4, 4, 64, 0, SCHEDULING_PRIORITY);
    struct seq *low = new_seq_full(10, BT, 8, 1, NULL, 3), *mid = new_seq_full(20, BT, 8, 1, NULL, 1),
               *top = new_seq_full(30, BT, 8, 1, NULL, 0);
    scheduler_enqueue(&p.s, low);
    scheduler_plan(&p.s);
    run_step(&p, 7);
    scheduler_enqueue(&p.s, mid);
    scheduler_enqueue(&p.s, top);
    scheduler_plan(&p.s); /* low takes its second block, mid and top one each: the pool is empty */
    check(p.s.n_running == 3 && p.cache.n_free == 0 && p.s.running[0] == low,
          "three run (the newcomers appended; the next plan sorts them by priority)");
    run_step(&p, 7);
    scheduler_plan(&p.s);
    check(p.s.preemptions == 1 && low->state == SEQ_WAITING && mid->n_blocks == 2 && top->n_blocks == 2,
          "the pool runs dry: the lowest priority is preempted, though the oldest");
    struct seq *urgent = new_seq_full(40, 2 * BT, 8, 1, NULL, -1);
    run_step(&p, 7);
    scheduler_enqueue(&p.s, urgent);
    scheduler_plan(&p.s);
    check(urgent->state == SEQ_RUNNING && mid->state == SEQ_WAITING && top->state == SEQ_RUNNING &&
              p.s.preemptions == 2,
          "an arrival of priority -1 needing 2 blocks preempts the 1 for them (the 0 keeps running)");
    struct request *rq[4] = {low->req, mid->req, top->req, urgent->req};
    pool_close(&p);
    for (int i = 0; i < 4; i++) request_free(rq[i]);

    /* A priority other than 0 is refused unless the engine schedules by priority (as vLLM). */
    const struct request_bounds bf = {.vocab_size = 512, .max_positions = 512}, bp = {
        .vocab_size = 512, .max_positions = 512, .scheduling = SCHEDULING_PRIORITY};
    int32_t prompt[2] = {1, 2};
    struct request_params rp = request_params_default();
    rp.priority = 3;
    check_status(request_validate(prompt, 2, &rp, &bf), STATUS_INVALID_ARGUMENT, "priority 3 under fcfs",
                 "priority must be 0 unless the server schedules by priority", NULL);
    check(request_validate(prompt, 2, &rp, &bp) == STATUS_OK, "priority 3 under the priority policy");
}

/* The logits rows of one step never exceed max_logits (16 here): 10 decoding sequences take 10,
 * so a prompt that asks for its log-probabilities gets at most 6 rows with logits this step, and
 * drafts (speculation) count their rows too. */
static void test_logits_budget(void)
{
    struct pool p;
    pool_open(&p, 64, 16, 64, 0);
    struct seq *d[10];
    for (int i = 0; i < 10; i++) {
        d[i] = new_seq(100 + 10 * i, 2, 8);
        scheduler_enqueue(&p.s, d[i]);
    }
    scheduler_plan(&p.s);
    run_step(&p, 7); /* prompts done, each decoding now */
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 300 + i;
    struct request_params rp = request_params_default();
    rp.max_tokens = 4;
    rp.prompt_logprobs = 0;
    struct request *r;
    CHECK(request_new(prompt, 40, &rp, on_event, NULL, &r) == STATUS_OK, "request_new");
    struct seq *lp = seq_new(r, 0, NULL);
    scheduler_enqueue(&p.s, lp);
    d[0]->tokens[d[0]->n_tokens++] = 9; /* three drafts after its real token */
    d[0]->tokens[d[0]->n_tokens++] = 9;
    d[0]->tokens[d[0]->n_tokens++] = 9;
    d[0]->n_draft = 3;
    scheduler_plan(&p.s);
    const struct step_batch *b = &p.s.batch;
    check(b->n_logits <= 16 && d[0]->n_rows == 4 && lp->n_rows > 0,
          "logits rows within max_logits 16 with 10 decoding, 3 drafts and a prompt asking for log-probabilities "
          "(%d logits rows, the drafted sequence %d rows, the prompt %d)", b->n_logits, d[0]->n_rows, lp->n_rows);
    for (int i = 0; i < 10; i++) finish(&p, d[i]);
    finish(&p, lp);
    pool_close(&p);
}

/* Drafts ride on the blocks the pool has once every running sequence's real rows have theirs:
 * they never preempt (the older sequence's four drafts would need two more blocks; the pool has
 * two, one of them the newer sequence's next row's), and the drafts left out are not verified. */
static void test_drafts_never_preempt(void)
{
    struct pool p;
    pool_open(&p, 4, 4, 64, 0);
    struct seq *a = new_seq(10, BT, 8), *b = new_seq(20, BT, 8);
    scheduler_enqueue(&p.s, a);
    scheduler_enqueue(&p.s, b);
    scheduler_plan(&p.s);
    run_step(&p, 7); /* each holds 5 tokens: its next row needs a second block; two are free */
    for (int i = 0; i < 4; i++) a->tokens[a->n_tokens++] = 9;
    a->n_draft = 4;
    scheduler_plan(&p.s);
    const struct step_batch *bt = &p.s.batch;
    check(p.s.preemptions == 0 && p.s.n_running == 2 && b->n_rows == 1 && b->wants_sample,
          "four drafts needing two blocks preempt no one (%llu preemptions, %d running, the newer %d rows)",
          (unsigned long long)p.s.preemptions, p.s.n_running, b->n_rows);
    check(a->n_rows == 4 && a->wants_sample && a->n_blocks == 2 && b->n_blocks == 2 && p.cache.n_free == 0 &&
              bt->n_logits == 5,
          "the drafted sequence runs its real row and the three drafts its second block holds (%d rows, %d logits rows)",
          a->n_rows, bt->n_logits);
    a->n_tokens -= a->n_draft, a->n_draft = 0;
    finish(&p, a);
    finish(&p, b);
    pool_close(&p);
}

int main(void)
{
    test_drafts_never_preempt();
    test_logits_budget();
    test_admission();
    test_preemption();
    test_prefix_reuse();
    test_limits();
    test_waiting_samples();
    test_slot_features();
    test_policy_fcfs_fair();
    test_policy_priority();
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
