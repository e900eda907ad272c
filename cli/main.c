/* cli/main.c - the shardlm command: prints the help and dispatches each subcommand to its
 * file in cli/ (one file per subcommand, entry points in commands.h):
 *   shardlm serve --model DIR|FILE.gguf [--listen ADDR] [options]  the gRPC server (serve.c)
 *   shardlm chat|complete|bench|stats|adapters --server ADDR ...  gRPC clients (chat.c,
 *                                       complete.c, bench.c, stats.c, adapters.c over clients/)
 *   shardlm generate --model DIR|FILE.gguf [--prompt TEXT] [options]  generate locally (generate.c)
 *   shardlm convert llama2c|gguf ...                         (convert.c)
 *   shardlm reshard --model DIR --out DIR [...]              (reshard.c)
 *   shardlm train --model DIR --data FILE --out DIR [...]    fine-tuning (train.c)
 *   shardlm version
 * Errors from below arrive as an enum status with a message; the subcommands print them
 * (cli_fail) and turn them into a non-zero exit code. Only cli/ chooses exit codes.
 * Not here: any subcommand's flags or work (their files above).
 * Tests: tests/test_cli.sh (through ctest), tests/test_client.sh. */
#include "commands.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"

int cli_fail(enum status st)
{
    fprintf(stderr, "shardlm: error: %s: %s\n", status_name(st), status_message());
    return 1;
}

int cli_usage(const char *fmt, const char *arg)
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
            "  shardlm serve --model DIR|FILE.gguf [--listen 127.0.0.1:50051] [--device cpu|cuda]\n"
            "                [--dp D --tp T --ep E --pp P] [engine limits, TLS, API keys: shardlm serve --help, docs/server.md]\n"
            "  shardlm chat --server ADDR [--system TEXT]       interactive streamed chat\n"
            "  shardlm complete --server ADDR --prompt TEXT     one completion\n"
            "  shardlm bench --server ADDR --concurrency N --requests M\n"
            "  shardlm stats --server ADDR                      model, load, replicas\n"
            "  shardlm route --replica ADDR --replica ADDR ...  one HTTP address over separate serve jobs\n"
            "  shardlm adapters list|load NAME PATH|unload NAME --server ADDR   LoRA adapters at run time\n"
            "  shardlm generate --model DIR|FILE.gguf [--prompt TEXT] [--max-tokens N] [--temperature T]\n"
            "                   [--top-k K] [--top-p P] [--min-p P] [--seed S] [--ignore-eos]\n"
            "                   [--device cpu|cuda] [--threads N] [--no-bos] [--tp T --ep E --pp P]\n"
            "                   [--pp-layers N1,N2,...] [--speculative ngram [--spec-ngram N] [--spec-ngram-min M] |\n"
            "                   --speculative draft|eagle --draft-model PATH [--spec-token-map FILE] [--spec-ngram N]\n"
            "                   [--spec-p-min P]]\n"
            "                   [--spec-draft K] [--spec-corpus FILE[,FILE...]] [--spec-corpus-min M]\n"
            "                   [--spec-corpus-p-min P] [--spec-corpus-learn N --spec-corpus-keep FILE]\n"
            "                   [--chat-template llama2|chatml|gemma|plain|FILE.jinja (--spec-corpus's chat files)]\n"
            "                   (docs/speculative.md)\n"
            "  shardlm convert llama2c --checkpoint FILE.bin --tokenizer FILE.model --out DIR\n"
            "  shardlm convert gguf --gguf FILE.gguf --out DIR [--dtype f32|bf16|f16] [--keep-blocks]\n"
            "  shardlm reshard --model DIR|FILE.gguf --out DIR [--tp T --pp P | --format hf]\n"
            "  shardlm train --model DIR --data FILE[,FILE] --out DIR [options: shardlm train --help]\n"
            "  shardlm merge-lora --model DIR --adapter DIR --out DIR   fold a LoRA adapter into the model\n"
            "  shardlm version\n"
            "\n"
            "generate prints the completion to stdout as it is produced and the prefill and\n"
            "decode speed to stderr. Defaults: --prompt \"\" (BOS only), --max-tokens 128,\n"
            "--temperature 0 (greedy), --device cpu. With --tp/--pp, run under mpirun with\n"
            "T x P ranks (e.g. mpirun -n 4 shardlm generate --tp 2 --pp 2 ...).\n");
}

/* The nanoseconds one turn of libgomp's wait loop takes (config/linux/wait.h do_spin: a relaxed
 * load, then cpu_relax, x86's PAUSE: 26 ns on the Zen 3 VM of 2026-12-01, some 40-50 on recent
 * Xeons, a few on older AMD cores): the fastest of eight timings of 2048 turns (about 0.5 ms in
 * all here; the fastest, as an interruption only lengthens one). */
static double spin_ns(void)
{
    static volatile int flag;
    double best = 0.0;
    for (int r = 0; r < 8; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int i = 0; i < 2048 && !flag; i++) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#else
            __asm__ volatile("" ::: "memory");
#endif
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / 2048.0;
        if (r == 0 || ns < best) best = ns;
    }
    return best;
}

/* Two thread pools read their settings once, in library constructors that run before main:
 * - libgomp's wait policy. Its default lets idle workers spin for a long while after every
 *   parallel region, which steals the core the next serial step needs as soon as anything else
 *   runs on the machine (another process, the gRPC threads): Gemma 3 270M decoding was measured
 *   at 4.5 tok/s that way and 25 tok/s with a short spin on the 2-core build machine. So unless
 *   the user chose a policy, a short spin: GOMP_SPINCOUNT=3000 was measured on an Intel Xeon VM
 *   (2026-11-25, idle, 2 threads: the stories110M shape at 59-60 tok/s against 55-56 with 1000
 *   (10000: 60), a served Gemma at 75 tok/s for 4 streams against 66-69; with one busy process
 *   beside it, 25.5 against 28 (10000: 19)). libgomp counts turns, not time, and a turn's length
 *   differs by CPU: 3000 turns are about 135 us there and 78 us on the Zen 3 VM, where the
 *   worker then slept through most gaps between a token's products (2026-12-01, Gemma 2-thread
 *   decode, medians of six alternating runs: 3000 turns 55-61 tok/s, 5200-30000 turns 61-68). So
 *   the count is now what lasts SPIN_US microseconds on this CPU (spin_ns), within [1000, 100000].
 * - OpenBLAS's own pthread pool. shardlm calls OpenBLAS single-threaded inside its OpenMP
 *   threads (kernels/cpu/matmul.c), yet the library starts one worker per core at load, and each
 *   spins in sched_yield for about 0.1 s before it sleeps: 38 % of perf's samples over six short
 *   stories260K runs (the worker's, not the main thread's). On the speed of a run the effect was
 *   within noise (2026-11-25, 1 and 2 threads). Unless the user set it, OPENBLAS_NUM_THREADS=1,
 *   so that no worker is started.
 * - OpenBLAS's kernels (the f32 products from 32 rows: prefill of f32 / bf16 models, training).
 *   Its DYNAMIC_ARCH build picks them by CPU model, and a release older than the CPU falls back
 *   to its oldest x86-64 kernels: Debian 12's 0.3.21 names an Emerald Rapids Xeon (family 6 model
 *   207, AVX-512) "Prescott" and ran its SSE3 sgemm (2026-12-02: `shardlm train` of a 4-layer
 *   SmolLM2 cut at 94-102 tok/s, 449 tok/s with OPENBLAS_CORETYPE=Cooperlake, the same losses).
 *   Unless the user set OPENBLAS_CORETYPE, when OpenBLAS chose kernels older than AVX2 on a CPU
 *   with AVX2 and FMA, OPENBLAS_CORETYPE names SkylakeX (AVX-512 with BW and VL) or Haswell.
 * When any is missing, shardlm sets it and runs itself again once (execv keeps the pid, so
 * mpirun and process supervisors see no difference). */
static void set_thread_pools(char **argv)
{
    int again = 0;
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : cpu_blas_better_core();
    if (core) {
        if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
        again = 1;
    }
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        enum { SPIN_US = 150 };
        const double ns = spin_ns();
        const double turns = ns > 0.0 ? SPIN_US * 1000.0 / ns : 100000.0;
        char count[24];
        snprintf(count, sizeof count, "%d", turns < 1000.0 ? 1000 : turns > 100000.0 ? 100000 : (int)turns);
        if (setenv("GOMP_SPINCOUNT", count, 1) != 0) return;
        again = 1;
    }
    if (!getenv("OPENBLAS_NUM_THREADS")) {
        if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0) return;
        again = 1;
    }
    if (!again) return;
    /* The resolved path, not /proc/self/exe, so that the process keeps its name in ps. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return;
    self[n] = 0;
    execv(self, argv); /* returns only on failure: keep the defaults */
}

int main(int argc, char **argv)
{
    set_thread_pools(argv);
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
    if (!strcmp(argv[1], "route")) return route_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "adapters")) return client_adapters_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "generate")) return generate_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "convert")) return convert_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "reshard")) return reshard_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "train")) return train_main(argc - 2, argv + 2);
    if (!strcmp(argv[1], "merge-lora")) return merge_lora_main(argc - 2, argv + 2);
    return cli_usage("unknown command '%s'", argv[1]);
}
