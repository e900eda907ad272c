/* engine/serving/draft.c - the draft model's load, cache slots and batched forwards (see
 * draft.h). */
#include "draft.h"

#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"

#define MODULE "engine"

/* Whether the draft can propose tokens of the target's vocabulary: NULL when it can, else what
 * differs. */
static const char *mismatch(const struct model *d, const struct model *t)
{
    if (d->cfg.vocab_size != t->cfg.vocab_size) return "vocabulary size";
    if (d->cfg.bos_id != t->cfg.bos_id) return "BOS id";
    if (d->cfg.eos_id != t->cfg.eos_id) return "EOS id";
    const struct checkpoint *dc = d->checkpoint, *tc = t->checkpoint;
    if (dc && tc && dc->tokenizer_digest && tc->tokenizer_digest &&
        (dc->tokenizer_proto_n != tc->tokenizer_proto_n || dc->tokenizer_digest != tc->tokenizer_digest))
        return "tokenizer";
    return NULL;
}

enum status draft_load(const char *dir, struct backend *b, const struct model *target, int n_slots, struct draft *d)
{
    memset(d, 0, sizeof *d);
    enum status st = model_load(dir, b, NULL, &d->m);
    if (st != STATUS_OK)
        return status_errorf(st, "--draft-model %s: %s", dir, status_message());
    const char *what = mismatch(d->m, target);
    if (what) {
        st = status_errorf(STATUS_INVALID_ARGUMENT,
                           "--draft-model %s: its %s differs from the served model's (vocabulary %d vs %d, BOS %d vs "
                           "%d, EOS %d vs %d); a draft must share the target's tokenizer",
                           dir, what, d->m->cfg.vocab_size, target->cfg.vocab_size, d->m->cfg.bos_id,
                           target->cfg.bos_id, d->m->cfg.eos_id, target->cfg.eos_id);
        draft_free(d);
        return st;
    }
    const int bt = 16;
    if (n_slots > DRAFT_MAX_SLOTS) n_slots = DRAFT_MAX_SLOTS;
    d->n_slots = n_slots;
    d->ctx = d->m->cfg.max_positions < target->cfg.max_positions ? d->m->cfg.max_positions : target->cfg.max_positions;
    if (d->ctx > DRAFT_MAX_CTX) d->ctx = DRAFT_MAX_CTX;
    d->slot_blocks = (d->ctx + bt - 1) / bt;
    d->max_rows = 256;
    const size_t V = (size_t)d->m->cfg.vocab_size, nb = (size_t)n_slots * (size_t)d->slot_blocks;
    d->owner = calloc((size_t)n_slots, sizeof *d->owner);
    d->n_cached = calloc((size_t)n_slots, sizeof *d->n_cached);
    d->tables = malloc(nb * sizeof *d->tables);
    d->slot_tokens = malloc((size_t)n_slots * (size_t)d->ctx * sizeof *d->slot_tokens);
    d->table_rows = malloc(nb * sizeof *d->table_rows);
    d->rows = malloc((4 * (size_t)d->max_rows + 2 * (size_t)n_slots + 1) * sizeof *d->rows);
    d->logits = malloc(2 * (size_t)n_slots * V * sizeof *d->logits);
    if (!d->owner || !d->n_cached || !d->tables || !d->slot_tokens || !d->table_rows || !d->rows || !d->logits)
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory");
    if (st == STATUS_OK) st = model_reserve(d->m, d->max_rows, n_slots, d->slot_blocks, n_slots);
    if (st == STATUS_OK)
        st = kv_cache_init(&d->cache, b, d->m->n_layers_local, (int)nb, bt, d->m->n_kv_local, d->m->cfg.head_dim,
                           d->m->dtype);
    if (st == STATUS_OK) st = kv_cache_alloc(&d->cache, (int)nb, d->tables);
    if (st != STATUS_OK) {
        draft_free(d);
        return st;
    }
    LOG_INFO(MODULE, "draft model %s: %d layers, d_model %d, %d slots of %d tokens", dir, d->m->cfg.n_layers,
             d->m->cfg.d_model, n_slots, d->ctx);
    return STATUS_OK;
}

void draft_free(struct draft *d)
{
    if (d->cache.b) kv_cache_free(&d->cache);
    model_free(d->m);
    free(d->owner);
    free(d->n_cached);
    free(d->tables);
    free(d->slot_tokens);
    free(d->table_rows);
    free(d->rows);
    free(d->logits);
    memset(d, 0, sizeof *d);
}

void draft_sweep(struct draft *d, struct seq *const *running, int n_running)
{
    for (int k = 0; k < d->n_slots; k++) {
        int alive = 0;
        for (int i = 0; i < n_running && !alive; i++)
            alive = running[i] == d->owner[k] && running[i]->draft_slot == k + 1;
        if (!alive) d->owner[k] = NULL;
    }
}

int draft_claim(struct draft *d, struct seq *s, int extra)
{
    if (s->n_tokens + extra > d->ctx) return 0;
    if (s->draft_slot > 0 && d->owner[s->draft_slot - 1] == s) return 1;
    s->draft_slot = 0;
    for (int k = 0; k < d->n_slots; k++) {
        if (d->owner[k]) continue;
        d->owner[k] = s;
        d->n_cached[k] = 0;
        s->draft_slot = k + 1;
        return 1;
    }
    return 0;
}

enum status draft_run(struct draft *d, struct seq *const *seqs, int n)
{
    const int bt = d->cache.block_tokens, sb = d->slot_blocks;
    const size_t V = (size_t)d->m->cfg.vocab_size;
    int32_t *tok = d->rows, *pos = tok + d->max_rows, *slots = pos + d->max_rows, *lrows = slots + d->max_rows;
    int32_t *qstart = lrows + d->max_rows, *seqlen = qstart + d->n_slots + 1;
    int32_t *which = lrows + n; /* after the logits rows: which sequence each belongs to */
    /* What a slot holds stays valid only as far as it agrees with its sequence's tokens (drafts
     * that were never verified, a preemption, leave rows behind); its last token is fed again
     * when it holds them all, for that token's logits. */
    for (int i = 0; i < n; i++) {
        const struct seq *s = seqs[i];
        const int k = s->draft_slot - 1;
        const int32_t *held = d->slot_tokens + (size_t)k * d->ctx;
        int j = 0, lim = d->n_cached[k] < s->n_tokens - 1 ? d->n_cached[k] : s->n_tokens - 1;
        while (j < lim && held[j] == s->tokens[j]) j++;
        d->n_cached[k] = j;
    }
    for (;;) {
        int rows = 0, n_seqs = 0, n_logits = 0;
        for (int i = 0; i < n && rows < d->max_rows; i++) {
            const struct seq *s = seqs[i];
            const int k = s->draft_slot - 1, from = d->n_cached[k];
            int take = s->n_tokens - from;
            if (take <= 0) continue;
            if (take > d->max_rows - rows) take = d->max_rows - rows;
            qstart[n_seqs] = rows;
            for (int j = 0; j < take; j++, rows++) {
                const int p = from + j;
                tok[rows] = d->slot_tokens[(size_t)k * d->ctx + p] = s->tokens[p];
                pos[rows] = p;
                slots[rows] = d->tables[(size_t)k * sb + p / bt] * bt + p % bt;
            }
            seqlen[n_seqs] = from + take;
            memcpy(d->table_rows + (size_t)n_seqs * sb, d->tables + (size_t)k * sb, (size_t)sb * sizeof *d->tables);
            if (from + take == s->n_tokens) lrows[n_logits] = rows - 1, which[n_logits++] = i;
            n_seqs++;
        }
        if (rows == 0) return STATUS_OK;
        qstart[n_seqs] = rows;
        struct forward_batch fb = {
            .n_tokens = rows, .tokens = tok, .positions = pos, .slots = slots, .n_seqs = n_seqs, .q_start = qstart,
            .seq_len = seqlen, .block_table = d->table_rows, .max_blocks = sb, .n_logits = n_logits,
            .logit_rows = lrows,
        };
        /* The logits land in the staging half, then each moves to its sequence's row. */
        float *staged = d->logits + (size_t)d->n_slots * V;
        enum status st = model_forward(d->m, &d->cache, &fb, staged);
        if (st != STATUS_OK) return st;
        for (int j = 0; j < n_logits; j++)
            memcpy(d->logits + (size_t)which[j] * V, staged + (size_t)j * V, V * sizeof *d->logits);
        for (int i = 0, q = 0; i < n && q < n_seqs; i++) {
            const struct seq *s = seqs[i];
            const int k = s->draft_slot - 1;
            if (s->n_tokens - d->n_cached[k] <= 0) continue;
            d->n_cached[k] = seqlen[q++];
        }
    }
}

void draft_rollback(struct draft *d, const struct seq *s, int n_valid)
{
    const int k = s->draft_slot - 1;
    if (k >= 0 && d->owner[k] == s && d->n_cached[k] > n_valid) d->n_cached[k] = n_valid;
}
