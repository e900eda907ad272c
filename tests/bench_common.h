/* tests/bench_common.h - what the C benchmarks share (bench_ops, bench_attention, bench_quant):
 * the clock, the best-of-repetitions timer, the CPU's name, host buffers of a backend with a
 * cheap deterministic fill, and the paged-attention batch description. Header-only (static functions): each benchmark is one program.
 * Not here: any figure or comparison (each benchmark prints its own). */
#ifndef SHARDLM_BENCH_COMMON_H
#define SHARDLM_BENCH_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_isa.h"
#include "ops.h"

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Calls fn(ctx) once to warm up, then repeatedly until min_time seconds have passed (at least
 * min_reps and at most max_reps times); returns the best time of one call. */
static inline double bench_time_best(double min_time, int min_reps, int max_reps, void (*fn)(void *), void *ctx)
{
    fn(ctx);
    double best = INFINITY, start = bench_now_s();
    for (int rep = 0; rep < max_reps; rep++) {
        double t0 = bench_now_s();
        fn(ctx);
        double t = bench_now_s() - t0;
        if (t < best) best = t;
        if (rep + 1 >= min_reps && bench_now_s() - start > min_time) break;
    }
    return best;
}

/* The "model name" of /proc/cpuinfo into model (n bytes), "unknown" where there is none. */
static inline void bench_cpu_model(char *model, size_t n)
{
    snprintf(model, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        const char *c = strchr(line, ':');
        if (!c) continue;
        for (c++; *c == ' ' || *c == '\t'; c++) {}
        snprintf(model, n, "%s", c);
        model[strcspn(model, "\n")] = 0;
        break;
    }
    fclose(f);
}

/* The CPU model, the instruction-set level (SHARDLM_CPU_ISA caps it) and each kernel family's
 * path, on one line (kernels/cpu/cpu_isa.h). */
static inline void bench_print_isa(void)
{
    char line[384];
    printf("kernels: %s\n", cpu_isa_describe(line, sizeof line));
}

static inline void *bench_alloc_host(struct backend *b, size_t nbytes)
{
    void *p = NULL;
    enum status st = backend_alloc(b, nbytes, &p);
    CHECK(st == STATUS_OK, "backend_alloc(%zu): %s", nbytes, status_message());
    return p;
}

/* Fills n floats with a cheap deterministic pattern in [-1, 1). */
static inline void bench_fill_f32(float *p, size_t n, uint32_t seed)
{
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (float)(s >> 8) * 0x1p-23f - 1.0f;
    }
}

/* A block table of n_blocks entries, 0 .. n_blocks - 1, in a Fisher-Yates order when shuffled
 * (a long-running server's pool), else in order. */
static inline int32_t *bench_block_table(struct backend *b, int n_blocks, int shuffled)
{
    int32_t *table = bench_alloc_host(b, (size_t)n_blocks * 4);
    for (int i = 0; i < n_blocks; i++) table[i] = i;
    uint32_t s = 12345u;
    for (int i = shuffled ? n_blocks - 1 : 0; i > 0; i--) { /* with a small LCG */
        s = s * 1664525u + 1013904223u;
        int j = (int)((s >> 8) % (uint32_t)(i + 1)), t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    return table;
}

/* The paged-attention batch over host arrays: n_seqs sequences with q_start (n_seqs + 1),
 * seq_len (n_seqs) and block tables (n_seqs, per_seq) of bt-token blocks; scale 1/sqrt(hd). */
static inline struct attention_batch bench_attention_batch(int n_seqs, int bt, int per_seq, int32_t *q_start,
                                                           int32_t *seq_len, int32_t *table, int64_t hd,
                                                           int window)
{
    return (struct attention_batch){
        .n_seqs = n_seqs,
        .block_tokens = bt,
        .max_blocks = per_seq,
        .q_start = tensor_make(q_start, DTYPE_I32, DEVICE_CPU, 1, (int64_t)(n_seqs + 1)),
        .seq_len = tensor_make(seq_len, DTYPE_I32, DEVICE_CPU, 1, (int64_t)n_seqs),
        .block_table = tensor_make(table, DTYPE_I32, DEVICE_CPU, 2, (int64_t)n_seqs, (int64_t)per_seq),
        .scale = 1.0f / sqrtf((float)hd),
        .window = window,
    };
}

#endif
