/* cli/reshard.c - `shardlm reshard`: write any checkpoint again in the Megatron-style sharded
 * layout at a chosen tp x pp, or in the Hugging Face layout.
 * Not here: the writers (engine/formats/checkpoint_write.c).
 * Tests: tests/test_cli.sh. */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "checkpoint.h"

/* Writes the Megatron-style sharded layout of any checkpoint (any checkpoint already loads at any
 * tp/pp without this; it is for shipping pre-split shards). */
int reshard_main(int argc, char **argv)
{
    const char *src = NULL, *out = NULL, *format = "megatron";
    long tp = 1, pp = 1;
    for (int i = 0; i < argc; i += 2) {
        if (i + 1 >= argc) return cli_usage("reshard: %s needs a value", argv[i]);
        const char *v = argv[i + 1];
        if (!strcmp(argv[i], "--model")) src = v;
        else if (!strcmp(argv[i], "--out")) out = v;
        else if (!strcmp(argv[i], "--format")) format = v;
        else if (!strcmp(argv[i], "--tp")) { if (base_parse_long(v, 1, 1024, &tp)) return cli_usage("--tp must be an integer in [1, 1024], got '%s'", v); }
        else if (!strcmp(argv[i], "--pp")) { if (base_parse_long(v, 1, 1024, &pp)) return cli_usage("--pp must be an integer in [1, 1024], got '%s'", v); }
        else return cli_usage("reshard: unknown option '%s'", argv[i]);
    }
    if (!src || !out) return cli_usage("reshard needs --model and --out%s", "");
    int hf = !strcmp(format, "hf");
    if (!hf && strcmp(format, "megatron")) return cli_usage("--format must be megatron or hf, got '%s'", format);
    if (hf && (tp != 1 || pp != 1)) return cli_usage("--format hf writes one unsharded file: no --tp/--pp%s", "");
    struct checkpoint *ck = NULL;
    enum status st = checkpoint_open(src, &ck);
    if (st == STATUS_OK) st = hf ? checkpoint_write_hf(out, ck) : checkpoint_write_megatron(out, ck, (int)tp, (int)pp);
    checkpoint_close(ck);
    if (st != STATUS_OK) return cli_fail(st);
    if (hf) fprintf(stderr, "shardlm: wrote %s (Hugging Face layout)\n", out);
    else fprintf(stderr, "shardlm: wrote %s (Megatron-style layout, tp %ld, pp %ld)\n", out, tp, pp);
    return 0;
}

