/* engine/model/lora.h - low-rank adapters (LoRA) on the linear layers of one stage: for a
 * target projection y = x W^T, the adapted one is
 *     y = x W^T + s (x A^T) B^T,   s = alpha / rank,
 * A (rank, in) and B (out, rank), A random (uniform in +-1/sqrt(in), as PEFT's default
 * kaiming-uniform(a = sqrt 5)) and B zero, so that training starts from the base model. The base
 * stays frozen: only A and B have gradients and optimizer state. The adapters' files are the
 * Hugging Face PEFT layout (adapter_config.json + adapter_model.safetensors, tensor names
 * base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight ...), so that they load in
 * PEFT / vLLM and PEFT adapters load here.
 * Serving applies several adapters in one batch (lora_apply, per run of sequences: model.c); the
 * conductor loads them (--lora NAME=DIR). Not here: the optimizer (engine/train).
 * Tests: tests/test_train_grad.py (the gradients of A and B against JAX; merged = base +
 * adapter), tests/test_train.sh (--lora-rank, merge-lora). */
#ifndef SHARDLM_LORA_H
#define SHARDLM_LORA_H

#include <stdint.h>

#include "model.h"

enum lora_target {
    LORA_TARGET_Q,
    LORA_TARGET_K,
    LORA_TARGET_V,
    LORA_TARGET_O,
    LORA_TARGET_GATE,
    LORA_TARGET_UP,
    LORA_TARGET_DOWN,
    LORA_TARGET_COUNT
};

/* "q", "k", "v", "o", "gate", "up", "down"; and the PEFT module names "q_proj" ... */
const char *lora_target_name(enum lora_target t);
const char *lora_target_module(enum lora_target t);
/* Parses "q,k,v,o,gate,up,down" (or the module names) into a bit mask of enum lora_target;
 * STATUS_INVALID_ARGUMENT naming an unknown one. */
enum status lora_parse_targets(const char *text, unsigned *mask);

struct lora_site {
    struct tensor a, b;       /* (rank, in), (out, rank); f32; data NULL when not a target */
    struct tensor da, db;     /* their gradients, accumulated */
    struct tensor u;          /* (max_tokens, rank): s x A^T of the last training forward */
};

struct lora {
    int      rank;
    float    alpha, scale;     /* scale = alpha / rank */
    unsigned targets;          /* bit mask of enum lora_target */
    int      n_layers;         /* the model's local layers */
    int      layer_first;      /* the global index of the first (names in the PEFT files) */
    struct lora_site (*sites)[LORA_TARGET_COUNT]; /* (n_layers) */
    void    *mem;              /* A, B, dA, dB */
    void    *act_mem;          /* u and the scratch below, sized by lora_reserve */
    int      max_tokens;
    struct tensor z;           /* (max_tokens, largest out): the low-rank product */
    struct tensor du;          /* (max_tokens, rank) */
};

/* New adapters for m's layers (this rank's slices), initialised as above from seed. The model keeps
 * a borrowed pointer (m->lora) so that its training forward and backward use them. */
enum status lora_create(struct model *m, int rank, float alpha, unsigned targets, uint64_t seed,
                        struct lora **out);
/* Tensor parallelism: column-parallel targets (q, k, v, gate, up) hold B's rows of their output
 * slice and the whole A; row-parallel ones (o, down: lora_target_row_parallel) A's columns of
 * their input slice and the whole B. For global layer `layer` and tp rank tp_rank of m's tp
 * size: the whole base weight's (*out, *in), and the slice of the split dimension (*start, *len;
 * len may be NULL). lora_create draws every layer's whole A in order and keeps its slice, and
 * lora_load_peft slices the whole PEFT tensors, so any split computes what one rank does. */
int lora_target_row_parallel(enum lora_target t);
enum status lora_site_geometry(const struct model *m, int layer, enum lora_target t, int tp_rank, int64_t *out,
                               int64_t *in, int64_t *start, int64_t *len);
/* Zeroed whole adapters (A and B only) for every layer of m's model (layer_first 0): what rank 0
 * of a job assembles to write one PEFT file. */
enum status lora_create_whole(const struct model *m, int rank, float alpha, unsigned targets, struct lora **out);

/* Sizes the saved products and scratch for micro-batches of max_tokens rows. */
enum status lora_reserve(struct lora *l, struct backend *b, int max_tokens);
void lora_free(struct lora *l, struct backend *b); /* accepts NULL */
/* Zeroes every dA, dB. */
void lora_zero_grads(struct lora *l, struct backend *b);

/* Serving: y (T, out) += s (x A^T) B^T for rows the caller chose (a run of sequences that use this
 * adapter), with the low-rank product in u_buf (>= T x rank) and z_buf (>= T x out), scratch the
 * model's workspace holds (model_reserve with max_adapter_rank). No-op without an adapter there. */
void lora_apply(const struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                const struct tensor *x, const struct tensor *u_buf, const struct tensor *z_buf);

/* The forward and backward of one target of local layer `layer` (model_train.c calls them
 * after the base projection): y (T, out) += s (x A^T) B^T, keeping u; and, with dy the
 * gradient of y: dB += dy^T u, dA += s (dy B)^T x, dx += s (dy B) A. No-ops for a layer or
 * target without an adapter. */
void lora_forward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                  const struct tensor *x);
void lora_backward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *dx,
                   const struct tensor *dy, const struct tensor *x);

/* The PEFT layout: writes dir/adapter_config.json and dir/adapter_model.safetensors (f32),
 * creating dir; base_model names the base checkpoint in the config. Llama-family models only
 * (HF module names); STATUS_UNSUPPORTED otherwise. */
enum status lora_save_peft(const struct lora *l, const struct model *m, struct backend *b, const char *dir,
                           const char *base_model);
/* Reads a PEFT adapter for m: rank, alpha and targets from adapter_config.json, A and B from
 * adapter_model.safetensors (any float dtype). Errors name the file and the tensor: a missing
 * tensor, a shape that does not match the model, an unsupported option (DoRA, rsLoRA, bias). */
enum status lora_load_peft(struct model *m, const char *dir, struct lora **out);

/* W += s B A for every adapted weight of m, in place (m's weights must be writable f32): the
 * merged model computes what base + adapter computes. */
void lora_merge_into(const struct lora *l, struct model *m);

#endif
