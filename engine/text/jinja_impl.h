/* engine/text/jinja_impl.h - what the files of the Jinja interpreter share (jinja.h is the
 * public contract): the arena that owns a template's syntax tree and a render's values, the
 * value type, the syntax tree, and the helpers between the lexer (jinja_lex.c), the parser
 * (jinja_parse.c), the values (jinja_value.c), the evaluator (jinja_eval.c) and the builtins
 * (jinja_builtins.c, jinja_tests.c).
 * Errors inside a render or a parse unwind with longjmp to the one entry point that set the
 * jmp_buf (jinja_compile, render): everything allocated meanwhile lives in the arena, which
 * the entry point frees, so nothing leaks on the way out. */
#ifndef SHARDLM_JINJA_IMPL_H
#define SHARDLM_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* ---- arena ---------------------------------------------------------------------------- */
struct jarena_chunk;
struct jarena {
    struct jarena_chunk *head;
    size_t               used;  /* bytes handed out so far */
    size_t               limit; /* 0: none */
};
/* NULL when out of memory or over the limit. */
void *jarena_alloc(struct jarena *a, size_t n);
void  jarena_free(struct jarena *a);

/* ---- values --------------------------------------------------------------------------- */
enum jv_type {
    JV_UNDEFINED, /* a missing name, key or attribute: "" when printed, falsy */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STRING,
    JV_LIST,
    JV_TUPLE,     /* a list printed as (a, b) */
    JV_DICT,
    JV_NAMESPACE, /* namespace(): a dict whose attributes `set` may assign */
    JV_LOOP,      /* the `loop` of a for loop */
    JV_MACRO,
    JV_FUNC,      /* a global function (range, namespace, raise_exception, ...) */
};

struct jlist;
struct jdict;
struct jloop;
struct jmacro;

struct jv {
    enum jv_type type;
    /* JV_STRING: a Markup, as jinja2's markupsafe makes one (|safe, |escape): `+` joins a plain
     * string to it HTML-escaped, and the result is a Markup (jinja_eval.c arith); any other
     * operation gives a plain string. */
    unsigned char safe;
    union {
        int            b;
        int64_t        i;
        double         f;
        struct { const char *p; size_t n; } s; /* UTF-8, not NUL-terminated */
        struct jlist  *l;                       /* JV_LIST, JV_TUPLE */
        struct jdict  *d;                       /* JV_DICT, JV_NAMESPACE */
        struct jloop  *loop;
        struct jmacro *m;
        int            fn;                      /* JV_FUNC: enum jfunc */
        const char    *undef_name;              /* JV_UNDEFINED: what was missing, or NULL */
    } u;
};

struct jlist {
    struct jv *v;
    size_t     n, cap;
};

struct jdict {
    struct jv *k, *v; /* insertion order */
    size_t     n, cap;
};

enum jfunc { JFUNC_RANGE, JFUNC_DICT, JFUNC_NAMESPACE, JFUNC_RAISE, JFUNC_STRFTIME };

/* ---- syntax tree ---------------------------------------------------------------------- */
enum jnode_kind {
    /* expressions */
    JN_LITERAL,  /* lit */
    JN_NAME,     /* name */
    JN_LIST,     /* kids */
    JN_TUPLE,    /* kids */
    JN_DICT,     /* kids: key, value, key, value, ... */
    JN_GETATTR,  /* a.name */
    JN_GETITEM,  /* a[b] */
    JN_SLICE,    /* a[b:c:d], any of b, c, d NULL */
    JN_CALL,     /* a(kids, kw) */
    JN_FILTER,   /* a|name(kids, kw); a NULL in a filter block or block set: the body */
    JN_TEST,     /* a is [not] name(kids); op: 1 when negated */
    JN_UNARY,    /* op a: 'n' not, '-' neg, '+' pos */
    JN_BINOP,    /* a op b: '+', '-', '*', '/', 'f' (//), '%', 'p' (**), '~' */
    JN_COMPARE,  /* a then kids with ops[]: a chain a < b < c */
    JN_AND,
    JN_OR,
    JN_COND,     /* b if a else c (c NULL: undefined) */
    /* statements */
    JN_TEXT,     /* lit: the text */
    JN_OUTPUT,   /* {{ a }} */
    JN_BODY,     /* kids */
    JN_IF,       /* if a: b else c (b, c bodies; c NULL or a JN_BODY holding an elif JN_IF) */
    JN_FOR,      /* for a in b [if c]: d else e */
    JN_SET,      /* set a = b (a: JN_NAME, JN_TUPLE of names or JN_GETATTR on a name) */
    JN_SETBLOCK, /* set name = b (body) filtered by c (NULL or JN_FILTER chain on NULL) */
    JN_MACRO,    /* macro name(params) body b */
    JN_CALLBLOCK,/* call(params) a (a JN_CALL) with caller body b */
    JN_FILTERBLOCK, /* filter c (JN_FILTER chain on NULL) body b */
    JN_BREAK,
    JN_CONTINUE,
};

/* Comparison operators of JN_COMPARE. */
enum jcmp { JCMP_EQ, JCMP_NE, JCMP_LT, JCMP_LE, JCMP_GT, JCMP_GE, JCMP_IN, JCMP_NOT_IN };

struct jnode {
    enum jnode_kind kind;
    int             line;
    int             op;
    struct jnode   *a, *b, *c, *d, *e;
    struct jnode  **kids;      /* positional arguments, items, statements */
    int             n_kids;
    int            *ops;       /* JN_COMPARE: n_kids operators */
    const char    **kw_names;  /* keyword arguments, or macro parameters (kw_vals[i] NULL: none) */
    struct jnode  **kw_vals;
    int             n_kw;
    const char     *name;      /* NUL-terminated */
    struct jv       lit;
};

struct jmacro {
    const struct jnode *def;    /* JN_MACRO, or JN_CALLBLOCK for caller() */
    struct jscope      *scope;  /* where it was defined (its free names resolve there) */
    struct jv           caller; /* JV_MACRO or JV_UNDEFINED: the caller of a call block */
};

struct jinja_template {
    struct jarena        arena;
    struct jnode        *root;
    struct jinja_options opt;
};

/* ---- lexer and parser (jinja_lex.c, jinja_parse.c) ------------------------------------ */
enum tok_type {
    TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
    TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP,
};

struct tok {
    enum tok_type type;
    int           line;
    const char   *p; /* TK_NAME, TK_OP: NUL-terminated copy; TK_DATA, TK_STRING: value */
    size_t        n;
    int64_t       i;
    double        f;
};

struct parser {
    struct jstate *st;
    const struct jinja_options *opt;
    const char *src;
    size_t      len, pos;
    int         line;
    struct tok *toks;
    size_t      n_toks, cap_toks, at;
    int         depth;    /* expression nesting */
    int         in_loop;  /* for break / continue */
};

/* Fails the parse at line_ with STATUS_BAD_FORMAT. */
#define PFAIL(p, line_, ...) ((p)->st->line = (line_), jfail((p)->st, STATUS_BAD_FORMAT, __VA_ARGS__))

/* jinja_lex.c: the token stream of p->src, ending with TK_EOF; and reading it. */
void jlex(struct parser *p);
char *jparse_strdup(struct parser *p, const char *s, size_t n);
struct tok *jtok_cur(struct parser *p);
struct tok *jtok_peek(struct parser *p, int k);
struct tok *jtok_next(struct parser *p);
int jtok_is_op(const struct tok *t, const char *op);
int jtok_is_name(const struct tok *t, const char *n);
const char *jtok_desc(const struct tok *t);
void jtok_expect_op(struct parser *p, const char *op);
void jtok_expect_type(struct parser *p, enum tok_type type, const char *what);
const char *jtok_expect_name(struct parser *p);

/* jinja_parse.c: builds t->root from src, or returns STATUS_BAD_FORMAT with the line. */
enum status jinja_parse(struct jinja_template *t, const char *src, size_t len);

/* ---- render state --------------------------------------------------------------------- */
struct jbuf {
    char  *p;
    size_t n, cap;
};

struct jscope {
    struct jscope *parent;
    const char   **names;
    struct jv     *vals;
    size_t         n, cap;
};

struct jstate {
    const struct jinja_template *t;
    struct jarena               *arena;    /* the template's while parsing, the render's */
    struct jbuf                 *out;
    uint64_t                     steps;
    int                          depth;
    int                          line;     /* of the node being evaluated */
    int                          loop_ctl; /* 0, 'b' (break) or 'c' (continue) pending */
    struct jscope               *globals;
    jmp_buf                      jb;
    enum status                  err;
    char                         msg[512];
};

/* Unwinds the render (or the parse) with an error naming the current line. */
_Noreturn void jfail(struct jstate *st, enum status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void *jalloc(struct jstate *st, size_t n); /* never NULL: fails the render instead */

/* jinja_ops.c: the operators, as jinja2 (Python) evaluates them */
void      jinja_need_defined(struct jstate *st, struct jv v); /* fails the render on an undefined v */
int64_t   jinja_as_int(struct jv v);                          /* an int's or a bool's value */
struct jv jinja_arith(struct jstate *st, int op, struct jv a, struct jv b); /* + - * / // % ** ~ */
int       jinja_contains(struct jstate *st, struct jv item, struct jv seq); /* item in seq */
int       jinja_compare(struct jstate *st, int op, struct jv a, struct jv b); /* == != < <= > >= */

/* jinja_value.c */
struct jv jv_undef(const char *name);
struct jv jv_none(void);
struct jv jv_bool(int b);
struct jv jv_int(int64_t i);
struct jv jv_float(double f);
struct jv jv_str(struct jstate *st, const char *p, size_t n); /* copies */
/* v's text HTML-escaped (& < > " '), as a Markup; a Markup as it is (jinja2's |escape). */
struct jv jv_escape(struct jstate *st, struct jv v);
struct jv jv_strz(const char *s);                              /* borrows a NUL-terminated static */
struct jv jv_list_new(struct jstate *st, size_t cap);
struct jv jv_dict_new(struct jstate *st);
void      jv_list_push(struct jstate *st, struct jv list, struct jv v);
void      jv_dict_set(struct jstate *st, struct jv dict, struct jv k, struct jv v);
/* The value under key (JV_UNDEFINED when absent). */
struct jv jv_dict_get(const struct jv *dict, struct jv key);
struct jv jv_dict_gets(const struct jv *dict, const char *key);
int       jv_truthy(struct jv v);
int       jv_equal(struct jv a, struct jv b);
/* <0, 0, >0; fails the render for types that Python cannot order. */
int       jv_compare(struct jstate *st, struct jv a, struct jv b);
const char *jv_type_name(struct jv v); /* Python's: 'str', 'int', 'dict', ... */
int       jv_is_number(struct jv v);   /* int, float or bool */
double    jv_as_double(struct jv v);
/* Python's str(v) (strings as is, None, True, 1.5, [1, 'a'], {'k': 'v'}) appended to b. */
void      jv_append_str(struct jstate *st, struct jbuf *b, struct jv v);
/* Python's repr(v). */
void      jv_append_repr(struct jstate *st, struct jbuf *b, struct jv v);
struct jv jv_to_string(struct jstate *st, struct jv v);
/* json.dumps(v, ensure_ascii, indent (NULL: none), separators, sort_keys). */
void      jv_append_json(struct jstate *st, struct jbuf *b, struct jv v, int ensure_ascii,
                         const char *indent, const char *item_sep, const char *key_sep,
                         int sort_keys, int level);
/* Parses a JSON text into a value; -1 on malformed JSON. */
int       jv_parse_json(struct jstate *st, const char *p, size_t n, struct jv *out);
/* A list of the items of an iterable (list, tuple, dict keys, string characters, undefined:
 * empty); fails the render for anything else. */
struct jlist *jv_iter(struct jstate *st, struct jv v);
size_t    utf8_len(const char *p, size_t n);       /* code points */
size_t    utf8_offset(const char *p, size_t n, size_t cp); /* byte offset of code point cp */

void jbuf_put(struct jstate *st, struct jbuf *b, const char *p, size_t n);
void jbuf_putc(struct jstate *st, struct jbuf *b, char c);
void jbuf_puts(struct jstate *st, struct jbuf *b, const char *s);

/* jinja_eval.c */
struct jv jeval(struct jstate *st, const struct jnode *n, struct jscope *sc);
struct jv jcall_value(struct jstate *st, struct jv f, struct jv *args, int n_args,
                      const char **kw_names, struct jv *kw_vals, int n_kw);
struct jv jgetattr(struct jstate *st, struct jv obj, const char *name);
struct jv jgetitem(struct jstate *st, struct jv obj, struct jv key);

/* jinja_builtins.c: ASCII case mapping of a string (mode 'u' upper, 'l' lower, 't' str.title,
 * 'c' capitalize), and the first occurrence of needle in hay (NULL when none). */
struct jv   jstr_case(struct jstate *st, struct jv s, int mode);
const char *jstr_find(const char *hay, size_t n_hay, const char *needle, size_t n_needle);

/* jinja_builtins.c (filters, methods) and jinja_tests.c (tests, globals): args[0] is the filtered/tested value or the method's object. */
struct jv jfilter(struct jstate *st, const char *name, struct jv *args, int n_args,
                  const char **kw_names, struct jv *kw_vals, int n_kw);
int       jtest(struct jstate *st, const char *name, struct jv *args, int n_args);
int       jtest_exists(const char *name);
/* Returns 1 and sets *out when obj has a method of that name. */
int       jmethod(struct jstate *st, struct jv obj, const char *name, struct jv *args, int n_args,
                  const char **kw_names, struct jv *kw_vals, int n_kw, struct jv *out);
struct jv jglobal_call(struct jstate *st, int fn, struct jv *args, int n_args,
                       const char **kw_names, struct jv *kw_vals, int n_kw);

#endif
