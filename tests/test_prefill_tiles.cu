/* tests/test_prefill_tiles.cu - the tensor-core prefill kernel's index arithmetic
 * (kernels/cuda/attention_prefill.cuh) run on the host, where it is the same source, against the
 * definitions of op_attention (kernels/ops.h): over 2,000 random batches (0 to 7 sequences of 0 to
 * 300 new rows after 0 to 200 cached positions, block_tokens 1, 3, 16 and 32, windows 0, 1, 5,
 * 64 and 100, block tables in a shuffled pool):
 *   - the grid the launcher makes (rows / 64 + n_seqs blocks) holds every tile, each row of
 *     each sequence lies in exactly one tile of at most 64 rows of its own sequence, and the
 *     block after the last tile returns;
 *   - each row attends to positions [lo, hi), hi = its position + 1, lo = 0 or hi - window;
 *   - a tile's span of keys is the union of its rows' and lies within the sequence's cache;
 *   - every position of a span is read from the cache row table[j / bt] * bt + j % bt;
 *   - a table entry outside the pool is reported (-1), never read.
 * What this does not show: the tensor-core arithmetic around it (the training forward it
 * shares ran on GPUs; the prefill itself: tests/test_ops.c --backend cuda, label gpu).
 * Built only where nvcc is (SHARDLM_HAVE_CUDA); needs no GPU. Exits 1 on any failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_prefill.cuh"

#define TILE 64

static int n_fail;
static long n_checked;

static void expect(int ok, const char *what, int batch)
{
    n_checked++;
    if (!ok && n_fail++ < 20) printf("FAIL batch %d: %s\n", batch, what);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static int below(int n)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return n > 0 ? (int)((rng >> 33) % (uint64_t)n) : 0;
}

int main(void)
{
    static const int sizes[] = {0, 1, 2, 15, 63, 64, 65, 127, 128, 129, 300};
    static const int bts[] = {1, 3, 16, 32}, windows[] = {0, 1, 5, 64, 100};
    for (int batch = 0; batch < 2000; batch++) {
        const int n_seqs = below(8), bt = bts[below(4)], window = windows[below(5)];
        int32_t q_start[9] = {0}, seq_len[8], n_new[8];
        int max_blocks = 1;
        for (int s = 0; s < n_seqs; s++) {
            n_new[s] = sizes[below(11)];
            seq_len[s] = n_new[s] + (below(2) ? below(201) : 0);
            q_start[s + 1] = q_start[s] + n_new[s];
            const int nb = (seq_len[s] + bt - 1) / bt;
            if (nb + 1 > max_blocks) max_blocks = nb + 1;
        }
        const int64_t n = q_start[n_seqs];
        /* a pool of every sequence's blocks, shuffled; entries past a sequence's blocks name none */
        int64_t pool = 0;
        for (int s = 0; s < n_seqs; s++) pool += (seq_len[s] + bt - 1) / bt;
        int32_t *perm = (int32_t *)malloc(sizeof(int32_t) * (size_t)(pool + 1));
        for (int64_t i = 0; i < pool; i++) perm[i] = (int32_t)i;
        for (int64_t i = pool - 1; i > 0; i--) {
            const int j = below((int)i + 1);
            const int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        int32_t *table = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n_seqs * max_blocks + 1));
        for (int s = 0, next = 0; s < n_seqs; s++)
            for (int j = 0; j < max_blocks; j++)
                table[s * max_blocks + j] = j < (seq_len[s] + bt - 1) / bt ? perm[next++]
                                            : (int32_t)(j % 3 == 0 ? pool : j % 3 == 1 ? -1 : pool + 5);
        int *covered = (int *)calloc((size_t)n + 1, sizeof(int));

        const int64_t grid = (n + TILE - 1) / TILE + n_seqs;
        int64_t tiles = 0;
        for (int s = 0; s < n_seqs; s++) tiles += (n_new[s] + TILE - 1) / TILE;
        expect(tiles <= grid, "the grid holds every tile", batch);
        int s_;
        int64_t r0, r1;
        expect(!prefill_tile(q_start, n_seqs, tiles, TILE, &s_, &r0, &r1), "past the last tile: none", batch);
        for (int64_t x = 0; x < tiles; x++) {
            int s;
            if (!prefill_tile(q_start, n_seqs, x, TILE, &s, &r0, &r1)) {
                expect(0, "a tile before the last is found", batch);
                continue;
            }
            expect(s >= 0 && s < n_seqs && r0 >= q_start[s] && r0 < r1 && r1 <= q_start[s + 1] && r1 - r0 <= TILE,
                   "a tile holds 1 to 64 rows of its own sequence", batch);
            for (int64_t r = r0; r < r1; r++) covered[r]++;
            const tc_paged_keys keys = {table + s * max_blocks, q_start[s], seq_len[s] - n_new[s], pool, bt, window, 4};
            int64_t kbeg, kend, lo_min = INT64_MAX, hi_max = 0;
            keys.span(r0, r1, kbeg, kend);
            for (int64_t r = r0; r < r1; r++) {
                int64_t lo, hi;
                keys.reach(r, lo, hi);
                const int64_t pos = seq_len[s] - n_new[s] + (r - q_start[s]);
                const int64_t want_lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
                expect(hi == pos + 1 && lo == want_lo, "a row attends to [pos + 1 - window, pos]", batch);
                if (lo < lo_min) lo_min = lo;
                if (hi > hi_max) hi_max = hi;
            }
            expect(kbeg == lo_min && kend == hi_max && kbeg >= 0 && kend <= seq_len[s],
                   "a tile's span is its rows' union, inside the sequence's cache", batch);
            for (int64_t j = kbeg; j < kend; j++)
                expect(keys.cache_row(j) == (int64_t)table[s * max_blocks + j / bt] * bt + j % bt,
                       "position j's cache row", batch);
            if (seq_len[s] < max_blocks * bt) { /* the unused entry after the sequence's blocks */
                expect(keys.cache_row((int64_t)max_blocks * bt - 1) == -1, "a block outside the pool: -1", batch);
            }
        }
        for (int64_t r = 0; r < n; r++) expect(covered[r] == 1, "every row in exactly one tile", batch);
        free(covered), free(table), free(perm);
    }
    printf("%ld checks, %d failed\n", n_checked, n_fail);
    return n_fail ? 1 : 0;
}
