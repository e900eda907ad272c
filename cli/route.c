/* cli/route.c - `shardlm route`: the HTTP router over separate serve jobs (server/proxy.h):
 * its flags, then it serves until SIGTERM or SIGINT (open requests may finish for
 * --drain-timeout seconds). Exit codes and messages: commands.h.
 *   --listen HOST:PORT       where it serves [127.0.0.1:8080]
 *   --replica HOST:PORT      a replica's HTTP front (`serve --http`); once per replica, 1 to 64
 *   --probe-interval S       each replica's GET /health this often [1]
 *   --connect-timeout S      a replica's connection and its probe's answer within [2]
 *   --drain-timeout S        after SIGTERM [30]
 *   --max-connections N      client connections at once [1024]
 *   --max-body-bytes N       a request body at most [256M] (K, M, G suffixes)
 * Tests: tests/server/test_router.py. */
#include "commands.h"

#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_flags.h"
#include "proxy.h"

static sem_t g_route_stop;

static void on_signal(int sig)
{
    (void)sig;
    sem_post(&g_route_stop);
}

static int parse_seconds(const char *v, double lo, double hi, double *out)
{
    char *end;
    double d = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || !(d >= lo && d <= hi)) return -1;
    *out = d;
    return 0;
}

int route_main(int argc, char **argv)
{
    struct proxy_options o = {.listen = "127.0.0.1:8080", .probe_interval_s = 1.0, .connect_timeout_s = 2.0,
                               .drain_timeout_s = 30.0, .max_connections = 1024, .max_body_bytes = (size_t)256 << 20};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: shardlm route --replica HOST:PORT --replica HOST:PORT ... [--listen 127.0.0.1:8080]\n"
                   "         [--probe-interval S (1)] [--connect-timeout S (2)] [--drain-timeout S (30)]\n"
                   "         [--max-connections N (1024)] [--max-body-bytes N (256M)]\n"
                   "One HTTP address in front of separate `shardlm serve --http` jobs: new requests go to the\n"
                   "least loaded live replica, a replica that cannot be reached is skipped, journaled streams\n"
                   "are resumed on the replica that holds them (docs/deployment.md).\n");
            return 0;
        }
        if (!v) return cli_usage_error("route", "%s needs a value", a);
        i++;
        if (!strcmp(a, "--listen")) {
            o.listen = v;
        } else if (!strcmp(a, "--replica")) {
            if (o.n_backends == ROUTER_MAX_BACKENDS) return cli_usage_error("route", "at most 64 --replica, got more at '%s'", v);
            o.backends[o.n_backends++] = v;
        } else if (!strcmp(a, "--probe-interval")) {
            if (parse_seconds(v, 0.05, 3600, &o.probe_interval_s)) return cli_usage_error("route", "--probe-interval must be seconds in [0.05, 3600], got '%s'", v);
        } else if (!strcmp(a, "--connect-timeout")) {
            if (parse_seconds(v, 0.01, 600, &o.connect_timeout_s)) return cli_usage_error("route", "--connect-timeout must be seconds in [0.01, 600], got '%s'", v);
        } else if (!strcmp(a, "--drain-timeout")) {
            if (parse_seconds(v, 0, 86400, &o.drain_timeout_s)) return cli_usage_error("route", "--drain-timeout must be seconds in [0, 86400], got '%s'", v);
        } else if (!strcmp(a, "--max-connections")) {
            if (base_parse_long(v, 1, 65536, &n)) return cli_usage_error("route", "--max-connections must be an integer in [1, 65536], got '%s'", v);
            o.max_connections = (int)n;
        } else if (!strcmp(a, "--max-body-bytes")) {
            char *end;
            unsigned long long b = strtoull(v, &end, 10), mul = 1;
            if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
            else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
            else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
            if (end == v || *end || b == 0 || b > (1ull << 40) / mul)
                return cli_usage_error("route", "--max-body-bytes must be a size in bytes (K, M, G suffixes) up to 1 TiB, got '%s'", v);
            o.max_body_bytes = (size_t)(b * mul);
        } else {
            return cli_usage_error("route", "unknown flag '%s'", a);
        }
    }
    if (o.n_backends == 0) return cli_usage_error("route", "%s", "route needs at least one --replica HOST:PORT");
    sem_init(&g_route_stop, 0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct proxy *r = NULL;
    enum status st = proxy_start(&o, &r);
    if (st != STATUS_OK) return cli_fail(st);
    printf("shardlm: ready\n");
    fflush(stdout);
    while (sem_wait(&g_route_stop) != 0) {
    }
    LOG_INFO("route", "stopping: open requests may finish for %.0f s", o.drain_timeout_s);
    proxy_stop(r);
    return 0;
}
