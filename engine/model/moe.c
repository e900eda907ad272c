/* engine/model/moe.c - a mixture of experts' MLP: routing and the forward, for serving and
 * training (moe.h). Not here: the training backward and the auxiliary losses (moe_train.c).
 * Tests: the MoE goldens (tests/test_model.c), tests/test_moe.c, tests/test_train_moe.py. */
#include "moe.h"
#include "layer.h"

#include <math.h>
#include <string.h>

/* The most experts a config may declare (config.c refuses more): the bound of moe_route's buffer. */
#define MOE_MAX_EXPERTS 1024

/* DeepSeek-V3's group-limited choice over one token's choice scores cs (E, in G groups): every
 * expert outside the best `keep` groups (each scored by its two best; equal: the lower group
 * first) gets choice score 0. */
static void group_limit(double *cs, int E, int G, int keep)
{
    const int per = E / G;
    double score[MOE_MAX_EXPERTS];
    int kept[MOE_MAX_EXPERTS] = {0};
    for (int g = 0; g < G; g++) {
        double a = -INFINITY, b = -INFINITY; /* the two best of the group */
        for (int e = g * per; e < (g + 1) * per; e++)
            if (cs[e] > a) b = a, a = cs[e];
            else if (cs[e] > b) b = cs[e];
        score[g] = a + b;
    }
    for (int j = 0; j < keep; j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!kept[g] && (best < 0 || score[g] > score[best])) best = g;
        kept[best] = 1;
    }
    for (int e = 0; e < E; e++)
        if (!kept[e / per]) cs[e] = 0.0;
}

void moe_route(const float *logits, int T, int E, int k, int norm, const struct moe_scoring *sc, int *start,
               int32_t *ids, float *w)
{
    CHECK(k >= 1 && k <= 64 && k <= E && E <= MOE_MAX_EXPERTS, "moe_route: top %d of %d experts", k, E);
    /* Pass 1, token by token: p = softmax(z) (each exponential once) or sigmoid(z), its k best by
     * p (+ the selection bias), their weights p, written in place of the token's own slots t k ..
     * t k + k - 1 (ids: the expert, w: the weight) and counted per expert in start[e + 1]. */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    const int sigmoid = sc && sc->sigmoid, G = sc && sc->groups > 1 ? sc->groups : 0;
    const float *bias = sc ? sc->sel_bias : NULL;
    const double scale = sc && sc->scale > 0.0f ? (double)sc->scale : 1.0;
    CHECK(!G || (E % G == 0 && E / G >= 2 && sc->group_topk >= 1 && sc->group_topk <= G),
          "moe_route: %d experts in %d groups, top %d groups", E, G, G ? sc->group_topk : 0);
    double p[MOE_MAX_EXPERTS], cs[MOE_MAX_EXPERTS], top_p[64], top_c[64];
    int32_t top_e[64];
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * (size_t)E;
        double mx = -INFINITY, sum = 0.0;
        if (sigmoid) {
            for (int e = 0; e < E; e++) p[e] = 1.0 / (1.0 + exp(-(double)z[e]));
            sum = 1.0;
        } else {
            for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < E; e++) sum += p[e] = exp((double)z[e] - mx);
        }
        for (int e = 0; e < E; e++) p[e] /= sum, cs[e] = bias ? p[e] + (double)bias[e] : p[e];
        if (G) group_limit(cs, E, G, sc->group_topk);
        int n = 0;
        for (int e = 0; e < E; e++) { /* insertion into the k best; a tie keeps the earlier */
            const double pe = p[e], ce = cs[e];
            int pos = n;
            while (pos > 0 && ce > top_c[pos - 1]) pos--;
            if (pos >= k) continue;
            for (int j = (n < k ? n : k - 1); j > pos; j--)
                top_p[j] = top_p[j - 1], top_c[j] = top_c[j - 1], top_e[j] = top_e[j - 1];
            top_p[pos] = pe;
            top_c[pos] = ce;
            top_e[pos] = e;
            if (n < k) n++;
        }
        double s = 0.0;
        for (int j = 0; j < k; j++) s += top_p[j];
        for (int j = 0; j < k; j++) {
            const size_t slot = (size_t)t * (size_t)k + (size_t)j;
            ids[slot] = top_e[j];
            w[slot] = (float)((norm ? top_p[j] / s : top_p[j]) * scale);
            start[top_e[j] + 1]++;
        }
    }
    /* Pass 2, a counting sort by expert (tokens ascending within an expert): counts -> starts;
     * each slot's destination, encoded as -1 - dst (pending), advances start[e] to the end of
     * expert e's run; then every cycle of the permutation is followed in place, the element
     * taken from position i belonging to token i / k. */
    const int n_slots = T * k;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int i = 0; i < n_slots; i++) ids[i] = -1 - start[ids[i]]++;
    for (int i = 0; i < n_slots; i++) {
        if (ids[i] >= 0) continue; /* placed by an earlier cycle */
        int32_t tok = i / k, dst = -1 - ids[i];
        float wt = w[i];
        while (dst != i) {
            const int32_t next = ids[dst];
            const float next_w = w[dst];
            ids[dst] = tok, w[dst] = wt;
            tok = dst / k, wt = next_w, dst = -1 - next;
        }
        ids[i] = tok, w[i] = wt;
    }
    /* start[e] now holds the end of expert e's run: shift back to starts. */
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
}

/* The serving workspace as the forward's tensors: every expert's insides from row 0, overwritten
 * by the next expert; the activation in place on up. */
static struct moe_tensors workspace_tensors(struct model *m, struct moe_routing *r)
{
    struct model_workspace *ws = &m->ws;
    *r = (struct moe_routing){.logits = ws->moe_host_logits, .start = ws->moe_host_start, .ids = ws->moe_host_ids,
                              .w = ws->moe_host_w, .sw = ws->moe_host_sw};
    return (struct moe_tensors){
        .logits = ws->moe_logits, .logits32 = ws->moe_logits32, .x = ws->moe_x, .ids = ws->moe_ids, .w = ws->moe_w,
        .gate = ws->gate, .up = ws->up, .hact = ws->up, .y = ws->moe_y, .rows = ws->moe_rows, .sw = ws->moe_sw,
        .s_gate = ws->gate, .s_up = ws->up, .s_hact = ws->up, .s_y = ws->moe_y,
        .r = r,
    };
}

/* n rows of cols columns of buf from row r0 (buf's own shape aside: the serving workspace holds
 * one expert's rows of moe_ffn columns in buffers shaped for the dense MLP). */
static struct tensor rows_of(const struct tensor *buf, int64_t r0, int64_t n, int64_t cols)
{
    return tensor_make((char *)buf->data + (size_t)(r0 * cols) * dtype_size(buf->dtype), buf->dtype, buf->device, 2,
                       n, cols);
}

/* The router's logits to the host, the routing (moe_route) back to the device. */
static void route(struct model *m, int l, int64_t T, const struct tensor *xn, const struct moe_tensors *mt)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const int E = c->n_experts, k = c->n_experts_used;
    struct tensor lg = tensor_first_rows(&mt->logits, T);
    const struct tensor *rb = &m->w.layers[l].router_bias; /* GPT-OSS: before the top-k */
    op_matmul(b, &lg, xn, &m->w.layers[l].router, rb->data ? rb : NULL);
    const struct tensor *host_src = &lg;
    struct tensor lg32 = tensor_first_rows(&mt->logits32, T);
    if (lg.dtype != DTYPE_F32) {
        op_cast(b, &lg32, &lg);
        host_src = &lg32;
    }
    backend_download(b, mt->r->logits, host_src->data, (size_t)(T * E) * sizeof(float));
    float bias[MOE_MAX_EXPERTS]; /* MiniMax-M2's selection bias, f32 on the device (model_load) */
    const struct tensor *sb = &m->w.layers[l].router_sel_bias;
    if (sb->data) backend_download(b, bias, sb->data, (size_t)E * sizeof *bias);
    const struct moe_scoring sc = {c->moe_sigmoid, sb->data ? bias : NULL, c->moe_groups, c->moe_group_topk,
                                   c->moe_routed_scale};
    moe_route(mt->r->logits, (int)T, E, k, c->norm_topk_prob, &sc, mt->r->start, mt->r->ids, mt->r->w);
    const size_t n_routed = (size_t)T * (size_t)k;
    backend_upload(b, mt->ids.data, mt->r->ids, n_routed * sizeof(int32_t));
    backend_upload(b, mt->w.data, mt->r->w, n_routed * sizeof(float));
}

/* The shared expert's sigmoid gates, sigmoid(xn . g), to the host and back (Qwen 2 MoE). */
static void shared_gates(struct model *m, int l, int64_t T, const struct tensor *xn, const struct moe_tensors *mt)
{
    struct backend *b = m->b;
    if (m->cfg.shared_expert == SHARED_EXPERT_PLAIN) { /* GLM-4.5: the shared experts' output as it is */
        for (int64_t i = 0; i < T; i++) mt->r->sw[i] = 1.0f;
        backend_upload(b, mt->sw.data, mt->r->sw, (size_t)T * sizeof(float));
        return;
    }
    struct tensor sg = tensor_first_rows(&mt->logits, T), sg1 = tensor_view2(&sg, T, 1);
    struct tensor sg32 = tensor_view2(&mt->logits32, T, 1);
    op_matmul(b, &sg1, xn, &m->w.layers[l].shared_gate, NULL);
    if (sg1.dtype != DTYPE_F32) op_cast(b, &sg32, &sg1);
    backend_download(b, mt->r->sw, (sg1.dtype != DTYPE_F32 ? &sg32 : &sg1)->data, (size_t)T * sizeof(float));
    for (int64_t i = 0; i < T; i++) mt->r->sw[i] = (float)(1.0 / (1.0 + exp(-(double)mt->r->sw[i])));
    backend_upload(b, mt->sw.data, mt->r->sw, (size_t)T * sizeof(float));
}

/* Serving's load counters (model_workspace.moe_load) += the tokens layer l routed to each expert. */
static void count_load(struct model *m, int l, const struct moe_routing *r)
{
    const int E = m->cfg.n_experts;
    if (!m->ws.moe_load) return;
    _Atomic uint64_t *row = m->ws.moe_load + (size_t)l * (size_t)E;
    for (int e = 0; e < E; e++)
        atomic_fetch_add_explicit(&row[e], (uint64_t)(r->start[e + 1] - r->start[e]), memory_order_relaxed);
}

int moe_load_read(const struct model *m, uint64_t *out)
{
    if (!m->cfg.n_experts || !m->ws.moe_load) return 0;
    const size_t cells = (size_t)m->n_layers_local * (size_t)m->cfg.n_experts;
    for (size_t i = 0; i < cells; i++) out[i] = atomic_load_explicit(&m->ws.moe_load[i], memory_order_relaxed);
    return m->n_layers_local;
}

/* Rows [r0, r0 + n) of bias vector t, or NULL when the model has none. */
static const struct tensor *bias_rows(const struct tensor *t, int64_t r0, int64_t n, struct tensor *view)
{
    if (!t->data) return NULL;
    *view = tensor_rows_at(t, r0, n);
    return view;
}

void moe_expert_mlp(struct model *m, int l, int el, const struct tensor *x, const struct tensor *gate,
                    const struct tensor *up, const struct tensor *hact, const struct tensor *y)
{
    struct backend *b = m->b;
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t d = m->cfg.d_model, F = m->cfg.moe_ffn;
    struct tensor wg = tensor_rows_at(&w->exp_gate, (int64_t)el * F, F), wu = tensor_rows_at(&w->exp_up, (int64_t)el * F, F);
    struct tensor wd = tensor_rows_at(&w->exp_down, (int64_t)el * d, d), bg, bu, bd;
    op_matmul(b, gate, x, &wg, bias_rows(&w->exp_gate_bias, (int64_t)el * F, F, &bg));
    op_matmul(b, up, x, &wu, bias_rows(&w->exp_up_bias, (int64_t)el * F, F, &bu));
    op_gated_activation(b, hact, gate, up, m->cfg.activation);
    op_matmul(b, y, hact, &wd, bias_rows(&w->exp_down_bias, (int64_t)el * d, d, &bd));
}

enum status moe_forward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                        const struct moe_tensors *mt_in)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t d = c->d_model, F = c->moe_ffn;
    struct moe_routing ws_r;
    const struct moe_tensors ws_t = mt_in ? *mt_in : workspace_tensors(m, &ws_r), *mt = &ws_t;

    if (!mt->recompute) {
        route(m, l, T, xn, mt);
        if (mt_in) moe_routing_losses(c, T, mt->r);
        else count_load(m, l, mt->r);
    }

    /* This rank's experts over their rows, summed into proj in expert order (the other tp ranks'
     * experts join in the layer's tp reduction; under expert parallelism moe_ep.c dispatches the
     * rows of this rank's token slice [s0, s0 + sn) and combines them, and the slices are joined
     * at the end). */
    if (proj) backend_memset_zero(b, proj->data, tensor_nbytes(proj));
    int64_t s0 = 0, sn = T;
    if (m->ep_size > 1 && mt_in) { /* training: this rank's own tokens, no slice and no join */
        enum status st = moe_ep_train_experts(m, l, T, xn, proj, mt);
        if (st != STATUS_OK) return st;
    } else if (m->ep_size > 1) {
        CHECK(proj, "moe_forward: serving's expert parallelism computes proj");
        enum status st = moe_ep_experts(m, l, T, xn, proj, mt->r, mt);
        if (st != STATUS_OK) return st;
        s0 = T * m->ep_rank / m->ep_size, sn = T * (m->ep_rank + 1) / m->ep_size - s0;
    }
    for (int el = 0; el < m->n_experts_local && m->ep_size == 1; el++) {
        const int e = m->expert_first + el;
        const int64_t r0 = mt->r->start[e], n = mt->r->start[e + 1] - r0, at = mt->per_slot ? r0 : 0;
        if (n == 0) continue;
        struct tensor ids = tensor_rows_at(&mt->ids, r0, n), wt = tensor_rows_at(&mt->w, r0, n);
        struct tensor x = tensor_first_rows(&mt->x, n), y = rows_of(&mt->y, at, n, d);
        struct tensor gate = rows_of(&mt->gate, at, n, F), up = rows_of(&mt->up, at, n, F);
        struct tensor hact = rows_of(&mt->hact, at, n, F);
        op_embedding(b, &x, xn, &ids, 0); /* the expert's rows, gathered */
        moe_expert_mlp(m, l, el, &x, &gate, &up, &hact, &y);
        if (proj) op_scatter_add_rows(b, proj, &y, &ids, &wt);
    }
    if (c->shared_expert && sn > 0) { /* + sigmoid(x . g) * shared(x) (Qwen 2 MoE) or shared(x) (GLM), every row (of the slice) */
        if (!mt->recompute) shared_gates(m, l, T, xn, mt);
        struct tensor sw = tensor_rows_at(&mt->sw, s0, sn), rows = tensor_rows_at(&mt->rows, s0, sn);
        /* (the backward reads them through the same view: moe_train.c) */
        struct tensor gate = layer_ffn_view(&mt->s_gate, sn, w), up = layer_ffn_view(&mt->s_up, sn, w);
        struct tensor hact = layer_ffn_view(&mt->s_hact, sn, w), y = tensor_first_rows(&mt->s_y, sn);
        struct tensor xs = tensor_rows_at(xn, s0, sn);
        op_matmul(b, &gate, &xs, &w->w_gate, NULL);
        op_matmul(b, &up, &xs, &w->w_up, NULL);
        op_gated_activation(b, &hact, &gate, &up, c->activation);
        op_matmul(b, &y, &hact, &w->w_down, NULL);
        if (proj) op_scatter_add_rows(b, proj, &y, &rows, &sw);
    }
    if (m->ep_size > 1 && !mt_in) return moe_ep_join(m, proj);
    return STATUS_OK;
}
