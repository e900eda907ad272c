/* kernels/backend_impl.h - what kernels/ops.c needs from each backend: its constructor. Private
 * to kernels/; the engine opens backends through backend_open() in ops.h.
 * Tests: tests/test_ops.c. */
#ifndef SHARDLM_BACKEND_IMPL_H
#define SHARDLM_BACKEND_IMPL_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Both return STATUS_OK and a backend owned by the caller, or an error with a message.
 * cuda_backend_open (backend_cuda_loader.c) loads libshardlm_cuda.so on its first call; a
 * missing or unloadable library is STATUS_UNAVAILABLE naming the path and dlerror(). */
enum status cpu_backend_open(int n_threads, struct backend **out);
enum status cuda_backend_open(int device_id, struct backend **out);
/* 1 in builds that compiled kernels/cuda/ when libshardlm_cuda.so is found (next to the
 * executable, in the build tree, or at $SHARDLM_CUDA_LIB), without loading it; 0 in builds that
 * linked cuda_unavailable.c. */
int cuda_backend_compiled(void);

/* ---- libshardlm_cuda.so's entry points (kernels/cuda/backend_cuda.cu) ---------------------
 * Looked up by name with dlsym by backend_cuda_loader.c; nothing links them directly, so that
 * the CUDA runtime and cuBLAS are mapped only when a CUDA backend is opened. */
#define CUDA_LIB_SYMBOL_ABI  "cuda_lib_abi"
#define CUDA_LIB_SYMBOL_OPEN "cuda_lib_backend_open"
/* Both sides' view of the structures they share: a library from another build (another
 * struct backend_ops) is refused rather than called. */
#define CUDA_LIB_ABI ((unsigned long)sizeof(struct backend_ops) << 16 | sizeof(struct backend))
unsigned long cuda_lib_abi(void);
enum status   cuda_lib_backend_open(int device_id, struct backend **out);

#ifdef __cplusplus
}
#endif

#endif
