/* tests/test_client_lib.c ADDR - the C client library (clients/client.h) method by method
 * against a running `shardlm serve` of stories260K at ADDR: GetModelInfo, GetServerStats,
 * Tokenize / Detokenize round trip, unary Generate with n = 2, logprobs and prompt logprobs,
 * unary and streamed Chat, stream = unary, and the four ways to stop a stream (the callback,
 * the cancel flag, client_cancel_calls from another thread, the Cancel method by request id),
 * each leaving the KV pool as it was; Cancel of an unknown id is NOT_FOUND.
 * Run by tests/test_client.sh (which starts the server); not a ctest of its own. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

static int failures;

#define EXPECT(cond, ...)                                                    \
    do {                                                                     \
        if (cond) {                                                          \
            printf("ok   - ");                                               \
        } else {                                                             \
            printf("FAIL - ");                                               \
            failures++;                                                      \
        }                                                                    \
        printf(__VA_ARGS__);                                                 \
        printf("\n");                                                        \
    } while (0)

#define EXPECT_OK(st, what)                                                  \
    EXPECT((st) == STATUS_OK, "%s%s%s%s", what, (st) == STATUS_OK ? "" : ": ", \
           (st) == STATUS_OK ? "" : status_name(st), (st) == STATUS_OK ? "" : status_message())

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (bounded) until no request runs and the free KV blocks are back to `free_blocks`. */
static int wait_idle(struct client *c, int free_blocks)
{
    struct client_server_stats s;
    for (int i = 0; i < 200; i++) {
        if (client_server_stats(c, &s) == STATUS_OK && s.running == 0 && s.waiting == 0 &&
            s.kv_blocks_free + s.kv_blocks_cached >= free_blocks)
            return 1;
        sleep_ms(25);
    }
    return 0;
}

/* A long request: 400 tokens, whatever the model thinks of EOS. */
static struct client_request long_request(void)
{
    struct client_request r = {0};
    r.prompt = "Once upon a time";
    r.sampling.has_max_tokens = 1;
    r.sampling.max_tokens = 400;
    r.sampling.ignore_eos = 1;
    r.sampling.has_temperature = 1;
    r.sampling.temperature = 0.8f;
    return r;
}

struct counter {
    int chunks, tokens, stop_after;
    volatile sig_atomic_t *flag;   /* raised after stop_after chunks, when set */
    struct client *cancel_client;  /* Cancel(request_id) after stop_after chunks, when set */
    enum status cancel_st;
    int cancel_sent;
    int sleep_us;                  /* a slow reader: sleeps this long per chunk */
};

static int count_chunk(void *ctx, const struct client_chunk *ch)
{
    struct counter *k = ctx;
    k->chunks++;
    k->tokens += ch->n_token_ids;
    if (k->sleep_us) usleep((useconds_t)k->sleep_us);
    if (k->stop_after && k->chunks >= k->stop_after) {
        if (k->flag) {
            *k->flag = 1;
            return 0;
        }
        if (k->cancel_client) {
            if (!k->cancel_sent) {
                k->cancel_sent = 1;
                int cancelled = 0;
                k->cancel_st = client_cancel(k->cancel_client, ch->request_id, &cancelled);
                if (k->cancel_st == STATUS_OK && !cancelled) k->cancel_st = STATUS_INTERNAL;
            }
            return 0;
        }
        return 1;  /* the callback itself stops the stream */
    }
    return 0;
}

struct bg_stream {
    struct client *c;
    struct client_request req;
    struct counter k;
    enum status st;
    volatile int started;
};

static int bg_chunk(void *ctx, const struct client_chunk *ch)
{
    struct bg_stream *b = ctx;
    b->started = 1;
    return count_chunk(&b->k, ch);
}

static void *bg_run(void *arg)
{
    struct bg_stream *b = arg;
    b->st = client_generate_stream(b->c, &b->req, bg_chunk, b, NULL);
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_client_lib HOST:PORT\n");
        return 2;
    }
    struct client *c = NULL;
    enum status st = client_open(argv[1], NULL, &c);
    EXPECT_OK(st, "client_open");
    if (st != STATUS_OK) return 1;

    /* ---- GetModelInfo, GetServerStats ---- */
    struct client_model_info mi;
    st = client_model_info(c, &mi);
    EXPECT_OK(st, "GetModelInfo");
    if (st == STATUS_OK) {
        EXPECT(mi.vocab_size == 512 && mi.n_layers == 5 && mi.context_length == 512 && mi.bos_id == 1 &&
                   mi.eos_id == 2 && !strcmp(mi.device, "cpu"),
               "GetModelInfo: stories260K (vocab %d, %d layers, context %d, bos %d, eos %d, %s, %s)",
               mi.vocab_size, mi.n_layers, mi.context_length, mi.bos_id, mi.eos_id, mi.device,
               mi.architecture);
        client_model_info_free(&mi);
    }
    struct client_server_stats s0;
    st = client_server_stats(c, &s0);
    EXPECT_OK(st, "GetServerStats");
    EXPECT(s0.kv_blocks_total > 0, "GetServerStats: %d KV blocks", s0.kv_blocks_total);
    int free0 = s0.kv_blocks_free + s0.kv_blocks_cached;

    /* ---- Tokenize / Detokenize ---- */
    int32_t *ids = NULL;
    int n_ids = 0;
    st = client_tokenize(c, "Once upon a time", -1, &ids, &n_ids);
    EXPECT_OK(st, "Tokenize");
    EXPECT(n_ids > 1 && ids[0] == 1, "Tokenize: %d ids, BOS first (default add_bos)", n_ids);
    char *text = NULL;
    if (st == STATUS_OK) {
        st = client_detokenize(c, ids, n_ids, &text);
        EXPECT(st == STATUS_OK && text && !strcmp(text, "Once upon a time"),
               "Detokenize round trip: '%s'", text ? text : "(null)");
    }
    free(text);
    int32_t no_bos_n = 0, *no_bos = NULL;
    st = client_tokenize(c, "Once upon a time", 0, &no_bos, &no_bos_n);
    EXPECT(st == STATUS_OK && no_bos_n == n_ids - 1, "Tokenize add_bos=0: one id fewer");
    free(no_bos);

    /* ---- unary Generate: n = 2, logprobs, prompt logprobs; stream = unary ---- */
    struct client_request g = {0};
    g.prompt = "Once upon a time";
    g.sampling.has_max_tokens = 1;
    g.sampling.max_tokens = 12;
    g.sampling.has_temperature = 1;
    g.sampling.temperature = 0.7f;
    g.sampling.has_seed = 1;
    g.sampling.seed = 42;
    g.sampling.has_n = 1;
    g.sampling.n = 2;
    g.sampling.has_logprobs = 1;
    g.sampling.logprobs = 3;
    g.sampling.has_prompt_logprobs = 1;
    g.sampling.prompt_logprobs = 0;
    struct client_result u = {0}, sr = {0};
    st = client_generate(c, &g, &u);
    EXPECT_OK(st, "Generate n=2");
    if (st == STATUS_OK) {
        EXPECT(u.n_completions == 2, "Generate n=2: %d completions", u.n_completions);
        for (int i = 0; i < u.n_completions; i++) {
            const struct client_completion *cp = &u.completions[i];
            EXPECT(cp->index == i && cp->n_token_ids == 12 && cp->n_logprobs == 12 &&
                       cp->logprobs[0].n_top == 3 && cp->finish_reason == CLIENT_FINISH_REASON_LENGTH &&
                       strlen(cp->text) == cp->text_len && cp->text_len > 0,
                   "Generate sample %d: 12 tokens, 12 logprobs with 3 alternatives, length", i);
        }
        EXPECT(u.n_prompt_logprobs == n_ids, "Generate: %d prompt logprobs for %d prompt tokens",
               u.n_prompt_logprobs, n_ids);
        EXPECT(u.usage.prompt_tokens == n_ids && u.seed == 42, "Generate: usage and seed");
        EXPECT(u.request_id && !strncmp(u.request_id, "req-", 4), "Generate: request id '%s'",
               u.request_id ? u.request_id : "(null)");
    }
    struct counter k = {0};
    st = client_generate_stream(c, &g, count_chunk, &k, &sr);
    EXPECT_OK(st, "GenerateStream n=2");
    if (st == STATUS_OK && u.n_completions == 2 && sr.n_completions == 2) {
        int same = 1;
        for (int i = 0; i < 2; i++) {
            same &= sr.completions[i].text_len == u.completions[i].text_len &&
                    !memcmp(sr.completions[i].text, u.completions[i].text, u.completions[i].text_len) &&
                    sr.completions[i].n_token_ids == u.completions[i].n_token_ids &&
                    !memcmp(sr.completions[i].token_ids, u.completions[i].token_ids,
                            sizeof(int32_t) * (size_t)u.completions[i].n_token_ids) &&
                    sr.completions[i].n_logprobs == 12;
        }
        EXPECT(same, "GenerateStream accumulates to the unary result (both samples, same seed)");
        EXPECT(k.tokens == 24, "GenerateStream: %d chunks carried %d tokens", k.chunks, k.tokens);
        EXPECT(sr.usage.completion_tokens == 24 && sr.usage.prompt_tokens == n_ids,
               "GenerateStream usage: %d prompt, %d completion", sr.usage.prompt_tokens,
               sr.usage.completion_tokens);
    }
    client_result_free(&u);
    client_result_free(&sr);

    /* ---- Chat, unary and streamed ---- */
    struct client_message msgs[] = {
        {"system", "You tell short stories."},
        {"user", "Tell me about a cat."},
    };
    struct client_request ch = {0};
    ch.messages = msgs;
    ch.n_messages = 2;
    ch.sampling.has_max_tokens = 1;
    ch.sampling.max_tokens = 16;
    ch.sampling.has_temperature = 1;
    ch.sampling.temperature = 0;
    st = client_generate(c, &ch, &u);
    EXPECT_OK(st, "Chat");
    st = client_generate_stream(c, &ch, NULL, NULL, &sr);
    EXPECT_OK(st, "ChatStream");
    if (u.n_completions == 1 && sr.n_completions == 1)
        EXPECT(u.completions[0].n_token_ids > 0 && !strcmp(u.completions[0].text, sr.completions[0].text),
               "ChatStream equals Chat at temperature 0: '%s'", u.completions[0].text);
    else
        EXPECT(0, "Chat and ChatStream each return one completion");
    client_result_free(&u);
    client_result_free(&sr);
    struct client_message bad_role[] = {{"robot", "hi"}};
    ch.messages = bad_role;
    ch.n_messages = 1;
    st = client_generate(c, &ch, &u);
    EXPECT(st == STATUS_INVALID_ARGUMENT && u.grpc_code == 3, "Chat with role 'robot': INVALID_ARGUMENT (%s)",
           status_message());
    client_result_free(&u);

    /* ---- stopping a stream, four ways; each frees the request's KV blocks ---- */
    struct client_request lr = long_request();
    k = (struct counter){.stop_after = 3};
    st = client_generate_stream(c, &lr, count_chunk, &k, &sr);
    EXPECT(st == STATUS_CANCELLED && sr.grpc_code == 1 && k.chunks == 3,
           "callback returning 1 cancels the stream after %d chunks (%s)", k.chunks, status_name(st));
    EXPECT(sr.n_completions == 1 && sr.completions[0].n_token_ids == k.tokens,
           "the cancelled stream's result holds what arrived (%d tokens)", k.tokens);
    EXPECT(wait_idle(c, free0), "KV blocks freed after the callback's cancel");

    volatile sig_atomic_t flag = 0;
    lr.cancel_flag = &flag;
    k = (struct counter){.stop_after = 2, .flag = &flag};
    st = client_generate_stream(c, &lr, count_chunk, &k, &sr);
    EXPECT(st == STATUS_CANCELLED && k.tokens < 400, "cancel_flag cancels the stream (%s, %d tokens)",
           status_name(st), k.tokens);
    EXPECT(wait_idle(c, free0), "KV blocks freed after the flag's cancel");
    lr.cancel_flag = NULL;

    struct bg_stream b = {.c = c, .req = long_request()};
    pthread_t t;
    pthread_create(&t, NULL, bg_run, &b);
    for (int i = 0; i < 400 && !b.started; i++) sleep_ms(5);
    client_cancel_calls(c);
    pthread_join(t, NULL);
    EXPECT(b.started && b.st == STATUS_CANCELLED && b.k.tokens < 400,
           "client_cancel_calls from another thread (%s after %d tokens)", status_name(b.st), b.k.tokens);
    EXPECT(wait_idle(c, free0), "KV blocks freed after client_cancel_calls");

    /* Cancel by id, on a second client (another connection). */
    struct client *c2 = NULL;
    st = client_open(argv[1], NULL, &c2);
    EXPECT_OK(st, "client_open (second client)");
    lr = long_request();
    lr.request_id = "client-lib-cancel-me";
    k = (struct counter){.stop_after = 2, .cancel_client = c2};
    st = client_generate_stream(c, &lr, count_chunk, &k, &sr);
    EXPECT(k.cancel_sent && k.cancel_st == STATUS_OK, "Cancel(request_id) from another connection: cancelled");
    EXPECT(st == STATUS_CANCELLED && k.tokens < 400,
           "the stream cancelled by id ends CANCELLED (%s, %d tokens, finish '%s')", status_name(st),
           k.tokens, sr.n_completions ? client_finish_reason_name(sr.completions[0].finish_reason) : "");
    EXPECT(wait_idle(c, free0), "KV blocks freed after Cancel");
    int cancelled = 1;
    st = client_cancel(c2, "no-such-request", &cancelled);
    EXPECT(st == STATUS_NOT_FOUND, "Cancel of an unknown id: NOT_FOUND (%s)", status_name(st));
    client_close(c2);

    /* ---- a deadline per request ----
     * stories260K can write 400 tokens in under 50 ms on a fast CPU, so the reader is made slow
     * (2 ms a chunk, one chunk a token): the deadline must fall before the last chunk is read. */
    lr = long_request();
    lr.timeout_s = 0.05;
    k = (struct counter){.sleep_us = 2000};
    st = client_generate_stream(c, &lr, count_chunk, &k, &sr);
    EXPECT(st == STATUS_DEADLINE_EXCEEDED && sr.grpc_code == 4, "request timeout_s: DEADLINE_EXCEEDED (%s)",
           status_name(st));
    EXPECT(wait_idle(c, free0), "KV blocks freed after the deadline");
    client_result_free(&sr);

    free(ids);
    client_close(c);
    printf(failures ? "%d check(s) failed\n" : "all client library checks passed\n", failures);
    return failures ? 1 : 0;
}
