/* engine/text/unigram.c - the Unigram model of a tokenizer.json (T5, ALBERT, XLNet): the split of a
 * pre-token into pieces of greatest total log-probability (Viterbi over character positions, every
 * piece that starts at a position looked up by hash up to the longest piece), ties to the shorter
 * piece; a character no piece starts with costs min_score - 10 and becomes unk, consecutive unks
 * fused into one, whose text becomes its <0xNN> pieces under byte_fallback (Hugging Face's
 * models/unigram, encode_optimized and tokenize).
 * Not here: Metaspace and the normalizers (normalizer.c), decoding (text_decode.c).
 * Tests: tests/test_tokenizer_kinds.py. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

struct node {
    double  score;  /* best total score of a path ending here */
    int32_t id;     /* the last piece of that path; -2: unreached */
    int32_t start;  /* byte offset where that piece starts */
};

/* The ids of one (possibly fused unknown) piece w[a..e). */
static enum status emit(const struct bpe *b, const uint8_t *w, size_t a, size_t e, int32_t id, int32_t **ids,
                        size_t *n_ids, size_t *cap)
{
    if (id < 0) return STATUS_OK; /* no unk piece: the characters vanish */
    if (id == b->model_unk_id && b->byte_fallback) {
        int all = 1;
        for (size_t i = a; i < e; i++) all &= b->byte_piece[w[i]] >= 0;
        for (size_t i = a; i < e && all; i++) {
            enum status st = bpe_push_id(ids, n_ids, cap, b->byte_piece[w[i]]);
            if (st) return st;
        }
        if (all) return STATUS_OK;
    }
    return bpe_push_id(ids, n_ids, cap, id);
}

enum status unigram_encode_word(const struct bpe *b, const uint8_t *w, size_t n, int32_t **ids, size_t *n_ids,
                                size_t *cap)
{
    if (!n) return STATUS_OK;
    struct node *nd = malloc((n + 1) * sizeof *nd);
    int32_t *path = malloc((n + 1) * sizeof *path);
    if (!nd || !path) {
        free(nd), free(path);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    }
    for (size_t i = 0; i <= n; i++) nd[i] = (struct node){0, -2, -1};
    nd[0].id = -1;
    const double unk_score = b->min_score - 10.0;
    for (size_t at = 0; at < n;) {
        uint32_t cp;
        size_t first = bpe_utf8_next(w + at, n - at, &cp);
        if (!first) first = 1;
        if (nd[at].id == -2) { /* unreachable: cannot happen, every character has a way on */
            at += first;
            continue;
        }
        int single = 0;
        size_t end = at;
        for (int chars = 0; chars < b->max_piece_chars && end < n; chars++) {
            size_t k = bpe_utf8_next(w + end, n - end, &cp);
            end += k ? k : 1;
            const int32_t id = bpe_piece_to_id(b, (const char *)w + at, end - at);
            if (id < 0 || isnan(b->scores[id])) continue; /* added tokens are not pieces of the model */
            const double s = nd[at].score + b->scores[id];
            if (nd[end].id == -2 || s > nd[end].score) nd[end] = (struct node){s, id, (int32_t)at};
            if (end - at == first) single = 1;
        }
        if (!single) {
            const double s = nd[at].score + unk_score;
            const size_t e = at + first;
            if (nd[e].id == -2 || s > nd[e].score) nd[e] = (struct node){s, b->model_unk_id, (int32_t)at};
        }
        at += first;
    }
    /* Back from the end; then forward, fusing runs of unk. */
    size_t np = 0;
    for (size_t e = n; e > 0; e = (size_t)nd[e].start) path[np++] = (int32_t)e;
    enum status st = STATUS_OK;
    for (size_t k = np; k-- > 0 && !st;) {
        size_t e = (size_t)path[k], a = (size_t)nd[e].start;
        const int32_t id = nd[e].id;
        if (id == b->model_unk_id)
            while (k > 0 && nd[path[k - 1]].id == b->model_unk_id) e = (size_t)path[--k];
        st = emit(b, w, a, e, id, ids, n_ids, cap);
    }
    free(nd), free(path);
    return st;
}
