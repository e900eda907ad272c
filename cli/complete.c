/* cli/complete.c - `shardlm complete`: one completion over Generate (or GenerateStream with
 * --stream), printed after its prompt as `shardlm generate` prints it, then, with --logprobs,
 * each token's log-probability and its most likely alternatives.
 * Not here: the shared flags (client_flags.c), the calls (clients/). Exit codes and messages:
 * commands.h. Tests: tests/test_client.sh (against a real `shardlm serve`). */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "client_flags.h"

static void complete_help(FILE *f)
{
    fprintf(f,
            "usage: shardlm complete --server ADDR --prompt TEXT [flags]\n"
            "Prints the prompt followed by its completion (as `shardlm generate` does), then a\n"
            "newline; token counts and timing go to stderr.\n"
            "  --prompt TEXT          the prompt (default \"\": BOS only)\n"
            "  --stream               print the completion as it is generated (GenerateStream)\n"
            "  --no-echo              print the completion only, not the prompt before it\n"
            "  --no-bos               do not prepend the BOS token\n"
            "  --stop TEXT            stop at TEXT (repeatable, at most 16)\n"
            "  --logprobs K           print each token's log-probability and its K most likely\n"
            "                         alternatives (K in [0, 20]) after the completion\n"
            "  --request-id ID        the request's id (default: the server's)\n"
            ADAPTER_HELP
            SAMPLING_HELP
            "                         (--temperature defaults to 0 here, as in `generate`)\n"
            COMMON_HELP);
}

/* What complete has printed so far: the prompt is echoed with the first output, so that a
 * call that fails before any prints nothing but the error. */
struct complete_out {
    const char *echo;  /* the prompt to print first; NULL: none or done */
    int         printed;
};

static void complete_print(struct complete_out *o, const char *text, size_t len)
{
    if (o->echo) {
        fputs(o->echo, stdout);
        o->echo = NULL;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    o->printed = 1;
}

static int complete_print_chunk(void *ctx, const struct client_chunk *ch)
{
    if (ch->index == 0 && ch->text_len) complete_print(ctx, ch->text, ch->text_len);
    return 0;
}

/* Pads a UTF-8 string to width columns (one per code point: pieces are mostly letters). */
static void print_padded(const char *s, int width)
{
    int cols = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if ((*p & 0xC0) != 0x80) cols++;
    fputs(s, stdout);
    for (; cols < width; cols++) fputc(' ', stdout);
}

static void print_logprobs(const struct client_completion *s)
{
    printf("logprobs (token id, piece, logprob%s):\n", s->n_logprobs && s->logprobs[0].n_top ? ", alternatives" : "");
    for (int i = 0; i < s->n_logprobs; i++) {
        const struct client_logprob *lp = &s->logprobs[i];
        printf("%6d  ", lp->token_id);
        print_padded(lp->piece, 16);
        printf(" %10.5f", lp->logprob);
        for (int j = 0; j < lp->n_top; j++)
            printf("%s%s %.5f", j ? ", " : "   [", lp->top[j].piece, lp->top[j].logprob);
        printf("%s\n", lp->n_top ? "]" : "");
    }
}

int client_complete_main(int argc, char **argv)
{
    const char *cmd = "complete";
    struct common_flags cf = {.server = DEFAULT_SERVER};
    struct client_request req = {0};
    const char *stop[MAX_STOP];
    int stream = 0, echo = 1, n_stop = 0;
    req.prompt = "";
    req.sampling.has_temperature = 1;
    req.sampling.temperature = 0.0f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        long l;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            complete_help(stdout);
            return 0;
        }
        if ((r = cli_parse_common(cmd, &cf, a, v, &used)) || (r = cli_parse_sampling(cmd, &req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--stream")) { stream = 1; used = 0; }
        else if (!strcmp(a, "--no-echo")) { echo = 0; used = 0; }
        else if (!strcmp(a, "--no-bos")) { req.has_add_bos = 1; req.add_bos = 0; used = 0; }
        else if (strcmp(a, "--prompt") && strcmp(a, "--stop") && strcmp(a, "--logprobs") &&
                 strcmp(a, "--request-id") && strcmp(a, "--adapter"))
            return cli_usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return cli_usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--prompt")) req.prompt = v;
        else if (!strcmp(a, "--request-id")) req.request_id = v;
        else if (!strcmp(a, "--adapter")) req.adapter = v;
        else if (!strcmp(a, "--stop")) {
            if (n_stop == MAX_STOP) return cli_usage_error(cmd, "at most 16 --stop strings%s", "");
            stop[n_stop++] = v;
        } else {
            if (base_parse_long(v, 0, 20, &l))
                return cli_usage_error(cmd, "--logprobs must be an integer in [0, 20], got '%s'", v);
            req.sampling.has_logprobs = 1;
            req.sampling.logprobs = (int)l;
        }
        i += used;
    }
    req.sampling.stop = stop;
    req.sampling.n_stop = n_stop;

    struct client *c = NULL;
    struct client_result res = {0};
    enum status st = cli_common_load(&cf);
    if (st == STATUS_OK) st = cli_open_client(&cf, 0, &c);
    if (st != STATUS_OK) {
        cli_common_free(&cf);
        return cli_fail(st);
    }
    struct complete_out out = {.echo = echo ? req.prompt : NULL};
    double t0 = base_now_s();
    if (stream) st = client_generate_stream(c, &req, complete_print_chunk, &out, &res);
    else st = client_generate(c, &req, &res);
    double dt = base_now_s() - t0;
    int rc = 0;
    if (st == STATUS_OK) {
        if (stream) complete_print(&out, "", 0);
        else if (res.n_completions > 0)
            complete_print(&out, res.completions[0].text, res.completions[0].text_len);
    }
    if (out.printed) fputc('\n', stdout);
    if (st == STATUS_OK && res.n_completions > 0) {
        const struct client_completion *s = &res.completions[0];
        if (req.sampling.has_logprobs) print_logprobs(s);
        fflush(stdout);
        fprintf(stderr, "shardlm: %s: prompt %d tokens, generated %d tokens (%s), seed %llu, %.3f s\n",
                res.request_id ? res.request_id : "?", res.usage.prompt_tokens,
                s->n_token_ids, client_finish_reason_name(s->finish_reason),
                (unsigned long long)res.seed, dt);
    } else if (st == STATUS_OK) {
        st = status_errorf(STATUS_INTERNAL, "the server returned no completion");
    }
    fflush(stdout);
    if (st != STATUS_OK) rc = cli_fail(st);
    client_result_free(&res);
    client_close(c);
    cli_common_free(&cf);
    return rc;
}
