/* engine/text/chat_train.c - chat_template_render_train: a whole conversation in a model's chat
 * template, with the loss mask of supervised fine-tuning (loss on what the assistant says).
 * The templates are the ones chat_template.h documents for serving; here each assistant turn's
 * content is its own segment (as the model produces it after the turn header) so that the
 * mask falls on token boundaries.
 * Not here: the serving rendering (chat_template.c), the training data files (engine/train/).
 * Tests: tests/test_train_data.c. */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token_builder.h"
#include "tokenizer.h"

/* "{a}{b}{c}" as one text segment. */
static enum status push_join(struct token_builder *b, const struct tokenizer *tok, const char *x, const char *y,
                             const char *z, int loss)
{
    size_t n = strlen(x) + strlen(y) + strlen(z) + 1;
    char *s = malloc(n);
    if (!s) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
    snprintf(s, n, "%s%s%s", x, y, z);
    enum status st = token_builder_text(b, tok, s, loss);
    free(s);
    return st;
}

static enum status check_train_roles(const struct chat_message *m, int n, int alternate)
{
    if (n <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "messages must not be empty");
    const int first = m[0].role == CHAT_ROLE_SYSTEM;
    if (first >= n) return status_errorf(STATUS_INVALID_ARGUMENT, "messages: only a system message");
    for (int i = 1; i < n; i++)
        if (m[i].role == CHAT_ROLE_SYSTEM)
            return status_errorf(STATUS_INVALID_ARGUMENT, "messages[%d].role: a \"system\" message may only come first", i);
    for (int i = first; alternate && i < n; i++) {
        enum chat_role want = (i - first) % 2 == 0 ? CHAT_ROLE_USER : CHAT_ROLE_ASSISTANT;
        if (m[i].role != want)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "messages[%d].role must be \"%s\": user and assistant turns must alternate, user first",
                                 i, want == CHAT_ROLE_USER ? "user" : "assistant");
    }
    return STATUS_OK;
}

/* Llama 2: BOS "[INST] {user} [/INST]" {answer} EOS per exchange; the loss on answer and EOS. */
static enum status train_llama2(const struct tokenizer *tok, const struct chat_message *m, int n, struct token_builder *b)
{
    const char *system = m[0].role == CHAT_ROLE_SYSTEM ? m[0].content : NULL;
    enum status st = STATUS_OK;
    for (int i = system ? 1 : 0; i < n && st == STATUS_OK; i += 2) {
        if ((st = token_builder_id(b, tokenizer_bos_id(tok), 0)) != STATUS_OK) break;
        if (system && i == 1) {
            size_t len = strlen(system) + strlen(m[i].content) + 64;
            char *u = malloc(len);
            if (!u) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
            snprintf(u, len, "<<SYS>>\n%s\n<</SYS>>\n\n%s", system, m[i].content);
            st = push_join(b, tok, "[INST] ", u, " [/INST]", 0);
            free(u);
        } else {
            st = push_join(b, tok, "[INST] ", m[i].content, " [/INST]", 0);
        }
        if (st == STATUS_OK && i + 1 < n && (st = token_builder_text(b, tok, m[i + 1].content, 1)) == STATUS_OK)
            st = token_builder_id(b, tokenizer_eos_id(tok), 1);
    }
    return st;
}

/* ChatML and Gemma: a start id, "{role}\n", the content, an end id, "\n" per turn. */
static enum status train_turns(const struct tokenizer *tok, const struct chat_message *m, int n, struct token_builder *b,
                               const char *start_piece, const char *end_piece, int gemma)
{
    int32_t start = tokenizer_piece_to_id(tok, start_piece), end = tokenizer_piece_to_id(tok, end_piece);
    if (start < 0 || end < 0)
        return status_errorf(STATUS_UNSUPPORTED, "the chat template needs %s and %s pieces, which this vocabulary lacks",
                             start_piece, end_piece);
    enum status st = token_builder_id(b, tokenizer_bos_id(tok), 0);
    const char *system = gemma && m[0].role == CHAT_ROLE_SYSTEM ? m[0].content : NULL;
    for (int i = system ? 1 : 0; i < n && st == STATUS_OK; i++) {
        const int answer = m[i].role == CHAT_ROLE_ASSISTANT;
        const char *role = answer ? (gemma ? "model" : "assistant") : m[i].role == CHAT_ROLE_SYSTEM ? "system" : "user";
        if ((st = token_builder_id(b, start, 0)) != STATUS_OK) break;
        if (answer) {
            if ((st = push_join(b, tok, role, "\n", "", 0)) == STATUS_OK)
                st = token_builder_text(b, tok, m[i].content, 1);
        } else if (system && i == 1) {
            size_t len = strlen(system) + strlen(m[i].content) + 8;
            char *u = malloc(len);
            if (!u) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "chat template: out of memory");
            snprintf(u, len, "%s\n\n%s", system, m[i].content);
            st = push_join(b, tok, role, "\n", u, 0);
            free(u);
        } else {
            st = push_join(b, tok, role, "\n", m[i].content, 0);
        }
        if (st == STATUS_OK && (st = token_builder_id(b, end, answer)) == STATUS_OK) st = token_builder_text(b, tok, "\n", 0);
    }
    return st;
}

/* Plain: "User: {u}\n" and "Assistant:" then " {a}" (loss) and "\n" (loss: it is the stop). */
static enum status train_plain(const struct tokenizer *tok, const struct chat_message *m, int n, struct token_builder *b)
{
    enum status st = token_builder_id(b, tokenizer_bos_id(tok), 0);
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        if (m[i].role == CHAT_ROLE_SYSTEM) st = push_join(b, tok, m[i].content, "\n\n", "", 0);
        else if (m[i].role == CHAT_ROLE_USER) st = push_join(b, tok, "User: ", m[i].content, "\n", 0);
        else if ((st = token_builder_text(b, tok, "Assistant:", 0)) == STATUS_OK)
            st = push_join(b, tok, " ", m[i].content, "\n", 1);
    }
    return st;
}

enum status chat_template_render_train(enum chat_template_kind k, const struct tokenizer *tok,
                                       const struct chat_message *messages, int n, int32_t **ids,
                                       uint8_t **loss, int *n_ids)
{
    *ids = NULL;
    *loss = NULL;
    *n_ids = 0;
    enum status st = check_train_roles(messages, n, k == CHAT_TEMPLATE_LLAMA2);
    if (st != STATUS_OK) return st;
    struct token_builder b = {0};
    switch (k) {
    case CHAT_TEMPLATE_LLAMA2: st = train_llama2(tok, messages, n, &b); break;
    case CHAT_TEMPLATE_CHATML: st = train_turns(tok, messages, n, &b, "<|im_start|>", "<|im_end|>", 0); break;
    case CHAT_TEMPLATE_GEMMA: st = train_turns(tok, messages, n, &b, "<start_of_turn>", "<end_of_turn>", 1); break;
    case CHAT_TEMPLATE_PLAIN: st = train_plain(tok, messages, n, &b); break;
    }
    if (st == STATUS_OK && b.n == 0) st = status_errorf(STATUS_INVALID_ARGUMENT, "messages: the conversation renders to no tokens");
    if (st != STATUS_OK) {
        token_builder_free(&b);
        return st;
    }
    *ids = b.ids;
    *loss = b.loss;
    *n_ids = (int)b.n;
    return STATUS_OK;
}
