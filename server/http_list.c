/* server/http_list.c - OpenAI's paged lists (`GET ...?after=ID&limit=N&order=asc|desc`), shared by
 * /v1/responses/{id}/input_items (http_responses_out.c), /v1/files and /v1/fine_tuning/jobs[/{id}/events]
 * (http_finetune.c): the query read once (every parameter not named by the route refused by
 * name), a listing cut after an id, at most limit items, with has_more, first_id and last_id.
 * Tests: tests/server/test_responses.py (input items), tests/server/test_finetune.py. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base.h"
#include "http_internal.h"

/* 1 when name is one of the comma-separated names in list (never the empty name: `?=1` has one,
 * and strstr finds "" at every position: the loop did not advance). */
static int named(const char *list, const char *name)
{
    const size_t n = strlen(name);
    if (n == 0) return 0;
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
            return 1;
    return 0;
}

enum status http_list_options(const struct http_query *q, const char *allowed, int limit_default, int limit_max,
                              struct http_list *o)
{
    *o = (struct http_list){.limit = limit_default, .desc = 1};
    if (q->more) return status_errorf(STATUS_INVALID_ARGUMENT, "too many query parameters (at most %d)", HTTP_MAX_QUERY);
    for (int i = 0; i < q->n; i++) {
        const char *k = q->key[i], *v = q->value[i];
        if (!named(allowed, k))
            return status_errorf(STATUS_UNSUPPORTED, "the query parameter '%.64s' is not supported by this server "
                                                     "(here: %s)", k, allowed[0] ? allowed : "none");
        if (!strcmp(k, "after")) {
            o->after = v;
        } else if (!strcmp(k, "limit")) {
            char *end = NULL;
            const long n = strtol(v, &end, 10);
            if (!v[0] || *end || n < 1 || n > limit_max)
                return status_errorf(STATUS_INVALID_ARGUMENT, "'limit' must be an integer in [1, %d], got '%.32s'",
                                     limit_max, v);
            o->limit = (int)n;
        } else if (!strcmp(k, "order")) {
            if (strcmp(v, "asc") && strcmp(v, "desc"))
                return status_errorf(STATUS_INVALID_ARGUMENT, "'order' must be asc or desc, got '%.32s'", v);
            o->desc = !strcmp(v, "desc");
        } else if (!strcmp(k, "purpose")) {
            o->purpose = v;
        } else {
            return status_errorf(STATUS_UNSUPPORTED, "the query parameter '%.64s' is not supported by this server", k);
        }
    }
    return STATUS_OK;
}

enum status http_list_page(cJSON *items, const struct http_list *o, const char *what, cJSON **out)
{
    *out = NULL;
    const int n = cJSON_GetArraySize(items);
    int start = 0; /* the position, in the listing's order, of its first item */
    if (o->after) {
        int k = 0;
        for (; k < n; k++) {
            const char *id = cJSON_GetStringValue(
                cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(items, o->desc ? k : n - 1 - k), "id"));
            if (id && !strcmp(id, o->after)) break;
        }
        if (k == n) {
            cJSON_Delete(items);
            return status_errorf(STATUS_INVALID_ARGUMENT, "'after': %s has no item '%.64s'", what, o->after);
        }
        start = k + 1;
    }
    cJSON *list = http_json_ok(cJSON_CreateObject());
    cJSON_AddStringToObject(list, "object", "list");
    cJSON *data = http_json_ok(cJSON_AddArrayToObject(list, "data"));
    int k = start;
    cJSON *last = NULL;
    for (; k < n && k - start < o->limit; k++)
        cJSON_AddItemToArray(data, last = http_json_dup(cJSON_GetArrayItem(items, o->desc ? k : n - 1 - k)));
    const cJSON *first = data->child;
    cJSON_AddItemToObject(list, "first_id", first ? http_json_dup(cJSON_GetObjectItemCaseSensitive(first, "id"))
                                                  : http_json_ok(cJSON_CreateNull()));
    cJSON_AddItemToObject(list, "last_id", last ? http_json_dup(cJSON_GetObjectItemCaseSensitive(last, "id"))
                                                : http_json_ok(cJSON_CreateNull()));
    cJSON_AddBoolToObject(list, "has_more", k < n);
    cJSON_Delete(items);
    *out = list;
    return STATUS_OK;
}
