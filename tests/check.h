/* tests/check.h - PASS/FAIL bookkeeping shared by C tests that report one line per check and
 * end with "N passed, M failed" (test_formats.c, test_gguf.c). Include once per test program. */
#ifndef SHARDLM_TESTS_CHECK_H
#define SHARDLM_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base.h"

static int n_pass, n_fail;

/* Prints PASS or FAIL and the formatted description, and counts it. */
static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3), unused));
static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "PASS" : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
    if (ok) n_pass++;
    else n_fail++;
}

/* The status is `want` and the message contains every needle given (NULL-terminated). */
static void check_status(enum status got, enum status want, const char *what, ...) __attribute__((unused));
static void check_status(enum status got, enum status want, const char *what, ...)
{
    const char *msg = status_message();
    int ok = got == want;
    va_list ap;
    va_start(ap, what);
    const char *needle;
    while ((needle = va_arg(ap, const char *)))
        if (got != STATUS_OK && !strstr(msg, needle)) ok = 0;
    va_end(ap);
    check(ok, "%s -> %s%s%s%s", what, status_name(got), got ? " \"" : "", got ? msg : "",
          got ? "\"" : "");
}

#endif
