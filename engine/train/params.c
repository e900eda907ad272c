/* engine/train/params.c - tables of trained parameters (params.h).
 * Tests: tests/test_train_step.py. */
#include "params.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum status param_table_add(struct param_table *pt, const char *name, struct tensor *t, int decay)
{
    if (base_grow((void **)&pt->p, &pt->cap, pt->n + 1, sizeof *pt->p))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "params: out of host memory");
    struct param *p = &pt->p[pt->n++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->t = t;
    p->decay = decay;
    p->kind = -1;
    p->layer = -1;
    p->counted = 1;
    p->tp_partial = 0;
    return STATUS_OK;
}

enum status param_table_from_weights(struct param_table *pt, struct model_weights *w, int layer_first)
{
    struct weight_ref *t = malloc((size_t)weights_table_max(w->n_layers) * sizeof *t);
    if (!t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "params: out of host memory");
    const int n = weights_table(w, layer_first, 1, t);
    enum status st = STATUS_OK;
    char name[96];
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        snprintf(name, sizeof name, "%s/%d", weight_kind_name(t[i].kind), t[i].layer);
        st = param_table_add(pt, name, t[i].t, t[i].t->ndim == 2);
        if (st == STATUS_OK) {
            pt->p[pt->n - 1].kind = (int)t[i].kind;
            pt->p[pt->n - 1].layer = t[i].layer;
        }
    }
    free(t);
    return st;
}

void param_table_free(struct param_table *pt)
{
    free(pt->p);
    memset(pt, 0, sizeof *pt);
}

int64_t param_table_numel(const struct param_table *pt)
{
    int64_t n = 0;
    for (size_t i = 0; i < pt->n; i++) n += tensor_numel(pt->p[i].t);
    return n;
}
