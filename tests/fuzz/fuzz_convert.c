/* tests/fuzz/fuzz_convert.c - raw gRPC request bytes into the server's conversion code
 * (server/convert.c, and server/wire.c, which reads them in the wire format first), then the
 * engine's request validation (request_validate, with the limits of a stories260K-sized
 * engine) for what converts.
 * Input: byte 0 picks the method (mod 8): 0 Generate, 1 Chat, 2 Tokenize, 3 Detokenize,
 * 4 Cancel, 5 GetModelInfo / GetServerStats, 6 Health, 7 reflection; the rest is the
 * serialized request message. Corpus: tests/fuzz/corpus/convert (tests/fuzz/make_seeds.py). */
#include <stdlib.h>

#include "convert.h"
#include "fuzz_util.h"
#include "request.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

/* A stories260K engine's facts: what engine_validate would check against. */
static const struct request_bounds bounds = {
    .vocab_size = 512, .max_positions = 512, .block_tokens = 16, .n_blocks = 64,
    .max_logprobs = 20, .max_seqs = 16, .max_queue = 256,
};

static void gen_request(const uint8_t *data, size_t size, int is_chat)
{
    struct gen_request r = {0};
    if (fuzz_report(convert_gen_request(data, size, is_chat, &r)) == STATUS_OK) {
        static const int32_t one[1] = {1};
        const int32_t *prompt = r.prompt_ids ? r.prompt_ids : one;
        int n = r.prompt_ids ? r.n_prompt_ids : 1;
        (void)fuzz_report(request_validate(prompt, n, &r.params, &bounds));
        (void)request_id_check(r.request_id);
    }
    gen_request_free(&r);
}

static void other_request(int which, const uint8_t *data, size_t size)
{
    char *text = NULL;
    size_t text_len = 0;
    int add_bos = 0, n = 0;
    int32_t *ids = NULL;
    struct reflection_query q = {0};
    switch (which) {
    case 2: (void)convert_tokenize_request(data, size, &text, &text_len, &add_bos); break;
    case 3: (void)convert_detokenize_request(data, size, 512, &ids, &n); break;
    case 4: (void)convert_cancel_request(data, size, &text); break;
    case 5: /* every request that names a model, in turn by the first byte */
        (void)convert_request_model((enum model_request)(size ? data[0] % 6 : 0), data, size, &text);
        break;
    case 6: (void)convert_health_request(data, size, &text); break;
    default:
        (void)convert_reflection_request(data, size, &q);
        reflection_query_free(&q);
        break;
    }
    free(text);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int which = data[0] % 8;
    if (which < 2) gen_request(data + 1, size - 1, which);
    else other_request(which, data + 1, size - 1);
    return 0;
}
