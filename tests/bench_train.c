/* tests/bench_train.c - the speed and memory of a full training step on one rank, next to
 * baselines measured in the same run:
 *   - tokens/s and achieved FLOP/s of forward + backward + AdamW on a model of the
 *     stories110M shape (d 768, 12 layers of 12 heads, ffn 2048, vocab 32000; random weights
 *     written to a temporary directory), counting 6 x parameters x tokens plus attention
 *     (12 x layers x d x tokens x mean attended length: QK^T and PV, forward and backward),
 *     as a ratio to raw OpenBLAS cblas_sgemm on a 768 x 768 x T product of the same run;
 *   - peak resident memory against the expected: the model's 4 bytes per parameter for the
 *     weights, 4 for the gradients, 8 for the AdamW moments (16 bytes per parameter in f32),
 *     plus the activations this implementation keeps (model_train.h), measured with VmHWM.
 * A benchmark, never a pass/fail gate: it exits 0 whatever the numbers are.
 * With --device cuda the baseline is the backend's own f32 product (op_matmul: cuBLAS, no TF32)
 * on the same T x 768 x 768 shape, and memory is the device's (cudaMemGetInfo before and after).
 * With --bf16 on CUDA the baseline is the backend's bf16 product on a T x d x ffn shape (what its
 * tensor cores reach in this run), and the model FLOP utilization is printed against it and
 * against the H100/H200 SXM datasheet's dense bf16 peak (989.4 TFLOP/s).
 * --model DIR trains that checkpoint (for example tools/make_random_model.py's llama3.2-1b) in
 * place of the stories110M shape written to /tmp.
 * Run: bench_train [--steps N] [--seq N] [--micro N] [--layers N] [--threads N] [--device cpu|cuda]
 *                  [--bf16] [--model DIR]
 * (defaults: 3 steps of 1 x 256 tokens in f32; about a minute on 2 cores). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model_train.h"
#include "optimizer.h"
#include "params.h"
#include "bench_model.h"
#include "safetensors.h"

static double sgemm_gflops(int m, int k, int n)
{
    float *a = malloc((size_t)m * k * 4), *b = malloc((size_t)n * k * 4), *c = malloc((size_t)m * n * 4);
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = bench_rnd();
    for (size_t i = 0; i < (size_t)n * k; i++) b[i] = bench_rnd();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t0 = base_now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        double t = base_now_s() - t0;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * k * n / best / 1e9;
}

int main(int argc, char **argv)
{
    int steps = 3, seq = 256, micro = 1, layers = 12, threads = 0, bf16 = 0;
    const char *model_dir = NULL;
    enum device device = DEVICE_CPU;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--bf16")) bf16 = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--bf16")) { i--; continue; }
        if (!strcmp(argv[i], "--device") && backend_parse_device(argv[i + 1], &device) != STATUS_OK) return 2;
        if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) seq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--micro")) micro = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
    }
    int d = 768, heads = 12, ffn = 2048, vocab = 32000;
    const int T = seq * micro;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", model_dir ? model_dir : "");
    if (!model_dir) snprintf(dir, sizeof dir, "/tmp/shardlm_bench_train_%d", (int)getpid());
    enum status st = model_dir ? STATUS_OK : write_model(dir, d, layers, heads, ffn, vocab, 1024);
    struct backend *b = NULL;
    struct model *m = NULL;
    if (st == STATUS_OK) st = backend_open(device, 0, threads, &b);
    size_t free0 = 0, total = 0, free1 = 0;
    if (st == STATUS_OK) backend_mem_info(b, &free0, &total);
    if (st == STATUS_OK) st = model_load_as(dir, b, NULL, bf16 ? DTYPE_BF16 : DTYPE_F32, &m);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    if (st == STATUS_OK) { /* the attention term and the printout use the loaded shape */
        d = m->cfg.n_heads * m->cfg.head_dim, layers = m->cfg.n_layers, heads = m->cfg.n_heads;
        ffn = m->cfg.ffn_hidden, vocab = m->cfg.vocab_size;
    }
    const long hwm_model = vm_hwm_kib();
    struct model_train *mt = NULL;
    if (st == STATUS_OK) st = model_train_new(m, T, NULL, &mt);
    struct model_weights g;
    void *gmem = NULL;
    struct optimizer opt = {0};
    struct optimizer_options oo = {.lr = 1e-4, .decay_style = LR_DECAY_CONSTANT, .weight_decay = 0.01, .beta1 = 0.9,
                                   .beta2 = 0.999, .eps = 1e-8, .clip_grad = 1.0};
    if (st == STATUS_OK) st = weights_alloc_like(b, &m->w, DTYPE_F32, &g, &gmem);
    struct param_table pt = {0}, gt = {0};
    if (st == STATUS_OK) st = param_table_from_weights(&pt, &m->w, 0);
    if (st == STATUS_OK) st = param_table_from_weights(&gt, &g, 0);
    if (st == STATUS_OK && !bf16) st = optimizer_init(&opt, b, &pt, &oo);
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_train: %s\n", status_message());
        return 1;
    }
    /* One micro-batch of `micro` documents of `seq` tokens. */
    int32_t *tok = malloc((size_t)T * 4), *tgt = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4);
    int32_t *docs = malloc((size_t)(micro + 1) * 4);
    for (int i = 0; i < T; i++) {
        tok[i] = (int32_t)((i * 7919 + 13) % vocab);
        tgt[i] = (i + 1) % seq ? (int32_t)(((i + 1) * 7919 + 13) % vocab) : -1;
        pos[i] = i % seq;
    }
    for (int s = 0; s <= micro; s++) docs[s] = s * seq;
    struct train_batch tb = {.n_tokens = T, .tokens = tok, .targets = tgt, .positions = pos, .n_docs = micro,
                             .doc_start = docs, .grad_scale = 1.0f / (float)(T - micro)};
    const int64_t params = weights_numel(&m->w);
    double best = 1e30, loss = 0;
    for (int s = 0; s <= steps; s++) { /* step 0 warms up */
        const double t0 = base_now_s();
        weights_zero(b, &g);
        int nr = 0;
        st = model_forward_train(mt, &tb, &loss, &nr);
        if (st == STATUS_OK) st = model_backward(mt, &tb, &g);
        if (st != STATUS_OK) break;
        if (!bf16) { /* bf16: forward + backward only (AdamW runs on f32 master weights) */
            double norm = optimizer_grad_norm(&opt, b, &gt);
            optimizer_step(&opt, b, &pt, &gt, 1e-4, norm, 1.0);
        }
        backend_synchronize(b);
        const double t = base_now_s() - t0;
        if (s > 0 && t < best) best = t;
        printf("  step %d: %.3f s, loss %.4f\n", s, t, loss / (T - micro));
    }
    const double attn = 12.0 * layers * d * (double)T * ((seq + 1) / 2.0);
    const double flops = 6.0 * (double)params * T + attn;
    double gemm = 0;
    if (device == DEVICE_CPU) {
        gemm = sgemm_gflops(T, d, d);
    } else { /* the backend's own product on the same shape: f32, or bf16 T x d x ffn (tensor cores) */
        const enum dtype gt_dtype = bf16 ? DTYPE_BF16 : DTYPE_F32;
        const int n_out = bf16 ? ffn : d;
        struct tensor x, w, y;
        backend_alloc_tensor(b, &x, gt_dtype, 2, (int64_t[]){T, d});
        backend_alloc_tensor(b, &w, gt_dtype, 2, (int64_t[]){n_out, d});
        backend_alloc_tensor(b, &y, gt_dtype, 2, (int64_t[]){T, n_out});
        backend_memset_zero(b, x.data, tensor_nbytes(&x));
        backend_memset_zero(b, w.data, tensor_nbytes(&w));
        op_matmul(b, &y, &x, &w, NULL);
        backend_synchronize(b);
        const double t0 = base_now_s();
        for (int r = 0; r < 50; r++) op_matmul(b, &y, &x, &w, NULL);
        backend_synchronize(b);
        gemm = 2.0 * T * d * n_out * 50 / (base_now_s() - t0) / 1e9;
        backend_free(b, x.data);
        backend_free(b, w.data);
        backend_free(b, y.data);
    }
    backend_mem_info(b, &free1, &total);
    const double achieved = flops / best / 1e9;
    const long hwm = vm_hwm_kib();
    const double act_mb = (double)layers * T * (10.0 * d + 4.0 * ffn + 3.0 * d) * 4 / 1048576.0;
    printf("bench_train: %s (d %d, %d layers of %d heads, ffn %d, vocab %d), %lld parameters, %d x %d tokens, "
           "%d threads, %s\n",
           model_dir ? model_dir : "stories110M shape", d, layers, heads, ffn, vocab, (long long)params, micro, seq,
           b->n_threads, bf16 ? "bf16 (forward + backward)" : "f32 (forward + backward + AdamW)");
    printf("  step %.3f s (best of %d): %.0f tokens/s, %.1f GFLOP/s achieved (6 N T + attention)\n", best, steps,
           T / best, achieved);
    printf("  %s %d x %d x %d in the same run: %.1f GFLOP/s -> ratio %.2f\n",
           device == DEVICE_CPU ? "OpenBLAS sgemm"
           : bf16               ? "the backend's bf16 op_matmul (cuBLAS, tensor cores)"
                                : "the backend's f32 op_matmul (cuBLAS)",
           T, d, device != DEVICE_CPU && bf16 ? ffn : d, gemm, achieved / gemm);
    if (device != DEVICE_CPU && bf16)
        printf("  MFU %.1f %% of the H100/H200 SXM datasheet's 989.4 TFLOP/s dense bf16 (%.1f %% of the bf16 product "
               "measured above)\n", 100.0 * achieved / 989.4e3, 100.0 * achieved / gemm);
    if (device != DEVICE_CPU)
        printf("  device memory in use after the steps: %.0f MiB (%s weights)\n", (double)(free0 - free1) / 1048576.0,
               bf16 ? "bf16" : "f32");
    printf("  peak RSS %.0f MiB: after loading %.0f MiB; expected 16 B/param = %.0f MiB + activations ~%.0f MiB "
           "(+ the checkpoint's page cache while mapped)\n",
           hwm / 1024.0, hwm_model / 1024.0, 16.0 * params / 1048576.0, act_mb);
    if (!bf16) optimizer_free(&opt, b);
    param_table_free(&pt);
    param_table_free(&gt);
    weights_free_layers(&g);
    backend_free(b, gmem);
    model_train_free(mt);
    model_free(m);
    backend_close(b);
    if (!model_dir) { /* the written model only */
        char path[4096 + 32];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/config.json", dir);
        unlink(path);
        rmdir(dir);
    }
    free(tok);
    free(tgt);
    free(pos);
    free(docs);
    return 0;
}
