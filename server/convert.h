/* server/convert.h - the protobuf edge of the server: request bytes become native structs
 * (parsed, not range-checked: the engine owns every numeric limit, in one table that
 * engine_validate applies; see engine/serving/request.h), and native results become response
 * bytes. This file, convert*.c and wire.c are the only ones that see
 * protobuf-c types; the rest of the server, and the engine, never do.
 * Not here: model-dependent checks (engine_validate), tokenization and chat templates
 * (server.c, chat_template.c), gRPC itself (server.c).
 * Tests: tests/server/test_server.py (every method, and the table of invalid requests).
 *
 * Errors: parsing functions return STATUS_INVALID_ARGUMENT for bytes that are not the expected
 * message, or for what only the edge checks (UTF-8, U+0000 in any string (wire.h), chat roles,
 * sizes of the raw prompt, printable request ids), with a message naming the field. Encoding functions return a malloc'd buffer in *out (caller frees) of
 * *len bytes, or STATUS_RESOURCE_EXHAUSTED. */
#ifndef SHARDLM_CONVERT_H
#define SHARDLM_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "engine.h"
#include "request.h"

/* The one limit of the edge itself: raw prompt text (or ids, or chat contents) per request,
 * checked before tokenization (documented in text_generation.proto). */
#define CONVERT_MAX_PROMPT_BYTES   (1 << 20)
/* The API's default for an unset max_tokens. */
#define CONVERT_DEFAULT_MAX_TOKENS 128
/* The largest logprobs the engine accepts by default (request.h), for GetModelInfo. */
#define CONVERT_MAX_LOGPROBS       REQUEST_DEFAULT_MAX_LOGPROBS

/* 1 when s[0..len) is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF). */
int utf8_valid(const char *s, size_t len);

/* A GenerateRequest or ChatRequest after conversion. Owns every array it points to; free with
 * gen_request_free. params.stop, params.stop_token_ids and params.logit_bias_* point into
 * the arrays below; params.deadline is left 0 (the caller sets it from the call). */
struct gen_request {
    char    *request_id;          /* "" when the client left it empty */
    char    *prompt;              /* Generate with a text prompt; NULL otherwise */
    size_t   prompt_len;
    int32_t *prompt_ids;          /* (n_prompt_ids) Generate with token ids; NULL otherwise */
    int      n_prompt_ids;
    int      add_bos;
    struct chat_message *messages;/* (n_messages) Chat only */
    int      n_messages;
    struct request_params params;
    char   **stop;                /* (n_stop + 1): room for a template's extra stop string */
    int      n_stop;
    int32_t *stop_token_ids;      /* (n_stop_token_ids + 1) */
    int      n_stop_token_ids;
    int32_t *bias_ids;            /* (n_bias) */
    float   *bias_values;         /* (n_bias) */
    int      n_bias;
    char    *adapter;             /* the name the request gave (an adapter's, or the served model's
                                     id); NULL = none. gen_resolve_adapter sets params.adapter */
    char    *constraint;          /* (constraint_len) the structured-output source params.constraint
                                     points to (a schema, regex, grammar or choice list); NULL: none */
    size_t   constraint_len;
    char    *client;              /* who asked, for --scheduling-policy fair (params.client points
                                     here); NULL: the caller sets it (gRPC: from the call) */
    char    *cache_salt;          /* HTTP's cache_salt (params.cache_salt points here); NULL: none */
    /* Chat with a Jinja template (server/http_tools.c; gRPC through chat_tools.c): the render
     * context as a JSON object (messages as the client sent them, tools, chat_template_kwargs; gen_prompt adds
     * add_generation_prompt, bos_token, eos_token), and text written after the rendered prompt
     * (a required tool call's opening marker). NULL: messages render as role and content. */
    char    *chat_context;
    char    *prefill;
    int      think_open;          /* set by gen_prompt: the rendered prompt ends inside <think> */
    /* gRPC Chat with tools, tool results or chat_template_kwargs: the chat part of the request
     * (messages with their tool fields, tools, tool_choice, parallel_tool_calls,
     * chat_template_kwargs) as an OpenAI chat request's JSON object, which chat_tools.c checks
     * and applies with the HTTP chat's code. NULL: none of those fields. */
    char    *chat_request;
};

/* Parses GenerateRequest (is_chat 0) or ChatRequest (is_chat 1) bytes into *r, which is left
 * zeroed-but-freeable on error. Checks UTF-8, roles and raw sizes; the numeric ranges are
 * checked by engine_validate. */
enum status convert_gen_request(const void *data, size_t len, int is_chat, struct gen_request *r);
void        gen_request_free(struct gen_request *r); /* accepts a zeroed struct */

/* A tool call of a reply (chat_tools.c); in a streamed delta id and name are NULL but on the
 * call's first fragment, and args is the new fragment. */
struct gen_tool_call {
    int         index;
    const char *id, *name;
    const char *args;
};

/* One sample's output as the server accumulated it. */
struct gen_sample_out {
    int            index;
    const char    *text;          /* text_len bytes, sent whole even when they hold U+0000 */
    size_t         text_len;
    const int32_t *ids;           /* (n_ids) */
    int            n_ids;
    const float   *logprobs;      /* (n_ids), or NULL when logprobs were not asked */
    const struct top_logprob *top;/* (n_ids, n_top), or NULL */
    int            n_top;
    enum finish_reason finish;    /* FINISH_REASON_NONE while running */
    int            has_usage;
    int            prompt_tokens, completion_tokens, cached_prompt_tokens;
    /* Chat with tools or a reasoning template (chat_tools.c): the reply parsed (streams: the
     * new parts); NULL or 0 when not set. ended_with_calls: a finish by stop or EOS is sent
     * as FINISH_REASON_TOOL_CALLS. */
    const char    *content, *reasoning;
    const struct gen_tool_call *calls; /* (n_calls) */
    int            n_calls, ended_with_calls;
};

/* A GenerateResponse to encode: unary (every sample; flat fields from sample 0) or one
 * streamed message (samples[0] only, its delta). */
struct gen_response_out {
    const char *request_id;
    uint64_t    seed;
    int         unary;
    const struct gen_sample_out *samples; /* (n_samples) */
    int         n_samples;
    const int32_t *prompt_ids;            /* (n_prompt) with prompt logprobs, or NULL */
    const float   *prompt_logprobs;       /* (n_prompt) */
    const struct top_logprob *prompt_top; /* (n_prompt, n_prompt_top), or NULL */
    int         n_prompt, n_prompt_top;
    const struct tokenizer *tok;          /* for the pieces of logprob entries */
};
enum status convert_gen_response(const struct gen_response_out *o, uint8_t **out, size_t *len);

/* Tokenize / Detokenize. *text is malloc'd (caller frees). */
enum status convert_tokenize_request(const void *data, size_t len, char **text, size_t *text_len, int *add_bos);
enum status convert_tokenize_response(const int32_t *ids, int n, const struct tokenizer *tok, uint8_t **out,
                                      size_t *len);
/* *ids is malloc'd (caller frees; non-NULL even when empty). Ids are checked against vocab_size. */
enum status convert_detokenize_request(const void *data, size_t len, int vocab_size, int32_t **ids, int *n);
/* text[0..text_len) may hold U+0000 (token <0x00>): it is sent whole, as GenerateResponse's. */
enum status convert_detokenize_response(const char *text, size_t text_len, uint8_t **out, size_t *len);

/* Cancel. *request_id is malloc'd. */
enum status convert_cancel_request(const void *data, size_t len, char **request_id);
enum status convert_cancel_response(int cancelled, uint8_t **out, size_t *len);

/* LoadAdapter / UnloadAdapter. *name and *path are malloc'd (caller frees); path may be NULL
 * for UnloadAdapter. The name's characters are the engine's to check. */
enum status convert_load_adapter_request(const void *data, size_t len, char **name, char **path);
enum status convert_load_adapter_response(const struct engine_adapter_info *a, int n_loaded, int max_loras,
                                          uint8_t **out, size_t *len);
enum status convert_unload_adapter_request(const void *data, size_t len, char **name);
enum status convert_unload_adapter_response(uint8_t **out, size_t *len);

/* One input of an embedding request as a front received it: a text (valid UTF-8, without U+0000;
 * tokenized by embed.c) or token ids (taken as they are; the engine checks them). */
struct embed_item {
    char    *text;            /* (text_len) NUL-terminated; NULL for token ids */
    size_t   text_len;
    int32_t *ids;             /* (n_ids); NULL for a text */
    int      n_ids;
};
/* An embedding request of either front (HTTP /v1/embeddings: http_embeddings.c; gRPC Embed:
 * convert_embed_request) after parsing, which embed.c checks and runs the same way. Owns its
 * arrays; free with embed_request_free (accepts a zeroed struct). */
struct embed_request {
    char    *model;           /* NULL when not given */
    struct embed_item *items; /* (n_items) */
    int      n_items;
    enum embed_pooling pooling;
    int      normalize;
};
/* r->items as n zeroed items (n >= 0). */
enum status embed_request_items(struct embed_request *r, int n);
void        embed_request_free(struct embed_request *r);
/* Embed: the request into *r (left freeable on error), and the response of n vectors of d floats
 * (model: the served model's id; prompt_tokens: every input's tokens). */
enum status convert_embed_request(const void *data, size_t len, struct embed_request *r);
enum status convert_embed_response(const float *vecs, int n, int d, const char *model, int prompt_tokens,
                                   uint8_t **out, size_t *len);

/* The requests that name a served model in their `model` field: Tokenize, Detokenize,
 * GetModelInfo, GetServerStats, LoadAdapter, UnloadAdapter. */
enum model_request { MODEL_REQUEST_TOKENIZE, MODEL_REQUEST_DETOKENIZE, MODEL_REQUEST_MODEL_INFO,
                     MODEL_REQUEST_SERVER_STATS, MODEL_REQUEST_LOAD_ADAPTER, MODEL_REQUEST_UNLOAD_ADAPTER };
/* Parses data[0..len) as request `which` and copies its `model` field into *model (malloc'd; ""
 * when unset): the rest is parsed by the request's own function. GetModelInfo and GetServerStats
 * carry nothing else. */
enum status convert_request_model(enum model_request which, const void *data, size_t len, char **model);
struct model_info_out {
    struct engine_model_info info;
    const char *chat_template;
    int         max_logprobs;
    const char *const *adapters;  /* (n_adapters) served adapter names */
    int         n_adapters;
    const char *model_id;         /* the served model's id: the base in a request's adapter field */
    const char *default_adapter;  /* --default-adapter, "" without one */
};
enum status convert_model_info_response(const struct model_info_out *m, uint8_t **out, size_t *len);
struct server_stats_out {
    struct engine_stats engine;
    const struct engine_replica_stats *replicas; /* (n_replicas) */
    int    n_replicas;
    int    active_calls;
    double uptime_seconds;
    struct engine_expert_load expert_load; /* borrowed; n_layers 0 for a dense model */
};
enum status convert_server_stats_response(const struct server_stats_out *s, uint8_t **out, size_t *len);

/* grpc.health.v1. status: 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN. *service is malloc'd. */
enum status convert_health_request(const void *data, size_t len, char **service);
enum status convert_health_response(int status, uint8_t **out, size_t *len);

/* grpc.reflection.v1alpha. */
enum reflection_query_kind {
    REFLECTION_QUERY_LIST_SERVICES,
    REFLECTION_QUERY_FILE_BY_FILENAME,
    REFLECTION_QUERY_FILE_CONTAINING_SYMBOL,
    REFLECTION_QUERY_FILE_CONTAINING_EXTENSION,
    REFLECTION_QUERY_EXTENSION_NUMBERS,
    REFLECTION_QUERY_NONE, /* no field of the oneof set */
};
struct reflection_query {
    enum reflection_query_kind kind;
    char *arg;  /* the file name, symbol or type name (malloc'd; "" for the others) */
};
enum status convert_reflection_request(const void *data, size_t len, struct reflection_query *q);
void        reflection_query_free(struct reflection_query *q);
/* The answer to the request in req_data[0..req_len) (echoed as original_request): either
 * services (n_services names), or files (n_files serialized FileDescriptorProtos), or an error
 * (error_code != 0). */
struct reflection_answer {
    const char *const *services;
    int n_services;
    const uint8_t *const *files;
    const size_t *file_lens;
    int n_files;
    int error_code;
    const char *error_message;
    const char *base_type_name;   /* EXTENSION_NUMBERS: the type asked for (no numbers) */
};
enum status convert_reflection_response(const void *req_data, size_t req_len, const struct reflection_answer *a,
                                        uint8_t **out, size_t *len);

#endif
