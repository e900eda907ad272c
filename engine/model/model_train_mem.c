/* engine/model/model_train_mem.c - the training activations' memory (model_train.h): the
 * plan of what each layer keeps (recomputation, sequence parallelism), activation sets for the
 * micro-batches a pipeline keeps in flight, and the stage boundary.
 * Tests: tests/test_train_parallel.sh (every plan against one rank), tests/bench_train_memory.c. */
#include "model_train_impl.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

int model_train_row_multiple(const struct model *m, const struct train_memory *mem)
{
    return mem && mem->sequence_parallel && m->tp_size > 1 ? m->tp_size : 1;
}

int train_sp(const struct model_train *t) { return model_train_row_multiple(t->m, &t->mem) > 1; }

int train_layer_full(const struct model_train *t, int l, int *chunk_first, int *chunk_last)
{
    const struct train_memory *mm = &t->mem;
    if (mm->recompute == TRAIN_RECOMPUTE_UNIFORM) {
        const int k = mm->num_layers;
        *chunk_first = l / k * k;
        *chunk_last = *chunk_first + k - 1 < t->m->n_layers_local - 1 ? *chunk_first + k - 1 : t->m->n_layers_local - 1;
        return 1;
    }
    if (mm->recompute == TRAIN_RECOMPUTE_BLOCK && l < mm->num_layers) {
        *chunk_first = *chunk_last = l;
        return 1;
    }
    return 0;
}

int model_train_grad_partial(const struct model_train *t, enum weight_kind kind)
{
    if (t->m->tp_size == 1) return 0;
    /* A norm per head: each rank's gradient is over its heads. Over the whole projection the rows
     * are gathered (layer_qk_norm), so every rank computes the whole gradient. */
    if (kind == WEIGHT_KIND_Q_NORM || kind == WEIGHT_KIND_K_NORM) return t->m->cfg.qk_norm != QK_NORM_FULL;
    if (!train_sp(t)) return 0;
    return weight_kind_is_norm(kind) || kind == WEIGHT_KIND_ATTN_NORM_BIAS || kind == WEIGHT_KIND_MLP_NORM_BIAS ||
           kind == WEIGHT_KIND_FINAL_NORM_BIAS || kind == WEIGHT_KIND_POS_EMBEDDING;
}

/* ---- the plan ---------------------------------------------------------------------------- */

enum field {
    F_X_IN, F_XN1, F_Q_PRE, F_K_PRE, F_Q, F_K, F_V, F_ATT, F_LSE, F_ATTN_OUT, F_X_MID, F_XN2,
    F_GATE, F_UP, F_HACT, F_MLP_OUT,
    F_MOE_IDS, F_MOE_W, F_MOE_SW, F_MOE_GATE, F_MOE_UP, F_MOE_HACT, F_MOE_Y, F_SHARED_Y, F_MOE_XR, F_COUNT
};

static const size_t field_offset[F_COUNT] = {
    offsetof(struct layer_acts, x_in), offsetof(struct layer_acts, xn1), offsetof(struct layer_acts, q_pre),
    offsetof(struct layer_acts, k_pre), offsetof(struct layer_acts, q), offsetof(struct layer_acts, k),
    offsetof(struct layer_acts, v), offsetof(struct layer_acts, att), offsetof(struct layer_acts, lse),
    offsetof(struct layer_acts, attn_out), offsetof(struct layer_acts, x_mid), offsetof(struct layer_acts, xn2),
    offsetof(struct layer_acts, gate), offsetof(struct layer_acts, up), offsetof(struct layer_acts, hact),
    offsetof(struct layer_acts, mlp_out),
    offsetof(struct layer_acts, moe.ids), offsetof(struct layer_acts, moe.w), offsetof(struct layer_acts, moe.sw),
    offsetof(struct layer_acts, moe.gate), offsetof(struct layer_acts, moe.up), offsetof(struct layer_acts, moe.hact),
    offsetof(struct layer_acts, moe.y), offsetof(struct layer_acts, moe.s_y), offsetof(struct layer_acts, moe.xr),
};

static struct tensor *field(struct layer_acts *la, int f) { return (struct tensor *)((char *)la + field_offset[f]); }

/* The shape of local layer l's tensor f for T rows (Tl local rows of the residual stream). */
static void field_shape(const struct model *m, int f, int l, int64_t T, int64_t Tl, enum dtype *dt, int64_t *rows,
                        int64_t *cols)
{
    const struct model_config *c = &m->cfg;
    const struct tensor *up = &m->w.layers[l].w_up;
    const int64_t d = c->d_model, hd = c->head_dim, hq = (int64_t)m->n_heads_local * hd;
    /* The layer's own dense MLP or shared expert (GLM-4.5's dense first layers are wider than its
     * shared experts), and its experts only when it runs them. */
    const int64_t hkv = (int64_t)m->n_kv_local * hd, ffn = up->data ? up->shape[0] : 0;
    const int64_t qk = c->qk_norm ? 1 : 0, sw = c->sandwich_norms ? 1 : 0;
    const int64_t dense = ffn > 0 ? 1 : 0, moe = config_layer_moe(c, m->layer_first + l) ? 1 : 0;
    const int64_t TK = moe * T * c->n_experts_used, shared = moe * (c->shared_expert ? 1 : 0);
    const int64_t ep_rows = moe && m->ep_size > 1 ? moe_ep_rows(m, T) : 0; /* the owner's rows (moe_ep.c) */
    *dt = m->dtype;
    switch (f) {
    case F_X_IN: case F_XN1: case F_X_MID: case F_XN2: *rows = Tl; *cols = d; break;
    case F_ATTN_OUT: case F_MLP_OUT: *rows = sw * Tl; *cols = d; break;
    case F_Q_PRE: *rows = qk * T; *cols = hq; break;
    case F_K_PRE: *rows = qk * T; *cols = hkv; break;
    case F_Q: case F_ATT: *rows = T; *cols = hq; break;
    case F_K: case F_V: *rows = T; *cols = hkv; break;
    case F_LSE: *dt = DTYPE_F32; *rows = T; *cols = m->n_heads_local; break;
    case F_GATE: *rows = c->gated_mlp ? dense * T : 0; *cols = ffn; break;
    case F_MOE_IDS: *dt = DTYPE_I32; *rows = TK; *cols = 1; break;
    case F_MOE_W: *dt = DTYPE_F32; *rows = TK; *cols = 1; break;
    case F_MOE_SW: *dt = DTYPE_F32; *rows = shared * T; *cols = 1; break;
    case F_MOE_GATE: case F_MOE_UP: case F_MOE_HACT: *rows = ep_rows ? ep_rows : TK; *cols = c->moe_ffn; break;
    case F_MOE_XR: *rows = ep_rows; *cols = d; break;
    case F_MOE_Y: *rows = TK; *cols = d; break;
    case F_SHARED_Y: *rows = shared * T; *cols = d; break;
    default: *rows = dense * T; *cols = ffn; break; /* F_UP, F_HACT */
    }
}

/* Whether layer l's tensor f is recomputed (so shared), and by which shared set (*pos). */
static int field_shared(const struct model_train *t, int l, int f, int *pos)
{
    const struct train_memory *mm = &t->mem;
    int first = 0, last = 0;
    *pos = 0;
    if (train_layer_full(t, l, &first, &last)) {
        *pos = l - first;
        return !(f == F_X_IN && l == first);
    }
    if (mm->recompute != TRAIN_RECOMPUTE_SELECTIVE) return 0;
    if (mm->modules & TRAIN_RECOMPUTE_CORE_ATTN && f == F_LSE) return 1;
    if (mm->modules & TRAIN_RECOMPUTE_MLP && (f == F_GATE || f == F_UP || f == F_HACT || f == F_MOE_GATE ||
                                              f == F_MOE_UP || f == F_MOE_HACT || f == F_MOE_Y || f == F_SHARED_Y))
        return 1;
    if (mm->modules & TRAIN_RECOMPUTE_LAYERNORM && (f == F_XN1 || f == F_XN2)) return 1;
    return 0;
}

/* ---- carving ----------------------------------------------------------------------------- */

struct carve {
    struct tensor **t;
    enum dtype *dt;
    int64_t (*shape)[2];
    int n, cap;
};

static void carve_add(struct carve *cv, struct tensor *t, enum dtype dt, int64_t rows, int64_t cols)
{
    CHECK(cv->n < cv->cap, "carve table full");
    cv->t[cv->n] = t;
    cv->dt[cv->n] = dt;
    cv->shape[cv->n][0] = rows;
    cv->shape[cv->n][1] = cols;
    cv->n++;
}

/* One device allocation for the tensors of cv (each 256-byte aligned). */
static enum status carve_alloc(struct model *m, struct carve *cv, void **mem, size_t *bytes)
{
    size_t total = 0;
    for (int i = 0; i < cv->n; i++) {
        struct tensor t = tensor_make(NULL, cv->dt[i], m->b->device, 2, cv->shape[i][0], cv->shape[i][1]);
        total += (tensor_nbytes(&t) + 255) / 256 * 256;
    }
    *bytes = total;
    *mem = NULL;
    enum status st = total ? backend_alloc(m->b, total, mem) : STATUS_OK;
    if (st != STATUS_OK) return st;
    size_t off = 0;
    for (int i = 0; i < cv->n; i++) {
        *cv->t[i] = tensor_make((char *)*mem + off, cv->dt[i], m->b->device, 2, cv->shape[i][0], cv->shape[i][1]);
        off += (tensor_nbytes(cv->t[i]) + 255) / 256 * 256;
    }
    cv->n = 0;
    return STATUS_OK;
}

static struct tensor vec(const struct tensor *t, int64_t n)
{
    return tensor_make(t->data, t->dtype, t->device, 1, n);
}

/* ---- sets -------------------------------------------------------------------------------- */

/* The memory all sets share (recomputed tensors, backward and loss scratch) is its own set,
 * kept in the last entry of sets (index n_sets). */
static void free_set(struct model *m, struct train_activations *a)
{
    if (!a) return;
    backend_free(m->b, a->mem);
    free(a->layers);
    free(a);
}

void model_train_free(struct model_train *t)
{
    if (!t) return;
    free(t->moe_host);
    free(t->moe_load);
    if (t->sets) {
        struct train_activations *common = t->sets[t->n_sets];
        if (common) free(common->host_loss); /* the sets borrow it */
        for (int i = 0; i <= t->n_sets; i++) free_set(t->m, t->sets[i]);
        free(t->sets);
    }
    free(t);
}

static enum status check_plan(const struct model *m, int max_tokens, const struct train_memory *mm)
{
    if (max_tokens <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "training micro-batch of %d tokens", max_tokens);
    if (mm->sets < 1 || mm->sets > 1024) return status_errorf(STATUS_INVALID_ARGUMENT, "%d activation sets", mm->sets);
    if ((mm->recompute == TRAIN_RECOMPUTE_UNIFORM || mm->recompute == TRAIN_RECOMPUTE_BLOCK) &&
        (mm->num_layers < 1 || mm->num_layers > m->n_layers_local))
        return status_errorf(STATUS_INVALID_ARGUMENT, "--recompute-num-layers %d: this stage has %d layers",
                             mm->num_layers, m->n_layers_local);
    if (mm->recompute == TRAIN_RECOMPUTE_SELECTIVE && mm->modules == 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "selective recomputation of no module");
    if (m->tp_size > 1) {
        if ((int64_t)m->vocab_local * m->tp_size != m->cfg.vocab_size)
            return status_errorf(STATUS_UNSUPPORTED, "training at tp %d needs a vocabulary (%d) that tp divides "
                                 "(padded vocabularies are served, not trained)", m->tp_size, m->cfg.vocab_size);
        if (m->cfg.n_kv_heads % m->tp_size)
            return status_errorf(STATUS_UNSUPPORTED, "training at tp %d needs KV heads (%d) that tp divides "
                                 "(replicated KV heads are served, not trained)", m->tp_size, m->cfg.n_kv_heads);
    }
    const int multiple = model_train_row_multiple(m, mm);
    if (max_tokens % multiple)
        return status_errorf(STATUS_INVALID_ARGUMENT, "sequence parallelism: micro-batches of %d rows (micro-batch "
                             "size x sequence length) are not a multiple of tp %d", max_tokens, multiple);
    return STATUS_OK;
}

/* A mixture of experts' host memory, one allocation (t->moe_host): every set's routing per layer
 * (logits (T, E), start (E + 1), ids and w (T k), sw (T)), then moe_backward's host scratch
 * (dz (T, E), dw (T k), 3 T doubles), which the common set's moe_grad points to. */
/* n rounded up to 8 bytes: every block of the host allocation starts 8-byte aligned (ep_n is
 * int64, the scratch starts with doubles). */
static size_t align8(size_t n) { return (n + 7) / 8 * 8; }

static size_t moe_route_bytes(const struct model *m, int64_t T)
{
    const struct model_config *c = &m->cfg;
    const size_t E = (size_t)c->n_experts, TK = (size_t)T * (size_t)c->n_experts_used;
    const size_t ep_n = m->ep_size > 1 ? (size_t)m->ep_size * E : 0;
    return align8(ep_n * sizeof(int64_t) + (size_t)T * E * sizeof(float) + (E + 1) * sizeof(int) +
                  TK * (sizeof(int32_t) + sizeof(float)) + (size_t)T * sizeof(float));
}

/* Bytes of moe_backward's host scratch, then expert parallelism's index lists (ep_host). */
static size_t moe_scratch_bytes(const struct model *m, int64_t T)
{
    const size_t E = (size_t)m->cfg.n_experts, TK = (size_t)T * (size_t)m->cfg.n_experts_used;
    return align8(3 * (size_t)T * sizeof(double) + (size_t)T * E * sizeof(float) + TK * sizeof(float));
}

/* Bytes of expert parallelism's host index lists (none without it). */
static size_t ep_host_bytes(const struct model *m, int64_t T)
{
    return m->ep_size > 1 ? align8((size_t)moe_ep_idx_len(m, T) * sizeof(int32_t)) : 0;
}

static enum status moe_host_alloc(struct model_train *t, int64_t T)
{
    const size_t E = (size_t)t->m->cfg.n_experts, sets = (size_t)t->n_sets * (size_t)t->m->n_layers_local;
    const size_t ep_idx = ep_host_bytes(t->m, T);
    char *p = calloc(1, moe_scratch_bytes(t->m, T) + ep_idx + sets * moe_route_bytes(t->m, T));
    if (!p) return STATUS_RESOURCE_EXHAUSTED;
    t->moe_host = p;
    struct moe_grad_scratch *g = &t->sets[t->n_sets]->moe_grad;
    g->host_tok = (double *)p;
    g->host_dz = (float *)(g->host_tok + 3 * T);
    g->host_dw = g->host_dz + (size_t)T * E;
    t->ep_host = ep_idx ? (int32_t *)(p + moe_scratch_bytes(t->m, T)) : NULL;
    return STATUS_OK;
}

/* Layer l of set a (index s) as moe_forward's tensors: its kept routing and insides, the
 * shared scratch, and its host routing. */
static void moe_layer_tensors(struct model_train *t, struct train_activations *a, int s, int l)
{
    const struct model_config *c = &t->m->cfg;
    const int64_t T = a->max_tokens, E = c->n_experts, TK = T * c->n_experts_used;
    struct layer_acts *la = &a->layers[l];
    char *p = (char *)t->moe_host + moe_scratch_bytes(t->m, T) + ep_host_bytes(t->m, T) +
              ((size_t)s * (size_t)t->m->n_layers_local + (size_t)l) * moe_route_bytes(t->m, T);
    struct moe_routing *r = &la->route;
    r->ep_n = t->m->ep_size > 1 ? (int64_t *)p : NULL; /* first: 8-byte aligned */
    if (r->ep_n) p += (size_t)t->m->ep_size * (size_t)E * sizeof(int64_t);
    r->logits = (float *)p;
    r->start = (int *)(r->logits + T * E);
    r->ids = (int32_t *)(r->start + E + 1);
    r->w = (float *)(r->ids + TK);
    r->sw = r->w + TK;
    struct moe_tensors *mt = &la->moe;
    mt->logits = a->moe_logits, mt->logits32 = a->moe_logits32, mt->x = a->moe_x, mt->rows = a->moe_rows;
    mt->s_gate = la->gate, mt->s_up = la->up, mt->s_hact = la->hact;
    mt->ep_buf = a->ep_buf, mt->ep_in = a->ep_in, mt->ep_out = a->ep_out, mt->ep_idx = a->ep_idx;
    mt->ep_host = t->ep_host;
    mt->r = r;
    mt->per_slot = 1;
    mt->recompute = 0;
}

enum status model_train_new(struct model *m, int max_tokens, const struct train_memory *mem, struct model_train **out)
{
    const struct train_memory one = {.recompute = TRAIN_RECOMPUTE_NONE, .sets = 1};
    if (!mem) mem = &one;
    *out = NULL;
    enum status st = check_plan(m, max_tokens, mem);
    if (st != STATUS_OK) return st;
    const int S = mem->sets, L = m->n_layers_local;
    struct model_train *t = calloc(1, sizeof *t);
    if (!t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    t->m = m;
    t->mem = *mem;
    t->sets = calloc((size_t)S + 1, sizeof *t->sets);
    if (!t->sets) {
        free(t);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    }
    t->n_sets = S;
    const int sp = train_sp(t);
    const int64_t T = max_tokens, Tl = sp ? T / m->tp_size : T, d = m->cfg.d_model;
    const int64_t hq = (int64_t)m->n_heads_local * m->cfg.head_dim, hkv = (int64_t)m->n_kv_local * m->cfg.head_dim;
    const int64_t ffn = m->ffn_local, tp = m->tp_size;
    const int K = mem->recompute == TRAIN_RECOMPUTE_UNIFORM ? mem->num_layers : 1; /* shared layer sets */
    const int cap = (L + K) * F_COUNT + 40;
    struct carve cv = {malloc((size_t)cap * sizeof *cv.t), malloc((size_t)cap * sizeof *cv.dt),
                       malloc((size_t)cap * sizeof *cv.shape), 0, cap};
    struct train_activations *common = calloc(1, sizeof *common);
    struct layer_acts *shared = calloc((size_t)K, sizeof *shared);
    t->sets[S] = common;
    if (!cv.t || !cv.dt || !cv.shape || !common || !shared) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
        goto out;
    }
    /* Common: the recomputed tensors (one copy per shared set), backward scratch, loss scratch. */
    enum dtype dt;
    int64_t rows, cols;
    for (int j = 0; j < K; j++)
        for (int f = 0; f < F_COUNT; f++) { /* the largest of the layers that share it */
            int64_t most_rows = 0, most_cols = 0;
            dt = m->dtype;
            for (int l = 0, pos = 0; l < L; l++) {
                if (!field_shared(t, l, f, &pos) || pos != j) continue;
                field_shape(m, f, l, T, Tl, &dt, &rows, &cols);
                if (rows > most_rows) most_rows = rows;
                if (cols > most_cols) most_cols = cols;
            }
            carve_add(&cv, field(&shared[j], f), dt, most_rows, most_cols ? most_cols : 1);
        }
    common->max_tokens = max_tokens;
    carve_add(&cv, &common->dres, m->dtype, Tl, d);
    carve_add(&cv, &common->dtmp, m->dtype, Tl, d);
    carve_add(&cv, &common->dxn, m->dtype, T, d);
    carve_add(&cv, &common->gath, m->dtype, sp ? T : 0, d);
    carve_add(&cv, &common->dfull, m->dtype, sp ? T : 0, d);
    carve_add(&cv, &common->dq, m->dtype, T, hq);
    carve_add(&cv, &common->datt, m->dtype, T, hq);
    carve_add(&cv, &common->dk, m->dtype, T, hkv);
    carve_add(&cv, &common->dv, m->dtype, T, hkv);
    const int64_t qk_full = m->cfg.qk_norm == QK_NORM_FULL && m->tp_size > 1 ? T : 0;
    carve_add(&cv, &common->qk_full, m->dtype, qk_full, (int64_t)m->cfg.n_heads * m->cfg.head_dim);
    carve_add(&cv, &common->qk_dfull, m->dtype, qk_full, (int64_t)m->cfg.n_heads * m->cfg.head_dim);
    const struct model_config *c = &m->cfg;
    const int64_t E = c->n_experts, top_k = c->n_experts_used, moe_T = E ? T : 0;
    const int64_t wide = E && c->moe_ffn > ffn ? c->moe_ffn : ffn;
    /* Expert parallelism: an expert's rows come from the whole group (up to ep x T), and its
     * dispatch and combine need room for the most rows this rank's experts can receive. */
    const int64_t ep_R = E && m->ep_size > 1 ? moe_ep_rows(m, T) : 0, Tx = ep_R ? (int64_t)m->ep_size * T : T;
    carve_add(&cv, &common->dgate, m->dtype, Tx, wide);
    carve_add(&cv, &common->dup, m->dtype, Tx, wide);
    carve_add(&cv, &common->ep_buf, m->dtype, ep_R, d);
    carve_add(&cv, &common->ep_in, m->dtype, ep_R, d);
    carve_add(&cv, &common->ep_out, m->dtype, ep_R, d);
    carve_add(&cv, &common->ep_idx, DTYPE_I32, ep_R ? moe_ep_idx_len(m, T) : 0, 1);
    carve_add(&cv, &common->moe_logits, m->dtype, moe_T, E);
    carve_add(&cv, &common->moe_logits32, DTYPE_F32, m->dtype != DTYPE_F32 ? moe_T : 0, E);
    carve_add(&cv, &common->moe_x, m->dtype, moe_T, d);
    carve_add(&cv, &common->moe_rows, DTYPE_I32, c->shared_expert ? moe_T : 0, 1);
    carve_add(&cv, &common->moe_grad.dy, m->dtype, E ? Tx : 0, d);
    carve_add(&cv, &common->moe_grad.dx, m->dtype, moe_T, d);
    carve_add(&cv, &common->moe_grad.dw, DTYPE_F32, moe_T * (top_k + 1), 1);
    carve_add(&cv, &common->moe_grad.dlogits, DTYPE_F32, moe_T, E);
    carve_add(&cv, &common->moe_grad.dlogits_dt, m->dtype, m->dtype != DTYPE_F32 ? moe_T : 0, E);
    carve_add(&cv, &common->stats_all, DTYPE_F32, tp * T, 3);
    if ((st = carve_alloc(m, &cv, &common->mem, &common->bytes)) != STATUS_OK) goto out;
    common->moe_grad.dgate = common->dgate, common->moe_grad.dup = common->dup;
    common->host_loss = malloc((size_t)T * sizeof *common->host_loss);
    if (E) t->moe_load = calloc((size_t)E * (size_t)(L > 0 ? L : 1), sizeof *t->moe_load);
    if (!common->host_loss || (E && (!t->moe_load || moe_host_alloc(t, T) != STATUS_OK))) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
        goto out;
    }
    if (c->shared_expert) { /* the shared expert's rows: all of them, in order */
        int32_t *rows = (int32_t *)common->moe_grad.host_dz; /* free until a backward */
        for (int64_t i = 0; i < T; i++) rows[i] = (int32_t)i;
        backend_upload(m->b, common->moe_rows.data, rows, (size_t)T * sizeof *rows);
    }
    for (int s = 0; s < S; s++) {
        struct train_activations *a = calloc(1, sizeof *a);
        t->sets[s] = a;
        if (!a || !(a->layers = calloc((size_t)(L > 0 ? L : 1), sizeof *a->layers))) {
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
            goto out;
        }
        for (int l = 0; l < L; l++)
            for (int f = 0; f < F_COUNT; f++) {
                int pos = 0;
                field_shape(m, f, l, T, Tl, &dt, &rows, &cols);
                if (field_shared(t, l, f, &pos)) continue; /* aliased below */
                carve_add(&cv, field(&a->layers[l], f), dt, rows, cols);
            }
        carve_add(&cv, &a->x_final, m->dtype, Tl, d);
        carve_add(&cv, &a->h_final, m->dtype, model_is_last_stage(m) ? Tl : 0, d);
        carve_add(&cv, &a->stats, DTYPE_F32, model_is_last_stage(m) ? T : 0, 3);
        carve_add(&cv, &a->loss, DTYPE_F32, T, 1);
        carve_add(&cv, &a->lse, DTYPE_F32, T, 1);
        carve_add(&cv, &a->tokens, DTYPE_I32, T, 1);
        carve_add(&cv, &a->targets, DTYPE_I32, T, 1);
        carve_add(&cv, &a->positions, DTYPE_I32, T, 1);
        carve_add(&cv, &a->doc_start, DTYPE_I32, T + 1, 1);
        if ((st = carve_alloc(m, &cv, &a->mem, &a->bytes)) != STATUS_OK) goto out;
        for (int l = 0; l < L; l++)
            for (int f = 0; f < F_COUNT; f++) {
                int pos = 0;
                if (field_shared(t, l, f, &pos)) *field(&a->layers[l], f) = *field(&shared[pos], f);
            }
        a->max_tokens = max_tokens;
        a->loss = vec(&a->loss, T);
        a->lse = vec(&a->lse, T);
        a->tokens = vec(&a->tokens, T);
        a->targets = vec(&a->targets, T);
        a->positions = vec(&a->positions, T);
        a->doc_start = vec(&a->doc_start, T + 1);
        /* The common scratch, seen from every set. */
        a->dres = common->dres, a->dtmp = common->dtmp, a->dxn = common->dxn, a->gath = common->gath;
        a->dfull = common->dfull, a->dq = common->dq, a->datt = common->datt, a->dk = common->dk;
        a->dv = common->dv, a->dgate = common->dgate, a->dup = common->dup, a->stats_all = common->stats_all;
        a->qk_full = common->qk_full, a->qk_dfull = common->qk_dfull;
        a->host_loss = common->host_loss;
        a->moe_logits = common->moe_logits, a->moe_logits32 = common->moe_logits32, a->moe_x = common->moe_x;
        a->moe_rows = common->moe_rows, a->moe_grad = common->moe_grad;
        a->ep_buf = common->ep_buf, a->ep_in = common->ep_in, a->ep_out = common->ep_out;
        a->ep_idx = vec(&common->ep_idx, ep_R ? moe_ep_idx_len(m, T) : 0);
        for (int l = 0; E && l < L; l++) moe_layer_tensors(t, a, s, l);
    }
    t->a = t->sets[0];
out:
    free(cv.t);
    free(cv.dt);
    free(cv.shape);
    free(shared);
    if (st != STATUS_OK) model_train_free(t);
    else *out = t;
    return st;
}

void model_train_set_lora(struct model_train *t, struct lora *lora) { t->lora = lora; }

void model_train_set_layer_hook(struct model_train *t, void (*fn)(void *ctx, int layer), void *ctx)
{
    t->layer_done = fn;
    t->hook_ctx = ctx;
}

struct model *model_train_model(const struct model_train *t) { return t->m; }

int model_train_n_sets(const struct model_train *t) { return t->n_sets; }

void model_train_use_set(struct model_train *t, int set)
{
    CHECK(set >= 0 && set < t->n_sets, "activation set %d of %d", set, t->n_sets);
    t->a = t->sets[set];
}

size_t model_train_activation_bytes(const struct model_train *t)
{
    size_t n = 0;
    for (int i = 0; i <= t->n_sets; i++) n += t->sets[i] ? t->sets[i]->bytes : 0;
    return n;
}

struct tensor model_train_boundary(struct model_train *t, int n_tokens)
{
    return tensor_first_rows(&t->a->x_final, train_sp(t) ? n_tokens / t->m->tp_size : n_tokens);
}

struct tensor model_train_boundary_grad(struct model_train *t, int n_tokens)
{
    return tensor_first_rows(&t->a->dres, train_sp(t) ? n_tokens / t->m->tp_size : n_tokens);
}

struct tensor model_train_final_hidden(struct model_train *t, int n_tokens)
{
    return tensor_first_rows(&t->a->h_final, n_tokens);
}

enum status model_weights_make_writable(struct model *m)
{
    if (m->weight_bytes_mapped == 0) return STATUS_OK;
    struct weight_ref *table = malloc((size_t)weights_table_max(m->w.n_layers) * sizeof *table);
    if (!table) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    const int n = weights_table(&m->w, m->layer_first, 1, table);
    enum status st = STATUS_OK;
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        struct tensor *t = table[i].t;
        if (model_owns(m, t->data)) continue;
        void *mem = NULL;
        if ((st = backend_alloc(m->b, tensor_nbytes(t), &mem)) != STATUS_OK) break;
        if (base_grow((void **)&m->owned, &m->cap_owned, m->n_owned + 1, sizeof *m->owned)) {
            backend_free(m->b, mem);
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
            break;
        }
        m->owned[m->n_owned++] = mem;
        backend_copy(m->b, mem, t->data, tensor_nbytes(t));
        t->data = mem;
    }
    free(table);
    if (st == STATUS_OK) {
        if (m->w.tied) m->w.lm_head = m->w.tok_embedding;
        m->weight_bytes_mapped = 0;
    }
    return st;
}

size_t model_release_weight(struct model *m, struct tensor *t)
{
    size_t freed = 0;
    for (size_t j = 0; t->data && j < m->n_owned; j++)
        if (m->owned[j] == t->data) {
            backend_free(m->b, t->data);
            m->owned[j] = m->owned[--m->n_owned];
            freed = tensor_nbytes(t);
            break;
        }
    t->data = NULL;
    return freed;
}

void model_train_set_moe_loss(struct model_train *t, float aux_coeff, float z_coeff)
{
    t->moe_aux_coeff = aux_coeff;
    t->moe_z_coeff = z_coeff;
}

int model_train_moe_stats(struct model_train *t, double *aux, double *z, int64_t *load)
{
    const int n = t->moe_forwards;
    const size_t cells = (size_t)t->m->cfg.n_experts * (size_t)t->m->n_layers_local;
    *aux = t->moe_aux_sum;
    *z = t->moe_z_sum;
    for (size_t i = 0; load && i < cells; i++) load[i] += t->moe_load[i];
    t->moe_forwards = 0;
    t->moe_aux_sum = t->moe_z_sum = 0.0;
    if (cells) memset(t->moe_load, 0, cells * sizeof *t->moe_load);
    return n;
}

void train_moe_count(struct model_train *t)
{
    const struct model_config *c = &t->m->cfg;
    if (!c->n_experts || t->m->tp_rank != 0) return; /* the routing is the same on every tp rank: counted once */
    t->moe_forwards++;
    for (int l = 0; l < t->m->n_layers_local; l++) {
        if (!config_layer_moe(c, t->m->layer_first + l)) continue; /* a dense layer (GLM-4.5's first) */
        const struct moe_routing *r = &t->a->layers[l].route;
        t->moe_aux_sum += r->aux;
        t->moe_z_sum += r->z;
        for (int e = 0; e < c->n_experts; e++) t->moe_load[(size_t)l * c->n_experts + e] += r->start[e + 1] - r->start[e];
    }
}
