/* tests/fuzz/fuzz_gguf.c - GGUF files (engine/formats/gguf.c, gguf_tensor.c, gguf_tokenizer.c,
 * gguf_convert.c): the input is a whole file, written to the scratch directory and opened with
 * gguf_open; then
 * every metadata entry is read through the typed getters, every dequantizable tensor is read
 * whole (f32) and by rows (bf16), the tokenizer metadata is turned into a SentencePiece
 * ModelProto that SentencePiece then loads (as `shardlm convert gguf` does), and gguf_inspect
 * prints it all (to /dev/null); a gemma3 file is then imported whole with gguf_convert (the
 * path of `shardlm convert gguf`, --keep-blocks on odd-sized inputs) into the scratch directory.
 * Corpus: tests/fuzz/corpus/gguf (tests/fuzz/make_seeds.py, with gguf-py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "gguf_tokenizer.h"
#include "tokenizer.h"

static FILE *devnull;
static char converted[512]; /* gguf_convert's output directory */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    devnull = fopen("/dev/null", "w");
    snprintf(converted, sizeof converted, "%s", fuzz_path("converted"));
    return 0;
}

static void read_kv(const struct gguf *g, const struct gguf_kv *kv)
{
    const char *s;
    int64_t i;
    double f;
    int b;
    const struct gguf_kv *arr;
    (void)gguf_get_str(g, kv->key, &s);
    (void)gguf_get_int(g, kv->key, &i);
    (void)gguf_get_float(g, kv->key, &f);
    (void)gguf_get_bool(g, kv->key, &b);
    if (gguf_get_arr(g, kv->key, &arr) != STATUS_OK || arr->n == 0) return;
    uint64_t last = arr->n - 1, len;
    switch (arr->arr_type) {
    case GGUF_TYPE_STRING: (void)gguf_arr_str(arr, last, &len); break;
    case GGUF_TYPE_FLOAT32:
    case GGUF_TYPE_FLOAT64: (void)gguf_arr_float(arr, last); break;
    default: (void)gguf_arr_int(arr, last); break;
    }
}

static void read_tensor(const struct gguf *g, const struct gguf_tensor *t)
{
    if (gguf_find_tensor(g, t->name) != t) abort(); /* names are unique and indexed */
    if (!t->supported) return;
    float *f = malloc((size_t)t->numel * sizeof *f + 1);
    uint16_t *h = malloc((size_t)t->numel * sizeof *h + 1);
    if (!f || !h) abort();
    (void)gguf_tensor_read_f32(g, t, f);
    if (t->shape[0] > 0) (void)gguf_tensor_read_rows_bf16(g, t, t->shape[0] - 1, 1, h);
    free(f);
    free(h);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write_file("model.gguf", data, size);
    struct gguf *g = NULL;
    if (fuzz_report(gguf_open(path, &g)) != STATUS_OK) return 0;
    for (int i = 0; i < gguf_n_kv(g); i++) read_kv(g, gguf_kv_at(g, i));
    for (int i = 0; i < gguf_n_tensors(g); i++) read_tensor(g, gguf_tensor_at(g, i));
    void *proto = NULL;
    size_t n = 0;
    if (fuzz_report(gguf_tokenizer_model_proto(g, &proto, &n)) == STATUS_OK) {
        struct tokenizer *tok = NULL;
        if (fuzz_report(tokenizer_load_from_memory(proto, n, &tok)) == STATUS_OK) tokenizer_free(tok);
        free(proto);
    }
    const char *arch = NULL;
    int gemma3 = gguf_get_str(g, "general.architecture", &arch) == STATUS_OK && !strcmp(arch, "gemma3");
    gguf_close(g);
    (void)gguf_inspect(path, devnull);
    /* Both conversions, the kept-blocks one on odd-sized inputs. */
    if (gemma3) (void)fuzz_report(gguf_convert(path, converted, DTYPE_BF16, (int)(size & 1)));
    return 0;
}
