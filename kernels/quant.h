/* kernels/quant.h - matrix products with ggml block-quantized weights kept as blocks in memory
 * (CPU): the weight types, their block geometry, dequantizing a row (embedding lookups), and
 * y = x W^T with the activations quantized per block to int8 and integer dot products, as
 * ggml does. Self-contained: it knows nothing of GGUF files, tensors or backends, so that model
 * code can hand it the blocks of a mapped file as they are.
 * Not here: reading GGUF (engine/formats/gguf.h), the f32/bf16 op interface (ops.h), CUDA (the
 * same blocks read by kernels/cuda/quant_blocks.cuh, dequantized inside the kernels).
 * Tests: tests/test_quant.c (every type and implementation against the formats wing's
 * dequantizer and an f64 product, with a bound derived from the int8 rounding); benchmark:
 * tests/bench_quant.c. docs/quantization.md.
 *
 * Layout. A weight matrix W of n rows and k columns is n rows of k / quant_block_size(type)
 * consecutive ggml blocks (the byte layout of ggml-common.h, as stored in a GGUF file): row j
 * starts at byte j * quant_row_bytes(type, k). k must be a multiple of the block size (32, or
 * 256 for the K-quants and IQ4_XS); the blocks must be 2-byte aligned (GGUF data is 32-byte aligned and
 * every row size is even), except MXFP4's: 17 bytes of single bytes (a 1-byte E8M0 scale), so a row
 * of an odd number of blocks is odd and the rows after it start anywhere.
 *
 * Arithmetic. Each row of x is quantized once per call: to blocks of 32 int8 with an f32 scale
 * (d = max|x| / 127) for the 32-element types, to blocks of 256 int8 with an f32 scale and
 * sums of 16 for the K-quants and IQ4_XS. Within a block the products are exact integer sums; scales are
 * applied in f32. The activation rounding makes |y - x W^T| at most sum over blocks of
 * d_x / 2 * sum |w| (plus f32 rounding); x must be finite. */
#ifndef SHARDLM_QUANT_H
#define SHARDLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The weight types, numbered as ggml's GGML_TYPE_* (the numbers stored in GGUF files). */
enum quant_type {
    QUANT_TYPE_Q4_0 = 2,
    QUANT_TYPE_Q4_1 = 3,
    QUANT_TYPE_Q5_0 = 6,
    QUANT_TYPE_Q5_1 = 7,
    QUANT_TYPE_Q8_0 = 8,
    QUANT_TYPE_Q2_K = 10,
    QUANT_TYPE_Q3_K = 11,
    QUANT_TYPE_Q4_K = 12,
    QUANT_TYPE_Q5_K = 13,
    QUANT_TYPE_Q6_K = 14,
    QUANT_TYPE_IQ4_NL = 20,
    QUANT_TYPE_IQ4_XS = 23,
    QUANT_TYPE_MXFP4 = 39,
};

/* Implementations of the product, for tests and benchmarks: quant_matmul picks the best one the
 * CPU has; quant_matmul_impl forces one. */
enum quant_impl {
    QUANT_IMPL_SCALAR = 0,    /* plain C, every CPU: the reference */
    QUANT_IMPL_AVX2,          /* x86-64 with AVX2, FMA, F16C */
    QUANT_IMPL_AVX_VNNI,      /* + AVX-VNNI (VEX vpdpbusd, CPUs without AVX-512 have it): cpu_avx_vnni() */
    QUANT_IMPL_AVX512_VNNI,   /* + AVX512-VNNI and VL: vpdpbusd on 256-bit vectors */
    QUANT_IMPL_COUNT,
};

/* 1 when `type` (a ggml type number) is one of enum quant_type. */
int         quant_type_supported(uint32_t type);
/* "Q4_K", ...; "?" for an unsupported number. */
const char *quant_type_name(uint32_t type);
/* Elements per block (32 or 256) and bytes per block; 0 for an unsupported number. */
int         quant_block_size(uint32_t type);
size_t      quant_block_bytes(uint32_t type);
/* Bytes of one row of k elements. k must be a multiple of the block size (CHECK). */
size_t      quant_row_bytes(enum quant_type type, int64_t k);

/* dst[0 .. k) = the k elements of the row at src, in f32. Bit-exact with ggml's
 * dequantize_row_* (the same f32 operations in the same order). */
void quant_dequantize_row(enum quant_type type, const void *src, float *dst, int64_t k);

/* Bytes of scratch quant_matmul needs for m rows of k (the quantized x). */
size_t quant_matmul_scratch_bytes(enum quant_type type, int64_t m, int64_t k);

/* y (m, n) = x (m, k) @ W^T, W (n, k) of `type` as described above; y and x f32, row-major,
 * y overwritten. scratch: quant_matmul_scratch_bytes(type, m, k) bytes, borrowed for the call
 * (no alignment needed); NULL allocates and frees a buffer in the call (tests; serving code
 * passes its workspace). y must not overlap x, W or scratch. Runs on up to n_threads OpenMP
 * threads (>= 1) split over the rows of W; small products run on one. Call it from outside
 * any parallel region, like the CPU backend's ops. m, n or k == 0 is allowed (y zero when
 * k == 0). */
void quant_matmul(enum quant_type type, float *y, const float *x, const void *w, int64_t m,
                  int64_t n, int64_t k, void *scratch, int n_threads);

/* ---- eight rows packed together (decode's layout; kernels/cpu/quant_packed.c) ----
 * Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K and Q6_K weights with n a multiple of 8 can be regrouped eight rows at a time
 * (the same bytes, the same size: n * quant_row_bytes(type, k)), so that a decode step reads each
 * block's eight scales as one vector and each word of x once for eight rows. The product over
 * the packed copy gives the same bits as quant_matmul over the rows as stored: these types
 * (and Q5_K) sum in one order in every implementation and layout (kernels/cpu/quant_impl.h). */
int  quant_packable(enum quant_type type, int64_t n, int64_t k);
/* Bytes of W (n, k) packed: n * quant_row_bytes(type, k), 2.8 % more for Q4_K (its scales unpacked
 * to bytes). CHECK unless quant_packable. */
size_t quant_packed_bytes(enum quant_type type, int64_t n, int64_t k);
/* dst (quant_packed_bytes) = W (n, k) packed; CHECK unless quant_packable. */
void quant_pack_rows8(enum quant_type type, void *dst, const void *w, int64_t n, int64_t k);
/* Row j of a packed W in f32: the bits quant_dequantize_row gives for the row as stored. */
void quant_dequantize_row_packed(enum quant_type type, const void *wp, int64_t j, float *dst, int64_t k);
/* Rows j0 .. j0 + rows of a packed W in f32 at dst (rows x k) (prefill's dequantized tiles):
 * the same bits. */
void quant_dequantize_rows_packed(enum quant_type type, const void *wp, int64_t j0, int64_t rows, float *dst,
                                  int64_t k);
/* quant_matmul with W packed (wp); the same contract and the same bits. */
void quant_matmul_packed(enum quant_type type, float *y, const float *x, const void *wp, int64_t m, int64_t n,
                         int64_t k, void *scratch, int n_threads);

/* ---- implementations (tests, benchmarks) ---- */
const char     *quant_impl_name(enum quant_impl impl);    /* "scalar", "avx2", "avx512vnni" */
/* 1 when impl was compiled into this build and this CPU runs it. */
int             quant_impl_available(enum quant_impl impl);
/* The implementation quant_matmul uses on this CPU. */
enum quant_impl quant_impl_best(void);
/* quant_dequantize_row with the given implementation (the x86 ones share one AVX2 dequantizer),
 * which must be available (CHECK). Every implementation gives the same bits. */
void quant_dequantize_row_impl(enum quant_impl impl, enum quant_type type, const void *src,
                               float *dst, int64_t k);
/* quant_matmul with the given implementation, which must be available (CHECK). */
void quant_matmul_impl(enum quant_impl impl, enum quant_type type, float *y, const float *x,
                       const void *w, int64_t m, int64_t n, int64_t k, void *scratch,
                       int n_threads);

/* How far ahead (bytes) the packed products ask for weight lines: SHARDLM_CPU_PREFETCH=BYTES
 * (0: no software prefetch, at most 1 MiB), else QUANT_PREFETCH_DEFAULT; read once per process.
 * The bits never depend on it. */
#define QUANT_PREFETCH_DEFAULT 4096
size_t          quant_prefetch_bytes(void);
/* 1 when the packed products of the 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with 2 or
 * more rows of x take the AMX int8 tiles (kernels/cpu/quant_amx.c): AMX on (cpu_amx_enabled) and
 * not SHARDLM_CPU_AMX_INT8=0; the bits are the VNNI kernels' either way. */
int             quant_amx_int8_on(void);

/* quant_matmul_packed with the given implementation, which must be available (CHECK). */
void quant_matmul_packed_impl(enum quant_impl impl, enum quant_type type, float *y, const float *x,
                              const void *wp, int64_t m, int64_t n, int64_t k, void *scratch, int n_threads);

#ifdef __cplusplus
}
#endif

#endif
