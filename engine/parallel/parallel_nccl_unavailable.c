/* engine/parallel/parallel_nccl_unavailable.c - linked instead of engine/parallel/parallel_nccl.c when the build
 * has no CUDA (SHARDLM_CUDA=OFF, no nvcc, or no NCCL found): asking for an NCCL communicator
 * says so, as kernels/cuda_unavailable.c does for the CUDA backend.
 * Tests: tests/test_parallel.c --nccl (prints SKIP in such builds). */
#include "parallel.h"

int parallel_nccl_compiled(void) { return 0; }

int parallel_nccl_device_count(void) { return 0; }

static enum status nccl_unavailable(void)
{
    return status_errorf(STATUS_UNAVAILABLE, "parallel: this shardlm was built without NCCL "
                         "(no CUDA toolkit or no nccl.h/libnccl at build time)");
}

enum status parallel_nccl_check_device(int device_id)
{
    (void)device_id;
    return nccl_unavailable();
}

enum status parallel_nccl_unique_id(unsigned char id[PARALLEL_NCCL_ID_BYTES])
{
    (void)id;
    return nccl_unavailable();
}

enum status parallel_nccl_comm_create(struct parallel_world *w, const char *name,
                                      const unsigned char id[PARALLEL_NCCL_ID_BYTES], int rank,
                                      int size, int device_id, void *stream, struct comm **out)
{
    (void)w, (void)name, (void)id, (void)rank, (void)size, (void)device_id, (void)stream;
    *out = NULL;
    return nccl_unavailable();
}
