/* tests/test_tokenizer.c - the tokenizer (engine/text/tokenizer.h) on real SentencePiece models:
 * the Llama 2 tokenizer against llama.cpp's test vectors, the stories260K tokenizer (byte
 * fallback), the incremental detokenizer against whole-sequence decoding, random bytes and
 * random ids, bad files, concurrent use from several threads, and the lower bound of
 * tokenizer_min_tokens.
 * Assets: $SHARDLM_ASSETS, else <this file's dir>/../../shared/assets; SKIP (exit 77) when
 * they are missing. Prints one line per check group and "N passed, M failed". */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tokenizer.h"

/* ---- check accounting ------------------------------------------------------------------ */

static int n_group_failures; /* failed checks in the current group */
static int n_passed, n_failed;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            n_group_failures++;                                                \
            if (n_group_failures <= 10) {                                      \
                fprintf(stderr, "  %s:%d: EXPECT(%s) failed: ", __FILE__,      \
                        __LINE__, #cond);                                      \
                fprintf(stderr, __VA_ARGS__);                                  \
                fputc('\n', stderr);                                           \
            }                                                                  \
        }                                                                      \
    } while (0)

static void group_end(const char *name, const char *detail)
{
    if (n_group_failures == 0) {
        printf("PASS %s%s%s\n", name, detail ? ": " : "", detail ? detail : "");
        n_passed++;
    } else {
        printf("FAIL %s (%d failed checks)%s%s\n", name, n_group_failures, detail ? ": " : "",
               detail ? detail : "");
        n_failed++;
    }
    fflush(stdout);
    n_group_failures = 0;
}

/* ---- helpers ----------------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (len == cap) {
            cap *= 2;
            buf = realloc(buf, cap + 1);
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        if (r == 0) break;
        len += r;
    }
    fclose(f);
    buf[len] = '\0';
    *n = len;
    return buf;
}

static int file_exists(const char *path) { return access(path, R_OK) == 0; }

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. */
static int utf8_valid(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) { i++; continue; }
        int len;
        unsigned cp, min;
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return 0;
        if (i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += (size_t)len;
    }
    return 1;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_next(void) /* xorshift64*, fixed seed: the test is reproducible */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static char *ids_to_string(const int32_t *ids, int n)
{
    size_t cap = (size_t)(n > 0 ? n : 0) * 12 + 1;
    char *s = malloc(cap), *p = s;
    CHECK(s, "out of memory");
    *p = '\0';
    for (int i = 0; i < n; i++) p += snprintf(p, cap - (size_t)(p - s), " %d", (int)ids[i]);
    return s;
}

/* Pushes ids one by one, then flushes. Checks that every returned chunk is valid UTF-8 and
 * that the concatenation equals tokenizer_decode of all ids. Returns 0 on mismatch. */
static int check_stream(const struct tokenizer *t, const int32_t *ids, int n, int want_valid,
                        const char *what)
{
    char *whole = NULL;
    size_t whole_len = 0;
    enum status s = tokenizer_decode(t, ids, n, &whole, &whole_len);
    EXPECT(s == STATUS_OK, "%s: decode: %s", what, status_message());
    if (s != STATUS_OK) return 0;

    struct detokenizer d;
    detokenizer_init(&d, t);
    size_t cap = whole_len + 64, len = 0;
    char *cat = malloc(cap);
    int ok = 1, max_pending = 0;
    for (int i = 0; i <= n; i++) {
        const char *text;
        size_t tl;
        s = i < n ? detokenizer_push(&d, ids[i], &text, &tl) : detokenizer_flush(&d, &text, &tl);
        EXPECT(s == STATUS_OK, "%s: push %d: %s", what, i, status_message());
        if (s != STATUS_OK) { ok = 0; break; }
        EXPECT(text[tl] == '\0', "%s: chunk %d not NUL-terminated", what, i);
        if (want_valid && !utf8_valid(text, tl)) {
            EXPECT(0, "%s: chunk %d is not valid UTF-8", what, i);
            ok = 0;
        }
        if (d.n_pending > max_pending) max_pending = d.n_pending;
        if (len + tl > cap) {
            cap = 2 * (len + tl);
            cat = realloc(cat, cap);
        }
        memcpy(cat + len, text, tl);
        len += tl;
    }
    if (ok && (len != whole_len || memcmp(cat, whole, len) != 0)) {
        char *idstr = ids_to_string(ids, n < 40 ? n : 40);
        EXPECT(0, "%s: streamed %zu bytes \"%.*s\" != decoded %zu bytes \"%s\" (ids%s%s)", what,
               len, (int)(len < 200 ? len : 200), cat, whole_len, whole, idstr,
               n > 40 ? " ..." : "");
        free(idstr);
        ok = 0;
    }
    detokenizer_free(&d);
    free(cat);
    free(whole);
    return ok;
}

/* ---- groups ------------------------------------------------------------------------------ */

static void test_load_errors(const char *llama_path)
{
    struct tokenizer *t = (struct tokenizer *)1;
    const char *missing = "/nonexistent-dir/shardlm-no-such.model";
    enum status s = tokenizer_load(missing, &t);
    EXPECT(s == STATUS_NOT_FOUND, "missing file: %s", status_name(s));
    EXPECT(t == NULL, "missing file: out not NULL");
    EXPECT(strstr(status_message(), missing) != NULL, "message does not name the path: %s",
           status_message());

    char garbage_path[] = "/tmp/shardlm_tok_garbageXXXXXX";
    int fd = mkstemp(garbage_path);
    EXPECT(fd >= 0, "mkstemp: %s", strerror(errno));
    if (fd >= 0) {
        const char junk[] = "this is not a sentencepiece model, just some text\n\xff\xfe\x00\x01";
        EXPECT(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk, "write");
        close(fd);
        s = tokenizer_load(garbage_path, &t);
        EXPECT(s == STATUS_BAD_FORMAT, "garbage file: %s (%s)", status_name(s), status_message());
        EXPECT(t == NULL, "garbage file: out not NULL");
        EXPECT(strstr(status_message(), garbage_path) != NULL, "message does not name the path");
        unlink(garbage_path);
    }

    s = tokenizer_load("/tmp", &t);
    EXPECT(s == STATUS_BAD_FORMAT && strstr(status_message(), "not a regular file (a directory)"),
           "directory: %s (%s)", status_name(s), status_message());
    /* A FIFO is refused at once, never waited on for a writer (base_open_file, issue 35). */
    char fifo[] = "/tmp/shardlm_tok_fifoXXXXXX";
    if (mkdtemp(fifo)) {
        char path[64];
        snprintf(path, sizeof path, "%s/tokenizer.model", fifo);
        EXPECT(mkfifo(path, 0600) == 0, "mkfifo: %s", strerror(errno));
        s = tokenizer_load(path, &t);
        EXPECT(s == STATUS_BAD_FORMAT && strstr(status_message(), "not a regular file (a FIFO)"), "FIFO: %s (%s)",
               status_name(s), status_message());
        unlink(path);
        rmdir(fifo);
    }

    s = tokenizer_load_from_memory("", 0, &t);
    EXPECT(s == STATUS_BAD_FORMAT, "empty proto: %s (%s)", status_name(s), status_message());
    EXPECT(t == NULL, "empty proto: out not NULL");

    size_t n;
    char *bytes = read_all(llama_path, &n);
    EXPECT(bytes != NULL, "read %s", llama_path);
    if (bytes) {
        const size_t cuts[] = {1, 7, n / 3, n / 2, n - 1};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            s = tokenizer_load_from_memory(bytes, cuts[i], &t);
            EXPECT(s == STATUS_BAD_FORMAT, "truncated to %zu bytes: %s", cuts[i], status_name(s));
            if (s == STATUS_OK) tokenizer_free(t);
        }
        s = tokenizer_load_from_memory(bytes, n, &t);
        EXPECT(s == STATUS_OK, "whole model from memory: %s", status_message());
        if (s == STATUS_OK) {
            EXPECT(tokenizer_vocab_size(t) == 32000, "vocab from memory");
            tokenizer_free(t);
        }
        free(bytes);
    }
    tokenizer_free(NULL);
    group_end("load errors", "missing -> NOT_FOUND, garbage/truncated/empty -> BAD_FORMAT, dir / FIFO -> BAD_FORMAT");
}

static void test_llama_vocab(const struct tokenizer *t)
{
    EXPECT(tokenizer_vocab_size(t) == 32000, "vocab %d", tokenizer_vocab_size(t));
    EXPECT(tokenizer_bos_id(t) == 1, "bos %d", tokenizer_bos_id(t));
    EXPECT(tokenizer_eos_id(t) == 2, "eos %d", tokenizer_eos_id(t));
    EXPECT(tokenizer_unk_id(t) == 0, "unk %d", tokenizer_unk_id(t));
    EXPECT(tokenizer_pad_id(t) == -1, "pad %d", tokenizer_pad_id(t));
    EXPECT(!strcmp(tokenizer_id_to_piece(t, 1), "<s>"), "piece 1");
    EXPECT(!strcmp(tokenizer_id_to_piece(t, 29871), "\xe2\x96\x81"), "piece 29871");
    EXPECT(!strcmp(tokenizer_id_to_piece(t, 15043), "\xe2\x96\x81Hello"), "piece 15043");
    EXPECT(!strcmp(tokenizer_id_to_piece(t, 3 + 0xE2), "<0xE2>"), "piece <0xE2>");
    EXPECT(tokenizer_id_to_piece(t, 32000) == NULL, "piece 32000");
    EXPECT(tokenizer_id_to_piece(t, -1) == NULL, "piece -1");
    EXPECT(tokenizer_piece_to_id(t, "\xe2\x96\x81Hello") == 15043, "id of Hello");
    EXPECT(tokenizer_piece_to_id(t, "<unk>") == 0, "id of <unk>");
    EXPECT(tokenizer_piece_to_id(t, "</s>") == 2, "id of </s>");
    EXPECT(tokenizer_piece_to_id(t, "no-such-piece-in-llama") == -1, "unknown piece");
    EXPECT(tokenizer_piece_to_id(t, NULL) == -1, "NULL piece");
    EXPECT(tokenizer_is_control(t, 1) && tokenizer_is_control(t, 2), "bos/eos control");
    EXPECT(!tokenizer_is_control(t, 0) && !tokenizer_is_control(t, 15043), "not control");
    int n_byte = 0;
    for (int id = 0; id < 32000; id++) n_byte += tokenizer_is_byte(t, id);
    EXPECT(n_byte == 256, "%d byte pieces", n_byte);
    EXPECT(tokenizer_is_byte(t, 3) && tokenizer_is_byte(t, 258) && !tokenizer_is_byte(t, 259),
           "byte range 3..258");
    EXPECT(!tokenizer_is_byte(t, -5) && !tokenizer_is_byte(t, 99999), "out of range not byte");
    for (int id = 0; id < 32000; id++) {
        const char *p = tokenizer_id_to_piece(t, id);
        if (id != 0 && tokenizer_piece_to_id(t, p) != id) {
            EXPECT(0, "piece_to_id(id_to_piece(%d)) = %d", id, tokenizer_piece_to_id(t, p));
            break;
        }
    }

    int32_t *ids;
    int n;
    enum status s = tokenizer_encode(t, "Hello world", 11, 1, &ids, &n);
    EXPECT(s == STATUS_OK && n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186,
           "encode with BOS");
    if (s == STATUS_OK) free(ids);
    s = tokenizer_encode(t, NULL, 0, 0, &ids, &n);
    EXPECT(s == STATUS_OK && n == 0 && ids != NULL, "encode empty");
    if (s == STATUS_OK) free(ids);
    group_end("llama2 vocabulary", "32000 pieces, bos 1, eos 2, unk 0, no pad, 256 byte pieces");
}

/* llama.cpp's format: every input is followed by "\n__ggml_vocab_test__\n" (so the last one
 * too, and an empty input is just the separator); one output line of ids per input. */
static void test_llama_vectors(const struct tokenizer *t, const char *inp_path,
                               const char *out_path)
{
    size_t inp_n, out_n;
    char *inp = read_all(inp_path, &inp_n), *out = read_all(out_path, &out_n);
    EXPECT(inp && out, "cannot read test vectors");
    if (!inp || !out) {
        free(inp);
        free(out);
        group_end("llama2 test vectors", NULL);
        return;
    }
    const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_n = sizeof sep - 1;
    int n_cases = 0, n_match = 0, n_roundtrip = 0;
    char *ip = inp, *op = out;
    for (;;) {
        char *end = NULL;
        /* memmem-free search: inputs contain no NUL, the file is NUL-terminated */
        end = strstr(ip, sep);
        if (!end) break;
        char *eol = strchr(op, '\n');
        EXPECT(eol != NULL, "fewer output lines than inputs (%d)", n_cases);
        if (!eol) break;
        *eol = '\0';
        int32_t want[512];
        int n_want = 0;
        for (char *q = op; *q;) {
            char *qe;
            long v = strtol(q, &qe, 10);
            if (qe == q) break;
            if (n_want < 512) want[n_want++] = (int32_t)v;
            q = qe;
        }
        const size_t len = (size_t)(end - ip);
        int32_t *ids;
        int n;
        enum status s = tokenizer_encode(t, ip, len, 0, &ids, &n);
        EXPECT(s == STATUS_OK, "case %d: %s", n_cases, status_message());
        if (s == STATUS_OK) {
            int same = n == n_want && !memcmp(ids, want, (size_t)n * sizeof *ids);
            if (same) {
                n_match++;
            } else {
                char *got = ids_to_string(ids, n);
                EXPECT(0, "case %d \"%.*s\": got%s, want %s", n_cases, (int)len, ip, got, op);
                free(got);
            }
            char *text;
            size_t tl;
            if (tokenizer_decode(t, ids, n, &text, &tl) == STATUS_OK) {
                if (tl == len && !memcmp(text, ip, len)) n_roundtrip++;
                else EXPECT(0, "case %d: decode \"%s\" != input \"%.*s\"", n_cases, text, (int)len, ip);
                free(text);
            }
            free(ids);
        }
        n_cases++;
        ip = end + sep_n;
        op = eol + 1;
    }
    EXPECT(*ip == '\0', "trailing input after the last separator");
    EXPECT(*op == '\0', "more output lines than inputs");
    EXPECT(n_cases == 46, "%d cases", n_cases);
    char detail[128];
    snprintf(detail, sizeof detail, "%d/%d encodings exact, %d/%d decode back to the input",
             n_match, n_cases, n_roundtrip, n_cases);
    free(inp);
    free(out);
    group_end("llama2 test vectors", detail);
}

static void test_stories(const struct tokenizer *t)
{
    EXPECT(tokenizer_vocab_size(t) == 512, "vocab %d", tokenizer_vocab_size(t));
    EXPECT(tokenizer_bos_id(t) == 1, "bos %d", tokenizer_bos_id(t));
    EXPECT(tokenizer_eos_id(t) == 2, "eos %d", tokenizer_eos_id(t));
    static const char *const sentences[] = {
        "Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the park.",
        "One day, she saw a big red ball. \"Can I play with it?\" she asked her mom.",
        "Tom and Sue were friends. They liked to share toys and snacks.",
        "Lily had 3 red balls and 12 blue balls.",
    };
    for (size_t i = 0; i < sizeof sentences / sizeof sentences[0]; i++) {
        const char *x = sentences[i];
        int32_t *ids;
        int n;
        enum status s = tokenizer_encode(t, x, strlen(x), 1, &ids, &n);
        EXPECT(s == STATUS_OK && n > 1 && ids[0] == 1, "encode \"%s\"", x);
        if (s != STATUS_OK) continue;
        int n_byte = 0;
        for (int k = 0; k < n; k++) n_byte += tokenizer_is_byte(t, ids[k]);
        EXPECT(n_byte == 0, "\"%s\": %d byte pieces in plain English", x, n_byte);
        EXPECT(n < (int)strlen(x), "\"%s\": %d tokens, no merging?", x, n);
        char *text;
        size_t tl;
        s = tokenizer_decode(t, ids, n, &text, &tl);
        EXPECT(s == STATUS_OK && tl == strlen(x) && !strcmp(text, x), "round trip \"%s\" -> \"%s\"",
               x, s == STATUS_OK ? text : "");
        if (s == STATUS_OK) free(text);
        free(ids);
    }

    /* Non-ASCII: the 512-piece vocabulary has "\xc3\xa9" (e with acute) as a piece but none of
     * the CJK characters or the emoji, which go through byte fallback, one piece per byte. */
    const char *x = "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82"; /* héllo 世界 🙂 */
    int32_t *ids;
    int n;
    enum status s = tokenizer_encode(t, x, strlen(x), 0, &ids, &n);
    EXPECT(s == STATUS_OK, "encode non-ASCII");
    if (s == STATUS_OK) {
        /* The byte pieces must spell out exactly the non-ASCII bytes, in order. */
        char bytes[64];
        int nb = 0;
        for (int k = 0; k < n; k++)
            if (tokenizer_is_byte(t, ids[k])) {
                const char *p = tokenizer_id_to_piece(t, ids[k]);
                EXPECT(strlen(p) == 6 && !strncmp(p, "<0x", 3), "byte piece %s", p);
                if (nb < 64) bytes[nb++] = (char)strtol(p + 3, NULL, 16);
            }
        const char want[] = "\xe4\xb8\x96\xe7\x95\x8c\xf0\x9f\x99\x82";
        EXPECT(nb == (int)sizeof want - 1 && !memcmp(bytes, want, sizeof want - 1),
               "%d byte pieces, want %zu", nb, sizeof want - 1);
        char *text;
        size_t tl;
        s = tokenizer_decode(t, ids, n, &text, &tl);
        EXPECT(s == STATUS_OK && !strcmp(text, x), "round trip non-ASCII -> \"%s\"",
               s == STATUS_OK ? text : "");
        if (s == STATUS_OK) free(text);
        free(ids);
    }
    group_end("stories260K tokenizer", "bos 1, eos 2, vocab 512, round trips, byte fallback");
}

static void test_stream_strings(const struct tokenizer *t, const char *name, int exact_round_trip)
{
    static const char *const texts[] = {
        "Hello world",
        " Hello world with a leading space",
        "  two leading spaces and trailing ones  ",
        "\n\nnewlines\tand\ttabs\n",
        "caf\xc3\xa9 na\xc3\xafve r\xc3\xa9sum\xc3\xa9 \xc3\x85ngstr\xc3\xb6m",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe6\x96\x87",
        "\xf0\x9f\x9a\x80 (normal) \xf0\x9f\x98\xb6\xe2\x80\x8d\xf0\x9f\x8c\xab\xef\xb8\x8f \xe2\x9c\x85 \xf0\x9f\xa6\x99\xf0\x9f\xa6\x99",
        "\xe1\x9e\x80\xe1\x9e\xb6\xe1\x9e\x93\xe1\x9f\x8b\xe1\x9e\x8f\xe1\x9f\x82\xe1\x9e\x96", /* Khmer */
        "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x99\x82",
        "\xd0\xbd\xd0\xb5\xd1\x89\xd0\xbe \xd0\xbd\xd0\xb0 \xd0\x91\xd1\x8a\xd0\xbb\xd0\xb3\xd0\xb0\xd1\x80\xd1\x81\xd0\xba\xd0\xb8",
        "C\xe1\xbb\xad\x61 Vi\xe1\xbb\x87t -- ''''``\"\"......!!!!",
        "",
        " ",
        "\xe2\x82\xac", /* a lone 3-byte character: <0xE2><0x82><0xAC> under byte fallback */
    };
    int n_ok = 0, n_total = 0;
    const int bos = tokenizer_bos_id(t), eos = tokenizer_eos_id(t);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        int32_t *ids;
        int n;
        enum status s = tokenizer_encode(t, texts[i], strlen(texts[i]), 0, &ids, &n);
        EXPECT(s == STATUS_OK, "encode");
        if (s != STATUS_OK) continue;
        /* As generated: plain, after a BOS, and with BOS ... EOS around. */
        int32_t *framed = malloc((size_t)(n + 2) * sizeof *framed);
        framed[0] = bos;
        memcpy(framed + 1, ids, (size_t)n * sizeof *ids);
        framed[n + 1] = eos;
        n_ok += check_stream(t, ids, n, 1, texts[i]);
        n_ok += check_stream(t, framed, n + 1, 1, texts[i]);
        n_ok += check_stream(t, framed, n + 2, 1, texts[i]);
        n_total += 3;
        /* With BOS and EOS around, the decoded text is still the input, where the model
         * keeps whitespace as it is (Llama; stories260K removes extra whitespace). */
        char *text;
        size_t tl;
        if (exact_round_trip && tokenizer_decode(t, framed, n + 2, &text, &tl) == STATUS_OK) {
            EXPECT(tl == strlen(texts[i]) && !memcmp(text, texts[i], tl),
                   "decode \"%s\" -> \"%s\"", texts[i], text);
            free(text);
        }
        free(framed);
        free(ids);
    }

    /* The first piece's leading space goes, as in tokenizer_decode; later ones stay. */
    int32_t hello = tokenizer_piece_to_id(t, "\xe2\x96\x81Hello"),
            world = tokenizer_piece_to_id(t, "\xe2\x96\x81world");
    if (hello >= 0 && world >= 0) {
        struct detokenizer d;
        detokenizer_init(&d, t);
        const char *txt;
        size_t tl;
        EXPECT(detokenizer_push(&d, bos, &txt, &tl) == STATUS_OK && tl == 0, "BOS prints nothing");
        EXPECT(detokenizer_push(&d, hello, &txt, &tl) == STATUS_OK && !strcmp(txt, "Hello"),
               "first piece: \"%s\"", txt);
        EXPECT(detokenizer_push(&d, world, &txt, &tl) == STATUS_OK && !strcmp(txt, " world"),
               "second piece: \"%s\"", txt);
        EXPECT(detokenizer_push(&d, eos, &txt, &tl) == STATUS_OK && tl == 0, "EOS prints nothing");
        EXPECT(detokenizer_flush(&d, &txt, &tl) == STATUS_OK && tl == 0, "nothing left");
        detokenizer_free(&d);
    }

    /* Held-back bytes: the euro sign as three byte pieces appears only when complete. */
    int32_t e2 = tokenizer_piece_to_id(t, "<0xE2>"), x82 = tokenizer_piece_to_id(t, "<0x82>"),
            xac = tokenizer_piece_to_id(t, "<0xAC>"), a = tokenizer_piece_to_id(t, "a");
    EXPECT(e2 >= 0 && x82 >= 0 && xac >= 0 && a >= 0, "byte pieces present");
    if (e2 >= 0 && x82 >= 0 && xac >= 0 && a >= 0) {
        struct detokenizer d;
        detokenizer_init(&d, t);
        const char *txt;
        size_t tl;
        EXPECT(detokenizer_push(&d, a, &txt, &tl) == STATUS_OK && !strcmp(txt, "a"), "a");
        EXPECT(detokenizer_push(&d, e2, &txt, &tl) == STATUS_OK && tl == 0, "E2 held: \"%s\"", txt);
        EXPECT(detokenizer_push(&d, x82, &txt, &tl) == STATUS_OK && tl == 0, "82 held: \"%s\"", txt);
        EXPECT(detokenizer_push(&d, xac, &txt, &tl) == STATUS_OK && !strcmp(txt, "\xe2\x82\xac"),
               "euro complete: \"%s\"", txt);
        /* An incomplete character at the end comes out of flush as U+FFFD per byte. */
        EXPECT(detokenizer_push(&d, e2, &txt, &tl) == STATUS_OK && tl == 0, "E2 held again");
        EXPECT(detokenizer_push(&d, x82, &txt, &tl) == STATUS_OK && tl == 0, "82 held again");
        EXPECT(detokenizer_flush(&d, &txt, &tl) == STATUS_OK &&
                   !strcmp(txt, "\xef\xbf\xbd\xef\xbf\xbd"),
               "flush gives two U+FFFD: \"%s\"", txt);
        /* An interrupted character becomes U+FFFD as soon as it is known to be broken. */
        EXPECT(detokenizer_push(&d, e2, &txt, &tl) == STATUS_OK && tl == 0, "E2 held");
        EXPECT(detokenizer_push(&d, a, &txt, &tl) == STATUS_OK && !strcmp(txt, "\xef\xbf\xbd" "a"),
               "broken E2 then a: \"%s\"", txt);
        EXPECT(detokenizer_push(&d, 32767 + tokenizer_vocab_size(t), &txt, &tl) ==
                   STATUS_INVALID_ARGUMENT,
               "push out of range");
        EXPECT(strstr(status_message(), "id ") != NULL, "message names the id: %s", status_message());
        EXPECT(detokenizer_push(&d, -1, &txt, &tl) == STATUS_INVALID_ARGUMENT, "push -1");
        EXPECT(detokenizer_flush(&d, &txt, &tl) == STATUS_OK && tl == 0, "empty flush");
        detokenizer_free(&d);
        detokenizer_free(NULL);
    }
    char detail[160];
    snprintf(detail, sizeof detail,
             "%d/%d streams (plain, after BOS, BOS..EOS) equal whole decode, valid UTF-8 at every "
             "step; bytes held until complete",
             n_ok, n_total);
    char group[80];
    snprintf(group, sizeof group, "%s detokenizer strings", name);
    group_end(group, detail);
}

/* Random id sequences, biased towards byte pieces, control ids and space pieces: the stream
 * must equal the whole decode even for broken UTF-8, and stay O(1) per token. */
static void test_stream_random(const struct tokenizer *t, const char *name)
{
    const int vocab = tokenizer_vocab_size(t);
    int32_t byte_ids[256];
    for (int b = 0; b < 256; b++) {
        char p[8];
        snprintf(p, sizeof p, "<0x%02X>", b);
        byte_ids[b] = tokenizer_piece_to_id(t, p);
    }
    const int32_t space = tokenizer_piece_to_id(t, "\xe2\x96\x81");
    int n_ok = 0, n_total = 0;
    int32_t ids[96];
    for (int iter = 0; iter < 1500; iter++) {
        const int n = (int)(rng_next() % 96);
        for (int i = 0; i < n; i++) {
            const uint32_t r = rng_next() % 100;
            if (r < 40) {
                /* A byte; often a well-formed character spread over pieces. */
                const uint32_t kind = rng_next() % 4;
                if (kind == 0 && i + 3 < n) {
                    ids[i++] = byte_ids[0xE0 + rng_next() % 16];
                    ids[i++] = byte_ids[0x80 + rng_next() % 64];
                    ids[i] = byte_ids[0x80 + rng_next() % 64];
                } else if (kind == 1 && i + 4 < n) {
                    ids[i++] = byte_ids[0xF0];
                    ids[i++] = byte_ids[0x90 + rng_next() % 48];
                    ids[i++] = byte_ids[0x80 + rng_next() % 64];
                    ids[i] = byte_ids[0x80 + rng_next() % 64];
                } else {
                    ids[i] = byte_ids[rng_next() % 256];
                }
            } else if (r < 50) {
                ids[i] = (int32_t)(rng_next() % 3); /* unk, bos, eos */
            } else if (r < 60 && space >= 0) {
                ids[i] = space;
            } else {
                ids[i] = (int32_t)(rng_next() % (uint32_t)vocab);
            }
        }
        n_ok += check_stream(t, ids, n, 1, "random ids");
        n_total++;
    }

    /* A long generation keeps the pending window small. */
    struct detokenizer d;
    detokenizer_init(&d, t);
    int max_pending = 0, bad = 0;
    for (int i = 0; i < 20000; i++) {
        int32_t id = (int32_t)(rng_next() % (uint32_t)vocab);
        const char *txt;
        size_t tl;
        if (detokenizer_push(&d, id, &txt, &tl) != STATUS_OK) bad++;
        if (i > 100 && d.n_pending > max_pending) max_pending = d.n_pending;
    }
    detokenizer_free(&d);
    EXPECT(bad == 0, "%d pushes failed", bad);
    EXPECT(max_pending <= 8, "pending window grew to %d ids", max_pending);

    char detail[160];
    snprintf(detail, sizeof detail,
             "%d/%d random id sequences stream == decode; pending window <= %d ids over 20000 "
             "pushes",
             n_ok, n_total, max_pending);
    char group[80];
    snprintf(group, sizeof group, "%s detokenizer random ids", name);
    group_end(group, detail);
}

static void test_robustness(const struct tokenizer *t, const char *name)
{
    const int vocab = tokenizer_vocab_size(t);
    unsigned char buf[256];
    int n_enc = 0;
    for (int iter = 0; iter < 2000; iter++) {
        const size_t len = rng_next() % sizeof buf;
        const uint32_t mode = rng_next() % 4;
        for (size_t i = 0; i < len; i++) {
            uint32_t r = rng_next();
            if (mode == 0) buf[i] = (unsigned char)r;                        /* any byte */
            else if (mode == 1) buf[i] = (unsigned char)(0x80 + r % 0x80);  /* high bytes */
            else if (mode == 2) buf[i] = (r % 5 == 0) ? 0 : (r % 7 == 0) ? 0xFF : (unsigned char)(' ' + r % 95);
            else buf[i] = (unsigned char)"a \xc3\xa9\xe2\x82\xac\xf0\x9f\x99\x82\xff\x00\n"[r % 14];
        }
        int32_t *ids;
        int n;
        enum status s = tokenizer_encode(t, (const char *)buf, len, iter & 1, &ids, &n);
        EXPECT(s == STATUS_OK, "encode random %zu bytes: %s", len, status_message());
        if (s != STATUS_OK) continue;
        int in_range = 1;
        for (int i = 0; i < n; i++) in_range &= ids[i] >= 0 && ids[i] < vocab;
        EXPECT(in_range, "ids out of range");
        char *text;
        size_t tl;
        s = tokenizer_decode(t, ids, n, &text, &tl);
        EXPECT(s == STATUS_OK, "decode: %s", status_message());
        if (s == STATUS_OK) {
            EXPECT(utf8_valid(text, tl), "decode of random bytes is not valid UTF-8");
            free(text);
        }
        if (in_range && iter % 4 == 0) check_stream(t, ids, n, 1, "random bytes");
        free(ids);
        n_enc++;
    }

    const int32_t bad_ids[][3] = {{5, vocab, 7}, {-1, 5, 6}, {5, 6, INT32_MAX}, {INT32_MIN, 0, 0}};
    for (size_t i = 0; i < sizeof bad_ids / sizeof bad_ids[0]; i++) {
        char *text = (char *)1;
        size_t tl = 99;
        enum status s = tokenizer_decode(t, bad_ids[i], 3, &text, &tl);
        EXPECT(s == STATUS_INVALID_ARGUMENT, "decode bad ids %zu: %s", i, status_name(s));
        EXPECT(text == NULL && tl == 0, "outputs cleared on error");
        char want[32];
        for (int k = 0; k < 3; k++)
            if (bad_ids[i][k] < 0 || bad_ids[i][k] >= vocab) {
                snprintf(want, sizeof want, "id %d", (int)bad_ids[i][k]);
                EXPECT(strstr(status_message(), want) != NULL, "message \"%s\" lacks \"%s\"",
                       status_message(), want);
                break;
            }
    }
    char *text;
    size_t tl;
    EXPECT(tokenizer_decode(t, NULL, 0, &text, &tl) == STATUS_OK && tl == 0 && text && !*text,
           "decode of nothing");
    free(text);
    EXPECT(tokenizer_decode(t, bad_ids[0], -1, &text, &tl) == STATUS_INVALID_ARGUMENT, "n < 0");

    char detail[128];
    snprintf(detail, sizeof detail,
             "%d random byte strings (invalid UTF-8, NULs, 0xFF) encode+decode; bad ids rejected",
             n_enc);
    char group[80];
    snprintf(group, sizeof group, "%s robustness", name);
    group_end(group, detail);
}

struct thread_arg {
    const struct tokenizer *t;
    int seed, failures;
};

static void *thread_main(void *p)
{
    struct thread_arg *a = p;
    static const char *const texts[] = {
        "Hello, y'all! How are you \xf0\x9f\x98\x81 ?",
        "Once upon a time, there was a little girl named Lily.",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",
    };
    for (int i = 0; i < 300; i++) {
        const char *x = texts[(i + a->seed) % 3];
        int32_t *ids;
        int n;
        if (tokenizer_encode(a->t, x, strlen(x), 1, &ids, &n) != STATUS_OK) {
            a->failures++;
            continue;
        }
        char *text;
        size_t tl;
        if (tokenizer_decode(a->t, ids, n, &text, &tl) != STATUS_OK) a->failures++;
        else {
            if (strcmp(text, x)) a->failures++;
            free(text);
        }
        struct detokenizer d;
        detokenizer_init(&d, a->t);
        size_t total = 0;
        for (int k = 0; k <= n; k++) {
            const char *c;
            size_t cl;
            enum status s = k < n ? detokenizer_push(&d, ids[k], &c, &cl) : detokenizer_flush(&d, &c, &cl);
            if (s != STATUS_OK) a->failures++;
            else total += cl;
        }
        if (total != strlen(x)) a->failures++;
        detokenizer_free(&d);
        free(ids);
    }
    return NULL;
}

static void test_threads(const struct tokenizer *t)
{
    pthread_t th[4];
    struct thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thread_arg){t, i, 0};
        EXPECT(pthread_create(&th[i], NULL, thread_main, &args[i]) == 0, "pthread_create");
    }
    int failures = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        failures += args[i].failures;
    }
    EXPECT(failures == 0, "%d failures across threads", failures);
    group_end("concurrent use", "4 threads encode/decode/stream one shared tokenizer");
}

/* ---- main -------------------------------------------------------------------------------- */

/* The bound checks lean on: tokenizer_min_tokens never exceeds what encoding gives, on texts
 * made to be hard (runs of spaces, the longest pieces back to back, random bytes), for one text
 * and for texts encoded apart; and it refuses a 1 MiB prompt for a small context. */
static int encoded(const struct tokenizer *t, const char *s, size_t n)
{
    int32_t *ids = NULL;
    int k = 0;
    if (tokenizer_encode(t, s, n, 0, &ids, &k) != STATUS_OK) k = -1;
    free(ids);
    return k;
}

static void test_min_tokens(const struct tokenizer *t, const char *name)
{
    static char buf[1 << 16];
    const char *fixed[] = {"Once upon a time", "a", "", "     ", "Once        upon\t\t\n\n  a time  ",
                           "h\xc3\xa9llo w\xc3\xb6rld \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80", "\n\n\n\n"};
    int checked = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        size_t n = strlen(fixed[i]);
        size_t b = tokenizer_min_tokens(t, &fixed[i], &n, 1);
        EXPECT(b <= (size_t)encoded(t, fixed[i], n), "%s: bound %zu > %d ids for \"%s\"", name, b,
               encoded(t, fixed[i], n), fixed[i]);
        checked++;
    }
    /* The longest pieces back to back (U+2581 as a space): the bound's worst case. */
    size_t len = 0;
    for (int id = 0; id < tokenizer_vocab_size(t) && len < sizeof buf - 64; id++) {
        const char *p = tokenizer_id_to_piece(t, id);
        if (tokenizer_is_control(t, id) || tokenizer_is_byte(t, id) || strlen(p) < 6) continue;
        for (const char *c = p; *c && len < sizeof buf - 8; c++)
            if (!strncmp(c, "\xe2\x96\x81", 3)) buf[len++] = ' ', c += 2;
            else buf[len++] = *c;
    }
    const char *whole = buf;
    size_t b = tokenizer_min_tokens(t, &whole, &len, 1);
    int k = encoded(t, buf, len);
    EXPECT(b > 0 && b <= (size_t)k, "%s: long pieces: bound %zu, %d ids", name, b, k);
    /* Two texts encoded apart, or as one: the bound of both holds for either. */
    const char *two[] = {buf, buf + len / 2};
    size_t lens[] = {len / 2, len - len / 2};
    b = tokenizer_min_tokens(t, two, lens, 2);
    EXPECT(b <= (size_t)(encoded(t, two[0], lens[0]) + encoded(t, two[1], lens[1])) && b <= (size_t)k,
           "%s: two texts: bound %zu", name, b);
    /* Random bytes (NUL, invalid UTF-8, spaces) and random runs of the fixed texts. */
    for (int iter = 0; iter < 300; iter++, checked++) {
        size_t n = rng_next() % 512, mode = rng_next() % 3;
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rng_next();
            buf[i] = mode == 0   ? (char)r
                     : mode == 1 ? " \t\na\xc3\xa9"[r % 6]
                                 : fixed[r % 2][r % strlen(fixed[r % 2])];
        }
        const char *s = buf;
        b = tokenizer_min_tokens(t, &s, &n, 1);
        EXPECT(b <= (size_t)encoded(t, buf, n), "%s: random (mode %zu): bound %zu > %d ids", name, mode, b,
               encoded(t, buf, n));
    }
    /* 1 MiB of a story: far more than a 4096-token context, without encoding it. */
    size_t big = 1 << 20;
    char *huge = malloc(big);
    for (size_t i = 0; huge && i < big; i++) huge[i] = "Once upon a time "[i % 17];
    const char *h = huge;
    b = huge ? tokenizer_min_tokens(t, &h, &big, 1) : 0;
    EXPECT(b > 4096, "%s: 1 MiB bounds to %zu ids", name, b);
    free(huge);
    char detail[96];
    snprintf(detail, sizeof detail, "%d texts; 1 MiB of a story >= %zu ids", checked, b);
    group_end(name, detail);
}

int main(void)
{
    char assets[4096];
    const char *env = getenv("SHARDLM_ASSETS");
    if (env && *env) {
        snprintf(assets, sizeof assets, "%s", env);
    } else {
        /* <dir of this file>/../../shared/assets: tests/ -> project root -> its parent. */
        const char *file = __FILE__;
        const char *slash = strrchr(file, '/');
        if (slash) snprintf(assets, sizeof assets, "%.*s/../../shared/assets", (int)(slash - file), file);
        else snprintf(assets, sizeof assets, "../../shared/assets");
    }
    char llama[4200], inp[4200], out[4200], stories[4200];
    snprintf(llama, sizeof llama, "%s/llama2-tokenizer/tokenizer.model", assets);
    snprintf(inp, sizeof inp, "%s/llama2-tokenizer/test-vectors.inp", assets);
    snprintf(out, sizeof out, "%s/llama2-tokenizer/test-vectors.out", assets);
    snprintf(stories, sizeof stories, "%s/stories260K/tok512.model", assets);
    const char *needed[] = {llama, inp, out, stories};
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++)
        if (!file_exists(needed[i])) {
            printf("SKIP: asset %s not found (set SHARDLM_ASSETS)\n", needed[i]);
            return 77;
        }

    struct tokenizer *lt = NULL, *st = NULL;
    if (tokenizer_load(llama, &lt) != STATUS_OK || tokenizer_load(stories, &st) != STATUS_OK) {
        printf("FAIL load: %s\n", status_message());
        printf("0 passed, 1 failed\n");
        tokenizer_free(lt);
        return 1;
    }

    test_load_errors(llama);
    test_llama_vocab(lt);
    test_llama_vectors(lt, inp, out);
    test_stories(st);
    test_stream_strings(lt, "llama2", 1);
    test_stream_strings(st, "stories260K", 0);
    test_stream_random(lt, "llama2");
    test_stream_random(st, "stories260K");
    test_robustness(lt, "llama2");
    test_robustness(st, "stories260K");
    test_threads(lt);
    test_min_tokens(lt, "min_tokens llama2");
    test_min_tokens(st, "min_tokens stories260K");

    tokenizer_free(lt);
    tokenizer_free(st);
    printf("%d passed, %d failed\n", n_passed, n_failed);
    return n_failed ? 1 : 0;
}
