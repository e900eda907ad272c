/* tests/fuzz/fuzz_train_data.c - the training data reader (engine/train/data.c: JSONL lines of
 * text, prompt/completion, messages and ShareGPT conversations, rendered through
 * chat_train.c) with the stories260K tokenizer (SKIP, exit 77, without the shared assets).
 * Input: byte 0 picks the chat template (mod 4) and the overflow policy (/ 4 mod 3), byte 1
 * the sequence length (8 + byte); the rest is the file, written as data.jsonl and loaded with
 * data_load. What loads is then split and packed into one micro-batch, checking the ids.
 * Corpus: tests/fuzz/corpus/train_data (tests/fuzz/make_seeds.py). */
#include <stdlib.h>

#include "data.h"
#include "fuzz_util.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_tokenizer();
    return 0;
}

static void use(struct train_dataset *ds, int seq_length, int vocab)
{
    struct train_dataset held = {0};
    struct micro_batch mb;
    struct data_cursor cur = {.seed = 7};
    for (size_t i = 0; i < ds->n; i++) {
        const int n = data_example_len(ds, i);
        CHECK(n <= seq_length, "example %zu has %d tokens, over seq_length %d", i, n, seq_length);
        for (int j = 0; j < n; j++) {
            const int32_t id = data_token_id(data_example_tokens(ds, i)[j]);
            CHECK(id >= 0 && id < vocab, "id outside the vocabulary");
        }
    }
    if (data_split(ds, 20, 3, &held) == STATUS_OK && ds->n > 0 &&
        micro_batch_init(&mb, 2, seq_length) == STATUS_OK) {
        data_next_micro_batch(ds, &cur, 2, seq_length, &mb);
        micro_batch_free(&mb);
    }
    data_free(&held);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const struct tokenizer *tok = fuzz_tokenizer();
    struct data_options o = {
        .seq_length = 8 + data[1],
        .overflow = (enum data_overflow)(data[0] / 4 % 3),
        .chat_template = (enum chat_template_kind)(data[0] % 4),
    };
    const char *path = fuzz_write_file("data.jsonl", data + 2, size - 2);
    struct train_dataset ds = {0};
    if (fuzz_report(data_load(path, tok, &o, &ds)) == STATUS_OK) use(&ds, o.seq_length, tokenizer_vocab_size(tok));
    data_free(&ds);
    return 0;
}
