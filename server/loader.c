/* server/loader.c - loads off the completion-queue loop: one loader thread reads and checks each
 * LoadAdapter's adapter (engine_load_adapter: file reads that may take seconds, or hang on a dead
 * network mount), and loads the served model that a gRPC call names when it is not loaded
 * (serve --models-max, --sleep-idle-seconds: server_acquire), while the loop goes on answering
 * every other call. Loads run one at a time, in order. A model's load ends by dispatching the
 * call's request again (call_dispatch), the model pinned by the job until then.
 *
 * Ownership: the loop thread parses the request and queues a job (loader_submit); the call keeps
 * a pointer to it (call.load_job), and call_maybe_free keeps the call while it is set, so a
 * client cancel or a deadline during the load never frees the call under the loader. The loader
 * touches only the job and the engine (thread-safe), never the call: it puts the finished job on
 * the done list and wakes the loop, which answers the call there (loader_drain: call_reply /
 * call_fail do nothing to a call that has ended) and lets it be freed. A job whose call ended
 * before its load started is skipped. A load that finished for a call that has ended stays
 * loaded (the client may list and unload it). Drain: the server's loop runs until every call is
 * freed, so it waits for a load in progress; the engine is freed after the loader stopped.
 *
 * Test hook: $SHARDLM_TEST_LOAD_DELAY_S (seconds, read once when the thread starts) makes every
 * load wait that long first, so that tests can show other calls answered during a slow load.
 * Not here: parsing and the other methods (methods.c), the call's state machine (call.c).
 * Tests: tests/server/test_lora_serving.py (run_time: a FIFO refused at once, calls answered
 * during a slow load, a client cancel during a load); tests/server/test_models_lru.py (gRPC calls
 * for a model not loaded: Generate, GetModelInfo, answered after its load, other calls during it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "convert.h"
#include "server_internal.h"

void loader_init(struct server *s)
{
    pthread_mutex_init(&s->load_mu, NULL);
    pthread_cond_init(&s->load_cv, NULL);
}

void loader_destroy(struct server *s)
{
    pthread_mutex_destroy(&s->load_mu);
    pthread_cond_destroy(&s->load_cv);
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

/* Loader thread: the load itself, its outcome into j. */
static void job_run(struct server *s, struct load_job *j)
{
    if (s->load_test_delay_s > 0) {
        struct timespec ts = {(time_t)s->load_test_delay_s,
                              (long)((s->load_test_delay_s - (double)(time_t)s->load_test_delay_s) * 1e9)};
        nanosleep(&ts, NULL);
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

static void *loader_main(void *arg)
{
    struct server *s = arg;
    pthread_mutex_lock(&s->load_mu);
    for (;;) {
        while (!s->load_todo && !s->loader_stop) pthread_cond_wait(&s->load_cv, &s->load_mu);
        struct load_job *j = s->load_todo;
        if (!j) break; /* stopping, nothing left */
        s->load_todo = j->next;
        if (!s->load_todo) s->load_todo_tail = NULL;
        pthread_mutex_unlock(&s->load_mu);
        if (atomic_load(&j->abandoned)) {
            j->st = STATUS_CANCELLED;
            snprintf(j->message, sizeof j->message, "the call ended before the load started");
        } else {
            job_run(s, j);
        }
        pthread_mutex_lock(&s->load_mu);
        j->next = s->load_done;
        s->load_done = j;
        pthread_mutex_unlock(&s->load_mu);
        server_wake(s);
        pthread_mutex_lock(&s->load_mu);
    }
    pthread_mutex_unlock(&s->load_mu);
    return NULL;
}

/* Starts the loader thread on first use and queues j for it (c keeps it: call.load_job). */
static enum status job_queue(struct call *c, struct load_job *j)
{
    struct server *s = c->s;
    j->call = c;
    atomic_init(&j->abandoned, 0);
    if (!s->loader_started) {
        s->load_test_delay_s = server_test_delay("SHARDLM_TEST_LOAD_DELAY_S");
        if (pthread_create(&s->loader, NULL, loader_main, s) != 0) {
            job_free(j);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cannot start the loader thread");
        }
        s->loader_started = 1;
    }
    c->load_job = j;
    pthread_mutex_lock(&s->load_mu);
    if (s->load_todo_tail) s->load_todo_tail->next = j;
    else s->load_todo = j;
    s->load_todo_tail = j;
    pthread_cond_signal(&s->load_cv);
    pthread_mutex_unlock(&s->load_mu);
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

enum status loader_submit_model(struct call *c, const char *name, const uint8_t *data, size_t len)
{
    struct load_job *j = calloc(1, sizeof *j);
    if (j) j->name = strdup(name ? name : ""), j->request = malloc(len ? len : 1);
    if (!j || !j->name || !j->request) {
        job_free(j);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory queueing a model's load");
    }
    if (len) memcpy(j->request, data, len);
    j->request_len = len;
    j->wakes_model = 1;
    return job_queue(c, j);
}

void loader_drain(struct server *s)
{
    if (!s->loader_started) return;
    pthread_mutex_lock(&s->load_mu);
    struct load_job *done = s->load_done;
    s->load_done = NULL;
    pthread_mutex_unlock(&s->load_mu);
    while (done) {
        struct load_job *j = done;
        done = j->next;
        struct call *c = j->call;
        c->load_job = NULL;
        if (j->wakes_model) {
            /* The model is loaded (and pinned by the job): the call's request runs now. */
            if (j->st != STATUS_OK) call_fail_status(c, j->st, j->message);
            else if (!c->close_done && !c->send_has_status) call_dispatch(c, j->request, j->request_len);
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

void loader_stop(struct server *s)
{
    if (!s->loader_started) return;
    pthread_mutex_lock(&s->load_mu);
    s->loader_stop = 1;
    pthread_cond_signal(&s->load_cv);
    pthread_mutex_unlock(&s->load_mu);
    pthread_join(s->loader, NULL);
    s->loader_started = 0;
    CHECK(!s->load_todo && !s->load_done, "adapter loads left after the last call was freed");
}
