/* engine/model/step_graph.c - a step's inputs and block table, decode steps run from backend
 * graphs (step_graph.h).
 * Tests: tests/test_step_graph.c. */
#include "step_graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A capture's logits against the same step run op by op: within this much of the larger
 * magnitude (and of 1), they agree. The two run the same kernels on the same values, so on the
 * CPU they are the same bits; on CUDA an op that sums with atomics may move a last bit. */
#define GRAPH_VERIFY_TOL 1e-2

struct step_graph {
    struct step_graph_key key;
    struct backend_graph *g;
    int                   seen;    /* steps of this key so far */
    int                   refused; /* its recording failed: op by op from now on */
    long                  used;    /* the clock when it last ran (the least recent is dropped) */
};

struct step_graphs {
    int               on;
    int32_t          *table; /* step_table's rows (table_cap entries) */
    size_t            table_cap;
    char             *inputs; /* step_upload's image of the workspace's inputs (inputs_cap bytes) */
    size_t            inputs_cap;
    int32_t          *pad; /* step_graph_pad's arrays (pad_cap entries) */
    size_t            pad_cap;
    int               n;
    long              clock;
    struct step_graph e[STEP_GRAPHS_MAX];
    struct model_graph_stats stats;
    int               test_mismatch; /* SHARDLM_TEST_GRAPH_MISMATCH=1: every capture's logits read as off */
};

enum status step_graphs_setup(struct model *m)
{
    if (m->graphs) return STATUS_OK;
    const char *v = getenv("SHARDLM_GRAPHS");
    int on = m->b->device == DEVICE_CUDA;
    if (v && *v) {
        if (!strcmp(v, "0")) on = 0;
        else if (!strcmp(v, "1")) on = 1;
        else return status_errorf(STATUS_INVALID_ARGUMENT, "SHARDLM_GRAPHS=%s: expected 0 or 1", v);
    }
    m->graphs = calloc(1, sizeof *m->graphs);
    if (!m->graphs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    m->graphs->on = on && !m->b->sync_check; /* a synchronize after every op cannot be recorded */
    const char *t = getenv("SHARDLM_TEST_GRAPH_MISMATCH");
    m->graphs->test_mismatch = t && !strcmp(t, "1");
    m->graphs->stats.on = m->graphs->on;
    return STATUS_OK;
}

void step_graphs_drop(struct model *m)
{
    struct step_graphs *gs = m->graphs;
    if (!gs) return;
    for (int i = 0; i < gs->n; i++) backend_graph_free(m->b, gs->e[i].g), gs->e[i].g = NULL;
    gs->n = 0;
}

void step_graphs_free(struct model *m)
{
    const struct model_graph_stats st = model_graph_stats(m);
    if (st.captured || st.refused)
        LOG_INFO("model", "step graphs: %ld captured (%ld verified, %ld mismatched), %ld steps replayed (%ld padded), "
                 "%ld shapes refused", st.captured, st.verified, st.mismatched, st.replayed, st.padded, st.refused);
    step_graphs_drop(m);
    if (m->graphs) free(m->graphs->table), free(m->graphs->inputs), free(m->graphs->pad);
    free(m->graphs);
    m->graphs = NULL;
}

struct model_graph_stats model_graph_stats(const struct model *m)
{
    return m->graphs ? m->graphs->stats : (struct model_graph_stats){0};
}

/* What a graph needs of the model and of fb, the host's arrays: one rank, one new row per
 * sequence, no adapter row, no draft rows, no EAGLE inputs or other head. */
static int may_take(const struct model *m, const struct forward_batch *fb)
{
    if (!m->graphs || !m->graphs->on || fb->n_logits <= 0 || fb->n_tokens != fb->n_seqs) return 0;
    if (m->tp_size != 1 || m->pp_size != 1 || m->ep_size > 1 || m->cfg.n_experts > 0) return 0;
    if (fb->features || fb->hidden || fb->head || m->input_fc_emb.data) return 0;
    for (int s = 0; s < fb->n_seqs; s++)
        if (fb->q_start[s + 1] - fb->q_start[s] != 1 || (fb->seq_row_path && fb->seq_row_path[s]) ||
            (fb->seq_adapter && m->n_adapters > 0 && fb->seq_adapter[s] >= 0))
            return 0;
    return 1;
}

int step_graph_bucket(int n, int cap)
{
    int b = 1;
    while (b < n && b < 8) b *= 2;
    if (n > 8) b = (n + 7) / 8 * 8;
    if (b > cap) b = cap;
    return b > n ? b : n;
}

const struct forward_batch *step_graph_pad(struct model *m, const struct forward_batch *fb, struct forward_batch *out)
{
    struct step_graphs *gs = m->graphs;
    if (!may_take(m, fb) || fb->n_logits != fb->n_seqs) return fb;
    const struct model_workspace *ws = &m->ws;
    int cap = ws->max_seqs < ws->max_tokens ? ws->max_seqs : ws->max_tokens;
    if (ws->max_logits < cap) cap = ws->max_logits;
    const int n = fb->n_seqs, rows = step_graph_bucket(n, cap);
    if (rows == n) return fb;
    const size_t need = 6 * (size_t)rows + 1;
    if (need > gs->pad_cap) {
        int32_t *p = realloc(gs->pad, need * sizeof *p);
        if (!p) return fb; /* out of host memory: the step as it came, exact */
        gs->pad = p, gs->pad_cap = need;
    }
    int32_t *tok = gs->pad, *pos = tok + rows, *slot = pos + rows, *lrow = slot + rows, *len = lrow + rows;
    int32_t *q_start = len + rows;
    for (int i = 0; i < rows; i++) {
        const int real = i < n;
        tok[i] = fb->tokens[real ? i : n - 1];
        pos[i] = real ? fb->positions[i] : 0;
        slot[i] = real ? fb->slots[i] : -1;
        lrow[i] = real ? fb->logit_rows[i] : i;
        len[i] = real ? fb->seq_len[i] : 1;
        q_start[i] = i;
    }
    q_start[rows] = rows;
    *out = *fb;
    out->n_tokens = out->n_seqs = out->n_logits = rows;
    out->tokens = tok, out->positions = pos, out->slots = slot, out->logit_rows = lrow;
    out->seq_len = len, out->q_start = q_start;
    out->seq_row_path = NULL, out->seq_adapter = NULL; /* none marked (may_take) */
    gs->stats.padded++;
    return out;
}

int step_graph_fits(struct model *m, const struct kv_cache *cache, const struct forward_batch *fb,
                    struct attention_batch *ab, struct step_graph_key *key)
{
    if (!ab->decode_only || !may_take(m, fb)) return 0;
    ab->row_path = NULL; /* every mark 0: none (a host array a graph could not read) */
    ab->max_seq_len = ab->max_blocks * cache->block_tokens; /* the table's reach: a power of two of blocks */
    *key = (struct step_graph_key){.pool = cache->k[0].data, .pool_blocks = cache->k[0].shape[0],
                                   .n_seqs = fb->n_seqs, .n_logits = fb->n_logits,
                                   .max_blocks = ab->max_blocks, .max_seq_len = ab->max_seq_len};
    return 1;
}

const int32_t *step_table(struct model *m, const struct forward_batch *fb, int real, int block_tokens,
                          int max_seq_len, int *width)
{
    struct step_graphs *gs = m->graphs;
    int w = 1;
    while (w < fb->max_blocks && (int64_t)w * block_tokens < max_seq_len) w *= 2;
    if (w > fb->max_blocks) w = fb->max_blocks;
    *width = fb->max_blocks;
    CHECK(real > 0 && real <= fb->n_seqs && (real == fb->n_seqs || gs), "step_table: %d of %d rows", real, fb->n_seqs);
    if ((w == fb->max_blocks && real == fb->n_seqs) || !gs) return fb->block_table;
    const size_t need = (size_t)fb->n_seqs * (size_t)w;
    if (need > gs->table_cap) {
        int32_t *t = realloc(gs->table, 2 * need * sizeof *t);
        CHECK(t || real == fb->n_seqs, "model: out of host memory for a padded step's block table");
        if (!t) return fb->block_table; /* out of host memory: the caller's rows, whole */
        gs->table = t, gs->table_cap = 2 * need;
    }
    for (int s = 0; s < fb->n_seqs; s++)
        memcpy(gs->table + (size_t)s * (size_t)w,
               fb->block_table + (size_t)(s < real ? s : real - 1) * (size_t)fb->max_blocks,
               (size_t)w * sizeof *gs->table);
    *width = w;
    return gs->table;
}

/* n i32 values of src at t's offset in the inputs' image (base: the first input's device address) */
static void put_i32(char *image, const char *base, const struct tensor *t, const int32_t *src, int64_t n)
{
    if (n > 0) memcpy(image + ((const char *)t->data - base), src, (size_t)n * sizeof *src);
}

void step_upload(struct model *m, const struct forward_batch *fb, const int32_t *table, int width)
{
    struct step_graphs *gs = m->graphs;
    const struct model_workspace *ws = &m->ws;
    const char *base = ws->tokens.data;
    const struct tensor *in[] = {&ws->positions, &ws->slots, &ws->logit_rows, &ws->q_start, &ws->seq_len};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++)
        CHECK((const char *)in[i]->data > base && (const char *)in[i]->data < (const char *)ws->block_table.data,
              "model: the workspace's step inputs are not together before the block table");
    const size_t end = (size_t)((const char *)ws->block_table.data - base) + (size_t)fb->n_seqs * (size_t)width * 4;
    if (end > gs->inputs_cap) {
        char *p = realloc(gs->inputs, end);
        CHECK(p, "model: out of host memory for a step's %zu bytes of inputs", end);
        memset(p + gs->inputs_cap, 0, end - gs->inputs_cap); /* the gaps between inputs: zeros, never read */
        gs->inputs = p, gs->inputs_cap = end;
    }
    put_i32(gs->inputs, base, &ws->tokens, fb->tokens, fb->n_tokens);
    put_i32(gs->inputs, base, &ws->positions, fb->positions, fb->n_tokens);
    put_i32(gs->inputs, base, &ws->slots, fb->slots, fb->n_tokens);
    put_i32(gs->inputs, base, &ws->logit_rows, fb->logit_rows, fb->n_logits);
    put_i32(gs->inputs, base, &ws->q_start, fb->q_start, fb->n_seqs + 1);
    put_i32(gs->inputs, base, &ws->seq_len, fb->seq_len, fb->n_seqs);
    put_i32(gs->inputs, base, &ws->block_table, table, (int64_t)fb->n_seqs * width);
    backend_upload(m->b, ws->tokens.data, gs->inputs, end);
}

static int same_key(const struct step_graph_key *a, const struct step_graph_key *b)
{
    return a->pool == b->pool && a->pool_blocks == b->pool_blocks && a->n_seqs == b->n_seqs &&
           a->n_logits == b->n_logits && a->max_blocks == b->max_blocks && a->max_seq_len == b->max_seq_len;
}

/* The entry of key: found, else new (in the least recently used one's place when all are taken). */
static struct step_graph *entry(struct model *m, const struct step_graph_key *key)
{
    struct step_graphs *gs = m->graphs;
    for (int i = 0; i < gs->n; i++)
        if (same_key(&gs->e[i].key, key)) return &gs->e[i];
    struct step_graph *e = &gs->e[0];
    if (gs->n < STEP_GRAPHS_MAX) e = &gs->e[gs->n++];
    else {
        for (int i = 1; i < gs->n; i++)
            if (gs->e[i].used < e->used) e = &gs->e[i];
        backend_graph_free(m->b, e->g);
    }
    *e = (struct step_graph){.key = *key};
    return e;
}

/* A capture's first launch checked: its logits downloaded, the same step run op by op (body
 * again: the KV rows it writes are the ones the graph wrote), its logits downloaded and compared.
 * Returns 1 when they agree (GRAPH_VERIFY_TOL), or when it could not tell (no host memory); *st is
 * the op-by-op run's status, whose logits are the step's either way; *diff and *scale the largest
 * difference and magnitude. */
static int verify_capture(struct model *m, const struct step_graph_key *key, enum status (*body)(void *ctx),
                          void *ctx, enum status *st, double *diff, double *scale)
{
    const struct tensor lg = tensor_first_rows(&m->ws.logits, key->n_logits);
    const size_t bytes = tensor_nbytes(&lg), n = (size_t)tensor_numel(&lg);
    char *host = malloc(2 * bytes);
    *diff = 0.0, *scale = 1.0;
    if (!host) return (*st = body(ctx)), 1;
    backend_download(m->b, host, lg.data, bytes);
    if (m->graphs->test_mismatch) dtype_store_f32(host, lg.dtype, 0, dtype_load_f32(host, lg.dtype, 0) + 100.0f);
    if ((*st = body(ctx)) != STATUS_OK) return free(host), 1;
    backend_download(m->b, host + bytes, lg.data, bytes);
    for (size_t i = 0; i < n; i++) {
        const double x = dtype_load_f32(host, lg.dtype, i), y = dtype_load_f32(host + bytes, lg.dtype, i);
        if (isnan(x) != isnan(y)) *diff = INFINITY;
        else if (!isnan(x) && x != y) *diff = fmax(*diff, fabs(x - y)); /* (equal infinities agree) */
        if (isfinite(x) && isfinite(y)) *scale = fmax(*scale, fmax(fabs(x), fabs(y)));
    }
    free(host);
    return *diff <= GRAPH_VERIFY_TOL * *scale;
}

enum status step_graph_run(struct model *m, const struct step_graph_key *key, enum status (*body)(void *ctx),
                           void *ctx)
{
    struct step_graphs *gs = m->graphs;
    struct step_graph *e = entry(m, key);
    e->used = ++gs->clock;
    if (e->g) {
        if (backend_graph_launch(m->b, e->g) == STATUS_OK) {
            gs->stats.replayed++;
            return STATUS_OK;
        }
        LOG_DEBUG("model", "step graph (%d sequences): %s; recorded again", key->n_seqs, status_message());
        backend_graph_free(m->b, e->g);
        e->g = NULL;
    }
    /* The first step of a key runs op by op: the op scratch grows to what it needs, which a
     * recording could not do. */
    if (e->refused || e->seen++ == 0) return body(ctx);
    enum status st = backend_graph_begin(m->b);
    if (st == STATUS_OK) {
        const enum status ops = body(ctx);
        struct backend_graph *g = NULL;
        st = backend_graph_end(m->b, &g);
        if (ops != STATUS_OK) {
            backend_graph_free(m->b, g);
            return ops;
        }
        if (st == STATUS_OK && (st = backend_graph_launch(m->b, g)) == STATUS_OK) {
            e->g = g;
            if (gs->stats.captured++ == 0)
                LOG_INFO("model", "decode steps run from graphs (the first: %d sequences, max_seq_len %d)",
                         key->n_seqs, key->max_seq_len);
            double diff, scale;
            if (verify_capture(m, key, body, ctx, &st, &diff, &scale)) {
                gs->stats.verified++;
                return st;
            }
            gs->stats.mismatched++;
            gs->on = 0; /* a replay that is not the step: none from now on */
            LOG_WARN("model", "a decode step's graph (%d sequences) gave logits %g away from the same step run op "
                     "by op (largest magnitude %g): graphs are turned off, steps run op by op", key->n_seqs, diff, scale);
            return st;
        }
        backend_graph_free(m->b, g);
    }
    LOG_WARN("model", "a decode step of %d sequences cannot run from a graph (%s): it runs op by op", key->n_seqs,
             status_message());
    e->refused = 1;
    gs->stats.refused++;
    return body(ctx);
}
