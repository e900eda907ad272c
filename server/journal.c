/* server/journal.c - the stream journal's file: records written, read back and compacted
 * (journal.h has the format and the durability rules). */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codec.h"

#define MODULE "journal"

enum { REC_ACCEPT = 1, REC_EVENT = 2, REC_END = 3 };

struct frame {
    uint32_t len, check;
};

struct accept_head {
    uint32_t type;
    int32_t  front;
    int64_t  created;
    double   deadline;
    uint64_t seed, body_len;
};

struct event_rec {
    uint32_t type;
    int32_t  run, kind, sample, finish, status, n_tokens, n_top, has_logprobs, has_rng, has_message;
    int32_t  prompt_tokens, completion_tokens, cached_prompt_tokens;
    uint64_t seed, rng[4], text_len;
    double   queue_seconds;
};

struct late_end {
    char  *key;
    double due; /* base_now_s() from when it is written */
};

struct journal {
    pthread_mutex_t mu;
    int             fd;
    char           *path;
    enum journal_fsync policy;
    int             open_requests;  /* ACCEPTs without END */
    off_t           size;
    long long       written, synced; /* bytes appended since the open, and how many of them a
                                        journal_sync made durable (the file may be cut to 0 meanwhile) */
    uint64_t        failed_writes;
    double          end_delay_s;    /* journal_end writes END this long later (journal_set_end_delay) */
    struct late_end *late;          /* (n_late) ENDs not written yet, oldest first */
    int             n_late, cap_late;
};

enum status journal_fsync_parse(const char *s, enum journal_fsync *out)
{
    static const char *const names[] = {"accept", "always", "never"};
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, names[i])) {
            *out = (enum journal_fsync)i;
            return STATUS_OK;
        }
    return status_errorf(STATUS_INVALID_ARGUMENT, "--journal-fsync must be accept, always or never, got \"%s\"",
                         s ? s : "");
}

static uint32_t check_of(const unsigned char *p, size_t n)
{
    const uint64_t h = base_fnv1a(BASE_FNV1A_BASIS, p, n);
    return (uint32_t)(h ^ (h >> 32));
}

/* ---- entries in memory ----------------------------------------------------------------------- */

static void event_free(struct journal_event *je)
{
    free(je->tokens);
    free(je->logprobs);
    free(je->top);
    free(je->text);
    free(je->message);
}

void journal_entry_free(struct journal_entry *e)
{
    if (!e) return;
    for (int i = 0; i < e->n_events; i++) event_free(&e->events[i]);
    free(e->events);
    free(e->body);
    memset(e, 0, sizeof *e);
}

static void *dup_bytes(const void *p, size_t n)
{
    void *q = malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

enum status journal_entry_add(struct journal_entry *e, int run, const struct engine_event *ev)
{
    if (base_grow((void **)&e->events, &e->cap_events, (size_t)e->n_events + 1, sizeof *e->events) != 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "journal: out of memory");
    struct journal_event *je = &e->events[e->n_events];
    memset(je, 0, sizeof *je);
    size_t nt = ev->n_tokens > 0 ? (size_t)ev->n_tokens : 0, k = ev->top ? (size_t)ev->n_top : 0;
    *je = (struct journal_event){.run = run, .kind = ev->kind, .sample = ev->sample, .finish = ev->finish,
                                 .status = ev->status, .n_tokens = (int)nt, .n_top = (int)k,
                                 .has_logprobs = ev->logprobs != NULL, .has_rng = ev->rng != NULL,
                                 .prompt_tokens = ev->prompt_tokens, .completion_tokens = ev->completion_tokens,
                                 .cached_prompt_tokens = ev->cached_prompt_tokens, .seed = ev->seed,
                                 .queue_seconds = ev->queue_seconds, .text_len = ev->text_len};
    if (ev->rng) memcpy(je->rng, ev->rng, sizeof je->rng);
    je->tokens = dup_bytes(ev->tokens, nt * sizeof *je->tokens);
    je->text = dup_bytes(ev->text, ev->text_len);
    je->logprobs = ev->logprobs ? dup_bytes(ev->logprobs, nt * sizeof *je->logprobs) : NULL;
    je->top = k ? dup_bytes(ev->top, nt * k * sizeof *je->top) : NULL;
    je->message = ev->message ? strdup(ev->message) : NULL;
    if (!je->tokens || !je->text || (ev->logprobs && !je->logprobs) || (k && !je->top) || (ev->message && !je->message)) {
        event_free(je);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "journal: out of memory");
    }
    e->n_events++;
    return STATUS_OK;
}

enum status journal_entry_resume(const struct journal_entry *e, int run, int j, const struct request_params *p,
                                 struct request_params *rp, int32_t **tokens, uint64_t rng[4])
{
    size_t cap = 0;
    int n = 0;
    *tokens = NULL;
    engine_sample_rng(p->sampling.seed, j, rng);
    for (int k = 0; k < e->n_events; k++) {
        const struct journal_event *je = &e->events[k];
        if (je->run != run || je->sample != j || je->kind == ENGINE_EVENT_PROMPT_LOGPROBS) continue;
        if (base_grow((void **)tokens, &cap, (size_t)n + (size_t)je->n_tokens + 1, sizeof **tokens) != 0) {
            free(*tokens);
            *tokens = NULL;
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        memcpy(*tokens + n, je->tokens, (size_t)je->n_tokens * sizeof **tokens);
        n += je->n_tokens;
        if (je->has_rng) memcpy(rng, je->rng, 4 * sizeof *rng);
    }
    *rp = *p;
    rp->n = 1;
    rp->prompt_logprobs = -1;
    rp->resume_tokens = *tokens, rp->n_resume = n, rp->resume_rng = rng;
    return STATUS_OK;
}

int journal_entry_finished(const struct journal_entry *e, int run, int j)
{
    for (int k = 0; k < e->n_events; k++)
        if (e->events[k].run == run && e->events[k].sample == j && e->events[k].kind == ENGINE_EVENT_FINISHED) return 1;
    return 0;
}

void journal_event_view(const struct journal_event *je, struct engine_event *ev)
{
    *ev = (struct engine_event){.kind = (enum engine_event_kind)je->kind, .sample = je->sample,
                                .tokens = je->tokens, .n_tokens = je->n_tokens, .text = je->text,
                                .text_len = je->text_len, .logprobs = je->has_logprobs ? je->logprobs : NULL,
                                .top = je->top, .n_top = je->n_top, .finish = (enum finish_reason)je->finish,
                                .status = (enum status)je->status, .message = je->message,
                                .prompt_tokens = je->prompt_tokens, .completion_tokens = je->completion_tokens,
                                .seed = je->seed, .cached_prompt_tokens = je->cached_prompt_tokens,
                                .queue_seconds = je->queue_seconds, .rng = je->has_rng ? je->rng : NULL};
}

/* ---- records ---------------------------------------------------------------------------------- */

static void put_accept(struct wbuf *b, const struct journal_entry *e)
{
    struct accept_head h = {.type = REC_ACCEPT, .front = e->front, .created = e->created, .deadline = e->deadline,
                            .seed = e->seed, .body_len = e->body_len};
    put(b, &h, sizeof h);
    put_str(b, e->key);
    put(b, e->body, e->body_len);
    put_str(b, e->owner); /* after the body: a record without it (an older journal) has no owner */
}

static void put_event(struct wbuf *b, const char *key, int run, const struct engine_event *ev)
{
    size_t nt = ev->n_tokens > 0 ? (size_t)ev->n_tokens : 0, k = ev->top ? (size_t)ev->n_top : 0;
    struct event_rec h = {.type = REC_EVENT, .run = run, .kind = ev->kind, .sample = ev->sample,
                          .finish = ev->finish, .status = ev->status, .n_tokens = (int32_t)nt, .n_top = (int32_t)k,
                          .has_logprobs = ev->logprobs != NULL, .has_rng = ev->rng != NULL,
                          .has_message = ev->message != NULL, .prompt_tokens = ev->prompt_tokens,
                          .completion_tokens = ev->completion_tokens,
                          .cached_prompt_tokens = ev->cached_prompt_tokens, .seed = ev->seed,
                          .text_len = ev->text_len, .queue_seconds = ev->queue_seconds};
    if (ev->rng) memcpy(h.rng, ev->rng, sizeof h.rng);
    put(b, &h, sizeof h);
    put_str(b, key);
    put(b, ev->tokens, nt * sizeof(int32_t));
    put(b, ev->text, ev->text_len);
    if (ev->logprobs) put(b, ev->logprobs, nt * sizeof(float));
    if (k) put(b, ev->top, nt * k * sizeof(struct top_logprob));
    put_str(b, ev->message);
}

/* A record's buffer: its frame's place first (append fills it), so that the record is written
 * with one write(2) and no copy. */
static struct wbuf record(void)
{
    struct wbuf b = {0};
    struct frame f = {0};
    put(&b, &f, sizeof f);
    return b;
}

/* Appends one framed record (from record()); with j->mu held. */
static enum status append(struct journal *j, struct wbuf *b, int sync)
{
    enum status st = STATUS_OK;
    if (b->oom) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "journal: out of memory");
    } else {
        const size_t n = b->n - sizeof(struct frame);
        struct frame f = {.len = (uint32_t)n, .check = n ? check_of(b->p + sizeof f, n) : 0};
        memcpy(b->p, &f, sizeof f);
        size_t off = 0;
        int err = 0;
        while (off < b->n) {
            ssize_t k = write(j->fd, b->p + off, b->n - off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                err = k < 0 ? errno : EIO;
                break;
            }
            off += (size_t)k;
        }
        if (off < b->n) {
            /* A short write (the disk full) leaves part of a record: cut back to the last whole
             * one, or every record appended after it would follow a damaged one, and the next
             * start would refuse the journal or drop them. */
            st = status_errorf(STATUS_IO, "%s: %s", j->path, strerror(err));
            if (off > 0 && ftruncate(j->fd, j->size) != 0)
                LOG_ERROR(MODULE, "%s: a partial record could not be cut off (%s): the journal is damaged from "
                          "byte %lld", j->path, strerror(errno), (long long)j->size);
            else off = 0;
        } else if (sync && fdatasync(j->fd) != 0)
            st = status_errorf(STATUS_IO, "%s: fsync: %s", j->path, strerror(errno));
        j->size += (off_t)off;
        j->written += (long long)off;
        if (st == STATUS_OK && sync) j->synced = j->written;
    }
    free(b->p);
    if (st != STATUS_OK) j->failed_writes++;
    return st;
}

/* Writes END for key; with j->mu held. */
static void write_end(struct journal *j, const char *key)
{
    struct wbuf b = record();
    uint32_t type = REC_END;
    put(&b, &type, sizeof type);
    put_str(&b, key);
    if (append(j, &b, 0) == STATUS_OK && j->open_requests > 0) j->open_requests--;
    if (j->open_requests == 0 && j->size > (off_t)JOURNAL_TRUNCATE_BYTES && ftruncate(j->fd, 0) == 0) j->size = 0;
}

/* Writes the late ENDs that are due (all of them when all, or the one of key when key); with
 * j->mu held. */
static void write_late(struct journal *j, int all, const char *key)
{
    const double now = base_now_s();
    int kept = 0;
    for (int i = 0; i < j->n_late; i++) {
        struct late_end *l = &j->late[i];
        if (all || l->due <= now || (key && !strcmp(l->key, key))) {
            write_end(j, l->key);
            free(l->key);
        } else {
            j->late[kept++] = *l;
        }
    }
    j->n_late = kept;
}

void journal_set_end_delay(struct journal *j, double seconds) { j->end_delay_s = seconds > 0 ? seconds : 0; }

enum status journal_accept_write(struct journal *j, const struct journal_entry *e, long long *end)
{
    struct wbuf b = record();
    put_accept(&b, e);
    pthread_mutex_lock(&j->mu);
    write_late(j, 0, e->key); /* a key used again: its earlier request's END goes first */
    enum status st = append(j, &b, 0);
    if (st == STATUS_OK) j->open_requests++;
    *end = j->written;
    pthread_mutex_unlock(&j->mu);
    return st;
}

/* Outside the lock: the engine's events and the other fronts' ACCEPTs are written meanwhile,
 * and one fdatasync covers every record written before it began (group commit). */
enum status journal_sync(struct journal *j, long long end)
{
    pthread_mutex_lock(&j->mu);
    const long long upto = j->written;
    const int needed = j->policy != JOURNAL_FSYNC_NEVER && j->synced < end;
    pthread_mutex_unlock(&j->mu);
    if (!needed) return STATUS_OK;
    const int rc = fdatasync(j->fd);
    const int err = errno;
    pthread_mutex_lock(&j->mu);
    if (rc == 0 && upto > j->synced) j->synced = upto;
    if (rc != 0) j->failed_writes++;
    pthread_mutex_unlock(&j->mu);
    return rc == 0 ? STATUS_OK : status_errorf(STATUS_IO, "%s: fsync: %s", j->path, strerror(err));
}

enum status journal_accept(struct journal *j, const struct journal_entry *e)
{
    long long end = 0;
    enum status st = journal_accept_write(j, e, &end);
    if (st == STATUS_OK && (st = journal_sync(j, end)) != STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", status_message());
        pthread_mutex_lock(&j->mu);
        write_end(j, e->key); /* refused: a restart must not resume it */
        pthread_mutex_unlock(&j->mu);
        st = status_errorf(st, "%s", msg);
    }
    return st;
}

void journal_event(struct journal *j, const char *key, int run, const struct engine_event *ev)
{
    struct wbuf b = record();
    put_event(&b, key, run, ev);
    pthread_mutex_lock(&j->mu);
    if (j->n_late && j->late[0].due <= base_now_s()) write_late(j, 0, NULL);
    if (append(j, &b, j->policy == JOURNAL_FSYNC_ALWAYS) != STATUS_OK)
        LOG_WARN(MODULE, "request %s: an event was not journaled (%s): a restart may not resume it exactly", key,
                 status_message());
    pthread_mutex_unlock(&j->mu);
}

void journal_end(struct journal *j, const char *key)
{
    pthread_mutex_lock(&j->mu);
    size_t cap = (size_t)j->cap_late;
    char *k = j->end_delay_s > 0 ? strdup(key) : NULL;
    if (k && !base_grow((void **)&j->late, &cap, (size_t)j->n_late + 1, sizeof *j->late)) {
        j->cap_late = (int)cap;
        j->late[j->n_late++] = (struct late_end){k, base_now_s() + j->end_delay_s};
        write_late(j, 0, NULL);
    } else {
        free(k);
        write_end(j, key); /* no delay, or out of memory: now */
    }
    pthread_mutex_unlock(&j->mu);
}

/* ---- reading it back ------------------------------------------------------------------------- */

static struct journal_entry *find(struct journal_entry *v, int n, const char *key)
{
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(v[i].key, key)) return &v[i];
    return NULL;
}

/* One record's payload into the entries; 0 when it is malformed. */
static int read_record(struct rbuf *rb, struct journal_entry **v, int *n, size_t *cap)
{
    const uint32_t *type = get(rb, sizeof(uint32_t));
    if (!type) return 0;
    rb->off = 0;
    if (*type == REC_ACCEPT) {
        struct accept_head h;
        if (!get_copy(rb, &h, sizeof h)) return 0;
        const char *key = get_str(rb);
        const char *body = get(rb, h.body_len);
        if (!key || !body || strlen(key) > JOURNAL_KEY_MAX) return 0;
        struct journal_entry *old = find(*v, *n, key);
        if (old) {
            /* A second ACCEPT of an open key (a server that let the key go before the END of its
             * first request was written): the later request is the one a client can still name;
             * the earlier is dropped, never the whole journal. */
            LOG_WARN(MODULE, "req=%s: accepted again before its END: the earlier request is dropped", key);
            journal_entry_free(old);
            *old = (*v)[--*n];
        }
        if (base_grow((void **)v, cap, (size_t)*n + 1, sizeof **v) != 0) return 0;
        struct journal_entry *e = &(*v)[*n];
        memset(e, 0, sizeof *e);
        snprintf(e->key, sizeof e->key, "%s", key);
        e->front = h.front, e->created = h.created, e->deadline = h.deadline, e->seed = h.seed;
        e->body = malloc(h.body_len + 1);
        if (!e->body) return 0;
        memcpy(e->body, body, h.body_len);
        e->body[h.body_len] = '\0';
        e->body_len = h.body_len;
        const char *owner = rb->off < rb->n ? get_str(rb) : "";
        if (!owner || strlen(owner) > JOURNAL_OWNER_MAX) {
            free(e->body);
            return 0;
        }
        snprintf(e->owner, sizeof e->owner, "%s", owner);
        (*n)++;
        return 1;
    }
    if (*type == REC_END) {
        uint32_t t;
        get_copy(rb, &t, sizeof t);
        const char *key = get_str(rb);
        struct journal_entry *e = key ? find(*v, *n, key) : NULL;
        if (!e) return key != NULL; /* an END of a request compacted away: harmless */
        journal_entry_free(e);
        *e = (*v)[--*n];
        return 1;
    }
    if (*type != REC_EVENT) return 0;
    struct event_rec h;
    if (!get_copy(rb, &h, sizeof h) || h.n_tokens < 0 || h.n_tokens > (1 << 24) || h.n_top < 0 || h.n_top > 1024)
        return 0;
    const char *key = get_str(rb);
    size_t nt = (size_t)h.n_tokens;
    struct engine_event ev = {.kind = (enum engine_event_kind)h.kind, .sample = h.sample, .n_tokens = h.n_tokens,
                              .n_top = h.n_top, .finish = (enum finish_reason)h.finish, .status = (enum status)h.status,
                              .prompt_tokens = h.prompt_tokens, .completion_tokens = h.completion_tokens,
                              .seed = h.seed, .cached_prompt_tokens = h.cached_prompt_tokens,
                              .queue_seconds = h.queue_seconds, .text_len = h.text_len,
                              .rng = h.has_rng ? h.rng : NULL};
    ev.tokens = get(rb, nt * sizeof(int32_t));
    ev.text = get(rb, h.text_len);
    if (h.has_logprobs) ev.logprobs = get(rb, nt * sizeof(float));
    if (h.n_top) ev.top = get(rb, nt * (size_t)h.n_top * sizeof(struct top_logprob));
    const char *message = get_str(rb);
    if (rb->bad || !key) return 0;
    ev.message = h.has_message ? message : NULL;
    struct journal_entry *e = find(*v, *n, key);
    return !e || journal_entry_add(e, h.run, &ev) == STATUS_OK;
}

static enum status load(const char *path, struct journal_entry **out, int *n_out, size_t *valid)
{
    char *data = NULL;
    size_t len = 0;
    *out = NULL, *n_out = 0, *valid = 0;
    enum status st = base_read_file(path, 0, "journal", &data, &len);
    if (st != STATUS_OK) return st;
    struct journal_entry *v = NULL;
    int n = 0;
    size_t cap = 0, off = 0;
    while (off + sizeof(struct frame) <= len) {
        struct frame f;
        memcpy(&f, data + off, sizeof f);
        size_t body = off + sizeof f, padded = ((size_t)f.len + 7) & ~(size_t)7;
        if (padded > len - body || check_of((unsigned char *)data + body, f.len) != f.check) break;
        struct rbuf rb = {.p = (unsigned char *)data + body, .n = f.len};
        if (!read_record(&rb, &v, &n, &cap)) break;
        off = body + padded;
    }
    if (off < len) {
        /* Only the last record may be damaged: a write a kill cut short. */
        size_t next = off;
        struct frame f;
        int last = 1;
        if (off + sizeof f <= len) {
            memcpy(&f, data + off, sizeof f);
            next = off + sizeof f + (((size_t)f.len + 7) & ~(size_t)7);
            last = next >= len || f.len > len;
        }
        if (!last) {
            for (int i = 0; i < n; i++) journal_entry_free(&v[i]);
            free(v);
            free(data);
            return status_errorf(STATUS_BAD_FORMAT, "%s: a damaged record at byte %zu of %zu (not the last)", path, off,
                                 len);
        }
        LOG_WARN(MODULE, "%s: the last %zu bytes are an incomplete record (a write cut short): dropped", path, len - off);
    }
    free(data);
    *out = v, *n_out = n, *valid = off;
    return STATUS_OK;
}

/* The entries (ACCEPT and events) as the whole file at path, written beside it and renamed over
 * it (base_atomic_*: synced, the directory too), so that a crash during compaction leaves the
 * old journal. */
static enum status write_entries(const char *path, const struct journal_entry *v, int n)
{
    struct base_atomic a;
    enum status st = base_atomic_open(&a, path, 0600);
    if (st != STATUS_OK) return st;
    struct journal j = {.fd = a.fd, .path = a.tmp};
    for (int i = 0; st == STATUS_OK && i < n; i++) {
        struct wbuf b = record();
        put_accept(&b, &v[i]);
        st = append(&j, &b, 0);
        for (int k = 0; st == STATUS_OK && k < v[i].n_events; k++) {
            struct engine_event ev;
            journal_event_view(&v[i].events[k], &ev);
            b = record();
            put_event(&b, v[i].key, v[i].events[k].run, &ev);
            st = append(&j, &b, 0);
        }
    }
    if (st != STATUS_OK) {
        base_atomic_abort(&a);
        return st;
    }
    return base_atomic_commit(&a);
}

enum status journal_open(const char *dir, enum journal_fsync policy,
                         void (*upgrade_owner)(void *ctx, char *owner, size_t cap), void *ctx,
                         struct journal **out, struct journal_entry **pending, int *n_pending)
{
    *out = NULL, *pending = NULL, *n_pending = 0;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) return status_errorf(STATUS_IO, "--journal %s: %s", dir, strerror(errno));
    size_t n_path = strlen(dir) + 16;
    char *path = malloc(n_path);
    struct journal *j = calloc(1, sizeof *j);
    if (!path || !j) {
        free(path), free(j);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "journal: out of memory");
    }
    snprintf(path, n_path, "%s/journal", dir);
    struct journal_entry *v = NULL;
    int n = 0;
    size_t valid = 0;
    enum status st = access(path, F_OK) == 0 ? load(path, &v, &n, &valid) : STATUS_OK;
    for (int i = 0; st == STATUS_OK && upgrade_owner && i < n; i++) upgrade_owner(ctx, v[i].owner, sizeof v[i].owner);
    /* Compaction: the open requests alone, written beside and renamed over the old file. */
    if (st == STATUS_OK) st = write_entries(path, v, n);
    if (st == STATUS_OK) {
        j->fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (j->fd < 0) st = status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    }
    if (st != STATUS_OK) {
        for (int i = 0; i < n; i++) journal_entry_free(&v[i]);
        free(v), free(path), free(j);
        return st;
    }
    struct stat sb;
    j->size = fstat(j->fd, &sb) == 0 ? sb.st_size : 0;
    pthread_mutex_init(&j->mu, NULL);
    j->path = path;
    j->policy = policy;
    j->open_requests = n;
    *out = j, *pending = v, *n_pending = n;
    LOG_INFO(MODULE, "%s: %d open request(s) to resume (fsync %s)", path, n,
             policy == JOURNAL_FSYNC_ALWAYS ? "always" : policy == JOURNAL_FSYNC_NEVER ? "never" : "accept");
    return STATUS_OK;
}

void journal_close(struct journal *j)
{
    if (!j) return;
    if (j->fd >= 0) write_late(j, 1, NULL); /* a clean stop: every answer was handed over */
    free(j->late);
    if (j->fd >= 0) close(j->fd);
    pthread_mutex_destroy(&j->mu);
    free(j->path);
    free(j);
}
