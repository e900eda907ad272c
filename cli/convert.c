/* cli/convert.c - `shardlm convert llama2c|gguf`: write a checkpoint directory (config.json,
 * model.safetensors, tokenizer.model) from a llama2.c or GGUF file (its quantized matrices
 * dequantized, or kept as blocks with --keep-blocks).
 * Not here: the converters (engine/formats/llama2c.c, gguf_convert.c).
 * Tests: tests/test_cli.sh, tests/test_gguf.c, tests/test_keep_blocks.sh. */
#include "commands.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "gguf_convert.h"
#include "llama2c.h"
#include "tensor.h"

/* --keep-blocks: the quantized matrices as ggml blocks (gguf_convert.h); --dtype: the rest. */
static int cmd_convert_gguf(int argc, char **argv)
{
    const char *gguf = NULL, *out = NULL, *dt = "f32";
    int keep_blocks = 0;
    for (int i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "--keep-blocks")) {
            keep_blocks = 1;
            i--; /* a flag: no value */
            continue;
        }
        if (i + 1 >= argc) return cli_usage("convert: %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--gguf")) gguf = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dt = argv[i + 1];
        else return cli_usage("convert: unknown option '%s'", argv[i]);
    }
    if (!gguf || !out || (strcmp(dt, "f32") && strcmp(dt, "bf16") && strcmp(dt, "f16")))
        return cli_usage("convert gguf needs --gguf FILE --out DIR [--dtype f32|bf16|f16] [--keep-blocks]%s", "");
    enum status st = gguf_convert(gguf, out, !strcmp(dt, "bf16") ? DTYPE_BF16 : !strcmp(dt, "f16") ? DTYPE_F16 : DTYPE_F32,
                                  keep_blocks);
    if (st != STATUS_OK) return cli_fail(st);
    char tok[4096];
    snprintf(tok, sizeof tok, "%s/tokenizer.json", out);
    fprintf(stderr, "shardlm: wrote %s (config.json, model.safetensors%s, %s)\n", out,
            keep_blocks ? " with the quantized matrices as blocks" : "",
            access(tok, F_OK) == 0 ? "tokenizer.json" : "tokenizer.model");
    return 0;
}

int convert_main(int argc, char **argv)
{
    if (argc >= 1 && !strcmp(argv[0], "gguf")) return cmd_convert_gguf(argc, argv);
    if (argc < 1 || strcmp(argv[0], "llama2c"))
        return cli_usage("convert: the source format is 'llama2c' or 'gguf'%s", "");
    const char *ckpt = NULL, *tokenizer = NULL, *out = NULL;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) return cli_usage("convert: %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--checkpoint")) ckpt = argv[i + 1];
        else if (!strcmp(argv[i], "--tokenizer")) tokenizer = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else return cli_usage("convert: unknown option '%s'", argv[i]);
    }
    if (!ckpt || !tokenizer || !out)
        return cli_usage("convert llama2c needs --checkpoint, --tokenizer and --out%s", "");
    enum status st = llama2c_convert(ckpt, tokenizer, out);
    if (st != STATUS_OK) return cli_fail(st);
    fprintf(stderr, "shardlm: wrote %s (config.json, model.safetensors, tokenizer.model)\n", out);
    return 0;
}

