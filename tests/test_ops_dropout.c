/* tests/test_ops_dropout.c - op_dropout (kernels/ops.h) against its definition, written here
 * again from the formula (splitmix64's finaliser of key ^ (row << 32 | col), the top 24 bits
 * against round(p 2^24)): every element kept or dropped as the formula says, kept ones scaled by
 * 1 / (1 - p); a global column offset; out aliasing x; the kept fraction near 1 - p; f32, bf16
 * and f16; guard bytes and NaN checks by the harness (op_check.c). With --backend cuda, CUDA
 * against the reference and the CPU.
 * Run:  test_ops_dropout --backend cpu|cuda [--filter SUBSTR] [--seed N] [--threads N] */
#include <math.h>
#include <stdio.h>

#include "op_check.h"
#include "ops.h"

static uint64_t ref_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static double unit_roundoff(enum dtype t) { return t == DTYPE_BF16 ? 0x1p-8 : t == DTYPE_F16 ? 0x1p-11 : 0.0; }

static void case_dropout(struct suite *s, enum dtype dt, int n, int d, int64_t col0, float p, uint64_t key, int alias)
{
    char name[128];
    snprintf(name, sizeof name, "dropout %s n=%d d=%d col0=%lld p=%g%s", dtype_name(dt), n, d, (long long)col0,
             (double)p, alias ? " out=x" : "");
    struct rng r;
    if (!case_begin(s, name, &r)) return;
    const size_t no = (size_t)n * (size_t)d;
    struct hbuf x = hbuf_uniform(s, dt, no, &r, 0.5, 4); /* nonzero: a kept element is never 0 */
    double *want = case_alloc(s, no, sizeof(double)), *tol = case_alloc(s, no, sizeof(double));
    const uint64_t threshold = (uint64_t)floor((double)p * 16777216.0 + 0.5);
    size_t kept = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < d; j++) {
            const size_t k = (size_t)i * (size_t)d + (size_t)j;
            const int keep = (ref_mix(key ^ ((uint64_t)i << 32 | (uint64_t)(col0 + j))) >> 40) >= threshold;
            want[k] = keep ? x.val[k] / (1.0 - (double)p) : 0.0;
            tol[k] = fabs(want[k]) * (4.0 * U32 + unit_roundoff(dt));
            kept += (size_t)keep;
        }
    struct verdict v = {.worst_ratio = -1.0};
    double *got[2] = {0};
    void *bits = case_alloc(s, no, dtype_size(dt));
    for (int bi = 0; bi < s->n_backends; bi++) {
        struct backend *b = s->backend[bi];
        struct arena a = {.b = b};
        struct tensor tx = alias ? arena_out(&a, "x=out", dt, S2(n, d), x.bits, bits) : arena_in(&a, "x", dt, S2(n, d), x.bits);
        struct tensor to = alias ? tx : arena_out(&a, "out", dt, S2(n, d), NULL, bits);
        if (SUPPORTED(&v, b, dropout)) op_dropout(b, &to, &tx, key, col0, p);
        arena_finish(&a, &v);
        got[bi] = decode(s, bits, dt, no);
    }
    check_close(s, &v, "out", got, want, tol, no, (size_t)d);
    for (int bi = 0; bi < s->n_backends; bi++) /* the mask itself, exactly: zero where dropped only */
        for (size_t k = 0; k < no; k++)
            if ((got[bi][k] == 0.0) != (want[k] == 0.0)) {
                verdict_fail(&v, "%s: element %zu %s, the formula %s it", s->backend_name[bi], k,
                             got[bi][k] == 0.0 ? "dropped" : "kept", want[k] == 0.0 ? "drops" : "keeps");
                break;
            }
    if (no >= 10000 && fabs((double)kept / (double)no - (1.0 - (double)p)) > 0.01)
        verdict_fail(&v, "kept fraction %.4f, expected %.4f", (double)kept / (double)no, 1.0 - (double)p);
    case_end(s, name, &v);
}

static void run_all(struct suite *s)
{
    static const enum dtype dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (int di = 0; di < 3; di++) {
        const enum dtype dt = dts[di];
        case_dropout(s, dt, 1, 1, 0, 0.1f, 1, 0);
        case_dropout(s, dt, 7, 129, 0, 0.1f, 0x1234567890abcdefULL, 0);
        case_dropout(s, dt, 7, 129, 4096, 0.1f, 0x1234567890abcdefULL, 1);
        case_dropout(s, dt, 33, 1030, 17, 0.5f, 99, di % 2);
        case_dropout(s, dt, 64, 1000, 0, 0.25f, 7, 0);
        case_dropout(s, dt, 5, 64, 0, 0.0f, 3, 1);
    }
}

int main(int argc, char **argv) { return suite_main(argc, argv, "test_ops_dropout", "ops_dropout_cuda", run_all); }
