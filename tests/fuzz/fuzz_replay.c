/* tests/fuzz/fuzz_replay.c - the second driver of every fuzz target: a main() that feeds each
 * file named on the command line (a directory: each file in it, in name order) to
 * LLVMFuzzerTestOneInput once. Built in every configuration, with any compiler, so that
 * `make test` replays the corpora under the gcc ASan + UBSan build (ctest label fuzz) without
 * building the clang libFuzzer configuration; a crash or sanitizer report fails the test.
 * Exit: 0 when every input ran, 77 when the target skipped (no assets), 1 on a bad argument.
 * Usage: fuzz_replay_<target> CORPUS_DIR_OR_FILE... */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_util.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *data = malloc(n > 0 ? (size_t)n : 1);
    size_t got = n > 0 && data ? fread(data, 1, (size_t)n, f) : 0;
    fclose(f);
    if (!data || (n > 0 && got != (size_t)n)) {
        fprintf(stderr, "fuzz_replay: cannot read %s\n", path);
        free(data);
        return -1;
    }
    LLVMFuzzerTestOneInput(data, got);
    free(data);
    return 0;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Runs every regular file of dir in name order; returns the count, or -1. */
static int run_dir(const char *dir)
{
    struct dirent **list;
    int n = scandir(dir, &list, NULL, NULL), count = 0;
    if (n < 0) return -1;
    qsort(list, (size_t)n, sizeof *list, cmp_names);
    for (int i = 0; i < n; i++) {
        char path[4096];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, list[i]->d_name);
        if (list[i]->d_name[0] != '.' && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            if (run_file(path) < 0) count = -1;
            else if (count >= 0) count++;
        }
        free(list[i]);
    }
    free(list);
    return count;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
        return 1;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    int total = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        int n = stat(argv[i], &sb) == 0 && S_ISDIR(sb.st_mode) ? run_dir(argv[i]) : (run_file(argv[i]) ? -1 : 1);
        if (n < 0) return 1;
        total += n;
    }
    printf("%s: %d inputs replayed, no finding\n", argv[0], total);
    return 0;
}
