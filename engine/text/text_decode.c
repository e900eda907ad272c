/* engine/text/text_decode.c - UTF-8 helpers shared by the tokenizer.json kinds, and their decoders:
 * ByteLevel (bpe_decode), and for the other kinds (bpe_decode too, by b->model) the chain
 * Hugging Face writes as Replace("▁", " ") / Metaspace + ByteFallback + Fuse + Strip, and the
 * WordPiece decoder with its cleanup.
 * Not here: encoding (bpe.c and the model files), the streaming detokenizer (tokenizer.cc).
 * Tests: tests/test_bpe.py, tests/test_tokenizer_kinds.py. */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory"); }

/* ---- UTF-8 helpers ------------------------------------------------------------------------- */

/* Decodes one well-formed character at s[0..n) into *cp; returns its length, 0 when invalid. */
size_t bpe_utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (!n) return 0;
    const uint8_t c = s[0];
    if (c < 0x80) return *cp = c, 1;
    size_t len;
    uint32_t v, lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2, v = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3, v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4, v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    *cp = v;
    return len;
}

/* How many bytes of s[0..n) (n >= 1) form a valid prefix of some character: the length of the
 * "maximal subpart" (at least 1) that from_utf8_lossy replaces by one U+FFFD. */
static size_t utf8_maximal_subpart(const uint8_t *s, size_t n)
{
    const uint8_t c = s[0];
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else
        return 1;
    size_t k = 1;
    if (k < n && s[1] >= lo && s[1] <= hi) k++;
    else return 1;
    while (k < len && k < n && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

size_t bpe_utf8_incomplete_tail(const uint8_t *s, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        const uint8_t *p = s + n - back;
        if ((*p & 0xC0) == 0x80) continue;
        /* p is a lead (or ASCII): incomplete when its maximal subpart reaches the end but it
         * announces more bytes than are there. */
        size_t need = *p >= 0xF0 ? 4 : *p >= 0xE0 ? 3 : *p >= 0xC2 ? 2 : 1;
        if (*p > 0xF4 || need == 1) return 0;
        return utf8_maximal_subpart(p, back) == back && back < need ? back : 0;
    }
    return 0;
}

enum status bpe_utf8_lossy(const uint8_t *src, size_t n, char **out, size_t *len, size_t *cap)
{
    if (base_grow((void **)out, cap, *len + 3 * n + 1, 1))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "tokenizer: out of memory");
    char *o = *out + *len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = bpe_utf8_next(src + i, n - i, &cp);
        if (k) {
            memcpy(o, src + i, k);
            o += k, i += k;
        } else {
            i += utf8_maximal_subpart(src + i, n - i);
            memcpy(o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
    }
    *len = (size_t)(o - *out);
    (*out)[*len] = '\0';
    return STATUS_OK;
}

/* Rust's char::is_whitespace (Unicode White_Space), for lstrip/rstrip of added tokens. */
int bpe_cp_is_space(uint32_t c)
{
    return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}


/* ---- decoding ---------------------------------------------------------------------------- */

int bpe_byte_piece_value(const char *p)
{
    if (strncmp(p, "<0x", 3) || !p[3] || !p[4] || p[5] != '>' || p[6]) return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        const int c = p[i], d = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---- the decoder chain of the non-byte-level kinds ---------------------------------------- */

struct tok {
    char  *p; /* malloc'd, NUL-terminated */
    size_t n;
};

struct toks {
    struct tok *v;
    size_t      n, cap;
};

static int toks_push(struct toks *t, const char *p, size_t n)
{
    if (t->n == t->cap && base_grow((void **)&t->v, &t->cap, t->n + 1, sizeof *t->v)) return 0;
    char *c = malloc(n + 1);
    if (!c) return 0;
    memcpy(c, p, n);
    c[n] = '\0';
    t->v[t->n++] = (struct tok){c, n};
    return 1;
}

static void toks_free(struct toks *t)
{
    for (size_t i = 0; i < t->n; i++) free(t->v[i].p);
    free(t->v);
    t->v = NULL, t->n = t->cap = 0;
}

/* s[0..n) with every `from` replaced by `to` (prefix_only: once, at the start only). */
static int replace_into(struct toks *dst, const char *s, size_t n, const char *from, const char *to, const char *before)
{
    const size_t nf = strlen(from), nt = strlen(to), nb = before ? strlen(before) : 0;
    char *o = malloc(nb + (nf ? n / nf + 1 : 1) * (nt + 1) + n + 1);
    if (!o) return 0;
    size_t m = 0;
    if (nb) memcpy(o, before, nb), m = nb;
    for (size_t i = 0; i < n;)
        if (nf && i + nf <= n && !memcmp(s + i, from, nf)) memcpy(o + m, to, nt), m += nt, i += nf;
        else o[m++] = s[i++];
    const int ok = toks_push(dst, o, m);
    free(o);
    return ok;
}

/* Hugging Face's WordPiece cleanup, in its order. */
static int cleanup_into(struct toks *dst, struct tok *t)
{
    static const char *const rules[][2] = {{" .", "."},   {" ?", "?"},     {" !", "!"},           {" ,", ","},
                                           {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},         {" do not", " don't"},
                                           {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    struct toks a = {0};
    if (!toks_push(&a, t->p, t->n)) return 0;
    for (size_t r = 0; r < sizeof rules / sizeof rules[0]; r++) {
        struct toks x = {0};
        if (!replace_into(&x, a.v[0].p, a.v[0].n, rules[r][0], rules[r][1], NULL)) return toks_free(&a), 0;
        toks_free(&a);
        a = x;
    }
    const int ok = toks_push(dst, a.v[0].p, a.v[0].n);
    toks_free(&a);
    return ok;
}

static int step_apply(const struct bpe_dec *d, const struct toks *in, struct toks *o, int first, int fused)
{
    if (d->kind == BPE_DEC_FUSE) {
        size_t total = 0, m = 0;
        for (size_t i = 0; i < in->n; i++) total += in->v[i].n;
        char *s = malloc(total + 1);
        if (!s) return 0;
        for (size_t i = 0; i < in->n; i++) memcpy(s + m, in->v[i].p, in->v[i].n), m += in->v[i].n;
        const int ok = toks_push(o, s, m);
        free(s);
        return ok;
    }
    if (d->kind == BPE_DEC_BYTE_FALLBACK) {
        uint8_t *run = malloc(in->n + 1);
        size_t nr = 0;
        if (!run) return 0;
        for (size_t i = 0; i <= in->n; i++) {
            const int v = i < in->n ? bpe_byte_piece_value(in->v[i].p) : -1;
            if (v >= 0) {
                run[nr++] = (uint8_t)v;
                continue;
            }
            if (nr) {
                /* The whole run if it is valid UTF-8, else one U+FFFD per byte token. */
                size_t k = 0;
                uint32_t cp;
                for (size_t step; k < nr && (step = bpe_utf8_next(run + k, nr - k, &cp));) k += step;
                int ok = 1;
                if (k == nr) ok = toks_push(o, (const char *)run, nr);
                else
                    for (size_t j = 0; j < nr && ok; j++) ok = toks_push(o, "\xEF\xBF\xBD", 3);
                if (!ok) return free(run), 0;
                nr = 0;
            }
            if (i < in->n && !toks_push(o, in->v[i].p, in->v[i].n)) return free(run), 0;
        }
        free(run);
        return 1;
    }
    for (size_t i = 0; i < in->n; i++) {
        const struct tok *t = &in->v[i];
        const int is_first = first && i == 0;
        int ok = 1;
        switch (d->kind) {
        case BPE_DEC_REPLACE: ok = replace_into(o, t->p, t->n, d->text, d->with, NULL); break;
        case BPE_DEC_METASPACE:
            ok = replace_into(o, t->p, t->n, "\xE2\x96\x81", is_first && d->flag ? "" : " ", NULL);
            break;
        case BPE_DEC_STRIP: {
            const size_t nc = strlen(d->text);
            size_t a = 0, e = t->n;
            /* After Fuse the one token is the whole text: its start is the text's only when first. */
            for (int k = 0; nc && k < d->start && (!fused || first) && a + nc <= e && !memcmp(t->p + a, d->text, nc); k++) a += nc;
            for (int k = 0; nc && k < d->stop && e >= a + nc && !memcmp(t->p + e - nc, d->text, nc); k++) e -= nc;
            ok = toks_push(o, t->p + a, e - a);
            break;
        }
        case BPE_DEC_WORDPIECE: {
            const size_t np = strlen(d->text);
            struct toks x = {0};
            if (is_first) ok = toks_push(&x, t->p, t->n);
            else if (np && t->n >= np && !memcmp(t->p, d->text, np)) ok = replace_into(&x, t->p + np, t->n - np, "", "", NULL);
            else ok = replace_into(&x, t->p, t->n, "", "", " ");
            if (ok) ok = d->flag ? cleanup_into(o, &x.v[0]) : toks_push(o, x.v[0].p, x.v[0].n);
            toks_free(&x);
            break;
        }
        default: break;
        }
        if (!ok) return 0;
    }
    return 1;
}

enum status bpe_decode_pieces(const struct bpe *b, const int32_t *ids, int n_ids, int first, int show_special, char **out,
                              size_t *n, size_t *cap)
{
    struct toks t[2] = {{0}, {0}};
    int cur = 0, ok = 1, fused = 0;
    for (int i = 0; i < n_ids && ok; i++) {
        const char *p = b->dec_piece && b->dec_piece[ids[i]] ? b->dec_piece[ids[i]] : b->pieces[ids[i]];
        if (show_special || !(b->flags[ids[i]] & BPE_PIECE_SPECIAL)) ok = toks_push(&t[0], p, strlen(p));
    }
    for (int k = 0; k < b->n_decs && ok; k++) {
        toks_free(&t[!cur]);
        ok = step_apply(&b->decs[k], &t[cur], &t[!cur], first, fused);
        fused |= b->decs[k].kind == BPE_DEC_FUSE;
        cur = !cur;
    }
    size_t total = 0;
    for (size_t i = 0; i < t[cur].n; i++) total += t[cur].v[i].n + 1;
    if (ok && base_grow((void **)out, cap, *n + total + 1, 1)) ok = 0;
    for (size_t i = 0; i < t[cur].n && ok; i++) {
        /* Without a decoder Hugging Face joins the tokens with spaces. */
        if (!b->n_decs && (i > 0 || !first)) (*out)[(*n)++] = ' ';
        memcpy(*out + *n, t[cur].v[i].p, t[cur].v[i].n);
        *n += t[cur].v[i].n;
    }
    if (ok) (*out)[*n] = '\0';
    toks_free(&t[0]), toks_free(&t[1]);
    return ok ? STATUS_OK : oom();
}

enum status bpe_decode(const struct bpe *b, const int32_t *ids, int n_ids, int show_special, char **out, size_t *n,
                       size_t *cap)
{
    if (b->model != BPE_MODEL_BYTE_LEVEL) return bpe_decode_pieces(b, ids, n_ids, 1, show_special, out, n, cap);
    uint8_t *run = NULL;
    size_t n_run = 0, cap_run = 0;
    enum status st = STATUS_OK;
    if (base_grow((void **)out, cap, *n + 1, 1)) return oom();
    (*out)[*n] = '\0';
    for (int i = 0; i < n_ids && st == STATUS_OK; i++) {
        const int32_t id = ids[i];
        const uint8_t f = b->flags[id];
        /* An added token's bytes join the run too: Hugging Face's ByteLevel decoder maps its
         * content when every character is a byte's, and decodes the whole run at once. */
        if ((f & BPE_PIECE_SPECIAL) && !show_special) continue;
        if (base_grow((void **)&run, &cap_run, n_run + b->n_bytes[id], 1)) {
            st = oom();
            break;
        }
        if (b->n_bytes[id]) memcpy(run + n_run, b->bytes[id], b->n_bytes[id]);
        n_run += b->n_bytes[id];
    }
    if (st == STATUS_OK) st = bpe_utf8_lossy(run, n_run, out, n, cap);
    free(run);
    return st;
}
