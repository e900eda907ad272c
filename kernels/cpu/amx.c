/* kernels/cpu/amx.c - matrix products on Intel AMX tiles (AMX-BF16: Sapphire Rapids and later):
 * y = x @ w^T with x rounded to bf16 once per product and w given as bf16 rows (bf16 weights
 * as stored, block-quantized ones dequantized and rounded a tile of rows at a time by
 * matmul.c). Products of bf16 values are exact in the f32 accumulators, so the result is the
 * f32 product of the bf16-rounded operands up to f32 reassociation.
 *
 * Tile roles: A (16 rows x 32 bf16) is 16 rows of w, read in place (row-major, stride 2k);
 * B (16 pairs of k x 16 columns) is x packed once per product in the pair-interleaved layout
 * the instruction wants ("VNNI": for each of 16 rows of x, a dword holding x[2r], x[2r+1]);
 * C (16 x 16 f32) is y^T for 16 rows of w and 16 rows of x, transposed on the way out.
 * Register blocking 2 x 2: C in tmm0-3, A in tmm4-5, B in tmm6-7.
 *
 * The instructions: amx_tiles.h (shared with quant_amx.c, Q8_0's int8 products). Whether the CPU has the tiles (and Linux's
 * permission for their state, arch_prctl(ARCH_REQ_XCOMP_PERM)) is cpu_isa.c's question: the
 * tiles are used when cpu_isa() is CPU_ISA_AMX. SHARDLM_CPU_ISA below amx, or its older alias
 * SHARDLM_CPU_AMX=0, turns the path off (f32 products as on other CPUs).
 * Not here: when to use it (matmul.c).
 * Tests: tests/test_quant.c (against the f64 product of the bf16-rounded operands, and
 * op_matmul with and without it); benchmark: tests/bench_quant.c. */
#include "cpu_isa.h"
#include "cpu_ops.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__)
#include <immintrin.h>

#include "amx_tiles.h"

#define CVT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* C += A . B in AT&T operand order: B, A, C. */
#define TILE_DP(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

static void amx_config(void)
{
    struct amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = 16;
    TILE_CONFIG(cfg);
}

static void amx_release(void) { TILE_RELEASE(); }

/* n floats (a multiple of 32) to bf16, round to nearest even. */
CVT_TARGET static void round_bf16_x32(uint16_t *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)v);
    }
}
#endif

/* -1 unknown, then 0 or 1. */
static _Atomic int amx_state = -1;

int cpu_amx_enabled(void)
{
    int s = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (s < 0) {
        s = cpu_isa_at_least(CPU_ISA_AMX);
        atomic_store_explicit(&amx_state, s, memory_order_relaxed);
    }
    return s;
}

int cpu_amx_set_enabled(int on)
{
    const int before = cpu_amx_enabled();
    if (on) on = cpu_isa_at_least(CPU_ISA_AMX);
    atomic_store_explicit(&amx_state, on ? 1 : 0, memory_order_relaxed);
    return before;
}

size_t cpu_amx_x_elems(int64_t m, int64_t k) { return (size_t)((m + 15) / 16 * 16) * (size_t)k; }

#if defined(__x86_64__) && defined(__linux__)

void cpu_amx_round_rows(uint16_t *dst, const float *src, int64_t n) { round_bf16_x32(dst, src, n); }

/* Group h of 16 rows of x (m, k) f32 into xv (cpu_amx_x_elems bf16): for each group h and chunk
 * c of 32 columns, 16 lines of 16 dwords, line r of which holds x[h*16 + i][c*32 + 2r .. + 1]
 * at dword i. Rows past m are zero. tmp: k uint16_t. */
void cpu_amx_pack_x(uint16_t *xv, const float *x, int64_t m, int64_t k, int64_t h, uint16_t *tmp)
{
    const int64_t chunks = k / 32;
    uint32_t *dst = (uint32_t *)xv;
    for (int64_t i = h * 16; i < (h + 1) * 16; i++) {
        const int64_t col = i % 16;
        if (i < m) round_bf16_x32(tmp, x + i * k, k);
        else memset(tmp, 0, (size_t)k * sizeof *tmp);
        const uint32_t *pairs = (const uint32_t *)tmp;
        for (int64_t c = 0; c < chunks; c++) {
            uint32_t *line = dst + ((h * chunks + c) * 16) * 16 + col;
            for (int r = 0; r < 16; r++) line[r * 16] = pairs[c * 16 + r];
        }
    }
}

/* The C tiles of one 2 x 2 block into y: tile (a, b) holds y^T for rows b of x, a of w. */
static void store_block(float *y, int64_t ldy, float ct[4][16][16], int64_t m_left, int64_t n_left)
{
    for (int t = 0; t < 4; t++) {
        const int64_t a = t >> 1, bb = t & 1;
        const int64_t rows = m_left - bb * 16 < 16 ? m_left - bb * 16 : 16;
        const int64_t cols = n_left - a * 16 < 16 ? n_left - a * 16 : 16;
        for (int64_t i = 0; i < rows; i++) {
            float *yr = y + (bb * 16 + i) * ldy + a * 16;
            for (int64_t j = 0; j < cols; j++) yr[j] = ct[t][j][i];
        }
    }
}

void cpu_amx_gemm(float *y, int64_t ldy, const uint16_t *xv, const uint16_t *w, int64_t ldw,
                  int64_t m, int64_t nb, int64_t k)
{
    const int64_t chunks = k / 32, groups_x = (m + 15) / 16, groups_w = (nb + 15) / 16;
    const long wstride = (long)ldw * 2;
    float ct[4][16][16];
    amx_config();
    for (int64_t g = 0; g < groups_w; g += 2) {
        const int g2 = g + 1 < groups_w;
        const uint16_t *w0 = w + g * 16 * ldw, *w1 = w0 + 16 * ldw;
        for (int64_t h = 0; h < groups_x; h += 2) {
            const int h2 = h + 1 < groups_x;
            const uint16_t *x0 = xv + h * chunks * 512, *x1 = x0 + chunks * 512;
            TILE_ZERO(0);
            TILE_ZERO(1);
            TILE_ZERO(2);
            TILE_ZERO(3);
            for (int64_t c = 0; c < chunks; c++) {
                TILE_LOAD(4, w0 + c * 32, wstride);
                TILE_LOAD(6, x0 + c * 512, 64);
                TILE_DP(0, 4, 6);
                if (h2) {
                    TILE_LOAD(7, x1 + c * 512, 64);
                    TILE_DP(1, 4, 7);
                }
                if (g2) {
                    TILE_LOAD(5, w1 + c * 32, wstride);
                    TILE_DP(2, 5, 6);
                    if (h2) TILE_DP(3, 5, 7);
                }
            }
            TILE_STORE(0, ct[0], 64);
            TILE_STORE(1, ct[1], 64);
            TILE_STORE(2, ct[2], 64);
            TILE_STORE(3, ct[3], 64);
            const int64_t m_left = (h2 ? 32 : 16) < m - h * 16 ? (h2 ? 32 : 16) : m - h * 16;
            const int64_t n_left = (g2 ? 32 : 16) < nb - g * 16 ? (g2 ? 32 : 16) : nb - g * 16;
            store_block(y + h * 16 * ldy + g * 16, ldy, ct, m_left, n_left);
        }
    }
    amx_release();
}
#else
void cpu_amx_round_rows(uint16_t *dst, const float *src, int64_t n) { (void)dst, (void)src, (void)n; }
void cpu_amx_pack_x(uint16_t *xv, const float *x, int64_t m, int64_t k, int64_t h, uint16_t *tmp)
{
    (void)xv, (void)x, (void)m, (void)k, (void)h, (void)tmp;
}
void cpu_amx_gemm(float *y, int64_t ldy, const uint16_t *xv, const uint16_t *w, int64_t ldw,
                  int64_t m, int64_t nb, int64_t k)
{
    (void)y, (void)ldy, (void)xv, (void)w, (void)ldw, (void)m, (void)nb, (void)k;
}
#endif
