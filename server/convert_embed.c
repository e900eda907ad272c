/* server/convert_embed.c - protobuf-c messages <-> native structs for Embed (convert.h): an
 * EmbedRequest becomes the struct embed_request that the HTTP front's /v1/embeddings also makes
 * (embed.c checks and runs both), and vectors become an EmbedResponse.
 * Tests: tests/server/test_embeddings.py (grpc: Embed against /v1/embeddings and the float64
 * reference; bad input). */
#include "convert.h"
#include "convert_impl.h"

#include <stdlib.h>
#include <string.h>

#include "shardlm/v1/text_generation.pb-c.h"

enum status embed_request_items(struct embed_request *r, int n)
{
    r->items = calloc((size_t)(n > 0 ? n : 1), sizeof *r->items);
    if (!r->items) return convert_oom();
    r->n_items = n;
    return STATUS_OK;
}

void embed_request_free(struct embed_request *r)
{
    for (int i = 0; i < r->n_items; i++) {
        free(r->items[i].text);
        free(r->items[i].ids);
    }
    free(r->items);
    free(r->model);
    memset(r, 0, sizeof *r);
}

/* Input i of m into it. */
static enum status embed_input(const Shardlm__V1__EmbedInput *in, int i, struct embed_item *it)
{
    if (in->input_case == SHARDLM__V1__EMBED_INPUT__INPUT_TEXT) {
        it->text_len = strlen(in->text);
        if (!utf8_valid(in->text, it->text_len))
            return status_errorf(STATUS_INVALID_ARGUMENT, "inputs[%d].text is not valid UTF-8", i);
        return (it->text = strdup(in->text)) ? STATUS_OK : convert_oom();
    }
    if (in->input_case != SHARDLM__V1__EMBED_INPUT__INPUT_TOKEN_IDS)
        return status_errorf(STATUS_INVALID_ARGUMENT, "inputs[%d] has neither text nor token_ids", i);
    const size_t n = in->token_ids->n_ids;
    if (!(it->ids = malloc((n ? n : 1) * sizeof *it->ids))) return convert_oom();
    if (n) memcpy(it->ids, in->token_ids->ids, n * sizeof *it->ids);
    it->n_ids = (int)n;
    return STATUS_OK;
}

enum status convert_embed_request(const void *data, size_t len, struct embed_request *r)
{
    memset(r, 0, sizeof *r);
    enum status st;
    Shardlm__V1__EmbedRequest *m =
        (Shardlm__V1__EmbedRequest *)convert_unpack(&shardlm__v1__embed_request__descriptor, data, len, NULL, &st);
    if (!m) return st;
    /* The count's limit is embed.c's, for both fronts; an int holds any count a message can carry. */
    st = embed_request_items(r, (int)m->n_inputs);
    for (size_t i = 0; i < m->n_inputs && st == STATUS_OK; i++) st = embed_input(m->inputs[i], (int)i, &r->items[i]);
    if (st == STATUS_OK && m->model[0] && !(r->model = strdup(m->model))) st = convert_oom();
    r->pooling = (enum embed_pooling)m->pooling;
    r->normalize = m->_normalize_case == SHARDLM__V1__EMBED_REQUEST___NORMALIZE_NORMALIZE ? (m->normalize ? 1 : 0) : 1;
    shardlm__v1__embed_request__free_unpacked(m, NULL);
    return st;
}

enum status convert_embed_response(const float *vecs, int n, int d, const char *model, int prompt_tokens,
                                   uint8_t **out, size_t *len)
{
    Shardlm__V1__EmbedResponse m = SHARDLM__V1__EMBED_RESPONSE__INIT;
    Shardlm__V1__Embedding *e = calloc((size_t)(n > 0 ? n : 1), sizeof *e);
    Shardlm__V1__Embedding **pe = calloc((size_t)(n > 0 ? n : 1), sizeof *pe);
    enum status st = STATUS_OK;
    if (!e || !pe) st = convert_oom();
    for (int i = 0; i < n && st == STATUS_OK; i++) {
        shardlm__v1__embedding__init(&e[i]);
        e[i].n_values = (size_t)d;
        e[i].values = (float *)(vecs + (size_t)i * (size_t)d); /* borrowed: packing only reads it */
        pe[i] = &e[i];
    }
    m.n_embeddings = (size_t)n;
    m.embeddings = pe;
    m.model = (char *)model;
    m.prompt_tokens = prompt_tokens;
    if (st == STATUS_OK) st = convert_pack(&m.base, out, len);
    free(e);
    free(pe);
    return st;
}
