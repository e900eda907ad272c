/* tests/bench_train_parallel.c - activation memory, step time and communication time of the
 * parallel training passes, per rank, next to the formulas of docs/training.md. Run under
 * mpirun (tools/bench_train_parallel.sh runs the whole table):
 *   mpirun -n TP*PP bench_train_parallel --tp T --pp P [--sp] [--recompute none|selective|full]
 *       [--modules core_attn,mlp,layernorm] [--micro-batches M] [--seq N] [--layers L] [--steps S]
 *       [--pp-layers N,N]
 * The model: random weights of the stories110M shape (d 768, 12 heads, ffn 2048, vocab 32000),
 * written once to /tmp by rank 0. Each rank: weights and gradients allocated first; then VmHWM
 * is reset (clear_refs) and the training activations reserved and S steps of M micro-batches
 * of one N-token document run (1F1B when pp > 1, the trainer's own schedule); the growth of the
 * peak RSS over the RSS before the reserve is the measured activation memory (the buffers the
 * passes keep and their scratch, as touched; the MPI library's own buffers are in it too). Printed per rank with the formula's figure and
 * their ratio, the best step time, and the seconds spent in the tp and pp groups' calls (for pp
 * these include waiting for the neighbour stage: the pipeline bubble is read from them).
 * A benchmark, never a pass/fail gate: exits 0 whatever the numbers are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_model.h"
#include "model_train.h"
#include "train_parallel.h"

/* The formula of docs/training.md: bytes kept per layer for T tokens, and the scratch shared by
 * every layer (independent of the layer count). e: bytes per element; t: tp; sp: sequence
 * parallelism; rows of the residual stream T / t under it. */
struct shape { double d, hq, hkv, f, a, e; };

static double formula_layer(const struct shape *s, double T, int t, int sp, int recompute, unsigned mods)
{
    const double Tl = sp ? T / t : T;
    if (recompute == TRAIN_RECOMPUTE_UNIFORM) return s->e * Tl * s->d; /* the layer's input only */
    double resid = 4 * s->d;                    /* x_in, xn1, x_mid, xn2 */
    double par = 2 * s->hq + 2 * s->hkv + 3 * s->f; /* q, k, v, att; gate, up, act (per tp shard) */
    double lse = 4.0 * T * s->a / t;            /* f32 log-sum-exp per head */
    if (recompute == TRAIN_RECOMPUTE_SELECTIVE) {
        if (mods & TRAIN_RECOMPUTE_CORE_ATTN) lse = 0;
        if (mods & TRAIN_RECOMPUTE_MLP) par -= 3 * s->f;
        if (mods & TRAIN_RECOMPUTE_LAYERNORM) resid -= 2 * s->d;
    }
    return s->e * (Tl * resid + T * par / t) + lse;
}

/* The scratch: what a recomputed module needs once (its buffers), the backward's gradients of
 * one layer, sequence parallelism's full-row buffers, the stage boundary, and the loss. */
static double formula_common(const struct shape *s, double T, int t, int sp, int recompute, unsigned mods,
                             int last_stage, double vocab_local)
{
    const double Tl = sp ? T / t : T;
    double shared = 0;
    if (recompute == TRAIN_RECOMPUTE_UNIFORM) /* one layer's buffers but the input, kept per layer */
        shared = formula_layer(s, T, t, sp, TRAIN_RECOMPUTE_NONE, 0) - formula_layer(s, T, t, sp, recompute, 0);
    if (recompute == TRAIN_RECOMPUTE_SELECTIVE)
        shared = formula_layer(s, T, t, sp, TRAIN_RECOMPUTE_NONE, 0) - formula_layer(s, T, t, sp, recompute, mods);
    const double grads = s->e * (2 * Tl * s->d + T * s->d + T * (2 * s->hq + 2 * s->hkv + 2 * s->f) / t);
    const double spbuf = sp ? s->e * 2 * T * s->d : 0;
    const double ends = s->e * Tl * s->d * (last_stage ? 2 : 1) + 4.0 * T * (last_stage ? 3 : 0) + 4.0 * T * 3 * t +
                        4.0 * T * 6;
    /* The fused cross-entropy's scratch (kernels/cpu/cross_entropy.c): a chunk of logits, at most
     * 2^22 floats, and two running sums per row in f64. */
    double chunk = (double)(1 << 22) / T;
    chunk = chunk < 256 ? 256 : chunk > 8192 ? 8192 : chunk;
    if (chunk > vocab_local) chunk = vocab_local;
    const double ce = last_stage ? 4.0 * T * chunk + 16.0 * T : 0;
    return shared + grads + spbuf + ends + ce;
}

int main(int argc, char **argv)
{
    struct train_options o = {.tp = 1, .pp = 1, .device = DEVICE_CPU, .threads = 1};
    int seq = 1024, layers = 12, steps = 2, micro = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "";
        if (!strcmp(a, "--sp")) { o.memory.sequence_parallel = 1; continue; }
        i++;
        if (!strcmp(a, "--tp")) o.tp = atoi(v);
        else if (!strcmp(a, "--pp")) o.pp = atoi(v);
        else if (!strcmp(a, "--seq")) seq = atoi(v);
        else if (!strcmp(a, "--layers")) layers = atoi(v);
        else if (!strcmp(a, "--steps")) steps = atoi(v);
        else if (!strcmp(a, "--micro-batches")) micro = atoi(v);
        else if (!strcmp(a, "--threads")) o.threads = atoi(v);
        else if (!strcmp(a, "--pp-layers")) o.pp_layers = v;
        else if (!strcmp(a, "--recompute")) {
            o.memory.recompute = !strcmp(v, "selective") ? TRAIN_RECOMPUTE_SELECTIVE
                               : !strcmp(v, "full")      ? TRAIN_RECOMPUTE_UNIFORM
                                                         : TRAIN_RECOMPUTE_NONE;
            o.memory.num_layers = 1;
        } else if (!strcmp(a, "--modules")) {
            o.memory.modules = (strstr(v, "core_attn") ? TRAIN_RECOMPUTE_CORE_ATTN : 0) |
                               (strstr(v, "mlp") ? TRAIN_RECOMPUTE_MLP : 0) |
                               (strstr(v, "layernorm") ? TRAIN_RECOMPUTE_LAYERNORM : 0);
        } else {
            fprintf(stderr, "bench_train_parallel: unknown flag %s\n", a);
            return 2;
        }
    }
    if (o.memory.recompute == TRAIN_RECOMPUTE_SELECTIVE && !o.memory.modules) o.memory.modules = TRAIN_RECOMPUTE_CORE_ATTN;
    const int d = 768, heads = 12, ffn = 2048, vocab = 32000;
    struct train_ranks r;
    enum status st = train_ranks_init(&r, &o, micro);
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/shardlm_bench_tp_%d_%d", layers, d);
    struct stat sb;
    if (st == STATUS_OK && r.world->rank == 0 && stat(dir, &sb) != 0) st = write_model(dir, d, layers, heads, ffn, vocab, 2048);
    if (st == STATUS_OK) st = parallel_agree(r.world, st);
    struct backend *b = NULL;
    struct model *m = NULL;
    struct model_weights g;
    void *gmem = NULL;
    struct param_table gt = {0};
    if (st == STATUS_OK) st = train_ranks_connect(&r, DEVICE_CPU, o.threads, &b);
    if (st == STATUS_OK) st = model_load_as(dir, b, &r.par, DTYPE_F32, &m);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    if (st == STATUS_OK) st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &gmem);
    if (st == STATUS_OK) st = param_table_from_weights(&gt, &g, m->layer_first);
    struct optimizer opt = {0};
    struct train_memory mem = o.memory;
    struct model_train *mt = NULL;
    if (st == STATUS_OK) {
        mem.sets = r.pp - m->pp_rank < micro ? r.pp - m->pp_rank : micro;
        weights_zero(b, &g);
    }
    const long rss0 = vm_rss_kib();
    vm_hwm_reset();
    if (st == STATUS_OK) st = model_train_new(m, seq, &mem, &mt);
    /* train_ranks_attach's own buffers (a tied head's exchange buffer) are not activations. */
    const long rss_attach0 = vm_rss_kib();
    if (st == STATUS_OK) st = train_ranks_attach(&r, mt, &gt, &opt);
    const long attach_kib = vm_rss_kib() - rss_attach0;
    st = r.world ? parallel_agree(r.world, st) : st;
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_train_parallel: %s\n", status_message());
        return 1;
    }
    /* M micro-batches of one seq-token document each. */
    int32_t *tok = malloc((size_t)seq * 4), *tgt = malloc((size_t)seq * 4), *pos = malloc((size_t)seq * 4);
    int32_t docs[2] = {0, seq};
    for (int i = 0; i < seq; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % vocab);
        tgt[i] = i + 1 < seq ? (int32_t)(((i + 1) * 7919 + 13) % vocab) : -1;
        pos[i] = i;
    }
    struct train_batch *tbs = calloc((size_t)micro, sizeof *tbs);
    for (int i = 0; i < micro; i++)
        tbs[i] = (struct train_batch){.n_tokens = seq, .tokens = tok, .targets = tgt, .positions = pos, .n_docs = 1,
                                      .doc_start = docs, .grad_scale = 1.0f / (float)((seq - 1) * micro)};
    double best = 1e30, best_tp = 0, best_pp = 0, loss = 0;
    for (int s = 0; s <= steps && st == STATUS_OK; s++) { /* step 0 warms up */
        r.groups.tp->seconds = r.groups.pp->seconds = 0;
        parallel_barrier(r.world);
        const double t0 = base_now_s();
        st = train_ranks_step(&r, mt, tbs, micro, &g, &loss);
        const double t = base_now_s() - t0;
        if (s > 0 && t < best) {
            best = t;
            best_tp = r.groups.tp->seconds;
            best_pp = r.groups.pp->seconds;
        }
    }
    const long peak = vm_hwm_kib();
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_train_parallel: rank %d: %s\n", r.world->rank, status_message());
        return 1;
    }
    const struct shape sh = {d, d, d, ffn, heads, 4};
    const int sp = o.memory.sequence_parallel && r.tp > 1;
    const double layer_f = formula_layer(&sh, seq, r.tp, sp, mem.recompute, mem.modules);
    const double common_f = formula_common(&sh, seq, r.tp, sp, mem.recompute, mem.modules, model_is_last_stage(m), m->vocab_local);
    const double want = mem.sets * (m->n_layers_local * layer_f) + common_f;
    const double measured = (double)(peak - rss0 - attach_kib) * 1024.0, alloc = (double)model_train_activation_bytes(mt);
    printf("rank %d (tp %d/%d, pp %d/%d, %d layers, %d sets): activations measured %.1f MiB, allocated %.1f MiB, "
           "formula %.1f MiB (%.1f per layer + %.1f shared): measured/formula %.3f | step %.3f s, tp calls %.3f s, "
           "pp calls %.3f s\n",
           r.world->rank, m->tp_rank, r.tp, m->pp_rank, r.pp, m->n_layers_local, mem.sets, measured / 1048576.0,
           alloc / 1048576.0, want / 1048576.0, layer_f / 1048576.0, common_f / 1048576.0, measured / want, best, best_tp,
           best_pp);
    fflush(stdout);
    free(tok);
    free(tgt);
    free(pos);
    free(tbs);
    param_table_free(&gt);
    weights_free_layers(&g);
    backend_free(b, gmem);
    model_train_free(mt);
    model_free(m);
    train_ranks_free(&r);
    backend_close(b);
    return 0;
}
