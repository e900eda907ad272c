/* kernels/cuda/add.cu - op_add: out = a + c elementwise (the residual add); out may alias a
 * or c, which an elementwise kernel allows.
 * Not here: broadcasting adds (bias is folded into matmul.cu; norms carry their own).
 * Tests: tests/test_ops.c --backend cuda (aliased and separate outputs). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void add_kernel(T *out, const T *a, const T *c, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_load(a + i) + cuda_load(c + i));
}

/* out, a, c: same shape and dtype. */
void cuda_add(struct backend *b, const struct tensor *out, const struct tensor *a,
              const struct tensor *c)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        add_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)a->data, (const T *)c->data, n);
        LAUNCH_CHECK());
}
