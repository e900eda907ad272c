/* engine/grammar/grammar_schema_impl.h - what grammar_schema.c (JSON Schema to expression
 * trees) shares with grammar_schema_scalar.c (its numbers and strings). */
#ifndef SHARDLM_GRAMMAR_SCHEMA_IMPL_H
#define SHARDLM_GRAMMAR_SCHEMA_IMPL_H

#include <cjson/cJSON.h>

#include "grammar_impl.h"

/* A JSON Pointer ($ref) already made a rule. */
struct sref { char *ptr; int rule; };

/* A schema's build: its root, the rules of the JSON values and of the $refs made so far. */
struct sb {
    struct gbuild *b;
    cJSON         *root;
    cJSON        **owned; /* merged allOf schemas, freed at the end */
    int            n_owned;
    struct sref    refs[256];
    int            n_refs;
    int            depth;
    int            r_value, r_string, r_char, r_int, r_number, r_object, r_array;
    struct gx     *tagged; /* the root's branches after their texts (tagged_branches) */
    int            num_first, num_count; /* x-shardlm-repeat's "numbered": the copies of the tagged
                                            branches, their texts' %d first .. first + count - 1 */
    struct gx     *tagged_n[16]; /* (num_count) the copies; tagged is the first */
    char           escape[17]; /* x-shardlm-escape: ASCII that free strings write as \u00XX only */
};

/* Fails the build with "json schema: PATH: " and fmt (one %s: arg). */
enum status schema_fail(struct sb *s, const char *path, const char *fmt, const char *arg);
/* A number's value (integer: an integer's) under node's bounds and format, at path. */
struct gx *schema_number(struct sb *s, const cJSON *node, int integer, const char *path);
/* A string's value under node's pattern, format, minLength and maxLength, at path. */
struct gx *schema_string(struct sb *s, const cJSON *node, const char *path);

#endif
