/* engine/text/jinja_value.c - the values of the Jinja interpreter and what Python does with
 * them: truthiness, equality and ordering, str() and repr() (Python's shortest float repr
 * included), json.dumps (as transformers' tojson calls it) and json.loads for the render
 * context; the arena they live in and the render's error exit. Not here: operators and
 * statements (jinja_eval.c), filters and methods (jinja_builtins.c). Tests: tests/test_jinja.py. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

/* ---- arena and errors ----------------------------------------------------------------- */
struct jarena_chunk {
    struct jarena_chunk *next;
    size_t               used, cap;
    _Alignas(16) unsigned char data[];
};

void *jarena_alloc(struct jarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (a->limit && (a->used + n > a->limit || n > a->limit)) return NULL;
    struct jarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > 65536 ? n : 65536;
        c = malloc(sizeof(*c) + cap);
        if (!c) return NULL;
        c->used = 0;
        c->cap = cap;
        if (n > 65536 && a->head) { /* a big block: keep filling the current chunk */
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

void jarena_free(struct jarena *a)
{
    struct jarena_chunk *c = a->head;
    while (c) {
        struct jarena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

_Noreturn void jfail(struct jstate *st, enum status s, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(st->msg, sizeof(st->msg), "line %d: ", st->line);
    va_start(ap, fmt);
    vsnprintf(st->msg + n, sizeof(st->msg) - (size_t)n, fmt, ap);
    va_end(ap);
    st->err = s;
    longjmp(st->jb, 1);
}

void *jalloc(struct jstate *st, size_t n)
{
    void *p = jarena_alloc(st->arena, n ? n : 1);
    if (!p)
        jfail(st, STATUS_RESOURCE_EXHAUSTED, "template memory limit (%zu bytes) exceeded",
              st->arena->limit);
    return p;
}

void jbuf_put(struct jstate *st, struct jbuf *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t limit = st->t ? st->t->opt.max_output : (size_t)-1;
        if (b->n + n > limit) jfail(st, STATUS_RESOURCE_EXHAUSTED, "template output limit (%zu bytes) exceeded", limit);
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = jalloc(st, cap);
        if (b->n) memcpy(q, b->p, b->n);
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
}
void jbuf_putc(struct jstate *st, struct jbuf *b, char c) { jbuf_put(st, b, &c, 1); }
void jbuf_puts(struct jstate *st, struct jbuf *b, const char *s) { jbuf_put(st, b, s, strlen(s)); }

/* ---- constructors --------------------------------------------------------------------- */
struct jv jv_undef(const char *name) { struct jv v = {.type = JV_UNDEFINED}; v.u.undef_name = name; return v; }
struct jv jv_none(void) { struct jv v = {.type = JV_NONE}; return v; }
struct jv jv_bool(int b) { struct jv v = {.type = JV_BOOL}; v.u.b = !!b; return v; }
struct jv jv_int(int64_t i) { struct jv v = {.type = JV_INT}; v.u.i = i; return v; }
struct jv jv_float(double f) { struct jv v = {.type = JV_FLOAT}; v.u.f = f; return v; }

struct jv jv_escape(struct jstate *st, struct jv v)
{
    if (v.type == JV_STRING && v.safe) return v;
    struct jv s = jv_to_string(st, v);
    struct jbuf b = {0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        const char c = s.u.s.p[i];
        if (c == '&') jbuf_puts(st, &b, "&amp;");
        else if (c == '<') jbuf_puts(st, &b, "&lt;");
        else if (c == '>') jbuf_puts(st, &b, "&gt;");
        else if (c == '"') jbuf_puts(st, &b, "&#34;");
        else if (c == '\'') jbuf_puts(st, &b, "&#39;");
        else jbuf_putc(st, &b, c);
    }
    struct jv r = jv_str(st, b.p ? b.p : "", b.n);
    r.safe = 1;
    return r;
}

struct jv jv_str(struct jstate *st, const char *p, size_t n)
{
    char *d = jalloc(st, n + 1);
    if (n) memcpy(d, p, n);
    d[n] = 0;
    struct jv v = {.type = JV_STRING};
    v.u.s.p = d;
    v.u.s.n = n;
    return v;
}

struct jv jv_strz(const char *s)
{
    struct jv v = {.type = JV_STRING};
    v.u.s.p = s;
    v.u.s.n = strlen(s);
    return v;
}

struct jv jv_list_new(struct jstate *st, size_t cap)
{
    struct jv v = {.type = JV_LIST};
    v.u.l = jalloc(st, sizeof(*v.u.l));
    v.u.l->n = 0;
    v.u.l->cap = cap;
    v.u.l->v = cap ? jalloc(st, cap * sizeof(struct jv)) : NULL;
    return v;
}

struct jv jv_dict_new(struct jstate *st)
{
    struct jv v = {.type = JV_DICT};
    v.u.d = jalloc(st, sizeof(*v.u.d));
    memset(v.u.d, 0, sizeof(*v.u.d));
    return v;
}

void jv_list_push(struct jstate *st, struct jv list, struct jv x)
{
    struct jlist *l = list.u.l;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        struct jv *v = jalloc(st, cap * sizeof(*v));
        if (l->n) memcpy(v, l->v, l->n * sizeof(*v));
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = x;
}

static long dict_find(const struct jdict *d, struct jv k)
{
    for (size_t i = 0; i < d->n; i++)
        if (jv_equal(d->k[i], k)) return (long)i;
    return -1;
}

void jv_dict_set(struct jstate *st, struct jv dict, struct jv k, struct jv x)
{
    struct jdict *d = dict.u.d;
    long i = dict_find(d, k);
    if (i >= 0) {
        d->v[i] = x;
        return;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 8;
        struct jv *nk = jalloc(st, cap * sizeof(*nk)), *nv = jalloc(st, cap * sizeof(*nv));
        if (d->n) memcpy(nk, d->k, d->n * sizeof(*nk)), memcpy(nv, d->v, d->n * sizeof(*nv));
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n++] = x;
}

struct jv jv_dict_get(const struct jv *dict, struct jv key)
{
    long i = dict_find(dict->u.d, key);
    return i >= 0 ? dict->u.d->v[i] : jv_undef(NULL);
}

struct jv jv_dict_gets(const struct jv *dict, const char *key) { return jv_dict_get(dict, jv_strz(key)); }

/* ---- Python semantics ----------------------------------------------------------------- */
int jv_truthy(struct jv v)
{
    switch (v.type) {
    case JV_UNDEFINED:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STRING: return v.u.s.n != 0;
    case JV_LIST:
    case JV_TUPLE: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

int jv_is_number(struct jv v) { return v.type == JV_INT || v.type == JV_FLOAT || v.type == JV_BOOL; }

double jv_as_double(struct jv v)
{
    return v.type == JV_FLOAT ? v.u.f : v.type == JV_INT ? (double)v.u.i : v.type == JV_BOOL ? v.u.b : 0.0;
}

int jv_equal(struct jv a, struct jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type != JV_FLOAT && b.type != JV_FLOAT)
            return (a.type == JV_INT ? a.u.i : a.u.b) == (b.type == JV_INT ? b.u.i : b.u.b);
        return jv_as_double(a) == jv_as_double(b);
    }
    if ((a.type == JV_LIST || a.type == JV_TUPLE) && a.type == b.type) {
        if (a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    }
    if (a.type != b.type) return 0;
    switch (a.type) {
    case JV_UNDEFINED:
    case JV_NONE: return 1;
    case JV_STRING: return a.u.s.n == b.u.s.n && !memcmp(a.u.s.p, b.u.s.p, a.u.s.n);
    case JV_DICT: {
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            long j = dict_find(b.u.d, a.u.d->k[i]);
            if (j < 0 || !jv_equal(a.u.d->v[i], b.u.d->v[j])) return 0;
        }
        return 1;
    }
    case JV_NAMESPACE: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.m == b.u.m;
    case JV_FUNC: return a.u.fn == b.u.fn;
    case JV_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

const char *jv_type_name(struct jv v)
{
    static const char *names[] = {"Undefined", "NoneType", "bool", "int", "float", "str", "list",
                                  "tuple", "dict", "Namespace", "LoopContext", "Macro", "function"};
    return names[v.type];
}

int jv_compare(struct jstate *st, struct jv a, struct jv b)
{
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a.type == JV_INT && b.type == JV_INT) return (a.u.i > b.u.i) - (a.u.i < b.u.i);
        double x = jv_as_double(a), y = jv_as_double(b);
        return (x > y) - (x < y);
    }
    if (a.type == JV_STRING && b.type == JV_STRING) {
        size_t n = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int c = memcmp(a.u.s.p, b.u.s.p, n); /* UTF-8 byte order is code point order */
        if (c) return c < 0 ? -1 : 1;
        return (a.u.s.n > b.u.s.n) - (a.u.s.n < b.u.s.n);
    }
    if ((a.type == JV_LIST || a.type == JV_TUPLE) && a.type == b.type) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return jv_compare(st, a.u.l->v[i], b.u.l->v[i]);
        }
        return (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
    }
    jfail(st, STATUS_INVALID_ARGUMENT, "'<' not supported between instances of '%s' and '%s'",
          jv_type_name(a), jv_type_name(b));
}

size_t utf8_len(const char *p, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

size_t utf8_offset(const char *p, size_t n, size_t cp)
{
    size_t i = 0;
    while (i < n && cp) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80) i++;
        cp--;
    }
    return i;
}

struct jlist *jv_iter(struct jstate *st, struct jv v)
{
    struct jv l;
    switch (v.type) {
    case JV_LIST:
    case JV_TUPLE: return v.u.l;
    case JV_UNDEFINED: return jv_list_new(st, 0).u.l;
    case JV_DICT:
    case JV_NAMESPACE:
        l = jv_list_new(st, v.u.d->n);
        for (size_t i = 0; i < v.u.d->n; i++) jv_list_push(st, l, v.u.d->k[i]);
        return l.u.l;
    case JV_STRING:
        l = jv_list_new(st, v.u.s.n);
        for (size_t i = 0; i < v.u.s.n;) {
            size_t j = i + 1;
            while (j < v.u.s.n && ((unsigned char)v.u.s.p[j] & 0xC0) == 0x80) j++;
            jv_list_push(st, l, jv_str(st, v.u.s.p + i, j - i));
            i = j;
        }
        return l.u.l;
    default: jfail(st, STATUS_INVALID_ARGUMENT, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- str() and repr() ----------------------------------------------------------------- */

/* Python's repr(float): the shortest digits that read back to the same double, in fixed
 * notation for decimal exponents -4 <= e < 16, otherwise as d.ddde+XX. */
static void append_float(struct jstate *st, struct jbuf *b, double f)
{
    char tmp[64], digits[32];
    if (isnan(f)) return jbuf_puts(st, b, "nan");
    if (isinf(f)) return jbuf_puts(st, b, f < 0 ? "-inf" : "inf");
    if (f == 0) return jbuf_puts(st, b, signbit(f) ? "-0.0" : "0.0");
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp: [-]d.ddde[+-]XX */
    const char *s = tmp;
    if (*s == '-') jbuf_putc(st, b, '-'), s++;
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int e = atoi(s + 1);
    if (e >= -4 && e < 16) {
        if (e < 0) {
            jbuf_puts(st, b, "0.");
            for (int i = 0; i < -e - 1; i++) jbuf_putc(st, b, '0');
            jbuf_put(st, b, digits, (size_t)nd);
        } else {
            for (int i = 0; i <= e; i++) jbuf_putc(st, b, i < nd ? digits[i] : '0');
            jbuf_putc(st, b, '.');
            if (nd > e + 1) jbuf_put(st, b, digits + e + 1, (size_t)(nd - e - 1));
            else jbuf_putc(st, b, '0');
        }
    } else {
        jbuf_putc(st, b, digits[0]);
        if (nd > 1) jbuf_putc(st, b, '.'), jbuf_put(st, b, digits + 1, (size_t)(nd - 1));
        snprintf(tmp, sizeof(tmp), "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
        jbuf_puts(st, b, tmp);
    }
}

static void append_str_repr(struct jstate *st, struct jbuf *b, const char *p, size_t n)
{
    char q = memchr(p, '\'', n) && !memchr(p, '"', n) ? '"' : '\'';
    jbuf_putc(st, b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char esc[8];
        if (c == (unsigned char)q || c == '\\') jbuf_putc(st, b, '\\'), jbuf_putc(st, b, (char)c);
        else if (c == '\n') jbuf_puts(st, b, "\\n");
        else if (c == '\r') jbuf_puts(st, b, "\\r");
        else if (c == '\t') jbuf_puts(st, b, "\\t");
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof(esc), "\\x%02x", c), jbuf_puts(st, b, esc);
        else jbuf_putc(st, b, (char)c);
    }
    jbuf_putc(st, b, q);
}

void jv_append_repr(struct jstate *st, struct jbuf *b, struct jv v)
{
    if (v.type == JV_STRING) return append_str_repr(st, b, v.u.s.p, v.u.s.n);
    if (v.type == JV_LIST || v.type == JV_TUPLE) {
        int tuple = v.type == JV_TUPLE;
        jbuf_putc(st, b, tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(st, b, ", ");
            jv_append_repr(st, b, v.u.l->v[i]);
        }
        if (tuple && v.u.l->n == 1) jbuf_putc(st, b, ',');
        jbuf_putc(st, b, tuple ? ')' : ']');
        return;
    }
    if (v.type == JV_DICT) {
        jbuf_putc(st, b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) jbuf_puts(st, b, ", ");
            jv_append_repr(st, b, v.u.d->k[i]);
            jbuf_puts(st, b, ": ");
            jv_append_repr(st, b, v.u.d->v[i]);
        }
        jbuf_putc(st, b, '}');
        return;
    }
    jv_append_str(st, b, v);
}

void jv_append_str(struct jstate *st, struct jbuf *b, struct jv v)
{
    char tmp[32];
    switch (v.type) {
    case JV_UNDEFINED: return;
    case JV_NONE: return jbuf_puts(st, b, "None");
    case JV_BOOL: return jbuf_puts(st, b, v.u.b ? "True" : "False");
    case JV_INT: snprintf(tmp, sizeof(tmp), "%lld", (long long)v.u.i); return jbuf_puts(st, b, tmp);
    case JV_FLOAT: return append_float(st, b, v.u.f);
    case JV_STRING: return jbuf_put(st, b, v.u.s.p, v.u.s.n);
    case JV_LIST:
    case JV_TUPLE:
    case JV_DICT: return jv_append_repr(st, b, v);
    case JV_NAMESPACE: return jbuf_puts(st, b, "<Namespace>");
    case JV_LOOP: return jbuf_puts(st, b, "<LoopContext>");
    case JV_MACRO: return jbuf_puts(st, b, "<Macro>");
    case JV_FUNC: return jbuf_puts(st, b, "<function>");
    }
}

struct jv jv_to_string(struct jstate *st, struct jv v)
{
    if (v.type == JV_STRING) return v;
    struct jbuf b = {0};
    jv_append_str(st, &b, v);
    struct jv s = {.type = JV_STRING};
    s.u.s.p = b.p ? b.p : "";
    s.u.s.n = b.n;
    return s;
}

/* ---- JSON ----------------------------------------------------------------------------- */
static void json_string(struct jstate *st, struct jbuf *b, const char *p, size_t n, int ascii)
{
    char esc[16];
    jbuf_putc(st, b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"') jbuf_puts(st, b, "\\\"");
        else if (c == '\\') jbuf_puts(st, b, "\\\\");
        else if (c == '\n') jbuf_puts(st, b, "\\n");
        else if (c == '\r') jbuf_puts(st, b, "\\r");
        else if (c == '\t') jbuf_puts(st, b, "\\t");
        else if (c == '\b') jbuf_puts(st, b, "\\b");
        else if (c == '\f') jbuf_puts(st, b, "\\f");
        else if (c < 0x20 || (ascii && c == 0x7f)) snprintf(esc, sizeof(esc), "\\u%04x", c), jbuf_puts(st, b, esc);
        else if (ascii && c >= 0x80) {
            uint32_t cp;
            int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
            cp = c & (0x3F >> extra);
            for (int k = 0; k < extra && i + 1 < n; k++) cp = cp << 6 | ((unsigned char)p[++i] & 0x3F);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                snprintf(esc, sizeof(esc), "\\u%04x", cp);
            }
            jbuf_puts(st, b, esc);
        } else jbuf_putc(st, b, (char)c);
    }
    jbuf_putc(st, b, '"');
}

static void json_newline(struct jstate *st, struct jbuf *b, const char *indent, int level)
{
    jbuf_putc(st, b, '\n');
    for (int i = 0; i < level; i++) jbuf_puts(st, b, indent);
}

void jv_append_json(struct jstate *st, struct jbuf *b, struct jv v, int ascii, const char *indent,
                    const char *item_sep, const char *key_sep, int sort_keys, int level)
{
    if (level > 100) jfail(st, STATUS_INVALID_ARGUMENT, "tojson: nesting too deep");
    switch (v.type) {
    case JV_NONE: return jbuf_puts(st, b, "null");
    case JV_BOOL: return jbuf_puts(st, b, v.u.b ? "true" : "false");
    case JV_INT: return jv_append_str(st, b, v);
    case JV_FLOAT:
        if (isnan(v.u.f)) return jbuf_puts(st, b, "NaN");
        if (isinf(v.u.f)) return jbuf_puts(st, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        return jv_append_str(st, b, v);
    case JV_STRING: return json_string(st, b, v.u.s.p, v.u.s.n, ascii);
    case JV_LIST:
    case JV_TUPLE:
        if (!v.u.l->n) return jbuf_puts(st, b, "[]");
        jbuf_putc(st, b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) jbuf_puts(st, b, item_sep);
            if (indent) json_newline(st, b, indent, level + 1);
            jv_append_json(st, b, v.u.l->v[i], ascii, indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent) json_newline(st, b, indent, level);
        return jbuf_putc(st, b, ']');
    case JV_DICT: {
        size_t n = v.u.d->n;
        if (!n) return jbuf_puts(st, b, "{}");
        size_t *order = jalloc(st, n * sizeof(size_t));
        for (size_t i = 0; i < n; i++) order[i] = i;
        for (size_t i = 0; i < n; i++) {
            struct jv k = v.u.d->k[i];
            if (k.type != JV_STRING && k.type != JV_INT && k.type != JV_FLOAT && k.type != JV_BOOL && k.type != JV_NONE)
                jfail(st, STATUS_INVALID_ARGUMENT, "tojson: keys must be str, int, float, bool or None");
        }
        if (sort_keys) /* insertion sort: stable, and dicts here are small */
            for (size_t i = 1; i < n; i++)
                for (size_t j = i; j > 0 && jv_compare(st, v.u.d->k[order[j - 1]], v.u.d->k[order[j]]) > 0; j--) {
                    size_t t = order[j];
                    order[j] = order[j - 1], order[j - 1] = t;
                }
        jbuf_putc(st, b, '{');
        for (size_t i = 0; i < n; i++) {
            struct jv k = v.u.d->k[order[i]];
            if (i) jbuf_puts(st, b, item_sep);
            if (indent) json_newline(st, b, indent, level + 1);
            if (k.type == JV_STRING) {
                json_string(st, b, k.u.s.p, k.u.s.n, ascii);
            } else {
                struct jbuf kb = {0};
                jv_append_json(st, &kb, k, ascii, NULL, "", "", 0, level + 1);
                json_string(st, b, kb.p, kb.n, ascii);
            }
            jbuf_puts(st, b, key_sep);
            jv_append_json(st, b, v.u.d->v[order[i]], ascii, indent, item_sep, key_sep, sort_keys, level + 1);
        }
        if (indent) json_newline(st, b, indent, level);
        return jbuf_putc(st, b, '}');
    }
    default:
        jfail(st, STATUS_INVALID_ARGUMENT, "Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

struct json_in {
    struct jstate *st;
    const char    *p;
    size_t         n, at;
    int            depth;
};

static void json_ws(struct json_in *j)
{
    while (j->at < j->n && (j->p[j->at] == ' ' || j->p[j->at] == '\t' || j->p[j->at] == '\n' || j->p[j->at] == '\r')) j->at++;
}

static int json_value(struct json_in *j, struct jv *out);

static int json_str(struct json_in *j, struct jv *out)
{
    j->at++;
    struct jbuf b = {0};
    while (j->at < j->n && j->p[j->at] != '"') {
        char c = j->p[j->at++];
        if (c != '\\') {
            if ((unsigned char)c < 0x20) return -1;
            jbuf_putc(j->st, &b, c);
            continue;
        }
        if (j->at >= j->n) return -1;
        c = j->p[j->at++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        if (c && strchr(from, c)) {
            jbuf_putc(j->st, &b, to[strchr(from, c) - from]);
        } else if (c == 'u') {
            uint32_t cp = 0;
            for (int round = 0; round < 2; round++) {
                if (j->at + 4 > j->n) return -1;
                char hex[5] = {0};
                memcpy(hex, j->p + j->at, 4);
                char *end;
                uint32_t u = (uint32_t)strtoul(hex, &end, 16);
                if (end != hex + 4) return -1;
                j->at += 4;
                if (round == 0) {
                    cp = u;
                    if (u >= 0xD800 && u < 0xDC00 && j->at + 6 <= j->n && j->p[j->at] == '\\' && j->p[j->at + 1] == 'u') {
                        j->at += 2;
                        continue;
                    }
                } else if (u >= 0xDC00 && u < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (u - 0xDC00);
                } else {
                    return -1;
                }
                break;
            }
            char u8[4];
            int k = 0;
            if (cp < 0x80) u8[k++] = (char)cp;
            else if (cp < 0x800) u8[k++] = (char)(0xC0 | cp >> 6), u8[k++] = (char)(0x80 | (cp & 63));
            else if (cp < 0x10000) u8[k++] = (char)(0xE0 | cp >> 12), u8[k++] = (char)(0x80 | ((cp >> 6) & 63)), u8[k++] = (char)(0x80 | (cp & 63));
            else u8[k++] = (char)(0xF0 | cp >> 18), u8[k++] = (char)(0x80 | ((cp >> 12) & 63)), u8[k++] = (char)(0x80 | ((cp >> 6) & 63)), u8[k++] = (char)(0x80 | (cp & 63));
            jbuf_put(j->st, &b, u8, (size_t)k);
        } else {
            return -1;
        }
    }
    if (j->at >= j->n) return -1;
    j->at++;
    *out = jv_str(j->st, b.p ? b.p : "", b.n);
    return 0;
}

static int json_value(struct json_in *j, struct jv *out)
{
    json_ws(j);
    if (j->at >= j->n || ++j->depth > 200) return -1;
    const char *s = j->p + j->at;
    size_t rest = j->n - j->at;
    int rc = 0;
    if (*s == '"') {
        rc = json_str(j, out);
    } else if (*s == '[' || *s == '{') {
        int dict = *s == '{';
        *out = dict ? jv_dict_new(j->st) : jv_list_new(j->st, 0);
        j->at++;
        json_ws(j);
        if (j->at < j->n && j->p[j->at] == (dict ? '}' : ']')) {
            j->at++;
        } else {
            for (;;) {
                struct jv k, v;
                if (dict) {
                    json_ws(j);
                    if (j->at >= j->n || j->p[j->at] != '"' || json_str(j, &k)) return -1;
                    json_ws(j);
                    if (j->at >= j->n || j->p[j->at++] != ':') return -1;
                }
                if (json_value(j, &v)) return -1;
                if (dict) jv_dict_set(j->st, *out, k, v);
                else jv_list_push(j->st, *out, v);
                json_ws(j);
                if (j->at >= j->n) return -1;
                char c = j->p[j->at++];
                if (c == (dict ? '}' : ']')) break;
                if (c != ',') return -1;
            }
        }
    } else if (rest >= 4 && !memcmp(s, "true", 4)) {
        *out = jv_bool(1), j->at += 4;
    } else if (rest >= 5 && !memcmp(s, "false", 5)) {
        *out = jv_bool(0), j->at += 5;
    } else if (rest >= 4 && !memcmp(s, "null", 4)) {
        *out = jv_none(), j->at += 4;
    } else if (*s == '-' || (*s >= '0' && *s <= '9')) {
        size_t k = 0;
        int is_float = 0;
        char num[64];
        while (k < rest && k < sizeof(num) - 1 && strchr("+-0123456789.eE", s[k])) {
            is_float |= s[k] == '.' || s[k] == 'e' || s[k] == 'E';
            num[k] = s[k];
            k++;
        }
        num[k] = 0;
        char *end;
        if (!is_float) {
            long long v = strtoll(num, &end, 10);
            if (*end) return -1;
            if ((v == LLONG_MAX || v == LLONG_MIN) && k > 18) *out = jv_float(strtod(num, NULL));
            else *out = jv_int(v);
        } else {
            *out = jv_float(strtod(num, &end));
            if (*end) return -1;
        }
        j->at += k;
    } else {
        return -1;
    }
    j->depth--;
    return rc;
}

int jv_parse_json(struct jstate *st, const char *p, size_t n, struct jv *out)
{
    struct json_in j = {.st = st, .p = p, .n = n};
    if (json_value(&j, out)) return -1;
    json_ws(&j);
    return j.at == n ? 0 : -1;
}
