/* clients/client.h - the C client library of shardlm: one gRPC channel to a `shardlm serve`
 * and a blocking function per method of shardlm.v1.TextGeneration (Generate, GenerateStream,
 * Chat, ChatStream, Tokenize, Detokenize, Cancel, GetModelInfo, GetServerStats), in native
 * structs. gRPC C core and protobuf-c stay inside the .c files of clients/.
 * Not here: command-line parsing and printing (cli/chat.c, complete.c, bench.c, stats.c).
 * Tests: tests/test_client.sh (through the chat, complete and bench subcommands, against a
 * real server).
 *
 * Errors: every function returns an enum status; on failure status_message() holds the
 * server's message (or gRPC's, when the call never reached a server). gRPC status codes map
 * onto enum status one to one where a value exists (INVALID_ARGUMENT, NOT_FOUND,
 * RESOURCE_EXHAUSTED, UNAVAILABLE, INTERNAL, CANCELLED, DEADLINE_EXCEEDED, ALREADY_EXISTS,
 * FAILED_PRECONDITION); the other codes map to the nearest value (UNAUTHENTICATED,
 * PERMISSION_DENIED, OUT_OF_RANGE -> STATUS_INVALID_ARGUMENT; UNIMPLEMENTED -> STATUS_UNSUPPORTED;
 * ABORTED -> STATUS_UNAVAILABLE; UNKNOWN, DATA_LOSS -> STATUS_INTERNAL) and their message
 * then starts with the gRPC code's name ("UNAUTHENTICATED: missing API key"). Functions that
 * fill a struct client_result also store the exact gRPC code there.
 *
 * Threads: a struct client may be used by many threads at once (each call has its own
 * completion queue; the channel is shared). Callbacks run on the calling thread. */
#ifndef SHARDLM_CLIENT_H
#define SHARDLM_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct client;

struct client_options {
    /* Sent as metadata `authorization: Bearer <api_key>` on every call; NULL: none. */
    const char *api_key;
    /* TLS: when tls is non-zero or tls_root_cert_file is set, the channel uses TLS, trusting
     * the PEM roots in tls_root_cert_file (NULL: the system's roots). tls_server_name, when
     * set, overrides the name checked against the server's certificate (for a certificate
     * issued to "localhost" reached at 127.0.0.1). */
    int         tls;
    const char *tls_root_cert_file;
    const char *tls_server_name;
    /* Deadline of every call, in seconds from its start; 0: none. A request may override it. */
    double      timeout_s;
    /* Non-zero: this client gets a TCP connection of its own instead of sharing one with the
     * other clients of the process to the same address (bench: one connection per worker). */
    int         own_connection;
    /* Reattaching (a server with a stream journal, `serve --journal`: docs/reliability.md): when
     * a Generate, GenerateStream, Chat or ChatStream call whose server named its resume token
     * fails with UNAVAILABLE (the server died or restarts), the call is made again with the
     * token (and, streaming, what the caller already got), retrying for up to resume_for_s
     * seconds while the server is down or loading; the caller sees every message once. 0: 60 s;
     * negative: never. Calls to a server without a journal are never made again. */
    double      resume_for_s;
    /* The served model that Tokenize, Detokenize, GetModelInfo, GetServerStats, LoadAdapter and
     * UnloadAdapter ask about, on a server of several (`serve --model` repeated): its id or one
     * of its adapters' names, at most 255 bytes; NULL or "": the server's first model. */
    const char *model;
};

/* Why a sample stopped; the values of shardlm.v1.FinishReason. */
enum client_finish_reason {
    CLIENT_FINISH_REASON_NONE = 0,  /* not finished (every streamed chunk but a sample's last) */
    CLIENT_FINISH_REASON_LENGTH,
    CLIENT_FINISH_REASON_STOP,
    CLIENT_FINISH_REASON_EOS,
    CLIENT_FINISH_REASON_CANCELLED,
    CLIENT_FINISH_REASON_DEADLINE,
    CLIENT_FINISH_REASON_ERROR,
};
/* "length", "stop", "eos", "cancelled", "deadline", "error", or "" for NONE. */
const char *client_finish_reason_name(enum client_finish_reason r);

/* The sampling parameters of shardlm.v1.SamplingParams. A zeroed struct asks for every server
 * default. The has_* flags mark the proto3 `optional` fields: the value beside a flag is sent
 * only when the flag is non-zero (so that an explicit 0, temperature 0 = greedy for one, is
 * distinguishable from "unset"). Ranges and defaults: see protos/shardlm/v1/text_generation.proto. */
struct client_sampling {
    int      has_max_tokens;         int   max_tokens;          /* default 128 */
    int      has_temperature;        float temperature;         /* default 1.0; 0 = greedy */
    int      top_k;                                             /* 0 = off */
    int      has_top_p;              float top_p;               /* default 1.0 = off */
    float    min_p;                                             /* 0 = off */
    int      has_repetition_penalty; float repetition_penalty;  /* default 1.0 = off */
    float    presence_penalty;
    float    frequency_penalty;
    int      has_seed;               uint64_t seed;             /* default: the server's pick */
    const char *const *stop;         int   n_stop;              /* borrowed; stop strings */
    const int32_t *stop_token_ids;   int   n_stop_token_ids;    /* borrowed */
    int      ignore_eos;
    int      min_tokens;
    int      has_logprobs;           int   logprobs;            /* 0: chosen token's; k: top-k too */
    int      has_prompt_logprobs;    int   prompt_logprobs;
    int      has_n;                  int   n;                   /* samples; default 1 */
    const int32_t *logit_bias_ids;   const float *logit_bias_values; /* borrowed, (n_logit_bias) */
    int      n_logit_bias;
};

/* A chat turn: role "system", "user" or "assistant". Both strings are borrowed. */
struct client_message {
    const char *role;
    const char *content;
};

/* One generation request. Every pointer is borrowed for the duration of the call. With
 * n_messages > 0 it is a chat request (Chat / ChatStream: the server applies its chat template;
 * prompt, prompt_token_ids and add_bos must then be left unset); otherwise a completion
 * request (Generate / GenerateStream) of prompt or prompt_token_ids. */
struct client_request {
    const char *request_id;               /* NULL or "": the server assigns one */
    const char *prompt;                   /* NULL or "": empty prompt (BOS only with add_bos) */
    const int32_t *prompt_token_ids;      /* (n_prompt_token_ids) */
    int         n_prompt_token_ids;
    const struct client_message *messages; /* (n_messages), oldest first */
    int         n_messages;
    struct client_sampling sampling;
    int         has_add_bos;  int add_bos; /* default true */
    /* The LoRA adapter: NULL or "" = the server's default adapter (the base model when it has
     * none); an adapter's name; the served model's id (client_model_info.model_id) = the base. */
    const char *adapter;
    /* Deadline of this call in seconds; 0: the client's timeout_s. */
    double      timeout_s;
    /* Polled every few tens of milliseconds while the call runs: once it reads non-zero, the
     * call is cancelled and returns STATUS_CANCELLED. May be set from a signal handler (the
     * client never writes it). NULL: not polled. */
    const volatile sig_atomic_t *cancel_flag;
};

/* An alternative token at one position. piece is owned by whoever owns the logprob. */
struct client_top_logprob {
    int32_t token_id;
    float   logprob;
    char   *piece;
};

/* The log-probability of one token and, when asked, the top alternatives at its position. */
struct client_logprob {
    int32_t token_id;
    float   logprob;
    char   *piece;
    struct client_top_logprob *top;  /* (n_top), most likely first */
    int     n_top;
};

struct client_usage {
    int prompt_tokens;
    int completion_tokens;
    int cached_prompt_tokens;
};

/* One streamed message (borrowed: valid only during the callback). text may be empty while a
 * UTF-8 character or a possible stop string is held back by the server; it is never
 * NUL-terminated. usage is meaningful only when finish_reason is not NONE. */
struct client_chunk {
    const char *request_id;  /* NUL-terminated */
    int         index;       /* the sample, 0 .. n-1 */
    const char *text;        /* (text_len) bytes, complete UTF-8 */
    size_t      text_len;
    const int32_t *token_ids; /* (n_token_ids) */
    int         n_token_ids;
    const struct client_logprob *logprobs; /* (n_logprobs): of token_ids, when asked */
    int         n_logprobs;
    enum client_finish_reason finish_reason;
    struct client_usage usage;
    uint64_t    seed;
};

/* Called for every streamed message. Returning non-zero cancels the call, which then returns
 * STATUS_CANCELLED. */
typedef int (*client_chunk_fn)(void *ctx, const struct client_chunk *chunk);

/* One sample of a finished generation (owned by its struct client_result). text is
 * NUL-terminated (text_len excludes the NUL). */
struct client_completion {
    int      index;
    char    *text;
    size_t   text_len;
    int32_t *token_ids;           /* (n_token_ids) */
    int      n_token_ids;
    struct client_logprob *logprobs; /* (n_logprobs) */
    int      n_logprobs;
    enum client_finish_reason finish_reason;
    struct client_usage usage;
};

/* The outcome of a generation call. Filled by client_generate and client_generate_stream
 * (a stream's chunks are accumulated: completions[i] holds sample i whole). Release with
 * client_result_free; a zeroed struct is empty. After a failed or cancelled stream, the
 * samples hold what arrived before the failure. */
struct client_result {
    char    *request_id;
    uint64_t seed;
    struct client_completion *completions; /* (n_completions), in index order */
    int      n_completions;
    struct client_logprob *prompt_logprobs; /* (n_prompt_logprobs), when asked */
    int      n_prompt_logprobs;
    struct client_usage usage;  /* prompt tokens; completion tokens of every sample */
    int      grpc_code;         /* the call's gRPC status code (0 = OK) */
};
void client_result_free(struct client_result *r);

/* Facts about the served model (GetModelInfo). Strings are owned (client_model_info_free). */
struct client_model_info {
    char *architecture;
    int   n_layers, d_model, n_heads, n_kv_heads, head_dim, ffn_hidden, vocab_size;
    int   context_length;
    char *dtype;
    char *device;
    int   tp_size, pp_size, dp_size;
    int   kv_block_tokens, kv_blocks;   /* kv_blocks: per data-parallel replica */
    int   bos_id, eos_id;
    char *chat_template;
    int   max_logprobs;
    char **adapters;                    /* (n_adapters) LoRA adapters loaded, in load order */
    int   n_adapters;
    int   max_loras, max_lora_rank;
    char *model_id;                     /* the served model's id: the base in client_request.adapter */
    char *default_adapter;              /* what requests naming no adapter get; "" = the base */
};
void client_model_info_free(struct client_model_info *m);

/* One data-parallel replica in GetServerStats (see ReplicaStats in the proto). */
struct client_replica_stats {
    int      leader_rank, outstanding;
    uint64_t routed, routed_by_prefix;
    int      waiting, running, kv_blocks_total, kv_blocks_free;
    uint64_t requests_finished, generated_tokens, prefix_cache_hit_tokens;
    double   report_age_seconds;
};
#define CLIENT_MAX_REPLICAS 64

/* A snapshot of the server's load (GetServerStats). */
struct client_server_stats {
    int      waiting, running;
    int      kv_blocks_total, kv_blocks_free, kv_blocks_cached;
    float    kv_usage;
    uint64_t requests_submitted, requests_finished;
    uint64_t prompt_tokens, generated_tokens, prefix_cache_hit_tokens;
    float    prefix_cache_hit_rate;
    uint64_t engine_steps, preemptions;
    uint64_t spec_draft_tokens, spec_accepted_tokens; /* speculative decoding */
    uint64_t spec_backoffs;                            /* sequences that stopped drafting for a while */
    uint64_t spec_lookup_draft_tokens, spec_lookup_accepted_tokens; /* of the above, prompt lookup's */
    uint64_t spec_corpus_draft_tokens, spec_corpus_accepted_tokens; /* of the above, the corpus's (--spec-corpus) */
    uint64_t spec_corpus_tokens;         /* the corpus's tokens now, given and learned (--spec-corpus-learn) */
    int      active_calls;
    double   uptime_seconds;
    int      n_replicas;                 /* the first CLIENT_MAX_REPLICAS are kept */
    struct client_replica_stats replicas[CLIENT_MAX_REPLICAS];
};

/* Opens a channel to addr ("host:port", or any gRPC target such as "unix:/path"; "A:P,B:P,..."
 * with IP addresses: several replicas, which the channel balances, skipping one that is down
 * (client_internal.h's REPLICAS_SERVICE_CONFIG); a journaled call is reattached on each replica in
 * turn, over a channel to each, until the one that holds it answers). Does not
 * connect yet: an unreachable server shows as STATUS_UNAVAILABLE from the first call. o may
 * be NULL (insecure, no key, no deadline). The strings of o are copied. */
enum status client_open(const char *addr, const struct client_options *o, struct client **out);
/* Closes the channel. Every call on c must have returned. Accepts NULL. */
void client_close(struct client *c);

/* Generate or Chat (unary): res receives every sample whole. res is reset first. */
enum status client_generate(struct client *c, const struct client_request *req,
                            struct client_result *res);
/* GenerateStream or ChatStream: on_chunk (may be NULL) sees every message as it arrives, and
 * res (may be NULL) receives the accumulated samples. res is reset first. */
enum status client_generate_stream(struct client *c, const struct client_request *req,
                                   client_chunk_fn on_chunk, void *ctx, struct client_result *res);

/* Cancels every call of c now running on any thread (grpc_call_cancel): they return
 * STATUS_CANCELLED. Safe from any thread, not from a signal handler (use
 * client_request.cancel_flag there). Calls started afterwards are not affected. */
void client_cancel_calls(struct client *c);

/* The Cancel method: cancels the server-side request of that id, whichever connection it came
 * from. *cancelled (may be NULL) receives the server's answer. An unknown id: STATUS_NOT_FOUND. */
enum status client_cancel(struct client *c, const char *request_id, int *cancelled);

/* Tokenize: *ids (malloc'd, caller frees) receives *n ids. add_bos < 0: the server default. */
enum status client_tokenize(struct client *c, const char *text, int add_bos, int32_t **ids, int *n);
/* Detokenize: *text (malloc'd, NUL-terminated, caller frees). */
enum status client_detokenize(struct client *c, const int32_t *ids, int n, char **text);

enum status client_model_info(struct client *c, struct client_model_info *out);
/* LoadAdapter / UnloadAdapter (admin operations; see the proto for their errors, which keep
 * their codes: STATUS_ALREADY_EXISTS, STATUS_FAILED_PRECONDITION, ...). *rank (may be NULL)
 * receives the loaded adapter's rank. */
enum status client_load_adapter(struct client *c, const char *name, const char *path, int *rank);
enum status client_unload_adapter(struct client *c, const char *name);
enum status client_server_stats(struct client *c, struct client_server_stats *out);

/* The name of a gRPC status code ("OK", "UNAVAILABLE", ...; "UNKNOWN" for values outside). */
const char *client_grpc_code_name(int code);

#ifdef __cplusplus
}
#endif

#endif
