/* engine/model/moe_ep.c - expert parallelism in serving (--ep N, moe.h moe_ep_experts): the
 * experts of every MoE layer split over the ep group (rank q holds the contiguous block
 * [q E/N, (q+1) E/N)), the tokens dispatched to the ranks that own their experts and combined
 * back with two all-to-alls (comm_all_to_all_rows: MPI_Alltoallv on CPU ranks, grouped NCCL
 * send / receive on GPUs, the latter compiled only).
 *
 * Attention is replicated over the ep group: every ep rank runs the same step plan over every
 * token (the layout's tp slot carries the ep group, and the model is loaded at tp 1), so every
 * rank holds the normed input xn of every token and routes every token with the replicated
 * router (routing is cheap next to the experts, and this keeps the per-expert load counters of
 * /metrics exact on every rank). Each rank is responsible for a contiguous slice of the tokens,
 * rank q for [q T/N, (q+1) T/N), as a data-parallel attention would hand it; it sends the rows
 * of its slice to the experts' owners, gets their outputs back, combines them, and the slices
 * are joined by an all-reduce of the zero-padded output (exact: each row has one nonzero
 * contributor). The dispatched rows are the ones the experts compute on (never the owner's own
 * copy of xn), so the data path is the one a data-parallel attention would use.
 *
 * Order, and why the result is bit-identical to one rank:
 *  - dispatch: rank s sends to owner q, for q's experts e ascending, the rows of its slice routed
 *    to e, tokens ascending; q receives s = 0, 1, ... in order.
 *  - expert e on its owner gathers its rows from the received ones source by source: as the
 *    slices are contiguous and ascending, that is every token routed to e, ascending: the very
 *    block one rank runs e over (same rows, same order, same matmuls).
 *  - combine: the owner sends back to s, for its experts ascending, the outputs of s's rows;
 *    s receives owners in order, i.e. the outputs in global expert order, and adds them into
 *    its rows one expert at a time with op_scatter_add_rows, weighted, exactly as one rank does
 *    (each row: 0, + w_e1 y_e1, + w_e2 y_e2 ... in expert order, then the shared expert).
 *  - join: an all-reduce adds zeros to each row's one value (x + 0 = x in f32; bf16 is widened,
 *    summed and rounded once, also exact).
 * Traffic per token and MoE layer (dispatch + combine): 2 k d s bytes times the fraction of its k
 * experts held by other ranks ((N - 1) / N for a uniform routing); the join adds d s (N - 1) / N
 * per token in a ring. Counted in m->ep_stats and logged by moe_ep_log.
 * Not here: ep with tp > 1 (refused by the CLIs), training (refused: the trainer takes no --ep).
 * Tests: tests/test_moe_ep.sh (generate and serve at ep 2 and ep 2 x pp 2 against one rank,
 * and the refusals). Notes: docs/parallel.md, docs/models.md. */
#include "moe.h"

#include <string.h>

enum status moe_ep_check(const struct model_config *c, int ep_size)
{
    if (!c->n_experts)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--ep %d: %s is a dense model (0 experts); expert parallelism "
                             "needs a mixture of experts", ep_size, c->architecture);
    if (c->n_experts % ep_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--ep %d does not divide the %d experts of %s (each ep rank holds "
                             "n_experts / ep whole experts)", ep_size, c->n_experts, c->architecture);
    return STATUS_OK;
}

/* The first token of rank q's slice of T tokens over N ranks (q = N: T). */
static int64_t slice_start(int64_t T, int N, int q) { return T * q / N; }

/* The ep rank whose slice holds token t. */
static int slice_of(int64_t T, int N, int64_t t)
{
    int q = 0;
    while (t >= slice_start(T, N, q + 1)) q++;
    return q;
}

enum status moe_ep_experts(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                           const struct moe_routing *r, const struct moe_tensors *mt)
{
    struct backend *b = m->b;
    struct model_workspace *ws = &m->ws;
    const struct model_config *c = &m->cfg;
    struct comm *ep = m->par.groups->tp;
    const int N = m->ep_size, me = m->ep_rank, E = c->n_experts, El = m->n_experts_local;
    const int64_t F = c->moe_ffn, TK = T * c->n_experts_used;
    const int64_t lo = slice_start(T, N, me), hi = slice_start(T, N, me + 1);
    int64_t *n = ws->ep_host_count; /* n[s E + e]: slots of expert e whose token is in s's slice */
    int64_t send[64], recv[64];     /* rows per peer; the CLIs keep N <= 64 */
    CHECK(N <= 64 && mt->per_slot == 0, "moe_ep: ep %d (at most 64), serving only", N);
    memset(n, 0, (size_t)N * (size_t)E * sizeof *n);
    for (int e = 0; e < E; e++)
        for (int i = r->start[e]; i < r->start[e + 1]; i++) n[(size_t)slice_of(T, N, r->ids[i]) * (size_t)E + (size_t)e]++;

    /* Dispatch: to each owner q, its experts ascending, the tokens of this slice routed to them.
     * The list (token ids in global expert order) and their weights stay for the combine. */
    int32_t *tok = ws->ep_host_idx, *pos = tok + TK, *back = pos + TK;
    float *wsel = (float *)(back + TK); /* the weights of tok's slots (model_reserve: 4 TK entries) */
    const uint64_t bytes0 = ep->n_bytes;
    const double t0 = base_now_s(), comm0 = ep->seconds;
    int64_t ns = 0;
    for (int q = 0; q < N; q++) {
        send[q] = 0;
        for (int e = q * El; e < (q + 1) * El; e++)
            for (int i = r->start[e]; i < r->start[e + 1]; i++)
                if (r->ids[i] >= lo && r->ids[i] < hi) wsel[ns] = r->w[i], tok[ns++] = r->ids[i], send[q]++;
        recv[q] = 0;
        for (int e = me * El; e < (me + 1) * El; e++) recv[q] += n[(size_t)q * (size_t)E + (size_t)e];
    }
    struct tensor idx_tok = tensor_rows_at(&ws->ep_idx, 0, TK), idx_pos = tensor_rows_at(&ws->ep_idx, TK, TK);
    struct tensor idx_back = tensor_rows_at(&ws->ep_idx, 2 * TK, TK);
    backend_upload(b, idx_tok.data, tok, (size_t)ns * sizeof *tok);
    struct tensor sx = tensor_first_rows(&ws->ep_send, ns ? ns : 1), ids_tok = tensor_first_rows(&idx_tok, ns ? ns : 1);
    if (ns) op_embedding(b, &sx, xn, &ids_tok, 0);
    enum status st = comm_all_to_all_rows(ep, &ws->ep_send, send, &ws->ep_recv, recv);
    if (st != STATUS_OK) return st;

    /* Each of this rank's experts over its rows, gathered source by source from the received
     * block ((s, e) runs in s-major order): every token routed to e, ascending. */
    int64_t nr = 0, off_s[64];
    for (int s = 0; s < N; s++) off_s[s] = nr, nr += recv[s];
    int64_t ny = 0;
    for (int el = 0; el < El; el++) {
        const int e = me * El + el;
        const int64_t ne = r->start[e + 1] - r->start[e];
        if (ne == 0) continue;
        int64_t k = 0;
        for (int s = 0; s < N; s++) {
            int64_t at = off_s[s];
            for (int e2 = me * El; e2 < e; e2++) at += n[(size_t)s * (size_t)E + (size_t)e2];
            for (int64_t j = 0; j < n[(size_t)s * (size_t)E + (size_t)e]; j++) pos[ny + k++] = (int32_t)(at + j);
        }
        struct tensor ids = tensor_rows_at(&idx_pos, ny, ne);
        backend_upload(b, ids.data, pos + ny, (size_t)ne * sizeof *pos);
        struct tensor x = tensor_first_rows(&mt->x, ne), y = tensor_rows_at(&ws->ep_y, ny, ne);
        /* gate and up: ne rows of F features from the start of buffers shaped for the dense MLP */
        struct tensor gate = tensor_make(mt->gate.data, mt->gate.dtype, mt->gate.device, 2, ne, F);
        struct tensor up = tensor_make(mt->up.data, mt->up.dtype, mt->up.device, 2, ne, F);
        op_embedding(b, &x, &ws->ep_recv, &ids, 0);
        moe_expert_mlp(m, l, el, &x, &gate, &up, &up, &y);
        ny += ne;
    }

    /* Combine: back to each source s, this rank's experts ascending, the outputs of s's rows. */
    int64_t nb = 0;
    for (int s = 0; s < N; s++) {
        int64_t ye = 0; /* expert e's first output row */
        for (int el = 0; el < El; el++) {
            const int e = me * El + el;
            int64_t at = ye;
            for (int s2 = 0; s2 < s; s2++) at += n[(size_t)s2 * (size_t)E + (size_t)e];
            for (int64_t j = 0; j < n[(size_t)s * (size_t)E + (size_t)e]; j++) back[nb++] = (int32_t)(at + j);
            ye += r->start[e + 1] - r->start[e];
        }
    }
    if (nb) {
        backend_upload(b, idx_back.data, back, (size_t)nb * sizeof *back);
        struct tensor sy = tensor_first_rows(&ws->ep_send, nb), ids = tensor_first_rows(&idx_back, nb);
        op_embedding(b, &sy, &ws->ep_y, &ids, 0);
    }
    if ((st = comm_all_to_all_rows(ep, &ws->ep_send, recv, &ws->ep_recv, send)) != STATUS_OK) return st;

    /* The outputs arrive in global expert order (tok's order): added into this slice's rows expert
     * by expert (a token appears once per expert), with the slots' weights in the same order. */
    if (ns) backend_upload(b, mt->w.data, wsel, (size_t)ns * sizeof *wsel);
    int64_t at = 0;
    for (int e = 0; e < E; e++) {
        const int64_t ne = n[(size_t)me * (size_t)E + (size_t)e];
        if (ne == 0) continue;
        struct tensor y = tensor_rows_at(&ws->ep_recv, at, ne), ids = tensor_rows_at(&idx_tok, at, ne);
        struct tensor we = tensor_rows_at(&mt->w, at, ne);
        op_scatter_add_rows(b, proj, &y, &ids, &we);
        at += ne;
    }

    m->ep_stats.a2a_bytes += ep->n_bytes - bytes0;
    m->ep_stats.a2a_seconds += ep->seconds - comm0;
    m->ep_stats.rest_seconds += base_now_s() - t0 - (ep->seconds - comm0);
    m->ep_stats.a2a_rows += (uint64_t)(ns - send[me]) + (uint64_t)(nb - recv[me]);
    m->ep_stats.remote_slots += (uint64_t)(ns - send[me]);
    m->ep_stats.token_layers += (uint64_t)(hi - lo);
    m->ep_stats.all_token_layers += (uint64_t)T;
    return STATUS_OK;
}

enum status moe_ep_join(struct model *m, const struct tensor *proj)
{
    struct comm *ep = m->par.groups->tp;
    const uint64_t before = ep->n_bytes;
    const double t0 = ep->seconds;
    enum status st = comm_all_reduce(ep, proj);
    m->ep_stats.join_bytes += ep->n_bytes - before;
    m->ep_stats.join_seconds += ep->seconds - t0;
    return st;
}

void moe_ep_log(const struct model *m)
{
    const struct moe_ep_stats *s = &m->ep_stats;
    if (m->ep_size <= 1 || !s->token_layers) return;
    const struct model_config *c = &m->cfg;
    const double es = (double)dtype_size(m->dtype), N = m->ep_size, row = (double)c->d_model * es;
    const double f = (double)s->remote_slots / (double)s->token_layers; /* remote slots per token */
    LOG_INFO("moe_ep", "ep rank %d/%d: all-to-alls sent %llu bytes to other ranks (the routing's %llu rows x d_model %d "
             "x %g bytes = %.0f expected); its %llu token-layers had %.3f of their k %d slots on other ranks: "
             "2 x %.3f x %.0f = %.1f bytes per token per MoE layer dispatched and combined (uniform routing, "
             "2 k d s (N-1)/N: %.1f); the join all-reduce %.1f bytes per token per layer; time: all-to-alls %.4f s, "
             "the experts with their gathers and bookkeeping %.4f s, join %.4f s (host clock: on a GPU only the queueing)",
             m->ep_rank, m->ep_size, (unsigned long long)s->a2a_bytes, (unsigned long long)s->a2a_rows, c->d_model, es,
             (double)s->a2a_rows * row, (unsigned long long)s->token_layers, f, c->n_experts_used, f, row,
             2.0 * f * row, 2.0 * c->n_experts_used * row * (N - 1.0) / N,
             (double)s->join_bytes / (double)s->all_token_layers, s->a2a_seconds, s->rest_seconds, s->join_seconds);
}
