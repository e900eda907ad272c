/* kernels/cuda/attention_train.cuh - what the two forms of training attention share
 * (attention_train.cu, CUDA cores; attention_train_tc.cu, tensor cores): the rows a row attends
 * to, from the packed documents of struct attention_train_batch. */
#pragma once

#include <stdint.h>

#include "cuda_common.cuh"

/* The document that holds row i: the last d < n_docs with doc_start[d] <= i. */
__device__ __forceinline__ int train_doc_of_row(const int32_t *doc_start, int n_docs, int64_t i)
{
    int lo = 0, hi = n_docs - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (doc_start[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* The first row that row i attends to (the start of its document or of its window); the
 * DEVICE_CHECKs are the CPU reference's CHECKs on doc_start, which lives in device memory. */
__device__ __forceinline__ int64_t train_first_key(const int32_t *doc_start, int n_docs, int64_t n,
                                                   int64_t i, int window)
{
    DEVICE_CHECK(doc_start[0] == 0 && doc_start[n_docs] == n);
    const int d = train_doc_of_row(doc_start, n_docs, i);
    DEVICE_CHECK(doc_start[d] <= i && i < doc_start[d + 1]); /* fails when doc_start decreases */
    const int64_t begin = doc_start[d];
    return window > 0 && i - window + 1 > begin ? i - window + 1 : begin;
}

/* One past the last row that attends to key j: the end of its document or of its reach. */
__device__ __forceinline__ int64_t train_key_end(const int32_t *doc_start, int n_docs, int64_t n,
                                                 int64_t j, int window)
{
    DEVICE_CHECK(doc_start[0] == 0 && doc_start[n_docs] == n);
    const int d = train_doc_of_row(doc_start, n_docs, j);
    DEVICE_CHECK(doc_start[d] <= j && j < doc_start[d + 1]);
    const int64_t end = doc_start[d + 1];
    return window > 0 && j + window < end ? j + window : end;
}

struct backend;
struct tensor;
struct cuda_state;
struct attention_train_batch;

/* The tensor-core form (attention_train_tc.cu): whether it takes these inputs (the state allows
 * it, bf16 or f16, head_dim 32, 64, 96 or 128, 16-byte aligned), and its two ops, called by
 * attention_train.cu's entry points when it does. */
int  cuda_attention_train_tc_fits(const struct cuda_state *s, const struct tensor *q, const struct tensor *k,
                                  const struct tensor *v);
void cuda_attention_train_tc(struct backend *b, const struct tensor *out, const struct tensor *lse,
                             const struct tensor *q, const struct tensor *k, const struct tensor *v,
                             const struct attention_train_batch *batch);
/* Serving's prefill on the same tensor-core forward (op_attention of a batch that is not
 * decode-only: each sequence's new rows tiled on their own, K and V read through the block
 * table), where it fits: bf16 or f16, head_dim 32, 64 or 128, 16-byte aligned. Returns 1 when it
 * ran, 0 (nothing queued) when the caller must take another kernel. */
struct attention_batch;
int  cuda_attention_prefill_tc(struct backend *b, const struct tensor *out, const struct tensor *q,
                               const struct tensor *k_cache, const struct tensor *v_cache,
                               const struct attention_batch *batch);
void cuda_attention_train_tc_backward(struct backend *b, const struct tensor *dq, const struct tensor *dk,
                                      const struct tensor *dv, const struct tensor *dout, const struct tensor *out,
                                      const struct tensor *lse, const struct tensor *q, const struct tensor *k,
                                      const struct tensor *v, const struct attention_train_batch *batch);
