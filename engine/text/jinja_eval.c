/* engine/text/jinja_eval.c - rendering a compiled Jinja template: scopes (a for loop's body and a
 * macro get their own, if does not, as in jinja2), expressions with Python's operators, the
 * statements, macros and call blocks, the sandbox limits, and the public entry points of
 * jinja.h (compile, render from JSON, render a chat). Not here: lexing and parsing
 * (jinja_parse.c), values (jinja_value.c), the operators (jinja_ops.c), filters, tests and
 * methods (jinja_builtins.c).
 * Tests: tests/test_jinja.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

struct jloop {
    struct jlist *items;
    size_t        index0;
};

void jinja_options_default(struct jinja_options *o)
{
    memset(o, 0, sizeof(*o));
    o->max_steps = 20u * 1000 * 1000;
    o->max_output = 16u << 20;
    o->max_memory = 256u << 20;
    o->max_depth = 64;
}

void jinja_options_chat(struct jinja_options *o)
{
    jinja_options_default(o);
    o->trim_blocks = 1;
    o->lstrip_blocks = 1;
}

/* ---- scopes --------------------------------------------------------------------------- */
static struct jscope *scope_new(struct jstate *st, struct jscope *parent)
{
    struct jscope *s = jalloc(st, sizeof(*s));
    memset(s, 0, sizeof(*s));
    s->parent = parent;
    return s;
}

static struct jv *scope_find(struct jscope *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name)) return &s->vals[i];
    return NULL;
}

static void scope_set(struct jstate *st, struct jscope *s, const char *name, struct jv v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 8;
        const char **nn = jalloc(st, cap * sizeof(*nn));
        struct jv *nv = jalloc(st, cap * sizeof(*nv));
        if (s->n) memcpy(nn, s->names, s->n * sizeof(*nn)), memcpy(nv, s->vals, s->n * sizeof(*nv));
        s->names = nn, s->vals = nv, s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n++] = v;
}

static void step(struct jstate *st, const struct jnode *n)
{
    st->line = n->line;
    if (++st->steps > st->t->opt.max_steps)
        jfail(st, STATUS_RESOURCE_EXHAUSTED, "template step limit (%llu) exceeded",
              (unsigned long long)st->t->opt.max_steps);
}

static void exec_node(struct jstate *st, const struct jnode *n, struct jscope *sc);

/* ---- attribute and item access -------------------------------------------------------- */
struct jv jgetattr(struct jstate *st, struct jv obj, const char *name)
{
    switch (obj.type) {
    case JV_UNDEFINED:
        if (obj.u.undef_name) jfail(st, STATUS_INVALID_ARGUMENT, "'%s' is undefined", obj.u.undef_name);
        jfail(st, STATUS_INVALID_ARGUMENT, "undefined value has no attribute '%s'", name);
    case JV_DICT:
    case JV_NAMESPACE: {
        struct jv v = jv_dict_gets(&obj, name);
        if (v.type == JV_UNDEFINED) v.u.undef_name = name;
        return v;
    }
    case JV_LOOP: {
        struct jloop *l = obj.u.loop;
        int64_t n = (int64_t)l->items->n, i = (int64_t)l->index0;
        if (!strcmp(name, "index")) return jv_int(i + 1);
        if (!strcmp(name, "index0")) return jv_int(i);
        if (!strcmp(name, "revindex")) return jv_int(n - i);
        if (!strcmp(name, "revindex0")) return jv_int(n - i - 1);
        if (!strcmp(name, "first")) return jv_bool(i == 0);
        if (!strcmp(name, "last")) return jv_bool(i == n - 1);
        if (!strcmp(name, "length")) return jv_int(n);
        if (!strcmp(name, "depth")) return jv_int(1);
        if (!strcmp(name, "depth0")) return jv_int(0);
        if (!strcmp(name, "previtem")) return i > 0 ? l->items->v[i - 1] : jv_undef("previtem");
        if (!strcmp(name, "nextitem")) return i + 1 < n ? l->items->v[i + 1] : jv_undef("nextitem");
        return jv_undef(name);
    }
    default: return jv_undef(name);
    }
}

static int64_t clamp_index(int64_t i, int64_t n)
{
    return i < 0 ? (i + n < 0 ? -1 : i + n) : i;
}

struct jv jgetitem(struct jstate *st, struct jv obj, struct jv key)
{
    if (obj.type == JV_UNDEFINED) {
        if (obj.u.undef_name) jfail(st, STATUS_INVALID_ARGUMENT, "'%s' is undefined", obj.u.undef_name);
        jfail(st, STATUS_INVALID_ARGUMENT, "undefined value has no item");
    }
    if (obj.type == JV_DICT || obj.type == JV_NAMESPACE) return jv_dict_get(&obj, key);
    if (key.type == JV_STRING) return jgetattr(st, obj, key.u.s.p);
    if ((obj.type == JV_LIST || obj.type == JV_TUPLE || obj.type == JV_STRING) &&
        (key.type == JV_INT || key.type == JV_BOOL)) {
        int64_t k = key.type == JV_INT ? key.u.i : key.u.b;
        if (obj.type == JV_STRING) {
            int64_t n = (int64_t)utf8_len(obj.u.s.p, obj.u.s.n), i = clamp_index(k, n);
            if (i < 0 || i >= n) return jv_undef(NULL);
            size_t a = utf8_offset(obj.u.s.p, obj.u.s.n, (size_t)i);
            size_t b = a + utf8_offset(obj.u.s.p + a, obj.u.s.n - a, 1);
            return jv_str(st, obj.u.s.p + a, b - a);
        }
        int64_t i = clamp_index(k, (int64_t)obj.u.l->n);
        if (i < 0 || i >= (int64_t)obj.u.l->n) return jv_undef(NULL);
        return obj.u.l->v[i];
    }
    if (obj.type == JV_LOOP && key.type == JV_STRING) return jgetattr(st, obj, key.u.s.p);
    return jv_undef(NULL);
}

/* Python's slice indices for a sequence of n items. */
static void slice_indices(struct jstate *st, struct jv *b, struct jv *c, struct jv *d, int64_t n,
                          int64_t *start, int64_t *stop, int64_t *stp)
{
    struct jv *v[3] = {b, c, d};
    for (int k = 0; k < 3; k++)
        if (v[k] && v[k]->type != JV_NONE && v[k]->type != JV_INT && v[k]->type != JV_BOOL)
            jfail(st, STATUS_INVALID_ARGUMENT, "slice indices must be integers or None");
#define SLICE_INT(p) ((p)->type == JV_INT ? (p)->u.i : (p)->u.b)
    *stp = d && d->type != JV_NONE ? SLICE_INT(d) : 1;
    if (*stp == 0) jfail(st, STATUS_INVALID_ARGUMENT, "slice step cannot be zero");
    int64_t lo = *stp < 0 ? -1 : 0, hi = *stp < 0 ? n - 1 : n;
    if (b && b->type != JV_NONE) {
        *start = SLICE_INT(b);
        if (*start < 0) *start = *start + n < lo ? lo : *start + n;
        else if (*start > hi) *start = hi;
    } else {
        *start = *stp < 0 ? hi : lo;
    }
    if (c && c->type != JV_NONE) {
        *stop = SLICE_INT(c);
        if (*stop < 0) *stop = *stop + n < lo ? lo : *stop + n;
        else if (*stop > hi) *stop = hi;
    } else {
        *stop = *stp < 0 ? lo : hi;
    }
#undef SLICE_INT
}

static struct jv eval_slice(struct jstate *st, const struct jnode *n, struct jscope *sc)
{
    struct jv obj = jeval(st, n->a, sc), b, c, d;
    if (n->b) b = jeval(st, n->b, sc);
    if (n->c) c = jeval(st, n->c, sc);
    if (n->d) d = jeval(st, n->d, sc);
    if (obj.type == JV_UNDEFINED) return jgetitem(st, obj, jv_none());
    int64_t len, start, stop, stp;
    if (obj.type == JV_STRING) len = (int64_t)utf8_len(obj.u.s.p, obj.u.s.n);
    else if (obj.type == JV_LIST || obj.type == JV_TUPLE) len = (int64_t)obj.u.l->n;
    else return jv_undef(NULL);
    slice_indices(st, n->b ? &b : NULL, n->c ? &c : NULL, n->d ? &d : NULL, len, &start, &stop, &stp);
    if (obj.type == JV_STRING) {
        struct jlist *chars = jv_iter(st, obj);
        struct jbuf out = {0};
        for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp)
            jbuf_put(st, &out, chars->v[i].u.s.p, chars->v[i].u.s.n);
        return jv_str(st, out.p ? out.p : "", out.n);
    }
    struct jv r = jv_list_new(st, 0);
    r.type = obj.type;
    for (int64_t i = start; stp > 0 ? i < stop : i > stop; i += stp) jv_list_push(st, r, obj.u.l->v[i]);
    return r;
}

/* ---- calls ---------------------------------------------------------------------------- */
static struct jv render_body(struct jstate *st, const struct jnode *body, struct jscope *sc)
{
    struct jbuf buf = {0}, *saved = st->out;
    st->out = &buf;
    exec_node(st, body, sc);
    st->out = saved;
    return jv_str(st, buf.p ? buf.p : "", buf.n);
}

static struct jv call_macro(struct jstate *st, struct jmacro *m, struct jv *args, int n_args,
                            const char **kw_names, struct jv *kw_vals, int n_kw, struct jv caller)
{
    const struct jnode *def = m->def;
    if (++st->depth > st->t->opt.max_depth)
        jfail(st, STATUS_RESOURCE_EXHAUSTED, "template recursion limit (%d) exceeded", st->t->opt.max_depth);
    struct jscope *sc = scope_new(st, m->scope);
    if (n_args > def->n_kw)
        jfail(st, STATUS_INVALID_ARGUMENT, "macro '%s' takes not more than %d argument(s)",
              def->name ? def->name : "caller", def->n_kw);
    for (int k = 0; k < n_kw; k++) {
        int found = 0;
        for (int i = 0; i < def->n_kw; i++) found |= !strcmp(def->kw_names[i], kw_names[k]);
        if (!found && strcmp(kw_names[k], "caller"))
            jfail(st, STATUS_INVALID_ARGUMENT, "macro '%s' takes no keyword argument '%s'",
                  def->name ? def->name : "caller", kw_names[k]);
    }
    for (int i = 0; i < def->n_kw; i++) {
        struct jv v = jv_undef(def->kw_names[i]);
        int set = 0;
        if (i < n_args) v = args[i], set = 1;
        for (int k = 0; k < n_kw; k++)
            if (!strcmp(def->kw_names[i], kw_names[k])) {
                if (set) jfail(st, STATUS_INVALID_ARGUMENT, "macro '%s' got multiple values for argument '%s'", def->name, kw_names[k]);
                v = kw_vals[k], set = 1;
            }
        if (!set && def->kw_vals[i]) v = jeval(st, def->kw_vals[i], sc);
        scope_set(st, sc, def->kw_names[i], v);
    }
    if (caller.type != JV_UNDEFINED) scope_set(st, sc, "caller", caller);
    int saved_ctl = st->loop_ctl;
    struct jv r = render_body(st, def->b, sc);
    st->loop_ctl = saved_ctl;
    st->depth--;
    return r;
}

struct jv jcall_value(struct jstate *st, struct jv f, struct jv *args, int n_args,
                      const char **kw_names, struct jv *kw_vals, int n_kw)
{
    if (f.type == JV_MACRO) {
        struct jv caller = jv_undef(NULL);
        return call_macro(st, f.u.m, args, n_args, kw_names, kw_vals, n_kw, caller);
    }
    if (f.type == JV_FUNC) return jglobal_call(st, f.u.fn, args, n_args, kw_names, kw_vals, n_kw);
    jinja_need_defined(st, f);
    jfail(st, STATUS_INVALID_ARGUMENT, "'%s' object is not callable", jv_type_name(f));
}

/* Evaluates the arguments of a call-like node: args[0] is reserved when lead is set. */
static int eval_args(struct jstate *st, const struct jnode *n, struct jscope *sc, int lead,
                     struct jv **args, struct jv **kw_vals)
{
    *args = jalloc(st, (size_t)(n->n_kids + lead) * sizeof(struct jv));
    for (int i = 0; i < n->n_kids; i++) (*args)[i + lead] = jeval(st, n->kids[i], sc);
    *kw_vals = jalloc(st, (size_t)n->n_kw * sizeof(struct jv));
    for (int i = 0; i < n->n_kw; i++) (*kw_vals)[i] = jeval(st, n->kw_vals[i], sc);
    return n->n_kids + lead;
}

static struct jv eval_call(struct jstate *st, const struct jnode *n, struct jscope *sc, struct jv caller)
{
    struct jv *args, *kw_vals;
    if (n->a->kind == JN_GETATTR) {
        struct jv obj = jeval(st, n->a->a, sc), r;
        int n_args = eval_args(st, n, sc, 0, &args, &kw_vals);
        st->line = n->line;
        if (jmethod(st, obj, n->a->name, args, n_args, n->kw_names, kw_vals, n->n_kw, &r)) return r;
        struct jv f = jgetattr(st, obj, n->a->name);
        if (f.type == JV_MACRO && caller.type != JV_UNDEFINED)
            return call_macro(st, f.u.m, args, n_args, n->kw_names, kw_vals, n->n_kw, caller);
        return jcall_value(st, f, args, n_args, n->kw_names, kw_vals, n->n_kw);
    }
    struct jv f = jeval(st, n->a, sc);
    int n_args = eval_args(st, n, sc, 0, &args, &kw_vals);
    st->line = n->line;
    if (f.type == JV_MACRO)
        return call_macro(st, f.u.m, args, n_args, n->kw_names, kw_vals, n->n_kw, caller);
    return jcall_value(st, f, args, n_args, n->kw_names, kw_vals, n->n_kw);
}

/* A filter node; body is the value a NULL input stands for (filter blocks, block sets). */
static struct jv eval_filter(struct jstate *st, const struct jnode *n, struct jscope *sc, struct jv body)
{
    struct jv in = n->a ? (n->a->kind == JN_FILTER ? eval_filter(st, n->a, sc, body) : jeval(st, n->a, sc)) : body;
    struct jv *args, *kw_vals;
    int n_args = eval_args(st, n, sc, 1, &args, &kw_vals);
    args[0] = in;
    step(st, n);
    return jfilter(st, n->name, args, n_args, n->kw_names, kw_vals, n->n_kw);
}

static struct jv lookup(struct jstate *st, const char *name, struct jscope *sc)
{
    struct jv *v = scope_find(sc, name);
    if (v) return *v;
    static const char *globals[] = {"range", "dict", "namespace", "raise_exception", "strftime_now"};
    static const int fns[] = {JFUNC_RANGE, JFUNC_DICT, JFUNC_NAMESPACE, JFUNC_RAISE, JFUNC_STRFTIME};
    (void)st;
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++)
        if (!strcmp(name, globals[i])) {
            struct jv f = {.type = JV_FUNC};
            f.u.fn = fns[i];
            return f;
        }
    return jv_undef(name);
}

struct jv jeval(struct jstate *st, const struct jnode *n, struct jscope *sc)
{
    step(st, n);
    switch (n->kind) {
    case JN_LITERAL: return n->lit;
    case JN_NAME: return lookup(st, n->name, sc);
    case JN_LIST:
    case JN_TUPLE: {
        struct jv l = jv_list_new(st, (size_t)n->n_kids);
        l.type = n->kind == JN_LIST ? JV_LIST : JV_TUPLE;
        for (int i = 0; i < n->n_kids; i++) jv_list_push(st, l, jeval(st, n->kids[i], sc));
        return l;
    }
    case JN_DICT: {
        struct jv d = jv_dict_new(st);
        for (int i = 0; i + 1 < n->n_kids; i += 2) {
            struct jv k = jeval(st, n->kids[i], sc);
            if (k.type == JV_LIST || k.type == JV_DICT || k.type == JV_UNDEFINED)
                jfail(st, STATUS_INVALID_ARGUMENT, "unhashable type: '%s'", jv_type_name(k));
            jv_dict_set(st, d, k, jeval(st, n->kids[i + 1], sc));
        }
        return d;
    }
    case JN_GETATTR: {
        struct jv obj = jeval(st, n->a, sc);
        st->line = n->line;
        return jgetattr(st, obj, n->name);
    }
    case JN_GETITEM: {
        struct jv obj = jeval(st, n->a, sc), key = jeval(st, n->b, sc);
        st->line = n->line;
        return jgetitem(st, obj, key);
    }
    case JN_SLICE: return eval_slice(st, n, sc);
    case JN_CALL: return eval_call(st, n, sc, jv_undef(NULL));
    case JN_FILTER: return eval_filter(st, n, sc, jv_undef(NULL));
    case JN_TEST: {
        struct jv *args, *kw_vals;
        int n_args = eval_args(st, n, sc, 1, &args, &kw_vals);
        args[0] = jeval(st, n->a, sc);
        st->line = n->line;
        int r = jtest(st, n->name, args, n_args);
        return jv_bool(n->op ? !r : r);
    }
    case JN_UNARY: {
        struct jv v = jeval(st, n->a, sc);
        if (n->op == 'n') return jv_bool(!jv_truthy(v));
        jinja_need_defined(st, v);
        if (!jv_is_number(v)) jfail(st, STATUS_INVALID_ARGUMENT, "bad operand type for unary %c: '%s'", n->op, jv_type_name(v));
        if (n->op == '+') return v.type == JV_BOOL ? jv_int(v.u.b) : v;
        if (v.type == JV_FLOAT) return jv_float(-v.u.f);
        if (jinja_as_int(v) == INT64_MIN) jfail(st, STATUS_INVALID_ARGUMENT, "integer overflow");
        return jv_int(-jinja_as_int(v));
    }
    case JN_BINOP: {
        struct jv a = jeval(st, n->a, sc), b = jeval(st, n->b, sc);
        st->line = n->line;
        if (n->op == '~') {
            struct jbuf out = {0};
            jv_append_str(st, &out, a);
            jv_append_str(st, &out, b);
            return jv_str(st, out.p ? out.p : "", out.n);
        }
        return jinja_arith(st, n->op, a, b);
    }
    case JN_COMPARE: {
        struct jv left = jeval(st, n->a, sc);
        for (int i = 0; i < n->n_kids; i++) {
            struct jv right = jeval(st, n->kids[i], sc);
            st->line = n->line;
            if (!jinja_compare(st, n->ops[i], left, right)) return jv_bool(0);
            left = right;
        }
        return jv_bool(1);
    }
    case JN_AND: {
        struct jv a = jeval(st, n->a, sc);
        return jv_truthy(a) ? jeval(st, n->b, sc) : a;
    }
    case JN_OR: {
        struct jv a = jeval(st, n->a, sc);
        return jv_truthy(a) ? a : jeval(st, n->b, sc);
    }
    case JN_COND:
        if (jv_truthy(jeval(st, n->a, sc))) return jeval(st, n->b, sc);
        return n->c ? jeval(st, n->c, sc) : jv_undef(NULL);
    default: jfail(st, STATUS_INTERNAL, "statement evaluated as an expression");
    }
}

/* ---- statements ----------------------------------------------------------------------- */
static void assign(struct jstate *st, const struct jnode *target, struct jv v, struct jscope *sc)
{
    if (target->kind == JN_NAME) return scope_set(st, sc, target->name, v);
    if (target->kind == JN_GETATTR) {
        struct jv ns = lookup(st, target->a->name, sc);
        if (ns.type != JV_NAMESPACE) jfail(st, STATUS_INVALID_ARGUMENT, "cannot assign attribute on non-namespace object");
        jv_dict_set(st, ns, jv_strz(target->name), v);
        return;
    }
    struct jlist *items = jv_iter(st, v);
    if (v.type == JV_UNDEFINED || (int)items->n != target->n_kids)
        jfail(st, STATUS_INVALID_ARGUMENT, "cannot unpack %zu value(s) into %d name(s)", items->n, target->n_kids);
    for (int i = 0; i < target->n_kids; i++) scope_set(st, sc, target->kids[i]->name, items->v[i]);
}

static void exec_for(struct jstate *st, const struct jnode *n, struct jscope *sc)
{
    struct jv seq = jeval(st, n->b, sc);
    if (seq.type == JV_NONE || seq.type == JV_INT || seq.type == JV_FLOAT || seq.type == JV_BOOL)
        jfail(st, STATUS_INVALID_ARGUMENT, "'%s' object is not iterable", jv_type_name(seq));
    struct jlist *items = jv_iter(st, seq);
    if (n->c) { /* for x in xs if cond: the loop sees only the items that pass */
        struct jv kept = jv_list_new(st, items->n);
        for (size_t i = 0; i < items->n; i++) {
            struct jscope *isc = scope_new(st, sc);
            assign(st, n->a, items->v[i], isc);
            if (jv_truthy(jeval(st, n->c, isc))) jv_list_push(st, kept, items->v[i]);
        }
        items = kept.u.l;
    }
    struct jloop *loop = jalloc(st, sizeof(*loop));
    loop->items = items;
    struct jv lv = {.type = JV_LOOP};
    lv.u.loop = loop;
    for (size_t i = 0; i < items->n; i++) {
        struct jscope *isc = scope_new(st, sc);
        loop->index0 = i;
        scope_set(st, isc, "loop", lv);
        assign(st, n->a, items->v[i], isc);
        exec_node(st, n->d, isc);
        int ctl = st->loop_ctl;
        st->loop_ctl = 0;
        if (ctl == 'b') break;
    }
    if (!items->n && n->e) exec_node(st, n->e, sc);
}

static void exec_node(struct jstate *st, const struct jnode *n, struct jscope *sc)
{
    step(st, n);
    switch (n->kind) {
    case JN_TEXT: return jbuf_put(st, st->out, n->lit.u.s.p, n->lit.u.s.n);
    case JN_OUTPUT: {
        struct jv v = jeval(st, n->a, sc);
        return jv_append_str(st, st->out, v);
    }
    case JN_BODY:
        for (int i = 0; i < n->n_kids && !st->loop_ctl; i++) exec_node(st, n->kids[i], sc);
        return;
    case JN_IF:
        if (jv_truthy(jeval(st, n->a, sc))) exec_node(st, n->b, sc);
        else if (n->c) exec_node(st, n->c, sc);
        return;
    case JN_FOR: return exec_for(st, n, sc);
    case JN_SET: return assign(st, n->a, jeval(st, n->b, sc), sc);
    case JN_SETBLOCK: {
        struct jv v = render_body(st, n->b, sc);
        if (n->c) v = eval_filter(st, n->c, sc, v);
        return scope_set(st, sc, n->name, v);
    }
    case JN_MACRO: {
        struct jmacro *m = jalloc(st, sizeof(*m));
        m->def = n;
        m->scope = sc;
        m->caller = jv_undef(NULL);
        struct jv v = {.type = JV_MACRO};
        v.u.m = m;
        return scope_set(st, sc, n->name, v);
    }
    case JN_CALLBLOCK: {
        struct jmacro *m = jalloc(st, sizeof(*m));
        m->def = n;
        m->scope = sc;
        m->caller = jv_undef(NULL);
        struct jv caller = {.type = JV_MACRO};
        caller.u.m = m;
        struct jv v = eval_call(st, n->a, sc, caller);
        return jv_append_str(st, st->out, v);
    }
    case JN_FILTERBLOCK: {
        struct jv v = eval_filter(st, n->c, sc, render_body(st, n->b, sc));
        return jv_append_str(st, st->out, v);
    }
    case JN_BREAK: st->loop_ctl = 'b'; return;
    case JN_CONTINUE: st->loop_ctl = 'c'; return;
    default: jfail(st, STATUS_INTERNAL, "expression executed as a statement");
    }
}

/* ---- entry points --------------------------------------------------------------------- */
enum status jinja_compile(const char *src, size_t len, const struct jinja_options *opt,
                          struct jinja_template **out)
{
    *out = NULL;
    struct jinja_template *t = calloc(1, sizeof(*t));
    if (!t) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "jinja: out of memory");
    if (opt) t->opt = *opt;
    else jinja_options_chat(&t->opt);
    t->arena.limit = t->opt.max_memory;
    enum status s = jinja_parse(t, src, len);
    if (s != STATUS_OK) {
        jinja_free(t);
        return s;
    }
    *out = t;
    return STATUS_OK;
}

void jinja_free(struct jinja_template *t)
{
    if (!t) return;
    jarena_free(&t->arena);
    free(t);
}

struct chat_args {
    const struct chat_message *msgs;
    int                        n;
    const char                *tools_json;
    int                        add_generation_prompt;
    const char                *bos, *eos;
};

static enum status render(const struct jinja_template *t, const char *json, size_t len,
                          const struct chat_args *chat, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    struct jstate *st = calloc(1, sizeof(*st));
    struct jarena *arena = calloc(1, sizeof(*arena));
    if (!st || !arena) {
        free(st), free(arena);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "jinja: out of memory");
    }
    st->t = t;
    st->arena = arena;
    arena->limit = t->opt.max_memory;
    st->line = 1;
    enum status s = STATUS_OK;
    if (setjmp(st->jb)) {
        s = status_errorf(st->err, "jinja: %s", st->msg);
        goto done;
    }
    struct jscope *root = scope_new(st, NULL);
    if (json) {
        struct jv ctx;
        if (jv_parse_json(st, json, len, &ctx) || ctx.type != JV_DICT)
            jfail(st, STATUS_INVALID_ARGUMENT, "the render context is not a JSON object");
        for (size_t i = 0; i < ctx.u.d->n; i++) scope_set(st, root, ctx.u.d->k[i].u.s.p, ctx.u.d->v[i]);
    } else {
        static const char *roles[] = {"system", "user", "assistant"};
        struct jv msgs = jv_list_new(st, (size_t)chat->n);
        for (int i = 0; i < chat->n; i++) {
            struct jv m = jv_dict_new(st);
            int r = (int)chat->msgs[i].role;
            jv_dict_set(st, m, jv_strz("role"), jv_strz(r >= 0 && r < 3 ? roles[r] : "user"));
            const char *c = chat->msgs[i].content ? chat->msgs[i].content : "";
            jv_dict_set(st, m, jv_strz("content"), jv_str(st, c, strlen(c)));
            jv_list_push(st, msgs, m);
        }
        struct jv tools = jv_none();
        if (chat->tools_json && jv_parse_json(st, chat->tools_json, strlen(chat->tools_json), &tools))
            jfail(st, STATUS_INVALID_ARGUMENT, "tools is not valid JSON");
        scope_set(st, root, "messages", msgs);
        scope_set(st, root, "tools", tools);
        scope_set(st, root, "documents", jv_none());
        scope_set(st, root, "add_generation_prompt", jv_bool(chat->add_generation_prompt));
        scope_set(st, root, "bos_token", jv_strz(chat->bos ? chat->bos : ""));
        scope_set(st, root, "eos_token", jv_strz(chat->eos ? chat->eos : ""));
    }
    st->globals = root;
    struct jbuf buf = {0};
    st->out = &buf;
    exec_node(st, t->root, scope_new(st, root));
    *out = malloc(buf.n + 1);
    if (!*out) {
        s = status_errorf(STATUS_RESOURCE_EXHAUSTED, "jinja: out of memory");
        goto done;
    }
    if (buf.n) memcpy(*out, buf.p, buf.n);
    (*out)[buf.n] = 0;
    *out_len = buf.n;
done:
    jarena_free(st->arena);
    free(st->arena);
    free(st);
    return s;
}

enum status jinja_render_json(const struct jinja_template *t, const char *context_json, size_t len,
                              char **out, size_t *out_len)
{
    return render(t, context_json ? context_json : "{}", context_json ? len : 2, NULL, out, out_len);
}

enum status jinja_render_chat(const struct jinja_template *t, const struct chat_message *msgs,
                              int n, const char *tools_json, int add_generation_prompt,
                              const char *bos, const char *eos, char **out, size_t *out_len)
{
    struct chat_args chat = {msgs, n, tools_json, add_generation_prompt, bos, eos};
    return render(t, NULL, 0, &chat, out, out_len);
}
