/* kernels/ops_train.c - the op_* wrappers of ops.h's training ops (attention's training pass,
 * the backward ops, the fused cross-entropy, AdamW, sums of squares): each checks its contract
 * once for every backend, then calls the backend's slot.
 * Not here: the forward ops' wrappers (ops.c), any arithmetic (kernels/cpu/, kernels/cuda/).
 * Tests: tests/test_ops_backward.c, tests/test_attention_train.c. */
#include "ops.h"

#include <math.h>
#include <string.h>

#include "backend_impl.h"
#include "ops_check.h"

/* ---- training attention ------------------------------------------------------------------ */

/* The shapes shared by op_attention_train and its backward: q (n, n_heads, head_dim), k and v
 * (n, n_kv_heads, head_dim), lse f32 (n, n_heads), and the batch description. */
static void check_attention_train(struct backend *b, const struct tensor *lse,
                                  const struct tensor *q, const struct tensor *k,
                                  const struct tensor *v, const struct attention_train_batch *batch)
{
    check_float(b, q, "attention_train q");
    check_float(b, k, "attention_train k");
    check_float(b, v, "attention_train v");
    check_on(b, lse, "attention_train lse");
    check_same(k, v, "attention_train k/v");
    CHECK(q->ndim == 3 && k->ndim == 3 && q->dtype == k->dtype && q->shape[0] == k->shape[0] &&
              q->shape[2] == k->shape[2] && k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0,
          "attention_train: q %s (n, n_heads, head_dim) vs k %s (n, n_kv_heads, head_dim)",
          DESC(q), DESC(k));
    CHECK(lse->dtype == DTYPE_F32 && lse->ndim == 2 && lse->shape[0] == q->shape[0] &&
              lse->shape[1] == q->shape[1],
          "attention_train: lse %s must be f32 (n, n_heads) for q %s", DESC(lse), DESC(q));
    CHECK(batch->n_docs >= 0 && (batch->n_docs > 0 || q->shape[0] == 0),
          "attention_train batch: %d documents for %lld rows", batch->n_docs,
          (long long)q->shape[0]);
    check_i32(b, &batch->doc_start, "attention_train doc_start");
    CHECK(tensor_numel(&batch->doc_start) == (int64_t)batch->n_docs + 1,
          "attention_train doc_start %s must have n_docs + 1 = %d entries",
          DESC(&batch->doc_start), batch->n_docs + 1);
    CHECK(!batch->bidirectional || batch->window == 0, "attention_train: a bidirectional batch has no window (%d)",
          batch->window);
    CHECK(batch->window >= 0 && batch->scale > 0.0f && batch->softcap >= 0.0f && isfinite(batch->softcap),
          "attention_train window %d scale %g softcap %g", batch->window, (double)batch->scale,
          (double)batch->softcap);
    if (batch->sinks.data) { /* attention sinks: one f32 logit per query head */
        check_on(b, &batch->sinks, "attention_train sinks");
        CHECK(batch->sinks.dtype == DTYPE_F32 && batch->sinks.ndim == 1 && batch->sinks.shape[0] == q->shape[1],
              "attention_train sinks must be f32 (n_heads = %lld), are %s", (long long)q->shape[1],
              DESC(&batch->sinks));
    }
}

/* Whether the memory of two tensors overlaps (compared as addresses: they may be unrelated
 * allocations). */
static int overlaps(const struct tensor *a, const struct tensor *c)
{
    uintptr_t pa = (uintptr_t)a->data, pc = (uintptr_t)c->data;
    size_t na = tensor_nbytes(a), nc = tensor_nbytes(c);
    return na && nc && pa < pc + nc && pc < pa + na;
}

void op_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                        const struct tensor *q, const struct tensor *k, const struct tensor *v,
                        const struct attention_train_batch *batch)
{
    check_attention_train(b, lse, q, k, v, batch);
    check_float(b, out, "attention_train out");
    check_same(out, q, "attention_train out/q");
    const struct tensor *ins[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        CHECK(!overlaps(out, ins[i]) && !overlaps(lse, ins[i]),
              "attention_train: out or lse overlaps an input");
    CHECK(!overlaps(out, lse), "attention_train: out overlaps lse");
    b->ops->attention_train(b, out, lse, q, k, v, batch);
    after_op(b);
}

void op_attention_train_backward(struct backend *b, const struct tensor *dq,
                                 const struct tensor *dk, const struct tensor *dv,
                                 const struct tensor *dout, const struct tensor *out,
                                 const struct tensor *lse, const struct tensor *q,
                                 const struct tensor *k, const struct tensor *v,
                                 const struct attention_train_batch *batch)
{
    check_attention_train(b, lse, q, k, v, batch);
    CHECK(!batch->bidirectional, "attention_train_backward: bidirectional attention has no backward (encoders are "
          "served, not trained)");
    check_float(b, dq, "attention_train_backward dq");
    check_float(b, dk, "attention_train_backward dk");
    check_float(b, dv, "attention_train_backward dv");
    check_float(b, dout, "attention_train_backward dout");
    check_float(b, out, "attention_train_backward out");
    check_same(dq, q, "attention_train_backward dq/q");
    check_same(dk, k, "attention_train_backward dk/k");
    check_same(dv, v, "attention_train_backward dv/v");
    check_same(dout, q, "attention_train_backward dout/q");
    check_same(out, q, "attention_train_backward out/q");
    const struct tensor *grads[3] = {dq, dk, dv}, *ins[6] = {dout, out, lse, q, k, v};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 6; j++)
            CHECK(!overlaps(grads[i], ins[j]), "attention_train_backward: a gradient overlaps an input");
        for (int j = i + 1; j < 3; j++)
            CHECK(!overlaps(grads[i], grads[j]), "attention_train_backward: gradients overlap");
    }
    b->ops->attention_train_backward(b, dq, dk, dv, dout, out, lse, q, k, v, batch);
    after_op(b);
}

void op_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                 const struct tensor *out, const struct tensor *lse, const struct tensor *sinks)
{
    check_float(b, dout, "attention_sinks_backward dout");
    check_same(out, dout, "attention_sinks_backward out/dout");
    check_on(b, lse, "attention_sinks_backward lse");
    check_on(b, sinks, "attention_sinks_backward sinks");
    check_on(b, dsinks, "attention_sinks_backward dsinks");
    CHECK(dout->ndim == 3, "attention_sinks_backward: dout %s must be (n, n_heads, head_dim)", DESC(dout));
    const int64_t n = dout->shape[0], heads = dout->shape[1];
    CHECK(lse->dtype == DTYPE_F32 && lse->ndim == 2 && lse->shape[0] == n && lse->shape[1] == heads,
          "attention_sinks_backward: lse %s must be f32 (n, n_heads) for dout %s", DESC(lse), DESC(dout));
    CHECK(sinks->dtype == DTYPE_F32 && sinks->ndim == 1 && sinks->shape[0] == heads && dsinks->dtype == DTYPE_F32 &&
              dsinks->ndim == 1 && dsinks->shape[0] == heads,
          "attention_sinks_backward: sinks %s and dsinks %s must be f32 (n_heads = %lld)", DESC(sinks), DESC(dsinks),
          (long long)heads);
    const struct tensor *ins[4] = {dout, out, lse, sinks};
    for (int i = 0; i < 4; i++) CHECK(!overlaps(dsinks, ins[i]), "attention_sinks_backward: dsinks overlaps an input");
    b->ops->attention_sinks_backward(b, dsinks, dout, out, lse, sinks);
    after_op(b);
}

/* ---- backward ops and the optimizer ------------------------------------------------------ */

/* A weight gradient: f32 (fp32 accumulation) or the activations' dtype, shaped like its
 * weight. */
static void check_weight_grad(struct backend *b, const struct tensor *g, const struct tensor *like,
                              enum dtype act_dtype, const char *what)
{
    check_float(b, g, what);
    CHECK(g->dtype == DTYPE_F32 || g->dtype == act_dtype, "%s must be f32 or %s, is %s", what,
          dtype_name(act_dtype), DESC(g));
    CHECK(tensor_numel(g) == tensor_numel(like) && tensor_cols(g) == tensor_cols(like),
          "%s %s must be shaped like %s", what, DESC(g), DESC(like));
}

void op_embedding_backward(struct backend *b, const struct tensor *dtable,
                           const struct tensor *dout, const struct tensor *ids, int64_t vocab_start)
{
    check_float(b, dtable, "embedding_backward dtable");
    check_float(b, dout, "embedding_backward dout");
    check_i32(b, ids, "embedding_backward ids");
    CHECK(dtable->dtype == DTYPE_F32 || dtable->dtype == dout->dtype,
          "embedding_backward: dtable %s must be f32 or dout's dtype (%s)", DESC(dtable), DESC(dout));
    CHECK(dtable->ndim == 2 && tensor_cols(dout) == dtable->shape[1] &&
              tensor_rows(dout) == tensor_numel(ids),
          "embedding_backward: dtable %s dout %s ids %s", DESC(dtable), DESC(dout), DESC(ids));
    CHECK(vocab_start >= 0, "vocab_start %lld", (long long)vocab_start);
    b->ops->embedding_backward(b, dtable, dout, ids, vocab_start);
    after_op(b);
}

void op_position_embedding_add_backward(struct backend *b, const struct tensor *dtable,
                                        const struct tensor *dx, const struct tensor *positions)
{
    check_float(b, dtable, "position_embedding_backward dtable");
    check_float(b, dx, "position_embedding_backward dx");
    check_i32(b, positions, "position_embedding_backward positions");
    CHECK(dtable->dtype == DTYPE_F32 || dtable->dtype == dx->dtype,
          "position_embedding_backward: dtable %s must be f32 or dx's dtype (%s)", DESC(dtable),
          DESC(dx));
    CHECK(dtable->ndim == 2 && tensor_cols(dx) == dtable->shape[1] &&
              tensor_rows(dx) == tensor_numel(positions),
          "position_embedding_backward: dtable %s dx %s positions %s", DESC(dtable), DESC(dx),
          DESC(positions));
    b->ops->position_embedding_add_backward(b, dtable, dx, positions);
    after_op(b);
}

void op_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                        const struct tensor *dbias, const struct tensor *dy,
                        const struct tensor *x, const struct tensor *w, int accumulate_dx)
{
    check_float(b, dy, "matmul_backward dy");
    const int64_t m = tensor_rows(dy), n = tensor_cols(dy);
    if (dx) {
        CHECK(w != NULL, "matmul_backward: dx needs w");
        check_float(b, dx, "matmul_backward dx");
        CHECK(dx->dtype == dy->dtype && tensor_rows(dx) == m,
              "matmul_backward: dx %s dy %s", DESC(dx), DESC(dy));
        CHECK(dx->data != dy->data && (!x || dx->data != x->data) && dx->data != w->data,
              "matmul_backward: dx aliases an input");
    }
    if (w) {
        check_float(b, w, "matmul_backward w");
        CHECK(w->dtype == dy->dtype && w->ndim == 2 && w->shape[0] == n &&
                  (!dx || tensor_cols(dx) == w->shape[1]),
              "matmul_backward: w %s dy %s dx %s", DESC(w), DESC(dy), dx ? DESC(dx) : "NULL");
    }
    if (dw) {
        CHECK(x != NULL, "matmul_backward: dw needs x");
        check_float(b, dw, "matmul_backward dw");
        CHECK(dw->dtype == DTYPE_F32 || dw->dtype == dy->dtype,
              "matmul_backward: dw %s must be f32 or %s", DESC(dw), dtype_name(dy->dtype));
        CHECK(dw->ndim == 2 && dw->shape[0] == n && dw->shape[1] == tensor_cols(x),
              "matmul_backward: dw %s for dy %s x %s", DESC(dw), DESC(dy), DESC(x));
    }
    if (x) {
        check_float(b, x, "matmul_backward x");
        CHECK(x->dtype == dy->dtype && tensor_rows(x) == m && (!w || tensor_cols(x) == w->shape[1]),
              "matmul_backward: x %s dy %s w %s", DESC(x), DESC(dy), w ? DESC(w) : "NULL");
    }
    if (dbias) {
        check_float(b, dbias, "matmul_backward dbias");
        CHECK((dbias->dtype == DTYPE_F32 || dbias->dtype == dy->dtype) && tensor_numel(dbias) == n,
              "matmul_backward: dbias %s for dy %s", DESC(dbias), DESC(dy));
    }
    if (!dx && !dw && !dbias) return;
    b->ops->matmul_backward(b, dx, dw, dbias, dy, x, w, accumulate_dx);
    after_op(b);
}

void op_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                         const struct tensor *dout, const struct tensor *x,
                         const struct tensor *weight, float eps)
{
    check_float(b, dx, "rmsnorm_backward dx");
    check_float(b, dout, "rmsnorm_backward dout");
    check_float(b, x, "rmsnorm_backward x");
    check_float(b, weight, "rmsnorm_backward weight");
    check_same(dx, x, "rmsnorm_backward dx/x");
    check_same(dout, x, "rmsnorm_backward dout/x");
    check_vector(weight, tensor_cols(x), x->dtype, "rmsnorm_backward weight");
    if (dweight) check_weight_grad(b, dweight, weight, x->dtype, "rmsnorm_backward dweight");
    CHECK(dx->data != x->data, "rmsnorm_backward: dx aliases x");
    CHECK(eps >= 0.0f, "rmsnorm eps %g", (double)eps);
    b->ops->rmsnorm_backward(b, dx, dweight, dout, x, weight, eps);
    after_op(b);
}

void op_layernorm_backward(struct backend *b, const struct tensor *dx,
                           const struct tensor *dweight, const struct tensor *dbias,
                           const struct tensor *dout, const struct tensor *x,
                           const struct tensor *weight, float eps)
{
    check_float(b, dx, "layernorm_backward dx");
    check_float(b, dout, "layernorm_backward dout");
    check_float(b, x, "layernorm_backward x");
    check_float(b, weight, "layernorm_backward weight");
    check_same(dx, x, "layernorm_backward dx/x");
    check_same(dout, x, "layernorm_backward dout/x");
    check_vector(weight, tensor_cols(x), x->dtype, "layernorm_backward weight");
    if (dweight) check_weight_grad(b, dweight, weight, x->dtype, "layernorm_backward dweight");
    if (dbias) check_weight_grad(b, dbias, weight, x->dtype, "layernorm_backward dbias");
    CHECK(dx->data != x->data, "layernorm_backward: dx aliases x");
    CHECK(eps >= 0.0f, "layernorm eps %g", (double)eps);
    b->ops->layernorm_backward(b, dx, dweight, dbias, dout, x, weight, eps);
    after_op(b);
}

void op_rope_backward(struct backend *b, const struct tensor *dx, const struct tensor *positions,
                      int rot_dim, const struct rope_params *rp, enum rope_style style)
{
    check_float(b, dx, "rope_backward dx");
    check_i32(b, positions, "rope_backward positions");
    CHECK(dx->ndim == 3 && dx->shape[0] == tensor_numel(positions),
          "rope_backward: dx %s must be (n, n_heads, head_dim), positions %s", DESC(dx),
          DESC(positions));
    CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= dx->shape[2],
          "rope_backward: rot_dim %d, head_dim %lld", rot_dim, (long long)dx->shape[2]);
    check_rope(rp, rot_dim);
    CHECK(style == ROPE_STYLE_PAIRS || style == ROPE_STYLE_HALVES, "rope style %d", (int)style);
    b->ops->rope_backward(b, dx, positions, rot_dim, rp, style);
    after_op(b);
}

void op_activation_backward(struct backend *b, const struct tensor *dx, const struct tensor *dout,
                            const struct tensor *x, enum activation act)
{
    check_float(b, dx, "activation_backward dx");
    check_float(b, dout, "activation_backward dout");
    check_float(b, x, "activation_backward x");
    check_same(dx, x, "activation_backward dx/x");
    check_same(dout, x, "activation_backward dout/x");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF,
          "activation %d (ACTIVATION_SWIGLU_OAI is gated only)", (int)act);
    b->ops->activation_backward(b, dx, dout, x, act);
    after_op(b);
}

void op_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                  const struct tensor *dup, const struct tensor *dout,
                                  const struct tensor *gate, const struct tensor *up,
                                  enum activation act)
{
    check_float(b, dgate, "gated_activation_backward dgate");
    check_float(b, dup, "gated_activation_backward dup");
    check_float(b, dout, "gated_activation_backward dout");
    check_float(b, gate, "gated_activation_backward gate");
    check_float(b, up, "gated_activation_backward up");
    check_same(dgate, gate, "gated_activation_backward dgate/gate");
    check_same(dup, gate, "gated_activation_backward dup/gate");
    check_same(dout, gate, "gated_activation_backward dout/gate");
    check_same(up, gate, "gated_activation_backward up/gate");
    CHECK(dgate->data != dup->data && dgate->data != up->data && dup->data != gate->data,
          "gated_activation_backward: dgate and dup must be distinct, dgate must not alias up "
          "nor dup gate");
    CHECK(act == ACTIVATION_SILU || act == ACTIVATION_GELU_TANH || act == ACTIVATION_GELU_ERF ||
              act == ACTIVATION_SWIGLU_OAI,
          "activation %d", (int)act);
    b->ops->gated_activation_backward(b, dgate, dup, dout, gate, up, act);
    after_op(b);
}

/* h (n, d) and w (vocab_local, d) of one dtype, targets i32 (n). */
static void check_lm_head(struct backend *b, const struct tensor *h, const struct tensor *w,
                          const struct tensor *targets, int64_t vocab_start, const char *what)
{
    check_float(b, h, what);
    check_float(b, w, what);
    check_i32(b, targets, what);
    CHECK(h->dtype == w->dtype && w->ndim == 2 && tensor_cols(h) == w->shape[1] &&
              tensor_numel(targets) == tensor_rows(h),
          "%s: h %s w %s targets %s", what, DESC(h), DESC(w), DESC(targets));
    CHECK(vocab_start >= 0, "%s: vocab_start %lld", what, (long long)vocab_start);
}

void op_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                            const struct tensor *w, const struct tensor *targets,
                            int64_t vocab_start, float softcap)
{
    CHECK(softcap >= 0.0f && isfinite(softcap), "cross_entropy_stats: softcap %g", (double)softcap);
    check_lm_head(b, h, w, targets, vocab_start, "cross_entropy_stats");
    check_on(b, stats, "cross_entropy_stats stats");
    CHECK(stats->dtype == DTYPE_F32 && tensor_cols(stats) == 3 &&
              tensor_rows(stats) == tensor_rows(h),
          "cross_entropy_stats: stats %s must be f32 (n, 3) for h %s", DESC(stats), DESC(h));
    CHECK(w->shape[0] > 0, "cross_entropy_stats: empty vocabulary shard");
    b->ops->cross_entropy_stats(b, stats, h, w, targets, vocab_start, softcap);
    after_op(b);
}

void op_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                              const struct tensor *lse, const struct tensor *stats,
                              const struct tensor *targets)
{
    check_on(b, loss, "cross_entropy_combine loss");
    check_on(b, lse, "cross_entropy_combine lse");
    check_on(b, stats, "cross_entropy_combine stats");
    check_i32(b, targets, "cross_entropy_combine targets");
    int64_t n = tensor_numel(targets);
    check_vector(loss, n, DTYPE_F32, "cross_entropy_combine loss");
    check_vector(lse, n, DTYPE_F32, "cross_entropy_combine lse");
    CHECK(stats->dtype == DTYPE_F32 && tensor_cols(stats) == 3 &&
              (n == 0 || (tensor_rows(stats) % n == 0 && tensor_rows(stats) >= n)),
          "cross_entropy_combine: stats %s must be f32 (n_shards, %lld, 3)", DESC(stats),
          (long long)n);
    CHECK(n == 0 || loss->data != lse->data, "cross_entropy_combine: loss aliases lse");
    if (n == 0) return;
    b->ops->cross_entropy_combine(b, loss, lse, stats, targets);
    after_op(b);
}

void op_cross_entropy_backward(struct backend *b, const struct tensor *dh, const struct tensor *dw,
                               const struct tensor *h, const struct tensor *w,
                               const struct tensor *targets, const struct tensor *lse,
                               const struct tensor *row_scale, float scale, int64_t vocab_start,
                               int accumulate_dh, float softcap)
{
    CHECK(softcap >= 0.0f && isfinite(softcap), "cross_entropy_backward: softcap %g", (double)softcap);
    check_lm_head(b, h, w, targets, vocab_start, "cross_entropy_backward");
    check_float(b, dh, "cross_entropy_backward dh");
    check_same(dh, h, "cross_entropy_backward dh/h");
    CHECK(dh->data != h->data && dh->data != w->data, "cross_entropy_backward: dh aliases h or w");
    if (dw) check_weight_grad(b, dw, w, h->dtype, "cross_entropy_backward dw");
    check_on(b, lse, "cross_entropy_backward lse");
    check_vector(lse, tensor_rows(h), DTYPE_F32, "cross_entropy_backward lse");
    if (row_scale) {
        check_on(b, row_scale, "cross_entropy_backward row_scale");
        check_vector(row_scale, tensor_rows(h), DTYPE_F32, "cross_entropy_backward row_scale");
    }
    b->ops->cross_entropy_backward(b, dh, dw, h, w, targets, lse, row_scale, scale, vocab_start,
                                   accumulate_dh, softcap);
    after_op(b);
}

void op_adamw(struct backend *b, const struct tensor *p, const struct tensor *g,
              const struct tensor *m, const struct tensor *v, const struct adamw_params *hp)
{
    const struct tensor *all[4] = {p, g, m, v};
    static const char *const names[4] = {"adamw p", "adamw g", "adamw m", "adamw v"};
    for (int i = 0; i < 4; i++) {
        check_on(b, all[i], names[i]);
        check_vector(all[i], tensor_numel(p), DTYPE_F32, names[i]);
    }
    CHECK(p->data != g->data && p->data != m->data && p->data != v->data && g->data != m->data &&
              g->data != v->data && m->data != v->data,
          "adamw: p, g, m, v must be distinct buffers");
    CHECK(hp->step >= 1 && hp->beta1 >= 0.0f && hp->beta1 < 1.0f && hp->beta2 >= 0.0f &&
              hp->beta2 < 1.0f && hp->eps >= 0.0f,
          "adamw: step %lld beta1 %g beta2 %g eps %g", (long long)hp->step, (double)hp->beta1,
          (double)hp->beta2, (double)hp->eps);
    b->ops->adamw(b, p, g, m, v, hp);
    after_op(b);
}

void op_sum_squares(struct backend *b, const struct tensor *out, const struct tensor *x)
{
    check_float(b, x, "sum_squares x");
    check_on(b, out, "sum_squares out");
    check_vector(out, 1, DTYPE_F32, "sum_squares out");
    b->ops->sum_squares(b, out, x);
    after_op(b);
}
