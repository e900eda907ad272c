/* engine/serving/draft.c - the draft model's load, cache slots and batched forwards (see
 * draft.h). */
#include "draft.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "checkpoint.h"
#include "quant.h"
#include "sampler.h"

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
    d->row_ok = calloc((size_t)n_slots, sizeof *d->row_ok);
    if (!d->owner || !d->n_cached || !d->tables || !d->slot_tokens || !d->table_rows || !d->rows || !d->logits ||
        !d->row_ok)
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
    if (d->m) {
        backend_free(d->m->b, d->head.data);
        backend_free(d->m->b, d->head_packed);
    }
    model_free(d->m);
    free(d->owner);
    free(d->n_cached);
    free(d->tables);
    free(d->slot_tokens);
    free(d->table_rows);
    free(d->rows);
    free(d->logits);
    free(d->row_ok);
    free(d->map);
    memset(d, 0, sizeof *d);
}

/* The token ids of --spec-token-map's JSON array, ascending, in *ids (malloc'd). */
static enum status parse_token_map(const char *path, const char *text, int vocab, int32_t **ids, int *n)
{
#define MAP_ERR(...) status_errorf(STATUS_INVALID_ARGUMENT, "--spec-token-map %s: " __VA_ARGS__)
    uint8_t *seen = calloc((size_t)vocab, 1);
    int32_t *out = malloc((size_t)vocab * sizeof *out);
    enum status st = STATUS_OK;
    int k = 0;
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (!seen || !out) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "--spec-token-map: out of host memory");
    } else if (*p++ != '[') {
        st = MAP_ERR("not a JSON array of token ids", path);
    } else {
        for (;;) {
            while (isspace((unsigned char)*p)) p++;
            if (*p == ']' && k == 0) break;
            char *end;
            errno = 0;
            const long long v = strtoll(p, &end, 10);
            if (end == p || errno) {
                st = MAP_ERR("entry %d is not an integer", path, k + 1);
                break;
            }
            if (v < 0 || v >= vocab) {
                st = MAP_ERR("token id %lld is outside the vocabulary [0, %d)", path, v, vocab);
                break;
            }
            if (seen[v]++) {
                st = MAP_ERR("token id %lld is listed twice", path, v);
                break;
            }
            out[k++] = (int32_t)v;
            for (p = end; isspace((unsigned char)*p); p++) {}
            if (*p == ',') { p++; continue; }
            if (*p != ']') st = MAP_ERR("expected ',' or ']' after entry %d", path, k);
            break;
        }
        if (st == STATUS_OK) {
            for (p++; isspace((unsigned char)*p); p++) {}
            if (*p) st = MAP_ERR("text after the array", path);
            else if (k == 0) st = MAP_ERR("the array is empty", path);
        }
    }
    if (st == STATUS_OK) { /* ascending: the order of the head's rows */
        k = 0;
        for (int i = 0; i < vocab; i++)
            if (seen[i]) out[k++] = i;
        *ids = out, *n = k;
    } else {
        free(out);
    }
    free(seen);
    return st;
#undef MAP_ERR
}

enum status draft_token_map(struct draft *d, const char *path)
{
    struct backend *b = d->m->b;
    const struct tensor *w = &d->m->w.lm_head;
    const int V = d->m->cfg.vocab_size;
    char *text = NULL;
    size_t len = 0;
    enum status st = base_read_file(path, (size_t)V * 16 + 4096, "token map", &text, &len);
    if (st != STATUS_OK) return status_errorf(st, "--spec-token-map: %s", status_message());
    st = parse_token_map(path, text, V, &d->map, &d->n_map);
    free(text);
    if (st != STATUS_OK) return st;
    /* The head's rows of the listed tokens, in the head's own dtype (raw rows, blocks included). */
    const size_t row = tensor_row_bytes(w);
    st = backend_alloc(b, (size_t)d->n_map * row, &d->head.data);
    if (st != STATUS_OK) return st;
    d->head = tensor_make(d->head.data, w->dtype, b->device, 2, (int64_t)d->n_map, tensor_cols(w));
    uint8_t *host = malloc(row);
    if (!host) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "--spec-token-map: out of host memory");
    for (int i = 0; i < d->n_map; i++) {
        backend_download(b, host, (const uint8_t *)w->data + (size_t)d->map[i] * row, row);
        backend_upload(b, (uint8_t *)d->head.data + (size_t)i * row, host, row);
    }
    free(host);
    /* On the CPU a block head is packed eight rows at a time, as model loading packs weights. */
    const enum quant_type qt = dtype_is_quant(w->dtype) ? (enum quant_type)dtype_quant_type(w->dtype) : 0;
    if (b->device == DEVICE_CPU && dtype_is_quant(w->dtype) && quant_packable(qt, d->n_map, tensor_cols(w))) {
        st = backend_alloc(b, quant_packed_bytes(qt, d->n_map, tensor_cols(w)), &d->head_packed);
        if (st != STATUS_OK) return st;
        quant_pack_rows8(qt, d->head_packed, d->head.data, d->n_map, tensor_cols(w));
        d->head.packed = d->head_packed, d->head.packed_of = d->head.data;
        d->head.packed_rows = d->n_map, d->head.packed_cols = tensor_cols(w);
    }
    LOG_INFO(MODULE, "draft model: head cut to the %d tokens of %s (of %d)", d->n_map, path, V);
    return STATUS_OK;
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
            .logit_rows = lrows, .head = d->n_map ? &d->head : NULL,
        };
        /* The logits land in the staging half, then each moves to its sequence's row (spread
         * over the vocabulary by the token map). */
        const size_t W = d->n_map ? (size_t)d->n_map : V;
        float *staged = d->logits + (size_t)d->n_slots * V;
        enum status st = model_forward(d->m, &d->cache, &fb, staged);
        if (st != STATUS_OK) return st;
        for (int j = 0; j < n_logits; j++) {
            float *dst = d->logits + (size_t)which[j] * V;
            const float *src = staged + (size_t)j * W;
            d->row_ok[which[j]] = sampler_logits_finite(src, (int)W);
            if (!d->n_map) {
                memcpy(dst, src, V * sizeof *dst);
                continue;
            }
            for (size_t t = 0; t < V; t++) dst[t] = -INFINITY;
            for (int t = 0; t < d->n_map; t++) dst[d->map[t]] = src[t];
        }
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
