/* engine/text/tokenizer_impl.h - private to tokenizer.cc and detokenizer.cc: struct tokenizer
 * (the SentencePiece processor or a tokenizer.json kind, the per-id flags, the detokenizer's
 * anchor) and the helpers both files use. C++ only. */
#ifndef SHARDLM_TOKENIZER_IMPL_H
#define SHARDLM_TOKENIZER_IMPL_H

#include <stdint.h>

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>

#include "bpe.h"
#include "spm.h"
#include "tokenizer.h"

/* Per-id flags, cached at load so that the hot paths never call into SentencePiece. */
enum : uint8_t {
    PIECE_CONTROL = 1,
    PIECE_BYTE = 2,
    PIECE_UNKNOWN = 4,
    PIECE_UNUSED = 8,
};
/* SentencePiece ids that show their piece when special tokens are shown: what Hugging Face's
 * tokenizer.json of the model marks special (LlamaConverter: the control and unknown pieces). */
enum : uint8_t { SP_SHOWN = PIECE_CONTROL | PIECE_UNKNOWN };

struct tokenizer {
    /* The kind: byte-level BPE when bpe is set (then only vocab_size, the special ids and
     * max_token_bytes below are used), SentencePiece otherwise. */
    struct bpe *bpe = nullptr;
    /* A SentencePiece BPE model: spm.c's, unless SHARDLM_SENTENCEPIECE=lib or the model is one
     * spm.c does not take (then sp, libsentencepiece's processor, holds it). */
    struct spm *spm = nullptr;
    ~tokenizer()
    {
        bpe_free(bpe);
        spm_free(spm);
    }
    sentencepiece::SentencePieceProcessor sp;
    int vocab_size = 0;
    int bos_id = -1, eos_id = -1, pad_id = -1, unk_id = -1;
    std::vector<uint8_t>     flags;   /* (vocab_size) PIECE_* bits */
    std::vector<int16_t>     byte_of; /* (vocab_size) the byte of a byte piece, else -1 */
    /* A piece that decodes to the same non-empty text wherever it stands. The detokenizer puts
     * it in front of the ids it decodes once some text exists, so that SentencePiece does not
     * treat their first piece as the start of the text (and strip its leading space). */
    int32_t     anchor_id = -1;
    std::string anchor_text;
    /* The most input bytes one id can cover, for tokenizer_min_tokens; 0 when unbounded. */
    size_t max_token_bytes = 0;
    /* SentencePiece: the control and unknown pieces' strings (views: piece_of), which encode
     * turns into their ids as Hugging Face does; their distinct lengths, longest first, and
     * which bytes start one. */
    std::unordered_map<std::string_view, int32_t> special_ids;
    std::vector<size_t> special_lens;
    bool special_first[256] = {};
};

inline bool id_valid(const struct tokenizer *t, int32_t id) { return id >= 0 && id < t->vocab_size; }

/* Piece id's text (a SentencePiece kind; id valid): a view into spm's arena or sp's own strings,
 * both NUL-terminated and kept for the tokenizer's lifetime (no table of views: 4 MB for Gemma). */
inline std::string_view piece_of(const struct tokenizer *t, int32_t id)
{
    if (t->spm) {
        size_t n;
        const char *p = spm_piece(t->spm, id, &n);
        return std::string_view(p, n);
    }
    return t->sp.IdToPiece(id);
}

/* SentencePiece's decoding of ids into *out (tokenizer.cc); STATUS_INTERNAL with its message. */
enum status tokenizer_decode_ids(const struct tokenizer *t, const std::vector<int> &ids, std::string *out);
/* The same of ids[0..n), behind the anchor piece when behind_anchor (the continuation of a text
 * already started: the first piece keeps its leading space); STATUS_UNSUPPORTED without an anchor. */
enum status tokenizer_decode_run(const struct tokenizer *t, const int32_t *ids, int n, bool behind_anchor,
                                std::string *out);

#endif
