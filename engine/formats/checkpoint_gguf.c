/* engine/formats/checkpoint_gguf.c - a llama.cpp GGUF file as a checkpoint (checkpoint.h): the
 * config from its metadata (gguf_model_config, the converter's own derivation), the tokenizer
 * proto from its tokenizer.ggml.* keys, and its tensors described as safetensors tensors
 * (struct st_tensor, block-quantized ones with a DTYPE_Q* dtype) so that checkpoint.c locates
 * and slices them by the same code as a directory's. Names are llama.cpp's (weight_names.c's
 * gguf column); Gemma 3's q/k rows are not permuted and its norms already carry the +1
 * (gguf_convert.h), so nothing is rewritten here.
 * Not here: the GGUF reader (gguf.c), slicing and dequantizing on request (checkpoint.c),
 * `convert gguf` (gguf_convert.c).
 * Tests: tests/test_gguf_serve.c (a tiny Gemma 3 GGUF: config, blocks zero-copy, tp slices and
 * the block-cutting refusal, the model with blocks against the dequantized one); test_model
 * gemma-gguf (the real Gemma 3 270M file against its f32 conversion; SKIP without it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_impl.h"
#include "gguf.h"
#include "gguf_convert.h"
#include "gguf_tokenizer.h"

int ck_is_gguf(const char *path)
{
    int fd;
    if (base_open_file(path, &fd, NULL) != STATUS_OK) return 0;
    char magic[4] = {0};
    const int ok = read(fd, magic, 4) == 4 && !memcmp(magic, "GGUF", 4);
    close(fd);
    return ok;
}

/* Tensor t of the file as a safetensors tensor: F32/F16/BF16 as themselves, the block types of
 * kernels/quant.h as DTYPE_Q*, anything else unsupported (refused when a weight needs it). */
static void describe_tensor(const struct gguf_tensor *t, struct st_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->name = t->name;
    snprintf(out->dtype_name, sizeof out->dtype_name, "%s", t->type_name);
    out->ndim = t->n_dims;
    for (int i = 0; i < t->n_dims; i++) out->shape[i] = t->shape[i];
    out->numel = t->numel;
    out->nbytes = (size_t)t->nbytes;
    out->file_offset = t->file_offset;
    out->data = t->data;
    const int q = dtype_of_quant_type(t->type);
    out->supported = 1;
    switch (t->type) {
    case GGML_TYPE_F32: out->dtype = DTYPE_F32, out->elem_size = 4; break;
    case GGML_TYPE_F16: out->dtype = DTYPE_F16, out->elem_size = 2; break;
    case GGML_TYPE_BF16: out->dtype = DTYPE_BF16, out->elem_size = 2; break;
    default:
        out->supported = q >= 0;
        if (q >= 0) out->dtype = (enum dtype)q; /* elem_size 0: blocks have none */
    }
}

enum status ck_open_gguf(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    enum status s = gguf_open(cf->dir, &cf->gguf);
    if (s) return s;
    /* dtype f32: what a CUDA load would otherwise pick bf16 from; the CPU computes in f32. */
    if ((s = gguf_model_config(cf->gguf, DTYPE_F32, &ck->cfg))) return s;
    if ((s = gguf_tokenizer_model_proto(cf->gguf, &ck->tokenizer_proto, &ck->tokenizer_proto_n))) return s;
    const char *tmpl = NULL;
    if (gguf_find_kv(cf->gguf, "tokenizer.chat_template") &&
        (s = gguf_get_str(cf->gguf, "tokenizer.chat_template", &tmpl)))
        return s;
    if (tmpl && !(ck->chat_template = strdup(tmpl))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    const int n = gguf_n_tensors(cf->gguf);
    if (!(cf->gguf_tensors = calloc((size_t)n + 1, sizeof *cf->gguf_tensors)))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n; i++) describe_tensor(gguf_tensor_at(cf->gguf, i), &cf->gguf_tensors[i]);
    return STATUS_OK;
}

const struct st_tensor *ck_gguf_find(const struct checkpoint *ck, const char *name)
{
    const struct checkpoint_files *cf = ck->files;
    const struct gguf_tensor *t = gguf_find_tensor(cf->gguf, name);
    return t ? &cf->gguf_tensors[t - gguf_tensor_at(cf->gguf, 0)] : NULL;
}

void ck_close_gguf(struct checkpoint_files *cf)
{
    free(cf->gguf_tensors);
    gguf_close(cf->gguf);
}
