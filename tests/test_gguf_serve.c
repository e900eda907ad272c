/* tests/test_gguf_serve.c - a GGUF file served as it is (engine/formats/checkpoint_gguf.c, the
 * block dtypes of kernels/tensor.h, model_load keeping blocks) on tiny_gemma3.gguf, a one-layer
 * Gemma 3 with Q8_0 matrices written by gguf-py (tests/gguf_setup.py):
 *   - checkpoint_open takes the file: config from the metadata, tokenizer proto, every weight
 *     located; matrices described in their block dtype are zero-copy whole rows, in f32 they
 *     dequantize bit-exactly; a block dtype the weight is not stored in is refused;
 *   - tensor parallelism: the row slices of Q at tp 2 are zero-copy blocks; the column slice of
 *     the attention output at tp 2 (48 of 96 columns) would cut its 32-element blocks and is
 *     STATUS_UNSUPPORTED naming the weight, while the same slice in f32 is served; the HF
 *     writer from the GGUF keeps its blocks;
 *   - the model loaded natively (blocks, zero-copy) against the same file loaded with every
 *     weight dequantized to f32 (model_load_as): logits of a prompt within a tolerance derived
 *     from the int8 activation rounding, the same argmax;
 *   - bf16 and f16 conversions of the file (convert gguf --dtype bf16|f16) served on the CPU:
 *     where the CPU multiplies them in place their matrices stay so (under 0.6x the bytes of
 *     f32), the logits within a half-precision tolerance of the f32 conversion's, and bf16's
 *     prefill on AMX tiles or vdpbf16ps within a bf16 tolerance of the f32 products; SKIP where
 *     they are widened at load.
 * With --cuda (label gpu): the same file served on the CUDA backend, blocks kept and uploaded
 * as they are (bf16 activations, the blocks dequantized inside the kernels), against the CPU
 * backend's model with every weight dequantized to f32: logits within test_model cuda's bf16
 * criterion (0.05 (1 + max |logit|)), the same argmax where the f32 top-2 margin exceeds it;
 * and LoRA adapters refused on that model (STATUS_UNSUPPORTED naming merge-lora). Never run on
 * a GPU yet.
 * The real Gemma 3 270M file is checked by test_model gemma-gguf (golden).
 * Usage: test_gguf_serve FIXTURE_DIR [--cuda]; exits 77 (skip) without tiny_gemma3.gguf, or with
 * --cuda and no usable GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adapters.h"
#include "check.h"
#include "checkpoint.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "kv_cache.h"
#include "model.h"
#include "quant.h"

static void test_checkpoint(const char *path)
{
    struct checkpoint *ck = NULL;
    enum status s = checkpoint_open(path, &ck);
    check_status(s, STATUS_OK, "checkpoint_open(tiny_gemma3.gguf)", NULL);
    if (s) return;
    const struct model_config *c = &ck->cfg;
    check(ck->layout == CHECKPOINT_LAYOUT_GGUF && c->family == MODEL_FAMILY_GEMMA3 && c->d_model == 64 &&
              c->n_heads == 2 && c->n_kv_heads == 1 && c->head_dim == 48 && c->norm_weight_offset == 0.0f &&
              c->tied_embeddings && ck->tokenizer_proto && ck->tokenizer_proto_n > 0,
          "config from the metadata (gguf_model_config), tied head, norms without offset, tokenizer proto");

    struct host_weight hq, hf;
    s = checkpoint_describe(ck, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_Q8_0, &hq);
    check(s == STATUS_OK && hq.zero_copy && hq.stored_dtype == DTYPE_Q8_0 && hq.shape[0] == 96 &&
              hq.shape[1] == 64 && hq.nbytes == 96 * quant_row_bytes(QUANT_TYPE_Q8_0, 64),
          "Q as Q8_0 blocks: zero-copy, real byte size");
    float *deq = malloc(96 * 64 * sizeof *deq), *row = malloc(64 * sizeof *row);
    s = checkpoint_get(ck, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_F32, deq, 96 * 64 * sizeof *deq, 0, &hf);
    int same = s == STATUS_OK;
    for (int r = 0; same && r < 96; r++) {
        quant_dequantize_row(QUANT_TYPE_Q8_0, (const char *)hq.data + r * quant_row_bytes(QUANT_TYPE_Q8_0, 64), row, 64);
        same = !memcmp(row, deq + r * 64, 64 * sizeof *row);
    }
    check(same && hf.stored_dtype == DTYPE_Q8_0 && !hf.zero_copy, "Q in f32: the blocks dequantized bit for bit");
    free(deq);
    free(row);
    s = checkpoint_describe(ck, WEIGHT_KIND_ATTN_NORM, 0, 0, 1, DTYPE_F32, &hf);
    check(s == STATUS_OK && hf.zero_copy && hf.stored_dtype == DTYPE_F32, "F32 norm: zero-copy as today");
    s = checkpoint_describe(ck, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_Q4_K, &hq);
    check_status(s, STATUS_INVALID_ARGUMENT, "Q asked as Q4_K blocks (stored Q8_0)", "q8_0", "q4_k", NULL);

    s = checkpoint_describe(ck, WEIGHT_KIND_Q, 0, 1, 2, DTYPE_Q8_0, &hq);
    check(s == STATUS_OK && hq.zero_copy && hq.shape[0] == 48 && hq.row_start == 48,
          "tp 2: rank 1's rows of Q are zero-copy blocks");
    s = checkpoint_describe(ck, WEIGHT_KIND_O, 0, 1, 2, DTYPE_Q8_0, &hq);
    check_status(s, STATUS_UNSUPPORTED, "tp 2: the attention output's 48 columns as Q8_0 blocks", "weight o",
                 "tp 2", "cut", NULL);
    s = checkpoint_describe(ck, WEIGHT_KIND_O, 0, 1, 2, DTYPE_F32, &hf);
    check(s == STATUS_OK && hf.shape[1] == 48, "tp 2: the same slice in f32 is served (dequantized)");
    s = checkpoint_describe(ck, WEIGHT_KIND_DOWN, 0, 1, 2, DTYPE_Q8_0, &hq);
    check(s == STATUS_OK && !hq.zero_copy && hq.shape[1] == 64, "tp 2: DOWN's 64 columns as blocks (copied)");
    char out[64], file[128];
    snprintf(out, sizeof out, "/tmp/shardlm_gguf_serve_%d", (int)getpid());
    s = checkpoint_write_hf(out, ck);
    check_status(s, STATUS_OK, "checkpoint_write_hf from a GGUF", NULL);
    struct checkpoint *copy = NULL;
    struct host_weight hw;
    if (!s) s = checkpoint_open(out, &copy);
    if (!s) s = checkpoint_describe(ck, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_Q8_0, &hq);
    if (!s) s = checkpoint_describe(copy, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_Q8_0, &hw);
    check(!s && hw.stored_dtype == DTYPE_Q8_0 && hw.zero_copy && hw.nbytes == hq.nbytes &&
              !memcmp(hw.data, hq.data, hq.nbytes),
          "its HF directory keeps Q as the GGUF's Q8_0 blocks, byte for byte (tests/test_keep_blocks.c: the rest)");
    checkpoint_close(copy);
    static const char *const files[] = {"model.safetensors", "config.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(file, sizeof file, "%s/%s", out, files[i]);
        unlink(file);
    }
    rmdir(out);
    checkpoint_close(ck);
}

struct tiny {
    struct model   *m;
    struct kv_cache cache;
};

/* Logits of every row of ids (n <= 16) on the model loaded from path; *weight_bytes (may be
 * NULL) the model's bytes of weights, *blocks those kept as blocks. */
static enum status tiny_logits(struct backend *b, const char *path, int dtype, const int32_t *ids, int n,
                               float *logits, size_t *blocks, size_t *weight_bytes)
{
    struct tiny t = {0};
    enum status s = model_load_as(path, b, NULL, dtype, &t.m);
    if (!s) s = model_reserve(t.m, 16, 1, 1, 16);
    if (!s) s = kv_cache_init(&t.cache, b, 1, 1, 16, t.m->n_kv_local, t.m->cfg.head_dim, t.m->dtype);
    int32_t table[1] = {0}, pos[16], rows[16];
    if (!s) s = kv_cache_alloc(&t.cache, 1, table);
    for (int i = 0; i < n; i++) pos[i] = rows[i] = i;
    int32_t q_start[2] = {0, n}, seq_len = n;
    struct forward_batch fb = {.n_tokens = n, .tokens = ids, .positions = pos, .slots = pos, .n_seqs = 1,
                               .q_start = q_start, .seq_len = &seq_len, .block_table = table, .max_blocks = 1,
                               .n_logits = n, .logit_rows = rows};
    if (!s) s = model_forward(t.m, &t.cache, &fb, logits);
    if (t.m) *blocks = t.m->weight_bytes_blocks;
    if (t.m && weight_bytes) *weight_bytes = t.m->weight_bytes;
    if (t.cache.n_blocks) kv_cache_free(&t.cache);
    model_free(t.m);
    return s;
}


/* The model with its matrices as blocks against the same weights dequantized. The products
 * differ by the int8 rounding of activations: measured max |diff| 0.15 on logits up to 34
 * (random weights; the tied head multiplies by an embedding of scale 0.5); tolerance 0.3. A
 * wrong block offset or row moves them by O(10). */
static void test_model(const char *path)
{
    struct backend *b = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 1, &b) == STATUS_OK, "cpu backend");
    static const int32_t ids[] = {2, 278, 271, 272, 279, 269, 5, 100};
    const int n = 8, V = 279;
    float *lq = malloc((size_t)n * V * sizeof *lq), *lf = malloc((size_t)n * V * sizeof *lf);
    size_t bq = 0, bf = 0;
    enum status sq = tiny_logits(b, path, -1, ids, n, lq, &bq, NULL);
    check_status(sq, STATUS_OK, "model_load + forward with blocks", NULL);
    enum status sf = tiny_logits(b, path, DTYPE_F32, ids, n, lf, &bf, NULL);
    check_status(sf, STATUS_OK, "model_load_as(f32) + forward, dequantized", NULL);
    if (!sq && !sf) {
        double worst = 0, range = 0;
        int argmax_same = 1;
        for (int i = 0; i < n; i++) {
            int aq = 0, af = 0;
            for (int j = 0; j < V; j++) {
                worst = fmax(worst, fabs((double)lq[i * V + j] - lf[i * V + j]));
                range = fmax(range, fabs((double)lf[i * V + j]));
                if (lq[i * V + j] > lq[i * V + aq]) aq = j;
                if (lf[i * V + j] > lf[i * V + af]) af = j;
            }
            argmax_same &= aq == af;
        }
        check(bq > 0 && bf == 0 && worst <= 0.3 && range > 1.0 && argmax_same,
              "blocks (%zu bytes) vs dequantized: max |diff| %.4f (tol 0.3; logits up to %.2f), argmax %s", bq,
              worst, range, argmax_same ? "equal at every row" : "DIFFERS");
    }
    free(lq);
    free(lf);
    backend_close(b);
}

/* The file converted to bf16 (or f16) and served on the CPU: its matrices stay in that dtype
 * wherever the CPU multiplies them in place (cpu_half_weights_in_place: AMX tiles for bf16, or a
 * decode gemv that widens them in registers; model_load), under 0.6x the weight bytes of the same
 * file converted to f32. A prefill on the bf16 products (AMX tiles or vdpbf16ps, bf16 only)
 * rounds x to bf16 (relative 2^-9) where the f32 products (both off) do not; the weights' values
 * are the same. Measured max |diff| 0.063 on logits up to 34 (AMX, 2026-11-25); tolerance 0.005
 * (1 + max |logit|), 0.17 here; a misread row moves logits by O(10). With both off the file's
 * logits are the f32 file's up to the rounding of its weights (measured 0.081 here for bf16), to
 * the same tolerance. */
static void test_half(const char *path, enum dtype dt)
{
    const char *name = dtype_name(dt);
    if (!cpu_half_weights_in_place(dt)) {
        printf("SKIP %s weights in place: this CPU (or SHARDLM_CPU_ISA) widens them to f32 at load\n", name);
        return;
    }
    char dir[256], dir32[256];
    snprintf(dir, sizeof dir, "/tmp/shardlm_gguf_%s_%d", name, (int)getpid());
    snprintf(dir32, sizeof dir32, "/tmp/shardlm_gguf_f32_%d", (int)getpid());
    enum status st = gguf_convert(path, dir, dt, 0);
    check_status(st, STATUS_OK, "convert gguf --dtype of the fixture", name);
    if (!st) st = gguf_convert(path, dir32, DTYPE_F32, 0);
    check_status(st, STATUS_OK, "convert gguf --dtype f32 of the fixture", NULL);
    if (st) return;
    struct backend *b = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 2, &b) == STATUS_OK, "cpu backend");
    static const int32_t ids[] = {2, 278, 271, 272, 279, 269, 5, 100};
    const int n = 8, V = 279;
    float *lh = malloc((size_t)n * V * sizeof *lh), *lf = malloc((size_t)n * V * sizeof *lf);
    float *l32 = malloc((size_t)n * V * sizeof *l32);
    size_t blk = 0, bytes_half = 0, bytes_off = 0, bytes_f32 = 0;
    const int amx = cpu_amx_enabled(), dot = cpu_bf16_dot_set_enabled(0);
    cpu_bf16_dot_set_enabled(dot);
    const char *products = dt != DTYPE_BF16 ? NULL : amx ? "AMX tiles" : dot ? "vdpbf16ps" : NULL;
    enum status sh = tiny_logits(b, dir, -1, ids, n, lh, &blk, &bytes_half);
    cpu_amx_set_enabled(0);
    cpu_bf16_dot_set_enabled(0);
    enum status sf = tiny_logits(b, dir, -1, ids, n, lf, &blk, &bytes_off);
    enum status s32 = tiny_logits(b, dir32, -1, ids, n, l32, &blk, &bytes_f32);
    cpu_amx_set_enabled(amx);
    cpu_bf16_dot_set_enabled(dot);
    double worst = 0, worst32 = 0, range = 0;
    for (int i = 0; !sh && !sf && !s32 && i < n * V; i++) {
        worst = fmax(worst, fabs((double)lh[i] - lf[i]));
        worst32 = fmax(worst32, fabs((double)lf[i] - l32[i]));
        range = fmax(range, fabs((double)l32[i]));
    }
    check(!sh && !sf && !s32 && bytes_half == bytes_off && bytes_half * 10 < bytes_f32 * 6 && range > 1.0 &&
              worst32 <= 0.005 * (1.0 + range),
          "%s directory served in %s (%zu bytes of weights, %zu for the f32 directory): f32 products vs the f32 "
          "directory's max |diff| %.4f (tol %.3f; logits up to %.2f)", name, name, bytes_half, bytes_f32, worst32,
          0.005 * (1.0 + range), range);
    if (products)
        check(!sh && !sf && worst <= 0.005 * (1.0 + range),
              "bf16 directory's prefill on the bf16 products (%s) vs the f32 products: max |diff| %.4f (tol %.3f)",
              products, worst, 0.005 * (1.0 + range));
    else if (dt == DTYPE_BF16)
        printf("SKIP bf16 weights' prefill on bf16 products: this CPU has no AMX-BF16 or AVX512-BF16 (or they are off)\n");
    else
        check(!sh && !sf && worst == 0, "%s directory: the same logits whatever the bf16 products' switches (%.4f)",
              name, worst);
    free(lh);
    free(lf);
    free(l32);
    backend_close(b);
    check_remove_tree(dir);
    check_remove_tree(dir32);
}

/* The file served on CUDA with its blocks (bf16 activations) against the CPU's f32 model of the
 * dequantized weights. Both use bit-identical weight values (the CUDA kernels decode the blocks
 * as quant_dequantize_row does), so the difference is the bf16 rounding of activations: the
 * criterion of test_model cuda, 0.05 (1 + max |logit|), and the argmax wherever the CPU's top
 * two differ by more. A wrong block offset or row moves logits by O(10) (test_model above). */
static int test_model_cuda(const char *path)
{
    struct backend *gpu = NULL, *cpu = NULL;
    enum status st = backend_open(DEVICE_CUDA, 0, 0, &gpu);
    if (st != STATUS_OK) {
        printf("SKIP: gguf_serve_cuda: %s\n", status_message());
        return 77;
    }
    CHECK(backend_open(DEVICE_CPU, 0, 1, &cpu) == STATUS_OK, "cpu backend");
    static const int32_t ids[] = {2, 278, 271, 272, 279, 269, 5, 100};
    const int n = 8, V = 279;
    float *lg = malloc((size_t)n * V * sizeof *lg), *lc = malloc((size_t)n * V * sizeof *lc);
    size_t bg = 0, bc = 0;
    enum status sg = tiny_logits(gpu, path, -1, ids, n, lg, &bg, NULL);
    check_status(sg, STATUS_OK, "CUDA: model_load with blocks + forward", NULL);
    enum status sc = tiny_logits(cpu, path, DTYPE_F32, ids, n, lc, &bc, NULL);
    check_status(sc, STATUS_OK, "CPU: model_load_as(f32) + forward, dequantized", NULL);
    if (!sg && !sc) {
        double worst = 0, scale = 0;
        for (int i = 0; i < n * V; i++) {
            worst = fmax(worst, fabs((double)lg[i] - lc[i]));
            scale = fmax(scale, fabs((double)lc[i]));
        }
        const double tol = 0.05 * (1 + scale);
        int argmax_same = 1;
        for (int i = 0; i < n; i++) {
            const float *a = lg + (size_t)i * V, *c = lc + (size_t)i * V;
            int ia = 0, ic = 0, ic2 = -1;
            for (int j = 0; j < V; j++) {
                if (a[j] > a[ia]) ia = j;
                if (c[j] > c[ic]) {
                    ic2 = ic;
                    ic = j;
                } else if (ic2 < 0 || c[j] > c[ic2]) {
                    ic2 = j;
                }
            }
            if (ia != ic && c[ic] - c[ic2] > tol) argmax_same = 0;
        }
        check(bg > 0 && bc == 0 && worst <= tol && scale > 1.0 && argmax_same,
              "CUDA blocks (%zu bytes, bf16) vs CPU dequantized f32: max |diff| %.4f (tol %.3f; logits up to "
              "%.2f), argmax %s", bg, worst, tol, scale, argmax_same ? "equal beyond the margin" : "DIFFERS");
    }
    free(lg);
    free(lc);

    struct model *m = NULL;
    st = model_load(path, gpu, NULL, &m);
    check_status(st, STATUS_OK, "CUDA: model_load with blocks", NULL);
    if (!st) {
        struct adapter_set set;
        const char *names[] = {"a"}, *dirs[] = {"/nonexistent-adapter"};
        st = adapter_set_init(&set, m, 0, 0, 0, names, dirs, 1);
        check_status(st, STATUS_UNSUPPORTED, "CUDA: --lora on a model with blocks", "merge-lora", NULL);
        adapter_set_free(&set, gpu);
    }
    model_free(m);
    backend_close(gpu);
    backend_close(cpu);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

/* A copy of the fixture whose Q8_0 attn_q block 3 has a NaN scale (f16 0x7e00): model_load, with
 * blocks kept or dequantized, refuses it naming the weight (a NaN scale makes every logit NaN). */
static void test_nan_scale(const char *path)
{
    struct gguf *g = NULL;
    CHECK(gguf_open(path, &g) == STATUS_OK, "open the fixture");
    const struct gguf_tensor *t = gguf_find_tensor(g, "blk.0.attn_q.weight");
    CHECK(t && t->type_size == 34, "attn_q is Q8_0 (34-byte blocks)");
    const uint64_t at = t->file_offset + 3 * 34; /* block 3's f16 scale comes first */
    gguf_close(g);
    char bad[] = "/tmp/shardlm_nan_scale_XXXXXX";
    const int fd = mkstemp(bad);
    CHECK(fd >= 0, "temporary file");
    close(fd);
    FILE *in = fopen(path, "rb"), *out = fopen(bad, "wb");
    CHECK(in && out, "copy the fixture");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) CHECK(fwrite(buf, 1, n, out) == n, "copy");
    fclose(in);
    const unsigned char nan16[2] = {0x00, 0x7e};
    CHECK(fseek(out, (long)at, SEEK_SET) == 0 && fwrite(nan16, 1, 2, out) == 2, "patch the scale");
    fclose(out);
    struct backend *b = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 1, &b) == STATUS_OK, "cpu backend");
    for (int as_f32 = 0; as_f32 < 2; as_f32++) {
        struct model *m = NULL;
        enum status st = model_load_as(bad, b, NULL, as_f32 ? DTYPE_F32 : -1, &m);
        check_status(st, STATUS_BAD_FORMAT, as_f32 ? "a NaN block scale, dequantized at load: refused"
                                                    : "a NaN block scale, blocks kept: refused",
                     "q", "NaN", NULL);
        model_free(m);
    }
    backend_close(b);
    unlink(bad);
}

int main(int argc, char **argv)
{
    const int cuda = argc == 3 && !strcmp(argv[2], "--cuda");
    if (argc < 2 || (argc == 3 && !cuda) || argc > 3) {
        fprintf(stderr, "usage: test_gguf_serve FIXTURE_DIR [--cuda]\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/tiny_gemma3.gguf", argv[1]);
    if (access(path, R_OK) != 0) {
        printf("SKIP: %s not found (tests/gguf_setup.py needs pip install gguf numpy)\n", path);
        return 77;
    }
    log_set_level(LOG_LEVEL_WARN);
    if (cuda) return test_model_cuda(path);
    test_checkpoint(path);
    test_model(path);
    test_half(path, DTYPE_BF16);
    test_half(path, DTYPE_F16);
    test_nan_scale(path);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
