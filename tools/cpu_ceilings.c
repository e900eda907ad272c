/* tools/cpu_ceilings.c - this machine's two ceilings for a CPU LLM engine, measured, so that a
 * benchmark can print a speed as a fraction of what the hardware allows (issue 30):
 *   read     GB/s of a plain streaming read of a 1 GiB buffer (beyond every cache), widest
 *            vector loads, at 1 and 2 threads: decode streams every weight once per token; the
 *            buffer on transparent huge pages (MADV_HUGEPAGE, as shardlm's weights on the CPU),
 *            and read_4k_gbs the same on 4 KB pages (as a mapped file's);
 *   fma      f32 GFLOP/s of independent fused multiply-adds in registers (12 chains, widest
 *            vectors, 2 flops each), at 1 and 2 threads: prefill is f32 or int8 products.
 * Built by tools/bench_vs_llamacpp.sh with -O2 -march=native -fopenmp (the vector width and FMA
 * follow the CPU it is built on). Prints one JSON object:
 *   {"read_gbs": [1 thread, 2 threads], "read_4k_gbs": [...], "fma_gflops": [...], "vector_bits": N}
 * Each figure is the best of 5 runs. A probe for benchmarks, not part of shardlm. */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__AVX512F__)
#define VBYTES 64
#elif defined(__AVX__)
#define VBYTES 32
#else
#define VBYTES 16
#endif
typedef float vf __attribute__((vector_size(VBYTES)));
typedef int32_t vi __attribute__((vector_size(VBYTES)));

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* GB/s of reading n bytes at p with `threads` threads (4 vector loads per step). */
static double read_gbs(const char *p, size_t n, int threads)
{
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        vi total = {0};
        const double t0 = now();
        #pragma omp parallel num_threads(threads)
        {
            vi s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
            #pragma omp for schedule(static)
            for (size_t i = 0; i < n; i += 4 * VBYTES) {
                s0 ^= *(const vi *)(p + i);
                s1 ^= *(const vi *)(p + i + VBYTES);
                s2 ^= *(const vi *)(p + i + 2 * VBYTES);
                s3 ^= *(const vi *)(p + i + 3 * VBYTES);
            }
            #pragma omp critical
            total ^= s0 ^ s1 ^ s2 ^ s3;
        }
        const double t = now() - t0, gbs = (double)n / t * 1e-9;
        if (gbs > best) best = gbs;
        if (total[0] == 12345) printf(" "); /* keeps the loads */
    }
    return best;
}

/* GFLOP/s of 12 independent chains of a = a * b + c per thread. */
static double fma_gflops(int threads)
{
    const long iters = 20000000;
    double best = 0.0;
    for (int rep = 0; rep < 5; rep++) {
        float sink = 0.0f;
        const double t0 = now();
        #pragma omp parallel num_threads(threads) reduction(+ : sink)
        {
            const vf b = (vf){0} + 0.999999f, c = (vf){0} + 1e-7f;
            vf a0 = b * 0.1f, a1 = b * 0.2f, a2 = b * 0.3f, a3 = b * 0.4f, a4 = b * 0.5f, a5 = b * 0.6f;
            vf a6 = b * 0.7f, a7 = b * 0.8f, a8 = b * 0.9f, a9 = b * 1.1f, a10 = b * 1.2f, a11 = b * 1.3f;
            for (long i = 0; i < iters; i++) {
                a0 = a0 * b + c, a1 = a1 * b + c, a2 = a2 * b + c, a3 = a3 * b + c;
                a4 = a4 * b + c, a5 = a5 * b + c, a6 = a6 * b + c, a7 = a7 * b + c;
                a8 = a8 * b + c, a9 = a9 * b + c, a10 = a10 * b + c, a11 = a11 * b + c;
                /* Opaque to the optimiser, so that no chain is folded or hoisted. */
                __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
                __asm__ volatile("" : "+x"(a6), "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
            }
            const vf a[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};
            for (int j = 0; j < 12; j++) sink += a[j][0];
        }
        const double t = now() - t0;
        const double flops = (double)threads * (double)iters * 12.0 * (VBYTES / 4) * 2.0;
        if (flops / t * 1e-9 > best) best = flops / t * 1e-9;
        if (sink == 12345.0f) printf(" ");
    }
    return best;
}

int main(void)
{
    const size_t n = (size_t)1 << 30;
    char *p = aligned_alloc((size_t)2 << 20, n), *q = aligned_alloc(4096, n);
    if (!p || !q) {
        fprintf(stderr, "cpu_ceilings: out of memory\n");
        return 1;
    }
    (void)madvise(p, n, MADV_HUGEPAGE);
    memset(p, 1, n);
    printf("{\"read_gbs\": [%.2f, %.2f], ", read_gbs(p, n, 1), read_gbs(p, n, 2));
    free(p);
    memset(q, 1, n);
    printf("\"read_4k_gbs\": [%.2f, %.2f], ", read_gbs(q, n, 1), read_gbs(q, n, 2));
    free(q);
    printf("\"fma_gflops\": [%.1f, %.1f], \"vector_bits\": %d}\n", fma_gflops(1), fma_gflops(2), VBYTES * 8);
    return 0;
}
