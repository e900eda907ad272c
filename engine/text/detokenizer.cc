/* engine/text/detokenizer.cc - the incremental detokenizer (tokenizer.h's detokenizer_*): text
 * as ids arrive, holding back what is not final yet. SentencePiece: the pending ids decoded behind
 * an anchor piece once text exists (its leading-space rule), an incomplete UTF-8 character of byte
 * pieces held back; byte-level BPE: each piece's bytes, a trailing incomplete character held;
 * the other tokenizer.json kinds: byte-piece runs decoded whole. Every entry point catches
 * everything. Tests: tests/test_tokenizer.c, the stream_ok checks of tests/test_bpe.py. */
#include <string.h>

#include <new>
#include <string>

#include "tokenizer_impl.h"

namespace {

/* Bytes a UTF-8 sequence starting with lead byte b has; 0 if b cannot start one. Lenient
 * (overlong and out-of-range leads count): holding back too much only delays text. */
int utf8_lead_len(int b)
{
    if (b >= 0xC0 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF7) return 4;
    return 0;
}

/* Where the incomplete character at the end of ids[0..n) starts, n when there is none: the
 * trailing byte pieces end with a lead byte and fewer continuation bytes than it announces.
 * SentencePiece decodes a run of byte pieces one character (or one invalid byte) at a time and
 * a lead byte is never a continuation byte, so its decoding of the run reaches that lead byte
 * exactly: cutting there changes nothing in the text before it. */
int incomplete_tail_start(const struct tokenizer *t, const int32_t *ids, int n)
{
    int i = n - 1, n_cont = 0;
    while (i >= 0 && n_cont < 3 && (t->flags[ids[i]] & PIECE_BYTE) &&
           (t->byte_of[ids[i]] & 0xC0) == 0x80) {
        n_cont++;
        i--;
    }
    if (i < 0 || !(t->flags[ids[i]] & PIECE_BYTE)) return n;
    const int need = utf8_lead_len(t->byte_of[ids[i]]);
    return (need > 0 && n_cont + 1 < need) ? i : n;
}

enum status detok_set_out(struct detokenizer *d, const char *s, size_t n, const char **text,
                          size_t *len)
{
    if (base_grow((void **)&d->out, &d->cap_out, n + 1, 1))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    if (n) memcpy(d->out, s, n);
    d->out[n] = '\0';
    *text = d->out;
    *len = n;
    return STATUS_OK;
}

/* Decodes pending[0..k) in context (behind the anchor once text exists) into *s. */
enum status detok_decode_prefix(const struct detokenizer *d, int k, std::string *s)
{
    return tokenizer_decode_run(d->tok, d->pending, k, d->started != 0, s);
}

/* Turns pending[0..k) into text, drops those ids and returns the text. */
enum status detok_emit(struct detokenizer *d, int k, const char **text, size_t *len)
{
    std::string s;
    enum status st = detok_decode_prefix(d, k, &s);
    if (st != STATUS_OK) return st;
    if (!d->started && s.empty()) return detok_set_out(d, "", 0, text, len);
    st = detok_set_out(d, s.data(), s.size(), text, len);
    if (st != STATUS_OK) return st;
    memmove(d->pending, d->pending + k, (size_t)(d->n_pending - k) * sizeof *d->pending);
    d->n_pending -= k;
    if (!s.empty()) d->started = 1;
    return STATUS_OK;
}

/* The byte-level BPE detokenizer: the bytes of each piece are final except a trailing
 * incomplete character (at most 3 bytes, d->held). Special ids print nothing and do not
 * interrupt a character (decode skips them) unless shown; an added token's bytes, and a shown
 * special's, join the run as any piece's, as in bpe_decode. */
enum status bpe_detok_push(struct detokenizer *d, int32_t id, const char **text, size_t *len)
{
    const struct bpe *b = d->tok->bpe;
    const uint8_t f = b->flags[id];
    size_t n = 0;
    enum status st = STATUS_OK;
    if (base_grow((void **)&d->out, &d->cap_out, 1, 1))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    d->out[0] = '\0';
    if (!(f & BPE_PIECE_SPECIAL) || d->show_special) {
        std::string run((const char *)d->held, (size_t)d->n_held);
        run.append((const char *)b->bytes[id], b->n_bytes[id]);
        const size_t tail = bpe_utf8_incomplete_tail((const uint8_t *)run.data(), run.size());
        if ((st = bpe_utf8_lossy((const uint8_t *)run.data(), run.size() - tail, &d->out, &n, &d->cap_out))) return st;
        memcpy(d->held, run.data() + run.size() - tail, tail);
        d->n_held = (int)tail;
    }
    *text = d->out;
    *len = n;
    return STATUS_OK;
}

/* The detokenizer of the other tokenizer.json kinds (WordPiece, Unigram, character BPE): byte
 * pieces wait in d->pending until a piece that is not one ends their run (ByteFallback decodes a
 * run whole); then the run and that piece are decoded as the continuation of the text
 * (bpe_decode_pieces with first = 0) once any piece has been, as its start before. */
enum status other_detok_push(struct detokenizer *d, int32_t id, int flush, const char **text, size_t *len)
{
    const struct bpe *b = d->tok->bpe;
    size_t n = 0;
    if (base_grow((void **)&d->out, &d->cap_out, 1, 1)) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    d->out[0] = '\0';
    *text = d->out;
    *len = 0;
    if (!flush) {
        if ((b->flags[id] & BPE_PIECE_SPECIAL) && !d->show_special) return STATUS_OK;
        if (base_grow((void **)&d->pending, &d->cap_pending, (size_t)d->n_pending + 1, sizeof *d->pending))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
        d->pending[d->n_pending++] = id;
        if (tokenizer_is_byte(d->tok, id)) return STATUS_OK;
    }
    if (!d->n_pending) return STATUS_OK;
    enum status st = bpe_decode_pieces(b, d->pending, d->n_pending, !d->started, d->show_special, &d->out, &n, &d->cap_out);
    if (st != STATUS_OK) return st;
    d->started = 1;
    d->n_pending = 0;
    *text = d->out;
    *len = n;
    return STATUS_OK;
}

/* SentencePiece with control ids shown: a control (or unknown) id ends the pending run, which is
 * decoded whole (an incomplete character in it becomes U+FFFD, as tokenizer_decode_opts's
 * segment does), and adds its piece; the text after it continues behind the anchor. */
enum status sp_detok_push_shown(struct detokenizer *d, int32_t id, const char **text, size_t *len)
{
    std::string s;
    if (d->n_pending) {
        enum status st = detok_decode_prefix(d, d->n_pending, &s);
        if (st != STATUS_OK) return st;
    }
    s.append(piece_of(d->tok, id));
    d->n_pending = 0;
    d->started = 1;
    return detok_set_out(d, s.data(), s.size(), text, len);
}

}  // namespace

extern "C" {

void detokenizer_init(struct detokenizer *d, const struct tokenizer *t)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
}

void detokenizer_show_special(struct detokenizer *d, int show) { d->show_special = show != 0; }

void detokenizer_free(struct detokenizer *d)
{
    if (!d) return;
    free(d->pending);
    free(d->out);
    const struct tokenizer *t = d->tok;
    const int show = d->show_special;
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->show_special = show;
}

enum status detokenizer_push(struct detokenizer *d, int32_t id, const char **text, size_t *len)
{
    CHECK(d->tok != nullptr, "detokenizer_push before detokenizer_init");
    const struct tokenizer *t = d->tok;
    *text = "";
    *len = 0;
    if (!id_valid(t, id))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "detokenizer: id %d is outside the vocabulary [0, %d)", (int)id,
                             t->vocab_size);
    if (t->bpe) {
        try {
            if (t->bpe->model != BPE_MODEL_BYTE_LEVEL) return other_detok_push(d, id, 0, text, len);
            return bpe_detok_push(d, id, text, len);
        } catch (...) {
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
        }
    }
    if (d->show_special && (t->flags[id] & SP_SHOWN)) {
        try {
            return sp_detok_push_shown(d, id, text, len);
        } catch (...) {
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
        }
    }
    if (base_grow((void **)&d->pending, &d->cap_pending, (size_t)d->n_pending + 1, sizeof *d->pending))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    d->pending[d->n_pending++] = id;

    /* Control ids before any text leave SentencePiece's decoder in its initial state. */
    if (!d->started) {
        int all_control = 1;
        for (int i = 0; i < d->n_pending && all_control; i++)
            all_control = (t->flags[d->pending[i]] & PIECE_CONTROL) != 0;
        if (all_control) {
            d->n_pending = 0;
            return detok_set_out(d, "", 0, text, len);
        }
    }

    const int k = incomplete_tail_start(t, d->pending, d->n_pending);
    if (k == 0) return detok_set_out(d, "", 0, text, len);
    try {
        return detok_emit(d, k, text, len);
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    } catch (...) {
        return status_errorf(STATUS_INTERNAL, "detokenizer: exception while decoding");
    }
}

enum status detokenizer_flush(struct detokenizer *d, const char **text, size_t *len)
{
    CHECK(d->tok != nullptr, "detokenizer_flush before detokenizer_init");
    *text = "";
    *len = 0;
    if (d->tok->bpe && d->tok->bpe->model != BPE_MODEL_BYTE_LEVEL) return other_detok_push(d, 0, 1, text, len);
    if (d->tok->bpe) {
        /* Whatever is held back is an incomplete character: U+FFFD per maximal subpart. */
        size_t n = 0;
        enum status st = bpe_utf8_lossy(d->held, (size_t)d->n_held, &d->out, &n, &d->cap_out);
        d->n_held = 0;
        if (st != STATUS_OK) return st;
        *text = d->out;
        *len = n;
        return STATUS_OK;
    }
    if (d->n_pending == 0) return detok_set_out(d, "", 0, text, len);
    try {
        /* Before any text, pending ids decode to nothing (only control or stripped space
         * pieces): they stay, as they still shape how the text starts. */
        return detok_emit(d, d->n_pending, text, len);
    } catch (const std::bad_alloc &) {
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "detokenizer: out of memory");
    } catch (...) {
        return status_errorf(STATUS_INTERNAL, "detokenizer: exception while decoding");
    }
}

}  // extern "C"
