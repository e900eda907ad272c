/* tests/test_formats.c - checkpoint formats: safetensors round trip and corrupt files,
 * config.json parsing (Llama, Mistral, GPT-2, Gemma 3, errors, save/load), and checkpoint
 * directories: tiny random Llama, GPT-2 and Gemma 3 models written in the HF layout, the sharded HF layout and the
 * Megatron-style layout at several tp/pp, each read back through checkpoint_get at tp 1, 2, 4
 * and compared byte for byte with slices computed here from the original tensors.
 * Not here: running a model (test_model.c).
 * Makes its own files in a mkdtemp directory and removes it; prints one line per check and
 * "N passed, M failed"; exits 1 on failure. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"
#include "checkpoint.h"
#include "config.h"
#include "safetensors.h"
#include "tensor.h"
#include "check.h"

static char root[64];

/* Paths under the temporary root; a ring of buffers so that a few can be alive at once. */
static const char *tpath(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static const char *tpath(const char *fmt, ...)
{
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ % 8];
    int n = snprintf(b, 4096, "%s/", root);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b + n, 4096 - (size_t)n, fmt, ap);
    va_end(ap);
    return b;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_float(void) { return (float)((rng_next() >> 40) / (double)(1 << 24)) * 2.0f - 1.0f; }

static void fill_random(void *p, enum dtype t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t == DTYPE_I32) ((int32_t *)p)[i] = (int32_t)rng_next();
        else dtype_store_f32(p, t, i, rng_float());
    }
}

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(data, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

static int write_text(const char *path, const char *text) { return write_file(path, text, strlen(text)); }

static int file_exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Files in the temporary root whose names start with prefix (the writers' temporaries,
 * base_atomic_*: NAME.XXXXXX). */
static int count_prefixed(const char *prefix)
{
    DIR *d = opendir(root);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* ---- safetensors ------------------------------------------------------------------------ */

static enum status fill_pattern(void *ctx, void *dst, size_t nbytes)
{
    const unsigned char *seed = ctx;
    for (size_t i = 0; i < nbytes; i++) ((unsigned char *)dst)[i] = (unsigned char)(*seed + i * 7);
    return STATUS_OK;
}

static void test_safetensors_roundtrip(void)
{
    float a[15];
    uint16_t b[7], c[8];
    int32_t d[4];
    float e[1];
    unsigned char seed = 11;
    fill_random(a, DTYPE_F32, 15);
    fill_random(b, DTYPE_BF16, 7);
    fill_random(c, DTYPE_F16, 8);
    fill_random(d, DTYPE_I32, 4);
    fill_random(e, DTYPE_F32, 1);
    unsigned char g[5 * 3 * 2];
    fill_pattern(&seed, g, sizeof g);
    struct {
        const char *name;
        enum dtype  dtype;
        int         ndim;
        int64_t     shape[3];
        const void *data;
        size_t      nbytes;
    } t[] = {
        {"a.f32", DTYPE_F32, 2, {3, 5}, a, sizeof a},
        {"b.bf16", DTYPE_BF16, 1, {7}, b, sizeof b},
        {"c/f16 \"quoted\" \\ name", DTYPE_F16, 3, {2, 2, 2}, c, sizeof c},
        {"d.i32", DTYPE_I32, 1, {4}, d, sizeof d},
        {"e.scalar", DTYPE_F32, 0, {0}, e, sizeof e},
        {"f.empty", DTYPE_F32, 2, {0, 3}, NULL, 0},
        {"g.deferred", DTYPE_BF16, 2, {5, 3}, g, sizeof g},
    };
    int nt = (int)(sizeof t / sizeof t[0]);
    const char *path = tpath("rt.safetensors");
    const char *note = "tab\t quote\" backslash\\ newline\n utf8 \xc3\xa9";

    struct safetensors_writer *w = NULL;
    enum status s = safetensors_writer_begin(path, &w);
    for (int i = 0; i < nt && !s; i++) {
        if (!strcmp(t[i].name, "g.deferred"))
            s = safetensors_writer_add_deferred(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape,
                                                fill_pattern, &seed);
        else
            s = safetensors_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, t[i].data);
    }
    if (!s) s = safetensors_writer_set_metadata(w, "format", "np");
    if (!s) s = safetensors_writer_set_metadata(w, "note", note);
    if (!s) s = safetensors_writer_set_metadata(w, "format", "pt"); /* replaces */
    if (!s) {
        enum status dup = safetensors_writer_add(w, "a.f32", DTYPE_F32, 1, (int64_t[]){1}, a);
        check_status(dup, STATUS_INVALID_ARGUMENT, "writer: duplicate tensor name", "a.f32", "twice",
                     NULL);
        check(count_prefixed("rt.safetensors.") == 1 && !file_exists(path),
              "writer: only a temporary beside path exists before finish");
        s = safetensors_writer_finish(w);
    } else {
        safetensors_writer_free(w);
    }
    check_status(s, STATUS_OK, "writer: 7 tensors of 4 dtypes (scalar, empty, deferred), metadata", NULL);
    check(file_exists(path) && count_prefixed("rt.safetensors.") == 0,
          "writer: renamed into place, no temporary left");

    FILE *f = fopen(path, "rb");
    unsigned char len8[8] = {0};
    int got8 = f && fread(len8, 1, 8, f) == 8;
    if (f) fclose(f);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)len8[i] << (8 * i);
    check(got8 && hlen % 8 == 0, "writer: header length %llu is a multiple of 8", (unsigned long long)hlen);

    struct safetensors *st = NULL;
    s = safetensors_open(path, &st);
    check_status(s, STATUS_OK, "reader: open the round-trip file", NULL);
    if (s) return;
    int ok = safetensors_count(st) == nt, aligned = 1;
    for (int i = 0; i < nt; i++) {
        const struct st_tensor *x = NULL;
        if (safetensors_get(st, t[i].name, &x) != STATUS_OK) {
            ok = 0;
            continue;
        }
        ok &= x->dtype == t[i].dtype && x->ndim == t[i].ndim && x->nbytes == t[i].nbytes;
        for (int k = 0; k < t[i].ndim; k++) ok &= x->shape[k] == t[i].shape[k];
        if (t[i].nbytes) ok &= !memcmp(x->data, t[i].data, t[i].nbytes);
        aligned &= st_tensor_aligned(x);
    }
    int seen = 0;
    for (int i = 0; i < safetensors_count(st); i++)
        seen += safetensors_find(st, safetensors_tensor(st, i)->name) == safetensors_tensor(st, i);
    check(ok, "reader: every tensor's dtype, shape and bytes equal what was written");
    check(seen == nt, "reader: iteration by index visits every tensor once");
    check(aligned, "reader: every tensor is aligned to its element size");
    const char *fmt = safetensors_metadata(st, "format"), *nv = safetensors_metadata(st, "note");
    check(fmt && !strcmp(fmt, "pt") && nv && !strcmp(nv, note) && safetensors_metadata_count(st) == 2 &&
              !safetensors_metadata(st, "absent"),
          "reader: metadata (escaped strings, replaced key) round trip");

    const struct st_tensor *ta = safetensors_find(st, "a.f32"), *tb = safetensors_find(st, "b.bf16");
    uint16_t a16[15];
    float b32[7];
    ok = ta && tb && safetensors_read(ta, DTYPE_BF16, a16, sizeof a16) == STATUS_OK &&
         safetensors_read(tb, DTYPE_F32, b32, sizeof b32) == STATUS_OK;
    for (int i = 0; ok && i < 15; i++) ok &= a16[i] == f32_to_bf16(a[i]);
    for (int i = 0; ok && i < 7; i++) ok &= b32[i] == bf16_to_f32(b[i]);
    check(ok, "reader: safetensors_read converts f32 -> bf16 and bf16 -> f32 (round to nearest even)");
    check_status(ta ? safetensors_read(ta, DTYPE_F32, a16, sizeof a16) : STATUS_INTERNAL,
                 STATUS_INVALID_ARGUMENT, "reader: read into a too-small buffer", "needs 60 bytes", NULL);
    const struct st_tensor *x = NULL;
    check_status(safetensors_get(st, "nope", &x), STATUS_NOT_FOUND, "reader: get an absent tensor",
                 "no tensor 'nope'", "rt.safetensors", NULL);
    safetensors_close(st);

    /* Gathering from unaligned memory, strided, converting. */
    unsigned char raw[1 + 8 * 4];
    float src[8], back[4];
    uint16_t half[4];
    fill_random(src, DTYPE_F32, 8);
    memcpy(raw + 1, src, sizeof src);
    safetensors_gather(back, DTYPE_F32, raw + 1, DTYPE_F32, 4, 2);
    safetensors_gather(half, DTYPE_BF16, raw + 1, DTYPE_F32, 4, 2);
    ok = 1;
    for (int i = 0; i < 4; i++) ok &= back[i] == src[2 * i] && half[i] == f32_to_bf16(src[2 * i]);
    check(ok, "safetensors_gather: unaligned, strided source, with and without conversion");

    check_status(safetensors_writer_begin(tpath("no/such/dir/x.safetensors"), &w), STATUS_IO,
                 "writer: begin in a missing directory", "x.safetensors", "temporary", NULL);
    s = safetensors_writer_begin(tpath("abandoned.safetensors"), &w);
    if (!s) safetensors_writer_add(w, "a", DTYPE_F32, 1, (int64_t[]){15}, a);
    safetensors_writer_free(w);
    check(!s && !file_exists(tpath("abandoned.safetensors")) && count_prefixed("abandoned.safetensors") == 0,
          "writer: free without finish leaves no file behind");
    safetensors_writer_free(NULL);
    safetensors_close(NULL);
}

/* A file with header length `hlen`, header text `header` padded with spaces to a multiple of 8
 * (unless raw_len), then data_len bytes. */
static const char *write_raw(const char *name, uint64_t hlen, const char *header, size_t data_len,
                             int pad)
{
    const char *path = tpath("%s", name);
    size_t n = strlen(header), padded = pad ? (n + 7) / 8 * 8 : n;
    if (hlen == UINT64_MAX) hlen = padded;
    unsigned char *buf = calloc(8 + padded + data_len + 1, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(buf + 8, header, n);
    memset(buf + 8 + n, ' ', padded - n);
    for (size_t i = 0; i < data_len; i++) buf[8 + padded + i] = (unsigned char)i;
    write_file(path, buf, 8 + padded + data_len);
    free(buf);
    return path;
}

static void expect_corrupt(const char *what, const char *name, uint64_t hlen, const char *header,
                           size_t data_len, const char *needle)
{
    const char *path = write_raw(name, hlen, header, data_len, 1);
    struct safetensors *st = NULL;
    enum status s = safetensors_open(path, &st);
    check_status(s, STATUS_BAD_FORMAT, what, needle, name, NULL);
    safetensors_close(st);
}

static void test_safetensors_corrupt(void)
{
    struct safetensors *st = NULL;
    check_status(safetensors_open(tpath("missing.safetensors"), &st), STATUS_NOT_FOUND,
                 "corrupt: missing file", "missing.safetensors", "no such file", NULL);
    const char *p = tpath("short.safetensors");
    write_file(p, "\x10\0\0\0\0", 5);
    check_status(safetensors_open(p, &st), STATUS_BAD_FORMAT, "corrupt: 5-byte file",
                 "short.safetensors", "too short", NULL);

    expect_corrupt("corrupt: header length past the end (truncated header)", "trunc.st", 200,
                   "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                   "exceeds the file size");
    expect_corrupt("corrupt: huge header length", "huge.st", 1ull << 40, "{}", 0, "implausible");
    expect_corrupt("corrupt: zero header length", "zero.st", 0, "{}", 0, "header length is 0");
    expect_corrupt("corrupt: bad JSON", "badjson.st", UINT64_MAX, "{\"a\": {\"dtype\": \"F32\",", 0,
                   "not a valid JSON");
    expect_corrupt("corrupt: header not an object", "array.st", UINT64_MAX, "[1, 2]", 0,
                   "does not start with '{'");
    expect_corrupt("corrupt: garbage after the JSON", "garbage.st", UINT64_MAX, "{} xyz", 0, "garbage");
    /* Found by tests/fuzz/fuzz_safetensors (a heap overflow before the fix). */
    expect_corrupt("corrupt: __metadata__ twice", "meta2.st", UINT64_MAX,
                   "{\"__metadata__\":{\"a\":\"b\",\"c\":\"d\"},\"__metadata__\":{\"e\":\"f\"}}", 0,
                   "__metadata__ appears twice");
    expect_corrupt("corrupt: data_offsets out of bounds", "oob.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
                   "out of bounds");
    expect_corrupt("corrupt: begin > end", "order.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8,
                   "out of bounds");
    expect_corrupt("corrupt: overlapping tensors", "overlap.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                   "\"u\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
                   24, "overlap");
    expect_corrupt("corrupt: shape / size mismatch", "size.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16,
                   "need 12");
    expect_corrupt("corrupt: 9 dimensions", "dims.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
                   4, "9 dimensions");
    expect_corrupt("corrupt: negative dimension", "neg.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                   "non-negative");
    expect_corrupt("corrupt: fractional offset", "frac.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.5]}}", 8,
                   "data_offsets");
    expect_corrupt("corrupt: shape product overflows", "ovf.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
                   "\"data_offsets\":[0,4]}}",
                   4, "overflows");
    expect_corrupt("corrupt: duplicate tensor name", "dup.st", UINT64_MAX,
                   "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   8, "appears twice");
    expect_corrupt("corrupt: non-string metadata value", "meta.st", UINT64_MAX,
                   "{\"__metadata__\":{\"n\":1}}", 0, "__metadata__");
    expect_corrupt("corrupt: missing dtype", "nodtype.st", UINT64_MAX,
                   "{\"t\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'dtype'");

    /* Dtypes shardlm does not load: fine at open, an error when looked up. */
    p = write_raw("f64.st", UINT64_MAX,
                  "{\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,16]},"
                  "\"f\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
                  "\"q\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[24,27]}}",
                  27, 1);
    enum status s = safetensors_open(p, &st);
    check_status(s, STATUS_OK, "unsupported dtypes: a file with F64 and unknown Q7 tensors opens", NULL);
    if (!s) {
        const struct st_tensor *t = NULL;
        check_status(safetensors_get(st, "d", &t), STATUS_UNSUPPORTED, "unsupported dtypes: look up F64",
                     "tensor d has dtype F64 which shardlm does not load", "f64.st", NULL);
        check_status(safetensors_get(st, "q", &t), STATUS_UNSUPPORTED,
                     "unsupported dtypes: look up unknown Q7", "dtype Q7", NULL);
        check_status(safetensors_get(st, "f", &t), STATUS_OK, "unsupported dtypes: F32 beside them loads",
                     NULL);
        float dst[2];
        check_status(safetensors_read(safetensors_find(st, "d"), DTYPE_F32, dst, sizeof dst),
                     STATUS_UNSUPPORTED, "unsupported dtypes: read F64", "F64", NULL);
        safetensors_close(st);
    }

    /* Every truncation of a valid file is rejected cleanly. */
    FILE *f = fopen(tpath("rt.safetensors"), "rb");
    unsigned char *whole = NULL;
    long size = 0;
    if (f && fseek(f, 0, SEEK_END) == 0 && (size = ftell(f)) > 0) {
        rewind(f);
        whole = malloc((size_t)size);
        if (fread(whole, 1, (size_t)size, f) != (size_t)size) size = 0;
    }
    if (f) fclose(f);
    int ok = size > 0, n_trunc = 0;
    for (long n = 0; ok && n < size; n++) {
        p = tpath("trunc_prefix.st");
        write_file(p, whole, (size_t)n);
        s = safetensors_open(p, &st);
        safetensors_close(st);
        st = NULL;
        ok &= s == STATUS_BAD_FORMAT;
        n_trunc++;
    }
    check(ok, "corrupt: all %d truncations of a valid file give BAD_FORMAT", n_trunc);

    /* Random byte flips in the header: a clean status, and any file that opens is in bounds. */
    int bad = 0, opened = 0;
    for (int it = 0; size > 0 && it < 400; it++) {
        unsigned char *copy = malloc((size_t)size);
        memcpy(copy, whole, (size_t)size);
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)copy[i] << (8 * i);
        int flips = 1 + (int)(rng_next() % 3);
        for (int k = 0; k < flips; k++) {
            size_t at = 8 + rng_next() % hlen;
            copy[at] = (unsigned char)(rng_next() & 0xff);
        }
        p = tpath("fuzz.st");
        write_file(p, copy, (size_t)size);
        free(copy);
        s = safetensors_open(p, &st);
        if (s == STATUS_OK) {
            opened++;
            unsigned sum = 0;
            for (int i = 0; i < safetensors_count(st); i++) {
                const struct st_tensor *t = safetensors_tensor(st, i);
                for (size_t j = 0; j < t->nbytes; j++) sum += ((const unsigned char *)t->data)[j];
            }
            (void)sum;
        } else if (s != STATUS_BAD_FORMAT) {
            bad++;
        }
        safetensors_close(st);
        st = NULL;
    }
    check(size > 0 && bad == 0, "corrupt: 400 random header corruptions give OK (%d, all in bounds) or BAD_FORMAT",
          opened);
    free(whole);
}

/* ---- config.json ------------------------------------------------------------------------ */

static const char *llama3_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"attention_bias\": false,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128009], \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"intermediate_size\": 14336, \"max_position_embeddings\": 8192,"
    " \"mlp_bias\": false, \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"use_cache\": true, \"vocab_size\": 128256}";

static const char *llama_min_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 172,"
    " \"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"vocab_size\": 512}";

static const char *mistral_json =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": \"mistral\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";

static const char *mistral_nosw_json =
    "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 5120, \"head_dim\": 128,"
    " \"intermediate_size\": 14336, \"num_attention_heads\": 32, \"num_hidden_layers\": 40,"
    " \"num_key_value_heads\": 8, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
    " \"torch_dtype\": \"float16\", \"vocab_size\": 131072}";

static const char *gpt2_json =
    "{\"activation_function\": \"gelu_new\", \"architectures\": [\"GPT2LMHeadModel\"],"
    " \"attn_pdrop\": 0.1, \"bos_token_id\": 50256, \"embd_pdrop\": 0.1, \"eos_token_id\": 50256,"
    " \"initializer_range\": 0.02, \"layer_norm_epsilon\": 1e-05, \"model_type\": \"gpt2\","
    " \"n_ctx\": 1024, \"n_embd\": 768, \"n_head\": 12, \"n_inner\": null, \"n_layer\": 12,"
    " \"n_positions\": 1024, \"resid_pdrop\": 0.1, \"vocab_size\": 50257}";

static const char *shardlm_json =
    "{\"architecture\": \"LlamaForCausalLM\", \"hidden_size\": 64, \"intermediate_size\": 172,"
    " \"num_hidden_layers\": 5, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
    " \"vocab_size\": 512, \"rms_norm_eps\": 1e-05, \"rope_style\": \"pairs\","
    " \"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2}";

/* google/gemma-3-270m's config.json (transformers 4.55). */
static const char *gemma3_270m_json =
    "{\"_sliding_window_pattern\": 6, \"architectures\": [\"Gemma3ForCausalLM\"],"
    " \"attention_bias\": false, \"attention_dropout\": 0.0, \"attn_logit_softcapping\": null,"
    " \"bos_token_id\": 2, \"eos_token_id\": 1, \"final_logit_softcapping\": null, \"head_dim\": 256,"
    " \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_size\": 640, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 2048, \"layer_types\": [\"sliding_attention\", \"sliding_attention\","
    " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\","
    " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"sliding_attention\","
    " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"sliding_attention\","
    " \"sliding_attention\", \"sliding_attention\", \"sliding_attention\", \"full_attention\"],"
    " \"max_position_embeddings\": 32768, \"model_type\": \"gemma3_text\", \"num_attention_heads\": 4,"
    " \"num_hidden_layers\": 18, \"num_key_value_heads\": 1, \"pad_token_id\": 0,"
    " \"query_pre_attn_scalar\": 256, \"rms_norm_eps\": 1e-06, \"rope_local_base_freq\": 10000.0,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"sliding_window\": 512,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.55.0.dev0\","
    " \"use_bidirectional_attention\": false, \"use_cache\": true, \"vocab_size\": 262144}";

/* A small Gemma 3 config with one field replaced by `extra` (a JSON member list, may be ""). */
static const char *gemma3_small(const char *extra)
{
    static char buf[2048];
    snprintf(buf, sizeof buf,
             "{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 64,"
             " \"intermediate_size\": 128, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
             " \"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 100%s%s}",
             *extra ? ", " : "", extra);
    return buf;
}

static void expect_config_error(const char *what, const char *json, enum status want,
                                const char *needle)
{
    struct model_config c;
    check_status(config_parse(json, "test.json", &c), want, what, "test.json", needle, NULL);
}

static void config_roundtrip(const char *what, const struct model_config *c)
{
    const char *path = tpath("config_rt.json");
    struct model_config back;
    memset(&back, 0, sizeof back);
    enum status s = config_save(path, c);
    if (!s) s = config_load(path, &back);
    check(s == STATUS_OK && config_equal(c, &back), "config: save/load round trip of %s%s%s", what,
          s ? ": " : "", s ? status_message() : "");
}

static void test_config(void)
{
    struct model_config c;
    enum status s = config_parse(llama3_json, "llama3.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_LLAMA && !strcmp(c.architecture, "LlamaForCausalLM") &&
              c.n_layers == 32 && c.d_model == 4096 && c.n_heads == 32 && c.n_kv_heads == 8 &&
              c.head_dim == 128 && c.ffn_hidden == 14336 && c.vocab_size == 128256 &&
              c.max_positions == 8192 && c.norm == NORM_KIND_RMSNORM && c.norm_eps == 1e-5f &&
              c.activation == ACTIVATION_SILU && c.gated_mlp && c.positions == POSITION_KIND_ROTARY &&
              c.rope_theta == 500000.0f && c.rope_style == ROPE_STYLE_HALVES && c.rot_dim == 128 &&
              c.sliding_window == 0 && !c.tied_embeddings && !c.qkv_bias && !c.attn_out_bias &&
              !c.mlp_bias && c.bos_id == 128000 && c.eos_id == 128001 && c.dtype == DTYPE_BF16,
          "config: Llama 3 (GQA, eos list, rope_scaling null, bf16) %s", s ? status_message() : "");
    if (!s) config_roundtrip("Llama 3", &c);

    s = config_parse(llama_min_json, "min.json", &c);
    check(s == STATUS_OK && c.n_kv_heads == 8 && c.head_dim == 8 && c.rope_theta == 10000.0f &&
              c.norm_eps == 1e-6f && c.max_positions == 2048 && !c.tied_embeddings && c.bos_id == -1 &&
              c.eos_id == -1 && c.dtype == DTYPE_F32 && c.rot_dim == 8,
          "config: minimal Llama takes the HF defaults %s", s ? status_message() : "");
    if (!s) {
        config_roundtrip("minimal Llama", &c);
        c.attn_out_bias = 1; /* the shardlm extras: a Qwen-like o bias split, partial rotary, pairs */
        c.rot_dim = 4;
        c.rope_style = ROPE_STYLE_PAIRS;
        config_roundtrip("Llama with shardlm extras (attention_out_bias, rot_dim, rope_style)", &c);
    }

    s = config_parse(mistral_json, "mistral.json", &c);
    check(s == STATUS_OK && !strcmp(c.architecture, "MistralForCausalLM") && c.sliding_window == 4096 &&
              c.n_kv_heads == 8 && c.max_positions == 32768 && c.bos_id == 1 && c.eos_id == 2,
          "config: Mistral 7B (sliding_window 4096) %s", s ? status_message() : "");
    if (!s) config_roundtrip("Mistral", &c);
    s = config_parse(mistral_nosw_json, "mistral2.json", &c);
    check(s == STATUS_OK && c.sliding_window == 0 && c.head_dim == 128 && c.d_model == 5120 &&
              c.rope_theta == 1000000.0f && c.dtype == DTYPE_F16 && c.max_positions == 131072,
          "config: Mistral (sliding_window null, explicit head_dim) %s", s ? status_message() : "");
    if (!s) config_roundtrip("Mistral without window", &c);

    s = config_parse(gpt2_json, "gpt2.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_GPT2 && c.d_model == 768 && c.n_layers == 12 &&
              c.n_heads == 12 && c.n_kv_heads == 12 && c.head_dim == 64 && c.ffn_hidden == 3072 &&
              c.vocab_size == 50257 && c.max_positions == 1024 && c.norm == NORM_KIND_LAYERNORM &&
              c.norm_eps == 1e-5f && c.activation == ACTIVATION_GELU_TANH && !c.gated_mlp &&
              c.positions == POSITION_KIND_LEARNED && c.tied_embeddings && c.qkv_bias &&
              c.attn_out_bias && c.mlp_bias && c.bos_id == 50256 && c.eos_id == 50256 &&
              c.dtype == DTYPE_F32,
          "config: GPT-2 (n_inner null, tied, biases, learned positions) %s", s ? status_message() : "");
    if (!s) config_roundtrip("GPT-2", &c);

    s = config_parse(shardlm_json, "shardlm.json", &c);
    check(s == STATUS_OK && c.rope_style == ROPE_STYLE_PAIRS && c.tied_embeddings && c.n_kv_heads == 4 &&
              c.norm_eps == 1e-5f,
          "config: shardlm metadata (\"architecture\", rope_style pairs) %s", s ? status_message() : "");
    if (!s) config_roundtrip("shardlm metadata", &c);

    s = config_parse(gemma3_270m_json, "gemma3.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_GEMMA3 && !strcmp(c.architecture, "Gemma3ForCausalLM") &&
              c.n_layers == 18 && c.d_model == 640 && c.n_heads == 4 && c.n_kv_heads == 1 &&
              c.head_dim == 256 && c.ffn_hidden == 2048 && c.vocab_size == 262144 &&
              c.max_positions == 32768 && c.norm == NORM_KIND_RMSNORM && c.norm_eps == 1e-6f &&
              c.activation == ACTIVATION_GELU_TANH && c.gated_mlp && c.positions == POSITION_KIND_ROTARY &&
              c.rope_theta == 1000000.0f && c.rope_theta_local == 10000.0f &&
              c.rope_style == ROPE_STYLE_HALVES && c.rot_dim == 256 && c.sliding_window == 512 &&
              c.sliding_window_pattern == 6 && c.attn_scale == 0.0625f && c.tied_embeddings &&
              !c.qkv_bias && !c.attn_out_bias && !c.mlp_bias && c.bos_id == 2 && c.eos_id == 1 &&
              c.dtype == DTYPE_BF16 && c.embed_scale == sqrtf(640.0f) && c.qk_norm && c.sandwich_norms &&
              c.norm_weight_offset == 1.0f,
          "config: Gemma 3 270M (layer_types, MQA, head_dim 256, local rope base, tied) %s",
          s ? status_message() : "");
    if (!s) {
        config_roundtrip("Gemma 3 270M", &c);
        c.norm_weight_offset = 0.0f; /* a GGUF-converted checkpoint */
        c.attn_scale = 1.0f / sqrtf(168.0f) * 1.0000001f;
        c.embed_scale = 25.25f;
        config_roundtrip("Gemma 3 with shardlm extras (norm_weight_offset 0, attn_scale, embed_scale)", &c);
    }
    s = config_parse(gemma3_small("\"sliding_window_pattern\": 2, \"query_pre_attn_scalar\": 144,"
                                  " \"tie_word_embeddings\": false"),
                     "gemma3_small.json", &c);
    check(s == STATUS_OK && c.sliding_window_pattern == 2 && c.sliding_window == 4096 &&
              c.max_positions == 131072 && c.attn_scale == (float)(1.0 / 12.0) && !c.tied_embeddings &&
              c.rope_theta == 1e6f && c.rope_theta_local == 1e4f && c.bos_id == -1 && c.dtype == DTYPE_F32,
          "config: Gemma 3 with sliding_window_pattern and HF defaults %s", s ? status_message() : "");
    if (!s) config_roundtrip("small Gemma 3", &c);
    s = config_parse(gemma3_small("\"layer_types\": [\"sliding_attention\", \"sliding_attention\","
                                  " \"sliding_attention\", \"sliding_attention\"]"),
                     "gemma3_all_local.json", &c);
    check(s == STATUS_OK && c.sliding_window_pattern == 0,
          "config: Gemma 3 with every layer sliding -> pattern 0 %s", s ? status_message() : "");
    s = config_parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"eos_token_id\": [1, 106],"
                     " \"torch_dtype\": \"bfloat16\", \"text_config\": {\"model_type\": \"gemma3_text\","
                     " \"hidden_size\": 1152, \"intermediate_size\": 6912, \"num_hidden_layers\": 26,"
                     " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"sliding_window\": 512,"
                     " \"vocab_size\": 262144, \"bos_token_id\": 2}, \"vision_config\": {\"hidden_size\": 1152}}",
                     "gemma3_mm.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_GEMMA3 && !strcmp(c.architecture, "Gemma3ForCausalLM") &&
              c.d_model == 1152 && c.n_layers == 26 && c.bos_id == 2 && c.eos_id == 1 && c.dtype == DTYPE_BF16,
          "config: Gemma3ForConditionalGeneration reads its text_config %s", s ? status_message() : "");
    /* Gemma 2: google/gemma-2-2b's config.json shape; soft-capping by default, null = none. */
    static const char g2[] =
        "{\"architectures\": [\"Gemma2ForCausalLM\"], \"model_type\": \"gemma2\", \"hidden_size\": 2304,"
        " \"intermediate_size\": 9216, \"num_hidden_layers\": 26, \"num_attention_heads\": 8,"
        " \"num_key_value_heads\": 4, \"head_dim\": 256, \"query_pre_attn_scalar\": 256,"
        " \"sliding_window\": 4096, \"vocab_size\": 256000, \"final_logit_softcapping\": 30.0,"
        " \"attn_logit_softcapping\": 50.0, \"torch_dtype\": \"float32\"}";
    s = config_parse(g2, "gemma2.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_GEMMA3 && !strcmp(c.architecture, "Gemma2ForCausalLM") &&
              !c.qk_norm && c.sandwich_norms && c.sliding_window_pattern == 2 && c.attn_softcap == 50.0f &&
              c.final_softcap == 30.0f && c.rope_theta == 10000.0f && c.rope_theta_local == 10000.0f &&
              c.max_positions == 8192 && c.tied_embeddings && c.attn_scale == 1.0f / 16.0f,
          "config: Gemma 2: soft-capping, every other layer windowed, one rotary base, no QK norm %s",
          s ? status_message() : "");
    if (!s) config_roundtrip("Gemma 2", &c);
    s = config_parse("{\"model_type\": \"gemma2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                     " \"num_hidden_layers\": 2, \"final_logit_softcapping\": null}", "g2.json", &c);
    check(s == STATUS_OK && c.final_softcap == 0.0f && c.attn_softcap == 50.0f,
          "config: Gemma 2 final_logit_softcapping null is none, attn_logit_softcapping absent is 50 %s",
          s ? status_message() : "");
    expect_config_error("config: Gemma 2 with a negative softcap",
                        "{\"model_type\": \"gemma2\", \"hidden_size\": 64, \"intermediate_size\": 128,"
                        " \"num_hidden_layers\": 2, \"attn_logit_softcapping\": -1}",
                        STATUS_BAD_FORMAT, "field 'attn_logit_softcapping' = -1 must be > 0");
    expect_config_error("config: Gemma 3 with final_logit_softcapping",
                        gemma3_small("\"final_logit_softcapping\": 30.0"), STATUS_UNSUPPORTED,
                        "field 'final_logit_softcapping'");
    expect_config_error("config: Gemma 3 with attn_logit_softcapping",
                        gemma3_small("\"attn_logit_softcapping\": 50.0"), STATUS_UNSUPPORTED,
                        "field 'attn_logit_softcapping'");
    expect_config_error("config: Gemma 3 with rope_scaling dynamic",
                        gemma3_small("\"rope_scaling\": {\"rope_type\": \"ntk-by-parts\", \"factor\": 8.0}"),
                        STATUS_UNSUPPORTED, "rope_scaling.rope_type \"ntk-by-parts\" is not supported");
    s = config_parse(gemma3_small("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}"), "g.json", &c);
    check(s == STATUS_OK && c.rope_scaling.kind == ROPE_SCALING_LINEAR && c.rope_scaling.factor == 8.0f,
          "config: Gemma 3 with linear rope_scaling (4B and up) %s", s ? status_message() : "");
    if (!s) config_roundtrip("Gemma 3 with linear rope_scaling", &c);
    expect_config_error("config: Gemma 3 with non-periodic layer_types",
                        gemma3_small("\"layer_types\": [\"sliding_attention\", \"full_attention\","
                                     " \"sliding_attention\", \"sliding_attention\"]"),
                        STATUS_UNSUPPORTED, "not periodic");
    expect_config_error("config: Gemma 3 with layer_types of the wrong length",
                        gemma3_small("\"layer_types\": [\"full_attention\"]"), STATUS_BAD_FORMAT,
                        "list of 4 strings");
    expect_config_error("config: Gemma 3 as an embedding model",
                        gemma3_small("\"use_bidirectional_attention\": true"), STATUS_UNSUPPORTED,
                        "use_bidirectional_attention");
    expect_config_error("config: Gemma3ForConditionalGeneration without text_config",
                        "{\"architectures\": [\"Gemma3ForConditionalGeneration\"]}", STATUS_UNSUPPORTED,
                        "text_config");

    expect_config_error("config: missing num_hidden_layers",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_attention_heads\": 8, \"vocab_size\": 512}",
                        STATUS_BAD_FORMAT, "missing field 'num_hidden_layers'");
    expect_config_error("config: hidden_size as a string",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": \"64\","
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512}",
                        STATUS_BAD_FORMAT, "field 'hidden_size' must be an integer");
    expect_config_error("config: fractional hidden_size",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64.5,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512}",
                        STATUS_BAD_FORMAT, "'hidden_size' = 64.5 is not a 32-bit integer");
    expect_config_error("config: tie_word_embeddings as a string",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512, \"tie_word_embeddings\": \"yes\"}",
                        STATUS_BAD_FORMAT, "'tie_word_embeddings' must be true or false");
    expect_config_error("config: unknown architecture",
                        "{\"architectures\": [\"FalconForCausalLM\"], \"hidden_size\": 64}",
                        STATUS_UNSUPPORTED, "\"FalconForCausalLM\" is not supported (supported: LlamaForCausalLM, ");
    /* Mixtures of experts: Mixtral's defaults (8 experts, top 2, renormalised, no window), Qwen 3
     * MoE's dense layers refused, a top-k beyond the experts refused. */
    s = config_parse("{\"model_type\": \"mixtral\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}", "mix.json", &c);
    check(s == STATUS_OK && c.n_experts == 8 && c.n_experts_used == 2 && c.moe_ffn == 96 && c.norm_topk_prob &&
              c.sliding_window == 0 && !strcmp(c.architecture, "MixtralForCausalLM"),
          "config: Mixtral defaults %s", s ? status_message() : "");
    if (!s) config_roundtrip("Mixtral", &c);
    s = config_parse("{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                     " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100, \"num_experts\": 6,"
                     " \"num_experts_per_tok\": 3, \"moe_intermediate_size\": 40, \"head_dim\": 16}", "q.json", &c);
    check(s == STATUS_OK && c.n_experts == 6 && c.n_experts_used == 3 && c.moe_ffn == 40 && !c.norm_topk_prob &&
              c.qk_norm == QK_NORM_HEAD,
          "config: Qwen 3 MoE %s", s ? status_message() : "");
    if (!s) config_roundtrip("Qwen 3 MoE", &c);
    expect_config_error("config: Qwen 3 MoE with dense layers",
                        "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                        " \"mlp_only_layers\": [1]}", STATUS_UNSUPPORTED, "dense layers among the experts");
    expect_config_error("config: OLMoE with top 9 of 4 experts",
                        "{\"model_type\": \"olmoe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                        " \"num_experts\": 4, \"num_experts_per_tok\": 9}", STATUS_BAD_FORMAT, "9 per token");
    /* GPT-OSS: gpt-oss-20b's config.json (as published, less its quantization_config, which is
     * refused by name): 32 experts of 2880, top 4 renormalised, alternating windows of 128 from a
     * sliding layer 0 (pattern 2: odd layers full), YaRN untruncated, the clamped SwiGLU, sinks,
     * biases; a non-periodic layer_types and another swiglu_limit refused. */
#define GPT_OSS_20B(x)                                                                                             \
    "{\"architectures\": [\"GptOssForCausalLM\"], \"attention_bias\": true, \"attention_dropout\": 0.0,"          \
    " \"eos_token_id\": 200002, \"experts_per_token\": 4, \"head_dim\": 64, \"hidden_act\": \"silu\","              \
    " \"hidden_size\": 2880, \"initial_context_length\": 4096, \"initializer_range\": 0.02,"                        \
    " \"intermediate_size\": 2880, \"layer_types\": [\"sliding_attention\", \"full_attention\","                    \
    " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\","   \
    " \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","       \
    " \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\","   \
    " \"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\","       \
    " \"sliding_attention\", \"full_attention\"], \"max_position_embeddings\": 131072, \"model_type\": \"gpt_oss\","  \
    " \"num_attention_heads\": 64, \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24,"                          \
    " \"num_key_value_heads\": 8, \"num_local_experts\": 32, \"output_router_logits\": false,"                     \
    " \"pad_token_id\": 199999, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"beta_fast\": 32.0,"                   \
    " \"beta_slow\": 1.0, \"factor\": 32.0, \"original_max_position_embeddings\": 4096, \"rope_type\": \"yarn\","    \
    " \"truncate\": false}, \"rope_theta\": 150000, \"router_aux_loss_coef\": 0.9, \"sliding_window\": 128,"         \
    " \"swiglu_limit\": 7.0, \"tie_word_embeddings\": false, \"transformers_version\": \"4.55.0.dev0\","             \
    " \"use_cache\": true, \"vocab_size\": 201088" x "}"
    s = config_parse(GPT_OSS_20B(""), "gpt-oss-20b.json", &c);
    check(s == STATUS_OK && !strcmp(c.architecture, "GptOssForCausalLM") && c.n_layers == 24 && c.d_model == 2880 &&
              c.n_heads == 64 && c.n_kv_heads == 8 && c.head_dim == 64 && c.n_experts == 32 && c.n_experts_used == 4 &&
              c.moe_ffn == 2880 && c.norm_topk_prob && c.sliding_window == 128 && c.sliding_window_pattern == 2 &&
              c.rope_theta == 150000.0f && c.rope_scaling.kind == ROPE_SCALING_YARN && c.rope_scaling.untruncated &&
              c.rope_scaling.factor == 32.0f && c.rope_scaling.original_max_positions == 4096 &&
              c.activation == ACTIVATION_SWIGLU_OAI && c.attn_sinks && c.moe_bias && c.qkv_bias && c.attn_out_bias &&
              !c.tied_embeddings && c.eos_id == 200002 && c.vocab_size == 201088 && c.norm_eps == 1e-5f,
          "config: gpt-oss-20b %s", s ? status_message() : "");
    if (!s) config_roundtrip("gpt-oss-20b", &c);
    s = config_parse(GPT_OSS_20B(", \"quantization_config\": {\"modules_to_not_convert\": [\"model.layers.*.self_attn\"],"
                                 " \"quant_method\": \"mxfp4\"}"), "gpt-oss-20b.json", &c);
    check(s == STATUS_OK && c.moe_bias, "config: gpt-oss-20b with its MXFP4 quantization_config %s",
          s ? status_message() : "");
    expect_config_error("config: GPT-OSS with a GPTQ quantization_config",
                        GPT_OSS_20B(", \"quantization_config\": {\"quant_method\": \"gptq\"}"), STATUS_UNSUPPORTED,
                        "quant_method \"gptq\" is not supported (mxfp4 is)");
    expect_config_error("config: GPT-OSS with swiglu_limit 8",
                        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, \"intermediate_size\": 32,"
                        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                        " \"swiglu_limit\": 8}", STATUS_UNSUPPORTED, "'swiglu_limit' = 8: only 7");
    expect_config_error("config: GPT-OSS with a layer_types list that no period describes",
                        "{\"model_type\": \"gpt_oss\", \"hidden_size\": 64, \"intermediate_size\": 32,"
                        " \"num_hidden_layers\": 3, \"num_attention_heads\": 4, \"vocab_size\": 100,"
                        " \"layer_types\": [\"full_attention\", \"sliding_attention\", \"sliding_attention\"]}",
                        STATUS_UNSUPPORTED, "is not periodic");
#undef GPT_OSS_20B
#define LLAMA_WITH(x)                                                                                              \
    "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 172,"                     \
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"vocab_size\": 512, " x "}"
    expect_config_error("config: llama3 rope_scaling without original_max_position_embeddings",
                        LLAMA_WITH("\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}"), STATUS_BAD_FORMAT,
                        "missing field 'original_max_position_embeddings'");
    expect_config_error("config: longrope rope_scaling with factor lists of the wrong length",
                        LLAMA_WITH("\"rope_scaling\": {\"type\": \"longrope\", \"long_factor\": [1], \"short_factor\": [1]}"),
                        STATUS_BAD_FORMAT, "short_factor must be a list of rot_dim / 2 = 4 numbers");
    expect_config_error("config: heads of 1024 features, all rotated (the rope table holds 256 pairs)",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 2048, \"intermediate_size\": 172,"
                        " \"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"vocab_size\": 512}",
                        STATUS_UNSUPPORTED, "rot_dim 1024: at most 512 rotated features a head are supported");
    s = config_parse(LLAMA_WITH("\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}"), "dyn.json", &c);
    check(s == STATUS_OK && c.rope_scaling.kind == ROPE_SCALING_DYNAMIC && c.rope_scaling.factor == 2.0f,
          "config: dynamic NTK rope_scaling (exact within max_position_embeddings) %s", s ? status_message() : "");
    if (!s) config_roundtrip("dynamic rope_scaling", &c);
    {
        struct model_config c4;
        enum status s4 = config_parse(
            "{\"architectures\": [\"Phi3ForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": 172,"
            " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 512, \"partial_rotary_factor\": 0.75,"
            " \"max_position_embeddings\": 131072, \"original_max_position_embeddings\": 4096, \"sliding_window\": 262144,"
            " \"rope_scaling\": {\"type\": \"longrope\", \"short_factor\": [1, 1.5, 2, 2.5, 3, 3.5],"
            " \"long_factor\": [2, 3, 4, 5, 6, 7]}}",
            "phi.json", &c4);
        check(s4 == STATUS_OK && c4.rot_dim == 12 && c4.head_dim == 16 && c4.max_positions == 4096 &&
                  c4.sliding_window == 262144 && c4.rope_scaling.kind == ROPE_SCALING_LONGROPE &&
                  c4.rope_scaling.factors[1] == 1.5f &&
                  fabsf(c4.rope_scaling.attention_factor - (float)sqrt(1.0 + log(32.0) / log(4096.0))) < 1e-6f,
              "config: Phi-3 (partial rotary 0.75, longrope: short factors, context capped at the original 4096, "
              "attention factor) %s", s4 ? status_message() : "");
        if (!s4) config_roundtrip("Phi-3 longrope", &c4);
    }
    expect_config_error("config: rope_scaling factor below 1",
                        LLAMA_WITH("\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}"), STATUS_BAD_FORMAT,
                        "factor = 0.5 must be >= 1");
    expect_config_error("config: YaRN with DeepSeek's mscale",
                        LLAMA_WITH("\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0, \"mscale\": 1.0}"),
                        STATUS_UNSUPPORTED, "mscale");
    {
        struct model_config c3;
        enum status s3 = config_parse(LLAMA_WITH("\"max_position_embeddings\": 131072, \"rope_scaling\": {\"rope_type\": "
                                                 "\"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": "
                                                 "4.0, \"original_max_position_embeddings\": 8192}"),
                                      "l31.json", &c3);
        check(s3 == STATUS_OK && c3.rope_scaling.kind == ROPE_SCALING_LLAMA3 && c3.rope_scaling.factor == 8.0f &&
                  c3.rope_scaling.original_max_positions == 8192,
              "config: Llama 3.1 rope_scaling llama3 %s", s3 ? status_message() : "");
        if (!s3) config_roundtrip("Llama 3.1 rope_scaling", &c3);
        s3 = config_parse(LLAMA_WITH("\"max_position_embeddings\": 131072, \"rope_scaling\": {\"type\": \"yarn\", "
                                     "\"factor\": 4.0, \"original_max_position_embeddings\": 32768}"),
                          "yarn.json", &c3);
        check(s3 == STATUS_OK && c3.rope_scaling.kind == ROPE_SCALING_YARN && c3.rope_scaling.factor == 4.0f &&
                  fabsf(c3.rope_scaling.attention_factor - (float)(0.1 * log(4.0) + 1.0)) < 1e-6f,
              "config: YaRN rope_scaling: factor = max / original, attention factor 0.1 ln(factor) + 1 %s",
              s3 ? status_message() : "");
        if (!s3) config_roundtrip("YaRN rope_scaling", &c3);
    }
#undef LLAMA_WITH
    expect_config_error("config: n_heads not a multiple of n_kv_heads",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"num_key_value_heads\": 3, \"vocab_size\": 512}",
                        STATUS_BAD_FORMAT, "n_kv_heads 3");
    expect_config_error("config: eos outside the vocabulary",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512, \"eos_token_id\": 512}",
                        STATUS_BAD_FORMAT, "outside the vocabulary");
    expect_config_error("config: bad rope_style",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512, \"rope_style\": \"spiral\"}",
                        STATUS_BAD_FORMAT, "rope_style");
    expect_config_error("config: unsupported torch_dtype",
                        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64,"
                        " \"intermediate_size\": 172, \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
                        " \"vocab_size\": 512, \"torch_dtype\": \"int8\"}",
                        STATUS_UNSUPPORTED, "torch_dtype");
    expect_config_error("config: GPT-2 with relu",
                        "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, \"n_layer\": 2,"
                        " \"n_head\": 4, \"n_positions\": 32, \"vocab_size\": 100,"
                        " \"activation_function\": \"relu\"}",
                        STATUS_UNSUPPORTED, "activation_function");
    expect_config_error("config: GPT-2 without n_positions / n_ctx",
                        "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 64, \"n_layer\": 2,"
                        " \"n_head\": 4, \"vocab_size\": 100}",
                        STATUS_BAD_FORMAT, "missing field 'n_positions'");
    expect_config_error("config: no architecture at all", "{\"hidden_size\": 64}", STATUS_BAD_FORMAT,
                        "missing field 'architectures'");
    expect_config_error("config: not JSON", "{\"architectures\": [", STATUS_BAD_FORMAT, "not valid JSON");
    check_status(config_load(tpath("no_such_config.json"), &c), STATUS_NOT_FOUND,
                 "config: load a missing file", "no_such_config.json", NULL);
}

/* BertModel (an encoder, config_bert.c): all-MiniLM-L6-v2's own config.json, BertConfig's
 * defaults, and what is refused by name. */
static void test_config_bert(void)
{
    static const char *const minilm_json =
        "{\"_name_or_path\": \"nreimers/MiniLM-L6-H384-uncased\", \"architectures\": [\"BertModel\"],"
        " \"attention_probs_dropout_prob\": 0.1, \"gradient_checkpointing\": false, \"hidden_act\": \"gelu\","
        " \"hidden_dropout_prob\": 0.1, \"hidden_size\": 384, \"initializer_range\": 0.02,"
        " \"intermediate_size\": 1536, \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 512,"
        " \"model_type\": \"bert\", \"num_attention_heads\": 12, \"num_hidden_layers\": 6, \"pad_token_id\": 0,"
        " \"position_embedding_type\": \"absolute\", \"transformers_version\": \"4.8.2\","
        " \"type_vocab_size\": 2, \"use_cache\": true, \"vocab_size\": 30522}";
    struct model_config c;
    enum status s = config_parse(minilm_json, "minilm.json", &c);
    check(s == STATUS_OK && c.family == MODEL_FAMILY_BERT && c.encoder && c.post_ln && c.embed_norm &&
              c.type_vocab_size == 2 && c.n_layers == 6 && c.d_model == 384 && c.n_heads == 12 && c.n_kv_heads == 12 &&
              c.head_dim == 32 && c.ffn_hidden == 1536 && c.vocab_size == 30522 && c.max_positions == 512 &&
              c.norm == NORM_KIND_LAYERNORM && c.norm_eps == 1e-12f && c.activation == ACTIVATION_GELU_ERF &&
              !c.gated_mlp && c.positions == POSITION_KIND_LEARNED && c.qkv_bias && c.attn_out_bias && c.mlp_bias &&
              !c.tied_embeddings && !weight_kind_exists(&c, WEIGHT_KIND_LM_HEAD) &&
              !weight_kind_exists(&c, WEIGHT_KIND_FINAL_NORM) && weight_kind_exists(&c, WEIGHT_KIND_ATTN_NORM_BIAS) &&
              weight_kind_exists(&c, WEIGHT_KIND_TYPE_EMBEDDING) && weight_kind_exists(&c, WEIGHT_KIND_EMBED_NORM_BIAS),
          "config: all-MiniLM-L6-v2 (BertModel: an encoder, post-LN, token types) %s", s ? status_message() : "");
    s = config_parse("{\"model_type\": \"bert\", \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                     " \"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100}", "bert.json", &c);
    check(s == STATUS_OK && c.max_positions == 512 && c.type_vocab_size == 2 && c.norm_eps == 1e-12f &&
              c.activation == ACTIVATION_GELU_ERF,
          "config: BertConfig's defaults (model_type bert) %s", s ? status_message() : "");
    if (s == STATUS_OK)
        check_status(config_save(tpath("bert_config.json"), &c), STATUS_UNSUPPORTED, "config: an encoder is not saved",
                     "encoder", NULL);
    static const struct {
        const char *what, *extra, *needle;
    } bad[] = {
        {"is_decoder", "\"is_decoder\": true", "is_decoder"},
        {"relative positions", "\"position_embedding_type\": \"relative_key\"", "position_embedding_type"},
        {"silu", "\"hidden_act\": \"silu\"", "hidden_act"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[512], what[96];
        snprintf(json, sizeof json,
                 "{\"architectures\": [\"BertModel\"], \"hidden_size\": 64, \"num_hidden_layers\": 2,"
                 " \"num_attention_heads\": 4, \"intermediate_size\": 128, \"vocab_size\": 100, %s}", bad[i].extra);
        snprintf(what, sizeof what, "config: BERT with %s", bad[i].what);
        expect_config_error(what, json, STATUS_UNSUPPORTED, bad[i].needle);
    }
}

/* ---- checkpoints ------------------------------------------------------------------------ */

#define TM_MAX_LAYERS 4

/* A tiny random model: its canonical tensors (checkpoint.h's layout), kept here as the truth. */
struct tmodel {
    const char         *name;
    const char         *hf_prefix; /* HF body prefix for Llama / Gemma names; NULL: "model." */
    struct model_config cfg;
    void               *w[WEIGHT_KIND_COUNT][TM_MAX_LAYERS]; /* canonical, cfg.dtype */
};

/* The canonical shape, restated here from checkpoint.h (not taken from the library). */
static void tm_shape(const struct model_config *c, enum weight_kind k, int *ndim, int64_t *rows,
                     int64_t *cols)
{
    int64_t d = c->d_model, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, f = c->ffn_hidden;
    *ndim = 2;
    *cols = d;
    switch (k) {
    case WEIGHT_KIND_TOK_EMBEDDING: case WEIGHT_KIND_LM_HEAD: *rows = c->vocab_size; break;
    case WEIGHT_KIND_POS_EMBEDDING: *rows = c->max_positions; break;
    case WEIGHT_KIND_Q: *rows = q; break;
    case WEIGHT_KIND_K: case WEIGHT_KIND_V: *rows = kv; break;
    case WEIGHT_KIND_O: *rows = d, *cols = q; break;
    case WEIGHT_KIND_GATE: case WEIGHT_KIND_UP: *rows = f; break;
    case WEIGHT_KIND_DOWN: *rows = d, *cols = f; break;
    case WEIGHT_KIND_Q_BIAS: *ndim = 1, *rows = q, *cols = 1; break;
    case WEIGHT_KIND_K_BIAS: case WEIGHT_KIND_V_BIAS: *ndim = 1, *rows = kv, *cols = 1; break;
    case WEIGHT_KIND_GATE_BIAS: case WEIGHT_KIND_UP_BIAS: *ndim = 1, *rows = f, *cols = 1; break;
    case WEIGHT_KIND_Q_NORM: case WEIGHT_KIND_K_NORM: *ndim = 1, *rows = c->head_dim, *cols = 1; break;
    default: *ndim = 1, *rows = d, *cols = 1; break;
    }
}

static int tm_layers(enum weight_kind k, const struct tmodel *m)
{
    return weight_kind_per_layer(k) ? m->cfg.n_layers : 1;
}

static void tm_init(struct tmodel *m)
{
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        if (!weight_kind_exists(&m->cfg, (enum weight_kind)k)) continue;
        if (k == WEIGHT_KIND_LM_HEAD && m->cfg.tied_embeddings) continue;
        for (int l = 0; l < tm_layers((enum weight_kind)k, m); l++) {
            int nd;
            int64_t r, c;
            tm_shape(&m->cfg, (enum weight_kind)k, &nd, &r, &c);
            m->w[k][l] = malloc((size_t)(r * c) * dtype_size(m->cfg.dtype));
            fill_random(m->w[k][l], m->cfg.dtype, (size_t)(r * c));
        }
    }
}

static void tm_free(struct tmodel *m)
{
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++)
        for (int l = 0; l < TM_MAX_LAYERS; l++) free(m->w[k][l]);
}

static const void *tm_weight(const struct tmodel *m, enum weight_kind k, int l)
{
    if (k == WEIGHT_KIND_LM_HEAD && m->cfg.tied_embeddings) k = WEIGHT_KIND_TOK_EMBEDDING;
    return m->w[k][weight_kind_per_layer(k) ? l : 0];
}

/* The slice rank r of tp must get, computed from the rules of checkpoint.h. Returns bytes. */
static size_t tm_expected(const struct tmodel *m, enum weight_kind k, int l, int r, int tp, void *out,
                          int64_t *out_rows, int64_t *out_cols)
{
    const struct model_config *c = &m->cfg;
    int nd;
    int64_t rows, cols, r0 = 0, nr, c0 = 0, nc, hd = c->head_dim;
    tm_shape(c, k, &nd, &rows, &cols);
    nr = rows, nc = cols;
    switch (k) {
    case WEIGHT_KIND_Q: case WEIGHT_KIND_Q_BIAS: nr = c->n_heads / tp * hd, r0 = r * nr; break;
    case WEIGHT_KIND_K: case WEIGHT_KIND_V: case WEIGHT_KIND_K_BIAS: case WEIGHT_KIND_V_BIAS:
        if (c->n_kv_heads >= tp) nr = c->n_kv_heads / tp * hd, r0 = r * nr;
        else nr = hd, r0 = (int64_t)(r / (tp / c->n_kv_heads)) * hd; /* tp/n_kv ranks share a head */
        break;
    case WEIGHT_KIND_GATE: case WEIGHT_KIND_UP: case WEIGHT_KIND_GATE_BIAS: case WEIGHT_KIND_UP_BIAS:
        nr = c->ffn_hidden / tp, r0 = r * nr;
        break;
    case WEIGHT_KIND_O: nc = c->n_heads / tp * hd, c0 = r * nc; break;
    case WEIGHT_KIND_DOWN: nc = c->ffn_hidden / tp, c0 = r * nc; break;
    case WEIGHT_KIND_TOK_EMBEDDING: case WEIGHT_KIND_LM_HEAD:
        nr = (rows + tp - 1) / tp, r0 = r * nr;
        break;
    default: break;
    }
    size_t es = dtype_size(c->dtype);
    const unsigned char *src = tm_weight(m, k, l);
    unsigned char *dst = out;
    for (int64_t i = 0; i < nr; i++) {
        if (r0 + i >= rows) memset(dst + (size_t)(i * nc) * es, 0, (size_t)nc * es);
        else memcpy(dst + (size_t)(i * nc) * es, src + (size_t)((r0 + i) * cols + c0) * es, (size_t)nc * es);
    }
    *out_rows = nr;
    *out_cols = nc;
    return (size_t)(nr * nc) * es;
}

static int tp_fits(const struct model_config *c, int tp)
{
    return c->n_heads % tp == 0 && c->ffn_hidden % tp == 0 &&
           (c->n_kv_heads % tp == 0 || tp % c->n_kv_heads == 0);
}

/* HF Llama names, or Gemma 3's (post_attention_layernorm is then the attention-output norm and
 * pre_feedforward_layernorm the pre-MLP one), under m->hf_prefix. */
static const char *hf_llama_name(const struct tmodel *m, enum weight_kind k, int l, char *buf, size_t n)
{
    int gemma = m->cfg.family == MODEL_FAMILY_GEMMA3;
    const char *fmt = NULL;
    switch (k) {
    case WEIGHT_KIND_TOK_EMBEDDING: fmt = "model.embed_tokens.weight"; break;
    case WEIGHT_KIND_LM_HEAD: fmt = "lm_head.weight"; break;
    case WEIGHT_KIND_FINAL_NORM: fmt = "model.norm.weight"; break;
    case WEIGHT_KIND_ATTN_NORM: fmt = "model.layers.%d.input_layernorm.weight"; break;
    case WEIGHT_KIND_MLP_NORM:
        fmt = gemma ? "model.layers.%d.pre_feedforward_layernorm.weight"
                    : "model.layers.%d.post_attention_layernorm.weight";
        break;
    case WEIGHT_KIND_POST_ATTN_NORM: fmt = "model.layers.%d.post_attention_layernorm.weight"; break;
    case WEIGHT_KIND_POST_MLP_NORM: fmt = "model.layers.%d.post_feedforward_layernorm.weight"; break;
    case WEIGHT_KIND_Q_NORM: fmt = "model.layers.%d.self_attn.q_norm.weight"; break;
    case WEIGHT_KIND_K_NORM: fmt = "model.layers.%d.self_attn.k_norm.weight"; break;
    case WEIGHT_KIND_Q: fmt = "model.layers.%d.self_attn.q_proj.weight"; break;
    case WEIGHT_KIND_K: fmt = "model.layers.%d.self_attn.k_proj.weight"; break;
    case WEIGHT_KIND_V: fmt = "model.layers.%d.self_attn.v_proj.weight"; break;
    case WEIGHT_KIND_O: fmt = "model.layers.%d.self_attn.o_proj.weight"; break;
    case WEIGHT_KIND_Q_BIAS: fmt = "model.layers.%d.self_attn.q_proj.bias"; break;
    case WEIGHT_KIND_K_BIAS: fmt = "model.layers.%d.self_attn.k_proj.bias"; break;
    case WEIGHT_KIND_V_BIAS: fmt = "model.layers.%d.self_attn.v_proj.bias"; break;
    case WEIGHT_KIND_O_BIAS: fmt = "model.layers.%d.self_attn.o_proj.bias"; break;
    case WEIGHT_KIND_GATE: fmt = "model.layers.%d.mlp.gate_proj.weight"; break;
    case WEIGHT_KIND_UP: fmt = "model.layers.%d.mlp.up_proj.weight"; break;
    case WEIGHT_KIND_DOWN: fmt = "model.layers.%d.mlp.down_proj.weight"; break;
    case WEIGHT_KIND_GATE_BIAS: fmt = "model.layers.%d.mlp.gate_proj.bias"; break;
    case WEIGHT_KIND_UP_BIAS: fmt = "model.layers.%d.mlp.up_proj.bias"; break;
    case WEIGHT_KIND_DOWN_BIAS: fmt = "model.layers.%d.mlp.down_proj.bias"; break;
    default: return NULL;
    }
    char local[256];
    snprintf(local, sizeof local, fmt, l);
    if (m->hf_prefix && !strncmp(local, "model.", 6)) snprintf(buf, n, "%s%s", m->hf_prefix, local + 6);
    else snprintf(buf, n, "%s", local);
    return buf;
}

/* Writes m as an HF Llama checkpoint into dir: model.safetensors, or (n_shards 2) two shards
 * and an index. skip / bad_shape name a tensor to leave out / write with one column fewer. */
static enum status write_hf_llama(const struct tmodel *m, const char *dir, int n_shards,
                                  const char *skip, const char *bad_shape)
{
    enum status s;
    char path[4096], name[256];
    struct safetensors_writer *w[2] = {NULL, NULL};
    char index[8192];
    int off = snprintf(index, sizeof index, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((s = config_save(path, &m->cfg))) return s;
    for (int i = 0; i < n_shards; i++) {
        if (n_shards == 1) snprintf(path, sizeof path, "%s/model.safetensors", dir);
        else snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, i + 1, n_shards);
        if ((s = safetensors_writer_begin(path, &w[i]))) goto out;
    }
    int first = 1;
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        for (int l = 0; l < TM_MAX_LAYERS; l++) {
            if (!m->w[k][l]) continue;
            hf_llama_name(m, (enum weight_kind)k, l, name, sizeof name);
            if (skip && !strcmp(skip, name)) continue;
            int nd;
            int64_t shape[2];
            tm_shape(&m->cfg, (enum weight_kind)k, &nd, &shape[0], &shape[1]);
            if (bad_shape && !strcmp(bad_shape, name)) shape[1]--;
            int shard = n_shards == 1 ? 0 : (weight_kind_per_layer((enum weight_kind)k) && l > 0);
            if ((s = safetensors_writer_add(w[shard], name, m->cfg.dtype, nd, shape, m->w[k][l]))) goto out;
            if (n_shards > 1)
                off += snprintf(index + off, sizeof index - (size_t)off,
                                "%s\"%s\": \"model-%05d-of-%05d.safetensors\"", first ? "" : ", ", name,
                                shard + 1, n_shards);
            first = 0;
        }
    }
    for (int i = 0; i < n_shards; i++) {
        s = safetensors_writer_finish(w[i]);
        w[i] = NULL;
        if (s) goto out;
    }
    if (n_shards > 1) {
        snprintf(index + off, sizeof index - (size_t)off, "}}\n");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        if (!write_text(path, index)) s = status_errorf(STATUS_IO, "%s", path);
    }
out:
    safetensors_writer_free(w[0]);
    safetensors_writer_free(w[1]);
    return s;
}

/* Writes m as an HF GPT-2 checkpoint ("transformer." names, Conv1D (in, out) weights, fused
 * c_attn, an attention-mask buffer that readers ignore). */
static enum status write_hf_gpt2(const struct tmodel *m, const char *dir)
{
    const struct model_config *c = &m->cfg;
    enum status s;
    char path[4096], name[256];
    struct safetensors_writer *w = NULL;
    int64_t d = c->d_model, f = c->ffn_hidden, L = c->n_layers, P = c->max_positions;
    size_t es = dtype_size(c->dtype);
    unsigned char *bufs[TM_MAX_LAYERS][5] = {{0}};
    float *mask = calloc((size_t)(P * P), sizeof *mask);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((s = config_save(path, c))) goto out;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if ((s = safetensors_writer_begin(path, &w))) goto out;
#define ADD(shape_nd, data, ...)                                                                \
    do {                                                                                       \
        snprintf(name, sizeof name, __VA_ARGS__);                                              \
        if ((s = safetensors_writer_add(w, name, c->dtype, shape_nd, shp, data))) goto out;     \
    } while (0)
    int64_t shp[4];
    shp[0] = c->vocab_size, shp[1] = d;
    ADD(2, m->w[WEIGHT_KIND_TOK_EMBEDDING][0], "transformer.wte.weight");
    shp[0] = P;
    ADD(2, m->w[WEIGHT_KIND_POS_EMBEDDING][0], "transformer.wpe.weight");
    shp[0] = d;
    ADD(1, m->w[WEIGHT_KIND_FINAL_NORM][0], "transformer.ln_f.weight");
    ADD(1, m->w[WEIGHT_KIND_FINAL_NORM_BIAS][0], "transformer.ln_f.bias");
    for (int l = 0; l < L; l++) {
        /* Conv1D (in, out): element [i][j] = canonical [j][i]. */
        unsigned char *attn = bufs[l][0] = malloc((size_t)(d * 3 * d) * es);
        unsigned char *attn_b = bufs[l][1] = malloc((size_t)(3 * d) * es);
        unsigned char *proj = bufs[l][2] = malloc((size_t)(d * d) * es);
        unsigned char *fc = bufs[l][3] = malloc((size_t)(d * f) * es);
        unsigned char *fc2 = bufs[l][4] = malloc((size_t)(f * d) * es);
        for (int part = 0; part < 3; part++) {
            const unsigned char *src = m->w[WEIGHT_KIND_Q + 2 * part][l];
            for (int64_t i = 0; i < d; i++)
                for (int64_t j = 0; j < d; j++)
                    memcpy(attn + (size_t)(i * 3 * d + part * d + j) * es, src + (size_t)(j * d + i) * es, es);
            memcpy(attn_b + (size_t)(part * d) * es, m->w[WEIGHT_KIND_Q_BIAS + 2 * part][l], (size_t)d * es);
        }
        for (int64_t i = 0; i < d; i++)
            for (int64_t j = 0; j < d; j++)
                memcpy(proj + (size_t)(i * d + j) * es,
                       (const unsigned char *)m->w[WEIGHT_KIND_O][l] + (size_t)(j * d + i) * es, es);
        for (int64_t i = 0; i < d; i++)
            for (int64_t j = 0; j < f; j++)
                memcpy(fc + (size_t)(i * f + j) * es,
                       (const unsigned char *)m->w[WEIGHT_KIND_UP][l] + (size_t)(j * d + i) * es, es);
        for (int64_t i = 0; i < f; i++)
            for (int64_t j = 0; j < d; j++)
                memcpy(fc2 + (size_t)(i * d + j) * es,
                       (const unsigned char *)m->w[WEIGHT_KIND_DOWN][l] + (size_t)(j * f + i) * es, es);
        shp[0] = d;
        ADD(1, m->w[WEIGHT_KIND_ATTN_NORM][l], "transformer.h.%d.ln_1.weight", l);
        ADD(1, m->w[WEIGHT_KIND_ATTN_NORM_BIAS][l], "transformer.h.%d.ln_1.bias", l);
        ADD(1, m->w[WEIGHT_KIND_MLP_NORM][l], "transformer.h.%d.ln_2.weight", l);
        ADD(1, m->w[WEIGHT_KIND_MLP_NORM_BIAS][l], "transformer.h.%d.ln_2.bias", l);
        ADD(1, m->w[WEIGHT_KIND_O_BIAS][l], "transformer.h.%d.attn.c_proj.bias", l);
        ADD(1, m->w[WEIGHT_KIND_DOWN_BIAS][l], "transformer.h.%d.mlp.c_proj.bias", l);
        shp[0] = 3 * d;
        ADD(1, attn_b, "transformer.h.%d.attn.c_attn.bias", l);
        shp[0] = f;
        ADD(1, m->w[WEIGHT_KIND_UP_BIAS][l], "transformer.h.%d.mlp.c_fc.bias", l);
        shp[0] = d, shp[1] = 3 * d;
        ADD(2, attn, "transformer.h.%d.attn.c_attn.weight", l);
        shp[0] = d, shp[1] = d;
        ADD(2, proj, "transformer.h.%d.attn.c_proj.weight", l);
        shp[0] = d, shp[1] = f;
        ADD(2, fc, "transformer.h.%d.mlp.c_fc.weight", l);
        shp[0] = f, shp[1] = d;
        ADD(2, fc2, "transformer.h.%d.mlp.c_proj.weight", l);
        shp[0] = 1, shp[1] = 1, shp[2] = P, shp[3] = P;
        snprintf(name, sizeof name, "transformer.h.%d.attn.bias", l);
        if ((s = safetensors_writer_add(w, name, DTYPE_F32, 4, shp, mask))) goto out;
    }
#undef ADD
    s = safetensors_writer_finish(w);
    w = NULL;
out:
    safetensors_writer_free(w);
    for (int l = 0; l < TM_MAX_LAYERS; l++)
        for (int i = 0; i < 5; i++) free(bufs[l][i]);
    free(mask);
    return s;
}

/* Every weight of m at every tp in {1, 2, 4} that partitions it, from ck, against the truth. */
static void check_all_slices(const struct tmodel *m, const char *dir, const char *label)
{
    struct checkpoint *ck = NULL;
    enum status s = checkpoint_open(dir, &ck);
    check_status(s, STATUS_OK, label, NULL);
    if (s) return;
    check(config_equal(&ck->cfg, &m->cfg), "%s: config.json reads back as written", label);
    size_t cap = 1 << 20;
    unsigned char *got = aligned_alloc(64, cap), *want = aligned_alloc(64, cap);
    float *got32 = aligned_alloc(64, cap * 2);
    for (int tp = 1; tp <= 4; tp *= 2) {
        if (!tp_fits(&m->cfg, tp)) continue;
        int n = 0, bad = 0, zc = 0, conv_bad = 0;
        for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
            if (!weight_kind_exists(&m->cfg, (enum weight_kind)k)) continue;
            for (int l = 0; l < tm_layers((enum weight_kind)k, m); l++) {
                for (int r = 0; r < tp; r++) {
                    int64_t er, ec;
                    size_t nbytes = tm_expected(m, (enum weight_kind)k, l, r, tp, want, &er, &ec);
                    struct host_weight hw, hz;
                    memset(got, 0xa5, nbytes + 64);
                    s = checkpoint_get(ck, (enum weight_kind)k, l, r, tp, m->cfg.dtype, got, cap, 0, &hw);
                    int ok = s == STATUS_OK && hw.nbytes == nbytes && hw.data == got && !hw.zero_copy &&
                             hw.shape[0] == er && (hw.ndim == 1 || hw.shape[1] == ec) &&
                             !memcmp(got, want, nbytes);
                    /* The zero-copy path hands out the same bytes. */
                    enum status sz = checkpoint_get(ck, (enum weight_kind)k, l, r, tp, m->cfg.dtype, got,
                                                    cap, CHECKPOINT_GET_ZERO_COPY_OK, &hz);
                    ok &= sz == STATUS_OK && !memcmp(hz.data, want, nbytes);
                    zc += sz == STATUS_OK && hz.zero_copy;
                    /* Converted to f32 (or bf16 for an f32 model), element by element. */
                    enum dtype other = m->cfg.dtype == DTYPE_F32 ? DTYPE_BF16 : DTYPE_F32;
                    struct host_weight hc;
                    if (checkpoint_get(ck, (enum weight_kind)k, l, r, tp, other, got32, cap * 2, 0, &hc) ||
                        hc.nbytes != (size_t)(er * ec) * dtype_size(other)) {
                        conv_bad++;
                    } else {
                        for (int64_t i = 0; i < er * ec; i++) {
                            float v = dtype_load_f32(want, m->cfg.dtype, (size_t)i);
                            if (other == DTYPE_F32 ? got32[i] != v
                                                   : ((uint16_t *)got32)[i] != f32_to_bf16(v)) {
                                conv_bad++;
                                break;
                            }
                        }
                    }
                    if (!ok && bad < 3)
                        printf("     mismatch: %s layer %d rank %d/%d: %s %s\n",
                               weight_kind_name((enum weight_kind)k), l, r, tp, status_name(s),
                               s ? status_message() : "");
                    bad += !ok;
                    n++;
                }
            }
        }
        check(bad == 0 && conv_bad == 0,
              "%s: tp=%d: %d slices byte-identical to the expected canonical slices (%d zero-copy), "
              "conversions exact",
              label, tp, n, zc);
    }
    free(got);
    free(want);
    free(got32);
    checkpoint_close(ck);
}

static void zero_copy_case(struct checkpoint *ck, const char *label, enum weight_kind k, int r, int tp,
                           enum dtype dt, int want)
{
    struct host_weight hw;
    enum status s = checkpoint_describe(ck, k, 0, r, tp, dt, &hw);
    check(s == STATUS_OK && hw.zero_copy == want && (want ? hw.data != NULL : hw.data == NULL),
          "zero-copy: %s %s rank %d/%d as %s -> %s", label, weight_kind_name(k), r, tp, dtype_name(dt),
          s ? status_message() : hw.zero_copy ? "pointer into the mapping" : "copy");
}

static void test_checkpoints(void)
{
    enum status s;
    /* Llama, GQA (4 heads, 2 KV heads), biases on attention and MLP, untied, bf16, odd vocab. */
    struct tmodel llama = {.name = "llama"};
    s = config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 24,"
                     " \"intermediate_size\": 40, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
                     " \"num_key_value_heads\": 2, \"vocab_size\": 37, \"max_position_embeddings\": 64,"
                     " \"attention_bias\": true, \"mlp_bias\": true, \"torch_dtype\": \"bfloat16\","
                     " \"bos_token_id\": 1, \"eos_token_id\": 2}",
                     "llama", &llama.cfg);
    CHECK(s == STATUS_OK, "%s", status_message());
    /* Llama, MQA (1 KV head), head_dim 8 != d_model / n_heads, tied, no biases, f32. */
    struct tmodel mqa = {.name = "mqa"};
    s = config_parse("{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 24, \"head_dim\": 8,"
                     " \"intermediate_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
                     " \"num_key_value_heads\": 1, \"vocab_size\": 30, \"tie_word_embeddings\": true}",
                     "mqa", &mqa.cfg);
    CHECK(s == STATUS_OK, "%s", status_message());
    /* GPT-2, 3 layers (uneven pipeline split), f32. */
    struct tmodel gpt2 = {.name = "gpt2"};
    s = config_parse("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 16, \"n_layer\": 3,"
                     " \"n_head\": 4, \"n_positions\": 12, \"vocab_size\": 29, \"activation_function\": \"gelu\"}",
                     "gpt2", &gpt2.cfg);
    CHECK(s == STATUS_OK, "%s", status_message());
    /* Gemma 3: GQA (4 heads, 2 KV heads), head_dim 8 != d_model / n_heads, QK-norm, sandwich
     * norms, tied, bf16; also under a multimodal checkpoint's "language_model.model." prefix. */
    struct tmodel gemma = {.name = "gemma3"};
    s = config_parse("{\"architectures\": [\"Gemma3ForCausalLM\"], \"hidden_size\": 24, \"head_dim\": 8,"
                     " \"intermediate_size\": 40, \"num_hidden_layers\": 3, \"num_attention_heads\": 4,"
                     " \"num_key_value_heads\": 2, \"vocab_size\": 37, \"max_position_embeddings\": 64,"
                     " \"sliding_window\": 4, \"sliding_window_pattern\": 2, \"torch_dtype\": \"bfloat16\","
                     " \"bos_token_id\": 2, \"eos_token_id\": 1}",
                     "gemma3", &gemma.cfg);
    CHECK(s == STATUS_OK, "%s", status_message());
    tm_init(&llama);
    tm_init(&mqa);
    tm_init(&gpt2);
    tm_init(&gemma);

    char l_hf[4096], l_sh[4096];
    snprintf(l_hf, sizeof l_hf, "%s", tpath("llama_hf"));
    snprintf(l_sh, sizeof l_sh, "%s", tpath("llama_sharded"));
    check_status(write_hf_llama(&llama, l_hf, 1, NULL, NULL), STATUS_OK, "write: HF Llama checkpoint", NULL);
    write_text(tpath("llama_hf/tokenizer.model"), "not really a tokenizer");
    check_status(write_hf_llama(&llama, l_sh, 2, NULL, NULL), STATUS_OK,
                 "write: sharded HF Llama checkpoint (2 shards + index.json)", NULL);
    check_status(write_hf_llama(&mqa, tpath("mqa_hf"), 1, NULL, NULL), STATUS_OK,
                 "write: HF Llama MQA checkpoint", NULL);
    check_status(write_hf_gpt2(&gpt2, tpath("gpt2_hf")), STATUS_OK, "write: HF GPT-2 checkpoint", NULL);
    check_status(write_hf_llama(&gemma, tpath("gemma_hf"), 1, NULL, NULL), STATUS_OK,
                 "write: HF Gemma 3 checkpoint", NULL);
    gemma.hf_prefix = "language_model.model.";
    check_status(write_hf_llama(&gemma, tpath("gemma_hf_mm"), 2, NULL, NULL), STATUS_OK,
                 "write: sharded HF Gemma 3 checkpoint with the language_model.model. prefix", NULL);
    gemma.hf_prefix = NULL;

    /* Megatron layouts, from HF sources and from a Megatron source. */
    struct {
        const char *src, *dst;
        int         tp, pp;
    } mg[] = {
        {"llama_hf", "llama_mg_t2p2", 2, 2}, {"llama_hf", "llama_mg_t1p1", 1, 1},
        {"llama_mg_t2p2", "llama_mg_t1p2_from_mg", 1, 2},
        {"mqa_hf", "mqa_mg_t1p2", 1, 2},
        {"gpt2_hf", "gpt2_mg_t2p2", 2, 2}, {"gpt2_hf", "gpt2_mg_t4p3", 4, 3},
        {"gpt2_mg_t4p3", "gpt2_mg_t1p1_from_mg", 1, 1},
        {"gemma_hf", "gemma_mg_t2p2", 2, 2}, {"gemma_hf_mm", "gemma_mg_t1p1", 1, 1},
        {"gemma_mg_t2p2", "gemma_mg_t1p2_from_mg", 1, 2},
    };
    for (size_t i = 0; i < sizeof mg / sizeof mg[0]; i++) {
        struct checkpoint *src = NULL;
        s = checkpoint_open(tpath("%s", mg[i].src), &src);
        if (!s) s = checkpoint_write_megatron(tpath("%s", mg[i].dst), src, mg[i].tp, mg[i].pp);
        char what[256];
        snprintf(what, sizeof what, "write_megatron: %s -> %s (tp=%d pp=%d)", mg[i].src, mg[i].dst,
                 mg[i].tp, mg[i].pp);
        check_status(s, STATUS_OK, what, NULL);
        checkpoint_close(src);
    }

    /* The Megatron files themselves, checked against the documented layout. */
    struct safetensors *st = NULL;
    s = safetensors_open(tpath("llama_mg_t2p2/mp_rank_01_000/model.safetensors"), &st);
    if (!s) {
        const struct model_config *c = &llama.cfg;
        int64_t hd = c->head_dim, d = c->d_model, qpg = c->n_heads / c->n_kv_heads;
        const struct st_tensor *qkv = safetensors_find(st, "decoder.layers.0.self_attention.linear_qkv.weight");
        const struct st_tensor *fc1 = safetensors_find(st, "decoder.layers.0.mlp.linear_fc1.weight");
        const struct st_tensor *emb = safetensors_find(st, "embedding.word_embeddings.weight");
        size_t es = 2, row = (size_t)d * es;
        int ok = qkv && fc1 && emb && qkv->shape[0] == (qpg + 2) * hd && qkv->shape[1] == d &&
                 !safetensors_find(st, "output_layer.weight") &&
                 safetensors_find(st, "decoder.layers.0.input_layernorm.weight") &&
                 !safetensors_find(st, "decoder.layers.1.input_layernorm.weight");
        /* rank 1 holds query group 1: q heads 2, 3, then k head 1, then v head 1 */
        if (ok) {
            const unsigned char *p = qkv->data;
            ok &= !memcmp(p, (const unsigned char *)llama.w[WEIGHT_KIND_Q][0] + 2 * hd * row, 2 * hd * row);
            ok &= !memcmp(p + 2 * hd * row, (const unsigned char *)llama.w[WEIGHT_KIND_K][0] + hd * row, hd * row);
            ok &= !memcmp(p + 3 * hd * row, (const unsigned char *)llama.w[WEIGHT_KIND_V][0] + hd * row, hd * row);
            /* fc1 = [gate rows 20..39; up rows 20..39] */
            int64_t per = c->ffn_hidden / 2;
            ok &= fc1->shape[0] == 2 * per &&
                  !memcmp(fc1->data, (const unsigned char *)llama.w[WEIGHT_KIND_GATE][0] + per * row, per * row) &&
                  !memcmp((const unsigned char *)fc1->data + per * row,
                          (const unsigned char *)llama.w[WEIGHT_KIND_UP][0] + per * row, per * row);
            /* vocab 37 at tp 2: 19 rows each; rank 1 has rows 19..36 and one zero row */
            static const unsigned char zeros[64];
            ok &= emb->shape[0] == 19 &&
                  !memcmp(emb->data, (const unsigned char *)llama.w[WEIGHT_KIND_TOK_EMBEDDING][0] + 19 * row, 18 * row) &&
                  !memcmp((const unsigned char *)emb->data + 18 * row, zeros, row);
        }
        check(ok, "megatron layout: rank 1 stage 0 linear_qkv = [q heads 2,3; k head 1; v head 1], "
                  "linear_fc1 = [gate; up] of rank 1, padded vocab shard");
        safetensors_close(st);
    } else {
        check(0, "megatron layout: open mp_rank_01_000: %s", status_message());
    }
    s = safetensors_open(tpath("llama_mg_t2p2/mp_rank_00_001/model.safetensors"), &st);
    const struct st_tensor *fc2 = s ? NULL : safetensors_find(st, "decoder.layers.0.mlp.linear_fc2.weight");
    check(s == STATUS_OK && safetensors_find(st, "output_layer.weight") &&
              safetensors_find(st, "decoder.final_layernorm.weight") &&
              safetensors_find(st, "decoder.layers.0.self_attention.linear_proj.bias") &&
              !safetensors_find(st, "embedding.word_embeddings.weight") && fc2 && fc2->shape[1] == 20,
          "megatron layout: last stage holds local layer 0, final_layernorm, output_layer (vocab-parallel)");
    safetensors_close(st);
    st = NULL;
    check(file_exists(tpath("llama_mg_t2p2/tokenizer.model")) &&
              file_exists(tpath("llama_mg_t2p2/shardlm_megatron.json")) &&
              file_exists(tpath("llama_mg_t2p2/config.json")),
          "megatron layout: config.json, shardlm_megatron.json and tokenizer.model beside the ranks");

    /* Every weight, every tp, every source. */
    const char *l_sources[] = {"llama_hf", "llama_sharded", "llama_mg_t2p2", "llama_mg_t1p1",
                               "llama_mg_t1p2_from_mg"};
    for (size_t i = 0; i < sizeof l_sources / sizeof l_sources[0]; i++)
        check_all_slices(&llama, tpath("%s", l_sources[i]), l_sources[i]);
    check_all_slices(&mqa, tpath("mqa_hf"), "mqa_hf");
    check_all_slices(&mqa, tpath("mqa_mg_t1p2"), "mqa_mg_t1p2");
    const char *gm_sources[] = {"gemma_hf", "gemma_hf_mm", "gemma_mg_t2p2", "gemma_mg_t1p1",
                                "gemma_mg_t1p2_from_mg"};
    for (size_t i = 0; i < sizeof gm_sources / sizeof gm_sources[0]; i++)
        check_all_slices(&gemma, tpath("%s", gm_sources[i]), gm_sources[i]);
    s = safetensors_open(tpath("gemma_mg_t2p2/mp_rank_01_001/model.safetensors"), &st);
    check(s == STATUS_OK && safetensors_find(st, "decoder.layers.0.self_attention.q_layernorm.weight") &&
              safetensors_find(st, "decoder.layers.0.self_attention.k_layernorm.weight") &&
              safetensors_find(st, "decoder.layers.0.post_self_attn_layernorm.weight") &&
              safetensors_find(st, "decoder.layers.0.post_mlp_layernorm.weight") &&
              safetensors_find(st, "decoder.layers.0.pre_mlp_layernorm.weight") &&
              !safetensors_find(st, "output_layer.weight"),
          "megatron layout: Gemma 3 q_layernorm, k_layernorm, post_self_attn_layernorm, "
          "post_mlp_layernorm on a tp rank > 0 of the last stage");
    safetensors_close(st);
    st = NULL;
    const char *g_sources[] = {"gpt2_hf", "gpt2_mg_t2p2", "gpt2_mg_t4p3", "gpt2_mg_t1p1_from_mg"};
    for (size_t i = 0; i < sizeof g_sources / sizeof g_sources[0]; i++)
        check_all_slices(&gpt2, tpath("%s", g_sources[i]), g_sources[i]);

    /* Layout bookkeeping and zero-copy decisions. */
    struct checkpoint *ck = NULL;
    if (!checkpoint_open(tpath("llama_mg_t2p2"), &ck)) {
        check(ck->layout == CHECKPOINT_LAYOUT_MEGATRON && ck->saved_tp == 2 && ck->saved_pp == 2,
              "open: Megatron layout, saved tp 2 pp 2");
        checkpoint_close(ck);
    }
    if (!checkpoint_open(tpath("llama_sharded"), &ck)) {
        check(ck->layout == CHECKPOINT_LAYOUT_HF_SHARDED, "open: sharded HF layout");
        checkpoint_close(ck);
    }
    if (!checkpoint_open(l_hf, &ck)) {
        check(ck->layout == CHECKPOINT_LAYOUT_HF && ck->saved_tp == 1, "open: HF layout");
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_Q, 0, 1, DTYPE_BF16, 1);
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_Q, 1, 2, DTYPE_BF16, 1);
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_O, 1, 2, DTYPE_BF16, 0);
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_Q, 0, 1, DTYPE_F32, 0);
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_TOK_EMBEDDING, 0, 2, DTYPE_BF16, 1);
        zero_copy_case(ck, "llama_hf", WEIGHT_KIND_TOK_EMBEDDING, 1, 2, DTYPE_BF16, 0);
        struct host_weight hw;
        check_status(checkpoint_get(ck, WEIGHT_KIND_Q, 0, 0, 3, DTYPE_F32, NULL, 0, 0, &hw),
                     STATUS_UNSUPPORTED, "get: tp 3 does not partition 4 heads", "tp size 3", NULL);
        check_status(checkpoint_get(ck, WEIGHT_KIND_Q, 0, 2, 2, DTYPE_F32, NULL, 0, 0, &hw),
                     STATUS_INVALID_ARGUMENT, "get: rank 2 of tp 2", "tp rank 2", NULL);
        check_status(checkpoint_get(ck, WEIGHT_KIND_Q, 2, 0, 1, DTYPE_F32, NULL, 0, 0, &hw),
                     STATUS_INVALID_ARGUMENT, "get: layer 2 of 2", "layer 2", NULL);
        check_status(checkpoint_get(ck, WEIGHT_KIND_POS_EMBEDDING, 0, 0, 1, DTYPE_F32, NULL, 0, 0, &hw),
                     STATUS_INVALID_ARGUMENT, "get: a Llama has no position embedding", "no weight pos_embedding",
                     NULL);
        check_status(checkpoint_get(ck, WEIGHT_KIND_O, 0, 0, 2, DTYPE_BF16, NULL, 0,
                                    CHECKPOINT_GET_ZERO_COPY_OK, &hw),
                     STATUS_INVALID_ARGUMENT, "get: a slice that needs copying, without a buffer", "buffer",
                     NULL);
        check_status(checkpoint_write_megatron(l_hf, ck, 1, 1), STATUS_INVALID_ARGUMENT,
                     "write_megatron: over its own source", "over its source", NULL);
        check_status(checkpoint_write_megatron(tpath("llama_mg_bad"), ck, 4, 1), STATUS_UNSUPPORTED,
                     "write_megatron: tp 4 with 2 KV heads", "n_kv_heads (2)", NULL);
        checkpoint_close(ck);
    }
    if (!checkpoint_open(tpath("llama_mg_t1p1"), &ck)) {
        zero_copy_case(ck, "llama_mg_t1p1", WEIGHT_KIND_Q, 0, 1, DTYPE_BF16, 0);
        zero_copy_case(ck, "llama_mg_t1p1", WEIGHT_KIND_ATTN_NORM, 0, 1, DTYPE_BF16, 1);
        checkpoint_close(ck);
    }
    if (!checkpoint_open(tpath("gpt2_hf"), &ck)) {
        zero_copy_case(ck, "gpt2_hf", WEIGHT_KIND_Q, 0, 1, DTYPE_F32, 0);
        zero_copy_case(ck, "gpt2_hf", WEIGHT_KIND_K_BIAS, 0, 1, DTYPE_F32, 1);
        struct host_weight hw;
        check_status(checkpoint_describe(ck, WEIGHT_KIND_GATE, 0, 0, 1, DTYPE_F32, &hw),
                     STATUS_INVALID_ARGUMENT, "get: GPT-2 has no gate", "no weight gate", NULL);
        checkpoint_close(ck);
    }

    /* Broken checkpoints. */
    const char *name = "model.layers.1.mlp.down_proj.weight";
    check_status(write_hf_llama(&llama, tpath("llama_missing"), 1, name, NULL), STATUS_OK,
                 "write: HF Llama without one tensor", NULL);
    check_status(checkpoint_open(tpath("llama_missing"), &ck), STATUS_BAD_FORMAT,
                 "open: a tensor is missing", name, "model.safetensors", NULL);
    name = "model.layers.0.self_attn.q_proj.weight";
    check_status(write_hf_llama(&llama, tpath("llama_shape"), 1, NULL, name), STATUS_OK,
                 "write: HF Llama with a wrong shape", NULL);
    check_status(checkpoint_open(tpath("llama_shape"), &ck), STATUS_BAD_FORMAT, "open: a tensor has the wrong shape",
                 name, "has shape [24,23], expected [24,24]", NULL);
    mkdir(tpath("no_weights"), 0755);
    config_save(tpath("no_weights/config.json"), &llama.cfg);
    check_status(checkpoint_open(tpath("no_weights"), &ck), STATUS_NOT_FOUND, "open: no weight files",
                 "no weights", NULL);
    mkdir(tpath("empty"), 0755);
    check_status(checkpoint_open(tpath("empty"), &ck), STATUS_NOT_FOUND, "open: no config.json", "config.json",
                 NULL);
    rename(tpath("llama_sharded/model-00002-of-00002.safetensors"), tpath("llama_sharded/moved"));
    check_status(checkpoint_open(l_sh, &ck), STATUS_NOT_FOUND, "open: index names a missing shard",
                 "model-00002-of-00002.safetensors", "does not exist", NULL);
    rename(tpath("llama_sharded/moved"), tpath("llama_sharded/model-00002-of-00002.safetensors"));
    rename(tpath("llama_mg_t2p2/mp_rank_01_001"), tpath("llama_mg_t2p2/moved"));
    check_status(checkpoint_open(tpath("llama_mg_t2p2"), &ck), STATUS_NOT_FOUND,
                 "open: a Megatron rank folder is missing", "mp_rank_01_001", NULL);
    rename(tpath("llama_mg_t2p2/moved"), tpath("llama_mg_t2p2/mp_rank_01_001"));
    const char *meta = tpath("gpt2_mg_t2p2/shardlm_megatron.json");
    write_text(meta, "{\"format\": \"shardlm-megatron\", \"version\": 2}");
    check_status(checkpoint_open(tpath("gpt2_mg_t2p2"), &ck), STATUS_UNSUPPORTED,
                 "open: Megatron metadata of a newer version", "version 2", NULL);
    write_text(meta, "{\"format\": \"shardlm-megatron\", \"version\": 1, \"tp_size\": 2, \"pp_size\": 2,"
                     " \"n_layers\": 3, \"layers_per_stage\": [1, 1], \"vocab_size\": 29,"
                     " \"padded_vocab_size\": 30, \"tensor_names\": \"megatron-core-local\","
                     " \"qkv_layout\": \"megatron-core-grouped\", \"fc1_layout\": \"gate-up-per-rank\"}");
    check_status(checkpoint_open(tpath("gpt2_mg_t2p2"), &ck), STATUS_BAD_FORMAT,
                 "open: Megatron layers_per_stage disagrees with config.json", "sums to 2", NULL);

    tm_free(&llama);
    tm_free(&mqa);
    tm_free(&gpt2);
    tm_free(&gemma);
}

int main(void)
{
    snprintf(root, sizeof root, "/tmp/shardlm_formats_XXXXXX");
    if (!mkdtemp(root)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    log_set_level(LOG_LEVEL_WARN);
    test_safetensors_roundtrip();
    test_safetensors_corrupt();
    test_config();
    test_config_bert();
    test_checkpoints();
    check_remove_tree(root);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
