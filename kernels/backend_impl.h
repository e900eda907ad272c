/* kernels/backend_impl.h - what kernels/ops.c needs from each backend: its constructor. Private
 * to kernels/; the engine opens backends through backend_open() in ops.h.
 * Tests: tests/test_ops.c. */
#ifndef SHARDLM_BACKEND_IMPL_H
#define SHARDLM_BACKEND_IMPL_H

#include "ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Both return STATUS_OK and a backend owned by the caller, or an error with a message. */
enum status cpu_backend_open(int n_threads, struct backend **out);
enum status cuda_backend_open(int device_id, struct backend **out);
/* 1 in builds that compiled kernels/cuda/, 0 in builds that linked cuda_unavailable.c. */
int cuda_backend_compiled(void);

#ifdef __cplusplus
}
#endif

#endif
