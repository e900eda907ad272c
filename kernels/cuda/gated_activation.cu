/* kernels/cuda/gated_activation.cu - op_gated_activation: out = act(gate) * up elementwise
 * (SwiGLU, GeGLU; GPT-OSS's clamped SwiGLU multiplies by clamp(up, -7, 7) + 1); out may alias
 * gate or up, which an elementwise kernel allows.
 * Its backward: dgate = dout up' act'(gate), dup = dout act(gate) (up' = up, or clamp(up) + 1;
 * ACTIVATION_SWIGLU_OAI's dup is 0 where |up| > 7), as kernels/cpu/gated_activation.c.
 * Not here: the scalar activations (cuda_activate, cuda_activate_grad, cuda_gated_up in
 * cuda_common.cuh).
 * Tests: tests/test_ops.c --backend cuda (every activation and dtype);
 * tests/test_ops_backward.c --backend cuda. */
#include "cuda_common.cuh"
#include "cuda_ops.h"

template <typename T>
static __global__ void gated_activation_kernel(T *out, const T *gate, const T *up, int64_t n,
                                               enum activation act)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x)
        cuda_store(out + i,
                   cuda_activate(cuda_load(gate + i), act) * cuda_gated_up(cuda_load(up + i), act));
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

/* Each thread reads an element's three inputs before writing its two outputs, so dgate may
 * alias gate or dout and dup up or dout. */
template <typename T>
static __global__ void gated_activation_backward_kernel(T *dgate, T *dup, const T *dout,
                                                        const T *gate, const T *up, int64_t n,
                                                        enum activation act)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        float g = cuda_load(gate + i), u = cuda_load(up + i), d = cuda_load(dout + i);
        const float dg = d * cuda_gated_up(u, act) * cuda_activate_grad(g, act);
        /* SWIGLU_OAI: 0 where up was clamped */
        const bool clamped =
            act == ACTIVATION_SWIGLU_OAI && (u > CUDA_ACT_OAI_LIMIT || u < -CUDA_ACT_OAI_LIMIT);
        const float du = clamped ? 0.0f : d * cuda_activate(g, act);
        cuda_store(dgate + i, dg);
        cuda_store(dup + i, du);
    }
}

/* dgate, dup, dout, gate, up: same shape and dtype. */
void cuda_gated_activation_backward(struct backend *b, const struct tensor *dgate,
                                    const struct tensor *dup, const struct tensor *dout,
                                    const struct tensor *gate, const struct tensor *up,
                                    enum activation act)
{
    struct cuda_state *s = cuda_state_enter(b);
    int64_t n = tensor_numel(dout);
    if (n == 0) return;
    CUDA_DISPATCH_FLOAT(dout->dtype, T,
        gated_activation_backward_kernel<T><<<cuda_blocks_for(n, CUDA_THREADS), CUDA_THREADS, 0,
                                              s->stream>>>(
            (T *)dgate->data, (T *)dup->data, (const T *)dout->data, (const T *)gate->data,
            (const T *)up->data, n, act);
        LAUNCH_CHECK());
}
