/* cli/generate.c - `shardlm generate`: load a model (at any tp x pp under mpirun: every rank runs
 * the same loop, rank 0 prints), generate from a prompt locally, print the prompt and its
 * completion as it is produced, and the speed to stderr. Flags, setup (world, backend,
 * tokenizer, model, KV cache) and teardown are each a function of their own.
 * With --speculative ngram, draft or eagle (--draft-model PATH) the prompt runs instead as one
 * request through the serving engine (generate_speculative: the same drafting and verification
 * as `shardlm serve`, docs/speculative.md).
 * Not here: the generation loop (engine/serving/generate.c), the server (serve.c).
 * Tests: tests/test_cli.sh, tests/test_generate_mpi.sh, tests/server/test_generate_speculative.py. */
#include "commands.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "generate.h"
#include "jinja.h"
#include "kv_cache.h"
#include "model.h"
#include "ops.h"
#include "parallel.h"
#include "spec_corpus.h"
#include "tokenizer.h"
#include "trainer.h"

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

/* The flags of `shardlm generate`. */
struct generate_flags {
    const char *model_dir, *prompt, *device_name, *pp_layers;
    long max_tokens, threads, seed, tp, pp, ep;
    int add_bos;
    /* Speculative decoding, serve's flags: --speculative ngram | draft | eagle, --draft-model PATH,
     * --spec-token-map FILE, --spec-draft K, --spec-ngram N, --spec-ngram-min M, --spec-p-min P. spec_mode 0: none, 1: ngram, 2: draft
     * (eagle: an EAGLE head). */
    int spec_mode;
    const char *draft_model, *token_map;
    int eagle; /* --speculative eagle: draft_model is an EAGLE head */
    long spec_draft, spec_ngram, spec_ngram_min;
    float spec_p_min; /* -1: not given */
    const char *spec_corpus;        /* --spec-corpus FILE[,FILE...]: drafts from those texts too */
    long spec_corpus_min;           /* --spec-corpus-min M (0: the engine's 3) */
    float spec_corpus_p_min;        /* --spec-corpus-p-min P (0: the engine's 0.5) */
    long spec_corpus_learn;         /* --spec-corpus-learn N, with --spec-corpus-keep FILE: */
    const char *spec_corpus_keep;   /* runs learn from each other's answers (docs/speculative.md) */
    /* --chat-template llama2|chatml|gemma|plain|FILE.jinja: how --spec-corpus's chat examples are
     * rendered (as `shardlm train` takes it); not given: the model's own or the detected one. */
    const char *corpus_template_file;
    int corpus_template_set;
    enum chat_template_kind corpus_template;
    struct generate_options o; /* sampling (temperature 0 unless given), max_tokens, ignore_eos */
};

/* Returns 0, or the exit code of a usage error (printed). */
static int generate_parse(int argc, char **argv, struct generate_flags *f)
{
    *f = (struct generate_flags){.prompt = "", .device_name = "cpu", .max_tokens = 128, .tp = 1, .pp = 1, .ep = 1,
                                 .add_bos = 1, .spec_p_min = -1.0f, .o = {.sampling = sampling_params_default()}};
    struct generate_options *o = &f->o;
    o->sampling.temperature = 0.0f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--ignore-eos")) { o->ignore_eos = 1; takes = 0; }
        else if (!strcmp(a, "--no-bos")) { f->add_bos = 0; takes = 0; }
        else if (!v) return cli_usage("generate: %s needs a value", a);
        else if (!strcmp(a, "--speculative")) {
            if (strcmp(v, "ngram") && strcmp(v, "draft") && strcmp(v, "eagle"))
                return cli_usage("--speculative must be ngram (prompt lookup), draft or eagle (with --draft-model), got "
                                 "'%s'", v);
            f->spec_mode = strcmp(v, "ngram") ? 2 : 1;
            f->eagle = !strcmp(v, "eagle");
        }
        else if (!strcmp(a, "--draft-model")) f->draft_model = v;
        else if (!strcmp(a, "--spec-token-map")) f->token_map = v;
        else if (!strcmp(a, "--spec-draft")) { if (base_parse_long(v, 1, 32, &f->spec_draft)) return cli_usage("--spec-draft must be an integer in [1, 32], got '%s'", v); }
        else if (!strcmp(a, "--spec-ngram")) { if (base_parse_long(v, 2, 16, &f->spec_ngram)) return cli_usage("--spec-ngram must be an integer in [2, 16], got '%s'", v); }
        else if (!strcmp(a, "--spec-ngram-min")) { if (base_parse_long(v, 1, 16, &f->spec_ngram_min)) return cli_usage("--spec-ngram-min must be an integer in [1, 16], got '%s'", v); }
        else if (!strcmp(a, "--spec-p-min")) { if (base_parse_float(v, &f->spec_p_min) || !(f->spec_p_min >= 0.0f && f->spec_p_min <= 1.0f)) return cli_usage("--spec-p-min must be a number in [0, 1], got '%s'", v); }
        else if (!strcmp(a, "--model")) f->model_dir = v;
        else if (!strcmp(a, "--prompt")) f->prompt = v;
        else if (!strcmp(a, "--device")) f->device_name = v;
        else if (!strcmp(a, "--pp-layers")) f->pp_layers = v;
        else if (!strcmp(a, "--max-tokens")) { if (base_parse_long(v, 0, 1 << 20, &f->max_tokens)) return cli_usage("--max-tokens must be an integer in [0, 1048576], got '%s'", v); }
        else if (!strcmp(a, "--tp")) { if (base_parse_long(v, 1, 1024, &f->tp)) return cli_usage("--tp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--pp")) { if (base_parse_long(v, 1, 1024, &f->pp)) return cli_usage("--pp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(a, "--threads")) { if (base_parse_long(v, 0, 1024, &f->threads)) return cli_usage("--threads must be an integer in [0, 1024], got '%s'", v); }
        else if (!strcmp(a, "--seed")) { if (base_parse_long(v, 0, LONG_MAX, &f->seed)) return cli_usage("--seed must be a non-negative integer, got '%s'", v); }
        else if (!strcmp(a, "--temperature")) { if (base_parse_float(v, &o->sampling.temperature)) return cli_usage("--temperature must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-p")) { if (base_parse_float(v, &o->sampling.top_p)) return cli_usage("--top-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--min-p")) { if (base_parse_float(v, &o->sampling.min_p)) return cli_usage("--min-p must be a number, got '%s'", v); }
        else if (!strcmp(a, "--top-k")) { long k; if (base_parse_long(v, 0, INT_MAX, &k)) return cli_usage("--top-k must be a non-negative integer, got '%s'", v); o->sampling.top_k = (int)k; }
        else if (!strcmp(a, "--spec-corpus-learn")) { if (base_parse_long(v, 1, SPEC_LEARN_MAX, &f->spec_corpus_learn)) return cli_usage("--spec-corpus-learn must be a count of tokens in [1, 268435456], got '%s'", v); }
        else if (!strcmp(a, "--spec-corpus-keep")) f->spec_corpus_keep = v;
        else if (!strcmp(a, "--spec-corpus")) f->spec_corpus = v;
        else if (!strcmp(a, "--chat-template")) {
            f->corpus_template_set = 1;
            if (chat_template_option(v, &f->corpus_template, &f->corpus_template_file) != STATUS_OK)
                return cli_usage("--chat-template must be llama2, chatml, gemma, plain or FILE.jinja, got '%s'", v);
        }
        else if (!strcmp(a, "--spec-corpus-min")) { if (base_parse_long(v, 1, SPEC_CORPUS_MAX_MATCH, &f->spec_corpus_min)) return cli_usage("--spec-corpus-min must be an integer in [1, 32], got '%s'", v); }
        else if (!strcmp(a, "--spec-corpus-p-min")) { if (base_parse_float(v, &f->spec_corpus_p_min) || !(f->spec_corpus_p_min > 0.0f && f->spec_corpus_p_min <= 1.0f)) return cli_usage("--spec-corpus-p-min must be a number in (0, 1], got '%s'", v); }
        else if (!strcmp(a, "--ep")) { if (base_parse_long(v, 1, 64, &f->ep)) return cli_usage("--ep must be an integer in [1, 64], got '%s'", v); }
        else return cli_usage("generate: unknown option '%s'", a);
        i += takes;
    }
    if (!f->model_dir) return cli_usage("generate: --model DIR or FILE.gguf is required%s", "");
    if (f->draft_model && !f->spec_mode) f->spec_mode = 2; /* serve's spelling: --draft-model alone */
    if (f->spec_mode == 2 && !f->draft_model)
        return cli_usage("generate: --speculative %s needs --draft-model PATH", f->eagle ? "eagle" : "draft");
    if (f->spec_mode == 1 && f->draft_model)
        return cli_usage("generate: --draft-model cannot be combined with --speculative ngram: the drafts come from "
                         "one or the other%s", "");
    if (f->spec_ngram && !f->spec_mode)
        return cli_usage("generate: --spec-ngram needs --speculative ngram, or a draft (prompt lookup first)%s", "");
    if (f->spec_ngram_min && f->spec_mode != 1 && !f->spec_ngram)
        return cli_usage("generate: --spec-ngram-min needs prompt lookup (--speculative ngram, or --spec-ngram beside a "
                         "draft)%s", "");
    if (f->spec_ngram_min > (f->spec_ngram ? f->spec_ngram : 3)) {
        char why[96];
        snprintf(why, sizeof why, "%ld is above --spec-ngram %ld", f->spec_ngram_min, f->spec_ngram ? f->spec_ngram : 3L);
        return cli_usage("generate: --spec-ngram-min %s", why);
    }
    if (f->token_map && f->spec_mode != 2) return cli_usage("generate: --spec-token-map needs --draft-model PATH%s", "");
    if (f->spec_p_min >= 0.0f && f->spec_mode != 2)
        return cli_usage("generate: --spec-p-min needs --draft-model PATH (prompt lookup's drafts have no probability)%s", "");
    if ((f->spec_corpus || f->spec_corpus_learn || f->spec_corpus_keep) && !f->spec_mode)
        return cli_usage("generate: --spec-corpus, --spec-corpus-learn and --spec-corpus-keep need speculation on "
                         "(--speculative ngram, or a --draft-model)%s", "");
    if ((f->spec_corpus_min || f->spec_corpus_p_min > 0.0f) && !f->spec_corpus && !f->spec_corpus_learn)
        return cli_usage("generate: --spec-corpus-min and --spec-corpus-p-min need --spec-corpus FILE or "
                         "--spec-corpus-learn N%s", "");
    if (f->corpus_template_set && !f->spec_corpus)
        return cli_usage("generate: --chat-template renders --spec-corpus's chat examples (the prompt is given as "
                         "text); give --spec-corpus FILE%s", "");
    if (!f->spec_corpus_learn != !f->spec_corpus_keep)
        return cli_usage("generate: --spec-corpus-learn N and --spec-corpus-keep FILE go together (one run learns only "
                         "for the runs after it, through the file)%s", "");
    if (f->spec_draft && !f->spec_mode) return cli_usage("generate: --spec-draft needs --speculative ngram or draft%s", "");
    o->sampling.seed = (uint64_t)f->seed;
    o->max_tokens = (int)f->max_tokens;
    return 0;
}

/* What one generation holds, from the world to the KV cache; released by generate_teardown. */
struct generate_run {
    struct parallel_world *world;
    struct parallel_groups groups;
    struct model_parallel  par;
    struct backend        *b;
    struct tokenizer      *tok;
    struct model          *m;
    struct kv_cache        cache;
    int                    printer; /* this rank prints: rank 0 */
};

/* Opens the world (when tp x pp > 1), the backend, the tokenizer and the model into r. On
 * failure r holds what was opened: generate_teardown releases it. */
static enum status generate_setup(const struct generate_flags *f, struct generate_run *r)
{
    enum device dev;
    enum status st = backend_parse_device(f->device_name, &dev);
    if (st != STATUS_OK) return st;
    r->printer = 1;
    struct parallel_layout layout;
    const long tp = f->ep > 1 ? f->ep * f->tp : f->tp; /* an ep group (x tp) takes the layout's tp place (moe_ep.c) */
    if (tp * f->pp > 1) {
        if ((st = parallel_init(NULL, NULL, &r->world)) != STATUS_OK) return st;
        if (f->ep > 1 && r->world->size % (tp * f->pp))
            return status_errorf(STATUS_INVALID_ARGUMENT, "%d ranks for --ep %ld x --tp %ld x --pp %ld: launch with mpirun -n %ld",
                                 r->world->size, f->ep, f->tp, f->pp, tp * f->pp);
        if ((st = parallel_layout(r->world, (int)tp, (int)f->pp, &layout)) != STATUS_OK) return st;
        r->printer = r->world->rank == 0;
    }
    if ((st = model_ranks_open(r->world, &layout, f->pp_layers, dev, 0, (int)f->threads, &r->b, &r->groups, &r->par)) !=
        STATUS_OK)
        return st;
    r->par.ep = f->ep > 1;
    if (f->ep > 1 && f->tp > 1 && (st = parallel_groups_add_atp(r->world, &layout, (int)f->tp, dev, dev == DEVICE_CUDA ? r->world->gpu : 0, r->b->stream, &r->groups)) != STATUS_OK)
        return st;
    if ((st = model_load(f->model_dir, r->b, tp * f->pp > 1 ? &r->par : NULL, &r->m)) != STATUS_OK) return st;
    return generate_load_tokenizer(f->model_dir, r->m, &r->tok);
}

/* The workspace and the KV cache for a prompt of n_ids tokens and o->max_tokens more. */
static enum status generate_reserve(struct generate_run *r, int n_ids, struct generate_options *o)
{
    int total = n_ids + o->max_tokens;
    int bt = 16, chunk = 256;
    enum status st = model_reserve(r->m, chunk, 1, (total + bt - 1) / bt, 1);
    if (st != STATUS_OK) return st;
    if ((st = kv_cache_init(&r->cache, r->b, r->m->n_layers_local, (total + bt - 1) / bt, bt, r->m->n_kv_local,
                            r->m->cfg.head_dim, r->m->dtype)) != STATUS_OK)
        return st;
    o->prefill_chunk = chunk;
    o->eos_id = r->m->cfg.eos_id >= 0 ? r->m->cfg.eos_id : tokenizer_eos_id(r->tok);
    return STATUS_OK;
}

static void generate_teardown(struct generate_run *r)
{
    kv_cache_free(&r->cache);
    model_free(r->m);
    tokenizer_free(r->tok);
    backend_close(r->b);
    parallel_groups_free(&r->groups);
    parallel_finalize(r->world);
}

/* ---- generate --speculative: one request through the serving engine ----------------------- */

/* The request's tokens as they come, printed by print_token (on rank 0); its end. */
struct spec_run {
    struct stream_ctx sc;
    int    done, n_generated;
    double t_first;               /* when the first token came (0: none yet), base_now_s */
    enum status st;
    char   msg[512];
};

static void spec_event(void *ctx, const struct engine_event *ev)
{
    struct spec_run *x = ctx;
    if (ev->kind == ENGINE_EVENT_TOKENS && ev->n_tokens > 0 && x->t_first == 0.0) x->t_first = base_now_s();
    for (int i = 0; i < ev->n_tokens && ev->kind != ENGINE_EVENT_PROMPT_LOGPROBS && !x->sc.failed; i++)
        print_token(&x->sc, ev->tokens[i]);
    if (ev->kind != ENGINE_EVENT_FINISHED) return;
    x->done = 1;
    x->n_generated = ev->completion_tokens;
    if (ev->finish == FINISH_REASON_ERROR) {
        x->st = ev->status != STATUS_OK ? ev->status : STATUS_INTERNAL;
        snprintf(x->msg, sizeof x->msg, "%s", ev->message ? ev->message : "generation failed");
    }
}

/* --spec-corpus: the files read as `shardlm train` and `shardlm serve` read them (data_load,
 * chat examples rendered with --chat-template's, else the model's own template where its tokenizer
 * writes the special tokens, else the built-in one detected), each text the model produces one
 * text of the corpus. */
static enum status generate_spec_corpus(const struct generate_flags *f, struct engine *e)
{
    struct engine_model_info info;
    engine_get_model_info(e, &info);
    const struct tokenizer *tok = engine_tokenizer(e);
    struct data_options dopt = {.seq_length = info.max_positions, .overflow = DATA_OVERFLOW_TRUNCATE};
    struct jinja_template *jt = NULL;
    struct train_dataset ds = {0};
    int32_t *ids = NULL;
    int64_t n = 0, texts = 0;
    if (f->corpus_template_set) dopt.chat_template = f->corpus_template; /* a name given; a file's below */
    enum status st = data_chat_options(f->corpus_template_file, !f->corpus_template_set, info.chat_template, f->model_dir,
                                       tok, &dopt, &jt);
    if (st == STATUS_OK) st = data_load(f->spec_corpus, tok, &dopt, &ds);
    if (st == STATUS_OK) st = data_target_texts(&ds, &ids, &n, &texts);
    if (st == STATUS_OK && !texts)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "no text a model produces (no assistant turn, text or completion)");
    if (st == STATUS_OK) st = engine_set_spec_corpus(e, ids, n);
    if (st != STATUS_OK) st = status_errorf(st, "--spec-corpus %s: %s", f->spec_corpus, status_message());
    else LOG_INFO("generate", "speculative corpus: %lld texts, %lld tokens from %s", (long long)texts,
                  (long long)(n - texts), f->spec_corpus);
    free(ids);
    data_free(&ds);
    jinja_free(jt);
    return st;
}

/* The one-sequence loop (generate_run) does not speculate, so with --speculative the prompt
 * runs as one request of the serving engine, stepped on this thread: the drafting, verification
 * and refusals of `shardlm serve` (a draft of another vocabulary, tp / pp under mpirun with the
 * draft on rank 0, docs/speculative.md). Greedy output equals generate_run's wherever the
 * model's rows do not depend on the batch (f32 / bf16); a sampled run draws from the same
 * distribution but from the engine's random stream, not generate_run's. Prints the prompt, the
 * completion as it comes, and to stderr the token counts and the drafts verified and accepted. */
static int generate_speculative(const struct generate_flags *f)
{
    enum device dev;
    enum status st = backend_parse_device(f->device_name, &dev);
    if (st != STATUS_OK) return cli_fail(st);
    struct engine_options o = engine_options_default();
    o.model_dir = f->model_dir;
    o.device = (int)dev;
    o.n_threads = (int)f->threads;
    o.spec_draft = f->spec_draft ? (int)f->spec_draft : 5;
    /* One sequence; the engine's logits rows are max_seqs + 64 (64 kept for prompt
     * log-probabilities) and a step's drafts take what is left beyond the running sequences, so
     * max_seqs 1 + spec_draft leaves room for every draft. The KV pool: one sequence of at most
     * the prompt's bytes + BOS (no token is shorter than a byte), max_tokens and the drafts. */
    o.max_seqs = 1 + o.spec_draft;
    o.kv_cache_blocks = (int)((strlen(f->prompt) + 2 + (size_t)f->o.max_tokens + (size_t)o.spec_draft + 15) / 16) + 1;
    o.spec_ngram = (int)f->spec_ngram;
    o.spec_ngram_min = (int)f->spec_ngram_min;
    o.spec_max_batch = 1;
    o.draft_model_dir = f->spec_mode == 2 ? f->draft_model : NULL;
    o.draft_token_map = f->token_map;
    o.draft_eagle = f->eagle;
    o.spec_lookup_first = f->spec_mode == 2 && f->spec_ngram;
    o.spec_p_min = f->spec_p_min > 0.0f ? f->spec_p_min : 0.0f;
    o.spec_corpus_learn = f->spec_corpus_learn;
    o.spec_corpus_keep = f->spec_corpus_keep;
    o.spec_corpus_min = (int)f->spec_corpus_min;
    o.spec_corpus_p_min = f->spec_corpus_p_min;
    o.pp_layers = f->pp_layers;
    struct parallel_world *world = NULL;
    const long tp = f->ep > 1 ? f->ep * f->tp : f->tp; /* as generate_setup */
    if (tp * f->pp > 1) {
        if ((st = parallel_init(NULL, NULL, &world)) != STATUS_OK) return cli_fail(st);
        o.world = world;
        o.tp = (int)tp;
        o.ep_group = f->ep > 1;
        o.ep_tp = f->ep > 1 ? (int)f->tp : 1;
        o.pp = (int)f->pp;
        o.dp = 1;
    }
    struct engine *e = NULL;
    struct spec_run x = {.st = STATUS_OK};
    int32_t *ids = NULL;
    int n_ids = 0, rc = 1;
    if ((st = engine_create(&o, &e)) != STATUS_OK) goto done;
    if (!engine_is_conductor(e)) {
        st = engine_run_worker(e);
        rc = st == STATUS_OK ? 0 : 1;
        goto done;
    }
    const struct tokenizer *tok = engine_tokenizer(e);
    if (f->spec_corpus && (st = generate_spec_corpus(f, e)) != STATUS_OK) goto done;
    if ((st = tokenizer_encode(tok, f->prompt, strlen(f->prompt), f->add_bos, &ids, &n_ids)) != STATUS_OK) goto done;
    struct request_params p = request_params_default();
    p.sampling = f->o.sampling;
    p.has_seed = 1;
    p.max_tokens = f->o.max_tokens;
    p.ignore_eos = f->o.ignore_eos;
    detokenizer_init(&x.sc.detok, tok);
    for (int i = 0; i < n_ids; i++) { /* as generate_main: the completion is spaced as a continuation */
        const char *skip;
        size_t skip_len;
        if ((st = detokenizer_push(&x.sc.detok, ids[i], &skip, &skip_len)) != STATUS_OK) goto done;
    }
    uint64_t handle;
    if ((st = engine_submit(e, NULL, ids, n_ids, &p, spec_event, &x, &handle)) != STATUS_OK) goto done;
    fwrite(f->prompt, 1, strlen(f->prompt), stdout);
    const double t0 = base_now_s();
    while (!x.done) engine_step(e);
    const double t_end = base_now_s();
    const char *tail;
    size_t tail_len;
    if (detokenizer_flush(&x.sc.detok, &tail, &tail_len) == STATUS_OK) fwrite(tail, 1, tail_len, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    if (x.st != STATUS_OK) {
        st = status_errorf(x.st, "%s", x.msg);
        goto done;
    }
    if (x.sc.failed) {
        st = status_errorf(STATUS_INTERNAL, "detokenization failed");
        goto done;
    }
    struct engine_stats es;
    engine_get_stats(e, &es);
    /* The figures of plain generate: prefill until the first token, decode after it. */
    const double prefill_s = x.t_first > 0.0 ? x.t_first - t0 : t_end - t0, decode_s = t_end - x.t_first;
    char threads[24] = "all", corpus[160] = "";
    if (f->spec_corpus_keep || f->spec_corpus)
        snprintf(corpus, sizeof corpus, " (the %scorpus: %llu tokens; %llu of its drafts verified, %llu accepted)",
                 f->spec_corpus_keep ? "kept " : "", (unsigned long long)es.spec_corpus_tokens, (unsigned long long)es.spec_corpus_drafted,
                 (unsigned long long)es.spec_corpus_accepted);
    if (o.n_threads > 0) snprintf(threads, sizeof threads, "%d", o.n_threads);
    fprintf(stderr, "shardlm: prompt %d tokens, prefill %.1f tok/s; generated %d tokens, decode %.1f tok/s "
            "(speculative %s, %s threads, tp %ld, pp %ld); %llu drafts verified, %llu accepted%s\n", n_ids,
            prefill_s > 0 ? n_ids / prefill_s : 0.0, x.n_generated,
            x.t_first > 0.0 && x.n_generated > 1 && decode_s > 0 ? (x.n_generated - 1) / decode_s : 0.0,
            f->spec_mode == 2 ? (f->eagle ? (f->spec_ngram ? "ngram + eagle" : "eagle")
                                          : (f->spec_ngram ? "ngram + draft" : "draft"))
                              : "ngram",
            threads, f->tp, f->pp,
            (unsigned long long)es.spec_drafted, (unsigned long long)es.spec_accepted, corpus);
    rc = 0;
done:
    if (st != STATUS_OK) rc = cli_fail(st);
    if (x.sc.detok.tok) detokenizer_free(&x.sc.detok);
    free(ids);
    engine_free(e);
    parallel_finalize(world);
    return rc;
}

int generate_main(int argc, char **argv)
{
    struct generate_flags f;
    int rc = generate_parse(argc, argv, &f);
    if (rc != 0) return rc;
    struct generate_options *o = &f.o;
    enum status st = sampling_params_validate(&o->sampling);
    if (st != STATUS_OK) return cli_fail(st);
    if (f.spec_mode) return generate_speculative(&f);

    struct generate_run r = {0};
    int32_t *ids = NULL, *out = NULL;
    int n_ids = 0, n_out = 0;
    struct stream_ctx sc = {0};
    rc = 1;
    if ((st = generate_setup(&f, &r)) != STATUS_OK) goto done;
    if ((st = tokenizer_encode(r.tok, f.prompt, strlen(f.prompt), f.add_bos, &ids, &n_ids)) != STATUS_OK) goto done;
    if (n_ids == 0) {
        st = status_errorf(STATUS_INVALID_ARGUMENT, "the prompt is empty and --no-bos was given");
        goto done;
    }
    if ((st = generate_reserve(&r, n_ids, o)) != STATUS_OK) goto done;
    out = malloc(((size_t)o->max_tokens + 1) * sizeof *out);
    if (!out) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    detokenizer_init(&sc.detok, r.tok);
    /* The prompt's ids go through the detokenizer first (their text is the prompt, printed
     * as given), so that the first generated piece is spaced as a continuation. */
    for (int i = 0; i < n_ids; i++) {
        const char *skip;
        size_t skip_len;
        if ((st = detokenizer_push(&sc.detok, ids[i], &skip, &skip_len)) != STATUS_OK) goto done;
    }
    if (r.printer) fwrite(f.prompt, 1, strlen(f.prompt), stdout);
    struct generate_stats gs;
    if ((st = generate_run(r.m, &r.cache, ids, n_ids, o, r.printer ? print_token : NULL, &sc, out, &n_out, &gs)) !=
        STATUS_OK)
        goto done;
    if (!r.printer) {
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
    fprintf(stderr, "shardlm: prompt %d tokens, prefill %.1f tok/s; generated %d tokens, decode %.1f tok/s (%s, %d threads, tp %ld, pp %ld, ep %ld)\n",
            gs.n_prompt, gs.prefill_seconds > 0 ? gs.n_prompt / gs.prefill_seconds : 0.0, gs.n_generated,
            gs.decode_seconds > 0 && gs.n_generated > 1 ? (gs.n_generated - 1) / gs.decode_seconds : 0.0,
            r.b->ops->name, r.b->n_threads, f.tp, f.pp, f.ep);
    rc = 0;
done:
    if (st != STATUS_OK) rc = cli_fail(st);
    if (sc.detok.tok) detokenizer_free(&sc.detok);
    free(out);
    free(ids);
    generate_teardown(&r);
    return rc;
}
