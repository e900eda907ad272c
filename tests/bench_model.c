/* tests/bench_model.c - the training benchmarks' shared pieces (bench_model.h). */
#include "bench_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors.h"

static long status_kib(const char *key)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    const size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) kib = atol(line + n);
    if (f) fclose(f);
    return kib;
}

long vm_rss_kib(void) { return status_kib("VmRSS:"); }

int vm_hwm_reset(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return -1;
    const int ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok ? 0 : -1;
}

long vm_hwm_kib(void) { return status_kib("VmHWM:"); }

static uint64_t rng_state = 88172645463325252ull;
float bench_rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 - 0.5);
}

static enum status fill_random(void *ctx, void *dst, size_t nbytes)
{
    const float scale = *(const float *)ctx;
    float *p = dst;
    for (size_t i = 0; i < nbytes / sizeof *p; i++) p[i] = scale < 0 ? 1.0f + 0.1f * bench_rnd() : scale * bench_rnd();
    return STATUS_OK;
}

/* A stories110M-shaped Llama checkpoint with random weights in dir. */
enum status write_model(const char *dir, int d, int layers, int heads, int ffn, int vocab, int ctx)
{
    char path[512];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return status_errorf(STATUS_IO, "%s", path);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": %d, "
               "\"intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d, "
               "\"num_key_value_heads\": %d, \"vocab_size\": %d, \"max_position_embeddings\": %d, "
               "\"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\"}\n",
            d, ffn, layers, heads, heads, vocab, ctx);
    fclose(f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    struct safetensors_writer *w = NULL;
    enum status st = safetensors_writer_begin(path, &w);
    static float s_w = 0.05f, s_e = 0.5f, one = -1.0f; /* -1: a norm weight, 1 + noise */
    char name[128];
#define ADD(nm, scale, ...) \
    if (st == STATUS_OK) st = safetensors_writer_add_deferred(w, nm, DTYPE_F32, sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}, fill_random, (void *)(scale))
    ADD("model.embed_tokens.weight", &s_e, vocab, d);
    ADD("lm_head.weight", &s_w, vocab, d);
    ADD("model.norm.weight", &one, d);
    for (int l = 0; l < layers; l++) {
        static const char *mats[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"};
        for (int i = 0; i < 4; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, mats[i]);
            ADD(name, &s_w, d, d);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
        ADD(name, &s_w, ffn, d);
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        ADD(name, &s_w, ffn, d);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        ADD(name, &s_w, d, ffn);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        ADD(name, &one, d);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        ADD(name, &one, d);
    }
#undef ADD
    if (st == STATUS_OK) return safetensors_writer_finish(w);
    safetensors_writer_free(w);
    return st;
}

