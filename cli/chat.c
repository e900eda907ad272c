/* cli/chat.c - `shardlm chat`: the interactive chat over ChatStream: reads a line, sends the
 * whole conversation, prints the reply as it streams, keeps the history. Ctrl-C cancels the
 * reply in flight (the conversation goes on), or leaves at the prompt (exit code 130).
 * Not here: the shared flags (client_flags.c), the calls (clients/), the chat templates (the
 * server applies them: engine/text/chat_template.c). Exit codes and messages: commands.h.
 * Tests: tests/test_client.sh (against a real `shardlm serve`). */
#include "commands.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_flags.h"

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
        if (base_grow((void **)&lr->buf, &lr->cap, lr->len + 4096 + 1, 1)) {
            errno = ENOMEM;
            return -2;
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
    struct client_message *msgs;  /* (cap), n of them; contents malloc'd (roles are literals) */
    size_t cap;
    int    n;
};

static enum status history_push(struct chat_history *h, const char *role, const char *content, size_t len)
{
    if (base_grow((void **)&h->msgs, &h->cap, (size_t)h->n + 1, sizeof *h->msgs))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
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
            ADAPTER_HELP
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
        if ((r = cli_parse_common(cmd, &cf, a, v, &used)) || (r = cli_parse_sampling(cmd, &req.sampling, a, v, &used))) {
            if (r < 0) return EXIT_USAGE;
        } else if (!strcmp(a, "--stats")) { stats = 1; used = 0; }
        else if (strcmp(a, "--system") && strcmp(a, "--adapter"))
            return cli_usage_error(cmd, "unknown flag '%s'", a);
        else if (!v) return cli_usage_error(cmd, "%s needs a value", a);
        else if (!strcmp(a, "--adapter")) req.adapter = v;
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

    if ((st = cli_common_load(&cf)) != STATUS_OK) goto done;
    if ((st = cli_open_client(&cf, 0, &c)) != STATUS_OK) goto done;
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
            cli_fail(st);
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
    if (st != STATUS_OK) rc = cli_fail(st);
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
    cli_common_free(&cf);
    return rc;
}
