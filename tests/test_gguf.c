/* tests/test_gguf.c - the GGUF reader (engine/formats/gguf.h) against files written by gguf-py
 * (tests/gguf_setup.py): metadata of every value type read back, shapes mapped to shardlm
 * order, every supported ggml type dequantized BIT-EXACTLY equal to gguf-py's
 * gguf.quants.dequantize (whole tensor, row slices, bf16), unsupported types named, corrupt
 * and truncated copies each giving STATUS_BAD_FORMAT / STATUS_UNSUPPORTED with a message naming
 * the file and the fault, and the tokenizer built from tokenizer.ggml.* loaded through
 * SentencePiece (hand-derived BPE encodings of a tiny vocabulary). When the real Gemma 3 270M
 * file is present (argument 2, or SHARDLM_GGUF_MODEL), also its header, a tensor of each type
 * and its tokenizer.
 *
 * Usage: test_gguf FIXTURE_DIR [MODEL.gguf]. Exits 77 (skip) when FIXTURE_DIR has no
 * synthetic.gguf (gguf_setup.py skipped: gguf-py not installed). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base.h"
#include "gguf.h"
#include "gguf_tokenizer.h"
#include "tensor.h"
#include "check.h"
#include "tokenizer.h"

static const char *fixtures;
static char tmpdir[64];

static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(sz > 0 ? (size_t)sz : 1);
    if (p && fread(p, 1, (size_t)sz, f) != (size_t)sz) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)sz;
    return p;
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    CHECK(f, "%s: %s", path, strerror(errno));
    CHECK(fwrite(p, 1, n, f) == n, "write %s", path);
    fclose(f);
}

static char *fpath(const char *name)
{
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", fixtures, name);
    return b;
}

/* ---- metadata ---------------------------------------------------------------------------- */

static void test_metadata(struct gguf *g)
{
    int64_t i;
    double f;
    int b;
    const char *s;
    const struct gguf_kv *kv;
    check(gguf_version(g) == 3 && gguf_alignment(g) == 32, "version %u alignment %u", gguf_version(g),
          gguf_alignment(g));
    check(!gguf_get_int(g, "t.u8", &i) && i == 200, "u8 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.i8", &i) && i == -100, "i8 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.u16", &i) && i == 60000, "u16 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.i16", &i) && i == -30000, "i16 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.u32", &i) && i == 4000000000LL, "u32 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.i32", &i) && i == -2000000000LL, "i32 = %lld", (long long)i);
    check(!gguf_get_int(g, "t.i64", &i) && i == -(1LL << 62), "i64 = %lld", (long long)i);
    check_status(gguf_get_int(g, "t.u64", &i), STATUS_BAD_FORMAT, "u64 2^63+5 as int64", "t.u64", NULL);
    check(!gguf_get_float(g, "t.u64", &f) && f == 9223372036854775808.0, "u64 as float = %.17g", f);
    check(!gguf_get_float(g, "t.f32", &f) && f == 0.15625, "f32 = %g", f);
    check(!gguf_get_float(g, "t.f64", &f) && f == -1.0e300, "f64 = %g", f);
    check(!gguf_get_bool(g, "t.bool", &b) && b == 1, "bool = %d", b);
    check(!gguf_get_str(g, "t.str", &s) && !strcmp(s, "h\xc3\xa9llo\nworld"), "string");
    check(!gguf_get_str(g, "general.architecture", &s) && !strcmp(s, "synthetic"), "general.architecture");
    check_status(gguf_get_str(g, "t.u8", &s), STATUS_BAD_FORMAT, "string getter on a UINT8", "t.u8", "UINT8", NULL);
    check_status(gguf_get_int(g, "no.such.key", &i), STATUS_NOT_FOUND, "missing key", "no.such.key", NULL);
    check(!gguf_get_arr(g, "t.arr_i32", &kv) && kv->n == 3 && gguf_arr_int(kv, 0) == 1 && gguf_arr_int(kv, 1) == -2 &&
              gguf_arr_int(kv, 2) == 3,
          "int array");
    check(!gguf_get_arr(g, "t.arr_f32", &kv) && kv->n == 2 && gguf_arr_float(kv, 0) == 0.5 && gguf_arr_float(kv, 1) == -1.25,
          "float array");
    uint64_t len0, len1, len2;
    check(!gguf_get_arr(g, "t.arr_str", &kv) && kv->n == 3 && kv->arr_type == GGUF_TYPE_STRING &&
              !memcmp(gguf_arr_str(kv, 0, &len0), "a", 1) && len0 == 1 && (gguf_arr_str(kv, 1, &len1), len1 == 0) &&
              !memcmp(gguf_arr_str(kv, 2, &len2), "ccc", 3) && len2 == 3,
          "string array");
    check_status(gguf_get_arr(g, "t.u8", &kv), STATUS_BAD_FORMAT, "array getter on a scalar", "ARRAY", NULL);
}

/* ---- tensors ----------------------------------------------------------------------------- */

/* Bit-for-bit equality (NaN payloads included); prints the first mismatch. */
static int same_bits(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a[i], &b[i], 4) != 0) {
            printf("     %s: element %zu: got %.9g, gguf-py %.9g\n", what, i, a[i], b[i]);
            return 0;
        }
    }
    return 1;
}

static void test_tensors(struct gguf *g)
{
    static const char *types[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
                                  "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "MXFP4", "Q8_0_quantized"};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        char name[64], file[64];
        snprintf(name, sizeof name, "t.%s", types[k]);
        snprintf(file, sizeof file, "expected.%s.f32", types[k]);
        const struct gguf_tensor *t;
        enum status s = gguf_get_tensor(g, name, &t);
        if (s) {
            check(0, "%s: %s", name, status_message());
            continue;
        }
        size_t nexp;
        float *want = read_file(fpath(file), &nexp);
        if (!want || nexp != (size_t)t->numel * 4) {
            check(0, "%s: expectation %s missing or of the wrong size", name, file);
            free(want);
            continue;
        }
        float *got = malloc(nexp), *rows = malloc(nexp);
        uint16_t *bf = malloc((size_t)t->numel * 2);
        s = gguf_tensor_read_f32(g, t, got);
        check(!s && same_bits(got, want, (size_t)t->numel, name), "%s (%s, shape (%lld, %lld)) bit-exact with gguf-py",
              name, t->type_name, (long long)t->shape[0], (long long)t->shape[1]);
        /* Rows one at a time, then rows 1..end, must give the same bytes. */
        const int64_t row = t->numel / t->shape[0];
        int ok = 1;
        for (int64_t r = 0; r < t->shape[0]; r++) ok &= !gguf_tensor_read_rows_f32(g, t, r, 1, rows + r * row);
        ok = ok && same_bits(rows, want, (size_t)t->numel, name);
        ok = ok && !gguf_tensor_read_rows_f32(g, t, 1, t->shape[0] - 1, rows) &&
             same_bits(rows, want + row, (size_t)(t->numel - row), name);
        check(ok, "%s row slices", name);
        ok = !gguf_tensor_read_rows_bf16(g, t, 0, t->shape[0], bf);
        for (int64_t i = 0; ok && i < t->numel; i++) ok = bf[i] == f32_to_bf16(want[i]);
        check(ok, "%s as bf16", name);
        free(want);
        free(got);
        free(rows);
        free(bf);
    }

    const struct gguf_tensor *t = gguf_find_tensor(g, "t.Q4_K");
    float dummy[512 * 3];
    check_status(gguf_tensor_read_rows_f32(g, t, 2, 2, dummy), STATUS_INVALID_ARGUMENT, "rows past the end", "t.Q4_K", NULL);
    check_status(gguf_tensor_read_rows_f32(g, t, -1, 1, dummy), STATUS_INVALID_ARGUMENT, "negative row", NULL);

    t = gguf_find_tensor(g, "t.3d");
    check(t && t->n_dims == 3 && t->ne[0] == 64 && t->ne[1] == 3 && t->ne[2] == 2 && t->shape[0] == 2 &&
              t->shape[1] == 3 && t->shape[2] == 64,
          "3-D tensor: GGUF ne [64, 3, 2] is shardlm shape (2, 3, 64)");
    if (t) {
        float buf[3 * 64];
        int ok = !gguf_tensor_read_rows_f32(g, t, 1, 1, buf);
        for (int i = 0; ok && i < 3 * 64; i++) ok = buf[i] == (float)(3 * 64 + i);
        check(ok, "3-D tensor row 1 is numpy's x[1]");
    }

    check_status(gguf_get_tensor(g, "t.IQ2_XXS", &t), STATUS_UNSUPPORTED, "unsupported type named, the supported listed",
                 "IQ2_XXS", "t.IQ2_XXS", "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16, MXFP4",
                 NULL);
    t = gguf_find_tensor(g, "t.IQ2_XXS");
    check_status(gguf_tensor_read_f32(g, t, dummy), STATUS_UNSUPPORTED, "reading an unsupported type", "IQ2_XXS", NULL);
    check_status(gguf_get_tensor(g, "nope", &t), STATUS_NOT_FOUND, "missing tensor", "nope", NULL);

    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    enum status s = gguf_inspect(fpath("synthetic.gguf"), mem);
    fclose(mem);
    check(!s && strstr(text, "GGUF v3") && strstr(text, "t.Q4_K") && strstr(text, "(3, 512)") &&
              strstr(text, "(2, 3, 64)") && strstr(text, "IQ2_XXS(!)") && strstr(text, "\"h\xc3\xa9llo\\nworld\""),
          "gguf_inspect prints header, metadata and tensor table");
    free(text);
}

/* ---- corrupt files ----------------------------------------------------------------------- */

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void expect_open(const void *bytes, size_t n, enum status want, const char *what, const char *needle)
{
    char path[128];
    snprintf(path, sizeof path, "%s/corrupt.gguf", tmpdir);
    write_file(path, bytes, n);
    struct gguf *g = NULL;
    enum status s = gguf_open(path, &g);
    check_status(s, want, what, path, needle, NULL);
    gguf_close(g);
}

static void test_corrupt(void)
{
    size_t n;
    uint8_t *orig = read_file(fpath("synthetic.gguf"), &n);
    CHECK(orig, "synthetic.gguf");
    uint8_t *b = malloc(n);
    struct gguf *g;
    enum status s = gguf_open(fpath("synthetic.gguf"), &g);
    CHECK(!s, "%s", status_message());
    const uint64_t data_off = gguf_data_offset(g);
    const struct gguf_tensor *last = gguf_find_tensor(g, "t.IQ2_XXS");
    const uint64_t last_end = last->file_offset + last->nbytes;
    const uint64_t q4k_offset = gguf_find_tensor(g, "t.Q4_K")->offset;
    gguf_close(g);

    /* Truncation anywhere: in the header, the metadata, the tensor infos, the data. */
    const size_t cuts[] = {0, 3, 7, 20, 30, 100, 1000, (size_t)data_off - 40, (size_t)data_off + 10, (size_t)last_end - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        char what[64];
        snprintf(what, sizeof what, "truncated at byte %zu of %zu", cuts[k], n);
        expect_open(orig, cuts[k], STATUS_BAD_FORMAT, what, cuts[k] < 24 ? "" : "truncated");
    }
    memcpy(b, orig, n);
    b[0] = 'X';
    expect_open(b, n, STATUS_BAD_FORMAT, "bad magic", "magic");
    memcpy(b, orig, n);
    put32(b + 4, 1);
    expect_open(b, n, STATUS_UNSUPPORTED, "version 1", "version 1");
    put32(b + 4, 0x03000000);
    expect_open(b, n, STATUS_UNSUPPORTED, "big-endian file", "big-endian");
    put32(b + 4, 4);
    expect_open(b, n, STATUS_UNSUPPORTED, "version 4", "version 4");
    memcpy(b, orig, n);
    put64(b + 8, 1ULL << 40);
    expect_open(b, n, STATUS_BAD_FORMAT, "huge tensor count", "tensor count");
    memcpy(b, orig, n);
    put64(b + 16, 1ULL << 40);
    expect_open(b, n, STATUS_BAD_FORMAT, "huge metadata count", "metadata count");
    memcpy(b, orig, n);
    put64(b + 24, 1ULL << 50); /* length of the first key */
    expect_open(b, n, STATUS_BAD_FORMAT, "key length past the end", "past the end");
    memcpy(b, orig, n);
    /* The first key is general.architecture (20 bytes); its type follows. */
    put32(b + 24 + 8 + 20, 13);
    expect_open(b, n, STATUS_BAD_FORMAT, "invalid value type 13", "invalid value type");

    /* Tensor-info corruption: find t.Q4_K's info record by its name. */
    uint8_t *p = memmem(orig, (size_t)data_off, "t.Q4_K", 6);
    CHECK(p, "t.Q4_K info");
    size_t info = (size_t)(p - orig) + 6; /* n_dims, ne[2], type, offset */
    memcpy(b, orig, n);
    put32(b + info, 5);
    expect_open(b, n, STATUS_BAD_FORMAT, "5 dims", "dims");
    memcpy(b, orig, n);
    put64(b + info + 4, 500); /* ne[0] not a multiple of 256 */
    expect_open(b, n, STATUS_BAD_FORMAT, "ne[0] not a multiple of the block size", "block size");
    memcpy(b, orig, n);
    put64(b + info + 4 + 16 + 4, q4k_offset + 8);
    expect_open(b, n, STATUS_BAD_FORMAT, "misaligned tensor offset", "alignment");
    memcpy(b, orig, n);
    put64(b + info + 4 + 16 + 4, 0); /* overlaps the first tensor */
    expect_open(b, n, STATUS_BAD_FORMAT, "overlapping tensors", "overlap");
    memcpy(b, orig, n);
    put64(b + info + 4 + 16 + 4, 1ULL << 40);
    expect_open(b, n, STATUS_BAD_FORMAT, "offset past the end", "past the end");
    memcpy(b, orig, n);
    put32(b + info + 4 + 16, 99);
    {
        char path[128];
        snprintf(path, sizeof path, "%s/unknown_type.gguf", tmpdir);
        write_file(path, b, n);
        s = gguf_open(path, &g);
        check(!s, "unknown type number: open succeeds");
        if (!s) {
            const struct gguf_tensor *t;
            check_status(gguf_get_tensor(g, "t.Q4_K", &t), STATUS_UNSUPPORTED, "unknown type number when requested, "
                         "the supported listed", "type 99", "IQ4_XS, BF16", NULL);
            gguf_close(g);
        }
    }

    s = gguf_open(fpath("nested.gguf"), &g);
    check_status(s, STATUS_UNSUPPORTED, "array of arrays", "array of arrays", NULL);
    gguf_close(g);
    s = gguf_open(fpath("no_such_file.gguf"), &g);
    check_status(s, STATUS_NOT_FOUND, "missing file", "no_such_file.gguf", NULL);
    free(b);
    free(orig);
}

/* ---- tokenizer --------------------------------------------------------------------------- */

static int encode_is(const struct tokenizer *tok, const char *text, int add_bos, const int32_t *want, int n_want)
{
    int32_t *ids = NULL;
    int n = 0;
    if (tokenizer_encode(tok, text, strlen(text), add_bos, &ids, &n)) return 0;
    int ok = n == n_want && !memcmp(ids, want, (size_t)n * sizeof *ids);
    if (!ok) {
        printf("     '%s' ->", text);
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    char *back = NULL;
    size_t len;
    if (ok && !tokenizer_decode(tok, ids, n, &back, &len)) ok = len == strlen(text) && !memcmp(back, text, len);
    free(back);
    free(ids);
    return ok;
}

static void test_tokenizer(void)
{
    struct gguf *g;
    enum status s = gguf_open(fpath("tok.gguf"), &g);
    check(!s, "open tok.gguf");
    if (s) return;
    void *proto;
    size_t n;
    struct tokenizer *tok = NULL;
    s = gguf_tokenizer_model_proto(g, &proto, &n);
    check(!s, "tokenizer proto built (%zu bytes)", n);
    if (!s) {
        s = tokenizer_load_from_memory(proto, n, &tok);
        check_status(s, STATUS_OK, "SentencePiece loads the proto", NULL);
        free(proto);
    }
    gguf_close(g);
    if (!tok) return;
    check(tokenizer_vocab_size(tok) == 6 + 256 + 17 && tokenizer_bos_id(tok) == 2 && tokenizer_eos_id(tok) == 1 &&
              tokenizer_pad_id(tok) == 0 && tokenizer_unk_id(tok) == 3,
          "vocab %d bos %d eos %d pad %d unk %d", tokenizer_vocab_size(tok), tokenizer_bos_id(tok),
          tokenizer_eos_id(tok), tokenizer_pad_id(tok), tokenizer_unk_id(tok));
    check(tokenizer_is_byte(tok, 6 + 0x41) && tokenizer_is_control(tok, 4) && !tokenizer_is_control(tok, 5),
          "piece types: byte, control, user-defined");
    /* Ids: ▁ 262, h 263, e 264, l 265, o 266, w 267, r 268, d 269, he 270, ll 271, llo 272,
     * hello 273, ▁hello 274, ▁w 275, or 276, ▁wor 277, ▁world 278. Merges by score: or, ▁w,
     * ▁wor, ll, llo, he, hello; ▁world is unreachable (no ▁worl or ld). */
    static const int32_t hw[] = {273, 277, 265, 269};
    check(encode_is(tok, "hello world", 0, hw, 4), "BPE by score: 'hello world' = hello ▁wor l d");
    static const int32_t hw_bos[] = {2, 273, 277, 265, 269};
    check(encode_is(tok, "hello world", 1, hw_bos, 5), "with BOS");
    static const int32_t sh[] = {274};
    check(encode_is(tok, " hello", 0, sh, 1), "no dummy prefix: ' hello' = ▁hello");
    static const int32_t he[] = {263, 6 + 0xC3, 6 + 0xA9};
    check(encode_is(tok, "h\xc3\xa9", 0, he, 3), "byte fallback: 'hé' = h <0xC3> <0xA9>");
    static const int32_t ud[] = {270, 5, 272};
    check(encode_is(tok, "he<sep>llo", 0, ud, 3), "user-defined piece matched in text");
    tokenizer_free(tok);
}

/* The real model, when present: header facts from docs/models.md and its tokenizer. */
static void test_model_file(const char *path)
{
    struct gguf *g;
    enum status s = gguf_open(path, &g);
    check_status(s, STATUS_OK, "open the Gemma 3 270M GGUF", NULL);
    if (s) return;
    const char *arch;
    int64_t n_layers, d_model;
    check(!gguf_get_str(g, "general.architecture", &arch) && !strcmp(arch, "gemma3") &&
              !gguf_get_int(g, "gemma3.block_count", &n_layers) && n_layers == 18 &&
              !gguf_get_int(g, "gemma3.embedding_length", &d_model) && d_model == 640 && gguf_n_tensors(g) == 236,
          "gemma3: 18 layers, d_model 640, 236 tensors");
    const char *names[] = {"blk.0.attn_q.weight", "blk.0.attn_output.weight", "blk.0.ffn_down.weight",
                           "blk.1.ffn_down.weight", "blk.0.attn_v.weight", "output_norm.weight"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const struct gguf_tensor *t;
        if ((s = gguf_get_tensor(g, names[k], &t))) {
            check(0, "%s: %s", names[k], status_message());
            continue;
        }
        float *x = malloc((size_t)t->numel * sizeof *x);
        s = gguf_tensor_read_f32(g, t, x);
        double ss = 0;
        int finite = 1;
        for (int64_t i = 0; i < t->numel; i++) {
            finite &= isfinite(x[i]) != 0;
            ss += (double)x[i] * x[i];
        }
        check(!s && finite && ss > 0, "%s (%s, (%lld, %lld)): finite, rms %.4g", names[k], t->type_name,
              (long long)t->shape[0], (long long)t->shape[1], sqrt(ss / (double)t->numel));
        free(x);
    }
    const struct gguf_tensor *emb = gguf_find_tensor(g, "token_embd.weight");
    float *row = malloc(640 * sizeof *row);
    check(emb && emb->shape[0] == 262144 && emb->shape[1] == 640 && !gguf_tensor_read_rows_f32(g, emb, 262143, 1, row),
          "token_embd (262144, 640) last row");
    free(row);

    void *proto;
    size_t n;
    struct tokenizer *tok = NULL;
    s = gguf_tokenizer_model_proto(g, &proto, &n);
    if (!s) {
        s = tokenizer_load_from_memory(proto, n, &tok);
        free(proto);
    }
    check_status(s, STATUS_OK, "Gemma tokenizer from GGUF metadata loads in SentencePiece", NULL);
    gguf_close(g);
    if (!tok) return;
    check(tokenizer_vocab_size(tok) == 262144 && tokenizer_bos_id(tok) == 2 && tokenizer_eos_id(tok) == 1 &&
              tokenizer_pad_id(tok) == 0 && tokenizer_unk_id(tok) == 3 &&
              tokenizer_piece_to_id(tok, "<start_of_turn>") == 105 && tokenizer_piece_to_id(tok, "<end_of_turn>") == 106,
          "Gemma ids: vocab 262144, bos 2, eos 1, pad 0, unk 3, <start_of_turn> 105, <end_of_turn> 106");
    static const int32_t nl2[] = {108};
    check(encode_is(tok, "\n\n", 0, nl2, 1), "'\\n\\n' is the user-defined piece 108");
    const char *texts[] = {"Hello, world! The quick brown fox.", "  two leading spaces", "日本語のテキスト 🙂",
                           "line one\nline two\n\n\tindented"};
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        int32_t *ids = NULL;
        int nid = 0;
        char *back = NULL;
        size_t len = 0;
        s = tokenizer_encode(tok, texts[k], strlen(texts[k]), 1, &ids, &nid);
        if (!s) s = tokenizer_decode(tok, ids, nid, &back, &len);
        check(!s && nid > 1 && ids[0] == 2 && len == strlen(texts[k]) && !memcmp(back, texts[k], len),
              "Gemma round trip '%s' (%d ids)", texts[k], nid);
        free(ids);
        free(back);
    }
    tokenizer_free(tok);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_gguf FIXTURE_DIR [MODEL.gguf]\n");
        return 2;
    }
    fixtures = argv[1];
    if (access(fpath("synthetic.gguf"), R_OK) != 0) {
        printf("SKIP: %s not found (tests/gguf_setup.py needs pip install gguf numpy)\n", fpath("synthetic.gguf"));
        return 77;
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/shardlm_gguf_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    log_set_level(LOG_LEVEL_WARN);
    struct gguf *g;
    enum status s = gguf_open(fpath("synthetic.gguf"), &g);
    check_status(s, STATUS_OK, "open synthetic.gguf", NULL);
    if (!s) {
        test_metadata(g);
        test_tensors(g);
        gguf_close(g);
    }
    test_corrupt();
    test_tokenizer();
    const char *model = argc > 2 ? argv[2] : getenv("SHARDLM_GGUF_MODEL");
    if (model && access(model, R_OK) == 0) test_model_file(model);
    else printf("note: no Gemma GGUF (argument 2 or SHARDLM_GGUF_MODEL): model checks not run\n");

    char path[128];
    snprintf(path, sizeof path, "%s/corrupt.gguf", tmpdir);
    unlink(path);
    snprintf(path, sizeof path, "%s/unknown_type.gguf", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
