/* server/models.c - the served models (serve --model repeated): routing a request to the model it
 * names (its id or one of its adapters' names), the "not served" error both fronts give, and
 * residency: which models are loaded, pinned by requests, loaded on demand and unloaded
 * (--models-max: the least recently used model that no request pins makes room;
 * --sleep-idle-seconds: a model idle that long is unloaded), and GET /v1/models.
 *
 * Locking: one mutex (server.models_mu) guards every model's state, pins and t_used; loads and
 * unloads run without it, the model marked MODEL_LOADING / MODEL_UNLOADING meanwhile, and a
 * broadcast on models_cv ends each. Engine calls are never made under it: the engine's callbacks
 * release pins (http_gen_unref), and the engine's lock must not be taken inside ours. A pinned
 * model stays MODEL_LOADED, so its engine, tokenizer and template are safe to use without it.
 * Loading is server.c's (server_model_load). Test hook: $SHARDLM_TEST_MODEL_LOAD_DELAY_S (seconds,
 * read at start) makes every on-demand load wait that long first, so that tests can send requests
 * during a load.
 * Tests: tests/server/test_models.py, tests/server/test_models_lru.py. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "http_internal.h"
#include "server_internal.h"

struct adapter_find {
    const char *name;
    int found;
};

static void find_adapter(void *ctx, const struct engine_adapter_info *a)
{
    struct adapter_find *f = ctx;
    if (!strcmp(a->name, f->name)) f->found = 1;
}

/* 1 when name is one of m's adapters: loaded in its engine now (m pinned by the caller), or,
 * while it is not loaded, one of its --lora adapters (the ones a load brings back). */
static int model_has_adapter(struct served_model *m, int loaded, const char *name)
{
    if (!loaded) {
        for (int i = 0; i < m->eopts.n_adapters; i++)
            if (!strcmp(m->eopts.adapter_names[i], name)) return 1;
        return 0;
    }
    struct adapter_find f = {name, 0};
    engine_list_adapters(m->engine, find_adapter, &f);
    return f.found;
}

static enum status not_served(struct server *s, const char *name)
{
    char list[1024];
    size_t n = 0;
    for (int i = 0; i < s->n_models && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", s->models[i].model_id);
    return status_errorf(STATUS_NOT_FOUND, "model '%.200s' is not served here; the served models are %s (and their "
                         "adapters: GET /v1/models)", name, list);
}

/* The model name routes to (*m), not pinned: an id first; else an adapter, looked up in each
 * loaded engine with a pin held meanwhile (which keeps it loaded; it does not count as use). */
enum status server_route(struct server *s, const char *name, struct served_model **m)
{
    *m = &s->models[0];
    if (!name || !*name || s->n_models == 1) return STATUS_OK;
    for (int i = 0; i < s->n_models; i++)
        if (!strcmp(name, s->models[i].model_id)) {
            *m = &s->models[i];
            return STATUS_OK;
        }
    int found = -1;
    for (int i = 0; i < s->n_models && found < 0; i++) {
        struct served_model *p = server_pin_if_loaded(s, &s->models[i]);
        if (model_has_adapter(&s->models[i], p != NULL, name)) found = i;
        server_unpin_quietly(s, p);
    }
    if (found < 0) {
        *m = NULL;
        return not_served(s, name);
    }
    *m = &s->models[found];
    return STATUS_OK;
}

static int n_resident(const struct server *s)
{
    int n = 0;
    for (int i = 0; i < s->n_models; i++) n += s->models[i].state != MODEL_UNLOADED;
    return n;
}

/* The loaded model that no request pins and was used longest ago, or NULL. */
static struct served_model *lru_idle(struct server *s)
{
    struct served_model *v = NULL;
    for (int i = 0; i < s->n_models; i++) {
        struct served_model *m = &s->models[i];
        if (m->state == MODEL_LOADED && m->pins == 0 && (!v || m->t_used < v->t_used)) v = m;
    }
    return v;
}

/* Unloads v (MODEL_LOADED, unpinned), with models_mu held on entry and on return (released
 * meanwhile). */
static void unload_locked(struct server *s, struct served_model *v, const char *why)
{
    v->state = MODEL_UNLOADING;
    pthread_mutex_unlock(&s->models_mu);
    LOG_INFO("server", "model %s: unloading (%s)", v->model_id, why);
    server_model_unload(v);
    pthread_mutex_lock(&s->models_mu);
    v->state = MODEL_UNLOADED;
    pthread_cond_broadcast(&s->models_cv);
}

/* Loads m (MODEL_UNLOADED) with models_mu held on entry and on return, first unloading the least
 * recently used idle model when --models-max are resident. 1 in *retry when another thread's load
 * or unload must end first; STATUS_UNAVAILABLE when every resident model is pinned (a request
 * gives its pin back before its answer's bytes go out: http_gen_release_model, call_send, so a
 * client's next request never finds it pinned by the last one). */
static enum status load_locked(struct server *s, struct served_model *m, int *retry)
{
    *retry = 0;
    int max = s->opts.models_max;
    if (max > 0 && n_resident(s) >= max) {
        struct served_model *v = lru_idle(s);
        if (!v) {
            for (int i = 0; i < s->n_models; i++)
                if (s->models[i].state == MODEL_LOADING || s->models[i].state == MODEL_UNLOADING) *retry = 1;
            if (*retry) return STATUS_OK;
            return status_errorf(STATUS_UNAVAILABLE,
                                 "model '%s' is not loaded, and each of the %d models loaded now (--models-max %d) "
                                 "has requests running: try again when one of them finishes", m->model_id, max, max);
        }
        m->state = MODEL_LOADING; /* its place, before the lock goes */
        unload_locked(s, v, "least recently used, to make room");
    }
    m->state = MODEL_LOADING;
    pthread_mutex_unlock(&s->models_mu);
    if (s->model_load_test_delay_s > 0) {
        double d = s->model_load_test_delay_s;
        nanosleep(&(struct timespec){(time_t)d, (long)((d - (double)(time_t)d) * 1e9)}, NULL);
    }
    double t0 = base_now_s();
    enum status st = server_model_load(s, m);
    char msg[1024] = "";
    if (st != STATUS_OK) snprintf(msg, sizeof msg, "%s", status_message());
    else LOG_INFO("server", "model %s: loaded on demand in %.2f s", m->model_id, base_now_s() - t0);
    pthread_mutex_lock(&s->models_mu);
    m->state = st == STATUS_OK ? MODEL_LOADED : MODEL_UNLOADED;
    pthread_cond_broadcast(&s->models_cv);
    if (st != STATUS_OK) return status_errorf(st, "model '%s' did not load: %s", m->model_id, msg);
    return STATUS_OK;
}

/* Waits on models_cv until deadline (models_mu held); 0 once it has passed. */
static int wait_until(struct server *s, double deadline)
{
    double left = deadline - base_now_s();
    if (left <= 0) return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (left < 0.5 ? left : 0.5);
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&s->models_cv, &s->models_mu, &ts);
    return 1;
}

enum status server_acquire(struct server *s, const char *name, int may_block, struct served_model **out)
{
    struct served_model *m;
    *out = NULL;
    enum status st = server_route(s, name, &m);
    if (st != STATUS_OK) return st;
    const double deadline = base_now_s() + MODELS_WAIT_S;
    pthread_mutex_lock(&s->models_mu);
    while (st == STATUS_OK && m->state != MODEL_LOADED) {
        int retry = 1;
        if (s->models_closing) st = status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
        else if (!may_block) break;
        else if (m->state == MODEL_UNLOADED) st = load_locked(s, m, &retry);
        if (st == STATUS_OK && retry && m->state != MODEL_LOADED && !wait_until(s, deadline))
            st = status_errorf(STATUS_UNAVAILABLE, "model '%s' is still being loaded or unloaded after %.0f s",
                               m->model_id, MODELS_WAIT_S);
    }
    if (st == STATUS_OK && m->state == MODEL_LOADED) {
        m->pins++;
        m->t_used = base_now_s();
        *out = m;
    }
    pthread_mutex_unlock(&s->models_mu);
    return st;
}

void server_pin(struct server *s, struct served_model *m)
{
    pthread_mutex_lock(&s->models_mu);
    CHECK(m->pins > 0 && m->state == MODEL_LOADED, "server_pin of model %s, which is not pinned", m->model_id);
    m->pins++;
    pthread_mutex_unlock(&s->models_mu);
}

void server_release(struct server *s, struct served_model *m)
{
    if (!m) return;
    pthread_mutex_lock(&s->models_mu);
    CHECK(m->pins > 0, "server_release of model %s, which no one pins", m->model_id);
    m->pins--;
    m->t_used = base_now_s();
    pthread_cond_broadcast(&s->models_cv);
    pthread_mutex_unlock(&s->models_mu);
}

struct served_model *server_pin_if_loaded(struct server *s, struct served_model *m)
{
    pthread_mutex_lock(&s->models_mu);
    int loaded = m->state == MODEL_LOADED;
    if (loaded) m->pins++;
    pthread_mutex_unlock(&s->models_mu);
    return loaded ? m : NULL;
}

void server_unpin_quietly(struct server *s, struct served_model *m)
{
    if (!m) return;
    pthread_mutex_lock(&s->models_mu);
    m->pins--;
    pthread_cond_broadcast(&s->models_cv);
    pthread_mutex_unlock(&s->models_mu);
}

void server_models_sleep(struct server *s)
{
    double idle = s->opts.sleep_idle_s;
    if (idle <= 0) return;
    pthread_mutex_lock(&s->models_mu);
    for (int i = 0; i < s->n_models && !s->models_closing; i++) {
        struct served_model *m = &s->models[i];
        if (m->state == MODEL_LOADED && m->pins == 0 && base_now_s() - m->t_used >= idle)
            unload_locked(s, m, "idle for --sleep-idle-seconds");
    }
    pthread_mutex_unlock(&s->models_mu);
}

void server_models_close(struct server *s)
{
    pthread_mutex_lock(&s->models_mu);
    s->models_closing = 1;
    for (;;) {
        int busy = 0;
        for (int i = 0; i < s->n_models; i++)
            busy |= s->models[i].state == MODEL_LOADING || s->models[i].state == MODEL_UNLOADING;
        if (!busy) break;
        pthread_cond_wait(&s->models_cv, &s->models_mu);
    }
    pthread_mutex_unlock(&s->models_mu);
}

struct model_list {
    const struct server *s;
    const char *parent, *owner; /* (owner: whose list it is, http_finetune_hidden) */
    char      **json;
    size_t     *len, *cap;
    int         max_positions;
};

/* One adapter of /v1/models. Names are [A-Za-z0-9._-]. Its root is its own name, not the
 * server-side directory it was loaded from (vLLM shows the path: any key holder would learn
 * the server's file layout). */
static void list_adapter_named(struct model_list *ml, const char *name, int loaded)
{
    char head[1024];
    snprintf(head, sizeof head,
             ",{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"shardlm\",\"root\":\"%s\","
             "\"parent\":\"%s\",\"max_model_len\":%d,\"loaded\":%s}",
             name, (long long)ml->s->t_created, name, ml->parent, ml->max_positions, loaded ? "true" : "false");
    http_buf_append(ml->json, ml->len, ml->cap, head, strlen(head));
}

static void list_adapter(void *ctx, const struct engine_adapter_info *a)
{
    struct model_list *ml = ctx;
    if (!http_finetune_hidden(ml->s, a->name, ml->owner)) list_adapter_named(ml, a->name, 1);
}

void server_model_note_info(struct server *s, struct served_model *m)
{
    struct engine_model_info info = {0};
    engine_get_model_info(m->engine, &info);
    struct model_view *v = &m->view;
    pthread_mutex_lock(&s->models_mu); /* /v1/models reads them under it, during a load too */
    v->max_positions = info.max_positions;
    snprintf(v->arch, sizeof v->arch, "%s", info.architecture ? info.architecture : "");
    snprintf(v->quant, sizeof v->quant, "%s", info.quantization ? info.quantization : "");
    snprintf(v->dtype, sizeof v->dtype, "%s", info.dtype ? info.dtype : "");
    snprintf(v->tmpl, sizeof v->tmpl, "%s", m->tmpl_name);
    pthread_mutex_unlock(&s->models_mu);
}

char *server_models_json(struct server *s, const char *owner, size_t *len)
{
    char *json = NULL;
    size_t cap = 0;
    *len = 0;
    http_buf_append(&json, len, &cap, "{\"object\":\"list\",\"data\":[", 25);
    int ready = atomic_load(&s->phase) == PHASE_READY;
    for (int i = 0; i < s->n_models; i++) {
        struct served_model *m = &s->models[i];
        struct model_view v;
        pthread_mutex_lock(&s->models_mu);
        int loaded = ready && m->state == MODEL_LOADED;
        if (loaded) m->pins++; /* while its engine is read: it stays loaded */
        v = m->view;
        pthread_mutex_unlock(&s->models_mu);
        char head[1400];
        /* Before its first load, a model's figures are unknown: 0 and "". */
        snprintf(head, sizeof head,
                 "%s{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"shardlm\",\"root\":\"%s\","
                 "\"parent\":null,\"max_model_len\":%d,\"architecture\":\"%s\",\"quantization\":\"%s\","
                 "\"dtype\":\"%s\",\"chat_template\":\"%s\",\"loaded\":%s}",
                 i ? "," : "", m->model_id, (long long)s->t_created, m->model_id, v.max_positions, v.arch, v.quant,
                 v.dtype, v.tmpl, loaded ? "true" : "false");
        http_buf_append(&json, len, &cap, head, strlen(head));
        /* The adapters as vLLM lists them: their own ids, their model as parent; while the model
         * is not loaded, its --lora adapters (a load brings them back), not loaded either. */
        struct model_list ml = {.s = s, .parent = m->model_id, .json = &json, .len = len, .cap = &cap,
                                .max_positions = v.max_positions, .owner = owner};
        if (loaded) engine_list_adapters(m->engine, list_adapter, &ml);
        else
            for (int a = 0; a < m->eopts.n_adapters; a++) list_adapter_named(&ml, m->eopts.adapter_names[a], 0);
        if (loaded) server_unpin_quietly(s, m);
    }
    http_buf_append(&json, len, &cap, "]}", 2);
    return json;
}
