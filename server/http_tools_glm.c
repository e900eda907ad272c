/* server/http_tools_glm.c - the grammar of the XML-like tool calls (tool_format.h
 * tool_format_is_xml: GLM-4.5's, Qwen3-Coder's, MiniMax-M2's, DeepSeek V3.2's and V4's DSML) for
 * tool_choice required or a named
 * function, and
 * lazily for auto (http_tools.c): a GBNF grammar (engine/grammar, llama.cpp's syntax) of the reply
 *
 *   GLM:  [\n] [<think>...</think>] [\n] <tool_call>NAME\n(<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n)*</tool_call>
 *   Qwen: [\n] [\n][\n] <tool_call>\n<function=NAME>\n(<parameter=K>\nV\n</parameter>\n)*</function>\n</tool_call>
 *   MiniMax-M2: [\n] [\n] <minimax:tool_call> ([\n]<invoke name="NAME">\n(<parameter name="K">V</parameter>\n)*</invoke>)+ [\n]</minimax:tool_call>
 *   DSML: [\n] [\n] <｜DSML｜function_calls> ([\n]<｜DSML｜invoke name="NAME">\n(<｜DSML｜parameter name="K" string="S">V</｜DSML｜parameter>\n)*</｜DSML｜invoke>)+ [\n]</｜DSML｜function_calls>
 *         (V4: tool_calls for function_calls; S "true" before a string value, written as it is, "false"
 *         before any other, written as JSON)
 *
 * (GLM writes "\n<think>" after <|assistant|>, so its grammar holds the reasoning, any text
 * without "</think>". Qwen3.5's <think> is the engine's to allow, as for the JSON formats: its
 * prompt opens it by default (the grammar starts after </think>), closes it under enable_thinking
 * false (the calls come at once), and otherwise gen_prompt.c constrain_around_think makes the
 * constraint an opening one, the grammar or <think>; MiniMax-M2's prompt always opens it; DeepSeek
 * V3.2's and V4's prompts open and close it as their `thinking` says.)
 * with one call, or (parallel_tool_calls) one or more (MiniMax: in one block); lazy (tool_choice
 * auto), the grammar of what follows the first <tool_call> (<minimax:tool_call>: the trigger, the
 * text before it is free). NAME is one of
 * the declared tools (the named one only); the keys are the function's declared properties, in
 * their declared order, each required one present, each optional one at most once (a function
 * without properties takes none; additionalProperties is not read). A value is lexically of its
 * property's type: an integer, a number, true / false or null as JSON writes them (Qwen: also
 * Python's True, False and None, as its template writes them), an enum of scalars one of its
 * values (a string as it is, the others as JSON); a string, object, array or an untyped value is
 * any text without the value's closing tag (the templates write a string as it is, other values
 * as JSON; the parser, tool_glm.c, reads a value by its declared type, and ends it at the first
 * closing tag). So every call parses, to a declared
 * function with its declared keys; nested schemas, patterns and bounds are not enforced (a tool's
 * `strict: true` is refused for these formats: http_tools.c).
 * Tests: tests/server/test_tools_glm.py and test_tools_qwen_xml.py (the templates' own renderings
 * in jinja2, and mutations of them, decided by the grammar engine; required and named replies,
 * every one calls of the declared function with its keys and value types, through the `openai`
 * package). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http_internal.h"
#include "tool_format.h"
#include "tool_stream_impl.h" /* the DSML tags */

struct gbnf {
    char  *p;
    size_t len, cap;
};

static void put(struct gbnf *g, const char *s) { http_buf_append(&g->p, &g->len, &g->cap, s, strlen(s)); }

/* s (UTF-8) as a GBNF literal: quoted, with ", \ and the ASCII control bytes as \xHH (a code
 * point in GBNF: only below 0x80 is it the byte); other UTF-8 as it is. */
static void put_lit(struct gbnf *g, const char *s)
{
    put(g, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char b[8];
        if (*c == '"' || *c == '\\' || *c < 0x20 || *c == 0x7f) snprintf(b, sizeof b, "\\x%02X", *c);
        else b[0] = (char)*c, b[1] = 0;
        put(g, b);
    }
    put(g, "\"");
}

/* The length of the UTF-8 character at s (1 for a byte that does not start one). */
static size_t utf8_len(const char *s)
{
    const unsigned char c = (unsigned char)*s;
    const size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    for (size_t i = 1; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80) return 1;
    return n;
}

/* c's len bytes as they go inside a GBNF literal or class: '"', '\\' and ']' as \xHH, the rest
 * as they are. */
static void put_char(struct gbnf *g, const char *c, int len)
{
    char b[8];
    if (len == 1 && (*c == '"' || *c == '\\' || *c == ']')) snprintf(b, sizeof b, "\\x%02X", (unsigned char)*c);
    else snprintf(b, sizeof b, "%.*s", len, c);
    put(g, b);
}

/* Rules name0 .. name(n-1) of the texts that do not hold lit (n its characters; its first, '<',
 * its only '<'; ASCII but for UTF-8 characters), name0 the start:
 * state k has read lit's first k characters last; each rule may end (the text may stop anywhere:
 * lit follows it in the grammar, and its first occurrence ends the text, as the parser reads it).
 * Runs of other characters repeat within a rule; a rule calls the next only at a character of
 * lit, so the nesting grows with the text's '<' only. */
static void put_until(struct gbnf *g, const char *name, const char *lit)
{
    char line[200];
    snprintf(line, sizeof line, "%s0 ::= [^<]* (\"<\" %s1)?\n", name, name);
    put(g, line);
    size_t k = 1;
    for (const char *c = lit + 1; *c; k++) {
        const int len = (int)utf8_len(c);
        const char *next = c + len;
        snprintf(line, sizeof line, "%s%zu ::= (", name, k);
        put(g, line);
        if (*next) {
            put(g, "\"");
            put_char(g, c, len);
            snprintf(line, sizeof line, "\" %s%zu | ", name, k + 1);
            put(g, line);
        }
        snprintf(line, sizeof line, "\"<\" %s1 | [^<", name);
        put(g, line);
        put_char(g, c, len);
        snprintf(line, sizeof line, "] %s0)?\n", name);
        put(g, line);
        c = next;
    }
}

/* Format f's calls, as GBNF snippets (quoted literals) but for `tag`, the raw closing tag a
 * string value may not hold (the file's head). */
struct xml_shape {
    const char *marker;     /* what opens a block of calls (the lazy grammar's trigger) */
    const char *between;    /* before each further call (parallel calls) */
    const char *end;        /* after the last call: the block's end, or "" */
    const char *open;       /* before the name */
    const char *name_end;   /* after the name */
    const char *key_open, *key_close; /* around a key */
    const char *value_end;  /* after a value */
    const char *tag;        /* the raw tag value_end holds */
    const char *close;      /* after the arguments: the call's end */
    const char *before;     /* what may come before the first marker (after the reasoning) */
    int think;              /* the reasoning is the grammar's (GLM writes "\n<think>") */
    int python;             /* booleans and null also as Python writes them (Qwen's `string`) */
    int string_attr;        /* key_close is `" string="S">`, S true before a string, else false (DSML) */
    const char *key_end;    /* where the parser ends a key (named in the 400 of a key holding it) */
    const char *key_stops;  /* the bytes a key may not hold (NULL: key_end itself, GLM's tag) */
    const char *label;      /* the format's calls, for the 400 of `strict: true` */
};

static const struct xml_shape GLM = {
    "\"<tool_call>\"", "\"\\n\"? \"<tool_call>\"", "", "", "\"\\n\"", "\"<arg_key>\" ", " \"</arg_key>\\n<arg_value>\" ",
    "\"</arg_value>\\n\"", "</arg_value>", "\"</tool_call>\"", "\"\\n\"?", 1, 0, 0, "</arg_key>", NULL,
    "GLM-4.5's <arg_key> / <arg_value> pairs"};
static const struct xml_shape QWEN = {
    "\"<tool_call>\"", "\"\\n\"? \"<tool_call>\"", "", "\"\\n<function=\" ", "\">\\n\"", "\"<parameter=\" ", " \">\\n\" ",
    "\"\\n</parameter>\\n\"", "</parameter>", "\"</function>\\n</tool_call>\"", "\"\\n\"? \"\\n\"?", 0, 1, 0, ">", "><\n",
    "Qwen3-Coder's <function=...> / <parameter=...> tags"};
/* Seed-OSS: Qwen's tags in <seed:tool_call>, a value as it is between its tags */
static const struct xml_shape SEED = {
    "\"<seed:tool_call>\"", "\"\\n\"? \"<seed:tool_call>\"", "", "\"\\n<function=\" ", "\">\\n\"", "\"<parameter=\" ", " \">\" ",
    "\"</parameter>\\n\"", "</parameter>", "\"</function>\\n</seed:tool_call>\"", "\"\\n\"? \"\\n\"?", 0, 1, 0, ">", "><\n",
    "Seed-OSS's <function=...> / <parameter=...> tags"};
/* MiniMax-M2: one block of <invoke>s, its values raw (strings) or JSON, as GLM's */
static const struct xml_shape MINIMAX = {
    "\"<minimax:tool_call>\"", "", " \"\\n\"? \"</minimax:tool_call>\"", "\"\\n\"? \"<invoke name=\\\"\" ", "\"\\\">\\n\"",
    "\"<parameter name=\\\"\" ", " \"\\\">\" ", "\"</parameter>\\n\"", "</parameter>", "\"</invoke>\"", "\"\\n\"?", 0, 0, 0, "\"", "\"<\n",
    "MiniMax-M2's <invoke> / <parameter> tags"};
/* DeepSeek V3.2 / V4: MiniMax's shape in ｜DSML｜ tags; key_close per value (string_attr) */
#define DSML_SHAPE(block)                                                                                           \
    {"\"" TOOL_DSML block ">\"", "", " \"\\n\"? \"" TOOL_DSML_END block ">\"", "\"\\n\"? \"" TOOL_DSML "invoke name=\\\"\" ",      \
     "\"\\\">\\n\"", "\"" TOOL_DSML "parameter name=\\\"\" ", NULL, "\"" TOOL_DSML_END "parameter>\\n\"", TOOL_DSML_END "parameter>", \
     "\"\\n\"? \"" TOOL_DSML_END "invoke>\"", "\"\\n\"? \"\\n\"?", 0, 0, 1, "\"", "\"<\n",                     \
     "DeepSeek's DSML <invoke> / <parameter> tags"} /* (V4: "\n" more without arguments) */
static const struct xml_shape DSML = DSML_SHAPE("function_calls"), DSML_V4 = DSML_SHAPE("tool_calls");
/* Gemma 4: its keys and label only (its grammar is gemma4_grammar's); a bare key ends at ':' */
static const struct xml_shape GEMMA4 = {.key_end = ":", .key_stops = ":{}[],<", .label = "Gemma 4's call:NAME{...} notation"};

/* The value rule of a property's schema (a rule name of the shared ones, or an enum of strings
 * written in place). */
static void put_value(struct gbnf *g, const struct xml_shape *x, const cJSON *schema)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(schema, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(schema, "enum");
    int scalars = cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0;
    for (const cJSON *v = scalars ? en->child : NULL; v; v = v->next)
        scalars &= (cJSON_IsString(v) && !strstr(v->valuestring, x->tag)) || cJSON_IsNumber(v) || cJSON_IsBool(v) ||
                   cJSON_IsNull(v);
    static const char raw[] = "\"\\\" string=\\\"true\\\">\" ", json[] = "\"\\\" string=\\\"false\\\">\" ";
    if (scalars) { /* each as the template writes it: a string as it is, the rest as JSON */
        put(g, "(");
        for (const cJSON *v = en->child; v; v = v->next) {
            char *text = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
            if (v != en->child) put(g, " | ");
            if (x->string_attr) put(g, text ? json : raw);
            put_lit(g, text ? text : v->valuestring);
            free(text);
        }
        put(g, ")");
        return;
    }
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    if (x->string_attr) put(g, !*t || !strcmp(t, "string") ? raw : json); /* (untyped: may be a string) */
    put(g, !strcmp(t, "integer") ? "int" : !strcmp(t, "number") ? "num" : !strcmp(t, "boolean") ? "bool"
           : !strcmp(t, "null") ? "nul" : "value0");
}

static int is_required(const cJSON *required, const char *key)
{
    for (const cJSON *r = cJSON_IsArray(required) ? required->child : NULL; r; r = r->next)
        if (cJSON_IsString(r) && !strcmp(r->valuestring, key)) return 1;
    return 0;
}

/* The rule of function k's call body: its name, then its arguments. */
static void put_call(struct gbnf *g, const struct xml_shape *x, const cJSON *fn, int k)
{
    char rule[32];
    snprintf(rule, sizeof rule, "call%d ::= ", k);
    put(g, rule);
    put_lit(g, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    put(g, " ");
    put(g, x->name_end);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(params, "required");
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next) {
        put(g, " (");
        put(g, x->key_open);
        put_lit(g, p->string);
        if (x->key_close) put(g, x->key_close); /* (string_attr: put_value's) */
        put_value(g, x, p);
        put(g, " ");
        put(g, x->value_end);
        put(g, ")");
        if (!is_required(required, p->string)) put(g, "?");
    }
    put(g, "\n"); /* (no declared keys: no arguments) */
}

/* The shape of XML-like format f (GLM's for any other). */
static const struct xml_shape *shape_of(int f)
{
    return f == TOOL_FORMAT_QWEN_XML ? &QWEN : f == TOOL_FORMAT_MINIMAX ? &MINIMAX : f == TOOL_FORMAT_DSML ? &DSML
         : f == TOOL_FORMAT_DSML_V4 ? &DSML_V4 : f == TOOL_FORMAT_GEMMA4 ? &GEMMA4 : f == TOOL_FORMAT_SEED_OSS ? &SEED : &GLM;
}

const char *http_tools_xml_label(int f) { return shape_of(f)->label; }

/* The function of the tool after the one whose function is prev (NULL: the first) among tools,
 * only the one named `only` when it is not NULL; NULL after the last. */
static const cJSON *next_function(const cJSON *tools, const cJSON *prev, const char *only)
{
    const cJSON *t = tools->child;
    if (prev) /* (the tool whose function prev is) */
        while (t && cJSON_GetObjectItemCaseSensitive(t, "function") != prev) t = t->next;
    for (t = prev ? (t ? t->next : NULL) : t; t; t = t->next) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        if (!only || !strcmp(cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring, only)) return fn;
    }
    return NULL;
}

/* `call0 | call1 | ...`: one rule reference per function (next_function's). */
static void put_refs(struct gbnf *g, const cJSON *tools, const char *only)
{
    int k = 0;
    for (const cJSON *fn = NULL; (fn = next_function(tools, fn, only)); k++) {
        char ref[24];
        snprintf(ref, sizeof ref, "%scall%d", k ? " | " : "", k);
        put(g, ref);
    }
}

/* ---- Gemma 4 ---- */

#define G4_QUOTE "\"<|\\x22|>\"" /* <|"|> as a GBNF literal */

/* Gemma 4's value rule for a property's schema: an enum of scalars one of its values (a string
 * between marks, the rest as JSON), a string between marks, an integer, a number, a boolean or
 * null as JSON writes them, anything else (object, array, untyped) any of its values (g4value). */
static void g4_value(struct gbnf *g, const cJSON *schema)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(schema, "type");
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(schema, "enum");
    int scalars = cJSON_IsArray(en) && cJSON_GetArraySize(en) > 0;
    for (const cJSON *v = scalars ? en->child : NULL; v; v = v->next)
        scalars &= (cJSON_IsString(v) && !strstr(v->valuestring, TOOL_GEMMA4_QUOTE)) || cJSON_IsNumber(v) || cJSON_IsBool(v) ||
                   cJSON_IsNull(v);
    if (scalars) {
        put(g, "(");
        for (const cJSON *v = en->child; v; v = v->next) {
            char *text = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
            if (v != en->child) put(g, " | ");
            if (!text) put(g, G4_QUOTE " ");
            put_lit(g, text ? text : v->valuestring);
            if (!text) put(g, " " G4_QUOTE);
            free(text);
        }
        put(g, ")");
        return;
    }
    const char *t = cJSON_IsString(type) ? type->valuestring : "";
    put(g, !strcmp(t, "string") ? "g4str" : !strcmp(t, "integer") ? "int" : !strcmp(t, "number") ? "num"
           : !strcmp(t, "boolean") ? "bool" : !strcmp(t, "null") ? "nul" : "g4value");
}

static int key_order(const void *a, const void *b)
{
    const cJSON *x = *(const cJSON *const *)a, *y = *(const cJSON *const *)b;
    const int c = strcasecmp(x->string, y->string);
    return c ? c : strcmp(x->string, y->string);
}

/* Function k's call, `NAME{K:V,...}`: its declared keys in the order its template writes them
 * (Jinja's dictsort: by name, case aside), each required one present, each optional one at most
 * once, commas between them. Rules callK, then aK_i (the arguments from key i on, the first
 * without a comma) and rK_i (from key i on, after an argument: each with its comma). */
static void g4_call(struct gbnf *g, const cJSON *fn, int k)
{
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    const cJSON *required = cJSON_GetObjectItemCaseSensitive(params, "required");
    int n = 0;
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next) n++;
    const cJSON **keys = calloc((size_t)n + 1, sizeof *keys);
    if (!keys) abort(); /* (the grammar's buffer stops the process when out of memory, too) */
    n = 0;
    for (const cJSON *p = cJSON_IsObject(props) ? props->child : NULL; p; p = p->next) keys[n++] = p;
    qsort(keys, (size_t)n, sizeof *keys, key_order);
    char line[96];
    snprintf(line, sizeof line, "call%d ::= ", k);
    put(g, line);
    put_lit(g, cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
    snprintf(line, sizeof line, " \"{\" a%d_0 \"}\"\n", k);
    put(g, line);
    for (int i = 0; i <= n; i++) {
        if (i == n) {
            snprintf(line, sizeof line, "a%d_%d ::= \"\"\nr%d_%d ::= \"\"\n", k, i, k, i);
            put(g, line);
            break;
        }
        const int req = is_required(required, keys[i]->string);
        snprintf(line, sizeof line, "i%d_%d ::= ", k, i);
        put(g, line);
        char *key = malloc(strlen(keys[i]->string) + 2);
        if (!key) abort();
        sprintf(key, "%s:", keys[i]->string);
        put_lit(g, key);
        free(key);
        put(g, " ");
        g4_value(g, keys[i]);
        snprintf(line, sizeof line, "\na%d_%d ::= i%d_%d r%d_%d%s", k, i, k, i, k, i + 1, req ? "" : " | ");
        put(g, line);
        if (!req) {
            snprintf(line, sizeof line, "a%d_%d", k, i + 1);
            put(g, line);
        }
        snprintf(line, sizeof line, "\nr%d_%d ::= %s\",\" i%d_%d%s r%d_%d\n", k, i, req ? "" : "(", k, i, req ? "" : ")?", k,
                 i + 1);
        put(g, line);
    }
    free(keys);
}

/* The grammar of Gemma 4's calls (tool_format.h TOOL_FORMAT_GEMMA4): `<|tool_call>call:NAME{...}
 * <tool_call|>`, back to back when parallel; lazy: what follows the first <|tool_call>. A value
 * written by its type as its template writes it: a string between <|"|> marks (any text
 * without the mark), an object with bare keys, a list, a JSON number, true / false, null. */
static char *gemma4_grammar(const cJSON *tools, const char *only, int parallel, int lazy)
{
    struct gbnf g = {0};
    put(&g, "root ::= ");
    if (!lazy) put(&g, "\"" TOOL_GEMMA4_CALL "\" ");
    put(&g, parallel ? "body (\"" TOOL_GEMMA4_CALL "\" body)*\nbody ::= \"call:\" (" : "body\nbody ::= \"call:\" (");
    put_refs(&g, tools, only);
    put(&g, ") \"" TOOL_GEMMA4_CALL_END "\"\n");
    int k = 0;
    for (const cJSON *fn = NULL; (fn = next_function(tools, fn, only));) g4_call(&g, fn, k++);
    put(&g, "g4str ::= " G4_QUOTE " q0 " G4_QUOTE "\n");
    put_until(&g, "q", TOOL_GEMMA4_QUOTE);
    put(&g, "g4value ::= g4str | g4obj | g4list | num | bool | nul\n"
            "g4obj ::= \"{\" (g4key \":\" g4value (\",\" g4key \":\" g4value)*)? \"}\"\n"
            "g4key ::= [^:{}\\x5B\\x5D,<\\x22 \\t\\n\\r]+\n"
            "g4list ::= \"[\" (g4value (\",\" g4value)*)? \"]\"\n"
            "int ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n"
            "num ::= int (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n"
            "bool ::= \"true\" | \"false\"\nnul ::= \"null\" | \"None\"\n");
    return g.p;
}

char *http_tools_glm_grammar(int f, const cJSON *tools, const char *only, int parallel, int lazy)
{
    if (f == TOOL_FORMAT_GEMMA4) return gemma4_grammar(tools, only, parallel, lazy);
    const struct xml_shape *x = shape_of(f);
    struct gbnf g = {0};
    put(&g, "root ::= ");
    if (!lazy) {
        put(&g, x->think ? "\"\\n\"? (\"<think>\" think0 \"</think>\")? " : "\"\\n\"? ");
        put(&g, x->before);
        put(&g, " ");
    }
    if (lazy != 1) {
        put(&g, x->marker);
        put(&g, " ");
    }
    put(&g, "body");
    if (parallel) {
        put(&g, " (");
        put(&g, x->between);
        put(&g, " body)*");
    }
    put(&g, x->end);
    if (lazy == 2) { /* or Qwen3-Coder's calls without <tool_call> (as llama.cpp and tool_stream.c read them) */
        put(&g, " | bare");
        if (parallel) put(&g, " (\"\\n\"? \"\\n\"? bare)*");
        put(&g, "\nbare ::= \"<function=\" (");
        put_refs(&g, tools, only);
        put(&g, ") \"</function>\"");
    }
    put(&g, "\nbody ::= ");
    put(&g, x->open);
    put(&g, "(");
    put_refs(&g, tools, only);
    put(&g, ") ");
    put(&g, x->close);
    put(&g, "\n");
    int k = 0;
    for (const cJSON *fn = NULL; (fn = next_function(tools, fn, only));) put_call(&g, x, fn, k++);
    put_until(&g, "value", x->tag);
    if (!lazy && x->think) put_until(&g, "think", "</think>");
    put(&g, "int ::= \"-\"? (\"0\" | [1-9] [0-9]*)\n"
            "num ::= int (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n");
    put(&g, x->python ? "bool ::= \"true\" | \"false\" | \"True\" | \"False\"\nnul ::= \"null\" | \"None\"\n"
                      : "bool ::= \"true\" | \"false\"\nnul ::= \"null\"\n");
    return g.p; /* (http_buf_append stops the process when out of memory) */
}

const char *http_tools_xml_unwritable_key(int f, const cJSON *params, const char **key_end)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(params, "properties");
    if (!tool_format_is_xml((enum tool_format)f) || !cJSON_IsObject(props)) return NULL;
    const struct xml_shape *x = shape_of(f);
    *key_end = x->key_end;
    for (const cJSON *p = props->child; p; p = p->next) {
        const char *k = p->string;
        if (x->key_stops ? strpbrk(k, x->key_stops) != NULL : strstr(k, x->key_end) != NULL) return k;
        /* (Gemma 4's bare key is read trimmed, and an empty one is no key) */
        if (x == &GEMMA4 && (!*k || strchr(" \t\n\r", k[0]) || strchr(" \t\n\r", k[strlen(k) - 1]))) return k;
    }
    return NULL;
}
