/* server/http_json.c - reading and writing the JSON of HTTP bodies: a body parsed to one
 * reading (valid UTF-8, one JSON object and nothing after it, no NUL in a string, no member name
 * twice in one object), fields that are absent when null, the allowed-member check that refuses
 * the rest by name, and the allocation-checked builders. Not here: what any route's fields mean
 * (http_openai.c, http_responses.c, http_anthropic.c, ...). Tests: tests/server/test_http.py
 * (http_malformed). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "http_internal.h"

const cJSON *http_json_field(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

int http_json_listed(const char *const *list, const char *name)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], name)) return 1;
    return 0;
}

enum status http_json_only_fields(const cJSON *o, const char *where, const char *const *allowed)
{
    for (const cJSON *e = o->child; e; e = e->next) {
        if (!http_json_listed(allowed, e->string))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%s%s%.64s: unknown field (not supported by this server)",
                                 where, where[0] ? "." : "", e->string);
    }
    return STATUS_OK;
}

cJSON *http_json_ok(cJSON *j)
{
    CHECK(j, "out of memory building JSON");
    return j;
}

char *http_json_print(cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    CHECK(s, "out of memory printing JSON");
    cJSON_Delete(o);
    return s;
}

cJSON *http_json_dup(const cJSON *v)
{
    cJSON *d = cJSON_Duplicate(v, 1);
    CHECK(d, "out of memory");
    return d;
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

enum status http_json_parse_body(const char *body, size_t len, cJSON **out)
{
    *out = NULL;
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
    if (st != STATUS_OK) cJSON_Delete(o);
    else *out = o;
    return st;
}
