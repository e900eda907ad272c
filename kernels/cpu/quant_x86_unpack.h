/* kernels/cpu/quant_x86_unpack.h - AVX2 unpacking of ggml block bits into bytes, shared by the
 * x86 products (quant_x86.h) and the AVX2 dequantizer (quant_dequantize_avx2.c). The functions
 * carry target("avx2") only, so that callers of any x86 target (with or without FMA) inline them.
 * Tests: tests/test_quant.c. */
#ifndef SHARDLM_QUANT_X86_UNPACK_H
#define SHARDLM_QUANT_X86_UNPACK_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define QX_UNPACK __attribute__((target("avx2")))

/* Decode streams the weights from L3 or DRAM once per token, row after row: the products ask
 * for the lines QX_PREFETCH_AHEAD bytes ahead of the block they read (a row ends where the next
 * one starts, so this runs on into the next row). On the 2-core Xeon with other work running, Gemma
 * 3 270M's decode took 1.2 % less CPU time with it (perf stat task-clock, three alternating runs
 * each); distances of 0 to 8 KB could not be told apart in bench_quant's LM head there. */
#define QX_PREFETCH_AHEAD 640

/* The packed products (eight rows at a time, quant_packed.c's layout) stream one contiguous run
 * of weights per thread, and the hardware prefetchers alone left Gemma 3 270M's Q8_0 LM head at
 * about 0.6 of one core's read bandwidth on the 2-core Xeon; asking for the lines
 * quant_prefetch_far bytes ahead (SHARDLM_CPU_PREFETCH, default 4096, set once by quant.c before
 * any packed product) took it to the read loop's speed, and decode from 27-28 to 31-35 tok/s
 * (docs/performance.md). 640 (the stored rows' distance) was too short for it. */
extern size_t quant_prefetch_far;
static inline void qx_prefetch_far(const void *block, size_t bytes)
{
    if (!quant_prefetch_far) return;
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)block + quant_prefetch_far + o, _MM_HINT_T0);
}
static inline void qx_prefetch(const void *block, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)block + QX_PREFETCH_AHEAD + o, _MM_HINT_T0);
}

/* The 32 elements of a Q4 block as bytes 0..15: low nibbles (elements 0-15) in the low lane,
 * high nibbles (16-31) in the high lane. */
QX_UNPACK static inline __m256i qx_nibbles(const uint8_t qs[16])
{
    const __m128i q = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F));
}

/* Byte i = 0x10 when bit i of the little-endian u32 qh is set: the fifth bits of a Q5 block. */
QX_UNPACK static inline __m256i qx_fifth_bits(const uint8_t qh[4])
{
    uint32_t v;
    memcpy(&v, qh, 4);
    /* Bytes 0-7 of the result take qh's byte 0, 8-15 byte 1, and so on; then each byte keeps
     * its own bit (i mod 8). */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)v),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

#endif
