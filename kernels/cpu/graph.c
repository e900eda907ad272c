/* kernels/cpu/graph.c - the CPU backend's graphs (ops.h backend_graph_*): a mirror of CUDA's
 * stream capture, for tests. While recording, the backend's table is a copy of the CPU's whose
 * serving-forward slots store each call's arguments by value (tensors, scalars, the attention
 * batch, rope's frequency table) instead of running it, and whose upload, download, synchronize,
 * alloc and free slots mark the recording failed, as CUDA's capture would refuse them. A launch
 * calls the CPU ops with the stored arguments in order: each reads the data as it is then, so a
 * caller that changed a value passed by value since the recording (a shape, a block table's row
 * length, max_seq_len) gets what a replayed CUDA graph would give it, not what it asked now.
 * Slots not recorded here (sampling, training) run at once even while recording; the serving
 * forward calls none of them.
 * Tests: tests/test_model.c (step graphs against the same steps without). */
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_ops.h"

enum rec_kind {
    REC_CAST, REC_EMBEDDING, REC_POS_ADD, REC_MATMUL, REC_RMSNORM, REC_ADD_RMSNORM, REC_LAYERNORM, REC_ADD,
    REC_SCALE, REC_SOFTCAP, REC_ROPE, REC_KV_WRITE, REC_ATTENTION, REC_ACTIVATION, REC_GATED, REC_COPY, REC_ZERO,
};

#define REC_TENSORS 5

/* One recorded call: its tensors (present: bit i set when t[i] was given, else NULL), scalars
 * and the by-value structures the slot reads. */
struct rec {
    enum rec_kind kind;
    struct tensor t[REC_TENSORS];
    unsigned      present;
    float         f;
    int64_t       i;
    int           e;
    void         *dst;
    const void   *src;
    size_t        n;
    struct attention_batch ab;
    float         freqs[ROPE_MAX_PAIRS]; /* rope: the table as it was (CUDA passes it by value) */
};

struct cpu_graph {
    const struct backend_ops *live; /* the CPU table the replay calls */
    struct rec *r;
    int         n, cap;
    const char *failed; /* what broke the recording, or NULL */
};

static struct backend_ops        record_ops;
static const struct backend_ops *live_ops;
static pthread_once_t            record_once = PTHREAD_ONCE_INIT;

static struct cpu_graph *recording(struct backend *b) { return ((struct cpu_state *)b->impl)->graph; }

static struct rec *add(struct backend *b, enum rec_kind kind)
{
    struct cpu_graph *g = recording(b);
    if (g->n == g->cap) {
        const int cap = g->cap ? 2 * g->cap : 64;
        struct rec *r = realloc(g->r, (size_t)cap * sizeof *r);
        CHECK(r, "cpu graph: out of memory for %d recorded ops", cap);
        g->r = r, g->cap = cap;
    }
    struct rec *r = &g->r[g->n++];
    memset(r, 0, offsetof(struct rec, freqs));
    r->kind = kind;
    return r;
}

static void put(struct rec *r, int i, const struct tensor *t)
{
    if (!t) return;
    r->t[i] = *t;
    r->present |= 1u << i;
}

static const struct tensor *got(const struct rec *r, int i) { return r->present >> i & 1 ? &r->t[i] : NULL; }

static void refuse(struct backend *b, const char *what)
{
    struct cpu_graph *g = recording(b);
    if (!g->failed) g->failed = what;
}

/* ---- the recording slots --------------------------------------------------------------------- */

static enum status rec_alloc(struct backend *b, size_t nbytes, void **ptr)
{
    (void)nbytes;
    refuse(b, "an alloc");
    *ptr = NULL;
    return status_errorf(STATUS_UNAVAILABLE, "cpu graph: no alloc while recording");
}
static void rec_free(struct backend *b, void *ptr) { (void)ptr, refuse(b, "a free"); }
static void rec_upload(struct backend *b, void *dst, const void *src, size_t n) { (void)dst, (void)src, (void)n, refuse(b, "an upload"); }
static void rec_download(struct backend *b, void *dst, const void *src, size_t n) { (void)dst, (void)src, (void)n, refuse(b, "a download"); }
static void rec_synchronize(struct backend *b) { refuse(b, "a synchronize"); }

static void rec_copy(struct backend *b, void *dst, const void *src, size_t n)
{
    struct rec *r = add(b, REC_COPY);
    r->dst = dst, r->src = src, r->n = n;
}

static void rec_memset_zero(struct backend *b, void *dst, size_t n)
{
    struct rec *r = add(b, REC_ZERO);
    r->dst = dst, r->n = n;
}

static void rec_cast(struct backend *b, const struct tensor *out, const struct tensor *in)
{
    struct rec *r = add(b, REC_CAST);
    put(r, 0, out), put(r, 1, in);
}

static void rec_embedding(struct backend *b, const struct tensor *out, const struct tensor *table,
                          const struct tensor *ids, int64_t vocab_start)
{
    struct rec *r = add(b, REC_EMBEDDING);
    put(r, 0, out), put(r, 1, table), put(r, 2, ids), r->i = vocab_start;
}

static void rec_pos_add(struct backend *b, const struct tensor *x, const struct tensor *table,
                        const struct tensor *positions)
{
    struct rec *r = add(b, REC_POS_ADD);
    put(r, 0, x), put(r, 1, table), put(r, 2, positions);
}

static void rec_matmul(struct backend *b, const struct tensor *y, const struct tensor *x, const struct tensor *w,
                       const struct tensor *bias)
{
    struct rec *r = add(b, REC_MATMUL);
    put(r, 0, y), put(r, 1, x), put(r, 2, w), put(r, 3, bias);
}

static void rec_rmsnorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                        const struct tensor *weight, float eps)
{
    struct rec *r = add(b, REC_RMSNORM);
    put(r, 0, out), put(r, 1, x), put(r, 2, weight), r->f = eps;
}

static void rec_add_rmsnorm(struct backend *b, const struct tensor *sum, const struct tensor *out,
                            const struct tensor *a, const struct tensor *c, const struct tensor *weight, float eps)
{
    struct rec *r = add(b, REC_ADD_RMSNORM);
    put(r, 0, sum), put(r, 1, out), put(r, 2, a), put(r, 3, c), put(r, 4, weight), r->f = eps;
}

static void rec_layernorm(struct backend *b, const struct tensor *out, const struct tensor *x,
                          const struct tensor *weight, const struct tensor *bias, float eps)
{
    struct rec *r = add(b, REC_LAYERNORM);
    put(r, 0, out), put(r, 1, x), put(r, 2, weight), put(r, 3, bias), r->f = eps;
}

static void rec_add(struct backend *b, const struct tensor *out, const struct tensor *a, const struct tensor *c)
{
    struct rec *r = add(b, REC_ADD);
    put(r, 0, out), put(r, 1, a), put(r, 2, c);
}

static void rec_scale(struct backend *b, const struct tensor *out, const struct tensor *x, float alpha)
{
    struct rec *r = add(b, REC_SCALE);
    put(r, 0, out), put(r, 1, x), r->f = alpha;
}

static void rec_softcap(struct backend *b, const struct tensor *out, const struct tensor *x, float cap)
{
    struct rec *r = add(b, REC_SOFTCAP);
    put(r, 0, out), put(r, 1, x), r->f = cap;
}

static void rec_rope(struct backend *b, const struct tensor *x, const struct tensor *positions, int rot_dim,
                     const struct rope_params *rp, enum rope_style style)
{
    struct rec *r = add(b, REC_ROPE);
    put(r, 0, x), put(r, 1, positions), r->i = rot_dim, r->f = rp->attn_factor, r->e = (int)style;
    memcpy(r->freqs, rp->freqs, (size_t)(rot_dim / 2) * sizeof(float));
}

static void rec_kv_write(struct backend *b, const struct tensor *k_cache, const struct tensor *v_cache,
                         const struct tensor *k, const struct tensor *v, const struct tensor *slots)
{
    struct rec *r = add(b, REC_KV_WRITE);
    put(r, 0, k_cache), put(r, 1, v_cache), put(r, 2, k), put(r, 3, v), put(r, 4, slots);
}

static void rec_attention(struct backend *b, const struct tensor *out, const struct tensor *q,
                          const struct tensor *k_cache, const struct tensor *v_cache,
                          const struct attention_batch *batch)
{
    struct rec *r = add(b, REC_ATTENTION);
    put(r, 0, out), put(r, 1, q), put(r, 2, k_cache), put(r, 3, v_cache), r->ab = *batch;
    if (batch->row_path) refuse(b, "an attention row path (a host array)");
    r->ab.row_path = NULL;
}

static void rec_activation(struct backend *b, const struct tensor *out, const struct tensor *x, enum activation act)
{
    struct rec *r = add(b, REC_ACTIVATION);
    put(r, 0, out), put(r, 1, x), r->e = (int)act;
}

static void rec_gated(struct backend *b, const struct tensor *out, const struct tensor *gate,
                      const struct tensor *up, enum activation act)
{
    struct rec *r = add(b, REC_GATED);
    put(r, 0, out), put(r, 1, gate), put(r, 2, up), r->e = (int)act;
}

/* The recording table: the CPU's, its serving-forward slots recording (matmul_many and rope_qk
 * stay NULL as on the CPU, so that their wrappers record matmul and rope calls). */
static void record_ops_init(void)
{
    record_ops = *live_ops;
    record_ops.alloc = rec_alloc, record_ops.free = rec_free;
    record_ops.upload = rec_upload, record_ops.download = rec_download;
    record_ops.synchronize = rec_synchronize;
    record_ops.copy = rec_copy, record_ops.memset_zero = rec_memset_zero;
    record_ops.cast = rec_cast, record_ops.embedding = rec_embedding, record_ops.position_embedding_add = rec_pos_add;
    record_ops.matmul = rec_matmul, record_ops.rmsnorm = rec_rmsnorm, record_ops.add_rmsnorm = rec_add_rmsnorm;
    record_ops.layernorm = rec_layernorm, record_ops.add = rec_add, record_ops.scale = rec_scale;
    record_ops.softcap = rec_softcap, record_ops.rope = rec_rope, record_ops.kv_write = rec_kv_write;
    record_ops.attention = rec_attention, record_ops.activation = rec_activation;
    record_ops.gated_activation = rec_gated;
    CHECK(!record_ops.matmul_many && !record_ops.rope_qk, "cpu graph: the CPU table gained slots the recording "
                                                          "does not cover");
}

/* ---- the graph slots --------------------------------------------------------------------------- */

enum status cpu_graph_begin(struct backend *b)
{
    struct cpu_state *s = b->impl;
    CHECK(!s->graph, "cpu graph: begin while recording");
    live_ops = b->ops; /* every CPU backend has the same table */
    pthread_once(&record_once, record_ops_init);
    s->graph = calloc(1, sizeof *s->graph);
    if (!s->graph) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "cpu graph: out of memory");
    s->graph->live = b->ops;
    b->ops = &record_ops;
    return STATUS_OK;
}

void cpu_graph_free(struct backend *b, void *graph)
{
    (void)b;
    struct cpu_graph *g = graph;
    free(g->r);
    free(g);
}

enum status cpu_graph_end(struct backend *b, void **graph)
{
    struct cpu_state *s = b->impl;
    struct cpu_graph *g = s->graph;
    CHECK(g, "cpu graph: end without a begin");
    b->ops = g->live;
    s->graph = NULL;
    *graph = NULL;
    if (g->failed) {
        const char *what = g->failed;
        cpu_graph_free(b, g);
        return status_errorf(STATUS_UNAVAILABLE, "cpu graph: %s while recording", what);
    }
    *graph = g;
    return STATUS_OK;
}

enum status cpu_graph_launch(struct backend *b, void *graph)
{
    const struct cpu_graph *g = graph;
    const struct backend_ops *o = g->live;
    for (int k = 0; k < g->n; k++) {
        const struct rec *r = &g->r[k];
        const struct tensor *t0 = got(r, 0), *t1 = got(r, 1), *t2 = got(r, 2), *t3 = got(r, 3), *t4 = got(r, 4);
        switch (r->kind) {
        case REC_CAST: o->cast(b, t0, t1); break;
        case REC_EMBEDDING: o->embedding(b, t0, t1, t2, r->i); break;
        case REC_POS_ADD: o->position_embedding_add(b, t0, t1, t2); break;
        case REC_MATMUL: o->matmul(b, t0, t1, t2, t3); break;
        case REC_RMSNORM: o->rmsnorm(b, t0, t1, t2, r->f); break;
        case REC_ADD_RMSNORM: o->add_rmsnorm(b, t0, t1, t2, t3, t4, r->f); break;
        case REC_LAYERNORM: o->layernorm(b, t0, t1, t2, t3, r->f); break;
        case REC_ADD: o->add(b, t0, t1, t2); break;
        case REC_SCALE: o->scale(b, t0, t1, r->f); break;
        case REC_SOFTCAP: o->softcap(b, t0, t1, r->f); break;
        case REC_ROPE: {
            const struct rope_params rp = {.freqs = r->freqs, .attn_factor = r->f};
            o->rope(b, t0, t1, (int)r->i, &rp, (enum rope_style)r->e);
            break;
        }
        case REC_KV_WRITE: o->kv_write(b, t0, t1, t2, t3, t4); break;
        case REC_ATTENTION: o->attention(b, t0, t1, t2, t3, &r->ab); break;
        case REC_ACTIVATION: o->activation(b, t0, t1, (enum activation)r->e); break;
        case REC_GATED: o->gated_activation(b, t0, t1, t2, (enum activation)r->e); break;
        case REC_COPY: o->copy(b, r->dst, r->src, r->n); break;
        case REC_ZERO: o->memset_zero(b, r->dst, r->n); break;
        }
    }
    return STATUS_OK;
}
