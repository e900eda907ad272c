/* server/http_openai.c - the OpenAI wire format: /v1/completions and /v1/chat/completions
 * request JSON into struct gen_request (the same native request that gRPC's convert.c makes;
 * only JSON types are checked here, every numeric range is engine_validate's), and the
 * response, SSE chunk, usage and error JSON (cJSON).
 * Not here: HTTP itself, waiting, status codes (http.c).
 * Tests: tests/server/test_http.py. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "tokenizer.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

static enum status type_error(const char *field, const char *type)
{
    return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' must be %s", field, type);
}

/* The field, or NULL when absent or JSON null (both mean "not given"). */
static const cJSON *field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

static enum status get_double(const cJSON *o, const char *name, double *out)
{
    const cJSON *v = field(o, name);
    if (!v) return STATUS_OK;
    if (!cJSON_IsNumber(v)) return type_error(name, "a number");
    *out = v->valuedouble;
    return STATUS_OK;
}

static enum status get_float(const cJSON *o, const char *name, float *out)
{
    double d = *out;
    enum status st = get_double(o, name, &d);
    *out = (float)d;
    return st;
}

/* An integer in the int range (a JSON number with no fraction). */
static int as_int(const cJSON *v, int *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d != floor(d) || d < INT_MIN || d > INT_MAX) return -1;
    *out = (int)d;
    return 0;
}

static enum status get_int(const cJSON *o, const char *name, int *out)
{
    const cJSON *v = field(o, name);
    if (v && as_int(v, out)) return type_error(name, "an integer");
    return STATUS_OK;
}

static enum status get_bool(const cJSON *o, const char *name, int *out)
{
    const cJSON *v = field(o, name);
    if (!v) return STATUS_OK;
    if (!cJSON_IsBool(v)) return type_error(name, "a boolean");
    *out = cJSON_IsTrue(v) ? 1 : 0;
    return STATUS_OK;
}

/* A string that must be valid UTF-8 and at most the edge's prompt size. */
static enum status check_text(const char *name, const char *s)
{
    size_t n = strlen(s);
    if (n > CONVERT_MAX_PROMPT_BYTES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' must be at most %d bytes", name, CONVERT_MAX_PROMPT_BYTES);
    if (!utf8_valid(s, n)) return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' is not valid UTF-8", name);
    return STATUS_OK;
}

/* stop: a string or a list of strings; stop_token_ids: a list of integers. Room for one more
 * of each is left for the chat template (gen_prompt). The counts are checked before anything
 * is copied and the lists are walked once (cJSON_GetArrayItem is a walk from the head: indexed
 * access made 100k ids cost 7.8 s of CPU). */
static enum status parse_stops(const cJSON *o, struct gen_request *r)
{
    const cJSON *stop = field(o, "stop");
    int n = 0;
    if (stop && cJSON_IsString(stop)) n = 1;
    else if (stop && cJSON_IsArray(stop)) n = cJSON_GetArraySize(stop);
    else if (stop) return type_error("stop", "a string or a list of strings");
    if (n > REQUEST_MAX_STOP)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'stop': at most %d strings, got %d", REQUEST_MAX_STOP, n);
    r->stop = calloc((size_t)n + 1, sizeof *r->stop);
    if (!r->stop) return oom();
    const cJSON *s = !stop ? NULL : cJSON_IsString(stop) ? stop : stop->child;
    for (int i = 0; i < n; i++, s = s->next) {
        if (!cJSON_IsString(s)) return type_error("stop", "a string or a list of strings");
        enum status st = check_text("stop", s->valuestring);
        if (st != STATUS_OK) return st;
        if (!(r->stop[r->n_stop] = strdup(s->valuestring))) return oom();
        r->n_stop++;
    }
    const cJSON *ids = field(o, "stop_token_ids");
    if (ids && !cJSON_IsArray(ids)) return type_error("stop_token_ids", "a list of integers");
    int n_ids = ids ? cJSON_GetArraySize(ids) : 0;
    if (n_ids > REQUEST_MAX_STOP_TOKEN_IDS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'stop_token_ids': at most %d ids, got %d",
                             REQUEST_MAX_STOP_TOKEN_IDS, n_ids);
    r->stop_token_ids = malloc(((size_t)n_ids + 1) * sizeof *r->stop_token_ids);
    if (!r->stop_token_ids) return oom();
    for (const cJSON *e = ids ? ids->child : NULL; e; e = e->next) {
        int id;
        if (as_int(e, &id)) return type_error("stop_token_ids", "a list of integers");
        r->stop_token_ids[r->n_stop_token_ids++] = id;
    }
    return STATUS_OK;
}

/* A token id as a JSON object key, written as Python's str(int) writes it: "0", or a digit
 * 1-9 and more digits, with an optional '-' (a negative id is then refused by the validator
 * as out of the vocabulary). "05", " 5", "+5" and "5 " are not ids: a gateway in another
 * language would read them as other keys than this server, or not at all. */
static int canonical_id(const char *s, long *id)
{
    const char *d = s + (*s == '-');
    if (!(*d >= '1' && *d <= '9') && !(d[0] == '0' && !d[1] && d == s)) return -1;
    size_t n = strspn(d, "0123456789");
    if (d[n] || n > 10) return -1;
    errno = 0;
    *id = strtol(s, NULL, 10);
    return errno || *id < INT_MIN || *id > INT_MAX ? -1 : 0;
}

/* logit_bias: {"token id": bias, ...}. */
static enum status parse_logit_bias(const cJSON *o, struct gen_request *r)
{
    const cJSON *b = field(o, "logit_bias");
    if (!b) return STATUS_OK;
    if (!cJSON_IsObject(b)) return type_error("logit_bias", "an object mapping token ids to numbers");
    int n = cJSON_GetArraySize(b);
    if (n > REQUEST_MAX_LOGIT_BIAS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'logit_bias': at most %d entries, got %d", REQUEST_MAX_LOGIT_BIAS,
                             n);
    r->bias_ids = malloc(((size_t)n + 1) * sizeof *r->bias_ids);
    r->bias_values = malloc(((size_t)n + 1) * sizeof *r->bias_values);
    if (!r->bias_ids || !r->bias_values) return oom();
    for (const cJSON *e = b->child; e; e = e->next) {
        long id;
        if (canonical_id(e->string, &id))
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "logit_bias: key '%.32s' is not a token id (decimal digits without sign, spaces or "
                                 "leading zeros)",
                                 e->string);
        if (!cJSON_IsNumber(e)) return type_error("logit_bias", "an object mapping token ids to numbers");
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias++] = (float)e->valuedouble;
    }
    return STATUS_OK;
}

/* One prompt of the list: a string, or a JSON array of token ids. *total: the raw bytes (or
 * ids) of the prompts so far, bounded together by the edge's prompt size. */
static enum status parse_one_prompt(const cJSON *p, const char *name, size_t *total, struct http_prompt *out)
{
    if (cJSON_IsString(p)) {
        enum status st = check_text(name, p->valuestring);
        if (st != STATUS_OK) return st;
        out->text_len = strlen(p->valuestring);
        if ((*total += out->text_len) > CONVERT_MAX_PROMPT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'prompt': the prompts must total at most %d bytes",
                                 CONVERT_MAX_PROMPT_BYTES);
        return (out->text = strdup(p->valuestring)) ? STATUS_OK : oom();
    }
    if (!cJSON_IsArray(p)) return type_error(name, "a string or a list of token ids");
    int n = cJSON_GetArraySize(p);
    if ((*total += (size_t)n) > CONVERT_MAX_PROMPT_BYTES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'prompt': at most %d token ids in all", CONVERT_MAX_PROMPT_BYTES);
    out->ids = malloc(((size_t)n + 1) * sizeof *out->ids);
    if (!out->ids) return oom();
    for (const cJSON *e = p->child; e; e = e->next) {
        int id;
        if (as_int(e, &id)) return type_error(name, "a string or a list of token ids");
        out->ids[out->n_ids++] = id;
    }
    return STATUS_OK;
}

/* prompt: a string, a list of token ids, or a list of several prompts (strings or lists of
 * token ids), at most HTTP_MAX_PROMPTS. */
static enum status parse_prompt(const cJSON *o, struct http_request *q)
{
    const cJSON *p = field(o, "prompt");
    if (!p) return status_errorf(STATUS_INVALID_ARGUMENT, "'prompt' is required");
    if (!cJSON_IsString(p) && !cJSON_IsArray(p))
        return type_error("prompt", "a string, a list of strings, a list of token ids or a list of lists of token ids");
    /* A list whose first item is a number is one prompt of token ids (an empty list too: the
     * engine refuses it as an empty prompt); otherwise a list of prompts. */
    const cJSON *first = cJSON_IsArray(p) ? cJSON_GetArrayItem(p, 0) : NULL;
    int single = cJSON_IsString(p) || !first || cJSON_IsNumber(first);
    int n = single ? 1 : cJSON_GetArraySize(p);
    if (n > HTTP_MAX_PROMPTS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'prompt': at most %d prompts per request, got %d", HTTP_MAX_PROMPTS,
                             n);
    q->prompts = calloc((size_t)n, sizeof *q->prompts);
    if (!q->prompts) return oom();
    size_t total = 0;
    if (single) {
        q->n_prompts = 1;
        return parse_one_prompt(p, "prompt", &total, &q->prompts[0]);
    }
    for (const cJSON *e = p->child; e; e = e->next) {
        char name[32];
        snprintf(name, sizeof name, "prompt[%d]", q->n_prompts);
        enum status st = parse_one_prompt(e, name, &total, &q->prompts[q->n_prompts++]);
        if (st != STATUS_OK) return st;
    }
    return STATUS_OK;
}

void http_request_free(struct http_request *q)
{
    for (int i = 0; q->prompts && i < q->n_prompts; i++) {
        free(q->prompts[i].text);
        free(q->prompts[i].ids);
    }
    free(q->prompts);
    q->prompts = NULL;
    q->n_prompts = 0;
    gen_request_free(&q->r);
}

/* A message's content: a string, or a list of {"type": "text", "text": ...} parts (joined). */
static enum status message_content(const cJSON *c, int i, char **out)
{
    char name[48];
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (!c) return (*out = strdup("")) ? STATUS_OK : oom();
    if (cJSON_IsString(c)) {
        enum status st = check_text(name, c->valuestring);
        if (st != STATUS_OK) return st;
        return (*out = strdup(c->valuestring)) ? STATUS_OK : oom();
    }
    if (!cJSON_IsArray(c)) return type_error(name, "a string or a list of text parts");
    char *text = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&text, &len, &cap, "", 0);
    for (const cJSON *part = c->child; part; part = part->next) {
        const cJSON *type = field(part, "type"), *t = field(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
            free(text);
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s: only parts {\"type\": \"text\", \"text\": ...} are supported",
                                 name);
        }
        http_buf_append(&text, &len, &cap, t->valuestring, strlen(t->valuestring));
    }
    enum status st = check_text(name, text);
    if (st != STATUS_OK) free(text);
    else *out = text;
    return st;
}

static enum status parse_messages(const cJSON *o, struct gen_request *r)
{
    const cJSON *m = field(o, "messages");
    if (!m) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages' is required");
    if (!cJSON_IsArray(m)) return type_error("messages", "a list of messages");
    int n = cJSON_GetArraySize(m);
    if (n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages' must not be empty");
    if (n > 4096) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages': at most 4096 messages, got %d", n);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return oom();
    size_t total = 0;
    int i = 0;
    for (const cJSON *e = m->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d]' must be an object", i);
        const cJSON *role = field(e, "role");
        if (!cJSON_IsString(role)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].role' must be a string", i);
        /* OpenAI's "developer" role is the system message of newer models. */
        int k = strcmp(role->valuestring, "developer") ? chat_role_parse(role->valuestring) : CHAT_ROLE_SYSTEM;
        if (k < 0)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "'messages[%d].role' must be one of system, developer, user, assistant; got '%.64s'", i,
                                 role->valuestring);
        enum status st = message_content(field(e, "content"), i, &r->messages[i].content);
        if (st != STATUS_OK) return st;
        r->messages[i].role = (enum chat_role)k;
        r->n_messages++;
        total += strlen(r->messages[i].content);
        if (total > CONVERT_MAX_PROMPT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'messages': the contents must total at most %d bytes",
                                 CONVERT_MAX_PROMPT_BYTES);
    }
    r->add_bos = 1;
    return STATUS_OK;
}

/* OpenAI and vLLM fields this server does not honour yet (structured outputs, tools: issue 28;
 * suffix, best_of): a request that sets one is refused by name, never answered as if the field
 * were not there. Absent, null, or the value that asks for nothing special is accepted. */
static enum status refuse_unhonoured(const cJSON *o)
{
    static const char *const always[] = {"functions", "function_call", "suffix", "guided_json", "guided_regex",
                                         "guided_choice", "guided_grammar", "structured_outputs", "response_format"};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++) {
        const cJSON *v = field(o, always[i]);
        if (!v) continue;
        if (!strcmp(always[i], "response_format")) { /* {"type": "text"} asks for nothing */
            const cJSON *t = cJSON_IsObject(v) ? field(v, "type") : NULL;
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "text")) continue;
        }
        return status_errorf(STATUS_UNSUPPORTED, "'%s' is not supported by this server yet (no structured outputs)",
                             always[i]);
    }
    const cJSON *tools = field(o, "tools"), *choice = field(o, "tool_choice"), *best = field(o, "best_of");
    if (tools && !(cJSON_IsArray(tools) && cJSON_GetArraySize(tools) == 0))
        return status_errorf(STATUS_UNSUPPORTED, "'tools' is not supported by this server yet (no tool calling)");
    if (choice && !(cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")))
        return status_errorf(STATUS_UNSUPPORTED, "'tool_choice' is not supported by this server yet (no tool calling)");
    if (best && !(cJSON_IsNumber(best) && best->valuedouble == 1.0))
        return status_errorf(STATUS_UNSUPPORTED, "'best_of' other than 1 is not supported by this server");
    return STATUS_OK;
}

/* The sampling fields common to both endpoints. */
static enum status parse_sampling(const cJSON *o, struct http_request *q)
{
    struct request_params *p = &q->r.params;
    struct sampling_params *sp = &p->sampling;
    enum status st = STATUS_OK;
    sp->temperature = 1.0f; /* OpenAI's default */
    if (st == STATUS_OK) st = get_float(o, "temperature", &sp->temperature);
    if (st == STATUS_OK) st = get_float(o, "top_p", &sp->top_p);
    if (st == STATUS_OK) st = get_int(o, "top_k", &sp->top_k);
    if (st == STATUS_OK && sp->top_k < 0) sp->top_k = 0; /* vLLM: -1 means off */
    if (st == STATUS_OK) st = get_float(o, "min_p", &sp->min_p);
    if (st == STATUS_OK) st = get_float(o, "repetition_penalty", &sp->repetition_penalty);
    if (st == STATUS_OK) st = get_float(o, "presence_penalty", &sp->presence_penalty);
    if (st == STATUS_OK) st = get_float(o, "frequency_penalty", &sp->frequency_penalty);
    const cJSON *seed = field(o, "seed");
    if (st == STATUS_OK && seed) {
        double d = cJSON_IsNumber(seed) ? seed->valuedouble : NAN;
        if (!isfinite(d) || d != floor(d) || fabs(d) > 9.2e18) st = type_error("seed", "an integer");
        else sp->seed = (uint64_t)(int64_t)d, p->has_seed = 1;
    }
    p->max_tokens = -1;
    if (st == STATUS_OK) st = get_int(o, "max_tokens", &p->max_tokens);
    if (st == STATUS_OK && q->is_chat) st = get_int(o, "max_completion_tokens", &p->max_tokens);
    if (st == STATUS_OK) st = get_int(o, "n", &p->n);
    if (st == STATUS_OK) st = get_int(o, "min_tokens", &p->min_tokens);
    if (st == STATUS_OK) st = get_bool(o, "ignore_eos", &p->ignore_eos);
    if (st == STATUS_OK) st = parse_stops(o, &q->r);
    if (st == STATUS_OK) st = parse_logit_bias(o, &q->r);
    const cJSON *user = field(o, "user");
    if (st == STATUS_OK && user && !cJSON_IsString(user)) st = type_error("user", "a string");
    if (st == STATUS_OK && user && user->valuestring[0]) { /* the client, for --scheduling-policy fair */
        size_t n = strlen(user->valuestring);
        if (n > 256) return status_errorf(STATUS_INVALID_ARGUMENT, "'user' must be at most 256 bytes, got %zu", n);
        if (!(q->r.client = malloc(n + 6))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(q->r.client, "user:", 5);
        memcpy(q->r.client + 5, user->valuestring, n + 1);
        p->client = q->r.client;
    }
    if (st == STATUS_OK) st = get_int(o, "priority", &p->priority); /* vLLM's extra field */
    return st;
}

/* logprobs (completions: an integer; chat: a boolean with top_logprobs), echo, stream. */
static enum status parse_shape(const cJSON *o, struct http_request *q)
{
    enum status st = STATUS_OK;
    q->logprobs = -1;
    if (q->is_chat) {
        int want = 0, top = 0;
        if (st == STATUS_OK) st = get_bool(o, "logprobs", &want);
        if (st == STATUS_OK) st = get_int(o, "top_logprobs", &top);
        if (st == STATUS_OK && want) q->logprobs = top;
        if (st == STATUS_OK && !want && field(o, "top_logprobs"))
            st = status_errorf(STATUS_INVALID_ARGUMENT, "'top_logprobs' needs 'logprobs': true");
    } else {
        if (st == STATUS_OK) st = get_int(o, "logprobs", &q->logprobs);
        if (st == STATUS_OK && !field(o, "logprobs")) q->logprobs = -1;
        if (st == STATUS_OK) st = get_bool(o, "echo", &q->echo);
    }
    q->r.params.logprobs = q->logprobs;
    /* echo with logprobs: the prompt tokens' log-probabilities too, with as many alternatives. */
    if (q->echo && q->logprobs >= 0) q->r.params.prompt_logprobs = q->logprobs;
    if (st == STATUS_OK) st = get_bool(o, "stream", &q->stream);
    const cJSON *so = field(o, "stream_options");
    if (st == STATUS_OK && so && !cJSON_IsObject(so)) st = type_error("stream_options", "an object");
    if (st == STATUS_OK && so) st = get_bool(so, "include_usage", &q->include_usage);
    return st;
}

/* The `model` field: the served model's id (the base) or the name of a served adapter, kept in
 * r->adapter as given (absent: NULL); the server decides what it means (gen_resolve_adapter:
 * absent is its default adapter, if it has one). */
static enum status parse_model(const cJSON *model, const char *served_model, const char *const *adapters,
                               int n_adapters, struct gen_request *r)
{
    if (!model) return STATUS_OK;
    if (!cJSON_IsString(model)) return type_error("model", "a string");
    int known = !strcmp(model->valuestring, served_model);
    for (int i = 0; !known && i < n_adapters; i++) known = !strcmp(model->valuestring, adapters[i]);
    if (known) return (r->adapter = strdup(model->valuestring)) ? STATUS_OK : oom();
    return status_errorf(STATUS_NOT_FOUND, "The model '%.128s' does not exist (this server serves '%s'%s; see /v1/models)",
                         model->valuestring, served_model, n_adapters ? " and its adapters" : "");
}

/* cJSON ends a string at a NUL ("\u0000", or a raw NUL byte, which it lets through) and drops
 * the rest, so the server refuses NUL in strings, as gRPC does. To find them by name after
 * parsing, a copy of the body is parsed in which every NUL inside a string is NUL_MARK, a byte
 * that the UTF-8 check of the body has ruled out and that cJSON copies through. Returns the
 * malloc'd copy of *out_len bytes. */
#define NUL_MARK '\xff'
static char *mark_nuls(const char *body, size_t len, size_t *out_len)
{
    char *out = malloc(len ? len : 1);
    CHECK(out, "out of memory copying a request body");
    size_t o = 0;
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string && c == '\\' && i + 5 < len && !memcmp(body + i + 1, "u0000", 5)) {
            out[o++] = NUL_MARK;
            i += 5;
            continue;
        }
        if (in_string && c == '\\' && i + 1 < len) { /* any other escape, "\\" included */
            out[o++] = c;
            out[o++] = body[++i];
            continue;
        }
        if (c == '"') in_string = !in_string;
        out[o++] = in_string && c == 0 ? NUL_MARK : c;
    }
    *out_len = o;
    return out;
}

/* 1 when a string or member name within v held a NUL; path[0..cap) then names the string as
 * the API does ("messages[1].content"), or the object holding the name (*in_name set). */
static int find_nul(const cJSON *v, char *path, size_t cap, int *in_name)
{
    if (cJSON_IsString(v)) return strchr(v->valuestring, NUL_MARK) != NULL;
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return 0;
    size_t n = strlen(path);
    int i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (cJSON_IsObject(v) && strchr(e->string, NUL_MARK)) return *in_name = 1;
        if (cJSON_IsArray(v)) snprintf(path + n, cap - n, "[%d]", i);
        else snprintf(path + n, cap - n, "%s%s", n ? "." : "", e->string);
        if (find_nul(e, path, cap, in_name)) return 1;
        path[n] = 0;
    }
    return 0;
}

static enum status refuse_nul(const cJSON *o)
{
    char path[256] = "";
    int in_name = 0;
    if (!find_nul(o, path, sizeof path, &in_name)) return STATUS_OK;
    if (in_name)
        return status_errorf(STATUS_INVALID_ARGUMENT, "a member name of %s%s%s must not contain U+0000 (NUL)",
                             path[0] ? "'" : "", path[0] ? path : "the request", path[0] ? "'" : "");
    return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' must not contain U+0000 (NUL)", path);
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* 1 when an object within v (v included) has a member name twice; *dup is then that name.
 * Python, JavaScript and Go take the last of duplicate keys and cJSON the first, so a gateway
 * that checked {"max_tokens": 100000, "max_tokens": 10} would pass what this server runs
 * differently: the request is refused instead. Names are sorted per object (O(n log n): an
 * object of 200k members is a 4 MB body). */
static int find_duplicate(const cJSON *v, const char **dup)
{
    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) return 0;
    int n = 0;
    for (const cJSON *e = v->child; e; e = e->next) {
        if (find_duplicate(e, dup)) return 1;
        n++;
    }
    if (!cJSON_IsObject(v) || n < 2) return 0;
    const char **names = malloc((size_t)n * sizeof *names);
    CHECK(names, "out of memory checking a request's member names");
    int k = 0;
    for (const cJSON *e = v->child; e; e = e->next) names[k++] = e->string;
    qsort(names, (size_t)n, sizeof *names, compare_names);
    int found = 0;
    for (int i = 1; i < n && !found; i++)
        if (!strcmp(names[i - 1], names[i])) found = 1, *dup = names[i];
    free(names);
    return found;
}

enum status http_parse_request(const char *body, size_t len, int is_chat, const char *served_model,
                               const char *const *adapters, int n_adapters, struct http_request *q)
{
    memset(q, 0, sizeof *q);
    q->r.params = request_params_default();
    q->is_chat = is_chat;
    if (!utf8_valid(body, len)) return status_errorf(STATUS_INVALID_ARGUMENT, "the request body is not valid UTF-8");
    size_t marked_len;
    char *marked = mark_nuls(body, len, &marked_len);
    /* The whole body is one JSON value: bytes after it (a second object, garbage) are refused,
     * not ignored, so that no two readers of the body see two different requests. */
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithLengthOpts(marked, marked_len, &end, 0);
    size_t rest = o && end ? marked_len - (size_t)(end - marked) : 0;
    while (rest && end[0] && strchr(" \t\r\n", end[0])) end++, rest--;
    free(marked);
    if (!o) return status_errorf(STATUS_INVALID_ARGUMENT, "the request body is not valid JSON");
    enum status st = STATUS_OK;
    const char *dup = NULL;
    if (rest) st = status_errorf(STATUS_INVALID_ARGUMENT, "the request body has %zu bytes after its JSON value", rest);
    else if (!cJSON_IsObject(o)) st = status_errorf(STATUS_INVALID_ARGUMENT, "the request body must be a JSON object");
    if (st == STATUS_OK) st = refuse_nul(o);
    if (st == STATUS_OK && find_duplicate(o, &dup))
        st = status_errorf(STATUS_INVALID_ARGUMENT, "the member name '%.64s' appears twice in one object", dup);
    if (st == STATUS_OK) st = refuse_unhonoured(o);
    if (st == STATUS_OK) st = parse_model(field(o, "model"), served_model, adapters, n_adapters, &q->r);
    if (st == STATUS_OK) st = is_chat ? parse_messages(o, &q->r) : parse_prompt(o, q);
    if (st == STATUS_OK) q->r.add_bos = 1;
    if (st == STATUS_OK) st = parse_sampling(o, q);
    if (st == STATUS_OK) st = parse_shape(o, q);
    cJSON_Delete(o);
    struct request_params *p = &q->r.params;
    p->stop = (const char *const *)q->r.stop;
    p->n_stop = q->r.n_stop;
    p->stop_token_ids = q->r.stop_token_ids;
    p->n_stop_token_ids = q->r.n_stop_token_ids;
    p->logit_bias_ids = q->r.bias_ids;
    p->logit_bias_values = q->r.bias_values;
    p->n_logit_bias = q->r.n_bias;
    return st;
}

/* ---- responses ----------------------------------------------------------------------------- */

void http_buf_append(char **p, size_t *len, size_t *cap, const char *data, size_t n)
{
    CHECK(base_grow((void **)p, cap, *len + n + 1, 1) == 0, "out of memory");
    if (n) memcpy(*p + *len, data, n);
    *len += n;
    (*p)[*len] = 0;
}

static cJSON *check_json(cJSON *j)
{
    CHECK(j, "out of memory building JSON");
    return j;
}

/* The text of one token for logprob entries: the piece with U+2581 as a space; a byte piece
 * "<0xNN>" is that byte when ASCII (otherwise the piece as it is, to keep the JSON UTF-8). */
static void token_text(const struct tokenizer *tok, int32_t id, char *out, size_t cap)
{
    const char *p = tokenizer_id_to_piece(tok, id);
    if (!p) p = "";
    unsigned byte;
    if (strlen(p) == 6 && sscanf(p, "<0x%2X>", &byte) == 1 && byte < 0x80 && byte >= 0x20) {
        snprintf(out, cap, "%c", (char)byte);
        return;
    }
    size_t o = 0;
    for (size_t i = 0; p[i] && o + 4 < cap; i++) {
        if ((unsigned char)p[i] == 0xE2 && (unsigned char)p[i + 1] == 0x96 && (unsigned char)p[i + 2] == 0x81) {
            out[o++] = ' ';
            i += 2;
        } else {
            out[o++] = p[i];
        }
    }
    out[o] = 0;
}

/* Adds o[name] = s[0..n); s[n] must be readable (s is a NUL-terminated buffer). Generated text
 * may hold U+0000 (token <0x00>), which cJSON would cut (it measures strings with strlen), and a
 * sample's buffer holds old text past n after a chunk went out: such text goes in as a raw item
 * escaped here, as cJSON escapes ("\u0000" for the NUL). */
static void add_text(cJSON *o, const char *name, const char *s, size_t n)
{
    if (!memchr(s, 0, n) && s[n] == 0) {
        check_json(cJSON_AddStringToObject(o, name, s));
        return;
    }
    char *lit = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&lit, &len, &cap, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
        else esc[0] = (char)c, esc[1] = 0;
        http_buf_append(&lit, &len, &cap, esc, strlen(esc));
    }
    http_buf_append(&lit, &len, &cap, "\"", 1);
    check_json(cJSON_AddRawToObject(o, name, lit));
    free(lit);
}

static cJSON *bytes_array(const char *s)
{
    cJSON *a = check_json(cJSON_CreateArray());
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) cJSON_AddItemToArray(a, check_json(cJSON_CreateNumber(*p)));
    return a;
}

/* A completions top_logprobs entry: {"token text": logprob, ...} of top[0..n_top). */
static cJSON *top_dict(const struct tokenizer *tok, const struct top_logprob *top, int n_top)
{
    char t[256];
    cJSON *d = check_json(cJSON_CreateObject());
    for (int k = 0; top && k < n_top; k++) {
        token_text(tok, top[k].id, t, sizeof t);
        if (!cJSON_GetObjectItemCaseSensitive(d, t)) cJSON_AddNumberToObject(d, t, top[k].logprob);
    }
    return d;
}

/* Log-probabilities of a sample's tokens b->ids[0..b->n), in the endpoint's shape; NULL (JSON
 * null) when not asked. Completions: *offset is the text_offset of the first token, advanced
 * by each token's text; with `prompt` (echo with logprobs: the run whose prompt
 * log-probabilities arrived), the prompt's tokens come first, their offsets counted from 0 by
 * their texts (as vLLM does), the first one's log-probability and alternatives null. */
static cJSON *logprobs_json(const struct http_gen *g, const struct http_run *prompt, const struct sample_buf *b,
                            size_t *offset)
{
    if (g->q.logprobs < 0 || (!b->lp && !prompt)) return cJSON_CreateNull();
    const struct tokenizer *tok = g->s->tok;
    char t[256];
    if (g->q.is_chat) {
        cJSON *o = check_json(cJSON_CreateObject()), *content = check_json(cJSON_AddArrayToObject(o, "content"));
        for (int i = 0; i < b->n; i++) {
            cJSON *e = check_json(cJSON_CreateObject());
            token_text(tok, b->ids[i], t, sizeof t);
            cJSON_AddStringToObject(e, "token", t);
            cJSON_AddNumberToObject(e, "logprob", b->lp[i]);
            cJSON_AddItemToObject(e, "bytes", bytes_array(t));
            cJSON *tops = check_json(cJSON_AddArrayToObject(e, "top_logprobs"));
            for (int k = 0; b->top && k < b->n_top; k++) {
                const struct top_logprob *x = &b->top[(size_t)i * b->n_top + k];
                cJSON *te = check_json(cJSON_CreateObject());
                token_text(tok, x->id, t, sizeof t);
                cJSON_AddStringToObject(te, "token", t);
                cJSON_AddNumberToObject(te, "logprob", x->logprob);
                cJSON_AddItemToObject(te, "bytes", bytes_array(t));
                cJSON_AddItemToArray(tops, te);
            }
            cJSON_AddItemToArray(content, e);
        }
        return o;
    }
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON *tokens = check_json(cJSON_AddArrayToObject(o, "tokens"));
    cJSON *lps = check_json(cJSON_AddArrayToObject(o, "token_logprobs"));
    cJSON *tops = g->q.logprobs > 0 ? check_json(cJSON_AddArrayToObject(o, "top_logprobs")) : NULL;
    if (!tops) cJSON_AddNullToObject(o, "top_logprobs");
    cJSON *offs = check_json(cJSON_AddArrayToObject(o, "text_offset"));
    size_t prompt_offset = 0;
    for (int i = 0; prompt && i < prompt->n_prompt; i++) {
        token_text(tok, prompt->prompt_ids[i], t, sizeof t);
        cJSON_AddItemToArray(tokens, check_json(cJSON_CreateString(t)));
        cJSON_AddItemToArray(lps, check_json(i ? cJSON_CreateNumber(prompt->prompt_lp[i]) : cJSON_CreateNull()));
        cJSON_AddItemToArray(offs, check_json(cJSON_CreateNumber((double)prompt_offset)));
        prompt_offset += strlen(t);
        if (tops)
            cJSON_AddItemToArray(tops, i ? top_dict(tok, prompt->prompt_top ? &prompt->prompt_top[(size_t)i * prompt->n_prompt_top]
                                                                           : NULL,
                                                    prompt->n_prompt_top)
                                         : check_json(cJSON_CreateNull()));
    }
    for (int i = 0; b->lp && i < b->n; i++) {
        token_text(tok, b->ids[i], t, sizeof t);
        cJSON_AddItemToArray(tokens, check_json(cJSON_CreateString(t)));
        cJSON_AddItemToArray(lps, check_json(cJSON_CreateNumber(b->lp[i])));
        cJSON_AddItemToArray(offs, check_json(cJSON_CreateNumber((double)*offset)));
        *offset += strlen(t);
        if (tops) cJSON_AddItemToArray(tops, top_dict(tok, b->top ? &b->top[(size_t)i * b->n_top] : NULL, b->n_top));
    }
    return o;
}

static cJSON *finish_json(enum finish_reason f)
{
    if (f == FINISH_REASON_LENGTH) return cJSON_CreateString("length");
    if (f == FINISH_REASON_STOP || f == FINISH_REASON_EOS) return cJSON_CreateString("stop");
    return cJSON_CreateNull();
}

static cJSON *usage_json(const struct http_gen *g)
{
    int completion = 0, prompt = 0, cached = 0;
    for (int i = 0; i < g->n_samples; i++) completion += g->samples[i].completion_tokens;
    for (int i = 0; i < g->n_runs; i++) prompt += g->runs[i].prompt_tokens, cached += g->runs[i].cached_prompt_tokens;
    cJSON *u = check_json(cJSON_CreateObject());
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    cJSON *d = check_json(cJSON_AddObjectToObject(u, "prompt_tokens_details"));
    cJSON_AddNumberToObject(d, "cached_tokens", cached);
    return u;
}

/* The fields every response and chunk opens with. */
static cJSON *envelope(const struct http_gen *g, const char *object)
{
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON_AddStringToObject(o, "id", g->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)g->created);
    /* The model that answers (vLLM's): the adapter's name, or the base's id. */
    const char *adapter = g->q.r.params.adapter;
    cJSON_AddStringToObject(o, "model", adapter && *adapter ? adapter : g->s->model_id);
    return o;
}

static char *print_json(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    CHECK(s, "out of memory printing JSON");
    cJSON_Delete(o);
    return s;
}

/* The run (prompt) of sample i. */
static const struct http_run *run_of(const struct http_gen *g, int i) { return &g->runs[i / g->n_per_run]; }

/* The prompt-logprob run to put before sample i's tokens: echo with logprobs, once they came. */
static const struct http_run *echo_logprobs(const struct http_gen *g, int i)
{
    const struct http_run *r = run_of(g, i);
    return g->q.echo && g->q.logprobs >= 0 && r->prompt_lp_ready ? r : NULL;
}

/* Adds c.text: the echoed prompt (when given) then text[0..n). */
static void add_echoed_text(cJSON *c, const struct http_run *r, const char *text, size_t n)
{
    if (!r || !r->echo) {
        add_text(c, "text", text, n);
        return;
    }
    char *full = NULL;
    size_t len = 0, cap = 0;
    http_buf_append(&full, &len, &cap, r->echo, r->echo_len);
    http_buf_append(&full, &len, &cap, text, n);
    add_text(c, "text", full, len);
    free(full);
}

char *http_response_json(struct http_gen *g)
{
    cJSON *o = envelope(g, g->q.is_chat ? "chat.completion" : "text_completion");
    cJSON *choices = check_json(cJSON_AddArrayToObject(o, "choices"));
    for (int i = 0; i < g->n_samples; i++) {
        struct sample_buf *b = &g->samples[i];
        const struct http_run *r = run_of(g, i);
        cJSON *c = check_json(cJSON_CreateObject());
        cJSON_AddNumberToObject(c, "index", i);
        const char *text = b->text ? b->text : "";
        size_t offset = r->echo ? r->echo_len : 0;
        if (g->q.is_chat) {
            cJSON *m = check_json(cJSON_AddObjectToObject(c, "message"));
            cJSON_AddStringToObject(m, "role", "assistant");
            add_text(m, "content", text, b->text_len);
        } else {
            add_echoed_text(c, r, text, b->text_len);
        }
        cJSON_AddItemToObject(c, "logprobs", check_json(logprobs_json(g, echo_logprobs(g, i), b, &offset)));
        cJSON_AddItemToObject(c, "finish_reason", check_json(finish_json(b->finish)));
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(o, "usage", usage_json(g));
    return print_json(o);
}

static void sse_event(struct http_gen *g, cJSON *o)
{
    char *s = print_json(o);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "data: ", 6);
    http_buf_append(&g->out, &g->out_len, &g->out_cap, s, strlen(s));
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
}

void http_stream_chunks(struct http_gen *g)
{
    for (int i = 0; i < g->n_samples; i++) {
        struct sample_buf *b = &g->samples[i];
        const struct http_run *r = run_of(g, i);
        int final = b->finished && !b->final_sent;
        if (b->final_sent) continue;
        /* Tokens without text yet (an incomplete UTF-8 sequence, a held-back stop prefix) wait
         * for their text unless their log-probabilities were asked. */
        if (b->text_len == 0 && !final && b->role_sent && (b->n == 0 || g->q.logprobs < 0)) continue;
        /* Echo with logprobs: a sample's first chunk carries its prompt's log-probabilities,
         * which the engine sends with the first sample's prefill; the others wait for them. */
        int first = !b->role_sent;
        if (!g->q.is_chat && first && g->q.echo && g->q.logprobs >= 0 && !r->prompt_lp_ready && !final) continue;
        cJSON *o = envelope(g, g->q.is_chat ? "chat.completion.chunk" : "text_completion");
        cJSON *choices = check_json(cJSON_AddArrayToObject(o, "choices"));
        cJSON *c = check_json(cJSON_CreateObject());
        cJSON_AddNumberToObject(c, "index", i);
        const char *text = b->text ? b->text : "";
        if (g->q.is_chat) {
            cJSON *d = check_json(cJSON_AddObjectToObject(c, "delta"));
            if (first) cJSON_AddStringToObject(d, "role", "assistant");
            if (b->text_len || first) add_text(d, "content", text, b->text_len);
        } else {
            add_echoed_text(c, first ? r : NULL, text, b->text_len);
            if (first && r->echo) b->text_offset += r->echo_len;
        }
        size_t offset = b->text_offset;
        cJSON_AddItemToObject(c, "logprobs", check_json(logprobs_json(g, first ? echo_logprobs(g, i) : NULL, b, &offset)));
        cJSON_AddItemToObject(c, "finish_reason", check_json(final ? finish_json(b->finish) : cJSON_CreateNull()));
        cJSON_AddItemToArray(choices, c);
        if (g->q.include_usage) cJSON_AddNullToObject(o, "usage");
        sse_event(g, o);
        b->text_offset += b->text_len;
        b->n = 0;
        b->text_len = 0;
        b->role_sent = 1;
        if (final) b->final_sent = 1;
    }
}

void http_stream_finish(struct http_gen *g)
{
    if (g->end_status != STATUS_OK) {
        /* Headers are gone: an error after the first byte travels as an event (vLLM does so). */
        cJSON *o = check_json(cJSON_CreateObject());
        cJSON *e = check_json(cJSON_AddObjectToObject(o, "error"));
        cJSON_AddStringToObject(e, "message", g->end_message);
        cJSON_AddStringToObject(e, "type", "server_error");
        cJSON_AddNullToObject(e, "param");
        cJSON_AddStringToObject(e, "code", status_name(g->end_status));
        sse_event(g, o);
    } else if (g->q.include_usage) {
        cJSON *o = envelope(g, g->q.is_chat ? "chat.completion.chunk" : "text_completion");
        check_json(cJSON_AddArrayToObject(o, "choices"));
        cJSON_AddItemToObject(o, "usage", usage_json(g));
        sse_event(g, o);
    }
    http_buf_append(&g->out, &g->out_len, &g->out_cap, "data: [DONE]\n\n", 14);
    g->done = 1;
}

char *http_error_json(const char *message, const char *type, const char *param, const char *code)
{
    cJSON *o = check_json(cJSON_CreateObject());
    cJSON *e = check_json(cJSON_AddObjectToObject(o, "error"));
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type);
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code);
    else cJSON_AddNullToObject(e, "code");
    return print_json(o);
}
