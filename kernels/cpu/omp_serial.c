/* kernels/cpu/omp_serial.c - a parallel region of one thread runs on the calling thread, without
 * libgomp's team machinery.
 *
 * GCC compiles `#pragma omp parallel ... num_threads(nt) if (nt > 1)` into a call of
 * GOMP_parallel(fn, data, 1, flags) whenever the region gets one thread (nt = 1, or the if clause
 * false); libgomp then still builds a team of one (a malloc, a free, a futex wake on its barrier):
 * about 0.9 us per region on the 2-core AMD EPYC VM (a loop of empty regions, 2026-11-28), and a
 * decode step of a small model meets about a hundred regions (every op of every layer), all of
 * one thread at --threads 1 and most at --threads 2 (ops below their parallel threshold). strace
 * counted 79 futex calls per token of stories260K at --threads 1.
 *
 * This definition of GOMP_parallel, linked into every executable that links shardlm_kernels
 * (the executable's symbol wins over libgomp's), calls fn(data) directly when one thread is
 * asked for, and hands every other region to libgomp's own GOMP_parallel (found once with
 * dlsym(RTLD_NEXT)). The body then runs as an orphaned region of the calling thread: worksharing
 * loops (any schedule), critical sections and omp_get_thread_num() (0) behave as in a team of
 * one; omp_get_level() reads 0 instead of 1, which no kernel asks. GOMP_parallel's signature is
 * libgomp's ABI since GCC 4.9. Clang's OpenMP runtime (__kmpc_fork_call) never calls it: there
 * this file changes nothing.
 * Tests: tests/test_omp_serial.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*gomp_region_fn)(void *);
typedef void (*gomp_parallel_fn)(gomp_region_fn, void *, unsigned, unsigned);

void GOMP_parallel(gomp_region_fn fn, void *data, unsigned num_threads, unsigned flags);

void GOMP_parallel(gomp_region_fn fn, void *data, unsigned num_threads, unsigned flags)
{
    if (num_threads == 1) { /* 0 means the default team size */
        fn(data);
        return;
    }
    /* Racing first calls find the same function. */
    static gomp_parallel_fn real;
    gomp_parallel_fn f = __atomic_load_n(&real, __ATOMIC_ACQUIRE);
    if (!f) {
        f = (gomp_parallel_fn)dlsym(RTLD_NEXT, "GOMP_parallel");
        if (!f) {
            fprintf(stderr, "shardlm: libgomp's GOMP_parallel not found (%s)\n", dlerror());
            abort();
        }
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    f(fn, data, num_threads, flags);
}
