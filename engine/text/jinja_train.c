/* engine/text/jinja_train.c - jinja_render_train: a whole conversation in a model's own Jinja
 * chat template, with the loss mask of supervised fine-tuning, found by rendering rather than
 * by knowing the template. For each assistant message k:
 *   A_k = render(messages[0..k), add_generation_prompt = true)   what the model is given
 *   B_k = render(messages[0..k], add_generation_prompt = false)  ... and what it then writes
 * Both must be prefixes of the whole conversation's rendering F (up to whitespace at their ends:
 * a template's own formatting after its last tag), and B_k[|A_k|..] (the answer
 * and the template's end of turn) is the loss span: exactly what the server's prompt would be
 * followed by. Each span, and each text between spans, is encoded as its own segment (the
 * prompt the server encodes is A_k whole). A template that rewrites earlier turns (one that
 * drops an earlier answer's reasoning, say) has no such prefixes: a clear error naming the
 * message, never a wrong mask.
 * Not here: the built-in templates' training rendering (chat_train.c).
 * Tests: tests/test_jinja_train.py (jinja2 + Hugging Face tokenizers as the reference). */
#include "jinja.h"

#include <stdlib.h>
#include <string.h>

#include "token_builder.h"
#include "tokenizer.h"

/* How much of p[0..n) is a prefix of full[0..full_n) when the rest of p is whitespace (a
 * template's own formatting, after its last tag); (size_t)-1 when no such prefix exists. */
static size_t prefix_len(const char *p, size_t n, const char *full, size_t full_n)
{
    size_t k = n;
    while (k > 0 && (k > full_n || memcmp(p, full, k))) {
        if (!strchr(" \t\r\n", p[k - 1])) return (size_t)-1;
        k--;
    }
    return k;
}

static enum status push_span(struct token_builder *b, const struct tokenizer *tok, const char *s, size_t n, int loss)
{
    if (n == 0) return STATUS_OK;
    int32_t *ids = NULL;
    int n_ids = 0;
    enum status st = tokenizer_encode(tok, s, n, 0, &ids, &n_ids);
    if (st == STATUS_OK) st = token_builder_ids(b, ids, n_ids, loss);
    free(ids);
    return st;
}

enum status jinja_render_train(const struct jinja_template *t, const struct tokenizer *tok, const char *bos,
                               const char *eos, const struct chat_message *messages, int n, int32_t **ids,
                               uint8_t **loss, int *n_ids)
{
    *ids = NULL;
    *loss = NULL;
    *n_ids = 0;
    if (n <= 0) return status_errorf(STATUS_INVALID_ARGUMENT, "messages must not be empty");
    char *full = NULL;
    size_t full_len = 0, pos = 0;
    enum status st = jinja_render_chat(t, messages, n, NULL, 0, bos, eos, &full, &full_len);
    struct token_builder b = {0};
    for (int k = 0; k < n && st == STATUS_OK; k++) {
        if (messages[k].role != CHAT_ROLE_ASSISTANT) continue;
        char *a = NULL, *bk = NULL;
        size_t a_len = 0, b_len = 0;
        st = jinja_render_chat(t, messages, k, NULL, 1, bos, eos, &a, &a_len);
        if (st == STATUS_OK) st = jinja_render_chat(t, messages, k + 1, NULL, 0, bos, eos, &bk, &b_len);
        if (st == STATUS_OK) {
            a_len = prefix_len(a, a_len, full, full_len);
            b_len = prefix_len(bk, b_len, full, full_len);
        }
        if (st == STATUS_OK && (a_len == (size_t)-1 || b_len == (size_t)-1 || a_len < pos || a_len > b_len))
            st = status_errorf(STATUS_INVALID_ARGUMENT,
                               "messages[%d]: the chat template does not render this conversation turn by turn (the "
                               "prompt before this answer, or the conversation up to it, is not a prefix of the "
                               "whole rendering), so the answer's tokens cannot be found for the loss",
                               k);
        if (st == STATUS_OK) st = push_span(&b, tok, full + pos, a_len - pos, 0);
        if (st == STATUS_OK) st = push_span(&b, tok, full + a_len, b_len - a_len, 1);
        pos = b_len;
        free(a);
        free(bk);
    }
    if (st == STATUS_OK) st = push_span(&b, tok, full + pos, full_len - pos, 0);
    free(full);
    if (st == STATUS_OK && b.n == 0)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "messages: the conversation renders to no tokens");
    if (st != STATUS_OK) {
        token_builder_free(&b);
        return st;
    }
    *ids = b.ids;
    *loss = b.loss;
    *n_ids = (int)b.n;
    return STATUS_OK;
}
