/* engine/grammar/grammar_schema.c - JSON Schema (the subset real schemas use) and JSON object
 * mode to expression trees. Output is compact canonical JSON: no whitespace at all, properties
 * in schema order (required ones present, optional ones skippable), then additional
 * properties when allowed. Keywords outside the subset are refused naming the keyword and the
 * schema path; annotations (title, description, examples, default, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly) are ignored. docs/grammar.md lists the subset.
 * Numbers and strings: grammar_schema_scalar.c. Tests: tests/test_grammar.c, tests/test_grammar.py
 * (llguidance and jsonschema as oracles). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"
#include "grammar_schema_impl.h"

enum status schema_fail(struct sb *s, const char *path, const char *fmt, const char *arg)
{
    char msg[300];
    snprintf(msg, sizeof msg, fmt, arg);
    return gb_fail(s->b, STATUS_INVALID_ARGUMENT, "json schema: %s: %s", path[0] ? path : "/", msg);
}

/* One character of a JSON string in the canonical form llguidance writes by default: any code
 * point from U+0020 but '"', '\\' and DEL as itself, the short escapes \\" \\\\ \\b \\f \\n \\r \\t,
 * and \\u00XX only for the other control characters (no "\\/", no \\u for printable ones). */
static struct gx *json_escape(struct gbuild *b)
{
    struct gx *simple = gx_byte_range(b, 0, -1);
    for (const char *c = "\"\\bfnrt"; simple && *c; c++) simple->set[(uint8_t)*c >> 5] |= 1u << (*c & 31);
    struct gx *hex = gx_alt2(b, gx_byte_range(b, '0', '9'), gx_alt2(b, gx_byte_range(b, 'a', 'f'), gx_byte_range(b, 'A', 'F')));
    struct gx *u = gx_seq3(b, gx_str(b, "u00"), gx_byte_range(b, '0', '1'), hex);
    return gx_seq2(b, gx_str(b, "\\"), gx_alt2(b, simple, u));
}

struct gx *json_string_char(struct gbuild *b)
{
    uint32_t lo[4] = {0x20, 0x23, 0x5D, 0x80}, hi[4] = {0x21, 0x5B, 0x7E, 0x10FFFF};
    return gx_alt2(b, gx_codepoints(b, lo, hi, 4), json_escape(b));
}

/* The characters a free string (or a free key) writes as themselves: json_string_char's, less
 * the schema's x-shardlm-escape characters. */
static void string_chars(const struct sb *s, struct cpset *out)
{
    cpset_add(out, 0x20, 0x21), cpset_add(out, 0x23, 0x5B), cpset_add(out, 0x5D, 0x7E), cpset_add(out, 0x80, 0x10FFFF);
    for (const char *e = s->escape; *e; e++) {
        const uint32_t c = (uint8_t)*e;
        struct cpset rest = {0};
        for (int r = 0; r < out->n; r++) { /* out minus c */
            if (c < out->lo[r] || c > out->hi[r]) { cpset_add(&rest, out->lo[r], out->hi[r]); continue; }
            if (c > out->lo[r]) cpset_add(&rest, out->lo[r], c - 1);
            if (c < out->hi[r]) cpset_add(&rest, c + 1, out->hi[r]);
        }
        cpset_free(out);
        *out = rest;
    }
}

/* json_escape, and \u00XX (hex digits of either case) for each x-shardlm-escape character. */
static struct gx *string_escape(struct sb *s)
{
    struct gbuild *b = s->b;
    struct gx *x = json_escape(b);
    for (const char *e = s->escape; *e && x; e++) {
        char lo[8], up[8];
        snprintf(lo, sizeof lo, "\\u00%02x", (unsigned)(uint8_t)*e);
        snprintf(up, sizeof up, "\\u00%02X", (unsigned)(uint8_t)*e);
        x = gx_alt2(b, x, strcmp(lo, up) ? gx_alt2(b, gx_str(b, lo), gx_str(b, up)) : gx_str(b, lo));
    }
    return x;
}

/* One character of a free string under this schema (json_string_char without escapes). */
static struct gx *string_char(struct sb *s)
{
    if (!s->escape[0]) return json_string_char(s->b);
    struct cpset set = {0};
    string_chars(s, &set);
    struct gx *x = gx_alt2(s->b, gx_codepoints(s->b, set.lo, set.hi, set.n), string_escape(s));
    cpset_free(&set);
    return x;
}

static int def_rule(struct sb *s, const char *name, struct gx *x)
{
    int r = gb_rule_new(s->b, name);
    if (r >= 0) s->b->rules[r].expr = x;
    return r;
}

/* The generic JSON rules, made once. */
static void json_rules(struct sb *s)
{
    struct gbuild *b = s->b;
    if (s->r_value) return;
    s->r_value = gb_rule_new(b, "json-value");
    s->r_char = def_rule(s, "json-char", string_char(s));
    s->r_string = def_rule(s, "json-string", gx_seq3(b, gx_str(b, "\""), gx_repeat(b, gx_ref(b, s->r_char), 0, -1), gx_str(b, "\"")));
    struct gx *digits = gx_repeat(b, gx_byte_range(b, '0', '9'), 1, -1);
    s->r_int = def_rule(s, "json-int", gx_seq2(b, gx_repeat(b, gx_str(b, "-"), 0, 1),
                                               gx_alt2(b, gx_str(b, "0"), gx_seq2(b, gx_byte_range(b, '1', '9'),
                                                                               gx_repeat(b, gx_byte_range(b, '0', '9'), 0, -1)))));
    struct gx *sign = gx_byte_range(b, '+', '+');
    if (sign) sign->set['-' >> 5] |= 1u << ('-' & 31);
    struct gx *e = gx_byte_range(b, 'e', 'e');
    if (e) e->set['E' >> 5] |= 1u << ('E' & 31);
    s->r_number = def_rule(s, "json-number", gx_seq3(b, gx_ref(b, s->r_int), gx_repeat(b, gx_seq2(b, gx_str(b, "."), digits), 0, 1),
                                                     gx_repeat(b, gx_seq3(b, e, gx_repeat(b, sign, 0, 1), digits), 0, 1)));
    struct gx *member = gx_seq3(b, gx_ref(b, s->r_string), gx_str(b, ":"), gx_ref(b, s->r_value));
    s->r_object = def_rule(s, "json-object", gx_seq3(b, gx_str(b, "{"),
                                                     gx_repeat(b, gx_seq2(b, member, gx_repeat(b, gx_seq2(b, gx_str(b, ","), member), 0, -1)), 0, 1),
                                                     gx_str(b, "}")));
    struct gx *val = gx_ref(b, s->r_value);
    s->r_array = def_rule(s, "json-array", gx_seq3(b, gx_str(b, "["),
                                                   gx_repeat(b, gx_seq2(b, val, gx_repeat(b, gx_seq2(b, gx_str(b, ","), val), 0, -1)), 0, 1),
                                                   gx_str(b, "]")));
    struct gx *alts[7] = {gx_ref(b, s->r_object), gx_ref(b, s->r_array), gx_ref(b, s->r_string), gx_ref(b, s->r_number),
                          gx_str(b, "true"), gx_str(b, "false"), gx_str(b, "null")};
    if (s->r_value >= 0) b->rules[s->r_value].expr = gx_alt(b, 7, alts);
}

/* A JSON value printed compactly, as a literal. */
static struct gx *json_literal(struct sb *s, const cJSON *v)
{
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return gb_fail(s->b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory"), NULL;
    struct gx *x = gx_str(s->b, text);
    cJSON_free(text);
    return x;
}

static struct gx *key_literal(struct sb *s, const char *key)
{
    cJSON *k = cJSON_CreateString(key);
    struct gx *x = k ? json_literal(s, k) : NULL;
    cJSON_Delete(k);
    return x;
}

static struct gx *schema(struct sb *s, const cJSON *node, const char *path);

static void subpath(char *out, size_t cap, const char *path, const char *a, const char *b)
{
    snprintf(out, cap, "%s/%s%s%s", path, a, b ? "/" : "", b ? b : "");
}

static const cJSON *resolve(struct sb *s, const char *ref, const char *path)
{
    if (ref[0] != '#') return schema_fail(s, path, "only local $ref (#...) is supported, not '%s'", ref), NULL;
    const cJSON *cur = s->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof tok) {
            if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(cur, tok);
        if (!cur) return schema_fail(s, path, "$ref '%s' points to nothing", ref), NULL;
    }
    if (*p) return schema_fail(s, path, "$ref '%s' is not a JSON pointer", ref), NULL;
    return cur;
}

static struct gx *ref_expr(struct sb *s, const char *ref, const char *path)
{
    for (int i = 0; i < s->n_refs; i++)
        if (!strcmp(s->refs[i].ptr, ref)) return gx_ref(s->b, s->refs[i].rule);
    if (s->n_refs == 256) return schema_fail(s, path, "more than 256 distinct $ref targets%s", ""), NULL;
    const cJSON *target = resolve(s, ref, path);
    if (!target) return NULL;
    int r = gb_rule_new(s->b, ref);
    if (r < 0) return NULL;
    s->refs[s->n_refs].ptr = s->b->rules[r].name;
    s->refs[s->n_refs++].rule = r;
    struct gx *x = schema(s, target, ref + 1);
    if (!x) return NULL;
    s->b->rules[r].expr = x;
    return gx_ref(s->b, r);
}

/* The content and closing quote of a key that is none of keys[0..n) (sorted, sharing their
 * first d bytes, ASCII without '"' or '\\'): a trie walked character by character, where any
 * character off the trie frees the rest of the key. */
static struct gx *key_except(struct sb *s, const char **keys, int n, int d)
{
    struct gbuild *b = s->b;
    struct cpset other = {0};
    string_chars(s, &other);
    struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)(n + 3));
    int k = 0, terminal = 0;
    if (!alts) { cpset_free(&other); return NULL; }
    for (int i = 0; i < n;) {
        if (!keys[i][d]) { terminal = 1, i++; continue; }
        int j = i;
        while (j < n && keys[j][d] == keys[i][d]) j++;
        uint32_t c = (uint8_t)keys[i][d];
        if (strchr(s->escape, (int)c)) { /* x-shardlm-escape: no free key holds it raw (nor is it in other) */
            i = j;
            continue;
        }
        struct cpset rest = {0};
        for (int r = 0; r < other.n; r++) { /* other minus c */
            if (c < other.lo[r] || c > other.hi[r]) { cpset_add(&rest, other.lo[r], other.hi[r]); continue; }
            if (c > other.lo[r]) cpset_add(&rest, other.lo[r], c - 1);
            if (c < other.hi[r]) cpset_add(&rest, c + 1, other.hi[r]);
        }
        cpset_free(&other);
        other = rest;
        alts[k++] = gx_seq2(b, gx_byte_range(b, (int)c, (int)c), gx_ref(b, def_rule(s, "", key_except(s, keys + i, j - i, d + 1))));
        i = j;
    }
    alts[k++] = gx_seq3(b, gx_alt2(b, gx_codepoints(b, other.lo, other.hi, other.n), string_escape(s)),
                        gx_repeat(b, gx_ref(b, s->r_char), 0, -1), gx_str(b, "\""));
    if (!terminal) alts[k++] = gx_str(b, "\"");
    cpset_free(&other);
    return gx_alt(b, k, alts);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A key for an additional property: any string but the declared names (the ones in plain ASCII;
 * others are not excluded, docs/grammar.md), as llguidance does. */
static struct gx *extra_key(struct sb *s, const cJSON *props)
{
    struct gbuild *b = s->b;
    int n = props ? cJSON_GetArraySize(props) : 0, k = 0;
    const char **keys = gb_alloc(b, sizeof *keys * (size_t)(n + 1));
    if (!keys) return NULL;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next) {
        int plain = 1;
        for (const char *c = p->string; *c; c++) plain &= *c >= 0x20 && *c < 0x7F && *c != '"' && *c != '\\';
        if (plain) keys[k++] = p->string;
    }
    if (!k) return gx_ref(b, s->r_string);
    qsort(keys, (size_t)k, sizeof *keys, cmp_str);
    return gx_seq2(b, gx_str(b, "\""), key_except(s, keys, k, 0));
}

static struct gx *object_expr(struct sb *s, const cJSON *node, const char *path)
{
    struct gbuild *b = s->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(node, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(node, "required");
    const cJSON *ap = cJSON_GetObjectItemCaseSensitive(node, "additionalProperties");
    char sub[1024];
    if (props && !cJSON_IsObject(props)) return schema_fail(s, path, "properties is not an object%s", ""), NULL;
    if (req && !cJSON_IsArray(req)) return schema_fail(s, path, "required is not an array%s", ""), NULL;
    int n = props ? cJSON_GetArraySize(props) : 0, n_req = req ? cJSON_GetArraySize(req) : 0;
    int total = n + n_req;
    struct gx **member = gb_alloc(b, sizeof *member * (size_t)(total + 1));
    int *required = gb_alloc(b, sizeof *required * (size_t)(total + 1));
    if (!member || !required) return NULL;
    int k = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, k++) {
        subpath(sub, sizeof sub, path, "properties", p->string);
        struct gx *v = schema(s, p, sub);
        if (!v) return NULL;
        member[k] = gx_seq3(b, key_literal(s, p->string), gx_str(b, ":"), v);
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) required[k] = 1;
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next) { /* required but not described */
        if (!cJSON_IsString(r)) return schema_fail(s, path, "required holds a non-string%s", ""), NULL;
        if (props && cJSON_GetObjectItemCaseSensitive(props, r->valuestring)) continue;
        int seen = 0;
        for (const cJSON *q = req->child; q != r; q = q->next) seen |= cJSON_IsString(q) && !strcmp(q->valuestring, r->valuestring);
        if (seen) continue;
        if (cJSON_IsFalse(ap)) return schema_fail(s, path, "required property '%s' is not allowed by additionalProperties false", r->valuestring), NULL;
        member[k] = gx_seq3(b, key_literal(s, r->valuestring), gx_str(b, ":"), gx_ref(b, s->r_value));
        required[k++] = 1;
    }
    n = k;
    struct gx *extra = NULL;
    /* additionalProperties absent where properties are declared: none are generated, as
     * xgrammar's strict mode (vLLM's default) and llama.cpp's converter do: every output still
     * validates against the schema, and a small model does not invent members after the declared
     * ones until max_tokens cuts its call short (LangChain's tool schemas leave it out). */
    const int open = ap ? cJSON_IsTrue(ap) : !(props && props->child);
    if (open) extra = gx_seq3(b, extra_key(s, props), gx_str(b, ":"), gx_ref(b, s->r_value));
    else if (cJSON_IsObject(ap)) {
        subpath(sub, sizeof sub, path, "additionalProperties", NULL);
        struct gx *v = schema(s, ap, sub);
        if (!v) return NULL;
        extra = gx_seq3(b, extra_key(s, props), gx_str(b, ":"), v);
    } else if (ap && !cJSON_IsFalse(ap)) return schema_fail(s, path, "additionalProperties must be a boolean or a schema%s", ""), NULL;
    /* A_i: members i.. with nothing written yet; B_i: members i.. after something (each
     * preceded by a comma). Built from the end, as rules so that the size stays linear. */
    struct gx *A = extra ? gx_repeat(b, gx_seq2(b, extra, gx_repeat(b, gx_seq2(b, gx_str(b, ","), extra), 0, -1)), 0, 1) : gx_empty(b);
    struct gx *B = extra ? gx_repeat(b, gx_seq2(b, gx_str(b, ","), extra), 0, -1) : gx_empty(b);
    for (int i = n - 1; i >= 0; i--) {
        int rb = def_rule(s, "", B), ra = def_rule(s, "", A);
        struct gx *b_take = gx_seq3(b, gx_str(b, ","), member[i], gx_ref(b, rb));
        struct gx *a_take = gx_seq2(b, member[i], gx_ref(b, rb));
        B = required[i] ? b_take : gx_alt2(b, b_take, gx_ref(b, rb));
        A = required[i] ? a_take : gx_alt2(b, a_take, gx_ref(b, ra));
    }
    return gx_seq3(b, gx_str(b, "{"), A, gx_str(b, "}"));
}

static struct gx *array_expr(struct sb *s, const cJSON *node, const char *path)
{
    struct gbuild *b = s->b;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(node, "items"), *prefix = cJSON_GetObjectItemCaseSensitive(node, "prefixItems");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(node, "minItems"), *mx = cJSON_GetObjectItemCaseSensitive(node, "maxItems");
    const cJSON *uniq = cJSON_GetObjectItemCaseSensitive(node, "uniqueItems");
    char sub[1024];
    if (cJSON_IsTrue(uniq)) return schema_fail(s, path, "unsupported keyword '%s' (true)", "uniqueItems"), NULL;
    if (cJSON_IsArray(items)) { /* draft 4 tuples */
        if (prefix) return schema_fail(s, path, "items as an array together with %s", "prefixItems"), NULL;
        prefix = items, items = cJSON_GetObjectItemCaseSensitive(node, "additionalItems");
    }
    int lo = 0, hi = -1;
    if (mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0 || mn->valuedouble > GRAMMAR_MAX_REPEAT)) return schema_fail(s, path, "bad %s", "minItems"), NULL;
    if (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0 || mx->valuedouble > GRAMMAR_MAX_REPEAT)) return schema_fail(s, path, "bad %s", "maxItems"), NULL;
    if (mn) lo = mn->valueint;
    if (mx) hi = mx->valueint;
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    struct gx *item = NULL;
    if (!items || cJSON_IsTrue(items)) item = gx_ref(b, s->r_value);
    else if (cJSON_IsObject(items)) {
        subpath(sub, sizeof sub, path, "items", NULL);
        if (!(item = schema(s, items, sub))) return NULL;
    } else if (!cJSON_IsFalse(items)) return schema_fail(s, path, "items must be a schema%s", ""), NULL;
    if (!item) hi = hi < 0 || hi > k ? k : hi;
    if (hi >= 0 && hi < lo) return schema_fail(s, path, "no array length satisfies minItems, maxItems and items%s", ""), NULL;
    struct gx *body;
    if (k == 0) {
        if (hi == 0) return gx_str(b, "[]");
        body = gx_seq2(b, item, gx_repeat(b, gx_seq2(b, gx_str(b, ","), item), lo > 1 ? lo - 1 : 0, hi < 0 ? -1 : hi - 1));
        if (lo == 0) body = gx_repeat(b, body, 0, 1);
    } else {
        int upto = hi >= 0 && hi < k ? hi : k;
        struct gx *tail = gx_empty(b);
        if (item && (hi < 0 || hi > k)) tail = gx_repeat(b, gx_seq2(b, gx_str(b, ","), item), lo > k ? lo - k : 0, hi < 0 ? -1 : hi - k);
        for (int j = upto - 1; j >= 0; j--) {
            char idx[16];
            snprintf(idx, sizeof idx, "%d", j);
            subpath(sub, sizeof sub, path, "prefixItems", idx);
            struct gx *pj = schema(s, cJSON_GetArrayItem(prefix, j), sub);
            if (!pj) return NULL;
            tail = gx_seq3(b, j ? gx_str(b, ",") : gx_empty(b), pj, gx_ref(b, def_rule(s, "", tail)));
            if (j >= lo) tail = gx_repeat(b, tail, 0, 1);
        }
        body = tail;
    }
    return gx_seq3(b, gx_str(b, "["), body, gx_str(b, "]"));
}

static const char *const annotations[] = {"title", "description", "examples", "default", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "id", NULL};
static const char *const supported[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "anyOf",
                                        "oneOf", "allOf", "items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                        "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum",
                                        "exclusiveMinimum", "exclusiveMaximum", "$ref", "nullable", NULL};

static int in_list(const char *k, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(k, list[i])) return 1;
    return 0;
}

static struct gx *typed(struct sb *s, const cJSON *node, const char *type, const char *path)
{
    struct gbuild *b = s->b;
    if (!strcmp(type, "null")) return gx_str(b, "null");
    if (!strcmp(type, "boolean")) return gx_alt2(b, gx_str(b, "true"), gx_str(b, "false"));
    if (!strcmp(type, "string")) return schema_string(s, node, path);
    if (!strcmp(type, "integer")) return schema_number(s, node, 1, path);
    if (!strcmp(type, "number")) return schema_number(s, node, 0, path);
    if (!strcmp(type, "object")) return object_expr(s, node, path);
    if (!strcmp(type, "array")) return array_expr(s, node, path);
    return schema_fail(s, path, "unknown type '%s'", type), NULL;
}

/* allOf: the keywords of every part merged into one schema (properties united, required
 * concatenated); a keyword two parts give differently is refused. */
static struct gx *all_of(struct sb *s, const cJSON *node, const cJSON *all, const char *path)
{
    cJSON *m = cJSON_CreateObject();
    if (!m || !(s->owned = realloc(s->owned, sizeof *s->owned * (size_t)(s->n_owned + 1))))
        return cJSON_Delete(m), gb_fail(s->b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory"), NULL;
    s->owned[s->n_owned++] = m;
    const cJSON *parts[65];
    int n = 0;
    parts[n++] = node;
    for (const cJSON *p = all->child; p && n < 65; p = p->next) {
        const cJSON *q = p;
        for (int hops = 0; cJSON_IsObject(q) && cJSON_GetObjectItemCaseSensitive(q, "$ref") && hops < 16; hops++) {
            const cJSON *ref = cJSON_GetObjectItemCaseSensitive(q, "$ref");
            if (!cJSON_IsString(ref)) return schema_fail(s, path, "$ref is not a string%s", ""), NULL;
            if (!(q = resolve(s, ref->valuestring, path))) return NULL;
        }
        if (!cJSON_IsObject(q)) return schema_fail(s, path, "allOf holds a %s that is not an object", "schema"), NULL;
        parts[n++] = q;
    }
    for (int i = 0; i < n; i++)
        for (const cJSON *kv = parts[i]->child; kv; kv = kv->next) {
            if (!strcmp(kv->string, "allOf") || !strcmp(kv->string, "additionalProperties") || (!strcmp(kv->string, "$ref") && i > 0))
                continue;
            cJSON *have = cJSON_GetObjectItemCaseSensitive(m, kv->string);
            if (!have) {
                cJSON *copy = cJSON_Duplicate(kv, 1);
                if (!copy || !cJSON_AddItemToObject(m, kv->string, copy)) {
                    cJSON_Delete(copy);
                    return gb_fail(s->b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory"), NULL;
                }
            } else if ((!strcmp(kv->string, "properties") && cJSON_IsObject(have) && cJSON_IsObject(kv)) ||
                       (!strcmp(kv->string, "required") && cJSON_IsArray(have) && cJSON_IsArray(kv))) {
                for (const cJSON *e = kv->child; e; e = e->next) {
                    if (cJSON_IsObject(have) && cJSON_GetObjectItemCaseSensitive(have, e->string)) continue;
                    cJSON *copy = cJSON_Duplicate(e, 1);
                    if (!copy || !(cJSON_IsObject(have) ? cJSON_AddItemToObject(have, e->string, copy) : cJSON_AddItemToArray(have, copy))) {
                        cJSON_Delete(copy);
                        return gb_fail(s->b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory"), NULL;
                    }
                }
            } else if (!cJSON_Compare(have, kv, 1)) {
                return schema_fail(s, path, "allOf parts disagree on '%s' (not supported)", kv->string), NULL;
            }
        }
    /* additionalProperties false in a part allows only that part's own properties: the merged
     * object allows the intersection, and a required property outside it is unsatisfiable. */
    cJSON *props = cJSON_GetObjectItemCaseSensitive(m, "properties"), *req = cJSON_GetObjectItemCaseSensitive(m, "required");
    int closed = 0, open = 0; /* open: some part says true (absent in all: object_expr's default) */
    for (int i = 0; i < n; i++) {
        const cJSON *ap = cJSON_GetObjectItemCaseSensitive(parts[i], "additionalProperties");
        open |= cJSON_IsTrue(ap);
        if (!ap || cJSON_IsTrue(ap)) continue;
        if (!cJSON_IsFalse(ap)) return schema_fail(s, path, "allOf with an additionalProperties %s is not supported", "schema"), NULL;
        closed = 1;
        const cJSON *own = cJSON_GetObjectItemCaseSensitive(parts[i], "properties");
        for (cJSON *p = props ? props->child : NULL, *next; p; p = next) {
            next = p->next;
            if (!cJSON_GetObjectItemCaseSensitive(own, p->string)) cJSON_DeleteItemFromObjectCaseSensitive(props, p->string);
        }
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !cJSON_GetObjectItemCaseSensitive(own, r->valuestring))
                return schema_fail(s, path, "allOf: required property '%s' is excluded by additionalProperties false", r->valuestring), NULL;
    }
    if ((closed || open) && !cJSON_AddItemToObject(m, "additionalProperties", cJSON_CreateBool(!closed)))
        return gb_fail(s->b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory"), NULL;
    return schema(s, m, path);
}

static struct gx *schema(struct sb *s, const cJSON *node, const char *path)
{
    struct gbuild *b = s->b;
    if (b->failed) return NULL;
    if (cJSON_IsTrue(node)) return gx_ref(b, s->r_value);
    if (cJSON_IsFalse(node)) return schema_fail(s, path, "the schema false accepts nothing%s", ""), NULL;
    if (!cJSON_IsObject(node)) return schema_fail(s, path, "a schema must be an object or a boolean%s", ""), NULL;
    if (++s->depth > GRAMMAR_MAX_DEPTH) return schema_fail(s, path, "schema nested too deep%s", ""), NULL;
    char sub[1024];
    struct gx *x = NULL;
    int n_constraints = 0;
    for (const cJSON *kv = node->child; kv; kv = kv->next) {
        if (in_list(kv->string, annotations)) continue;
        if (!in_list(kv->string, supported)) {
            schema_fail(s, path, "unsupported keyword '%s'", kv->string);
            goto out;
        }
        n_constraints++;
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(node, "$ref"), *all = cJSON_GetObjectItemCaseSensitive(node, "allOf");
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(node, "anyOf");
    if (!any) any = cJSON_GetObjectItemCaseSensitive(node, "oneOf"); /* oneOf as anyOf: exclusivity is not enforced */
    const cJSON *cnst = cJSON_GetObjectItemCaseSensitive(node, "const"), *en = cJSON_GetObjectItemCaseSensitive(node, "enum");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(node, "type");
    const cJSON *nullable = cJSON_GetObjectItemCaseSensitive(node, "nullable");
    if (all) {
        if (!cJSON_IsArray(all) || !cJSON_GetArraySize(all)) { schema_fail(s, path, "allOf must be a non-empty array%s", ""); goto out; }
        x = all_of(s, node, all, path);
    } else if (ref) {
        if (!cJSON_IsString(ref)) { schema_fail(s, path, "$ref is not a string%s", ""); goto out; }
        if (n_constraints > 1 + (nullable != NULL)) { schema_fail(s, path, "$ref beside other constraints is not supported%s", ""); goto out; }
        x = ref_expr(s, ref->valuestring, path);
    } else if (cnst) {
        x = json_literal(s, cnst);
    } else if (en) {
        if (!cJSON_IsArray(en) || !cJSON_GetArraySize(en)) { schema_fail(s, path, "enum must be a non-empty array%s", ""); goto out; }
        int n = cJSON_GetArraySize(en), i = 0;
        struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)n);
        for (const cJSON *e = en->child; e && alts; e = e->next) alts[i++] = json_literal(s, e);
        x = alts ? gx_alt(b, n, alts) : NULL;
    } else if (any) {
        const char *kw = cJSON_GetObjectItemCaseSensitive(node, "anyOf") ? "anyOf" : "oneOf";
        if (!cJSON_IsArray(any) || !cJSON_GetArraySize(any)) { schema_fail(s, path, "%s must be a non-empty array", kw); goto out; }
        if (n_constraints > 1 + (nullable != NULL)) { schema_fail(s, path, "%s beside other constraints is not supported", kw); goto out; }
        int n = cJSON_GetArraySize(any), i = 0;
        struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)n);
        for (const cJSON *e = any->child; e && alts; e = e->next, i++) {
            char idx[16];
            snprintf(idx, sizeof idx, "%d", i);
            subpath(sub, sizeof sub, path, kw, idx);
            if (!(alts[i] = schema(s, e, sub))) goto out;
        }
        x = alts ? gx_alt(b, n, alts) : NULL;
    } else if (cJSON_IsString(type)) {
        x = typed(s, node, type->valuestring, path);
    } else if (cJSON_IsArray(type)) {
        int n = cJSON_GetArraySize(type), i = 0;
        if (!n) { schema_fail(s, path, "type is an empty array%s", ""); goto out; }
        struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)n);
        for (const cJSON *e = type->child; e && alts; e = e->next, i++) {
            if (!cJSON_IsString(e)) { schema_fail(s, path, "type holds a non-string%s", ""); goto out; }
            if (!(alts[i] = typed(s, node, e->valuestring, path))) goto out;
        }
        x = alts ? gx_alt(b, n, alts) : NULL;
    } else if (type) {
        schema_fail(s, path, "type must be a string or an array%s", "");
        goto out;
    } else if (cJSON_GetObjectItemCaseSensitive(node, "properties") || cJSON_GetObjectItemCaseSensitive(node, "required") ||
               cJSON_GetObjectItemCaseSensitive(node, "additionalProperties")) {
        x = object_expr(s, node, path);
    } else if (cJSON_GetObjectItemCaseSensitive(node, "items") || cJSON_GetObjectItemCaseSensitive(node, "prefixItems")) {
        x = array_expr(s, node, path);
    } else if (n_constraints - (nullable != NULL) > 0) {
        schema_fail(s, path, "constraints without a type are not supported (add \"type\")%s", "");
        goto out;
    } else {
        x = gx_ref(b, s->r_value);
    }
    if (x && cJSON_IsTrue(nullable)) x = gx_alt2(b, x, gx_str(b, "null"));
out:
    s->depth--;
    return b->failed ? NULL : x;
}

/* The text t (a branch's x-shardlm-prefix) with its first "%d" written as the number k. */
static struct gx *numbered_text(struct gbuild *b, const char *t, int k)
{
    const char *d = strstr(t, "%d");
    if (!d) return gx_str(b, t);
    char buf[160]; /* (t: at most 128 bytes) */
    snprintf(buf, sizeof buf, "%.*s%d%s", (int)(d - t), t, k, d + 2);
    return gx_str(b, buf);
}

/* A root {"anyOf": [...]} whose every branch holds x-shardlm-prefix (a text of 1 to 128 bytes):
 * the output is one branch's text then a JSON value of that branch (harmony's tool calls: the
 * function's name and the header after it, then its arguments: server/http_tools.c). Returns 1
 * when the root is such a list (s->b->failed set on an error, else the expression in s->tagged),
 * 0 when it is not (no branch has the keyword). */
static int tagged_branches(struct sb *s)
{
    const cJSON *any = cJSON_IsObject(s->root) ? cJSON_GetObjectItemCaseSensitive(s->root, "anyOf") : NULL;
    int n = cJSON_IsArray(any) ? cJSON_GetArraySize(any) : 0, tagged = 0;
    for (const cJSON *e = n ? any->child : NULL; e; e = e->next)
        tagged |= cJSON_IsObject(e) && cJSON_GetObjectItemCaseSensitive(e, GRAMMAR_SCHEMA_PREFIX) != NULL;
    if (!tagged) return 0;
    struct gbuild *b = s->b;
    if (cJSON_GetArraySize(s->root) != 1) {
        schema_fail(s, "", "a root anyOf whose branches hold " GRAMMAR_SCHEMA_PREFIX " must be the root's only keyword%s", "");
        return 1;
    }
    /* Every branch's text is taken out before any branch compiles, so that a $ref into the list
     * sees the branches as values whatever their order. */
    struct gx **alts = gb_alloc(b, sizeof *alts * (size_t)n);
    cJSON **pre = calloc((size_t)n, sizeof *pre);
    int i = 0, bad = -1;
    for (cJSON *e = any->child; e && alts && pre; e = e->next, i++) {
        pre[i] = cJSON_IsObject(e) ? cJSON_DetachItemFromObjectCaseSensitive(e, GRAMMAR_SCHEMA_PREFIX) : NULL;
        if (bad < 0 && !(cJSON_IsString(pre[i]) && pre[i]->valuestring[0] && strlen(pre[i]->valuestring) <= 128)) bad = i;
    }
    char path[48];
    if (!pre) gb_fail(b, STATUS_RESOURCE_EXHAUSTED, "json schema: out of memory");
    if (pre && bad >= 0) {
        snprintf(path, sizeof path, "/anyOf/%d", bad);
        schema_fail(s, path, "/" GRAMMAR_SCHEMA_PREFIX " must be a string of 1 to 128 bytes in every branch%s", "");
    }
    /* Numbered (x-shardlm-repeat): each branch's value a rule, so that every copy refers to it. */
    int *val = s->num_count ? gb_alloc(b, sizeof *val * (size_t)n) : NULL;
    i = 0;
    for (cJSON *e = any->child; e && alts && pre && bad < 0 && !b->failed; e = e->next, i++) {
        snprintf(path, sizeof path, "/anyOf/%d", i);
        struct gx *v = schema(s, e, path);
        if (v && val && (val[i] = gb_rule_new(b, "branch")) >= 0) b->rules[val[i]].expr = v;
        if (v && !val) alts[i] = gx_seq2(b, gx_str(b, pre[i]->valuestring), v);
    }
    for (int k = 0; val && alts && pre && bad < 0 && !b->failed && k < s->num_count; k++) {
        struct gx **copy = gb_alloc(b, sizeof *copy * (size_t)n);
        for (int j = 0; copy && j < n; j++)
            copy[j] = gx_seq2(b, numbered_text(b, pre[j]->valuestring, s->num_first + k), gx_ref(b, val[j]));
        if (copy) s->tagged_n[k] = gx_alt(b, n, copy);
    }
    if (alts && pre && bad < 0 && !b->failed) s->tagged = val ? s->tagged_n[0] : gx_alt(b, n, alts);
    for (int k = 0; pre && k < n; k++) cJSON_Delete(pre[k]);
    free(pre);
    return 1;
}

/* A text of x-shardlm-repeat: a string of 1 to 64 bytes. */
static int marker_text(const cJSON *t) { return cJSON_IsString(t) && t->valuestring[0] && strlen(t->valuestring) <= 64; }

enum status schema_build(struct gbuild *b, const char *src, size_t n, int object_only, int *root)
{
    struct sb s;
    memset(&s, 0, sizeof s);
    s.b = b;
    *root = gb_rule_new(b, "root");
    json_rules(&s);
    if (object_only) {
        if (*root >= 0) b->rules[*root].expr = gx_ref(b, s.r_object);
        return (enum status)b->failed;
    }
    s.root = cJSON_ParseWithLength(src, n);
    if (!s.root) return gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: not valid JSON");
    /* x-shardlm-prefix (the root's only; taken out, so that a "#" reference does not see it):
     * literal text the output starts with before the JSON value (a tool call's marker), after at
     * most 8 bytes of whitespace; or a list of 1 to 8 such texts, one of which (maybe empty) comes
     * first (harmony's answer: its final message's header, or none). */
    cJSON *pre = cJSON_IsObject(s.root) ? cJSON_DetachItemFromObjectCaseSensitive(s.root, GRAMMAR_SCHEMA_PREFIX) : NULL;
    int pre_ok = !pre || (cJSON_IsString(pre) && pre->valuestring[0] && strlen(pre->valuestring) <= 64) ||
                 (cJSON_IsArray(pre) && cJSON_GetArraySize(pre) >= 1 && cJSON_GetArraySize(pre) <= 8);
    for (const cJSON *e = cJSON_IsArray(pre) ? pre->child : NULL; e; e = e->next)
        pre_ok &= cJSON_IsString(e) && strlen(e->valuestring) <= 64;
    if (!pre_ok) {
        cJSON_Delete(pre), cJSON_Delete(s.root);
        return gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: /" GRAMMAR_SCHEMA_PREFIX " must be a string of 1 to "
                       "64 bytes, or a list of 1 to 8 strings of 0 to 64 bytes");
    }
    /* x-shardlm-escape (the root's only, likewise): characters free strings must escape. */
    cJSON *esc = cJSON_IsObject(s.root) ? cJSON_DetachItemFromObjectCaseSensitive(s.root, GRAMMAR_SCHEMA_ESCAPE) : NULL;
    int esc_ok = !esc || (cJSON_IsString(esc) && esc->valuestring[0] && strlen(esc->valuestring) < sizeof s.escape);
    for (const char *e = esc_ok && esc ? esc->valuestring : ""; *e; e++)
        esc_ok &= *e >= 0x20 && *e < 0x7F && *e != '"' && *e != '\\';
    if (esc_ok && esc) snprintf(s.escape, sizeof s.escape, "%s", esc->valuestring);
    if (s.escape[0] && s.r_char >= 0) b->rules[s.r_char].expr = string_char(&s); /* json_rules ran without them */
    cJSON_Delete(esc);
    if (!esc_ok) {
        cJSON_Delete(pre), cJSON_Delete(s.root);
        return gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: /" GRAMMAR_SCHEMA_ESCAPE " must be a string of 1 to "
                       "16 printable ASCII characters (space included), not '\"' or '\\'");
    }
    /* x-shardlm-repeat (the root's only, likewise): the value repeated between literal texts:
     * {close, open}: V (C (O V C)*)?, the output may end after any value or close; with "end":
     * V C (O V C)* E, every value closed and the list ended (DeepSeek's calls); {close, end}:
     * V C E. With "numbered": [FIRST, COUNT] (and close, open and end), the value is the root's
     * tagged branches with the "%d" of their texts numbered: V_F C (O V_F+1 C (O ... C)?)? E, at
     * most COUNT values (1 to 16; Kimi-K2's calls, `functions.NAME:INDEX`). */
    cJSON *rep = cJSON_IsObject(s.root) ? cJSON_DetachItemFromObjectCaseSensitive(s.root, GRAMMAR_SCHEMA_REPEAT) : NULL;
    const cJSON *close = cJSON_GetObjectItemCaseSensitive(rep, "close"), *open = cJSON_GetObjectItemCaseSensitive(rep, "open");
    const cJSON *end = cJSON_GetObjectItemCaseSensitive(rep, "end"), *num = cJSON_GetObjectItemCaseSensitive(rep, "numbered");
    const cJSON *nf = cJSON_GetArrayItem(num, 0), *nc = cJSON_GetArrayItem(num, 1);
    int rep_ok = !rep || (cJSON_IsObject(rep) && cJSON_GetArraySize(rep) == 1 + (open != NULL) + (end != NULL) + (num != NULL) &&
                          (open || end) && marker_text(close) && (!open || marker_text(open)) && (!end || marker_text(end)));
    if (num) {
        rep_ok &= open && end && cJSON_IsArray(num) && cJSON_GetArraySize(num) == 2 && cJSON_IsNumber(nf) && cJSON_IsNumber(nc) &&
                  nf->valuedouble >= 0 && nf->valuedouble <= 1e6 && nc->valuedouble >= 1 && nc->valuedouble <= 16;
        if (rep_ok) s.num_first = (int)nf->valuedouble, s.num_count = (int)nc->valuedouble;
    }
    if (!rep_ok) {
        cJSON_Delete(pre), cJSON_Delete(rep), cJSON_Delete(s.root);
        return gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: /" GRAMMAR_SCHEMA_REPEAT " must be {\"close\": "
                       "STRING, \"open\": STRING, \"end\": STRING} with close and open, end or both, each of 1 to 64 "
                       "bytes, and maybe \"numbered\": [FIRST 0 to 1e6, COUNT 1 to 16] with all three");
    }
    const int tagged = tagged_branches(&s);
    struct gx *x = tagged ? s.tagged : schema(&s, s.root, "");
    if (x && num && !tagged)
        gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: /" GRAMMAR_SCHEMA_REPEAT "/numbered needs a root anyOf whose "
                "branches hold " GRAMMAR_SCHEMA_PREFIX), x = NULL;
    if (x && num) { /* V_F C (O V_F+1 C (...)?)? E */
        struct gx *tail = gx_empty(b);
        for (int k = s.num_count - 1; k >= 1; k--)
            tail = gx_alt2(b, gx_empty(b), gx_seq3(b, gx_str(b, open->valuestring), s.tagged_n[k],
                                                   gx_seq2(b, gx_str(b, close->valuestring), tail)));
        x = gx_seq3(b, x, gx_seq2(b, gx_str(b, close->valuestring), tail), gx_str(b, end->valuestring));
    } else if (x && rep) {
        const int v = gb_rule_new(b, "value");
        if (v >= 0) b->rules[v].expr = x;
        struct gx *c = gx_str(b, close->valuestring);
        struct gx *more = open ? gx_repeat(b, gx_seq3(b, gx_str(b, open->valuestring), gx_ref(b, v), gx_str(b, close->valuestring)), 0, -1)
                               : gx_empty(b);
        if (end) /* V C (O V C)* E */
            x = gx_seq3(b, gx_ref(b, v), gx_seq2(b, c, more), gx_str(b, end->valuestring));
        else /* V (C (O V C)*)? */
            x = gx_seq2(b, gx_ref(b, v), gx_alt2(b, gx_empty(b), gx_seq2(b, c, more)));
    }
    if (x && pre) { /* up to 8 bytes of whitespace first: Qwen 3 writes "\n\n" after </think> */
        struct gx *ws[4] = {gx_byte_range(b, ' ', ' '), gx_byte_range(b, '\t', '\t'), gx_byte_range(b, '\n', '\n'),
                            gx_byte_range(b, '\r', '\r')};
        struct gx *text = cJSON_IsString(pre) ? gx_str(b, pre->valuestring) : NULL;
        if (!text) { /* a list: one of its texts */
            struct gx *alts[8];
            int n_alt = 0;
            for (const cJSON *e = pre->child; e && n_alt < 8; e = e->next)
                alts[n_alt++] = e->valuestring[0] ? gx_str(b, e->valuestring) : gx_empty(b);
            text = gx_alt(b, n_alt, alts);
        }
        x = gx_seq3(b, gx_repeat(b, gx_alt(b, 4, ws), 0, 8), text, x);
    }
    if (x && *root >= 0) b->rules[*root].expr = x;
    cJSON_Delete(pre);
    cJSON_Delete(rep);
    cJSON_Delete(s.root);
    for (int i = 0; i < s.n_owned; i++) cJSON_Delete(s.owned[i]);
    free(s.owned);
    return b->failed ? (enum status)b->failed : x ? STATUS_OK : gb_fail(b, STATUS_INVALID_ARGUMENT, "json schema: invalid");
}
