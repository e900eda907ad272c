/* kernels/cpu/quant_amx.c - the 32-element block types over the packed layout (Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0) on Intel AMX int8 tiles, for the few rows of x of a step that verifies drafts,
 * decodes a batch or fills a short prompt (2 to 16 rows a call): the rows of x are the tiles' A
 * (their int8 quants read in place, one block of 32 a tile), a packed block of eight rows of w is
 * B (Q8_0's eight chunks of 32 bytes as stored: they are the instruction's four-byte groups,
 * quant_impl.h; the nibble types' unpacked per block into 256 bytes first, the fifth bits ORed
 * in), C the block's exact integer sums. tdpbsud (signed x, unsigned w) gives sum(q x) in int32
 * exactly, the sum the VNNI kernels' vpdpbusd gives, and the block's float step is theirs
 * (is - zero sum(x), acc = fma(d_w d_x, is, acc), accm = fma(m, d_x sum(x), accm), y = acc +
 * accm): the block-exact order of quant_impl.h, so every row has the bits of the one-row kernels
 * on any CPU.
 * Why: the VNNI kernels multiply in the vector units, so on a CPU with fast memory the LM head
 * of Gemma 3 (262,144 x 640 Q8_0) cost 1.8x a row's time at five rows (bench_quant --verify); the
 * tiles take the rows' products off the vector units (1.26x).
 * Tiles: A in tmm0 (rows x 32 bytes), B in tmm1-3 (8 x 32 bytes), C in tmm4-6 (rows x 8 int32):
 * three groups of w in flight. On where quant_amx_int8_on() (quant.c: cpu_amx_enabled and not
 * SHARDLM_CPU_AMX_INT8=0); quant.c's packed_tile decides when (2 rows or more).
 * Not here: the K-quants (their sub-block scales would need an integer step per 32 elements and
 * row; they stay on the VNNI kernels below the bf16 tiles' 96 rows, matmul.c).
 * Tests: tests/test_quant.c (check_packed_amx: every row count's bits equal the stored product's,
 * each type); benchmark: tests/bench_quant.c --verify. */
#include "quant_impl.h"

#include <stddef.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "amx_tiles.h"
#include "quant_x86_unpack.h" /* quant_prefetch_far */

#define QA_TARGET __attribute__((target("avx512bw,avx512vl,avx2,fma,f16c")))

/* C += A . B, A signed bytes and B unsigned, in AT&T operand order: B, A, C. */
#define TILE_DPBSUD(c, a, b) __asm__ volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

static void config(int rows)
{
    struct amx_tilecfg cfg = {.palette = 1};
    for (int t = 0; t < 7; t++) {
        cfg.colsb[t] = 32;
        cfg.rows[t] = (uint8_t)(t >= 1 && t <= 3 ? 8 : rows);
    }
    TILE_CONFIG(cfg);
}

/* Where a packed block's parts lie (quant_impl.h): its bytes, whether it has mins (Q4_1, Q5_1:
 * eight f16 after the scales), fifth bits (Q5: eight 32-bit masks after those), and the offset
 * of its unsigned quants (Q4_0 8, Q5_0 16, Q8_0 128; 0 with a min, which the min term carries). */
struct geom {
    size_t bytes, head;
    int min, five, q8;
    int32_t zero;
};

QA_TARGET static inline __mmask32 u32_mask(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return (__mmask32)v;
}

/* The block's 32 quants of its eight rows as the tile wants them (unsigned, 0..31), into bt (256
 * bytes): line t (elements 4 t .. 4 t + 3 of each row) is the low nibbles of chunk t (t < 4) or
 * the high nibbles of chunk t - 4, with the fifth bits ORed in for Q5. */
QA_TARGET static inline void unpack_q45(const struct geom *g, const uint8_t *blk, uint8_t *bt)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), b5 = _mm256_set1_epi8(0x10);
    const uint8_t *hb = blk + g->head, *qs = g->five ? hb + 32 : hb;
    for (int j = 0; j < 4; j++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (g->five) {
            lo = _mm256_or_si256(lo, _mm256_maskz_mov_epi8(u32_mask(hb + 8 * j), b5));
            hi = _mm256_or_si256(hi, _mm256_maskz_mov_epi8(u32_mask(hb + 8 * j + 4), b5));
        }
        _mm256_store_si256((__m256i *)(bt + 32 * j), lo);
        _mm256_store_si256((__m256i *)(bt + 128 + 32 * j), hi);
    }
}

/* Three groups at a time: block b of x in tmm0, the groups' blocks in tmm1-3 (Q8_0's read in
 * place, the nibble types' unpacked into bt first), their sums in tmm4-6 (three independent
 * chains of load, product and store in flight); then block b's float step for each group and
 * row, the VNNI kernels' (is - zero sum(x); acc = fma(d_w d_x, is, acc); accm = fma(m, d_x
 * sum(x), accm); y = acc + accm). Inlined for each type and row count, so that the accumulators
 * stay in registers. */
QA_TARGET __attribute__((always_inline)) static inline void
rows_run(const struct geom g, int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq,
         size_t xs, const int rows, float *y, int64_t ys)
{
    _Alignas(64) int32_t ct[3][16][8];
    _Alignas(64) uint8_t bt[3][256];
    const size_t qs = offsetof(struct act_q8, qs);
    for (int64_t gi = 0; gi < groups; gi += 3) {
        const int ng = groups - gi < 3 ? (int)(groups - gi) : 3;
        const uint8_t *w = wp + (size_t)gi * w_step;
        __m256 acc[3][16], accm[3][16];
        for (int h = 0; h < 3; h++)
            for (int r = 0; r < rows; r++) acc[h][r] = accm[h][r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = w + (size_t)b * g.bytes, *xb = xq + (size_t)b * sizeof(struct act_q8);
            /* The three groups are one contiguous run of 3 w_step bytes: ask for the next run's
             * lines, as much of it each block as this run reads. */
            if (quant_prefetch_far)
                for (size_t o = 0; o < 3 * g.bytes; o += 64)
                    _mm_prefetch((const char *)w + 3 * w_step + (size_t)b * 3 * g.bytes + o, _MM_HINT_T0);
            const uint8_t *src[3]; /* each group's B: 8 lines of 32 bytes */
            for (int h = 0; h < ng; h++) {
                if (g.q8) {
                    src[h] = wb + (size_t)h * w_step + 16;
                } else {
                    unpack_q45(&g, wb + (size_t)h * w_step, bt[h]);
                    src[h] = bt[h];
                }
            }
            TILE_LOAD(0, xb + qs, xs);
            TILE_LOAD(1, src[0], 32);
            TILE_ZERO(4);
            TILE_DPBSUD(4, 0, 1);
            if (ng > 1) {
                TILE_LOAD(2, src[1], 32);
                TILE_ZERO(5);
                TILE_DPBSUD(5, 0, 2);
            }
            if (ng > 2) {
                TILE_LOAD(3, src[2], 32);
                TILE_ZERO(6);
                TILE_DPBSUD(6, 0, 3);
            }
            __m256 dx[16], dsum[16];
            __m256i off[16];
            for (int r = 0; r < rows; r++) {
                const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)r * xs);
                dx[r] = _mm256_set1_ps(x->d);
                if (g.min) dsum[r] = _mm256_set1_ps(x->dsum);
                else off[r] = _mm256_set1_epi32(g.zero * x->sum);
            }
            TILE_STORE(4, ct[0], 32);
            if (ng > 1) TILE_STORE(5, ct[1], 32);
            if (ng > 2) TILE_STORE(6, ct[2], 32);
            for (int h = 0; h < ng; h++) {
                const uint8_t *blk = wb + (size_t)h * w_step;
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
                const __m256 mw = g.min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16))) : dw;
                for (int r = 0; r < rows; r++) {
                    __m256i is = _mm256_load_si256((const __m256i *)ct[h][r]);
                    if (!g.min) is = _mm256_sub_epi32(is, off[r]);
                    acc[h][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[r]), _mm256_cvtepi32_ps(is), acc[h][r]);
                    if (g.min) accm[h][r] = _mm256_fmadd_ps(mw, dsum[r], accm[h][r]);
                }
            }
        }
        for (int h = 0; h < ng; h++)
            for (int r = 0; r < rows; r++) /* acc + accm (+ 0 without a min), as the others */
                _mm256_storeu_ps(y + r * ys + (gi + h) * 8, _mm256_add_ps(acc[h][r], accm[h][r]));
    }
}

#define GEOM_Q8_0 ((struct geom){QUANT_R8_Q8_0, 16, 0, 0, 1, 128})
#define GEOM_Q4_0 ((struct geom){QUANT_R8_Q4_0, 16, 0, 0, 0, 8})
#define GEOM_Q4_1 ((struct geom){QUANT_R8_Q4_1, 32, 1, 0, 0, 0})
#define GEOM_Q5_0 ((struct geom){QUANT_R8_Q5_0, 16, 0, 1, 0, 16})
#define GEOM_Q5_1 ((struct geom){QUANT_R8_Q5_1, 32, 1, 1, 0, 0})

#define TYPE_RUN(G)                                                                   \
    switch (rows) {                                                                   \
    case 2: rows_run(G, nb, wp, w_step, groups, xq, xs, 2, y, ys); break;             \
    case 3: rows_run(G, nb, wp, w_step, groups, xq, xs, 3, y, ys); break;             \
    case 4: rows_run(G, nb, wp, w_step, groups, xq, xs, 4, y, ys); break;             \
    case 5: rows_run(G, nb, wp, w_step, groups, xq, xs, 5, y, ys); break;             \
    case 8: rows_run(G, nb, wp, w_step, groups, xq, xs, 8, y, ys); break;             \
    case 16: rows_run(G, nb, wp, w_step, groups, xq, xs, 16, y, ys); break;           \
    default: rows_run(G, nb, wp, w_step, groups, xq, xs, rows, y, ys); break;         \
    }

QA_TARGET int quant_amx_packed(int slot, int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups,
                               const uint8_t *xq, size_t xs, int rows, float *y, int64_t ys)
{
    if (slot != SLOT_Q8_0 && slot != SLOT_Q4_0 && slot != SLOT_Q4_1 && slot != SLOT_Q5_0 && slot != SLOT_Q5_1)
        return 0;
    config(rows);
    if (slot == SLOT_Q8_0) TYPE_RUN(GEOM_Q8_0)
    else if (slot == SLOT_Q4_0) TYPE_RUN(GEOM_Q4_0)
    else if (slot == SLOT_Q4_1) TYPE_RUN(GEOM_Q4_1)
    else if (slot == SLOT_Q5_0) TYPE_RUN(GEOM_Q5_0)
    else TYPE_RUN(GEOM_Q5_1)
    TILE_RELEASE();
    return 1;
}

#else

int quant_amx_packed(int slot, int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq,
                     size_t xs, int rows, float *y, int64_t ys)
{
    (void)slot, (void)nb, (void)wp, (void)w_step, (void)groups, (void)xq, (void)xs, (void)rows, (void)y, (void)ys;
    return 0;
}

#endif
