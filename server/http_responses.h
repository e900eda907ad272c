/* server/http_responses.h - what the two files of OpenAI's Responses API share (private to them):
 *
 *   http_responses.c      POST /v1/responses requests: fields checked by name, input items and
 *                         previous_response_id turned into the chat request; the store of
 *                         responses (bounded, least recently used out first)
 *   http_responses_out.c  Response objects and output items, stream events, GET / DELETE
 *                         /v1/responses/{id} and POST /v1/responses/{id}/cancel
 *
 * The functions the rest of the HTTP front calls are declared in http_internal.h.
 * Tests: tests/server/test_responses.py. */
#ifndef SHARDLM_HTTP_RESPONSES_H
#define SHARDLM_HTTP_RESPONSES_H

#include <cjson/cJSON.h>

#include "http_internal.h"

/* The kinds of output items, in the order a reply holds them. */
enum responses_item { RESPONSES_ITEM_REASONING = 1, RESPONSES_ITEM_MESSAGE, RESPONSES_ITEM_CALL };

/* One /v1/responses request: what its Response object repeats and what the store keeps. Owned
 * by its struct http_request (freed by http_responses_free). The stream fields are guarded by
 * the http_gen's mutex. */
struct http_responses {
    char        id[48];       /* "resp_" and 24 hex digits, random */
    long long   created;      /* Unix seconds */
    int         store;        /* kept for GET and previous_response_id */
    atomic_int  cancelled;    /* POST .../cancel asked for it */
    cJSON      *echo;         /* the request fields a Response object repeats (instructions,
                                 metadata, tools, tool_choice, text, reasoning, ...) */
    cJSON      *items;        /* the conversation's input items: the previous responses' inputs
                                 and outputs first, then this request's input */
    char       *chat;         /* the equivalent chat request, JSON (the journal keeps it) */
    /* a stream's state (http_responses_out.c) */
    int         seq;          /* the next sequence_number */
    int         started;      /* response.created went out */
    int         open, kind;   /* an item is open, and its kind (enum responses_item) */
    int         index;        /* the open (or last) item's output_index; -1 before any */
    char       *acc;          /* the open item's text or arguments so far */
    size_t      acc_len, acc_cap;
    char        call_id[128], call_name[80]; /* the open function call's */
    cJSON      *output;       /* the items closed so far */
};

/* The store of responses (http_responses.c). */
struct http_responses_store;

/* The stored Response object (malloc'd JSON) and input items of id, when owner may see it
 * (owner: "" without API keys, else the key's client name). STATUS_NOT_FOUND otherwise, naming
 * the id; STATUS_FAILED_PRECONDITION while it is still in progress (want_done). Either out may
 * be NULL. */
enum status responses_store_get(struct http_responses_store *st, const char *id, const char *owner, int want_done,
                                char **response, char **items);
/* Records g's Response object (taken), final when done; wakes those waiting for it. */
void        responses_store_put(struct http_responses_store *st, struct http_gen *g, char *response, int done);
/* Removes id (STATUS_NOT_FOUND as responses_store_get). */
enum status responses_store_delete(struct http_responses_store *st, const char *id, const char *owner);
/* Cancels id while it is in progress and waits (a few seconds at most) for its final object,
 * returned malloc'd in *response. STATUS_FAILED_PRECONDITION when it already ended otherwise
 * than cancelled. */
enum status responses_store_cancel(struct http_responses_store *st, const char *id, const char *owner,
                                   char **response);

/* The Response object of g (http_responses_out.c): status "in_progress", "completed",
 * "incomplete", "cancelled" or "failed"; output taken (NULL: an empty list). */
cJSON *responses_object(const struct http_gen *g, const char *status, cJSON *output);

#endif
