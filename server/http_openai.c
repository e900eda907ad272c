/* server/http_openai.c - the OpenAI wire format: /v1/completions and /v1/chat/completions
 * request JSON into struct gen_request (the same native request that gRPC's convert.c makes;
 * only JSON types are checked here, every numeric range is engine_validate's).
 * Not here: the body's one reading (http_json.c); the response, SSE chunk, usage and error
 * JSON (http_openai_out.c); HTTP itself, waiting, status codes (http.c).
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

static const cJSON *field(const cJSON *o, const char *name) { return http_json_field(o, name); }

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
    if (!v || !as_int(v, out)) return STATUS_OK;
    const double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (isfinite(d) && d == floor(d)) /* a whole number this server cannot hold: out of range, not a type error */
        return status_errorf(STATUS_INVALID_ARGUMENT, "'%s' = %.17g is out of range [%d, %d]", name, d, INT_MIN, INT_MAX);
    return type_error(name, "an integer");
}

/* A token count the client may leave out (-1 then: the server's default), never negative. */
static enum status get_count(const cJSON *o, const char *name, int *out)
{
    const cJSON *v = field(o, name);
    if (!v) return STATUS_OK;
    int n = 0;
    enum status st = get_int(o, name, &n);
    if (st == STATUS_OK && n < 0)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "'%s' must be >= 0 (0 with echo and logprobs scores the prompt "
                           "only), got %d", name, n);
    if (st == STATUS_OK) *out = n;
    return st;
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
    free(q->arg_types);
    for (int i = 0; q->prompts && i < q->n_prompts; i++) {
        free(q->prompts[i].text);
        free(q->prompts[i].ids);
    }
    free(q->prompts);
    q->prompts = NULL;
    q->n_prompts = 0;
    http_responses_free(q->responses);
    q->responses = NULL;
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
    /* cache_control (Anthropic-style clients send it): the prefix cache is automatic, so it is honoured */
    static const char *const part_fields[] = {"type", "text", "cache_control", NULL};
    int k = 0;
    for (const cJSON *part = c->child; part; part = part->next, k++) {
        const cJSON *type = field(part, "type"), *t = field(part, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(t)) {
            free(text);
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s: only parts {\"type\": \"text\", \"text\": ...} are supported",
                                 name);
        }
        char where[64];
        snprintf(where, sizeof where, "%s[%d]", name, k);
        enum status st = http_json_only_fields(part, where, part_fields);
        if (st != STATUS_OK) {
            free(text);
            return st;
        }
        http_buf_append(&text, &len, &cap, t->valuestring, strlen(t->valuestring));
    }
    enum status st = check_text(name, text);
    if (st != STATUS_OK) free(text);
    else *out = text;
    return st;
}

/* A message's fields other than role and content, each read or refused by name: name (written by
 * a Jinja template: the built-in ones have no place for it), tool_calls and tool_call_id
 * (http_tools.c), reasoning_content (given to a Jinja template that reasons; the others drop it
 * from the history as the models' own templates do), and what OpenAI's own replies carry when a
 * client sends them back: refusal and audio and function_call null, annotations empty. */
static enum status check_message_fields(const cJSON *e, int i, const char *role, const struct http_chat_caps *caps)
{
    for (const cJSON *f = e->child; f; f = f->next) {
        const char *k = f->string;
        if (!strcmp(k, "role") || !strcmp(k, "content") || !strcmp(k, "tool_calls")) continue;
        if (!strcmp(k, "name")) {
            if (!cJSON_IsString(f)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].name' must be a string", i);
            if (!(caps && caps->jinja))
                return status_errorf(STATUS_UNSUPPORTED, "'messages[%d].name' needs a Jinja chat template (the model's own "
                                     "or --chat-template FILE.jinja): this server's built-in template has no place for it", i);
        } else if (!strcmp(k, "tool_call_id")) {
            if (strcmp(role, "tool"))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].tool_call_id' is for messages of role tool", i);
        } else if (!strcmp(k, "reasoning_content")) {
            if (!cJSON_IsString(f) && !cJSON_IsNull(f))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].reasoning_content' must be a string", i);
        } else if (!strcmp(k, "refusal") || !strcmp(k, "audio") || !strcmp(k, "function_call")) {
            if (!cJSON_IsNull(f))
                return status_errorf(STATUS_UNSUPPORTED, "'messages[%d].%s' is not supported by this server (only null)", i, k);
        } else if (!strcmp(k, "annotations")) {
            if (!cJSON_IsNull(f) && !(cJSON_IsArray(f) && !f->child))
                return status_errorf(STATUS_UNSUPPORTED, "'messages[%d].annotations' is not supported by this server (only "
                                     "an empty list)", i);
        } else {
            return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].%.64s': unknown field (not supported by this "
                                 "server)", i, k);
        }
    }
    return STATUS_OK;
}

static enum status parse_messages(const cJSON *o, const struct http_chat_caps *caps, struct gen_request *r)
{
    const cJSON *m = field(o, "messages");
    if (!m) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages' is required");
    if (!cJSON_IsArray(m)) return type_error("messages", "a list of messages");
    int n = cJSON_GetArraySize(m);
    if (n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages' must not be empty");
    if (n > HTTP_MAX_MESSAGES)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'messages': at most %d messages, got %d", HTTP_MAX_MESSAGES, n);
    r->messages = calloc((size_t)n, sizeof *r->messages);
    if (!r->messages) return oom();
    size_t total = 0;
    int i = 0;
    for (const cJSON *e = m->child; e; e = e->next, i++) {
        if (!cJSON_IsObject(e)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d]' must be an object", i);
        const cJSON *role = field(e, "role");
        if (!cJSON_IsString(role)) return status_errorf(STATUS_INVALID_ARGUMENT, "'messages[%d].role' must be a string", i);
        /* OpenAI's "developer" role is the system message of newer models; a tool's result is
         * a user turn of the tool format (http_tools.c). */
        int is_tool = !strcmp(role->valuestring, "tool");
        int k = is_tool ? CHAT_ROLE_USER
                : strcmp(role->valuestring, "developer") ? chat_role_parse(role->valuestring)
                                                         : CHAT_ROLE_SYSTEM;
        if (k < 0)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "'messages[%d].role' must be one of system, developer, user, assistant, tool; got "
                                 "'%.64s'", i, role->valuestring);
        enum status st = check_message_fields(e, i, role->valuestring, caps);
        if (st == STATUS_OK) st = http_tools_message(e, i, role->valuestring, &r->messages[i].content);
        if (st == STATUS_OK && !r->messages[i].content)
            st = message_content(field(e, "content"), i, &r->messages[i].content);
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

/* One constraint of the request: kind and source (a JSON value is printed compactly; a string
 * is taken as it is). */
static enum status set_constraint(struct gen_request *r, enum constraint_kind kind, const cJSON *v, const char *name)
{
    if (r->params.constraint_kind != CONSTRAINT_NONE)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'%s': the request already has a structured-output constraint "
                             "(response_format, structured_outputs and guided_* are exclusive)", name);
    char *src = NULL;
    if (kind == CONSTRAINT_JSON_OBJECT) src = strdup("");
    else if (cJSON_IsString(v)) src = strdup(v->valuestring);
    else if (kind == CONSTRAINT_JSON_SCHEMA ? cJSON_IsObject(v) || cJSON_IsBool(v) : kind == CONSTRAINT_CHOICE && cJSON_IsArray(v))
        src = cJSON_PrintUnformatted(v);
    else
        return type_error(name, kind == CONSTRAINT_JSON_SCHEMA ? "a JSON Schema (an object)"
                                : kind == CONSTRAINT_CHOICE    ? "a list of strings"
                                                               : "a string");
    if (!src) return oom();
    if (kind == CONSTRAINT_CHOICE && cJSON_IsString(v)) { /* a choice list is a list */
        free(src);
        return type_error(name, "a list of strings");
    }
    r->constraint = src;
    r->constraint_len = strlen(src);
    r->params.constraint_kind = kind;
    r->params.constraint = src;
    r->params.constraint_len = r->constraint_len;
    return STATUS_OK;
}

/* Structured outputs: OpenAI's response_format (text, json_object, json_schema), vLLM's
 * structured_outputs {json, regex, choice, grammar, json_object} and its older guided_json,
 * guided_regex, guided_choice, guided_grammar. At most one of them; each is enforced, never
 * advisory (json_schema's strict: false is enforced too). */
static enum status parse_constraint(const cJSON *o, struct gen_request *r)
{
    enum status st = STATUS_OK;
    const cJSON *rf = field(o, "response_format");
    if (rf) {
        const cJSON *t = cJSON_IsObject(rf) ? field(rf, "type") : NULL;
        if (!cJSON_IsString(t))
            return type_error("response_format", "an object with a 'type' (text, json_object or json_schema)");
        /* Members that would be ignored are refused by name (json_schema's name, description and
         * strict are OpenAI's: a name, words, and what the grammar always is: strict). */
        static const char *const rf_fields[] = {"type", "json_schema", NULL};
        static const char *const js_fields[] = {"name", "description", "schema", "strict", NULL};
        const cJSON *js_given = field(rf, "json_schema");
        if ((st = http_json_only_fields(rf, "response_format", rf_fields)) != STATUS_OK) return st;
        if (js_given && strcmp(t->valuestring, "json_schema"))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'response_format.json_schema' is only read with type "
                                 "json_schema, not %.32s", t->valuestring);
        if (cJSON_IsObject(js_given) &&
            (st = http_json_only_fields(js_given, "response_format.json_schema", js_fields)) != STATUS_OK)
            return st;
        if (!strcmp(t->valuestring, "json_object")) st = set_constraint(r, CONSTRAINT_JSON_OBJECT, rf, "response_format");
        else if (!strcmp(t->valuestring, "json_schema")) {
            const cJSON *js = field(rf, "json_schema"), *schema = js && cJSON_IsObject(js) ? field(js, "schema") : NULL;
            if (!cJSON_IsObject(js)) return type_error("response_format.json_schema", "an object with a 'schema'");
            /* OpenAI accepts a json_schema without a schema: any JSON object then. */
            st = schema ? set_constraint(r, CONSTRAINT_JSON_SCHEMA, schema, "response_format.json_schema.schema")
                        : set_constraint(r, CONSTRAINT_JSON_OBJECT, js, "response_format.json_schema");
        } else if (strcmp(t->valuestring, "text"))
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "'response_format.type' must be text, json_object or json_schema; got '%.64s'",
                                 t->valuestring);
        if (st != STATUS_OK) return st;
    }
    static const struct {
        const char *name, *so;
        enum constraint_kind kind;
    } guided[] = {{"guided_json", "json", CONSTRAINT_JSON_SCHEMA},
                  {"guided_regex", "regex", CONSTRAINT_REGEX},
                  {"guided_choice", "choice", CONSTRAINT_CHOICE},
                  {"guided_grammar", "grammar", CONSTRAINT_GRAMMAR}};
    const cJSON *so = field(o, "structured_outputs");
    if (so && !cJSON_IsObject(so))
        return type_error("structured_outputs", "an object (json, regex, choice, grammar or json_object)");
    for (const cJSON *e = so ? so->child : NULL; e; e = e->next) {
        int found = 0;
        for (size_t i = 0; i < sizeof guided / sizeof *guided && !found; i++)
            if (!strcmp(e->string, guided[i].so)) {
                found = 1;
                if (!cJSON_IsNull(e)) st = set_constraint(r, guided[i].kind, e, "structured_outputs");
            }
        if (!found && !strcmp(e->string, "json_object")) {
            found = 1;
            if (cJSON_IsTrue(e)) st = set_constraint(r, CONSTRAINT_JSON_OBJECT, e, "structured_outputs.json_object");
        }
        if (!found)
            return status_errorf(STATUS_UNSUPPORTED, "'structured_outputs.%.64s' is not supported by this server "
                                 "(json, regex, choice, grammar, json_object are)", e->string);
        if (st != STATUS_OK) return st;
    }
    for (size_t i = 0; i < sizeof guided / sizeof *guided; i++) {
        const cJSON *v = field(o, guided[i].name);
        if (v && (st = set_constraint(r, guided[i].kind, v, guided[i].name)) != STATUS_OK) return st;
    }
    return STATUS_OK;
}

/* OpenAI and vLLM fields this server does not honour (suffix, best_of, the legacy functions): a
 * request that sets one is refused by name, never answered as if the field were not there.
 * Absent, null, or the value that asks for nothing special is accepted. */
static enum status refuse_unhonoured(const cJSON *o, int is_chat, const struct http_chat_caps *caps)
{
    static const char *const always[] = {"functions", "function_call", "suffix", "reasoning_format"};
    for (size_t i = 0; i < sizeof always / sizeof always[0]; i++)
        if (field(o, always[i]))
            return status_errorf(STATUS_UNSUPPORTED, "'%s' is not supported by this server", always[i]);
    if (field(o, "reasoning_effort") && !(is_chat && caps && caps->jinja && caps->effort))
        return status_errorf(STATUS_UNSUPPORTED, "'reasoning_effort' is not supported by this server: the served "
                             "model's chat template does not read it (GPT-OSS's does)");
    const cJSON *best = field(o, "best_of");
    if (best && !(cJSON_IsNumber(best) && best->valuedouble == 1.0))
        return status_errorf(STATUS_UNSUPPORTED, "'best_of' other than 1 is not supported by this server");
    return STATUS_OK;
}

/* The fields a completions or chat body may have (any other is refused by name, never ignored):
 * those parsed here and in http_tools.c (which refuses the chat-only ones on completions with a
 * message of their own), plus client fields that ask nothing of the output, checked by
 * check_client_fields. Refused by name before this: refuse_unhonoured's. */
static const char *const body_fields[] = {
    "model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "max_tokens", "n", "min_tokens", "ignore_eos", "stop",
    "stop_token_ids", "logit_bias", "user", "priority", "logprobs", "response_format", "structured_outputs",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "skip_special_tokens", "speculative",
    "speculative.n_max", "speculative.p_min", "best_of", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
    "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "modalities",
    "guided_decoding_backend", "cache_salt", NULL};
static const char *const completion_fields[] = {"prompt", "echo", NULL};
static const char *const chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs", "reasoning_effort", NULL};

static enum status only_body_fields(const cJSON *o, int is_chat)
{
    for (const cJSON *e = o->child; e; e = e->next)
        if (!http_json_listed(body_fields, e->string) && !http_json_listed(is_chat ? chat_fields : completion_fields, e->string))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%.64s: unknown field (not supported by this server%s)",
                                 e->string, http_json_listed(is_chat ? completion_fields : chat_fields, e->string)
                                                ? is_chat ? " in chat; it is /v1/completions'" : " in completions; it is /v1/chat/completions'"
                                                : "");
    return STATUS_OK;
}

/* Client fields that change nothing of the output when they ask for what this server does:
 * metadata (an object of strings; kept by OpenAI with stored completions), store (false: this
 * server keeps no chat completions), service_tier (auto or default), prompt_cache_key and
 * safety_identifier (hints: the prefix cache needs no key), modalities (["text"]), vLLM's
 * guided_decoding_backend (which engine follows the grammar: this server has one). */
static enum status check_client_fields(const cJSON *o)
{
    const cJSON *v = field(o, "metadata");
    if (v && !cJSON_IsObject(v)) return type_error("metadata", "an object of strings");
    for (const cJSON *e = v ? v->child : NULL; e; e = e->next)
        if (!cJSON_IsString(e)) return type_error("metadata", "an object of strings");
    v = field(o, "store");
    if (v && !cJSON_IsBool(v)) return type_error("store", "a boolean");
    if (cJSON_IsTrue(v))
        return status_errorf(STATUS_UNSUPPORTED, "'store': true is not supported by this server (it keeps no "
                             "completions)");
    v = field(o, "service_tier");
    if (v && !cJSON_IsString(v)) return type_error("service_tier", "a string");
    if (v && strcmp(v->valuestring, "auto") && strcmp(v->valuestring, "default"))
        return status_errorf(STATUS_UNSUPPORTED, "'service_tier' '%.32s' is not supported by this server (auto and "
                             "default are)", v->valuestring);
    static const char *const strings[] = {"prompt_cache_key", "safety_identifier", "guided_decoding_backend"};
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
        if ((v = field(o, strings[i])) && !cJSON_IsString(v)) return type_error(strings[i], "a string");
    v = field(o, "modalities");
    if (v && !cJSON_IsArray(v)) return type_error("modalities", "a list of strings");
    for (const cJSON *e = v ? v->child : NULL; e; e = e->next)
        if (!cJSON_IsString(e) || strcmp(e->valuestring, "text"))
            return status_errorf(STATUS_UNSUPPORTED, "'modalities' other than [\"text\"] are not supported by this "
                                 "server");
    return STATUS_OK;
}

/* vLLM's skip_special_tokens (default true); false shows them (request_params.show_special),
 * refused where the reply is parsed or constrained (http_show_special_check). */
static enum status parse_skip_special(const cJSON *o, struct http_request *q)
{
    int skip = 1;
    enum status st = get_bool(o, "skip_special_tokens", &skip);
    q->r.params.show_special = !skip;
    if (st == STATUS_OK) st = http_show_special_check(&q->r.params, q->tools, q->reasoning, "'skip_special_tokens': false");
    return st;
}

/* Per-request speculative decoding (docs/speculative.md): "speculative": "auto" | "off", and
 * llama.cpp's "speculative.n_max" (the most drafts a step verifies; 0 turns drafting off, as in
 * llama.cpp) and "speculative.p_min" (a draft model's least confidence to go on drafting). */
static enum status parse_speculative(const cJSON *o, struct request_params *p)
{
    const cJSON *v = field(o, "speculative");
    if (v && !cJSON_IsString(v)) return type_error("speculative", "a string (auto or off)");
    enum status st = speculative_mode_parse(v ? v->valuestring : NULL, "'speculative'", &p->speculative);
    if (st != STATUS_OK) return st;
    int n_max = -1;
    if ((st = get_int(o, "speculative.n_max", &n_max)) != STATUS_OK) return st;
    if (n_max == 0) p->speculative = SPECULATIVE_MODE_OFF;
    else if (n_max > 0) p->speculative_n_max = n_max;
    else if (field(o, "speculative.n_max"))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'speculative.n_max' must be >= 0, got %d", n_max);
    if (field(o, "speculative.p_min")) {
        float p_min = -1.0f;
        if ((st = get_float(o, "speculative.p_min", &p_min)) != STATUS_OK) return st;
        if (!(p_min >= 0.0f && p_min <= 1.0f))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'speculative.p_min' must be in [0, 1], got %g", (double)p_min);
        p->speculative_p_min = p_min;
    }
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
    if (st == STATUS_OK) st = get_count(o, "max_tokens", &p->max_tokens);
    if (st == STATUS_OK && q->is_chat) st = get_count(o, "max_completion_tokens", &p->max_tokens);
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
    const cJSON *salt = field(o, "cache_salt"); /* vLLM's: the prefix cache shared within one salt */
    if (st == STATUS_OK && salt && !cJSON_IsString(salt)) st = type_error("cache_salt", "a string");
    if (st == STATUS_OK && salt) {
        const size_t n = strlen(salt->valuestring);
        if (n == 0 || n > REQUEST_MAX_CACHE_SALT_BYTES)
            return status_errorf(STATUS_INVALID_ARGUMENT, "'cache_salt' must be 1 to %d bytes, got %zu",
                                 REQUEST_MAX_CACHE_SALT_BYTES, n);
        if (!(q->r.cache_salt = strdup(salt->valuestring)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        p->cache_salt = q->r.cache_salt;
    }
    if (st == STATUS_OK) st = get_int(o, "priority", &p->priority); /* vLLM's extra field */
    if (st == STATUS_OK) st = parse_speculative(o, p);
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
    /* include_obfuscation (OpenAI: random padding in stream events) asks for nothing here. */
    static const char *const so_fields[] = {"include_usage", "include_obfuscation", NULL};
    if (st == STATUS_OK && so) st = http_json_only_fields(so, "stream_options", so_fields);
    if (st == STATUS_OK && so && !q->stream) /* (OpenAI's answer too: it would be ignored) */
        st = status_errorf(STATUS_INVALID_ARGUMENT, "'stream_options' is only allowed when 'stream' is true");
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

enum status http_parse_request(const char *body, size_t len, int is_chat, const char *served_model,
                               const char *const *adapters, int n_adapters, const struct http_chat_caps *caps,
                               struct http_request *q)
{
    memset(q, 0, sizeof *q);
    q->r.params = request_params_default();
    q->is_chat = is_chat;
    cJSON *o = NULL;
    enum status st = http_json_parse_body(body, len, &o);
    if (st == STATUS_OK) st = refuse_unhonoured(o, is_chat, caps);
    if (st == STATUS_OK) st = only_body_fields(o, is_chat);
    if (st == STATUS_OK) st = check_client_fields(o);
    if (st == STATUS_OK) st = parse_model(field(o, "model"), served_model, adapters, n_adapters, &q->r);
    if (st == STATUS_OK) st = is_chat ? parse_messages(o, caps, &q->r) : parse_prompt(o, q);
    if (st == STATUS_OK) q->r.add_bos = 1;
    if (st == STATUS_OK) st = parse_sampling(o, q);
    if (st == STATUS_OK) st = parse_shape(o, q);
    if (st == STATUS_OK) st = parse_constraint(o, &q->r);
    if (st == STATUS_OK) st = http_tools_parse(o, caps, q);
    if (st == STATUS_OK) st = http_tools_context(o, NULL, caps, q); /* when the tools did not already */
    q->reasoning = is_chat && caps ? caps->reasoning : 0; /* (the markers' kind, tool_format.h) */
    if (st == STATUS_OK) st = parse_skip_special(o, q);
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
