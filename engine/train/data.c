/* engine/train/data.c - training files to tokenized examples, the shuffled order, packed
 * micro-batches (data.h). Tests: tests/test_train_data.c. */
#include "data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token_builder.h"
#include "tokenizer.h"

/* ---- examples ---------------------------------------------------------------------------- */

static void example_free(struct train_example *e)
{
    free(e->ids);
    free(e->loss);
}

void data_free(struct train_dataset *ds)
{
    for (size_t i = 0; i < ds->n; i++) example_free(&ds->ex[i]);
    free(ds->ex);
    free(ds->order);
    memset(ds, 0, sizeof *ds);
}

/* Appends an example (taking ownership of its arrays) after applying the overflow policy. */
static enum status add_example(struct train_dataset *ds, const struct data_options *o,
                               struct train_example e, const char *path, long line)
{
    if (e.n > o->seq_length) {
        if (o->overflow == DATA_OVERFLOW_ERROR) {
            example_free(&e);
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "%s:%ld: the example has %d tokens, more than --seq-length %d "
                                 "(--data-overflow truncate|skip to accept such lines)",
                                 path, line, e.n, o->seq_length);
        }
        if (o->overflow == DATA_OVERFLOW_SKIP) {
            ds->n_skipped++;
            example_free(&e);
            return STATUS_OK;
        }
        e.n = o->seq_length;
        ds->n_truncated++;
    }
    int targets = 0;
    if (e.n > 0) e.loss[0] = 0; /* n is 0 for an empty text with a tokenizer without BOS and EOS */
    for (int i = 1; i < e.n; i++) targets += e.loss[i];
    if (targets == 0) { /* nothing to learn from (e.g. a completion cut off by truncation) */
        ds->n_no_target++;
        example_free(&e);
        return STATUS_OK;
    }
    if (base_grow((void **)&ds->ex, &ds->cap, ds->n + 1, sizeof *ds->ex)) {
        example_free(&e);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory");
    }
    ds->ex[ds->n++] = e;
    ds->n_tokens += e.n;
    ds->n_target_tokens += targets;
    return STATUS_OK;
}

static struct train_example builder_take(struct token_builder *b)
{
    struct train_example e = {.ids = b->ids, .loss = b->loss, .n = (int)b->n};
    memset(b, 0, sizeof *b);
    return e;
}

/* ---- formats ----------------------------------------------------------------------------- */

/* Plain text: the whole file's tokens (BOS first), cut into examples of seq_length. */
static enum status load_text_file(const char *path, const char *text, size_t len,
                                  const struct tokenizer *tok, const struct data_options *o,
                                  struct train_dataset *ds)
{
    int32_t *ids = NULL;
    int n = 0;
    enum status st = tokenizer_encode(tok, text, len, 1, &ids, &n);
    if (st != STATUS_OK) return st;
    for (int start = 0; start + 1 < n && st == STATUS_OK; start += o->seq_length) {
        int m = n - start < o->seq_length ? n - start : o->seq_length;
        struct train_example e = {malloc((size_t)m * sizeof *e.ids), malloc((size_t)m), m};
        if (!e.ids || !e.loss) {
            example_free(&e);
            st = status_errorf(STATUS_RESOURCE_EXHAUSTED, "%s: out of memory", path);
            break;
        }
        memcpy(e.ids, ids + start, (size_t)m * sizeof *ids);
        memset(e.loss, 1, (size_t)m);
        st = add_example(ds, o, e, path, 1);
    }
    free(ids);
    return st;
}

static const char *json_string(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ShareGPT's "from" names and the OpenAI roles. */
static int parse_role(const char *s)
{
    if (!strcmp(s, "human") || !strcmp(s, "user")) return CHAT_ROLE_USER;
    if (!strcmp(s, "gpt") || !strcmp(s, "assistant") || !strcmp(s, "model")) return CHAT_ROLE_ASSISTANT;
    if (!strcmp(s, "system")) return CHAT_ROLE_SYSTEM;
    return -1;
}

static enum status load_chat(const cJSON *list, const char *role_key, const char *content_key,
                             const char *path, long line, const struct tokenizer *tok,
                             const struct data_options *o, struct train_example *out)
{
    const int n = cJSON_GetArraySize(list);
    if (n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: an empty conversation", path, line);
    struct chat_message *msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory");
    enum status st = STATUS_OK;
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        const cJSON *m = cJSON_GetArrayItem(list, i);
        const char *role = json_string(m, role_key), *content = json_string(m, content_key);
        if (!role || !content) {
            st = status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: message %d needs string \"%s\" and \"%s\"",
                               path, line, i, role_key, content_key);
            break;
        }
        int r = parse_role(role);
        if (r < 0) {
            st = status_errorf(STATUS_INVALID_ARGUMENT,
                               "%s:%ld: message %d has the unknown role \"%s\" (user/human, assistant/gpt, system)",
                               path, line, i, role);
            break;
        }
        msgs[i].role = (enum chat_role)r;
        msgs[i].content = (char *)content;
    }
    int32_t *ids = NULL;
    uint8_t *loss = NULL;
    int n_ids = 0;
    if (st == STATUS_OK) {
        st = chat_template_render_train(o->chat_template, tok, msgs, n, &ids, &loss, &n_ids);
        if (st != STATUS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", status_message()); /* status_errorf reuses the buffer */
            st = status_errorf(st, "%s:%ld: %s", path, line, why);
        }
    }
    free(msgs);
    if (st == STATUS_OK) *out = (struct train_example){ids, loss, n_ids};
    return st;
}

/* One JSONL line: which format it is, and its example. */
static enum status load_json_line(const char *path, long line, const char *text,
                                  const struct tokenizer *tok, const struct data_options *o,
                                  struct train_dataset *ds)
{
    cJSON *root = cJSON_Parse(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: not a JSON object", path, line);
    }
    struct token_builder b = {0};
    struct train_example e = {0};
    enum status st = STATUS_OK;
    const char *t = json_string(root, "text"), *prompt = json_string(root, "prompt");
    const char *completion = json_string(root, "completion");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    const cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversations");
    if (cJSON_IsArray(msgs)) {
        st = load_chat(msgs, "role", "content", path, line, tok, o, &e);
    } else if (cJSON_IsArray(conv)) {
        st = load_chat(conv, "from", "value", path, line, tok, o, &e);
    } else if (prompt && completion) {
        if ((st = token_builder_id(&b, tokenizer_bos_id(tok), 0)) == STATUS_OK &&
            (st = token_builder_text(&b, tok, prompt, 0)) == STATUS_OK &&
            (st = token_builder_text(&b, tok, completion, 1)) == STATUS_OK)
            st = token_builder_id(&b, tokenizer_eos_id(tok), 1);
        e = builder_take(&b);
    } else if (t) {
        if ((st = token_builder_id(&b, tokenizer_bos_id(tok), 0)) == STATUS_OK &&
            (st = token_builder_text(&b, tok, t, 1)) == STATUS_OK)
            st = token_builder_id(&b, tokenizer_eos_id(tok), 1);
        e = builder_take(&b);
    } else {
        st = status_errorf(STATUS_INVALID_ARGUMENT,
                           "%s:%ld: no known format: expected \"messages\", \"conversations\", "
                           "\"prompt\" + \"completion\" or \"text\"",
                           path, line);
    }
    cJSON_Delete(root);
    token_builder_free(&b);
    if (st != STATUS_OK) {
        example_free(&e);
        return st;
    }
    return add_example(ds, o, e, path, line);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static enum status load_one(const char *path, const struct tokenizer *tok, const struct data_options *o,
                            struct train_dataset *ds)
{
    char *text = NULL;
    size_t len = 0;
    enum status st = base_read_file(path, 0, NULL, &text, &len);
    if (st != STATUS_OK) return st;
    const size_t before = ds->n;
    if (len == 0) st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: the file is empty", path);
    else if (ends_with(path, ".txt")) st = load_text_file(path, text, len, tok, o, ds);
    else {
        long line = 0;
        for (char *p = text; *p && st == STATUS_OK;) {
            char *nl = strchr(p, '\n');
            if (nl) *nl = 0;
            line++;
            ds->n_lines++;
            const char *q = p;
            while (*q == ' ' || *q == '\t' || *q == '\r') q++;
            if (*q) st = load_json_line(path, line, q, tok, o, ds);
            else ds->n_blank++;
            p = nl ? nl + 1 : p + strlen(p);
        }
    }
    free(text);
    if (st == STATUS_OK && ds->n == before)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: no usable example (every line skipped or empty)", path);
    return st;
}

enum status data_load(const char *paths, const struct tokenizer *tok, const struct data_options *o,
                      struct train_dataset *ds)
{
    if (o->seq_length < 2) return status_errorf(STATUS_INVALID_ARGUMENT, "--seq-length must be at least 2");
    char *copy = strdup(paths);
    if (!copy) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory");
    enum status st = STATUS_OK;
    char *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p && st == STATUS_OK; p = strtok_r(NULL, ",", &save))
        if (*p) st = load_one(p, tok, o, ds);
    free(copy);
    return st;
}

/* ---- order and split --------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void data_permutation(uint64_t seed, int64_t epoch, size_t n, size_t *perm)
{
    uint64_t s = seed * 0x2545f4914f6cdd1dULL + (uint64_t)epoch + 1;
    for (size_t i = 0; i < n; i++) perm[i] = i;
    for (size_t i = n; i > 1; i--) { /* Fisher-Yates */
        size_t j = (size_t)(splitmix64(&s) % i);
        size_t t = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = t;
    }
}

enum status data_split(struct train_dataset *ds, int percent, uint64_t seed,
                       struct train_dataset *held_out)
{
    memset(held_out, 0, sizeof *held_out);
    if (percent <= 0 || ds->n < 2) return STATUS_OK;
    size_t k = ds->n * (size_t)percent / 100;
    if (k == 0) k = 1;
    if (k >= ds->n) k = ds->n - 1;
    size_t *perm = malloc(ds->n * sizeof *perm);
    uint8_t *out = calloc(ds->n, 1);
    held_out->ex = malloc(k * sizeof *held_out->ex);
    if (!perm || !out || !held_out->ex) {
        free(perm);
        free(out);
        free(held_out->ex);
        held_out->ex = NULL;
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory");
    }
    data_permutation(seed ^ 0x5eed5eedULL, -1, ds->n, perm);
    for (size_t i = ds->n - k; i < ds->n; i++) out[perm[i]] = 1;
    size_t kept = 0;
    for (size_t i = 0; i < ds->n; i++) {
        struct train_example e = ds->ex[i];
        int targets = 0;
        for (int j = 1; j < e.n; j++) targets += e.loss[j];
        if (out[i]) {
            held_out->ex[held_out->n++] = e;
            held_out->n_tokens += e.n;
            held_out->n_target_tokens += targets;
            ds->n_tokens -= e.n;
            ds->n_target_tokens -= targets;
        } else {
            ds->ex[kept++] = e;
        }
    }
    ds->n = kept;
    held_out->cap = k;
    free(perm);
    free(out);
    return STATUS_OK;
}

/* ---- micro-batches ----------------------------------------------------------------------- */

enum status micro_batch_init(struct micro_batch *mb, int micro_batch_size, int seq_length)
{
    memset(mb, 0, sizeof *mb);
    mb->capacity = micro_batch_size * seq_length;
    const size_t n = (size_t)mb->capacity;
    mb->tokens = malloc(n * sizeof *mb->tokens);
    mb->targets = malloc(n * sizeof *mb->targets);
    mb->positions = malloc(n * sizeof *mb->positions);
    mb->doc_start = malloc((n + 1) * sizeof *mb->doc_start);
    if (!mb->tokens || !mb->targets || !mb->positions || !mb->doc_start) {
        micro_batch_free(mb);
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory");
    }
    return STATUS_OK;
}

void micro_batch_free(struct micro_batch *mb)
{
    free(mb->tokens);
    free(mb->targets);
    free(mb->positions);
    free(mb->doc_start);
    memset(mb, 0, sizeof *mb);
}

/* Appends example e as one document. */
static void append_doc(struct micro_batch *mb, const struct train_example *e)
{
    const int base = mb->n_tokens;
    mb->doc_start[mb->n_docs] = base;
    for (int i = 0; i < e->n; i++) {
        mb->tokens[base + i] = e->ids[i];
        mb->positions[base + i] = i;
        const int has_next = i + 1 < e->n && e->loss[i + 1];
        mb->targets[base + i] = has_next ? e->ids[i + 1] : -1;
        mb->n_targets += has_next;
    }
    mb->n_tokens += e->n;
    mb->n_docs++;
    mb->doc_start[mb->n_docs] = mb->n_tokens;
}

/* ds's order for (seed, epoch), from the cache when it holds it. */
static const size_t *order_of(struct train_dataset *ds, uint64_t seed, int64_t epoch)
{
    if (ds->order && ds->order_n == ds->n && ds->order_seed == seed && ds->order_epoch == epoch) return ds->order;
    if (ds->order_n != ds->n) {
        free(ds->order);
        ds->order = malloc(ds->n * sizeof *ds->order);
        CHECK(ds->order, "data: out of memory for the order of %zu examples", ds->n);
        ds->order_n = ds->n;
    }
    data_permutation(seed, epoch, ds->n, ds->order);
    ds->order_seed = seed;
    ds->order_epoch = epoch;
    return ds->order;
}

void data_next_micro_batch(struct train_dataset *ds, struct data_cursor *cur,
                           int micro_batch_size, int seq_length, struct micro_batch *mb)
{
    CHECK(ds->n > 0, "an empty dataset");
    mb->n_tokens = mb->n_docs = mb->n_targets = 0;
    mb->doc_start[0] = 0;
    const size_t *perm = order_of(ds, cur->seed, cur->epoch);
    for (int seq = 0; seq < micro_batch_size; seq++) {
        int used = 0;
        for (;;) {
            if ((size_t)cur->index >= ds->n) {
                cur->epoch++;
                cur->index = 0;
                perm = order_of(ds, cur->seed, cur->epoch);
            }
            const struct train_example *e = &ds->ex[perm[cur->index]];
            if (used > 0 && used + e->n > seq_length) break; /* the next sequence takes it */
            append_doc(mb, e);
            used += e->n;
            cur->index++;
            if (used >= seq_length) break;
        }
    }
}
