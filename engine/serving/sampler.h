/* engine/serving/sampler.h - choosing the next token from logits: greedy, temperature, top-k, top-p,
 * min-p, repetition / presence / frequency penalties, each request with its own seeded RNG
 * stream so that its tokens do not depend on what else runs in the batch.
 * Not here: stop conditions and logprob bookkeeping (request.c, conductor.c), the bounds of the
 * parameters (request.c's limits table), logits (model.c).
 * Tests: tests/test_sampler.c. */
#ifndef SHARDLM_SAMPLER_H
#define SHARDLM_SAMPLER_H

#include <stdint.h>

#include "base.h"

#ifdef __cplusplus
extern "C" {
#endif

struct sampling_params {
    float    temperature;         /* 0 = greedy (argmax); > 0 divides logits */
    int      top_k;               /* keep the k most likely; 0 = off */
    float    top_p;               /* keep the smallest set with mass >= top_p; 1 = off */
    float    min_p;               /* drop tokens with p < min_p * p_max; 0 = off */
    float    repetition_penalty;  /* CTRL/HF style over prompt and output tokens; 1 = off */
    float    presence_penalty;    /* OpenAI style, subtracted once per seen output token; 0 = off */
    float    frequency_penalty;   /* OpenAI style, times the output count; 0 = off */
    uint64_t seed;
};

/* The defaults every API uses when a field is unset: greedy off, nothing filtered. */
struct sampling_params sampling_params_default(void);

/* Returns STATUS_INVALID_ARGUMENT with a message naming the field and its allowed range; the
 * ranges are the sampling rows of the engine's limits table (request.h). */
enum status sampling_params_validate(const struct sampling_params *p);

/* xoshiro256** seeded through splitmix64: one stream per request. */
struct rng {
    uint64_t s[4];
};
void     rng_seed(struct rng *r, uint64_t seed);
uint64_t rng_next(struct rng *r);
float    rng_uniform(struct rng *r); /* [0, 1) with 24 random bits */

/* Per-vocabulary scratch a sampler needs; one per engine thread, reused across requests. */
struct sampler {
    int      vocab_size;
    int32_t *order;   /* (vocab_size) candidate ids */
    float   *probs;   /* (vocab_size) */
    int32_t *counts;  /* (vocab_size) output-token counts for penalties */
};
enum status sampler_init(struct sampler *s, int vocab_size);
void        sampler_free(struct sampler *s); /* accepts a zeroed struct */

/* Picks the next token. logits (vocab_size) f32 are modified in place (penalties, then
 * temperature). prompt (n_prompt) and output (n_output) are the request's tokens so far, for
 * penalties. Draws exactly one number from r when temperature > 0 and none when greedy. */
int32_t sampler_sample(struct sampler *s, const struct sampling_params *p, struct rng *r,
                       float *logits, const int32_t *prompt, int n_prompt, const int32_t *output,
                       int n_output);

/* Whether a penalty (repetition, presence, frequency) reads the request's tokens. */
int         sampler_penalised(const struct sampling_params *p);
/* p without its penalties: what samples a row whose logits the penalties have already edited
 * (op_logit_edit on the device). */
struct sampling_params sampler_unpenalised(const struct sampling_params *p);
/* Whether sampler_sample_top draws the very token sampler_sample draws from the whole row, for
 * every row, from the row's k largest logits: temperature > 0, 1 <= top_k < k, no penalty. (The
 * row's top_k most likely tokens are then among the k whatever else it holds, and every later
 * filter reads only those; with fewer than top_k within the sampler's floor below the largest,
 * every token within it is among the k.) */
int         sampler_top_exact(const struct sampling_params *p, int k);
/* sampler_sample's token for a row of which only its k largest logits are known: values
 * descending with their ids (ties by lower id: op_topk's order), no logit NaN. s is made for k
 * (sampler_init(s, k)); lg and tok (k) are scratch. Draws one number from r, as sampler_sample
 * does; exact under sampler_top_exact, and never reads the rest of the row. */
int32_t     sampler_sample_top(struct sampler *s, const struct sampling_params *p, struct rng *r,
                               const float *values, const int32_t *ids, int k, float *lg, int32_t *tok);

/* Whether sampler_sample_nucleus may draw sampler_sample's token from a row's k largest logits and
 * the mass of its weights: temperature > 0, top_k 0, top_p < 1 or min_p > 0, no penalty. */
int         sampler_nucleus_fits(const struct sampling_params *p);
/* The relative error the mass given to sampler_sample_nucleus may have against the host's sum. */
#define SAMPLER_MASS_TOL 1e-4
/* sampler_sample's token for a row of which its k largest logits are known (values descending
 * with their ids, op_topk's order) and mass, the sum of exp((x - max) / T) over the row's tokens
 * within the sampler's floor (op_logit_mass), within SAMPLER_MASS_TOL of the host's sum. Returns
 * the token when the candidates decide it for any mass within that tolerance (top_p's cut inside
 * the k and not within the tolerance of top_p; min_p's set inside the k), drawing one number from
 * r as sampler_sample does; else -1, having drawn nothing (the caller samples the whole row). */
int32_t     sampler_sample_nucleus(const struct sampling_params *p, struct rng *r, const float *values,
                                   const int32_t *ids, int k, double mass, float *w);

/* Whether sampler_sample's draw is plain temperature sampling (temperature > 0, no top_k, top_p or
 * min_p, no penalty), which op_logit_draw can make where the logits are: the token whose interval
 * of cumulative weight, in id order, holds the uniform times the total. */
int         sampler_draw_fits(const struct sampling_params *p);
/* How far inside its token's interval, over the row's total weight, a draw made elsewhere
 * (op_logit_draw's margin) must land for it to be sampler_sample's token; a draw closer to its
 * token's edge is made again on the host from the whole row, with the random state as it was
 * before the draw's uniform. SAMPLER_DRAW_TOL_EXACT where the device forms the host's very
 * weights (sampler_draw_tolerance says so): only the sums' order differs, by at most about 1.2e-10
 * of the total over 262,144 tokens. SAMPLER_DRAW_TOL where it does not: the weights may each
 * differ by a few ulp (base_exp is within 3 ulp of e^x), so the cumulative sums and targets by at
 * most about 8.4e-7 of the total; about five times that. tests/test_sampler.c checks both. */
#define SAMPLER_DRAW_TOL_EXACT 1e-9
#define SAMPLER_DRAW_TOL 4e-6
/* sampler_sample's plain temperature draw over logits (vocab_size, no NaN) at that temperature with
 * uniform u, and *margin (non-NULL) its margin as op_logit_draw defines it (-1 where the target
 * rounds past every token). */
int32_t     sampler_draw(struct sampler *s, const float *logits, float temperature, float u, double *margin);
/* Runs op_logit_draw on backend b over a few calibration rows and compares its tokens and margins
 * with sampler_draw's: SAMPLER_DRAW_TOL_EXACT where they agree as only the sums' order allows (b's
 * weights are this host's bits), else SAMPLER_DRAW_TOL; INFINITY (no draw ever taken: every such
 * row fetched whole) where a draw that SAMPLER_DRAW_TOL would take, plain or with top_p (the
 * nucleus, against sampler_sample's token from the same random stream), is not the host's token:
 * b's draws are wrong. */
struct backend;
double      sampler_draw_tolerance(struct backend *b);
/* Runs the device's other sampling ops on backend b over a few calibration rows (op_logit_edit,
 * op_logit_mask, op_logit_mass, op_logit_lse, op_topk, op_argmax) and compares them with the
 * host's arithmetic: 1 when every one agrees (edits within 1e-6, masses and normalisers within
 * 1e-5, candidates and argmax exact); else 0, why (why_size bytes) naming the op and the row.
 * (sampler_check.c, as sampler_draw_tolerance.) */
int         sampler_device_check(struct backend *b, char *why, size_t why_size);

/* The distribution sampler_sample draws from, dense into out (vocab_size; 0 outside the tokens
 * the filters keep, one-hot on the argmax when greedy), under the same parameters; logits are
 * modified as there. Draws nothing. Speculative decoding with a draft model compares the
 * target's and the draft's (conductor_speculate.c). */
void sampler_probs(struct sampler *s, const struct sampling_params *p, float *logits, const int32_t *prompt,
                   int n_prompt, const int32_t *output, int n_output, float *out);

/* Whether all n logits are finite. A row with NaN or Inf (a numerical overflow, or bad weights)
 * must end its sequence with an error, never be sampled: softmax over it is meaningless. */
int sampler_logits_finite(const float *x, int n);

/* e^x for x <= 0 (-Inf gives 0, and so does anything at or below -87, near where a float's
 * normal range ends), within 3 ulp of it: the sampler's weights exp((logit - top) / temperature)
 * and the log-softmax's sum. kernels/base/fastexp.h's base_exp (branch-free float arithmetic, so
 * that a loop of it vectorizes: glibc's expf took 1.9 ms over Gemma 3's 262,144 logits a sampled
 * token, exp in double 3.3 ms a token with log-probabilities; the Zen 3 VM, 2026-12-01). */
float sampler_exp(float x);

/* The largest value of x[0..n) that is not NaN (-Inf when none is), in a loop that vectorizes. */
float sampler_max(const float *x, int n);

/* The first index of the largest value of x[0..n) (two passes: a maximum that vectorizes, then its
 * first occurrence): greedy's token. */
int32_t sampler_argmax(const float *x, int n);

/* Log-probabilities of a logits row: out[i] = x[i] - logsumexp(x), the weights by sampler_exp
 * and their sum in double. x and out (V) may not alias. */
void sampler_log_softmax(const float *x, float *out, int V);

struct top_logprob; /* engine.h */
/* The k largest entries of lp (V) into out (k), descending, ties to the lower id. */
void sampler_top_logprobs(const float *lp, int V, int k, struct top_logprob *out);

#ifdef __cplusplus
}
#endif

#endif
