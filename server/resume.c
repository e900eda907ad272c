/* server/resume.c - the stream journal's requests, both fronts (journal.h, docs/reliability.md):
 * opening the journal at start, handing each open request to its front to resume
 * (http_resume.c, grpc_resume.c), the one registry of request ids that are taken (a first run's
 * id in s->live, a resumed request's in s->resumed or s->grpc_jobs), the retention sweep and
 * the stop.
 * Not here: the file (journal.c), how a front rebuilds and answers a request.
 * Tests: tests/server/test_journal.py (HTTP), tests/server/test_journal_grpc.py (gRPC). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "journal.h"
#include <sys/random.h>

#include "server_internal.h"

#define MODULE "journal"

void resume_new_id(const struct server *s, const char *kind, char *out, size_t cap)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) { /* (no entropy yet: never on a running system) */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)out;
        r ^= r >> 33, r *= 0xff51afd7ed558ccdull, r ^= r >> 33;
    }
    snprintf(out, cap, "%s-%s-%016llx", kind, s->boot_id, (unsigned long long)r);
}

/* journal_open's owner migration: owners journaled before owner.salt become their key's. */
static void upgrade_owner(void *ctx, char *owner, size_t cap) { auth_owner_upgrade(ctx, owner, cap); }

enum status resume_open(struct server *s)
{
    pthread_mutex_init(&s->resumed_mu, NULL);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 48;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    snprintf(s->boot_id, sizeof s->boot_id, "%012llx", (unsigned long long)(x & 0xffffffffffffull));
    enum status st = journal_open(s->opts.journal_dir, (enum journal_fsync)s->opts.journal_fsync, upgrade_owner, s,
                                  &s->journal, &s->journal_pending, &s->n_journal_pending);
    if (st == STATUS_OK) journal_set_end_delay(s->journal, s->opts.journal_end_delay_s);
    return st;
}

void resume_all(struct server *s)
{
    int resumed = 0;
    for (int k = 0; k < s->n_journal_pending; k++) {
        struct journal_entry *e = &s->journal_pending[k];
        switch (e->front) {
        case JOURNAL_HTTP_COMPLETIONS:
        case JOURNAL_HTTP_CHAT:
        case JOURNAL_HTTP_MESSAGES:
        case JOURNAL_HTTP_RESPONSES: resumed += http_resume_entry(s, e); break;
        case JOURNAL_GRPC_GENERATE:
        case JOURNAL_GRPC_GENERATE_STREAM:
        case JOURNAL_GRPC_CHAT:
        case JOURNAL_GRPC_CHAT_STREAM: resumed += grpc_resume_entry(s, e); break;
        default:
            LOG_ERROR(MODULE, "req=%s: front %d is not journaled by this version: forgotten", e->key, e->front);
            journal_end(s->journal, e->key);
        }
        journal_entry_free(e); /* emptied when its front took it */
    }
    if (s->n_journal_pending)
        LOG_INFO(MODULE, "resumed %d of %d journaled request(s)", resumed, s->n_journal_pending);
    free(s->journal_pending);
    s->journal_pending = NULL;
    s->n_journal_pending = 0;
}

enum resume_key_state resume_key_state(struct server *s, const char *key)
{
    for (struct resume_key *k = s->live; k; k = k->next)
        if (!strcmp(k->key, key)) return RESUME_KEY_LIVE;
    if (http_resume_find(s, key)) return RESUME_KEY_RESUMED_HTTP;
    if (grpc_resume_find(s, key)) return RESUME_KEY_RESUMED_GRPC;
    return RESUME_KEY_FREE;
}

enum resume_key_state resume_key_claim(struct server *s, struct resume_key *k)
{
    pthread_mutex_lock(&s->resumed_mu);
    enum resume_key_state st = resume_key_state(s, k->key);
    if (st == RESUME_KEY_FREE) {
        k->next = s->live, k->prev = NULL;
        if (s->live) s->live->prev = k;
        s->live = k;
        k->in_list = 1;
    }
    pthread_mutex_unlock(&s->resumed_mu);
    return st;
}

void resume_key_unlink(struct server *s, struct resume_key *k)
{
    if (!k->in_list) return;
    if (k->prev) k->prev->next = k->next;
    else s->live = k->next;
    if (k->next) k->next->prev = k->prev;
    k->in_list = 0;
}

void resume_key_release(struct server *s, struct resume_key *k)
{
    if (!k->in_list) return;
    pthread_mutex_lock(&s->resumed_mu);
    resume_key_unlink(s, k);
    pthread_mutex_unlock(&s->resumed_mu);
}

const char *resume_detach_full(struct server *s, const char *owner, char *buf, size_t n)
{
    const int max = s->opts.journal_detach_max > 0 ? s->opts.journal_detach_max : 256;
    const int per_key = s->opts.journal_detach_max_per_key > 0 ? s->opts.journal_detach_max_per_key
                        : s->n_keys >= 2                       ? (max + 1) / 2
                                                               : max;
    if (http_resume_detached(s, NULL) + grpc_resume_detached(s, NULL) >= max) {
        snprintf(buf, n, "--journal-detach-max (%d)", max);
        return buf;
    }
    if (owner && *owner && per_key < max && http_resume_detached(s, owner) + grpc_resume_detached(s, owner) >= per_key) {
        snprintf(buf, n, "--journal-detach-max-per-key (%d) of its API key's", per_key);
        return buf;
    }
    return NULL;
}

void resume_sweep(struct server *s)
{
    if (!s->journal) return;
    http_resume_sweep(s);
    grpc_resume_sweep(s);
}

void resume_stop(struct server *s)
{
    if (!s->journal) return;
    for (int k = 0; k < s->n_journal_pending; k++) journal_entry_free(&s->journal_pending[k]); /* never resumed */
    free(s->journal_pending);
    s->journal_pending = NULL;
    s->n_journal_pending = 0;
    http_resume_stop(s);
    grpc_resume_stop(s);
    pthread_mutex_destroy(&s->resumed_mu);
}

int server_cut_event(struct server *s, enum engine_event_kind kind, enum finish_reason finish, enum status st,
                     int by_client)
{
    return (kind == ENGINE_EVENT_FINISHED && finish == FINISH_REASON_CANCELLED && !by_client &&
            atomic_load(&s->phase) >= PHASE_DRAINING) ||
           engine_event_is_failure(kind, finish, st);
}
