/* engine/text/chat_template.c - the built-in chat templates (documented in chat_template.h) and the
 * choice of one for a model. A prompt is built as a list of segments, each either text
 * (encoded on its own) or one special token id, so that control pieces such as BOS or
 * <|im_start|> are inserted by id and never depend on how SentencePiece treats their text.
 * Not here: request parsing (convert.c). Tests: tests/server/test_server.py (chat). */
#include "chat_template.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

int chat_role_parse(const char *s)
{
    if (!strcmp(s, "system")) return CHAT_ROLE_SYSTEM;
    if (!strcmp(s, "user")) return CHAT_ROLE_USER;
    if (!strcmp(s, "assistant")) return CHAT_ROLE_ASSISTANT;
    return -1;
}

const char *chat_template_name(enum chat_template_kind k)
{
    switch (k) {
    case CHAT_TEMPLATE_LLAMA2: return "llama2";
    case CHAT_TEMPLATE_CHATML: return "chatml";
    case CHAT_TEMPLATE_GEMMA: return "gemma";
    case CHAT_TEMPLATE_PLAIN: break;
    }
    return "plain";
}

enum status chat_template_parse(const char *name, enum chat_template_kind *out)
{
    if (!strcmp(name, "plain")) *out = CHAT_TEMPLATE_PLAIN;
    else if (!strcmp(name, "llama2")) *out = CHAT_TEMPLATE_LLAMA2;
    else if (!strcmp(name, "chatml")) *out = CHAT_TEMPLATE_CHATML;
    else if (!strcmp(name, "gemma")) *out = CHAT_TEMPLATE_GEMMA;
    else
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "chat template must be one of llama2, chatml, gemma, plain; got '%s'", name);
    return STATUS_OK;
}

int chat_template_is_file(const char *name)
{
    const size_t n = strlen(name);
    return n > 6 && !strcmp(name + n - 6, ".jinja");
}

enum status chat_template_option(const char *name, enum chat_template_kind *kind, const char **file)
{
    if (chat_template_is_file(name)) {
        *file = name;
        return STATUS_OK;
    }
    *file = NULL;
    return chat_template_parse(name, kind);
}

/* The chat_template string of model_dir/tokenizer_config.json, malloc'd, or NULL. */
static char *read_hf_chat_template(const char *model_dir)
{
    char path[4096], *text = NULL, *result = NULL;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir);
    if (base_read_file(path, 64u << 20, "tokenizer_config.json", &text, NULL) != STATUS_OK) return NULL;
    cJSON *root = cJSON_Parse(text);
    const cJSON *t = root ? cJSON_GetObjectItemCaseSensitive(root, "chat_template") : NULL;
    if (cJSON_IsString(t) && t->valuestring) result = strdup(t->valuestring);
    cJSON_Delete(root);
    free(text);
    return result;
}

enum chat_template_kind chat_template_detect(const char *model_dir, const struct tokenizer *tok)
{
    if (tok && tokenizer_piece_to_id(tok, "<|im_start|>") >= 0 && tokenizer_piece_to_id(tok, "<|im_end|>") >= 0)
        return CHAT_TEMPLATE_CHATML;
    if (tok && tokenizer_piece_to_id(tok, "<start_of_turn>") >= 0 && tokenizer_piece_to_id(tok, "<end_of_turn>") >= 0)
        return CHAT_TEMPLATE_GEMMA;
    enum chat_template_kind k = CHAT_TEMPLATE_PLAIN;
    char *t = model_dir ? read_hf_chat_template(model_dir) : NULL;
    if (t && strstr(t, "<|im_start|>") && tok && tokenizer_piece_to_id(tok, "<|im_start|>") >= 0) k = CHAT_TEMPLATE_CHATML;
    else if (t && strstr(t, "[INST]")) k = CHAT_TEMPLATE_LLAMA2;
    free(t);
    return k;
}

/* A growing token array that text segments and special ids are appended to. */
struct ids_buf {
    int32_t *ids; /* (cap) */
    size_t   cap;
    int      n;
};

static enum status ids_reserve(struct ids_buf *b, int more)
{
    if (base_grow((void **)&b->ids, &b->cap, (size_t)b->n + (size_t)more, sizeof *b->ids))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
    return STATUS_OK;
}

static enum status push_id(struct ids_buf *b, int32_t id)
{
    enum status st = ids_reserve(b, 1);
    if (st == STATUS_OK) b->ids[b->n++] = id;
    return st;
}

static enum status push_text(struct ids_buf *b, const struct tokenizer *tok, const char *text, size_t len)
{
    int32_t *ids = NULL;
    int n = 0;
    enum status st = tokenizer_encode(tok, text, len, 0, &ids, &n);
    if (st == STATUS_OK && (st = ids_reserve(b, n)) == STATUS_OK) {
        memcpy(b->ids + b->n, ids, (size_t)n * sizeof *ids);
        b->n += n;
    }
    free(ids);
    return st;
}

/* Formats into a growing string (asprintf without the GNU dependency in every caller). */
static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

static enum status push_fmt_text(struct ids_buf *b, const struct tokenizer *tok, char *s)
{
    if (!s) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
    enum status st = push_text(b, tok, s, strlen(s));
    free(s);
    return st;
}

static enum status check_roles(enum chat_template_kind k, const struct chat_message *m, int n)
{
    if (n <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "messages must not be empty");
    for (int i = 0; i < n; i++)
        if (m[i].role == CHAT_ROLE_SYSTEM && i != 0)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "messages[%d].role: a \"system\" message may only come first", i);
    int first = m[0].role == CHAT_ROLE_SYSTEM;
    if (first >= n)
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages: at least one \"user\" message is needed after the system message");
    if (m[n - 1].role != CHAT_ROLE_USER)
        return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%d].role: the last message must be from \"user\"", n - 1);
    if (k == CHAT_TEMPLATE_LLAMA2)
        for (int i = first; i < n; i++) {
            enum chat_role want = (i - first) % 2 == 0 ? CHAT_ROLE_USER : CHAT_ROLE_ASSISTANT;
            if (m[i].role != want)
                return status_errorf(STATUS_INVALID_ARGUMENT,
                                     "messages[%d].role must be \"%s\": the llama2 template needs user and assistant turns to alternate",
                                     i, want == CHAT_ROLE_USER ? "user" : "assistant");
        }
    return STATUS_OK;
}

static enum status apply_llama2(const struct tokenizer *tok, const struct chat_message *m, int n, struct ids_buf *b)
{
    int bos = tokenizer_bos_id(tok), eos = tokenizer_eos_id(tok);
    const char *system = m[0].role == CHAT_ROLE_SYSTEM ? m[0].content : NULL;
    enum status st = STATUS_OK;
    for (int i = system ? 1 : 0; i < n && st == STATUS_OK; i += 2) {
        const char *user = m[i].content;
        char *u = system && i == 1 ? str_printf("<<SYS>>\n%s\n<</SYS>>\n\n%s", system, user) : strdup(user);
        if (!u) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
        if (bos >= 0) st = push_id(b, bos);
        if (st == STATUS_OK) {
            if (i + 1 < n) st = push_fmt_text(b, tok, str_printf("[INST] %s [/INST] %s", u, m[i + 1].content));
            else st = push_fmt_text(b, tok, str_printf("[INST] %s [/INST]", u));
        }
        if (st == STATUS_OK && i + 1 < n && eos >= 0) st = push_id(b, eos);
        free(u);
    }
    return st;
}

static const char *role_name(enum chat_role r)
{
    return r == CHAT_ROLE_SYSTEM ? "system" : r == CHAT_ROLE_USER ? "user" : "assistant";
}

static enum status apply_chatml(const struct tokenizer *tok, const struct chat_message *m, int n, struct ids_buf *b,
                                struct chat_template_extras *extras)
{
    int32_t start = tokenizer_piece_to_id(tok, "<|im_start|>"), end = tokenizer_piece_to_id(tok, "<|im_end|>");
    if (start < 0 || end < 0)
        return status_errorf(STATUS_UNSUPPORTED,
                             "the chatml template needs <|im_start|> and <|im_end|> pieces, which this model's vocabulary lacks");
    enum status st = STATUS_OK;
    if (tokenizer_bos_id(tok) >= 0) st = push_id(b, tokenizer_bos_id(tok));
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        if ((st = push_id(b, start)) != STATUS_OK) break;
        if ((st = push_fmt_text(b, tok, str_printf("%s\n%s", role_name(m[i].role), m[i].content))) != STATUS_OK) break;
        if ((st = push_id(b, end)) != STATUS_OK) break;
        st = push_text(b, tok, "\n", 1);
    }
    if (st == STATUS_OK) st = push_id(b, start);
    if (st == STATUS_OK) st = push_text(b, tok, "assistant\n", 10);
    extras->stop_token_id = end;
    return st;
}

/* Gemma: the system message joins the first user turn; "assistant" is "model". */
static enum status apply_gemma(const struct tokenizer *tok, const struct chat_message *m, int n, struct ids_buf *b,
                               struct chat_template_extras *extras)
{
    int32_t start = tokenizer_piece_to_id(tok, "<start_of_turn>"), end = tokenizer_piece_to_id(tok, "<end_of_turn>");
    if (start < 0 || end < 0)
        return status_errorf(STATUS_UNSUPPORTED,
                             "the gemma template needs <start_of_turn> and <end_of_turn> pieces, which this model's vocabulary lacks");
    enum status st = STATUS_OK;
    if (tokenizer_bos_id(tok) >= 0) st = push_id(b, tokenizer_bos_id(tok));
    const char *system = m[0].role == CHAT_ROLE_SYSTEM ? m[0].content : NULL;
    for (int i = system ? 1 : 0; i < n && st == STATUS_OK; i++) {
        const char *role = m[i].role == CHAT_ROLE_ASSISTANT ? "model" : "user";
        if ((st = push_id(b, start)) != STATUS_OK) break;
        if (system && i == 1) st = push_fmt_text(b, tok, str_printf("%s\n%s\n\n%s", role, system, m[i].content));
        else st = push_fmt_text(b, tok, str_printf("%s\n%s", role, m[i].content));
        if (st != STATUS_OK || (st = push_id(b, end)) != STATUS_OK) break;
        st = push_text(b, tok, "\n", 1);
    }
    if (st == STATUS_OK) st = push_id(b, start);
    if (st == STATUS_OK) st = push_text(b, tok, "model\n", 6);
    extras->stop_token_id = end;
    return st;
}

static enum status apply_plain(const struct tokenizer *tok, const struct chat_message *m, int n, struct ids_buf *b,
                               struct chat_template_extras *extras)
{
    size_t len = 16;
    for (int i = 0; i < n; i++) len += strlen(m[i].content) + 16;
    char *s = malloc(len), *p = s;
    if (!s) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
    for (int i = 0; i < n; i++) {
        const char *c = m[i].content;
        if (m[i].role == CHAT_ROLE_SYSTEM) p += sprintf(p, "%s\n\n", c);
        else p += sprintf(p, "%s: %s\n", m[i].role == CHAT_ROLE_USER ? "User" : "Assistant", c);
    }
    strcpy(p, "Assistant:");
    enum status st = STATUS_OK;
    if (tokenizer_bos_id(tok) >= 0) st = push_id(b, tokenizer_bos_id(tok));
    if (st == STATUS_OK) st = push_text(b, tok, s, strlen(s));
    free(s);
    extras->stop_string = "\nUser:";
    return st;
}

enum status chat_template_apply(enum chat_template_kind k, const struct tokenizer *tok,
                                const struct chat_message *messages, int n, int32_t **ids,
                                int *n_ids, struct chat_template_extras *extras)
{
    *ids = NULL;
    *n_ids = 0;
    extras->stop_token_id = -1;
    extras->stop_string = NULL;
    enum status st = check_roles(k, messages, n);
    if (st != STATUS_OK) return st;
    struct ids_buf b = {0};
    switch (k) {
    case CHAT_TEMPLATE_LLAMA2: st = apply_llama2(tok, messages, n, &b); break;
    case CHAT_TEMPLATE_CHATML: st = apply_chatml(tok, messages, n, &b, extras); break;
    case CHAT_TEMPLATE_GEMMA: st = apply_gemma(tok, messages, n, &b, extras); break;
    case CHAT_TEMPLATE_PLAIN: st = apply_plain(tok, messages, n, &b, extras); break;
    }
    if (st != STATUS_OK) {
        free(b.ids);
        return st;
    }
    if (!b.ids && (st = ids_reserve(&b, 1)) != STATUS_OK) return st;
    *ids = b.ids;
    *n_ids = b.n;
    return STATUS_OK;
}
