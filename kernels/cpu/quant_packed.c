/* kernels/cpu/quant_packed.c - the packed layout of Q4_0, Q4_1 and Q8_0 weights (quant_impl.h):
 * block b of eight consecutive rows regrouped, so that decode's product reads each block's
 * eight scales as one vector and each word of x once for eight rows (quant_x86.h packed8_*).
 * Here: packing, a packed block back to the stored form (for dequantizing a row), and the
 * scalar kernels. The product over it is quant.c's quant_matmul_packed; the layout is the CPU
 * backend's (kernels/cpu/matmul.c, tensor.packed), never written to a file.
 * Tests: tests/test_quant.c (the packed product bit for bit against the stored one, every
 * implementation; rows dequantized from the packed layout). */
#include <math.h>
#include <string.h>

#include "base.h"
#include "quant_impl.h"
#include "tensor.h"

/* The stored block's bytes: its scales (and min) first, then qs; a packed block's scales come
 * first too, then the quants in words of four bytes. */
struct packed_geom {
    size_t block, packed, scales; /* bytes of a stored block, of a packed block, of d (+ m) */
    int    words;                 /* 4-byte words of quants per row and block */
};

static int geom_of(enum quant_type type, struct packed_geom *g)
{
    *g = (struct packed_geom){0};
    switch (type) {
    case QUANT_TYPE_Q4_0: *g = (struct packed_geom){sizeof(struct blk_q4_0), QUANT_R8_Q4_0, 2, 4}; return 1;
    case QUANT_TYPE_Q4_1: *g = (struct packed_geom){sizeof(struct blk_q4_1), QUANT_R8_Q4_1, 4, 4}; return 1;
    case QUANT_TYPE_Q8_0: *g = (struct packed_geom){sizeof(struct blk_q8_0), QUANT_R8_Q8_0, 2, 8}; return 1;
    default: return 0;
    }
}

int quant_packable(enum quant_type type, int64_t n, int64_t k)
{
    struct packed_geom g;
    return geom_of(type, &g) && n > 0 && n % 8 == 0 && k > 0 && k % QK == 0;
}

/* Moves one block between the stored rows (row r's block at blk[r]) and a packed block p:
 * to_packed 1 packs, 0 unpacks; rows r0 .. r1 - 1 of the eight. Scales: d (and m) of row r at
 * p + 2 r (and p + 16 + 2 r); quants: word w of row r at p + scales * 8 + 32 w + 4 r. */
static void move_block(const struct packed_geom *g, uint8_t *p, uint8_t *const blk[8], int r0, int r1, int to_packed)
{
    for (int r = r0; r < r1; r++) {
        for (size_t s = 0; s < g->scales; s += 2) {
            uint8_t *a = p + 8 * s + 2 * r, *b = blk[r] + s;
            memcpy(to_packed ? a : b, to_packed ? b : a, 2);
        }
        for (int w = 0; w < g->words; w++) {
            uint8_t *a = p + 8 * g->scales + 32 * w + 4 * r, *b = blk[r] + g->scales + 4 * w;
            memcpy(to_packed ? a : b, to_packed ? b : a, 4);
        }
    }
}

void quant_pack_rows8(enum quant_type type, void *dst, const void *w, int64_t n, int64_t k)
{
    struct packed_geom g = {0};
    CHECK(quant_packable(type, n, k) && geom_of(type, &g), "quant_pack_rows8: %s with n %lld, k %lld cannot be packed",
          quant_type_name(type), (long long)n, (long long)k);
    const int64_t nb = k / QK;
    const size_t row = (size_t)nb * g.block;
    for (int64_t r0 = 0; r0 < n; r0 += 8)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk[8];
            for (int r = 0; r < 8; r++) blk[r] = (uint8_t *)w + (size_t)(r0 + r) * row + (size_t)b * g.block;
            move_block(&g, (uint8_t *)dst + (size_t)((r0 / 8) * nb + b) * g.packed, blk, 0, 8, 1);
        }
}

void quant_dequantize_row_packed(enum quant_type type, const void *wp, int64_t j, float *dst, int64_t k)
{
    struct packed_geom g = {0};
    CHECK(geom_of(type, &g) && k % QK == 0, "quant_dequantize_row_packed: %s, k %lld", quant_type_name(type),
          (long long)k);
    const int64_t nb = k / QK;
    uint8_t tmp[8][sizeof(struct blk_q8_0)], *blk[8];
    for (int r = 0; r < 8; r++) blk[r] = tmp[r];
    for (int64_t b = 0; b < nb; b++) {
        move_block(&g, (uint8_t *)wp + (size_t)((j / 8) * nb + b) * g.packed, blk, (int)(j % 8), (int)(j % 8) + 1, 0);
        quant_dequantize_row(type, tmp[j % 8], dst + b * QK, QK);
    }
}

/* ---- scalar kernels (the scalar table), in the block-exact order ---- */

static void packed8_q4_scalar(int64_t nb, const uint8_t *wp, int has_min, const struct act_q8 *x, float *y)
{
    const size_t pb = has_min ? QUANT_R8_Q4_1 : QUANT_R8_Q4_0, head = has_min ? 32 : 16;
    float acc[8] = {0}, accm[8] = {0};
    for (int64_t b = 0; b < nb; b++, wp += pb)
        for (int r = 0; r < 8; r++) {
            int32_t s = 0;
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t q = wp[head + 32 * j + 4 * r + t];
                    s += (q & 0x0F) * x[b].qs[4 * j + t] + (q >> 4) * x[b].qs[16 + 4 * j + t];
                }
            uint16_t d, m;
            memcpy(&d, wp + 2 * r, 2);
            if (!has_min) s -= 8 * x[b].sum;
            acc[r] = fmaf(f16_to_f32(d) * x[b].d, (float)s, acc[r]);
            if (has_min) {
                memcpy(&m, wp + 16 + 2 * r, 2);
                accm[r] = fmaf(f16_to_f32(m), x[b].dsum, accm[r]);
            }
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] + accm[r];
}

void quant_scalar_packed8_q4_0(int64_t nb, const void *wp, const void *xq, float *y)
{
    packed8_q4_scalar(nb, wp, 0, xq, y);
}

void quant_scalar_packed8_q4_1(int64_t nb, const void *wp, const void *xq, float *y)
{
    packed8_q4_scalar(nb, wp, 1, xq, y);
}

void quant_scalar_packed8_q8_0(int64_t nb, const void *wpv, const void *xqv, float *y)
{
    const uint8_t *wp = wpv;
    const struct act_q8 *x = xqv;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q8_0)
        for (int r = 0; r < 8; r++) {
            int32_t s = 0;
            for (int k = 0; k < 8; k++)
                for (int t = 0; t < 4; t++) s += (int8_t)wp[16 + 32 * k + 4 * r + t] * x[b].qs[4 * k + t];
            uint16_t d;
            memcpy(&d, wp + 2 * r, 2);
            acc[r] = fmaf(f16_to_f32(d) * x[b].d, (float)s, acc[r]);
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] + 0.0f;
}
