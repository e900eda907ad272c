/* kernels/cuda/logit_mass.cu - op_logit_mass: per row, the sum of the sampler's weights
 * exp((x - max) w) within its floor ((x - max) w >= ln(1e-12)), accumulated in f64. One block per
 * row: the row's maximum (cuda_block_max), then each thread's f64 partial sum, added in a fixed
 * shuffle tree (the same bits on every run).
 * op_logit_draw: plain temperature sampling's draw over a row, the token whose interval of
 * cumulative weight (id order) holds u times the row's total, and how far inside it the target lies.
 * op_logit_edit: a sampler's edits of single logits (bias, bans, penalties), one thread an entry.
 * op_logit_mask: a constraint's masks, a block per masked row. op_logit_lse: log-probabilities'
 * normaliser, a block per row, the host's weights summed in f64 in a fixed tree.
 * Not here: sampling from the sum (engine/serving/sampler.c sampler_sample_nucleus), deciding
 * whether a draw's margin is wide enough (sampler_draw_decided).
 * Tests: tests/test_ops.c --backend cuda (logit_mass and logit_draw cases); written without a GPU,
 * not yet run on one. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define MASS_THREADS 256

static __device__ __forceinline__ double mass_block_sum(double v)
{
    __shared__ double partial[32];
    __shared__ double total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? partial[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) total = v;
    }
    __syncthreads();
    return total;
}

/* The largest of a row's v values, the whole block's (strided loads, then cuda_block_max). */
template <typename T>
static __device__ __forceinline__ float row_max(const T *xr, int64_t v)
{
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, cuda_load(xr + j));
    return cuda_block_max(m);
}

template <typename T>
static __global__ void __launch_bounds__(MASS_THREADS)
logit_mass_kernel(float *mass, const T *x, const float *inv_temp, int64_t v)
{
    const int64_t i = blockIdx.x;
    const float w = inv_temp[i];
    if (!(w > 0.0f)) { /* (the whole block takes this branch) */
        if (threadIdx.x == 0) mass[i] = 0.0f;
        return;
    }
    const T *xr = x + i * v;
    const float m = row_max(xr, v);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float d = (cuda_load(xr + j) - m) * w;
        if (d >= -27.631021f) s += exp((double)d);
    }
    s = mass_block_sum(s);
    if (threadIdx.x == 0) mass[i] = (float)s;
}

/* mass f32 (n); x any float dtype (n, v); inv_temp f32 (n). */
void cuda_logit_mass(struct backend *b, const struct tensor *mass, const struct tensor *x,
                     const struct tensor *inv_temp)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_mass_kernel<T><<<(unsigned)n, MASS_THREADS, 0, s->stream>>>((float *)mass->data, (const T *)x->data,
                                                                          (const float *)inv_temp->data, v);
        LAUNCH_CHECK());
}

#define DRAW_THREADS 256

/* kernels/base/fastexp.h's base_exp step for step, each product and sum rounded on its own
 * (__fmul_rn / __fadd_rn: nvcc would otherwise fuse them into FMAs, which the host's x86-64 build
 * never does), so that the weights are the host sampler's very bits (sampler_draw_tolerance checks
 * that at startup and loosens the tolerance where they are not). */
static __device__ __forceinline__ float draw_exp(float x)
{
    x = x < -87.0f ? -87.0f : x > 88.0f ? 88.0f : x;
    const float z = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
    const float n = __fsub_rn(z, 12582912.0f);
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0.693359375f)), __fmul_rn(n, -2.12194440e-4f));
    float p = 1.9875691500e-4f;
    p = __fadd_rn(__fmul_rn(p, r), 1.3981999507e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.3334519073e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665795894e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665459e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 5.0000001201e-1f);
    p = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
    const uint32_t bits = (__float_as_uint(z) - 0x4B400000u + 127u) << 23;
    return __fmul_rn(p, __uint_as_float(bits));
}

/* The sampler's weight of element j: sampler_exp((x - m) / t), 0 at or below -87. */
template <typename T>
static __device__ __forceinline__ float draw_weight(const T *xr, int64_t j, float m, float t)
{
    const float d = __fdiv_rn(__fsub_rn(cuda_load(xr + j), m), t);
    return d > -87.0f ? draw_exp(d) : 0.0f;
}

/* One block per row. The maximum (strided, coalesced); then thread k sums the weights of its
 * contiguous chunk of the row in f64, thread 0 turns the chunk sums into each chunk's start, in
 * order, and the one thread whose chunk holds the target walks it token by token. (The chunks
 * are read thread by thread, not coalesced: the second and third passes lean on the L1 cache,
 * 256 threads' current lines.) Where the walk's own running sum ends its chunk short of the
 * target (rounding), no token is written: -1, the host then samples the whole row. */
template <typename T>
static __global__ void __launch_bounds__(DRAW_THREADS)
logit_draw_kernel(int32_t *ids, float *margin, const T *x, const float *temp, const float *top_p, const float *u,
                  int64_t v)
{
    __shared__ double start[DRAW_THREADS + 1];
    const int64_t i = blockIdx.x;
    const float t = temp[i];
    if (!(t > 0.0f) || (top_p && top_p[i] < 1.0f)) { /* (the whole block takes this branch; a nucleus row: not here) */
        if (threadIdx.x == 0) ids[i] = -1, margin[i] = 0.0f;
        return;
    }
    const T *xr = x + i * v;
    const float m = row_max(xr, v);
    const int64_t chunk = (v + DRAW_THREADS - 1) / DRAW_THREADS, j0 = (int64_t)threadIdx.x * chunk;
    const int64_t j1 = j0 + chunk < v ? j0 + chunk : v;
    double sum = 0.0;
    for (int64_t j = j0; j < j1; j++) sum += draw_weight(xr, j, m, t);
    start[threadIdx.x + 1] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        start[0] = 0.0;
        for (int k = 1; k <= DRAW_THREADS; k++) start[k] += start[k - 1];
        ids[i] = -1, margin[i] = 0.0f;
    }
    __syncthreads();
    const double total = start[DRAW_THREADS], target = (double)u[i] * total;
    if (!(target >= start[threadIdx.x] && target < start[threadIdx.x + 1])) return;
    double acc = start[threadIdx.x];
    for (int64_t j = j0; j < j1; j++) {
        const float w = draw_weight(xr, j, m, t);
        if (w == 0.0f) continue;
        const double before = acc;
        acc += w;
        if (target < acc) {
            const double lo = target - before, hi = acc - target;
            ids[i] = (int32_t)j, margin[i] = (float)((lo < hi ? lo : hi) / total);
            return;
        }
    }
}

/* ids i32 (n), margin f32 (n); x any float dtype (n, v); temp, u f32 (n); top_p NULL or f32 (n).
 * A top_p row (top_p < 1) is not drawn on CUDA yet: id -1 (ops.h allows it; the host samples it). */
void cuda_logit_draw(struct backend *b, const struct tensor *ids, const struct tensor *margin,
                     const struct tensor *x, const struct tensor *temp, const struct tensor *top_p,
                     const struct tensor *u)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_draw_kernel<T><<<(unsigned)n, DRAW_THREADS, 0, s->stream>>>(
            (int32_t *)ids->data, (float *)margin->data, (const T *)x->data, (const float *)temp->data,
            top_p ? (const float *)top_p->data : (const float *)NULL, (const float *)u->data, v);
        LAUNCH_CHECK());
}

/* One thread per entry; no (row, id) twice, so no two threads touch one element. The host's
 * arithmetic, each step rounded on its own. */
template <typename T>
static __global__ void logit_edit_kernel(T *x, const int32_t *rows, const int32_t *ids, const float *vals, int64_t e,
                                         int64_t n, int64_t v)
{
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < e; k += (int64_t)gridDim.x * blockDim.x) {
        const int32_t r = rows[k], id = ids[k];
        if (r < 0 || r >= n || id < 0 || id >= v) __trap(); /* a caller bug (ops.h) */
        T *at = x + (int64_t)r * v + id;
        float l = cuda_load(at);
        const float add = vals[3 * k], rep = vals[3 * k + 1], sub = vals[3 * k + 2];
        if (add != 0.0f) l = __fadd_rn(l, add);
        if (rep != 1.0f) l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
        cuda_store(at, __fsub_rn(l, sub));
    }
}

/* x any float dtype (n, v); rows, ids i32 (e); vals f32 (e, 3). */
void cuda_logit_edit(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *ids,
                     const struct tensor *vals)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t e = tensor_numel(ids);
    if (e == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_edit_kernel<T><<<cuda_blocks_for(e, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)x->data, (const int32_t *)rows->data, (const int32_t *)ids->data, (const float *)vals->data, e,
            tensor_rows(x), tensor_cols(x));
        LAUNCH_CHECK());
}

/* One block per masked row (distinct rows), its threads over the row's logits. */
template <typename T>
static __global__ void logit_mask_kernel(T *x, const int32_t *rows, const uint32_t *mask, int64_t words, int64_t n,
                                         int64_t v)
{
    const int32_t r = rows[blockIdx.x];
    if (r < 0 || r >= n) __trap(); /* a caller bug (ops.h) */
    const uint32_t *mk = mask + (int64_t)blockIdx.x * words;
    T *xr = x + (int64_t)r * v;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x)
        if (!(mk[j >> 5] >> (j & 31) & 1u)) cuda_store(xr + j, -INFINITY);
}

/* x any float dtype (n, v); rows i32 (m); mask i32 (m, words). */
void cuda_logit_mask(struct backend *b, const struct tensor *x, const struct tensor *rows, const struct tensor *mask)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t m = tensor_numel(rows);
    if (m == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_mask_kernel<T><<<(unsigned)m, CUDA_THREADS, 0, s->stream>>>(
            (T *)x->data, (const int32_t *)rows->data, (const uint32_t *)mask->data, tensor_cols(mask),
            tensor_rows(x), tensor_cols(x));
        LAUNCH_CHECK());
}

/* One block per row: the maximum, then each thread's f64 sum of its strided weights (base_exp's
 * bits, draw_exp), added in mass_block_sum's fixed tree: not the host's order, which moves the f64
 * sum by about 1e-16 of itself, far below the f32 lse's rounding (so the same lse but where the
 * sum sits within that of a rounding boundary). */
template <typename T>
static __global__ void __launch_bounds__(MASS_THREADS)
logit_lse_kernel(float *lse, const T *x, const float *want, int64_t v)
{
    const int64_t i = blockIdx.x;
    if (!(want[i] > 0.0f)) { /* (the whole block takes this branch) */
        if (threadIdx.x == 0) lse[i] = 0.0f;
        return;
    }
    const T *xr = x + i * v;
    const float m = row_max(xr, v);
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float d = __fsub_rn(cuda_load(xr + j), m);
        s += d > -87.0f ? draw_exp(d) : 0.0f; /* (sampler_exp) */
    }
    s = mass_block_sum(s);
    if (threadIdx.x == 0) lse[i] = (float)log(s);
}

/* lse f32 (n); x any float dtype (n, v); want f32 (n). */
void cuda_logit_lse(struct backend *b, const struct tensor *lse, const struct tensor *x, const struct tensor *want)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t n = tensor_rows(x), v = tensor_cols(x);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_lse_kernel<T><<<(unsigned)n, MASS_THREADS, 0, s->stream>>>((float *)lse->data, (const T *)x->data,
                                                                        (const float *)want->data, v);
        LAUNCH_CHECK());
}
