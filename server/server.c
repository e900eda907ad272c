/* server/server.c - the gRPC server's skeleton: setup (credentials, port, completion queue,
 * request slots), the one completion-queue loop that hands every completion to its call
 * (call.c), the control thread (loads the model, waits for SIGTERM / SIGINT or an engine
 * failure, drains), waking the loop from other threads, and the one place where enum status
 * becomes a gRPC code: server_grpc_code().
 *
 * Waking the loop from the engine thread: the engine's callback copies the event into a queue
 * and starts an empty batch on a private call of a lame channel; gRPC documents that an empty
 * batch puts its tag on the completion queue immediately. So the loop blocks in
 * grpc_completion_queue_next with no polling, and a token reaches its stream within
 * microseconds of being sampled. Wakes are coalesced (one in flight at a time).
 *
 * Not here: one call's state machine (call.c), the methods (generation.c, methods.c,
 * health.c), adapter loads (loader.c), API keys and TLS (auth.c), flags (cli/serve.c), protobuf (convert.c).
 * Tests: tests/server/test_server.py. */
#include "server.h"

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template.h"
#include "data.h"
#include "http_internal.h"
#include "metrics.h"
#include "reflection.h"
#include "journal.h"
#include "server_internal.h"
#include "tokenizer.h"
#include "tool_format.h"

/* The one mapping from shardlm errors to gRPC status codes. */
grpc_status_code server_grpc_code(enum status s)
{
    switch (s) {
    case STATUS_OK: return GRPC_STATUS_OK;
    case STATUS_INVALID_ARGUMENT: return GRPC_STATUS_INVALID_ARGUMENT;
    case STATUS_NOT_FOUND: return GRPC_STATUS_NOT_FOUND;
    case STATUS_BAD_FORMAT: return GRPC_STATUS_INVALID_ARGUMENT;
    case STATUS_UNSUPPORTED: return GRPC_STATUS_UNIMPLEMENTED;
    case STATUS_RESOURCE_EXHAUSTED: return GRPC_STATUS_RESOURCE_EXHAUSTED;
    case STATUS_UNAVAILABLE: return GRPC_STATUS_UNAVAILABLE;
    case STATUS_IO: return GRPC_STATUS_INTERNAL;
    case STATUS_INTERNAL: return GRPC_STATUS_INTERNAL;
    case STATUS_CANCELLED: return GRPC_STATUS_CANCELLED;
    case STATUS_DEADLINE_EXCEEDED: return GRPC_STATUS_DEADLINE_EXCEEDED;
    case STATUS_ALREADY_EXISTS: return GRPC_STATUS_ALREADY_EXISTS;
    case STATUS_FAILED_PRECONDITION: return GRPC_STATUS_FAILED_PRECONDITION;
    }
    return GRPC_STATUS_UNKNOWN;
}

const char *server_grpc_code_name(grpc_status_code c)
{
    static const char *names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
                                  "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
                                  "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    return (unsigned)c < sizeof names / sizeof names[0] ? names[c] : "?";
}

/* ---- waking the loop --------------------------------------------------------------------- */

/* Any thread. Puts wake_tag on the completion queue unless a wake is already on its way. */
void server_wake(struct server *s)
{
    if (atomic_exchange(&s->wake_pending, 1)) return;
    pthread_mutex_lock(&s->wake_mu); /* empty batches on one call are thread-compatible only */
    grpc_call_error e = grpc_call_start_batch(s->wake_call, NULL, 0, &s->wake_tag, NULL);
    pthread_mutex_unlock(&s->wake_mu);
    CHECK(e == GRPC_CALL_OK, "waking the server loop failed: grpc_call_error %d", (int)e);
}

/* ---- the control thread -------------------------------------------------------------------- */

/* Signal handlers take no context argument: this is the one file-scope pointer, set while
 * server_run runs. Libraries (OpenBLAS, OpenMP) start threads before main, so the signal may
 * land on any thread; the handler only does what is async-signal-safe: sem_post. */
static sem_t *volatile g_stop_sem;
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig)
{
    g_stop_signal = sig;
    sem_t *sem = g_stop_sem;
    if (sem) sem_post(sem);
}

/* Installs on_stop_signal for SIGTERM and SIGINT. */
static void install_stop_handlers(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* Engine thread: the engine cannot go on (a rank is gone or hung). The control thread turns
 * health to NOT_SERVING and shuts the server down; server_run then returns UNAVAILABLE. */
static void on_engine_fatal(void *ctx, enum status st, const char *message)
{
    struct server *s = ctx;
    (void)st;
    snprintf(s->fatal_message, sizeof s->fatal_message, "%s", message);
    s->fatal = 1;
    sem_post(&s->stop_sem);
}

static void add_end_id(struct served_model *m, int32_t id, int eos)
{
    if (id < 0 || id == eos || m->n_end_ids >= REQUEST_MAX_END_IDS) return;
    for (int i = 0; i < m->n_end_ids; i++)
        if (m->end_ids[i] == id) return;
    m->end_ids[m->n_end_ids++] = id;
}

/* A harmony vocabulary (GPT-OSS): a reply ends at <|return|> (the final answer) or <|call|> (a
 * tool call), never at <|end|>, which closes the analysis before the final channel opens
 * (llama.cpp's rule, llama-vocab.cpp); 1 when m's vocabulary is one (its end ids then set). */
static int harmony_end_ids(struct served_model *m, int eos)
{
    const int32_t ret = tokenizer_piece_to_id(m->tok, "<|return|>"), call = tokenizer_piece_to_id(m->tok, "<|call|>");
    if (ret < 0 || call < 0 || !tokenizer_is_control(m->tok, ret) || !tokenizer_is_control(m->tok, call)) return 0;
    add_end_id(m, ret, eos);
    add_end_id(m, call, eos);
    const int32_t eot = tokenizer_piece_to_id(m->tok, "<|endoftext|>");
    if (eot >= 0 && tokenizer_is_control(m->tok, eot)) add_end_id(m, eot, eos);
    return 1;
}

/* The Jinja template's end-of-turn tokens, which end a chat's generation besides EOS: the special
 * token the template writes right after an assistant message's content (found by rendering a
 * turn, not by knowing the template), then the end-of-generation tokens llama.cpp also knows by
 * name, when the vocabulary has them as special tokens. */
static void find_end_ids(struct served_model *m, int eos)
{
    static const char sentinel[] = "q7Zx3ENDOFTURNx3Z7q";
    if (harmony_end_ids(m, eos)) {
        for (int i = 0; i < m->n_end_ids; i++)
            LOG_INFO("server", "chat template: harmony end of turn at token %d %s", m->end_ids[i],
                     tokenizer_id_to_piece(m->tok, m->end_ids[i]));
        return;
    }
    struct chat_message turn[2] = {{CHAT_ROLE_USER, (char *)"Hi"}, {CHAT_ROLE_ASSISTANT, (char *)sentinel}};
    char *text = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    int n = 0;
    if (jinja_render_chat(m->jtmpl, turn, 2, NULL, 0, m->bos_text, m->eos_text, &text, &len) == STATUS_OK) {
        const char *after = strstr(text, sentinel);
        if (after) {
            after += strlen(sentinel);
            if (tokenizer_encode(m->tok, after, len - (size_t)(after - text), 0, &ids, &n) == STATUS_OK && n > 0 &&
                tokenizer_is_control(m->tok, ids[0]))
                add_end_id(m, ids[0], eos);
        }
    }
    free(text);
    free(ids);
    static const char *const named[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|eom_id|>",
                                        "<|endoftext|>", "<|end_of_text|>", "<EOT>",
                                        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>"};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
        int32_t id = tokenizer_piece_to_id(m->tok, named[i]);
        if (id >= 0 && tokenizer_is_control(m->tok, id)) add_end_id(m, id, eos);
    }
    for (int i = 0; i < m->n_end_ids; i++)
        LOG_INFO("server", "chat template: end of turn at token %d %s", m->end_ids[i],
                 tokenizer_id_to_piece(m->tok, m->end_ids[i]));
}

/* The tool-call format and reasoning of a Jinja template (src: its NUL-terminated text). */
static void note_template_formats(const struct server *s, struct served_model *m, const char *src)
{
    m->tool_format = (int)tool_format_detect(src);
    m->tools_prompt = m->tool_format == TOOL_FORMAT_DEEPSEEK && !strstr(src, "tools")
                          ? (strstr(src, "```json") ? TOOL_PROMPT_DEEPSEEK_R1 : TOOL_PROMPT_DEEPSEEK) : TOOL_PROMPT_NONE;
    m->ds_fenced = m->tool_format == TOOL_FORMAT_DEEPSEEK && strstr(src, "```json") != NULL;
    m->calls_as_text = m->tool_format == TOOL_FORMAT_GRANITE && !strstr(src, "tool_calls");
    m->kimi_counter = m->tool_format == TOOL_FORMAT_KIMI && strstr(src, "tool_call_counter") != NULL;
    m->reads_effort = strstr(src, "reasoning_effort") != NULL;
    m->reads_response_format = strstr(src, "response_format") != NULL;
    m->reads_thinking = strstr(src, "enable_thinking") != NULL;
    const char *rf = s->opts.reasoning_format;
    if (!rf || !strcmp(rf, "auto")) m->reasoning = (int)tool_format_detect_reasoning(src);
    LOG_INFO("server", "chat template: tool calls in the %s format, reasoning %s%s%s%s", tool_format_name(m->tool_format),
             m->reasoning ? "split from " : "not split", m->reasoning ? tool_reasoning_open(m->reasoning) : "",
             m->reasoning ? " to " : "", m->reasoning ? tool_reasoning_close(m->reasoning) : "");
}

/* The chat template: --chat-template NAME (a built-in) or FILE.jinja; else the model's own Jinja
 * template when its tokenizer encodes the special tokens a template writes (byte-level BPE);
 * else a built-in chosen from the vocabulary (chat_template_detect). A model template that does
 * not compile falls back to the built-in with a warning; a --chat-template file must compile. */
static enum status choose_chat_template(const struct server *s, struct served_model *m, struct engine *e)
{
    m->reasoning = s->opts.reasoning_format && !strcmp(s->opts.reasoning_format, "deepseek") ? TOOL_REASONING_THINK
                                                                                              : TOOL_REASONING_OFF;
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    const char *bos = info.bos_id >= 0 ? tokenizer_id_to_piece(m->tok, info.bos_id) : NULL;
    const char *eos = info.eos_id >= 0 ? tokenizer_id_to_piece(m->tok, info.eos_id) : NULL;
    snprintf(m->bos_text, sizeof m->bos_text, "%s", bos ? bos : "");
    snprintf(m->eos_text, sizeof m->eos_text, "%s", eos ? eos : "");
    const char *opt = s->opts.chat_template;
    enum status st;
    if (opt && chat_template_is_file(opt)) {
        char *src = NULL;
        size_t n = 0;
        if ((st = base_read_file(opt, 4u << 20, "chat template", &src, &n)) != STATUS_OK) return st;
        st = jinja_compile(src, n, NULL, &m->jtmpl);
        if (st == STATUS_OK) note_template_formats(s, m, src);
        free(src);
        if (st != STATUS_OK) return status_errorf(st, "--chat-template %s: %s", opt, status_message());
        snprintf(m->tmpl_name, sizeof m->tmpl_name, "jinja (%s)", opt);
        find_end_ids(m, info.eos_id);
        return STATUS_OK;
    }
    if (opt) {
        if ((st = chat_template_parse(opt, &m->tmpl)) != STATUS_OK) return st;
    } else {
        m->tmpl = chat_template_detect(m->eopts.model_dir, m->tok);
        if (info.chat_template && tokenizer_encodes_special(m->tok)) {
            st = jinja_compile(info.chat_template, strlen(info.chat_template), NULL, &m->jtmpl);
            if (st == STATUS_OK) {
                note_template_formats(s, m, info.chat_template);
                snprintf(m->tmpl_name, sizeof m->tmpl_name, "jinja (model)");
                find_end_ids(m, info.eos_id);
                return STATUS_OK;
            }
            LOG_WARN("server", "the model's chat template does not compile (%s); using %s", status_message(),
                     chat_template_name(m->tmpl));
        }
    }
    snprintf(m->tmpl_name, sizeof m->tmpl_name, "%s", chat_template_name(m->tmpl));
    return STATUS_OK;
}

/* --spec-corpus: the files read as `shardlm train` reads its data (data_load: every format, this
 * model's tokenizer and chat template, errors naming the file and line), and every run of tokens
 * the model produces there (the loss flag: an assistant turn's content and its end, a text and
 * its EOS, a completion) made one text of the engine's corpus. */
static enum status load_spec_corpus(const struct server *s, struct served_model *m, struct engine *e)
{
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    struct data_options o = {.seq_length = info.max_positions, .overflow = DATA_OVERFLOW_TRUNCATE,
                             .chat_template = m->tmpl, .jinja = m->jtmpl};
    memcpy(o.bos_text, m->bos_text, sizeof o.bos_text);
    memcpy(o.eos_text, m->eos_text, sizeof o.eos_text);
    struct train_dataset ds = {0};
    enum status st = data_load(s->opts.spec_corpus, m->tok, &o, &ds);
    if (st != STATUS_OK) st = status_errorf(st, "--spec-corpus: %s", status_message());
    int32_t *ids = NULL;
    int64_t n = 0, texts = 0;
    if (st == STATUS_OK && (st = data_target_texts(&ds, &ids, &n, &texts)) != STATUS_OK)
        st = status_errorf(st, "--spec-corpus: %s", status_message());
    if (st == STATUS_OK && !texts)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "--spec-corpus %s: no text a model produces (no assistant turn, "
                           "text or completion)", s->opts.spec_corpus);
    if (st == STATUS_OK && (st = engine_set_spec_corpus(e, ids, n)) != STATUS_OK)
        st = status_errorf(st, "--spec-corpus %s: %s", s->opts.spec_corpus, status_message());
    if (st == STATUS_OK)
        LOG_INFO("server", "speculative corpus: %lld texts, %lld tokens from %s", (long long)texts,
                 (long long)(n - texts), s->opts.spec_corpus);
    free(ids);
    data_free(&ds);
    return st;
}

enum status server_model_load(struct server *s, struct served_model *m)
{
    struct engine *e = NULL;
    m->eopts.on_fatal = on_engine_fatal;
    m->eopts.fatal_ctx = s;
    enum status st = engine_create(&m->eopts, &e);
    if (st == STATUS_OK) {
        m->tok = engine_tokenizer(e);
        m->vocab_size = tokenizer_vocab_size(m->tok);
        st = choose_chat_template(s, m, e);
    }
    if (st == STATUS_OK && s->opts.spec_corpus) st = load_spec_corpus(s, m, e);
    if (st == STATUS_OK) st = engine_start(e);
    if (st != STATUS_OK) {
        engine_free(e);
        jinja_free(m->jtmpl);
        m->jtmpl = NULL;
        return st;
    }
    m->engine = e;
    server_model_note_info(s, m);
    LOG_INFO("server", "model %s loaded as %s; chat template %s", m->eopts.model_dir, m->model_id, m->tmpl_name);
    return STATUS_OK;
}

void server_model_unload(struct served_model *m)
{
    engine_free(m->engine);
    m->engine = NULL;
    jinja_free(m->jtmpl);
    m->jtmpl = NULL;
    m->tok = NULL;
    m->n_end_ids = 0; /* a load finds them again */
}

/* Waits for the stop semaphore (a signal, an engine failure, the loop); with
 * --sleep-idle-seconds, wakes every SLEEP_TICK_S meanwhile to unload the idle models, and with
 * the journal to sweep its waiting requests (retention, --journal-detach-grace) when no request
 * comes to do it. */
#define SLEEP_TICK_S 0.25
static void wait_for_stop(struct server *s)
{
    while (s->opts.sleep_idle_s > 0 || s->journal) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(SLEEP_TICK_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        if (sem_timedwait(&s->stop_sem, &ts) == 0) return;
        if (s->opts.sleep_idle_s > 0) server_models_sleep(s);
        if (s->journal && atomic_load(&s->phase) == PHASE_READY) resume_sweep(s);
    }
    while (sem_wait(&s->stop_sem) != 0) {} /* EINTR */
}

static void *control_main(void *arg)
{
    struct server *s = arg;
    enum status st = STATUS_OK;
    /* The first --models-max models load now; the others when a request names one. */
    int n_now = s->opts.models_max > 0 && s->opts.models_max < s->n_models ? s->opts.models_max : s->n_models;
    for (int i = 0; i < n_now && st == STATUS_OK; i++) {
        struct served_model *m = &s->models[i];
        pthread_mutex_lock(&s->models_mu); /* a request meanwhile waits for this load */
        m->state = MODEL_LOADING;
        pthread_mutex_unlock(&s->models_mu);
        st = server_model_load(s, m);
        pthread_mutex_lock(&s->models_mu);
        m->state = st == STATUS_OK ? MODEL_LOADED : MODEL_UNLOADED;
        m->t_used = base_now_s();
        pthread_cond_broadcast(&s->models_cv);
        pthread_mutex_unlock(&s->models_mu);
    }
    /* MPI_Init (in engine_create, for the parallel runtime) may install its own SIGTERM / SIGINT
     * handlers: ours go back on top. */
    install_stop_handlers();
    if (st != STATUS_OK) {
        s->load_status = st;
        snprintf(s->load_message, sizeof s->load_message, "%s", status_message());
        server_models_close(s);
        for (int i = 0; i < s->n_models; i++) server_model_unload(&s->models[i]);
        atomic_store(&s->phase, PHASE_FAILED);
        server_wake(s);
        return NULL;
    }
    if (s->journal) resume_all(s); /* before serving: a client that reconnects finds its request */
    http_finetune_publish(s);      /* a restart serves the fine-tuned adapters it served before */
    atomic_store(&s->phase, PHASE_READY);
    server_wake(s);

    wait_for_stop(s);
    int sig = g_stop_signal;
    if (s->fatal)
        LOG_ERROR("server", "the engine failed (%s): NOT_SERVING, shutting down", s->fatal_message);
    else
        LOG_INFO("server", "%s: draining (up to %.1f s)", sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "stop",
                 s->opts.drain_timeout_s);
    atomic_store(&s->phase, PHASE_DRAINING);
    server_wake(s);
    server_models_close(s); /* no load starts now, and none runs: the loaded models stay loaded */
    for (int i = 0; i < s->n_models; i++)
        if (s->models[i].state == MODEL_LOADED) engine_drain(s->models[i].engine, s->fatal ? 0.0 : s->opts.drain_timeout_s);
    atomic_store(&s->phase, PHASE_DRAINED);
    server_wake(s);
    return NULL;
}

/* ---- setup and the loop -------------------------------------------------------------------- */

double server_test_delay(const char *name)
{
    const char *e = getenv(name);
    float d = 0.0f;
    return e && base_parse_float(e, &d) == 0 && d > 0.0f && d < 600.0f ? d : 0.0;
}

/* How long connections may take to close after the last call ended (see loop_tick). */
#define SHUTDOWN_GRACE_S 1.0

/* Cancels each call whose send has waited --send-timeout for its client to take it: a client
 * that stops reading (HTTP/2 flow control holds the send; keepalive pings are still answered)
 * would otherwise hold its buffered output, its model's pin and, unjournaled, its engine request
 * for as long as its connection lives. The cancel ends the call as a client that went away:
 * its request is cancelled, or, journaled, waits for its client to reattach. Once a second. */
static void send_timeout_sweep(struct server *s, double now)
{
    if (s->opts.send_timeout_s <= 0 || now - s->t_send_sweep < 1.0) return;
    s->t_send_sweep = now;
    for (struct call *c = s->calls; c; c = c->next) {
        if (!c->send_inflight || c->close_done || c->send_timed_out || now - c->t_send < s->opts.send_timeout_s)
            continue;
        c->send_timed_out = 1;
        LOG_WARN("server", "req=%s method=%s: the client took no message for %.0f s (--send-timeout); cancelling the call",
                 c->request_id ? c->request_id : "-", call_method_name(c->method), now - c->t_send);
        grpc_call_cancel_with_status(c->call, GRPC_STATUS_DEADLINE_EXCEEDED, "the client read nothing for --send-timeout",
                                     NULL);
    }
}

/* What the loop does after every completion: engine events, phase changes, shutdown steps. */
static void loop_tick(struct server *s)
{
    send_timeout_sweep(s, base_now_s());
    gen_drain_events(s);
    loader_drain(s);
    embed_rpc_drain(s);
    enum phase ph = atomic_load(&s->phase);
    if (ph != s->phase_seen) {
        s->phase_seen = ph;
        if (ph == PHASE_READY) {
            printf("shardlm: ready\n");
            fflush(stdout);
        }
        if (ph == PHASE_DRAINED) s->t_drained = base_now_s();
        if (ph == PHASE_FAILED) LOG_ERROR("server", "the model did not load: %s", s->load_message);
        health_changed(s);
    }
    /* After the drain, let generation calls send their last messages (briefly), then stop. */
    int stop = ph == PHASE_FAILED || (ph == PHASE_DRAINED && (s->n_gen_calls == 0 || base_now_s() - s->t_drained > 2.0));
    /* The shutdown is gRPC's graceful one (GOAWAY; each connection closes after its last stream),
     * forced (every call cancelled, every connection cut) only when calls still run, or after
     * SHUTDOWN_GRACE_S: a connection cut at once could drop the last messages and status of a call
     * that had ended, still on their way to a slow client (a reset, "Stream removed"). */
    double now = base_now_s();
    if (stop && !s->shutdown_started) {
        s->shutdown_started = 1;
        s->t_shutdown = now;
        grpc_server_shutdown_and_notify(s->grpc, s->cq, &s->shutdown_tag);
    }
    if (s->shutdown_started && !s->shutdown_done && !s->shutdown_forced &&
        (ph == PHASE_FAILED || s->n_gen_calls > 0 || now - s->t_shutdown > SHUTDOWN_GRACE_S)) {
        s->shutdown_forced = 1;
        grpc_server_cancel_all_calls(s->grpc);
    }
}

/* Creates the gRPC server and its completion queue, binds o->listen with creds (released here)
 * and starts it; prints "shardlm: listening on HOST:PORT". On failure nothing is left to free
 * but grpc_init's reference. */
static enum status server_listen(struct server *s, grpc_server_credentials *creds)
{
    const struct server_options *o = &s->opts;
    /* Keepalive pings every 20 s on a connection with calls, unanswered for 10 s: a client that
     * vanished without a FIN or a reset (a host or a NAT gone) ends its calls within half a
     * minute, not TCP's 15 of retransmissions (a journaled call's reattaching client is refused
     * until then: its old call still reads the request). */
    grpc_arg args[5];
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = o->max_receive_bytes > 0 ? o->max_receive_bytes : 4 << 20;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = 64 << 20;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[2].value.integer = 20000;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
    args[3].value.integer = 10000;
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA; /* a long unary answer sends no data meanwhile */
    args[4].value.integer = 0;
    grpc_channel_args chargs = {5, args};
    s->grpc = grpc_server_create(&chargs, NULL);
    s->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(s->grpc, s->cq, NULL);
    int port = grpc_server_add_http2_port(s->grpc, o->listen, creds);
    grpc_server_credentials_release(creds);
    if (port <= 0) {
        grpc_server_destroy(s->grpc);
        grpc_completion_queue_shutdown(s->cq);
        while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {}
        grpc_completion_queue_destroy(s->cq);
        return status_errorf(STATUS_UNAVAILABLE, "cannot listen on %s (address in use or invalid)", o->listen);
    }
    grpc_server_start(s->grpc);
    char host[256];
    const char *colon = strrchr(o->listen, ':');
    size_t hn = colon ? (size_t)(colon - o->listen) : strlen(o->listen);
    if (hn >= sizeof host) hn = sizeof host - 1;
    memcpy(host, o->listen, hn);
    host[hn] = 0;
    printf("shardlm: listening on %s:%d%s\n", host, port, o->tls_cert ? " (TLS)" : "");
    fflush(stdout);
    LOG_INFO("server", "listening on %s:%d%s%s", host, port, o->tls_cert ? ", TLS" : "", s->n_keys ? ", API keys" : "");
    return STATUS_OK;
}

/* A model's name in the APIs: its directory's (or file's) last component. */
static void model_name(struct served_model *m)
{
    const char *dir = m->eopts.model_dir ? m->eopts.model_dir : "model";
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    snprintf(m->model_id, sizeof m->model_id, "%.*s", (int)(n - b), dir + b);
}

/* A model's --default-adapter must name one of its adapters loaded at start (the only ones there
 * are before the server runs). */
static enum status check_default_adapter(const struct served_model *m)
{
    const char *d = m->default_adapter;
    if (!d) return STATUS_OK;
    for (int i = 0; i < m->eopts.n_adapters; i++)
        if (!strcmp(d, m->eopts.adapter_names[i])) return STATUS_OK;
    return status_errorf(STATUS_INVALID_ARGUMENT, "--default-adapter '%s' names no adapter given with --lora for "
                         "--model %s%s", d, m->eopts.model_dir, m->eopts.n_adapters ? "" : " (there is none)");
}

/* The served models from the options: --model with its --lora adapters, then the further
 * --model ones with theirs. Two models with the same id are refused: a request could not name
 * one of them. */
static enum status server_models(struct server *s)
{
    const struct server_options *o = &s->opts;
    s->n_models = 1 + o->n_more_models;
    s->models = calloc((size_t)s->n_models, sizeof *s->models);
    if (!s->models) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    s->models[0].eopts = o->engine;
    s->models[0].default_adapter = o->default_adapter;
    for (int i = 1; i < s->n_models; i++) {
        const struct server_model_spec *sp = &o->more_models[i - 1];
        struct engine_options *e = &s->models[i].eopts;
        *e = o->engine;
        e->model_dir = sp->model_dir;
        e->adapter_names = sp->adapter_names;
        e->adapter_dirs = sp->adapter_dirs;
        e->n_adapters = sp->n_adapters;
        e->max_loras = sp->max_loras;
    }
    for (int i = 0; i < s->n_models; i++) {
        model_name(&s->models[i]);
        for (int j = 0; j < i; j++)
            if (!strcmp(s->models[i].model_id, s->models[j].model_id))
                return status_errorf(STATUS_INVALID_ARGUMENT,
                                     "--model %s and --model %s have the same id '%s' (the last component of the "
                                     "path): requests could not tell them apart", s->models[j].eopts.model_dir,
                                     s->models[i].eopts.model_dir, s->models[i].model_id);
    }
    if (o->engine.spec_corpus_keep && s->n_models > 1)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--spec-corpus-keep %s serves one model: %d --model given (each "
                             "would write the file)", o->engine.spec_corpus_keep, s->n_models);
    if (o->models_max < 0 || o->models_max > SERVER_MAX_MODELS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--models-max must be in [1, %d], got %d", SERVER_MAX_MODELS,
                             o->models_max);
    if (!(o->sleep_idle_s >= 0))
        return status_errorf(STATUS_INVALID_ARGUMENT, "--sleep-idle-seconds must be positive");
    /* A journaled request resumes on the first model without a pin; other ranks replay a model's
     * steps and cannot free and load it with rank 0. */
    if ((o->sleep_idle_s > 0 || o->models_max) && o->journal_dir)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--sleep-idle-seconds and --models-max are not supported with "
                             "--journal (a resumed request needs its model loaded)");
    if ((o->sleep_idle_s > 0 || o->models_max) && o->engine.world)
        return status_errorf(STATUS_INVALID_ARGUMENT, "--sleep-idle-seconds and --models-max are not supported with "
                             "several ranks (mpirun): the other ranks cannot unload and load with rank 0");
    s->model_load_test_delay_s = server_test_delay("SHARDLM_TEST_MODEL_LOAD_DELAY_S");
    s->test_pause_accept_s = server_test_delay("SHARDLM_TEST_PAUSE_BEFORE_ACCEPT_S");
    s->test_pause_headers_s = server_test_delay("SHARDLM_TEST_PAUSE_BEFORE_HEADERS_S");
    for (int i = 0; i < s->n_models; i++) {
        s->models[i].state = MODEL_UNLOADED;
        enum status st = check_default_adapter(&s->models[i]);
        if (st != STATUS_OK) return st;
    }
    s->t_created = (long long)time(NULL);
    return STATUS_OK;
}

enum status server_run(const struct server_options *o)
{
    struct server *s = calloc(1, sizeof *s);
    if (!s) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    s->opts = *o;
    s->t_start = base_now_s();
    s->wake_tag = (struct tag){TAG_WAKE, NULL};
    s->shutdown_tag = (struct tag){TAG_SHUTDOWN, NULL};
    atomic_init(&s->phase, PHASE_LOADING);
    atomic_init(&s->wake_pending, 0);
    s->phase_seen = PHASE_LOADING;
    s->health_serving = HEALTH_NOT_SERVING;
    pthread_mutex_init(&s->wake_mu, NULL);
    pthread_mutex_init(&s->ev_mu, NULL);
    pthread_mutex_init(&s->models_mu, NULL);
    pthread_cond_init(&s->models_cv, NULL);
    loader_init(s);
    enum status st = STATUS_OK;
    grpc_server_credentials *creds = NULL;

    /* SIGTERM / SIGINT post stop_sem, which the control thread waits on to start the drain. */
    sem_init(&s->stop_sem, 0, 0);
    g_stop_signal = 0;
    g_stop_sem = &s->stop_sem;
    install_stop_handlers();
    signal(SIGPIPE, SIG_IGN);

    if (o->api_key_file && (st = auth_load_keys(s, o->api_key_file)) != STATUS_OK) goto out_early;
    /* Before the journal and the fine-tuning index are read: their owners are compared with these. */
    if (s->n_keys && (st = auth_derive_owners(s)) != STATUS_OK) goto out_early;
    if ((st = auth_make_credentials(o, &creds)) != STATUS_OK) goto out_early;
    if ((st = reflection_init(&s->refl)) != STATUS_OK) goto out_early;
    s->metrics = metrics_create();
    if ((st = server_models(s)) != STATUS_OK) goto out_early;
    if (o->journal_dir && (st = resume_open(s)) != STATUS_OK) goto out_early; /* before either front */
    /* HTTP first: its failure leaves no gRPC server to tear down. */
    if (o->http_listen && (st = http_start(s)) != STATUS_OK) goto out_early;

    grpc_init();
    st = server_listen(s, creds);
    creds = NULL;
    if (st != STATUS_OK) {
        grpc_shutdown();
        goto out_early;
    }

    s->wake_channel = grpc_lame_client_channel_create("shardlm-wake", GRPC_STATUS_UNAVAILABLE, "wake-up channel");
    s->wake_call = grpc_channel_create_call(s->wake_channel, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq,
                                            grpc_slice_from_static_string("/shardlm.internal/Wake"), NULL,
                                            gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    CHECK(s->wake_call, "cannot create the wake-up call");
    for (int i = 0; i < N_REQUEST_SLOTS; i++) {
        s->slots[i].s = s;
        s->slots[i].tag = (struct tag){TAG_REQUEST, &s->slots[i]};
        call_slot_arm(&s->slots[i]);
    }
    if (pthread_create(&s->control, NULL, control_main, s) != 0) CHECK(0, "cannot start the control thread");
    s->control_started = 1;

    while (!(s->shutdown_done && s->n_calls == 0 && s->n_slots_active == 0)) {
        grpc_event ev = grpc_completion_queue_next(s->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                                       gpr_time_from_millis(500, GPR_TIMESPAN)),
                                                   NULL);
        if (ev.type == GRPC_OP_COMPLETE) {
            struct tag *t = ev.tag;
            switch (t->kind) {
            case TAG_REQUEST: call_on_new(t->owner, ev.success); break;
            case TAG_RECV: call_on_recv(t->owner, ev.success); break;
            case TAG_SEND: call_on_send(t->owner, ev.success); break;
            case TAG_CLOSE: call_on_close(t->owner); break;
            case TAG_WAKE: atomic_store(&s->wake_pending, 0); break;
            case TAG_SHUTDOWN: s->shutdown_done = 1; break;
            }
        } else if (ev.type == GRPC_QUEUE_SHUTDOWN) {
            break;
        }
        loop_tick(s);
    }

    /* The control thread is done unless the loop stopped for another reason. */
    if (atomic_load(&s->phase) == PHASE_READY) sem_post(&s->stop_sem);
    pthread_join(s->control, NULL);
    gen_drain_events(s); /* nothing should be left; the calls are gone */
    loader_stop(s);      /* idle: a load holds its call, and every call is gone */
    if (atomic_load(&s->phase) == PHASE_FAILED) st = status_errorf(s->load_status, "%s", s->load_message);
    if (s->fatal) st = status_errorf(STATUS_UNAVAILABLE, "%s", s->fatal_message);

    grpc_call_unref(s->wake_call);
    grpc_channel_destroy(s->wake_channel);
    grpc_server_destroy(s->grpc);
    grpc_completion_queue_shutdown(s->cq);
    while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {}
    grpc_completion_queue_destroy(s->cq);
    http_stop(s); /* before engine_free: its requests hold the engine */
    for (int i = 0; i < s->n_models; i++) server_model_unload(&s->models[i]);
    grpc_shutdown();
    if (st == STATUS_OK) LOG_INFO("server", "drained; exiting");

out_early:
    http_stop(s);
    resume_stop(s); /* after both fronts and the drain: nothing resumed is read or written any more */
    journal_close(s->journal); /* after the fronts and the engine: nothing writes to it */
    s->journal = NULL;
    metrics_free(s->metrics);
    if (creds) grpc_server_credentials_release(creds);
    reflection_free(s->refl);
    for (int i = 0; i < s->n_keys; i++) free(s->keys[i]);
    free(s->keys);
    free(s->owners);
    /* The handlers stay (doing nothing now): a second SIGTERM while the process exits must not
     * turn a clean drain into death by signal. */
    g_stop_sem = NULL;
    sem_destroy(&s->stop_sem);
    pthread_mutex_destroy(&s->wake_mu);
    pthread_mutex_destroy(&s->ev_mu);
    pthread_mutex_destroy(&s->models_mu);
    pthread_cond_destroy(&s->models_cv);
    loader_destroy(s);
    free(s->models);
    free(s);
    return st;
}
