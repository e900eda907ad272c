/* kernels/cuda_emu/emu.h - the CUDA emulator's device side, force-included (-include) into each
 * kernels/cuda/ .cu file after rewrite.py has rewritten its launches: what a host C++ compiler
 * needs to compile CUDA kernels and run them on the CPU, one CUDA thread a fiber
 * (kernels/cuda_emu/README.md).
 * - threadIdx, blockIdx, blockDim, gridDim: the running fiber's and block's.
 * - __shared__ is `static`: blocks run one at a time, so a block's threads share the variable and
 *   the next block reuses it (dynamic shared memory: emu::dynamic_shared, filled with 0xff bytes
 *   before each block, so that a read before any write gives NaN / -1).
 * - __syncthreads, __syncwarp and the warp collectives (__shfl*_sync, __any/__all/__ballot_sync)
 *   switch fibers until every live thread of the block (the mask's live lanes) has arrived; a
 *   block whose threads all wait on barriers that can never open is reported and aborts.
 * - atomics need nothing: fibers switch only inside those calls.
 * - wmma: a fragment is a lane's share of the tile (element e in lane e % 32); mma_sync gathers the
 *   warp's shares (a collective) and sums each element in f32 in k order.
 * Not emulated: the memory model beyond barriers (a kernel that relies on a racy read sees one
 * order), warp-synchronous code without __syncwarp (it would be wrong on a GPU too), timing.
 * The runtime, cuBLAS and the scheduler: emu.cc. */
#ifndef SHARDLM_CUDA_EMU_H
#define SHARDLM_CUDA_EMU_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cublas_v2.h>

/* The execution-space keywords mean nothing to the host compiler (cuda_runtime.h turned them into
 * attributes GCC would warn about). */
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

namespace emu {

/* One CUDA thread: its index, lane and warp within its block. */
struct thread_pos {
    uint3 tid;
    int   linear, lane, warp;
};

extern thread_pos *current;   /* the running fiber's */
extern uint3 block_idx;
extern dim3 block_dim, grid_dim;

/* A launch's configuration, as <<<grid, block, shared bytes, stream>>> gives it. */
struct launch_cfg {
    dim3         grid, block;
    size_t       shared;
    cudaStream_t stream;
};
inline launch_cfg cfg(dim3 g, dim3 b, size_t shared = 0, cudaStream_t st = 0) { return {g, b, shared, st}; }

/* Runs body in every thread of every block of the grid now, or records it into the stream's
 * graph where the stream is capturing; a bad configuration sets the launch error instead, as
 * CUDA does. kernel names the kernel (its address) for the function attributes and reports. */
void submit(const launch_cfg &c, const void *kernel, std::function<void()> body);

template <typename... P, typename... A> void launch(const launch_cfg &c, void (*kernel)(P...), A &&...args)
{
    /* the arguments converted to the parameters' types now, as a launch (and a capture) does */
    std::tuple<typename std::decay<P>::type...> values(std::forward<A>(args)...);
    submit(c, (const void *)kernel, [kernel, values]() { std::apply(kernel, values); });
}

void *dynamic_shared();
void  syncthreads();
/* The warp collectives: every lane in mask that is still running exchanges value (8 bytes) and
 * gets every lane's back (out[32]). */
void  warp_exchange(unsigned mask, uint64_t value, uint64_t *out);
/* The same for up to 64 bytes a lane: all receives the 32 lanes' bytes, lane after lane. */
void  warp_share(unsigned mask, const void *mine, size_t bytes, void *all);
[[noreturn]] void trap();

#ifdef EMU_HOST_SIDE /* the runtime's own (emu.cc, cublas_emu.cc) */
/* Whether [p, p + n) lies inside one device allocation. */
int         in_device(const void *p, size_t n);
/* Runs op now, or records it into the stream's graph where the stream is capturing. */
cudaError_t on_stream(cudaStream_t st, std::function<void()> op);
#endif

template <typename V> inline uint64_t to_bits(V v)
{
    static_assert(sizeof(V) <= 8, "a shuffled value of at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof v);
    return u;
}
template <typename V> inline V from_bits(uint64_t u)
{
    V v;
    memcpy(&v, &u, sizeof v);
    return v;
}

} /* namespace emu */

#ifndef EMU_HOST_SIDE /* (emu.cc: the runtime's own code) */
#define threadIdx (emu::current->tid)
#define blockIdx emu::block_idx
#define blockDim emu::block_dim
#define gridDim emu::grid_dim
#define warpSize 32
#endif

inline void __syncthreads() { emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    uint64_t all[32];
    emu::warp_exchange(mask, 0, all);
}

template <typename V> inline V __shfl_sync(unsigned mask, V v, int src, int width = 32)
{
    uint64_t all[32];
    emu::warp_exchange(mask, emu::to_bits(v), all);
    const int lane = emu::current->lane;
    return emu::from_bits<V>(all[(lane & ~(width - 1)) + (src & (width - 1))]);
}
template <typename V> inline V __shfl_xor_sync(unsigned mask, V v, int lane_mask, int width = 32)
{
    uint64_t all[32];
    emu::warp_exchange(mask, emu::to_bits(v), all);
    const int lane = emu::current->lane, src = lane ^ lane_mask;
    return emu::from_bits<V>(all[src < ((lane & ~(width - 1)) + width) ? src : lane]);
}
template <typename V> inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    uint64_t all[32];
    emu::warp_exchange(mask, emu::to_bits(v), all);
    const int lane = emu::current->lane, src = lane + (int)delta;
    return emu::from_bits<V>(all[(src & ~(width - 1)) == (lane & ~(width - 1)) ? src : lane]);
}
template <typename V> inline V __shfl_up_sync(unsigned mask, V v, unsigned delta, int width = 32)
{
    uint64_t all[32];
    emu::warp_exchange(mask, emu::to_bits(v), all);
    const int lane = emu::current->lane, src = lane - (int)delta;
    return emu::from_bits<V>(all[src >= (lane & ~(width - 1)) ? src : lane]);
}
inline unsigned __ballot_sync(unsigned mask, int pred)
{
    uint64_t all[32];
    emu::warp_exchange(mask, pred != 0, all);
    unsigned bits = 0;
    for (int i = 0; i < 32; i++)
        if ((mask >> i & 1u) && all[i]) bits |= 1u << i;
    return bits;
}
inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, !pred) == 0; }

/* The device's min and max of integers and floats (CUDA declares them for every pair of types). */
template <typename A, typename B> inline typename std::common_type<A, B>::type min(A a, B b)
{
    return b < a ? b : a;
}
template <typename A, typename B> inline typename std::common_type<A, B>::type max(A a, B b)
{
    return a < b ? b : a;
}

/* cuda_runtime.h's C++ form, which a host compiler does not see. */
template <typename... P> inline cudaError_t cudaFuncSetAttribute(void (*f)(P...), enum cudaFuncAttribute a, int v)
{
    return cudaFuncSetAttribute((const void *)f, a, v);
}

/* Atomics: fibers switch only at barriers and collectives, so a plain read-modify-write is one. */
template <typename V> inline V emu_atomic_add(V *p, V v)
{
    V old = *p;
    *p = old + v;
    return old;
}
inline float atomicAdd(float *p, float v) { return emu_atomic_add(p, v); }
inline double atomicAdd(double *p, double v) { return emu_atomic_add(p, v); }
inline int atomicAdd(int *p, int v) { return emu_atomic_add(p, v); }
inline unsigned atomicAdd(unsigned *p, unsigned v) { return emu_atomic_add(p, v); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) { return emu_atomic_add(p, v); }
inline __nv_bfloat16 atomicAdd(__nv_bfloat16 *p, __nv_bfloat16 v)
{
    const __nv_bfloat16 old = *p;
    *p = __float2bfloat16_rn(__bfloat162float(old) + __bfloat162float(v));
    return old;
}
inline __half atomicAdd(__half *p, __half v)
{
    const __half old = *p;
    *p = __float2half_rn(__half2float(old) + __half2float(v));
    return old;
}
template <typename V> inline V atomicMax(V *p, V v)
{
    V old = *p;
    if (v > old) *p = v;
    return old;
}
template <typename V> inline V atomicMin(V *p, V v)
{
    V old = *p;
    if (v < old) *p = v;
    return old;
}
template <typename V> inline V atomicExch(V *p, V v)
{
    V old = *p;
    *p = v;
    return old;
}
template <typename V> inline V atomicCAS(V *p, V compare, V v)
{
    V old = *p;
    if (old == compare) *p = v;
    return old;
}
inline void __threadfence() {}
inline void __threadfence_block() {}

/* The device's arithmetic intrinsics: each one IEEE operation, rounded to nearest (the build has
 * -ffp-contract=off, so the host compiler fuses none either). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float rsqrtf(float a) { return 1.0f / sqrtf(a); }
inline float __expf(float a) { return expf(a); }
inline float __logf(float a) { return logf(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float a) { return a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float __uint_as_float(unsigned u) { return emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return (unsigned)emu::to_bits(f); }
inline float __int_as_float(int u) { return emu::from_bits<float>((uint32_t)u); }
inline int __float_as_int(float f) { return (int)(uint32_t)emu::to_bits(f); }
inline long long __double_as_longlong(double d) { return (long long)emu::to_bits(d); }
inline double __longlong_as_double(long long u) { return emu::from_bits<double>((uint64_t)u); }
inline int __popc(unsigned u) { return __builtin_popcount(u); }
inline int __popcll(unsigned long long u) { return __builtin_popcountll(u); }
inline int __clz(int u) { return u ? __builtin_clz((unsigned)u) : 32; }
inline int __ffs(int u) { return __builtin_ffs(u); }
template <typename V> inline V __ldg(const V *p) { return *p; }
[[noreturn]] inline void __trap() { emu::trap(); }

/* WMMA (mma.h, which compiles to nothing here). A fragment holds one lane's share of the tile,
 * element e (row-major) in lane e % 32, as a GPU spreads it over the warp (its exact layout is
 * unspecified, and no kernel here indexes a fragment): loads and stores move that share only, so a
 * lane reading what another lane stored needs the __syncwarp a GPU needs. mma_sync gathers the
 * warp's shares of a and b (a warp collective) and computes the lane's share of d, each element
 * a k-ordered f32 sum. */
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K> struct tile_shape;
template <int M, int N, int K> struct tile_shape<matrix_a, M, N, K> { enum { rows = M, cols = K }; };
template <int M, int N, int K> struct tile_shape<matrix_b, M, N, K> { enum { rows = K, cols = N }; };
template <int M, int N, int K> struct tile_shape<accumulator, M, N, K> { enum { rows = M, cols = N }; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    enum { rows = tile_shape<Use, M, N, K>::rows, cols = tile_shape<Use, M, N, K>::cols };
    enum { num_elements = rows * cols / 32 };
    T x[num_elements]; /* element e = lane + 32 i of the tile in x[i] */
};

template <typename V> inline float emu_f32(V v) { return (float)v; }
inline float emu_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float emu_f32(__half v) { return __half2float(v); }

template <typename Use, int M, int N, int K, typename T, typename L>
inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const T &v)
{
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}
/* The lane's share of a tile at p (ldm elements between rows, or between columns where col). */
template <typename F, typename T> inline void emu_load(F &f, const T *p, unsigned ldm, bool col)
{
    for (int i = 0; i < F::num_elements; i++) {
        const int e = emu::current->lane + 32 * i, r = e / F::cols, c = e % F::cols;
        f.x[i] = col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c];
    }
}
template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, row_major> &f, const T *p, unsigned ldm)
{
    emu_load(f, p, ldm, false);
}
template <typename Use, int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<Use, M, N, K, T, col_major> &f, const T *p, unsigned ldm)
{
    emu_load(f, p, ldm, true);
}
template <int M, int N, int K, typename T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T, void> &f, const T *p, unsigned ldm, layout_t l)
{
    emu_load(f, p, ldm, l == mem_col_major);
}
template <int M, int N, int K, typename T>
inline void store_matrix_sync(T *p, const fragment<accumulator, M, N, K, T, void> &f, unsigned ldm, layout_t l)
{
    for (int i = 0; i < f.num_elements; i++) {
        const int e = emu::current->lane + 32 * i, r = e / N, c = e % N;
        p[l == mem_col_major ? (size_t)c * ldm + r : (size_t)r * ldm + c] = f.x[i];
    }
}
template <int M, int N, int K, typename TA, typename TB, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, M, N, K, float, void> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                     const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, float, void> &c)
{
    typedef fragment<matrix_a, M, N, K, TA, LA> FA;
    typedef fragment<matrix_b, M, N, K, TB, LB> FB;
    static_assert(FA::num_elements + FB::num_elements <= 16, "a tile share of at most 64 bytes a lane");
    float mine[FA::num_elements + FB::num_elements], all[32][FA::num_elements + FB::num_elements];
    for (int i = 0; i < FA::num_elements; i++) mine[i] = emu_f32(a.x[i]);
    for (int i = 0; i < FB::num_elements; i++) mine[FA::num_elements + i] = emu_f32(b.x[i]);
    emu::warp_share(0xffffffffu, mine, sizeof mine, all);
    for (int i = 0; i < d.num_elements; i++) {
        const int e = emu::current->lane + 32 * i, r = e / N, col = e % N;
        float s = c.x[i];
        for (int k = 0; k < K; k++) {
            const int ea = r * K + k, eb = k * N + col;
            s += all[ea % 32][ea / 32] * all[eb % 32][FA::num_elements + eb / 32];
        }
        d.x[i] = s;
    }
}
} /* namespace wmma */
} /* namespace nvcuda */

#endif
