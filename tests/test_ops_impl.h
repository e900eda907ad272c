/* tests/test_ops_impl.h - what test_ops.c shares with test_ops_attention.c (one executable,
 * test_ops): the ops that have a tolerance row, make_tol (the bound of test_ops.c's header), and
 * the attention cases' entry point. */
#ifndef SHARDLM_TEST_OPS_IMPL_H
#define SHARDLM_TEST_OPS_IMPL_H

#include <stddef.h>

#include "op_check.h"

enum op_id {
    OP_POSITION_EMBEDDING_ADD,
    OP_MATMUL,
    OP_RMSNORM,
    OP_LAYERNORM,
    OP_ADD,
    OP_SCALE,
    OP_SOFTCAP,
    OP_SCATTER_ADD,
    OP_ROPE,
    OP_ATTENTION,
    OP_ACTIVATION,
    OP_GATED_ACTIVATION,
    OP_SOFTMAX,
    OP_LOG_SOFTMAX,
    OP_COUNT,
};

struct tolerance {
    double rel;   /* times |want| */
    double abs;   /* times mag */
    double floor; /* absolute */
};

/* Fills tol[i], the bound on |got - want| described at the top of test_ops.c. */
void make_tol(double *tol, enum op_id op, enum dtype t, const double *want, const double *mag, size_t n);

/* kv_write's and attention's cases (test_ops_attention.c), every float dtype. */
void run_attention_cases(struct suite *s);

#endif
