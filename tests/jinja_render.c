/* tests/jinja_render.c - the C side of tests/test_jinja.py: renders Jinja templates with
 * engine/text/jinja.h and prints the results, so that the Python driver can compare them with
 * jinja2's byte for byte.
 *
 * Usage:
 *   jinja_render TEMPLATE_FILE [CONTEXT_JSON_FILE]   prints the render (chat options), or the
 *                                                    error on stderr and exits 1
 *   jinja_render --batch CASES_JSON_FILE             reads [{"template": str, "context": str
 *                                                    (a JSON object's text), "api": "json" |
 *                                                    "chat", "options": {...}}, ...] and prints
 *                                                    [{"ok": bool, "out": str, "error": str}]
 * Options (all optional): trim_blocks, lstrip_blocks, max_steps, max_output, max_memory,
 * max_depth, now. With "api": "chat" the context's messages (role and content only), tools,
 * add_generation_prompt, bos_token and eos_token go through jinja_render_chat.
 *   jinja_render --train TEMPLATE_FILE TOKENIZER CASES_JSON_FILE
 *                                                    reads [{"messages": [...], "bos_token",
 *                                                    "eos_token"}, ...], renders each with
 *                                                    jinja_render_train and the tokenizer
 *                                                    (tokenizer.json or tokenizer.model), prints
 *                                                    [{"ok", "ids", "loss", "error"}]
 *                                                    (tests/test_jinja_train.py) */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "tokenizer.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(p);
        return NULL;
    }
    fclose(f);
    p[n] = 0;
    *len = (size_t)n;
    return p;
}

static void read_options(const cJSON *o, struct jinja_options *opt)
{
    jinja_options_chat(opt);
    const cJSON *v;
    if ((v = cJSON_GetObjectItem(o, "trim_blocks"))) opt->trim_blocks = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItem(o, "lstrip_blocks"))) opt->lstrip_blocks = cJSON_IsTrue(v);
    if ((v = cJSON_GetObjectItem(o, "max_steps"))) opt->max_steps = (uint64_t)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "max_output"))) opt->max_output = (size_t)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "max_memory"))) opt->max_memory = (size_t)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "max_depth"))) opt->max_depth = (int)v->valuedouble;
    if ((v = cJSON_GetObjectItem(o, "now"))) opt->now = (int64_t)v->valuedouble;
}

/* The role and content of each message of msgs (borrowed from the JSON), *n of them. */
static struct chat_message *read_messages(const cJSON *msgs, int *n)
{
    const cJSON *m;
    int i = 0;
    *n = cJSON_GetArraySize(msgs);
    struct chat_message *cm = calloc((size_t)*n + 1, sizeof(*cm));
    cJSON_ArrayForEach(m, msgs)
    {
        cm[i].role = (enum chat_role)chat_role_parse(cJSON_GetObjectItem(m, "role")->valuestring);
        cm[i++].content = cJSON_GetObjectItem(m, "content")->valuestring;
    }
    return cm;
}

/* jinja_render_chat with the context's fields. */
static enum status render_chat(const struct jinja_template *t, const char *context, char **out, size_t *len)
{
    cJSON *c = cJSON_Parse(context);
    int n = 0;
    struct chat_message *cm = read_messages(cJSON_GetObjectItem(c, "messages"), &n);
    const cJSON *tools = cJSON_GetObjectItem(c, "tools");
    char *tools_json = tools && !cJSON_IsNull(tools) ? cJSON_PrintUnformatted(tools) : NULL;
    const cJSON *bos = cJSON_GetObjectItem(c, "bos_token"), *eos = cJSON_GetObjectItem(c, "eos_token");
    enum status s = jinja_render_chat(t, cm, n, tools_json,
                                      cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                                      bos ? bos->valuestring : NULL, eos ? eos->valuestring : NULL, out, len);
    free(tools_json);
    free(cm);
    cJSON_Delete(c);
    return s;
}

static int batch(const char *path)
{
    size_t len;
    char *text = read_file(path, &len);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    if (!cases) {
        fprintf(stderr, "jinja_render: cannot read %s\n", path);
        return 1;
    }
    cJSON *results = cJSON_CreateArray(), *c;
    cJSON_ArrayForEach(c, cases)
    {
        struct jinja_options opt;
        read_options(cJSON_GetObjectItem(c, "options"), &opt);
        const char *tpl = cJSON_GetObjectItem(c, "template")->valuestring;
        const cJSON *ctx = cJSON_GetObjectItem(c, "context"), *api = cJSON_GetObjectItem(c, "api");
        struct jinja_template *t = NULL;
        char *out = NULL;
        size_t out_len = 0;
        enum status s = jinja_compile(tpl, strlen(tpl), &opt, &t);
        if (s == STATUS_OK) {
            if (api && !strcmp(api->valuestring, "chat")) s = render_chat(t, ctx->valuestring, &out, &out_len);
            else s = jinja_render_json(t, ctx ? ctx->valuestring : "{}", ctx ? strlen(ctx->valuestring) : 2, &out, &out_len);
        }
        cJSON *r = cJSON_CreateObject();
        cJSON_AddBoolToObject(r, "ok", s == STATUS_OK);
        cJSON_AddStringToObject(r, "out", out ? out : "");
        cJSON_AddStringToObject(r, "error", s == STATUS_OK ? "" : status_message());
        cJSON_AddItemToArray(results, r);
        free(out);
        jinja_free(t);
    }
    char *printed = cJSON_PrintUnformatted(results);
    fputs(printed, stdout);
    free(printed);
    cJSON_Delete(results);
    cJSON_Delete(cases);
    free(text);
    return 0;
}

static int train(const char *tpl_path, const char *tok_path, const char *cases_path)
{
    size_t tlen, clen;
    char *tpl = read_file(tpl_path, &tlen), *text = read_file(cases_path, &clen);
    cJSON *cases = text ? cJSON_Parse(text) : NULL;
    struct tokenizer *tok = NULL;
    struct jinja_template *t = NULL;
    if (!tpl || !cases || tokenizer_load(tok_path, &tok) != STATUS_OK || jinja_compile(tpl, tlen, NULL, &t) != STATUS_OK) {
        fprintf(stderr, "jinja_render --train: cannot read the inputs: %s\n", status_message());
        return 1;
    }
    cJSON *results = cJSON_CreateArray(), *c;
    cJSON_ArrayForEach(c, cases)
    {
        int n = 0;
        struct chat_message *cm = read_messages(cJSON_GetObjectItem(c, "messages"), &n);
        const cJSON *bos = cJSON_GetObjectItem(c, "bos_token"), *eos = cJSON_GetObjectItem(c, "eos_token");
        int32_t *ids = NULL;
        uint8_t *loss = NULL;
        int n_ids = 0;
        enum status s = jinja_render_train(t, tok, bos ? bos->valuestring : NULL, eos ? eos->valuestring : NULL, cm, n,
                                           &ids, &loss, &n_ids);
        cJSON *r = cJSON_CreateObject(), *ri = cJSON_AddArrayToObject(r, "ids"), *rl = cJSON_AddArrayToObject(r, "loss");
        cJSON_AddBoolToObject(r, "ok", s == STATUS_OK);
        for (int k = 0; k < n_ids; k++) {
            cJSON_AddItemToArray(ri, cJSON_CreateNumber(ids[k]));
            cJSON_AddItemToArray(rl, cJSON_CreateNumber(loss[k]));
        }
        cJSON_AddStringToObject(r, "error", s == STATUS_OK ? "" : status_message());
        cJSON_AddItemToArray(results, r);
        free(ids);
        free(loss);
        free(cm);
    }
    char *printed = cJSON_PrintUnformatted(results);
    fputs(printed, stdout);
    free(printed);
    cJSON_Delete(results);
    cJSON_Delete(cases);
    jinja_free(t);
    tokenizer_free(tok);
    free(tpl);
    free(text);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--batch")) return batch(argv[2]);
    if (argc == 5 && !strcmp(argv[1], "--train")) return train(argv[2], argv[3], argv[4]);
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: jinja_render TEMPLATE [CONTEXT_JSON] | --batch CASES_JSON\n");
        return 2;
    }
    size_t tlen, clen = 2;
    char *tpl = read_file(argv[1], &tlen), *ctx = argc == 3 ? read_file(argv[2], &clen) : NULL;
    if (!tpl || (argc == 3 && !ctx)) {
        fprintf(stderr, "jinja_render: cannot read the input files\n");
        return 2;
    }
    struct jinja_template *t;
    char *out = NULL;
    size_t out_len;
    enum status s = jinja_compile(tpl, tlen, NULL, &t);
    if (s == STATUS_OK) s = jinja_render_json(t, ctx ? ctx : "{}", clen, &out, &out_len);
    if (s != STATUS_OK) {
        fprintf(stderr, "%s: %s\n", status_name(s), status_message());
        return 1;
    }
    fwrite(out, 1, out_len, stdout);
    free(out);
    jinja_free(t);
    free(tpl);
    free(ctx);
    return 0;
}
