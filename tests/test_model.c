/* tests/test_model.c - golden model tests: shardlm's forward pass and generation against
 * independent float64 NumPy references (tests/reference/, run by the ctest fixture
 * tests/golden_setup.sh; nothing expected is hard-coded here except the sentence the asset's
 * README documents).
 *   test_model stories DATA_DIR  stories260K (a real trained model) converted from llama2.c:
 *                                greedy ids, first logits, the known story, chunked prefill.
 *   test_model hf DATA_DIR NAME  a random HF checkpoint (gpt2, llama_sharded_bf16, ...):
 *                                logits at every prompt position and 20 greedy ids. When the
 *                                reference names an "adapter" (a PEFT directory beside it:
 *                                phi3_lora), the model serves with that adapter on every row
 *                                and the reference is the adapted model's; the greedy ids are
 *                                then left out (generate_run serves the base).
 *   test_model megatron DATA_DIR NAME TP PP  the same model rewritten in the Megatron-style
 *                                layout at (TP, PP), loaded back at tp = pp = 1.
 *   test_model cuda DATA_DIR NAME  the CUDA backend's forward (bf16) against the CPU backend's
 *                                (f32) on the same prompt (label gpu; SKIP without a GPU); a
 *                                reference naming an adapter serves it on both.
 *   test_model cpu-bf16 DATA_DIR NAME  the same with the CPU computing in bf16 in CUDA's place.
 *   test_model gemma|ref DIR REF_JSON  a converted GGUF checkpoint (Gemma 3, SmolLM2) against
 *                                the float64 NumPy reference (tests/reference/gemma3_ref.py,
 *                                llama_gguf_ref.py) on the GGUF file; SKIP when the model was
 *                                not fetched (.cache).
 *   test_model ref-int8 GGUF REF_JSON  the same with a GGUF served from its blocks in chunks of 8
 *                                rows, so that every product is quant_matmul's int8 one:
 *                                within REF_INT8_TOL (golden_gguf_types_int8).
 *   test_model gemma-gguf GGUF DIR  the same Gemma 3 served from its GGUF (weights kept as
 *                                ggml blocks) against the f32 conversion DIR: logits of the
 *                                golden prompts and 32 greedy tokens each, teacher-forced,
 *                                within GGUF_LOGIT_TOL; the greedy texts; tp slices of blocks.
 *   test_model step-graph ...    decode steps from backend graphs (tests/test_step_graph.c).
 *   test_model --tp T --pp P hf|stories ...  the same checks under mpirun with T x P ranks:
 *                                logits are checked on the last stage's ranks, generated ids
 *                                on every rank.
 *   test_model --ep E --pp P hf ...   the same with an expert-parallel group of E ranks in tp's
 *                                place (a mixture of experts: engine/model/moe_ep.c).
 * Prints one line per check and "N passed, M failed"; exits 77 (SKIP) when data is absent. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "generate.h"
#include "lora.h"
#include "model.h"
#include "quant.h"
#include "tokenizer.h"

static int n_pass, n_fail;
static int run_command(int argc, char **argv);
int step_graph_main(int argc, char **argv);
/* Set by --tp/--pp: this rank's place in a multi-rank model (NULL: a world of one). */
static struct model_parallel *g_par;

static void check(int ok, const char *what, const char *detail)
{
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail && *detail ? ": " : "", detail ? detail : "");
}

static int finish(void)
{
    if (g_par) printf("rank %d (tp %d/%d, pp %d/%d): ", g_par->layout.rank, g_par->layout.tp_rank,
                      g_par->layout.tp_size, g_par->layout.pp_rank, g_par->layout.pp_size);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}

static cJSON *read_json(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    buf[got] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    return j;
}

/* cJSON arrays are linked lists: walk them, never index them (O(n^2) for a 262k vocabulary). */
static int json_ints(const cJSON *arr, int32_t **out)
{
    int n = cJSON_GetArraySize(arr), i = 0;
    *out = malloc(((size_t)n + 1) * sizeof **out);
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) (*out)[i++] = (int32_t)it->valuedouble;
    return n;
}

/* Max |a - ref| over n values, and max |ref| for scale. */
static double max_abs_diff(const float *a, const cJSON *ref, int n, double *ref_max)
{
    double d = 0, r = 0;
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ref) {
        if (i >= n) break;
        double v = it->valuedouble;
        d = fmax(d, fabs((double)a[i++] - v));
        r = fmax(r, fabs(v));
    }
    *ref_max = r;
    return d;
}

/* The f32 CPU forward against float64: errors grow with depth and width, not with chance; a
 * mismatch from a real bug (a wrong sign, a missing bias, a wrong rotary pair) is O(0.1..10). */
#define LOGIT_TOL 5e-5

struct env {
    struct backend *b;
    struct model *m;
    struct kv_cache cache;
    struct lora *adapter; /* applied to every row when set (env_open's adapter_dir) */
    int own_backend;      /* env_close closes b */
};

/* The model at dir on backend b (NULL: a CPU backend the env opens and closes), computing in dtype
 * (-1: the backend's default, model_load_as); adapter_dir: a
 * PEFT adapter served on every row (lora_load_peft), or NULL. */
static enum status env_open_on(struct env *e, struct backend *b, int dtype, const char *dir, int max_ctx,
                               const char *adapter_dir)
{
    memset(e, 0, sizeof *e);
    enum status st = STATUS_OK;
    if (b) e->b = b;
    else if ((st = backend_open(DEVICE_CPU, 0, 0, &e->b)) == STATUS_OK) e->own_backend = 1;
    if (st == STATUS_OK) st = model_load_as(dir, e->b, g_par, dtype, &e->m);
    if (st == STATUS_OK && adapter_dir && (st = lora_load_peft(e->m, adapter_dir, &e->adapter)) == STATUS_OK &&
        (st = lora_serve_prepare(e->adapter, e->m)) == STATUS_OK) {
        e->m->adapters = &e->adapter;
        e->m->n_adapters = 1;
        e->m->max_adapter_rank = e->adapter->rank;
    }
    if (st == STATUS_OK) st = model_reserve(e->m, 64, 1, (max_ctx + 15) / 16, 64);
    if (st == STATUS_OK)
        st = kv_cache_init(&e->cache, e->b, e->m->n_layers_local, (max_ctx + 15) / 16, 16,
                           e->m->n_kv_local, e->m->cfg.head_dim, e->m->dtype);
    return st;
}

static enum status env_open_adapter(struct env *e, const char *dir, int max_ctx, const char *adapter_dir)
{
    return env_open_on(e, NULL, -1, dir, max_ctx, adapter_dir);
}

static enum status env_open(struct env *e, const char *dir, int max_ctx)
{
    return env_open_adapter(e, dir, max_ctx, NULL);
}

static void env_close(struct env *e)
{
    kv_cache_free(&e->cache);
    if (e->m) e->m->adapters = NULL;
    lora_free(e->adapter, e->b);
    model_free(e->m);
    if (e->own_backend) backend_close(e->b);
}

/* Logits for every row of the prompt, prefilled in chunks of `chunk` rows. */
static enum status prompt_logits(struct env *e, const int32_t *ids, int n, int chunk, float *logits)
{
    const int bt = e->cache.block_tokens, nb = (n + bt - 1) / bt, V = e->m->cfg.vocab_size;
    int32_t table[256], pos[64], slots[64], rows[64];
    CHECK(nb <= 256 && chunk <= 64, "test sizes");
    enum status st = kv_cache_alloc(&e->cache, nb, table);
    if (st != STATUS_OK) return st;
    for (int done = 0; done < n && st == STATUS_OK; done += chunk) {
        int len = n - done < chunk ? n - done : chunk;
        for (int i = 0; i < len; i++) {
            pos[i] = done + i;
            slots[i] = table[(done + i) / bt] * bt + (done + i) % bt;
            rows[i] = i;
        }
        int32_t q_start[2] = {0, len}, seq_len = done + len, adapter = 0;
        struct forward_batch fb = {.n_tokens = len, .tokens = ids + done, .positions = pos,
                                   .slots = slots, .n_seqs = 1, .q_start = q_start,
                                   .seq_len = &seq_len, .block_table = table, .max_blocks = nb,
                                   .n_logits = len, .logit_rows = rows,
                                   .seq_adapter = e->adapter ? &adapter : NULL};
        st = model_forward(e->m, &e->cache, &fb, logits + (size_t)done * V);
    }
    kv_cache_release(&e->cache, nb, table);
    return st;
}

static int run_hf(const char *dir)
{
    char path[4096 + 32], detail[4096 + 64];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    cJSON *ref = read_json(path);
    if (!ref) {
        printf("SKIP: no reference at %s (the golden_setup fixture did not run)\n", path);
        return 77;
    }
    int32_t *prompt, *greedy;
    int n_prompt = json_ints(cJSON_GetObjectItem(ref, "prompt_ids"), &prompt);
    int n_greedy = json_ints(cJSON_GetObjectItem(ref, "greedy_ids"), &greedy);
    const cJSON *ref_logits = cJSON_GetObjectItem(ref, "logits");
    const cJSON *adapter = cJSON_GetObjectItem(ref, "adapter");
    char adapter_dir[4096 + 32];
    if (cJSON_IsString(adapter)) snprintf(adapter_dir, sizeof adapter_dir, "%s/%s", dir, adapter->valuestring);
    struct env e;
    enum status st = env_open_adapter(&e, dir, n_prompt + n_greedy + 16, cJSON_IsString(adapter) ? adapter_dir : NULL);
    snprintf(detail, sizeof detail, "%s: %s", status_name(st), status_message());
    check(st == STATUS_OK, "load", st == STATUS_OK ? dir : detail);
    if (st != STATUS_OK) goto out;
    const int V = e.m->cfg.vocab_size;
    float *logits = malloc((size_t)n_prompt * V * sizeof *logits);
    int chunks[] = {n_prompt, 5, 1};
    for (int c = 0; c < 3; c++) {
        st = prompt_logits(&e, prompt, n_prompt, chunks[c], logits);
        if (!model_is_last_stage(e.m)) continue; /* this stage has no logits to check */
        double worst = 0, scale = 0;
        for (int i = 0; i < n_prompt && st == STATUS_OK; i++) {
            double rm;
            worst = fmax(worst, max_abs_diff(logits + (size_t)i * V, cJSON_GetArrayItem(ref_logits, i), V, &rm));
            scale = fmax(scale, rm);
        }
        snprintf(detail, sizeof detail, "chunk %d: max |diff| %.3g (logits up to %.3g, tol %.3g)", chunks[c],
                 worst, scale, LOGIT_TOL * (1 + scale));
        check(st == STATUS_OK && worst <= LOGIT_TOL * (1 + scale),
              e.adapter ? "prompt logits with the PEFT adapter vs NumPy (merged in float64)" : "prompt logits vs NumPy",
              detail);
    }
    free(logits);
    if (e.adapter) goto out; /* generate_run serves the base model */

    int32_t *out = malloc((size_t)n_greedy * sizeof *out);
    int n_out = 0;
    struct generate_options o = {.max_tokens = n_greedy, .prefill_chunk = 64, .ignore_eos = 1,
                                 .eos_id = -1, .sampling = sampling_params_default()};
    o.sampling.temperature = 0;
    struct generate_stats gs;
    st = generate_run(e.m, &e.cache, prompt, n_prompt, &o, NULL, NULL, out, &n_out, &gs);
    int same = st == STATUS_OK && n_out == n_greedy && !memcmp(out, greedy, (size_t)n_greedy * sizeof *out);
    snprintf(detail, sizeof detail, "%d tokens%s", n_out, same ? "" : " differ");
    check(same, "greedy ids vs NumPy", detail);
    check(e.cache.n_free == e.cache.n_blocks, "every KV block back in the pool", NULL);
    free(out);
out:
    env_close(&e);
    free(prompt);
    free(greedy);
    cJSON_Delete(ref);
    return finish();
}

/* Short form (for many ranks on few cores): logits after BOS, 30 greedy ids and the story's
 * opening, without the prefill-chunk variations. */
static int stories_short;

static int run_stories(const char *data)
{
    char dir[2048], path[4096], detail[4096 + 64];
    snprintf(dir, sizeof dir, "%s/stories260K", data);
    snprintf(path, sizeof path, "%s/stories260K_ref.json", data);
    cJSON *ref = read_json(path);
    if (!ref) {
        printf("SKIP: stories260K: no reference at %s (no shared assets)\n", path);
        return 77;
    }
    int32_t *want;
    int n_want = json_ints(cJSON_GetObjectItem(ref, "generated_ids"), &want);
    struct env e;
    struct tokenizer *tok = NULL;
    enum status st = env_open(&e, dir, 512);
    snprintf(detail, sizeof detail, "%s: %s", status_name(st), status_message());
    check(st == STATUS_OK, "load converted stories260K", st == STATUS_OK ? dir : detail);
    if (st != STATUS_OK) goto out;
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    st = tokenizer_load(path, &tok);
    check(st == STATUS_OK, "load tokenizer.model copied by convert", status_message());
    if (st != STATUS_OK) goto out;

    /* Logits after BOS. */
    const int V = e.m->cfg.vocab_size;
    float *logits = malloc((size_t)64 * V * sizeof *logits);
    int32_t bos = 1;
    st = prompt_logits(&e, &bos, 1, 1, logits);
    if (model_is_last_stage(e.m)) {
        double rm = 0, d = st == STATUS_OK ? max_abs_diff(logits, cJSON_GetObjectItem(ref, "logits_first"), V, &rm) : 1e9;
        snprintf(detail, sizeof detail, "max |diff| %.3g", d);
        check(d <= LOGIT_TOL * (1 + rm), "logits after BOS vs NumPy", detail);
    }

    /* Greedy generation from BOS: the exact ids of the float64 reference. */
    if (stories_short && n_want > 30) n_want = 30;
    int32_t *out = malloc((size_t)n_want * sizeof *out);
    int n_out = 0;
    struct generate_options o = {.max_tokens = n_want, .prefill_chunk = 64, .ignore_eos = 1,
                                 .eos_id = 2, .sampling = sampling_params_default()};
    o.sampling.temperature = 0;
    struct generate_stats gs;
    st = generate_run(e.m, &e.cache, &bos, 1, &o, NULL, NULL, out, &n_out, &gs);
    int first_bad = -1;
    for (int i = 0; i < n_want && first_bad < 0; i++)
        if (i >= n_out || out[i] != want[i]) first_bad = i;
    snprintf(detail, sizeof detail, "%d of %d ids%s", first_bad < 0 ? n_want : first_bad, n_want,
             first_bad < 0 ? " match" : " match before the first difference");
    check(st == STATUS_OK && first_bad < 0, "greedy tokens vs NumPy", detail);

    /* The text the asset's README documents (the tokens are shared: every rank decodes it). */
    char *text = NULL;
    size_t len = 0;
    st = tokenizer_decode(tok, out, n_out, &text, &len);
    const char *story = stories_short ? "Once upon a time, there was a little girl named Lily."
                                      : "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
    check(st == STATUS_OK && len >= strlen(story) && !strncmp(text, story, strlen(story)),
          "decoded text begins with the documented story", text ? text : "");
    free(text);

    if (stories_short) goto done_checks;
    /* Chunked prefill of a 41-token prompt, then greedy: the reference continuation. */
    int32_t prompt[41];
    prompt[0] = 1;
    memcpy(prompt + 1, want, 40 * sizeof *prompt);
    int chunks[] = {64, 7, 1};
    for (int c = 0; c < 3; c++) {
        o.max_tokens = n_want - 40;
        o.prefill_chunk = chunks[c];
        st = generate_run(e.m, &e.cache, prompt, 41, &o, NULL, NULL, out, &n_out, &gs);
        int same = st == STATUS_OK && n_out == n_want - 40 && !memcmp(out, want + 40, (size_t)n_out * sizeof *out);
        snprintf(detail, sizeof detail, "prefill chunk %d, %d tokens", chunks[c], n_out);
        check(same, "continuation after a 41-token prompt vs NumPy", detail);
    }
done_checks:
    check(e.cache.n_free == e.cache.n_blocks, "every KV block back in the pool", NULL);
    free(out);
    free(logits);
out:
    tokenizer_free(tok);
    env_close(&e);
    free(want);
    cJSON_Delete(ref);
    return finish();
}

/* Logits of every prompt row of the model at dir (with the PEFT adapter at adapter_dir on every
 * row, or none when NULL) on an already opened backend, computing in dtype (-1: its default). */
static enum status backend_logits(struct backend *b, int dtype, const char *dir, const char *adapter_dir,
                                  const int32_t *ids, int n, float **out, int *vocab)
{
    struct env e;
    enum status st = env_open_on(&e, b, dtype, dir, n, adapter_dir);
    if (st == STATUS_OK) {
        *vocab = e.m->cfg.vocab_size;
        *out = malloc((size_t)n * (size_t)*vocab * sizeof **out);
        st = prompt_logits(&e, ids, n, 7, *out);
    }
    env_close(&e);
    return st;
}

/* cuda: the CUDA backend (bf16) against the CPU's f32; cpu_bf16: the CPU computing in bf16 (the
 * dtype CUDA serves in, and what a served adapter is cast to there: lora_serve_prepare) against
 * its f32, so that the half-precision serving path runs without a GPU too. */
static int run_half(const char *dir, int cpu_bf16)
{
    struct backend *gpu = NULL, *cpu = NULL;
    enum status st = backend_open(cpu_bf16 ? DEVICE_CPU : DEVICE_CUDA, 0, 0, &gpu);
    if (st != STATUS_OK) {
        printf("SKIP: model on CUDA: %s\n", status_message());
        return 77;
    }
    const int half = cpu_bf16 ? DTYPE_BF16 : -1;
    const char *what = cpu_bf16 ? "the CPU in bf16" : "CUDA (bf16)";
    char path[4096 + 32];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    cJSON *ref = read_json(path);
    if (!ref) {
        backend_close(gpu);
        printf("SKIP: no reference at %s\n", path);
        return 77;
    }
    int32_t *prompt;
    int n = json_ints(cJSON_GetObjectItem(ref, "prompt_ids"), &prompt), V = 0, V2 = 0;
    /* A golden with a PEFT adapter (phi3_lora): served on every row, on both backends. */
    const cJSON *adapter = cJSON_GetObjectItem(ref, "adapter");
    char adapter_dir[4096 + 32];
    if (cJSON_IsString(adapter)) snprintf(adapter_dir, sizeof adapter_dir, "%s/%s", dir, adapter->valuestring);
    const char *ad = cJSON_IsString(adapter) ? adapter_dir : NULL;
    float *lg = NULL, *lc = NULL;
    backend_open(DEVICE_CPU, 0, 0, &cpu);
    st = backend_logits(gpu, half, dir, ad, prompt, n, &lg, &V);
    char title[128];
    snprintf(title, sizeof title, "forward on %s%s", what, ad ? " with the PEFT adapter" : "");
    check(st == STATUS_OK, title, st == STATUS_OK ? NULL : status_message());
    enum status st2 = backend_logits(cpu, -1, dir, ad, prompt, n, &lc, &V2);
    if (st == STATUS_OK && st2 == STATUS_OK) {
        /* bf16 activations with f32 accumulation: agreement to a few bf16 ulps of the logit
         * range, and the same argmax wherever the CPU's top-2 margin exceeds that. */
        double worst = 0, scale = 0;
        int argmax_same = 1;
        for (int i = 0; i < n; i++) {
            const float *a = lg + (size_t)i * V, *c = lc + (size_t)i * V;
            int ia = 0, ic = 0, ic2 = -1;
            for (int j = 0; j < V; j++) {
                worst = fmax(worst, fabs((double)a[j] - c[j]));
                scale = fmax(scale, fabs((double)c[j]));
                if (a[j] > a[ia]) ia = j;
                if (c[j] > c[ic]) { ic2 = ic; ic = j; } else if (ic2 < 0 || c[j] > c[ic2]) ic2 = j;
            }
            if (ia != ic && c[ic] - c[ic2] > 0.05 * (1 + scale)) argmax_same = 0;
        }
        char detail[256];
        snprintf(detail, sizeof detail, "max |diff| %.3g, logits up to %.3g", worst, scale);
        snprintf(title, sizeof title, "%s logits vs CPU f32", what);
        check(worst <= 0.05 * (1 + scale) && argmax_same, title, detail);
    }
    free(lg);
    free(lc);
    free(prompt);
    cJSON_Delete(ref);
    backend_close(gpu);
    backend_close(cpu);
    return finish();
}

/* Gemma 3 270M (262,144-token vocabulary): last-position logits within a tolerance of the
 * float64 reference and the same argmax at every position whose reference top-2 margin is
 * wider than that tolerance. */
/* The int8 path's tolerance against float64 (mode ref-int8): every product of the model rounds
 * x to int8 per block (|err| <= d_x / 2 * sum |w| per block, kernels/quant.h), about 0.4 % of a
 * product's scale; through 4 layers of golden_gguf_types' random model (28 products, every
 * block type) the last-position logits moved by 1.36e-2 on a range of 0.82 (measured on an
 * AMD EPYC with AVX2, 2026-11-28), against 7e-7 for the same file's f32 path. A wrong kernel
 * moves them by the logits' own scale. */
#define REF_INT8_TOL 2e-2
/* The same prompt as one chunk on AMX tiles (x and dequantized w rounded to bf16, mode ref on an
 * AMX CPU): 4.3e-3 on golden_gguf_types' range of 0.96, 0.175 on golden_gguf_phi3_quant's 21.5
 * (Intel Xeon with AMX, 2026-11-29): the rounding of 8-bit mantissas, as large as the int8
 * path's, so the same tolerance. */
#define REF_AMX_TOL 2e-2

static int run_ref(const char *dir, const char *ref_path, int int8)
{
    char detail[512];
    cJSON *ref = read_json(ref_path);
    if (!ref) {
        printf("SKIP: gemma: no reference at %s (the model is fetched by make run / tools/fetch_default_model.sh)\n", ref_path);
        return 77;
    }
    int32_t *ids, *argmax_ref;
    int n = json_ints(cJSON_GetObjectItem(ref, "ids"), &ids);
    json_ints(cJSON_GetObjectItem(ref, "argmax"), &argmax_ref);
    const cJSON *last = cJSON_GetObjectItem(ref, "logits_last"), *margins = cJSON_GetObjectItem(ref, "margins");
    struct env e;
    enum status st = env_open(&e, dir, n + 16);
    snprintf(detail, sizeof detail, "%s: %s", status_name(st), status_message());
    check(st == STATUS_OK, "load the model", st == STATUS_OK ? dir : detail);
    if (st == STATUS_OK && e.m->weight_bytes_blocks == 0) {
        /* Where the matrices live (kernels/cpu/backend_cpu.c, cpu_hugepages_on): copied onto huge
         * pages by default, the mapped file itself under SHARDLM_CPU_HUGEPAGES=0
         * (golden_smollm2_mapped); the logits below are checked either way. */
        snprintf(detail, sizeof detail, "%.1f of %.1f MiB mapped, %.1f MiB copied, huge pages %s",
                 e.m->weight_bytes_mapped / 1048576.0, e.m->weight_bytes / 1048576.0,
                 e.m->weight_bytes_unpacked / 1048576.0, cpu_hugepages_on() ? "on" : "off");
        const char *off = getenv("SHARDLM_CPU_HUGEPAGES");
        if (cpu_hugepages_on()) check(e.m->weight_bytes_mapped == 0, "the matrices copied onto huge pages", detail);
        else if (off && !strcmp(off, "0")) check(e.m->weight_bytes_mapped > 0, "the matrices mapped", detail);
        else printf("the kernel has no transparent huge pages: %s\n", detail);
    }
    if (st == STATUS_OK) {
        const int V = e.m->cfg.vocab_size;
        float *logits = malloc((size_t)n * (size_t)V * sizeof *logits);
        /* int8: chunks of 8 rows, under the 32 from which a GGUF's blocks are dequantized for
         * sgemm, so every product is quant_matmul's; f32: one chunk, the dequantized blocks in
         * f32. AMX off for both (8 rows and more would take its bf16 tiles), checked after. */
        const int amx = cpu_amx_set_enabled(0), dot = cpu_bf16_dot_set_enabled(0); /* bf16 weights' vdpbf16ps too */
        st = prompt_logits(&e, ids, n, int8 ? 8 : n < 64 ? n : 64, logits);
        double scale = 0, d = st == STATUS_OK ? max_abs_diff(logits + (size_t)(n - 1) * V, last, V, &scale) : 1e9;
        /* f32 through 18 layers against float64 (measured: 1.8e-5 on a range of 21). */
        double tol = (int8 ? REF_INT8_TOL : 2e-4) * (1 + scale);
        snprintf(detail, sizeof detail, "max |diff| %.3g over %d logits (range %.3g, tol %.3g)", d, V, scale, tol);
        check(d <= tol, int8 ? "last-position logits (int8 products) vs float64 NumPy on the GGUF weights"
                             : "last-position logits vs float64 NumPy on the GGUF weights", detail);
        cpu_amx_set_enabled(amx);
        cpu_bf16_dot_set_enabled(dot);
        if (amx && !int8) {
            float *tiles = malloc((size_t)n * (size_t)V * sizeof *tiles);
            enum status sa = prompt_logits(&e, ids, n, n < 64 ? n : 64, tiles);
            double scale_a = 0, da = sa == STATUS_OK ? max_abs_diff(tiles + (size_t)(n - 1) * V, last, V, &scale_a) : 1e9;
            snprintf(detail, sizeof detail, "max |diff| %.3g over %d logits (range %.3g, tol %.3g)", da, V, scale_a,
                     REF_AMX_TOL * (1 + scale_a));
            check(da <= REF_AMX_TOL * (1 + scale_a), "last-position logits (AMX bf16 tiles) vs float64 NumPy", detail);
            free(tiles);
        }
        int agree = 0, counted = 0;
        for (int i = 0; i < n; i++) {
            if (cJSON_GetArrayItem(margins, i)->valuedouble <= 2 * tol) continue;
            int best = 0;
            for (int j = 1; j < V; j++) if (logits[(size_t)i * V + j] > logits[(size_t)i * V + best]) best = j;
            counted++;
            agree += best == argmax_ref[i];
        }
        snprintf(detail, sizeof detail, "%d of %d positions", agree, counted);
        check(counted > 0 && agree == counted, "argmax at every clear position", detail);
        free(logits);
    }
    env_close(&e);
    free(ids);
    free(argmax_ref);
    cJSON_Delete(ref);
    return finish();
}

/* ---- Gemma 3 served from its GGUF (blocks) against the f32 conversion --------------------- */

/* Both paths use the same weights bit for bit (the conversion dequantizes exactly as the
 * kernels do), so what differs is quant_matmul's int8 rounding of the activations in every
 * product of 18 layers (as llama.cpp does). That rounding is discontinuous, so the extremes
 * of the difference move a lot with any change of f32 rounding elsewhere. Measured on the
 * golden prompts plus 32 greedy tokens (79 rows x 262,144 logits, |logits| up to 38), with
 * three equivalent GELU tanh implementations (0.5 x (1 + tanhf u); x / (1 + expf(-2u)); the
 * same with the vectorised e^x that the CPU backend uses): max |diff| 1.26-1.92 over the
 * whole vocabulary, 0.39-0.57 at the f32 argmax, mean 0.17-0.20; the argmax differs where the
 * f32 top two are within 0.012, 0.097 and 0.235 respectively (0.069 at tp 2 with libm's
 * tanhf); the tiled attention of kernels/cpu/attention.c (AVX-512 or portable, both 2.0e-5
 * from float64 on the f32 path) moved the flips to margins of 0.216-0.235 (0.341 at tp 2).
 * So near ties fall either way: the tie margin allows 0.5, about the largest error
 * seen at the argmax, and the logit tolerance leaves about 50 % over the worst maximum. A
 * wrong kernel moves logits by whole units and flips clear choices. */
#define GGUF_LOGIT_TOL  3.0
#define GGUF_TIE_MARGIN 0.5
/* Prefill (32 rows of x and more) multiplies the dequantized blocks in f32 with sgemm: the
 * same weights as the conversion in the same products (OpenBLAS sums each output in the same
 * order whatever the tiling of w's rows); measured: identical logits (max |diff| 0). The
 * tolerance allows f32 reassociation, should the tiling or the BLAS change it. */
#define GGUF_PREFILL_TOL 0.02
/* The same one-chunk prefill on AMX tiles (x and w rounded to bf16; kernels/cpu/amx.c): seen
 * 0.16-0.18 (2026-11-25), a tenth of the int8 path's difference. */
#define GGUF_AMX_TOL 0.5

/* Index of the largest of v[0..n). */
static int argmax_of(const float *v, int n)
{
    int best = 0;
    for (int j = 1; j < n; j++) if (v[j] > v[best]) best = j;
    return best;
}

/* The tensor-parallel slices of the GGUF (tp 2, rank 1) as blocks dequantize to exactly the f32
 * slices the same checkpoint hands out: the row slices (zero-copy into the file) and the
 * column slices of the row-parallel O and DOWN (copied block by block). */
static void check_gguf_tp_slices(const char *gguf)
{
    struct checkpoint *ck = NULL;
    enum status st = checkpoint_open(gguf, &ck);
    int ok = st == STATUS_OK, n_checked = 0, zero_copy = 0;
    const enum weight_kind kinds[] = {WEIGHT_KIND_Q, WEIGHT_KIND_O, WEIGHT_KIND_UP, WEIGHT_KIND_DOWN};
    for (int i = 0; ok && i < 4; i++) {
        struct host_weight hq, hf;
        if (checkpoint_describe(ck, kinds[i], 5, 1, 2, DTYPE_F32, &hf) != STATUS_OK) { ok = 0; break; }
        const enum dtype qt = hf.stored_dtype;
        if (!dtype_is_quant(qt)) continue;
        void *blocks = malloc(hf.nbytes), *want = malloc(hf.nbytes);
        float *row = malloc((size_t)hf.shape[1] * sizeof *row);
        ok &= checkpoint_get(ck, kinds[i], 5, 1, 2, qt, blocks, hf.nbytes, CHECKPOINT_GET_ZERO_COPY_OK, &hq) == STATUS_OK &&
              checkpoint_get(ck, kinds[i], 5, 1, 2, DTYPE_F32, want, hf.nbytes, 0, &hf) == STATUS_OK &&
              hq.shape[0] == hf.shape[0] && hq.shape[1] == hf.shape[1];
        const size_t rb = ok ? quant_row_bytes((enum quant_type)dtype_quant_type(qt), hq.shape[1]) : 0;
        for (int64_t r = 0; ok && r < hq.shape[0]; r++) {
            quant_dequantize_row((enum quant_type)dtype_quant_type(qt), (const char *)hq.data + r * rb, row, hq.shape[1]);
            ok &= !memcmp(row, (const float *)want + r * hq.shape[1], (size_t)hq.shape[1] * sizeof *row);
        }
        zero_copy += hq.zero_copy;
        n_checked++;
        free(blocks);
        free(want);
        free(row);
    }
    char detail[256];
    snprintf(detail, sizeof detail, "%d quantized weights of layer 5 at tp rank 1 of 2, %d of them zero-copy", n_checked, zero_copy);
    check(ok && n_checked > 0, "GGUF tp slices as blocks dequantize to the f32 slices", detail);
    checkpoint_close(ck);
}

/* 32 greedy tokens from prompt on e (ignoring EOS). */
static enum status greedy32(struct env *e, const int32_t *prompt, int n, int32_t *out)
{
    struct generate_options o = {.max_tokens = 32, .prefill_chunk = 64, .ignore_eos = 1, .eos_id = -1,
                                 .sampling = sampling_params_default()};
    o.sampling.temperature = 0;
    struct generate_stats gs;
    int n_out = 0;
    enum status st = generate_run(e->m, &e->cache, prompt, n, &o, NULL, NULL, out, &n_out, &gs);
    return st == STATUS_OK && n_out != 32 ? STATUS_INTERNAL : st;
}

/* One golden prompt: the f32 path's greedy continuation teacher-forced through both paths
 * (logits at every row compared), and each path's own greedy continuation. The GGUF path is
 * forced twice with AMX off: in chunks of 8 rows, where every product has under 32 rows of x and
 * takes the int8 dot products (as decode does), and in one chunk of all rows, where the block weights are
 * dequantized for sgemm (prefill: kernels/cpu/matmul.c) and so equal the conversion's weights:
 * that path (AMX off) must match the f32 conversion up to f32 reassociation (GGUF_PREFILL_TOL);
 * on a CPU with AMX the one chunk runs again on its bf16 tiles, within GGUF_AMX_TOL. */
static void gemma_gguf_prompt(struct env *ef, struct env *eq, const int32_t *prompt, int n, const char *name)
{
    char detail[512];
    const int V = ef->m->cfg.vocab_size, T = n + 32;
    int32_t seq[64], greedy_q[32];
    memcpy(seq, prompt, (size_t)n * sizeof *seq);
    enum status st = greedy32(ef, prompt, n, seq + n);
    if (st == STATUS_OK) st = greedy32(eq, prompt, n, greedy_q);
    float *lf = malloc((size_t)T * V * sizeof *lf), *lq = malloc((size_t)T * V * sizeof *lq);
    float *lp = malloc((size_t)T * V * sizeof *lp);
    if (st == STATUS_OK) st = prompt_logits(ef, seq, T, T, lf);
    const int amx = cpu_amx_set_enabled(0); /* 8 rows would take AMX tiles (matmul.c) */
    const int dot = cpu_bf16_dot_set_enabled(0); /* and a bf16 tensor's rows vdpbf16ps */
    if (st == STATUS_OK) st = prompt_logits(eq, seq, T, 8, lq);
    if (st == STATUS_OK) st = prompt_logits(eq, seq, T, T, lp);
    double worst_p = 0;
    for (size_t i = 0; st == STATUS_OK && i < (size_t)T * V; i++) worst_p = fmax(worst_p, fabs((double)lf[i] - lp[i]));
    snprintf(detail, sizeof detail, "%s: %d rows in one chunk: max |diff| %.2e (tol %.2e)", name, T, worst_p,
             GGUF_PREFILL_TOL);
    check(st == STATUS_OK && worst_p <= GGUF_PREFILL_TOL,
          "GGUF blocks dequantized for the prefill product (f32 tiles) vs f32 conversion: logits", detail);
    cpu_amx_set_enabled(amx);
    cpu_bf16_dot_set_enabled(dot);
    if (amx) {
        if (st == STATUS_OK) st = prompt_logits(eq, seq, T, T, lp);
        worst_p = 0;
        for (size_t i = 0; st == STATUS_OK && i < (size_t)T * V; i++)
            worst_p = fmax(worst_p, fabs((double)lf[i] - lp[i]));
        snprintf(detail, sizeof detail, "%s: %d rows in one chunk: max |diff| %.2e (tol %.2e)", name, T, worst_p,
                 GGUF_AMX_TOL);
        check(st == STATUS_OK && worst_p <= GGUF_AMX_TOL,
              "GGUF blocks dequantized for the prefill product (AMX bf16 tiles) vs f32 conversion: logits", detail);
    } else {
        printf("SKIP GGUF prefill on AMX tiles (%s): this CPU has no AMX-BF16 or SHARDLM_CPU_AMX=0\n", name);
    }
    free(lp);
    double worst = 0, range = 0, worst_margin = 0, worst_top = 0, sum = 0;
    int disagree = 0, first_diff = -1;
    for (int i = 0; st == STATUS_OK && i < T; i++) {
        const float *a = lf + (size_t)i * V, *b = lq + (size_t)i * V;
        for (int j = 0; j < V; j++) {
            worst = fmax(worst, fabs((double)a[j] - b[j]));
            range = fmax(range, fabs((double)a[j]));
            sum += fabs((double)a[j] - b[j]);
        }
        const int ma = argmax_of(a, V), mb = argmax_of(b, V);
        worst_top = fmax(worst_top, fabs((double)a[ma] - b[ma]));
        if (ma != mb) {
            disagree++;
            worst_margin = fmax(worst_margin, (double)a[ma] - a[mb]); /* how close the f32 choice was */
        }
    }
    for (int i = 0; st == STATUS_OK && i < 32 && first_diff < 0; i++)
        if (greedy_q[i] != seq[n + i]) first_diff = i;
    snprintf(detail, sizeof detail, "%s: %s; %d rows: max |diff| %.3f (%.2f of tol %.2f; |logits| up to %.1f), "
             "mean |diff| %.3f, max |diff| at the f32 argmax %.3f",
             name, st == STATUS_OK ? "ok" : status_message(), T, worst, worst / GGUF_LOGIT_TOL, GGUF_LOGIT_TOL, range,
             sum / ((double)T * V), worst_top);
    check(st == STATUS_OK && worst <= GGUF_LOGIT_TOL, "GGUF blocks (int8 products, chunks of 8) vs f32 conversion: logits", detail);
    snprintf(detail, sizeof detail, "%s: argmax differs at %d of %d rows (f32 top-2 margin there at most %.3f, tol %.2f)",
             name, disagree, T, worst_margin, GGUF_TIE_MARGIN);
    check(st == STATUS_OK && worst_margin <= GGUF_TIE_MARGIN,
          "GGUF blocks vs f32: argmax equal wherever the f32 choice is not a near tie", detail);
    if (first_diff < 0) snprintf(detail, sizeof detail, "%s: all 32 tokens equal", name);
    else snprintf(detail, sizeof detail, "%s: equal up to token %d, then %d (GGUF) vs %d (f32): a near tie, "
                  "covered by the argmax check above", name, first_diff, greedy_q[first_diff], seq[n + first_diff]);
    printf("     greedy text, %s\n", detail);
    free(lf);
    free(lq);
}

/* Gemma 3 270M from its GGUF with the weights kept as blocks against the f32 conversion of the
 * same file, on the golden prompts. */
static int run_gemma_gguf(const char *gguf, const char *dir)
{
    char detail[512];
    struct stat sb;
    if (stat(gguf, &sb) != 0 || stat(dir, &sb) != 0) {
        printf("SKIP: gemma-gguf: no %s or %s (the model is fetched by make run / tools/fetch_default_model.sh)\n", gguf, dir);
        return 77;
    }
    struct env ef, eq;
    enum status st = env_open(&ef, dir, 64);
    snprintf(detail, sizeof detail, "%s: %s", status_name(st), status_message());
    check(st == STATUS_OK, "load the f32 conversion", st == STATUS_OK ? dir : detail);
    enum status sq = env_open(&eq, gguf, 64);
    if (sq == STATUS_OK)
        snprintf(detail, sizeof detail,
                 "%.1f MiB of weights, %.1f MiB as blocks, %.1f MiB mapped zero-copy, %.1f MiB packed, %.1f MiB copied",
                 eq.m->weight_bytes / 1048576.0, eq.m->weight_bytes_blocks / 1048576.0, eq.m->weight_bytes_mapped / 1048576.0,
                 eq.m->weight_bytes_packed / 1048576.0, eq.m->weight_bytes_unpacked / 1048576.0);
    else snprintf(detail, sizeof detail, "%s: %s", status_name(sq), status_message());
    /* At tp 1 every matrix is the file itself (vectors, the norms, are copied), packed for the
     * CPU: every type of this file packs (Q5_0, Q8_0, Q4_K, Q6_K; a type that does not is copied
     * as it is, model_load.c's copy_mapped); at tp > 1 the column slices of O and DOWN are
     * copied as slices (rows of them are not contiguous in the file). */
    const size_t whole = eq.m->weight_bytes_mapped + eq.m->weight_bytes_unpacked;
    check(sq == STATUS_OK && eq.m->weight_bytes_blocks > eq.m->weight_bytes / 2 &&
              (eq.m->tp_size > 1 ? whole > eq.m->weight_bytes / 2
                                 : whole == eq.m->weight_bytes_blocks && eq.m->weight_bytes_unpacked == 0 &&
                                       eq.m->weight_bytes_packed >= eq.m->weight_bytes_blocks) &&
              eq.m->weight_bytes_packed > 0,
          "load the GGUF natively (blocks, zero-copy)", detail);
    if (st == STATUS_OK && sq == STATUS_OK) {
        /* The prompts of golden_gemma3 (tests/gemma_setup.sh), each its own sequence. */
        static const int32_t once[] = {2, 14946, 3324, 496, 990, 236764, 993, 691, 496};
        static const int32_t paris[] = {2, 818, 5279, 529, 7001, 563};
        gemma_gguf_prompt(&ef, &eq, once, 9, "\"Once upon a time, there was a\"");
        gemma_gguf_prompt(&ef, &eq, paris, 6, "\"The capital of France is\"");
    }
    env_close(&ef);
    env_close(&eq);
    check_gguf_tp_slices(gguf);
    return finish();
}

static int run_megatron(const char *data, const char *name, int tp, int pp)
{
    char src[2048], dst[3072], detail[4096];
    snprintf(src, sizeof src, "%s/%s", data, name);
    snprintf(dst, sizeof dst, "%s/%s_megatron_tp%d_pp%d", data, name, tp, pp);
    struct checkpoint *ck = NULL;
    enum status st = checkpoint_open(src, &ck);
    if (st == STATUS_NOT_FOUND) {
        printf("SKIP: %s: %s\n", src, status_message());
        return 77;
    }
    if (st == STATUS_OK) st = checkpoint_write_megatron(dst, ck, tp, pp);
    checkpoint_close(ck);
    snprintf(detail, sizeof detail, "tp %d pp %d: %s", tp, pp, st == STATUS_OK ? dst : status_message());
    check(st == STATUS_OK, "write Megatron-style layout", detail);
    if (st != STATUS_OK) return finish();
    /* The rewritten directory must give the source's reference results. */
    char ref_src[4096], ref_dst[4096];
    snprintf(ref_src, sizeof ref_src, "%s/reference.json", src);
    snprintf(ref_dst, sizeof ref_dst, "%s/reference.json", dst);
    if (symlink(ref_src, ref_dst) != 0 && access(ref_dst, R_OK) != 0) {
        check(0, "link reference.json", ref_dst);
        return finish();
    }
    return run_hf(dst);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int tp = 1, pp = 1, ep = 0, atp = 1;
    while (argc >= 3 && (!strcmp(argv[1], "--tp") || !strcmp(argv[1], "--pp") || !strcmp(argv[1], "--ep"))) {
        *(!strcmp(argv[1], "--pp") ? &pp : !strcmp(argv[1], "--ep") ? &ep : &tp) = atoi(argv[2]);
        argc -= 2;
        argv += 2;
    }
    if (ep > 0) atp = tp, tp *= ep; /* expert parallelism: the ep group (x attention's tp) in tp's place */
    struct parallel_world *world = NULL;
    struct parallel_groups groups = {0};
    struct model_parallel par = {0};
    if (tp * pp > 1) {
        enum status st = parallel_init(&argc, &argv, &world);
        if (st == STATUS_OK) st = parallel_layout(world, tp, pp, &par.layout);
        if (st == STATUS_OK) st = parallel_groups_init(world, &par.layout, DEVICE_CPU, 0, NULL, &groups);
        if (st == STATUS_OK && ep > 0 && atp > 1) st = parallel_groups_add_atp(world, &par.layout, atp, DEVICE_CPU, 0, NULL, &groups);
        if (st != STATUS_OK) {
            printf("FAIL parallel setup: %s: %s\n", status_name(st), status_message());
            parallel_finalize(world);
            return 1;
        }
        par.world = world;
        par.groups = &groups;
        par.ep = ep > 0;
        g_par = &par;
    }
    int rc = run_command(argc, argv);
    if (world) {
        parallel_groups_free(&groups);
        parallel_finalize(world);
    }
    return rc;
}

static int run_command(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "step-graph")) return step_graph_main(argc - 1, argv + 1); /* test_step_graph.c */
    if (argc >= 3 && !strcmp(argv[1], "stories")) return run_stories(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "stories-short")) {
        stories_short = 1;
        return run_stories(argv[2]);
    }
    if (argc >= 4 && !strcmp(argv[1], "hf")) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", argv[2], argv[3]);
        return run_hf(dir);
    }
    if (argc >= 4 && (!strcmp(argv[1], "gemma") || !strcmp(argv[1], "ref"))) return run_ref(argv[2], argv[3], 0);
    if (argc >= 4 && !strcmp(argv[1], "ref-int8")) return run_ref(argv[2], argv[3], 1);
    if (argc >= 4 && !strcmp(argv[1], "gemma-gguf")) return run_gemma_gguf(argv[2], argv[3]);
    if (argc >= 4 && (!strcmp(argv[1], "cuda") || !strcmp(argv[1], "cpu-bf16"))) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s", argv[2], argv[3]);
        return run_half(dir, !strcmp(argv[1], "cpu-bf16"));
    }
    if (argc >= 6 && !strcmp(argv[1], "megatron"))
        return run_megatron(argv[2], argv[3], atoi(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: test_model stories DATA | hf DATA NAME | megatron DATA NAME TP PP | cuda|cpu-bf16 DATA NAME\n");
    return 2;
}
