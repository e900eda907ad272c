/* server/server_internal.h - what the files of server/ share, and nothing outside server/ sees:
 * struct server (one per server_run), struct call (one gRPC call's state machine), the
 * completion-queue tags, and the functions each file offers the others.
 *
 *   server.c      setup, the completion-queue loop, the control thread (load, signals, drain),
 *                 waking the loop, and the one status-to-gRPC mapping (server_grpc_code)
 *   call.c        the life of one call: accepting it, its batches (receive, send, close),
 *                 dispatch to a handler, freeing it
 *   generation.c  Generate / Chat and their streams: engine events, output buffers, responses
 *   grpc_resume.c the gRPC side of the stream journal: journaled calls, resumed jobs, reattaching
 *   resume.c      the stream journal's requests of both fronts: start, id registry, sweep, stop
 *   methods.c     Tokenize, Detokenize, Cancel, GetModelInfo, GetServerStats, LoadAdapter,
 *                 UnloadAdapter, reflection
 *   embed.c       embeddings for both fronts (checks, tokenization, metrics) and gRPC Embed
 *   health.c      grpc.health.v1 Check and Watch
 *   auth.c        API keys, their owners (salted hashes, DIR/owner.salt) and TLS credentials
 *   http.c        the OpenAI-compatible HTTP front (its own threads; http_internal.h)
 *   metrics.c     Prometheus metrics of both fronts (metrics.h)
 *
 * Threads: everything here runs on the completion-queue thread, except server_wake (any
 * thread), the engine callback in generation.c (engine thread) and the loader thread's loads
 * (loader.c), which only queue and wake.
 * Not here: protobuf (convert.c), the descriptor index (reflection.c), flags (cli/serve.c).
 * Tests: tests/server/test_server.py. */
#ifndef SHARDLM_SERVER_INTERNAL_H
#define SHARDLM_SERVER_INTERNAL_H

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>

#include "chat_template.h"
#include "chat_tools.h"
#include "convert.h"
#include "jinja.h"
#include "journal.h"
#include "metrics.h"
#include "server.h"

struct gen_request;  /* convert.h */
struct MHD_Daemon;   /* libmicrohttpd */
struct http_guard;   /* http_guard.c */
struct http_responses_store; /* http_responses.c */
struct http_finetune;        /* http_finetune.c */
struct http_gen;      /* http_internal.h */
struct journal;       /* journal.h */
struct journal_entry; /* journal.h */
struct metrics;      /* metrics.h */
struct grpc_job;     /* grpc_resume.c */

/* A journaled first-run request's key (its request id) while the request runs: in s->live,
 * under s->resumed_mu, so that no second request of either front takes it (resume_key_claim). */
struct resume_key {
    struct resume_key *prev, *next;
    const char        *key;     /* borrowed from the request */
    int                in_list;
};

#define N_REQUEST_SLOTS 8

enum method {
    METHOD_UNKNOWN,
    METHOD_GENERATE,
    METHOD_GENERATE_STREAM,
    METHOD_CHAT,
    METHOD_CHAT_STREAM,
    METHOD_TOKENIZE,
    METHOD_DETOKENIZE,
    METHOD_CANCEL,
    METHOD_MODEL_INFO,
    METHOD_SERVER_STATS,
    METHOD_HEALTH_CHECK,
    METHOD_HEALTH_WATCH,
    METHOD_REFLECTION,
    METHOD_LOAD_ADAPTER,
    METHOD_UNLOAD_ADAPTER,
    METHOD_EMBED,
};

/* What the server is doing; written by the control thread, read by the loop. */
enum phase {
    PHASE_LOADING,
    PHASE_READY,
    PHASE_DRAINING, /* SIGTERM seen: new calls UNAVAILABLE, the engine finishes what runs */
    PHASE_DRAINED,  /* engine_drain returned: every request has finished */
    PHASE_FAILED,   /* the model did not load */
};

enum tag_kind { TAG_REQUEST, TAG_RECV, TAG_SEND, TAG_CLOSE, TAG_WAKE, TAG_SHUTDOWN };

struct tag {
    enum tag_kind kind;
    void         *owner; /* struct call, struct request_slot, or NULL */
};

struct server;

/* One sample's output not yet sent (streaming) or all of it (unary): both fronts (gRPC's calls,
 * the HTTP front's requests) keep their samples in it and fill it with sample_buf_append. */
struct sample_buf {
    char    *text;
    size_t   text_len, text_cap;
    int32_t *ids;              /* (cap) */
    float   *lp;               /* (cap) when logprobs were asked */
    struct top_logprob *top;   /* (cap, n_top) */
    size_t   cap;
    int      n, n_top, has_lp;
    enum finish_reason finish;
    int      finished, final_sent;
    int      prompt_tokens, completion_tokens, cached_prompt_tokens;
    size_t   text_offset;      /* HTTP streams: bytes of text already sent before text[0] */
    int      sent_tokens;      /* HTTP streams: tokens and generated text bytes handed out so far */
    size_t   sent_text;        /*   (a journaled stream's SSE ids: http_resume.c) */
    int      role_sent;        /* HTTP chat streams: the first delta (with the role) went out */
    double   t_last_token;     /* when its previous tokens arrived (inter-token latency) */
};

struct served_model;

/* The figures /v1/models shows of a served model, loaded or not: its last load's. */
struct model_view {
    int  max_positions;
    char arch[32], quant[32], dtype[32], tmpl[256];
};

/* Where a served model is (models.c): a load or an unload runs without the lock, in between. */
enum model_state { MODEL_UNLOADED, MODEL_LOADING, MODEL_LOADED, MODEL_UNLOADING };

struct call {
    struct call   *prev, *next;
    struct server *s;
    struct served_model *m;       /* the model it uses, once routed: pinned (server_acquire) until
                                     the call is freed, or until its final status is queued with
                                     nothing left running on the model (m_released) */
    int            m_released;
    grpc_call     *call;
    enum method    method;
    gpr_timespec   deadline;
    double         t_start, t_first_token;
    double         queue_s;       /* the first admission's queue time; < 0 before */
    struct tag     recv_tag, send_tag, close_tag;
    grpc_byte_buffer *recv_buf;
    grpc_byte_buffer *send_buf;   /* owned while a send is in flight */
    grpc_slice     status_slice;  /* details of the status in flight */
    int            has_status_slice;
    int            recv_inflight, send_inflight, send_has_status;
    double         t_send;        /* when the send in flight started (--send-timeout) */
    int            send_timed_out; /* cancelled: the client read nothing for --send-timeout */
    int            close_done, client_cancelled; /* client_cancelled: set by RECV_CLOSE_ON_SERVER */
    int            initial_md_sent, status_sent;
    grpc_status_code final_code;  /* what the call ended with, for the log */
    /* generation */
    int            submitted;
    uint64_t       handle;
    int            engine_active; /* samples without their FINISHED event yet */
    char          *request_id;
    char           owner[JOURNAL_OWNER_MAX + 1]; /* auth_owner of its API key ("" without keys) */
    char          *client;        /* who calls (--scheduling-policy fair): "key:<index>" with API
                                     keys, else the connection's peer ("ipv4:127.0.0.1:40312") */
    struct sample_buf *samples;   /* (n_samples) */
    int            n_samples, rr;
    int32_t       *prompt_ids;    /* prompt logprobs, when asked: (n_prompt) */
    float         *prompt_lp;
    struct top_logprob *prompt_top;
    int            n_prompt, n_prompt_top, prompt_lp_pending;
    int            n_prompt_tokens;
    uint64_t       seed;
    enum status    end_status;    /* STATUS_OK, or why the request ended early */
    char          *end_message;
    int            cancelled_by_rpc;
    struct chat_parse chat;       /* Chat: how replies are parsed (chat_tools.h) */
    struct chat_stream *chat_streams; /* (n_samples) ChatStream with chat.on: each sample's parse */
    /* the stream journal (resume.c, grpc_resume.c, docs/reliability.md) */
    char          *resume_token;  /* metadata shardlm-resume-token: reattach to this journaled request */
    char          *resume_from;   /* metadata shardlm-resume-from: what the client has of it */
    int            journaled;     /* a first run whose ACCEPT is in the journal: events go there first */
    int            drained;       /* journaled, cut by the server's drain: no END, a restart resumes it */
    struct resume_key live;       /* journaled: its request id in s->live until the call is freed */
    struct grpc_job *job;         /* reattached, or a first run under --journal-detach-grace: the
                                     job it reads (holds a reference) */
    int            job_next;      /* with a job: the job's next event to take */
    int            job_delivered; /* with a job: gen_pump sent the request's last message and status */
    int            replaying;     /* gen_pump sends nothing while a reattach rebuilds the client's view */
    grpc_metadata  resume_md;     /* journaled: shardlm-resume-token in the initial metadata */
    int            has_resume_md;
    /* health watch */
    int            watch_last;    /* last status sent, 0 = none */
    int            watch_unknown; /* watching a service we do not know */
    /* LoadAdapter, a model's load, Tokenize / Detokenize */
    struct load_job *load_job;    /* its load or work while a loader thread has it: the call is
                                     not freed before the job comes back (loader.c) */
    /* Embed */
    struct embed_rpc *embed_rpc;  /* its request while the engine has it: the call is not freed
                                     before it comes back (embed.c) */
};

/* The loader's threads (loader.c), one per lane. */
enum job_lane_kind {
    LANE_LOAD, /* LoadAdapter, a model not loaded */
    LANE_WORK, /* Tokenize, Detokenize, Embed's tokenization */
    LANE_GEN,  /* Generate's and Chat's prompts (a lane of their own: a big Tokenize does not hold them up) */
    LANE_SYNC, /* the journal's fdatasync of a journaled Generate's or Chat's ACCEPT */
    LANE_COUNT
};

/* A method's work on the loader's work thread (loader_submit_work): it reads only j's request
 * (request, ctx) and the call's pinned model (j->call->m, nothing else of the call), and writes
 * the response (out) or into ctx. Then, on the loop thread, j's then (when set) answers the call
 * or goes on with it; else the loop answers it with out or the error. */
struct load_job;
typedef enum status (*call_work_fn)(struct load_job *j);
typedef void (*call_then_fn)(struct load_job *j);

/* One LoadAdapter's load, a model's load or a method's work, done on a loader thread (loader.c).
 * The loop thread owns it except between its submit and its return on the done list. */
struct load_job {
    struct load_job *next;
    struct call     *call;       /* the call to answer (borrowed; kept alive by call.load_job) */
    char            *name, *path;
    /* A model's load for a call that names a model not loaded now (call_pin_model): the call's
     * request, dispatched again once the model is loaded; the model stays pinned by the job
     * (pinned) until then. name is then the model's name, path NULL. */
    uint8_t         *request;
    size_t           request_len;
    int              wakes_model;
    struct served_model *pinned;
    call_work_fn     work;       /* a method's work (loader_submit_work), or NULL */
    enum job_lane_kind lane;     /* whose thread runs it */
    call_then_fn     then;       /* after it, on the loop (takes ctx; st STATUS_CANCELLED when the call
                                    ended before or during the work), or NULL */
    void            *ctx;        /* the work's own state */
    atomic_int       abandoned;  /* the call ended (client cancel, deadline, shutdown) before
                                    the load started: the loader skips it, unless */
    int              runs_abandoned; /* set (JOB_RUNS_ABANDONED): it runs whatever happened to the call */
    enum status      st;         /* the outcome, set on the loader thread */
    char             message[1024];
    uint8_t         *out;        /* the response when st is STATUS_OK (out_len bytes) */
    size_t           out_len;
};

/* One of the loader's lanes: its threads and their queue (loader.c). */
#define LANE_THREADS_MAX 2
struct job_lane {
    pthread_t        threads[LANE_THREADS_MAX];
    int              n_threads, stop; /* n_threads: started (0 until the lane's first job) */
    pthread_mutex_t  mu;
    pthread_cond_t   cv;
    struct load_job *todo, *todo_tail;  /* waiting for the thread, in order */
    struct load_job *done;              /* finished, for the loop to answer */
    double           test_delay_s;      /* $SHARDLM_TEST_{LOAD,WORK,GEN,SYNC}_DELAY_S (tests) */
};

struct request_slot {
    struct server     *s;
    grpc_call         *call;
    grpc_call_details  details;
    grpc_metadata_array md;
    struct tag         tag;
    int                active;
};

/* An engine event copied off the engine thread; one allocation holding its arrays. */
struct queued_event {
    struct queued_event *next;
    struct call         *call;
    enum engine_event_kind kind;
    int                  sample, n_tokens, n_top;
    int32_t             *tokens;
    float               *logprobs;
    struct top_logprob  *top;
    char                *text;
    size_t               text_len;
    char                *message;
    enum finish_reason   finish;
    enum status          status;
    int                  prompt_tokens, completion_tokens, cached_prompt_tokens;
    uint64_t             seed;
    double               t;             /* when the engine emitted it */
    double               queue_seconds; /* FINISHED: engine_event.queue_seconds */
};

/* One model the server serves: its engine (the weights, the KV cache, its adapters), its
 * tokenizer and its chat template. A request resolves its model before anything reads these
 * fields, and uses that model's tokenizer, template and engine throughout. */
struct served_model {
    struct engine_options eopts;     /* its engine's options (model_dir, adapters, ...) */
    const char           *default_adapter; /* --default-adapter of this model, or NULL */
    struct engine        *engine;
    const struct tokenizer *tok;
    int                   vocab_size;
    enum chat_template_kind tmpl;
    /* The Jinja chat template Chat uses instead of tmpl when set: the model's own (a byte-level
     * BPE vocabulary, whose tokenizer encodes the special tokens the template writes) or
     * --chat-template FILE.jinja. tmpl_name: "chatml", ..., or "jinja (model)" / "jinja (FILE)". */
    struct jinja_template *jtmpl;
    char                  tmpl_name[256];
    int                   tool_format;   /* enum tool_format of jtmpl's text (GENERIC without one) */
    int                   reads_effort;  /* jtmpl's text reads reasoning_effort (GPT-OSS's template) */
    int                   reads_thinking; /* jtmpl's text reads enable_thinking (Qwen 3's switch) */
    int                   reads_response_format; /* jtmpl's text reads response_format (DeepSeek V4's): a
                                            request's JSON Schema constraint is given to it */
    int                   ds_fenced;     /* DeepSeek's template writes R1's fenced calls (function<｜tool▁sep｜>NAME
                                            then ```json ARGS ```), not V3.1's NAME<｜tool▁sep｜>ARGS */
    int                   kimi_counter;  /* Kimi-K2's template numbers calls across the conversation
                                            (functions.NAME:INDEX), not within each message */
    int                   calls_as_text; /* the template never writes an assistant's tool_calls (Granite 3's):
                                            the server writes them into its content, as the model would */
    int                   tools_prompt;  /* DeepSeek's templates never read `tools`: the server writes them into
                                            the system message (enum tool_prompt; 0: the template does) */
    int                   reasoning;     /* enum tool_reasoning: the markers split off replies (0: none;
                                            reasoning_format, the template's text) */
    char                  bos_text[64], eos_text[64]; /* bos_token / eos_token for the template */
    int32_t               end_ids[REQUEST_MAX_END_IDS]; /* the Jinja template's end-of-turn tokens */
    int                   n_end_ids;
    char                  model_id[256]; /* its name (its directory's or file's last component):
                                            what requests name in `model`, and the base of its
                                            adapters */
    /* Residency (models.c), under server.models_mu. engine, tok, jtmpl and the template fields
     * above are valid only while state is MODEL_LOADED; a request reads them only while it pins
     * the model (server_acquire .. server_release), which keeps it loaded. */
    enum model_state      state;
    int                   pins;      /* requests (and loads waiting to hand it over) that hold it */
    double                t_used;    /* when it was last pinned or released (least recently used) */
    struct model_view     view;      /* what /v1/models shows of it: its last load's figures (zeros
                                        before one); under models_mu (models.c) */
};

struct server {
    struct server_options opts;
    grpc_server          *grpc;
    grpc_completion_queue *cq;
    /* waking the loop from other threads */
    grpc_channel         *wake_channel;
    grpc_call            *wake_call;
    pthread_mutex_t       wake_mu;
    atomic_int            wake_pending;
    struct tag            wake_tag;
    /* engine events */
    pthread_mutex_t       ev_mu;
    struct queued_event  *ev_head, *ev_tail;
    struct embed_rpc     *embed_done;  /* under ev_mu: Embed requests the engine finished (embed.c) */
    /* control thread */
    pthread_t             control;
    sem_t                 stop_sem;   /* posted by the signal handler (or the loop) to start the drain */
    int                   control_started;
    atomic_int            phase;
    enum phase            phase_seen;
    enum status           load_status;
    char                  load_message[1024];
    volatile sig_atomic_t fatal;   /* the engine failed (a rank gone): shut down, exit non-zero */
    char                  fatal_message[512];
    /* the served models: models[0] is the first --model */
    struct served_model  *models;   /* (n_models) */
    int                   n_models;
    pthread_mutex_t       models_mu; /* guards the models' residency fields (models.c) */
    pthread_cond_t        models_cv; /* broadcast when a load or an unload ends */
    int                   models_closing; /* the drain began: no more loads */
    double                model_load_test_delay_s; /* $SHARDLM_TEST_MODEL_LOAD_DELAY_S (tests): an
                                                      on-demand load waits this long first */
    double                test_pause_accept_s, test_pause_headers_s; /* $SHARDLM_TEST_PAUSE_BEFORE_
                                                      {ACCEPT,HEADERS}_S (tests, generation.c) */
    /* calls */
    struct call          *calls;
    int                   n_calls, n_gen_calls; /* n_gen_calls: calls that use the engine (uses_engine),
                                                     which the drain lets finish */
    struct request_slot   slots[N_REQUEST_SLOTS];
    int                   n_slots_active;
    /* misc */
    char                **keys;       /* (keys_cap), API keys, n_keys of them */
    size_t                keys_cap;
    int                   n_keys;
    char                (*owners)[JOURNAL_OWNER_MAX + 1]; /* (n_keys) auth_owner of each key, derived once at
                                                             start (auth_derive_owners), read-only after */
    struct reflection    *refl;
    uint64_t              next_id;
    double                t_start, t_drained, t_shutdown;
    double                t_send_sweep;  /* the last look for stuck sends (send_timeout_sweep) */
    int                   shutdown_started, shutdown_done, shutdown_forced;
    struct tag            shutdown_tag;
    int                   health_serving;
    /* the HTTP front and metrics */
    struct MHD_Daemon    *http;
    struct http_guard    *http_guard;           /* its connection slots and deadlines */
    char                 *http_cert, *http_key; /* PEM, while the daemon runs */
    atomic_int            http_active;          /* HTTP generation requests alive */
    atomic_ullong         http_next_id;
    struct http_responses_store *http_responses; /* /v1/responses (http_responses.c) */
    struct http_finetune *finetune;              /* /v1/files, /v1/fine_tuning (http_finetune.c) */
    struct journal       *journal;              /* serve --journal (journal.h); NULL: off */
    struct journal_entry *journal_pending;      /* its open requests, until http_resume_all */
    int                   n_journal_pending;
    pthread_mutex_t       resumed_mu;           /* guards resumed, grpc_jobs and live */
    struct http_gen      *resumed;              /* gens rebuilt from the journal, until delivered */
    struct grpc_job      *grpc_jobs;            /* gRPC requests rebuilt from the journal (grpc_resume.c) */
    struct resume_key    *live;                 /* journaled first-run requests of both fronts, until
                                                   they are freed: their ids are taken */
    char                  boot_id[16];          /* hex, new at every start: journaled ids are unique */
    long long             t_created;            /* Unix seconds at start */
    struct metrics       *metrics;
    /* the loader's threads, off the loop (loader.c): one per lane (enum job_lane_kind) */
    struct job_lane       lanes[LANE_COUNT];
};

/* The values of grpc.health.v1.HealthCheckResponse.ServingStatus that the server sends. */
enum { HEALTH_SERVING = 1, HEALTH_NOT_SERVING = 2, HEALTH_SERVICE_UNKNOWN = 3 };

static inline int is_generation(enum method m)
{
    return m == METHOD_GENERATE || m == METHOD_GENERATE_STREAM || m == METHOD_CHAT || m == METHOD_CHAT_STREAM;
}
/* Generation and Embed: the calls whose engine work a drain waits for. */
static inline int uses_engine(enum method m) { return is_generation(m) || m == METHOD_EMBED; }
static inline int is_streaming(enum method m) { return m == METHOD_GENERATE_STREAM || m == METHOD_CHAT_STREAM; }

/* ---- server.c ------------------------------------------------------------------------------ */

/* The one mapping from shardlm errors to gRPC status codes. */
grpc_status_code server_grpc_code(enum status s);
const char      *server_grpc_code_name(grpc_status_code c); /* "OK", "CANCELLED", ... */
/* Any thread. Puts wake_tag on the completion queue unless a wake is already on its way. */
void             server_wake(struct server *s);

/* Loads m's engine (weights, tokenizer, chat template) and starts it; on failure nothing of it
 * is left. Any thread, without models_mu (models.c calls it with m in MODEL_LOADING). */
enum status server_model_load(struct server *s, struct served_model *m);
/* Frees what server_model_load made (nothing when it made nothing). */
void        server_model_unload(struct served_model *m);
/* Records what /v1/models shows of m, loaded or not (models.c; m just loaded). */
void        server_model_note_info(struct server *s, struct served_model *m);

/* ---- models.c ------------------------------------------------------------------------------ */

/* How long a request waits for a model that another request is loading or unloading. */
#define MODELS_WAIT_S 120.0

/* The model a request names, pinned: NULL or "" = the first model; else the model whose id, or
 * one of whose adapters' names, it is (with one model every name routes to it: its engine says
 * NOT_FOUND for an adapter it lacks). A name that none serves is STATUS_NOT_FOUND naming it and
 * listing the served models. A model not loaded is loaded first (serve --models-max,
 * --sleep-idle-seconds): with may_block, here, after unloading the least recently used model
 * that no request pins when --models-max models are resident (STATUS_UNAVAILABLE when every one
 * is pinned; waits up to MODELS_WAIT_S for one that another thread loads or unloads); without
 * may_block (the gRPC loop, which must not wait), STATUS_OK with *m NULL: the caller loads it
 * elsewhere (call_pin_model). On STATUS_OK with *m set, the caller owns one pin: it must call
 * server_release once. Any thread. */
enum status server_acquire(struct server *s, const char *name, int may_block, struct served_model **m);
/* The model name routes to (*m: an id, else the adapter of a loaded model; the first model for
 * none), not pinned nor loaded: for a server whose models never unload (a journal). */
enum status server_route(struct server *s, const char *name, struct served_model **m);
/* One more pin of m, which the caller pins already (cannot fail). */
void        server_pin(struct server *s, struct served_model *m);
/* Gives back one pin of m (accepts NULL). */
void        server_release(struct server *s, struct served_model *m);
/* A pin of m when it is loaded now (m), else NULL: for looking at it (/v1/models, /metrics),
 * which is not a use; server_unpin_quietly gives it back (accepts NULL) without making m
 * recently used. */
struct served_model *server_pin_if_loaded(struct server *s, struct served_model *m);
void        server_unpin_quietly(struct server *s, struct served_model *m);
/* The control thread, every second with --sleep-idle-seconds: unloads the loaded models that no
 * request pinned for that long. */
void        server_models_sleep(struct server *s);
/* The control thread, at the drain: no more loads (server_acquire says UNAVAILABLE); waits for
 * the loads in progress to end. */
void        server_models_close(struct server *s);
/* GET /v1/models: every served model (with "loaded"), each followed by its adapters (parent: the
 * model) but those owner may not see (http_finetune_hidden); malloc'd JSON of *len bytes (aborts
 * when out of memory). */
char       *server_models_json(struct server *s, const char *owner, size_t *len);
/* 1 when adapter is the adapter of a fine-tuning job (http_finetune.c) that another API key made
 * than the one whose auth_owner is owner: it is that key's, as its files and jobs are; requests
 * and model lists of other keys do not see it (a request naming it is answered as one naming an
 * adapter that does not exist). 0 for any other adapter (--lora, LoadAdapter: the operator's),
 * and on a server without keys (every owner ""). */
int         http_finetune_hidden(const struct server *s, const char *adapter, const char *owner);

/* ---- call.c -------------------------------------------------------------------------------- */

const char *call_method_name(enum method m); /* "Generate", "Check", ... */
/* Starts one send batch: initial metadata when not sent yet, then the message (taking ownership
 * of msg[0..len) when non-NULL), then the status when with_status. One send batch at a time. */
void call_send(struct call *c, uint8_t *msg, size_t len, int with_status, grpc_status_code code,
               const char *details);
/* Ends the call with a status and no message (nothing when it has ended already). */
void call_fail(struct call *c, grpc_status_code code, const char *details);
void call_fail_status(struct call *c, enum status st, const char *message);
/* Ends a unary call with its one response message (takes ownership of msg). */
void call_reply(struct call *c, uint8_t *msg, size_t len);
/* Starts RECV_MESSAGE (reflection asks for the next message after each answer). */
void call_recv(struct call *c);
/* Hands a call's request message data[0..len) (borrowed) to its method's handler. */
void call_dispatch(struct call *c, const uint8_t *data, size_t len);
/* Pins the model `name` routes to (server_acquire) into c->m and returns STATUS_OK; when that
 * model is not loaded now, queues its load on the loader thread with a copy of data[0..len),
 * which is dispatched again (call_dispatch) once it is loaded, and returns STATUS_OK with c->m
 * NULL: the handler returns without answering. Errors: the call is to be answered with them. */
enum status call_pin_model(struct call *c, const char *name, const uint8_t *data, size_t len);
/* Frees the call once nothing can refer to it any more (close done, no batch in flight, no
 * sample held by the engine, no adapter load out); does nothing otherwise. */
void call_maybe_free(struct call *c);
/* Asks gRPC for the next incoming call into this slot. */
void call_slot_arm(struct request_slot *slot);
/* Completion handlers, one per tag kind of a call. */
void call_on_new(struct request_slot *slot, int ok);
void call_on_recv(struct call *c, int ok);
void call_on_send(struct call *c, int ok);
void call_on_close(struct call *c);

/* ---- generation.c -------------------------------------------------------------------------- */

/* Parses, tokenizes and submits a Generate / Chat request (data[0..len) is borrowed). */
void         gen_start(struct call *c, const uint8_t *data, size_t len);
/* Decides what a generation call sends next; called after every change to it. */
void         gen_pump(struct call *c);
/* Hands the events queued by the engine thread to their calls. */
void         gen_drain_events(struct server *s);
/* The generation call with this request id, or NULL: one running in the engine (submitted), or
 * a journaled one whose ACCEPT is being synced (not submitted: accepted, not yet in the engine;
 * its client may have gone meanwhile; a Cancel marks it, and gen_run ends it CANCELLED instead of
 * submitting it, nor does gen_synced start it for a reattach). */
struct call *gen_find_call(struct server *s, const char *request_id);
/* Frees what a generation call holds (output buffers, prompt log-probs, ids, messages). */
void         gen_call_release(struct call *c);
/* Appends an event's tokens (with their log-probabilities and top alternatives when given)
 * and text to b, growing it; aborts when out of memory. Both fronts use it. */
void         sample_buf_append(struct sample_buf *b, const int32_t *tokens, int n_tokens, const float *logprobs,
                               const struct top_logprob *top, int n_top, const char *text, size_t text_len);
/* n tokens of b arrived at time t: n inter-token latencies into m (none for its first tokens,
 * which the time to first token counts). */
void         sample_buf_note_tokens(struct sample_buf *b, struct metrics *m, int n, double t);
void         sample_buf_free(struct sample_buf *b);
/* Turns a parsed request into the prompt's token ids of model m (*ids malloc'd): its chat template (whose
 * stop string / token id it appends to r's stops, which must have room for one more) or the
 * tokenizer, or the given ids. Any thread (the HTTP front calls it from its own). */
enum status  gen_prompt(const struct served_model *m, struct gen_request *r, int is_chat, int32_t **ids, int *n);
/* Sets r->params.adapter, the adapter the request runs with on m (the model server_route chose),
 * from r->adapter, the name it gave: none (NULL or "") = m's --default-adapter (the base without
 * one); m's id (m->model_id) = the base (NULL); any other name as given (the engine says NOT_FOUND for one
 * not loaded; STATUS_INVALID_ARGUMENT here for one longer than an adapter name may be). Both
 * fronts call it once the request is parsed; params.adapter then borrows from r or from the
 * server's options. */
enum status  gen_resolve_adapter(const struct served_model *m, struct gen_request *r);

/* Parses a Generate / Chat request body (data[0..len), borrowed) into *r, routes its model (*m,
 * server_route: not pinned; a journaled server serves one model, always loaded) and builds its
 * prompt (gen_build_prompt): what a journaled request's resumption redoes from the journaled
 * body; owner: its key's auth_owner (an adapter it may not use is refused). On error *r is freed. */
enum status  gen_build(struct server *s, const uint8_t *data, size_t len, int is_chat, const char *owner,
                       struct gen_request *r, struct served_model **m, struct chat_parse *chat, int32_t **ids,
                       int *n_ids);
/* r's prompt on model m: the chat tools applied (chat, for is_chat), the prompt rendered and
 * tokenized (*ids malloc'd; NULL on error) and noted for reply parsing. r stays the caller's. */
enum status  gen_build_prompt(struct served_model *m, struct gen_request *r, int is_chat, struct chat_parse *chat,
                              int32_t **ids, int *n_ids);
/* Loop thread: one engine event into c's buffers as if the engine had sent it (no send, no free). */
void         gen_take_engine_event(struct call *c, const struct engine_event *ev);

/* ---- resume.c: the stream journal's requests, both fronts (docs/reliability.md) -------------- */

enum resume_key_state { RESUME_KEY_FREE, RESUME_KEY_LIVE, RESUME_KEY_RESUMED_HTTP, RESUME_KEY_RESUMED_GRPC };
/* Opens opts.journal_dir (s->journal) and keeps its open requests for resume_all; errors name
 * the directory. */
enum status resume_open(struct server *s);
/* Resumes the journal's open requests (after the engine is ready, before it serves), each by
 * its front (http_resume_entry, grpc_resume_entry). */
void        resume_all(struct server *s);
/* Who has key now; with s->resumed_mu held. */
enum resume_key_state resume_key_state(struct server *s, const char *key);
/* A journaled request's server id, "KIND-BOOT-R" (R: 64 random bits): unique across restarts
 * and not guessable, so that no client can name (reattach to, squat) another's request by
 * counting (a server without API keys has one owner for every client). */
void        resume_new_id(const struct server *s, const char *kind, char *out, size_t cap);
/* Whether one more first run of owner whose client went away may run on detached (both fronts:
 * http_resume_detached, grpc_resume_detached count them; ended ones cost memory, not work, and
 * are not counted): NULL when it may; else the limit it met, written into buf ("--journal-
 * detach-max (N)", or "--journal-detach-max-per-key (M) of its API key's"). With
 * s->resumed_mu held. */
const char *resume_detach_full(struct server *s, const char *owner, char *buf, size_t n);
/* The detached first runs still running, of owner only when owner is not NULL; with
 * s->resumed_mu held. */
int         grpc_resume_detached(struct server *s, const char *owner);
int         http_resume_detached(struct server *s, const char *owner);
/* Puts k (k->key set) in s->live when no request has its key, and returns RESUME_KEY_FREE;
 * else returns who has it and takes nothing. resume_key_release takes it out (when in). */
enum resume_key_state resume_key_claim(struct server *s, struct resume_key *k);
void        resume_key_release(struct server *s, struct resume_key *k);
/* resume_key_release with s->resumed_mu held (a key that moves to a resumed list at once). */
void        resume_key_unlink(struct server *s, struct resume_key *k);
/* Forgets the resumed requests of both fronts whose answer waited past --journal-retain. */
void        resume_sweep(struct server *s);
/* After the fronts stopped: drops what was resumed and not delivered (the journal keeps it). */
void        resume_stop(struct server *s);

/* http_resume.c (http_internal.h has the rest) */
struct http_gen *http_resume_find(struct server *s, const char *key); /* s->resumed_mu held */
int         http_resume_entry(struct server *s, struct journal_entry *e); /* 1: resumed; e emptied */
void        http_resume_stop(struct server *s);
void        http_resume_sweep(struct server *s); /* the HTTP half of resume_sweep */

/* ---- grpc_resume.c: the gRPC front's side of the stream journal ---------------------------- */

struct grpc_job *grpc_resume_find(struct server *s, const char *key); /* s->resumed_mu held */
/* Rebuilds a journaled gRPC request and resubmits its unfinished samples (1: resumed; e is
 * emptied then); one that cannot go on is ended in the journal (0). */
int         grpc_resume_entry(struct server *s, struct journal_entry *e);
void        grpc_resume_sweep(struct server *s);
void        grpc_resume_stop(struct server *s);
/* Loop thread: a first-run call's ACCEPT (body data[0..len), its seed fixed first, deadline in
 * Unix seconds or 0), written but not synced (*end for journal_sync, which the loader's journal
 * thread runs: generation.c); claims its request id. STATUS_ALREADY_EXISTS when a running or
 * resumed request has it, STATUS_UNAVAILABLE when the journal cannot take it. */
enum status grpc_journal_accept(struct call *c, const uint8_t *data, size_t len, struct request_params *p,
                                double deadline, long long *end);
/* Engine thread: a journaled call's event, journaled before its client can see it. */
void        grpc_journal_event(struct call *c, const struct engine_event *ev);
/* Loop thread: a call with metadata shardlm-resume-token reattaches to its journaled request
 * (or ends with NOT_FOUND, FAILED_PRECONDITION, INVALID_ARGUMENT, DEADLINE_EXCEEDED). */
void        grpc_resume_attach(struct call *c, const uint8_t *data, size_t len);
/* Loop thread: a journaled first run under --journal-detach-grace (ACCEPT on disk, c->live
 * claimed) submitted as a job that c reads, as a reattached call does: when c's client goes away
 * the request runs on, reattachable by its token for the grace (then cancelled and forgotten). */
enum status grpc_resume_first_run(struct call *c, const uint8_t *data, size_t len, const int32_t *ids, int n_ids,
                                  const struct request_params *p, double deadline);
/* Loop thread, after every wake: the reattached calls take their jobs' new events and send. */
void        grpc_resume_pump(struct server *s);
/* Loop thread: c's client went away (the job runs on) or c is freed (delivered or not). */
void        grpc_resume_detach(struct call *c);
/* Loop thread: Cancel of a reattached call cancels its job's engine requests. */
void        grpc_resume_cancel(struct call *c);
/* Loop thread: Cancel of a resumed request no call is attached to (key: its request id), by
 * owner (auth_owner of the Cancel call's key). Its samples end with FINISH_REASON_CANCELLED
 * (journaled), and its answer waits --journal-retain for a client as any resumed one's.
 * *cancelled: 0 when it had finished already. NOT_FOUND when no resumed request of owner has
 * the id. */
enum status grpc_resume_cancel_key(struct server *s, const char *key, const char *owner, int *cancelled);

/* ---- methods.c ----------------------------------------------------------------------------- */

/* Answers every method but Generate / Chat and health: Tokenize, Detokenize, Cancel,
 * GetModelInfo, GetServerStats, LoadAdapter, UnloadAdapter, and one reflection message. */
void methods_handle(struct call *c, const uint8_t *data, size_t len);

/* ---- embed.c: embeddings for both fronts, and gRPC Embed ----------------------------------- */

/* The most inputs one embedding request may carry (OpenAI's limit). */
#define EMBED_MAX_INPUTS 2048

/* An embedding request's inputs as token sequences: input i is ids[offsets[i] .. offsets[i+1]). */
struct embed_inputs {
    int32_t *ids;
    int32_t *offsets;  /* (n + 1) */
    int      n;
    size_t   cap;      /* of ids */
};
/* Checks r as both fronts do (the model: STATUS_NOT_FOUND unless NULL or m's id, m being the
 * model server_route chose for r->model; 1 .. EMBED_MAX_INPUTS inputs; no empty text) and
 * tokenizes its texts (with m's tokenizer's special tokens) into *in; the engine checks the rest
 * (engine_embed). Any thread. */
enum status embed_prepare(const struct served_model *m, const struct embed_request *r, struct embed_inputs *in);
/* embed_prepare, then engine_embed into *vecs ((in->n, d_model), malloc'd): blocks (the HTTP
 * front's threads). */
enum status embed_run(const struct served_model *m, const struct embed_request *r, struct embed_inputs *in,
                      float **vecs);
/* Frees what in holds; accepts a zeroed struct. */
void        embed_inputs_free(struct embed_inputs *in);
/* Counts one ended embedding request in the metrics (in: what embed_prepare made, maybe nothing). */
void        embed_observe(struct server *s, enum metrics_api api, enum status st, const struct embed_inputs *in);
/* Loop thread. Parses an Embed request and submits it (engine_embed_submit); the answer goes out
 * from embed_rpc_drain, or an error at once. */
void        embed_rpc_start(struct call *c, const uint8_t *data, size_t len);
/* Loop thread: answers the Embed calls whose requests the engine finished. */
void        embed_rpc_drain(struct server *s);
/* Loop thread: c's Embed request, in the engine, is cancelled (the client cancelled, the deadline
 * passed); its answer still comes back through embed_rpc_drain. */
void        embed_rpc_cancel(struct call *c);

/* ---- loader.c ------------------------------------------------------------------------------ */

/* Loop thread. Queues c's LoadAdapter of adapter name from path (taking ownership of both) for
 * the loader thread, started on first use; the answer goes out from loader_drain. */
void loader_submit(struct call *c, char *name, char *path);
/* Loop thread. Queues the load of model `name` for c (call_pin_model), with a copy of its
 * request data[0..len). */
enum status loader_submit_model(struct call *c, const char *name, const uint8_t *data, size_t len);
/* Loop thread. Queues work on c's request data[0..len) (copied) and ctx for lane's thread,
 * started on first use, so that a long tokenization does not hold up every other call; then
 * (or, without one, the answer: work's response or its error) runs from loader_drain. c->m is
 * pinned by the call. On an error nothing was queued (ctx stays the caller's). */
enum job_flags {
    JOB_RUNS_ABANDONED = 1, /* the work runs even when its call ended before it started */
};
enum status loader_submit_work(struct call *c, enum job_lane_kind lane, unsigned flags, call_work_fn work, call_then_fn then,
                               void *ctx, const uint8_t *data, size_t len);
/* Loop thread: answers the calls whose loads or work have finished, and frees the jobs. */
void loader_drain(struct server *s);
/* After the loop, once no call is left (so no job is out): stops and joins the loader's threads. */
void loader_stop(struct server *s);
/* Init / destroy of the loader's lock and condition (server_run). */
void loader_init(struct server *s);
void loader_destroy(struct server *s);

/* ---- health.c ------------------------------------------------------------------------------ */

void health_handle(struct call *c, const uint8_t *data, size_t len); /* Check and Watch */
void health_watch_pump(struct call *c); /* sends the status to a watcher when it changed */
void health_changed(struct server *s);  /* after a phase change: tells the watchers */

/* ---- auth.c -------------------------------------------------------------------------------- */

/* Reads the API keys (one per line, '#' comments) into s->keys. */
enum status auth_load_keys(struct server *s, const char *path);
/* After auth_load_keys, before the journal and the fine-tuning index are read: s->owners, each
 * key's owner, "key-" and 32 hex digits of PBKDF2-HMAC-SHA256(the key, this installation's
 * salt). The salt is DIR/owner.salt (16 random bytes in hex, mode 0600) of the state
 * directories, --journal and --fine-tuning: read from those that have it and written to those
 * that lack it (a new one when none has it; one per process when neither flag is given).
 * Errors: two directories with different salts, or a salt file that is not one, are
 * STATUS_FAILED_PRECONDITION / STATUS_BAD_FORMAT naming the files; STATUS_IO. */
enum status auth_derive_owners(struct server *s);
/* Insecure credentials, or TLS ones from --tls-cert / --tls-key. */
enum status auth_make_credentials(const struct server_options *o, grpc_server_credentials **out);
/* 1 when no key is required (*key = -1), or the metadata carry "authorization: Bearer <one of
 * the keys>" (*key = its line among the keys). */
int         auth_authorized(const struct server *s, const grpc_metadata_array *md, int *key);
/* The index of key[0..n) in s->keys, or -1 (constant time per key). */
int         auth_key_index(const struct server *s, const char *key, size_t n);
/* The client name of API key `key` for --scheduling-policy fair ("key:<index>": the key itself
 * never leaves auth.c). Both fronts use it, so that one key is one client over gRPC and HTTP. */
void        auth_client_name(int key, char *out, size_t cap);
/* Who owns a request sent with API key `key` (-1: none): "" without keys, else the key's entry
 * of s->owners (auth_derive_owners): a salted PBKDF2 hash of the key, stable across restarts and
 * key-file reorderings (journaled with the request: journal_entry.owner; the fine-tuning index's
 * files and jobs), slow to test guesses against. A journaled request is reattached, and a
 * request cancelled by id, only by its owner; the store of /v1/responses is kept per owner.
 * Cheap and lock-free (a copy): called per request on any thread. */
void        auth_owner(const struct server *s, int key, char *out, size_t cap);
/* The owner of key as versions before owner.salt wrote it: "key-" and 16 hex digits of an
 * unkeyed FNV-1a 64 hash. For auth_owner_upgrade alone. */
void        auth_owner_legacy(const char *key, char *out, size_t cap);
/* Migration of an owner read from disk (owner: cap bytes, at least JOURNAL_OWNER_MAX + 1): a
 * legacy owner (auth_owner_legacy's form) of one of the keys becomes that key's owner (returns
 * 1); anything else is left as it is (returns 0): a legacy owner of a key no longer in the key
 * file matches no request's owner. The journal (resume_open) and the fine-tuning index
 * (ft_store_load) pass every owner they read through it. */
int         auth_owner_upgrade(const struct server *s, char *owner, size_t cap);

/* ---- http.c -------------------------------------------------------------------------------- */

/* Starts the HTTP daemon on opts.http_listen; prints "shardlm: http listening on HOST:PORT". */
enum status http_start(struct server *s);
/* Lets open streams finish (up to 2 s) and stops the daemon; accepts a server without one. */
void        http_stop(struct server *s);

/* The seconds of a test's delay or pause in the environment variable name (0: unset, or not in
 * (0, 600)); read once, at start. */
double server_test_delay(const char *name);
/* Whether a journaled request's FINISHED event is the server's, not the request's end: the
 * drain's cancel (not the client's: by_client) or the engine's failure (engine_event_is_failure).
 * Neither journaled nor shown, so that a restart resumes it (resume.c). */
int server_cut_event(struct server *s, enum engine_event_kind kind, enum finish_reason finish, enum status st,
                     int by_client);

#endif
