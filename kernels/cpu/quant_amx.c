/* kernels/cpu/quant_amx.c - Q8_0 products over the packed layout on Intel AMX int8 tiles, for
 * the few rows of x of a step that verifies drafts or decodes a small batch (2 to 16 rows at a
 * time): the rows of x are the tiles' A (their int8 quants read in place, one block of 32 a
 * tile), a packed block of eight rows of w is B as it is stored (its eight chunks of 32 bytes
 * are the instruction's four-byte groups: quant_impl.h), C the block's exact integer sums.
 * tdpbsud (signed x, unsigned w + 128) gives sum((w + 128) x) in int32 exactly, the sum the
 * VNNI kernels' vpdpbusd gives, and the block's float step is theirs (is - 128 sum(x),
 * acc = fma(d_w d_x, is, acc), y = acc + 0): the block-exact order of quant_impl.h, so every row
 * has the bits of the one-row kernels on any CPU.
 * Why: the VNNI kernels multiply in the vector units, so on a CPU with fast memory the LM head
 * of Gemma 3 (262,144 x 640 Q8_0) costs 1.6x a row's time at four rows (bench_quant --verify):
 * the tiles take the rows' products off the vector units.
 * Tiles: A in tmm0-1 (rows x 32 bytes), B in tmm2-3 (8 x 32 bytes), C in tmm4-5 (rows x 8
 * int32), two blocks in flight. The tiles are on where cpu_amx_enabled() (SHARDLM_CPU_ISA below
 * amx turns them off); quant.c decides when (quant_amx_rows).
 * Tests: tests/test_quant.c (check_packed: every row count's bits equal the stored product's,
 * AMX on and off); benchmark: tests/bench_quant.c --verify. */
#include "quant_impl.h"

#include <stddef.h>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "amx_tiles.h"
#include "quant_x86_unpack.h" /* quant_prefetch_far */

#define QA_TARGET __attribute__((target("avx2,fma,f16c")))

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

/* Three groups at a time: block b of x in tmm0, the groups' blocks in tmm1-3, their sums in
 * tmm4-6 (three independent chains of load, product and store in flight); then block b's float
 * step for each group and row. Inlined for each row count, so that the accumulators stay in
 * registers. */
QA_TARGET __attribute__((always_inline)) static inline void
rows_run(int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq, size_t xs, const int rows,
         float *y, int64_t ys)
{
    _Alignas(64) int32_t ct[3][16][8];
    const size_t qs = offsetof(struct act_q8, qs);
    for (int64_t g = 0; g < groups; g += 3) {
        const int ng = groups - g < 3 ? (int)(groups - g) : 3;
        const uint8_t *w = wp + (size_t)g * w_step;
        __m256 acc[3][16];
        for (int h = 0; h < 3; h++)
            for (int r = 0; r < rows; r++) acc[h][r] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *wb = w + (size_t)b * QUANT_R8_Q8_0, *xb = xq + (size_t)b * sizeof(struct act_q8);
            /* The three groups are one contiguous run of 3 w_step bytes: ask for the next run's
             * lines, as much of it each block as this run reads. */
            if (quant_prefetch_far)
                for (size_t o = 0; o < 3 * QUANT_R8_Q8_0; o += 64)
                    _mm_prefetch((const char *)w + 3 * w_step + (size_t)b * 3 * QUANT_R8_Q8_0 + o, _MM_HINT_T0);
            TILE_LOAD(0, xb + qs, xs);
            TILE_LOAD(1, wb + 16, 32);
            TILE_ZERO(4);
            TILE_DPBSUD(4, 0, 1);
            if (ng > 1) {
                TILE_LOAD(2, wb + w_step + 16, 32);
                TILE_ZERO(5);
                TILE_DPBSUD(5, 0, 2);
            }
            if (ng > 2) {
                TILE_LOAD(3, wb + 2 * w_step + 16, 32);
                TILE_ZERO(6);
                TILE_DPBSUD(6, 0, 3);
            }
            __m256 dx[16];
            __m256i off[16];
            for (int r = 0; r < rows; r++) {
                const struct act_q8 *x = (const struct act_q8 *)(xb + (size_t)r * xs);
                dx[r] = _mm256_set1_ps(x->d);
                off[r] = _mm256_set1_epi32(128 * x->sum);
            }
            TILE_STORE(4, ct[0], 32);
            if (ng > 1) TILE_STORE(5, ct[1], 32);
            if (ng > 2) TILE_STORE(6, ct[2], 32);
            for (int h = 0; h < ng; h++) {
                const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wb + (size_t)h * w_step)));
                for (int r = 0; r < rows; r++) {
                    const __m256i is = _mm256_sub_epi32(_mm256_load_si256((const __m256i *)ct[h][r]), off[r]);
                    acc[h][r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx[r]), _mm256_cvtepi32_ps(is), acc[h][r]);
                }
            }
        }
        for (int h = 0; h < ng; h++)
            for (int r = 0; r < rows; r++) /* acc + 0, as the others */
                _mm256_storeu_ps(y + r * ys + (g + h) * 8, _mm256_add_ps(acc[h][r], _mm256_setzero_ps()));
    }
}

QA_TARGET void quant_amx_packed_q8_0(int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq,
                                     size_t xs, int rows, float *y, int64_t ys)
{
    config(rows);
    switch (rows) {
#define ROWS(R) \
    case R: rows_run(nb, wp, w_step, groups, xq, xs, R, y, ys); break;
        ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7) ROWS(8)
#undef ROWS
    default: rows_run(nb, wp, w_step, groups, xq, xs, rows, y, ys); break;
    }
    TILE_RELEASE();
}

#else

void quant_amx_packed_q8_0(int64_t nb, const uint8_t *wp, size_t w_step, int64_t groups, const uint8_t *xq, size_t xs,
                           int rows, float *y, int64_t ys)
{
    (void)nb, (void)wp, (void)w_step, (void)groups, (void)xq, (void)xs, (void)rows, (void)y, (void)ys;
}

#endif
