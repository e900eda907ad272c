/* cli/adapters.c - `shardlm adapters list|load NAME PATH|unload NAME`: the LoRA adapters a
 * running server serves (GetModelInfo), loaded and unloaded at run time (LoadAdapter,
 * UnloadAdapter; admin operations that take the server's API key like any call).
 * Not here: the shared flags (client_flags.c), the calls (clients/). Exit codes and messages:
 * commands.h. Tests: tests/server/test_lora_serving.py (server_lora). */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "client_flags.h"

int client_adapters_main(int argc, char **argv)
{
    const char *cmd = "adapters";
    struct common_flags cf = {.server = DEFAULT_SERVER};
    const char *args[3];
    int n_args = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: shardlm adapters list [--server ADDR] [flags]\n"
                   "       shardlm adapters load NAME PATH [--server ADDR] [flags]\n"
                   "       shardlm adapters unload NAME [--server ADDR] [flags]\n"
                   "Lists the LoRA adapters the server serves (one name per line), loads the PEFT adapter\n"
                   "in PATH (a directory on the server's machine) as NAME, or unloads NAME (refused while\n"
                   "requests use it).\n"
                   "  --model NAME           on a server of several models, the one asked about (its id or an\n"
                   "                         adapter's name; default: the server's first)\n" COMMON_HELP);
            return 0;
        }
        if (a[0] != '-') {
            if (n_args == 3) return cli_usage_error(cmd, "too many arguments ('%s')", a);
            args[n_args++] = a;
            continue;
        }
        if ((r = cli_parse_model(cmd, &cf, a, v)) != 0) {
            if (r < 0) return EXIT_USAGE;
            i++;
            continue;
        }
        if ((r = cli_parse_common(cmd, &cf, a, v, &used)) == 0) return cli_usage_error(cmd, "unknown flag '%s'", a);
        if (r < 0) return EXIT_USAGE;
        i += used;
    }
    const int list = n_args == 1 && !strcmp(args[0], "list");
    const int load = n_args == 3 && !strcmp(args[0], "load");
    const int unload = n_args == 2 && !strcmp(args[0], "unload");
    if (!list && !load && !unload)
        return cli_usage_error(cmd, "expected list, load NAME PATH or unload NAME%s", "");
    struct client *c = NULL;
    struct client_model_info mi = {0};
    int rank = 0;
    enum status st = cli_common_load(&cf);
    if (st == STATUS_OK) st = cli_open_client(&cf, 0, &c);
    if (st == STATUS_OK) {
        if (list) st = client_model_info(c, &mi);
        else if (load) st = client_load_adapter(c, args[1], args[2], &rank);
        else st = client_unload_adapter(c, args[1]);
    }
    if (st == STATUS_OK) {
        if (list)
            for (int i = 0; i < mi.n_adapters; i++) printf("%s\n", mi.adapters[i]);
        else if (load) fprintf(stderr, "shardlm: loaded '%s' (rank %d)\n", args[1], rank);
        else fprintf(stderr, "shardlm: unloaded '%s'\n", args[1]);
    }
    client_model_info_free(&mi);
    client_close(c);
    cli_common_free(&cf);
    return st == STATUS_OK ? 0 : cli_fail(st);
}
