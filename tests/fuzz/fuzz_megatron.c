/* tests/fuzz/fuzz_megatron.c - the Megatron layout metadata (shardlm_megatron.json, read by
 * checkpoint_open in engine/formats/checkpoint_open.c and used by checkpoint.c): at start a tiny
 * Llama (2 layers, d_model 8, 2 heads, vocab 10, f32) is written as an HF checkpoint and
 * resharded with checkpoint_write_megatron at tp 2, pp 2 into the scratch directory; each input
 * then replaces that directory's shardlm_megatron.json, and checkpoint_open must either refuse
 * it or hand out every weight at tp 1 and 2 (checkpoint_get), never crash.
 * Corpus: tests/fuzz/corpus/megatron (tests/fuzz/make_seeds.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint.h"
#include "config.h"
#include "fuzz_util.h"
#include "safetensors.h"

static char hf_dir[512], meg_dir[512];

static struct model_config tiny_config(void)
{
    struct model_config c = {
        .family = MODEL_FAMILY_LLAMA, .architecture = "LlamaForCausalLM", .n_layers = 2,
        .d_model = 8, .n_heads = 2, .n_kv_heads = 2, .head_dim = 4, .ffn_hidden = 12,
        .vocab_size = 10, .max_positions = 16, .norm = NORM_KIND_RMSNORM, .norm_eps = 1e-5f,
        .activation = ACTIVATION_SILU, .gated_mlp = 1, .positions = POSITION_KIND_ROTARY,
        .rope_theta = 10000, .rope_style = ROPE_STYLE_HALVES, .rot_dim = 4, .bos_id = 1,
        .eos_id = 2, .dtype = DTYPE_F32,
    };
    return c;
}

/* Adds every weight of cfg, filled with small distinct values, under its HF name. */
static void add_weights(struct safetensors_writer *w, const struct model_config *cfg, float *buf)
{
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        if (!weight_kind_exists(cfg, (enum weight_kind)k)) continue;
        if (k == WEIGHT_KIND_LM_HEAD && cfg->tied_embeddings) continue;
        int n = weight_kind_per_layer((enum weight_kind)k) ? cfg->n_layers : 1, nd;
        for (int l = 0; l < n; l++) {
            int64_t shape[2];
            char name[256];
            weight_kind_shape(cfg, (enum weight_kind)k, &nd, &shape[0], &shape[1]);
            if (k == WEIGHT_KIND_LM_HEAD) snprintf(name, sizeof name, "lm_head.weight");
            else weight_names_format(name, sizeof name, "model.", weight_names_hf((enum weight_kind)k, 0), l);
            float *data = buf + (size_t)(k * 4 + l) * 128; /* each weight has at most 120 values */
            for (int i = 0; i < 128; i++) data[i] = (float)(k * 1000 + l * 100 + i) * 1e-3f;
            CHECK(safetensors_writer_add(w, name, DTYPE_F32, nd, shape, data) == STATUS_OK, "%s", status_message());
        }
    }
}

static void write_checkpoints(void)
{
    struct model_config cfg = tiny_config();
    char path[600];
    snprintf(hf_dir, sizeof hf_dir, "%s", fuzz_path("hf"));
    snprintf(meg_dir, sizeof meg_dir, "%s", fuzz_path("megatron"));
    CHECK(mkdir(hf_dir, 0755) == 0, "mkdir %s", hf_dir);
    snprintf(path, sizeof path, "%s/config.json", hf_dir);
    CHECK(config_save(path, &cfg) == STATUS_OK, "%s", status_message());
    snprintf(path, sizeof path, "%s/model.safetensors", hf_dir);
    struct safetensors_writer *w;
    float *buf = calloc((size_t)WEIGHT_KIND_COUNT * 4 * 128, sizeof *buf);
    CHECK(buf && safetensors_writer_begin(path, &w) == STATUS_OK, "%s", status_message());
    add_weights(w, &cfg, buf);
    CHECK(safetensors_writer_finish(w) == STATUS_OK, "%s", status_message());
    free(buf);
    struct checkpoint *ck;
    CHECK(checkpoint_open(hf_dir, &ck) == STATUS_OK, "%s", status_message());
    CHECK(checkpoint_write_megatron(meg_dir, ck, 2, 2) == STATUS_OK, "%s", status_message());
    checkpoint_close(ck);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    write_checkpoints();
    return 0;
}

/* Every weight at tp_size tp, rank by rank: what loading a model does. */
static void get_all(struct checkpoint *ck, int tp)
{
    static float buf[4096];
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        if (!weight_kind_exists(&ck->cfg, (enum weight_kind)k)) continue;
        int n = weight_kind_per_layer((enum weight_kind)k) ? ck->cfg.n_layers : 1;
        for (int l = 0; l < n; l++)
            for (int r = 0; r < tp; r++) {
                struct host_weight hw;
                enum status s = checkpoint_get(ck, (enum weight_kind)k, l, r, tp, DTYPE_F32, buf, sizeof buf, 0, &hw);
                CHECK(s == STATUS_OK, "an opened checkpoint must hand out every weight: %s", status_message());
            }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/shardlm_megatron.json", meg_dir);
    FILE *f = fopen(path, "wb");
    CHECK(f && (size == 0 || fwrite(data, 1, size, f) == size) && fclose(f) == 0, "cannot write %s", path);
    struct checkpoint *ck = NULL;
    if (fuzz_report(checkpoint_open(meg_dir, &ck)) == STATUS_OK) {
        get_all(ck, 1);
        get_all(ck, 2);
    }
    checkpoint_close(ck);
    return 0;
}
