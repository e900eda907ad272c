/* kernels/ops_check.h - private to the op_* wrappers (ops.c, ops_train.c): the contract checks
 * every op makes before it calls its backend, and the synchronisation after it under
 * SHARDLM_SYNC_CHECK. A failed check is a caller bug (CHECK aborts with the tensors described). */
#ifndef SHARDLM_OPS_CHECK_H
#define SHARDLM_OPS_CHECK_H

#include "backend_impl.h"
#include "ops.h"

#define DESC(t) tensor_describe((t), (char[64]){0}, 64)

static inline void after_op(struct backend *b)
{
    if (b->sync_check) b->ops->synchronize(b);
}

static inline void check_on(struct backend *b, const struct tensor *t, const char *what)
{
    CHECK(t->device == b->device, "%s is on the wrong device for backend %s", what, b->ops->name);
    CHECK(t->data != NULL || tensor_numel(t) == 0, "%s has no data", what);
}

static inline void check_float(struct backend *b, const struct tensor *t, const char *what)
{
    check_on(b, t, what);
    CHECK(dtype_is_float(t->dtype), "%s must be a float tensor, is %s", what, DESC(t));
}

static inline void check_i32(struct backend *b, const struct tensor *t, const char *what)
{
    check_on(b, t, what);
    CHECK(t->dtype == DTYPE_I32, "%s must be i32, is %s", what, DESC(t));
}

static inline void check_same(const struct tensor *a, const struct tensor *c, const char *what)
{
    CHECK(tensor_same_shape(a, c) && a->dtype == c->dtype, "%s: %s vs %s", what, DESC(a), DESC(c));
}

static inline void check_vector(const struct tensor *t, int64_t n, enum dtype dtype, const char *what)
{
    CHECK(tensor_numel(t) == n && t->dtype == dtype, "%s must be %s[%lld], is %s", what,
          dtype_name(dtype), (long long)n, DESC(t));
}

static inline void check_rope(const struct rope_params *rp, int rot_dim)
{
    CHECK(rp && rp->freqs && rp->attn_factor > 0.0f, "rope: frequencies %s, attn_factor %g",
          rp && rp->freqs ? "given" : "missing", rp ? (double)rp->attn_factor : 0.0);
    CHECK(rot_dim / 2 <= ROPE_MAX_PAIRS, "rope: rot_dim %d, at most %d", rot_dim, 2 * ROPE_MAX_PAIRS);
}

#endif
