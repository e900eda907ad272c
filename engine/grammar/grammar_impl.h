/* engine/grammar/grammar_impl.h - the grammar engine's private pieces, shared by its files:
 * the expression tree every front end builds (grammar_ir.c), its lowering to the flat rule
 * table the automaton runs (struct gflat), the front ends (grammar_gbnf.c, grammar_regex.c,
 * grammar_schema.c) and the automaton (grammar_pda.c). Not a public interface.
 * Tests: tests/test_grammar.c. */
#ifndef SHARDLM_GRAMMAR_IMPL_H
#define SHARDLM_GRAMMAR_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* Limits that bound compile work and memory whatever the input (docs/grammar.md). In the
 * libFuzzer build (OSS-Fuzz's FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, engine/CMakeLists.txt)
 * the sizes are a tenth as large, the code the same: an input at the limit (100,000 rules)
 * cost 0.2 s, and the 1 % of the corpus near it took 83 % of the campaign's time. */
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define GRAMMAR_MAX_NODES    40000
#define GRAMMAR_MAX_ELEMENTS 100000
#else
#define GRAMMAR_MAX_NODES    400000  /* expression nodes per compile */
#define GRAMMAR_MAX_ELEMENTS 1000000 /* flat elements */
#endif
#define GRAMMAR_MAX_REPEAT   10000   /* m, n of {m,n}; minLength... */
#define GRAMMAR_MAX_DEPTH    200     /* nesting of groups, schemas */

/* ---- expression tree (arena of a gbuild) ---- */
enum gx_kind { GX_EMPTY, GX_BYTES, GX_SEQ, GX_ALT, GX_REF, GX_REPEAT };
struct gx {
    int         kind;
    int         n;        /* kids of SEQ/ALT */
    struct gx **kids;
    uint32_t    set[8];   /* BYTES: the 256-bit byte set */
    int         rule;     /* REF */
    int         min, max; /* REPEAT of kids[0]; max -1: unbounded */
    signed char nul;      /* whether it derives "": 0 not yet known, 1 no, 2 yes, 3 unknown (a REF below) */
};

struct grule {
    char      *name;
    struct gx *expr; /* NULL while only referenced (GBNF forward references) */
    int        rep_base, rep_k; /* x{0,n} lowered as o_k ::= x o_(k-1) | "": rule o_1's index, k */
};

struct gbuild {
    struct grule *rules;
    int           n_rules, cap_rules;
    void        **blocks; /* arena: its chunks and large allocations, freed at once */
    size_t        n_blocks, cap_blocks;
    char         *cur;    /* the current chunk's free part (left bytes) */
    size_t        left;
    long          n_nodes;
    int           failed; /* a limit or out of memory: the status is recorded */
};

void gb_init(struct gbuild *b);
void gb_free(struct gbuild *b);
void *gb_alloc(struct gbuild *b, size_t n);
/* Records the error once (status_errorf) and marks the build failed; returns s. */
enum status gb_fail(struct gbuild *b, enum status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gb_rule(struct gbuild *b, const char *name); /* finds or adds a rule by name, -1 on failure */
int gb_rule_new(struct gbuild *b, const char *prefix); /* a fresh anonymous rule */

struct gx *gx_empty(struct gbuild *b);
struct gx *gx_byte_range(struct gbuild *b, int lo, int hi);
struct gx *gx_lit(struct gbuild *b, const char *s, size_t n);
struct gx *gx_str(struct gbuild *b, const char *s); /* gx_lit of a C string */
struct gx *gx_seq(struct gbuild *b, int n, struct gx **kids);
struct gx *gx_alt(struct gbuild *b, int n, struct gx **kids);
struct gx *gx_seq2(struct gbuild *b, struct gx *x, struct gx *y);
struct gx *gx_seq3(struct gbuild *b, struct gx *x, struct gx *y, struct gx *z);
struct gx *gx_alt2(struct gbuild *b, struct gx *x, struct gx *y);
struct gx *gx_ref(struct gbuild *b, int rule);
struct gx *gx_repeat(struct gbuild *b, struct gx *x, int min, int max);
/* A set of code points, sorted disjoint ranges lo[i]..hi[i], as UTF-8 byte sequences. */
struct gx *gx_codepoints(struct gbuild *b, const uint32_t *lo, const uint32_t *hi, int n);

/* Code point sets for the regex and GBNF classes. */
struct cpset {
    uint32_t *lo, *hi;
    int       n, cap;
};
void cpset_add(struct cpset *s, uint32_t lo, uint32_t hi);
void cpset_normalize(struct cpset *s);   /* sort and merge */
void cpset_negate(struct cpset *s);      /* complement in [0, 0x10FFFF] */
void cpset_free(struct cpset *s);

/* ---- the flat form the automaton runs ----
 * el[]: an alternative is a run of elements ended by GEL_END. An element >= 0 is a terminal:
 * the index of its byte set; GEL_END ends the alternative; <= GEL_REF0 references rule
 * GEL_REF0 - el. */
#define GEL_END  (-1)
#define GEL_REF0 (-2)
struct gflat {
    int32_t  *el;       /* (n_el) */
    int       n_el;
    uint32_t *sets;     /* (n_sets, 8) byte sets */
    int       n_sets;
    int32_t  *alt_pos;  /* (n_alts) start of each alternative in el */
    int       n_alts;
    int32_t  *rule_alt; /* (n_rules + 1) alternatives of rule r: alt_pos[rule_alt[r] .. rule_alt[r+1]) */
    int       n_rules;
    int       root;
    int32_t  *pos_rule; /* (n_el) the rule each element belongs to */
    int32_t  *rep_base; /* (n_rules) counted chains (struct grule): o_1's rule, -1 when not in one, */
    int32_t  *rep_k;    /* (n_rules) and k; only chains whose x always consumes input */
};
/* Lowers rule `root` of b and what it references; checks that every rule is defined, drops
 * alternatives that can derive no string, refuses left recursion and a root that accepts
 * nothing. Errors: STATUS_INVALID_ARGUMENT, STATUS_RESOURCE_EXHAUSTED. */
enum status gflat_build(struct gbuild *b, int root, struct gflat *f);
void gflat_free(struct gflat *f);

/* ---- front ends: each fills b and returns its root rule in *root ---- */
enum status gbnf_parse(struct gbuild *b, const char *src, size_t n, int *root);
/* json_string: the regex constrains the content of a JSON string (characters escaped as
 * JSON writes them); anchored: ^...$ implied (GRAMMAR_REGEX), else search semantics. */
enum status regex_parse(struct gbuild *b, const char *src, size_t n, int json_string, struct gx **out);
enum status schema_build(struct gbuild *b, const char *src, size_t n, int object_only, int *root);
enum status choice_build(struct gbuild *b, const char *src, size_t n, int *root);
/* JSON pieces shared by the schema builder. */
struct gx *json_string_char(struct gbuild *b);
/* Non-negative decimal integers in [lo, hi] (hi < 0: unbounded; bounds at most 1e18), no leading
 * zeros, as digit-by-digit alternatives (grammar_ir.c). */
struct gx *gx_uint_range(struct gbuild *b, long long lo, long long hi);

/* ---- vocabulary ---- */
struct grammar_vocab {
    int       n_tok;       /* tokenizer size */
    int       model_vocab; /* mask bits */
    uint32_t *off;         /* (n_tok + 1) bytes of token i: bytes[off[i] .. off[i+1]) */
    uint8_t  *bytes;
    int32_t  *sorted;      /* (n_sorted) ids with bytes, in byte order */
    int32_t  *lcp;         /* (n_sorted) common prefix with the previous sorted token */
    uint32_t *soff;        /* (n_sorted + 1) the sorted tokens' bytes again, in sorted order, so that */
    uint8_t  *sbytes;      /* walks read memory in sequence: sbytes[soff[i] .. soff[i+1]) */
    int32_t  *skip;        /* (soff[n_sorted]) skip[soff[i] + d]: the first sorted token after i that
                            * does not share i's first d+1 bytes (a dead prefix's whole range) */
    int       n_sorted;
    int32_t  *end_ids;     /* (n_end) */
    int       n_end;
    int       max_len;     /* longest token */
};

/* ---- compiled grammar, matcher ---- */
struct mask_entry; /* grammar_pda.c */
struct grammar {
    int                         refs; /* atomic */
    const struct grammar_vocab *vocab;
    struct gflat                f;
    pthread_mutex_t             lock; /* guards the mask cache */
    struct mask_entry         **cache; /* open addressing, (cap_cache) */
    int                         n_cache, cap_cache;
    size_t                      cache_bytes;
};
void grammar_cache_entries_free(struct grammar *g);

#endif
