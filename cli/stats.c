/* cli/stats.c - `shardlm stats`: the served model (GetModelInfo) and the server's load
 * (GetServerStats) as "key: value" lines, one line per data-parallel replica.
 * Not here: the shared flags (client_flags.c), the calls (clients/). Exit codes and messages:
 * commands.h. Tests: tests/test_client.sh (against a real `shardlm serve`). */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "client_flags.h"

/* `shardlm stats`: GetModelInfo and GetServerStats as "key: value" lines, one line per
 * data-parallel replica (for operators and scripts). */
int client_stats_main(int argc, char **argv)
{
    const char *cmd = "stats";
    struct common_flags cf = {.server = DEFAULT_SERVER};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int used = 1, r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: shardlm stats [--server ADDR] [flags]\n"
                   "Prints the served model (GetModelInfo) and the server's load (GetServerStats),\n"
                   "with one line per data-parallel replica.\n"
                   "  --model NAME           on a server of several models, the one asked about (its id or an\n"
                   "                         adapter's name; default: the server's first)\n" COMMON_HELP);
            return 0;
        }
        if ((r = cli_parse_model(cmd, &cf, a, v)) != 0) {
            if (r < 0) return EXIT_USAGE;
            i++;
            continue;
        }
        if ((r = cli_parse_common(cmd, &cf, a, v, &used)) == 0) return cli_usage_error(cmd, "unknown flag '%s'", a);
        if (r < 0) return EXIT_USAGE;
        i += used;
    }
    struct client *c = NULL;
    struct client_model_info mi = {0};
    struct client_server_stats s;
    enum status st = cli_common_load(&cf);
    if (st == STATUS_OK) st = cli_open_client(&cf, 0, &c);
    if (st == STATUS_OK) st = client_model_info(c, &mi);
    if (st == STATUS_OK) st = client_server_stats(c, &s);
    if (st == STATUS_OK) {
        printf("model: %s, %d layers, d_model %d, vocab %d, context %d, %s on %s\n", mi.architecture, mi.n_layers,
               mi.d_model, mi.vocab_size, mi.context_length, mi.dtype, mi.device);
        printf("parallel: dp %d x tp %d x pp %d\n", mi.dp_size > 0 ? mi.dp_size : 1, mi.tp_size, mi.pp_size);
        printf("id: %s; adapters: %d loaded", mi.model_id, mi.n_adapters);
        for (int i = 0; i < mi.n_adapters; i++) printf("%s %s", i ? "," : ":", mi.adapters[i]);
        printf("; default: %s\n", *mi.default_adapter ? mi.default_adapter : "the base model");
        printf("requests: %d waiting, %d running, %llu submitted, %llu finished\n", s.waiting, s.running,
               (unsigned long long)s.requests_submitted, (unsigned long long)s.requests_finished);
        printf("tokens: %llu prompt, %llu generated, %llu from the prefix cache\n",
               (unsigned long long)s.prompt_tokens, (unsigned long long)s.generated_tokens,
               (unsigned long long)s.prefix_cache_hit_tokens);
        printf("kv: %d of %d blocks free, %d cached\n", s.kv_blocks_free, s.kv_blocks_total, s.kv_blocks_cached);
        if (s.spec_draft_tokens)
            printf("speculation: %llu draft tokens, %llu accepted (%.1f%%), %llu backoffs\n",
                   (unsigned long long)s.spec_draft_tokens, (unsigned long long)s.spec_accepted_tokens,
                   100.0 * (double)s.spec_accepted_tokens / (double)s.spec_draft_tokens,
                   (unsigned long long)s.spec_backoffs);
        if (s.spec_lookup_draft_tokens && s.spec_lookup_draft_tokens < s.spec_draft_tokens)
            printf("speculation, prompt lookup's share: %llu draft tokens, %llu accepted (%.1f%%)\n",
                   (unsigned long long)s.spec_lookup_draft_tokens, (unsigned long long)s.spec_lookup_accepted_tokens,
                   100.0 * (double)s.spec_lookup_accepted_tokens / (double)s.spec_lookup_draft_tokens);
        if (s.spec_corpus_draft_tokens)
            printf("speculation, the corpus's share: %llu draft tokens, %llu accepted (%.1f%%)\n",
                   (unsigned long long)s.spec_corpus_draft_tokens, (unsigned long long)s.spec_corpus_accepted_tokens,
                   100.0 * (double)s.spec_corpus_accepted_tokens / (double)s.spec_corpus_draft_tokens);
        if (s.spec_corpus_tokens) printf("speculative corpus: %llu tokens\n", (unsigned long long)s.spec_corpus_tokens);
        for (int i = 0; i < s.n_replicas; i++) {
            const struct client_replica_stats *r = &s.replicas[i];
            printf("replica %d: leader_rank %d routed %llu routed_by_prefix %llu outstanding %d finished %llu "
                   "generated %llu prefix_hit_tokens %llu kv_free %d/%d report_age_s %.2f\n",
                   i, r->leader_rank, (unsigned long long)r->routed, (unsigned long long)r->routed_by_prefix,
                   r->outstanding, (unsigned long long)r->requests_finished, (unsigned long long)r->generated_tokens,
                   (unsigned long long)r->prefix_cache_hit_tokens, r->kv_blocks_free, r->kv_blocks_total,
                   r->report_age_seconds);
        }
    }
    client_model_info_free(&mi);
    client_close(c);
    cli_common_free(&cf);
    return st == STATUS_OK ? 0 : cli_fail(st);
}
