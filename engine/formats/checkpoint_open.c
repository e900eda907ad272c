/* engine/formats/checkpoint_open.c - opening a checkpoint directory: config.json, then the
 * weights in whichever layout is there (shardlm_megatron.json and its rank folders,
 * model.safetensors, or model.safetensors.index.json and its shards), or a GGUF file
 * (checkpoint_gguf.c), every file mapped once and every weight located and checked before
 * checkpoint_open returns (checkpoint.h).
 * Not here: where a weight lives inside a layout and slicing (checkpoint.c), writing
 * (checkpoint_write.c).
 * Tests: tests/test_formats.c (the three layouts, missing and inconsistent files). */
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "checkpoint_impl.h"
#include "gguf.h"
#include "safetensors.h"

/* ---- files and names --------------------------------------------------------------------- */

enum status ck_pathf(char *buf, const char *a, const char *b)
{
    if (snprintf(buf, CK_PATH, "%s/%s", a, b) >= CK_PATH)
        return status_errorf(STATUS_INVALID_ARGUMENT, "path too long: %s/%s", a, b);
    return STATUS_OK;
}

int ck_is_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int ck_is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* Reads and parses a JSON file; *out is an object. */
enum status ck_read_json(const char *path, cJSON **out)
{
    char *text = NULL;
    *out = NULL;
    enum status s = base_read_file(path, CK_JSON_MAX, "JSON file", &text, NULL);
    if (s != STATUS_OK) return s;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a JSON object", path);
    }
    *out = root;
    return STATUS_OK;
}

static enum status ck_add_file(struct checkpoint *ck, const char *rel)
{
    struct checkpoint_files *cf = ck->files;
    char path[CK_PATH];
    enum status s = ck_pathf(path, cf->dir, rel);
    if (s) return s;
    size_t need = (size_t)cf->n_files + 1;
    if (base_grow((void **)&cf->files, &cf->cap_files, need, sizeof *cf->files) ||
        base_grow((void **)&cf->file_names, &cf->cap_file_names, need, sizeof *cf->file_names))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    char *copy = strdup(rel);
    if (!copy) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    struct safetensors *st;
    if ((s = safetensors_open(path, &st))) {
        free(copy);
        return s;
    }
    cf->files[cf->n_files] = st;
    cf->file_names[cf->n_files] = copy;
    cf->n_files++;
    return STATUS_OK;
}

static int ck_cmp_name(const void *a, const void *b)
{
    return strcmp(((const struct ck_name *)a)->name, ((const struct ck_name *)b)->name);
}

/* Finds tensor `name` in file fi (Megatron, single-file HF) or in the weight map (fi < 0).
 * NULL when absent. */
const struct st_tensor *ck_try(const struct checkpoint *ck, int fi, const char *name)
{
    const struct checkpoint_files *cf = ck->files;
    if (cf->gguf) return ck_gguf_find(ck, name);
    if (fi >= 0) return safetensors_find(cf->files[fi], name);
    struct ck_name key = {.name = name};
    const struct ck_name *e = bsearch(&key, cf->names, (size_t)cf->n_names, sizeof key, ck_cmp_name);
    return e ? e->t : NULL;
}

/* ---- the three layouts ------------------------------------------------------------------ */

static enum status ck_open_hf_index(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    enum status s;
    char path[CK_PATH];
    cJSON *root = NULL;
    if ((s = ck_pathf(path, cf->dir, CK_HF_INDEX)) || (s = ck_read_json(path, &root))) return s;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: missing object 'weight_map'", path);
        goto out;
    }
    int n = cJSON_GetArraySize(map);
    cf->names = calloc((size_t)n + 1, sizeof *cf->names);
    if (!cf->names) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, map) {
        if (!cJSON_IsString(it) || !*it->valuestring || strchr(it->valuestring, '/') ||
            !strcmp(it->valuestring, "..") || !strcmp(it->valuestring, ".")) {
            s = status_errorf(STATUS_BAD_FORMAT,
                              "%s: weight_map entry '%s' must name a file in the same directory",
                              path, it->string);
            goto out;
        }
        int fi = -1;
        for (int i = 0; i < cf->n_files; i++)
            if (!strcmp(cf->file_names[i], it->valuestring)) fi = i;
        if (fi < 0) {
            char shard[CK_PATH];
            if ((s = ck_pathf(shard, cf->dir, it->valuestring))) goto out;
            if (!ck_is_file(shard)) {
                s = status_errorf(STATUS_NOT_FOUND, "%s names shard %s, which does not exist", path,
                                  it->valuestring);
                goto out;
            }
            if ((s = ck_add_file(ck, it->valuestring))) goto out;
            fi = cf->n_files - 1;
        }
        const struct st_tensor *t = safetensors_find(cf->files[fi], it->string);
        if (!t) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s maps tensor '%s' to %s, which has no such tensor",
                              path, it->string, it->valuestring);
            goto out;
        }
        cf->names[cf->n_names++] = (struct ck_name){t->name, t, fi};
    }
    qsort(cf->names, (size_t)cf->n_names, sizeof *cf->names, ck_cmp_name);
    for (int i = 1; i < cf->n_names; i++) {
        if (!strcmp(cf->names[i].name, cf->names[i - 1].name)) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: tensor '%s' mapped twice", path, cf->names[i].name);
            goto out;
        }
    }
out:
    cJSON_Delete(root);
    return s;
}

static enum status ck_json_int(const cJSON *root, const char *path, const char *key, int *out)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(it) || !(it->valuedouble >= INT_MIN && it->valuedouble <= INT_MAX) ||
        it->valuedouble != (double)(int)it->valuedouble)
        return status_errorf(STATUS_BAD_FORMAT, "%s: missing or non-integer field '%s'", path, key);
    *out = (int)it->valuedouble;
    return STATUS_OK;
}

static enum status ck_json_expect(const cJSON *root, const char *path, const char *key,
                                  const char *want, enum status mismatch)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsString(it))
        return status_errorf(STATUS_BAD_FORMAT, "%s: missing string field '%s'", path, key);
    if (strcmp(it->valuestring, want))
        return status_errorf(mismatch, "%s: field '%s' is \"%s\"; this build reads \"%s\"", path, key,
                             it->valuestring, want);
    return STATUS_OK;
}

static enum status ck_open_megatron(struct checkpoint *ck)
{
    struct checkpoint_files *cf = ck->files;
    const struct model_config *c = &ck->cfg;
    enum status s;
    char path[CK_PATH];
    cJSON *root = NULL;
    int version = 0, tp = 0, pp = 0, n_layers = 0, vocab = 0;
    if ((s = ck_pathf(path, cf->dir, CK_MEGATRON_META)) || (s = ck_read_json(path, &root))) return s;
    if ((s = ck_json_expect(root, path, "format", "shardlm-megatron", STATUS_BAD_FORMAT)) ||
        (s = ck_json_int(root, path, "version", &version)))
        goto out;
    if (version != 1) {
        s = status_errorf(STATUS_UNSUPPORTED, "%s: version %d; this build reads version 1", path,
                          version);
        goto out;
    }
    if ((s = ck_json_int(root, path, "tp_size", &tp)) || (s = ck_json_int(root, path, "pp_size", &pp)) ||
        (s = ck_json_int(root, path, "n_layers", &n_layers)) ||
        (s = ck_json_int(root, path, "vocab_size", &vocab)) ||
        (s = ck_json_int(root, path, "padded_vocab_size", &cf->padded_vocab)) ||
        (s = ck_json_expect(root, path, "tensor_names", "megatron-core-local", STATUS_UNSUPPORTED)) ||
        (s = ck_json_expect(root, path, "qkv_layout", "megatron-core-grouped", STATUS_UNSUPPORTED)) ||
        (s = ck_json_expect(root, path, "fc1_layout", "gate-up-per-rank", STATUS_UNSUPPORTED)))
        goto out;
    if (tp < 1 || tp > CK_MAX_TP || pp < 1 || pp > CK_MAX_PP || pp > c->n_layers) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: tp_size %d / pp_size %d out of range (1..%d / 1..%d)",
                          path, tp, pp, CK_MAX_TP, c->n_layers < CK_MAX_PP ? c->n_layers : CK_MAX_PP);
        goto out;
    }
    if (n_layers != c->n_layers || vocab != c->vocab_size) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: n_layers %d / vocab_size %d disagree with config.json (%d / %d)", path,
                          n_layers, vocab, c->n_layers, c->vocab_size);
        goto out;
    }
    if (c->n_heads % tp || c->n_kv_heads % tp || c->ffn_hidden % tp) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: tp_size %d does not divide n_heads %d, n_kv_heads %d and ffn_hidden %d",
                          path, tp, c->n_heads, c->n_kv_heads, c->ffn_hidden);
        goto out;
    }
    if (cf->padded_vocab < vocab || cf->padded_vocab % tp) {
        s = status_errorf(STATUS_BAD_FORMAT,
                          "%s: padded_vocab_size %d must be a multiple of tp_size %d and >= %d", path,
                          cf->padded_vocab, tp, vocab);
        goto out;
    }
    const cJSON *lps = cJSON_GetObjectItemCaseSensitive(root, "layers_per_stage");
    if (!cJSON_IsArray(lps) || cJSON_GetArraySize(lps) != pp) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: 'layers_per_stage' must be a list of %d integers",
                          path, pp);
        goto out;
    }
    cf->stage_first[0] = 0;
    for (int i = 0; i < pp; i++) {
        const cJSON *it = cJSON_GetArrayItem(lps, i);
        if (!cJSON_IsNumber(it) || it->valuedouble < 1 || it->valuedouble > c->n_layers ||
            it->valuedouble != (double)(int)it->valuedouble) {
            s = status_errorf(STATUS_BAD_FORMAT, "%s: layers_per_stage[%d] is not a positive integer",
                              path, i);
            goto out;
        }
        cf->stage_first[i + 1] = cf->stage_first[i] + (int)it->valuedouble;
    }
    if (cf->stage_first[pp] != c->n_layers) {
        s = status_errorf(STATUS_BAD_FORMAT, "%s: layers_per_stage sums to %d, config.json has %d layers",
                          path, cf->stage_first[pp], c->n_layers);
        goto out;
    }
    ck->saved_tp = tp;
    ck->saved_pp = pp;
    for (int p = 0; p < pp; p++) {
        for (int t = 0; t < tp; t++) {
            char rel[64], folder[CK_PATH];
            snprintf(rel, sizeof rel, "mp_rank_%02d_%03d", t, p);
            if ((s = ck_pathf(folder, cf->dir, rel))) goto out;
            if (!ck_is_dir(folder) && pp == 1) { /* Megatron's own name when pp == 1 */
                snprintf(rel, sizeof rel, "mp_rank_%02d", t);
                if ((s = ck_pathf(folder, cf->dir, rel))) goto out;
            }
            if (!ck_is_dir(folder)) {
                s = status_errorf(STATUS_NOT_FOUND, "checkpoint %s: rank folder mp_rank_%02d_%03d is missing",
                                  cf->dir, t, p);
                goto out;
            }
            strcat(rel, "/model.safetensors");
            if ((s = ck_add_file(ck, rel))) goto out;
        }
    }
out:
    cJSON_Delete(root);
    return s;
}

/* ck->chat_template from a directory: chat_template.jinja, else tokenizer_config.json's
 * "chat_template" (a string, or a list of {"name", "template"}: the one named "default").
 * Neither is an error (NULL); an unreadable or malformed file is. */
static enum status ck_read_chat_template(struct checkpoint *ck, const char *dir)
{
    char path[CK_PATH];
    char *text = NULL;
    size_t n = 0;
    enum status s;
    if ((s = ck_pathf(path, dir, "chat_template.jinja"))) return s;
    if (ck_is_file(path)) return base_read_file(path, 4u << 20, "chat template", &ck->chat_template, &n);
    if ((s = ck_pathf(path, dir, "tokenizer_config.json"))) return s;
    if (!ck_is_file(path)) return STATUS_OK;
    if ((s = base_read_file(path, 64u << 20, "tokenizer config", &text, &n))) return s;
    cJSON *root = cJSON_ParseWithLength(text, n);
    free(text);
    if (!root) return status_errorf(STATUS_BAD_FORMAT, "%s: not JSON", path);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "chat_template"), *pick = NULL;
    if (cJSON_IsString(t)) pick = t;
    else if (cJSON_IsArray(t)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, t) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default"))
                pick = cJSON_GetObjectItemCaseSensitive(e, "template");
        }
    }
    if (pick && cJSON_IsString(pick) && !(ck->chat_template = strdup(pick->valuestring)))
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    cJSON_Delete(root);
    return s;
}

enum status checkpoint_open(const char *dir, struct checkpoint **out)
{
    enum status s = STATUS_OK;
    char path[CK_PATH];
    *out = NULL;
    struct checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->files = calloc(1, sizeof *ck->files)) || !(ck->files->dir = strdup(dir))) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    struct checkpoint_files *cf = ck->files;
    cf->gpt2_prefix = "";
    cf->hf_prefix = "model.";
    cf->hf_head = "lm_head.weight";
    ck->saved_tp = ck->saved_pp = 1;
    if (ck_is_gguf(dir)) {
        ck->layout = CHECKPOINT_LAYOUT_GGUF;
        if ((s = ck_open_gguf(ck))) goto out;
        goto locate;
    }
    if (!ck_is_dir(dir)) {
        s = status_errorf(STATUS_NOT_FOUND, "checkpoint %s: no such directory", dir);
        goto out;
    }
    if ((s = ck_pathf(path, dir, "config.json")) || (s = config_load(path, &ck->cfg))) goto out;
    if ((s = ck_read_chat_template(ck, dir))) goto out;

    char meta[CK_PATH], single[CK_PATH], index[CK_PATH];
    if ((s = ck_pathf(meta, dir, CK_MEGATRON_META)) || (s = ck_pathf(single, dir, CK_HF_SINGLE)) ||
        (s = ck_pathf(index, dir, CK_HF_INDEX)))
        goto out;
    if (ck_is_file(meta)) {
        ck->layout = CHECKPOINT_LAYOUT_MEGATRON;
        s = ck_open_megatron(ck);
    } else if (ck_is_file(single)) {
        ck->layout = CHECKPOINT_LAYOUT_HF;
        s = ck_add_file(ck, CK_HF_SINGLE);
    } else if (ck_is_file(index)) {
        ck->layout = CHECKPOINT_LAYOUT_HF_SHARDED;
        s = ck_open_hf_index(ck);
    } else {
        s = status_errorf(STATUS_NOT_FOUND,
                          "checkpoint %s: no weights (looked for %s, %s and %s)", dir,
                          CK_MEGATRON_META, CK_HF_SINGLE, CK_HF_INDEX);
    }
    if (s) goto out;

    if (ck->layout != CHECKPOINT_LAYOUT_MEGATRON && ck->cfg.family == MODEL_FAMILY_GPT2 &&
        ck_try(ck, ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1, "transformer.wte.weight"))
        cf->gpt2_prefix = "transformer.";
    /* A BertModel saved on its own (sentence-transformers) has bare names; one saved from a
     * task model (BertForMaskedLM, ...) keeps them under "bert.". */
    if (ck->layout != CHECKPOINT_LAYOUT_MEGATRON && ck->cfg.family == MODEL_FAMILY_BERT) {
        cf->hf_prefix = ck_try(ck, ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1, "bert.embeddings.word_embeddings.weight")
                            ? "bert." : "";
    }
    /* A multimodal Gemma 3 checkpoint keeps the text model under another prefix: older
     * transformers "language_model.model." (head "language_model.lm_head.weight"), newer
     * "model.language_model." (head "lm_head.weight"). */
    if (ck->layout != CHECKPOINT_LAYOUT_MEGATRON && ck->cfg.family == MODEL_FAMILY_GEMMA3) {
        int fi = ck->layout == CHECKPOINT_LAYOUT_HF ? 0 : -1;
        if (!ck_try(ck, fi, "model.embed_tokens.weight")) {
            if (ck_try(ck, fi, "language_model.model.embed_tokens.weight")) {
                cf->hf_prefix = "language_model.model.";
                cf->hf_head = "language_model.lm_head.weight";
            } else if (ck_try(ck, fi, "model.language_model.embed_tokens.weight")) {
                cf->hf_prefix = "model.language_model.";
            }
        }
    }

locate:
    /* Locate and check every weight now, so that checkpoint_get cannot fail on the format. */
    for (int k = 0; k < WEIGHT_KIND_COUNT; k++) {
        if (!weight_kind_exists(&ck->cfg, (enum weight_kind)k)) continue;
        int n = weight_kind_per_layer((enum weight_kind)k) ? ck->cfg.n_layers : 1;
        for (int l = 0; l < n; l++)
            if (weight_kind_exists_at(&ck->cfg, (enum weight_kind)k, l) && (s = ck_locate(ck, (enum weight_kind)k, l)))
                goto out;
    }
    LOG_DEBUG("checkpoint", "%s: %s, %d file(s), tp %d pp %d as saved", dir,
              ck->layout == CHECKPOINT_LAYOUT_MEGATRON ? "megatron"
              : ck->layout == CHECKPOINT_LAYOUT_HF     ? "hf"
              : ck->layout == CHECKPOINT_LAYOUT_GGUF   ? "gguf"
                                                       : "hf sharded",
              cf->n_files, ck->saved_tp, ck->saved_pp);
    *out = ck;
    ck = NULL;
out:
    checkpoint_close(ck);
    return s;
}

void checkpoint_release_pages(struct checkpoint *ck, int data_too)
{
    if (ck && ck->files && ck->files->gguf) gguf_release_pages(ck->files->gguf, data_too);
}

void checkpoint_close(struct checkpoint *ck)
{
    if (!ck) return;
    struct checkpoint_files *cf = ck->files;
    if (cf) {
        for (int i = 0; i < cf->n_files; i++) {
            safetensors_close(cf->files[i]);
            free(cf->file_names[i]);
        }
        free(cf->files);
        free(cf->file_names);
        free(cf->names);
        if (cf->gguf) ck_close_gguf(cf);
        ck_mxfp4_free(cf);
        free(cf->dir);
        free(cf);
    }
    free(ck->tokenizer_proto);
    free(ck->chat_template);
    free(ck);
}
