/* tests/fuzz/fuzz_http_openai.c - the OpenAI JSON bodies of the HTTP front
 * (server/http_openai.c http_parse_request), then the engine's request validation
 * (request_validate, with a stories260K-sized engine's limits) for what parses, each prompt
 * of a list of prompts on its own.
 * Input: byte 0 picks the endpoint (bit 0: even /v1/completions, odd /v1/chat/completions) and
 * the served template (bits 1-7: struct http_chat_caps, bit 6 GPT-OSS's harmony, bit 7 GLM-4.5's
 * tool format, or Qwen3-Coder's for a body of odd length, whose grammar must compile); the rest is
 * the body. The served model is "stories260K" with one adapter, "tiny-lora".
 * Corpus: tests/fuzz/corpus/http_openai (tests/fuzz/make_seeds.py). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_grammar_vocab.h"
#include "fuzz_util.h"
#include "http_internal.h"
#include "request.h"
#include "tool_format.h"

/* (fuzz_grammar_vocab.h: LLVMFuzzerInitialize, and the vocabulary the GLM grammar compiles against) */

static const struct request_bounds bounds = {
    .vocab_size = 512, .max_positions = 512, .block_tokens = 16, .n_blocks = 64,
    .max_logprobs = 20, .max_seqs = 16, .max_queue = 256,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const char *const adapters[] = {"tiny-lora"};
    struct http_request q;
    int is_chat = data[0] & 1;
    /* Bits 1-3: the served template (bit 1: a Jinja one; bits 2-3: its tool format), bit 4:
     * reasoning split, bit 5: the template reads reasoning_effort, response_format and
     * enable_thinking, bit 6:
     * GPT-OSS's harmony (its tool format and reasoning). */
    struct http_chat_caps caps = {(data[0] >> 1) & 1, (data[0] >> 2) & 3, (data[0] >> 4) & 1, (data[0] >> 5) & 1, 0, 0, 0, 0,
                                  (data[0] >> 5) & 1, (data[0] >> 5) & 1};
    if (data[0] & 64) caps.tool_format = TOOL_FORMAT_HARMONY, caps.reasoning = TOOL_REASONING_HARMONY;
    /* Bit 7: GLM-4.5's template (its calls held to a GBNF grammar built from the tools). */
    if (data[0] & 128) caps.jinja = 1, caps.tool_format = TOOL_FORMAT_GLM, caps.reasoning = TOOL_REASONING_THINK;
    /* (a body of odd length: Qwen3-Coder's XML tags instead, whose auto grammar reads either of two
     * markers: http_tools_glm_grammar lazy 2) */
    if ((data[0] & 192) == 128 && size % 2 == 0) caps.tool_format = TOOL_FORMAT_QWEN_XML;
    /* Bits 6 and 7 together: DeepSeek's template (calls constrained by a schema with its markers;
     * the tools written into the system message; R1's fenced shape when bit 5 is set too). */
    if ((data[0] & 192) == 192)
        caps = (struct http_chat_caps){1, TOOL_FORMAT_DEEPSEEK, TOOL_REASONING_THINK, 0,
                                       data[0] & 32 ? TOOL_PROMPT_DEEPSEEK_R1 : TOOL_PROMPT_DEEPSEEK, (data[0] >> 5) & 1, 0, 0, 0, 0};
    /* A copy of exactly the body's bytes, so that ASan sees any read past its end. */
    char *body = malloc(size - 1 ? size - 1 : 1);
    CHECK(body, "out of memory");
    memcpy(body, data + 1, size - 1);
    if (fuzz_report(http_parse_request(body, size - 1, is_chat, "stories260K", adapters, 1, &caps, &q)) == STATUS_OK) {
        static const int32_t one[1] = {1};
        if (q.r.params.max_tokens < 0) q.r.params.max_tokens = 16; /* http.c's default */
        /* Each prompt of a completions request is its own engine request (chat: one). */
        for (int i = 0; i < (is_chat ? 1 : q.n_prompts); i++) {
            const struct http_prompt *p = is_chat ? NULL : &q.prompts[i];
            const int32_t *prompt = p && p->ids ? p->ids : one;
            int n = p && p->ids ? p->n_ids : 1;
            (void)fuzz_report(request_validate(prompt, n, &q.r.params, &bounds));
        }
        /* The grammar built from any tools the front accepted compiles (server/http_tools_glm.c):
         * a failure would be a 400 for a request the front said was fine. */
        if (q.tools && (caps.tool_format == TOOL_FORMAT_GLM || caps.tool_format == TOOL_FORMAT_QWEN_XML) &&
            q.r.params.constraint_kind == CONSTRAINT_GRAMMAR) {
            const size_t t = q.r.params.constraint_trigger_len;
            struct grammar *g = NULL;
            enum status st = grammar_compile(vocab, GRAMMAR_EBNF, q.r.params.constraint + t,
                                             q.r.params.constraint_len - t, &g);
            CHECK(st == STATUS_OK || st == STATUS_RESOURCE_EXHAUSTED, "the %s tool grammar does not compile: %s\n%s",
                  tool_format_name(caps.tool_format), status_message(), q.r.params.constraint + t);
            grammar_unref(g);
        }
    }
    http_request_free(&q);
    free(body);
    return 0;
}
