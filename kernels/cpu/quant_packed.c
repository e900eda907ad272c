/* kernels/cpu/quant_packed.c - the packed layout of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights (quant_impl.h):
 * block b of eight consecutive rows regrouped, so that decode's product reads each block's
 * eight scales as one vector and each word of x once for eight rows (quant_x86.h packed8_*).
 * Here: packing, a packed block back to the stored form (for dequantizing a row), and the
 * scalar kernels. Q4_K and Q6_K (a super-block of eight rows) too. The product over it is quant.c's quant_matmul_packed; the layout is the CPU
 * backend's (kernels/cpu/matmul.c, tensor.packed), never written to a file.
 * Tests: tests/test_quant.c (the packed product bit for bit against the stored one, every
 * implementation; rows dequantized from the packed layout). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "quant_impl.h"
#include "tensor.h"

/* The stored block's bytes: its scales (and min) first, then qs; a packed block's scales come
 * first too, then the quants in words of four bytes. Q4_K has a layout of its own (q4k_move). */
struct packed_geom {
    size_t block, packed, scales; /* bytes of a stored block, of a packed block, of d (+ m) */
    int    words;                 /* 4-byte words of quants per row and block */
    int    elems;                 /* elements per block: 32, or 256 for Q4_K */
    int    flip;                  /* the quants' top bit flipped (Q8_0: stored signed, packed + 128) */
};

static int geom_of(enum quant_type type, struct packed_geom *g)
{
    *g = (struct packed_geom){0};
    switch (type) {
    case QUANT_TYPE_Q4_0: *g = (struct packed_geom){sizeof(struct blk_q4_0), QUANT_R8_Q4_0, 2, 4, QK, 0}; return 1;
    case QUANT_TYPE_Q4_1: *g = (struct packed_geom){sizeof(struct blk_q4_1), QUANT_R8_Q4_1, 4, 4, QK, 0}; return 1;
    case QUANT_TYPE_Q8_0: *g = (struct packed_geom){sizeof(struct blk_q8_0), QUANT_R8_Q8_0, 2, 8, QK, 1}; return 1;
    case QUANT_TYPE_Q4_K: *g = (struct packed_geom){sizeof(struct blk_q4_k), QUANT_R8_Q4_K, 0, 0, QK_K, 0}; return 1;
    case QUANT_TYPE_Q5_0: *g = (struct packed_geom){sizeof(struct blk_q5_0), QUANT_R8_Q5_0, 2, 4, QK, 0}; return 1;
    case QUANT_TYPE_Q5_1: *g = (struct packed_geom){sizeof(struct blk_q5_1), QUANT_R8_Q5_1, 4, 4, QK, 0}; return 1;
    case QUANT_TYPE_Q6_K: *g = (struct packed_geom){sizeof(struct blk_q6_k), QUANT_R8_Q6_K, 0, 0, QK_K, 0}; return 1;
    default: return 0;
    }
}

int quant_packable(enum quant_type type, int64_t n, int64_t k)
{
    struct packed_geom g;
    return geom_of(type, &g) && n > 0 && n % 8 == 0 && k > 0 && k % g.elems == 0;
}

size_t quant_packed_bytes(enum quant_type type, int64_t n, int64_t k)
{
    struct packed_geom g;
    CHECK(quant_packable(type, n, k) && geom_of(type, &g), "quant_packed_bytes: %s with n %lld, k %lld",
          quant_type_name(type), (long long)n, (long long)k);
    return (size_t)(n / 8) * (size_t)(k / g.elems) * g.packed;
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
            if (g->flip)
                for (int t = 0; t < 4; t++) (to_packed ? a : b)[t] ^= 0x80;
        }
    }
}

/* Q4_K (quant_impl.h's layout): the 6-bit scales and mins are unpacked to bytes on the way in
 * and packed again on the way out (12 bytes hold exactly sixteen 6-bit values, so the stored
 * bytes come back as they were). */
static void q4k_move(uint8_t *p, uint8_t *const blk[8], int r0, int r1, int to_packed)
{
    for (int r = r0; r < r1; r++) {
        struct blk_q4_k *w = (struct blk_q4_k *)blk[r];
        uint8_t sc[8], mn[8];
        if (to_packed) {
            memcpy(p + 2 * r, &w->d, 2);
            memcpy(p + 16 + 2 * r, &w->dmin, 2);
            for (int j = 0; j < 8; j++) {
                quant_k_scale_min(j, w->scales, &sc[j], &mn[j]);
                p[32 + 8 * j + r] = sc[j];
                p[96 + 16 * (j / 2) + 2 * r + j % 2] = mn[j];
            }
        } else {
            memcpy(&w->d, p + 2 * r, 2);
            memcpy(&w->dmin, p + 16 + 2 * r, 2);
            for (int j = 0; j < 8; j++) sc[j] = p[32 + 8 * j + r], mn[j] = p[96 + 16 * (j / 2) + 2 * r + j % 2];
            for (int j = 0; j < 4; j++) { /* the inverse of quant_k_scale_min */
                w->scales[j] = (uint8_t)((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
                w->scales[j + 4] = (uint8_t)((mn[j] & 63) | (mn[j + 4] >> 4) << 6);
                w->scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | (mn[j + 4] & 15) << 4);
            }
        }
        for (int q = 0; q < 4; q++)
            for (int c = 0; c < 8; c++) {
                uint8_t *a = p + 160 + 256 * q + 32 * c + 4 * r, *b = w->qs + 32 * q + 4 * c;
                memcpy(to_packed ? a : b, to_packed ? b : a, 4);
            }
    }
}

/* Q5_0 / Q5_1: the scales as move_block's, the stored qh (after them) regrouped into the
 * packed block's 32-bit masks (quant_impl.h), the nibbles as Q4's (stored after qh). */
static void q5_move(const struct packed_geom *g, uint8_t *p, uint8_t *const blk[8], int r0, int r1, int to_packed)
{
    uint8_t *hb = p + 8 * g->scales, *qs = hb + 32;
    for (int r = r0; r < r1; r++) {
        for (size_t s = 0; s < g->scales; s += 2) {
            uint8_t *a = p + 8 * s + 2 * r, *b = blk[r] + s;
            memcpy(to_packed ? a : b, to_packed ? b : a, 2);
        }
        uint32_t qh = 0, mask[8];
        memcpy(&qh, blk[r] + g->scales, 4);
        memcpy(mask, hb, sizeof mask);
        /* Mask m = 2 j + half holds, at bits 4 r .. 4 r + 3, qh's bits 16 half + 4 j .. + 3. */
        for (int m = 0; m < 8; m++) {
            const int at = 16 * (m % 2) + 4 * (m / 2);
            if (to_packed) mask[m] = (mask[m] & ~(15u << 4 * r)) | ((qh >> at) & 15u) << 4 * r;
            else qh = (qh & ~(15u << at)) | ((mask[m] >> 4 * r) & 15u) << at;
        }
        if (to_packed) memcpy(hb, mask, sizeof mask);
        else memcpy(blk[r] + g->scales, &qh, 4);
        for (int w = 0; w < 4; w++) {
            uint8_t *a = qs + 32 * w + 4 * r, *b = blk[r] + g->scales + 4 + 4 * w;
            memcpy(to_packed ? a : b, to_packed ? b : a, 4);
        }
    }
}

/* Q6_K (quant_impl.h's layout): element e = 128 h + 32 c + l of a stored block is the nibble of
 * ql[64 h + 32 (c & 1) + l] (the high one for c >= 2) with bits 2 c, 2 c + 1 of qh[32 h + l] on
 * top; the packed block holds the 6-bit values themselves, regrouped. */
static int q6_get(const struct blk_q6_k *w, int e)
{
    const int h = e / 128, c = e % 128 / 32, l = e % 32;
    return (w->ql[64 * h + 32 * (c & 1) + l] >> 4 * (c >> 1) & 15) | (w->qh[32 * h + l] >> 2 * c & 3) << 4;
}

static void q6_set(struct blk_q6_k *w, int e, int q) /* into a block whose ql and qh start zeroed */
{
    const int h = e / 128, c = e % 128 / 32, l = e % 32;
    w->ql[64 * h + 32 * (c & 1) + l] |= (uint8_t)((q & 15) << 4 * (c >> 1));
    w->qh[32 * h + l] |= (uint8_t)((q >> 4) << 2 * c);
}

/* Byte offset in a packed Q6_K block of element e's low nibble (*shift 0 or 4) and of its top
 * bits (*hshift 0, 2, 4 or 6), for row r. */
static void q6_place(int e, int r, size_t *lo, int *shift, size_t *hi, int *hshift)
{
    const int t = e / 32, f = e % 32, half = f / 16, j = f % 16 / 4, i = f % 4;
    *lo = 144 + 192 * (size_t)t + 32 * (size_t)j + 4 * (size_t)r + (size_t)i;
    *shift = 4 * half;
    *hi = 144 + 192 * (size_t)t + 128 + 32 * (size_t)(j / 2) + 4 * (size_t)r + (size_t)i;
    *hshift = 4 * (j % 2) + 2 * half;
}

static void q6k_move(uint8_t *p, uint8_t *const blk[8], int r0, int r1, int to_packed)
{
    for (int r = r0; r < r1; r++) {
        struct blk_q6_k *w = (struct blk_q6_k *)blk[r];
        if (to_packed) {
            memcpy(p + 2 * r, &w->d, 2);
            for (int g = 0; g < 16; g++) p[16 + 16 * (g / 2) + 2 * r + g % 2] = (uint8_t)w->scales[g];
        } else {
            memcpy(&w->d, p + 2 * r, 2);
            for (int g = 0; g < 16; g++) w->scales[g] = (int8_t)p[16 + 16 * (g / 2) + 2 * r + g % 2];
            memset(w->ql, 0, sizeof w->ql);
            memset(w->qh, 0, sizeof w->qh);
        }
        /* Row r's bytes of the packed block, one per (chunk, vector, i): built whole from the
         * element values (a packed byte holds this row's bits only). */
        for (int t = 0; t < 8; t++)
            for (int j = 0; j < 4; j++)
                for (int i = 0; i < 4; i++) {
                    const int e_lo = 32 * t + 4 * j + i, e_hi = e_lo + 16;
                    uint8_t *lo = p + 144 + 192 * t + 32 * j + 4 * r + i;
                    uint8_t *hi = p + 144 + 192 * t + 128 + 32 * (j / 2) + 4 * r + i;
                    const int hs = 4 * (j % 2);
                    if (to_packed) {
                        const int ql = q6_get(w, e_lo), qh = q6_get(w, e_hi);
                        *lo = (uint8_t)((ql & 15) | (qh & 15) << 4);
                        *hi = (uint8_t)((*hi & ~(15 << hs)) | ((ql >> 4) | (qh >> 4) << 2) << hs);
                    } else {
                        q6_set(w, e_lo, (*lo & 15) | (*hi >> hs & 3) << 4);
                        q6_set(w, e_hi, (*lo >> 4) | (*hi >> (hs + 2) & 3) << 4);
                    }
                }
    }
}

static void move(enum quant_type type, const struct packed_geom *g, uint8_t *p, uint8_t *const blk[8], int r0, int r1,
                 int to_packed)
{
    if (type == QUANT_TYPE_Q4_K) q4k_move(p, blk, r0, r1, to_packed);
    else if (type == QUANT_TYPE_Q6_K) q6k_move(p, blk, r0, r1, to_packed);
    else if (type == QUANT_TYPE_Q5_0 || type == QUANT_TYPE_Q5_1) q5_move(g, p, blk, r0, r1, to_packed);
    else move_block(g, p, blk, r0, r1, to_packed);
}

void quant_pack_rows8(enum quant_type type, void *dst, const void *w, int64_t n, int64_t k)
{
    struct packed_geom g = {0};
    CHECK(quant_packable(type, n, k) && geom_of(type, &g), "quant_pack_rows8: %s with n %lld, k %lld cannot be packed",
          quant_type_name(type), (long long)n, (long long)k);
    const int64_t nb = k / g.elems;
    const size_t row = (size_t)nb * g.block;
    for (int64_t r0 = 0; r0 < n; r0 += 8)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk[8];
            for (int r = 0; r < 8; r++) blk[r] = (uint8_t *)w + (size_t)(r0 + r) * row + (size_t)b * g.block;
            move(type, &g, (uint8_t *)dst + (size_t)((r0 / 8) * nb + b) * g.packed, blk, 0, 8, 1);
        }
}

void quant_dequantize_rows_packed(enum quant_type type, const void *wp, int64_t j0, int64_t rows, float *dst, int64_t k)
{
    struct packed_geom g = {0};
    CHECK(geom_of(type, &g) && k % g.elems == 0 && j0 >= 0 && rows >= 0, "quant_dequantize_rows_packed: %s, k %lld",
          quant_type_name(type), (long long)k);
    const int64_t nb = k / g.elems;
    const size_t row_bytes = (size_t)nb * g.block;
    /* A group of eight rows at a time: its blocks back to the stored form in one move each (the
     * rows of the group that are asked for), then the (SIMD) row dequantizer over whole rows. */
    _Alignas(64) uint8_t small[16384];
    uint8_t *tmp = 8 * row_bytes <= sizeof small ? small : malloc(8 * row_bytes);
    CHECK(tmp, "quant_dequantize_rows_packed: out of memory");
    for (int64_t j = j0; j < j0 + rows;) {
        const int64_t group = j / 8, end = (group + 1) * 8 < j0 + rows ? (group + 1) * 8 : j0 + rows;
        const int r0 = (int)(j % 8), r1 = (int)(end - group * 8);
        uint8_t *blk[8];
        for (int64_t b = 0; b < nb; b++) {
            for (int r = 0; r < 8; r++) blk[r] = tmp + (size_t)r * row_bytes + (size_t)b * g.block;
            move(type, &g, (uint8_t *)wp + (size_t)(group * nb + b) * g.packed, blk, r0, r1, 0);
        }
        for (int r = r0; r < r1; r++) quant_dequantize_row(type, tmp + (size_t)r * row_bytes, dst + (group * 8 + r - j0) * k, k);
        j = end;
    }
    if (tmp != small) free(tmp);
}

void quant_dequantize_row_packed(enum quant_type type, const void *wp, int64_t j, float *dst, int64_t k)
{
    struct packed_geom g = {0};
    CHECK(geom_of(type, &g) && k % g.elems == 0, "quant_dequantize_row_packed: %s, k %lld", quant_type_name(type),
          (long long)k);
    const int64_t nb = k / g.elems;
    _Alignas(16) uint8_t tmp[8][sizeof(struct blk_q6_k)]; /* the largest packable block */
    uint8_t *blk[8];
    for (int r = 0; r < 8; r++) blk[r] = tmp[r];
    for (int64_t b = 0; b < nb; b++) {
        move(type, &g, (uint8_t *)wp + (size_t)((j / 8) * nb + b) * g.packed, blk, (int)(j % 8), (int)(j % 8) + 1, 0);
        quant_dequantize_row(type, tmp[j % 8], dst + b * g.elems, g.elems);
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
                for (int t = 0; t < 4; t++) s += ((int)wp[16 + 32 * k + 4 * r + t] - 128) * x[b].qs[4 * k + t];
            uint16_t d;
            memcpy(&d, wp + 2 * r, 2);
            acc[r] = fmaf(f16_to_f32(d) * x[b].d, (float)s, acc[r]);
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] + 0.0f;
}

void quant_scalar_packed8_q4_k(int64_t nb, const void *wpv, const void *xqv, float *y)
{
    const uint8_t *wp = wpv;
    const struct act_q8_k *x = xqv;
    float acc[8] = {0}, accm[8] = {0};
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q4_K)
        for (int r = 0; r < 8; r++) {
            int32_t isum = 0, msum = 0;
            for (int j = 0; j < 8; j++) {
                int32_t s = 0;
                for (int c = 0; c < 8; c++)
                    for (int t = 0; t < 4; t++) {
                        const uint8_t q = wp[160 + 256 * (j / 2) + 32 * c + 4 * r + t];
                        s += ((j % 2 ? q >> 4 : q) & 0x0F) * x[b].qs[32 * j + 4 * c + t];
                    }
                isum += wp[32 + 8 * j + r] * s;
                msum += wp[96 + 16 * (j / 2) + 2 * r + j % 2] * (x[b].bsums[2 * j] + x[b].bsums[2 * j + 1]);
            }
            uint16_t d, dmin;
            memcpy(&d, wp + 2 * r, 2);
            memcpy(&dmin, wp + 16 + 2 * r, 2);
            quant_k_accumulate(f16_to_f32(d), f16_to_f32(dmin), x[b].d, isum, msum, &acc[r], &accm[r]);
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] - accm[r];
}

static void packed8_q5_scalar(int64_t nb, const uint8_t *wp, int has_min, const struct act_q8 *x, float *y)
{
    const size_t pb = has_min ? QUANT_R8_Q5_1 : QUANT_R8_Q5_0, head = has_min ? 32 : 16;
    float acc[8] = {0}, accm[8] = {0};
    for (int64_t b = 0; b < nb; b++, wp += pb)
        for (int r = 0; r < 8; r++) {
            uint32_t mask[8];
            memcpy(mask, wp + head, sizeof mask);
            int32_t s = 0;
            for (int j = 0; j < 4; j++)
                for (int t = 0; t < 4; t++) {
                    const uint8_t q = wp[head + 32 + 32 * j + 4 * r + t];
                    const int lo = (q & 0x0F) | (int)((mask[2 * j] >> (4 * r + t)) & 1) << 4;
                    const int hi = (q >> 4) | (int)((mask[2 * j + 1] >> (4 * r + t)) & 1) << 4;
                    s += lo * x[b].qs[4 * j + t] + hi * x[b].qs[16 + 4 * j + t];
                }
            uint16_t d, m;
            memcpy(&d, wp + 2 * r, 2);
            if (!has_min) s -= 16 * x[b].sum;
            acc[r] = fmaf(f16_to_f32(d) * x[b].d, (float)s, acc[r]);
            if (has_min) {
                memcpy(&m, wp + 16 + 2 * r, 2);
                accm[r] = fmaf(f16_to_f32(m), x[b].dsum, accm[r]);
            }
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] + accm[r];
}

void quant_scalar_packed8_q5_0(int64_t nb, const void *wp, const void *xq, float *y)
{
    packed8_q5_scalar(nb, wp, 0, xq, y);
}

void quant_scalar_packed8_q5_1(int64_t nb, const void *wp, const void *xq, float *y)
{
    packed8_q5_scalar(nb, wp, 1, xq, y);
}

void quant_scalar_packed8_q6_k(int64_t nb, const void *wpv, const void *xqv, float *y)
{
    const uint8_t *wp = wpv;
    const struct act_q8_k *x = xqv;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++, wp += QUANT_R8_Q6_K)
        for (int r = 0; r < 8; r++) {
            int32_t isum = 0;
            for (int g = 0; g < 16; g++) {
                int32_t s = 0;
                for (int e = 16 * g; e < 16 * g + 16; e++) {
                    size_t lo, hi;
                    int shift, hshift;
                    q6_place(e, r, &lo, &shift, &hi, &hshift);
                    s += ((wp[lo] >> shift & 15) | (wp[hi] >> hshift & 3) << 4) * x[b].qs[e];
                }
                isum += (int8_t)wp[16 + 16 * (g / 2) + 2 * r + g % 2] * (s - 32 * x[b].bsums[g]);
            }
            uint16_t d;
            memcpy(&d, wp + 2 * r, 2);
            acc[r] = fmaf(f16_to_f32(d) * x[b].d, (float)isum, acc[r]);
        }
    for (int r = 0; r < 8; r++) y[r] = acc[r] + 0.0f;
}
