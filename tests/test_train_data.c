/* tests/test_train_data.c - training data without a model (engine/train/data.c,
 * engine/text/chat_train.c) and the learning-rate schedule (optimizer_lr): loss masks of each
 * format (the loss falls exactly on the completion / the assistant's words and the end of its
 * turn), packing (documents never cross, positions restart, the last token of a document and
 * masked tokens have no target, capacity respected), the seeded order, the held-out split and
 * the schedule's values; streaming (a .txt corpus loads with a bounded peak RSS and the tokens
 * of the whole file; a 5.5 MB line under --seq-length 64 tokenizes a bounded prefix) and bad
 * text refused with file and line (NUL, \u0000, invalid UTF-8, empty text / prompt / completion).
 * Needs the stories260K tokenizer of the shared assets (SKIP without).
 * Run: test_train_data. Prints PASS/FAIL lines and "N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "data.h"
#include "loss_scaler.h"
#include "optimizer.h"
#include "tokenizer.h"

static struct tokenizer *tok;

/* The text of the tokens of example i whose loss flag equals `loss`, concatenated. */
static char *masked_text(const struct train_dataset *ds, size_t i, int loss)
{
    const int len = data_example_len(ds, i);
    int32_t *ids = malloc((size_t)len * sizeof *ids);
    int n = 0;
    for (int j = 0; j < len; j++)
        if (data_token_loss(data_example_tokens(ds, i)[j]) == loss) ids[n++] = data_token_id(data_example_tokens(ds, i)[j]);
    char *text = NULL;
    size_t tl = 0;
    CHECK(tokenizer_decode(tok, ids, n, &text, &tl) == STATUS_OK, "decode");
    free(ids);
    return text;
}

/* Token j of example i: its id, and its loss flag. */
static int32_t id_at(const struct train_dataset *ds, size_t i, int j) { return data_token_id(data_example_tokens(ds, i)[j]); }
static int loss_at(const struct train_dataset *ds, size_t i, int j) { return data_token_loss(data_example_tokens(ds, i)[j]); }

static char *write_tmp(const char *name, const char *content)
{
    static char path[256];
    snprintf(path, sizeof path, "/tmp/shardlm_test_train_data_%d_%s", (int)getpid(), name);
    FILE *f = fopen(path, "w");
    CHECK(f, "cannot write %s", path);
    fputs(content, f);
    fclose(f);
    return path;
}

static void test_formats(void)
{
    const char *jsonl =
        "{\"prompt\": \"Once upon a time\", \"completion\": \" there was a dog.\"}\n"
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Who?\"}, {\"role\": \"assistant\", \"content\": \"Lily.\"},"
        " {\"role\": \"user\", \"content\": \"Where?\"}, {\"role\": \"assistant\", \"content\": \"The park.\"}]}\n"
        "{\"text\": \"The end.\"}\n";
    char *path = write_tmp("formats.jsonl", jsonl);
    struct data_options o = {.seq_length = 256, .overflow = DATA_OVERFLOW_ERROR, .chat_template = CHAT_TEMPLATE_PLAIN};
    struct train_dataset ds = {0};
    enum status st = data_load(path, tok, &o, &ds);
    check(st == STATUS_OK && ds.n == 3, "three formats load (%s)", st == STATUS_OK ? "ok" : status_message());
    if (st == STATUS_OK && ds.n == 3) {
        char *c = masked_text(&ds, 0, 1);
        check(!strcmp(c, "there was a dog.") || !strcmp(c, " there was a dog."),
              "prompt/completion: the loss is on the completion only ('%s')", c);
        const int n0 = data_example_len(&ds, 0);
        check(id_at(&ds, 0, 0) == tokenizer_bos_id(tok) && id_at(&ds, 0, n0 - 1) == tokenizer_eos_id(tok) &&
                  loss_at(&ds, 0, n0 - 1) == 1,
              "prompt/completion: BOS first, EOS last and learned");
        free(c);
        c = masked_text(&ds, 1, 1);
        check(strstr(c, "Lily.") && strstr(c, "The park.") && !strstr(c, "Who") && !strstr(c, "Where") &&
                  !strstr(c, "User"),
              "chat: the loss is on both assistant turns and nothing the user said ('%s')", c);
        free(c);
        c = masked_text(&ds, 1, 0);
        check(strstr(c, "User: Who?") && strstr(c, "Assistant:"), "chat: the plain template's turns ('%s')", c);
        free(c);
        int all = 1;
        for (int i = 1; i < data_example_len(&ds, 2); i++) all &= loss_at(&ds, 2, i);
        check(all && loss_at(&ds, 2, 0) == 0, "text: every token but the first is a target");
    }
    data_free(&ds);
    struct chat_message m[2] = {{CHAT_ROLE_USER, "hi"}, {CHAT_ROLE_ASSISTANT, "yo"}};
    int32_t *ids = NULL;
    uint8_t *loss = NULL;
    int n = 0;
    st = chat_template_render_train(CHAT_TEMPLATE_GEMMA, tok, m, 2, &ids, &loss, &n);
    check(st == STATUS_UNSUPPORTED, "chat: the gemma template refuses a vocabulary without its pieces");
    st = chat_template_render_train(CHAT_TEMPLATE_LLAMA2, tok, m, 2, &ids, &loss, &n);
    check(st == STATUS_OK && n > 2 && loss[n - 1] == 1 && ids[n - 1] == tokenizer_eos_id(tok) && loss[0] == 0,
          "chat: llama2 ends the answer with a learned EOS");
    free(ids);
    free(loss);
    struct chat_message bad[2] = {{CHAT_ROLE_ASSISTANT, "yo"}, {CHAT_ROLE_USER, "hi"}};
    st = chat_template_render_train(CHAT_TEMPLATE_LLAMA2, tok, bad, 2, &ids, &loss, &n);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "messages[0].role"),
          "chat: llama2 names the message out of turn");
    unlink(path);

    /* Overflow policies. */
    path = write_tmp("long.jsonl", "{\"text\": \"one two three four five six seven eight nine ten eleven\"}\n"
                                   "{\"text\": \"short\"}\n");
    o.seq_length = 6;
    o.overflow = DATA_OVERFLOW_SKIP;
    st = data_load(path, tok, &o, &ds);
    check(st == STATUS_OK && ds.n == 1 && ds.n_skipped == 1, "overflow skip: the long line is left out and counted");
    data_free(&ds);
    o.overflow = DATA_OVERFLOW_TRUNCATE;
    st = data_load(path, tok, &o, &ds);
    check(st == STATUS_OK && ds.n == 2 && ds.n_truncated == 1 && data_example_len(&ds, 0) == 6,
          "overflow truncate: cut to --seq-length and counted");
    data_free(&ds);
    o.overflow = DATA_OVERFLOW_ERROR;
    st = data_load(path, tok, &o, &ds);
    check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), "long.jsonl:1:"), "overflow error: file and line");
    data_free(&ds);
    unlink(path);
}

static void test_packing(void)
{
    struct train_dataset ds = {0};
    const int lens[] = {5, 3, 7, 2, 6};
    for (int k = 0; k < 5; k++) {
        int32_t ids[8];
        uint8_t loss[8];
        for (int i = 0; i < lens[k] && i < 8; i++) {
            ids[i] = 100 * (k + 1) + i;
            loss[i] = i > 0 && !(k == 2 && i == 3); /* one masked target in example 2 */
        }
        CHECK(data_append(&ds, ids, loss, lens[k]) == STATUS_OK, "oom");
    }
    struct micro_batch mb;
    CHECK(micro_batch_init(&mb, 2, 8) == STATUS_OK, "oom");
    struct data_cursor cur = {.seed = 3};
    int seen[5] = {0}, ok = 1, total_docs = 0;
    for (int it = 0; it < 4; it++) {
        data_next_micro_batch(&ds, &cur, 2, 8, &mb);
        ok &= mb.n_tokens <= 16 && mb.doc_start[0] == 0 && mb.doc_start[mb.n_docs] == mb.n_tokens;
        int targets = 0;
        for (int d = 0; d < mb.n_docs; d++) {
            const int a = mb.doc_start[d], b = mb.doc_start[d + 1], k = mb.tokens[a] / 100 - 1;
            if (cur.epoch == 0 || it == 0) seen[k]++;
            for (int i = a; i < b; i++) {
                ok &= mb.positions[i] == i - a && mb.tokens[i] == 100 * (k + 1) + (i - a);
                const int want = i + 1 < b && loss_at(&ds, (size_t)k, i - a + 1) ? mb.tokens[i + 1] : -1;
                ok &= mb.targets[i] == want;
                targets += want >= 0;
            }
        }
        ok &= targets == mb.n_targets;
        total_docs += mb.n_docs;
    }
    check(ok, "packing: documents intact, positions restart, targets within documents and masks");
    check(total_docs >= 5, "packing: whole epochs of every example (%d documents in 4 micro-batches)", total_docs);
    size_t p1[5], p2[5], p3[5];
    data_permutation(9, 0, 5, p1);
    data_permutation(9, 0, 5, p2);
    data_permutation(9, 1, 5, p3);
    int is_perm = 1, same = !memcmp(p1, p2, sizeof p1), differs = memcmp(p1, p3, sizeof p1) != 0;
    for (size_t i = 0, mask = 0; i < 5; i++) {
        is_perm &= p1[i] < 5 && !(mask & (1u << p1[i]));
        mask |= 1u << p1[i];
    }
    check(is_perm && same && differs, "order: a permutation, the same for a seed, new each epoch");
    micro_batch_free(&mb);

    struct train_dataset held;
    enum status st = data_split(&ds, 40, 1, &held);
    check(st == STATUS_OK && held.n == 2 && ds.n == 3, "split: 40%% of 5 examples held out (%zu, %zu)", held.n, ds.n);
    data_free(&held);
    data_free(&ds);
}

static void test_schedule(void)
{
    struct optimizer_options o = {.lr = 1.0, .min_lr = 0.1, .warmup_iters = 10, .decay_iters = 110,
                                  .decay_style = LR_DECAY_COSINE};
    check(fabs(optimizer_lr(&o, 0) - 0.1) < 1e-12 && fabs(optimizer_lr(&o, 9) - 1.0) < 1e-12,
          "schedule: linear warm-up to lr");
    check(fabs(optimizer_lr(&o, 60) - 0.55) < 1e-12, "schedule: cosine halfway is (lr + min_lr) / 2");
    check(fabs(optimizer_lr(&o, 110) - 0.1) < 1e-12 && fabs(optimizer_lr(&o, 500) - 0.1) < 1e-12,
          "schedule: min_lr after the decay");
    o.decay_style = LR_DECAY_LINEAR;
    check(fabs(optimizer_lr(&o, 35) - 0.775) < 1e-12, "schedule: linear decay");
    o.decay_style = LR_DECAY_CONSTANT;
    check(fabs(optimizer_lr(&o, 80) - 1.0) < 1e-12, "schedule: constant after warm-up");
}

static void test_loss_scaler(void)
{
    struct loss_scaler s = loss_scaler_dynamic(1024.0, 64.0, 3, 2);
    int skip = loss_scaler_update(&s, 1);
    check(skip && s.scale == 1024.0 && s.skipped == 1, "loss scaler: the first overflow skips, hysteresis keeps the scale");
    skip = loss_scaler_update(&s, 1);
    check(skip && s.scale == 512.0, "loss scaler: the second overflow halves the scale (%g)", s.scale);
    loss_scaler_update(&s, 1);
    check(s.scale == 256.0 && s.skipped == 3, "loss scaler: hysteresis spent, every overflow halves (%g)", s.scale);
    int any = 0;
    for (int i = 0; i < 2; i++) any |= loss_scaler_update(&s, 0);
    check(!any && s.scale == 256.0, "loss scaler: clean steps are taken; no growth before the window");
    loss_scaler_update(&s, 0);
    check(s.scale == 512.0 && s.hysteresis_left == 2, "loss scaler: a clean window doubles it and restores hysteresis");
    for (int i = 0; i < 10; i++) loss_scaler_update(&s, 1);
    check(s.scale == 64.0, "loss scaler: never below min_scale (%g)", s.scale);
    struct loss_scaler c = loss_scaler_constant(128.0);
    skip = loss_scaler_update(&c, 1);
    for (int i = 0; i < 5; i++) loss_scaler_update(&c, 0);
    check(skip && c.scale == 128.0 && c.skipped == 1, "loss scaler: a constant scale skips overflows, never changes");
}

/* Bad text is refused with the file and the line (issue 35: NUL, invalid UTF-8, empty texts
 * and empty prompt/completion pairs used to train silently). */
static void test_bad_text(void)
{
    static const struct {
        const char *name, *content, *want;
        size_t len; /* 0: strlen */
    } cases[] = {
        {"nul.txt", "good line\nbad \0 byte\n", "nul.txt:2: the text holds a NUL byte", 21},
        {"utf8.txt", "caf\xc3\xa9\nline two\nbad \xff here\n", "utf8.txt:3: the text is not valid UTF-8", 0},
        {"cut.txt", "ends in half a character \xe2\x82", "cut.txt:1: the text is not valid UTF-8", 0},
        {"nul.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"a\\u0000b\"}\n", "nul.jsonl:2: a string holds \\u0000", 0},
        {"rawnul.jsonl", "{\"text\": \"a\0b\"}\n", "rawnul.jsonl:1: the line holds a NUL byte", 16},
        {"utf8.jsonl", "{\"text\": \"fine\"}\n\n{\"text\": \"\xc0\xaf\"}\n", "utf8.jsonl:3: the line is not valid UTF-8", 0},
        {"empty.jsonl", "{\"text\": \"fine\"}\n{\"text\": \"\"}\n", "empty.jsonl:2: an empty \"text\"", 0},
        {"emptyp.jsonl", "{\"prompt\": \"\", \"completion\": \"x\"}\n", "emptyp.jsonl:1: an empty \"prompt\"", 0},
        {"emptyc.jsonl", "{\"prompt\": \"x\", \"completion\": \"\"}\n", "emptyc.jsonl:1: an empty \"completion\"", 0},
    };
    struct data_options o = {.seq_length = 64, .overflow = DATA_OVERFLOW_TRUNCATE, .chat_template = CHAT_TEMPLATE_PLAIN};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        char path[256];
        snprintf(path, sizeof path, "/tmp/shardlm_test_train_data_%d_%s", (int)getpid(), cases[k].name);
        FILE *f = fopen(path, "wb");
        CHECK(f, "cannot write %s", path);
        fwrite(cases[k].content, 1, cases[k].len ? cases[k].len : strlen(cases[k].content), f);
        fclose(f);
        struct train_dataset ds = {0};
        enum status st = data_load(path, tok, &o, &ds);
        check(st == STATUS_INVALID_ARGUMENT && strstr(status_message(), cases[k].want), "bad text: %s refused ('%s')",
              cases[k].name, st == STATUS_OK ? "loaded" : status_message());
        data_free(&ds);
        unlink(path);
    }
    /* The same escape outside a string, and an escaped backslash before "u0000", are text. */
    char *path = write_tmp("esc.jsonl", "{\"text\": \"a\\\\u0000 is six characters\"}\n");
    struct train_dataset ds = {0};
    enum status st = data_load(path, tok, &o, &ds);
    check(st == STATUS_OK && ds.n == 1, "bad text: an escaped backslash before u0000 is not a NUL (%s)",
          st == STATUS_OK ? "ok" : status_message());
    data_free(&ds);
    unlink(path);
}

/* Streaming and bounded tokenization (issue 35: 80 bytes of memory per byte of data). */
static long peak_rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = atol(line + 6);
    if (f) fclose(f);
    return kib;
}

/* Sanitizer builds keep freed memory in quarantine: peak RSS says nothing about the data there. */
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

static void test_streaming(const char *assets)
{
    char text_path[4096];
    snprintf(text_path, sizeof text_path, "%s/datasets/tinyshakespeare.txt", assets);
    char *text = NULL;
    size_t len = 0;
    if (base_read_file(text_path, 0, NULL, &text, &len) != STATUS_OK) {
        printf("SKIP: streaming: no %s\n", text_path);
        return;
    }
    /* 1. Memory: a 4 copies (4.5 MB) .txt corpus loads with a bounded peak. Before, the whole
     * file went through SentencePiece at once: ~150 bytes per byte (650 MB here). */
    char *big = write_tmp("big.txt", "");
    FILE *f = fopen(big, "wb");
    CHECK(f, "cannot write %s", big);
    for (int i = 0; i < 4; i++) fwrite(text, 1, len, f);
    fclose(f);
    struct data_options o = {.seq_length = 256, .overflow = DATA_OVERFLOW_TRUNCATE, .chat_template = CHAT_TEMPLATE_PLAIN};
    struct train_dataset ds = {0};
    FILE *clear = fopen("/proc/self/clear_refs", "w"); /* "5" resets the peak (VmHWM) */
    const int reset = clear && fputs("5", clear) >= 0 && fclose(clear) == 0;
    if (clear && !reset) clear = NULL;
    const long before = peak_rss_kib();
    enum status st = data_load(big, tok, &o, &ds);
    const long grown = peak_rss_kib() - before, bound = (long)(4 * len * 8 / 1024) + 32 * 1024;
    if (!reset) printf("SKIP: streaming memory: /proc/self/clear_refs not writable\n");
    else if (SANITIZED) /* ASan's quarantine holds freed blocks (256 MB): the Release build checks it */
        printf("SKIP: streaming memory: a sanitizer build (%ld KiB grown)\n", grown);
    else
        check(st == STATUS_OK && grown <= bound, "streaming: a %.1f MB .txt corpus grows the peak RSS by %ld KiB "
              "(bound %ld KiB: 8 bytes a byte + 32 MiB); %lld tokens held", 4.0 * (double)len / 1e6, grown, bound,
              (long long)ds.n_tokens);
    data_free(&ds);
    unlink(big);
    /* 2. The chunked tokenization of a .txt file gives the tokens of the whole file, cut into
     * examples of seq_length. */
    st = data_load(text_path, tok, &o, &ds);
    int32_t *ids = NULL;
    int n = 0;
    CHECK(tokenizer_encode(tok, text, len, 1, &ids, &n) == STATUS_OK, "encode");
    int same = st == STATUS_OK && ds.n == (size_t)((n - 1) / o.seq_length + ((n - 1) % o.seq_length ? 1 : 0)) ;
    for (size_t i = 0; same && i < ds.n; i++)
        for (int j = 0; same && j < data_example_len(&ds, i); j++)
            same = id_at(&ds, i, j) == ids[i * (size_t)o.seq_length + (size_t)j];
    check(same, "streaming: the chunked .txt tokens equal the whole file's (%d tokens, %zu examples)", n, ds.n);
    free(ids);
    data_free(&ds);
    /* 3. One 5 MB JSONL line under --seq-length 64: a bounded number of ids tokenized, and the
     * kept 64 are those of the whole text (BOS + the first 63). */
    char *line_path = write_tmp("long.jsonl", "");
    f = fopen(line_path, "wb");
    CHECK(f, "cannot write %s", line_path);
    fputs("{\"text\": \"", f);
    for (int r = 0; r < 5; r++)
        for (size_t i = 0; i < len; i++) {
            const char c = text[i];
            if (c == '\n') fputs("\\n", f);
            else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
            else fputc(c, f);
        }
    fputs("\"}\n", f);
    fclose(f);
    o.seq_length = 64;
    st = data_load(line_path, tok, &o, &ds);
    CHECK(tokenizer_encode(tok, text, 4096, 1, &ids, &n) == STATUS_OK, "encode");
    same = st == STATUS_OK && ds.n == 1 && data_example_len(&ds, 0) == 64 && ds.n_truncated == 1;
    for (int j = 0; same && j < 64; j++) same = id_at(&ds, 0, j) == ids[j];
    check(same && ds.n_tokenized <= 2000, "streaming: a 5.5 MB line under --seq-length 64 tokenizes %lld ids (at most "
          "2000), its first 64 as the whole text's", (long long)ds.n_tokenized);
    free(ids);
    data_free(&ds);
    unlink(line_path);
    /* 4. A chat whose assistant turn is the whole play (1.1 MB): the content is cut before it is
     * rendered, and the kept 64 ids and flags are those of rendering it whole. */
    char *chat_path = write_tmp("long_chat.jsonl", "");
    f = fopen(chat_path, "wb");
    CHECK(f, "cannot write %s", chat_path);
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"Recite it.\"}, {\"role\": \"assistant\", "
          "\"content\": \"", f);
    for (size_t i = 0; i < len; i++) {
        const char c = text[i];
        if (c == '\n') fputs("\\n", f);
        else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else fputc(c, f);
    }
    fputs("\"}, {\"role\": \"user\", \"content\": \"Thanks.\"}]}\n", f);
    fclose(f);
    st = data_load(chat_path, tok, &o, &ds);
    struct chat_message m[3] = {{CHAT_ROLE_USER, "Recite it."}, {CHAT_ROLE_ASSISTANT, text}, {CHAT_ROLE_USER, "Thanks."}};
    uint8_t *flags = NULL;
    CHECK(chat_template_render_train(CHAT_TEMPLATE_PLAIN, tok, m, 3, &ids, &flags, &n) == STATUS_OK, "render");
    same = st == STATUS_OK && ds.n == 1 && data_example_len(&ds, 0) == 64 && n > 64;
    for (int j = 1; same && j < 64; j++) same = id_at(&ds, 0, j) == ids[j] && loss_at(&ds, 0, j) == flags[j];
    check(same && ds.n_tokenized <= 3000, "streaming: a chat with a 1.1 MB turn under --seq-length 64 tokenizes %lld "
          "ids (at most 3000), its first 64 and their flags as the whole rendering's", (long long)ds.n_tokenized);
    free(ids);
    free(flags);
    data_free(&ds);
    unlink(chat_path);
    free(text);
}

int main(void)
{
    const char *assets = getenv("SHARDLM_ASSETS");
    char path[4096];
    snprintf(path, sizeof path, "%s/stories260K/tok512.model", assets ? assets : "../shared/assets");
    test_schedule();
    test_loss_scaler();
    test_packing();
    if (tokenizer_load(path, &tok) != STATUS_OK) {
        printf("SKIP: train_data formats: no tokenizer at %s\n", path);
    } else {
        test_streaming(assets ? assets : "../shared/assets");
        test_formats();
        test_bad_text();
        tokenizer_free(tok);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
