/* server/convert_admin.c - protobuf-c messages <-> native structs for the small RPCs: Cancel,
 * LoadAdapter / UnloadAdapter, GetModelInfo, GetServerStats, grpc.health.v1 and
 * grpc.reflection.v1alpha (convert.h). The generation requests and responses, Tokenize and
 * Detokenize are convert.c's. Tests: tests/server/test_server.py, test_lora_serving.py. */
#include "convert.h"
#include "convert_impl.h"

#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "shardlm/v1/text_generation.pb-c.h"

enum status convert_cancel_request(const void *data, size_t len, char **request_id)
{
    *request_id = NULL;
    enum status st;
    Shardlm__V1__CancelRequest *m =
        (Shardlm__V1__CancelRequest *)convert_unpack(&shardlm__v1__cancel_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    if (!m->request_id[0]) st = status_errorf(STATUS_INVALID_ARGUMENT, "request_id must not be empty");
    else st = request_id_check(m->request_id);
    if (st == STATUS_OK && !(*request_id = strdup(m->request_id))) st = convert_oom();
    shardlm__v1__cancel_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_cancel_response(int cancelled, uint8_t **out, size_t *len)
{
    Shardlm__V1__CancelResponse m = SHARDLM__V1__CANCEL_RESPONSE__INIT;
    m.cancelled = cancelled ? 1 : 0;
    return convert_pack(&m.base, out, len);
}

enum status convert_load_adapter_request(const void *data, size_t len, char **name, char **path)
{
    *name = *path = NULL;
    enum status st;
    Shardlm__V1__LoadAdapterRequest *m =
        (Shardlm__V1__LoadAdapterRequest *)convert_unpack(&shardlm__v1__load_adapter_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    if (!m->name[0]) st = status_errorf(STATUS_INVALID_ARGUMENT, "name must not be empty");
    else if (!m->path[0]) st = status_errorf(STATUS_INVALID_ARGUMENT, "path must not be empty");
    else if (strlen(m->path) > 4000) st = status_errorf(STATUS_INVALID_ARGUMENT, "path: at most 4000 bytes");
    else if (!(*name = strdup(m->name)) || !(*path = strdup(m->path))) st = convert_oom();
    shardlm__v1__load_adapter_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_load_adapter_response(const struct engine_adapter_info *a, int n_loaded, int max_loras,
                                          uint8_t **out, size_t *len)
{
    Shardlm__V1__LoadAdapterResponse m = SHARDLM__V1__LOAD_ADAPTER_RESPONSE__INIT;
    m.rank = a->rank;
    m.alpha = a->alpha;
    m.n_loaded = n_loaded;
    m.max_loras = max_loras;
    return convert_pack(&m.base, out, len);
}

enum status convert_unload_adapter_request(const void *data, size_t len, char **name)
{
    *name = NULL;
    enum status st;
    Shardlm__V1__UnloadAdapterRequest *m =
        (Shardlm__V1__UnloadAdapterRequest *)convert_unpack(&shardlm__v1__unload_adapter_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    if (!m->name[0]) st = status_errorf(STATUS_INVALID_ARGUMENT, "name must not be empty");
    else if (!(*name = strdup(m->name))) st = convert_oom();
    shardlm__v1__unload_adapter_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_unload_adapter_response(uint8_t **out, size_t *len)
{
    Shardlm__V1__UnloadAdapterResponse m = SHARDLM__V1__UNLOAD_ADAPTER_RESPONSE__INIT;
    return convert_pack(&m.base, out, len);
}

enum status convert_request_model(enum model_request which, const void *data, size_t len, char **model)
{
    static const ProtobufCMessageDescriptor *const descs[] = {
        [MODEL_REQUEST_TOKENIZE] = &shardlm__v1__tokenize_request__descriptor,
        [MODEL_REQUEST_DETOKENIZE] = &shardlm__v1__detokenize_request__descriptor,
        [MODEL_REQUEST_MODEL_INFO] = &shardlm__v1__get_model_info_request__descriptor,
        [MODEL_REQUEST_SERVER_STATS] = &shardlm__v1__get_server_stats_request__descriptor,
        [MODEL_REQUEST_LOAD_ADAPTER] = &shardlm__v1__load_adapter_request__descriptor,
        [MODEL_REQUEST_UNLOAD_ADAPTER] = &shardlm__v1__unload_adapter_request__descriptor,
    };
    *model = NULL;
    enum status st;
    const ProtobufCMessageDescriptor *d = descs[which];
    ProtobufCMessage *m = convert_unpack(d, data, len, d->name, &st);
    if (!m) return st;
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "model");
    CHECK(f && f->type == PROTOBUF_C_TYPE_STRING, "%s has no string field 'model'", d->name);
    const char *v = *(char *const *)((const char *)m + f->offset);
    if (!(*model = strdup(v ? v : ""))) st = convert_oom();
    protobuf_c_message_free_unpacked(m, NULL);
    return st;
}

enum status convert_model_info_response(const struct model_info_out *mi, uint8_t **out, size_t *len)
{
    Shardlm__V1__GetModelInfoResponse m = SHARDLM__V1__GET_MODEL_INFO_RESPONSE__INIT;
    const struct engine_model_info *i = &mi->info;
    m.architecture = (char *)(i->architecture ? i->architecture : "");
    m.n_layers = i->n_layers;
    m.d_model = i->d_model;
    m.n_heads = i->n_heads;
    m.n_kv_heads = i->n_kv_heads;
    m.head_dim = i->head_dim;
    m.ffn_hidden = i->ffn_hidden;
    m.vocab_size = i->vocab_size;
    m.context_length = i->max_positions;
    m.dtype = (char *)(i->dtype ? i->dtype : "");
    m.quantization = (char *)(i->quantization ? i->quantization : "");
    m.device = (char *)(i->device ? i->device : "");
    m.tp_size = i->tp_size;
    m.dp_size = i->dp_size;
    m.pp_size = i->pp_size;
    m.kv_block_tokens = i->block_tokens;
    m.kv_blocks = i->kv_blocks;
    m.max_loras = i->max_loras;
    m.max_lora_rank = i->max_lora_rank;
    m.bos_id = i->bos_id;
    m.eos_id = i->eos_id;
    m.chat_template = (char *)mi->chat_template;
    m.max_logprobs = mi->max_logprobs;
    m.adapters = (char **)mi->adapters;
    m.n_adapters = (size_t)mi->n_adapters;
    m.model_id = (char *)(mi->model_id ? mi->model_id : "");
    m.default_adapter = (char *)(mi->default_adapter ? mi->default_adapter : "");
    return convert_pack(&m.base, out, len);
}

enum status convert_server_stats_response(const struct server_stats_out *s, uint8_t **out, size_t *len)
{
    Shardlm__V1__GetServerStatsResponse m = SHARDLM__V1__GET_SERVER_STATS_RESPONSE__INIT;
    const struct engine_stats *e = &s->engine;
    m.waiting = e->waiting;
    m.running = e->running;
    m.kv_blocks_total = e->kv_blocks_total;
    m.kv_blocks_free = e->kv_blocks_free;
    m.kv_blocks_cached = e->kv_blocks_cached;
    m.kv_usage = e->kv_blocks_total > 0 ? 1.0f - (float)e->kv_blocks_free / (float)e->kv_blocks_total : 0.0f;
    m.requests_submitted = e->requests_submitted;
    m.requests_finished = e->requests_finished;
    m.prompt_tokens = e->prompt_tokens;
    m.generated_tokens = e->generated_tokens;
    m.prefix_cache_hit_tokens = e->prefix_cache_hit_tokens;
    m.prefix_cache_hit_rate = e->prompt_tokens ? (float)((double)e->prefix_cache_hit_tokens / (double)e->prompt_tokens) : 0.0f;
    m.engine_steps = e->steps;
    m.preemptions = e->preemptions;
    m.spec_draft_tokens = e->spec_drafted;
    m.spec_accepted_tokens = e->spec_accepted;
    m.spec_backoffs = e->spec_backoffs;
    m.spec_lookup_draft_tokens = e->spec_lookup_drafted;
    m.spec_lookup_accepted_tokens = e->spec_lookup_accepted;
    m.spec_corpus_draft_tokens = e->spec_corpus_drafted;
    m.spec_corpus_accepted_tokens = e->spec_corpus_accepted;
    m.spec_corpus_tokens = e->spec_corpus_tokens;
    m.prefix_cache_verified = e->prefix_cache_verified;
    m.prefix_cache_mismatches = e->prefix_cache_mismatches;
    m.prefix_cache_verify_skipped = e->prefix_cache_verify_skipped;
    m.prefix_cache_max_abs_diff = e->prefix_cache_max_abs_diff;
    m.active_calls = s->active_calls;
    m.uptime_seconds = s->uptime_seconds;
    enum { MAX_REPLICAS = 256 };
    Shardlm__V1__ReplicaStats rs[MAX_REPLICAS], *rp[MAX_REPLICAS];
    m.n_replicas = s->n_replicas < MAX_REPLICAS ? (size_t)s->n_replicas : MAX_REPLICAS;
    m.replicas = rp;
    for (size_t i = 0; i < m.n_replicas; i++) {
        const struct engine_replica_stats *r = &s->replicas[i];
        rs[i] = (Shardlm__V1__ReplicaStats)SHARDLM__V1__REPLICA_STATS__INIT;
        rs[i].leader_rank = r->leader_rank;
        rs[i].outstanding = r->outstanding;
        rs[i].routed = r->routed;
        rs[i].routed_by_prefix = r->routed_by_prefix;
        rs[i].waiting = r->engine.waiting;
        rs[i].running = r->engine.running;
        rs[i].kv_blocks_total = r->engine.kv_blocks_total;
        rs[i].kv_blocks_free = r->engine.kv_blocks_free;
        rs[i].requests_finished = r->engine.requests_finished;
        rs[i].generated_tokens = r->engine.generated_tokens;
        rs[i].prefix_cache_hit_tokens = r->engine.prefix_cache_hit_tokens;
        rs[i].report_age_seconds = r->report_age_s;
        rp[i] = &rs[i];
    }
    const struct engine_expert_load *el = &s->expert_load;
    Shardlm__V1__ExpertLoad *ls = NULL, **lp = NULL;
    if (el->n_layers > 0) {
        ls = calloc((size_t)el->n_layers, sizeof *ls);
        lp = calloc((size_t)el->n_layers, sizeof *lp);
        if (!ls || !lp) {
            free(ls);
            free(lp);
            return convert_oom();
        }
        for (int l = 0; l < el->n_layers; l++) {
            ls[l] = (Shardlm__V1__ExpertLoad)SHARDLM__V1__EXPERT_LOAD__INIT;
            ls[l].layer = el->layer_first + l;
            ls[l].n_tokens = (size_t)el->n_experts;
            ls[l].tokens = (uint64_t *)el->load + (size_t)l * (size_t)el->n_experts;
            lp[l] = &ls[l];
        }
    }
    m.n_expert_load = el->n_layers > 0 ? (size_t)el->n_layers : 0;
    m.expert_load = lp;
    enum status st = convert_pack(&m.base, out, len);
    free(ls);
    free(lp);
    return st;
}

/* ---- grpc.health.v1 -------------------------------------------------------------------- */

enum status convert_health_request(const void *data, size_t len, char **service)
{
    *service = NULL;
    enum status st;
    Grpc__Health__V1__HealthCheckRequest *m = (Grpc__Health__V1__HealthCheckRequest *)convert_unpack(
        &grpc__health__v1__health_check_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    *service = strdup(m->service);
    grpc__health__v1__health_check_request__free_unpacked(m, NULL);
    return *service ? STATUS_OK : convert_oom();
}

enum status convert_health_response(int status, uint8_t **out, size_t *len)
{
    Grpc__Health__V1__HealthCheckResponse m = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    m.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)status;
    return convert_pack(&m.base, out, len);
}

/* ---- grpc.reflection.v1alpha ------------------------------------------------------------- */

enum status convert_reflection_request(const void *data, size_t len, struct reflection_query *q)
{
    memset(q, 0, sizeof *q);
    enum status st;
    Grpc__Reflection__V1alpha__ServerReflectionRequest *m = (Grpc__Reflection__V1alpha__ServerReflectionRequest *)convert_unpack(
        &grpc__reflection__v1alpha__server_reflection_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    const char *arg = "";
    switch (m->message_request_case) {
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        q->kind = REFLECTION_QUERY_LIST_SERVICES;
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        q->kind = REFLECTION_QUERY_FILE_BY_FILENAME;
        arg = m->file_by_filename;
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        q->kind = REFLECTION_QUERY_FILE_CONTAINING_SYMBOL;
        arg = m->file_containing_symbol;
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        q->kind = REFLECTION_QUERY_FILE_CONTAINING_EXTENSION;
        if (m->file_containing_extension && m->file_containing_extension->containing_type)
            arg = m->file_containing_extension->containing_type;
        break;
    case GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        q->kind = REFLECTION_QUERY_EXTENSION_NUMBERS;
        arg = m->all_extension_numbers_of_type;
        break;
    default:
        q->kind = REFLECTION_QUERY_NONE;
        break;
    }
    q->arg = strdup(arg ? arg : "");
    grpc__reflection__v1alpha__server_reflection_request__free_unpacked(m, NULL);
    return q->arg ? STATUS_OK : convert_oom();
}

void reflection_query_free(struct reflection_query *q)
{
    if (!q) return;
    free(q->arg);
    q->arg = NULL;
}

enum status convert_reflection_response(const void *req_data, size_t req_len, const struct reflection_answer *a,
                                        uint8_t **out, size_t *len)
{
    Grpc__Reflection__V1alpha__ServerReflectionResponse m = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ListServiceResponse list = GRPC__REFLECTION__V1ALPHA__LIST_SERVICE_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__FileDescriptorResponse files = GRPC__REFLECTION__V1ALPHA__FILE_DESCRIPTOR_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ErrorResponse err = GRPC__REFLECTION__V1ALPHA__ERROR_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ExtensionNumberResponse ext = GRPC__REFLECTION__V1ALPHA__EXTENSION_NUMBER_RESPONSE__INIT;
    Grpc__Reflection__V1alpha__ServiceResponse *svc = NULL, **svc_ptrs = NULL;
    ProtobufCBinaryData *blobs = NULL;
    enum status st = STATUS_OK, parsed;
    /* Parsed once more to be echoed (merged like the first time, in convert_reflection_request). */
    Grpc__Reflection__V1alpha__ServerReflectionRequest *orig = (Grpc__Reflection__V1alpha__ServerReflectionRequest *)convert_unpack(
        &grpc__reflection__v1alpha__server_reflection_request__descriptor, req_data, req_len, NULL, &parsed);
    m.original_request = orig;
    m.valid_host = orig ? orig->host : "";
    if (a->error_code) {
        err.error_code = a->error_code;
        err.error_message = (char *)(a->error_message ? a->error_message : "");
        m.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
        m.error_response = &err;
    } else if (a->base_type_name) {
        ext.base_type_name = (char *)a->base_type_name;
        m.message_response_case =
            GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
        m.all_extension_numbers_response = &ext;
    } else if (a->services) {
        svc = calloc((size_t)a->n_services + 1, sizeof *svc);
        svc_ptrs = calloc((size_t)a->n_services + 1, sizeof *svc_ptrs);
        if (!svc || !svc_ptrs) st = convert_oom();
        for (int i = 0; st == STATUS_OK && i < a->n_services; i++) {
            grpc__reflection__v1alpha__service_response__init(&svc[i]);
            svc[i].name = (char *)a->services[i];
            svc_ptrs[i] = &svc[i];
        }
        list.n_service = (size_t)a->n_services;
        list.service = svc_ptrs;
        m.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
        m.list_services_response = &list;
    } else {
        blobs = calloc((size_t)a->n_files + 1, sizeof *blobs);
        if (!blobs) st = convert_oom();
        for (int i = 0; st == STATUS_OK && i < a->n_files; i++) {
            blobs[i].data = (uint8_t *)a->files[i];
            blobs[i].len = a->file_lens[i];
        }
        files.n_file_descriptor_proto = (size_t)a->n_files;
        files.file_descriptor_proto = blobs;
        m.message_response_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
        m.file_descriptor_response = &files;
    }
    if (st == STATUS_OK) st = convert_pack(&m.base, out, len);
    free(svc);
    free(svc_ptrs);
    free(blobs);
    if (orig) grpc__reflection__v1alpha__server_reflection_request__free_unpacked(orig, NULL);
    return st;
}
