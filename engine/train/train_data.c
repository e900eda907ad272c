/* engine/train/train_data.c - the data of a run as `shardlm train` reads them (trainer.h):
 * the chat template chosen, the training and held-out sets tokenized, and --epochs counted in
 * iterations. Shared by the trainer (trainer.c) and the EAGLE head's trainer (eagle_train.c).
 * Tests: tests/test_train.sh, tests/test_jinja_train.py, tests/test_train_eagle.py. */
#include "trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja.h"
#include "tokenizer.h"

/* Iterations for --epochs: micro-batches of one pass over the shuffled data, counted by
 * running a cursor through it (packing makes the number depend on the order). */
int64_t train_iters_for_epochs(const struct train_options *o, struct train_dataset *train, int num_micro,
                               struct micro_batch *scratch)
{
    struct data_cursor cur = {.seed = o->seed, .epoch = 0, .index = 0};
    int64_t micro = 0;
    while (cur.epoch == 0) {
        data_next_micro_batch(train, &cur, o->micro_batch_size, o->seq_length, scratch);
        micro++;
    }
    const int64_t per_epoch = (micro + num_micro - 1) / num_micro;
    int64_t n = (int64_t)ceil(o->epochs * (double)per_epoch);
    return n > 0 ? n : 1;
}

enum status data_chat_options(const char *template_file, int auto_detect, const char *own, const char *start,
                              const struct tokenizer *tok, struct data_options *dopt, struct jinja_template **jt)
{
    *jt = NULL;
    if (auto_detect) dopt->chat_template = chat_template_detect(start, tok);
    enum status st;
    if (template_file) {
        char *src = NULL;
        size_t n = 0;
        if ((st = base_read_file(template_file, 4u << 20, "chat template", &src, &n)) != STATUS_OK) return st;
        st = jinja_compile(src, n, NULL, jt);
        free(src);
        if (st != STATUS_OK) return status_errorf(st, "--chat-template %s: %s", template_file, status_message());
    } else if (auto_detect && own && tokenizer_encodes_special(tok)) {
        if (jinja_compile(own, strlen(own), NULL, jt) != STATUS_OK) {
            LOG_WARN("data", "the model's chat template does not compile (%s); chat examples use %s", status_message(),
                     chat_template_name(dopt->chat_template));
            *jt = NULL;
            return STATUS_OK;
        }
        LOG_INFO("data", "chat examples: the model's own Jinja template");
    }
    if (*jt) {
        const int bos = tokenizer_bos_id(tok), eos = tokenizer_eos_id(tok);
        const char *b = bos >= 0 ? tokenizer_id_to_piece(tok, bos) : NULL, *e = eos >= 0 ? tokenizer_id_to_piece(tok, eos) : NULL;
        snprintf(dopt->bos_text, sizeof dopt->bos_text, "%s", b ? b : "");
        snprintf(dopt->eos_text, sizeof dopt->eos_text, "%s", e ? e : "");
        dopt->jinja = *jt;
    }
    return STATUS_OK;
}

enum status train_load_data(const struct train_options *o, const char *start, const struct model *m,
                            const struct tokenizer *tok, struct train_dataset *train, struct train_dataset *eval)
{
    struct data_options dopt = o->data_opt;
    struct jinja_template *jt = NULL;
    enum status st = data_chat_options(o->chat_template_file, o->chat_template_auto,
                                       m->checkpoint ? m->checkpoint->chat_template : NULL, start, tok, &dopt, &jt);
    if (st != STATUS_OK) return st;
    st = data_load(o->data, tok, &dopt, train);
    if (st == STATUS_OK && o->eval_data) st = data_load(o->eval_data, tok, &dopt, eval);
    else if (st == STATUS_OK && o->split_percent > 0) st = data_split(train, o->split_percent, o->seed, eval);
    jinja_free(jt); /* the data are tokenized */
    if (st != STATUS_OK) return st;
    const struct train_dataset *d = train;
    LOG_INFO("train", "data: %zu examples, %lld tokens (%lld targets); %ld JSONL lines, %ld blank, %ld truncated, "
             "%ld skipped as too long, %ld without a target; held out: %zu examples; %lld ids tokenized",
             d->n, (long long)d->n_tokens, (long long)d->n_target_tokens, d->n_lines, d->n_blank,
             d->n_truncated, d->n_skipped, d->n_no_target, eval->n, (long long)d->n_tokenized);
    if (d->n == 0) return status_errorf(STATUS_INVALID_ARGUMENT, "no training example left after the split");
    return STATUS_OK;
}

