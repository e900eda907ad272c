/* tests/test_bpe_tool.c - a command-line driver of engine/text/tokenizer.h for tests/test_bpe.py:
 *   test_bpe_tool load PATH              loads PATH (tokenizer.json, tokenizer.model, a .gguf or a
 *                                        model directory); prints "OK vocab=N bos=B eos=E special=S
 *                                        kind=K" (tokenizer_kind) or
 *                                        "ERROR <message>" and exits 1
 *   test_bpe_tool encode PATH CORPUS     CORPUS holds texts as "<length>\n<bytes>\n"; prints one
 *                                        JSON line per text: ids, the decode (hex) and whether the
 *                                        streaming detokenizer gave the same bytes, each also with
 *                                        special tokens shown (decode_special, stream_special_ok)
 *   test_bpe_tool encode_special PATH CORPUS   the same with add_bos = 1 (the post-processor's tokens)
 *   test_bpe_tool decode PATH IDS        IDS holds one id sequence per line; prints the decode (hex)
 *                                        and the streaming check per line
 *   test_bpe_tool json FILE.gguf         prints the tokenizer text a GGUF vocabulary becomes
 *                                        (gguf_tokenizer_model_proto: a tokenizer.json for gpt2 and
 *                                        bert vocabularies) and exits 0, or "ERROR <message>"
 *   test_bpe_tool bench PATH CORPUS REPS encodes the corpus REPS times on one thread; prints
 *                                        bytes, tokens and seconds (a figure, never a verdict)
 * Not a test by itself: test_bpe.py compares its output with Hugging Face tokenizers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "gguf.h"
#include "gguf_tokenizer.h"
#include "tokenizer.h"

static enum status load(const char *path, struct tokenizer **t)
{
    struct stat sb;
    const size_t n = strlen(path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return tokenizer_load_for_model(path, NULL, 0, 1 << 30, t);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) {
        struct gguf *g = NULL;
        void *data = NULL;
        size_t len = 0;
        enum status s = gguf_open(path, &g);
        if (s == STATUS_OK) s = gguf_tokenizer_model_proto(g, &data, &len);
        if (s == STATUS_OK) s = tokenizer_load_from_memory(data, len, t);
        free(data);
        gguf_close(g);
        return s;
    }
    return tokenizer_load(path, t);
}

struct text {
    char  *p;
    size_t n;
};

static int read_corpus(const char *path, struct text **out, int *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int n = 0, cap = 0;
    struct text *v = NULL;
    size_t len;
    while (fscanf(f, "%zu", &len) == 1) {
        if (fgetc(f) != '\n') break;
        if (n == cap) v = realloc(v, (size_t)(cap = cap ? 2 * cap : 64) * sizeof *v);
        v[n].p = malloc(len + 1);
        v[n].n = len;
        if (fread(v[n].p, 1, len, f) != len) {
            free(v[n].p);
            break;
        }
        fgetc(f);
        n++;
    }
    fclose(f);
    *out = v;
    *n_out = n;
    return 1;
}

static void free_corpus(struct text *v, int n)
{
    for (int i = 0; i < n; i++) free(v[i].p);
    free(v);
}

/* Prints "decode": hex, "stream_ok": bool and the same with special tokens shown,
 * "decode_special", "stream_special_ok" (no braces); 0 when decoding failed. */
static int print_decode(const struct tokenizer *t, const int32_t *ids, int n)
{
    for (int show = 0; show <= 1; show++) {
        char *dec;
        size_t dn;
        if (tokenizer_decode_opts(t, ids, n, show, &dec, &dn) != STATUS_OK) {
            printf("%s\"error\": \"decode failed\"}\n", show ? ", " : "");
            return 0;
        }
        struct detokenizer d;
        detokenizer_init(&d, t);
        detokenizer_show_special(&d, show);
        char *streamed = malloc(dn + 64);
        size_t sn = 0;
        int stream_ok = 1;
        for (int k = 0; k <= n && stream_ok; k++) {
            const char *piece;
            size_t pn;
            enum status s = k < n ? detokenizer_push(&d, ids[k], &piece, &pn) : detokenizer_flush(&d, &piece, &pn);
            if (s != STATUS_OK || sn + pn > dn) stream_ok = 0;
            else memcpy(streamed + sn, piece, pn), sn += pn;
        }
        stream_ok = stream_ok && sn == dn && !memcmp(streamed, dec, dn);
        detokenizer_free(&d);
        printf("%s\"decode%s\": \"", show ? ", " : "", show ? "_special" : "");
        for (size_t k = 0; k < dn; k++) printf("%02x", (unsigned char)dec[k]);
        printf("\", \"stream%s_ok\": %s", show ? "_special" : "", stream_ok ? "true" : "false");
        free(streamed), free(dec);
    }
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s load|encode|encode_special|decode|json|bench PATH [CORPUS [REPS]]\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "json")) {
        struct gguf *g = NULL;
        void *data = NULL;
        size_t len = 0;
        enum status s = gguf_open(argv[2], &g);
        if (s == STATUS_OK) s = gguf_tokenizer_model_proto(g, &data, &len);
        if (s == STATUS_OK) fwrite(data, 1, len, stdout);
        else printf("ERROR %s\n", status_message());
        free(data);
        gguf_close(g);
        return s == STATUS_OK ? 0 : 1;
    }
    struct tokenizer *t = NULL;
    enum status s = load(argv[2], &t);
    if (s != STATUS_OK) {
        printf("ERROR %s\n", status_message());
        return 1;
    }
    if (!strcmp(argv[1], "load")) {
        printf("OK vocab=%d bos=%d eos=%d special=%d kind=%s\n", tokenizer_vocab_size(t), tokenizer_bos_id(t),
               tokenizer_eos_id(t), tokenizer_encodes_special(t), tokenizer_kind(t));
        tokenizer_free(t);
        return 0;
    }
    if (!strcmp(argv[1], "decode") && argc > 3) {
        FILE *f = fopen(argv[3], "r");
        if (!f) return 2;
        char line[1 << 16];
        while (fgets(line, sizeof line, f)) {
            int32_t ids[4096];
            int n = 0;
            for (char *p = line, *e; n < 4096; p = e) {
                long v = strtol(p, &e, 10);
                if (e == p) break;
                ids[n++] = (int32_t)v;
            }
            printf("{");
            if (print_decode(t, ids, n)) printf("}\n");
        }
        fclose(f);
        tokenizer_free(t);
        return 0;
    }
    struct text *texts;
    int n_texts;
    if (argc < 4 || !read_corpus(argv[3], &texts, &n_texts)) {
        fprintf(stderr, "cannot read the corpus\n");
        return 2;
    }
    if (!strcmp(argv[1], "bench")) {
        const int reps = argc > 4 ? atoi(argv[4]) : 1;
        size_t bytes = 0, tokens = 0;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < n_texts; i++) {
                int32_t *ids;
                int n;
                if (tokenizer_encode(t, texts[i].p, texts[i].n, 0, &ids, &n) != STATUS_OK) return 1;
                bytes += texts[i].n, tokens += (size_t)n;
                free(ids);
            }
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.6f}\n", bytes, tokens,
               (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec));
        free_corpus(texts, n_texts);
        tokenizer_free(t);
        return 0;
    }
    const int special = !strcmp(argv[1], "encode_special");
    for (int i = 0; i < n_texts; i++) {
        int32_t *ids;
        int n;
        if ((s = tokenizer_encode(t, texts[i].p, texts[i].n, special, &ids, &n)) != STATUS_OK) {
            printf("{\"error\": \"encode %d failed: ", i);
            for (const char *m = status_message(); *m; m++) putchar(*m == '"' || *m == '\\' || (unsigned char)*m < 0x20 ? '?' : *m);
            printf("\"}\n");
            continue;
        }
        printf("{\"ids\": [");
        for (int k = 0; k < n; k++) printf("%s%d", k ? ", " : "", ids[k]);
        printf("], ");
        if (!print_decode(t, ids, n)) {
            free(ids);
            continue;
        }
        const char *least_text = texts[i].p;
        const size_t least = tokenizer_min_tokens(t, &least_text, &texts[i].n, 1);
        printf(", \"min_tokens\": %zu}\n", least);
        free(ids);
    }
    free_corpus(texts, n_texts);
    tokenizer_free(t);
    return 0;
}
