/* tests/fuzz/fuzz_util.c - assets, scratch files and logs for the fuzz targets (fuzz_util.h). */
#define _GNU_SOURCE
#include "fuzz_util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"
#include "tokenizer.h"

static char scratch[256];

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_scratch(void)
{
    nftw(scratch, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

void fuzz_init(void)
{
    if (scratch[0]) return;
    log_set_level(LOG_LEVEL_ERROR + 1);
    struct stat sb;
    const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/shardlm_fuzz_%d_XXXXXX", base, (int)getpid());
    CHECK(mkdtemp(scratch), "cannot create a scratch directory under %s", base);
    atexit(remove_scratch);
}

const char *fuzz_path(const char *name)
{
    static char path[512];
    fuzz_init();
    snprintf(path, sizeof path, "%s/%s", scratch, name);
    return path;
}

const char *fuzz_write_file(const char *name, const void *data, size_t size)
{
    const char *path = fuzz_path(name);
    FILE *f = fopen(path, "wb");
    CHECK(f, "cannot write %s", path);
    CHECK(size == 0 || fwrite(data, 1, size, f) == size, "cannot write %s", path);
    CHECK(fclose(f) == 0, "cannot write %s", path);
    return path;
}

int fuzz_report(int s)
{
    static int verbose = -1;
    if (verbose < 0) verbose = getenv("SHARDLM_FUZZ_VERBOSE") != NULL;
    if (verbose) printf("  -> %s%s%s\n", status_name((enum status)s), s ? ": " : "", s ? status_message() : "");
    return s;
}

char *fuzz_strndup(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    CHECK(s, "out of memory");
    if (size) memcpy(s, data, size);
    s[size] = 0;
    return s;
}

const struct tokenizer *fuzz_tokenizer(void)
{
    static struct tokenizer *tok;
    if (tok) return tok;
    char path[4096];
    const char *env = getenv("SHARDLM_ASSETS");
    if (env && *env) snprintf(path, sizeof path, "%s/stories260K/tok512.model", env);
    else snprintf(path, sizeof path, "%s/../shared/assets/stories260K/tok512.model", SHARDLM_SOURCE_DIR);
    if (access(path, R_OK) != 0) {
        printf("SKIP: no stories260K tokenizer at %s (set SHARDLM_ASSETS)\n", path);
        exit(77);
    }
    CHECK(tokenizer_load(path, &tok) == STATUS_OK, "%s: %s", path, status_message());
    return tok;
}
