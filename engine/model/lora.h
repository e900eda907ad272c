/* engine/model/lora.h - low-rank adapters (LoRA) on the linear layers of one stage: for a
 * target projection y = x W^T, the adapted one is
 *     y = x W^T + s (x A^T) B^T,   s = alpha / rank,
 * A (rank, in) and B (out, rank), A random (uniform in +-1/sqrt(in), as PEFT's default
 * kaiming-uniform(a = sqrt 5)) and B zero, so that training starts from the base model. The base
 * stays frozen: only A and B have gradients and optimizer state. The adapters' files are the
 * Hugging Face PEFT layout (adapter_config.json + adapter_model.safetensors, tensor names
 * base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight ...), so that they load in
 * PEFT / vLLM and PEFT adapters load here.
 * Phi-3 fuses q, k, v into qkv_proj and gate, up into gate_up_proj, and PEFT adapts the fused
 * modules: one A (rank, in) shared by the parts and one B whose rows are the parts' rows in
 * order. Here such an adapter is the parts' sites with B's row ranges and one A: the members'
 * a and da alias their leader's (q for q, k, v; gate for gate, up: lora_target_leader), so that
 * x A^T B_part^T is each part's share of the fused product and dA sums the parts' gradients.
 * lora_create fuses on a model whose Hugging Face layout fuses (config_hf_fused) and refuses a
 * group targeted in part; lora_load_peft fuses what the file names fused (qkv_proj,
 * gate_up_proj; separate q_proj ... still load on Phi-3, as PEFT adapters of another layout).
 * Training may apply dropout to the adapter's input, as PEFT's lora_dropout does:
 *     y = x W^T + s (drop(x) A^T) B^T,
 * the mask drawn by op_dropout (kernels/ops.h) from a key of (seed, step, micro-batch, global
 * layer, target) and the element's row and global column (lora_dropout_batch, site_key in
 * lora.c), so that the backward and any recomputation draw it again instead of storing it, and
 * tensor- or data-parallel runs draw what one rank draws. Activations (x, y and their
 * gradients) may be bf16 / f16 around f32 A and B: the adapter computes in f32 (x cast into a
 * scratch) and adds its result rounded once.
 * Serving applies several adapters in one batch (lora_apply, per run of sequences: model.c); the
 * conductor loads them (--lora NAME=DIR). Not here: the optimizer (engine/train).
 * Tests: tests/test_train_grad.py (the gradients of A and B against JAX, with and without
 * dropout; merged = base + adapter), tests/test_train.sh (--lora-rank, --lora-dropout, bf16 /
 * fp16 bases, merge-lora). */
#ifndef SHARDLM_LORA_H
#define SHARDLM_LORA_H

#include <stdint.h>

#include "model.h"

/* The bounds of an adapter's rank and alpha, at creation and when read: a finite alpha in (0,
 * LORA_MAX_ALPHA] (an infinite or huge scale can only give NaN logits). */
#define LORA_MAX_RANK 4096
#define LORA_MAX_ALPHA 65536.0

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

/* The fused groups (bits of struct lora.fused): q, k, v as qkv_proj; gate, up as gate_up_proj. */
enum lora_fused {
    LORA_FUSED_QKV = 1,
    LORA_FUSED_GATE_UP = 2
};

/* "q", "k", "v", "o", "gate", "up", "down"; and the PEFT module names "q_proj" ... */
const char *lora_target_name(enum lora_target t);
const char *lora_target_module(enum lora_target t);
/* Parses "q,k,v,o,gate,up,down" (or the module names; "qkv" / "qkv_proj" and "gate_up" /
 * "gate_up_proj" name their parts) into a bit mask of enum lora_target;
 * STATUS_INVALID_ARGUMENT naming an unknown one. */
enum status lora_parse_targets(const char *text, unsigned *mask);

struct lora_site {
    struct tensor a, b;       /* (rank, in), (out, rank); f32; data NULL when not a target */
    struct tensor da, db;     /* their gradients, accumulated */
    int64_t col0;             /* A's first column in the whole A (row-parallel targets under tp) */
};

struct lora {
    int      rank;
    float    alpha, scale;     /* scale = alpha / rank */
    unsigned targets;          /* bit mask of enum lora_target */
    unsigned fused;            /* bit mask of enum lora_fused: those groups share their leader's A */
    int      n_layers;         /* the model's local layers */
    int      layer_first;      /* the global index of the first (names in the PEFT files) */
    struct lora_site (*sites)[LORA_TARGET_COUNT]; /* (n_layers) */
    void    *mem;              /* A, B, dA, dB */
    void    *act_mem;          /* u and the scratch below, sized by lora_reserve */
    int      max_tokens;
    struct tensor z;           /* (max_tokens, largest out): the low-rank product */
    struct tensor u, du;       /* (max_tokens, rank): s x' A^T (a forward's, made again by its
                                * backward: with pipeline stages several micro-batches are in flight
                                * between the two), and its gradient */
    struct tensor xs, xt;      /* (max_tokens, largest in), f32: the adapter's input cast and/or
                                  masked, and the gradient it sends back (data NULL when
                                  activations are f32 and there is no dropout) */
    struct tensor c;           /* (max_tokens, largest in or out), the activations' dtype: what is
                                  added into y or dx, rounded (data NULL for f32 activations) */
    float    dropout;          /* p in [0, 1) (lora_set_dropout) */
    uint64_t dropout_seed;
    uint64_t batch_key;        /* of the current micro-batch (lora_dropout_batch) */
    int      dropout_on;       /* masks drawn in this micro-batch: training, p > 0 */
};

/* New adapters for m's layers (this rank's slices), initialised as above from seed; the training
 * passes use them once given to model_train_set_lora (model_train.h). */
enum status lora_create(const struct model *m, int rank, float alpha, unsigned targets, uint64_t seed,
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
/* Zeroed whole adapters (A and B only) for every layer of m's model (layer_first 0), of like's
 * rank, alpha, targets and fused groups: what rank 0 of a job assembles to write one PEFT file. */
enum status lora_create_whole(const struct model *m, const struct lora *like, struct lora **out);
/* The target whose A (and dA) t uses: its group's leader when t is a member of a fused group of
 * l, else t. A member that is not its own leader has no A of its own to train or save. */
enum lora_target lora_target_leader(const struct lora *l, enum lora_target t);

/* Dropout on the adapters' input in training forwards (p in [0, 1); 0, the default, is none),
 * masks keyed by seed. Before lora_reserve. */
void lora_set_dropout(struct lora *l, float p, uint64_t seed);
/* The micro-batch the next training forward and backward compute: with on, the masks of
 * (step, micro), micro the micro-batch's index in the global batch; without, no dropout
 * (evaluation). The key: k = h(h(h(seed + 0x9e3779b97f4a7c15) ^ step) ^ micro), then per site
 * h(k ^ (global layer << 8 | target)), h splitmix64's finaliser (op_dropout_hash). */
void lora_dropout_batch(struct lora *l, int on, int64_t step, int micro);
/* Sizes the saved products and scratch for micro-batches of max_tokens rows of activations in
 * act (the model's compute dtype). */
enum status lora_reserve(struct lora *l, struct backend *b, int max_tokens, enum dtype act);
void lora_free(struct lora *l, struct backend *b); /* accepts NULL */
/* Zeroes every dA, dB. */
void lora_zero_grads(struct lora *l, struct backend *b);

/* Serving: y (T, out) += s (x A^T) B^T for rows the caller chose (a run of sequences that use this
 * adapter), with the low-rank product in u_buf (>= T x rank) and z_buf (>= T x out), scratch the
 * model's workspace holds (model_reserve with max_adapter_rank). No-op without an adapter there. */
void lora_apply(const struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                const struct tensor *x, const struct tensor *u_buf, const struct tensor *z_buf);

/* The forward and backward of one target of local layer `layer` (model_train.c calls them
 * after the base projection): y (T, out) += s (x' A^T) B^T with x' = drop(x) (x without
 * dropout); and, with dy the gradient of y: u = s x' A^T again (the same bits: nothing of the
 * forward is kept, so any number of micro-batches may be in flight between the two, as under
 * 1F1B), dB += dy^T u, dA += s (dy B)^T x', dx += drop(s (dy B) A) (the same mask). x, y, dx, dy share the activations' dtype (the one
 * lora_reserve was given). No-ops for a layer or target without an adapter. */
void lora_forward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *y,
                  const struct tensor *x);
void lora_backward(struct lora *l, struct backend *b, int layer, enum lora_target t, const struct tensor *dx,
                   const struct tensor *dy, const struct tensor *x);

/* The PEFT layout: writes dir/adapter_config.json (with lora_dropout) and
 * dir/adapter_model.safetensors (f32), creating dir; base_model names the base checkpoint in the config. Llama-family models only
 * (HF module names; a fused group under its fused module's name, B's rows the parts' in order);
 * STATUS_UNSUPPORTED otherwise. */
enum status lora_save_peft(const struct lora *l, const struct model *m, struct backend *b, const char *dir,
                           const char *base_model);
/* Reads a PEFT adapter for m: rank, alpha and targets from adapter_config.json, A and B from
 * adapter_model.safetensors (any float dtype). Errors name the file and the tensor: a missing
 * tensor, a shape that does not match the model, a NaN or Inf in a tensor, r or lora_alpha out
 * of bounds (LORA_MAX_*), an unsupported option (DoRA, rsLoRA, bias): STATUS_BAD_FORMAT or
 * STATUS_UNSUPPORTED. Either file missing, unreadable or not a regular file (a FIFO is refused
 * without blocking: base_open_file) is STATUS_NOT_FOUND, its message saying which and why, and
 * no other failure is STATUS_NOT_FOUND: a caller may answer all unreachable paths alike. */
enum status lora_load_peft(struct model *m, const char *dir, struct lora **out);
/* A loaded adapter made ready to serve on m: its A and B cast to the activations' dtype m->dtype
 * (bf16 on CUDA; a no-op for f32 activations, the CPU's), the gradients dropped. lora_apply
 * multiplies x by A in x's dtype, so a served adapter must pass here first; a trained one never
 * does (its f32 masters stay f32). */
enum status lora_serve_prepare(struct lora *l, const struct model *m);

/* W += s B A for every adapted weight of m, in place (m's weights must be writable f32): the
 * merged model computes what base + adapter computes. */
void lora_merge_into(const struct lora *l, struct model *m);
/* The base weight target t adapts in local layer l, or NULL when the model lacks it. */
const struct tensor *lora_base_weight(const struct model *m, int l, enum lora_target t);

#endif
