/* server/serve.h - the `shardlm serve` subcommand: flags in, server_run, exit code out.
 * Not here: the server itself (server.c). Tests: tests/server/test_server.py starts it. */
#ifndef SHARDLM_SERVE_H
#define SHARDLM_SERVE_H

/* argv[0..argc) are the arguments after "serve". Returns the process exit code: 0 after a
 * clean drain (SIGTERM / SIGINT), 1 on an error (printed to stderr), 2 on a usage error. */
int serve_main(int argc, char **argv);

#endif
