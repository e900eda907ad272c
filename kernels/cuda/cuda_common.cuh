/* kernels/cuda/cuda_common.cuh - what every CUDA op file shares: the checking wrappers for CUDA
 * and cuBLAS calls and kernel launches, the private backend state, the dtype dispatch, device
 * load/store helpers (f32 arithmetic, one rounding on store), the scalar activations and
 * warp/block reductions.
 * Not here: any op (one .cu file per op), the backend table (backend_cuda.cu), cuBLAS calls
 * other than status-to-string (matmul.cu).
 * Tests: tests/test_ops.c --backend cuda (every op against the CPU reference). */
#ifndef SHARDLM_CUDA_COMMON_CUH
#define SHARDLM_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ops.h"

/* A failed CUDA or cuBLAS call is a bug or a dead device: both abort with file:line, the
 * call's text and the library's own name and description of the error. (Errors a user can
 * cause, out of memory and no device, are turned into an enum status before these run.) */
#define CUDA_CHECK(call)                                                                        \
    do {                                                                                        \
        cudaError_t cuda_check_err_ = (call);                                                   \
        if (cuda_check_err_ != cudaSuccess)                                                     \
            base_check_fail(__FILE__, __LINE__, #call, "CUDA error %s: %s",                     \
                            cudaGetErrorName(cuda_check_err_),                                  \
                            cudaGetErrorString(cuda_check_err_));                               \
    } while (0)

#define CUBLAS_CHECK(call)                                                                      \
    do {                                                                                        \
        cublasStatus_t cublas_check_st_ = (call);                                               \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS)                                          \
            base_check_fail(__FILE__, __LINE__, #call, "cuBLAS error %s: %s",                   \
                            cublasGetStatusName(cublas_check_st_),                              \
                            cublasGetStatusString(cublas_check_st_));                           \
    } while (0)

/* After every kernel launch: reports a bad launch configuration at once (an asynchronous fault
 * inside the kernel surfaces at the next synchronizing call, or at once with
 * SHARDLM_SYNC_CHECK=1). */
#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* Which kernel op_attention uses (attention.cu), read once at backend open from the
 * environment variable SHARDLM_CUDA_ATTENTION: unset or "auto", the split-K decode kernel for
 * decode batches (attention_batch.decode_only) and the tensor-core prefill kernel
 * (attention_train_tc.cu) for the others where it fits, else the simple kernel; "simple", always
 * the simple kernel; "split", the split-K kernel wherever its shape limits allow (any batch);
 * "tc", the tensor-core kernel wherever it fits (decode batches too). */
#define CUDA_SPLIT_WAVES_DEFAULT 4
#define CUDA_SPLIT_MIN_CHUNK_DEFAULT 128
/* Products with at most gemv_rows rows of x in a 16-bit dtype take matmul.cu's own kernel (one
 * warp per output feature, 16-byte loads) instead of cuBLAS, whose kernels for one row read
 * 2048 x 2048 bf16 weights at a third of the bandwidth on an H200 (2026-12-04).
 * SHARDLM_CUDA_GEMV_ROWS (0 .. CUDA_GEMV_MAX_ROWS; 0 = always cuBLAS) overrides the default. */
#define CUDA_GEMV_MAX_ROWS 8
#define CUDA_GEMV_ROWS_DEFAULT 8
/* The gemv kernel's warps per output feature (1, 2, 4 or 8: each reads every split-th 16-byte
 * vector of the feature's weights): 0 picks the fewest that give every SM 32 warps of work
 * (n x split >= 32 SMs), so that a product of few features (k and v at 512) still keeps enough
 * loads in flight. SHARDLM_CUDA_GEMV_SPLIT overrides it (1 = one warp per feature). */
#define CUDA_GEMV_SPLIT_DEFAULT 0

enum cuda_attention_mode {
    CUDA_ATTENTION_AUTO,
    CUDA_ATTENTION_SIMPLE,
    CUDA_ATTENTION_SPLIT,
    CUDA_ATTENTION_TC,
};

/* The backend's private state (struct backend.impl). One stream per backend: every op and
 * every copy is queued on it, in call order. */
struct cuda_state {
    int            device_id;
    int            n_sms;          /* streaming multiprocessors of the device */
    enum cuda_attention_mode attention_mode;
    /* The split-K decode kernel's split policy (attention.cu): aim at split_waves thread blocks
     * per SM, chunks of at least split_min_chunk positions. SHARDLM_CUDA_SPLIT_WAVES and
     * SHARDLM_CUDA_SPLIT_MIN_CHUNK override the defaults (for tuning; bench_cuda). */
    int            split_waves, split_min_chunk;
    int            gemv_rows;  /* see CUDA_GEMV_ROWS_DEFAULT */
    int            gemv_split; /* see CUDA_GEMV_SPLIT_DEFAULT */
    int            train_attention_tc; /* 0 CUDA cores, 1 tensor cores where they fit, 2 forced (head_dim 96 too):
                                          CUDA_TRAIN_ATTENTION_TC_DEFAULT (ops.h) */
    /* Serving's prefill attention on the tensor cores, per dtype (bf16, f16) and head_dim (32, 64,
     * 128): 0 not yet checked, 1 its first batch agreed with the simple kernel, -1 it did not (the
     * simple kernel from then on). attention.cu tc_prefill_first. */
    int            tc_prefill_state[2][3];
    cudaStream_t   stream;
    cublasHandle_t cublas; /* bound to stream; created, used and destroyed only by matmul.cu */
    void          *cublas_workspace; /* cuBLAS's workspace, ours (matmul.cu: none allocated in a capture) */
    void          *scratch;       /* device memory for ops' temporaries (cuda_scratch) */
    size_t         scratch_bytes;
    /* matmul.cu's f32 products before the bias is added (16-bit outputs with a bias), allocated
     * once at open: (matmul_scratch_floats) floats */
    float         *matmul_scratch;
    size_t         matmul_scratch_floats;
    /* A graph being captured (backend_cuda.cu's graph slots): the stream records instead of
     * running, and what capture cannot hold (an upload, a download, a synchronize, an alloc, the
     * op scratch growing) is not done but named here, which fails the capture at its end. */
    int            capturing;
    const char    *capture_failed;
};

/* A device area of at least nbytes (256-byte aligned) for one op's temporaries: it grows to the
 * largest request and then stays, like the CPU backend's scratch arena. Valid until the next
 * cuda_scratch call; ops queued on the stream may use it, since they run in order. Growing
 * waits for the stream first (queued ops may still read the old area). Out of device memory
 * here is a CHECK failure: the engine sizes its work so that the largest request comes
 * early. Defined in backend_cuda.cu. */
void *cuda_scratch(struct backend *b, size_t nbytes);

/* Rounds a byte count up to the 256-byte alignment of allocations, for carving scratch. */
static inline size_t cuda_align(size_t nbytes) { return (nbytes + 255) & ~(size_t)255; }

/* Every entry point starts here: the backend may be driven from a thread other than the one
 * that opened it, and CUDA's current device is per host thread. */
static inline struct cuda_state *cuda_state_enter(struct backend *b)
{
    struct cuda_state *s = (struct cuda_state *)b->impl;
    CUDA_CHECK(cudaSetDevice(s->device_id));
    return s;
}

/* Elementwise kernels run grid-stride loops; the grid is capped so that any int64 size fits
 * the launch limits. */
#define CUDA_THREADS 256
#define CUDA_MAX_BLOCKS 65536

static inline unsigned cuda_blocks_for(int64_t n, int threads)
{
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    return (unsigned)(blocks < CUDA_MAX_BLOCKS ? blocks : CUDA_MAX_BLOCKS);
}

/* Inside CUDA_DISPATCH_FLOAT: runs the statements with G bound to float when gdtype is f32,
 * else to T (a weight gradient is f32 or the activations' dtype). */
#define CUDA_DISPATCH_GRAD(gdtype, T, G, ...)                                                   \
    do {                                                                                        \
        if ((gdtype) == DTYPE_F32) {                                                            \
            typedef float G;                                                                    \
            __VA_ARGS__;                                                                        \
        } else {                                                                                \
            typedef T G;                                                                        \
            __VA_ARGS__;                                                                        \
        }                                                                                       \
    } while (0)

/* Runs the statements after T with T bound to the storage type of the float dtype `dtype`
 * (float, __nv_bfloat16 or __half): one template instantiation per dtype, no more. */
#define CUDA_DISPATCH_FLOAT(dtype, T, ...)                                                      \
    do {                                                                                        \
        switch (dtype) {                                                                        \
        case DTYPE_F32: {                                                                       \
            typedef float T;                                                                    \
            __VA_ARGS__;                                                                        \
        } break;                                                                                \
        case DTYPE_BF16: {                                                                      \
            typedef __nv_bfloat16 T;                                                            \
            __VA_ARGS__;                                                                        \
        } break;                                                                                \
        case DTYPE_F16: {                                                                       \
            typedef __half T;                                                                   \
            __VA_ARGS__;                                                                        \
        } break;                                                                                \
        default: CHECK(0, "dtype %s is not a float dtype", dtype_name(dtype));                 \
        }                                                                                       \
    } while (0)

/* ---- device side ------------------------------------------------------------------------ */

/* Widening loads and rounding (to nearest even) stores: kernels compute in f32 and round once,
 * on store, like the CPU reference. */
/* A score or logit soft-capped (ops.h: cap * tanh(s / cap); cap 0 = none), and the cap's
 * derivative at its output z: 1 - (z / cap)^2. */
__device__ __forceinline__ float cuda_softcap(float s, float cap) { return cap > 0.0f ? cap * tanhf(s / cap) : s; }
__device__ __forceinline__ float cuda_softcap_grad(float z, float cap)
{
    return cap > 0.0f ? 1.0f - (z / cap) * (z / cap) : 1.0f;
}

__device__ __forceinline__ float cuda_load(const float *p) { return *p; }
__device__ __forceinline__ float cuda_load(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ float cuda_load(const __half *p) { return __half2float(*p); }

__device__ __forceinline__ void cuda_store(float *p, float v) { *p = v; }
__device__ __forceinline__ void cuda_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void cuda_store(__half *p, float v) { *p = __float2half_rn(v); }

/* 16-byte vectors: N elements of T per uint4, widened to f32, or narrowed from f32 with the
 * same round-to-nearest as cuda_store, element by element. */
template <typename T> struct cuda_vec;
template <> struct cuda_vec<float> {
    static constexpr int N = 4;
    static __device__ __forceinline__ void widen(const uint4 &r, float *f)
    {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    }
    static __device__ __forceinline__ uint4 narrow(const float *f)
    {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
    }
};
/* bf16 and f16: four pairs a vector, converted by the pair type's intrinsics. */
__device__ __forceinline__ float2 cuda_widen2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 cuda_widen2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ void cuda_narrow2(__nv_bfloat162 *h, float a, float b) { *h = __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ void cuda_narrow2(__half2 *h, float a, float b) { *h = __floats2half2_rn(a, b); }
template <typename T2> struct cuda_vec_pairs {
    static constexpr int N = 8;
    static __device__ __forceinline__ void widen(const uint4 &r, float *f)
    {
        const T2 *h = reinterpret_cast<const T2 *>(&r);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 x = cuda_widen2(h[i]);
            f[2 * i] = x.x;
            f[2 * i + 1] = x.y;
        }
    }
    static __device__ __forceinline__ uint4 narrow(const float *f)
    {
        uint4 r;
        T2 *h = reinterpret_cast<T2 *>(&r);
#pragma unroll
        for (int i = 0; i < 4; i++) cuda_narrow2(h + i, f[2 * i], f[2 * i + 1]);
        return r;
    }
};
template <> struct cuda_vec<__nv_bfloat16> : cuda_vec_pairs<__nv_bfloat162> {};
template <> struct cuda_vec<__half> : cuda_vec_pairs<__half2> {};

/* The device's CHECK, for the invariants the CPU backend CHECKs on index data that lives in
 * device memory here (a slot, a position, a block id out of range): the kernel stops rather
 * than read or write out of bounds. The printed line says which check; the host sees a CUDA
 * error (the context is lost) at the next checked call, at once with SHARDLM_SYNC_CHECK=1.
 * Kept out of line so that the hot path carries only the compare. */
static __device__ __noinline__ void cuda_device_check_fail(const char *file, int line,
                                                           const char *cond)
{
    printf("%s:%d: device CHECK(%s) failed (block %d, thread %d)\n", file, line, cond,
           (int)blockIdx.x, (int)threadIdx.x);
    __trap();
}

#define DEVICE_CHECK(cond)                                                                      \
    do {                                                                                        \
        if (!(cond)) cuda_device_check_fail(__FILE__, __LINE__, #cond);                         \
    } while (0)

/* ACTIVATION_SWIGLU_OAI's constants, the CPU's ACT_OAI_ALPHA and ACT_OAI_LIMIT (cpu_ops.h). */
#define CUDA_ACT_OAI_ALPHA 1.702f
#define CUDA_ACT_OAI_LIMIT 7.0f

/* The scalar activations of enum activation, shared by activation.cu and gated_activation.cu:
 * the CPU reference's formulas (kernels/cpu/activation.c), term for term; for
 * ACTIVATION_SWIGLU_OAI the gate's part (cuda_gated_up below is the up's). */
__device__ __forceinline__ float cuda_activate(float x, enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: return x / (1.0f + expf(-x));
    case ACTIVATION_GELU_TANH: {
        const float k = 0.7978845608028654f; /* sqrt(2/pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    case ACTIVATION_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    case ACTIVATION_SWIGLU_OAI: { /* the gate's part: g sigmoid(1.702 g), g = min(x, 7) */
        const float g = x > CUDA_ACT_OAI_LIMIT ? CUDA_ACT_OAI_LIMIT : x; /* a NaN stays NaN */
        return g / (1.0f + expf(-CUDA_ACT_OAI_ALPHA * g));
    }
    }
    return x;
}

/* d act / dx, the CPU reference's formulas (cpu_activate_grad in kernels/cpu/activation.c),
 * term for term. */
__device__ __forceinline__ float cuda_activate_grad(float x, enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: {
        float s = 1.0f / (1.0f + expf(-x));
        return s * (1.0f + x * (1.0f - s));
    }
    case ACTIVATION_GELU_TANH: {
        const float k = 0.7978845608028654f, c = 0.044715f;
        float x2 = x * x, t = tanhf(k * (x + c * x * x2));
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x2);
    }
    case ACTIVATION_GELU_ERF:
        return 0.5f * (1.0f + erff(x * 0.7071067811865476f)) +
               x * 0.3989422804014327f * expf(-0.5f * x * x);
    case ACTIVATION_SWIGLU_OAI: { /* of the gate's part: 0 above the clamp */
        if (x > CUDA_ACT_OAI_LIMIT) return 0.0f;
        const float s = 1.0f / (1.0f + expf(-CUDA_ACT_OAI_ALPHA * x));
        return s * (1.0f + CUDA_ACT_OAI_ALPHA * x * (1.0f - s));
    }
    }
    return 1.0f;
}

/* Up's part of a gated activation: clamp(u, -7, 7) + 1 for ACTIVATION_SWIGLU_OAI, u for the
 * others (cpu_gated_up in kernels/cpu/cpu_ops.h). */
__device__ __forceinline__ float cuda_gated_up(float u, enum activation act)
{
    if (act != ACTIVATION_SWIGLU_OAI) return u;
    /* The CPU's comparisons, not fminf/fmaxf: a NaN up stays NaN, as there. */
    const float lim = CUDA_ACT_OAI_LIMIT;
    return (u < -lim ? -lim : u > lim ? lim : u) + 1.0f;
}

/* *p += v with one atomic read-modify-write; half-precision p rounds the sum once (v is exactly
 * representable in p's type wherever it is used: the embedding backwards add rows of the
 * table's own dtype). bf16 atomics need sm_80, which the backend requires. */
__device__ __forceinline__ void cuda_atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void cuda_atomic_add(__nv_bfloat16 *p, float v)
{
    atomicAdd(p, __float2bfloat16_rn(v));
}
__device__ __forceinline__ void cuda_atomic_add(__half *p, float v)
{
    atomicAdd(p, __float2half_rn(v));
}

/* For the norms' weight gradients: grad[j] += sum over b < blocks of partial[b * d + j], in b
 * order (deterministic), partial f32 (blocks, d). One thread per column. */
template <typename G>
static __global__ void cuda_partials_add_kernel(G *grad, const float *partial, int blocks, int64_t d)
{
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < d;
         j += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int k = 0; k < blocks; k++) s += partial[(int64_t)k * d + j];
        cuda_store(grad + j, cuda_load(grad + j) + s);
    }
}

/* Warp and block reductions. Every thread of the block must call the block ones (they
 * synchronize), and every thread gets the result. blockDim.x must be a multiple of 32. */
__device__ __forceinline__ float cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cuda_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float cuda_block_sum(float v)
{
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cuda_warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? partial[lane] : 0.0f;
        v = cuda_warp_sum(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    v = total;
    __syncthreads(); /* a following call may overwrite partial and total */
    return v;
}

__device__ __forceinline__ float cuda_block_max(float v)
{
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    v = cuda_warp_max(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < n_warps ? partial[lane] : -INFINITY;
        v = cuda_warp_max(v);
        if (lane == 0) total = v;
    }
    __syncthreads();
    v = total;
    __syncthreads();
    return v;
}

#endif
