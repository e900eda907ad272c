/* engine/model/model.h - a transformer decoder for one pipeline stage on one tensor-parallel shard:
 * its weights on the backend's device, a workspace sized once for the largest step, and the
 * forward pass (embedding -> layers -> final norm -> LM head) over the paged KV cache.
 * Not here: reading files (checkpoint.c), choosing what runs (the scheduler), sampling
 * (sampler.c), how ranks talk (parallel.c: the model only calls its comm_* operations).
 * Tensor parallelism follows Megatron: the vocab-parallel embedding is a masked lookup plus an
 * all-reduce; Q/K/V, gate and up are column-parallel; the attention output and down
 * projections are row-parallel, followed by an all-reduce (their biases are added on tp rank 0
 * only, so the sum counts them once); the LM head is vocab-parallel and its logits are
 * gathered along the vocabulary. Pipeline stages receive the residual stream from the
 * previous stage and send it to the next; only the last stage produces logits.
 * Tests: tests/test_model.c (golden stories260K, random GPT-2 and Llama against NumPy, and the
 * same under mpirun at tp 2, pp 2 and tp 2 x pp 2). */
#ifndef SHARDLM_MODEL_H
#define SHARDLM_MODEL_H

#include <stdatomic.h>

#include "checkpoint.h"
#include "config.h"
#include "kv_cache.h"
#include "ops.h"
#include "parallel.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

struct train_memory;
struct step_graphs;
struct lora;

/* How one rank's model joins the others. */
struct model_parallel {
    struct parallel_world *world;   /* borrowed */
    struct parallel_layout layout;  /* this rank's tp/pp/dp coordinates */
    struct parallel_groups *groups; /* borrowed: tp and pp communicators */
    const char *pp_layers;          /* "2,3,...": layers per stage (--pp-layers), or NULL for a
                                       balanced split (earlier stages one more when pp does
                                       not divide the layers) */
    int ep;                         /* 1: the layout's tp group is an expert-parallel group
                                       (--ep, engine/model/moe_ep.c): the experts split over it;
                                       the router and the shared expert whole on every rank;
                                       attention, norms and the vocabulary whole too, or tensor-
                                       parallel over groups->atp when it is set (--ep E --tp T:
                                       the group is a block of E x T ranks) */
};

/* Parses "2,3,..." into layers per stage (pp_size values, each >= 1, summing to n_layers);
 * STATUS_INVALID_ARGUMENT naming what is wrong. */
enum status model_parse_pp_layers(const char *text, int pp_size, int n_layers, int *out);

/* The forward workspace, allocated once by model_reserve for the largest step and carved from
 * one device allocation by a table of shapes (entries of unused features have size zero). */
struct model_workspace {
    int    max_tokens, max_seqs, max_blocks, max_logits;
    void  *mem;                    /* one device allocation */
    struct tensor x, xn;           /* (max_tokens, d_model): residual stream, normed */
    struct tensor q, k, v, att;    /* (max_tokens, heads_local, head_dim) */
    struct tensor proj;            /* (max_tokens, d_model): attention / MLP output */
    struct tensor gate, up;        /* (max_tokens, ffn_local) */
    struct tensor rows;            /* (max_logits, d_model): hidden rows that need logits */
    struct tensor logits;          /* (max_logits, vocab_local) */
    struct tensor logits_full;     /* (max_logits, tp * vocab_local): gathered shards (tp > 1) */
    struct tensor logits_f32;      /* (max_logits, tp * vocab_local) f32, when dtype != f32 */
    float *host_logits;            /* (max_logits, tp * vocab_local) host, when padded (tp > 1) */
    struct tensor tokens, positions, slots, logit_rows; /* i32 (max_tokens) */
    /* The device's share of sampling (device_sampling.c), each laid out per step: its outputs (the
     * logits' sum of squares, the argmax or the top candidates, masses, draws, normalisers) in
     * sample_out (sample_out_bytes, sized by model_reserve), its inputs (forward_batch's
     * temperatures, uniforms, top_p, lse_want, edits and masks) in sample_in (device, grown as
     * asked), both passing through host_sample (page-locked where the backend can). */
    struct tensor sample_out;      /* i32 (sample_out_bytes / 4) */
    size_t sample_out_bytes;
    void  *sample_in, *host_sample;
    size_t sample_in_bytes, host_sample_bytes;
    int    logits_edited;          /* the last step's logits rows were edited: logits_f32 holds them (dtype
                                      != f32), or the logits themselves (f32) */
    struct tensor lse;             /* f32 (max_tokens, heads_local): model_embed's attention statistics */
    struct tensor type_ids;        /* i32 (max_tokens), all 0: the one segment's token type (BERT) */
    struct tensor x_f32;           /* (max_tokens, d_model) f32, when dtype != f32: model_embed's rows for the host */
    struct tensor q_start, seq_len, block_table;        /* i32 (max_seqs+1), (max_seqs), (max_seqs, max_blocks) */
    struct tensor lora_u, lora_z;  /* serving adapters' scratch: (max_tokens, max_adapter_rank), (max_tokens, widest) */
    struct tensor qk_full;         /* (max_tokens, n_heads * head_dim): q or k gathered over tp for a QK norm over
                                      the whole projection (QK_NORM_FULL at tp > 1; else no data) */
    /* Mixture of experts (moe.h), absent for dense models: the router's logits (f32 for the
     * host), one expert's gathered input rows and output rows, the routed rows and weights of
     * every expert (device and host), and where each expert's run starts (host). */
    struct tensor moe_logits, moe_logits32; /* (max_tokens, n_experts): dtype, f32 (dtype != f32) */
    struct tensor moe_x, moe_y;             /* (max_tokens, d_model) */
    struct tensor moe_ids, moe_w;           /* i32, f32 (max_tokens * n_experts_used) */
    struct tensor moe_rows, moe_sw;         /* i32 0 .. max_tokens - 1, f32 (max_tokens): the shared
                                               expert's rows (all) and sigmoid gates */
    float   *moe_host_sw;                   /* (max_tokens) */
    float   *moe_host_logits;               /* (max_tokens * n_experts) */
    int32_t *moe_host_ids;                  /* (max_tokens * n_experts_used) */
    float   *moe_host_w;                    /* (max_tokens * n_experts_used) */
    int     *moe_host_start;                /* (n_experts + 1) */
    /* The load of serving's forwards (moe_forward without training tensors): tokens routed to
     * each expert of each of this stage's layers since the first model_reserve, (n_layers_local,
     * n_experts); written by the thread that runs the forward, read by any (moe_load_read). */
    _Atomic uint64_t *moe_load;
    /* Expert parallelism (ep_size > 1, moe_ep.c): the rows sent and received by the all-to-alls
     * ((max_tokens * k, d_model) each), the experts' outputs in this rank's expert order (the
     * same), device indices i32 (3 * max_tokens * k: the dispatch gather, the experts' gathers,
     * the combine gather), their host copies (and the dispatched slots' f32 weights: 4 max_tokens * k
     * entries), and the (ep_size, n_experts) counts of routed slots
     * per (token slice, expert) on the host. */
    struct tensor ep_send, ep_recv, ep_y, ep_idx;
    int32_t *ep_host_idx;
    int64_t *ep_host_count;
};

/* Expert parallelism's traffic on this rank since the model was loaded (moe_ep.c), over all MoE
 * layers: remote_slots, the routed slots of its own token slices whose expert lives on another
 * rank (each dispatched there and combined back); token_layers, the tokens of its slices;
 * all_token_layers, every token; a2a_bytes, what its all-to-alls sent to other ranks (the ep
 * communicator's count) and a2a_rows, the rows the routing says they sent (its remote slots'
 * inputs, and the outputs of other slices' slots on its experts); join_bytes, the all-reduce
 * joining the slices (the communicator's count); the seconds of the all-to-alls, of the rest of
 * moe_ep_experts (the experts, gathers, host bookkeeping) and of the join (host clock). */
struct moe_ep_stats {
    uint64_t remote_slots, token_layers, all_token_layers, a2a_bytes, a2a_rows, join_bytes;
    double a2a_seconds, rest_seconds, join_seconds;
};

/* One rank's model: its configuration (what shard of which model this is), its weights (a
 * layout table: weights.h) and its forward workspace. */
struct model {
    /* Configuration. */
    struct model_config cfg;
    struct model_parallel par;     /* a world of one when loaded without one */
    struct backend *b;             /* borrowed */
    enum dtype dtype;              /* compute and storage dtype on the device */
    int tp_rank, tp_size, pp_rank, pp_size;
    int layer_first, n_layers_local;   /* this stage's contiguous layer range */
    int n_heads_local, n_kv_local, ffn_local;
    int expert_first, n_experts_local; /* a mixture of experts: this tp (or ep) rank's block of whole experts */
    int ep_rank, ep_size;          /* expert parallelism (par.ep): this rank in the ep group; 1 without */
    struct moe_ep_stats ep_stats;
    int vocab_local;               /* rows of this shard's embedding / LM head (padded vocab / tp) */
    int64_t vocab_start;           /* first vocabulary id of this shard */

    /* Weights, and the memory behind them: the device allocations freed by model_free.
     * Tensors loaded zero-copy (CPU, matching dtype) point into the checkpoint's read-only
     * mapping instead, so the checkpoint stays open for the model's lifetime. */
    struct model_weights w;
    /* The rotary frequencies (rope_frequencies; rot_dim / 2 of each used): [0] the layers of
     * rope_theta, divided by cfg.rope_scaling's factors when it has them, [1] those of
     * rope_theta_local (layer_attention_kind). */
    float rope_freqs[2][ROPE_MAX_PAIRS];
    void **owned;                  /* (n_owned) */
    size_t n_owned, cap_owned;
    struct checkpoint *checkpoint;
    size_t weight_bytes;           /* device bytes of all local weights */
    size_t weight_bytes_mapped;    /* of which served zero-copy from the mapping */
    size_t weight_bytes_blocks;    /* of which ggml blocks (DTYPE_Q*: a GGUF served) */
    size_t weight_bytes_packed;    /* of which copied packed for the CPU (quant_pack_rows8) */
    size_t weight_bytes_unpacked;  /* copied from the mapping to the heap (copy_mapped): blocks that are not
                                    * packed, and on the CPU every matrix put on huge pages */
    char   quantization[96];       /* the block types kept, "Q4_1,Q8_0"; "none" */
    int keep_blocks;               /* weights stored as ggml blocks are kept so (serving) */

    /* An EAGLE draft head (engine/serving/draft.c builds it; never a loaded checkpoint): its input
     * rows are x = fc([embedding(token), feature]) = embedding W_e^T + feature W_f^T + bias, with
     * W_e, W_f the two halves of its fc weight (d_model, d_model) each and the features given
     * per row (forward_batch.features). data NULL: the embedding alone, as for every model. */
    struct tensor input_fc_emb, input_fc_feat, input_fc_bias;

    struct model_workspace ws;
    /* Serving adapters (borrowed; the conductor loads them): forward_batch.seq_adapter picks one
     * of them per sequence. model_reserve sizes their scratch for ranks up to max_adapter_rank. */
    struct lora *const *adapters;
    int n_adapters;
    int max_adapter_rank;
    /* Decode steps replayed from backend graphs (step_graph.c), NULL until model_reserve. */
    struct step_graphs *graphs;
};

/* The rotary frequency divisors of a rope scaling (cfg.rope_scaling): out[i] (rot_dim / 2) =
 * theta^(-2i/rot_dim) / the scaled frequency, as transformers' _compute_linear_scaling,
 * _compute_llama3 and _compute_yarn_parameters define it, in double. Returns 0 (out untouched)
 * for no scaling. (model_load.c) */
int model_rope_factors(const struct model_config *c, double *out);

/* One rank's bring-up, the same for `generate`, the serving conductor and the trainer: the
 * backend on this rank's device (w->gpu on CUDA when w is given: parallel_world.gpu; else
 * device_id), agreed over the world, so that a rank whose device fails does not leave the
 * others waiting in the collective that follows; then, when w is given, the tp/pp/dp
 * communicators for layout l on the backend's stream (parallel.h's ordering contract) and par
 * for model_load (pp_layers borrowed). On error what was opened stays in *b and *groups for the
 * caller's teardown. (engine/model/model_ranks.c) */
enum status model_ranks_open(struct parallel_world *w, const struct parallel_layout *l, const char *pp_layers,
                             enum device dev, int device_id, int threads, struct backend **b,
                             struct parallel_groups *groups, struct model_parallel *par);

/* Loads the checkpoint directory `dir` (or GGUF file: checkpoint_open) for this rank's (tp, pp)
 * shard onto b, in the backend's compute dtype (f32 on CPU; bf16 on CUDA unless the checkpoint
 * is f16). par == NULL means a world of one (tp = pp = 1); otherwise the model borrows par's
 * world and groups. On the CPU with an f32 checkpoint, weights that need no conversion point
 * into the checkpoint's read-only mapping instead of being copied; a GGUF's block-quantized
 * matrices stay blocks (DTYPE_Q*; on the CPU zero-copy where whole rows, on CUDA uploaded as
 * the same bytes), which op_matmul and op_embedding take. Errors (missing files, bad shapes, a tp that does
 * not partition the model) come back as a status with a message; *out is then NULL. The model
 * borrows b. */
enum status model_load(const char *dir, struct backend *b, const struct model_parallel *par,
                       struct model **out);

/* model_load with a chosen compute dtype (f32, bf16 or f16; -1 = the default above): training
 * computes in f32 on every backend. With a chosen dtype every weight is in it: GGUF blocks are
 * dequantized at load. */
enum status model_load_as(const char *dir, struct backend *b, const struct model_parallel *par,
                          int dtype, struct model **out);

/* The checkpoint's input and output ends alone, whole on one rank: the token embeddings, the
 * final norm, the LM head and the rotary factors, no layers (n_layers_local 0; never run). An
 * EAGLE head borrows them when the served model is sharded (tp or pp > 1), whose first rank then
 * holds a slice of the vocabulary or no LM head (engine/serving/draft.c). */
enum status model_load_io(const char *dir, struct backend *b, struct model **out);

/* The (rank, size) a weight of `kind` is sliced by (checkpoint_describe's tp_rank, tp_size): the
 * ep group's for a mixture's experts under expert parallelism (a contiguous block of whole
 * experts per rank; in training at tp > 1, tp rank t's block split over its ep group: rank
 * t ep + ep_rank of tp x ep), the tp group's otherwise; whole for the shared expert under
 * serving's ep (on the sparse layers; `layer` is the global layer, any for kinds not per layer). */
void model_shard_of(const struct model *m, enum weight_kind kind, int layer, int *rank, int *size);

/* The communicator of tensor parallelism (attention, the dense MLP, the vocabulary): the layout's
 * tp group, or under expert parallelism with tensor-parallel attention its atp sub-group. */
static inline struct comm *model_tp_comm(const struct model *m)
{
    return m->par.groups->atp ? m->par.groups->atp : m->par.groups->tp;
}

/* Whether this rank holds the last pipeline stage (it produces logits). */
int model_is_last_stage(const struct model *m);

/* Makes n host values (sampled tokens) of the last stage's first rank known to every rank of
 * the world; a no-op in a world of one. */
enum status model_share_tokens(struct model *m, int32_t *tokens, int n);
void model_free(struct model *m); /* accepts NULL */

/* 1 when p is one of the model's own allocations (m->owned), 0 when it points elsewhere (the
 * checkpoint's mapping). */
int model_owns(const struct model *m, const void *p);

/* Sizes the workspace for steps of at most max_tokens rows over max_seqs sequences whose
 * block tables hold at most max_blocks blocks, with logits for at most max_logits rows.
 * May be called again to grow it. */
enum status model_reserve(struct model *m, int max_tokens, int max_seqs, int max_blocks,
                          int max_logits);

/* The most top candidates a step may ask the device for (forward_batch.top_k), and how many a row
 * of a vocabulary of vocab_size brings (fewer where the vocabulary is smaller). */
#define MODEL_MAX_TOP_K 64
static inline int model_top_width(int vocab_size) { return vocab_size < MODEL_MAX_TOP_K ? vocab_size : MODEL_MAX_TOP_K; }

/* One engine step, described in host memory by the caller. */
struct forward_batch {
    int            n_tokens;
    const int32_t *tokens;      /* (n_tokens) token ids */
    const int32_t *positions;   /* (n_tokens) absolute positions */
    const int32_t *slots;       /* (n_tokens) KV slots: block * block_tokens + offset */
    int            n_seqs;
    const int32_t *q_start;     /* (n_seqs + 1) row offsets of each sequence */
    const int32_t *seq_len;     /* (n_seqs) tokens in cache after this step */
    const int32_t *block_table; /* (n_seqs, max_blocks) */
    int            max_blocks;
    int            n_logits;
    const int32_t *logit_rows;  /* (n_logits) rows (0 .. n_tokens-1) whose logits are wanted */
    const int32_t *seq_adapter; /* (n_seqs) index into model.adapters, -1 = the base; NULL = all base */
    const int32_t *seq_row_path; /* (n_seqs) non-zero: the sequence's rows verify drafts and must each
                                    give a decode row's bits (struct attention_batch.row_path); NULL = none */
    /* Greedy sampling on the device: when non-NULL, the last stage writes the argmax of each
     * logits row here (lowest id on ties, op_argmax) and sets *greedy_done = 1 instead of
     * downloading the logits (4 bytes a row instead of 4 x vocab). When a logit is not finite
     * (their sum of squares, computed beside, is not), or the vocabulary is padded (tp > 1 with
     * a vocabulary not divisible by tp), it sets *greedy_done = 0 and writes the logits as
     * usual, so the caller samples on the host and reports the bad rows. */
    int32_t *greedy_ids;
    int     *greedy_done;
    /* Top candidates on the device instead (with greedy_done, greedy_ids NULL): when top_k > 0
     * (<= MODEL_MAX_TOP_K and the vocabulary), the last stage writes each logits row's top_k
     * largest logits, descending, lower id first on ties (op_topk), to top_values and their ids to
     * top_ids (host, (n_logits, top_k)) and sets *greedy_done = 1, on greedy_ids' conditions
     * (else the logits as usual). A row's argmax is its first id. */
    int      top_k;
    float   *top_values;
    int32_t *top_ids;
    /* With top_k, when top_mass is non-NULL: each row's op_logit_mass at the inverse temperature
     * top_inv_temp[row] (host, n_logits; 0 = none) into top_mass (host, n_logits). */
    const float *top_inv_temp;
    float       *top_mass;
    /* With top_k, when draw_ids is non-NULL: each row's op_logit_draw at temperature draw_temp[row]
     * (host, n_logits; 0 = none) with uniform draw_u[row] into draw_ids and draw_margin (host,
     * n_logits): plain temperature sampling decided on the device (sampler_draw_decided); with
     * draw_top_p (host, n_logits; NULL: all 1), a row below 1 draws as top_p does (the nucleus). */
    const float *draw_temp, *draw_u, *draw_top_p;
    int32_t     *draw_ids;
    float       *draw_margin;
    /* With top_k, when top_lse is non-NULL: each row's op_logit_lse where lse_want[row] > 0 (host,
     * n_logits) into top_lse (host, n_logits): with the top candidates, a row's top
     * log-probabilities, (value - its first value) - lse. */
    const float *lse_want;
    float       *top_lse;
    /* Edits of single logits before any of the above (op_logit_edit: a logit bias, banned ids,
     * penalties; host, n_edits entries: edit_rows i32 (logits rows), edit_ids i32, edit_vals f32
     * (n_edits, 3)), made only over finite logits (a row with NaN or Inf goes to the host unedited,
     * *greedy_done 0): the rows are then edited in f32 (a copy in logits_f32 when the model's dtype
     * is not f32), and model_logits_row gives them edited. */
    int            n_edits;
    const int32_t *edit_rows, *edit_ids;
    const float   *edit_vals;
    /* A constraint's masks after the edits (op_logit_mask), on the same terms: the logits rows
     * mask_rows (host, n_masks, distinct) keep only the tokens whose bit is set in their row of
     * masks (host, (n_masks, mask_words) words, bit j % 32 of word j / 32). */
    int             n_masks, mask_words;
    const int32_t  *mask_rows;
    const uint32_t *masks;
    /* Another LM head instead of the model's (a draft's head over part of the vocabulary,
     * engine/serving/draft.c): (rows, d_model) in a dtype op_matmul takes as a weight, on the
     * model's backend; the logits are then (n_logits, rows), column j the head's row j. Only on
     * one rank (tp = pp = 1) and without greedy_ids; NULL = the model's head. */
    const struct tensor *head;
    /* EAGLE (engine/serving/draft.c): hidden, when non-NULL (on a last stage only; at tp > 1 any
     * of its ranks, whose residual streams are equal), receives every row's final hidden state as
     * the LM head reads it (after the final norm when the model has one), f32 host (n_tokens,
     * d_model); features gives a head's per-row input features (model.input_fc_*), f32 host
     * (n_tokens, d_model), required by such a head, which runs on one rank (tp = pp = 1). */
    float       *hidden;
    const float *features;
};

/* Runs the forward pass of this stage over the batch, writing K/V of the new tokens into the
 * cache, and, on the last stage, logits (n_logits, vocab_size; with fb->head, its rows) as f32 into host memory
 * `logits` (the padding of vocab-parallel shards is not included; other stages leave it
 * untouched). Every rank of the world calls it with the same batch. The batch must fit the
 * reserved workspace (a caller bug otherwise). Communication failures (a peer rank gone)
 * return STATUS_UNAVAILABLE. */
/* What the step graphs did so far (step_graph.c): decode steps whose ops were recorded into a
 * backend graph (captured), run from one (replayed), and shapes whose recording failed and which
 * run op by op from then on (refused), steps padded to a larger batch's graph (padded), and
 * captures whose first launch gave the logits of the same step run op by op right after it
 * (verified) or did not (mismatched: graphs are then turned off). on: whether steps may take
 * graphs at all (SHARDLM_GRAPHS: 0 never, 1 on any backend that records them; unset: on CUDA
 * only). */
struct model_graph_stats {
    int  on;
    long captured, replayed, refused, padded, verified, mismatched;
};
struct model_graph_stats model_graph_stats(const struct model *m);

enum status model_forward(struct model *m, struct kv_cache *cache, const struct forward_batch *fb,
                          float *logits);

/* After a model_forward on the last stage whose logits stayed on the device (greedy_ids or top_k
 * done), logits row `row` (< its n_logits) as f32 into out (vocab_size): a sampled row whose top
 * candidates could not decide its token. */
enum status model_logits_row(struct model *m, int row, float *out);
/* One logit of that row, logits[row][id], as model_logits_row would give it. */
enum status model_logit_at(struct model *m, int row, int32_t id, float *out);

/* How model_embed turns a sequence's final hidden states into one vector. */
enum model_pooling {
    MODEL_POOLING_MEAN, /* the mean over the sequence's rows (sentence-transformers' default) */
    MODEL_POOLING_CLS,  /* the first row (BERT's [CLS]) */
    MODEL_POOLING_LAST, /* the last row (a causal decoder's summary of its whole input) */
};

/* Embeds n_seqs sequences in one forward pass that leaves the KV cache alone: sequence s is the
 * tokens q_start[s] .. q_start[s+1]-1 (q_start[0] = 0, increasing: no empty sequence), at
 * positions 0, 1, ...; attention stays within each sequence, bidirectional for an encoder
 * (cfg.encoder) and causal for a decoder. out (n_seqs, d_model), f32 host memory, receives the
 * pooling of each sequence's final hidden states (after a decoder's final norm; BERT has none),
 * computed in double and divided by its L2 norm when normalize (a zero vector stays zero). Only
 * a world of one rank runs it (tp = pp = 1; a caller bug otherwise: the engine refuses
 * embeddings elsewhere), and the batch must fit the reserved workspace (max_tokens rows,
 * max_seqs sequences). A sequence longer than the model's context: STATUS_INVALID_ARGUMENT.
 * (model.c) */
enum status model_embed(struct model *m, const int32_t *tokens, const int32_t *q_start, int n_seqs,
                        enum model_pooling pooling, int normalize, float *out);

/* The first stage's input rows x (T, d_model) from ws.tokens and ws.positions (uploaded): the
 * token embeddings (the vocab-parallel lookup joined over tp), scaled (Gemma), plus learned
 * positions, plus the token type embedding and the embeddings' LayerNorm (BERT). */
enum status model_embed_input(struct model *m, int64_t T, const struct tensor *x);

/* The attention score scale: cfg.attn_scale, or 1/sqrt(head_dim). */
float model_attn_scale(const struct model *m);

#ifdef __cplusplus
}
#endif

#endif
