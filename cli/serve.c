/* cli/serve.c - `shardlm serve`: parses the flags into struct server_options and runs the
 * server. Flags (defaults in brackets):
 *   --model DIR|FILE.gguf    checkpoint directory, or a GGUF file (CPU: quantized matrices kept
 *                            as blocks; docs/quantization.md) (required); repeatable: several
 *                            models in one server, each with the --lora after it (docs/server.md)
 *   --listen HOST:PORT       [127.0.0.1:50051]; port 0 picks a free port (printed on stdout)
 *   --device cpu|cuda        [cpu]        --threads N        CPU threads [0 = all cores]
 *   --max-batch-tokens N     [512]        --max-seqs N       running samples [64]
 *   --max-queue N            waiting samples [1024]: a request of n samples takes n places
 *                            (refused with RESOURCE_EXHAUSTED when they do not fit; n > N is
 *                            invalid)                  --block-tokens N   tokens per KV block [16]
 *   --kv-cache-mem BYTES     KV pool size (suffix K, M or G allowed) [enough for max-seqs
 *                            full-context sequences]
 *   --kv-cache-fraction F    KV pool as a fraction (0, 0.95] of the free memory left after the
 *                            model is loaded (host memory on the CPU, GPU memory on CUDA)
 *   --kv-cache-blocks N      KV pool size in blocks, when neither of the above is given
 *   --no-prefix-caching      do not share prompt blocks between requests
 *   --prefix-cache-per-key   share them only between requests of one API key's owner (needs
 *                            --api-key-file); HTTP's cache_salt narrows sharing per request
 *   --verify-prefix-cache F  recompute fraction F of the prompts served from the prefix cache
 *                            without it and count logit mismatches (/metrics)
 *   --batch-invariant        a request's tokens never depend on the batch around it, for
 *                            block-quantized (GGUF) weights too, at some prefill speed
 *                            (SHARDLM_BATCH_INVARIANT=1; docs/determinism.md)
 *   --scheduling-policy fcfs|fair|priority  which waiting sample is admitted next [fcfs]: first
 *                            come first served; the client (API key, else connection, HTTP
 *                            `user`) with the fewest running samples; the lowest request
 *                            `priority` (docs/engine.md, "Scheduling policies")
 *   --chat-template llama2|chatml|gemma|plain|FILE.jinja   [the model's own Jinja template for a
 *                                       byte-level BPE vocabulary, else chosen: chat_template.h]
 *   --reasoning-format auto|deepseek|none  split a reply's <think>...</think> into
 *                            reasoning_content: deepseek always, none never, auto [default] when
 *                            the Jinja chat template holds <think>
 *   --api-key-file F         require "authorization: Bearer <key>" with a key of F
 *   --tls-cert F --tls-key F serve TLS with this PEM certificate chain and key
 *   --drain-timeout S        seconds running requests may finish after SIGTERM [30]
 *   --send-timeout S         a gRPC call whose client takes no message for S seconds (a client
 *                            that stops reading) is cancelled; HTTP sockets get it as their
 *                            TCP_USER_TIMEOUT; 0 = never [60]
 *   --max-message-bytes N    largest request message (gRPC) or body (HTTP) [4194304]
 *   --http ADDR              also serve the OpenAI-compatible HTTP API and /metrics on ADDR
 *                            (HOST:PORT; ":PORT" or "PORT" = 127.0.0.1) [off]
 *   --http-max-connections N open HTTP connections at most [256]; more are answered 503
 *   --http-max-connections-per-address N   open HTTP connections from one peer address at
 *                            most [3/4 of --http-max-connections: 192]; 0 = no cap (behind a
 *                            proxy, where every client has its address); more are answered 503
 *   --http-header-timeout S  seconds from a connection's accept (or its previous response) to
 *                            the end of a request's headers [10]; then the connection is closed
 *   --http-body-timeout S    seconds from the end of the headers to the body's last byte [60]
 *   --responses-store N      /v1/responses kept for GET and previous_response_id at most [1024]
 *                            (and 256 MiB of JSON); the least recently used go first
 *   --journal DIR            the stream journal (docs/reliability.md): accepted gRPC generation
 *                            calls and OpenAI chat / completions requests, and their events, in
 *                            DIR/journal; a restart resumes them and clients reattach (gRPC:
 *                            metadata shardlm-resume-token; HTTP: Last-Event-ID, Idempotency-Key)
 *   --journal-fsync accept|always|never  when the journal is fsync'd [accept: every ACCEPT]
 *   --journal-retain S       a resumed request's answer waits this long for its client [600]
 *   --journal-end-delay S    a delivered answer stays resumable this long after its last bytes
 *                            went out, against a crash before the client read them [10; 0 off]
 *   --journal-detach-grace S a request (HTTP or gRPC) whose client went away (a dropped
 *                            connection) runs on this long for it to reattach, then is
 *                            cancelled [30; 0: at once]
 *   --journal-detach-max N   at most N such requests running on at once; past it a client that
 *                            goes away cancels its request [256]
 *   --journal-detach-max-per-key N  at most N of them of one API key's [half of
 *                            --journal-detach-max with two or more keys]
 *   --fine-tuning DIR        OpenAI's /v1/files and /v1/fine_tuning/jobs (docs/server.md): uploads
 *                            and jobs under DIR; a job trains a LoRA adapter on a served model
 *                            and the server then serves it as the job's fine_tuned_model
 *   --fine-tuning-threads N  cores a training job uses [1]
 *   --fine-tuning-max-file-mb N  the largest upload, in MiB [64]
 *   --fine-tuning-seq-length N   the jobs' training sequence length [512]
 *   --lora NAME=DIR          serve the PEFT adapter in DIR as NAME (repeatable, at most 64),
 *                            unmerged: a request names it in its `adapter` field (gRPC) or its
 *                            `model` field (HTTP); tp 1 on the CPU for now
 *   --max-loras K            adapters loaded at once at most, --lora ones included, in [0, 64]
 *                            [8, or the number of --lora when more]; LoadAdapter beyond it is
 *                            RESOURCE_EXHAUSTED; 0 = only the --lora ones, no run-time loads
 *   --max-lora-rank R        the largest adapter rank served (the scratch is sized for it)
 *                            [16, or the largest --lora rank when more]
 *   --default-adapter NAME   requests that name no adapter (gRPC `adapter` "", HTTP without
 *                            `model`) get the --lora adapter NAME; the base stays reachable by
 *                            the served model's id (the last component of --model) [none: the
 *                            base]; NAME must be a --lora one, and cannot be unloaded; with
 *                            several --model, the first's (refused after the second --model)
 *   --models-max N           models loaded at once at most [all]; the others load on demand,
 *                            unloading the least recently used idle one (docs/server.md)
 *   --sleep-idle-seconds S   unload a model no request used for S seconds; reloaded on use
 * Under mpirun, rank 0 serves and every other rank replays its conductor's step plans
 * (engine_run_worker). Not here: the server (server/), the engine (engine/serving/).
 * Tests: tests/server/test_server.py, tests/test_serve_mpi.sh, tests/server/test_gguf_lora.py
 * (--default-adapter). */
#include "commands.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "engine.h"
#include "journal.h"
#include "ops.h"
#include "parallel.h"
#include "server.h"
#include "spec_corpus.h"

static int usage(const char *fmt, const char *arg)
{
    fprintf(stderr, "shardlm serve: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nusage: shardlm serve --model DIR|FILE.gguf [--listen 127.0.0.1:50051] [--device cpu|cuda] [--threads N]\n"
                    "         [--dp D --tp T --ep E --pp P (under mpirun -n DxTxP, DxExTxP)] [--pp-layers N1,N2,...] [--pp-microbatches M]\n"
                    "         [--rank-timeout S (60)]\n"
                    "         [--max-batch-tokens N] [--max-seqs N] [--max-queue N] [--kv-cache-mem BYTES]\n"
                    "         [--kv-cache-fraction F]\n"
                    "         [--kv-cache-blocks N] [--block-tokens N] [--no-prefix-caching] [--prefix-cache-per-key]\n"
                    "         [--verify-prefix-cache F] [--batch-invariant]\n"
                    "         [--scheduling-policy fcfs|fair|priority]\n"
                    "         [--chat-template llama2|chatml|gemma|plain|FILE.jinja] [--reasoning-format auto|deepseek|none]\n"
                    "         [--api-key-file F] [--tls-cert F --tls-key F]\n"
                    "         [--drain-timeout S] [--send-timeout S (60)] [--max-message-bytes N] [--http HOST:PORT] [--http-max-connections N]\n"
                    "         [--http-max-connections-per-address N (3/4 of the above; 0 = no cap)] [--http-header-timeout S (10)]\n"
                    "         [--http-body-timeout S (60)] [--responses-store N (1024)]\n"
                    "         [--journal DIR [--journal-fsync accept|always|never] [--journal-retain S (600)]\n"
                    "          [--journal-end-delay S (10)] [--journal-detach-grace S (30)] [--journal-detach-max N (256)]\n"
                    "          [--journal-detach-max-per-key N (half the max with two or more API keys)]]\n"
                    "         [--fine-tuning DIR [--fine-tuning-threads N (1)] [--fine-tuning-max-file-mb N (64)]\n"
                    "          [--fine-tuning-seq-length N (512)]]\n"
                    "         [--lora NAME=DIR ...] [--max-loras K (8)] [--max-lora-rank R (16)]\n"
                    "         [--default-adapter NAME]\n"
                    "  --max-seqs N   samples (sequences) running at once [64]\n"
                    "  --batch-invariant  a request's tokens never depend on the batch around it, also with\n"
                    "                 block-quantized (GGUF) weights, at some prefill speed (docs/determinism.md)\n"
                    "  --speculative ngram [--spec-draft K (5)] [--spec-ngram N (3)] [--spec-ngram-min M (2)]\n"
                    "                 [--spec-max-batch B (4)]\n"
                    "                 prompt-lookup speculative decoding (greedy and sampled requests, the\n"
                    "                 output distribution unchanged): up to K drafted tokens per step, copied\n"
                    "                 from after the latest earlier match of the last N (down to M) tokens,\n"
                    "                 verified by the model, while at most B sequences run; the draft length\n"
                    "                 adapts to each sequence's acceptance (docs/speculative.md)\n"
                    "  [--speculative draft] --draft-model PATH  speculative decoding with a small draft model\n"
                    "                 instead (the same tokenizer as --model, refused otherwise; at tp / pp > 1\n"
                    "                 it runs on rank 0): --spec-draft tokens a step, verified by rejection sampling\n"
                    "  --speculative eagle --draft-model HEAD.safetensors  an EAGLE-1 head on the served model's\n"
                    "                 hidden states (tools/eagle_probe.py export; rotary decoders; at tp / pp > 1\n"
                    "                 on rank 0, with a whole copy of the embeddings and LM head)\n"
                    "  --spec-ngram N beside --draft-model  prompt lookup first (as above), the draft model or\n"
                    "                 head only where the last N (down to 2) tokens match nothing earlier\n"
                    "  --spec-token-map FILE  the draft's LM head cut to the token ids of FILE (a JSON array; tools/\n"
                    "                 draft_token_map.py): cheaper draft tokens, drafts only among those tokens\n"
                    "  --spec-p-min P  beside --draft-model: a step's drafts stop where the draft's best token has a\n"
                    "                 probability below P (llama.cpp's --draft-p-min; a request's\n"
                    "                 speculative_p_min overrides it) [0: off]\n"
                    "  --spec-corpus FILE[,FILE...] [--spec-corpus-min M (3)] [--spec-corpus-p-min P (0.5)]\n"
                    "                 beside --speculative: drafts from the model turns of FILE (read as shardlm\n"
                    "                 train reads data: its own earlier answers, tools/distill_data.py) where\n"
                    "                 prompt lookup finds nothing, before a draft model: the continuation most\n"
                    "                 occurrences of the last M or more tokens share, while that share stays >= P\n"
                    "  --spec-corpus-learn N  beside --speculative: each answer served joins that corpus (with\n"
                    "                 --spec-corpus FILE or alone), the oldest learned forgotten beyond N tokens\n"
                    "                 (1000000: 8 MB); what one client's answers taught speeds others' requests\n"
                    "  --spec-corpus-keep FILE  beside --spec-corpus-learn: the learned texts are read from FILE at\n"
                    "                 start (when it is there) and written back at shutdown and once a minute\n"
                    "  --max-queue N  samples waiting for admission at most [1024]; a request of n samples takes n\n"
                    "                 places (refused with RESOURCE_EXHAUSTED when they do not fit), and n > N is invalid\n"
                    "  --lora NAME=DIR          serve the PEFT adapter in DIR unmerged as NAME; a request picks it by\n"
                    "                           name (gRPC `adapter`, HTTP `model`)\n"
                    "  --default-adapter NAME   requests that name no adapter get the --lora adapter NAME (it cannot\n"
                    "                           be unloaded); the base model stays reachable by the served model's id\n"
                    "                           (the last component of --model, GetModelInfo.model_id)\n"
                    "  --model DIR2 [--lora ...] ...  more models in one server (at most 16): a request picks one\n"
                    "                           by its id or an adapter's name (HTTP `model`, gRPC `adapter`);\n"
                    "                           a --lora belongs to the --model before it; not with --tp / --pp /\n"
                    "                           --dp / --ep, --journal or --draft-model\n"
                    "  --models-max N           models loaded at once at most, in [1, 16] [all]: the others load\n"
                    "                           when a request names one, unloading the least recently used model\n"
                    "                           that has no request running (none: 503 / UNAVAILABLE)\n"
                    "  --sleep-idle-seconds S   unload a model no request used for S seconds (weights and KV cache\n"
                    "                           freed); the next request that names it loads it again\n");
    return EXIT_USAGE;
}

#define SERVE_MAX_ADAPTERS 64
#define ADAPTER_NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

/* v as a number in [0, hi], or (0, hi] when lo_open, into *out; -1 (out untouched) otherwise. */
static int number_in(const char *v, int lo_open, double hi, double *out)
{
    char *end;
    const double d = strtod(v, &end);
    if (end == v || *end || !isfinite(d) || d < 0 || (lo_open && d == 0) || d > hi) return -1;
    *out = d;
    return 0;
}

/* Bytes with an optional K, M or G suffix (powers of 1024). */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || s[0] == '-') return -1;
    unsigned long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end || v > (unsigned long long)SIZE_MAX / mul) return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* A worker rank of a multi-rank server: no gRPC, only the model shard. Signals are the
 * conductor's business (mpirun delivers them to every rank): rank 0 drains, then tells the
 * workers to stop. */
static enum status serve_worker(const struct engine_options *eo)
{
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    struct engine *e = NULL;
    enum status st = engine_create(eo, &e);
    if (st == STATUS_OK) st = engine_run_worker(e);
    engine_free(e);
    return st;
}

int serve_main(int argc, char **argv)
{
    struct server_options o = {.listen = "127.0.0.1:50051", .engine = engine_options_default(), .drain_timeout_s = 30.0, .send_timeout_s = 60.0, .journal_end_delay_s = 10.0,
                               .journal_detach_grace_s = 30.0,
                               .max_receive_bytes = 4 << 20};
    o.engine.rank_timeout_s = 60.0; /* multi-rank: a peer silent this long is hung or gone */
    const char *device = "cpu";
    long tp = 1, pp = 1, dp = 0, ep = 1;
    char names[SERVE_MAX_ADAPTERS][65];
    const char *adapter_names[SERVE_MAX_ADAPTERS], *adapter_dirs[SERVE_MAX_ADAPTERS];
    int adapter_model[SERVE_MAX_ADAPTERS]; /* the --model each --lora follows (0: the first) */
    int n_adapters = 0;
    const char *model_dirs[SERVER_MAX_MODELS];
    int n_models = 0;
    long max_loras = -1;
    int prompt_lookup = 0; /* --speculative ngram given */
    int p_min_given = 0;   /* --spec-p-min given: needs --draft-model */
    int ngram_given = 0;   /* --spec-ngram given: prompt lookup, or lookup first beside --draft-model */
    int draft_mode = 0;    /* --speculative draft given: --draft-model is required */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        if (!strcmp(a, "--no-prefix-caching")) {
            o.engine.prefix_caching = 0;
            continue;
        }
        if (!strcmp(a, "--prefix-cache-per-key")) {
            o.engine.prefix_cache_per_owner = 1;
            continue;
        }
        if (!strcmp(a, "--batch-invariant")) { /* read by backend_open (ops.h), on every rank */
            if (setenv("SHARDLM_BATCH_INVARIANT", "1", 1) != 0) return usage("%s", "--batch-invariant: setenv failed");
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage("%s", "help"), 0;
        if (!v) return usage("%s needs a value", a);
        i++;
        if (!strcmp(a, "--model")) {
            if (n_models == SERVER_MAX_MODELS) return usage("--model: at most 16 models%s", "");
            model_dirs[n_models++] = v;
        }
        else if (!strcmp(a, "--listen")) o.listen = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--pp-layers")) o.engine.pp_layers = v;
        else if (!strcmp(a, "--pp-microbatches")) {
            if (base_parse_long(v, 1, 4096, &n)) return usage("--pp-microbatches must be an integer in [1, 4096], got '%s'", v);
            o.engine.pp_microbatches = (int)n;
        }
        else if (!strcmp(a, "--rank-timeout")) {
            if (number_in(v, 0, 86400, &o.engine.rank_timeout_s))
                return usage("--rank-timeout must be a number of seconds in [0, 86400], got '%s'", v);
        } else if (!strcmp(a, "--tp")) {
            if (base_parse_long(v, 1, 1024, &n)) return usage("--tp must be an integer in [1, 1024], got '%s'", v);
            tp = n;
        } else if (!strcmp(a, "--dp")) {
            if (base_parse_long(v, 1, 1024, &n)) return usage("--dp must be an integer in [1, 1024], got '%s'", v);
            dp = n;
        } else if (!strcmp(a, "--pp")) {
            if (base_parse_long(v, 1, 1024, &n)) return usage("--pp must be an integer in [1, 1024], got '%s'", v);
            pp = n;
        }
        else if (!strcmp(a, "--threads")) {
            if (base_parse_long(v, 0, 1024, &n)) return usage("--threads must be an integer in [0, 1024], got '%s'", v);
            o.engine.n_threads = (int)n;
        } else if (!strcmp(a, "--max-batch-tokens")) {
            if (base_parse_long(v, 1, 1 << 20, &n)) return usage("--max-batch-tokens must be an integer in [1, 1048576], got '%s'", v);
            o.engine.max_batch_tokens = (int)n;
        } else if (!strcmp(a, "--max-seqs")) {
            if (base_parse_long(v, 1, 4096, &n)) return usage("--max-seqs must be an integer in [1, 4096], got '%s'", v);
            o.engine.max_seqs = (int)n;
        } else if (!strcmp(a, "--speculative")) {
            if (strcmp(v, "ngram") && strcmp(v, "draft") && strcmp(v, "eagle"))
                return usage("--speculative must be ngram (prompt lookup), draft or eagle (with --draft-model), got '%s'",
                             v);
            if (!o.engine.spec_draft) o.engine.spec_draft = 5;
            if (!strcmp(v, "ngram")) prompt_lookup = 1;
            else draft_mode = 1;
            o.engine.draft_eagle = !strcmp(v, "eagle");
        } else if (!strcmp(a, "--draft-model")) {
            o.engine.draft_model_dir = v;
            if (!o.engine.spec_draft) o.engine.spec_draft = 5;
        } else if (!strcmp(a, "--spec-token-map")) {
            o.engine.draft_token_map = v;
        } else if (!strcmp(a, "--spec-draft")) {
            if (base_parse_long(v, 1, 32, &n)) return usage("--spec-draft must be an integer in [1, 32], got '%s'", v);
            o.engine.spec_draft = (int)n;
        } else if (!strcmp(a, "--spec-max-batch")) {
            if (base_parse_long(v, 1, 4096, &n)) return usage("--spec-max-batch must be an integer in [1, 4096], got '%s'", v);
            o.engine.spec_max_batch = (int)n;
        } else if (!strcmp(a, "--spec-ngram")) {
            if (base_parse_long(v, 2, 16, &n)) return usage("--spec-ngram must be an integer in [2, 16], got '%s'", v);
            o.engine.spec_ngram = (int)n;
            ngram_given = 1;
        } else if (!strcmp(a, "--spec-ngram-min")) {
            if (base_parse_long(v, 1, 16, &n)) return usage("--spec-ngram-min must be an integer in [1, 16], got '%s'", v);
            o.engine.spec_ngram_min = (int)n;
        } else if (!strcmp(a, "--spec-p-min")) {
            double p_min;
            if (number_in(v, 0, 1, &p_min)) return usage("--spec-p-min must be a number in [0, 1], got '%s'", v);
            o.engine.spec_p_min = (float)p_min;
            p_min_given = 1;
        } else if (!strcmp(a, "--spec-corpus")) {
            o.spec_corpus = v;
        } else if (!strcmp(a, "--spec-corpus-learn")) {
            if (base_parse_long(v, 0, SPEC_LEARN_MAX, &n))
                return usage("--spec-corpus-learn must be a count of tokens in [0 (off), 268435456], got '%s'", v);
            o.engine.spec_corpus_learn = n;
        } else if (!strcmp(a, "--spec-corpus-keep")) {
            o.engine.spec_corpus_keep = v;
        } else if (!strcmp(a, "--spec-corpus-min")) {
            if (base_parse_long(v, 1, SPEC_CORPUS_MAX_MATCH, &n))
                return usage("--spec-corpus-min must be an integer in [1, 32], got '%s'", v);
            o.engine.spec_corpus_min = (int)n;
        } else if (!strcmp(a, "--spec-corpus-p-min")) {
            double p_min;
            if (number_in(v, 1, 1, &p_min))
                return usage("--spec-corpus-p-min must be a number in (0, 1], got '%s'", v);
            o.engine.spec_corpus_p_min = (float)p_min;
        } else if (!strcmp(a, "--verify-prefix-cache")) {
            if (number_in(v, 0, 1, &o.engine.verify_prefix_cache))
                return usage("--verify-prefix-cache must be a fraction in [0, 1], got '%s'", v);
        } else if (!strcmp(a, "--max-queue")) {
            if (base_parse_long(v, 1, 1 << 20, &n)) return usage("--max-queue must be an integer in [1, 1048576], got '%s'", v);
            o.engine.max_queue = (int)n;
        } else if (!strcmp(a, "--scheduling-policy")) {
            if (!strcmp(v, "fcfs")) o.engine.scheduling = SCHEDULING_FCFS;
            else if (!strcmp(v, "fair")) o.engine.scheduling = SCHEDULING_FAIR;
            else if (!strcmp(v, "priority")) o.engine.scheduling = SCHEDULING_PRIORITY;
            else return usage("--scheduling-policy must be fcfs, fair or priority, got '%s'", v);
        } else if (!strcmp(a, "--block-tokens")) {
            if (base_parse_long(v, 1, 1024, &n)) return usage("--block-tokens must be an integer in [1, 1024], got '%s'", v);
            o.engine.block_tokens = (int)n;
        } else if (!strcmp(a, "--kv-cache-mem")) {
            if (parse_bytes(v, &o.engine.kv_cache_bytes) || !o.engine.kv_cache_bytes)
                return usage("--kv-cache-mem must be a positive byte count (suffix K, M or G allowed), got '%s'", v);
        } else if (!strcmp(a, "--kv-cache-fraction")) {
            if (number_in(v, 1, 0.95, &o.engine.kv_cache_fraction))
                return usage("--kv-cache-fraction must be a number in (0, 0.95], got '%s'", v);
        } else if (!strcmp(a, "--kv-cache-blocks")) {
            if (base_parse_long(v, 1, INT_MAX, &n)) return usage("--kv-cache-blocks must be a positive integer, got '%s'", v);
            o.engine.kv_cache_blocks = (int)n;
        } else if (!strcmp(a, "--chat-template")) {
            enum chat_template_kind kind;
            const char *file;
            if (chat_template_option(v, &kind, &file) != STATUS_OK)
                return usage("--chat-template must be llama2, chatml, gemma, plain or a FILE.jinja, got '%s'", v);
            o.chat_template = v;
        } else if (!strcmp(a, "--reasoning-format")) {
            if (strcmp(v, "auto") && strcmp(v, "deepseek") && strcmp(v, "none"))
                return usage("--reasoning-format must be auto, deepseek or none, got '%s'", v);
            o.reasoning_format = v;
        } else if (!strcmp(a, "--http")) o.http_listen = v;
        else if (!strcmp(a, "--journal")) o.journal_dir = v;
        else if (!strcmp(a, "--fine-tuning")) o.finetune_dir = v;
        else if (!strcmp(a, "--fine-tuning-threads")) {
            if (base_parse_long(v, 1, 1024, &n)) return usage("--fine-tuning-threads must be an integer in [1, 1024], got '%s'", v);
            o.finetune_threads = (int)n;
        } else if (!strcmp(a, "--fine-tuning-max-file-mb")) {
            if (base_parse_long(v, 1, 4096, &n)) return usage("--fine-tuning-max-file-mb must be an integer in [1, 4096], got '%s'", v);
            o.finetune_max_file_mb = (int)n;
        } else if (!strcmp(a, "--fine-tuning-seq-length")) {
            if (base_parse_long(v, 8, 1 << 20, &n)) return usage("--fine-tuning-seq-length must be an integer in [8, 1048576], got '%s'", v);
            o.finetune_seq_length = (int)n;
        }
        else if (!strcmp(a, "--journal-fsync")) {
            enum journal_fsync f;
            if (journal_fsync_parse(v, &f) != STATUS_OK) return usage("%s", status_message());
            o.journal_fsync = (int)f;
        } else if (!strcmp(a, "--journal-retain")) {
            if (number_in(v, 1, 30 * 86400.0, &o.journal_retain_s))
                return usage("--journal-retain must be a number of seconds in (0, 2592000], got '%s'", v);
        } else if (!strcmp(a, "--journal-end-delay")) {
            if (number_in(v, 0, 3600.0, &o.journal_end_delay_s))
                return usage("--journal-end-delay must be a number of seconds in [0, 3600], got '%s'", v);
        } else if (!strcmp(a, "--journal-detach-grace")) {
            if (number_in(v, 0, 86400.0, &o.journal_detach_grace_s))
                return usage("--journal-detach-grace must be a number of seconds in [0, 86400], got '%s'", v);
        } else if (!strcmp(a, "--journal-detach-max")) {
            if (base_parse_long(v, 1, 1 << 20, &n))
                return usage("--journal-detach-max must be an integer in [1, 1048576], got '%s'", v);
            o.journal_detach_max = (int)n;
        } else if (!strcmp(a, "--journal-detach-max-per-key")) {
            if (base_parse_long(v, 1, 1 << 20, &n))
                return usage("--journal-detach-max-per-key must be an integer in [1, 1048576], got '%s'", v);
            o.journal_detach_max_per_key = (int)n;
        }
        else if (!strcmp(a, "--http-max-connections")) {
            if (base_parse_long(v, 1, 65536, &n)) return usage("--http-max-connections must be an integer in [1, 65536], got '%s'", v);
            o.http_max_connections = (int)n;
        } else if (!strcmp(a, "--responses-store")) {
            if (base_parse_long(v, 1, 1 << 20, &n)) return usage("--responses-store must be an integer in [1, 1048576], got '%s'", v);
            o.http_responses_store = (int)n;
        } else if (!strcmp(a, "--http-max-connections-per-address")) {
            if (base_parse_long(v, 0, 65536, &n))
                return usage("--http-max-connections-per-address must be an integer in [0, 65536], got '%s'", v);
            o.http_max_per_address = n ? (int)n : -1;
        } else if (!strcmp(a, "--http-header-timeout") || !strcmp(a, "--http-body-timeout")) {
            const int header = !strcmp(a, "--http-header-timeout");
            if (number_in(v, 1, 86400, header ? &o.http_header_timeout_s : &o.http_body_timeout_s))
                return usage(header ? "--http-header-timeout must be a number of seconds in (0, 86400], got '%s'"
                                    : "--http-body-timeout must be a number of seconds in (0, 86400], got '%s'",
                             v);
        } else if (!strcmp(a, "--api-key-file")) o.api_key_file = v;
        else if (!strcmp(a, "--tls-cert")) o.tls_cert = v;
        else if (!strcmp(a, "--tls-key")) o.tls_key = v;
        else if (!strcmp(a, "--drain-timeout")) {
            if (number_in(v, 0, 86400, &o.drain_timeout_s))
                return usage("--drain-timeout must be a number of seconds in [0, 86400], got '%s'", v);
        } else if (!strcmp(a, "--send-timeout")) {
            if (number_in(v, 0, 86400, &o.send_timeout_s))
                return usage("--send-timeout must be a number of seconds in [0, 86400], got '%s'", v);
        } else if (!strcmp(a, "--max-message-bytes")) {
            if (base_parse_long(v, 1024, INT_MAX, &n)) return usage("--max-message-bytes must be an integer >= 1024, got '%s'", v);
            o.max_receive_bytes = (int)n;
        } else if (!strcmp(a, "--lora")) {
            if (n_adapters == SERVE_MAX_ADAPTERS) return usage("--lora: at most 64 adapters%s", "");
            const char *eq = strchr(v, '=');
            size_t len = eq ? (size_t)(eq - v) : 0;
            if (!eq || len == 0 || len > 64 || !eq[1] || strspn(v, ADAPTER_NAME_CHARS) < len)
                return usage("--lora must be NAME=DIR with a NAME of 1-64 letters, digits, '.', '_' or '-', got '%s'", v);
            snprintf(names[n_adapters], sizeof names[n_adapters], "%.*s", (int)len, v);
            adapter_model[n_adapters] = n_models > 0 ? n_models - 1 : 0;
            adapter_names[n_adapters] = names[n_adapters];
            adapter_dirs[n_adapters++] = eq + 1;
        } else if (!strcmp(a, "--max-loras")) {
            if (base_parse_long(v, 0, SERVE_MAX_ADAPTERS, &n)) return usage("--max-loras must be an integer in [0, 64], got '%s'", v);
            max_loras = n;
        } else if (!strcmp(a, "--default-adapter")) {
            if (!*v) return usage("--default-adapter needs an adapter's NAME%s", "");
            /* Requests that name no model go to the first: only its default can apply. */
            if (n_models > 1)
                return usage("--default-adapter is the first --model's (requests that name no model get it): give "
                             "it before the second --model, got it after --model %s", model_dirs[n_models - 1]);
            o.default_adapter = v;
        } else if (!strcmp(a, "--max-lora-rank")) {
            if (base_parse_long(v, 1, 4096, &n)) return usage("--max-lora-rank must be an integer in [1, 4096], got '%s'", v);
            o.engine.max_lora_rank = (int)n;
        } else if (!strcmp(a, "--models-max")) {
            if (base_parse_long(v, 1, SERVER_MAX_MODELS, &n))
                return usage("--models-max must be an integer in [1, 16] (models loaded at once), got '%s'", v);
            o.models_max = (int)n;
        } else if (!strcmp(a, "--sleep-idle-seconds")) {
            if (number_in(v, 1, 30 * 86400.0, &o.sleep_idle_s))
                return usage("--sleep-idle-seconds must be a number of seconds in (0, 2592000], got '%s'", v);
        } else if (!strcmp(a, "--ep")) {
            if (base_parse_long(v, 1, 64, &n)) return usage("--ep must be an integer in [1, 64], got '%s'", v);
            ep = n;
        } else return usage("unknown option '%s'", a);
    }
    if (draft_mode && !o.engine.draft_model_dir)
        return usage("--speculative %s needs --draft-model PATH", o.engine.draft_eagle ? "eagle" : "draft");
    if (o.engine.draft_token_map && !o.engine.draft_model_dir)
        return usage("--spec-token-map needs --draft-model PATH (it cuts the draft's head)%s", "");
    if (o.engine.spec_ngram_min && !prompt_lookup && !ngram_given)
        return usage("--spec-ngram-min needs prompt lookup (--speculative ngram, or --spec-ngram beside --draft-model)%s",
                     "");
    if (o.engine.spec_ngram_min && o.engine.spec_ngram_min > (o.engine.spec_ngram ? o.engine.spec_ngram : 3)) {
        char why[96];
        snprintf(why, sizeof why, "%d is above --spec-ngram %d", o.engine.spec_ngram_min,
                 o.engine.spec_ngram ? o.engine.spec_ngram : 3);
        return usage("--spec-ngram-min %s", why);
    }
    if (p_min_given && !o.engine.draft_model_dir)
        return usage("--spec-p-min needs --draft-model PATH (prompt lookup's drafts have no probability)%s", "");
    if (prompt_lookup && o.engine.draft_model_dir)
        return usage("--draft-model cannot be combined with --speculative ngram (give --speculative draft or eagle "
                     "with --spec-ngram N for prompt lookup first and the draft where nothing matches)%s", "");
    o.engine.spec_lookup_first = ngram_given && o.engine.draft_model_dir;
    if (ngram_given && !o.engine.spec_draft) o.engine.spec_draft = 5; /* --spec-ngram alone: prompt lookup */
    if ((o.engine.spec_corpus_min || o.engine.spec_corpus_p_min > 0) && !o.spec_corpus && !o.engine.spec_corpus_learn)
        return usage("--spec-corpus-min and --spec-corpus-p-min need --spec-corpus FILE or --spec-corpus-learn N%s", "");
    if (o.engine.prefix_cache_per_owner && !o.api_key_file)
        return usage("--prefix-cache-per-key needs --api-key-file F (without keys every request has one owner)%s", "");
    if (o.engine.prefix_cache_per_owner && !o.engine.prefix_caching)
        return usage("--prefix-cache-per-key and --no-prefix-caching: choose one%s", "");
    if (o.spec_corpus && !o.engine.spec_draft)
        return usage("--spec-corpus needs speculation on (--speculative ngram, or a --draft-model)%s", "");
    if (o.engine.spec_corpus_keep && !o.engine.spec_corpus_learn)
        return usage("--spec-corpus-keep FILE needs --spec-corpus-learn N (it keeps what the corpus learned)%s", "");
    if (o.engine.spec_corpus_keep && dp > 1)
        return usage("--spec-corpus-keep FILE serves one replica (each would write the file), not --dp > 1%s", "");
    if (o.engine.spec_corpus_learn && !o.engine.spec_draft)
        return usage("--spec-corpus-learn needs speculation on (--speculative ngram, or a --draft-model)%s", "");
    if (!n_models) return usage("--model DIR is required%s", "");
    /* Each model's adapters, grouped: the first model's go to engine, the others' to their spec. */
    const char *by_names[SERVE_MAX_ADAPTERS], *by_dirs[SERVE_MAX_ADAPTERS];
    struct server_model_spec more[SERVER_MAX_MODELS];
    int per_model[SERVER_MAX_MODELS] = {0}, k = 0;
    for (int mi = 0; mi < n_models; mi++)
        for (int j = 0; j < n_adapters; j++)
            if (adapter_model[j] == mi) by_names[k] = adapter_names[j], by_dirs[k++] = adapter_dirs[j], per_model[mi]++;
    for (int mi = 0, first = 0; mi < n_models; first += per_model[mi++]) {
        if (max_loras > 0 && max_loras < per_model[mi])
            return usage("--max-loras is smaller than the number of --lora adapters of --model %s", model_dirs[mi]);
        /* Room for run-time loads by default; --max-loras 0 keeps only the --lora ones. */
        int ml = max_loras >= 0 ? (max_loras > per_model[mi] ? (int)max_loras : per_model[mi])
                                : (per_model[mi] > 8 ? per_model[mi] : 8);
        if (mi == 0) {
            o.engine.model_dir = model_dirs[0];
            o.engine.max_loras = ml;
            o.engine.adapter_names = by_names;
            o.engine.adapter_dirs = by_dirs;
            o.engine.n_adapters = per_model[0];
        } else {
            more[mi - 1] = (struct server_model_spec){model_dirs[mi], by_names + first, by_dirs + first,
                                                       per_model[mi], ml};
        }
    }
    o.more_models = more;
    o.n_more_models = n_models > 1 ? n_models - 1 : 0;
    if (n_models > 1 && o.journal_dir)
        return usage("--journal with several --model is not supported (a journaled request names no model to "
                     "resume it on)%s", "");
    if (n_models > 1 && o.engine.draft_model_dir)
        return usage("--draft-model with several --model is not supported (a draft model serves one target)%s", "");
    if (n_models > 1 && (tp > 1 || pp > 1 || dp > 1 || ep > 1))
        return usage("several --model with --tp / --pp / --dp / --ep is not supported (one model per set of "
                     "ranks)%s", "");
    const long ep_tp = ep > 1 ? tp : 1; /* --ep E --tp T: attention tensor-parallel inside the ep group */
    if (ep > 1) tp = ep * tp; /* the ep group takes the layout's tp place (engine/model/moe_ep.c) */
    if (!o.tls_cert != !o.tls_key) return usage("--tls-cert and --tls-key go together%s", "");
    if (o.finetune_dir && !o.http_listen) return usage("--fine-tuning serves /v1/fine_tuning/jobs on the HTTP front: it needs --http%s", "");
    if (o.finetune_dir && (tp > 1 || pp > 1 || dp > 1 || ep > 1))
        return usage("--fine-tuning is not supported with --tp / --pp / --dp / --ep (a job trains in the serving process)%s", "");
    if ((o.models_max || o.sleep_idle_s > 0) && o.journal_dir)
        return usage("--models-max and --sleep-idle-seconds are not supported with --journal (a resumed request "
                     "needs its model loaded)%s", "");
    if ((o.models_max || o.sleep_idle_s > 0) && (tp > 1 || pp > 1 || dp > 1 || ep > 1))
        return usage("--models-max and --sleep-idle-seconds are not supported with --tp / --pp / --dp / --ep (the "
                     "other ranks cannot unload and load with rank 0)%s", "");
    enum device dev;
    enum status st = backend_parse_device(device, &dev);
    struct parallel_world *world = NULL;
    if (st == STATUS_OK) {
        /* Under mpirun: rank 0 serves and conducts; every other rank replays its step plans.
         * Without mpirun this is a world of one and MPI is never initialised. */
        st = parallel_init(NULL, NULL, &world);
        long want = (dp ? dp : 1) * tp * pp;
        char lanes[64]; /* the group's flags as given */
        if (ep > 1 && ep_tp > 1) snprintf(lanes, sizeof lanes, "--ep %ld x --tp %ld", ep, ep_tp);
        else snprintf(lanes, sizeof lanes, "%s %ld", ep > 1 ? "--ep" : "--tp", tp);
        if (st == STATUS_OK && (dp ? world->size != want : world->size % (tp * pp) != 0))
            st = status_errorf(STATUS_INVALID_ARGUMENT,
                               "%d ranks but --dp %ld x %s x --pp %ld = %ld: serving needs exactly dp x %s x pp "
                               "ranks (launch with mpirun -n %ld)",
                               world->size, dp ? dp : 1, lanes, pp, want, ep > 1 ? (ep_tp > 1 ? "ep x tp" : "ep") : "tp",
                               want);
        if (st == STATUS_OK && world->size > 1 && n_models > 1)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "several --model under mpirun (%d ranks) is not supported: "
                               "one model per set of ranks", world->size);
        if (st == STATUS_OK && world->size > 1) {
            o.engine.world = world;
            o.engine.tp = (int)tp;
            o.engine.ep_group = ep > 1;
            o.engine.ep_tp = (int)ep_tp;
            o.engine.pp = (int)pp;
            o.engine.dp = (int)dp;
        }
    }
    if (st == STATUS_OK) {
        o.engine.device = (int)dev;
        if (world && world->rank != 0) st = serve_worker(&o.engine);
        else st = server_run(&o);
    }
    parallel_finalize(world);
    if (st != STATUS_OK) {
        fprintf(stderr, "shardlm: error: %s: %s\n", status_name(st), status_message());
        return 1;
    }
    return 0;
}
