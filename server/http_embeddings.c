/* server/http_embeddings.c - OpenAI's POST /v1/embeddings: the request JSON (input as a string,
 * a list of strings, a list of token ids or a list of such lists; model; encoding_format float or
 * base64; dimensions only as the model's own width; shardlm's pooling and normalize), tokenized
 * here (an encoder's [CLS] ... [SEP] through the tokenizer's template, a decoder's BOS) and run by
 * engine_embed; the response list with its usage.
 * Not here: routing, keys and the status-to-HTTP mapping (http.c), the forward pass and pooling
 * (engine/serving/conductor_embed.c, engine/model/model.c).
 * Tests: tests/server/test_embeddings.py (the official openai package, against a float64 NumPy
 * forward of all-MiniLM-L6-v2; bad input). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"
#include "tokenizer.h"

#define HTTP_MAX_EMBED_INPUTS 2048 /* OpenAI's limit on the inputs of one request */

/* The inputs as token sequences: input i is ids[offsets[i] .. offsets[i+1]). */
struct embed_inputs {
    int32_t *ids;
    int32_t *offsets; /* (n + 1) */
    int      n;
    size_t   cap;
};

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

/* Appends one input of n ids. */
static enum status push_input(struct embed_inputs *in, const int32_t *ids, int n)
{
    const size_t have = (size_t)in->offsets[in->n];
    if (have + (size_t)n > in->cap) {
        size_t cap = in->cap ? in->cap : 1024;
        while (cap < have + (size_t)n) cap *= 2;
        int32_t *p = realloc(in->ids, cap * sizeof *p);
        if (!p) return oom();
        in->ids = p;
        in->cap = cap;
    }
    if (n > 0) memcpy(in->ids + have, ids, (size_t)n * sizeof *ids);
    in->offsets[in->n + 1] = (int32_t)(have + (size_t)n);
    in->n++;
    return STATUS_OK;
}

/* One element of `input`: a string (tokenized) or, when ids_ok, a list of token ids. An
 * empty one is refused by the engine with its index (engine_embed), or here for a string. */
static enum status parse_one(struct server *s, const cJSON *e, int index, int ids_ok, struct embed_inputs *in)
{
    if (cJSON_IsString(e)) {
        const size_t len = strlen(e->valuestring);
        if (len == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d] is an empty string", index);
        int32_t *ids = NULL;
        int n = 0;
        enum status st = tokenizer_encode(engine_tokenizer(s->engine), e->valuestring, len, 1, &ids, &n);
        if (st == STATUS_OK) st = push_input(in, ids, n);
        free(ids);
        return st;
    }
    if (!ids_ok || !cJSON_IsArray(e))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'input' must be a string, a list of strings, a list of token ids "
                             "or a list of lists of token ids (input[%d] is none of these)", index);
    const int n = cJSON_GetArraySize(e);
    int32_t *ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (!ids) return oom();
    int k = 0;
    for (const cJSON *t = e->child; t; t = t->next, k++) {
        if (!cJSON_IsNumber(t) || t->valuedouble != (double)(int32_t)t->valuedouble) {
            free(ids);
            return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d][%d] must be an integer token id", index, k);
        }
        ids[k] = (int32_t)t->valuedouble;
    }
    enum status st = push_input(in, ids, n);
    free(ids);
    return st;
}

/* `input` in any of its four shapes. */
static enum status parse_input(struct server *s, const cJSON *input, struct embed_inputs *in)
{
    if (!input) return status_errorf(STATUS_INVALID_ARGUMENT, "'input' is required");
    const int n = cJSON_IsArray(input) ? cJSON_GetArraySize(input) : 1;
    if (cJSON_IsArray(input) && n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "'input' is an empty list");
    if (n > HTTP_MAX_EMBED_INPUTS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "'input' has %d items, more than %d", n, HTTP_MAX_EMBED_INPUTS);
    /* A flat list of numbers is one input of token ids. */
    const int one_ids = cJSON_IsArray(input) && cJSON_IsNumber(input->child);
    if (!(in->offsets = calloc((size_t)(one_ids ? 1 : n) + 1, sizeof *in->offsets))) return oom();
    if (!cJSON_IsArray(input) || one_ids) return parse_one(s, input, 0, one_ids, in);
    int i = 0;
    enum status st = STATUS_OK;
    for (const cJSON *e = input->child; e && st == STATUS_OK; e = e->next, i++) st = parse_one(s, e, i, 1, in);
    return st;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* The d floats of v as little-endian f32 bytes in standard base64 (what the openai package
 * decodes with numpy.frombuffer(..., dtype="float32")); malloc'd, NUL-terminated. */
static char *base64_floats(const float *v, int d)
{
    const size_t n = (size_t)d * 4;
    unsigned char *bytes = malloc(n);
    char *out = malloc((n + 2) / 3 * 4 + 1);
    if (!bytes || !out) {
        free(bytes);
        free(out);
        return NULL;
    }
    for (int i = 0; i < d; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) bytes[4 * i + b] = (unsigned char)(u >> (8 * b));
    }
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        const uint32_t w = (uint32_t)bytes[i] << 16 | (i + 1 < n ? (uint32_t)bytes[i + 1] << 8 : 0) |
                           (i + 2 < n ? bytes[i + 2] : 0);
        out[o++] = b64[w >> 18 & 63];
        out[o++] = b64[w >> 12 & 63];
        out[o++] = i + 1 < n ? b64[w >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[w & 63] : '=';
    }
    out[o] = '\0';
    free(bytes);
    return out;
}

/* The response: {"object": "list", "data": [...], "model", "usage"}; NULL when out of memory. */
static char *response_json(const char *model, const float *vecs, int n, int d, int base64, int tokens)
{
    cJSON *root = cJSON_CreateObject(), *data = cJSON_AddArrayToObject(root, "data");
    int ok = root && data && cJSON_AddStringToObject(root, "object", "list");
    for (int i = 0; i < n && ok; i++) {
        cJSON *e = cJSON_CreateObject();
        ok = e && cJSON_AddItemToArray(data, e) && cJSON_AddStringToObject(e, "object", "embedding") &&
             cJSON_AddNumberToObject(e, "index", i);
        if (ok && base64) {
            char *text = base64_floats(vecs + (size_t)i * (size_t)d, d);
            ok = text && cJSON_AddStringToObject(e, "embedding", text);
            free(text);
        } else if (ok) {
            cJSON *arr = cJSON_AddArrayToObject(e, "embedding");
            for (int j = 0; j < d && (ok = arr != NULL); j++)
                ok = cJSON_AddItemToArray(arr, cJSON_CreateNumber(vecs[(size_t)i * (size_t)d + (size_t)j]));
        }
    }
    cJSON *usage = ok ? cJSON_AddObjectToObject(root, "usage") : NULL;
    ok = ok && cJSON_AddStringToObject(root, "model", model) && usage &&
         cJSON_AddNumberToObject(usage, "prompt_tokens", tokens) && cJSON_AddNumberToObject(usage, "total_tokens", tokens);
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return json;
}

/* Whether the JSON text escapes a NUL (\u0000) inside a string: cJSON would end the string there
 * and embed a prefix of what was sent. A backslash always starts an escape in valid JSON. */
static int escapes_nul(const char *body, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (body[i] != '\\') continue;
        if (body[i + 1] == 'u' && i + 5 < len && !strncmp(body + i + 2, "0000", 4)) return 1;
        i++; /* the escaped character */
    }
    return 0;
}

/* The body as one JSON object with one reading: valid UTF-8, nothing but whitespace after it, no
 * escaped NUL. *o is NULL on error. */
static enum status parse_body(const char *body, size_t len, cJSON **o)
{
    *o = NULL;
    if (!utf8_valid(body, len)) return status_errorf(STATUS_INVALID_ARGUMENT, "the request body is not valid UTF-8");
    if (memchr(body, 0, len) || escapes_nul(body, len))
        return status_errorf(STATUS_INVALID_ARGUMENT, "the request body holds a NUL character (\\u0000) in a string");
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!v) return status_errorf(STATUS_INVALID_ARGUMENT, "the request body is not valid JSON");
    size_t rest = end ? len - (size_t)(end - body) : 0;
    while (rest && *end && strchr(" \t\r\n", *end)) end++, rest--;
    if (rest || !cJSON_IsObject(v)) {
        cJSON_Delete(v);
        return rest ? status_errorf(STATUS_INVALID_ARGUMENT, "the request body has %zu bytes after its JSON value", rest)
                    : status_errorf(STATUS_INVALID_ARGUMENT, "the request body must be a JSON object");
    }
    *o = v;
    return STATUS_OK;
}

/* The request's options, every member checked: unknown ones are refused by name, and a name
 * given twice too (cJSON reads the first, other parsers the last). */
struct embed_options {
    int base64, normalize;
    enum embed_pooling pooling;
};

static enum status parse_options(struct server *s, const cJSON *o, const struct engine_model_info *info,
                                 struct embed_options *opt)
{
    *opt = (struct embed_options){.normalize = 1, .pooling = EMBED_POOLING_DEFAULT};
    static const char *const known[] = {"input", "model", "encoding_format", "dimensions", "user", "pooling", "normalize"};
    int seen[sizeof known / sizeof known[0]] = {0};
    for (const cJSON *e = o->child; e; e = e->next) {
        size_t i = 0;
        while (i < sizeof known / sizeof known[0] && strcmp(e->string, known[i])) i++;
        if (i == sizeof known / sizeof known[0])
            return status_errorf(STATUS_INVALID_ARGUMENT, "unknown field '%.64s' (see docs/embeddings.md)", e->string);
        if (seen[i]++)
            return status_errorf(STATUS_INVALID_ARGUMENT, "the member name '%s' appears twice in one object", known[i]);
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return status_errorf(STATUS_INVALID_ARGUMENT, "'model' must be a string");
        if (strcmp(v->valuestring, s->model_id))
            return status_errorf(STATUS_NOT_FOUND, "The model '%.128s' does not exist (this server embeds with '%s'; "
                                 "adapters do not embed)", v->valuestring, s->model_id);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "encoding_format");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "float") && strcmp(v->valuestring, "base64")))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'encoding_format' must be \"float\" or \"base64\"");
        opt->base64 = !strcmp(v->valuestring, "base64");
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "dimensions");
    if (v && !cJSON_IsNull(v) && !(cJSON_IsNumber(v) && v->valuedouble == (double)info->d_model))
        return status_errorf(STATUS_UNSUPPORTED, "'dimensions' other than the model's own %d is not supported by this "
                             "server", info->d_model);
    v = cJSON_GetObjectItemCaseSensitive(o, "user"); /* generation uses it for fair scheduling; embeddings run FIFO */
    if (v && !cJSON_IsNull(v))
        return status_errorf(STATUS_UNSUPPORTED, "'user' is not used by /v1/embeddings (passes run in arrival order); "
                             "leave it out");
    v = cJSON_GetObjectItemCaseSensitive(o, "normalize");
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) return status_errorf(STATUS_INVALID_ARGUMENT, "'normalize' must be true or false");
        opt->normalize = cJSON_IsTrue(v);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "pooling");
    if (v && !cJSON_IsNull(v)) {
        static const char *const names[] = {[EMBED_POOLING_MEAN] = "mean", [EMBED_POOLING_CLS] = "cls",
                                            [EMBED_POOLING_LAST] = "last"};
        int p = EMBED_POOLING_MEAN;
        while (p <= EMBED_POOLING_LAST && !(cJSON_IsString(v) && !strcmp(v->valuestring, names[p]))) p++;
        if (p > EMBED_POOLING_LAST) return status_errorf(STATUS_INVALID_ARGUMENT, "'pooling' must be \"mean\", \"cls\" or \"last\"");
        opt->pooling = (enum embed_pooling)p;
    }
    return STATUS_OK;
}

enum status http_embeddings(struct server *s, const char *body, size_t len, char **json)
{
    *json = NULL;
    struct engine_model_info info;
    engine_get_model_info(s->engine, &info);
    cJSON *o = NULL;
    struct embed_inputs in = {0};
    struct embed_options opt;
    float *vecs = NULL;
    enum status st = parse_body(body, len, &o);
    if (st == STATUS_OK) st = parse_options(s, o, &info, &opt);
    if (st == STATUS_OK) st = parse_input(s, cJSON_GetObjectItemCaseSensitive(o, "input"), &in);
    if (st == STATUS_OK && !(vecs = malloc((size_t)in.n * (size_t)info.d_model * sizeof *vecs))) st = oom();
    if (st == STATUS_OK) st = engine_embed(s->engine, in.ids, in.offsets, in.n, opt.pooling, opt.normalize, vecs);
    if (st == STATUS_OK && !(*json = response_json(s->model_id, vecs, in.n, info.d_model, opt.base64, in.offsets[in.n])))
        st = oom();
    cJSON_Delete(o);
    free(in.ids);
    free(in.offsets);
    free(vecs);
    return st;
}
