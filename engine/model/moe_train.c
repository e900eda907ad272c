/* engine/model/moe_train.c - a mixture of experts in training (moe.h): the auxiliary losses of a
 * routing and moe_backward, the mirror of moe_forward.
 * Not here: the forward (moe.c), what the layer keeps (model_train_mem.c).
 * Tests: tests/test_train_moe.py (every gradient and the auxiliary losses against JAX). */
#include "moe.h"
#include "layer.h"

#include <math.h>

static const struct tensor *opt(const struct tensor *t) { return t && t->data ? t : NULL; }

/* Rows [r0, r0 + n) of t, or t itself (data NULL: no such gradient) when it has none. */
static struct tensor rows_or_none(const struct tensor *t, int64_t r0, int64_t n)
{
    return t->data ? tensor_rows_at(t, r0, n) : *t;
}

/* The natural log-sum-exp of token t's logits, in double (moe_route's softmax). */
static double row_lse(const float *z, int E)
{
    double mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((double)z[e] - mx);
    return mx + log(sum);
}

static double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* The sum over experts of token t's sigmoid scores (a sigmoid router's probabilities for the
 * load-balancing loss are its scores over that sum, as Megatron's). */
static double score_sum(const float *z, int E)
{
    double s = 0.0;
    for (int e = 0; e < E; e++) s += sigmoid((double)z[e]);
    return s;
}

void moe_routing_losses(const struct model_config *c, int64_t T, struct moe_routing *r)
{
    /* aux = E / (k T^2) sum_t sum_e count_e p_te (moe.h: E sum_e f_e P_e), z = mean_t lse_t^2;
     * p the softmax, or a sigmoid router's scores normalised over the experts. */
    const int E = c->n_experts, k = c->n_experts_used;
    double aux = 0.0, z = 0.0;
    for (int64_t t = 0; t < T; t++) {
        const float *zt = r->logits + (size_t)t * (size_t)E;
        const double lse = row_lse(zt, E), ss = c->moe_sigmoid ? score_sum(zt, E) : 0.0;
        for (int e = 0; e < E; e++)
            aux += (double)(r->start[e + 1] - r->start[e]) *
                   (c->moe_sigmoid ? sigmoid((double)zt[e]) / ss : exp((double)zt[e] - lse));
        z += lse * lse;
    }
    r->aux = T ? aux * E / ((double)k * (double)T * (double)T) : 0.0;
    r->z = T ? z / (double)T : 0.0;
}

void moe_update_sel_bias(struct model *m, struct model_weights *master, const int64_t *load, float rate)
{
    const int E = m->cfg.n_experts;
    float b[1024];
    CHECK(E <= 1024, "moe_update_sel_bias: %d experts", E);
    for (int l = 0; l < m->n_layers_local; l++) {
        const int64_t *row = load + (size_t)(m->layer_first + l) * (size_t)E;
        double mean = 0.0;
        for (int e = 0; e < E; e++) mean += (double)row[e] / E;
        const struct tensor *dst[2] = {&master->layers[l].router_sel_bias, &m->w.layers[l].router_sel_bias};
        backend_download(m->b, b, dst[0]->data, (size_t)E * sizeof *b);
        for (int e = 0; e < E; e++) b[e] += (mean > (double)row[e] ? 1.0f : mean < (double)row[e] ? -1.0f : 0.0f) * rate;
        for (int k = 0; k < (master != &m->w ? 2 : 1); k++) backend_upload(m->b, dst[k]->data, b, (size_t)E * sizeof *b);
    }
}

/* The gradient of the router's logits (T, E) into dz (host, f32), from dw (T * k), the gradient
 * of each slot's weight, through the (renormalised) top-k of softmax(z), plus the auxiliary
 * losses' gradients. tok: (3 T) double scratch. */
static void router_grad(const struct model_config *c, int64_t T, const struct moe_routing *r, const float *dw,
                        const struct moe_loss *loss, float *dz, double *tok)
{
    const int E = c->n_experts, k = c->n_experts_used, norm = c->norm_topk_prob, sig = c->moe_sigmoid;
    double *lse = tok, *S = tok + T, *Q = tok + 2 * T;
    for (int64_t t = 0; t < T; t++) {
        lse[t] = row_lse(r->logits + (size_t)t * (size_t)E, E);
        S[t] = Q[t] = 0.0;
    }
    /* P: the softmax probability (the z-loss's, and a softmax router's weights); W: the weights'
     * source, P or the sigmoid score. */
#define P(t, e) exp((double)r->logits[(size_t)(t) * (size_t)E + (size_t)(e)] - lse[t])
#define W(t, e) (sig ? sigmoid((double)r->logits[(size_t)(t) * (size_t)E + (size_t)(e)]) : P(t, e))
    /* w_j = p_j / S with S the sum of the chosen p (norm), else p_j:
     * dL/dp_i = (dw_i - sum_j dw_j w_j) / S for the chosen i (norm), else dw_i. */
    /* routed_scaling_factor: w = scale x (the weights above), so dL/d(those) = scale dw. */
    const double sf = c->moe_routed_scale > 0.0f ? (double)c->moe_routed_scale : 1.0;
    for (int e = 0; e < E; e++)
        for (int s = r->start[e]; s < r->start[e + 1]; s++) {
            const int64_t t = r->ids[s];
            const double p = W(t, e);
            S[t] += p;
            Q[t] += sf * dw[s] * p;
        }
    /* aux: d/dp_te of a E / (k T^2) sum count_e p_te; z: d/dz_te of b mean lse^2 = 2 b lse_t p_te / T. */
    const double a = T ? (double)loss->scale * loss->aux_coeff * E / ((double)k * (double)T * (double)T) : 0.0;
    const double b = T ? (double)loss->scale * loss->z_coeff * 2.0 / (double)T : 0.0;
    for (int64_t t = 0; t < T; t++) {
        /* A sigmoid router's aux is over q_e = s_e / sum s: d/ds_j = a (count_j - sum_e count_e q_e) / sum s. */
        double ss = 0.0, cq = 0.0;
        for (int e = 0; sig && e < E; e++) {
            const double se = W(t, e);
            ss += se;
            cq += (double)(r->start[e + 1] - r->start[e]) * se;
        }
        for (int e = 0; e < E; e++)
            dz[(size_t)t * E + e] = (float)(sig ? a * ((double)(r->start[e + 1] - r->start[e]) - cq / ss) / ss
                                                : a * (r->start[e + 1] - r->start[e]));
    }
    for (int e = 0; e < E; e++)
        for (int s = r->start[e]; s < r->start[e + 1]; s++) {
            const int64_t t = r->ids[s];
            dz[(size_t)t * E + e] += (float)(norm ? (sf * dw[s] - Q[t] / S[t]) / S[t] : sf * dw[s]);
        }
    /* Through the softmax: dz_e = p_e (dp_e - sum_j p_j dp_j), or the sigmoid: dz_e = dp_e s_e (1 -
     * s_e), in place, plus the z-loss (on the logits' softmax either way). */
    for (int64_t t = 0; t < T; t++) {
        float *row = dz + (size_t)t * E;
        double dot = 0.0;
        for (int e = 0; !sig && e < E; e++) dot += P(t, e) * row[e];
        for (int e = 0; e < E; e++) {
            const double p = P(t, e), s = sig ? W(t, e) : 0.0;
            row[e] = (float)((sig ? row[e] * s * (1.0 - s) : p * (row[e] - dot)) + b * lse[t] * p);
        }
    }
#undef W
#undef P
}

/* dxn += dlogits (T, cols, host f32) @ w, gw += dlogits^T xn and gbias += the sum of dlogits'
 * rows (gbias NULL-data: none): the backward of a product whose output the host formed (the
 * router, with GPT-OSS's bias; the shared expert's gate). Those weights are replicated over tp
 * and their gradients formed whole on every rank; dxn is summed over tp after the layer, so only
 * tp rank 0 adds its part there. */
static void host_product_backward(struct model *m, int64_t T, int64_t cols, const float *host, const struct tensor *xn,
                                  const struct tensor *w, const struct tensor *gw, const struct tensor *gbias,
                                  const struct tensor *dxn, const struct moe_grad_scratch *s)
{
    struct backend *b = m->b;
    struct tensor d32 = tensor_view2(&s->dlogits, T, cols), dd = d32;
    backend_upload(b, d32.data, host, (size_t)(T * cols) * sizeof(float));
    if (m->dtype != DTYPE_F32) {
        dd = tensor_view2(&s->dlogits_dt, T, cols);
        op_cast(b, &dd, &d32);
    }
    op_matmul_backward(b, m->tp_rank == 0 ? dxn : NULL, opt(gw), opt(gbias), &dd, xn, w, 1);
}

void moe_expert_backward(struct model *m, int l, int el, const struct tensor *x, const struct tensor *gate,
                         const struct tensor *up, const struct tensor *hact, const struct tensor *dy,
                         const struct tensor *dx, const struct moe_grad_scratch *s, const struct layer_weights *g)
{
    struct backend *b = m->b;
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t d = m->cfg.d_model, F = m->cfg.moe_ffn, n = dy->shape[0];
    struct tensor dgate = tensor_make(s->dgate.data, m->dtype, b->device, 2, n, F);
    struct tensor dup = tensor_make(s->dup.data, m->dtype, b->device, 2, n, F);
    struct tensor wg = tensor_rows_at(&w->exp_gate, el * F, F), wu = tensor_rows_at(&w->exp_up, el * F, F);
    struct tensor wd = tensor_rows_at(&w->exp_down, el * d, d);
    struct tensor gg = rows_or_none(&g->exp_gate, el * F, F), gu = rows_or_none(&g->exp_up, el * F, F);
    struct tensor gd = rows_or_none(&g->exp_down, el * d, d);
    struct tensor gbg = rows_or_none(&g->exp_gate_bias, el * F, F), gbu = rows_or_none(&g->exp_up_bias, el * F, F);
    struct tensor gbd = rows_or_none(&g->exp_down_bias, el * d, d); /* GPT-OSS's biases */
    op_matmul_backward(b, &dup, opt(&gd), opt(&gbd), dy, hact, &wd, 0); /* dh, into dup */
    op_gated_activation_backward(b, &dgate, &dup, &dup, gate, up, m->cfg.activation);
    op_matmul_backward(b, dx, opt(&gg), opt(&gbg), &dgate, x, &wg, 0);
    op_matmul_backward(b, dx, opt(&gu), opt(&gbu), &dup, x, &wu, 1);
}

enum status moe_backward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *dproj,
                  const struct tensor *dxn, const struct moe_tensors *mt, const struct moe_grad_scratch *s,
                  const struct layer_weights *g, const struct moe_loss *loss)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    const int64_t E = c->n_experts, k = c->n_experts_used;
    struct moe_routing *r = mt->r;
    backend_memset_zero(b, dxn->data, tensor_nbytes(dxn));
    /* The slots' weight gradients (T k) and the shared expert's gates' (T): at tp > 1 each rank
     * fills its own experts' slots and its part of the shared expert's, summed over tp below. */
    struct tensor dw_all = tensor_first_rows(&s->dw, T * k), dw_sum = tensor_first_rows(&s->dw, T * (k + 1));
    backend_memset_zero(b, dw_sum.data, tensor_nbytes(&dw_sum));

    /* Each of this rank's experts (el; global index e), in reverse: dy_i = w_i dproj[ids_i] and
     * dw_i = dproj[ids_i] . y_i; then the expert's gated MLP; its input's gradient added into its
     * rows of dxn (a part of the sum over tp). Under expert parallelism the experts' rows come
     * from the whole ep group (moe_ep.c). */
    if (m->ep_size > 1) {
        enum status st = moe_ep_train_backward(m, l, T, dproj, dxn, mt, s, g, &dw_all);
        if (st != STATUS_OK) return st;
    }
    for (int el = 0; el < m->n_experts_local && m->ep_size == 1; el++) {
        const int e = m->expert_first + el;
        const int64_t r0 = r->start[e], n = r->start[e + 1] - r0;
        if (n == 0) continue;
        struct tensor ids = tensor_rows_at(&mt->ids, r0, n), wt = tensor_rows_at(&mt->w, r0, n);
        struct tensor y = tensor_rows_at(&mt->y, r0, n), gate = tensor_rows_at(&mt->gate, r0, n);
        struct tensor up = tensor_rows_at(&mt->up, r0, n), hact = tensor_rows_at(&mt->hact, r0, n);
        struct tensor x = tensor_first_rows(&mt->x, n), dy = tensor_first_rows(&s->dy, n);
        struct tensor dx = tensor_first_rows(&s->dx, n), dwt = tensor_rows_at(&dw_all, r0, n);
        op_scatter_add_rows_backward(b, &dy, &dwt, dproj, &y, &ids, &wt);
        op_embedding(b, &x, xn, &ids, 0); /* the expert's rows again */
        moe_expert_backward(m, l, el, &x, &gate, &up, &hact, &dy, &dx, s, g);
        op_embedding_backward(b, dxn, &dx, &ids, 0);
    }

    /* The shared expert: proj += sw * y_s; sw = sigmoid(xn . g) (Qwen 2 MoE) or 1 (GLM-4.5). */
    float *host_dz = s->host_dz;
    if (c->shared_expert) {
        const int64_t S = w->w_up.shape[0];
        struct tensor rows = tensor_first_rows(&mt->rows, T), sw = tensor_first_rows(&mt->sw, T);
        struct tensor y = tensor_first_rows(&mt->s_y, T), dy = tensor_first_rows(&s->dy, T);
        /* the shared expert's insides as the forward wrote them: (T, S) from the buffers' start */
        struct tensor gate = layer_ffn_view(&mt->s_gate, T, w), up = layer_ffn_view(&mt->s_up, T, w);
        struct tensor hact = layer_ffn_view(&mt->s_hact, T, w);
        struct tensor dgate = tensor_make(s->dgate.data, m->dtype, b->device, 2, T, S);
        struct tensor dup = tensor_make(s->dup.data, m->dtype, b->device, 2, T, S);
        struct tensor dsw = tensor_rows_at(&s->dw, T * k, T);
        op_scatter_add_rows_backward(b, &dy, &dsw, dproj, &y, &rows, &sw);
        op_matmul_backward(b, &dup, opt(&g->w_down), NULL, &dy, &hact, &w->w_down, 0);
        op_gated_activation_backward(b, &dgate, &dup, &dup, &gate, &up, c->activation);
        op_matmul_backward(b, dxn, opt(&g->w_gate), NULL, &dgate, xn, &w->w_gate, 1);
        op_matmul_backward(b, dxn, opt(&g->w_up), NULL, &dup, xn, &w->w_up, 1);
    }
    if (m->tp_size > 1) { /* every rank's slots and shared-expert parts, summed */
        enum status st = comm_all_reduce(m->par.groups->tp, &dw_sum);
        if (st != STATUS_OK) return st;
    }
    if (c->shared_expert == SHARED_EXPERT_GATED) { /* GLM-4.5's plain shared experts have no gate */
        struct tensor dsw = tensor_rows_at(&s->dw, T * k, T);
        backend_download(b, host_dz, dsw.data, (size_t)T * sizeof(float));
        for (int64_t t = 0; t < T; t++) host_dz[t] *= r->sw[t] * (1.0f - r->sw[t]); /* sigmoid' */
        host_product_backward(m, T, 1, host_dz, xn, &w->shared_gate, &g->shared_gate, NULL, dxn, s);
    }

    /* The router: the slots' weight gradients to the host, through the top-k and the softmax
     * (with the auxiliary losses), and back as the logits' gradient. */
    float *host_dw = s->host_dw;
    backend_download(b, host_dw, dw_all.data, (size_t)(T * k) * sizeof(float));
    router_grad(c, T, r, host_dw, loss, host_dz, s->host_tok);
    host_product_backward(m, T, E, host_dz, xn, &w->router, &g->router, &g->router_bias, dxn, s);
    return STATUS_OK;
}
