/* tests/test_journal_file.c - the stream journal's file (server/journal.c) read back after
 * writes a server can make:
 *  - a key accepted twice with no END between (a server that let a key go before its first
 *    request's END was written: the bug found by review on 2026-11-29) loads, the later request
 *    open with only its own events; it used to make the whole journal unreadable (the server
 *    would not start);
 *  - an ended request is not offered again, an open one is, with its events in order;
 *  - a record cut short at the end (a killed write) is dropped, the rest loads;
 *  - a write cut short in the middle (the disk full: here RLIMIT_FSIZE) is cut off again, so
 *    that the records appended after it load (before, the next start refused the journal).
 * Usage: test_journal_file (makes its own directory under $TMPDIR). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"
#include "engine.h"
#include "journal.h"

static int failures;
#define EXPECT(cond, ...)                                                 \
    do {                                                                  \
        if (cond) printf("ok   - " __VA_ARGS__);                          \
        else printf("FAIL - " __VA_ARGS__), failures++;                   \
        printf("\n");                                                     \
    } while (0)

static void accept_one(struct journal *j, const char *key, const char *body)
{
    struct journal_entry e = {.front = 1, .created = 1, .seed = 7, .body = (char *)body, .body_len = strlen(body)};
    snprintf(e.key, sizeof e.key, "%s", key);
    if (journal_accept(j, &e) != STATUS_OK) {
        printf("FAIL - journal_accept %s: %s\n", key, status_message());
        exit(1);
    }
}

static void event_one(struct journal *j, const char *key, int32_t token, const char *text)
{
    struct engine_event ev = {.kind = ENGINE_EVENT_TOKENS, .request_id = key, .sample = 0, .tokens = &token,
                              .n_tokens = 1, .text = text, .text_len = strlen(text), .queue_seconds = -1.0};
    journal_event(j, key, 0, &ev);
}

static struct journal_entry *find(struct journal_entry *v, int n, const char *key)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].key, key)) return &v[i];
    return NULL;
}

int main(void)
{
    char dir[] = "/tmp/shardlm-journal-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    struct journal *j;
    struct journal_entry *pending;
    int n;
    if (journal_open(dir, JOURNAL_FSYNC_NEVER, NULL, NULL, &j, &pending, &n) != STATUS_OK || n != 0) {
        printf("FAIL - journal_open of an empty directory: %s\n", status_message());
        return 1;
    }
    free(pending);
    accept_one(j, "dup", "{\"first\":1}");
    event_one(j, "dup", 11, "a");
    accept_one(j, "done", "{}");
    event_one(j, "done", 5, "x");
    journal_end(j, "done");
    accept_one(j, "dup", "{\"second\":2}"); /* no END of the first between */
    event_one(j, "dup", 22, "b");
    event_one(j, "dup", 23, "c");
    accept_one(j, "open", "{\"o\":3}");
    event_one(j, "open", 9, "z");
    journal_close(j);

    /* A write cut short at the end: half of a record's bytes. */
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/journal", dir);
    FILE *f = fopen(path, "ab");
    if (!f) return 1;
    const unsigned char cut[12] = {200, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0};
    fwrite(cut, 1, sizeof cut, f);
    fclose(f);

    enum status st = journal_open(dir, JOURNAL_FSYNC_NEVER, NULL, NULL, &j, &pending, &n);
    EXPECT(st == STATUS_OK, "a journal with a key accepted twice and a cut last record opens (%s)",
           st == STATUS_OK ? "ok" : status_message());
    if (st != STATUS_OK) return 1;
    struct journal_entry *dup = find(pending, n, "dup"), *open_ = find(pending, n, "open");
    EXPECT(n == 2 && dup && open_ && !find(pending, n, "done"), "two open requests (%d): the ended one is gone", n);
    EXPECT(dup && !strcmp(dup->body, "{\"second\":2}"), "the key accepted twice is the later request (%s)",
           dup ? dup->body : "-");
    EXPECT(dup && dup->n_events == 2 && dup->events[0].n_tokens == 1 && dup->events[0].tokens[0] == 22 &&
               dup->events[1].tokens[0] == 23,
           "with only its own events (%d)", dup ? dup->n_events : -1);
    EXPECT(open_ && open_->n_events == 1 && open_->events[0].tokens[0] == 9, "the other open request keeps its event");
    for (int i = 0; i < n; i++) journal_entry_free(&pending[i]);
    free(pending);
    journal_close(j);

    /* A write cut short in the middle: the file may grow by 10 bytes only while a 1,000-byte
     * ACCEPT is written (the write fails with EFBIG, SIGXFSZ ignored), then by anything again. */
    char dir2[] = "/tmp/shardlm-journal-XXXXXX";
    if (!mkdtemp(dir2)) return 1;
    if (journal_open(dir2, JOURNAL_FSYNC_NEVER, NULL, NULL, &j, &pending, &n) != STATUS_OK) return 1;
    free(pending);
    accept_one(j, "before", "{}");
    char path2[sizeof dir2 + 16];
    snprintf(path2, sizeof path2, "%s/journal", dir2);
    struct stat sb;
    struct rlimit old_limit, small;
    char big[1001];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    if (stat(path2, &sb) != 0 || getrlimit(RLIMIT_FSIZE, &old_limit) != 0) return 1;
    signal(SIGXFSZ, SIG_IGN);
    small = old_limit;
    small.rlim_cur = (rlim_t)sb.st_size + 10;
    struct journal_entry e = {.front = 1, .created = 1, .seed = 7, .body = big, .body_len = strlen(big)};
    snprintf(e.key, sizeof e.key, "torn");
    st = setrlimit(RLIMIT_FSIZE, &small) == 0 ? journal_accept(j, &e) : STATUS_INTERNAL;
    setrlimit(RLIMIT_FSIZE, &old_limit);
    EXPECT(st == STATUS_IO, "an ACCEPT the disk could not take fails (%s)", st == STATUS_IO ? "io" : status_message());
    struct stat after;
    EXPECT(stat(path2, &after) == 0 && after.st_size == sb.st_size, "and its 10 written bytes are cut off (%lld -> %lld)",
           (long long)sb.st_size, (long long)after.st_size);
    accept_one(j, "after", "{\"a\":1}");
    event_one(j, "after", 4, "q");
    journal_close(j);
    st = journal_open(dir2, JOURNAL_FSYNC_NEVER, NULL, NULL, &j, &pending, &n);
    EXPECT(st == STATUS_OK && n == 2 && find(pending, n, "before") && find(pending, n, "after") &&
               find(pending, n, "after")->n_events == 1 && !find(pending, n, "torn"),
           "the journal opens with the requests before and after the failed write (%s, %d open)",
           st == STATUS_OK ? "ok" : status_message(), st == STATUS_OK ? n : -1);
    if (st == STATUS_OK) {
        for (int i = 0; i < n; i++) journal_entry_free(&pending[i]);
        free(pending);
        journal_close(j);
    }
    char cmd2[sizeof dir2 + 16];
    snprintf(cmd2, sizeof cmd2, "rm -rf %s", dir2);
    if (system(cmd2) != 0) printf("(could not remove %s)\n", dir2);
    char cmd[sizeof dir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("(could not remove %s)\n", dir);
    printf(failures ? "%d check(s) failed\n" : "all journal file checks passed\n", failures);
    return failures != 0;
}
