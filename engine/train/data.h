/* engine/train/data.h - training data: files in, tokenized examples with loss masks, a
 * deterministic shuffled order, and micro-batches of packed documents out.
 * Formats (chosen per line for JSONL, by extension for plain text):
 *   .txt                          continued pretraining: the file's tokens cut into examples
 *                                 of seq_length tokens, loss on every token
 *   {"text": ...}                 one document: BOS text EOS, loss on every token
 *   {"prompt": ..., "completion": ...}   BOS prompt completion EOS, loss on the completion
 *                                 and EOS only
 *   {"messages": [{"role", "content"}, ...]} and ShareGPT's {"conversations": [{"from",
 *                                 "value"}, ...]}: rendered with the chat template
 *                                 (chat_template_render_train), loss on the assistant turns
 * Not here: the model, the optimizer, the loop (trainer.c).
 * Tests: tests/test_train_data.c. */
#ifndef SHARDLM_TRAIN_DATA_H
#define SHARDLM_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"
#include "chat_template.h"

struct jinja_template;

struct tokenizer;

/* Every example's tokens are held back to back in one array of 32-bit words: the id in the low
 * 31 bits, the loss flag in bit 31 (1 when the token is a target: the loss of predicting it
 * from the tokens before it counts; an example's first token never is). 4 bytes a token and 8
 * an example (its start), whatever the format: no per-example allocations. */
#define DATA_LOSS_FLAG 0x80000000u

/* What to do with an example longer than seq_length. */
enum data_overflow {
    DATA_OVERFLOW_TRUNCATE, /* keep its first seq_length tokens (counted in the log) */
    DATA_OVERFLOW_SKIP,     /* leave it out (counted in the log) */
    DATA_OVERFLOW_ERROR,    /* STATUS_INVALID_ARGUMENT naming the file and line */
};

struct data_options {
    int                     seq_length;
    enum data_overflow      overflow;
    enum chat_template_kind chat_template;
    const struct jinja_template *jinja; /* the model's own template (or --chat-template FILE.jinja),
                                           used instead of chat_template when set; borrowed */
    char bos_text[64], eos_text[64];    /* its bos_token and eos_token */
};

struct train_dataset {
    uint32_t *tokens;      /* (start[n]) every example's tokens: id | loss flag (DATA_LOSS_FLAG) */
    int64_t  *start;       /* (n + 1) example i is tokens[start[i] .. start[i + 1]) */
    size_t n, cap;         /* examples; cap: capacity of start */
    size_t tok_cap;        /* capacity of tokens */
    /* What loading did, for the log: nothing is dropped silently. */
    long n_lines, n_blank, n_truncated, n_skipped, n_no_target;
    int64_t n_tokens, n_target_tokens;
    int64_t n_tokenized;   /* ids the tokenizer produced (a long example is tokenized only as far
                            * as --seq-length needs: a bounded prefix of its text) */
    /* The last order data_next_micro_batch built (a cache: rebuilt when the seed, the epoch or
     * the example count differs), so that a micro-batch costs its examples, not O(n). */
    size_t *order;         /* (order_n) */
    size_t order_n;
    uint64_t order_seed;
    int64_t order_epoch;
};

/* Example i: its length and its tokens (id | loss flag). */
static inline int data_example_len(const struct train_dataset *ds, size_t i)
{
    return (int)(ds->start[i + 1] - ds->start[i]);
}
static inline const uint32_t *data_example_tokens(const struct train_dataset *ds, size_t i)
{
    return ds->tokens + ds->start[i];
}
static inline int32_t data_token_id(uint32_t t) { return (int32_t)(t & ~DATA_LOSS_FLAG); }
static inline int data_token_loss(uint32_t t) { return (int)(t >> 31); }

/* Appends one example as it is (ids[0..n), loss[i] = 1 for a target; no overflow policy, the
 * first token's flag cleared), for examples built elsewhere (tests). */
enum status data_append(struct train_dataset *ds, const int32_t *ids, const uint8_t *loss, int n);

/* Loads every file of the comma-separated list `paths` (each .txt, or JSONL of the formats
 * above) and appends its examples to *ds. Files are read as streams (a JSONL line, or a .txt
 * chunk of 64 to 128 KiB cut before a space, at a time), so memory holds the tokens, not the text.
 * A text (or prompt + completion) longer than seq_length is tokenized only as far as needed:
 * a prefix of its bytes that gives seq_length + 1 tokens with a margin (cut before a space,
 * where SentencePiece starts a piece, so the kept tokens are those of the whole text); a chat
 * message's content that alone overflows is cut so before the template renders it.
 * Errors name the file and line: a malformed JSON line, an unknown role, a line of no known
 * format, an empty file, a NUL byte (or \u0000) or invalid UTF-8 anywhere, an empty "text",
 * "prompt" or "completion", an example over seq_length under DATA_OVERFLOW_ERROR. */
enum status data_load(const char *paths, const struct tokenizer *tok, const struct data_options *o,
                      struct train_dataset *ds);
void data_free(struct train_dataset *ds);

/* Every run of target tokens in ds (an assistant turn's content and its end, a text and its EOS,
 * a completion) as one text, each followed by -1: *ids (malloc'd, the caller frees) holds *n
 * entries, *texts of them the ends. A speculative corpus (`--spec-corpus`) is made of these. */
enum status data_target_texts(const struct train_dataset *ds, int32_t **ids, int64_t *n, int64_t *texts);

/* Moves the examples at positions of a seeded permutation's last `percent`% (rounded down,
 * at least 1 when percent > 0 and n > 1) from ds to held_out: the --split held-out set. */
enum status data_split(struct train_dataset *ds, int percent, uint64_t seed,
                       struct train_dataset *held_out);

/* The position in a dataset's shuffled order: epoch e reads the permutation of the examples
 * seeded by (seed, e). Part of the training state, so that a resumed run reads on exactly. */
struct data_cursor {
    uint64_t seed;
    int64_t  epoch;
    int64_t  index;  /* next position in this epoch's permutation */
};

/* One micro-batch: up to micro_batch_size sequences of at most seq_length tokens, each packed
 * greedily with whole examples in the shuffled order (an example that does not fit starts the
 * next sequence); all of it flattened into rows with document boundaries, as struct
 * train_batch wants. Host memory. */
struct micro_batch {
    int      n_tokens, n_docs, n_targets;
    int32_t *tokens, *targets, *positions; /* (capacity) */
    int32_t *doc_start;                    /* (capacity + 1) */
    int64_t *doc_example;                  /* (capacity): each document's index in the dataset */
    int      capacity;                     /* micro_batch_size x seq_length */
};

enum status micro_batch_init(struct micro_batch *mb, int micro_batch_size, int seq_length);
void micro_batch_free(struct micro_batch *mb);

/* Fills mb from ds at *cur, advancing it (into the next epoch when the order runs out).
 * micro_batch_size sequences of seq_length. ds's order cache is updated (not thread-safe). */
void data_next_micro_batch(struct train_dataset *ds, struct data_cursor *cur,
                           int micro_batch_size, int seq_length, struct micro_batch *mb);

/* The permutation of n examples for (seed, epoch), deterministic on every machine. */
void data_permutation(uint64_t seed, int64_t epoch, size_t n, size_t *perm);

#endif
