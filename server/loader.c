/* server/loader.c - work off the completion-queue loop, on threads of their own, one lane of
 * them per kind of work. The load thread reads and checks each LoadAdapter's adapter
 * (engine_load_adapter: file reads that may take seconds, or hang on a dead network mount), and
 * loads the served model that a gRPC call names when it is not loaded (serve --models-max,
 * --sleep-idle-seconds: server_acquire). The two work threads run the methods whose CPU work
 * grows with the request (Tokenize of up to 1 MiB of text, about 0.45 s; Detokenize; Embed's
 * tokenization), the two prompt threads Generate's and Chat's prompts (the template with the
 * tools, the tokenizer), the journal thread the fdatasync of a journaled Generate's or Chat's
 * ACCEPT (milliseconds each, more on a busy disk), so that many of them do not stall every
 * stream. Meanwhile the loop goes on answering every other call. A lane's jobs start in order;
 * with two threads a Chat with megabytes of tools delays no other Chat's start unless two such
 * are ahead of it. A model's load ends by dispatching the call's request again (call_dispatch),
 * the model pinned by the job until then.
 *
 * Ownership: the loop thread parses the request and queues a job (loader_submit,
 * loader_submit_model, loader_submit_work); the call keeps a pointer to it (call.load_job), and
 * call_maybe_free keeps the call while it is set, so a client cancel or a deadline during the job
 * never frees the call under the thread. A thread touches only the job, the engine (thread-safe)
 * and the call's pinned model (read only), never the call's state: it puts the finished job on
 * its done list and wakes the loop, which answers the call there (loader_drain: call_reply /
 * call_fail do nothing to a call that has ended) and lets it be freed. A job whose call ended
 * before it started is skipped. A load that finished for a call that has ended stays loaded (the
 * client may list and unload it). Drain: the server's loop runs until every call is freed, so it
 * waits for a job in progress; the engine is freed after the threads stopped.
 *
 * Test hooks (seconds, read once when a thread starts): $SHARDLM_TEST_LOAD_DELAY_S makes every
 * load wait that long first, $SHARDLM_TEST_WORK_DELAY_S every work job, $SHARDLM_TEST_GEN_DELAY_S
 * every prompt, $SHARDLM_TEST_SYNC_DELAY_S every ACCEPT's sync, so that tests can show other calls
 * answered meanwhile.
 * Not here: parsing and the other methods (methods.c), the call's state machine (call.c).
 * Tests: tests/server/test_lora_serving.py (run_time: a FIFO refused at once, calls answered
 * during a slow load, a client cancel during a load); tests/server/test_models_lru.py (gRPC calls
 * for a model not loaded: Generate, GetModelInfo, answered after its load, other calls during it);
 * tests/server/test_server.py (group work: calls answered during a slow Tokenize, Embed, Generate). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert.h"
#include "server_internal.h"

void loader_init(struct server *s)
{
    for (int i = 0; i < LANE_COUNT; i++) {
        pthread_mutex_init(&s->lanes[i].mu, NULL);
        pthread_cond_init(&s->lanes[i].cv, NULL);
    }
}

void loader_destroy(struct server *s)
{
    for (int i = 0; i < LANE_COUNT; i++) {
        pthread_mutex_destroy(&s->lanes[i].mu);
        pthread_cond_destroy(&s->lanes[i].cv);
    }
}

static void job_free(struct load_job *j)
{
    if (!j) return;
    free(j->name);
    free(j->path);
    free(j->request);
    free(j->out);
    free(j);
}

/* The adapter just loaded, for the response (rank and alpha), and how many are loaded. */
struct adapter_lookup {
    const char *name;
    struct engine_adapter_info found;
    int n;
};

static void find_adapter(void *ctx, const struct engine_adapter_info *a)
{
    struct adapter_lookup *q = ctx;
    if (!strcmp(a->name, q->name)) q->found = (struct engine_adapter_info){.rank = a->rank, .alpha = a->alpha};
    q->n++;
}

/* A loader thread: the load or the work itself, its outcome into j. */
static void job_run(struct server *s, struct job_lane *lane, struct load_job *j)
{
    if (lane->test_delay_s > 0) {
        struct timespec ts = {(time_t)lane->test_delay_s,
                              (long)((lane->test_delay_s - (double)(time_t)lane->test_delay_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (j->work) {
        j->st = j->work(j);
        if (j->st != STATUS_OK) snprintf(j->message, sizeof j->message, "%s", status_message());
        return;
    }
    if (j->wakes_model) {
        j->st = server_acquire(s, j->name, 1, &j->pinned);
        if (j->st != STATUS_OK) snprintf(j->message, sizeof j->message, "%s", status_message());
        return;
    }
    struct engine *e = j->call->m->engine; /* pinned by the call, which the job keeps */
    enum status st = engine_load_adapter(e, j->name, j->path);
    if (st == STATUS_OK) {
        LOG_INFO("server", "LoadAdapter '%s' from %s into model %s", j->name, j->path, j->call->m->model_id);
        struct adapter_lookup q = {.name = j->name};
        engine_list_adapters(e, find_adapter, &q);
        struct engine_model_info info;
        engine_get_model_info(e, &info);
        st = convert_load_adapter_response(&q.found, q.n, info.max_loras, &j->out, &j->out_len);
    }
    j->st = st;
    if (st != STATUS_OK) snprintf(j->message, sizeof j->message, "%s", status_message());
}

struct lane_arg {
    struct server   *s;
    struct job_lane *lane;
};

static void *loader_main(void *arg)
{
    struct lane_arg a = *(struct lane_arg *)arg;
    free(arg);
    struct job_lane *lane = a.lane;
    pthread_mutex_lock(&lane->mu);
    for (;;) {
        while (!lane->todo && !lane->stop) pthread_cond_wait(&lane->cv, &lane->mu);
        struct load_job *j = lane->todo;
        if (!j) break; /* stopping, nothing left */
        lane->todo = j->next;
        if (!lane->todo) lane->todo_tail = NULL;
        pthread_mutex_unlock(&lane->mu);
        if (atomic_load(&j->abandoned) && !j->runs_abandoned) {
            j->st = STATUS_CANCELLED;
            snprintf(j->message, sizeof j->message, "the call ended before its %s started", j->work ? "work" : "load");
        } else {
            job_run(a.s, lane, j);
        }
        pthread_mutex_lock(&lane->mu);
        j->next = lane->done;
        lane->done = j;
        pthread_mutex_unlock(&lane->mu);
        server_wake(a.s);
        pthread_mutex_lock(&lane->mu);
    }
    pthread_mutex_unlock(&lane->mu);
    return NULL;
}

/* Starts j's lane's threads on first use and queues j for them (c keeps it: call.load_job). The
 * work and prompt lanes have two threads, so that one big Tokenize or Chat does not hold up the
 * next (jobs start in order; each call's job is its own); loads run one at a time, and the
 * journal's syncs cover each other (journal_sync). */
static enum status job_queue(struct call *c, struct load_job *j)
{
    struct server *s = c->s;
    static const char *const names[LANE_COUNT] = {"load", "work", "prompt", "journal"};
    static const char *const hooks[LANE_COUNT] = {"SHARDLM_TEST_LOAD_DELAY_S", "SHARDLM_TEST_WORK_DELAY_S",
                                                  "SHARDLM_TEST_GEN_DELAY_S", "SHARDLM_TEST_SYNC_DELAY_S"};
    static const int threads[LANE_COUNT] = {1, LANE_THREADS_MAX, LANE_THREADS_MAX, 1};
    const int k = j->lane;
    struct job_lane *lane = &s->lanes[k];
    j->call = c;
    atomic_init(&j->abandoned, 0);
    if (!lane->n_threads) {
        lane->test_delay_s = server_test_delay(hooks[k]);
        while (lane->n_threads < threads[k]) {
            struct lane_arg *a = malloc(sizeof *a);
            if (a) *a = (struct lane_arg){s, lane};
            if (!a || pthread_create(&lane->threads[lane->n_threads], NULL, loader_main, a) != 0) {
                free(a);
                break;
            }
            lane->n_threads++;
        }
        if (!lane->n_threads) {
            job_free(j);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cannot start the loader's %s thread", names[k]);
        }
    }
    c->load_job = j;
    pthread_mutex_lock(&lane->mu);
    if (lane->todo_tail) lane->todo_tail->next = j;
    else lane->todo = j;
    lane->todo_tail = j;
    pthread_cond_signal(&lane->cv);
    pthread_mutex_unlock(&lane->mu);
    return STATUS_OK;
}

void loader_submit(struct call *c, char *name, char *path)
{
    struct load_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(name);
        free(path);
        call_fail_status(c, STATUS_RESOURCE_EXHAUSTED, "out of memory for LoadAdapter");
        return;
    }
    j->name = name;
    j->path = path;
    enum status st = job_queue(c, j);
    if (st != STATUS_OK) call_fail_status(c, st, status_message());
}

/* A job holding a copy of data[0..len), or NULL (out of memory). */
static struct load_job *job_with_request(const uint8_t *data, size_t len)
{
    struct load_job *j = calloc(1, sizeof *j);
    if (j && !(j->request = malloc(len ? len : 1))) {
        free(j);
        return NULL;
    }
    if (j && len) memcpy(j->request, data, len);
    if (j) j->request_len = len;
    return j;
}

enum status loader_submit_model(struct call *c, const char *name, const uint8_t *data, size_t len)
{
    struct load_job *j = job_with_request(data, len);
    if (j) j->name = strdup(name ? name : "");
    if (!j || !j->name) {
        job_free(j);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory queueing a model's load");
    }
    j->wakes_model = 1;
    return job_queue(c, j);
}

enum status loader_submit_work(struct call *c, enum job_lane_kind lane, unsigned flags, call_work_fn work, call_then_fn then,
                               void *ctx, const uint8_t *data, size_t len)
{
    struct load_job *j = job_with_request(data, len);
    if (!j) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory queueing %s", call_method_name(c->method));
    j->lane = lane;
    j->runs_abandoned = !!(flags & JOB_RUNS_ABANDONED);
    j->work = work;
    j->then = then;
    j->ctx = ctx;
    return job_queue(c, j); /* on an error it freed j, not ctx */
}

void loader_drain(struct server *s)
{
    for (int k = 0; k < LANE_COUNT; k++) {
        struct job_lane *lane = &s->lanes[k];
        if (!lane->n_threads) continue;
        pthread_mutex_lock(&lane->mu);
        struct load_job *done = lane->done;
        lane->done = NULL;
        pthread_mutex_unlock(&lane->mu);
        while (done) {
            struct load_job *j = done;
            done = j->next;
            struct call *c = j->call;
            c->load_job = NULL;
            const int ended = c->close_done || c->send_has_status; /* the client went away meanwhile */
            if (j->then) {
                if (j->st == STATUS_OK && ended) {
                    j->st = STATUS_CANCELLED;
                    snprintf(j->message, sizeof j->message, "the call ended while its work ran");
                }
                j->then(j); /* takes j->ctx */
            } else if (j->wakes_model) {
                /* The model is loaded (and pinned by the job): the call's request runs now. */
                if (j->st != STATUS_OK) call_fail_status(c, j->st, j->message);
                else if (!ended) call_dispatch(c, j->request, j->request_len);
                server_release(s, j->pinned);
            } else if (j->st == STATUS_OK) {
                call_reply(c, j->out, j->out_len); /* takes j->out */
                j->out = NULL;
            } else {
                call_fail_status(c, j->st, j->message);
            }
            job_free(j);
            call_maybe_free(c);
        }
    }
}

void loader_stop(struct server *s)
{
    for (int k = 0; k < LANE_COUNT; k++) {
        struct job_lane *lane = &s->lanes[k];
        if (!lane->n_threads) continue;
        pthread_mutex_lock(&lane->mu);
        lane->stop = 1;
        pthread_cond_broadcast(&lane->cv);
        pthread_mutex_unlock(&lane->mu);
        for (int i = 0; i < lane->n_threads; i++) pthread_join(lane->threads[i], NULL);
        lane->n_threads = 0;
        CHECK(!lane->todo && !lane->done, "loader jobs left after the last call was freed");
    }
}
