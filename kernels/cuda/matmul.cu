/* kernels/cuda/matmul.cu - y = x @ w^T (+ bias) and its backward through cuBLAS (the forward's
 * bias added by a kernel of its own), the life of the cuBLAS handle and of the f32 scratch, and
 * cuda_gemm, the row-major product the fused cross-entropy uses. This is the only file of the
 * backend that calls cuBLAS.
 * Not here: attention's products (attention.cu computes them itself); products with a
 * block-quantized w (matmul_quant.cu, which reaches cuBLAS through cuda_gemm).
 * Tests: tests/test_ops.c --backend cuda (matmul against the CPU reference, every dtype, with
 * and without bias, odd sizes and one-row decode shapes); tests/test_ops_backward.c --backend
 * cuda (matmul_backward, cross_entropy). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

/* The f32 scratch of products with a bias and a 16-bit output (see cuda_matmul): 8 Mi floats,
 * so that a product of up to 8 Mi outputs takes one cuBLAS call; larger ones go by row chunks. */
#define MATMUL_SCRATCH_BYTES ((size_t)32 << 20)
/* cuBLAS's workspace, given to it (cublasSetWorkspace) rather than left to its default pool:
 * inside a graph's capture (step_graph.c) the default pool allocates through cudaMallocAsync,
 * which puts memory nodes into each captured graph (up to 64 of them kept) and fails where memory
 * nodes are not allowed; with ours, a product captures as kernels only. 32 MiB: the size cuBLAS's
 * documentation recommends for Hopper (4 MiB elsewhere). */
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

/* cudaMalloc of bytes into *p, out of memory named (what) and not left sticky */
static enum status matmul_alloc(struct cuda_state *s, void **p, size_t bytes, const char *what)
{
    cudaError_t err = cudaMalloc(p, bytes);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it for later checks */
        *p = NULL;
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "CUDA device %d: out of memory allocating the %zu-byte %s",
                             s->device_id, bytes, what);
    }
    CUDA_CHECK(err);
    return STATUS_OK;
}

enum status cuda_matmul_init(struct cuda_state *s)
{
    cublasStatus_t st = cublasCreate(&s->cublas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        s->cublas = NULL;
        return status_errorf(STATUS_UNAVAILABLE, "CUDA device %d: cuBLAS does not start: %s",
                             s->device_id, cublasGetStatusString(st));
    }
    CUBLAS_CHECK(cublasSetStream(s->cublas, s->stream));
    /* Without this flag cuBLAS may sum split-K partial products in the output type (bf16/f16),
     * rounding more than once; the contract is f32 accumulation, rounded once on store. */
    CUBLAS_CHECK(cublasSetMathMode(s->cublas, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    enum status st_ws = matmul_alloc(s, &s->cublas_workspace, CUBLAS_WORKSPACE_BYTES, "cuBLAS workspace");
    if (st_ws != STATUS_OK) return st_ws;
    /* after cublasSetStream, which sets the workspace back to cuBLAS's own pool */
    CUBLAS_CHECK(cublasSetWorkspace(s->cublas, s->cublas_workspace, CUBLAS_WORKSPACE_BYTES));
    void *scratch = NULL;
    enum status st_scratch = matmul_alloc(s, &scratch, MATMUL_SCRATCH_BYTES, "matmul scratch");
    if (st_scratch != STATUS_OK) return st_scratch;
    s->matmul_scratch = (float *)scratch;
    s->matmul_scratch_floats = MATMUL_SCRATCH_BYTES / sizeof(float);
    return STATUS_OK;
}

void cuda_matmul_free(struct cuda_state *s)
{
    if (s->cublas) CUBLAS_CHECK(cublasDestroy(s->cublas));
    s->cublas = NULL;
    CUDA_CHECK(cudaFree(s->cublas_workspace));
    s->cublas_workspace = NULL;
    CUDA_CHECK(cudaFree(s->matmul_scratch));
    s->matmul_scratch = NULL;
    s->matmul_scratch_floats = 0;
}

/* y[i, j] = acc[i, j] + bias[j], added in f32 and rounded once to T, as the CPU reference does
 * (kernels/cpu/matmul.c). acc (m, n) may alias y when T is float. With acc NULL (k = 0, an empty
 * sum), y is the bias. */
template <typename T>
static __global__ void matmul_bias_add_kernel(T *y, const float *acc, const T *bias, int64_t m,
                                              int64_t n)
{
    int64_t total = m * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(y + i, (acc ? acc[i] : 0.0f) + cuda_load(bias + i % n));
}

/* ---- decode products: y (m <= CUDA_GEMV_MAX_ROWS, n) = x (m, k) w (n, k)^T (+ bias) --------
 * `split` warps per output feature j (a row of w; GEMV_WARPS / split features per thread
 * block): lane l of the feature's warp s reads w's row in 16-byte vectors s * 32 + l,
 * s * 32 + l + 32 * split, ..., multiplies them with the same vectors of the M rows of x (small:
 * served from the caches) into M f32 sums, which a fixed shuffle tree adds per warp, and the
 * split warps' sums are added in warp order through shared memory; lane 0 of the feature's first
 * warp adds the bias in f32 and rounds once on store, as matmul_bias_add_kernel does. Rows of x
 * never mix, so a row's result does not depend on M (split depends on n and the device only).
 * k a multiple of the vector, x and w 16-byte aligned. */
#define GEMV_WARPS 8 /* warps per thread block */

/* Output features of one product for thread block `block` of `n_blocks` (all of the block's
 * threads take part). */
template <typename T, int M>
__device__ __forceinline__ void gemv_block(T *y, const T *x, const T *w, const T *bias, int64_t n, int64_t k,
                                           int split, int64_t block, int64_t n_blocks)
{
    constexpr int N = cuda_vec<T>::N;
    __shared__ float part[GEMV_WARPS][M];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per_block = GEMV_WARPS / split, sub = warp % split;
    const int64_t nv = k / N;
    /* j0 is the same for the whole block, so every thread reaches the __syncthreads below. */
    for (int64_t j0 = block * per_block; j0 < n; j0 += n_blocks * per_block) {
        const int64_t j = j0 + warp / split;
        float acc[M];
#pragma unroll
        for (int i = 0; i < M; i++) acc[i] = 0.0f;
        if (j < n) {
            const uint4 *wr = reinterpret_cast<const uint4 *>(w + j * k);
#pragma unroll 4
            for (int64_t p = sub * 32 + lane; p < nv; p += 32 * split) {
                float wf[N];
                cuda_vec<T>::widen(__ldg(wr + p), wf);
#pragma unroll
                for (int i = 0; i < M; i++) {
                    float xf[N];
                    cuda_vec<T>::widen(__ldg(reinterpret_cast<const uint4 *>(x + i * k) + p), xf);
#pragma unroll
                    for (int q = 0; q < N; q++) acc[i] = fmaf(xf[q], wf[q], acc[i]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < M; i++) acc[i] = cuda_warp_sum(acc[i]);
        if (split > 1) {
            if (lane == 0)
#pragma unroll
                for (int i = 0; i < M; i++) part[warp][i] = acc[i];
            __syncthreads();
            if (sub == 0 && lane == 0)
#pragma unroll
                for (int i = 0; i < M; i++) {
                    float v = part[warp][i];
                    for (int t = 1; t < split; t++) v += part[warp + t][i];
                    acc[i] = v;
                }
            __syncthreads(); /* part is read before the next feature writes it */
        }
        if (j < n && sub == 0 && lane == 0)
#pragma unroll
            for (int i = 0; i < M; i++) {
                float v = acc[i];
                if (bias) v += cuda_load(bias + j);
                cuda_store(y + i * n + j, v);
            }
    }
}

/* Up to OP_MATMUL_MANY_MAX products of the same x in one launch (a single product: count 1):
 * product i takes thread blocks begin[i] .. begin[i + 1] - 1 (enough for its features, at most
 * CUDA_MAX_BLOCKS of them, looping past that) with the split gemv_split_for gives it alone, so
 * each result is the same whatever else shares the launch (op_matmul_many). */
template <typename T>
struct gemv_args {
    T       *y[OP_MATMUL_MANY_MAX];
    const T *w[OP_MATMUL_MANY_MAX], *bias[OP_MATMUL_MANY_MAX];
    int64_t  n[OP_MATMUL_MANY_MAX];
    int      split[OP_MATMUL_MANY_MAX];
    unsigned begin[OP_MATMUL_MANY_MAX + 1];
    int      count;
};

template <typename T, int M>
static __global__ void __launch_bounds__(32 * GEMV_WARPS)
gemv_kernel(const gemv_args<T> g, const T *x, int64_t k)
{
    int i = 0;
    while (i + 1 < g.count && blockIdx.x >= g.begin[i + 1]) i++; /* block-uniform */
    gemv_block<T, M>(g.y[i], x, g.w[i], g.bias[i], g.n[i], k, g.split[i], blockIdx.x - g.begin[i],
                     g.begin[i + 1] - g.begin[i]);
}

/* The warps per output feature: SHARDLM_CUDA_GEMV_SPLIT, else the fewest (a power of 2, at
 * most GEMV_WARPS) that give the device 32 warps of work per SM, and no more than leave every
 * lane a vector of k. */
static int gemv_split_for(const struct cuda_state *s, int64_t n, int64_t k, int vec)
{
    if (s->gemv_split > 0) return s->gemv_split;
    int split = 1;
    while (split < GEMV_WARPS && n * split < (int64_t)s->n_sms * 32 && k / vec >= 64 * split) split *= 2;
    return split;
}

/* The products y[i] = x w[i]^T (+ bias[i]), i < count, in one gemv_kernel launch. */
template <typename T>
static void gemv_launch(struct cuda_state *s, int count, const struct tensor *const *y, const struct tensor *x,
                        const struct tensor *const *w, const struct tensor *const *bias, int64_t m, int64_t k)
{
    gemv_args<T> g = {};
    g.count = count;
    unsigned total = 0;
    for (int i = 0; i < count; i++) {
        g.y[i] = (T *)y[i]->data;
        g.w[i] = (const T *)w[i]->data;
        g.bias[i] = bias[i] ? (const T *)bias[i]->data : NULL;
        g.n[i] = w[i]->shape[0];
        g.split[i] = gemv_split_for(s, g.n[i], k, cuda_vec<T>::N);
        g.begin[i] = total;
        total += cuda_blocks_for(g.n[i], GEMV_WARPS / g.split[i]);
    }
    g.begin[count] = total;
    const T *xp = (const T *)x->data;
    switch (m) {
#define GEMV_CASE(M)                                                                              \
    case M: gemv_kernel<T, M><<<total, 32 * GEMV_WARPS, 0, s->stream>>>(g, xp, k); break;
        GEMV_CASE(1) GEMV_CASE(2) GEMV_CASE(3) GEMV_CASE(4) GEMV_CASE(5) GEMV_CASE(6) GEMV_CASE(7) GEMV_CASE(8)
#undef GEMV_CASE
    default: CHECK(0, "gemv: %lld rows", (long long)m);
    }
    LAUNCH_CHECK();
}

/* Whether the product takes gemv_kernel: few rows, x, w, y (and the bias) in one 16-bit dtype,
 * whole 16-byte vectors; past 2 rows only for weights of at most GEMV_MANY_ROWS_MAX_WEIGHTS
 * elements, where cuBLAS's fixed cost dominates (an H200, 2026-12-04: at m = 4 the gemv took
 * 2048 x 2048 in 8.8 us against cuBLAS's 13.6, but 8192 x 2048 in 17.5 against 13.3 and the
 * 128256 x 2048 LM head in 205 against 129; at m = 1 it was never slower). */
#define GEMV_MANY_ROWS_MAX_WEIGHTS (2048 * 2048)
static int gemv_fits(const struct cuda_state *s, const struct tensor *y, const struct tensor *x,
                     const struct tensor *w, const struct tensor *bias, int64_t m, int64_t n, int64_t k)
{
    return m <= s->gemv_rows && m <= CUDA_GEMV_MAX_ROWS && k > 0 && (m <= 2 || n * k <= GEMV_MANY_ROWS_MAX_WEIGHTS) &&
           (x->dtype == DTYPE_BF16 || x->dtype == DTYPE_F16) && w->dtype == x->dtype && y->dtype == x->dtype &&
           (!bias || bias->dtype == x->dtype) && k % 8 == 0 && (uintptr_t)x->data % 16 == 0 &&
           (uintptr_t)w->data % 16 == 0;
}

static cudaDataType_t matmul_data_type(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return CUDA_R_32F;
    case DTYPE_BF16: return CUDA_R_16BF;
    case DTYPE_F16: return CUDA_R_16F;
    default: CHECK(0, "matmul: dtype %s is not a float dtype", dtype_name(t));
    }
}

/* y (m, n) = x (m, k) @ w (n, k)^T + bias (n) or NULL. */
void cuda_matmul(struct backend *b, const struct tensor *y, const struct tensor *x,
                 const struct tensor *w, const struct tensor *bias)
{
    if (dtype_is_quant(w->dtype)) { /* ggml blocks, dequantized inside the kernels */
        cuda_matmul_quant(b, y, x, w, bias);
        return;
    }
    struct cuda_state *s = cuda_state_enter(b);
    int64_t m = tensor_rows(x), k = w->shape[1], n = w->shape[0];
    if (m == 0 || n == 0) return;
    CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX,
          "matmul: m %lld, n %lld, k %lld exceed cuBLAS's int sizes", (long long)m, (long long)n,
          (long long)k);

    /* cuBLAS is column-major. Row-major y (m, n) is column-major y^T (n x m), and
     * y^T = w x^T: row-major w (n, k) is column-major (k x n), transposed to (n x k); row-major
     * x (m, k) is column-major x^T (k x m) as it lies. f32 inputs use CUBLAS_COMPUTE_32F, which
     * never uses TF32, so results match the CPU's f32 products. */
    cudaDataType_t type = matmul_data_type(x->dtype);
    const float alpha = 1.0f, beta = 0.0f;
    if (k == 0) {
        /* An empty sum (cuBLAS wants lda >= 1): y is the bias or zero. */
        if (bias) {
            CUDA_DISPATCH_FLOAT(y->dtype, T,
                matmul_bias_add_kernel<T><<<cuda_blocks_for(m * n, CUDA_THREADS), CUDA_THREADS, 0,
                                            s->stream>>>((T *)y->data, (const float *)NULL,
                                                         (const T *)bias->data, m, n);
                LAUNCH_CHECK());
        } else {
            CUDA_CHECK(cudaMemsetAsync(y->data, 0, tensor_nbytes(y), s->stream));
        }
        return;
    }
    if (gemv_fits(s, y, x, w, bias, m, n, k)) {
        if (x->dtype == DTYPE_BF16) gemv_launch<__nv_bfloat16>(s, 1, &y, x, &w, &bias, m, k);
        else gemv_launch<__half>(s, 1, &y, x, &w, &bias, m, k);
        return;
    }
    if (!bias) {
        CUBLAS_CHECK(cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                  &alpha, w->data, type, (int)k, x->data, type, (int)k, &beta,
                                  y->data, type, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }

    /* With a bias, the f32 products are written first and the bias is added to them in f32 with
     * one rounding on store. cuBLAS's own ways of adding a bias were not: on an H100 both
     * cublasGemmEx over y pre-filled with the bias (beta = 1) and cuBLASLt's bias epilogue gave
     * bf16 results about an ulp of the product off where the bias cancels it, as if the product
     * were rounded to bf16 before the bias was added (tests/test_ops.c, 2026-11-24). An f32 y
     * holds its own products; a 16-bit y goes through the scratch, by chunks of rows. */
    if (y->dtype == DTYPE_F32) {
        CUBLAS_CHECK(cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                  &alpha, w->data, type, (int)k, x->data, type, (int)k, &beta,
                                  y->data, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        matmul_bias_add_kernel<float><<<cuda_blocks_for(m * n, CUDA_THREADS), CUDA_THREADS, 0,
                                        s->stream>>>((float *)y->data, (const float *)y->data,
                                                     (const float *)bias->data, m, n);
        LAUNCH_CHECK();
        return;
    }
    const int64_t chunk_rows = (int64_t)(s->matmul_scratch_floats / (size_t)n);
    CHECK(chunk_rows >= 1, "matmul: n %lld outputs a row exceed the CUDA matmul scratch of %zu",
          (long long)n, s->matmul_scratch_floats);
    const size_t es = dtype_size(y->dtype);
    for (int64_t r0 = 0; r0 < m; r0 += chunk_rows) {
        const int64_t rows = m - r0 < chunk_rows ? m - r0 : chunk_rows;
        const char *xr = (const char *)x->data + (size_t)r0 * (size_t)k * es;
        char *yr = (char *)y->data + (size_t)r0 * (size_t)n * es;
        CUBLAS_CHECK(cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)rows, (int)k,
                                  &alpha, w->data, type, (int)k, xr, type, (int)k, &beta,
                                  s->matmul_scratch, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
        CUDA_DISPATCH_FLOAT(y->dtype, T,
            matmul_bias_add_kernel<T><<<cuda_blocks_for(rows * n, CUDA_THREADS), CUDA_THREADS, 0,
                                        s->stream>>>((T *)yr, s->matmul_scratch,
                                                     (const T *)bias->data, rows, n);
            LAUNCH_CHECK());
    }
}

/* ---- the row-major product and the backward ------------------------------------------------ */

/* The product alone, c = op(a) op(b) + beta c, in one cuBLAS call (see cuda_gemm). */
static void gemm_call(struct cuda_state *s, int trans_a, int trans_b, int64_t m, int64_t n,
                      int64_t k, const void *a, int64_t lda, const void *bm, int64_t ldb,
                      enum dtype ab_dtype, float beta, void *c, int64_t ldc, enum dtype c_dtype)
{
    CHECK(m <= INT_MAX && n <= INT_MAX && k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX &&
              ldc <= INT_MAX,
          "cuda_gemm: m %lld, n %lld, k %lld exceed cuBLAS's int sizes", (long long)m,
          (long long)n, (long long)k);
    /* Row-major c (m, n) is column-major c^T (n x m) = op(b)^T op(a)^T. A row-major operand is
     * its own transpose in column-major terms, so op(b)^T is b as it lies (CUBLAS_OP_N) unless
     * trans_b, and likewise for a. */
    float alpha = 1.0f;
    cudaDataType_t ab = matmul_data_type(ab_dtype), ct = matmul_data_type(c_dtype);
    CUBLAS_CHECK(cublasGemmEx(s->cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha, bm,
                              ab, (int)ldb, a, ab, (int)lda, &beta, c, ct, (int)ldc,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* c[i, j] = beta c[i, j] + p[i, j], rounded once; c (rows, n) with row stride ldc, p (rows, n). */
template <typename T>
static __global__ void gemm_accumulate_kernel(T *c, int64_t ldc, const float *p, int64_t rows,
                                              int64_t n, float beta)
{
    int64_t total = rows * n;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = e / n, j = e % n;
        cuda_store(c + i * ldc + j, beta * cuda_load(c + i * ldc + j) + p[e]);
    }
}

void cuda_gemm(struct cuda_state *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
               const void *a, int64_t lda, const void *bm, int64_t ldb, enum dtype ab_dtype,
               float beta, void *c, int64_t ldc, enum dtype c_dtype, float *tmp, int64_t tmp_floats)
{
    if (m == 0 || n == 0) return;
    if (k == 0) { /* an empty sum: c = beta c, and beta is 0 or 1 here */
        CHECK(beta == 0.0f || beta == 1.0f, "cuda_gemm: k = 0 with beta %g", (double)beta);
        size_t es = dtype_size(c_dtype);
        if (beta == 0.0f)
            CUDA_CHECK(cudaMemset2DAsync(c, (size_t)ldc * es, 0, (size_t)n * es, (size_t)m, s->stream));
        return;
    }
    if (beta == 0.0f || c_dtype == DTYPE_F32) {
        gemm_call(s, trans_a, trans_b, m, n, k, a, lda, bm, ldb, ab_dtype, beta, c, ldc, c_dtype);
        return;
    }
    /* Half-precision c with beta != 0: the product of a block of rows into tmp, then one
     * rounding into c. Row r0 of op(a) starts at row r0 of a, or at column r0 when trans_a. */
    CHECK(tmp && tmp_floats >= n, "cuda_gemm: accumulating into %s needs tmp of %lld floats",
          dtype_name(c_dtype), (long long)n);
    const int64_t rows = tmp_floats / n < m ? tmp_floats / n : m;
    const size_t es = dtype_size(ab_dtype), cs = dtype_size(c_dtype);
    for (int64_t r0 = 0; r0 < m; r0 += rows) {
        const int64_t mr = m - r0 < rows ? m - r0 : rows;
        const char *ar = (const char *)a + (size_t)(trans_a ? r0 : r0 * lda) * es;
        gemm_call(s, trans_a, trans_b, mr, n, k, ar, lda, bm, ldb, ab_dtype, 0.0f, tmp, n, DTYPE_F32);
        char *cr = (char *)c + (size_t)(r0 * ldc) * cs;
        CUDA_DISPATCH_FLOAT(c_dtype, T,
            gemm_accumulate_kernel<T><<<cuda_blocks_for(mr * n, CUDA_THREADS), CUDA_THREADS, 0,
                                        s->stream>>>((T *)cr, ldc, tmp, mr, n, beta);
            LAUNCH_CHECK());
    }
}

#define BIAS_GRAD_ROWS 8

/* dbias[j] += sum_i dy[i, j]: a block of (32, BIAS_GRAD_ROWS) threads per 32 columns; the
 * BIAS_GRAD_ROWS partial sums of a column are added in a fixed order (deterministic). */
template <typename T, typename G>
static __global__ void __launch_bounds__(32 * BIAS_GRAD_ROWS)
bias_grad_kernel(G *dbias, const T *dy, int64_t m, int64_t n)
{
    __shared__ float part[BIAS_GRAD_ROWS][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t c0 = (int64_t)blockIdx.x * 32; c0 < n; c0 += (int64_t)gridDim.x * 32) {
        int64_t col = c0 + tx;
        float acc = 0.0f;
        if (col < n)
            for (int64_t i = ty; i < m; i += BIAS_GRAD_ROWS) acc += cuda_load(dy + i * n + col);
        part[ty][tx] = acc;
        __syncthreads();
        if (ty == 0 && col < n) {
            float s = 0.0f;
            for (int r = 0; r < BIAS_GRAD_ROWS; r++) s += part[r][tx];
            cuda_store(dbias + col, cuda_load(dbias + col) + s);
        }
        __syncthreads();
    }
}

/* dx (m, k) = dy (m, n) @ w (n, k) (+= with accumulate_dx); dw (n, k) += dy^T @ x;
 * dbias (n) += column sums of dy. */
void cuda_matmul_backward(struct backend *b, const struct tensor *dx, const struct tensor *dw,
                          const struct tensor *dbias, const struct tensor *dy,
                          const struct tensor *x, const struct tensor *w, int accumulate_dx)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t m = tensor_rows(dy), n = tensor_cols(dy);
    const int64_t k = w ? w->shape[1] : x ? tensor_cols(x) : 0; /* 0: dbias alone */
    if (m == 0) return;
    /* f32 room for cuda_gemm when it adds into a half-precision dx or dw */
    const int half_acc = (dx && accumulate_dx && dx->dtype != DTYPE_F32) || (dw && dw->dtype != DTYPE_F32);
    const int64_t tmp_floats = CUDA_GEMM_TMP_FLOATS > k ? CUDA_GEMM_TMP_FLOATS : k;
    float *tmp = half_acc ? (float *)cuda_scratch(b, (size_t)tmp_floats * sizeof(float)) : NULL;
    if (dx)
        cuda_gemm(s, 0, 0, m, k, n, dy->data, n, w->data, k, dy->dtype, accumulate_dx ? 1.0f : 0.0f,
                  dx->data, k, dx->dtype, tmp, tmp_floats);
    if (dw)
        cuda_gemm(s, 1, 0, n, k, m, dy->data, n, x->data, k, dy->dtype, 1.0f, dw->data, k, dw->dtype,
                  tmp, tmp_floats);
    if (dbias && n > 0) {
        int64_t blocks = (n + 31) / 32;
        dim3 grid((unsigned)(blocks < 65535 ? blocks : 65535)), block(32, BIAS_GRAD_ROWS);
        CUDA_DISPATCH_FLOAT(dy->dtype, T,
            CUDA_DISPATCH_GRAD(dbias->dtype, T, G,
                bias_grad_kernel<T, G><<<grid, block, 0, s->stream>>>((G *)dbias->data,
                                                                     (const T *)dy->data, m, n);
                LAUNCH_CHECK()));
    }
}

/* op_matmul_many: one launch when every product takes the gemv kernel (decode rows: q, k and v;
 * gate and up), else each product as cuda_matmul computes it. */
void cuda_matmul_many(struct backend *b, int count, const struct tensor *const *y, const struct tensor *x,
                      const struct tensor *const *w, const struct tensor *const *bias)
{
    struct cuda_state *s = cuda_state_enter(b);
    const int64_t m = tensor_rows(x), k = tensor_cols(x);
    int fused = m > 0;
    for (int i = 0; fused && i < count; i++)
        fused = w[i]->shape[0] > 0 && gemv_fits(s, y[i], x, w[i], bias[i], m, w[i]->shape[0], k);
    if (!fused) {
        for (int i = 0; i < count; i++) cuda_matmul(b, y[i], x, w[i], bias[i]);
    } else if (x->dtype == DTYPE_BF16) {
        gemv_launch<__nv_bfloat16>(s, count, y, x, w, bias, m, k);
    } else {
        gemv_launch<__half>(s, count, y, x, w, bias, m, k);
    }
}
