/* tests/check.h - PASS/FAIL bookkeeping shared by C tests that report one line per check and
 * end with "N passed, M failed" (test_formats.c, test_gguf.c). Include once per test program. */
#ifndef SHARDLM_TESTS_CHECK_H
#define SHARDLM_TESTS_CHECK_H

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Removes path and, for a directory, everything under it (symbolic links are not followed): a
 * test's scratch tree. Best effort; returns 0 when everything went. */
static int check_remove_tree(const char *path) __attribute__((unused));
static int check_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    int bad = 0;
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[4096];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) bad = -1;
        else bad |= check_remove_tree(sub);
    }
    if (d) closedir(d);
    return rmdir(path) != 0 ? -1 : bad;
}

#endif
