/* server/main.c - the shardlm command and its subcommands:
 *   shardlm serve --model DIR [--listen ADDR] [options]       the gRPC server (serve.c)
 *   shardlm chat|complete|bench --server ADDR ...              gRPC clients (clients/cli.c)
 *   shardlm generate --model DIR [--prompt TEXT] [options]   generate text locally
 *   shardlm convert llama2c --checkpoint F --tokenizer F --out DIR
 *   shardlm convert gguf --gguf F --out DIR [--dtype f32|bf16]
 *   shardlm reshard --model DIR --out DIR [--tp T --pp P | --format hf]
 *   shardlm version
 * Errors from below arrive as an enum status with a message; they are printed here and turn
 * into a non-zero exit code. This is the only file that calls exit codes.
 * Tests: tests/test_cli.sh (through ctest). */
#include <errno.h>
#include <unistd.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "cli.h"
#include "generate.h"
#include "gguf_convert.h"
#include "llama2c.h"
#include "model.h"
#include "ops.h"
#include "parallel.h"
#include "serve.h"
#include "tokenizer.h"

#define EXIT_USAGE 2

static int fail(enum status st)
{
    fprintf(stderr, "shardlm: error: %s: %s\n", status_name(st), status_message());
    return 1;
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see shardlm --help)\n");
    return EXIT_USAGE;
}

static void print_help(FILE *f)
{
    fprintf(f,
            "usage:\n"
            "  shardlm serve --model DIR [--listen 127.0.0.1:50051] [--device cpu|cuda]\n"
            "                [--dp D --tp T --pp P] [engine limits, TLS, API keys: shardlm serve --help, docs/server.md]\n"
            "  shardlm chat --server ADDR [--system TEXT]       interactive streamed chat\n"
            "  shardlm complete --server ADDR --prompt TEXT     one completion\n"
            "  shardlm bench --server ADDR --concurrency N --requests M\n"
            "  shardlm stats --server ADDR                      model, load, replicas\n"
            "  shardlm generate --model DIR [--prompt TEXT] [--max-tokens N] [--temperature T]\n"
            "                   [--top-k K] [--top-p P] [--min-p P] [--seed S] [--ignore-eos]\n"
            "                   [--device cpu|cuda] [--threads N] [--no-bos] [--tp T --pp P]\n"
            "                   [--pp-layers N1,N2,...]\n"
            "  shardlm convert llama2c --checkpoint FILE.bin --tokenizer FILE.model --out DIR\n"
            "  shardlm convert gguf --gguf FILE.gguf --out DIR [--dtype f32|bf16]\n"
            "  shardlm reshard --model DIR --out DIR [--tp T --pp P | --format hf]\n"
            "  shardlm version\n"
            "\n"
            "generate prints the completion to stdout as it is produced and the prefill and\n"
            "decode speed to stderr. Defaults: --prompt \"\" (BOS only), --max-tokens 128,\n"
            "--temperature 0 (greedy), --device cpu. With --tp/--pp, run under mpirun with\n"
            "T x P ranks (e.g. mpirun -n 4 shardlm generate --tp 2 --pp 2 ...).\n");
}

struct stream_ctx {
    struct detokenizer detok;
    int failed;
};

static int print_token(void *ctx, int32_t token)
{
    struct stream_ctx *s = ctx;
    const char *text;
    size_t len;
    if (detokenizer_push(&s->detok, token, &text, &len) != STATUS_OK) {
        s->failed = 1;
        return 1;
    }
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int cmd_generate(int argc, char **argv)
{
    const char *model_dir = NULL, *prompt = "", *device_name = "cpu", *pp_layers = NULL;
    long max_tokens = 128, threads = 0, seed = 0, tp = 1, pp = 1;
    int add_bos = 1;
    struct generate_options o = {.sampling = sampling_params_default()};
    o.sampling.temperature = 0.0f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--ignore-eos")) { o.ignore_eos = 1; takes = 0; }
        else if (!strcmp(a, "--no-bos")) { add_bos = 0; takes = 0; }
        else if (!v) return usage_error("generate: %s needs a value", a);
        else if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--device")) device_name = v;
        else if (!strcmp(a, "--pp-layers")) pp_layers = v;
        else if (!strcmp(a, "--max-tokens")) { if (base_parse_long(v, 0, 1 << 20, &max_tokens)) return usage_error("--max-tokens must be an integer in [0, 1048576], got '%s'", v); }
        else if (!strcmp(a, "--tp")) { if (base_parse_long(v, 1, 1024, &tp)) return usage_error("--tp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--pp")) { if (base_parse_long(v, 1, 1024, &pp)) return usage_error("--pp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--threads")) { if (base_parse_long(v, 0, 1024, &threads)) return usage_error("--threads must be an integer in [0, 1024], got '%s'", v); }
        else if (!strcmp(a, "--seed")) { if (base_parse_long(v, 0, LONG_MAX, &seed)) return usage_error("--seed must be a non-negative integer, got '%s'", v); }
        else if (!strcmp(a, "--temperature")) { if (base_parse_float(v, &o.sampling.temperature)) return usage_error("--temperature must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-p")) { if (base_parse_float(v, &o.sampling.top_p)) return usage_error("--top-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--min-p")) { if (base_parse_float(v, &o.sampling.min_p)) return usage_error("--min-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-k")) { long k; if (base_parse_long(v, 0, INT_MAX, &k)) return usage_error("--top-k must be a non-negative integer, got '%s'", v); o.sampling.top_k = (int)k; }
        else return usage_error("generate: unknown option '%s'", a);
        i += takes;
    }
    if (!model_dir) return usage_error("generate: --model DIR is required%s", "");
    o.sampling.seed = (uint64_t)seed;
    o.max_tokens = (int)max_tokens;
    enum status st = sampling_params_validate(&o.sampling);
    if (st != STATUS_OK) return fail(st);

    enum device dev;
    if ((st = backend_parse_device(device_name, &dev)) != STATUS_OK) return fail(st);
    struct backend *b = NULL;
    struct tokenizer *tok = NULL;
    struct model *m = NULL;
    struct kv_cache cache = {0};
    int32_t *ids = NULL, *out = NULL;
    int n_ids = 0, n_out = 0, rc = 1;
    struct stream_ctx sc = {0};
    char path[4096];
    struct parallel_world *world = NULL;
    struct parallel_groups groups = {0};
    struct model_parallel par = {0};
    int printer = 1; /* the rank that prints: rank 0 */

    if (tp * pp > 1) {
        if ((st = parallel_init(NULL, NULL, &world)) != STATUS_OK) goto done;
        if ((st = parallel_layout(world, (int)tp, (int)pp, &par.layout)) != STATUS_OK) goto done;
        printer = world->rank == 0;
        /* One GPU per rank on a node: the local rank picks it. */
        if ((st = backend_open(dev, world->local_rank, (int)threads, &b)) != STATUS_OK) goto done;
        if ((st = parallel_groups_init(world, &par.layout, dev, world->local_rank, NULL, &groups)) != STATUS_OK) goto done;
        par.world = world;
        par.groups = &groups;
        par.pp_layers = pp_layers;
    } else if ((st = backend_open(dev, 0, (int)threads, &b)) != STATUS_OK) {
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer.model", model_dir);
    if ((st = tokenizer_load(path, &tok)) != STATUS_OK) goto done;
    if ((st = model_load(model_dir, b, tp * pp > 1 ? &par : NULL, &m)) != STATUS_OK) goto done;
    if ((st = tokenizer_encode(tok, prompt, strlen(prompt), add_bos, &ids, &n_ids)) != STATUS_OK) goto done;
    if (n_ids == 0) {
        st = status_errorf(STATUS_INVALID_ARGUMENT, "the prompt is empty and --no-bos was given");
        goto done;
    }
    int total = n_ids + o.max_tokens;
    int bt = 16, chunk = 256;
    if ((st = model_reserve(m, chunk, 1, (total + bt - 1) / bt, 1)) != STATUS_OK) goto done;
    if ((st = kv_cache_init(&cache, b, m->n_layers_local, (total + bt - 1) / bt, bt, m->n_kv_local,
                            m->cfg.head_dim, m->dtype)) != STATUS_OK)
        goto done;
    o.prefill_chunk = chunk;
    o.eos_id = m->cfg.eos_id >= 0 ? m->cfg.eos_id : tokenizer_eos_id(tok);
    out = malloc(((size_t)o.max_tokens + 1) * sizeof *out);
    if (!out) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    detokenizer_init(&sc.detok, tok);
    /* The prompt's ids go through the detokenizer first (their text is the prompt, printed
     * as given), so that the first generated piece is spaced as a continuation. */
    for (int i = 0; i < n_ids; i++) {
        const char *skip;
        size_t skip_len;
        if ((st = detokenizer_push(&sc.detok, ids[i], &skip, &skip_len)) != STATUS_OK) goto done;
    }
    if (printer) fwrite(prompt, 1, strlen(prompt), stdout);
    struct generate_stats gs;
    if ((st = generate_run(m, &cache, ids, n_ids, &o, printer ? print_token : NULL, &sc, out, &n_out, &gs)) != STATUS_OK)
        goto done;
    if (!printer) {
        rc = 0;
        goto done;
    }
    const char *tail;
    size_t tail_len;
    if (detokenizer_flush(&sc.detok, &tail, &tail_len) == STATUS_OK) fwrite(tail, 1, tail_len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (sc.failed) {
        st = status_errorf(STATUS_INTERNAL, "detokenization failed");
        goto done;
    }
    fprintf(stderr, "shardlm: prompt %d tokens, prefill %.1f tok/s; generated %d tokens, decode %.1f tok/s (%s, %d threads, tp %ld, pp %ld)\n",
            gs.n_prompt, gs.prefill_seconds > 0 ? gs.n_prompt / gs.prefill_seconds : 0.0, gs.n_generated,
            gs.decode_seconds > 0 && gs.n_generated > 1 ? (gs.n_generated - 1) / gs.decode_seconds : 0.0,
            b->ops->name, b->n_threads, tp, pp);
    rc = 0;
done:
    if (st != STATUS_OK) rc = fail(st);
    if (sc.detok.tok) detokenizer_free(&sc.detok);
    free(out);
    free(ids);
    kv_cache_free(&cache);
    model_free(m);
    tokenizer_free(tok);
    backend_close(b);
    parallel_groups_free(&groups);
    parallel_finalize(world);
    return rc;
}

static int cmd_convert_gguf(int argc, char **argv)
{
    const char *gguf = NULL, *out = NULL, *dt = "f32";
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) return usage_error("convert: %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--gguf")) gguf = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else return usage_error("convert: unknown option '%s'", argv[i]);
    }
    if (!gguf || !out || (strcmp(dt, "f32") && strcmp(dt, "bf16")))
        return usage_error("convert gguf needs --gguf FILE --out DIR [--dtype f32|bf16]%s", "");
    enum status st = gguf_convert(gguf, out, !strcmp(dt, "bf16") ? DTYPE_BF16 : DTYPE_F32);
    if (st != STATUS_OK) return fail(st);
    fprintf(stderr, "shardlm: wrote %s (config.json, model.safetensors, tokenizer.model)\n", out);
    return 0;
}

static int cmd_convert(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "gguf")) return cmd_convert_gguf(argc, argv);
    if (argc < 1 || strcmp(argv[0], "llama2c"))
        return usage_error("convert: the source format is 'llama2c' or 'gguf'%s", "");
    const char *ckpt = NULL, *tokenizer = NULL, *out = NULL;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) return usage_error("convert: %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--checkpoint")) ckpt = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer")) tokenizer = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else return usage_error("convert: unknown option '%s'", argv[i]);
    }
    if (!ckpt || !tokenizer || !out)
        return usage_error("convert llama2c needs --checkpoint, --tokenizer and --out%s", "");
    enum status st = llama2c_convert(ckpt, tokenizer, out);
    if (st != STATUS_OK) return fail(st);
    fprintf(stderr, "shardlm: wrote %s (config.json, model.safetensors, tokenizer.model)\n", out);
    return 0;
}

/* Writes the Megatron-style sharded layout of any checkpoint (any checkpoint already loads at any
 * tp/pp without this; it is for shipping pre-split shards). */
static int cmd_reshard(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *format = "megatron";
    long tp = 1, pp = 1;
    for (int i = 0; i < argc; i += 2) {
        if (i + 1 >= argc) return usage_error("reshard: %s needs a value", argv[i]);
        const char *v = argv[i + 1];
        if (!strcmp(argv[i], "--model")) src = v;
        else if (!strcmp(argv[i], "--out")) out = v;
        else if (!strcmp(argv[i], "--format")) format = v;
        else if (!strcmp(argv[i], "--tp")) { if (base_parse_long(v, 1, 1024, &tp)) return usage_error("--tp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(argv[i], "--pp")) { if (base_parse_long(v, 1, 1024, &pp)) return usage_error("--pp must be an integer in [1, 1024], got '%s'", v); }
        else return usage_error("reshard: unknown option '%s'", argv[i]);
    }
    if (!src || !out) return usage_error("reshard needs --model and --out%s", "");
    int hf = !strcmp(format, "hf");
    if (!hf && strcmp(format, "megatron")) return usage_error("--format must be megatron or hf, got '%s'", format);
    if (hf && (tp != 1 || pp != 1)) return usage_error("--format hf writes one unsharded file: no --tp/--pp%s", "");
    struct checkpoint *ck = NULL;
    enum status st = checkpoint_open(src, &ck);
    if (st == STATUS_OK) st = hf ? checkpoint_write_hf(out, ck) : checkpoint_write_megatron(out, ck, (int)tp, (int)pp);
    checkpoint_close(ck);
    if (st != STATUS_OK) return fail(st);
    if (hf) fprintf(stderr, "shardlm: wrote %s (Hugging Face layout)\n", out);
    else fprintf(stderr, "shardlm: wrote %s (Megatron-style layout, tp %ld, pp %ld)\n", out, tp, pp);
    return 0;
}

/* libgomp reads its wait policy once, in a library constructor that runs before main. Its
 * default lets idle workers spin for a long while after every parallel region, which steals
 * the core the next serial step needs as soon as anything else runs on the machine (another
 * process, the gRPC threads): Gemma 3 270M decoding was measured at 4.5 tok/s that way and
 * 25 tok/s with a short spin on the 2-core build machine. So unless the user chose a policy,
 * shardlm runs itself again once with GOMP_SPINCOUNT=1000 (execv keeps the pid, so mpirun and
 * process supervisors see no difference). */
static void set_openmp_wait_policy(char **argv)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    /* The resolved path, not /proc/self/exe, so that the process keeps its name in ps. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    if (setenv("GOMP_SPINCOUNT", "1000", 1) != 0) return;
    execv(self, argv); /* returns only on failure: keep the default policy */
}

int main(int argc, char **argv)
{
    set_openmp_wait_policy(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        print_help(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (!strcmp(argv[1], "version")) {
        printf("shardlm 0.1.0 (CUDA backend %s)\n", backend_cuda_compiled() ? "compiled" : "not compiled");
        return 0;
    }
    if (!strcmp(argv[1], "serve")) return serve_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "chat")) return client_chat_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "complete")) return client_complete_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench")) return client_bench_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "stats")) return client_stats_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "convert")) return cmd_convert(argc - 2, argv + 2);
    if (!strcmp(argv[1], "reshard")) return cmd_reshard(argc - 2, argv + 2);
    return usage_error("unknown command '%s'", argv[1]);
}
