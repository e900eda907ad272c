/* server/convert.c - protobuf-c messages <-> native structs. The only file that includes
 * generated protobuf-c headers (with convert_admin.c, the small RPCs' messages). It parses and checks what only the edge sees (UTF-8, roles,
 * message sizes, printable request ids); numeric ranges are the engine's (engine_validate).
 * Not here: anything about gRPC calls (server.c). Tests: tests/server/test_server.py. */
#include "convert.h"
#include "convert_impl.h"

#include <stdlib.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "shardlm/v1/text_generation.pb-c.h"
#include "request.h"
#include "tokenizer.h"
#include "pbwire.h"
#include <cjson/cJSON.h>
#include "wire.h"

int utf8_valid(const char *str, size_t len)
{
    return base_utf8_valid_prefix(str, len) == len;
}

enum status convert_oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

static enum status not_a(const char *type)
{
    return status_errorf(STATUS_INVALID_ARGUMENT, "the request is not a valid %s message", type);
}

/* Unpacks data[0..len) as a message of type d (named `type` in the error, d's name when NULL),
 * after wire_prepare: a string holding a NUL is refused by name (protobuf-c would cut it at the
 * NUL), and a singular message field sent twice is merged as the spec says (protobuf-c's own
 * merge fails or loses fields). NULL with *st set on error.
 * Free the message with protobuf_c_message_free_unpacked(m, NULL). */
ProtobufCMessage *convert_unpack(const ProtobufCMessageDescriptor *d, const void *data, size_t len,
                                 const char *type, enum status *st)
{
    uint8_t *merged;
    size_t merged_len;
    *st = wire_prepare(d, data, len, &merged, &merged_len);
    if (*st != STATUS_OK) return NULL;
    ProtobufCMessage *m = merged ? protobuf_c_message_unpack(d, NULL, merged_len, merged)
                                 : protobuf_c_message_unpack(d, NULL, len, data);
    free(merged);
    if (!m) *st = not_a(type ? type : d->name);
    return m;
}

/* Packs any message into a malloc'd buffer. */
enum status convert_pack(const ProtobufCMessage *m, uint8_t **out, size_t *len)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return convert_oom();
    *len = protobuf_c_message_pack(m, buf);
    *out = buf;
    return STATUS_OK;
}

/* ---- GenerateRequest / ChatRequest ---------------------------------------------------- */

/* SamplingParams.constraint into r->constraint (the source the engine compiles); a choice list
 * becomes the JSON array of its strings. */
static enum status convert_constraint(const Shardlm__V1__Constraint *c, struct gen_request *r)
{
    if (!c || c->kind_case == SHARDLM__V1__CONSTRAINT__KIND__NOT_SET) return STATUS_OK;
    enum constraint_kind kind = CONSTRAINT_NONE;
    const char *text = NULL;
    switch (c->kind_case) {
    case SHARDLM__V1__CONSTRAINT__KIND_JSON_SCHEMA: kind = CONSTRAINT_JSON_SCHEMA, text = c->json_schema; break;
    case SHARDLM__V1__CONSTRAINT__KIND_REGEX: kind = CONSTRAINT_REGEX, text = c->regex; break;
    case SHARDLM__V1__CONSTRAINT__KIND_GRAMMAR: kind = CONSTRAINT_GRAMMAR, text = c->grammar; break;
    case SHARDLM__V1__CONSTRAINT__KIND_JSON_OBJECT:
        if (!c->json_object)
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.constraint.json_object must be true when set");
        kind = CONSTRAINT_JSON_OBJECT, text = "";
        break;
    case SHARDLM__V1__CONSTRAINT__KIND_CHOICE: {
        kind = CONSTRAINT_CHOICE;
        const Shardlm__V1__ChoiceList *cl = c->choice;
        if (!cl || cl->n_choices == 0)
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.constraint.choice: at least one string");
        cJSON *a = cJSON_CreateArray();
        for (size_t i = 0; a && i < cl->n_choices; i++) {
            if (!utf8_valid(cl->choices[i], strlen(cl->choices[i]))) {
                cJSON_Delete(a);
                return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.constraint.choice[%zu] is not valid UTF-8", i);
            }
            cJSON *e = cJSON_CreateString(cl->choices[i]);
            if (!e || !cJSON_AddItemToArray(a, e)) {
                cJSON_Delete(e);
                cJSON_Delete(a);
                a = NULL;
            }
        }
        r->constraint = a ? cJSON_PrintUnformatted(a) : NULL;
        cJSON_Delete(a);
        if (!r->constraint) return convert_oom();
        break;
    }
    default: return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.constraint: unknown kind %d", (int)c->kind_case);
    }
    if (text && !utf8_valid(text, strlen(text)))
        return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.constraint is not valid UTF-8");
    if (text && !(r->constraint = strdup(text))) return convert_oom();
    r->constraint_len = strlen(r->constraint);
    r->params.constraint_kind = kind;
    r->params.constraint = r->constraint;
    r->params.constraint_len = r->constraint_len;
    return STATUS_OK;
}

/* Copies the message into *r without checking ranges: every numeric limit is the engine's
 * (request.c's table, through engine_validate), so that the bounds and their messages exist
 * once. Only what the engine cannot see is checked here: UTF-8 of the stop strings. */
static enum status convert_sampling(const Shardlm__V1__SamplingParams *s, struct gen_request *r)
{
    struct request_params *p = &r->params;
    /* Unset message: every default. */
    static const Shardlm__V1__SamplingParams none = SHARDLM__V1__SAMPLING_PARAMS__INIT;
    if (!s) s = &none;

    p->sampling = sampling_params_default();
    p->max_tokens = CONVERT_DEFAULT_MAX_TOKENS;
    if (s->_max_tokens_case == SHARDLM__V1__SAMPLING_PARAMS___MAX_TOKENS_MAX_TOKENS) p->max_tokens = s->max_tokens;
    p->sampling.temperature = 1.0f;
    if (s->_temperature_case == SHARDLM__V1__SAMPLING_PARAMS___TEMPERATURE_TEMPERATURE)
        p->sampling.temperature = s->temperature;
    p->sampling.top_k = s->top_k;
    p->sampling.top_p = 1.0f;
    if (s->_top_p_case == SHARDLM__V1__SAMPLING_PARAMS___TOP_P_TOP_P) p->sampling.top_p = s->top_p;
    p->sampling.min_p = s->min_p;
    p->sampling.repetition_penalty = 1.0f;
    if (s->_repetition_penalty_case == SHARDLM__V1__SAMPLING_PARAMS___REPETITION_PENALTY_REPETITION_PENALTY)
        p->sampling.repetition_penalty = s->repetition_penalty;
    p->sampling.presence_penalty = s->presence_penalty;
    p->sampling.frequency_penalty = s->frequency_penalty;
    if (s->_seed_case == SHARDLM__V1__SAMPLING_PARAMS___SEED_SEED) {
        p->has_seed = 1;
        p->sampling.seed = s->seed;
    }

    r->stop = calloc(s->n_stop + 1, sizeof *r->stop);
    if (!r->stop) return convert_oom();
    for (size_t i = 0; i < s->n_stop; i++) {
        if (!utf8_valid(s->stop[i], strlen(s->stop[i])))
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.stop[%zu] is not valid UTF-8", i);
        if (!(r->stop[i] = strdup(s->stop[i]))) return convert_oom();
        r->n_stop++;
    }
    r->stop_token_ids = malloc((s->n_stop_token_ids + 1) * sizeof *r->stop_token_ids);
    if (!r->stop_token_ids) return convert_oom();
    for (size_t i = 0; i < s->n_stop_token_ids; i++) r->stop_token_ids[r->n_stop_token_ids++] = s->stop_token_ids[i];
    p->ignore_eos = s->ignore_eos ? 1 : 0;
    p->show_special = s->show_special_tokens ? 1 : 0;
    p->min_tokens = s->min_tokens;
    p->logprobs = -1;
    if (s->_logprobs_case == SHARDLM__V1__SAMPLING_PARAMS___LOGPROBS_LOGPROBS) p->logprobs = s->logprobs;
    p->prompt_logprobs = -1;
    if (s->_prompt_logprobs_case == SHARDLM__V1__SAMPLING_PARAMS___PROMPT_LOGPROBS_PROMPT_LOGPROBS)
        p->prompt_logprobs = s->prompt_logprobs;
    p->n = 1;
    if (s->_n_case == SHARDLM__V1__SAMPLING_PARAMS___N_N) p->n = s->n;
    enum status sst = speculative_mode_parse(s->speculative, "sampling.speculative", &p->speculative);
    if (sst != STATUS_OK) return sst;
    p->speculative_n_max = s->speculative_n_max;
    p->speculative_p_min = -1.0f;
    if (s->_speculative_p_min_case == SHARDLM__V1__SAMPLING_PARAMS___SPECULATIVE_P_MIN_SPECULATIVE_P_MIN) {
        if (!(s->speculative_p_min >= 0.0f)) /* (-1 is the engine's "not given": never a client's value) */
            return status_errorf(STATUS_INVALID_ARGUMENT, "sampling.speculative_p_min must be in [0, 1], got %g",
                                 (double)s->speculative_p_min);
        p->speculative_p_min = s->speculative_p_min;
    }
    if (s->n_logit_bias) {
        r->bias_ids = malloc(s->n_logit_bias * sizeof *r->bias_ids);
        r->bias_values = malloc(s->n_logit_bias * sizeof *r->bias_values);
        if (!r->bias_ids || !r->bias_values) return convert_oom();
        for (size_t i = 0; i < s->n_logit_bias; i++) {
            r->bias_ids[r->n_bias] = s->logit_bias[i]->key;
            r->bias_values[r->n_bias++] = s->logit_bias[i]->value;
        }
    }
    enum status st = convert_constraint(s->constraint, r);
    if (st != STATUS_OK) return st;
    p->stop = (const char *const *)r->stop;
    p->n_stop = r->n_stop;
    p->stop_token_ids = r->stop_token_ids;
    p->n_stop_token_ids = r->n_stop_token_ids;
    p->logit_bias_ids = r->bias_ids;
    p->logit_bias_values = r->bias_values;
    p->n_logit_bias = r->n_bias;
    return STATUS_OK;
}

static enum status convert_request_id(const char *id, struct gen_request *r)
{
    size_t n = strlen(id); /* its length is the engine's limit (request_id_check at submission) */
    for (size_t i = 0; i < n; i++)
        if (id[i] < 0x20 || id[i] > 0x7e)
            return status_errorf(STATUS_INVALID_ARGUMENT, "request_id must be printable ASCII (byte %zu is 0x%02x)", i,
                                 (unsigned char)id[i]);
    return (r->request_id = strdup(id)) ? STATUS_OK : convert_oom();
}

/* The adapter a request names ("" = none); what the name means is the server's question
 * (gen_resolve_adapter: the default adapter, the base, an adapter), whether it is served the
 * engine's. */
static enum status convert_adapter(const char *name, struct gen_request *r)
{
    if (!name || !*name) return STATUS_OK;
    if (strlen(name) > 255)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "adapter: an adapter's name of at most 64 bytes, or the served model's id");
    return (r->adapter = strdup(name)) ? STATUS_OK : convert_oom();
}

/* GenerateRequest / ChatRequest cache_salt: "" none, else at most REQUEST_MAX_CACHE_SALT_BYTES. */
static enum status convert_cache_salt(const char *salt, struct gen_request *r)
{
    if (!salt || !*salt) return STATUS_OK;
    const size_t n = strlen(salt);
    if (n > REQUEST_MAX_CACHE_SALT_BYTES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "cache_salt must be at most %d bytes, got %zu",
                             REQUEST_MAX_CACHE_SALT_BYTES, n);
    if (!(r->cache_salt = strdup(salt))) return convert_oom();
    r->params.cache_salt = r->cache_salt;
    return STATUS_OK;
}

static enum status convert_generate(const Shardlm__V1__GenerateRequest *m, struct gen_request *r)
{
    enum status st = convert_request_id(m->request_id, r);
    if (st != STATUS_OK) return st;
    size_t n = strlen(m->prompt);
    if (n && m->n_prompt_token_ids)
        return status_errorf(STATUS_INVALID_ARGUMENT, "prompt and prompt_token_ids: give one of them, not both");
    if (m->n_prompt_token_ids) {
        if (m->n_prompt_token_ids > (size_t)CONVERT_MAX_PROMPT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "prompt_token_ids: at most %d ids, got %zu", CONVERT_MAX_PROMPT_BYTES,
                                 m->n_prompt_token_ids);
        r->prompt_ids = malloc(m->n_prompt_token_ids * sizeof *r->prompt_ids);
        if (!r->prompt_ids) return convert_oom();
        memcpy(r->prompt_ids, m->prompt_token_ids, m->n_prompt_token_ids * sizeof *r->prompt_ids);
        r->n_prompt_ids = (int)m->n_prompt_token_ids;
    } else {
        if (n > CONVERT_MAX_PROMPT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "prompt must be at most %d bytes, got %zu", CONVERT_MAX_PROMPT_BYTES, n);
        if (!utf8_valid(m->prompt, n)) return status_errorf(STATUS_INVALID_ARGUMENT, "prompt is not valid UTF-8");
        if (!(r->prompt = strdup(m->prompt))) return convert_oom();
        r->prompt_len = n;
    }
    r->add_bos = m->_add_bos_case == SHARDLM__V1__GENERATE_REQUEST___ADD_BOS_ADD_BOS ? (m->add_bos ? 1 : 0) : 1;
    if ((st = convert_adapter(m->adapter, r)) != STATUS_OK) return st;
    if ((st = convert_cache_salt(m->cache_salt, r)) != STATUS_OK) return st;
    r->params.priority = m->priority;
    return convert_sampling(m->sampling, r);
}

/* s, field `name` of messages[i], is valid UTF-8. */
static enum status check_utf8(const char *s, const char *name, size_t i)
{
    if (utf8_valid(s, strlen(s))) return STATUS_OK;
    return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].%s is not valid UTF-8", i, name);
}

/* 1 when the request uses a field of tool calling or template arguments (then the chat goes
 * through server/chat_tools.c as an OpenAI chat request's JSON). */
static int uses_tools(const Shardlm__V1__ChatRequest *m)
{
    if (m->n_tools || m->tool_choice[0] || m->tool_choice_function[0] || m->chat_template_kwargs[0] ||
        m->_parallel_tool_calls_case == SHARDLM__V1__CHAT_REQUEST___PARALLEL_TOOL_CALLS_PARALLEL_TOOL_CALLS)
        return 1;
    for (size_t i = 0; i < m->n_messages; i++) {
        const Shardlm__V1__ChatMessage *cm = m->messages[i];
        if (cm->n_tool_calls || cm->tool_call_id[0] || cm->name[0] || cm->reasoning_content[0] ||
            !strcmp(cm->role, "tool"))
            return 1;
    }
    return 0;
}

/* Message i as OpenAI's chat message: role, content, and the tool fields that are set. */
static enum status chat_message_json(const Shardlm__V1__ChatMessage *cm, size_t i, cJSON *list)
{
    cJSON *e = cJSON_CreateObject();
    if (!e) return convert_oom();
    cJSON_AddItemToArray(list, e);
    cJSON_AddStringToObject(e, "role", cm->role);
    cJSON_AddStringToObject(e, "content", cm->content);
    if (!strcmp(cm->role, "tool") && !cm->tool_call_id[0])
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].tool_call_id is required in tool messages", i);
    if (strcmp(cm->role, "tool") && cm->tool_call_id[0])
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].tool_call_id is for tool messages only", i);
    if (cm->n_tool_calls && strcmp(cm->role, "assistant"))
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].tool_calls is for assistant messages only", i);
    if (cm->tool_call_id[0]) cJSON_AddStringToObject(e, "tool_call_id", cm->tool_call_id);
    if (cm->name[0]) cJSON_AddStringToObject(e, "name", cm->name);
    if (cm->reasoning_content[0]) cJSON_AddStringToObject(e, "reasoning_content", cm->reasoning_content);
    enum status st = check_utf8(cm->tool_call_id, "tool_call_id", i);
    if (st == STATUS_OK) st = check_utf8(cm->name, "name", i);
    if (st == STATUS_OK) st = check_utf8(cm->reasoning_content, "reasoning_content", i);
    if (st != STATUS_OK || !cm->n_tool_calls) return st;
    cJSON *calls = cJSON_AddArrayToObject(e, "tool_calls");
    for (size_t k = 0; k < cm->n_tool_calls; k++) {
        const Shardlm__V1__ToolCall *tc = cm->tool_calls[k];
        if (!utf8_valid(tc->id, strlen(tc->id)) || !utf8_valid(tc->name, strlen(tc->name)) ||
            !utf8_valid(tc->arguments, strlen(tc->arguments)))
            return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].tool_calls[%zu] is not valid UTF-8", i, k);
        cJSON *c = cJSON_CreateObject();
        cJSON_AddItemToArray(calls, c);
        cJSON_AddStringToObject(c, "id", tc->id);
        cJSON_AddStringToObject(c, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(c, "function");
        cJSON_AddStringToObject(f, "name", tc->name);
        cJSON_AddStringToObject(f, "arguments", tc->arguments);
    }
    return STATUS_OK;
}

/* The request's tools and tool choice as OpenAI's (their checks are the HTTP chat's own:
 * http_tools_parse, through chat_tools.c). */
static enum status chat_tools_json(const Shardlm__V1__ChatRequest *m, cJSON *o)
{
    if (m->tool_choice[0] && m->tool_choice_function[0])
        return status_errorf(STATUS_INVALID_ARGUMENT, "tool_choice and tool_choice_function: set at most one");
    cJSON *tools = cJSON_AddArrayToObject(o, "tools");
    for (size_t i = 0; i < m->n_tools; i++) {
        const Shardlm__V1__Tool *t = m->tools[i];
        if (!utf8_valid(t->name, strlen(t->name)) || !utf8_valid(t->description, strlen(t->description)))
            return status_errorf(STATUS_INVALID_ARGUMENT, "tools[%zu] is not valid UTF-8", i);
        cJSON *e = cJSON_CreateObject(), *params = NULL;
        cJSON_AddItemToArray(tools, e);
        cJSON_AddStringToObject(e, "type", "function");
        cJSON *f = cJSON_AddObjectToObject(e, "function");
        cJSON_AddStringToObject(f, "name", t->name);
        if (t->description[0]) cJSON_AddStringToObject(f, "description", t->description);
        if (t->parameters[0] && !cJSON_IsObject(params = cJSON_Parse(t->parameters))) {
            cJSON_Delete(params);
            return status_errorf(STATUS_INVALID_ARGUMENT, "tools[%zu].parameters must be a JSON Schema object (JSON text)", i);
        }
        if (params) cJSON_AddItemToObject(f, "parameters", params);
    }
    if (m->tool_choice[0]) cJSON_AddStringToObject(o, "tool_choice", m->tool_choice);
    if (m->tool_choice_function[0]) {
        cJSON *c = cJSON_AddObjectToObject(o, "tool_choice");
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(c, "function"), "name", m->tool_choice_function);
    }
    if (m->_parallel_tool_calls_case == SHARDLM__V1__CHAT_REQUEST___PARALLEL_TOOL_CALLS_PARALLEL_TOOL_CALLS)
        cJSON_AddBoolToObject(o, "parallel_tool_calls", m->parallel_tool_calls);
    if (m->chat_template_kwargs[0]) {
        cJSON *kw = cJSON_Parse(m->chat_template_kwargs);
        if (!cJSON_IsObject(kw)) {
            cJSON_Delete(kw);
            return status_errorf(STATUS_INVALID_ARGUMENT, "chat_template_kwargs must be a JSON object (JSON text)");
        }
        cJSON_AddItemToObject(o, "chat_template_kwargs", kw);
    }
    return STATUS_OK;
}

/* r->chat_request: the chat part of m as an OpenAI chat request's JSON object. */
static enum status convert_chat_tools(const Shardlm__V1__ChatRequest *m, struct gen_request *r)
{
    cJSON *o = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(o, "messages");
    enum status st = msgs ? STATUS_OK : convert_oom();
    for (size_t i = 0; i < m->n_messages && st == STATUS_OK; i++) st = chat_message_json(m->messages[i], i, msgs);
    if (st == STATUS_OK) st = chat_tools_json(m, o);
    if (st == STATUS_OK && !(r->chat_request = cJSON_PrintUnformatted(o))) st = convert_oom();
    cJSON_Delete(o);
    return st;
}

static enum status convert_chat(const Shardlm__V1__ChatRequest *m, struct gen_request *r)
{
    enum status st = convert_request_id(m->request_id, r);
    if (st != STATUS_OK) return st;
    if (m->n_messages == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "messages must not be empty");
    if (m->n_messages > 4096)
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages: at most 4096 messages, got %zu", m->n_messages);
    r->messages = calloc(m->n_messages, sizeof *r->messages);
    if (!r->messages) return convert_oom();
    size_t total = 0;
    for (size_t i = 0; i < m->n_messages; i++) {
        const Shardlm__V1__ChatMessage *cm = m->messages[i];
        /* A tool's result is a user turn of the tool format (chat_tools.c rewrites it). */
        int role = strcmp(cm->role, "tool") ? chat_role_parse(cm->role) : CHAT_ROLE_USER;
        if (role < 0)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "messages[%zu].role must be one of system, user, assistant, tool; got '%.64s'", i,
                                 cm->role);
        size_t n = strlen(cm->content);
        total += n;
        if (total > CONVERT_MAX_PROMPT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "messages: the contents must total at most %d bytes",
                                 CONVERT_MAX_PROMPT_BYTES);
        if (!utf8_valid(cm->content, n))
            return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%zu].content is not valid UTF-8", i);
        r->messages[i].role = (enum chat_role)role;
        if (!(r->messages[i].content = strdup(cm->content))) return convert_oom();
        r->n_messages++;
    }
    r->add_bos = 1;
    if (uses_tools(m) && (st = convert_chat_tools(m, r)) != STATUS_OK) return st;
    if ((st = convert_adapter(m->adapter, r)) != STATUS_OK) return st;
    if ((st = convert_cache_salt(m->cache_salt, r)) != STATUS_OK) return st;
    r->params.priority = m->priority;
    return convert_sampling(m->sampling, r);
}

enum status convert_gen_request(const void *data, size_t len, int is_chat, struct gen_request *r)
{
    memset(r, 0, sizeof *r);
    r->params = request_params_default();
    enum status st;
    if (is_chat) {
        Shardlm__V1__ChatRequest *m =
            (Shardlm__V1__ChatRequest *)convert_unpack(&shardlm__v1__chat_request__descriptor, data, len, NULL, &st);
        if (!m) return st;
        st = convert_chat(m, r);
        shardlm__v1__chat_request__free_unpacked(m, NULL);
    } else {
        Shardlm__V1__GenerateRequest *m =
            (Shardlm__V1__GenerateRequest *)convert_unpack(&shardlm__v1__generate_request__descriptor, data, len, NULL, &st);
        if (!m) return st;
        st = convert_generate(m, r);
        shardlm__v1__generate_request__free_unpacked(m, NULL);
    }
    return st;
}

void gen_request_free(struct gen_request *r)
{
    if (!r) return;
    free(r->request_id);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_messages; i++) free(r->messages[i].content);
    free(r->messages);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->stop);
    free(r->stop_token_ids);
    free(r->constraint);
    free(r->bias_ids);
    free(r->bias_values);
    free(r->adapter);
    free(r->client);
    free(r->cache_salt);
    free(r->chat_context);
    free(r->prefill);
    free(r->chat_request);
    memset(r, 0, sizeof *r);
}

/* ---- GenerateResponse ------------------------------------------------------------------ */

/* Every allocation of one response, freed together after packing. */
struct arena {
    void **p;
    size_t n, cap;
    int    failed;
};

static void *arena_alloc(struct arena *a, size_t size)
{
    if (a->failed) return NULL;
    if (base_grow((void **)&a->p, &a->cap, a->n + 1, sizeof *a->p) != 0) {
        a->failed = 1;
        return NULL;
    }
    void *m = calloc(1, size ? size : 1);
    if (!m) {
        a->failed = 1;
        return NULL;
    }
    return a->p[a->n++] = m;
}

static void arena_free(struct arena *a)
{
    for (size_t i = 0; i < a->n; i++) free(a->p[i]);
    free(a->p);
}

static char *piece(const struct tokenizer *tok, int32_t id)
{
    const char *p = tok ? tokenizer_id_to_piece(tok, id) : NULL;
    return (char *)(p ? p : ""); /* only read by pack */
}

/* TokenLogprob entries for ids[0..n) with n_top alternatives each. */
static Shardlm__V1__TokenLogprob **build_logprobs(struct arena *a, const struct tokenizer *tok, const int32_t *ids,
                                                  const float *lp, const struct top_logprob *top, int n_top, int n)
{
    Shardlm__V1__TokenLogprob **ptrs = arena_alloc(a, (size_t)n * sizeof *ptrs);
    Shardlm__V1__TokenLogprob *e = arena_alloc(a, (size_t)n * sizeof *e);
    int nt = top ? n_top : 0;
    Shardlm__V1__TopLogprob **tptrs = nt ? arena_alloc(a, (size_t)n * nt * sizeof *tptrs) : NULL;
    Shardlm__V1__TopLogprob *t = nt ? arena_alloc(a, (size_t)n * nt * sizeof *t) : NULL;
    if (!ptrs || !e || (nt && (!tptrs || !t))) return NULL;
    for (int i = 0; i < n; i++) {
        shardlm__v1__token_logprob__init(&e[i]);
        e[i].token_id = ids[i];
        e[i].logprob = lp[i];
        e[i].piece = piece(tok, ids[i]);
        if (nt) {
            e[i].n_top = (size_t)nt;
            e[i].top = tptrs + (size_t)i * nt;
            for (int k = 0; k < nt; k++) {
                Shardlm__V1__TopLogprob *x = &t[(size_t)i * nt + k];
                shardlm__v1__top_logprob__init(x);
                x->token_id = top[(size_t)i * nt + k].id;
                x->logprob = top[(size_t)i * nt + k].logprob;
                x->piece = piece(tok, x->token_id);
                e[i].top[k] = x;
            }
        }
        ptrs[i] = &e[i];
    }
    return ptrs;
}

/* ---- text fields, written by hand ---------------------------------------------------------
 * protobuf-c packs a string field with strlen, so a text holding U+0000 (token <0x00> of a
 * byte-fallback model decodes to it: valid UTF-8, valid proto3) would end at the NUL and
 * disagree with its token ids. Response text therefore stays empty for protobuf-c and is
 * written here after the rest of its message: the wire format lets fields come in any order
 * (a parser takes the message the same), and an empty proto3 string is not written at all. */

/* The tag of a length-delimited field. */
static uint64_t len_tag(uint32_t number) { return pb_tag(number, PB_WIRE_LEN); }

/* Bytes of a length-delimited field of n payload bytes (0 for an empty string: not written). */
static size_t len_field_size(uint32_t number, size_t n) { return pb_varint_size(len_tag(number)) + pb_varint_size(n) + n; }
static size_t text_field_size(uint32_t number, size_t n) { return n ? len_field_size(number, n) : 0; }

static uint8_t *put_len_field(uint8_t *p, uint32_t number, const void *data, size_t n)
{
    p = pb_put_varint(p, len_tag(number));
    p = pb_put_varint(p, n);
    if (n) memcpy(p, data, n);
    return p + n;
}

static uint32_t field_number(const ProtobufCMessageDescriptor *d, const char *name)
{
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, name);
    CHECK(f, "%s has no field %s", d->name, name);
    return f->id;
}

/* m packed (its text field left empty), then its field `number` = text[0..n). */
static size_t message_text_size(const ProtobufCMessage *m, uint32_t number, size_t n)
{
    return protobuf_c_message_get_packed_size(m) + text_field_size(number, n);
}

static uint8_t *put_message_text(uint8_t *p, const ProtobufCMessage *m, uint32_t number, const char *text, size_t n)
{
    p += protobuf_c_message_pack(m, p);
    return n ? put_len_field(p, number, text, n) : p;
}

static Shardlm__V1__FinishReason finish_to_proto(enum finish_reason r)
{
    switch (r) {
    case FINISH_REASON_NONE: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_UNSPECIFIED;
    case FINISH_REASON_LENGTH: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_LENGTH;
    case FINISH_REASON_STOP: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_STOP;
    case FINISH_REASON_EOS: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_EOS;
    case FINISH_REASON_CANCELLED: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_CANCELLED;
    case FINISH_REASON_DEADLINE: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_DEADLINE;
    case FINISH_REASON_ERROR: return SHARDLM__V1__FINISH_REASON__FINISH_REASON_ERROR;
    }
    return SHARDLM__V1__FINISH_REASON__FINISH_REASON_ERROR;
}

/* s's finish reason, tool_calls when its reply ended with calls. */
static Shardlm__V1__FinishReason sample_finish(const struct gen_sample_out *s)
{
    if (s->ended_with_calls && (s->finish == FINISH_REASON_STOP || s->finish == FINISH_REASON_EOS))
        return SHARDLM__V1__FINISH_REASON__FINISH_REASON_TOOL_CALLS;
    return finish_to_proto(s->finish);
}

/* s's tool calls as messages (in a), or NULL with *n 0 when it has none. */
static Shardlm__V1__ToolCall **build_tool_calls(struct arena *a, const struct gen_sample_out *s, size_t *n)
{
    *n = 0;
    if (s->n_calls <= 0) return NULL;
    Shardlm__V1__ToolCall **list = arena_alloc(a, (size_t)s->n_calls * sizeof *list);
    Shardlm__V1__ToolCall *calls = arena_alloc(a, (size_t)s->n_calls * sizeof *calls);
    if (!list || !calls) return NULL;
    for (int k = 0; k < s->n_calls; k++) {
        shardlm__v1__tool_call__init(&calls[k]);
        calls[k].index = s->calls[k].index;
        calls[k].id = (char *)(s->calls[k].id ? s->calls[k].id : "");
        calls[k].name = (char *)(s->calls[k].name ? s->calls[k].name : "");
        calls[k].arguments = (char *)(s->calls[k].args ? s->calls[k].args : "");
        list[k] = &calls[k];
    }
    *n = (size_t)s->n_calls;
    return list;
}

/* The completions of a unary response (every sample), their text left to pack_gen_response. */
static Shardlm__V1__Completion *build_completions(struct arena *a, const struct gen_response_out *o)
{
    Shardlm__V1__Completion *c = arena_alloc(a, (size_t)o->n_samples * sizeof *c);
    Shardlm__V1__Usage *u = arena_alloc(a, (size_t)o->n_samples * sizeof *u);
    if (!c || !u) return NULL;
    for (int i = 0; i < o->n_samples; i++) {
        const struct gen_sample_out *s = &o->samples[i];
        shardlm__v1__completion__init(&c[i]);
        shardlm__v1__usage__init(&u[i]);
        c[i].index = s->index;
        c[i].n_token_ids = (size_t)s->n_ids;
        c[i].token_ids = (int32_t *)s->ids;
        if (s->logprobs && s->n_ids) {
            c[i].n_logprobs = (size_t)s->n_ids;
            c[i].logprobs = build_logprobs(a, o->tok, s->ids, s->logprobs, s->top, s->n_top, s->n_ids);
        }
        c[i].finish_reason = sample_finish(s);
        c[i].content = (char *)(s->content ? s->content : "");
        c[i].reasoning_content = (char *)(s->reasoning ? s->reasoning : "");
        c[i].tool_calls = build_tool_calls(a, s, &c[i].n_tool_calls);
        u[i].prompt_tokens = s->prompt_tokens;
        u[i].completion_tokens = s->completion_tokens;
        u[i].cached_prompt_tokens = s->cached_prompt_tokens;
        c[i].usage = &u[i];
    }
    return c;
}

/* m (text and completions left empty) with sample 0's text, then, for a unary response, each
 * completion c[i] with its text as a `completions` field (see "text fields"). */
static enum status pack_gen_response(const Shardlm__V1__GenerateResponse *m, const Shardlm__V1__Completion *c,
                                     const struct gen_response_out *o, uint8_t **out, size_t *len)
{
    uint32_t text_no = field_number(&shardlm__v1__generate_response__descriptor, "text");
    uint32_t completions_no = field_number(&shardlm__v1__generate_response__descriptor, "completions");
    uint32_t c_text_no = field_number(&shardlm__v1__completion__descriptor, "text");
    int n_c = c ? o->n_samples : 0;
    const struct gen_sample_out *s = o->samples;
    size_t text_len = o->n_samples > 0 ? s[0].text_len : 0;
    size_t total = message_text_size(&m->base, text_no, text_len);
    for (int i = 0; i < n_c; i++)
        total += len_field_size(completions_no, message_text_size(&c[i].base, c_text_no, s[i].text_len));
    uint8_t *buf = malloc(total ? total : 1), *p = buf;
    if (!buf) return convert_oom();
    p = put_message_text(p, &m->base, text_no, text_len ? s[0].text : "", text_len);
    for (int i = 0; i < n_c; i++) {
        p = pb_put_varint(p, len_tag(completions_no));
        p = pb_put_varint(p, message_text_size(&c[i].base, c_text_no, s[i].text_len));
        p = put_message_text(p, &c[i].base, c_text_no, s[i].text, s[i].text_len);
    }
    CHECK((size_t)(p - buf) == total, "GenerateResponse: wrote %zu bytes of %zu", (size_t)(p - buf), total);
    *out = buf;
    *len = total;
    return STATUS_OK;
}

enum status convert_gen_response(const struct gen_response_out *o, uint8_t **out, size_t *len)
{
    struct arena a = {0};
    Shardlm__V1__GenerateResponse m = SHARDLM__V1__GENERATE_RESPONSE__INIT;
    Shardlm__V1__Usage usage = SHARDLM__V1__USAGE__INIT;
    m.request_id = (char *)o->request_id;
    m.seed = o->seed;
    if (o->prompt_ids && o->n_prompt > 0) {
        m.n_prompt_logprobs = (size_t)o->n_prompt;
        m.prompt_logprobs = build_logprobs(&a, o->tok, o->prompt_ids, o->prompt_logprobs, o->prompt_top, o->n_prompt_top,
                                           o->n_prompt);
    }
    if (o->n_samples > 0) {
        const struct gen_sample_out *s0 = &o->samples[0];
        m.index = s0->index;
        m.n_token_ids = (size_t)s0->n_ids;
        m.token_ids = (int32_t *)s0->ids;
        if (s0->logprobs && s0->n_ids) {
            m.n_logprobs = (size_t)s0->n_ids;
            m.logprobs = build_logprobs(&a, o->tok, s0->ids, s0->logprobs, s0->top, s0->n_top, s0->n_ids);
        }
        m.finish_reason = sample_finish(s0);
        m.content = (char *)(s0->content ? s0->content : "");
        m.reasoning_content = (char *)(s0->reasoning ? s0->reasoning : "");
        m.tool_calls = build_tool_calls(&a, s0, &m.n_tool_calls);
        if (s0->has_usage || o->unary) {
            usage.prompt_tokens = s0->prompt_tokens;
            usage.cached_prompt_tokens = s0->cached_prompt_tokens;
            for (int i = 0; i < (o->unary ? o->n_samples : 1); i++) usage.completion_tokens += o->samples[i].completion_tokens;
            m.usage = &usage;
        }
    }
    Shardlm__V1__Completion *c = o->unary ? build_completions(&a, o) : NULL;
    enum status st = a.failed ? convert_oom() : pack_gen_response(&m, c, o, out, len);
    arena_free(&a);
    return st;
}

/* ---- Tokenize, Detokenize, Cancel, model info, stats --------------------------------- */

enum status convert_tokenize_request(const void *data, size_t len, char **text, size_t *text_len, int *add_bos)
{
    *text = NULL;
    enum status st;
    Shardlm__V1__TokenizeRequest *m =
        (Shardlm__V1__TokenizeRequest *)convert_unpack(&shardlm__v1__tokenize_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    size_t n = strlen(m->text);
    if (n > CONVERT_MAX_PROMPT_BYTES)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "text must be at most %d bytes, got %zu", CONVERT_MAX_PROMPT_BYTES, n);
    else if (!utf8_valid(m->text, n))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "text is not valid UTF-8");
    else if (!(*text = strdup(m->text)))
        st = convert_oom();
    *text_len = n;
    *add_bos = m->_add_bos_case == SHARDLM__V1__TOKENIZE_REQUEST___ADD_BOS_ADD_BOS ? (m->add_bos ? 1 : 0) : 1;
    shardlm__v1__tokenize_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_tokenize_response(const int32_t *ids, int n, const struct tokenizer *tok, uint8_t **out, size_t *len)
{
    Shardlm__V1__TokenizeResponse m = SHARDLM__V1__TOKENIZE_RESPONSE__INIT;
    char **pieces = malloc((size_t)(n ? n : 1) * sizeof *pieces);
    if (!pieces) return convert_oom();
    for (int i = 0; i < n; i++) pieces[i] = piece(tok, ids[i]);
    m.n_token_ids = (size_t)n;
    m.token_ids = (int32_t *)ids;
    m.n_pieces = (size_t)n;
    m.pieces = pieces;
    enum status st = convert_pack(&m.base, out, len);
    free(pieces);
    return st;
}

enum status convert_detokenize_request(const void *data, size_t len, int vocab_size, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    enum status st;
    Shardlm__V1__DetokenizeRequest *m =
        (Shardlm__V1__DetokenizeRequest *)convert_unpack(&shardlm__v1__detokenize_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    for (size_t i = 0; i < m->n_token_ids && st == STATUS_OK; i++)
        if (m->token_ids[i] < 0 || m->token_ids[i] >= vocab_size)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "token_ids[%zu] must be in [0, %d), got %d", i, vocab_size,
                               m->token_ids[i]);
    if (st == STATUS_OK) {
        *ids = malloc((m->n_token_ids + 1) * sizeof **ids);
        if (!*ids) st = convert_oom();
        else {
            if (m->n_token_ids) memcpy(*ids, m->token_ids, m->n_token_ids * sizeof **ids);
            *n = (int)m->n_token_ids;
        }
    }
    shardlm__v1__detokenize_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_detokenize_response(const char *text, size_t text_len, uint8_t **out, size_t *len)
{
    /* The text is written by hand (see "text fields"): it may hold U+0000. */
    Shardlm__V1__DetokenizeResponse m = SHARDLM__V1__DETOKENIZE_RESPONSE__INIT;
    uint32_t text_no = field_number(&shardlm__v1__detokenize_response__descriptor, "text");
    size_t n = message_text_size(&m.base, text_no, text_len);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf) return convert_oom();
    put_message_text(buf, &m.base, text_no, text, text_len);
    *out = buf;
    *len = n;
    return STATUS_OK;
}
