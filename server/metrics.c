/* server/metrics.c - Prometheus counters and histograms, and their text rendering (see
 * metrics.h). Request counters are keyed by (api, status name) in a small table; the engine's
 * numbers are read with engine_get_stats at scrape time, so that both fronts count.
 * Not here: the HTTP route (http.c). Tests: tests/server/test_http.py (metrics). */
#include "metrics.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define METRICS_MAX_STATUSES 24
#define METRICS_MAX_BOUNDS   20

static const char *const api_names[METRICS_API_COUNT] = {"grpc", "http"};

/* Bucket bounds in seconds, vLLM's. */
static const double ttft_bounds[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                     0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
static const double itl_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                    0.3, 0.4, 0.5, 0.75, 1.0, 2.5};
static const double e2e_bounds[] = {0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0,
                                    15.0, 20.0, 30.0, 40.0, 50.0, 60.0};

struct histogram {
    const double *bounds;                   /* (n_bounds) upper bounds, ascending */
    int           n_bounds;
    unsigned long long counts[METRICS_MAX_BOUNDS + 1]; /* per bucket (not cumulative); last: +Inf */
    double        sum;
    unsigned long long count;
};

/* Requests counted by (api, final status name). */
struct status_counts {
    struct {
        enum metrics_api api;
        char status[32];
        unsigned long long n;
    } rows[METRICS_MAX_STATUSES * METRICS_API_COUNT];
    int n_rows;
};

struct metrics {
    pthread_mutex_t mu;
    struct status_counts requests;        /* generation */
    struct histogram ttft, itl, e2e, queue;
    struct status_counts embed_requests;  /* embeddings (both fronts), and what succeeded: */
    unsigned long long embed_inputs[METRICS_API_COUNT], embed_tokens[METRICS_API_COUNT];
};

/* Under mu: one more request of (api, status); a status past the table's room is not counted. */
static void count_status(struct status_counts *c, enum metrics_api api, const char *status)
{
    int i = 0;
    while (i < c->n_rows && !(c->rows[i].api == api && !strcmp(c->rows[i].status, status))) i++;
    if (i == c->n_rows && i < (int)(sizeof c->rows / sizeof *c->rows)) {
        c->rows[i].api = api;
        snprintf(c->rows[i].status, sizeof c->rows[i].status, "%s", status);
        c->rows[i].n = 0;
        c->n_rows++;
    }
    if (i < c->n_rows) c->rows[i].n++;
}

static void histogram_init(struct histogram *h, const double *bounds, int n)
{
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n_bounds = n;
}

static void histogram_observe(struct histogram *h, double v, int times)
{
    int b = 0;
    while (b < h->n_bounds && v > h->bounds[b]) b++;
    h->counts[b] += (unsigned long long)times;
    h->sum += v * times;
    h->count += (unsigned long long)times;
}

struct metrics *metrics_create(void)
{
    struct metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    histogram_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof *ttft_bounds));
    histogram_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof *itl_bounds));
    histogram_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof *e2e_bounds));
    histogram_init(&m->queue, e2e_bounds, (int)(sizeof e2e_bounds / sizeof *e2e_bounds));
    return m;
}

void metrics_free(struct metrics *m)
{
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void metrics_observe_request(struct metrics *m, enum metrics_api api, const char *status, double ttft_s,
                             double e2e_s, double queue_s)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    count_status(&m->requests, api, status);
    if (ttft_s >= 0) histogram_observe(&m->ttft, ttft_s, 1);
    histogram_observe(&m->e2e, e2e_s, 1);
    if (queue_s >= 0) histogram_observe(&m->queue, queue_s, 1);
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_embed(struct metrics *m, enum metrics_api api, const char *status, int n_inputs, int n_tokens)
{
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    count_status(&m->embed_requests, api, status);
    if (!strcmp(status, "OK")) {
        m->embed_inputs[api] += (unsigned long long)n_inputs;
        m->embed_tokens[api] += (unsigned long long)n_tokens;
    }
    pthread_mutex_unlock(&m->mu);
}

void metrics_observe_itl(struct metrics *m, double gap_s, int n)
{
    if (!m || n <= 0 || gap_s < 0) return;
    pthread_mutex_lock(&m->mu);
    histogram_observe(&m->itl, gap_s / n, n);
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ----------------------------------------------------------------------------- */

struct text {
    char  *p;
    size_t len, cap;
    int    failed;
    int    expert_family_done; /* its HELP / TYPE went out (several models share the family) */
};

static void text_printf(struct text *t, const char *fmt, ...)
{
    if (t->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p ? t->p + t->len : NULL, t->p ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if (t->p && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        if (base_grow((void **)&t->p, &t->cap, t->len + (size_t)n + 4096, 1)) {
            t->failed = 1;
            return;
        }
    }
}

static void render_family(struct text *t, const char *name, const char *type, const char *help)
{
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void render_status_counts(struct text *t, const char *name, const char *help, const struct status_counts *c)
{
    render_family(t, name, "counter", help);
    for (int i = 0; i < c->n_rows; i++)
        text_printf(t, "%s{api=\"%s\",status=\"%s\"} %llu\n", name, api_names[c->rows[i].api], c->rows[i].status,
                    c->rows[i].n);
}

/* A counter with one value per API. */
static void render_per_api(struct text *t, const char *name, const char *help, const unsigned long long *v)
{
    render_family(t, name, "counter", help);
    for (int a = 0; a < METRICS_API_COUNT; a++) text_printf(t, "%s{api=\"%s\"} %llu\n", name, api_names[a], v[a]);
}

static void render_histogram(struct text *t, const char *name, const char *help, const struct histogram *h)
{
    render_family(t, name, "histogram", help);
    unsigned long long cum = 0;
    for (int b = 0; b < h->n_bounds; b++) {
        cum += h->counts[b];
        text_printf(t, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[b], cum);
    }
    cum += h->counts[h->n_bounds];
    text_printf(t, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name, cum, name, h->sum, name, h->count);
}

/* The `model` label of model i ("" with one model), with a trailing comma when more follow. */
static void model_label(const struct metrics_model *ms, int n, int i, int more, char *out, size_t cap)
{
    if (n <= 1) snprintf(out, cap, "%s", "");
    else snprintf(out, cap, "model=\"%s\"%s", ms[i].id, more ? "," : "");
}

/* The engines' numbers: gauges now and counters since start, summed over replicas, then per
 * replica when there are several; one series per model (label `model`) when there are several. */
static void render_engines(struct text *t, const struct metrics_model *ms, int n_models)
{
    enum { N_ROWS = 25 };
    struct row {
        const char *name, *type, *help;
        double v;
    };
    struct row all[SERVER_METRICS_MAX_MODELS][N_ROWS];
    for (int i = 0; i < n_models; i++) {
        struct engine *e = ms[i].engine;
        struct engine_stats st;
        memset(&st, 0, sizeof st);
        if (e) engine_get_stats(e, &st);
        struct row rows[] = {
            {"shardlm_num_requests_waiting", "gauge", "Samples waiting to be scheduled.", st.waiting},
            {"shardlm_num_requests_running", "gauge", "Samples running in the engine.", st.running},
            {"shardlm_kv_blocks_total", "gauge", "KV cache blocks in the pool.", st.kv_blocks_total},
            {"shardlm_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
             st.kv_blocks_total - st.kv_blocks_free - st.kv_blocks_cached},
            {"shardlm_kv_blocks_cached", "gauge", "Free KV blocks that keep a reusable prompt prefix.", st.kv_blocks_cached},
            {"shardlm_kv_cache_usage_perc", "gauge", "Fraction of KV blocks held by sequences (0..1).",
             st.kv_blocks_total ? (double)(st.kv_blocks_total - st.kv_blocks_free - st.kv_blocks_cached) / st.kv_blocks_total
                                : 0.0},
            {"shardlm_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", (double)st.prompt_tokens},
            {"shardlm_generation_tokens_total", "counter", "Generated tokens.", (double)st.generated_tokens},
            {"shardlm_prefix_cache_hit_tokens_total", "counter", "Prompt tokens served from the prefix cache.",
             (double)st.prefix_cache_hit_tokens},
            {"shardlm_prefill_tokens_computed_total", "counter", "Prompt tokens run through the model.",
             (double)st.prefill_tokens_computed},
            {"shardlm_num_preemptions_total", "counter", "Sequences preempted (recomputed later).", (double)st.preemptions},
            {"shardlm_engine_steps_total", "counter", "Engine steps.", (double)st.steps},
            {"shardlm_spec_decode_num_draft_tokens_total", "counter", "Speculative draft tokens verified.",
             (double)st.spec_drafted},
            {"shardlm_spec_decode_num_accepted_tokens_total", "counter", "Speculative draft tokens accepted.",
             (double)st.spec_accepted},
            {"shardlm_spec_decode_num_lookup_draft_tokens_total", "counter",
             "Of the draft tokens verified, those prompt lookup drafted (beside a draft model: --spec-ngram).",
             (double)st.spec_lookup_drafted},
            {"shardlm_spec_decode_num_lookup_accepted_tokens_total", "counter",
             "Of the draft tokens accepted, those prompt lookup drafted.", (double)st.spec_lookup_accepted},
            {"shardlm_spec_decode_num_corpus_draft_tokens_total", "counter",
             "Of the draft tokens verified, those the speculative corpus drafted (--spec-corpus, --spec-corpus-learn).",
             (double)st.spec_corpus_drafted},
            {"shardlm_spec_decode_num_corpus_accepted_tokens_total", "counter",
             "Of the draft tokens accepted, those the speculative corpus drafted.", (double)st.spec_corpus_accepted},
            {"shardlm_spec_corpus_tokens", "gauge",
             "Tokens in the speculative corpus: the given file's and those learned from served answers (--spec-corpus-learn).",
             (double)st.spec_corpus_tokens},
            {"shardlm_spec_decode_num_backoffs_total", "counter",
             "Times a sequence stopped drafting for low acceptance (the adaptive rule).", (double)st.spec_backoffs},
            {"shardlm_prefix_cache_verified_total", "counter",
             "Prompts served from the prefix cache and recomputed without it (--verify-prefix-cache).",
             (double)st.prefix_cache_verified},
            {"shardlm_prefix_cache_mismatch_total", "counter",
             "Verified prompts whose logits differed from the recomputation (argmax, or by more than 1e-3).",
             (double)st.prefix_cache_mismatches},
            {"shardlm_prefix_cache_verify_skipped_total", "counter",
             "Sampled prompts not verified (no free KV blocks, or more than 8 in one step).",
             (double)st.prefix_cache_verify_skipped},
            {"shardlm_prefix_cache_max_abs_diff", "gauge", "Largest logit difference a verification found.",
             st.prefix_cache_max_abs_diff},
            {"shardlm_embedding_passes_total", "counter",
             "Embedding forward passes; one holds the inputs of one or more concurrent requests.", (double)st.embed_passes},
        };
        _Static_assert(sizeof rows / sizeof *rows == N_ROWS, "N_ROWS");
        memcpy(all[i], rows, sizeof rows);
    }
    char label[300];
    for (int r = 0; r < N_ROWS; r++) {
        render_family(t, all[0][r].name, all[0][r].type, all[0][r].help);
        for (int i = 0; i < n_models; i++) {
            model_label(ms, n_models, i, 0, label, sizeof label);
            text_printf(t, "%s%s%s%s %.17g\n", all[i][r].name, *label ? "{" : "", label, *label ? "}" : "", all[i][r].v);
        }
    }
    int any_replicas = 0;
    for (int i = 0; i < n_models; i++) any_replicas |= ms[i].engine && engine_replicas(ms[i].engine) > 1;
    if (!any_replicas) return;
    static const char *const names[2] = {"shardlm_replica_num_requests_running", "shardlm_replica_kv_blocks_used"};
    static const char *const helps[2] = {"Samples running, per data-parallel replica.",
                                         "KV blocks held, per data-parallel replica."};
    for (int f = 0; f < 2; f++) {
        render_family(t, names[f], "gauge", helps[f]);
        for (int i = 0; i < n_models; i++) {
            struct engine *e = ms[i].engine;
            model_label(ms, n_models, i, 1, label, sizeof label);
            for (int r = 0; e && r < engine_replicas(e); r++) {
                struct engine_replica_stats rs;
                engine_get_replica_stats(e, r, &rs);
                text_printf(t, "%s{%sreplica=\"%d\"} %d\n", names[f], label, r,
                            f == 0 ? rs.engine.running
                                   : rs.engine.kv_blocks_total - rs.engine.kv_blocks_free - rs.engine.kv_blocks_cached);
            }
        }
    }
}

/* A mixture of experts: the tokens routed to each expert of each layer (engine_get_expert_load:
 * rank 0's pipeline stage and replica); nothing for a dense model. */
static void render_expert_load(struct text *t, struct engine *e, const char *label)
{
    struct engine_expert_load el;
    if (engine_get_expert_load(e, &el) != STATUS_OK) {
        t->failed = 1;
        return;
    }
    if (el.n_layers > 0) {
        if (!t->expert_family_done)
            render_family(t, "shardlm_moe_expert_tokens_total", "counter",
                          "Tokens routed to each expert of each mixture-of-experts layer (k per token and layer).");
        t->expert_family_done = 1;
        for (int l = 0; l < el.n_layers; l++)
            for (int x = 0; x < el.n_experts; x++)
                text_printf(t, "shardlm_moe_expert_tokens_total{%slayer=\"%d\",expert=\"%d\"} %llu\n", label,
                            el.layer_first + l,
                            x, (unsigned long long)el.load[(size_t)l * (size_t)el.n_experts + (size_t)x]);
    }
    free(el.load);
}

enum status metrics_render(struct metrics *m, const struct metrics_model *models, int n_models, char **out,
                           size_t *len)
{
    struct text t = {0};
    *out = NULL;
    *len = 0;
    CHECK(n_models >= 1 && n_models <= SERVER_METRICS_MAX_MODELS, "metrics_render: %d models", n_models);
    render_engines(&t, models, n_models);
    render_family(&t, "shardlm_model_loaded", "gauge",
                  "1 when the model is loaded, 0 when it is not (serve --models-max, --sleep-idle-seconds).");
    for (int i = 0; i < n_models; i++)
        text_printf(&t, "shardlm_model_loaded{model=\"%s\"} %d\n", models[i].id, models[i].engine != NULL);
    for (int i = 0; i < n_models; i++) {
        char label[300];
        model_label(models, n_models, i, 1, label, sizeof label);
        if (models[i].engine) render_expert_load(&t, models[i].engine, label);
    }
    if (m) {
        pthread_mutex_lock(&m->mu);
        render_status_counts(&t, "shardlm_requests_total",
                             "Generation requests by API and final status (gRPC code names).", &m->requests);
        render_histogram(&t, "shardlm_time_to_first_token_seconds", "Time from arrival to the first token.", &m->ttft);
        render_histogram(&t, "shardlm_inter_token_latency_seconds", "Time between tokens of a request.", &m->itl);
        render_histogram(&t, "shardlm_e2e_request_latency_seconds", "Time from arrival to the end of a request.",
                         &m->e2e);
        render_histogram(&t, "shardlm_request_queue_time_seconds",
                         "Time from arrival to the first step in the engine (the first sample's admission).", &m->queue);
        render_status_counts(&t, "shardlm_embedding_requests_total",
                             "Embedding requests (/v1/embeddings, Embed) by API and final status (gRPC code names).",
                             &m->embed_requests);
        render_per_api(&t, "shardlm_embedding_inputs_total", "Inputs of the embedding requests that succeeded.",
                       m->embed_inputs);
        render_per_api(&t, "shardlm_embedding_tokens_total",
                       "Tokens of the embedding requests that succeeded (special tokens included; also in "
                       "shardlm_prompt_tokens_total).", m->embed_tokens);
        pthread_mutex_unlock(&m->mu);
    }
    if (t.failed || !t.p) {
        free(t.p);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory rendering the metrics");
    }
    *out = t.p;
    *len = t.len;
    return STATUS_OK;
}
