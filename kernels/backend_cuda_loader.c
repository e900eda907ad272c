/* kernels/backend_cuda_loader.c - the CUDA backend's stand-in in builds that compiled
 * kernels/cuda/: those files, cuBLAS and the CUDA runtime live in libshardlm_cuda.so, loaded
 * here on the first cuda_backend_open, so that a process serving on the CPU never maps them
 * (~150 MiB of peak RSS, docs/performance.md "Peak RSS"). Builds without nvcc link
 * cuda_unavailable.c instead.
 * Not here: the search and dlopen (backend_lib.c), the backend itself (cuda/backend_cuda.cu).
 * Tests: tests/test_cuda_lazy.sh; tests/test_ops.c --backend cuda (gpu). */
#include "backend_impl.h"
#include "backend_lib.h"

#ifndef SHARDLM_CUDA_LIB_BUILD_PATH
#define SHARDLM_CUDA_LIB_BUILD_PATH NULL
#endif

/* Process-wide, as the library's mapping is. */
static struct backend_lib cuda_lib = {
    .file = "libshardlm_cuda.so",
    .env = "SHARDLM_CUDA_LIB",
    .build_path = SHARDLM_CUDA_LIB_BUILD_PATH,
};

int cuda_backend_compiled(void)
{
    char path[4096];
    return backend_lib_find(&cuda_lib, path, sizeof path);
}

enum status cuda_backend_open(int device_id, struct backend **out)
{
    *out = NULL;
    void *abi_sym = NULL, *open_sym = NULL;
    enum status st = backend_lib_symbol(&cuda_lib, CUDA_LIB_SYMBOL_ABI, &abi_sym);
    if (st == STATUS_OK) st = backend_lib_symbol(&cuda_lib, CUDA_LIB_SYMBOL_OPEN, &open_sym);
    if (st != STATUS_OK) return st;
    /* dlsym returns data pointers; POSIX guarantees they convert to function pointers. The
     * types are the declarations in backend_impl.h, which backend_cuda.cu compiles against. */
    __typeof__(cuda_lib_abi) *abi = (__typeof__(cuda_lib_abi) *)abi_sym;
    __typeof__(cuda_lib_backend_open) *open_fn = (__typeof__(cuda_lib_backend_open) *)open_sym;
    if (abi() != CUDA_LIB_ABI)
        return status_errorf(STATUS_UNAVAILABLE, "%s was built from another shardlm (backend "
                             "layout %#lx, this binary %#lx)", cuda_lib.path, abi(), CUDA_LIB_ABI);
    return open_fn(device_id, out);
}
