/* kernels/attention_batch.h - the descriptions of a batch that the attention ops take: serving's
 * paged batch (struct attention_batch, op_attention) and training's packed documents (struct
 * attention_train_batch, op_attention_train and its backward). Included by ops.h, where the ops
 * and their contracts are. */
#ifndef SHARDLM_ATTENTION_BATCH_H
#define SHARDLM_ATTENTION_BATCH_H

#include <stdint.h>

#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Describes a batch of sequences for paged attention. Sequence s contributes the query rows
 * q_start[s] .. q_start[s+1]-1 (any number: a prefill chunk, or 1 for decode; q_start[0] = 0,
 * q_start[n_seqs] = the number of query rows, non-decreasing); after the K/V
 * of those rows were written, sequence s holds seq_len[s] tokens in its cache, so its j-th new
 * query row sits at absolute position seq_len[s] - n_new + j and attends causally to cache
 * positions 0 .. that position (and, when window > 0, only the last `window` of them).
 * Cache position p of sequence s lives in block block_table[s][p / block_tokens], slot
 * p % block_tokens. Index tensors live on the backend's device. seq_len[s] >= its new rows and
 * <= max_blocks * block_tokens; block ids lie in the pool. Index data is validated where it
 * lives (CPU: CHECK; CUDA: a device-side trap), as a caller bug. head_dim <= 256 on CUDA. */
struct attention_batch {
    int           n_seqs;
    int           block_tokens;   /* tokens per KV block */
    int           max_blocks;     /* row length of block_table */
    struct tensor q_start;        /* i32 (n_seqs + 1): prefix offsets into the query rows */
    struct tensor seq_len;        /* i32 (n_seqs): tokens in the cache, new ones included */
    struct tensor block_table;    /* i32 (n_seqs, max_blocks): physical block ids */
    float         scale;          /* usually 1/sqrt(head_dim) */
    int           window;         /* sliding-window size in tokens; 0 = full causal */
    float         softcap;        /* > 0: each score s (after scale) becomes softcap *
                                     tanh(s / softcap) before the softmax (Gemma 2's
                                     attn_logit_softcapping); 0 = none */
    /* A host-side hint, 0 = unknown: 1 says that every sequence brings exactly one new row
     * (q_start[s+1] - q_start[s] == 1 for all s: a decode step), which a backend whose index
     * tensors live on the device cannot see without reading them back. The CUDA backend picks
     * its split-K decode kernel by it; the CPU backend ignores it. The result does not depend
     * on it (a wrong 1 costs speed, not correctness). */
    int           decode_only;
    /* A host-side array, NULL = none: row_path[s] != 0 asks that each row of sequence s give
     * the bits it would give as a one-row decode step (speculative verification: a draft's row
     * must score as the token would once accepted, so that greedy output does not change). The
     * CPU backend's attention needs no mark (a row gives the same bits in a prefill tile as
     * alone: kernels/cpu/attention.c) and ignores it; the CUDA backend ignores it too (not made
     * exact there: docs/cuda.md). The model reads the mark for its matrix products
     * (backend.rows_as_decode). */
    const int32_t *row_path;
    /* A host-side hint, 0 = unknown: an upper bound of every seq_len of the batch. The CUDA
     * split-K decode kernel sizes its splits by it instead of max_blocks * block_tokens (a
     * decode step of a short sequence in a wide block table otherwise launches up to 128 splits,
     * nearly all empty, and a combine over them). Unlike decode_only, a bound below a seq_len
     * is wrong: positions past it are not attended. The CPU backend ignores it. */
    int            max_seq_len;
    /* Attention sinks (GPT-OSS): f32 (n_heads), one learned logit per query head of this call
     * (a tp rank's heads), on the backend's device, that joins each softmax's denominator only:
     * o = sum_j e^(s_j - m) v_j / (e^(S_h - m) + sum_j e^(s_j - m)), m the max of S_h and the
     * scores (S_h is not scaled or soft-capped). data NULL: none. */
    struct tensor sinks;
};

/* ---- training attention: batch description (op_attention_train and its backward) ---- */

/* Describes the packed sequences of a training micro-batch for op_attention_train: the n rows
 * of q, k and v hold n_docs documents back to back, document d in rows doc_start[d] ..
 * doc_start[d+1]-1 (doc_start[0] = 0, doc_start[n_docs] = n, non-decreasing: an empty
 * document is allowed). Row i of document d attends causally to the rows j of the same
 * document with j <= i, and, when window > 0, only to the last `window` of them (i - j <
 * window; window = 1 attends to itself only). Attention never crosses a document boundary, so
 * position i - doc_start[d] of a row is its position in its document. doc_start lives on the
 * backend's device. Index data is validated where it lives (CPU: CHECK; CUDA: a device-side
 * trap), as a caller bug. */
struct attention_train_batch {
    int           n_docs;
    struct tensor doc_start; /* i32 (n_docs + 1): row offsets of the documents */
    float         scale;     /* scores are scale * q.k; usually 1/sqrt(head_dim) */
    int           window;    /* sliding-window size in tokens; 0 = full causal */
    float         softcap;   /* > 0: scores become softcap * tanh(s / softcap), as op_attention's */
    int           bidirectional; /* 1: row i attends to every row of its document, before and
                                    after it (an encoder: BERT); window must then be 0, and the
                                    backward is not built for it. 0: causal (the default) */
    struct tensor sinks;     /* attention sinks (GPT-OSS), as attention_batch.sinks: f32 (n_heads),
                                one logit per query head that joins every row's softmax and weighs
                                no value (not scaled or soft-capped); lse then includes it. data
                                NULL: none. The backward of q, k, v is unchanged given that lse;
                                the sinks' own gradient is op_attention_sinks_backward's */
};

#ifdef __cplusplus
}
#endif

#endif
