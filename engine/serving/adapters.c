/* engine/serving/adapters.c - the LoRA adapters a conductor serves (see adapters.h). */
#include "adapters.h"

#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MODULE "engine"

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

/* The prefix-cache key of the serial-th load: 0 is the base; distinct per load, so that KV
 * computed under one adapter never serves another, nor a later one in the same slot. */
static uint64_t serial_key(uint64_t serial)
{
    return serial == 0 ? 0 : (0x9e3779b97f4a7c15ull * serial) ^ 0x5a17ed5eedull;
}

enum status adapter_name_check(const char *name)
{
    const size_t len = name ? strlen(name) : 0;
    if (len == 0 || len > ADAPTER_NAME_MAX || strspn(name, NAME_CHARS) != len)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "an adapter name is 1-%d letters, digits, '.', '_' or '-', got '%.80s'", ADAPTER_NAME_MAX,
                             name ? name : "");
    return STATUS_OK;
}

/* The slot holding name (PENDING or LIVE), or -1. */
static int find_loaded(const struct adapter_set *s, const char *name)
{
    for (int i = 0; i < s->n_slots; i++)
        if ((s->slots[i].state == ADAPTER_PENDING || s->slots[i].state == ADAPTER_LIVE) &&
            !strcmp(s->slots[i].name, name))
            return i;
    return -1;
}

enum status adapter_set_init(struct adapter_set *s, struct model *m, int max_loras, int max_rank, int multi_rank,
                             const char *const *names, const char *const *dirs, int n)
{
    memset(s, 0, sizeof *s);
    s->next_serial = 1;
    if (max_loras == 0) max_loras = n;
    if (max_loras < 0 || max_loras > ADAPTER_MAX_LOADED || max_rank < 0 || max_rank > 4096)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--max-loras must be in [0, %d] and --max-lora-rank in [1, 4096]",
                             ADAPTER_MAX_LOADED);
    if (n > max_loras)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%d --lora adapters are more than --max-loras %d", n, max_loras);
    if (m->dtype != DTYPE_F32 || m->b->device != DEVICE_CPU) {
        snprintf(s->no_runtime, sizeof s->no_runtime, "serving adapters needs f32 compute on the CPU backend for now "
                 "(this server runs %s on %s); merge the adapter instead (shardlm merge-lora)",
                 dtype_name(m->dtype), m->b->ops->name);
        if (n > 0) return status_errorf(STATUS_UNSUPPORTED, "--lora: %s", s->no_runtime);
        return STATUS_OK; /* no slots: nothing is reserved */
    } else if (multi_rank) {
        snprintf(s->no_runtime, sizeof s->no_runtime, "loading adapters at run time is not built for a server of "
                 "several ranks (tp x pp > 1 or dp > 1): give them at start with --lora NAME=DIR");
    }
    if (max_loras == 0) return STATUS_OK;
    /* Twice the slots: an unloaded adapter's slot stays taken until the engine thread frees it,
     * and a load right after an unload must not wait for that. */
    const int n_slots = 2 * max_loras;
    if (!(s->slots = calloc((size_t)n_slots, sizeof *s->slots)) || !(s->view = calloc((size_t)n_slots, sizeof *s->view)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    s->cap = max_loras;
    s->n_slots = n_slots;
    const int explicit_rank = max_rank > 0;
    s->max_rank = explicit_rank ? max_rank : 4096; /* the start-up ranks decide below */
    int largest = 0;
    for (int i = 0; i < n; i++) {
        enum status st = adapter_name_check(names[i]);
        if (st != STATUS_OK) return st;
        if (find_loaded(s, names[i]) >= 0)
            return status_errorf(STATUS_INVALID_ARGUMENT, "--lora: the name '%s' is given twice", names[i]);
        struct lora *l = NULL;
        if ((st = lora_load_peft(m, dirs[i], &l)) != STATUS_OK) return st;
        if ((st = lora_serve_prepare(l, m)) != STATUS_OK) {
            lora_free(l, m->b);
            return st;
        }
        if (l->rank > s->max_rank) {
            status_errorf(STATUS_INVALID_ARGUMENT, "--lora %s=%s: rank %d is above --max-lora-rank %d", names[i], dirs[i],
                          l->rank, s->max_rank);
            lora_free(l, m->b);
            return STATUS_INVALID_ARGUMENT;
        }
        if ((st = adapter_set_add(s, names[i], dirs[i], l)) != STATUS_OK) {
            lora_free(l, m->b);
            return st;
        }
        if (l->rank > largest) largest = l->rank;
        LOG_INFO(MODULE, "adapter '%s' from %s: rank %d, alpha %g", names[i], dirs[i], l->rank, (double)l->alpha);
    }
    if (!explicit_rank) /* room for run-time loads: at least the default rank */
        s->max_rank = largest > ADAPTER_DEFAULT_RANK || s->cap == n || s->no_runtime[0] ? largest : ADAPTER_DEFAULT_RANK;
    adapter_set_sync(s, m->b);
    m->adapters = s->view;
    m->n_adapters = s->n_slots;
    m->max_adapter_rank = s->max_rank;
    if (s->cap > n && !s->no_runtime[0])
        LOG_INFO(MODULE, "adapters: %d of --max-loras %d loaded; run-time loads up to rank %d", n, s->cap, s->max_rank);
    return STATUS_OK;
}

void adapter_set_free(struct adapter_set *s, struct backend *b)
{
    for (int i = 0; s->slots && i < s->n_slots; i++) {
        lora_free(s->slots[i].lora, b);
        free(s->slots[i].dir);
    }
    free(s->slots);
    free(s->view);
    memset(s, 0, sizeof *s);
}

enum status adapter_set_read(const struct adapter_set *s, struct model *m, const char *dir, struct lora **out)
{
    *out = NULL;
    if (s->no_runtime[0]) return status_errorf(STATUS_UNSUPPORTED, "LoadAdapter: %s", s->no_runtime);
    if (s->cap == 0)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "LoadAdapter: this server was started with --max-loras 0");
    if (!dir || !*dir) return status_errorf(STATUS_INVALID_ARGUMENT, "LoadAdapter: path is empty");
    struct lora *l = NULL;
    enum status st = lora_load_peft(m, dir, &l);
    if (st == STATUS_NOT_FOUND) {
        /* Missing, unreadable, not a regular file: the caller learns no more than that nothing
         * loadable is there (a key holder must not map the server's files); the log has why. */
        LOG_WARN(MODULE, "LoadAdapter from %s: %s", dir, status_message());
        return status_errorf(STATUS_NOT_FOUND, "LoadAdapter: no adapter can be read at '%.512s' (it needs "
                             "adapter_config.json and adapter_model.safetensors there, regular files this server "
                             "can read)", dir);
    }
    if (st == STATUS_OK && (st = lora_serve_prepare(l, m)) != STATUS_OK) lora_free(l, m->b);
    if (st != STATUS_OK) return st;
    if (l->rank > s->max_rank) {
        status_errorf(STATUS_INVALID_ARGUMENT, "%s: rank %d is above this server's --max-lora-rank %d (the scratch "
                      "the model reserved at start); restart with a larger --max-lora-rank", dir, l->rank, s->max_rank);
        lora_free(l, m->b);
        return STATUS_INVALID_ARGUMENT;
    }
    *out = l;
    return STATUS_OK;
}

enum status adapter_set_add(struct adapter_set *s, const char *name, const char *dir, struct lora *l)
{
    enum status st = adapter_name_check(name);
    if (st != STATUS_OK) return st;
    if (find_loaded(s, name) >= 0) return status_errorf(STATUS_ALREADY_EXISTS, "an adapter named '%s' is loaded already "
                                                        "(unload it first to replace it)", name);
    int free_slot = -1;
    for (int i = 0; i < s->n_slots && free_slot < 0; i++)
        if (s->slots[i].state == ADAPTER_FREE) free_slot = i;
    if (s->n_loaded >= s->cap)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%d adapters are loaded (--max-loras %d): unload one first",
                             s->n_loaded, s->cap);
    if (free_slot < 0) /* only when the engine thread has not stepped since many unloads */
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "unloaded adapters are still being freed; retry");
    char *d = strdup(dir ? dir : "");
    if (!d) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    struct adapter_slot *a = &s->slots[free_slot];
    *a = (struct adapter_slot){.state = ADAPTER_PENDING, .dir = d, .lora = l, .serial = s->next_serial++};
    snprintf(a->name, sizeof a->name, "%s", name);
    s->n_loaded++;
    s->dirty = 1;
    return STATUS_OK;
}

enum status adapter_set_remove(struct adapter_set *s, const char *name)
{
    const int i = name && *name ? find_loaded(s, name) : -1;
    if (i < 0) return status_errorf(STATUS_NOT_FOUND, "no adapter named '%.100s' is loaded", name ? name : "");
    struct adapter_slot *a = &s->slots[i];
    if (a->n_requests > 0)
        return status_errorf(STATUS_FAILED_PRECONDITION, "adapter '%s' is used by %d running or queued request%s; unload "
                             "it when they have finished (or cancel them)", name, a->n_requests,
                             a->n_requests == 1 ? "" : "s");
    a->state = ADAPTER_RETIRING;
    s->n_loaded--;
    s->dirty = 1;
    return STATUS_OK;
}

enum status adapter_set_acquire(struct adapter_set *s, const char *name, int *index, uint64_t *key)
{
    *index = -1;
    *key = 0;
    if (!name || !*name) return STATUS_OK;
    const int i = find_loaded(s, name);
    if (i < 0)
        /* No count of the loaded adapters here: it would include fine-tuned ones hidden from the
           caller's API key (server/http_finetune.c). */
        return status_errorf(STATUS_NOT_FOUND, "no adapter named '%.100s' is loaded (see GetModelInfo)", name);
    s->slots[i].n_requests++;
    *index = i;
    *key = serial_key(s->slots[i].serial);
    return STATUS_OK;
}

void adapter_set_release(struct adapter_set *s, int index)
{
    if (index < 0) return;
    CHECK(index < s->n_slots && s->slots[index].n_requests > 0, "adapter slot %d released more often than acquired", index);
    s->slots[index].n_requests--;
}

void adapter_set_sync(struct adapter_set *s, struct backend *b)
{
    if (!s->dirty) return;
    for (int i = 0; i < s->n_slots; i++) {
        struct adapter_slot *a = &s->slots[i];
        if (a->state == ADAPTER_PENDING) {
            s->view[i] = a->lora;
            a->state = ADAPTER_LIVE;
        } else if (a->state == ADAPTER_RETIRING) {
            CHECK(a->n_requests == 0, "adapter '%s' retired under %d requests", a->name, a->n_requests);
            LOG_INFO(MODULE, "adapter '%s' unloaded", a->name);
            s->view[i] = NULL;
            lora_free(a->lora, b);
            free(a->dir);
            *a = (struct adapter_slot){.state = ADAPTER_FREE};
        }
    }
    s->dirty = 0;
}

int adapter_set_each(const struct adapter_set *s, void (*fn)(void *ctx, const struct engine_adapter_info *a), void *ctx)
{
    int n = 0;
    uint64_t last = 0;
    for (;;) { /* in load order: the smallest serial above the last one listed */
        int next = -1;
        for (int i = 0; i < s->n_slots; i++) {
            const struct adapter_slot *a = &s->slots[i];
            if ((a->state == ADAPTER_PENDING || a->state == ADAPTER_LIVE) && a->serial > last &&
                (next < 0 || a->serial < s->slots[next].serial))
                next = i;
        }
        if (next < 0) return n;
        const struct adapter_slot *a = &s->slots[next];
        const struct engine_adapter_info info = {.name = a->name, .dir = a->dir, .rank = a->lora->rank,
                                                 .alpha = a->lora->alpha, .n_requests = a->n_requests};
        if (fn) fn(ctx, &info);
        last = a->serial;
        n++;
    }
}
