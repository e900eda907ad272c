/* tests/test_quant_blocks.cu - the CUDA kernels' block decoder (kernels/cuda/quant_blocks.cuh)
 * run on the host, where it is the same source with plain float operations in place of the
 * device's _rn intrinsics (the same f32 operations, unfused): for each block type, rows of
 * one block and of several, every element quant_row_elem<QT>(row, e) reached through
 * QUANT_DISPATCH equals quant_dequantize_row (the CPU's dequantizer, bit-exact with ggml) bit
 * for bit:
 *   - with small finite f16 scales (the weights a model holds);
 *   - with every byte random, scales included (subnormal, huge, Inf and NaN scales): equal bits,
 *     or NaN on both sides;
 * and the compile-time block geometry equals quant_block_size / quant_block_bytes.
 * What this does not show: that the device's intrinsics and __half2float give the same bits
 * (they are IEEE round-to-nearest and exact, by CUDA's documentation), nor anything about the
 * kernels around the decoder: that is tests/test_ops_quant.c --backend cuda (label gpu).
 * Built only where nvcc is (SHARDLM_HAVE_CUDA); needs no GPU. Exits 1 on any failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "quant_blocks.cuh"
#include "quant_fill.h"

/* Element e of the row at row, through the runtime dispatch the kernels use. */
static float decode_elem(enum quant_type t, const uint8_t *row, int64_t e)
{
    float v = 0.0f;
    QUANT_DISPATCH(t, QT, v = quant_row_elem<QT>(row, e));
    return v;
}

static int block_elems(enum quant_type t)
{
    int v = 0;
    QUANT_DISPATCH(t, QT, v = quant_block_traits<QT>::elems);
    return v;
}

static int block_bytes(enum quant_type t)
{
    int v = 0;
    QUANT_DISPATCH(t, QT, v = quant_block_traits<QT>::bytes);
    return v;
}

/* n rows of nb blocks: the decoder against quant_dequantize_row; returns the mismatches and
 * reports the first. */
static int64_t compare_rows(enum quant_type t, int64_t n, int64_t nb, int raw, uint64_t *seed, int64_t *n_nan)
{
    const int64_t k = nb * quant_block_size(t);
    const size_t row = quant_row_bytes(t, k);
    uint8_t *w = (uint8_t *)malloc((size_t)n * row);
    float *ref = (float *)malloc((size_t)k * sizeof(float));
    CHECK(w && ref, "out of memory");
    qfill_blocks(t, w, n * nb, raw, seed);
    int64_t bad = 0;
    for (int64_t j = 0; j < n; j++) {
        quant_dequantize_row(t, w + (size_t)j * row, ref, k);
        for (int64_t e = 0; e < k; e++) {
            const float got = decode_elem(t, w + (size_t)j * row, e);
            uint32_t gb, rb;
            memcpy(&gb, &got, 4);
            memcpy(&rb, &ref[e], 4);
            if (isnan(ref[e])) ++*n_nan;
            if (gb == rb || (isnan(got) && isnan(ref[e]))) continue;
            if (bad++ == 0)
                printf("  %s row %lld element %lld: decoder %.9g (0x%08x), quant_dequantize_row %.9g (0x%08x)\n",
                       quant_type_name(t), (long long)j, (long long)e, (double)got, gb, (double)ref[e], rb);
        }
    }
    free(w);
    free(ref);
    return bad;
}

int main(void)
{
    uint64_t seed = 0x5eedb10c5ull;
    for (int ti = 0; ti < QFILL_N_TYPES; ti++) {
        const enum quant_type t = qfill_types[ti];
        check(block_elems(t) == quant_block_size(t) && (size_t)block_bytes(t) == quant_block_bytes(t),
              "%s: block of %d elements, %d bytes (quant.h: %d, %zu)", quant_type_name(t), block_elems(t),
              block_bytes(t), quant_block_size(t), quant_block_bytes(t));
        for (int raw = 0; raw <= 1; raw++)
            for (int64_t nb = 1; nb <= 5; nb += 4) {
                int64_t n_nan = 0;
                const int64_t n = 64, bad = compare_rows(t, n, nb, raw, &seed, &n_nan);
                check(bad == 0, "%s: %lld rows of %lld block(s), %s scales: %lld elements differ from "
                      "quant_dequantize_row (%lld NaN on both sides)", quant_type_name(t), (long long)n,
                      (long long)nb, raw ? "random-bit" : "small finite", (long long)bad, (long long)n_nan);
            }
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
