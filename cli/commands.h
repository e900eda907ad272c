/* cli/commands.h - the subcommands of the shardlm binary, each a main() of its own that
 * cli/main.c dispatches to with the arguments after the subcommand's name
 * (`shardlm chat ARGS...` -> client_chat_main(argc - 2, argv + 2)).
 * Each returns the process exit code: 0 success, 1 an error (printed as
 * "shardlm: error: <STATUS>: <message>"), 2 bad flags (EXIT_USAGE), 130 chat left with Ctrl-C at
 * its prompt. `--help` prints a subcommand's flags.
 *   shardlm serve    --model DIR [...]                   serve.c: the gRPC server
 *   shardlm generate --model DIR [...]                   generate.c: local generation
 *   shardlm convert  llama2c|gguf ...                    convert.c
 *   shardlm reshard  --model DIR --out DIR [...]         reshard.c
 *   shardlm train    --model DIR --data F --out DIR [...]   train.c: fine-tuning
 *   shardlm merge-lora --model DIR --adapter DIR --out DIR   merge_lora.c
 *   shardlm chat     --server ADDR [...]   chat.c: interactive, streamed conversation (ChatStream)
 *   shardlm complete --server ADDR --prompt TEXT [...]   complete.c: one completion
 *   shardlm bench    --server ADDR --concurrency N --requests M [...]   bench.c: load generator
 *   shardlm stats    --server ADDR   stats.c: the served model and the server's load
 *   shardlm route    --replica ADDR ...   route.c: the HTTP router over separate serve jobs
 * Not here: the gRPC client (clients/client.h), the server (server/), the engine.
 * Tests: tests/test_cli.sh, tests/test_client.sh. */
#ifndef SHARDLM_CLI_COMMANDS_H
#define SHARDLM_CLI_COMMANDS_H

#include "base.h"

#define EXIT_USAGE 2

int serve_main(int argc, char **argv);
int generate_main(int argc, char **argv);
int convert_main(int argc, char **argv);
int reshard_main(int argc, char **argv);
int train_main(int argc, char **argv);
int merge_lora_main(int argc, char **argv);
int client_chat_main(int argc, char **argv);
int client_complete_main(int argc, char **argv);
int client_bench_main(int argc, char **argv);
int client_stats_main(int argc, char **argv);
int client_adapters_main(int argc, char **argv);
int route_main(int argc, char **argv);

/* Prints "shardlm: error: <STATUS>: <message>" for st and the thread's status message;
 * returns 1. */
int cli_fail(enum status st);
/* Prints "shardlm: " fmt (with arg) and a pointer to --help; returns EXIT_USAGE. */
int cli_usage(const char *fmt, const char *arg);

#endif
