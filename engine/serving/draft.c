/* engine/serving/draft.c - the draft model's load, cache slots and batched forwards (see
 * draft.h). */
#include "draft.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "checkpoint.h"
#include "eagle_head.h"
#include "quant.h"
#include "safetensors.h"
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

/* The slots of a loaded draft (d->m) and its workspace and cache: see draft.h. */
static enum status slots_init(struct draft *d, struct backend *b, const struct model *target, int n_slots)
{
    const int bt = 16;
    if (n_slots > DRAFT_MAX_SLOTS) n_slots = DRAFT_MAX_SLOTS;
    d->n_slots = n_slots;
    /* The smaller context, cut to what the budget holds for every slot (but not below the minimum) */
    const int both = d->m->cfg.max_positions < target->cfg.max_positions ? d->m->cfg.max_positions
                                                                          : target->cfg.max_positions;
    const size_t per_token = kv_cache_block_bytes(d->m->n_layers_local, 1, d->m->n_kv_local, d->m->cfg.head_dim,
                                                  d->m->dtype);
    size_t fit = DRAFT_KV_BUDGET / ((size_t)n_slots * per_token);
    if (fit < DRAFT_MIN_CTX) fit = DRAFT_MIN_CTX;
    d->ctx = fit < (size_t)both ? (int)fit : both;
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
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory");
    enum status st = model_reserve(d->m, d->max_rows, n_slots, d->slot_blocks, n_slots);
    if (st == STATUS_OK)
        st = kv_cache_init(&d->cache, b, d->m->n_layers_local, (int)nb, bt, d->m->n_kv_local, d->m->cfg.head_dim,
                           d->m->dtype);
    if (st == STATUS_OK) st = kv_cache_alloc(&d->cache, (int)nb, d->tables);
    return st;
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
    if ((st = slots_init(d, b, target, n_slots)) != STATUS_OK) {
        draft_free(d);
        return st;
    }
    LOG_INFO(MODULE, "draft model %s: %d layers, d_model %d, %d slots of %d tokens", dir, d->m->cfg.n_layers,
             d->m->cfg.d_model, n_slots, d->ctx);
    return STATUS_OK;
}

/* ---- EAGLE --------------------------------------------------------------------------------- */

/* t's blocks (type qt, CPU memory) packed eight rows at a time into packed (quant_packed_bytes),
 * as model loading packs the CPU's block weights, and t pointed at the copy. */
static void pack_rows8(struct tensor *t, enum quant_type qt, void *packed)
{
    quant_pack_rows8(qt, packed, t->data, tensor_rows(t), tensor_cols(t));
    t->packed = packed, t->packed_of = t->data, t->packed_rows = tensor_rows(t), t->packed_cols = tensor_cols(t);
}

/* A backend allocation of the head's, freed by draft_free. */
static enum status eagle_alloc(struct draft *d, struct backend *b, size_t bytes, void **out)
{
    if (d->n_eagle_mem == DRAFT_EAGLE_ALLOCS)
        return status_errorf(STATUS_INTERNAL, "--draft-model: more than %d allocations for an EAGLE head", DRAFT_EAGLE_ALLOCS);
    enum status st = backend_alloc(b, bytes, out);
    if (st == STATUS_OK) d->eagle_mem[d->n_eagle_mem++] = *out;
    return st;
}

/* x (rows, k) as Q8_0 blocks at out, ggml's quantize_row_q8_0 (per 32 values: d = max |x| / 127,
 * each x rounded to x / d; d stored as f16 before its 32 bytes). */
static void quantize_q8_0(const float *x, uint8_t *out, int64_t rows, int64_t k)
{
    for (int64_t i = 0; i < rows * k; i += 32, out += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[i + j]));
        const float dq = amax / 127.0f, id = dq != 0.0f ? 1.0f / dq : 0.0f;
        const uint16_t h16 = f32_to_f16(dq);
        memcpy(out, &h16, 2);
        for (int j = 0; j < 32; j++) out[2 + j] = (uint8_t)(int8_t)roundf(x[i + j] * id);
    }
}

/* rows x cols (0: a vector of rows) f32 host values into t on h's backend: as Q8_0 blocks when
 * q8 (packed eight rows at a time too, as model loading packs the CPU's block weights), else in
 * h's dtype. */
static enum status eagle_place(struct draft *d, struct model *h, const float *src, int64_t rows, int64_t cols, int q8,
                               struct tensor *t)
{
    struct backend *b = h->b;
    const int64_t n = rows * (cols ? cols : 1);
    const size_t bytes = q8 ? (size_t)rows * quant_row_bytes(QUANT_TYPE_Q8_0, cols) : (size_t)n * dtype_size(h->dtype);
    uint8_t *host = malloc(bytes);
    void *dev = NULL;
    enum status st = host ? eagle_alloc(d, b, bytes, &dev)
                          : status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory");
    if (st == STATUS_OK) {
        if (q8) quantize_q8_0(src, host, rows, cols);
        else safetensors_gather(host, h->dtype, src, DTYPE_F32, (size_t)n, 1);
        backend_upload(b, dev, host, bytes);
        *t = !cols ? tensor_make(dev, h->dtype, b->device, 1, rows)
                   : tensor_make(dev, q8 ? DTYPE_Q8_0 : h->dtype, b->device, 2, rows, cols);
    }
    free(host);
    if (st != STATUS_OK || !q8 || !quant_packable(QUANT_TYPE_Q8_0, rows, cols)) return st;
    void *packed = NULL;
    if ((st = eagle_alloc(d, b, quant_packed_bytes(QUANT_TYPE_Q8_0, rows, cols), &packed)) == STATUS_OK)
        pack_rows8(t, QUANT_TYPE_Q8_0, packed);
    return st;
}

/* Reads the head's tensors from st onto h's backend; fc.weight (d, 2d) becomes its two halves.
 * Beside a target served as blocks on the CPU the matrices whose rows are whole Q8_0 blocks become
 * Q8_0 (a proposal took 2.2x less time for SmolLM2's head on 2 threads, docs/speculative.md);
 * SHARDLM_EAGLE_WEIGHTS=f32 keeps them in the compute dtype, =q8_0 makes them Q8_0 beside any
 * CPU target (tests). */
static enum status eagle_weights(struct draft *d, struct model *h, const struct model *target,
                                 const struct safetensors *st, const char *what)
{
    const int64_t D = h->cfg.d_model;
    const char *force = getenv("SHARDLM_EAGLE_WEIGHTS");
    const int q8 = h->b->device == DEVICE_CPU &&
                   (force && *force ? !strcmp(force, "q8_0") : target->weight_bytes_blocks > 0);
    struct eagle_head_tensor list[EAGLE_HEAD_TENSORS];
    eagle_head_tensors(h, list);
    enum status ret = STATUS_OK;
    float *host = NULL;
    for (int i = 0; i < EAGLE_HEAD_TENSORS && ret == STATUS_OK; i++) {
        int absent = 0;
        if ((ret = eagle_head_read(st, what, "the served model", &list[i], &host, &absent)) != STATUS_OK || absent)
            continue;
        if (list[i].t) {
            ret = eagle_place(d, h, host, list[i].rows, list[i].cols, q8 && list[i].cols && list[i].cols % 32 == 0,
                              list[i].t);
            continue;
        }
        /* fc: row r's first D values read the embedding, its last D the feature: two (D, D) matrices */
        float *half = malloc((size_t)(2 * D * D) * sizeof *half);
        if (!half) {
            ret = status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory");
            break;
        }
        eagle_head_fc_split(host, D, half, half + D * D);
        ret = eagle_place(d, h, half, D, D, q8 && D % 32 == 0, &h->input_fc_emb);
        if (ret == STATUS_OK) ret = eagle_place(d, h, half + D * D, D, D, q8 && D % 32 == 0, &h->input_fc_feat);
        free(half);
    }
    free(host);
    return ret;
}

static enum status map_head(struct draft *d, int32_t *map, int n, const char *source);

enum status draft_load_eagle(const char *path, const char *target_dir, struct backend *b, struct model *target,
                             struct kv_cache *target_kv, int n_slots, struct draft *d)
{
    memset(d, 0, sizeof *d);
    const char *why = eagle_head_unfit(target);
    if (why) return status_errorf(STATUS_UNSUPPORTED, "--speculative eagle: the served model (%s) cannot carry an "
                                  "EAGLE head: %s", target->cfg.architecture, why);
    struct safetensors *st = NULL;
    enum status ret = safetensors_open(path, &st);
    if (ret != STATUS_OK) return status_errorf(ret, "--draft-model %s: %s", path, status_message());
    const char *style = safetensors_metadata(st, "rope_style");
    const char *want = target->cfg.rope_style == ROPE_STYLE_PAIRS ? "pairs" : "halves";
    if (style && strcmp(style, want)) {
        ret = status_errorf(STATUS_INVALID_ARGUMENT, "--draft-model %s: an EAGLE head for rotary in %s, the served "
                            "model's is in %s", path, style, want);
        safetensors_close(st);
        return ret;
    }
    /* The head: one Llama-style layer of the target's widths (eagle_head_shape), its embeddings
     * and LM head borrowed; no final norm, no attention norm (EAGLE-1). */
    struct model *h = calloc(1, sizeof *h);
    d->m = h;
    if (h) h->b = b; /* before anything can fail: draft_free frees through it */
    if (!h || !(h->w.layers = calloc(1, sizeof *h->w.layers))) {
        safetensors_close(st);
        draft_free(d);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory");
    }
    /* A sharded target's first rank holds a slice of the vocabulary (tp) or no LM head (pp): the
     * head then borrows a whole copy of the checkpoint's two ends, loaded here. */
    const struct model *ends = target;
    if (target->tp_size > 1 || target->pp_size > 1) {
        ret = model_load_io(target_dir, b, &d->ends);
        if (ret != STATUS_OK) {
            ret = status_errorf(ret, "--speculative eagle: the served model's embeddings and LM head for the head "
                                "(tp %d, pp %d): %s", target->tp_size, target->pp_size, status_message());
            safetensors_close(st);
            draft_free(d);
            return ret;
        }
        ends = d->ends;
    }
    const struct st_tensor *up = safetensors_find(st, "layers.0.mlp.up_proj.weight");
    eagle_head_shape(h, target, ends, up && up->ndim == 2 && up->shape[0] > 0 && up->shape[0] <= (1 << 20)
                                          ? (int)up->shape[0] : target->cfg.ffn_hidden);
    char what[4200]; /* how errors about the file open */
    snprintf(what, sizeof what, "--draft-model %s", path);
    ret = eagle_weights(d, h, target, st, what);
    int32_t *map = NULL; /* the token map the head carries (shardlm train --eagle-head --spec-token-map) */
    int n_map = 0;
    if (ret == STATUS_OK) ret = eagle_head_token_map(st, what, target->cfg.vocab_size, &map, &n_map);
    safetensors_close(st);
    if (ret == STATUS_OK) ret = slots_init(d, b, target, n_slots);
    if (ret == STATUS_OK && map) {
        snprintf(what, sizeof what, "%s (its " EAGLE_HEAD_TOKEN_MAP ")", path);
        ret = map_head(d, map, n_map, what);
    } else {
        free(map);
    }
    const size_t D = (size_t)h->cfg.d_model;
    d->eagle = 1;
    d->d_model = (int)D;
    if (ret == STATUS_OK) ret = kv_cache_features_init(target_kv, (int)D);
    d->target_kv = target_kv;
    if (ret == STATUS_OK) {
        d->n_exact = calloc((size_t)d->n_slots, sizeof *d->n_exact);
        d->h_last = malloc((size_t)d->n_slots * D * sizeof *d->h_last);
        d->h_pos = malloc((size_t)d->n_slots * sizeof *d->h_pos);
        d->in_feats = malloc((size_t)d->max_rows * D * sizeof *d->in_feats);
        d->out_hidden = malloc((size_t)d->max_rows * D * sizeof *d->out_hidden);
        if (!d->n_exact || !d->h_last || !d->h_pos || !d->in_feats || !d->out_hidden)
            ret = status_errorf(STATUS_RESOURCE_EXHAUSTED, "--draft-model: out of host memory for the EAGLE features");
    }
    if (ret != STATUS_OK) {
        draft_free(d);
        return ret;
    }
    const char *trace = getenv("SHARDLM_EAGLE_TRACE");
    if (trace && *trace && !(d->trace = fopen(trace, "a")))
        LOG_WARN(MODULE, "SHARDLM_EAGLE_TRACE %s: cannot open it; no trace", trace);
    LOG_INFO(MODULE, "EAGLE head %s: one layer on %s (d_model %zu, projections %s), %d slots of %d tokens%s", path,
             target->cfg.architecture, D, dtype_name(h->w.layers[0].wq.dtype), d->n_slots, d->ctx,
             d->ends ? "; the served model is sharded: its embeddings and LM head loaded whole for the head" : "");
    return STATUS_OK;
}

void draft_free(struct draft *d)
{
    if (d->cache.b) kv_cache_free(&d->cache);
    if (d->m) {
        backend_free(d->m->b, d->head.data);
        backend_free(d->m->b, d->head_packed);
        for (int i = 0; i < d->n_eagle_mem; i++) backend_free(d->m->b, d->eagle_mem[i]);
    }
    model_free(d->m);
    model_free(d->ends);
    free(d->owner);
    free(d->n_cached);
    free(d->tables);
    free(d->slot_tokens);
    free(d->table_rows);
    free(d->rows);
    free(d->logits);
    free(d->row_ok);
    free(d->map);
    free(d->n_exact);
    free(d->h_last);
    free(d->h_pos);
    free(d->in_feats);
    free(d->out_hidden);
    if (d->trace) fclose(d->trace);
    memset(d, 0, sizeof *d);
}

/* The head cut to map[0 .. n) (ascending ids; d takes map): any earlier cut replaced; source names
 * where the map came from, for the log. */
static enum status map_head(struct draft *d, int32_t *map, int n, const char *source)
{
    struct backend *b = d->m->b;
    const struct tensor *w = &d->m->w.lm_head;
    const int V = d->m->cfg.vocab_size;
    backend_free(b, d->head.data);
    backend_free(b, d->head_packed);
    d->head.data = d->head_packed = NULL;
    free(d->map);
    d->map = map, d->n_map = n;
    /* The head's rows of the listed tokens, in the head's own dtype (raw rows, blocks included). */
    const size_t row = tensor_row_bytes(w);
    enum status st = backend_alloc(b, (size_t)d->n_map * row, &d->head.data);
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
        pack_rows8(&d->head, qt, d->head_packed);
    }
    /* Each sequence's row holds -Inf outside the map from now on: draft_run writes only the map's ids. */
    for (size_t i = 0; i < (size_t)d->n_slots * (size_t)V; i++) d->logits[i] = -INFINITY;
    LOG_INFO(MODULE, "draft model: head cut to the %d tokens of %s (of %d)", d->n_map, source, V);
    return STATUS_OK;
}

enum status draft_token_map(struct draft *d, const char *path)
{
    int32_t *map = NULL;
    int n = 0;
    enum status st = draft_token_map_read(path, d->m->cfg.vocab_size, &map, &n);
    return st == STATUS_OK ? map_head(d, map, n, path) : st;
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
        if (d->eagle) { /* the head's rows of slot k: none yet */
            d->n_exact[k] = 0;
            d->h_pos[k] = -1;
        }
        return 1;
    }
    return 0;
}

/* EAGLE: the feature that the head's row at position p of s (slot k) reads: for a real token the
 * target's hidden state at p - 1, kept beside that position's K/V in the target's cache (so a
 * cached prefix, computed for an earlier request, and a fork's shared prompt have theirs; zeros
 * where the target holds no K/V of p - 1), for a drafted one the head's own output at p - 1. */
static void eagle_feature(const struct draft *d, const struct seq *s, int k, int p, float *out)
{
    const size_t D = (size_t)d->d_model;
    const int q = p - 1, bt = d->target_kv->block_tokens;
    const float *src = NULL;
    if (p < s->n_tokens - s->n_draft)
        src = q < s->n_cached ? kv_cache_feature(d->target_kv, (int64_t)s->blocks[q / bt] * bt + q % bt) : NULL;
    else if (d->h_pos[k] == q) src = d->h_last + (size_t)k * D;
    if (src) memcpy(out, src, D * sizeof *out);
    else memset(out, 0, D * sizeof *out);
}

/* SHARDLM_EAGLE_TRACE: the proposing row of s, its logits src (W of them: over the token map when
 * there is one), as "real R argmax A max M tokens t0,t1,...": s's tokens, of which the first R
 * are real and the rest drafts, and the head's best token for the next position. */
static void eagle_trace(const struct draft *d, const struct seq *s, const float *src, int W)
{
    int best = 0;
    for (int t = 1; t < W; t++)
        if (src[t] > src[best]) best = t;
    fprintf(d->trace, "real %d argmax %d max %.6g tokens ", s->n_tokens - s->n_draft, d->n_map ? d->map[best] : best,
            (double)src[best]);
    for (int i = 0; i < s->n_tokens; i++) fprintf(d->trace, i ? ",%d" : "%d", s->tokens[i]);
    fputc('\n', d->trace);
    fflush(d->trace);
}

enum status draft_run(struct draft *d, struct seq *const *seqs, int n)
{
    const int bt = d->cache.block_tokens, sb = d->slot_blocks, e = d->eagle;
    const size_t V = (size_t)d->m->cfg.vocab_size, D = (size_t)d->d_model;
    int32_t *tok = d->rows, *pos = tok + d->max_rows, *slots = pos + d->max_rows, *lrows = slots + d->max_rows;
    int32_t *qstart = lrows + d->max_rows, *seqlen = qstart + d->n_slots + 1;
    int32_t *which = lrows + n; /* after the logits rows: which sequence each belongs to */
    /* What a slot holds stays valid only as far as it agrees with its sequence's tokens (drafts
     * that were never verified, a preemption, leave rows behind) and, for EAGLE, from a step's
     * first proposal on, as far as its rows read the target's features (the drafted rows of the
     * step before read the head's own); its last token is fed again when it holds them all, for
     * that token's logits. An EAGLE head never runs position 0 (nothing precedes it): its row of
     * position p is KV index p - 1. */
    for (int i = 0; i < n; i++) {
        const struct seq *s = seqs[i];
        const int k = s->draft_slot - 1;
        const int32_t *held = d->slot_tokens + (size_t)k * d->ctx;
        int lim = d->n_cached[k] < s->n_tokens - 1 ? d->n_cached[k] : s->n_tokens - 1;
        if (e && s->n_draft == 0 && lim > d->n_exact[k]) lim = d->n_exact[k]; /* a step's first proposal */
        int j = e && lim > 0; /* an EAGLE head holds no row of position 0 */
        while (j < lim && held[j] == s->tokens[j]) j++;
        d->n_cached[k] = j > e ? j : e;
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
                const int p = from + j, at = p - e;
                tok[rows] = d->slot_tokens[(size_t)k * d->ctx + p] = s->tokens[p];
                pos[rows] = p;
                slots[rows] = d->tables[(size_t)k * sb + at / bt] * bt + at % bt;
                if (e) eagle_feature(d, s, k, p, d->in_feats + (size_t)rows * D);
            }
            seqlen[n_seqs] = from + take - e;
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
            .features = e ? d->in_feats : NULL, .hidden = e ? d->out_hidden : NULL,
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
            if (e) { /* the head's output at the sequence's last row: the next draft's feature */
                const int k = seqs[which[j]]->draft_slot - 1;
                if (d->trace) eagle_trace(d, seqs[which[j]], src, (int)W);
                memcpy(d->h_last + (size_t)k * D, d->out_hidden + (size_t)lrows[j] * D, D * sizeof *d->h_last);
                d->h_pos[k] = seqs[which[j]]->n_tokens - 1;
            }
            if (!d->n_map) {
                memcpy(dst, src, V * sizeof *dst);
                continue;
            }
            for (int t = 0; t < d->n_map; t++) dst[d->map[t]] = src[t]; /* -Inf elsewhere: draft_token_map */
        }
        for (int i = 0, q = 0; i < n && q < n_seqs; i++) {
            const struct seq *s = seqs[i];
            const int k = s->draft_slot - 1;
            if (s->n_tokens - d->n_cached[k] <= 0) continue;
            d->n_cached[k] = seqlen[q++] + e;
            /* EAGLE: rows of real tokens, run from an exact prefix, read the target's features */
            const int real = s->n_tokens - s->n_draft;
            if (e && d->n_exact[k] < (d->n_cached[k] < real ? d->n_cached[k] : real))
                d->n_exact[k] = d->n_cached[k] < real ? d->n_cached[k] : real;
        }
    }
}

void draft_rollback(struct draft *d, const struct seq *s, int n_valid)
{
    const int k = s->draft_slot - 1;
    if (k >= 0 && d->owner[k] == s && d->n_cached[k] > n_valid) d->n_cached[k] = n_valid;
}

int32_t draft_argmax(const struct draft *d, const float *row)
{
    if (!d->n_map) return sampler_argmax(row, d->m->cfg.vocab_size);
    int32_t best = d->map[0];
    for (int i = 1; i < d->n_map; i++)
        if (row[d->map[i]] > row[best]) best = d->map[i];
    return best;
}

float draft_top_prob(const struct draft *d, const float *row)
{
    /* The whole row in loops that vectorize (sampler_exp: exp in double over Gemma's 262,144
     * logits took 3.3 ms, sampler.h), or the map's ids gathered; eight partial sums. */
    const int n = d->n_map ? d->n_map : d->m->cfg.vocab_size;
    const int32_t *ids = d->n_map ? d->map : NULL;
    float mx = ids ? -INFINITY : sampler_max(row, n), part[8] = {0};
    for (int i = 0; ids && i < n; i++) mx = row[ids[i]] > mx ? row[ids[i]] : mx;
    if (ids)
        for (int i = 0; i < n; i++) part[i & 7] += sampler_exp(row[ids[i]] - mx);
    else
        for (int i = 0; i < n; i++) part[i & 7] += sampler_exp(row[i] - mx);
    double sum = 0.0;
    for (int j = 0; j < 8; j++) sum += part[j];
    return (float)(1.0 / sum);
}
