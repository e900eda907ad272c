/* server/proxy.h - `shardlm route`: one HTTP address in front of several separate `serve`
 * jobs (replicas), so that a replica lost with its node does not stop the service: Open MPI
 * (4.1, Debian's) ends a whole job when one of its nodes is lost, so in-job data parallelism
 * (`serve --dp`) cannot move requests to the live replica; replicas as separate jobs behind this
 * router can (docs/deployment.md).
 *
 * What it does, per request (the body is read whole first, so that it can be sent again):
 *   - a new request goes to the live replica with the fewest requests in flight through the
 *     router (ties taken in turn); a replica that refuses the connection, or ends it before a
 *     whole response head, is marked down and the request goes to the next; a 503 (draining,
 *     loading, full) or a 404 (nothing was done: another replica may hold what it names, or
 *     serve the model it asks for) also goes on to the next; any other answer is relayed as it
 *     comes (SSE streams chunk by chunk), hop-by-hop headers aside;
 *   - a request that carries an Idempotency-Key goes to the replica it went to before (a table
 *     of the latest ROUTER_STICKY keys), else to the first live one in an order fixed by the key
 *     (rendezvous hashing), so that a retry finds its journaled answer;
 *   - a request naming something only one replica holds (a `Last-Event-ID`, a path under
 *     /v1/responses/, /v1/files/ or /v1/fine_tuning/jobs/, a body with previous_response_id)
 *     is tried on every replica until one does not answer 404; when none has it and a replica
 *     was unreachable, the answer is 503 with Retry-After: 1 (the thing may live in that
 *     replica's journal), not 404;
 *   - no replica reachable: 503 with Retry-After: 1.
 * A probe thread asks every replica's GET /health each --probe-interval (200: up, anything else
 * or no answer within the connect timeout: down); a failed connection marks a replica down at
 * once, a relayed answer up. The router's own routes: GET /health (200 while a replica is up)
 * and GET /metrics (shardlm_router_* in Prometheus text; the replicas' metrics are scraped from
 * them). A stream whose replica dies mid-way is cut for its client as the replica cut it (no
 * [DONE]): a journaled stream is then resumed by its client through the router once the replica
 * restarts on its journal (Last-Event-ID, above).
 * Not here: gRPC (clients balance gRPC themselves: docs/deployment.md), TLS, API keys (relayed
 * to the replicas, which check them).
 * Tests: tests/server/test_router.py. */
#ifndef SHARDLM_PROXY_H
#define SHARDLM_PROXY_H

#include <stddef.h>

#include "base.h"

#define ROUTER_MAX_BACKENDS 64
#define ROUTER_STICKY 4096 /* Idempotency-Keys remembered with the replica they went to */

struct proxy_options {
    const char *listen;             /* HOST:PORT the router serves HTTP on */
    const char *backends[ROUTER_MAX_BACKENDS]; /* HOST:PORT of each replica's HTTP front */
    int n_backends;
    double probe_interval_s;        /* [1] */
    double connect_timeout_s;       /* a replica's connection (and its probe's answer) [2] */
    double drain_timeout_s;         /* after SIGTERM, open requests may finish this long [30] */
    int max_connections;            /* client connections at once [1024] */
    size_t max_body_bytes;          /* a request body at most [256 MiB] (file uploads) */
};

struct proxy;

/* Resolves the replicas, probes each once, and serves on o->listen (printing "shardlm: route
 * listening on HOST:PORT"). */
enum status proxy_start(const struct proxy_options *o, struct proxy **out);
/* Reads a replica's whole answer from fd as a relay does (the head, then the body unframed:
 * Content-Length, chunked or to the end of the stream): 0 with *code and *body (malloc'd, *len
 * bytes, NUL-terminated), or -1 when the answer is malformed or cut. For tests (test_proxy.c,
 * fuzz_proxy_reply.c). */
int proxy_read_reply(int fd, int head_only, int *code, char **body, size_t *len);
/* Stops taking connections, lets open requests finish for up to o->drain_timeout_s, cuts the
 * rest, and frees r. */
void proxy_stop(struct proxy *r);

#endif
