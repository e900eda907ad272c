/* tests/fuzz/fuzz_http_responses.c - the Responses API bodies of the HTTP front
 * (server/http_responses.c http_responses_parse: fields, input items, tools, text.format,
 * reasoning, previous_response_id against an empty store), then the chat parser it hands the
 * translated body to, then the engine's request validation (request_validate, with a
 * stories260K-sized engine's limits) for what parses.
 * Input: byte 0 picks the served template (bits 0-4: struct http_chat_caps, as
 * fuzz_http_openai; bit 5: GPT-OSS's harmony); the rest is the body. The served model is "stories260K" with one adapter,
 * "tiny-lora".
 * Corpus: tests/fuzz/corpus/http_responses (tests/fuzz/make_seeds.py). */
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "http_internal.h"
#include "request.h"
#include "tool_format.h"

static struct server srv; /* only the store is read */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    CHECK(http_responses_store_init(4, 1 << 20, &srv.http_responses) == STATUS_OK, "no store");
    return 0;
}

static const struct request_bounds bounds = {
    .vocab_size = 512, .max_positions = 512, .block_tokens = 16, .n_blocks = 64,
    .max_logprobs = 20, .max_seqs = 16, .max_queue = 256,
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const char *const adapters[] = {"tiny-lora"};
    struct http_request q;
    struct http_chat_caps caps = {data[0] & 1, (data[0] >> 1) & 3, (data[0] >> 3) & 1, (data[0] >> 4) & 1, 0, 0, 0, 0,
                                  (data[0] >> 4) & 1, (data[0] >> 4) & 1};
    if (data[0] & 32) caps.tool_format = TOOL_FORMAT_HARMONY, caps.reasoning = TOOL_REASONING_HARMONY; /* (GPT-OSS) */
    /* A copy of exactly the body's bytes, so that ASan sees any read past its end. */
    char *body = malloc(size - 1 ? size - 1 : 1);
    CHECK(body, "out of memory");
    memcpy(body, data + 1, size - 1);
    if (fuzz_report(http_responses_parse(&srv, "stories260K", body, size - 1, "", adapters, 1, &caps, &q)) == STATUS_OK) {
        static const int32_t one[1] = {1};
        if (q.r.params.max_tokens < 0) q.r.params.max_tokens = 16;
        (void)fuzz_report(request_validate(one, 1, &q.r.params, &bounds));
    }
    http_request_free(&q);
    free(body);
    return 0;
}
