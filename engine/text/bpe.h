/* engine/text/bpe.h - byte-level BPE (GPT-2 style), the second tokenizer kind behind tokenizer.h:
 * a vocabulary whose pieces are bytes spelled in GPT-2's 256 printable "byte unicode" characters,
 * merges by rank, a regex pre-tokenizer (PCRE2), added tokens matched before pre-tokenization,
 * an optional NFC normalizer (ICU). Internal to engine/text: tokenizer.cc dispatches here; the
 * rest of the project sees only tokenizer.h.
 * Not here: parsing tokenizer.json (tokenizer_json.c fills a struct bpe and calls bpe_finish),
 * GGUF metadata (engine/formats/gguf_tokenizer.c turns it into a tokenizer.json text), the
 * streaming detokenizer (tokenizer.cc).
 * Tests: tests/test_bpe.py (ids and decodes against Hugging Face `tokenizers`), tests/test_tokenizer.c.
 *
 * Threads: after bpe_finish a struct bpe is immutable; bpe_encode and the lookups may run on many
 * threads at once (each call allocates its own PCRE2 match data and scratch). */
#ifndef SHARDLM_BPE_H
#define SHARDLM_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-id flags. */
enum {
    BPE_PIECE_SPECIAL = 1, /* an added token marked special: a control id, skipped by decode */
    BPE_PIECE_ADDED = 2,   /* an added token: matched on the raw text, decoded as its content */
    BPE_PIECE_MAPPED = 4,  /* every character of the piece is a byte-unicode character */
    BPE_PIECE_UNUSED = 8,  /* an id the file leaves without a piece */
};

/* How a Split pre-tokenizer treats its matches (Hugging Face's SplitDelimiterBehavior). */
enum bpe_split_behavior {
    BPE_SPLIT_REMOVED,
    BPE_SPLIT_ISOLATED,
    BPE_SPLIT_MERGED_WITH_PREVIOUS,
    BPE_SPLIT_MERGED_WITH_NEXT,
    BPE_SPLIT_CONTIGUOUS,
};

/* One pre-tokenizer step: every piece so far is split by `pattern` (ByteLevel's own regex and
 * Digits are written as Split steps by the parser). */
struct bpe_split {
    char                   *pattern;   /* PCRE2 syntax, UTF-8, owned */
    int                     literal;   /* pattern is a plain string, not a regex */
    enum bpe_split_behavior behavior;
    int                     invert;    /* the pieces are the matches' complement */
    void                   *code;      /* pcre2_code_8 *, compiled by bpe_finish */
};

struct bpe_added {
    int32_t id;
    char   *content; /* owned, NUL-terminated, n bytes */
    size_t  n;
    int     special, lstrip, rstrip, single_word, normalized;
};

struct bpe_table; /* open-addressing hash tables, bpe.c */

struct bpe {
    const char *name;         /* for messages: the file (owned copy) */
    int         n_vocab;      /* ids are 0 .. n_vocab-1 */
    char      **pieces;       /* (n_vocab) the piece as in the file, owned, NUL-terminated */
    uint8_t   **bytes;        /* (n_vocab) the piece's bytes when MAPPED, else its own UTF-8 (an
                                 added token decodes to its piece, which is its content) */
    uint32_t   *n_bytes;      /* (n_vocab) */
    uint8_t    *flags;        /* (n_vocab) BPE_PIECE_* */
    int32_t    *merges;       /* (n_merges, 2) left and right ids of the merge of rank r */
    int         n_merges;
    struct bpe_added *added;  /* (n_added) */
    int         n_added;
    struct bpe_split *splits; /* (n_splits) pre-tokenizer steps in order */
    int         n_splits;
    int         add_prefix_space; /* ByteLevel's: a space before each text segment not starting with one */
    int         nfc;              /* normalizer NFC */
    int         ignore_merges;    /* a word that is a piece is taken whole */
    int32_t     unk_id, bos_id, eos_id, pad_id; /* what tokenizer.h reports; -1 when none */
    int32_t     model_unk_id;     /* model.unk_token: what a byte without a piece becomes (else
                                     it is dropped, as Hugging Face and llama.cpp do) */
    int         add_bos;          /* the post-processor puts bos_id first */

    /* Built by bpe_finish. */
    struct bpe_table *by_piece;   /* piece string -> id */
    struct bpe_table *by_bytes;   /* byte string -> id, MAPPED non-added pieces only */
    struct bpe_table *by_pair;    /* (left id, right id) -> rank */
    int32_t     byte_id[256];     /* the id of the one-byte piece, -1 when absent */
    int32_t    *added_by_byte[256]; /* indices into added[] by first content byte, longest first, -1 ended */
    size_t      max_token_bytes;  /* for tokenizer_min_tokens; 0 when no bound is safe */
    const void *nfc_impl;         /* ICU's UNormalizer2 when nfc */
};

/* An empty struct bpe (ids -1, nothing allocated) for a parser to fill; name is copied. NULL
 * when out of memory. */
struct bpe *bpe_alloc(const char *name);
/* Checks what the parser filled and builds the tables and regexes: merges naming unknown ids or
 * a merged piece not in the vocabulary, duplicate pieces, bad regexes give STATUS_BAD_FORMAT
 * naming the file and the field. */
enum status bpe_finish(struct bpe *b);
/* Builds the piece -> id table alone (bpe_finish does it too), for a parser that must look
 * pieces up before it has finished: same errors. */
enum status bpe_index_pieces(struct bpe *b);
/* Accepts NULL. */
void bpe_free(struct bpe *b);

/* Parses a tokenizer.json text json[0..n) (and, when config is not NULL, the special tokens
 * of a tokenizer_config.json text config[0..config_n)) into *out (free with bpe_free). name
 * (the file) is used in messages. Errors: STATUS_BAD_FORMAT naming the file and the field,
 * STATUS_UNSUPPORTED naming a model/normalizer/pre-tokenizer/decoder type this build lacks,
 * STATUS_RESOURCE_EXHAUSTED. bos_id is the post-processor's (or the config's, with
 * add_bos_token) and -1 when the tokenizer adds none. */
enum status bpe_load_json(const char *json, size_t n, const char *name, const char *config, size_t config_n,
                          struct bpe **out);

/* The GPT-2 byte <-> "byte unicode" map: the code point of byte c, and the byte of code point
 * cp (-1 when cp is not one of the 256). */
uint32_t bpe_byte_to_cp(uint8_t c);
int bpe_cp_to_byte(uint32_t cp);

/* Appends the ids of text[0..len) (any bytes: invalid UTF-8 never matches a regex and is
 * encoded byte by byte) to *ids (malloc'd, *cap entries, grown with base_grow), *n of them
 * used. BOS is the caller's. */
enum status bpe_encode(const struct bpe *b, const char *text, size_t len, int32_t **ids, size_t *n,
                       size_t *cap);

/* The id of a piece string, -1 when absent. */
int32_t bpe_piece_to_id(const struct bpe *b, const char *piece, size_t n);

/* Appends to out[0..*n) (grown with base_grow) the text of ids[0..n_ids) as Hugging Face's
 * ByteLevel decoder writes it with skip_special_tokens: special ids vanish, the bytes of the
 * other pieces are concatenated, an added token's content is written as it is, and each run of
 * bytes between added tokens is made valid UTF-8 by replacing every maximal invalid subpart
 * with U+FFFD (Rust's String::from_utf8_lossy). Ids must be valid. */
enum status bpe_decode(const struct bpe *b, const int32_t *ids, int n_ids, char **out, size_t *n,
                       size_t *cap);

/* Appends src[0..n) to *out with every maximal invalid UTF-8 subpart replaced by U+FFFD. */
enum status bpe_utf8_lossy(const uint8_t *src, size_t n, char **out, size_t *len, size_t *cap);
/* The length of the longest suffix of s[0..n) that is an incomplete but so far valid UTF-8
 * sequence (0..3): bytes a streaming decoder holds back. */
size_t bpe_utf8_incomplete_tail(const uint8_t *s, size_t n);

#ifdef __cplusplus
}
#endif

#endif
