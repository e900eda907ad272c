/* engine/text/token_builder.h - a growing sequence of token ids with one loss flag per token:
 * how training examples are assembled from text segments and special ids (the chat templates'
 * training rendering, the prompt/completion and text formats of the training data).
 * Not here: which segments carry the loss (chat_train.c, engine/train/data.c).
 * Tests: tests/test_train_data.c. */
#ifndef SHARDLM_TOKEN_BUILDER_H
#define SHARDLM_TOKEN_BUILDER_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

struct tokenizer;

struct token_builder {
    int32_t *ids;  /* (n) */
    uint8_t *loss; /* (n): 1 where the token is a target */
    size_t   n, cap_ids, cap_loss;
};

/* Appends n ids, each with the loss flag `loss` (0 or 1). */
enum status token_builder_ids(struct token_builder *b, const int32_t *ids, int n, int loss);
/* Appends one id; a negative id (a tokenizer without BOS / EOS) appends nothing. */
enum status token_builder_id(struct token_builder *b, int32_t id, int loss);
/* Appends the SentencePiece encoding of text (no BOS), each token with `loss`. */
enum status token_builder_text(struct token_builder *b, const struct tokenizer *tok, const char *text,
                               int loss);
/* Frees the arrays and empties b. */
void token_builder_free(struct token_builder *b);

#endif
