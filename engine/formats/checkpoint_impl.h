/* engine/formats/checkpoint_impl.h - what the checkpoint files share: the private part of an open
 * checkpoint (its mapped files and name index), the layout's file names and limits, and the
 * path and JSON helpers. Private to engine/formats: checkpoint.c (locating and slicing
 * weights), checkpoint_open.c (opening the three directory layouts), checkpoint_gguf.c (a GGUF
 * file as a checkpoint) and checkpoint_write.c (the writers) include it; nothing else does.
 * Not here: the public contract (checkpoint.h), weight names (weight_names.h).
 * Tests: tests/test_formats.c. */
#ifndef SHARDLM_CHECKPOINT_IMPL_H
#define SHARDLM_CHECKPOINT_IMPL_H

#include <cjson/cJSON.h>
#include <stddef.h>

#include "checkpoint.h"
#include "safetensors.h"

#define CK_MAX_TP   64  /* saved tensor-parallel ranks we read */
#define CK_MAX_PARTS 256 /* files a weight is assembled from: tp ranks, or experts */
#define CK_MAX_PP   999 /* mp_rank_TT_PPP */
#define CK_PATH     4096
#define CK_NAME     256
#define CK_JSON_MAX (64 << 20) /* an index.json of a huge model is a few MB */

#define CK_MEGATRON_META "shardlm_megatron.json"
#define CK_HF_SINGLE     "model.safetensors"
#define CK_HF_INDEX      "model.safetensors.index.json"

struct ck_name {
    const char             *name;
    const struct st_tensor *t;
    int                     file;
};

struct checkpoint_files {
    char                *dir;
    int                  n_files;
    size_t               cap_files, cap_file_names;
    struct safetensors **files;       /* HF: shards; Megatron: index stage * saved_tp + rank */
    char               **file_names;  /* (n_files) relative to dir, for messages */
    struct ck_name      *names;       /* HF sharded: the weight map, sorted by name */
    int                  n_names;
    const char          *gpt2_prefix; /* "" or "transformer." */
    const char          *hf_prefix;   /* Llama / Gemma 3 body: "model.", or a multimodal
                                         Gemma 3's "language_model.model." /
                                         "model.language_model."; BERT: "" or "bert." */
    const char          *hf_head;     /* the untied LM head: "lm_head.weight" or
                                         "language_model.lm_head.weight" */
    int                  padded_vocab;    /* Megatron */
    struct gguf         *gguf;        /* GGUF layout: the mapped file, else NULL */
    struct st_tensor    *gguf_tensors; /* (gguf_n_tensors) the file's tensors described as
                                          safetensors ones, in file order (dtype DTYPE_Q* for
                                          blocks), so that the slicing code serves both */
    int                  stage_first[CK_MAX_PP + 1];
    struct st_tensor    *mxfp4;       /* (n_mxfp4: layers x gate, up, down) GPT-OSS's MXFP4
                                         experts repacked at first use (checkpoint_mxfp4.c); data
                                         owned, NULL until then */
    int                  n_mxfp4;
};

/* checkpoint_open.c */
/* buf (CK_PATH bytes) = a/b; STATUS_INVALID_ARGUMENT when too long. */
enum status ck_pathf(char *buf, const char *a, const char *b);
int         ck_is_file(const char *path);
int         ck_is_dir(const char *path);
/* Reads and parses a JSON file; *out is an object (cJSON_Delete it). */
enum status ck_read_json(const char *path, cJSON **out);
/* Tensor `name` in file fi (Megatron, single-file HF) or in the weight map (fi < 0); NULL when
 * absent. */
const struct st_tensor *ck_try(const struct checkpoint *ck, int fi, const char *name);

/* checkpoint_gguf.c */
/* Opens the GGUF file ck->files->dir: config, tokenizer proto, tensor table. */
enum status ck_open_gguf(struct checkpoint *ck);
/* The tensor called name, or NULL. */
const struct st_tensor *ck_gguf_find(const struct checkpoint *ck, const char *name);
/* 1 when path is a regular file that starts with the GGUF magic. */
int ck_is_gguf(const char *path);
void ck_close_gguf(struct checkpoint_files *cf);

/* checkpoint_mxfp4.c */
/* Whether layer l's GPT-OSS experts are stored as transformers' MXFP4 blocks and scales. */
int         ck_mxfp4_present(const struct checkpoint *ck, int fi, int l);
/* exp_gate, exp_up or exp_down of layer l as a ggml MXFP4 block tensor (every expert's rows),
 * repacked from the blocks and scales at the first call; STATUS_BAD_FORMAT naming a tensor that is
 * missing or of the wrong dtype or shape. */
enum status ck_mxfp4_experts(const struct checkpoint *ck, int fi, enum weight_kind kind, int l,
                             const struct st_tensor **out);
void        ck_mxfp4_free(struct checkpoint_files *cf);

/* checkpoint.c */
/* Locates weight kind of layer l (one the model has) in the files and checks its shape and
 * dtype: what checkpoint_open runs for every weight. */
enum status ck_locate(const struct checkpoint *ck, enum weight_kind kind, int l);

#endif
