/* engine/serving/engine.c - the engine.h façade: resolves the options, then runs one conductor
 * (one replica) or, with data parallelism, a router that runs one conductor per replica, and
 * dispatches every call to it. Nothing here schedules, samples or routes.
 * The dependency runs one way: engine -> router -> conductor (the router never calls back
 * into engine_*).
 * Tests: tests/test_engine.c (one replica, tp/pp under mpirun, and --dp). */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

#include "conductor.h"
#include "parallel.h"
#include "request.h"
#include "router.h"
#include "spec_corpus.h"

struct engine {
    struct conductor *local;      /* without data parallelism */
    struct router    *router;     /* with it (local is NULL) */
};

struct engine_options engine_options_default(void)
{
    return (struct engine_options){.device = DEVICE_CPU, .block_tokens = 16, .max_batch_tokens = 512,
                                   .max_seqs = 64, .max_queue = 1024,
                                   .max_logprobs = REQUEST_DEFAULT_MAX_LOGPROBS, .prefix_caching = 1};
}

const char *scheduling_policy_name(enum scheduling_policy p)
{
    switch (p) {
    case SCHEDULING_FCFS: return "fcfs";
    case SCHEDULING_FAIR: return "fair";
    case SCHEDULING_PRIORITY: return "priority";
    }
    return "unknown";
}

/* Applies the defaults and checks the options; *dp is the number of replicas. */
static enum status resolve_options(const struct engine_options *opt, struct engine_options *out, int *dp)
{
    struct engine_options o = *opt;
    struct engine_options d = engine_options_default();
    if (!o.model_dir) return status_errorf(STATUS_INVALID_ARGUMENT, "engine: no model directory");
    if (o.block_tokens == 0) o.block_tokens = d.block_tokens;
    if (o.max_batch_tokens == 0) o.max_batch_tokens = d.max_batch_tokens;
    if (o.max_seqs == 0) o.max_seqs = d.max_seqs;
    if (o.max_queue == 0) o.max_queue = d.max_queue;
    if (o.max_logprobs == 0) o.max_logprobs = d.max_logprobs;
    if (o.block_tokens < 1 || o.block_tokens > 1024)
        return status_errorf(STATUS_INVALID_ARGUMENT, "block_tokens must be in [1, 1024], got %d", o.block_tokens);
    if (o.max_batch_tokens < 1 || o.max_seqs < 1 || o.max_queue < 1 || o.max_logprobs < 1 ||
        o.max_seqs > 4096 || o.max_batch_tokens > (1 << 20))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "engine limits must be positive (max_batch_tokens %d, max_seqs %d <= 4096, max_queue %d)",
                             o.max_batch_tokens, o.max_seqs, o.max_queue);
    if (o.max_logprobs > REQUEST_MAX_TOP_LOGPROBS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "max_logprobs must be at most %d, got %d",
                             REQUEST_MAX_TOP_LOGPROBS, o.max_logprobs);
    if (!(o.verify_prefix_cache >= 0 && o.verify_prefix_cache <= 1))
        return status_errorf(STATUS_INVALID_ARGUMENT, "verify_prefix_cache must be a fraction in [0, 1], got %g",
                             o.verify_prefix_cache);
    if (!(o.spec_p_min >= 0 && o.spec_p_min <= 1))
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_p_min must be in [0, 1], got %g", (double)o.spec_p_min);
    if (o.spec_corpus_min < 0 || o.spec_corpus_min > SPEC_CORPUS_MAX_MATCH)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_corpus_min must be in [0 (= 3), %d], got %d",
                             SPEC_CORPUS_MAX_MATCH, o.spec_corpus_min);
    if (!(o.spec_corpus_p_min >= 0 && o.spec_corpus_p_min <= 1))
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_corpus_p_min must be in [0, 1], got %g",
                             (double)o.spec_corpus_p_min);
    if (o.spec_corpus_learn < 0 || o.spec_corpus_learn > SPEC_LEARN_MAX)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_corpus_learn must be in [0 (off), %d] ids, got %lld",
                             SPEC_LEARN_MAX, (long long)o.spec_corpus_learn);
    if (o.spec_corpus_learn && o.spec_draft <= 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_corpus_learn needs speculation on (spec_draft > 0)");
    if (o.spec_corpus_keep && !o.spec_corpus_learn)
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_corpus_keep needs a learning corpus (spec_corpus_learn > 0)");
    if (o.spec_ngram_min < 0 || o.spec_ngram_min > (o.spec_ngram > 0 ? o.spec_ngram : 3))
        return status_errorf(STATUS_INVALID_ARGUMENT, "spec_ngram_min must be in [0 (= 2), spec_ngram %d], got %d",
                             o.spec_ngram > 0 ? o.spec_ngram : 3, o.spec_ngram_min);
    if (o.scheduling < SCHEDULING_FCFS || o.scheduling > SCHEDULING_PRIORITY)
        return status_errorf(STATUS_INVALID_ARGUMENT, "scheduling must be fcfs (0), fair (1) or priority (2), got %d",
                             o.scheduling);
    if (o.max_batch_tokens < o.max_seqs)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "max_batch_tokens (%d) must be at least max_seqs (%d): every running sequence decodes one token per step",
                             o.max_batch_tokens, o.max_seqs);
    if (o.tp < 1) o.tp = 1;
    if (o.pp < 1) o.pp = 1;
    const int ranks = o.world ? o.world->size : 1;
    if (ranks % (o.tp * o.pp) != 0 || (o.dp > 0 && o.dp * o.tp * o.pp != ranks))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "the world has %d ranks, which is not dp x tp x pp (dp %d, tp %d, pp %d): launch with "
                             "mpirun -n <dp x tp x pp>", ranks, o.dp, o.tp, o.pp);
    *dp = ranks / (o.tp * o.pp);
    o.dp = *dp;
    *out = o;
    return STATUS_OK;
}

enum status engine_create(const struct engine_options *opt, struct engine **out)
{
    *out = NULL;
    struct engine_options o;
    int dp = 1;
    enum status st = resolve_options(opt, &o, &dp);
    if (st != STATUS_OK) return st;
    struct engine *e = calloc(1, sizeof *e);
    if (!e) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    if (dp > 1 && o.spec_corpus_keep)
        st = status_errorf(STATUS_UNSUPPORTED, "a kept speculative corpus serves one replica: dp %d given", dp);
    else if (dp > 1) st = router_create(&o, dp, &e->router); /* replicas, each a conductor, behind the router */
    else st = conductor_create(&o, &e->local);
    if (st != STATUS_OK) {
        free(e);
        return st;
    }
    *out = e;
    return STATUS_OK;
}

void engine_free(struct engine *e)
{
    if (!e) return;
    router_free(e->router);
    conductor_free(e->local);
    free(e);
}

/* The conductor of this rank's replica. */
static struct conductor *local(const struct engine *e) { return e->router ? router_local(e->router) : e->local; }

const struct tokenizer *engine_tokenizer(const struct engine *e) { return conductor_tokenizer(local(e)); }

void engine_get_model_info(const struct engine *e, struct engine_model_info *info)
{
    conductor_get_model_info(local(e), info);
    if (e->router) info->dp_size = router_replicas(e->router);
}

enum status engine_validate(const struct engine *e, const int32_t *prompt, int n_prompt,
                            const struct request_params *p)
{
    return conductor_validate(local(e), prompt, n_prompt, p);
}

enum status engine_validate_prompts(const struct engine *e, int n_prompts, int n)
{
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    long long total = (long long)n_prompts * n, cap = (long long)info.max_queue * info.dp_size;
    if (total <= cap) return STATUS_OK;
    return status_errorf(STATUS_INVALID_ARGUMENT,
                         "the request asks for %lld samples (%d prompts x n %d), more than the server ever queues at "
                         "once (--max-queue %d samples%s): send fewer prompts or a smaller n per request",
                         total, n_prompts, n, info.max_queue, info.dp_size > 1 ? " on each replica" : "");
}

enum status engine_submit(struct engine *e, const char *request_id, const int32_t *prompt, int n_prompt,
                          const struct request_params *p, engine_event_fn on_event, void *ctx, uint64_t *handle)
{
    if (e->router) return router_submit(e->router, request_id, prompt, n_prompt, p, on_event, ctx, handle);
    return conductor_submit(e->local, request_id, prompt, n_prompt, p, on_event, ctx, handle);
}

/* Embeddings run on one replica: no router. */
static enum status embed_replica(struct engine *e)
{
    if (e->router)
        return status_errorf(STATUS_UNSUPPORTED, "embeddings are served without data parallelism (dp 1); this server "
                             "runs %d replicas", router_replicas(e->router));
    return STATUS_OK;
}

enum status engine_embed(struct engine *e, const int32_t *tokens, const int32_t *offsets, int n_inputs,
                         enum embed_pooling pooling, int normalize, float *out)
{
    enum status st = embed_replica(e);
    return st != STATUS_OK ? st : conductor_embed(e->local, tokens, offsets, n_inputs, pooling, normalize, out);
}

enum status engine_embed_submit(struct engine *e, const struct engine_embed_req *req)
{
    enum status st = embed_replica(e);
    return st != STATUS_OK ? st : conductor_embed_submit(e->local, req);
}

void engine_embed_cancel(struct engine *e, const struct engine_embed_req *req)
{
    if (!e->router) conductor_embed_cancel(e->local, req);
}

enum status engine_cancel(struct engine *e, uint64_t handle)
{
    if (e->router) return router_cancel(e->router, handle, NULL);
    return conductor_cancel(e->local, handle, NULL);
}

enum status engine_cancel_id(struct engine *e, const char *request_id)
{
    if (e->router) return router_cancel(e->router, 0, request_id);
    return conductor_cancel(e->local, 0, request_id);
}

int engine_step(struct engine *e)
{
    CHECK(!e->router, "engine_step with data-parallel replicas: use engine_start");
    return conductor_step(e->local);
}

int engine_is_conductor(const struct engine *e)
{
    return e->router ? router_is_front(e->router) : conductor_is_first_rank(e->local);
}

enum status engine_run_worker(struct engine *e)
{
    CHECK(!engine_is_conductor(e), "engine_run_worker on the conductor");
    return e->router ? router_run(e->router) : conductor_run_worker(e->local);
}

enum status engine_set_spec_corpus(struct engine *e, const int32_t *ids, int64_t n)
{
    if (e->router)
        return status_errorf(STATUS_UNSUPPORTED, "a speculative corpus serves one replica: dp %d given", engine_replicas(e));
    return conductor_set_spec_corpus(e->local, ids, n);
}

enum status engine_start(struct engine *e)
{
    return e->router ? router_start(e->router) : conductor_start(e->local);
}

void engine_drain(struct engine *e, double timeout_s)
{
    if (e->router) router_drain(e->router, timeout_s);
    else conductor_drain(e->local, timeout_s);
}

void engine_get_stats(struct engine *e, struct engine_stats *s)
{
    if (e->router) router_get_stats(e->router, s);
    else conductor_get_stats(e->local, s);
}

enum status engine_load_adapter(struct engine *e, const char *name, const char *dir)
{
    if (e->router)
        return status_errorf(STATUS_UNSUPPORTED, "LoadAdapter with data parallelism (dp %d) is not built: give the "
                             "adapters at start with --lora NAME=DIR (every replica loads them)", router_replicas(e->router));
    return conductor_load_adapter(e->local, name, dir);
}

enum status engine_unload_adapter(struct engine *e, const char *name)
{
    if (e->router)
        return status_errorf(STATUS_UNSUPPORTED, "UnloadAdapter with data parallelism (dp %d) is not built",
                             router_replicas(e->router));
    return conductor_unload_adapter(e->local, name);
}

int engine_list_adapters(struct engine *e, void (*fn)(void *ctx, const struct engine_adapter_info *info), void *ctx)
{
    return conductor_list_adapters(local(e), fn, ctx);
}

enum status engine_get_expert_load(struct engine *e, struct engine_expert_load *out)
{
    return conductor_get_expert_load(local(e), out);
}

int engine_replicas(const struct engine *e) { return e->router ? router_replicas(e->router) : 1; }

void engine_get_replica_stats(struct engine *e, int replica, struct engine_replica_stats *s)
{
    if (e->router) {
        router_get_replica_stats(e->router, replica, s);
        return;
    }
    CHECK(replica == 0, "replica %d of 1", replica);
    memset(s, 0, sizeof *s);
    conductor_get_stats(e->local, &s->engine);
    s->outstanding = s->engine.waiting + s->engine.running;
    s->routed = s->engine.requests_submitted;
}
