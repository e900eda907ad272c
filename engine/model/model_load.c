/* engine/model/model_load.c - model_load: builds a struct model for one (tp, pp) shard from any
 * checkpoint layout through checkpoint_get, in the backend's compute dtype; GGUF weights stored
 * as ggml blocks stay blocks (on the CPU: where the slice is whole rows, packed for decode from
 * the mapping, or mapped zero-copy, or with packing on copied; on CUDA uploaded as the same bytes).
 * Not here: the forward pass and workspace (model.c), file formats (checkpoint.c).
 * Tests: tests/test_model.c. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"
#include "moe.h"
#include "quant.h"

/* Adds block type dt to m->quantization ("Q4_1,Q8_0"), once. */
static void quantization_note(struct model *m, enum dtype dt)
{
    char name[16]; /* ggml's spelling: Q4_K */
    snprintf(name, sizeof name, "%s", dtype_name(dt));
    for (char *p = name; *p; p++) *p = (char)toupper((unsigned char)*p);
    char *q = m->quantization;
    if (!strcmp(q, "none")) q[0] = 0;
    for (const char *p = q; (p = strstr(p, name)); p += strlen(name))
        if ((p == q || p[-1] == ',') && (p[strlen(name)] == 0 || p[strlen(name)] == ',')) return;
    size_t n = strlen(q);
    snprintf(q + n, sizeof m->quantization - n, "%s%s", n ? "," : "", name);
}

static enum status own(struct model *m, void *ptr)
{
    if (base_grow((void **)&m->owned, &m->cap_owned, m->n_owned + 1, sizeof *m->owned))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    m->owned[m->n_owned++] = ptr;
    return STATUS_OK;
}

/* A weight's memory, owned by the model; on the CPU backed by huge pages where it is 2 MB or
 * more (cpu_memory_huge): every decode step streams every weight, and on 4 KB pages the walks of
 * the page tables cost a fifth to a quarter of one thread's read bandwidth on the Zen 4 VM of
 * 2026-12-03 (tools/cpu_ceilings.c: 29.4 GB/s on huge pages, 21.5 on 4 KB ones). */
static enum status alloc_weight(struct model *m, size_t nbytes, void **p)
{
    enum status st = backend_alloc(m->b, nbytes, p);
    if (st == STATUS_OK && (st = own(m, *p)) != STATUS_OK) backend_free(m->b, *p);
    if (st == STATUS_OK && m->b->device == DEVICE_CPU) cpu_memory_huge(*p, nbytes);
    return st;
}

/* Host staging for devices that are not host memory: grows to the largest weight. */
struct staging {
    void       *buf;
    size_t      size;
    const char *dir; /* the checkpoint directory, for messages */
};

/* Norm weights get cfg.norm_weight_offset added at load (HF Gemma stores w for x * (1 + w)). */
static void add_offset(void *data, enum dtype dt, size_t n, float offset)
{
    for (size_t i = 0; i < n; i++) dtype_store_f32(data, dt, i, dtype_load_f32(data, dt, i) + offset);
}

/* The first non-finite value of ggml blocks (rows of k values), found by dequantizing each row:
 * a NaN or Inf can only come from a block's f16 scales (the quants are integers). About one
 * dequantization of the weights at load. */
static int64_t first_non_finite_blocks(const void *data, enum dtype dt, size_t nbytes, int64_t k)
{
    const enum quant_type qt = (enum quant_type)dtype_quant_type(dt);
    const size_t row = quant_row_bytes(qt, k);
    float *buf = malloc((size_t)k * sizeof *buf);
    if (!buf || row == 0) {
        free(buf);
        return -1;
    }
    int64_t found = -1;
    for (size_t r = 0; r < nbytes / row && found < 0; r++) {
        quant_dequantize_row(qt, (const char *)data + r * row, buf, k);
        const int64_t at = dtype_first_non_finite(buf, DTYPE_F32, (size_t)k);
        if (at >= 0) found = (int64_t)r * k + at;
    }
    free(buf);
    return found;
}

/* check_finite of a part of a weight that starts at element `first` (named in the message). */
static enum status check_finite_at(const char *dir, enum weight_kind kind, int layer, enum dtype dt,
                                   const void *data, size_t nbytes, int64_t cols, int64_t first)
{
    const int64_t at = dtype_is_quant(dt) ? first_non_finite_blocks(data, dt, nbytes, cols)
                                          : dtype_first_non_finite(data, dt, nbytes / dtype_size(dt));
    if (at < 0) return STATUS_OK;
    return status_errorf(STATUS_BAD_FORMAT, "%s: weight %s of layer %d holds a NaN or Inf (element %lld): the "
                         "checkpoint is corrupt", dir, weight_kind_name(kind), layer, (long long)(first + at));
}

static enum status check_finite(const char *dir, enum weight_kind kind, int layer, enum dtype dt,
                                const void *data, size_t nbytes, int64_t cols)
{
    return check_finite_at(dir, kind, layer, dt, data, nbytes, cols, 0);
}

/* The dtype a weight is loaded in, m->dtype unless: a weight stored as ggml blocks (GGUF)
 * keeps its block dtype when the model keeps blocks (serving, CPU or CUDA) and only op_matmul /
 * op_embedding read it (matrices other than the learned positions); so does a bf16 or f16 matrix
 * served on a CPU that multiplies such weights in place (cpu_half_weights_in_place: AMX tiles
 * for bf16, or a decode gemv that widens them in registers; half the memory of the f32 copy, and
 * faster). Otherwise m->dtype (converted at load: training, merging). Attention sinks are f32
 * always. */
static enum dtype load_dtype(const struct model *m, enum weight_kind kind, const struct host_weight *hw)
{
    if (kind == WEIGHT_KIND_SINKS) return DTYPE_F32; /* op_attention reads them in f32 (ops.h) */
    if (kind == WEIGHT_KIND_ROUTER_SEL_BIAS) return DTYPE_F32; /* read on the host by the routing (moe.c) */
    if (!m->keep_blocks || hw->ndim != 2 || kind == WEIGHT_KIND_POS_EMBEDDING) return m->dtype;
    if (dtype_is_quant(hw->stored_dtype)) return hw->stored_dtype;
    if ((hw->stored_dtype == DTYPE_BF16 || hw->stored_dtype == DTYPE_F16) && m->dtype == DTYPE_F32 &&
        m->b->device == DEVICE_CPU && cpu_half_weights_in_place(hw->stored_dtype))
        return hw->stored_dtype;
    return m->dtype;
}

void model_shard_of(const struct model *m, enum weight_kind kind, int layer, int *rank, int *size)
{
    const int experts = weight_kind_per_expert(kind);
    *rank = experts && m->ep_size > 1 ? m->ep_rank : m->tp_rank;
    *size = experts && m->ep_size > 1 ? m->ep_size : m->tp_size;
    /* Training's ep groups at tp > 1: tp rank t's block of experts, split over its ep group. */
    if (experts && m->ep_size > 1 && !m->par.ep) *rank = m->tp_rank * m->ep_size + m->ep_rank, *size *= m->tp_size;
    const int dense_mlp = kind == WEIGHT_KIND_GATE || kind == WEIGHT_KIND_GATE_BIAS || kind == WEIGHT_KIND_UP ||
                          kind == WEIGHT_KIND_UP_BIAS || kind == WEIGHT_KIND_DOWN || kind == WEIGHT_KIND_DOWN_BIAS;
    if (m->par.ep && dense_mlp && config_layer_moe(&m->cfg, layer))
        *rank = 0, *size = 1; /* the shared expert runs whole over a slice (moe.c) */
}

/* Gives back the whole pages of [p, p + n) of a read-only file mapping (MADV_DONTNEED: a later
 * read brings them back from the file). An optimisation: failing costs memory only. */
static void release_mapped(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    const uintptr_t lo = (a + page - 1) / page * page, hi = (a + n) / page * page;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* Decode's layout (kernels/quant.h, quant_pack_rows8): a Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K or Q6_K matrix served
 * from the mapping gets a copy packed eight rows at a time, which every CPU product reads (the
 * same bits as the stored rows). It is checked for NaN / Inf, packed and its mapped pages given
 * back a few MB at a time (they come back from the file if something reads the stored rows),
 * so that neither the weight nor the load holds both copies: Gemma's 178 MB embedding, checked
 * whole first, took the peak 48 MB above the stored path's. Weights copied to the heap (slices
 * across their columns at tp > 1) are not packed: both copies would stay. 0 when t is not
 * packed (the caller checks it whole); SHARDLM_CPU_PACK=0 turns packing off. */
static int packing_on(void)
{
    const char *env = getenv("SHARDLM_CPU_PACK");
    return !(env && !strcmp(env, "0"));
}

static int packs(const struct tensor *t)
{
    return dtype_is_quant(t->dtype) && t->ndim == 2 && packing_on() &&
           quant_packable((enum quant_type)dtype_quant_type(t->dtype), t->shape[0], t->shape[1]);
}

static enum status pack_mapped(struct model *m, const char *dir, enum weight_kind kind, int layer, struct tensor *t)
{
    const enum quant_type qt = (enum quant_type)dtype_quant_type(t->dtype);
    const int64_t n = t->shape[0], k = t->shape[1];
    const size_t row = quant_row_bytes(qt, k), group = quant_packed_bytes(qt, 8, k);
    void *p = NULL;
    enum status st = alloc_weight(m, quant_packed_bytes(qt, n, k), &p);
    if (st != STATUS_OK) return st;
    int64_t step = (int64_t)((4u << 20) / (row * 8)) * 8; /* about 4 MB of rows, whole groups */
    if (step < 8) step = 8;
    for (int64_t r0 = 0; r0 < n; r0 += step) {
        const int64_t rows = n - r0 < step ? n - r0 : step;
        const uint8_t *src = (const uint8_t *)t->data + (size_t)r0 * row;
        if ((st = check_finite_at(dir, kind, layer, t->dtype, src, (size_t)rows * row, k, r0 * k)) != STATUS_OK) return st;
        quant_pack_rows8(qt, (uint8_t *)p + (size_t)(r0 / 8) * group, src, rows, k);
        release_mapped(src, (size_t)rows * row);
    }
    t->packed = p, t->packed_of = t->data, t->packed_rows = n, t->packed_cols = k;
    m->weight_bytes_packed += quant_packed_bytes(qt, n, k);
    return STATUS_OK;
}

/* A block matrix that cannot be packed (Q5_K, Q2_K, ...) is copied to the heap when packing is
 * on, never served from the mapping: the kernel maps a read page's whole page-cache folio (up to
 * 2 MB here), so every decode step's read of a mapped Q6_K matrix brought back the file pages
 * of the packed weights beside it, given back at load (Gemma 3 270M Q4_K_M kept 48 of its 226
 * packed MB resident that way: peak RSS 1.21x llama.cpp's). Copied, nothing reads the mapping
 * after the load. The same bytes resident either way, copied a few MB at a time (each part's
 * pages given back), checked for NaN / Inf. With huge pages on (cpu_hugepages_on) every matrix
 * served from the mapping is copied so, onto them (alloc_weight). */
static int copies_unpacked(const struct tensor *t)
{
    return (dtype_is_quant(t->dtype) && packing_on()) || cpu_hugepages_on();
}

static enum status copy_mapped(struct model *m, const char *dir, enum weight_kind kind, int layer, struct tensor *t)
{
    const size_t nbytes = tensor_nbytes(t), step = 4u << 20;
    void *p = NULL;
    enum status st = alloc_weight(m, nbytes, &p);
    if (st != STATUS_OK) return st;
    for (size_t off = 0; off < nbytes; off += step) {
        const size_t len = nbytes - off < step ? nbytes - off : step;
        memcpy((uint8_t *)p + off, (const uint8_t *)t->data + off, len);
        release_mapped((const uint8_t *)t->data + off, len);
    }
    t->data = p;
    m->weight_bytes_mapped -= nbytes;
    m->weight_bytes_unpacked += nbytes;
    return check_finite(dir, kind, layer, t->dtype, p, nbytes, t->shape[1]);
}

/* Once every weight is loaded: when none is read from the mapping (each served one packed, the
 * other block matrices copied), the whole file's pages are given back once more: pages given
 * back part by part at packing came back while neighbours were read (whole folios), before the
 * load ended. */
static void release_mapping(struct model *m)
{
    if (m->weight_bytes_mapped == 0 && m->weight_bytes_packed == 0) return; /* nothing was mapped */
    struct weight_ref *table = malloc((size_t)weights_table_max(m->w.n_layers) * sizeof *table);
    if (!table) return; /* an optimisation: memory only */
    const int n = weights_table(&m->w, m->layer_first, 1, table);
    int reads = 0;
    for (int i = 0; i < n && !reads; i++) {
        const struct tensor *t = table[i].t;
        reads = !tensor_packed(t) && !model_owns(m, t->data);
    }
    free(table);
    if (!reads) checkpoint_release_pages(m->checkpoint, 1);
}

/* Loads one weight slice into *t on the model's device, refusing NaN and Inf. */
static enum status load_weight(struct model *m, struct staging *stg, enum weight_kind kind,
                               int layer, struct tensor *t)
{
    const float offset = weight_kind_is_norm(kind) ? m->cfg.norm_weight_offset : 0.0f;
    struct backend *b = m->b;
    struct host_weight hw;
    int rank, size;
    model_shard_of(m, kind, layer, &rank, &size);
    enum status st = checkpoint_describe(m->checkpoint, kind, layer, rank, size,
                                         m->dtype, &hw);
    if (st != STATUS_OK) return st;
    const enum dtype dt = load_dtype(m, kind, &hw);
    if (dt != m->dtype &&
        (st = checkpoint_describe(m->checkpoint, kind, layer, rank, size, dt, &hw)) != STATUS_OK)
        return st;
    *t = hw.ndim == 1 ? tensor_make(NULL, dt, b->device, 1, hw.shape[0])
                      : tensor_make(NULL, dt, b->device, 2, hw.shape[0], hw.shape[1]);
    m->weight_bytes += hw.nbytes;
    if (dtype_is_quant(dt)) {
        m->weight_bytes_blocks += hw.nbytes;
        quantization_note(m, dt);
    }
    if (b->device == DEVICE_CPU && hw.zero_copy && offset == 0.0f && hw.ndim == 2) {
        /* The mapping is read-only, and ops only read weights. Vectors (norms, biases) are
         * copied: a read of one faults in the 64 KB around it (the kernel's fault-around), and
         * once the mapping's pages are given back (checkpoint_release_pages) SmolLM2's 61 norms
         * brought back 7 MB that way. */
        st = checkpoint_get(m->checkpoint, kind, layer, rank, size, dt, NULL, 0,
                            CHECKPOINT_GET_ZERO_COPY_OK, &hw);
        if (st != STATUS_OK) return st;
        t->data = (void *)hw.data;
        m->weight_bytes_mapped += hw.nbytes;
        if (packs(t)) return pack_mapped(m, stg->dir, kind, layer, t);
        if (copies_unpacked(t)) return copy_mapped(m, stg->dir, kind, layer, t);
        return check_finite(stg->dir, kind, layer, dt, hw.data, hw.nbytes, hw.ndim == 2 ? hw.shape[1] : hw.shape[0]);
    }
    void *dev = NULL;
    if ((st = alloc_weight(m, hw.nbytes, &dev)) != STATUS_OK) return st;
    t->data = dev;
    if (b->device == DEVICE_CPU) {
        st = checkpoint_get(m->checkpoint, kind, layer, rank, size, dt, dev,
                            hw.nbytes, 0, &hw);
        if (st == STATUS_OK && offset != 0.0f) add_offset(dev, dt, hw.nbytes / dtype_size(dt), offset);
        return st == STATUS_OK ? check_finite(stg->dir, kind, layer, dt, dev, hw.nbytes, hw.ndim == 2 ? hw.shape[1] : hw.shape[0]) : st;
    }
    if (stg->size < hw.nbytes) {
        free(stg->buf);
        stg->buf = aligned_alloc(64, (hw.nbytes + 63) / 64 * 64);
        stg->size = stg->buf ? hw.nbytes : 0;
        if (!stg->buf) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory staging %zu bytes", hw.nbytes);
    }
    /* dt is m->dtype, or a block dtype (the blocks' bytes, uploaded as they are; never a norm,
     * so never an offset). */
    st = checkpoint_get(m->checkpoint, kind, layer, rank, size, dt, stg->buf, stg->size, 0, &hw);
    if (st != STATUS_OK) return st;
    if (offset != 0.0f) add_offset(stg->buf, dt, hw.nbytes / dtype_size(dt), offset);
    if ((st = check_finite(stg->dir, kind, layer, dt, stg->buf, hw.nbytes, hw.ndim == 2 ? hw.shape[1] : hw.shape[0])) != STATUS_OK)
        return st;
    backend_upload(b, dev, stg->buf, hw.nbytes);
    return STATUS_OK;
}

int model_rope_factors(const struct model_config *c, double *out)
{
    const struct rope_scaling *s = &c->rope_scaling;
    const int half = c->rot_dim / 2;
    /* Dynamic NTK changes nothing within max_position_embeddings, the context (config.h). */
    if (s->kind == ROPE_SCALING_NONE || s->kind == ROPE_SCALING_DYNAMIC || c->positions != POSITION_KIND_ROTARY ||
        half <= 0)
        return 0;
    const double base = c->rope_theta, factor = s->factor, pi = 3.14159265358979323846;
    double low = 0.0, high = 0.0; /* YaRN's correction range, in pair indices */
    if (s->kind == ROPE_SCALING_YARN) {
        const double dim = c->rot_dim, orig = s->original_max_positions;
        low = dim * log(orig / ((double)s->beta_fast * 2.0 * pi)) / (2.0 * log(base));
        high = dim * log(orig / ((double)s->beta_slow * 2.0 * pi)) / (2.0 * log(base));
        if (!s->untruncated) low = floor(low), high = ceil(high); /* transformers' truncate (true by default) */
        if (low < 0.0) low = 0.0;
        if (high > dim - 1.0) high = dim - 1.0;
        if (low == high) high += 0.001;
    }
    if (s->kind == ROPE_SCALING_FACTORS || s->kind == ROPE_SCALING_LONGROPE) {
        for (int i = 0; i < half; i++) out[i] = s->factors[i];
        return 1;
    }
    for (int i = 0; i < half; i++) {
        const double inv = pow(base, -(2.0 * i) / c->rot_dim);
        double scaled = inv / factor;
        if (s->kind == ROPE_SCALING_LLAMA3) {
            const double orig = s->original_max_positions, wavelen = 2.0 * pi / inv;
            const double low_wavelen = orig / s->low_freq_factor, high_wavelen = orig / s->high_freq_factor;
            if (wavelen < high_wavelen) scaled = inv;
            else if (wavelen <= low_wavelen) { /* between: a smooth mix of the two */
                const double smooth = (orig / wavelen - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
                scaled = (1.0 - smooth) * inv / factor + smooth * inv;
            }
        } else if (s->kind == ROPE_SCALING_YARN) {
            double ramp = (i - low) / (high - low);
            ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
            const double extrapolation = 1.0 - ramp; /* 1: the original frequency */
            scaled = inv / factor * (1.0 - extrapolation) + inv * extrapolation;
        }
        out[i] = inv / scaled;
    }
    return 1;
}

/* m->rope_freqs from the config's thetas and rope scaling (config_validate bounds rot_dim / 2 by
 * ROPE_MAX_FACTORS). */
_Static_assert(ROPE_MAX_FACTORS <= ROPE_MAX_PAIRS, "a config's rot_dim must fit the rope table");
static void load_rope_freqs(struct model *m)
{
    const struct model_config *c = &m->cfg;
    const int half = c->rot_dim / 2;
    if (c->positions != POSITION_KIND_ROTARY || half <= 0 || half > ROPE_MAX_PAIRS) return;
    double d[ROPE_MAX_PAIRS];
    float f[ROPE_MAX_PAIRS];
    const int scaled = model_rope_factors(c, d);
    for (int i = 0; i < half && scaled; i++) f[i] = (float)d[i];
    rope_frequencies(c->rope_theta, c->rot_dim, scaled ? f : NULL, m->rope_freqs[0]);
    if (c->rope_theta_local > 0.0f) rope_frequencies(c->rope_theta_local, c->rot_dim, NULL, m->rope_freqs[1]);
}

/* Loads the weight when the model has it; leaves *t zeroed (absent) otherwise. */
static enum status load_optional(struct model *m, struct staging *stg, enum weight_kind kind,
                                 int layer, struct tensor *t)
{
    memset(t, 0, sizeof *t);
    if (!weight_kind_exists_at(&m->cfg, kind, layer)) return STATUS_OK;
    return load_weight(m, stg, kind, layer, t);
}

/* Loads every weight of this stage through the layout table (weights.h): the embeddings on
 * the first stage, the layers of this stage, the final norm and LM head on the last; absent
 * optional weights (biases, Gemma's extra norms) stay empty. */
static enum status load_weights(struct model *m, struct staging *stg)
{
    const int first_stage = m->pp_rank == 0, last_stage = m->pp_rank == m->pp_size - 1;
    struct weight_ref *table = malloc((size_t)weights_table_max(m->w.n_layers) * sizeof *table);
    if (!table) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    const int n = weights_table(&m->w, m->layer_first, 0, table);
    enum status st = STATUS_OK;
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        const enum weight_kind k = table[i].kind;
        const int embedding = weight_names_of(k)->place == WEIGHT_PLACE_FIRST;
        const int head = k == WEIGHT_KIND_FINAL_NORM || k == WEIGHT_KIND_FINAL_NORM_BIAS ||
                         k == WEIGHT_KIND_LM_HEAD;
        if ((embedding && !first_stage) || (head && !last_stage)) continue;
        const int required = k == WEIGHT_KIND_TOK_EMBEDDING ||
                             ((k == WEIGHT_KIND_FINAL_NORM || k == WEIGHT_KIND_LM_HEAD) && !m->cfg.encoder);
        const int layer = table[i].layer >= 0 ? table[i].layer : 0;
        st = required ? load_weight(m, stg, k, layer, table[i].t)
                      : load_optional(m, stg, k, layer, table[i].t);
    }
    free(table);
    if (st == STATUS_OK && m->w.tied) m->w.lm_head = m->w.tok_embedding; /* shared, not copied */
    return st;
}

enum status model_parse_pp_layers(const char *text, int pp_size, int n_layers, int *out)
{
    int n = 0, sum = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 100000 || (*end && *end != ','))
            return status_errorf(STATUS_INVALID_ARGUMENT, "--pp-layers '%s': a comma-separated list of positive layer counts", text);
        if (n == pp_size)
            return status_errorf(STATUS_INVALID_ARGUMENT, "--pp-layers '%s': more than pp = %d stages", text, pp_size);
        out[n++] = (int)v;
        sum += (int)v;
        p = *end ? end + 1 : end;
    }
    if (n != pp_size || sum != n_layers)
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "--pp-layers '%s': needs %d stages summing to the model's %d layers (got %d stages, %d layers)",
                             text, pp_size, n_layers, n, sum);
    return STATUS_OK;
}

static enum status load_model(const char *dir, struct backend *b, const struct model_parallel *par, int dtype,
                              int io_only, struct model **out);

enum status model_load(const char *dir, struct backend *b, const struct model_parallel *par,
                       struct model **out)
{
    return load_model(dir, b, par, -1, 0, out);
}

enum status model_load_as(const char *dir, struct backend *b, const struct model_parallel *par,
                          int dtype, struct model **out)
{
    return load_model(dir, b, par, dtype, 0, out);
}

enum status model_load_io(const char *dir, struct backend *b, struct model **out)
{
    return load_model(dir, b, NULL, -1, 1, out);
}

/* model_load_as; io_only: no layers, only the embeddings, the final norm and the LM head (whole) */
static enum status load_model(const char *dir, struct backend *b, const struct model_parallel *par, int dtype,
                              int io_only, struct model **out)
{
    *out = NULL;
    /* Under expert parallelism in serving the layout's tp group is the ep group and nothing is
     * tensor-parallel; in training the ep group is carved out of dp (parallel_groups_add_ep). */
    const int ep = par && par->ep, ep_train = par && par->groups && par->groups->ep;
    const struct comm *atp = ep && par->groups ? par->groups->atp : NULL; /* --ep E --tp T: attention's tp */
    const int ep_rank = ep ? par->layout.tp_rank : ep_train ? par->groups->ep->rank : 0;
    const int ep_size = ep ? par->layout.tp_size : ep_train ? par->groups->ep->size : 1;
    const int tp_rank = atp ? atp->rank : par && !ep ? par->layout.tp_rank : 0;
    const int tp_size = atp ? atp->size : par && !ep ? par->layout.tp_size : 1;
    const int pp_rank = par ? par->layout.pp_rank : 0, pp_size = par ? par->layout.pp_size : 1;
    if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size || pp_size < 1 || pp_rank < 0 ||
        pp_rank >= pp_size)
        return status_errorf(STATUS_INVALID_ARGUMENT, "model: bad parallel rank tp %d/%d pp %d/%d",
                             tp_rank, tp_size, pp_rank, pp_size);
    if ((tp_size > 1 || pp_size > 1 || ep_size > 1) && (!par || !par->groups || !par->world))
        return status_errorf(STATUS_INVALID_ARGUMENT, "model: tp/pp > 1 needs the parallel groups");
    struct model *m = calloc(1, sizeof *m);
    if (m) snprintf(m->quantization, sizeof m->quantization, "none");
    struct staging stg = {.dir = dir};
    if (!m) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
    enum status st = checkpoint_open(dir, &m->checkpoint);
    if (st != STATUS_OK) goto fail;
    const struct model_config *c = &m->checkpoint->cfg;
    m->cfg = *c;
    m->b = b;
    if (par) m->par = *par;
    else m->par.layout = (struct parallel_layout){.world_size = 1, .tp_size = 1, .pp_size = 1,
                                                  .dp_size = 1, .pp_prev = -1, .pp_next = -1};
    m->tp_rank = tp_rank;
    m->tp_size = tp_size;
    m->pp_rank = pp_rank;
    m->pp_size = pp_size;
    m->ep_rank = ep_rank;
    m->ep_size = ep_size;
    if (ep_size > 1 && (st = moe_ep_check(c, ep ? ep_size : ep_size * tp_size, tp_size)) != STATUS_OK) goto fail;
    if (pp_size > c->n_layers) {
        st = status_errorf(STATUS_INVALID_ARGUMENT, "model: pp %d exceeds the %d layers", pp_size, c->n_layers);
        goto fail;
    }
    /* q and k normed over every head at once: layer_qk_norm gathers the rows over tp, which needs
     * every rank to hold distinct KV heads. */
    if (tp_size > c->n_kv_heads && c->qk_norm == QK_NORM_FULL) {
        st = status_errorf(STATUS_UNSUPPORTED, "model: %s normalises k over every KV head at once; tp %d above its %d KV "
                           "heads (replicated on several ranks) is not built for it", c->architecture, tp_size,
                           c->n_kv_heads);
        goto fail;
    }
    if (c->encoder && (tp_size > 1 || pp_size > 1)) { /* model_embed runs one rank's whole model */
        st = status_errorf(STATUS_UNSUPPORTED, "model: %s is an encoder, served at tp 1 and pp 1 only (got tp %d, pp %d)",
                           c->architecture, tp_size, pp_size);
        goto fail;
    }
    if (par && par->pp_layers) { /* an explicit split (--pp-layers) */
        int *per = calloc((size_t)pp_size, sizeof *per);
        if (!per) {
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
            goto fail;
        }
        st = model_parse_pp_layers(par->pp_layers, pp_size, c->n_layers, per);
        m->layer_first = 0;
        for (int i = 0; i < pp_rank; i++) m->layer_first += per[i];
        m->n_layers_local = per[pp_rank];
        free(per);
        if (st != STATUS_OK) goto fail;
    } else {
        checkpoint_pp_layers(c->n_layers, pp_size, pp_rank, &m->layer_first, &m->n_layers_local);
    }
    if (io_only) m->layer_first = c->n_layers, m->n_layers_local = 0; /* one stage, first and last */
    /* CPUs compute in f32; GPUs in bf16, or f16 for checkpoints trained in f16. */
    m->dtype = b->device == DEVICE_CPU ? DTYPE_F32 : (c->dtype == DTYPE_F16 ? DTYPE_F16 : DTYPE_BF16);
    if (dtype >= 0) m->dtype = (enum dtype)dtype;
    /* GGUF blocks stay blocks when serving (both backends have kernels for them, ops.h); a
     * chosen dtype (training, merging) means every weight in that dtype. */
    m->keep_blocks = dtype < 0;

    /* Local sizes follow the slices the checkpoint hands out (heads, KV replication, vocab). */
    struct host_weight hw;
    if ((st = checkpoint_describe(m->checkpoint, WEIGHT_KIND_Q, 0, tp_rank, tp_size, m->dtype, &hw)) != STATUS_OK) goto fail;
    m->n_heads_local = (int)(hw.shape[0] / c->head_dim);
    if ((st = checkpoint_describe(m->checkpoint, WEIGHT_KIND_K, 0, tp_rank, tp_size, m->dtype, &hw)) != STATUS_OK) goto fail;
    m->n_kv_local = (int)(hw.shape[0] / c->head_dim);
    if (c->n_experts) { /* whole experts per tp rank (checkpoint.c refuses a tp that does not divide them) */
        int er, es;
        const int sparse = c->n_layers - 1; /* the last layer always runs the experts (config.c) */
        model_shard_of(m, WEIGHT_KIND_EXP_UP, sparse, &er, &es);
        if ((st = checkpoint_describe(m->checkpoint, WEIGHT_KIND_EXP_UP, sparse, er, es, m->dtype, &hw)) != STATUS_OK)
            goto fail;
        m->n_experts_local = (int)(hw.shape[0] / c->moe_ffn);
        m->expert_first = er * m->n_experts_local;
    }
    /* The widest dense MLP of this stage's layers (a shared expert, or GLM's dense first layers),
     * this rank's slice; a mixture without either runs its experts in buffers of moe_ffn. */
    m->ffn_local = c->n_experts ? c->moe_ffn : 0;
    for (int l = m->layer_first; l < m->layer_first + m->n_layers_local; l++) {
        if (!weight_kind_exists_at(c, WEIGHT_KIND_UP, l)) continue;
        int fr, fs;
        model_shard_of(m, WEIGHT_KIND_UP, l, &fr, &fs);
        if ((st = checkpoint_describe(m->checkpoint, WEIGHT_KIND_UP, l, fr, fs, m->dtype, &hw)) != STATUS_OK)
            goto fail;
        if ((int)hw.shape[0] > m->ffn_local) m->ffn_local = (int)hw.shape[0];
        if (!c->n_experts && !c->moe_dense_first) break; /* every layer alike */
    }
    if ((st = checkpoint_describe(m->checkpoint, WEIGHT_KIND_TOK_EMBEDDING, 0, tp_rank, tp_size, m->dtype, &hw)) != STATUS_OK) goto fail;
    m->vocab_local = (int)hw.shape[0];
    m->vocab_start = hw.row_start;

    m->w.n_layers = m->n_layers_local;
    m->w.tied = c->tied_embeddings && pp_rank == 0 && pp_rank == pp_size - 1;
    m->w.layers = calloc(m->n_layers_local ? (size_t)m->n_layers_local : 1, sizeof *m->w.layers);
    if (!m->w.layers) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "model: out of host memory");
        goto fail;
    }
    if ((st = load_weights(m, &stg)) != STATUS_OK) goto fail;
    release_mapping(m);
    load_rope_freqs(m);
    free(stg.buf);
    LOG_INFO("model", "loaded %s: %d layers [%d, %d) of %d, tp %d/%d, ep %d/%d (experts [%d, %d)), %s, %.1f MiB of weights (%.1f MiB mapped zero-copy, "
             "%.1f MiB as quantized blocks, %.1f MiB of them packed for the CPU, %.1f MiB copied)",
             c->architecture, m->n_layers_local, m->layer_first, m->layer_first + m->n_layers_local,
             c->n_layers, tp_rank, tp_size, ep_rank, ep_size, m->expert_first, m->expert_first + m->n_experts_local,
             dtype_name(m->dtype), (double)m->weight_bytes / 1048576.0,
             (double)m->weight_bytes_mapped / 1048576.0, (double)m->weight_bytes_blocks / 1048576.0,
             (double)m->weight_bytes_packed / 1048576.0, (double)m->weight_bytes_unpacked / 1048576.0);
    *out = m;
    return STATUS_OK;
fail:
    free(stg.buf);
    model_free(m);
    return st;
}
