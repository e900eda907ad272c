/* engine/model/moe_ep.c - expert parallelism (--ep N; serving: moe.h moe_ep_experts): the
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
 * Training's expert parallelism (ep groups carved out of dp, every rank its own tokens) is the
 * second half of this file (moe_ep_train_experts, moe_ep_train_backward).
 * Not here: ep with tp > 1 (refused by the CLIs and the trainer).
 * Tests: tests/test_moe_ep.sh (generate and serve at ep 2 and ep 2 x pp 2 against one rank,
 * and the refusals), tests/test_train_moe_parallel.sh (training at ep against one rank). Notes:
 * docs/parallel.md, docs/models.md. */
#include "moe.h"

#include <stdio.h>
#include <string.h>

enum status moe_ep_check(const struct model_config *c, int ep_size, int tp_size)
{
    char ranks[64]; /* the flags as the user gave them */
    if (tp_size > 1) snprintf(ranks, sizeof ranks, "--ep %d x --tp %d (%d ranks)", ep_size / tp_size, tp_size, ep_size);
    else snprintf(ranks, sizeof ranks, "--ep %d", ep_size);
    if (!c->n_experts)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: %s is a dense model (0 experts); expert parallelism "
                             "needs a mixture of experts", ranks, c->architecture);
    if (c->n_experts % ep_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s does not divide the %d experts of %s (each rank of the ep "
                             "group holds n_experts / %d whole experts)", ranks, c->n_experts, c->architecture, ep_size);
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

/* The routed slots' counts of an ep group: n[s E + e] slots of expert e whose token is ep rank s's
 * (serving: in s's slice; training: in s's micro-batch), this rank me holding experts
 * [first, first + El) (first = me El, or in training at tp > 1 the tp rank's block of experts
 * before it: ep_base). */
struct ep_counts {
    const int64_t *n;
    int N, E, El, me, first;
};

/* The first expert of this rank's ep group: the group holds [base, base + N El) (0 but in training
 * at tp > 1, where each tp rank's experts are split over its own ep group). */
static int ep_base(const struct model *m) { return m->expert_first - m->ep_rank * m->n_experts_local; }

static int64_t ep_n(const struct ep_counts *k, int s, int e) { return k->n[(size_t)s * (size_t)k->E + (size_t)e]; }

/* The rows this rank receives from each source s (its slots of this rank's experts), and where
 * each source's block starts in the received rows (off). Returns the total. */
static int64_t ep_recv_counts(const struct ep_counts *k, int64_t *recv, int64_t *off)
{
    int64_t total = 0;
    for (int s = 0; s < k->N; s++) {
        recv[s] = 0;
        for (int e = k->first; e < k->first + k->El; e++) recv[s] += ep_n(k, s, e);
        off[s] = total;
        total += recv[s];
    }
    return total;
}

/* The received rows of local expert el, source by source ((s, e) runs in s-major order, each
 * source's runs in expert order from off[s]): into pos, which it returns the count of. As the
 * sources' tokens are contiguous and ascending, that is every token routed to e, ascending. */
static int64_t ep_expert_rows(const struct ep_counts *k, const int64_t *off, int el, int32_t *pos)
{
    const int e = k->first + el;
    int64_t ne = 0;
    for (int s = 0; s < k->N; s++) {
        int64_t at = off[s];
        for (int e2 = k->first; e2 < e; e2++) at += ep_n(k, s, e2);
        for (int64_t j = 0; j < ep_n(k, s, e); j++) pos[ne++] = (int32_t)(at + j);
    }
    return ne;
}

/* The rows of local expert el over the group: sum over sources of their slots of it. */
static int64_t ep_expert_total(const struct ep_counts *k, int el)
{
    int64_t ne = 0;
    for (int s = 0; s < k->N; s++) ne += ep_n(k, s, k->first + el);
    return ne;
}

/* The combine's order: back to each source s, this rank's experts ascending, the outputs of s's
 * rows, as indices into the experts' outputs laid out expert by expert (each expert's rows
 * source by source, as ep_expert_rows gathered them). Returns the count. */
static int64_t ep_back_rows(const struct ep_counts *k, int32_t *back)
{
    int64_t nb = 0;
    for (int s = 0; s < k->N; s++) {
        int64_t ye = 0; /* expert e's first output row */
        for (int el = 0; el < k->El; el++) {
            const int e = k->first + el;
            int64_t at = ye;
            for (int s2 = 0; s2 < s; s2++) at += ep_n(k, s2, e);
            for (int64_t j = 0; j < ep_n(k, s, e); j++) back[nb++] = (int32_t)(at + j);
            ye += ep_expert_total(k, el);
        }
    }
    return nb;
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
    }
    const struct ep_counts kc = {n, N, E, El, me, m->expert_first};
    int64_t off_s[64];
    ep_recv_counts(&kc, recv, off_s);
    struct tensor idx_tok = tensor_rows_at(&ws->ep_idx, 0, TK), idx_pos = tensor_rows_at(&ws->ep_idx, TK, TK);
    struct tensor idx_back = tensor_rows_at(&ws->ep_idx, 2 * TK, TK);
    backend_upload(b, idx_tok.data, tok, (size_t)ns * sizeof *tok);
    struct tensor sx = tensor_first_rows(&ws->ep_send, ns ? ns : 1), ids_tok = tensor_first_rows(&idx_tok, ns ? ns : 1);
    if (ns) op_embedding(b, &sx, xn, &ids_tok, 0);
    enum status st = comm_all_to_all_rows(ep, &ws->ep_send, send, &ws->ep_recv, recv);
    if (st != STATUS_OK) return st;

    /* Each of this rank's experts over its rows, gathered source by source from the received
     * block ((s, e) runs in s-major order): every token routed to e, ascending. */
    int64_t ny = 0;
    for (int el = 0; el < El; el++) {
        const int64_t ne = ep_expert_rows(&kc, off_s, el, pos + ny);
        if (ne == 0) continue;
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
    const int64_t nb = ep_back_rows(&kc, back);
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
    if (m->ep_size <= 1 || !s->token_layers || m->par.groups->ep) return; /* training's: moe_ep_train_log */
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

/* ---- expert parallelism in training ----------------------------------------------------------
 * The ep group is carved out of data parallelism (Megatron's layout: parallel_groups_add_ep), so
 * every ep rank holds its own micro-batch and keeps its own tokens: there is no slice and no join.
 * Forward: every rank routes its T tokens; an all-gather of the per-expert counts tells each
 * rank what every other will send it (ep_n, kept for the backward); the dispatch all-to-all sends
 * each slot's row (slots grouped by expert, so by owner) to the expert's owner; the owner gathers
 * each of its experts' rows source by source (xr, expert by expert: every token of the group routed
 * to e, sources ascending), runs the expert over them keeping its insides, and the combine
 * all-to-all brings every slot's output back in the source's slot order (y), where it is weighted
 * and added into its token's row in expert order, as one rank does.
 * Backward: dy and dw of every slot at the source (dproj at the slot's token, and its dot with the
 * slot's y), dy dispatched to the owners like the rows were, each expert's backward there (its
 * weight gradients stay on the owner: the experts' own data-parallel group reduces them), and
 * the input gradients combined back and added into their tokens' rows.
 * An expert's block holds the group's rows, not one micro-batch's, so the products are not the
 * bits of one rank's (the ranks' gradients agree to rounding: tests/test_train_moe_parallel.sh). */

/* Training's traffic and time since (bytes0, t0, comm0), rows: those sent to other ranks. */
static void train_ep_count(struct model *m, const struct comm *ep, uint64_t bytes0, double t0, double comm0, int64_t rows)
{
    m->ep_stats.a2a_bytes += ep->n_bytes - bytes0;
    m->ep_stats.a2a_seconds += ep->seconds - comm0;
    m->ep_stats.rest_seconds += base_now_s() - t0 - (ep->seconds - comm0);
    m->ep_stats.a2a_rows += (uint64_t)rows;
}

int64_t moe_ep_rows(const struct model *m, int64_t T)
{
    const int k = m->cfg.n_experts_used, El = m->n_experts_local;
    return (int64_t)m->ep_size * T * (k < El ? k : El);
}

int64_t moe_ep_idx_len(const struct model *m, int64_t T)
{
    return 2 * moe_ep_rows(m, T) + (int64_t)(m->ep_size + 1) * m->cfg.n_experts;
}

/* Every rank's per-expert slot counts (an all-gather over the ep group) into r->ep_n. */
static enum status ep_share_counts(struct model *m, int64_t T, const struct moe_tensors *mt)
{
    const int N = m->ep_size, E = m->cfg.n_experts;
    const int64_t R = moe_ep_rows(m, T);
    int32_t *h = mt->ep_host + 2 * R; /* (N + 1) E: everyone's, then this rank's */
    for (int e = 0; e < E; e++) h[(size_t)N * (size_t)E + (size_t)e] = mt->r->start[e + 1] - mt->r->start[e];
    struct tensor all = tensor_rows_at(&mt->ep_idx, 2 * R, (int64_t)N * E);
    struct tensor mine = tensor_rows_at(&mt->ep_idx, 2 * R + (int64_t)N * E, E);
    backend_upload(m->b, mine.data, h + (size_t)N * (size_t)E, (size_t)E * sizeof *h);
    enum status st = comm_all_gather(m->par.groups->ep, &all, &mine);
    if (st != STATUS_OK) return st;
    backend_download(m->b, h, all.data, (size_t)N * (size_t)E * sizeof *h);
    for (size_t i = 0; i < (size_t)N * (size_t)E; i++) mt->r->ep_n[i] = h[i];
    return STATUS_OK;
}

/* The rows this rank sends each owner q: its slots of q's experts (slots are grouped by expert, so
 * the group's slots are the run [start[base], start[base + N El]), the one this returns the start of). */
static int64_t ep_send_counts(const struct model *m, const struct moe_routing *r, int64_t *send)
{
    const int El = m->n_experts_local, base = ep_base(m);
    for (int q = 0; q < m->ep_size; q++) send[q] = r->start[base + (q + 1) * El] - r->start[base + q * El];
    return r->start[base];
}

/* Rows src[ids] into dst (n rows; nothing for n = 0): a gather through a host index list. */
static void gather_rows(struct model *m, const struct tensor *dst, const struct tensor *src, const int32_t *host_ids,
                        const struct tensor *dev_ids, int64_t n)
{
    if (n == 0) return;
    struct tensor ids = tensor_first_rows(dev_ids, n), out = tensor_first_rows(dst, n); /* each call its own ids */
    backend_upload(m->b, ids.data, host_ids, (size_t)n * sizeof *host_ids);
    op_embedding(m->b, &out, src, &ids, 0);
}

/* Combine: the experts' outputs out (expert by expert) back to their sources, arriving in each
 * source's slot order in dst (T k rows). */
static enum status ep_combine(struct model *m, int64_t T, const struct moe_tensors *mt, const struct ep_counts *kc,
                              const int64_t *send, const int64_t *recv, const struct tensor *out, const struct tensor *dst)
{
    const int64_t R = moe_ep_rows(m, T);
    int32_t *back = mt->ep_host + R;
    const struct tensor idx = tensor_rows_at(&mt->ep_idx, R, R);
    gather_rows(m, &mt->ep_buf, out, back, &idx, ep_back_rows(kc, back));
    return comm_all_to_all_rows(m->par.groups->ep, &mt->ep_buf, recv, dst, send);
}

enum status moe_ep_train_experts(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                                 const struct moe_tensors *mt)
{
    struct backend *b = m->b;
    const struct model_config *c = &m->cfg;
    const struct moe_routing *r = mt->r;
    const int N = m->ep_size, E = c->n_experts;
    const int64_t F = c->moe_ffn, R = moe_ep_rows(m, T);
    CHECK(N <= 64 && m->par.groups && m->par.groups->ep && mt->per_slot, "moe_ep_train: ep %d (at most 64), training",
          N);
    enum status st;
    if (!mt->recompute && (st = ep_share_counts(m, T, mt)) != STATUS_OK) return st;
    struct comm *ep = m->par.groups->ep; /* the traffic from here (the counts' all-gather aside) */
    const uint64_t bytes0 = ep->n_bytes;
    const double t0 = base_now_s(), comm0 = ep->seconds;
    const struct ep_counts kc = {r->ep_n, N, E, m->n_experts_local, m->ep_rank, m->expert_first};
    int64_t send[64], recv[64], off[64];
    /* The group's slots [s0, s0 + TK): every slot at tp 1, this tp rank's experts' at tp > 1 (the
     * other tp ranks' experts join in the layer's tp reduction, as without ep). */
    const int64_t s0 = ep_send_counts(m, r, send), TK = r->start[ep_base(m) + N * m->n_experts_local] - s0;
    const int64_t nr = ep_recv_counts(&kc, recv, off);
    CHECK(nr <= R, "moe_ep_train: %lld rows received, room for %lld", (long long)nr, (long long)R);
    int32_t *pos = mt->ep_host; /* host and device index lists: each gather its own range */
    const struct tensor idx_pos = tensor_first_rows(&mt->ep_idx, R);

    /* Dispatch (not when recomputing: xr is kept): every slot's row to its expert's owner, then
     * each of this rank's experts' rows gathered source by source into xr. */
    if (!mt->recompute) {
        if (TK) {
            struct tensor sx = tensor_first_rows(&mt->ep_buf, TK), ids = tensor_rows_at(&mt->ids, s0, TK);
            op_embedding(b, &sx, xn, &ids, 0);
        }
        if ((st = comm_all_to_all_rows(m->par.groups->ep, &mt->ep_buf, send, &mt->ep_in, recv)) != STATUS_OK) return st;
        int64_t ny = 0;
        for (int el = 0; el < m->n_experts_local; el++) {
            const int64_t ne = ep_expert_rows(&kc, off, el, pos + ny);
            if (ne == 0) continue;
            struct tensor xr = tensor_rows_at(&mt->xr, ny, ne), ids = tensor_rows_at(&idx_pos, ny, ne);
            gather_rows(m, &xr, &mt->ep_in, pos + ny, &ids, ne);
            ny += ne;
        }
    }

    /* Each expert over its rows, its insides kept, its outputs into ep_out (expert by expert). */
    int64_t ny = 0;
    for (int el = 0; el < m->n_experts_local; el++) {
        const int64_t ne = ep_expert_total(&kc, el);
        if (ne == 0) continue;
        struct tensor x = tensor_rows_at(&mt->xr, ny, ne), y = tensor_rows_at(&mt->ep_out, ny, ne);
        struct tensor gate = tensor_rows_at(&mt->gate, ny, ne), up = tensor_rows_at(&mt->up, ny, ne);
        struct tensor hact = tensor_rows_at(&mt->hact, ny, ne);
        CHECK(gate.shape[1] == F, "moe_ep_train: insides of %lld columns, moe_ffn %lld", (long long)gate.shape[1],
              (long long)F);
        moe_expert_mlp(m, l, el, &x, &gate, &up, &hact, &y);
        ny += ne;
    }
    const struct tensor y_group = TK ? tensor_rows_at(&mt->y, s0, TK) : tensor_first_rows(&mt->y, 1); /* 0 rows come */
    if ((st = ep_combine(m, T, mt, &kc, send, recv, &mt->ep_out, &y_group)) != STATUS_OK) return st;

    /* Every slot's output, weighted, into its token's row, expert by expert as one rank adds them. */
    const int base = ep_base(m);
    for (int e = base; proj && e < base + N * m->n_experts_local; e++) {
        const int64_t r0 = r->start[e], n = r->start[e + 1] - r0;
        if (n == 0) continue;
        struct tensor y = tensor_rows_at(&mt->y, r0, n), ids = tensor_rows_at(&mt->ids, r0, n);
        struct tensor wt = tensor_rows_at(&mt->w, r0, n);
        op_scatter_add_rows(b, proj, &y, &ids, &wt);
    }
    const int me = m->ep_rank;
    train_ep_count(m, ep, bytes0, t0, comm0, (mt->recompute ? 0 : TK - send[me]) + (nr - recv[me]));
    if (!mt->recompute) m->ep_stats.remote_slots += (uint64_t)(TK - send[me]), m->ep_stats.token_layers += (uint64_t)T;
    return STATUS_OK;
}

enum status moe_ep_train_backward(struct model *m, int l, int64_t T, const struct tensor *dproj,
                                  const struct tensor *dxn, const struct moe_tensors *mt,
                                  const struct moe_grad_scratch *s, const struct layer_weights *g,
                                  const struct tensor *dw)
{
    struct backend *b = m->b;
    const struct moe_routing *r = mt->r;
    const int N = m->ep_size;
    const int64_t R = moe_ep_rows(m, T);
    const struct ep_counts kc = {r->ep_n, N, m->cfg.n_experts, m->n_experts_local, m->ep_rank, m->expert_first};
    int64_t send[64], recv[64], off[64];
    const int64_t s0 = ep_send_counts(m, r, send), TK = r->start[ep_base(m) + N * m->n_experts_local] - s0;
    const int64_t nr = ep_recv_counts(&kc, recv, off);
    int32_t *pos = mt->ep_host;
    const struct tensor idx_pos = tensor_first_rows(&mt->ep_idx, R);
    struct comm *ep = m->par.groups->ep;
    const uint64_t bytes0 = ep->n_bytes;
    const double t0 = base_now_s(), comm0 = ep->seconds;

    /* Every slot's dy = w dproj[token] (into the send buffer, slot order) and dw = dproj[token] . y,
     * then dy to the owners. */
    if (TK) {
        struct tensor dy = tensor_first_rows(&mt->ep_buf, TK), y = tensor_rows_at(&mt->y, s0, TK);
        struct tensor ids = tensor_rows_at(&mt->ids, s0, TK), w = tensor_rows_at(&mt->w, s0, TK);
        struct tensor dws = tensor_rows_at(dw, s0, TK);
        op_scatter_add_rows_backward(b, &dy, &dws, dproj, &y, &ids, &w);
    }
    enum status st = comm_all_to_all_rows(m->par.groups->ep, &mt->ep_buf, send, &mt->ep_in, recv);
    if (st != STATUS_OK) return st;

    /* Each expert's backward over its rows (their dy gathered as the forward gathered x), the
     * input gradients into ep_out, expert by expert. */
    int64_t ny = 0;
    for (int el = 0; el < m->n_experts_local; el++) {
        const int64_t ne = ep_expert_rows(&kc, off, el, pos + ny);
        if (ne == 0) continue;
        struct tensor dy = tensor_first_rows(&s->dy, ne), ids = tensor_rows_at(&idx_pos, ny, ne);
        gather_rows(m, &dy, &mt->ep_in, pos + ny, &ids, ne);
        struct tensor x = tensor_rows_at(&mt->xr, ny, ne), dx = tensor_rows_at(&mt->ep_out, ny, ne);
        struct tensor gate = tensor_rows_at(&mt->gate, ny, ne), up = tensor_rows_at(&mt->up, ny, ne);
        struct tensor hact = tensor_rows_at(&mt->hact, ny, ne);
        moe_expert_backward(m, l, el, &x, &gate, &up, &hact, &dy, &dx, s, g);
        ny += ne;
    }

    /* The input gradients back to their sources (slot order) and into their tokens' rows. */
    if ((st = ep_combine(m, T, mt, &kc, send, recv, &mt->ep_out, &mt->ep_in)) != STATUS_OK) return st;
    if (TK) {
        struct tensor dx = tensor_first_rows(&mt->ep_in, TK), ids = tensor_rows_at(&mt->ids, s0, TK);
        op_embedding_backward(b, dxn, &dx, &ids, 0);
    }
    train_ep_count(m, ep, bytes0, t0, comm0, (TK - send[m->ep_rank]) + (nr - recv[m->ep_rank]));
    return STATUS_OK;
}

void moe_ep_train_log(const struct model *m)
{
    const struct moe_ep_stats *s = &m->ep_stats;
    if (m->ep_size <= 1 || !s->token_layers) return;
    const struct model_config *c = &m->cfg;
    const double row = (double)c->d_model * (double)dtype_size(m->dtype), N = m->ep_size;
    const double f = (double)s->remote_slots / (double)s->token_layers; /* remote slots per token */
    LOG_INFO("moe_ep", "ep rank %d/%d (training): the all-to-alls sent %llu bytes to other ranks (%llu rows x d_model %d "
             "x %g bytes = %.0f expected, the count all-gathers aside); %llu token-layers had %.3f of their k %d slots "
             "on other ranks: %.1f bytes per token per MoE layer (forward dispatch and combine, backward the same: "
             "4 x %.3f x %.0f = %.1f; a uniform routing: 4 k d s (N-1)/N = %.1f; recomputation adds a combine); "
             "time: all-to-alls %.4f s, the experts with their gathers and bookkeeping %.4f s",
             m->ep_rank, m->ep_size, (unsigned long long)s->a2a_bytes, (unsigned long long)s->a2a_rows, c->d_model,
             (double)dtype_size(m->dtype), (double)s->a2a_rows * row, (unsigned long long)s->token_layers, f,
             c->n_experts_used, (double)s->a2a_bytes / (double)s->token_layers, f, row, 4.0 * f * row,
             4.0 * c->n_experts_used * row * (N - 1.0) / N, s->a2a_seconds, s->rest_seconds);
}
