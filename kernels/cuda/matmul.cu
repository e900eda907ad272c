/* kernels/cuda/matmul.cu - y = x @ w^T (+ bias) through cuBLAS, and the cuBLAS handle's life.
 * This is the only file of the backend that calls cuBLAS.
 * Not here: attention's products (attention.cu computes them itself).
 * Tests: tests/test_ops.c --backend cuda (matmul against the CPU reference, every dtype, with
 * and without bias, odd sizes and one-row decode shapes). */
#include <limits.h>

#include "cuda_common.cuh"
#include "cuda_ops.h"

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
    return STATUS_OK;
}

void cuda_matmul_free(struct cuda_state *s)
{
    if (s->cublas) CUBLAS_CHECK(cublasDestroy(s->cublas));
    s->cublas = NULL;
}

/* y[i, j] = bias[j]: an exact copy, so that the GEMM below (beta = 1) adds the bias to the f32
 * accumulator and rounds once, as the CPU reference does. */
template <typename T>
static __global__ void matmul_bias_fill_kernel(T *y, const T *bias, int64_t m, int64_t n)
{
    int64_t total = m * n;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x)
        y[i] = bias[i % n];
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

    float beta = 0.0f;
    if (bias) {
        CUDA_DISPATCH_FLOAT(y->dtype, T,
            matmul_bias_fill_kernel<T><<<cuda_blocks_for(m * n, CUDA_THREADS), CUDA_THREADS, 0,
                                         s->stream>>>((T *)y->data, (const T *)bias->data, m, n);
            LAUNCH_CHECK());
        beta = 1.0f;
    } else if (k == 0) {
        CUDA_CHECK(cudaMemsetAsync(y->data, 0, tensor_nbytes(y), s->stream));
    }
    /* An empty sum: y is the bias or zero, written above; cuBLAS wants lda >= 1. */
    if (k == 0) return;

    /* cuBLAS is column-major. Row-major y (m, n) is column-major y^T (n x m), and
     * y^T = w x^T: row-major w (n, k) is column-major (k x n), transposed to (n x k); row-major
     * x (m, k) is column-major x^T (k x m) as it lies. f32 inputs use CUBLAS_COMPUTE_32F, which
     * never uses TF32, so results match the CPU's f32 products. */
    cudaDataType_t type = matmul_data_type(x->dtype);
    float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(s->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &alpha,
                              w->data, type, (int)k, x->data, type, (int)k, &beta, y->data, type,
                              (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
