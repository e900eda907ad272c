/* server/http_route.c - the HTTP front's route table: which URL is which route, which methods
 * each allows (its Allow header), which take a JSON body, which answer errors in Anthropic's
 * shape. Not here: dispatching a route to its handler, and everything decided per request
 * (http.c). Tests: tests/server/test_http.py (errors: unknown route 404, a GET on a POST route
 * 405). */
#include <string.h>

#include "http_internal.h"

/* The URL as it came (no percent-decoding: http.c's unescape_none), without its query string. */
enum http_route http_route_of(const char *url)
{
    if (!strcmp(url, "/v1/completions")) return ROUTE_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return ROUTE_CHAT;
    if (!strcmp(url, "/v1/models")) return ROUTE_MODELS;
    if (!strcmp(url, "/health")) return ROUTE_HEALTH;
    if (!strcmp(url, "/metrics")) return ROUTE_METRICS;
    if (!strcmp(url, "/v1/messages")) return ROUTE_MESSAGES;
    if (!strcmp(url, "/v1/messages/count_tokens")) return ROUTE_COUNT_TOKENS;
    if (!strcmp(url, "/v1/embeddings")) return ROUTE_EMBEDDINGS;
    if (!strcmp(url, "/v1/responses")) return ROUTE_RESPONSES;
    if (!strcmp(url, "/v1/responses/input_tokens")) return ROUTE_RESPONSE_INPUT_TOKENS;
    if (!strcmp(url, "/v1/files") || !strncmp(url, "/v1/files/", 10) || !strncmp(url, "/v1/fine_tuning/jobs", 20))
        return ROUTE_FINETUNE;
    if (!strncmp(url, "/v1/responses/", 14)) {
        size_t n = strlen(url);
        if (n > 12 && !strcmp(url + n - 12, "/input_items")) return ROUTE_RESPONSE_INPUT_ITEMS;
        return n > 7 && !strcmp(url + n - 7, "/cancel") ? ROUTE_RESPONSE_CANCEL : ROUTE_RESPONSE_ITEM;
    }
    return ROUTE_NONE;
}

/* The POST routes with a JSON body (embeddings included: keys, content type and length are
 * checked alike). */
int http_route_generates(enum http_route r)
{
    return r == ROUTE_COMPLETIONS || r == ROUTE_CHAT || r == ROUTE_MESSAGES || r == ROUTE_COUNT_TOKENS ||
           r == ROUTE_EMBEDDINGS || r == ROUTE_RESPONSES || r == ROUTE_RESPONSE_INPUT_TOKENS;
}

/* Whether errors go out in Anthropic's shape. */
int http_route_anthropic(enum http_route r) { return r == ROUTE_MESSAGES || r == ROUTE_COUNT_TOKENS; }

/* The Allow header of a route: generation is POST, the rest GET (and HEAD, which
 * libmicrohttpd answers as GET without the body). */
const char *http_route_allow(enum http_route r)
{
    if (r == ROUTE_RESPONSE_ITEM) return "GET, HEAD, DELETE";
    if (r == ROUTE_FINETUNE) return "GET, HEAD, POST, DELETE";
    return http_route_generates(r) || r == ROUTE_RESPONSE_CANCEL ? "POST" : "GET, HEAD";
}

int http_route_method_allowed(enum http_route r, const char *method)
{
    if ((r == ROUTE_RESPONSE_ITEM || r == ROUTE_FINETUNE) && !strcmp(method, "DELETE")) return 1;
    if (r == ROUTE_FINETUNE && !strcmp(method, "POST")) return 1;
    if (http_route_generates(r) || r == ROUTE_RESPONSE_CANCEL) return !strcmp(method, "POST");
    return !strcmp(method, "GET") || !strcmp(method, "HEAD");
}
