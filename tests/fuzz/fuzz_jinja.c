/* tests/fuzz/fuzz_jinja.c - the Jinja interpreter (engine/text/jinja*.c): compiling any bytes as
 * a template and rendering what compiles.
 * Input: byte 0 picks the options (bit 0: trim_blocks, bit 1: lstrip_blocks, bit 2: render
 * through jinja_render_chat instead of a JSON context); then the template up to the first NUL
 * byte; after it, the render context as JSON (malformed JSON must be refused cleanly; without a
 * NUL, a fixed chat context is used). Small sandbox limits keep each run short; every error
 * must come back as a status with a message, never a crash or a leak.
 * Corpus: tests/fuzz/corpus/jinja (the model templates of tests/data/chat_templates with a chat
 * context, and language snippets). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "jinja.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static const char default_context[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": 1}}}]}, {\"role\": \"tool\", \"content\": \"1\"},"
    " {\"role\": \"user\", \"content\": \"more\"}], \"tools\": [{\"type\": \"function\", \"function\":"
    " {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}], \"add_generation_prompt\": true,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    struct jinja_options opt;
    jinja_options_default(&opt);
    opt.trim_blocks = data[0] & 1;
    opt.lstrip_blocks = (data[0] >> 1) & 1;
    opt.max_steps = 200000;
    opt.max_output = 1 << 20;
    opt.max_memory = 32 << 20;
    opt.max_depth = 32;
    opt.now = 1767225600;
    const char *tpl = (const char *)data + 1;
    const char *nul = memchr(tpl, 0, size - 1);
    size_t tpl_len = nul ? (size_t)(nul - tpl) : size - 1;
    struct jinja_template *t = NULL;
    if (fuzz_report(jinja_compile(tpl, tpl_len, &opt, &t)) != 0) return 0;
    char *out = NULL;
    size_t out_len = 0;
    if (data[0] & 4) {
        struct chat_message msgs[3] = {{CHAT_ROLE_SYSTEM, "sys"}, {CHAT_ROLE_USER, "hi"}, {CHAT_ROLE_ASSISTANT, "yo"}};
        fuzz_report(jinja_render_chat(t, msgs, 3, "[{\"type\": \"function\"}]", 1, "<s>", "</s>", &out, &out_len));
    } else if (nul) {
        const char *ctx = nul + 1;
        fuzz_report(jinja_render_json(t, ctx, size - 1 - tpl_len - 1, &out, &out_len));
    } else {
        fuzz_report(jinja_render_json(t, default_context, strlen(default_context), &out, &out_len));
    }
    if (out) CHECK(strlen(out) <= out_len, "render length %zu below strlen", out_len);
    free(out);
    jinja_free(t);
    return 0;
}
