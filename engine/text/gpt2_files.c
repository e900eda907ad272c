/* engine/text/gpt2_files.c - GPT-2's original tokenizer files, vocab.json + merges.txt (as
 * openai/gpt-2 and Hugging Face's GPT2Tokenizer publish them, and many byte-level BPE models
 * still ship beside or instead of a tokenizer.json), as the tokenizer.json text that
 * tokenizer_json.c reads: a BPE model of that vocabulary and those merges behind GPT-2's
 * byte-level pre-tokenizer (its regex, no prefix space) and byte-level decoder, which is what
 * Hugging Face's BPE.from_file + ByteLevel make of the same files. Special tokens come from a
 * tokenizer_config.json beside the files, as for a tokenizer.json (tokenizer.cc).
 * Tests: tests/test_gpt2_files.py (against Hugging Face tokenizers on the same two files). */
#include "gpt2_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#define GPT2_MAX_MERGES_BYTES (256u << 20) /* merges.txt beyond this is refused */

/* The whole of merges.txt beside vocab_path, NUL-terminated (*text malloc'd). */
static enum status read_merges(const char *vocab_path, char *merges_path, size_t cap, char **text, size_t *n)
{
    const char *slash = strrchr(vocab_path, '/');
    const int dir = slash ? (int)(slash - vocab_path + 1) : 0;
    if (snprintf(merges_path, cap, "%.*smerges.txt", dir, vocab_path) >= (int)cap)
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s: path too long", vocab_path);
    if (access(merges_path, F_OK) != 0)
        return status_errorf(STATUS_NOT_FOUND, "%s: a vocab.json needs its merges.txt beside it: %s is missing",
                             vocab_path, merges_path);
    return base_read_file(merges_path, GPT2_MAX_MERGES_BYTES, "merges.txt", text, n);
}

/* merges.txt's lines as "a b" strings of arr: a "#version" first line skipped, blank lines
 * skipped; every other line two non-empty pieces separated by one space. */
static enum status add_merges(cJSON *arr, char *text, size_t n, const char *path)
{
    int line = 0;
    for (char *p = text, *end = text + n; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *e = nl ? nl : end;
        line++;
        if (e > p && e[-1] == '\r') e[-1] = 0, e--;
        *e = 0;
        const size_t len = (size_t)(e - p);
        if (len && !(line == 1 && !strncmp(p, "#version", 8))) {
            if (memchr(p, 0, len)) return status_errorf(STATUS_BAD_FORMAT, "%s: line %d: a NUL byte", path, line);
            const char *sp = strchr(p, ' ');
            if (!sp || sp == p || !sp[1] || strchr(sp + 1, ' '))
                return status_errorf(STATUS_BAD_FORMAT, "%s: line %d: a merge is two pieces separated by one space",
                                     path, line);
            cJSON *m = cJSON_CreateString(p);
            if (!m || !cJSON_AddItemToArray(arr, m)) {
                cJSON_Delete(m);
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            }
        }
        p = nl ? nl + 1 : end;
    }
    return STATUS_OK;
}

int gpt2_files_is_vocab(const char *path)
{
    const char *slash = strrchr(path, '/');
    return !strcmp(slash ? slash + 1 : path, "vocab.json");
}

enum status gpt2_files_json(const char *vocab, size_t vocab_n, const char *vocab_path, char **json)
{
    *json = NULL;
    cJSON *v = cJSON_ParseWithLength(vocab, vocab_n);
    if (!v || !cJSON_IsObject(v) || !v->child) {
        cJSON_Delete(v);
        return status_errorf(STATUS_BAD_FORMAT, "%s: not a JSON object of pieces and their ids", vocab_path);
    }
    for (const cJSON *e = v->child; e; e = e->next)
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)(int)e->valuedouble || e->valuedouble < 0) {
            enum status s = status_errorf(STATUS_BAD_FORMAT, "%s: piece '%.40s' has no non-negative integer id",
                                          vocab_path, e->string);
            cJSON_Delete(v);
            return s;
        }
    char merges_path[4200], *text = NULL;
    size_t n = 0;
    enum status s = read_merges(vocab_path, merges_path, sizeof merges_path, &text, &n);
    if (s != STATUS_OK) {
        cJSON_Delete(v);
        return s;
    }
    /* Each item belongs to root once added; on a failure only root (and what was not added) is freed. */
    cJSON *root = cJSON_CreateObject(), *model = NULL, *pre = NULL, *dec = NULL, *merges = NULL;
    int ok = root && (model = cJSON_AddObjectToObject(root, "model")) && cJSON_AddStringToObject(model, "type", "BPE") &&
             cJSON_AddItemToObject(model, "vocab", v);
    if (ok) v = NULL;
    ok = ok && (merges = cJSON_AddArrayToObject(model, "merges")) && (pre = cJSON_AddObjectToObject(root, "pre_tokenizer")) &&
         cJSON_AddStringToObject(pre, "type", "ByteLevel") && cJSON_AddFalseToObject(pre, "add_prefix_space") &&
         cJSON_AddTrueToObject(pre, "use_regex") && (dec = cJSON_AddObjectToObject(root, "decoder")) &&
         cJSON_AddStringToObject(dec, "type", "ByteLevel");
    s = ok ? add_merges(merges, text, n, merges_path) : status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", vocab_path);
    if (s == STATUS_OK && !(*json = cJSON_PrintUnformatted(root)))
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", vocab_path);
    cJSON_Delete(v);
    cJSON_Delete(root);
    free(text);
    return s;
}
