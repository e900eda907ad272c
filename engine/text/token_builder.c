/* engine/text/token_builder.c - token sequences with loss flags (token_builder.h).
 * Tests: tests/test_train_data.c. */
#include "token_builder.h"

#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

enum status token_builder_ids(struct token_builder *b, const int32_t *ids, int n, int loss)
{
    if (base_grow((void **)&b->ids, &b->cap_ids, b->n + (size_t)n + 1, sizeof *b->ids) ||
        base_grow((void **)&b->loss, &b->cap_loss, b->n + (size_t)n + 1, sizeof *b->loss))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "token sequence: out of memory");
    memcpy(b->ids + b->n, ids, (size_t)n * sizeof *ids);
    memset(b->loss + b->n, loss ? 1 : 0, (size_t)n);
    b->n += (size_t)n;
    return STATUS_OK;
}

enum status token_builder_id(struct token_builder *b, int32_t id, int loss)
{
    return id >= 0 ? token_builder_ids(b, &id, 1, loss) : STATUS_OK;
}

enum status token_builder_text(struct token_builder *b, const struct tokenizer *tok, const char *text, int loss)
{
    int32_t *ids = NULL;
    int n = 0;
    enum status st = tokenizer_encode(tok, text, strlen(text), 0, &ids, &n);
    if (st == STATUS_OK) st = token_builder_ids(b, ids, n, loss);
    free(ids);
    return st;
}

void token_builder_free(struct token_builder *b)
{
    free(b->ids);
    free(b->loss);
    memset(b, 0, sizeof *b);
}
