/* clients/client.c - the C client library (client.h): options and the channel (one per struct
 * client), and one public function per method of shardlm.v1.TextGeneration, each a call run
 * by client_call.c with its messages converted by client_convert.c.
 * Not here: the command line (cli/chat.c, cli/complete.c, cli/bench.c, cli/stats.c).
 * Tests: tests/test_client_lib.c (the library against a real server), tests/test_client.sh
 * (the client subcommands). */
#include "client.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>

#include "client_internal.h"
#include "shardlm/v1/text_generation.pb-c.h"

/* ---- names and status codes ----------------------------------------------------------- */

const char *client_grpc_code_name(int code)
{
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    if (code >= 0 && (size_t)code < sizeof names / sizeof names[0]) return names[code];
    return "UNKNOWN";
}

const char *client_finish_reason_name(enum client_finish_reason r)
{
    switch (r) {
    case CLIENT_FINISH_REASON_NONE: return "";
    case CLIENT_FINISH_REASON_LENGTH: return "length";
    case CLIENT_FINISH_REASON_STOP: return "stop";
    case CLIENT_FINISH_REASON_EOS: return "eos";
    case CLIENT_FINISH_REASON_CANCELLED: return "cancelled";
    case CLIENT_FINISH_REASON_DEADLINE: return "deadline";
    case CLIENT_FINISH_REASON_ERROR: return "error";
    }
    return "unknown";
}

/* ---- open / close --------------------------------------------------------------------- */

static enum status read_file(const char *path, char **out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (base_grow((void **)&buf, &cap, len + 4096 + 1, 1)) {
            free(buf);
            fclose(f);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
        }
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return status_errorf(STATUS_IO, "%s: read error", path);
    }
    buf[len] = '\0';
    *out = buf;
    return STATUS_OK;
}

enum status client_open(const char *addr, const struct client_options *o, struct client **out)
{
    static const struct client_options defaults = {0};
    if (!o) o = &defaults;
    *out = NULL;
    if (!addr || !*addr) return status_errorf(STATUS_INVALID_ARGUMENT, "the server address is empty");
    if (o->timeout_s < 0 || isnan(o->timeout_s))
        return status_errorf(STATUS_INVALID_ARGUMENT, "the timeout must be >= 0 seconds");
    if (isnan(o->resume_for_s)) return status_errorf(STATUS_INVALID_ARGUMENT, "resume_for_s is not a number");
    if (o->api_key) {
        for (const char *p = o->api_key; *p; p++)
            if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
                return status_errorf(STATUS_INVALID_ARGUMENT,
                                     "the API key must be printable ASCII (metadata value)");
    }
    char *pem = NULL;
    if (o->model && strlen(o->model) >= sizeof ((struct client *)0)->model)
        return status_errorf(STATUS_INVALID_ARGUMENT, "the model's name is longer than 255 bytes");
    if (o->tls_root_cert_file) {
        enum status st = read_file(o->tls_root_cert_file, &pem);
        if (st != STATUS_OK) return st;
    }
    struct client *c = calloc(1, sizeof *c);
    if (!c) {
        free(pem);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    pthread_mutex_init(&c->mu, NULL);
    c->timeout_s = o->timeout_s;
    c->resume_for_s = o->resume_for_s == 0 ? 60.0 : o->resume_for_s;
    snprintf(c->model, sizeof c->model, "%s", o->model ? o->model : "");
    grpc_init();

    grpc_arg args[7];
    int n_args = 0;
    /* Several replicas ("A:P,B:P", IP addresses): balanced by the channel, as the Python client
     * does (client.py's REPLICAS_SERVICE_CONFIG, the same text). */
    char *target = NULL;
    if (strchr(addr, ',') && !strstr(addr, ":/") && strncmp(addr, "ipv4:", 5) && strncmp(addr, "ipv6:", 5) &&
        strncmp(addr, "dns:", 4) && strncmp(addr, "unix:", 5)) {
        size_t n = strlen(addr);
        target = malloc(n + 6);
        if (!target) {
            client_close(c);
            free(pem);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        snprintf(target, n + 6, "%s%s", strchr(addr, '[') ? "ipv6:" : "ipv4:", addr);
        args[n_args].type = GRPC_ARG_STRING;
        args[n_args].key = (char *)GRPC_ARG_SERVICE_CONFIG;
        args[n_args++].value.string = (char *)REPLICAS_SERVICE_CONFIG;
    }
    /* Reconnect within a second of the server coming back (gRPC's default backoff grows to 120 s):
     * a journaled call reattaches to a restarted server while its request still runs there. */
    args[n_args].type = GRPC_ARG_INTEGER;
    args[n_args].key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
    args[n_args++].value.integer = RECONNECT_BACKOFF_MIN_MS;
    args[n_args].type = GRPC_ARG_INTEGER;
    args[n_args].key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[n_args++].value.integer = RECONNECT_BACKOFF_MAX_MS;
    args[n_args].type = GRPC_ARG_INTEGER;
    args[n_args].key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[n_args++].value.integer = MAX_RECEIVE_BYTES;
    args[n_args].type = GRPC_ARG_STRING;
    args[n_args].key = (char *)GRPC_ARG_PRIMARY_USER_AGENT_STRING;
    args[n_args++].value.string = (char *)"shardlm-client";
    if (o->own_connection) {
        args[n_args].type = GRPC_ARG_INTEGER;
        args[n_args].key = (char *)GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[n_args++].value.integer = 1;
    }
    if (o->tls_server_name) {
        args[n_args].type = GRPC_ARG_STRING;
        args[n_args].key = (char *)GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n_args++].value.string = (char *)o->tls_server_name;
    }
    grpc_channel_args cargs = {.num_args = (size_t)n_args, .args = args};
    grpc_channel_credentials *creds;
    if (o->tls || pem) creds = grpc_ssl_credentials_create(pem, NULL, NULL, NULL);
    else creds = grpc_insecure_credentials_create();
    c->channel = grpc_channel_create(target ? target : addr, creds, &cargs);
    if (target) { /* one channel to each replica as well (without the balancing service config) */
        cargs.num_args--;
        for (const char *p = addr; *p && c->n_replicas < CLIENT_MAX_REPLICAS;) {
            const char *e = strchr(p, ',');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            char one[256];
            if (n > 0 && n < sizeof one) {
                memcpy(one, p, n);
                one[n] = 0;
                grpc_channel *ch = grpc_channel_create(one, creds, &cargs);
                if (ch) c->replicas[c->n_replicas++] = ch;
            }
            p += n + (e != NULL);
        }
    }
    grpc_channel_credentials_release(creds);
    free(pem);
    free(target);
    if (!c->channel) {
        client_close(c);
        return status_errorf(STATUS_INVALID_ARGUMENT, "cannot create a channel to '%s'", addr);
    }
    if (o->api_key) {
        size_t n = strlen(o->api_key);
        char *v = malloc(n + 8);
        if (!v) {
            client_close(c);
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        memcpy(v, "Bearer ", 7);
        memcpy(v + 7, o->api_key, n + 1);
        c->auth.key = grpc_slice_from_static_string("authorization");
        c->auth.value = grpc_slice_from_copied_string(v);
        c->has_auth = 1;
        free(v);
    }
    *out = c;
    return STATUS_OK;
}

void client_close(struct client *c)
{
    if (!c) return;
    CHECK(!c->active, "client_close with calls still running");
    if (c->has_auth) grpc_slice_unref(c->auth.value);
    if (c->channel) grpc_channel_destroy(c->channel);
    for (int i = 0; i < c->n_replicas; i++) grpc_channel_destroy(c->replicas[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
    grpc_shutdown();
}

/* ---- Generate / Chat ------------------------------------------------------------------ */

/* What a response callback could not convert; the call then ends as cancelled by us, and
 * this is reported instead. */
struct convert_error {
    enum status st;
    char msg[512];
};

static int convert_failed(struct convert_error *e, enum status st)
{
    e->st = st;
    snprintf(e->msg, sizeof e->msg, "%s", status_message());
    return 1;
}

struct unary_ctx {
    struct client_result *res;
    struct convert_error err;
};

static int unary_generate_msg(void *ctx, ProtobufCMessage **m)
{
    struct unary_ctx *u = ctx;
    const Shardlm__V1__GenerateResponse *g = (const Shardlm__V1__GenerateResponse *)*m;
    struct client_result *r = u->res;
    struct client_completion *s;
    enum status st;
    if (!(r->request_id = client_str_dup(g->request_id)))
        return convert_failed(&u->err, status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"));
    r->seed = g->seed;
    r->usage = client_usage_from_pb(g->usage);
    st = client_logprobs_append(&r->prompt_logprobs, &r->n_prompt_logprobs, g->prompt_logprobs,
                         g->n_prompt_logprobs);
    if (st != STATUS_OK) return convert_failed(&u->err, st);
    if (g->n_completions == 0) {
        /* A server that fills only the top level (sample 0). */
        if ((st = client_result_sample(r, 0, &s)) != STATUS_OK) return convert_failed(&u->err, st);
        s->finish_reason = client_finish_reason_from_pb(g->finish_reason);
        s->usage = r->usage;
        st = client_sample_append(s, g->text, strlen(g->text), g->token_ids, g->n_token_ids,
                           g->logprobs, g->n_logprobs);
        return st != STATUS_OK ? convert_failed(&u->err, st) : 0;
    }
    for (size_t i = 0; i < g->n_completions; i++) {
        const Shardlm__V1__Completion *pc = g->completions[i];
        if ((st = client_result_sample(r, pc->index, &s)) != STATUS_OK) return convert_failed(&u->err, st);
        s->finish_reason = client_finish_reason_from_pb(pc->finish_reason);
        s->usage = client_usage_from_pb(pc->usage);
        st = client_sample_append(s, pc->text, strlen(pc->text), pc->token_ids, pc->n_token_ids,
                           pc->logprobs, pc->n_logprobs);
        if (st != STATUS_OK) return convert_failed(&u->err, st);
    }
    return 0;
}

enum status client_generate(struct client *c, const struct client_request *req,
                            struct client_result *res)
{
    struct client_result local = {0};
    if (!res) res = &local;
    client_result_free(res);
    struct request_pb rp;
    enum status st = client_request_to_pb(req, &rp);
    if (st == STATUS_OK) {
        struct unary_ctx u = {.res = res};
        st = client_call_run(c, rp.chat ? SERVICE "Chat" : SERVICE "Generate", client_request_pb_message(&rp),
                      &shardlm__v1__generate_response__descriptor, req->timeout_s, req->cancel_flag,
                      0, req->sampling.has_n ? req->sampling.n : 1, unary_generate_msg, &u, &res->grpc_code);
        if (u.err.st != STATUS_OK) st = status_errorf(u.err.st, "%s", u.err.msg);
    } else {
        res->grpc_code = GRPC_STATUS_INVALID_ARGUMENT;
    }
    client_request_pb_free(&rp);
    client_result_free(&local);
    return st;
}

struct stream_ctx {
    struct client_result *res;
    client_chunk_fn on_chunk;
    void *user;
    struct convert_error err;
};

static int stream_generate_msg(void *ctx, ProtobufCMessage **m)
{
    struct stream_ctx *sc = ctx;
    const Shardlm__V1__GenerateResponse *g = (const Shardlm__V1__GenerateResponse *)*m;
    struct client_result *r = sc->res;
    struct client_completion *s;
    struct client_logprob *lp = NULL;
    int n_lp = 0, stop = 0;
    enum status st;
    if (!r->request_id && !(r->request_id = client_str_dup(g->request_id))) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    r->seed = g->seed;
    if ((st = client_logprobs_append(&r->prompt_logprobs, &r->n_prompt_logprobs, g->prompt_logprobs,
                              g->n_prompt_logprobs)) != STATUS_OK)
        goto fail;
    if ((st = client_result_sample(r, g->index, &s)) != STATUS_OK) goto fail;
    if ((st = client_sample_append(s, g->text, strlen(g->text), g->token_ids, g->n_token_ids, g->logprobs,
                            g->n_logprobs)) != STATUS_OK)
        goto fail;
    struct client_chunk ch = {
        .request_id = g->request_id,
        .index = g->index,
        .text = g->text,
        .text_len = strlen(g->text),
        .token_ids = g->token_ids,
        .n_token_ids = (int)g->n_token_ids,
        .finish_reason = client_finish_reason_from_pb(g->finish_reason),
        .seed = g->seed,
    };
    if (ch.finish_reason != CLIENT_FINISH_REASON_NONE) {
        s->finish_reason = ch.finish_reason;
        s->usage = ch.usage = client_usage_from_pb(g->usage);
        r->usage.prompt_tokens = ch.usage.prompt_tokens;
        r->usage.cached_prompt_tokens = ch.usage.cached_prompt_tokens;
        r->usage.completion_tokens += ch.usage.completion_tokens;
    }
    if (sc->on_chunk) {
        if (g->n_logprobs) {
            /* The chunk's own view of its logprobs (the sample's copy is separate). */
            if ((st = client_logprobs_append(&lp, &n_lp, g->logprobs, g->n_logprobs)) != STATUS_OK) {
                client_logprobs_free(lp, n_lp);
                goto fail;
            }
            ch.logprobs = lp;
            ch.n_logprobs = n_lp;
        }
        stop = sc->on_chunk(sc->user, &ch);
        client_logprobs_free(lp, n_lp);
    }
    return stop;
fail:
    return convert_failed(&sc->err, st);
}

enum status client_generate_stream(struct client *c, const struct client_request *req,
                                   client_chunk_fn on_chunk, void *ctx, struct client_result *res)
{
    struct client_result local = {0};
    if (!res) res = &local;
    client_result_free(res);
    struct request_pb rp;
    enum status st = client_request_to_pb(req, &rp);
    if (st == STATUS_OK) {
        struct stream_ctx sc = {.res = res, .on_chunk = on_chunk, .user = ctx};
        st = client_call_run(c, rp.chat ? SERVICE "ChatStream" : SERVICE "GenerateStream",
                      client_request_pb_message(&rp), &shardlm__v1__generate_response__descriptor,
                      req->timeout_s, req->cancel_flag, 1, req->sampling.has_n ? req->sampling.n : 1, stream_generate_msg, &sc,
                      &res->grpc_code);
        if (sc.err.st != STATUS_OK) st = status_errorf(sc.err.st, "%s", sc.err.msg);
    } else {
        res->grpc_code = GRPC_STATUS_INVALID_ARGUMENT;
    }
    client_request_pb_free(&rp);
    client_result_free(&local);
    return st;
}

/* ---- the small unary methods ---------------------------------------------------------- */

static int keep_msg(void *ctx, ProtobufCMessage **m)
{
    *(ProtobufCMessage **)ctx = *m;
    *m = NULL;
    return 0;
}

/* Runs a unary call and hands back its response (caller frees with
 * protobuf_c_message_free_unpacked). */
static enum status unary_call(struct client *c, const char *method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *d, ProtobufCMessage **out)
{
    ProtobufCMessage *resp = NULL;
    enum status st = client_call_run(c, method, req, d, 0, NULL, 0, 0, keep_msg, &resp, NULL);
    if (st != STATUS_OK) {
        if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        return st;
    }
    *out = resp;
    return STATUS_OK;
}

enum status client_cancel(struct client *c, const char *request_id, int *cancelled)
{
    Shardlm__V1__CancelRequest req = SHARDLM__V1__CANCEL_REQUEST__INIT;
    req.request_id = (char *)(request_id ? request_id : "");
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Cancel", &req.base, &shardlm__v1__cancel_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    if (cancelled) *cancelled = ((Shardlm__V1__CancelResponse *)m)->cancelled;
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

enum status client_tokenize(struct client *c, const char *text, int add_bos, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    Shardlm__V1__TokenizeRequest req = SHARDLM__V1__TOKENIZE_REQUEST__INIT;
    req.model = c->model;
    req.text = (char *)(text ? text : "");
    if (add_bos >= 0) {
        req._add_bos_case = SHARDLM__V1__TOKENIZE_REQUEST___ADD_BOS_ADD_BOS;
        req.add_bos = add_bos != 0;
    }
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Tokenize", &req.base, &shardlm__v1__tokenize_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__TokenizeResponse *r = (const Shardlm__V1__TokenizeResponse *)m;
    *ids = malloc((r->n_token_ids ? r->n_token_ids : 1) * sizeof **ids);
    if (!*ids) {
        protobuf_c_message_free_unpacked(m, NULL);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    if (r->n_token_ids) memcpy(*ids, r->token_ids, r->n_token_ids * sizeof **ids);
    *n = (int)r->n_token_ids;
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

enum status client_detokenize(struct client *c, const int32_t *ids, int n, char **text)
{
    *text = NULL;
    if (n < 0) return status_errorf(STATUS_INVALID_ARGUMENT, "negative token count");
    Shardlm__V1__DetokenizeRequest req = SHARDLM__V1__DETOKENIZE_REQUEST__INIT;
    req.model = c->model;
    req.n_token_ids = (size_t)n;
    req.token_ids = (int32_t *)ids;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "Detokenize", &req.base, &shardlm__v1__detokenize_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    *text = client_str_dup(((const Shardlm__V1__DetokenizeResponse *)m)->text);
    protobuf_c_message_free_unpacked(m, NULL);
    return *text ? STATUS_OK : status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

void client_model_info_free(struct client_model_info *m)
{
    if (!m) return;
    free(m->architecture);
    free(m->dtype);
    free(m->device);
    free(m->chat_template);
    free(m->model_id);
    free(m->default_adapter);
    for (int i = 0; i < m->n_adapters; i++) free(m->adapters[i]);
    free(m->adapters);
    memset(m, 0, sizeof *m);
}

enum status client_model_info(struct client *c, struct client_model_info *out)
{
    memset(out, 0, sizeof *out);
    Shardlm__V1__GetModelInfoRequest req = SHARDLM__V1__GET_MODEL_INFO_REQUEST__INIT;
    req.model = c->model;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "GetModelInfo", &req.base,
                                &shardlm__v1__get_model_info_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__GetModelInfoResponse *r = (const Shardlm__V1__GetModelInfoResponse *)m;
    out->n_layers = r->n_layers;
    out->d_model = r->d_model;
    out->n_heads = r->n_heads;
    out->n_kv_heads = r->n_kv_heads;
    out->head_dim = r->head_dim;
    out->ffn_hidden = r->ffn_hidden;
    out->vocab_size = r->vocab_size;
    out->context_length = r->context_length;
    out->tp_size = r->tp_size;
    out->pp_size = r->pp_size;
    out->dp_size = r->dp_size;
    out->kv_block_tokens = r->kv_block_tokens;
    out->kv_blocks = r->kv_blocks;
    out->bos_id = r->bos_id;
    out->eos_id = r->eos_id;
    out->max_logprobs = r->max_logprobs;
    out->architecture = client_str_dup(r->architecture);
    out->dtype = client_str_dup(r->dtype);
    out->device = client_str_dup(r->device);
    out->chat_template = client_str_dup(r->chat_template);
    out->max_loras = r->max_loras;
    out->max_lora_rank = r->max_lora_rank;
    out->model_id = client_str_dup(r->model_id);
    out->default_adapter = client_str_dup(r->default_adapter);
    int oom = !out->model_id || !out->default_adapter;
    if (r->n_adapters && !(out->adapters = calloc(r->n_adapters, sizeof *out->adapters))) oom = 1;
    for (size_t i = 0; !oom && i < r->n_adapters; i++, out->n_adapters++)
        if (!(out->adapters[i] = client_str_dup(r->adapters[i]))) oom = 1;
    protobuf_c_message_free_unpacked(m, NULL);
    if (oom || !out->architecture || !out->dtype || !out->device || !out->chat_template) {
        client_model_info_free(out);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    return STATUS_OK;
}

enum status client_load_adapter(struct client *c, const char *name, const char *path, int *rank)
{
    Shardlm__V1__LoadAdapterRequest req = SHARDLM__V1__LOAD_ADAPTER_REQUEST__INIT;
    req.model = c->model;
    req.name = (char *)name;
    req.path = (char *)path;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "LoadAdapter", &req.base, &shardlm__v1__load_adapter_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    if (rank) *rank = ((const Shardlm__V1__LoadAdapterResponse *)m)->rank;
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

enum status client_unload_adapter(struct client *c, const char *name)
{
    Shardlm__V1__UnloadAdapterRequest req = SHARDLM__V1__UNLOAD_ADAPTER_REQUEST__INIT;
    req.model = c->model;
    req.name = (char *)name;
    ProtobufCMessage *m = NULL;
    enum status st =
        unary_call(c, SERVICE "UnloadAdapter", &req.base, &shardlm__v1__unload_adapter_response__descriptor, &m);
    if (st == STATUS_OK) protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

enum status client_server_stats(struct client *c, struct client_server_stats *out)
{
    memset(out, 0, sizeof *out);
    Shardlm__V1__GetServerStatsRequest req = SHARDLM__V1__GET_SERVER_STATS_REQUEST__INIT;
    req.model = c->model;
    ProtobufCMessage *m = NULL;
    enum status st = unary_call(c, SERVICE "GetServerStats", &req.base,
                                &shardlm__v1__get_server_stats_response__descriptor, &m);
    if (st != STATUS_OK) return st;
    const Shardlm__V1__GetServerStatsResponse *r = (const Shardlm__V1__GetServerStatsResponse *)m;
    out->waiting = r->waiting;
    out->running = r->running;
    out->kv_blocks_total = r->kv_blocks_total;
    out->kv_blocks_free = r->kv_blocks_free;
    out->kv_blocks_cached = r->kv_blocks_cached;
    out->kv_usage = r->kv_usage;
    out->requests_submitted = r->requests_submitted;
    out->requests_finished = r->requests_finished;
    out->prompt_tokens = r->prompt_tokens;
    out->generated_tokens = r->generated_tokens;
    out->prefix_cache_hit_tokens = r->prefix_cache_hit_tokens;
    out->prefix_cache_hit_rate = r->prefix_cache_hit_rate;
    out->engine_steps = r->engine_steps;
    out->preemptions = r->preemptions;
    out->spec_draft_tokens = r->spec_draft_tokens;
    out->spec_accepted_tokens = r->spec_accepted_tokens;
    out->spec_backoffs = r->spec_backoffs;
    out->spec_lookup_draft_tokens = r->spec_lookup_draft_tokens;
    out->spec_lookup_accepted_tokens = r->spec_lookup_accepted_tokens;
    out->spec_corpus_draft_tokens = r->spec_corpus_draft_tokens;
    out->spec_corpus_accepted_tokens = r->spec_corpus_accepted_tokens;
    out->spec_corpus_tokens = r->spec_corpus_tokens;
    out->active_calls = r->active_calls;
    out->uptime_seconds = r->uptime_seconds;
    for (size_t i = 0; i < r->n_replicas && i < CLIENT_MAX_REPLICAS; i++) {
        const Shardlm__V1__ReplicaStats *p = r->replicas[i];
        out->replicas[i] = (struct client_replica_stats){
            .leader_rank = p->leader_rank, .outstanding = p->outstanding, .routed = p->routed,
            .routed_by_prefix = p->routed_by_prefix, .waiting = p->waiting, .running = p->running,
            .kv_blocks_total = p->kv_blocks_total, .kv_blocks_free = p->kv_blocks_free,
            .requests_finished = p->requests_finished, .generated_tokens = p->generated_tokens,
            .prefix_cache_hit_tokens = p->prefix_cache_hit_tokens, .report_age_seconds = p->report_age_seconds};
        out->n_replicas = (int)i + 1;
    }
    protobuf_c_message_free_unpacked(m, NULL);
    return STATUS_OK;
}

