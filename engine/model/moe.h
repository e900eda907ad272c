/* engine/model/moe.h - a mixture of experts' MLP (Mixtral, Qwen 2 / 3 MoE, OLMoE): the router's
 * logits, each token's top-k experts with their weights, every chosen expert's gated MLP over the
 * rows routed to it, and the weighted sum into the block's output; in serving (moe_forward over
 * the model's workspace) and in training (moe_forward into the kept tensors of struct
 * moe_tensors, moe_backward, and Megatron's auxiliary losses, moe_train.c).
 * Routing runs on the host (the router's logits are downloaded: one synchronisation per layer,
 * which a GPU pays; dropless: every token gets its k experts). Experts run one after the other
 * in index order, each over its rows gathered into a dense block (op_embedding with the normed
 * rows as the table), and are summed into the output in that order (op_scatter_add_rows), so a
 * token's result does not depend on the batch around it.
 * Ties: p = softmax(logits) in double; of equal probabilities the lower expert index is chosen
 * first (moe_route), in serving and in training alike, and the JAX reference of
 * tests/test_train_moe.py breaks them the same way.
 * With tp > 1 each rank holds a block of whole experts (checkpoint.c's plan) and routes every
 * token (the router is replicated; its input is the same on every rank); proj is then this
 * rank's part, which the layer's tp all-reduce completes (the shared expert, split like a dense
 * MLP, joins the same sum). No all-to-all: every rank sees every token. Under expert parallelism
 * (--ep, the model's ep_size > 1) the experts' group is its own and the tokens are dispatched to
 * them and combined by all-to-all instead (moe_ep.c), in serving and in training.
 * Training (moe_backward): the experts' weight gradients, the input's gradient scattered back
 * to its rows, the router's gradient through the (renormalised) top-k softmax weights into the
 * logits and the router weight, the shared expert and its sigmoid gate; and beside the language
 * model's loss, per layer, Megatron's load-balancing loss and router z-loss:
 *   aux = E sum_e f_e P_e,  f_e = (tokens routed to e) / (T k),  P_e = mean_t softmax(z_t)_e
 *   z   = mean_t logsumexp(z_t)^2
 * (f_e counts, as Megatron's switch_load_balancing_loss_func, the T k routed slots: a uniform
 * routing gives aux = 1; f carries no gradient), weighted by moe_aux_loss_coeff and
 * moe_z_loss_coeff (struct moe_loss).
 * Not here: the attention and norms around it (layer.c); the training memory plan
 * (model_train_mem.c); LoRA on the experts (refused by the trainer).
 * Tests: tests/test_model.c goldens mixtral, qwen3_moe, olmoe (float64 NumPy forwards);
 * tests/test_moe.c (moe_route against a direct reference, ties); tests/test_train_moe.py
 * (training gradients and Adam steps against JAX + optax). */
#ifndef SHARDLM_MOE_H
#define SHARDLM_MOE_H

#include "model.h"

struct moe_grad_scratch;

/* Routing of T tokens over E experts from the router's logits (T, E) f32: per token, p =
 * softmax(logits) in double (or the sigmoid scores below), its k largest (equal probabilities:
 * the lower expert index first), weights p of those (divided by their sum when norm). Written grouped by expert:
 * start[e] .. start[e+1]-1 index ids (the token rows routed to expert e, ascending) and w
 * (their weights, f32); start has E + 1 entries, ids and w T * k. */
/* How the router's logits become scores: NULL (or zeroed) is the softmax above; sigmoid scores
 * each expert on its own, p_e = sigmoid(z_e) (MiniMax-M2, DeepSeek-V3), and sel_bias (E, or
 * NULL) is added to p to choose the top k (equal sums: the lower index first) while the weights
 * stay p (renormalised over the k when norm). DeepSeek-V3's group-limited choice (groups > 1):
 * the E experts in `groups` equal runs, each scored by the sum of its two best choice scores
 * (p + bias); the group_topk best groups (equal: the lower first) stay and every other expert's
 * choice score is taken as 0 (transformers' masked_fill), then the top k as above. scale (0: 1)
 * multiplies the final weights (routed_scaling_factor). */
struct moe_scoring {
    int sigmoid;
    const float *sel_bias;
    int groups, group_topk;
    float scale;
};

void moe_route(const float *logits, int T, int E, int k, int norm, const struct moe_scoring *sc, int *start,
               int32_t *ids, float *w);

/* One layer's routing in host memory (kept from the training forward to its backward). */
struct moe_routing {
    float   *logits;  /* (T, E) f32: the router's logits */
    int     *start;   /* (E + 1): expert e's slots start[e] .. start[e+1]-1 */
    int32_t *ids;     /* (T * k): the token of each slot, grouped by expert */
    float   *w;       /* (T * k): its weight */
    float   *sw;      /* (T): the shared expert's sigmoid gate (shared expert only) */
    int64_t *ep_n;    /* expert parallelism in training: (ep_size, E) the slots of each ep rank's
                         tokens routed to each expert (moe_ep_train_experts), else NULL */
    double   aux, z;  /* the layer's load-balancing loss and z-loss, without coefficients */
};

/* Where a mixture of experts' forward puts its tensors. Serving passes NULL to moe_forward:
 * its workspace, in which every expert overwrites the last one's insides. Training passes the
 * layer's kept tensors, indexed by slot (rows start[e] .. of expert e), so that moe_backward
 * finds every expert's insides. recompute: the routing is kept (device ids, w, sw; host r) and
 * only the insides are computed again (selective recomputation of the MLP); proj may be NULL
 * then. */
struct moe_tensors {
    struct tensor logits, logits32;   /* (T, E): the router's logits (dtype, and f32 when dtype is not) */
    struct tensor x;                  /* (T, d): one expert's gathered input rows (scratch) */
    struct tensor ids, w;             /* i32, f32 (T * k): the routing on the device */
    struct tensor gate, up, hact;     /* (T * k, moe_ffn) per slot (hact may be up: in place) */
    struct tensor y;                  /* (T * k, d) per slot: each expert's output, unweighted */
    struct tensor rows, sw;           /* i32 0 .. T-1, f32 (T): the shared expert's rows and gates */
    struct tensor s_gate, s_up, s_hact; /* (T, ffn_local): the shared expert's insides */
    struct tensor s_y;                /* (T, d): its output before the gate */
    /* Expert parallelism in training (moe_ep_train_experts): gate, up and hact then hold the
     * rows this rank's experts ran on (every ep rank's tokens routed to them, expert by expert:
     * up to moe_ep_rows), xr their inputs (kept for the backward), and y stays per local slot
     * (the outputs combined back). ep_buf, ep_in, ep_out (moe_ep_rows, d) and ep_idx (i32,
     * moe_ep_idx_len) are scratch shared by the layers, ep_host its host twin. */
    struct tensor xr, ep_buf, ep_in, ep_out, ep_idx;
    int32_t *ep_host;
    struct moe_routing *r;            /* host */
    int per_slot;                     /* gate .. y indexed by slot (training), or from row 0 */
    int recompute;
};

/* proj (T rows, d_model) = this rank's part of the mixture of layer l's experts applied to xn
 * (T, d_model), the normed input (all of it at tp 1). mt NULL: the serving workspace (m->ws:
 * model_reserve sized it for the experts); else training's tensors (above), and the routing's
 * auxiliary losses are written to mt->r. */
enum status moe_forward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                        const struct moe_tensors *mt);

/* Local expert el of layer l over the n rows of x (n, d): gate = x Wg^T (+ bg), up = x Wu^T
 * (+ bu), hact = act(gate, up) (may be up: in place), y = hact Wd^T (+ bd); the biases are
 * GPT-OSS's (cfg.moe_bias). Serving and expert parallelism share it. */
void moe_expert_mlp(struct model *m, int l, int el, const struct tensor *x, const struct tensor *gate,
                    const struct tensor *up, const struct tensor *hact, const struct tensor *y);

/* Serving's per-expert load: out (n_layers_local, n_experts) = the tokens routed to each expert
 * of each of this stage's layers (local layer i is layer layer_first + i) by the serving forwards
 * since the workspace was first reserved: every token a forward ran (prompt rows, decode rows,
 * speculative and recomputed rows alike), k per token and layer, counted on every tp rank alike
 * (routing is replicated). Any thread, while the model lives (relaxed atomic reads: each counter
 * is exact, a forward in flight may be half counted). Returns n_layers_local, or 0 (out
 * untouched) for a dense model or before model_reserve. */
int moe_load_read(const struct model *m, uint64_t *out);

/* Expert parallelism in serving (moe_ep.c; the design, the order and why it is bit-identical to
 * one rank: there). moe_ep_check: the config can be split over ep_size ranks (a mixture whose
 * expert count ep_size divides), else STATUS_INVALID_ARGUMENT naming both numbers (tp_size > 1:
 * the group is --ep ep_size / tp_size x --tp tp_size, named so).
 * moe_ep_experts: proj's rows of this rank's token slice += its tokens' experts (dispatched to
 * and combined from their owners by all-to-all over the ep group), in expert order; proj zero
 * before, its other rows untouched. moe_ep_join: the all-reduce joining the slices (collective).
 * moe_ep_log: the traffic counted since the load, one log line (nothing without ep). */
enum status moe_ep_check(const struct model_config *c, int ep_size, int tp_size);
enum status moe_ep_experts(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                           const struct moe_routing *r, const struct moe_tensors *mt);
enum status moe_ep_join(struct model *m, const struct tensor *proj);
void moe_ep_log(const struct model *m);

/* Expert parallelism in training (moe_ep.c, the design there): the ep group is carved out of
 * data parallelism (par.groups->ep), so every ep rank holds its own micro-batch of T tokens.
 * moe_ep_train_experts: proj (T, d), zeroed before, += the rank's tokens' experts, after the
 * group learns every rank's per-expert counts (an all-gather), the rows dispatched to the
 * experts' owners and their outputs combined back (two all-to-alls); mt->recompute: the routing
 * and xr are kept, the experts run again and combine (proj may then be NULL). A collective over
 * the ep group: every rank calls it for the same layers in the same order.
 * moe_ep_train_backward: dxn += the experts' part of dL/dxn and dw (T k, f32) = the slots' weight
 * gradients, the experts' weight gradients added to g: the slots' output gradients dispatched
 * to the owners and the input gradients combined back, the mirror of the forward.
 * moe_ep_rows: the most rows one rank's experts can receive (ep ranks x T x min(k, E / ep));
 * moe_ep_idx_len: the i32 entries of ep_idx / ep_host. */
enum status moe_ep_train_experts(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj,
                                 const struct moe_tensors *mt);
enum status moe_ep_train_backward(struct model *m, int l, int64_t T, const struct tensor *dproj,
                                  const struct tensor *dxn, const struct moe_tensors *mt,
                                  const struct moe_grad_scratch *s, const struct layer_weights *g,
                                  const struct tensor *dw);
int64_t moe_ep_rows(const struct model *m, int64_t T);
/* The traffic and time of training's all-to-alls since the load, one log line (nothing without
 * ep), against the formula (4 k d s x the slots' remote fraction per token and MoE layer). */
void moe_ep_train_log(const struct model *m);
int64_t moe_ep_idx_len(const struct model *m, int64_t T);

/* The backward of local expert el of layer l (moe_expert_mlp) over the n rows of dy (n, d), the
 * gradient of its output: dx (n, d) = the gradient of its input x (written), and its weights'
 * (and biases') gradients added to g; dgate and dup of s as scratch. */
void moe_expert_backward(struct model *m, int l, int el, const struct tensor *x, const struct tensor *gate,
                         const struct tensor *up, const struct tensor *hact, const struct tensor *dy,
                         const struct tensor *dx, const struct moe_grad_scratch *s, const struct layer_weights *g);

/* DeepSeek-V3's loss-free balancing (train --moe-router-bias-update-rate): every layer of this
 * stage, b_e += rate sign(mean_e load - load_e) on its selection bias (router_sel_bias), from load
 * (n_layers, E), the step's routing of every layer summed over the world (the same numbers on
 * every rank, so every replica updates its copy alike); written to master's bias (f32) and, when
 * master is not the model's own weights, to the model's too. The bias has no gradient (AdamW
 * leaves it: zero moments, no decay). moe_train.c. */
void moe_update_sel_bias(struct model *m, struct model_weights *master, const int64_t *load, float rate);

/* r->aux and r->z of T tokens from r->logits and r->start (moe_train.c). */
void moe_routing_losses(const struct model_config *c, int64_t T, struct moe_routing *r);

/* The auxiliary losses' coefficients (Megatron's --moe-aux-loss-coeff, --moe-z-loss-coeff) and
 * the scale of their gradient in this micro-batch (as train_batch.grad_scale is the LM loss's:
 * the loss scale over the micro-batches of the global batch). */
struct moe_loss {
    float aux_coeff, z_coeff;
    float scale;
};

/* Scratch of moe_backward (T rows): dy, dx (T, d); dgate, dup (T, max(ffn_local, moe_ffn));
 * dw f32 (T * (k + 1)): the slots' weights' gradients, then the shared expert's gates'; dlogits
 * f32 (T, E) and dlogits_dt (T, E) in the compute dtype (absent when that is f32); on the host
 * host_dz (T * E), host_dw (T * k) and host_tok (3 T, double). */
struct moe_grad_scratch {
    struct tensor dy, dx, dgate, dup, dw, dlogits, dlogits_dt;
    float *host_dz, *host_dw;
    double *host_tok;
};

/* The backward of moe_forward (training, at any tp: this rank's experts and its part of the shared
 * expert, the slots' weight gradients summed over tp before the router's; not under expert
 * parallelism): given dproj (T, d), the gradient of proj, and the
 * forward's kept tensors mt (insides recomputed when they were not kept), writes dxn (T, d) =
 * dL/dxn and adds the gradients of layer l's router, experts, shared expert and its gate, and
 * GPT-OSS's router and expert biases, to g (tensors with data NULL are skipped), the auxiliary losses' included (loss). The router's
 * gradient is formed on the host, in double, from the routing in mt->r. */
enum status moe_backward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *dproj,
                  const struct tensor *dxn, const struct moe_tensors *mt, const struct moe_grad_scratch *s,
                  const struct layer_weights *g, const struct moe_loss *loss);

#endif
