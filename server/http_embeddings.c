/* server/http_embeddings.c - OpenAI's POST /v1/embeddings: the request JSON (input as a string,
 * a list of strings, a list of token ids or a list of such lists; model; encoding_format float or
 * base64; dimensions only as the model's own width; shardlm's pooling and normalize) parsed into
 * the struct embed_request that gRPC Embed also makes, run by embed.c (the checks, tokenization
 * and engine_embed of both fronts); the response list with its usage.
 * Not here: routing, keys and the status-to-HTTP mapping (http.c), the checks both fronts share
 * (embed.c), the forward pass and pooling (engine/serving/conductor_embed.c, model.c).
 * Tests: tests/server/test_embeddings.py (the official openai package, against a float64 NumPy
 * forward of all-MiniLM-L6-v2; bad input). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory"); }

/* One element of `input` into it: a string or, when ids_ok, a list of token ids. */
static enum status parse_one(const cJSON *e, int index, int ids_ok, struct embed_item *it)
{
    if (cJSON_IsString(e)) {
        it->text_len = strlen(e->valuestring);
        return (it->text = strdup(e->valuestring)) ? STATUS_OK : oom();
    }
    if (!ids_ok || !cJSON_IsArray(e))
        return status_errorf(STATUS_INVALID_ARGUMENT, "'input' must be a string, a list of strings, a list of token ids "
                             "or a list of lists of token ids (input[%d] is none of these)", index);
    const int n = cJSON_GetArraySize(e);
    if (!(it->ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *it->ids))) return oom();
    it->n_ids = n;
    int k = 0;
    for (const cJSON *t = e->child; t; t = t->next, k++) {
        /* (the range first: converting a double outside int32's range is undefined) */
        if (!cJSON_IsNumber(t) || !(t->valuedouble >= INT32_MIN && t->valuedouble <= INT32_MAX) ||
            t->valuedouble != (double)(int32_t)t->valuedouble)
            return status_errorf(STATUS_INVALID_ARGUMENT, "input[%d][%d] must be an integer token id", index, k);
        it->ids[k] = (int32_t)t->valuedouble;
    }
    return STATUS_OK;
}

/* `input` in any of its four shapes into r's items (their count is embed.c's to check). */
static enum status parse_input(const cJSON *input, struct embed_request *r)
{
    if (!input) return status_errorf(STATUS_INVALID_ARGUMENT, "'input' is required");
    /* A flat list of numbers is one input of token ids. */
    const int one_ids = cJSON_IsArray(input) && cJSON_IsNumber(input->child);
    const int n = cJSON_IsArray(input) && !one_ids ? cJSON_GetArraySize(input) : 1;
    enum status st = embed_request_items(r, n);
    if (st != STATUS_OK) return st;
    if (!cJSON_IsArray(input) || one_ids) return parse_one(input, 0, one_ids, r->items);
    int i = 0;
    for (const cJSON *e = input->child; e && st == STATUS_OK; e = e->next, i++) st = parse_one(e, i, 1, &r->items[i]);
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

/* The request's members other than input into r and *base64; unknown ones are refused by name. */
static enum status parse_options(const cJSON *o, int d_model, struct embed_request *r, int *base64)
{
    static const char *const known[] = {"input", "model", "encoding_format", "dimensions", "user", "pooling",
                                        "normalize", NULL};
    enum status st = http_json_only_fields(o, "", known);
    if (st != STATUS_OK) return st;
    r->normalize = 1;
    const cJSON *v = http_json_field(o, "model");
    if (v && !cJSON_IsString(v)) return status_errorf(STATUS_INVALID_ARGUMENT, "'model' must be a string");
    if (v && !(r->model = strdup(v->valuestring))) return oom();
    if ((v = http_json_field(o, "encoding_format"))) {
        if (!cJSON_IsString(v) || (strcmp(v->valuestring, "float") && strcmp(v->valuestring, "base64")))
            return status_errorf(STATUS_INVALID_ARGUMENT, "'encoding_format' must be \"float\" or \"base64\"");
        *base64 = !strcmp(v->valuestring, "base64");
    }
    v = http_json_field(o, "dimensions");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == (double)d_model))
        return status_errorf(STATUS_UNSUPPORTED, "'dimensions' other than the model's own %d is not supported by this "
                             "server", d_model);
    if (http_json_field(o, "user")) /* generation uses it for fair scheduling; embeddings run FIFO */
        return status_errorf(STATUS_UNSUPPORTED, "'user' is not used by /v1/embeddings (passes run in arrival order); "
                             "leave it out");
    if ((v = http_json_field(o, "normalize"))) {
        if (!cJSON_IsBool(v)) return status_errorf(STATUS_INVALID_ARGUMENT, "'normalize' must be true or false");
        r->normalize = cJSON_IsTrue(v);
    }
    if ((v = http_json_field(o, "pooling"))) {
        static const char *const names[] = {[EMBED_POOLING_MEAN] = "mean", [EMBED_POOLING_CLS] = "cls",
                                            [EMBED_POOLING_LAST] = "last"};
        int p = EMBED_POOLING_MEAN;
        while (p <= EMBED_POOLING_LAST && !(cJSON_IsString(v) && !strcmp(v->valuestring, names[p]))) p++;
        if (p > EMBED_POOLING_LAST) return status_errorf(STATUS_INVALID_ARGUMENT, "'pooling' must be \"mean\", \"cls\" or \"last\"");
        r->pooling = (enum embed_pooling)p;
    }
    return STATUS_OK;
}

enum status http_embeddings(struct server *s, const char *body, size_t len, char **json)
{
    *json = NULL;
    struct engine_model_info info = {0};
    cJSON *o = NULL;
    struct embed_request r = {0};
    struct embed_inputs in = {0};
    float *vecs = NULL;
    int base64 = 0;
    struct served_model *m = NULL;
    enum status st = http_json_parse_body(body, len, &o);
    if (st == STATUS_OK) { /* the model first: the dimensions and the tokenizer are its */
        const cJSON *mv = http_json_field(o, "model");
        st = server_acquire(s, cJSON_IsString(mv) ? mv->valuestring : NULL, 1, &m);
    }
    if (st == STATUS_OK) engine_get_model_info(m->engine, &info);
    if (st == STATUS_OK) st = parse_options(o, info.d_model, &r, &base64);
    if (st == STATUS_OK) st = parse_input(cJSON_GetObjectItemCaseSensitive(o, "input"), &r);
    if (st == STATUS_OK) st = embed_run(m, &r, &in, &vecs);
    if (st == STATUS_OK && !(*json = response_json(m->model_id, vecs, in.n, info.d_model, base64, in.offsets[in.n])))
        st = oom();
    embed_observe(s, METRICS_API_HTTP, st, &in);
    cJSON_Delete(o);
    embed_request_free(&r);
    embed_inputs_free(&in);
    free(vecs);
    server_release(s, m);
    return st;
}
