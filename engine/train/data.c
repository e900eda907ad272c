/* engine/train/data.c - training files (streamed) to tokens held back to back, the shuffled order, packed
 * micro-batches (data.h). Tests: tests/test_train_data.c. */
#include "data.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/types.h>

#include "jinja.h"
#include "tokenizer.h"

/* ---- examples ----------------------------------------------------------------------------
 * An example is built in place at the end of ds->tokens (from start[n] on: the "open" example)
 * and then closed (example_close: the overflow policy, counted) or dropped. */

void data_free(struct train_dataset *ds)
{
    free(ds->tokens);
    free(ds->start);
    free(ds->order);
    memset(ds, 0, sizeof *ds);
}

static enum status oom(void) { return status_errorf(STATUS_RESOURCE_EXHAUSTED, "data: out of memory"); }

/* Makes room for an open example and `more` tokens. */
static enum status reserve(struct train_dataset *ds, size_t more)
{
    if (base_grow((void **)&ds->start, &ds->cap, ds->n + 2, sizeof *ds->start)) return oom();
    if (ds->n == 0) ds->start[0] = 0;
    if (base_grow((void **)&ds->tokens, &ds->tok_cap, (size_t)ds->start[ds->n] + more + 1, sizeof *ds->tokens))
        return oom();
    return STATUS_OK;
}

/* The open example: ds->tokens[start[n] .. start[n] + *open_len) (open_len lives with the caller). */
static enum status push_ids(struct train_dataset *ds, int64_t *open_len, const int32_t *ids, int n, int loss)
{
    enum status st = reserve(ds, (size_t)(*open_len + n));
    if (st != STATUS_OK) return st;
    uint32_t *t = ds->tokens + ds->start[ds->n] + *open_len;
    for (int i = 0; i < n; i++) t[i] = (uint32_t)ids[i] | (loss ? DATA_LOSS_FLAG : 0u);
    *open_len += n;
    return STATUS_OK;
}

static enum status push_id(struct train_dataset *ds, int64_t *open_len, int32_t id, int loss)
{
    return id >= 0 ? push_ids(ds, open_len, &id, 1, loss) : STATUS_OK; /* a tokenizer without BOS / EOS */
}

/* Closes the open example of len tokens after applying the overflow policy: kept (possibly
 * truncated to seq_length), or dropped and counted. */
static enum status example_close(struct train_dataset *ds, const struct data_options *o, int64_t len,
                                 const char *path, long line)
{
    if (len > o->seq_length) {
        if (o->overflow == DATA_OVERFLOW_ERROR)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "%s:%ld: the example has more than --seq-length %d tokens "
                                 "(--data-overflow truncate|skip to accept such lines)",
                                 path, line, o->seq_length);
        if (o->overflow == DATA_OVERFLOW_SKIP) {
            ds->n_skipped++;
            return STATUS_OK;
        }
        len = o->seq_length;
        ds->n_truncated++;
    }
    uint32_t *t = ds->tokens + ds->start[ds->n];
    int64_t targets = 0;
    if (len > 0) t[0] &= ~DATA_LOSS_FLAG; /* len is 0 for an empty text with a tokenizer without BOS and EOS */
    for (int64_t i = 1; i < len; i++) targets += t[i] >> 31;
    if (targets == 0) { /* nothing to learn from (e.g. a completion cut off by truncation) */
        ds->n_no_target++;
        return STATUS_OK;
    }
    if (base_grow((void **)&ds->start, &ds->cap, ds->n + 2, sizeof *ds->start)) return oom();
    ds->start[ds->n + 1] = ds->start[ds->n] + len;
    ds->n++;
    ds->n_tokens += len;
    ds->n_target_tokens += targets;
    return STATUS_OK;
}

enum status data_append(struct train_dataset *ds, const int32_t *ids, const uint8_t *loss, int n)
{
    int64_t len = 0;
    enum status st = STATUS_OK;
    for (int i = 0; i < n && st == STATUS_OK; i++) st = push_ids(ds, &len, &ids[i], 1, loss[i]);
    if (st != STATUS_OK) return st;
    if (len > 0) ds->tokens[ds->start[ds->n]] &= ~DATA_LOSS_FLAG;
    int64_t targets = 0;
    for (int64_t i = 1; i < len; i++) targets += ds->tokens[ds->start[ds->n] + i] >> 31;
    if ((st = reserve(ds, (size_t)len)) != STATUS_OK) return st;
    ds->start[ds->n + 1] = ds->start[ds->n] + len;
    ds->n++;
    ds->n_tokens += len;
    ds->n_target_tokens += targets;
    return STATUS_OK;
}

/* ---- bounded tokenization ----------------------------------------------------------------
 * A text longer than the example can hold is tokenized only as far as needed: a prefix of its
 * bytes, cut before a space (SentencePiece splits pieces at whitespace, so the tokens before
 * the cut are those of the whole text) and grown until it gives the ids wanted plus a margin
 * (for tokenizers that merge across a space), or the whole text. */

#define PREFIX_MARGIN 16 /* ids beyond those kept, so that the cut cannot change a kept one */

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* A cut of text[0..len) at or below `at` (0 < at < len): before a space that follows a
 * non-space, or else at a UTF-8 character boundary; 0 when none lies in (at / 2, at]. */
static size_t cut_before_space(const char *text, size_t len, size_t at)
{
    if (at >= len) return len;
    for (size_t i = at; i > at / 2; i--)
        if (text[i] == ' ' && !is_space(text[i - 1])) return i;
    for (size_t i = at; i > at / 2; i--)
        if (((unsigned char)text[i] & 0xc0) != 0x80) return i;
    return 0;
}

/* The shortest prefix text[0..cut) of the ones tried (cut before a space, the byte budget
 * doubled each time) whose ids number at least `want` + PREFIX_MARGIN, or the whole text
 * (cut = len). Its ids, when ids is not NULL, go to *ids (malloc'd) and *n. */
static enum status bounded_prefix(struct train_dataset *ds, const struct tokenizer *tok, const char *text,
                                  size_t len, int64_t want, size_t *cut_out, int32_t **ids, int *n)
{
    size_t budget = 16 * (size_t)(want + PREFIX_MARGIN);
    for (;;) {
        size_t cut = budget < len ? cut_before_space(text, len, budget) : len;
        if (cut == 0) cut = len;
        int32_t *got = NULL;
        int n_got = 0;
        enum status st = tokenizer_encode(tok, text, cut, 0, &got, &n_got);
        if (st != STATUS_OK) return st;
        ds->n_tokenized += n_got;
        if (cut == len || n_got >= want + PREFIX_MARGIN) {
            *cut_out = cut;
            if (ids) *ids = got, *n = n_got;
            else free(got);
            return STATUS_OK;
        }
        free(got);
        budget *= 2;
    }
}

/* Appends the ids of text[0..len) to the open example, each with `loss`, stopping once the
 * example holds `limit` ids (what is past them would be truncated or skipped anyway). */
static enum status push_text(struct train_dataset *ds, int64_t *open_len, const struct tokenizer *tok,
                             const char *text, size_t len, int loss, int64_t limit)
{
    const int64_t room = limit - *open_len;
    if (room <= 0 || len == 0) return STATUS_OK;
    int32_t *ids = NULL;
    int n = 0;
    size_t cut = 0;
    enum status st = bounded_prefix(ds, tok, text, len, room, &cut, &ids, &n);
    if (st == STATUS_OK) st = push_ids(ds, open_len, ids, n < room ? n : (int)room, loss);
    free(ids);
    return st;
}

/* ---- checks on the text itself ----------------------------------------------------------- */

/* STATUS_OK when text[0..len) holds no NUL byte and is valid UTF-8; else the error names the
 * file and the line (first_line: the line of text[0]). */
static enum status check_text(const char *text, size_t len, const char *path, long first_line, const char *what)
{
    const char *nul = memchr(text, 0, len);
    const size_t bad = base_utf8_valid_prefix(text, nul ? (size_t)(nul - text) : len);
    const size_t at = nul && (size_t)(nul - text) <= bad ? (size_t)(nul - text) : bad;
    if (at == len) return STATUS_OK;
    long line = first_line;
    for (const char *p = text; (p = memchr(p, '\n', (size_t)(text + at - p))); p++) line++;
    return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: %s %s (byte 0x%02x); training text must be UTF-8 "
                         "without NUL, as serving requires", path, line, what,
                         text[at] == 0 ? "holds a NUL byte" : "is not valid UTF-8", (unsigned char)text[at]);
}

/* 1 when the JSON text holds the escape \u0000 inside a string (cJSON would cut the string
 * there silently). */
static int json_has_nul_escape(const char *s, size_t len)
{
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        if (!in_string) {
            in_string = s[i] == '"';
        } else if (s[i] == '"') {
            in_string = 0;
        } else if (s[i] == '\\' && i + 1 < len) {
            if (s[i + 1] == 'u' && i + 5 < len && !memcmp(s + i + 2, "0000", 4)) return 1;
            i++;
        }
    }
    return 0;
}

/* ---- formats ----------------------------------------------------------------------------- */

/* Plain text: the whole file's tokens (BOS first), cut into examples of seq_length, read and
 * tokenized a chunk at a time. A chunk after the first starts at a space, which the tokenizer
 * either adds itself (SentencePiece's dummy prefix: the space is dropped from the chunk) or
 * reads as the piece's start (kept); which one gives the whole text's tokens is found once on
 * the file's start. If neither does, the file is tokenized whole (and said so). */
#define TEXT_CHUNK (64u << 10)

enum chunk_join { CHUNK_JOIN_DROP_SPACE, CHUNK_JOIN_KEEP_SPACE, CHUNK_JOIN_NONE };

static int same_ids(const int32_t *a, int na, const int32_t *b, int nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, (size_t)na * sizeof *a));
}

/* Which chunk join reproduces the tokens of text[0..len) (the file's first bytes, len > 4 KiB). */
static enum chunk_join probe_join(const struct tokenizer *tok, const char *text, size_t len)
{
    const size_t c = cut_before_space(text, len, 2048), e = cut_before_space(text, len, 4096);
    if (c == 0 || e <= c + 1) return CHUNK_JOIN_NONE;
    int32_t *whole = NULL, *left = NULL, *right = NULL;
    int nw = 0, nl = 0, nr = 0;
    enum chunk_join join = CHUNK_JOIN_NONE;
    if (tokenizer_encode(tok, text, e, 0, &whole, &nw) == STATUS_OK &&
        tokenizer_encode(tok, text, c, 0, &left, &nl) == STATUS_OK && nl <= nw && same_ids(whole, nl, left, nl)) {
        for (int k = CHUNK_JOIN_DROP_SPACE; k <= CHUNK_JOIN_KEEP_SPACE && join == CHUNK_JOIN_NONE; k++) {
            const size_t from = c + (k == CHUNK_JOIN_DROP_SPACE);
            free(right);
            right = NULL;
            if (tokenizer_encode(tok, text + from, e - from, 0, &right, &nr) == STATUS_OK &&
                same_ids(whole + nl, nw - nl, right, nr))
                join = (enum chunk_join)k;
        }
    }
    free(whole);
    free(left);
    free(right);
    return join;
}

/* Closes full examples of the open run of .txt tokens (*open_len of them). */
static enum status text_close_full(struct train_dataset *ds, const struct data_options *o, int64_t *open_len,
                                   const char *path)
{
    enum status st = STATUS_OK;
    while (st == STATUS_OK && *open_len >= o->seq_length) {
        st = example_close(ds, o, o->seq_length, path, 1);
        /* the tokens after the closed example move to the front of the next open one */
        const int64_t rest = *open_len - o->seq_length;
        if (st == STATUS_OK && ds->n && ds->start[ds->n] != ds->start[ds->n - 1] + o->seq_length)
            st = status_errorf(STATUS_INTERNAL, "data: example bookkeeping");
        *open_len = rest;
    }
    return st;
}

static enum status load_text_file(const char *path, FILE *f, const struct tokenizer *tok,
                                  const struct data_options *o, struct train_dataset *ds)
{
    char *buf = NULL;
    size_t cap = 0, have = 0;
    int eof = 0, first = 1;
    long line = 1;
    int64_t open_len = 0;
    enum chunk_join join = CHUNK_JOIN_NONE;
    enum status st = reserve(ds, 0);
    if (st == STATUS_OK) st = push_id(ds, &open_len, tokenizer_bos_id(tok), 1);
    while (st == STATUS_OK) {
        /* Fill the buffer to two chunks (or the end of the file). */
        size_t want = have + 2 * TEXT_CHUNK;
        if (!eof && base_grow((void **)&buf, &cap, want + 1, 1)) st = oom();
        while (st == STATUS_OK && !eof && have < want) {
            const size_t got = fread(buf + have, 1, want - have, f);
            have += got;
            if (got == 0) {
                if (ferror(f)) st = status_errorf(STATUS_IO, "%s: read error", path);
                eof = 1;
            }
        }
        if (st != STATUS_OK) break;
        if (have == 0) break;
        if (first && !eof) join = probe_join(tok, buf, have);
        if (first && !eof && join == CHUNK_JOIN_NONE) { /* tokenize the file whole: read it all */
            LOG_WARN("train", "%s: the tokenizer's pieces cross spaces; the file is tokenized whole (memory: about 100 "
                     "bytes per byte of text)", path);
            while (st == STATUS_OK && !eof) {
                if (base_grow((void **)&buf, &cap, have + TEXT_CHUNK + 1, 1)) st = oom();
                else {
                    const size_t got = fread(buf + have, 1, cap - have - 1, f);
                    have += got;
                    if (got == 0) eof = 1;
                }
            }
            if (st != STATUS_OK) break;
        }
        size_t cut = eof ? have : cut_before_space(buf, have, have - TEXT_CHUNK / 2);
        if (cut == 0) cut = have - TEXT_CHUNK / 2; /* no boundary at all: a UTF-8 check below refuses it */
        if ((st = check_text(buf, cut, path, line, "the text")) != STATUS_OK) break;
        for (const char *p = buf; (p = memchr(p, '\n', (size_t)(buf + cut - p))); p++) line++;
        const size_t skip = !first && join == CHUNK_JOIN_DROP_SPACE && buf[0] == ' ';
        int32_t *ids = NULL;
        int n = 0;
        if ((st = tokenizer_encode(tok, buf + skip, cut - skip, 0, &ids, &n)) != STATUS_OK) break;
        ds->n_tokenized += n;
        st = push_ids(ds, &open_len, ids, n, 1);
        free(ids);
        if (st == STATUS_OK) st = text_close_full(ds, o, &open_len, path);
        memmove(buf, buf + cut, have - cut);
        have -= cut;
        first = 0;
        if (eof && have == 0) break;
    }
    if (st == STATUS_OK && open_len >= 2) st = example_close(ds, o, open_len, path, 1); /* the last, shorter one */
    free(buf);
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

static enum status load_chat(cJSON *list, const char *role_key, const char *content_key,
                             const char *path, long line, const struct tokenizer *tok,
                             const struct data_options *o, struct train_dataset *ds, int64_t *open_len)
{
    const int n = cJSON_GetArraySize(list);
    if (n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: an empty conversation", path, line);
    struct chat_message *msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs) return oom();
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
    /* A content that alone gives more ids than the example holds is cut (before a space, in
     * cJSON's own copy) and the later contents emptied: the rendering's first seq_length + 1
     * ids are the same, and the roles are still checked whole. */
    static char empty[1];
    for (int i = 0, cut_at = -1; i < n && st == STATUS_OK; i++) {
        if (cut_at >= 0) {
            msgs[i].content = empty;
            continue;
        }
        const size_t len = strlen(msgs[i].content);
        if (len <= 16 * (size_t)(o->seq_length + 1 + PREFIX_MARGIN)) continue;
        size_t cut = len;
        st = bounded_prefix(ds, tok, msgs[i].content, len, o->seq_length + 1, &cut, NULL, NULL);
        if (st == STATUS_OK && cut < len) {
            msgs[i].content[cut] = 0;
            cut_at = i;
        }
    }
    int32_t *ids = NULL;
    uint8_t *loss = NULL;
    int n_ids = 0;
    if (st == STATUS_OK) {
        st = o->jinja ? jinja_render_train(o->jinja, tok, o->bos_text, o->eos_text, msgs, n, &ids, &loss, &n_ids)
                      : chat_template_render_train(o->chat_template, tok, msgs, n, &ids, &loss, &n_ids);
        if (st != STATUS_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", status_message()); /* status_errorf reuses the buffer */
            st = status_errorf(st, "%s:%ld: %s", path, line, why);
        }
    }
    free(msgs);
    if (st == STATUS_OK) {
        ds->n_tokenized += n_ids;
        const int keep = n_ids > o->seq_length + 1 ? o->seq_length + 1 : n_ids; /* enough to see the overflow */
        for (int i = 0; i < keep && st == STATUS_OK; i++) st = push_ids(ds, open_len, &ids[i], 1, loss[i]);
    }
    free(ids);
    free(loss);
    return st;
}

/* One JSONL line (text[0..len), NUL-terminated): which format it is, and its example. */
static enum status load_json_line(const char *path, long line, const char *text, size_t len,
                                  const struct tokenizer *tok, const struct data_options *o,
                                  struct train_dataset *ds)
{
    enum status st = check_text(text, len, path, line, "the line");
    if (st != STATUS_OK) return st;
    if (json_has_nul_escape(text, len))
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: a string holds \\u0000 (NUL); training text must be "
                             "UTF-8 without NUL, as serving requires", path, line);
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: not a JSON object", path, line);
    }
    /* Enough ids to tell an example over seq_length from one that fits. */
    const int64_t limit = (int64_t)o->seq_length + 1;
    int64_t open_len = 0;
    const char *t = json_string(root, "text"), *prompt = json_string(root, "prompt");
    const char *completion = json_string(root, "completion");
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    cJSON *conv = cJSON_GetObjectItemCaseSensitive(root, "conversations");
    if ((st = reserve(ds, 0)) != STATUS_OK) {
    } else if (cJSON_IsArray(msgs)) {
        st = load_chat(msgs, "role", "content", path, line, tok, o, ds, &open_len);
    } else if (cJSON_IsArray(conv)) {
        st = load_chat(conv, "from", "value", path, line, tok, o, ds, &open_len);
    } else if (prompt && completion) {
        if (!*prompt || !*completion)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: an empty \"%s\"", path, line,
                               *prompt ? "completion" : "prompt");
        else if ((st = push_id(ds, &open_len, tokenizer_bos_id(tok), 0)) == STATUS_OK &&
                 (st = push_text(ds, &open_len, tok, prompt, strlen(prompt), 0, limit)) == STATUS_OK &&
                 (st = push_text(ds, &open_len, tok, completion, strlen(completion), 1, limit)) == STATUS_OK &&
                 open_len < limit)
            st = push_id(ds, &open_len, tokenizer_eos_id(tok), 1);
    } else if (t) {
        if (!*t)
            st = status_errorf(STATUS_INVALID_ARGUMENT, "%s:%ld: an empty \"text\"", path, line);
        else if ((st = push_id(ds, &open_len, tokenizer_bos_id(tok), 0)) == STATUS_OK &&
                 (st = push_text(ds, &open_len, tok, t, strlen(t), 1, limit)) == STATUS_OK && open_len < limit)
            st = push_id(ds, &open_len, tokenizer_eos_id(tok), 1);
    } else {
        st = status_errorf(STATUS_INVALID_ARGUMENT,
                           "%s:%ld: no known format: expected \"messages\", \"conversations\", "
                           "\"prompt\" + \"completion\" or \"text\"",
                           path, line);
    }
    cJSON_Delete(root);
    if (st != STATUS_OK) return st;
    return example_close(ds, o, open_len, path, line);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static enum status load_one(const char *path, const struct tokenizer *tok, const struct data_options *o,
                            struct train_dataset *ds)
{
    int fd;
    enum status opened = base_open_file(path, &fd, NULL); /* regular files only: a FIFO never blocks */
    if (opened != STATUS_OK) return opened;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        close(fd);
        return status_errorf(STATUS_IO, "%s: %s", path, strerror(errno));
    }
    const size_t before = ds->n;
    enum status st = STATUS_OK;
    const int c = fgetc(f);
    if (c == EOF) st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: the file is empty", path);
    else ungetc(c, f);
    if (st == STATUS_OK && ends_with(path, ".txt")) {
        st = load_text_file(path, f, tok, o, ds);
    } else if (st == STATUS_OK) {
        char *buf = NULL;
        size_t cap = 0;
        ssize_t got;
        long line = 0;
        while (st == STATUS_OK && (got = getline(&buf, &cap, f)) >= 0) {
            size_t len = (size_t)got;
            if (len && buf[len - 1] == '\n') buf[--len] = 0;
            line++;
            ds->n_lines++;
            const char *q = buf;
            while (q < buf + len && (*q == ' ' || *q == '\t' || *q == '\r')) q++;
            if (q < buf + len) st = load_json_line(path, line, q, len - (size_t)(q - buf), tok, o, ds);
            else ds->n_blank++;
        }
        if (st == STATUS_OK && ferror(f)) st = status_errorf(STATUS_IO, "%s: read error", path);
        free(buf);
    }
    fclose(f);
    if (st == STATUS_OK && ds->n == before)
        st = status_errorf(STATUS_INVALID_ARGUMENT, "%s: no usable example (every line skipped or empty)", path);
    return st;
}

enum status data_load(const char *paths, const struct tokenizer *tok, const struct data_options *o,
                      struct train_dataset *ds)
{
    if (o->seq_length < 2) return status_errorf(STATUS_INVALID_ARGUMENT, "--seq-length must be at least 2");
    char *copy = strdup(paths);
    if (!copy) return oom();
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
    if (!perm || !out) {
        free(perm);
        free(out);
        return oom();
    }
    data_permutation(seed ^ 0x5eed5eedULL, -1, ds->n, perm);
    for (size_t i = ds->n - k; i < ds->n; i++) out[perm[i]] = 1;
    free(perm);
    /* The held-out examples are copied out; the kept ones move down in place, in order (the
     * write position never passes the read position), so no second copy of the data exists. */
    enum status st = STATUS_OK;
    for (size_t i = 0; i < ds->n && st == STATUS_OK; i++)
        if (out[i]) {
            const int len = data_example_len(ds, i);
            int64_t open = 0;
            if ((st = reserve(held_out, (size_t)len)) != STATUS_OK) break;
            memcpy(held_out->tokens + held_out->start[held_out->n], data_example_tokens(ds, i), (size_t)len * 4);
            open = len;
            int64_t targets = 0;
            for (int j = 1; j < len; j++) targets += data_example_tokens(ds, i)[j] >> 31;
            held_out->start[held_out->n + 1] = held_out->start[held_out->n] + open;
            held_out->n++;
            held_out->n_tokens += len;
            held_out->n_target_tokens += targets;
            ds->n_tokens -= len;
            ds->n_target_tokens -= targets;
        }
    if (st != STATUS_OK) {
        free(out);
        data_free(held_out);
        return st;
    }
    size_t kept = 0;
    int64_t w = 0;
    for (size_t i = 0; i < ds->n; i++) {
        const int64_t a = ds->start[i], len = ds->start[i + 1] - a;
        if (out[i]) continue;
        memmove(ds->tokens + w, ds->tokens + a, (size_t)len * sizeof *ds->tokens);
        ds->start[kept] = w;
        w += len;
        ds->start[++kept] = w;
    }
    ds->n = kept;
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
    mb->doc_example = malloc(n * sizeof *mb->doc_example);
    if (!mb->tokens || !mb->targets || !mb->positions || !mb->doc_start || !mb->doc_example) {
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
    free(mb->doc_example);
    memset(mb, 0, sizeof *mb);
}

/* Appends example i of ds as one document. */
static void append_doc(struct micro_batch *mb, const struct train_dataset *ds, size_t i)
{
    const int base = mb->n_tokens, n = data_example_len(ds, i);
    const uint32_t *t = data_example_tokens(ds, i);
    mb->doc_start[mb->n_docs] = base;
    mb->doc_example[mb->n_docs] = (int64_t)i;
    for (int j = 0; j < n; j++) {
        mb->tokens[base + j] = data_token_id(t[j]);
        mb->positions[base + j] = j;
        const int has_next = j + 1 < n && data_token_loss(t[j + 1]);
        mb->targets[base + j] = has_next ? data_token_id(t[j + 1]) : -1;
        mb->n_targets += has_next;
    }
    mb->n_tokens += n;
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
            const size_t e = perm[cur->index];
            const int n = data_example_len(ds, e);
            if (used > 0 && used + n > seq_length) break; /* the next sequence takes it */
            append_doc(mb, ds, e);
            used += n;
            cur->index++;
            if (used >= seq_length) break;
        }
    }
}

enum status data_target_texts(const struct train_dataset *ds, int32_t **ids, int64_t *n, int64_t *texts)
{
    *n = 0, *texts = 0;
    *ids = malloc((size_t)(2 * (ds->n ? ds->start[ds->n] : 0) + 1) * sizeof **ids);
    if (!*ids) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of host memory for the texts of %zu examples", ds->n);
    for (size_t i = 0; i < ds->n; i++) {
        const uint32_t *t = data_example_tokens(ds, i);
        const int len = data_example_len(ds, i);
        for (int j = 0; j < len; j++) {
            if (!data_token_loss(t[j])) continue;
            (*ids)[(*n)++] = data_token_id(t[j]);
            if (j + 1 == len || !data_token_loss(t[j + 1])) (*ids)[(*n)++] = -1, (*texts)++; /* the run's end */
        }
    }
    return STATUS_OK;
}
