/* server/journal.h - the stream journal (`serve --journal DIR`, docs/reliability.md): an
 * append-only file of the requests the server accepted and every engine event of theirs, so that
 * a restarted server resumes each request that had not ended and a client that reconnects gets
 * the rest of its answer exactly once.
 *
 * The file DIR/journal holds records, each `u32 length, u32 check, payload` (check: FNV-1a of the
 * payload folded to 32 bits; a short or damaged last record, the write a kill cut, is dropped at
 * load and logged). Payloads, written with kernels/base/codec.h:
 *   ACCEPT  key, front kind, created (Unix s), deadline (Unix s, 0 none: gRPC calls carry theirs,
 *           HTTP requests have none), seed, the request body, its owner (auth_owner: a salted
 *           hash of its API key, "" without keys; absent in records of older versions)
 *   EVENT   key, run, and the engine event (kind, sample, tokens, text, log-probabilities and
 *           their top alternatives, finish, status, message, usage, the sample's RNG state)
 *   END     key: the request ended and its client has its answer; the journal forgets it
 * Durability (`--journal-fsync`): ACCEPT is written and fsync'd before the engine sees the
 * request (an accepted request is never lost, even to a power cut, under `accept` and
 * `always`); EVENT is written (write(2)) before the client is sent what it carries, so a killed
 * process loses none (the page cache keeps them), and fsync'd per event only under `always`.
 * A machine crash under `accept` may lose events the client already saw: resumed, such a sample
 * regenerates them from the last RNG state on disk, which gives the same tokens only under
 * `--batch-invariant` (docs/determinism.md).
 *
 * At open, the records of requests that ended are dropped (the file is rewritten, fsync'd and
 * renamed over the old one) and the others returned; the file is truncated whenever no request
 * is open and it has grown past JOURNAL_TRUNCATE_BYTES.
 * Not here: what the records mean to a front (http_resume.c, grpc_resume.c; resume.c hands
 * them out), the engine's resumption (request_params.resume_*).
 * Tests: tests/server/test_journal.py, tests/server/test_journal_grpc.py.
 * Threads: every call is thread-safe (one mutex); journal_event is called on engine threads. */
#ifndef SHARDLM_JOURNAL_H
#define SHARDLM_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

#define JOURNAL_KEY_MAX 100                    /* bytes of a key (a request id) */
#define JOURNAL_TRUNCATE_BYTES (64u << 20)

enum journal_fsync { JOURNAL_FSYNC_ACCEPT = 0, JOURNAL_FSYNC_ALWAYS, JOURNAL_FSYNC_NEVER };
/* "accept", "always" or "never" into *out; anything else STATUS_INVALID_ARGUMENT naming them. */
enum status journal_fsync_parse(const char *s, enum journal_fsync *out);

/* Which front and endpoint a journaled request came through (its body is that endpoint's: the
 * OpenAI JSON, or the gRPC method's protobuf request). Values reach the file: only appended. */
enum journal_front {
    JOURNAL_HTTP_COMPLETIONS = 1,
    JOURNAL_HTTP_CHAT = 2,
    JOURNAL_GRPC_GENERATE = 3,
    JOURNAL_GRPC_GENERATE_STREAM = 4,
    JOURNAL_GRPC_CHAT = 5,
    JOURNAL_GRPC_CHAT_STREAM = 6,
    JOURNAL_HTTP_MESSAGES = 7,  /* Anthropic's /v1/messages: its body */
    JOURNAL_HTTP_RESPONSES = 8, /* /v1/responses: the translated request (http_responses_journal_body) */
};

/* One engine event as journaled (owned copies; an engine_event view of it: journal_event_view). */
struct journal_event {
    int       run;                 /* the front's engine request (a completions prompt) */
    int       kind, sample, finish, status, n_tokens, n_top, has_logprobs, has_rng;
    int       prompt_tokens, completion_tokens, cached_prompt_tokens;
    uint64_t  seed, rng[4];
    double    queue_seconds;
    int32_t  *tokens;
    float    *logprobs;
    struct top_logprob *top;
    char     *text;                /* text_len bytes */
    size_t    text_len;
    char     *message;             /* NULL when none */
};
void journal_event_view(const struct journal_event *je, struct engine_event *ev);

/* An accepted request and its events so far. */
#define JOURNAL_OWNER_MAX 63 /* bytes of an owner (auth_owner: 36; 20 before owner.salt) */
struct journal_entry {
    char      key[JOURNAL_KEY_MAX + 1];
    char      owner[JOURNAL_OWNER_MAX + 1]; /* who may reattach (auth_owner; "" without API keys) */
    int       front;               /* enum journal_front */
    long long created;
    double    deadline;            /* Unix seconds, 0 = none */
    uint64_t  seed;
    char     *body;                /* body_len bytes, NUL-terminated */
    size_t    body_len;
    struct journal_event *events;  /* (n_events) in the order they were journaled */
    int       n_events;
    size_t    cap_events;
};
void journal_entry_free(struct journal_entry *e); /* its contents; accepts NULL */

struct journal;

/* Opens (creating) DIR/journal: *pending (n_pending, the caller frees each with
 * journal_entry_free and the array with free) receives every request without an END, in
 * acceptance order. upgrade_owner (NULL: none) may rewrite each pending request's owner in place
 * (a buffer of JOURNAL_OWNER_MAX + 1 bytes; the server's auth_owner_upgrade) before the file is
 * compacted, so that the rewritten file holds the owners it returns. Errors: STATUS_IO naming
 * the path; a damaged record before the last is STATUS_BAD_FORMAT naming its offset (the file is
 * left as it is). */
enum status journal_open(const char *dir, enum journal_fsync policy,
                         void (*upgrade_owner)(void *ctx, char *owner, size_t cap), void *ctx,
                         struct journal **out, struct journal_entry **pending, int *n_pending);
void        journal_close(struct journal *j); /* accepts NULL */

/* Appends ACCEPT for e (events ignored), fsync'd unless the policy is `never`; STATUS_IO when
 * the write fails (the caller refuses the request: it could not survive a restart). */
enum status journal_accept(struct journal *j, const struct journal_entry *e);
/* journal_accept in two steps, so that a thread that must not wait for the disk (the gRPC loop)
 * hands the second to another: the ACCEPT written, not synced, *end the journal's bytes written
 * by then; then journal_sync makes everything written up to end durable (one fdatasync, outside
 * the journal's lock, covers the records of every writer before it; nothing to do when another
 * sync covered end, or with the policy `never`). Durable only once journal_sync returned OK. */
enum status journal_accept_write(struct journal *j, const struct journal_entry *e, long long *end);
enum status journal_sync(struct journal *j, long long end);
/* Appends EVENT; a failed write is logged and counted, never fatal (the request goes on; a
 * restart may not resume it exactly). je NULL: built from ev. */
void        journal_event(struct journal *j, const char *key, int run, const struct engine_event *ev);
/* Appends END (no fsync), journal_set_end_delay's seconds later: until then a crash leaves the
 * request open, so that after the restart its client, who may not have read the answer's last
 * bytes, can still fetch it (whole: every sample has finished). Late ENDs are written by the
 * next accept / event / end once due, at once by an accept of the same key, and all by
 * journal_close. */
void        journal_end(struct journal *j, const char *key);
/* The delay of END (0: at once, the default). */
void        journal_set_end_delay(struct journal *j, double seconds);

/* A copy of ev (with run) appended to e->events; STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status journal_entry_add(struct journal_entry *e, int run, const struct engine_event *ev);
/* The request that resumes sample j of run `run` in e, both fronts' (http_resume.c,
 * grpc_resume.c): *rp = *p for one sample (n 1, no prompt log-probabilities) whose resume_*
 * are the tokens it generated so far (*tokens, malloc'd: the caller frees it after
 * engine_submit) and the RNG state to go on from (rng; the seed's stream for sample j when it
 * has no event yet). STATUS_RESOURCE_EXHAUSTED when out of memory. */
enum status journal_entry_resume(const struct journal_entry *e, int run, int j, const struct request_params *p,
                                 struct request_params *rp, int32_t **tokens, uint64_t rng[4]);
/* 1 when sample j of run `run` has its FINISHED event in e. */
int         journal_entry_finished(const struct journal_entry *e, int run, int j);

#endif
