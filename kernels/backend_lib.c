/* kernels/backend_lib.c - finding and dlopen()ing shardlm's optional shared libraries
 * (libshardlm_cuda.so, libshardlm_nccl.so) on first use; see backend_lib.h.
 * Not here: the function tables resolved from them (backend_cuda_loader.c,
 * engine/parallel/parallel_nccl_loader.c).
 * Tests: tests/test_cuda_lazy.sh. */
#include "backend_lib.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One lock for every library: opening happens once per library per process. */
static pthread_mutex_t backend_lib_lock = PTHREAD_MUTEX_INITIALIZER;

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int backend_lib_find(const struct backend_lib *lib, char *buf, size_t n)
{
    const char *env = lib->env ? getenv(lib->env) : NULL;
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return 1;
    }
    /* Next to the executable: the installed layout (bin/shardlm beside bin/libshardlm_cuda.so). */
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char beside[4096 + 256] = "";
    if (len > 0) {
        exe[len] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = '\0';
            snprintf(beside, sizeof beside, "%s/%s", exe, lib->file);
            if (file_exists(beside)) {
                snprintf(buf, n, "%s", beside);
                return 1;
            }
        }
    }
    /* The build tree: tests and the shardlm binary run from where the build wrote them. */
    if (lib->build_path && file_exists(lib->build_path)) {
        snprintf(buf, n, "%s", lib->build_path);
        return 1;
    }
    snprintf(buf, n, "%s (nor %s, nor $%s)", beside[0] ? beside : lib->file,
             lib->build_path ? lib->build_path : "a build-tree copy", lib->env ? lib->env : "-");
    return 0;
}

enum status backend_lib_open(struct backend_lib *lib, void **handle)
{
    pthread_mutex_lock(&backend_lib_lock);
    if (!lib->tried) {
        lib->tried = 1;
        if (!backend_lib_find(lib, lib->path, sizeof lib->path)) {
            snprintf(lib->error, sizeof lib->error, "no such file");
        } else {
            dlerror();
            lib->handle = dlopen(lib->path, RTLD_NOW | RTLD_LOCAL);
            if (!lib->handle) {
                const char *e = dlerror();
                snprintf(lib->error, sizeof lib->error, "%s", e ? e : "dlopen failed");
            } else {
                LOG_DEBUG("kernels", "loaded %s", lib->path);
            }
        }
    }
    *handle = lib->handle;
    pthread_mutex_unlock(&backend_lib_lock);
    if (!*handle)
        return status_errorf(STATUS_UNAVAILABLE, "cannot load %s: %s: %s", lib->file, lib->path,
                             lib->error);
    return STATUS_OK;
}

enum status backend_lib_symbol(struct backend_lib *lib, const char *symbol, void **out)
{
    void *handle = NULL;
    enum status st = backend_lib_open(lib, &handle);
    *out = NULL;
    if (st != STATUS_OK) return st;
    dlerror();
    *out = dlsym(handle, symbol);
    if (!*out) {
        const char *e = dlerror();
        return status_errorf(STATUS_UNAVAILABLE, "%s: no symbol %s (a library from another "
                             "build of shardlm?): %s", lib->path, symbol, e ? e : "");
    }
    return STATUS_OK;
}
