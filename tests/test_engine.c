/* tests/test_engine.c - the serving engine on the real stories260K model (CPU): continuous
 * batching gives each request exactly the tokens it gets alone (greedy and seeded sampling),
 * preemption under a tiny KV pool, prefix caching, cancellation, deadlines, n > 1 samples,
 * stop strings across token boundaries, UTF-8 split across byte tokens, prompt log-probabilities
 * against the NumPy reference, validation errors, queue limits, and the engine thread.
 * usage: test_engine DATA_DIR (the golden fixture's directory; SKIP when stories260K is absent)
 * Prints one line per check and "N passed, M failed". */
#include <cjson/cJSON.h>
#include <stdarg.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "parallel.h"
#include "request.h"
#include "tokenizer.h"

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *what, const char *fmt, ...)
{
    char detail[512] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, *detail ? ": " : "", detail);
}

/* What the callback collected for one request. */
#define MAXS 4
struct result {
    int32_t tokens[MAXS][600];
    int     n_tokens[MAXS];
    char    text[MAXS][8192];
    size_t  text_len[MAXS];
    float   logprobs[MAXS][600];
    int     finished[MAXS];
    enum finish_reason why[MAXS];
    int     bad_utf8;
    float   prompt_lp[600];
    int     n_prompt_lp;
    int     events;
};

static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!len || i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++)
            if ((s[i + (size_t)k] & 0xC0) != 0x80) return 0;
        i += (size_t)len;
    }
    return 1;
}

static pthread_mutex_t cb_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cb_cv = PTHREAD_COND_INITIALIZER;

static void on_event(void *ctx, const struct engine_event *ev)
{
    struct result *r = ctx;
    pthread_mutex_lock(&cb_mu);
    r->events++;
    int s = ev->sample;
    if (ev->kind == ENGINE_EVENT_PROMPT_LOGPROBS) {
        for (int i = 0; i < ev->n_tokens && i < 600; i++) r->prompt_lp[i] = ev->logprobs[i];
        r->n_prompt_lp = ev->n_tokens;
    } else if (s < MAXS) {
        for (int i = 0; i < ev->n_tokens && r->n_tokens[s] < 600; i++) {
            if (ev->logprobs) r->logprobs[s][r->n_tokens[s]] = ev->logprobs[i];
            r->tokens[s][r->n_tokens[s]++] = ev->tokens[i];
        }
        if (ev->text_len && !valid_utf8((const unsigned char *)ev->text, ev->text_len)) r->bad_utf8++;
        if (ev->text_len && r->text_len[s] + ev->text_len < sizeof r->text[s]) {
            memcpy(r->text[s] + r->text_len[s], ev->text, ev->text_len);
            r->text_len[s] += ev->text_len;
            r->text[s][r->text_len[s]] = 0;
        }
        if (ev->kind == ENGINE_EVENT_FINISHED) {
            r->finished[s]++;
            r->why[s] = ev->finish;
        }
    }
    pthread_cond_broadcast(&cb_cv);
    pthread_mutex_unlock(&cb_mu);
}

static int run_until_idle(struct engine *e)
{
    int steps = 0;
    while (engine_step(e) > 0 && steps < 100000) steps++;
    return steps;
}

static struct request_params greedy(int max_tokens)
{
    struct request_params p = request_params_default();
    p.sampling.temperature = 0;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    return p;
}

static int pool_whole(struct engine *e)
{
    struct engine_stats st;
    engine_get_stats(e, &st);
    return st.kv_blocks_free + st.kv_blocks_cached == st.kv_blocks_total && st.running == 0 && st.waiting == 0;
}

/* A deterministic prompt of n tokens: BOS then the reference story's tokens shifted by seed. */
static void make_prompt(int32_t *out, int n, int seed)
{
    out[0] = 1;
    for (int i = 1; i < n; i++) out[i] = 3 + (int32_t)((i * 37 + seed * 101) % 500);
}

static struct engine_options engine_opts(const char *dir, int kv_blocks, int max_seqs, int max_batch, int prefix)
{
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.kv_cache_blocks = kv_blocks;
    o.max_seqs = max_seqs;
    o.max_batch_tokens = max_batch;
    o.prefix_caching = prefix;
    o.block_tokens = 16;
    return o;
}

static struct engine *open_engine(const char *dir, int kv_blocks, int max_seqs, int max_batch, int prefix)
{
    const struct engine_options o = engine_opts(dir, kv_blocks, max_seqs, max_batch, prefix);
    struct engine *e = NULL;
    enum status st = engine_create(&o, &e);
    if (st != STATUS_OK) printf("engine_create: %s: %s\n", status_name(st), status_message());
    return e;
}

/* 64 requests with mixed prompt lengths, max_tokens and sampling, alone then all together. */
static void test_batch_invariance(const char *dir, int kv_blocks, const char *what)
{
    enum { N = 64 };
    static struct result alone[N], together[N];
    static int32_t prompts[N][200];
    struct request_params ps[N];
    int lens[N];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N; i++) {
        lens[i] = 1 + (i * 29) % 150;
        make_prompt(prompts[i], lens[i], i);
        ps[i] = greedy(4 + (i * 13) % 40);
        if (i % 2) { /* seeded sampling for half of them */
            ps[i].sampling.temperature = 0.8f;
            ps[i].sampling.top_p = 0.95f;
            ps[i].sampling.seed = 1000 + (uint64_t)i;
            ps[i].has_seed = 1;
        }
    }
    struct engine *e = open_engine(dir, 0, 64, 256, 1);
    if (!e) { check(0, what, "engine"); return; }
    uint64_t h;
    for (int i = 0; i < N; i++) {
        engine_submit(e, NULL, prompts[i], lens[i], &ps[i], on_event, &alone[i], &h);
        run_until_idle(e);
    }
    engine_free(e);

    e = open_engine(dir, kv_blocks, 64, 256, 1);
    if (!e) { check(0, what, "engine"); return; }
    int ok_submit = 1;
    for (int i = 0; i < N; i++)
        ok_submit &= engine_submit(e, NULL, prompts[i], lens[i], &ps[i], on_event, &together[i], &h) == STATUS_OK;
    run_until_idle(e);
    struct engine_stats st;
    engine_get_stats(e, &st);
    int same = 0, finished = 0;
    for (int i = 0; i < N; i++) {
        finished += together[i].finished[0] == 1 && alone[i].finished[0] == 1;
        same += together[i].n_tokens[0] == alone[i].n_tokens[0] && together[i].n_tokens[0] == ps[i].max_tokens &&
                !memcmp(together[i].tokens[0], alone[i].tokens[0], sizeof(int32_t) * (size_t)alone[i].n_tokens[0]) &&
                !strcmp(together[i].text[0], alone[i].text[0]);
    }
    check(ok_submit && same == N && finished == N, what, "%d of %d identical, %d finished once, %llu steps, %llu preemptions",
          same, N, finished, (unsigned long long)st.steps, (unsigned long long)st.preemptions);
    if (kv_blocks) check(st.preemptions > 0, "the small pool forced preemptions", "%llu", (unsigned long long)st.preemptions);
    check(pool_whole(e), "every KV block back in the pool", "free %d cached %d of %d", st.kv_blocks_free,
          st.kv_blocks_cached, st.kv_blocks_total);
    engine_free(e);
}

static void test_prefix_cache(const char *dir)
{
    static struct result a, b, c;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b); memset(&c, 0, sizeof c);
    int32_t p1[300], p2[300];
    make_prompt(p1, 300, 7);
    memcpy(p2, p1, sizeof p2);
    p2[290] = 9; /* shares the first 290 tokens */
    struct request_params p = greedy(20);
    uint64_t h;
    struct engine *e = open_engine(dir, 0, 8, 512, 1);
    struct engine_stats s0, s1, s2;
    engine_submit(e, NULL, p1, 300, &p, on_event, &a, &h);
    run_until_idle(e);
    engine_get_stats(e, &s0);
    engine_submit(e, NULL, p2, 300, &p, on_event, &b, &h);
    run_until_idle(e);
    engine_get_stats(e, &s1);
    uint64_t computed = s1.prefill_tokens_computed - s0.prefill_tokens_computed;
    check(computed == 300 - 288 && s1.prefix_cache_hit_tokens - s0.prefix_cache_hit_tokens == 288,
          "prefix cache: the second request skips its shared prefill", "computed %llu prompt tokens, %llu from the cache",
          (unsigned long long)computed, (unsigned long long)(s1.prefix_cache_hit_tokens - s0.prefix_cache_hit_tokens));
    engine_free(e);
    e = open_engine(dir, 0, 8, 512, 0);
    engine_submit(e, NULL, p2, 300, &p, on_event, &c, &h);
    run_until_idle(e);
    engine_get_stats(e, &s2);
    check(b.n_tokens[0] == 20 && !memcmp(b.tokens[0], c.tokens[0], sizeof(int32_t) * 20),
          "prefix cache: same tokens as without the cache", "%d tokens", b.n_tokens[0]);
    check(s2.prefill_tokens_computed == 300, "without prefix caching every prompt token is computed", "%llu",
          (unsigned long long)s2.prefill_tokens_computed);
    engine_free(e);
}

static void test_cancel_deadline(const char *dir)
{
    static struct result a, b, c;
    memset(&a, 0, sizeof a); memset(&b, 0, sizeof b); memset(&c, 0, sizeof c);
    int32_t p[40];
    make_prompt(p, 40, 3);
    struct request_params g = greedy(400);
    uint64_t ha, hb, hc;
    struct engine *e = open_engine(dir, 0, 8, 256, 1);
    engine_submit(e, "cancel-me", p, 40, &g, on_event, &a, &ha);
    engine_submit(e, NULL, p, 40, &g, on_event, &b, &hb);
    struct request_params d = g;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    d.deadline = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec - 1.0; /* already past */
    engine_submit(e, NULL, p, 40, &d, on_event, &c, &hc);
    for (int i = 0; i < 10; i++) engine_step(e);
    struct engine_stats mid;
    engine_get_stats(e, &mid);
    check(engine_cancel_id(e, "cancel-me") == STATUS_OK, "cancel by request id", "%s", "");
    check(engine_cancel(e, hb) == STATUS_OK, "cancel by handle", "%s", "");
    check(engine_cancel_id(e, "no-such-request") == STATUS_NOT_FOUND, "cancel of an unknown id is NOT_FOUND", "%s", "");
    run_until_idle(e);
    check(a.finished[0] == 1 && a.why[0] == FINISH_REASON_CANCELLED && a.n_tokens[0] > 0 && a.n_tokens[0] < 400,
          "cancel mid-generation finishes with CANCELLED", "%d tokens, reason %s", a.n_tokens[0], finish_reason_name(a.why[0]));
    check(b.finished[0] == 1 && b.why[0] == FINISH_REASON_CANCELLED, "second cancel", "%s", "");
    check(c.finished[0] == 1 && c.why[0] == FINISH_REASON_DEADLINE && c.n_tokens[0] == 0,
          "a request past its deadline finishes with DEADLINE", "%s", finish_reason_name(c.why[0]));
    struct engine_stats st;
    engine_get_stats(e, &st);
    check(mid.kv_blocks_free < mid.kv_blocks_total && pool_whole(e), "cancelled requests return their blocks",
          "free %d cached %d of %d", st.kv_blocks_free, st.kv_blocks_cached, st.kv_blocks_total);
    engine_free(e);
}

static void test_samples(const char *dir)
{
    static struct result one, many;
    memset(&one, 0, sizeof one); memset(&many, 0, sizeof many);
    int32_t p[21];
    make_prompt(p, 21, 5);
    struct request_params s = greedy(30);
    s.sampling.temperature = 1.0f;
    s.sampling.seed = 42;
    s.has_seed = 1;
    uint64_t h;
    struct engine *e = open_engine(dir, 0, 8, 256, 1);
    engine_submit(e, NULL, p, 21, &s, on_event, &one, &h);
    run_until_idle(e);
    s.n = 4;
    engine_submit(e, NULL, p, 21, &s, on_event, &many, &h);
    run_until_idle(e);
    int all = 1, distinct = 0;
    for (int k = 0; k < 4; k++) all &= many.finished[k] == 1 && many.n_tokens[k] == 30;
    for (int k = 1; k < 4; k++) distinct += memcmp(many.tokens[k], many.tokens[0], sizeof(int32_t) * 30) != 0;
    check(all, "n = 4: every sample finishes with its 30 tokens", "%s", "");
    check(!memcmp(many.tokens[0], one.tokens[0], sizeof(int32_t) * 30), "n = 4: sample 0 equals the n = 1 request with the same seed", "%s", "");
    check(distinct >= 2, "n = 4: samples differ from each other", "%d of 3 differ from sample 0", distinct);
    check(pool_whole(e), "n = 4: shared and copied blocks all return", "%s", "");
    engine_free(e);
}

static void test_stops_and_text(const char *dir, const struct tokenizer *tok)
{
    static struct result full, stopped, idstop, utf;
    memset(&full, 0, sizeof full); memset(&stopped, 0, sizeof stopped);
    memset(&idstop, 0, sizeof idstop); memset(&utf, 0, sizeof utf);
    int32_t bos = 1;
    uint64_t h;
    struct engine *e = open_engine(dir, 0, 8, 256, 1);
    struct request_params g = greedy(60);
    engine_submit(e, NULL, &bos, 1, &g, on_event, &full, &h);
    run_until_idle(e);
    char *dec = NULL;
    size_t dlen = 0;
    tokenizer_decode(tok, full.tokens[0], full.n_tokens[0], &dec, &dlen);
    check(full.bad_utf8 == 0 && dec && !strcmp(dec, full.text[0]), "streamed text equals the decode of the tokens",
          "%.60s...", full.text[0]);
    free(dec);
    /* "little gi" spans the pieces of "little" and "girl". */
    const char *stop[] = {"never appears", "little gi"};
    struct request_params s = g;
    s.stop = stop;
    s.n_stop = 2;
    engine_submit(e, NULL, &bos, 1, &s, on_event, &stopped, &h);
    run_until_idle(e);
    const char *want = "Once upon a time, there was a ";
    check(stopped.why[0] == FINISH_REASON_STOP && !strcmp(stopped.text[0], want),
          "a stop string across token boundaries ends the text before it", "'%s' (%s)", stopped.text[0],
          finish_reason_name(stopped.why[0]));
    struct request_params t = g;
    int32_t stop_id = full.tokens[0][5];
    t.stop_token_ids = &stop_id;
    t.n_stop_token_ids = 1;
    engine_submit(e, NULL, &bos, 1, &t, on_event, &idstop, &h);
    run_until_idle(e);
    check(idstop.why[0] == FINISH_REASON_STOP && idstop.n_tokens[0] == 6, "a stop token id ends generation", "%d tokens",
          idstop.n_tokens[0]);
    /* Only the three byte pieces of U+20AC may be sampled: every emitted chunk must still be
     * valid UTF-8 and the whole must equal the decode (with U+FFFD for broken sequences). */
    int32_t ids[3] = {tokenizer_piece_to_id(tok, "<0xE2>"), tokenizer_piece_to_id(tok, "<0x82>"),
                      tokenizer_piece_to_id(tok, "<0xAC>")};
    float bias[3] = {100, 100, 100};
    int runs_ok = 1, with_euro = 0, runs = 0;
    for (uint64_t seed = 1; seed <= 40 && !with_euro; seed++, runs++) {
        memset(&utf, 0, sizeof utf);
        struct request_params u = g;
        u.sampling.temperature = 10.0f; /* near-uniform over the three biased pieces ... */
        u.sampling.top_k = 3;           /* ... and nothing else */
        u.sampling.seed = seed;
        u.has_seed = 1;
        u.logit_bias_ids = ids;
        u.logit_bias_values = bias;
        u.n_logit_bias = 3;
        engine_submit(e, NULL, &bos, 1, &u, on_event, &utf, &h);
        run_until_idle(e);
        int only_bytes = 1;
        for (int i = 0; i < utf.n_tokens[0]; i++)
            only_bytes &= utf.tokens[0][i] == ids[0] || utf.tokens[0][i] == ids[1] || utf.tokens[0][i] == ids[2];
        tokenizer_decode(tok, utf.tokens[0], utf.n_tokens[0], &dec, &dlen);
        runs_ok &= ids[0] >= 0 && only_bytes && utf.bad_utf8 == 0 && dec && !strcmp(dec, utf.text[0]);
        with_euro += dec && strstr(dec, "\xE2\x82\xAC") != NULL;
        free(dec);
        dec = NULL;
    }
    check(runs_ok && with_euro, "UTF-8 split across byte tokens: chunks stay valid, text equals the decode",
          "%d runs of 60 byte tokens, a complete U+20AC in %d", runs, with_euro);
    /* A first token with no text yet (a lead byte): nothing is held, and under UBSan releasing
     * nothing from a sample that never held text must not pass NULL to memmove (found by a soak). */
    static struct result lead;
    memset(&lead, 0, sizeof lead);
    struct request_params l = greedy(1);
    l.logit_bias_ids = ids;
    l.logit_bias_values = bias;
    l.n_logit_bias = 1;
    engine_submit(e, NULL, &bos, 1, &l, on_event, &lead, &h);
    run_until_idle(e);
    check(lead.finished[0] == 1 && lead.n_tokens[0] == 1 && lead.tokens[0][0] == ids[0] && lead.bad_utf8 == 0,
          "a sample whose only token is a lead byte finishes", "%d tokens, text '%s'", lead.n_tokens[0], lead.text[0]);
    engine_free(e);
}

static void test_prompt_logprobs(const char *dir, const char *ref_path)
{
    FILE *f = fopen(ref_path, "rb");
    if (!f) { check(0, "prompt logprobs", "no %s", ref_path); return; }
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *ref = cJSON_Parse(buf);
    const cJSON *gen = cJSON_GetObjectItem(ref, "generated_ids"), *steps = cJSON_GetObjectItem(ref, "logits_step");
    int n_steps = cJSON_GetArraySize(steps);
    int32_t prompt[8];
    prompt[0] = 1;
    for (int i = 1; i <= n_steps && i < 8; i++) prompt[i] = (int32_t)cJSON_GetArrayItem(gen, i - 1)->valuedouble;
    int np = n_steps + 1 < 8 ? n_steps + 1 : 8;
    static struct result r;
    memset(&r, 0, sizeof r);
    struct request_params p = greedy(0);
    p.prompt_logprobs = 0;
    uint64_t h;
    struct engine *e = open_engine(dir, 0, 8, 256, 1);
    enum status st = engine_submit(e, NULL, prompt, np, &p, on_event, &r, &h);
    run_until_idle(e);
    /* Reference: log_softmax of the NumPy logits at step i, at the next prompt token. */
    double worst = 0;
    for (int i = 0; i + 1 < np; i++) {
        const cJSON *lg = cJSON_GetArrayItem(steps, i);
        int V = cJSON_GetArraySize(lg);
        double mx = -1e300, sum = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, cJSON_GetArrayItem(lg, j)->valuedouble);
        for (int j = 0; j < V; j++) sum += exp(cJSON_GetArrayItem(lg, j)->valuedouble - mx);
        double want = cJSON_GetArrayItem(lg, prompt[i + 1])->valuedouble - mx - log(sum);
        worst = fmax(worst, fabs(want - r.prompt_lp[i + 1]));
    }
    check(st == STATUS_OK && r.n_prompt_lp == np && worst < 1e-4 && r.finished[0] == 1 && r.n_tokens[0] == 0 &&
              r.why[0] == FINISH_REASON_LENGTH,
          "max_tokens 0 scores the prompt: log-probabilities match NumPy", "%d tokens, max |diff| %.2g", r.n_prompt_lp, worst);
    /* The chosen tokens' logprobs of a greedy generation equal the prompt logprobs of the same
     * sequence scored afterwards. */
    static struct result g1, g2;
    memset(&g1, 0, sizeof g1); memset(&g2, 0, sizeof g2);
    struct request_params q = greedy(10);
    q.logprobs = 3;
    engine_submit(e, NULL, prompt, 1, &q, on_event, &g1, &h);
    run_until_idle(e);
    int32_t seq[11];
    seq[0] = 1;
    memcpy(seq + 1, g1.tokens[0], 10 * sizeof *seq);
    engine_submit(e, NULL, seq, 11, &p, on_event, &g2, &h);
    run_until_idle(e);
    double d = 0;
    for (int i = 0; i < 10; i++) d = fmax(d, fabs(g1.logprobs[0][i] - g2.prompt_lp[i + 1]));
    check(d < 1e-4, "generated-token logprobs equal prompt logprobs of the same text", "max |diff| %.2g", d);
    engine_free(e);
    cJSON_Delete(ref);
}

static void test_validation(const char *dir)
{
    struct engine *e = open_engine(dir, 16, 4, 64, 1);
    int32_t ok_prompt[3] = {1, 2, 3}, bad_prompt[2] = {1, 9999};
    struct { const char *name; struct request_params p; const int32_t *prompt; int n; const char *needle; } cases[] = {
        {"empty prompt", greedy(4), ok_prompt, 0, "prompt"},
        {"token id outside the vocabulary", greedy(4), bad_prompt, 2, "vocabulary"},
        {"negative max_tokens", greedy(-1), ok_prompt, 3, "max_tokens"},
        {"beyond the context", greedy(600), ok_prompt, 3, "context"},
        {"beyond the KV pool", greedy(300), ok_prompt, 3, "KV"},
        {"negative temperature", greedy(4), ok_prompt, 3, "temperature"},
        {"top_p 0", greedy(4), ok_prompt, 3, "top_p"},
        {"negative top_k", greedy(4), ok_prompt, 3, "top_k"},
        {"n 0", greedy(4), ok_prompt, 3, "n must"},
        {"logprobs too many", greedy(4), ok_prompt, 3, "logprobs"},
        {"min_tokens above max_tokens", greedy(4), ok_prompt, 3, "min_tokens"},
    };
    cases[5].p.sampling.temperature = -1;
    cases[6].p.sampling.top_p = 0;
    cases[7].p.sampling.top_k = -2;
    cases[8].p.n = 0;
    cases[9].p.logprobs = 999;
    cases[10].p.min_tokens = 5;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t h;
        enum status st = engine_submit(e, NULL, cases[i].prompt, cases[i].n, &cases[i].p, on_event, NULL, &h);
        check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), cases[i].needle), cases[i].name, "%s: %s",
              status_name(st), status_message());
    }
    /* A queue of 4 (max_queue defaults to 1024; reopen with 2). */
    engine_free(e);
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.max_queue = 2;
    o.kv_cache_blocks = 64;
    engine_create(&o, &e);
    static struct result q[3];
    memset(q, 0, sizeof q);
    uint64_t h;
    struct request_params g = greedy(2);
    enum status s1 = engine_submit(e, NULL, ok_prompt, 3, &g, on_event, &q[0], &h);
    enum status s2 = engine_submit(e, NULL, ok_prompt, 3, &g, on_event, &q[1], &h);
    enum status s3 = engine_submit(e, NULL, ok_prompt, 3, &g, on_event, &q[2], &h);
    check(s1 == STATUS_OK && s2 == STATUS_OK && s3 == STATUS_RESOURCE_EXHAUSTED && strstr(status_message(), "queue"),
          "a full queue refuses with RESOURCE_EXHAUSTED", "%s", status_message());
    run_until_idle(e);
    check(q[0].finished[0] && q[1].finished[0] && !q[2].events, "accepted requests complete, the refused one gets no events", "%s", "");
    engine_free(e);

    /* The queue counts samples, as stats.waiting does: n = 3 then n = 2 overflow a queue of 4,
     * n = 1 still fits, and n may not exceed the queue. */
    o.max_queue = 4;
    engine_create(&o, &e);
    static struct result qs[3];
    memset(qs, 0, sizeof qs);
    struct request_params g3 = greedy(2), g2 = greedy(2), g1 = greedy(2), g5 = greedy(2);
    g3.n = 3, g2.n = 2, g5.n = 5;
    g3.sampling.temperature = g2.sampling.temperature = 0.8f;
    s1 = engine_submit(e, NULL, ok_prompt, 3, &g3, on_event, &qs[0], &h);
    s2 = engine_submit(e, NULL, ok_prompt, 3, &g2, on_event, &qs[1], &h);
    check(s1 == STATUS_OK && s2 == STATUS_RESOURCE_EXHAUSTED && strstr(status_message(), "3 samples waiting + 2 asked"),
          "the queue counts samples", "%s: %s", status_name(s2), status_message());
    struct engine_stats qst;
    engine_get_stats(e, &qst);
    check(qst.waiting == 3, "stats.waiting counts the request's samples", "%d", qst.waiting);
    s3 = engine_submit(e, NULL, ok_prompt, 3, &g1, on_event, &qs[2], &h);
    check(s3 == STATUS_OK, "a sample that fits is taken", "%s", status_message());
    enum status s5 = engine_validate(e, ok_prompt, 3, &g5);
    check(s5 == STATUS_INVALID_ARGUMENT && strstr(status_message(), "sampling.n must be in [1, 4]"),
          "n is bounded by the queue", "%s", status_message());
    run_until_idle(e);
    check(qs[0].finished[2] && qs[2].finished[0] && !qs[1].events, "the accepted requests complete", "%s", "");
    engine_free(e);
}

/* The KV pool sized as a fraction of free memory, and the range check. */
static void test_kv_fraction(const char *dir)
{
    {
        struct engine *fresh = open_engine(dir, 64, 4, 64, 1);
        struct engine_stats s0;
        engine_get_stats(fresh, &s0);
        check(s0.kv_blocks_free == 64 && s0.kv_blocks_total == 64, "stats before the first step: every block free",
              "%d of %d", s0.kv_blocks_free, s0.kv_blocks_total);
        engine_free(fresh);
    }
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.kv_cache_fraction = 0.001;
    struct engine *e = NULL;
    enum status st = engine_create(&o, &e);
    struct engine_stats s = {0};
    static struct result r;
    memset(&r, 0, sizeof r);
    if (st == STATUS_OK) {
        engine_get_stats(e, &s);
        int32_t p[5];
        make_prompt(p, 5, 9);
        struct request_params g = greedy(8);
        uint64_t h;
        engine_submit(e, NULL, p, 5, &g, on_event, &r, &h);
        run_until_idle(e);
    }
    check(st == STATUS_OK && s.kv_blocks_total > 0 && r.n_tokens[0] == 8, "KV pool from 0.1% of free memory",
          "%d blocks", s.kv_blocks_total);
    engine_free(e);
    o.kv_cache_fraction = 2.0;
    e = NULL;
    st = engine_create(&o, &e);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "kv_cache_fraction"), "a fraction above 0.95 is refused",
          "%s", status_message());
    engine_free(e);
    /* A top-n beyond what a token's log-probabilities hold (a library caller's option). */
    o = engine_options_default();
    o.model_dir = dir;
    o.max_logprobs = REQUEST_MAX_TOP_LOGPROBS + 1;
    e = NULL;
    st = engine_create(&o, &e);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "max_logprobs must be at most 64"),
          "max_logprobs 65 is refused", "%s", status_message());
    engine_free(e);
    /* Speculation's knobs, for callers that do not go through the CLI's checks. */
    o = engine_options_default();
    o.model_dir = dir;
    o.spec_draft = 4;
    o.spec_p_min = 1.5f;
    e = NULL;
    st = engine_create(&o, &e);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "spec_p_min must be in [0, 1]"),
          "spec_p_min 1.5 is refused", "%s", status_message());
    engine_free(e);
    o.spec_p_min = 0.0f;
    o.spec_ngram = 2;
    o.spec_ngram_min = 3;
    e = NULL;
    st = engine_create(&o, &e);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "spec_ngram_min"),
          "spec_ngram_min above spec_ngram is refused", "%s", status_message());
    engine_free(e);
}

struct waiter { struct result r; };

static void test_thread(const char *dir)
{
    static struct result rs[8];
    memset(rs, 0, sizeof rs);
    /* One CPU thread, fewer than the cores: the ops on the engine thread must size their teams
     * by the backend, not by OpenMP's per-thread default (a scratch overflow under ASan once). */
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.n_threads = 1;
    o.max_seqs = 8;
    o.max_batch_tokens = 256;
    struct engine *e = NULL;
    engine_create(&o, &e);
    engine_start(e);
    int32_t p[10];
    make_prompt(p, 10, 11);
    struct request_params g = greedy(25);
    uint64_t h;
    for (int i = 0; i < 8; i++) engine_submit(e, NULL, p, 10, &g, on_event, &rs[i], &h);
    pthread_mutex_lock(&cb_mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    int done = 0;
    while (done < 8) {
        done = 0;
        for (int i = 0; i < 8; i++) done += rs[i].finished[0];
        if (done < 8 && pthread_cond_timedwait(&cb_cv, &cb_mu, &until) != 0) break;
    }
    pthread_mutex_unlock(&cb_mu);
    int same = 0;
    for (int i = 0; i < 8; i++) same += rs[i].n_tokens[0] == 25 && !memcmp(rs[i].tokens[0], rs[0].tokens[0], 25 * sizeof(int32_t));
    check(done == 8 && same == 8, "engine thread: 8 concurrent requests complete identically", "%d done", done);
    /* Draining refuses new work and lets running requests finish. */
    static struct result late;
    memset(&late, 0, sizeof late);
    engine_submit(e, NULL, p, 10, &g, on_event, &late, &h);
    engine_drain(e, 30.0);
    enum status st = engine_submit(e, NULL, p, 10, &g, on_event, &late, &h);
    check(late.finished[0] == 1 && late.why[0] == FINISH_REASON_LENGTH && st == STATUS_UNAVAILABLE,
          "drain finishes running work, then refuses with UNAVAILABLE", "%s", status_name(st));
    engine_free(e);
}

/* Waits (up to 120 s) until every sample of rs[0..n) finished; returns how many requests did. */
static int wait_finished(struct result *rs, const struct request_params *ps, int n)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 120;
    int done = 0;
    pthread_mutex_lock(&cb_mu);
    for (;;) {
        done = 0;
        for (int i = 0; i < n; i++) {
            int all = 1;
            for (int k = 0; k < ps[i].n; k++) all &= rs[i].finished[k] > 0;
            done += all;
        }
        if (done == n || pthread_cond_timedwait(&cb_cv, &cb_mu, &until) != 0) break;
    }
    pthread_mutex_unlock(&cb_mu);
    return done;
}

/* Data parallelism on rank 0: every replica served some of the requests, and a prompt seen
 * before goes back to the replica that served it (prefix-aware routing, hitting its cache). */
static void check_routing(struct engine *e, const char *dir)
{
    (void)dir;
    const int dp = engine_replicas(e);
    struct engine_replica_stats rs[8];
    int idle = 0;
    for (int d = 0; d < dp && d < 8; d++) {
        engine_get_replica_stats(e, d, &rs[d]);
        idle += rs[d].routed == 0;
    }
    check(dp > 1 && idle == 0, "data parallelism: every replica got requests", "%d replicas, %d idle", dp, idle);
    enum { P = 4 };
    static struct result first[P], again[P];
    memset(first, 0, sizeof first);
    memset(again, 0, sizeof again);
    struct request_params g = greedy(4);
    int same_replica = 0, same_tokens = 0;
    uint64_t by_prefix0 = 0, by_prefix1 = 0;
    for (int d = 0; d < dp && d < 8; d++) by_prefix0 += rs[d].routed_by_prefix;
    for (int i = 0; i < P; i++) {
        int32_t prompt[64];
        make_prompt(prompt, 64, 900 + i);
        uint64_t h, before[8], after[8], after2[8];
        struct engine_replica_stats x;
        for (int d = 0; d < dp && d < 8; d++) engine_get_replica_stats(e, d, &x), before[d] = x.routed;
        engine_submit(e, NULL, prompt, 64, &g, on_event, &first[i], &h);
        wait_finished(&first[i], &g, 1);
        for (int d = 0; d < dp && d < 8; d++) engine_get_replica_stats(e, d, &x), after[d] = x.routed;
        engine_submit(e, NULL, prompt, 64, &g, on_event, &again[i], &h);
        wait_finished(&again[i], &g, 1);
        for (int d = 0; d < dp && d < 8; d++) engine_get_replica_stats(e, d, &x), after2[d] = x.routed;
        int ok = 1;
        for (int d = 0; d < dp && d < 8; d++) ok &= after2[d] - after[d] == after[d] - before[d];
        same_replica += ok;
        same_tokens += again[i].n_tokens[0] == 4 && !memcmp(again[i].tokens[0], first[i].tokens[0], 4 * sizeof(int32_t));
    }
    for (int d = 0; d < dp && d < 8; d++) {
        engine_get_replica_stats(e, d, &rs[d]);
        by_prefix1 += rs[d].routed_by_prefix;
    }
    check(same_replica == P && by_prefix1 - by_prefix0 >= P && same_tokens == P,
          "a repeated prompt goes back to the replica holding its prefix", "%d of %d, %llu routed by prefix",
          same_replica, P, (unsigned long long)(by_prefix1 - by_prefix0));
    /* The same prompts with a cache salt: their blocks cannot be reused (the replicas' caches key
     * them by the salt too), so the router does not route them by prefix. */
    struct request_params salted = greedy(4);
    salted.cache_salt = "another salt";
    uint64_t by_prefix2 = 0;
    for (int i = 0; i < P; i++) {
        int32_t prompt[64];
        uint64_t h;
        make_prompt(prompt, 64, 900 + i);
        memset(&again[i], 0, sizeof again[i]);
        engine_submit(e, NULL, prompt, 64, &salted, on_event, &again[i], &h);
        wait_finished(&again[i], &salted, 1);
    }
    for (int d = 0; d < dp && d < 8; d++) {
        engine_get_replica_stats(e, d, &rs[d]);
        by_prefix2 += rs[d].routed_by_prefix;
    }
    check(by_prefix2 == by_prefix1, "a salted prompt is not routed by an unsalted prefix",
          "%llu routed by prefix", (unsigned long long)(by_prefix2 - by_prefix1));

    /* Cancellation reaches every replica: one long request per replica (the least loaded takes
     * each), cancelled by handle and by request id once tokens flow. */
    uint64_t h0;
    enum { C = 4 };
    static struct result cancelled[C];
    memset(cancelled, 0, sizeof cancelled);
    struct request_params longp = greedy(250);
    uint64_t hs[C];
    char id[32];
    for (int i = 0; i < C; i++) {
        int32_t prompt[8];
        make_prompt(prompt, 8, 950 + i);
        snprintf(id, sizeof id, "cancel-me-%d", i);
        engine_submit(e, id, prompt, 8, &longp, on_event, &cancelled[i], &hs[i]);
    }
    /* Each is cancelled as soon as its tokens flow (waiting for all four first let a fast one
     * finish its 250 tokens on a loaded machine: a flake seen under ctest -j2). */
    int ok_calls = 0, sent[C] = {0}, n_sent = 0;
    for (int t = 0; t < 4000 && n_sent < C; t++) {
        struct timespec ts = {0, 500 * 1000};
        nanosleep(&ts, NULL);
        for (int i = 0; i < C; i++) {
            pthread_mutex_lock(&cb_mu);
            const int flows = cancelled[i].n_tokens[0] > 0;
            pthread_mutex_unlock(&cb_mu);
            if (sent[i] || !flows) continue;
            snprintf(id, sizeof id, "cancel-me-%d", i);
            ok_calls += (i % 2 ? engine_cancel_id(e, id) : engine_cancel(e, hs[i])) == STATUS_OK;
            sent[i] = 1, n_sent++;
        }
    }
    wait_finished(cancelled, (struct request_params[C]){longp, longp, longp, longp}, C);
    int n_cancelled = 0;
    for (int i = 0; i < C; i++)
        n_cancelled += cancelled[i].finished[0] == 1 && cancelled[i].why[0] == FINISH_REASON_CANCELLED &&
                       cancelled[i].n_tokens[0] < 250;
    check(ok_calls == C && n_cancelled == C, "cancel by handle and by id reaches every replica",
          "%d calls ok, %d of %d cancelled early", ok_calls, n_cancelled, C);
    check(engine_cancel(e, hs[0]) == STATUS_NOT_FOUND, "cancelling a finished request: NOT_FOUND", "%s", "");

    /* Balance beats the prefix beyond a margin: 12 requests sharing one prefix, all at once,
     * spill over to the other replicas once the prefix's replica is max_seqs / 4 busier. */
    enum { B = 12 };
    static struct result burst[B];
    memset(burst, 0, sizeof burst);
    struct request_params bp[B];
    uint64_t before[8], got_min = UINT64_MAX;
    struct engine_replica_stats x;
    for (int d = 0; d < dp && d < 8; d++) engine_get_replica_stats(e, d, &x), before[d] = x.routed;
    for (int i = 0; i < B; i++) {
        int32_t prompt[64];
        make_prompt(prompt, 64, 900); /* the first prompt of the prefix test above */
        bp[i] = greedy(40);
        engine_submit(e, NULL, prompt, 64, &bp[i], on_event, &burst[i], &h0);
    }
    int done = wait_finished(burst, bp, B);
    for (int d = 0; d < dp && d < 8; d++) {
        engine_get_replica_stats(e, d, &x);
        if (x.routed - before[d] < got_min) got_min = x.routed - before[d];
    }
    check(done == B && got_min > 0, "a burst on one prefix spreads over every replica past the margin",
          "%d done, least-routed replica got %llu of %d", done, (unsigned long long)got_min, B);
}

/* Under mpirun: a dp x tp x pp engine (rank 0 conducting or routing, the others replaying step
 * plans or leading a replica) gives every request exactly the tokens a one-rank engine in the
 * same process gives. */
static int run_multi_rank(const char *dir, int tp, int pp, int dp, int *argc, char ***argv)
{
    struct parallel_world *w = NULL;
    enum status st = parallel_init(argc, argv, &w);
    if (st != STATUS_OK) {
        printf("FAIL parallel_init: %s\n", status_message());
        return 1;
    }
    enum { N = 24 };
    static struct result alone[N], together[N];
    static int32_t prompts[N][120];
    struct request_params ps[N];
    int lens[N];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N; i++) {
        lens[i] = 1 + (i * 37) % 110;
        make_prompt(prompts[i], lens[i], i);
        ps[i] = greedy(3 + (i * 11) % 30);
        if (i % 3 == 1) {
            ps[i].sampling.temperature = 0.9f;
            ps[i].sampling.seed = 500 + (uint64_t)i;
            ps[i].has_seed = 1;
        }
        if (i % 8 == 5) ps[i].n = 3; /* forks: block copies must reach the workers */
    }
    uint64_t h;
    if (w->rank == 0) { /* the reference: one rank, alone */
        struct engine *e = open_engine(dir, 0, 16, 128, 1);
        for (int i = 0; e && i < N; i++) {
            engine_submit(e, NULL, prompts[i], lens[i], &ps[i], on_event, &alone[i], &h);
            run_until_idle(e);
        }
        engine_free(e);
    }
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.max_seqs = 16;
    o.max_batch_tokens = 128;
    o.kv_cache_blocks = 48; /* small: preemption under multi-rank too */
    o.world = w;
    o.tp = tp;
    o.pp = pp;
    o.dp = dp;
    o.pp_microbatches = pp > 1 ? 3 : 1; /* pipelined steps: micro-batches of the step's sequences */
    struct engine *e = NULL;
    st = engine_create(&o, &e);
    check(st == STATUS_OK, "multi-rank engine_create", "%s", status_message());
    if (st == STATUS_OK && engine_is_conductor(e)) {
        if (dp > 1) engine_start(e); /* replicas run on their own threads and ranks */
        for (int i = 0; i < N; i++) engine_submit(e, NULL, prompts[i], lens[i], &ps[i], on_event, &together[i], &h);
        if (dp > 1) wait_finished(together, ps, N);
        else run_until_idle(e);
        int same = 0;
        for (int i = 0; i < N; i++) {
            int ok = 1;
            for (int k = 0; k < ps[i].n; k++)
                ok &= together[i].finished[k] == 1 && together[i].n_tokens[k] == alone[i].n_tokens[k] &&
                      !memcmp(together[i].tokens[k], alone[i].tokens[k], sizeof(int32_t) * (size_t)alone[i].n_tokens[k]);
            same += ok;
        }
        struct engine_stats s;
        engine_get_stats(e, &s);
        check(same == N, "dp x tp x pp engine gives each request the one-rank tokens",
              "dp %d tp %d pp %d: %d of %d, %llu preemptions", dp, tp, pp, same, N, (unsigned long long)s.preemptions);
        if (dp > 1) check_routing(e, dir);
        int whole = pool_whole(e);
        for (int i = 0; i < 40 && !whole; i++) { /* remote replicas report every 0.2 s */
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
            whole = pool_whole(e);
        }
        check(whole, "multi-rank: every KV block back in the pool", "%s", "");
    } else if (st == STATUS_OK) {
        st = engine_run_worker(e);
        check(st == STATUS_OK, "worker replays the conductor's plans until told to stop", "%s", status_message());
    }
    engine_free(e);
    parallel_finalize(w);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

/* Speculative decoding inside the engine (docs/speculative.md), under ASan in `make test`: 8
 * greedy requests (two of n = 2) with prompt lookup and with the model as its own draft (at least
 * 95 % of its drafts accepted, so requests end inside a verification, the last sample's request
 * freed there)
 * give the tokens of the engine without speculation, with drafts verified and the pool whole. */
static void test_speculation(const char *dir)
{
    enum { N = 8 };
    static struct result base[N], spec[N];
    static int32_t prompts[N][64];
    struct request_params ps[N];
    for (int i = 0; i < N; i++) {
        make_prompt(prompts[i], 8 + 7 * i, 50 + i);
        ps[i] = greedy(20 + 9 * i);
        ps[i].n = i < 2 ? 2 : 1;
    }
    memset(base, 0, sizeof base);
    struct engine *e = open_engine(dir, 0, 16, 256, 1);
    if (!e) { check(0, "speculation", "engine"); return; }
    uint64_t h;
    for (int i = 0; i < N; i++) engine_submit(e, NULL, prompts[i], 8 + 7 * i, &ps[i], on_event, &base[i], &h);
    run_until_idle(e);
    engine_free(e);
    for (int arm = 0; arm < 2; arm++) {
        const char *what = arm ? "the model as its own draft" : "prompt lookup";
        struct engine_options o = engine_opts(dir, 0, 16, 256, 1);
        o.spec_draft = 4;
        o.spec_max_batch = 16;
        if (arm) o.draft_model_dir = dir;
        setenv("SHARDLM_SPEC_PRIOR", "0", 1); /* every sequence drafts */
        e = NULL;
        enum status st = engine_create(&o, &e);
        unsetenv("SHARDLM_SPEC_PRIOR");
        if (st != STATUS_OK) { check(0, what, "engine_create: %s", status_message()); continue; }
        memset(spec, 0, sizeof spec);
        for (int i = 0; i < N; i++) engine_submit(e, NULL, prompts[i], 8 + 7 * i, &ps[i], on_event, &spec[i], &h);
        run_until_idle(e);
        struct engine_stats es;
        engine_get_stats(e, &es);
        int same = 0;
        for (int i = 0; i < N; i++)
            for (int k = 0; k < ps[i].n; k++)
                same += spec[i].finished[k] == 1 && spec[i].n_tokens[k] == base[i].n_tokens[k] &&
                        spec[i].n_tokens[k] == ps[i].max_tokens &&
                        !memcmp(spec[i].tokens[k], base[i].tokens[k], sizeof(int32_t) * (size_t)base[i].n_tokens[k]);
        check(same == N + 2 && es.spec_drafted > 0 && (!arm || 20 * es.spec_accepted >= 19 * es.spec_drafted), what,
              "%d of %d samples identical to no speculation, %llu drafts verified, %llu accepted", same, N + 2,
              (unsigned long long)es.spec_drafted, (unsigned long long)es.spec_accepted);
        check(pool_whole(e), "every KV block back in the pool after speculation", "free %d cached %d of %d",
              es.kv_blocks_free, es.kv_blocks_cached, es.kv_blocks_total);
        engine_free(e);
    }
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 8 && !strcmp(argv[1], "--tp")) { /* test_engine --tp T --pp P --dp D DATA */
        char dir[2048];
        snprintf(dir, sizeof dir, "%s/stories260K", argv[7]);
        if (access(dir, R_OK) != 0) {
            printf("SKIP: test_engine: no stories260K at %s (no shared assets)\n", dir);
            return 77;
        }
        return run_multi_rank(dir, atoi(argv[2]), atoi(argv[4]), atoi(argv[6]), &argc, &argv);
    }
    if (argc < 2) {
        fprintf(stderr, "usage: test_engine DATA_DIR\n");
        return 2;
    }
    char dir[2048], ref[2100], tokpath[2200];
    snprintf(dir, sizeof dir, "%s/stories260K", argv[1]);
    snprintf(ref, sizeof ref, "%s/stories260K_ref.json", argv[1]);
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.model", dir);
    if (access(tokpath, R_OK) != 0 || access(ref, R_OK) != 0) {
        printf("SKIP: test_engine: no stories260K at %s (no shared assets)\n", dir);
        return 77;
    }
    struct tokenizer *tok = NULL;
    tokenizer_load(tokpath, &tok);
    test_batch_invariance(dir, 0, "64 requests together give the tokens each gives alone");
    test_batch_invariance(dir, 40, "the same with a KV pool far too small (40 blocks)");
    test_prefix_cache(dir);
    test_cancel_deadline(dir);
    test_samples(dir);
    test_stops_and_text(dir, tok);
    test_prompt_logprobs(dir, ref);
    test_validation(dir);
    test_kv_fraction(dir);
    test_thread(dir);
    test_speculation(dir);
    tokenizer_free(tok);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
