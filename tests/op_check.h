/* tests/op_check.h - the harness shared by the op tests (test_ops.c, test_ops_backward.c,
 * test_attention_train.c), in the manner of ggml's test-backend-ops:
 * - a seeded random source, and a case's inputs drawn from the suite's seed and the case's name,
 *   so that --filter reproduces a case exactly;
 * - the float storage formats (f32, bf16, f16) written independently of tensor.h: rounding a
 *   double to a dtype, storing and loading its bits; host tensors that keep the exact values of
 *   their rounded elements beside their bits (the references run on those);
 * - device buffers between guard bytes that must come back untouched, inputs that must come back
 *   unchanged, outputs that start as NaN;
 * - comparisons (within a per-element tolerance, exact, int32), each backend against the
 *   reference and CUDA against CPU, and the verdict of a case: "ok" with its worst err/tol, or
 *   "FAIL" with every failed check;
 * - the suite's main: arguments, opening the backend (and the CPU one beside CUDA), SKIP with
 *   exit 77 when CUDA is unavailable, and the closing "N passed, M failed".
 *
 * Not here: tolerances and error magnitudes (each test derives its own, since they follow from
 * its op's arithmetic), the double-precision references (except the activations, shared by the
 * forward and the backward tests) and the cases.
 *
 * Not thread-safe: one suite runs its cases one after the other on the calling thread. Memory:
 * case_alloc's buffers live until case_end; the arena's device buffers until arena_finish. */
#ifndef SHARDLM_TESTS_OP_CHECK_H
#define SHARDLM_TESTS_OP_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "ops.h"

#define U32 0x1p-24 /* unit roundoff of f32: half an ulp, relative */

/* ---- small utilities -------------------------------------------------------------------- */

/* The float dtypes, in the order the tests iterate them. */
extern const enum dtype float_dtypes[3];

/* Storing a result in a narrower dtype rounds it once: by at most half an ulp, u |y| in the
 * normal range, or half the subnormal spacing below it (floor). For f32 the tests' error models
 * count the final rounding already, so u = 0 and the floor is half the smallest f32 subnormal.
 * Indexed by enum dtype (the float ones). */
struct storage_rounding {
    double u, floor;
};
extern const struct storage_rounding storage_rounding[3];

/* calloc that CHECKs (a test has no use for an out-of-memory path); never returns NULL, even
 * for n or size 0. The caller frees. */
void *xcalloc(size_t n, size_t size);

/* Seconds on the monotonic clock. */
double now_s(void);

/* splitmix64: small, fast, and good enough for test data. Static inline, not linked: the
 * engine's sampler exports rng_* names of its own (engine/serving/sampler.h). */
struct rng {
    uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static inline double rng_uniform(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1p-53; }

/* Uniform in [lo, hi). */
static inline double rng_range(struct rng *r, double lo, double hi)
{
    return lo + (hi - lo) * rng_uniform(r);
}

/* Uniform in [0, n), n > 0. */
static inline int rng_int(struct rng *r, int n) { return (int)(rng_next(r) % (uint64_t)n); }

/* Standard normal (Box-Muller). */
static inline double rng_normal(struct rng *r)
{
    double u1 = 1.0 - rng_uniform(r), u2 = rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/* Fisher-Yates: a (n) shuffled in place. */
static inline void rng_shuffle(struct rng *r, int *a, int n)
{
    for (int i = n - 1; i > 0; i--) {
        int j = rng_int(r, i + 1), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- storage formats, written independently of tensor.h -------------------------------- */

/* v rounded to the nearest value of dtype t (ties to even), overflowing to infinity the way
 * IEEE 754 does (from max + half an ulp up); NaN, infinities and zeros pass through. */
double fmt_round(double v, enum dtype t);

/* Stores v, which must be exactly representable in t (a fmt_round result; CHECKed), as element
 * i of bits. */
void fmt_store(void *bits, enum dtype t, size_t i, double v);

/* Element i of bits, exactly. */
double fmt_load(const void *bits, enum dtype t, size_t i);

/* ---- the suite, its cases and their verdicts ------------------------------------------- */

#define CASE_MAX_ALLOCS 96

struct suite {
    struct backend *backend[2];      /* [0] under test; [1] the CPU backend when [0] is CUDA */
    const char     *backend_name[2]; /* "cpu", "cuda" */
    int             n_backends;
    const char     *filter;          /* run only cases whose name contains it; NULL = all */
    uint64_t        seed;
    int             passed, failed;
    void           *allocs[CASE_MAX_ALLOCS]; /* host memory of the running case */
    int             n_allocs;
};

/* Why a case failed: the messages of its failed checks, joined. Start one as
 * {.worst_ratio = -1.0}. */
struct verdict {
    double worst_ratio; /* largest err / tol over every toleranced comparison (-1: none) */
    int    n_failed;
    size_t len;
    char   msg[4096];
};

/* Records a failed check; the message goes on its own indented line under the case's FAIL. */
void verdict_fail(struct verdict *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether the case runs (the filter); if so, seeds *r from the suite's seed and the name. */
int case_begin(struct suite *s, const char *name, struct rng *r);

/* Zeroed host memory that lives until case_end. */
void *case_alloc(struct suite *s, size_t n, size_t size);

/* Prints the case's line ("ok   name  [err/tol x]" or "FAIL name" and its messages), counts it
 * and frees its host memory. */
void case_end(struct suite *s, const char *name, const struct verdict *v);

/* A backend that leaves an op's slot empty does not support it: a failure, never a pass. */
#define SUPPORTED(v, b, slot)                                                                \
    ((b)->ops->slot != NULL                                                                  \
         ? 1                                                                                 \
         : (verdict_fail((v), "%s: op " #slot " is not implemented (empty slot)",            \
                         (b)->ops->name),                                                    \
            0))

/* The test's main: parses "--backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N]",
 * opens the backend with N threads (0, the default: one per core; the CPU one beside CUDA
 * always with the default), prints a header line, calls run_all, prints the time and
 * "N passed, M failed". Returns the exit status: 0 all passed, 1 a failure (or a backend that
 * cannot be opened), 2 bad usage, 77 with "SKIP: <skip_name>: ..." when CUDA is unavailable.
 * prog names the program in messages. */
int suite_main(int argc, char **argv, const char *prog, const char *skip_name,
               void (*run_all)(struct suite *s));

/* ---- host tensors ------------------------------------------------------------------------ */

/* A float tensor's host data in its storage dtype, with its exact values alongside; both are
 * case_alloc'd. */
struct hbuf {
    enum dtype dtype;
    size_t     n;
    void      *bits; /* (n) in dtype's storage */
    double    *val;  /* (n) the same values, exactly */
};

struct hbuf hbuf_make(struct suite *s, enum dtype t, size_t n); /* zeros */
void        hbuf_set(struct hbuf *h, size_t i, double v);       /* element i = v rounded */
struct hbuf hbuf_uniform(struct suite *s, enum dtype t, size_t n, struct rng *r, double lo,
                         double hi);

/* The n elements of bits as doubles, case_alloc'd. */
double *decode(struct suite *s, const void *bits, enum dtype t, size_t n);

/* ---- device buffers with guards ----------------------------------------------------------- */

#define GUARD_BYTES 256 /* a multiple of the 256-byte allocation alignment: data stays aligned */
#define ARENA_MAX_BUFS 16

/* The device buffers of one op call on one backend. Each is laid out as
 * GUARD_BYTES | data | GUARD_BYTES in a single backend allocation. Start one as {.b = backend}. */
struct arena {
    struct backend *b;
    int             n;
    struct dbuf {
        const char *name;
        void       *base;    /* the backend allocation */
        size_t      nbytes;  /* of data */
        size_t      elsize;
        const void *expect;  /* inputs: the bytes that must come back unchanged */
        void       *result;  /* outputs: where arena_finish puts the data */
    } bufs[ARENA_MAX_BUFS];
};

struct shape {
    int     ndim;
    int64_t d[TENSOR_MAX_DIMS];
};
#define S1(a) ((struct shape){1, {(a), 1, 1, 1}})
#define S2(a, b) ((struct shape){2, {(a), (b), 1, 1}})
#define S3(a, b, c) ((struct shape){3, {(a), (b), (c), 1}})
#define S4(a, b, c, d) ((struct shape){4, {(a), (b), (c), (d)}})

/* An input holding host's bytes (borrowed until arena_finish), which must come back
 * unchanged after the op. t may be a block-quantized dtype (a weight: tensor_nbytes bytes). */
struct tensor arena_in(struct arena *a, const char *name, enum dtype t, struct shape sh,
                       const void *host);

/* An output (init NULL: filled with 0xff bytes, NaN in every float dtype) or an in-place
 * operand (init: its input data). After arena_finish, `result` (if not NULL) holds the data. */
struct tensor arena_out(struct arena *a, const char *name, enum dtype t, struct shape sh,
                        const void *init, void *result);

/* Waits for the backend, checks every guard and every input, downloads the outputs and frees
 * the device memory; the arena is empty again. */
void arena_finish(struct arena *a, struct verdict *v);

/* ---- comparisons -------------------------------------------------------------------------- */

/* got against want within factor * tol[i] per element. A non-finite got where want is finite
 * always fails (the NaN/Inf check); a non-finite want (a deliberate -inf, say) must be matched
 * exactly. Reports the count, the worst element relative to its bound, and the largest absolute
 * and relative errors with their [row, col] (cols = length of a row). */
void compare_close(struct verdict *v, const char *what, const double *got, const double *want,
                   const double *tol, double factor, size_t n, size_t cols);

/* got equal to want: same value (NaN matches NaN); with check_sign, zeros and infinities must
 * also agree in sign. */
void compare_exact(struct verdict *v, const char *what, const double *got, const double *want,
                   size_t n, size_t cols, int check_sign);

void compare_i32(struct verdict *v, const char *what, const int32_t *got, const int32_t *want,
                 size_t n, size_t cols);

/* Float outputs of every backend (got[bi], bi < s->n_backends) against the reference within
 * tol, and CUDA against CPU within twice tol (each may sit on either side of the reference). */
void check_close(struct suite *s, struct verdict *v, const char *what, double *got[2],
                 const double *want, const double *tol, size_t n, size_t cols);

/* The same, exactly (see compare_exact). */
void check_exact(struct suite *s, struct verdict *v, const char *what, double *got[2],
                 const double *want, size_t n, size_t cols, int check_sign);

/* ---- double references shared by the forward and backward tests ------------------------ */

/* act(x) from its definition: SiLU x sigmoid(x), GELU with tanh or with erf; for
 * ACTIVATION_SWIGLU_OAI the gate's part, min(x, 7) sigmoid(1.702 min(x, 7)). */
double ref_act(enum activation act, double x);
/* What a gated activation multiplies act(gate) by: up, or for ACTIVATION_SWIGLU_OAI
 * clamp(up, -7, 7) + 1. */
double ref_gated_up(enum activation act, double u);
const char *act_name(enum activation act);

#endif
