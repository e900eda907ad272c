/* engine/serving/conductor.h - one replica of the model (tp x pp ranks, or one): on its first
 * rank, the request intake, the scheduler, the step (plan, step-plan broadcast, forward,
 * sampling, events) and the engine thread; on its other ranks, the replay of the step plans.
 * The engine.h façade runs one conductor, or a router (router.h) that runs one per replica.
 * Not here: continuous batching (scheduler.c), requests, limits and events (request.c),
 * sampling maths (sampler.c), routing between replicas (router.c).
 * Tests: tests/test_engine.c (also under mpirun: tp, pp and dp).
 *
 * Contracts are those of the engine.h function of the same name (conductor_submit as
 * engine_submit, ...), for one replica. Threads: conductor_submit, _cancel, _get_stats,
 * _validate and the adapter functions may be called from any thread; conductor_step from one
 * thread only (the engine thread once conductor_start ran); events and on_fatal are called on
 * that thread. */
#ifndef SHARDLM_CONDUCTOR_H
#define SHARDLM_CONDUCTOR_H

#include "engine.h"

struct conductor;

/* o is resolved by engine_create (defaults applied, o->dp 1, o->world NULL or this
 * replica's world of tp x pp ranks, which every rank of it calls with). */
enum status conductor_create(const struct engine_options *o, struct conductor **out);
void        conductor_free(struct conductor *c); /* accepts NULL; drains (0 s) on the first rank */

const struct tokenizer *conductor_tokenizer(const struct conductor *c);
void        conductor_get_model_info(const struct conductor *c, struct engine_model_info *info);
int         conductor_is_first_rank(const struct conductor *c);

struct grammar;
/* p's constraint compiled for the model's vocabulary through the conductor's cache (*g a new
 * reference, NULL when p has none); a source that does not compile is INVALID_ARGUMENT. */
enum status conductor_compile_constraint(struct conductor *c, const struct request_params *p, struct grammar **g);
enum status conductor_validate(const struct conductor *c, const int32_t *prompt, int n_prompt,
                               const struct request_params *p);
enum status conductor_submit(struct conductor *c, const char *request_id, const int32_t *prompt, int n_prompt,
                             const struct request_params *p, engine_event_fn on_event, void *ctx,
                             uint64_t *handle);
/* By handle (request_id NULL) or by request id. */
enum status conductor_cancel(struct conductor *c, uint64_t handle, const char *request_id);

/* engine_load_adapter / _unload_adapter / _list_adapters for one replica. */
enum status conductor_load_adapter(struct conductor *c, const char *name, const char *dir);
enum status conductor_unload_adapter(struct conductor *c, const char *name);
int         conductor_list_adapters(struct conductor *c, void (*fn)(void *ctx, const struct engine_adapter_info *info),
                                    void *ctx);

/* engine_embed for one replica (conductor_embed.c). */
enum status conductor_embed(struct conductor *c, const int32_t *tokens, const int32_t *offsets, int n_inputs,
                            enum embed_pooling pooling, int normalize, float *out);
enum status conductor_embed_submit(struct conductor *c, const struct engine_embed_req *req);
void        conductor_embed_cancel(struct conductor *c, const struct engine_embed_req *req);

int         conductor_step(struct conductor *c);
enum status conductor_start(struct conductor *c);
enum status conductor_set_spec_corpus(struct conductor *c, const int32_t *ids, int64_t n); /* engine_set_spec_corpus */
void        conductor_drain(struct conductor *c, double timeout_s);
enum status conductor_run_worker(struct conductor *c); /* ranks other than the first */
void        conductor_get_stats(struct conductor *c, struct engine_stats *s);
enum status conductor_get_expert_load(const struct conductor *c, struct engine_expert_load *out);

#endif
