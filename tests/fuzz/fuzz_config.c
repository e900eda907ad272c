/* tests/fuzz/fuzz_config.c - config.json (engine/formats/config.c): the input is the JSON text,
 * parsed with config_parse; a config that parses must pass config_validate and survive the
 * round trip config.h promises (config_save, config_load, config_equal), else the target
 * aborts. Corpus: tests/fuzz/corpus/config (tests/fuzz/make_seeds.py). */
#include <stdio.h>
#include <stdlib.h>

#include "config.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

static void round_trip(const struct model_config *cfg)
{
    const char *path = fuzz_path("config.json");
    struct model_config back;
    if (config_validate(cfg, "config.json") != STATUS_OK) {
        fprintf(stderr, "config_parse accepted a config that config_validate refuses: %s\n", status_message());
        abort();
    }
    if (config_save(path, cfg) != STATUS_OK || config_load(path, &back) != STATUS_OK) {
        fprintf(stderr, "a parsed config does not save and load back: %s\n", status_message());
        abort();
    }
    if (!config_equal(cfg, &back)) {
        fprintf(stderr, "a parsed config reads back different after config_save\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = fuzz_strndup(data, size);
    struct model_config cfg;
    if (fuzz_report(config_parse(json, "config.json", &cfg)) == STATUS_OK) round_trip(&cfg);
    free(json);
    return 0;
}
