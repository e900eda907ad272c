/* kernels/cuda/cross_entropy.cu - the fused LM-head cross-entropy (ops.h: its three ops and
 * their vocab-parallel contract): the logits of a chunk of vocabulary columns are formed in f32
 * by cuBLAS (cuda_gemm, matmul.cu), reduced per row (stats) or turned into their gradient,
 * rounded to the storage dtype as the CPU backend does, and multiplied back into dh and dw.
 * Not here: the all-gather and all-reduce between the ops (engine/parallel), the mean over
 * tokens (the caller's row_scale or scale).
 * Tests: tests/test_ops_backward.c --backend cuda (cross_entropy cases, against the CPU). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define CE_THREADS 256

/* Vocabulary columns per chunk: the chunk's logits, (n, chunk) f32, are bounded by 2^24 floats
 * (64 MiB), within [256, 8192] columns. */
static int64_t ce_chunk(int64_t n, int64_t vocab_local)
{
    int64_t c = ((int64_t)1 << 24) / (n > 0 ? n : 1);
    c = c < 256 ? 256 : c > 8192 ? 8192 : c;
    return c < vocab_local ? c : vocab_local;
}

/* Folds the chunk z (n, cc) into the running per-row (max, sum of exp, target logit) in stats
 * (n, 3); first: the first chunk (stats hold garbage). One block per row. Every thread reads
 * the old max before the first block reduction; thread 0 writes after the last. */
static __global__ void __launch_bounds__(CE_THREADS)
ce_stats_chunk_kernel(float *stats, const float *z, const int32_t *targets, int64_t n, int64_t cc,
                      int64_t col0, int first)
{
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const float *zr = z + row * cc;
        float m_old = first ? -INFINITY : stats[3 * row], s_old = first ? 0.0f : stats[3 * row + 1];
        float mx = m_old;
        for (int64_t j = threadIdx.x; j < cc; j += blockDim.x) mx = fmaxf(mx, zr[j]);
        mx = cuda_block_max(mx);
        float sum = 0.0f;
        for (int64_t j = threadIdx.x; j < cc; j += blockDim.x) sum += expf(zr[j] - mx);
        sum = cuda_block_sum(sum);
        if (threadIdx.x == 0) {
            stats[3 * row] = mx;
            stats[3 * row + 1] = (m_old == mx ? s_old : s_old * expf(m_old - mx)) + sum;
            int64_t t = (int64_t)targets[row] - col0;
            if (first) stats[3 * row + 2] = 0.0f;
            if (targets[row] >= 0 && t >= 0 && t < cc) stats[3 * row + 2] = zr[t];
        }
    }
}

/* z[0 .. n) = cap * tanh(z / cap): the logits soft-capped (ops.h). */
static __global__ void ce_softcap_kernel(float *z, int64_t n, float cap)
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x)
        z[e] = cuda_softcap(z[e], cap);
}

static void ce_softcap(struct cuda_state *s, float *z, int64_t n, float cap)
{
    if (cap <= 0.0f) return;
    ce_softcap_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(z, n, cap);
    LAUNCH_CHECK();
}

/* stats (n, 3) of this shard: w (vocab_local, d) rows vocab_start.. */
void cuda_cross_entropy_stats(struct backend *b, const struct tensor *stats, const struct tensor *h,
                              const struct tensor *w, const struct tensor *targets,
                              int64_t vocab_start, float softcap)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(h), d = tensor_cols(h), vl = w->shape[0];
    if (n == 0) return;
    const int64_t chunk = ce_chunk(n, vl);
    float *z = (float *)cuda_scratch(b, (size_t)(n * chunk) * sizeof(float));
    const size_t es = dtype_size(w->dtype);
    for (int64_t c0 = 0; c0 < vl; c0 += chunk) {
        const int64_t cc = vl - c0 < chunk ? vl - c0 : chunk;
        /* z (n, cc) = h (n, d) @ w[c0 .. c0 + cc)^T */
        cuda_gemm(s, 0, 1, n, cc, d, h->data, d, (const char *)w->data + (size_t)(c0 * d) * es, d,
                  h->dtype, 0.0f, z, cc, DTYPE_F32, NULL, 0);
        ce_softcap(s, z, n * cc, softcap);
        ce_stats_chunk_kernel<<<cuda_blocks_for(n, 1), CE_THREADS, 0, s->stream>>>(
            (float *)stats->data, z, (const int32_t *)targets->data, n, cc, vocab_start + c0,
            c0 == 0);
        LAUNCH_CHECK();
    }
}

/* One thread per row, over the shards in order; in double, as the CPU backend. */
static __global__ void ce_combine_kernel(float *loss, float *lse, const float *stats,
                                         const int32_t *targets, int64_t n, int64_t shards)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        double mx = -INFINITY, sum = 0.0, zt = 0.0;
        for (int64_t k = 0; k < shards; k++) mx = fmax(mx, (double)stats[3 * (k * n + i)]);
        for (int64_t k = 0; k < shards; k++) {
            const float *r = stats + 3 * (k * n + i);
            sum += (double)r[1] * exp((double)r[0] - mx);
            zt += r[2];
        }
        double l = mx + log(sum);
        lse[i] = (float)l;
        loss[i] = targets[i] < 0 ? 0.0f : (float)(l - zt);
    }
}

void cuda_cross_entropy_combine(struct backend *b, const struct tensor *loss,
                                const struct tensor *lse, const struct tensor *stats,
                                const struct tensor *targets)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_numel(targets), shards = tensor_rows(stats) / n;
    ce_combine_kernel<<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
        (float *)loss->data, (float *)lse->data, (const float *)stats->data,
        (const int32_t *)targets->data, n, shards);
    LAUNCH_CHECK();
}

/* dz (n, cc) = c_i (exp(z - lse_i) - [col == target_i]) rounded to T; c_i = 0 for a masked row.
 * dz may alias z when T is float (elementwise). */
template <typename T>
static __global__ void ce_dz_kernel(T *dz, const float *z, const float *lse, const int32_t *targets,
                                    const float *row_scale, float scale, int64_t n, int64_t cc,
                                    int64_t col0, float softcap)
{
    int64_t total = n * cc;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / cc, j = e % cc;
        int32_t t = targets[i];
        float c = t < 0 ? 0.0f : scale * (row_scale ? row_scale[i] : 1.0f);
        float g = c == 0.0f ? 0.0f : c * (expf(z[e] - lse[i]) - ((int64_t)t - col0 == j ? 1.0f : 0.0f));
        g *= cuda_softcap_grad(z[e], softcap);
        cuda_store(dz + e, g);
    }
}

/* Converts n floats to T (one rounding) or T to floats. */
template <typename T>
static __global__ void ce_convert_kernel(T *dst, const float *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(dst + i, src[i]);
}

template <typename T>
static __global__ void ce_widen_kernel(float *dst, const T *src, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = cuda_load(src + i);
}

/* dh (n, d) = dz @ w (+= with accumulate_dh), dw (vocab_local, d) += dz^T @ h, chunk by chunk:
 * dh is summed in f32 scratch (dh itself when f32) and rounded once at the end. */
void cuda_cross_entropy_backward(struct backend *b, const struct tensor *dh,
                                 const struct tensor *dw, const struct tensor *h,
                                 const struct tensor *w, const struct tensor *targets,
                                 const struct tensor *lse, const struct tensor *row_scale,
                                 float scale, int64_t vocab_start, int accumulate_dh, float softcap)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(h), d = tensor_cols(h), vl = w->shape[0];
    if (n == 0) return;
    const int64_t chunk = ce_chunk(n, vl);
    const enum dtype t = h->dtype;
    const int half = t != DTYPE_F32;
    const size_t es = dtype_size(t);
    /* Scratch: the chunk's logits (n, chunk) f32; their gradient in T (n, chunk) when T is not
     * f32 (else in place); dh's f32 sum (n, d) when dh is not f32; cuda_gemm's room for adding
     * into a half-precision dw. */
    const int64_t tmp_floats = dw && dw->dtype != DTYPE_F32 ? (CUDA_GEMM_TMP_FLOATS > d ? CUDA_GEMM_TMP_FLOATS : d) : 0;
    const size_t zb = cuda_align((size_t)(n * chunk) * sizeof(float));
    const size_t dzb = half ? cuda_align((size_t)(n * chunk) * es) : 0;
    const size_t dhb = half ? cuda_align((size_t)(n * d) * sizeof(float)) : 0;
    char *base = (char *)cuda_scratch(b, zb + dzb + dhb + (size_t)tmp_floats * sizeof(float));
    float *z = (float *)base, *dhf = half ? (float *)(base + zb + dzb) : (float *)dh->data;
    float *tmp = tmp_floats ? (float *)(base + zb + dzb + dhb) : NULL;
    void *dz = half ? (void *)(base + zb) : (void *)z;
    const int64_t nd = n * d;
    if (!accumulate_dh) CUDA_CHECK(cudaMemsetAsync(dhf, 0, (size_t)nd * sizeof(float), s->stream));
    else if (half)
        CUDA_DISPATCH_FLOAT(t, T,
            ce_widen_kernel<T><<<cuda_blocks_for(nd, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
                dhf, (const T *)dh->data, nd);
            LAUNCH_CHECK());
    for (int64_t c0 = 0; c0 < vl; c0 += chunk) {
        const int64_t cc = vl - c0 < chunk ? vl - c0 : chunk;
        const char *wc = (const char *)w->data + (size_t)(c0 * d) * es;
        cuda_gemm(s, 0, 1, n, cc, d, h->data, d, wc, d, t, 0.0f, z, cc, DTYPE_F32, NULL, 0);
        ce_softcap(s, z, n * cc, softcap);
        CUDA_DISPATCH_FLOAT(t, T,
            ce_dz_kernel<T><<<cuda_blocks_for(n * cc, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
                (T *)dz, z, (const float *)lse->data, (const int32_t *)targets->data,
                row_scale ? (const float *)row_scale->data : (const float *)NULL, scale, n, cc,
                vocab_start + c0, softcap);
            LAUNCH_CHECK());
        cuda_gemm(s, 0, 0, n, d, cc, dz, cc, wc, d, t, 1.0f, dhf, d, DTYPE_F32, NULL, 0); /* dh += dz @ wc */
        if (dw) /* dw[c0 .. c0 + cc) += dz^T @ h */
            cuda_gemm(s, 1, 0, cc, d, n, dz, cc, h->data, d, t, 1.0f,
                      (char *)dw->data + (size_t)(c0 * d) * dtype_size(dw->dtype), d, dw->dtype,
                      tmp, tmp_floats);
    }
    if (half)
        CUDA_DISPATCH_FLOAT(t, T,
            ce_convert_kernel<T><<<cuda_blocks_for(nd, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
                (T *)dh->data, dhf, nd);
            LAUNCH_CHECK());
}
