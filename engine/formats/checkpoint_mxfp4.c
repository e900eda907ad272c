/* engine/formats/checkpoint_mxfp4.c - GPT-OSS's experts as OpenAI publishes them (transformers'
 * Mxfp4 layout: `mlp.experts.gate_up_proj_blocks` U8 (E, 2F, d / 32, 16) with `_scales` U8 (E, 2F,
 * d / 32), `down_proj_blocks` (E, d, F / 32, 16) with its scales) repacked into ggml MXFP4 blocks
 * (kernels/quant.h: {e; qs[16]}), which the kernels multiply as they are, as the canonical
 * exp_gate (the even rows of gate_up), exp_up (the odd rows) and exp_down matrices.
 *
 * The numbers are the same in both layouts (transformers' convert_moe_packed_tensors: value =
 * lut[nibble] * 2^(scale - 127), lut = {0, .5, 1, 1.5, 2, 3, 4, 6, -0, ...}; ggml: kv[nibble] *
 * 2^(e - 128), kv = 2 lut): the scale byte is the block's e as it is; only the nibble order
 * differs. A transformers row of 32 values keeps value 2j in byte j's low nibble and 2j + 1 in
 * its high one; ggml keeps value k (k < 16) in qs[k]'s low nibble and value k + 16 in its high one
 * (llama.cpp's conversion/gpt_oss.py transform_nibble_layout does the same).
 *
 * A weight is repacked at its first use (one layer's one kind, every expert) into a buffer the
 * checkpoint owns until it closes; the loader then slices it as any block tensor. Not thread-safe:
 * a checkpoint is loaded by one thread.
 * Tests: golden_gpt_oss_mxfp4 (tests/reference/gpt_oss_mxfp4_hf.py writes the layout from blocks
 * that gguf-py made and checks both dequantizations agree). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint_impl.h"
#include "quant.h"

#define MXFP4_BLOCK 32
#define MXFP4_BYTES 17

/* The 4-bit value i (0..31) of a transformers block b (16 bytes). */
static unsigned nibble(const uint8_t *b, int i) { return (unsigned)(b[i >> 1] >> ((i & 1) * 4)) & 15u; }

/* One transformers block (16 bytes) and its scale as a ggml MXFP4 block (17 bytes). */
static void repack_block(uint8_t *out, const uint8_t *b, uint8_t scale)
{
    out[0] = scale;
    for (int k = 0; k < 16; k++) out[1 + k] = (uint8_t)(nibble(b, k) | nibble(b, k + 16) << 4);
}

/* blocks / scales of `what` ("gate_up_proj", "down_proj") of layer l, checked against
 * (E, rows, groups, 16) / (E, rows, groups). */
static enum status find_pair(const struct checkpoint *ck, int fi, int l, const char *what, int64_t E, int64_t rows,
                             int64_t groups, const struct st_tensor **blocks, const struct st_tensor **scales)
{
    char bn[CK_NAME], sn[CK_NAME];
    snprintf(bn, sizeof bn, "%slayers.%d.mlp.experts.%s_blocks", ck->files->hf_prefix, l, what);
    snprintf(sn, sizeof sn, "%slayers.%d.mlp.experts.%s_scales", ck->files->hf_prefix, l, what);
    *blocks = ck_try(ck, fi, bn);
    *scales = ck_try(ck, fi, sn);
    const struct st_tensor *b = *blocks, *s = *scales;
    if (!b || !s)
        return status_errorf(STATUS_BAD_FORMAT, "checkpoint %s: tensor '%s' not found (MXFP4 experts: %s_blocks and "
                             "%s_scales)", ck->files->dir, b ? sn : bn, what, what);
    if (strcmp(b->dtype_name, "U8") || strcmp(s->dtype_name, "U8") || b->ndim != 4 || s->ndim != 3 ||
        b->shape[0] != E || b->shape[1] != rows || b->shape[2] != groups || b->shape[3] != 16 || s->shape[0] != E ||
        s->shape[1] != rows || s->shape[2] != groups || b->nbytes != (size_t)(E * rows * groups * 16) ||
        s->nbytes != (size_t)(E * rows * groups))
        return status_errorf(STATUS_BAD_FORMAT, "checkpoint %s: '%s' / '%s' must be U8 (%lld, %lld, %lld, 16) / (%lld, "
                             "%lld, %lld) from config.json (dtypes %s / %s, %d / %d dimensions)", ck->files->dir, bn,
                             sn, (long long)E, (long long)rows, (long long)groups, (long long)E, (long long)rows,
                             (long long)groups, b->dtype_name, s->dtype_name, b->ndim, s->ndim);
    return STATUS_OK;
}

int ck_mxfp4_present(const struct checkpoint *ck, int fi, int l)
{
    char name[CK_NAME];
    snprintf(name, sizeof name, "%slayers.%d.mlp.experts.gate_up_proj_blocks", ck->files->hf_prefix, l);
    return ck_try(ck, fi, name) != NULL;
}

enum status ck_mxfp4_experts(const struct checkpoint *ck, int fi, enum weight_kind kind, int l,
                             const struct st_tensor **out)
{
    struct checkpoint_files *cf = ck->files;
    const struct model_config *c = &ck->cfg;
    const int which = kind == WEIGHT_KIND_EXP_GATE ? 0 : kind == WEIGHT_KIND_EXP_UP ? 1 : 2;
    CHECK(kind == WEIGHT_KIND_EXP_GATE || kind == WEIGHT_KIND_EXP_UP || kind == WEIGHT_KIND_EXP_DOWN,
          "mxfp4 experts: kind %d", (int)kind);
    *out = NULL;
    if (!cf->mxfp4) {
        if (!(cf->mxfp4 = calloc((size_t)c->n_layers * 3, sizeof *cf->mxfp4)))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory", cf->dir);
        cf->n_mxfp4 = c->n_layers * 3;
    }
    struct st_tensor *t = &cf->mxfp4[l * 3 + which];
    if (t->data) {
        *out = t;
        return STATUS_OK;
    }
    const int64_t E = c->n_experts, F = c->moe_ffn, d = c->d_model;
    const int64_t rows = which == 2 ? d : F, cols = which == 2 ? F : d; /* canonical, per expert */
    if (cols % MXFP4_BLOCK)
        return status_errorf(STATUS_BAD_FORMAT, "checkpoint %s: MXFP4 experts need rows of whole blocks of 32 (%lld)",
                             cf->dir, (long long)cols);
    const int64_t groups = cols / MXFP4_BLOCK, src_rows = which == 2 ? d : 2 * F;
    const struct st_tensor *blocks, *scales;
    enum status st = find_pair(ck, fi, l, which == 2 ? "down_proj" : "gate_up_proj", E, src_rows, groups, &blocks,
                               &scales);
    if (st != STATUS_OK) return st;
    const size_t nbytes = (size_t)(E * rows * groups) * MXFP4_BYTES;
    uint8_t *buf = malloc(nbytes);
    if (!buf) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "checkpoint %s: out of memory (%zu bytes)", cf->dir, nbytes);
    const uint8_t *b = blocks->data, *s = scales->data;
    for (int64_t e = 0; e < E; e++)
        for (int64_t r = 0; r < rows; r++) {
            /* gate: source row 2r, up: 2r + 1 (gate_up interleaved); down: r */
            const int64_t sr = e * src_rows + (which == 2 ? r : 2 * r + which);
            for (int64_t g = 0; g < groups; g++)
                repack_block(buf + ((size_t)((e * rows + r) * groups + g)) * MXFP4_BYTES,
                             b + (size_t)(sr * groups + g) * 16, s[sr * groups + g]);
        }
    static const char *const names[] = {"exp_gate (mxfp4)", "exp_up (mxfp4)", "exp_down (mxfp4)"};
    *t = (struct st_tensor){.name = names[which], .supported = 1, .dtype = DTYPE_MXFP4, .ndim = 2,
                            .shape = {E * rows, cols}, .numel = E * rows * cols, .nbytes = nbytes, .data = buf};
    snprintf(t->dtype_name, sizeof t->dtype_name, "MXFP4");
    *out = t;
    return STATUS_OK;
}

void ck_mxfp4_free(struct checkpoint_files *cf)
{
    for (int i = 0; i < cf->n_mxfp4; i++) free((void *)cf->mxfp4[i].data);
    free(cf->mxfp4);
    cf->mxfp4 = NULL;
    cf->n_mxfp4 = 0;
}
