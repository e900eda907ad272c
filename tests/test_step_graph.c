/* tests/test_step_graph.c - decode steps run from backend graphs (engine/model/step_graph.c)
 * against the same steps run op by op, and a step's host <-> device copies; part of test_model
 * (its "step-graph" command).
 *   test_model step-graph mirror             the CPU backend's recording (kernels/cpu/graph.c):
 *                                            recorded ops do not run, a launch runs them on the
 *                                            data as it is then with the values recorded; what a
 *                                            capture cannot hold (an upload, a synchronize) fails it.
 *   test_model step-graph [--device cuda] DIR... each model twice on one backend, SHARDLM_GRAPHS=1 and
 *                                            0: three sequences prefilled, then 60 decode steps
 *                                            over changing sets of them (batch sizes 3, 2, 3, 1;
 *                                            max_seq_len crossing its power-of-two buckets), each
 *                                            step's logits compared: bit for bit on the CPU (the
 *                                            replay calls the same kernels with the same values);
 *                                            on CUDA within CUDA_TOL (a graph's attention runs the
 *                                            split count of its rounded max_seq_len). The graphs
 *                                            must have been captured and replayed, and never
 *                                            refused; then the workspace grows (model_reserve again:
 *                                            every graph dropped) and 8 more steps must match and
 *                                            capture again; with --none, a model whose steps may not take
 *                                            graphs (a mixture of experts) must take none. Each model
 *                                            runs twice more with room for 8 sequences, so that the
 *                                            steps of 3 are padded to graphs of 4 (step_graph_pad),
 *                                            the backend batch-invariant (a product row's bits then
 *                                            do not depend on the batch's rows): the padded steps
 *                                            counted, the logits again the bits of unpadded steps.
 *                                            Every capture must have been verified (its first launch
 *                                            against the step op by op); with
 *                                            SHARDLM_TEST_GRAPH_MISMATCH=1 (a capture's logits read
 *                                            as off) the first capture must turn graphs off, the
 *                                            logits still the op-by-op bits.
 *                                            Then each model's decode steps with the sampling on
 *                                            the device (engine/model/device_sampling.c: greedy; the
 *                                            top candidates with masses, draws and normalisers; with
 *                                            an edit and a mask) beside the same steps' downloaded
 *                                            logits: the outputs those logits give, and the copies
 *                                            counted (the step's inputs one upload, the sampling's
 *                                            one, its outputs one download, one more before edits).
 * With models, model_reserve must also refuse SHARDLM_GRAPHS=yes by name.
 * Prints one line per check and "N passed, M failed"; 77 (SKIP) without a GPU for cuda. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#define CUDA_TOL  2e-2
#define N_SEQS    3
#define MAX_CTX   128
#define BT        16
#define W         (MAX_CTX / BT)
#define N_STEPS   60
#define N_AFTER_GROWTH 8 /* steps after the workspace grew (the graphs dropped) */
#define PAD_SEQS  8 /* the padded runs' room: 3 sequences pad to 4 */

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *detail)
{
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
    ok ? n_pass++ : n_fail++;
}

static int finish(void)
{
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

/* ---- the CPU recording mirror ------------------------------------------------------------ */

static void upload_f32(struct backend *b, const struct tensor *t, const float *v)
{
    backend_upload(b, t->data, v, tensor_nbytes(t));
}

static int run_mirror(void)
{
    struct backend *b = NULL;
    if (backend_open(DEVICE_CPU, 0, 1, &b) != STATUS_OK) {
        check(0, "mirror: cpu backend", status_message());
        return finish();
    }
    struct tensor a, c, out;
    const int64_t shape[1] = {4};
    CHECK(backend_alloc_tensor(b, &a, DTYPE_F32, 1, shape) == STATUS_OK &&
              backend_alloc_tensor(b, &c, DTYPE_F32, 1, shape) == STATUS_OK &&
              backend_alloc_tensor(b, &out, DTYPE_F32, 1, shape) == STATUS_OK,
          "mirror: tensors");
    const float va[4] = {1, 2, 3, 4}, vc[4] = {10, 20, 30, 40}, zero[4] = {0};
    upload_f32(b, &a, va), upload_f32(b, &c, vc), upload_f32(b, &out, zero);

    struct backend_graph *g = NULL;
    enum status st = backend_graph_begin(b);
    check(st == STATUS_OK, "mirror: begin", status_message());
    op_add(b, &out, &a, &c);
    op_scale(b, &out, &out, 0.5f);
    st = backend_graph_end(b, &g);
    check(st == STATUS_OK && g, "mirror: end", status_message());
    float got[4];
    backend_download(b, got, out.data, sizeof got);
    check(!memcmp(got, zero, sizeof got), "mirror: recorded ops do not run", "");
    st = backend_graph_launch(b, g);
    backend_download(b, got, out.data, sizeof got);
    check(st == STATUS_OK && got[0] == 5.5f && got[3] == 22.0f, "mirror: a launch runs them", "");
    const float va2[4] = {-1, -2, -3, -4};
    upload_f32(b, &a, va2); /* data changed after the recording: the next launch reads it */
    (void)backend_graph_launch(b, g);
    backend_download(b, got, out.data, sizeof got);
    check(got[0] == 4.5f && got[3] == 18.0f, "mirror: a launch reads the data as it is then", "");
    backend_graph_free(b, g);

    /* What a capture cannot hold fails it, and nothing recorded runs. */
    upload_f32(b, &out, zero);
    const char *refused[] = {"upload", "synchronize"};
    for (int k = 0; k < 2; k++) {
        g = NULL;
        (void)backend_graph_begin(b);
        op_add(b, &out, &a, &c);
        if (k == 0) upload_f32(b, &a, va);
        else backend_synchronize(b);
        st = backend_graph_end(b, &g);
        char what[64];
        snprintf(what, sizeof what, "mirror: a %s fails the recording", refused[k]);
        check(st == STATUS_UNAVAILABLE && !g && strstr(status_message(), refused[k]), what, status_message());
    }
    backend_download(b, got, out.data, sizeof got);
    check(!memcmp(got, zero, sizeof got), "mirror: a failed recording ran nothing", "");
    float a_now[4];
    backend_download(b, a_now, a.data, sizeof a_now);
    check(!memcmp(a_now, va2, sizeof a_now), "mirror: the refused upload was not made", "");
    backend_free(b, a.data), backend_free(b, c.data), backend_free(b, out.data);
    backend_close(b);
    return finish();
}

/* ---- decode steps with and without graphs ---------------------------------------------------- */

struct side {
    struct model   *m;
    struct kv_cache cache;
    int32_t         table[N_SEQS][W];
};

static enum status side_open(struct side *s, struct backend *b, const char *dir, const char *graphs, int room,
                             int mismatch)
{
    memset(s, 0, sizeof *s);
    setenv("SHARDLM_GRAPHS", graphs, 1);
    if (mismatch) setenv("SHARDLM_TEST_GRAPH_MISMATCH", "1", 1);
    enum status st = model_load(dir, b, NULL, &s->m);
    if (st == STATUS_OK) st = model_reserve(s->m, 64, room, W, room);
    unsetenv("SHARDLM_GRAPHS");
    unsetenv("SHARDLM_TEST_GRAPH_MISMATCH");
    if (st == STATUS_OK)
        st = kv_cache_init(&s->cache, b, s->m->n_layers_local, N_SEQS * W, BT, s->m->n_kv_local, s->m->cfg.head_dim,
                           s->m->dtype);
    for (int q = 0; q < N_SEQS && st == STATUS_OK; q++) st = kv_cache_alloc(&s->cache, W, s->table[q]);
    return st;
}

static void side_close(struct side *s)
{
    kv_cache_free(&s->cache);
    model_free(s->m);
}

/* One step over the sequences in act (n of them), each bringing rows new tokens (prefill when
 * rows > 1, then only act[0]); logits of each sequence's last row. */
static enum status step_with(struct side *s, const int *act, int n, const int *len, const int32_t *tok, int rows,
                             float *logits, const struct forward_batch *sampling)
{
    int32_t pos[64], slots[64], q_start[N_SEQS + 1], seq_len[N_SEQS], table[N_SEQS * W], lrows[N_SEQS];
    int T = 0;
    q_start[0] = 0;
    for (int i = 0; i < n; i++) {
        const int q = act[i];
        for (int r = 0; r < rows; r++, T++) {
            pos[T] = len[q] + r;
            slots[T] = s->table[q][pos[T] / BT] * BT + pos[T] % BT;
        }
        q_start[i + 1] = T;
        seq_len[i] = len[q] + rows;
        memcpy(table + i * W, s->table[q], sizeof s->table[q]);
        lrows[i] = T - 1;
    }
    struct forward_batch fb = sampling ? *sampling : (struct forward_batch){0};
    fb.n_tokens = T, fb.tokens = tok, fb.positions = pos, fb.slots = slots, fb.n_seqs = n, fb.q_start = q_start;
    fb.seq_len = seq_len, fb.block_table = table, fb.max_blocks = W, fb.n_logits = n, fb.logit_rows = lrows;
    return model_forward(s->m, &s->cache, &fb, logits);
}

static enum status step(struct side *s, const int *act, int n, const int *len, const int32_t *tok, int rows,
                        float *logits)
{
    return step_with(s, act, n, len, tok, rows, logits, NULL);
}

static int argmax(const float *v, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

/* room: the sequences the workspace holds (N_SEQS: no step is padded; PAD_SEQS: steps of 3 are);
 * mismatch: every capture's logits read as off (SHARDLM_TEST_GRAPH_MISMATCH) */
static void run_model(struct backend *b, const char *dir, int none, int room, int mismatch)
{
    struct side g, e; /* graphs on, op by op */
    enum status st = side_open(&g, b, dir, "1", room, mismatch);
    if (st == STATUS_OK) st = side_open(&e, b, dir, "0", room, 0);
    if (st != STATUS_OK) {
        check(0, dir, status_message());
        return;
    }
    const int V = g.m->cfg.vocab_size;
    float *lg = malloc((size_t)N_SEQS * V * sizeof *lg), *le = malloc((size_t)N_SEQS * V * sizeof *le);
    CHECK(lg && le, "test: out of memory");
    const int prompt[N_SEQS] = {5, 17, 40};
    int len[N_SEQS] = {0};
    int32_t next[N_SEQS], tok[64];
    uint32_t rng = 12345;
    double worst = 0.0;
    int same = 1;
    for (int q = 0; q < N_SEQS && st == STATUS_OK; q++) { /* prefill: op by op on both sides */
        for (int i = 0; i < prompt[q]; i++) rng = rng * 1664525u + 1013904223u, tok[i] = (int32_t)(rng >> 8) % V;
        const int act[1] = {q};
        st = step(&g, act, 1, len, tok, prompt[q], lg);
        if (st == STATUS_OK) st = step(&e, act, 1, len, tok, prompt[q], le);
        len[q] = prompt[q];
        next[q] = argmax(le, V);
    }
    long before_growth = 0, want_padded = 0;
    for (int k = 0; k < N_STEPS + N_AFTER_GROWTH && st == STATUS_OK; k++) {
        int act[N_SEQS], n = 0;
        if (k == N_STEPS) { /* the workspace grows (model_reserve again): every graph goes */
            before_growth = model_graph_stats(g.m).captured;
            st = model_reserve(g.m, 96, room, W, room);
            if (st == STATUS_OK) st = model_reserve(e.m, 96, room, W, room);
            if (st != STATUS_OK) break;
        }
        if (k < 20 || (k >= 30 && k < 45) || k >= N_STEPS) act[n++] = 0, act[n++] = 1, act[n++] = 2;
        else if (k < 30) act[n++] = 0, act[n++] = 2;
        else act[n++] = 1;
        for (int i = 0; i < n; i++) tok[i] = next[act[i]];
        /* 3 -> 4; 1 and 2 are buckets; nothing once a mismatch turned graphs off (the first capture) */
        want_padded += !none && room > N_SEQS && n == 3 && !(mismatch && model_graph_stats(g.m).mismatched);
        st = step(&g, act, n, len, tok, 1, lg);
        if (st == STATUS_OK) st = step(&e, act, n, len, tok, 1, le);
        if (b->device == DEVICE_CPU) same = same && !memcmp(lg, le, (size_t)n * V * sizeof *lg);
        for (size_t i = 0; i < (size_t)n * V; i++) worst = fmax(worst, fabs((double)lg[i] - le[i]));
        for (int i = 0; i < n; i++) next[act[i]] = argmax(le + (size_t)i * V, V), len[act[i]]++;
    }
    char detail[256];
    const struct model_graph_stats gs = model_graph_stats(g.m), es = model_graph_stats(e.m);
    snprintf(detail, sizeof detail, "%s, room %d%s; max |diff| %.3g; captured %ld (verified %ld, mismatched %ld), "
             "replayed %ld, refused %ld, padded %ld", dir, room, mismatch ? ", mismatch planted" : "", worst,
             gs.captured, gs.verified, gs.mismatched, gs.replayed, gs.refused, gs.padded);
    check(st == STATUS_OK, "steps ran", st == STATUS_OK ? dir : status_message());
    if (b->device == DEVICE_CPU) check(same && worst == 0.0, "logits with graphs are the bits without", detail);
    else check(worst <= CUDA_TOL, "logits with graphs within CUDA_TOL of those without", detail);
    if (none) check(gs.on && gs.captured == 0 && gs.replayed == 0 && gs.refused == 0, "no graph for this model", detail);
    else if (mismatch)
        check(gs.captured == 1 && gs.mismatched == 1 && gs.verified == 0 && gs.replayed == 0,
              "a capture whose logits are off turns graphs off", detail);
    else {
        check(gs.verified == gs.captured && gs.mismatched == 0, "every capture verified against op by op", detail);
        check(gs.on && gs.captured >= 4 && gs.replayed >= 40 && gs.refused == 0, "graphs captured and replayed",
              detail);
        check(gs.captured > before_growth && before_growth > 0, "graphs captured again after the workspace grew",
              detail);
    }
    check(gs.padded == want_padded, "the steps of 3 padded to 4 where there is room, none else", detail);
    check(!es.on && es.captured == 0 && es.replayed == 0 && es.padded == 0, "SHARDLM_GRAPHS=0 takes none", "");
    free(lg), free(le);
    side_close(&g), side_close(&e);
}

/* ---- a step's copies and the device's share of sampling (engine/model/device_sampling.c) ------ */

#define TOPK 8

/* Row x's TOPK largest (descending, lower id first on ties) against the device's, bit for bit. */
static int top_matches(const float *x, int V, const float *val, const int32_t *ids)
{
    int prev = -1;
    for (int k = 0; k < TOPK; k++) {
        int best = -1;
        for (int j = 0; j < V; j++) {
            const int after = prev < 0 || x[j] < x[prev] || (x[j] == x[prev] && j > prev);
            if (after && (best < 0 || x[j] > x[best])) best = j;
        }
        if (best < 0 || ids[k] != best || val[k] != x[best]) return 0;
        prev = best;
    }
    return 1;
}

/* A model's decode steps of 3 sequences with the sampling on the device (greedy; the top
 * candidates with masses, draws and normalisers; with edits and a mask), each beside the same
 * step with its logits downloaded: the outputs against those logits, and the step's copies
 * counted: its inputs in one upload, the sampling's in one more, its outputs in one download (and
 * one more for the finiteness check before edits). */
static void run_copies(struct backend *b, const char *dir)
{
    struct side g, e; /* sampled on the device; logits downloaded */
    enum status st = side_open(&g, b, dir, "0", N_SEQS, 0);
    if (st == STATUS_OK) st = side_open(&e, b, dir, "0", N_SEQS, 0);
    if (st != STATUS_OK) return check(0, dir, status_message());
    const int V = g.m->cfg.vocab_size;
    float *le = malloc((size_t)N_SEQS * V * sizeof *le);
    CHECK(le, "test: out of memory");
    int len[N_SEQS] = {0}, act[N_SEQS] = {0, 1, 2}, ok_out = 1, ok_copies = 1;
    int32_t tok[64];
    char detail[256] = "";
    for (int q = 0; q < N_SEQS && st == STATUS_OK; q++) {
        for (int i = 0; i < 4; i++) tok[i] = (int32_t)((q * 7 + i * 13) % V);
        st = step(&g, act + q, 1, len, tok, 4, le);
        if (st == STATUS_OK) st = step(&e, act + q, 1, len, tok, 4, le);
        len[q] = 4;
    }
    for (int mode = 0; mode < 3 && st == STATUS_OK; mode++) {
        for (int i = 0; i < N_SEQS; i++) tok[i] = (int32_t)((mode * 5 + i * 11 + 1) % V);
        if ((st = step(&e, act, N_SEQS, len, tok, 1, le)) != STATUS_OK) break;
        int32_t greedy[N_SEQS], top_i[N_SEQS * TOPK], draw_ids[N_SEQS];
        float top_v[N_SEQS * TOPK], mass[N_SEQS], lse[N_SEQS], margin[N_SEQS];
        const float ones[N_SEQS] = {1, 1, 1}, temp[N_SEQS] = {0.8f, 1, 1.2f}, u[N_SEQS] = {0.1f, 0.5f, 0.9f};
        const float top_p[N_SEQS] = {1, 0.9f, 0.5f};
        /* mode 2: row 0's token 5 raised by 1000; row 2 keeps only tokens 3 and 9 */
        const int32_t edit_rows[1] = {0}, edit_ids[1] = {5 % V}, mask_rows[1] = {2};
        const float edit_vals[3] = {1000.0f, 1.0f, 0.0f};
        const int words = (V + 31) / 32;
        uint32_t *mask = calloc((size_t)words, sizeof *mask);
        CHECK(mask, "test: out of memory");
        mask[0] = (1u << 3) | (1u << 9);
        int done = 0;
        struct forward_batch sp = {.greedy_done = &done};
        if (mode == 0) sp.greedy_ids = greedy;
        else {
            sp.top_k = TOPK, sp.top_values = top_v, sp.top_ids = top_i;
            sp.top_inv_temp = ones, sp.top_mass = mass, sp.lse_want = ones, sp.top_lse = lse;
            sp.draw_temp = temp, sp.draw_u = u, sp.draw_top_p = top_p, sp.draw_ids = draw_ids, sp.draw_margin = margin;
        }
        if (mode == 2) {
            sp.n_edits = 1, sp.edit_rows = edit_rows, sp.edit_ids = edit_ids, sp.edit_vals = edit_vals;
            sp.n_masks = 1, sp.mask_words = words, sp.mask_rows = mask_rows, sp.masks = mask;
        }
        const long up0 = b->n_uploads, down0 = b->n_downloads;
        st = step_with(&g, act, N_SEQS, len, tok, 1, NULL, &sp);
        const long ups = b->n_uploads - up0, downs = b->n_downloads - down0;
        const long want_ups = mode == 0 ? 1 : 2, want_downs = mode == 2 ? 2 : 1;
        if (ups != want_ups || downs != want_downs) {
            ok_copies = 0;
            snprintf(detail, sizeof detail, "mode %d: %ld uploads, %ld downloads (want %ld, %ld)", mode, ups, downs,
                     want_ups, want_downs);
        }
        for (int i = 0; i < N_SEQS && st == STATUS_OK; i++) {
            float *x = le + (size_t)i * V;
            if (mode == 2 && i == 0) x[5 % V] += 1000.0f;
            if (mode == 2 && i == 2)
                for (int j = 0; j < V; j++) x[j] = j == 3 || j == 9 ? x[j] : -INFINITY;
            int good = done == 1;
            if (mode == 0) good = good && greedy[i] == argmax(x, V);
            else {
                double m = x[argmax(x, V)], sum = 0.0, within = 0.0;
                for (int j = 0; j < V; j++) {
                    const double w = exp((double)x[j] - m);
                    sum += w;
                    if ((double)x[j] - m >= log(1e-12)) within += w;
                }
                good = good && top_matches(x, V, top_v + i * TOPK, top_i + i * TOPK);
                good = good && fabs(mass[i] - within) <= 1e-5 * within && fabs(lse[i] - log(sum)) <= 1e-5 * (1 + log(sum));
                good = good && draw_ids[i] >= -1 && draw_ids[i] < V && (draw_ids[i] < 0 || x[draw_ids[i]] > -INFINITY);
            }
            if (!good) {
                ok_out = 0;
                snprintf(detail, sizeof detail, "mode %d row %d: the device's outputs differ from the logits'", mode, i);
            }
        }
        free(mask);
        for (int i = 0; i < N_SEQS; i++) len[i]++;
    }
    char what[256];
    snprintf(what, sizeof what, "%s: sampled on the device, the logits' argmax, top %d, masses, normalisers", dir, TOPK);
    check(st == STATUS_OK && ok_out, what, st == STATUS_OK ? detail : status_message());
    snprintf(what, sizeof what, "%s: a sampled step's copies: inputs one upload, sampling one more, outputs one download",
             dir);
    check(st == STATUS_OK && ok_copies, what, detail);
    free(le);
    side_close(&g), side_close(&e);
}

/* SHARDLM_GRAPHS other than 0 or 1 is refused by name. */
static void check_env_refused(struct backend *b, const char *dir)
{
    struct model *m = NULL;
    if (model_load(dir, b, NULL, &m) != STATUS_OK) return check(0, dir, status_message());
    setenv("SHARDLM_GRAPHS", "yes", 1);
    const enum status st = model_reserve(m, 8, 1, W, 1);
    unsetenv("SHARDLM_GRAPHS");
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "SHARDLM_GRAPHS=yes"), "SHARDLM_GRAPHS=yes refused",
          status_message());
    model_free(m);
}

/* test_model step-graph ARGS (tests/test_model.c: one executable, one binary less to carry to a
 * GPU); argv[0] is "step-graph". */
int step_graph_main(int argc, char **argv);
int step_graph_main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "mirror")) return run_mirror();
    int i = 1, none = 0, mismatch_run = 0;
    enum device dev = DEVICE_CPU;
    if (i + 1 < argc && !strcmp(argv[i], "--device")) {
        if (backend_parse_device(argv[i + 1], &dev) != STATUS_OK) return fprintf(stderr, "%s\n", status_message()), 2;
        i += 2;
    }
    struct backend *b = NULL;
    if (backend_open(dev, 0, 0, &b) != STATUS_OK) {
        printf("SKIP: %s\n", status_message());
        return 77;
    }
    if (i < argc) check_env_refused(b, argv[i]);
    for (; i < argc; i++) {
        if (!strcmp(argv[i], "--none")) none = 1;
        else {
            run_model(b, argv[i], none, N_SEQS, 0);
            const int invariant = b->batch_invariant;
            b->batch_invariant = 1;
            run_model(b, argv[i], none, PAD_SEQS, 0);
            b->batch_invariant = invariant;
            if (!none && !mismatch_run++) run_model(b, argv[i], 0, PAD_SEQS, 1); /* the first model */
            if (!none) run_copies(b, argv[i]);
            none = 0;
        }
    }
    backend_close(b);
    return finish();
}
