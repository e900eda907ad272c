/* clients/client_convert.c - the C client's edge with protobuf-c: struct client_request ->
 * GenerateRequest / ChatRequest, and response messages -> struct client_result (completions,
 * token ids, log-probabilities, usage), deep-copied so that nothing protobuf outlives a call.
 * Not here: the calls (client_call.c), the public functions (client.c).
 * Tests: tests/test_client_lib.c, tests/test_client.sh. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

enum client_finish_reason client_finish_reason_from_pb(Shardlm__V1__FinishReason r)
{
    /* The enum mirrors the proto's values; a value appended to the proto later reads as
     * ERROR rather than as something it is not. */
    if ((int)r >= 0 && (int)r <= CLIENT_FINISH_REASON_ERROR) return (enum client_finish_reason)r;
    return CLIENT_FINISH_REASON_ERROR;
}


/* ---- conversions ---------------------------------------------------------------------- */

char *client_str_dup(const char *s)
{
    if (!s) s = "";
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* The arrays of client.h carry a count and no capacity. Their capacity is taken to be the
 * power of two at or above the count, and every growth asks base_grow for a power of two, so
 * that the capacity base_grow gave is never below the one assumed (appending chunk by chunk
 * stays linear). */
static size_t pow2_at_least(size_t n)
{
    size_t p = 1;
    while (p < n) p <<= 1;
    return n ? p : 0;
}

static int grow_counted(void **p, size_t n, size_t need, size_t elem)
{
    size_t cap = pow2_at_least(n);
    return base_grow(p, &cap, pow2_at_least(need), elem);
}

void client_logprobs_free(struct client_logprob *lp, int n)
{
    if (!lp) return;
    for (int i = 0; i < n; i++) {
        free(lp[i].piece);
        for (int j = 0; j < lp[i].n_top; j++) free(lp[i].top[j].piece);
        free(lp[i].top);
    }
    free(lp);
}

/* Appends n protobuf logprobs to (*dst, *n_dst), deep-copied. */
enum status client_logprobs_append(struct client_logprob **dst, int *n_dst,
                                   Shardlm__V1__TokenLogprob *const *src, size_t n)
{
    if (n == 0) return STATUS_OK;
    if (grow_counted((void **)dst, (size_t)*n_dst, (size_t)*n_dst + n, sizeof **dst))
        return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t i = 0; i < n; i++) {
        struct client_logprob *d = &(*dst)[*n_dst];
        memset(d, 0, sizeof *d);
        d->token_id = src[i]->token_id;
        d->logprob = src[i]->logprob;
        (*n_dst)++;
        if (!(d->piece = client_str_dup(src[i]->piece))) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        if (src[i]->n_top) {
            d->top = calloc(src[i]->n_top, sizeof *d->top);
            if (!d->top) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            for (size_t j = 0; j < src[i]->n_top; j++) {
                d->top[j].token_id = src[i]->top[j]->token_id;
                d->top[j].logprob = src[i]->top[j]->logprob;
                d->n_top++;
                if (!(d->top[j].piece = client_str_dup(src[i]->top[j]->piece)))
                    return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
    }
    return STATUS_OK;
}

struct client_usage client_usage_from_pb(const Shardlm__V1__Usage *u)
{
    struct client_usage r = {0};
    if (u) {
        r.prompt_tokens = u->prompt_tokens;
        r.completion_tokens = u->completion_tokens;
        r.cached_prompt_tokens = u->cached_prompt_tokens;
    }
    return r;
}

void client_result_free(struct client_result *r)
{
    if (!r) return;
    free(r->request_id);
    for (int i = 0; i < r->n_completions; i++) {
        free(r->completions[i].text);
        free(r->completions[i].token_ids);
        client_logprobs_free(r->completions[i].logprobs, r->completions[i].n_logprobs);
    }
    free(r->completions);
    client_logprobs_free(r->prompt_logprobs, r->n_prompt_logprobs);
    memset(r, 0, sizeof *r);
}

/* Sample `index` of r, created (empty) when new. */
enum status client_result_sample(struct client_result *r, int index, struct client_completion **out)
{
    if (index < 0 || index >= MAX_SAMPLES)
        return status_errorf(STATUS_INTERNAL, "the server sent sample index %d", index);
    if (index >= r->n_completions) {
        if (grow_counted((void **)&r->completions, (size_t)r->n_completions, (size_t)index + 1,
                         sizeof *r->completions))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        struct client_completion *nc = r->completions;
        for (int i = r->n_completions; i <= index; i++) {
            memset(&nc[i], 0, sizeof nc[i]);
            nc[i].index = i;
            if (!(nc[i].text = client_str_dup(""))) {
                r->n_completions = i;
                return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        r->n_completions = index + 1;
    }
    *out = &r->completions[index];
    return STATUS_OK;
}

/* Appends text, token ids and logprobs to a sample. */
enum status client_sample_append(struct client_completion *s, const char *text, size_t len,
                                 const int32_t *ids, size_t n_ids,
                                 Shardlm__V1__TokenLogprob *const *lp, size_t n_lp)
{
    if (len) {
        /* text holds text_len + 1 bytes (the NUL). */
        if (grow_counted((void **)&s->text, s->text_len + 1, s->text_len + len + 1, 1))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(s->text + s->text_len, text, len);
        s->text_len += len;
        s->text[s->text_len] = '\0';
    }
    if (n_ids) {
        if (grow_counted((void **)&s->token_ids, (size_t)s->n_token_ids, (size_t)s->n_token_ids + n_ids,
                 sizeof *s->token_ids))
            return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        memcpy(s->token_ids + s->n_token_ids, ids, n_ids * sizeof *ids);
        s->n_token_ids += (int)n_ids;
    }
    return client_logprobs_append(&s->logprobs, &s->n_logprobs, lp, n_lp);
}

/* The request's SamplingParams, pointing into req and into the two arrays given (which must
 * outlive the message). */
static enum status sampling_to_pb(const struct client_sampling *s, Shardlm__V1__SamplingParams *p,
                                  Shardlm__V1__SamplingParams__LogitBiasEntry **entries,
                                  Shardlm__V1__SamplingParams__LogitBiasEntry ***entry_ptrs)
{
    shardlm__v1__sampling_params__init(p);
    *entries = NULL;
    *entry_ptrs = NULL;
    if (s->has_max_tokens) {
        p->_max_tokens_case = SHARDLM__V1__SAMPLING_PARAMS___MAX_TOKENS_MAX_TOKENS;
        p->max_tokens = s->max_tokens;
    }
    if (s->has_temperature) {
        p->_temperature_case = SHARDLM__V1__SAMPLING_PARAMS___TEMPERATURE_TEMPERATURE;
        p->temperature = s->temperature;
    }
    p->top_k = s->top_k;
    if (s->has_top_p) {
        p->_top_p_case = SHARDLM__V1__SAMPLING_PARAMS___TOP_P_TOP_P;
        p->top_p = s->top_p;
    }
    p->min_p = s->min_p;
    if (s->has_repetition_penalty) {
        p->_repetition_penalty_case = SHARDLM__V1__SAMPLING_PARAMS___REPETITION_PENALTY_REPETITION_PENALTY;
        p->repetition_penalty = s->repetition_penalty;
    }
    p->presence_penalty = s->presence_penalty;
    p->frequency_penalty = s->frequency_penalty;
    if (s->has_seed) {
        p->_seed_case = SHARDLM__V1__SAMPLING_PARAMS___SEED_SEED;
        p->seed = s->seed;
    }
    if (s->n_stop < 0 || s->n_stop_token_ids < 0 || s->n_logit_bias < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "negative array length in client_sampling");
    p->n_stop = (size_t)s->n_stop;
    p->stop = (char **)s->stop;  /* packing only reads */
    p->n_stop_token_ids = (size_t)s->n_stop_token_ids;
    p->stop_token_ids = (int32_t *)s->stop_token_ids;
    p->ignore_eos = s->ignore_eos != 0;
    p->min_tokens = s->min_tokens;
    if (s->has_logprobs) {
        p->_logprobs_case = SHARDLM__V1__SAMPLING_PARAMS___LOGPROBS_LOGPROBS;
        p->logprobs = s->logprobs;
    }
    if (s->has_prompt_logprobs) {
        p->_prompt_logprobs_case = SHARDLM__V1__SAMPLING_PARAMS___PROMPT_LOGPROBS_PROMPT_LOGPROBS;
        p->prompt_logprobs = s->prompt_logprobs;
    }
    if (s->has_n) {
        p->_n_case = SHARDLM__V1__SAMPLING_PARAMS___N_N;
        p->n = s->n;
    }
    if (s->n_logit_bias > 0) {
        *entries = calloc((size_t)s->n_logit_bias, sizeof **entries);
        *entry_ptrs = calloc((size_t)s->n_logit_bias, sizeof **entry_ptrs);
        if (!*entries || !*entry_ptrs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        for (int i = 0; i < s->n_logit_bias; i++) {
            shardlm__v1__sampling_params__logit_bias_entry__init(&(*entries)[i]);
            (*entries)[i].key = s->logit_bias_ids[i];
            (*entries)[i].value = s->logit_bias_values[i];
            (*entry_ptrs)[i] = &(*entries)[i];
        }
        p->n_logit_bias = (size_t)s->n_logit_bias;
        p->logit_bias = *entry_ptrs;
    }
    return STATUS_OK;
}

void client_request_pb_free(struct request_pb *r)
{
    free(r->bias);
    free(r->bias_ptrs);
    free(r->msgs);
    free(r->msg_ptrs);
}

enum status client_request_to_pb(const struct client_request *req, struct request_pb *r)
{
    memset(r, 0, sizeof *r);
    enum status st = sampling_to_pb(&req->sampling, &r->sampling, &r->bias, &r->bias_ptrs);
    if (st != STATUS_OK) return st;
    if (req->n_messages < 0 || req->n_prompt_token_ids < 0)
        return status_errorf(STATUS_INVALID_ARGUMENT, "negative array length in client_request");
    char *id = (char *)(req->request_id ? req->request_id : "");
    char *adapter = (char *)(req->adapter ? req->adapter : "");
    if (req->n_messages > 0) {
        if ((req->prompt && *req->prompt) || req->n_prompt_token_ids || req->has_add_bos)
            return status_errorf(STATUS_INVALID_ARGUMENT,
                                 "a chat request (messages) takes no prompt, prompt_token_ids or add_bos");
        r->chat = 1;
        shardlm__v1__chat_request__init(&r->chat_req);
        r->msgs = calloc((size_t)req->n_messages, sizeof *r->msgs);
        r->msg_ptrs = calloc((size_t)req->n_messages, sizeof *r->msg_ptrs);
        if (!r->msgs || !r->msg_ptrs) return status_errorf(STATUS_RESOURCE_EXHAUSTED, "out of memory");
        for (int i = 0; i < req->n_messages; i++) {
            shardlm__v1__chat_message__init(&r->msgs[i]);
            r->msgs[i].role = (char *)(req->messages[i].role ? req->messages[i].role : "");
            r->msgs[i].content = (char *)(req->messages[i].content ? req->messages[i].content : "");
            r->msg_ptrs[i] = &r->msgs[i];
        }
        r->chat_req.request_id = id;
        r->chat_req.n_messages = (size_t)req->n_messages;
        r->chat_req.messages = r->msg_ptrs;
        r->chat_req.sampling = &r->sampling;
        r->chat_req.adapter = adapter;
    } else {
        shardlm__v1__generate_request__init(&r->gen);
        r->gen.request_id = id;
        r->gen.prompt = (char *)(req->prompt ? req->prompt : "");
        r->gen.n_prompt_token_ids = (size_t)req->n_prompt_token_ids;
        r->gen.prompt_token_ids = (int32_t *)req->prompt_token_ids;
        r->gen.sampling = &r->sampling;
        r->gen.adapter = adapter;
        if (req->has_add_bos) {
            r->gen._add_bos_case = SHARDLM__V1__GENERATE_REQUEST___ADD_BOS_ADD_BOS;
            r->gen.add_bos = req->add_bos != 0;
        }
    }
    return STATUS_OK;
}

const ProtobufCMessage *client_request_pb_message(const struct request_pb *r)
{
    return r->chat ? &r->chat_req.base : &r->gen.base;
}

