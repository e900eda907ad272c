/* engine/model/lora.c - low-rank adapters: creation, the training forward and backward of a
 * target, the PEFT files (lora.h); merging is lora_merge.c, serving lora_serve.c.
 * Tests: tests/test_train_grad.py, tests/test_train.sh. */
#include "lora.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

static const struct {
    const char *name, *module, *block;
    enum weight_kind kind;
} targets[LORA_TARGET_COUNT] = {
    [LORA_TARGET_Q] = {"q", "q_proj", "self_attn", WEIGHT_KIND_Q},
    [LORA_TARGET_K] = {"k", "k_proj", "self_attn", WEIGHT_KIND_K},
    [LORA_TARGET_V] = {"v", "v_proj", "self_attn", WEIGHT_KIND_V},
    [LORA_TARGET_O] = {"o", "o_proj", "self_attn", WEIGHT_KIND_O},
    [LORA_TARGET_GATE] = {"gate", "gate_proj", "mlp", WEIGHT_KIND_GATE},
    [LORA_TARGET_UP] = {"up", "up_proj", "mlp", WEIGHT_KIND_UP},
    [LORA_TARGET_DOWN] = {"down", "down_proj", "mlp", WEIGHT_KIND_DOWN},
};

/* Phi-3's fused modules (lora.h): group g is bit 1 << g of struct lora.fused; the members in the
 * order of the fused B's rows, the first of them the leader that holds A. */
#define N_FUSED 2
static const struct {
    const char *name, *module, *block;
    unsigned members;
    enum lora_target leader;
} fused_groups[N_FUSED] = {
    {"qkv", "qkv_proj", "self_attn", 1u << LORA_TARGET_Q | 1u << LORA_TARGET_K | 1u << LORA_TARGET_V, LORA_TARGET_Q},
    {"gate_up", "gate_up_proj", "mlp", 1u << LORA_TARGET_GATE | 1u << LORA_TARGET_UP, LORA_TARGET_GATE},
};

const char *lora_target_name(enum lora_target t) { return targets[t].name; }
const char *lora_target_module(enum lora_target t) { return targets[t].module; }

/* The group t belongs to, or -1. */
static int group_of(enum lora_target t)
{
    for (int g = 0; g < N_FUSED; g++)
        if (fused_groups[g].members & (1u << t)) return g;
    return -1;
}

enum lora_target lora_target_leader(const struct lora *l, enum lora_target t)
{
    const int g = group_of(t);
    return g >= 0 && (l->fused & (1u << g)) ? fused_groups[g].leader : t;
}

/* One target or module name into *mask, and into *fused the group a fused module name means. */
static enum status parse_target(const char *p, unsigned *mask, unsigned *fused)
{
    for (int t = 0; t < LORA_TARGET_COUNT; t++)
        if (!strcmp(p, targets[t].name) || !strcmp(p, targets[t].module)) {
            *mask |= 1u << t;
            return STATUS_OK;
        }
    for (int g = 0; g < N_FUSED; g++)
        if (!strcmp(p, fused_groups[g].name) || !strcmp(p, fused_groups[g].module)) {
            *mask |= fused_groups[g].members;
            *fused |= 1u << g;
            return STATUS_OK;
        }
    return status_errorf(STATUS_INVALID_ARGUMENT, "LoRA target '%s' is not one of q, k, v, o, gate, up, down, qkv, "
                         "gate_up (or q_proj ... down_proj, qkv_proj, gate_up_proj)", p);
}

enum status lora_parse_targets(const char *text, unsigned *mask)
{
    *mask = 0;
    unsigned fused = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    char *save = NULL;
    for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        enum status st = parse_target(p, mask, &fused);
        if (st != STATUS_OK) return st;
    }
    if (!*mask) return status_errorf(STATUS_INVALID_ARGUMENT, "no LoRA target in '%s'", text);
    return STATUS_OK;
}

/* A mixture of experts takes adapters on its attention (q, k, v, o) only: its MLP is the experts
 * (and Qwen 2 MoE's shared expert), which no adapter reaches (moe.c has no adapter hooks). */
static enum status moe_targets_ok(const struct model *m, unsigned mask)
{
    const unsigned mlp = 1u << LORA_TARGET_GATE | 1u << LORA_TARGET_UP | 1u << LORA_TARGET_DOWN;
    if (m->cfg.n_experts && (mask & mlp))
        return status_errorf(STATUS_UNSUPPORTED, "LoRA adapters on a mixture of experts' MLP (%s: gate, up, down) are "
                             "not built; its attention (q, k, v, o) takes them", m->cfg.architecture);
    return STATUS_OK;
}

/* The groups an adapter of `mask` on m fuses: on a model whose Hugging Face layout fuses them
 * (Phi-3), every group it targets, which it must target whole (PEFT has one module for it). */
static enum status model_fused_groups(const struct model *m, unsigned mask, unsigned *fused)
{
    *fused = 0;
    if (!config_hf_fused(&m->cfg)) return STATUS_OK;
    for (int g = 0; g < N_FUSED; g++) {
        const unsigned got = mask & fused_groups[g].members;
        if (got && got != fused_groups[g].members)
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s fuses %s into one %s: a LoRA adapter targets all of them "
                                 "or none (PEFT adapts the fused module)", m->cfg.architecture,
                                 g == 0 ? "q, k and v" : "gate and up", fused_groups[g].module);
        if (got) *fused |= 1u << g;
    }
    return STATUS_OK;
}

const struct tensor *lora_base_weight(const struct model *m, int l, enum lora_target t)
{
    const struct layer_weights *w = &m->w.layers[l];
    const struct tensor *ts[LORA_TARGET_COUNT] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
    return ts[t]->data ? ts[t] : NULL;
}

/* Tensor parallelism: the column-parallel targets (q, k, v, gate, up) split their outputs, so B
 * is split along its rows and A is whole; the row-parallel ones (o, down) split their inputs, so
 * A is split along its columns and B is whole (Megatron-Bridge's scheme: no collective of the
 * adapters' own). The whole A (rank, *in) and B (*out, rank) shapes of a target, and where this
 * rank's slice starts (*start: B's first row, or A's first column). */
static int row_parallel_target(enum lora_target t) { return t == LORA_TARGET_O || t == LORA_TARGET_DOWN; }

int lora_target_row_parallel(enum lora_target t) { return row_parallel_target(t); }

enum status lora_site_geometry(const struct model *m, int layer, enum lora_target t, int tp_rank, int64_t *out,
                               int64_t *in, int64_t *start, int64_t *len)
{
    struct host_weight whole, mine;
    enum status st = checkpoint_describe(m->checkpoint, targets[t].kind, layer, 0, 1, DTYPE_F32, &whole);
    if (st == STATUS_OK)
        st = checkpoint_describe(m->checkpoint, targets[t].kind, layer, tp_rank, m->tp_size, DTYPE_F32, &mine);
    if (st != STATUS_OK) return st;
    *out = whole.shape[0];
    *in = whole.shape[1];
    *start = row_parallel_target(t) ? mine.col_start : mine.row_start;
    if (len) *len = row_parallel_target(t) ? mine.shape[1] : mine.shape[0];
    return STATUS_OK;
}

static enum status site_geometry(const struct model *m, int layer, enum lora_target t, int64_t *out, int64_t *in,
                                 int64_t *start)
{
    return lora_site_geometry(m, layer, t, m->tp_rank, out, in, start, NULL);
}

/* Copies this rank's slice of the whole A (ab 0) or B (ab 1), h (rows x cols, host f32), into x. */
static void upload_slice(struct backend *b, const struct tensor *x, const float *h, int64_t cols, int ab,
                         enum lora_target t, int64_t start)
{
    const int64_t xr = x->shape[0], xc = x->shape[1];
    if (ab == 1 && !row_parallel_target(t)) { /* B's rows start..start + xr */
        backend_upload(b, x->data, h + start * cols, (size_t)(xr * xc) * sizeof *h);
        return;
    }
    const int64_t c0 = ab == 0 && row_parallel_target(t) ? start : 0; /* A's columns */
    for (int64_t r = 0; r < xr; r++)
        backend_upload(b, (float *)x->data + r * xc, h + r * cols + c0, (size_t)xc * sizeof *h);
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Allocates A, B, dA, dB of every adapted site from one block (zeroed). */
static enum status lora_alloc(struct lora *l, const struct model *m, int whole)
{
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        size_t off = 0;
        for (int i = 0; i < l->n_layers; i++)
            for (int t = 0; t < LORA_TARGET_COUNT; t++) {
                /* Every layer has the same projections: a whole adapter asks the local layer 0. */
                const struct tensor *w = lora_base_weight(m, whole ? 0 : i, (enum lora_target)t);
                if (!(l->targets & (1u << t)) || !w) continue;
                int64_t out = w->shape[0], in = w->shape[1], start = 0;
                const int64_t r = l->rank;
                struct lora_site *s = &l->sites[i][t];
                if (whole) { /* the unsplit shapes of global layer i */
                    enum status st = site_geometry(m, i, (enum lora_target)t, &out, &in, &start);
                    if (st != STATUS_OK) return st;
                } else if (pass == 0 && row_parallel_target((enum lora_target)t)) { /* A's global columns */
                    int64_t o = 0, n = 0;
                    enum status st = site_geometry(m, m->layer_first + i, (enum lora_target)t, &o, &n, &s->col0);
                    if (st != STATUS_OK) return st;
                }
                struct tensor *ts[4] = {&s->a, &s->b, &s->da, &s->db};
                const int64_t rows[4] = {r, out, r, out}, cols[4] = {in, r, in, r};
                const enum lora_target lead = lora_target_leader(l, (enum lora_target)t);
                for (int k = 0; k < (whole ? 2 : 4); k++) { /* a whole adapter has no gradients */
                    if (lead != (enum lora_target)t && (k == 0 || k == 2)) { /* a fused member: its leader's A and dA */
                        *ts[k] = k ? l->sites[i][lead].da : l->sites[i][lead].a;
                        continue;
                    }
                    *ts[k] = tensor_make(pass ? (char *)l->mem + off : NULL, DTYPE_F32, m->b->device, 2, rows[k], cols[k]);
                    off += (tensor_nbytes(ts[k]) + 255) / 256 * 256;
                }
            }
        if (pass == 0) {
            total = off;
            if (total == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "LoRA: the model has none of the target layers");
            enum status st = backend_alloc(m->b, total, &l->mem);
            if (st != STATUS_OK) return st;
            backend_memset_zero(m->b, l->mem, total);
        }
    }
    return STATUS_OK;
}

static struct lora *lora_new(const struct model *m, int rank, float alpha, unsigned mask, unsigned fused, int whole)
{
    struct lora *l = calloc(1, sizeof *l);
    if (!l) return NULL;
    l->rank = rank;
    l->alpha = alpha;
    l->scale = alpha / (float)rank;
    l->targets = mask;
    l->fused = fused;
    l->n_layers = whole ? m->cfg.n_layers : m->n_layers_local;
    l->layer_first = whole ? 0 : m->layer_first;
    l->sites = calloc((size_t)(l->n_layers > 0 ? l->n_layers : 1), sizeof *l->sites);
    if (!l->sites) {
        free(l);
        return NULL;
    }
    return l;
}

enum status lora_create(const struct model *m, int rank, float alpha, unsigned mask, uint64_t seed, struct lora **out)
{
    *out = NULL;
    if (rank < 1 || rank > LORA_MAX_RANK || !isfinite(alpha) || !(alpha > 0) || alpha > LORA_MAX_ALPHA)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--lora-rank must be in [1, %d] and --lora-alpha in (0, %g]",
                             LORA_MAX_RANK, LORA_MAX_ALPHA);
    enum status st = moe_targets_ok(m, mask);
    if (st != STATUS_OK) return st;
    unsigned fused = 0;
    if ((st = model_fused_groups(m, mask, &fused)) != STATUS_OK) return st;
    struct lora *l = lora_new(m, rank, alpha, mask, fused, 0);
    if (!l) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
    st = lora_alloc(l, m, 0);
    if (st != STATUS_OK) {
        lora_free(l, m->b);
        return st;
    }
    /* The whole A of every layer of the model is drawn in order, and each rank keeps its slice
     * of its own layers, so that any tp x pp split starts from the one-rank initialisation. */
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 17;
    enum status st2 = STATUS_OK;
    for (int g = 0; g < m->layer_first + l->n_layers && st2 == STATUS_OK; g++)
        for (int t = 0; t < LORA_TARGET_COUNT && st2 == STATUS_OK; t++) {
            const int i = g - m->layer_first, li = i >= 0 ? i : 0; /* earlier stages: the same structure */
            if (!(l->targets & (1u << t)) || !lora_base_weight(m, li, (enum lora_target)t) ||
                lora_target_leader(l, (enum lora_target)t) != (enum lora_target)t) /* a fused member: its leader's A */
                continue;
            int64_t out_w = 0, in_w = 0, start = 0;
            if ((st2 = site_geometry(m, g, (enum lora_target)t, &out_w, &in_w, &start)) != STATUS_OK) break;
            const int64_t n = (int64_t)rank * in_w;
            float *h = malloc((size_t)n * sizeof *h);
            if (!h) {
                st2 = status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
                break;
            }
            const double bound = 1.0 / sqrt((double)in_w);
            for (int64_t k = 0; k < n; k++)
                h[k] = (float)(bound * (2.0 * ((double)(splitmix(&s) >> 11) / 9007199254740992.0) - 1.0));
            if (i >= 0) upload_slice(m->b, &l->sites[i][t].a, h, in_w, 0, (enum lora_target)t, start);
            free(h);
        }
    if (st2 != STATUS_OK) {
        lora_free(l, m->b);
        return st2;
    }
    *out = l;
    return STATUS_OK;
}

enum status lora_create_whole(const struct model *m, const struct lora *like, struct lora **out)
{
    *out = NULL;
    struct lora *l = lora_new(m, like->rank, like->alpha, like->targets, like->fused, 1);
    if (!l) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
    enum status st = lora_alloc(l, m, 1);
    if (st != STATUS_OK) {
        lora_free(l, m->b);
        return st;
    }
    *out = l;
    return STATUS_OK;
}

void lora_set_dropout(struct lora *l, float p, uint64_t seed)
{
    l->dropout = p;
    l->dropout_seed = seed;
}

void lora_dropout_batch(struct lora *l, int on, int64_t step, int micro)
{
    l->dropout_on = on && l->dropout > 0.0f;
    const uint64_t k = op_dropout_hash(l->dropout_seed + 0x9e3779b97f4a7c15ULL);
    l->batch_key = op_dropout_hash(op_dropout_hash(k ^ (uint64_t)step) ^ (uint64_t)micro);
}

/* The key of a site's mask in the current micro-batch: the same on every rank that holds a
 * slice of it (global layer index; op_dropout adds the global column), and the same for the
 * members of a fused group (PEFT drops the fused module's one input once). */
static uint64_t site_key(const struct lora *l, int layer, enum lora_target t)
{
    return op_dropout_hash(l->batch_key ^ ((uint64_t)(l->layer_first + layer) << 8 | (uint64_t)lora_target_leader(l, t)));
}

enum status lora_reserve(struct lora *l, struct backend *b, int max_tokens, enum dtype act)
{
    if (l->act_mem && max_tokens <= l->max_tokens && act == l->c.dtype) return STATUS_OK;
    backend_free(b, l->act_mem);
    l->act_mem = NULL;
    int64_t widest = 0, widest_in = 0;
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++)
            if (l->sites[i][t].b.data) {
                if (l->sites[i][t].b.shape[0] > widest) widest = l->sites[i][t].b.shape[0];
                if (l->sites[i][t].a.shape[1] > widest_in) widest_in = l->sites[i][t].a.shape[1];
            }
    /* The f32 scratch of the input only when it is cast or masked, the rounded sum's only when
     * the activations are not f32: an f32 run without dropout keeps its old footprint. */
    const int64_t T = max_tokens, in_rows = act != DTYPE_F32 || l->dropout > 0.0f ? T : 0;
    const int64_t c_rows = act != DTYPE_F32 ? T : 0, c_cols = widest > widest_in ? widest : widest_in;
    const size_t u_bytes = ((size_t)T * (size_t)l->rank * 4 + 255) / 256 * 256;
    const size_t z_bytes = ((size_t)T * (size_t)widest * 4 + 255) / 256 * 256;
    const size_t x_bytes = ((size_t)in_rows * (size_t)widest_in * 4 + 255) / 256 * 256;
    const size_t c_bytes = ((size_t)c_rows * (size_t)c_cols * dtype_size(act) + 255) / 256 * 256;
    enum status st = backend_alloc(b, 2 * u_bytes + z_bytes + 2 * x_bytes + c_bytes, &l->act_mem);
    if (st != STATUS_OK) return st;
    char *p = l->act_mem;
    l->u = tensor_make(p, DTYPE_F32, b->device, 2, T, (int64_t)l->rank);
    p += u_bytes;
    l->du = tensor_make(p, DTYPE_F32, b->device, 2, T, (int64_t)l->rank);
    p += u_bytes;
    l->z = tensor_make(p, DTYPE_F32, b->device, 2, T, widest);
    p += z_bytes;
    l->xs = tensor_make(in_rows ? p : NULL, DTYPE_F32, b->device, 2, T, widest_in);
    p += x_bytes;
    l->xt = tensor_make(in_rows ? p : NULL, DTYPE_F32, b->device, 2, T, widest_in);
    p += x_bytes;
    l->c = tensor_make(c_rows ? p : NULL, act, b->device, 2, T, c_cols);
    l->max_tokens = max_tokens;
    return STATUS_OK;
}

void lora_free(struct lora *l, struct backend *b)
{
    if (!l) return;
    backend_free(b, l->mem);
    backend_free(b, l->act_mem);
    free(l->sites);
    free(l);
}

void lora_zero_grads(struct lora *l, struct backend *b)
{
    for (int i = 0; i < l->n_layers; i++)
        for (int t = 0; t < LORA_TARGET_COUNT; t++) {
            struct lora_site *s = &l->sites[i][t];
            if (!s->a.data) continue;
            backend_memset_zero(b, s->da.data, tensor_nbytes(&s->da));
            backend_memset_zero(b, s->db.data, tensor_nbytes(&s->db));
        }
}

/* The adapter's input x' (T, in) in f32: x itself when it is f32 and no mask is drawn, else x
 * cast and/or masked into xs. */
static struct tensor adapter_input(struct lora *l, struct backend *b, int layer, enum lora_target t,
                                   const struct tensor *x)
{
    if (x->dtype == DTYPE_F32 && !l->dropout_on) return *x;
    CHECK(l->xs.data, "LoRA: lora_reserve was not told of %s activations or dropout", dtype_name(x->dtype));
    struct tensor xs = tensor_view2(&l->xs, x->shape[0], x->shape[1]);
    if (x->dtype != DTYPE_F32) op_cast(b, &xs, x);
    if (l->dropout_on)
        op_dropout(b, &xs, x->dtype == DTYPE_F32 ? x : &xs, site_key(l, layer, t), l->sites[layer][t].col0, l->dropout);
    return xs;
}

/* y += v, v f32 (T, cols), y in the activations' dtype: v rounded once into c first. */
static void add_f32(struct lora *l, struct backend *b, const struct tensor *y, const struct tensor *v)
{
    if (y->dtype == DTYPE_F32) {
        op_add(b, y, y, v);
        return;
    }
    CHECK(l->c.data && l->c.dtype == y->dtype, "LoRA: lora_reserve was not told of %s activations",
          dtype_name(y->dtype));
    struct tensor c = tensor_view2(&l->c, v->shape[0], v->shape[1]);
    op_cast(b, &c, v);
    op_add(b, y, y, &c);
}

/* u = s x' A^T (T, r): the forward's, and its backward's again from the same x'. */
static void low_rank(const struct lora *l, struct backend *b, const struct lora_site *s, const struct tensor *u,
                     const struct tensor *xa)
{
    op_matmul(b, u, xa, &s->a, NULL);
    op_scale(b, u, u, l->scale);
}

void lora_forward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                  const struct tensor *x)
{
    struct lora_site *s = &l->sites[layer][t];
    if (!s->a.data) return;
    const int64_t T = x->shape[0];
    CHECK(T <= l->max_tokens, "LoRA: %lld rows exceed the reservation of %d", (long long)T, l->max_tokens);
    struct tensor xa = adapter_input(l, b, layer, t, x);
    struct tensor u = tensor_first_rows(&l->u, T), z = tensor_view2(&l->z, T, s->b.shape[0]);
    low_rank(l, b, s, &u, &xa);
    op_matmul(b, &z, &u, &s->b, NULL); /* z = u B^T (T, out) */
    add_f32(l, b, y, &z);
}

void lora_backward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *dx,
                   const struct tensor *dy, const struct tensor *x)
{
    struct lora_site *s = &l->sites[layer][t];
    if (!s->a.data) return;
    const int64_t T = x->shape[0];
    struct tensor u = tensor_first_rows(&l->u, T), du = tensor_first_rows(&l->du, T), dy32 = *dy;
    struct tensor xa = adapter_input(l, b, layer, t, x); /* x' again: the same mask */
    low_rank(l, b, s, &u, &xa);
    if (dy->dtype != DTYPE_F32) { /* z is free in the backward */
        dy32 = tensor_view2(&l->z, T, s->b.shape[0]);
        op_cast(b, &dy32, dy);
    }
    op_matmul_backward(b, &du, &s->db, NULL, &dy32, &u, &s->b, 0); /* du = dy B; dB += dy^T u */
    op_scale(b, &du, &du, l->scale);                              /* du = s dy B = dL/d(x' A^T) */
    if (x->dtype == DTYPE_F32 && !l->dropout_on) {
        op_matmul_backward(b, dx, &s->da, NULL, &du, x, &s->a, 1); /* dA += du^T x; dx += du A */
        return;
    }
    struct tensor xt = tensor_view2(&l->xt, T, x->shape[1]);
    op_matmul_backward(b, &xt, &s->da, NULL, &du, &xa, &s->a, 0); /* dA += du^T x'; xt = du A */
    if (l->dropout_on) op_dropout(b, &xt, &xt, site_key(l, layer, t), s->col0, l->dropout);
    add_f32(l, b, dx, &xt);
}

/* ---- PEFT files ------------------------------------------------------------------------------ */

static int llama_family(const struct model *m)
{
    return m->cfg.family == MODEL_FAMILY_LLAMA || m->cfg.family == MODEL_FAMILY_GEMMA3;
}

/* The PEFT module that target t of l is written as and read from: its names, and the targets
 * whose B rows its B stacks in order (*parts). 0 for a fused member that is not its group's
 * leader: the leader's module is the whole group's. */
static int peft_module(const struct lora *l, enum lora_target t, const char **module, const char **block,
                       unsigned *parts)
{
    const int g = group_of(t);
    if (g >= 0 && (l->fused & (1u << g))) {
        *module = fused_groups[g].module;
        *block = fused_groups[g].block;
        *parts = fused_groups[g].members;
        return fused_groups[g].leader == t;
    }
    *module = targets[t].module;
    *block = targets[t].block;
    *parts = 1u << t;
    return 1;
}

static void peft_name(char *buf, size_t n, int layer, const char *block, const char *module, char ab)
{
    snprintf(buf, n, "base_model.model.model.layers.%d.%s.%s.lora_%c.weight", layer, block, module, ab);
}

/* One tensor of the file: the device tensors whose bytes it is, one after the other (a fused B
 * is its parts' B stacked). */
struct peft_item {
    struct backend *b;
    const struct tensor *t[3];
    int n;
};

static enum status peft_fill(void *ctx, void *dst, size_t nbytes)
{
    const struct peft_item *it = ctx;
    size_t off = 0;
    for (int i = 0; i < it->n; i++) {
        const size_t nb = tensor_nbytes(it->t[i]);
        CHECK(off + nb <= nbytes, "PEFT tensor of %zu bytes overflows", nbytes);
        backend_download(it->b, (char *)dst + off, it->t[i]->data, nb);
        off += nb;
    }
    return STATUS_OK;
}

static enum status write_peft_config(const struct lora *l, const char *dir, const char *base_model)
{
    cJSON *root = cJSON_CreateObject(), *mods = cJSON_CreateArray();
    for (int t = 0; t < LORA_TARGET_COUNT; t++) {
        const char *module, *block;
        unsigned parts;
        if ((l->targets & (1u << t)) && peft_module(l, (enum lora_target)t, &module, &block, &parts))
            cJSON_AddItemToArray(mods, cJSON_CreateString(module));
    }
    cJSON_AddStringToObject(root, "peft_type", "LORA");
    cJSON_AddStringToObject(root, "task_type", "CAUSAL_LM");
    cJSON_AddStringToObject(root, "base_model_name_or_path", base_model ? base_model : "");
    cJSON_AddNumberToObject(root, "r", l->rank);
    cJSON_AddNumberToObject(root, "lora_alpha", l->alpha);
    /* p is a float: rounded to 6 digits, 0.1 is written as 0.1, not 0.10000000149011612 */
    cJSON_AddNumberToObject(root, "lora_dropout", floor((double)l->dropout * 1e6 + 0.5) / 1e6);
    cJSON_AddItemToObject(root, "target_modules", mods);
    cJSON_AddStringToObject(root, "bias", "none");
    cJSON_AddBoolToObject(root, "fan_in_fan_out", 0);
    cJSON_AddBoolToObject(root, "use_rslora", 0);
    cJSON_AddBoolToObject(root, "use_dora", 0);
    cJSON_AddBoolToObject(root, "inference_mode", 1);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    enum status st = text ? base_write_text(path, text, 0644)
                          : status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
    free(text);
    return st;
}

enum status lora_save_peft(const struct lora *l, const struct model *m, struct backend *b, const char *dir,
                           const char *base_model)
{
    if (!llama_family(m))
        return status_errorf(STATUS_UNSUPPORTED, "LoRA adapters are written for Llama-family models (Llama, Mistral, "
                             "Gemma 3), not %s", m->cfg.architecture);
    mkdir(dir, 0755);
    char path[4200], name[256];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct safetensors_writer *w = NULL;
    struct peft_item *items = calloc((size_t)l->n_layers * LORA_TARGET_COUNT * 2 + 1, sizeof *items);
    enum status st = items ? safetensors_writer_begin(path, &w)
                           : status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
    int k = 0;
    for (int i = 0; i < l->n_layers && st == STATUS_OK; i++)
        for (int t = 0; t < LORA_TARGET_COUNT && st == STATUS_OK; t++) {
            const struct lora_site *s = &l->sites[i][t];
            const char *module, *block;
            unsigned parts;
            if (!s->a.data || !peft_module(l, (enum lora_target)t, &module, &block, &parts)) continue;
            for (int ab = 0; ab < 2 && st == STATUS_OK; ab++) {
                struct peft_item *it = &items[k++];
                *it = (struct peft_item){.b = b};
                int64_t shape[2] = {ab ? 0 : s->a.shape[0], ab ? l->rank : s->a.shape[1]};
                for (int p = 0; p < LORA_TARGET_COUNT; p++) /* A once; B of every part, in order */
                    if (ab ? (parts & (1u << p)) != 0 : p == t) {
                        it->t[it->n++] = ab ? &l->sites[i][p].b : &s->a;
                        if (ab) shape[0] += l->sites[i][p].b.shape[0];
                    }
                peft_name(name, sizeof name, l->layer_first + i, block, module, ab ? 'B' : 'A');
                st = safetensors_writer_add_deferred(w, name, DTYPE_F32, 2, shape, peft_fill, it);
            }
        }
    if (st == STATUS_OK) st = safetensors_writer_set_metadata(w, "format", "pt");
    if (st == STATUS_OK) {
        st = safetensors_writer_finish(w);
        w = NULL;
    }
    safetensors_writer_free(w);
    free(items);
    if (st == STATUS_OK) st = write_peft_config(l, dir, base_model);
    return st;
}

/* adapter_config.json: rank, alpha and targets, refusing what this code does not compute. */
static enum status read_peft_config(const char *dir, int *rank, float *alpha, unsigned *mask, unsigned *fused)
{
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    enum status st = base_read_file(path, 1 << 20, "adapter_config.json", &text, NULL);
    if (st != STATUS_OK) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(root, "r");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    const cJSON *mods = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!root || !cJSON_IsNumber(r) || !cJSON_IsNumber(a) || !cJSON_IsArray(mods))
        st = status_errorf(STATUS_BAD_FORMAT, "%s: needs numbers \"r\", \"lora_alpha\" and a list \"target_modules\"", path);
    else if (cJSON_IsString(type) && strcmp(type->valuestring, "LORA"))
        st = status_errorf(STATUS_UNSUPPORTED, "%s: peft_type %s (only LORA)", path, type->valuestring);
    else if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_dora")) ||
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_rslora")) ||
             cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "fan_in_fan_out")))
        st = status_errorf(STATUS_UNSUPPORTED, "%s: DoRA, rsLoRA and fan_in_fan_out adapters are not supported", path);
    else {
        const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
        if (cJSON_IsString(bias) && strcmp(bias->valuestring, "none"))
            st = status_errorf(STATUS_UNSUPPORTED, "%s: bias \"%s\" (only \"none\")", path, bias->valuestring);
    }
    *mask = *fused = 0;
    unsigned plain = 0; /* the targets named by their own modules */
    const cJSON *it;
    cJSON_ArrayForEach(it, mods)
    {
        if (st != STATUS_OK) break;
        unsigned one = 0, one_fused = 0;
        if (!cJSON_IsString(it)) st = status_errorf(STATUS_BAD_FORMAT, "%s: target_modules holds a non-string", path);
        else if ((st = parse_target(it->valuestring, &one, &one_fused)) != STATUS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", status_message());
            st = status_errorf(st, "%s: %s", path, msg);
        }
        *mask |= one;
        *fused |= one_fused;
        if (!one_fused) plain |= one;
    }
    for (int g = 0; g < N_FUSED && st == STATUS_OK; g++)
        if ((*fused & (1u << g)) && (plain & fused_groups[g].members))
            st = status_errorf(STATUS_BAD_FORMAT, "%s: target_modules names %s and a part of it too", path,
                               fused_groups[g].module);
    /* alpha is read as a double: 1e39 is finite there and infinite as a float. */
    if (st == STATUS_OK && (!isfinite(r->valuedouble) || r->valuedouble != floor(r->valuedouble) ||
                            r->valuedouble < 1 || r->valuedouble > LORA_MAX_RANK))
        st = status_errorf(STATUS_BAD_FORMAT, "%s: r %g is not an integer in [1, %d]", path, r->valuedouble,
                           LORA_MAX_RANK);
    else if (st == STATUS_OK && (!isfinite(a->valuedouble) || !(a->valuedouble > 0) ||
                                 a->valuedouble > LORA_MAX_ALPHA))
        st = status_errorf(STATUS_BAD_FORMAT, "%s: lora_alpha %g is not a number in (0, %g]", path, a->valuedouble,
                           LORA_MAX_ALPHA);
    if (st == STATUS_OK) {
        *rank = (int)r->valuedouble;
        *alpha = (float)a->valuedouble;
    }
    cJSON_Delete(root);
    return st;
}

/* Both files of the adapter in dir open as regular files, or STATUS_NOT_FOUND whatever kept one
 * from opening (lora.h: callers answer every unreachable path alike). */
static enum status peft_files_reachable(const char *dir)
{
    static const char *const names[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        int fd;
        if (base_open_file(path, &fd, NULL) != STATUS_OK) {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", status_message());
            return status_errorf(STATUS_NOT_FOUND, "%s", msg);
        }
        close(fd);
    }
    return STATUS_OK;
}

/* The whole tensor `name` (rows x cols) of the adapter's file, as f32 in *h (the caller frees it),
 * refused naming the file and the tensor when it is missing, of another shape or not finite. */
static enum status read_peft_tensor(const struct safetensors *sf, const char *path, const char *name, int64_t rows,
                                    int64_t cols, float **h)
{
    *h = NULL;
    const struct st_tensor *f = safetensors_find(sf, name);
    if (!f) return status_errorf(STATUS_BAD_FORMAT, "%s: no tensor %s", path, name);
    if (f->ndim != 2 || f->shape[0] != rows || f->shape[1] != cols || !f->supported)
        return status_errorf(STATUS_BAD_FORMAT, "%s: %s has shape [%lld, %lld] (%s), the model needs [%lld, %lld]",
                             path, name, (long long)f->shape[0], (long long)(f->ndim > 1 ? f->shape[1] : 0),
                             f->dtype_name, (long long)rows, (long long)cols);
    const size_t nb = (size_t)(rows * cols) * sizeof(float);
    if (!(*h = malloc(nb))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
    enum status st = safetensors_read(f, DTYPE_F32, *h, nb);
    const int64_t bad = st == STATUS_OK ? dtype_first_non_finite(*h, DTYPE_F32, (size_t)(rows * cols)) : -1;
    if (bad >= 0)
        st = status_errorf(STATUS_BAD_FORMAT, "%s: tensor %s holds a NaN or Inf (element %lld): the adapter is corrupt",
                           path, name, (long long)bad);
    if (st != STATUS_OK) {
        free(*h);
        *h = NULL;
    }
    return st;
}

/* Global layer g's module at target t (a plain target or a fused group's leader): A into t's
 * site, B's row ranges into its parts' sites, each rank keeping its slices. */
static enum status read_peft_module(struct lora *l, const struct model *m, const struct safetensors *sf,
                                    const char *path, int i, enum lora_target t)
{
    const char *module, *block;
    unsigned parts;
    if (!peft_module(l, t, &module, &block, &parts)) return STATUS_OK;
    const int g = l->layer_first + i;
    int64_t out_w = 0, in_w = 0, start = 0, rows = 0;
    for (int p = 0; p < LORA_TARGET_COUNT; p++) /* B stacks the parts' whole rows */
        if (parts & (1u << p)) {
            enum status st = site_geometry(m, g, (enum lora_target)p, &out_w, &in_w, &start);
            if (st != STATUS_OK) return st;
            rows += out_w;
        }
    char name[256];
    float *h = NULL;
    enum status st = site_geometry(m, g, t, &out_w, &in_w, &start);
    if (st == STATUS_OK) {
        peft_name(name, sizeof name, g, block, module, 'A');
        st = read_peft_tensor(sf, path, name, l->rank, in_w, &h);
    }
    if (st == STATUS_OK) upload_slice(m->b, &l->sites[i][t].a, h, in_w, 0, t, start);
    free(h);
    if (st == STATUS_OK) {
        peft_name(name, sizeof name, g, block, module, 'B');
        st = read_peft_tensor(sf, path, name, rows, l->rank, &h);
    }
    for (int p = 0, row0 = 0; p < LORA_TARGET_COUNT && st == STATUS_OK; p++)
        if ((parts & (1u << p)) && (st = site_geometry(m, g, (enum lora_target)p, &out_w, &in_w, &start)) == STATUS_OK) {
            upload_slice(m->b, &l->sites[i][p].b, h + (int64_t)row0 * l->rank, l->rank, 1, (enum lora_target)p, start);
            row0 += (int)out_w;
        }
    free(h);
    return st;
}

enum status lora_load_peft(struct model *m, const char *dir, struct lora **out)
{
    *out = NULL;
    if (!llama_family(m))
        return status_errorf(STATUS_UNSUPPORTED, "LoRA adapters are read for Llama-family models, not %s", m->cfg.architecture);
    int rank = 0;
    float alpha = 0;
    unsigned mask = 0, fused = 0;
    enum status st = peft_files_reachable(dir);
    if (st != STATUS_OK) return st;
    if ((st = read_peft_config(dir, &rank, &alpha, &mask, &fused)) != STATUS_OK) return st == STATUS_NOT_FOUND ? STATUS_IO : st;
    if ((st = moe_targets_ok(m, mask)) != STATUS_OK) return st;
    if (fused && !config_hf_fused(&m->cfg))
        return status_errorf(STATUS_BAD_FORMAT, "%s/adapter_config.json: target module %s is a fused projection "
                             "(Phi-3's); %s has separate ones", dir, fused & LORA_FUSED_QKV ? "qkv_proj" : "gate_up_proj",
                             m->cfg.architecture);
    struct lora *l = lora_new(m, rank, alpha, mask, fused, 0);
    if (!l) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoRA: out of host memory");
    if ((st = lora_alloc(l, m, 0)) != STATUS_OK) {
        lora_free(l, m->b);
        return st;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    struct safetensors *sf = NULL;
    if ((st = safetensors_open(path, &sf)) != STATUS_OK) {
        lora_free(l, m->b);
        return st == STATUS_NOT_FOUND ? STATUS_IO : st; /* gone since peft_files_reachable */
    }
    for (int i = 0; i < l->n_layers && st == STATUS_OK; i++)
        for (int t = 0; t < LORA_TARGET_COUNT && st == STATUS_OK; t++)
            if (l->sites[i][t].a.data) st = read_peft_module(l, m, sf, path, i, (enum lora_target)t);
    safetensors_close(sf);
    if (st != STATUS_OK) {
        lora_free(l, m->b);
        return st;
    }
    *out = l;
    return STATUS_OK;
}
