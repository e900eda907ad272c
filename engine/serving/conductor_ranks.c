/* engine/serving/conductor_ranks.c - the multi-rank side of a conductor's step (see
 * conductor.c): the step plan the first rank broadcasts, micro-batches through the pipeline,
 * logits back to the first rank, the workers' replay loop, and their shutdown.
 * Not here: planning (scheduler.c), sampling and the engine thread (conductor.c).
 * Tests: tests/test_engine.c under mpirun (engine_tp2_pp1, ...), tests/test_serve_mpi.sh. */
#include "conductor_impl.h"

#include <stdio.h>
#include <string.h>

/* ---- multi-rank: the step plan and the workers -------------------------------------------- */

/* The first rank packs and broadcasts the step's arrays (header first); a worker receives them
 * into the same fields and repeats the step's block copies. */
enum status plan_exchange(struct conductor *c, struct step_plan_header *h)
{
    struct parallel_world *w = c->par.world;
    struct step_batch *b = &c->sched.batch;
    struct scheduler *sc = &c->sched;
    enum status st = parallel_bcast_bytes(w, h, sizeof *h, 0);
    if (st != STATUS_OK || h->stop) return st;
    const int T = h->n_tokens, S = h->n_seqs, W = h->table_width, L = h->n_logits, C = h->n_copies;
    CHECK(T >= 0 && T <= c->o.max_batch_tokens && S >= 0 && S <= c->o.max_seqs && W == b->table_width &&
              L >= 0 && L <= c->max_logits && C >= 0,
          "step plan out of range (tokens %d seqs %d width %d logits %d copies %d)", T, S, W, L, C);
    const size_t n = 3 * (size_t)T + (size_t)(S + 1) + 3 * (size_t)S + (size_t)S * W + (size_t)L + 2 * (size_t)C;
    if (base_grow((void **)&c->plan, &c->cap_plan, n, sizeof *c->plan) != 0) return STATUS_RESOURCE_EXHAUSTED;
    const int first = conductor_is_first_rank(c);
    if (!first && C > 0 && base_grow((void **)&sc->copies, &sc->cap_copies, 2 * (size_t)C, sizeof *sc->copies) != 0)
        return STATUS_RESOURCE_EXHAUSTED;
    struct { int32_t *p; int n; } parts[] = {
        {b->tokens, T}, {b->pos, T}, {b->slots, T}, {b->qstart, S + 1}, {b->seqlen, S},
        {b->table, S * W}, {b->rows, L}, {sc->copies, 2 * C}, {b->adapter, S}, {b->row_path, S},
    };
    size_t off = 0;
    if (first)
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; off += (size_t)parts[i].n, i++)
            if (parts[i].n) memcpy(c->plan + off, parts[i].p, (size_t)parts[i].n * sizeof *c->plan);
    if ((st = parallel_bcast_bytes(w, c->plan, n * sizeof *c->plan, 0)) != STATUS_OK) return st;
    if (first) return STATUS_OK;
    off = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; off += (size_t)parts[i].n, i++)
        if (parts[i].n) memcpy(parts[i].p, c->plan + off, (size_t)parts[i].n * sizeof *c->plan);
    for (int i = 0; i < C; i++) kv_cache_copy_block(&c->cache, sc->copies[2 * i], sc->copies[2 * i + 1]);
    return STATUS_OK;
}

int conductor_last_stage_rank(const struct conductor *c)
{
    const struct parallel_layout *l = &c->par.layout;
    return parallel_layout_rank(l, 0, l->pp_size - 1, 0);
}

/* rows x cols host floats at buf from the last stage's first tp rank to the first rank (pp > 1).
 * With pp > 1 the logits are on the last stage: its first rank sends them to the first rank,
 * which samples (a departure from sampling on the last stage: the sampler's per-request state
 * then lives in one place; the cost is n_logits x vocab floats per step over MPI); an EAGLE
 * head's features (every row's hidden state, rows x d_model floats) follow them. */
static enum status host_rows_to_first_rank(struct conductor *c, float *buf, int rows, int cols)
{
    const struct parallel_layout *l = &c->par.layout;
    if (!c->par.world || l->pp_size == 1 || rows == 0) return STATUS_OK;
    struct tensor t = tensor_make(buf, DTYPE_F32, DEVICE_CPU, 2, (int64_t)rows, (int64_t)cols);
    const int last = conductor_last_stage_rank(c);
    if (conductor_is_first_rank(c)) return comm_recv(c->par.world->control, &t, last);
    if (l->rank == last) return comm_send(c->par.world->control, &t, 0);
    return STATUS_OK;
}

/* Micro-batches per step (pp > 1, --pp-microbatches): the step's sequences are split so that
 * stages overlap (stage k runs micro-batch j while stage k+1 runs j-1). Off by default: decode
 * is bound by weight reads, and each micro-batch reads the stage's weights again (measured on 2
 * CPU cores: pp 2 at 16 streams, 94 tok/s as one micro-batch, 84 tok/s as two). */
int micro_batches(const struct conductor *c, int n_seqs)
{
    if (c->par.layout.pp_size <= 1 || c->o.pp_microbatches <= 1) return 1;
    return c->o.pp_microbatches < n_seqs ? c->o.pp_microbatches : n_seqs;
}

/* Runs the step held in the step batch as n_micro micro-batches of contiguous sequences, in
 * the same order on every rank. Activations flow one way (stage to stage); the last stage
 * sends all logits to the first rank only after its last micro-batch, so no rank ever waits on
 * a rank that waits on it. Logit rows are ascending, so each micro-batch's are contiguous. */
enum status run_forward(struct conductor *c, int n_rows, int n_seqs, int n_logits, int n_micro)
{
    const struct step_batch *b = &c->sched.batch;
    const int V = c->m->cfg.vocab_size, D = c->m->cfg.d_model, per = (n_seqs + n_micro - 1) / n_micro;
    int l0 = 0;
    enum status st = STATUS_OK;
    for (int s0 = 0; s0 < n_seqs && st == STATUS_OK; s0 += per) {
        const int s1 = s0 + per < n_seqs ? s0 + per : n_seqs;
        const int r0 = b->qstart[s0], r1 = s1 < n_seqs ? b->qstart[s1] : n_rows;
        int l1 = l0;
        while (l1 < n_logits && b->rows[l1] < r1) l1++;
        for (int i = s0; i <= s1; i++) c->mb_qstart[i - s0] = (i < n_seqs ? b->qstart[i] : n_rows) - r0;
        for (int i = l0; i < l1; i++) c->mb_rows[i - l0] = b->rows[i] - r0;
        struct forward_batch fb = {.n_tokens = r1 - r0, .tokens = b->tokens + r0, .positions = b->pos + r0,
                                   .slots = b->slots + r0, .n_seqs = s1 - s0, .q_start = c->mb_qstart,
                                   .seq_len = b->seqlen + s0,
                                   .block_table = b->table + (size_t)s0 * (size_t)b->table_width,
                                   .max_blocks = b->table_width, .n_logits = l1 - l0, .logit_rows = c->mb_rows,
                                   .seq_adapter = c->m->n_adapters ? b->adapter + s0 : NULL,
                                   .seq_row_path = b->row_path + s0};
        /* Workers never read their logits: they take the cheap path whenever it exists. */
        const int greedy = n_micro == 1 && (conductor_is_first_rank(c) ? c->step_greedy : c->device_greedy);
        if (greedy && conductor_is_first_rank(c) && c->n_edits)
            fb.n_edits = c->n_edits, fb.edit_rows = c->edit_rows, fb.edit_ids = c->edit_ids, fb.edit_vals = c->edit_vals;
        if (greedy && conductor_is_first_rank(c) && c->n_masks)
            fb.n_masks = c->n_masks, fb.mask_rows = c->mask_rows, fb.masks = c->masks,
            fb.mask_words = (c->m->cfg.vocab_size + 31) / 32;
        if (greedy && conductor_is_first_rank(c) && c->step_top) { /* (a worker's argmax is cheaper) */
            fb.top_k = c->top_k;
            fb.top_values = c->top_values;
            fb.top_ids = c->top_ids;
            if (c->step_mass) fb.top_inv_temp = c->top_inv_temp, fb.top_mass = c->top_mass;
            if (c->step_draw) fb.draw_temp = c->draw_temp, fb.draw_u = c->draw_u, fb.draw_top_p = c->draw_top_p,
                              fb.draw_ids = c->draw_ids,
                              fb.draw_margin = c->draw_margin;
            if (c->step_lse) fb.lse_want = c->lse_want, fb.top_lse = c->top_lse;
            fb.greedy_done = &c->greedy_done;
        } else if (greedy) {
            fb.greedy_ids = c->greedy_ids;
            fb.greedy_done = &c->greedy_done;
        }
        c->greedy_done = 0;
        /* EAGLE's features: every row's hidden state, from the last stage (the first rank's at
         * pp 1; the last stage's first tp rank sends them at pp > 1) */
        if (c->eagle_hidden && model_is_last_stage(c->m)) fb.hidden = c->eagle_hidden + (size_t)r0 * (size_t)D;
        st = model_forward(c->m, &c->cache, &fb, c->logits + (size_t)l0 * (size_t)V);
        l0 = l1;
    }
    if (st == STATUS_OK) st = host_rows_to_first_rank(c, c->logits, n_logits, V);
    if (st == STATUS_OK && c->eagle_hidden) st = host_rows_to_first_rank(c, c->eagle_hidden, n_rows, D);
    /* ... kept beside the rows' K/V in the first rank's cache, where the head reads them */
    if (st == STATUS_OK && c->eagle_hidden && conductor_is_first_rank(c))
        kv_cache_write_features(&c->cache, b->slots, n_rows, c->eagle_hidden);
    return st;
}

enum status conductor_run_worker(struct conductor *c)
{
    CHECK(!conductor_is_first_rank(c), "conductor_run_worker on the first rank");
    for (;;) {
        struct step_plan_header h;
        enum status st = plan_exchange(c, &h);
        if (st != STATUS_OK) return st;
        if (h.stop) return STATUS_OK;
        if (h.n_tokens == 0) continue;
        CHECK(h.n_micro >= 1 && h.n_micro <= h.n_seqs, "step plan: %d micro-batches for %d sequences", h.n_micro, h.n_seqs);
        if ((st = run_forward(c, h.n_tokens, h.n_seqs, h.n_logits, h.n_micro)) != STATUS_OK) return st;
        c->worker_steps++;
    }
}

/* One line per rank at shutdown: time spent in each communicator per forward step. */
void log_comm_time(struct conductor *c)
{
    uint64_t steps = conductor_is_first_rank(c) ? c->stats.steps : c->worker_steps;
    if (!c->groups.tp || steps == 0) return;
    const struct comm *cm[] = {c->groups.tp, c->groups.pp, c->par.world ? c->par.world->control : NULL};
    const char *names[] = {"tp", "pp", "control"};
    char line[256];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (cm[i] && cm[i]->size > 1)
            n += snprintf(line + n, sizeof line - (size_t)n, " %s %.3f ms/step (%.1f calls)", names[i],
                          1e3 * cm[i]->seconds / (double)steps, (double)cm[i]->n_calls / (double)steps);
    if (n) LOG_INFO(MODULE, "rank %d: %llu steps; communication:%s", c->par.layout.rank, (unsigned long long)steps, line);
}

/* Tells the workers to leave conductor_run_worker (first rank only, once). */
void stop_workers(struct conductor *c)
{
    if (!c->par.world || !conductor_is_first_rank(c) || !c->m || c->failed) return;
    struct step_plan_header h = {.stop = 1};
    if (plan_exchange(c, &h) != STATUS_OK) LOG_WARN(MODULE, "could not tell the workers to stop: %s", status_message());
    c->par.world = NULL; /* nothing more goes to them */
}
