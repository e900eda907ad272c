/* engine/train/lora_ranks.c - LoRA training across ranks (lora_ranks.h).
 * Tests: tests/test_train_parallel.sh. */
#include "lora_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether the (target, A|B) tensor is split over tp (else whole on every rank). */
static int split_tensor(enum lora_target t, int is_b)
{
    return is_b ? !lora_target_row_parallel(t) : lora_target_row_parallel(t);
}

/* Parses "lora/<target>/<layer>/<A|B>". Returns 0 when the name is not an adapter's. */
static int parse_row(const char *name, enum lora_target *t, int *layer, int *is_b)
{
    char tn[32], ab = 0;
    if (sscanf(name, "lora/%31[^/]/%d/%c", tn, layer, &ab) != 3) return 0;
    for (int k = 0; k < LORA_TARGET_COUNT; k++)
        if (!strcmp(tn, lora_target_name((enum lora_target)k))) {
            *t = (enum lora_target)k;
            *is_b = ab == 'B';
            return 1;
        }
    return 0;
}

void lora_ranks_mark(const struct model *m, struct param_table *params, struct param_table *grads)
{
    for (size_t i = 0; i < params->n; i++) {
        enum lora_target t;
        int layer = 0, is_b = 0;
        if (m->tp_size == 1 || !parse_row(params->p[i].name, &t, &layer, &is_b)) continue;
        const int whole = !split_tensor(t, is_b); /* replicated, its gradient a per-rank part */
        struct param *rows[2] = {&params->p[i], &grads->p[i]};
        for (int k = 0; k < 2; k++) {
            rows[k]->tp_partial = whole;
            rows[k]->counted = !whole || m->tp_rank == 0;
        }
    }
}

static int find_row(const struct param_table *pt, const char *name)
{
    for (size_t i = 0; i < pt->n; i++)
        if (!strcmp(pt->p[i].name, name)) return (int)i;
    return -1;
}

/* Places a slice (rows x len, or len x rank) of a split tensor into the whole one. */
static void place(float *whole, const float *slice, int is_b, int64_t rank, int64_t in_w, int64_t start, int64_t len)
{
    if (is_b) { /* B rows start .. start + len */
        memcpy(whole + start * rank, slice, (size_t)(len * rank) * sizeof *whole);
        return;
    }
    for (int64_t r = 0; r < rank; r++) /* A columns start .. start + len */
        memcpy(whole + r * in_w + start, slice + r * len, (size_t)len * sizeof *whole);
}

/* Rank 0's whole adapter and the table and moments the files are written from. */
struct whole {
    struct lora *l;
    struct param_table params;
    struct optimizer opt;
    int opt_made;
};

static enum status whole_make(struct model *m, const struct lora *l, const struct optimizer *opt, struct whole *wh)
{
    enum status s = lora_create_whole(m, l, &wh->l);
    char name[96];
    for (int g = 0; s == STATUS_OK && g < wh->l->n_layers; g++)
        for (int t = 0; s == STATUS_OK && t < LORA_TARGET_COUNT; t++) {
            struct lora_site *site = &wh->l->sites[g][t];
            if (!site->a.data) continue;
            snprintf(name, sizeof name, "lora/%s/%d/A", lora_target_name((enum lora_target)t), g);
            if (lora_target_leader(wh->l, (enum lora_target)t) == (enum lora_target)t && /* fused: one A */
                (s = param_table_add(&wh->params, name, &site->a, 1)) != STATUS_OK)
                break;
            snprintf(name, sizeof name, "lora/%s/%d/B", lora_target_name((enum lora_target)t), g);
            s = param_table_add(&wh->params, name, &site->b, 1);
        }
    if (s == STATUS_OK && (s = optimizer_init(&wh->opt, m->b, &wh->params, &opt->o)) == STATUS_OK) {
        wh->opt_made = 1;
        wh->opt.step = opt->step;
    }
    return s;
}

static void whole_free(struct model *m, struct whole *wh)
{
    if (wh->opt_made) optimizer_free(&wh->opt, m->b);
    param_table_free(&wh->params);
    lora_free(wh->l, m->b);
}

/* One (layer, target, A|B): every slice's value and moments to rank 0, assembled there. */
static enum status gather_one(struct model *m, const struct lora *l, const struct param_table *params,
                              struct optimizer *opt, const int *stage_of, struct whole *wh, int g, enum lora_target t,
                              int is_b, float *buf, float *host)
{
    struct parallel_world *w = m->par.world;
    const int split = split_tensor(t, is_b), pp = stage_of[g], rk = l->rank;
    char name[96];
    snprintf(name, sizeof name, "lora/%s/%d/%c", lora_target_name(t), g, is_b ? 'B' : 'A');
    int64_t out_w = 0, in_w = 0, start = 0, len = 0;
    enum status s = lora_site_geometry(m, g, t, 0, &out_w, &in_w, &start, &len);
    const int64_t whole_n = is_b ? out_w * rk : rk * in_w;
    for (int j = 0; s == STATUS_OK && j < (split ? m->tp_size : 1); j++) {
        const int src = parallel_layout_rank(&m->par.layout, 0, pp, j);
        if (w->rank != src && w->rank != 0) continue;
        if ((s = lora_site_geometry(m, g, t, j, &out_w, &in_w, &start, &len)) != STATUS_OK) break;
        const int64_t n = split ? (is_b ? len * rk : rk * len) : whole_n;
        struct tensor msg = tensor_make(buf, DTYPE_F32, DEVICE_CPU, 1, 3 * n);
        if (w->rank == src) { /* value, exp_avg, exp_avg_sq of this rank's slice */
            const int row = find_row(params, name);
            const struct lora_site *site = &l->sites[g - m->layer_first][t];
            CHECK(row >= 0, "no parameter row %s", name);
            const struct tensor *parts[3] = {is_b ? &site->b : &site->a, &opt->m[row], &opt->v[row]};
            for (int k = 0; k < 3; k++) {
                CHECK(tensor_numel(parts[k]) == n, "%s: %lld elements, expected %lld", name,
                      (long long)tensor_numel(parts[k]), (long long)n);
                backend_download(m->b, buf + k * n, parts[k]->data, (size_t)n * sizeof *buf);
            }
            if (src != 0 && (s = comm_send(w->control, &msg, 0)) != STATUS_OK) break;
        } else if ((s = comm_recv(w->control, &msg, src)) != STATUS_OK) {
            break;
        }
        if (w->rank != 0) continue;
        for (int k = 0; k < 3; k++) {
            if (split) place(host + k * whole_n, buf + k * n, is_b, rk, in_w, start, len);
            else memcpy(host + k * whole_n, buf + k * n, (size_t)n * sizeof *buf);
        }
    }
    if (s != STATUS_OK || w->rank != 0) return s;
    const int row = find_row(&wh->params, name);
    CHECK(row >= 0, "no whole row %s", name);
    const struct tensor *dst[3] = {wh->params.p[row].t, &wh->opt.m[row], &wh->opt.v[row]};
    for (int k = 0; k < 3; k++) backend_upload(m->b, dst[k]->data, host + k * whole_n, (size_t)whole_n * sizeof *host);
    return STATUS_OK;
}

enum status lora_ranks_save(const char *dir, struct model *m, const struct lora *l, const char *base_model,
                            const struct param_table *params, struct optimizer *opt, const struct train_state *st)
{
    struct parallel_world *w = m->par.world;
    const int L = m->cfg.n_layers, W = w->size;
    /* Which stage holds each layer: every rank's (first layer, count), gathered. */
    int32_t mine[2] = {m->layer_first, m->n_layers_local};
    int32_t *all = malloc((size_t)W * 2 * sizeof *all);
    int *stage_of = calloc((size_t)(L > 0 ? L : 1), sizeof *stage_of);
    struct whole wh = {0};
    float *buf = NULL, *host = NULL;
    enum status s = all && stage_of ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    if (s == STATUS_OK) {
        struct tensor in = tensor_make(mine, DTYPE_I32, DEVICE_CPU, 1, (int64_t)2);
        struct tensor out = tensor_make(all, DTYPE_I32, DEVICE_CPU, 1, (int64_t)W * 2);
        s = comm_all_gather(w->control, &out, &in);
    }
    for (int p = 0; s == STATUS_OK && p < m->pp_size; p++) {
        const int r = parallel_layout_rank(&m->par.layout, 0, p, 0);
        for (int g = all[2 * r]; g < all[2 * r] + all[2 * r + 1] && g < L; g++) stage_of[g] = p;
    }
    /* Scratch for the largest tensor: A or B of the widest target, three times (value, moments). */
    int64_t widest = 0;
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        int64_t o = 0, in = 0, start = 0;
        if (s == STATUS_OK && l->sites[0][t].a.data && lora_site_geometry(m, 0, (enum lora_target)t, 0, &o, &in, &start, NULL) == STATUS_OK)
            widest = o > widest ? o : in > widest ? in : widest;
    }
    const size_t scratch = (size_t)(3 * widest * l->rank) * sizeof(float);
    if (s == STATUS_OK && (!(buf = malloc(scratch)) || !(host = malloc(scratch))))
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "train: out of host memory");
    if (s == STATUS_OK && w->rank == 0) s = whole_make(m, l, opt, &wh);
    s = parallel_agree(w, s);
    for (int g = 0; s == STATUS_OK && g < L; g++)
        for (int t = 0; s == STATUS_OK && t < LORA_TARGET_COUNT; t++)
            for (int b = 0; s == STATUS_OK && b < 2 && l->sites[0][t].a.data; b++)
                if (b || lora_target_leader(l, (enum lora_target)t) == (enum lora_target)t) /* fused: one A */
                    s = gather_one(m, l, params, opt, stage_of, &wh, g, (enum lora_target)t, b, buf, host);
    if (s == STATUS_OK && w->rank == 0) s = train_checkpoint_save_adapter_whole(dir, m, wh.l, base_model, &wh.params, &wh.opt, st);
    s = parallel_agree(w, s);
    if (w->rank == 0) whole_free(m, &wh);
    free(all);
    free(stage_of);
    free(buf);
    free(host);
    return s;
}
