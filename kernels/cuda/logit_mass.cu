/* kernels/cuda/logit_mass.cu - op_logit_mass: per row, the sum of the sampler's weights
 * exp((x - max) w) within its floor ((x - max) w >= ln(1e-12)), accumulated in f64. One block per
 * row: the row's maximum (cuda_block_max), then each thread's f64 partial sum, added in a fixed
 * shuffle tree (the same bits on every run).
 * op_logit_draw: plain temperature sampling's draw over a row, the token whose interval of
 * cumulative weight (id order) holds u times the row's total, and how far inside it the target lies;
 * its top_p rows, the nucleus drawn in the sampler's order (logit_nucleus_kernel).
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

/* The sampler's weight of a logit x: sampler_exp((x - m) / t), 0 at or below -87. */
static __device__ __forceinline__ float sampler_weight(float x, float m, float t)
{
    const float d = __fdiv_rn(__fsub_rn(x, m), t);
    return d > -87.0f ? draw_exp(d) : 0.0f;
}

template <typename T>
static __device__ __forceinline__ float draw_weight(const T *xr, int64_t j, float m, float t)
{
    return sampler_weight(cuda_load(xr + j), m, t);
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

/* ---- the nucleus (op_logit_draw's top_p rows) ----
 * One block per top_p row. The candidates (x >= the floor) sorted by logit (highest first, ties by
 * id) are never sorted whole: a token where the running sum of their weights crosses a goal is
 * found by binning the candidates by logit (NUC_BINS even bins over [floor, max]: a lower bin holds
 * only higher logits), summing each bin's weights (f64 shared atomics), finding the bin where the
 * sum crosses, then sorting that bin's members alone (bitonic, in shared memory) and walking them.
 * Twice: the cut (the running sum reaching top_p of the total), then the draw among the kept (the
 * running sum exceeding u times their sum). The sums' order is not the host's: the margins say how
 * far each decision lies from its edge, and the caller takes the token only where that is at least
 * its tolerance. A crossing bin of more than NUC_CAP members (ties by the thousand), no crossing
 * (rounding), or a draw past the cut gives -1: the host samples the row. */
#define NUC_THREADS 1024
#define NUC_BINS 2048
#define NUC_CAP 2048

struct nucleus_smem {
    double mass[NUC_BINS]; /* each bin's weight */
    int    count[NUC_BINS];
    float  cx[NUC_CAP];    /* the crossing bin's members: logits and ids */
    int    cid[NUC_CAP];
    int    bin, n, tok;    /* the crossing bin, its members gathered, the token found (-1: none) */
    float  tok_x;
    double before, lo, hi; /* the weight of the bins before it; the running sum before and at the token */
};

/* The bin of a candidate x: 0 for the row's maximum m, NUC_BINS - 1 at the floor (monotone in x). */
static __device__ __forceinline__ int nucleus_bin(float x, float m, float scale)
{
    const float f = __fmul_rn(__fsub_rn(m, x), scale);
    return f > 0.0f ? (f < (float)(NUC_BINS - 1) ? (int)f : NUC_BINS - 1) : 0;
}

/* Whether candidate (x, id) comes before (y, jd) in the sampler's order. */
static __device__ __forceinline__ bool nucleus_before(float x, int id, float y, int jd)
{
    return x > y || (x == y && id < jd);
}

/* With every thread of the block: the first candidate, in the sampler's order, where the running
 * sum of weights reaches goal (strict: exceeds it); sm->tok, sm->tok_x, sm->lo and sm->hi (the sum
 * before and at it), sm->tok -1 when none is found. */
template <typename T>
static __device__ void nucleus_select(struct nucleus_smem *sm, const T *xr, int64_t v, float m, float t, float floor_logit,
                                      float scale, double goal, bool strict)
{
    for (int b = threadIdx.x; b < NUC_BINS; b += blockDim.x) sm->mass[b] = 0.0, sm->count[b] = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float x = cuda_load(xr + j);
        if (!(x >= floor_logit)) continue;
        const int b = nucleus_bin(x, m, scale);
        atomicAdd(&sm->mass[b], (double)sampler_weight(x, m, t));
        atomicAdd(&sm->count[b], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double acc = 0.0;
        sm->bin = -1, sm->n = 0, sm->tok = -1;
        for (int b = 0; b < NUC_BINS; b++) {
            const double next = acc + sm->mass[b];
            if (strict ? next > goal : next >= goal) {
                sm->bin = b;
                break;
            }
            acc = next;
        }
        sm->before = acc;
    }
    __syncthreads();
    const int bin = sm->bin;
    if (bin < 0 || sm->count[bin] > NUC_CAP) return; /* (every thread reads the same) */
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float x = cuda_load(xr + j);
        if (x >= floor_logit && nucleus_bin(x, m, scale) == bin) {
            const int k = atomicAdd(&sm->n, 1);
            sm->cx[k] = x, sm->cid[k] = (int)j;
        }
    }
    __syncthreads();
    const int n = sm->n;
    int p = 1;
    while (p < n) p <<= 1;
    for (int k = n + threadIdx.x; k < p; k += blockDim.x) sm->cx[k] = -INFINITY, sm->cid[k] = 0x7fffffff;
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1) /* bitonic sort into the sampler's order */
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += blockDim.x) {
                const int l = i ^ j;
                if (l <= i) continue;
                const bool up = (i & k) == 0;
                const bool l_first = nucleus_before(sm->cx[l], sm->cid[l], sm->cx[i], sm->cid[i]);
                if (up ? l_first : !l_first) {
                    const float x = sm->cx[i];
                    const int id = sm->cid[i];
                    sm->cx[i] = sm->cx[l], sm->cid[i] = sm->cid[l];
                    sm->cx[l] = x, sm->cid[l] = id;
                }
            }
            __syncthreads();
        }
    if (threadIdx.x == 0) {
        double acc = sm->before;
        for (int k = 0; k < n; k++) {
            const double lo = acc;
            acc += sampler_weight(sm->cx[k], m, t);
            if (strict ? acc > goal : acc >= goal) {
                sm->tok = sm->cid[k], sm->tok_x = sm->cx[k], sm->lo = lo, sm->hi = acc;
                break;
            }
        }
    }
    __syncthreads();
}

template <typename T>
static __global__ void __launch_bounds__(NUC_THREADS)
logit_nucleus_kernel(int32_t *ids, float *margin, const T *x, const float *temp, const float *top_p, const float *u,
                     int64_t v)
{
    __shared__ struct nucleus_smem sm;
    const int64_t i = blockIdx.x;
    const float t = temp[i], q = top_p[i];
    if (!(t > 0.0f) || !(q < 1.0f)) return; /* not a nucleus row: the plain kernel's (the whole block) */
    const T *xr = x + i * v;
    const float m = row_max(xr, v);
    const float floor_logit = __fadd_rn(m, __fmul_rn(t, -27.631021f)); /* (the host: top + T * ln(1e-12)) */
    const float span = __fsub_rn(m, floor_logit);
    const float scale = span > 0.0f && isfinite(span) ? __fdiv_rn((float)(NUC_BINS - 1), span) : 0.0f;
    double total = 0.0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float e = cuda_load(xr + j);
        if (e >= floor_logit) total += sampler_weight(e, m, t);
    }
    total = mass_block_sum(total);
    nucleus_select(&sm, xr, v, m, t, floor_logit, scale, (double)q * total, false); /* the cut */
    if (sm.tok < 0) {
        if (threadIdx.x == 0) ids[i] = -1, margin[i] = 0.0f;
        return;
    }
    const double kept = sm.hi, cut_margin = fmin(sm.hi / total - (double)q, (double)q - sm.lo / total);
    const float cut_x = sm.tok_x;
    const int cut_id = sm.tok;
    __syncthreads(); /* (every thread has read the cut before the draw's select overwrites it) */
    const double goal = (double)u[i] * kept;
    nucleus_select(&sm, xr, v, m, t, floor_logit, scale, goal, true); /* the draw among the kept */
    if (threadIdx.x == 0) {
        const bool kept_tok = sm.tok >= 0 && !nucleus_before(cut_x, cut_id, sm.tok_x, sm.tok); /* (at or before the cut) */
        ids[i] = kept_tok ? sm.tok : -1;
        margin[i] = kept_tok ? (float)fmin(cut_margin, fmin(goal - sm.lo, sm.hi - goal) / kept) : 0.0f;
    }
}

/* ids i32 (n), margin f32 (n); x any float dtype (n, v); temp, u f32 (n); top_p NULL or f32 (n):
 * the plain rows by logit_draw_kernel, then the top_p rows by logit_nucleus_kernel. */
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
    if (!top_p) return;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        logit_nucleus_kernel<T><<<(unsigned)n, NUC_THREADS, 0, s->stream>>>(
            (int32_t *)ids->data, (float *)margin->data, (const T *)x->data, (const float *)temp->data,
            (const float *)top_p->data, (const float *)u->data, v);
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
