/* kernels/cpu/logit_mass.c - op_logit_mass on the CPU: per row, the sum of the sampler's weights
 * exp((x - max) w) within its floor ((x - max) w >= ln(1e-12)), in f64; and op_logit_draw, plain
 * temperature sampling's draw over a row: the token whose interval of cumulative weight holds u
 * times the total, and how far inside it lies; op_logit_edit, a sampler's edits of single logits
 * (bias, bans, penalties); op_logit_mask, a constraint's masks; op_logit_lse, log-probabilities'
 * normaliser.
 * Tests: tests/test_ops.c (logit_mass and logit_draw cases), tests/test_sampler.c (logit_draw
 * against the host sampler's draws). */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"

/* The largest of x's v values from element row on. */
static float row_max(const struct tensor *x, size_t row, int64_t v)
{
    float m = -INFINITY;
    for (int64_t j = 0; j < v; j++) {
        const float e = dtype_load_f32(x->data, x->dtype, row + (size_t)j);
        if (e > m) m = e;
    }
    return m;
}

void cpu_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                    const struct tensor *inv_temp)
{
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    const float *w = inv_temp->data;
    float *out = mass->data;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        if (!(w[i] > 0.0f)) {
            out[i] = 0.0f;
            continue;
        }
        const float m = row_max(x, (size_t)(i * v), v);
        double s = 0.0;
        for (int64_t j = 0; j < v; j++) {
            const float d = (dtype_load_f32(x->data, x->dtype, (size_t)(i * v + j)) - m) * w[i];
            if (d >= -27.631021f) s += exp((double)d);
        }
        out[i] = (float)s;
    }
}

/* The weights as the host sampler forms them (sampler_exp: base_exp, 0 at or below -87; this file
 * is built for the baseline ISA, as the engine is, so the same bits), the cumulative sums in f64
 * in id order, as sampler_sample's plain-temperature loop adds them. */
static float draw_weight(const struct tensor *x, size_t at, float m, float t)
{
    const float d = (dtype_load_f32(x->data, x->dtype, at) - m) / t;
    return d > -87.0f ? cpu_exp(d) : 0.0f;
}

/* A nucleus candidate: its logit, id and weight (sorted by logit, highest first, ties by id). */
struct nucleus_cand {
    float   x, w;
    int32_t id;
};

static int by_logit_then_id(const void *a, const void *b)
{
    const struct nucleus_cand *p = a, *q = b;
    if (p->x != q->x) return p->x > q->x ? -1 : 1;
    return p->id < q->id ? -1 : p->id > q->id;
}

/* op_logit_draw's top_p row, every sum in the order of engine/serving/sampler.c (candidates, then
 * sampler_sample's walk): the candidates' total in id order, the running sum of w / total in
 * sorted order to the cut, the kept sum and the draw in sorted order. c: scratch for v
 * candidates. */
static void nucleus_draw(const struct tensor *x, size_t row, int64_t v, float t, float top_p, float u,
                         struct nucleus_cand *c, int32_t *id, float *mg)
{
    const float m = row_max(x, row, v), floor_logit = m + t * -27.631021f;
    int64_t n = 0;
    double total = 0.0;
    for (int64_t j = 0; j < v; j++) {
        const float e = dtype_load_f32(x->data, x->dtype, row + (size_t)j);
        if (e >= floor_logit) {
            c[n] = (struct nucleus_cand){e, draw_weight(x, row + (size_t)j, m, t), (int32_t)j};
            total += c[n++].w;
        }
    }
    qsort(c, (size_t)n, sizeof *c, by_logit_then_id);
    double cum = 0.0, cut_margin = 0.0;
    int64_t keep = n;
    for (int64_t k = 0; k < n; k++) {
        const double before = cum;
        cum += c[k].w / total;
        if (cum >= top_p) {
            keep = k + 1;
            cut_margin = fmin(cum - top_p, top_p - before);
            break;
        }
    }
    if (keep == n && !(cum >= top_p)) cut_margin = top_p - cum; /* none reached: every candidate kept */
    double sum = 0.0;
    for (int64_t k = 0; k < keep; k++) sum += c[k].w;
    const double target = (double)u * sum;
    double acc = 0.0;
    for (int64_t k = 0; k < keep; k++) {
        const double before = acc;
        acc += c[k].w;
        if (target < acc) {
            *id = c[k].id, *mg = (float)fmin(cut_margin, fmin(target - before, acc - target) / sum);
            return;
        }
    }
}

void cpu_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                    const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                    const struct tensor *u)
{
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    const float *t = temp->data, *uu = u->data, *tp = top_p ? top_p->data : NULL;
    int32_t *id = ids->data;
    float *mg = margin->data;
    const size_t per = 3 * (size_t)v; /* a nucleus row's candidates, three words each; a plain row's weights */
    int drawn = 0;
    for (int64_t i = 0; i < n; i++) drawn |= t[i] > 0.0f;
    float *scratch = drawn ? cpu_scratch(b, per) : NULL;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        id[i] = -1, mg[i] = 0.0f;
        if (!(t[i] > 0.0f)) continue;
        const size_t row = (size_t)(i * v);
        float *mine = scratch + (size_t)omp_get_thread_num() * cpu_scratch_stride(per);
        if (tp && tp[i] < 1.0f) {
            nucleus_draw(x, row, v, t[i], tp[i], uu[i], (struct nucleus_cand *)mine, id + i, mg + i);
            continue;
        }
        const float m = row_max(x, row, v);
        float *w = mine; /* each weight formed once, for the total and the walk */
        double total = 0.0;
        for (int64_t j = 0; j < v; j++) total += w[j] = draw_weight(x, row + (size_t)j, m, t[i]);
        const double target = (double)uu[i] * total;
        double acc = 0.0;
        for (int64_t j = 0; j < v; j++) {
            if (w[j] == 0.0f) continue;
            const double before = acc;
            acc += w[j];
            if (target < acc) {
                const double lo = target - before, hi = acc - target;
                id[i] = (int32_t)j, mg[i] = (float)((lo < hi ? lo : hi) / total);
                break;
            }
        }
    }
}

void cpu_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *ids,
                    const struct tensor *vals)
{
    (void)b;
    const int64_t e = tensor_numel(ids), n = tensor_rows(x), v = tensor_cols(x);
    const int32_t *r = rows->data, *id = ids->data;
    const float *p = vals->data;
    for (int64_t k = 0; k < e; k++) {
        CHECK(r[k] >= 0 && r[k] < n && id[k] >= 0 && id[k] < v, "logit_edit: entry %lld at (%d, %d) outside (%lld, %lld)",
              (long long)k, r[k], id[k], (long long)n, (long long)v);
        const size_t at = (size_t)r[k] * (size_t)v + (size_t)id[k];
        float l = dtype_load_f32(x->data, x->dtype, at);
        const float add = p[3 * k], rep = p[3 * k + 1], sub = p[3 * k + 2];
        if (add != 0.0f) l += add;
        if (rep != 1.0f) l = l > 0 ? l / rep : l * rep;
        l -= sub;
        dtype_store_f32(x->data, x->dtype, at, l);
    }
}

void cpu_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *mask)
{
    const int64_t m = tensor_numel(rows), n = tensor_rows(x), v = tensor_cols(x), words = tensor_cols(mask);
    const int32_t *r = rows->data;
    const uint32_t *bits = mask->data;
    for (int64_t k = 0; k < m; k++)
        CHECK(r[k] >= 0 && r[k] < n, "logit_mask: row %d of %lld", r[k], (long long)n);
    #pragma omp parallel for schedule(static) if (m * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t k = 0; k < m; k++) {
        const uint32_t *mk = bits + (size_t)k * (size_t)words;
        for (int64_t j = 0; j < v; j++)
            if (!(mk[j >> 5] >> (j & 31) & 1)) dtype_store_f32(x->data, x->dtype, (size_t)r[k] * (size_t)v + (size_t)j, -INFINITY);
    }
}

static float lse_weight(const struct tensor *x, size_t at, float m)
{
    const float d = dtype_load_f32(x->data, x->dtype, at) - m;
    return d > -87.0f ? cpu_exp(d) : 0.0f; /* (sampler_exp) */
}

/* sampler_log_softmax's sum step for step: the weights base_exp(x - m) (the maximum as sampler_max
 * finds it: the rows here are finite), four interleaved f64 sums, (0 + 1) + (2 + 3), the tail. */
void cpu_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want)
{
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    const float *w = want->data;
    float *out = lse->data;
    #pragma omp parallel for schedule(static) if (n * v > CPU_PARALLEL_MIN) num_threads(b->n_threads)
    for (int64_t i = 0; i < n; i++) {
        out[i] = 0.0f;
        if (!(w[i] > 0.0f)) continue;
        const size_t row = (size_t)(i * v);
        const float m = row_max(x, row, v);
        double part[4] = {0.0, 0.0, 0.0, 0.0};
        int64_t j = 0;
        for (; j + 4 <= v; j += 4)
            for (int k = 0; k < 4; k++) part[k] += lse_weight(x, row + (size_t)(j + k), m);
        double sum = (part[0] + part[1]) + (part[2] + part[3]);
        for (; j < v; j++) sum += lse_weight(x, row + (size_t)j, m);
        out[i] = (float)log(sum);
    }
}
