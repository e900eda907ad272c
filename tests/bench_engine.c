/* tests/bench_engine.c - serving-engine benchmark (never a test): for each concurrency C,
 * submits C requests at once (random prompts of --prompt tokens, --tokens new tokens each,
 * EOS ignored) to a running engine thread and reports generated tokens/s over the wall time,
 * and median / p99 time to first token (TTFT) and inter-token latency (ITL).
 * usage: bench_engine --model DIR [--concurrency 1,4,16,64] [--prompt 32] [--tokens 64] [--threads N] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct req_stats {
    double submit, first, last;
    double *gaps;
    int    n_gaps, n_tokens, done;
};

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

int main(int argc, char **argv)
{
    const char *model = NULL, *conc = "1,4,16,64";
    int prompt_len = 32, tokens = 64, threads = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--concurrency")) conc = argv[i + 1];
        else if (!strcmp(argv[i], "--prompt")) prompt_len = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--tokens")) tokens = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (!model || prompt_len < 1 || tokens < 2) {
        fprintf(stderr, "usage: bench_engine --model DIR [--concurrency 1,4,16,64] [--prompt N] [--tokens N] [--threads N]\n");
        return 2;
    }
    struct engine_options o = engine_options_default();
    o.model_dir = model;
    o.n_threads = threads;
    o.max_seqs = 64;
    o.max_batch_tokens = 512;
    o.prefix_caching = 0; /* distinct random prompts: nothing to share, and no cache effects */
    struct engine *e = NULL;
    enum status st = engine_create(&o, &e);
    if (st != STATUS_OK) {
        fprintf(stderr, "bench_engine: %s: %s\n", status_name(st), status_message());
        return 1;
    }
    engine_start(e);
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    printf("model %s: %d layers, d_model %d, vocab %d, %s on %s; prompt %d tokens, %d new tokens per request\n",
           info.architecture, info.n_layers, info.d_model, info.vocab_size, info.dtype, info.device, prompt_len, tokens);
    printf("%11s %12s %10s %10s %10s %10s\n", "concurrency", "tokens/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99");
    double base = 0;
    char list[256];
    snprintf(list, sizeof list, "%s", conc);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int c = atoi(tok);
        if (c < 1) continue;
        struct req_stats *rs = calloc((size_t)c, sizeof *rs);
        int32_t *prompt = malloc((size_t)prompt_len * sizeof *prompt);
        struct request_params p = request_params_default();
        p.sampling.temperature = 0;
        p.max_tokens = tokens;
        p.ignore_eos = 1;
        double t0 = now();
        for (int i = 0; i < c; i++) {
            rs[i].gaps = malloc((size_t)tokens * sizeof(double));
            prompt[0] = 1;
            for (int j = 1; j < prompt_len; j++) prompt[j] = 3 + (int32_t)((unsigned)(i * 7919 + j * 104729) % (unsigned)(info.vocab_size - 3));
            rs[i].submit = now();
            uint64_t h;
            st = engine_submit(e, NULL, prompt, prompt_len, &p, on_event, &rs[i], &h);
            if (st != STATUS_OK) {
                fprintf(stderr, "submit: %s\n", status_message());
                return 1;
            }
        }
        pthread_mutex_lock(&mu);
        for (int i = 0; i < c; i++)
            while (!rs[i].done) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        double wall = now() - t0;
        double *ttft = malloc((size_t)c * sizeof *ttft), *itl = malloc((size_t)c * (size_t)tokens * sizeof *itl);
        int n_itl = 0, total = 0;
        for (int i = 0; i < c; i++) {
            ttft[i] = rs[i].first - rs[i].submit;
            for (int j = 0; j < rs[i].n_gaps; j++) itl[n_itl++] = rs[i].gaps[j];
            total += rs[i].n_tokens;
            free(rs[i].gaps);
        }
        double tps = total / wall;
        if (base == 0) base = tps;
        printf("%11d %12.1f %9.0fms %9.0fms %9.1fms %9.1fms   (x%.2f of the first row)\n", c, tps, 1e3 * pct(ttft, c, 0.5),
               1e3 * pct(ttft, c, 0.99), 1e3 * pct(itl, n_itl, 0.5), 1e3 * pct(itl, n_itl, 0.99), tps / base);
        fflush(stdout);
        free(ttft);
        free(itl);
        free(rs);
        free(prompt);
    }
    engine_drain(e, 1.0);
    engine_free(e);
    return 0;
}
