/* tests/test_grammar.c - the grammar engine (engine/grammar/): compile errors, strings accepted
 * and refused, rollback, and every mask checked against brute force (each token accepted on
 * the matcher and rolled back) along random walks, on a synthetic vocabulary and on the real
 * SmolLM2 (byte-level BPE) and Gemma 3 (SentencePiece) vocabularies when their GGUF files are
 * present. Also the tool that tests/test_grammar.py drives:
 *   test_grammar [SMOLLM2_GGUF [GEMMA_GGUF]]        the unit test (label unit)
 *   test_grammar check KIND FILE                     stdin: hex strings, one a line; prints
 *                                                    "complete", "prefix" or "reject" for each
 *   test_grammar walk KIND FILE GGUF SEED N          N random walks over the vocabulary's masks
 *                                                    (GGUF "synthetic": the test's own); prints
 *                                                    each text in hex, then " done" if finished
 *   test_grammar compile KIND FILE                   prints "ok" or the error message
 * KIND: json_schema, json_object, regex, ebnf, choice. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "gguf.h"
#include "gguf_tokenizer.h"
#include "grammar.h"
#include "tokenizer.h"

static int failures;
#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            failures++;                                                        \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);               \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
        }                                                                      \
    } while (0)

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return (uint32_t)rng; }

static int kind_of(const char *s)
{
    static const char *names[] = {"json_schema", "json_object", "regex", "ebnf", "choice"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

/* ---- synthetic vocabulary: the 256 bytes, some multi-byte tokens, an end id, padding ---- */
static const char *extra[] = {"{\"", "\":", "\",", "\"}", "true", "null", "false", "abc", "12", "0.", ",\"", "\\\"",
                              "\xc3\xa9", "\xe2\x82", "\xac", "\"a\"", "[1", "],", "}}", "ab", "a\"", "\"", "hello",
                              " world", "-1", "e+", "name", "age", "\":\"", "\":1", "]}", "1,", "\"b", NULL};
#define SYN_END 400
#define SYN_MODEL 420

static struct grammar_vocab *synthetic_vocab(void)
{
    static char bytes[256];
    const char *toks[SYN_END + 1];
    int lens[SYN_END + 1];
    int n = 0;
    for (int i = 0; i < 256; i++) bytes[i] = (char)i, toks[n] = &bytes[i], lens[n++] = 1;
    for (int i = 0; extra[i]; i++) toks[n] = extra[i], lens[n++] = (int)strlen(extra[i]);
    while (n <= SYN_END) toks[n] = "", lens[n++] = 0;
    int32_t end = SYN_END;
    struct grammar_vocab *v = NULL;
    enum status s = grammar_vocab_new_bytes(toks, lens, SYN_END + 1, SYN_MODEL, &end, 1, &v);
    if (s) fprintf(stderr, "vocab: %s\n", status_message());
    return v;
}

/* Every bit of the mask against accept + rollback; then a random allowed token. Returns the
 * number of steps walked. */
static int walk_check(struct grammar *g, const struct grammar_vocab *v, int steps, int brute, const char *what, char *out, size_t cap)
{
    struct grammar_matcher *m = NULL;
    if (grammar_matcher_new(g, &m)) return 0;
    int words = grammar_vocab_mask_words(v);
    uint32_t *mask = malloc(sizeof *mask * (size_t)words);
    int32_t *allowed = malloc(sizeof *allowed * (size_t)words * 32);
    size_t used = 0;
    int step;
    for (step = 0; step < steps && !grammar_matcher_is_done(m); step++) {
        if (grammar_matcher_fill_mask(m, mask)) {
            EXPECT(0, "%s: step %d: %s", what, step, status_message());
            break;
        }
        int n_allowed = 0, bad = 0;
        for (int t = 0; t < words * 32 && t < 1 << 30; t++) {
            int bit = mask[t >> 5] >> (t & 31) & 1;
            if (bit) allowed[n_allowed++] = t;
            if (!brute) continue; /* the walk tool: no per-token check */
            if (t >= words * 32) break;
            int ok = 0;
            if (t < words * 32) {
                enum status s = grammar_matcher_accept(m, t);
                ok = s == STATUS_OK;
                if (ok) grammar_matcher_rollback(m, 1);
            }
            if (ok != bit && bad++ < 3) EXPECT(0, "%s: step %d token %d: mask %d, accept %d", what, step, t, bit, ok);
        }
        if (!n_allowed) {
            EXPECT(0, "%s: step %d: nothing allowed before the end", what, step);
            break;
        }
        int32_t t = allowed[rnd() % (unsigned)n_allowed];
        /* Prefer not ending early half of the time so walks get somewhere. */
        if (n_allowed > 1 && grammar_matcher_can_end(m) && rnd() % 2) {
            for (int k = 0; k < 8; k++) {
                int32_t u = allowed[rnd() % (unsigned)n_allowed];
                int len;
                if (grammar_vocab_token(v, u, &len) && len) { t = u; break; }
            }
        }
        EXPECT(grammar_matcher_accept(m, t) == STATUS_OK, "%s: allowed token %d refused", what, t);
        int len;
        const char *bytes = grammar_vocab_token(v, t, &len);
        if (out && bytes && used + (size_t)len < cap) memcpy(out + used, bytes, (size_t)len), used += (size_t)len;
    }
    if (out) out[used] = 0;
    free(mask), free(allowed);
    grammar_matcher_free(m);
    return step;
}

struct sample { int kind; const char *src; const char *yes[8]; const char *no[8]; };

static const struct sample samples[] = {
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150}},\"required\":[\"name\"],\"additionalProperties\":false}",
     {"{\"name\":\"x\"}", "{\"name\":\"\\u001f\\n\",\"age\":150}", "{\"name\":\"a\",\"age\":0}", NULL},
     {"{\"age\":1}", "{\"name\":\"a\",\"age\":151}", "{\"name\":\"a\",\"age\":01}", "{\"name\":\"a\",\"x\":1}", "{ \"name\":\"a\"}", "{\"name\":\"a\",\"age\":-1}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}",
     {"{\"v\":1,\"next\":null}", "{\"v\":1,\"next\":{\"v\":-2,\"next\":{\"v\":3,\"next\":null}}}", NULL},
     {"{\"v\":1}", "{\"v\":1,\"next\":{}}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",1,null]},\"minItems\":1,\"maxItems\":3}",
     {"[\"red\"]", "[1,null,\"green\"]", NULL}, {"[]", "[1,1,1,1]", "[\"blue\"]", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date\"},\"id\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]+$\"},\"s\":{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}},\"additionalProperties\":false}",
     {"{}", "{\"d\":\"2024-02-29\",\"id\":\"AB-12\",\"s\":\"abc\"}", "{\"s\":\"\\\"x\"}", NULL},
     {"{\"d\":\"2024-13-01\"}", "{\"id\":\"A-1\"}", "{\"s\":\"a\"}", "{\"s\":\"abcd\"}", NULL}},
    /* additionalProperties absent where properties are declared: none generated (docs/grammar.md);
     * said true, in the object or in an allOf part, they are; an object without properties is open. */
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}",
     {"{\"a\":1,\"b\":[]}", NULL}, {"{\"a\":1,\"b\":2,\"c\":3}", "{\"a\":1}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
     {"{\"a\":1,\"c\":true}", "{\"c\":null}", NULL}, {"{\"a\":\"x\"}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"b\":{}},\"additionalProperties\":true}]}",
     {"{\"a\":1,\"b\":2,\"c\":3}", NULL}, {"{\"a\":\"x\"}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"b\":{}}}]}",
     {"{\"a\":1,\"b\":2}", "{}", NULL}, {"{\"a\":1,\"c\":3}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\"}", {"{}", "{\"z\":[1]}", NULL}, {"[]", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":[\"number\",\"string\",\"null\"]}", {"1.5e-3", "\"x\"", "null", "-0", NULL}, {"01", "1.", "true", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"boolean\"},{\"type\":\"integer\",\"exclusiveMinimum\":10}],\"items\":false}",
     {"[]", "[true]", "[false,11]", NULL}, {"[false,10]", "[true,11,1]", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"format\":\"int32\"}}", {"[2147483647,-2147483648,0]", NULL}, {"[2147483648]", "[-2147483649]", NULL}},
    {GRAMMAR_JSON_OBJECT, "", {"{}", "{\"a\":[1,{\"b\":null}],\"c\":\"\"}", NULL}, {"[]", "{\"a\"}", "{} ", NULL}},
    {GRAMMAR_REGEX, "^(\\d{3}-)?[a-z]+(foo|bar)*\\.?$", {"abc", "123-xfoobar.", "q", NULL}, {"12-ab", "", "ABC", "abc..", NULL}},
    {GRAMMAR_REGEX, "[^a-c]{2,3}|\\w\\s\\S", {"de", "\xc3\xa9\xc3\xa9x", "a b", NULL}, {"ab", "dddd", NULL}},
    {GRAMMAR_EBNF, "root ::= \"(\" expr \")\" | \"x\"\nexpr ::= term (\"+\" term)*  # sums\nterm ::= [0-9]+ | root\n",
     {"x", "(1+2)", "((3)+x)", "(x)", NULL}, {"()", "(1+)", "1", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":3,\"maxLength\":45}", {"\"abc\"", "\"0123456789012345678901234567890123456789\\n\\t\\\"ab\"", NULL},
     {"\"ab\"", "\"0123456789012345678901234567890123456789012345\"", NULL}},
    {GRAMMAR_REGEX, "([ab]|cd){0,30}x{2,40}", {"abcdxx", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", NULL}, {"x", "abc", NULL}},
    {GRAMMAR_REGEX, "((a*)*b?)*(x?)+", {"", "aab", "bbx", "x", NULL}, {"xa", "c", NULL}},
    /* Repeats of bodies that derive "": rewritten as repeats of the body without "" (grammar_ir.c
     * gx_repeat); the languages as Python's re decides them. */
    {GRAMMAR_REGEX, "(a?b?){2,3}c", {"c", "abc", "ababc", "abababc", "bbbc", "aac", NULL}, {"abababac", "bbbbc", "aaaac", NULL}},
    {GRAMMAR_REGEX, "((x?y?){3}){2}z", {"z", "xz", "xyxyxyxyxyxyz", "yyyyyyz", NULL}, {"xyxyxyxyxyxyxyz", "yyyyyyyz", "xxxxxxxz", NULL}},
    {GRAMMAR_REGEX, "(|a|bc)*d", {"d", "abcad", NULL}, {"bd", "cd", NULL}},
    {GRAMMAR_REGEX, "(a?\?){2,}b", {"b", "ab", "aaab", NULL}, {"ba", "aa", NULL}},
    {GRAMMAR_EBNF, "root ::= ((\"a\"*)*)+ ((\"b\"?)*)* \"c\"*\n", {"", "aab", "bbcc", NULL}, {"ba", "cb", NULL}},
    {GRAMMAR_EBNF, "root ::= item{2,3} \"!\"?\nitem ::= [a-b] | \"\\u00e9\"\n", {"ab", "a\xc3\xa9" "b!", NULL}, {"a", "abab", NULL}},
    {GRAMMAR_EBNF, "# leading comment\n\nroot ::=\n  \"a\"\n  | \"b\" # b\n\n  | [c-d]{2}\nunused ::= \"z\"\n", {"a", "b", "cd", NULL}, {"c", "z", "ab", NULL}},
    /* x-shardlm-prefix: literal text before the value (a tool call's marker), the root's only. */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-prefix\":\"<call>\\n\",\"type\":\"integer\",\"minimum\":1}",
     {"<call>\n12", "\n\n<call>\n12", " \t\r\n<call>\n1", NULL},
     {"12", "<call>12", "<call>\n0", "x<call>\n1", "         <call>\n1", NULL}},
    /* x-shardlm-prefix as a list: one of its texts (maybe empty) first (harmony's answer: its
     * final message's header or none, server/generation.c). */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-prefix\":[\"\",\"<|start|>a<|message|>\",\"<|message|>\"],\"type\":\"integer\"}",
     {"12", " 12", "<|start|>a<|message|>12", "<|message|>7", NULL},
     {"<|start|>12", "<|message|><|message|>1", "<|start|>a<|message|>", "x12", NULL}},
    {GRAMMAR_CHOICE, "[\"yes\",\"no\",\"maybe so\"]", {"yes", "maybe so", NULL}, {"ye", "yess", "\"yes\"", NULL}},
    /* x-shardlm-repeat: parallel calls, each closed; the output may end after a value or a close. */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-prefix\":\"<c>\\n\",\"x-shardlm-repeat\":{\"close\":\"\\n</c>\",\"open\":\"\\n<c>\\n\"},"
     "\"type\":\"integer\",\"minimum\":1}",
     {"<c>\n12", "<c>\n12\n</c>", "<c>\n1\n</c>\n<c>\n2\n</c>", "<c>\n1\n</c>\n<c>\n2\n</c>\n<c>\n3\n</c>", NULL},
     {"<c>\n1\n</c>\n<c>\n2", "<c>\n1\n</c>\n<c>\n", "<c>\n1\n<c>\n2\n</c>", "<c>\n1\n</c>\n<c>\n0\n</c>", "<c>\n1\n</c>2", NULL}},
    /* x-shardlm-repeat with "end": every value closed, the list ended (DeepSeek's calls); without
     * "open", one value. */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-repeat\":{\"close\":\"]\",\"open\":\"[\",\"end\":\"!\"},\"type\":\"integer\"}",
     {"1]!", "1][2]!", "1][2][3]!", NULL}, {"1", "1]", "1!", "1][2", "1][2]", "1]2]!", "1][0x]!", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-repeat\":{\"close\":\"]\",\"end\":\"!\"},\"type\":\"integer\"}",
     {"1]!", "23]!", NULL}, {"1", "1]", "1][2]!", "1!", NULL}},
    /* x-shardlm-prefix in every branch of a root anyOf: one branch's text, then its value
     * (harmony's call headers after the function's name), after the root's own prefix. */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-prefix\":\"to=\",\"anyOf\":[{\"x-shardlm-prefix\":\"f <j>\",\"type\":\"integer\"},"
     "{\"x-shardlm-prefix\":\"g<j>\",\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"a\"]}]}",
     {"to=f <j>12", " to=g<j>{\"a\":true}", NULL},
     {"to=f <j>{\"a\":true}", "to=g<j>12", "to=f<j>12", "to=12", "f <j>12", "to=f <j>g<j>1", NULL}},
    /* x-shardlm-repeat numbered: the tagged branches' "%d" counts from FIRST, at most COUNT values
     * (Kimi-K2's parallel calls, `functions.NAME:INDEX`). */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-repeat\":{\"close\":\"]\",\"open\":\"[\",\"end\":\"!\",\"numbered\":[3,2]},"
     "\"anyOf\":[{\"x-shardlm-prefix\":\"f:%d=\",\"type\":\"integer\"},{\"x-shardlm-prefix\":\"g:%d=\",\"type\":\"boolean\"}]}",
     {"f:3=1]!", "g:3=true][f:4=2]!", "f:3=1][g:4=false]!", NULL},
     {"f:4=1]!", "f:3=1][f:3=2]!", "f:3=1][f:4=2][f:5=3]!", "f:3=1]", "f:%d=1]!", "g:3=1]!", NULL}},
    /* a $ref into the list sees the branches as values, whatever their order */
    {GRAMMAR_JSON_SCHEMA, "{\"anyOf\":[{\"x-shardlm-prefix\":\"a\",\"$ref\":\"#/anyOf/1\"},{\"x-shardlm-prefix\":\"b\","
     "\"type\":\"integer\"}]}", {"a5", "b7", NULL}, {"ab7", "5", "a", NULL}},
    /* x-shardlm-escape: free strings and free keys write '<' only as \u003c (either case); enum
     * keeps its own text (harmony's arguments, where a marker token must not stand in a string). */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-escape\":\"<\",\"x-shardlm-prefix\":\"f<|message|>\",\"type\":\"object\","
     "\"properties\":{\"a\":{\"type\":\"string\"},\"b\":{\"enum\":[\"x<y\"]},\"c\":{\"type\":\"string\",\"maxLength\":3}}}",
     {"f<|message|>{\"a\":\"1\\u003c2\"}", "f<|message|>{\"a\":\"\\u003C|call|>\",\"b\":\"x<y\"}", "f<|message|>{\"c\":\"\\u003c\"}",
      "f<|message|>{\"a\":\">|\"}", NULL},
     {"f<|message|>{\"a\":\"<|call|>\"}", "f<|message|>{\"a\":\"1<2\"}", "f<|message|>{\"c\":\"<\"}",
      "f<|message|>{\"b\":\"x\\u003cy\"}", NULL}},
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-escape\":\"<>\",\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{\"\\u003e\":1}", "{\"ab\":2}", NULL}, {"{\"<\":1}", "{\"a>\":1}", NULL}},
    /* a declared name keeps its '<'; a free key may not take it from the declared names' trie */
    {GRAMMAR_JSON_SCHEMA, "{\"x-shardlm-escape\":\"< \",\"type\":\"object\",\"properties\":{\"<a\":{\"type\":\"integer\"}},"
     "\"additionalProperties\":{\"type\":\"integer\"}}",
     {"{\"<a\":1}", "{\"b\":2}", "{\"<a\":1,\"c\\u0020d\":3}", NULL}, {"{\"<b\":1}", "{\"<|end|>\":1}", "{\"c d\":3}", NULL}},
};

static const char *const bad[][3] = {
    /* bounds beyond long long were cast before being checked (UBSan; fuzz_grammar_compile) */
    {"0", "{\"type\":\"integer\",\"minimum\":0,\"maximum\":2.4e88}", "integer bound beyond 1e18"},
    {"0", "{\"type\":\"integer\",\"exclusiveMinimum\":-1e300}", "integer bound beyond 1e18"},
    {"0", "{\"type\":\"object\",\"patternProperties\":{}}", "patternProperties"},
    {"0", "{\"type\":\"object\",\"properties\":{\"a\":{\"x-shardlm-prefix\":\"<\",\"type\":\"integer\"}}}",
     "unsupported keyword 'x-shardlm-prefix'"},
    {"0", "{\"x-shardlm-prefix\":7,\"type\":\"integer\"}", "x-shardlm-prefix must be a string"},
    {"0", "{\"x-shardlm-prefix\":[],\"type\":\"integer\"}", "or a list of 1 to 8 strings"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"]\",\"open\":\"[\",\"end\":\"!\",\"numbered\":[0,2]},\"type\":\"integer\"}",
     "numbered needs a root anyOf"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"]\",\"open\":\"[\",\"end\":\"!\",\"numbered\":[0,17]},\"anyOf\":"
     "[{\"x-shardlm-prefix\":\"f\",\"type\":\"integer\"}]}", "x-shardlm-repeat must be"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"]\",\"end\":\"!\",\"numbered\":[0,2]},\"anyOf\":"
     "[{\"x-shardlm-prefix\":\"f\",\"type\":\"integer\"}]}", "x-shardlm-repeat must be"},
    {"0", "{\"x-shardlm-prefix\":[\"a\",3],\"type\":\"integer\"}", "or a list of 1 to 8 strings"},
    {"0", "{\"x-shardlm-escape\":\"\\\"\",\"type\":\"string\"}", "x-shardlm-escape must be"},
    {"0", "{\"x-shardlm-escape\":\"\",\"type\":\"string\"}", "x-shardlm-escape must be"},
    {"0", "{\"type\":\"object\",\"properties\":{\"a\":{\"x-shardlm-escape\":\"<\",\"type\":\"string\"}}}",
     "unsupported keyword 'x-shardlm-escape'"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"x\"},\"type\":\"integer\"}", "x-shardlm-repeat must be"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"\",\"open\":\"y\"},\"type\":\"integer\"}", "x-shardlm-repeat must be"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"x\",\"end\":7},\"type\":\"integer\"}", "x-shardlm-repeat must be"},
    {"0", "{\"x-shardlm-repeat\":{\"close\":\"x\",\"open\":\"y\",\"last\":\"z\"},\"type\":\"integer\"}",
     "x-shardlm-repeat must be"},
    {"0", "{\"type\":\"array\",\"items\":{\"x-shardlm-repeat\":{\"close\":\"x\",\"open\":\"y\"}}}",
     "unsupported keyword 'x-shardlm-repeat'"},
    {"0", "{\"anyOf\":[{\"x-shardlm-prefix\":\"a\",\"type\":\"integer\"},{\"type\":\"integer\"}]}",
     "/anyOf/1: /x-shardlm-prefix must be a string of 1 to 128 bytes in every branch"},
    {"0", "{\"type\":\"object\",\"anyOf\":[{\"x-shardlm-prefix\":\"a\",\"type\":\"integer\"}]}",
     "must be the root's only keyword"},
    {"0", "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"strin\"}}}", "/properties/a"},
    {"0", "{\"$ref\":\"#/$defs/missing\"}", "points to nothing"},
    {"0", "{\"$ref\":\"#\"}", "accepts no string"},
    {"0", "{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", "maxLength"},
    {"0", "{\"type\":\"integer\",\"minimum\":5,\"maximum\":2}", "minimum"},
    {"0", "{\"type\":\"object\"", "not valid JSON"},
    {"0", "{\"type\":\"string\",\"format\":\"hostname-x\"}", "format"},
    {"0", "{\"type\":\"number\",\"format\":\"percent\"}", "unsupported format 'percent'"},
    {"0", "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"id\":{}},\"required\":[\"id\"]}],\"additionalProperties\":false}", "excluded"},
    {"2", "a(b", "missing )"},
    {"2", "(a)\\1", "backreferences"},
    {"2", "(?=a)b", "lookaround"},
    {"2", "a{3,2}", "repetition"},
    {"2", "a**", "multiple repeat"},
    {"3", "root ::= foo", "foo"},
    {"3", "root ::= root \"a\" | \"b\"", "left recursion"},
    {"3", "root ::= a \"x\"\na ::= b \"y\" | \"z\"\nb ::= root | \"w\"", "left recursion through rule root"},
    {"3", "root ::= n root \"x\" | \"q\"\nn ::= \"\" | \"n\"", "left recursion through rule root"},
    {"3", "root ::= \"a\" x\nx ::= x", "accepts no string"},
    {"3", "foo ::= \"a\"", "root"},
    {"3", "root ::= \"a\"\nroot ::= \"b\"", "line 2"},
    {"3", "root ::= [a-", "line 1"},
    {"4", "[1]", "not a string"},
    {NULL, NULL, NULL},
};

static void test_synthetic(void)
{
    struct grammar_vocab *v = synthetic_vocab();
    if (!v) { failures++; return; }
    for (size_t i = 0; i < sizeof samples / sizeof *samples; i++) {
        const struct sample *sm = &samples[i];
        struct grammar *g = NULL;
        if (grammar_compile(v, (enum grammar_kind)sm->kind, sm->src, strlen(sm->src), &g)) {
            EXPECT(0, "sample %zu does not compile: %s", i, status_message());
            continue;
        }
        for (int yn = 0; yn < 2; yn++)
            for (int k = 0; k < 8 && (yn ? sm->no[k] : sm->yes[k]); k++) {
                const char *str = yn ? sm->no[k] : sm->yes[k];
                struct grammar_matcher *m;
                grammar_matcher_new(g, &m);
                int ok = grammar_matcher_accept_bytes(m, str, strlen(str)) == STATUS_OK && grammar_matcher_can_end(m);
                EXPECT(ok == !yn, "sample %zu: '%s' should be %s", i, str, yn ? "refused" : "accepted");
                /* Byte by byte, then roll everything back: same answer, same start mask. */
                grammar_matcher_rollback(m, 1);
                int ok2 = 1;
                size_t n = strlen(str), j;
                for (j = 0; j < n && ok2; j++) ok2 = grammar_matcher_accept_bytes(m, str + j, 1) == STATUS_OK;
                ok2 = ok2 && grammar_matcher_can_end(m);
                EXPECT(ok2 == ok, "sample %zu: '%s' byte by byte differs", i, str);
                grammar_matcher_rollback(m, (int)n + 5);
                EXPECT(grammar_matcher_accept_bytes(m, "", 0) == STATUS_OK, "empty bytes");
                grammar_matcher_free(m);
            }
        for (int w = 0; w < 20; w++) walk_check(g, v, 40, 1, "synthetic walk", NULL, 0);
        grammar_unref(g);
    }
    for (int i = 0; bad[i][0]; i++) {
        struct grammar *g = NULL;
        enum status s = grammar_compile(v, (enum grammar_kind)atoi(bad[i][0]), bad[i][1], strlen(bad[i][1]), &g);
        EXPECT(s == STATUS_INVALID_ARGUMENT && strstr(status_message(), bad[i][2]),
               "bad input %d should fail naming '%s': got %d '%s'", i, bad[i][2], (int)s, s ? status_message() : "");
        grammar_unref(g);
    }
    /* The cache: same source, same grammar; capacity respected. */
    struct grammar_cache *c;
    EXPECT(grammar_cache_new(v, 2, &c) == STATUS_OK, "cache");
    struct grammar *a = NULL, *b = NULL, *d = NULL;
    EXPECT(!grammar_cache_get(c, GRAMMAR_REGEX, "a+", 2, &a) && !grammar_cache_get(c, GRAMMAR_REGEX, "a+", 2, &b) && a == b, "cache hit");
    EXPECT(grammar_cache_get(c, GRAMMAR_REGEX, "a(", 2, &d) == STATUS_INVALID_ARGUMENT, "cache error");
    grammar_unref(a), grammar_unref(b);
    for (int i = 0; i < 5; i++) {
        char re[8];
        snprintf(re, sizeof re, "x{%d}", i + 1);
        EXPECT(!grammar_cache_get(c, GRAMMAR_REGEX, re, strlen(re), &a), "cache fill");
        grammar_unref(a);
    }
    grammar_cache_free(c);
    /* End tokens and done. */
    struct grammar *g;
    grammar_compile(v, GRAMMAR_CHOICE, "[\"ab\",\"abc\"]", 12, &g);
    struct grammar_matcher *m;
    grammar_matcher_new(g, &m);
    EXPECT(grammar_matcher_accept(m, SYN_END) == STATUS_INVALID_ARGUMENT, "end before complete");
    EXPECT(grammar_matcher_accept(m, 256 + 19) == STATUS_OK, "token ab"); /* "ab" */
    EXPECT(grammar_matcher_can_end(m) && !grammar_matcher_is_done(m), "ab can end, c may follow");
    EXPECT(grammar_matcher_accept(m, SYN_MODEL - 1) == STATUS_INVALID_ARGUMENT, "padding row");
    EXPECT(grammar_matcher_accept(m, 'c') == STATUS_OK && grammar_matcher_is_done(m), "abc done");
    grammar_matcher_rollback(m, 1);
    EXPECT(grammar_matcher_accept(m, SYN_END) == STATUS_OK && grammar_matcher_is_done(m), "end accepted");
    grammar_matcher_free(m);
    grammar_unref(g);
    grammar_vocab_free(v);
}

/* Threads: four threads walk the same grammar at once (filling its shared mask entries
 * concurrently) and each mask must equal what a single thread computes afterwards on a fresh
 * copy of the grammar. Run under ASan in the unit label; TSan is not part of the build. */
struct thread_arg { struct grammar *g; const struct grammar_vocab *v; int seed; int32_t tokens[64]; uint32_t masks[64][(SYN_MODEL + 31) / 32]; int n; };

static void *thread_walk(void *p)
{
    struct thread_arg *a = p;
    struct grammar_matcher *m;
    if (grammar_matcher_new(a->g, &m)) return NULL;
    uint64_t r = 0x9E3779B97F4A7C15ull * (uint64_t)(a->seed + 1);
    for (a->n = 0; a->n < 64 && !grammar_matcher_is_done(m); a->n++) {
        if (grammar_matcher_fill_mask(m, a->masks[a->n])) break;
        int32_t allowed[SYN_MODEL], k = 0;
        for (int t = 0; t < SYN_MODEL; t++)
            if (a->masks[a->n][t >> 5] >> (t & 31) & 1) allowed[k++] = t;
        if (!k) break;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        a->tokens[a->n] = allowed[r % (uint64_t)k];
        grammar_matcher_accept(m, a->tokens[a->n]);
    }
    grammar_matcher_free(m);
    return NULL;
}

static void test_threads(void)
{
    struct grammar_vocab *v = synthetic_vocab();
    const char *src = samples[1].src; /* the recursive linked list */
    struct grammar *g, *fresh;
    if (!v || grammar_compile(v, GRAMMAR_JSON_SCHEMA, src, strlen(src), &g)) { failures++; grammar_vocab_free(v); return; }
    static struct thread_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i].g = g, args[i].v = v, args[i].seed = i;
        pthread_create(&th[i], NULL, thread_walk, &args[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    grammar_compile(v, GRAMMAR_JSON_SCHEMA, src, strlen(src), &fresh);
    uint32_t mask[(SYN_MODEL + 31) / 32];
    for (int i = 0; i < 4; i++) {
        struct grammar_matcher *m;
        grammar_matcher_new(fresh, &m);
        for (int s = 0; s < args[i].n; s++) {
            EXPECT(grammar_matcher_fill_mask(m, mask) == STATUS_OK, "thread %d step %d: %s", i, s, status_message());
            EXPECT(!memcmp(mask, args[i].masks[s], sizeof mask), "thread %d step %d: mask differs from one thread's", i, s);
            grammar_matcher_accept(m, args[i].tokens[s]);
        }
        grammar_matcher_free(m);
    }
    grammar_unref(fresh), grammar_unref(g);
    grammar_vocab_free(v);
}

static enum status load_gguf_tokenizer(const char *path, struct tokenizer **t)
{
    struct gguf *gg = NULL;
    void *data = NULL;
    size_t len = 0;
    enum status s = gguf_open(path, &gg);
    if (s == STATUS_OK) s = gguf_tokenizer_model_proto(gg, &data, &len);
    if (s == STATUS_OK) s = tokenizer_load_from_memory(data, len, t);
    free(data);
    gguf_close(gg);
    return s;
}

static struct grammar_vocab *real_vocab(const char *path, struct tokenizer **tok)
{
    struct stat st;
    if (path && !strcmp(path, "synthetic")) return synthetic_vocab();
    if (!path || stat(path, &st)) return NULL;
    if (load_gguf_tokenizer(path, tok)) {
        fprintf(stderr, "%s: %s\n", path, status_message());
        failures++;
        return NULL;
    }
    int32_t ends[2] = {tokenizer_eos_id(*tok), -1};
    int n_end = ends[0] >= 0;
    struct grammar_vocab *v = NULL;
    if (grammar_vocab_new(*tok, tokenizer_vocab_size(*tok) + 7, ends, n_end, &v)) {
        fprintf(stderr, "vocab: %s\n", status_message());
        failures++;
    }
    return v;
}

static int v_model(const struct grammar_vocab *v) { return grammar_vocab_mask_words(v) * 32; }

static const char *nested_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},\"address\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":\"string\",\"pattern\":\"^[0-9]{5}$\"}},\"required\":[\"city\"]}},"
    "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}";

static void test_real(const char *path, int steps)
{
    struct tokenizer *tok = NULL;
    struct grammar_vocab *v = real_vocab(path, &tok);
    if (!v) {
        printf("SKIP real vocabulary: no %s\n", path ? path : "(path)");
        tokenizer_free(tok);
        return;
    }
    /* token bytes against decode for ids whose text is plain ASCII without spaces at the start */
    int checked = 0;
    for (int id = 0; id < tokenizer_vocab_size(tok); id += 97) {
        char buf[1024];
        int n = tokenizer_token_bytes(tok, id, buf, (int)sizeof buf);
        int32_t ids[2] = {id, id};
        char *text;
        size_t len;
        if (n <= 0 || tokenizer_decode(tok, ids, 2, &text, &len)) continue;
        /* Complete UTF-8 only (decode writes U+FFFD for broken bytes); SentencePiece drops the
         * first piece's leading space (add_dummy_prefix), so the second copy is compared. */
        int valid = 1;
        for (int k = 0; k < n && valid;) {
            uint8_t c = (uint8_t)buf[k];
            int l = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
            if (!l || k + l > n) valid = 0;
            for (int q = 1; valid && q < l; q++) valid = ((uint8_t)buf[k + q] & 0xC0) == 0x80;
            k += l ? l : 1;
        }
        if (valid) {
            EXPECT(len >= (size_t)n && !memcmp(text + len - n, buf, (size_t)n), "%s: token %d bytes differ from decode", path, id);
            checked++;
        }
        free(text);
    }
    EXPECT(checked > 50, "%s: only %d tokens checked", path, checked);
    const char *srcs[][2] = {{"0", nested_schema}, {"1", ""}, {"2", "[a-z ]{1,20}(, [a-z]+)*\\."}};
    for (int i = 0; i < 3; i++) {
        struct grammar *g;
        if (grammar_compile(v, (enum grammar_kind)atoi(srcs[i][0]), srcs[i][1], strlen(srcs[i][1]), &g)) {
            EXPECT(0, "compile: %s", status_message());
            continue;
        }
        for (int w = 0; w < 2; w++) walk_check(g, v, steps, 1, path, NULL, 0);
        grammar_unref(g);
    }
    /* A long counted repetition: masks deep in the chain, where entries are keyed by a link
     * near its start (grammar_pda.c canonical_pos), against brute force. */
    struct grammar *g;
    const char *re = "[a-z ]{0,600}!";
    if (!grammar_compile(v, GRAMMAR_REGEX, re, strlen(re), &g)) {
        struct grammar_matcher *m;
        grammar_matcher_new(g, &m);
        int words = grammar_vocab_mask_words(v);
        uint32_t *mask = malloc(sizeof *mask * (size_t)words);
        for (int round = 0; round < 3; round++) {
            for (int k = 0; k < 90; k++) grammar_matcher_accept_bytes(m, "ab ", 3);
            EXPECT(grammar_matcher_fill_mask(m, mask) == STATUS_OK, "%s: %s", path, status_message());
            int bad = 0;
            for (int t = 0; t < words * 32 && t < v_model(v); t++) {
                int bit = mask[t >> 5] >> (t & 31) & 1, ok = grammar_matcher_accept(m, t) == STATUS_OK;
                if (ok) grammar_matcher_rollback(m, 1);
                if (ok != bit && bad++ < 3) EXPECT(0, "%s: long repetition, round %d, token %d: mask %d accept %d", path, round, t, bit, ok);
            }
        }
        free(mask);
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    grammar_vocab_free(v);
    tokenizer_free(tok);
}

static char *read_all(FILE *f, size_t *n)
{
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    *n = 0;
    size_t k;
    while ((k = fread(buf + *n, 1, cap - *n - 1, f)) > 0) {
        *n += k;
        if (*n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[*n] = 0;
    return buf;
}

static struct grammar *tool_compile(const struct grammar_vocab *v, const char *kind, const char *file)
{
    FILE *f = fopen(file, "rb");
    if (!f) { fprintf(stderr, "%s: cannot open\n", file); exit(2); }
    size_t n;
    char *src = read_all(f, &n);
    fclose(f);
    struct grammar *g = NULL;
    if (kind_of(kind) < 0 || grammar_compile(v, (enum grammar_kind)kind_of(kind), src, n, &g)) {
        printf("error: %s\n", status_message());
        free(src);
        return NULL;
    }
    free(src);
    return g;
}

/* The work bound of one mask (grammar_pda.c MASK_WORK; the fuzzing finding of 2026-11-29,
 * tests/fuzz/corpus/grammar/regress-regex-state-explosion*): nested counted repeats of optional
 * items keep thousands of parses alive; the mask fails with STATUS_INVALID_ARGUMENT and a
 * message instead of taking minutes. GBNF, where the body's "" hides behind the rule o (a regex
 * body that derives "" is rewritten: the samples above). At the start the compile itself fails
 * (grammar_compile computes the first mask); after "a" the mask fails, and the matcher still
 * takes tokens. The same shape one level less deep stays under the bound. */
static void test_work_bound(void)
{
    struct grammar_vocab *v = synthetic_vocab();
    if (!v) { failures++; return; }
    uint32_t mask[(SYN_MODEL + 31) / 32];
    const char *at_start = "root ::= ((o o o){16}){16}\no ::= [^\\x00]?\n";
    struct grammar *g = NULL;
    enum status st = grammar_compile(v, GRAMMAR_EBNF, at_start, strlen(at_start), &g);
    EXPECT(st == STATUS_INVALID_ARGUMENT && !g && strstr(status_message(), "too ambiguous"),
           "%s: compile gave %d '%s', not the work bound", at_start, (int)st, status_message());
    grammar_unref(g);
    /* grammar_parse stops before that mask: the same source parses, and its first mask (computed
     * by the matcher) meets the same bound. */
    g = NULL;
    st = grammar_parse(v, GRAMMAR_EBNF, at_start, strlen(at_start), &g);
    EXPECT(st == STATUS_OK && g, "%s: grammar_parse gave %d '%s'", at_start, (int)st, status_message());
    if (g) {
        struct grammar_matcher *m = NULL;
        st = grammar_matcher_new(g, &m);
        if (st == STATUS_OK) st = grammar_matcher_fill_mask(m, mask);
        EXPECT(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "too ambiguous"),
               "%s: the parsed grammar's first mask gave %d '%s', not the work bound", at_start, (int)st, status_message());
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    g = NULL;
    EXPECT(grammar_parse(v, GRAMMAR_EBNF, "root ::= x", 10, &g) == STATUS_INVALID_ARGUMENT && !g && status_message()[0],
           "grammar_parse took an undefined rule");
    const char *srcs[] = {"root ::= \"a\" ((o o o){16}){16}\no ::= [^\\x00]?\n", "root ::= \"a\" ((o o o){4}){4}\no ::= [^\\x00]?\n"};
    for (int i = 0; i < 2; i++) {
        struct grammar_matcher *m = NULL;
        g = NULL;
        if (grammar_compile(v, GRAMMAR_EBNF, srcs[i], strlen(srcs[i]), &g) || grammar_matcher_new(g, &m) ||
            grammar_matcher_accept(m, 'a')) {
            EXPECT(0, "%s: %s", srcs[i], status_message());
            grammar_matcher_free(m);
            grammar_unref(g);
            continue;
        }
        memset(mask, 0xff, sizeof mask);
        st = grammar_matcher_fill_mask(m, mask);
        if (i == 0) {
            EXPECT(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "too ambiguous"),
                   "%s: fill_mask gave %d '%s', not the work bound", srcs[i], (int)st, status_message());
            int zero = 1;
            for (size_t w = 0; w < sizeof mask / sizeof *mask; w++) zero &= !mask[w];
            EXPECT(zero, "%s: a failed mask is not all zero", srcs[i]);
        } else {
            EXPECT(st == STATUS_OK, "%s: %s", srcs[i], status_message());
            EXPECT(mask['x' >> 5] >> ('x' & 31) & 1, "%s: 'x' not allowed after 'a'", srcs[i]);
        }
        EXPECT(grammar_matcher_accept(m, 'x') == STATUS_OK, "%s: 'x' refused after the mask", srcs[i]);
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    /* One level more: a byte's closure passes MAX_WORK steps. The step fails with the error
     * (grammar_matcher_overflowed), where until 2026-11-29 it went on with parses dropped. The
     * prefix is longer than any token, so that the compile's first mask does not reach it. */
    const char *deep = "root ::= \"qqqqqqqq\" (((o o o o){20}){20}){20}\no ::= [^\\x00]?\n";
    struct grammar_matcher *m = NULL;
    g = NULL;
    if (grammar_compile(v, GRAMMAR_EBNF, deep, strlen(deep), &g)) {
        EXPECT(0, "%s: %s", deep, status_message());
    } else {
        st = grammar_matcher_new(g, &m);
        int over = st != STATUS_OK;
        if (st == STATUS_OK) st = grammar_matcher_accept_bytes(m, "qqqqqqqq", 8), over = grammar_matcher_overflowed(m);
        EXPECT(st == STATUS_INVALID_ARGUMENT && over && strstr(status_message(), "too ambiguous"),
               "%s: gave %d '%s', not the closure bound", deep, (int)st, status_message());
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    grammar_vocab_free(v);
}

int main(int argc, char **argv)
{
    if (argc >= 4 && (!strcmp(argv[1], "check") || !strcmp(argv[1], "compile"))) {
        struct grammar_vocab *v = synthetic_vocab();
        struct grammar *g = tool_compile(v, argv[2], argv[3]);
        if (g && !strcmp(argv[1], "compile")) printf("ok\n");
        if (g && !strcmp(argv[1], "check")) {
            char *line = NULL;
            size_t cap = 0;
            ssize_t len;
            char *bytes = NULL;
            while ((len = getline(&line, &cap, stdin)) > 0) {
                while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
                bytes = realloc(bytes, (size_t)len / 2 + 1);
                for (ssize_t k = 0; k + 1 < len; k += 2) {
                    unsigned x;
                    sscanf(line + k, "%2x", &x);
                    bytes[k / 2] = (char)x;
                }
                struct grammar_matcher *m = NULL;
                enum status s = grammar_matcher_new(g, &m);
                if (s == STATUS_OK) s = grammar_matcher_accept_bytes(m, bytes, (size_t)len / 2);
                printf("%s\n", !m || (s && grammar_matcher_overflowed(m)) ? "too ambiguous"
                                : s                                      ? "reject"
                                : grammar_matcher_can_end(m)             ? "complete"
                                                                         : "prefix");
                grammar_matcher_free(m);
            }
            free(line), free(bytes);
        }
        grammar_unref(g);
        grammar_vocab_free(v);
        return g ? 0 : 1;
    }
    if (argc >= 7 && !strcmp(argv[1], "walk")) {
        struct tokenizer *tok = NULL;
        struct grammar_vocab *v = real_vocab(argv[4], &tok);
        if (!v) { printf("SKIP: no vocabulary %s\n", argv[4]); return 77; }
        struct grammar *g = tool_compile(v, argv[2], argv[3]);
        if (!g) return 1;
        rng ^= (uint64_t)atoll(argv[5]) * 0x9E3779B97F4A7C15ull;
        char *out = malloc(1 << 16);
        for (int i = 0; i < atoi(argv[6]); i++) {
            int done = walk_check(g, v, 300, 0, "walk", out, 1 << 16) < 300;
            for (char *p = out; *p; p++) printf("%02x", (uint8_t)*p);
            printf("%s\n", done ? " done" : "");
        }
        free(out);
        grammar_unref(g);
        grammar_vocab_free(v);
        tokenizer_free(tok);
        return failures ? 1 : 0;
    }
    test_synthetic();
    test_threads();
    test_work_bound();
    test_real(argc > 1 ? argv[1] : NULL, 12);
    test_real(argc > 2 ? argv[2] : NULL, 3);
    if (failures) {
        printf("test_grammar: %d failures\n", failures);
        return 1;
    }
    printf("test_grammar: ok\n");
    return 0;
}
