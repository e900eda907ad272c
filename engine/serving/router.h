/* engine/serving/router.h - data-parallel serving (private to the engine): dp replicas of a tp x pp
 * model, each a conductor (conductor.h: scheduler, KV cache, sampling) in its own sub-world, and a
 * router on rank 0 that sends each request to one replica and brings its events back.
 *
 * Roles, by world rank:
 * - front (rank 0): the caller's engine. Runs replica 0's engine locally and a router thread
 *   that exchanges messages with the other replicas' leaders (parallel_msg_*).
 * - leader (first rank of replica d > 0): runs replica d's engine (its conductor) and an agent
 *   loop (router_run) that submits what rank 0 routes to it and posts its events back.
 * - worker (any other rank): replays its replica conductor's step plans (conductor_run_worker).
 *
 * Routing: the replica with the fewest outstanding samples, unless a replica that recently
 * served the same leading prompt blocks is at most a small margin busier (its prefix cache
 * then skips that prefill). Failures: a replica that reports a fatal error, goes silent longer
 * than rank_timeout_s, or stops receiving makes the whole engine fatal (on_fatal, requests on
 * other replicas fail with UNAVAILABLE), as a lost rank does without data parallelism.
 * Notes: docs/parallel.md ("Data parallelism"). Tests: tests/test_engine.c (--dp). */
#ifndef SHARDLM_ROUTER_H
#define SHARDLM_ROUTER_H

#include "engine.h"

struct router;
struct conductor;

/* Every rank of the world calls it (a collective): o->world holds dp x o->tp x o->pp ranks. */
enum status router_create(const struct engine_options *o, int dp, struct router **out);
void        router_free(struct router *r); /* front: drains (0 s) and shuts the replicas down */

struct conductor *router_local(const struct router *r); /* this rank's replica */
int  router_is_front(const struct router *r);

enum status router_submit(struct router *r, const char *request_id, const int32_t *prompt,
                          int n_prompt, const struct request_params *p, engine_event_fn on_event,
                          void *ctx, uint64_t *handle);
enum status router_cancel(struct router *r, uint64_t handle, const char *request_id);
enum status router_start(struct router *r);
void        router_drain(struct router *r, double timeout_s);
enum status router_run(struct router *r); /* leader and worker ranks */

void router_get_stats(struct router *r, struct engine_stats *s);
int  router_replicas(const struct router *r);
void router_get_replica_stats(struct router *r, int replica, struct engine_replica_stats *s);

#endif
