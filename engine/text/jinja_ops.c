/* engine/text/jinja_ops.c - Jinja's binary operators with Python's meaning (jinja2 evaluates
 * them in Python): arithmetic and concatenation (+ of a Markup escapes the plain side, as
 * markupsafe does), `in`, and comparisons, each failing the render where Python would raise.
 * For jinja_eval.c. Tests: tests/test_jinja.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

void jinja_need_defined(struct jstate *st, struct jv v)
{
    if (v.type == JV_UNDEFINED)
        jfail(st, STATUS_INVALID_ARGUMENT, "'%s' is undefined", v.u.undef_name ? v.u.undef_name : "value");
}

int64_t jinja_as_int(struct jv v) { return v.type == JV_INT ? v.u.i : v.u.b; }

struct jv jinja_arith(struct jstate *st, int op, struct jv a, struct jv b)
{
    jinja_need_defined(st, a);
    jinja_need_defined(st, b);
    if (jv_is_number(a) && jv_is_number(b)) {
        int ints = a.type != JV_FLOAT && b.type != JV_FLOAT;
        int64_t x = jinja_as_int(a), y = jinja_as_int(b), r;
        double fx = jv_as_double(a), fy = jv_as_double(b);
        switch (op) {
        case '+':
            if (ints && !__builtin_add_overflow(x, y, &r)) return jv_int(r);
            if (ints) break;
            return jv_float(fx + fy);
        case '-':
            if (ints && !__builtin_sub_overflow(x, y, &r)) return jv_int(r);
            if (ints) break;
            return jv_float(fx - fy);
        case '*':
            if (ints && !__builtin_mul_overflow(x, y, &r)) return jv_int(r);
            if (ints) break;
            return jv_float(fx * fy);
        case '/':
            if (fy == 0) jfail(st, STATUS_INVALID_ARGUMENT, "division by zero");
            return jv_float(fx / fy);
        case 'f':
        case '%':
            if (ints ? y == 0 : fy == 0) jfail(st, STATUS_INVALID_ARGUMENT, "integer division or modulo by zero");
            if (ints) {
                if (x == INT64_MIN && y == -1) break;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                return jv_int(op == 'f' ? q : m);
            } else {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                return jv_float(op == 'f' ? floor(fx / fy) : m);
            }
        case 'p':
            if (ints && y >= 0) {
                /* 0, 1 and -1 to any power at once (the loop ran y times: 0 ** 10**18 hung the
                 * fuzz target); any other base overflows before y reaches 64. */
                if (x == 0 || x == 1) return jv_int(y == 0 ? 1 : x);
                if (x == -1) return jv_int(y % 2 ? -1 : 1);
                if (y >= 64) jfail(st, STATUS_INVALID_ARGUMENT, "integer overflow");
                int64_t acc = 1;
                for (int64_t k = 0; k < y; k++)
                    if (__builtin_mul_overflow(acc, x, &acc)) jfail(st, STATUS_INVALID_ARGUMENT, "integer overflow");
                return jv_int(acc);
            }
            return jv_float(pow(fx, fy));
        }
        jfail(st, STATUS_INVALID_ARGUMENT, "integer overflow");
    }
    if (op == '+' && a.type == JV_STRING && b.type == JV_STRING) {
        const int safe = a.safe || b.safe; /* Markup + str escapes the str (markupsafe) */
        if (safe) a = jv_escape(st, a), b = jv_escape(st, b);
        struct jbuf out = {0};
        jbuf_put(st, &out, a.u.s.p, a.u.s.n);
        jbuf_put(st, &out, b.u.s.p, b.u.s.n);
        struct jv r = jv_str(st, out.p ? out.p : "", out.n);
        r.safe = (unsigned char)safe;
        return r;
    }
    if (op == '+' && (a.type == JV_LIST || a.type == JV_TUPLE) && a.type == b.type) {
        struct jv r = jv_list_new(st, a.u.l->n + b.u.l->n);
        r.type = a.type;
        for (size_t i = 0; i < a.u.l->n; i++) jv_list_push(st, r, a.u.l->v[i]);
        for (size_t i = 0; i < b.u.l->n; i++) jv_list_push(st, r, b.u.l->v[i]);
        return r;
    }
    if (op == '*' && (b.type == JV_INT || b.type == JV_BOOL) &&
        (a.type == JV_STRING || a.type == JV_LIST || a.type == JV_TUPLE))
        return jinja_arith(st, op, b, a);
    if (op == '*' && (a.type == JV_INT || a.type == JV_BOOL)) {
        int64_t k = jinja_as_int(a);
        /* An empty string or list times any count is empty at once (the loops below ran k times
         * over nothing: [] * 10**20 hung the fuzz target); a longer one stops at the sandbox's
         * output and memory bounds, which each append checks. */
        const size_t len = b.type == JV_STRING ? b.u.s.n : (b.type == JV_LIST || b.type == JV_TUPLE) ? b.u.l->n : 1;
        if (len == 0 || k <= 0) k = 0;
        if (k > 0 && (uint64_t)k > (1u << 26) / len) jfail(st, STATUS_INVALID_ARGUMENT, "repetition too large");
        if (b.type == JV_STRING) {
            struct jbuf out = {0};
            for (int64_t i = 0; i < k; i++) jbuf_put(st, &out, b.u.s.p, b.u.s.n);
            return jv_str(st, out.p ? out.p : "", out.n);
        }
        if (b.type == JV_LIST || b.type == JV_TUPLE) {
            struct jv r = jv_list_new(st, 0);
            r.type = b.type;
            for (int64_t i = 0; i < k; i++)
                for (size_t j = 0; j < b.u.l->n; j++) jv_list_push(st, r, b.u.l->v[j]);
            return r;
        }
    }
    if (op == '%' && a.type == JV_STRING) {
        /* printf-style formatting with %s, %d and %% only */
        struct jlist *args = b.type == JV_TUPLE ? b.u.l : NULL;
        size_t used = 0;
        struct jbuf out = {0};
        for (size_t i = 0; i < a.u.s.n; i++) {
            char c = a.u.s.p[i];
            if (c != '%') {
                jbuf_putc(st, &out, c);
                continue;
            }
            char f = i + 1 < a.u.s.n ? a.u.s.p[++i] : 0;
            if (f == '%') {
                jbuf_putc(st, &out, '%');
                continue;
            }
            if (f != 's' && f != 'd') jfail(st, STATUS_UNSUPPORTED, "unsupported format '%%%c'", f ? f : '?');
            struct jv arg;
            if (args) {
                if (used >= args->n) jfail(st, STATUS_INVALID_ARGUMENT, "not enough arguments for format string");
                arg = args->v[used++];
            } else {
                if (used++) jfail(st, STATUS_INVALID_ARGUMENT, "not enough arguments for format string");
                arg = b;
            }
            if (f == 'd') {
                if (!jv_is_number(arg)) jfail(st, STATUS_INVALID_ARGUMENT, "%%d format: a number is required");
                arg = jv_int(arg.type == JV_FLOAT ? (int64_t)arg.u.f : jinja_as_int(arg));
            }
            jv_append_str(st, &out, arg);
        }
        if (args ? used != args->n : !used)
            jfail(st, STATUS_INVALID_ARGUMENT, "not all arguments converted during string formatting");
        return jv_str(st, out.p ? out.p : "", out.n);
    }
    static const char *names[128];
    names['+'] = "+", names['-'] = "-", names['*'] = "*", names['/'] = "/", names['f'] = "//",
    names['%'] = "%", names['p'] = "**";
    jfail(st, STATUS_INVALID_ARGUMENT, "unsupported operand type(s) for %s: '%s' and '%s'",
          names[op & 127] ? names[op & 127] : "?", jv_type_name(a), jv_type_name(b));
}

int jinja_contains(struct jstate *st, struct jv item, struct jv seq)
{
    if (seq.type == JV_STRING) {
        if (item.type != JV_STRING)
            jfail(st, STATUS_INVALID_ARGUMENT, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        if (!item.u.s.n) return 1;
        for (size_t i = 0; i + item.u.s.n <= seq.u.s.n; i++)
            if (!memcmp(seq.u.s.p + i, item.u.s.p, item.u.s.n)) return 1;
        return 0;
    }
    if (seq.type == JV_DICT || seq.type == JV_NAMESPACE) return jv_dict_get(&seq, item).type != JV_UNDEFINED;
    if (seq.type == JV_LIST || seq.type == JV_TUPLE || seq.type == JV_UNDEFINED) {
        struct jlist *l = jv_iter(st, seq);
        for (size_t i = 0; i < l->n; i++)
            if (jv_equal(l->v[i], item)) return 1;
        return 0;
    }
    jfail(st, STATUS_INVALID_ARGUMENT, "argument of type '%s' is not iterable", jv_type_name(seq));
}

int jinja_compare(struct jstate *st, int op, struct jv a, struct jv b)
{
    switch (op) {
    case JCMP_EQ: return jv_equal(a, b);
    case JCMP_NE: return !jv_equal(a, b);
    case JCMP_IN: return jinja_contains(st, a, b);
    case JCMP_NOT_IN: return !jinja_contains(st, a, b);
    }
    jinja_need_defined(st, a);
    jinja_need_defined(st, b);
    int c = jv_compare(st, a, b);
    switch (op) {
    case JCMP_LT: return c < 0;
    case JCMP_LE: return c <= 0;
    case JCMP_GT: return c > 0;
    default: return c >= 0;
    }
}
