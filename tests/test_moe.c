/* tests/test_moe.c - moe_route (engine/model/moe.h): each token's top-k experts and weights
 * against a direct reference (sort by probability, the lower index first on a tie), the
 * grouping by expert (runs in expert order, tokens ascending), renormalisation, exact ties, and
 * MiniMax-M2's sigmoid scores with a selection bias, DeepSeek-V3's group-limited choice and
 * routed_scaling_factor (GLM-4.5).
 * The forward through the experts is checked by the MoE goldens (tests/test_model.c). */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "moe.h"

/* The reference: token t's j-th expert and weight, by sorting all E (choice score desc, index
 * asc): the softmax probability, or (sc) the sigmoid score plus the selection bias, the weight
 * being the probability or score. */
static void ref_route(const float *z, int E, int k, int norm, const struct moe_scoring *sc, int *top, double *wt)
{
    double mx = -INFINITY, s = 0.0, p[256], c[256];
    for (int e = 0; e < E; e++) mx = fmax(mx, z[e]);
    for (int e = 0; e < E; e++) s += p[e] = exp((double)z[e] - mx);
    for (int e = 0; e < E; e++) p[e] /= s;
    for (int e = 0; sc && sc->sigmoid && e < E; e++) p[e] = 1.0 / (1.0 + exp(-(double)z[e]));
    for (int e = 0; e < E; e++) c[e] = p[e] + (sc && sc->sel_bias ? (double)sc->sel_bias[e] : 0.0);
    if (sc && sc->groups > 1) { /* DeepSeek-V3: groups scored by their two best, all but the best kept ones zeroed */
        const int G = sc->groups, per = E / G;
        double gs[64], cp[256];
        int order[64];
        for (int g = 0; g < G; g++) {
            for (int i = 0; i < per; i++) cp[i] = c[g * per + i];
            for (int i = 0; i < 2; i++) /* the two largest first */
                for (int j = i + 1; j < per; j++)
                    if (cp[j] > cp[i]) {
                        double x = cp[i];
                        cp[i] = cp[j], cp[j] = x;
                    }
            gs[g] = cp[0] + cp[1];
            order[g] = g;
        }
        for (int i = 0; i < G; i++)
            for (int j = i + 1; j < G; j++)
                if (gs[order[j]] > gs[order[i]] || (gs[order[j]] == gs[order[i]] && order[j] < order[i])) {
                    int x = order[i];
                    order[i] = order[j], order[j] = x;
                }
        for (int i = sc->group_topk; i < G; i++)
            for (int e = order[i] * per; e < (order[i] + 1) * per; e++) c[e] = 0.0;
    }
    int idx[256];
    for (int e = 0; e < E; e++) idx[e] = e;
    for (int i = 0; i < E; i++) /* selection sort: stable on ties by index */
        for (int j = i + 1; j < E; j++)
            if (c[idx[j]] > c[idx[i]] || (c[idx[j]] == c[idx[i]] && idx[j] < idx[i])) {
                int t = idx[i];
                idx[i] = idx[j];
                idx[j] = t;
            }
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += p[idx[j]];
    for (int j = 0; j < k; j++) {
        top[j] = idx[j];
        wt[j] = (norm ? p[idx[j]] / sum : p[idx[j]]) * (sc && sc->scale > 0.0f ? sc->scale : 1.0);
    }
}

/* Routes T tokens and compares every (token, expert, weight) with the reference. */
static void check_case(const char *what, const float *z, int T, int E, int k, int norm, const struct moe_scoring *sc)
{
    int *start = malloc((size_t)(E + 1) * sizeof *start);
    int32_t *ids = malloc((size_t)(T * k) * sizeof *ids);
    float *w = malloc((size_t)(T * k) * sizeof *w);
    moe_route(z, T, E, k, norm, sc, start, ids, w);
    int ok = start[0] == 0 && start[E] == T * k, bad_t = -1;
    for (int e = 0; e < E && ok; e++) {
        ok = start[e] <= start[e + 1];
        for (int i = start[e]; ok && i + 1 < start[e + 1]; i++) ok = ids[i] < ids[i + 1];
    }
    for (int t = 0; t < T && ok; t++) {
        int top[64];
        double wt[64];
        ref_route(z + (size_t)t * (size_t)E, E, k, norm, sc, top, wt);
        for (int j = 0; j < k && ok; j++) { /* token t must appear in top[j]'s run with weight wt[j] */
            int found = 0;
            for (int i = start[top[j]]; i < start[top[j] + 1]; i++)
                if (ids[i] == t) found = fabs((double)w[i] - wt[j]) <= 1e-6 * fmax(1.0, wt[j]);
            if (!found) ok = 0, bad_t = t;
        }
    }
    check(ok, "moe_route %s: %d tokens, top %d of %d experts%s%s%s%s", what, T, k, E, norm ? ", renormalised" : "",
          sc && sc->sigmoid ? ", sigmoid scores" : "", sc && sc->sel_bias ? " with a selection bias" : "",
          bad_t >= 0 ? " (mismatch)" : "");
    free(start);
    free(ids);
    free(w);
}

int main(void)
{
    /* Exact ties: every expert equal, so the k lowest indices, weight 1/E (or 1/k). */
    float flat[3 * 6];
    for (int i = 0; i < 18; i++) flat[i] = 0.25f;
    check_case("all tied", flat, 3, 6, 2, 0, NULL);
    check_case("all tied", flat, 3, 6, 2, 1, NULL);
    int start[7];
    int32_t ids[6];
    float w[6];
    moe_route(flat, 3, 6, 2, 1, NULL, start, ids, w);
    check(start[1] == 3 && start[2] == 6 && start[6] == 6 && w[0] == 0.5f,
          "moe_route ties: experts 0 and 1 take every token, weights 1/2 (start %d %d %d, w %g)", start[1], start[2],
          start[6], (double)w[0]);
    /* Partial ties at the k-th place, and random logits of several sizes. */
    float part[2 * 5] = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, -1.0f, 0.5f, 0.5f, 0.5f, 4.0f};
    check_case("tied at the k-th", part, 2, 5, 3, 0, NULL);
    srand(7);
    static const int shapes[][3] = {{17, 8, 2}, {40, 64, 8}, {5, 128, 8}, {9, 4, 4}, {1, 3, 1}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int T = shapes[s][0], E = shapes[s][1], k = shapes[s][2];
        float *z = malloc((size_t)(T * E) * sizeof *z);
        for (int i = 0; i < T * E; i++) z[i] = 4.0f * ((float)rand() / (float)RAND_MAX - 0.5f);
        check_case("random", z, T, E, k, (int)(s % 2), NULL);
        /* MiniMax-M2's router: sigmoid scores, renormalised; a selection bias (of the scores'
         * size, so that it changes which experts win without deciding alone) chooses. */
        float *bias = malloc((size_t)E * sizeof *bias);
        for (int e = 0; e < E; e++) bias[e] = 0.3f * ((float)rand() / (float)RAND_MAX - 0.5f);
        const struct moe_scoring sig = {1, NULL, 0, 0, 0.0f}, sel = {1, bias, 0, 0, 0.0f};
        check_case("random", z, T, E, k, 1, &sig);
        check_case("random", z, T, E, k, 1, &sel);
        /* GLM-4.5 / DeepSeek-V3: the same router with group-limited choice and routed_scaling_factor. */
        for (int G = 2; G <= 8 && E % G == 0 && E / G >= 2; G *= 2)
            for (int keep = 1; keep <= G; keep++) {
                if (keep * (E / G) < k) continue;
                const struct moe_scoring grp = {1, bias, G, keep, 2.5f};
                check_case(G == 2 && keep == 1 ? "random, groups of experts" : "random, groups", z, T, E, k, 1, &grp);
                check_case("random, groups, not renormalised", z, T, E, k, 0, &grp);
            }
        free(bias);
        free(z);
    }
    /* The selection bias chooses but does not weight: expert 2's bias lifts it over expert 0
     * (scores sigmoid(2) vs sigmoid(1.5) + 0.2), and the two weights stay the scores' shares. */
    {
        const float z2[3] = {2.0f, 1.0f, 1.5f}, b2[3] = {0.0f, 0.0f, 0.2f};
        const struct moe_scoring sel = {1, b2, 0, 0, 0.0f};
        int st2[4];
        int32_t id2[2];
        float w2[2];
        moe_route(z2, 1, 3, 2, 1, &sel, st2, id2, w2);
        const double s0 = 1.0 / (1.0 + exp(-2.0)), s2 = 1.0 / (1.0 + exp(-1.5));
        check(st2[1] == 1 && st2[2] == 1 && st2[3] == 2 && fabs(w2[0] - s0 / (s0 + s2)) < 1e-6 &&
                  fabs(w2[1] - s2 / (s0 + s2)) < 1e-6,
              "moe_route selection bias: experts 0 and 2 chosen (starts %d %d %d), weights %g %g of the scores alone",
              st2[1], st2[2], st2[3], (double)w2[0], (double)w2[1]);
    }
    /* A group outside the kept ones loses its experts though they score best alone: groups {0, 1}
     * and {2, 3}, scores by logits 3, -3 | 1, 1: group sums s(3) + s(-3) = 1.0 < 2 s(1) = 1.46, so
     * top 1 of the second group only, expert 2 (the lower of the tie), weight 2.5 (renormalised). */
    {
        const float z3[4] = {3.0f, -3.0f, 1.0f, 1.0f};
        const struct moe_scoring grp = {1, NULL, 2, 1, 2.5f};
        int st3[5];
        int32_t id3[1];
        float w3[1];
        moe_route(z3, 1, 4, 1, 1, &grp, st3, id3, w3);
        check(st3[2] == 0 && st3[3] == 1 && fabs(w3[0] - 2.5) < 1e-6,
              "moe_route groups: expert 0 masked with its group, expert 2 chosen (starts %d %d %d %d), weight %g x 2.5",
              st3[1], st3[2], st3[3], st3[4], (double)w3[0]);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
