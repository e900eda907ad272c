/* kernels/cuda/activation.cu - op_activation: out = act(x) elementwise (SiLU, GELU tanh,
 * GELU erf); out may alias x; and its backward dx = dout act'(x). The scalar functions are
 * cuda_activate and cuda_activate_grad in cuda_common.cuh.
 * Not here: the gated form act(gate) * up (gated_activation.cu).
 * Tests: tests/test_ops.c --backend cuda (every activation and dtype);
 * tests/test_ops_backward.c --backend cuda. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void activation_kernel(T *out, const T *x, int64_t n, enum activation act)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i, cuda_activate(cuda_load(x + i), act));
}

/* out, x: same shape and dtype. */
void cuda_activation(struct backend *b, const struct tensor *out, const struct tensor *x,
                     enum activation act)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(out);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(out->dtype, T,
        activation_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0, s->stream>>>(
            (T *)out->data, (const T *)x->data, n, act);
        LAUNCH_CHECK());
}

template <typename T>
static __global__ void activation_backward_kernel(T *dx, const T *dout, const T *x, int64_t n,
                                                  enum activation act)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(dx + i, cuda_load(dout + i) * cuda_activate_grad(cuda_load(x + i), act));
}

/* dx, dout, x: same shape and dtype; dx may alias dout or x (elementwise). */
void cuda_activation_backward(struct backend *b, const struct tensor *dx,
                              const struct tensor *dout, const struct tensor *x, enum activation act)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(dx);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(dx->dtype, T,
        activation_backward_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0,
                                        s->stream>>>((T *)dx->data, (const T *)dout->data,
                                                     (const T *)x->data, n, act);
        LAUNCH_CHECK());
}
