/* engine/model/model.c - the decoder forward pass for one stage on one tensor shard, and its
 * workspace. Loading weights lives in model_load.c; decode steps from graphs in step_graph.c; the
 * device's share of sampling in device_sampling.c.
 * Tests: tests/test_model.c. */
#include "model.h"
#include "device_sampling.h"
#include "layer.h"
#include "lora.h"
#include "model_train.h"
#include "moe.h"
#include "step_graph.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- workspace --------------------------------------------------------------------------- */

struct work_entry {
    struct tensor *t;
    enum dtype dtype;
    int ndim;
    int64_t shape[3];
};

/* The widest output of an adaptable projection (q, k, v, o, gate, up, down) on this rank. */
static int64_t widest_projection(const struct model *m)
{
    const int64_t hd = m->cfg.head_dim, outs[] = {m->n_heads_local * hd, m->n_kv_local * hd, m->ffn_local, m->cfg.d_model};
    int64_t w = 0;
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) w = outs[i] > w ? outs[i] : w;
    return w;
}

enum status model_reserve(struct model *m, int max_tokens, int max_seqs, int max_blocks,
                          int max_logits)
{
    if (max_tokens <= 0 || max_seqs <= 0 || max_blocks <= 0 || max_logits <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "model: workspace sizes must be positive (tokens %d, seqs %d, blocks %d, logits %d)",
                             max_tokens, max_seqs, max_blocks, max_logits);
    const enum status gst = step_graphs_setup(m);
    if (gst != STATUS_OK) return gst;
    if (m->ws.mem && max_tokens <= m->ws.max_tokens && max_seqs <= m->ws.max_seqs &&
        max_blocks <= m->ws.max_blocks && max_logits <= m->ws.max_logits &&
        (m->max_adapter_rank == 0 || tensor_cols(&m->ws.lora_u) >= m->max_adapter_rank))
        return STATUS_OK;
    if (m->ws.mem) { /* grow to the union of old and new limits */
        max_tokens = max_tokens > m->ws.max_tokens ? max_tokens : m->ws.max_tokens;
        max_seqs = max_seqs > m->ws.max_seqs ? max_seqs : m->ws.max_seqs;
        max_blocks = max_blocks > m->ws.max_blocks ? max_blocks : m->ws.max_blocks;
        max_logits = max_logits > m->ws.max_logits ? max_logits : m->ws.max_logits;
    }
    const struct model_config *c = &m->cfg;
    const int64_t T = max_tokens, d = c->d_model, hd = c->head_dim;
    const int64_t E = c->n_experts, TK = E ? T * c->n_experts_used : 0, moe_T = E ? T : 0;
    const int64_t epTK = m->ep_size > 1 ? TK : 0;
    const size_t sample_out_bytes = device_sampling_out_bytes(max_logits, model_top_width(c->vocab_size));
    /* gate and up hold one expert's rows too (moe_ffn features) */
    const int64_t ffn = E && c->moe_ffn > m->ffn_local ? c->moe_ffn : m->ffn_local;
    const struct work_entry table[] = {
        {&m->ws.x, m->dtype, 2, {T, d}},
        {&m->ws.xn, m->dtype, 2, {T, d}},
        {&m->ws.q, m->dtype, 3, {T, m->n_heads_local, hd}},
        {&m->ws.k, m->dtype, 3, {T, m->n_kv_local, hd}},
        {&m->ws.v, m->dtype, 3, {T, m->n_kv_local, hd}},
        {&m->ws.att, m->dtype, 3, {T, m->n_heads_local, hd}},
        {&m->ws.proj, m->dtype, 2, {T, d}},
        {&m->ws.gate, m->dtype, 2, {T, ffn}},
        {&m->ws.up, m->dtype, 2, {T, ffn}},
        {&m->ws.moe_logits, m->dtype, 2, {moe_T, E}},
        {&m->ws.moe_logits32, DTYPE_F32, 2, {m->dtype != DTYPE_F32 ? moe_T : 0, E}},
        {&m->ws.moe_x, m->dtype, 2, {moe_T, d}},
        {&m->ws.moe_y, m->dtype, 2, {moe_T, d}},
        {&m->ws.moe_ids, DTYPE_I32, 1, {TK}},
        {&m->ws.moe_w, DTYPE_F32, 1, {TK}},
        {&m->ws.moe_rows, DTYPE_I32, 1, {c->shared_expert ? T : 0}},
        {&m->ws.moe_sw, DTYPE_F32, 1, {c->shared_expert ? T : 0}},
        {&m->ws.ep_send, m->dtype, 2, {epTK, d}},
        {&m->ws.ep_recv, m->dtype, 2, {epTK, d}},
        {&m->ws.ep_y, m->dtype, 2, {epTK, d}},
        {&m->ws.ep_idx, DTYPE_I32, 1, {3 * epTK}},
        {&m->ws.rows, m->dtype, 2, {max_logits, d}},
        {&m->ws.logits, m->dtype, 2, {max_logits, m->vocab_local}},
        /* Only with tp > 1 (gathered shards) and with non-f32 compute (f32 for the host). */
        {&m->ws.logits_full, m->dtype, 2, {m->tp_size > 1 ? max_logits : 0, (int64_t)m->tp_size * m->vocab_local}},
        {&m->ws.logits_f32, DTYPE_F32, 2, {m->dtype != DTYPE_F32 ? max_logits : 0, (int64_t)m->tp_size * m->vocab_local}},
        {&m->ws.tokens, DTYPE_I32, 1, {T}},
        {&m->ws.positions, DTYPE_I32, 1, {T}},
        {&m->ws.slots, DTYPE_I32, 1, {T}},
        {&m->ws.logit_rows, DTYPE_I32, 1, {max_logits}},
        /* a step's inputs from tokens to here lie together, block_table last (step_upload) */
        {&m->ws.q_start, DTYPE_I32, 1, {max_seqs + 1}},
        {&m->ws.seq_len, DTYPE_I32, 1, {max_seqs}},
        {&m->ws.block_table, DTYPE_I32, 2, {max_seqs, max_blocks}},
        {&m->ws.sample_out, DTYPE_I32, 1, {(int64_t)(sample_out_bytes / 4)}},
        {&m->ws.lse, DTYPE_F32, 2, {T, m->n_heads_local}},
        {&m->ws.type_ids, DTYPE_I32, 1, {c->type_vocab_size > 0 ? T : 0}},
        {&m->ws.x_f32, DTYPE_F32, 2, {m->dtype != DTYPE_F32 ? T : 0, d}},
        {&m->ws.lora_u, m->dtype, 2, {m->max_adapter_rank > 0 ? T : 0, m->max_adapter_rank}},
        {&m->ws.lora_z, m->dtype, 2, {m->max_adapter_rank > 0 ? T : 0, widest_projection(m)}},
        {&m->ws.qk_full, m->dtype, 2, {c->qk_norm == QK_NORM_FULL && m->tp_size > 1 ? T : 0, (int64_t)c->n_heads * hd}},
    };
    const size_t n_entries = sizeof table / sizeof table[0];
    /* One allocation carved by the table, each piece aligned to 256 bytes. */
    size_t total = 0;
    for (size_t i = 0; i < n_entries; i++) {
        struct tensor t = tensor_make(NULL, table[i].dtype, m->b->device, table[i].ndim,
                                      table[i].shape[0], table[i].shape[1], table[i].shape[2]);
        total += (tensor_nbytes(&t) + 255) / 256 * 256;
    }
    void *mem = NULL;
    enum status st = backend_alloc(m->b, total, &mem);
    if (st != STATUS_OK) return st;
    step_graphs_drop(m); /* they point into the old workspace */
    backend_free(m->b, m->ws.mem);
    m->ws.mem = mem;
    size_t off = 0;
    for (size_t i = 0; i < n_entries; i++) {
        *table[i].t = tensor_make((char *)mem + off, table[i].dtype, m->b->device, table[i].ndim,
                                  table[i].shape[0], table[i].shape[1], table[i].shape[2]);
        off += (tensor_nbytes(table[i].t) + 255) / 256 * 256;
    }
    if (m->ws.type_ids.data) backend_memset_zero(m->b, m->ws.type_ids.data, tensor_nbytes(&m->ws.type_ids));
    m->ws.max_tokens = max_tokens;
    m->ws.max_seqs = max_seqs;
    m->ws.max_blocks = max_blocks;
    m->ws.max_logits = max_logits;
    m->ws.sample_out_bytes = sample_out_bytes;
    if (E) {
        free(m->ws.moe_host_logits);
        free(m->ws.moe_host_ids);
        free(m->ws.moe_host_w);
        free(m->ws.moe_host_start);
        free(m->ws.moe_host_sw);
        m->ws.moe_host_sw = malloc((size_t)T * sizeof(float));
        m->ws.moe_host_logits = malloc((size_t)(T * E) * sizeof(float));
        m->ws.moe_host_ids = malloc((size_t)TK * sizeof(int32_t));
        m->ws.moe_host_w = malloc((size_t)TK * sizeof(float));
        m->ws.moe_host_start = malloc((size_t)(E + 1) * sizeof(int));
        if (epTK) {
            free(m->ws.ep_host_idx);
            free(m->ws.ep_host_count);
            m->ws.ep_host_idx = malloc((size_t)(4 * epTK) * sizeof(int32_t)); /* 3 index lists, 1 of weights */
            m->ws.ep_host_count = malloc((size_t)(m->ep_size * E) * sizeof(int64_t));
            if (!m->ws.ep_host_idx || !m->ws.ep_host_count)
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory for expert parallelism");
        }
        if (!m->ws.moe_load) m->ws.moe_load = calloc((size_t)m->n_layers_local * (size_t)E, sizeof *m->ws.moe_load);
        if (!m->ws.moe_host_logits || !m->ws.moe_host_ids || !m->ws.moe_host_w || !m->ws.moe_host_start ||
            !m->ws.moe_host_sw || (!m->ws.moe_load && m->n_layers_local > 0))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory for the experts' routing");
        if (c->shared_expert) { /* the shared expert takes every row: ids 0 .. T - 1, once */
            int32_t *rows = malloc((size_t)T * sizeof *rows);
            if (!rows) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
            for (int64_t i = 0; i < T; i++) rows[i] = (int32_t)i;
            backend_upload(m->b, m->ws.moe_rows.data, rows, (size_t)T * sizeof *rows);
            free(rows);
        }
    }
    const size_t width = (size_t)m->tp_size * (size_t)m->vocab_local;
    if (width != (size_t)c->vocab_size) { /* padded shards: compact on the host */
        backend_host_free(m->b, m->ws.host_logits);
        void *hl = NULL;
        (void)backend_host_alloc(m->b, (size_t)max_logits * width * sizeof *m->ws.host_logits, &hl);
        m->ws.host_logits = hl;
        if (!m->ws.host_logits) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory for logits");
    }
    if (m->par.groups && m->tp_size > 1) {
        size_t most = (size_t)T * (size_t)d;
        if ((size_t)max_logits * width > most) most = (size_t)max_logits * width;
        if ((size_t)tensor_numel(&m->ws.qk_full) > most) most = (size_t)tensor_numel(&m->ws.qk_full); /* layer_qk_norm */
        if ((st = comm_reserve(model_tp_comm(m), most)) != STATUS_OK) return st;
    }
    if (m->par.groups && m->ep_size > 1 && (st = comm_reserve(m->par.groups->tp, (size_t)(T * d))) != STATUS_OK)
        return st; /* the join of the experts' output (moe_ep.c) */
    return STATUS_OK;
}

int model_is_last_stage(const struct model *m) { return m->pp_rank == m->pp_size - 1; }

enum status model_share_tokens(struct model *m, int32_t *tokens, int n)
{
    if (m->par.layout.world_size <= 1 || !m->par.world) return STATUS_OK;
    const struct parallel_layout *l = &m->par.layout;
    int root = parallel_layout_rank(l, l->dp_rank, l->pp_size - 1, 0);
    return parallel_bcast_bytes(m->par.world, tokens, (size_t)n * sizeof *tokens, root);
}

int model_owns(const struct model *m, const void *p)
{
    for (size_t j = 0; j < m->n_owned; j++)
        if (m->owned[j] == p) return 1;
    return 0;
}

void model_free(struct model *m)
{
    if (!m) return;
    moe_ep_log(m);
    step_graphs_free(m);
    for (size_t i = 0; i < m->n_owned; i++) backend_free(m->b, m->owned[i]);
    free(m->owned);
    backend_free(m->b, m->ws.mem);
    weights_free_layers(&m->w);
    free(m->ws.moe_host_logits);
    free(m->ws.moe_host_ids);
    free(m->ws.moe_host_w);
    free(m->ws.moe_host_start);
    free(m->ws.moe_host_sw);
    free(m->ws.ep_host_idx);
    free(m->ws.ep_host_count);
    free((void *)m->ws.moe_load);
    backend_host_free(m->b, m->ws.host_logits);
    device_sampling_free(m);
    checkpoint_close(m->checkpoint);
    free(m);
}

/* ---- forward ----------------------------------------------------------------------------- */

float model_attn_scale(const struct model *m)
{
    return m->cfg.attn_scale > 0.0f ? m->cfg.attn_scale : 1.0f / sqrtf((float)m->cfg.head_dim);
}

enum status model_embed_input(struct model *m, int64_t T, const struct tensor *x)
{
    struct backend *b = m->b;
    struct tensor tokens = tensor_first_rows(&m->ws.tokens, T), pos = tensor_first_rows(&m->ws.positions, T);
    /* The masked lookup of this vocab shard; the all-reduce joins the shards. */
    op_embedding(b, x, &m->w.tok_embedding, &tokens, m->vocab_start);
    enum status st;
    if (m->tp_size > 1 && (st = comm_all_reduce(model_tp_comm(m), x)) != STATUS_OK) return st;
    if (m->cfg.embed_scale != 0.0f && m->cfg.embed_scale != 1.0f) op_scale(b, x, x, m->cfg.embed_scale);
    if (m->cfg.positions == POSITION_KIND_LEARNED) op_position_embedding_add(b, x, &m->w.pos_embedding, &pos);
    if (m->cfg.type_vocab_size > 0) { /* every token in segment 0: the type ids index the table as positions do */
        struct tensor types = tensor_first_rows(&m->ws.type_ids, T);
        op_position_embedding_add(b, x, &m->w.type_embedding, &types);
    }
    if (m->cfg.embed_norm) op_layernorm(b, x, x, &m->w.embed_norm, &m->w.embed_norm_bias, m->cfg.norm_eps);
    return STATUS_OK;
}

static void upload_i32(struct backend *b, const struct tensor *dst, const int32_t *src, int64_t n)
{
    if (n > 0) backend_upload(b, dst->data, src, (size_t)n * sizeof(int32_t));
}

/* rows (T, d_model) of f32 host memory into t, in the model's dtype (through ws.x_f32). */
static void upload_rows(struct model *m, const struct tensor *t, const float *rows, int64_t T)
{
    if (m->dtype == DTYPE_F32) {
        backend_upload(m->b, t->data, rows, tensor_nbytes(t));
        return;
    }
    struct tensor f = tensor_first_rows(&m->ws.x_f32, T);
    backend_upload(m->b, f.data, rows, tensor_nbytes(&f));
    op_cast(m->b, t, &f);
}

/* t (T, d_model) in the model's dtype into f32 host memory (through ws.x_f32). */
static void download_rows(struct model *m, float *rows, const struct tensor *t, int64_t T)
{
    const struct tensor *src = t;
    struct tensor f = tensor_first_rows(&m->ws.x_f32, T);
    if (m->dtype != DTYPE_F32) op_cast(m->b, &f, t), src = &f;
    backend_download(m->b, rows, src->data, tensor_nbytes(src));
}

/* An EAGLE head's input rows (model.input_fc_*): x = embedding W_e^T + features W_f^T + bias,
 * with x holding the embeddings on entry. */
static void input_from_features(struct model *m, int64_t T, const struct tensor *x, const float *features)
{
    struct tensor f = tensor_first_rows(&m->ws.xn, T), e = tensor_first_rows(&m->ws.proj, T);
    upload_rows(m, &f, features, T);
    op_matmul(m->b, &e, x, &m->input_fc_emb, m->input_fc_bias.data ? &m->input_fc_bias : NULL);
    op_matmul(m->b, x, &f, &m->input_fc_feat, NULL);
    op_add(m->b, x, x, &e);
}

/* The final norm of x into out (may be x); a model without one (an EAGLE head) copies. */
static void final_norm(struct model *m, const struct tensor *out, const struct tensor *x)
{
    if (m->w.final_norm.data) layer_norm(m, out, x, &m->w.final_norm, &m->w.final_norm_bias);
    else if (out->data != x->data) backend_copy(m->b, out->data, x->data, tensor_nbytes(x));
}

/* ---- the layer's serving hooks (layer.h) ----------------------------------------------------- */

struct serve_ctx {
    struct model *m;
    struct kv_cache *cache;
    const struct attention_batch *batch;
    const struct forward_batch *fb;
};

static enum status serve_gather(void *ctx, const struct tensor *local, int64_t T, struct tensor *full)
{
    (void)ctx, (void)T;
    *full = *local;
    return STATUS_OK;
}

static struct tensor serve_partial(void *ctx, const struct tensor *out, int64_t T)
{
    (void)ctx, (void)T;
    return *out;
}

/* Row-parallel products: each tp rank holds a slice of the input features, so the partial
 * outputs are summed in place. */
static enum status serve_reduce(void *ctx, const struct tensor *partial, const struct tensor *out)
{
    struct serve_ctx *sc = ctx;
    (void)out;
    if (sc->m->tp_size > 1) return comm_all_reduce(model_tp_comm(sc->m), partial);
    return STATUS_OK;
}

/* Serving adapters: y += s (x A^T) B^T for the rows of each sequence that asks for one; a run of
 * consecutive sequences with the same adapter is one product (the scheduler's order decides how
 * long the runs are). Rows of the base model are left alone. */
static void serve_adapt(void *ctx, int l, enum lora_target t, const struct tensor *y, const struct tensor *x)
{
    struct serve_ctx *sc = ctx;
    struct model *m = sc->m;
    const struct forward_batch *fb = sc->fb;
    if (!fb->seq_adapter || m->n_adapters == 0) return;
    for (int i = 0, j; i < fb->n_seqs; i = j) {
        const int a = fb->seq_adapter[i];
        for (j = i + 1; j < fb->n_seqs && fb->seq_adapter[j] == a;) j++;
        if (a < 0 || a >= m->n_adapters || !m->adapters[a]) continue;
        const int64_t r0 = fb->q_start[i], n = fb->q_start[j] - r0;
        struct tensor yr = tensor_rows_at(y, r0, n), xr = tensor_rows_at(x, r0, n);
        lora_apply(m->adapters[a], m->b, l, t, &yr, &xr, &m->ws.lora_u, &m->ws.lora_z);
    }
}

/* The new tokens' K/V join the cache first, so attention reads them like any other. */
static void serve_attend(void *ctx, int l, int window, const struct tensor *q3, const struct tensor *k3,
                         const struct tensor *v3, const struct tensor *att3, const struct tensor *lse)
{
    struct serve_ctx *sc = ctx;
    struct model *m = sc->m;
    (void)lse;
    const int64_t T = q3->shape[0];
    struct tensor slots = tensor_first_rows(&m->ws.slots, T);
    struct attention_batch ab = *sc->batch;
    ab.window = window;
    ab.sinks = m->w.layers[l].sinks; /* GPT-OSS's, f32; data NULL for every other model */
    op_kv_write(m->b, &sc->cache->k[l], &sc->cache->v[l], k3, v3, &slots);
    op_attention(m->b, att3, q3, &sc->cache->k[l], &sc->cache->v[l], &ab);
}

/* The serving workspace as one layer's tensors: overwritten in place, layer after layer. */
static struct layer_tensors serve_tensors(struct model *m, int64_t T)
{
    struct tensor x = tensor_first_rows(&m->ws.x, T), xn = tensor_first_rows(&m->ws.xn, T);
    struct tensor proj = tensor_first_rows(&m->ws.proj, T), up = tensor_first_rows(&m->ws.up, T);
    return (struct layer_tensors){
        .x = x, .x_in = x, .x_mid = x, .xn1 = xn, .xn2 = xn,
        .q_pre = m->ws.q, .k_pre = m->ws.k, .q = m->ws.q, .k = m->ws.k, .v = m->ws.v, .att = m->ws.att,
        .gate = m->ws.gate, .up = up, .hact = up,
        .attn_out = proj, .mlp_out = proj, .normed = proj,
        .pos = m->ws.positions, .qk_full = m->ws.qk_full,
    };
}

/* Rows [first, first + n) of logits x (rows, width) as f32 on the device: x's own, or cast into the
 * same rows of ws.logits_f32 (the model's dtype is not f32), for the host to download. */
static const float *f32_rows(struct model *m, const struct tensor *x, int64_t first, int64_t n)
{
    const int64_t width = tensor_cols(x);
    const size_t at = (size_t)first * (size_t)width;
    if (x->dtype == DTYPE_F32) return (const float *)x->data + at;
    const struct tensor src = tensor_make((char *)x->data + at * dtype_size(x->dtype), x->dtype, m->b->device, 2, n, width);
    const struct tensor dst = tensor_make((float *)m->ws.logits_f32.data + at, DTYPE_F32, m->b->device, 2, n, width);
    op_cast(m->b, &dst, &src);
    return dst.data;
}

/* The stage's ops of a step: its input rows (the embedding, or the previous stage's), then its
 * layers, into ws.x. */
static enum status stage_ops(struct serve_ctx *sc)
{
    struct model *m = sc->m;
    const struct forward_batch *fb = sc->fb;
    const int64_t T = fb->n_tokens;
    struct tensor x = tensor_first_rows(&m->ws.x, T);
    enum status st;
    if (m->pp_rank == 0) {
        if ((st = model_embed_input(m, T, &x)) != STATUS_OK) return st;
        if (m->input_fc_emb.data) input_from_features(m, T, &x, fb->features);
    } else if ((st = comm_recv(m->par.groups->pp, &x, m->pp_rank - 1)) != STATUS_OK) {
        return st;
    }
    const struct layer_hooks hooks = {.ctx = sc, .gather = serve_gather, .partial = serve_partial,
                                      .reduce = serve_reduce, .adapt = serve_adapt, .attend = serve_attend};
    const struct layer_tensors lt = serve_tensors(m, T);
    for (int l = 0; l < m->n_layers_local; l++)
        if ((st = layer_forward(m, l, T, &lt, &hooks, 1)) != STATUS_OK) return st;
    return STATUS_OK;
}

/* The logits of fb's rows into lg (the LM head's, or fb->head's): only the rows that need them go
 * through the final norm (normed: src is through it already) and the head; gathering rows is the
 * embedding lookup with the residual stream as the table. */
static void head_ops(struct model *m, const struct forward_batch *fb, const struct tensor *src, int normed,
                     const struct tensor *lg)
{
    struct backend *b = m->b;
    struct tensor rows = tensor_first_rows(&m->ws.rows, fb->n_logits), ids = tensor_first_rows(&m->ws.logit_rows, fb->n_logits);
    op_embedding(b, &rows, src, &ids, 0);
    if (!normed) final_norm(m, &rows, &rows);
    op_matmul(b, lg, &rows, fb->head ? fb->head : &m->w.lm_head, NULL);
    if (m->cfg.final_softcap > 0.0f) op_softcap(b, lg, lg, m->cfg.final_softcap); /* Gemma 2 */
}

/* A step graph's body (step_graph.h: one rank, no head or hidden states): tokens to logits. */
static enum status graph_ops(void *ctx)
{
    struct serve_ctx *sc = ctx;
    struct model *m = sc->m;
    const enum status st = stage_ops(sc);
    if (st != STATUS_OK) return st;
    const struct tensor x = tensor_first_rows(&m->ws.x, sc->fb->n_tokens);
    const struct tensor lg = tensor_first_rows(&m->ws.logits, sc->fb->n_logits);
    head_ops(m, sc->fb, &x, 0, &lg);
    return STATUS_OK;
}

static enum status forward_step(struct model *m, struct kv_cache *cache, const struct forward_batch *in,
                                float *logits)
{
    struct backend *b = m->b;
    /* The step the ops run: in, or in padded to a graph's batch size (step_graph_pad), whose first
     * in->n_logits logits rows are in's. */
    struct forward_batch padded;
    const struct forward_batch *fb = step_graph_pad(m, in, &padded);
    const int64_t T = fb->n_tokens;
    CHECK(T > 0 && T <= m->ws.max_tokens && fb->n_seqs > 0 && fb->n_seqs <= m->ws.max_seqs &&
              fb->max_blocks > 0 && fb->max_blocks <= m->ws.max_blocks && fb->n_logits >= 0 &&
              fb->n_logits <= m->ws.max_logits,
          "forward batch (tokens %lld, seqs %d, blocks %d, logits %d) exceeds the workspace "
          "(%d, %d, %d, %d)",
          (long long)T, fb->n_seqs, fb->max_blocks, fb->n_logits, m->ws.max_tokens, m->ws.max_seqs,
          m->ws.max_blocks, m->ws.max_logits);
    CHECK(!m->cfg.encoder, "model_forward on an encoder (%s): the engine refuses generation for it", m->cfg.architecture);
    CHECK(cache->n_layers == m->n_layers_local, "cache has %d layers, stage %d", cache->n_layers,
          m->n_layers_local);
    for (int64_t i = 0; i < T; i++)
        if (fb->positions[i] < 0 || fb->positions[i] >= m->cfg.max_positions)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "position %d is outside the model's context (%d)", fb->positions[i],
                                 m->cfg.max_positions);

    struct attention_batch ab = {
        .n_seqs = fb->n_seqs,
        .block_tokens = cache->block_tokens,
        .q_start = tensor_first_rows(&m->ws.q_start, fb->n_seqs + 1),
        .seq_len = tensor_first_rows(&m->ws.seq_len, fb->n_seqs),
        .scale = model_attn_scale(m),
        .window = m->cfg.sliding_window,
        .softcap = m->cfg.attn_softcap,
        .row_path = fb->seq_row_path,
    };
    /* The host knows what the device-side q_start says: a decode step lets the backend pick its
     * decode kernel (struct attention_batch.decode_only). */
    ab.decode_only = T == fb->n_seqs;
    for (int s = 0; s < fb->n_seqs; s++) {
        ab.decode_only = ab.decode_only && fb->q_start[s + 1] - fb->q_start[s] == 1;
        if (fb->seq_len[s] > ab.max_seq_len) ab.max_seq_len = fb->seq_len[s];
    }
    const int32_t *table = step_table(m, fb, in->n_seqs, cache->block_tokens, ab.max_seq_len, &ab.max_blocks);
    step_upload(m, fb, table, ab.max_blocks);
    ab.block_table = tensor_make(m->ws.block_table.data, DTYPE_I32, b->device, 2, (int64_t)fb->n_seqs,
                                 (int64_t)ab.max_blocks);

    CHECK(!fb->features || (m->tp_size == 1 && m->pp_size == 1), "forward batch: features at tp %d, pp %d",
          m->tp_size, m->pp_size);
    CHECK(!fb->hidden || model_is_last_stage(m), "forward batch: hidden states asked of stage %d of %d", m->pp_rank,
          m->pp_size);
    CHECK(!m->input_fc_emb.data || fb->features, "forward batch: an EAGLE head without its features");
    struct tensor lg = tensor_first_rows(&m->ws.logits, fb->n_logits);
    if (fb->head) { /* another head (a draft's): its rows are the logits' columns, one rank */
        CHECK(m->tp_size == 1 && !fb->greedy_ids && tensor_rows(fb->head) <= m->vocab_local,
              "forward batch: a head of %lld rows at tp %d", (long long)tensor_rows(fb->head), m->tp_size);
        lg = tensor_make(m->ws.logits.data, m->dtype, b->device, 2, (int64_t)fb->n_logits, tensor_rows(fb->head));
    }
    struct serve_ctx sc = {.m = m, .cache = cache, .batch = &ab, .fb = fb};
    struct step_graph_key key;
    enum status st;
    if (step_graph_fits(m, cache, fb, &ab, &key)) { /* the whole step in one launch where it may */
        if ((st = step_graph_run(m, &key, graph_ops, &sc)) != STATUS_OK) return st;
    } else {
        if ((st = stage_ops(&sc)) != STATUS_OK) return st;
        struct tensor x = tensor_first_rows(&m->ws.x, T);
        if (!model_is_last_stage(m)) return comm_send(m->par.groups->pp, &x, m->pp_rank + 1);
        /* Every row's hidden state for EAGLE: all rows through the final norm, the logits' rows
         * gathered from there. */
        struct tensor normed = tensor_first_rows(&m->ws.xn, T);
        if (fb->hidden) {
            final_norm(m, &normed, &x);
            download_rows(m, fb->hidden, &normed, T);
        }
        if (fb->n_logits == 0) {
            backend_synchronize(b);
            return STATUS_OK;
        }
        head_ops(m, fb, fb->hidden ? &normed : &x, fb->hidden != NULL, &lg);
    }
    fb = in; /* from here on, the caller's rows only */
    struct tensor full = tensor_first_rows(&lg, fb->n_logits);
    if (m->tp_size > 1) { /* vocab-parallel shards side by side: (rows, tp * vocab_local) */
        full = tensor_first_rows(&m->ws.logits_full, fb->n_logits);
        if ((st = comm_all_gather_last(model_tp_comm(m), &full, &lg)) != STATUS_OK) return st;
    }
    const int64_t V = fb->head ? tensor_rows(fb->head) : m->cfg.vocab_size;
    if (fb->greedy_done) *fb->greedy_done = 0;
    m->ws.logits_edited = 0;
    if ((fb->greedy_ids || fb->top_k > 0) && tensor_cols(&full) == V) {
        const int done = device_sampling_run(m, fb, &full);
        if (done < 0) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of memory for the sampling's inputs "
                                           "(%d logit edits, %d masks)", fb->n_edits, fb->n_masks);
        if (done) return STATUS_OK;
    }
    const float *host_src = f32_rows(m, &full, 0, fb->n_logits);
    const int64_t width = tensor_cols(&full);
    const size_t bytes = (size_t)fb->n_logits * (size_t)width * sizeof(float);
    if (width == V) {
        backend_download(b, logits, host_src, bytes);
        return STATUS_OK;
    }
    /* Drop the zero rows that padded the vocabulary to a multiple of tp. */
    backend_download(b, m->ws.host_logits, host_src, bytes);
    for (int i = 0; i < fb->n_logits; i++)
        memcpy(logits + (size_t)i * (size_t)V, m->ws.host_logits + (size_t)i * (size_t)width, (size_t)V * sizeof *logits);
    return STATUS_OK;
}

/* A step that holds rows verifying drafts runs its matrix products as batch_invariant would
 * (struct backend.rows_as_decode): on the CPU a verified row then gives the bits of the decode
 * row it stands for, as attention's row path does for its part. Without it, 8 drafts made a
 * 9-row product that took the AMX tiles (x rounded to bf16) where decode took the int8 rows, and
 * greedy answers changed (server_speculative, on a Xeon with AMX). */
enum status model_forward(struct model *m, struct kv_cache *cache, const struct forward_batch *fb,
                          float *logits)
{
    int marked = 0;
    for (int s = 0; fb->seq_row_path && s < fb->n_seqs && !marked; s++) marked = fb->seq_row_path[s] != 0;
    m->b->rows_as_decode = marked;
    const enum status st = forward_step(m, cache, fb, logits);
    m->b->rows_as_decode = 0;
    return st;
}

/* Logits row row of the last step as f32 on the device (model_logits_row). */
static const float *row_f32(struct model *m, int row)
{
    const struct tensor *full = m->tp_size > 1 ? &m->ws.logits_full : &m->ws.logits;
    const int64_t cols = tensor_cols(full);
    CHECK(cols == m->cfg.vocab_size && row >= 0 && row < tensor_rows(full), "model_logits_row: row %d of %lld x %lld "
          "logits", row, (long long)tensor_rows(full), (long long)cols);
    return m->ws.logits_edited && full->dtype != DTYPE_F32 /* the step's rows, edited in f32 */
               ? (const float *)m->ws.logits_f32.data + (size_t)row * (size_t)cols
               : f32_rows(m, full, row, 1);
}

enum status model_logits_row(struct model *m, int row, float *out)
{
    backend_download(m->b, out, row_f32(m, row), (size_t)m->cfg.vocab_size * sizeof *out);
    return STATUS_OK;
}

enum status model_logit_at(struct model *m, int row, int32_t id, float *out)
{
    CHECK(id >= 0 && id < m->cfg.vocab_size, "model_logit_at: id %d of %d", id, m->cfg.vocab_size);
    backend_download(m->b, out, row_f32(m, row) + id, sizeof *out);
    return STATUS_OK;
}

/* ---- embeddings ------------------------------------------------------------------------------ */

/* model_embed's attention: within each sequence (a document of the batch), over the rows of this
 * pass only, bidirectional for an encoder. The training attention op does exactly that without
 * a cache; its log-sum-exp goes to scratch. */
struct embed_ctx {
    struct serve_ctx serve;        /* gather, partial, reduce and adapt as in serving (tp 1, no adapters) */
    struct attention_train_batch batch;
};

static void embed_attend(void *ctx, int l, int window, const struct tensor *q3, const struct tensor *k3,
                         const struct tensor *v3, const struct tensor *att3, const struct tensor *lse)
{
    struct embed_ctx *ec = ctx;
    struct model *m = ec->serve.m;
    (void)lse;
    struct attention_train_batch ab = ec->batch;
    ab.window = ab.bidirectional ? 0 : window;
    ab.sinks = m->w.layers[l].sinks; /* GPT-OSS's, f32; data NULL for every other model */
    struct tensor lse_rows = tensor_first_rows(&m->ws.lse, q3->shape[0]);
    op_attention_train(m->b, att3, &lse_rows, q3, k3, v3, &ab);
}

/* out (d) = the pooling of rows (n, d) of host f32, L2-normalised when normalize, in double. */
static void pool_rows(const float *rows, int64_t n, int64_t d, enum model_pooling pooling, int normalize, float *out)
{
    const int64_t first = pooling == MODEL_POOLING_LAST ? n - 1 : 0, count = pooling == MODEL_POOLING_MEAN ? n : 1;
    double ss = 0.0;
    for (int64_t j = 0; j < d; j++) {
        double acc = 0.0;
        for (int64_t i = first; i < first + count; i++) acc += rows[i * d + j];
        out[j] = (float)(acc / (double)count);
        ss += (acc / (double)count) * (acc / (double)count);
    }
    if (!normalize || !(ss > 0.0)) return;
    const double inv = 1.0 / sqrt(ss);
    for (int64_t j = 0; j < d; j++) out[j] = (float)(out[j] * inv);
}

enum status model_embed(struct model *m, const int32_t *tokens, const int32_t *q_start, int n_seqs,
                        enum model_pooling pooling, int normalize, float *out)
{
    struct backend *b = m->b;
    const int64_t T = n_seqs > 0 ? q_start[n_seqs] : 0, d = m->cfg.d_model;
    CHECK(m->tp_size == 1 && m->pp_size == 1, "model_embed runs at tp 1 and pp 1 (tp %d, pp %d)", m->tp_size, m->pp_size);
    CHECK(n_seqs > 0 && n_seqs <= m->ws.max_seqs && T > 0 && T <= m->ws.max_tokens && q_start[0] == 0,
          "embedding batch (tokens %lld, seqs %d) exceeds the workspace (%d, %d)", (long long)T, n_seqs,
          m->ws.max_tokens, m->ws.max_seqs);
    for (int s = 0; s < n_seqs; s++) {
        const int len = q_start[s + 1] - q_start[s];
        CHECK(len > 0, "embedding sequence %d is empty", s);
        if (len > m->cfg.max_positions)
            return status_errorf(STATUS_INVALID_ARGUMENT, "an input of %d tokens is longer than the model's context (%d)",
                                 len, m->cfg.max_positions);
    }
    /* Host scratch for one call: positions (T), then the final rows (T, d) as f32. */
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    float *rows = malloc((size_t)(T * d) * sizeof *rows);
    if (!pos || !rows) {
        free(pos);
        free(rows);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory for embeddings");
    }
    for (int s = 0; s < n_seqs; s++)
        for (int32_t i = q_start[s]; i < q_start[s + 1]; i++) pos[i] = i - q_start[s];
    upload_i32(b, &m->ws.tokens, tokens, T);
    upload_i32(b, &m->ws.positions, pos, T);
    upload_i32(b, &m->ws.q_start, q_start, n_seqs + 1);

    struct tensor x = tensor_first_rows(&m->ws.x, T);
    static const struct forward_batch no_adapters = {0};
    struct embed_ctx ec = {
        .serve = {.m = m, .fb = &no_adapters},
        .batch = {.n_docs = n_seqs, .doc_start = tensor_first_rows(&m->ws.q_start, n_seqs + 1),
                  .scale = model_attn_scale(m), .softcap = m->cfg.attn_softcap, .bidirectional = m->cfg.encoder},
    };
    const struct layer_hooks hooks = {.ctx = &ec, .gather = serve_gather, .partial = serve_partial,
                                      .reduce = serve_reduce, .adapt = serve_adapt, .attend = embed_attend};
    const struct layer_tensors lt = serve_tensors(m, T);
    enum status st = model_embed_input(m, T, &x);
    for (int l = 0; l < m->n_layers_local && st == STATUS_OK; l++) st = layer_forward(m, l, T, &lt, &hooks, 1);
    if (st == STATUS_OK) {
        if (!m->cfg.encoder) final_norm(m, &x, &x);
        const struct tensor *src = &x;
        struct tensor x32 = m->dtype != DTYPE_F32 ? tensor_first_rows(&m->ws.x_f32, T) : x;
        if (m->dtype != DTYPE_F32) {
            op_cast(b, &x32, &x);
            src = &x32;
        }
        backend_download(b, rows, src->data, tensor_nbytes(src));
        for (int s = 0; s < n_seqs; s++)
            pool_rows(rows + (size_t)q_start[s] * (size_t)d, q_start[s + 1] - q_start[s], d, pooling, normalize,
                      out + (size_t)s * (size_t)d);
    }
    free(pos);
    free(rows);
    return st;
}
