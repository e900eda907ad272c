/* kernels/cpu/cross_entropy.c - the fused LM-head cross-entropy on the CPU (ops.h: its three
 * ops, their vocab-parallel contract): the logits of a chunk of vocabulary columns are formed
 * in f32 (OpenBLAS through cpu_gemm_*), reduced or turned into their gradient, and dropped.
 * Not here: the all-gather and all-reduce between the ops (engine/parallel), the mean over
 * tokens (the caller's row_scale or scale).
 * Tests: tests/test_ops_backward.c (cross_entropy cases). */
#include <math.h>
#include <string.h>

#include "cpu_ops.h"

/* Vocabulary columns per chunk. The chunk's logits, (n, chunk) f32, are the largest scratch:
 * 2^22 floats (16 MiB) bound them, within [256, 8192] columns. */
static int64_t ce_chunk(int64_t n, int64_t vocab_local)
{
    int64_t c = ((int64_t)1 << 22) / (n > 0 ? n : 1);
    c = c < 256 ? 256 : c > 8192 ? 8192 : c;
    return c < vocab_local ? c : vocab_local;
}

/* z[0 .. n) = cap * tanh(z / cap), the logits soft-capped (ops.h). */
static void softcap_rows(struct backend *b, float *z, int64_t n, float cap)
{
    const float inv = 1.0f / cap;
    #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (n > CPU_PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++) z[i] = cap * tanhf(z[i] * inv);
}

/* Rows [c0, c0 + cc) of w as f32: w itself when f32, else converted into buf. */
static const float *ce_weight_rows(struct backend *b, const struct tensor *w, int64_t c0,
                                   int64_t cc, int64_t d, float *buf)
{
    if (w->dtype == DTYPE_F32) return (const float *)w->data + c0 * d;
    cpu_rows_to_f32(b, buf, w, c0, cc, d);
    return buf;
}

void cpu_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                             const struct tensor *w, const struct tensor *targets,
                             int64_t vocab_start, float softcap)
{
    const int64_t n = tensor_rows(h), d = tensor_cols(h), vl = w->shape[0];
    const int64_t chunk = ce_chunk(n, vl);
    const int half = h->dtype != DTYPE_F32;
    if (n == 0) return;
    /* Scratch: the running sums (n doubles), h widened (n, d), a chunk of w widened
     * (chunk, d), the chunk's logits (n, chunk). */
    const size_t ss = 2 * (size_t)n, hs = half ? (size_t)(n * d) : 0, ws = half ? (size_t)(chunk * d) : 0;
    const size_t total = ss + hs + ws + (size_t)(n * chunk);
    float *base = cpu_scratch(b, (total + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    double *sum = (double *)base;
    float *hf = half ? base + ss : (float *)h->data, *wbuf = base + ss + hs, *z = wbuf + ws;
    if (half) cpu_rows_to_f32(b, hf, h, 0, n, d);
    float *st = stats->data;
    const int32_t *tg = targets->data;
    for (int64_t i = 0; i < n; i++) {
        st[3 * i] = -INFINITY;
        st[3 * i + 2] = 0.0f;
        sum[i] = 0.0;
    }
    for (int64_t c0 = 0; c0 < vl; c0 += chunk) {
        const int64_t cc = vl - c0 < chunk ? vl - c0 : chunk;
        const float *wc = ce_weight_rows(b, w, c0, cc, d, wbuf);
        cpu_gemm_nt(b, n, cc, d, hf, d, wc, d, 0.0f, z, cc); /* z (n, cc) = h @ wc^T */
        if (softcap > 0.0f) softcap_rows(b, z, n * cc, softcap);
        /* The running maximum moves to the chunk's when larger, rescaling the running sum. */
        #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (n * cc > CPU_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            const float *zr = z + i * cc;
            float mx = st[3 * i];
            for (int64_t j = 0; j < cc; j++) mx = zr[j] > mx ? zr[j] : mx;
            double s = mx == st[3 * i] ? sum[i] : sum[i] * exp((double)st[3 * i] - (double)mx);
            for (int64_t j = 0; j < cc; j++) s += (double)expf(zr[j] - mx);
            st[3 * i] = mx;
            sum[i] = s;
            int64_t t = (int64_t)tg[i] - vocab_start - c0;
            if (tg[i] >= 0 && t >= 0 && t < cc) st[3 * i + 2] = zr[t];
        }
    }
    for (int64_t i = 0; i < n; i++) st[3 * i + 1] = (float)sum[i];
}

void cpu_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                               const struct tensor *lse, const struct tensor *stats,
                               const struct tensor *targets)
{
    (void)b;
    const int64_t n = tensor_numel(targets), shards = tensor_rows(stats) / n;
    const float *st = stats->data;
    const int32_t *tg = targets->data;
    float *lo = loss->data, *ls = lse->data;
    for (int64_t i = 0; i < n; i++) {
        double mx = -INFINITY, s = 0.0, zt = 0.0;
        for (int64_t k = 0; k < shards; k++) mx = fmax(mx, st[3 * (k * n + i)]);
        for (int64_t k = 0; k < shards; k++) {
            const float *r = st + 3 * (k * n + i);
            s += (double)r[1] * exp((double)r[0] - mx);
            zt += r[2]; /* 0 on every shard but the target's */
        }
        double l = mx + log(s);
        ls[i] = (float)l;
        lo[i] = tg[i] < 0 ? 0.0f : (float)(l - zt);
    }
}

/* v rounded to the storage dtype t (and back to f32). */
static float round_to(float v, enum dtype t)
{
    switch (t) {
    case DTYPE_BF16: return bf16_to_f32(f32_to_bf16(v));
    case DTYPE_F16: return f16_to_f32(f32_to_f16(v));
    default: return v;
    }
}

void cpu_cross_entropy_backward(struct backend *b, const struct tensor *dh, const struct tensor *dw,
                                const struct tensor *h, const struct tensor *w,
                                const struct tensor *targets, const struct tensor *lse,
                                const struct tensor *row_scale, float scale, int64_t vocab_start,
                                int accumulate_dh, float softcap)
{
    const int64_t n = tensor_rows(h), d = tensor_cols(h), vl = w->shape[0];
    const int64_t chunk = ce_chunk(n, vl);
    const int half = h->dtype != DTYPE_F32, dw_half = dw && dw->dtype != DTYPE_F32;
    if (n == 0) return;
    /* Scratch: h widened (n, d), dh's f32 sum (n, d), a chunk of w widened (chunk, d), a chunk
     * of a half-precision dw (chunk, d), the chunk's logits and then their gradient (n, chunk). */
    const size_t hs = half ? (size_t)(n * d) : 0, ws = half ? (size_t)(chunk * d) : 0;
    const size_t dws = dw_half ? (size_t)(chunk * d) : 0;
    const size_t total = 2 * hs + ws + dws + (size_t)(n * chunk);
    float *base = cpu_scratch(b, (total + (size_t)b->n_threads - 1) / (size_t)b->n_threads);
    float *hf = half ? base : (float *)h->data, *dhf = half ? base + hs : (float *)dh->data;
    float *wbuf = base + 2 * hs, *dwbuf = wbuf + ws, *z = dwbuf + dws;
    if (half) cpu_rows_to_f32(b, hf, h, 0, n, d);
    if (!accumulate_dh) memset(dhf, 0, (size_t)(n * d) * sizeof(float));
    else if (half) cpu_rows_to_f32(b, dhf, dh, 0, n, d);
    const int32_t *tg = targets->data;
    const float *ls = lse->data, *rs = row_scale ? row_scale->data : NULL;
    for (int64_t c0 = 0; c0 < vl; c0 += chunk) {
        const int64_t cc = vl - c0 < chunk ? vl - c0 : chunk;
        const float *wc = ce_weight_rows(b, w, c0, cc, d, wbuf);
        cpu_gemm_nt(b, n, cc, d, hf, d, wc, d, 0.0f, z, cc); /* z (n, cc) = h @ wc^T */
        if (softcap > 0.0f) softcap_rows(b, z, n * cc, softcap);
        /* z becomes dz = c_i (softmax - onehot) (times the softcap's derivative 1 - (z / cap)^2),
         * rounded to the storage dtype. */
        #pragma omp parallel for schedule(static) num_threads(b->n_threads) if (n * cc > CPU_PARALLEL_MIN)
        for (int64_t i = 0; i < n; i++) {
            float *zr = z + i * cc;
            const float c = tg[i] < 0 ? 0.0f : scale * (rs ? rs[i] : 1.0f);
            if (c == 0.0f) {
                memset(zr, 0, (size_t)cc * sizeof(float));
                continue;
            }
            const float l = ls[i];
            const int64_t t = (int64_t)tg[i] - vocab_start - c0;
            for (int64_t j = 0; j < cc; j++) {
                float g = c * (expf(zr[j] - l) - (j == t ? 1.0f : 0.0f));
                if (softcap > 0.0f) g *= 1.0f - (zr[j] / softcap) * (zr[j] / softcap);
                zr[j] = round_to(g, h->dtype);
            }
        }
        cpu_gemm_nn(b, n, d, cc, z, cc, wc, d, 1.0f, dhf, d); /* dh (n, d) += dz @ wc */
        if (!dw) continue;
        if (!dw_half) { /* dw[c0 .. c0 + cc) (cc, d) += dz^T @ h */
            cpu_gemm_tn(b, cc, d, n, z, cc, hf, d, 1.0f, (float *)dw->data + c0 * d, d);
        } else {
            cpu_rows_to_f32(b, dwbuf, dw, c0, cc, d);
            cpu_gemm_tn(b, cc, d, n, z, cc, hf, d, 1.0f, dwbuf, d);
            cpu_rows_from_f32(b, dw, dwbuf, c0, cc, d);
        }
    }
    if (half) cpu_rows_from_f32(b, dh, dhf, 0, n, d);
}
