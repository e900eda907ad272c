/* kernels/cuda/matmul.cu - y = x @ w^T (+ bias) through cuBLAS (the bias added by a kernel of
 * its own), and the life of the cuBLAS handle and of the f32 scratch.
 * This is the only file of the backend that calls cuBLAS.
 * Not here: attention's products (attention.cu computes them itself).
 * Tests: tests/test_ops.c --backend cuda (matmul against the CPU reference, every dtype, with
 * and without bias, odd sizes and one-row decode shapes). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

/* The f32 scratch of products with a bias and a 16-bit output (see cuda_matmul): 8 Mi floats,
 * so that a product of up to 8 Mi outputs takes one cuBLAS call; larger ones go by row chunks. */
#define MATMUL_SCRATCH_BYTES ((size_t)32 << 20)

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
    void *scratch = NULL;
    cudaError_t err = cudaMalloc(&scratch, MATMUL_SCRATCH_BYTES);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* out of memory is not sticky: clear it for later checks */
        return status_errorf(STATUS_RESOURCE_EXHAUSTED,
                             "CUDA device %d: out of memory allocating the %zu-byte matmul scratch",
                             s->device_id, MATMUL_SCRATCH_BYTES);
    }
    CUDA_CHECK(err);
    s->matmul_scratch = (float *)scratch;
    s->matmul_scratch_floats = MATMUL_SCRATCH_BYTES / sizeof(float);
    return STATUS_OK;
}

void cuda_matmul_free(struct cuda_state *s)
{
    if (s->cublas) CUBLAS_CHECK(cublasDestroy(s->cublas));
    s->cublas = NULL;
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
