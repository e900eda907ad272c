/* server/models.c - which served model a request names (serve --model repeated): routing by a
 * model's id or one of its adapters' names, and the "not served" error both fronts give.
 * Loading is server.c's (model_load). Any thread: the models array is fixed once the server
 * runs, and engine_list_adapters is thread-safe.
 * Tests: tests/server/test_models.py. */
#include <stdio.h>
#include <string.h>

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

/* 1 when m serves name: its id, or an adapter loaded in its engine now. */
static int model_serves(struct served_model *m, const char *name)
{
    if (!strcmp(name, m->model_id)) return 1;
    struct adapter_find f = {name, 0};
    if (m->engine) engine_list_adapters(m->engine, find_adapter, &f);
    return f.found;
}

enum status server_route(struct server *s, const char *name, struct served_model **m)
{
    *m = &s->models[0];
    if (!name || !*name || s->n_models == 1) return STATUS_OK;
    for (int i = 0; i < s->n_models; i++)
        if (model_serves(&s->models[i], name)) {
            *m = &s->models[i];
            return STATUS_OK;
        }
    char list[1024];
    size_t n = 0;
    for (int i = 0; i < s->n_models && n < sizeof list; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", s->models[i].model_id);
    *m = NULL;
    return status_errorf(STATUS_NOT_FOUND, "model '%.200s' is not served here; the served models are %s (and their "
                         "adapters: GET /v1/models)", name, list);
}

struct model_list {
    const struct server *s;
    const char *parent;
    char      **json;
    size_t     *len, *cap;
    int         max_positions;
};

/* One adapter of /v1/models. Names are [A-Za-z0-9._-]. Its root is its own name, not the
 * server-side directory it was loaded from (vLLM shows the path: any key holder would learn
 * the server's file layout). */
static void list_adapter(void *ctx, const struct engine_adapter_info *a)
{
    struct model_list *ml = ctx;
    char head[1024];
    snprintf(head, sizeof head,
             ",{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"shardlm\",\"root\":\"%s\","
             "\"parent\":\"%s\",\"max_model_len\":%d,\"loaded\":true}",
             a->name, (long long)ml->s->t_created, a->name, ml->parent, ml->max_positions);
    http_buf_append(ml->json, ml->len, ml->cap, head, strlen(head));
}

char *server_models_json(struct server *s, size_t *len)
{
    char *json = NULL;
    size_t cap = 0;
    *len = 0;
    http_buf_append(&json, len, &cap, "{\"object\":\"list\",\"data\":[", 25);
    for (int i = 0; i < s->n_models; i++) {
        struct served_model *m = &s->models[i];
        int loaded = m->engine && atomic_load(&s->phase) == PHASE_READY;
        struct engine_model_info info = {0};
        if (loaded) engine_get_model_info(m->engine, &info);
        char head[1400];
        snprintf(head, sizeof head,
                 "%s{\"id\":\"%s\",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"shardlm\",\"root\":\"%s\","
                 "\"parent\":null,\"max_model_len\":%d,\"architecture\":\"%s\",\"quantization\":\"%s\","
                 "\"dtype\":\"%s\",\"chat_template\":\"%s\",\"loaded\":%s}",
                 i ? "," : "", m->model_id, (long long)s->t_created, m->model_id, info.max_positions,
                 info.architecture ? info.architecture : "", info.quantization ? info.quantization : "",
                 info.dtype ? info.dtype : "", m->tmpl_name, loaded ? "true" : "false");
        http_buf_append(&json, len, &cap, head, strlen(head));
        /* The adapters as vLLM lists them: their own ids, their model as parent. */
        struct model_list ml = {.s = s, .parent = m->model_id, .json = &json, .len = len, .cap = &cap,
                                .max_positions = info.max_positions};
        if (loaded) engine_list_adapters(m->engine, list_adapter, &ml);
    }
    http_buf_append(&json, len, &cap, "]}", 2);
    return json;
}
