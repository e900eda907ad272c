/* server/tool_glm.c - GLM-4.5's tool calls (tool_format.h TOOL_FORMAT_GLM), and DeepSeek's call
 * bodies (TOOL_FORMAT_DEEPSEEK, at the end). GLM: the body of one
 * `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>` turned into the
 * call's name and its arguments as JSON. GLM's template writes a string value as it is and any
 * other value as JSON (`v | tojson if v is not string else v`), so a value that is one whole JSON
 * value (a number, true, an object...) is taken as that JSON, anything else as a string (llama.cpp's
 * rule: a string argument that looks like JSON, "42", comes back as 42). Keys are taken as they are.
 * Pure text in, text out (fuzzed through tool_parse). Called by tool_stream.c (B_GLM).
 * Tests: tests/test_tool_stream.c (GLM replies, every prefix), tests/server/test_tools_glm.py
 * (calls rendered by GLM-4.6's template with jinja2, parsed back to the same JSON). */
#include "tool_stream_impl.h"

#include <string.h>

/* The bytes [s, e) without leading and trailing JSON whitespace. */
static void trim(const char **s, const char **e)
{
    while (*s < *e && tool_json_is_ws((unsigned char)**s)) (*s)++;
    while (*e > *s && tool_json_is_ws((unsigned char)(*e)[-1])) (*e)--;
}

/* Whether [s, e) starts with the literal lit; advances s past it when it does. */
static int eat(const char **s, const char *e, const char *lit)
{
    const size_t n = strlen(lit);
    if ((size_t)(e - *s) < n || memcmp(*s, lit, n)) return 0;
    *s += n;
    return 1;
}

/* The first occurrence of lit in [s, e), or NULL. */
static const char *find(const char *s, const char *e, const char *lit)
{
    const size_t n = strlen(lit);
    for (; (size_t)(e - s) >= n; s++)
        if (*s == lit[0] && !memcmp(s, lit, n)) return s;
    return NULL;
}

/* One JSON value at *s (whitespace around it skipped by the caller); advances past it. Depth
 * bounded (64), strings checked for their escapes and control bytes. Returns 0 when malformed. */
static int json_value(const char **s, const char *e, int depth)
{
    const char *p = *s;
    if (p >= e || depth > 64) return 0;
    if (*p == '"') {
        for (p++; p < e && *p != '"'; p++) {
            if ((unsigned char)*p < 0x20) return 0;
            if (*p != '\\') continue;
            if (++p >= e) return 0;
            if (*p == 'u') {
                for (int i = 0; i < 4; i++)
                    if (++p >= e || !strchr("0123456789abcdefABCDEF", *p)) return 0;
            } else if (!strchr("\"\\/bfnrt", *p)) {
                return 0;
            }
        }
        if (p >= e) return 0;
        *s = p + 1;
        return 1;
    }
    if (*p == '{' || *p == '[') {
        const char close = *p == '{' ? '}' : ']';
        for (p++;;) {
            while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
            if (p < e && *p == close) break;
            if (close == '}') {
                if (p >= e || *p != '"' || !json_value(&p, e, depth + 1)) return 0;
                while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
                if (p >= e || *p++ != ':') return 0;
                while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
            }
            if (!json_value(&p, e, depth + 1)) return 0;
            while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
            if (p < e && *p == ',') {
                p++;
                continue;
            }
            if (p >= e || *p != close) return 0;
            break;
        }
        *s = p + 1;
        return 1;
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++)
        if (eat(&p, e, words[i])) return *s = p, 1;
    /* a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    if (p < e && *p == '-') p++;
    if (p >= e || *p < '0' || *p > '9') return 0;
    if (*p == '0') p++;
    else while (p < e && *p >= '0' && *p <= '9') p++;
    if (p < e && *p == '.') {
        if (++p >= e || *p < '0' || *p > '9') return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return 0;
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    *s = p;
    return 1;
}

/* [s, e) as a JSON string into out (", \ and the control bytes escaped; other bytes as they are). */
static void json_string(struct tool_json_buf *out, const char *s, const char *e)
{
    static const char hex[] = "0123456789abcdef";
    tool_json_buf_add(out, "\"", 1);
    for (; s < e; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            tool_json_buf_add(out, esc, 2);
        } else if (c < 0x20) {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            tool_json_buf_add(out, u, 6);
        } else {
            tool_json_buf_add(out, s, 1);
        }
    }
    tool_json_buf_add(out, "\"", 1);
}

int tool_glm_call(const char *s, size_t n, size_t *name_at, size_t *name_len, struct tool_json_buf *args)
{
    const char *e = s + n, *ne = find(s, e, "<arg_key>"), *p;
    /* The name: up to the first newline or <arg_key>, trimmed; nothing else may come before them. */
    const char *nl = memchr(s, '\n', (size_t)e - (size_t)s);
    const char *name_end = ne && (!nl || ne < nl) ? ne : nl ? nl : e, *ns = s;
    trim(&ns, &name_end);
    *name_at = (size_t)(ns - s);
    if (name_end == ns || find(ns, name_end, "<")) return 0;
    *name_len = (size_t)(name_end - ns);
    tool_json_buf_reset(args);
    tool_json_buf_add(args, "{", 1);
    int pairs = 0;
    for (p = nl && (!ne || nl < ne) ? nl : ne ? ne : e;;) {
        while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
        if (p == e) break;
        if (!eat(&p, e, "<arg_key>")) return 0;
        const char *ke = find(p, e, "</arg_key>");
        if (!ke) return 0;
        const char *ks = p;
        p = ke + strlen("</arg_key>");
        while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
        if (!eat(&p, e, "<arg_value>")) return 0;
        const char *ve = find(p, e, "</arg_value>");
        if (!ve) return 0;
        const char *vs = p, *ts = vs, *te = ve;
        p = ve + strlen("</arg_value>");
        if (pairs++) tool_json_buf_add(args, ",", 1);
        json_string(args, ks, ke);
        tool_json_buf_add(args, ":", 1);
        trim(&ts, &te);
        const char *q = ts;
        if (ts < te && json_value(&q, te, 0) && q == te) tool_json_buf_add(args, ts, (size_t)(te - ts));
        else json_string(args, vs, ve); /* a string: as the template wrote it */
    }
    tool_json_buf_add(args, "}", 1);
    return !args->oom;
}

/* The end of a marked call body (Kimi-K2's, DeepSeek's): the name [ns, ne) one word (no
 * whitespace, no marker), the arguments [a, ae) (trimmed here) one JSON object; 1 with their
 * offsets from s, else 0. */
static int name_and_args(const char *s, const char *ns, const char *ne, const char *a, const char *ae, size_t *name_at,
                         size_t *name_len, size_t *args_at, size_t *args_len)
{
    trim(&a, &ae);
    for (const char *c = ns; c < ne; c++)
        if (tool_json_is_ws((unsigned char)*c) || *c == '<') return 0;
    const char *q = a;
    if (ne == ns || a == ae || *a != '{' || !json_value(&q, ae, 0) || q != ae) return 0;
    *name_at = (size_t)(ns - s), *name_len = (size_t)(ne - ns);
    *args_at = (size_t)(a - s), *args_len = (size_t)(ae - a);
    return 1;
}

/* Kimi-K2's call body, between <|tool_call_begin|> and <|tool_call_end|>:
 * `functions.NAME:INDEX<|tool_call_argument_begin|>ARGS` (the id the template writes: "functions."
 * and ":INDEX" are optional here), ARGS one JSON object. */
int tool_kimi_call(const char *s, size_t n, size_t *name_at, size_t *name_len, size_t *args_at, size_t *args_len)
{
    const char *e = s + n, *sep = find(s, e, TOOL_KIMI_ARGS), *ns = s, *ne = sep;
    if (!sep) return 0;
    const char *a = sep + strlen(TOOL_KIMI_ARGS), *ae = e;
    trim(&ns, &ne);
    eat(&ns, ne, "functions.");
    const char *colon = ne;
    while (colon > ns && colon[-1] >= '0' && colon[-1] <= '9') colon--;
    if (colon < ne && colon > ns && colon[-1] == ':') ne = colon - 1; /* ":INDEX" */
    return name_and_args(s, ns, ne, a, ae, name_at, name_len, args_at, args_len);
}

/* DeepSeek's call body, between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>: V3.1's
 * `NAME<｜tool▁sep｜>ARGS`, or R1's `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` (its type, then
 * the name on its own line and the arguments fenced); ARGS one JSON object. */
int tool_deepseek_call(const char *s, size_t n, size_t *name_at, size_t *name_len, size_t *args_at, size_t *args_len)
{
    const char *e = s + n, *sep = find(s, e, TOOL_DS_SEP), *ns = s, *ne = sep;
    if (!sep) return 0;
    const char *a = sep + strlen(TOOL_DS_SEP), *ae = e;
    trim(&ns, &ne);
    if ((size_t)(ne - ns) == strlen("function") && !memcmp(ns, "function", (size_t)(ne - ns))) { /* R1 */
        const char *nl = memchr(a, '\n', (size_t)(e - a));
        if (!nl) return 0;
        ns = a, ne = nl;
        trim(&ns, &ne);
        a = nl + 1;
        while (a < e && tool_json_is_ws((unsigned char)*a)) a++;
        if (!eat(&a, e, "```")) return 0;
        eat(&a, e, "json");
        trim(&a, &ae);
        if ((size_t)(ae - a) < 3 || memcmp(ae - 3, "```", 3)) return 0;
        ae -= 3;
    }
    return name_and_args(s, ns, ne, a, ae, name_at, name_len, args_at, args_len);
}
