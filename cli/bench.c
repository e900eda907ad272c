/* cli/bench.c - `shardlm bench`: a load generator over the client library: N worker threads,
 * each with its own connection, stream M requests in all; prints throughput, time to first
 * token, inter-token and end-to-end latency percentiles, and the gRPC codes seen.
 * Not here: the shared flags (client_flags.c), the calls (clients/), the bench drivers that
 * compare peers (tools/). Exit codes and messages: commands.h.
 * Tests: tests/test_client.sh (against a real `shardlm serve`). */
#include "commands.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_flags.h"

#define N_GRPC_CODES 17

struct samples {
    double *v;  /* (cap), n of them */
    size_t  n, cap;
};

static int samples_push(struct samples *s, double x)
{
    if (base_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return -1;
    s->v[s->n++] = x;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const struct samples *s, double p)
{
    if (!s->n) return NAN;
    size_t k = (size_t)ceil(p / 100.0 * (double)s->n);
    if (k < 1) k = 1;
    return s->v[k - 1];
}

struct bench {
    struct common_flags cf;
    struct client_request req;  /* shared, read-only */
    int n_requests;
    atomic_int next;            /* the next request to start */
};

struct bench_worker {
    struct bench *b;
    pthread_t thread;
    int started;
    /* results of this worker's requests */
    struct samples ttft, itl;   /* seconds */
    long ok, completion_tokens, prompt_tokens;
    long errors[N_GRPC_CODES + 1];  /* by gRPC code; the last: outside the known codes */
    char first_error[N_GRPC_CODES + 1][256];
    enum status first_status[N_GRPC_CODES + 1];
    int oom;
    /* the request in flight */
    double t_start, t_last;
    int got_first;
};

static int bench_chunk(void *ctx, const struct client_chunk *ch)
{
    struct bench_worker *w = ctx;
    if (ch->n_token_ids <= 0) return 0;
    double t = base_now_s();
    if (!w->got_first) {
        w->got_first = 1;
        if (samples_push(&w->ttft, t - w->t_start)) w->oom = 1;
    } else {
        /* A message with k tokens (a server that batches steps) counts as k gaps. */
        double gap = (t - w->t_last) / ch->n_token_ids;
        for (int i = 0; i < ch->n_token_ids; i++)
            if (samples_push(&w->itl, gap)) w->oom = 1;
    }
    w->t_last = t;
    return 0;
}

static void *bench_worker_run(void *arg)
{
    struct bench_worker *w = arg;
    struct client *c = NULL;
    struct client_result res = {0};
    enum status st = cli_open_client(&w->b->cf, 1, &c);
    for (;;) {
        int i = atomic_fetch_add(&w->b->next, 1);
        if (i >= w->b->n_requests) break;
        int code;
        if (st == STATUS_OK) {
            w->got_first = 0;
            w->t_start = base_now_s();
            enum status rst = client_generate_stream(c, &w->b->req, bench_chunk, w, &res);
            code = res.grpc_code;
            if (rst == STATUS_OK) {
                w->ok++;
                w->prompt_tokens += res.usage.prompt_tokens;
                for (int k = 0; k < res.n_completions; k++)
                    w->completion_tokens += res.completions[k].n_token_ids;
                continue;
            }
            st = rst;
        } else {
            code = N_GRPC_CODES;  /* the client could not even be opened */
        }
        if (code < 0 || code > N_GRPC_CODES) code = N_GRPC_CODES;
        if (!w->errors[code]++) {
            w->first_status[code] = st;
            snprintf(w->first_error[code], sizeof w->first_error[code], "%s", status_message());
        }
        if (c) st = STATUS_OK;  /* a failed request does not stop the worker */
    }
    client_result_free(&res);
    client_close(c);
    return NULL;
}

static void bench_help(FILE *f)
{
    fprintf(f,
            "usage: shardlm bench --server ADDR --concurrency N --requests M [flags]\n"
            "Load generator: N workers, each with a connection of its own, run M streaming\n"
            "requests (GenerateStream) in all, each starting as soon as one finishes. Prints\n"
            "throughput (generated tokens/s, requests/s), time to first token and inter-token\n"
            "latency percentiles, and failures by gRPC status. Exits 1 when a request failed.\n"
            "  --concurrency N        requests in flight at once, [1, 1024] (default 1)\n"
            "  --requests M           requests in all, [1, 10000000] (default 16)\n"
            "  --prompt TEXT          every request's prompt (default \"Once upon a time\")\n"
            SAMPLING_HELP
            "                         (--max-tokens defaults to 64 here)\n"
            COMMON_HELP);
}

static void print_latency(const char *name, struct samples *s)
{
    if (!s->n) {
        printf("%-16s n/a\n", name);
        return;
    }
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    double sum = 0;
    for (size_t i = 0; i < s->n; i++) sum += s->v[i];
    printf("%-16s p50 %8.2f  p90 %8.2f  p99 %8.2f  mean %8.2f  max %8.2f  (%zu samples)\n", name,
           1e3 * percentile(s, 50), 1e3 * percentile(s, 90), 1e3 * percentile(s, 99),
           1e3 * sum / (double)s->n, 1e3 * s->v[s->n - 1], s->n);
}

static int samples_merge(struct samples *dst, const struct samples *src)
{
    for (size_t i = 0; i < src->n; i++)
        if (samples_push(dst, src->v[i])) return -1;
    return 0;
}

int client_bench_main(int argc, char **argv)
{
    const char *cmd = "bench";
    struct bench b = {.cf = {.server = DEFAULT_SERVER}};
    long concurrency = 1, n_requests = 16;
    b.req.prompt = "Once upon a time";
    b.req.sampling.has_max_tokens = 1;
    b.req.sampling.max_tokens = 64;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            bench_help(stdout);
            return 0;
        }
        if ((r = cli_parse_common(cmd, &b.cf, a, v, &used)) || (r = cli_parse_sampling(cmd, &b.req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (strcmp(a, "--concurrency") && strcmp(a, "--requests") && strcmp(a, "--prompt"))
            return cli_usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return cli_usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--prompt")) b.req.prompt = v;
        else if (!strcmp(a, "--concurrency")) {
            if (base_parse_long(v, 1, 1024, &concurrency))
                return cli_usage_error(cmd, "--concurrency must be an integer in [1, 1024], got '%s'", v);
        } else if (base_parse_long(v, 1, 10000000, &n_requests)) {
            return cli_usage_error(cmd, "--requests must be an integer in [1, 10000000], got '%s'", v);
        }
        i += used;
    }
    if (concurrency > n_requests) concurrency = n_requests;
    enum status lst = cli_common_load(&b.cf);
    if (lst != STATUS_OK) return cli_fail(lst);
    b.n_requests = (int)n_requests;
    atomic_init(&b.next, 0);

    struct bench_worker *w = calloc((size_t)concurrency, sizeof *w);
    if (!w) {
        cli_common_free(&b.cf);
        return cli_fail(status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"));
    }
    double t0 = base_now_s();
    for (long i = 0; i < concurrency; i++) {
        w[i].b = &b;
        if (pthread_create(&w[i].thread, NULL, bench_worker_run, &w[i]) == 0) w[i].started = 1;
    }
    /* Workers that could not start leave their share to the others. */
    int any_started = 0;
    for (long i = 0; i < concurrency; i++) {
        if (!w[i].started) continue;
        pthread_join(w[i].thread, NULL);
        any_started = 1;
    }
    double wall = base_now_s() - t0;
    if (!any_started) {
        free(w);
        cli_common_free(&b.cf);
        return cli_fail(status_errorf(STATUS_RESOURCE_EXHAUSTED, "could not start any worker thread"));
    }

    struct samples ttft = {0}, itl = {0};
    long ok = 0, toks = 0, ptoks = 0, errors[N_GRPC_CODES + 1] = {0}, failed = 0;
    int first_code = -1, first_worker = -1, oom = 0;
    for (long i = 0; i < concurrency; i++) {
        ok += w[i].ok;
        toks += w[i].completion_tokens;
        ptoks += w[i].prompt_tokens;
        if (samples_merge(&ttft, &w[i].ttft) || samples_merge(&itl, &w[i].itl) || w[i].oom) oom = 1;
        for (int k = 0; k <= N_GRPC_CODES; k++) {
            errors[k] += w[i].errors[k];
            failed += w[i].errors[k];
            if (w[i].errors[k] && first_code < 0) {
                first_code = k;
                first_worker = (int)i;
            }
        }
    }
    printf("shardlm bench: %s, %d requests, concurrency %ld, prompt %zu bytes, max_tokens %d\n",
           b.cf.server, b.n_requests, concurrency, strlen(b.req.prompt), b.req.sampling.max_tokens);
    printf("%-16s %ld ok, %ld failed in %.3f s (%.2f requests/s)\n", "requests:", ok, failed, wall,
           wall > 0 ? (double)ok / wall : 0.0);
    printf("%-16s %ld generated (%.1f tokens/s), %ld prompt\n", "tokens:", toks,
           wall > 0 ? (double)toks / wall : 0.0, ptoks);
    print_latency("TTFT ms:", &ttft);
    print_latency("inter-token ms:", &itl);
    if (!failed) {
        printf("%-16s none\n", "errors:");
    } else {
        for (int k = 0; k <= N_GRPC_CODES; k++) {
            if (!errors[k]) continue;
            const char *name = k < N_GRPC_CODES ? client_grpc_code_name(k) : "CLIENT";
            for (long i = 0; i < concurrency; i++) {
                if (!w[i].errors[k]) continue;
                printf("%-16s %-20s %ld  (%s)\n", "errors:", name, errors[k], w[i].first_error[k]);
                break;
            }
        }
    }
    if (oom) printf("(some latency samples were lost: out of memory)\n");
    fflush(stdout);
    int rc = 0;
    if (failed) {
        enum status st = w[first_worker].first_status[first_code];
        rc = cli_fail(status_errorf(st, "%ld of %d requests failed; first: %s", failed, b.n_requests,
                                w[first_worker].first_error[first_code]));
    }
    for (long i = 0; i < concurrency; i++) {
        free(w[i].ttft.v);
        free(w[i].itl.v);
    }
    free(w);
    free(ttft.v);
    free(itl.v);
    cli_common_free(&b.cf);
    return rc;
}
