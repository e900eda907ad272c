/* cli/merge_lora.c - `shardlm merge-lora --model DIR --adapter DIR --out DIR`: the base model
 * with a LoRA adapter (the PEFT layout, trained by `shardlm train --lora-rank` or elsewhere)
 * folded in, W += (alpha / r) B A, written in the serving layout of the model's family, so
 * that `shardlm serve` serves what base + adapter computes.
 * Not here: the adapters (engine/model/lora.c), the writer (engine/train/train_checkpoint.c).
 * Tests: tests/test_train.sh, tests/test_train_grad.py (merged = base + adapter). */
#include "commands.h"

#include <stdio.h>
#include <string.h>

#include "lora.h"
#include "model_train.h"
#include "train_checkpoint.h"

int merge_lora_main(int argc, char **argv)
{
    const char *model_dir = NULL, *adapter = NULL, *out = NULL;
    for (int i = 0; i < argc; i += 2) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: shardlm merge-lora --model DIR --adapter DIR --out DIR\n");
            return 0;
        }
        if (i + 1 >= argc) return cli_usage("merge-lora: %s needs a value", argv[i]);
        if (!strcmp(argv[i], "--model")) model_dir = argv[i + 1];
        else if (!strcmp(argv[i], "--adapter")) adapter = argv[i + 1];
        else if (!strcmp(argv[i], "--out")) out = argv[i + 1];
        else return cli_usage("merge-lora: unknown option '%s'", argv[i]);
    }
    if (!model_dir || !adapter || !out) return cli_usage("merge-lora needs --model, --adapter and --out%s", "");
    struct backend *b = NULL;
    struct model *m = NULL;
    struct lora *l = NULL;
    enum status st = backend_open(DEVICE_CPU, 0, 0, &b);
    if (st == STATUS_OK) st = model_load_as(model_dir, b, NULL, DTYPE_F32, &m);
    if (st == STATUS_OK) st = model_weights_make_writable(m);
    if (st == STATUS_OK) st = lora_load_peft(m, adapter, &l);
    if (st == STATUS_OK) {
        lora_merge_into(l, m);
        st = train_checkpoint_write_model(out, m);
    }
    if (st == STATUS_OK)
        fprintf(stderr, "shardlm: wrote %s (%s with the rank-%d adapter of %s merged)\n", out, model_dir, l->rank, adapter);
    lora_free(l, b);
    model_free(m);
    backend_close(b);
    return st == STATUS_OK ? 0 : cli_fail(st);
}
