/* engine/text/bpe.h - the tokenizers of a Hugging Face tokenizer.json, the second tokenizer kind
 * behind tokenizer.h. One struct bpe holds what they share (the vocabulary, added tokens matched
 * before anything else, normalizer and pre-tokenizer steps, the decoder) and b->model says which
 * model turns each pre-token into ids:
 *   BPE_MODEL_BYTE_LEVEL  GPT-2 style: pieces spelled in GPT-2's 256 "byte unicode" characters,
 *                         merges by rank, regex pre-tokenizer (PCRE2), optional NFC (bpe.c)
 *   BPE_MODEL_BPE         BPE over characters with byte_fallback (<0xNN> pieces), Metaspace or
 *                         Prepend/Replace("▁"): Llama 2, Mistral, TinyLlama (bpe.c)
 *   BPE_MODEL_WORDPIECE   BERT: greedy longest match with a "##" prefix (wordpiece.c)
 *   BPE_MODEL_UNIGRAM     T5/ALBERT/XLNet: Viterbi over log-probabilities (unigram.c)
 *   BPE_MODEL_WORDLEVEL   each pre-token whole is one id of the vocabulary, else unk (wordpiece.c)
 * Normalizers other than NFC live in normalizer.c, decoders and UTF-8 helpers in text_decode.c.
 * Internal to engine/text: tokenizer.cc dispatches here; the rest of the project sees only
 * tokenizer.h.
 * Not here: parsing tokenizer.json (tokenizer_json.c fills a struct bpe and calls bpe_finish),
 * GGUF metadata (engine/formats/gguf_tokenizer.c turns it into a tokenizer.json text), the
 * streaming detokenizer (tokenizer.cc).
 * Tests: tests/test_bpe.py (ids and decodes against Hugging Face `tokenizers`), tests/test_tokenizer.c,
 * tests/test_tokenizer_kinds.py (WordPiece, Unigram, character BPE against `tokenizers`),
 * tests/test_vocab_vectors.py (llama.cpp's ggml-vocab-*.gguf test vectors), tests/fuzz/fuzz_tokenizer_json.c.
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

enum bpe_model {
    BPE_MODEL_BYTE_LEVEL,
    BPE_MODEL_BPE,
    BPE_MODEL_WORDPIECE,
    BPE_MODEL_UNIGRAM,
    BPE_MODEL_WORDLEVEL,
};

/* One normalizer step (kinds other than byte-level; applied in order, normalizer.c). */
enum bpe_norm_kind {
    BPE_NORM_NFC,
    BPE_NORM_NFD,
    BPE_NORM_NFKC,
    BPE_NORM_NFKD,
    BPE_NORM_LOWERCASE,     /* Rust's char::to_lowercase, character by character */
    BPE_NORM_STRIP_ACCENTS, /* drops nonspacing marks (Mn) */
    BPE_NORM_BERT_CLEAN,    /* BertNormalizer clean_text: drops NUL, U+FFFD and controls; whitespace -> ' ' */
    BPE_NORM_BERT_CHINESE,  /* BertNormalizer handle_chinese_chars: a space either side of each CJK ideograph */
    BPE_NORM_REPLACE,       /* Replace with a String pattern: every occurrence of text by with */
    BPE_NORM_PREPEND,       /* Prepend: text before a non-empty segment */
    BPE_NORM_STRIP,         /* Strip: whitespace off the left and/or right */
    BPE_NORM_PRECOMPILED,   /* Precompiled: SentencePiece's charsmap (charsmap.c) */
    BPE_NORM_REPLACE_REGEX, /* Replace with a Regex pattern (text, PCRE2) by with, every match */
};

struct bpe_norm {
    enum bpe_norm_kind kind;
    char *text, *with; /* owned, NUL-terminated (REPLACE: pattern and content; PREPEND: text) */
    int   left, right; /* STRIP */
    uint8_t *map;      /* PRECOMPILED: the charsmap's bytes, owned */
    size_t   map_n;
    void    *code;     /* REPLACE_REGEX: pcre2_code_8 *, compiled by bpe_finish */
};

/* One decoder step of the non-byte-level kinds, in the file's order (Hugging Face's decoders;
 * text_decode.c). */
enum bpe_dec_kind {
    BPE_DEC_REPLACE,       /* text -> with in every token */
    BPE_DEC_BYTE_FALLBACK, /* runs of <0xNN> tokens become their bytes (or one U+FFFD each if invalid) */
    BPE_DEC_FUSE,          /* all tokens become one */
    BPE_DEC_STRIP,         /* up to start / stop copies of text off each token's ends */
    BPE_DEC_METASPACE,     /* U+2581 -> ' ', dropped in the first token when prepend */
    BPE_DEC_WORDPIECE,     /* prefix off continuing pieces, ' ' before the others, cleanup */
};

struct bpe_dec {
    enum bpe_dec_kind kind;
    char *text, *with; /* owned (REPLACE; STRIP: text; WORDPIECE: text = prefix) */
    int   start, stop; /* STRIP */
    int   flag;        /* METASPACE: prepend_scheme is not "never"; WORDPIECE: cleanup */
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
    char   *key;     /* what is matched, owned, n_key bytes (bpe_finish): the content, normalized
                        by the tokenizer's normalizer when `normalized` */
    size_t  n_key;
    int     in_model; /* the id is also a piece of the model's vocabulary */
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
    int         merge_by_id;      /* a merge's priority is the merged piece's id, not its line
                                     (tiktoken: the rank is the id; tiktoken.c) */
    int32_t     unk_id, bos_id, eos_id, pad_id; /* what tokenizer.h reports; -1 when none */
    int32_t     model_unk_id;     /* model.unk_token: what a byte without a piece becomes (else
                                     it is dropped, as Hugging Face and llama.cpp do) */
    int         add_bos;          /* the post-processor puts bos_id first */
    int32_t     post_suffix[2];   /* ids the post-processor puts last (BERT's [SEP]), with add_bos */
    int         n_post_suffix;

    /* The non-byte-level kinds. */
    enum bpe_model model;
    struct bpe_norm *norms;       /* (n_norms) normalizer steps in order */
    int         n_norms;
    int         metaspace;        /* a Metaspace pre-tokenizer first: spaces become U+2581 */
    int         metaspace_prepend; /* 0 never, 1 first (the text's first segment), 2 always */
    struct bpe_dec *decs;         /* (n_decs) decoder steps; none: tokens joined by ' ' */
    int         n_decs;
    double     *scores;           /* (n_vocab) Unigram log-probabilities */
    double      min_score;        /* Unigram: the lowest score; an unknown character costs min_score - 10 */
    int         fuse_unk;         /* BPE: consecutive unknown characters give one unk id */
    int         byte_fallback;    /* BPE, Unigram: a character without a piece becomes <0xNN> pieces */
    int32_t     byte_piece[256];  /* the id of "<0xNN>", -1 when absent */
    char       *wp_prefix;        /* WordPiece continuing_subword_prefix, owned ("##") */
    int         wp_max_chars;     /* WordPiece max_input_chars_per_word */
    int         max_piece_chars;  /* Unigram: the longest piece in characters */

    /* Built by bpe_finish. */
    struct bpe_table *by_piece;   /* piece string -> id */
    struct bpe_table *by_bytes;   /* byte string -> id, MAPPED non-added pieces only */
    struct bpe_table *by_pair;    /* (left id, right id) -> rank */
    int32_t     byte_id[256];     /* the id of the one-byte piece, -1 when absent */
    int32_t    *added_by_byte[2][256]; /* indices into added[] by the key's first byte, longest
                                     first, -1 ended: [0] the tokens matched on the raw text, [1]
                                     the `normalized` ones, matched after normalization (Hugging
                                     Face's two passes) */
    size_t      max_token_bytes;  /* for tokenizer_min_tokens; 0 when no bound is safe */
    char      **dec_piece;        /* (n_vocab) or NULL: the text the non-byte-level decoders take
                                     for an id instead of its piece (a `normalized` added token
                                     that is also a model piece: its key); NULL entries mostly */
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

/* Parses a tiktoken rank file text[0..n) ("BASE64 RANK" lines; tiktoken.c) into a byte-level
 * *out. pattern: an encoding's name (r50k, cl100k, o200k, llama3) or a PCRE2 regex; NULL takes
 * the config's "pat_str", else the encoding the number of ranks identifies (STATUS_UNSUPPORTED
 * when none does). config (a tokenizer_config.json text, may be NULL) gives the special tokens
 * (added_tokens_decoder; else the identified encoding's own) and bos/eos/pad. Errors as
 * bpe_load_json, naming the file and the line. */
enum status bpe_load_tiktoken(const char *text, size_t n, const char *name, const char *pattern, const char *config,
                              size_t config_n, struct bpe **out);

/* The model of one pre-token w[0..n) (valid UTF-8, normalized) for the kinds of their files:
 * ids appended to *ids as bpe_encode does. */
enum status wordpiece_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                  size_t *cap);
enum status unigram_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                size_t *cap);
/* WordLevel: the pre-token's id, else model.unk_token's; STATUS_INVALID_ARGUMENT naming the word
 * when neither is in the vocabulary (Hugging Face's MissingUnkToken). */
enum status wordlevel_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                  size_t *cap);
/* Added tokens (bpe_added.c), for bpe_finish: bpe_added_keys sets every added token's key (and
 * a `normalized` one's content and piece to it, or dec_piece for an id of the model's too; the
 * piece index is rebuilt if it exists); bpe_build_added the two tables of added_by_byte. */
enum status bpe_added_keys(struct bpe *b);
enum status bpe_build_added(struct bpe *b);
/* The first added token of added_by_byte[table] in s[from..n) (leftmost, then longest): its
 * index in b->added, and in *m_at / *m_end the span it takes with its lstrip / rstrip whitespace
 * (never before from); -1 when none. */
int bpe_find_added(const struct bpe *b, int table, const uint8_t *s, size_t n, size_t from, size_t *m_at,
                   size_t *m_end);
/* s[0..n) through b's normalizer (NFC or none for byte-level BPE) into *out (malloc'd, *n_out
 * bytes; NULL on error). */
enum status bpe_normalize(const struct bpe *b, const uint8_t *s, size_t n, uint8_t **out, size_t *n_out);
/* Normalizes the segment s[0..n) by b->norms into *out[0..*n_out), grown with base_grow. Invalid
 * UTF-8 becomes U+FFFD first. */
enum status normalizer_apply(const struct bpe *b, const uint8_t *s, size_t n, uint8_t **out, size_t *n_out, size_t *cap);
/* A leading Metaspace pre-tokenizer on a normalized piece s[0..n) (valid UTF-8): ' ' becomes
 * U+2581, and U+2581 is put first when b->metaspace_prepend says so (first: the piece begins the
 * text, Hugging Face's prepend_scheme "first") and the piece does not begin with it already. */
enum status metaspace_apply(const struct bpe *b, const uint8_t *s, size_t n, int first, uint8_t **out, size_t *n_out,
                            size_t *cap);
/* The Precompiled normalizer (charsmap.c): charsmap_check refuses a map m[0..n) whose header and
 * trie size do not fit (STATUS_BAD_FORMAT naming the file); charsmap_apply writes the
 * normalization of code points s[0..n) to *dst[0..*dn) (grown with base_grow), as Hugging Face does
 * (grapheme clusters first). */
enum status charsmap_check(const uint8_t *m, size_t n, const char *name);
enum status charsmap_apply(const uint8_t *m, size_t mn, const uint32_t *s, size_t n, uint32_t **dst, size_t *dn,
                           size_t *dcap);
/* Decodes standard base64 s[0..n) (padding optional) into out (room for 3n/4 + 3 bytes); -1 when
 * malformed, else the byte count (tiktoken.c). */
long bpe_base64_decode(const char *s, size_t n, uint8_t *out);

/* Appends an id with base_grow. */
enum status bpe_push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id);

/* The tokenizer.json tokenizer behind t, NULL for SentencePiece (tokenizer.cc; for token_bytes.c). */
struct tokenizer;
const struct bpe *tokenizer_bpe(const struct tokenizer *t);

/* UTF-8: one well-formed character at s[0..n) into *cp, its length (0 when invalid); Rust's
 * char::is_whitespace. */
size_t bpe_utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
int bpe_cp_is_space(uint32_t c);
/* The byte of a "<0xNN>" piece, -1 for any other piece. */
int bpe_byte_piece_value(const char *piece);

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

/* Appends the text of ids[0..n_ids) for the non-byte-level kinds, as Hugging Face's decode with
 * skip_special_tokens = !show_special: special ids vanish (shown: their content goes through the
 * decoders like any piece, as Hugging Face's does), the other ids' pieces (an added token's
 * content) go through b->decs. first == 0 decodes them as the continuation of a text already started (no
 * first-token rules, no Strip after Fuse): what the streaming detokenizer needs. Ids must be valid. */
enum status bpe_decode_pieces(const struct bpe *b, const int32_t *ids, int n_ids, int first, int show_special, char **out,
                              size_t *n, size_t *cap);

/* Appends to out[0..*n) (grown with base_grow) the text of ids[0..n_ids) as Hugging Face's
 * ByteLevel decoder writes it with skip_special_tokens = !show_special (the other kinds:
 * bpe_decode_pieces with first = 1): special ids vanish (shown: written as an added token's
 * content is), the bytes of the
 * other pieces are concatenated, an added token's content is written as it is, and each run of
 * bytes between added tokens is made valid UTF-8 by replacing every maximal invalid subpart
 * with U+FFFD (Rust's String::from_utf8_lossy). Ids must be valid. */
enum status bpe_decode(const struct bpe *b, const int32_t *ids, int n_ids, int show_special, char **out, size_t *n,
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
