/* engine/serving/adapters.h - the LoRA adapters a conductor serves without merging: those given
 * at start (engine_options.adapters, `shardlm serve --lora NAME=DIR`) and those loaded and
 * unloaded at run time (engine_load_adapter / engine_unload_adapter); found by name for each
 * request, counted while requests use them, and keyed for the prefix cache.
 * Not here: the low-rank products (engine/model/lora.c, applied per run of rows by model.c), the
 * batch grouped by adapter (scheduler.c).
 * Tests: tests/server/test_lora_serving.py (server_lora).
 *
 * The set is a table of 2 x max_loras slots (at most max_loras of them loaded). A request holds its adapter's slot index (and the
 * slot counts it) from submission until its last sample is retired, so a slot is never reused
 * under a running request. The model reads its own view of the table (model.adapters, one
 * pointer per slot) which only adapter_set_sync writes, on the engine thread at a step
 * boundary: an adapter is read and checked whole on the loading thread, handed over as PENDING,
 * and the forward sees it only from the next step on; an unloaded one leaves the model's view at
 * the next boundary and is freed there. The prefix-cache key of an adapter is derived from its
 * load number, never from its slot, so KV computed under an unloaded adapter never serves a
 * later adapter that gets the same slot.
 *
 * Threads: adapter_set_read may run on any thread without a lock (it reads the model's shapes,
 * which never change, and allocates on the CPU backend). Every other function except
 * adapter_set_init / _free runs with the conductor's lock held (they read and write the slots);
 * adapter_set_sync only on the engine thread. */
#ifndef SHARDLM_ADAPTERS_H
#define SHARDLM_ADAPTERS_H

#include <stdint.h>

#include "engine.h"
#include "lora.h"

#define ADAPTER_NAME_MAX 64    /* bytes of a name: letters, digits, '.', '_', '-' */
#define ADAPTER_MAX_LOADED ENGINE_MAX_ADAPTERS /* the largest --max-loras */
#define ADAPTER_DEFAULT_RANK 16 /* --max-lora-rank when not given and no start-up adapter is larger */

enum adapter_state {
    ADAPTER_FREE,     /* an empty slot */
    ADAPTER_PENDING,  /* loaded, usable by requests; the model sees it from the next step */
    ADAPTER_LIVE,     /* in the model's view */
    ADAPTER_RETIRING, /* unloaded: no request uses it; leaves the model's view at the next step */
};

struct adapter_slot {
    enum adapter_state state;
    char          name[ADAPTER_NAME_MAX + 1];
    char         *dir;        /* owned: where it was read from */
    struct lora  *lora;       /* owned */
    uint64_t      serial;     /* load number, from 1: the listing order and the prefix-cache key */
    int           n_requests; /* live requests that name it */
};

struct adapter_set {
    struct adapter_slot *slots;  /* (n_slots) */
    struct lora        **view;   /* (n_slots) the model's view (model.adapters): adapter_set_sync only */
    int      cap;                /* --max-loras: adapters loaded at once at most */
    int      n_slots;            /* 2 x cap: unloaded slots wait for the engine thread to free them */
    int      max_rank;           /* --max-lora-rank: the largest rank the model's scratch holds */
    int      n_loaded;           /* slots not FREE or RETIRING */
    int      dirty;              /* a PENDING or RETIRING slot waits for adapter_set_sync */
    uint64_t next_serial;
    char     no_runtime[256];    /* why run-time loads are refused ("" when they are not) */
};

/* Sizes the set for m (max_loras slots, 0 = n; scratch for ranks up to max_rank, 0 = the largest
 * of ADAPTER_DEFAULT_RANK and the start-up adapters' ranks), loads the start-up adapters
 * (names[i] from dirs[i]) and lends the view to m (m->adapters, m->n_adapters, and
 * m->max_adapter_rank, which model_reserve sizes the scratch by). Adapters need tp 1 and f32
 * compute (the CPU backend): STATUS_UNSUPPORTED when start-up adapters are given otherwise, and
 * run-time loads are then refused with the same message. A name given twice, more adapters than
 * max_loras, or a rank above max_rank is STATUS_INVALID_ARGUMENT; a bad adapter file fails with
 * lora_load_peft's message. multi_rank: the replica has more than one rank, or there are several
 * replicas (run-time loads are refused: the other ranks would have to load it in step). s is
 * freeable on error. */
enum status adapter_set_init(struct adapter_set *s, struct model *m, int max_loras, int max_rank, int multi_rank,
                             const char *const *names, const char *const *dirs, int n);
void        adapter_set_free(struct adapter_set *s, struct backend *b); /* accepts a zeroed set */

/* STATUS_INVALID_ARGUMENT unless name is 1..ADAPTER_NAME_MAX bytes of [A-Za-z0-9._-]. */
enum status adapter_name_check(const char *name);

/* Any thread, no lock: reads the PEFT adapter in dir for m and checks it against the set's
 * limits (run-time loads allowed, rank <= max_rank). *out is owned by the caller. A directory
 * whose files cannot be opened (missing, unreadable, not regular files) is STATUS_NOT_FOUND with
 * one message for every such cause (logged in detail): the answer to a client tells nothing
 * more about the server's files. */
enum status adapter_set_read(const struct adapter_set *s, struct model *m, const char *dir, struct lora **out);
/* Under the lock: adds the adapter read by adapter_set_read as name (PENDING), taking ownership
 * of l and a copy of dir on success only. STATUS_ALREADY_EXISTS when the name is taken,
 * STATUS_RESOURCE_EXHAUSTED when max_loras adapters are loaded. */
enum status adapter_set_add(struct adapter_set *s, const char *name, const char *dir, struct lora *l);
/* Under the lock: unloads name. STATUS_NOT_FOUND for a name not loaded,
 * STATUS_FAILED_PRECONDITION (naming how many) while requests use it. After the call the name is
 * free and new requests naming it fail with NOT_FOUND; the memory goes at the next sync. */
enum status adapter_set_remove(struct adapter_set *s, const char *name);

/* Under the lock: the slot a request names, counted until adapter_set_release: *index -1 and
 * *key 0 for the base (NULL or ""), NOT_FOUND for a name not loaded. */
enum status adapter_set_acquire(struct adapter_set *s, const char *name, int *index, uint64_t *key);
void        adapter_set_release(struct adapter_set *s, int index); /* index -1: nothing */

/* Under the lock, on the engine thread between steps: PENDING adapters enter the model's view,
 * RETIRING ones leave it and are freed. */
void        adapter_set_sync(struct adapter_set *s, struct backend *b);

/* Under the lock: calls fn for every loaded adapter in load order (fn must not call into the
 * engine). Returns how many. */
int         adapter_set_each(const struct adapter_set *s, void (*fn)(void *ctx, const struct engine_adapter_info *a),
                             void *ctx);

#endif
