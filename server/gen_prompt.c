/* server/gen_prompt.c - a Generate / Chat request's prompt (both fronts): the bound on a text
 * prompt's bytes before tokenizing, the chat template (the model's own Jinja one, with the tools
 * and reasoning and their lazy constraints, or a built-in one) or the tokenizer, and the adapter
 * the request runs with. Any thread: the HTTP front calls it from its own, the gRPC front from the
 * loader's prompt thread (loader.c). Not here: parsing (convert.c), the call (generation.c).
 * Tests: tests/server/test_server.py (basic, prompt_bound, work), tests/server/test_tools*.py,
 * tests/server/test_gguf_lora.py (gen_resolve_adapter). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "convert.h"
#include "grammar.h"
#include "http_internal.h"
#include "server_internal.h"
#include "tokenizer.h"
#include "tool_format.h"

/* Refuses a text prompt that cannot fit the context before it is tokenized: encoding 1 MiB
 * costs about 0.45 s of this thread, and a prompt has at least tokenizer_min_tokens ids (from
 * its bytes alone; 0 when the model allows no bound, and then the exact check after
 * tokenization is the only one). The rule is request_context_check's, as engine_validate's. */
static enum status check_prompt_bytes(const struct served_model *m, const struct gen_request *r, int is_chat)
{
    int n = is_chat ? r->n_messages : r->prompt ? 1 : 0;
    if (n == 0) return STATUS_OK; /* token ids: engine_validate counts them */
    /* calloc: gcc 12 at -O3 cannot see that the loop below fills every entry (n > 0). */
    const char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lens = calloc((size_t)n, sizeof *lens), bytes = 0;
    if (!texts || !lens) {
        free(texts);
        free(lens);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        texts[i] = is_chat ? r->messages[i].content : r->prompt;
        lens[i] = is_chat ? strlen(texts[i]) : r->prompt_len;
        bytes += lens[i];
    }
    size_t least = tokenizer_min_tokens(m->tok, texts, lens, n) + (!is_chat && r->add_bos ? 1 : 0);
    free(texts);
    free(lens);
    struct engine_model_info info;
    engine_get_model_info(m->engine, &info);
    const struct request_bounds b = {.max_positions = info.max_positions};
    return request_context_check((long long)least, r->params.max_tokens, &bytes, &b);
}

/* Renders r->chat_context (a JSON object) with add_generation_prompt, bos_token and eos_token
 * added, then r->prefill after it; *text malloc'd. */
static enum status render_context(const struct served_model *m, const struct gen_request *r, char **text, size_t *len)
{
    cJSON *ctx = cJSON_Parse(r->chat_context);
    if (!ctx) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    cJSON_AddTrueToObject(ctx, "add_generation_prompt");
    cJSON_AddStringToObject(ctx, "bos_token", m->bos_text);
    cJSON_AddStringToObject(ctx, "eos_token", m->eos_text);
    char *json = cJSON_PrintUnformatted(ctx);
    cJSON_Delete(ctx);
    if (!json) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    enum status st = jinja_render_json(m->jtmpl, json, strlen(json), text, len);
    free(json);
    size_t extra = r->prefill ? strlen(r->prefill) : 0;
    if (st == STATUS_OK && extra) {
        char *t = realloc(*text, *len + extra + 1);
        if (!t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(t + *len, r->prefill, extra + 1);
        *text = t;
        *len += extra;
    }
    return st;
}

/* 1 when text[0..len) ends (whitespace skipped) with the tag t of n bytes. */
static int ends_with_tag(const char *text, size_t len, const char *t, size_t n)
{
    while (len > 0 && strchr(" \t\r\n", text[len - 1])) len--;
    return len >= n && !memcmp(text + len - n, t, n);
}

/* A whole-output constraint (a schema from response_format, no marker) made lazy with the
 * trigger flags `flags` and no marker (engine.h TRIGGER_*). */
static enum status constraint_make_lazy(struct gen_request *r, int flags)
{
    char *src = malloc(r->constraint_len + TRIGGER_HEADER_LEN + 1);
    if (!src) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    const int head = engine_trigger_header(flags, src);
    memcpy(src + head, r->constraint, r->constraint_len + 1);
    free(r->constraint);
    r->constraint = src;
    r->constraint_len += (size_t)head;
    r->params.constraint = src;
    r->params.constraint_len = r->constraint_len;
    r->params.constraint_trigger_len = (size_t)head;
    return STATUS_OK;
}

/* GPT-OSS's answer under a JSON Schema (response_format): after its analysis the model writes
 * the final message's header, `<|start|>assistant<|channel|>final<|message|>` (or the analysis
 * breaks off at its <|start|> / <|channel|>: the engine's watch gives the grammar the marker,
 * engine/serving/constraint.c), or the JSON at once: the schema's root takes the three as its
 * prefix list; and '<' only as \u003c in its free strings (a marker in a string would end the
 * message in the reply parser). A JSON object mode constraint becomes {"type": "object"}. Other
 * kinds (regex, grammar, choice) are left as they are: a reply that writes a header after the
 * analysis is then free (docs/tools.md). */
static enum status harmony_answer_schema(struct gen_request *r)
{
    const enum constraint_kind kind = r->params.constraint_kind;
    if (kind != CONSTRAINT_JSON_SCHEMA && kind != CONSTRAINT_JSON_OBJECT) return STATUS_OK;
    cJSON *root = kind == CONSTRAINT_JSON_OBJECT ? cJSON_Parse("{\"type\":\"object\"}")
                                                 : cJSON_ParseWithLength(r->constraint, r->constraint_len);
    if (cJSON_IsTrue(root)) cJSON_Delete(root), root = cJSON_CreateObject();
    if (!cJSON_IsObject(root) || cJSON_HasObjectItem(root, GRAMMAR_SCHEMA_PREFIX) ||
        cJSON_HasObjectItem(root, GRAMMAR_SCHEMA_ESCAPE)) {
        cJSON_Delete(root);
        return STATUS_OK; /* (not JSON: the grammar's compile says so; our keywords: not ours to change) */
    }
    static const char *const heads[] = {"", "<|start|>assistant<|channel|>final<|message|>",
                                         "<|channel|>final<|message|>"};
    cJSON *list = cJSON_CreateStringArray(heads, 3);
    char *src = NULL;
    if (list && cJSON_AddItemToObject(root, GRAMMAR_SCHEMA_PREFIX, list)) {
        list = NULL;
        if (cJSON_AddStringToObject(root, GRAMMAR_SCHEMA_ESCAPE, "<")) src = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(list);
    cJSON_Delete(root);
    if (!src) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    free(r->constraint);
    r->constraint = src;
    r->constraint_len = strlen(src);
    r->params.constraint = src;
    r->params.constraint_len = r->constraint_len;
    r->params.constraint_kind = CONSTRAINT_JSON_SCHEMA;
    return STATUS_OK;
}

/* The server splits reasoning off, so a constraint (a schema from response_format, or a lazy
 * tool call's) applies to the reply after </think>, never to the reasoning:
 * - the prompt ends inside <think> (the template opened it for the model): a whole-output
 *   constraint becomes lazy with no marker (it starts after </think>); a lazy one's trigger,
 *   armed once the reasoning ends, is told the output starts inside it;
 * - the prompt neither opens nor just closed <think> (the model may open it itself) and nothing
 *   is written after the prompt (no tool-call marker): a whole-output constraint becomes an
 *   opening one: from the first token the grammar or <think>, and the grammar after </think>.
 * <think> and </think> stand for the template's markers: close is its closing one, markers the
 * TRIGGER_MARKERS_* bits that tell the engine which (engine.h). */
static enum status constrain_around_think(struct gen_request *r, const char *text, size_t len, const char *close,
                                          int markers)
{
    if (!r->constraint || r->params.constraint_kind == CONSTRAINT_NONE) return STATUS_OK;
    if (markers >> TRIGGER_MARKERS_SHIFT == TRIGGER_MARKERS_HARMONY && !r->params.constraint_trigger_len) {
        const enum status st = harmony_answer_schema(r);
        if (st != STATUS_OK) return st;
    }
    if (r->think_open) {
        int flags = 0;
        if (r->params.constraint_trigger_len &&
            engine_trigger_read(r->constraint, r->params.constraint_trigger_len, &flags) > 0) {
            engine_trigger_header((flags & ~TRIGGER_MAY_REASON) | TRIGGER_IN_REASONING, r->constraint); /* (same length) */
            return STATUS_OK;
        }
        if (r->params.constraint_trigger_len) return STATUS_OK; /* (a marker without flags: not ours to change) */
        return constraint_make_lazy(r, TRIGGER_IN_REASONING | markers);
    }
    if (r->params.constraint_trigger_len || (r->prefill && *r->prefill) || ends_with_tag(text, len, close, strlen(close)))
        return STATUS_OK;
    return constraint_make_lazy(r, TRIGGER_MAY_REASON | markers);
}

/* Tokenizes the request into the prompt ids the engine gets; applies the chat template. */
enum status gen_prompt(const struct served_model *m, struct gen_request *r, int is_chat, int32_t **ids, int *n)
{
    *ids = NULL;
    *n = 0;
    enum status bound = check_prompt_bytes(m, r, is_chat);
    if (bound != STATUS_OK) return bound;
    if (is_chat && m->jtmpl) { /* the model's own template, rendered as text with its special tokens */
        char *text = NULL;
        size_t len = 0;
        enum status st = r->chat_context ? render_context(m, r, &text, &len)
                                         : jinja_render_chat(m->jtmpl, r->messages, r->n_messages, NULL, 1, m->bos_text,
                                                             m->eos_text, &text, &len);
        if (st == STATUS_OK && m->reasoning) {
            const char *open = tool_reasoning_open(m->reasoning), *close = tool_reasoning_close(m->reasoning);
            r->think_open = ends_with_tag(text, len, open, strlen(open));
            st = constrain_around_think(r, text, len, close, (m->reasoning - 1) << TRIGGER_MARKERS_SHIFT);
        }
        if (st == STATUS_OK) st = tokenizer_encode(m->tok, text, len, 0, ids, n);
        free(text);
        memcpy(r->params.end_ids, m->end_ids, sizeof m->end_ids);
        r->params.n_end_ids = m->n_end_ids;
        return st;
    }
    if (is_chat) {
        struct chat_template_extras extras;
        enum status st = chat_template_apply(m->tmpl, m->tok, r->messages, r->n_messages, ids, n, &extras);
        if (st != STATUS_OK) return st;
        if (extras.stop_token_id >= 0) r->stop_token_ids[r->n_stop_token_ids++] = extras.stop_token_id;
        if (extras.stop_string) {
            if (!(r->stop[r->n_stop] = strdup(extras.stop_string)))
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            r->n_stop++;
        }
        r->params.stop = (const char *const *)r->stop;
        r->params.n_stop = r->n_stop;
        r->params.stop_token_ids = r->stop_token_ids;
        r->params.n_stop_token_ids = r->n_stop_token_ids;
        return STATUS_OK;
    }
    if (r->prompt_ids) {
        *ids = r->prompt_ids;
        *n = r->n_prompt_ids;
        r->prompt_ids = NULL;
        r->n_prompt_ids = 0;
        return STATUS_OK; /* ranges: engine_validate */
    }
    return tokenizer_encode(m->tok, r->prompt, r->prompt_len, r->add_bos, ids, n);
}

enum status gen_resolve_adapter(const struct served_model *m, struct gen_request *r)
{
    r->params.adapter = NULL;
    if (!r->adapter || !*r->adapter) r->params.adapter = m->default_adapter;
    else if (strcmp(r->adapter, m->model_id)) {
        if (strlen(r->adapter) > 64)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "adapter: an adapter's name of at most 64 bytes, or the served model's id");
        r->params.adapter = r->adapter;
    }
    return STATUS_OK;
}

enum status gen_build_prompt(struct served_model *m, struct gen_request *r, int is_chat, struct chat_parse *chat,
                             int32_t **ids, int *n_ids)
{
    *ids = NULL;
    *n_ids = 0;
    enum status st = is_chat ? chat_tools_apply(m, r, chat) : STATUS_OK;
    if (st == STATUS_OK)
        st = http_show_special_check(&r->params, is_chat ? chat->tools : 0, is_chat ? chat->reasoning : 0,
                                     "sampling.show_special_tokens");
    if (st == STATUS_OK) st = gen_prompt(m, r, is_chat, ids, n_ids);
    if (st == STATUS_OK && is_chat) st = chat_parse_note_prompt(chat, r);
    if (st != STATUS_OK) {
        free(*ids);
        *ids = NULL;
    }
    return st;
}
