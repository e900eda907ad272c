/* clients/cli.h - the client subcommands of the shardlm binary, each a main() of its own that
 * server/main.c dispatches to with the arguments after the subcommand's name
 * (`shardlm chat ARGS...` -> client_chat_main(argc - 2, argv + 2)):
 *   shardlm chat     --server ADDR [...]   interactive, streamed conversation (ChatStream)
 *   shardlm complete --server ADDR --prompt TEXT [...]   one completion (Generate[Stream])
 *   shardlm bench    --server ADDR --concurrency N --requests M [...]   load generator
 *   shardlm stats    --server ADDR   the served model and the server's load, per replica
 * Each returns the process exit code: 0 success, 1 an error from the server or the
 * connection (printed as "shardlm: error: <STATUS>: <message>"), 2 bad flags, 130 chat left
 * with Ctrl-C at its prompt. `--help` prints the subcommand's flags.
 * Not here: the gRPC client itself (client.h).
 * Tests: tests/test_client.sh. */
#ifndef SHARDLM_CLI_H
#define SHARDLM_CLI_H

#ifdef __cplusplus
extern "C" {
#endif

int client_chat_main(int argc, char **argv);
int client_complete_main(int argc, char **argv);
int client_bench_main(int argc, char **argv);
int client_stats_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
