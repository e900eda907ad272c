/* tests/fuzz/fuzz_safetensors.c - safetensors files (engine/formats/safetensors.c): the input is
 * a whole file (8-byte header length, JSON header, data), written to the scratch directory and
 * opened with safetensors_open; every tensor the header validates is then looked up and read
 * (converted to f32 when its dtype is a float one), and the metadata walked, so that a header
 * that passes validation but lies about its data would show here.
 * Corpus: tests/fuzz/corpus/safetensors (tests/fuzz/make_seeds.py). */
#include <stdlib.h>

#include "fuzz_util.h"
#include "safetensors.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static void read_tensor(const struct safetensors *st, const struct st_tensor *t)
{
    const struct st_tensor *again = NULL;
    if (safetensors_find(st, t->name) != t) abort(); /* names are unique and indexed */
    if (safetensors_get(st, t->name, &again) != STATUS_OK || !t->supported) return;
    enum dtype to = t->dtype == DTYPE_I32 ? DTYPE_I32 : DTYPE_F32;
    size_t n = (size_t)t->numel * dtype_size(to);
    void *dst = malloc(n ? n : 1);
    if (!dst) abort();
    (void)safetensors_read(t, to, dst, n);
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write_file("model.safetensors", data, size);
    struct safetensors *st = NULL;
    if (fuzz_report(safetensors_open(path, &st)) != STATUS_OK) return 0;
    for (int i = 0; i < safetensors_count(st); i++) read_tensor(st, safetensors_tensor(st, i));
    for (int i = 0; i < safetensors_metadata_count(st); i++) {
        const char *k, *v;
        safetensors_metadata_at(st, i, &k, &v);
        if (safetensors_metadata(st, k) == NULL) abort();
    }
    safetensors_close(st);
    return 0;
}
