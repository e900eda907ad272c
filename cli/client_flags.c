/* cli/client_flags.c - what the client subcommands share (client_flags.h): the flags that say
 * where the server is and how to reach it (--server, --api-key-file, TLS, --timeout,
 * --resume-for), the sampling flags, strict number parsing and the usage errors.
 * Not here: the subcommands (chat.c, complete.c, bench.c, stats.c), the client (clients/).
 * Tests: tests/test_client.sh. */
#include "client_flags.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see shardlm %s --help)\n", cmd);
    return EXIT_USAGE;
}

/* usage_error for the flag parsers, which return -1 after it. */
int cli_flag_error(const char *cmd, const char *fmt, const char *arg)
{
    cli_usage_error(cmd, fmt, arg);
    return -1;
}

int cli_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!*s || *s == '-') return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v) || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

/* Returns 1 when a is a common flag (*used: whether it took the value v), 0 when it is not
 * one, -1 after printing a usage error. */
int cli_parse_common(const char *cmd, struct common_flags *f, const char *a, const char *v,
                        int *used)
{
    *used = 1;
    if (!strcmp(a, "--tls")) {
        f->tls = 1;
        *used = 0;
        return 1;
    }
    if (strcmp(a, "--server") && strcmp(a, "--api-key-file") && strcmp(a, "--tls-ca") &&
        strcmp(a, "--tls-server-name") && strcmp(a, "--timeout") && strcmp(a, "--resume-for"))
        return 0;
    if (!v) return cli_flag_error(cmd, "%s needs a value", a);
    if (!strcmp(a, "--server")) f->server = v;
    else if (!strcmp(a, "--api-key-file")) f->api_key_file = v;
    else if (!strcmp(a, "--tls-ca")) f->tls_ca = v;
    else if (!strcmp(a, "--tls-server-name")) f->tls_server_name = v;
    else if (!strcmp(a, "--resume-for")) {
        if (cli_parse_double(v, 0, 1e9, &f->resume_for_s))
            return cli_flag_error(cmd, "--resume-for must be a number of seconds >= 0, got '%s'", v);
        f->has_resume_for = 1;
    } else if (cli_parse_double(v, 0, 1e9, &f->timeout_s))
        return cli_flag_error(cmd, "--timeout must be a number of seconds >= 0, got '%s'", v);
    return 1;
}

/* The first key in an API-key file: the first line that is neither empty nor a '#' comment,
 * trimmed of surrounding blanks. */
static enum status cli_read_api_key(const char *path, char **out)
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

int cli_parse_model(const char *cmd, struct common_flags *f, const char *a, const char *v)
{
    if (strcmp(a, "--model")) return 0;
    if (!v || !*v) return cli_flag_error(cmd, "--model needs a served model's NAME%s", "");
    f->model = v;
    return 1;
}

/* Reads what the flags name (the API key), once, before any client opens. */
enum status cli_common_load(struct common_flags *f)
{
    if (f->api_key_file) return cli_read_api_key(f->api_key_file, &f->api_key);
    return STATUS_OK;
}

void cli_common_free(struct common_flags *f)
{
    free(f->api_key);
    f->api_key = NULL;
}

enum status cli_open_client(const struct common_flags *f, int own_connection, struct client **c)
{
    struct client_options o = {
        .api_key = f->api_key,
        .tls = f->tls,
        .tls_root_cert_file = f->tls_ca,
        .tls_server_name = f->tls_server_name,
        .timeout_s = f->timeout_s,
        .resume_for_s = !f->has_resume_for ? 0 : f->resume_for_s > 0 ? f->resume_for_s : -1,
        .own_connection = own_connection,
        .model = f->model,
    };
    return client_open(f->server, &o, c);
}

/* The sampling flags, as parse_common. */
int cli_parse_sampling(const char *cmd, struct client_sampling *s, const char *a, const char *v,
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
    if (!v) return cli_flag_error(cmd, "%s needs a value", a);
    if (!strcmp(a, "--max-tokens")) {
        if (base_parse_long(v, 0, INT_MAX, &l))
            return cli_flag_error(cmd, "--max-tokens must be an integer >= 0, got '%s'", v);
        s->has_max_tokens = 1;
        s->max_tokens = (int)l;
    } else if (!strcmp(a, "--temperature")) {
        if (cli_parse_double(v, 0, 100, &d))
            return cli_flag_error(cmd, "--temperature must be a number in [0, 100], got '%s'", v);
        s->has_temperature = 1;
        s->temperature = (float)d;
    } else if (!strcmp(a, "--top-k")) {
        if (base_parse_long(v, 0, INT_MAX, &l))
            return cli_flag_error(cmd, "--top-k must be an integer >= 0, got '%s'", v);
        s->top_k = (int)l;
    } else if (!strcmp(a, "--top-p")) {
        if (cli_parse_double(v, 0, 1, &d) || d == 0)
            return cli_flag_error(cmd, "--top-p must be a number in (0, 1], got '%s'", v);
        s->has_top_p = 1;
        s->top_p = (float)d;
    } else if (!strcmp(a, "--min-p")) {
        if (cli_parse_double(v, 0, 1, &d))
            return cli_flag_error(cmd, "--min-p must be a number in [0, 1], got '%s'", v);
        s->min_p = (float)d;
    } else if (!strcmp(a, "--repetition-penalty")) {
        if (cli_parse_double(v, 0, 10, &d) || d == 0)
            return cli_flag_error(cmd, "--repetition-penalty must be a number in (0, 10], got '%s'", v);
        s->has_repetition_penalty = 1;
        s->repetition_penalty = (float)d;
    } else {
        if (cli_parse_u64(v, &s->seed))
            return cli_flag_error(cmd, "--seed must be a non-negative integer, got '%s'", v);
        s->has_seed = 1;
    }
    return 1;
}
