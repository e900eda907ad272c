/* engine/parallel/parallel_nccl_loader.c - the NCCL helpers in builds with NCCL: parallel_nccl.c,
 * NCCL and the CUDA runtime live in libshardlm_nccl.so, loaded here on the first call that needs
 * them (a device count, an NCCL group), so that a CPU-only process never maps them.
 * Builds without NCCL link parallel_nccl_unavailable.c instead.
 * Not here: the search and dlopen (kernels/backend_lib.c), NCCL itself (parallel_nccl.c).
 * Tests: tests/test_cuda_lazy.sh; tests/test_parallel.c --nccl (gpu). */
#include "parallel.h"

#include "backend_lib.h"

#ifndef SHARDLM_NCCL_LIB_BUILD_PATH
#define SHARDLM_NCCL_LIB_BUILD_PATH NULL
#endif

/* Process-wide, as the library's mapping is. */
static struct backend_lib nccl_lib = {
    .file = "libshardlm_nccl.so",
    .env = "SHARDLM_NCCL_LIB",
    .build_path = SHARDLM_NCCL_LIB_BUILD_PATH,
};

/* The address of nccl_lib_<name> after checking the library's layout matches this binary's. */
static enum status nccl_symbol(const char *symbol, void **out)
{
    void *abi_sym = NULL;
    *out = NULL;
    enum status st = backend_lib_symbol(&nccl_lib, "nccl_lib_abi", &abi_sym);
    if (st != STATUS_OK) return st;
    unsigned long abi = ((__typeof__(nccl_lib_abi) *)abi_sym)();
    if (abi != NCCL_LIB_ABI)
        return status_errorf(STATUS_UNAVAILABLE, "%s was built from another shardlm (comm "
                             "layout %#lx, this binary %#lx)", nccl_lib.path, abi, NCCL_LIB_ABI);
    return backend_lib_symbol(&nccl_lib, symbol, out);
}

int parallel_nccl_compiled(void)
{
    char path[4096];
    return backend_lib_find(&nccl_lib, path, sizeof path);
}

int parallel_nccl_device_count(void)
{
    void *f = NULL;
    if (nccl_symbol("nccl_lib_device_count", &f) != STATUS_OK) {
        /* Said once per call: "0 devices" alone would hide a missing library. */
        LOG_WARN("parallel", "no NCCL devices: %s", status_message());
        return 0;
    }
    return ((__typeof__(nccl_lib_device_count) *)f)();
}

enum status parallel_nccl_check_device(int device_id)
{
    void *f = NULL;
    enum status st = nccl_symbol("nccl_lib_check_device", &f);
    if (st != STATUS_OK) return st;
    return ((__typeof__(nccl_lib_check_device) *)f)(device_id);
}

enum status parallel_nccl_unique_id(unsigned char id[PARALLEL_NCCL_ID_BYTES])
{
    void *f = NULL;
    enum status st = nccl_symbol("nccl_lib_unique_id", &f);
    if (st != STATUS_OK) return st;
    return ((__typeof__(nccl_lib_unique_id) *)f)(id);
}

enum status parallel_nccl_comm_create(struct parallel_world *w, const char *name,
                                      const unsigned char id[PARALLEL_NCCL_ID_BYTES], int rank,
                                      int size, int device_id, void *stream, struct comm **out)
{
    void *f = NULL;
    *out = NULL;
    enum status st = nccl_symbol("nccl_lib_comm_create", &f);
    if (st != STATUS_OK) return st;
    __typeof__(nccl_lib_comm_create) *create = (__typeof__(nccl_lib_comm_create) *)f;
    return create(w, name, id, rank, size, device_id, stream, out);
}
