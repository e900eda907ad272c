/* kernels/cuda_unavailable.c - linked instead of kernels/cuda/ when the build has no nvcc
 * (SHARDLM_CUDA=OFF, or AUTO without a CUDA toolkit): opening a CUDA backend says so. */
#include "backend_impl.h"

enum status cuda_backend_open(int device_id, struct backend **out)
{
    (void)device_id;
    *out = NULL;
    return status_errorf(STATUS_UNAVAILABLE,
                         "this shardlm was built without the CUDA backend (no nvcc at build time)");
}

int cuda_backend_compiled(void) { return 0; }
