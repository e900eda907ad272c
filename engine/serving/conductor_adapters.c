/* engine/serving/conductor_adapters.c - LoRA adapters loaded and unloaded while the conductor
 * serves (conductor.h): read and checked on the caller's thread, handed to the engine thread,
 * which puts them in the model (or frees them) at a step boundary (adapters.c's set).
 * Tests: tests/server/test_lora_serving.py (LoadAdapter / UnloadAdapter under load). */
#include "conductor_impl.h"

#include "lora.h"

enum status conductor_load_adapter(struct conductor *c, const char *name, const char *dir)
{
    enum status st = adapter_name_check(name);
    if (st != STATUS_OK) return st;
    pthread_mutex_lock(&c->mu);
    const int draining = c->draining || c->stop_thread || c->failed;
    pthread_mutex_unlock(&c->mu);
    if (draining) return status_errorf(STATUS_UNAVAILABLE, "the server is shutting down");
    /* Read and checked whole here, off the engine thread; the engine sees it at a step boundary. */
    const double t0 = base_now_s();
    struct lora *l = NULL;
    if ((st = adapter_set_read(&c->adapters, c->m, dir, &l)) != STATUS_OK) return st;
    const int rank = l->rank; /* once added, l may be unloaded and freed by another thread */
    const double alpha = (double)l->alpha;
    pthread_mutex_lock(&c->mu);
    st = adapter_set_add(&c->adapters, name, dir, l);
    if (st == STATUS_OK) pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (st != STATUS_OK) {
        lora_free(l, c->b);
        return st;
    }
    LOG_INFO(MODULE, "adapter '%s' loaded from %s: rank %d, alpha %g (%.3f s)", name, dir, rank, alpha, base_now_s() - t0);
    return STATUS_OK;
}

enum status conductor_unload_adapter(struct conductor *c, const char *name)
{
    if (c->adapters.no_runtime[0]) return status_errorf(STATUS_UNSUPPORTED, "UnloadAdapter: %s", c->adapters.no_runtime);
    pthread_mutex_lock(&c->mu);
    enum status st = adapter_set_remove(&c->adapters, name);
    if (st == STATUS_OK) pthread_cond_signal(&c->cv); /* the engine thread frees it, idle or not */
    pthread_mutex_unlock(&c->mu);
    return st;
}

int conductor_list_adapters(struct conductor *c, void (*fn)(void *ctx, const struct engine_adapter_info *info), void *ctx)
{
    pthread_mutex_lock(&c->mu);
    int n = adapter_set_each(&c->adapters, fn, ctx);
    pthread_mutex_unlock(&c->mu);
    return n;
}
