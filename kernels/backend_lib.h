/* kernels/backend_lib.h - opening one of shardlm's own optional shared libraries
 * (libshardlm_cuda.so: the CUDA backend with cuBLAS and the CUDA runtime; libshardlm_nccl.so:
 * the NCCL communicator) only when a caller first needs it, so that a process that never opens
 * a GPU never maps the GPU libraries (their pages cost ~150 MiB of resident memory,
 * docs/performance.md "Peak RSS").
 * Not here: the backends or NCCL themselves; which functions a library exports (its loader:
 * kernels/backend_cuda_loader.c, engine/parallel/parallel_nccl_loader.c).
 * Tests: tests/test_cuda_lazy.sh (a CPU run maps no CUDA library; a missing library is a
 * clear STATUS_UNAVAILABLE). */
#ifndef SHARDLM_BACKEND_LIB_H
#define SHARDLM_BACKEND_LIB_H

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One optional library. The loader declares it static, zero-initialised except for the three
 * names; backend_lib_open fills in the rest, once per process (the library stays loaded until
 * exit: dlclose under a live backend's function pointers would be a use after free). */
struct backend_lib {
    const char *file;       /* "libshardlm_cuda.so" */
    const char *env;        /* "SHARDLM_CUDA_LIB": a path that overrides the search */
    const char *build_path; /* where the build wrote it (the build tree), or NULL */
    /* Filled by backend_lib_open under its lock: */
    int         tried;
    void       *handle;     /* dlopen's handle, NULL when the open failed */
    char        path[4096]; /* the path opened or, on failure, the last one tried */
    char        error[1024];/* dlerror() or the search's explanation when handle is NULL */
};

/* The path backend_lib_open would try, without opening anything: $env when set; otherwise
 * <directory of /proc/self/exe>/<file> when that file exists; otherwise build_path when that
 * exists. Returns 1 and writes the path into buf (n bytes), or 0 when none exists (buf then
 * holds the locations searched). Cheap: a readlink and two stat calls. Any thread. */
int backend_lib_find(const struct backend_lib *lib, char *buf, size_t n);

/* dlopen()s the library (RTLD_NOW | RTLD_LOCAL) on the first call and returns its handle on
 * every call; thread-safe. A missing or unloadable library (or an unresolved symbol: the host
 * executable must export what the library uses, see kernels/CMakeLists.txt) is
 * STATUS_UNAVAILABLE with a message naming the path and dlerror(), again on every later call. */
enum status backend_lib_open(struct backend_lib *lib, void **handle);

/* The address of `symbol` in an opened library, or STATUS_UNAVAILABLE naming the library and
 * the symbol (a library from another build of shardlm). */
enum status backend_lib_symbol(struct backend_lib *lib, const char *symbol, void **out);

#ifdef __cplusplus
}
#endif

#endif
