/* kernels/cuda/matmul_quant.cu - op_matmul on CUDA with w block-quantized (a DTYPE_Q*: ggml
 * blocks in device memory, kernels/quant.h): y (m, n) = x (m, k) @ w^T (+ bias), x, y and bias
 * of one float dtype (f32, bf16 or f16). The weights are dequantized inside the kernels with
 * quant_blocks.cuh, bit-exact with the CPU's quant_dequantize_row; x is NOT quantized (unlike
 * the CPU's int8 product): the result is the f32 product of x (widened to f32, exactly) with the
 * dequantized weights, accumulated in f32, the bias added in f32, rounded once on store.
 *   - m <= QUANT_GEMV_MAX_M (decode): one warp per row of w, each lane decoding the row's
 *     elements lane, lane + 32, ... and multiplying them into up to QUANT_GEMV_MAX_M sums; a
 *     warp reduction; the weights are read once, as blocks.
 *   - larger m (prefill): tiles of w's rows dequantized to f32 in the op scratch, then matmul.cu's
 *     cuBLAS product (cuda_gemm, f32 compute, no TF32), x widened to f32 by chunks of rows when
 *     it is bf16/f16; an epilogue kernel adds the bias and rounds to y's dtype. No tensor cores:
 *     bf16 tensor-core GEMMs would need the weights rounded to bf16, which the bit-exact
 *     contract rules out.
 * No backward (weights as blocks are served, never trained).
 * Not here: cuBLAS calls (matmul.cu, through cuda_gemm), the block formats (quant_blocks.cuh),
 * the embedding lookup from a block table (embedding.cu).
 * Tests: tests/test_ops_quant.c --backend cuda (label gpu: every type and dtype, m 1, 3, 9, 64,
 * 4100, odd n up to 262221, against the f64 product and the CPU backend's f32 product of the
 * dequantized weights); tests/test_quant_blocks.cu (the decoder on the host). Never run on a GPU
 * yet (docs/quantization.md). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"
#include "quant_blocks.cuh"

/* Up to this many rows of x go through the one-pass kernel (each warp keeps one f32 sum per row
 * of x in registers); more go through cuBLAS. */
#define QUANT_GEMV_MAX_M 8
#define QUANT_GEMV_WARPS 4 /* rows of w per block of the one-pass kernel */

/* The f32 scratch of the cuBLAS path, in floats: a tile of dequantized w rows, a chunk of x
 * rows widened to f32 (x bf16/f16), the f32 products before rounding (y bf16/f16). Together
 * 56 MiB at most, taken from the op scratch (cuda_scratch) only as large as a call needs. */
#define QUANT_TILE_W_FLOATS ((int64_t)8 << 20)
#define QUANT_TILE_X_FLOATS ((int64_t)2 << 20)
#define QUANT_TILE_Y_FLOATS ((int64_t)4 << 20)
#define QUANT_TILE_MAX_ROWS 4096 /* rows of x per cuBLAS call: enough to fill the GPU */

/* y (m, n) = x (m, k) @ w^T + bias, m <= QUANT_GEMV_MAX_M; w n rows of row_bytes. A warp per
 * row of w (grid-stride over rows); lane l handles elements l, l + 32, ... of the row, so that a
 * warp decodes 32 consecutive elements (one 32-element block, or an eighth of a K-quant one)
 * at a time. */
template <int QT, typename T>
static __global__ void __launch_bounds__(32 * QUANT_GEMV_WARPS)
quant_gemv_kernel(T *y, const T *x, const uint8_t *w, size_t row_bytes, const T *bias, int m,
                  int64_t n, int64_t k)
{
    const int lane = threadIdx.x & 31;
    for (int64_t j = (int64_t)blockIdx.x * QUANT_GEMV_WARPS + (threadIdx.x >> 5); j < n;
         j += (int64_t)gridDim.x * QUANT_GEMV_WARPS) {
        const uint8_t *row = w + (size_t)j * row_bytes;
        float acc[QUANT_GEMV_MAX_M];
#pragma unroll
        for (int r = 0; r < QUANT_GEMV_MAX_M; r++) acc[r] = 0.0f;
        for (int64_t e = lane; e < k; e += 32) {
            const float wv = quant_row_elem<QT>(row, e);
#pragma unroll
            for (int r = 0; r < QUANT_GEMV_MAX_M; r++)
                if (r < m) acc[r] += wv * cuda_load(x + (size_t)r * k + e);
        }
#pragma unroll
        for (int r = 0; r < QUANT_GEMV_MAX_M; r++) {
            const float v = cuda_warp_sum(acc[r]); /* every lane takes part */
            if (lane == 0 && r < m)
                cuda_store(y + (size_t)r * n + j, bias ? v + cuda_load(bias + j) : v);
        }
    }
}

/* dst (rows, k) f32 = rows of blocks starting at w, each row_bytes long. */
template <int QT>
static __global__ void quant_dequantize_rows_kernel(float *dst, const uint8_t *w, size_t row_bytes,
                                                    int64_t rows, int64_t k)
{
    const int64_t total = rows * k;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = quant_row_elem<QT>(w + (size_t)(i / k) * row_bytes, i % k);
}

/* y[r, c] (row stride ldy) = acc[r, c] (row stride lda; NULL: 0, an empty sum) + bias[c] (or
 * NULL), rounded once to T; rows x cols elements. acc may be y itself when T is float (the same
 * element is read, then written, by one thread). */
template <typename T>
static __global__ void quant_store_kernel(T *y, int64_t ldy, const float *acc, int64_t lda,
                                          const T *bias, int64_t rows, int64_t cols)
{
    const int64_t total = rows * cols;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i % cols;
        float v = acc ? acc[r * lda + c] : 0.0f;
        if (bias) v += cuda_load(bias + c);
        cuda_store(y + r * ldy + c, v);
    }
}

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The cuBLAS path: for each tile of w's rows [n0, n0 + nt), dequantized once into ws, and each
 * chunk of x's rows [r0, r0 + mc): acc = x_chunk @ ws^T in f32, then the bias and the rounding.
 * An f32 y is its own accumulator (ldc n); a bf16/f16 y goes through ys. */
static void matmul_quant_tiled(struct backend *b, struct cuda_state *s, enum quant_type qt,
                               const struct tensor *y, const struct tensor *x,
                               const struct tensor *w, const struct tensor *bias, int64_t m,
                               int64_t n, int64_t k)
{
    const size_t row_bytes = quant_row_bytes(qt, k);
    const int x_f32 = x->dtype == DTYPE_F32, y_f32 = y->dtype == DTYPE_F32;
    CHECK(k <= QUANT_TILE_X_FLOATS, "matmul: k %lld of a block-quantized w exceeds the CUDA tiles (%lld)",
          (long long)k, (long long)QUANT_TILE_X_FLOATS);
    const int64_t mc = min64(min64(m, QUANT_TILE_MAX_ROWS), x_f32 ? m : QUANT_TILE_X_FLOATS / k);
    int64_t nt = min64(n, QUANT_TILE_W_FLOATS / k);
    if (!y_f32) nt = min64(nt, QUANT_TILE_Y_FLOATS / mc);
    const size_t ws_bytes = cuda_align((size_t)(nt * k) * sizeof(float));
    const size_t xs_bytes = x_f32 ? 0 : cuda_align((size_t)(mc * k) * sizeof(float));
    const size_t ys_bytes = y_f32 ? 0 : cuda_align((size_t)(mc * nt) * sizeof(float));
    char *scratch = (char *)cuda_scratch(b, ws_bytes + xs_bytes + ys_bytes);
    float *ws = (float *)scratch, *xs = (float *)(scratch + ws_bytes);
    float *ys = (float *)(scratch + ws_bytes + xs_bytes);
    const size_t xe = dtype_size(x->dtype), ye = dtype_size(y->dtype);

    for (int64_t n0 = 0; n0 < n; n0 += nt) {
        const int64_t cols = min64(nt, n - n0);
        QUANT_DISPATCH(qt, QT,
            quant_dequantize_rows_kernel<QT><<<cuda_blocks_for(cols * k, CUDA_THREADS), CUDA_THREADS, 0,
                                               s->stream>>>(ws, (const uint8_t *)w->data + (size_t)n0 * row_bytes,
                                                            row_bytes, cols, k);
            LAUNCH_CHECK());
        for (int64_t r0 = 0; r0 < m; r0 += mc) {
            const int64_t rows = min64(mc, m - r0);
            const float *xr = (const float *)((const char *)x->data + (size_t)(r0 * k) * xe);
            if (!x_f32) {
                /* One chunk is widened once, for the first tile; several, for every tile. */
                if (n0 == 0 || mc < m) {
                    struct tensor src = tensor_make((char *)x->data + (size_t)(r0 * k) * xe, x->dtype,
                                                    DEVICE_CUDA, 2, rows, k);
                    struct tensor dst = tensor_make(xs, DTYPE_F32, DEVICE_CUDA, 2, rows, k);
                    cuda_cast(b, &dst, &src);
                }
                xr = xs;
            }
            char *yr = (char *)y->data + (size_t)(r0 * n + n0) * ye;
            float *acc = y_f32 ? (float *)yr : ys;
            const int64_t ldc = y_f32 ? n : cols;
            cuda_gemm(s, 0, 1, rows, cols, k, xr, k, ws, k, DTYPE_F32, 0.0f, acc, ldc, DTYPE_F32, NULL, 0);
            if (y_f32 && !bias) continue;
            const char *br = bias ? (const char *)bias->data + (size_t)n0 * ye : NULL;
            CUDA_DISPATCH_FLOAT(y->dtype, T,
                quant_store_kernel<T><<<cuda_blocks_for(rows * cols, CUDA_THREADS), CUDA_THREADS, 0,
                                        s->stream>>>((T *)yr, n, acc, ldc, (const T *)br, rows, cols);
                LAUNCH_CHECK());
        }
    }
}

/* y (m, n) = x (m, k) @ w (n, k of blocks)^T + bias (n) or NULL; ops.c has checked the shapes,
 * that k is whole blocks and that x, y and bias share a float dtype. */
void cuda_matmul_quant(struct backend *b, const struct tensor *y, const struct tensor *x,
                       const struct tensor *w, const struct tensor *bias)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t m = tensor_rows(x), k = w->shape[1], n = w->shape[0];
    if (m == 0 || n == 0) return;
    const enum quant_type qt = (enum quant_type)dtype_quant_type(w->dtype);
    if (k == 0) { /* an empty sum: y is the bias or zero */
        if (bias) {
            CUDA_DISPATCH_FLOAT(y->dtype, T,
                quant_store_kernel<T><<<cuda_blocks_for(m * n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
                    (T *)y->data, n, (const float *)NULL, 0, (const T *)bias->data, m, n);
                LAUNCH_CHECK());
        } else {
            CUDA_CHECK(cudaMemsetAsync(y->data, 0, tensor_nbytes(y), s->stream));
        }
        return;
    }
    if (m > QUANT_GEMV_MAX_M) {
        matmul_quant_tiled(b, s, qt, y, x, w, bias, m, n, k);
        return;
    }
    const int64_t blocks = (n + QUANT_GEMV_WARPS - 1) / QUANT_GEMV_WARPS;
    const unsigned grid = (unsigned)min64(blocks, CUDA_MAX_BLOCKS);
    const size_t row_bytes = quant_row_bytes(qt, k);
    QUANT_DISPATCH(qt, QT,
        CUDA_DISPATCH_FLOAT(y->dtype, T,
            quant_gemv_kernel<QT, T><<<grid, 32 * QUANT_GEMV_WARPS, 0, s->stream>>>(
                (T *)y->data, (const T *)x->data, (const uint8_t *)w->data, row_bytes,
                bias ? (const T *)bias->data : (const T *)NULL, (int)m, n, k);
            LAUNCH_CHECK()));
}
