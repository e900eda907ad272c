/* engine/text/jinja_parse.c - the Jinja parser: the lexer's tokens to the syntax tree of
 * jinja_impl.h, following jinja2 3.1's parser.py (operator precedence, filters and tests, the
 * statements); one trailing newline dropped and newlines normalized to \n before lexing, as
 * jinja2 does. The tree lives in the template's arena. Not here: the lexer (jinja_lex.c), evaluation (jinja_eval.c).
 * Tests: tests/test_jinja.py, tests/fuzz/fuzz_jinja.c. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_impl.h"

static struct jnode *node(struct parser *p, enum jnode_kind kind, int line)
{
    struct jnode *n = jalloc(p->st, sizeof(*n));
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = line;
    return n;
}

/* A growable array of node pointers during parsing. */
struct nvec {
    struct jnode **v;
    const char  **names;
    int           n, cap;
};

static void nvec_push(struct parser *p, struct nvec *v, struct jnode *x, const char *name)
{
    if (v->n == v->cap) {
        int cap = v->cap ? 2 * v->cap : 8;
        struct jnode **nv = jalloc(p->st, (size_t)cap * sizeof(*nv));
        const char **nn = jalloc(p->st, (size_t)cap * sizeof(*nn));
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof(*nv)), memcpy(nn, v->names, (size_t)v->n * sizeof(*nn));
        v->v = nv, v->names = nn, v->cap = cap;
    }
    v->names[v->n] = name;
    v->v[v->n++] = x;
}

static struct jnode *parse_expression(struct parser *p, int with_condexpr);
static struct jnode *parse_or(struct parser *p);
static struct jnode *parse_unary(struct parser *p, int with_filter);
static struct jnode *parse_primary(struct parser *p);
static struct jnode *parse_postfix(struct parser *p, struct jnode *n);

static void enter(struct parser *p)
{
    if (++p->depth > 200) PFAIL(p, jtok_cur(p)->line, "expression nested too deeply");
}

/* Call arguments after '(' up to and including ')': positional into n->kids, keywords into
 * n->kw_names / kw_vals. */
static void parse_call_args(struct parser *p, struct jnode *n)
{
    struct nvec pos = {0}, kw = {0};
    jtok_expect_op(p, "(");
    while (!jtok_is_op(jtok_cur(p), ")")) {
        if (pos.n || kw.n) jtok_expect_op(p, ",");
        if (jtok_is_op(jtok_cur(p), ")")) break;
        if (jtok_is_op(jtok_cur(p), "*") || jtok_is_op(jtok_cur(p), "**"))
            PFAIL(p, jtok_cur(p)->line, "*args and **kwargs are not supported");
        if (jtok_cur(p)->type == TK_NAME && jtok_is_op(jtok_peek(p, 1), "=")) {
            const char *name = jtok_next(p)->p;
            jtok_next(p);
            nvec_push(p, &kw, parse_expression(p, 1), name);
        } else {
            if (kw.n) PFAIL(p, jtok_cur(p)->line, "positional argument after keyword argument");
            nvec_push(p, &pos, parse_expression(p, 1), NULL);
        }
    }
    jtok_next(p);
    n->kids = pos.v, n->n_kids = pos.n;
    n->kw_names = kw.names, n->kw_vals = kw.v, n->n_kw = kw.n;
}

static struct jnode *parse_tuple(struct parser *p, int with_condexpr, int explicit_parens)
{
    int line = jtok_cur(p)->line;
    struct nvec items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n) jtok_expect_op(p, ",");
        struct tok *t = jtok_cur(p);
        if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || jtok_is_op(t, ")") || jtok_is_op(t, "]") ||
            jtok_is_op(t, "}") || (items.n && (jtok_is_name(t, "in") || jtok_is_op(t, "="))) || t->type == TK_EOF)
            break;
        nvec_push(p, &items, with_condexpr ? parse_expression(p, 1) : parse_or(p), NULL);
        if (!jtok_is_op(jtok_cur(p), ",")) break;
        is_tuple = 1;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) PFAIL(p, line, "expected an expression, got %s", jtok_desc(jtok_cur(p)));
    }
    struct jnode *n = node(p, JN_TUPLE, line);
    n->kids = items.v, n->n_kids = items.n;
    return n;
}

static struct jnode *parse_primary(struct parser *p)
{
    struct tok *t = jtok_cur(p);
    struct jnode *n;
    enter(p);
    if (t->type == TK_NAME) {
        jtok_next(p);
        if (!strcmp(t->p, "true") || !strcmp(t->p, "True") || !strcmp(t->p, "false") ||
            !strcmp(t->p, "False")) {
            n = node(p, JN_LITERAL, t->line);
            n->lit = jv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (!strcmp(t->p, "none") || !strcmp(t->p, "None")) {
            n = node(p, JN_LITERAL, t->line);
            n->lit = jv_none();
        } else {
            n = node(p, JN_NAME, t->line);
            n->name = t->p;
        }
    } else if (t->type == TK_STRING) {
        /* adjacent string literals concatenate */
        size_t total = 0, k = p->at;
        while (p->toks[k].type == TK_STRING) total += p->toks[k++].n;
        char *s = jalloc(p->st, total + 1);
        size_t o = 0;
        while (jtok_cur(p)->type == TK_STRING) {
            memcpy(s + o, jtok_cur(p)->p, jtok_cur(p)->n);
            o += jtok_cur(p)->n;
            jtok_next(p);
        }
        s[o] = 0;
        n = node(p, JN_LITERAL, t->line);
        n->lit.type = JV_STRING;
        n->lit.u.s.p = s;
        n->lit.u.s.n = o;
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        jtok_next(p);
        n = node(p, JN_LITERAL, t->line);
        n->lit = t->type == TK_INT ? jv_int(t->i) : jv_float(t->f);
    } else if (jtok_is_op(t, "(")) {
        jtok_next(p);
        n = parse_tuple(p, 1, 1);
        jtok_expect_op(p, ")");
    } else if (jtok_is_op(t, "[") || jtok_is_op(t, "{")) {
        int dict = t->p[0] == '{';
        jtok_next(p);
        struct nvec items = {0};
        while (!jtok_is_op(jtok_cur(p), dict ? "}" : "]")) {
            if (items.n) jtok_expect_op(p, ",");
            if (jtok_is_op(jtok_cur(p), dict ? "}" : "]")) break;
            nvec_push(p, &items, parse_expression(p, 1), NULL);
            if (dict) {
                jtok_expect_op(p, ":");
                nvec_push(p, &items, parse_expression(p, 1), NULL);
            }
        }
        jtok_next(p);
        n = node(p, dict ? JN_DICT : JN_LIST, t->line);
        n->kids = items.v, n->n_kids = items.n;
    } else {
        PFAIL(p, t->line, "unexpected %s", jtok_desc(t));
    }
    p->depth--;
    return n;
}

static struct jnode *parse_subscript_part(struct parser *p)
{
    int line = jtok_cur(p)->line;
    struct jnode *start = NULL, *stop = NULL, *step = NULL;
    if (!jtok_is_op(jtok_cur(p), ":")) {
        start = parse_expression(p, 1);
        if (!jtok_is_op(jtok_cur(p), ":")) return start;
    }
    jtok_next(p);
    if (!jtok_is_op(jtok_cur(p), "]") && !jtok_is_op(jtok_cur(p), ",") && !jtok_is_op(jtok_cur(p), ":")) stop = parse_expression(p, 1);
    if (jtok_is_op(jtok_cur(p), ":")) {
        jtok_next(p);
        if (!jtok_is_op(jtok_cur(p), "]") && !jtok_is_op(jtok_cur(p), ",")) step = parse_expression(p, 1);
    }
    struct jnode *n = node(p, JN_SLICE, line);
    n->b = start, n->c = stop, n->d = step;
    return n;
}

static struct jnode *parse_postfix(struct parser *p, struct jnode *n)
{
    for (;;) {
        struct tok *t = jtok_cur(p);
        if (jtok_is_op(t, ".")) {
            jtok_next(p);
            struct tok *a = jtok_next(p);
            struct jnode *g;
            if (a->type == TK_NAME) {
                g = node(p, JN_GETATTR, t->line);
                g->name = a->p;
            } else if (a->type == TK_INT) {
                g = node(p, JN_GETITEM, t->line);
                g->b = node(p, JN_LITERAL, t->line);
                g->b->lit = jv_int(a->i);
            } else {
                PFAIL(p, a->line, "expected a name after '.'");
            }
            g->a = n;
            n = g;
        } else if (jtok_is_op(t, "[")) {
            jtok_next(p);
            struct nvec parts = {0};
            while (!jtok_is_op(jtok_cur(p), "]")) {
                if (parts.n) jtok_expect_op(p, ",");
                if (jtok_is_op(jtok_cur(p), "]")) break;
                nvec_push(p, &parts, parse_subscript_part(p), NULL);
            }
            jtok_next(p);
            if (parts.n == 0) PFAIL(p, t->line, "expected a subscript");
            struct jnode *key = parts.v[0];
            if (parts.n > 1) {
                for (int k = 0; k < parts.n; k++)
                    if (parts.v[k]->kind == JN_SLICE) PFAIL(p, t->line, "slices inside a tuple subscript are not supported");
                key = node(p, JN_TUPLE, t->line);
                key->kids = parts.v, key->n_kids = parts.n;
            }
            if (key->kind == JN_SLICE) {
                key->a = n;
                n = key;
            } else {
                struct jnode *g = node(p, JN_GETITEM, t->line);
                g->a = n, g->b = key;
                n = g;
            }
        } else if (jtok_is_op(t, "(")) {
            struct jnode *c = node(p, JN_CALL, t->line);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static const char *parse_dotted_name(struct parser *p)
{
    const char *name = jtok_expect_name(p);
    while (jtok_is_op(jtok_cur(p), ".") && jtok_peek(p, 1)->type == TK_NAME) {
        jtok_next(p);
        const char *more = jtok_next(p)->p;
        size_t a = strlen(name), b = strlen(more);
        char *s = jalloc(p->st, a + b + 2);
        memcpy(s, name, a), s[a] = '.', memcpy(s + a + 1, more, b + 1);
        name = s;
    }
    return name;
}

/* One filter applied to in (NULL in filter blocks): after the '|'. */
static struct jnode *parse_filter(struct parser *p, struct jnode *in)
{
    struct jnode *f = node(p, JN_FILTER, jtok_cur(p)->line);
    f->name = parse_dotted_name(p);
    f->a = in;
    if (jtok_is_op(jtok_cur(p), "(")) parse_call_args(p, f);
    return f;
}

static struct jnode *parse_filter_expr(struct parser *p, struct jnode *n)
{
    for (;;) {
        struct tok *t = jtok_cur(p);
        if (jtok_is_op(t, "|")) {
            jtok_next(p);
            n = parse_filter(p, n);
        } else if (jtok_is_name(t, "is")) {
            jtok_next(p);
            struct jnode *test = node(p, JN_TEST, t->line);
            if (jtok_is_name(jtok_cur(p), "not")) jtok_next(p), test->op = 1;
            test->name = parse_dotted_name(p);
            test->a = n;
            struct tok *c = jtok_cur(p);
            if (jtok_is_op(c, "(")) {
                parse_call_args(p, test);
            } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT ||
                        c->type == TK_FLOAT || jtok_is_op(c, "(") || jtok_is_op(c, "[") || jtok_is_op(c, "{")) &&
                       !jtok_is_name(c, "else") && !jtok_is_name(c, "or") && !jtok_is_name(c, "and")) {
                if (jtok_is_name(c, "is")) PFAIL(p, c->line, "You cannot chain multiple tests with is");
                struct jnode *arg = parse_postfix(p, parse_primary(p));
                test->kids = jalloc(p->st, sizeof(*test->kids));
                test->kids[0] = arg;
                test->n_kids = 1;
            }
            n = test;
        } else if (jtok_is_op(t, "(")) {
            struct jnode *c = node(p, JN_CALL, t->line);
            c->a = n;
            parse_call_args(p, c);
            n = c;
        } else {
            return n;
        }
    }
}

static struct jnode *parse_unary(struct parser *p, int with_filter)
{
    struct tok *t = jtok_cur(p);
    struct jnode *n;
    enter(p);
    if (jtok_is_op(t, "-") || jtok_is_op(t, "+")) {
        jtok_next(p);
        n = node(p, JN_UNARY, t->line);
        n->op = t->p[0];
        n->a = parse_unary(p, 0);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    if (with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static struct jnode *binop(struct parser *p, int op, struct jnode *a, struct jnode *b, int line)
{
    struct jnode *n = node(p, JN_BINOP, line);
    n->op = op, n->a = a, n->b = b;
    return n;
}

static struct jnode *parse_pow(struct parser *p)
{
    struct jnode *n = parse_unary(p, 1);
    while (jtok_is_op(jtok_cur(p), "**")) {
        int line = jtok_next(p)->line;
        n = binop(p, 'p', n, parse_unary(p, 1), line);
    }
    return n;
}

static struct jnode *parse_math2(struct parser *p)
{
    struct jnode *n = parse_pow(p);
    for (;;) {
        struct tok *t = jtok_cur(p);
        int op = jtok_is_op(t, "*") ? '*' : jtok_is_op(t, "/") ? '/' : jtok_is_op(t, "//") ? 'f' : jtok_is_op(t, "%") ? '%' : 0;
        if (!op) return n;
        jtok_next(p);
        n = binop(p, op, n, parse_pow(p), t->line);
    }
}

static struct jnode *parse_concat(struct parser *p)
{
    struct jnode *n = parse_math2(p);
    while (jtok_is_op(jtok_cur(p), "~")) {
        int line = jtok_next(p)->line;
        n = binop(p, '~', n, parse_math2(p), line);
    }
    return n;
}

static struct jnode *parse_math1(struct parser *p)
{
    struct jnode *n = parse_concat(p);
    for (;;) {
        struct tok *t = jtok_cur(p);
        int op = jtok_is_op(t, "+") ? '+' : jtok_is_op(t, "-") ? '-' : 0;
        if (!op) return n;
        jtok_next(p);
        n = binop(p, op, n, parse_concat(p), t->line);
    }
}

static struct jnode *parse_compare(struct parser *p)
{
    struct jnode *first = parse_math1(p);
    struct nvec rest = {0};
    int ops[64];
    for (;;) {
        struct tok *t = jtok_cur(p);
        int op = -1;
        if (jtok_is_op(t, "==")) op = JCMP_EQ;
        else if (jtok_is_op(t, "!=")) op = JCMP_NE;
        else if (jtok_is_op(t, "<")) op = JCMP_LT;
        else if (jtok_is_op(t, "<=")) op = JCMP_LE;
        else if (jtok_is_op(t, ">")) op = JCMP_GT;
        else if (jtok_is_op(t, ">=")) op = JCMP_GE;
        else if (jtok_is_name(t, "in")) op = JCMP_IN;
        else if (jtok_is_name(t, "not") && jtok_is_name(jtok_peek(p, 1), "in")) op = JCMP_NOT_IN, jtok_next(p);
        if (op < 0) break;
        if (rest.n == 64) PFAIL(p, t->line, "comparison chain too long");
        jtok_next(p);
        ops[rest.n] = op;
        nvec_push(p, &rest, parse_math1(p), NULL);
    }
    if (!rest.n) return first;
    struct jnode *n = node(p, JN_COMPARE, first->line);
    n->a = first, n->kids = rest.v, n->n_kids = rest.n;
    n->ops = jalloc(p->st, (size_t)rest.n * sizeof(int));
    memcpy(n->ops, ops, (size_t)rest.n * sizeof(int));
    return n;
}

static struct jnode *parse_not(struct parser *p)
{
    if (jtok_is_name(jtok_cur(p), "not")) {
        int line = jtok_next(p)->line;
        enter(p);
        struct jnode *n = node(p, JN_UNARY, line);
        n->op = 'n';
        n->a = parse_not(p);
        p->depth--;
        return n;
    }
    return parse_compare(p);
}

static struct jnode *parse_and(struct parser *p)
{
    struct jnode *n = parse_not(p);
    while (jtok_is_name(jtok_cur(p), "and")) {
        int line = jtok_next(p)->line;
        struct jnode *a = node(p, JN_AND, line);
        a->a = n, a->b = parse_not(p);
        n = a;
    }
    return n;
}

static struct jnode *parse_or(struct parser *p)
{
    struct jnode *n = parse_and(p);
    while (jtok_is_name(jtok_cur(p), "or")) {
        int line = jtok_next(p)->line;
        struct jnode *o = node(p, JN_OR, line);
        o->a = n, o->b = parse_and(p);
        n = o;
    }
    return n;
}

static struct jnode *parse_expression(struct parser *p, int with_condexpr)
{
    enter(p);
    struct jnode *n = parse_or(p);
    while (with_condexpr && jtok_is_name(jtok_cur(p), "if")) {
        int line = jtok_next(p)->line;
        struct jnode *c = node(p, JN_COND, line);
        c->b = n;
        c->a = parse_or(p);
        if (jtok_is_name(jtok_cur(p), "else")) {
            jtok_next(p);
            c->c = parse_expression(p, 1);
        }
        n = c;
    }
    p->depth--;
    return n;
}

/* ---- statements ----------------------------------------------------------------------- */

static struct jnode *parse_body(struct parser *p, const char *const *ends);

static struct jnode *parse_assign_target(struct parser *p, int allow_attr)
{
    int line = jtok_cur(p)->line;
    int parens = jtok_is_op(jtok_cur(p), "(");
    if (parens) jtok_next(p);
    struct nvec names = {0};
    for (;;) {
        const char *name = jtok_expect_name(p);
        struct jnode *n = node(p, JN_NAME, line);
        n->name = name;
        if (allow_attr && !names.n && jtok_is_op(jtok_cur(p), ".")) {
            jtok_next(p);
            struct jnode *g = node(p, JN_GETATTR, line);
            g->a = n;
            g->name = jtok_expect_name(p);
            return g;
        }
        nvec_push(p, &names, n, NULL);
        if (!jtok_is_op(jtok_cur(p), ",")) break;
        jtok_next(p);
        if (jtok_cur(p)->type != TK_NAME) break;
    }
    if (parens) jtok_expect_op(p, ")");
    if (names.n == 1 && !parens) return names.v[0];
    struct jnode *t = node(p, JN_TUPLE, line);
    t->kids = names.v, t->n_kids = names.n;
    return t;
}

static void parse_macro_params(struct parser *p, struct jnode *m)
{
    struct nvec params = {0};
    jtok_expect_op(p, "(");
    while (!jtok_is_op(jtok_cur(p), ")")) {
        if (params.n) jtok_expect_op(p, ",");
        const char *name = jtok_expect_name(p);
        struct jnode *def = NULL;
        if (jtok_is_op(jtok_cur(p), "=")) {
            jtok_next(p);
            def = parse_expression(p, 1);
        }
        nvec_push(p, &params, def, name);
    }
    jtok_next(p);
    m->kw_names = params.names, m->kw_vals = params.v, m->n_kw = params.n;
}

static struct jnode *parse_filter_chain(struct parser *p)
{
    struct jnode *f = parse_filter(p, NULL);
    while (jtok_is_op(jtok_cur(p), "|")) {
        jtok_next(p);
        f = parse_filter(p, f);
    }
    return f;
}

/* After '{%' and the statement's name. */
static struct jnode *parse_statement(struct parser *p)
{
    struct tok *t = jtok_next(p);
    int line = t->line;
    const char *kw = t->type == TK_NAME ? t->p : "";
    struct jnode *n;
    if (!strcmp(kw, "for")) {
        static const char *const body_end[] = {"endfor", "else", NULL};
        static const char *const else_end[] = {"endfor", NULL};
        n = node(p, JN_FOR, line);
        n->a = parse_assign_target(p, 0);
        if (!jtok_is_name(jtok_cur(p), "in")) PFAIL(p, jtok_cur(p)->line, "expected 'in' in for loop");
        jtok_next(p);
        n->b = parse_tuple(p, 0, 0);
        if (jtok_is_name(jtok_cur(p), "if")) {
            jtok_next(p);
            n->c = parse_expression(p, 1);
        }
        if (jtok_is_name(jtok_cur(p), "recursive")) PFAIL(p, line, "recursive for loops are not supported");
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        int saved = p->in_loop;
        p->in_loop = 1;
        n->d = parse_body(p, body_end);
        p->in_loop = saved;
        if (jtok_is_name(jtok_next(p), "else")) {
            jtok_expect_type(p, TK_BLOCK_END, "'%}'");
            n->e = parse_body(p, else_end);
            jtok_next(p);
        }
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "if")) {
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        static const char *const else_end[] = {"endif", NULL};
        struct jnode *top = node(p, JN_IF, line), *n_if = top;
        for (;;) {
            n_if->a = parse_tuple(p, 0, 0);
            jtok_expect_type(p, TK_BLOCK_END, "'%}'");
            n_if->b = parse_body(p, ends);
            struct tok *e = jtok_next(p);
            if (jtok_is_name(e, "elif")) {
                struct jnode *elif = node(p, JN_IF, e->line);
                n_if->c = node(p, JN_BODY, e->line);
                n_if->c->kids = jalloc(p->st, sizeof(struct jnode *));
                n_if->c->kids[0] = elif;
                n_if->c->n_kids = 1;
                n_if = elif;
                continue;
            }
            if (jtok_is_name(e, "else")) {
                jtok_expect_type(p, TK_BLOCK_END, "'%}'");
                n_if->c = parse_body(p, else_end);
                jtok_next(p);
            }
            break;
        }
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return top;
    }
    if (!strcmp(kw, "set")) {
        static const char *const ends[] = {"endset", NULL};
        struct jnode *target = parse_assign_target(p, 1);
        if (jtok_is_op(jtok_cur(p), "=")) {
            jtok_next(p);
            n = node(p, JN_SET, line);
            n->a = target;
            n->b = parse_tuple(p, 1, 0);
            jtok_expect_type(p, TK_BLOCK_END, "'%}'");
            return n;
        }
        if (target->kind != JN_NAME) PFAIL(p, line, "a block set assigns one name");
        n = node(p, JN_SETBLOCK, line);
        n->name = target->name;
        if (jtok_is_op(jtok_cur(p), "|")) {
            jtok_next(p);
            n->c = parse_filter_chain(p);
        }
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        n->b = parse_body(p, ends);
        jtok_next(p);
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "macro") || !strcmp(kw, "call")) {
        int is_macro = kw[0] == 'm';
        static const char *const mend[] = {"endmacro", NULL};
        static const char *const cend[] = {"endcall", NULL};
        n = node(p, is_macro ? JN_MACRO : JN_CALLBLOCK, line);
        if (is_macro) {
            n->name = jtok_expect_name(p);
            parse_macro_params(p, n);
        } else {
            if (jtok_is_op(jtok_cur(p), "(")) parse_macro_params(p, n);
            n->a = parse_expression(p, 1);
            if (n->a->kind != JN_CALL) PFAIL(p, line, "expected a call after 'call'");
        }
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        int saved = p->in_loop;
        p->in_loop = 0;
        n->b = parse_body(p, is_macro ? mend : cend);
        p->in_loop = saved;
        jtok_next(p);
        if (is_macro && jtok_cur(p)->type == TK_NAME) jtok_next(p); /* {% endmacro name %} */
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "filter")) {
        static const char *const ends[] = {"endfilter", NULL};
        n = node(p, JN_FILTERBLOCK, line);
        n->c = parse_filter_chain(p);
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        n->b = parse_body(p, ends);
        jtok_next(p);
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' assistant-mask tag: renders its body */
        static const char *const ends[] = {"endgeneration", NULL};
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        n = parse_body(p, ends);
        jtok_next(p);
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!p->in_loop) PFAIL(p, line, "'%s' outside loop", kw);
        n = node(p, kw[0] == 'b' ? JN_BREAK : JN_CONTINUE, line);
        jtok_expect_type(p, TK_BLOCK_END, "'%}'");
        return n;
    }
    PFAIL(p, line, "unknown or unsupported tag '%s'", t->type == TK_NAME ? kw : jtok_desc(t));
}

/* Statements up to one of the block names in ends (NULL: the end of the template), which is
 * left as the current token (after its '{%'). */
static struct jnode *parse_body(struct parser *p, const char *const *ends)
{
    struct jnode *body = node(p, JN_BODY, jtok_cur(p)->line);
    struct nvec kids = {0};
    if (++p->depth > 200) PFAIL(p, jtok_cur(p)->line, "blocks nested too deeply");
    for (;;) {
        struct tok *t = jtok_cur(p);
        if (t->type == TK_EOF) {
            if (ends) PFAIL(p, t->line, "unexpected end of template, expected '%s'", ends[0]);
            break;
        }
        if (t->type == TK_DATA) {
            struct jnode *n = node(p, JN_TEXT, t->line);
            n->lit.type = JV_STRING;
            n->lit.u.s.p = t->p;
            n->lit.u.s.n = t->n;
            nvec_push(p, &kids, n, NULL);
            jtok_next(p);
        } else if (t->type == TK_VAR_BEGIN) {
            jtok_next(p);
            struct jnode *n = node(p, JN_OUTPUT, t->line);
            n->a = parse_tuple(p, 1, 0);
            jtok_expect_type(p, TK_VAR_END, "'}}'");
            nvec_push(p, &kids, n, NULL);
        } else if (t->type == TK_BLOCK_BEGIN) {
            struct tok *name = jtok_peek(p, 1);
            int is_end = 0;
            for (int k = 0; ends && ends[k]; k++) is_end |= jtok_is_name(name, ends[k]);
            if (is_end) {
                jtok_next(p);
                break;
            }
            if (name->type == TK_NAME && (!strncmp(name->p, "end", 3) || !strcmp(name->p, "else") ||
                                          !strcmp(name->p, "elif")))
                PFAIL(p, name->line, "unexpected '%s'%s%s", name->p, ends ? ", expected " : "",
                      ends ? ends[0] : "");
            jtok_next(p);
            nvec_push(p, &kids, parse_statement(p), NULL);
        } else {
            PFAIL(p, t->line, "unexpected %s", jtok_desc(t));
        }
    }
    p->depth--;
    body->kids = kids.v, body->n_kids = kids.n;
    return body;
}

enum status jinja_parse(struct jinja_template *t, const char *src, size_t len)
{
    struct jstate *st = calloc(1, sizeof(*st));
    if (!st) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "jinja: out of memory");
    st->arena = &t->arena;
    st->line = 1;
    struct parser p = {.st = st, .opt = &t->opt, .line = 1};
    if (setjmp(st->jb)) {
        enum status s = status_errorf(st->err, "jinja: %s", st->msg);
        free(st);
        return s;
    }
    /* Newlines normalized to \n and one trailing newline dropped, as jinja2 does. */
    char *norm = jalloc(st, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    p.src = norm;
    p.len = n;
    jlex(&p);
    t->root = parse_body(&p, NULL);
    free(st);
    return STATUS_OK;
}
