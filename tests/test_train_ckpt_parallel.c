/* tests/test_train_ckpt_parallel.c - training checkpoints across ranks (train_checkpoint.h), under
 * `mpirun -n 4 test_train_ckpt_parallel MODEL_DIR [OTHER_MODEL_DIR]`:
 *   1. rank 0 alone saves a one-rank checkpoint of MODEL_DIR (the reference files);
 *   2. at tp 2 x pp 2, tp 2 (dp 2), pp 2 (dp 2) and tp 4, every rank loads its shard, fills its
 *      AdamW moments with values that name the canonical element (kind, layer, index) (replicas
 *      of dp rank > 0 with other values, which must not be read), and saves collectively; the
 *      model file must hold the source checkpoint's tensors exactly, and both files must equal
 *      the one-rank save's byte for byte;
 *   3. the tp 2 x pp 2 checkpoint is resumed at tp 1 (dp 4), tp 2 (dp 2), tp 4, pp 2 (dp 2)
 *      and tp 2 x pp 2: every moment element (vocab padding zero), the f32 masters when the
 *      model file is not f32, and the iteration counters must come back;
 *   4. with OTHER_MODEL_DIR: resuming MODEL_DIR's state into that model is refused by name.
 * Prints PASS/FAIL lines on rank 0; exits 77 (SKIP) when MODEL_DIR is missing or the world is
 * not 4 ranks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "model.h"
#include "model_train.h"
#include "optimizer.h"
#include "params.h"
#include "train_checkpoint.h"

static struct parallel_world *g_world;
static struct backend *g_b;
static int n_fail;

/* Rank 0 prints a verdict agreed on by every rank (ok on each). */
static void verdict(const char *name, int ok)
{
    enum status s = parallel_agree(g_world, ok ? STATUS_OK : status_errorf(STATUS_INTERNAL, "failed here"));
    if (s != STATUS_OK) n_fail++;
    if (g_world->rank == 0) printf("%s %s%s%s\n", s == STATUS_OK ? "PASS" : "FAIL", name, s ? ": " : "",
                                   s ? status_message() : "");
}

/* One rank's shard at a layout, with a parameter table and an optimizer over it. */
struct shard {
    struct parallel_groups groups;
    struct model_parallel par;
    struct model *m;
    struct param_table params;
    struct optimizer opt;
    int grouped;
};

static void shard_close(struct shard *s)
{
    optimizer_free(&s->opt, g_b);
    param_table_free(&s->params);
    model_free(s->m);
    if (s->grouped) parallel_groups_free(&s->groups);
    memset(s, 0, sizeof *s);
}

/* tp = 0: a world of one (no groups: train_checkpoint's one-rank path). */
static enum status shard_open(struct shard *s, const char *dir, int tp, int pp)
{
    memset(s, 0, sizeof *s);
    enum status st = STATUS_OK;
    if (tp > 0) {
        if ((st = parallel_layout(g_world, tp, pp, &s->par.layout)) == STATUS_OK &&
            (st = parallel_groups_init(g_world, &s->par.layout, DEVICE_CPU, 0, NULL, &s->groups)) == STATUS_OK)
            s->grouped = 1;
        s->par.world = g_world;
        s->par.groups = &s->groups;
    }
    if (st == STATUS_OK) st = model_load_as(dir, g_b, tp > 0 ? &s->par : NULL, DTYPE_F32, &s->m);
    if (st == STATUS_OK) st = model_weights_make_writable(s->m);
    if (st == STATUS_OK) st = param_table_from_weights(&s->params, &s->m->w, s->m->layer_first);
    const struct optimizer_options o = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
    if (st == STATUS_OK) st = optimizer_init(&s->opt, g_b, &s->params, &o);
    return tp > 0 ? parallel_agree(g_world, st) : st;
}

/* The value of canonical element idx of (kind, layer) in moment `which` (0: exp_avg, 1:
 * exp_avg_sq): exact in f32, different for every element of a tensor and for neighbouring
 * tensors. */
static float expected(enum weight_kind kind, int layer, int64_t idx, int which)
{
    const int64_t code = (((int64_t)kind * 64 + layer + 1) % 128) * 65536 + idx % 65536;
    return (float)code + (which ? 0.5f : 0.0f);
}

/* Parses "kind/layer" (params.h). */
static int param_kind(const char *name, enum weight_kind *kind, int *layer)
{
    const char *slash = strrchr(name, '/');
    for (int k = 0; slash && k < WEIGHT_KIND_COUNT; k++) {
        const char *kn = weight_kind_name((enum weight_kind)k);
        if (strlen(kn) == (size_t)(slash - name) && !strncmp(kn, name, strlen(kn))) {
            *kind = (enum weight_kind)k;
            *layer = atoi(slash + 1);
            return 1;
        }
    }
    return 0;
}

/* The geometry of parameter row i: its (kind, layer), its slice hw of the canonical tensor, and
 * the canonical tensor's cols. 0 when the row is not a weight. */
static int row_geometry(struct shard *s, size_t i, enum weight_kind *kind, int *layer, struct host_weight *hw,
                        int64_t *cols)
{
    int ndim;
    int64_t rows;
    if (!param_kind(s->params.p[i].name, kind, layer)) return 0;
    weight_kind_shape(&s->m->cfg, *kind, &ndim, &rows, cols);
    return checkpoint_describe(s->m->checkpoint, *kind, *layer, s->m->tp_rank, s->m->tp_size, DTYPE_F32, hw) ==
           STATUS_OK;
}

/* The canonical index of local element j of slice hw; -1 for vocab padding. */
static int64_t canon_index(const struct host_weight *hw, int64_t cols, int64_t j)
{
    const int64_t sc = hw->ndim == 2 ? hw->shape[1] : 1, r = j / sc, c = j % sc;
    return r < hw->rows_valid ? (hw->row_start + r) * cols + hw->col_start + c : -1;
}

/* Fills the moments with expected(); replicas past dp rank 0 get other values. */
static int fill_moments(struct shard *s)
{
    const float other = s->m->par.layout.dp_rank > 0 ? 1e6f : 0.0f;
    for (size_t i = 0; i < s->params.n; i++) {
        enum weight_kind kind;
        int layer;
        struct host_weight hw;
        int64_t cols;
        if (!row_geometry(s, i, &kind, &layer, &hw, &cols)) return 0;
        const int64_t n = tensor_numel(&s->opt.m[i]);
        float *buf = malloc((size_t)n * sizeof *buf);
        for (int which = 0; which < 2; which++) {
            for (int64_t j = 0; j < n; j++) {
                const int64_t idx = canon_index(&hw, cols, j);
                buf[j] = idx < 0 ? other : expected(kind, layer, idx, which) + other;
            }
            backend_upload(g_b, (which ? &s->opt.v[i] : &s->opt.m[i])->data, buf, (size_t)n * sizeof *buf);
        }
        free(buf);
    }
    s->opt.step = 7;
    return 1;
}

static const struct train_state saved_state = {
    .iteration = 7, .consumed_tokens = 1234, .cursor = {.epoch = 1, .index = 42, .seed = 99},
    .scaler = {.scale = 1.0},
};

/* Whether the moments (and the masters, when with_master) are what fill_moments wrote at the
 * saving layout, sliced for this shard; prints the first difference. */
static int check_moments(struct shard *s, struct checkpoint *src, int with_master)
{
    int ok = 1;
    for (size_t i = 0; i < s->params.n && ok; i++) {
        enum weight_kind kind;
        int layer;
        struct host_weight hw;
        int64_t cols;
        if (!row_geometry(s, i, &kind, &layer, &hw, &cols)) return 0;
        const int64_t n = tensor_numel(&s->opt.m[i]);
        float *buf = malloc((size_t)n * sizeof *buf), *want = malloc((size_t)n * sizeof *want);
        for (int which = 0; which < 2 && ok; which++) {
            backend_download(g_b, buf, (which ? &s->opt.v[i] : &s->opt.m[i])->data, (size_t)n * sizeof *buf);
            for (int64_t j = 0; j < n && ok; j++) {
                const int64_t idx = canon_index(&hw, cols, j);
                const float w = idx < 0 ? 0.0f : expected(kind, layer, idx, which);
                if (buf[j] != w) {
                    printf("# rank %d: %s %s[%lld] = %g, want %g\n", g_world->rank, which ? "exp_avg_sq" : "exp_avg",
                           s->params.p[i].name, (long long)j, buf[j], w);
                    ok = 0;
                }
            }
        }
        if (ok && with_master) {
            backend_download(g_b, buf, s->params.p[i].t->data, (size_t)n * sizeof *buf);
            if (checkpoint_get(src, kind, layer, s->m->tp_rank, s->m->tp_size, DTYPE_F32, want,
                               (size_t)n * sizeof *want, 0, &hw) != STATUS_OK ||
                memcmp(buf, want, (size_t)n * sizeof *buf)) {
                printf("# rank %d: master %s differs from the source\n", g_world->rank, s->params.p[i].name);
                ok = 0;
            }
        }
        free(buf);
        free(want);
    }
    return ok;
}

/* Every tensor of the checkpoint in dir equals the source's, as f32 (rank 0). */
static int same_tensors(const char *dir, struct checkpoint *src)
{
    struct checkpoint *ck = NULL;
    if (checkpoint_open(dir, &ck) != STATUS_OK) {
        printf("# %s: %s\n", dir, status_message());
        return 0;
    }
    int ok = 1, n = 0;
    const struct model_config *c = &src->cfg;
    for (int k = 0; k < WEIGHT_KIND_COUNT && ok; k++) {
        const enum weight_kind kind = (enum weight_kind)k;
        if (!weight_kind_exists(c, kind) || (kind == WEIGHT_KIND_LM_HEAD && c->tied_embeddings)) continue;
        for (int l = 0; l < (weight_kind_per_layer(kind) ? c->n_layers : 1) && ok; l++) {
            struct host_weight a, b;
            ok = checkpoint_describe(src, kind, l, 0, 1, DTYPE_F32, &a) == STATUS_OK;
            float *x = ok ? malloc(a.nbytes) : NULL, *y = ok ? malloc(a.nbytes) : NULL;
            ok = ok && checkpoint_get(src, kind, l, 0, 1, DTYPE_F32, x, a.nbytes, 0, &a) == STATUS_OK &&
                 checkpoint_get(ck, kind, l, 0, 1, DTYPE_F32, y, a.nbytes, 0, &b) == STATUS_OK &&
                 b.nbytes == a.nbytes && !memcmp(x, y, a.nbytes);
            if (!ok) printf("# %s: %s (layer %d) differs from the source\n", dir, weight_kind_name(kind), l);
            free(x);
            free(y);
            n++;
        }
    }
    checkpoint_close(ck);
    return ok && n > 0;
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int ok = fa && fb, ca, cb;
    while (ok && (ca = getc(fa)) == (cb = getc(fb)) && ca != EOF) {}
    ok = ok && ca == cb;
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    if (!ok) printf("# %s and %s differ\n", a, b);
    return ok;
}

static const struct {
    const char *name;
    int tp, pp;
} saves[] = {{"tp2_pp2", 2, 2}, {"tp2_dp2", 2, 1}, {"pp2_dp2", 1, 2}, {"tp4", 4, 1}},
  resumes[] = {{"tp1_dp4", 1, 1}, {"tp2_dp2", 2, 1}, {"tp4", 4, 1}, {"pp2_dp2", 1, 2}, {"tp2_pp2", 2, 2}};

static void run(const char *model_dir, const char *other_dir, const char *work)
{
    char dir[4200], ref[4200], a[4400], b[4400], name[256];
    struct checkpoint *src = NULL;
    if (checkpoint_open(model_dir, &src) != STATUS_OK) {
        verdict("open the source checkpoint", 0);
        return;
    }
    const int with_master = src->cfg.dtype != DTYPE_F32;
    struct shard s;
    int ok = 1;
    /* 1. The one-rank reference. */
    snprintf(ref, sizeof ref, "%s/ref", work);
    if (g_world->rank == 0) {
        ok = shard_open(&s, model_dir, 0, 0) == STATUS_OK && fill_moments(&s) &&
             train_checkpoint_save(ref, s.m, &s.m->w, &s.params, &s.opt, &saved_state) == STATUS_OK;
        if (!ok) printf("# one-rank save: %s\n", status_message());
        shard_close(&s);
    }
    verdict("one-rank save (the reference)", ok);
    /* 2. Collective saves. */
    for (size_t i = 0; i < sizeof saves / sizeof saves[0]; i++) {
        snprintf(dir, sizeof dir, "%s/%s", work, saves[i].name);
        enum status st = shard_open(&s, model_dir, saves[i].tp, saves[i].pp);
        ok = st == STATUS_OK && fill_moments(&s);
        snprintf(name, sizeof name, "load and fill at %s", saves[i].name);
        verdict(name, ok);
        if (st == STATUS_OK) st = train_checkpoint_save(dir, s.m, &s.m->w, &s.params, &s.opt, &saved_state);
        snprintf(name, sizeof name, "save at %s (every rank the same status)", saves[i].name);
        verdict(name, st == STATUS_OK);
        shard_close(&s);
        ok = 1;
        if (g_world->rank == 0) {
            ok = same_tensors(dir, src);
            for (int f = 0; f < 2 && ok; f++) {
                const char *file = f ? "train_state.safetensors" : "model.safetensors";
                snprintf(a, sizeof a, "%s/%s", dir, file);
                snprintf(b, sizeof b, "%s/%s", ref, file);
                ok = same_file(a, b);
            }
        }
        snprintf(name, sizeof name, "saved at %s: the source's tensors, the one-rank files byte for byte",
                 saves[i].name);
        verdict(name, ok);
    }
    /* 3. Resumes of the tp 2 x pp 2 save. */
    snprintf(dir, sizeof dir, "%s/%s", work, saves[0].name);
    for (size_t i = 0; i < sizeof resumes / sizeof resumes[0]; i++) {
        struct train_state st = {0};
        enum status e = shard_open(&s, dir, resumes[i].tp, resumes[i].pp);
        if (e == STATUS_OK && with_master) /* the masters must come from the state file */
            for (size_t r = 0; r < s.params.n; r++) {
                const size_t nb = tensor_nbytes(s.params.p[r].t);
                void *zero = calloc(1, nb);
                backend_upload(g_b, s.params.p[r].t->data, zero, nb);
                free(zero);
            }
        if (e == STATUS_OK) e = train_checkpoint_load_state(dir, s.m, &s.params, &s.opt, &st);
        if (e != STATUS_OK) printf("# rank %d: %s\n", g_world->rank, status_message());
        ok = e == STATUS_OK && check_moments(&s, src, with_master) && st.iteration == 7 &&
             st.consumed_tokens == 1234 && st.cursor.epoch == 1 && st.cursor.index == 42 && st.cursor.seed == 99 &&
             s.opt.step == 7;
        snprintf(name, sizeof name, "saved at tp2_pp2, resumed at %s: every moment%s and counter", resumes[i].name,
                 with_master ? ", master" : "");
        verdict(name, ok);
        shard_close(&s);
    }
    /* 4. Another model's state. */
    if (other_dir) {
        ok = 1;
        if (g_world->rank == 0) {
            struct train_state st = {0};
            enum status e = shard_open(&s, other_dir, 0, 0);
            if (e == STATUS_OK) e = train_checkpoint_load_state(dir, s.m, &s.params, &s.opt, &st);
            ok = e == STATUS_BAD_FORMAT && strstr(status_message(), "state tensor") &&
                 strstr(status_message(), "another model");
            printf("# %s\n", status_message());
            shard_close(&s);
        }
        verdict("another model's state is refused, naming the tensor", ok);
    }
    checkpoint_close(src);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (parallel_init(&argc, &argv, &g_world) != STATUS_OK) {
        printf("FAIL parallel_init: %s\n", status_message());
        return 1;
    }
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/config.json", argc > 1 ? argv[1] : "");
    if (argc < 2 || g_world->size != 4 || access(probe, R_OK) != 0) {
        if (g_world->rank == 0)
            printf("SKIP: usage: mpirun -n 4 %s MODEL_DIR [OTHER_MODEL_DIR] (%d ranks; %s)\n", argv[0], g_world->size,
                   probe);
        parallel_finalize(g_world);
        return 77;
    }
    char work[4200] = "";
    if (g_world->rank == 0) {
        snprintf(work, sizeof work, "/tmp/shardlm_ckpt_XXXXXX");
        if (!mkdtemp(work)) work[0] = 0;
    }
    parallel_bcast_bytes(g_world, work, sizeof work, 0);
    if (backend_open(DEVICE_CPU, 0, 1, &g_b) != STATUS_OK || !work[0]) {
        printf("FAIL setup: %s\n", status_message());
        parallel_finalize(g_world);
        return 1;
    }
    run(argv[1], argc > 2 ? argv[2] : NULL, work);
    parallel_barrier(g_world);
    if (g_world->rank == 0) {
        char cmd[4300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", work);
        if (system(cmd) != 0) printf("# could not remove %s\n", work);
        printf("%s\n", n_fail ? "FAIL" : "PASS");
    }
    backend_close(g_b);
    parallel_finalize(g_world);
    return n_fail ? 1 : 0;
}
