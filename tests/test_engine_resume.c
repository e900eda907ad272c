/* tests/test_engine_resume.c - resuming a journaled sample (request_params.resume_*, the engine
 * half of streams that survive a restart, docs/reliability.md) on the real stories260K model:
 * a seeded, sampled request (top-p, a repetition penalty, a stop string) is run whole, then
 * resumed from several cut points with the tokens it had generated and the RNG state of its
 * event there; each resumption must give exactly the rest of the whole run's tokens, text and
 * finish reason, alone and inside a busy batch; sample 1 of an n = 2 request resumes from its
 * own start (engine_sample_rng); bad resumptions are refused.
 * usage: test_engine_resume DATA_DIR (SKIP when stories260K is absent). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"

#define MAXT 400

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

/* One sample's events: its tokens, the text after each token, the RNG state after each. */
struct run {
    int32_t  tokens[MAXT];
    size_t   text_at[MAXT + 1];  /* text bytes emitted once tokens[0..i) were taken */
    uint64_t rng[MAXT][4];
    int      n;
    char     text[16384];
    size_t   text_len;
    enum finish_reason why;
    int      finished, completion_tokens;
};
struct pair { struct run s[2]; };

static void on_event(void *ctx, const struct engine_event *ev)
{
    struct pair *p = ctx;
    if (ev->kind == ENGINE_EVENT_PROMPT_LOGPROBS || ev->sample > 1) return;
    struct run *r = &p->s[ev->sample];
    if (ev->text_len && r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    for (int i = 0; i < ev->n_tokens && r->n < MAXT; i++) {
        r->tokens[r->n] = ev->tokens[i];
        if (ev->rng) memcpy(r->rng[r->n], ev->rng, sizeof r->rng[0]);
        r->text_at[++r->n] = r->text_len;
    }
    if (ev->kind == ENGINE_EVENT_FINISHED) {
        r->finished++;
        r->why = ev->finish;
        r->completion_tokens = ev->completion_tokens;
    }
}

static void run_until_idle(struct engine *e)
{
    for (int steps = 0; engine_step(e) > 0 && steps < 100000; steps++) {}
}

static struct engine *open_engine(const char *dir)
{
    struct engine_options o = engine_options_default();
    o.model_dir = dir;
    o.max_seqs = 16;
    o.max_batch_tokens = 256;
    o.prefix_caching = 1;
    o.block_tokens = 16;
    struct engine *e = NULL;
    if (engine_create(&o, &e) != STATUS_OK) printf("engine_create: %s\n", status_message());
    return e;
}

static const char *const STOPS[] = {"went to the park"};

static struct request_params sampled(int max_tokens, int with_stop)
{
    struct request_params p = request_params_default();
    p.sampling.temperature = 0.9f;
    p.sampling.top_p = 0.95f;
    p.sampling.repetition_penalty = 1.1f;
    p.sampling.seed = 20261128;
    p.has_seed = 1;
    p.max_tokens = max_tokens;
    if (with_stop) p.stop = STOPS, p.n_stop = 1;
    return p;
}

/* Resumes sample `sample` of `whole` after its first k tokens (with `busy` other requests in the
 * batch) and checks the rest against the whole run. */
static void check_resume(struct engine *e, const int32_t *prompt, int n_prompt, struct request_params p,
                         const struct run *whole, int sample, int k, int busy)
{
    uint64_t start[4], h;
    engine_sample_rng(p.sampling.seed, sample, start);
    p.n = 1;
    p.resume_tokens = whole->tokens;
    p.n_resume = k;
    p.resume_rng = k ? whole->rng[k - 1] : start;
    static struct pair got, noise[8];
    memset(&got, 0, sizeof got);
    memset(noise, 0, sizeof noise);
    struct request_params q = sampled(40, 0);
    for (int i = 0; i < busy && i < 8; i++) {
        q.sampling.seed = 7 + (uint64_t)i;
        engine_submit(e, NULL, prompt, n_prompt - i, &q, on_event, &noise[i], &h);
    }
    enum status st = engine_submit(e, NULL, prompt, n_prompt, &p, on_event, &got, &h);
    run_until_idle(e);
    const struct run *r = &got.s[0];
    int rest = whole->n - k;
    int same = st == STATUS_OK && r->n == rest && !memcmp(r->tokens, whole->tokens + k, (size_t)rest * sizeof *r->tokens);
    size_t skip = whole->text_at[k];
    int same_text = r->text_len == whole->text_len - skip && !memcmp(r->text, whole->text + skip, r->text_len);
    char what[160];
    snprintf(what, sizeof what, "sample %d resumed after %d of %d tokens%s", sample, k, whole->n,
             busy ? " in a busy batch" : "");
    check(same && same_text && r->finished == 1 && r->why == whole->why && r->completion_tokens == whole->n, what,
          "%d tokens (want %d), text %zu bytes (want %zu), finish %s (want %s), completion_tokens %d", r->n, rest,
          r->text_len, whole->text_len - skip, finish_reason_name(r->why), finish_reason_name(whole->why),
          r->completion_tokens);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        fprintf(stderr, "usage: test_engine_resume DATA_DIR\n");
        return 2;
    }
    char dir[2048], tokpath[2100];
    snprintf(dir, sizeof dir, "%s/stories260K", argv[1]);
    snprintf(tokpath, sizeof tokpath, "%s/tokenizer.model", dir);
    if (access(tokpath, R_OK) != 0) {
        printf("SKIP: test_engine_resume: no stories260K at %s (no shared assets)\n", dir);
        return 77;
    }
    struct engine *e = open_engine(dir);
    if (!e) return 1;
    int32_t prompt[24];
    prompt[0] = 1;
    for (int i = 1; i < 24; i++) prompt[i] = 3 + (int32_t)((i * 37 + 11) % 400);
    uint64_t h;

    /* A long sampled run, n = 2, and one that a stop string ends. */
    static struct pair whole, stopped;
    struct request_params p = sampled(300, 0);
    p.n = 2;
    engine_submit(e, NULL, prompt, 24, &p, on_event, &whole, &h);
    run_until_idle(e);
    check(whole.s[0].n == 300 && whole.s[1].n == 300, "the whole runs generate 300 tokens each", "%d, %d",
          whole.s[0].n, whole.s[1].n);
    struct request_params ps = sampled(300, 1);
    for (uint64_t seed = 1; seed < 60 && stopped.s[0].why != FINISH_REASON_STOP; seed++) {
        memset(&stopped, 0, sizeof stopped);
        ps.sampling.seed = seed;
        engine_submit(e, NULL, prompt, 24, &ps, on_event, &stopped, &h);
        run_until_idle(e);
    }
    check(stopped.s[0].why == FINISH_REASON_STOP, "a seed whose sample a stop string ends", "seed %llu, %d tokens",
          (unsigned long long)ps.sampling.seed, stopped.s[0].n);

    p.n = 1;
    const int cuts[] = {0, 1, 17, 150, 299};
    for (int i = 0; i < 5; i++) check_resume(e, prompt, 24, p, &whole.s[0], 0, cuts[i], 0);
    check_resume(e, prompt, 24, p, &whole.s[0], 0, 93, 6);
    check_resume(e, prompt, 24, p, &whole.s[1], 1, 0, 0);
    check_resume(e, prompt, 24, p, &whole.s[1], 1, 211, 3);
    if (stopped.s[0].why == FINISH_REASON_STOP && stopped.s[0].n > 2) {
        check_resume(e, prompt, 24, ps, &stopped.s[0], 0, stopped.s[0].n - 1, 0);
        check_resume(e, prompt, 24, ps, &stopped.s[0], 0, stopped.s[0].n / 2, 2);
    }

    /* Refusals. */
    uint64_t rng[4] = {1, 2, 3, 4};
    struct request_params bad = sampled(10, 0);
    bad.resume_rng = rng;
    bad.resume_tokens = whole.s[0].tokens;
    bad.n_resume = 10;
    enum status st = engine_validate(e, prompt, 24, &bad);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "max_tokens"), "resume_tokens must be fewer than max_tokens",
          "%s", status_message());
    bad.n_resume = 3;
    bad.n = 2;
    st = engine_validate(e, prompt, 24, &bad);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "n = 1"), "a resumed request has one sample", "%s",
          status_message());
    bad.n = 1;
    int32_t wrong[3] = {5, 1 << 20, 6};
    bad.resume_tokens = wrong;
    st = engine_validate(e, prompt, 24, &bad);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "resume_tokens[1]"), "resume tokens outside the vocabulary",
          "%s", status_message());
    bad.resume_rng = NULL;
    st = engine_validate(e, prompt, 24, &bad);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "resume_rng"), "resume tokens without an RNG state", "%s",
          status_message());
    engine_free(e);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
