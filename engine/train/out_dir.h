/* engine/train/out_dir.h - the --out directory of `shardlm train` as a place: whether a run may
 * write there (never over the model it trains, nor over another model unless told), which
 * checkpoint under it a --resume continues, and how many interval checkpoints it keeps.
 * Layout: OUT/ holds the final checkpoint (train_checkpoint.h) and metrics.jsonl;
 * OUT/checkpoints/iter_NNNNNNN/ the interval (and signal) checkpoints, each complete once its
 * name has no ".tmp" suffix (train_checkpoint.c renames a finished DIR.tmp to DIR).
 * Not here: the files of a checkpoint (train_checkpoint.c), the loop (trainer.c).
 * Tests: tests/test_train.sh (section 5: --out guards, resume of an interrupted run,
 * --keep-checkpoints, signals). */
#ifndef SHARDLM_TRAIN_OUT_DIR_H
#define SHARDLM_TRAIN_OUT_DIR_H

#include <stddef.h>

#include "base.h"

/* Whether a run may write its checkpoints to `out`. model: the --model path (a directory or a
 * GGUF file; NULL when absent); resume: the resolved --resume directory (NULL when absent).
 * Identity is decided by device and inode (stat), never by comparing strings, so symlinks,
 * "./" and trailing slashes do not fool it. Refused with STATUS_FAILED_PRECONDITION and a
 * message naming the path, always: out is the model, or lies inside the model's directory, or
 * is a file. Refused unless `overwrite`: out is a directory that already holds a model or a
 * run (config.json, *.safetensors, *.gguf, adapter_config.json, checkpoints/), except when
 * resume is out itself or lies inside it (a run continued in its own directory). */
enum status out_dir_check(const char *out, const char *model, const char *resume, int overwrite);

/* --overwrite-out: removes out/checkpoints/iter_* of an earlier run (flat directories), so that
 * neither --resume nor --keep-checkpoints mistakes them for this run's. Nothing else is removed;
 * the final checkpoint's files are replaced when the run writes its own. Nothing at all when
 * resume (the resolved --resume, or NULL) lies inside out: that run is the one continued. */
enum status out_dir_clear_checkpoints(const char *out, const char *resume);

/* The checkpoint `dir` names for --resume: dir itself when it holds a training state and no
 * later complete checkpoint lies under dir/checkpoints/, else the complete iter_* with the
 * highest iteration there (an interrupted run's latest), else dir unchanged (the load then says
 * what is missing). Writes the choice into buf[0..n) and its iteration (-1 when unknown) into
 * *iteration. */
enum status out_dir_resolve_resume(const char *dir, char *buf, size_t n, long long *iteration);

/* Removes all but the `keep` latest complete checkpoints under out/checkpoints/ (keep 0: keeps
 * all). The final checkpoint in out itself is never counted nor removed. Logs each removal. */
enum status out_dir_prune(const char *out, int keep);

#endif
