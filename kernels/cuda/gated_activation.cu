/* kernels/cuda/gated_activation.cu - op_gated_activation: out = act(gate) * up elementwise
 * (SwiGLU, GeGLU); out may alias gate or up, which an elementwise kernel allows.
 * Not here: the scalar activations (cuda_activate in cuda_common.cuh).
 * Tests: tests/test_ops.c --backend cuda (every activation and dtype). */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void gated_activation_kernel(T *out, const T *gate, const T *up, int64_t n,
                                               enum activation act)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_activate(cuda_load(gate + i), act) * cuda_load(up + i));
}

/* out, gate, up: same shape and dtype. */
void cuda_gated_activation(struct backend *b, const struct tensor *out, const struct tensor *gate,
                           const struct tensor *up, enum activation act)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        gated_activation_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0,
                                     s->stream>>>(
            (T *)out->data, (const T *)gate->data, (const T *)up->data, n, act);
        LAUNCH_CHECK());
}
