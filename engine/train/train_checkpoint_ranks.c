/* engine/train/train_checkpoint_ranks.c - training checkpoints across ranks
 * (train_checkpoint_ranks.h): the gather onto world rank 0 on save, the slices on load.
 * Tests: tests/test_train_ckpt_parallel.c. */
#include "train_checkpoint_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ckpt_multi_rank(const struct model *m) { return m->par.world && m->par.world->size > 1; }

int ckpt_param_kind(const char *name, enum weight_kind *kind, int *layer)
{
    const char *slash = strrchr(name, '/');
    if (!slash || slash == name) return 0;
    char *end = NULL;
    const long l = strtol(slash + 1, &end, 10);
    if (end == slash + 1 || *end || l < -1) return 0;
    const size_t len = (size_t)(slash - name);
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        const char *kn = weight_kind_name((enum weight_kind)k);
        if (strlen(kn) == len && !strncmp(kn, name, len)) {
            *kind = (enum weight_kind)k;
            *layer = (int)l;
            return 1;
        }
    }
    return 0;
}

/* ---- the canonical list ------------------------------------------------------------------- */

static int64_t slice_numel(const struct host_weight *hw) { return hw->shape[0] * (hw->ndim == 2 ? hw->shape[1] : 1); }

/* Appends (kind, layer) when the model has it. stage_first[p] is stage p's first layer. */
static void canon_push(struct ckpt_gathered *g, const struct model_config *c, enum weight_kind kind, int layer,
                       const int *stage_first, int pp)
{
    if (!weight_kind_exists_at(c, kind, layer) || (kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings)) return;
    struct ckpt_canon *e = &g->t[g->n++];
    *e = (struct ckpt_canon){.kind = kind, .layer = layer};
    weight_kind_shape_at(c, kind, layer, &e->ndim, &e->rows, &e->cols);
    const enum weight_place place = weight_names_of(kind)->place;
    if (place == WEIGHT_PLACE_FIRST) e->stage = 0;
    else if (place == WEIGHT_PLACE_LAST) e->stage = pp - 1;
    else
        for (int p = 0; p < pp; p++)
            if (stage_first[p] <= layer) e->stage = p;
}

/* Every tensor of the whole model in the order weights_table lists a one-stage model's:
 * embeddings, each layer's kinds in enum order, final norm, LM head (unless tied). */
static enum status canon_list(struct ckpt_gathered *g, const struct model_config *c, const int *stage_first, int pp)
{
    g->t = calloc((size_t)WEIGHT_KIND_COUNT * (size_t)(c->n_layers + 1), sizeof *g->t);
    if (!g->t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    canon_push(g, c, WEIGHT_KIND_TOK_EMBEDDING, -1, stage_first, pp);
    canon_push(g, c, WEIGHT_KIND_POS_EMBEDDING, -1, stage_first, pp);
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < WEIGHT_KIND_COUNT; k++)
            if (weight_kind_per_layer((enum weight_kind)k)) canon_push(g, c, (enum weight_kind)k, l, stage_first, pp);
    canon_push(g, c, WEIGHT_KIND_FINAL_NORM, -1, stage_first, pp);
    canon_push(g, c, WEIGHT_KIND_FINAL_NORM_BIAS, -1, stage_first, pp);
    canon_push(g, c, WEIGHT_KIND_LM_HEAD, -1, stage_first, pp);
    return STATUS_OK;
}

/* The first layer of every pipeline stage (stages may be uneven: --pp-layers), learned from
 * the ranks themselves: an all-gather of layer_first over the control communicator into all
 * (world size). A collective. */
static enum status stage_firsts(struct model *m, int32_t *all, int *stage_first)
{
    struct parallel_world *w = m->par.world;
    int32_t mine = m->layer_first;
    struct tensor in = tensor_make(&mine, DTYPE_I32, DEVICE_CPU, 1, (int64_t)1);
    struct tensor out = tensor_make(all, DTYPE_I32, DEVICE_CPU, 1, (int64_t)w->size);
    enum status s = comm_all_gather(w->control, &out, &in);
    for (int p = 0; p < m->pp_size && s == STATUS_OK; p++)
        stage_first[p] = all[parallel_layout_rank(&m->par.layout, 0, p, 0)];
    return s;
}

/* ---- this rank's part ---------------------------------------------------------------------- */

/* Whether e's slices are the ep groups' (a mixture's experts under expert parallelism, held by dp
 * ranks 0 .. ep-1 of the stage, over every tp rank), not the tp group's. */
static int ep_sliced(const struct model *m, const struct ckpt_canon *e)
{
    return m->ep_size > 1 && weight_kind_per_expert(e->kind);
}

/* The slices of e: tp x ep for the experts under expert parallelism (slice t ep + q: tp rank t,
 * ep rank q, as model_shard_of cuts them), tp otherwise. */
static int n_slices_of(const struct model *m, const struct ckpt_canon *e)
{
    return ep_sliced(m, e) ? m->tp_size * m->ep_size : m->tp_size;
}

/* The world rank holding slice i of e (of the dp-rank-0 replica, or of its first ep groups). */
static int slice_owner(const struct model *m, const struct ckpt_canon *e, int i)
{
    return ep_sliced(m, e) ? parallel_layout_rank(&m->par.layout, i % m->ep_size, e->stage, i / m->ep_size)
                           : parallel_layout_rank(&m->par.layout, 0, e->stage, i);
}

#define N_FIELDS 4 /* the model weight, exp_avg, exp_avg_sq, the master */

/* The local tensors of entry e on a sending rank: the master weight and the parameter row. */
static enum status local_fields(struct model *m, const struct weight_ref *refs, int n_refs,
                                const struct param_table *params, struct optimizer *opt, const struct ckpt_canon *e,
                                const struct tensor **f)
{
    char name[96];
    snprintf(name, sizeof name, "%s/%d", weight_kind_name(e->kind), e->layer);
    f[0] = NULL;
    for (int i = 0; i < n_refs && !f[0]; i++)
        if (refs[i].kind == e->kind && refs[i].layer == e->layer) f[0] = refs[i].t;
    size_t row = params->n;
    for (size_t i = 0; i < params->n && row == params->n; i++)
        if (!strcmp(params->p[i].name, name)) row = i;
    if (!f[0] || row == params->n)
        return status_errorf(STATUS_UNSUPPORTED,
                             "checkpoint: rank %d (tp %d, pp %d) has no %s %s; multi-rank checkpoints need every "
                             "weight of the stage in the parameter table (full fine-tuning)",
                             m->par.world->rank, m->tp_rank, m->pp_rank, f[0] ? "parameter" : "weight", name);
    f[1] = &opt->m[row];
    f[2] = &opt->v[row];
    f[3] = params->p[row].t;
    struct host_weight hw;
    int rank, size;
    model_shard_of(m, e->kind, e->layer, &rank, &size);
    enum status s = checkpoint_describe(m->checkpoint, e->kind, e->layer, rank, size, DTYPE_F32, &hw);
    for (int k = 0; k < N_FIELDS && s == STATUS_OK; k++)
        if (f[k]->dtype != DTYPE_F32 || tensor_numel(f[k]) != slice_numel(&hw))
            s = status_errorf(STATUS_INTERNAL,
                              "checkpoint: %s on rank %d has %lld elements (f32 expected), its slice %lld",
                              name, m->par.world->rank, (long long)tensor_numel(f[k]), (long long)slice_numel(&hw));
    return s;
}

/* Whether tp rank t's slice of e is one an earlier tp rank already has (replicated tensors,
 * K/V heads shared by several ranks when n_kv_heads < tp). */
static int slice_repeats(struct checkpoint *ck, const struct ckpt_canon *e, int t, int tp, const struct host_weight *hw)
{
    for (int u = 0; u < t; u++) {
        struct host_weight o;
        if (checkpoint_describe(ck, e->kind, e->layer, u, tp, DTYPE_F32, &o) == STATUS_OK &&
            o.row_start == hw->row_start && o.col_start == hw->col_start && o.shape[0] == hw->shape[0] &&
            (hw->ndim == 1 || o.shape[1] == hw->shape[1]))
            return 1;
    }
    return 0;
}

/* Copies a slice (hw's shape, its real rows only) into the canonical (rows, cols) tensor. */
static void slice_place(float *canon, int64_t cols, const float *slice, const struct host_weight *hw)
{
    const int64_t sc = hw->ndim == 2 ? hw->shape[1] : 1;
    for (int64_t r = 0; r < hw->rows_valid; r++)
        memcpy(canon + (hw->row_start + r) * cols + hw->col_start, slice + r * sc, (size_t)sc * sizeof *slice);
}

/* Rank 0's host memory for every canonical tensor, nf fields each. */
static enum status gathered_alloc(struct ckpt_gathered *g, int nf)
{
    size_t total = 0;
    for (int i = 0; i < g->n; i++) total += (size_t)(g->t[i].rows * g->t[i].cols);
    g->mem = malloc(total * (size_t)nf * sizeof *g->mem + 1);
    if (!g->mem)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "checkpoint: rank 0 cannot hold the gathered model and state (%zu MiB of host memory)",
                             total * (size_t)nf * sizeof *g->mem >> 20);
    float *p = g->mem;
    for (int i = 0; i < g->n; i++) {
        float **f[N_FIELDS] = {&g->t[i].w, &g->t[i].m, &g->t[i].v, &g->t[i].master};
        for (int k = 0; k < nf; k++, p += g->t[i].rows * g->t[i].cols) *f[k] = p;
    }
    return STATUS_OK;
}

/* Rank 0's state as host tensors and a parameter table over them (write_state's input). */
static enum status gathered_state(struct ckpt_gathered *g, int with_master)
{
    g->tensors = calloc((size_t)g->n * 3 + 1, sizeof *g->tensors);
    if (!g->tensors) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    enum status s = STATUS_OK;
    char name[96];
    for (int i = 0; i < g->n && s == STATUS_OK; i++) {
        const struct ckpt_canon *e = &g->t[i];
        float *data[3] = {with_master ? e->master : e->w, e->m, e->v};
        for (int k = 0; k < 3; k++)
            g->tensors[(size_t)k * g->n + i] = e->ndim == 2
                                                   ? tensor_make(data[k], DTYPE_F32, DEVICE_CPU, 2, e->rows, e->cols)
                                                   : tensor_make(data[k], DTYPE_F32, DEVICE_CPU, 1, e->rows);
        snprintf(name, sizeof name, "%s/%d", weight_kind_name(e->kind), e->layer);
        s = param_table_add(&g->params, name, &g->tensors[i], e->ndim == 2);
    }
    return s;
}

/* Moves every slice to rank 0 in the one order all ranks walk: entries, then tp ranks, then
 * fields. Each sender's messages are a subsequence of rank 0's receives, so blocking sends
 * cannot deadlock. */
static enum status gather_slices(struct model *m, struct ckpt_gathered *g, const struct tensor *(*local)[N_FIELDS],
                                 int nf, float *stage)
{
    struct parallel_world *w = m->par.world;
    enum status s = STATUS_OK;
    for (int i = 0; i < g->n && s == STATUS_OK; i++) {
        const struct ckpt_canon *e = &g->t[i];
        const int n_slices = n_slices_of(m, e);
        for (int t = 0; t < n_slices && s == STATUS_OK; t++) {
            struct host_weight hw;
            if ((s = checkpoint_describe(m->checkpoint, e->kind, e->layer, t, n_slices, DTYPE_F32, &hw)) != STATUS_OK)
                break;
            if (slice_repeats(m->checkpoint, e, t, n_slices, &hw)) continue;
            const int owner = slice_owner(m, e, t);
            if (w->rank != 0 && w->rank != owner) continue;
            float *dst[N_FIELDS] = {e->w, e->m, e->v, e->master};
            struct tensor x = tensor_make(stage, DTYPE_F32, DEVICE_CPU, 1, slice_numel(&hw));
            for (int k = 0; k < nf && s == STATUS_OK; k++) {
                if (w->rank == owner) backend_download(m->b, stage, local[i][k]->data, tensor_nbytes(&x));
                if (w->rank == 0 && owner != 0) s = comm_recv(w->control, &x, owner);
                else if (w->rank != 0) s = comm_send(w->control, &x, 0);
                if (s == STATUS_OK && w->rank == 0) slice_place(dst[k], e->cols, stage, &hw);
            }
        }
    }
    return s;
}

enum status ckpt_gather(struct model *m, struct model_weights *master, const struct param_table *params,
                        struct optimizer *opt, int with_master, struct ckpt_gathered *g)
{
    struct parallel_world *w = m->par.world;
    const int nf = with_master ? 4 : 3, sender = m->par.layout.dp_rank == 0;
    memset(g, 0, sizeof *g);
    g->norm_weight_offset = m->cfg.norm_weight_offset;
    int32_t *all = malloc((size_t)w->size * sizeof *all);
    int *stage_first = calloc((size_t)m->pp_size, sizeof *stage_first);
    struct weight_ref *refs = malloc((size_t)weights_table_max(master->n_layers) * sizeof *refs);
    const struct tensor *(*local)[N_FIELDS] = NULL;
    float *stage = NULL;
    enum status s = STATUS_OK;
    if (!all || !stage_first || !refs) s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    if ((s = parallel_agree(w, s)) == STATUS_OK) s = stage_firsts(m, all, stage_first);
    if (s == STATUS_OK) s = canon_list(g, &m->cfg, stage_first, m->pp_size);
    if (s == STATUS_OK && !(local = calloc((size_t)g->n + 1, sizeof *local)))
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    /* This rank's tensors for what it sends, and room for one slice at a time. */
    const int n_refs = s == STATUS_OK ? weights_table(master, m->layer_first, 1, refs) : 0;
    int64_t largest = 1;
    for (int i = 0; s == STATUS_OK && i < g->n; i++) {
        if (g->t[i].rows * g->t[i].cols > largest) largest = g->t[i].rows * g->t[i].cols;
        const int sends = ep_sliced(m, &g->t[i]) ? m->par.layout.dp_rank < m->ep_size : sender;
        if (sends && g->t[i].stage == m->pp_rank) s = local_fields(m, refs, n_refs, params, opt, &g->t[i], local[i]);
    }
    for (size_t i = 0; s == STATUS_OK && i < params->n; i++) {
        enum weight_kind kind;
        int layer;
        if (!ckpt_param_kind(params->p[i].name, &kind, &layer))
            s = status_errorf(STATUS_UNSUPPORTED, "checkpoint: parameter %s is not a weight; multi-rank checkpoints "
                                                  "hold full fine-tuning only", params->p[i].name);
    }
    if (s == STATUS_OK && (w->rank == 0 || sender || m->par.layout.dp_rank < m->ep_size) &&
        !(stage = malloc((size_t)largest * sizeof *stage)))
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint: out of host memory");
    if (s == STATUS_OK && w->rank == 0) s = gathered_alloc(g, nf);
    /* No rank may start sending to a rank 0 that will not receive. */
    if ((s = parallel_agree(w, s)) == STATUS_OK) s = gather_slices(m, g, local, nf, stage);
    if (s == STATUS_OK && w->rank == 0) s = gathered_state(g, with_master);
    s = parallel_agree(w, s);
    free(all);
    free(stage_first);
    free(refs);
    free(local);
    free(stage);
    if (s != STATUS_OK) ckpt_gathered_free(g);
    return s;
}

enum status ckpt_gathered_source(void *ctx, enum weight_kind kind, int layer, float *dst, int64_t n)
{
    const struct ckpt_gathered *g = ctx;
    for (int i = 0; i < g->n; i++) {
        const struct ckpt_canon *e = &g->t[i];
        if (e->kind != kind || (weight_kind_per_layer(kind) && e->layer != layer)) continue;
        if (!e->w || e->rows * e->cols != n) break;
        memcpy(dst, e->w, (size_t)n * sizeof *dst);
        if (weight_kind_is_norm(kind) && g->norm_weight_offset != 0.0f)
            for (int64_t j = 0; j < n; j++) dst[j] -= g->norm_weight_offset;
        return STATUS_OK;
    }
    return status_errorf(STATUS_INTERNAL, "checkpoint: nothing gathered for %s of %lld elements (layer %d)",
                         weight_kind_name(kind), (long long)n, layer);
}

void ckpt_gathered_free(struct ckpt_gathered *g)
{
    free(g->t);
    free(g->mem);
    free(g->tensors);
    param_table_free(&g->params);
    memset(g, 0, sizeof *g);
}

/* ---- loading ------------------------------------------------------------------------------- */

enum status ckpt_state_slice(struct checkpoint *ck, const struct st_tensor *t, const char *path, enum weight_kind kind,
                             int layer, int tp_rank, int tp_size, float *dst, int64_t n)
{
    int ndim;
    int64_t rows, cols;
    weight_kind_shape_at(&ck->cfg, kind, layer, &ndim, &rows, &cols);
    if (!t->supported || t->dtype != DTYPE_F32 || t->ndim != ndim || t->shape[0] != rows ||
        (ndim == 2 && t->shape[1] != cols))
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: state tensor %s is %s[%lld%s%lld], the model's %s is f32[%lld%s%lld] "
                             "(another model?)",
                             path, t->name, t->dtype_name, (long long)t->shape[0], t->ndim == 2 ? "," : "",
                             t->ndim == 2 ? (long long)t->shape[1] : 0LL, weight_kind_name(kind), (long long)rows,
                             ndim == 2 ? "," : "", ndim == 2 ? (long long)cols : 0LL);
    struct host_weight hw;
    enum status s = checkpoint_describe(ck, kind, layer, tp_rank, tp_size, DTYPE_F32, &hw);
    if (s != STATUS_OK) return s;
    if (slice_numel(&hw) != n)
        return status_errorf(STATUS_BAD_FORMAT,
                             "%s: %s: the local tensor has %lld elements, its slice at tp %d/%d %lld",
                             path, t->name, (long long)n, tp_rank, tp_size, (long long)slice_numel(&hw));
    const int64_t sc = hw.ndim == 2 ? hw.shape[1] : 1;
    memset(dst, 0, (size_t)n * sizeof *dst);
    for (int64_t r = 0; r < hw.rows_valid; r++)
        memcpy(dst + r * sc, (const char *)t->data + (size_t)((hw.row_start + r) * cols + hw.col_start) * sizeof *dst,
               (size_t)sc * sizeof *dst);
    return STATUS_OK;
}
