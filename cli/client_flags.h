/* cli/client_flags.h - what the client subcommands (chat, complete, bench, stats) share: the
 * flags that say where the server is and how to reach it, the sampling flags, strict number
 * parsing and the error printers, over the client library (clients/client.h).
 * Not here: the subcommands themselves (cli/chat.c, complete.c, bench.c, stats.c).
 * Tests: tests/test_client.sh. */
#ifndef SHARDLM_CLI_CLIENT_FLAGS_H
#define SHARDLM_CLI_CLIENT_FLAGS_H

#include <stdint.h>

#include "client.h"
#include "commands.h"

#define EXIT_INTERRUPT  130
#define DEFAULT_SERVER  "127.0.0.1:50051"
#define MAX_STOP        16

/* The flags every client subcommand takes: where the server is and how to reach it. */
struct common_flags {
    const char *server;
    const char *api_key_file;
    char       *api_key;        /* read from api_key_file by common_load; owned */
    const char *tls_ca;
    const char *tls_server_name;
    int         tls;
    double      timeout_s;
    double      resume_for_s;   /* --resume-for: 0 never (client_options' -1), unset: the default */
    int         has_resume_for;
    const char *model;          /* stats, adapters: --model, the served model asked about */
};

#define COMMON_HELP                                                                          \
    "  --server ADDR          the server, host:port (default " DEFAULT_SERVER ")\n"          \
    "  --api-key-file FILE    send the first key of FILE (one per line, '#' comments) as\n"  \
    "                         `authorization: Bearer <key>`\n"                               \
    "  --tls                  use TLS with the system's root certificates\n"                 \
    "  --tls-ca FILE          use TLS trusting the PEM certificates in FILE\n"               \
    "  --tls-server-name N    the name to check the server's certificate against\n"         \
    "  --timeout S            deadline of each call in seconds (default none)\n"                \
    "  --resume-for S         a call of a server with a stream journal that fails with\n"     \
    "                         UNAVAILABLE reattaches for up to S seconds (default 60, 0 never)\n"

#define ADAPTER_HELP                                                                         \
    "  --adapter NAME         the server's LoRA adapter NAME, or the served model's id for\n" \
    "                         the base model (default: the server's --default-adapter)\n"

#define SAMPLING_HELP                                                                        \
    "  --max-tokens N         most tokens to generate (server default 128)\n"                \
    "  --temperature T        in [0, 100]; 0 = greedy\n"                                     \
    "  --top-k K, --top-p P, --min-p P, --repetition-penalty R, --seed S, --ignore-eos\n"

int cli_usage_error(const char *cmd, const char *fmt, const char *arg);
int cli_flag_error(const char *cmd, const char *fmt, const char *arg);
int cli_parse_u64(const char *s, uint64_t *out);
int cli_parse_double(const char *s, double lo, double hi, double *out);
int cli_parse_common(const char *cmd, struct common_flags *f, const char *a, const char *v,
                        int *used);
/* `--model NAME` (stats, adapters): 1 when a is it (the value v taken into f->model), 0 when a
 * is another flag, -1 after printing a usage error. */
int cli_parse_model(const char *cmd, struct common_flags *f, const char *a, const char *v);
enum status cli_common_load(struct common_flags *f);
void cli_common_free(struct common_flags *f);
enum status cli_open_client(const struct common_flags *f, int own_connection, struct client **c);
int cli_parse_sampling(const char *cmd, struct client_sampling *s, const char *a, const char *v,
                          int *used);

#endif
