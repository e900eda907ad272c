/* engine/serving/sampler_check.c - what the device's sampling ops are checked against at a
 * server's start (conductor_setup.c), before any request trusts them: the draws (their tolerance,
 * or none taken: sampler_draw_tolerance) and the edits, masks, masses, normalisers, top candidates
 * and argmax (sampler_device_check), each on calibration rows against the host's arithmetic. The
 * CUDA kernels behind most of them were written without a GPU (docs/cuda.md); a wrong one then
 * costs speed (whole rows fetched), not wrong tokens.
 * Tests: tests/test_sampler.c (the CPU backend passes; CPU backends with one op made wrong are
 * refused, naming it). */
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

/* Calibration rows: CAL_ROWS of CAL_V logits, each with 64 tokens within 1 of its top (so that one
 * weight off by an ulp moves the margins by about 1e-9, far above the 5e-13 that the sums' order
 * can), temperatures and uniforms spread over their ranges (u near 0 and near 1 included). The
 * same rows again with top_p (the nucleus draw), their uniforms the first of a random stream. */
#define CAL_ROWS 16
#define CAL_V 4096
#define CAL_EXACT 1e-11

double sampler_draw_tolerance(struct backend *b)
{
    struct sampler s = {0};
    float *x = malloc((size_t)CAL_ROWS * CAL_V * sizeof *x), *row = malloc((size_t)CAL_V * sizeof *row);
    float t[CAL_ROWS], u[CAL_ROWS], u_nuc[CAL_ROWS], top_p[CAL_ROWS], margin[CAL_ROWS], margin_nuc[CAL_ROWS];
    int32_t ids[CAL_ROWS], ids_nuc[CAL_ROWS];
    struct rng streams[CAL_ROWS];
    void *dev = NULL;
    const size_t nx = (size_t)CAL_ROWS * CAL_V * sizeof *x, n1 = CAL_ROWS * sizeof(float);
    double tol = SAMPLER_DRAW_TOL;
    if (!x || !row || sampler_init(&s, CAL_V) != STATUS_OK || backend_alloc(b, nx + 8 * n1, &dev) != STATUS_OK)
        goto done;
    struct rng g;
    rng_seed(&g, 20261206);
    for (int i = 0; i < CAL_ROWS; i++) {
        float *r = x + (size_t)i * CAL_V;
        for (int j = 0; j < CAL_V; j++) r[j] = -4.0f - 8.0f * rng_uniform(&g);
        for (int j = 0; j < 64; j++) r[(j * 61 + i * 7) % CAL_V] = rng_uniform(&g);
        t[i] = 0.4f + 0.1f * (float)i;
        u[i] = i == 0 ? 0.0f : i == CAL_ROWS - 1 ? 1.0f - 1.0f / 16777216.0f : rng_uniform(&g);
        top_p[i] = 0.3f + 0.045f * (float)i; /* 0.3 .. 0.975 */
        rng_seed(&streams[i], 7000 + (uint64_t)i);
        struct rng copy = streams[i];
        u_nuc[i] = rng_uniform(&copy); /* as the conductor takes it (conductor_device.c) */
    }
    char *d = dev;
    struct tensor tx = tensor_make(d, DTYPE_F32, b->device, 2, (int64_t)CAL_ROWS, (int64_t)CAL_V);
    struct tensor tt = tensor_make(d + nx, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tu = tensor_make(d + nx + n1, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor ti = tensor_make(d + nx + 2 * n1, DTYPE_I32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tm = tensor_make(d + nx + 3 * n1, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tun = tensor_make(d + nx + 4 * n1, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tp = tensor_make(d + nx + 5 * n1, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tin = tensor_make(d + nx + 6 * n1, DTYPE_I32, b->device, 1, (int64_t)CAL_ROWS);
    struct tensor tmn = tensor_make(d + nx + 7 * n1, DTYPE_F32, b->device, 1, (int64_t)CAL_ROWS);
    backend_upload(b, tx.data, x, nx);
    backend_upload(b, tt.data, t, n1);
    backend_upload(b, tu.data, u, n1);
    backend_upload(b, tun.data, u_nuc, n1);
    backend_upload(b, tp.data, top_p, n1);
    op_logit_draw(b, &ti, &tm, &tx, &tt, NULL, &tu);
    op_logit_draw(b, &tin, &tmn, &tx, &tt, &tp, &tun);
    backend_download(b, ids, ti.data, n1);
    backend_download(b, margin, tm.data, n1);
    backend_download(b, ids_nuc, tin.data, n1);
    backend_download(b, margin_nuc, tmn.data, n1);
    int exact = 1, wrong = 0;
    for (int i = 0; i < CAL_ROWS; i++) {
        double want = 0.0;
        const int32_t id = sampler_draw(&s, x + (size_t)i * CAL_V, t[i], u[i], &want);
        exact = exact && id == ids[i] && want >= 0.0 && fabs((double)margin[i] - want) <= CAL_EXACT + 1e-7 * want;
        /* a draw the conductor would take at the wider tolerance must be the host's token */
        wrong = wrong || (ids[i] >= 0 && margin[i] >= SAMPLER_DRAW_TOL && ids[i] != id);
        struct sampling_params p = sampling_params_default();
        p.temperature = t[i], p.top_p = top_p[i];
        memcpy(row, x + (size_t)i * CAL_V, (size_t)CAL_V * sizeof *row);
        const int32_t nuc = sampler_sample(&s, &p, &streams[i], row, NULL, 0, NULL, 0);
        wrong = wrong || (ids_nuc[i] >= 0 && margin_nuc[i] >= SAMPLER_DRAW_TOL && ids_nuc[i] != nuc);
    }
    tol = wrong ? INFINITY : exact ? SAMPLER_DRAW_TOL_EXACT : SAMPLER_DRAW_TOL;
done:
    backend_free(b, dev);
    sampler_free(&s);
    free(x);
    free(row);
    return tol;
}

/* sampler_device_check's rows: CHK_ROWS of CHK_V logits, spread, with ties among the largest. */
#define CHK_ROWS 6
#define CHK_V 3000
#define CHK_K 64
#define CHK_EDITS 5 /* per row */

/* x + add (skipped at 0), then / rep above 0 and * rep elsewhere, then - sub: op_logit_edit's
 * arithmetic as the host sampler makes it (sampling_logits, apply_penalties). */
static float edit_one(float e, const float *v)
{
    if (v[0] != 0.0f) e += v[0];
    e = e > 0.0f ? e / v[1] : e * v[1];
    return e - v[2];
}

/* got within rel of want (relative above 1, absolute below); an infinity only equal to itself */
static int close_to(double got, double want, double rel)
{
    if (isinf(got) || isinf(want)) return got == want;
    return fabs(got - want) <= rel * (1.0 + fabs(want));
}

int sampler_device_check(struct backend *b, char *why, size_t why_size)
{
    const size_t nx = (size_t)CHK_ROWS * CHK_V, ne = (size_t)CHK_ROWS * CHK_EDITS;
    const int words = (CHK_V + 31) / 32;
    float *x = malloc(nx * sizeof *x), *got = malloc(nx * sizeof *got), vals[3 * CHK_ROWS * CHK_EDITS];
    float inv_temp[CHK_ROWS], want[CHK_ROWS], mass[CHK_ROWS], lse[CHK_ROWS], top_v[CHK_ROWS * CHK_K];
    int32_t rows[CHK_ROWS * CHK_EDITS], ids[CHK_ROWS * CHK_EDITS], top_i[CHK_ROWS * CHK_K], arg[CHK_ROWS];
    int32_t mrows[2] = {1, 4};
    uint32_t *mask = calloc((size_t)2 * words, sizeof *mask);
    void *dev = NULL;
    /* device layout: x, edits (rows, ids, vals), mask rows, masks, inv_temp, want, mass, lse, top_v, top_i, argmax */
    size_t off[13], end = 0;
    const size_t sizes[13] = {nx * 4, ne * 4, ne * 4, 3 * ne * 4, 2 * 4, (size_t)2 * words * 4, CHK_ROWS * 4,
                              CHK_ROWS * 4, CHK_ROWS * 4, CHK_ROWS * 4, CHK_ROWS * CHK_K * 4, CHK_ROWS * CHK_K * 4,
                              CHK_ROWS * 4};
    for (int i = 0; i < 13; i++) off[i] = end, end += (sizes[i] + 255) / 256 * 256;
    int ok = 0;
    snprintf(why, why_size, "out of memory for the check");
    if (!x || !got || !mask || backend_alloc(b, end, &dev) != STATUS_OK) goto done;
    struct rng g;
    rng_seed(&g, 20261207);
    for (int i = 0; i < CHK_ROWS; i++) {
        float *r = x + (size_t)i * CHK_V;
        for (int j = 0; j < CHK_V; j++) r[j] = (float)(i + 1) * (rng_uniform(&g) * 8.0f - 6.0f);
        for (int j = 0; j < 8; j++) r[(j * 37 + i) % CHK_V] = 2.5f + (float)i; /* ties at the top */
        inv_temp[i] = 0.5f + 0.3f * (float)i;
        want[i] = i % 3 == 2 ? 0.0f : 1.0f;
        for (int k = 0; k < CHK_EDITS; k++) {
            const int e = i * CHK_EDITS + k;
            rows[e] = i, ids[e] = (int32_t)((k * 613 + i * 17) % CHK_V);
            vals[3 * e] = k == 0 ? -INFINITY : k == 1 ? 3.25f : 0.0f;
            vals[3 * e + 1] = k >= 2 ? 1.3f : 1.0f;
            vals[3 * e + 2] = k == 4 ? 0.75f : 0.0f;
        }
    }
    for (int m = 0; m < 2; m++) /* every third token kept, and the row's first tied top */
        for (int j = 0; j < CHK_V; j++)
            if (j % 3 == m || j == (mrows[m] % CHK_V)) mask[(size_t)m * words + j / 32] |= 1u << (j % 32);
    char *d = dev;
#define T1(i, dt, n) tensor_make(d + off[i], dt, b->device, 1, (int64_t)(n))
    struct tensor tx = tensor_make(d + off[0], DTYPE_F32, b->device, 2, (int64_t)CHK_ROWS, (int64_t)CHK_V);
    struct tensor t_rows = T1(1, DTYPE_I32, ne), t_ids = T1(2, DTYPE_I32, ne);
    struct tensor t_vals = tensor_make(d + off[3], DTYPE_F32, b->device, 2, (int64_t)ne, (int64_t)3);
    struct tensor t_mrows = T1(4, DTYPE_I32, 2);
    struct tensor t_masks = tensor_make(d + off[5], DTYPE_I32, b->device, 2, (int64_t)2, (int64_t)words);
    struct tensor t_inv = T1(6, DTYPE_F32, CHK_ROWS), t_want = T1(7, DTYPE_F32, CHK_ROWS);
    struct tensor t_mass = T1(8, DTYPE_F32, CHK_ROWS), t_lse = T1(9, DTYPE_F32, CHK_ROWS);
    struct tensor t_top_v = tensor_make(d + off[10], DTYPE_F32, b->device, 2, (int64_t)CHK_ROWS, (int64_t)CHK_K);
    struct tensor t_top_i = tensor_make(d + off[11], DTYPE_I32, b->device, 2, (int64_t)CHK_ROWS, (int64_t)CHK_K);
    struct tensor t_arg = T1(12, DTYPE_I32, CHK_ROWS);
#undef T1
    backend_upload(b, tx.data, x, nx * 4);
    backend_upload(b, t_rows.data, rows, ne * 4);
    backend_upload(b, t_ids.data, ids, ne * 4);
    backend_upload(b, t_vals.data, vals, 3 * ne * 4);
    backend_upload(b, t_mrows.data, mrows, sizeof mrows);
    backend_upload(b, t_masks.data, mask, (size_t)2 * words * 4);
    backend_upload(b, t_inv.data, inv_temp, sizeof inv_temp);
    backend_upload(b, t_want.data, want, sizeof want);
    op_logit_edit(b, &tx, &t_rows, &t_ids, &t_vals);
    op_logit_mask(b, &tx, &t_mrows, &t_masks);
    op_logit_mass(b, &t_mass, &tx, &t_inv);
    op_logit_lse(b, &t_lse, &tx, &t_want);
    op_topk(b, &t_top_v, &t_top_i, &tx);
    op_argmax(b, &t_arg, &tx);
    backend_download(b, got, tx.data, nx * 4);
    backend_download(b, mass, t_mass.data, sizeof mass);
    backend_download(b, lse, t_lse.data, sizeof lse);
    backend_download(b, top_v, t_top_v.data, sizeof top_v);
    backend_download(b, top_i, t_top_i.data, sizeof top_i);
    backend_download(b, arg, t_arg.data, sizeof arg);

    /* the host's: the edits, then the masks, on x */
    for (size_t e = 0; e < ne; e++) {
        float *v = x + (size_t)rows[e] * CHK_V + ids[e];
        *v = edit_one(*v, vals + 3 * e);
    }
    for (int m = 0; m < 2; m++)
        for (int j = 0; j < CHK_V; j++)
            if (!(mask[(size_t)m * words + j / 32] >> (j % 32) & 1u)) x[(size_t)mrows[m] * CHK_V + j] = -INFINITY;
    for (size_t i = 0; i < nx; i++)
        if (!close_to(got[i], x[i], 1e-6)) {
            snprintf(why, why_size, "op_logit_edit / op_logit_mask: row %zu token %zu %g, the host's %g", i / CHK_V,
                     i % CHK_V, (double)got[i], (double)x[i]);
            goto done;
        }
    for (int i = 0; i < CHK_ROWS; i++) {
        const float *r = x + (size_t)i * CHK_V;
        const int32_t top = sampler_argmax(r, CHK_V);
        const double m = r[top];
        double sum = 0.0, within = 0.0;
        for (int j = 0; j < CHK_V; j++) {
            if (isinf(r[j])) continue;
            const double z = ((double)r[j] - m) * inv_temp[i];
            sum += exp((double)r[j] - m);
            if (z >= log(1e-12)) within += exp(z);
        }
        if (arg[i] != top) {
            snprintf(why, why_size, "op_argmax: row %d gave %d, the host's %d", i, arg[i], top);
            goto done;
        }
        if (!close_to(mass[i], within, 1e-5)) {
            snprintf(why, why_size, "op_logit_mass: row %d gave %g, the host's %g", i, (double)mass[i], within);
            goto done;
        }
        if (!close_to(lse[i], want[i] > 0.0f ? log(sum) : 0.0, 1e-5)) {
            snprintf(why, why_size, "op_logit_lse: row %d gave %g, the host's %g", i, (double)lse[i], log(sum));
            goto done;
        }
        int prev = -1; /* the top CHK_K, descending, lower id first on ties */
        for (int k = 0; k < CHK_K; k++) {
            int best = -1;
            for (int j = 0; j < CHK_V; j++) {
                const int after = prev < 0 || r[j] < r[prev] || (r[j] == r[prev] && j > prev);
                if (after && (best < 0 || r[j] > r[best])) best = j;
            }
            if (top_i[i * CHK_K + k] != best || top_v[i * CHK_K + k] != r[best]) {
                snprintf(why, why_size, "op_topk: row %d's candidate %d is %d (%g), the host's %d (%g)", i, k,
                         top_i[i * CHK_K + k], (double)top_v[i * CHK_K + k], best, (double)r[best]);
                goto done;
            }
            prev = best;
        }
    }
    ok = 1;
    snprintf(why, why_size, "the host's on %d calibration rows", CHK_ROWS);
done:
    backend_free(b, dev);
    free(x), free(got), free(mask);
    return ok;
}
