/* clients/cli.c - `shardlm chat`, `shardlm complete`, `shardlm bench` and `shardlm stats`: flag parsing,
 * printing, the chat REPL (with Ctrl-C handling) and the load generator, all over the client
 * library (client.h). Exit codes and messages: see cli.h.
 * Not here: gRPC or protobuf (client.c); the dispatch from the command line (server/main.c).
 * Tests: tests/test_client.sh (every subcommand against a real `shardlm serve`). */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

#define EXIT_USAGE      2
#define EXIT_INTERRUPT  130
#define DEFAULT_SERVER  "127.0.0.1:50051"
#define MAX_STOP        16

/* ---- shared helpers ------------------------------------------------------------------- */

static int fail(enum status st)
{
    fprintf(stderr, "shardlm: error: %s: %s\n", status_name(st), status_message());
    return 1;
}

static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see shardlm %s --help)\n", cmd);
    return EXIT_USAGE;
}

/* usage_error for the flag parsers, which return -1 after it. */
static int flag_error(const char *cmd, const char *fmt, const char *arg)
{
    usage_error(cmd, fmt, arg);
    return -1;
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* The flags every client subcommand takes: where the server is and how to reach it. */
struct common_flags {
    const char *server;
    const char *api_key_file;
    char       *api_key;        /* read from api_key_file by common_load; owned */
    const char *tls_ca;
    const char *tls_server_name;
    int         tls;
    double      timeout_s;
};

#define COMMON_HELP                                                                          \
    "  --server ADDR          the server, host:port (default " DEFAULT_SERVER ")\n"          \
    "  --api-key-file FILE    send the first key of FILE (one per line, '#' comments) as\n"  \
    "                         `authorization: Bearer <key>`\n"                               \
    "  --tls                  use TLS with the system's root certificates\n"                 \
    "  --tls-ca FILE          use TLS trusting the PEM certificates in FILE\n"               \
    "  --tls-server-name N    the name to check the server's certificate against\n"         \
    "  --timeout S            deadline of each call in seconds (default none)\n"

/* Returns 1 when a is a common flag (*used: whether it took the value v), 0 when it is not
 * one, -1 after printing a usage error. */
static int parse_common(const char *cmd, struct common_flags *f, const char *a, const char *v,
                        int *used)
{
    *used = 1;
    if (!strcmp(a, "--tls")) {
        f->tls = 1;
        *used = 0;
        return 1;
    }
    if (strcmp(a, "--server") && strcmp(a, "--api-key-file") && strcmp(a, "--tls-ca") &&
        strcmp(a, "--tls-server-name") && strcmp(a, "--timeout"))
        return 0;
    if (!v) return flag_error(cmd, "%s needs a value", a);
    if (!strcmp(a, "--server")) f->server = v;
    else if (!strcmp(a, "--api-key-file")) f->api_key_file = v;
    else if (!strcmp(a, "--tls-ca")) f->tls_ca = v;
    else if (!strcmp(a, "--tls-server-name")) f->tls_server_name = v;
    else if (parse_double(v, 0, 1e9, &f->timeout_s))
        return flag_error(cmd, "--timeout must be a number of seconds >= 0, got '%s'", v);
    return 1;
}

/* The first key in an API-key file: the first line that is neither empty nor a '#' comment,
 * trimmed of surrounding blanks. */
static enum status read_api_key(const char *path, char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f) return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) >= 0) {
        char *s = line, *e = line + n;
        while (s < e && (*s == ' ' || *s == '\t')) s++;
        while (e > s && (e[-1] == '\n' || e[-1] == '\r' || e[-1] == ' ' || e[-1] == '\t')) e--;
        if (s == e || *s == '#') continue;
        *e = '\0';
        *out = strdup(s);
        break;
    }
    free(line);
    fclose(f);
    if (!*out) return status_errorf(STATUS_INVALID_ARGUMENT, "%s: no API key in the file", path);
    return STATUS_OK;
}

/* Reads what the flags name (the API key), once, before any client opens. */
static enum status common_load(struct common_flags *f)
{
    if (f->api_key_file) return read_api_key(f->api_key_file, &f->api_key);
    return STATUS_OK;
}

static void common_free(struct common_flags *f)
{
    free(f->api_key);
    f->api_key = NULL;
}

static enum status open_client(const struct common_flags *f, int own_connection, struct client **c)
{
    struct client_options o = {
        .api_key = f->api_key,
        .tls = f->tls,
        .tls_root_cert_file = f->tls_ca,
        .tls_server_name = f->tls_server_name,
        .timeout_s = f->timeout_s,
        .own_connection = own_connection,
    };
    return client_open(f->server, &o, c);
}

/* The sampling flags, as parse_common. */
static int parse_sampling(const char *cmd, struct client_sampling *s, const char *a, const char *v,
                          int *used)
{
    long l;
    double d;
    *used = 1;
    if (!strcmp(a, "--ignore-eos")) {
        s->ignore_eos = 1;
        *used = 0;
        return 1;
    }
    if (strcmp(a, "--max-tokens") && strcmp(a, "--temperature") && strcmp(a, "--top-k") &&
        strcmp(a, "--top-p") && strcmp(a, "--min-p") && strcmp(a, "--seed") &&
        strcmp(a, "--repetition-penalty"))
        return 0;
    if (!v) return flag_error(cmd, "%s needs a value", a);
    if (!strcmp(a, "--max-tokens")) {
        if (base_parse_long(v, 0, INT_MAX, &l))
            return flag_error(cmd, "--max-tokens must be an integer >= 0, got '%s'", v);
        s->has_max_tokens = 1;
        s->max_tokens = (int)l;
    } else if (!strcmp(a, "--temperature")) {
        if (parse_double(v, 0, 100, &d))
            return flag_error(cmd, "--temperature must be a number in [0, 100], got '%s'", v);
        s->has_temperature = 1;
        s->temperature = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if (base_parse_long(v, 0, INT_MAX, &l))
            return flag_error(cmd, "--top-k must be an integer >= 0, got '%s'", v);
        s->top_k = (int)l;
    } else if (!strcmp(a, "--top-p")) {
        if (parse_double(v, 0, 1, &d) || d == 0)
            return flag_error(cmd, "--top-p must be a number in (0, 1], got '%s'", v);
        s->has_top_p = 1;
        s->top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if (parse_double(v, 0, 1, &d))
            return flag_error(cmd, "--min-p must be a number in [0, 1], got '%s'", v);
        s->min_p = (float)d;
    } else if (!strcmp(a, "--repetition-penalty")) {
        if (parse_double(v, 0, 10, &d) || d == 0)
            return flag_error(cmd, "--repetition-penalty must be a number in (0, 10], got '%s'", v);
        s->has_repetition_penalty = 1;
        s->repetition_penalty = (float)d;
    } else {
        if (parse_u64(v, &s->seed))
            return flag_error(cmd, "--seed must be a non-negative integer, got '%s'", v);
        s->has_seed = 1;
    }
    return 1;
}

#define SAMPLING_HELP                                                                        \
    "  --max-tokens N         most tokens to generate (server default 128)\n"                \
    "  --temperature T        in [0, 100]; 0 = greedy\n"                                     \
    "  --top-k K, --top-p P, --min-p P, --repetition-penalty R, --seed S, --ignore-eos\n"

/* ---- complete ------------------------------------------------------------------------- */

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
        if ((r = parse_common(cmd, &cf, a, v, &used)) || (r = parse_sampling(cmd, &req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--stream")) { stream = 1; used = 0; }
        else if (!strcmp(a, "--no-echo")) { echo = 0; used = 0; }
        else if (!strcmp(a, "--no-bos")) { req.has_add_bos = 1; req.add_bos = 0; used = 0; }
        else if (strcmp(a, "--prompt") && strcmp(a, "--stop") && strcmp(a, "--logprobs") &&
                 strcmp(a, "--request-id"))
            return usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--prompt")) req.prompt = v;
        else if (!strcmp(a, "--request-id")) req.request_id = v;
        else if (!strcmp(a, "--stop")) {
            if (n_stop == MAX_STOP) return usage_error(cmd, "at most 16 --stop strings%s", "");
            stop[n_stop++] = v;
        } else {
            if (base_parse_long(v, 0, 20, &l))
                return usage_error(cmd, "--logprobs must be an integer in [0, 20], got '%s'", v);
            req.sampling.has_logprobs = 1;
            req.sampling.logprobs = (int)l;
        }
        i += used;
    }
    req.sampling.stop = stop;
    req.sampling.n_stop = n_stop;

    struct client *c = NULL;
    struct client_result res = {0};
    enum status st = common_load(&cf);
    if (st == STATUS_OK) st = open_client(&cf, 0, &c);
    if (st != STATUS_OK) {
        common_free(&cf);
        return fail(st);
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
    if (st != STATUS_OK) rc = fail(st);
    client_result_free(&res);
    client_close(c);
    common_free(&cf);
    return rc;
}

/* ---- chat ----------------------------------------------------------------------------- */

/* Ctrl-C: the handler only raises the flag (which the running call polls) and wakes the
 * prompt's poll() through a pipe; it may run on any thread, gRPC's included. These two are
 * the only process-wide state of the client commands, as a signal handler needs. */
static volatile sig_atomic_t chat_interrupted;
static int chat_wake_fd = -1;

static void chat_on_sigint(int sig)
{
    (void)sig;
    int saved = errno;
    chat_interrupted = 1;
    if (chat_wake_fd >= 0) {
        ssize_t r = write(chat_wake_fd, "!", 1);
        (void)r;
    }
    errno = saved;
}

/* Lines from a file descriptor, read with poll() so that Ctrl-C at the prompt is seen. */
struct line_reader {
    int    fd;
    int    wake_fd;  /* readable after Ctrl-C; -1: none */
    char  *buf;
    size_t len, cap, start;
    int    eof;
};

static void drain_fd(int fd)
{
    char b[64];
    while (fd >= 0 && read(fd, b, sizeof b) > 0) {}
}

/* Returns 1 with *line (NUL-terminated, without its newline, valid until the next call), 0 at
 * end of input, -1 when interrupted by Ctrl-C, -2 on a read error (errno). */
static int line_read(struct line_reader *lr, char **line)
{
    for (;;) {
        char *nl = lr->len > lr->start ? memchr(lr->buf + lr->start, '\n', lr->len - lr->start) : NULL;
        if (nl || (lr->eof && lr->len > lr->start)) {
            char *s = lr->buf + lr->start;
            size_t n = nl ? (size_t)(nl - s) : lr->len - lr->start;
            s[n] = '\0';  /* the newline, or the spare byte kept at the end of buf */
            if (n && s[n - 1] == '\r') s[n - 1] = '\0';
            lr->start += n + (nl ? 1 : 0);
            *line = s;
            return 1;
        }
        if (lr->eof) return 0;
        if (chat_interrupted) return -1;
        if (lr->start) {
            memmove(lr->buf, lr->buf + lr->start, lr->len - lr->start);
            lr->len -= lr->start;
            lr->start = 0;
        }
        if (lr->len + 4096 + 1 > lr->cap) {
            size_t ncap = lr->cap ? 2 * lr->cap : 8192;
            char *nb = realloc(lr->buf, ncap);
            if (!nb) {
                errno = ENOMEM;
                return -2;
            }
            lr->buf = nb;
            lr->cap = ncap;
        }
        struct pollfd p[2] = {{.fd = lr->fd, .events = POLLIN}, {.fd = lr->wake_fd, .events = POLLIN}};
        int r = poll(p, lr->wake_fd >= 0 ? 2 : 1, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -2;
        }
        if (lr->wake_fd >= 0 && (p[1].revents & POLLIN)) drain_fd(lr->wake_fd);
        if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t n = read(lr->fd, lr->buf + lr->len, lr->cap - lr->len - 1);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -2;
        }
        if (n == 0) lr->eof = 1;
        lr->len += (size_t)n;
    }
}

struct chat_history {
    struct client_message *msgs;  /* contents malloc'd (roles are literals) */
    int n, cap;
};

static enum status history_push(struct chat_history *h, const char *role, const char *content, size_t len)
{
    if (h->n == h->cap) {
        int ncap = h->cap ? 2 * h->cap : 16;
        struct client_message *nm = realloc(h->msgs, (size_t)ncap * sizeof *nm);
        if (!nm) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        h->msgs = nm;
        h->cap = ncap;
    }
    char *c = malloc(len + 1);
    if (!c) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    memcpy(c, content, len);
    c[len] = '\0';
    h->msgs[h->n].role = role;
    h->msgs[h->n].content = c;
    h->n++;
    return STATUS_OK;
}

static void history_truncate(struct chat_history *h, int n)
{
    while (h->n > n) free((char *)h->msgs[--h->n].content);
}

static int chat_print_chunk(void *ctx, const struct client_chunk *ch)
{
    int *printed = ctx;
    if (ch->index == 0 && ch->text_len) {
        fwrite(ch->text, 1, ch->text_len, stdout);
        fflush(stdout);
        *printed = 1;
    }
    return 0;
}

static void chat_help(FILE *f)
{
    fprintf(f,
            "usage: shardlm chat --server ADDR [flags]\n"
            "A conversation with the served model: each line read from stdin is a user turn;\n"
            "the reply streams to stdout as it is generated, and every earlier turn is sent\n"
            "again with each new one. At a terminal, Ctrl-C cancels the reply being generated\n"
            "(that turn is then forgotten) and, at the prompt, quits; Ctrl-D quits. Lines\n"
            "\"/reset\" (forget the conversation) and \"/exit\" are commands.\n"
            "  --system TEXT          a system message that opens the conversation\n"
            "  --stats                after each reply, print its token counts and timing to stderr\n"
            SAMPLING_HELP
            COMMON_HELP);
}

int client_chat_main(int argc, char **argv)
{
    const char *cmd = "chat";
    struct common_flags cf = {.server = DEFAULT_SERVER};
    struct client_request req = {0};
    const char *system = NULL;
    int stats = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            chat_help(stdout);
            return 0;
        }
        if ((r = parse_common(cmd, &cf, a, v, &used)) || (r = parse_sampling(cmd, &req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--stats")) { stats = 1; used = 0; }
        else if (strcmp(a, "--system")) return usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return usage_error(cmd, "%s needs a value", a);
        else system = v;
        i += used;
    }

    const int interactive = isatty(STDIN_FILENO);
    struct client *c = NULL;
    struct chat_history h = {0};
    struct line_reader lr = {.fd = STDIN_FILENO, .wake_fd = -1};
    struct client_result res = {0};
    struct sigaction old_int;
    int pipe_fds[2] = {-1, -1}, handler_set = 0, rc = 0, turn = 0;
    enum status st;

    if ((st = common_load(&cf)) != STATUS_OK) goto done;
    if ((st = open_client(&cf, 0, &c)) != STATUS_OK) goto done;
    if (system && (st = history_push(&h, "system", system, strlen(system))) != STATUS_OK) goto done;
    if (interactive) {
        struct client_model_info mi;
        if ((st = client_model_info(c, &mi)) != STATUS_OK) goto done;
        fprintf(stderr, "shardlm chat: %s (%s, %d layers, context %d, chat template %s). "
                        "Ctrl-C cancels a reply, Ctrl-D quits.\n",
                cf.server, mi.architecture, mi.n_layers, mi.context_length, mi.chat_template);
        client_model_info_free(&mi);
    }
    if (pipe(pipe_fds) == 0) {
        fcntl(pipe_fds[0], F_SETFL, O_NONBLOCK);
        fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
        chat_wake_fd = pipe_fds[1];
        lr.wake_fd = pipe_fds[0];
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chat_on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGINT, &sa, &old_int) == 0) handler_set = 1;
    req.cancel_flag = &chat_interrupted;

    for (;;) {
        if (interactive) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        char *line;
        int r = line_read(&lr, &line);
        if (r == 0) break;
        if (r == -1) {
            fputc('\n', stdout);
            rc = EXIT_INTERRUPT;
            break;
        }
        if (r == -2) {
            st = status_errorf(STATUS_IO, "reading stdin: %s", strerror(errno));
            goto done;
        }
        if (!*line) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            history_truncate(&h, system ? 1 : 0);
            continue;
        }
        int before = h.n, printed = 0;
        if ((st = history_push(&h, "user", line, strlen(line))) != STATUS_OK) goto done;
        req.messages = h.msgs;
        req.n_messages = h.n;
        turn++;
        double t0 = base_now_s();
        st = client_generate_stream(c, &req, chat_print_chunk, &printed, &res);
        double dt = base_now_s() - t0;
        if (printed || st == STATUS_OK) fputc('\n', stdout);
        fflush(stdout);
        if (st == STATUS_CANCELLED && chat_interrupted) {
            fprintf(stderr, "shardlm chat: reply cancelled (this turn is forgotten)\n");
            history_truncate(&h, before);
            chat_interrupted = 0;
            drain_fd(lr.wake_fd);
            continue;
        }
        if (st != STATUS_OK) {
            history_truncate(&h, before);
            if (!interactive) goto done;
            fail(st);
            continue;
        }
        const struct client_completion *s = res.n_completions ? &res.completions[0] : NULL;
        if ((st = history_push(&h, "assistant", s ? s->text : "", s ? s->text_len : 0)) != STATUS_OK)
            goto done;
        if (stats)
            fprintf(stderr, "shardlm chat: turn %d: %s: prompt %d tokens, generated %d tokens (%s), %.3f s\n",
                    turn, res.request_id ? res.request_id : "?", res.usage.prompt_tokens,
                    s ? s->n_token_ids : 0, s ? client_finish_reason_name(s->finish_reason) : "", dt);
    }
    st = STATUS_OK;
done:
    if (st != STATUS_OK) rc = fail(st);
    if (handler_set) sigaction(SIGINT, &old_int, NULL);
    chat_wake_fd = -1;
    chat_interrupted = 0;
    if (pipe_fds[0] >= 0) close(pipe_fds[0]);
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
    free(lr.buf);
    history_truncate(&h, 0);
    free(h.msgs);
    client_result_free(&res);
    client_close(c);
    common_free(&cf);
    return rc;
}

/* ---- bench ---------------------------------------------------------------------------- */

#define N_GRPC_CODES 17

struct samples {
    double *v;  /* (n) */
    size_t  n, cap;
};

static int samples_push(struct samples *s, double x)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? 2 * s->cap : 256;
        double *nv = realloc(s->v, ncap * sizeof *nv);
        if (!nv) return -1;
        s->v = nv;
        s->cap = ncap;
    }
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
    enum status st = open_client(&w->b->cf, 1, &c);
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
        if ((r = parse_common(cmd, &b.cf, a, v, &used)) || (r = parse_sampling(cmd, &b.req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (strcmp(a, "--concurrency") && strcmp(a, "--requests") && strcmp(a, "--prompt"))
            return usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--prompt")) b.req.prompt = v;
        else if (!strcmp(a, "--concurrency")) {
            if (base_parse_long(v, 1, 1024, &concurrency))
                return usage_error(cmd, "--concurrency must be an integer in [1, 1024], got '%s'", v);
        } else if (base_parse_long(v, 1, 10000000, &n_requests)) {
            return usage_error(cmd, "--requests must be an integer in [1, 10000000], got '%s'", v);
        }
        i += used;
    }
    if (concurrency > n_requests) concurrency = n_requests;
    enum status lst = common_load(&b.cf);
    if (lst != STATUS_OK) return fail(lst);
    b.n_requests = (int)n_requests;
    atomic_init(&b.next, 0);

    struct bench_worker *w = calloc((size_t)concurrency, sizeof *w);
    if (!w) {
        common_free(&b.cf);
        return fail(status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"));
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
        common_free(&b.cf);
        return fail(status_errorf(STATUS_RESOURCE_EXHAUSTED, "could not start any worker thread"));
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
        rc = fail(status_errorf(st, "%ld of %d requests failed; first: %s", failed, b.n_requests,
                                w[first_worker].first_error[first_code]));
    }
    for (long i = 0; i < concurrency; i++) {
        free(w[i].ttft.v);
        free(w[i].itl.v);
    }
    free(w);
    free(ttft.v);
    free(itl.v);
    common_free(&b.cf);
    return rc;
}

/* ---- stats ------------------------------------------------------------------------------ */

/* `shardlm stats`: GetModelInfo and GetServerStats as "key: value" lines, one line per
 * data-parallel replica (for operators and scripts). */
int client_stats_main(int argc, char **argv)
{
    const char *cmd = "stats";
    struct common_flags cf = {.server = DEFAULT_SERVER};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: shardlm stats [--server ADDR] [flags]\n"
                   "Prints the served model (GetModelInfo) and the server's load (GetServerStats),\n"
                   "with one line per data-parallel replica.\n" COMMON_HELP);
            return 0;
        }
        if ((r = parse_common(cmd, &cf, a, v, &used)) == 0) return usage_error(cmd, "unknown flag '%s'", a);
        if (r < 0) return EXIT_USAGE;
        i += used;
    }
    struct client *c = NULL;
    struct client_model_info mi = {0};
    struct client_server_stats s;
    enum status st = common_load(&cf);
    if (st == STATUS_OK) st = open_client(&cf, 0, &c);
    if (st == STATUS_OK) st = client_model_info(c, &mi);
    if (st == STATUS_OK) st = client_server_stats(c, &s);
    if (st == STATUS_OK) {
        printf("model: %s, %d layers, d_model %d, vocab %d, context %d, %s on %s\n", mi.architecture, mi.n_layers,
               mi.d_model, mi.vocab_size, mi.context_length, mi.dtype, mi.device);
        printf("parallel: dp %d x tp %d x pp %d\n", mi.dp_size > 0 ? mi.dp_size : 1, mi.tp_size, mi.pp_size);
        printf("requests: %d waiting, %d running, %llu submitted, %llu finished\n", s.waiting, s.running,
               (unsigned long long)s.requests_submitted, (unsigned long long)s.requests_finished);
        printf("tokens: %llu prompt, %llu generated, %llu from the prefix cache\n",
               (unsigned long long)s.prompt_tokens, (unsigned long long)s.generated_tokens,
               (unsigned long long)s.prefix_cache_hit_tokens);
        printf("kv: %d of %d blocks free, %d cached\n", s.kv_blocks_free, s.kv_blocks_total, s.kv_blocks_cached);
        for (int i = 0; i < s.n_replicas; i++) {
            const struct client_replica_stats *r = &s.replicas[i];
            printf("replica %d: leader_rank %d routed %llu routed_by_prefix %llu outstanding %d finished %llu "
                   "generated %llu prefix_hit_tokens %llu kv_free %d/%d report_age_s %.2f\n",
                   i, r->leader_rank, (unsigned long long)r->routed, (unsigned long long)r->routed_by_prefix,
                   r->outstanding, (unsigned long long)r->requests_finished, (unsigned long long)r->generated_tokens,
                   (unsigned long long)r->prefix_cache_hit_tokens, r->kv_blocks_free, r->kv_blocks_total,
                   r->report_age_seconds);
        }
    }
    client_model_info_free(&mi);
    client_close(c);
    common_free(&cf);
    return st == STATUS_OK ? 0 : fail(st);
}
