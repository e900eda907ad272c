/* tests/op_check.c - the harness shared by the op tests: random inputs, storage formats, guarded
 * device buffers, comparisons, verdicts and the suite's main (contracts in op_check.h).
 * Not here: tolerances, references and cases (each test's own).
 * Used by: tests/test_ops.c, tests/test_ops_backward.c, tests/test_attention_train.c. */
#include "op_check.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small utilities -------------------------------------------------------------------- */

const enum dtype float_dtypes[3] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};

const struct storage_rounding storage_rounding[3] = {
    [DTYPE_F32] = {0, 0x1p-150},
    [DTYPE_BF16] = {0x1p-8, 0x1p-134},
    [DTYPE_F16] = {0x1p-11, 0x1p-25},
};

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    CHECK(p != NULL, "out of host memory (%zu x %zu bytes)", n, size);
    return p;
}

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- storage formats, written independently of tensor.h -------------------------------- */

struct format {
    int    precision; /* significand bits, the implicit one included */
    int    emin;      /* exponent of the smallest normal number */
    double max;       /* largest finite value */
};

static struct format format_of(enum dtype t)
{
    switch (t) {
    case DTYPE_F32: return (struct format){24, -126, 0x1.fffffep127};
    case DTYPE_BF16: return (struct format){8, -126, 0x1.fep127};
    case DTYPE_F16: return (struct format){11, -14, 65504.0};
    default: break; /* i32 and the block dtypes */
    }
    CHECK(0, "not a float dtype: %d", (int)t);
}

/* v rounded to the nearest value of dtype t (ties to even), overflowing to infinity the way
 * IEEE 754 does (from max + half an ulp up); NaN, infinities and zeros pass through. */
double fmt_round(double v, enum dtype t)
{
    if (isnan(v) || isinf(v) || v == 0.0) return v;
    struct format f = format_of(t);
    double a = fabs(v);
    int e;
    frexp(a, &e); /* a in [2^(e-1), 2^e) */
    /* Below the normal range the spacing stays that of the smallest normal binade. */
    int lead = e - 1 < f.emin ? f.emin : e - 1;
    double ulp = ldexp(1.0, lead - (f.precision - 1));
    double r = nearbyint(a / ulp) * ulp; /* a / ulp is exact; nearbyint rounds half to even */
    if (r > f.max) r = INFINITY;
    return copysign(r, v);
}

static uint16_t f16_encode(double v) /* v exactly representable in f16 */
{
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    if (isnan(v)) return sign | 0x7e00u;
    double a = fabs(v);
    if (isinf(a)) return sign | 0x7c00u;
    if (a == 0.0) return sign;
    if (a < 0x1p-14) {
        double m = a * 0x1p24;
        CHECK(m == floor(m), "%.17g is not an f16 subnormal", v);
        return sign | (uint16_t)m;
    }
    int e;
    double m = frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    double frac = (2.0 * m - 1.0) * 1024.0;
    CHECK(frac == floor(frac) && e - 1 + 15 >= 1 && e - 1 + 15 <= 30, "%.17g is not an f16", v);
    return sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)frac;
}

static double f16_decode(uint16_t h)
{
    int ex = (h >> 10) & 31, man = h & 1023;
    double v;
    if (ex == 0) v = ldexp(man, -24);
    else if (ex == 31) v = man ? NAN : INFINITY;
    else v = ldexp(1024 + man, ex - 25);
    return (h & 0x8000u) ? -v : v;
}

/* Stores v, which must be exactly representable in t (a fmt_round result), as element i. */
void fmt_store(void *bits, enum dtype t, size_t i, double v)
{
    switch (t) {
    case DTYPE_F32: ((float *)bits)[i] = (float)v; return;
    case DTYPE_BF16: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        if (isnan(v)) u = (u & 0x80000000u) | 0x7fc00000u;
        CHECK((u & 0xffffu) == 0, "%.17g is not a bf16", v);
        ((uint16_t *)bits)[i] = (uint16_t)(u >> 16);
        return;
    }
    case DTYPE_F16: ((uint16_t *)bits)[i] = f16_encode(v); return;
    default: break; /* i32 and the block dtypes */
    }
    CHECK(0, "not a float dtype: %d", (int)t);
}

double fmt_load(const void *bits, enum dtype t, size_t i)
{
    switch (t) {
    case DTYPE_F32: return ((const float *)bits)[i];
    case DTYPE_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)bits)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case DTYPE_F16: return f16_decode(((const uint16_t *)bits)[i]);
    default: break; /* i32 and the block dtypes */
    }
    CHECK(0, "not a float dtype: %d", (int)t);
}

/* ---- the suite, its cases and their verdicts ----------------------------------------------- */

void verdict_fail(struct verdict *v, const char *fmt, ...)
{
    v->n_failed++;
    if (v->len + 8 >= sizeof v->msg) return;
    v->len += (size_t)snprintf(v->msg + v->len, sizeof v->msg - v->len, "\n    ");
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(v->msg + v->len, sizeof v->msg - v->len, fmt, ap);
    va_end(ap);
    if (n > 0) v->len += (size_t)n;
    if (v->len >= sizeof v->msg) v->len = sizeof v->msg - 1;
}

/* Host memory that lives until the end of the running case. */
void *case_alloc(struct suite *s, size_t n, size_t size)
{
    CHECK(s->n_allocs < CASE_MAX_ALLOCS, "a case uses more than %d host buffers", CASE_MAX_ALLOCS);
    return s->allocs[s->n_allocs++] = xcalloc(n, size);
}

static uint64_t hash_name(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001b3ull;
    return h;
}

/* Whether the case runs (the filter); if so, seeds *r from the suite's seed and the name. */
int case_begin(struct suite *s, const char *name, struct rng *r)
{
    if (s->filter && !strstr(name, s->filter)) return 0;
    r->s = s->seed ^ hash_name(name);
    s->n_allocs = 0;
    return 1;
}

void case_end(struct suite *s, const char *name, const struct verdict *v)
{
    char margin[48] = "";
    if (v->worst_ratio > 0.0) snprintf(margin, sizeof margin, "  [err/tol %.3f]", v->worst_ratio);
    if (v->n_failed) {
        s->failed++;
        printf("FAIL %s%s\n", name, v->msg);
    } else {
        s->passed++;
        printf("ok   %s%s\n", name, margin);
    }
    fflush(stdout);
    for (int i = 0; i < s->n_allocs; i++) free(s->allocs[i]);
    s->n_allocs = 0;
}

/* ---- host tensors ------------------------------------------------------------------------ */

struct hbuf hbuf_make(struct suite *s, enum dtype t, size_t n)
{
    struct hbuf h = {.dtype = t, .n = n};
    h.bits = case_alloc(s, n, dtype_size(t));
    h.val = case_alloc(s, n, sizeof(double));
    return h;
}

/* Element i = v rounded to the buffer's dtype. */
void hbuf_set(struct hbuf *h, size_t i, double v)
{
    double r = fmt_round(v, h->dtype);
    fmt_store(h->bits, h->dtype, i, r);
    h->val[i] = r;
}

struct hbuf hbuf_uniform(struct suite *s, enum dtype t, size_t n, struct rng *r, double lo,
                         double hi)
{
    struct hbuf h = hbuf_make(s, t, n);
    for (size_t i = 0; i < n; i++) hbuf_set(&h, i, rng_range(r, lo, hi));
    return h;
}

double *decode(struct suite *s, const void *bits, enum dtype t, size_t n)
{
    double *out = case_alloc(s, n, sizeof(double));
    for (size_t i = 0; i < n; i++) out[i] = fmt_load(bits, t, i);
    return out;
}

/* ---- device buffers with guards ----------------------------------------------------------- */

static uint8_t guard_byte(size_t i, int after)
{
    return (uint8_t)((after ? 0x5a : 0xa5) ^ (i * 29u));
}

/* Allocates a guarded buffer of the given shape and uploads `init` into its data (or 0xff
 * bytes, NaN in every float dtype, when init is NULL). */
static struct tensor arena_add(struct arena *a, const char *name, enum dtype t, struct shape sh,
                               const void *init, const void *expect, void *result)
{
    CHECK(a->n < ARENA_MAX_BUFS, "arena full");
    struct tensor x = {.dtype = t, .device = a->b->device, .ndim = sh.ndim};
    for (int i = 0; i < TENSOR_MAX_DIMS; i++) x.shape[i] = i < sh.ndim ? sh.d[i] : 1;
    struct dbuf *d = &a->bufs[a->n++];
    /* A block-quantized tensor (DTYPE_Q*) has no element size: its bytes are counted one by one. */
    *d = (struct dbuf){.name = name, .nbytes = tensor_nbytes(&x),
                       .elsize = dtype_is_quant(t) ? 1 : dtype_size(t), .expect = expect, .result = result};
    size_t total = d->nbytes + 2 * GUARD_BYTES;
    enum status st = backend_alloc(a->b, total, &d->base);
    CHECK(st == STATUS_OK, "backend_alloc(%zu): %s", total, status_message());
    uint8_t *stage = xcalloc(total, 1);
    for (size_t i = 0; i < GUARD_BYTES; i++) {
        stage[i] = guard_byte(i, 0);
        stage[GUARD_BYTES + d->nbytes + i] = guard_byte(i, 1);
    }
    if (init) memcpy(stage + GUARD_BYTES, init, d->nbytes);
    else memset(stage + GUARD_BYTES, 0xff, d->nbytes);
    backend_upload(a->b, d->base, stage, total);
    free(stage);
    x.data = (uint8_t *)d->base + GUARD_BYTES;
    return x;
}

/* An input: `host` must come back unchanged after the op. */
struct tensor arena_in(struct arena *a, const char *name, enum dtype t, struct shape sh,
                       const void *host)
{
    return arena_add(a, name, t, sh, host, host, NULL);
}

/* An output (init NULL: filled with NaN) or an in-place operand (init: its input data). After
 * arena_finish, `result` holds the data. */
struct tensor arena_out(struct arena *a, const char *name, enum dtype t, struct shape sh,
                        const void *init, void *result)
{
    return arena_add(a, name, t, sh, init, NULL, result);
}

/* Waits for the backend, checks every guard and every input, downloads the outputs and frees
 * the device memory. */
void arena_finish(struct arena *a, struct verdict *v)
{
    backend_synchronize(a->b);
    const char *bname = a->b->ops->name;
    for (int k = 0; k < a->n; k++) {
        struct dbuf *d = &a->bufs[k];
        size_t total = d->nbytes + 2 * GUARD_BYTES;
        uint8_t *stage = xcalloc(total, 1);
        backend_download(a->b, stage, d->base, total);
        for (int after = 0; after <= 1; after++) {
            const uint8_t *g = stage + (after ? GUARD_BYTES + d->nbytes : 0);
            size_t n_bad = 0, first = 0;
            for (size_t i = 0; i < GUARD_BYTES; i++)
                if (g[i] != guard_byte(i, after) && n_bad++ == 0) first = i;
            if (n_bad)
                verdict_fail(v, "%s: %zu guard bytes %s '%s' overwritten (first at byte %s%zu)",
                             bname, n_bad, after ? "after" : "before", d->name,
                             after ? "+" : "-", after ? first : GUARD_BYTES - first);
        }
        if (d->expect && memcmp(stage + GUARD_BYTES, d->expect, d->nbytes)) {
            size_t i = 0;
            while (stage[GUARD_BYTES + i] == ((const uint8_t *)d->expect)[i]) i++;
            verdict_fail(v, "%s: input '%s' was modified (element %zu)", bname, d->name,
                         i / d->elsize);
        }
        if (d->result) memcpy(d->result, stage + GUARD_BYTES, d->nbytes);
        free(stage);
        backend_free(a->b, d->base);
    }
    a->n = 0;
}

/* ---- comparisons -------------------------------------------------------------------------- */

void compare_close(struct verdict *v, const char *what, const double *got, const double *want,
                   const double *tol, double factor, size_t n, size_t cols)
{
    size_t n_bad = 0, n_nonfinite = 0, worst = 0, i_abs = 0, i_rel = 0;
    double worst_ratio = -1.0, max_abs = 0.0, max_rel = 0.0;
    if (cols == 0) cols = 1;
    for (size_t i = 0; i < n; i++) {
        double g = got[i], w = want[i], err, bound = factor * tol[i];
        int bad;
        if (!isfinite(w)) {
            bad = isnan(w) ? !isnan(g) : g != w;
            err = bad ? INFINITY : 0.0;
        } else if (!isfinite(g)) {
            bad = 1;
            err = INFINITY;
            n_nonfinite++;
        } else {
            err = fabs(g - w);
            bad = err > bound;
            if (err > max_abs) max_abs = err, i_abs = i;
            if (w != 0.0 && err / fabs(w) > max_rel) max_rel = err / fabs(w), i_rel = i;
        }
        if (isfinite(w) && bound > 0.0 && err / bound > v->worst_ratio)
            v->worst_ratio = err / bound;
        if (bad) {
            double ratio = bound > 0.0 ? err / bound : INFINITY;
            if (n_bad++ == 0 || ratio > worst_ratio) worst_ratio = ratio, worst = i;
        }
    }
    if (!n_bad) return;
    verdict_fail(v,
                 "%s: %zu of %zu elements out of tolerance (%zu non-finite); worst [%zu, %zu]: "
                 "got %.9g want %.9g, err %.3g > tol %.3g; max abs err %.3g at [%zu, %zu], max "
                 "rel err %.3g at [%zu, %zu]",
                 what, n_bad, n, n_nonfinite, worst / cols, worst % cols, got[worst],
                 want[worst], fabs(got[worst] - want[worst]), factor * tol[worst], max_abs,
                 i_abs / cols, i_abs % cols, max_rel, i_rel / cols, i_rel % cols);
}

/* got equal to want: same value (NaN matches NaN); with check_sign, zeros and infinities must
 * also agree in sign. */
void compare_exact(struct verdict *v, const char *what, const double *got,
                   const double *want, size_t n, size_t cols, int check_sign)
{
    size_t n_bad = 0, first = 0;
    if (cols == 0) cols = 1;
    for (size_t i = 0; i < n; i++) {
        int same = isnan(want[i]) ? isnan(got[i])
                                  : got[i] == want[i] &&
                                        (!check_sign || !signbit(got[i]) == !signbit(want[i]));
        if (!same && n_bad++ == 0) first = i;
    }
    if (n_bad)
        verdict_fail(v, "%s: %zu of %zu elements differ; first [%zu, %zu]: got %.9g want %.9g",
                     what, n_bad, n, first / cols, first % cols, got[first], want[first]);
}

void compare_i32(struct verdict *v, const char *what, const int32_t *got,
                 const int32_t *want, size_t n, size_t cols)
{
    size_t n_bad = 0, first = 0;
    if (cols == 0) cols = 1;
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i] && n_bad++ == 0) first = i;
    if (n_bad)
        verdict_fail(v, "%s: %zu of %zu ids differ; first [%zu, %zu]: got %d want %d", what,
                     n_bad, n, first / cols, first % cols, got[first], want[first]);
}

/* Float outputs of every backend against the reference, and CUDA against CPU. */
void check_close(struct suite *s, struct verdict *v, const char *what, double *got[2],
                 const double *want, const double *tol, size_t n, size_t cols)
{
    char label[160];
    for (int bi = 0; bi < s->n_backends; bi++) {
        snprintf(label, sizeof label, "%s: %s vs reference", s->backend_name[bi], what);
        compare_close(v, label, got[bi], want, tol, 1.0, n, cols);
    }
    if (s->n_backends == 2) {
        snprintf(label, sizeof label, "%s vs %s: %s", s->backend_name[0], s->backend_name[1],
                 what);
        compare_close(v, label, got[0], got[1], tol, 2.0, n, cols);
    }
}

void check_exact(struct suite *s, struct verdict *v, const char *what, double *got[2],
                 const double *want, size_t n, size_t cols, int check_sign)
{
    char label[160];
    for (int bi = 0; bi < s->n_backends; bi++) {
        snprintf(label, sizeof label, "%s: %s vs reference", s->backend_name[bi], what);
        compare_exact(v, label, got[bi], want, n, cols, check_sign);
    }
    if (s->n_backends == 2) {
        snprintf(label, sizeof label, "%s vs %s: %s", s->backend_name[0], s->backend_name[1],
                 what);
        compare_exact(v, label, got[0], got[1], n, cols, check_sign);
    }
}

/* ---- double references shared by the forward and backward tests ------------------------ */

double ref_act(enum activation act, double x)
{
    switch (act) {
    case ACTIVATION_SILU: return x / (1.0 + exp(-x));
    case ACTIVATION_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
    case ACTIVATION_GELU_ERF: return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case ACTIVATION_SWIGLU_OAI: { /* the gate's part; ref_gated_up the up's */
        const double g = x > 7.0 ? 7.0 : x; /* a NaN stays NaN, as transformers' clamp */
        return g / (1.0 + exp(-1.702 * g));
    }
    }
    CHECK(0, "activation %d", (int)act);
}

double ref_gated_up(enum activation act, double u)
{
    if (act != ACTIVATION_SWIGLU_OAI) return u;
    return (u < -7.0 ? -7.0 : u > 7.0 ? 7.0 : u) + 1.0;
}

const char *act_name(enum activation act)
{
    switch (act) {
    case ACTIVATION_SILU: return "silu";
    case ACTIVATION_GELU_TANH: return "gelu_tanh";
    case ACTIVATION_GELU_ERF: return "gelu_erf";
    case ACTIVATION_SWIGLU_OAI: return "swiglu_oai";
    }
    return "?";
}

/* ---- the suite's main --------------------------------------------------------------------- */

static int usage(const char *argv0)
{
    fprintf(stderr, "usage: %s --backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N]\n", argv0);
    return 2;
}

int suite_main(int argc, char **argv, const char *prog, const char *skip_name,
               void (*run_all)(struct suite *s))
{
    const char *backend_arg = NULL, *filter = NULL;
    uint64_t seed = 0x5eed0f0b5ull;
    int threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend_arg = argv[++i];
        else if (!strcmp(argv[i], "--filter") && i + 1 < argc) filter = argv[++i];
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else return usage(argv[0]);
    }
    enum device device;
    if (!backend_arg || backend_parse_device(backend_arg, &device) != STATUS_OK)
        return usage(argv[0]);

    struct suite s = {.filter = filter, .seed = seed};
    struct backend *b = NULL;
    if (threads < 0) return usage(argv[0]);
    enum status st = backend_open(device, 0, threads, &b);
    if (st != STATUS_OK) {
        if (device == DEVICE_CUDA && st == STATUS_UNAVAILABLE) {
            printf("SKIP: %s: %s\n", skip_name, status_message());
            return 77;
        }
        fprintf(stderr, "%s: cannot open the %s backend: %s: %s\n", prog, backend_arg,
                status_name(st), status_message());
        return 1;
    }
    s.backend[0] = b;
    s.backend_name[0] = device == DEVICE_CUDA ? "cuda" : "cpu";
    s.n_backends = 1;
    if (device == DEVICE_CUDA) {
        /* The CPU backend is the reference the CUDA backend is held to, beside the double one. */
        st = backend_open(DEVICE_CPU, 0, 0, &s.backend[1]);
        if (st != STATUS_OK) {
            fprintf(stderr, "%s: cannot open the cpu backend: %s: %s\n", prog, status_name(st),
                    status_message());
            backend_close(b);
            return 1;
        }
        s.backend_name[1] = "cpu";
        s.n_backends = 2;
    }
    printf("%s: backend %s (%s, %d threads), seed %llu%s%s\n", prog, s.backend_name[0],
           b->ops->name, b->n_threads, (unsigned long long)seed, filter ? ", filter " : "",
           filter ? filter : "");
    fflush(stdout);

    double t0 = now_s();
    run_all(&s);
    double t1 = now_s();

    for (int i = 0; i < s.n_backends; i++) backend_close(s.backend[i]);
    if (s.passed + s.failed == 0) printf("no case matched the filter\n");
    printf("%.1f s\n", t1 - t0);
    printf("%d passed, %d failed\n", s.passed, s.failed);
    return s.failed ? 1 : 0;
}
