/* server/server.h - the gRPC server: one completion queue, one thread that runs an explicit
 * state machine per call, the engine behind it, health, reflection, API keys, TLS and the
 * graceful drain on SIGTERM / SIGINT.
 * With http_listen, the same engine also answers the OpenAI-compatible HTTP API (http.c).
 * Not here: command-line parsing (serve.c), protobuf (convert.c), chat templates
 * (chat_template.c), the descriptor index (reflection.c).
 * Tests: tests/server/test_server.py, tests/server/test_http.py, tests/server/test_gguf_lora.py
 * (default_adapter).
 *
 * Threads: server_run's caller becomes the completion-queue thread; a control thread loads the
 * model (so that health answers NOT_SERVING meanwhile), then waits for SIGTERM / SIGINT (a
 * handler posts a semaphore) and drains the engine; the engine thread delivers events through a callback that only copies
 * them into a queue and wakes the completion-queue thread. */
#ifndef SHARDLM_SERVER_H
#define SHARDLM_SERVER_H

#include "engine.h"

/* A model served besides server_options.engine's (serve --model repeated): its checkpoint and
 * its own --lora adapters; every other engine option is engine's. */
struct server_model_spec {
    const char *model_dir;
    const char *const *adapter_names; /* (n_adapters) */
    const char *const *adapter_dirs;  /* (n_adapters) */
    int         n_adapters;
    int         max_loras;            /* as engine_options.max_loras */
};

#define SERVER_MAX_MODELS 16

struct server_options {
    const char *listen;          /* host:port; port 0 picks a free one (printed on stdout) */
    struct engine_options engine;
    const char *chat_template;   /* "llama2", "chatml", "plain", or NULL: chosen from the model */
    const char *spec_corpus;     /* --spec-corpus FILE[,FILE...]: training-format files whose model
                                    turns every served model drafts from (engine_set_spec_corpus);
                                    NULL: none */
    const char *reasoning_format; /* "deepseek" (split <think>...</think> into reasoning_content),
                                     "none", or NULL / "auto": deepseek when the Jinja template
                                     holds <think> (server/tool_format.h) */
    const char *api_key_file;    /* one key per line ('#' comments); NULL: no authentication */
    const char *tls_cert;        /* PEM files; both or neither */
    const char *tls_key;
    double      drain_timeout_s; /* how long running requests may finish after SIGTERM */
    double      send_timeout_s;  /* a gRPC message the client has not taken for this long cancels
                                    its call (a client that stops reading); 0 = never */
    int         max_receive_bytes; /* largest request message (gRPC) or body (HTTP); larger ones:
                                      RESOURCE_EXHAUSTED (gRPC), 413 (HTTP) */
    const char *http_listen;     /* the OpenAI-compatible HTTP API and /metrics on HOST:PORT
                                    (":PORT" or "PORT": 127.0.0.1); NULL: off */
    int         http_max_connections; /* open HTTP connections at most; 0 = 256 */
    int         http_max_per_address; /* open HTTP connections from one peer address at most;
                                         0 = 3/4 of http_max_connections, -1 = no cap (behind a
                                         proxy) */
    double      http_header_timeout_s; /* from accept (or the previous response) to the end of
                                          a request's headers; 0 = 10 s */
    double      http_body_timeout_s;   /* from the end of the headers to the body's last byte;
                                          0 = 60 s */
    int         http_responses_store;  /* /v1/responses kept for GET and previous_response_id at
                                          most (and HTTP_RESPONSES_STORE_BYTES of JSON); 0 = 1024 */
    const char *journal_dir;     /* the stream journal (server/journal.h, docs/reliability.md):
                                    accepted gRPC generation calls and OpenAI chat / completions
                                    requests and their events, resumed after a restart; NULL: off. */
    int         journal_fsync;   /* enum journal_fsync; 0 = accept */
    const char *finetune_dir;    /* serve --fine-tuning DIR: /v1/files and /v1/fine_tuning/jobs
                                    (http_finetune.c), uploads and jobs under DIR; NULL: off.
                                    Needs http_listen; one rank. */
    int         finetune_threads;     /* cores a training job uses (--fine-tuning-threads); 1 */
    int         finetune_max_file_mb; /* the largest upload (--fine-tuning-max-file-mb); 64 */
    int         finetune_seq_length;  /* the jobs' sequence length (--fine-tuning-seq-length); 512 */
    double      journal_retain_s; /* a resumed request's answer waits this long for its client
                                     after it ends; 0 = 600 s */
    double      journal_end_delay_s; /* a delivered request's END is journaled this long after
                                     its last bytes went to the connection (journal_end); 0: at once */
    double      journal_detach_grace_s; /* a journaled request (HTTP or gRPC) whose client went
                                     away runs on this long for the client to reattach (a dropped
                                     connection), then is cancelled; 0: cancelled at once */
    int         journal_detach_max; /* at most this many such requests running on at once
                                     (both fronts); past it a client that goes away cancels its
                                     request as with a grace of 0; 0 = 256 */
    int         journal_detach_max_per_key; /* of those, at most this many of one API key's, so
                                     that one key cannot take them all from the others; 0 = half
                                     of journal_detach_max with two or more keys, else no more
                                     than journal_detach_max */
    const struct server_model_spec *more_models; /* (n_more_models) served besides engine's
                                    model_dir; requests pick one by its id (the last component
                                    of its path) or one of its adapters' names, in the HTTP
                                    `model` field or gRPC `adapter` / Embed `model`; the first
                                    model serves requests that name none. Refused with several
                                    ranks, a journal or a draft model. */
    int         n_more_models;   /* 0 .. SERVER_MAX_MODELS - 1 */
    int         models_max;      /* models loaded at once at most (serve --models-max); the others are
                                    loaded when a request names one, after unloading the least
                                    recently used model that no request holds (none: the request
                                    is UNAVAILABLE). The first models_max load at start. 0 = all */
    double      sleep_idle_s;    /* a model that no request used for this long is unloaded (its
                                    weights and KV cache freed) and loaded again by the next
                                    request that names it (serve --sleep-idle-seconds). 0 = never.
                                    Refused with several ranks or a journal */
    const char *default_adapter; /* the first model's adapter requests that name none get: one of
                                    engine.adapter_names (STATUS_INVALID_ARGUMENT otherwise, before
                                    anything starts); it cannot be unloaded. A request reaches the
                                    base by naming the served model's id. NULL: no default (such
                                    requests get the base) */
};

/* Runs the server until a signal and the drain that follows. Installs handlers for SIGTERM and
 * SIGINT (left in place, inert, on return, so that a late signal cannot kill the exiting
 * process). Prints "shardlm: listening on
 * HOST:PORT" (and "shardlm: http listening on HOST:PORT") to stdout once bound and "shardlm: ready" once the model is loaded. Returns
 * STATUS_OK after a clean drain, or the error that stopped it (bad options, unusable address
 * or TLS files, a model that failed to load) with a message. */
enum status server_run(const struct server_options *o);

#endif
