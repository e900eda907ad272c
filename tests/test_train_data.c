/* tests/test_train_data.c - training data without a model (engine/train/data.c,
 * engine/text/chat_train.c) and the learning-rate schedule (optimizer_lr): loss masks of each
 * format (the loss falls exactly on the completion / the assistant's words and the end of its
 * turn), packing (documents never cross, positions restart, the last token of a document and
 * masked tokens have no target, capacity respected), the seeded order, the held-out split and
 * the schedule's values. Needs the stories260K tokenizer of the shared assets (SKIP without).
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

/* The text of the tokens of e whose loss flag equals `loss`, concatenated. */
static char *masked_text(const struct train_example *e, int loss)
{
    int32_t *ids = malloc((size_t)e->n * sizeof *ids);
    int n = 0;
    for (int i = 0; i < e->n; i++)
        if (e->loss[i] == loss) ids[n++] = e->ids[i];
    char *text = NULL;
    size_t len = 0;
    CHECK(tokenizer_decode(tok, ids, n, &text, &len) == STATUS_OK, "decode");
    free(ids);
    return text;
}

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
        char *c = masked_text(&ds.ex[0], 1);
        check(!strcmp(c, "there was a dog.") || !strcmp(c, " there was a dog."),
              "prompt/completion: the loss is on the completion only ('%s')", c);
        check(ds.ex[0].ids[0] == tokenizer_bos_id(tok) && ds.ex[0].ids[ds.ex[0].n - 1] == tokenizer_eos_id(tok) &&
                  ds.ex[0].loss[ds.ex[0].n - 1] == 1,
              "prompt/completion: BOS first, EOS last and learned");
        free(c);
        c = masked_text(&ds.ex[1], 1);
        check(strstr(c, "Lily.") && strstr(c, "The park.") && !strstr(c, "Who") && !strstr(c, "Where") &&
                  !strstr(c, "User"),
              "chat: the loss is on both assistant turns and nothing the user said ('%s')", c);
        free(c);
        c = masked_text(&ds.ex[1], 0);
        check(strstr(c, "User: Who?") && strstr(c, "Assistant:"), "chat: the plain template's turns ('%s')", c);
        free(c);
        int all = 1;
        for (int i = 1; i < ds.ex[2].n; i++) all &= ds.ex[2].loss[i];
        check(all && ds.ex[2].loss[0] == 0, "text: every token but the first is a target");
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
    check(st == STATUS_OK && ds.n == 2 && ds.n_truncated == 1 && ds.ex[0].n == 6,
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
        struct train_example e = {malloc((size_t)lens[k] * 4), malloc((size_t)lens[k]), lens[k]};
        for (int i = 0; i < e.n; i++) {
            e.ids[i] = 100 * (k + 1) + i;
            e.loss[i] = i > 0 && !(k == 2 && i == 3); /* one masked target in example 2 */
        }
        CHECK(!base_grow((void **)&ds.ex, &ds.cap, ds.n + 1, sizeof *ds.ex), "oom");
        ds.ex[ds.n++] = e;
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
                const int want = i + 1 < b && ds.ex[k].loss[i - a + 1] ? mb.tokens[i + 1] : -1;
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
        test_formats();
        tokenizer_free(tok);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
