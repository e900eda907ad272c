/* cli/generate.c - `shardlm generate`: load a model (at any tp x pp under mpirun), generate from
 * a prompt locally, print the completion as it is produced and the speed to stderr.
 * Not here: the generation loop (engine/serving/generate.c).
 * Tests: tests/test_cli.sh. */
#include "commands.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "kv_cache.h"
#include "model.h"
#include "ops.h"
#include "parallel.h"
#include "tokenizer.h"

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

int generate_main(int argc, char **argv)
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
        else if (!v) return cli_usage("generate: %s needs a value", a);
        else if (!strcmp(a, "--model")) model_dir = v;
        else if (!strcmp(a, "--prompt")) prompt = v;
        else if (!strcmp(a, "--device")) device_name = v;
        else if (!strcmp(a, "--pp-layers")) pp_layers = v;
        else if (!strcmp(a, "--max-tokens")) { if (base_parse_long(v, 0, 1 << 20, &max_tokens)) return cli_usage("--max-tokens must be an integer in [0, 1048576], got '%s'", v); }
        else if (!strcmp(a, "--tp")) { if (base_parse_long(v, 1, 1024, &tp)) return cli_usage("--tp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--pp")) { if (base_parse_long(v, 1, 1024, &pp)) return cli_usage("--pp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--threads")) { if (base_parse_long(v, 0, 1024, &threads)) return cli_usage("--threads must be an integer in [0, 1024], got '%s'", v); }
        else if (!strcmp(a, "--seed")) { if (base_parse_long(v, 0, LONG_MAX, &seed)) return cli_usage("--seed must be a non-negative integer, got '%s'", v); }
        else if (!strcmp(a, "--temperature")) { if (base_parse_float(v, &o.sampling.temperature)) return cli_usage("--temperature must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-p")) { if (base_parse_float(v, &o.sampling.top_p)) return cli_usage("--top-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--min-p")) { if (base_parse_float(v, &o.sampling.min_p)) return cli_usage("--min-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-k")) { long k; if (base_parse_long(v, 0, INT_MAX, &k)) return cli_usage("--top-k must be a non-negative integer, got '%s'", v); o.sampling.top_k = (int)k; }
        else return cli_usage("generate: unknown option '%s'", a);
        i += takes;
    }
    if (!model_dir) return cli_usage("generate: --model DIR is required%s", "");
    o.sampling.seed = (uint64_t)seed;
    o.max_tokens = (int)max_tokens;
    enum status st = sampling_params_validate(&o.sampling);
    if (st != STATUS_OK) return cli_fail(st);

    enum device dev;
    if ((st = backend_parse_device(device_name, &dev)) != STATUS_OK) return cli_fail(st);
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
    if (st != STATUS_OK) rc = cli_fail(st);
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

