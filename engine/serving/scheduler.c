/* engine/serving/scheduler.c - continuous batching for one replica (see scheduler.h): the
 * waiting queue, admission, preemption, prefix reuse, block allocation and the step's rows.
 * Not here: what a row computes (conductor.c, model.c), requests and events (request.c).
 * Tests: tests/test_scheduler.c, tests/test_engine.c. */
#include "scheduler.h"

#include <stdlib.h>
#include <string.h>

#define MODULE "scheduler"

enum status scheduler_init(struct scheduler *s, struct kv_cache *cache, const struct scheduler_options *o)
{
    memset(s, 0, sizeof *s);
    s->o = *o;
    s->cache = cache;
    const size_t T = (size_t)o->max_batch_tokens, S = (size_t)o->max_seqs;
    struct step_batch *b = &s->batch;
    b->table_width = o->table_width;
    b->tokens = malloc(T * sizeof(int32_t));
    b->pos = malloc(T * sizeof(int32_t));
    b->slots = malloc(T * sizeof(int32_t));
    b->rows = malloc((size_t)o->max_logits * sizeof(int32_t));
    b->qstart = malloc((S + 1) * sizeof(int32_t));
    b->seqlen = malloc(S * sizeof(int32_t));
    b->table = malloc(S * (size_t)o->table_width * sizeof(int32_t));
    b->adapter = malloc(S * sizeof(int32_t));
    b->row_path = malloc(S * sizeof(int32_t));
    s->running = calloc(S, sizeof *s->running);
    s->planned = calloc(S, sizeof *s->planned);
    s->client_keys = calloc(S, sizeof *s->client_keys);
    s->client_running = calloc(S, sizeof *s->client_running);
    if (!b->tokens || !b->pos || !b->slots || !b->rows || !b->qstart || !b->seqlen || !b->table || !b->adapter || !b->row_path ||
        !s->running || !s->planned || !s->client_keys || !s->client_running)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory for the step buffers");
    return STATUS_OK;
}

void scheduler_free(struct scheduler *s)
{
    for (int i = 0; i < s->n_running; i++) seq_free(s->running[i]);
    for (int i = 0; i < s->n_waiting; i++) seq_free(s->waiting[i]);
    free(s->running);
    free(s->planned);
    free(s->client_keys);
    free(s->client_running);
    free(s->waiting);
    free(s->copies);
    struct step_batch *b = &s->batch;
    free(b->tokens);
    free(b->pos);
    free(b->slots);
    free(b->rows);
    free(b->qstart);
    free(b->seqlen);
    free(b->table);
    free(b->adapter);
    free(b->row_path);
    memset(s, 0, sizeof *s);
}

/* ---- the waiting queue -------------------------------------------------------------------- */

/* The queue is kept as a plain array in order (front at 0): intake volumes are small next to
 * a model step, so O(n) moves cost nothing measurable. */
static void waiting_push(struct scheduler *s, struct seq *q, int front)
{
    CHECK(base_grow((void **)&s->waiting, &s->cap_waiting, (size_t)s->n_waiting + 1, sizeof *s->waiting) == 0,
          "engine: out of memory growing the waiting queue");
    if (front) {
        memmove(s->waiting + 1, s->waiting, (size_t)s->n_waiting * sizeof *s->waiting);
        s->waiting[0] = q;
    } else {
        s->waiting[s->n_waiting] = q;
    }
    s->n_waiting++;
    q->state = SEQ_WAITING;
}

static void waiting_remove(struct scheduler *s, int i)
{
    memmove(s->waiting + i, s->waiting + i + 1, (size_t)(s->n_waiting - 1 - i) * sizeof *s->waiting);
    s->n_waiting--;
}

void scheduler_enqueue(struct scheduler *s, struct seq *q) { waiting_push(s, q, 0); }

/* ---- the running set ------------------------------------------------------------------------ */

static int priority_of(const struct seq *q) { return q->req ? q->req->p.priority : 0; }

/* Appends q to the running set (SEQ_RUNNING); the caller has checked that there is room.
 * Appending, never inserting: the conductor walks running[0..n) of a step while forks join. */
static void running_add(struct scheduler *s, struct seq *q)
{
    s->running[s->n_running++] = q;
    q->state = SEQ_RUNNING;
    q->order = s->next_order++;
}

/* SCHEDULING_PRIORITY, at the start of a plan: the running set by priority (lower first), in
 * admission order within one (a stable insertion sort: at most max_seqs, mostly in order), so
 * that the last running sequence is always the one to preempt. */
static void running_sort_by_priority(struct scheduler *s)
{
    for (int i = 1; i < s->n_running; i++) {
        struct seq *q = s->running[i];
        int j = i;
        for (; j > 0 && priority_of(s->running[j - 1]) > priority_of(q); j--) s->running[j] = s->running[j - 1];
        s->running[j] = q;
    }
}

/* ---- admission order ------------------------------------------------------------------------ */

static uint64_t client_of(const struct seq *q) { return q->req ? q->req->client_key : 0; }

/* SCHEDULING_FAIR: the running sequences of client key (linear: a few clients at most max_seqs). */
static int client_slot(const struct scheduler *s, uint64_t key)
{
    for (int i = 0; i < s->n_clients; i++)
        if (s->client_keys[i] == key) return i;
    return -1;
}

static void clients_count(struct scheduler *s)
{
    s->n_clients = 0;
    for (int i = 0; i < s->n_running; i++) {
        uint64_t key = client_of(s->running[i]);
        int c = client_slot(s, key);
        if (c < 0) {
            c = s->n_clients++;
            s->client_keys[c] = key;
            s->client_running[c] = 0;
        }
        s->client_running[c]++;
    }
}

/* The index in the waiting queue of the sequence the policy admits next (n_waiting > 0). */
static int next_waiting(const struct scheduler *s)
{
    int best = 0;
    switch (s->o.policy) {
    case SCHEDULING_FCFS: break;
    case SCHEDULING_FAIR: {
        int best_n = 1 << 30;
        for (int i = 0; i < s->n_waiting && best_n > 0; i++) {
            int c = client_slot(s, client_of(s->waiting[i]));
            int n = c < 0 ? 0 : s->client_running[c];
            if (n < best_n) best = i, best_n = n;
        }
        break;
    }
    case SCHEDULING_PRIORITY:
        for (int i = 1; i < s->n_waiting; i++)
            if (priority_of(s->waiting[i]) < priority_of(s->waiting[best])) best = i;
        break;
    }
    return best;
}

/* ---- blocks --------------------------------------------------------------------------------- */

/* Returns q's blocks and forgets what the cache held for it. */
static void forget_blocks(struct scheduler *s, struct seq *q)
{
    kv_cache_release(s->cache, q->n_blocks, q->blocks);
    q->n_blocks = 0;
    q->n_cached = 0;
    q->n_registered = 0;
    q->last_hash = 0;
}

void scheduler_release(struct scheduler *s, struct seq *q)
{
    kv_cache_release(s->cache, q->n_blocks, q->blocks);
    q->n_blocks = 0;
    q->n_cached = 0;
}

/* Frees a running sequence's blocks and sends it back to the front of the queue; its tokens
 * (prompt and generated so far) are recomputed when it is admitted again. */
static void preempt(struct scheduler *s, struct seq *q)
{
    q->n_tokens -= q->n_draft; /* drafts are not the sequence's: never recomputed as if they were */
    q->n_draft = 0;
    forget_blocks(s, q);
    q->n_rows = 0;
    q->wants_sample = 0;
    waiting_push(s, q, 1);
    s->preemptions++;
    LOG_DEBUG(MODULE, "req=%s preempted sample %d at %d tokens", q->req->id, q->sample, q->n_tokens);
}

/* Makes the sequence's block table cover n tokens, preempting the newest running sequences
 * when the pool is dry. Returns 0 when q itself had to be preempted (it is then waiting). */
static int ensure_blocks(struct scheduler *s, struct seq *q, int n)
{
    const int bt = s->cache->block_tokens, need = (n + bt - 1) / bt - q->n_blocks;
    if (need <= 0) return 1;
    if (base_grow((void **)&q->blocks, &q->cap_blocks, (size_t)(q->n_blocks + need), sizeof *q->blocks) != 0) return 0;
    while (kv_cache_available(s->cache) < need) {
        struct seq *victim = s->running[s->n_running - 1];
        s->n_running--;
        preempt(s, victim);
        if (victim == q) return 0;
    }
    CHECK(kv_cache_alloc(s->cache, need, q->blocks + q->n_blocks) == STATUS_OK, "kv alloc after check");
    q->n_blocks += need;
    return 1;
}

/* The hash a sequence's next block chains from: its last registered block's, or, for the first
 * block, its request's cache_seed (its adapter's key, 0 for the base, mixed with a cache salt), so
 * that KV computed under one adapter or salt never serves another. */
static uint64_t chain_hash(const struct seq *q)
{
    return q->n_registered ? q->last_hash : q->req ? q->req->cache_seed : 0;
}

/* Reuses cached blocks for the leading full blocks of the tokens to compute, leaving at least
 * one row to run (its logits are needed). */
static void reuse_prefix(struct scheduler *s, struct seq *q)
{
    const int bt = s->cache->block_tokens;
    if (!s->o.prefix_caching || q->req->p.prompt_logprobs >= 0 || q->n_cached != 0) return;
    if (base_grow((void **)&q->blocks, &q->cap_blocks, (size_t)(q->n_tokens / bt + 1), sizeof *q->blocks) != 0) return;
    while ((q->n_registered + 1) * bt <= q->n_tokens - 1) {
        const int32_t *t = q->tokens + (size_t)q->n_registered * bt;
        uint64_t h = kv_cache_hash(chain_hash(q), t, bt);
        int32_t b = kv_cache_lookup(s->cache, h, t);
        if (b < 0) break;
        q->blocks[q->n_blocks++] = b;
        q->n_registered++;
        q->last_hash = h;
        q->n_cached += bt;
    }
}

void scheduler_commit(struct scheduler *s, struct seq *q)
{
    const int bt = s->cache->block_tokens;
    q->n_cached += q->n_rows;
    if (!s->o.prefix_caching) return;
    while ((q->n_registered + 1) * bt <= q->n_cached) {
        const int32_t *t = q->tokens + (size_t)q->n_registered * bt;
        uint64_t h = kv_cache_hash(chain_hash(q), t, bt);
        kv_cache_register(s->cache, q->blocks[q->n_registered], h, t);
        q->n_registered++;
        q->last_hash = h;
    }
}

/* ---- planning ------------------------------------------------------------------------------- */

static int wants_prompt_logprobs(const struct seq *q)
{
    const struct request *r = q->req;
    return r->p.prompt_logprobs >= 0 && !r->prompt_lp_sent && q->sample == 0;
}

/* Adds q's next `take` rows to the step being planned. */
static void plan_rows(struct scheduler *s, struct seq *q, int take)
{
    struct step_batch *b = &s->batch;
    const int bt = s->cache->block_tokens;
    q->row_start = b->n_rows;
    q->n_rows = take;
    q->logit_row = b->n_logits;
    for (int j = 0; j < take; j++) {
        int p = q->n_cached + j, row = b->n_rows + j;
        b->tokens[row] = q->tokens[p];
        b->pos[row] = p;
        b->slots[row] = q->blocks[p / bt] * bt + p % bt;
    }
    /* Drafts (speculation) ride after the last real token: every row from it on has logits, and
     * the rows of drafts the budget left out are simply not verified. */
    const int real_end = q->n_tokens - q->n_draft;
    q->wants_sample = q->n_cached + take >= real_end;
    const int lp_rows = wants_prompt_logprobs(q);
    for (int j = 0; j < take; j++) {
        int p = q->n_cached + j;
        if ((lp_rows && p + 1 < q->req->n_prompt) || (q->wants_sample && (j == take - 1 || p >= real_end - 1)))
            b->rows[b->n_logits++] = b->n_rows + j;
    }
    int k = b->n_seqs;
    b->qstart[k] = b->n_rows;
    b->seqlen[k] = q->n_cached + take;
    b->adapter[k] = q->req->adapter;
    b->row_path[k] = q->n_draft > 0;
    memcpy(b->table + (size_t)k * b->table_width, q->blocks, (size_t)q->n_blocks * sizeof *q->blocks);
    b->n_seqs++;
    b->n_rows += take;
    if (q->n_cached < q->req->n_prompt) b->prefill_rows += take;
}

/* The logits rows that `take` rows of q need (plan_rows marks the same ones): prompt rows whose
 * log-probabilities are asked, and, when the rows reach q's last real token, that token's row
 * and every draft's. */
static int logit_rows(const struct seq *q, int take)
{
    const int real_end = q->n_tokens - q->n_draft, lp = wants_prompt_logprobs(q);
    const int sample = q->n_cached + take >= real_end;
    int n = 0;
    for (int j = 0; j < take; j++) {
        const int p = q->n_cached + j;
        n += (lp && p + 1 < q->req->n_prompt) || (sample && (j == take - 1 || p >= real_end - 1));
    }
    return n;
}

/* Rows q may run this step: its pending tokens up to `upto` (its last real token, or its last
 * draft), bounded by the token budget and by the logits rows the step has left (max_logits less
 * those of the sequences decided before q). */
static int rows_for(const struct scheduler *s, const struct seq *q, int upto, int budget)
{
    int take = upto - q->n_cached;
    if (take > budget) take = budget;
    const int logits_left = s->o.max_logits - s->logits_planned;
    if (wants_prompt_logprobs(q) && take > logits_left - 1) take = logits_left - 1;
    while (take > 0 && logit_rows(q, take) > logits_left) take--;
    return take > 0 ? take : 0;
}

/* Admits waiting[i] if its rows and blocks fit; returns the rows planned (0: it stays waiting,
 * and so does every sequence the policy orders after it). */
static int admit(struct scheduler *s, int i, int budget)
{
    struct seq *q = s->waiting[i];
    int reused_before = q->n_cached;
    reuse_prefix(s, q);
    int take = rows_for(s, q, q->n_tokens, budget);
    const int bt = s->cache->block_tokens;
    int need = (q->n_cached + take + bt - 1) / bt - q->n_blocks;
    if (take == 0 || kv_cache_available(s->cache) < need ||
        base_grow((void **)&q->blocks, &q->cap_blocks, (size_t)(q->n_blocks + need), sizeof *q->blocks) != 0) {
        /* Not now: give the reused prefix back so it does not pin blocks while waiting. */
        forget_blocks(s, q);
        return 0;
    }
    CHECK(kv_cache_alloc(s->cache, need, q->blocks + q->n_blocks) == STATUS_OK, "kv alloc after check");
    q->n_blocks += need;
    waiting_remove(s, i);
    if (!q->prefix_checked) {
        q->prefix_checked = 1;
        q->t_admit = base_now_s();
        q->cached_prompt_tokens = q->n_cached < q->req->n_prompt ? q->n_cached : q->req->n_prompt;
        s->batch.hit_tokens += q->cached_prompt_tokens - reused_before;
    }
    running_add(s, q);
    q->n_rows = take;
    s->planned[s->n_planned++] = q;
    s->logits_planned += logit_rows(q, take);
    if (s->o.policy == SCHEDULING_FAIR) {
        int c = client_slot(s, client_of(q));
        if (c < 0) {
            c = s->n_clients++;
            s->client_keys[c] = client_of(q);
            s->client_running[c] = 0;
        }
        s->client_running[c]++;
    }
    return take;
}

/* The step's sequences enter the batch grouped by serving adapter (stable: otherwise in running
 * order), so that each adapter's low-rank products run once over one contiguous run of rows
 * (model.c); the base's rows come first. Insertion sort: at most max_seqs, mostly in order. */
static void group_by_adapter(struct scheduler *s)
{
    for (int i = 1; i < s->n_planned; i++) {
        struct seq *q = s->planned[i];
        int j = i;
        for (; j > 0 && s->planned[j - 1]->req->adapter > q->req->adapter; j--) s->planned[j] = s->planned[j - 1];
        s->planned[j] = q;
    }
}

/* Whether waiting q would find a running slot and the blocks of its first chunk (blocks its
 * prefix could reuse are not counted: making room may preempt one sequence more than needed). */
static int room_for(const struct scheduler *s, const struct seq *q)
{
    const int bt = s->cache->block_tokens;
    int first = q->n_tokens - q->n_cached;
    if (first > s->o.max_batch_tokens) first = s->o.max_batch_tokens;
    const int need = (q->n_cached + first + bt - 1) / bt - q->n_blocks;
    return s->n_running < s->o.max_seqs && kv_cache_available(s->cache) >= need;
}

/* Before the running sequences are planned (none is planned yet, so any may leave): the
 * sequence the policy admits next takes running ones' place when it finds no room.
 *   SCHEDULING_PRIORITY: the last running sequences while their priority is strictly lower
 *     (a higher value) than its own; equal priorities never preempt each other.
 *   SCHEDULING_FAIR: the newest running sequence of the most-served client, while that client
 *     has at least two running sequences more than the waiting one's client: after the swap the
 *     waiting client still has no more than the other, so the two never preempt each other in
 *     turn. One client alone (or requests without a client) never preempts: FCFS exactly.
 * Only one waiting sequence a step makes room; the victims wait at the queue's front. */
static void preempt_for_policy(struct scheduler *s)
{
    if (s->n_waiting == 0 || s->o.policy == SCHEDULING_FCFS) return;
    if (s->o.policy == SCHEDULING_FAIR) clients_count(s);
    const struct seq *q = s->waiting[next_waiting(s)];
    while (s->n_running > 0 && !room_for(s, q)) {
        int v = s->n_running - 1;
        if (s->o.policy == SCHEDULING_PRIORITY) {
            if (priority_of(s->running[v]) <= priority_of(q)) return;
        } else {
            int top = 0, mine = client_slot(s, client_of(q));
            for (int c = 1; c < s->n_clients; c++)
                if (s->client_running[c] > s->client_running[top]) top = c;
            if ((mine < 0 ? 0 : s->client_running[mine]) + 1 >= s->client_running[top]) return;
            while (client_of(s->running[v]) != s->client_keys[top]) v--;
            s->client_running[top]--;
        }
        struct seq *victim = s->running[v];
        memmove(s->running + v, s->running + v + 1, (size_t)(s->n_running - 1 - v) * sizeof *s->running);
        s->n_running--;
        preempt(s, victim);
    }
}

/* The rows of planned q's drafts (speculation), once every running sequence's real rows have
 * their blocks: as many as the budget, the step's logits rows and the pool's available blocks
 * allow, never preempting anyone (q included) and never taking a block a real row needs this
 * step; drafts left out are simply not verified. Returns the rows added. */
static int plan_drafts(struct scheduler *s, struct seq *q, int budget)
{
    const int bt = s->cache->block_tokens, had = q->n_rows;
    if (q->n_cached + had < q->n_tokens - q->n_draft) return 0; /* its real rows do not all run */
    s->logits_planned -= logit_rows(q, had);
    int take = rows_for(s, q, q->n_tokens, budget + had);
    const int room = (q->n_blocks + kv_cache_available(s->cache)) * bt - q->n_cached;
    if (take > room) take = room;
    if (take < had) take = had;
    const int need = (q->n_cached + take + bt - 1) / bt - q->n_blocks;
    if (need > 0 && base_grow((void **)&q->blocks, &q->cap_blocks, (size_t)(q->n_blocks + need), sizeof *q->blocks))
        take = had; /* (out of host memory: the drafts are not verified) */
    else if (need > 0) {
        CHECK(kv_cache_alloc(s->cache, need, q->blocks + q->n_blocks) == STATUS_OK, "kv alloc after check");
        q->n_blocks += need;
    }
    q->n_rows = take;
    s->logits_planned += logit_rows(q, take);
    return take - had;
}

int scheduler_plan(struct scheduler *s)
{
    struct step_batch *b = &s->batch;
    b->n_rows = b->n_seqs = b->n_logits = b->prefill_rows = b->hit_tokens = 0;
    s->n_planned = 0;
    s->logits_planned = 0;
    int budget = s->o.max_batch_tokens;
    for (int i = 0; i < s->n_running; i++) s->running[i]->n_rows = 0, s->running[i]->wants_sample = 0;
    if (s->o.policy == SCHEDULING_PRIORITY) running_sort_by_priority(s);
    preempt_for_policy(s);
    /* Real rows are decided (and blocks taken, preempting the last) in running order; a
     * preempted sequence always comes after every one planned before it. Then drafts. */
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        struct seq *q = s->running[i];
        int take = rows_for(s, q, q->n_tokens - q->n_draft, budget);
        if (take == 0) continue;
        if (!ensure_blocks(s, q, q->n_cached + take)) break; /* q itself was preempted: it was last */
        q->n_rows = take;
        s->planned[s->n_planned++] = q;
        s->logits_planned += logit_rows(q, take);
        budget -= take;
    }
    for (int i = 0; i < s->n_planned && budget > 0; i++)
        if (s->planned[i]->n_draft > 0) budget -= plan_drafts(s, s->planned[i], budget);
    if (s->o.policy == SCHEDULING_FAIR) clients_count(s);
    while (s->n_waiting > 0 && s->n_running < s->o.max_seqs && budget > 0) {
        int take = admit(s, next_waiting(s), budget);
        if (take == 0) break;
        budget -= take;
    }
    group_by_adapter(s);
    for (int i = 0; i < s->n_planned; i++) plan_rows(s, s->planned[i], s->planned[i]->n_rows);
    b->qstart[b->n_seqs] = b->n_rows;
    return b->n_rows;
}

void scheduler_drop_finished(struct scheduler *s)
{
    for (int pass = 0; pass < 2; pass++) {
        struct seq **list = pass ? s->waiting : s->running;
        int *n = pass ? &s->n_waiting : &s->n_running, w = 0;
        for (int i = 0; i < *n; i++) {
            if (list[i]->state == SEQ_DONE) seq_free(list[i]);
            else list[w++] = list[i];
        }
        *n = w;
    }
}

/* ---- samples n > 1 -------------------------------------------------------------------------- */

/* Gives c q's full blocks and a copy of its partial last block (copy-on-write, done eagerly
 * since each sample writes its next token there). Returns 0 when no block is free. */
static int share_blocks(struct scheduler *s, struct seq *q, struct seq *c)
{
    const int bt = s->cache->block_tokens;
    int full = q->n_cached / bt, partial = q->n_cached % bt != 0;
    if (base_grow((void **)&c->blocks, &c->cap_blocks, (size_t)q->n_blocks + 1, sizeof *c->blocks) != 0 ||
        (partial && kv_cache_available(s->cache) < 1))
        return 0;
    for (int i = 0; i < full; i++) {
        kv_cache_retain(s->cache, q->blocks[i]);
        c->blocks[c->n_blocks++] = q->blocks[i];
    }
    if (partial) {
        int32_t b;
        CHECK(kv_cache_alloc(s->cache, 1, &b) == STATUS_OK, "kv alloc after check");
        kv_cache_copy_block(s->cache, b, q->blocks[full]);
        if (s->o.record_copies) { /* other ranks repeat the copy before the next step */
            CHECK(base_grow((void **)&s->copies, &s->cap_copies, 2 * ((size_t)s->n_copies + 1), sizeof *s->copies) == 0,
                  "engine: out of memory recording a block copy");
            s->copies[2 * s->n_copies] = b;
            s->copies[2 * s->n_copies + 1] = q->blocks[full];
            s->n_copies++;
        }
        c->blocks[c->n_blocks++] = b;
    }
    c->n_cached = q->n_cached;
    c->n_registered = q->n_registered;
    c->last_hash = q->last_hash;
    return 1;
}

int scheduler_waiting_samples(const struct scheduler *s)
{
    int n = 0;
    for (int i = 0; i < s->n_waiting; i++) {
        const struct seq *q = s->waiting[i];
        n += q->req && q->sample == 0 && !q->req->forked ? q->req->p.n : 1;
    }
    for (int i = 0; i < s->n_running; i++) { /* admitted, not forked yet: its other samples wait */
        const struct seq *q = s->running[i];
        if (q->req && q->sample == 0 && !q->req->forked && q->state == SEQ_RUNNING) n += q->req->p.n - 1;
    }
    return n;
}

int scheduler_fork(struct scheduler *s, struct seq *q, const struct tokenizer *tok, struct seq **children)
{
    struct request *r = q->req;
    r->forked = 1;
    for (int k = 1; k < r->p.n; k++) {
        struct seq *c = seq_new(r, k, tok);
        children[k - 1] = c;
        if (!c) continue;
        share_blocks(s, q, c);
        c->cached_prompt_tokens = q->cached_prompt_tokens;
    }
    for (int k = 1; k < r->p.n; k++) {
        struct seq *c = children[k - 1];
        if (!c) continue;
        if (c->n_cached > 0 && s->n_running < s->o.max_seqs) {
            running_add(s, c);
        } else { /* no block or no room: it recomputes when admitted */
            forget_blocks(s, c);
            waiting_push(s, c, 0);
        }
    }
    return r->p.n - 1;
}
