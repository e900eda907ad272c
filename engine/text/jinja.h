/* engine/text/jinja.h - a sandboxed interpreter of the Jinja template language, for the chat
 * templates that models ship (tokenizer_config.json's or the GGUF's chat_template). A template
 * is compiled once into an immutable syntax tree and rendered any number of times, from any
 * number of threads at once. The aim is output byte-identical to Python's jinja2 3.1 as
 * Hugging Face transformers configures it (apply_chat_template: ImmutableSandboxedEnvironment,
 * trim_blocks, lstrip_blocks, the loopcontrols extension, its own tojson, raise_exception and
 * strftime_now; and llama.cpp's from_json filter, which DeepSeek V3.2's template calls). docs/chat_templates.md lists the supported subset and what is missing.
 * Not here: tokenizing the rendered prompt, choosing a template for a model (chat_template.h).
 * Tests: tests/test_jinja.py renders tests/data/chat_templates/ and tests/data/jinja_cases.json
 * with jinja2 and with tests/jinja_render.c and compares bytes; tests/fuzz/fuzz_jinja.c.
 *
 * Sandbox: a render touches no file, clock (except strftime_now) or environment variable, and
 * stops with an error after max_steps evaluated nodes, max_output bytes in any one output
 * buffer, max_memory bytes of values or max_depth nested macro calls and expressions.
 * Errors are enum status values with a message (status_message()) that names the template
 * line: STATUS_BAD_FORMAT for a syntax error at compile time, STATUS_INVALID_ARGUMENT for an
 * error while rendering (an undefined name used where jinja2 raises, a type error,
 * raise_exception's message), STATUS_RESOURCE_EXHAUSTED for a sandbox limit or out of memory. */
#ifndef SHARDLM_JINJA_H
#define SHARDLM_JINJA_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "chat_template.h"

struct jinja_options {
    int      trim_blocks;   /* drop the first newline after a block or comment tag */
    int      lstrip_blocks; /* drop the spaces and tabs before a block or comment tag on its line */
    uint64_t max_steps;     /* nodes evaluated per render */
    size_t   max_output;    /* bytes in any one output buffer (the result, a macro's, a block set's) */
    size_t   max_memory;    /* bytes allocated per render */
    int      max_depth;     /* nested macro calls, and nesting of expressions when parsing */
    int64_t  now;           /* strftime_now's time (seconds since the epoch, UTC); 0: the clock */
};

/* jinja2's defaults: no trim_blocks, no lstrip_blocks, and the sandbox limits. */
void jinja_options_default(struct jinja_options *o);
/* What transformers' apply_chat_template uses: trim_blocks and lstrip_blocks on. */
void jinja_options_chat(struct jinja_options *o);

struct jinja_template;

/* Compiles src[0..len) (UTF-8; need not be NUL-terminated). opt may be NULL (chat options).
 * On success *out owns a template (jinja_free). Errors: STATUS_BAD_FORMAT "jinja: line N: ...",
 * STATUS_RESOURCE_EXHAUSTED. */
enum status jinja_compile(const char *src, size_t len, const struct jinja_options *opt,
                          struct jinja_template **out);
void jinja_free(struct jinja_template *t);

/* Renders t with the variables of a JSON object (context_json[0..len), e.g.
 * {"messages": [...], "add_generation_prompt": true}); JSON integers become ints, other
 * numbers floats, objects keep their key order. On success *out (malloc'd, NUL-terminated,
 * caller frees) holds *out_len bytes. The template is only read: safe from many threads. */
enum status jinja_render_json(const struct jinja_template *t, const char *context_json, size_t len,
                              char **out, size_t *out_len);

/* Renders a chat: messages[0..n) as [{"role": ..., "content": ...}], tools (a JSON array of
 * function definitions, or NULL for none), add_generation_prompt, bos_token and eos_token
 * (NULL: ""). Same results and errors as jinja_render_json. */
enum status jinja_render_chat(const struct jinja_template *t, const struct chat_message *msgs,
                              int n, const char *tools_json, int add_generation_prompt,
                              const char *bos, const char *eos, char **out, size_t *out_len);

/* The training rendering of a whole conversation in template t (jinja_train.c): ids and a loss
 * flag per id (malloc'd, caller frees), 1 on each assistant answer and the template's end of
 * that turn, found by rendering the conversation turn by turn; bos and eos as for
 * jinja_render_chat. STATUS_INVALID_ARGUMENT naming the message when the template does not
 * render the conversation as growing prefixes, or when the template raises. */
struct tokenizer;
enum status jinja_render_train(const struct jinja_template *t, const struct tokenizer *tok, const char *bos,
                               const char *eos, const struct chat_message *messages, int n, int32_t **ids,
                               uint8_t **loss, int *n_ids);

#endif
