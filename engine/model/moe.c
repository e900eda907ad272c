/* engine/model/moe.c - a mixture of experts' MLP, serving forward (moe.h).
 * Tests: the MoE goldens (tests/test_model.c), tests/test_moe.c. */
#include "moe.h"

#include <math.h>
#include <string.h>

void moe_route(const float *logits, int T, int E, int k, int norm, int *start, int32_t *ids, float *w)
{
    /* Pass 1: each token's experts and weights (top: k expert indices, best first). Pass 2:
     * counting sort by expert, tokens ascending within an expert. */
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    int32_t top_e[64];
    double top_p[64];
    CHECK(k >= 1 && k <= 64 && k <= E, "moe_route: top %d of %d experts", k, E);
    for (int pass = 0; pass < 2; pass++) {
        int *fill = start; /* pass 2: the next free slot of each expert (start shifted below) */
        for (int t = 0; t < T; t++) {
            const float *z = logits + (size_t)t * (size_t)E;
            double mx = -INFINITY, sum = 0.0;
            for (int e = 0; e < E; e++) mx = z[e] > mx ? z[e] : mx;
            for (int e = 0; e < E; e++) sum += exp((double)z[e] - mx);
            int n = 0;
            for (int e = 0; e < E; e++) { /* insertion into the k best; a tie keeps the earlier */
                const double p = exp((double)z[e] - mx) / sum;
                int pos = n;
                while (pos > 0 && p > top_p[pos - 1]) pos--;
                if (pos >= k) continue;
                for (int j = (n < k ? n : k - 1); j > pos; j--) top_p[j] = top_p[j - 1], top_e[j] = top_e[j - 1];
                top_p[pos] = p;
                top_e[pos] = e;
                if (n < k) n++;
            }
            double s = 0.0;
            for (int j = 0; j < k; j++) s += top_p[j];
            for (int j = 0; j < k; j++) {
                if (pass == 0) {
                    start[top_e[j] + 1]++;
                    continue;
                }
                const int slot = fill[top_e[j]]++;
                ids[slot] = t;
                w[slot] = (float)(norm ? top_p[j] / s : top_p[j]);
            }
        }
        if (pass == 0) /* counts -> starts; pass 2 advances start[e] to the end of expert e's run */
            for (int e = 0; e < E; e++) start[e + 1] += start[e];
    }
    /* start[e] now holds the end of expert e's run: shift back to starts. */
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
}

enum status moe_forward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct layer_weights *w = &m->w.layers[l];
    const int E = c->n_experts, k = c->n_experts_used;
    const int64_t d = c->d_model, F = c->moe_ffn;
    struct model_workspace *ws = &m->ws;

    /* The router's logits, to the host. */
    struct tensor lg = tensor_first_rows(&ws->moe_logits, T);
    op_matmul(b, &lg, xn, &w->router, NULL);
    const struct tensor *host_src = &lg;
    struct tensor lg32 = tensor_first_rows(&ws->moe_logits32, T);
    if (lg.dtype != DTYPE_F32) {
        op_cast(b, &lg32, &lg);
        host_src = &lg32;
    }
    backend_download(b, ws->moe_host_logits, host_src->data, (size_t)(T * E) * sizeof(float));
    moe_route(ws->moe_host_logits, (int)T, E, k, c->norm_topk_prob, ws->moe_host_start, ws->moe_host_ids,
              ws->moe_host_w);
    const size_t n_routed = (size_t)T * (size_t)k;
    backend_upload(b, ws->moe_ids.data, ws->moe_host_ids, n_routed * sizeof(int32_t));
    backend_upload(b, ws->moe_w.data, ws->moe_host_w, n_routed * sizeof(float));

    /* This rank's experts over their rows, summed into proj in expert order (the other tp ranks'
     * experts join in the layer's tp reduction). */
    backend_memset_zero(b, proj->data, tensor_nbytes(proj));
    for (int el = 0; el < m->n_experts_local; el++) {
        const int e = m->expert_first + el;
        const int64_t r0 = ws->moe_host_start[e], n = ws->moe_host_start[e + 1] - r0;
        if (n == 0) continue;
        struct tensor ids = tensor_rows_at(&ws->moe_ids, r0, n), wt = tensor_rows_at(&ws->moe_w, r0, n);
        struct tensor x = tensor_first_rows(&ws->moe_x, n), y = tensor_first_rows(&ws->moe_y, n);
        struct tensor gate = tensor_make(ws->gate.data, m->dtype, b->device, 2, n, F);
        struct tensor up = tensor_make(ws->up.data, m->dtype, b->device, 2, n, F);
        struct tensor wg = tensor_rows_at(&w->exp_gate, (int64_t)el * F, F), wu = tensor_rows_at(&w->exp_up, (int64_t)el * F, F);
        struct tensor wd = tensor_rows_at(&w->exp_down, (int64_t)el * d, d);
        op_embedding(b, &x, xn, &ids, 0); /* the expert's rows, gathered */
        op_matmul(b, &gate, &x, &wg, NULL);
        op_matmul(b, &up, &x, &wu, NULL);
        op_gated_activation(b, &up, &gate, &up, c->activation);
        op_matmul(b, &y, &up, &wd, NULL);
        op_scatter_add_rows(b, proj, &y, &ids, &wt);
    }
    if (c->shared_expert) { /* Qwen 2 MoE: + sigmoid(x . g) * shared(x), every row */
        struct tensor sg = tensor_first_rows(&ws->moe_logits, T), sg1 = tensor_view2(&sg, T, 1);
        struct tensor sg32 = tensor_view2(&ws->moe_logits32, T, 1);
        op_matmul(b, &sg1, xn, &w->shared_gate, NULL);
        if (sg1.dtype != DTYPE_F32) op_cast(b, &sg32, &sg1);
        backend_download(b, ws->moe_host_sw, (sg1.dtype != DTYPE_F32 ? &sg32 : &sg1)->data, (size_t)T * sizeof(float));
        for (int64_t i = 0; i < T; i++) ws->moe_host_sw[i] = (float)(1.0 / (1.0 + exp(-(double)ws->moe_host_sw[i])));
        struct tensor sw = tensor_first_rows(&ws->moe_sw, T), rows = tensor_first_rows(&ws->moe_rows, T);
        backend_upload(b, sw.data, ws->moe_host_sw, (size_t)T * sizeof(float));
        const int64_t S = m->ffn_local;
        struct tensor gate = tensor_make(ws->gate.data, m->dtype, b->device, 2, T, S);
        struct tensor up = tensor_make(ws->up.data, m->dtype, b->device, 2, T, S);
        struct tensor y = tensor_first_rows(&ws->moe_y, T);
        op_matmul(b, &gate, xn, &w->w_gate, NULL);
        op_matmul(b, &up, xn, &w->w_up, NULL);
        op_gated_activation(b, &up, &gate, &up, c->activation);
        op_matmul(b, &y, &up, &w->w_down, NULL);
        op_scatter_add_rows(b, proj, &y, &rows, &sw);
    }
    return STATUS_OK;
}
