/* engine/model/moe.h - a mixture of experts' MLP (Mixtral, Qwen 2 / 3 MoE, OLMoE), serving forward:
 * the router's logits, each token's top-k experts with their weights, every chosen expert's
 * gated MLP over the rows routed to it, and the weighted sum into the block's output.
 * Routing runs on the host (the router's logits are downloaded: one synchronisation per layer,
 * which a GPU pays; dropless: every token gets its k experts). Experts run one after the other
 * in index order, each over its rows gathered into a dense block (op_embedding with the normed
 * rows as the table), and are summed into the output in that order (op_scatter_add_rows), so a
 * token's result does not depend on the batch around it.
 * With tp > 1 each rank holds a block of whole experts (checkpoint.c's plan) and routes every
 * token (the router is replicated; its input is the same on every rank); proj is then this
 * rank's part, which the layer's tp all-reduce completes (the shared expert, split like a dense
 * MLP, joins the same sum). No all-to-all: every rank sees every token.
 * Not here: the attention and norms around it (layer.c); training (refused: model_train.c).
 * Tests: tests/test_model.c goldens mixtral, qwen3_moe, olmoe (float64 NumPy forwards);
 * tests/test_moe.c (moe_route against a direct reference, ties). */
#ifndef SHARDLM_MOE_H
#define SHARDLM_MOE_H

#include "model.h"

/* Routing of T tokens over E experts from the router's logits (T, E) f32: per token, p =
 * softmax(logits) in double, its k largest (equal probabilities: the lower expert index
 * first), weights p of those (divided by their sum when norm). Written grouped by expert:
 * start[e] .. start[e+1]-1 index ids (the token rows routed to expert e, ascending) and w
 * (their weights, f32); start has E + 1 entries, ids and w T * k. */
void moe_route(const float *logits, int T, int E, int k, int norm, int *start, int32_t *ids, float *w);

/* proj (T rows, d_model) = this rank's part of the mixture of layer l's experts applied to xn
 * (T, d_model), the normed input (all of it at tp 1). Uses the serving workspace (m->ws:
 * model_reserve sized it for the experts). */
enum status moe_forward(struct model *m, int l, int64_t T, const struct tensor *xn, const struct tensor *proj);

#endif
