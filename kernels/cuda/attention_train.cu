/* kernels/cuda/attention_train.cu - op_attention_train and op_attention_train_backward on the
 * GPU: causal grouped-query self-attention over the packed documents of a training
 * micro-batch (struct attention_train_batch), flash-style: the attention matrix is never
 * stored; the forward keeps the f32 log-sum-exp of each (row, head), the backward recomputes
 * the probabilities from q, k and it.
 *
 * The simple, correct form (CUDA cores, f32 arithmetic in shared-memory tiles; no tensor
 * cores), the kernels the CPU reference describes:
 * - forward: one block of 4 warps per (tile of TRAIN_BQ query rows, query head); each warp owns
 *   TRAIN_RPW rows. K and V are staged through shared memory TRAIN_BK keys at a time; lane j
 *   computes the score of key j for one row (so no reduction per score), the warp then runs
 *   the online softmax of that row (max and sum across lanes) and adds p_j v_j into the output
 *   accumulator, where lane l holds features l, l + 32, ... (up to 256).
 * - backward, dq: the same blocks; with the probabilities recomputed as
 *   P_ij = exp(s_ij - lse_i), D_i = dout_i . out_i and dS_ij = P_ij (dout_i . v_j - D_i), each
 *   warp adds dS_ij k_j into its rows' dq.
 * - backward, dk and dv: one block per (tile of TRAIN_BKV keys, KV head); each warp owns
 *   TRAIN_KPW keys and visits every query row that attends to them (32 rows at a time, one per
 *   lane) for every query head of the group, adding P_ij dout_i into dv_j and dS_ij q_i into
 *   dk_j. The sums over query rows and over the group stay in registers: no atomics, so the
 *   results are deterministic.
 * Shared-memory rows read across lanes (lane = key or lane = query row) are padded to
 * head_dim + 1 floats, which keeps those reads free of bank conflicts. Scores are
 * (scale * q) . k, the expression the forward normalised, in the backward as well.
 * Keys a row does not attend to (another document, the future, outside the window) carry no
 * weight and are never multiplied in, whatever their values.
 * bf16 and f16 at head_dim 32, 64 and 128 (96 when forced) take the tensor-core form instead where
 * SHARDLM_CUDA_TRAIN_ATTENTION allows it (attention_train_tc.cu).
 * Not here: paged attention for serving (attention.cu).
 * Tests: tests/test_attention_train.c --backend cuda (against the double reference and the
 * CPU backend). */
#include <limits.h>

#include "attention_train.cuh"
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define TRAIN_WARPS 4
#define TRAIN_THREADS (TRAIN_WARPS * 32)
#define TRAIN_MAX_HEAD_DIM 256
#define TRAIN_DPL (TRAIN_MAX_HEAD_DIM / 32) /* features per lane */
#define TRAIN_RPW 4                         /* query rows per warp (forward, dq) */
#define TRAIN_BQ (TRAIN_WARPS * TRAIN_RPW)  /* query rows per block (forward, dq) */
#define TRAIN_BK 32                         /* keys per shared-memory tile: one per lane */
#define TRAIN_KPW 4                         /* keys per warp (dk, dv) */
#define TRAIN_BKV (TRAIN_WARPS * TRAIN_KPW) /* keys per block (dk, dv) */
#define TRAIN_QT 32                         /* query rows per tile (dk, dv): one per lane */
#define FULL_MASK 0xffffffffu

/* Rows first .. first+count-1 (count <= rows) of head h of x (n, heads, hd) into dst (rows,
 * ld) as f32 times alpha; rows past count are zero. All threads of the block take part. */
template <typename T>
__device__ __forceinline__ void train_load_rows(float *dst, int ld, const T *x, int64_t first,
                                                int64_t count, int rows, int heads, int h,
                                                int hd, float alpha)
{
    for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
        const int r = e / hd, d = e % hd;
        dst[r * ld + d] = r < count ? cuda_load(x + ((first + r) * heads + h) * hd + d) * alpha : 0.0f;
    }
}

/* a . b over hd features, both in shared memory (one thread). */
__device__ __forceinline__ float train_dot(const float *a, const float *b, int hd)
{
    float s = 0.0f;
    for (int d = 0; d < hd; d++) s += a[d] * b[d];
    return s;
}

/* out, q (n, n_heads, hd); k, v (n, n_kv_heads, hd); lse f32 (n, n_heads); doc_start i32
 * (n_docs + 1). Shared memory: Qs (BQ, hd) | Ks, Vs (BK, hd + 1). */
template <typename T>
static __global__ void __launch_bounds__(TRAIN_THREADS)
attention_train_forward_kernel(T *out, float *lse, const T *q, const T *k, const T *v,
                               const int32_t *doc_start, int n_docs, int64_t n, int n_heads,
                               int n_kv_heads, int hd, float scale, int window, float softcap,
                               int bidirectional, const float *sinks)
{
    extern __shared__ float smem[];
    const int ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *Qs = smem, *Ks = Qs + TRAIN_BQ * hd, *Vs = Ks + TRAIN_BK * ld;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int64_t r0 = (int64_t)blockIdx.x * TRAIN_BQ;
    const int64_t r1 = r0 + TRAIN_BQ < n ? r0 + TRAIN_BQ : n;

    train_load_rows(Qs, hd, q, r0, r1 - r0, TRAIN_BQ, n_heads, h, hd, scale);
    /* hi: one past the last key a row attends to, itself (causal) or its document's end
     * (bidirectional, window 0). */
    int64_t row[TRAIN_RPW], lo[TRAIN_RPW], hi[TRAIN_RPW];
    float m[TRAIN_RPW], l[TRAIN_RPW], acc[TRAIN_RPW][TRAIN_DPL];
#pragma unroll
    for (int i = 0; i < TRAIN_RPW; i++) {
        row[i] = r0 + warp * TRAIN_RPW + i;
        lo[i] = row[i] < r1 ? train_first_key(doc_start, n_docs, n, row[i], window) : 0;
        hi[i] = row[i] < r1 ? (bidirectional ? train_key_end(doc_start, n_docs, n, row[i], 0) : row[i] + 1) : 0;
        /* A sink (GPT-OSS) starts the softmax as one more score, weight e^0 = 1, with no value. */
        m[i] = sinks ? sinks[h] : -INFINITY;
        l[i] = sinks ? 1.0f : 0.0f;
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) acc[i][t] = 0.0f;
    }

    /* lo and hi are non-decreasing in the row, so the block's keys run from its first row's lo
     * to its last row's hi. */
    const int64_t key_end = bidirectional ? train_key_end(doc_start, n_docs, n, r1 - 1, 0) : r1;
    for (int64_t k0 = train_first_key(doc_start, n_docs, n, r0, window); k0 < key_end; k0 += TRAIN_BK) {
        const int64_t nk = key_end - k0 < TRAIN_BK ? key_end - k0 : TRAIN_BK;
        __syncthreads(); /* the previous tile is consumed */
        train_load_rows(Ks, ld, k, k0, nk, TRAIN_BK, n_kv_heads, kvh, hd, 1.0f);
        train_load_rows(Vs, ld, v, k0, nk, TRAIN_BK, n_kv_heads, kvh, hd, 1.0f);
        __syncthreads();
        const int64_t key = k0 + lane;
#pragma unroll
        for (int i = 0; i < TRAIN_RPW; i++) {
            if (row[i] >= r1) continue; /* warp-uniform */
            const bool valid = key >= lo[i] && key < hi[i];
            const float s = valid ? cuda_softcap(train_dot(Qs + (warp * TRAIN_RPW + i) * hd, Ks + lane * ld, hd),
                                                 softcap)
                                  : -INFINITY;
            /* A NaN score poisons the row (max, sum, output) rather than being skipped. */
            const float tile_max = __any_sync(FULL_MASK, s != s) ? NAN : cuda_warp_max(s);
            if (tile_max == -INFINITY) continue; /* no key of this tile carries weight */
            const float m_new = tile_max > m[i] || tile_max != tile_max ? tile_max : m[i];
            const float corr = expf(m[i] - m_new); /* 0 while m = -inf */
            const float p = valid ? expf(s - m_new) : 0.0f;
            l[i] = l[i] * corr + cuda_warp_sum(p);
            m[i] = m_new;
#pragma unroll
            for (int t = 0; t < TRAIN_DPL; t++) acc[i][t] *= corr;
            for (int j = 0; j < nk; j++) {
                const float pj = __shfl_sync(FULL_MASK, p, j);
                if (pj == 0.0f) continue; /* warp-uniform: masked keys are never multiplied */
#pragma unroll
                for (int t = 0; t < TRAIN_DPL; t++) {
                    const int d = lane + 32 * t;
                    if (d < hd) acc[i][t] += pj * Vs[j * ld + d];
                }
            }
        }
    }

#pragma unroll
    for (int i = 0; i < TRAIN_RPW; i++) {
        if (row[i] >= r1) continue;
        const float inv = 1.0f / l[i]; /* l >= 1: the max score (or the sink) contributes exp(0) */
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) cuda_store(out + (row[i] * n_heads + h) * hd + d, acc[i][t] * inv);
        }
        if (lane == 0) lse[row[i] * n_heads + h] = m[i] + logf(l[i]);
    }
}

/* dq, dout, out, q (n, n_heads, hd); k, v (n, n_kv_heads, hd); lse f32 (n, n_heads).
 * Shared memory: Qs, dOs (BQ, hd) | Ks, Vs (BK, hd + 1). */
template <typename T>
static __global__ void __launch_bounds__(TRAIN_THREADS)
attention_train_dq_kernel(T *dq, const T *dout, const T *out, const float *lse, const T *q,
                          const T *k, const T *v, const int32_t *doc_start, int n_docs, int64_t n,
                          int n_heads, int n_kv_heads, int hd, float scale, int window, float softcap)
{
    extern __shared__ float smem[];
    const int ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *Qs = smem, *dOs = Qs + TRAIN_BQ * hd, *Ks = dOs + TRAIN_BQ * hd, *Vs = Ks + TRAIN_BK * ld;
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int64_t r0 = (int64_t)blockIdx.x * TRAIN_BQ;
    const int64_t r1 = r0 + TRAIN_BQ < n ? r0 + TRAIN_BQ : n;

    train_load_rows(Qs, hd, q, r0, r1 - r0, TRAIN_BQ, n_heads, h, hd, scale);
    train_load_rows(dOs, hd, dout, r0, r1 - r0, TRAIN_BQ, n_heads, h, hd, 1.0f);
    __syncthreads();
    int64_t row[TRAIN_RPW], lo[TRAIN_RPW];
    float D[TRAIN_RPW], L[TRAIN_RPW], acc[TRAIN_RPW][TRAIN_DPL];
#pragma unroll
    for (int i = 0; i < TRAIN_RPW; i++) {
        const int r = warp * TRAIN_RPW + i;
        row[i] = r0 + r;
        lo[i] = 0;
        D[i] = L[i] = 0.0f;
        if (row[i] < r1) { /* warp-uniform */
            lo[i] = train_first_key(doc_start, n_docs, n, row[i], window);
            float part = 0.0f;
            for (int d = lane; d < hd; d += 32)
                part += dOs[r * hd + d] * cuda_load(out + (row[i] * n_heads + h) * hd + d);
            D[i] = cuda_warp_sum(part);
            L[i] = lse[row[i] * n_heads + h];
        }
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) acc[i][t] = 0.0f;
    }

    for (int64_t k0 = train_first_key(doc_start, n_docs, n, r0, window); k0 < r1; k0 += TRAIN_BK) {
        const int64_t nk = r1 - k0 < TRAIN_BK ? r1 - k0 : TRAIN_BK;
        __syncthreads();
        train_load_rows(Ks, ld, k, k0, nk, TRAIN_BK, n_kv_heads, kvh, hd, 1.0f);
        train_load_rows(Vs, ld, v, k0, nk, TRAIN_BK, n_kv_heads, kvh, hd, 1.0f);
        __syncthreads();
        const int64_t key = k0 + lane;
#pragma unroll
        for (int i = 0; i < TRAIN_RPW; i++) {
            if (row[i] >= r1) continue;
            const bool valid = key >= lo[i] && key <= row[i];
            if (!__any_sync(FULL_MASK, valid)) continue;
            const int r = warp * TRAIN_RPW + i;
            float ds = 0.0f;
            if (valid) {
                const float z = cuda_softcap(train_dot(Qs + r * hd, Ks + lane * ld, hd), softcap);
                const float p = expf(z - L[i]);
                ds = p * (train_dot(dOs + r * hd, Vs + lane * ld, hd) - D[i]) * cuda_softcap_grad(z, softcap);
            }
            for (int j = 0; j < nk; j++) {
                const float dsj = __shfl_sync(FULL_MASK, ds, j);
                if (dsj == 0.0f) continue;
#pragma unroll
                for (int t = 0; t < TRAIN_DPL; t++) {
                    const int d = lane + 32 * t;
                    if (d < hd) acc[i][t] += dsj * Ks[j * ld + d];
                }
            }
        }
    }

#pragma unroll
    for (int i = 0; i < TRAIN_RPW; i++) {
        if (row[i] >= r1) continue;
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) cuda_store(dq + (row[i] * n_heads + h) * hd + d, acc[i][t] * scale);
        }
    }
}

/* dk, dv, k, v (n, n_kv_heads, hd); dout, out, q (n, n_heads, hd); lse f32 (n, n_heads).
 * Shared memory: Ks, Vs (BKV, hd) | Qs, dOs (QT, hd + 1) | Ds, Ls (QT). */
template <typename T>
static __global__ void __launch_bounds__(TRAIN_THREADS)
attention_train_dkdv_kernel(T *dk, T *dv, const T *dout, const T *out, const float *lse,
                            const T *q, const T *k, const T *v, const int32_t *doc_start,
                            int n_docs, int64_t n, int n_heads, int n_kv_heads, int hd,
                            float scale, int window, float softcap)
{
    extern __shared__ float smem[];
    const int ld = hd + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float *Ks = smem, *Vs = Ks + TRAIN_BKV * hd, *Qs = Vs + TRAIN_BKV * hd;
    float *dOs = Qs + TRAIN_QT * ld, *Ds = dOs + TRAIN_QT * ld, *Ls = Ds + TRAIN_QT;
    const int kvh = blockIdx.y, group = n_heads / n_kv_heads;
    const int64_t c0 = (int64_t)blockIdx.x * TRAIN_BKV;
    const int64_t c1 = c0 + TRAIN_BKV < n ? c0 + TRAIN_BKV : n;

    train_load_rows(Ks, hd, k, c0, c1 - c0, TRAIN_BKV, n_kv_heads, kvh, hd, 1.0f);
    train_load_rows(Vs, hd, v, c0, c1 - c0, TRAIN_BKV, n_kv_heads, kvh, hd, 1.0f);
    int64_t key[TRAIN_KPW], end[TRAIN_KPW];
    float dka[TRAIN_KPW][TRAIN_DPL], dva[TRAIN_KPW][TRAIN_DPL];
#pragma unroll
    for (int u = 0; u < TRAIN_KPW; u++) {
        key[u] = c0 + warp * TRAIN_KPW + u;
        end[u] = key[u] < c1 ? train_key_end(doc_start, n_docs, n, key[u], window) : 0;
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) dka[u][t] = dva[u][t] = 0.0f;
    }
    /* The end is non-decreasing in the key, so the block's last key reaches furthest. */
    const int64_t reach = train_key_end(doc_start, n_docs, n, c1 - 1, window);

    for (int64_t i0 = c0; i0 < reach; i0 += TRAIN_QT) {
        const int64_t ni = reach - i0 < TRAIN_QT ? reach - i0 : TRAIN_QT;
        const int64_t i = i0 + lane; /* this lane's query row */
        for (int g = 0; g < group; g++) {
            const int h = kvh * group + g;
            __syncthreads(); /* the previous rows are consumed (and Ks, Vs loaded) */
            train_load_rows(Qs, ld, q, i0, ni, TRAIN_QT, n_heads, h, hd, scale);
            train_load_rows(dOs, ld, dout, i0, ni, TRAIN_QT, n_heads, h, hd, 1.0f);
            for (int r = warp; r < ni; r += TRAIN_WARPS) {
                const int64_t off = ((i0 + r) * n_heads + h) * hd;
                float part = 0.0f;
                for (int d = lane; d < hd; d += 32)
                    part += cuda_load(dout + off + d) * cuda_load(out + off + d);
                part = cuda_warp_sum(part);
                if (lane == 0) {
                    Ds[r] = part;
                    Ls[r] = lse[(i0 + r) * n_heads + h];
                }
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < TRAIN_KPW; u++) {
                if (key[u] >= c1) continue; /* warp-uniform */
                const bool valid = lane < ni && i >= key[u] && i < end[u];
                if (!__any_sync(FULL_MASK, valid)) continue;
                const int kr = warp * TRAIN_KPW + u;
                float p = 0.0f, ds = 0.0f;
                if (valid) {
                    const float z = cuda_softcap(train_dot(Qs + lane * ld, Ks + kr * hd, hd), softcap);
                    p = expf(z - Ls[lane]);
                    ds = p * (train_dot(dOs + lane * ld, Vs + kr * hd, hd) - Ds[lane]) * cuda_softcap_grad(z, softcap);
                }
                for (int r = 0; r < ni; r++) {
                    const float pr = __shfl_sync(FULL_MASK, p, r);
                    const float dsr = __shfl_sync(FULL_MASK, ds, r);
                    if (pr == 0.0f && dsr == 0.0f) continue;
#pragma unroll
                    for (int t = 0; t < TRAIN_DPL; t++) {
                        const int d = lane + 32 * t;
                        if (d < hd) {
                            dva[u][t] += pr * dOs[r * ld + d];
                            dka[u][t] += dsr * Qs[r * ld + d]; /* Qs holds scale * q */
                        }
                    }
                }
            }
        }
    }

#pragma unroll
    for (int u = 0; u < TRAIN_KPW; u++) {
        if (key[u] >= c1) continue;
#pragma unroll
        for (int t = 0; t < TRAIN_DPL; t++) {
            const int d = lane + 32 * t;
            if (d < hd) {
                cuda_store(dk + (key[u] * n_kv_heads + kvh) * hd + d, dka[u][t]);
                cuda_store(dv + (key[u] * n_kv_heads + kvh) * hd + d, dva[u][t]);
            }
        }
    }
}

/* Dynamic shared memory of each kernel, in bytes, for head_dim hd. */
static size_t forward_smem(int64_t hd) { return sizeof(float) * (size_t)(TRAIN_BQ * hd + 2 * TRAIN_BK * (hd + 1)); }
static size_t dq_smem(int64_t hd) { return sizeof(float) * (size_t)(2 * TRAIN_BQ * hd + 2 * TRAIN_BK * (hd + 1)); }
static size_t dkdv_smem(int64_t hd)
{
    return sizeof(float) * (size_t)(2 * TRAIN_BKV * hd + 2 * TRAIN_QT * (hd + 1) + 2 * TRAIN_QT);
}

static void check_shapes(const struct tensor *q, const struct tensor *k)
{
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2];
    CHECK(hd <= TRAIN_MAX_HEAD_DIM,
          "attention_train: head_dim %lld; the CUDA backend supports head_dim <= %d", (long long)hd,
          TRAIN_MAX_HEAD_DIM);
    CHECK(n_heads <= 65535 && k->shape[1] <= 65535 && n / TRAIN_BKV < INT_MAX,
          "attention_train: %lld rows x %lld heads too large for the grid", (long long)n,
          (long long)n_heads);
}

void cuda_attention_train(struct backend *b, const struct tensor *out, const struct tensor *lse,
                          const struct tensor *q, const struct tensor *k, const struct tensor *v,
                          const struct attention_train_batch *batch)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2];
    if (n == 0 || n_heads == 0) return;
    check_shapes(q, k);
    if (cuda_attention_train_tc_fits(s, q, k, v)) {
        cuda_attention_train_tc(b, out, lse, q, k, v, batch);
        return;
    }
    const dim3 grid((unsigned)((n + TRAIN_BQ - 1) / TRAIN_BQ), (unsigned)n_heads);
    const size_t smem = forward_smem(hd);
    CUDA_DISPATCH_FLOAT(q->dtype, T,
        CUDA_CHECK(cudaFuncSetAttribute(attention_train_forward_kernel<T>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attention_train_forward_kernel<T><<<grid, TRAIN_THREADS, smem, s->stream>>>(
            (T *)out->data, (float *)lse->data, (const T *)q->data, (const T *)k->data,
            (const T *)v->data, (const int32_t *)batch->doc_start.data, batch->n_docs, n,
            (int)n_heads, (int)k->shape[1], (int)hd, batch->scale, batch->window, batch->softcap,
            batch->bidirectional, (const float *)batch->sinks.data);
        LAUNCH_CHECK());
}

void cuda_attention_train_backward(struct backend *b, const struct tensor *dq,
                                   const struct tensor *dk, const struct tensor *dv,
                                   const struct tensor *dout, const struct tensor *out,
                                   const struct tensor *lse, const struct tensor *q,
                                   const struct tensor *k, const struct tensor *v,
                                   const struct attention_train_batch *batch)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = q->shape[0], n_heads = q->shape[1], hd = q->shape[2], n_kv = k->shape[1];
    if (n == 0 || n_heads == 0) return;
    check_shapes(q, k);
    if (cuda_attention_train_tc_fits(s, q, k, v)) {
        cuda_attention_train_tc_backward(b, dq, dk, dv, dout, out, lse, q, k, v, batch);
        return;
    }
    const dim3 grid_q((unsigned)((n + TRAIN_BQ - 1) / TRAIN_BQ), (unsigned)n_heads);
    const dim3 grid_kv((unsigned)((n + TRAIN_BKV - 1) / TRAIN_BKV), (unsigned)n_kv);
    const size_t smem_q = dq_smem(hd), smem_kv = dkdv_smem(hd);
    CUDA_DISPATCH_FLOAT(q->dtype, T,
        CUDA_CHECK(cudaFuncSetAttribute(attention_train_dq_kernel<T>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
        attention_train_dq_kernel<T><<<grid_q, TRAIN_THREADS, smem_q, s->stream>>>(
            (T *)dq->data, (const T *)dout->data, (const T *)out->data,
            (const float *)lse->data, (const T *)q->data, (const T *)k->data,
            (const T *)v->data, (const int32_t *)batch->doc_start.data, batch->n_docs, n,
            (int)n_heads, (int)n_kv, (int)hd, batch->scale, batch->window, batch->softcap);
        LAUNCH_CHECK();
        CUDA_CHECK(cudaFuncSetAttribute(attention_train_dkdv_kernel<T>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
        attention_train_dkdv_kernel<T><<<grid_kv, TRAIN_THREADS, smem_kv, s->stream>>>(
            (T *)dk->data, (T *)dv->data, (const T *)dout->data, (const T *)out->data,
            (const float *)lse->data, (const T *)q->data, (const T *)k->data,
            (const T *)v->data, (const int32_t *)batch->doc_start.data, batch->n_docs, n,
            (int)n_heads, (int)n_kv, (int)hd, batch->scale, batch->window, batch->softcap);
        LAUNCH_CHECK());
}

#define SINK_THREADS 256

/* dsinks[h] -= sum_i exp(sinks[h] - lse[i,h]) (dout_i . out_i): one block per head, each
 * thread a strided set of rows, then a fixed tree over the block's partial sums (no atomics:
 * the same result on every run). dout, out (n, n_heads, hd); lse f32 (n, n_heads). */
template <typename T>
static __global__ void __launch_bounds__(SINK_THREADS)
attention_sinks_backward_kernel(float *dsinks, const T *dout, const T *out, const float *lse, const float *sinks,
                                int64_t n, int n_heads, int hd)
{
    __shared__ float part[SINK_THREADS];
    const int h = blockIdx.x;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += SINK_THREADS) {
        const T *a = dout + (i * n_heads + h) * hd, *o = out + (i * n_heads + h) * hd;
        float d = 0.0f;
        for (int e = 0; e < hd; e++) d += cuda_load(a + e) * cuda_load(o + e);
        acc += expf(sinks[h] - lse[i * n_heads + h]) * d;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = SINK_THREADS / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) dsinks[h] -= part[0];
}

void cuda_attention_sinks_backward(struct backend *b, const struct tensor *dsinks, const struct tensor *dout,
                                   const struct tensor *out, const struct tensor *lse, const struct tensor *sinks)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = dout->shape[0], n_heads = dout->shape[1], hd = dout->shape[2];
    if (n == 0 || n_heads == 0) return;
    CHECK(n_heads <= INT_MAX && hd <= INT_MAX, "attention_sinks_backward: %lld heads of %lld too large",
          (long long)n_heads, (long long)hd);
    CUDA_DISPATCH_FLOAT(dout->dtype, T,
        attention_sinks_backward_kernel<T><<<(unsigned)n_heads, SINK_THREADS, 0, s->stream>>>(
            (float *)dsinks->data, (const T *)dout->data, (const T *)out->data, (const float *)lse->data,
            (const float *)sinks->data, n, (int)n_heads, (int)hd);
        LAUNCH_CHECK());
}
