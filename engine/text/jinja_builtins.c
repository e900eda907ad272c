/* engine/text/jinja_builtins.c - jinja2's filters and tests, the Python str / dict / list methods
 * that chat templates call, and the global functions (range, dict, namespace, raise_exception,
 * strftime_now: jinja_tests.c), each following jinja2 3.1 and CPython; tojson is transformers' (json.dumps
 * with ensure_ascii=False and no key sorting), not jinja2's HTML-safe one. Case mapping
 * (upper, lower, title, capitalize) covers ASCII only. Not here: operators and statements
 * (jinja_eval.c), tests and globals (jinja_tests.c). Tests: tests/test_jinja.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja_impl.h"

/* The argument at position pos or named name (NULL: not given). args[0] is the subject. */
struct jargs {
    struct jv   *args;
    int          n_args;
    const char **kw_names;
    struct jv   *kw_vals;
    int          n_kw;
};

static struct jv *arg(const struct jargs *a, int pos, const char *name)
{
    if (pos >= 0 && pos < a->n_args) return &a->args[pos];
    for (int i = 0; name && i < a->n_kw; i++)
        if (!strcmp(a->kw_names[i], name)) return &a->kw_vals[i];
    return NULL;
}

static int arg_bool(const struct jargs *a, int pos, const char *name, int dflt)
{
    struct jv *v = arg(a, pos, name);
    return v ? jv_truthy(*v) : dflt;
}

static struct jv arg_str(struct jstate *st, const struct jargs *a, int pos, const char *name, const char *dflt)
{
    struct jv *v = arg(a, pos, name);
    if (!v || v->type == JV_NONE) return dflt ? jv_strz(dflt) : jv_none();
    if (v->type != JV_STRING) jfail(st, STATUS_INVALID_ARGUMENT, "argument '%s' must be a string, not %s", name, jv_type_name(*v));
    return *v;
}

static int64_t arg_int(struct jstate *st, const struct jargs *a, int pos, const char *name, int64_t dflt)
{
    struct jv *v = arg(a, pos, name);
    if (!v || v->type == JV_NONE) return dflt;
    if (v->type == JV_INT) return v->u.i;
    if (v->type == JV_BOOL) return v->u.b;
    jfail(st, STATUS_INVALID_ARGUMENT, "argument '%s' must be an integer, not %s", name, jv_type_name(*v));
}

static struct jv need_str(struct jstate *st, struct jv v, const char *what)
{
    if (v.type != JV_STRING) jfail(st, STATUS_INVALID_ARGUMENT, "%s: expected a string, not %s", what, jv_type_name(v));
    return v;
}

static struct jv buf_value(struct jstate *st, struct jbuf *b) { return jv_str(st, b->p ? b->p : "", b->n); }

/* ---- strings -------------------------------------------------------------------------- */

/* Bytes of the Unicode whitespace character (str.isspace) at p[0..n), 0 when none. */
static size_t space_at(const char *p, size_t n)
{
    unsigned char c = (unsigned char)p[0];
    if (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f)) return 1;
    if (n >= 2 && c == 0xC2 && ((unsigned char)p[1] == 0x85 || (unsigned char)p[1] == 0xA0)) return 2;
    if (n >= 3 && c == 0xE1 && (unsigned char)p[1] == 0x9A && (unsigned char)p[2] == 0x80) return 3;
    if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x80) {
        unsigned char d = (unsigned char)p[2];
        if (d <= 0x8A || d == 0xA8 || d == 0xA9 || d == 0xAF) return 3;
    }
    if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x81 && (unsigned char)p[2] == 0x9F) return 3;
    if (n >= 3 && c == 0xE3 && (unsigned char)p[1] == 0x80 && (unsigned char)p[2] == 0x80) return 3;
    return 0;
}

/* Bytes of the whitespace character that ends p[0..n), 0 when none. */
static size_t space_before(const char *p, size_t n)
{
    if (!n) return 0;
    size_t k = n - 1;
    while (k > 0 && ((unsigned char)p[k] & 0xC0) == 0x80 && n - k < 4) k--;
    return space_at(p + k, n - k) == n - k ? n - k : 0;
}

static int in_chars(struct jv chars, const char *p, size_t len)
{
    for (size_t i = 0; i + len <= chars.u.s.n;) {
        size_t cl = utf8_offset(chars.u.s.p + i, chars.u.s.n - i, 1);
        if (cl == len && !memcmp(chars.u.s.p + i, p, len)) return 1;
        i += cl ? cl : 1;
    }
    return 0;
}

/* str.strip / lstrip / rstrip; chars JV_NONE: whitespace. */
static struct jv strip(struct jstate *st, struct jv s, struct jv chars, int left, int right)
{
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    while (left && a < b) {
        size_t k = chars.type == JV_STRING ? utf8_offset(p + a, b - a, 1) : space_at(p + a, b - a);
        if (!k || (chars.type == JV_STRING && !in_chars(chars, p + a, k))) break;
        a += k;
    }
    while (right && b > a) {
        size_t k;
        if (chars.type == JV_STRING) {
            k = 1;
            while (k < b - a && ((unsigned char)p[b - k] & 0xC0) == 0x80) k++;
            if (!in_chars(chars, p + b - k, k)) break;
        } else if (!(k = space_before(p + a, b - a))) {
            break;
        }
        b -= k;
    }
    return jv_str(st, p + a, b - a);
}

struct jv jstr_case(struct jstate *st, struct jv s, int mode /* 'u' upper, 'l' lower, 't' title, 'c' capitalize */)
{
    char *d = jalloc(st, s.u.s.n + 1);
    int prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n; i++) {
        char c = s.u.s.p[i];
        int is_up = c >= 'A' && c <= 'Z', is_lo = c >= 'a' && c <= 'z';
        int upper = mode == 'u' || (mode == 't' && !prev_cased) || (mode == 'c' && i == 0);
        if (upper && is_lo) c = (char)(c - 32);
        else if (!upper && is_up && mode != 'u') c = (char)(c + 32);
        prev_cased = is_up || is_lo || (unsigned char)c >= 0x80;
        d[i] = c;
    }
    d[s.u.s.n] = 0;
    struct jv r = {.type = JV_STRING};
    r.u.s.p = d;
    r.u.s.n = s.u.s.n;
    return r;
}

const char *jstr_find(const char *h, size_t hn, const char *nd, size_t nn)
{
    if (!nn) return h;
    for (size_t i = 0; i + nn <= hn; i++)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

static struct jv replace(struct jstate *st, struct jv s, struct jv old, struct jv new, int64_t count)
{
    struct jbuf b = {0};
    size_t i = 0;
    if (!old.u.s.n) { /* Python inserts new between every character */
        struct jlist *chars = jv_iter(st, s);
        for (size_t k = 0; k <= chars->n; k++) {
            if (count < 0 || (int64_t)k < count) jbuf_put(st, &b, new.u.s.p, new.u.s.n);
            if (k < chars->n) jbuf_put(st, &b, chars->v[k].u.s.p, chars->v[k].u.s.n);
        }
        return buf_value(st, &b);
    }
    for (int64_t done = 0; count < 0 || done < count; done++) {
        const char *at = jstr_find(s.u.s.p + i, s.u.s.n - i, old.u.s.p, old.u.s.n);
        if (!at) break;
        jbuf_put(st, &b, s.u.s.p + i, (size_t)(at - (s.u.s.p + i)));
        jbuf_put(st, &b, new.u.s.p, new.u.s.n);
        i = (size_t)(at - s.u.s.p) + old.u.s.n;
    }
    jbuf_put(st, &b, s.u.s.p + i, s.u.s.n - i);
    return buf_value(st, &b);
}

static struct jv split(struct jstate *st, struct jv s, struct jv sep, int64_t maxsplit)
{
    struct jv r = jv_list_new(st, 0);
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    if (sep.type != JV_STRING) {
        for (;;) {
            size_t k;
            while (i < n && (k = space_at(p + i, n - i))) i += k;
            if (i >= n) break;
            if (maxsplit >= 0 && (int64_t)r.u.l->n >= maxsplit) {
                size_t e = n;
                while (e > i && (k = space_before(p + i, e - i))) e -= k;
                jv_list_push(st, r, jv_str(st, p + i, e - i));
                break;
            }
            size_t j = i;
            while (j < n && !space_at(p + j, n - j)) j += utf8_offset(p + j, n - j, 1);
            jv_list_push(st, r, jv_str(st, p + i, j - i));
            i = j;
        }
        return r;
    }
    if (!sep.u.s.n) jfail(st, STATUS_INVALID_ARGUMENT, "empty separator");
    for (;;) {
        const char *at = maxsplit >= 0 && (int64_t)r.u.l->n >= maxsplit ? NULL : jstr_find(p + i, n - i, sep.u.s.p, sep.u.s.n);
        if (!at) {
            jv_list_push(st, r, jv_str(st, p + i, n - i));
            return r;
        }
        jv_list_push(st, r, jv_str(st, p + i, (size_t)(at - (p + i))));
        i = (size_t)(at - p) + sep.u.s.n;
    }
}

static int starts_ends(struct jstate *st, struct jv s, struct jv x, int ends)
{
    if (x.type == JV_TUPLE) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (starts_ends(st, s, x.u.l->v[i], ends)) return 1;
        return 0;
    }
    need_str(st, x, ends ? "endswith" : "startswith");
    if (x.u.s.n > s.u.s.n) return 0;
    return !memcmp(s.u.s.p + (ends ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n);
}

/* ---- sequences ------------------------------------------------------------------------ */

/* jinja2's make_attrgetter: "a.b.0" looked up part by part (items first, as getitem does). */
static struct jv get_path(struct jstate *st, struct jv v, struct jv path)
{
    if (path.type == JV_INT) return jgetitem(st, v, path);
    need_str(st, path, "attribute");
    const char *p = path.u.s.p, *end = p + path.u.s.n;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        struct jv key = jv_str(st, p, (size_t)(dot - p));
        int digits = dot > p;
        for (const char *q = p; q < dot; q++) digits &= *q >= '0' && *q <= '9';
        if (digits) key = jv_int(strtoll(key.u.s.p, NULL, 10));
        v = jgetitem(st, v, key);
        p = dot + 1;
    }
    return v;
}

/* The sort key of sort, unique, min, max and dictsort: lowered strings unless case_sensitive. */
static struct jv sort_key(struct jstate *st, struct jv v, int case_sensitive)
{
    return !case_sensitive && v.type == JV_STRING ? jstr_case(st, v, 'l') : v;
}

/* A stable merge sort of v[0..n) by keys k (compared with jv_compare). */
static void merge_sort(struct jstate *st, struct jv *v, struct jv *k, size_t n, int reverse)
{
    if (n < 2) return;
    size_t h = n / 2;
    merge_sort(st, v, k, h, reverse);
    merge_sort(st, v + h, k + h, n - h, reverse);
    struct jv *tv = jalloc(st, n * sizeof(*tv)), *tk = jalloc(st, n * sizeof(*tk));
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        int c = jv_compare(st, k[j], k[i]);
        int take_right = reverse ? c > 0 : c < 0;
        if (take_right) tv[o] = v[j], tk[o++] = k[j++];
        else tv[o] = v[i], tk[o++] = k[i++];
    }
    while (i < h) tv[o] = v[i], tk[o++] = k[i++];
    while (j < n) tv[o] = v[j], tk[o++] = k[j++];
    memcpy(v, tv, n * sizeof(*v));
    memcpy(k, tk, n * sizeof(*k));
}

static struct jv list_of(struct jstate *st, struct jlist *l)
{
    struct jv r = jv_list_new(st, l->n);
    for (size_t i = 0; i < l->n; i++) jv_list_push(st, r, l->v[i]);
    return r;
}

static struct jv items_of(struct jstate *st, struct jv d)
{
    if (d.type == JV_UNDEFINED) return jv_list_new(st, 0);
    if (d.type != JV_DICT && d.type != JV_NAMESPACE) jfail(st, STATUS_INVALID_ARGUMENT, "items: can only get item pairs from a mapping");
    struct jv r = jv_list_new(st, d.u.d->n);
    for (size_t i = 0; i < d.u.d->n; i++) {
        struct jv t = jv_list_new(st, 2);
        t.type = JV_TUPLE;
        jv_list_push(st, t, d.u.d->k[i]);
        jv_list_push(st, t, d.u.d->v[i]);
        jv_list_push(st, r, t);
    }
    return r;
}

/* select / reject / selectattr / rejectattr: a[1] is the attribute when attr is set. A falsy
 * value (none, "", an empty list) selects nothing, its arguments unread (jinja2's `if value:`:
 * functionary v3.1's template filters a `tools` that is none). */
static struct jv select_items(struct jstate *st, const struct jargs *a, int attr, int keep)
{
    struct jv r = jv_list_new(st, 0);
    if (!jv_truthy(a->args[0])) return r;
    struct jlist *l = jv_iter(st, a->args[0]);
    int t = 1 + attr;
    if (attr && a->n_args < 2) jfail(st, STATUS_INVALID_ARGUMENT, "selectattr: missing attribute");
    for (size_t i = 0; i < l->n; i++) {
        struct jv x = attr ? get_path(st, l->v[i], a->args[1]) : l->v[i];
        int ok;
        if (a->n_args > t) {
            need_str(st, a->args[t], "test name");
            struct jv *targs = jalloc(st, (size_t)(a->n_args - t) * sizeof(*targs));
            targs[0] = x;
            for (int k = t + 1; k < a->n_args; k++) targs[k - t] = a->args[k];
            ok = jtest(st, a->args[t].u.s.p, targs, a->n_args - t);
        } else {
            ok = jv_truthy(x);
        }
        if (ok == keep) jv_list_push(st, r, l->v[i]);
    }
    return r;
}

static struct jv min_max(struct jstate *st, const struct jargs *a, int want_max)
{
    struct jlist *l = jv_iter(st, a->args[0]);
    int cs = arg_bool(a, 1, "case_sensitive", 0);
    struct jv *attr = arg(a, 2, "attribute");
    if (!l->n) return jv_undef(NULL);
    struct jv best = l->v[0], bk = sort_key(st, attr ? get_path(st, best, *attr) : best, cs);
    for (size_t i = 1; i < l->n; i++) {
        struct jv k = sort_key(st, attr ? get_path(st, l->v[i], *attr) : l->v[i], cs);
        int c = jv_compare(st, k, bk);
        if (want_max ? c > 0 : c < 0) best = l->v[i], bk = k;
    }
    return best;
}

static struct jv tojson(struct jstate *st, const struct jargs *a)
{
    int ascii = arg_bool(a, 1, "ensure_ascii", 0);
    struct jv *ind = arg(a, 2, "indent"), *seps = arg(a, 3, "separators");
    int sort_keys = arg_bool(a, 4, "sort_keys", 0);
    const char *indent = NULL;
    if (ind && ind->type == JV_INT) {
        if (ind->u.i > 64) jfail(st, STATUS_INVALID_ARGUMENT, "tojson: indent too large");
        char *s = jalloc(st, (size_t)(ind->u.i > 0 ? ind->u.i : 0) + 1);
        memset(s, ' ', (size_t)(ind->u.i > 0 ? ind->u.i : 0));
        s[ind->u.i > 0 ? ind->u.i : 0] = 0;
        indent = s;
    } else if (ind && ind->type == JV_STRING) {
        indent = jv_str(st, ind->u.s.p, ind->u.s.n).u.s.p;
    } else if (ind && ind->type != JV_NONE) {
        jfail(st, STATUS_INVALID_ARGUMENT, "tojson: bad indent");
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (seps && seps->type != JV_NONE) {
        if ((seps->type != JV_TUPLE && seps->type != JV_LIST) || seps->u.l->n != 2 ||
            seps->u.l->v[0].type != JV_STRING || seps->u.l->v[1].type != JV_STRING)
            jfail(st, STATUS_INVALID_ARGUMENT, "tojson: separators must be two strings");
        item_sep = jv_str(st, seps->u.l->v[0].u.s.p, seps->u.l->v[0].u.s.n).u.s.p;
        key_sep = jv_str(st, seps->u.l->v[1].u.s.p, seps->u.l->v[1].u.s.n).u.s.p;
    }
    struct jbuf b = {0};
    jv_append_json(st, &b, a->args[0], ascii, indent, item_sep, key_sep, sort_keys, 0);
    return buf_value(st, &b);
}

static struct jv indent_filter(struct jstate *st, const struct jargs *a)
{
    struct jv s = jv_to_string(st, a->args[0]), *w = arg(a, 1, "width");
    int first = arg_bool(a, 2, "first", 0), blank = arg_bool(a, 3, "blank", 0);
    struct jv ind = jv_strz("    ");
    if (w && w->type == JV_STRING) ind = *w;
    else if (w) {
        int64_t k = arg_int(st, a, 1, "width", 4);
        if (k < 0 || k > 1024) jfail(st, STATUS_INVALID_ARGUMENT, "indent: bad width");
        char *p = jalloc(st, (size_t)k + 1);
        memset(p, ' ', (size_t)k);
        ind = jv_str(st, p, (size_t)k);
    }
    /* s + "\n", then splitlines(): each line without its break, no empty last line */
    struct jbuf b = {0};
    if (first) jbuf_put(st, &b, ind.u.s.p, ind.u.s.n);
    size_t i = 0, line_no = 0;
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    for (;;) {
        size_t j = i;
        while (j < n && p[j] != '\n' && p[j] != '\r') j++;
        if (line_no) {
            jbuf_putc(st, &b, '\n');
            if (blank || j > i) jbuf_put(st, &b, ind.u.s.p, ind.u.s.n);
        }
        jbuf_put(st, &b, p + i, j - i);
        line_no++;
        if (j >= n) break;
        j += p[j] == '\r' && j + 1 < n && p[j + 1] == '\n' ? 2 : 1;
        if (j >= n) break;
        i = j;
    }
    return buf_value(st, &b);
}

struct jv jfilter(struct jstate *st, const char *name, struct jv *args, int n_args,
                  const char **kw_names, struct jv *kw_vals, int n_kw)
{
    struct jargs a = {args, n_args, kw_names, kw_vals, n_kw};
    struct jv v = args[0];
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        struct jv *d = arg(&a, 1, "default_value");
        int boolean = arg_bool(&a, 2, "boolean", 0);
        if (v.type == JV_UNDEFINED || (boolean && !jv_truthy(v))) return d ? *d : jv_strz("");
        return v;
    }
    if (!strcmp(name, "tojson")) return tojson(st, &a);
    if (!strcmp(name, "from_json")) { /* llama.cpp's (DeepSeek V3.2's template): a string of JSON as its value */
        struct jv out;
        if (v.type != JV_STRING || jv_parse_json(st, v.u.s.p, v.u.s.n, &out))
            jfail(st, STATUS_INVALID_ARGUMENT, "from_json: not a string of one JSON value");
        return out;
    }
    if (!strcmp(name, "safe")) { /* (a Markup of the value's text) */
        struct jv s = v.type == JV_STRING ? v : jv_to_string(st, v);
        s.safe = 1;
        return s;
    }
    if (!strcmp(name, "string")) return jv_to_string(st, v);
    if (!strcmp(name, "trim")) return strip(st, jv_to_string(st, v), arg_str(st, &a, 1, "chars", NULL), 1, 1);
    if (!strcmp(name, "upper")) return jstr_case(st, jv_to_string(st, v), 'u');
    if (!strcmp(name, "lower")) return jstr_case(st, jv_to_string(st, v), 'l');
    if (!strcmp(name, "capitalize")) return jstr_case(st, jv_to_string(st, v), 'c');
    if (!strcmp(name, "title")) {
        /* jinja2: words begin after runs of -, whitespace, ( { [ < */
        struct jv s = jv_to_string(st, v), r = jstr_case(st, s, 'l');
        char *d = (char *)r.u.s.p;
        for (size_t i = 0; i < s.u.s.n; i++) {
            int begins = i == 0 || strchr("-({[<", d[i - 1]) || space_before(s.u.s.p, i);
            if (begins && d[i] >= 'a' && d[i] <= 'z') d[i] = (char)(d[i] - 32);
        }
        return r;
    }
    if (!strcmp(name, "replace")) {
        struct jv s = jv_to_string(st, v);
        struct jv old = arg(&a, 1, "old") ? jv_to_string(st, *arg(&a, 1, "old")) : jv_strz("");
        struct jv new = arg(&a, 2, "new") ? jv_to_string(st, *arg(&a, 2, "new")) : jv_strz("");
        return replace(st, s, old, new, arg_int(st, &a, 3, "count", -1));
    }
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.type == JV_STRING) return jv_int((int64_t)utf8_len(v.u.s.p, v.u.s.n));
        if (v.type == JV_DICT || v.type == JV_NAMESPACE) return jv_int((int64_t)v.u.d->n);
        if (v.type == JV_LIST || v.type == JV_TUPLE) return jv_int((int64_t)v.u.l->n);
        if (v.type == JV_UNDEFINED) return jv_int(0);
        jfail(st, STATUS_INVALID_ARGUMENT, "object of type '%s' has no len()", jv_type_name(v));
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        struct jlist *l = jv_iter(st, v);
        if (!l->n) return jv_undef(NULL);
        return name[0] == 'f' ? l->v[0] : l->v[l->n - 1];
    }
    if (!strcmp(name, "list")) return list_of(st, jv_iter(st, v));
    if (!strcmp(name, "items")) return items_of(st, v);
    if (!strcmp(name, "join")) {
        struct jlist *l = jv_iter(st, v);
        struct jv sep = arg_str(st, &a, 1, "d", ""), *attr = arg(&a, 2, "attribute");
        struct jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_put(st, &b, sep.u.s.p, sep.u.s.n);
            jv_append_str(st, &b, attr ? get_path(st, l->v[i], *attr) : l->v[i]);
        }
        return buf_value(st, &b);
    }
    if (!strcmp(name, "map")) {
        struct jlist *l = jv_iter(st, v);
        struct jv r = jv_list_new(st, l->n), *attr = arg(&a, 99, "attribute");
        for (size_t i = 0; i < l->n; i++) {
            if (attr) {
                struct jv x = get_path(st, l->v[i], *attr), *d = arg(&a, 99, "default");
                jv_list_push(st, r, x.type == JV_UNDEFINED && d ? *d : x);
                continue;
            }
            if (n_args < 2) jfail(st, STATUS_INVALID_ARGUMENT, "map: a filter name or attribute= is required");
            need_str(st, args[1], "map");
            struct jv *fargs = jalloc(st, (size_t)(n_args - 1) * sizeof(*fargs));
            fargs[0] = l->v[i];
            for (int k = 2; k < n_args; k++) fargs[k - 1] = args[k];
            jv_list_push(st, r, jfilter(st, args[1].u.s.p, fargs, n_args - 1, kw_names, kw_vals, n_kw));
        }
        return r;
    }
    if (!strcmp(name, "select")) return select_items(st, &a, 0, 1);
    if (!strcmp(name, "reject")) return select_items(st, &a, 0, 0);
    if (!strcmp(name, "selectattr")) return select_items(st, &a, 1, 1);
    if (!strcmp(name, "rejectattr")) return select_items(st, &a, 1, 0);
    if (!strcmp(name, "reverse")) {
        struct jlist *l = jv_iter(st, v);
        struct jv r = jv_list_new(st, l->n);
        for (size_t i = l->n; i-- > 0;) jv_list_push(st, r, l->v[i]);
        if (v.type != JV_STRING) return r;
        struct jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) jv_append_str(st, &b, r.u.l->v[i]);
        return buf_value(st, &b);
    }
    if (!strcmp(name, "sort") || !strcmp(name, "dictsort")) {
        int dict = name[0] == 'd';
        struct jv r = dict ? items_of(st, v) : list_of(st, jv_iter(st, v));
        int reverse = dict ? arg_bool(&a, 3, "reverse", 0) : arg_bool(&a, 1, "reverse", 0);
        int cs = arg_bool(&a, dict ? 1 : 2, "case_sensitive", 0);
        struct jv *attr = dict ? NULL : arg(&a, 3, "attribute");
        int by_value = dict && !strcmp(arg_str(st, &a, 2, "by", "key").u.s.p, "value");
        struct jv *keys = jalloc(st, r.u.l->n * sizeof(*keys));
        for (size_t i = 0; i < r.u.l->n; i++) {
            struct jv x = r.u.l->v[i];
            if (dict) x = x.u.l->v[by_value];
            else if (attr) x = get_path(st, x, *attr);
            keys[i] = sort_key(st, x, cs);
        }
        merge_sort(st, r.u.l->v, keys, r.u.l->n, reverse);
        return r;
    }
    if (!strcmp(name, "unique")) {
        struct jlist *l = jv_iter(st, v);
        int cs = arg_bool(&a, 1, "case_sensitive", 0);
        struct jv *attr = arg(&a, 2, "attribute");
        struct jv r = jv_list_new(st, 0), seen = jv_list_new(st, 0);
        for (size_t i = 0; i < l->n; i++) {
            struct jv k = sort_key(st, attr ? get_path(st, l->v[i], *attr) : l->v[i], cs);
            int dup = 0;
            for (size_t j = 0; j < seen.u.l->n && !dup; j++) dup = jv_equal(seen.u.l->v[j], k);
            if (!dup) jv_list_push(st, seen, k), jv_list_push(st, r, l->v[i]);
        }
        return r;
    }
    if (!strcmp(name, "min")) return min_max(st, &a, 0);
    if (!strcmp(name, "max")) return min_max(st, &a, 1);
    if (!strcmp(name, "sum")) {
        struct jlist *l = jv_iter(st, v);
        struct jv *attr = arg(&a, 1, "attribute"), *start = arg(&a, 2, "start");
        struct jv acc = start ? *start : jv_int(0);
        for (size_t i = 0; i < l->n; i++) {
            struct jv x = attr ? get_path(st, l->v[i], *attr) : l->v[i];
            if (!jv_is_number(acc) || !jv_is_number(x)) jfail(st, STATUS_INVALID_ARGUMENT, "sum: not a number");
            if (acc.type == JV_FLOAT || x.type == JV_FLOAT) acc = jv_float(jv_as_double(acc) + jv_as_double(x));
            else if (__builtin_add_overflow(acc.type == JV_INT ? acc.u.i : acc.u.b, x.type == JV_INT ? x.u.i : x.u.b, &acc.u.i))
                jfail(st, STATUS_INVALID_ARGUMENT, "integer overflow");
            else acc.type = JV_INT;
        }
        return acc;
    }
    if (!strcmp(name, "abs")) {
        if (v.type == JV_FLOAT) return jv_float(fabs(v.u.f));
        if (v.type == JV_INT && v.u.i != INT64_MIN) return jv_int(v.u.i < 0 ? -v.u.i : v.u.i);
        if (v.type == JV_BOOL) return jv_int(v.u.b);
        jfail(st, STATUS_INVALID_ARGUMENT, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    if (!strcmp(name, "int") || !strcmp(name, "float")) {
        int want_int = name[0] == 'i';
        struct jv *d = arg(&a, 1, "default");
        struct jv dflt = d ? *d : want_int ? jv_int(0) : jv_float(0.0);
        double f;
        if (v.type == JV_INT || v.type == JV_BOOL) f = (double)(v.type == JV_INT ? v.u.i : v.u.b);
        else if (v.type == JV_FLOAT) f = v.u.f;
        else if (v.type == JV_STRING) {
            struct jv s = strip(st, v, jv_none(), 1, 1);
            char *end;
            if (!s.u.s.n) return dflt;
            if (want_int) {
                long long i = strtoll(s.u.s.p, &end, 10);
                if (!*end) return jv_int(i);
            }
            f = strtod(s.u.s.p, &end);
            if (*end || isnan(f) != 0) return dflt;
        } else {
            return dflt;
        }
        if (!want_int) return jv_float(f);
        if (!isfinite(f) || fabs(f) > 9.2e18) return dflt;
        return jv_int((int64_t)f);
    }
    if (!strcmp(name, "round")) {
        int64_t prec = arg_int(st, &a, 1, "precision", 0);
        struct jv method = arg_str(st, &a, 2, "method", "common");
        if (!jv_is_number(v)) jfail(st, STATUS_INVALID_ARGUMENT, "round: not a number");
        double x = jv_as_double(v), m = pow(10.0, (double)prec);
        if (!strcmp(method.u.s.p, "floor")) return jv_float(floor(x * m) / m);
        if (!strcmp(method.u.s.p, "ceil")) return jv_float(ceil(x * m) / m);
        if (v.type != JV_FLOAT) return v.type == JV_BOOL ? jv_int(v.u.b) : v;
        return jv_float(nearbyint(x * m) / m);
    }
    if (!strcmp(name, "indent")) return indent_filter(st, &a);
    if (!strcmp(name, "escape") || !strcmp(name, "e")) return jv_escape(st, v);
    if (!strcmp(name, "attr")) return jgetattr(st, v, need_str(st, args[n_args > 1 ? 1 : 0], "attr").u.s.p);
    if (!strcmp(name, "batch")) {
        struct jlist *l = jv_iter(st, v);
        int64_t k = arg_int(st, &a, 1, "linecount", 1);
        struct jv *fill = arg(&a, 2, "fill_with");
        if (k <= 0) jfail(st, STATUS_INVALID_ARGUMENT, "batch: linecount must be positive");
        struct jv r = jv_list_new(st, 0), cur = jv_list_new(st, 0);
        for (size_t i = 0; i < l->n; i++) {
            jv_list_push(st, cur, l->v[i]);
            if ((int64_t)cur.u.l->n == k) jv_list_push(st, r, cur), cur = jv_list_new(st, 0);
        }
        if (cur.u.l->n) {
            while (fill && (int64_t)cur.u.l->n < k) jv_list_push(st, cur, *fill);
            jv_list_push(st, r, cur);
        }
        return r;
    }
    jfail(st, STATUS_INVALID_ARGUMENT, "no filter named '%s'", name);
}

/* ---- methods -------------------------------------------------------------------------- */
static int str_method(struct jstate *st, struct jv s, const char *m, const struct jargs *a, struct jv *out)
{
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        *out = strip(st, s, arg_str(st, a, 1, "chars", NULL), m[0] != 'r', m[0] != 'l');
    } else if (!strcmp(m, "upper") || !strcmp(m, "lower") || !strcmp(m, "title") || !strcmp(m, "capitalize")) {
        *out = jstr_case(st, s, m[0] == 'c' ? 'c' : m[0]);
    } else if (!strcmp(m, "split")) {
        *out = split(st, s, arg_str(st, a, 1, "sep", NULL), arg_int(st, a, 2, "maxsplit", -1));
    } else if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (a->n_args < 2) jfail(st, STATUS_INVALID_ARGUMENT, "%s() takes at least 1 argument", m);
        *out = jv_bool(starts_ends(st, s, a->args[1], m[0] == 'e'));
    } else if (!strcmp(m, "replace")) {
        if (a->n_args < 3) jfail(st, STATUS_INVALID_ARGUMENT, "replace() takes at least 2 arguments");
        *out = replace(st, s, need_str(st, a->args[1], "replace"), need_str(st, a->args[2], "replace"),
                       arg_int(st, a, 3, "count", -1));
    } else if (!strcmp(m, "find") || !strcmp(m, "count") || !strcmp(m, "index")) {
        struct jv x = need_str(st, a->n_args > 1 ? a->args[1] : jv_none(), m);
        const char *at = jstr_find(s.u.s.p, s.u.s.n, x.u.s.p, x.u.s.n);
        if (m[0] == 'c') {
            int64_t c = 0;
            if (!x.u.s.n) c = (int64_t)utf8_len(s.u.s.p, s.u.s.n) + 1;
            else
                for (size_t i = 0; (at = jstr_find(s.u.s.p + i, s.u.s.n - i, x.u.s.p, x.u.s.n)); c++)
                    i = (size_t)(at - s.u.s.p) + x.u.s.n;
            *out = jv_int(c);
        } else {
            if (!at && m[0] == 'i') jfail(st, STATUS_INVALID_ARGUMENT, "substring not found");
            *out = jv_int(at ? (int64_t)utf8_len(s.u.s.p, (size_t)(at - s.u.s.p)) : -1);
        }
    } else if (!strcmp(m, "join")) {
        struct jlist *l = jv_iter(st, a->n_args > 1 ? a->args[1] : jv_none());
        struct jbuf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (i) jbuf_put(st, &b, s.u.s.p, s.u.s.n);
            jbuf_put(st, &b, need_str(st, l->v[i], "join").u.s.p, l->v[i].u.s.n);
        }
        *out = buf_value(st, &b);
    } else if (!strcmp(m, "isdigit") || !strcmp(m, "isalpha") || !strcmp(m, "isalnum") || !strcmp(m, "isspace")) {
        int ok = s.u.s.n > 0;
        for (size_t i = 0; i < s.u.s.n && ok; i++) {
            unsigned char c = (unsigned char)s.u.s.p[i];
            int d = c >= '0' && c <= '9', al = (c | 32) >= 'a' && (c | 32) <= 'z';
            ok = m[2] == 'd' ? d : m[2] == 's' ? space_at(s.u.s.p + i, s.u.s.n - i) != 0
                 : m[4] == 'a' && m[5] == 0 ? al : (al || d);
        }
        *out = jv_bool(ok);
    } else if (!strcmp(m, "format")) {
        struct jbuf b = {0};
        int next = 1;
        for (size_t i = 0; i < s.u.s.n; i++) {
            char c = s.u.s.p[i];
            if ((c == '{' || c == '}') && i + 1 < s.u.s.n && s.u.s.p[i + 1] == c) {
                jbuf_putc(st, &b, c), i++;
            } else if (c == '{') {
                size_t j = i + 1;
                while (j < s.u.s.n && s.u.s.p[j] != '}') j++;
                if (j >= s.u.s.n) jfail(st, STATUS_INVALID_ARGUMENT, "format: unmatched '{'");
                struct jv *x = NULL;
                if (j == i + 1) x = arg(a, next++, NULL);
                else if (s.u.s.p[i + 1] >= '0' && s.u.s.p[i + 1] <= '9') {
                    /* A field number: its digits, bounded (atoi's overflow read before args). */
                    long pos = 0;
                    for (size_t d = i + 1; d < j && s.u.s.p[d] >= '0' && s.u.s.p[d] <= '9' && pos <= a->n_args; d++)
                        pos = pos * 10 + (s.u.s.p[d] - '0');
                    x = arg(a, (int)(1 + pos), NULL);
                }
                else {
                    char key[64];
                    snprintf(key, sizeof(key), "%.*s", (int)(j - i - 1), s.u.s.p + i + 1);
                    for (int k = 0; k < a->n_kw; k++)
                        if (!strcmp(a->kw_names[k], key)) x = &a->kw_vals[k];
                }
                if (!x) jfail(st, STATUS_INVALID_ARGUMENT, "format: missing argument");
                jv_append_str(st, &b, *x);
                i = j;
            } else {
                jbuf_putc(st, &b, c);
            }
        }
        *out = buf_value(st, &b);
    } else {
        return 0;
    }
    return 1;
}

int jmethod(struct jstate *st, struct jv obj, const char *name, struct jv *args, int n_args,
            const char **kw_names, struct jv *kw_vals, int n_kw, struct jv *out)
{
    struct jv *all = jalloc(st, (size_t)(n_args + 1) * sizeof(*all));
    all[0] = obj;
    if (n_args) memcpy(all + 1, args, (size_t)n_args * sizeof(*all));
    struct jargs a = {all, n_args + 1, kw_names, kw_vals, n_kw};
    if (obj.type == JV_STRING) return str_method(st, obj, name, &a, out);
    if (obj.type == JV_DICT) {
        if (!strcmp(name, "items")) return *out = items_of(st, obj), 1;
        if (!strcmp(name, "keys") || !strcmp(name, "values")) {
            struct jv r = jv_list_new(st, obj.u.d->n);
            for (size_t i = 0; i < obj.u.d->n; i++) jv_list_push(st, r, name[0] == 'k' ? obj.u.d->k[i] : obj.u.d->v[i]);
            return *out = r, 1;
        }
        if (!strcmp(name, "get")) {
            if (n_args < 1) jfail(st, STATUS_INVALID_ARGUMENT, "get expected at least 1 argument");
            struct jv v = jv_dict_get(&obj, args[0]), *d = arg(&a, 2, "default");
            return *out = v.type != JV_UNDEFINED ? v : d ? *d : jv_none(), 1;
        }
    }
    if (obj.type == JV_LOOP && !strcmp(name, "cycle")) {
        if (!n_args) jfail(st, STATUS_INVALID_ARGUMENT, "no items for cycling given");
        return *out = args[jgetattr(st, obj, "index0").u.i % n_args], 1;
    }
    static const char *const unsafe[] = {"append", "extend", "insert", "pop", "remove", "clear",
                                         "update", "setdefault", "popitem", "sort", "reverse", NULL};
    if (obj.type == JV_LIST || obj.type == JV_DICT)
        for (int i = 0; unsafe[i]; i++)
            if (!strcmp(name, unsafe[i]))
                jfail(st, STATUS_INVALID_ARGUMENT, "access to attribute '%s' of '%s' object is unsafe", name, jv_type_name(obj));
    return 0;
}

