/* tests/bench_engine.c - serving-engine benchmark (never a test): for each concurrency C,
 * submits C requests at once (random prompts of --prompt tokens, --tokens new tokens each,
 * EOS ignored) to a running engine thread and reports generated tokens/s over the wall time,
 * median / p99 time to first token (TTFT) and inter-token latency (ITL), and the decode step
 * time (ITL p50: one engine step once every sequence decodes) against the first row's, and the
 * decode tokens/s (sequences / mean ITL) of the rows of concurrency 1 and 64.
 * With --bandwidth-gbs B it also prints the weight-read floor of batch-1 decode: the bytes a
 * decode step reads (every projection, the MLP and the LM head once; the embedding only by
 * row), over B GB/s, and the achieved batch-1 decode tokens/s (1 / ITL mean) as a fraction of it.
 * One warm-up round (the largest concurrency, 4 tokens each) runs first and is not reported
 * (CUDA: the first steps pay for module loading and library handles).
 * usage: bench_engine --model DIR [--device cpu|cuda] [--device-id N] [--concurrency 1,4,16,64]
 *                     [--prompt 32] [--tokens 64] [--threads N] [--max-seqs 64]
 *                     [--max-batch-tokens 512] [--kv-cache-bytes N] [--bandwidth-gbs X] [--warmup 0|1]
 *                     [--temperature T] [--top-p P] [--top-k K]
 * (greedy by default; --temperature > 0 samples, each request with its own seed; with 1 <= K < 64
 * on CUDA each row's top 64 logits come to the host instead of the row, conductor take_top). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "ops.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct req_stats {
    double submit, first, last;
    double *gaps; /* (tokens) seconds between token events */
    int    n_gaps, n_tokens, done;
    int    failed;
};

static float g_temperature = 0.0f, g_top_p = 1.0f; /* --temperature, --top-p */
static int g_top_k = 0;                              /* --top-k */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

static void on_event(void *ctx, const struct engine_event *ev)
{
    struct req_stats *r = ctx;
    double t = now();
    pthread_mutex_lock(&mu);
    if (ev->kind == ENGINE_EVENT_TOKENS) {
        if (r->n_tokens == 0) r->first = t;
        else r->gaps[r->n_gaps++] = t - r->last;
        r->last = t;
        r->n_tokens += ev->n_tokens;
    } else if (ev->kind == ENGINE_EVENT_FINISHED) {
        r->failed = ev->finish == FINISH_REASON_ERROR;
        if (r->failed) fprintf(stderr, "bench_engine: request failed: %s: %s\n", status_name(ev->status), ev->message);
        r->done = 1;
        pthread_cond_signal(&cv);
    }
    pthread_mutex_unlock(&mu);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, int n, double q)
{
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    int i = (int)(q * (n - 1) + 0.5);
    return v[i];
}

/* What one round of c concurrent requests measured. */
struct round {
    double tokens_per_s;          /* generated tokens over the wall time, prefill included */
    double ttft_p50, ttft_p99;    /* seconds */
    double itl_p50, itl_p99;      /* seconds; itl_p50 is the decode step time */
    double itl_mean;              /* seconds; decode tokens/s of one sequence = 1 / itl_mean */
};

/* Submits c requests at once and waits for all of them. Returns 0, or 1 after printing why. */
static int run_round(struct engine *e, const struct engine_model_info *info, int c, int prompt_len, int tokens,
                     struct round *out)
{
    struct req_stats *rs = calloc((size_t)c, sizeof *rs);
    int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
    if (!rs || !prompt) {
        fprintf(stderr, "bench_engine: out of memory\n");
        return 1;
    }
    struct request_params p = request_params_default();
    p.sampling.temperature = g_temperature;
    p.sampling.top_p = g_top_p;
    p.sampling.top_k = g_top_k;
    p.max_tokens = tokens;
    p.ignore_eos = 1;
    double t0 = now();
    for (int i = 0; i < c; i++) {
        rs[i].gaps = malloc((size_t)tokens * sizeof(double));
        prompt[0] = info->bos_id >= 0 ? info->bos_id : 1;
        for (int j = 1; j < prompt_len; j++)
            prompt[j] = 3 + (int32_t)((unsigned)(i * 7919 + j * 104729) % (unsigned)(info->vocab_size - 3));
        rs[i].submit = now();
        p.sampling.seed = 1000 + (uint64_t)i;
        p.has_seed = 1;
        uint64_t h;
        enum status st = engine_submit(e, NULL, prompt, prompt_len, &p, on_event, &rs[i], &h);
        if (st != STATUS_OK) {
            fprintf(stderr, "bench_engine: submit: %s: %s\n", status_name(st), status_message());
            return 1;
        }
    }
    pthread_mutex_lock(&mu);
    for (int i = 0; i < c; i++)
        while (!rs[i].done) pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    double wall = now() - t0;
    double *ttft = malloc((size_t)c * sizeof *ttft), *itl = malloc((size_t)c * (size_t)tokens * sizeof *itl);
    int n_itl = 0, total = 0, failed = 0;
    double itl_sum = 0;
    for (int i = 0; i < c; i++) {
        ttft[i] = rs[i].first - rs[i].submit;
        for (int j = 0; j < rs[i].n_gaps; j++) itl_sum += itl[n_itl++] = rs[i].gaps[j];
        total += rs[i].n_tokens;
        failed += rs[i].failed;
        free(rs[i].gaps);
    }
    *out = (struct round){
        .tokens_per_s = total / wall,
        .ttft_p50 = pct(ttft, c, 0.5), .ttft_p99 = pct(ttft, c, 0.99),
        .itl_p50 = pct(itl, n_itl, 0.5), .itl_p99 = pct(itl, n_itl, 0.99),
        .itl_mean = n_itl ? itl_sum / n_itl : 0,
    };
    free(ttft);
    free(itl);
    free(rs);
    free(prompt);
    if (failed) {
        fprintf(stderr, "bench_engine: %d of %d requests finished with an error\n", failed, c);
        return 1;
    }
    return 0;
}

/* Bytes one decode step reads from the weights, from the shape alone: q, k, v, o, the MLP (three
 * matrices with a gated activation, two for GPT-2), the LM head (vocab x d_model, tied or not:
 * the embedding is otherwise read one row per token), norms ignored. Assumes the weights are
 * stored in the compute dtype (not a GGUF served as quantized blocks, nor bf16 matrices kept bf16
 * on a CPU with AMX while the compute dtype says f32: there the floor counts twice the bytes);
 * 0 when the dtype is not f32, bf16 or f16. Exact on CUDA for a bf16 or f16 checkpoint. */
static double decode_weight_bytes(const struct engine_model_info *info)
{
    double elem = !strcmp(info->dtype, "f32") ? 4 : (!strcmp(info->dtype, "bf16") || !strcmp(info->dtype, "f16")) ? 2 : 0;
    double d = info->d_model, q = (double)info->n_heads * info->head_dim, kv = (double)info->n_kv_heads * info->head_dim;
    int n_mlp = strstr(info->architecture, "GPT2") ? 2 : 3;
    double layer = d * q + 2 * d * kv + q * d + n_mlp * d * info->ffn_hidden;
    return elem * (info->n_layers * layer + (double)info->vocab_size * d);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_engine --model DIR [--device cpu|cuda] [--device-id N] [--concurrency 1,4,16,64]\n"
                    "                    [--prompt N] [--tokens N] [--threads N] [--max-seqs 64] [--max-batch-tokens 512]\n"
                    "                    [--kv-cache-bytes N] [--bandwidth-gbs X] [--warmup 0|1] [--temperature T]\n"
                    "                    [--top-p P] [--top-k K]\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *conc = "1,4,16,64", *device = "cpu";
    int prompt_len = 32, tokens = 64, threads = 0, device_id = 0, max_seqs = 64, max_batch_tokens = 512, warmup = 1;
    double kv_bytes = 0, bandwidth_gbs = 0;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) {
            usage();
            return 2;
        }
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) model = v;
        else if (!strcmp(k, "--device")) device = v;
        else if (!strcmp(k, "--device-id")) device_id = atoi(v);
        else if (!strcmp(k, "--concurrency")) conc = v;
        else if (!strcmp(k, "--prompt")) prompt_len = atoi(v);
        else if (!strcmp(k, "--tokens")) tokens = atoi(v);
        else if (!strcmp(k, "--threads")) threads = atoi(v);
        else if (!strcmp(k, "--max-seqs")) max_seqs = atoi(v);
        else if (!strcmp(k, "--max-batch-tokens")) max_batch_tokens = atoi(v);
        else if (!strcmp(k, "--kv-cache-bytes")) kv_bytes = atof(v);
        else if (!strcmp(k, "--bandwidth-gbs")) bandwidth_gbs = atof(v);
        else if (!strcmp(k, "--warmup")) warmup = atoi(v);
        else if (!strcmp(k, "--temperature")) g_temperature = (float)atof(v);
        else if (!strcmp(k, "--top-p")) g_top_p = (float)atof(v);
        else if (!strcmp(k, "--top-k")) g_top_k = atoi(v);
        else {
            fprintf(stderr, "bench_engine: unknown flag %s\n", k);
            usage();
            return 2;
        }
    }
    enum device dev;
    if (!model || prompt_len < 1 || tokens < 2 || max_seqs < 1 || max_batch_tokens < 1 || kv_bytes < 0 ||
        bandwidth_gbs < 0 || backend_parse_device(device, &dev) != STATUS_OK) {
        usage();
        return 2;
    }
    struct engine_options o = engine_options_default();
    o.model_dir = model;
    o.device = dev;
    o.device_id = device_id;
    o.n_threads = threads;
    o.max_seqs = max_seqs;
    o.max_batch_tokens = max_batch_tokens;
    o.kv_cache_bytes = (size_t)kv_bytes; /* 0: enough for max_seqs full contexts, at most 2 GiB */
    o.prefix_caching = 0; /* distinct random prompts: nothing to share, and no cache effects */
    struct engine *e = NULL;
    double t_load = now();
    enum status st = engine_create(&o, &e);
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_engine: %s: %s\n", status_name(st), status_message());
        return 1;
    }
    engine_start(e);
    t_load = now() - t_load;
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    printf("model %s: %d layers, d_model %d, %d/%d heads of %d, ffn %d, vocab %d, %s\n", info.architecture,
           info.n_layers, info.d_model, info.n_heads, info.n_kv_heads, info.head_dim, info.ffn_hidden,
           info.vocab_size, info.dtype);
    printf("device %s (id %d); loaded in %.1f s; max_seqs %d, max_batch_tokens %d, KV pool %d blocks of %d tokens; "
           "prompt %d tokens, %d new tokens per request\n",
           info.device, device_id, t_load, max_seqs, max_batch_tokens, info.kv_blocks, info.block_tokens, prompt_len,
           tokens);

    int conc_list[64], n_conc = 0, c_max = 1;
    char list[256];
    snprintf(list, sizeof list, "%s", conc);
    for (char *tok = strtok(list, ","); tok && n_conc < 64; tok = strtok(NULL, ",")) {
        int c = atoi(tok);
        if (c < 1) continue;
        conc_list[n_conc++] = c;
        if (c > c_max) c_max = c;
    }
    struct round r;
    if (warmup) {
        double t = now();
        if (run_round(e, &info, c_max, prompt_len, 4, &r)) return 1;
        printf("warm-up: %d requests of 4 tokens in %.2f s (not reported)\n", c_max, now() - t);
    }

    printf("%11s %12s %10s %10s %10s %10s %10s %12s %10s\n", "concurrency", "tokens/s", "TTFT p50", "TTFT p99",
           "ITL p50", "ITL p99", "ITL mean", "x tokens/s", "x step");
    struct round first = {0}, batch1 = {0}, batch64 = {0}, results[64];
    for (int k = 0; k < n_conc; k++) {
        int c = conc_list[k];
        if (run_round(e, &info, c, prompt_len, tokens, &r)) return 1;
        if (k == 0) first = r;
        if (c == 1) batch1 = r;
        if (c == 64) batch64 = r;
        printf("%11d %12.1f %8.1fms %8.1fms %8.2fms %8.2fms %8.2fms %12.2f %10.2f\n", c, r.tokens_per_s,
               1e3 * r.ttft_p50, 1e3 * r.ttft_p99, 1e3 * r.itl_p50, 1e3 * r.itl_p99, 1e3 * r.itl_mean,
               r.tokens_per_s / first.tokens_per_s,
               first.itl_p50 > 0 ? r.itl_p50 / first.itl_p50 : 0);
        results[k] = r;
        fflush(stdout);
    }
    for (int k = 0; k < n_conc; k++) /* for scripts: the figures tools/bench_hf_gpu.py prints */
        printf("RESULT engine=shardlm device=%s batch=%d prompt=%d tokens=%d ttft_ms=%.3f step_ms=%.4f itl_mean_ms=%.4f "
               "decode_tok_s=%.1f e2e_tok_s=%.1f\n", info.device, conc_list[k], prompt_len, tokens,
               1e3 * results[k].ttft_p50, 1e3 * results[k].itl_p50, 1e3 * results[k].itl_mean,
               results[k].itl_mean > 0 ? conc_list[k] / results[k].itl_mean : 0, results[k].tokens_per_s);
    printf("(tokens/s: all generated tokens over the wall time, prefill included; x tokens/s and x step: against\n"
           " the first row; decode step time = ITL p50; decode tokens/s = sequences / ITL mean)\n");
    if (batch1.itl_p50 > 0)
        printf("batch 1: decode step %.3f ms (ITL p50), ITL mean %.3f ms = %.1f decode tokens/s\n", 1e3 * batch1.itl_p50,
               1e3 * batch1.itl_mean, 1 / batch1.itl_mean);
    if (batch64.itl_p50 > 0)
        printf("batch 64: decode step %.3f ms (ITL p50), ITL mean %.3f ms = %.1f decode tokens/s\n",
               1e3 * batch64.itl_p50, 1e3 * batch64.itl_mean, 64 / batch64.itl_mean);
    if (batch1.itl_p50 > 0 && batch64.itl_p50 > 0)
        printf("step time batch 64 / batch 1: %.2f (ITL p50), %.2f (ITL mean); decode tokens/s batch 64 / batch 1: %.1f\n",
               batch64.itl_p50 / batch1.itl_p50, batch64.itl_mean / batch1.itl_mean,
               64 * batch1.itl_mean / batch64.itl_mean);
    double wbytes = decode_weight_bytes(&info);
    if (bandwidth_gbs > 0 && wbytes > 0 && batch1.itl_mean > 0) {
        double floor_s = wbytes / (bandwidth_gbs * 1e9);
        printf("weight-read floor, batch 1: %.1f MB of weights per step / %.1f GB/s = %.3f ms = %.1f tokens/s; "
               "achieved %.1f decode tokens/s = %.2f of the floor (%.1f GB/s effective; by ITL p50: %.2f)\n",
               wbytes / 1e6, bandwidth_gbs, 1e3 * floor_s, 1 / floor_s, 1 / batch1.itl_mean,
               floor_s / batch1.itl_mean, wbytes / batch1.itl_mean / 1e9, floor_s / batch1.itl_p50);
    } else if (bandwidth_gbs > 0) {
        printf("weight-read floor: not computed (%s)\n", wbytes > 0 ? "no concurrency-1 row" : "weights not f32/bf16/f16");
    }
    engine_drain(e, 1.0);
    engine_free(e);
    return 0;
}
