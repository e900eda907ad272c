/* engine/formats/llama2c.c - llama2.c checkpoint import (see llama2c.h). */
#include "llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "safetensors.h"

/* The header of run.c's Config, in file order. */
struct l2c_header {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

/* A q or k projection to be written with its rows permuted from pairs to halves. */
struct permute_ctx {
    const float *src; /* (n_heads * head_dim, dim) */
    int n_heads, head_dim, dim;
};

/* HF row h*hd + c*(hd/2) + i comes from llama2.c row h*hd + 2i + c. */
static enum status fill_permuted(void *ctx, void *dst, size_t nbytes)
{
    const struct permute_ctx *p = ctx;
    const size_t row = (size_t)p->dim * sizeof(float);
    const int half = p->head_dim / 2;
    CHECK(nbytes == (size_t)p->n_heads * (size_t)p->head_dim * row, "permute size");
    for (int h = 0; h < p->n_heads; h++)
        for (int c = 0; c < 2; c++)
            for (int i = 0; i < half; i++)
                memcpy((char *)dst + (size_t)(h * p->head_dim + c * half + i) * row,
                       (const char *)p->src + (size_t)(h * p->head_dim + 2 * i + c) * row, row);
    return STATUS_OK;
}

enum status llama2c_convert(const char *checkpoint, const char *tokenizer, const char *out_dir)
{
    enum status st = STATUS_OK;
    struct safetensors_writer *w = NULL;
    struct permute_ctx *perm = NULL;
    void *map = MAP_FAILED;
    size_t size = 0;
    char path[4096];

    int fd;
    struct stat sb;
    if ((st = base_open_file(checkpoint, &fd, &sb)) != STATUS_OK) return st;
    if (sb.st_size < (off_t)sizeof(struct l2c_header)) {
        st = status_errorf(STATUS_BAD_FORMAT, "%s: too short for a llama2.c header", checkpoint);
        goto done;
    }
    size = (size_t)sb.st_size;
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        st = status_errorf(STATUS_IO, "%s: mmap: %s", checkpoint, strerror(errno));
        goto done;
    }
    struct l2c_header h;
    memcpy(&h, map, sizeof h);
    int tied = h.vocab_size > 0;
    int64_t V = tied ? h.vocab_size : -(int64_t)h.vocab_size;
    if (h.dim <= 0 || h.hidden_dim <= 0 || h.n_layers <= 0 || h.n_heads <= 0 || h.n_kv_heads <= 0 ||
        V <= 0 || h.seq_len <= 0 || h.dim % h.n_heads || h.n_heads % h.n_kv_heads ||
        (h.dim / h.n_heads) % 2 || h.dim > (1 << 16) || h.n_layers > 1024 || V > (1 << 22)) {
        st = status_errorf(STATUS_BAD_FORMAT,
                           "%s: not a llama2.c checkpoint (dim %d hidden %d layers %d heads %d kv %d vocab %d seq %d)",
                           checkpoint, h.dim, h.hidden_dim, h.n_layers, h.n_heads, h.n_kv_heads,
                           h.vocab_size, h.seq_len);
        goto done;
    }
    const int64_t D = h.dim, F = h.hidden_dim, L = h.n_layers, hd = D / h.n_heads;
    const int64_t kv = h.n_kv_heads * hd;
    /* Offsets in floats after the header, in run.c's memory_map_weights order. */
    const int64_t n_emb = V * D, n_att_norm = L * D, n_q = L * D * D, n_k = L * kv * D,
                  n_v = L * kv * D, n_o = L * D * D, n_ffn_norm = L * D, n_w1 = L * F * D,
                  n_w2 = L * D * F, n_w3 = L * F * D, n_final = D,
                  n_freq = (int64_t)h.seq_len * hd; /* freq_cis_real + imag, unused */
    const int64_t need = n_emb + n_att_norm + n_q + n_k + n_v + n_o + n_ffn_norm + n_w1 + n_w2 +
                         n_w3 + n_final + n_freq + (tied ? 0 : V * D);
    if ((size - sizeof h) / sizeof(float) < (size_t)need) {
        st = status_errorf(STATUS_BAD_FORMAT, "%s: truncated: %zu bytes, the header implies %zu",
                           checkpoint, size, sizeof h + (size_t)need * sizeof(float));
        goto done;
    }
    const float *p = (const float *)((const char *)map + sizeof h);
    const float *emb = p, *att_norm = emb + n_emb, *wq = att_norm + n_att_norm, *wk = wq + n_q,
                *wv = wk + n_k, *wo = wv + n_v, *ffn_norm = wo + n_o, *w1 = ffn_norm + n_ffn_norm,
                *w2 = w1 + n_w1, *w3 = w2 + n_w2, *final_norm = w3 + n_w3,
                *wcls = tied ? emb : final_norm + n_final + n_freq;

    if (mkdir(out_dir, 0755) != 0 && errno != EEXIST) {
        st = status_errorf(STATUS_IO, "%s: %s", out_dir, strerror(errno));
        goto done;
    }
    struct model_config cfg = {
        .family = MODEL_FAMILY_LLAMA,
        .architecture = "LlamaForCausalLM",
        .n_layers = h.n_layers, .d_model = h.dim, .n_heads = h.n_heads, .n_kv_heads = h.n_kv_heads,
        .head_dim = (int)hd, .ffn_hidden = h.hidden_dim, .vocab_size = (int)V,
        .max_positions = h.seq_len, .norm = NORM_KIND_RMSNORM, .norm_eps = 1e-5f,
        .activation = ACTIVATION_SILU, .gated_mlp = 1, .positions = POSITION_KIND_ROTARY,
        .rope_theta = 10000.0f, .rope_style = ROPE_STYLE_HALVES, .rot_dim = (int)hd,
        .tied_embeddings = tied, .bos_id = 1, .eos_id = 2, .dtype = DTYPE_F32,
    };
    snprintf(path, sizeof path, "%s/config.json", out_dir);
    if ((st = config_save(path, &cfg)) != STATUS_OK) goto done;

    snprintf(path, sizeof path, "%s/model.safetensors", out_dir);
    if ((st = safetensors_writer_begin(path, &w)) != STATUS_OK) goto done;
    perm = calloc(2 * (size_t)L, sizeof *perm);
    if (!perm) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    char name[256];
#define ADD(nm, nd, shp, ptr)                                                                     \
    do {                                                                                          \
        if ((st = safetensors_writer_add(w, nm, DTYPE_F32, nd, shp, ptr)) != STATUS_OK) goto done; \
    } while (0)
    ADD("model.embed_tokens.weight", 2, ((int64_t[]){V, D}), emb);
    for (int64_t l = 0; l < L; l++) {
        snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
        ADD(name, 1, ((int64_t[]){D}), att_norm + l * D);
        perm[2 * l] = (struct permute_ctx){wq + l * D * D, h.n_heads, (int)hd, h.dim};
        perm[2 * l + 1] = (struct permute_ctx){wk + l * kv * D, h.n_kv_heads, (int)hd, h.dim};
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.q_proj.weight", (long long)l);
        if ((st = safetensors_writer_add_deferred(w, name, DTYPE_F32, 2, (int64_t[]){D, D},
                                                  fill_permuted, &perm[2 * l])) != STATUS_OK)
            goto done;
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.k_proj.weight", (long long)l);
        if ((st = safetensors_writer_add_deferred(w, name, DTYPE_F32, 2, (int64_t[]){kv, D},
                                                  fill_permuted, &perm[2 * l + 1])) != STATUS_OK)
            goto done;
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.v_proj.weight", (long long)l);
        ADD(name, 2, ((int64_t[]){kv, D}), wv + l * kv * D);
        snprintf(name, sizeof name, "model.layers.%lld.self_attn.o_proj.weight", (long long)l);
        ADD(name, 2, ((int64_t[]){D, D}), wo + l * D * D);
        snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
        ADD(name, 1, ((int64_t[]){D}), ffn_norm + l * D);
        snprintf(name, sizeof name, "model.layers.%lld.mlp.gate_proj.weight", (long long)l);
        ADD(name, 2, ((int64_t[]){F, D}), w1 + l * F * D);
        snprintf(name, sizeof name, "model.layers.%lld.mlp.down_proj.weight", (long long)l);
        ADD(name, 2, ((int64_t[]){D, F}), w2 + l * D * F);
        snprintf(name, sizeof name, "model.layers.%lld.mlp.up_proj.weight", (long long)l);
        ADD(name, 2, ((int64_t[]){F, D}), w3 + l * F * D);
    }
    ADD("model.norm.weight", 1, ((int64_t[]){D}), final_norm);
    if (!tied) ADD("lm_head.weight", 2, ((int64_t[]){V, D}), wcls);
#undef ADD
    if ((st = safetensors_writer_set_metadata(w, "format", "pt")) != STATUS_OK) goto done;
    st = safetensors_writer_finish(w); /* frees w */
    w = NULL;
    if (st != STATUS_OK) goto done;

    snprintf(path, sizeof path, "%s/tokenizer.model", out_dir);
    st = base_copy_file(tokenizer, path);
done:
    safetensors_writer_free(w);
    free(perm);
    if (map != MAP_FAILED) munmap(map, size);
    close(fd);
    return st;
}
