/* tests/fuzz/fuzz_chat_template.c - chat-template rendering of arbitrary messages
 * (engine/text/chat_template.c for serving, chat_train.c for training) with the stories260K
 * tokenizer (SKIP, exit 77, without the shared assets).
 * Input: byte 0 picks the template (mod 4: plain, llama2, chatml, gemma; stories260K has no
 * chatml or gemma pieces, so those must be refused cleanly), byte 1 the rendering (even:
 * chat_template_apply, odd: chat_template_render_train); the rest is messages separated by
 * NUL bytes, each a role byte (mod 3: system, user, assistant) then its content (any bytes:
 * the JSONL reader hands cJSON's strings over unchecked). Every id produced must be inside the
 * vocabulary and, for training, have a loss flag of 0 or 1.
 * Corpus: tests/fuzz/corpus/chat_template (tests/fuzz/make_seeds.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "fuzz_util.h"
#include "tokenizer.h"

#define MAX_MESSAGES 64

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_tokenizer();
    return 0;
}

/* Splits data into messages (contents are copies); returns how many. */
static int split_messages(const uint8_t *data, size_t size, struct chat_message *m)
{
    int n = 0;
    size_t at = 0;
    while (at < size && n < MAX_MESSAGES) {
        const uint8_t *end = memchr(data + at, 0, size - at);
        size_t len = end ? (size_t)(end - (data + at)) : size - at;
        if (len > 0) {
            m[n].role = (enum chat_role)(data[at] % 3);
            m[n].content = fuzz_strndup(data + at + 1, len - 1);
            n++;
        }
        at += len + 1;
    }
    return n;
}

static void check_ids(const int32_t *ids, const uint8_t *loss, int n, int vocab)
{
    for (int i = 0; i < n; i++) {
        CHECK(ids[i] >= 0 && ids[i] < vocab, "id %d at %d outside the vocabulary", ids[i], i);
        CHECK(!loss || loss[i] <= 1, "loss flag %d at %d", loss[i], i);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    const struct tokenizer *tok = fuzz_tokenizer();
    enum chat_template_kind k = (enum chat_template_kind)(data[0] % 4);
    int train = data[1] & 1;
    struct chat_message m[MAX_MESSAGES];
    int n = split_messages(data + 2, size - 2, m), n_ids = 0;
    int32_t *ids = NULL;
    uint8_t *loss = NULL;
    struct chat_template_extras extras;
    enum status s = train ? chat_template_render_train(k, tok, m, n, &ids, &loss, &n_ids)
                          : chat_template_apply(k, tok, m, n, &ids, &n_ids, &extras);
    if (fuzz_report(s) == STATUS_OK) check_ids(ids, loss, n_ids, tokenizer_vocab_size(tok));
    free(ids);
    free(loss);
    for (int i = 0; i < n; i++) free(m[i].content);
    return 0;
}
