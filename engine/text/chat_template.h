/* engine/text/chat_template.h - turning a list of chat messages into prompt token ids: the built-in
 * Llama-2 `[INST]`, ChatML and plain templates, and the choice of one for a model directory.
 * Not here: parsing ChatRequest (convert.c), generation (engine/).
 * Tests: tests/server/test_server.py (chat) compares Chat with Generate on the token ids
 * that the templates below document.
 *
 * The templates, exactly (BOS / EOS are the tokenizer's special ids, never text; each quoted
 * segment is encoded on its own with SentencePiece, which adds its usual dummy-prefix space):
 *
 * llama2 (Meta's Llama-2-chat format). The system message, if any, is folded into the first
 * user message as "<<SYS>>\n{system}\n<</SYS>>\n\n{user}". Every completed exchange is
 *     BOS "[INST] {user} [/INST] {assistant}" EOS
 * and the open one at the end is
 *     BOS "[INST] {user} [/INST]"
 * Roles must alternate user, assistant, user, ... after the optional system message.
 *
 * chatml (Qwen, Hermes, ...): BOS (when the model has one), then every message as
 *     <|im_start|> "{role}\n{content}" <|im_end|> "\n"
 * and finally <|im_start|> "assistant\n". <|im_start|> and <|im_end|> are the vocabulary's
 * pieces of those names (inserted by id). <|im_end|> is added to the request's stop token ids.
 *
 * gemma (Gemma 2 and 3 instruction-tuned models): BOS, then every turn as
 *     <start_of_turn> "{role}\n{content}" <end_of_turn> "\n"
 * with role "user" or "model" (for "assistant"); a system message is folded into the first
 * user turn as "user\n{system}\n\n{content}"; finally <start_of_turn> "model\n".
 * <start_of_turn> and <end_of_turn> are inserted by id; <end_of_turn> is added to the request's
 * stop token ids. Chosen for vocabularies that have both pieces.
 *
 * plain (any model, the fallback): BOS, then one text segment:
 *     "{system}\n\n" (when there is a system message), then per message
 *     "User: {content}\n" or "Assistant: {content}\n", and finally "Assistant:".
 * The stop string "\nUser:" is added to the request's stop strings.
 *
 * Every template requires at least one message, a "system" message only first, and a last
 * message from the user. */
#ifndef SHARDLM_CHAT_TEMPLATE_H
#define SHARDLM_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

struct tokenizer;

enum chat_role {
    CHAT_ROLE_SYSTEM,
    CHAT_ROLE_USER,
    CHAT_ROLE_ASSISTANT,
};

/* Parses "system" / "user" / "assistant"; -1 for anything else. */
int chat_role_parse(const char *s);

struct chat_message {
    enum chat_role role;
    char          *content; /* NUL-terminated UTF-8, owned by whoever owns the message array */
};

enum chat_template_kind {
    CHAT_TEMPLATE_PLAIN,
    CHAT_TEMPLATE_LLAMA2,
    CHAT_TEMPLATE_CHATML,
    CHAT_TEMPLATE_GEMMA,
};

const char *chat_template_name(enum chat_template_kind k); /* "plain", "llama2", "chatml", "gemma" */
/* Parses a template name; STATUS_INVALID_ARGUMENT naming the allowed ones otherwise. */
enum status chat_template_parse(const char *name, enum chat_template_kind *out);
/* 1 when a --chat-template value names a Jinja file (it ends in ".jinja"), else 0. */
int chat_template_is_file(const char *name);
/* A --chat-template value: a FILE.jinja (*file = name, *kind untouched) or a built-in template's
 * name (*kind, *file = NULL); STATUS_INVALID_ARGUMENT otherwise. */
enum status chat_template_option(const char *name, enum chat_template_kind *kind, const char **file);

/* Chooses the template of a model: chatml when the vocabulary has an <|im_start|> piece; gemma
 * when it has <start_of_turn> and <end_of_turn>;
 * otherwise from the chat_template string of model_dir/tokenizer_config.json when there is one
 * ("<|im_start|>" -> chatml, "[INST]" -> llama2); otherwise plain. model_dir may be NULL. */
enum chat_template_kind chat_template_detect(const char *model_dir, const struct tokenizer *tok);

/* What a template adds to a request besides its prompt. */
struct chat_template_extras {
    int32_t     stop_token_id; /* -1 when none */
    const char *stop_string;   /* static, NULL when none */
};

/* Applies template k to messages[0..n). On success *ids (malloc'd, caller frees) holds the
 * prompt's n_ids token ids and *extras what the template adds to the request. Errors:
 * STATUS_INVALID_ARGUMENT naming the offending message (messages[i].role ...). */
enum status chat_template_apply(enum chat_template_kind k, const struct tokenizer *tok,
                                const struct chat_message *messages, int n, int32_t **ids,
                                int *n_ids, struct chat_template_extras *extras);

/* The training rendering of a whole conversation (chat_train.c): the same template as
 * chat_template_apply, every turn included, with *loss (malloc'd, caller frees, n_ids entries)
 * set to 1 on the tokens the model must learn to produce: each assistant turn's content and
 * its end (the template's end-of-turn id, or EOS), 0 elsewhere. The assistant content is
 * encoded as its own segment, as the model produces it after the template's turn header.
 * Roles: an optional system message first, then at least one message; the last may be from
 * either side (a conversation without an assistant turn has no loss). STATUS_INVALID_ARGUMENT
 * naming the message otherwise. */
enum status chat_template_render_train(enum chat_template_kind k, const struct tokenizer *tok,
                                       const struct chat_message *messages, int n, int32_t **ids,
                                       uint8_t **loss, int *n_ids);

#endif
