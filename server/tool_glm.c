/* server/tool_glm.c - the XML-like tool calls (tool_format.h tool_format_is_xml: GLM-4.5's,
 * Qwen3-Coder's, MiniMax-M2's, DeepSeek V3.2's and V4's DSML), and DeepSeek's and Kimi-K2's call
 * bodies (at the end). GLM: the
 * body of one `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>\n...</tool_call>`;
 * Qwen3-Coder (and Qwen3.5): `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n</parameter>\n...</function>\n</tool_call>`;
 * MiniMax-M2: each `<invoke name="NAME">\n<parameter name="K">V</parameter>\n...</invoke>` of a
 * `<minimax:tool_call>` block; DSML: MiniMax's with each tag after `｜DSML｜`
 * (`<｜DSML｜invoke name="NAME">`, `<｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>`)
 * in a `<｜DSML｜function_calls>` (V3.2) or `<｜DSML｜tool_calls>` (V4) block, its `string`
 * attribute saying how V is written: as it is (a string), or as JSON (taken as that JSON when it
 * is one whole value, else read as below); Gemma 4: `call:NAME{KEY:VALUE,...}` between
 * `<|tool_call>` and `<tool_call|>`, its values in its template's notation (strings between
 * `<|"|>` marks, keys bare: tool_gemma4_call), so typed by how they are written; functionary
 * v3.1's `NAME>{...}` between `<function=` and `</function>` (tool_functionary_call), its arguments
 * JSON as written. Each call turned into its name and its arguments as JSON. The
 * templates write a string value as it is and any other value otherwise (GLM, MiniMax: as JSON;
 * Qwen: a list or mapping as JSON, the rest
 * through Jinja's `string`, Python's True, False and None included). So a value is read by its
 * key's declared schema when the request's tools give one (tool_stream_arg_types: a string is the
 * raw text, a boolean true / false in any case, a null null or None); otherwise a value that is
 * one whole JSON value (a number, true, an object...) is taken as that JSON, anything else as a
 * string (llama.cpp's rule; an undeclared string argument that looks like JSON, "42", comes back
 * as 42). Qwen's value is the text between the newline after `<parameter=K>` and the one before
 * `</parameter>` (both the template's). Keys are taken as they are. Pure text in, text out
 * (fuzzed through tool_parse). Called by tool_stream.c (B_GLM).
 * Tests: tests/test_tool_stream_formats.c (replies, every prefix), tests/server/test_tools_glm.py
 * and test_tools_xml.py (calls rendered by the models' templates with jinja2, parsed back to
 * the same JSON). */
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

/* The kind types (tool_stream_arg_types) gives function name[0..nn)'s key key[0..kn), or 0. */
static char arg_kind(const char *types, const char *name, size_t nn, const char *key, size_t kn)
{
    for (const char *t = types; t && *t == '\x1e' && t[1];) {
        const char *ne = strchr(t + 1, '\x1f'), *ke = ne ? strchr(ne + 1, '\x1f') : NULL;
        if (!ke || !ke[1]) return 0;
        if ((size_t)(ne - t - 1) == nn && !memcmp(t + 1, name, nn) && (size_t)(ke - ne - 1) == kn &&
            !memcmp(ne + 1, key, kn))
            return ke[1];
        t = ke + 2;
    }
    return 0;
}

/* Whether [s, e) is word, ASCII case aside. */
static int is_word(const char *s, const char *e, const char *word)
{
    const size_t n = strlen(word);
    if ((size_t)(e - s) != n) return 0;
    for (size_t i = 0; i < n; i++)
        if ((s[i] | 0x20) != word[i]) return 0;
    return 1;
}

/* "KEY": for the key [ks, ke), after a comma unless it is the object's first. */
static void put_key(struct tool_json_buf *args, const char *ks, const char *ke)
{
    if (args->n > 1) tool_json_buf_add(args, ",", 1);
    json_string(args, ks, ke);
    tool_json_buf_add(args, ":", 1);
}

/* Whether [s, e), whitespace around it aside, is one whole JSON value. */
static int whole_json(const char *s, const char *e)
{
    trim(&s, &e);
    const char *q = s;
    return s < e && json_value(&q, e, 0) && q == e;
}

/* Appends "KEY":VALUE to the object in args for the raw value [vs, ve) of function name's key
 * [ks, ke), read by its kind (the file's head). */
static void put_arg(struct tool_json_buf *args, const char *types, const char *name, size_t nn, const char *ks,
                    const char *ke, const char *vs, const char *ve)
{
    put_key(args, ks, ke);
    const char kind = arg_kind(types, name, nn, ks, (size_t)(ke - ks));
    const char *ts = vs, *te = ve;
    trim(&ts, &te);
    const char *word = kind == 'b' && (is_word(ts, te, "true") || is_word(ts, te, "false")) ? (ts[0] | 0x20) == 't' ? "true" : "false"
                     : kind == 'z' && (is_word(ts, te, "null") || is_word(ts, te, "none")) ? "null" : NULL;
    if (word) tool_json_buf_add(args, word, strlen(word));
    else if (kind != 's' && whole_json(ts, te)) tool_json_buf_add(args, ts, (size_t)(te - ts));
    else json_string(args, vs, ve); /* a string: as the template wrote it */
}

int tool_glm_call(const char *s, size_t n, const char *types, size_t *name_at, size_t *name_len,
                  struct tool_json_buf *args)
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
        put_arg(args, types, ns, *name_len, ks, ke, p, ve);
        p = ve + strlen("</arg_value>");
    }
    tool_json_buf_add(args, "}", 1);
    return !args->oom;
}

int tool_qwen_xml_call(const char *s, size_t n, const char *types, int trim, size_t *name_at, size_t *name_len,
                       struct tool_json_buf *args)
{
    const char *e = s + n, *p = s;
    while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
    if (!eat(&p, e, "<function=")) return 0;
    const char *ns = p, *gt = memchr(p, '>', (size_t)(e - p));
    if (!gt || gt == ns) return 0;
    for (const char *c = ns; c < gt; c++)
        if (tool_json_is_ws((unsigned char)*c) || *c == '<') return 0;
    *name_at = (size_t)(ns - s), *name_len = (size_t)(gt - ns);
    tool_json_buf_reset(args);
    tool_json_buf_add(args, "{", 1);
    for (p = gt + 1;;) {
        while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
        if (eat(&p, e, "</function>")) break;
        if (!eat(&p, e, "<parameter=")) return 0;
        const char *ks = p, *ke = memchr(p, '>', (size_t)(e - p));
        if (!ke || ke == ks || memchr(ks, '<', (size_t)(ke - ks)) || memchr(ks, '\n', (size_t)(ke - ks))) return 0;
        const char *vs = ke + 1, *ve = find(vs, e, "</parameter>");
        if (!ve) return 0;
        p = ve + strlen("</parameter>");
        if (trim && vs < ve && *vs == '\n') vs++; /* the template's newlines around the value */
        if (trim && ve > vs && ve[-1] == '\n') ve--;
        put_arg(args, types, ns, *name_len, ks, ke, vs, ve);
    }
    while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
    if (p != e) return 0;
    tool_json_buf_add(args, "}", 1);
    return !args->oom;
}

/* The text of a quoted attribute `PREFIX"VALUE"` at *p: [*vs, *ve) the value (no '"', '<' or
 * newline in it); advances past the closing '"'. */
static int attr(const char **p, const char *e, const char *prefix, const char **vs, const char **ve)
{
    if (!eat(p, e, prefix)) return 0;
    const char *q = memchr(*p, '"', (size_t)(e - *p));
    if (!q || q == *p) return 0;
    for (const char *c = *p; c < q; c++)
        if (*c == '<' || *c == '\n') return 0;
    *vs = *p, *ve = q, *p = q + 1;
    return 1;
}

int tool_invoke(const char *s, size_t n, int dsml, const char *types, size_t *used, size_t *name_at, size_t *name_len,
                struct tool_json_buf *args)
{
    const char *e = s + n, *p = s, *ns, *ne;
    const char *const invoke = dsml ? TOOL_DSML "invoke name=\"" : "<invoke name=\"";
    const char *const invoke_end = dsml ? TOOL_DSML_END "invoke>" : "</invoke>";
    const char *const param = dsml ? TOOL_DSML "parameter name=\"" : "<parameter name=\"";
    const char *const param_end = dsml ? TOOL_DSML_END "parameter>" : "</parameter>";
    while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
    if (!attr(&p, e, invoke, &ns, &ne) || !eat(&p, e, ">")) return 0;
    for (const char *c = ns; c < ne; c++)
        if (tool_json_is_ws((unsigned char)*c)) return 0;
    *name_at = (size_t)(ns - s), *name_len = (size_t)(ne - ns);
    tool_json_buf_reset(args);
    tool_json_buf_add(args, "{", 1);
    for (;;) {
        while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
        if (eat(&p, e, invoke_end)) break;
        const char *ks, *ke;
        if (!attr(&p, e, param, &ks, &ke)) return 0;
        /* DSML: string="true" (the value raw, a string) or string="false" (the value as JSON) */
        const int raw = dsml && eat(&p, e, " string=\"true\"");
        if (dsml && !raw && !eat(&p, e, " string=\"false\"")) return 0;
        if (!eat(&p, e, ">")) return 0;
        const char *ve = find(p, e, param_end);
        if (!ve) return 0;
        if (raw) {
            put_key(args, ks, ke);
            json_string(args, p, ve);
        } else if (dsml && whole_json(p, ve)) { /* as the model wrote it, whatever the declared type */
            put_key(args, ks, ke);
            const char *ts = p, *te = ve;
            trim(&ts, &te);
            tool_json_buf_add(args, ts, (size_t)(te - ts));
        } else {
            put_arg(args, types, ns, *name_len, ks, ke, p, ve);
        }
        p = ve + strlen(param_end);
    }
    tool_json_buf_add(args, "}", 1);
    *used = (size_t)(p - s);
    return !args->oom;
}

/* ---- Gemma 4: `call:NAME{KEY:VALUE,...}` between <|tool_call> and <tool_call|> ---- */

/* One Gemma 4 value at *p (its template's format_argument): a string between <|"|> marks (any
 * bytes but the mark), an object `{KEY:VALUE,...}` (keys bare, or between marks), a list
 * `[VALUE,...]`, or a JSON number, true, false or null (None too: Jinja writes Python's None
 * so), appended to out as JSON; whitespace around tokens skipped. Depth bounded (64). Returns 0
 * when malformed. */
static int gemma4_value(const char **p, const char *e, struct tool_json_buf *out, int depth)
{
    const char *q = *p;
    while (q < e && tool_json_is_ws((unsigned char)*q)) q++;
    if (q >= e || depth > 64) return 0;
    if (eat(&q, e, TOOL_GEMMA4_QUOTE)) {
        const char *end = find(q, e, TOOL_GEMMA4_QUOTE);
        if (!end) return 0;
        json_string(out, q, end);
        *p = end + strlen(TOOL_GEMMA4_QUOTE);
        return 1;
    }
    if (*q == '{' || *q == '[') {
        const char close = *q == '{' ? '}' : ']';
        tool_json_buf_add(out, q, 1);
        q++;
        for (int first = 1;; first = 0) {
            while (q < e && tool_json_is_ws((unsigned char)*q)) q++;
            if (q < e && *q == close && first) break;
            if (!first && !(q < e && *q == ',')) {
                if (q < e && *q == close) break;
                return 0;
            }
            if (!first) q++, tool_json_buf_add(out, ",", 1);
            if (close == '}') {
                while (q < e && tool_json_is_ws((unsigned char)*q)) q++;
                const char *ks = q, *ke;
                if (eat(&q, e, TOOL_GEMMA4_QUOTE)) {
                    ks = q;
                    if (!(ke = find(q, e, TOOL_GEMMA4_QUOTE))) return 0;
                    q = ke + strlen(TOOL_GEMMA4_QUOTE);
                } else {
                    while (q < e && !strchr(":{}[],<", *q)) q++;
                    ke = q;
                    trim(&ks, &ke);
                    if (ke == ks) return 0;
                }
                while (q < e && tool_json_is_ws((unsigned char)*q)) q++;
                if (q >= e || *q++ != ':') return 0;
                json_string(out, ks, ke);
                tool_json_buf_add(out, ":", 1);
            }
            if (!gemma4_value(&q, e, out, depth + 1)) return 0;
        }
        tool_json_buf_add(out, &close, 1);
        *p = q + 1;
        return 1;
    }
    if (eat(&q, e, "None")) {
        tool_json_buf_add(out, "null", 4);
        *p = q;
        return 1;
    }
    const char *v = q;
    if (*q == '"' || !json_value(&q, e, depth)) return 0; /* (a JSON string is not Gemma's) */
    tool_json_buf_add(out, v, (size_t)(q - v));
    *p = q;
    return 1;
}

int tool_gemma4_call(const char *s, size_t n, size_t *name_at, size_t *name_len, struct tool_json_buf *args)
{
    const char *e = s + n, *p = s;
    while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
    if (!eat(&p, e, "call:")) return 0;
    const char *ns = p;
    while (p < e && *p != '{') {
        if (tool_json_is_ws((unsigned char)*p) || *p == '<') return 0;
        p++;
    }
    if (p == ns || p == e) return 0;
    *name_at = (size_t)(ns - s), *name_len = (size_t)(p - ns);
    tool_json_buf_reset(args);
    if (!gemma4_value(&p, e, args, 0)) return 0;
    while (p < e && tool_json_is_ws((unsigned char)*p)) p++;
    return p == e && !args->oom;
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

int tool_functionary_call(const char *s, size_t n, size_t *name_at, size_t *name_len, struct tool_json_buf *args)
{
    const char *e = s + n, *gt = memchr(s, '>', n);
    size_t args_at = 0, args_len = 0;
    if (!gt || !name_and_args(s, s, gt, gt + 1, e, name_at, name_len, &args_at, &args_len)) return 0;
    tool_json_buf_reset(args);
    tool_json_buf_add(args, s + args_at, args_len);
    return !args->oom;
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
