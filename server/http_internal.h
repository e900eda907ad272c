/* server/http_internal.h - what the files of the HTTP front share:
 *
 *   http_gen.c     one generation request: submitting, waiting for events, SSE, client
 *                  disconnects (engine_cancel)
 *   http_guard.c   connection slots, the header and body deadlines, the connection caps
 *   http.c         the libmicrohttpd daemon (a thread per connection, a bounded number of
 *                  connections), routing, API keys, the one status-to-HTTP mapping with its
 *                  OpenAI error objects, submitting to the engine, waiting for events, SSE,
 *                  client disconnects (engine_cancel)
 *   http_route.c   which URL is which route, and the methods each allows
 *   http_json.c    a body parsed to one reading, fields refused by name, checked builders
 *   http_openai.c  OpenAI request JSON -> struct gen_request (types only: every numeric range
 *                  is engine_validate's), and the response / chunk JSON
 *   http_anthropic.c, http_responses.c  Anthropic's Messages API and OpenAI's Responses API as
 *                  translations onto the chat path (their replies: *_out.c)
 *
 * Threads: each connection's handler runs on its own libmicrohttpd thread; engine events
 * arrive on the engine thread and only append to the request under its mutex and signal.
 * Not here: gRPC (server.c, call.c), protobuf (convert.c).
 * Tests: tests/server/test_http.py. */
#ifndef SHARDLM_HTTP_INTERNAL_H
#define SHARDLM_HTTP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "convert.h"
#include "journal.h"
#include "server_internal.h"

/* The most prompts one /v1/completions request may carry (`prompt` as a list): each becomes
 * its own engine request. */
#define HTTP_MAX_PROMPTS 64

/* The most JSON the store of /v1/responses keeps (responses and their conversations), beside
 * its count (--responses-store): the least recently used go first. */
#define HTTP_RESPONSES_STORE_BYTES ((size_t)256 << 20)

/* One prompt of a completions request: a text or token ids (exactly one of them). */
struct http_prompt {
    char    *text;         /* NUL-terminated, text_len bytes; NULL for token ids */
    size_t   text_len;
    int32_t *ids;          /* (n_ids); NULL for a text */
    int      n_ids;
};

/* What the served chat template can do (server.c finds it at start-up): a Jinja template (whose
 * render context the request builds), its tool-call format (enum tool_format) and whether
 * replies are split at <think>. A zeroed struct: a built-in template, the generic format. */
struct http_chat_caps {
    int jinja;
    int tool_format;
    int reasoning; /* enum tool_reasoning: the markers replies are split at (0: not split) */
    int effort;    /* the template reads `reasoning_effort` (GPT-OSS's): the request's is given to it */
    int tools_prompt; /* enum tool_prompt: the template never reads `tools` and the server writes them */
    int ds_fenced;    /* DeepSeek's calls in R1's fenced shape (served_model.ds_fenced) */
    int calls_as_text; /* an assistant's tool_calls written into its content (served_model.calls_as_text) */
    int kimi_counter;  /* Kimi-K2's call indexes count across the conversation (served_model.kimi_counter) */
    int response_format; /* the template reads `response_format` (DeepSeek V4's): a request's JSON Schema
                            constraint (response_format, structured_outputs, gRPC's) is given to it */
    int thinking_switch; /* the template reads `enable_thinking` (Qwen 3's): the reasoning can be turned
                            on and off (Anthropic's thinking, the Responses API's effort none) */
};
/* The caps of served model m. */
static inline struct http_chat_caps http_model_caps(const struct served_model *m)
{
    return (struct http_chat_caps){m->jtmpl != NULL, m->tool_format, m->reasoning, m->reads_effort, m->tools_prompt,
                                   m->ds_fenced, m->calls_as_text, m->kimi_counter, m->reads_response_format,
                                   m->reads_thinking};
}

/* A parsed OpenAI request: the engine's request plus what shapes the answer. */
struct http_request {
    struct gen_request r;  /* params.max_tokens is -1 when the client gave none; completions
                              leave r.prompt and r.prompt_ids NULL (see prompts) */
    struct http_prompt *prompts; /* completions: (n_prompts), 1 .. HTTP_MAX_PROMPTS */
    int n_prompts;
    int is_chat;
    int stream, include_usage;
    int logprobs;          /* completions: -1 none, else top-n; chat: -1 or top_logprobs */
    int echo;              /* completions: the prompt text before the output (and, with
                              logprobs, the prompt tokens' log-probabilities) */
    struct served_model *model; /* the model the request named (server_route; set after parsing,
                              which zeroes it); NULL: the first */
    int tools;             /* chat with tools (http_tools.c): the reply is parsed into tool_calls */
    int tool_format;       /* enum tool_format of the reply when tools is set */
    int max_calls;         /* parallel_tool_calls false: 1; else 0 (no limit) */
    char *arg_types;       /* the XML-like formats: how the tools' values are read back
                              (tool_format_arg_types, malloc'd), or NULL */
    int reasoning;         /* split reasoning into reasoning_content: enum tool_reasoning (its markers) */
    int anthropic;         /* /v1/messages (http_anthropic.c): replies in Anthropic's shape */
    struct http_responses *responses; /* /v1/responses (http_responses.c): replies as Response
                                         objects and their events; NULL otherwise */
    int n_user_stops;      /* anthropic: the client's stop_sequences (the first of r.stop) */
    char owner[JOURNAL_OWNER_MAX + 1]; /* auth_owner of its API key ("" without keys; set after
                              parsing): who may reattach to it, see its stored response */
};

/* Where an Anthropic stream is (http_anthropic_out.c): message_start sent, the open content
 * block (its index and kind), tool_use blocks opened. */
struct http_anthropic_stream {
    int started, open, kind, index, calls;
};

/* A stream's view of one sample whose text is parsed (tools or reasoning): its incremental
 * parse, fed the prompt's prefill first, which also knows what went out (http_openai_out.c). */
struct http_parse_stream {
    struct tool_stream *ts;   /* the sample's incremental parse (tool_format.h), made at its first chunk */
};

/* http_tools.c: tools, tool_choice and parallel_tool_calls of o into q (after its messages and
 * constraint): the tools' text in the system message, the reply's schema as the constraint. */
struct cJSON;
enum status http_tools_parse(const struct cJSON *o, const struct http_chat_caps *caps, struct http_request *q);
/* http_tools_glm.c: the GBNF grammar of a reply of GLM-4.5 tool calls to tools (only: that
 * function alone; parallel: one call or more, else one; lazy: of what follows the first call's
 * <tool_call>), malloc'd. */
/* The JSON Schema (text, malloc'd; NULL when out of memory) that constrains DeepSeek's calls of
 * tools (a JSON list as the API takes it, checked; only: the named function or NULL): R1's fenced
 * shape or V3.1's, lazy (tool_choice auto: what follows <｜tool▁calls▁begin｜>) or not (what follows
 * <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>); kimi: Kimi-K2's, its call numbered index. For
 * tests/test_tool_stream.c. */
char *http_tools_deepseek_schema(const struct cJSON *tools, const char *only, int parallel, int fenced, int lazy,
                                 int kimi, int index);
/* The JSON Schema (the same) of functionary v3.1's calls after `<function=` (one, or with parallel
 * one or more), for tests/test_tool_stream.c. */
char *http_tools_functionary_schema(const struct cJSON *tools, const char *only, int parallel);
/* The GBNF grammar (malloc'd) of the XML-like calls (http_tools_glm.c) of tool_format f
 * (tool_format_is_xml) of tools: the whole reply (lazy 0), what follows the block's marker
 * (lazy 1), or (lazy 2, Qwen3-Coder's under auto: engine.h TRIGGER_READS_MARKER) a block from its
 * marker on or a bare <function=...> call. */
char *http_tools_glm_grammar(int f, const struct cJSON *tools, const char *only, int parallel, int lazy);
/* The first declared key of params (a function's parameters schema) that the XML-like format f
 * cannot write so that its parser reads it back (Qwen3-Coder's `<parameter=K>` ends at '>',
 * MiniMax-M2's and DSML's `<parameter name="K">` at '"', GLM's `<arg_key>K</arg_key>` at its
 * closing tag; a newline or '<' in Qwen's, MiniMax's or DSML's), *key_end then where the format
 * ends a key; or NULL; NULL for the other formats (http_tools_glm.c, one table of the formats). */
const char *http_tools_xml_unwritable_key(int f, const struct cJSON *params, const char **key_end);
/* XML-like format f's calls in words (the 400 of a tool's `strict: true`). */
const char *http_tools_xml_label(int f);
/* The functions of tools (the named one only, when only is set) as one JSON list, malloc'd; NULL
 * when out of memory (http_tools.c). */
char *http_tools_functions_json(const struct cJSON *tools, const char *only);
/* With a Jinja template (http_tools_context.c): r->chat_context from o's messages (as sent, when the template's own
 * tool format is used), the tools of the request (NULL: none) and chat_template_kwargs. */
enum status http_tools_context(const struct cJSON *o, const struct cJSON *tools, const struct http_chat_caps *caps,
                               struct http_request *q);
/* A request that shows special tokens (field: how its field is named in the message) whose reply
 * is parsed (tools, reasoning: their markers and JSON would meet the special tokens' text) or
 * constrained (the grammar's text has no special tokens) is refused: STATUS_INVALID_ARGUMENT
 * naming both. */
enum status http_show_special_check(const struct request_params *p, int tools, int reasoning, const char *field);
/* The text of message i of the history when it is a tool result (role "tool") or an assistant's
 * tool calls (*content malloc'd); *content NULL for any other message. */
enum status http_tools_message(const struct cJSON *msg, int i, const char *role, char **content);
/* Parses a reply text[0..n) (the prompt's prefill first) of q into message (OpenAI's
 * reasoning_content, content, tool_calls; the calls' ids from call_id_base). Returns whether it
 * holds tool calls. */
int http_tools_reply(const struct http_request *q, int think_open, const char *text, size_t n,
                     const char *call_id_base, struct cJSON *message);
/* A call's id: "call_<base>_<k>", or for the Mistral format (whose templates keep the last 9
 * characters of ids) 9 letters and digits derived from it. */
void http_tools_call_id(const struct http_request *q, const char *base, int k, char *out, size_t cap);

/* ---- http_route.c: the route table ------------------------------------------------------- */
/* The routes, each with the methods it allows. */
enum http_route {
    ROUTE_NONE, ROUTE_COMPLETIONS, ROUTE_CHAT, ROUTE_MODELS, ROUTE_HEALTH, ROUTE_METRICS,
    ROUTE_MESSAGES, ROUTE_COUNT_TOKENS, /* Anthropic's Messages API (http_anthropic.c) */
    ROUTE_EMBEDDINGS,                   /* http_embeddings.c */
    ROUTE_RESPONSES, ROUTE_RESPONSE_ITEM, ROUTE_RESPONSE_CANCEL, /* OpenAI's Responses API (http_responses.c) */
    ROUTE_RESPONSE_INPUT_ITEMS, ROUTE_RESPONSE_INPUT_TOKENS,
    ROUTE_FINETUNE                      /* /v1/files..., /v1/fine_tuning/jobs... (http_finetune.c) */
};
/* The route of a URL as it came (no percent-decoding), without its query string. */
enum http_route http_route_of(const char *url);
/* The POST routes with a JSON body (embeddings included: keys, content type and length are
 * checked alike). */
int http_route_generates(enum http_route r);
/* Whether errors go out in Anthropic's shape. */
int http_route_anthropic(enum http_route r);
/* The Allow header of a route. */
const char *http_route_allow(enum http_route r);
int http_route_method_allowed(enum http_route r, const char *method);

/* ---- http_json.c: the JSON of bodies ------------------------------------------------------ */
/* The body[0..len) of a request as one JSON object (*out, the caller's): refused
 * (STATUS_INVALID_ARGUMENT) when it is not UTF-8, not JSON, has bytes after its value, is not an
 * object, holds U+0000 in a string or member name (named by its path), or has a member name twice
 * in one object (every reader of the body must see the same request). */
enum status http_json_parse_body(const char *body, size_t len, struct cJSON **out);
/* Member name of o, or NULL when absent or JSON null (both mean "not given"). */
const struct cJSON *http_json_field(const struct cJSON *o, const char *name);
/* 1 when name is in list (NULL-terminated). */
int http_json_listed(const char *const *list, const char *name);
/* Refuses (STATUS_INVALID_ARGUMENT, naming it) a member of object o (named where: "" for the
 * body) that is not in allowed (NULL-terminated). */
enum status http_json_only_fields(const struct cJSON *o, const char *where, const char *const *allowed);
/* A deep copy of v; CHECKs on out of memory. */
struct cJSON *http_json_dup(const struct cJSON *v);
/* j itself, checked: building a reply's JSON out of memory is fatal (CHECK). */
struct cJSON *http_json_ok(struct cJSON *j);
/* o printed unformatted (the caller frees it) and deleted; out of memory is fatal. */
char *http_json_print(struct cJSON *o);

/* Parses body[0..len) (borrowed) into *q (free with http_request_free). served_model: the id
 * that `model` must name (STATUS_NOT_FOUND otherwise). Errors: STATUS_INVALID_ARGUMENT naming
 * the field and the type it must have. */
enum status http_parse_request(const char *body, size_t len, int is_chat, const char *served_model,
                               const char *const *adapters, int n_adapters, const struct http_chat_caps *caps,
                               struct http_request *q);
/* Frees what *q owns; accepts a zeroed struct. */
void        http_request_free(struct http_request *q);

/* One engine request of an HTTP request: a completions request with several prompts has one
 * per prompt, every other request exactly one. Its samples are http_gen.samples[index * n ..
 * index * n + n), so that choice indices are prompt-major (vLLM's). Guarded by http_gen.mu. */
struct http_run {
    struct http_gen *g;
    int         index;          /* the prompt's position in the request */
    uint64_t    handle;
    int         submitted;
    int         prompt_tokens, cached_prompt_tokens;
    char       *echo;           /* echo: the prompt's text (echo_len bytes); NULL otherwise */
    size_t      echo_len;
    /* echo with logprobs: the PROMPT_LOGPROBS event's copy (prompt_lp_ready once it came) */
    int32_t    *prompt_ids;     /* (n_prompt) */
    float      *prompt_lp;      /* (n_prompt); entry 0 has no log-probability */
    struct top_logprob *prompt_top; /* (n_prompt, n_prompt_top), or NULL */
    int         n_prompt, n_prompt_top, prompt_lp_ready;
    int32_t    *ids;            /* (n_ids) the prompt's tokens (kept for a resumption) */
    int         n_ids;
    int         sample_base;    /* a resumed sample's run (http_resume.c): its events' sample 0 is
                                   this sample of the prompt; 0 otherwise */
};


/* One generation request of the HTTP front. Reference-counted: the connection holds one
 * reference, the engine one until the last sample's FINISHED event (over every run), a
 * streaming response one. */
struct http_gen {
    atomic_int      refs;
    pthread_mutex_t mu;          /* guards everything below that events change */
    pthread_cond_t  cv;          /* signalled on every event */
    struct server  *s;
    struct served_model *m;      /* the model it runs on: q.model (pinned by g until it is freed,
                                    or until its last bytes are formed: http_gen_release_model),
                                    or the first (a resumed request) */
    atomic_int      model_released; /* the pin of q.model is given back */
    struct http_request q;
    char            id[JOURNAL_KEY_MAX + 1]; /* "cmpl-N" / "chatcmpl-N", a journaled one's "KIND-BOOT-R", or the Idempotency-Key */
    char            detach_limit[80]; /* the limit its hang-up met when it could not run on detached
                                         (resume_detach_full), for the log */
    int             counted;     /* http_gen_observe ran: in /metrics once, whoever ended it (its
                                    stream, its hang-up, or the sweep of a detached request whose
                                    client never came back) */
    long long       created;     /* Unix seconds */
    struct http_run *runs;       /* (n_runs) one per prompt */
    int             n_runs;
    int             n_per_run;   /* the request's n: samples per prompt */
    int             active;      /* samples without FINISHED, over every run */
    struct sample_buf *samples; /* (n_samples = n_runs * n_per_run), prompt-major */
    int             n_samples;
    enum status     end_status;  /* STATUS_OK, or why the request ended early */
    char            end_message[256];
    double          t_submit, t_first, queue_s; /* queue_s < 0 until known */
    int             hangup;      /* the client went away */
    int             half_closed; /* the client shut its sending side right after the request
                                    and still reads (http.c, peer_gone) */
    int             done;        /* a stream formed its last bytes ([DONE]) */
    int             eos_sent;    /* a stream handed its last bytes to libmicrohttpd: delivered */
    int             end_journaled; /* its END went to the journal (a first run handed over whole
                                    stays reattachable in memory, not across a restart) */
    int             fd;          /* the connection's socket, polled for hang-ups */
    struct http_parse_stream *ps; /* (n_samples) when replies are parsed and streamed; else NULL */
    struct http_anthropic_stream an; /* q.anthropic streams */
    char           *out;         /* a stream's bytes not yet handed to libmicrohttpd */
    size_t          out_len, out_pos, out_cap;
    /* The stream journal (serve --journal, http_resume.c, docs/reliability.md). */
    int             journaled;   /* its ACCEPT is in s->journal: events go there first */
    int             drained;     /* ended by the server's drain: no END, so a restart resumes it */
    int             resumed;     /* rebuilt from the journal after a restart: runs whether or not a
                                    client is attached, and is kept (s->resumed) for one */
    int             attached;    /* resumed: a client reads it now */
    int             replaying;   /* its log is being replayed into it: not logged again */
    int             usage_sent;  /* the client has the usage (or error) chunk: only [DONE] is left */
    int             delivered;   /* resumed: a client got the whole answer */
    int             front;       /* journaled: its endpoint (enum journal_front), which a client
                                    reattaching must name again */
    int             sse_per_event; /* journaled Anthropic and Responses streams: their events are
                                    formed as the engine's events come (http_gen_take_event), so
                                    that a stream is a function of the journal and a client's
                                    position is the number of events it got ("KEY;eN") */
    int             sse_events;  /* sse_per_event: the events formed since the view was rebuilt */
    int             observed;    /* sse_per_event: the end was counted (http_gen_observe) */
    int             keep_log;    /* a journaled first run keeps its events in log, as a resumed
                                    request does, in case its client goes and comes back */
    double          t_detached;  /* a first run whose client went away (--journal-detach-grace):
                                    when it went; 0 while a client reads it, or never detached */
    int             abandoned;   /* its client did not come back within the grace: no client may
                                    reattach; it stays listed (its key taken) until its END is queued */
    struct http_gen *next_cancel; /* the sweep's list of those to cancel */
    double          t_ended;     /* resumed: when its last sample finished (retention) */
    struct journal_entry log;    /* resumed (or keep_log): every event, to rebuild a reattaching
                                    client's view */
    struct http_run *subs;       /* resumed: (n_subs) one engine request per unfinished sample */
    int             n_subs;
    struct http_gen *next_resumed;
    struct resume_key live;      /* its id in s->live while a journaled first run has it */
};

/* http_gen.c: one engine event into g's buffers (and the journal when g is journaled and
 * journal is set); with g->mu held. Returns 1 when it was the last sample's FINISHED. */
int  http_gen_take_event(struct http_gen *g, struct http_run *r, const struct engine_event *ev, int journal);
/* http_gen.c: g's endpoint as the journal names it (enum journal_front). */
int  http_gen_front(const struct http_gen *g);
/* http_gen.c: a new http_gen for q (ownership moves in; the caller's reference) with its runs
 * tokenized and validated, nothing submitted (http_gen_submit's first half; http_resume.c). */
enum status http_gen_prepare(struct server *s, struct http_request *q, int fd, const char *id, struct http_gen **out);

/* http_resume.c: takes g's id for a journaled first-run request (s->live) until
 * http_resume_release: STATUS_ALREADY_EXISTS when a running or resumed request has it (an
 * Idempotency-Key sent twice while its first request runs). */
/* Takes g's id (an Idempotency-Key, or a server id: random, resume_new_id) in the registry of
 * journaled keys; ALREADY_EXISTS when another request holds it. */
enum status http_resume_claim(struct server *s, struct http_gen *g);
/* Room for a tool call's id ("call_<request id>_<sample>_<k>"; a request id may be a 100-byte
 * Idempotency-Key) and for an Anthropic "toolu_" one made from it. */
#define HTTP_CALL_ID_MAX (JOURNAL_KEY_MAX + 64)
void        http_resume_release(struct http_gen *g);
/* http_gen.c: the engine callback of a run (ctx: struct http_run). */
void        http_gen_on_event(void *ctx, const struct engine_event *ev);
/* http.c: the adapters loaded now, by name (a request's "model" may name one). */
struct http_adapter_snapshot {
    char names[ENGINE_MAX_ADAPTERS][65];
    const char *ptrs[ENGINE_MAX_ADAPTERS];
    int n;
    struct server *s;
    const char *owner;
};
/* m's adapters that owner (auth_owner of a request's key) may use (http_finetune_hidden). */
void        http_adapter_snapshot(struct server *s, struct served_model *m, const char *owner,
                                  struct http_adapter_snapshot *an);
/* http_resume.c: a request naming a journaled stream (Last-Event-ID or Idempotency-Key header):
 * *g gets the attached gen (a reference) and *skip what the client has (NULL: everything);
 * front: the endpoint the request came to again (enum journal_front), which must be the first's;
 * owner: who sends it (auth_owner): another owner's request is answered as one that does not exist;
 * STATUS_NOT_FOUND when the key names none (then a new request may take it as its id),
 * FAILED_PRECONDITION when another client reads it. */
enum status http_resume_attach(struct server *s, const char *key, int front, const char *owner, const char *state,
                               int fd, struct http_gen **g);
/* http_resume.c: the path of a journal front ("/v1/messages"). */
const char *http_resume_endpoint(int front);
/* http_resume.c: a resumed /v1/responses request that ended with no client attached: its final
 * Response object into the store (g's view rebuilt from its log); with g->mu held. */
void        http_resume_store_final(struct http_gen *g);
/* http_resume.c: a journaled first run whose client went away (HTTP_HANGUP_DETACH) joins the
 * resumed requests (its key moves from s->live to s->resumed under one lock, the list takes a
 * reference) and waits --journal-detach-grace seconds for a client to reattach. */
/* Adopts g (its connection ended) into s->resumed; 0 when it still runs and
 * --journal-detach-max others run detached already (then g is not adopted: the caller cancels
 * it as a hang-up's). */
int         http_resume_adopt(struct http_gen *g);
/* http_resume.c: a resumed gen's client has its answer (END, out of the table), or went away. */
void        http_resume_detach(struct http_gen *g, int delivered);
/* http_resume.c: the SSE id of g's next chunk ("KEY;T.B[!],..." per sample, or "KEY;done"). */
void        http_resume_sse_id(struct http_gen *g, int done);
/* http_resume.c: the SSE id of an Anthropic or Responses event of a journaled stream
 * ("KEY;eN": it is the stream's Nth event), appended to g->out; nothing for another stream. */
void        http_resume_event_id(struct http_gen *g);
/* http_openai_out.c: marks sample i's first tokens and text bytes as sent (a reattaching
 * client's Last-Event-ID), priming a parsed reply's state with that text. */
void        http_stream_skip(struct http_gen *g, int i, int tokens, size_t bytes, int final_sent);

/* Appends to a growable buffer; CHECKs on out of memory (responses are small). */
void http_buf_append(char **p, size_t *len, size_t *cap, const char *data, size_t n);

/* The unary response of a finished request (every sample), malloc'd JSON. */
char *http_response_json(struct http_gen *g);
/* SSE bytes for what samples hold now (one chunk per sample with news), appended to
 * g->out; marks finals sent. Called with g->mu held. */
void  http_stream_chunks(struct http_gen *g);
/* The usage chunk (stream_options.include_usage) and an error event, then [DONE]. */
void  http_stream_finish(struct http_gen *g);
/* {"error": {...}} with the given message, type and code; malloc'd. */
char *http_error_json(const char *message, const char *type, const char *param, const char *code);

/* ---- http_finetune.c: OpenAI's /v1/files and /v1/fine_tuning/jobs ------------------------- */

/* Creates DIR/files and DIR/jobs and starts the job worker (opts.finetune_dir set). */
enum status http_finetune_start(struct server *s);
/* The adapters of the jobs that succeeded before a restart, loaded again under their names (the
 * control thread, once the models are loaded and before the server is ready). */
void        http_finetune_publish(struct server *s);
/* Stops a running job at its iteration's end, joins the worker, frees everything; accepts a
 * server without fine-tuning. */
void        http_finetune_stop(struct server *s);
/* Answers METHOD URL (a /v1/files... or /v1/fine_tuning/jobs... route; q its query, paging the
 * lists, refused by name elsewhere) with its body: *out (owned, *out_len bytes, of type *out_type)
 * or an error status with its message. */
/* One part of a multipart/form-data body (http_multipart.c): its name, filename and bytes. */
struct http_part {
    char name[64], filename[256];
    const char *data;
    size_t len;
};
/* Splits a multipart/form-data body (RFC 7578; ctype its Content-Type, with the boundary) into at
 * most max parts (*n of them), each borrowing body's bytes. */
enum status http_multipart(const char *ctype, const char *body, size_t len, struct http_part *parts, int max, int *n);
struct http_query;
enum status http_finetune_handle(struct server *s, const char *owner, const char *method, const char *url,
                                 const struct http_query *q, const char *ctype, const char *body, size_t len,
                                 char **out, size_t *out_len, const char **out_type);
/* "HOST:PORT", "[V6]:PORT", or ":PORT" / "PORT" (the loopback address): the address, and the
 * host part in host (http_guard.c). */
enum status http_parse_address(const char *addr, struct sockaddr_storage *ss, socklen_t *sl, char *host, size_t cap);

/* ---- http_embeddings.c: OpenAI's /v1/embeddings ------------------------------------------- */

/* Parses body[0..len), runs engine_embed and makes the response (*json, malloc'd) or returns the
 * error (INVALID_ARGUMENT / UNSUPPORTED / NOT_FOUND naming the field, the engine's errors). */
enum status http_embeddings(struct server *s, const char *body, size_t len, char **json);

/* ---- http_anthropic.c, http_anthropic_out.c: Anthropic's Messages API ------------------- */

/* Parses an Anthropic Messages body[0..len) into *q (as http_parse_request, whose chat path it
 * rewrites the request for); count: /v1/messages/count_tokens (no max_tokens, no sampling). */
enum status http_anthropic_parse(const char *body, size_t len, int count, const char *served_model,
                                 const char *const *adapters, int n_adapters, const struct http_chat_caps *caps,
                                 struct http_request *q);
/* The unary message object of a finished request, malloc'd JSON. */
char *http_anthropic_response(struct http_gen *g);
/* With g->mu held: the stream events of one chat chunk (taken), appended to g->out. */
void  http_anthropic_chunk(struct http_gen *g, struct cJSON *chunk);
/* With g->mu held: the closing events (or an error event); marks the stream done. */
void  http_anthropic_finish(struct http_gen *g);
/* {"type": "error", "error": {type, message}} for an HTTP code; malloc'd. */
char *http_anthropic_error_json(unsigned code, const char *message);
/* {"input_tokens": n}; malloc'd. */
char *http_anthropic_count_json(int n_tokens);

/* ---- http_responses.c, http_responses_out.c: OpenAI's Responses API ---------------------- */

struct http_responses;
struct http_responses_store;

/* The store of responses for GET, cancel and previous_response_id: at most max_entries, and
 * max_bytes of JSON; the least recently used go first. */
enum status http_responses_store_init(int max_entries, size_t max_bytes, struct http_responses_store **out);
/* Frees st once no request uses it. Accepts NULL. */
void        http_responses_store_free(struct http_responses_store *st);
/* Parses a Responses body[0..len) into *q (as http_parse_request, whose chat path it rewrites the
 * request for), with the conversation of previous_response_id from s's store (owner: who may
 * see it: "" without API keys, else the key's client name); model_id: the id of the model the
 * request named (server_route), the base its `model` may name. */
enum status http_responses_parse(struct server *s, const char *model_id, const char *body, size_t len,
                                 const char *owner, const char *const *adapters,
                                 int n_adapters, const struct http_chat_caps *caps, struct http_request *q);
/* Frees r. Accepts NULL. */
void        http_responses_free(struct http_responses *r);
/* g was submitted: stored (when asked) as in progress, so that it can be retrieved and cancelled. */
void        http_responses_begin(struct http_gen *g);
/* g is being freed: the store forgets it (no more cancels reach it). */
void        http_responses_forget(struct http_gen *g);
/* The stream journal (http_resume.c): the body journaled for g (malloc'd JSON: the equivalent
 * chat request and what g's Response object and the store need, so that the request resumes
 * without the store, which a restart empties), and that body parsed again into *q. */
char       *http_responses_journal_body(const struct http_gen *g);
enum status http_responses_restore(const char *body, size_t len, const char *model_id, const char *const *adapters,
                                   int n_adapters, const struct http_chat_caps *caps, struct http_request *q);
/* A reattaching client's stream starts again from the first event (http_resume.c). */
void        http_responses_reset_stream(struct http_responses *r);
/* With g->mu held, once g ended: its Response object (completed, incomplete or cancelled),
 * malloc'd and stored; NULL when it failed (the caller answers g->end_status). */
char       *http_responses_response(struct http_gen *g);
/* With g->mu held: the stream events of one chat chunk (taken), appended to g->out. */
void        http_responses_chunk(struct http_gen *g, struct cJSON *chunk);
/* With g->mu held: the closing events (response.completed, .incomplete or .failed); marks the
 * stream done. */
void        http_responses_finish(struct http_gen *g);
/* GET or DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel (url as it came, method)
 * for owner ("" without API keys): *json malloc'd on STATUS_OK. */
enum status http_responses_item(struct server *s, const char *owner, const char *method, const char *url,
                                char **json);

#define HTTP_MAX_MESSAGES 4096 /* a chat's messages, a response's input items (with its previous ones) */

/* A request's query parameters as libmicrohttpd gives them (borrowed while it is handled); more:
 * there were more than HTTP_MAX_QUERY. */
#define HTTP_MAX_QUERY 8
struct http_query {
    const char *key[HTTP_MAX_QUERY], *value[HTTP_MAX_QUERY];
    int n, more;
};
/* ---- http_list.c: OpenAI's paged lists ---- */
struct http_list {
    const char *after;   /* the id the page starts after, or NULL */
    int limit, desc;     /* at most limit items; desc: the listing's own order (newest first), else reversed */
    const char *purpose; /* /v1/files' filter, or NULL */
};
/* q read for a list route: after, limit (1 .. limit_max, default limit_default), order and purpose,
 * each only if named in allowed ("after,limit,order"); any other parameter refused by name. */
enum status http_list_options(const struct http_query *q, const char *allowed, int limit_default, int limit_max,
                              struct http_list *o);
/* *out: OpenAI's list object (data, first_id, last_id, has_more) of items (an array of objects with
 * "id", newest first; taken) paged by o; an after that names no item is STATUS_INVALID_ARGUMENT
 * naming what ("the response 'resp_...'"). */
enum status http_list_page(struct cJSON *items, const struct http_list *o, const char *what, struct cJSON **out);

/* GET /v1/responses/{id}/input_items (url as it came) for owner: the conversation the response
 * was given (previous_response_id's items and output, then its input), OpenAI's list object
 * paged by q's after, limit and order (any other parameter refused by name). */
enum status http_responses_input_items(struct server *s, const char *owner, const char *url,
                                       const struct http_query *q, char **json);
/* POST /v1/responses/input_tokens: the body[0..len) parsed as http_responses_parse does, with
 * only the fields of a prompt (no sampling, stream or store); the caller counts q's prompt. */
enum status http_responses_count_parse(struct server *s, const char *model_id, const char *body, size_t len,
                                       const char *owner, const char *const *adapters,
                                       int n_adapters, const struct http_chat_caps *caps, struct http_request *q);
/* {"object": "response.input_tokens", "input_tokens": n}; malloc'd. */
char       *http_responses_count_json(int n_tokens);

/* ---- http_gen.c: one generation request ---------------------------------------------------- */

/* Tokenizes, validates and submits q (whose ownership moves into a new http_gen, *out, holding
 * the caller's reference; fd: the connection's socket, polled for hang-ups): every prompt is
 * checked before any is submitted; on error nothing is left. */
enum status http_gen_submit(struct server *s, struct http_request *q, int fd, const char *body, size_t body_len,
                            const char *id, struct http_gen **out);
/* Drops one reference; the last frees g. */
void        http_gen_unref(struct http_gen *g);
/* Gives the request's model pin back once its answer is formed, before the bytes go out (so a
 * client's next request never finds the model still pinned by this one, under --models-max):
 * every sample has finished, so neither the engine nor the connection needs the model again.
 * Not for a resumed request (a reattaching client replays it through the model). Once only;
 * without g->mu (it takes the models' lock). */
void        http_gen_release_model(struct http_gen *g);
/* With g->mu held: waits up to HTTP_WAIT_MS for an event. */
void        http_gen_wait(struct http_gen *g);
/* With g->mu held: the client went away. What the caller must do after unlocking
 * (http_gen_after_hangup): nothing, cancel the request, or (a journaled first run, under
 * --journal-detach-grace) adopt it as a detached request that waits for its client. */
enum http_hangup { HTTP_HANGUP_NONE = 0, HTTP_HANGUP_CANCEL, HTTP_HANGUP_DETACH };
enum http_hangup http_gen_hangup(struct http_gen *g);
/* Without g->mu: what http_gen_hangup asked for. */
void        http_gen_after_hangup(struct http_gen *g, enum http_hangup h);
/* Cancels every submitted run (never under g->mu). */
void        http_gen_cancel(struct http_gen *g);
/* With g->mu held: counts the ended request (metrics, log). */
void        http_gen_observe(struct http_gen *g, enum status st);
/* With g->mu held: whether the client is gone (the half-close rule: http_gen.c). */
int         http_peer_gone(struct http_gen *g);
/* libmicrohttpd's content reader and its free callback for a streamed response (cls: g). */
ssize_t     http_stream_read(void *cls, uint64_t pos, char *buf, size_t max);
void        http_stream_free(void *cls);

/* ---- http_guard.c: connection slots and the deadlines before a request is read ---------- */

/* Where a connection's current request is: its headers are being read (also while a
 * kept-alive connection waits for its next request), its body is, or it is being handled
 * (no deadline: generation and streaming take what they take). */
enum http_phase { HTTP_PHASE_HEADERS, HTTP_PHASE_BODY, HTTP_PHASE_HANDLING };

struct http_guard;
struct http_slot;
struct sockaddr;

/* Starts the watchdog. header_s, body_s: the deadlines of HEADERS and BODY; send_s: each
 * socket's TCP_USER_TIMEOUT (--send-timeout; 0: not set); max_conn: connections admitted at most;
 * max_per_addr: at most from one peer address (0: no cap). */
enum status http_guard_start(double header_s, double body_s, double send_s, int max_conn, int max_per_addr,
                             struct http_guard **out);
/* Stops the watchdog and frees g, after the daemon has stopped (every slot closed). Accepts NULL. */
void        http_guard_stop(struct http_guard *g);
/* A connection was accepted on socket fd (borrowed: the slot keeps a duplicate) from peer.
 * Returns its slot (NULL when out of memory: refuse the connection). Thread-safe. */
struct http_slot *http_guard_open(struct http_guard *g, int fd, const struct sockaddr *peer);
/* The connection is gone: frees s. Accepts NULL. */
void        http_guard_close(struct http_guard *g, struct http_slot *s);
/* NULL when s was admitted; else why not (the 503's message). Accepts NULL. */
const char *http_guard_refusal(const struct http_slot *s);
/* s entered phase p now (its deadline restarts). Accepts NULL. */
void        http_guard_phase(struct http_guard *g, struct http_slot *s, enum http_phase p);

#endif
