/* kernels/cuda/attention_prefill.cuh - where the tensor-core prefill kernel's tiles and keys lie
 * (attention_train_tc.cu's tc_prefill_kernel, serving's op_attention of a batch that is not
 * decode-only): which sequence and rows a block takes, the keys each row attends to, and where
 * key j of a sequence sits in the paged cache. Plain index arithmetic, the same source on the
 * host (tests/test_prefill_tiles.cu runs it there against the definitions) and on the device.
 * Not here: the kernel (attention_train_tc.cu). */
#ifndef SHARDLM_ATTENTION_PREFILL_CUH
#define SHARDLM_ATTENTION_PREFILL_CUH

#include <stdint.h>

/* Tile `tile` (the block's x) of a batch whose sequence s brings rows q_start[s] .. q_start[s +
 * 1] - 1, each sequence's rows cut into tiles of `rows` on their own: *s and its rows [*r0, *r1).
 * Returns 0 past the last tile (a grid of rows_total / rows + n_seqs blocks bounds them). */
__host__ __device__ inline int prefill_tile(const int32_t *q_start, int n_seqs, int64_t tile, int rows, int *s,
                                            int64_t *r0, int64_t *r1)
{
    for (int i = 0; i < n_seqs; i++) {
        const int64_t q0 = q_start[i], end = q_start[i + 1], tiles = (end - q0 + rows - 1) / rows;
        if (tile < tiles) {
            *s = i;
            *r0 = q0 + tile * rows;
            *r1 = *r0 + rows < end ? *r0 + rows : end;
            return 1;
        }
        tile -= tiles;
    }
    return 0;
}

/* Sequence s's keys: its cache positions 0 .. seq_len - 1 (the step's new K and V written there
 * first), read through its block table row; its new row r (from q0) sits at position pos0 + r -
 * q0 (pos0 = seq_len - its new rows). Windows as op_attention's: the last `window` positions. */
struct tc_paged_keys {
    const int32_t *table;
    int64_t        q0, pos0, n_blocks;
    int            bt, window, n_kv_heads;
    /* [lo, hi): the positions row attends to */
    __host__ __device__ void reach(int64_t row, int64_t &lo, int64_t &hi) const
    {
        hi = pos0 + (row - q0) + 1;
        lo = window > 0 && hi - window > 0 ? hi - window : 0;
    }
    /* [kbeg, kend): the positions rows r0 .. r1 - 1 attend to, together */
    __host__ __device__ void span(int64_t r0, int64_t r1, int64_t &kbeg, int64_t &kend) const
    {
        int64_t first_hi;
        reach(r0, kbeg, first_hi);
        kend = pos0 + (r1 - 1 - q0) + 1;
    }
    /* the cache row (block * bt + slot) of position j; -1 when the table names a block outside
     * the pool (a caller bug: the kernel traps) */
    __host__ __device__ int64_t cache_row(int64_t j) const
    {
        const int64_t blk = table[j / bt];
        return blk >= 0 && blk < n_blocks ? blk * bt + j % bt : -1;
    }
};

#endif
