/* tests/bench_grammar.c - grammar engine figures (not a test): compile time median/p99 over the
 * corpus tests/data/grammar/ (files *.schema.json, *.regex, *.gbnf), and mask time per decode
 * step at batch 16 with a nested JSON schema on each vocabulary given (GGUF files), cold (the
 * first sequence pays for the mask entries) and warm; with BENCH_GRAMMAR_REGEX=FILE the same for
 * the regex in FILE (for example a pathological one the fuzzer found: docs/grammar.md). Prints
 * the CPU model with every figure.
 *   [BENCH_GRAMMAR_REGEX=FILE] bench_grammar CORPUS_DIR [GGUF...] */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "gguf_tokenizer.h"
#include "grammar.h"
#include "tokenizer.h"

static char cpu[256] = "unknown CPU";
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static uint64_t rng = 0x1234567;
static uint32_t rnd(void) { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)rng; }

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    *n = fread(s, 1, (size_t)len, f);
    s[*n] = 0;
    fclose(f);
    return s;
}

static int kind_of_file(const char *name)
{
    size_t n = strlen(name);
    if (n > 12 && !strcmp(name + n - 12, ".schema.json")) return GRAMMAR_JSON_SCHEMA;
    if (n > 6 && !strcmp(name + n - 6, ".regex")) return GRAMMAR_REGEX;
    if (n > 5 && !strcmp(name + n - 5, ".gbnf")) return GRAMMAR_EBNF;
    return -1;
}

static void bench_compile(const struct grammar_vocab *v, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    double t[1024];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 1024) {
        int kind = kind_of_file(e->d_name);
        if (kind < 0) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        char *src = slurp(path, &len);
        if (!src) continue;
        for (int rep = 0; rep < 5; rep++) {
            struct grammar *g = NULL;
            double t0 = now();
            enum status s = grammar_compile(v, (enum grammar_kind)kind, src, len, &g);
            t[n++] = now() - t0;
            if (s) { printf("  %s: %s\n", e->d_name, status_message()); break; }
            grammar_unref(g);
        }
        free(src);
    }
    closedir(d);
    if (!n) return;
    qsort(t, (size_t)n, sizeof *t, cmpd);
    printf("compile over %d compiles of the corpus (with the first mask, %d-token vocabulary): median %.3f ms, p99 %.3f "
           "ms, max %.3f ms  [%s]\n", n, grammar_vocab_mask_words(v) * 32, 1e3 * t[n / 2], 1e3 * t[(int)(n * 0.99)],
           1e3 * t[n - 1], cpu);
}

static void bench_masks(const char *gguf, enum grammar_kind kind, const char *src, size_t src_len, const char *label,
                        const char *corpus)
{
    struct gguf *gg = NULL;
    void *data = NULL;
    size_t len = 0;
    struct tokenizer *tok = NULL;
    if (gguf_open(gguf, &gg) || gguf_tokenizer_model_proto(gg, &data, &len) || tokenizer_load_from_memory(data, len, &tok)) {
        printf("SKIP %s: %s\n", gguf, status_message());
        free(data), gguf_close(gg);
        return;
    }
    free(data), gguf_close(gg);
    int32_t eos = tokenizer_eos_id(tok);
    struct grammar_vocab *v;
    double t0 = now();
    if (grammar_vocab_new(tok, tokenizer_vocab_size(tok), &eos, 1, &v)) return;
    printf("%s: %d tokens, vocabulary view built in %.1f ms  [%s]\n", gguf, tokenizer_vocab_size(tok), 1e3 * (now() - t0), cpu);
    if (corpus) bench_compile(v, corpus);
    struct grammar *g;
    t0 = now();
    if (grammar_compile(v, kind, src, src_len, &g)) { printf("compile: %s\n", status_message()); return; }
    printf("  %s compiled in %.3f ms\n", label, 1e3 * (now() - t0));
    int words = grammar_vocab_mask_words(v);
    uint32_t *mask = malloc(sizeof *mask * (size_t)words);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)words * 32);
    for (int round = 0; round < 2; round++) {
        enum { B = 16, STEPS = 200 };
        struct grammar_matcher *m[B];
        for (int i = 0; i < B; i++) grammar_matcher_new(g, &m[i]);
        double total = 0, worst = 0;
        int steps = 0;
        for (int s = 0; s < STEPS; s++) {
            double ts = now();
            int failed = 0;
            for (int i = 0; i < B; i++) failed += grammar_matcher_fill_mask(m[i], mask) != STATUS_OK;
            double dt = now() - ts;
            if (failed) {
                printf("  step %d: %d of %d masks failed in %.3f ms: %s\n", s, failed, B, 1e3 * dt, status_message());
                break;
            }
            /* The step's real advance (outside the timing): a random allowed token per sequence. */
            for (int i = 0; i < B; i++) {
                if (grammar_matcher_is_done(m[i])) { grammar_matcher_free(m[i]); grammar_matcher_new(g, &m[i]); }
                grammar_matcher_fill_mask(m[i], mask);
                int n = 0;
                for (int t = 0; t < words * 32; t++)
                    if (mask[t >> 5] >> (t & 31) & 1) allowed[n++] = t;
                if (n) grammar_matcher_accept(m[i], allowed[rnd() % (unsigned)n]);
            }
            total += dt, steps++;
            if (dt > worst) worst = dt;
        }
        printf("  %s: masks for batch %d: mean %.3f ms per step, worst %.3f ms (%d steps)  [%s]\n", round ? "warm" : "cold", B,
               1e3 * total / steps, 1e3 * worst, steps, cpu);
        for (int i = 0; i < B; i++) grammar_matcher_free(m[i]);
    }
    free(mask), free(allowed);
    grammar_unref(g);
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

int main(int argc, char **argv)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[200];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            snprintf(cpu, sizeof cpu, "%s", c ? c + 2 : line);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    const char *dir = argc > 1 ? argv[1] : "tests/data/grammar";
    static const char *toks[256];
    static int lens[256];
    static char bytes[256];
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, toks[i] = &bytes[i], lens[i] = 1;
    struct grammar_vocab *v;
    grammar_vocab_new_bytes(toks, lens, 256, 256, NULL, 0, &v);
    bench_compile(v, dir);
    grammar_vocab_free(v);
    size_t n;
    char path[4096];
    snprintf(path, sizeof path, "%s/person.schema.json", dir);
    char *schema = slurp(path, &n);
    if (!schema) return 1;
    const char *rx_path = getenv("BENCH_GRAMMAR_REGEX");
    size_t rx_len = 0;
    char *rx = rx_path ? slurp(rx_path, &rx_len) : NULL;
    if (rx_path && !rx) printf("BENCH_GRAMMAR_REGEX: cannot read %s\n", rx_path);
    for (int i = 2; i < argc; i++) {
        bench_masks(argv[i], GRAMMAR_JSON_SCHEMA, schema, strlen(schema), "nested schema", dir);
        if (rx) bench_masks(argv[i], GRAMMAR_REGEX, rx, rx_len, rx_path, NULL);
    }
    free(schema), free(rx);
    return 0;
}
