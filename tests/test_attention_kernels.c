/* tests/test_attention_kernels.c - the inner kernels of op_attention on the CPU
 * (kernels/cpu/attention_impl.h), every implementation this CPU runs (portable always, AVX2 and AVX-512
 * when the CPU has it; one that cannot run here is reported SKIP), against a double-precision
 * reference:
 *   - scores: s[g][i] = q_g . k_i, within |err| <= 4 U32 |s| + 8 U32 sqrt(hd) sum_d |q_gd k_id|
 *     (an f32 dot product in any summation order; the probabilistic bound of Higham and Mary
 *     with lambda = 8, as test_ops.c uses for matmul);
 *   - accumulate: acc_g += sum_i p_gi v_i, within the same bound over the nk + 1 terms;
 *   - widen: bf16 and f16 to f32 bit for bit (specials, subnormals, both signs);
 *   - the SIMD results against the portable ones within twice the bound;
 * on query counts 1-13 (every tail of the 4-query register tile), head_dim 1-256 (every tail of
 * the 16-lane vectors and 64-feature tiles), key counts 1-65. Every K and V row ends at a page
 * followed by an inaccessible page, so a kernel that reads past a row's end faults; s entries
 * past nk and acc rows past gn are NaN sentinels that must stay untouched.
 * Not here: the op (tests/test_ops.c), speed (tests/bench_attention.c).
 * Exits 1 on any failure. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "cpu/attention_impl.h"
#include "cpu/cpu_isa.h"

#define U32 0x1p-24
#define MAX_ROWS 80

/* K or V rows, each in its own two pages: the row ends where the first page ends, the second is
 * PROT_NONE. */
struct fenced_rows {
    void  *map[MAX_ROWS];
    float *row[MAX_ROWS];
    size_t map_bytes;
    int    n;
};

static void rows_make(struct fenced_rows *r, int n, int hd)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = ((size_t)hd * sizeof(float) + page - 1) / page * page;
    CHECK(n <= MAX_ROWS, "rows_make: %d rows", n);
    r->n = n;
    r->map_bytes = data + page;
    for (int i = 0; i < n; i++) {
        char *m = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        CHECK(m != MAP_FAILED, "mmap of %zu bytes failed", r->map_bytes);
        CHECK(mprotect(m + data, page, PROT_NONE) == 0, "mprotect failed");
        r->map[i] = m;
        r->row[i] = (float *)(m + data) - hd;
    }
}

static void rows_free(struct fenced_rows *r)
{
    for (int i = 0; i < r->n; i++) munmap(r->map[i], r->map_bytes);
}

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static double uniform(double lo, double hi)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) * 0x1p-53;
}

/* Worst err / bound of one implementation's results, and the first shape that broke it. */
struct tally {
    double worst;
    int    failures;
    char   first[160];
};

static void tally_add(struct tally *t, double err, double bound, int ok_sentinels, const char *what,
                      int gn, int hd, int nk)
{
    double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (ratio > t->worst || isnan(ratio)) t->worst = isnan(ratio) ? INFINITY : ratio;
    if (!(ratio <= 1.0) || !ok_sentinels) {
        if (!t->failures)
            snprintf(t->first, sizeof t->first, "%s gn=%d hd=%d nk=%d: err/bound %.3g%s", what, gn,
                     hd, nk, ratio, ok_sentinels ? "" : ", wrote outside its output");
        t->failures++;
    }
}

/* One shape through every kernel table in kts (n_kt of them); kts[0] is the portable one. */
static void run_shape(const struct attn_kernels *const *kts, int n_kt, struct tally *ts,
                      struct tally *ta, struct tally *cross, int gn, int hd, int nk)
{
    const int lds = nk + 3, ldp = nk + 2;
    struct fenced_rows k, v;
    rows_make(&k, nk, hd);
    rows_make(&v, nk, hd);
    float *q = malloc((size_t)gn * hd * sizeof(float)), *p = malloc((size_t)gn * ldp * sizeof(float));
    float *acc0 = malloc((size_t)gn * hd * sizeof(float));
    CHECK(q && p && acc0, "out of memory");
    for (int i = 0; i < gn * hd; i++) q[i] = (float)uniform(-2, 2), acc0[i] = (float)uniform(-1, 1);
    for (int i = 0; i < gn * ldp; i++) p[i] = (float)uniform(0, 1);
    for (int i = 0; i < nk; i++)
        for (int d = 0; d < hd; d++) k.row[i][d] = (float)uniform(-1, 1), v.row[i][d] = (float)uniform(-1, 1);

    /* The references and their bounds. */
    double *s_ref = malloc((size_t)gn * nk * sizeof(double)), *s_bnd = malloc((size_t)gn * nk * sizeof(double));
    double *a_ref = malloc((size_t)gn * hd * sizeof(double)), *a_bnd = malloc((size_t)gn * hd * sizeof(double));
    CHECK(s_ref && s_bnd && a_ref && a_bnd, "out of memory");
    for (int g = 0; g < gn; g++)
        for (int i = 0; i < nk; i++) {
            double dot = 0, mag = 0;
            for (int d = 0; d < hd; d++) {
                dot += (double)q[g * hd + d] * k.row[i][d];
                mag += fabs((double)q[g * hd + d] * k.row[i][d]);
            }
            s_ref[g * nk + i] = dot;
            s_bnd[g * nk + i] = 4 * U32 * fabs(dot) + 8 * U32 * sqrt((double)hd) * mag + 0x1p-140;
        }
    for (int g = 0; g < gn; g++)
        for (int d = 0; d < hd; d++) {
            double sum = acc0[g * hd + d], mag = fabs(sum);
            for (int i = 0; i < nk; i++) {
                sum += (double)p[g * ldp + i] * v.row[i][d];
                mag += fabs((double)p[g * ldp + i] * v.row[i][d]);
            }
            a_ref[g * hd + d] = sum;
            a_bnd[g * hd + d] = 4 * U32 * fabs(sum) + 8 * U32 * sqrt((double)nk + 1) * mag + 0x1p-140;
        }

    float *s_got[3] = {0}, *a_got[3] = {0}; /* one per table: portable, avx2, avx512 */
    CHECK(n_kt <= 3, "run_shape: %d kernel tables", n_kt);
    for (int ki = 0; ki < n_kt; ki++) {
        /* One spare row each after the outputs: NaN sentinels, as are the s entries past nk. */
        float *s = malloc((size_t)(gn + 1) * lds * sizeof(float));
        float *a = malloc((size_t)(gn + 1) * hd * sizeof(float));
        CHECK(s && a, "out of memory");
        for (int i = 0; i < (gn + 1) * lds; i++) s[i] = NAN;
        memcpy(a, acc0, (size_t)gn * hd * sizeof(float));
        for (int i = gn * hd; i < (gn + 1) * hd; i++) a[i] = NAN;
        kts[ki]->scores(q, gn, hd, (const float *const *)k.row, nk, s, lds);
        kts[ki]->accumulate(a, gn, hd, p, ldp, (const float *const *)v.row, nk);

        int ok = 1;
        double err = 0, bnd = 1;
        for (int g = 0; g <= gn; g++)
            for (int i = 0; i < lds; i++) {
                float x = s[g * lds + i];
                if (g == gn || i >= nk) {
                    ok &= isnan(x) != 0;
                    continue;
                }
                double e = fabs((double)x - s_ref[g * nk + i]);
                if (!(e / s_bnd[g * nk + i] <= err / bnd)) err = e, bnd = s_bnd[g * nk + i];
            }
        tally_add(&ts[ki], err, bnd, ok, "scores", gn, hd, nk);
        ok = 1, err = 0, bnd = 1;
        for (int i = 0; i < (gn + 1) * hd; i++) {
            if (i >= gn * hd) {
                ok &= isnan(a[i]) != 0;
                continue;
            }
            double e = fabs((double)a[i] - a_ref[i]);
            if (!(e / a_bnd[i] <= err / bnd)) err = e, bnd = a_bnd[i];
        }
        tally_add(&ta[ki], err, bnd, ok, "accumulate", gn, hd, nk);
        s_got[ki] = s;
        a_got[ki] = a;
    }
    /* Each SIMD result against the portable one: both lie within the bound of the truth. */
    for (int ki = 1; ki < n_kt; ki++) {
        double err = 0, bnd = 1;
        for (int g = 0; g < gn; g++)
            for (int i = 0; i < nk; i++) {
                double e = fabs((double)s_got[ki][g * lds + i] - s_got[0][g * lds + i]);
                double b = 2 * s_bnd[g * nk + i];
                if (!(e / b <= err / bnd)) err = e, bnd = b;
            }
        for (int i = 0; i < gn * hd; i++) {
            double e = fabs((double)a_got[ki][i] - a_got[0][i]), b = 2 * a_bnd[i];
            if (!(e / b <= err / bnd)) err = e, bnd = b;
        }
        tally_add(&cross[ki], err, bnd, 1, "vs portable", gn, hd, nk);
    }
    for (int ki = 0; ki < n_kt; ki++) {
        free(s_got[ki]);
        free(a_got[ki]);
    }
    free(q), free(p), free(acc0), free(s_ref), free(s_bnd), free(a_ref), free(a_bnd);
    rows_free(&k);
    rows_free(&v);
}

/* Every bf16 and f16 bit pattern widened by the table equals tensor.h's conversion (the
 * formats wing's, itself tested against gguf-py), NaN payloads compared as NaN. The pattern
 * array is 65536 + 5 long, so that the vector loop and its scalar tail both see every value. */
static void check_widen(const struct attn_kernels *kt)
{
    enum { N = 65536 + 5 };
    uint16_t *src = malloc(N * sizeof(uint16_t));
    float *dst = malloc(N * sizeof(float));
    CHECK(src && dst, "out of memory");
    for (int i = 0; i < N; i++) src[i] = (uint16_t)((i * 40503u + (i >= 65536 ? 7u : 0u)) & 0xFFFF);
    for (int t = 0; t < 2; t++) {
        enum dtype dt = t ? DTYPE_F16 : DTYPE_BF16;
        kt->widen(dst, src, dt, N);
        int bad = -1;
        for (int i = 0; i < N && bad < 0; i++) {
            float want = dt == DTYPE_BF16 ? bf16_to_f32(src[i]) : f16_to_f32(src[i]);
            uint32_t a, b;
            memcpy(&a, &dst[i], 4);
            memcpy(&b, &want, 4);
            if (isnan(want) ? !isnan(dst[i]) : a != b) bad = i;
        }
        check(bad < 0, "%s widen %s: %d values bit for bit%s", kt->name, dtype_name(dt), N,
              bad < 0 ? "" : " (first mismatch below)");
        if (bad >= 0) printf("  bits 0x%04x -> %a\n", src[bad], (double)dst[bad]);
    }
    free(src);
    free(dst);
}

/* The online softmax's passes: max exactly the largest of m and the scores (m above them all
 * too), exp_sum's values within 1e-6 relative of e^(s - m) in double (cpu_exp's error is about
 * 2e-7) and its sum within that plus n U32 of the double sum, at lengths around every vector
 * width; nothing written past n. */
static void check_softmax(const struct attn_kernels *kt)
{
    static const int ns[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100};
    float s[128], e[128];
    int max_bad = 0, exp_bad = 0, sum_bad = 0, fence_bad = 0;
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++) {
        const int n = ns[a];
        for (int rep = 0; rep < 20; rep++) {
            for (int i = 0; i < 128; i++) s[i] = (float)uniform(-30.0, 30.0);
            const float m0 = rep % 4 == 0 ? 40.0f : -INFINITY; /* a running max above the pass's */
            float want_m = m0;
            for (int i = 0; i < n; i++) want_m = s[i] > want_m ? s[i] : want_m;
            const float m = kt->max(s, n, m0);
            max_bad += m != want_m;
            memcpy(e, s, sizeof e);
            const float sum = kt->exp_sum(e, n, want_m);
            double ref_sum = 0.0;
            for (int i = 0; i < n; i++) {
                const double want = exp((double)(s[i] - want_m)); /* the difference in f32, as the kernel */
                ref_sum += want;
                exp_bad += fabs((double)e[i] - want) > 1e-6 * want;
            }
            sum_bad += fabs((double)sum - ref_sum) > (1e-6 + n * U32) * ref_sum;
            for (int i = n; i < 128; i++) fence_bad += e[i] != s[i];
        }
    }
    check(!max_bad && !exp_bad && !sum_bad && !fence_bad,
          "%s softmax passes: max %d, exp %d, sum %d, written past n %d bad", kt->name, max_bad,
          exp_bad, sum_bad, fence_bad);
}

int main(void)
{
    /* The portable table, then each SIMD one the level allows (cpu_isa.h: this CPU's, capped by
     * SHARDLM_CPU_ISA); the others are skipped by name. */
    const struct attn_kernels *kts[3]; /* run_shape keeps one result per table: as many */
    int n_kt = 0;
    kts[n_kt++] = attn_kernels_portable();
    const struct {
        const struct attn_kernels *kt;
        enum cpu_isa level;
        const char *name;
    } simd[] = {{attn_kernels_avx2(), CPU_ISA_AVX2, "avx2"}, {attn_kernels_avx512(), CPU_ISA_AVX512, "avx512"}};
    for (size_t i = 0; i < sizeof simd / sizeof simd[0]; i++) {
        if (simd[i].kt && cpu_isa_at_least(simd[i].level)) kts[n_kt++] = simd[i].kt;
        else if (simd[i].kt) printf("SKIP %s: above the level in use here (%s)\n", simd[i].name, cpu_isa_name(cpu_isa()));
        else printf("SKIP %s: not compiled for this target\n", simd[i].name);
    }
    const struct attn_kernels *best = attn_kernels_best();
    check(best == kts[n_kt - 1], "the best table is the highest level's (%s)", best->name);
    printf("best implementation here: %s\n", best->name);

    static const int gns[] = {1, 2, 3, 4, 5, 7, 8, 13};
    static const int hds[] = {1, 4, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 72, 80, 128, 200, 256};
    static const int nks[] = {1, 2, 3, 4, 5, 7, 9, 32, 33, 65};
    struct tally ts[3] = {{0}}, ta[3] = {{0}}, cross[3] = {{0}};
    int shapes = 0;
    for (size_t a = 0; a < sizeof gns / sizeof gns[0]; a++)
        for (size_t b = 0; b < sizeof hds / sizeof hds[0]; b++)
            for (size_t c = 0; c < sizeof nks / sizeof nks[0]; c++) {
                run_shape(kts, n_kt, ts, ta, cross, gns[a], hds[b], nks[c]);
                shapes++;
            }
    /* A prefill tile: 128 query vectors over 64 keys, head_dim 256. */
    run_shape(kts, n_kt, ts, ta, cross, 128, 256, 64);
    shapes++;
    for (int ki = 0; ki < n_kt; ki++) {
        check(!ts[ki].failures, "%s scores, %d shapes: worst err/bound %.3f%s%s", kts[ki]->name,
              shapes, ts[ki].worst, ts[ki].failures ? "; first failure: " : "", ts[ki].first);
        check(!ta[ki].failures, "%s accumulate, %d shapes: worst err/bound %.3f%s%s", kts[ki]->name,
              shapes, ta[ki].worst, ta[ki].failures ? "; first failure: " : "", ta[ki].first);
        if (ki > 0)
            check(!cross[ki].failures, "%s against portable, %d shapes: worst diff/(2 bound) %.3f%s%s",
                  kts[ki]->name, shapes, cross[ki].worst, cross[ki].failures ? "; first failure: " : "",
                  cross[ki].first);
        check_widen(kts[ki]);
        check_softmax(kts[ki]);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
