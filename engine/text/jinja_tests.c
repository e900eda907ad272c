/* engine/text/jinja_tests.c - jinja2's tests (`x is defined`, `is string`, `is divisibleby 3`, ...)
 * and the global functions (range with the sandbox's 100000-item cap, dict, namespace,
 * raise_exception, strftime_now). Not here: filters and methods (jinja_builtins.c).
 * Tests: tests/test_jinja.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "jinja_impl.h"

/* ---- tests ---------------------------------------------------------------------------- */
static const char *const test_names[] = {
    "defined", "undefined", "none", "boolean", "false", "true", "integer", "float", "number",
    "string", "mapping", "iterable", "sequence", "callable", "odd", "even", "divisibleby",
    "eq", "equalto", "==", "ne", "!=", "lt", "<", "lessthan", "le", "<=", "gt", ">",
    "greaterthan", "ge", ">=", "in", "lower", "upper", "sameas", "escaped", NULL};

int jtest_exists(const char *name)
{
    for (int i = 0; test_names[i]; i++)
        if (!strcmp(test_names[i], name)) return 1;
    return 0;
}

int jtest(struct jstate *st, const char *name, struct jv *args, int n_args)
{
    struct jv v = args[0];
    struct jv other = n_args > 1 ? args[1] : jv_undef(NULL);
    enum jv_type t = v.type;
    if (!strcmp(name, "defined")) return t != JV_UNDEFINED;
    if (!strcmp(name, "undefined")) return t == JV_UNDEFINED;
    if (!strcmp(name, "none")) return t == JV_NONE;
    if (!strcmp(name, "boolean")) return t == JV_BOOL;
    if (!strcmp(name, "false")) return t == JV_BOOL && !v.u.b;
    if (!strcmp(name, "true")) return t == JV_BOOL && v.u.b;
    if (!strcmp(name, "integer")) return t == JV_INT;
    if (!strcmp(name, "float")) return t == JV_FLOAT;
    if (!strcmp(name, "number")) return jv_is_number(v);
    if (!strcmp(name, "string")) return t == JV_STRING;
    if (!strcmp(name, "mapping")) return t == JV_DICT;
    if (!strcmp(name, "iterable"))
        return t == JV_STRING || t == JV_LIST || t == JV_TUPLE || t == JV_DICT || t == JV_UNDEFINED;
    if (!strcmp(name, "sequence")) return t == JV_STRING || t == JV_LIST || t == JV_TUPLE || t == JV_DICT || t == JV_UNDEFINED;
    if (!strcmp(name, "callable")) return t == JV_MACRO || t == JV_FUNC;
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        int64_t d = name[0] == 'd' ? 0 : 2;
        if (name[0] == 'd') {
            if (other.type != JV_INT || other.u.i == 0) jfail(st, STATUS_INVALID_ARGUMENT, "divisibleby: bad divisor");
            d = other.u.i;
        }
        if (t != JV_INT && t != JV_BOOL) jfail(st, STATUS_INVALID_ARGUMENT, "test '%s' needs an integer, not %s", name, jv_type_name(v));
        int64_t x = t == JV_INT ? v.u.i : v.u.b, m = d == -1 ? 0 : x % d;
        if (name[0] == 'o') return m != 0;
        return m == 0;
    }
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) return jv_equal(v, other);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !jv_equal(v, other);
    if (!strcmp(name, "lt") || !strcmp(name, "<") || !strcmp(name, "lessthan")) return jv_compare(st, v, other) < 0;
    if (!strcmp(name, "le") || !strcmp(name, "<=")) return jv_compare(st, v, other) <= 0;
    if (!strcmp(name, "gt") || !strcmp(name, ">") || !strcmp(name, "greaterthan")) return jv_compare(st, v, other) > 0;
    if (!strcmp(name, "ge") || !strcmp(name, ">=")) return jv_compare(st, v, other) >= 0;
    if (!strcmp(name, "in")) {
        struct jv *cargs = jalloc(st, 2 * sizeof(*cargs));
        cargs[0] = other;
        cargs[1] = v;
        struct jv r;
        if (other.type == JV_STRING) {
            if (v.type != JV_STRING) jfail(st, STATUS_INVALID_ARGUMENT, "'in <string>' requires string as left operand");
            return jstr_find(other.u.s.p, other.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (other.type == JV_DICT) return jv_dict_get(&other, v).type != JV_UNDEFINED;
        struct jlist *l = jv_iter(st, other);
        (void)r;
        for (size_t i = 0; i < l->n; i++)
            if (jv_equal(l->v[i], v)) return 1;
        return 0;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        struct jv s = jv_to_string(st, v);
        return jv_equal(s, jstr_case(st, s, name[0]));
    }
    if (!strcmp(name, "sameas")) {
        if (t != other.type) return 0;
        if (t == JV_NONE || t == JV_UNDEFINED) return 1;
        if (t == JV_BOOL) return v.u.b == other.u.b;
        if (t == JV_LIST || t == JV_TUPLE) return v.u.l == other.u.l;
        if (t == JV_DICT || t == JV_NAMESPACE) return v.u.d == other.u.d;
        return jv_equal(v, other) && (t == JV_INT || t == JV_STRING);
    }
    if (!strcmp(name, "escaped")) return 0;
    jfail(st, STATUS_INVALID_ARGUMENT, "no test named '%s'", name);
}

/* ---- globals -------------------------------------------------------------------------- */
struct jv jglobal_call(struct jstate *st, int fn, struct jv *args, int n_args,
                       const char **kw_names, struct jv *kw_vals, int n_kw)
{
    switch (fn) {
    case JFUNC_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (n_args < 1 || n_args > 3 || n_kw) jfail(st, STATUS_INVALID_ARGUMENT, "range expected 1 to 3 integer arguments");
        for (int i = 0; i < n_args; i++) {
            if (args[i].type != JV_INT && args[i].type != JV_BOOL) jfail(st, STATUS_INVALID_ARGUMENT, "range: integers required");
            v[n_args == 1 ? 1 : i] = args[i].type == JV_INT ? args[i].u.i : args[i].u.b;
        }
        if (!v[2]) jfail(st, STATUS_INVALID_ARGUMENT, "range() arg 3 must not be zero");
        double count = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
        if (count > 100000) jfail(st, STATUS_RESOURCE_EXHAUSTED, "range too big (the sandbox allows 100000 items)");
        struct jv r = jv_list_new(st, count > 0 ? (size_t)count : 0);
        for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) jv_list_push(st, r, jv_int(i));
        return r;
    }
    case JFUNC_DICT:
    case JFUNC_NAMESPACE: {
        struct jv d = jv_dict_new(st);
        for (int i = 0; i < n_args; i++) {
            if (args[i].type != JV_DICT) jfail(st, STATUS_INVALID_ARGUMENT, "dict/namespace: positional argument must be a mapping");
            for (size_t k = 0; k < args[i].u.d->n; k++) jv_dict_set(st, d, args[i].u.d->k[k], args[i].u.d->v[k]);
        }
        for (int i = 0; i < n_kw; i++) jv_dict_set(st, d, jv_strz(kw_names[i]), kw_vals[i]);
        if (fn == JFUNC_NAMESPACE) d.type = JV_NAMESPACE;
        return d;
    }
    case JFUNC_RAISE: {
        struct jv msg = n_args ? jv_to_string(st, args[0]) : jv_strz("");
        jfail(st, STATUS_INVALID_ARGUMENT, "%.*s", (int)msg.u.s.n, msg.u.s.p);
    }
    case JFUNC_STRFTIME: {
        if (n_args != 1 || args[0].type != JV_STRING) jfail(st, STATUS_INVALID_ARGUMENT, "strftime_now expects a format string");
        time_t now = st->t->opt.now ? (time_t)st->t->opt.now : time(NULL);
        struct tm tm;
        if (st->t->opt.now) gmtime_r(&now, &tm);
        else localtime_r(&now, &tm);
        char out[512];
        size_t n = strftime(out, sizeof(out), args[0].u.s.p, &tm);
        return jv_str(st, out, n);
    }
    }
    jfail(st, STATUS_INTERNAL, "unknown function");
}
