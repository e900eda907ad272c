/* tests/fuzz/fuzz_util.h - what the fuzz targets share: the shared assets (the stories260K
 * tokenizer), a private scratch directory for parsers that read files, and quiet logs.
 * Every target defines LLVMFuzzerTestOneInput (and usually LLVMFuzzerInitialize); it is linked
 * either with libFuzzer (build-fuzz, SHARDLM_FUZZ=ON: the campaigns of `make fuzz`) or with
 * fuzz_replay.c (every build: ctest replays tests/fuzz/corpus/<target>/, label fuzz).
 * Not here: the targets themselves (fuzz_<target>.c). docs/reliability.md has the figures. */
#ifndef SHARDLM_FUZZ_UTIL_H
#define SHARDLM_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;

/* The libFuzzer entry points (defined by each target). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Logs off (errors are the point of fuzzing, not news) and scratch directory created. */
void fuzz_init(void);

/* The stories260K tokenizer of $SHARDLM_ASSETS or ../shared/assets, loaded once. When the
 * assets are absent it prints "SKIP: ..." and exits 77 (ctest reports the replay as skipped). */
const struct tokenizer *fuzz_tokenizer(void);

/* Writes data[0..size) to <scratch>/name and returns that path (a static buffer, overwritten by
 * the next call). The scratch directory lives on /dev/shm when it exists and is removed at exit. */
const char *fuzz_write_file(const char *name, const void *data, size_t size);
/* <scratch>/name, without writing it (static buffer). */
const char *fuzz_path(const char *name);

/* Returns s; when SHARDLM_FUZZ_VERBOSE is set, first prints what the parser said ("OK" or the
 * status and its message), for checking that seeds reach where they should. */
int fuzz_report(int s);

/* A NUL-terminated malloc'd copy of data[0..size) (CHECKs on out of memory). */
char *fuzz_strndup(const uint8_t *data, size_t size);

#endif
