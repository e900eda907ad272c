/* kernels/cuda/rmsnorm.cu - op_rmsnorm: out = x / sqrt(mean(x^2) + eps) * weight, per row;
 * out may alias x. op_add_rmsnorm: the residual add x + c before it in the same kernel. One thread block per row, in 16-byte vectors where the row allows. Its backward: a fixed grid of blocks walks the
 * rows, each block summing its rows' weight gradient in its own row of a scratch (blocks, d),
 * then a second kernel adds those rows in order (deterministic).
 * Not here: layernorm (layernorm.cu).
 * Tests: tests/test_ops.c --backend cuda (aliased output, rows not a multiple of 32);
 * tests/test_ops_backward.c --backend cuda (rmsnorm_backward). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

#define RMSNORM_THREADS 256

/* Aliasing is safe: each element is read and written by the same thread, and every read of
 * the sum pass is done before the block reduction returns. With c non-NULL (op_add_rmsnorm) the
 * row is x + c, stored in sum first (op_add's rounding) and read back from there by the same
 * thread, so the norm reads what op_rmsnorm would; sum may alias x or c (element by element). */
template <typename T>
static __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_kernel(T *out, const T *x, const T *weight, int64_t n, int64_t d, float eps, const T *c, T *sum)
{
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * d;
        T *o = out + row * d;
        float ss = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            if (c) cuda_store(sum + row * d + j, cuda_load(xr + j) + cuda_load(c + row * d + j));
            float v = cuda_load((c ? sum : x) + row * d + j);
            ss += v * v;
        }
        ss = cuda_block_sum(ss);
        /* Same order as the CPU: inv = 1 / sqrt(ss / d + eps), then (x * inv) * w. */
        float inv = 1.0f / sqrtf(ss / (float)d + eps);
        const T *src = (c ? sum : x) + row * d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            cuda_store(o + j, cuda_load(src + j) * inv * cuda_load(weight + j));
    }
}

/* The same in 16-byte vectors held in registers between the two passes (x read once): rows
 * of whole vectors, at most RMSNORM_VEC_MAX per thread (d <= 8192 in bf16), 16-byte aligned.
 * The scalar kernel above read a 2048-wide bf16 row in 2-byte loads twice: 7 us a row on an
 * H200 (2026-12-04). Same arithmetic per element; the sum of squares adds in another order.
 * With c, the vector x + c is narrowed to T, stored in sum, and widened again (op_add's rounding). */
#define RMSNORM_VEC_MAX 4

template <typename T>
static __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_vec_kernel(T *out, const T *x, const T *weight, int64_t n, int64_t d, float eps, const T *c, T *sum)
{
    constexpr int V = cuda_vec<T>::N;
    const int nv = (int)(d / V);
    const uint4 *w4 = reinterpret_cast<const uint4 *>(weight);
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const uint4 *xr = reinterpret_cast<const uint4 *>(x + row * d);
        uint4 *o = reinterpret_cast<uint4 *>(out + row * d);
        float f[RMSNORM_VEC_MAX][V];
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < RMSNORM_VEC_MAX; k++) {
            const int j = threadIdx.x + k * RMSNORM_THREADS;
            if (j < nv) {
                cuda_vec<T>::widen(xr[j], f[k]);
                if (c) {
                    float g[V];
                    cuda_vec<T>::widen(reinterpret_cast<const uint4 *>(c + row * d)[j], g);
#pragma unroll
                    for (int q = 0; q < V; q++) g[q] += f[k][q];
                    const uint4 packed = cuda_vec<T>::narrow(g);
                    reinterpret_cast<uint4 *>(sum + row * d)[j] = packed;
                    cuda_vec<T>::widen(packed, f[k]);
                }
#pragma unroll
                for (int q = 0; q < V; q++) ss += f[k][q] * f[k][q];
            }
        }
        ss = cuda_block_sum(ss);
        const float inv = 1.0f / sqrtf(ss / (float)d + eps);
#pragma unroll
        for (int k = 0; k < RMSNORM_VEC_MAX; k++) {
            const int j = threadIdx.x + k * RMSNORM_THREADS;
            if (j < nv) {
                float wf[V];
                cuda_vec<T>::widen(w4[j], wf);
#pragma unroll
                for (int q = 0; q < V; q++) wf[q] = f[k][q] * inv * wf[q];
                o[j] = cuda_vec<T>::narrow(wf);
            }
        }
    }
}

/* out, x (n, d); weight (d); c, sum NULL (op_rmsnorm) or (n, d) (op_add_rmsnorm: x + c into sum). */
static void rmsnorm_launch(struct backend *b, const struct tensor *out, const struct tensor *x,
                           const struct tensor *weight, float eps, const struct tensor *c, const struct tensor *sum)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    const int64_t vn = 16 / (int64_t)dtype_size(x->dtype); /* elements per 16-byte vector */
    const int vec = d % vn == 0 && d / vn <= (int64_t)RMSNORM_VEC_MAX * RMSNORM_THREADS &&
                    (uintptr_t)out->data % 16 == 0 && (uintptr_t)x->data % 16 == 0 &&
                    (uintptr_t)weight->data % 16 == 0 && (!c || ((uintptr_t)c->data % 16 == 0 &&
                                                                   (uintptr_t)sum->data % 16 == 0));
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        const T *cp = c ? (const T *)c->data : (const T *)NULL;
        T *sp = sum ? (T *)sum->data : (T *)NULL;
        if (vec)
            rmsnorm_vec_kernel<T><<<cuda_blocks_for(n, 1), RMSNORM_THREADS, 0, s->stream>>>(
                (T *)out->data, (const T *)x->data, (const T *)weight->data, n, d, eps, cp, sp);
        else
            rmsnorm_kernel<T><<<cuda_blocks_for(n, 1), RMSNORM_THREADS, 0, s->stream>>>(
                (T *)out->data, (const T *)x->data, (const T *)weight->data, n, d, eps, cp, sp);
        LAUNCH_CHECK());
}

void cuda_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                  const struct tensor *weight, float eps)
{
    rmsnorm_launch(b, out, x, weight, eps, NULL, NULL);
}

void cuda_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out, const struct tensor *a,
                      const struct tensor *c, const struct tensor *weight, float eps)
{
    rmsnorm_launch(b, out, a, weight, eps, c, sum);
}

/* Blocks of the backward: the rows of its weight-gradient scratch. */
#define NORM_BACKWARD_BLOCKS 256

/* dx = r (g w) - (r^3 / d) sum(g w x) x per row; partial (gridDim.x, d) or NULL: this block's
 * sum of g x r. dx may alias dout: each element is read and written by one thread, and the
 * reduction pass reads the row before any write. */
template <typename T>
static __global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_backward_kernel(T *dx, float *partial, const T *dout, const T *x, const T *weight,
                        int64_t n, int64_t d, float eps)
{
    float *acc = partial ? partial + (int64_t)blockIdx.x * d : NULL;
    if (acc)
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) acc[j] = 0.0f;
    for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
        const T *xr = x + row * d, *gr = dout + row * d;
        T *o = dx + row * d;
        float ss = 0.0f, dot = 0.0f;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float xv = cuda_load(xr + j);
            ss += xv * xv;
            dot += cuda_load(gr + j) * cuda_load(weight + j) * xv;
        }
        ss = cuda_block_sum(ss);
        dot = cuda_block_sum(dot);
        float r = 1.0f / sqrtf(ss / (float)d + eps), c = r * r * r * dot / (float)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            float g = cuda_load(gr + j), xv = cuda_load(xr + j);
            if (acc) acc[j] += g * xv * r;
            cuda_store(o + j, r * (g * cuda_load(weight + j)) - c * xv);
        }
    }
}

/* dx, dout, x (n, d); weight (d); dweight (d) f32 or x's dtype, or NULL. */
void cuda_rmsnorm_backward(struct backend *b, const struct tensor *dx, const struct tensor *dweight,
                           const struct tensor *dout, const struct tensor *x,
                           const struct tensor *weight, float eps)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_rows(x), d = tensor_cols(x);
    if (n == 0 || d == 0) return;
    int blocks = (int)(n < NORM_BACKWARD_BLOCKS ? n : NORM_BACKWARD_BLOCKS);
    float *partial = dweight ? (float *)cuda_scratch(b, (size_t)blocks * (size_t)d * sizeof(float)) : NULL;
    CUDA_DISPATCH_FLOAT(x->dtype, T,
        rmsnorm_backward_kernel<T><<<blocks, RMSNORM_THREADS, 0, s->stream>>>(
            (T *)dx->data, partial, (const T *)dout->data, (const T *)x->data,
            (const T *)weight->data, n, d, eps);
        LAUNCH_CHECK();
        if (dweight) CUDA_DISPATCH_GRAD(dweight->dtype, T, G,
            cuda_partials_add_kernel<G><<<cuda_blocks_for(d, CUDA_THREADS), CUDA_THREADS, 0,
                                          s->stream>>>((G *)dweight->data, partial, blocks, d);
            LAUNCH_CHECK()));
}
