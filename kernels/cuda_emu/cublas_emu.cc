/* kernels/cuda_emu/cublas_emu.cc - the cuBLAS calls matmul.cu makes (a handle, its stream and
 * workspace, cublasGemmEx in f32 / bf16 / f16 with f32 compute), for the CUDA emulator: each
 * product on the handle's stream (recorded where it is capturing), every element summed in double
 * in k order and rounded once to C's type; operands outside device memory are refused
 * (CUBLAS_STATUS_INVALID_VALUE). The runtime it queues on: emu.cc. */
#define EMU_HOST_SIDE
#include "emu.h"

using emu::in_device;
using emu::on_stream;

/* ---- cuBLAS: the calls matmul.cu makes -------------------------------------------------------------- */

struct cublasContext {
    cudaStream_t stream;
};

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = new cublasContext();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t st)
{
    h->stream = st;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t bytes)
{
    (void)h;
    if (bytes && !in_device(ws, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode)
{
    (void)h;
    (void)mode;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusName(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulator)"; }
const char *cublasGetStatusString(cublasStatus_t st) { return st == CUBLAS_STATUS_SUCCESS ? "success" : "an emulated cuBLAS call refused its arguments"; }

} /* extern "C" */

namespace {
double load_as(const void *p, size_t i, cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F: return ((const float *)p)[i];
    case CUDA_R_16BF: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case CUDA_R_16F: return __half2float(((const __half *)p)[i]);
    default: abort();
    }
}
void store_as(void *p, size_t i, cudaDataType t, float v)
{
    switch (t) {
    case CUDA_R_32F: ((float *)p)[i] = v; break;
    case CUDA_R_16BF: ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); break;
    case CUDA_R_16F: ((__half *)p)[i] = __float2half_rn(v); break;
    default: abort();
    }
}
size_t elem_bytes(cudaDataType t) { return t == CUDA_R_32F ? 4 : 2; }
} /* namespace */

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                       const void *alpha, const void *A, cudaDataType at, int lda, const void *B,
                                       cudaDataType bt, int ldb, const void *beta, void *C, cudaDataType ct, int ldc,
                                       cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (compute != CUBLAS_COMPUTE_32F && compute != CUBLAS_COMPUTE_32F_FAST_TF32) return CUBLAS_STATUS_NOT_SUPPORTED;
    for (cudaDataType t : {at, bt, ct})
        if (t != CUDA_R_32F && t != CUDA_R_16BF && t != CUDA_R_16F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1) || lda < ((ta == CUBLAS_OP_N ? m : k) > 1 ? (ta == CUBLAS_OP_N ? m : k) : 1) ||
        ldb < ((tb == CUBLAS_OP_N ? k : n) > 1 ? (tb == CUBLAS_OP_N ? k : n) : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* column-major: A is (m x k) as op(A) reads it, B (k x n), C (m x n); each read must lie in device memory */
    const size_t a_cols = ta == CUBLAS_OP_N ? (size_t)k : (size_t)m, b_cols = tb == CUBLAS_OP_N ? (size_t)n : (size_t)k;
    if (m && n && k &&
        (!in_device(A, ((a_cols - 1) * lda + (ta == CUBLAS_OP_N ? m : k)) * elem_bytes(at)) ||
         !in_device(B, ((b_cols - 1) * ldb + (tb == CUBLAS_OP_N ? k : n)) * elem_bytes(bt))))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (m && n && !in_device(C, ((size_t)(n - 1) * ldc + m) * elem_bytes(ct))) return CUBLAS_STATUS_INVALID_VALUE;
    const float al = *(const float *)alpha, be = *(const float *)beta; /* host pointer mode */
    const cudaError_t e = on_stream(h->stream, [=]() {
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0.0;
                for (int l = 0; l < k; l++) {
                    const double a = load_as(A, ta == CUBLAS_OP_N ? (size_t)l * lda + i : (size_t)i * lda + l, at);
                    const double b = load_as(B, tb == CUBLAS_OP_N ? (size_t)j * ldb + l : (size_t)l * ldb + j, bt);
                    s += a * b;
                }
                const size_t at_c = (size_t)j * ldc + i;
                const double prior = be != 0.0f ? be * load_as(C, at_c, ct) : 0.0;
                store_as(C, at_c, ct, (float)(al * s + prior));
            }
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
