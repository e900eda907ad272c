/* tests/fuzz/fuzz_detokenize.c - tokenizer decode of arbitrary ids (engine/text/tokenizer.cc) with
 * the stories260K tokenizer (SKIP, exit 77, without the shared assets). The input is a list of
 * little-endian 16-bit ids (so ids past the 512-token vocabulary occur, and must be refused
 * by id, never read); each is pushed through the streaming detokenizer (detokenizer_push),
 * with a flush where an id has its top bit set. The contract of tokenizer.h is checked: the
 * pushes and flushes together equal tokenizer_decode of the same ids, byte for byte, when no
 * flush came before the end (a flush may cut a character).
 * Corpus: tests/fuzz/corpus/detokenize (tests/fuzz/make_seeds.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"
#include "fuzz_util.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    fuzz_tokenizer();
    return 0;
}

struct text {
    char  *p;
    size_t n, cap;
};

static void append(struct text *t, const char *s, size_t n)
{
    CHECK(base_grow((void **)&t->p, &t->cap, t->n + n + 1, 1) == 0, "out of memory");
    memcpy(t->p + t->n, s, n);
    t->n += n;
}

/* Pushes ids[0..n) (flushing after those marked in flush[]); returns 1 when a flush came
 * before the last id. The accepted ids are compacted into ids[0..*n_ok). */
static int stream(const struct tokenizer *tok, int32_t *ids, const uint8_t *flush, int n, int *n_ok, struct text *out)
{
    struct detokenizer d;
    const char *s;
    size_t len;
    int cut = 0;
    *n_ok = 0;
    detokenizer_init(&d, tok);
    for (int i = 0; i < n; i++) {
        if (detokenizer_push(&d, ids[i], &s, &len) != STATUS_OK) continue; /* refused, d unchanged */
        ids[(*n_ok)++] = ids[i];
        append(out, s, len);
        if (flush[i] && detokenizer_flush(&d, &s, &len) == STATUS_OK) {
            append(out, s, len);
            cut |= i + 1 < n;
        }
    }
    CHECK(detokenizer_flush(&d, &s, &len) == STATUS_OK, "flush: %s", status_message());
    append(out, s, len);
    detokenizer_free(&d);
    return cut;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct tokenizer *tok = fuzz_tokenizer();
    int n = (int)(size / 2), n_ok;
    if (n > 4096) return 0;
    int32_t *ids = malloc((size_t)n * sizeof *ids + 1);
    uint8_t *flush = malloc((size_t)n + 1);
    CHECK(ids && flush, "out of memory");
    for (int i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(data[2 * i] | data[2 * i + 1] << 8);
        flush[i] = v >> 15;
        ids[i] = (v & 0x7fff) == 0x7fff ? -1 : v & 0x7fff;
    }
    struct text got = {0};
    int cut = stream(tok, ids, flush, n, &n_ok, &got);
    char *want = NULL;
    size_t want_len = 0;
    CHECK(tokenizer_decode(tok, ids, n_ok, &want, &want_len) == STATUS_OK, "decode: %s", status_message());
    if (!cut && (want_len != got.n || (want_len && memcmp(want, got.p, want_len)))) {
        fprintf(stderr, "streamed text (%zu bytes) differs from tokenizer_decode (%zu bytes)\n", got.n, want_len);
        abort();
    }
    free(want);
    free(got.p);
    free(ids);
    free(flush);
    return 0;
}
