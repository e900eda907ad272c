/* engine/grammar/grammar_schema_scalar.c - a JSON Schema's numbers (bounds: integers exactly,
 * other numbers by their sign; OpenAPI's int32) and strings (pattern, the RFC formats as regular
 * expressions, minLength / maxLength) as expression trees, for grammar_schema.c.
 * Tests: tests/test_grammar.c, tests/test_grammar.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grammar_schema_impl.h"

static struct gx *int_range(struct sb *s, int has_lo, long long lo, int has_hi, long long hi, const char *path)
{
    struct gbuild *b = s->b;
    if (!has_lo && !has_hi) return gx_ref(b, s->r_int);
    if (has_lo && has_hi && lo > hi) return schema_fail(s, path, "minimum above maximum%s", ""), NULL;
    const long long big = 1000000000000000000LL;
    if ((has_lo && (lo > big || lo < -big)) || (has_hi && (hi > big || hi < -big))) return schema_fail(s, path, "integer bound beyond 1e18%s", ""), NULL;
    struct gx *alts[2];
    int k = 0;
    if (!has_lo || lo < 0) { /* negative part: -(max(1,-hi) .. -lo) */
        long long nlo = has_hi && hi < 0 ? -hi : 1, nhi = has_lo ? -lo : -1;
        alts[k++] = gx_seq2(b, gx_str(b, "-"), gx_uint_range(b, nlo, nhi));
    }
    if (!has_hi || hi >= 0) alts[k++] = gx_uint_range(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    return gx_alt(b, k, alts);
}

static int bound(const cJSON *node, const char *kw, const char *ex, int upper, double *v, int *exclusive)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(node, kw), *e = cJSON_GetObjectItemCaseSensitive(node, ex);
    int have = 0;
    *exclusive = 0;
    if (cJSON_IsNumber(x)) *v = x->valuedouble, have = 1;
    if (cJSON_IsNumber(e) && (!have || (upper ? e->valuedouble <= *v : e->valuedouble >= *v))) *v = e->valuedouble, have = 1, *exclusive = 1;
    if (cJSON_IsTrue(e) && have) *exclusive = 1; /* draft 4 */
    return have;
}

struct gx *schema_number(struct sb *s, const cJSON *node, int integer, const char *path)
{
    double lo = 0, hi = 0;
    int exlo, exhi;
    int has_lo = bound(node, "minimum", "exclusiveMinimum", 0, &lo, &exlo);
    int has_hi = bound(node, "maximum", "exclusiveMaximum", 1, &hi, &exhi);
    /* OpenAPI's numeric formats: int32 bounds an integer; int64, float and double do not narrow
     * what JSON can write here (int64's range is beyond the 1e18 bound limit) and are ignored. */
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(node, "format");
    if (fmt) {
        const char *f = cJSON_IsString(fmt) ? fmt->valuestring : "?";
        if (!strcmp(f, "int32") && integer) {
            if (!has_lo || lo < -2147483648.0) lo = -2147483648.0, has_lo = 1, exlo = 0;
            if (!has_hi || hi > 2147483647.0) hi = 2147483647.0, has_hi = 1, exhi = 0;
        } else if (strcmp(f, "int64") && strcmp(f, "float") && strcmp(f, "double") && strcmp(f, "int32")) {
            return schema_fail(s, path, "unsupported format '%s' for a number", f), NULL;
        }
    }
    if (integer) {
        /* Checked as doubles first: a bound beyond long long (2.4e88, inf) must not be cast. */
        if ((has_lo && !(fabs(lo) <= 1e18)) || (has_hi && !(fabs(hi) <= 1e18)))
            return schema_fail(s, path, "integer bound beyond 1e18%s", ""), NULL;
        long long l = 0, h = 0;
        if (has_lo) l = (long long)ceil(lo), l += exlo && (double)l == lo;
        if (has_hi) h = (long long)floor(hi), h -= exhi && (double)h == hi;
        return int_range(s, has_lo, l, has_hi, h, path);
    }
    /* Numbers: only the sign is enforced (a non-negative minimum forbids '-'); documented. */
    if (has_lo && lo >= 0) {
        struct gbuild *b = s->b;
        struct gx *digits = gx_repeat(b, gx_byte_range(b, '0', '9'), 1, -1);
        struct gx *e = gx_byte_range(b, 'e', 'e');
        if (e) e->set['E' >> 5] |= 1u << ('E' & 31);
        struct gx *sign = gx_byte_range(b, '+', '+');
        if (sign) sign->set['-' >> 5] |= 1u << ('-' & 31);
        return gx_seq3(b, gx_uint_range(b, 0, -1), gx_repeat(b, gx_seq2(b, gx_str(b, "."), digits), 0, 1),
                       gx_repeat(b, gx_seq3(b, e, gx_repeat(b, sign, 0, 1), digits), 0, 1));
    }
    return gx_ref(s->b, s->r_number);
}

/* The formats, as regular expressions of their RFCs (3339 dates and times, 5321 mailboxes, 4122
 * UUIDs, 1123 host names, dotted IPv4): month lengths are checked (February up to 29), not leap
 * years; no leap second 60 (Python jsonschema refuses most). */
#define RX_DATE "[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|[12][0-9]))"
#define RX_TIME "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([zZ]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define RX_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9][0-9]|[0-9])"
#define RX_LABEL "[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
#define RX_ATEXT "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]"
static const char *format_regex(const char *f)
{
    static const struct { const char *name, *re; } formats[] = {
        {"date", "^" RX_DATE "$"},
        {"time", "^" RX_TIME "$"},
        {"date-time", "^" RX_DATE "[tT]" RX_TIME "$"},
        {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
        {"email", "^" RX_ATEXT "+(\\." RX_ATEXT "+)*@(" RX_LABEL "(\\." RX_LABEL ")*|\\[(" RX_OCTET "\\.){3}" RX_OCTET "\\])$"},
        {"ipv4", "^(" RX_OCTET "\\.){3}" RX_OCTET "$"},
        {"hostname", "^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*$"},
    };
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
        if (!strcmp(f, formats[i].name)) return formats[i].re;
    return NULL;
}

struct gx *schema_string(struct sb *s, const cJSON *node, const char *path)
{
    struct gbuild *b = s->b;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(node, "pattern"), *fmt = cJSON_GetObjectItemCaseSensitive(node, "format");
    const cJSON *mn = cJSON_GetObjectItemCaseSensitive(node, "minLength"), *mx = cJSON_GetObjectItemCaseSensitive(node, "maxLength");
    const char *re = NULL;
    if (fmt) {
        if (!cJSON_IsString(fmt) || !(re = format_regex(fmt->valuestring)))
            return schema_fail(s, path, "unsupported format '%s'", cJSON_IsString(fmt) ? fmt->valuestring : "?"), NULL;
    }
    if (pat) {
        if (!cJSON_IsString(pat)) return schema_fail(s, path, "pattern is not a string%s", ""), NULL;
        if (re) return schema_fail(s, path, "pattern together with format is not supported%s", ""), NULL;
        re = pat->valuestring;
    }
    struct gx *content;
    if (re) {
        if (mn || mx) return schema_fail(s, path, "minLength/maxLength together with pattern or format is not supported%s", ""), NULL;
        enum status st = regex_parse(b, re, strlen(re), 1, &content);
        if (st) return NULL;
    } else {
        int lo = 0, hi = -1;
        if (mn && (!cJSON_IsNumber(mn) || mn->valuedouble < 0 || mn->valuedouble > GRAMMAR_MAX_REPEAT))
            return schema_fail(s, path, "minLength must be an integer in [0, %s]", "10000"), NULL;
        if (mx && (!cJSON_IsNumber(mx) || mx->valuedouble < 0 || mx->valuedouble > GRAMMAR_MAX_REPEAT))
            return schema_fail(s, path, "maxLength must be an integer in [0, %s]", "10000"), NULL;
        if (mn) lo = mn->valueint;
        if (mx) hi = mx->valueint;
        if (hi >= 0 && hi < lo) return schema_fail(s, path, "maxLength below minLength%s", ""), NULL;
        if (!mn && !mx) return gx_ref(b, s->r_string);
        content = gx_repeat(b, gx_ref(b, s->r_char), lo, hi);
    }
    return gx_seq3(b, gx_str(b, "\""), content, gx_str(b, "\""));
}
