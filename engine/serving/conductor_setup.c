/* engine/serving/conductor_setup.c - a replica's conductor made and unmade (conductor.h
 * conductor_create, conductor_free): the backend, the ranks' groups and the model (with the
 * attention sub-groups of --ep E --tp T), the KV pool's size, the served adapters, the draft
 * model of speculative decoding, the step buffers; and their release. Not here: what the
 * conductor does with them (conductor.c, the step; conductor_ranks.c, the workers).
 * Tests: tests/test_engine.c and every server test. */
#include "conductor_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "grammar.h"
#include "spec_corpus.h"
#include "tokenizer.h"

/* The KV pool in blocks: bytes, a fraction of free memory, blocks, or enough for max_seqs full
 * contexts capped at 2 GiB. The weights and the workspace are already allocated. */
static enum status kv_pool_blocks(struct conductor *c, size_t block_bytes, int table_width, long long *out)
{
    const struct engine_options *o = &c->o;
    long long n_blocks = o->kv_cache_blocks;
    if (c->m->cfg.encoder) { /* an encoder embeds without the cache (model_embed): one block keeps the structures whole */
        n_blocks = 1;
    } else if (o->kv_cache_bytes) {
        n_blocks = (long long)(o->kv_cache_bytes / block_bytes);
    } else if (o->kv_cache_fraction > 0) {
        size_t free_bytes = 0, total_bytes = 0;
        if (!(o->kv_cache_fraction <= 0.95))
            return status_errorf(STATUS_INVALID_ARGUMENT, "kv_cache_fraction must be in (0, 0.95], got %g",
                                 o->kv_cache_fraction);
        enum status st = backend_mem_info(c->b, &free_bytes, &total_bytes);
        if (st != STATUS_OK) return st;
        /* Ranks sharing one GPU (SHARDLM_SHARE_GPU) split the fraction between them. */
        const int sharers = o->world ? o->world->gpu_sharers : 1;
        n_blocks = (long long)((double)free_bytes * o->kv_cache_fraction / sharers / (double)block_bytes);
        LOG_INFO(MODULE, "KV pool: %.2f of %.0f MiB free%s", o->kv_cache_fraction / sharers,
                 (double)free_bytes / 1048576.0, sharers > 1 ? " (GPU shared)" : "");
    } else if (!n_blocks) {
        n_blocks = (long long)o->max_seqs * table_width;
        long long cap = (long long)((2ull << 30) / block_bytes);
        if (n_blocks > cap) n_blocks = cap;
    }
    if (c->par.world) { /* every rank's pool must hold the same blocks: the smallest count wins
                          * (pipeline stages hold different weights, so their free memory differs) */
        int64_t nb = n_blocks;
        enum status st = parallel_min_i64(c->par.world, &nb);
        if (st != STATUS_OK) return st;
        n_blocks = nb;
    }
    if (n_blocks < 1 || n_blocks > (1LL << 30))
        return status_errorf(STATUS_INVALID_ARGUMENT,
                             "the KV cache must hold at least one block of %zu bytes (got %lld blocks)", block_bytes,
                             n_blocks);
    *out = n_blocks;
    return STATUS_OK;
}

/* The backend, the ranks' groups, the tokenizer and the model. */
static enum status load_model(struct conductor *c)
{
    const struct engine_options *o = &c->o;
    const int multi = o->world && o->world->size > 1;
    enum status st;
    struct parallel_layout layout;
    if (multi && (st = parallel_layout(o->world, o->tp, o->pp, &layout)) != STATUS_OK) return st;
    if ((st = model_ranks_open(multi ? o->world : NULL, &layout, o->pp_layers, (enum device)o->device, o->device_id,
                               o->n_threads, &c->b, &c->groups, &c->par)) != STATUS_OK)
        return st;
    c->par.ep = o->ep_group;
    if (multi && o->ep_group && o->ep_tp > 1) {
        const int dev_id = o->device == DEVICE_CUDA ? o->world->gpu : 0;
        if ((st = parallel_groups_add_atp(o->world, &layout, o->ep_tp, (enum device)o->device, dev_id, c->b->stream,
                                          &c->groups)) != STATUS_OK)
            return st;
    }
    /* A test's: serving on the CPU in the GPU's bf16 (or f16) activations, logits included */
    const char *dt = getenv("SHARDLM_TEST_SERVE_DTYPE");
    const int dtype = !dt ? -1 : !strcmp(dt, "bf16") ? DTYPE_BF16 : !strcmp(dt, "f16") ? DTYPE_F16 : -1;
    st = model_load_as(o->model_dir, c->b, multi ? &c->par : NULL, dtype, &c->m);
    if (st == STATUS_OK) st = generate_load_tokenizer(o->model_dir, c->m, &c->tok);
    if (multi) st = parallel_agree(o->world, st); /* every rank fails together, none waits alone */
    return st;
}

/* The draft model of speculative decoding (--draft-model) and its buffers, after the target's.
 * Loaded where the sampler runs, on the first rank of the replica only: its tokens are proposed
 * before the step is planned (speculate), so to the other ranks of a tp / pp replica its drafts
 * are only more rows of the plan they replay, and the draft runs whole (unsharded) on the first
 * rank's backend. With data parallelism each replica loads its own. The caller turns the
 * device-greedy path, which never drafts, off on every rank. */
static enum status load_draft(struct conductor *c)
{
    struct engine_options *o = &c->o;
    if (o->spec_draft <= 0) o->spec_draft = 5;
    const int slots = o->spec_max_batch > 0 ? o->spec_max_batch : 4;
    enum status st = o->draft_eagle ? draft_load_eagle(o->draft_model_dir, o->model_dir, c->b, c->m, &c->cache, slots,
                                                      &c->draft)
                                    : draft_load(o->draft_model_dir, c->b, c->m, slots, &c->draft);
    if (st == STATUS_OK && o->draft_token_map) st = draft_token_map(&c->draft, o->draft_token_map);
    if (st != STATUS_OK) return st;
    c->spec_gate = c->spec_prior; /* draft_gate (SHARDLM_SPEC_PRIOR=0: off, every opportunity proposes) */
    const size_t V = (size_t)c->m->cfg.vocab_size, k = (size_t)(o->spec_draft < 32 ? o->spec_draft : 32);
    c->spec_q = malloc((size_t)c->draft.n_slots * k * V * sizeof *c->spec_q);
    c->spec_p = malloc(V * sizeof *c->spec_p);
    if (!c->spec_q || !c->spec_p)
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory for the draft distributions");
    return STATUS_OK;
}

/* A test hook's delay: $name in milliseconds, in (0, 1000), as nanoseconds (0 unset); said in the log. */
static long test_delay_ns(const char *name, const char *what)
{
    const char *v = getenv(name);
    float ms = 0.0f;
    if (!v || base_parse_float(v, &ms) != 0 || !(ms > 0.0f && ms < 1000.0f)) return 0;
    LOG_WARN(MODULE, "%s=%s: %s", name, v, what);
    return (long)(ms * 1e6f);
}

enum status conductor_create(const struct engine_options *opt, struct conductor **out)
{
    *out = NULL;
    struct conductor *c = calloc(1, sizeof *c);
    if (!c) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory");
    c->o = *opt;
    const struct engine_options *o = &c->o;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->gmu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->embed_cv, NULL);
    c->next_handle = 1;
    enum status st = load_model(c);
    if (st == STATUS_OK)
        st = adapter_set_init(&c->adapters, c->m, o->max_loras, o->max_lora_rank, c->par.world != NULL, o->adapter_names,
                              o->adapter_dirs, o->n_adapters);
    if (st != STATUS_OK) goto fail;
    const struct model_config *cfg = &c->m->cfg;
    const int bt = o->block_tokens;
    const int table_width = (cfg->max_positions + bt - 1) / bt; /* blocks per sequence */
    /* One logits row per running sequence, plus room for prompt log-probability rows; a large
     * vocabulary (262k for Gemma 3) makes every row cost 1 MiB on the device and the host. */
    c->max_logits = o->max_seqs + 64 < o->max_batch_tokens ? o->max_seqs + 64 : o->max_batch_tokens;
    if ((st = model_reserve(c->m, o->max_batch_tokens, o->max_seqs, table_width, c->max_logits)) != STATUS_OK) goto fail;
    size_t block_bytes = kv_cache_block_bytes(c->m->n_layers_local, bt, c->m->n_kv_local, cfg->head_dim, c->m->dtype);
    /* An EAGLE head's features are kept beside each slot (host f32, d_model each: struct
     * kv_cache.features), so that a cached prefix keeps them; the pool's bytes pay for them. */
    if (o->draft_eagle) block_bytes += (size_t)bt * (size_t)cfg->d_model * sizeof(float);
    long long n_blocks = 0;
    if ((st = kv_pool_blocks(c, block_bytes, table_width, &n_blocks)) != STATUS_OK) goto fail;
    if ((st = kv_cache_init(&c->cache, c->b, c->m->n_layers_local, (int)n_blocks, bt, c->m->n_kv_local,
                            cfg->head_dim, c->m->dtype)) != STATUS_OK)
        goto fail;
    const struct scheduler_options so = {.max_seqs = o->max_seqs, .max_batch_tokens = o->max_batch_tokens,
                                         .max_logits = c->max_logits, .table_width = table_width,
                                         .prefix_caching = o->prefix_caching, .record_copies = c->par.world != NULL,
                                         .policy = (enum scheduling_policy)o->scheduling};
    if ((st = scheduler_init(&c->sched, &c->cache, &so)) != STATUS_OK) goto fail;
    if ((st = sampler_init(&c->smp, cfg->vocab_size)) != STATUS_OK) goto fail;
    c->top_k = model_top_width(cfg->vocab_size);
    if ((st = sampler_init(&c->top_smp, c->top_k)) != STATUS_OK) goto fail;
    const char *par_sampling = getenv("SHARDLM_PARALLEL_SAMPLING"); /* 0: every row on the engine thread */
    c->presample_off = par_sampling && !strcmp(par_sampling, "0");
    const char *dev_sampling = getenv("SHARDLM_DEVICE_SAMPLING");
    c->device_greedy = dev_sampling && *dev_sampling ? strcmp(dev_sampling, "0") != 0 : c->b->device == DEVICE_CUDA;
    if (c->par.layout.pp_size > 1) c->device_greedy = 0; /* the logits travel to rank 0 (run_forward) */
    /* Speculation asked for (prompt lookup, or a draft model or EAGLE head), on every rank:
     * verifying drafts needs the host's rows, so the device-greedy path, which never drafts, is off
     * (else --speculative ngram on CUDA would silently do nothing: the 2026-12-04 GPU run). */
    if ((o->spec_draft > 0 || o->draft_model_dir) && c->device_greedy) {
        c->device_greedy = 0;
        LOG_INFO(MODULE, "speculative decoding on: greedy tokens are picked on the host, not the device");
    }
    char why[256];
    if (c->device_greedy) { /* before any request trusts them */
        if (sampler_device_check(c->b, why, sizeof why))
            LOG_INFO(MODULE, "the device's sampling ops agree with the host's arithmetic (%s)", why);
        else {
            c->device_greedy = 0;
            LOG_WARN(MODULE, "the device's sampling ops disagree with the host's (%s): every row's logits are "
                             "downloaded and sampled on the host", why);
        }
    }
    if (c->device_greedy) { /* plain temperature draws on the device: how near an edge they may land */
        c->draw_tol = sampler_draw_tolerance(c->b);
        const char *draw_tol = getenv("SHARDLM_TEST_DRAW_TOL"); /* a test's: more draws fetched */
        if (draw_tol && *draw_tol) c->draw_tol = atof(draw_tol);
        if (isinf(c->draw_tol))
            LOG_WARN(MODULE, "draws on the device gave tokens other than the host's on calibration rows: none is "
                             "taken, every such row is fetched whole and sampled on the host");
        else
            LOG_INFO(MODULE, "plain temperature draws on the device: %s (taken at least %g inside their token)",
                     c->draw_tol == SAMPLER_DRAW_TOL_EXACT ? "its weights are the host's bits" :
                     c->draw_tol == SAMPLER_DRAW_TOL ? "its weights differ from the host's in last bits" :
                     "a test's tolerance", c->draw_tol);
    }
    const size_t V = (size_t)cfg->vocab_size;
    void *logits = NULL; /* every step downloads into it: page-locked on CUDA */
    (void)backend_host_alloc(c->b, (size_t)c->max_logits * V * sizeof *c->logits, &logits);
    c->logits = logits;
    c->scratch = malloc(2 * V * sizeof *c->scratch);
    c->mb_qstart = malloc(((size_t)o->max_seqs + 1) * sizeof(int32_t));
    c->mb_rows = malloc((size_t)c->max_logits * sizeof(int32_t));
    c->greedy_ids = malloc((size_t)c->max_logits * sizeof(int32_t));
    c->gmask = malloc((V + 31) / 32 * sizeof *c->gmask);
    c->top_values = malloc((size_t)c->max_logits * (size_t)c->top_k * sizeof *c->top_values);
    c->top_ids = malloc((size_t)c->max_logits * (size_t)c->top_k * sizeof *c->top_ids);
    c->top_lg = malloc((size_t)c->top_k * sizeof *c->top_lg);
    c->top_tok = malloc((size_t)c->top_k * sizeof *c->top_tok);
    c->top_inv_temp = malloc((size_t)c->max_logits * sizeof *c->top_inv_temp);
    c->top_mass = malloc((size_t)c->max_logits * sizeof *c->top_mass);
    c->draw_temp = malloc((size_t)c->max_logits * sizeof *c->draw_temp);
    c->draw_u = malloc((size_t)c->max_logits * sizeof *c->draw_u);
    c->draw_top_p = malloc((size_t)c->max_logits * sizeof *c->draw_top_p);
    c->draw_margin = malloc((size_t)c->max_logits * sizeof *c->draw_margin);
    c->draw_ids = malloc((size_t)c->max_logits * sizeof *c->draw_ids);
    c->draw_rng = malloc((size_t)c->max_logits * sizeof *c->draw_rng);
    c->edit_at = malloc(V * sizeof *c->edit_at);
    c->lse_want = malloc((size_t)c->max_logits * sizeof *c->lse_want);
    c->top_lse = malloc((size_t)c->max_logits * sizeof *c->top_lse);
    if (c->edit_at)
        for (size_t i = 0; i < V; i++) c->edit_at[i] = -1;
    if (!c->logits || !c->scratch || !c->mb_qstart || !c->mb_rows || !c->greedy_ids || !c->gmask || !c->top_values ||
        !c->top_ids || !c->top_lg || !c->top_tok || !c->top_inv_temp || !c->top_mass || !c->draw_temp || !c->draw_u || !c->draw_top_p ||
        !c->draw_margin || !c->draw_ids || !c->draw_rng || !c->edit_at || !c->lse_want || !c->top_lse) {
        st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory for the step buffers");
        goto fail;
    }
    const char *check_gm = getenv("SHARDLM_SPEC_CHECK_GRAMMAR");
    c->spec_check_grammar = check_gm && *check_gm && strcmp(check_gm, "0") != 0;
    const char *prior = getenv("SHARDLM_SPEC_PRIOR");
    c->spec_prior = !(prior && !strcmp(prior, "0"));
    if (o->draft_model_dir) {
        st = conductor_is_first_rank(c) ? load_draft(c) : STATUS_OK;
        /* An EAGLE head's features, every row's hidden state: on the first rank, which keeps them, and
         * at pp > 1 on the last stage's first tp rank, which sends them there (run_forward) */
        const int features_here = conductor_is_first_rank(c) ||
                                  (c->par.layout.pp_size > 1 && c->par.layout.rank == conductor_last_stage_rank(c));
        if (st == STATUS_OK && o->draft_eagle && features_here &&
            !(c->eagle_hidden = malloc((size_t)o->max_batch_tokens * (size_t)cfg->d_model * sizeof *c->eagle_hidden)))
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "engine: out of host memory for the EAGLE features");
        if (c->par.world) st = parallel_agree(c->par.world, st); /* the workers fail with the first rank */
        if (st != STATUS_OK) goto fail;
    }
    c->stats.kv_blocks_total = c->cache.n_blocks;
    c->stats.kv_blocks_free = c->cache.n_blocks; /* true before the first step too */
    c->stats.block_tokens = bt;
    if (o->spec_corpus_keep) { /* the first rank reads the file, every rank agrees */
        st = spec_keep_load(c);
        if (c->par.world) st = parallel_agree(c->par.world, st);
        if (st != STATUS_OK) goto fail;
    }
    verify_init(c);
    c->test_step_delay_ns = test_delay_ns("SHARDLM_TEST_STEP_DELAY_MS", "every step waits that long");
    c->test_draft_row_delay_ns = test_delay_ns("SHARDLM_TEST_DRAFT_ROW_DELAY_MS",
                                               "a decode step waits that long for each draft row it verifies");
    c->test_finish_delay_ns = test_delay_ns("SHARDLM_TEST_FINISH_DELAY_MS",
                                            "the engine waits that long after each FINISHED event");
    /* Only the first rank times out: workers legitimately wait for the next plan forever. Every
     * rank beats (parallel_watch_start), so that the timeout names the rank that stopped. */
    if (c->par.world && c->par.world->rank == 0) c->par.world->timeout_s = o->rank_timeout_s;
    if (c->par.world && o->rank_timeout_s > 0 && (st = parallel_watch_start(c->par.world)) != STATUS_OK) goto fail;
    LOG_INFO(MODULE,
             "ready: %d KV blocks of %d tokens (%.1f MiB), max_batch_tokens %d, max_seqs %d, prefix caching %s, "
             "scheduling %s",
             c->cache.n_blocks, bt, (double)block_bytes * (double)c->cache.n_blocks / 1048576.0, o->max_batch_tokens,
             o->max_seqs, o->prefix_caching ? "on" : "off", scheduling_policy_name((enum scheduling_policy)o->scheduling));
    *out = c;
    return STATUS_OK;
fail:
    conductor_free(c);
    return st;
}

void conductor_free(struct conductor *c)
{
    if (!c) return;
    if (c->m && c->sched.running && conductor_is_first_rank(c)) conductor_drain(c, 0.0); /* cancels and reports what is left */
    log_comm_time(c);
    stop_workers(c);
    parallel_groups_free(&c->groups);
    free(c->plan);
    free(c->mb_qstart);
    free(c->mb_rows);
    free(c->greedy_ids);
    free(c->top_values);
    free(c->top_ids);
    free(c->top_lg);
    free(c->top_tok);
    free(c->top_inv_temp);
    free(c->top_mass);
    free(c->draw_temp);
    free(c->draw_u);
    free(c->draw_top_p);
    free(c->draw_margin);
    free(c->draw_ids);
    free(c->draw_rng);
    free(c->edit_at);
    free(c->lse_want);
    free(c->top_lse);
    free(c->edit_rows);
    free(c->edit_ids);
    free(c->edit_vals);
    free(c->mask_rows);
    free(c->masks);
    free(c->gmask);
    verify_free(c);
    grammar_cache_free(c->gcache);
    grammar_vocab_free(c->gvocab);
    pthread_mutex_destroy(&c->gmu);
    scheduler_free(&c->sched);
    backend_host_free(c->b, c->logits);
    free(c->scratch);
    sampler_free(&c->smp);
    sampler_free(&c->top_smp);
    conductor_presample_free(c);
    draft_free(&c->draft);
    spec_keep_save(c); /* the thread has stopped (conductor_drain) */
    spec_corpus_free(c->corpus);
    free(c->learn);
    free(c->learn_scope);
    free(c->spec_q);
    free(c->spec_p);
    free(c->eagle_hidden);
    if (c->cache.b) kv_cache_free(&c->cache);
    adapter_set_free(&c->adapters, c->b);
    model_free(c->m);
    tokenizer_free(c->tok);
    backend_close(c->b);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->embed_cv);
    free(c);
}
