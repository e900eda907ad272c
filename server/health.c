/* server/health.c - grpc.health.v1.Health: Check answers the serving status at once; Watch
 * sends it, then a message whenever it changes (the loop calls health_changed after every
 * phase change). Health needs no API key and answers while the model loads.
 * Not here: the phases (server.c), protobuf (convert.c).
 * Tests: tests/server/test_server.py (basic, drain, auth). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "server_internal.h"

/* ---- health ------------------------------------------------------------------------------ */

static int health_known(const char *service)
{
    return !service[0] || !strcmp(service, "shardlm.v1.TextGeneration");
}

static int health_now(struct server *s)
{
    return atomic_load(&s->phase) == PHASE_READY ? HEALTH_SERVING : HEALTH_NOT_SERVING;
}

void health_watch_pump(struct call *c)
{
    if (c->close_done || c->send_inflight || c->status_sent) return;
    int now = c->watch_unknown ? HEALTH_SERVICE_UNKNOWN : health_now(c->s);
    if (now == c->watch_last) return;
    uint8_t *msg;
    size_t len;
    if (convert_health_response(now, &msg, &len) != STATUS_OK) {
        call_fail(c, GRPC_STATUS_INTERNAL, "out of memory");
        return;
    }
    c->watch_last = now;
    call_send(c, msg, len, 0, GRPC_STATUS_OK, NULL);
}

void health_changed(struct server *s)
{
    int now = health_now(s);
    if (now == s->health_serving) return;
    s->health_serving = now;
    LOG_INFO("server", "health: %s", now == HEALTH_SERVING ? "SERVING" : "NOT_SERVING");
    for (struct call *c = s->calls; c; c = c->next)
        if (c->method == METHOD_HEALTH_WATCH && !c->recv_inflight && c->watch_last) health_watch_pump(c);
}

void health_handle(struct call *c, const uint8_t *data, size_t len)
{
    char *service;
    enum status st = convert_health_request(data, len, &service);
    if (st != STATUS_OK) {
        call_fail_status(c, st, status_message());
        return;
    }
    if (c->method == METHOD_HEALTH_CHECK) {
        if (!health_known(service)) {
            char msg[300];
            snprintf(msg, sizeof msg, "unknown service '%.200s'", service);
            call_fail(c, GRPC_STATUS_NOT_FOUND, msg);
        } else {
            uint8_t *out;
            size_t out_len;
            if (convert_health_response(health_now(c->s), &out, &out_len) == STATUS_OK) call_reply(c, out, out_len);
            else call_fail(c, GRPC_STATUS_INTERNAL, "out of memory");
        }
    } else {
        c->watch_unknown = !health_known(service);
        health_watch_pump(c);
    }
    free(service);
}
