/* kernels/cpu/topk.c - op_topk on the CPU: the k largest values per row, descending, ties by
 * lower index, NaN ranked below every number. Small k keeps a sorted insertion list (O(v k));
 * large k sorts the row's indices.
 * Tests: tests/test_ops.c (topk cases). */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"

#define TOPK_INSERTION_MAX 64

/* Whether (a, ia) ranks before (c, ic). */
static int ranks_before(float a, int64_t ia, float c, int64_t ic)
{
    if (isnan(a) || isnan(c)) {
        if (isnan(a) && isnan(c)) return ia < ic;
        return !isnan(a);
    }
    return a > c || (a == c && ia < ic);
}

struct ranked {
    float value;
    int32_t id;
};

static int compare_ranked(const void *pa, const void *pc)
{
    const struct ranked *a = pa, *c = pc;
    return ranks_before(a->value, a->id, c->value, c->id) ? -1 : 1;
}

void cpu_topk(struct backend *b, const struct tensor *values, const struct tensor *ids,
              const struct tensor *x)
{
    int64_t n = tensor_rows(x), v = tensor_cols(x), k = tensor_cols(values);
    float *val_out = values->data;
    int32_t *id_out = ids->data;
    /* struct ranked is two 4-byte fields: v of them fit in 2 v floats of scratch. */
    size_t per = k > TOPK_INSERTION_MAX ? 2 * (size_t)v : 0;
    float *scratch = per ? cpu_scratch(b, per) : NULL;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        float *vo = val_out + i * k;
        int32_t *io = id_out + i * k;
        if (k > TOPK_INSERTION_MAX) {
            struct ranked *r = (struct ranked *)(scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per));
            for (int64_t j = 0; j < v; j++) {
                r[j].value = dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j));
                r[j].id = (int32_t)j;
            }
            qsort(r, (size_t)v, sizeof *r, compare_ranked);
            for (int64_t j = 0; j < k; j++) {
                vo[j] = r[j].value;
                io[j] = r[j].id;
            }
            continue;
        }
        int64_t have = 0;
        for (int64_t j = 0; j < v; j++) {
            float val = dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j));
            if (have == k && !ranks_before(val, j, vo[k - 1], io[k - 1])) continue;
            int64_t at = have < k ? have++ : k - 1;
            while (at > 0 && ranks_before(val, j, vo[at - 1], io[at - 1])) {
                vo[at] = vo[at - 1];
                io[at] = io[at - 1];
                at--;
            }
            vo[at] = val;
            io[at] = (int32_t)j;
        }
    }
}
