/* engine/text/token_bytes.c - the exact bytes a token contributes in the middle of a sequence,
 * for constrained decoding (engine/grammar/): SentencePiece pieces with U+2581 as a space and
 * <0xNN> byte pieces, byte-level BPE pieces through the GPT-2 byte map. Not here: decoding
 * whole sequences (tokenizer.cc). Tests: tests/test_grammar.c (every token of SmolLM2's and
 * Gemma's vocabularies against tokenizer_decode). */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "tokenizer.h"

int tokenizer_token_bytes(const struct tokenizer *t, int32_t id, char *buf, int cap)
{
    const char *piece = tokenizer_id_to_piece(t, id);
    if (!piece || tokenizer_is_control(t, id) || id == tokenizer_unk_id(t)) return 0;
    int n = 0;
    if (tokenizer_is_byte(t, id)) { /* "<0xNN>" */
        unsigned v = 0;
        for (const char *p = piece + 3; *p && *p != '>'; p++)
            v = v * 16 + (unsigned)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
        if (cap < 1) return -1;
        buf[0] = (char)v;
        return 1;
    }
    const struct bpe *b = tokenizer_bpe(t);
    if (b && b->model != BPE_MODEL_BYTE_LEVEL) { /* the piece's text in the middle of a sequence */
        char *text = NULL;
        size_t len = 0, text_cap = 0;
        if (bpe_decode_pieces(b, &id, 1, 0, 0, &text, &len, &text_cap) != STATUS_OK) return free(text), -1;
        const int fits = len <= (size_t)cap;
        if (fits) memcpy(buf, text, len);
        free(text);
        return fits ? (int)len : -1;
    }
    if (b) { /* byte-level BPE: what bpe_decode puts in the run */
        if (b->n_bytes[id] > (uint32_t)cap) return -1;
        if (b->n_bytes[id]) memcpy(buf, b->bytes[id], b->n_bytes[id]);
        return (int)b->n_bytes[id];
    }
    for (const char *p = piece; *p;) { /* SentencePiece: U+2581 is a space */
        if (!strncmp(p, "\xE2\x96\x81", 3)) {
            if (n >= cap) return -1;
            buf[n++] = ' ';
            p += 3;
        } else {
            if (n >= cap) return -1;
            buf[n++] = *p++;
        }
    }
    return n;
}
