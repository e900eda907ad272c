/* tests/test_spec_corpus.c - the corpus drafter (engine/serving/spec_corpus.c) against the rule of
 * spec_corpus.h computed by a scan of every position of every text (written here, for the test:
 * no suffix array), on random corpora over small vocabularies (many repeats, many ties), contexts
 * cut from the corpus or random, every n_min, p_min and max tried, texts of several scopes and
 * requests of each (the scan keeps the occurrences of the texts the scope allows); then the
 * refusals and the kept file (with scopes; a file of version 1 read as scope 0).
 * Prints one line per check and "N passed, M failed". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sampler.h"
#include "spec_corpus.h"

static int n_pass, n_fail;

static void check(int ok, const char *what, const char *detail)
{
    if (ok) n_pass++;
    else n_fail++;
    printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail ? ": " : "", detail ? detail : "");
}

/* The rule by scanning: occurrences are (start of a text + position) pairs kept in a list, only
 * those of texts that the request's scope allows (pos_scope: each id's text's scope, NULL: all 0). */
static int scan_draft(const int32_t *ids, const uint32_t *pos_scope, uint32_t scope, int64_t n, const int32_t *ctx,
                      int n_ctx, int n_min, float p_min, int max, int32_t *out, int *matched)
{
    int64_t *occ = malloc((size_t)n * sizeof *occ), *keep = malloc((size_t)n * sizeof *keep);
    int64_t n_occ = 0;
    int best = 0;
    const int top = n_ctx < SPEC_CORPUS_MAX_MATCH ? n_ctx : SPEC_CORPUS_MAX_MATCH;
    for (int m = n_min; m <= top; m++) {
        int64_t k = 0;
        for (int64_t p = 0; p < n; p++) {
            int ok = 1;
            for (int j = 0; j < m && ok; j++) ok = ids[p + j] >= 0 && ids[p + j] == ctx[n_ctx - m + j];
            if (ok && pos_scope && pos_scope[p] && pos_scope[p] != scope) ok = 0; /* another scope's text */
            if (ok && ids[p + m] >= 0) keep[k++] = p; /* matched, and its text goes on */
        }
        if (!k) break;
        best = m;
        memcpy(occ, keep, (size_t)k * sizeof *occ);
        n_occ = k;
    }
    *matched = best;
    int drafted = 0;
    double share = 1.0;
    for (int o = best; best && drafted < max && n_occ; o++) {
        int32_t pick = -1;
        int64_t pick_n = 0;
        for (int64_t i = 0; i < n_occ; i++) {
            const int32_t t = ids[occ[i] + o];
            if (t < 0) continue;
            int64_t c = 0;
            for (int64_t j = 0; j < n_occ; j++) c += ids[occ[j] + o] == t;
            if (c > pick_n || (c == pick_n && t < pick)) pick = t, pick_n = c;
        }
        if (!pick_n) break;
        share *= (double)pick_n / (double)n_occ;
        if (share < (double)p_min) break;
        out[drafted++] = pick;
        int64_t k = 0;
        for (int64_t i = 0; i < n_occ; i++)
            if (ids[occ[i] + o] == pick) occ[k++] = occ[i];
        n_occ = k;
    }
    free(occ), free(keep);
    return drafted;
}

/* Each text's scope (at its -1) from the per-id scopes: what spec_corpus_new takes. */
static uint32_t *text_scopes(const int32_t *ids, const uint32_t *pos_scope, int64_t n)
{
    uint32_t *t = malloc((size_t)(n + 1) * sizeof *t);
    int64_t k = 0;
    for (int64_t i = 0; t && i < n; i++)
        if (ids[i] < 0) t[k++] = pos_scope[i];
    return t;
}

int main(void)
{
    struct rng r;
    rng_seed(&r, 20261205);
    int agree = 0, tried = 0, with_drafts = 0, long_runs = 0;
    char detail[256] = "";
    for (int corpus_i = 0; corpus_i < 40; corpus_i++) {
        const int vocab = 2 + (int)(rng_uniform(&r) * 5), n_texts = 1 + (int)(rng_uniform(&r) * 30);
        int64_t n = 0, cap = 4096;
        int32_t *ids = malloc((size_t)(cap + SPEC_CORPUS_SPAN) * sizeof *ids);
        uint32_t *pos_scope = calloc((size_t)(cap + SPEC_CORPUS_SPAN), sizeof *pos_scope);
        const int scoped = corpus_i % 2; /* half the corpora hold texts of scopes 0 to 3 */
        for (int t = 0; t < n_texts && n < cap - 200; t++) {
            const int len = 1 + (int)(rng_uniform(&r) * 120);
            const uint32_t sc = scoped ? (uint32_t)(rng_uniform(&r) * 4) : 0;
            for (int i = 0; i <= len; i++) pos_scope[n + i] = sc;
            /* some texts repeat an earlier stretch: long matches and long drafts */
            const int copy = n > 80 && rng_uniform(&r) < 0.4f;
            const int64_t from = copy ? (int64_t)(rng_uniform(&r) * (float)(n - 80)) : 0;
            for (int i = 0; i < len; i++) {
                const int32_t v = copy && ids[from + i] >= 0 && i < 70 ? ids[from + i] : (int32_t)(rng_uniform(&r) * (float)vocab);
                ids[n++] = v;
            }
            ids[n++] = -1;
        }
        for (int k = 0; k < SPEC_CORPUS_SPAN; k++) ids[n + k] = -1; /* the scan reads past a text's end */
        struct spec_corpus *c = NULL;
        uint32_t *per_text = text_scopes(ids, pos_scope, n);
        if (spec_corpus_new(ids, n, scoped ? per_text : NULL, &c) != STATUS_OK) {
            check(0, "spec_corpus_new on a random corpus", status_message());
            free(ids), free(pos_scope), free(per_text);
            continue;
        }
        for (int q = 0; q < 60; q++) {
            int32_t ctx[80];
            const int n_ctx = 1 + (int)(rng_uniform(&r) * 79);
            const int64_t at = (int64_t)(rng_uniform(&r) * (float)(n - 1));
            const int cut = rng_uniform(&r) < 0.7f; /* from the corpus, else random */
            for (int i = 0; i < n_ctx; i++) {
                const int32_t v = cut ? ids[(at + i) % n] : -1;
                ctx[i] = v >= 0 ? v : (int32_t)(rng_uniform(&r) * (float)vocab);
            }
            const int n_min = 1 + (int)(rng_uniform(&r) * 4), max = 1 + (int)(rng_uniform(&r) * 32);
            const float p_min = rng_uniform(&r) < 0.3f ? 0.0f : rng_uniform(&r);
            int32_t got[64], want[64];
            int m_got = -1, m_want = -1;
            const uint32_t scope = (uint32_t)(rng_uniform(&r) * 4);
            const int k_got = spec_corpus_draft(c, ctx, n_ctx, n_min, p_min, max, scope, got, &m_got);
            const int k_want = scan_draft(ids, pos_scope, scope, n, ctx, n_ctx, n_min, p_min, max, want, &m_want);
            const int same = k_got == k_want && m_got == m_want && !memcmp(got, want, (size_t)k_got * sizeof *got);
            tried++;
            agree += same;
            with_drafts += k_want > 0;
            long_runs += k_want >= 8;
            if (!same && !detail[0])
                snprintf(detail, sizeof detail, "corpus %d query %d: %d drafts (match %d), the scan %d (match %d)",
                         corpus_i, q, k_got, m_got, k_want, m_want);
        }
        spec_corpus_free(c);
        free(ids), free(pos_scope), free(per_text);
    }
    snprintf(detail + strlen(detail), sizeof detail - strlen(detail), "%s%d of %d queries agree (%d with drafts, %d with 8 or more)",
             detail[0] ? "; " : "", agree, tried, with_drafts, long_runs);
    check(agree == tried && with_drafts > tried / 4 && long_runs > 20, "drafts equal the scan's", detail);

    /* A corpus grown and cut (spec_corpus_append, spec_corpus_forget, as the engine's learning
     * does) drafts what a corpus made at once of the same texts drafts, query for query. */
    {
        int64_t n = 0;
        int32_t *ids = malloc((size_t)(1 << 16) * sizeof *ids), add[400];
        uint32_t *pos_scope = malloc((size_t)(1 << 16) * sizeof *pos_scope), add_scope[4];
        struct spec_corpus *grown = NULL;
        int ops = 0, same_q = 0, n_q = 0, cut_ops = 0, add_ops = 0;
        char why[160] = "";
        for (int round = 0; round < 300 && ids; round++) {
            const int vocab = 3;
            int n_add = 0;
            if (!grown || rng_uniform(&r) < 0.75f || n < 200) { /* one to three texts, some copying */
                int n_add_texts = 0;
                for (int t = 1 + (int)(rng_uniform(&r) * 3); t > 0; t--) {
                    const int len = 1 + (int)(rng_uniform(&r) * 100);
                    add_scope[n_add_texts++] = (uint32_t)(rng_uniform(&r) * 3);
                    for (int i = 0; i <= len; i++) pos_scope[n + n_add + i] = add_scope[n_add_texts - 1];
                    const int64_t src = n > 120 && rng_uniform(&r) < 0.5f ? (int64_t)(rng_uniform(&r) * (float)(n - 110)) : -1;
                    for (int i = 0; i < len; i++)
                        add[n_add++] = src >= 0 && ids[src + i] >= 0 ? ids[src + i] : (int32_t)(rng_uniform(&r) * vocab);
                    add[n_add++] = -1;
                }
                enum status st = grown ? spec_corpus_append(grown, add, n_add, add_scope)
                                       : spec_corpus_new(add, n_add, add_scope, &grown);
                if (st != STATUS_OK) {
                    snprintf(why, sizeof why, "round %d: append: %s", round, status_message());
                    break;
                }
                memcpy(ids + n, add, (size_t)n_add * sizeof *ids);
                n += n_add;
                add_ops++;
            } else { /* forget from a random text's start */
                int64_t from = (int64_t)(rng_uniform(&r) * (float)n);
                while (from > 0 && ids[from - 1] >= 0) from--;
                const int64_t want = 1 + (int64_t)(rng_uniform(&r) * 150);
                int64_t to = from + want < n ? from + want : n;
                while (ids[to - 1] >= 0) to++;
                const int64_t gone = spec_corpus_forget(grown, from, want);
                if (gone != to - from) {
                    snprintf(why, sizeof why, "round %d: forget(%lld, %lld) dropped %lld ids, not %lld", round,
                             (long long)from, (long long)want, (long long)gone, (long long)(to - from));
                    break;
                }
                memmove(ids + from, ids + to, (size_t)(n - to) * sizeof *ids);
                memmove(pos_scope + from, pos_scope + to, (size_t)(n - to) * sizeof *pos_scope);
                n -= gone;
                cut_ops++;
                if (n < 2) { /* all forgotten: start again */
                    spec_corpus_free(grown);
                    grown = NULL, n = 0;
                    continue;
                }
            }
            ops++;
            if (n + 500 > (1 << 16)) break;
            struct spec_corpus *once = NULL;
            uint32_t *per_text = text_scopes(ids, pos_scope, n);
            const enum status st_once = spec_corpus_new(ids, n, per_text, &once);
            free(per_text);
            if (st_once != STATUS_OK) {
                snprintf(why, sizeof why, "round %d: spec_corpus_new: %s", round, status_message());
                break;
            }
            int64_t texts = 0, tokens = 0;
            for (int64_t i = 0; i < n; i++) texts += ids[i] < 0, tokens += ids[i] >= 0;
            if (spec_corpus_ids(grown) != n || spec_corpus_tokens(grown) != tokens || spec_corpus_texts(grown) != texts) {
                snprintf(why, sizeof why, "round %d: counts %lld / %lld / %lld, want %lld / %lld / %lld", round,
                         (long long)spec_corpus_ids(grown), (long long)spec_corpus_tokens(grown),
                         (long long)spec_corpus_texts(grown), (long long)n, (long long)tokens, (long long)texts);
                spec_corpus_free(once);
                break;
            }
            for (int q = 0; q < 20; q++) {
                int32_t ctx[40], a[64], b[64];
                const int n_ctx = 1 + (int)(rng_uniform(&r) * 39);
                const int64_t at = (int64_t)(rng_uniform(&r) * (float)(n - 1));
                for (int i = 0; i < n_ctx; i++) ctx[i] = ids[(at + i) % n] >= 0 ? ids[(at + i) % n] : (int32_t)(rng_uniform(&r) * vocab);
                const int n_min = 1 + (int)(rng_uniform(&r) * 3), max = 1 + (int)(rng_uniform(&r) * 32);
                const float p_min = rng_uniform(&r) * 0.8f;
                int ma = -1, mb = -1;
                const uint32_t scope = 1 + (uint32_t)(rng_uniform(&r) * 2);
                const int ka = spec_corpus_draft(grown, ctx, n_ctx, n_min, p_min, max, scope, a, &ma);
                const int kb = spec_corpus_draft(once, ctx, n_ctx, n_min, p_min, max, scope, b, &mb);
                n_q++;
                same_q += ka == kb && ma == mb && !memcmp(a, b, (size_t)ka * sizeof *a);
            }
            spec_corpus_free(once);
        }
        snprintf(why + strlen(why), sizeof why - strlen(why), "%s%d of %d queries agree over %d appends and %d cuts",
                 why[0] ? "; " : "", same_q, n_q, add_ops, cut_ops);
        check(ids && same_q == n_q && n_q > 2000 && add_ops > 100 && cut_ops > 30,
              "a corpus grown and cut drafts as one made at once", why);
        spec_corpus_free(grown);
        free(ids), free(pos_scope);
    }
    /* Text ends: a context matching only a text's last tokens drafts nothing; one token of
     * agreement among three occurrences is a share of 2/3. */
    {
        const int32_t ids[] = {5, 6, 7, -1, 5, 6, 8, 9, -1, 5, 6, 8, -1, 1, 2, 3, -1};
        struct spec_corpus *c = NULL;
        const enum status st = spec_corpus_new(ids, (int64_t)(sizeof ids / sizeof ids[0]), NULL, &c);
        check(st == STATUS_OK && spec_corpus_tokens(c) == 13 && spec_corpus_texts(c) == 4, "counts", NULL);
        int32_t out[8], m = -1;
        const int32_t end[] = {1, 2, 3}, two[] = {4, 5, 6};
        check(c && spec_corpus_draft(c, end, 3, 1, 0.0f, 4, 1, out, &m) == 0 && m == 0, "a match at a text's end drafts nothing", NULL);
        const int k = c ? spec_corpus_draft(c, two, 3, 1, 0.0f, 4, 1, out, &m) : -1;
        check(k == 2 && m == 2 && out[0] == 8 && out[1] == 9, "the most frequent continuation, then the one left", NULL);
        check(c && spec_corpus_draft(c, two, 3, 1, 0.7f, 4, 1, out, &m) == 0, "a share of 2/3 below p_min 0.7 drafts nothing", NULL);
        check(c && spec_corpus_draft(c, two, 3, 3, 0.0f, 4, 1, out, &m) == 0 && m == 0, "n_min above every match", NULL);
        spec_corpus_free(c);
    }
    /* Refusals. */
    {
        struct spec_corpus *c = NULL;
        const int32_t open_end[] = {1, 2, 3}, bad[] = {1, -2, -1};
        check(spec_corpus_new(open_end, 3, NULL, &c) == STATUS_INVALID_ARGUMENT && !c, "a last text without its -1 is refused",
              status_message());
        check(spec_corpus_new(bad, 3, NULL, &c) == STATUS_INVALID_ARGUMENT && !c, "an id below -1 is refused", status_message());
        check(spec_corpus_new(bad, 1, NULL, &c) == STATUS_INVALID_ARGUMENT && !c, "fewer than two ids are refused", status_message());
        spec_corpus_free(NULL);
    }
    /* The kept corpus's file (spec_corpus_file_write / _read): read back as written; absent is
     * empty; another tokenizer, a foreign file, an altered or cut one and an id outside the
     * vocabulary refused, their messages naming the file (also once wrapped by a caller's
     * status_errorf(st, "...: %s", status_message()), whose source and destination once overlapped). */
    {
        char dir[] = "/tmp/spec_corpus_keep_XXXXXX", path[64], other[80];
        check(mkdtemp(dir) != NULL, "a temporary directory", dir);
        snprintf(path, sizeof path, "%s/kept", dir);
        const int32_t ids[] = {3, 4, 5, -1, 7, 8, 9, 9, -1};
        const uint32_t scope[] = {7, 7, 7, 7, 0x9abcdef0u, 0x9abcdef0u, 0x9abcdef0u, 0x9abcdef0u, 0x9abcdef0u};
        const int64_t n = (int64_t)(sizeof ids / sizeof ids[0]);
        int32_t *got = NULL;
        uint32_t *got_scope = NULL;
        int64_t n_got = -1;
        check(spec_corpus_file_read(path, 10, 42, &got, &got_scope, &n_got) == STATUS_OK && !got && !got_scope &&
                  n_got == 0,
              "a file not there is an empty kept corpus", status_message());
        check(spec_corpus_file_write(path, 10, 42, ids, scope, n) == STATUS_OK, "written", status_message());
        enum status st = spec_corpus_file_read(path, 10, 42, &got, &got_scope, &n_got);
        check(st == STATUS_OK && n_got == n && got && !memcmp(got, ids, sizeof ids) && got_scope &&
                  got_scope[0] == 7 && got_scope[1] == 0x9abcdef0u,
              "read back as written, each text's scope too", status_message());
        free(got), free(got_scope);
        /* A file of version 1 (before scopes): the same ids, no scopes: every text of scope 0. */
        {
            unsigned char v1[32 + 4 * 9 + 8];
            memcpy(v1, "SHLMSPC1", 8);
            const uint64_t head[] = {1, 10, 42, 9};
            const int at[] = {8, 12, 16, 24}, width[] = {4, 4, 8, 8};
            for (int k = 0; k < 4; k++)
                for (int b = 0; b < width[k]; b++) v1[at[k] + b] = (unsigned char)(head[k] >> (8 * b));
            for (int i = 0; i < 9; i++)
                for (int b = 0; b < 4; b++) v1[32 + 4 * i + b] = (unsigned char)((uint32_t)ids[i] >> (8 * b));
            const uint64_t sum = base_fnv1a(BASE_FNV1A_BASIS, v1 + 32, 4 * 9);
            for (int b = 0; b < 8; b++) v1[32 + 36 + b] = (unsigned char)(sum >> (8 * b));
            char old[80];
            snprintf(old, sizeof old, "%s/v1", dir);
            FILE *fo = fopen(old, "wb");
            if (fo) fwrite(v1, 1, sizeof v1, fo), fclose(fo);
            st = spec_corpus_file_read(old, 10, 42, &got, &got_scope, &n_got);
            check(st == STATUS_OK && n_got == n && got && !memcmp(got, ids, sizeof ids) && !got_scope,
                  "a file of version 1 is read, without scopes", status_message());
            free(got), free(got_scope);
            remove(old);
        }
        st = spec_corpus_file_read(path, 11, 42, &got, &got_scope, &n_got);
        check(st == STATUS_FAILED_PRECONDITION && !got && strstr(status_message(), "another tokenizer"),
              "another vocabulary refused", status_message());
        st = spec_corpus_file_read(path, 10, 43, &got, &got_scope, &n_got);
        check(st == STATUS_FAILED_PRECONDITION && strstr(status_message(), "another tokenizer"),
              "another tokenizer's fingerprint refused", status_message());
        st = status_errorf(st, "--spec-corpus-keep: %s", status_message());
        check(!strncmp(status_message(), "--spec-corpus-keep: ", 20) && !strncmp(status_message() + 20, path, strlen(path)),
              "a message wrapped by status_errorf keeps the file's name", status_message());
        FILE *f = fopen(path, "rb");
        unsigned char buf[256];
        const size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
        if (f) fclose(f);
        snprintf(other, sizeof other, "%s/other", dir);
        const struct { size_t at, cut; unsigned char flip; enum status want; const char *word, *what; } bad[] = {
            {0, 0, 'x', STATUS_FAILED_PRECONDITION, "not a kept", "a file of another kind refused"},
            {36, 0, 1, STATUS_BAD_FORMAT, "checksum", "an altered id refused"},
            {0, 3, 0, STATUS_BAD_FORMAT, "cut short", "a file cut short refused"},
            {8, 0, 1, STATUS_BAD_FORMAT, "version", "another version refused"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            unsigned char copy[256];
            memcpy(copy, buf, len);
            copy[bad[i].at] ^= bad[i].flip;
            f = fopen(other, "wb");
            if (f) fwrite(copy, 1, len - bad[i].cut, f), fclose(f);
            st = spec_corpus_file_read(other, 10, 42, &got, &got_scope, &n_got);
            check(st == bad[i].want && !got && strstr(status_message(), bad[i].word) && strstr(status_message(), other),
                  bad[i].what, status_message());
        }
        struct stat sb;
        check(stat(path, &sb) == 0 && (sb.st_mode & 0777) == 0600, "the file is the user's alone (mode 0600)", NULL);
        f = fopen(other, "wb"); /* a file a crash left empty before its sync: nothing to lose */
        if (f) fclose(f);
        check(spec_corpus_file_read(other, 10, 42, &got, &got_scope, &n_got) == STATUS_OK && !got && n_got == 0,
              "an empty file is an empty kept corpus", status_message());
        const int32_t outside[] = {3, 12, -1};
        check(spec_corpus_file_write(other, 10, 42, outside, NULL, 3) == STATUS_OK &&
                  spec_corpus_file_read(other, 10, 42, &got, &got_scope, &n_got) == STATUS_BAD_FORMAT &&
                  strstr(status_message(), "not a token"),
              "an id outside the vocabulary refused", status_message());
        remove(path);
        remove(other);
        rmdir(dir);
    }
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
