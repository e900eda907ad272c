/* tests/test_keep_blocks.c - kept-blocks checkpoints: ggml block tensors in safetensors files
 * (engine/formats/safetensors.c / safetensors_write.c: U8 [rows, row bytes] named in __metadata__
 * "shardlm.blocks"), `convert gguf --keep-blocks` (gguf_convert.c), and the checkpoint readers and
 * writers that carry them (checkpoint.c, checkpoint_write.c), on gguf-py fixtures
 * (tests/gguf_setup.py):
 *   - the safetensors form: the writer's header read back with cJSON (U8, [rows, row bytes], the
 *     metadata map), our reader's view (DTYPE_Q*, [rows, cols]), and every malformed
 *     "shardlm.blocks" refused naming the fault; foreign metadata keys ignored;
 *   - convert --keep-blocks of tiny_gemma3_blocks.gguf (all eight block types and an F16
 *     matrix): every block weight byte for byte the GGUF's, every weight's f32 values the
 *     GGUF's, and the model's logits with blocks bit-identical to the GGUF's own;
 *   - reshard of that directory to the Megatron layout at tp 2 (column splits on block
 *     boundaries): the same weights at tp 1 and in each tp 2 slice, the same logits; at tp 4 the
 *     Q4_K down projection would be cut: refused before anything is written; the Hugging Face
 *     writer from the GGUF itself (tokenizer.model from its metadata);
 *   - tiny_gemma3_mixed.gguf, whose layer 1 q/k (Q5_1) and v (Q8_0) fuse into one Megatron
 *     linear_qkv: written in f32, every value still the GGUF's;
 *   - the float paths (training, merge-lora): the directory loaded with every weight in f32
 *     gives the GGUF's f32 logits bit for bit, and the writer fed from memory (what the trainer
 *     and merge-lora save through) writes the block weights as floats, not blocks.
 * The real Gemma 3 270M file: tests/test_keep_blocks.sh.
 * Usage: test_keep_blocks FIXTURE_DIR; exits 77 (skip) without the fixtures. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "checkpoint.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "kv_cache.h"
#include "model.h"
#include "quant.h"
#include "safetensors.h"

static char root[64];

/* root/name, in one of 8 rotating buffers: copy a path that must outlive 7 more calls. */
static const char *tpath(const char *name)
{
    static char buf[8][512];
    static int next;
    char *p = buf[next++ % 8];
    snprintf(p, sizeof buf[0], "%s/%s", root, name);
    return p;
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

static long long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

/* The header JSON of a safetensors file, parsed by cJSON (not by our reader); NULL on failure. */
static cJSON *raw_header(const char *path)
{
    FILE *f = fopen(path, "rb");
    unsigned char len8[8];
    if (!f || fread(len8, 1, 8, f) != 8) {
        if (f) fclose(f);
        return NULL;
    }
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)len8[i] << (8 * i);
    char *text = n < (1u << 26) ? calloc(n + 1, 1) : NULL;
    cJSON *root_json = text && fread(text, 1, n, f) == n ? cJSON_Parse(text) : NULL;
    free(text);
    fclose(f);
    return root_json;
}

/* ---- the safetensors form --------------------------------------------------------------- */

/* Writes NAME with one 68-byte tensor "w" (dtype, shape) and __metadata__ {key: value} (none when
 * key is NULL), the header built by cJSON. */
static const char *write_case(const char *name, const char *dtype, int ndim, const int64_t *shape,
                              const char *key, const char *value)
{
    cJSON *h = cJSON_CreateObject(), *t = cJSON_CreateObject();
    if (key) {
        cJSON *m = cJSON_AddObjectToObject(h, "__metadata__");
        cJSON_AddStringToObject(m, "format", "pt");
        cJSON_AddStringToObject(m, key, value);
    }
    double dims[2] = {(double)shape[0], ndim > 1 ? (double)shape[1] : 0}, offs[2] = {0, 68};
    cJSON_AddStringToObject(t, "dtype", dtype);
    cJSON_AddItemToObject(t, "shape", cJSON_CreateDoubleArray(dims, ndim));
    cJSON_AddItemToObject(t, "data_offsets", cJSON_CreateDoubleArray(offs, 2));
    cJSON_AddItemToObject(h, "w", t);
    char *text = cJSON_PrintUnformatted(h);
    const char *path = tpath(name);
    FILE *f = fopen(path, "wb");
    CHECK(f && text, "write %s", path);
    const uint64_t n = strlen(text);
    unsigned char len8[8], data[68] = {0};
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    CHECK(fwrite(len8, 1, 8, f) == 8 && fwrite(text, 1, n, f) == n && fwrite(data, 1, 68, f) == 68, "write %s", path);
    fclose(f);
    cJSON_free(text);
    cJSON_Delete(h);
    return path;
}

static void expect_bad(const char *what, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1,
                       const char *value, const char *needle)
{
    const int64_t shape[2] = {d0, d1};
    struct safetensors *st = NULL;
    enum status s = safetensors_open(write_case(name, dtype, ndim, shape, SAFETENSORS_BLOCKS_KEY, value), &st);
    check_status(s, STATUS_BAD_FORMAT, what, SAFETENSORS_BLOCKS_KEY, needle, NULL);
    safetensors_close(st);
}

/* Malformed "shardlm.blocks" entries, each refused naming the fault; a foreign key ignored. */
static void test_bad_metadata(void)
{
    expect_bad("an unknown block type", "unknown.st", "U8", 2, 2, 34, "{\"w\": \"IQ2_XXS\"}", "unknown block type 'IQ2_XXS'");
    expect_bad("a value that is not JSON", "notjson.st", "U8", 2, 2, 34, "{\"w\": \"Q8_0\"", "not a JSON object");
    expect_bad("a value that is a JSON array", "array.st", "U8", 2, 2, 34, "[\"w\", \"Q8_0\"]", "not a JSON object");
    expect_bad("an entry that is not a string", "number.st", "U8", 2, 2, 34, "{\"w\": 8}", "not a string");
    expect_bad("a tensor the file does not have", "absent.st", "U8", 2, 2, 34, "{\"x\": \"Q8_0\"}",
               "'x', which the file does not have");
    expect_bad("a named tensor that is F32", "f32.st", "F32", 2, 1, 17, "{\"w\": \"Q8_0\"}", "F32 with 2 dimensions");
    expect_bad("a named tensor that is 1-D", "onedim.st", "U8", 1, 68, 0, "{\"w\": \"Q8_0\"}", "U8 with 1 dimensions");
    expect_bad("rows of 17 bytes as Q8_0 (34-byte blocks)", "cut.st", "U8", 2, 4, 17, "{\"w\": \"Q8_0\"}",
               "not a whole number of Q8_0 blocks");
    expect_bad("a tensor named twice", "twice.st", "U8", 2, 2, 34, "{\"w\": \"Q8_0\", \"w\": \"Q8_0\"}", "twice");

    const int64_t shape[2] = {2, 34};
    struct safetensors *st = NULL;
    enum status s = safetensors_open(write_case("foreign.st", "U8", 2, shape, "other.blocks", "{not json"), &st);
    check(s == STATUS_OK && safetensors_find(st, "w") && !safetensors_find(st, "w")->supported,
          "a foreign metadata key is not interpreted: the U8 tensor stays U8 (not loaded)");
    safetensors_close(st);
    s = safetensors_open(write_case("good.st", "U8", 2, shape, SAFETENSORS_BLOCKS_KEY, "{\"w\": \"Q8_0\"}"), &st);
    const struct st_tensor *t = s == STATUS_OK ? safetensors_find(st, "w") : NULL;
    check(t && t->supported && t->dtype == DTYPE_Q8_0 && t->ndim == 2 && t->shape[0] == 2 && t->shape[1] == 32 &&
              t->numel == 64 && t->nbytes == 68 && !strcmp(t->dtype_name, "U8"),
          "U8 [2, 34] named Q8_0: read as q8_0 [2, 32] (68 bytes)");
    if (t) {
        float f[64];
        check_status(safetensors_read(t, DTYPE_F32, f, sizeof f), STATUS_UNSUPPORTED,
                     "safetensors_read of a block tensor", "blocks", NULL);
    }
    safetensors_close(st);
}

/* The writer: a Q4_K tensor among float ones, read back raw (cJSON) and by our reader. */
static void test_writer(void)
{
    const char *path = tpath("written.safetensors");
    unsigned char blocks[2 * 144];
    float f[3] = {1, 2, 3};
    uint16_t h[3] = {1, 2, 3};
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (unsigned char)(i * 7 + 1);
    struct safetensors_writer *w = NULL;
    CHECK(safetensors_writer_begin(path, &w) == STATUS_OK, "writer");
    const int64_t bad_shape[2] = {2, 100}, shape[2] = {2, 256}, n3 = 3;
    check_status(safetensors_writer_add(w, "cut", DTYPE_Q4_K, 2, bad_shape, blocks), STATUS_INVALID_ARGUMENT,
                 "writer: Q4_K [2, 100] (not whole blocks)", "bad shape", NULL);
    check_status(safetensors_writer_set_metadata(w, SAFETENSORS_BLOCKS_KEY, "{}"), STATUS_INVALID_ARGUMENT,
                 "writer: setting the reserved metadata key", SAFETENSORS_BLOCKS_KEY, NULL);
    CHECK(safetensors_writer_add(w, "h", DTYPE_BF16, 1, &n3, h) == STATUS_OK &&
              safetensors_writer_add(w, "q\"k", DTYPE_Q4_K, 2, shape, blocks) == STATUS_OK &&
              safetensors_writer_add(w, "f", DTYPE_F32, 1, &n3, f) == STATUS_OK &&
              safetensors_writer_set_metadata(w, "format", "pt") == STATUS_OK,
          "writer adds");
    check_status(safetensors_writer_finish(w), STATUS_OK, "writer: finish with a block tensor", NULL);

    cJSON *hdr = raw_header(path);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(hdr, "q\"k");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(hdr, "__metadata__");
    const cJSON *map_s = cJSON_GetObjectItemCaseSensitive(meta, SAFETENSORS_BLOCKS_KEY);
    cJSON *map = cJSON_IsString(map_s) ? cJSON_Parse(map_s->valuestring) : NULL;
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    check(e && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "dtype")) &&
              !strcmp(cJSON_GetObjectItemCaseSensitive(e, "dtype")->valuestring, "U8") && cJSON_GetArraySize(sh) == 2 &&
              cJSON_GetArrayItem(sh, 0)->valueint == 2 && cJSON_GetArrayItem(sh, 1)->valueint == 144 &&
              cJSON_GetArraySize(map) == 1 && cJSON_IsString(cJSON_GetObjectItemCaseSensitive(map, "q\"k")) &&
              !strcmp(cJSON_GetObjectItemCaseSensitive(map, "q\"k")->valuestring, "Q4_K") &&
              !strcmp(cJSON_GetObjectItemCaseSensitive(meta, "format")->valuestring, "pt"),
          "header (read by cJSON): the block tensor is U8 [2, 144], the metadata maps it to \"Q4_K\"");
    cJSON_Delete(map);
    cJSON_Delete(hdr);

    struct safetensors *st = NULL;
    CHECK(safetensors_open(path, &st) == STATUS_OK, "reopen %s", path);
    const struct st_tensor *t = safetensors_find(st, "q\"k");
    check(t && t->dtype == DTYPE_Q4_K && t->shape[1] == 256 && t->nbytes == sizeof blocks &&
              !memcmp(t->data, blocks, sizeof blocks) && (uintptr_t)t->data % 2 == 0,
          "our reader: q4_k [2, 256], the bytes written, 2-byte aligned");
    safetensors_close(st);
}

/* ---- checkpoints -------------------------------------------------------------------------- */

/* Flags of same_weights. */
#define SW_BLOCKS 1u /* where a holds blocks, b must hold the same blocks, byte for byte */

/* Every weight of a and b (same model) at tp rank r of tp: identical f32 values, and with
 * SW_BLOCKS identical blocks where a has blocks. Returns the number of block weights of a; sets
 * *ok to 0 and prints the first difference. */
static int same_weights(struct checkpoint *a, struct checkpoint *b, int r, int tp, unsigned flags, int *ok)
{
    int n_blocks = 0;
    *ok = 1;
    for (int k = 0; k < WEIGHT_KIND_COUNT && *ok; k++) {
        const enum weight_kind kind = (enum weight_kind)k;
        if (!weight_kind_exists(&a->cfg, kind)) continue;
        for (int l = 0; l < (weight_kind_per_layer(kind) ? a->cfg.n_layers : 1) && *ok; l++) {
            struct host_weight ha, hb;
            enum dtype dts[2] = {DTYPE_F32, DTYPE_F32};
            int n = 1;
            if (checkpoint_describe(a, kind, l, r, tp, DTYPE_F32, &ha) || checkpoint_describe(b, kind, l, r, tp, DTYPE_F32, &hb)) {
                printf("     %s of layer %d: %s\n", weight_kind_name(kind), l, status_message());
                *ok = 0;
                break;
            }
            if (dtype_is_quant(ha.stored_dtype)) {
                n_blocks++;
                if (flags & SW_BLOCKS) dts[n++] = ha.stored_dtype;
            }
            for (int i = 0; i < n && *ok; i++) {
                enum status sa = checkpoint_describe(a, kind, l, r, tp, dts[i], &ha);
                enum status sb = sa ? sa : checkpoint_describe(b, kind, l, r, tp, dts[i], &hb);
                void *pa = sb ? NULL : aligned_alloc(64, (ha.nbytes + 64) / 64 * 64);
                void *pb = sb ? NULL : aligned_alloc(64, (hb.nbytes + 64) / 64 * 64);
                if (!sb) sa = checkpoint_get(a, kind, l, r, tp, dts[i], pa, ha.nbytes, 0, &ha);
                if (!sb && !sa) sb = checkpoint_get(b, kind, l, r, tp, dts[i], pb, hb.nbytes, 0, &hb);
                if (sa || sb || ha.nbytes != hb.nbytes || memcmp(pa, pb, ha.nbytes)) {
                    printf("     %s of layer %d (tp %d/%d) in %s differs: %s\n", weight_kind_name(kind), l, r, tp,
                           dtype_name(dts[i]), sa || sb ? status_message() : "values");
                    *ok = 0;
                }
                free(pa);
                free(pb);
            }
        }
    }
    return n_blocks;
}

static struct checkpoint *open_ck(const char *path)
{
    struct checkpoint *ck = NULL;
    enum status s = checkpoint_open(path, &ck);
    if (s) printf("     checkpoint_open(%s): %s\n", path, status_message());
    return ck;
}

#define N_IDS 8
#define VOCAB 279

/* Logits of ids (N_IDS rows, VOCAB each) on the model loaded from path in dtype (-1: serving,
 * blocks kept); *blocks = its bytes held as blocks. */
static enum status logits_of(struct backend *b, const char *path, int dtype, float *logits, size_t *blocks)
{
    static const int32_t ids[N_IDS] = {2, 278, 271, 272, 277, 269, 5, 100};
    struct model *m = NULL;
    struct kv_cache cache = {0};
    enum status s = model_load_as(path, b, NULL, dtype, &m);
    if (!s) s = model_reserve(m, 16, 1, 1, 16);
    if (!s) s = kv_cache_init(&cache, b, m->n_layers_local, 1, 16, m->n_kv_local, m->cfg.head_dim, m->dtype);
    int32_t table[1] = {0}, pos[N_IDS];
    if (!s) s = kv_cache_alloc(&cache, 1, table);
    for (int i = 0; i < N_IDS; i++) pos[i] = i;
    int32_t q_start[2] = {0, N_IDS}, seq_len = N_IDS;
    struct forward_batch fb = {.n_tokens = N_IDS, .tokens = ids, .positions = pos, .slots = pos, .n_seqs = 1,
                               .q_start = q_start, .seq_len = &seq_len, .block_table = table, .max_blocks = 1,
                               .n_logits = N_IDS, .logit_rows = pos};
    if (!s) s = model_forward(m, &cache, &fb, logits);
    if (m) *blocks = m->weight_bytes_blocks;
    if (cache.n_blocks) kv_cache_free(&cache);
    model_free(m);
    if (s) printf("     model from %s: %s\n", path, status_message());
    return s;
}

/* Compares the logits of path (dtype) with want, bit for bit. */
static void check_logits(struct backend *b, const char *path, int dtype, const float *want, size_t want_blocks,
                         const char *what)
{
    float *got = malloc(N_IDS * VOCAB * sizeof *got);
    size_t blocks = 0;
    enum status s = logits_of(b, path, dtype, got, &blocks);
    int finite = 1;
    for (int i = 0; i < N_IDS * VOCAB; i++) finite &= got[i] == got[i] && got[i] - got[i] == 0;
    check(s == STATUS_OK && finite && !memcmp(got, want, N_IDS * VOCAB * sizeof *got) && blocks == want_blocks,
          "%s: logits bit-identical (%zu bytes of blocks, expected %zu)", what, blocks, want_blocks);
    free(got);
}

/* The tensors of the raw header of dir/model.safetensors against the GGUF's: block types kept
 * as U8 [rows, row bytes] in the metadata map, the rest not in it. */
static void test_header(const char *dir, const char *gguf_path)
{
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cJSON *h = raw_header(path);
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(h, "__metadata__");
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(meta, SAFETENSORS_BLOCKS_KEY);
    cJSON *map = cJSON_IsString(ms) ? cJSON_Parse(ms->valuestring) : NULL;
    struct gguf *g = NULL;
    CHECK(gguf_open(gguf_path, &g) == STATUS_OK, "open %s", gguf_path);
    /* llama.cpp name -> HF name for what the fixture has: blk.L.attn_q -> model.layers.L.self_attn.q_proj ... */
    static const char *const pairs[][2] = {{"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
                                           {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"},
                                           {"ffn_gate", "mlp.gate_proj"},  {"ffn_up", "mlp.up_proj"},
                                           {"ffn_down", "mlp.down_proj"}};
    int n_checked = 0, n_blocks = 0, ok = map && cJSON_IsObject(map);
    for (int l = -1; l < 2 && ok; l++) {
        for (size_t p = 0; p < (l < 0 ? 1 : sizeof pairs / sizeof pairs[0]) && ok; p++) {
            char gn[128], hn[128];
            if (l < 0) snprintf(gn, sizeof gn, "token_embd.weight"), snprintf(hn, sizeof hn, "model.embed_tokens.weight");
            else {
                snprintf(gn, sizeof gn, "blk.%d.%s.weight", l, pairs[p][0]);
                snprintf(hn, sizeof hn, "model.layers.%d.%s.weight", l, pairs[p][1]);
            }
            const struct gguf_tensor *t = gguf_find_tensor(g, gn);
            const cJSON *e = cJSON_GetObjectItemCaseSensitive(h, hn), *typ = cJSON_GetObjectItemCaseSensitive(map, hn);
            const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape"), *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
            const int block = t ? dtype_of_quant_type(t->type) : -1;
            ok = t && e && cJSON_GetArraySize(sh) == 2 && cJSON_IsString(dt);
            if (ok && block >= 0)
                ok = !strcmp(dt->valuestring, "U8") && cJSON_IsString(typ) && !strcmp(typ->valuestring, t->type_name) &&
                     cJSON_GetArrayItem(sh, 0)->valuedouble == (double)t->shape[0] &&
                     cJSON_GetArrayItem(sh, 1)->valuedouble == (double)(t->nbytes / (uint64_t)t->shape[0]);
            else if (ok)
                ok = !strcmp(dt->valuestring, "F32") && !typ && cJSON_GetArrayItem(sh, 1)->valuedouble == (double)t->shape[1];
            if (!ok) printf("     %s (%s) in the header: not as expected\n", hn, gn);
            n_checked++;
            n_blocks += block >= 0;
        }
    }
    check(ok && n_checked == 15 && n_blocks == 14 && cJSON_GetArraySize(map) == 14,
          "header of the kept-blocks file (read by cJSON): %d block matrices U8 [rows, row bytes] mapped to their "
          "GGUF type, the F16 matrix as F32 and unmapped", n_blocks);
    gguf_close(g);
    cJSON_Delete(map);
    cJSON_Delete(h);
}

/* convert --keep-blocks, reshard at tp 2 and 4, the HF writer from a GGUF, the float paths. */
static void test_checkpoints(const char *fx)
{
    char gguf[512], mixed[512];
    snprintf(gguf, sizeof gguf, "%s/tiny_gemma3_blocks.gguf", fx);
    snprintf(mixed, sizeof mixed, "%s/tiny_gemma3_mixed.gguf", fx);
    char dir[512], m2[512], m4[512], hf[512]; /* tpath's buffers are reused */
    snprintf(dir, sizeof dir, "%s", tpath("kept"));
    snprintf(m2, sizeof m2, "%s", tpath("mega_tp2"));
    snprintf(m4, sizeof m4, "%s", tpath("mega_tp4"));
    snprintf(hf, sizeof hf, "%s", tpath("hf_from_gguf"));
    check_status(gguf_convert(gguf, dir, DTYPE_F32, 1), STATUS_OK, "convert gguf --keep-blocks", NULL);
    printf("     sizes: %s %lld bytes, its kept-blocks model.safetensors %lld bytes\n", gguf, file_size(gguf),
           file_size(tpath("kept/model.safetensors")));
    test_header(dir, gguf);

    struct checkpoint *cg = open_ck(gguf), *cd = open_ck(dir);
    int ok = 0, nb = cg && cd ? same_weights(cg, cd, 0, 1, SW_BLOCKS, &ok) : 0;
    check(cg && cd && ok && nb == 14 + 1, "the directory's weights are the GGUF's: %d block weights (the tied head "
          "included) byte for byte, every weight's f32 values bit for bit", nb);
    check_status(cd ? checkpoint_describe(cd, WEIGHT_KIND_DOWN, 0, 0, 4, DTYPE_Q4_K, &(struct host_weight){0})
                    : STATUS_INTERNAL, STATUS_UNSUPPORTED, "the directory's Q4_K down at tp 4 as blocks", "down",
                 "tp 4", "cut", NULL);

    /* Megatron at tp 2 from the directory; at tp 4 refused, nothing written. */
    check_status(cd ? checkpoint_write_megatron(m2, cd, 2, 1) : STATUS_INTERNAL, STATUS_OK,
                 "reshard the directory to Megatron tp 2", NULL);
    check_status(cd ? checkpoint_write_megatron(m4, cd, 4, 1) : STATUS_INTERNAL, STATUS_UNSUPPORTED,
                 "reshard the directory to Megatron tp 4 (down: 128 of 512 Q4_K columns)", "down", "tp 4", "cut", NULL);
    check(!exists(m4), "the refused tp 4 reshard wrote nothing (%s absent)", m4);
    struct checkpoint *c2 = open_ck(m2);
    int ok1 = 0, ok_r0 = 0, ok_r1 = 0;
    nb = c2 ? same_weights(cd, c2, 0, 1, SW_BLOCKS, &ok1) : 0;
    if (c2) (void)same_weights(cd, c2, 0, 2, SW_BLOCKS, &ok_r0), (void)same_weights(cd, c2, 1, 2, SW_BLOCKS, &ok_r1);
    check(c2 && c2->saved_tp == 2 && ok1 && ok_r0 && ok_r1 && nb == 15,
          "Megatron tp 2: every weight at tp 1 and in both tp 2 slices is the directory's (blocks byte for byte)");

    /* The Hugging Face writer from the GGUF file itself. */
    check_status(cg ? checkpoint_write_hf(hf, cg) : STATUS_INTERNAL, STATUS_OK, "reshard --format hf from the GGUF", NULL);
    struct checkpoint *ch = open_ck(hf);
    ok = 0;
    nb = ch ? same_weights(cg, ch, 0, 1, SW_BLOCKS, &ok) : 0;
    FILE *a = fopen(tpath("kept/tokenizer.model"), "rb"), *b = fopen(tpath("hf_from_gguf/tokenizer.model"), "rb");
    int same_tok = a && b;
    for (int x = 0, y = 0; same_tok && (x != EOF || y != EOF);) same_tok = (x = fgetc(a)) == (y = fgetc(b));
    if (a) fclose(a);
    if (b) fclose(b);
    check(ch && ok && nb == 15 && same_tok, "HF layout from the GGUF: the GGUF's blocks and values, tokenizer.model "
          "from its metadata (the converter's bytes)");

    /* Mixed block types fused into linear_qkv: f32, values unchanged. */
    struct checkpoint *cm = open_ck(mixed), *cmm = NULL;
    check_status(cm ? checkpoint_write_megatron(tpath("mega_mixed"), cm, 2, 1) : STATUS_INTERNAL, STATUS_OK,
                 "reshard the mixed GGUF to Megatron tp 2", NULL);
    cmm = open_ck(tpath("mega_mixed"));
    struct host_weight q0, q1, o1;
    ok = 0;
    if (cmm) (void)same_weights(cm, cmm, 0, 1, 0, &ok);
    check(cmm && ok && !checkpoint_describe(cmm, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_F32, &q0) &&
              !checkpoint_describe(cmm, WEIGHT_KIND_V, 1, 0, 1, DTYPE_F32, &q1) &&
              !checkpoint_describe(cmm, WEIGHT_KIND_O, 1, 0, 1, DTYPE_F32, &o1) && q0.stored_dtype == DTYPE_Q5_K &&
              q1.stored_dtype == DTYPE_F32 && o1.stored_dtype == DTYPE_F16,
          "mixed q/k Q5_1 and v Q8_0 of layer 1: its linear_qkv in f32 with the GGUF's values; layer 0's stays q5_k, "
          "the F16 o stays f16");

    /* Logits: GGUF vs directory vs Megatron (blocks), and the f32 loads of training and merging. */
    struct backend *be = NULL;
    CHECK(backend_open(DEVICE_CPU, 0, 1, &be) == STATUS_OK, "cpu backend");
    /* Every product row by the int8 product, whatever its row count and layout: the GGUF's
     * matrices are packed for the CPU (mapped) and the reshard's are heap copies (not packed),
     * and on a CPU with AMX the two take different paths at N_IDS rows (packed ones the int8
     * products below 96 rows, the others the tiles from 8: kernels/cpu/matmul.c), so only a
     * row-invariant product compares the weights themselves. */
    be->batch_invariant = 1;
    float *ref = malloc(N_IDS * VOCAB * sizeof *ref), *ref32 = malloc(N_IDS * VOCAB * sizeof *ref32);
    size_t blocks = 0, none = 0;
    if (!logits_of(be, gguf, -1, ref, &blocks)) {
        check_logits(be, dir, -1, ref, blocks, "served from the kept-blocks directory vs from the GGUF");
        check_logits(be, m2, -1, ref, blocks, "served from its Megatron tp 2 reshard (loaded at tp 1) vs the GGUF");
    }
    if (!logits_of(be, gguf, DTYPE_F32, ref32, &none))
        check_logits(be, dir, DTYPE_F32, ref32, 0, "the directory loaded in f32 (train, merge-lora) vs the GGUF in f32");
    check(blocks > 0 && memcmp(ref, ref32, N_IDS * VOCAB * sizeof *ref),
          "sanity: served with %zu bytes of blocks, whose logits differ from the f32 load's (int8 activations)", blocks);
    free(ref);
    free(ref32);
    backend_close(be);

    checkpoint_close(cmm);
    checkpoint_close(cm);
    checkpoint_close(ch);
    checkpoint_close(c2);
    checkpoint_close(cd);
    checkpoint_close(cg);
}

/* A memory source (what the trainer and merge-lora save through) on the kept-blocks directory:
 * the block weights come out as floats in the config's dtype, with the source's values. */
static enum status from_checkpoint(void *ctx, enum weight_kind kind, int layer, float *dst, int64_t n)
{
    struct host_weight hw;
    return checkpoint_get(ctx, kind, layer, 0, 1, DTYPE_F32, dst, (size_t)n * sizeof *dst, 0, &hw);
}

static void test_memory_source(void)
{
    struct checkpoint *cd = open_ck(tpath("kept")), *values = open_ck(tpath("kept")), *out = NULL;
    if (!cd || !values) {
        check(0, "open the kept-blocks directory twice");
        return;
    }
    checkpoint_set_source(cd, from_checkpoint, values);
    check_status(checkpoint_write_hf(tpath("saved"), cd), STATUS_OK, "the HF writer fed from memory", NULL);
    checkpoint_set_source(cd, NULL, NULL);
    out = open_ck(tpath("saved"));
    int ok = 0, nb = out ? same_weights(out, values, 0, 1, 0, &ok) : -1;
    struct host_weight hq;
    check(out && ok && nb == 0 && !checkpoint_describe(out, WEIGHT_KIND_Q, 0, 0, 1, DTYPE_F32, &hq) &&
              hq.stored_dtype == cd->cfg.dtype && cd->cfg.dtype == DTYPE_F32,
          "saved from memory: no block weight left (q in the config's %s), every value the source's",
          dtype_name(cd->cfg.dtype));
    checkpoint_close(out);
    checkpoint_close(values);
    checkpoint_close(cd);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_keep_blocks FIXTURE_DIR\n");
        return 2;
    }
    char probe[4096];
    snprintf(probe, sizeof probe, "%s/tiny_gemma3_mixed.gguf", argv[1]);
    if (access(probe, R_OK) != 0) {
        printf("SKIP: %s not found (tests/gguf_setup.py needs pip install gguf numpy)\n", probe);
        return 77;
    }
    log_set_level(LOG_LEVEL_WARN);
    snprintf(root, sizeof root, "/tmp/shardlm_keep_blocks_%d", (int)getpid());
    CHECK(mkdir(root, 0755) == 0, "mkdir %s", root);
    test_writer();
    test_bad_metadata();
    test_checkpoints(argv[1]);
    test_memory_source();
    check_remove_tree(root);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
