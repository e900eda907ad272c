/* kernels/cuda/logit_mass.cu - op_logit_mass: per row, the sum of the sampler's weights
 * exp((x - max) w) within its floor ((x - max) w >= ln(1e-12)), accumulated in f64. One block per
 * row: the row's maximum (cuda_block_max), then each thread's f64 partial sum, added in a fixed
 * shuffle tree (the same bits on every run).
 * Not here: sampling from the sum (engine/serving/sampler.c sampler_sample_nucleus).
 * Tests: tests/test_ops.c --backend cuda (logit_mass cases); written without a GPU, not yet run on one. */
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
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) m = fmaxf(m, cuda_load(xr + j));
    m = cuda_block_max(m);
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
