/* kernels/tensor.c - tensor descriptors and host dtype conversions (see tensor.h). */
#include "tensor.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "base.h"
#include "quant.h"

/* DTYPE_Q* <-> ggml type numbers, in enum dtype order from DTYPE_Q4_0. */
static const uint32_t quant_types[] = {
    QUANT_TYPE_Q4_0, QUANT_TYPE_Q4_1, QUANT_TYPE_Q5_0, QUANT_TYPE_Q5_1,
    QUANT_TYPE_Q8_0, QUANT_TYPE_Q4_K, QUANT_TYPE_Q5_K, QUANT_TYPE_Q6_K,
    QUANT_TYPE_Q2_K, QUANT_TYPE_Q3_K, QUANT_TYPE_IQ4_NL, QUANT_TYPE_IQ4_XS,
    QUANT_TYPE_MXFP4,
};
#define N_QUANT_TYPES (int)(sizeof quant_types / sizeof quant_types[0])

int dtype_is_quant(enum dtype t) { return t >= DTYPE_Q4_0 && t < DTYPE_Q4_0 + N_QUANT_TYPES; }

uint32_t dtype_quant_type(enum dtype t)
{
    CHECK(dtype_is_quant(t), "dtype %s is not a block dtype", dtype_name(t));
    return quant_types[t - DTYPE_Q4_0];
}

int dtype_of_quant_type(uint32_t ggml_type)
{
    for (int i = 0; i < N_QUANT_TYPES; i++)
        if (quant_types[i] == ggml_type) return DTYPE_Q4_0 + i;
    return -1;
}

size_t dtype_size(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return 4;
    case DTYPE_BF16: return 2;
    case DTYPE_F16: return 2;
    case DTYPE_I32: return 4;
    default: break;
    }
    CHECK(0, "dtype %s has no element size (a block dtype: use tensor_nbytes)", dtype_name(t));
}

const char *dtype_name(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return "f32";
    case DTYPE_BF16: return "bf16";
    case DTYPE_F16: return "f16";
    case DTYPE_I32: return "i32";
    case DTYPE_Q4_0: return "q4_0";
    case DTYPE_Q4_1: return "q4_1";
    case DTYPE_Q5_0: return "q5_0";
    case DTYPE_Q5_1: return "q5_1";
    case DTYPE_Q8_0: return "q8_0";
    case DTYPE_Q4_K: return "q4_k";
    case DTYPE_Q5_K: return "q5_k";
    case DTYPE_Q6_K: return "q6_k";
    case DTYPE_Q2_K: return "q2_k";
    case DTYPE_Q3_K: return "q3_k";
    case DTYPE_IQ4_NL: return "iq4_nl";
    case DTYPE_IQ4_XS: return "iq4_xs";
    case DTYPE_MXFP4: return "mxfp4";
    }
    return "?";
}

int dtype_is_float(enum dtype t) { return t == DTYPE_F32 || t == DTYPE_BF16 || t == DTYPE_F16; }

struct tensor tensor_make(void *data, enum dtype dtype, enum device device, int ndim, ...)
{
    CHECK(ndim >= 1 && ndim <= TENSOR_MAX_DIMS, "ndim %d", ndim);
    struct tensor t = {.data = data, .dtype = dtype, .device = device, .ndim = ndim};
    va_list ap;
    va_start(ap, ndim);
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) t.shape[i] = 1;
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = va_arg(ap, int64_t);
        CHECK(t.shape[i] >= 0, "negative dim %d", i);
    }
    va_end(ap);
    return t;
}

int64_t tensor_numel(const struct tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t tensor_nbytes(const struct tensor *t)
{
    if (!dtype_is_quant(t->dtype)) return (size_t)tensor_numel(t) * dtype_size(t->dtype);
    return (size_t)tensor_rows(t) * quant_row_bytes((enum quant_type)dtype_quant_type(t->dtype), tensor_cols(t));
}

const void *tensor_packed_rows(const struct tensor *t)
{
    const size_t row = tensor_row_bytes(t);
    const char *base = t->packed_of, *p = t->data;
    if (!base || !p || p < base || row == 0 || (size_t)(p - base) % row) return NULL;
    const int64_t r0 = (int64_t)((size_t)(p - base) / row), n = t->shape[0];
    if (r0 % 8 || n % 8 || r0 + n > t->packed_rows) return NULL;
    return (const char *)t->packed +
           (size_t)(r0 / 8) * quant_packed_bytes((enum quant_type)dtype_quant_type(t->dtype), 8, t->shape[1]);
}

size_t tensor_row_bytes(const struct tensor *t)
{
    int64_t inner = 1; /* the entries of one outermost row */
    for (int i = 1; i < t->ndim; i++) inner *= t->shape[i];
    if (!dtype_is_quant(t->dtype)) return (size_t)inner * dtype_size(t->dtype);
    const int64_t cols = tensor_cols(t);
    return (size_t)(t->ndim > 1 ? inner / cols : 1) *
           quant_row_bytes((enum quant_type)dtype_quant_type(t->dtype), cols);
}

int64_t tensor_cols(const struct tensor *t) { return t->shape[t->ndim - 1]; }

int64_t tensor_rows(const struct tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim - 1; i++) n *= t->shape[i];
    return n;
}

int tensor_same_shape(const struct tensor *a, const struct tensor *b)
{
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

const char *tensor_describe(const struct tensor *t, char *buf, size_t n)
{
    int off = snprintf(buf, n, "%s[", dtype_name(t->dtype));
    for (int i = 0; i < t->ndim && off > 0 && (size_t)off < n; i++)
        off += snprintf(buf + off, n - (size_t)off, i ? ",%lld" : "%lld", (long long)t->shape[i]);
    if (off > 0 && (size_t)off < n) snprintf(buf + off, n - (size_t)off, "]");
    return buf;
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = ldexpf((float)man, -24);
            return sign ? -f : f;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return sign | 0x7e00u;          /* NaN */
    if (absu >= 0x477ff000u) return sign | 0x7c00u;         /* overflow (rounds to) inf */
    if (absu < 0x38800000u) {                               /* below the smallest normal */
        float a;
        memcpy(&a, &absu, 4);
        /* Subnormal halves are multiples of 2^-24; rint rounds half to even. */
        return sign | (uint16_t)rintf(a * 16777216.0f);
    }
    uint32_t mant_round = absu + 0xfffu + ((absu >> 13) & 1u);
    return sign | (uint16_t)((mant_round - 0x38000000u) >> 13);
}

#if defined(__x86_64__)
#include <immintrin.h>

#include "cpu/cpu_isa.h"

/* f16 to f32 with F16C, eight at a time: exact, as f16_to_f32 (a signalling NaN comes back
 * quiet). Prefill against f16 weights widens blocks of rows through here (kernels/cpu/matmul.c):
 * element by element it was 2.3x slower than the f32 weights' prefill. */
__attribute__((target("avx,f16c"))) static void f16_rows_to_f32(float *d, const uint16_t *s, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) d[i] = f16_to_f32(s[i]);
}
#endif

void dtype_convert(void *dst, enum dtype dst_t, const void *src, enum dtype src_t, size_t n)
{
    if (dst_t == src_t) {
        if (dst != src) memmove(dst, src, n * dtype_size(dst_t));
        return;
    }
    if (src_t == DTYPE_BF16 && dst_t == DTYPE_F32) { /* hot on the CPU: a plain shift, vectorised */
        const uint16_t *s = src;
        uint32_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = (uint32_t)s[i] << 16;
        return;
    }
#if defined(__x86_64__)
    if (src_t == DTYPE_F16 && dst_t == DTYPE_F32 && cpu_isa_at_least(CPU_ISA_AVX2)) { /* AVX2 level: F16C too */
        f16_rows_to_f32(dst, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) dtype_store_f32(dst, dst_t, i, dtype_load_f32(src, src_t, i));
}

/* See tensor.h. The exponent field all ones is the test; the scan is a blocked OR (vectorised)
 * that only looks closer in a block that hit. */
int64_t dtype_first_non_finite(const void *data, enum dtype dt, size_t n)
{
    if (dt != DTYPE_F32 && dt != DTYPE_BF16 && dt != DTYPE_F16) return -1;
    const uint32_t *f = data;
    const uint16_t *h = data;
    const uint32_t m32 = 0x7f800000u;
    const uint16_t m16 = dt == DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    for (size_t i0 = 0; i0 < n; i0 += 4096) {
        const size_t i1 = n - i0 < 4096 ? n : i0 + 4096;
        int hit = 0;
        if (dt == DTYPE_F32)
            for (size_t i = i0; i < i1; i++) hit |= (f[i] & m32) == m32;
        else
            for (size_t i = i0; i < i1; i++) hit |= (h[i] & m16) == m16;
        if (!hit) continue;
        for (size_t i = i0; i < i1; i++)
            if (dt == DTYPE_F32 ? (f[i] & m32) == m32 : (h[i] & m16) == m16) return (int64_t)i;
    }
    return -1;
}
