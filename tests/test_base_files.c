/* tests/test_base_files.c - the project's whole-file writers (kernels/base/base.c): base_write_file,
 * base_write_text, base_copy_file and the base_atomic_* steps under them. A file is written whole
 * or not at all, with the mode asked for, and no temporary is left behind either way. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "check.h"

/* The number of entries in dir other than . and .. (a temporary left behind shows here). */
static int entries(const char *dir)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    if (d) closedir(d);
    return n;
}

/* The file's bytes equal want[0..n). */
static int holds(const char *path, const char *want, size_t n)
{
    char *text = NULL;
    size_t len = 0;
    if (base_read_file(path, 0, "test file", &text, &len) != STATUS_OK) return 0;
    const int ok = len == n && !memcmp(text, want, n);
    free(text);
    return ok;
}

static unsigned mode_of(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (unsigned)(sb.st_mode & 0777) : 0;
}

int main(void)
{
    char dir[] = "/tmp/shardlm-base-files-XXXXXX";
    if (!mkdtemp(dir)) {
        printf("FAIL mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    char path[256], copy[256], missing[256], fifo[256];
    snprintf(path, sizeof path, "%s/a.bin", dir);
    snprintf(copy, sizeof copy, "%s/b.bin", dir);
    snprintf(missing, sizeof missing, "%s/no-such-dir/c.bin", dir);
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    umask(022);

    check_status(base_write_file(path, "first", 5, 0600), STATUS_OK, "write a new file", NULL);
    check(holds(path, "first", 5) && mode_of(path) == 0600 && entries(dir) == 1,
          "it holds the bytes, mode 0600 (%o), nothing else in the directory (%d entries)", mode_of(path), entries(dir));
    check_status(base_write_file(path, "second, longer", 14, 0644), STATUS_OK, "write over it", NULL);
    check(holds(path, "second, longer", 14) && mode_of(path) == 0644 && entries(dir) == 1,
          "replaced whole, mode 0644 (%o), no temporary (%d entries)", mode_of(path), entries(dir));
    check_status(base_write_file(path, "", 0, 0644), STATUS_OK, "an empty file", NULL);
    check(holds(path, "", 0), "it is empty");

    check_status(base_write_text(path, "{\"a\": 1}", 0644), STATUS_OK, "a text", NULL);
    check(holds(path, "{\"a\": 1}\n", 9), "the text and a newline");

    /* Aborted: the old file stays as it was, the temporary goes. */
    struct base_atomic a;
    check_status(base_atomic_open(&a, path, 0644), STATUS_OK, "open a second writer", NULL);
    check(entries(dir) == 2, "its temporary is beside the file (%d entries)", entries(dir));
    check_status(base_atomic_write(&a, "half", 4), STATUS_OK, "write half", NULL);
    base_atomic_abort(&a);
    check(holds(path, "{\"a\": 1}\n", 9) && entries(dir) == 1, "aborted: the file unchanged, the temporary gone");

    /* Two writers of the same path at once: each its own temporary; the last commit wins. */
    struct base_atomic w1, w2;
    check_status(base_atomic_open(&w1, path, 0644), STATUS_OK, "writer 1", NULL);
    check_status(base_atomic_open(&w2, path, 0644), STATUS_OK, "writer 2", NULL);
    check(strcmp(w1.tmp, w2.tmp) != 0, "two temporaries (%s, %s)", w1.tmp, w2.tmp);
    check_status(base_atomic_write(&w1, "one", 3), STATUS_OK, "writer 1 writes", NULL);
    check_status(base_atomic_write(&w2, "two", 3), STATUS_OK, "writer 2 writes", NULL);
    check_status(base_atomic_commit(&w1), STATUS_OK, "writer 1 commits", NULL);
    check(holds(path, "one", 3), "writer 1's file");
    check_status(base_atomic_commit(&w2), STATUS_OK, "writer 2 commits", NULL);
    check(holds(path, "two", 3) && entries(dir) == 1, "writer 2's file, whole; no temporary left");

    /* Failures name the file and leave nothing behind. */
    check_status(base_write_file(missing, "x", 1, 0644), STATUS_IO, "into a missing directory", missing, NULL);
    char longp[5000];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    check_status(base_write_file(longp, "x", 1, 0644), STATUS_INVALID_ARGUMENT, "a path too long", "path too long",
                 NULL);

    /* Copies: the bytes, mode 0644; a FIFO refused (base_open_file), nothing written. */
    check_status(base_write_file(path, "copied bytes", 12, 0600), STATUS_OK, "a source", NULL);
    check_status(base_copy_file(path, copy), STATUS_OK, "copy it", NULL);
    check(holds(copy, "copied bytes", 12) && mode_of(copy) == 0644 && entries(dir) == 2, "the copy, mode 0644");
    check(mkfifo(fifo, 0600) == 0, "a FIFO");
    check_status(base_copy_file(fifo, copy), STATUS_BAD_FORMAT, "copy from a FIFO", "not a regular file", NULL);
    check(holds(copy, "copied bytes", 12) && entries(dir) == 3, "the copy unchanged, no temporary");

    /* The directory of a path (the salt's and the sync's). */
    char d1[64], d2[64], d3[64], d4[64];
    base_dir_of("a/b/c.txt", d1, sizeof d1), base_dir_of("/c.txt", d2, sizeof d2);
    base_dir_of("c.txt", d3, sizeof d3), base_dir_of("/x/y", d4, sizeof d4);
    check(!strcmp(d1, "a/b") && !strcmp(d2, "/") && !strcmp(d3, ".") && !strcmp(d4, "/x"),
          "base_dir_of: %s, %s, %s, %s", d1, d2, d3, d4);

    check_remove_tree(dir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
